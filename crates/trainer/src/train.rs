//! Training: [`Trainer`], the handle crates above use (not generic over the burn backend), with GRPO and
//! supervised steps, its state on disk, and checkpoints.
//!
//! A step packs its sequences into micro-batches of at most `max_tokens_per_mb` tokens (`pack`), runs each
//! forward and backward (`forward`, `loss`), sums the gradients into one store, clips their global norm and
//! takes one AdamW step at the schedule's rate (`learner`, [`crate::optim`]). Statistics come back as a
//! [`StepStats`].
//!
//! A micro-batch's memory grows linearly with its tokens: the output projection runs in chunks of rows and
//! attention in blocks of query rows, each keeping one log-sum-exp per row for a backward pass that
//! recomputes the rest (`chunked`, and the CPU kernels in `crate::kernels`); [`MemoryConfig`] sets the sizes and, on the CPU, turns on layer
//! recompute, which keeps only each decoder layer's input.
//!
//! The state a step depends on is the weights, the AdamW moments and the step count; the update draws no
//! random numbers (no dropout, a deterministic packing), so that state restored from disk continues a run
//! bit for bit on the CPU. Callers keep their own generators' state in the checkpoint's opaque blob.

pub mod batch;
pub(crate) mod chunked;
pub mod config;
pub(crate) mod forward;
pub(crate) mod learner;
pub(crate) mod loss;
pub(crate) mod pack;
pub mod stats;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

pub use batch::{RlBatch, SftBatch, SftSequence, TrainSequence, normalized_advantages};
pub use config::{AdvNorm, KlEstimator, LossAggregation, MemoryConfig, NormLevel, PpoConfig, TrainConfig};
pub use loss::token_weights;
pub use stats::{Range, StepStats};

use crate::backend::DeviceKind;
use crate::checkpoint::{Checkpoint, Checkpoints};
use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::weights::{HostTensor, ModelFolder, SaveDtype, Weights, save_pretrained};
use learner::{AnyLearner, Learner};

/// The optimiser moments inside a saved state.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// The step count and settings inside a saved state.
pub const STATE_FILE: &str = "trainer_state.json";

/// Where and how a [`Trainer`] computes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TrainerOptions {
    /// The device (CUDA needs the `cuda` feature).
    pub device: DeviceKind,
    /// Matrix products in bf16 with f32 master weights and f32 everything else (CUDA only).
    pub bf16_autocast: bool,
}

#[derive(Serialize, Deserialize)]
struct SavedState {
    format: u32,
    steps: u64,
    config: TrainConfig,
}

/// A policy being trained: the model, its optimiser state and (with a KL penalty) the frozen reference.
pub struct Trainer {
    learner: Box<dyn AnyLearner>,
    model_config: ModelConfig,
    folder: Option<ModelFolder>,
}

impl std::fmt::Debug for Trainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trainer")
            .field("architecture", &self.model_config.architecture)
            .field("steps", &self.learner.steps())
            .finish_non_exhaustive()
    }
}

impl Trainer {
    /// Starts training `weights` of a `model_config` model. With `kl_ctl > 0` they are also the reference.
    pub fn new(
        model_config: ModelConfig,
        weights: &Weights,
        config: TrainConfig,
        options: TrainerOptions,
    ) -> Result<Self> {
        options.device.check()?;
        let learner: Box<dyn AnyLearner> = match options.device {
            DeviceKind::Cpu => {
                if options.bf16_autocast {
                    return Err(Error::Device(
                        "cpu".to_string(),
                        "bf16 autocast needs a CUDA device".to_string(),
                    ));
                }
                Box::new(Learner::<crate::backend::CpuAutodiff>::new(
                    &model_config,
                    weights,
                    config,
                    &Default::default(),
                    false,
                )?)
            }
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda(i) => Box::new(Learner::<crate::backend::CudaAutodiff>::new(
                &model_config,
                weights,
                config,
                &burn_cuda::CudaDevice::new(i),
                options.bf16_autocast,
            )?),
            #[cfg(not(feature = "cuda"))]
            DeviceKind::Cuda(_) => {
                return Err(Error::Device(
                    options.device.to_string(),
                    crate::backend::NO_CUDA.to_string(),
                ));
            }
        };
        Ok(Self {
            learner,
            model_config,
            folder: None,
        })
    }

    /// Starts training the Hugging Face folder `dir`; its tokenizer files travel into every saved state.
    pub fn load(dir: &Path, config: TrainConfig, options: TrainerOptions) -> Result<Self> {
        let folder = ModelFolder::open(dir)?;
        let weights = Weights::load_dir(dir)?;
        let mut trainer = Self::new(folder.config.clone(), &weights, config, options)?;
        trainer.folder = Some(folder);
        Ok(trainer)
    }

    /// The model's config.
    pub fn model_config(&self) -> &ModelConfig {
        &self.model_config
    }

    /// The training settings.
    pub fn config(&self) -> &TrainConfig {
        self.learner.config()
    }

    /// Replaces the training settings (moments and step count stay; turning the KL penalty on needs a
    /// trainer built with it on).
    pub fn set_config(&mut self, config: TrainConfig) -> Result<()> {
        self.learner.set_config(config)
    }

    /// How steps trade memory for time (chunk sizes, layer recompute).
    pub fn memory(&self) -> MemoryConfig {
        self.learner.memory()
    }

    /// Sets how steps trade memory for time; results agree with any setting to rounding.
    /// Layer recompute is refused on devices that do not implement it.
    pub fn set_memory(&mut self, memory: MemoryConfig) -> Result<()> {
        self.learner.set_memory(memory)
    }

    /// Optimiser steps taken so far (restored ones included).
    pub fn steps(&self) -> u64 {
        self.learner.steps()
    }

    /// One GRPO step: the decoupled PPO-clip loss of the batch, one optimiser update.
    pub fn grpo_step(&mut self, batch: &RlBatch) -> Result<StepStats> {
        self.learner.grpo_step(batch)
    }

    /// One supervised step: token-level cross-entropy on the masked tokens, one optimiser update.
    pub fn sft_step(&mut self, batch: &SftBatch) -> Result<StepStats> {
        self.learner.sft_step(batch)
    }

    /// The current weights on the host (for a weight swap or a save).
    pub fn weights(&self) -> Weights {
        self.learner.weights()
    }

    /// The log-probability of every token of each sequence given its prefix under the current weights, at
    /// `temperature` (0 for the first token).
    pub fn logprobs(&self, sequences: &[Vec<u32>], temperature: f64) -> Result<Vec<Vec<f32>>> {
        self.learner.logprobs(sequences, temperature)
    }

    /// Writes the training state into `dir`: the model as a Hugging Face folder in f32 (`config.json`,
    /// `generation_config.json`, `model.safetensors`, and the source folder's tokenizer files), the AdamW
    /// moments (`optimizer.safetensors`) and the step count and settings (`trainer_state.json`).
    pub fn save_state(&self, dir: &Path) -> Result<()> {
        save_pretrained(dir, &self.model_config, &self.weights(), SaveDtype::F32, None)?;
        if let Some(folder) = &self.folder {
            folder.copy_tokenizer_files(dir)?;
        }
        write_tensors(&dir.join(OPTIMIZER_FILE), &self.learner.optimizer_host())?;
        let state = SavedState {
            format: 1,
            steps: self.steps(),
            config: self.config().clone(),
        };
        let path = dir.join(STATE_FILE);
        let text = serde_json::to_vec_pretty(&state).expect("the state always serialises");
        std::fs::write(&path, text).map_err(|e| Error::io("writing", &path, e))
    }

    /// Restores the state [`Trainer::save_state`] wrote in `dir`: weights, moments and step count (the
    /// settings stay those of this trainer; the reference policy stays the weights it was built with).
    pub fn load_state(&mut self, dir: &Path) -> Result<()> {
        let saved_config = ModelConfig::from_file(&dir.join("config.json"))?;
        if saved_config.to_hf_json() != self.model_config.to_hf_json() {
            return Err(Error::checkpoint(
                dir,
                "its config.json describes another model than the one being trained",
            ));
        }
        let state_path = dir.join(STATE_FILE);
        let text = std::fs::read(&state_path).map_err(|e| Error::io("reading", &state_path, e))?;
        let state: SavedState = serde_json::from_slice(&text).map_err(|source| Error::Json {
            path: state_path.clone(),
            source,
        })?;
        if state.format != 1 {
            return Err(Error::checkpoint(
                dir,
                format!("trainer state format {} is not supported", state.format),
            ));
        }
        let weights = Weights::load_dir(dir)?;
        let moments_file = Weights::load_file(&dir.join(OPTIMIZER_FILE))?;
        let moments: BTreeMap<String, HostTensor> = moments_file
            .names()
            .filter_map(|n| moments_file.get(n).map(|t| (n.to_string(), t.clone())))
            .collect();
        self.learner.restore(&weights, &moments, state.steps)
    }

    /// Saves a checkpoint of the current step under `checkpoints` with the caller's opaque state, keeping
    /// the newest `keep_last` (0 keeps all).
    pub fn save_checkpoint(
        &self,
        checkpoints: &Checkpoints,
        caller_state: &[u8],
        keep_last: usize,
    ) -> Result<Checkpoint> {
        checkpoints.save(self.steps(), caller_state, keep_last, |dir| self.save_state(dir))
    }

    /// Restores a checkpoint; returns the caller's opaque state.
    pub fn resume(&mut self, checkpoint: &Checkpoint) -> Result<Vec<u8>> {
        self.load_state(&checkpoint.dir)?;
        checkpoint.caller_state()
    }
}

/// Writes named f32 tensors as one safetensors file.
fn write_tensors(path: &Path, tensors: &BTreeMap<String, HostTensor>) -> Result<()> {
    let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(name, t)| {
            let bytes = t.data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (name.clone(), t.shape.clone(), bytes)
        })
        .collect();
    let views = encoded
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| Error::weights(path, format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    safetensors::serialize_to_file(views, None, path)
        .map_err(|e| Error::weights(path, format!("writing: {e}")))
}
