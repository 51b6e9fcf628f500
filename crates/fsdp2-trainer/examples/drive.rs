//! Drives the FSDP2 worker through the protocol with random packed batches and writes each step's wall time
//! and tokens per second as JSON (the GPU program of issue 29 runs it).
//!
//! ```text
//! cargo run -p fsdp2-trainer --example drive -- --run-dir D --model M --tokens 8192 --steps 3 --out F.json
//! ```
//!
//! It starts the worker with `PYTHON -m torch.distributed.run --standalone` (or attaches to `--attach`,
//! with the key in `ARENA_RL_TRAINER_API_KEY`), initialises it on `--model`, takes `--steps` GRPO steps of
//! `--tokens` tokens each (sequences of `--seq-len`, the second half of each trained), and optionally
//! publishes the weights once. It uses no workspace crate but this one.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result};
use clap::Parser;
use fsdp2_trainer::protocol::{Dtype, InitRequest};
use fsdp2_trainer::{Attached, Batch, Client, LaunchConfig, Sequence, StepKind, Watch, Worker};
use rand::RngExt as _;
use secrecy::SecretString;

#[derive(Parser, Debug)]
struct Args {
    /// The run folder (batches, published weights and the worker's log go under it).
    #[arg(long)]
    run_dir: PathBuf,
    /// The Hugging Face model folder.
    #[arg(long)]
    model: PathBuf,
    /// Tokens per step.
    #[arg(long, default_value_t = 8192)]
    tokens: usize,
    /// Tokens per sequence.
    #[arg(long, default_value_t = 2048)]
    seq_len: usize,
    /// Optimiser steps.
    #[arg(long, default_value_t = 3)]
    steps: u64,
    /// Where the JSON figures go.
    #[arg(long)]
    out: PathBuf,
    /// The Python with torch and the worker's package.
    #[arg(long, default_value = "python3")]
    python: String,
    /// Ranks on this machine.
    #[arg(long, default_value_t = 1)]
    nproc: u32,
    /// `HOST:PORT` of a running worker instead of starting one.
    #[arg(long)]
    attach: Option<String>,
    /// Parameter dtype (`bf16` on GPUs, `f32` on the CPU).
    #[arg(long, default_value = "bf16")]
    dtype: String,
    /// Activation checkpointing.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    checkpointing: bool,
    /// Micro-batch budget in tokens.
    #[arg(long, default_value_t = 8192)]
    max_tokens_per_mb: usize,
    /// Publish the weights once after the last step, and time it.
    #[arg(long)]
    publish: bool,
}

/// `trainer::TrainConfig`'s serde form (the worker refuses, by name, a field it does not know).
fn train_config(max_tokens_per_mb: usize, total_steps: u64) -> serde_json::Value {
    serde_json::json!({
        "schedule": {"lr": 1e-6, "kind": "constant", "warmup_steps": 0, "total_steps": total_steps, "min_lr_ratio": 0.0},
        "adamw": {"beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
        "gradient_clipping": 1.0,
        "max_tokens_per_mb": max_tokens_per_mb,
        "aggregation": "token-mean",
        "ppo": {
            "eps_clip": 0.2, "eps_clip_higher": null, "c_clip": null, "use_decoupled_loss": true,
            "recompute_logprob": false, "behav_imp_weight_cap": 5.0, "kl_ctl": 0.0, "kl_estimator": "k1",
            "entropy_coeff": 0.0, "adv_norm": null, "temperature": 1.0
        }
    })
}

/// Random numbers for the batches (the figures do not depend on which tokens are drawn).
struct Mix(rand::rngs::ThreadRng);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0.random()
    }
    fn unit(&mut self) -> f32 {
        self.0.random()
    }
}

/// A random batch of `tokens` tokens in sequences of `seq_len`, the second half of each trained.
fn random_batch(rng: &mut Mix, vocab: u64, tokens: usize, seq_len: usize, step: u64) -> Batch {
    let n = tokens.div_ceil(seq_len).max(1);
    let trained_per = seq_len - seq_len / 2;
    let total = (n * trained_per) as f32;
    let sequences = (0..n)
        .map(|i| {
            let len = seq_len.min(tokens - i * seq_len).max(2);
            Sequence {
                tokens: (0..len).map(|_| (rng.next() % vocab) as u32).collect(),
                loss_mask: (0..len).map(|t| t >= len / 2 && t > 0).collect(),
                logprobs: (0..len).map(|_| -5.0 - rng.unit()).collect(),
                versions: (0..len)
                    .map(|t| if t >= len / 2 { step as i64 } else { -1 })
                    .collect(),
                temperatures: vec![1.0; len],
                truncated: vec![false; len],
                advantage: if i % 2 == 0 { 1.0 } else { -1.0 },
                weight: 1.0 / total,
            }
        })
        .collect::<Vec<_>>();
    Batch {
        kind: StepKind::Grpo,
        step,
        policy_version: step,
        group_sizes: vec![sequences.len() as u64],
        sequences,
    }
}

fn main() -> Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.run_dir)?;
    let run_dir = args.run_dir.canonicalize()?;
    let model = args.model.canonicalize().context("--model")?;
    let config: serde_json::Value = serde_json::from_slice(&std::fs::read(model.join("config.json"))?)?;
    let vocab = config["vocab_size"]
        .as_u64()
        .context("config.json has no vocab_size")?;
    let dtype = match args.dtype.as_str() {
        "bf16" => Dtype::Bf16,
        "f32" => Dtype::F32,
        other => anyhow::bail!("--dtype {other:?} is neither bf16 nor f32"),
    };
    let key = fsdp2_trainer::api_key(
        std::env::var(fsdp2_trainer::API_KEY_ENV)
            .ok()
            .map(SecretString::from),
    );
    let started = Instant::now();
    let mut worker;
    let mut attached;
    let (client, watch): (&Client, &mut dyn Watch) = match &args.attach {
        Some(addr) => {
            attached = (Client::new(addr.clone(), key), Attached);
            (&attached.0, &mut attached.1)
        }
        None => {
            let mut launch = LaunchConfig::python(args.python.clone(), args.nproc, run_dir.clone());
            launch.env.push(("OMP_NUM_THREADS".into(), "4".into()));
            worker = Worker::launch(&launch, key)?;
            worker.parts()
        }
    };
    let launch_seconds = started.elapsed().as_secs_f64();
    let hello = client.hello()?;
    let t = Instant::now();
    let init = client.init(
        &InitRequest {
            protocol: fsdp2_trainer::PROTOCOL,
            model_path: model.clone(),
            train: train_config(args.max_tokens_per_mb, args.steps),
            total_steps: args.steps,
            param_dtype: dtype,
            reduce_dtype: Dtype::F32,
            activation_checkpointing: args.checkpointing,
            logprob_chunk_tokens: 1024,
            seed: 1,
        },
        watch,
    )?;
    let init_seconds = t.elapsed().as_secs_f64();
    let mut rng = Mix(rand::rng());
    let mut steps = Vec::new();
    for i in 0..args.steps {
        let step = init.step + i;
        let batch = random_batch(&mut rng, vocab, args.tokens, args.seq_len, step);
        let path = run_dir.join(format!("trainer/batches/step-{step}.safetensors"));
        let t = Instant::now();
        let result = client.step(&batch, &path, watch)?;
        let seconds = t.elapsed().as_secs_f64();
        let tokens: usize = batch.sequences.iter().map(|s| s.tokens.len()).sum();
        eprintln!(
            "step {step}: {seconds:.3} s, {:.0} tokens/s, loss {:.4}",
            tokens as f64 / seconds,
            result.stats.loss
        );
        steps.push(serde_json::json!({
            "step": step, "tokens": tokens, "wall_seconds": seconds, "tokens_per_second": tokens as f64 / seconds,
            "worker_seconds": result.stats.seconds, "loss": result.stats.loss, "grad_norm": result.stats.grad_norm,
            "micro_batches": result.stats.micro_batches,
        }));
    }
    let publish = if args.publish {
        let t = Instant::now();
        let out = run_dir.join(format!("weights/step-{}", init.step + args.steps));
        let p = client.publish(&out, dtype, watch)?;
        Some(
            serde_json::json!({"wall_seconds": t.elapsed().as_secs_f64(), "worker_seconds": p.seconds, "bytes": p.bytes, "path": p.path}),
        )
    } else {
        None
    };
    let figures = serde_json::json!({
        "model": model, "architecture": init.model.architecture, "parameters": init.model.parameters,
        "torch": hello.torch, "transformers": hello.transformers, "world_size": hello.world_size,
        "device": hello.device, "dtype": args.dtype, "tokens_per_step": args.tokens, "seq_len": args.seq_len,
        "activation_checkpointing": args.checkpointing, "launch_seconds": launch_seconds,
        "init_seconds": init_seconds, "steps": steps, "publish": publish,
    });
    std::fs::write(&args.out, serde_json::to_vec_pretty(&figures)?)?;
    eprintln!("figures in {}", args.out.display());
    Ok(())
}
