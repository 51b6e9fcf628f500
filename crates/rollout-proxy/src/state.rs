//! The proxy's configuration and the state every handler shares: the session store, the model and engine,
//! metrics, the preparation pool, the credential checks, and what protocols keep per session beside the
//! session store ([`SessionSide`]).
//!
//! It sits below every protocol and the control endpoints and imports none of them (the `tidy` test checks
//! that `rollout-proxy`'s modules form no cycle); the router over it is [`crate::server`]'s.

use std::any::Any;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use axum::body::{Body, HttpBody};
use axum::http::HeaderMap;
use bytes::{Bytes, BytesMut};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use secrecy::{ExposeSecret, SecretString};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::admission::{Budget, Claim};
use crate::auth;
use crate::engine::InferenceEngine;
use crate::error::{ApiError, ApiErrorKind, Error, Result};
use crate::integrity::IntegrityConfig;
use crate::messages::{Preprocessor, preprocessor};
use crate::metrics::{Gauges, Metrics};
use crate::model::ChatModel;
use crate::parse::{ReasoningFormat, ToolCallFormat};
use crate::pool::{PoolLimits, WorkPool};
use crate::sampling::{HarnessSampling, SamplingDefaults};
use crate::session::{Session, SessionLimits, SessionStore};
use http_guard::{BodyRefused, ConnectionLimits};

/// How the proxy behaves.
#[derive(Clone)]
pub struct ProxyConfig {
    /// The admin key (control endpoints); the gateway key and session tokens derive from it.
    pub admin_key: SecretString,
    /// Allow the public default admin key on a non-loopback bind (never do this outside a sandbox).
    pub allow_default_admin_key: bool,
    /// The model name answered when a request names none (default: the model folder's name).
    pub model_name: Option<String>,
    /// How reasoning appears in outputs.
    pub reasoning: ReasoningFormat,
    /// How tool calls appear in outputs.
    pub tool_calls: ToolCallFormat,
    /// Message preprocessors, by name (see [`crate::messages::PREPROCESSORS`]), applied in order.
    pub preprocessors: Vec<String>,
    /// Bounds on sessions and stored tokens.
    pub limits: SessionLimits,
    /// Require `grant_capacity` before each `start_session`, as the reference does.
    pub capacity_grants: bool,
    /// A keep-alive is sent on a silent stream after this long.
    pub ping_interval: Duration,
    /// How long `export_trajectories` waits for `end_session` unless the request says.
    pub export_wait_timeout: Duration,
    /// How often idle sessions are swept.
    pub sweep_interval: Duration,
    /// The generation limit when a request sets none (default: the rest of the context window).
    pub default_max_new_tokens: Option<u32>,
    /// The run's temperature, top-p and top-k (default: none set, so temperature 1, top-p 1, no top-k).
    pub sampling: SamplingDefaults,
    /// Whether a harness's own sampling values win over the run's (default: they do, as in the reference).
    pub harness_sampling: HarnessSampling,
    /// Header, body and idle timeouts, the body size limit and the connection limit it is served under.
    pub connection: ConnectionLimits,
    /// What becomes of rewards a session sets on its own interactions with its key.
    pub session_rewards: SessionRewards,
    /// The threads that parse, render and tokenise generation requests, and how many may wait for one.
    pub pool: PoolLimits,
    /// The integrity rules generations are scanned with (default: the built-in rules for every session).
    pub integrity: IntegrityConfig,
}

/// What becomes of a reward a session sets with its own key (`POST /rl/set_reward`): the reference
/// allows the call, so a harness (or the agent code it runs) may grade itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SessionRewards {
    /// Kept and exported like the admin's (the reference's behaviour).
    #[default]
    Honour,
    /// Answered as the reference answers it (the interaction's id), but not kept: only rewards the admin
    /// sets, and the export's `final_reward`, reach the export. A trainer whose reward comes from
    /// elsewhere (arena-rl's, from Arena) sets this.
    Ignore,
}

impl std::fmt::Debug for ProxyConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyConfig")
            .field("admin_key", &"<redacted>")
            .field("model_name", &self.model_name)
            .field("reasoning", &self.reasoning)
            .field("tool_calls", &self.tool_calls)
            .field("preprocessors", &self.preprocessors)
            .field("limits", &self.limits)
            .field("capacity_grants", &self.capacity_grants)
            .field("ping_interval", &self.ping_interval)
            .field("export_wait_timeout", &self.export_wait_timeout)
            .field("sampling", &self.sampling)
            .field("harness_sampling", &self.harness_sampling)
            .field("connection", &self.connection)
            .field("session_rewards", &self.session_rewards)
            .field("pool", &self.pool)
            .field("integrity", &self.integrity)
            .finish_non_exhaustive()
    }
}

impl ProxyConfig {
    /// Defaults around `admin_key`.
    pub fn new(admin_key: SecretString) -> Self {
        Self {
            admin_key,
            allow_default_admin_key: false,
            model_name: None,
            reasoning: ReasoningFormat::Think,
            tool_calls: ToolCallFormat::Hermes,
            preprocessors: Vec::new(),
            limits: SessionLimits::default(),
            capacity_grants: true,
            ping_interval: Duration::from_secs(15),
            export_wait_timeout: Duration::from_secs(600),
            sweep_interval: Duration::from_secs(30),
            default_max_new_tokens: None,
            sampling: SamplingDefaults::default(),
            harness_sampling: HarnessSampling::Honour,
            connection: ConnectionLimits::default(),
            session_rewards: SessionRewards::Honour,
            pool: PoolLimits::default(),
            integrity: IntegrityConfig::default(),
        }
    }
}

pub(crate) struct Shared {
    pub(crate) config: ProxyConfig,
    pub(crate) model: Arc<ChatModel>,
    pub(crate) engine: Arc<dyn InferenceEngine>,
    pub(crate) store: Mutex<SessionStore>,
    pub(crate) metrics: Metrics,
    pub(crate) gateway_key: SecretString,
    pub(crate) preprocessors: Vec<Arc<dyn Preprocessor>>,
    pub(crate) pool: WorkPool,
    /// What protocols keep per session beside the session store, each created on first use.
    sides: Mutex<Vec<Arc<dyn SessionSide>>>,
    model_name: String,
    /// What generation requests hold across sessions while they are read and prepared.
    request_bytes: Arc<Budget>,
}

/// What a protocol keeps per session beside the session store (the Responses module's stored answers):
/// the session store holds only what every protocol needs, and knows no protocol. A side is created on
/// first use ([`ProxyState::side`]) and told when a session is exported or expires, after the session
/// store let it go; a side adds to a session only while holding the session store's lock and seeing the
/// session there, so nothing it keeps outlives its session.
pub(crate) trait SessionSide: Any + Send + Sync {
    /// Forgets everything kept for `session`.
    fn forget(&self, session: &str);
    /// The bytes kept across sessions (the `rollout_proxy_stored_response_bytes` gauge).
    fn bytes(&self) -> usize;
}

/// The proxy's state, cheap to clone; [`router`] serves it.
#[derive(Clone)]
pub struct ProxyState {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ProxyState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyState")
            .field("config", &self.shared.config)
            .field("model", &self.shared.model_name)
            .finish_non_exhaustive()
    }
}

/// Who a request is from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Caller {
    Admin,
    Session(Arc<str>),
}

impl ProxyState {
    /// State for serving `model` through `engine`.
    pub fn new(config: ProxyConfig, model: Arc<ChatModel>, engine: Arc<dyn InferenceEngine>) -> Result<Self> {
        let mut preprocessors = Vec::new();
        for name in &config.preprocessors {
            preprocessors.push(preprocessor(name).ok_or_else(|| {
                Error::Config(format!(
                    "unknown preprocessor {name:?}; known: {:?}",
                    crate::messages::PREPROCESSORS
                ))
            })?);
        }
        config.sampling.validate()?;
        config.connection.validate().map_err(Error::Config)?;
        config.pool.validate().map_err(Error::Config)?;
        if config.admin_key.expose_secret().is_empty() {
            return Err(Error::Config("the admin key must not be empty".into()));
        }
        if engine.max_context_len() < 2 {
            return Err(Error::Config(
                "the engine's context window must hold at least 2 tokens".into(),
            ));
        }
        let model_name = config.model_name.clone().unwrap_or_else(|| model.name.clone());
        let store = SessionStore::new(config.limits.clone(), config.capacity_grants);
        let request_bytes = Budget::new(config.limits.max_request_bytes);
        Ok(Self {
            shared: Arc::new(Shared {
                gateway_key: auth::gateway_key(&config.admin_key),
                pool: WorkPool::new(config.pool.clone()),
                config,
                model,
                engine,
                store: Mutex::new(store),
                metrics: Metrics::default(),
                preprocessors,
                sides: Mutex::new(Vec::new()),
                model_name,
                request_bytes,
            }),
        })
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    pub(crate) fn store(&self) -> MutexGuard<'_, SessionStore> {
        self.shared.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The side store of type `T`, made with `make` on first use.
    pub(crate) fn side<T: SessionSide>(&self, make: impl FnOnce(&ProxyConfig) -> T) -> Arc<T> {
        let mut sides = self.shared.sides.lock().unwrap_or_else(PoisonError::into_inner);
        for side in sides.iter() {
            let any: Arc<dyn Any + Send + Sync> = side.clone();
            if let Ok(found) = any.downcast::<T>() {
                return found;
            }
        }
        let made = Arc::new(make(&self.shared.config));
        sides.push(made.clone());
        made
    }

    /// Every side store, for telling them of sessions gone.
    fn sides(&self) -> Vec<Arc<dyn SessionSide>> {
        self.shared
            .sides
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Removes session `id` for export (410 when it is gone, 404 when it never existed), and forgets
    /// what the side stores kept for it.
    pub(crate) fn take_session(&self, id: &str) -> Result<Session, ApiError> {
        let session = self.store().take(id)?;
        for side in self.sides() {
            side.forget(id);
        }
        Ok(session)
    }

    /// The model it serves (its tokenizer and chat template).
    pub fn model(&self) -> &Arc<ChatModel> {
        &self.shared.model
    }

    /// The model name answered when a request names none.
    pub fn model_name(&self) -> &str {
        &self.shared.model_name
    }

    /// The generation-only gateway key (hand this, never the admin key, to a gateway).
    pub fn gateway_key(&self) -> SecretString {
        self.shared.gateway_key.clone()
    }

    /// The session token of `session_id` for gateway requests (`X-Session-Token`).
    pub fn session_token(&self, session_id: &str) -> SecretString {
        auth::session_token(&self.shared.gateway_key, session_id)
    }

    /// Drops sessions idle past the session timeout; answers how many.
    pub fn sweep(&self) -> usize {
        let expired = self.store().sweep(Instant::now());
        Metrics::add(&self.shared.metrics.sessions_expired, expired.len() as u64);
        let sides = if expired.is_empty() {
            Vec::new()
        } else {
            self.sides()
        };
        for id in &expired {
            for side in &sides {
                side.forget(id);
            }
        }
        for id in &expired {
            tracing::info!(session = &**id, "session expired after idling");
        }
        expired.len()
    }

    /// Sweeps idle sessions every `sweep_interval` until the state is dropped.
    pub fn spawn_sweeper(&self) -> JoinHandle<()> {
        let weak: Weak<Shared> = Arc::downgrade(&self.shared);
        let interval = self.shared.config.sweep_interval;
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(shared) = weak.upgrade() else { break };
                ProxyState { shared }.sweep();
            }
        })
    }

    /// The admin check of control endpoints: the first credential must be the admin key.
    pub(crate) fn require_admin(&self, headers: &HeaderMap) -> Result<(), ApiError> {
        let creds = auth::credentials(headers);
        let first = creds
            .first()
            .ok_or_else(|| ApiError::new(ApiErrorKind::Unauthenticated, "missing API key"))?;
        if auth::secrets_equal(first, &self.shared.config.admin_key) {
            Ok(())
        } else {
            Err(ApiError::new(
                ApiErrorKind::PermissionDenied,
                "the admin key is required",
            ))
        }
    }

    /// Who calls a session endpoint (`set_reward`, `end_session`): the admin, or a session by its key.
    /// Gateway keys are refused (403): they may only generate.
    pub(crate) fn session_caller(&self, headers: &HeaderMap) -> Result<Caller, ApiError> {
        let creds = auth::credentials(headers);
        if creds.is_empty() {
            return Err(ApiError::new(ApiErrorKind::Unauthenticated, "missing API key"));
        }
        if creds
            .iter()
            .any(|c| auth::secrets_equal(c, &self.shared.gateway_key))
        {
            return Err(ApiError::new(
                ApiErrorKind::PermissionDenied,
                "gateway keys are generation-only",
            ));
        }
        if auth::secrets_equal(&creds[0], &self.shared.config.admin_key) {
            return Ok(Caller::Admin);
        }
        let store = self.store();
        creds
            .iter()
            .find_map(|c| store.session_for_key(c))
            .map(Caller::Session)
            .ok_or_else(|| ApiError::new(ApiErrorKind::Unauthenticated, "invalid or inactive session key"))
    }

    /// The session a generation request belongs to: by its session key, or by the gateway key plus
    /// `X-Session-Id` and a matching `X-Session-Token`.
    pub(crate) fn generation_session(&self, headers: &HeaderMap) -> Result<Arc<str>, ApiError> {
        let creds = auth::credentials(headers);
        if creds.is_empty() {
            return Err(ApiError::new(ApiErrorKind::Unauthenticated, "missing API key"));
        }
        if creds
            .iter()
            .any(|c| auth::secrets_equal(c, &self.shared.gateway_key))
        {
            let unauthorised = || ApiError::new(ApiErrorKind::Unauthenticated, "invalid session id or token");
            let id = headers
                .get("x-session-id")
                .and_then(|v| v.to_str().ok())
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .ok_or_else(unauthorised)?;
            let token = headers
                .get("x-session-token")
                .and_then(|v| v.to_str().ok())
                .map(|t| SecretString::from(t.trim().to_string()))
                .ok_or_else(unauthorised)?;
            if !auth::secrets_equal(&token, &auth::session_token(&self.shared.gateway_key, id)) {
                return Err(unauthorised());
            }
            let mut store = self.store();
            return match store.get_mut(id) {
                Ok(s) if !s.ended => Ok(s.id.clone()),
                _ => Err(unauthorised()),
            };
        }
        let store = self.store();
        creds
            .iter()
            .find_map(|c| store.session_for_key(c))
            .ok_or_else(|| ApiError::new(ApiErrorKind::Unauthenticated, "invalid or inactive session key"))
    }

    /// Reads a request body whole, once the caller's credentials have passed: 413 over the body limit
    /// (at once when `Content-Length` says so), 408 when the connection's body deadline passes.
    /// Claims a place for a generation request of `session` before its body is read (see
    /// [`crate::admission`]).
    pub(crate) fn claim(&self, session: &str) -> Result<Claim, ApiError> {
        self.store()
            .claim(session, &self.shared.request_bytes, Instant::now())
    }

    /// Reads a generation request's body under `claim`: all of a declared `Content-Length` is reserved
    /// before a byte is read, a body without one as each piece arrives, so a refusal reads no more.
    pub(crate) async fn read_claimed_body(&self, body: Body, claim: &mut Claim) -> Result<Bytes, ApiError> {
        let limit = self.shared.config.connection.max_body_bytes;
        let hint = body.size_hint();
        if hint.lower() > limit as u64 {
            return Err(body_refused(BodyRefused::TooLarge { limit }));
        }
        let declared = hint.exact().map(|n| n as usize);
        if let Some(n) = declared {
            claim.reserve(n, "the request body")?;
        }
        let mut body = Limited::new(body, limit);
        let mut out = BytesMut::with_capacity(declared.unwrap_or(0));
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| {
                if e.is::<LengthLimitError>() {
                    body_refused(BodyRefused::TooLarge { limit })
                } else {
                    BodyRefused::find(&*e).map_or_else(
                        || ApiError::invalid(format!("the request body could not be read: {e}")),
                        body_refused,
                    )
                }
            })?;
            if let Ok(data) = frame.into_data() {
                if declared.is_none() {
                    claim.reserve(data.len(), "the request body")?;
                }
                out.extend_from_slice(&data);
            }
        }
        Ok(out.freeze())
    }

    pub(crate) async fn read_body(&self, body: Body) -> Result<Bytes, ApiError> {
        let limit = self.shared.config.connection.max_body_bytes;
        let refused = |refused: BodyRefused| {
            let kind = match refused {
                BodyRefused::TooLarge { .. } => ApiErrorKind::PayloadTooLarge,
                BodyRefused::TimedOut(_) => ApiErrorKind::RequestTimeout,
            };
            ApiError::new(kind, refused.to_string())
        };
        if body.size_hint().lower() > limit as u64 {
            return Err(refused(BodyRefused::TooLarge { limit }));
        }
        match Limited::new(body, limit).collect().await {
            Ok(collected) => Ok(collected.to_bytes()),
            Err(e) if e.is::<LengthLimitError>() => Err(refused(BodyRefused::TooLarge { limit })),
            Err(e) => Err(BodyRefused::find(&*e).map_or_else(
                || ApiError::invalid(format!("the request body could not be read: {e}")),
                refused,
            )),
        }
    }

    pub(crate) fn gauges(&self) -> Gauges {
        let response_bytes = self.sides().iter().map(|s| s.bytes()).sum();
        let store = self.store();
        Gauges {
            live_sessions: store.live_sessions(),
            stored_tokens: store.stored_tokens(),
            reserved_tokens: store.reserved_tokens(),
            response_bytes,
            pool_held: self.shared.pool.held(),
            request_bytes: self.shared.request_bytes.used(),
        }
    }
}

fn body_refused(refused: BodyRefused) -> ApiError {
    let kind = match refused {
        BodyRefused::TooLarge { .. } => ApiErrorKind::PayloadTooLarge,
        BodyRefused::TimedOut(_) => ApiErrorKind::RequestTimeout,
    };
    ApiError::new(kind, refused.to_string())
}
