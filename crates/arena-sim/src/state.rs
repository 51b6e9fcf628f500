//! The mutable state of a running sim: streams, tasks, routes, counters and the request log, and what the
//! endpoints do to it under its lock (a launch, a registration, a cancel), so that unit tests
//! reach it without HTTP.

mod launch;

pub(crate) use launch::{LaunchRefused, LaunchSettings, Launched};

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use stream_config::LlmProtocol;
use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::fault::{Endpoint, FaultPlan};
use crate::harness::{Envelope, HarnessOutcome};
use crate::world::{RefDef, RowDef, StreamDef, TaskHistoryDef, World};

/// Counters for tests: what the sim saw and did.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counters {
    /// Requests per endpoint, faulted ones included.
    pub requests: BTreeMap<Endpoint, u64>,
    /// Injected faults per endpoint.
    pub faults: BTreeMap<Endpoint, u64>,
    /// Requests being handled right now, per endpoint.
    pub in_flight: BTreeMap<Endpoint, u64>,
    /// The most requests handled at once, per endpoint.
    pub max_in_flight: BTreeMap<Endpoint, u64>,
    /// Requests refused for a missing or wrong bearer token.
    pub unauthorized: u64,
    /// Tasks created (an idempotent replay creates none).
    pub launches: u64,
    /// Tasks created per session id (or `data:<data_id>` for launches without one).
    pub launches_by_session: BTreeMap<String, u64>,
    /// Tasks created per `data_id` (an idempotent replay creates none).
    pub launches_by_data_id: BTreeMap<String, u64>,
    /// Launches answered from an earlier launch with the same `Idempotency-Key`.
    pub idempotent_replays: u64,
    /// Tasks cancelled through the cancel endpoint.
    pub cancels: u64,
    /// Answers handled but held back right now by a `hold_ms` fault (a launch's task already started).
    pub held_answers: u64,
    /// Routes created by `POST /llm/models`.
    pub registrations: u64,
    /// Routes created per model name (a restore under the same name counts again).
    pub registrations_by_name: BTreeMap<String, u64>,
    /// Routes removed by `DELETE /llm/models/{name}`.
    pub deletions: u64,
    /// Routes removed by garbage collection (idle time, a `gc_route` fault or [`crate::ArenaSim::gc_route`]).
    pub gc_removals: u64,
    /// Routes registered right now.
    pub live_routes: usize,
    /// LLM gateway traffic per caller protocol.
    pub gateway: BTreeMap<LlmProtocol, GatewayCounters>,
}

/// What the LLM gateway did with the requests of one protocol.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct GatewayCounters {
    /// Requests received, faulted and refused ones included.
    pub requests: u64,
    /// Requests forwarded upstream (the upstream answered, with any status).
    pub forwarded: u64,
    /// Requests refused for a missing or wrong LLM key.
    pub unauthorized: u64,
    /// Requests refused because the body is not a JSON object with a `model`.
    pub bad_requests: u64,
    /// Requests for a model name that is not a registered route (never registered, deleted or collected).
    pub unknown_model: u64,
    /// Requests refused because the route's upstream does not serve the caller's protocol.
    pub unsupported_protocol: u64,
    /// Requests whose upstream could not be reached.
    pub upstream_errors: u64,
}

impl Counters {
    /// Requests seen by one endpoint.
    pub fn requests_to(&self, endpoint: Endpoint) -> u64 {
        self.requests.get(&endpoint).copied().unwrap_or(0)
    }

    /// The largest number of tasks created for one session (1 when nothing was launched twice).
    pub fn max_launches_per_session(&self) -> u64 {
        self.launches_by_session.values().copied().max().unwrap_or(0)
    }
}

/// One request as the sim received it, for assertions on paths, queries and payloads.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RecordedRequest {
    /// Which endpoint it hit.
    pub endpoint: Endpoint,
    /// The HTTP method.
    pub method: String,
    /// The path exactly as sent, percent-encoding included.
    pub path: String,
    /// The raw query string, if any.
    pub query: Option<String>,
    /// Whether it carried the right bearer token (the token itself is never recorded).
    pub authorized: bool,
    /// The `Idempotency-Key` header, if any.
    pub idempotency_key: Option<String>,
    /// The JSON body, if any.
    pub body: Option<Value>,
    /// The fault injected into it, if any.
    pub fault: Option<String>,
    /// The client's socket address: requests from one pooled connection share it.
    pub peer: Option<std::net::SocketAddr>,
}

impl RecordedRequest {
    /// The query parameters, decoded, in order.
    pub fn query_pairs(&self) -> Vec<(String, String)> {
        let Some(q) = &self.query else {
            return Vec::new();
        };
        q.split('&')
            .filter(|p| !p.is_empty())
            .map(|p| {
                let (k, v) = p.split_once('=').unwrap_or((p, ""));
                (k.to_string(), v.to_string())
            })
            .collect()
    }

    /// One query parameter.
    pub fn query_param(&self, name: &str) -> Option<String> {
        self.query_pairs()
            .into_iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v)
    }
}

/// A registered LLM route.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RouteInfo {
    /// The gateway model name.
    pub model_name: String,
    /// `metadata.deployment_id` of the registration.
    pub deployment_id: String,
    /// The registration payload as posted (for routes from the world: a minimal one).
    pub payload: Value,
    /// How many times this name was registered, restores included.
    pub registrations: u64,
}

pub(crate) struct RouteState {
    pub(crate) info: RouteInfo,
    pub(crate) last_touch: Instant,
}

pub(crate) struct TaskState {
    pub(crate) task_id: String,
    pub(crate) stream_id: String,
    pub(crate) harness_ref: Option<RefDef>,
    pub(crate) reward_ref: Option<RefDef>,
    pub(crate) status: watch::Receiver<String>,
    pub(crate) outcome: Option<HarnessOutcome>,
    pub(crate) progress: VecDeque<String>,
    pub(crate) abort: Option<AbortHandle>,
    pub(crate) placeholder_score: Option<f64>,
}

impl TaskState {
    /// The current status and the envelope a poll sees now; consumes one progress status if due.
    pub(crate) fn poll(&mut self) -> Value {
        if let Some(outcome) = &self.outcome {
            if let Some(step) = self.progress.pop_front() {
                return json!({"task_id": self.task_id, "status": step});
            }
            return render(&self.task_id, outcome);
        }
        let status = self.status.borrow().clone();
        let mut body = json!({"task_id": self.task_id, "status": status});
        if let Some(score) = self.placeholder_score {
            body["score"] = json!(score);
        }
        body
    }

    /// The envelope a launch answered `Final` replies with once the outcome is in: the outcome itself,
    /// with no progress statuses left for polls.
    pub(crate) fn final_envelope(&mut self) -> Value {
        self.progress.clear();
        self.poll()
    }

    /// The envelope a launch answered `Pending` replies with (202): `PENDING` and any placeholder score.
    pub(crate) fn pending_envelope(&self) -> Value {
        let mut e = json!({"task_id": self.task_id, "status": "PENDING"});
        if let Some(s) = self.placeholder_score {
            e["score"] = json!(s);
        }
        e
    }

    pub(crate) fn current_status(&self) -> String {
        match &self.outcome {
            Some(o) if self.progress.is_empty() => o.status.clone(),
            Some(_) => "AGENT_RUNNING".to_string(),
            None => self.status.borrow().clone(),
        }
    }
}

/// Renders an outcome in its envelope.
pub(crate) fn render(task_id: &str, outcome: &HarnessOutcome) -> Value {
    let mut plain = json!({
        "task_id": task_id,
        "status": outcome.status,
        "raw": outcome.raw,
        "artifacts_uri": outcome.artifacts_uri,
        "trace_id": outcome.trace_id,
        "computed_at": outcome.computed_at,
    });
    if let Some(score) = outcome.score {
        plain["score"] = json!(score);
    }
    match outcome.envelope {
        Envelope::Plain => plain,
        Envelope::Data => json!({"data": plain}),
        Envelope::ResultOutput => json!({"result": {"output": plain}}),
        Envelope::Task => json!({"task": plain}),
        Envelope::BareNumber => outcome.score.map_or(Value::Null, |s| json!(s)),
    }
}

pub(crate) struct StreamState {
    pub(crate) def: StreamDef,
    pub(crate) rows: Vec<RowDef>,
    /// Task ids launched on this stream, oldest first.
    pub(crate) launched: Vec<String>,
}

impl StreamState {
    pub(crate) fn to_json(&self, reported_id: &str) -> Value {
        json!({
            "stream_id": reported_id,
            "status": self.def.status,
            "default_harness_ref": self.def.default_harness_ref,
            "default_reward_ref": self.def.default_reward_ref,
            "dataset_total": self.rows.len(),
        })
    }

    pub(crate) fn history(&self) -> &[TaskHistoryDef] {
        &self.def.recent_tasks
    }
}

pub(crate) struct ArenaState {
    pub(crate) streams: Vec<StreamState>,
    pub(crate) harness_versions: HashMap<(String, String), String>,
    pub(crate) routes: BTreeMap<String, RouteState>,
    pub(crate) tasks: HashMap<String, TaskState>,
    pub(crate) idempotency: HashMap<String, String>,
    pub(crate) next_task: u64,
    pub(crate) faults: FaultPlan,
    pub(crate) counters: Counters,
    pub(crate) log: Vec<RecordedRequest>,
    pub(crate) route_gc_idle: Option<Duration>,
    /// `World::dedupe_launches`.
    pub(crate) dedupe_launches: bool,
}

impl ArenaState {
    pub(crate) fn new(world: &World) -> Self {
        let now = Instant::now();
        let routes = world
            .routes
            .iter()
            .map(|r| {
                let mut payload = json!({"model_name": r.model_name,
                                         "metadata": {"deployment_id": r.deployment_id}});
                if let Some(u) = &r.upstream {
                    payload["endpoints"] = json!([{
                        "endpoint_id": r.deployment_id,
                        "upstream_model": u.upstream_model.as_deref().unwrap_or(&r.model_name),
                        "base_url": u.base_url,
                        "api_key": u.api_key,
                        "inbound_protos": u.inbound_protos,
                        "enabled": true,
                    }]);
                }
                let info = RouteInfo {
                    model_name: r.model_name.clone(),
                    deployment_id: r.deployment_id.clone(),
                    payload,
                    registrations: 0,
                };
                (
                    r.model_name.clone(),
                    RouteState {
                        info,
                        last_touch: now,
                    },
                )
            })
            .collect::<BTreeMap<_, _>>();
        let counters = Counters {
            live_routes: routes.len(),
            ..Counters::default()
        };
        Self {
            streams: world
                .streams
                .iter()
                .map(|s| StreamState {
                    rows: s.all_rows(),
                    def: s.clone(),
                    launched: Vec::new(),
                })
                .collect(),
            harness_versions: world
                .harnesses
                .iter()
                .map(|h| ((h.key.clone(), h.version.clone()), h.status.clone()))
                .collect(),
            routes,
            tasks: HashMap::new(),
            idempotency: HashMap::new(),
            next_task: 1,
            faults: FaultPlan::new(world.faults.clone(), world.seed),
            counters,
            log: Vec::new(),
            route_gc_idle: world.route_gc_idle_ms.map(Duration::from_millis),
            dedupe_launches: world.dedupe_launches,
        }
    }

    pub(crate) fn stream(&self, id: &str) -> Option<&StreamState> {
        self.streams.iter().find(|s| s.def.stream_id == id)
    }

    pub(crate) fn stream_mut(&mut self, id: &str) -> Option<&mut StreamState> {
        self.streams.iter_mut().find(|s| s.def.stream_id == id)
    }

    /// Removes routes idle for longer than the configured time.
    pub(crate) fn sweep_routes(&mut self, now: Instant) {
        let Some(idle) = self.route_gc_idle else {
            return;
        };
        let before = self.routes.len();
        self.routes
            .retain(|_, r| now.duration_since(r.last_touch) <= idle);
        let removed = before - self.routes.len();
        self.counters.gc_removals += removed as u64;
        self.counters.live_routes = self.routes.len();
    }

    /// Registers a route (E6); `None` when the name is taken.
    pub(crate) fn register_route(
        &mut self,
        name: &str,
        deployment_id: String,
        payload: Value,
    ) -> Option<RouteInfo> {
        if self.routes.contains_key(name) {
            return None;
        }
        let count = self
            .counters
            .registrations_by_name
            .entry(name.to_string())
            .or_default();
        *count += 1;
        let info = RouteInfo {
            model_name: name.to_string(),
            deployment_id,
            payload,
            registrations: *count,
        };
        self.routes.insert(
            name.to_string(),
            RouteState {
                info: info.clone(),
                last_touch: Instant::now(),
            },
        );
        self.counters.registrations += 1;
        self.counters.live_routes = self.routes.len();
        Some(info)
    }

    /// Cancels a task: a running one ends `CANCELLED` (and counts); a finished one keeps its outcome.
    /// Answers the status a poll sees now, or `None` for an unknown task.
    pub(crate) fn cancel(&mut self, task_id: &str) -> Option<String> {
        let task = self.tasks.get_mut(task_id)?;
        let was_running = task.outcome.is_none();
        if let Some(abort) = task.abort.take() {
            abort.abort();
        }
        if was_running {
            task.outcome = Some(HarnessOutcome {
                status: "CANCELLED".to_string(),
                score: None,
                raw: Value::Null,
                artifacts_uri: None,
                trace_id: None,
                computed_at: None,
                progress: Vec::new(),
                envelope: Envelope::Plain,
            });
            task.progress.clear();
        }
        let status = task.current_status();
        if was_running {
            self.counters.cancels += 1;
        }
        Some(status)
    }

    pub(crate) fn remove_route(&mut self, name: &str, gc: bool) -> bool {
        let removed = self.routes.remove(name).is_some();
        if removed {
            if gc {
                self.counters.gc_removals += 1;
            } else {
                self.counters.deletions += 1;
            }
        }
        self.counters.live_routes = self.routes.len();
        removed
    }
}

#[cfg(test)]
mod tests;
