//! Training-time reward processing (reference section 7.4): the reward pipeline
//! `clip((r + bias) * scaling, ±clip)`, then `actor.reward_norm` ([`NormConfig`]), giving one scalar advantage per
//! sample that the trainer broadcasts over the sample's trained tokens.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::group::{Group, GroupSettings};

pub use stream_config::{NormConfig, NormLevel};

/// Every problem with normalisation settings, each naming the field under `prefix` (for example
/// `actor.reward_norm`).
fn norm_problems(config: &NormConfig, prefix: &str) -> Vec<String> {
    let mut problems = Vec::new();
    if !(config.eps.is_finite() && config.eps >= 0.0) {
        problems.push(format!(
            "{prefix}.eps must be finite and non-negative, got {}",
            config.eps
        ));
    }
    if config.group_size == 0 {
        problems.push(format!("{prefix}.group_size must be at least 1, got 0"));
    }
    problems
}

/// Training-time normalisation with [`NormConfig`] (the config's type, `stream-config` owns it).
pub trait Normalize {
    /// Normalises `x`. `group_sizes` gives the real size of each consecutive group (failed samples shrink
    /// groups) and must add up to `x.len()`; with `None`, groups are consecutive runs of `group_size`, which must
    /// divide `x.len()` when a level is `group`.
    fn normalize(&self, x: &[f64], group_sizes: Option<&[usize]>) -> Result<Vec<f64>>;
}

impl Normalize for NormConfig {
    fn normalize(&self, x: &[f64], group_sizes: Option<&[usize]>) -> Result<Vec<f64>> {
        if let Some(problem) = norm_problems(self, "reward_norm").into_iter().next() {
            return Err(Error::Normalization(problem));
        }
        if let Some(bad) = x.iter().find(|v| !v.is_finite()) {
            return Err(Error::Normalization(format!(
                "cannot normalise a non-finite value {bad}"
            )));
        }
        let slices = group_slices(self, x.len(), group_sizes)?;

        let mut mean = vec![0.0; x.len()];
        match self.mean_level {
            Some(NormLevel::Batch) => fill_mean(x, &mut mean, 0..x.len(), self.mean_leave1out, false),
            Some(NormLevel::Group) => {
                for range in &slices {
                    fill_mean(x, &mut mean, range.clone(), self.mean_leave1out, true);
                }
            }
            None => {}
        }

        let (std, eps) = match self.std_level {
            Some(level) => {
                let mut std = vec![1.0; x.len()];
                let ranges = match level {
                    NormLevel::Batch => std::iter::once(0..x.len()).collect(),
                    NormLevel::Group => slices,
                };
                for range in ranges {
                    let value = std_of(x, &mean, range.clone(), self.std_unbiased);
                    std[range].fill(value);
                }
                (std, self.eps)
            }
            None => (vec![1.0; x.len()], 0.0),
        };

        Ok(x.iter()
            .zip(&mean)
            .zip(&std)
            .map(|((v, m), s)| (v - m) / (s + eps))
            .collect())
    }
}

/// The consecutive groups of a batch of `len` values: `group_sizes`, else runs of `config.group_size`.
fn group_slices(
    config: &NormConfig,
    len: usize,
    group_sizes: Option<&[usize]>,
) -> Result<Vec<std::ops::Range<usize>>> {
    let uses_groups =
        config.mean_level == Some(NormLevel::Group) || config.std_level == Some(NormLevel::Group);
    if !uses_groups {
        return Ok(Vec::new());
    }
    let sizes: Vec<usize> = match group_sizes {
        Some(sizes) => {
            if sizes.contains(&0) {
                return Err(Error::Normalization(format!(
                    "group sizes must all be positive, got {sizes:?}"
                )));
            }
            let total: usize = sizes.iter().sum();
            if total != len {
                return Err(Error::Normalization(format!(
                    "group sizes {sizes:?} add up to {total}, not to the batch size {len}"
                )));
            }
            sizes.to_vec()
        }
        None => {
            let group_size = config.group_size as usize;
            if !len.is_multiple_of(group_size) {
                return Err(Error::Normalization(format!(
                    "batch size {len} is not a multiple of reward_norm.group_size {group_size}"
                )));
            }
            vec![group_size; len / group_size]
        }
    };
    let mut start = 0;
    Ok(sizes
        .into_iter()
        .map(|size| {
            let range = start..start + size;
            start += size;
            range
        })
        .collect())
}

/// Writes the mean of `x[range]` into `mean[range]`; with leave-one-out, each value's mean of the others.
/// A leave-one-out range of one value gets itself as mean inside a group (it normalises to 0) and 0 over the
/// batch, as the reference does.
fn fill_mean(
    x: &[f64],
    mean: &mut [f64],
    range: std::ops::Range<usize>,
    leave_one_out: bool,
    in_group: bool,
) {
    let n = range.len();
    if n == 0 {
        return;
    }
    let sum: f64 = x[range.clone()].iter().sum();
    for i in range {
        mean[i] = match (leave_one_out, n) {
            (true, 1) if in_group => x[i],
            (true, 1) => 0.0,
            (true, _) => (sum - x[i]) / (n - 1) as f64,
            (false, _) => sum / n as f64,
        };
    }
}

/// The std of `x[range]` around the (possibly per-value) `mean`; 1 when it is undefined (one value and
/// unbiased, or no value).
fn std_of(x: &[f64], mean: &[f64], range: std::ops::Range<usize>, unbiased: bool) -> f64 {
    let n = range.len();
    let sum_sq: f64 = range.map(|i| (x[i] - mean[i]).powi(2)).sum();
    match (unbiased, n) {
        (true, 0 | 1) | (false, 0) => 1.0,
        (true, _) => (sum_sq / (n - 1) as f64).sqrt(),
        (false, _) => (sum_sq / n as f64).sqrt(),
    }
}

/// Everything that turns raw group rewards into advantages, across rollout time (`gconfig`) and training time
/// (`actor`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardConfig {
    /// `gconfig.drop_incomplete_group`.
    pub drop_incomplete_group: bool,
    /// `gconfig.reward_normalization`: z-score groups at rollout time.
    pub reward_normalization: bool,
    /// `actor.reward_bias`, added first.
    pub reward_bias: f64,
    /// `actor.reward_scaling`, multiplied next.
    pub reward_scaling: f64,
    /// `actor.reward_clip`: rewards are clipped to `[-clip, clip]`.
    pub reward_clip: f64,
    /// `actor.reward_norm`: training-time normalisation; exclusive with `reward_normalization`.
    pub reward_norm: Option<NormConfig>,
}

impl Default for RewardConfig {
    fn default() -> Self {
        Self {
            drop_incomplete_group: false,
            reward_normalization: false,
            reward_bias: 0.0,
            reward_scaling: 1.0,
            reward_clip: 20.0,
            reward_norm: None,
        }
    }
}

/// One kept sample's training input: the advantage the trainer broadcasts over its trained tokens, and its raw
/// reward.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampleAdvantage {
    /// The sample's index in its group.
    pub index: usize,
    /// The scalar advantage.
    pub advantage: f64,
    /// The raw reward (`original_rewards`).
    pub raw_reward: f64,
}

impl RewardConfig {
    /// Checks the settings, reporting every problem at once: both normalisations enabled, non-finite bias or
    /// scaling, a clip that is not positive, bad `reward_norm` fields.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.reward_normalization && self.reward_norm.is_some() {
            problems.push(
                "gconfig.reward_normalization and actor.reward_norm cannot both be enabled: rewards would \
                 be normalised twice"
                    .to_string(),
            );
        }
        if !self.reward_bias.is_finite() {
            problems.push(format!(
                "actor.reward_bias must be finite, got {}",
                self.reward_bias
            ));
        }
        if !self.reward_scaling.is_finite() {
            problems.push(format!(
                "actor.reward_scaling must be finite, got {}",
                self.reward_scaling
            ));
        }
        if self.reward_clip.is_nan() || self.reward_clip <= 0.0 {
            problems.push(format!(
                "actor.reward_clip must be positive, got {}",
                self.reward_clip
            ));
        }
        if let Some(norm) = &self.reward_norm {
            problems.extend(norm_problems(norm, "actor.reward_norm"));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::InvalidConfig(problems))
        }
    }

    /// The rollout-time part.
    pub fn group_settings(&self) -> GroupSettings {
        GroupSettings {
            drop_incomplete_group: self.drop_incomplete_group,
            reward_normalization: self.reward_normalization,
            ..GroupSettings::default()
        }
    }

    /// The reward pipeline before normalisation: `clip((r + bias) * scaling, ±clip)`.
    pub fn shape(&self, reward: f64) -> f64 {
        ((reward + self.reward_bias) * self.reward_scaling).clamp(-self.reward_clip, self.reward_clip)
    }

    /// The advantages of one training batch of groups, in group and sample order. Each group's rewards (already
    /// normalised at rollout time if configured) go through [`RewardConfig::shape`], then `reward_norm` with the
    /// groups' real sizes.
    pub fn advantages(&self, batch: &[Group]) -> Result<Vec<Vec<SampleAdvantage>>> {
        self.validate()?;
        let shaped: Vec<f64> = batch
            .iter()
            .flat_map(|group| group.samples().iter().map(|s| self.shape(s.reward)))
            .collect();
        let advantages = match &self.reward_norm {
            Some(norm) => {
                let sizes: Vec<usize> = batch.iter().map(Group::len).collect();
                norm.normalize(&shaped, Some(&sizes))?
            }
            None => shaped,
        };
        let mut advantages = advantages.into_iter();
        Ok(batch
            .iter()
            .map(|group| {
                group
                    .samples()
                    .iter()
                    .zip(advantages.by_ref())
                    .map(|(sample, advantage)| SampleAdvantage {
                        index: sample.index,
                        advantage,
                        raw_reward: sample.original_reward,
                    })
                    .collect()
            })
            .collect())
    }
}

#[cfg(test)]
mod tests;
