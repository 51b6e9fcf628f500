//! Harnesses: what runs a launched task and decides its outcome.
//!
//! A [`Harness`] receives everything Arena would hand a real harness (the full launch request and the row's
//! dataset metadata) and returns how the launch is answered plus a future for the outcome.
//! This crate ships [`ScriptedHarness`], which returns configured outcomes, and the runners of
//! [`crate::runner`], which call a model over HTTP or run an external command and grade the result.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::watch;

use crate::tasks::TaskFamily;

/// The body of a `launch_one_task` request, as the sim received it.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchRequest {
    /// The dataset row to run.
    pub data_id: String,
    /// The model the harness must ask for.
    pub model_name: String,
    /// Where the harness sends its LLM calls (the gateway or, in direct mode, the rollout proxy).
    pub base_url: String,
    /// The key the harness presents there.
    pub api_key: String,
    /// Extra environment for the harness.
    #[serde(default)]
    pub envs: BTreeMap<String, String>,
    /// The rollout session, when the caller has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// `key@version` of the harness to run; `None` means the stream's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub harness: Option<String>,
}

impl std::fmt::Debug for LaunchRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
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

/// What a harness gets for one task.
#[derive(Debug, Clone)]
pub struct HarnessContext {
    /// The task id Arena assigned.
    pub task_id: String,
    /// The stream the task belongs to.
    pub stream_id: String,
    /// The launch request, verbatim.
    pub request: LaunchRequest,
    /// The harness actually run: the request's `harness` or the stream's default, as `key@version`.
    pub harness: Option<String>,
    /// The row's dataset tags, as served.
    pub tags: Value,
    /// The row's task family: its `domain:max`/`domain:min` tag, else its stream's `task_family`.
    pub task_family: Option<TaskFamily>,
    /// The gateway URL of this Arena (`{base}/api`).
    pub gateway_url: String,
    pub(crate) status: watch::Sender<String>,
}

impl HarnessContext {
    /// Sets the status that polls report while the harness runs (`AGENT_RUNNING`, ...).
    pub fn set_status(&self, status: &str) {
        self.status.send_replace(status.to_string());
    }
}

/// How the launch request is answered.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LaunchReply {
    /// Answer 202 at once with `PENDING` (and a placeholder score, if any); the outcome comes from polls.
    Pending {
        /// A placeholder `score` in the reply, as some Arena versions send.
        #[serde(default)]
        placeholder_score: Option<f64>,
    },
    /// Wait for the outcome and answer with it directly.
    Final,
}

impl Default for LaunchReply {
    fn default() -> Self {
        Self::Pending {
            placeholder_score: None,
        }
    }
}

/// The shape of a result reply (reference section 4.2 lists the legacy ones).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Envelope {
    /// `{task_id, status, score, raw, artifacts_uri, trace_id, computed_at}`.
    #[default]
    Plain,
    /// `{"data": {...}}`.
    Data,
    /// `{"result": {"output": {...}}}`.
    ResultOutput,
    /// `{"task": {...}}`.
    Task,
    /// The bare score as a JSON number.
    BareNumber,
}

/// How a task ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HarnessOutcome {
    /// The terminal status (`DONE`, `HARNESS_FAILED`, ...).
    pub status: String,
    /// The top-level score; `None` leaves the field out.
    pub score: Option<f64>,
    /// The grader's payload, served verbatim.
    pub raw: Value,
    /// Where artifacts live.
    pub artifacts_uri: Option<String>,
    /// The trace id.
    pub trace_id: Option<String>,
    /// When the score was computed.
    pub computed_at: Option<String>,
    /// Statuses that the next polls report, one each, before the outcome shows.
    pub progress: Vec<String>,
    /// The reply shape.
    pub envelope: Envelope,
}

/// One started task: how to answer the launch, and the outcome to come.
pub struct HarnessRun {
    /// How the launch is answered.
    pub reply: LaunchReply,
    /// Resolves to the outcome; dropped if the task is cancelled.
    pub outcome: BoxFuture<'static, HarnessOutcome>,
}

/// Runs launched tasks. Implementations must be cheap to call; the work goes into the returned future.
pub trait Harness: Send + Sync + 'static {
    /// Starts one task.
    fn start(&self, ctx: HarnessContext) -> HarnessRun;
}

/// One scripted outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedOutcome {
    /// The terminal status.
    #[serde(default = "done")]
    pub status: String,
    /// The top-level score; leave it out to serve a result without one.
    #[serde(default)]
    pub score: Option<f64>,
    /// The grader payload.
    #[serde(default)]
    pub raw: Value,
    /// `artifacts_uri`.
    #[serde(default)]
    pub artifacts_uri: Option<String>,
    /// `trace_id`.
    #[serde(default)]
    pub trace_id: Option<String>,
    /// `computed_at`.
    #[serde(default)]
    pub computed_at: Option<String>,
    /// How the launch is answered.
    #[serde(default)]
    pub reply: LaunchReply,
    /// The status polls report while the task runs.
    #[serde(default = "running")]
    pub running_status: String,
    /// Statuses the polls after completion report, one each, before the outcome.
    #[serde(default)]
    pub progress: Vec<String>,
    /// How long the task runs, in milliseconds.
    #[serde(default)]
    pub delay_ms: u64,
    /// The task runs until [`ScriptedHarness::open_gate`] opens the gate of this name.
    #[serde(default)]
    pub gate: Option<String>,
    /// The reply shape.
    #[serde(default)]
    pub envelope: Envelope,
}

fn done() -> String {
    "DONE".to_string()
}

fn running() -> String {
    "AGENT_RUNNING".to_string()
}

impl Default for ScriptedOutcome {
    fn default() -> Self {
        Self::done(1.0)
    }
}

impl ScriptedOutcome {
    /// `DONE` with this score.
    pub fn done(score: f64) -> Self {
        Self {
            status: done(),
            score: Some(score),
            raw: Value::Null,
            artifacts_uri: None,
            trace_id: None,
            computed_at: None,
            reply: LaunchReply::default(),
            running_status: running(),
            progress: Vec::new(),
            delay_ms: 0,
            gate: None,
            envelope: Envelope::Plain,
        }
    }

    /// A terminal status with this score.
    pub fn status(status: &str, score: Option<f64>) -> Self {
        Self {
            status: status.to_string(),
            score,
            ..Self::done(0.0)
        }
    }

    /// Sets the raw payload.
    pub fn raw(mut self, raw: Value) -> Self {
        self.raw = raw;
        self
    }

    /// Sets the launch reply.
    pub fn reply(mut self, reply: LaunchReply) -> Self {
        self.reply = reply;
        self
    }

    /// Sets the statuses shown by polls before the outcome.
    pub fn progress(mut self, statuses: &[&str]) -> Self {
        self.progress = statuses.iter().map(|s| s.to_string()).collect();
        self
    }

    /// Holds the task until the named gate opens.
    pub fn gate(mut self, name: &str) -> Self {
        self.gate = Some(name.to_string());
        self
    }

    /// Runs the task for this long.
    pub fn delay(mut self, d: Duration) -> Self {
        self.delay_ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        self
    }

    /// Sets the reply shape.
    pub fn envelope(mut self, envelope: Envelope) -> Self {
        self.envelope = envelope;
        self
    }
}

/// The scripted harness's configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedConfig {
    /// The outcome of rows not listed below.
    #[serde(default)]
    pub default: ScriptedOutcome,
    /// Outcomes by `data_id`.
    #[serde(default)]
    pub by_data_id: BTreeMap<String, ScriptedOutcome>,
}

/// A harness that returns configured outcomes; outcomes can be changed while the sim runs.
pub struct ScriptedHarness {
    config: Mutex<ScriptedConfig>,
    gates: Mutex<HashMap<String, watch::Sender<bool>>>,
}

impl ScriptedHarness {
    /// A scripted harness with this configuration.
    pub fn new(config: ScriptedConfig) -> Self {
        Self {
            config: Mutex::new(config),
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// Sets the outcome for one row.
    pub fn set_outcome(&self, data_id: &str, outcome: ScriptedOutcome) {
        lock(&self.config).by_data_id.insert(data_id.to_string(), outcome);
    }

    /// Sets the outcome of rows without their own.
    pub fn set_default(&self, outcome: ScriptedOutcome) {
        lock(&self.config).default = outcome;
    }

    /// Opens a gate: tasks waiting on it (now or later) finish.
    pub fn open_gate(&self, name: &str) {
        self.gate(name).send_replace(true);
    }

    fn gate(&self, name: &str) -> watch::Sender<bool> {
        lock(&self.gates)
            .entry(name.to_string())
            .or_insert_with(|| watch::channel(false).0)
            .clone()
    }

    fn outcome_for(&self, data_id: &str) -> ScriptedOutcome {
        let config = lock(&self.config);
        config.by_data_id.get(data_id).unwrap_or(&config.default).clone()
    }
}

impl Harness for ScriptedHarness {
    fn start(&self, ctx: HarnessContext) -> HarnessRun {
        let script = self.outcome_for(&ctx.request.data_id);
        let gate = script.gate.as_deref().map(|g| self.gate(g).subscribe());
        let reply = script.reply;
        let outcome = Box::pin(async move {
            ctx.set_status(&script.running_status);
            if script.delay_ms > 0 {
                tokio::time::sleep(Duration::from_millis(script.delay_ms)).await;
            }
            if let Some(mut gate) = gate {
                // An error means the harness was dropped with the sim; the task then never finishes.
                if gate.wait_for(|open| *open).await.is_err() {
                    futures::future::pending::<()>().await;
                }
            }
            HarnessOutcome {
                status: script.status,
                score: script.score,
                raw: script.raw,
                artifacts_uri: script.artifacts_uri,
                trace_id: script.trace_id,
                computed_at: script.computed_at,
                progress: script.progress,
                envelope: script.envelope,
            }
        });
        HarnessRun { reply, outcome }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these locks cannot leave the plain data inside inconsistent.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Harnesses by key, with the scripted harness as the fallback.
#[derive(Clone)]
pub(crate) struct HarnessSet {
    pub(crate) by_key: HashMap<String, Arc<dyn Harness>>,
    pub(crate) fallback: Arc<dyn Harness>,
}

impl HarnessSet {
    /// The harness for a `key@version` (or bare key) string.
    pub(crate) fn select(&self, harness: Option<&str>) -> Arc<dyn Harness> {
        let key = harness.map(|h| h.split('@').next().unwrap_or(h));
        key.and_then(|k| self.by_key.get(k))
            .unwrap_or(&self.fallback)
            .clone()
    }
}
