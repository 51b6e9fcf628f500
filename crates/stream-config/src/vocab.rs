//! Vocabulary shared by crates that may not depend on each other: harness protocols, route modes, task
//! statuses, task types from `domain:` tags, and Arena's transient-403 marker (`key@version` references
//! and the reward-ref drift check live beside the stream schema, in `stream.rs`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::Error;

/// The protocol a Harness speaks to its model.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LlmProtocol {
    /// Anthropic Messages (`/v1/messages`), spoken by Claude Code.
    Anthropic,
    /// OpenAI Responses (`/v1/responses`), spoken by Codex.
    Responses,
    /// OpenAI Chat Completions (`/v1/chat/completions`).
    ChatCompletions,
}

impl LlmProtocol {
    /// Every protocol, in the reference's order.
    pub const ALL: [LlmProtocol; 3] = [Self::Anthropic, Self::Responses, Self::ChatCompletions];

    /// The wire label of the protocol (`anthropic`, `responses`, `chat_completions`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Anthropic => "anthropic",
            Self::Responses => "responses",
            Self::ChatCompletions => "chat_completions",
        }
    }

    /// Infers the protocol from a harness key or `key@version` string (reference section 2.5 step 3):
    /// the lower-cased key containing `claude` means Anthropic, else containing `codex` means Responses,
    /// else Chat Completions.
    pub fn infer_from_harness(harness: &str) -> Self {
        let lower = harness.to_lowercase();
        if lower.contains("claude") {
            Self::Anthropic
        } else if lower.contains("codex") {
            Self::Responses
        } else {
            Self::ChatCompletions
        }
    }
}

impl fmt::Display for LlmProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LlmProtocol {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            "anthropic" => Ok(Self::Anthropic),
            "responses" => Ok(Self::Responses),
            "chat_completions" => Ok(Self::ChatCompletions),
            other => Err(Error::Invalid(format!(
                "unsupported llm_protocol {other:?}: expected one of anthropic, responses, chat_completions"
            ))),
        }
    }
}

/// How a Harness reaches the rollout proxy (reference section 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RouteMode {
    /// One temporary Arena gateway model per rollout, keyed by the per-session proxy key.
    #[default]
    Gateway,
    /// One Arena gateway model per rollout worker, keyed by the generation-only gateway key; sessions are
    /// told apart by `X-Session-Id` and `X-Session-Token` headers.
    SessionGateway,
    /// No registration: the Harness calls the proxy directly over a private network.
    Direct,
}

impl RouteMode {
    /// The config label of the mode.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Gateway => "gateway",
            Self::SessionGateway => "session_gateway",
            Self::Direct => "direct",
        }
    }
}

impl fmt::Display for RouteMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RouteMode {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        match s.trim() {
            "gateway" => Ok(Self::Gateway),
            "session_gateway" => Ok(Self::SessionGateway),
            "direct" => Ok(Self::Direct),
            other => Err(Error::Invalid(format!(
                "unsupported arena_llm_route_mode {other:?}: expected one of gateway, session_gateway, direct"
            ))),
        }
    }
}

/// Which rules decide what a failed Arena task means for training (`econfig.arena_failure_policy`;
/// `arena-2026.md` 2.3-2.4, docs/failure-dispositions.md). The names are those of the AReaL versions whose
/// rules they follow.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailurePolicy {
    /// AReaL's merged main (#1702 with #1746 and #1748), what AReaL runs today: #1547's rules plus a
    /// GameAgent outcome code of the allow-list as model evidence.
    #[default]
    MergedMain,
    /// The strict receipt policy of AReaL #1750: only a `HARNESS_FAILED` task with interactions and a valid
    /// native v1 receipt (and no other result format) is the model's; everything else is rejected.
    StrictReceipt,
    /// The rules of AReaL #1547, which this project started from (reference section 4.4), for Arena
    /// deployments that report no outcome codes.
    Pr1547,
}

impl FailurePolicy {
    /// The setting's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MergedMain => "merged_main",
            Self::StrictReceipt => "strict_receipt",
            Self::Pr1547 => "pr1547",
        }
    }
}

/// The status of an Arena task, as the result envelope reports it (trimmed and upper-cased).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum TaskStatus {
    /// `DONE`: finished with a score.
    Done,
    /// `OK`: finished with a score (an alias of `DONE`).
    Ok,
    /// `CANCELLED`.
    Cancelled,
    /// `ERROR`: the grader itself failed (Arena's current contract, `arena-2026.md` 2.1); a system failure.
    Error,
    /// `COLLECT_FAILED`.
    CollectFailed,
    /// `EVAL_FAILED`.
    EvalFailed,
    /// `FAILED`.
    Failed,
    /// `HARNESS_FAILED`.
    HarnessFailed,
    /// `NO_OUTPUT`.
    NoOutput,
    /// `SETUP_FAILED`.
    SetupFailed,
    /// `TIMEOUT`.
    Timeout,
    /// `LOCAL_WAIT_TIMEOUT`: our own deadline passed before Arena finished (audit only, never sent by Arena).
    LocalWaitTimeout,
    /// `LOCAL_WAIT_CANCELLED`: we stopped waiting (audit only, never sent by Arena).
    LocalWaitCancelled,
    /// Any other status (`PENDING`, `AGENT_RUNNING`, ...): not terminal, keep polling.
    Other(String),
}

impl TaskStatus {
    /// Parses a status the way the reference does: trimmed and upper-cased.
    pub fn parse(s: &str) -> Self {
        let upper = s.trim().to_uppercase();
        match upper.as_str() {
            "DONE" => Self::Done,
            "OK" => Self::Ok,
            "CANCELLED" => Self::Cancelled,
            "ERROR" => Self::Error,
            "COLLECT_FAILED" => Self::CollectFailed,
            "EVAL_FAILED" => Self::EvalFailed,
            "FAILED" => Self::Failed,
            "HARNESS_FAILED" => Self::HarnessFailed,
            "NO_OUTPUT" => Self::NoOutput,
            "SETUP_FAILED" => Self::SetupFailed,
            "TIMEOUT" => Self::Timeout,
            "LOCAL_WAIT_TIMEOUT" => Self::LocalWaitTimeout,
            "LOCAL_WAIT_CANCELLED" => Self::LocalWaitCancelled,
            _ => Self::Other(upper),
        }
    }

    /// The wire form of the status.
    pub fn as_str(&self) -> &str {
        match self {
            Self::Done => "DONE",
            Self::Ok => "OK",
            Self::Cancelled => "CANCELLED",
            Self::Error => "ERROR",
            Self::CollectFailed => "COLLECT_FAILED",
            Self::EvalFailed => "EVAL_FAILED",
            Self::Failed => "FAILED",
            Self::HarnessFailed => "HARNESS_FAILED",
            Self::NoOutput => "NO_OUTPUT",
            Self::SetupFailed => "SETUP_FAILED",
            Self::Timeout => "TIMEOUT",
            Self::LocalWaitTimeout => "LOCAL_WAIT_TIMEOUT",
            Self::LocalWaitCancelled => "LOCAL_WAIT_CANCELLED",
            Self::Other(s) => s,
        }
    }

    /// `DONE` or `OK`: the task finished and carries a score.
    pub fn is_success(&self) -> bool {
        matches!(self, Self::Done | Self::Ok)
    }

    /// One of the reference's eight failure statuses (section 4.4) or `ERROR` (`arena-2026.md` 2.1: the
    /// reference polled it until its deadline; every policy here treats it as a terminal system failure); the
    /// local wait statuses are not Arena failures and are not included.
    pub fn is_failure(&self) -> bool {
        matches!(
            self,
            Self::Cancelled
                | Self::Error
                | Self::CollectFailed
                | Self::EvalFailed
                | Self::Failed
                | Self::HarnessFailed
                | Self::NoOutput
                | Self::SetupFailed
                | Self::Timeout
        )
    }

    /// Success or failure: Arena will not change this status any more.
    pub fn is_terminal(&self) -> bool {
        self.is_success() || self.is_failure()
    }
}

impl fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for TaskStatus {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for TaskStatus {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Ok(Self::parse(&s))
    }
}

#[cfg(test)]
mod tests;

/// The task type of a row with none, or with an ambiguous one.
pub const UNKNOWN_TASK_TYPE: &str = "unknown";

/// A row's task type from its `tags`: exactly one distinct non-empty `domain:<x>`, else `unknown`.
pub fn task_type_from_tags(tags: Option<&serde_json::Value>) -> String {
    let Some(serde_json::Value::Array(tags)) = tags else {
        return UNKNOWN_TASK_TYPE.to_string();
    };
    let mut domains = Vec::new();
    for tag in tags {
        let Some(tag) = tag.as_str() else {
            return UNKNOWN_TASK_TYPE.to_string();
        };
        if let Some(domain) = tag.strip_prefix("domain:") {
            let domain = domain.trim();
            if !domain.is_empty() && !domains.contains(&domain) {
                domains.push(domain);
            }
        }
    }
    match domains.as_slice() {
        [one] => (*one).to_string(),
        _ => UNKNOWN_TASK_TYPE.to_string(),
    }
}

/// A task type as metric names use it: trimmed, or `unknown` when blank.
pub fn metric_task_type(task_type: &str) -> &str {
    match task_type.trim() {
        "" => UNKNOWN_TASK_TYPE,
        trimmed => trimmed,
    }
}

/// The marker in a 403 body that Arena's gateway sends for a transient rejection (retried like a 429).
pub const TRANSIENT_403_MARKER: &str = "spanner-http-ant-group-watch-all";
