//! Reward extraction: the top-level score of a terminal result, then the stream's transform or threshold
//! (reference section 4.5), and what counts as solved for pass@k.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use stream_config::IntegrityPolicy;

use crate::error::{Error, Result};
use crate::outcome::{RowMeta, TaskOutcome};
use crate::transform::{ResolvedTransform, TransformRegistry};
use stream_config::FailurePolicy;

/// A stream's reward settings, as its configuration gives them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RewardSettings {
    /// Binarisation threshold, or the argument handed to the transform; `None` when not configured.
    pub reward_threshold: Option<f64>,
    /// The transform's registered name or reference import path; empty for none.
    pub reward_transform_fn: String,
}

/// A stream's reward rule, with its transform resolved once (the reference imports it once per agent).
#[derive(Debug, Clone)]
pub struct RewardRule {
    stream: String,
    threshold: Option<f64>,
    transform: Option<ResolvedTransform>,
    integrity: IntegrityPolicy,
    integrity_rules: Arc<[String]>,
    failure_policy: FailurePolicy,
    sample_level_rejection: bool,
}

impl RewardRule {
    /// Resolves `settings` for `stream` against `registry`. An unknown transform or a non-finite threshold is an
    /// error naming the stream.
    pub fn new(stream: &str, settings: &RewardSettings, registry: &TransformRegistry) -> Result<Self> {
        if let Some(value) = settings.reward_threshold
            && !value.is_finite()
        {
            return Err(Error::InvalidThreshold {
                stream: stream.to_string(),
                value,
            });
        }
        let name = settings.reward_transform_fn.trim();
        let transform = if name.is_empty() {
            None
        } else {
            Some(registry.resolve(stream, name)?)
        };
        Ok(Self {
            stream: stream.to_string(),
            threshold: settings.reward_threshold,
            transform,
            integrity: IntegrityPolicy::Record,
            integrity_rules: Arc::from([]),
            failure_policy: FailurePolicy::default(),
            sample_level_rejection: false,
        })
    }

    /// The rule of a stream with neither threshold nor transform: the raw score is the reward.
    pub fn raw(stream: &str) -> Self {
        Self {
            stream: stream.to_string(),
            threshold: None,
            transform: None,
            integrity: IntegrityPolicy::Record,
            integrity_rules: Arc::from([]),
            failure_policy: FailurePolicy::default(),
            sample_level_rejection: false,
        }
    }

    /// The same rule with `gconfig.reject_terminal_task_failures`: a training rollout rejected for a grader
    /// failure (`EVAL_FAILED`) or an unattributed `HARNESS_FAILED`, `NO_OUTPUT` or `TIMEOUT` drops only its
    /// sample (AReaL #1751).
    pub fn with_sample_level_rejection(mut self, on: bool) -> Self {
        self.sample_level_rejection = on;
        self
    }

    /// See [`RewardRule::with_sample_level_rejection`].
    pub fn sample_level_rejection(&self) -> bool {
        self.sample_level_rejection
    }

    /// The same rule under another [`FailurePolicy`].
    pub fn with_failure_policy(mut self, policy: FailurePolicy) -> Self {
        self.failure_policy = policy;
        self
    }

    /// The policy that classifies this stream's failed tasks.
    pub fn failure_policy(&self) -> FailurePolicy {
        self.failure_policy
    }

    /// The same rule with the stream's integrity policy, and the ids of the rules its sessions are scanned
    /// with (each gets a `reward/integrity_hits/<id>` metric on every rollout, 0 when it did not hit, so a
    /// step's mean is hits per rollout).
    pub fn with_integrity(
        mut self,
        policy: IntegrityPolicy,
        rules: impl IntoIterator<Item = String>,
    ) -> Self {
        self.integrity = policy;
        self.integrity_rules = rules.into_iter().collect();
        self
    }

    /// What a rollout with integrity hits costs (default `record`).
    pub fn integrity_policy(&self) -> IntegrityPolicy {
        self.integrity
    }

    /// The ids of the integrity rules the stream's sessions are scanned with.
    pub fn integrity_rules(&self) -> &[String] {
        &self.integrity_rules
    }

    /// The stream this rule belongs to.
    pub fn stream(&self) -> &str {
        &self.stream
    }

    /// The configured threshold.
    pub fn threshold(&self) -> Option<f64> {
        self.threshold
    }

    /// The registered name of the transform, if the stream has one.
    pub fn transform_name(&self) -> Option<&str> {
        self.transform.as_ref().map(ResolvedTransform::name)
    }

    /// The training reward of a terminal result: its top-level score (never anything inside `raw`), then the
    /// rule.
    pub fn reward_of(&self, outcome: &TaskOutcome, row: &RowMeta) -> Result<f64> {
        let score = outcome.score.ok_or_else(|| Error::MissingScore {
            stream: self.stream.clone(),
            task_id: outcome.task_id.clone(),
        })?;
        if !score.is_finite() {
            return Err(Error::NonFiniteScore {
                stream: self.stream.clone(),
                task_id: outcome.task_id.clone(),
                score,
            });
        }
        self.reward(score, row)
    }

    /// Applies the rule to a finite score: the transform if configured (given the threshold only when one is
    /// configured; a non-finite output is an error), else `1.0` at or above the threshold and `0.0` below it,
    /// else the score itself.
    pub fn reward(&self, score: f64, row: &RowMeta) -> Result<f64> {
        if let Some(transform) = &self.transform {
            let value = transform
                .transform(score, row, self.threshold)
                .map_err(|source| Error::TransformFailed {
                    stream: self.stream.clone(),
                    transform: transform.name().to_string(),
                    score,
                    source,
                })?;
            if !value.is_finite() {
                return Err(Error::NonFiniteReward {
                    stream: self.stream.clone(),
                    transform: transform.name().to_string(),
                    value,
                });
            }
            return Ok(value);
        }
        Ok(match self.threshold {
            Some(threshold) if score >= threshold => 1.0,
            Some(_) => 0.0,
            None => score,
        })
    }

    /// Whether a reward this rule produced counts as solved for pass@k: with a transform and a threshold, the
    /// reward must reach the threshold (so partial credit is not a pass); otherwise it must be positive (a
    /// threshold-only rule has already produced 0 or 1).
    pub fn is_solved(&self, reward: f64) -> bool {
        match (&self.transform, self.threshold) {
            (Some(_), Some(threshold)) => reward >= threshold,
            _ => reward > 0.0,
        }
    }
}

#[cfg(test)]
mod tests;
