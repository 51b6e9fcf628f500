//! The fit check before anything is queued: the trainer must load the model (`MODEL_PATH/config.json`'s
//! architecture) and, on GPU profiles, its estimate of one training step must fit one GPU of the profile
//! (`GPU_MEMORY_GIB`).
//!
//! Both answers are the trainer's own: `arena-rl model estimate --model MODEL_PATH --tokens T --json` (the
//! binary the job runs), with T the micro-batch budget (`actor.max_tokens_per_mb`) and layer recompute as the
//! run config sets it. burn trains on one GPU, so the whole step is that GPU's. An `fsdp2:dN` actor asks for
//! one GPU's share of the FSDP2 layout over N GPUs (`--fsdp2-gpus N`, in f32 unless `actor.bf16_autocast`,
//! with the worker's `actor.fsdp2.logprob_chunk_tokens`), and activation checkpointing as
//! `actor.recompute_layers` sets it.

use std::process::Command;

use serde::Deserialize;

use super::profile::ActorLayout;
use super::validate::{Launch, Problems};

/// What `arena-rl model estimate --json` prints.
#[derive(Debug, Deserialize)]
struct Estimate {
    architecture: String,
    parameters: u64,
    step_bytes: u64,
    step_bytes_recompute: u64,
    /// With `--fsdp2-gpus`: one GPU of the FSDP2 layout.
    fsdp2: Option<Fsdp2Estimate>,
}

#[derive(Debug, Deserialize)]
struct Fsdp2Estimate {
    gpu_bytes: u64,
    gpu_bytes_recompute: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Checks that the trainer loads `MODEL_PATH` and that one step fits a GPU, and returns the model's parameter
/// count; one line per problem.
pub(crate) fn check(l: &Launch, config: &stream_config::RunConfig) -> Result<u64, Problems> {
    let mut problems = Problems::default();
    let tokens = config.actor.max_tokens_per_mb;
    let mut command = Command::new(&l.bin);
    command.args(["model", "estimate", "--json", "--tokens", &tokens.to_string()]);
    let fsdp2_gpus = match l.placement.actor {
        ActorLayout::Fsdp2 { ranks } => {
            command
                .args(["--fsdp2-gpus", &ranks.to_string(), "--logprob-chunk-tokens"])
                .arg(config.actor.fsdp2.logprob_chunk_tokens.to_string());
            if !config.actor.bf16_autocast {
                command.arg("--f32");
            }
            Some(ranks)
        }
        ActorLayout::Burn => None,
    };
    let out = command
        .arg("--model")
        .arg(&l.model)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => {
            problems.push(format!("ARENA_RL_BIN {} does not run: {e}", l.bin.display()));
            return Err(problems);
        }
    };
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("no reason given");
        let why = why.trim().trim_start_matches("error: ");
        problems.push(format!(
            "MODEL_PATH {}: the trainer cannot load this model: {why}",
            l.model.display()
        ));
        return Err(problems);
    }
    let estimate: Estimate = match serde_json::from_slice(&out.stdout) {
        Ok(e) => e,
        Err(e) => {
            problems.push(format!(
                "ARENA_RL_BIN {}: `model estimate --json` printed no estimate ({e}); is it an arena-rl of this checkout?",
                l.bin.display()
            ));
            return Err(problems);
        }
    };
    let limit = l.knobs.gpu_memory_gib;
    if l.placement.gpus_per_node > 0 {
        let recompute = config.actor.recompute_layers;
        let (bytes, on) = match (fsdp2_gpus, &estimate.fsdp2) {
            (None, _) => (
                if recompute {
                    estimate.step_bytes_recompute
                } else {
                    estimate.step_bytes
                },
                "on one GPU".to_string(),
            ),
            (Some(gpus), Some(f)) => (
                if recompute {
                    f.gpu_bytes_recompute
                } else {
                    f.gpu_bytes
                },
                if gpus == 1 {
                    "on its one GPU".to_string()
                } else {
                    format!("on each of its {gpus} GPUs")
                },
            ),
            (Some(_), None) => {
                problems.push(format!(
                    "ARENA_RL_BIN {}: `model estimate --fsdp2-gpus` printed no FSDP2 estimate; is it an arena-rl of this checkout?",
                    l.bin.display()
                ));
                return Err(problems);
            }
        };
        let gib = bytes as f64 / GIB;
        if gib > f64::from(limit) {
            let what = match (fsdp2_gpus, recompute) {
                (None, true) => ", with layer recompute",
                (Some(_), true) => ", with activation checkpointing",
                (_, false) => "",
            };
            problems.push(format!(
                "MODEL_PATH {} ({}, {:.2}B parameters) does not fit the {} actor {}: the trainer's estimate of one step of {tokens} tokens (actor.max_tokens_per_mb{what}) is {gib:.1} GiB {on}, more than GPU_MEMORY_GIB={limit}",
                l.model.display(),
                estimate.architecture,
                estimate.parameters as f64 / 1e9,
                l.profile.name(),
                l.knobs.actor,
            ));
        }
    }
    if problems.len() == 0 {
        Ok(estimate.parameters)
    } else {
        Err(problems)
    }
}
