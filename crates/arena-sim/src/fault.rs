//! Fault injection: which endpoint misbehaves, how, how often, and a seeded generator deciding when.

use std::fmt;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};

/// One endpoint of the control plane, for counters and fault rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// E1 `GET /openapi/v1/streams`.
    ListStreams,
    /// E2 `GET /openapi/v1/streams/{stream_id}`.
    GetStream,
    /// E3 `POST /openapi/v1/streams/{stream_id}/dataset`.
    Dataset,
    /// E4 `POST /openapi/v1/streams/{stream_id}/launch_one_task`.
    LaunchOneTask,
    /// E5 `GET /openapi/v1/tasks/{task_id}/result`.
    TaskResult,
    /// `POST /openapi/v1/tasks/{task_id}/cancel`.
    CancelTask,
    /// E6 `POST /openapi/v1/llm/models`.
    RegisterModel,
    /// E7 `GET /openapi/v1/llm/models/{model_name}`.
    GetModel,
    /// E8 `DELETE /openapi/v1/llm/models/{model_name}`.
    DeleteModel,
    /// E11 `PATCH /openapi/v1/llm/models/{model_name}`.
    RenewModel,
    /// E9 `GET /openapi/v1/harnesses/{key}/versions/{version}`.
    HarnessVersion,
    /// E10 `GET /openapi/v1/streams/{stream_id}/tasks`.
    StreamTasks,
    /// LLM gateway: `POST /api/v1/messages` (Anthropic Messages).
    GatewayMessages,
    /// LLM gateway: `POST /api/v1/messages/count_tokens`.
    GatewayCountTokens,
    /// LLM gateway: `POST /api/v1/chat/completions` and `/api/chat/completions`.
    GatewayChat,
    /// LLM gateway: `POST /api/v1/responses` and `/api/responses`.
    GatewayResponses,
}

impl Endpoint {
    /// Every endpoint, the LLM gateway's included.
    pub const ALL: [Endpoint; 16] = [
        Self::ListStreams,
        Self::GetStream,
        Self::Dataset,
        Self::LaunchOneTask,
        Self::TaskResult,
        Self::CancelTask,
        Self::RegisterModel,
        Self::GetModel,
        Self::DeleteModel,
        Self::RenewModel,
        Self::HarnessVersion,
        Self::StreamTasks,
        Self::GatewayMessages,
        Self::GatewayCountTokens,
        Self::GatewayChat,
        Self::GatewayResponses,
    ];

    /// The snake-case name used in YAML and counters.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ListStreams => "list_streams",
            Self::GetStream => "get_stream",
            Self::Dataset => "dataset",
            Self::LaunchOneTask => "launch_one_task",
            Self::TaskResult => "task_result",
            Self::CancelTask => "cancel_task",
            Self::RegisterModel => "register_model",
            Self::GetModel => "get_model",
            Self::DeleteModel => "delete_model",
            Self::RenewModel => "renew_model",
            Self::HarnessVersion => "harness_version",
            Self::StreamTasks => "stream_tasks",
            Self::GatewayMessages => "gateway_messages",
            Self::GatewayCountTokens => "gateway_count_tokens",
            Self::GatewayChat => "gateway_chat",
            Self::GatewayResponses => "gateway_responses",
        }
    }
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which endpoints a rule applies to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EndpointSelector {
    /// The literal `all`: every endpoint, the LLM gateway's included.
    All(AllEndpoints),
    /// One endpoint.
    One(Endpoint),
    /// Several endpoints.
    Some(Vec<Endpoint>),
}

/// The literal `all` in a fault rule's `endpoint`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AllEndpoints {
    /// Every endpoint.
    All,
}

impl EndpointSelector {
    fn matches(&self, endpoint: Endpoint) -> bool {
        match self {
            Self::All(_) => true,
            Self::One(e) => *e == endpoint,
            Self::Some(list) => list.contains(&endpoint),
        }
    }
}

/// What goes wrong.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultKind {
    /// Answer with this HTTP status (429, 500, 502, 503, 504, ...) and a short JSON error, without handling.
    Status(u16),
    /// Answer 403 with the transient gateway marker `spanner-http-ant-group-watch-all` in the body.
    Marker403,
    /// Answer 200 with a body that is not JSON, after handling.
    NonJson,
    /// Wait this many milliseconds, then handle the request normally (past a client timeout, the reply is lost).
    DelayMs(u64),
    /// Launches only: handle the request (the task starts), then hold its answer this many milliseconds, as
    /// an Arena slow to answer a launch it has acted on; `Counters::held_answers` counts the answers held.
    HoldMs(u64),
    /// Handle the request, then drop the connection without a complete response (a lost response); on the
    /// LLM gateway the request is forwarded and the upstream's answer is lost.
    Drop,
    /// Dataset pages only: report `total + 1`, as if rows were added mid-pagination.
    ChangeTotal,
    /// Dataset pages only: repeat the page's first id in place of its last (or the previous page's ids).
    DuplicateIds,
    /// Dataset pages only: report `offset + 1`.
    WrongOffset,
    /// Dataset pages only: report `limit + 1`.
    WrongLimit,
    /// Dataset pages only: report `count + 1`.
    WrongCount,
    /// Report another id than the one asked for (`stream_id`, `model_name` or `task_id`).
    WrongId,
    /// LLM routes and the LLM gateway: forget the route before handling, as Arena's idle garbage collection
    /// does (the gateway then answers 404 for its model).
    GcRoute,
}

impl FaultKind {
    /// Faults answered before the request is handled.
    pub fn short_circuits(&self) -> bool {
        matches!(self, Self::Status(_) | Self::Marker403)
    }
}

/// One fault rule.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// The endpoints it applies to: a name, a list of names, or `all`.
    pub endpoint: EndpointSelector,
    /// What goes wrong.
    pub fault: FaultKind,
    /// Chance that a matching request is hit, drawn from the world's seeded generator.
    #[serde(default = "one")]
    pub probability: f64,
    /// Matching requests let through untouched before the rule may fire.
    #[serde(default)]
    pub after: u64,
    /// Fire at most this many times.
    #[serde(default)]
    pub times: Option<u64>,
}

fn one() -> f64 {
    1.0
}

impl FaultRule {
    /// A rule that always fires on one endpoint.
    pub fn on(endpoint: Endpoint, fault: FaultKind) -> Self {
        Self {
            endpoint: EndpointSelector::One(endpoint),
            fault,
            probability: 1.0,
            after: 0,
            times: None,
        }
    }

    /// A rule on every endpoint.
    pub fn everywhere(fault: FaultKind) -> Self {
        Self {
            endpoint: EndpointSelector::All(AllEndpoints::All),
            ..Self::on(Endpoint::ListStreams, fault)
        }
    }

    /// Fires with this probability.
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = p;
        self
    }

    /// Lets the first `n` matching requests through.
    pub fn after(mut self, n: u64) -> Self {
        self.after = n;
        self
    }

    /// Fires at most `n` times.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }
}

/// The rules with their running counts and the seeded generator.
pub(crate) struct FaultPlan {
    rules: Vec<(FaultRule, RuleCounts)>,
    rng: StdRng,
}

#[derive(Default)]
struct RuleCounts {
    seen: u64,
    fired: u64,
}

impl FaultPlan {
    pub(crate) fn new(rules: Vec<FaultRule>, seed: u64) -> Self {
        Self {
            rules: rules.into_iter().map(|r| (r, RuleCounts::default())).collect(),
            rng: StdRng::seed_from_u64(seed),
        }
    }

    pub(crate) fn push(&mut self, rule: FaultRule) {
        self.rules.push((rule, RuleCounts::default()));
    }

    pub(crate) fn clear(&mut self) {
        self.rules.clear();
    }

    /// Decides the fault for one request; every matching rule counts the request, the first that fires wins.
    pub(crate) fn decide(&mut self, endpoint: Endpoint) -> Option<FaultKind> {
        let mut chosen = None;
        for (rule, counts) in &mut self.rules {
            if !rule.endpoint.matches(endpoint) {
                continue;
            }
            counts.seen += 1;
            if chosen.is_some() || counts.seen <= rule.after || rule.times.is_some_and(|t| counts.fired >= t)
            {
                continue;
            }
            let hit =
                rule.probability >= 1.0 || (rule.probability > 0.0 && self.rng.random_bool(rule.probability));
            if hit {
                counts.fired += 1;
                chosen = Some(rule.fault.clone());
            }
        }
        chosen
    }
}

#[cfg(test)]
mod tests;
