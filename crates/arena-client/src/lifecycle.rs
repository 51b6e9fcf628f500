//! One rollout's whole Arena side: route setup for the mode (reference section 5.2), launch, poll, and
//! cleanup, reporting each stage so the caller can emit the reference's lifecycle metrics.
//!
//! Cleanup always runs and never masks the primary outcome: a failed cleanup only sets
//! [`RolloutReport::cleanup`] to `Some(false)`.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use secrecy::{ExposeSecret, SecretString};
use stream_config::RouteMode;

use crate::registry::{AcquireReport, RouteRegistry};
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
            .finish_non_exhaustive()
    }
}

/// What happened to one rollout, stage by stage.
#[derive(Debug)]
pub struct RolloutReport {
    /// The route mode.
    pub mode: RouteMode,
    /// The route was registered or acquired (`None` in direct mode).
    pub registration: Option<bool>,
    /// What acquiring a session-gateway route did.
    pub acquire: Option<AcquireReport>,
    /// The launch was answered with a queued, running or finished task (see [`TaskRun::launched`]).
    pub launched: bool,
    /// A success status with a score arrived.
    pub terminal: bool,
    /// The route was cleaned up or released (`None` when there was nothing to clean).
    pub cleanup: Option<bool>,
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
            registration: None,
            acquire: None,
            launched: false,
            terminal: false,
            cleanup: None,
            model_name: None,
            task_id: None,
            result,
        }
    }

    fn from_run(mode: RouteMode, run: TaskRun) -> Self {
        Self {
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
    async fn run(&mut self) -> bool {
        let Some(name) = self.name.take() else { return true };
        match tokio::time::timeout(self.timeout, self.client.delete_model(&name, Some(self.timeout))).await {
            Ok(Ok(())) => true,
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
}

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        let Some(name) = self.name.take() else { return };
        let client = self.client.clone();
        let timeout = self.timeout;
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                if let Err(e) = client.delete_model(&name, Some(timeout)).await {
                    tracing::warn!(model_name = %name, error = %e, "background LLM route cleanup failed");
                }
            });
        }
    }
}

impl ArenaClient {
    /// Runs one rollout's Arena side: route, launch, poll, cleanup.
    pub async fn run_rollout(&self, setup: &RouteSetup, spec: &RolloutSpec) -> RolloutReport {
        let mode = setup.mode();
        if let Err(e) = check_spec(mode, spec) {
            return RolloutReport::new(mode, Err(e));
        }
        let mut envs = spec.task_envs.clone();
        let mut request = LaunchRequest {
            data_id: spec.data_id.clone(),
            model_name: String::new(),
            base_url: String::new(),
            api_key: spec.session_key.clone(),
            envs: BTreeMap::new(),
            session_id: spec.session_id.clone(),
            harness: spec.harness.clone().filter(|h| !h.is_empty()),
        };
        match setup {
            RouteSetup::Direct => {
                direct_envs(&mut envs, &spec.proxy_base_url, &spec.session_key);
                request.model_name = rollout_model_name();
                request.base_url = spec.proxy_base_url.clone();
                request.envs = envs;
                let run = self.run_task(&spec.stream_id, &request, &spec.run).await;
                RolloutReport {
                    model_name: Some(request.model_name),
                    ..RolloutReport::from_run(mode, run)
                }
            }
            RouteSetup::Gateway {
                llm_api_key,
                inbound_protos,
                registration_timeout,
            } => {
                let registration = ModelRegistration {
                    model_name: rollout_model_name(),
                    deployment_id: random_uuid(),
                    upstream_base_url: spec.proxy_base_url.clone(),
                    upstream_api_key: spec.session_key.clone(),
                    inbound_protos: inbound_protos.clone(),
                };
                let name = registration.model_name.clone();
                // Armed before the POST: the registration may land even if we never hear back.
                let mut cleanup = DeleteOnDrop {
                    client: self.clone(),
                    name: Some(name.clone()),
                    timeout: *registration_timeout,
                };
                let registered = match tokio::time::timeout(
                    *registration_timeout,
                    self.register_model(&registration, Some(*registration_timeout)),
                )
                .await
                {
                    Ok(r) => r,
                    Err(_) => Err(Error::Deadline {
                        what: format!("register LLM route {name}"),
                        seconds: registration_timeout.as_secs_f64(),
                    }),
                };
                match registered {
                    Err(e) => RolloutReport {
                        registration: Some(false),
                        cleanup: Some(cleanup.run().await),
                        model_name: Some(name),
                        ..RolloutReport::new(mode, Err(e))
                    },
                    Ok(gateway_url) => {
                        request.model_name = name.clone();
                        request.base_url = gateway_url;
                        request.api_key = llm_api_key.clone();
                        request.envs = envs;
                        let run = self.run_task(&spec.stream_id, &request, &spec.run).await;
                        RolloutReport {
                            registration: Some(true),
                            cleanup: Some(cleanup.run().await),
                            model_name: Some(name),
                            ..RolloutReport::from_run(mode, run)
                        }
                    }
                }
            }
            RouteSetup::SessionGateway {
                registry,
                llm_api_key,
            } => {
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
                session_gateway_envs(&mut envs, session_id, token);
                request.model_name = lease.model_name.clone();
                request.base_url = lease.gateway_url.clone();
                request.api_key = llm_api_key.clone();
                request.envs = envs;
                let acquire = lease.report.clone();
                let model_name = lease.model_name.clone();
                let run = self.run_task(&spec.stream_id, &request, &spec.run).await;
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
    }
}
