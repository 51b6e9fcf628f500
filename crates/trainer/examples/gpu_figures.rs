//! The GPU program of issue 16 ("On a GPU"): one stage per run, each writing one JSON object of figures to
//! stdout, so that a stage that fails still leaves the others. `crates/trainer/python/gpu_figures.sh`
//! drives it next to the PyTorch peer (`gpu_peer.py`) on the same GPU, against a Qwen3-0.6B-shaped model
//! that the peer random-initialises with transformers.
//!
//! ```text
//! gpu_figures smoke
//! gpu_figures logits MODEL_DIR PROBE_JSON     # burn-cuda logits against transformers', f32 and bf16 weights
//! gpu_figures train MODEL_DIR                 # one GRPO step on 8 x 2048 tokens, bf16 autocast
//! gpu_figures long MODEL_DIR                  # one step on one 16k-token sequence, layer chunks on
//! gpu_figures decode MODEL_DIR                # decoding tokens/s at batch 1, 16 and 64, f32 and bf16
//! ```
//!
//! Built with `cargo build --release -p trainer --example gpu_figures --features cuda`; needs a driver.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use trainer::estimate::{QWEN3_0_6B, parameter_count};
use trainer::model::CausalLm;
use trainer::{
    DeviceKind, GenerationRequest, InferenceDtype, MemoryConfig, Policy, PolicyOptions, RlBatch,
    SamplingParams, TrainConfig, TrainSequence, Trainer, TrainerOptions, Weights,
};

const DEVICE: DeviceKind = DeviceKind::Cuda(0);
/// NVIDIA's dense bf16 peak of an H100/H200 SXM, for model FLOPs utilisation.
const BF16_PEAK_FLOPS: f64 = 989e12;

fn batch(sequences: usize, len: usize, vocab: usize) -> RlBatch {
    RlBatch {
        sequences: (0..sequences)
            .map(|s| TrainSequence {
                tokens: (0..len)
                    .map(|i| (((s * len + i) * 7919) % vocab) as u32)
                    .collect(),
                loss_mask: (0..len).map(|i| i >= len / 8).collect(),
                logprobs: vec![-8.3; len],
                versions: vec![0; len],
                advantage: if s % 2 == 0 { 1.0 } else { -1.0 },
                truncated: Vec::new(),
                temperatures: Vec::new(),
            })
            .collect(),
        group_sizes: vec![],
        policy_version: 0,
    }
}

fn trainer(dir: &std::path::Path, max_tokens: usize) -> Result<Trainer> {
    let config = TrainConfig {
        max_tokens_per_mb: max_tokens,
        ..TrainConfig::default()
    };
    let options = TrainerOptions {
        device: DEVICE,
        bf16_autocast: true,
    };
    Ok(Trainer::load(dir, config, options)?)
}

/// Times `steps` GRPO steps after one warm-up step.
fn timed_steps(trainer: &mut Trainer, batch: &RlBatch, steps: usize) -> Result<f64> {
    trainer.grpo_step(batch)?;
    let start = Instant::now();
    for _ in 0..steps {
        trainer.grpo_step(batch)?;
    }
    Ok(start.elapsed().as_secs_f64() / steps as f64)
}

fn smoke() -> Result<Value> {
    let start = Instant::now();
    DEVICE.check()?;
    let c = QWEN3_0_6B.tiny();
    let weights = Weights::from_model(&CausalLm::<trainer::backend::Cpu>::init(
        &c,
        0.02,
        1,
        &Default::default(),
    ));
    let policy = Policy::from_weights(
        c.clone(),
        &weights,
        PolicyOptions {
            device: DEVICE,
            ..PolicyOptions::default()
        },
    )?;
    let tokens: Vec<u32> = (0..16).collect();
    let on_gpu = policy.score(&tokens)?;
    let on_cpu = Policy::from_weights(c, &weights, PolicyOptions::default())?.score(&tokens)?;
    let diff = on_gpu
        .data
        .iter()
        .zip(&on_cpu.data)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max);
    Ok(
        json!({"stage": "smoke", "ok": diff < 1e-3, "max_abs_diff_vs_cpu": diff,
        "seconds": start.elapsed().as_secs_f64()}),
    )
}

fn logits(dir: &std::path::Path, probe: &std::path::Path) -> Result<Value> {
    let probe: Value = serde_json::from_slice(&std::fs::read(probe).context("reading the probe")?)?;
    let tokens: Vec<u32> = serde_json::from_value(probe["tokens"].clone())?;
    let mut out = json!({"stage": "logits", "tokens": tokens.len()});
    // burn in f32 against transformers in f32 (goal 1e-3), and burn's bf16 weights against transformers'
    // bf16 model.
    for (dtype, key) in [
        (InferenceDtype::F32, "logits_f32"),
        (InferenceDtype::Bf16, "logits_bf16"),
    ] {
        let policy = Policy::load(
            dir,
            PolicyOptions {
                device: DEVICE,
                dtype,
                ..PolicyOptions::default()
            },
        )?;
        let ours = policy.score(&tokens)?;
        let theirs: Vec<f32> = serde_json::from_value(probe[key].clone())?;
        if theirs.len() != ours.data.len() {
            bail!("{key} has {} values, burn gave {}", theirs.len(), ours.data.len());
        }
        let diff = ours
            .data
            .iter()
            .zip(&theirs)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        out[format!("max_abs_diff_burn_{dtype}_vs_transformers_{key}")] = json!(diff);
    }
    Ok(out)
}

fn train(dir: &std::path::Path) -> Result<Value> {
    let mut trainer = trainer(dir, 16_384)?;
    let params = parameter_count(trainer.model_config()) as f64;
    let b = batch(8, 2048, trainer.model_config().vocab_size);
    let seconds = timed_steps(&mut trainer, &b, 3)?;
    let tokens = 8.0 * 2048.0;
    Ok(
        json!({"stage": "train", "sequences": 8, "seq_len": 2048, "step_seconds": seconds,
        "tokens_per_second": tokens / seconds,
        "mfu": 6.0 * params * tokens / seconds / BF16_PEAK_FLOPS}),
    )
}

fn long(dir: &std::path::Path) -> Result<Value> {
    let mut trainer = trainer(dir, 16_384)?;
    trainer.set_memory(MemoryConfig::default())?;
    let b = batch(1, 16_384, trainer.model_config().vocab_size);
    let seconds = timed_steps(&mut trainer, &b, 1)?;
    Ok(json!({"stage": "long", "seq_len": 16_384, "fits": true, "step_seconds": seconds}))
}

fn decode(dir: &std::path::Path) -> Result<Value> {
    let mut out = json!({"stage": "decode", "new_tokens": 128, "prompt_tokens": 32});
    for dtype in [InferenceDtype::F32, InferenceDtype::Bf16] {
        out[format!("tokens_per_second_{dtype}")] = decode_rates(dir, dtype)?;
    }
    Ok(out)
}

fn decode_rates(dir: &std::path::Path, dtype: InferenceDtype) -> Result<Value> {
    let policy = Policy::load(
        dir,
        PolicyOptions {
            device: DEVICE,
            max_batch: 64,
            dtype,
            ..PolicyOptions::default()
        },
    )?;
    let vocab = policy.config().vocab_size as u32;
    let mut rates = serde_json::Map::new();
    for batch in [1usize, 16, 64] {
        let new_tokens = 128;
        let run = || -> Result<f64> {
            let start = Instant::now();
            let streams = (0..batch)
                .map(|i| {
                    policy.submit(GenerationRequest {
                        input_ids: (0..32).map(|t| (t * 31 + i as u32 * 7) % vocab).collect(),
                        sampling: SamplingParams::greedy(),
                        stop_token_ids: vec![],
                        max_new_tokens: new_tokens,
                    })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut generated = 0;
            for s in streams {
                generated += s.collect_blocking()?.token_ids.len();
            }
            Ok(generated as f64 / start.elapsed().as_secs_f64())
        };
        run()?;
        rates.insert(batch.to_string(), json!(run()?));
    }
    Ok(Value::Object(rates))
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = |i: usize| -> Result<std::path::PathBuf> {
        args.get(i).map(Into::into).context("missing a path argument")
    };
    let figures = match args.first().map(String::as_str) {
        Some("smoke") => smoke()?,
        Some("logits") => logits(&dir(1)?, &dir(2)?)?,
        Some("train") => train(&dir(1)?)?,
        Some("long") => long(&dir(1)?)?,
        Some("decode") => decode(&dir(1)?)?,
        other => bail!("unknown stage {other:?}: expected smoke, logits, train, long or decode"),
    };
    println!("{figures}");
    Ok(())
}
