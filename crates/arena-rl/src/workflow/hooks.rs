//! The journal behind a rollout's durable moments, and the reference's lifecycle metrics read off its
//! `RolloutReport`.

use std::sync::Mutex;

use arena_client::{HookResult, RolloutHooks, RolloutReport};
use reward_routing::{Lifecycle, Metric, Scope};
use stream_config::RouteMode;

use crate::error::Error;
use crate::journal::{Entry, Journal, SampleKey};

/// Journals each moment of one sample's Arena side, keeping the first journal failure for the caller.
pub(super) struct JournalHooks<'a> {
    journal: &'a Journal,
    key: SampleKey,
    failure: Mutex<Option<Error>>,
}

impl<'a> JournalHooks<'a> {
    pub(super) fn new(journal: &'a Journal, key: SampleKey) -> Self {
        Self {
            journal,
            key,
            failure: Mutex::new(None),
        }
    }

    /// The journal failure that stopped the rollout, if one did.
    pub(super) fn take_failure(&self) -> Option<Error> {
        self.failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
    }

    fn write(&self, entry: &Entry) -> HookResult {
        self.journal.append(entry).map_err(|e| {
            let message = e.to_string();
            let mut failure = self
                .failure
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            failure.get_or_insert(e);
            message.into()
        })
    }
}

impl RolloutHooks for JournalHooks<'_> {
    fn before_register(&self, route: &str) -> HookResult {
        self.write(&Entry::Route {
            name: route.to_string(),
        })
    }

    fn before_launch(&self, idempotency_key: Option<&str>) -> HookResult {
        self.write(&Entry::Launch {
            key: self.key,
            idempotency_key: idempotency_key.map(str::to_string),
        })
    }

    fn task_started(&self, task_id: &str) -> HookResult {
        self.write(&Entry::Task {
            key: self.key,
            task_id: task_id.to_string(),
        })
    }

    fn task_finished(&self, task_id: &str) -> HookResult {
        self.write(&Entry::TaskDone {
            task_id: task_id.to_string(),
        })
    }

    fn route_deleted(&self, route: &str) -> HookResult {
        self.write(&Entry::RouteDeleted {
            name: route.to_string(),
        })
    }
}

/// The launch itself failed (not answered, timed out, or refused without a task): the reference leaves
/// `launch_success` unrecorded then.
fn launch_failed(report: &RolloutReport) -> bool {
    report.launch_attempted
        && !report.launched
        && report
            .result
            .as_ref()
            .err()
            .is_none_or(|e| e.task_failed().is_none())
}

/// The reference's lifecycle metrics of one rollout (section 4.1): the live reward-ref check, the route
/// mode, registration, cleanup, the session-gateway probe, and the launch.
pub(super) fn lifecycle_metrics(report: &RolloutReport, scope: Scope) -> Vec<Metric> {
    let mut metrics = Vec::new();
    if let Some(ok) = report.live_reward_ref_ok {
        metrics.push(Lifecycle::RewardRefValidationSuccess.metric(scope, ok));
    }
    if !report.routed {
        return metrics;
    }
    metrics.push(Lifecycle::DirectRoute.metric(scope, report.mode == RouteMode::Direct));
    metrics.push(Lifecycle::SessionGatewayRoute.metric(scope, report.mode == RouteMode::SessionGateway));
    if let Some(ok) = report.registration {
        metrics.push(Lifecycle::RegistrationSuccess.metric(scope, ok));
    }
    if let Some(ok) = report.cleanup {
        metrics.push(Lifecycle::CleanupSuccess.metric(scope, ok));
    }
    if let Some(acquire) = report.acquire.as_ref().filter(|a| a.probed) {
        if let Some(ok) = acquire.probe_ok {
            metrics.push(Lifecycle::RegistrationProbeSuccess.metric(scope, ok));
        }
        if let Some(present) = acquire.present {
            metrics.push(Lifecycle::RegistrationPresent.metric(scope, present));
        }
        if let Some(restored) = acquire.restored {
            metrics.push(Lifecycle::RegistrationRestoreSuccess.metric(scope, restored));
        }
    }
    if report.launch_attempted && !launch_failed(report) {
        metrics.push(Lifecycle::LaunchSuccess.metric(scope, report.launched));
    }
    if let Some(renewal) = &report.renewal {
        if let Some(rate) = renewal.success_rate() {
            metrics.push(scope.metric(Lifecycle::RegistrationRenewSuccess.name(), rate));
        }
        if renewal.reregistered + renewal.reregister_failed > 0 {
            metrics.push(Lifecycle::RegistrationRestoreSuccess.metric(scope, renewal.reregister_failed == 0));
        }
    }
    metrics
}
