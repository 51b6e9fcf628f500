//! [`BurnEngine`]: the training engine of `trainer` (burn), in this process, on one device.
//!
//! It turns the loop's [`TrainBatch`] into the trainer's `RlBatch` ([`to_rl_batch`]), takes one GRPO step,
//! and returns the new weights: in memory for the in-process policy, or as a Hugging Face folder under
//! `<run dir>/weights` for `rollout.policy_servers`. Its state in a checkpoint is the trainer's
//! (`Trainer::save_state`: the model as a Hugging Face folder, AdamW moments, step count).

use std::path::{Path, PathBuf};

use stream_config::RunConfig;
use trainer::{SaveDtype, TrainConfig, Trainer, TrainerOptions};

use super::engine::TrainEngine;
use super::{NewWeights, TrainBatch, to_rl_batch};
use crate::error::{Context as _, Error, Result};
use crate::run::settings;

/// Where new weights go after each step.
#[derive(Debug, Clone)]
pub(crate) enum Publish {
    /// Swapped into the in-process policy.
    InMemory,
    /// Written as a Hugging Face folder under this directory for policy servers to load, in `dtype`, in shards
    /// of at most `shard_bytes` with an index (one file when `None`); the newest `keep` folders are kept.
    OnDisk {
        dir: PathBuf,
        keep: usize,
        dtype: SaveDtype,
        shard_bytes: Option<u64>,
    },
}

impl Publish {
    /// Where a run config's new weights go: on disk under `<run dir>/weights` for policy servers, in
    /// `rollout.weights_dtype` (f32 by default) and `rollout.weights_shard_bytes` (one file by default).
    pub(crate) fn of(config: &RunConfig, run_dir: &Path) -> Self {
        if config.rollout.policy_servers.is_empty() {
            Self::InMemory
        } else {
            Self::OnDisk {
                dir: run_dir.join("weights"),
                keep: 2,
                dtype: match config.rollout.weights_dtype.as_deref() {
                    Some("bf16") => SaveDtype::Bf16,
                    _ => SaveDtype::F32,
                },
                shard_bytes: config.rollout.weights_shard_bytes,
            }
        }
    }
}

/// `trainer::Trainer` behind the seam: the default engine.
#[derive(Debug)]
pub struct BurnEngine {
    model_dir: PathBuf,
    config: TrainConfig,
    warmup_steps_proportion: f64,
    options: TrainerOptions,
    memory: trainer::MemoryConfig,
    publish: Publish,
    trainer: Option<Trainer>,
}

impl BurnEngine {
    /// The engine a run config describes: `model.path`, the trainer's settings
    /// ([`settings::train_config`], [`settings::trainer_options`]) and where new weights go.
    /// Nothing is loaded until [`TrainEngine::begin`].
    pub fn from_run_config(config: &RunConfig, run_dir: &Path) -> Result<Self> {
        Ok(Self {
            model_dir: PathBuf::from(&config.model.path),
            config: settings::train_config(config),
            warmup_steps_proportion: config.actor.warmup_steps_proportion,
            options: settings::trainer_options(config)?,
            memory: settings::memory_config(config),
            publish: Publish::of(config, run_dir),
            trainer: None,
        })
    }

    fn trainer(&mut self) -> Result<&mut Trainer> {
        self.trainer.as_mut().ok_or_else(not_begun)
    }

    /// Writes the current weights as a Hugging Face folder for the policy servers, keeping the newest few.
    fn publish_to_disk(
        &self,
        trainer: &Trainer,
        dir: &Path,
        keep: usize,
        dtype: SaveDtype,
        shard_bytes: Option<u64>,
    ) -> Result<PathBuf> {
        let out = dir.join(format!("step-{}", trainer.steps()));
        let tmp = dir.join(format!(".step-{}.tmp", trainer.steps()));
        let _ = std::fs::remove_dir_all(&tmp);
        trainer::save_pretrained(
            &tmp,
            trainer.model_config(),
            &trainer.weights(),
            dtype,
            shard_bytes,
        )
        .with_context(|| format!("cannot save weights to {}", tmp.display()))?;
        trainer::ModelFolder::open(&self.model_dir)
            .and_then(|folder| folder.copy_tokenizer_files(&tmp))
            .with_context(|| format!("cannot copy the tokenizer into {}", tmp.display()))?;
        let _ = std::fs::remove_dir_all(&out);
        std::fs::rename(&tmp, &out)
            .with_context(|| format!("cannot publish weights to {}", out.display()))?;
        keep_newest(dir, keep)?;
        Ok(out)
    }
}

/// Removes all but the newest `keep` `step-N` folders of `dir`.
pub(crate) fn keep_newest(dir: &Path, keep: usize) -> Result<()> {
    let mut old: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot list {}", dir.display()))?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let n = name.strip_prefix("step-")?.parse::<u64>().ok()?;
            Some((n, e.path()))
        })
        .collect();
    old.sort();
    for (_, path) in old.iter().take(old.len().saturating_sub(keep)) {
        let _ = std::fs::remove_dir_all(path);
    }
    Ok(())
}

impl TrainEngine for BurnEngine {
    fn begin(&mut self, total_steps: u64) -> Result<()> {
        let mut config = self.config.clone();
        config.schedule.total_steps = total_steps.max(1);
        config.schedule.warmup_steps = (self.warmup_steps_proportion * total_steps as f64) as u64;
        let mut trainer = Trainer::load(&self.model_dir, config, self.options.clone())
            .with_context(|| format!("loading {} for training", self.model_dir.display()))?;
        trainer
            .set_memory(self.memory)
            .context("actor.recompute_layers")?;
        tracing::info!(
            model = %self.model_dir.display(),
            device = %self.options.device,
            total_steps,
            "GRPO trainer ready"
        );
        self.trainer = Some(trainer);
        Ok(())
    }

    fn grpo_step(&mut self, step: u64, batch: &TrainBatch) -> Result<trainer::StepStats> {
        let rl = to_rl_batch(batch);
        self.trainer()?
            .grpo_step(&rl)
            .with_context(|| format!("GRPO step {step}"))
    }

    fn weights(&mut self) -> Result<NewWeights> {
        let trainer = self.trainer.as_ref().ok_or_else(not_begun)?;
        Ok(match &self.publish {
            Publish::InMemory => NewWeights::InMemory(trainer.weights()),
            Publish::OnDisk {
                dir,
                keep,
                dtype,
                shard_bytes,
            } => NewWeights::OnDisk(self.publish_to_disk(trainer, dir, *keep, *dtype, *shard_bytes)?),
        })
    }

    fn save(&mut self, dir: &Path) -> Result<()> {
        self.trainer()?
            .save_state(dir)
            .with_context(|| format!("saving the trainer into {}", dir.display()))
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        self.trainer()?
            .load_state(dir)
            .with_context(|| format!("restoring the trainer from {}", dir.display()))
    }
}

pub(crate) fn not_begun() -> Error {
    Error::Invalid("the GRPO step was used before the loop began it".into())
}
