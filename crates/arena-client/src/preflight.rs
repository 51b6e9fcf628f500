//! Preflight (reference section 3): before a run is submitted, check every configured stream against the
//! live Arena and summarise what the run will train on.
//!
//! Per stream, in order: the stream is `ACTIVE`; its live reward ref is complete and matches a pinned one;
//! the harness resolves to `key@version` and that version is `PUBLISHED`; the dataset has rows; and the
//! recent tasks with the same harness and grader are healthy enough.

use serde::Serialize;
use stream_config::{ArenaRef, LlmProtocol, RewardRef, StreamConfig, reward_ref_drift};

use crate::{ArenaClient, Error, Result};

/// The preflight thresholds (the reference's CLI defaults).
#[derive(Debug, Clone, PartialEq)]
pub struct PreflightOptions {
    /// How many recent tasks to inspect (at least 1; default 100).
    pub recent_tasks: u32,
    /// Fewer terminal tasks than this is unhealthy (default 1).
    pub min_terminal_tasks: u64,
    /// A failure rate at or above this is unhealthy (within [0, 1]; default 0.8).
    pub max_failure_rate: f64,
    /// Report an unhealthy stream instead of failing.
    pub allow_unhealthy: bool,
}

impl Default for PreflightOptions {
    fn default() -> Self {
        Self {
            recent_tasks: 100,
            min_terminal_tasks: 1,
            max_failure_rate: 0.8,
            allow_unhealthy: false,
        }
    }
}

impl PreflightOptions {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<()> {
        if self.recent_tasks < 1 {
            return Err(Error::Invalid("--recent-tasks must be at least 1".to_string()));
        }
        if !(0.0..=1.0).contains(&self.max_failure_rate) {
            return Err(Error::Invalid(format!(
                "--max-failure-rate must be within [0, 1], got {}",
                self.max_failure_rate
            )));
        }
        Ok(())
    }
}

/// One stream's preflight record (an element of `preflight.json`'s `streams`): the resolved stream with env
/// names instead of values, plus what preflight measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StreamSummary {
    /// The stream's mixture name.
    pub name: String,
    /// The Arena stream id.
    pub stream_id: String,
    /// The mixture weight.
    pub sampling_weight: f64,
    /// The harness, resolved to `key@version`.
    pub harness: String,
    /// The harness protocol, configured or inferred.
    pub llm_protocol: LlmProtocol,
    /// The names of the stream's task envs, sorted; values are withheld as possibly secret.
    pub task_envs: Vec<String>,
    /// The live reward ref the run pins (empty when the stream has none).
    pub expected_reward_ref: RewardRef,
    /// The reward threshold.
    pub reward_threshold: Option<f64>,
    /// The reward transform.
    pub reward_transform_fn: String,
    /// Rows in the stream's dataset.
    pub dataset_total: u64,
    /// Recent tasks with this harness and grader that reached a terminal status.
    pub recent_terminal_tasks: u64,
    /// Of those, how many failed.
    pub recent_failures: u64,
    /// `recent_failures / recent_terminal_tasks` (0 without terminal tasks).
    pub recent_failure_rate: f64,
    /// The stream failed the health rule and `allow_unhealthy` let it pass.
    pub unhealthy_override: bool,
}

/// Checks every stream in order and returns their summaries; the first failing stream stops preflight with
/// an error naming it.
pub async fn preflight(
    client: &ArenaClient,
    streams: &[StreamConfig],
    options: &PreflightOptions,
) -> Result<Vec<StreamSummary>> {
    options.validate()?;
    let mut summaries = Vec::with_capacity(streams.len());
    for stream in streams {
        let summary = preflight_stream(client, stream, options).await.map_err(|e| {
            e.context(format!(
                "preflight of stream {} ({})",
                stream.name, stream.stream_id
            ))
        })?;
        summaries.push(summary);
    }
    Ok(summaries)
}

/// Checks one stream (reference section 3.2).
pub async fn preflight_stream(
    client: &ArenaClient,
    stream: &StreamConfig,
    options: &PreflightOptions,
) -> Result<StreamSummary> {
    let stream_id = stream.stream_id.as_str();
    if stream_id.trim().is_empty() {
        return Err(Error::Invalid("preflight requires a stream_id".to_string()));
    }
    let info = client.get_stream(stream_id).await?;
    if info.status.as_deref() != Some("ACTIVE") {
        return Err(Error::Rejected(format!(
            "stream {stream_id} reports no status; preflight requires ACTIVE"
        )));
    }
    let live = info.live_reward_ref()?;
    if let Some(drift) = reward_ref_drift(&stream.expected_reward_ref, live.as_ref()) {
        return Err(Error::Rejected(format!(
            "stream {stream_id} reward_ref drifted: {drift}"
        )));
    }
    let harness = if stream.harness.is_empty() {
        info.default_harness().unwrap_or_default()
    } else {
        stream.harness.clone()
    };
    let Some(harness_ref) = ArenaRef::parse(&harness) else {
        return Err(Error::Rejected(format!(
            "stream {stream_id} requires Harness key@version, got {harness:?}"
        )));
    };
    let version = client
        .get_harness_version(&harness_ref.key, &harness_ref.version)
        .await?;
    if version.status.as_deref() != Some("PUBLISHED") {
        return Err(Error::Rejected(format!(
            "harness {harness} is {}, not PUBLISHED",
            version.status.as_deref().unwrap_or("without a status")
        )));
    }
    let dataset_total = client.dataset_total(stream_id).await?;
    let tasks = client.list_stream_tasks(stream_id, options.recent_tasks).await?;
    let (mut terminal, mut failures) = (0u64, 0u64);
    for task in &tasks {
        if task.harness_ref.as_ref() != Some(&harness_ref) {
            continue;
        }
        if let Some(live) = &live
            && task.reward_ref.as_ref() != Some(live)
        {
            continue;
        }
        let status = stream_config::TaskStatus::parse(&task.status);
        if status.is_success() {
            terminal += 1;
        } else if status.is_failure() {
            terminal += 1;
            failures += 1;
        }
    }
    let failure_rate = if terminal == 0 {
        0.0
    } else {
        failures as f64 / terminal as f64
    };
    let unhealthy = terminal < options.min_terminal_tasks || failure_rate >= options.max_failure_rate;
    if unhealthy && !options.allow_unhealthy {
        return Err(Error::Rejected(format!(
            "stream {stream_id} failed health check: terminal={terminal}, failures={failures}, \
             failure_rate={failure_rate}"
        )));
    }
    Ok(StreamSummary {
        name: stream.name.clone(),
        stream_id: stream_id.to_string(),
        sampling_weight: stream.sampling_weight,
        llm_protocol: stream
            .llm_protocol
            .unwrap_or_else(|| LlmProtocol::infer_from_harness(&harness)),
        harness,
        task_envs: stream.task_envs.keys().cloned().collect(),
        expected_reward_ref: live.unwrap_or_default(),
        reward_threshold: stream.reward_threshold,
        reward_transform_fn: stream.reward_transform_fn.clone(),
        dataset_total,
        recent_terminal_tasks: terminal,
        recent_failures: failures,
        recent_failure_rate: failure_rate,
        unhealthy_override: unhealthy,
    })
}
