//! Run defaults a week-long GPU run can live with, where the reference leaves the schema's: the learning rate
//! by model size, a checkpoint every [`GPU_CHECKPOINT_EVERY`] steps, and weights published to the policy
//! servers as bf16 safetensors shards with an index.
//!
//! A default is passed to `arena-rl train` only where the user's config (its files, `ARENA_RL_` variables and
//! dotted overrides) does not set the key; `LEARNING_RATE` and `CHECKPOINT_EVERY` are passed over the config
//! file, as the other knobs' variables are. docs/slurm.md ("Run defaults") is the user's account of this.

use super::profile::{Lr, Pick, Serving};
use super::validate::Launch;

/// Steps between checkpoints on the GPU profiles. A checkpoint holds the f32 weights and both AdamW moments
/// (12 bytes a parameter, about 98 GB at 8B): saving it every step, the schema's default, costs a step's
/// worth of filesystem traffic each time; every 10 steps, a kill makes at most 9 steps train again, from the
/// rollouts the journal kept.
pub(crate) const GPU_CHECKPOINT_EVERY: u64 = 10;

/// The seed article's Flash V3 run: Adam at 3e-6.
pub(crate) const FLASH_V3_LR: &str = "3e-6";

/// The largest safetensors file of the published weights: 4 GiB, the FSDP2 worker's shard size.
pub(crate) const WEIGHTS_SHARD_BYTES: u64 = 4 << 30;

/// Parameters from which the rule's smaller rate applies.
const LARGE_MODEL_PARAMETERS: u64 = 3_000_000_000;

/// The learning rate for a model of `parameters` parameters, with where the figure comes from: 1e-5 below 3B
/// parameters (AReaL's `examples/math/boba_grpo.yaml`, GRPO on DeepSeek-R1-Distill-Qwen-1.5B at 1e-5; its
/// `gsm8k_grpo.yaml` trains Qwen2.5-1.5B-Instruct at 1.7e-5), 1e-6 from 3B (verl's
/// `examples/grpo_trainer/run_qwen2-7b.sh`, Qwen2-7B-Instruct at 1e-6, and `run_qwen3-235b_megatron_96gb.sh`,
/// Qwen3-235B-A22B at 1e-6).
pub(crate) fn learning_rate(parameters: u64) -> (&'static str, &'static str) {
    if parameters < LARGE_MODEL_PARAMETERS {
        (
            "1e-5",
            "below 3B parameters (AReaL's boba_grpo.yaml, a 1.5B model at 1e-5)",
        )
    } else {
        (
            "1e-6",
            "3B parameters or more (verl's GRPO examples, 7B to 235B at 1e-6)",
        )
    }
}

/// One setting `cargo xtask submit` passes to `arena-rl train`, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Chosen {
    /// The dotted override, `actor.lr=1e-6`.
    pub(crate) arg: String,
    /// Why this value, for the line submit prints.
    pub(crate) why: String,
}

/// The defaults of `l`'s profile that apply: `user_sets(key)` says whether the user's config sets `key`, and
/// `parameters` is the model's parameter count from the fit check (`None` when it did not run: then the
/// learning rate by size is not passed, and the config's stands).
pub(crate) fn resolve(l: &Launch, user_sets: &dyn Fn(&str) -> bool, parameters: Option<u64>) -> Vec<Chosen> {
    let mut out = Vec::new();
    if !l.trains() {
        return out;
    }
    let mut default = |key: &str, value: String, why: String| {
        if user_sets(key) {
            return;
        }
        out.push(Chosen {
            arg: format!("{key}={value}"),
            why,
        });
    };
    let profile = l.profile.name();
    match &l.knobs.lr {
        Pick::Default(Lr::BySize) => {
            if let Some(n) = parameters {
                let (rate, rule) = learning_rate(n);
                default(
                    "actor.lr",
                    rate.to_string(),
                    format!("{profile}'s rule for {:.2}B parameters: {rule}", n as f64 / 1e9),
                );
            }
        }
        Pick::Default(Lr::Rate(rate)) => {
            default("actor.lr", rate.clone(), format!("{profile}'s learning rate"));
        }
        Pick::Config | Pick::Set(_) => {}
    }
    if let Pick::Default(n) = l.knobs.checkpoint_every {
        default(
            "checkpoint.save_every",
            n.to_string(),
            format!("{profile} checkpoints every {n} steps"),
        );
    }
    let servers = matches!(l.placement.serving, Serving::Sglang { .. } | Serving::Burn);
    if l.profile.default_gpus_per_node() > 0 && l.placement.gpus_per_node > 0 && servers {
        default(
            "rollout.weights_dtype",
            "bf16".into(),
            "the policy servers load bf16 weights".into(),
        );
        default(
            "rollout.weights_shard_bytes",
            WEIGHTS_SHARD_BYTES.to_string(),
            "4 GiB safetensors shards with an index".into(),
        );
    }
    out
}

/// The knobs' environment variables that are passed over the config file: `LEARNING_RATE` and
/// `CHECKPOINT_EVERY`.
pub(crate) fn set_overrides(l: &Launch) -> Vec<String> {
    let mut o = Vec::new();
    if !l.trains() {
        return o;
    }
    if let Pick::Set(Lr::Rate(rate)) = &l.knobs.lr {
        o.push(format!("actor.lr={rate}"));
    }
    if let Pick::Set(n) = l.knobs.checkpoint_every {
        o.push(format!("checkpoint.save_every={n}"));
    }
    o
}
