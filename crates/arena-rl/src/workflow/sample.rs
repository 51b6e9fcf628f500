//! One sample from session start to journaled record: the proxy session around the Arena side, the routed
//! outcome, the reward, the export, and the verdict the group is assembled from.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use arena_client::{RewardRefCheck, RolloutReport, RolloutSpec, RunOptions, TaskResult};
use reward_routing::{
    AuditRecord, Decision, Episode, ErrorStage, IntegrityFinding, Lifecycle, Metric, Outcome, Routed,
    SampleResult, Scope, TaskOutcome, route_outcome,
};
use rollout_proxy::ExportedTrajectory;

use super::Workflow;
use super::hooks::{JournalHooks, lifecycle_metrics};
use crate::error::Result;
use crate::journal::{AuditEntry, Entry, RolloutRecord, RoutingFacts, SampleKey, Verdict};
use crate::proxy_control::Session;
use crate::resolve::{PromptRow, ResolvedStream};
use rollout_proxy::control::wire::{EndSessionReply, IntegritySelection};

/// The task env that bounds a harness's wait for one model answer, in seconds.
pub(crate) const HARNESS_LLM_TIMEOUT_ENV: &str = "DSH_LLM_REQUEST_TIMEOUT_SECONDS";
/// Its value in training task envs when neither the run nor the stream sets it: two hours.
pub(crate) const HARNESS_LLM_TIMEOUT_TRAINING: &str = "7200";

fn reject(record: &mut RolloutRecord, reason: &str, message: String) {
    tracing::warn!(sample = %record.key, reason, %message, "rollout rejected");
    record.verdict = Verdict::Rejected {
        reason: reason.to_string(),
        message,
    };
}

impl Workflow {
    /// Runs one sample from session start to journaled record. Fails only when the journal cannot be
    /// written; every other failure is the sample's verdict.
    pub async fn run_sample(
        self: &Arc<Self>,
        key: SampleKey,
        row: &PromptRow,
        scope: Scope,
    ) -> Result<(RolloutRecord, Vec<Metric>)> {
        let _permit = self.limiter.clone().acquire_owned().await;
        let version = self.policy_version.load(Ordering::SeqCst);
        let mut record = RolloutRecord {
            key,
            stream: row.stream.clone(),
            data_id: row.row.data_id.clone(),
            task_type: row.row.arena_task_type.clone(),
            task_id: None,
            verdict: Verdict::Dropped {
                reason: String::new(),
            },
            trajectories: Vec::new(),
            policy_version: version,
            routing: None,
        };
        let (mut metrics, audit) = self.sample_inner(&mut record, row, scope).await?;
        // The audit record goes into the journal with the rollout and only then to the audit shards: a kill
        // before the journal write runs the rollout again and audits it then, one after it leaves the record
        // to the resumed run (`run::setup`), which appends it when the shards lack it.
        let audit = self
            .audit
            .as_ref()
            .zip(audit)
            .map(|(writer, audited)| AuditEntry {
                key,
                at: writer.position(),
                task_id: audited.task_id.clone(),
                line: writer.line(&audited),
            });
        let mut entries = Vec::with_capacity(2);
        entries.extend(audit.map(|a| Entry::Audit(Box::new(a))));
        entries.push(Entry::Rollout(Box::new(record.clone())));
        self.journal.append_all(&entries)?;
        if let (Some(writer), Some(Entry::Audit(a))) = (&self.audit, entries.first()) {
            crate::failpoint::reach(crate::failpoint::ROLLOUT_JOURNALED);
            let written = writer.append_line(&a.line, &a.task_id);
            metrics.push(Lifecycle::ResultDumpSuccess.metric(scope, written));
        }
        Ok((record, metrics))
    }

    /// The sample up to its journal record: its metrics and the audit record to write once it is journaled.
    async fn sample_inner(
        self: &Arc<Self>,
        record: &mut RolloutRecord,
        row: &PromptRow,
        scope: Scope,
    ) -> Result<(Vec<Metric>, Option<AuditRecord>)> {
        let key = record.key;
        let Some(stream) = self.stream(&row.stream) else {
            let message = format!("unknown stream name {:?}", row.stream);
            reject(record, "arena_error", message);
            return Ok((Vec::new(), None));
        };
        let session = match async {
            self.proxy.grant().await?;
            let integrity = IntegritySelection {
                profile: stream.integrity_profile.clone(),
                base_commit: row.row.base_commit.clone(),
            };
            self.proxy.start_with(&key.to_string(), Some(integrity)).await
        }
        .await
        {
            Ok(s) => s,
            Err(e) => {
                reject(record, "proxy_error", format!("{e:#}"));
                return Ok((Vec::new(), None));
            }
        };
        let hooks = JournalHooks::new(&self.journal, key);
        let spec = self.rollout_spec(key, stream, row, &session, scope);
        let report = self.client.run_rollout_with(&self.routing, &spec, &hooks).await;
        if let Some(failure) = hooks.take_failure() {
            return Err(failure);
        }
        let mut metrics = lifecycle_metrics(&report, scope);
        record.task_id.clone_from(&report.task_id);
        let end = self.end_session(&session).await;
        let episode = Episode {
            row: row.meta(stream),
            outcome: outcome(&report),
            interaction_count: end.interaction_count,
            context_overflow: end.context_overflow,
            proxy_system_error: end.system_error,
            integrity_hits: end.integrity_hits.clone(),
            scope,
            session_id: Some(session.session_id.clone()),
        };
        let routed = route_outcome(&episode, &stream.rule);
        record.routing = Some(routing_facts(&report, &routed));
        metrics.extend(routed.metrics.iter().cloned());
        let (after_export, findings) = self.finish_sample(record, &session, &routed, &mut metrics).await;
        let audit = routed.audit_now().cloned().or(after_export);
        Ok((metrics, audit.map(|a| a.with_integrity_hits(findings))))
    }

    /// The Arena side's inputs for one sample.
    fn rollout_spec(
        &self,
        key: SampleKey,
        stream: &ResolvedStream,
        row: &PromptRow,
        session: &Session,
        scope: Scope,
    ) -> RolloutSpec {
        let mut task_envs = stream.config.task_envs.clone();
        // A training harness must outwait the weight updates that pause generation (AReaL #1751,
        // arena-2026.md 2.13); a value the run or the stream set wins, and evaluation sets none.
        if scope == Scope::Rollout {
            task_envs
                .entry(HARNESS_LLM_TIMEOUT_ENV.to_string())
                .or_insert_with(|| HARNESS_LLM_TIMEOUT_TRAINING.to_string());
        }
        RolloutSpec {
            stream_id: stream.config.stream_id.clone(),
            data_id: row.row.data_id.clone(),
            harness: Some(stream.config.harness.clone()),
            task_envs,
            proxy_base_url: self.proxy_public_url.clone(),
            session_key: session.api_key.clone(),
            session_id: Some(session.session_id.clone()),
            gateway_key: self.gateway_key.clone(),
            session_token: self
                .gateway_key
                .as_ref()
                .map(|_| (self.session_token)(&session.session_id)),
            run: RunOptions {
                timeout: self.episode_timeout,
                idempotency_key: Some(self.launch_key(key)),
                key_honoured: self.idempotent_launch,
            },
            reward_ref: RewardRefCheck {
                stream_name: stream.config.name.clone(),
                row: row.reward_ref.clone(),
                expected: stream.config.expected_reward_ref.clone(),
                pinned: stream.pinned.clone(),
            },
        }
    }

    /// `end_session`; a failure counts as the proxy's system error, as the reference records it.
    async fn end_session(&self, session: &Session) -> EndSessionReply {
        match self.proxy.end(&session.session_id).await {
            Ok(end) => end,
            Err(e) => {
                tracing::warn!(session = %session.session_id, error = %format!("{e:#}"), "end_session failed");
                EndSessionReply {
                    system_error: true,
                    ..EndSessionReply::default()
                }
            }
        }
    }

    /// Sets the reward, exports the session and decides the verdict; returns the after-export audit record
    /// and the integrity hits the export carried.
    async fn finish_sample(
        &self,
        record: &mut RolloutRecord,
        session: &Session,
        routed: &Routed,
        metrics: &mut Vec<Metric>,
    ) -> (Option<AuditRecord>, Vec<IntegrityFinding>) {
        let reward = routed.decision.reward();
        if let Some(r) = reward
            && let Err(e) = self.proxy.set_reward(&session.session_id, r).await
        {
            tracing::warn!(session = %session.session_id, error = %format!("{e:#}"), "set_reward failed");
        }
        let episode_reward = episode_reward_for_export(
            self.episode_reward_for_export,
            self.export_style,
            &routed.decision,
        );
        let mut trajectories = self.export(session, reward, episode_reward).await;
        let findings = integrity_findings(&trajectories);
        let nonempty = reward.is_some() && !trajectories.is_empty();
        let after = routed.after_export(nonempty);
        metrics.extend(after.metrics);
        if nonempty {
            stamp_episode_metadata(&mut trajectories, routed);
            if let Some(last) = trajectories.last() {
                metrics.extend(routed.turn_metrics(last.interaction_ids.len()));
            }
        }
        record.verdict = match routed.sample_result(nonempty) {
            SampleResult::Reward(r) => {
                record.trajectories = trajectories;
                Verdict::Reward { reward: r }
            }
            SampleResult::Dropped => Verdict::Dropped {
                reason: match &routed.decision {
                    Decision::Reject(r) => r.kind().to_string(),
                    _ => "empty_export".to_string(),
                },
            },
            SampleResult::Rejected(reason) => {
                let message = reason.to_string();
                tracing::info!(sample = %record.key, reason = reason.kind(), %message, "rollout rejected");
                Verdict::Rejected {
                    reason: reason.kind().to_string(),
                    message,
                }
            }
        };
        (after.audit, findings)
    }

    /// The session's trajectories; an export failure is logged and leaves none.
    async fn export(
        &self,
        session: &Session,
        reward: Option<f64>,
        episode_reward: Option<f64>,
    ) -> Vec<ExportedTrajectory> {
        let exported = self
            .proxy
            .export(
                &session.session_id,
                self.export_style,
                self.turn_discount,
                reward,
                episode_reward,
            )
            .await;
        match exported {
            Ok(e) => e.trajectories,
            Err(e) => {
                tracing::warn!(session = %session.session_id, error = %format!("{e:#}"), "export failed");
                Vec::new()
            }
        }
    }
}

/// The reward that may score every chain of a compacted session's export (`arena-2026.md` 2.10, AReaL
/// #1751's `get_episode_reward_for_export`): a successful task's, only when asked and for a `concat`
/// export; never a failure's zero or a rejection. The proxy applies it only where the graph is unambiguous.
fn episode_reward_for_export(
    asked: bool,
    style: rollout_proxy::ExportStyle,
    decision: &Decision,
) -> Option<f64> {
    match decision {
        Decision::Train(r) if asked && style == rollout_proxy::ExportStyle::Concat => Some(*r),
        _ => None,
    }
}

/// Merges the episode's metadata (`session_id`, `arena_task_id`, `arena_status`, `harness_outcome_code`) into
/// every exported trajectory's `metadata`, as AReaL stamps it on every exported interaction
/// (`arena-2026.md` 2.5 step 9); a trajectory whose metadata is not an object gets one.
fn stamp_episode_metadata(trajectories: &mut [ExportedTrajectory], routed: &Routed) {
    let meta = routed.episode_metadata();
    for t in trajectories {
        if !t.metadata.is_object() {
            t.metadata = serde_json::Value::Object(serde_json::Map::new());
        }
        if let Some(object) = t.metadata.as_object_mut() {
            object.extend(meta.clone());
        }
    }
}

/// The integrity hits of a session's trajectories, each (interaction, rule, command) once: a trajectory
/// carries the hits of every interaction of its chain, so chains that share interactions repeat them.
fn integrity_findings(trajectories: &[ExportedTrajectory]) -> Vec<IntegrityFinding> {
    let mut seen = std::collections::HashSet::new();
    trajectories
        .iter()
        .flat_map(|t| &t.integrity_hits)
        .filter(|h| seen.insert((&h.interaction_id, &h.rule, &h.matched)))
        .map(|h| IntegrityFinding {
            rule: h.rule.clone(),
            matched: h.matched.clone(),
        })
        .collect()
}

/// What reward-routing sees of the Arena side: a task outcome, a local wait that ran out, or an error at the
/// stage it happened.
fn outcome(report: &RolloutReport) -> Outcome {
    let stage = if !report.launch_attempted {
        ErrorStage::BeforeLaunch
    } else if report.launched {
        ErrorStage::AfterLaunch
    } else {
        ErrorStage::Launch
    };
    match &report.result {
        Ok(result) => Outcome::Task(task_outcome(result)),
        Err(e) => match e.task_failed() {
            Some(failed) => Outcome::Task(task_outcome(&failed.result)),
            None => match e {
                arena_client::Error::Timeout { task_id, .. } => Outcome::LocalWait {
                    task_id: task_id.clone(),
                    cancelled: false,
                },
                other => Outcome::Error {
                    message: other.to_string(),
                    stage,
                },
            },
        },
    }
}

fn task_outcome(result: &TaskResult) -> TaskOutcome {
    TaskOutcome {
        task_id: result.task_id.clone(),
        status: result.status.clone(),
        score: result.score,
        raw: result.raw.clone(),
        artifacts_uri: result.artifacts_uri.clone(),
        trace_id: result.trace_id.clone(),
        computed_at: result.computed_at.clone(),
    }
}

/// The task's terminal status, the routing's disposition and its reward, for evaluation reports.
fn routing_facts(report: &RolloutReport, routed: &Routed) -> RoutingFacts {
    let status = match &report.result {
        Ok(result) => Some(result.status.to_string()),
        Err(e) => e.task_failed().map(|failed| failed.result.status.to_string()),
    };
    let disposition = match &routed.decision {
        Decision::Train(_) => "success",
        Decision::ZeroReward => routed.disposition.map_or("model_failure_zero", |d| d.as_str()),
        Decision::Reject(reason) => routed.disposition.unwrap_or(reason.disposition()).as_str(),
    };
    RoutingFacts {
        status,
        disposition: disposition.to_string(),
        reward: routed.decision.reward(),
    }
}

#[cfg(test)]
mod tests;
