//! The training step's plug: [`TrainStep`], its input ([`TrainBatch`], built from exported trajectories and
//! per-sample advantages by [`build_batch`]) and what it gives back ([`StepOutput`], [`NewWeights`]).
//!
//! The loop only needs the trait: a step takes one batch and may return new weights, in memory (swapped into
//! the in-process policy) or on disk (loaded by `update_weights_from_disk` on the in-process policy or on
//! every SGLang-protocol policy server); `save`/`load` write and read the step's own state inside a checkpoint
//! directory the loop manages (with `trainer::Checkpoints`). [`GrpoStep`] is the real update, over a
//! [`TrainEngine`]: [`BurnEngine`] (`trainer`'s GRPO step, the default); [`FrozenPolicy`] keeps the weights
//! as they are (for the fake engine, which cannot learn).

use std::path::{Path, PathBuf};

use reward_routing::{Group, RewardConfig};
use stream_config::BranchWeight;

use crate::error::{Context as _, Result};
use crate::journal::{RolloutRecord, SampleKey};

mod burn;
mod engine;
mod fsdp2;
mod grpo;
#[cfg(test)]
mod tests;

pub use burn::BurnEngine;
pub use engine::TrainEngine;
pub use fsdp2::{Fsdp2Engine, step_stats};
pub use grpo::{GrpoStep, to_rl_batch};

/// One trajectory with its sample's advantage: the unit the trainer consumes.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainSample {
    /// The rollout it came from.
    pub key: SampleKey,
    /// Prompt and output tokens, exactly as sampled.
    pub token_ids: Vec<u32>,
    /// 1 on sampled tokens (the ones the loss covers), 0 elsewhere.
    pub loss_mask: Vec<u8>,
    /// The sampling log-probability of each sampled token, 0 elsewhere.
    pub logprobs: Vec<f32>,
    /// The policy version that sampled each token, -1 elsewhere.
    pub versions: Vec<i64>,
    /// The temperature each token was sampled at (1 for greedy and prompt tokens; empty in records from
    /// before the proxy exported it).
    pub temperatures: Vec<f32>,
    /// 1 on tokens drawn from a truncated distribution (top-p < 1 or top-k), as the proxy exported them.
    pub truncated: Vec<u8>,
    /// The sample's advantage, broadcast over its sampled tokens.
    pub advantage: f64,
    /// The sample's raw reward (before normalisation).
    pub raw_reward: f64,
}

/// One training step's input.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrainBatch {
    /// The samples, group by group.
    pub samples: Vec<TrainSample>,
    /// How many samples (trajectories) each accepted group contributed, in order.
    pub group_sizes: Vec<usize>,
    /// The policy version the step starts from (staleness is measured against it).
    pub policy_version: u64,
}

impl TrainBatch {
    /// Whether there is nothing to train on (every group was rejected).
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }
}

/// New weights for the inference engine.
#[derive(Debug)]
pub enum NewWeights {
    /// The step did not change the weights.
    Unchanged,
    /// Weights in memory, swapped into the in-process policy.
    InMemory(trainer::Weights),
    /// A Hugging Face folder on a filesystem every policy server can read.
    OnDisk(PathBuf),
}

/// What one step gives back.
#[derive(Debug)]
pub struct StepOutput {
    /// Metrics to log under their own names (e.g. `train/loss`).
    pub metrics: Vec<(String, f64)>,
    /// The weights the next rollouts should use.
    pub weights: NewWeights,
}

/// The training step the loop drives. Implementations run on a blocking thread.
pub trait TrainStep: Send {
    /// Called once before any other method, with the run's number of training steps (for schedules).
    fn begin(&mut self, total_steps: u64) -> Result<()> {
        let _ = total_steps;
        Ok(())
    }
    /// Takes one optimisation step on `batch` (step `step`, 0-based).
    fn train(&mut self, step: u64, batch: &TrainBatch) -> Result<StepOutput>;
    /// Saves the step's state (weights, optimiser) into `dir`, which exists and is empty.
    fn save(&mut self, dir: &Path) -> Result<()>;
    /// Restores the state saved by [`TrainStep::save`] in `dir`; returns the weights to install.
    fn load(&mut self, dir: &Path) -> Result<NewWeights>;
}

/// A step that changes no weight, so the loop's rollouts, routing, durability, metrics and checkpoints run
/// end to end with a frozen policy (the fake engine's runs, and tests). It says so once per run.
#[derive(Debug, Default)]
pub struct FrozenPolicy {
    warned: bool,
}

impl TrainStep for FrozenPolicy {
    fn train(&mut self, step: u64, batch: &TrainBatch) -> Result<StepOutput> {
        if !self.warned {
            tracing::warn!(
                "training with a frozen policy: weights stay as they are (rollouts, routing, metrics and \
                 checkpoints still run)"
            );
            self.warned = true;
        }
        let tokens: usize = batch
            .samples
            .iter()
            .map(|s| s.loss_mask.iter().filter(|&&m| m == 1).count())
            .sum();
        tracing::debug!(step, samples = batch.samples.len(), tokens, "frozen step");
        Ok(StepOutput {
            metrics: vec![("train/trained_tokens".to_string(), tokens as f64)],
            weights: NewWeights::Unchanged,
        })
    }

    fn save(&mut self, dir: &Path) -> Result<()> {
        std::fs::write(dir.join("frozen_policy"), b"no trainable state\n")
            .with_context(|| format!("cannot write {}", dir.display()))
    }

    fn load(&mut self, _dir: &Path) -> Result<NewWeights> {
        Ok(NewWeights::Unchanged)
    }
}

/// Turns a step's accepted groups into the trainer's input: advantages from `reward` (bias, scaling, clip,
/// `actor.reward_norm`) over the whole batch, each broadcast to every trajectory of its sample, divided
/// among them under [`BranchWeight::Split`] so that a rollout whose session branched weighs no more than
/// one that did not.
pub fn build_batch(
    reward: &RewardConfig,
    branches: BranchWeight,
    groups: &[(Group, &[RolloutRecord])],
) -> Result<TrainBatch> {
    let only_groups: Vec<Group> = groups.iter().map(|(g, _)| g.clone()).collect();
    let advantages = reward.advantages(&only_groups).context("computing advantages")?;
    let mut batch = TrainBatch::default();
    for ((_, records), advantages) in groups.iter().zip(advantages) {
        let before = batch.samples.len();
        for a in advantages {
            let Some(record) = records.get(a.index) else {
                continue;
            };
            let share = match branches {
                BranchWeight::Split => 1.0 / record.trajectories.len().max(1) as f64,
                BranchWeight::Each => 1.0,
            };
            for t in &record.trajectories {
                batch.samples.push(TrainSample {
                    key: record.key,
                    token_ids: t.token_ids.clone(),
                    loss_mask: t.loss_mask.clone(),
                    logprobs: t.logprobs.clone(),
                    versions: t.versions.clone(),
                    temperatures: t.temperatures.clone(),
                    truncated: t.truncated.clone(),
                    advantage: a.advantage * share,
                    raw_reward: a.raw_reward,
                });
            }
        }
        batch.group_sizes.push(batch.samples.len() - before);
    }
    Ok(batch)
}
