//! Failure classification (reference section 4.4, `arena-2026.md` 2.1-2.4): which failed rollouts still teach
//! the model something (a zero reward) and which must be rejected, under one of the named [`FailurePolicy`]s.

use serde_json::Value;
use stream_config::{FailurePolicy, TaskStatus};

use crate::harness::outcome_code;
use crate::receipt::check_receipt;

/// GameAgent outcome codes that AReaL's merged main attributes to the model when the session recorded
/// interactions (#1746, narrowed by #1748, which rejects the generic response failures).
pub const MODEL_OUTCOME_CODES: [&str; 4] = [
    "AGENT_MAX_TURNS_EXCEEDED",
    "AGENT_RUN_TIMEOUT",
    "AUTONOMOUS_INCOMPLETE_NO_SHIP",
    "LLM_RESPONSE_TIMEOUT",
];

/// The first phrase a Claude Harness writes into `raw.error` when the agent phase failed.
pub const CLAUDE_AGENT_PHASE_EXITED: &str = "harness: harness agent phase exited with code";
/// The second phrase a Claude Harness writes into `raw.error` when Claude itself reported the error.
pub const CLAUDE_REPORTED_ERROR: &str = "harness: agent phase error: claude reported error";

/// What a failed rollout means for training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureDisposition {
    /// The model caused the failure: train on the trajectory with reward 0.
    ModelFailureZero,
    /// Arena, the harness infrastructure, the network or the proxy failed: reject.
    SystemFailureReject,
    /// Nobody can tell whose fault it was: reject.
    UnknownFailureReject,
}

impl FailureDisposition {
    /// The reference's name of the disposition.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ModelFailureZero => "model_failure_zero",
            Self::SystemFailureReject => "system_failure_reject",
            Self::UnknownFailureReject => "unknown_failure_reject",
        }
    }
}

/// A failure to classify.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Failure<'a> {
    /// Arena reported a failure status for the task (the reference's typed `ArenaTaskFailedError`).
    Task {
        /// The failure status.
        status: &'a TaskStatus,
        /// The task's `raw` payload (`Null` when absent).
        raw: &'a Value,
    },
    /// Anything else: transport, API, local timeout, result processing.
    Other,
}

/// Classifies a failure the way `policy`'s `classify_proxy_failure` does.
///
/// | failure | disposition |
/// |---|---|
/// | not a typed task failure | system |
/// | `CANCELLED`, `COLLECT_FAILED`, `ERROR`, `EVAL_FAILED`, `FAILED`, `SETUP_FAILED` | system |
/// | `NO_OUTPUT`, `TIMEOUT` with interactions | model, zero reward |
/// | `HARNESS_FAILED` with interactions and (a context overflow or the Claude agent-phase text) | model, zero reward |
/// | merged main only: `HARNESS_FAILED` with interactions and an outcome code of [`MODEL_OUTCOME_CODES`] | model, zero reward |
/// | anything else, including those statuses without interactions | unknown |
///
/// `ERROR` was no failure status in #1547 (the reference polled it until its deadline); every policy here
/// treats it as the grader's failure.
/// The proxy's own internal errors override this (see [`crate::route_outcome`]).
pub fn classify_failure(
    policy: FailurePolicy,
    failure: Failure<'_>,
    context_overflow: bool,
    interaction_count: u64,
) -> FailureDisposition {
    let (status, raw) = match failure {
        Failure::Other => return FailureDisposition::SystemFailureReject,
        Failure::Task { status, raw } => (status, raw),
    };
    let interacted = interaction_count > 0;
    if policy == FailurePolicy::StrictReceipt {
        return classify_strict(status, raw, interacted);
    }
    match status {
        TaskStatus::Cancelled
        | TaskStatus::Error
        | TaskStatus::CollectFailed
        | TaskStatus::EvalFailed
        | TaskStatus::Failed
        | TaskStatus::SetupFailed => FailureDisposition::SystemFailureReject,
        TaskStatus::NoOutput | TaskStatus::Timeout if interacted => FailureDisposition::ModelFailureZero,
        TaskStatus::HarnessFailed
            if interacted && (context_overflow || is_claude_agent_phase_failure(raw)) =>
        {
            FailureDisposition::ModelFailureZero
        }
        TaskStatus::HarnessFailed
            if interacted
                && policy == FailurePolicy::MergedMain
                && outcome_code(raw).is_some_and(|code| MODEL_OUTCOME_CODES.contains(&code)) =>
        {
            FailureDisposition::ModelFailureZero
        }
        _ => FailureDisposition::UnknownFailureReject,
    }
}

/// AReaL #1750's `classify_proxy_failure` (`arena-2026.md` 2.3): a system status is a system failure even
/// with a perfect receipt; `HARNESS_FAILED` with interactions and a valid v1 receipt ([`check_receipt`], no
/// other format) is the model's; everything else, `TIMEOUT` and `NO_OUTPUT` included, is unknown. A context
/// overflow is never consulted.
fn classify_strict(status: &TaskStatus, raw: &Value, interacted: bool) -> FailureDisposition {
    match status {
        TaskStatus::HarnessFailed if interacted && check_receipt(raw).is_ok() => {
            FailureDisposition::ModelFailureZero
        }
        TaskStatus::HarnessFailed | TaskStatus::NoOutput | TaskStatus::Timeout => {
            FailureDisposition::UnknownFailureReject
        }
        _ => FailureDisposition::SystemFailureReject,
    }
}

/// Whether `raw.error` is a string that, lower-cased, holds both phrases a Claude Harness writes when Claude
/// reported an error in the agent phase.
pub fn is_claude_agent_phase_failure(raw: &Value) -> bool {
    let Some(error) = raw.get("error").and_then(Value::as_str) else {
        return false;
    };
    let lower = error.to_lowercase();
    lower.contains(CLAUDE_AGENT_PHASE_EXITED) && lower.contains(CLAUDE_REPORTED_ERROR)
}

#[cfg(test)]
mod tests;
