//! Routing one finished rollout: from its [`Episode`] to a [`Decision`], the metrics to record, and the audit
//! record to write (reference sections 4.3-4.6).

use std::fmt;

use stream_config::{FailurePolicy, IntegrityPolicy, TaskStatus};

use crate::audit::AuditRecord;
use crate::classify::{Failure, FailureDisposition, classify_failure};
use crate::group::SampleResult;
use crate::harness::{HARNESS_OUTCOME_METRIC_CODES, OTHER_CODE, metric_code};
use crate::metrics::{Lifecycle, Metric, Scope};
use crate::outcome::{Episode, ErrorStage, Outcome, RowMeta, TaskOutcome};
use crate::receipt::check_receipt;
use crate::reward::RewardRule;

/// What a finished rollout means for training.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Train on the trajectory with this reward (set on the session's last interaction).
    Train(f64),
    /// Train on the trajectory with reward 0: the model failed (a model-attributed Arena failure, or a context
    /// overflow even when the task succeeded).
    ZeroReward,
    /// Do not train on it.
    Reject(RejectReason),
}

impl Decision {
    /// The reward to set on the session's last interaction, `None` when rejected.
    pub fn reward(&self) -> Option<f64> {
        match self {
            Self::Train(reward) => Some(*reward),
            Self::ZeroReward => Some(0.0),
            Self::Reject(_) => None,
        }
    }

    /// The decision's metric label: `train`, `zero_reward` or `reject`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Train(_) => "train",
            Self::ZeroReward => "zero_reward",
            Self::Reject(_) => "reject",
        }
    }
}

/// Why a rollout is not trained on; [`RejectReason::kind`] is a stable label for metrics.
#[derive(Debug, Clone, PartialEq)]
pub enum RejectReason {
    /// The proxy answered a request of the session with an internal error; this overrides the classifier.
    ProxySystemError,
    /// Arena reported a system failure status (`CANCELLED`, `COLLECT_FAILED`, `ERROR`, `EVAL_FAILED`,
    /// `FAILED`, `SETUP_FAILED`).
    SystemFailure {
        /// The status.
        status: TaskStatus,
    },
    /// Arena reported a failure that cannot be attributed to the model.
    UnknownFailure {
        /// The status.
        status: TaskStatus,
    },
    /// A terminal result that could not become a reward: missing or non-finite score, a transform that refused
    /// the score or returned a non-finite value.
    ResultProcessing {
        /// What went wrong.
        message: String,
    },
    /// We stopped waiting before Arena finished.
    LocalWait {
        /// `true` for a cancellation, `false` for our deadline.
        cancelled: bool,
    },
    /// An error that is not a typed task failure (transport, API, malformed response, a status that is not
    /// terminal).
    Error {
        /// What went wrong.
        message: String,
    },
    /// A model failure without any recorded interaction: there is no trajectory to give reward 0.
    NoInteractions,
    /// The agent hit integrity rules and the stream's policy is `reject`: only this sample is dropped.
    IntegrityViolation {
        /// The ids of the rules it hit.
        rules: Vec<String>,
    },
}

impl RejectReason {
    /// A stable label for metrics: `proxy_system_error`, `system_failure`, `unknown_failure`,
    /// `result_processing`, `local_timeout`, `local_cancelled`, `arena_error`, `no_interactions` or
    /// `integrity_violation`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::ProxySystemError => "proxy_system_error",
            Self::SystemFailure { .. } => "system_failure",
            Self::UnknownFailure { .. } => "unknown_failure",
            Self::ResultProcessing { .. } => "result_processing",
            Self::LocalWait { cancelled: false } => "local_timeout",
            Self::LocalWait { cancelled: true } => "local_cancelled",
            Self::Error { .. } => "arena_error",
            Self::NoInteractions => "no_interactions",
            Self::IntegrityViolation { .. } => "integrity_violation",
        }
    }

    /// The failure disposition of the reference that this reason belongs to (an integrity violation, which
    /// the reference does not know, is the model's doing).
    pub fn disposition(&self) -> FailureDisposition {
        match self {
            Self::UnknownFailure { .. } => FailureDisposition::UnknownFailureReject,
            Self::NoInteractions | Self::IntegrityViolation { .. } => FailureDisposition::ModelFailureZero,
            _ => FailureDisposition::SystemFailureReject,
        }
    }

    /// Whether the rejection rejects the sample's whole group (the reference re-raises the error, which fails
    /// the group task), rather than only dropping the sample (an empty trajectory). An integrity violation
    /// drops only its sample: its siblings did nothing wrong.
    pub fn rejects_group(&self) -> bool {
        !matches!(self, Self::NoInteractions | Self::IntegrityViolation { .. })
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ProxySystemError => f.write_str("the rollout proxy reported an internal error"),
            Self::SystemFailure { status } => write!(f, "arena system failure {status}"),
            Self::UnknownFailure { status } => write!(f, "unattributed arena failure {status}"),
            Self::ResultProcessing { message } => write!(f, "result processing failed: {message}"),
            Self::LocalWait { cancelled: false } => f.write_str("timed out waiting for the arena task"),
            Self::LocalWait { cancelled: true } => f.write_str("cancelled while waiting for the arena task"),
            Self::Error { message } => write!(f, "arena error: {message}"),
            Self::NoInteractions => f.write_str("model failure without any recorded interaction"),
            Self::IntegrityViolation { rules } => write!(f, "integrity rules hit: {}", rules.join(", ")),
        }
    }
}

/// The routing of one rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Routed {
    /// What the rollout means for training.
    pub decision: Decision,
    /// The failure classification, when the rollout failed or a context overflow forced reward 0.
    pub disposition: Option<FailureDisposition>,
    /// Metrics to record now, whatever happens next: lifecycle (`arena/terminal_success`,
    /// `arena/result_processing_success`, `arena/call_success` as they apply), `context_overflow`,
    /// `proxy_system_error`, `decision/<kind>` one-hot, `reject/<reason>` for a rejection, and the integrity
    /// hits (`reward/integrity_hits`, `reward/integrity_hits/<rule>`, `stream/<stream>/integrity_hits`).
    pub metrics: Vec<Metric>,
    record: Option<AuditRecord>,
    episode_metrics: Vec<Metric>,
    scope: Scope,
    session_id: Option<String>,
    sample_only: bool,
}

/// What to record once a trained rollout's session export is known.
#[derive(Debug, Clone, PartialEq)]
pub struct AfterExport {
    /// The episode metrics (empty when the export was empty).
    pub metrics: Vec<Metric>,
    /// The audit record, with `training_score` the final reward, or null when the export was empty.
    pub audit: Option<AuditRecord>,
}

impl Routed {
    /// The audit record to write right away: for a rejection, the result Arena reported (or the local wait
    /// status), with `training_score` null. `None` for trained rollouts (see [`Routed::after_export`]) and for
    /// errors that carry no task result.
    pub fn audit_now(&self) -> Option<&AuditRecord> {
        match self.decision {
            Decision::Reject(_) => self.record.as_ref(),
            _ => None,
        }
    }

    /// For a trained rollout ([`Decision::Train`] or [`Decision::ZeroReward`]), what to record after the session
    /// was exported: with a non-empty export, the episode metrics (`reward`, `training_score`, `arena_score`,
    /// `raw_reward`, the `stream/` and task-type variants, the presence flags, and `debug/task/<data_id>/raw_reward`)
    /// and the audit record with the final reward; with an empty export, no metrics and the record with a null
    /// `training_score`. Nothing for a rejection.
    pub fn after_export(&self, exported: bool) -> AfterExport {
        let Some(reward) = self.decision.reward() else {
            return AfterExport {
                metrics: Vec::new(),
                audit: None,
            };
        };
        let training_score = exported.then_some(reward);
        AfterExport {
            metrics: if exported {
                self.episode_metrics.clone()
            } else {
                Vec::new()
            },
            audit: self.record.clone().map(|record| {
                let record = record.with_training_score(training_score);
                if exported {
                    record
                } else {
                    record.with_rejection_reason(Some("empty_export"))
                }
            }),
        }
    }

    /// The episode metadata AReaL stamps on every exported interaction (`arena-2026.md` 2.8): `session_id`
    /// when there is one; with a task result, `arena_task_id` and `arena_status`; for `HARNESS_FAILED`,
    /// `harness_outcome_code` (one of [`HARNESS_OUTCOME_METRIC_CODES`] or `OTHER`).
    pub fn episode_metadata(&self) -> serde_json::Map<String, serde_json::Value> {
        let mut meta = serde_json::Map::new();
        if let Some(id) = &self.session_id {
            meta.insert("session_id".into(), id.clone().into());
        }
        if let Some(record) = &self.record {
            meta.insert("arena_task_id".into(), record.task_id.clone().into());
            meta.insert("arena_status".into(), record.status.as_str().into());
            if let Some(code) = &record.harness_outcome_code {
                meta.insert("harness_outcome_code".into(), code.clone().into());
            }
        }
        meta
    }

    /// The turn metrics of an exported rollout whose last trajectory holds `num_turns` interactions
    /// (`arena-2026.md` 2.8): `num_turns`, then `num_turns_no_harness_err` or, for a `HARNESS_FAILED` task,
    /// `num_turns_harness_err` and `num_turns_harness_err/<CODE|OTHER>`. Each is recorded only for the rollouts
    /// it describes, so its mean is AReaL's average over its own denominator.
    pub fn turn_metrics(&self, num_turns: usize) -> Vec<Metric> {
        let n = num_turns as f64;
        let scope = self.scope;
        let mut metrics = vec![scope.metric("num_turns", n)];
        match self
            .record
            .as_ref()
            .and_then(|r| r.harness_outcome_code.as_deref())
        {
            Some(code) => {
                metrics.push(scope.metric("num_turns_harness_err", n));
                metrics.push(scope.metric(format_args!("num_turns_harness_err/{code}"), n));
            }
            None => metrics.push(scope.metric("num_turns_no_harness_err", n)),
        }
        metrics
    }

    /// The sample's result for group post-processing, once its export is known.
    pub fn sample_result(&self, exported: bool) -> SampleResult {
        match &self.decision {
            Decision::Reject(reason) if reason.rejects_group() && !self.sample_only => {
                SampleResult::Rejected(reason.clone())
            }
            Decision::Reject(_) => SampleResult::Dropped,
            decision => match decision.reward() {
                Some(reward) if exported => SampleResult::Reward(reward),
                _ => SampleResult::Dropped,
            },
        }
    }
}

/// Routes one finished rollout.
///
/// - A success status: the top-level score goes through `rule`; a context overflow forces reward 0; a score or
///   transform failure rejects (`arena/result_processing_success = 0`).
/// - A failure status: [`classify_failure`], unless the proxy reported an internal error, which rejects
///   regardless. A model failure without interactions is rejected as [`RejectReason::NoInteractions`].
/// - A local timeout or cancellation, an error, or a status that is not terminal: rejected as a system failure.
///
/// The proxy's internal-error flag overrides only failures: a task Arena graded as a success is trained, as in
/// the reference.
///
/// A rollout that would train and whose session hit integrity rules then gets the stream's
/// [`RewardRule::integrity_policy`]: `record` trains it as decided, `zero` with reward 0, `reject` drops it
/// as [`RejectReason::IntegrityViolation`]. Its hits are counted in the metrics whatever the policy.
pub fn route_outcome(episode: &Episode, rule: &RewardRule) -> Routed {
    let scope = episode.scope;
    let row = &episode.row;
    let mut metrics = Vec::new();
    let mut record = None;
    let (decision, disposition) = match &episode.outcome {
        Outcome::Task(task) if task.status.is_success() => {
            record = Some(AuditRecord::from_task(row, task, None));
            route_success(episode, task, rule, &mut metrics)
        }
        Outcome::Task(task) if task.status.is_failure() => {
            record = Some(AuditRecord::from_task(row, task, None));
            metrics.push(Lifecycle::TerminalSuccess.metric(scope, false));
            metrics.push(Lifecycle::CallSuccess.metric(scope, false));
            let disposition = if episode.proxy_system_error {
                FailureDisposition::SystemFailureReject
            } else {
                classify_failure(
                    rule.failure_policy(),
                    Failure::Task {
                        status: &task.status,
                        raw: &task.raw,
                    },
                    episode.context_overflow,
                    episode.interaction_count,
                )
            };
            let decision = match disposition {
                FailureDisposition::ModelFailureZero => zero_reward(episode),
                FailureDisposition::SystemFailureReject if episode.proxy_system_error => {
                    Decision::Reject(RejectReason::ProxySystemError)
                }
                FailureDisposition::SystemFailureReject => Decision::Reject(RejectReason::SystemFailure {
                    status: task.status.clone(),
                }),
                FailureDisposition::UnknownFailureReject => Decision::Reject(RejectReason::UnknownFailure {
                    status: task.status.clone(),
                }),
            };
            (decision, Some(disposition))
        }
        Outcome::Task(task) => match task.status {
            TaskStatus::LocalWaitTimeout | TaskStatus::LocalWaitCancelled => {
                record = Some(AuditRecord::from_task(row, task, None));
                let cancelled = task.status == TaskStatus::LocalWaitCancelled;
                route_local_wait(episode, Some(&task.task_id), cancelled, &mut metrics)
            }
            _ => {
                let message = format!(
                    "task {:?} reported status {} which is not terminal",
                    task.task_id, task.status
                );
                route_error(episode, message, ErrorStage::AfterLaunch, &mut metrics, rule)
            }
        },
        Outcome::LocalWait { task_id, cancelled } => {
            record = task_id
                .as_deref()
                .map(|task_id| AuditRecord::local_wait(row, task_id, *cancelled));
            route_local_wait(episode, task_id.as_deref(), *cancelled, &mut metrics)
        }
        Outcome::Error { message, stage } => {
            route_error(episode, message.clone(), *stage, &mut metrics, rule)
        }
    };

    let mut record = record.map(|r| r.with_session_id(episode.session_id.as_deref()));
    if let Some(task) = task_of(&episode.outcome).filter(|t| t.status.is_terminal()) {
        harness_metrics(scope, task, &mut metrics);
        if rule.failure_policy() == FailurePolicy::StrictReceipt && task.status == TaskStatus::HarnessFailed {
            let problem = check_receipt(&task.raw).err();
            metrics.push(scope.flag("receipt_valid", problem.is_none()));
            for kind in ["not_an_object", "vetoed", "field", "attribution"] {
                let hit = problem.as_ref().is_some_and(|p| p.kind() == kind);
                metrics.push(scope.flag(format_args!("receipt_problem/{kind}"), hit));
            }
            record = record.map(|r| r.with_receipt_problem(problem.map(|p| p.to_string())));
        }
    }
    let decision = apply_integrity_policy(decision, episode, rule);
    if let Decision::Reject(reason) = &decision {
        record = record.map(|r| r.with_rejection_reason(Some(reason.kind())));
    }
    integrity_metrics(episode, rule, &mut metrics);
    metrics.push(scope.flag("context_overflow", episode.context_overflow));
    metrics.push(scope.flag("proxy_system_error", episode.proxy_system_error));
    for kind in ["train", "zero_reward", "reject"] {
        metrics.push(scope.flag(format_args!("decision/{kind}"), decision.kind() == kind));
    }
    if let Decision::Reject(reason) = &decision {
        metrics.push(scope.metric(format_args!("reject/{}", reason.kind()), 1.0));
        tracing::warn!(
            stream = %row.stream_name,
            data_id = %row.data_id,
            reason = reason.kind(),
            "arena rollout rejected: {reason}"
        );
    }

    let sample_only = sample_level(episode, rule, &decision);
    if rule.sample_level_rejection() {
        metrics.push(scope.flag("sample_level_rejection", sample_only));
    }
    let episode_metrics = match decision.reward() {
        Some(reward) => episode_metrics(scope, row, task_of(&episode.outcome), reward),
        None => Vec::new(),
    };
    Routed {
        decision,
        disposition,
        metrics,
        record,
        episode_metrics,
        scope,
        session_id: episode.session_id.clone().filter(|s| !s.is_empty()),
        sample_only,
    }
}

/// Whether `decision` drops only its sample under [`RewardRule::sample_level_rejection`] (`arena-2026.md`
/// 2.7): a training rollout, no proxy system error, and the grader's failure or an unattributed terminal
/// harness failure.
fn sample_level(episode: &Episode, rule: &RewardRule, decision: &Decision) -> bool {
    let Decision::Reject(reason) = decision else {
        return false;
    };
    rule.sample_level_rejection()
        && episode.scope == Scope::Rollout
        && !episode.proxy_system_error
        && match reason {
            RejectReason::SystemFailure { status } => *status == TaskStatus::EvalFailed,
            RejectReason::UnknownFailure { status } => matches!(
                status,
                TaskStatus::HarnessFailed | TaskStatus::NoOutput | TaskStatus::Timeout
            ),
            _ => false,
        }
}

/// What the stream's integrity policy makes of a decision to train a rollout whose session hit rules.
fn apply_integrity_policy(decision: Decision, episode: &Episode, rule: &RewardRule) -> Decision {
    let hit: Vec<String> = episode
        .integrity_hits
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(rule, _)| rule.clone())
        .collect();
    if hit.is_empty() || matches!(decision, Decision::Reject(_)) {
        return decision;
    }
    match rule.integrity_policy() {
        IntegrityPolicy::Record => decision,
        IntegrityPolicy::Zero => zero_reward(episode),
        IntegrityPolicy::Reject => Decision::Reject(RejectReason::IntegrityViolation { rules: hit }),
    }
}

/// The harness outcome metrics of a terminal task (`arena-2026.md` 2.8): `harness_success` (`DONE`/`OK`),
/// `harness_error` (`HARNESS_FAILED`) and the one-hot `harness_error/<CODE>` over
/// [`HARNESS_OUTCOME_METRIC_CODES`] and `OTHER` (all 0 for other statuses). Unlike AReaL, which records them
/// with the episode metrics of exported rollouts only, they are recorded for every terminal task, so a
/// rejected harness failure still counts in the rate.
fn harness_metrics(scope: Scope, task: &TaskOutcome, metrics: &mut Vec<Metric>) {
    let failed = task.status == TaskStatus::HarnessFailed;
    metrics.push(scope.flag("harness_success", task.status.is_success()));
    metrics.push(scope.flag("harness_error", failed));
    let code = failed.then(|| metric_code(&task.raw));
    for c in HARNESS_OUTCOME_METRIC_CODES.iter().chain([&OTHER_CODE]) {
        metrics.push(scope.flag(format_args!("harness_error/{c}"), code == Some(*c)));
    }
}

/// `reward/integrity_hits` (every rollout, 0 without hits), `reward/integrity_hits/<rule>` for every rule the
/// stream scans with and every rule hit, and `stream/<stream>/integrity_hits`.
fn integrity_metrics(episode: &Episode, rule: &RewardRule, metrics: &mut Vec<Metric>) {
    let scope = episode.scope;
    let total: u64 = episode.integrity_hits.values().sum();
    metrics.push(scope.metric("reward/integrity_hits", total as f64));
    let unlisted = episode
        .integrity_hits
        .keys()
        .filter(|id| !rule.integrity_rules().contains(id));
    for id in rule.integrity_rules().iter().chain(unlisted) {
        let n = episode.integrity_hits.get(id).copied().unwrap_or(0);
        metrics.push(scope.metric(format_args!("reward/integrity_hits/{id}"), n as f64));
    }
    metrics.push(scope.metric(
        format_args!("stream/{}/integrity_hits", episode.row.stream_name),
        total as f64,
    ));
}

fn task_of(outcome: &Outcome) -> Option<&TaskOutcome> {
    match outcome {
        Outcome::Task(task) => Some(task),
        _ => None,
    }
}

fn zero_reward(episode: &Episode) -> Decision {
    if episode.interaction_count > 0 {
        Decision::ZeroReward
    } else {
        Decision::Reject(RejectReason::NoInteractions)
    }
}

fn route_success(
    episode: &Episode,
    task: &TaskOutcome,
    rule: &RewardRule,
    metrics: &mut Vec<Metric>,
) -> (Decision, Option<FailureDisposition>) {
    let scope = episode.scope;
    match rule.reward_of(task, &episode.row) {
        Ok(reward) => {
            metrics.push(Lifecycle::ResultProcessingSuccess.metric(scope, true));
            metrics.push(Lifecycle::TerminalSuccess.metric(scope, true));
            metrics.push(Lifecycle::CallSuccess.metric(scope, true));
            if episode.context_overflow {
                (zero_reward(episode), Some(FailureDisposition::ModelFailureZero))
            } else {
                (Decision::Train(reward), None)
            }
        }
        Err(error) => {
            metrics.push(Lifecycle::TerminalSuccess.metric(scope, true));
            metrics.push(Lifecycle::ResultProcessingSuccess.metric(scope, false));
            metrics.push(Lifecycle::CallSuccess.metric(scope, false));
            let reason = if episode.proxy_system_error {
                RejectReason::ProxySystemError
            } else {
                RejectReason::ResultProcessing {
                    message: error.to_string(),
                }
            };
            (
                Decision::Reject(reason),
                Some(FailureDisposition::SystemFailureReject),
            )
        }
    }
}

fn route_local_wait(
    episode: &Episode,
    task_id: Option<&str>,
    cancelled: bool,
    metrics: &mut Vec<Metric>,
) -> (Decision, Option<FailureDisposition>) {
    let scope = episode.scope;
    if task_id.is_some() {
        metrics.push(Lifecycle::TerminalSuccess.metric(scope, false));
    } else if !cancelled {
        metrics.push(Lifecycle::LaunchSuccess.metric(scope, false));
    }
    metrics.push(Lifecycle::CallSuccess.metric(scope, false));
    let reason = if episode.proxy_system_error {
        RejectReason::ProxySystemError
    } else {
        RejectReason::LocalWait { cancelled }
    };
    (
        Decision::Reject(reason),
        Some(FailureDisposition::SystemFailureReject),
    )
}

fn route_error(
    episode: &Episode,
    message: String,
    stage: ErrorStage,
    metrics: &mut Vec<Metric>,
    rule: &RewardRule,
) -> (Decision, Option<FailureDisposition>) {
    let scope = episode.scope;
    match stage {
        ErrorStage::BeforeLaunch => {}
        ErrorStage::Launch => {
            metrics.push(Lifecycle::LaunchSuccess.metric(scope, false));
            metrics.push(Lifecycle::CallSuccess.metric(scope, false));
        }
        ErrorStage::AfterLaunch => {
            metrics.push(Lifecycle::TerminalSuccess.metric(scope, false));
            metrics.push(Lifecycle::CallSuccess.metric(scope, false));
        }
    }
    let reason = if episode.proxy_system_error {
        RejectReason::ProxySystemError
    } else {
        RejectReason::Error { message }
    };
    (
        Decision::Reject(reason),
        Some(classify_failure(
            rule.failure_policy(),
            Failure::Other,
            episode.context_overflow,
            episode.interaction_count,
        )),
    )
}

/// The episode metrics of a trained rollout (reference `record_episode_metrics`).
fn episode_metrics(scope: Scope, row: &RowMeta, task: Option<&TaskOutcome>, reward: f64) -> Vec<Metric> {
    let task_type = row.metric_task_type();
    let stream = &row.stream_name;
    let mut metrics = vec![
        scope.metric("reward", reward),
        scope.metric("training_score", reward),
        scope.metric(format_args!("stream/{stream}/training_score"), reward),
    ];
    if let Some((task, score)) = task.and_then(|task| Some((task, task.score?))) {
        metrics.extend([
            scope.metric("arena_score", score),
            scope.metric("raw_reward", score),
            scope.metric(format_args!("{task_type}/raw_reward"), score),
            scope.metric(format_args!("domain/{task_type}/raw_reward"), score),
            scope.flag("arena_raw_present", !task.raw.is_null()),
            scope.flag("arena_trace_present", task.trace_id.is_some()),
            scope.flag("arena_artifacts_present", task.artifacts_uri.is_some()),
            scope.metric(format_args!("stream/{stream}/arena_score"), score),
        ]);
        let data_id = row.data_id.trim();
        if !data_id.is_empty() {
            metrics.push(Metric::debug(format_args!("task/{data_id}/raw_reward"), score));
        }
    }
    metrics.push(scope.metric(format_args!("{task_type}/reward"), reward));
    metrics.push(scope.metric(format_args!("domain/{task_type}/reward"), reward));
    metrics
}

#[cfg(test)]
mod tests;
