//! Task launch (E4), the result envelope parser (reference section 4.2), polling (E5) under a deadline,
//! typed failures, and best-effort cancel when we stop waiting.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use reqwest::Method;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value, json};
use stream_config::TaskStatus;
use tokio::time::Instant;

use crate::client::{ArenaClient, Call, encode_segment};
use crate::hooks::{NoHooks, RolloutHooks};
use crate::retry::Delivery;
use crate::{Error, Result};

/// The task id a launch reply falls back to when it carries none.
pub const LAUNCH_FALLBACK_TASK_ID: &str = "launch_one_task";

const CONTROL_FIELDS: [&str; 7] = [
    "task_id",
    "status",
    "score",
    "raw",
    "artifacts_uri",
    "trace_id",
    "computed_at",
];
const WRAPPERS: [&str; 4] = ["result", "output", "task", "data"];

/// The body of `launch_one_task`.
#[derive(Clone)]
pub struct LaunchRequest {
    /// The row to run.
    pub data_id: String,
    /// The model the harness asks for.
    pub model_name: String,
    /// Where the harness sends LLM calls.
    pub base_url: String,
    /// The key the harness presents there.
    pub api_key: SecretString,
    /// Extra harness environment. Values may be credentials; `Debug` shows names only.
    pub envs: BTreeMap<String, String>,
    /// The rollout session id.
    pub session_id: Option<String>,
    /// `key@version`; `None` runs the stream's default harness.
    pub harness: Option<String>,
}

impl fmt::Debug for LaunchRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchRequest")
            .field("data_id", &self.data_id)
            .field("model_name", &self.model_name)
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("envs", &self.envs.keys().collect::<Vec<_>>())
            .field("session_id", &self.session_id)
            .field("harness", &self.harness)
            .finish()
    }
}

impl LaunchRequest {
    /// The wire body: `envs` gets `MODEL_NAME`, `BASE_URL` and `API_KEY` overwritten with the top-level
    /// values (reference section 4.1 step 6).
    pub fn to_wire(&self) -> Result<Value> {
        for (field, value) in [
            ("data_id", &self.data_id),
            ("model_name", &self.model_name),
            ("base_url", &self.base_url),
        ] {
            if value.trim().is_empty() {
                return Err(Error::Invalid(format!(
                    "launch request {field} must not be empty"
                )));
            }
        }
        if self.api_key.expose_secret().is_empty() {
            return Err(Error::Invalid(
                "launch request api_key must not be empty".to_string(),
            ));
        }
        if self.envs.keys().any(String::is_empty) {
            return Err(Error::Invalid(
                "launch request envs keys must not be empty".to_string(),
            ));
        }
        let mut envs: Map<String, Value> = self
            .envs
            .iter()
            .map(|(k, v)| (k.clone(), Value::String(v.clone())))
            .collect();
        envs.insert("MODEL_NAME".into(), json!(self.model_name));
        envs.insert("BASE_URL".into(), json!(self.base_url));
        envs.insert("API_KEY".into(), json!(self.api_key.expose_secret()));
        let mut body = json!({
            "data_id": self.data_id,
            "model_name": self.model_name,
            "base_url": self.base_url,
            "api_key": self.api_key.expose_secret(),
            "envs": envs,
        });
        if let Some(s) = self.session_id.as_deref().filter(|s| !s.is_empty()) {
            body["session_id"] = json!(s);
        }
        if let Some(h) = self.harness.as_deref().filter(|h| !h.is_empty()) {
            body["harness"] = json!(h);
        }
        Ok(body)
    }
}

/// A parsed task-result envelope.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskResult {
    /// The task id (the fallback when the envelope carried none).
    pub task_id: String,
    /// The status, trimmed and upper-cased.
    pub status: TaskStatus,
    /// The top-level score; the only reward input.
    pub score: Option<f64>,
    /// The grader payload, verbatim and never searched (`Null` when absent).
    pub raw: Value,
    /// `artifacts_uri`.
    pub artifacts_uri: Option<String>,
    /// `trace_id`.
    pub trace_id: Option<String>,
    /// `computed_at`.
    pub computed_at: Option<String>,
}

fn optional_string(obj: &Map<String, Value>, field: &str) -> Result<Option<String>, String> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!("{field} must be a string or null, got {other}")),
    }
}

/// Parses a result envelope (reference section 4.2): a bare number, or an object with control fields,
/// possibly wrapped (up to 4 levels) in `result`, `output`, `task` or `data`. Only the top-level `score`
/// counts; `raw` is kept verbatim.
pub fn parse_task_result(value: &Value, fallback_task_id: &str) -> Result<TaskResult, String> {
    if let Value::Number(n) = value {
        let score = n
            .as_f64()
            .filter(|s| s.is_finite())
            .ok_or("score must be finite")?;
        return Ok(TaskResult {
            task_id: fallback_task_id.to_string(),
            status: TaskStatus::Done,
            score: Some(score),
            raw: Value::Null,
            artifacts_uri: None,
            trace_id: None,
            computed_at: None,
        });
    }
    let mut current = value;
    for _ in 0..4 {
        let Some(obj) = current.as_object() else { break };
        if CONTROL_FIELDS.iter().any(|f| obj.contains_key(*f)) {
            break;
        }
        match WRAPPERS.iter().find_map(|w| obj.get(*w)) {
            Some(inner) => current = inner,
            None => break,
        }
    }
    let obj = current
        .as_object()
        .ok_or_else(|| format!("task result must be an object or a number, got {current}"))?;
    let task_id = match obj.get("task_id") {
        None | Some(Value::Null) => fallback_task_id.to_string(),
        Some(Value::String(s)) if !s.trim().is_empty() => s.clone(),
        Some(other) => return Err(format!("task_id must be a non-empty string, got {other}")),
    };
    let status = match obj.get("status") {
        None | Some(Value::Null) if obj.contains_key("score") => TaskStatus::Done,
        None | Some(Value::Null) if matches!(obj.get("task_id"), Some(Value::String(_))) => {
            TaskStatus::parse("PENDING")
        }
        Some(Value::String(s)) if !s.trim().is_empty() => TaskStatus::parse(s),
        other => {
            return Err(format!(
                "status must be a non-blank string, got {}",
                other.map_or_else(|| "nothing".to_string(), Value::to_string)
            ));
        }
    };
    let score = match obj.get("score") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => Some(
            n.as_f64()
                .filter(|s| s.is_finite())
                .ok_or_else(|| format!("score must be finite, got {n}"))?,
        ),
        Some(other) => return Err(format!("score must be a number or null, got {other}")),
    };
    Ok(TaskResult {
        task_id,
        status,
        score,
        raw: obj.get("raw").cloned().unwrap_or(Value::Null),
        artifacts_uri: optional_string(obj, "artifacts_uri")?,
        trace_id: optional_string(obj, "trace_id")?,
        computed_at: optional_string(obj, "computed_at")?,
    })
}

/// A task that Arena ran and that ended in a failure status.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("arena task {task_id} failed with status {status}")]
pub struct TaskFailed {
    /// The task id.
    pub task_id: String,
    /// The failure status.
    pub status: TaskStatus,
    /// The reply that reported it, verbatim.
    pub payload: Value,
    /// The parsed reply, `raw` included.
    pub result: TaskResult,
}

/// What a launch reply said.
#[derive(Debug, Clone, PartialEq)]
pub enum Launched {
    /// The task already finished with a score.
    Finished(TaskResult),
    /// The task is queued or running; poll it.
    Running {
        /// The task id to poll.
        task_id: String,
    },
}

/// What a cancel request achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// Arena accepted the cancel.
    Cancelled,
    /// This Arena has no cancel endpoint (404 or 405).
    Unsupported,
}

/// Options of [`ArenaClient::run_task`].
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    /// The whole launch-and-poll deadline (the reference's episode `timeout`, 1800 s).
    pub timeout: Duration,
    /// Sent as `Idempotency-Key`.
    pub idempotency_key: Option<String>,
    /// Arena honours `idempotency_key` (a repeated key answers the task already started): only then is a
    /// launch retried after it may have reached Arena.
    pub key_honoured: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self {
            timeout: Duration::from_secs(1800),
            idempotency_key: None,
            key_honoured: false,
        }
    }
}

/// What happened to one task.
#[derive(Debug)]
pub struct TaskRun {
    /// The launch request was sent (the caller's `before_launch` hook let it go).
    pub launch_attempted: bool,
    /// The launch was answered with a queued, running or finished task (the reference's `launch_success`);
    /// a launch answered with a failure status counts as not launched.
    pub launched: bool,
    /// A success status with a score arrived.
    pub terminal: bool,
    /// The task id, once known.
    pub task_id: Option<String>,
    /// The result, a typed failure, or why we stopped.
    pub result: Result<TaskResult>,
}

impl TaskRun {
    fn not_launched(launch_attempted: bool, task_id: Option<String>, result: Result<TaskResult>) -> Self {
        Self {
            launch_attempted,
            launched: false,
            terminal: false,
            task_id,
            result,
        }
    }
}

fn terminal_score(op: &str, result: &TaskResult) -> Result<()> {
    if result.score.is_none() {
        return Err(Error::malformed(
            op,
            format!(
                "terminal response for task {} is missing top-level 'score'",
                result.task_id
            ),
        ));
    }
    Ok(())
}

fn failed(payload: Value, result: TaskResult) -> Error {
    Error::TaskFailed(Box::new(TaskFailed {
        task_id: result.task_id.clone(),
        status: result.status.clone(),
        payload,
        result,
    }))
}

/// Cancels a task when dropped while armed, so a dropped wait does not leave the task running in Arena.
struct CancelOnDrop {
    client: ArenaClient,
    task_id: Option<String>,
}

impl CancelOnDrop {
    fn disarm(&mut self) {
        self.task_id = None;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        let Some(task_id) = self.task_id.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(handle) => {
                let client = self.client.clone();
                handle.spawn(async move { client.cancel_task_best_effort(&task_id).await });
            }
            Err(_) => tracing::warn!(%task_id, "no runtime to cancel an abandoned Arena task"),
        }
    }
}

impl ArenaClient {
    /// E4: launches one task. Without an idempotency key the request is sent at most once past the point
    /// where it may have reached Arena; with one, it is retried like any other call and the key is sent as
    /// `Idempotency-Key`.
    pub async fn launch_one_task(
        &self,
        stream_id: &str,
        request: &LaunchRequest,
        idempotency_key: Option<&str>,
    ) -> Result<Launched> {
        self.launch_keyed(stream_id, request, idempotency_key, idempotency_key.is_some())
            .await
    }

    /// [`ArenaClient::launch_one_task`] with the key sent whether or not Arena honours it: only when
    /// `honoured` (Arena answers a repeated key with the task it already started) is the launch retried
    /// after it may have reached Arena; otherwise the key only lets an Arena that dedupes find the task of
    /// a launch a killed process sent.
    pub async fn launch_keyed(
        &self,
        stream_id: &str,
        request: &LaunchRequest,
        idempotency_key: Option<&str>,
        honoured: bool,
    ) -> Result<Launched> {
        let body = request.to_wire()?;
        let mut call = Call::new(
            Method::POST,
            format!("/streams/{}/launch_one_task", encode_segment(stream_id)),
        )
        .json(&body);
        call.delivery = if idempotency_key.is_some() && honoured {
            Delivery::Repeatable
        } else {
            Delivery::AtMostOnce
        };
        call.idempotency_key = idempotency_key;
        let op = call.op();
        let reply = self.send_json(&call).await?;
        let result =
            parse_task_result(&reply, LAUNCH_FALLBACK_TASK_ID).map_err(|m| Error::malformed(&op, m))?;
        if result.status.is_failure() {
            return Err(failed(reply, result));
        }
        if result.status.is_success() {
            terminal_score(&op, &result)?;
            return Ok(Launched::Finished(result));
        }
        if result.task_id == LAUNCH_FALLBACK_TASK_ID {
            return Err(Error::malformed(
                &op,
                format!("non-terminal status {} without a task_id", result.status),
            ));
        }
        Ok(Launched::Running {
            task_id: result.task_id,
        })
    }

    /// E5 once: the task's current result. The returned id must be the polled one.
    pub async fn get_task_result(&self, task_id: &str) -> Result<(TaskResult, Value)> {
        let call = Call::new(Method::GET, format!("/tasks/{}/result", encode_segment(task_id)));
        let op = call.op();
        let reply = self.send_json(&call).await?;
        let result = parse_task_result(&reply, task_id).map_err(|m| Error::malformed(&op, m))?;
        if result.task_id != task_id {
            return Err(Error::malformed(
                &op,
                format!("returned task_id {:?} while polling {task_id:?}", result.task_id),
            ));
        }
        Ok((result, reply))
    }

    /// Polls until the task ends: a success with a score, or a typed [`TaskFailed`].
    ///
    /// Past `deadline` it cancels the task (best effort) and fails with [`Error::Timeout`]; if this future is
    /// dropped or polling fails first, the task is cancelled in the background.
    pub async fn wait_for_task(
        &self,
        task_id: &str,
        data_id: &str,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<TaskResult> {
        let mut guard = CancelOnDrop {
            client: self.clone(),
            task_id: Some(task_id.to_string()),
        };
        let poll = async {
            loop {
                let (result, reply) = self.get_task_result(task_id).await?;
                if result.status.is_failure() {
                    return Err(failed(reply, result));
                }
                if result.status.is_success() {
                    terminal_score(
                        &format!("GET /openapi/v1/tasks/{}/result", encode_segment(task_id)),
                        &result,
                    )?;
                    return Ok(result);
                }
                tokio::time::sleep(self.inner.poll_interval).await;
            }
        };
        match tokio::time::timeout_at(deadline, poll).await {
            Ok(outcome) => {
                if matches!(&outcome, Ok(_) | Err(Error::TaskFailed(_))) {
                    guard.disarm();
                }
                outcome
            }
            Err(_) => {
                guard.disarm();
                tracing::warn!(
                    "arena task timed out: task_id={task_id}, data_id={data_id}, timeout_seconds={}",
                    timeout.as_secs_f64()
                );
                self.cancel_task_best_effort(task_id).await;
                Err(Error::Timeout {
                    task_id: Some(task_id.to_string()),
                    data_id: data_id.to_string(),
                    timeout_seconds: timeout.as_secs_f64(),
                })
            }
        }
    }

    /// Launch then poll under one deadline; reports how far the task got.
    pub async fn run_task(&self, stream_id: &str, request: &LaunchRequest, options: &RunOptions) -> TaskRun {
        self.run_task_with(stream_id, request, options, &NoHooks).await
    }

    /// [`ArenaClient::run_task`], calling `hooks` before the launch, once a task id is known (before
    /// polling) and once that task is done. A failing hook stops the run: nothing more is sent, a task
    /// already running is cancelled (best effort), and the result is [`Error::Hook`].
    pub async fn run_task_with(
        &self,
        stream_id: &str,
        request: &LaunchRequest,
        options: &RunOptions,
        hooks: &dyn RolloutHooks,
    ) -> TaskRun {
        let deadline = Instant::now() + options.timeout;
        let key = options.idempotency_key.as_deref();
        if let Err(e) = hooks.before_launch(key) {
            let moment = format!("before launching row {}", request.data_id);
            return TaskRun::not_launched(false, None, Err(Error::hook(moment, &e)));
        }
        let launch = self.launch_keyed(stream_id, request, key, options.key_honoured);
        let launched = match tokio::time::timeout_at(deadline, launch).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                // A launch answered with a failure status has a task id but never ran as launched (the
                // reference's launch_success stays 0).
                let task_id = e.task_failed().map(|t| t.task_id.clone());
                return TaskRun::not_launched(true, task_id, Err(e));
            }
            Err(_) => {
                tracing::warn!(
                    "arena task timed out: task_id=<not launched>, data_id={}, timeout_seconds={}",
                    request.data_id,
                    options.timeout.as_secs_f64()
                );
                let timeout = Error::Timeout {
                    task_id: None,
                    data_id: request.data_id.clone(),
                    timeout_seconds: options.timeout.as_secs_f64(),
                };
                return TaskRun::not_launched(true, None, Err(timeout));
            }
        };
        let task_id = match launched {
            Launched::Finished(result) => {
                return TaskRun {
                    launch_attempted: true,
                    launched: true,
                    terminal: true,
                    task_id: Some(result.task_id.clone()),
                    result: Ok(result),
                };
            }
            Launched::Running { task_id } => task_id,
        };
        let mut result = match hooks.task_started(&task_id) {
            Ok(()) => {
                self.wait_for_task(&task_id, &request.data_id, deadline, options.timeout)
                    .await
            }
            Err(e) => {
                self.cancel_task_best_effort(&task_id).await;
                Err(Error::hook(format!("before polling task {task_id}"), &e))
            }
        };
        if let Err(e) = hooks.task_finished(&task_id) {
            result = Err(Error::hook(format!("after task {task_id} finished"), &e));
        }
        TaskRun {
            launch_attempted: true,
            launched: true,
            terminal: result.is_ok(),
            task_id: Some(task_id),
            result,
        }
    }

    /// `POST /openapi/v1/tasks/{task_id}/cancel`. A 404 or 405 means this Arena has no cancel endpoint.
    pub async fn cancel_task(&self, task_id: &str) -> Result<CancelOutcome> {
        let call = Call::new(Method::POST, format!("/tasks/{}/cancel", encode_segment(task_id)));
        let reply = self.send(&call).await?;
        match reply.status {
            200..=299 => Ok(CancelOutcome::Cancelled),
            404 | 405 => Ok(CancelOutcome::Unsupported),
            _ => Err(reply.status_error()),
        }
    }

    /// Cancels and logs instead of failing; an Arena without the endpoint is reported once per client. With
    /// `ClientConfig::cancel_tasks` off nothing is sent: the first abandoned task is named in a warning (the
    /// rest at debug level) and the outcome is [`CancelOutcome::Unsupported`].
    pub async fn cancel_task_best_effort(&self, task_id: &str) -> Option<CancelOutcome> {
        if !self.inner.cancel_tasks {
            if self.inner.cancel_unsupported.swap(true, Ordering::Relaxed) {
                tracing::debug!(%task_id, "abandoned Arena task left running (no cancel endpoint)");
            } else {
                tracing::warn!(
                    %task_id,
                    "this Arena has no task cancel endpoint (by configuration): abandoned tasks, this one \
                     first, keep running until Arena ends them"
                );
            }
            return Some(CancelOutcome::Unsupported);
        }
        match self.cancel_task(task_id).await {
            Ok(CancelOutcome::Unsupported) => {
                if !self.inner.cancel_unsupported.swap(true, Ordering::Relaxed) {
                    tracing::warn!("this Arena has no task cancel endpoint; abandoned tasks keep running");
                }
                Some(CancelOutcome::Unsupported)
            }
            Ok(o) => {
                tracing::info!(%task_id, "cancelled abandoned Arena task");
                Some(o)
            }
            Err(e) => {
                tracing::warn!(%task_id, error = %e, "could not cancel abandoned Arena task");
                None
            }
        }
    }
}

#[cfg(test)]
mod tests;
