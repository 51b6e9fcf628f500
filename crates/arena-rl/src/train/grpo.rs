//! [`GrpoStep`]: the loop's training step backed by `trainer::Trainer`.
//!
//! It turns the loop's [`TrainBatch`] into the trainer's `RlBatch` (masks to booleans, one advantage per
//! trajectory, the groups' sizes for group-level `actor.adv_norm`), takes one GRPO step, and returns the new
//! weights: in memory for the in-process policy, or as a Hugging Face folder under `<run dir>/weights` for
//! `rollout.policy_servers`. Its state in a checkpoint is the trainer's (`Trainer::save_state`: the model as
//! a Hugging Face folder, AdamW moments, step count); the loop's own state rides in the checkpoint's caller
//! blob.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow};
use stream_config::RunConfig;
use trainer::{
    AdamWConfig, AdvNorm, DeviceKind, KlEstimator, LossAggregation, LrSchedule, NormLevel, PpoConfig,
    RlBatch, SaveDtype, ScheduleKind, TrainConfig, TrainSequence, Trainer, TrainerOptions,
};

use super::{NewWeights, StepOutput, TrainBatch, TrainStep};

/// Where new weights go after each step.
#[derive(Debug, Clone)]
enum Publish {
    /// Swapped into the in-process policy.
    InMemory,
    /// Written as a Hugging Face folder under this directory for policy servers to load; the newest `keep`
    /// folders are kept.
    OnDisk { dir: PathBuf, keep: usize },
}

/// The GRPO training step of `arena-rl train`.
#[derive(Debug)]
pub struct GrpoStep {
    model_dir: PathBuf,
    config: TrainConfig,
    warmup_steps_proportion: f64,
    options: TrainerOptions,
    publish: Publish,
    trainer: Option<Trainer>,
    /// Steps in a row that had no trainable group.
    skipped_in_a_row: u64,
}

/// Whether the `n`th skipped step in a row deserves a warning: at 10, 100, 1000... in a row. A single
/// skipped step is normal in GRPO (every group of a batch got uniform rewards); a long run of them means
/// the rewards are stuck.
fn warn_after_skips(n: u64) -> bool {
    n >= 10 && 10u64.pow(n.ilog10()) == n
}

fn level(l: stream_config::NormLevel) -> NormLevel {
    match l {
        stream_config::NormLevel::Batch => NormLevel::Batch,
        stream_config::NormLevel::Group => NormLevel::Group,
    }
}

impl GrpoStep {
    /// The step a run config describes: `model.path`, the `actor` section's objective, optimiser, schedule,
    /// micro-batching and device, and `gconfig.temperature` for the log-probabilities.
    /// Nothing is loaded until [`TrainStep::begin`].
    pub fn from_run_config(config: &RunConfig, run_dir: &Path) -> Result<Self> {
        let a = &config.actor;
        let device: DeviceKind = a
            .device
            .parse()
            .map_err(|e| anyhow!("actor.device {:?}: {e}", a.device))?;
        let temperature = if config.gconfig.temperature > 0.0 {
            config.gconfig.temperature
        } else {
            // Greedy sampling reports the untempered log-probabilities.
            1.0
        };
        let train = TrainConfig {
            schedule: LrSchedule {
                lr: a.lr,
                kind: match a.lr_scheduler_type {
                    stream_config::LrSchedulerType::Constant => ScheduleKind::Constant,
                    stream_config::LrSchedulerType::Linear => ScheduleKind::Linear,
                    stream_config::LrSchedulerType::Cosine => ScheduleKind::Cosine,
                },
                warmup_steps: 0,
                total_steps: 1,
                min_lr_ratio: a.min_lr_ratio,
            },
            adamw: AdamWConfig {
                beta1: a.beta1,
                beta2: a.beta2,
                eps: a.adam_eps,
                weight_decay: a.weight_decay,
            },
            gradient_clipping: a.gradient_clipping,
            max_tokens_per_mb: usize::try_from(a.max_tokens_per_mb).unwrap_or(usize::MAX),
            aggregation: match a.loss_agg_mode {
                stream_config::LossAggMode::TokenMean => LossAggregation::TokenMean,
                stream_config::LossAggMode::SeqMeanTokenMean => LossAggregation::SeqMeanTokenMean,
            },
            ppo: PpoConfig {
                eps_clip: a.eps_clip,
                eps_clip_higher: a.eps_clip_higher,
                c_clip: a.c_clip,
                use_decoupled_loss: a.use_decoupled_loss,
                recompute_logprob: a.recompute_logprob,
                behav_imp_weight_cap: a.behav_imp_weight_cap,
                kl_ctl: a.kl_ctl,
                kl_estimator: match a.kl_estimator {
                    stream_config::KlEstimator::K1 => KlEstimator::K1,
                    stream_config::KlEstimator::K2 => KlEstimator::K2,
                    stream_config::KlEstimator::K3 => KlEstimator::K3,
                },
                entropy_coeff: a.entropy_coeff,
                adv_norm: a.adv_norm.as_ref().map(|n| AdvNorm {
                    mean_level: n.mean_level.map(level),
                    mean_leave1out: n.mean_leave1out,
                    std_level: n.std_level.map(level),
                    std_unbiased: n.std_unbiased,
                    eps: n.eps,
                    group_size: n.group_size as usize,
                }),
                temperature,
            },
        };
        let publish = if config.rollout.policy_servers.is_empty() {
            Publish::InMemory
        } else {
            Publish::OnDisk {
                dir: run_dir.join("weights"),
                keep: 2,
            }
        };
        Ok(Self {
            model_dir: PathBuf::from(&config.model.path),
            config: train,
            warmup_steps_proportion: a.warmup_steps_proportion,
            options: TrainerOptions {
                device,
                bf16_autocast: a.bf16_autocast,
            },
            publish,
            trainer: None,
            skipped_in_a_row: 0,
        })
    }

    fn trainer(&mut self) -> Result<&mut Trainer> {
        self.trainer
            .as_mut()
            .ok_or_else(|| anyhow!("the GRPO step was used before the loop began it"))
    }

    /// Writes the current weights as a Hugging Face folder for the policy servers, keeping the newest few.
    fn publish_to_disk(&self, trainer: &Trainer, dir: &Path, keep: usize) -> Result<PathBuf> {
        let out = dir.join(format!("step-{}", trainer.steps()));
        let tmp = dir.join(format!(".step-{}.tmp", trainer.steps()));
        let _ = std::fs::remove_dir_all(&tmp);
        trainer::save_pretrained(
            &tmp,
            trainer.model_config(),
            &trainer.weights(),
            SaveDtype::F32,
            None,
        )?;
        trainer::ModelFolder::open(&self.model_dir)?.copy_tokenizer_files(&tmp)?;
        let _ = std::fs::remove_dir_all(&out);
        std::fs::rename(&tmp, &out)
            .with_context(|| format!("cannot publish weights to {}", out.display()))?;
        let mut old: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)?
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
        Ok(out)
    }

    fn weights_out(&self) -> Result<NewWeights> {
        let trainer = self
            .trainer
            .as_ref()
            .ok_or_else(|| anyhow!("the GRPO step was used before the loop began it"))?;
        Ok(match &self.publish {
            Publish::InMemory => NewWeights::InMemory(trainer.weights()),
            Publish::OnDisk { dir, keep } => NewWeights::OnDisk(self.publish_to_disk(trainer, dir, *keep)?),
        })
    }
}

/// The trainer's batch for the loop's: one sequence per trajectory.
pub fn to_rl_batch(batch: &TrainBatch) -> RlBatch {
    RlBatch {
        sequences: batch
            .samples
            .iter()
            .map(|s| {
                let mut loss_mask: Vec<bool> = s.loss_mask.iter().map(|&m| m != 0).collect();
                // The first token has no context to be predicted from.
                if let Some(first) = loss_mask.first_mut() {
                    *first = false;
                }
                TrainSequence {
                    tokens: s.token_ids.clone(),
                    loss_mask,
                    logprobs: s.logprobs.clone(),
                    versions: s.versions.clone(),
                    advantage: s.advantage as f32,
                }
            })
            .collect(),
        group_sizes: batch.group_sizes.iter().copied().filter(|&n| n > 0).collect(),
        policy_version: batch.policy_version,
    }
}

impl TrainStep for GrpoStep {
    fn begin(&mut self, total_steps: u64) -> Result<()> {
        let mut config = self.config.clone();
        config.schedule.total_steps = total_steps.max(1);
        config.schedule.warmup_steps = (self.warmup_steps_proportion * total_steps as f64) as u64;
        let trainer = Trainer::load(&self.model_dir, config, self.options.clone())
            .with_context(|| format!("loading {} for training", self.model_dir.display()))?;
        tracing::info!(
            model = %self.model_dir.display(),
            device = %self.options.device,
            total_steps,
            "GRPO trainer ready"
        );
        self.trainer = Some(trainer);
        Ok(())
    }

    fn train(&mut self, step: u64, batch: &TrainBatch) -> Result<StepOutput> {
        if batch.samples.iter().all(|s| !s.loss_mask.iter().any(|&m| m != 0)) {
            self.skipped_in_a_row += 1;
            let n = self.skipped_in_a_row;
            if warn_after_skips(n) {
                tracing::warn!(
                    step,
                    "no trainable group for {n} steps in a row: every group was rejected (see the rejected \
                     counts in the metrics, e.g. all_wrong or all_correct); check the rewards"
                );
            } else {
                tracing::debug!(
                    step,
                    "no trainable group in this batch: the weights stay as they are"
                );
            }
            return Ok(StepOutput {
                metrics: vec![("train/skipped".to_string(), 1.0)],
                weights: NewWeights::Unchanged,
            });
        }
        self.skipped_in_a_row = 0;
        let rl = to_rl_batch(batch);
        let stats = self
            .trainer()?
            .grpo_step(&rl)
            .with_context(|| format!("GRPO step {step}"))?;
        tracing::debug!(step, loss = stats.loss, grad_norm = stats.grad_norm, "GRPO step");
        Ok(StepOutput {
            metrics: stats.records("train/"),
            weights: self.weights_out()?,
        })
    }

    fn save(&mut self, dir: &Path) -> Result<()> {
        self.trainer()?.save_state(dir)?;
        Ok(())
    }

    fn load(&mut self, dir: &Path) -> Result<NewWeights> {
        let trainer = self.trainer()?;
        trainer
            .load_state(dir)
            .with_context(|| format!("restoring the trainer from {}", dir.display()))?;
        self.weights_out()
    }
}

#[cfg(test)]
mod tests {
    use super::warn_after_skips;

    #[test]
    fn skipped_steps_warn_at_powers_of_ten_only() {
        let warned: Vec<u64> = (1..=2000).filter(|&n| warn_after_skips(n)).collect();
        assert_eq!(warned, [10, 100, 1000]);
    }
}
