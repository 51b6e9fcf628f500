//! Group post-processing at rollout time (reference section 7.4): one prompt's `n_samples` results become a
//! [`Group`] or a [`GroupRejection`], with optional z-score reward normalisation inside the group.

use std::fmt;

use crate::route::RejectReason;

/// The denominator guard of rollout-time normalisation.
pub const ROLLOUT_NORM_EPS: f64 = 1e-8;

/// One sample's result, as group post-processing sees it.
#[derive(Debug, Clone, PartialEq)]
pub enum SampleResult {
    /// A trajectory trained with this reward (its last interaction's reward).
    Reward(f64),
    /// No trajectory: an empty export, or a model failure without interactions (the reference's `None`).
    Dropped,
    /// The rollout failed with a rejection: the whole group is rejected.
    Rejected(RejectReason),
}

/// Rollout-time group settings (`gconfig`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GroupSettings {
    /// Reject a group when any of its samples produced no trajectory.
    pub drop_incomplete_group: bool,
    /// Z-score each group's rewards at rollout time (`gconfig.reward_normalization`).
    pub reward_normalization: bool,
    /// With `reward_normalization`, subtract the group mean only (`gconfig.reward_normalization_use_std:
    /// false`, AReaL #1750's mean-only groups).
    pub mean_only: bool,
    /// Reject a group with fewer kept samples (`gconfig.min_usable_group_size`); 0 and 1 keep any group with
    /// one.
    pub min_usable_group_size: usize,
}

/// One kept sample of a group.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupSample {
    /// The sample's index in the group (`sample_idx`).
    pub index: usize,
    /// The raw reward, before any normalisation (`original_rewards`).
    pub original_reward: f64,
    /// The reward after rollout-time normalisation (equal to `original_reward` without it).
    pub reward: f64,
}

/// A prompt's kept samples.
#[derive(Debug, Clone, PartialEq)]
pub struct Group {
    samples: Vec<GroupSample>,
    size: usize,
}

impl Group {
    /// The kept samples, in sample order.
    pub fn samples(&self) -> &[GroupSample] {
        &self.samples
    }

    /// The number of samples the group was run with (`n_samples`), kept or not.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The number of kept samples (never zero).
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// Always `false`: a group without kept samples is rejected instead.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The raw rewards of the kept samples.
    pub fn original_rewards(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.original_reward).collect()
    }

    /// The rewards after rollout-time normalisation.
    pub fn rewards(&self) -> Vec<f64> {
        self.samples.iter().map(|s| s.reward).collect()
    }
}

/// Why a group does not reach training.
#[derive(Debug, Clone, PartialEq)]
pub enum GroupRejection {
    /// A sample was rejected, which rejects its group.
    SampleRejected {
        /// The rejected sample's index.
        index: usize,
        /// Why it was rejected.
        reason: RejectReason,
    },
    /// No sample produced a trajectory.
    AllDropped,
    /// `drop_incomplete_group` is on and some samples produced no trajectory.
    Incomplete {
        /// Samples kept.
        kept: usize,
        /// Samples run.
        size: usize,
    },
    /// Fewer samples produced a trajectory than `min_usable_group_size`.
    TooFewUsable {
        /// Samples kept.
        kept: usize,
        /// The minimum.
        min: usize,
    },
    /// A sample's reward is NaN or infinite.
    InvalidReward {
        /// The sample's index.
        index: usize,
        /// Its reward.
        value: f64,
    },
}

impl GroupRejection {
    /// A stable label for metrics: `sample_rejected`, `all_dropped`, `incomplete`, `too_few_usable` or
    /// `invalid_reward`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::SampleRejected { .. } => "sample_rejected",
            Self::AllDropped => "all_dropped",
            Self::Incomplete { .. } => "incomplete",
            Self::TooFewUsable { .. } => "too_few_usable",
            Self::InvalidReward { .. } => "invalid_reward",
        }
    }
}

impl fmt::Display for GroupRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SampleRejected { index, reason } => write!(f, "sample {index} was rejected: {reason}"),
            Self::AllDropped => f.write_str("no sample produced a trajectory"),
            Self::Incomplete { kept, size } => write!(
                f,
                "only {kept} of {size} samples produced a trajectory and drop_incomplete_group is on"
            ),
            Self::TooFewUsable { kept, min } => write!(
                f,
                "only {kept} samples produced a trajectory and gconfig.min_usable_group_size is {min}"
            ),
            Self::InvalidReward { index, value } => {
                write!(f, "sample {index} has a non-finite reward {value}")
            }
        }
    }
}

/// Assembles one prompt's sample results into a group.
///
/// Any rejected sample rejects the group; dropped samples are left out (or reject the group under
/// `drop_incomplete_group`, or when fewer than `min_usable_group_size` are kept); with `reward_normalization`
/// and more than one sample run, the kept rewards are z-scored with [`normalize_rollout`], or only centred
/// under `mean_only`. Raw rewards stay available as [`GroupSample::original_reward`].
pub fn assemble_group(samples: &[SampleResult], settings: &GroupSettings) -> Result<Group, GroupRejection> {
    let mut kept = Vec::with_capacity(samples.len());
    for (index, sample) in samples.iter().enumerate() {
        match sample {
            SampleResult::Rejected(reason) => {
                return Err(GroupRejection::SampleRejected {
                    index,
                    reason: reason.clone(),
                });
            }
            SampleResult::Reward(value) if !value.is_finite() => {
                return Err(GroupRejection::InvalidReward { index, value: *value });
            }
            SampleResult::Reward(value) => kept.push((index, *value)),
            SampleResult::Dropped => {}
        }
    }
    if kept.is_empty() {
        return Err(GroupRejection::AllDropped);
    }
    if kept.len() < samples.len() && settings.drop_incomplete_group {
        return Err(GroupRejection::Incomplete {
            kept: kept.len(),
            size: samples.len(),
        });
    }
    if kept.len() < settings.min_usable_group_size {
        return Err(GroupRejection::TooFewUsable {
            kept: kept.len(),
            min: settings.min_usable_group_size,
        });
    }
    let raw: Vec<f64> = kept.iter().map(|(_, reward)| *reward).collect();
    let rewards = match (
        settings.reward_normalization && samples.len() > 1,
        settings.mean_only,
    ) {
        (false, _) => raw,
        (true, false) => normalize_rollout(&raw),
        (true, true) => {
            let mean = raw.iter().sum::<f64>() / raw.len() as f64;
            raw.iter().map(|r| r - mean).collect()
        }
    };
    Ok(Group {
        samples: kept
            .iter()
            .zip(rewards)
            .map(|(&(index, original_reward), reward)| GroupSample {
                index,
                original_reward,
                reward,
            })
            .collect(),
        size: samples.len(),
    })
}

/// Rollout-time normalisation: `(r - mean) / (std + 1e-8)` with the population std (`std = 1` for a single
/// value).
pub fn normalize_rollout(rewards: &[f64]) -> Vec<f64> {
    if rewards.is_empty() {
        return Vec::new();
    }
    let n = rewards.len() as f64;
    let mean = rewards.iter().sum::<f64>() / n;
    let std = if rewards.len() == 1 {
        1.0
    } else {
        (rewards.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / n).sqrt()
    };
    rewards
        .iter()
        .map(|r| (r - mean) / (std + ROLLOUT_NORM_EPS))
        .collect()
}

#[cfg(test)]
mod tests;
