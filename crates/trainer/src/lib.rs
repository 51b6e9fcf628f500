//! The policy that arena-rl serves and trains: a Llama-family decoder in burn.
//!
//! What it does: reads Hugging Face checkpoints (`LlamaForCausalLM`, `Qwen2ForCausalLM`,
//! `Qwen3ForCausalLM`; safetensors in f32, f16 or bf16, single or sharded) and writes them back; runs the
//! model on the CPU (burn-ndarray) or, with the `cuda` feature, on an NVIDIA GPU; serves batched,
//! continuously batched generation with a key/value cache, per-sequence sampling and log-probabilities,
//! a policy version and weight swaps between decoding steps; and trains: GRPO steps (decoupled PPO-clip on
//! packed micro-batches, AdamW, schedules) and supervised steps, with atomic checkpoints that resume bit for
//! bit on the CPU.
//!
//! What it does not do: tokenise or render chat templates (it only exposes the files, for `rollout-proxy`),
//! speak HTTP, know about Arena, or compute rewards and group advantages (they arrive computed). It depends on
//! no other workspace crate, and it is the only crate that depends on burn: crates above it use the
//! non-generic [`Policy`] and [`Trainer`] handles.
//!
//! Entry points:
//! - [`Policy`]: `Policy::load(dir, options)`, `submit(GenerationRequest) -> GenerationStream`, `score`,
//!   `version`, `swap_weights`.
//! - [`Trainer`]: `Trainer::load(dir, TrainConfig, options)`, `grpo_step(&RlBatch)`, `sft_step(&SftBatch)`
//!   (both return [`StepStats`]), `weights`, `save_checkpoint`/`resume` with [`Checkpoints`];
//!   `set_memory(MemoryConfig)` for the chunk sizes and layer recompute that keep a step's memory linear in
//!   the sequence length.
//! - [`DeviceKind`]: `cpu`, `cuda`, `cuda:N`, checked (feature, driver, device index) before use.
//! - [`estimate`]: the published shapes of the models users train and a dry-run [`estimate::MemoryEstimate`].
//! - [`ModelConfig`] and [`ModelFolder`]: `config.json` read strictly, written back with
//!   [`ModelConfig::to_hf_json`]; [`save_pretrained`] writes a whole folder.
//! - [`Weights`]: parameters on the host under Hugging Face names, to and from safetensors and models.
//! - [`model::CausalLm`]: the burn module, generic over the backend, for training code in this crate.

pub mod backend;
pub mod checkpoint;
pub mod config;
mod cpu_math;
mod engine;
pub mod error;
pub mod estimate;
mod kernels;
pub mod model;
pub mod optim;
pub mod policy;
pub mod rope;
pub mod sampling;
pub mod train;
pub mod weights;

pub use backend::{DeviceKind, InferenceDtype};
pub use checkpoint::{Checkpoint, Checkpoints, Staged};
pub use config::{Architecture, ModelConfig, RopeScaling};
pub use error::{Error, Result};
pub use optim::{AdamWConfig, LrSchedule, ScheduleKind};
pub use policy::{
    CacheStats, Completion, DEFAULT_KV_CACHE_BYTES, FinishReason, GenerationEvent, GenerationRequest,
    GenerationStream, Logits, Policy, PolicyOptions, SwapReceipt, kv_cache_bytes_per_token,
};
pub use sampling::SamplingParams;
pub use train::{
    AdvNorm, KlEstimator, LossAggregation, MemoryConfig, NormLevel, PpoConfig, RlBatch, SftBatch,
    SftSequence, StepStats, TrainConfig, TrainSequence, Trainer, TrainerOptions, normalized_advantages,
    token_weights,
};
pub use weights::{HostTensor, ModelFolder, SaveDtype, Weights, save_pretrained};
