//! The wire types of `arena-rl-trainer/1`, as `docs/trainer-protocol.md` defines them.
//!
//! Requests are written exactly; answers are read leniently (fields this version does not know are
//! ignored), except for the protocol string, which every answer carries and the client checks.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The protocol this crate speaks; every request and answer carries it.
pub const PROTOCOL: &str = "arena-rl-trainer/1";

/// What `GET /v1/hello` answers.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Hello {
    pub protocol: String,
    /// torch's version on rank 0.
    pub torch: String,
    /// transformers' version on rank 0.
    pub transformers: String,
    /// Ranks in the job.
    pub world_size: u32,
    /// The device mesh.
    pub mesh: Mesh,
    /// `cuda` or `cpu`.
    pub device: String,
    /// The model, once initialised.
    pub model: Option<ModelInfo>,
    /// Optimiser steps completed.
    pub step: u64,
    /// `new`, `ready` or `failed`.
    pub state: String,
}

/// The worker's device mesh.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Mesh {
    /// Data-parallel (sharding) ranks.
    pub dp: u32,
}

/// The model the worker trains.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// `config.json`'s first architecture, e.g. `Qwen3ForCausalLM`.
    pub architecture: String,
    /// SHA-256 (hex) of the model folder's `config.json` bytes.
    pub config_sha256: String,
    /// Parameter count.
    pub parameters: u64,
}

/// A parameter or reduction dtype.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dtype {
    Bf16,
    F32,
}

/// `POST /v1/init`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct InitRequest {
    pub protocol: &'static str,
    /// The Hugging Face folder to train.
    pub model_path: PathBuf,
    /// `trainer::TrainConfig`'s serde form (the caller serialises it; this crate does not depend on
    /// `trainer`).
    pub train: serde_json::Value,
    /// Optimiser steps in the run (the schedule's length).
    pub total_steps: u64,
    pub param_dtype: Dtype,
    pub reduce_dtype: Dtype,
    pub activation_checkpointing: bool,
    /// Tokens per chunk of the log-probability and entropy computation.
    pub logprob_chunk_tokens: u64,
    pub seed: u64,
}

/// `init`'s result.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct InitResult {
    pub model: ModelInfo,
    pub step: u64,
}

/// What a step trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StepKind {
    /// GRPO / decoupled PPO.
    Grpo,
    /// Supervised cross-entropy.
    Sft,
}

impl StepKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Grpo => "grpo",
            Self::Sft => "sft",
        }
    }
}

/// `POST /v1/step`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct StepRequest {
    pub protocol: &'static str,
    /// Optimiser steps completed before this one.
    pub step: u64,
    pub kind: StepKind,
    /// The batch file, inside the run folder.
    pub batch: PathBuf,
    /// SHA-256 (hex) of the batch file.
    pub sha256: String,
    /// Where rank 0 writes the summed gradients before clipping (f32, Hugging Face names), for parity tests.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dump_gradients: Option<PathBuf>,
}

/// Minimum, mean and maximum of a per-token quantity.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Range {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// A step's statistics: `trainer::StepStats`' fields by their Rust names (the step count is in
/// [`StepResult::step`]).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub loss: f64,
    pub lr: f64,
    pub grad_norm: f64,
    pub sequences: u64,
    pub tokens: u64,
    pub forward_tokens: u64,
    pub micro_batches: u64,
    pub entropy: f64,
    #[serde(default)]
    pub clip_fraction: f64,
    #[serde(default)]
    pub dual_clip_fraction: f64,
    #[serde(default)]
    pub approx_kl: f64,
    #[serde(default)]
    pub ref_kl: Option<f64>,
    #[serde(default)]
    pub importance_weight: Option<Range>,
    #[serde(default)]
    pub behave_imp_weight: Option<Range>,
    #[serde(default)]
    pub behave_dropped_fraction: f64,
    #[serde(default)]
    pub advantage: Option<Range>,
    #[serde(default)]
    pub staleness: Option<Range>,
    #[serde(default)]
    pub behave_logprob_drift: Option<Range>,
    #[serde(default)]
    pub behave_logprob_drift_truncated: Option<Range>,
    #[serde(default)]
    pub seconds: f64,
}

/// `step`'s result.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct StepResult {
    /// Optimiser steps completed, this one included.
    pub step: u64,
    pub stats: Stats,
}

/// `POST /v1/publish`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PublishRequest {
    pub protocol: &'static str,
    /// The folder to write, inside the run folder.
    pub path: PathBuf,
    pub dtype: Dtype,
    /// The most bytes one safetensors file holds; absent, the worker's 4 GiB.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_shard_bytes: Option<u64>,
}

/// `publish`'s result.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct PublishResult {
    pub path: PathBuf,
    /// The files written (a count or their names, as the worker reports them).
    #[serde(default)]
    pub files: serde_json::Value,
    #[serde(default)]
    pub bytes: u64,
    #[serde(default)]
    pub seconds: f64,
}

/// `POST /v1/save` and `POST /v1/load`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct PathRequest {
    pub protocol: &'static str,
    pub path: PathBuf,
}

/// `save`'s result.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct SaveResult {
    pub path: PathBuf,
    #[serde(default)]
    pub seconds: f64,
}

/// `load`'s result.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct LoadResult {
    /// Optimiser steps completed in the loaded state.
    pub step: u64,
}

/// The `202` answer of a long call.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Accepted {
    pub protocol: String,
    pub op: String,
}

/// Where an operation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OpState {
    Running,
    Done,
    Failed,
}

/// How far a running operation got.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Progress {
    #[serde(default)]
    pub phase: String,
    #[serde(default)]
    pub done: u64,
    #[serde(default)]
    pub total: u64,
}

/// `GET /v1/ops/<id>`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Op {
    pub protocol: String,
    pub op: String,
    pub kind: String,
    pub state: OpState,
    #[serde(default)]
    pub progress: Option<Progress>,
    #[serde(default)]
    pub result: Option<serde_json::Value>,
    #[serde(default)]
    pub error: Option<RemoteError>,
}

/// `GET /v1/health`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Health {
    pub protocol: String,
    pub ok: bool,
    pub world_size: u32,
    pub state: String,
    #[serde(default)]
    pub op: Option<String>,
}

/// The kinds of a typed error.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    Batch,
    Config,
    Oom,
    RankLost,
    Protocol,
    Busy,
    Auth,
    Path,
    Internal,
    /// A kind this version does not know.
    #[serde(other)]
    Unknown,
}

impl std::fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Batch => "bad batch",
            Self::Config => "bad config",
            Self::Oom => "out of memory",
            Self::RankLost => "a rank was lost",
            Self::Protocol => "protocol error",
            Self::Busy => "busy",
            Self::Auth => "not authorised",
            Self::Path => "path refused",
            Self::Internal => "internal error",
            Self::Unknown => "error",
        })
    }
}

/// A typed error, from an HTTP answer or a failed operation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RemoteError {
    pub kind: ErrorKind,
    pub message: String,
    #[serde(default)]
    pub rank: Option<u32>,
    #[serde(default)]
    pub step: Option<u64>,
}

impl std::fmt::Display for RemoteError {
    /// One line: `fsdp2 trainer, rank 1, step 12: out of memory: ...`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fsdp2 trainer")?;
        if let Some(rank) = self.rank {
            write!(f, ", rank {rank}")?;
        }
        if let Some(step) = self.step {
            write!(f, ", step {step}")?;
        }
        let message = self.message.lines().next().unwrap_or_default();
        write!(f, ": {}: {message}", self.kind)
    }
}
