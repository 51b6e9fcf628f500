//! [`TrainEngine`]: the seam between the loop's GRPO step and the engine that computes it.
//!
//! What both engines share stays above the seam, in [`super::GrpoStep`]: the batch conversion, skipping a
//! batch with nothing to train, the off-temperature note and the step's metric records (`train/...`,
//! from `trainer::StepStats`, so the names are the same whichever engine trained). Below it an engine takes
//! one optimiser step on a [`TrainBatch`], returns its statistics, hands out its weights and saves and
//! restores its state inside a checkpoint directory the loop manages.
//!
//! [`super::BurnEngine`] implements it (`trainer`, in this process; the default).

use std::path::Path;

use super::{NewWeights, TrainBatch};
use crate::error::Result;

/// An engine that trains the policy: one optimiser step per batch, its weights out, its state in and out.
pub trait TrainEngine: Send {
    /// Loads the model and prepares the optimiser for a run of `total_steps` optimiser steps (the learning
    /// rate's schedule). Called once before any other method.
    fn begin(&mut self, total_steps: u64) -> Result<()>;
    /// One GRPO step on `batch`, which has at least one trained token; `step` is the loop's step (0-based),
    /// for messages.
    fn grpo_step(&mut self, step: u64, batch: &TrainBatch) -> Result<trainer::StepStats>;
    /// The current weights, for the inference engine.
    fn weights(&mut self) -> Result<NewWeights>;
    /// Saves the engine's state (weights, optimiser, step count) into `dir`, which exists and is empty.
    fn save(&mut self, dir: &Path) -> Result<()>;
    /// Restores the state [`TrainEngine::save`] wrote in `dir`.
    fn load(&mut self, dir: &Path) -> Result<()>;
}
