//! The crate's own input types: the row a rollout ran, what Arena reported for its task, and what the proxy
//! saw of the session. They hold plain fields so that the crate does not care how results were fetched.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use stream_config::{RewardRef, TaskStatus, UNKNOWN_TASK_TYPE, metric_task_type};

use crate::metrics::Scope;

/// The dataset row a rollout ran, as far as rewards, metrics and audit records need it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RowMeta {
    /// Arena's id of the row (`data_id`).
    pub data_id: String,
    /// The configured stream name (`arena_stream_name`); used in metric names and audit records.
    pub stream_name: String,
    /// Arena's stream id.
    pub stream_id: String,
    /// The row's task type from its `domain:` tag (`arena_task_type`); see [`RowMeta::metric_task_type`].
    pub task_type: String,
    /// The grader version the stream pins (`expected_reward_ref`), empty when none.
    pub expected_reward_ref: RewardRef,
}

impl RowMeta {
    /// The task type as metric names use it: trimmed, or `unknown` when blank.
    pub fn metric_task_type(&self) -> &str {
        metric_task_type(&self.task_type)
    }
}

/// The task type of a row held as JSON (`arena_task_type`): a non-blank string, trimmed; anything else (missing,
/// null, a number, blank) is `unknown`.
pub fn task_type_from_json(value: Option<&Value>) -> String {
    match value {
        Some(Value::String(s)) => metric_task_type(s).to_string(),
        _ => UNKNOWN_TASK_TYPE.to_string(),
    }
}

/// What Arena reported for a task: the parsed result envelope of reference section 4.2.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskOutcome {
    /// Arena's task id.
    pub task_id: String,
    /// The task's status.
    pub status: TaskStatus,
    /// The top-level `score`, the only reward input; `None` when absent or null.
    pub score: Option<f64>,
    /// The opaque `raw` payload, kept verbatim and never searched for rewards; `Null` when absent.
    pub raw: Value,
    /// `artifacts_uri`, if any.
    pub artifacts_uri: Option<String>,
    /// `trace_id`, if any.
    pub trace_id: Option<String>,
    /// `computed_at`, if any.
    pub computed_at: Option<String>,
}

impl TaskOutcome {
    /// An outcome with the given id, status and score, and no `raw`, trace, artifacts or timestamp.
    pub fn new(task_id: impl Into<String>, status: TaskStatus, score: Option<f64>) -> Self {
        Self {
            task_id: task_id.into(),
            status,
            score,
            raw: Value::Null,
            artifacts_uri: None,
            trace_id: None,
            computed_at: None,
        }
    }
}

/// Where an error that is not a typed task failure happened; it decides which lifecycle metrics the error
/// records (reference `arena_agent.py`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorStage {
    /// Before the launch request (route setup, reward-ref checks): the workflow records those stages' own
    /// metrics, so routing records no lifecycle metric.
    BeforeLaunch,
    /// The launch request itself failed: `arena/launch_success = 0`, `arena/call_success = 0`.
    Launch,
    /// The task was launched and then polling failed: `arena/terminal_success = 0`, `arena/call_success = 0`.
    AfterLaunch,
}

/// How a rollout's Arena task ended, from the workflow's point of view.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// Arena reported the task's result: a success status (`DONE`, `OK`) becomes a reward, a failure status a
    /// typed failure for the classifier. A status that is not terminal counts as an error.
    Task(TaskOutcome),
    /// We stopped waiting before Arena finished: our deadline passed, or the rollout was cancelled.
    LocalWait {
        /// The task id, when the launch had returned one.
        task_id: Option<String>,
        /// `true` for a cancellation, `false` for a timeout.
        cancelled: bool,
    },
    /// Anything that is not a typed Arena task failure: transport, API, malformed response, route setup.
    Error {
        /// What went wrong; it must not contain a secret.
        message: String,
        /// Where it went wrong.
        stage: ErrorStage,
    },
}

/// Everything routing needs to know about one finished rollout.
#[derive(Debug, Clone, PartialEq)]
pub struct Episode {
    /// The row the rollout ran.
    pub row: RowMeta,
    /// How its Arena task ended.
    pub outcome: Outcome,
    /// The number of interactions the proxy recorded for the session (`end_session`'s `interaction_count`).
    pub interaction_count: u64,
    /// The proxy refused a request of this session because it overflowed the context.
    pub context_overflow: bool,
    /// The proxy answered a request of this session with an internal error.
    pub proxy_system_error: bool,
    /// Integrity rule hits in the session's generations, per rule id (`end_session`'s `integrity_hits`);
    /// what they cost is the stream's [`crate::RewardRule::integrity_policy`].
    pub integrity_hits: BTreeMap<String, u64>,
    /// Training rollouts record under `rollout/`, evaluation rollouts under `eval-rollout/`.
    pub scope: Scope,
    /// The proxy session the rollout ran in, for audit records and episode metadata; `None` when it never
    /// had one.
    pub session_id: Option<String>,
}

/// One integrity hit as audit records keep it: the rule and the command it matched.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct IntegrityFinding {
    /// The rule's id.
    pub rule: String,
    /// The command it matched, unwrapped and shell-quoted as the guard reports it.
    pub matched: String,
}
