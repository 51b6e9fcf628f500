//! The control endpoints' requests and replies as serde types: the one definition both the proxy's handlers
//! and its clients (the training loop's control client) use.
//!
//! Field names are the reference's (section 6.4). Requests the proxy reads reject unknown fields, except
//! `start_session`'s, which accepts the reference's processor-cache fields and ignores them. Replies accept
//! unknown fields, so a client keeps working against a proxy that adds some. Optional request fields are left
//! out when unset, so a client sends exactly what it means. `GET /metrics` answers Prometheus text, not JSON.
//!
//! Keys (`api_key`) are [`SecretString`]s: `Debug` never shows them, and only serialising (which puts them
//! on the wire, where they belong) exposes them.

use std::collections::BTreeMap;

use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize, Serializer};
use serde_json::Value;

pub use crate::export::{ExportStyle, ExportedSession, ExportedTrajectory};

/// `POST /grant_capacity` (admin): capacity += `count`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrantCapacityRequest {
    /// Sessions granted; absent means 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u32>,
}

/// What `POST /grant_capacity` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct GrantCapacityReply {
    /// The capacity after the grant; null when the proxy runs without capacity grants.
    pub capacity: Option<i64>,
}

/// `POST /rl/start_session` (admin).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartSessionRequest {
    /// The task the session serves; the session id is `<task_id>-<random suffix>`.
    pub task_id: String,
    /// The session's key; absent or empty means a fresh random key.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        serialize_with = "expose_option"
    )]
    pub api_key: Option<SecretString>,
    /// Free-form metadata (an object), copied into every exported trajectory; its `generation_args` become
    /// the session's defaults for fields a request omits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<Value>,
    /// Which integrity rules scan the session's generations (this project's; absent: the proxy's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub integrity: Option<IntegritySelection>,
}

/// A session's integrity rules ([`crate::integrity`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IntegritySelection {
    /// A profile of the proxy's [`crate::integrity::IntegrityConfig::profiles`]; absent: the default rules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub profile: Option<String>,
    /// The task's base commit (hex), when the row gives it: a hash naming it is not evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
}

impl StartSessionRequest {
    /// A request for `task_id` with a fresh key and no metadata.
    pub fn new(task_id: impl Into<String>) -> Self {
        Self {
            task_id: task_id.into(),
            api_key: None,
            metadata: None,
            integrity: None,
        }
    }
}

/// What `POST /rl/start_session` answers: the session and its key.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartSessionReply {
    /// The session id.
    pub session_id: String,
    /// The session's key (it stops working at `end_session`).
    #[serde(serialize_with = "expose")]
    pub api_key: SecretString,
}

/// `POST /rl/set_reward`: with the session's key (the session is the caller's), or with the admin key and
/// `session_id`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetRewardRequest {
    /// The session; required with the admin key, optional with the session's own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    /// The interaction (completion id as the client saw it); absent means the session's newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interaction_id: Option<String>,
    /// The reward (finite).
    pub reward: f64,
}

/// What `POST /rl/set_reward` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetRewardReply {
    /// `success`.
    pub message: String,
    /// The interaction the reward was set on.
    pub interaction_id: String,
}

/// `POST /rl/end_session`: with the session's key, or with the admin key and `session_id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndSessionRequest {
    /// The session; required with the admin key, optional with the session's own key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// What `POST /rl/end_session` answers: the session's flags.
///
/// Every field has a default when parsing, as the reference's reply has no `session_id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct EndSessionReply {
    /// `success`.
    pub message: String,
    /// The session.
    pub session_id: String,
    /// Interactions the session recorded.
    pub interaction_count: u64,
    /// A request overflowed the context window.
    pub context_overflow: bool,
    /// The first overflow's message.
    pub context_overflow_message: Option<String>,
    /// The proxy or engine failed on a request of the session.
    pub system_error: bool,
    /// The first failure's message.
    pub system_error_message: Option<String>,
    /// Integrity hits of the session's generations, per rule id (this project's; absent when none).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub integrity_hits: BTreeMap<String, u64>,
}

/// `POST /export_trajectories` (admin); the format is documented in [`crate::export`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    /// The session.
    pub session_id: String,
    /// How to cut the session into trajectories.
    #[serde(default)]
    pub style: ExportStyle,
    /// The reward discount across turns, `r_i += discount * r_{i+1}` (finite).
    #[serde(default = "one")]
    pub discount: f64,
    /// Drop retried requests nothing built on.
    #[serde(default, skip_serializing_if = "is_false")]
    pub drop_retry_orphans: bool,
    /// Overrides the newest interaction's reward before discounting (finite).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_reward: Option<f64>,
    /// The episode's reward for every leaf of a `concat` export whose graph is unambiguous (finite; see
    /// [`crate::export`]); absent leaves missing rewards as they are.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episode_reward: Option<f64>,
    /// Seconds to wait for `end_session` (non-negative); absent means the proxy's `export_wait_timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wait_timeout_seconds: Option<f64>,
    /// The reference's shared-tensor export; accepted and ignored (exports are always plain JSON).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub supports_shared_tensor_references: Option<bool>,
    /// The reference's evaluation flag; accepted and ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_eval: Option<bool>,
}

impl ExportRequest {
    /// An export of `session_id` in `style` with the proxy's defaults for everything else.
    pub fn new(session_id: impl Into<String>, style: ExportStyle) -> Self {
        Self {
            session_id: session_id.into(),
            style,
            discount: 1.0,
            drop_retry_orphans: false,
            final_reward: None,
            episode_reward: None,
            wait_timeout_seconds: None,
            supports_shared_tensor_references: None,
            is_eval: None,
        }
    }
}

/// What `POST /export_trajectories` answers.
pub type ExportReply = ExportedSession;

/// What `GET /health` answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HealthReply {
    /// `ok`.
    pub status: String,
    /// Always true: the proxy serves once it listens.
    pub initialized: bool,
    /// The model served.
    pub model: String,
    /// The engine's context window, in tokens.
    pub max_context_len: u64,
    /// Sessions held (started and not yet exported or expired).
    pub live_sessions: u64,
}

/// What `GET /v1/models` (and `/models`) answers: the one model served.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelList {
    /// `list`.
    pub object: String,
    /// The model.
    pub data: Vec<ModelCard>,
}

/// One model of [`ModelList`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelCard {
    /// The model name requests use.
    pub id: String,
    /// `model`.
    pub object: String,
    /// Always 0.
    pub created: u64,
    /// `arena-rl`.
    pub owned_by: String,
}

fn one() -> f64 {
    1.0
}

fn is_false(b: &bool) -> bool {
    !*b
}

fn expose<S: Serializer>(key: &SecretString, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(key.expose_secret())
}

fn expose_option<S: Serializer>(key: &Option<SecretString>, s: S) -> Result<S::Ok, S::Error> {
    match key {
        Some(k) => s.serialize_str(k.expose_secret()),
        None => s.serialize_none(),
    }
}

#[cfg(test)]
mod tests;
