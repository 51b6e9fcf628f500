//! One rollout's whole Arena side: the reward-ref checks (reference section 4.1 steps 3-4), route setup for
//! the mode (section 5.2), launch, poll, and cleanup, reporting each stage so the caller can emit the
//! reference's lifecycle metrics, and calling the caller's [`RolloutHooks`] at each durable moment.
//!
//! Cleanup always runs and never masks the primary outcome: a failed cleanup only sets
//! [`RolloutReport::cleanup`] to `Some(false)`. A route that may exist in Arena is deleted even when the
//! rollout's future is dropped: the gateway-mode guard is armed before the registration POST, and the
//! session-gateway registry arms its own.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use stream_config::{RewardRef, RouteMode, reward_ref_drift};
use tokio::sync::watch;

use crate::clock::Clock;
use crate::hooks::RolloutHooks;
use crate::registry::{AcquireReport, RouteRegistry};
use crate::renewal::RenewalStats;
use crate::routes::{ModelRegistration, direct_envs, random_uuid, rollout_model_name, session_gateway_envs};
use crate::tasks::{LaunchRequest, RunOptions, TaskResult, TaskRun};
use crate::{ArenaClient, Error, Result};

/// How the harness reaches the rollout proxy, with what each mode needs.
#[derive(Clone)]
pub enum RouteSetup {
    /// One temporary gateway route per rollout, keyed by the session's proxy key.
    Gateway {
        /// `ARENA_LLM_API_KEY`.
        llm_api_key: SecretString,
        /// `econfig.arena_inbound_protos`.
        inbound_protos: Vec<String>,
        /// HTTP timeout and outer deadline of the registration calls.
        registration_timeout: Duration,
        /// Renew the route while its task is in flight (`arena-2026.md` 2.12); `None` registers and deletes
        /// only.
        renewal: Option<GatewayRenewal>,
    },
    /// The worker's shared route from its registry; sessions are told apart by headers.
    SessionGateway {
        /// The worker's registry.
        registry: RouteRegistry,
        /// `ARENA_LLM_API_KEY`.
        llm_api_key: SecretString,
    },
    /// No route: the harness calls the proxy directly.
    Direct,
}

impl fmt::Debug for RouteSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RouteSetup")
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

impl RouteSetup {
    /// The mode.
    pub fn mode(&self) -> RouteMode {
        match self {
            Self::Gateway { .. } => RouteMode::Gateway,
            Self::SessionGateway { .. } => RouteMode::SessionGateway,
            Self::Direct => RouteMode::Direct,
        }
    }
}

/// How a `gateway`-mode route is kept alive while its task is in flight (see [`crate::maintain`]).
#[derive(Clone, Debug)]
pub struct GatewayRenewal {
    /// Time between renewals (`arena_registration_probe_interval`).
    pub interval: Duration,
    /// The clock renewals are timed on.
    pub clock: Arc<dyn Clock>,
}

/// One rollout's inputs.
#[derive(Clone)]
pub struct RolloutSpec {
    /// The stream.
    pub stream_id: String,
    /// The row.
    pub data_id: String,
    /// `key@version`, or `None` for the stream default.
    pub harness: Option<String>,
    /// The stream's task envs (already merged with run-level envs).
    pub task_envs: BTreeMap<String, String>,
    /// The rollout proxy's address.
    pub proxy_base_url: String,
    /// The session's proxy key.
    pub session_key: SecretString,
    /// The session id (required in `direct` and `session_gateway` modes).
    pub session_id: Option<String>,
    /// The proxy's generation-only gateway key (`session_gateway`).
    pub gateway_key: Option<SecretString>,
    /// The session's token (`session_gateway`).
    pub session_token: Option<SecretString>,
    /// Deadline and idempotency key.
    pub run: RunOptions,
    /// The reward-ref checks to pass before any route or task exists.
    pub reward_ref: RewardRefCheck,
}

/// The reward-ref checks before a launch (reference section 4.1 steps 3 and 4). Empty refs skip a check.
#[derive(Debug, Clone, Default)]
pub struct RewardRefCheck {
    /// The stream's configured name, for messages.
    pub stream_name: String,
    /// The ref the row was loaded under.
    pub row: RewardRef,
    /// The ref the stream expects; a row loaded under another is rejected.
    pub expected: RewardRef,
    /// The ref the user pinned: when set, the stream's live ref is fetched and must still equal it.
    pub pinned: RewardRef,
}

impl fmt::Debug for RolloutSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RolloutSpec")
            .field("stream_id", &self.stream_id)
            .field("data_id", &self.data_id)
            .field("harness", &self.harness)
            .field("task_envs", &self.task_envs.keys().collect::<Vec<_>>())
            .field("proxy_base_url", &self.proxy_base_url)
            .field("session_id", &self.session_id)
            .field("run", &self.run)
            .field("reward_ref", &self.reward_ref)
            .finish_non_exhaustive()
    }
}

/// What happened to one rollout, stage by stage.
#[derive(Debug)]
pub struct RolloutReport {
    /// The route mode.
    pub mode: RouteMode,
    /// The live reward-ref check passed (`None` when the stream pins no ref, or an earlier check failed).
    pub live_reward_ref_ok: Option<bool>,
    /// The checks passed and route setup began.
    pub routed: bool,
    /// The route was registered or acquired (`None` in direct mode).
    pub registration: Option<bool>,
    /// What acquiring a session-gateway route did.
    pub acquire: Option<AcquireReport>,
    /// The launch request was sent.
    pub launch_attempted: bool,
    /// The launch was answered with a queued, running or finished task (see [`TaskRun::launched`]).
    pub launched: bool,
    /// A success status with a score arrived.
    pub terminal: bool,
    /// The route was cleaned up or released (`None` when there was nothing to clean).
    pub cleanup: Option<bool>,
    /// What renewing a `gateway`-mode route came to (`None` when it was not renewed).
    pub renewal: Option<RenewalStats>,
    /// The model name the harness was given.
    pub model_name: Option<String>,
    /// The task id, once known.
    pub task_id: Option<String>,
    /// The outcome: a result, a typed task failure, or why it stopped.
    pub result: Result<TaskResult>,
}

impl RolloutReport {
    fn new(mode: RouteMode, result: Result<TaskResult>) -> Self {
        Self {
            mode,
            live_reward_ref_ok: None,
            routed: false,
            registration: None,
            acquire: None,
            launch_attempted: false,
            launched: false,
            terminal: false,
            cleanup: None,
            renewal: None,
            model_name: None,
            task_id: None,
            result,
        }
    }

    fn from_run(mode: RouteMode, run: TaskRun) -> Self {
        Self {
            routed: true,
            launch_attempted: run.launch_attempted,
            launched: run.launched,
            terminal: run.terminal,
            task_id: run.task_id,
            ..Self::new(mode, run.result)
        }
    }
}

fn missing_session_credentials() -> Error {
    Error::Invalid(
        "session_gateway route mode requires both proxy_gateway_api_key and proxy_session_token".to_string(),
    )
}

/// Session ids must match `^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$`.
pub fn valid_session_id(id: &str) -> bool {
    let mut chars = id.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && id.len() <= 200
        && chars.all(|c| c.is_ascii_alphanumeric() || "_.:-".contains(c))
}

fn check_spec(mode: RouteMode, spec: &RolloutSpec) -> Result<()> {
    for (field, value) in [
        ("stream_id", &spec.stream_id),
        ("data_id", &spec.data_id),
        ("base_url", &spec.proxy_base_url),
    ] {
        if value.trim().is_empty() {
            return Err(Error::Invalid(format!("rollout {field} must not be empty")));
        }
    }
    if spec.session_key.expose_secret().is_empty() {
        return Err(Error::Invalid("rollout api_key must not be empty".to_string()));
    }
    if mode != RouteMode::Gateway {
        match spec.session_id.as_deref() {
            None | Some("") => {
                return Err(Error::Invalid(format!(
                    "session_id is required in {mode} route mode"
                )));
            }
            Some(id) if !valid_session_id(id) => {
                return Err(Error::Invalid(format!(
                    "session_id {id:?} must match ^[A-Za-z0-9][A-Za-z0-9_.:-]{{0,199}}$"
                )));
            }
            Some(_) => {}
        }
    }
    if mode == RouteMode::SessionGateway && (spec.gateway_key.is_none() || spec.session_token.is_none()) {
        return Err(Error::Invalid(
            "session_gateway route mode requires both proxy_gateway_api_key and proxy_session_token"
                .to_string(),
        ));
    }
    Ok(())
}

/// Deletes a gateway-mode route when dropped armed, so a dropped rollout leaks no route.
struct DeleteOnDrop {
    client: ArenaClient,
    name: Option<String>,
    timeout: Duration,
}

impl DeleteOnDrop {
    /// Deletes the route now; `Ok(false)` when the delete failed (logged), an error when the hook failed.
    async fn run(&mut self, hooks: &dyn RolloutHooks) -> Result<bool> {
        let Some(name) = self.name.take() else {
            return Ok(true);
        };
        match tokio::time::timeout(self.timeout, self.client.delete_model(&name, Some(self.timeout))).await {
            Ok(Ok(())) => hooks
                .route_deleted(&name)
                .map(|()| true)
                .map_err(|e| Error::hook(format!("after deleting route {name}"), &e)),
            Ok(Err(e)) => {
                tracing::warn!(model_name = %name, error = %e, "LLM route cleanup failed");
                Ok(false)
            }
            Err(_) => {
                tracing::warn!(model_name = %name, "LLM route cleanup timed out");
                Ok(false)
            }
        }
    }
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else { return };
        let client = self.client.clone();
        let timeout = self.timeout;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move { client.delete_abandoned_route(&name, timeout).await });
        }
    }
}

/// The checks of reference section 4.1 steps 3 and 4: the row's ref against the stream's, then, for a
/// pinned stream, the live ref against the pin ("drifted before launch").
async fn check_reward_ref(
    client: &ArenaClient,
    spec: &RolloutSpec,
    report: &mut RolloutReport,
) -> Result<()> {
    let check = &spec.reward_ref;
    if !check.row.is_empty() && !check.expected.is_empty() && check.row != check.expected {
        return Err(Error::Rejected(format!(
            "reward_ref mismatch for row {}: row has {}, stream {} expects {}",
            spec.data_id, check.row, check.stream_name, check.expected
        )));
    }
    if check.pinned.is_empty() {
        return Ok(());
    }
    let live = client
        .get_stream(&spec.stream_id)
        .await
        .and_then(|info| info.live_reward_ref())
        .map_err(|e| {
            e.context(format!(
                "stream {}: live reward_ref check failed",
                check.stream_name
            ))
        });
    let checked = live.and_then(|live| match reward_ref_drift(&check.pinned, live.as_ref()) {
        None => Ok(()),
        Some(drift) => Err(Error::Rejected(format!(
            "stream {} reward_ref drifted before launch: {drift}",
            check.stream_name
        ))),
    });
    report.live_reward_ref_ok = Some(checked.is_ok());
    checked
}

impl ArenaClient {
    /// Runs one rollout's Arena side: reward-ref checks, route, launch, poll, cleanup.
    pub async fn run_rollout(&self, setup: &RouteSetup, spec: &RolloutSpec) -> RolloutReport {
        self.run_rollout_with(setup, spec, &crate::NoHooks).await
    }

    /// [`ArenaClient::run_rollout`], calling `hooks` at each durable moment (see [`RolloutHooks`]). A
    /// failing hook stops the rollout there with [`Error::Hook`], after cleaning up what exists.
    pub async fn run_rollout_with(
        &self,
        setup: &RouteSetup,
        spec: &RolloutSpec,
        hooks: &dyn RolloutHooks,
    ) -> RolloutReport {
        let mode = setup.mode();
        let mut report = RolloutReport::new(mode, Err(Error::Invalid(String::new())));
        let checked = match check_spec(mode, spec) {
            Ok(()) => check_reward_ref(self, spec, &mut report).await,
            Err(e) => Err(e),
        };
        if let Err(e) = checked {
            report.result = Err(e);
            return report;
        }
        let request = LaunchRequest {
            data_id: spec.data_id.clone(),
            model_name: String::new(),
            base_url: String::new(),
            api_key: spec.session_key.clone(),
            envs: spec.task_envs.clone(),
            session_id: spec.session_id.clone(),
            harness: spec.harness.clone().filter(|h| !h.is_empty()),
        };
        let routed = match setup {
            RouteSetup::Direct => self.direct_rollout(spec, request, hooks).await,
            RouteSetup::Gateway {
                llm_api_key,
                inbound_protos,
                registration_timeout,
                renewal,
            } => {
                let route = GatewayRoute {
                    llm_api_key,
                    inbound_protos,
                    timeout: *registration_timeout,
                    renewal: renewal.as_ref(),
                };
                self.gateway_rollout(spec, request, &route, hooks).await
            }
            RouteSetup::SessionGateway {
                registry,
                llm_api_key,
            } => {
                self.session_gateway_rollout(spec, request, registry, llm_api_key, hooks)
                    .await
            }
        };
        RolloutReport {
            live_reward_ref_ok: report.live_reward_ref_ok,
            routed: true,
            ..routed
        }
    }

    async fn direct_rollout(
        &self,
        spec: &RolloutSpec,
        mut request: LaunchRequest,
        hooks: &dyn RolloutHooks,
    ) -> RolloutReport {
        direct_envs(&mut request.envs, &spec.proxy_base_url, &spec.session_key);
        request.model_name = rollout_model_name();
        request.base_url = spec.proxy_base_url.clone();
        let run = self
            .run_task_with(&spec.stream_id, &request, &spec.run, hooks)
            .await;
        RolloutReport {
            model_name: Some(request.model_name),
            ..RolloutReport::from_run(RouteMode::Direct, run)
        }
    }

    async fn gateway_rollout(
        &self,
        spec: &RolloutSpec,
        mut request: LaunchRequest,
        route: &GatewayRoute<'_>,
        hooks: &dyn RolloutHooks,
    ) -> RolloutReport {
        let mode = RouteMode::Gateway;
        let registration = ModelRegistration {
            model_name: rollout_model_name(),
            deployment_id: random_uuid(),
            upstream_base_url: spec.proxy_base_url.clone(),
            upstream_api_key: spec.session_key.clone(),
            inbound_protos: route.inbound_protos.to_vec(),
        };
        let name = registration.model_name.clone();
        if let Err(e) = hooks.before_register(&name) {
            let e = Error::hook(format!("before registering route {name}"), &e);
            return RolloutReport {
                model_name: Some(name),
                ..RolloutReport::new(mode, Err(e))
            };
        }
        // Armed before the POST: the registration may land even if we never hear back.
        let mut cleanup = DeleteOnDrop {
            client: self.clone(),
            name: Some(name.clone()),
            timeout: route.timeout,
        };
        let registered = tokio::time::timeout(
            route.timeout,
            self.register_model(&registration, Some(route.timeout)),
        )
        .await
        .unwrap_or_else(|_| {
            Err(Error::Deadline {
                what: format!("register LLM route {name}"),
                seconds: route.timeout.as_secs_f64(),
            })
        });
        let mut report = match registered {
            Err(e) => RolloutReport {
                registration: Some(false),
                ..RolloutReport::new(mode, Err(e))
            },
            Ok(gateway_url) => {
                request.model_name = name.clone();
                request.base_url = gateway_url;
                request.api_key = route.llm_api_key.clone();
                let task = self.run_task_with(&spec.stream_id, &request, &spec.run, hooks);
                let (run, renewal) = match route.renewal {
                    None => (task.await, None),
                    Some(renewal) => {
                        // Renewal runs beside the task and is stopped, and awaited, before the delete below,
                        // so it cannot bring the finished route back.
                        let (stop, stopped) = watch::channel(false);
                        let task = async {
                            let run = task.await;
                            let _ = stop.send(true);
                            run
                        };
                        let keep = crate::renewal::maintain(
                            self,
                            &registration,
                            renewal.clock.clone(),
                            renewal.interval,
                            route.timeout,
                            stopped,
                        );
                        let (run, stats) = tokio::join!(task, keep);
                        (run, Some(stats))
                    }
                };
                RolloutReport {
                    registration: Some(true),
                    renewal,
                    ..RolloutReport::from_run(mode, run)
                }
            }
        };
        report.model_name = Some(name);
        match cleanup.run(hooks).await {
            Ok(deleted) => report.cleanup = Some(deleted),
            Err(e) => {
                report.cleanup = Some(true);
                report.result = Err(e);
            }
        }
        report
    }

    async fn session_gateway_rollout(
        &self,
        spec: &RolloutSpec,
        mut request: LaunchRequest,
        registry: &RouteRegistry,
        llm_api_key: &SecretString,
        hooks: &dyn RolloutHooks,
    ) -> RolloutReport {
        let mode = RouteMode::SessionGateway;
        let (Some(gateway_key), Some(token), Some(session_id)) =
            (&spec.gateway_key, &spec.session_token, &spec.session_id)
        else {
            return RolloutReport::new(mode, Err(missing_session_credentials()));
        };
        let lease = match registry.acquire(&spec.proxy_base_url, gateway_key).await {
            Ok(l) => l,
            Err(e) => {
                return RolloutReport {
                    registration: Some(false),
                    ..RolloutReport::new(mode, Err(e))
                };
            }
        };
        session_gateway_envs(&mut request.envs, session_id, token);
        request.model_name = lease.model_name.clone();
        request.base_url = lease.gateway_url.clone();
        request.api_key = llm_api_key.clone();
        let acquire = lease.report.clone();
        let model_name = lease.model_name.clone();
        let run = self
            .run_task_with(&spec.stream_id, &request, &spec.run, hooks)
            .await;
        let cleanup = match lease.release().await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(error = %e, "LLM route release failed");
                false
            }
        };
        RolloutReport {
            registration: Some(true),
            acquire: Some(acquire),
            cleanup: Some(cleanup),
            model_name: Some(model_name),
            ..RolloutReport::from_run(mode, run)
        }
    }
}

/// What gateway mode registers with.
struct GatewayRoute<'a> {
    llm_api_key: &'a SecretString,
    inbound_protos: &'a [String],
    timeout: Duration,
    renewal: Option<&'a GatewayRenewal>,
}
