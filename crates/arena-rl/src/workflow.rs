//! The rollout workflow: one prompt row becomes a group of `n_samples` rollouts, each a proxy session and an
//! Arena task, routed into a reward and exported as token-exact trajectories (reference sections 4.1, 6.4).
//!
//! One sample, in order ([`sample`]): grant capacity and start a proxy session; run the Arena side with
//! `arena_client::ArenaClient::run_rollout_with` (the reward-ref checks, the route for the mode, launch,
//! poll, cleanup), whose hooks journal every route name, launch, task id, deleted route and finished task
//! before Arena can act on it ([`hooks`]), so a killed run's leftovers can be cleaned
//! ([`Workflow::clean_leftovers`]); end the session; route the outcome with reward-routing (reward, zero
//! reward or rejection); set the reward; export the session; record episode metrics (the rollout report's
//! lifecycle metrics among them) and the audit record; journal the finished rollout. A journal write that
//! fails stops the run with [`crate::Error::Journal`].
//!
//! A group is assembled from its samples' verdicts by reward-routing (`assemble_group`), then filtered by the
//! dynamic filter; the accepted groups of a step get their advantages from `RewardConfig::advantages`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use arena_client::{ArenaClient, RouteSetup};
use reward_routing::{
    AuditWriter, DynamicFilter, Group, GroupRejection, Metric, RejectReason, SampleResult, Scope,
    assemble_group, group_metrics,
};
use secrecy::SecretString;
use tokio::sync::Semaphore;

use crate::error::{Context as _, Result};
use crate::journal::{Entry, Journal, RolloutRecord, SampleKey, Verdict};
use crate::proxy_control::ProxyControl;
use crate::resolve::{PromptRow, ResolvedStream};

mod hooks;
mod sample;

/// Mints per-session tokens for session-gateway launches (the proxy's HMAC, from its state).
pub type TokenMinter = Arc<dyn Fn(&str) -> SecretString + Send + Sync>;

/// Everything a sample needs, shared by all rollouts of a worker.
pub struct Workflow {
    /// The Arena client.
    pub client: ArenaClient,
    /// How harnesses reach the proxy.
    pub routing: RouteSetup,
    /// The proxy's generation-only gateway key (`session_gateway` mode).
    pub gateway_key: Option<SecretString>,
    /// The proxy's control client.
    pub proxy: ProxyControl,
    /// The proxy's address as Arena sees it.
    pub proxy_public_url: String,
    /// Session tokens for `session_gateway` mode.
    pub session_token: TokenMinter,
    /// The resolved streams, by name.
    pub streams: Vec<ResolvedStream>,
    /// The journal.
    pub journal: Journal,
    /// The audit shard writer, when `arena_result_dump_dir` is set.
    pub audit: Option<Arc<AuditWriter>>,
    /// Rollouts in flight at once.
    pub limiter: Arc<Semaphore>,
    /// The episode deadline (`econfig.timeout`).
    pub episode_timeout: Duration,
    /// Arena honours the `Idempotency-Key` every launch carries (`econfig.arena_idempotent_launch`).
    pub idempotent_launch: bool,
    /// The run's id: its names and the journal's nonce (prefix of idempotency keys).
    pub run_id: String,
    /// Per sample, the launches an earlier process had answered (`JournalState::answered_launches`): the
    /// sample's next launch key carries that count, so it never names a task the run cancelled.
    pub answered_launches: BTreeMap<SampleKey, u32>,
    /// Samples whose task an earlier process started and this Arena can hand back but not cancel: each is
    /// relaunched under the key that started that task (`run::leftovers`).
    pub resume_keys: BTreeMap<SampleKey, String>,
    /// `proxy.export_style` (`concat` or `individual`).
    pub export_style: rollout_proxy::ExportStyle,
    /// `proxy.turn_discount`.
    pub turn_discount: f64,
    /// `proxy.episode_reward_for_export`: a successful task's reward scores every chain of its `concat`
    /// export when the session's graph is unambiguous.
    pub episode_reward_for_export: bool,
    /// Samples per group.
    pub n_samples: u32,
    /// The policy version sessions start under (for records).
    pub policy_version: Arc<AtomicU64>,
    /// Rollout-time group handling (`gconfig.drop_incomplete_group`, `gconfig.reward_normalization`).
    pub group_settings: reward_routing::GroupSettings,
}

/// One finished group.
#[derive(Debug, Clone)]
pub struct GroupRun {
    /// The prompt row.
    pub row: PromptRow,
    /// Its samples' records, in sample order.
    pub records: Vec<RolloutRecord>,
    /// Metrics recorded by its samples (lifecycle, decisions, episode metrics).
    pub metrics: Vec<Metric>,
}

/// How a group ends up.
#[derive(Debug, Clone)]
pub enum GroupFate {
    /// It trains.
    Accepted(Group),
    /// It was rejected; `reason` is a stable label counted in `rollout/group_rejected/<reason>`.
    Rejected {
        /// The label.
        reason: String,
    },
}

impl Workflow {
    fn stream(&self, name: &str) -> Option<&ResolvedStream> {
        self.streams.iter().find(|s| s.config.name == name)
    }

    /// The `Idempotency-Key` of sample `key`'s launch in this process: the key that started a task left to
    /// collect ([`Workflow::resume_keys`]), else the run id and the sample, plus `-r<n>` once `n` earlier
    /// launches of it were answered.
    pub fn launch_key(&self, key: SampleKey) -> String {
        if let Some(resumed) = self.resume_keys.get(&key) {
            return resumed.clone();
        }
        match self.answered_launches.get(&key) {
            Some(n) if *n > 0 => format!("{}-{key}-r{n}", self.run_id),
            _ => format!("{}-{key}", self.run_id),
        }
    }

    /// Runs a whole group: `n_samples` rollouts of `row`, concurrently (bounded by the limiter). Samples whose
    /// records are already in `done` are not run again. Fails only when the journal cannot be written.
    pub async fn run_group(
        self: &Arc<Self>,
        step: u64,
        group: u32,
        row: &PromptRow,
        scope: Scope,
        done: &BTreeMap<SampleKey, RolloutRecord>,
    ) -> Result<GroupRun> {
        let eval = scope == Scope::EvalRollout;
        let mut handles = Samples(Vec::new());
        for sample in 0..self.n_samples {
            let key = SampleKey {
                eval,
                step,
                group,
                sample,
            };
            if let Some(record) = done.get(&key) {
                if record.stream != row.stream || record.data_id != row.row.data_id {
                    return Err(crate::Error::JournalMismatch {
                        path: self.journal.path().to_path_buf(),
                        what: "rollout",
                        key: key.to_string(),
                        journaled: format!("{}/{}", record.stream, record.data_id),
                        drawn: format!("{}/{}", row.stream, row.row.data_id),
                    });
                }
                handles
                    .0
                    .push(tokio::spawn(std::future::ready(Ok((record.clone(), Vec::new())))));
                continue;
            }
            let me = self.clone();
            let row = row.clone();
            handles
                .0
                .push(tokio::spawn(async move { me.run_sample(key, &row, scope).await }));
        }
        let mut records = Vec::new();
        let mut metrics = Vec::new();
        for h in &mut handles.0 {
            let (record, m) = h.await.context("a rollout")??;
            records.push(record);
            metrics.extend(m);
        }
        Ok(GroupRun {
            row: row.clone(),
            records,
            metrics,
        })
    }

    /// Assembles, filters and counts one group (group metrics included).
    pub fn judge(&self, run: &GroupRun, filter: &DynamicFilter, scope: Scope) -> (GroupFate, Vec<Metric>) {
        let mut metrics = Vec::new();
        let samples: Vec<SampleResult> = run
            .records
            .iter()
            .map(|r| match &r.verdict {
                Verdict::Reward { reward } => SampleResult::Reward(*reward),
                Verdict::Dropped { .. } => SampleResult::Dropped,
                Verdict::Rejected { reason, message } => SampleResult::Rejected(RejectReason::Error {
                    message: format!("{reason}: {message}"),
                }),
            })
            .collect();
        let rewards: Vec<Option<f64>> = run
            .records
            .iter()
            .map(|r| match r.verdict {
                Verdict::Reward { reward } => Some(reward),
                _ => None,
            })
            .collect();
        if let Some(stream) = self.stream(&run.row.stream) {
            let meta = run.row.meta(stream);
            if let Ok(m) = group_metrics(scope, &meta, &stream.rule, &rewards, rewards.len()) {
                metrics.extend(m);
            }
        }
        let fate = match assemble_group(&samples, &self.group_settings) {
            Err(rejection) => {
                let reason = match &rejection {
                    GroupRejection::SampleRejected { index, .. } => match &run.records[*index].verdict {
                        Verdict::Rejected { reason, .. } => format!("sample_{reason}"),
                        _ => rejection.kind().to_string(),
                    },
                    other => other.kind().to_string(),
                };
                GroupFate::Rejected { reason }
            }
            Ok(group) => match filter.check(&group) {
                Ok(v) if v.accept => GroupFate::Accepted(group),
                Ok(v) => {
                    metrics.extend(v.metrics(scope));
                    GroupFate::Rejected {
                        reason: if v.all_correct {
                            "all_correct".to_string()
                        } else {
                            "all_wrong".to_string()
                        },
                    }
                }
                Err(e) => GroupFate::Rejected {
                    reason: format!("filter_error: {e}"),
                },
            },
        };
        (fate, metrics)
    }

    /// Closes the session-gateway registry (deleting its routes) and journals what is gone; returns the
    /// routes whose deletion failed.
    pub async fn close(&self) -> Result<Vec<String>> {
        let RouteSetup::SessionGateway { registry, .. } = &self.routing else {
            return Ok(Vec::new());
        };
        let report = registry.close().await;
        let deleted: Vec<Entry> = report
            .deleted
            .iter()
            .map(|name| Entry::RouteDeleted { name: name.clone() })
            .collect();
        self.journal.append_all(&deleted)?;
        Ok(report.failed)
    }

    /// Deletes routes and cancels tasks a killed process left behind (from the journal), journaling each.
    /// Returns `(routes deleted, tasks cancelled)`.
    pub async fn clean_leftovers(
        client: &ArenaClient,
        journal: &Journal,
        routes: &BTreeSet<String>,
        tasks: &BTreeSet<String>,
        timeout: Duration,
    ) -> Result<(usize, usize)> {
        let mut deleted = 0;
        for name in routes {
            match client.delete_model(name, Some(timeout)).await {
                Ok(()) => {
                    journal.append(&Entry::RouteDeleted { name: name.clone() })?;
                    deleted += 1;
                }
                Err(e) => tracing::warn!(model_name = %name, error = %e, "cannot delete a leftover route"),
            }
        }
        let mut cancelled = 0;
        for task_id in tasks {
            let outcome = client.cancel_task_best_effort(task_id).await;
            journal.append(&Entry::TaskDone {
                task_id: task_id.clone(),
            })?;
            if outcome == Some(arena_client::CancelOutcome::Cancelled) {
                cancelled += 1;
            }
        }
        Ok((deleted, cancelled))
    }
}

/// A group's sample tasks, aborted when the group is dropped before they finish: a run that stops (an error
/// in another group, an evaluation interrupted) leaves no rollout of it running on, which could still
/// journal a result the next run would read.
struct Samples(Vec<tokio::task::JoinHandle<Result<SampleRun>>>);

/// One sample's record and the metrics to record for it.
type SampleRun = (RolloutRecord, Vec<Metric>);

impl Drop for Samples {
    fn drop(&mut self) {
        for handle in &self.0 {
            handle.abort();
        }
    }
}
