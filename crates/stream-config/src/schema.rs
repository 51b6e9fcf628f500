//! The typed run config: one struct per section, a doc comment on every field, the reference's defaults.
//!
//! Raw values arrive from YAML, the environment and overrides (see [`crate::load`]); serde rejects unknown
//! fields and wrong types, then [`RunConfig::validate`] checks every rule and reports all problems at once.

mod econfig;
mod guard;
pub(crate) mod lenient_json;
mod runtime;
mod seconds;
mod trackers;

use serde::{Deserialize, Serialize};

pub use econfig::{DatasetSource, EConfig};
pub use guard::{GuardSection, IntegrityPolicy, StreamGuard};
pub use runtime::{
    CheckpointSection, ExportStyle, MetricsSection, ModelEngine, ModelSection, ProxySection, ReasoningParser,
    RolloutSection, ToolCallParser,
};
pub use seconds::Seconds;
pub use trackers::{MlflowSection, Tracker, WandbMode, WandbSection};

use crate::env::Env;
use crate::error::{Collector, Problem};
use crate::path::KeyPath;
use crate::stream::StreamConfig;

/// A whole run config.
///
/// To add a section: define its struct here (or in its own module under `schema/`) with
/// `#[serde(deny_unknown_fields, default)]`, a `Default` with the reference's defaults and a doc comment on
/// every field; add it as a field below; check its rules in [`RunConfig::problems`]. Environment variables
/// (`ARENA_RL_<SECTION>__<FIELD>`) and dotted overrides then reach it without further work.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Name of the experiment (required); outputs go under `<cluster.fileroot>/<experiment_name>/<trial_name>`,
    /// so it is one directory name: not `.` or `..`, and without `/`, `\` or NUL.
    pub experiment_name: String,
    /// Name of this trial of the experiment (required; one directory name, as `experiment_name`).
    pub trial_name: String,
    /// Where the run executes and writes.
    pub cluster: ClusterConfig,
    /// Arena: Streams, routing, timeouts and reward knobs.
    pub econfig: EConfig,
    /// Generation during rollouts.
    pub gconfig: GenerationConfig,
    /// The policy being trained.
    pub actor: ActorConfig,
    /// How prompt rows are batched for training.
    pub train_dataset: DatasetConfig,
    /// How prompt rows are batched for evaluation; absent means no evaluation.
    pub valid_dataset: Option<DatasetConfig>,
    /// Evaluate on `valid_dataset` rows every this many training steps (0 never evaluates).
    pub eval_every: u64,
    /// The rollout proxy the loop runs in-process.
    pub proxy: ProxySection,
    /// Rollout scheduling and where the policy is served.
    pub rollout: RolloutSection,
    /// The policy's weights.
    pub model: ModelSection,
    /// Checkpoints of the trained policy.
    pub checkpoint: CheckpointSection,
    /// Per-step metric files.
    pub metrics: MetricsSection,
    /// The reward-integrity guard: which rules scan the policy's commands, run-wide and per Stream, and what
    /// a hit costs (docs/integrity-guard.md).
    pub guard: GuardSection,
}

/// The `cluster` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Root directory for logs, checkpoints and audit shards; must be visible to every node.
    pub fileroot: String,
    /// Number of nodes the run uses (what a launcher allocates: `cargo xtask submit` sets it from its layout
    /// and refuses an override that would contradict the allocation).
    pub n_nodes: u32,
    /// GPUs per node: the CUDA devices `actor.device` and `model.device` may name (`cuda:N` with N below
    /// it), and the most FSDP2 ranks a node runs on GPUs (`actor.fsdp2.nproc_per_node`); 0 is a node without
    /// GPUs, where both devices must be `cpu`.
    pub n_gpus_per_node: u32,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            fileroot: "/tmp/arena-rl/".to_string(),
            n_nodes: 32,
            n_gpus_per_node: 8,
        }
    }
}

/// The `gconfig` section: sampling during rollouts and rollout-time group handling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GenerationConfig {
    /// Rollouts per prompt row (the GRPO group size).
    pub n_samples: u32,
    /// Most tokens generated per model call.
    pub max_new_tokens: u32,
    /// Sampling temperature (0 is greedy), finite and >= 0.
    pub temperature: f64,
    /// Nucleus sampling threshold, in (0, 1] (1 keeps every token).
    pub top_p: f64,
    /// Keep only the `top_k` most likely tokens when sampling: an integer >= 1, or null or -1 (SGLang's
    /// spelling) for no top-k truncation (the default). See [`GenerationConfig::top_k_limit`].
    pub top_k: Option<i64>,
    /// Whose sampling settings win when a harness request sets its own `temperature`, `top_p` or `top_k`:
    /// `honour` (the harness's, as the reference does; the run's fill only what a request omits) or
    /// `override` (the run's `gconfig` values replace the harness's).
    pub harness_sampling: HarnessSampling,
    /// Z-score each group's rewards at rollout time (population std + 1e-8); excludes `actor.reward_norm`.
    pub reward_normalization: bool,
    /// Drop a whole group when any of its samples failed.
    pub drop_incomplete_group: bool,
    /// With `reward_normalization`, divide by the group's standard deviation (true, the default); false
    /// subtracts the group mean only (AReaL #1750's mean-only groups). false needs `reward_normalization`.
    pub reward_normalization_use_std: bool,
    /// A group with fewer samples that produced a trajectory is rejected (`usable_group`); 1 keeps any group
    /// with one (AReaL's `min_usable_group_size`, kept in `gconfig` here). At most `n_samples`.
    pub min_usable_group_size: u32,
    /// A training rollout whose task ended `EVAL_FAILED` (the grader's failure), or `HARNESS_FAILED`,
    /// `NO_OUTPUT` or `TIMEOUT` without model evidence, drops only its own sample instead of failing its
    /// group (AReaL #1751's `reject_terminal_task_failures`); never after a proxy system error, never in
    /// evaluation. See docs/failure-dispositions.md.
    pub reject_terminal_task_failures: bool,
}

impl Default for GenerationConfig {
    fn default() -> Self {
        Self {
            n_samples: 1,
            max_new_tokens: 16384,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            harness_sampling: HarnessSampling::Honour,
            reward_normalization: false,
            drop_incomplete_group: false,
            reward_normalization_use_std: true,
            min_usable_group_size: 1,
            reject_terminal_task_failures: false,
        }
    }
}

impl GenerationConfig {
    /// `top_k` as a limit: `Some(k)` for k >= 1, `None` when top-k truncation is off (null or -1).
    ///
    /// A value validation refuses (0, below -1, above `u32::MAX`) also reads as `None`.
    pub fn top_k_limit(&self) -> Option<u32> {
        self.top_k.filter(|k| *k >= 1).and_then(|k| u32::try_from(k).ok())
    }
}

/// Whose sampling settings win when a harness request sets its own (`gconfig.harness_sampling`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HarnessSampling {
    /// The harness's values win; the run's `gconfig` values fill only what a request omits (the reference's
    /// session `generation_args`).
    #[default]
    Honour,
    /// The run's `gconfig` values replace whatever the harness sends.
    Override,
}

/// Where a normalisation statistic is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NormLevel {
    /// Over the whole training batch.
    Batch,
    /// Over each prompt's group of samples.
    Group,
}

/// Training-time normalisation of rewards or advantages (the reference's `NormConfig`).
///
/// The one copy of these fields and defaults above `trainer`: reward-routing normalises with this type, and
/// `trainer` keeps its own `AdvNorm` (it depends on no workspace crate), whose defaults a test in `arena-rl`
/// pins equal to these.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NormConfig {
    /// Level of the subtracted mean; null subtracts nothing.
    pub mean_level: Option<NormLevel>,
    /// Leave-one-out mean.
    pub mean_leave1out: bool,
    /// Level of the dividing standard deviation; null divides by 1.
    pub std_level: Option<NormLevel>,
    /// Unbiased (n - 1) standard deviation.
    pub std_unbiased: bool,
    /// Added to the standard deviation before dividing.
    pub eps: f64,
    /// Group size when the real per-group sizes are unknown.
    pub group_size: u32,
}

impl Default for NormConfig {
    fn default() -> Self {
        Self {
            mean_level: Some(NormLevel::Batch),
            mean_leave1out: false,
            std_level: Some(NormLevel::Batch),
            std_unbiased: true,
            eps: 1e-5,
            group_size: 1,
        }
    }
}

impl NormConfig {
    /// Group-level mean and std, the usual GRPO setting.
    pub fn group() -> Self {
        Self {
            mean_level: Some(NormLevel::Group),
            std_level: Some(NormLevel::Group),
            ..Self::default()
        }
    }
}

/// The per-token KL estimator of the penalty to the reference policy (the reference's `kl_estimator`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `log(pi / pi_ref)`.
    #[default]
    K1,
    /// `log(pi / pi_ref)^2 / 2`.
    K2,
    /// `pi_ref / pi - 1 - log(pi_ref / pi)` (non-negative).
    K3,
}

/// How per-token losses are averaged into the step's loss (the reference's `loss_agg_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossAggMode {
    /// Mean over every trained token of the batch.
    #[default]
    #[serde(rename = "token-mean")]
    TokenMean,
    /// Mean over each sequence's trained tokens, then over sequences.
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
}

/// How a rollout whose export holds several trajectories (a session that branched) weighs in a batch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BranchWeight {
    /// Its trajectories share its advantage, each getting the advantage divided by their number, so a
    /// rollout does not weigh more for branching.
    #[default]
    Split,
    /// Each trajectory gets the rollout's whole advantage, as the reference trains every concat leaf.
    Each,
}

/// Which engine trains the policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TrainerBackend {
    /// `trainer` (burn), in the `arena-rl` process, on one device.
    #[default]
    Burn,
    /// A PyTorch FSDP2 worker (`crates/fsdp2-trainer/worker`) under `torchrun`, one process a GPU, driven
    /// through the `arena-rl-trainer/1` protocol (`docs/trainer-protocol.md`); settings in `actor.fsdp2`.
    Fsdp2,
}

/// `actor.fsdp2`: how the FSDP2 worker runs (read only when `actor.backend: fsdp2`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Fsdp2Config {
    /// The Python that runs `torch.distributed.run` (the worker's package `arena_rl_fsdp2` must be
    /// importable there).
    pub python: String,
    /// Ranks (processes, one a GPU) `torchrun --standalone` starts on this machine.
    pub nproc_per_node: u32,
    /// `HOST:PORT` of a worker started elsewhere (for example by Slurm) to attach to instead of starting one;
    /// null starts one here. The key is `ARENA_RL_TRAINER_API_KEY` on both sides.
    pub attach: Option<String>,
    /// Tokens per chunk of the log-probability and entropy computation (no `tokens x vocab` logits beyond
    /// one chunk).
    pub logprob_chunk_tokens: u64,
    /// Seconds the worker may take to start and answer its first health check.
    pub ready_timeout_seconds: Seconds,
}

impl Default for Fsdp2Config {
    fn default() -> Self {
        Self {
            python: "python3".to_string(),
            nproc_per_node: 1,
            attach: None,
            logprob_chunk_tokens: 1024,
            ready_timeout_seconds: Seconds::of(600.0),
        }
    }
}

/// The learning-rate schedule after warm-up (the reference's `optimizer.lr_scheduler_type`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LrSchedulerType {
    /// The base rate throughout.
    #[default]
    Constant,
    /// Linear decay to `min_lr_ratio` times the base rate at the last step.
    Linear,
    /// Half-cosine decay to `min_lr_ratio` times the base rate at the last step.
    Cosine,
}

/// The `actor` section: the policy and its GRPO update.
///
/// The reference nests the optimiser's knobs under `actor.optimizer` and the micro-batch budget under
/// `actor.mb_spec`; here they sit directly in `actor`, next to `lr`, under the reference's names (`eps` is
/// `adam_eps`, so it is not mistaken for a clip range).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ActorConfig {
    /// Which engine trains: `burn` (the default, `trainer` in this process, on one device) or `fsdp2` (a
    /// PyTorch FSDP2 worker under `torchrun`, `actor.fsdp2`). Every other `actor` setting means the same
    /// for both, except `device: cuda:N` with N > 0 (fsdp2 uses every GPU `actor.fsdp2.nproc_per_node`
    /// names); `bf16_autocast` is FSDP2's mixed precision (bf16 parameters, f32 reduction) and
    /// `recompute_layers` its activation checkpointing (on any device).
    pub backend: TrainerBackend,
    /// The FSDP2 worker's settings (with `backend: fsdp2`).
    pub fsdp2: Fsdp2Config,
    /// Training-time reward normalisation; null disables it.
    pub reward_norm: Option<NormConfig>,
    /// Advantage normalisation over trained tokens, applied by the trainer; null disables it.
    pub adv_norm: Option<NormConfig>,
    /// Learning rate; 0 freezes the weights (a control run).
    pub lr: f64,
    /// PPO clip range of the policy ratio.
    pub eps_clip: f64,
    /// Upper clip range when it differs from `eps_clip` (DAPO's clip-higher); null uses `eps_clip`. A higher
    /// upper bound (DAPO uses 0.28 with `eps_clip` 0.2) lets unlikely tokens with a positive advantage grow
    /// faster than the symmetric clip allows, which slows the collapse of the policy's entropy
    /// (`train/entropy`) that ends exploration.
    pub eps_clip_higher: Option<f64>,
    /// Dual clip: a negative-advantage token's loss is capped at `c_clip * |A|` (must be > 1); null disables it.
    pub c_clip: Option<f64>,
    /// Use the decoupled PPO objective: clip against the proximal policy (the weights before the step) and
    /// weight each token by `pi_prox / pi_behave`, for rollouts sampled by stale policy versions.
    pub use_decoupled_loss: bool,
    /// Replace the sampling log-probabilities by recomputed ones even without the decoupled objective.
    pub recompute_logprob: bool,
    /// Drop tokens whose behaviour importance weight `pi_prox / pi_behave` exceeds this (must be > 1; needs
    /// `use_decoupled_loss`); null keeps every token.
    pub behav_imp_weight_cap: Option<f64>,
    /// Coefficient of the KL penalty to the initial policy; 0 disables it and keeps no reference copy (the
    /// reference defaults to 0.1, but its GRPO configs set 0).
    pub kl_ctl: f64,
    /// The per-token KL estimator: `k1`, `k2` or `k3`.
    pub kl_estimator: KlEstimator,
    /// Coefficient of the entropy bonus; 0 disables it (the reference has no entropy bonus). The loss
    /// subtracts `entropy_coeff` times the mean entropy of the trained tokens, holding `train/entropy` up
    /// against a collapse onto one answer; too large a value keeps the policy from committing at all (start
    /// around 0.001-0.02 and watch `train/entropy` and `rollout/groups_trained`).
    pub entropy_coeff: f64,
    /// How per-token losses are averaged: `token-mean` or `seq-mean-token-mean`.
    pub loss_agg_mode: LossAggMode,
    /// How a rollout of several trajectories (its session branched) weighs in a batch: `split` (the
    /// default) divides its advantage among them, `each` gives each the whole advantage (the reference's
    /// behaviour, under which a rollout's weight grows with its branch count).
    pub branch_weight: BranchWeight,
    /// AdamW's decoupled weight decay, applied to every parameter (the reference's `optimizer.weight_decay`).
    pub weight_decay: f64,
    /// AdamW's first-moment decay (`optimizer.beta1`).
    pub beta1: f64,
    /// AdamW's second-moment decay (`optimizer.beta2`).
    pub beta2: f64,
    /// AdamW's epsilon (`optimizer.eps`).
    pub adam_eps: f64,
    /// Clip the global gradient norm to this; 0 disables clipping (`optimizer.gradient_clipping`).
    pub gradient_clipping: f64,
    /// The schedule after warm-up: `constant`, `linear` or `cosine` (`optimizer.lr_scheduler_type`).
    pub lr_scheduler_type: LrSchedulerType,
    /// Fraction of the training steps spent warming the rate up linearly from 0
    /// (`optimizer.warmup_steps_proportion`).
    pub warmup_steps_proportion: f64,
    /// Floor of the decay as a fraction of `lr` (`optimizer.min_lr_ratio`).
    pub min_lr_ratio: f64,
    /// Most tokens packed into one forward/backward pass (`mb_spec.max_tokens_per_mb`); a longer sequence gets
    /// a pass of its own. The reference's null (everything in one pass) would not fit in memory on a CPU, so
    /// the default is 8192.
    pub max_tokens_per_mb: u64,
    /// Where the trainer computes: `cpu`, `cuda` or `cuda:N` (CUDA needs a build with the `cuda` feature).
    pub device: String,
    /// Matrix products in bf16 with f32 master weights (CUDA only).
    pub bf16_autocast: bool,
    /// Keep only each decoder layer's input between the forward and the backward pass and recompute the
    /// layer there: activation memory per token drops to about one hidden vector per layer, for one more
    /// forward pass per step (`arena-rl model estimate` prints both). CPU only for now.
    pub recompute_layers: bool,
    /// Stop after this many training steps; null trains through the data.
    pub total_train_steps: Option<u64>,
    /// Multiplies rewards before clipping.
    pub reward_scaling: f64,
    /// Added to rewards before scaling.
    pub reward_bias: f64,
    /// Rewards are clipped to `[-reward_clip, reward_clip]`.
    pub reward_clip: f64,
}

impl Default for ActorConfig {
    fn default() -> Self {
        Self {
            backend: TrainerBackend::Burn,
            fsdp2: Fsdp2Config::default(),
            reward_norm: None,
            adv_norm: None,
            lr: 1e-3,
            eps_clip: 0.2,
            eps_clip_higher: None,
            c_clip: None,
            use_decoupled_loss: false,
            recompute_logprob: false,
            behav_imp_weight_cap: None,
            kl_ctl: 0.0,
            kl_estimator: KlEstimator::K1,
            entropy_coeff: 0.0,
            loss_agg_mode: LossAggMode::TokenMean,
            branch_weight: BranchWeight::Split,
            weight_decay: 0.01,
            beta1: 0.9,
            beta2: 0.999,
            adam_eps: 1e-8,
            gradient_clipping: 1.0,
            lr_scheduler_type: LrSchedulerType::Constant,
            warmup_steps_proportion: 0.001,
            min_lr_ratio: 0.0,
            max_tokens_per_mb: 8192,
            device: "cpu".to_string(),
            bf16_autocast: false,
            recompute_layers: false,
            total_train_steps: None,
            reward_scaling: 1.0,
            reward_bias: 0.0,
            reward_clip: 20.0,
        }
    }
}

impl ActorConfig {
    /// The problems of the update's own knobs (the reward knobs are checked with the rest of the config).
    fn check_update(&self, a: &KeyPath, c: &mut Collector) {
        if let Some(v) = self.eps_clip_higher {
            positive(c, a.key("eps_clip_higher"), v);
        }
        if let Some(v) = self.c_clip
            && !(v.is_finite() && v > 1.0)
        {
            c.push(a.key("c_clip"), format!("must be finite and > 1, got {v}"));
        }
        if let Some(v) = self.behav_imp_weight_cap {
            if !(v.is_finite() && v > 1.0) {
                c.push(
                    a.key("behav_imp_weight_cap"),
                    format!("must be finite and > 1, got {v}"),
                );
            }
            if !self.use_decoupled_loss {
                c.push(
                    a.key("behav_imp_weight_cap"),
                    "needs actor.use_decoupled_loss: true",
                );
            }
        }
        for (field, v) in [
            ("kl_ctl", self.kl_ctl),
            ("entropy_coeff", self.entropy_coeff),
            ("weight_decay", self.weight_decay),
            ("gradient_clipping", self.gradient_clipping),
        ] {
            non_negative(c, a.key(field), v);
        }
        for (field, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                c.push(a.key(field), format!("must be in [0, 1), got {v}"));
            }
        }
        positive(c, a.key("adam_eps"), self.adam_eps);
        for (field, v) in [
            ("warmup_steps_proportion", self.warmup_steps_proportion),
            ("min_lr_ratio", self.min_lr_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                c.push(a.key(field), format!("must be in [0, 1], got {v}"));
            }
        }
        if self.max_tokens_per_mb == 0 {
            c.push(a.key("max_tokens_per_mb"), "must be >= 1, got 0");
        }
        let cuda = check_device(&self.device, a.key("device"), c);
        if self.bf16_autocast && !cuda {
            c.push(a.key("bf16_autocast"), "needs a CUDA device (actor.device: cuda)");
        }
        self.fsdp2
            .ready_timeout_seconds
            .check(c, a.key("fsdp2").key("ready_timeout_seconds"));
        if self.backend == TrainerBackend::Fsdp2 {
            if let Some(n) = self.device.strip_prefix("cuda:")
                && n != "0"
            {
                c.push(
                    a.key("device"),
                    format!(
                        "backend fsdp2 trains on every GPU of actor.fsdp2.nproc_per_node, not on cuda:{n} alone \
                         (use device: cuda)"
                    ),
                );
            }
            let f = a.key("fsdp2");
            if self.fsdp2.python.trim().is_empty() {
                c.push(f.key("python"), "must name a Python, got an empty string");
            }
            if self.fsdp2.nproc_per_node == 0 {
                c.push(f.key("nproc_per_node"), "must be >= 1, got 0");
            }
            if self.fsdp2.logprob_chunk_tokens == 0 {
                c.push(f.key("logprob_chunk_tokens"), "must be >= 1, got 0");
            }
            if let Some(addr) = &self.fsdp2.attach
                && !addr
                    .rsplit_once(':')
                    .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0))
            {
                c.push(f.key("attach"), format!("must be HOST:PORT, got {addr:?}"));
            }
        }
    }
}

/// The `train_dataset` and `valid_dataset` sections.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DatasetConfig {
    /// Prompt rows per training step (each row becomes `gconfig.n_samples` rollouts).
    pub batch_size: u64,
    /// Shuffle rows each epoch.
    pub shuffle: bool,
    /// Drop the last incomplete batch.
    pub drop_last: bool,
    /// `valid_dataset` only: the names of configured streams whose rows are held out for evaluation. Those
    /// streams are resolved like the others, but their rows are never trained on, and every evaluation rolls
    /// out the first `batch_size` of them. Empty (the default) evaluates on the first batch of the training
    /// rows.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub streams: Vec<String>,
}

impl Default for DatasetConfig {
    fn default() -> Self {
        Self {
            batch_size: 1,
            shuffle: true,
            drop_last: true,
            streams: Vec::new(),
        }
    }
}

/// Checks `valid_dataset.streams` against the configured streams: each name is one of them, named once, and
/// at least one stream is left to train on.
fn check_eval_streams(names: &[String], streams: &[StreamConfig], path: &KeyPath, c: &mut Collector) {
    let path = path.key("streams");
    let configured: Vec<&str> = streams.iter().map(|s| s.name.as_str()).collect();
    let mut seen = std::collections::BTreeSet::new();
    for name in names {
        if !configured.contains(&name.as_str()) {
            c.push(
                path.clone(),
                format!(
                    "{name:?} is not a configured stream (the streams are {})",
                    configured.join(", ")
                ),
            );
        } else if !seen.insert(name.as_str()) {
            c.push(path.clone(), format!("names {name:?} twice"));
        }
    }
    if !names.is_empty() && configured.iter().all(|n| names.iter().any(|e| e == n)) {
        c.push(
            path,
            "holds out every configured stream, which leaves none to train on",
        );
    }
}

impl RunConfig {
    /// `cluster.n_gpus_per_node` bounds the GPUs the run names: each CUDA device must be one of the node's,
    /// and FSDP2 on GPUs runs at most one rank a GPU.
    fn check_gpus(&self, root: &KeyPath, c: &mut Collector) {
        let gpus = self.cluster.n_gpus_per_node;
        let index = |device: &str| -> Option<u64> {
            match device {
                "cuda" => Some(0),
                d => d.strip_prefix("cuda:")?.parse().ok(),
            }
        };
        for (section, device) in [("actor", &self.actor.device), ("model", &self.model.device)] {
            if let Some(i) = index(device)
                && i >= u64::from(gpus)
            {
                c.push(
                    root.key(section).key("device"),
                    format!(
                        "{device:?} is not one of the node's GPUs: cluster.n_gpus_per_node is {gpus}{}",
                        if gpus == 0 { " (use cpu)" } else { "" }
                    ),
                );
            }
        }
        let ranks = self.actor.fsdp2.nproc_per_node;
        if self.actor.backend == TrainerBackend::Fsdp2 && index(&self.actor.device).is_some() && ranks > gpus
        {
            c.push(
                root.key("actor").key("fsdp2").key("nproc_per_node"),
                format!("{ranks} ranks of one GPU each do not fit the node's {gpus} GPUs (cluster.n_gpus_per_node)"),
            );
        }
    }
}

/// Checks a device setting (`cpu`, `cuda` or `cuda:N`); returns whether it names a CUDA device.
pub(crate) fn check_device(device: &str, path: KeyPath, c: &mut Collector) -> bool {
    let cuda = device == "cuda"
        || device
            .strip_prefix("cuda:")
            .is_some_and(|i| !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()));
    if device != "cpu" && !cuda {
        c.push(
            path,
            format!("{device:?} is not a device: expected cpu, cuda or cuda:N"),
        );
    }
    cuda
}

fn positive(c: &mut Collector, path: KeyPath, value: f64) {
    if !(value.is_finite() && value > 0.0) {
        c.push(path, format!("must be finite and positive, got {value}"));
    }
}

fn non_negative(c: &mut Collector, path: KeyPath, value: f64) {
    if !(value.is_finite() && value >= 0.0) {
        c.push(path, format!("must be finite and >= 0, got {value}"));
    }
}

fn check_norm(c: &mut Collector, path: KeyPath, norm: &NormConfig) {
    non_negative(c, path.key("eps"), norm.eps);
    if norm.group_size == 0 {
        c.push(path.key("group_size"), "must be >= 1, got 0");
    }
}

impl RunConfig {
    /// Checks every rule of every section, the Streams included (their sources are read, with `env` for `~`
    /// expansion), and returns every broken rule. Paths are key paths of the config; origins are not filled
    /// in here (see [`crate::load_run_config`], which adds file and line).
    pub fn problems(&self, env: &Env) -> Vec<Problem> {
        let mut c = Collector::default();
        let root = KeyPath::root();
        for (field, value) in [
            ("experiment_name", &self.experiment_name),
            ("trial_name", &self.trial_name),
        ] {
            if value.trim().is_empty() {
                c.push(root.key(field), "is required");
            } else if matches!(value.as_str(), "." | "..") || value.contains(['/', '\\', '\0']) {
                c.push(
                    root.key(field),
                    format!(
                        "{value:?} must be one directory name under cluster.fileroot: not \".\" or \"..\", and without '/', '\\' or NUL"
                    ),
                );
            }
        }
        if self.cluster.n_nodes == 0 {
            c.push(root.key("cluster").key("n_nodes"), "must be >= 1, got 0");
        }
        self.check_gpus(&root, &mut c);

        let g = root.key("gconfig");
        if self.gconfig.n_samples == 0 {
            c.push(g.key("n_samples"), "must be >= 1, got 0");
        }
        if self.gconfig.max_new_tokens == 0 {
            c.push(g.key("max_new_tokens"), "must be >= 1, got 0");
        }
        non_negative(&mut c, g.key("temperature"), self.gconfig.temperature);
        let top_p = self.gconfig.top_p;
        if !(top_p > 0.0 && top_p <= 1.0) {
            c.push(g.key("top_p"), format!("must be in (0, 1], got {top_p}"));
        }
        if let Some(k) = self.gconfig.top_k
            && k != -1
            && !(1..=i64::from(u32::MAX)).contains(&k)
        {
            c.push(
                g.key("top_k"),
                format!(
                    "must be >= 1 (at most {}), or -1 or null for no top-k, got {k}",
                    u32::MAX
                ),
            );
        }

        let a = root.key("actor");
        // 0 is allowed: `actor.lr=0` is the control run whose weights never change.
        non_negative(&mut c, a.key("lr"), self.actor.lr);
        positive(&mut c, a.key("eps_clip"), self.actor.eps_clip);
        positive(&mut c, a.key("reward_clip"), self.actor.reward_clip);
        for (field, value) in [
            ("reward_scaling", self.actor.reward_scaling),
            ("reward_bias", self.actor.reward_bias),
        ] {
            if !value.is_finite() {
                c.push(a.key(field), format!("must be finite, got {value}"));
            }
        }
        if self.actor.total_train_steps == Some(0) {
            c.push(a.key("total_train_steps"), "must be >= 1 or null, got 0");
        }
        if let Some(n) = &self.actor.reward_norm {
            check_norm(&mut c, a.key("reward_norm"), n);
            if self.gconfig.reward_normalization {
                c.push(
                    a.key("reward_norm"),
                    "gconfig.reward_normalization and actor.reward_norm normalise rewards twice; enable only one",
                );
            }
        }
        if let Some(n) = &self.actor.adv_norm {
            check_norm(&mut c, a.key("adv_norm"), n);
        }
        if !self.gconfig.reward_normalization_use_std && !self.gconfig.reward_normalization {
            c.push(
                g.key("reward_normalization_use_std"),
                "false (mean-only groups) needs gconfig.reward_normalization: true",
            );
        }
        let min_usable = self.gconfig.min_usable_group_size;
        if min_usable == 0 || min_usable > self.gconfig.n_samples.max(1) {
            c.push(
                g.key("min_usable_group_size"),
                format!(
                    "must be between 1 and gconfig.n_samples ({}), got {min_usable}",
                    self.gconfig.n_samples
                ),
            );
        }
        self.actor.check_update(&a, &mut c);

        for (section, d) in [
            ("train_dataset", Some(&self.train_dataset)),
            ("valid_dataset", self.valid_dataset.as_ref()),
        ] {
            if d.is_some_and(|d| d.batch_size == 0) {
                c.push(root.key(section).key("batch_size"), "must be >= 1, got 0");
            }
        }

        if self.eval_every > 0 && self.valid_dataset.is_none() {
            c.push(
                root.key("eval_every"),
                format!("is {} but valid_dataset is not set", self.eval_every),
            );
        }
        self.proxy.validate(&root.key("proxy"), &mut c);
        self.rollout.validate(&root.key("rollout"), &mut c);
        self.model.validate(&root.key("model"), &mut c);
        self.checkpoint.validate(&root.key("checkpoint"), &mut c);
        self.guard.validate(&root.key("guard"), &mut c);
        trackers::validate(
            &self.metrics.trackers,
            &self.metrics.wandb,
            &self.metrics.mlflow,
            &root.key("metrics"),
            env,
            &mut c,
        );

        self.econfig
            .validate(&root.key("econfig"), self.train_dataset.batch_size, &mut c);
        if !self.train_dataset.streams.is_empty() {
            c.push(
                root.key("train_dataset").key("streams"),
                "is for valid_dataset only: training uses every stream not held out for evaluation",
            );
        }
        if self.econfig.dataset_source == DatasetSource::Arena {
            let (streams, problems) = crate::stream::collect_streams(&self.econfig, env);
            if problems.is_empty() {
                let names: Vec<&str> = streams.iter().map(|s| s.name.as_str()).collect();
                self.guard.check_stream_names(&names, &root.key("guard"), &mut c);
                if let Some(valid) = &self.valid_dataset {
                    check_eval_streams(&valid.streams, &streams, &root.key("valid_dataset"), &mut c);
                }
            }
            c.extend(problems);
        }
        c.into_problems()
    }
}

impl RunConfig {
    /// The credentials this run reads from `env`, redacted by value wherever they appear: see
    /// [`crate::Secrets::from_env`]; the admin key is read from `proxy.admin_key_env`.
    pub fn secrets(&self, env: &Env) -> crate::Secrets {
        crate::Secrets::from_env(env, &[self.proxy.admin_key_env.as_str()])
    }

    /// The config as it is saved or printed: serialised, then passed through [`crate::redact`] with
    /// `secrets` (usually [`RunConfig::secrets`], with any key the run generated added).
    pub fn to_redacted_json(&self, secrets: &crate::Secrets) -> crate::Result<serde_json::Value> {
        let value = serde_json::to_value(self)
            .map_err(|e| crate::Error::Invalid(format!("cannot serialise the run config: {e}")))?;
        Ok(crate::redact(&value, secrets))
    }

    /// [`RunConfig::to_redacted_json`] as YAML.
    pub fn to_redacted_yaml(&self, secrets: &crate::Secrets) -> crate::Result<String> {
        serde_saphyr::to_string(&self.to_redacted_json(secrets)?)
            .map_err(|e| crate::Error::Invalid(format!("cannot write the run config as YAML: {e}")))
    }
}

/// The field names of a struct that derives `Deserialize` (used to tell config variables from others).
pub(crate) fn struct_fields<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    struct Capture(&'static [&'static str]);

    #[derive(Debug)]
    struct Stop;
    impl std::fmt::Display for Stop {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("field capture")
        }
    }
    impl std::error::Error for Stop {}
    impl de::Error for Stop {
        fn custom<M: std::fmt::Display>(_: M) -> Self {
            Stop
        }
    }

    struct Probe<'a>(&'a mut Capture);
    impl<'de> de::Deserializer<'de> for Probe<'_> {
        type Error = Stop;
        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
            Err(Stop)
        }
        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Stop> {
            self.0.0 = fields;
            Err(Stop)
        }
        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option unit
            unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
        }
    }

    let mut capture = Capture(&[]);
    let _ = T::deserialize(Probe(&mut capture));
    capture.0
}

#[cfg(test)]
mod tests;
