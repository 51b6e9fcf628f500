//! The world an `arena-sim` serves: streams with their datasets and task histories, harness versions,
//! pre-registered LLM routes, scripted outcomes and fault rules.
//!
//! A world is plain data: it loads from YAML (`World::from_yaml`) or is built in code with the same types.
//! Everything the server later changes (launched tasks, registered routes) lives in the server's state, never
//! here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::fault::FaultRule;
use crate::harness::ScriptedConfig;
use crate::runner::RunnerDef;
use crate::tasks::TaskFamily;
use crate::{Error, Result};

/// The whole simulated Arena.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct World {
    /// The bearer token every control-plane call must carry (`Authorization: Bearer <token>`).
    #[serde(default = "default_token")]
    pub token: String,
    /// The key a launch in gateway modes must present as `api_key`; `None` accepts any non-empty key.
    #[serde(default)]
    pub llm_api_key: Option<String>,
    /// Seed of the random generator behind probabilistic faults, so a run can be replayed.
    #[serde(default)]
    pub seed: u64,
    /// The Arena streams.
    #[serde(default)]
    pub streams: Vec<StreamDef>,
    /// Harness versions that `GET /openapi/v1/harnesses/{key}/versions/{version}` knows.
    #[serde(default)]
    pub harnesses: Vec<HarnessVersionDef>,
    /// LLM routes that exist before the first request.
    #[serde(default)]
    pub routes: Vec<RouteDef>,
    /// What the scripted harness answers for each launched row.
    #[serde(default)]
    pub scripted: ScriptedConfig,
    /// Harnesses that really run a task, by harness key (the part of `key@version` before `@`): an LLM
    /// harness per protocol or an external command. Launches of other keys run the scripted harness.
    #[serde(default)]
    pub runners: BTreeMap<String, RunnerDef>,
    /// Faults to inject, checked in order; the first rule that fires wins.
    #[serde(default)]
    pub faults: Vec<FaultRule>,
    /// Whether dataset pages carry `items` (with tags) besides `data_ids`.
    #[serde(default = "yes")]
    pub dataset_items: bool,
    /// How the cancel endpoint answers.
    #[serde(default)]
    pub cancel_endpoint: CancelEndpoint,
    /// Whether a launch repeating an earlier launch's `Idempotency-Key` is answered with that launch's task
    /// (the default); false starts a new task each time, as an Arena that ignores the key.
    #[serde(default = "yes")]
    pub dedupe_launches: bool,
    /// Remove an LLM route nobody touched (registered, probed, renewed or launched against) for this long.
    #[serde(default)]
    pub route_gc_idle_ms: Option<u64>,
    /// Prefix of generated task ids (`<prefix><n>`); include a `/` to exercise path encoding.
    #[serde(default = "default_task_prefix")]
    pub task_id_prefix: String,
}

fn default_token() -> String {
    "arena-sim-token".to_string()
}

fn default_task_prefix() -> String {
    "task-".to_string()
}

fn yes() -> bool {
    true
}

impl Default for World {
    fn default() -> Self {
        Self {
            token: default_token(),
            llm_api_key: None,
            seed: 0,
            streams: Vec::new(),
            harnesses: Vec::new(),
            routes: Vec::new(),
            scripted: ScriptedConfig::default(),
            runners: BTreeMap::new(),
            faults: Vec::new(),
            dataset_items: true,
            cancel_endpoint: CancelEndpoint::default(),
            dedupe_launches: true,
            route_gc_idle_ms: None,
            task_id_prefix: default_task_prefix(),
        }
    }
}

/// How `POST /openapi/v1/tasks/{task_id}/cancel` behaves, so clients can be tested against an Arena without it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CancelEndpoint {
    /// Cancels the task.
    #[default]
    Enabled,
    /// Answers 404, as an Arena whose schema has no cancel endpoint.
    NotFound,
    /// Answers 405.
    MethodNotAllowed,
}

/// A `{key, version}` pair: a harness ref or a reward ref.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RefDef {
    /// The key, e.g. `claude-code`.
    pub key: String,
    /// The version, e.g. `3`.
    pub version: String,
}

impl RefDef {
    /// A ref from its two parts.
    pub fn new(key: impl Into<String>, version: impl Into<String>) -> Self {
        Self {
            key: key.into(),
            version: version.into(),
        }
    }
}

/// One Arena stream.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamDef {
    /// The stream id (may contain `/`).
    pub stream_id: String,
    /// `ACTIVE`, `PAUSED`, ...; `None` leaves the field out of the reply.
    #[serde(default = "active")]
    pub status: Option<String>,
    /// The harness the stream runs when a launch names none.
    #[serde(default)]
    pub default_harness_ref: Option<RefDef>,
    /// The grader the stream scores with.
    #[serde(default)]
    pub default_reward_ref: Option<RefDef>,
    /// Rows with tags, in API order.
    #[serde(default)]
    pub rows: Vec<RowDef>,
    /// Extra generated rows after `rows`, with ids `<stream_id>-row-<n>`, tagged `domain:<family>` when the
    /// stream has a `task_family` and untagged otherwise.
    #[serde(default)]
    pub generated_rows: u64,
    /// The task family its rows are, for harnesses that run tasks (a row's own `domain:max`/`domain:min` tag
    /// wins).
    #[serde(default)]
    pub task_family: Option<TaskFamily>,
    /// Earlier tasks reported by `GET .../tasks`, newest first (launched tasks are listed before them).
    #[serde(default)]
    pub recent_tasks: Vec<TaskHistoryDef>,
}

fn active() -> Option<String> {
    Some("ACTIVE".to_string())
}

impl StreamDef {
    /// An active stream with no rows.
    pub fn new(stream_id: impl Into<String>) -> Self {
        Self {
            stream_id: stream_id.into(),
            status: active(),
            default_harness_ref: None,
            default_reward_ref: None,
            rows: Vec::new(),
            generated_rows: 0,
            task_family: None,
            recent_tasks: Vec::new(),
        }
    }

    /// Sets the default harness ref.
    pub fn harness(mut self, key: &str, version: &str) -> Self {
        self.default_harness_ref = Some(RefDef::new(key, version));
        self
    }

    /// Sets the default reward ref.
    pub fn reward(mut self, key: &str, version: &str) -> Self {
        self.default_reward_ref = Some(RefDef::new(key, version));
        self
    }

    /// Adds one row with tags.
    pub fn row(mut self, data_id: &str, tags: &[&str]) -> Self {
        self.rows.push(RowDef {
            data_id: data_id.to_string(),
            tags: tags.iter().map(|t| serde_json::Value::from(*t)).collect(),
        });
        self
    }

    /// Adds one row with tags given as any JSON value (to serve malformed tags).
    pub fn row_with_tags(mut self, data_id: &str, tags: serde_json::Value) -> Self {
        self.rows.push(RowDef {
            data_id: data_id.to_string(),
            tags,
        });
        self
    }

    /// Adds `n` generated rows.
    pub fn generated(mut self, n: u64) -> Self {
        self.generated_rows = n;
        self
    }

    /// Sets the task family of its rows.
    pub fn family(mut self, family: TaskFamily) -> Self {
        self.task_family = Some(family);
        self
    }

    /// Adds a history task with these refs.
    pub fn history(mut self, status: &str, harness: (&str, &str), reward: (&str, &str)) -> Self {
        self.recent_tasks.push(TaskHistoryDef {
            status: status.to_string(),
            harness_ref: Some(RefDef::new(harness.0, harness.1)),
            reward_ref: Some(RefDef::new(reward.0, reward.1)),
        });
        self
    }

    /// Every row, in API order.
    pub fn all_rows(&self) -> Vec<RowDef> {
        let mut rows = self.rows.clone();
        let tags = match self.task_family {
            Some(f) => serde_json::json!([f.domain_tag()]),
            None => empty_list(),
        };
        rows.extend((0..self.generated_rows).map(|n| RowDef {
            data_id: format!("{}-row-{n}", self.stream_id),
            tags: tags.clone(),
        }));
        rows
    }
}

/// One dataset row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RowDef {
    /// The row id.
    pub data_id: String,
    /// Tags as Arena reports them (normally a list of strings); any JSON, so malformed tags can be served.
    #[serde(default = "empty_list")]
    pub tags: serde_json::Value,
}

/// A task in a stream's history.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskHistoryDef {
    /// The task's status.
    pub status: String,
    /// The harness that ran it.
    #[serde(default)]
    pub harness_ref: Option<RefDef>,
    /// The grader that scored it.
    #[serde(default)]
    pub reward_ref: Option<RefDef>,
}

/// A harness version.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HarnessVersionDef {
    /// Harness key.
    pub key: String,
    /// Harness version.
    pub version: String,
    /// `PUBLISHED`, `DRAFT`, ...
    #[serde(default = "published")]
    pub status: String,
}

fn empty_list() -> serde_json::Value {
    serde_json::Value::Array(Vec::new())
}

fn published() -> String {
    "PUBLISHED".to_string()
}

/// An LLM route that exists before the first request.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteDef {
    /// The gateway model name.
    pub model_name: String,
    /// The deployment id.
    #[serde(default)]
    pub deployment_id: String,
    /// Where the gateway forwards requests for this model; without it the route cannot serve requests.
    #[serde(default)]
    pub upstream: Option<UpstreamDef>,
}

/// The upstream endpoint of a route declared in the world, as a registration's `endpoints[0]` would be.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpstreamDef {
    /// The upstream base URL (`http://host:port`, or ending in `/v1`).
    pub base_url: String,
    /// The key the gateway presents upstream.
    pub api_key: String,
    /// The model name sent upstream; defaults to the route's name.
    #[serde(default)]
    pub upstream_model: Option<String>,
    /// The protocols the upstream serves natively (`chat`, `anthropic`, `responses`).
    #[serde(default = "chat_only")]
    pub inbound_protos: Vec<String>,
}

impl std::fmt::Debug for UpstreamDef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamDef")
            .field("base_url", &self.base_url)
            .field("api_key", &"<redacted>")
            .field("upstream_model", &self.upstream_model)
            .field("inbound_protos", &self.inbound_protos)
            .finish()
    }
}

fn chat_only() -> Vec<String> {
    vec!["chat".to_string()]
}

impl World {
    /// Parses a YAML world; errors name the file's field.
    pub fn from_yaml(text: &str) -> Result<Self> {
        let world: World = serde_saphyr::from_str(text).map_err(|e| Error::World(e.to_string()))?;
        world.validate()?;
        Ok(world)
    }

    /// Reads and parses a YAML world file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text).map_err(|e| Error::World(format!("{}: {e}", path.display())))
    }

    /// Adds a stream.
    pub fn stream(mut self, stream: StreamDef) -> Self {
        self.streams.push(stream);
        self
    }

    /// Adds a harness version.
    pub fn harness_version(mut self, key: &str, version: &str, status: &str) -> Self {
        self.harnesses.push(HarnessVersionDef {
            key: key.to_string(),
            version: version.to_string(),
            status: status.to_string(),
        });
        self
    }

    /// Adds a fault rule.
    pub fn fault(mut self, rule: FaultRule) -> Self {
        self.faults.push(rule);
        self
    }

    /// Checks what serde cannot: unique ids, probabilities within [0, 1]; reports every problem at once.
    pub fn validate(&self) -> Result<()> {
        let mut problems = Vec::new();
        if self.token.is_empty() {
            problems.push("token must not be empty".to_string());
        }
        let mut ids = BTreeSet::new();
        for (i, s) in self.streams.iter().enumerate() {
            if s.stream_id.is_empty() {
                problems.push(format!("streams[{i}].stream_id must not be empty"));
            }
            if !ids.insert(&s.stream_id) {
                problems.push(format!("streams[{i}].stream_id {:?} is not unique", s.stream_id));
            }
            let mut rows = BTreeSet::new();
            for r in s.all_rows() {
                if !rows.insert(r.data_id.clone()) {
                    problems.push(format!("streams[{i}] has the data_id {:?} twice", r.data_id));
                }
            }
        }
        let mut harnesses = BTreeMap::new();
        for (i, h) in self.harnesses.iter().enumerate() {
            if harnesses.insert((&h.key, &h.version), i).is_some() {
                problems.push(format!("harnesses[{i}] {}@{} is not unique", h.key, h.version));
            }
        }
        for (key, runner) in &self.runners {
            problems.extend(runner.problems(&format!("runners.{key}")));
        }
        for (i, r) in self.routes.iter().enumerate() {
            if let Some(p) = r.upstream.as_ref().and_then(|u| {
                u.inbound_protos
                    .iter()
                    .find(|p| !["chat", "anthropic", "responses"].contains(&p.as_str()))
            }) {
                problems.push(format!(
                    "routes[{i}].upstream.inbound_protos has unknown {p:?}: expected chat, anthropic or responses"
                ));
            }
        }
        for (i, f) in self.faults.iter().enumerate() {
            if !(0.0..=1.0).contains(&f.probability) {
                problems.push(format!(
                    "faults[{i}].probability {} must be within [0, 1]",
                    f.probability
                ));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(Error::World(problems.join("; ")))
        }
    }
}
