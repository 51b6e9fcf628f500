//! The rollout workflow: one prompt row becomes a group of `n_samples` rollouts, each a proxy session and an
//! Arena task, routed into a reward and exported as token-exact trajectories (reference sections 4.1, 6.4).
//!
//! One sample, in order: grant capacity and start a proxy session; check the row's reward ref against the
//! stream's and, for pinned streams, the live ref ("drifted before launch"); set up the route for the mode
//! (a per-rollout gateway route, the worker's session-gateway route from the registry, or none in direct
//! mode); launch and poll the task; clean the route; end the session; route the outcome with
//! reward-routing (reward, zero reward or rejection); set the reward; export the session; record episode
//! metrics and the audit record; journal the finished rollout. Route names and task ids are journaled before
//! Arena can act on them, so a killed run's leftovers can be cleaned ([`Workflow::clean_leftovers`]).
//!
//! A group is assembled from its samples' verdicts by reward-routing (`assemble_group`), then filtered by the
//! dynamic filter; the accepted groups of a step get their advantages from `RewardConfig::advantages`.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use arena_client::{
    AcquireReport, ArenaClient, LaunchRequest, Launched, ModelRegistration, RouteRegistry, TaskResult,
    direct_envs, random_uuid, rollout_model_name, session_gateway_envs,
};
use reward_routing::{
    AuditWriter, DynamicFilter, Episode, ErrorStage, Group, GroupRejection, Lifecycle, Metric, Outcome,
    RejectReason, SampleResult, Scope, TaskOutcome, assemble_group, group_metrics, route_outcome,
};
use rollout_proxy::control::wire::EndSessionReply;
use secrecy::SecretString;
use stream_config::{RewardRef, RouteMode};
use tokio::sync::Semaphore;

use crate::journal::{Entry, Journal, RolloutRecord, SampleKey, Verdict};
use crate::proxy_ctl::ProxyControl;
use crate::resolve::{PromptRow, ResolvedStream};

/// How harnesses reach the proxy.
#[derive(Clone)]
pub enum Routing {
    /// One gateway route per rollout, keyed by the session's proxy key.
    Gateway {
        /// `ARENA_LLM_API_KEY`.
        llm_api_key: SecretString,
        /// The routes' `inbound_protos`.
        inbound_protos: Vec<String>,
        /// Deadline of each registration and deletion.
        registration_timeout: Duration,
    },
    /// The worker's shared route; sessions are told apart by headers.
    SessionGateway {
        /// The worker's registry.
        registry: RouteRegistry,
        /// `ARENA_LLM_API_KEY`.
        llm_api_key: SecretString,
        /// The proxy's generation-only gateway key.
        gateway_key: SecretString,
    },
    /// The harness calls the proxy directly.
    Direct,
}

impl Routing {
    /// The route mode.
    pub fn mode(&self) -> RouteMode {
        match self {
            Self::Gateway { .. } => RouteMode::Gateway,
            Self::SessionGateway { .. } => RouteMode::SessionGateway,
            Self::Direct => RouteMode::Direct,
        }
    }
}

/// Mints per-session tokens for session-gateway launches (the proxy's HMAC, from its state).
pub type TokenMinter = Arc<dyn Fn(&str) -> SecretString + Send + Sync>;

/// Everything a sample needs, shared by all rollouts of a worker.
pub struct Workflow {
    /// The Arena client.
    pub client: ArenaClient,
    /// How harnesses reach the proxy.
    pub routing: Routing,
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
    /// Send an `Idempotency-Key` with launches.
    pub idempotent_launch: bool,
    /// The run's id (prefix of idempotency keys).
    pub run_id: String,
    /// `proxy.export_style`.
    pub export_style: rollout_proxy::ExportStyle,
    /// `proxy.turn_discount`.
    pub turn_discount: f64,
    /// Samples per group.
    pub n_samples: u32,
    /// The policy version sessions start under (for records).
    pub policy_version: Arc<AtomicU64>,
    /// Rollout-time group handling (`gconfig.drop_incomplete_group`, `gconfig.reward_normalization`).
    pub group_settings: reward_routing::GroupSettings,
}

/// What happened on the Arena side of one rollout.
#[derive(Debug, Default)]
struct ArenaSide {
    registration: Option<bool>,
    acquire: Option<AcquireReport>,
    launch_attempted: bool,
    launched: bool,
    cleanup: Option<bool>,
    task_id: Option<String>,
    result: Option<arena_client::Result<TaskResult>>,
    error_stage: Option<ErrorStage>,
    error: Option<String>,
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

    fn journal(&self, entry: &Entry) {
        // A journal write that fails leaves the run unable to promise durability: stop loudly.
        if let Err(e) = self.journal.append(entry) {
            tracing::error!(error = %format!("{e:#}"), "journal write failed");
            panic!("the rollout journal cannot be written: {e:#}");
        }
    }

    /// Runs a whole group: `n_samples` rollouts of `row`, concurrently (bounded by the limiter). Samples whose
    /// records are already in `done` are not run again.
    pub async fn run_group(
        self: &Arc<Self>,
        step: u64,
        group: u32,
        row: &PromptRow,
        scope: Scope,
        done: &std::collections::BTreeMap<SampleKey, RolloutRecord>,
    ) -> GroupRun {
        let eval = scope == Scope::EvalRollout;
        let mut handles = Vec::new();
        for sample in 0..self.n_samples {
            let key = SampleKey {
                eval,
                step,
                group,
                sample,
            };
            if let Some(record) = done.get(&key) {
                handles.push(tokio::spawn(std::future::ready((record.clone(), Vec::new()))));
                continue;
            }
            let me = self.clone();
            let row = row.clone();
            handles.push(tokio::spawn(async move { me.run_sample(key, &row, scope).await }));
        }
        let mut records = Vec::new();
        let mut metrics = Vec::new();
        for h in handles {
            match h.await {
                Ok((record, m)) => {
                    records.push(record);
                    metrics.extend(m);
                }
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        GroupRun {
            row: row.clone(),
            records,
            metrics,
        }
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

    /// Runs one sample from session start to journaled record.
    pub async fn run_sample(
        self: &Arc<Self>,
        key: SampleKey,
        row: &PromptRow,
        scope: Scope,
    ) -> (RolloutRecord, Vec<Metric>) {
        let _permit = self.limiter.clone().acquire_owned().await;
        let version = self.policy_version.load(Ordering::SeqCst);
        let (record, metrics) = self.sample_inner(key, row, scope, version).await;
        self.journal(&Entry::Rollout(Box::new(record.clone())));
        (record, metrics)
    }

    async fn sample_inner(
        self: &Arc<Self>,
        key: SampleKey,
        row: &PromptRow,
        scope: Scope,
        version: u64,
    ) -> (RolloutRecord, Vec<Metric>) {
        let mut metrics = Vec::new();
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
        };
        let reject = |record: &mut RolloutRecord, reason: &str, message: String| {
            tracing::warn!(sample = %record.key, reason, %message, "rollout rejected");
            record.verdict = Verdict::Rejected {
                reason: reason.to_string(),
                message,
            };
        };
        let Some(stream) = self.stream(&row.stream) else {
            reject(
                &mut record,
                "arena_error",
                format!("unknown stream name {:?}", row.stream),
            );
            return (record, metrics);
        };
        let session = match async {
            self.proxy.grant().await?;
            self.proxy.start(&key.to_string()).await
        }
        .await
        {
            Ok(s) => s,
            Err(e) => {
                reject(&mut record, "proxy_error", format!("{e:#}"));
                return (record, metrics);
            }
        };
        let meta = row.meta(stream);
        let arena = self
            .arena_side(key, stream, row, &session, scope, &mut metrics)
            .await;
        record.task_id.clone_from(&arena.task_id);
        let end = match self.proxy.end(&session.session_id).await {
            Ok(end) => end,
            Err(e) => {
                tracing::warn!(session = %session.session_id, error = %format!("{e:#}"), "end_session failed");
                EndSessionReply {
                    system_error: true,
                    ..EndSessionReply::default()
                }
            }
        };
        let outcome = match (&arena.result, &arena.error) {
            (Some(Ok(result)), _) => Outcome::Task(task_outcome(result)),
            (Some(Err(e)), _) => match e.task_failed() {
                Some(failed) => Outcome::Task(task_outcome(&failed.result)),
                None => match e {
                    arena_client::Error::Timeout { task_id, .. } => Outcome::LocalWait {
                        task_id: task_id.clone(),
                        cancelled: false,
                    },
                    other => Outcome::Error {
                        message: other.to_string(),
                        stage: arena.error_stage.unwrap_or(ErrorStage::AfterLaunch),
                    },
                },
            },
            (None, Some(message)) => Outcome::Error {
                message: message.clone(),
                stage: arena.error_stage.unwrap_or(ErrorStage::BeforeLaunch),
            },
            (None, None) => Outcome::Error {
                message: "the rollout ended without an outcome".to_string(),
                stage: ErrorStage::BeforeLaunch,
            },
        };
        let episode = Episode {
            row: meta,
            outcome,
            interaction_count: end.interaction_count,
            context_overflow: end.context_overflow,
            proxy_system_error: end.system_error,
            scope,
        };
        let routed = route_outcome(&episode, &stream.rule);
        metrics.extend(routed.metrics.iter().cloned());
        if let Some(audit) = &self.audit
            && let Some(rec) = routed.audit_now()
        {
            metrics.push(audit.append_with_metric(rec, scope));
        }
        let reward = routed.decision.reward();
        if let Some(r) = reward
            && let Err(e) = self.proxy.set_reward(&session.session_id, r).await
        {
            tracing::warn!(session = %session.session_id, error = %format!("{e:#}"), "set_reward failed");
        }
        let exported = self
            .proxy
            .export(&session.session_id, self.export_style, self.turn_discount, reward)
            .await;
        let trajectories = match exported {
            Ok(e) => e.trajectories,
            Err(e) => {
                tracing::warn!(session = %session.session_id, error = %format!("{e:#}"), "export failed");
                Vec::new()
            }
        };
        let nonempty = reward.is_some() && !trajectories.is_empty();
        let after = routed.after_export(nonempty);
        metrics.extend(after.metrics);
        if let Some(audit) = &self.audit
            && let Some(rec) = &after.audit
        {
            metrics.push(audit.append_with_metric(rec, scope));
        }
        record.verdict = match routed.sample_result(nonempty) {
            SampleResult::Reward(r) => {
                record.trajectories = trajectories;
                Verdict::Reward { reward: r }
            }
            SampleResult::Dropped => Verdict::Dropped {
                reason: match &routed.decision {
                    reward_routing::Decision::Reject(r) => r.kind().to_string(),
                    _ => "empty_export".to_string(),
                },
            },
            SampleResult::Rejected(reason) => {
                let message = reason.to_string();
                tracing::info!(sample = %key, reason = reason.kind(), %message, "rollout rejected");
                Verdict::Rejected {
                    reason: reason.kind().to_string(),
                    message,
                }
            }
        };
        (record, metrics)
    }

    /// Route, launch, poll, clean: the Arena side of one rollout, journaling route names and task ids.
    async fn arena_side(
        &self,
        key: SampleKey,
        stream: &ResolvedStream,
        row: &PromptRow,
        session: &crate::proxy_ctl::Session,
        scope: Scope,
        metrics: &mut Vec<Metric>,
    ) -> ArenaSide {
        let mut side = ArenaSide::default();
        // Row checks (reference 4.1 step 3) and the live drift check (step 4), before any route exists.
        let pinned = &stream.config.expected_reward_ref;
        if !row.reward_ref.is_empty() && !pinned.is_empty() && row.reward_ref != *pinned {
            side.error = Some(format!(
                "reward_ref mismatch for row {}: row has {}@{}, stream {} expects {}@{}",
                row.row.data_id,
                row.reward_ref.key,
                row.reward_ref.version,
                stream.config.name,
                pinned.key,
                pinned.version
            ));
            return side;
        }
        if !stream.pinned.is_empty() {
            let live = self
                .client
                .get_stream(&stream.config.stream_id)
                .await
                .and_then(|info| info.live_reward_ref());
            let ok = match live {
                Ok(Some(l)) if RewardRef::new(l.key.clone(), l.version.clone()) == *pinned => true,
                Ok(live) => {
                    side.error = Some(format!(
                        "stream {} reward_ref drifted before launch: pinned {}@{}, live {}",
                        stream.config.name,
                        pinned.key,
                        pinned.version,
                        live.map_or_else(|| "none".to_string(), |l| l.render())
                    ));
                    false
                }
                Err(e) => {
                    side.error = Some(format!(
                        "stream {}: live reward_ref check failed: {e}",
                        stream.config.name
                    ));
                    false
                }
            };
            metrics.push(Lifecycle::RewardRefValidationSuccess.metric(scope, ok));
            if !ok {
                return side;
            }
        }

        let mode = self.routing.mode();
        metrics.push(Lifecycle::DirectRoute.metric(scope, mode == RouteMode::Direct));
        metrics.push(Lifecycle::SessionGatewayRoute.metric(scope, mode == RouteMode::SessionGateway));
        let mut envs = stream.config.task_envs.clone();
        let mut request = LaunchRequest {
            data_id: row.row.data_id.clone(),
            model_name: String::new(),
            base_url: String::new(),
            api_key: session.api_key.clone(),
            envs: Default::default(),
            session_id: Some(session.session_id.clone()),
            harness: Some(stream.config.harness.clone()).filter(|h| !h.is_empty()),
        };
        let timeout = self.registration_timeout();
        let mut gateway_route = None;
        let mut lease = None;
        match &self.routing {
            Routing::Direct => {
                direct_envs(&mut envs, &self.proxy_public_url, &session.api_key);
                request.model_name = rollout_model_name();
                request.base_url = self.proxy_public_url.clone();
            }
            Routing::Gateway {
                llm_api_key,
                inbound_protos,
                registration_timeout,
            } => {
                let registration = ModelRegistration {
                    model_name: rollout_model_name(),
                    deployment_id: random_uuid(),
                    upstream_base_url: self.proxy_public_url.clone(),
                    upstream_api_key: session.api_key.clone(),
                    inbound_protos: inbound_protos.clone(),
                };
                let name = registration.model_name.clone();
                self.journal(&Entry::Route { name: name.clone() });
                let registered = tokio::time::timeout(
                    *registration_timeout,
                    self.client
                        .register_model(&registration, Some(*registration_timeout)),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(arena_client::Error::Deadline {
                        what: format!("register LLM route {name}"),
                        seconds: registration_timeout.as_secs_f64(),
                    })
                });
                match registered {
                    Ok(url) => {
                        side.registration = Some(true);
                        request.model_name = name.clone();
                        request.base_url = url;
                        request.api_key = llm_api_key.clone();
                        gateway_route = Some(name);
                    }
                    Err(e) => {
                        side.registration = Some(false);
                        side.cleanup = Some(self.delete_route(&name, timeout).await);
                        side.error = Some(e.to_string());
                        self.push_route_metrics(&side, scope, metrics);
                        return side;
                    }
                }
            }
            Routing::SessionGateway {
                registry,
                llm_api_key,
                gateway_key,
            } => match registry.acquire(&self.proxy_public_url, gateway_key).await {
                Ok(l) => {
                    side.registration = Some(true);
                    side.acquire = Some(l.report.clone());
                    let token = (self.session_token)(&session.session_id);
                    session_gateway_envs(&mut envs, &session.session_id, &token);
                    request.model_name = l.model_name.clone();
                    request.base_url = l.gateway_url.clone();
                    request.api_key = llm_api_key.clone();
                    lease = Some(l);
                }
                Err(e) => {
                    side.registration = Some(false);
                    side.error = Some(e.to_string());
                    self.push_route_metrics(&side, scope, metrics);
                    return side;
                }
            },
        }
        request.envs = envs;

        let idempotency_key = self.idempotent_launch.then(|| format!("{}-{key}", self.run_id));
        self.journal(&Entry::Launch {
            key,
            idempotency_key: idempotency_key.clone(),
        });
        side.launch_attempted = true;
        let deadline = tokio::time::Instant::now() + self.episode_timeout;
        let launch =
            self.client
                .launch_one_task(&stream.config.stream_id, &request, idempotency_key.as_deref());
        let result = match tokio::time::timeout_at(deadline, launch).await {
            Err(_) => {
                side.error_stage = Some(ErrorStage::Launch);
                Err(arena_client::Error::Timeout {
                    task_id: None,
                    data_id: request.data_id.clone(),
                    timeout_seconds: self.episode_timeout.as_secs_f64(),
                })
            }
            Ok(Err(e)) => {
                if let Some(failed) = e.task_failed() {
                    side.task_id = Some(failed.task_id.clone());
                } else {
                    side.error_stage = Some(ErrorStage::Launch);
                }
                Err(e)
            }
            Ok(Ok(Launched::Finished(result))) => {
                side.launched = true;
                side.task_id = Some(result.task_id.clone());
                Ok(result)
            }
            Ok(Ok(Launched::Running { task_id })) => {
                side.launched = true;
                side.task_id = Some(task_id.clone());
                self.journal(&Entry::Task {
                    key,
                    task_id: task_id.clone(),
                });
                let waited = self
                    .client
                    .wait_for_task(&task_id, &request.data_id, deadline, self.episode_timeout)
                    .await;
                self.journal(&Entry::TaskDone {
                    task_id: task_id.clone(),
                });
                side.error_stage = Some(ErrorStage::AfterLaunch);
                waited
            }
        };
        side.result = Some(result);
        if let Some(name) = gateway_route {
            side.cleanup = Some(self.delete_route(&name, timeout).await);
        }
        if let Some(l) = lease {
            side.cleanup = Some(match l.release().await {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!(error = %e, "LLM route release failed");
                    false
                }
            });
        }
        self.push_route_metrics(&side, scope, metrics);
        if side.error_stage != Some(ErrorStage::Launch) {
            metrics.push(Lifecycle::LaunchSuccess.metric(scope, side.launched));
        }
        side
    }

    fn push_route_metrics(&self, side: &ArenaSide, scope: Scope, metrics: &mut Vec<Metric>) {
        if let Some(ok) = side.registration {
            metrics.push(Lifecycle::RegistrationSuccess.metric(scope, ok));
        }
        if let Some(ok) = side.cleanup {
            metrics.push(Lifecycle::CleanupSuccess.metric(scope, ok));
        }
        if let Some(report) = &side.acquire
            && report.probed
        {
            if let Some(ok) = report.probe_ok {
                metrics.push(Lifecycle::RegistrationProbeSuccess.metric(scope, ok));
            }
            if let Some(present) = report.present {
                metrics.push(Lifecycle::RegistrationPresent.metric(scope, present));
            }
            if let Some(restored) = report.restored {
                metrics.push(Lifecycle::RegistrationRestoreSuccess.metric(scope, restored));
            }
        }
    }

    fn registration_timeout(&self) -> Duration {
        match &self.routing {
            Routing::Gateway {
                registration_timeout, ..
            } => *registration_timeout,
            Routing::SessionGateway { registry, .. } => registry.options().registration_timeout,
            Routing::Direct => Duration::from_secs(30),
        }
    }

    /// Deletes a gateway route (404 counts as gone) and journals it; `false` when the delete failed.
    async fn delete_route(&self, name: &str, timeout: Duration) -> bool {
        match tokio::time::timeout(timeout, self.client.delete_model(name, Some(timeout))).await {
            Ok(Ok(())) => {
                self.journal(&Entry::RouteDeleted {
                    name: name.to_string(),
                });
                true
            }
            Ok(Err(e)) => {
                tracing::warn!(model_name = %name, error = %e, "LLM route cleanup failed");
                false
            }
            Err(_) => {
                tracing::warn!(model_name = %name, "LLM route cleanup timed out");
                false
            }
        }
    }

    /// Closes the session-gateway registry (deleting its routes) and journals what is gone.
    pub async fn close(&self) -> Vec<String> {
        let Routing::SessionGateway { registry, .. } = &self.routing else {
            return Vec::new();
        };
        let report = registry.close().await;
        for name in &report.deleted {
            self.journal(&Entry::RouteDeleted { name: name.clone() });
        }
        report.failed
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
            if outcome.is_some() {
                cancelled += 1;
            }
        }
        Ok((deleted, cancelled))
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
