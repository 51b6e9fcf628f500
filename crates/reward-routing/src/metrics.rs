//! Metrics as plain `(name, value)` records (reference section 4.5): scopes, the lifecycle names, and the
//! group metrics (pass@k and the `group_pass_<c>` distribution). Sinks that average, sum or plot them come
//! later.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::outcome::RowMeta;
use crate::reward::RewardRule;

/// The scope of per-task debug metrics (`debug/task/<data_id>/raw_reward`), kept apart from the rollout
/// scopes.
pub const DEBUG_SCOPE: &str = "debug";

/// One metric record: a full name (scope included) and a value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    /// The full name, for example `rollout/pass@k`.
    pub name: String,
    /// The value.
    pub value: f64,
}

impl Metric {
    /// A metric named exactly `name`.
    pub fn new(name: impl Into<String>, value: f64) -> Self {
        Self {
            name: name.into(),
            value,
        }
    }

    /// A metric in the [`DEBUG_SCOPE`].
    pub fn debug(name: impl fmt::Display, value: f64) -> Self {
        Self::new(format!("{DEBUG_SCOPE}/{name}"), value)
    }
}

/// Whether metrics come from training rollouts or evaluation rollouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Scope {
    /// Training rollouts: `rollout/`.
    #[default]
    Rollout,
    /// Evaluation rollouts: `eval-rollout/`.
    EvalRollout,
}

impl Scope {
    /// The prefix without its slash.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Rollout => "rollout",
            Self::EvalRollout => "eval-rollout",
        }
    }

    /// A metric named `<scope>/<name>`.
    pub fn metric(self, name: impl fmt::Display, value: f64) -> Metric {
        Metric::new(format!("{}/{name}", self.as_str()), value)
    }

    /// A 0/1 metric named `<scope>/<name>`.
    pub fn flag(self, name: impl fmt::Display, on: bool) -> Metric {
        self.metric(name, if on { 1.0 } else { 0.0 })
    }
}

/// The 0/1 lifecycle metrics of an Arena rollout (names without scope).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lifecycle {
    /// `arena/registration_success`.
    RegistrationSuccess,
    /// `arena/launch_success`.
    LaunchSuccess,
    /// `arena/terminal_success`.
    TerminalSuccess,
    /// `arena/result_processing_success`.
    ResultProcessingSuccess,
    /// `arena/call_success`.
    CallSuccess,
    /// `arena/cleanup_success`.
    CleanupSuccess,
    /// `arena/direct_route`.
    DirectRoute,
    /// `arena/session_gateway_route`.
    SessionGatewayRoute,
    /// `arena/registration_probe_success`.
    RegistrationProbeSuccess,
    /// `arena/registration_present`.
    RegistrationPresent,
    /// `arena/registration_restore_success`.
    RegistrationRestoreSuccess,
    /// `arena/reward_ref_validation_success`.
    RewardRefValidationSuccess,
    /// `arena/result_dump_success`.
    ResultDumpSuccess,
    /// `arena/registration_renew_success`: the share of a `gateway` route's renewals Arena confirmed.
    RegistrationRenewSuccess,
}

impl Lifecycle {
    /// Every lifecycle metric, in the reference's order.
    pub const ALL: [Lifecycle; 14] = [
        Self::RegistrationSuccess,
        Self::LaunchSuccess,
        Self::TerminalSuccess,
        Self::ResultProcessingSuccess,
        Self::CallSuccess,
        Self::CleanupSuccess,
        Self::DirectRoute,
        Self::SessionGatewayRoute,
        Self::RegistrationProbeSuccess,
        Self::RegistrationPresent,
        Self::RegistrationRestoreSuccess,
        Self::RewardRefValidationSuccess,
        Self::ResultDumpSuccess,
        Self::RegistrationRenewSuccess,
    ];

    /// The name without scope, for example `arena/launch_success`.
    pub fn name(self) -> &'static str {
        match self {
            Self::RegistrationSuccess => "arena/registration_success",
            Self::LaunchSuccess => "arena/launch_success",
            Self::TerminalSuccess => "arena/terminal_success",
            Self::ResultProcessingSuccess => "arena/result_processing_success",
            Self::CallSuccess => "arena/call_success",
            Self::CleanupSuccess => "arena/cleanup_success",
            Self::DirectRoute => "arena/direct_route",
            Self::SessionGatewayRoute => "arena/session_gateway_route",
            Self::RegistrationProbeSuccess => "arena/registration_probe_success",
            Self::RegistrationPresent => "arena/registration_present",
            Self::RegistrationRestoreSuccess => "arena/registration_restore_success",
            Self::RewardRefValidationSuccess => "arena/reward_ref_validation_success",
            Self::ResultDumpSuccess => "arena/result_dump_success",
            Self::RegistrationRenewSuccess => "arena/registration_renew_success",
        }
    }

    /// The metric `<scope>/<name>` with value 1 for `ok`, 0 otherwise.
    pub fn metric(self, scope: Scope, ok: bool) -> Metric {
        scope.flag(self.name(), ok)
    }
}

/// The group metrics of one prompt's `group_size` rollouts: `pass@k` (1 when any reward counts as solved under
/// `rule`), the one-hot `group_pass_<c>` for `c = 0..=group_size`, where `c` is the number of solved rollouts,
/// and (`arena-2026.md` 2.8, AReaL #1746) `all_correct` (`c == group_size`), `all_wrong` (`c == 0`) and the
/// one-hot `group_pass_count_<c>_ratio`. `pass@k`, `all_correct`, `all_wrong` and the ratios are also written
/// under `domain/<task_type>/` and `stream/<name>/`, and `pass@k` under `<task_type>/` as the reference does.
///
/// `rewards` holds each rollout's training reward, `None` for a rollout that produced none; its length must be
/// `group_size`.
pub fn group_metrics(
    scope: Scope,
    row: &RowMeta,
    rule: &RewardRule,
    rewards: &[Option<f64>],
    group_size: usize,
) -> Result<Vec<Metric>> {
    if rewards.len() != group_size {
        return Err(Error::GroupSizeMismatch {
            expected: group_size,
            got: rewards.len(),
        });
    }
    let solved = rewards
        .iter()
        .flatten()
        .filter(|reward| rule.is_solved(**reward))
        .count();
    let pass = solved > 0;
    let task_type = row.metric_task_type();
    let mut metrics = vec![scope.flag(format_args!("{task_type}/pass@k"), pass)];
    metrics.extend((0..=group_size).map(|c| scope.flag(format_args!("group_pass_{c}"), c == solved)));
    let domain = format!("domain/{task_type}/");
    let stream = format!("stream/{}/", row.stream_name);
    for prefix in ["", domain.as_str(), stream.as_str()] {
        metrics.push(scope.flag(format_args!("{prefix}pass@k"), pass));
        metrics.push(scope.flag(format_args!("{prefix}all_correct"), solved == group_size));
        metrics.push(scope.flag(format_args!("{prefix}all_wrong"), solved == 0));
        metrics.extend(
            (0..=group_size)
                .map(|c| scope.flag(format_args!("{prefix}group_pass_count_{c}_ratio"), c == solved)),
        );
    }
    Ok(metrics)
}

#[cfg(test)]
mod tests;
