//! The sections the training loop reads: `proxy`, `rollout`, `model`, `checkpoint`, `metrics` (and the
//! top-level `eval_every` in [`super::RunConfig`]).
//!
//! Defaults follow the reference's Arena YAMLs where it has them (`export_style: concat`, `turn_discount: 1.0`,
//! session timeout 3600 s, the admin key from `SWE_RL_ADMIN_API_KEY`). The admin key itself is never a config
//! value: the config names the environment variable it is read from.

use serde::{Deserialize, Serialize};

use crate::error::Collector;
use crate::path::KeyPath;
use crate::schema::Seconds;

/// How the model writes tool calls, as the proxy parses them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallParser {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes; the reference's `qwen25`).
    #[default]
    Hermes,
    /// Qwen3-Coder's XML-style calls.
    Qwen3Coder,
    /// Tool calls are not parsed.
    None,
}

/// How the model writes reasoning, as the proxy parses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningParser {
    /// `<think>...</think>` at the start of the output (the reference's `qwen3`).
    #[default]
    Think,
    /// Reasoning is not parsed.
    None,
}

/// How a session is cut into trajectories at export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportStyle {
    /// One trajectory per leaf of the interaction tree (the reference's Arena YAMLs).
    #[default]
    Concat,
    /// One trajectory per interaction.
    Individual,
}

/// Which inference engine serves the policy in-process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelEngine {
    /// The trainer's burn policy, loaded from `model.path`.
    #[default]
    Burn,
    /// The proxy's deterministic fake engine over the folder's tokenizer (tests and demos; nothing learns).
    Fake,
}

/// The `proxy` section: the rollout proxy the loop runs in-process.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ProxySection {
    /// Address the proxy binds.
    pub host: String,
    /// Port the proxy binds; 0 picks a free one.
    pub port: u16,
    /// The proxy's address as Arena and Harnesses see it (`http://host:port`); empty means the bound address
    /// (with `0.0.0.0` replaced by this machine's hostname).
    pub public_url: String,
    /// Environment variable holding the proxy admin key (the reference's `SWE_RL_ADMIN_API_KEY`); when it is
    /// unset, a random key is generated for the run.
    pub admin_key_env: String,
    /// Most sessions held at once.
    pub max_sessions: u32,
    /// Seconds a session may stay idle before it is dropped (the reference's `session_timeout_seconds`).
    pub session_timeout_seconds: Seconds,
    /// Seconds an export waits for its session to end.
    pub export_wait_timeout_seconds: Seconds,
    /// How sessions are cut into trajectories: `concat` or `individual`.
    pub export_style: ExportStyle,
    /// Reward discount across a session's turns (`r_i += turn_discount * r_{i+1}`).
    pub turn_discount: f64,
    /// Score every chain of a `concat` export with the episode's reward when the session's graph is
    /// unambiguous: a harness that compacts its context starts a new chain, and without this only the
    /// newest chain carries the reward as set (AReaL #1751's `get_episode_reward_for_export`). Only for a
    /// task that succeeded; needs `export_style: concat`. A leaf's missing reward is never inferred otherwise.
    pub episode_reward_for_export: bool,
    /// Tool-call parser: `hermes`, `qwen3_coder` or `none`.
    pub tool_call_parser: ToolCallParser,
    /// Reasoning parser: `think` or `none`.
    pub reasoning_parser: ReasoningParser,
    /// Message preprocessors, by name, applied in order.
    pub preprocessors: Vec<String>,
    /// Seconds a request's head may take from its first byte before the connection is closed.
    pub header_read_timeout_seconds: Seconds,
    /// Seconds a request's body may take from the end of its head; past it the answer is 408.
    pub body_read_timeout_seconds: Seconds,
    /// Seconds a keep-alive connection may sit idle between requests.
    pub idle_timeout_seconds: Seconds,
    /// Seconds a write may wait on a client that does not read before the connection is closed (a stalled
    /// stream's generation is then dropped and its token reservation released).
    pub write_timeout_seconds: Seconds,
    /// The largest request body, in bytes; 413 beyond.
    pub max_body_bytes: u64,
    /// Most connections served at once; one more is answered 503.
    pub max_connections: u32,
    /// Most generations one session may have in flight; one more is answered 429.
    pub max_generations_per_session: u32,
    /// Most bytes of JSON one session's stored Responses answers may take; past it the oldest are forgotten.
    pub max_response_bytes_per_session: u64,
    /// Most bytes of JSON stored Responses answers may take across sessions.
    pub max_response_bytes: u64,
    /// Threads that parse, render and tokenise generation requests at once; null means one per core the
    /// process may use.
    pub pool_threads: Option<u32>,
    /// Generation requests that may wait for one of those threads; one more is answered 503 at once.
    pub pool_queue: u32,
}

impl Default for ProxySection {
    fn default() -> Self {
        Self {
            host: "127.0.0.1".to_string(),
            port: 0,
            public_url: String::new(),
            admin_key_env: "SWE_RL_ADMIN_API_KEY".to_string(),
            max_sessions: 4096,
            session_timeout_seconds: Seconds::of(3600.0),
            export_wait_timeout_seconds: Seconds::of(600.0),
            export_style: ExportStyle::Concat,
            turn_discount: 1.0,
            episode_reward_for_export: false,
            tool_call_parser: ToolCallParser::Hermes,
            reasoning_parser: ReasoningParser::Think,
            preprocessors: Vec::new(),
            header_read_timeout_seconds: Seconds::of(30.0),
            body_read_timeout_seconds: Seconds::of(60.0),
            idle_timeout_seconds: Seconds::of(120.0),
            write_timeout_seconds: Seconds::of(60.0),
            max_body_bytes: 32 * 1024 * 1024,
            max_connections: 4096,
            max_generations_per_session: 16,
            max_response_bytes_per_session: 64 * 1024 * 1024,
            max_response_bytes: 2 * 1024 * 1024 * 1024,
            pool_threads: None,
            pool_queue: 1024,
        }
    }
}

/// The `rollout` section: how rollouts are scheduled and where the policy runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RolloutSection {
    /// Most rollouts (sessions) in flight at once; null means one training step's worth
    /// (`train_dataset.batch_size * gconfig.n_samples`).
    pub max_concurrent_rollouts: Option<u32>,
    /// How many policy versions rollouts may run ahead of training (0 = synchronous).
    pub max_head_offpolicyness: u32,
    /// Dynamic sampling: when the dynamic filter drops groups (every reward of a group equal) or a group is
    /// rejected, the step draws more prompts until it holds `train_dataset.batch_size` informative groups,
    /// launching at most this many times the batch's groups in all. 1 (the default) draws nothing extra: a
    /// step trains on whatever its batch left.
    pub max_oversample_factor: f64,
    /// SGLang-protocol servers (`http://host:port`) that serve the policy; empty serves it in-process.
    /// Their `--api-key`, if any, is read from the environment variable `ARENA_RL_POLICY_API_KEY`.
    pub policy_servers: Vec<String>,
    /// How the policy servers are paused around a weight update (SGLang's `/pause_generation` modes):
    /// `retract` (the default: running generations are kept and their cache recomputed on the new
    /// weights), `in_place` (kept with their cache; the update then skips its cache flush) or `abort`
    /// (running generations end and their turns are resubmitted).
    pub policy_server_pause_mode: String,
    /// Seconds to wait for every policy server's `/health` to answer 200 before the run starts (a server
    /// answers 503 while it loads its model).
    pub policy_server_ready_timeout_seconds: Seconds,
    /// The element type of the weights published to the policy servers after each step: `f32` or `bf16`
    /// (half the bytes every server reads, the dtype SGLang serves in). Null (the default) is the trainer's
    /// own: f32 for burn, the FSDP2 worker's parameter dtype (bf16 under `actor.bf16_autocast`).
    pub weights_dtype: Option<String>,
    /// The most bytes one safetensors file of the published weights holds: larger weights are written as
    /// shards with `model.safetensors.index.json`, as Hugging Face publishes them. Null (the default) is the
    /// trainer's own: one file for burn, 4 GiB shards for the FSDP2 worker. A tensor larger than this is a
    /// shard of its own.
    pub weights_shard_bytes: Option<u64>,
    /// Rollout workers the rows are sharded across.
    pub n_workers: u32,
    /// This process's worker index, in `0..n_workers`.
    pub worker_index: u32,
    /// Directory of the durable rollout journal; empty means `<run dir>/journal`.
    pub journal_dir: String,
    /// Keep the journal segments a checkpoint retires, moved into `<journal dir>/retired/`, instead of
    /// deleting them (false, the default: the journal then holds only what resuming needs, about the steps
    /// since the oldest kept checkpoint). Audit records are in the audit shards either way.
    pub journal_keep_retired: bool,
}

impl Default for RolloutSection {
    fn default() -> Self {
        Self {
            max_concurrent_rollouts: None,
            max_head_offpolicyness: 0,
            max_oversample_factor: 1.0,
            policy_servers: Vec::new(),
            policy_server_pause_mode: "retract".into(),
            policy_server_ready_timeout_seconds: Seconds::of(300.0),
            weights_dtype: None,
            weights_shard_bytes: None,
            n_workers: 1,
            worker_index: 0,
            journal_dir: String::new(),
            journal_keep_retired: false,
        }
    }
}

/// The `model` section: the policy's weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    /// A Hugging Face folder (`config.json`, safetensors, `tokenizer.json`, chat template); the environment
    /// variable `MODEL_PATH` also sets it.
    pub path: String,
    /// The in-process engine: `burn` (the policy) or `fake` (deterministic tokens, for tests and demos).
    pub engine: ModelEngine,
    /// Most sequences the in-process policy decodes together.
    pub max_batch: u32,
    /// Memory the in-process policy's key/value cache may take, in bytes (f32 keys and values: 2 x layers x
    /// key/value heads x head_dim x 4 bytes a token). Requests wait while the batch would outgrow it, the
    /// newest sequences are set aside and resumed unchanged when it is full, and a prompt it cannot hold
    /// is refused. 8 GiB by default.
    pub kv_cache_bytes: u64,
    /// The in-process policy's device: `cpu`, `cuda` (the first GPU) or `cuda:N` (CUDA needs a build with
    /// `--features cuda` and an NVIDIA driver; either missing is one error at start-up).
    pub device: String,
    /// The element type the in-process policy keeps its weight matrices in: `f32`, or `bf16` (CUDA only:
    /// half the memory, products of bf16 operands accumulated in f32, norms and logits in f32). Trained
    /// tokens' recorded log-probabilities then come from bf16 weights, which `train/behave_logprob_drift`
    /// shows.
    pub dtype: String,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            path: String::new(),
            engine: ModelEngine::Burn,
            max_batch: 64,
            kv_cache_bytes: 8 << 30,
            device: "cpu".to_string(),
            dtype: "f32".to_string(),
        }
    }
}

/// The `checkpoint` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointSection {
    /// Save a checkpoint every this many training steps (0 never saves, and a killed run restarts from the
    /// initial weights while keeping its journaled rollouts).
    pub save_every: u64,
    /// How many checkpoints to keep, newest first.
    pub keep_last: u32,
    /// Directory of checkpoints; empty means `<run dir>/checkpoints`.
    pub dir: String,
}

impl Default for CheckpointSection {
    fn default() -> Self {
        Self {
            save_every: 1,
            keep_last: 2,
            dir: String::new(),
        }
    }
}

/// The `metrics` section: where per-step metrics go.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Append one JSON object per step to `metrics.jsonl`.
    pub jsonl: bool,
    /// Write TensorBoard event files (`events.out.tfevents.*`).
    pub tensorboard: bool,
    /// Draw `reward_curve.png` at the end of the run.
    pub reward_curve: bool,
    /// Show progress bars on a terminal.
    pub progress: bool,
    /// Directory of metric files; empty means `<run dir>/metrics`.
    pub dir: String,
    /// Experiment trackers fed each step, the run config and the reward curve: `wandb`, `mlflow` (none by
    /// default). A tracker that fails never stops the run; its records stay in `metrics.jsonl`.
    pub trackers: Vec<super::trackers::Tracker>,
    /// Hand a step to the trackers only once the checkpoint covering it is saved, so that after a kill and
    /// resume each tracker holds exactly `metrics.jsonl`'s values; the trackers then lag up to
    /// `checkpoint.save_every` steps. False (the default) sends each step as it is written, live; a resumed run
    /// then leaves the values a killed attempt sent for the steps it trains again (never a step twice).
    pub trackers_at_checkpoint: bool,
    /// Send the per-row records (`debug/task/<data_id>/...`, one name per dataset row) to the trackers too.
    /// False (the default) keeps them in `metrics.jsonl` only, as for TensorBoard: their names grow with the
    /// dataset (thousands of one-point metrics in a tracker's UI), and a tracking server stores each one.
    pub trackers_per_row: bool,
    /// Weights & Biases settings (used when `trackers` lists `wandb`).
    pub wandb: super::trackers::WandbSection,
    /// MLflow settings (used when `trackers` lists `mlflow`).
    pub mlflow: super::trackers::MlflowSection,
}

impl Default for MetricsSection {
    fn default() -> Self {
        Self {
            jsonl: true,
            tensorboard: true,
            reward_curve: true,
            progress: true,
            dir: String::new(),
            trackers: Vec::new(),
            trackers_at_checkpoint: false,
            trackers_per_row: false,
            wandb: Default::default(),
            mlflow: Default::default(),
        }
    }
}

fn http_url(c: &mut Collector, path: KeyPath, value: &str) {
    let rest = value
        .strip_prefix("http://")
        .or_else(|| value.strip_prefix("https://"));
    if rest.is_none_or(|r| r.trim_matches('/').is_empty() || r.contains(char::is_whitespace)) {
        c.push(path, format!("{value:?} must be an http:// or https:// URL"));
    }
}

impl ProxySection {
    pub(crate) fn validate(&self, path: &KeyPath, c: &mut Collector) {
        if self.host.trim().is_empty() {
            c.push(path.key("host"), "must not be empty");
        }
        if !self.public_url.is_empty() {
            http_url(c, path.key("public_url"), &self.public_url);
        }
        if self.admin_key_env.trim().is_empty() {
            c.push(path.key("admin_key_env"), "must name an environment variable");
        }
        if self.max_sessions == 0 {
            c.push(path.key("max_sessions"), "must be >= 1, got 0");
        }
        self.session_timeout_seconds
            .check(c, path.key("session_timeout_seconds"));
        self.export_wait_timeout_seconds
            .check(c, path.key("export_wait_timeout_seconds"));
        let d = self.turn_discount;
        if !(d.is_finite() && (0.0..=1.0).contains(&d)) {
            c.push(path.key("turn_discount"), format!("must be in [0, 1], got {d}"));
        }
        if self.episode_reward_for_export && self.export_style != ExportStyle::Concat {
            c.push(
                path.key("episode_reward_for_export"),
                "needs proxy.export_style: concat (an individual export keeps each turn's own reward)",
            );
        }
        for (key, seconds) in [
            ("header_read_timeout_seconds", self.header_read_timeout_seconds),
            ("body_read_timeout_seconds", self.body_read_timeout_seconds),
            ("idle_timeout_seconds", self.idle_timeout_seconds),
            ("write_timeout_seconds", self.write_timeout_seconds),
        ] {
            seconds.check(c, path.key(key));
        }
        for (key, value) in [
            ("max_body_bytes", self.max_body_bytes),
            ("max_connections", u64::from(self.max_connections)),
            (
                "max_generations_per_session",
                u64::from(self.max_generations_per_session),
            ),
            (
                "max_response_bytes_per_session",
                self.max_response_bytes_per_session,
            ),
            ("max_response_bytes", self.max_response_bytes),
        ] {
            if value == 0 {
                c.push(path.key(key), "must be >= 1, got 0");
            }
        }
        if self.pool_threads == Some(0) {
            c.push(path.key("pool_threads"), "must be >= 1 or null, got 0");
        }
    }
}

impl RolloutSection {
    pub(crate) fn validate(&self, path: &KeyPath, c: &mut Collector) {
        if self.max_concurrent_rollouts == Some(0) {
            c.push(path.key("max_concurrent_rollouts"), "must be >= 1 or null, got 0");
        }
        let f = self.max_oversample_factor;
        if !(f.is_finite() && (1.0..=64.0).contains(&f)) {
            c.push(
                path.key("max_oversample_factor"),
                format!("must be a number in [1, 64], got {f}"),
            );
        }
        for (i, url) in self.policy_servers.iter().enumerate() {
            http_url(c, path.key("policy_servers").index(i), url);
        }
        self.policy_server_ready_timeout_seconds
            .check(c, path.key("policy_server_ready_timeout_seconds"));
        if let Some(dtype) = &self.weights_dtype
            && !["f32", "bf16"].contains(&dtype.as_str())
        {
            c.push(
                path.key("weights_dtype"),
                format!("must be f32, bf16 or null, got {dtype:?}"),
            );
        }
        if self.weights_shard_bytes == Some(0) {
            c.push(
                path.key("weights_shard_bytes"),
                "must be at least 1 or null, got 0",
            );
        }
        if !["abort", "retract", "in_place"].contains(&self.policy_server_pause_mode.as_str()) {
            c.push(
                path.key("policy_server_pause_mode"),
                format!(
                    "must be one of abort, retract, in_place, got {:?}",
                    self.policy_server_pause_mode
                ),
            );
        }
        if self.n_workers == 0 {
            c.push(path.key("n_workers"), "must be >= 1, got 0");
        } else if self.worker_index >= self.n_workers {
            c.push(
                path.key("worker_index"),
                format!(
                    "must be below rollout.n_workers ({}), got {}",
                    self.n_workers, self.worker_index
                ),
            );
        }
    }
}

impl ModelSection {
    pub(crate) fn validate(&self, path: &KeyPath, c: &mut Collector) {
        if self.max_batch == 0 {
            c.push(path.key("max_batch"), "must be >= 1, got 0");
        }
        if self.kv_cache_bytes < 1 << 20 {
            c.push(
                path.key("kv_cache_bytes"),
                format!("must be >= 1048576 (1 MiB), got {}", self.kv_cache_bytes),
            );
        }
        let cuda = crate::schema::check_device(&self.device, path.key("device"), c);
        match self.dtype.as_str() {
            "f32" => {}
            "bf16" if !cuda => c.push(
                path.key("dtype"),
                format!(
                    "bf16 needs a CUDA device (model.device: cuda), got model.device {:?}",
                    self.device
                ),
            ),
            "bf16" => {}
            other => c.push(
                path.key("dtype"),
                format!("{other:?} is not a dtype: expected f32 or bf16"),
            ),
        }
    }
}

impl CheckpointSection {
    pub(crate) fn validate(&self, path: &KeyPath, c: &mut Collector) {
        if self.keep_last == 0 {
            c.push(path.key("keep_last"), "must be >= 1, got 0");
        }
    }
}
