//! What E4 (`launch_one_task`) does under the state lock: an idempotent replay, the stream and row checks,
//! the route check for launches through the gateway, the task's creation and the launch counters.
//!
//! It knows nothing about HTTP: it says why a launch is refused, and the handler says how to answer.

use std::collections::VecDeque;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::{ArenaState, TaskState};
use crate::harness::{HarnessContext, LaunchReply, LaunchRequest};
use crate::tasks::TaskFamily;
use crate::world::RefDef;

/// The settings of the running Arena a launch needs.
pub(crate) struct LaunchSettings<'a> {
    /// Prepended to the task counter to make task ids.
    pub(crate) task_id_prefix: &'a str,
    /// The LLM gateway's URL: a launch whose `base_url` is this one goes through the gateway.
    pub(crate) gateway_url: &'a str,
    /// The gateway's LLM key (`None`: any key).
    pub(crate) llm_api_key: Option<&'a str>,
}

/// A launch that went ahead.
#[derive(Debug)]
pub(crate) enum Launched {
    /// The `Idempotency-Key` named an earlier launch: its task's envelope, as a poll sees it now.
    Replayed(Value),
    /// A new task, and how its harness answers the launch.
    Started { task_id: String, reply: LaunchReply },
}

/// Why a launch is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LaunchRefused {
    /// No stream has this id.
    UnknownStream,
    /// The stream's status is not `ACTIVE`.
    StreamNotActive,
    /// The `data_id` is not a row of the stream's dataset (an `env:<key>@<version>` id matches a row of the
    /// same environment key in any version).
    UnknownRow,
    /// A launch through the gateway with an `api_key` that is not the gateway's LLM key.
    WrongGatewayKey,
    /// A launch through the gateway for a `model_name` that is not a registered route.
    UnknownRoute,
}

/// What the checks learned about a launch before its task exists.
struct Checked {
    tags: Value,
    task_family: Option<TaskFamily>,
    harness: Option<String>,
    reward_ref: Option<RefDef>,
}

impl ArenaState {
    /// Launches one task (or replays an earlier launch with the same `idempotency_key`).
    ///
    /// `start` runs the task's harness with its context and answers the launch reply and a handle that
    /// aborts the run; it is called only for a new task, after every check passed.
    pub(crate) fn launch(
        &mut self,
        stream_id: &str,
        request: &LaunchRequest,
        idempotency_key: Option<String>,
        settings: &LaunchSettings<'_>,
        start: impl FnOnce(HarnessContext) -> (LaunchReply, Option<AbortHandle>),
    ) -> Result<Launched, LaunchRefused> {
        if let Some(existing) = idempotency_key
            .as_ref()
            .and_then(|k| self.idempotency.get(k).cloned())
        {
            self.counters.idempotent_replays += 1;
            let envelope = self.tasks.get_mut(&existing).map(TaskState::poll);
            return Ok(Launched::Replayed(envelope.unwrap_or(Value::Null)));
        }
        let checked = self.check_launch(stream_id, request, settings)?;
        let task_id = format!("{}{}", settings.task_id_prefix, self.next_task);
        self.next_task += 1;
        let (status_tx, status_rx) = watch::channel("PENDING".to_string());
        let ctx = HarnessContext {
            task_id: task_id.clone(),
            stream_id: stream_id.to_string(),
            request: request.clone(),
            harness: checked.harness.clone(),
            tags: checked.tags,
            task_family: checked.task_family,
            gateway_url: settings.gateway_url.to_string(),
            status: status_tx,
        };
        let (reply, abort) = start(ctx);
        let placeholder_score = match reply {
            LaunchReply::Pending { placeholder_score } => placeholder_score,
            LaunchReply::Final => None,
        };
        self.tasks.insert(
            task_id.clone(),
            TaskState {
                task_id: task_id.clone(),
                stream_id: stream_id.to_string(),
                harness_ref: checked.harness.as_deref().and_then(parse_ref),
                reward_ref: checked.reward_ref,
                status: status_rx,
                outcome: None,
                progress: VecDeque::new(),
                abort,
                placeholder_score,
            },
        );
        self.count_launch(stream_id, &task_id, request, idempotency_key);
        Ok(Launched::Started { task_id, reply })
    }

    /// The stream, row and route checks; touches the route of a launch through the gateway.
    fn check_launch(
        &mut self,
        stream_id: &str,
        request: &LaunchRequest,
        settings: &LaunchSettings<'_>,
    ) -> Result<Checked, LaunchRefused> {
        let stream = self.stream(stream_id).ok_or(LaunchRefused::UnknownStream)?;
        if stream.def.status.as_deref() != Some("ACTIVE") {
            return Err(LaunchRefused::StreamNotActive);
        }
        let row = stream
            .rows
            .iter()
            .find(|r| r.data_id == request.data_id)
            .or_else(|| {
                // A pinned version of an environment runs like the row of the same key the stream lists.
                let key = stream_config::env_key(&request.data_id)?;
                stream
                    .rows
                    .iter()
                    .find(|r| stream_config::env_key(&r.data_id) == Some(key))
            })
            .ok_or(LaunchRefused::UnknownRow)?;
        let checked = Checked {
            tags: row.tags.clone(),
            task_family: TaskFamily::from_tags(&row.tags).or(stream.def.task_family),
            harness: request.harness.clone().or_else(|| {
                stream
                    .def
                    .default_harness_ref
                    .as_ref()
                    .map(|h| format!("{}@{}", h.key, h.version))
            }),
            reward_ref: stream.def.default_reward_ref.clone(),
        };
        if request.base_url.trim_end_matches('/') == settings.gateway_url {
            if settings.llm_api_key.is_some_and(|k| k != request.api_key) {
                return Err(LaunchRefused::WrongGatewayKey);
            }
            let route = self
                .routes
                .get_mut(&request.model_name)
                .ok_or(LaunchRefused::UnknownRoute)?;
            route.last_touch = Instant::now();
        }
        Ok(checked)
    }

    fn count_launch(
        &mut self,
        stream_id: &str,
        task_id: &str,
        request: &LaunchRequest,
        idempotency_key: Option<String>,
    ) {
        if let Some(s) = self.stream_mut(stream_id) {
            s.launched.push(task_id.to_string());
        }
        if let Some(k) = idempotency_key.filter(|_| self.dedupe_launches) {
            self.idempotency.insert(k, task_id.to_string());
        }
        self.counters.launches += 1;
        let who = request
            .session_id
            .clone()
            .unwrap_or_else(|| format!("data:{}", request.data_id));
        *self.counters.launches_by_session.entry(who).or_default() += 1;
        *self
            .counters
            .launches_by_data_id
            .entry(request.data_id.clone())
            .or_default() += 1;
    }
}

/// A `key@version` reference.
fn parse_ref(harness: &str) -> Option<RefDef> {
    let (k, v) = harness.split_once('@')?;
    Some(RefDef::new(k, v))
}
