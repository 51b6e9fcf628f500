//! The fit check before anything is queued: the trainer must load the model (`MODEL_PATH/config.json`'s
//! architecture) and, on GPU profiles, its estimate of one training step must fit one GPU of the profile
//! (`GPU_MEMORY_GIB`).
//!
//! Both answers are the trainer's own: `arena-rl model estimate --model MODEL_PATH --tokens T --json` (the
//! binary the job runs), with T the micro-batch budget (`actor.max_tokens_per_mb`) and layer recompute as the
//! run config sets it. burn trains on one GPU, so the whole step is that GPU's.

use std::process::Command;

use serde::Deserialize;

use super::validate::{Launch, Problems};

/// What `arena-rl model estimate --json` prints.
#[derive(Debug, Deserialize)]
struct Estimate {
    architecture: String,
    parameters: u64,
    step_bytes: u64,
    step_bytes_recompute: u64,
}

const GIB: f64 = (1u64 << 30) as f64;

/// Checks that the trainer loads `MODEL_PATH` and that one step fits a GPU; one line per problem.
pub(crate) fn check(l: &Launch, config: &stream_config::RunConfig) -> Result<(), Problems> {
    let mut problems = Problems::default();
    let tokens = config.actor.max_tokens_per_mb;
    let out = Command::new(&l.bin)
        .args([
            "model",
            "estimate",
            "--json",
            "--tokens",
            &tokens.to_string(),
            "--model",
        ])
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
        let bytes = if recompute {
            estimate.step_bytes_recompute
        } else {
            estimate.step_bytes
        };
        let gib = bytes as f64 / GIB;
        if gib > f64::from(limit) {
            problems.push(format!(
                "MODEL_PATH {} ({}, {:.2}B parameters) does not fit the {} actor {}: the trainer's estimate of one step of {tokens} tokens (actor.max_tokens_per_mb{}) is {gib:.1} GiB on one GPU, more than GPU_MEMORY_GIB={limit}",
                l.model.display(),
                estimate.architecture,
                estimate.parameters as f64 / 1e9,
                l.profile.name(),
                l.knobs.actor,
                if recompute { ", with layer recompute" } else { "" },
            ));
        }
    }
    if problems.len() == 0 {
        Ok(())
    } else {
        Err(problems)
    }
}
