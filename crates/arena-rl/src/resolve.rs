//! Stream resolution at dataset-load time (reference section 2.5), row loading, mixing and sharding.
//!
//! For each configured stream: the stream is fetched (explicit id) or discovered (first ACTIVE); the live
//! reward ref must equal a pinned one ("reward_ref drifted"), and it replaces `expected_reward_ref` so every
//! run pins the grader that was live at load time; the protocol is resolved (override, harness, or the
//! stream's default harness). Then every stream's rows are downloaded, mixed by weight
//! (`stream_config::mixture`), and this worker's shard is kept.

use std::collections::BTreeMap;

use arena_client::{ArenaClient, Dataset, DatasetRow, resolve_protocol};
use reward_routing::{RewardRule, RewardSettings, RowMeta, TransformRegistry};
use seeds::splitmix;
use stream_config::{LlmProtocol, RewardRef, StreamConfig, reward_ref_drift};

use crate::error::{Context as _, Error, Result};

/// A stream as rollouts use it: its resolved config and its reward rule.
#[derive(Debug, Clone)]
pub struct ResolvedStream {
    /// The config, with `stream_id`, `llm_protocol` and `expected_reward_ref` filled from the live stream.
    pub config: StreamConfig,
    /// The reward rule (threshold, transform).
    pub rule: RewardRule,
    /// The ref the user pinned before resolution (empty when none): the live drift check before each launch
    /// runs only for pinned streams, as in the reference.
    pub pinned: RewardRef,
    /// The proxy's integrity profile its sessions name (`guard.streams.NAME` with rules of its own); `None`
    /// for the run-wide rules.
    pub integrity_profile: Option<String>,
}

impl ResolvedStream {
    /// Applies the run's settings for this stream that its Stream entry does not hold: the failure policy
    /// (`econfig.arena_failure_policy`) and the `guard`'s integrity policy and rule ids on the reward rule, and
    /// its proxy profile.
    pub fn with_guard(&mut self, config: &stream_config::RunConfig) -> Result<()> {
        let name = self.config.name.clone();
        let rules = config
            .guard
            .rule_set(Some(&name))
            .map_err(|e| Error::Invalid(format!("guard, stream {name}: {e}")))?;
        let ids = rules.specs().iter().map(|s| s.id.clone());
        self.rule = self
            .rule
            .clone()
            .with_integrity(config.guard.policy(Some(&name)), ids)
            .with_failure_policy(config.econfig.arena_failure_policy)
            .with_sample_level_rejection(config.gconfig.reject_terminal_task_failures);
        self.integrity_profile = crate::run::settings::integrity_profile(config, &name);
        Ok(())
    }
}

/// One prompt row: the dataset row plus what routing needs.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptRow {
    /// The stream name.
    pub stream: String,
    /// The row as Arena listed it.
    pub row: DatasetRow,
    /// The reward ref the row was loaded under (`reward_ref_key/version`).
    pub reward_ref: RewardRef,
}

impl PromptRow {
    /// The row as reward-routing sees it, with the stream's expected reward ref.
    pub fn meta(&self, stream: &ResolvedStream) -> RowMeta {
        RowMeta {
            data_id: self.row.data_id.clone(),
            stream_name: self.stream.clone(),
            stream_id: self.row.stream_id.clone(),
            task_type: self.row.arena_task_type.clone(),
            expected_reward_ref: stream.config.expected_reward_ref.clone(),
        }
    }
}

/// Resolves every stream (section 2.5 steps 1-4).
pub async fn resolve_streams(
    client: &ArenaClient,
    streams: &[StreamConfig],
    registry: &TransformRegistry,
) -> Result<Vec<ResolvedStream>> {
    let mut out = Vec::with_capacity(streams.len());
    for s in streams {
        let info = if s.stream_id.trim().is_empty() {
            client
                .first_active_stream()
                .await
                .with_context(|| format!("stream {}: no ACTIVE stream to train on", s.name))?
        } else {
            client
                .get_stream(&s.stream_id)
                .await
                .with_context(|| format!("stream {} ({})", s.name, s.stream_id))?
        };
        if info.stream_id.trim().is_empty() {
            return Err(Error::Invalid(format!(
                "stream {}: Arena resolved it to an empty stream_id",
                s.name
            )));
        }
        let live = info
            .live_reward_ref()
            .with_context(|| format!("stream {}", s.name))?
            .unwrap_or_default();
        let pinned = s.expected_reward_ref.clone();
        if let Some(drift) = reward_ref_drift(&pinned, Some(&live)) {
            return Err(Error::RewardRefDrifted {
                stream: s.name.clone(),
                stream_id: info.stream_id.clone(),
                drift: Box::new(drift),
            });
        }
        let protocol = resolve_protocol(
            s.llm_protocol.map(LlmProtocol::as_str),
            Some(s.harness.as_str()),
            Some(&info),
        )
        .with_context(|| format!("stream {}", s.name))?;
        let mut config = s.clone();
        config.stream_id = info.stream_id.clone();
        config.llm_protocol = Some(protocol);
        config.expected_reward_ref = live;
        let rule = RewardRule::new(
            &s.name,
            &RewardSettings {
                reward_threshold: s.reward_threshold,
                reward_transform_fn: s.reward_transform_fn.clone(),
            },
            registry,
        )
        .with_context(|| format!("stream {}: reward settings", s.name))?;
        out.push(ResolvedStream {
            config,
            rule,
            pinned,
            integrity_profile: None,
        });
    }
    Ok(out)
}

/// Downloads every stream's rows, mixes them by weight, and keeps this worker's shard.
pub async fn load_rows(
    client: &ArenaClient,
    streams: &[ResolvedStream],
    epoch_size: i64,
    batch_size: usize,
    worker: (usize, usize),
) -> Result<Vec<PromptRow>> {
    let mut per_stream = Vec::with_capacity(streams.len());
    for s in streams {
        let protocol = s.config.llm_protocol.unwrap_or(LlmProtocol::ChatCompletions);
        let dataset = client
            .get_all_dataset_rows(&s.config.stream_id, protocol)
            .await
            .with_context(|| format!("stream {}: loading rows", s.config.name))?;
        let rows: Vec<PromptRow> = dataset
            .into_rows()
            .into_iter()
            .map(|row| PromptRow {
                stream: s.config.name.clone(),
                row,
                reward_ref: s.config.expected_reward_ref.clone(),
            })
            .collect();
        per_stream.push(rows);
    }
    let configs: Vec<StreamConfig> = streams.iter().map(|s| s.config.clone()).collect();
    let mixed = stream_config::mixture::build_weighted_rows(&configs, per_stream, epoch_size, batch_size)
        .context("mixing the streams' rows")?;
    let (index, count) = worker;
    if count <= 1 {
        return Ok(mixed);
    }
    // Shard by position with the same rule as `Dataset::shard`, keeping the stream of each row.
    let ids = Dataset::new(mixed.iter().map(|r| r.row.clone()).collect())
        .shard(index, count)
        .context("sharding the rows across rollout workers")?
        .into_rows();
    let mut by_id: BTreeMap<(String, String), PromptRow> = mixed
        .into_iter()
        .map(|r| ((r.row.stream_id.clone(), r.row.data_id.clone()), r))
        .collect();
    Ok(ids
        .into_iter()
        .filter_map(|r| by_id.remove(&(r.stream_id, r.data_id)))
        .collect())
}

/// Which rows each step rolls out: consecutive batches of the (optionally shuffled) row order, with a new
/// deterministic shuffle each epoch, so that a resumed run sees the same batches. Like a data loader with
/// `drop_last`, an epoch holds `rows / batch` full batches and drops the tail; without it, the epoch's last
/// batch is short. Rows are never repeated within an epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RowCursor {
    rows: usize,
    batch_size: usize,
    shuffle: bool,
    drop_last: bool,
    seed: u64,
}

impl RowCursor {
    /// A cursor over `rows` rows in batches of `batch_size` (at least 1).
    pub fn new(rows: usize, batch_size: usize, shuffle: bool, drop_last: bool, seed: u64) -> Self {
        Self {
            rows,
            batch_size: batch_size.max(1),
            shuffle,
            drop_last,
            seed,
        }
    }

    /// Batches per epoch (0 when `drop_last` and there are fewer rows than one batch).
    pub fn batches_per_epoch(&self) -> u64 {
        let full = self.rows / self.batch_size;
        let short = usize::from(!self.drop_last && !self.rows.is_multiple_of(self.batch_size));
        (full + short) as u64
    }

    /// Rows an epoch leaves out (`drop_last` only).
    pub fn dropped_tail(&self) -> usize {
        if self.drop_last {
            self.rows % self.batch_size
        } else {
            0
        }
    }

    /// The row indices of step `step`.
    pub fn step_indices(&self, step: u64) -> Vec<usize> {
        let per_epoch = self.batches_per_epoch();
        if per_epoch == 0 {
            return Vec::new();
        }
        let epoch = step / per_epoch;
        let within = (step % per_epoch) as usize;
        let order = self.epoch_order(epoch);
        let start = within * self.batch_size;
        let end = (start + self.batch_size).min(self.rows);
        order[start..end].to_vec()
    }

    /// The row order of epoch `epoch`.
    fn epoch_order(&self, epoch: u64) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.rows).collect();
        if self.shuffle {
            let mut state = self.seed ^ epoch.wrapping_mul(0x9e37_79b9_7f4a_7c15);
            for i in (1..order.len()).rev() {
                state = splitmix(state);
                order.swap(i, (state % (i as u64 + 1)) as usize);
            }
        }
        order
    }

    /// The row indices of dynamic sampling's extra draws `from..from + n` of step `step` (draw 0 is the first
    /// one after the step's batch). Each step has its own deterministic order of the rows outside its batch
    /// (all rows when the batch holds them all), cycled when a step draws more than that; the same step and
    /// draw index always name the same row, so a resumed run redraws exactly what it journaled.
    pub fn extra_indices(&self, step: u64, from: usize, n: usize) -> Vec<usize> {
        if self.rows == 0 {
            return Vec::new();
        }
        let batch: std::collections::BTreeSet<usize> = self.step_indices(step).into_iter().collect();
        let mut order: Vec<usize> = (0..self.rows).filter(|i| !batch.contains(i)).collect();
        if order.is_empty() {
            order = (0..self.rows).collect();
        }
        let mut state = self.seed ^ 0x6a09_e667_f3bc_c909 ^ step.wrapping_mul(0xbb67_ae85_84ca_a73b);
        for i in (1..order.len()).rev() {
            state = splitmix(state);
            order.swap(i, (state % (i as u64 + 1)) as usize);
        }
        (from..from + n).map(|d| order[d % order.len()]).collect()
    }

    /// The rows of step `step`.
    pub fn step_rows(&self, rows: &[PromptRow], step: u64) -> Vec<PromptRow> {
        self.step_indices(step)
            .into_iter()
            .filter_map(|i| rows.get(i).cloned())
            .collect()
    }
}

/// A stable 64-bit seed from text (FNV-1a).
pub fn seed_of(text: &str) -> u64 {
    seeds::fnv1a(text.as_bytes())
}

#[cfg(test)]
mod tests;
