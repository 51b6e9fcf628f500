//! `arena-rl model`: run a Hugging Face checkpoint with the trainer's policy from the shell.
//!
//! `score` writes per-position logits as a float32 `.npy`; `generate` renders a prompt as one user turn with
//! the model's chat template (rollout-proxy's renderer and tokenizer) and prints the answer as it is sampled;
//! `estimate` prints what training a model shape costs in memory, without loading anything.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::{Args as ClapArgs, Subcommand};
use rollout_proxy::model::ChatModel;
use rollout_proxy::template::RenderOptions;
use rollout_proxy::tokenizer::IncrementalDecoder;
use trainer::{GenerationEvent, GenerationRequest, Policy, PolicyOptions, SamplingParams};

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Write the per-position logits of a token sequence (float32 .npy, shape [len, vocab]).
    Score(ScoreArgs),
    /// Answer a prompt, rendered as one user turn with the model's chat template.
    Generate(GenerateArgs),
    /// Dry run: parameters, bytes of weights, gradients and AdamW state, and activation bytes per token with
    /// and without layer recompute, for a published shape or a model folder's config.json; with
    /// `--fsdp2-gpus N`, also one GPU's peak in an FSDP2 layout of N GPUs (`actor.backend: fsdp2`).
    Estimate(EstimateArgs),
}

#[derive(ClapArgs)]
pub(crate) struct EstimateArgs {
    /// A published shape: qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-14b, qwen3-32b, qwen2.5-7b or
    /// smollm2-135m.
    #[arg(long, conflicts_with = "model", required_unless_present = "model")]
    shape: Option<String>,
    /// A Hugging Face model folder whose config.json to estimate.
    #[arg(long)]
    model: Option<PathBuf>,
    /// Tokens in one micro-batch (`actor.max_tokens_per_mb`).
    #[arg(long, default_value_t = 8192)]
    tokens: u64,
    /// Print one JSON object (architecture, parameters, bytes of the state and of one step) instead of text,
    /// for `cargo xtask submit`'s fit check.
    #[arg(long)]
    json: bool,
    /// Also estimate one GPU of an FSDP2 layout sharded over this many GPUs (data-parallel ranks): the
    /// sharded f32 state, the units gathered whole, the activations kept with and without activation
    /// checkpointing, and one chunk of the output projection.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    fsdp2_gpus: Option<u64>,
    /// The FSDP2 layout computes in f32 (a CPU, or `actor.bf16_autocast: false`) rather than in bf16 with
    /// f32 master weights and reduction (`actor.bf16_autocast: true`, the GPU default).
    #[arg(long, requires = "fsdp2_gpus")]
    f32: bool,
    /// Rows of the output projection the FSDP2 worker computes at once (`actor.fsdp2.logprob_chunk_tokens`).
    #[arg(long, value_name = "TOKENS", default_value_t = 1024, requires = "fsdp2_gpus",
          value_parser = clap::value_parser!(u64).range(1..))]
    logprob_chunk_tokens: u64,
}

#[derive(ClapArgs)]
pub(crate) struct ScoreArgs {
    /// Hugging Face model folder (config.json and safetensors).
    #[arg(long)]
    model: PathBuf,
    /// Comma-separated token ids, e.g. 1,2,3.
    #[arg(long, value_name = "IDS")]
    input_ids: String,
    /// Where to write the logits.
    #[arg(long, default_value = "logits.npy")]
    output: PathBuf,
    /// Device: cpu, cuda or cuda:N (cuda needs a build with trainer's `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: String,
}

#[derive(ClapArgs)]
pub(crate) struct GenerateArgs {
    /// Hugging Face model folder (config, safetensors, tokenizer.json and a chat template).
    #[arg(long)]
    model: PathBuf,
    /// The user's message.
    #[arg(long)]
    prompt: String,
    /// At most this many new tokens.
    #[arg(long, default_value_t = 256)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Seed for sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Device: cpu, cuda or cuda:N.
    #[arg(long, default_value = "cpu")]
    device: String,
}

pub(crate) fn run(command: Command) -> Result<()> {
    match command {
        Command::Score(args) => score(args),
        Command::Generate(args) => generate(args),
        Command::Estimate(args) => estimate(&args),
    }
}

fn estimate(args: &EstimateArgs) -> Result<()> {
    use trainer::estimate::{Fsdp2Layout, MemoryEstimate, SHAPES};
    let (name, config) = match (&args.shape, &args.model) {
        (Some(shape), _) => {
            let found = SHAPES.iter().find(|s| {
                let short = s.name.rsplit('/').next().unwrap_or(s.name);
                short.eq_ignore_ascii_case(shape) || s.name.eq_ignore_ascii_case(shape)
            });
            let Some(found) = found else {
                let names: Vec<&str> = SHAPES
                    .iter()
                    .map(|s| s.name.rsplit('/').next().unwrap_or(s.name))
                    .collect();
                bail!("--shape {shape:?} is not one of {}", names.join(", "));
            };
            (found.name.to_string(), found.config())
        }
        (None, Some(dir)) => {
            let path = dir.join("config.json");
            let text =
                std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
            (
                dir.display().to_string(),
                trainer::ModelConfig::from_json_str(&text, &path)?,
            )
        }
        (None, None) => bail!("give --shape or --model"),
    };
    let estimate = MemoryEstimate::new(&name, &config, &trainer::MemoryConfig::default());
    // The FSDP2 worker's own output-projection chunk (`actor.fsdp2.logprob_chunk_tokens`).
    let fsdp2 = args.fsdp2_gpus.map(|gpus| {
        let chunked = MemoryEstimate::new(
            &name,
            &config,
            &trainer::MemoryConfig {
                logits_chunk: usize::try_from(args.logprob_chunk_tokens).unwrap_or(usize::MAX),
                ..trainer::MemoryConfig::default()
            },
        );
        let layout = Fsdp2Layout {
            gpus,
            bf16: !args.f32,
        };
        Fsdp2Figures {
            layout,
            sharded_state_bytes: chunked.state_bytes().div_ceil(gpus),
            gpu_bytes: chunked.fsdp2_gpu_bytes(layout, args.tokens, false),
            gpu_bytes_recompute: chunked.fsdp2_gpu_bytes(layout, args.tokens, true),
        }
    });
    if args.json {
        let mut json = serde_json::json!({
            "model": name,
            "architecture": config.architecture.hf_class(),
            "parameters": estimate.parameters,
            "state_bytes": estimate.state_bytes(),
            "tokens": args.tokens,
            "step_bytes": estimate.step_bytes(args.tokens, false),
            "step_bytes_recompute": estimate.step_bytes(args.tokens, true),
        });
        if let Some(f) = &fsdp2 {
            json["fsdp2"] = serde_json::json!({
                "gpus": f.layout.gpus,
                "compute_dtype": if f.layout.bf16 { "bf16" } else { "f32" },
                "logprob_chunk_tokens": args.logprob_chunk_tokens,
                "sharded_state_bytes": f.sharded_state_bytes,
                "gpu_bytes": f.gpu_bytes,
                "gpu_bytes_recompute": f.gpu_bytes_recompute,
            });
        }
        println!("{json}");
        return Ok(());
    }
    print!("{estimate}");
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!(
        "  one step of {} tokens: {:.2} GiB, {:.2} GiB with layer recompute (actor.recompute_layers)",
        args.tokens,
        gib(estimate.step_bytes(args.tokens, false)),
        gib(estimate.step_bytes(args.tokens, true)),
    );
    if let Some(f) = fsdp2 {
        println!(
            "  FSDP2 over {} GPUs ({}): {:.2} GiB of sharded state a GPU; one step of {} tokens a GPU: {:.2} GiB, \
             {:.2} GiB with activation checkpointing (actor.recompute_layers)",
            f.layout.gpus,
            if f.layout.bf16 {
                "bf16 compute, f32 master weights and reduction"
            } else {
                "f32"
            },
            gib(f.sharded_state_bytes),
            args.tokens,
            gib(f.gpu_bytes),
            gib(f.gpu_bytes_recompute),
        );
    }
    Ok(())
}

/// One GPU's figures in an FSDP2 layout.
struct Fsdp2Figures {
    layout: trainer::estimate::Fsdp2Layout,
    sharded_state_bytes: u64,
    gpu_bytes: u64,
    gpu_bytes_recompute: u64,
}

fn options(device: &str) -> Result<PolicyOptions> {
    Ok(PolicyOptions {
        device: device.parse()?,
        ..PolicyOptions::default()
    })
}

fn parse_ids(text: &str) -> Result<Vec<u32>> {
    let ids = text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<u32>()
                .with_context(|| format!("--input-ids: `{s}` is not a token id"))
        })
        .collect::<Result<Vec<_>>>()?;
    if ids.is_empty() {
        bail!("--input-ids is empty");
    }
    Ok(ids)
}

fn score(args: ScoreArgs) -> Result<()> {
    let ids = parse_ids(&args.input_ids)?;
    let policy = Policy::load(&args.model, options(&args.device)?)
        .with_context(|| format!("loading model {}", args.model.display()))?;
    let logits = policy.score(&ids)?;
    write_npy(&args.output, logits.len, logits.vocab, &logits.data)?;
    println!(
        "wrote logits [{}, {}] to {}",
        logits.len,
        logits.vocab,
        args.output.display()
    );
    Ok(())
}

fn generate(args: GenerateArgs) -> Result<()> {
    let chat = ChatModel::from_dir(&args.model)
        .with_context(|| format!("loading tokenizer and chat template of {}", args.model.display()))?;
    let messages = [serde_json::json!({"role": "user", "content": args.prompt})];
    let text = chat.template.render(
        &messages,
        RenderOptions {
            add_generation_prompt: true,
            ..RenderOptions::default()
        },
    )?;
    let input_ids = chat.tokenizer.encode(&text)?;
    let policy = Policy::load(&args.model, options(&args.device)?)
        .with_context(|| format!("loading model {}", args.model.display()))?;
    let mut stream = policy.submit(GenerationRequest {
        input_ids,
        sampling: SamplingParams {
            temperature: args.temperature,
            seed: args.seed,
            ..SamplingParams::default()
        },
        stop_token_ids: chat.stop_token_ids.clone(),
        max_new_tokens: args.max_new_tokens,
    })?;
    let mut decoder = IncrementalDecoder::new();
    let mut out = std::io::stdout().lock();
    while let Some(event) = stream.blocking_recv() {
        match event {
            GenerationEvent::Token { token_id, .. } => {
                if chat.stop_token_ids.contains(&token_id) {
                    continue;
                }
                if let Some(piece) = decoder.push(&chat.tokenizer, token_id)? {
                    out.write_all(piece.as_bytes())?;
                    out.flush()?;
                }
            }
            GenerationEvent::Finished { .. } => {
                let rest = decoder.finish(&chat.tokenizer)?;
                writeln!(out, "{rest}")?;
                return Ok(());
            }
        }
    }
    bail!("the inference engine stopped before the answer finished")
}

/// Writes `[len, vocab]` float32 logits in NumPy's `.npy` format.
fn write_npy(path: &Path, len: usize, vocab: usize, data: &[f32]) -> Result<()> {
    let logits = ndarray::ArrayView2::from_shape((len, vocab), data)
        .with_context(|| format!("{} logits do not make [{len}, {vocab}]", data.len()))?;
    ndarray_npy::write_npy(path, &logits).with_context(|| format!("writing {}", path.display()))
}
