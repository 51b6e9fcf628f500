//! [`GrpoStep`]: the loop's training step, over a [`TrainEngine`] (burn by default).
//!
//! What does not depend on the engine lives here, once: a batch with no trained token is skipped (with a
//! warning when that goes on), the share of tokens sampled off `gconfig.temperature` is noted and
//! reported, and the engine's `trainer::StepStats` become the step's `train/...` metrics, so the names are
//! the same whichever engine trained. The engine takes the step and hands out the new weights: in memory
//! for the in-process policy, or as a Hugging Face folder for policy servers (and always a folder from the
//! FSDP2 engine, which trains in other processes). Its state in a checkpoint is the engine's; the loop's
//! own state rides in the checkpoint's caller blob.

use std::path::Path;

use stream_config::{Env, RunConfig, TrainerBackend};
use trainer::{RlBatch, TrainSequence};

use super::burn::BurnEngine;
use super::engine::TrainEngine;
use super::fsdp2::Fsdp2Engine;
use super::{NewWeights, StepOutput, TrainBatch, TrainStep};
use crate::error::Result;
use crate::run::settings;

/// The GRPO training step of `arena-rl train`.
pub struct GrpoStep {
    engine: Box<dyn TrainEngine>,
    /// `gconfig.temperature` as the trainer scores tokens that record none.
    temperature: f64,
    /// Steps in a row that had no trainable group.
    skipped_in_a_row: u64,
    /// The note that tokens were sampled off `gconfig.temperature` was given.
    warned_temperature: bool,
}

impl std::fmt::Debug for GrpoStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrpoStep")
            .field("temperature", &self.temperature)
            .field("skipped_in_a_row", &self.skipped_in_a_row)
            .finish_non_exhaustive()
    }
}

/// Whether the `n`th skipped step in a row deserves a warning: at 10, 100, 1000... in a row. A single
/// skipped step is normal in GRPO (every group of a batch got uniform rewards); a long run of them means
/// the rewards are stuck.
fn warn_after_skips(n: u64) -> bool {
    n >= 10 && 10u64.pow(n.ilog10()) == n
}

impl GrpoStep {
    /// The step a run config describes: the engine `actor.backend` names, with `model.path` and the
    /// trainer's settings ([`settings::train_config`], [`settings::trainer_options`]), and where new weights
    /// go. Nothing is loaded until [`TrainStep::begin`].
    pub fn from_run_config(config: &RunConfig, run_dir: &Path) -> Result<Self> {
        let engine: Box<dyn TrainEngine> = match config.actor.backend {
            TrainerBackend::Burn => Box::new(BurnEngine::from_run_config(config, run_dir)?),
            TrainerBackend::Fsdp2 => Box::new(Fsdp2Engine::from_run_config(
                config,
                run_dir,
                &Env::from_process(),
            )?),
        };
        Ok(Self::with_engine(
            engine,
            settings::train_config(config).ppo.temperature,
        ))
    }

    /// A step over `engine`; `temperature` is the one tokens that record none are scored at.
    pub fn with_engine(engine: Box<dyn TrainEngine>, temperature: f64) -> Self {
        Self {
            engine,
            temperature,
            skipped_in_a_row: 0,
            warned_temperature: false,
        }
    }
}

/// The share of trained tokens sampled at another temperature than `temperature` (greedy tokens count as
/// temperature 1, as they are recorded and trained); 0 for records that carry no temperatures.
///
/// The trainer scores each token at the temperature it records, so these tokens are trained right; the
/// share says how much of the run a harness sampled at its own temperature instead of the run's.
pub(crate) fn off_temperature_share(batch: &TrainBatch, temperature: f64) -> f64 {
    let (mut trained, mut off) = (0u64, 0u64);
    for s in &batch.samples {
        for (i, &m) in s.loss_mask.iter().enumerate().skip(1) {
            if m == 0 {
                continue;
            }
            trained += 1;
            let scored_at = |t: f32| if t > 0.0 { f64::from(t) } else { 1.0 };
            if s.temperatures
                .get(i)
                .is_some_and(|&t| (scored_at(t) - temperature).abs() > 1e-6)
            {
                off += 1;
            }
        }
    }
    if trained == 0 {
        0.0
    } else {
        off as f64 / trained as f64
    }
}

/// The trainer's batch for the loop's: one sequence per trajectory, each token scored at the temperature
/// the proxy exported for it (records without temperatures at `gconfig.temperature`).
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
                    truncated: s.truncated.iter().map(|&t| t != 0).collect(),
                    temperatures: s.temperatures.clone(),
                }
            })
            .collect(),
        group_sizes: batch.group_sizes.iter().copied().filter(|&n| n > 0).collect(),
        policy_version: batch.policy_version,
    }
}

impl TrainStep for GrpoStep {
    fn begin(&mut self, total_steps: u64) -> Result<()> {
        self.engine.begin(total_steps)
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
        let off = off_temperature_share(batch, self.temperature);
        if off > 0.0 && !self.warned_temperature {
            self.warned_temperature = true;
            tracing::info!(
                step,
                share = off,
                temperature = self.temperature,
                "some trained tokens were sampled at another temperature than gconfig.temperature (a harness \
                 sent its own); the trainer scores each token at the temperature it was sampled at, so the \
                 update is right, but the run does not sample at gconfig.temperature: set \
                 gconfig.harness_sampling: override if it should (train/off_temperature_tokens is the share \
                 per step)"
            );
        }
        let stats = self.engine.grpo_step(step, batch)?;
        tracing::debug!(step, loss = stats.loss, grad_norm = stats.grad_norm, "GRPO step");
        let mut metrics = stats.records("train/");
        metrics.push(("train/off_temperature_tokens".to_string(), off));
        Ok(StepOutput {
            metrics,
            weights: self.engine.weights()?,
        })
    }

    fn save(&mut self, dir: &Path) -> Result<()> {
        self.engine.save(dir)
    }

    fn load(&mut self, dir: &Path) -> Result<NewWeights> {
        self.engine.load(dir)?;
        self.engine.weights()
    }
}

#[cfg(test)]
mod tests {
    use super::{TrainBatch, off_temperature_share, to_rl_batch, warn_after_skips};
    use crate::train::TrainSample;

    #[test]
    fn tokens_sampled_at_another_temperature_are_counted_and_passed_on() {
        let sample = |temperatures: Vec<f32>| TrainSample {
            key: crate::journal::SampleKey {
                eval: false,
                step: 0,
                group: 0,
                sample: 0,
            },
            token_ids: vec![1, 2, 3, 4, 5],
            loss_mask: vec![0, 0, 1, 1, 1],
            logprobs: vec![0.0; 5],
            versions: vec![-1, -1, 0, 0, 0],
            temperatures,
            truncated: Vec::new(),
            advantage: 1.0,
            raw_reward: 1.0,
        };
        let batch = TrainBatch {
            samples: vec![sample(vec![1.0, 1.0, 0.7, 0.7, 1.0]), sample(Vec::new())],
            ..TrainBatch::default()
        };
        assert!((off_temperature_share(&batch, 1.0) - 2.0 / 6.0).abs() < 1e-12);
        assert!((off_temperature_share(&batch, 0.7) - 1.0 / 6.0).abs() < 1e-12);
        // The trainer gets each token's temperature, aligned with its tokens; none stays none.
        let rl = to_rl_batch(&batch);
        assert_eq!(rl.sequences[0].temperatures, [1.0, 1.0, 0.7, 0.7, 1.0]);
        assert_eq!(rl.sequences[0].temperatures.len(), rl.sequences[0].tokens.len());
        assert!(rl.sequences[1].temperatures.is_empty());
    }

    #[test]
    fn skipped_steps_warn_at_powers_of_ten_only() {
        let warned: Vec<u64> = (1..=2000).filter(|&n| warn_after_skips(n)).collect();
        assert_eq!(warned, [10, 100, 1000]);
    }
}
