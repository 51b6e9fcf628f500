//! The dynamic group filter (reference `examples/swe/filter_function.py`): a group teaches GRPO nothing when
//! all its rewards are equal, so it is dropped, and counted as all-correct or all-wrong.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};
use crate::group::Group;
use crate::metrics::{Metric, Scope};

/// A group whose original rewards are all at least `1 - ALL_CORRECT_TOLERANCE` is all-correct.
pub const ALL_CORRECT_TOLERANCE: f64 = 1e-3;

/// The filter's verdict on one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterVerdict {
    /// The group's original rewards are not all equal: keep it.
    pub accept: bool,
    /// Every original reward is at least `1 - 1e-3`.
    pub all_correct: bool,
}

impl FilterVerdict {
    /// The verdict on a group's original (pre-normalisation) rewards: accepted iff they are not all equal.
    /// They must be non-empty and finite.
    pub fn of(original_rewards: &[f64]) -> Result<Self> {
        let Some(&first) = original_rewards.first() else {
            return Err(Error::FilterInput("requires at least one reward"));
        };
        if original_rewards.iter().any(|r| !r.is_finite()) {
            return Err(Error::FilterInput("rewards must be finite"));
        }
        let accept = original_rewards.iter().any(|r| *r != first);
        let all_correct = original_rewards.iter().all(|r| *r >= 1.0 - ALL_CORRECT_TOLERANCE);
        Ok(Self { accept, all_correct })
    }

    /// The group was rejected because every rollout solved it.
    pub fn rejected_all_correct(&self) -> bool {
        !self.accept && self.all_correct
    }

    /// The group was rejected and not all-correct: uniform failures or uniform partial credit.
    pub fn rejected_all_wrong(&self) -> bool {
        !self.accept && !self.all_correct
    }

    /// The reference's per-group counters: `rejected_by_failed_or_perfect`, `rejected_by_all_correct`,
    /// `rejected_by_all_wrong`, each 0 or 1.
    pub fn metrics(&self, scope: Scope) -> Vec<Metric> {
        vec![
            scope.flag("rejected_by_failed_or_perfect", !self.accept),
            scope.flag("rejected_by_all_correct", self.rejected_all_correct()),
            scope.flag("rejected_by_all_wrong", self.rejected_all_wrong()),
        ]
    }
}

/// Running totals of a [`DynamicFilter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FilterCounters {
    /// Groups accepted.
    pub accepted: u64,
    /// Groups rejected as all-correct.
    pub rejected_all_correct: u64,
    /// Groups rejected as all-wrong.
    pub rejected_all_wrong: u64,
}

impl FilterCounters {
    /// Groups rejected for any reason (`rejected_by_failed_or_perfect`).
    pub fn rejected(&self) -> u64 {
        self.rejected_all_correct + self.rejected_all_wrong
    }
}

/// The dynamic filter, with counters that any number of threads may share.
#[derive(Debug, Default)]
pub struct DynamicFilter {
    accepted: AtomicU64,
    rejected_all_correct: AtomicU64,
    rejected_all_wrong: AtomicU64,
}

impl DynamicFilter {
    /// A filter with zeroed counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// Judges a group on its original rewards (never the normalised ones) and counts the verdict.
    pub fn check(&self, group: &Group) -> Result<FilterVerdict> {
        self.check_rewards(&group.original_rewards())
    }

    /// Judges a group given its original rewards and counts the verdict.
    pub fn check_rewards(&self, original_rewards: &[f64]) -> Result<FilterVerdict> {
        let verdict = FilterVerdict::of(original_rewards)?;
        let counter = if verdict.accept {
            &self.accepted
        } else if verdict.all_correct {
            &self.rejected_all_correct
        } else {
            &self.rejected_all_wrong
        };
        counter.fetch_add(1, Ordering::Relaxed);
        Ok(verdict)
    }

    /// The totals so far.
    pub fn counters(&self) -> FilterCounters {
        FilterCounters {
            accepted: self.accepted.load(Ordering::Relaxed),
            rejected_all_correct: self.rejected_all_correct.load(Ordering::Relaxed),
            rejected_all_wrong: self.rejected_all_wrong.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests;
