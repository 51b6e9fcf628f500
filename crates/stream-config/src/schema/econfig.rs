//! The `econfig` section: every run-level Arena knob of the reference's `SWEEnvConfig` (spec 2.1).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::RouteMode;
use crate::error::Collector;
use crate::path::KeyPath;
use crate::schema::Seconds;
use crate::schema::lenient_json;
use crate::vocab::{FailurePolicy, LlmProtocol};

/// Where training prompts come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetSource {
    /// Rows of Arena Streams (the only source arena-rl trains on).
    #[default]
    Arena,
    /// A local JSONL file of prompts (the reference's non-Arena SWE path). It parses, so that validation can
    /// refuse it with a clear error: every launch needs an Arena Stream, so it cannot mean anything here.
    Jsonl,
}

/// The `econfig` section: how the run reaches Arena and which Streams it trains on.
///
/// Field names and defaults are the reference's. Exactly one of `arena_streams`, `arena_streams_yaml_b64` and
/// `arena_streams_file` may be set; with none, the legacy single-stream fields (`stream_id`, `arena_harness`,
/// `arena_llm_protocol`, `arena_task_envs`, `arena_reward_threshold`, `arena_reward_transform_fn`) describe one
/// stream named `default`. See [`crate::load_stream_configs`].
#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EConfig {
    /// Where prompts come from: `arena`, the only source arena-rl accepts (the reference's `jsonl` is refused).
    pub dataset_source: DatasetSource,
    /// Legacy single-stream mode: the Arena stream id; empty means the first ACTIVE stream.
    pub stream_id: String,
    /// Inline Stream definitions (objects with the fields of `StreamConfig`).
    #[serde(deserialize_with = "lenient_json::list")]
    pub arena_streams: Vec<serde_json::Value>,
    /// Stream definitions as base64 of a YAML document (`streams: [...]` or a bare list).
    pub arena_streams_yaml_b64: String,
    /// Stream definitions in a YAML (or JSON) file (`streams: [...]` or a bare list); `~` is expanded.
    pub arena_streams_file: String,
    /// Rows per mixture epoch; 0 means every row of every stream once, never padded.
    pub arena_mixture_epoch_size: i64,
    /// Directory for audit shards of task results; empty disables them.
    pub arena_result_dump_dir: String,
    /// `raw` results larger than this many bytes of compact JSON are dropped from audit records.
    pub arena_result_dump_max_bytes: u64,
    /// Arena control-plane base URL; the environment variable `ARENA_OPENAPI_BASE` also sets it.
    pub arena_base_url: String,
    /// Seconds allowed for stream and reward-ref lookups.
    pub arena_request_timeout: Seconds,
    /// Retries after a failed control-plane request (attempts = retries + 1).
    pub arena_request_retries: u32,
    /// Seconds between polls of a task's result.
    pub arena_poll_interval: Seconds,
    /// Seconds allowed to register, probe or delete an LLM route.
    pub arena_registration_timeout: Seconds,
    /// Seconds between liveness probes of a registered session-gateway route.
    pub arena_registration_probe_interval: Seconds,
    /// How Harnesses reach the rollout proxy: `gateway`, `session_gateway` or `direct`.
    pub arena_llm_route_mode: RouteMode,
    /// Protocols the registered route advertises to Arena's gateway.
    pub arena_inbound_protos: Vec<String>,
    /// Whether this Arena honours the `Idempotency-Key` every task launch carries (it answers a repeated key
    /// with the task it already started). Then a launch is retried after a transport error, and a resumed run
    /// finds the task of a launch its killed process sent. false (the default: Arena's published OpenAPI
    /// schema does not promise it) still sends the key, but never retries a launch that may have reached
    /// Arena, and a resumed run warns of the launches a kill left without an answer.
    pub arena_idempotent_launch: bool,
    /// Whether this Arena has `POST /openapi/v1/tasks/{task_id}/cancel`. Then a task the run stops waiting
    /// for (a timeout, a failed journal write) is cancelled, and a resumed run cancels the tasks its killed
    /// process had started (their ids are journaled) before launching those samples afresh. false (the
    /// default: Arena's published OpenAPI schema has no cancel endpoint) sends none: with
    /// `arena_idempotent_launch` a resumed run relaunches each such sample under the key that started its task,
    /// so Arena answers with that task and the run collects it; without it those tasks are left running, named
    /// in one warning.
    pub arena_cancel_tasks: bool,
    /// Whether a Stream Arena refuses at start (not ACTIVE, a drifted reward ref, an unpublished harness) is
    /// left out and the run trains on the others, logging the new mixture weights. false (the default) stops
    /// the run naming the Stream and Arena's reason, since leaving it out silently changes the mixture.
    pub arena_skip_refused_streams: bool,
    /// Which rules decide what a failed task means for training: `merged_main` (the default, AReaL's main
    /// today), `strict_receipt` (AReaL #1750: only a valid native v1 receipt makes a failure the model's),
    /// `pr1547` (the rules of AReaL #1547, for an Arena that reports no outcome codes); see
    /// docs/failure-dispositions.md.
    pub arena_failure_policy: FailurePolicy,
    /// Legacy single-stream mode: the Harness protocol (`anthropic`, `responses`, `chat_completions`);
    /// empty means inferred from the harness.
    pub arena_llm_protocol: String,
    /// Harness `key@version` for streams that name none; empty means each stream's default Harness.
    pub arena_harness: String,
    /// Harness environment variables for every stream (a stream's own `task_envs` win).
    pub arena_task_envs: BTreeMap<String, String>,
    /// Legacy single-stream mode: reward binarisation threshold (or transform argument).
    pub arena_reward_threshold: Option<f64>,
    /// Legacy single-stream mode: reward transform name.
    pub arena_reward_transform_fn: String,
    /// Seconds one episode (launch and wait for the result) may take.
    pub timeout: Seconds,
}

/// `Debug` shows what a saved config shows ([`crate::redact`]): every `task_envs` and `arena_task_envs` value
/// and the credentials inside `arena_streams_yaml_b64` withheld, credentials elsewhere redacted.
impl fmt::Debug for EConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let value = serde_json::to_value(self).map_err(|_| fmt::Error)?;
        write!(f, "EConfig {}", crate::redact(&value, &crate::Secrets::none()))
    }
}

impl Default for EConfig {
    fn default() -> Self {
        Self {
            dataset_source: DatasetSource::Arena,
            stream_id: String::new(),
            arena_streams: Vec::new(),
            arena_streams_yaml_b64: String::new(),
            arena_streams_file: String::new(),
            arena_mixture_epoch_size: 0,
            arena_result_dump_dir: String::new(),
            arena_result_dump_max_bytes: 1_000_000,
            arena_base_url: String::new(),
            arena_request_timeout: Seconds::of(60.0),
            arena_request_retries: 3,
            arena_poll_interval: Seconds::of(5.0),
            arena_registration_timeout: Seconds::of(180.0),
            arena_registration_probe_interval: Seconds::of(60.0),
            arena_llm_route_mode: RouteMode::Gateway,
            arena_inbound_protos: vec!["chat".to_string()],
            arena_idempotent_launch: false,
            arena_cancel_tasks: false,
            arena_skip_refused_streams: false,
            arena_failure_policy: FailurePolicy::MergedMain,
            arena_llm_protocol: String::new(),
            arena_harness: String::new(),
            arena_task_envs: BTreeMap::new(),
            arena_reward_threshold: None,
            arena_reward_transform_fn: String::new(),
            timeout: Seconds::of(1800.0),
        }
    }
}

impl EConfig {
    /// Checks the run-level rules of this section (not the Streams; see [`crate::load_stream_configs`]).
    pub(crate) fn validate(&self, at: &KeyPath, batch_size: u64, c: &mut Collector) {
        let seconds = [
            ("arena_request_timeout", self.arena_request_timeout),
            ("arena_poll_interval", self.arena_poll_interval),
            ("arena_registration_timeout", self.arena_registration_timeout),
            (
                "arena_registration_probe_interval",
                self.arena_registration_probe_interval,
            ),
            ("timeout", self.timeout),
        ];
        for (field, value) in seconds {
            value.check(c, at.key(field));
        }
        if self.dataset_source == DatasetSource::Jsonl {
            c.push(
                at.key("dataset_source"),
                "jsonl is not supported: every launch needs an Arena Stream, so prompts come only from `arena`",
            );
        }
        let epoch = self.arena_mixture_epoch_size;
        if epoch < 0 {
            c.push(
                at.key("arena_mixture_epoch_size"),
                format!("must be >= 0, got {epoch}"),
            );
        } else if epoch > 0 && batch_size > 0 && !epoch.unsigned_abs().is_multiple_of(batch_size) {
            c.push(
                at.key("arena_mixture_epoch_size"),
                format!(
                    "{epoch} must be divisible by the training batch size {batch_size} (train_dataset.batch_size)"
                ),
            );
        }
        let protocol = self.arena_llm_protocol.trim();
        if !protocol.is_empty()
            && let Err(e) = protocol.parse::<LlmProtocol>()
        {
            c.push(at.key("arena_llm_protocol"), e.to_string());
        }
        if let Some(t) = self.arena_reward_threshold
            && !t.is_finite()
        {
            c.push(
                at.key("arena_reward_threshold"),
                format!("must be finite, got {t}"),
            );
        }
        for key in self.arena_task_envs.keys() {
            if key.trim().is_empty() {
                c.push(
                    at.key("arena_task_envs"),
                    "environment variable names must be non-empty",
                );
            }
        }
        if self.arena_inbound_protos.is_empty() {
            c.push(at.key("arena_inbound_protos"), "must name at least one protocol");
        }
        for (i, proto) in self.arena_inbound_protos.iter().enumerate() {
            if proto.trim().is_empty() {
                c.push(at.key("arena_inbound_protos").index(i), "must be non-empty");
            }
        }
        let base = self.arena_base_url.trim();
        if !(base.is_empty() || base.starts_with("http://") || base.starts_with("https://")) {
            c.push(
                at.key("arena_base_url"),
                "must be an http:// or https:// URL (the value is not echoed: it may carry credentials)",
            );
        }
    }
}
