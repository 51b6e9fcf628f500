//! The proxy's router over [`ProxyState`], and serving it (with a sweeper for idle sessions, the
//! connection limits of [`http_guard`] and graceful shutdown) without callers having to name the
//! HTTP stack.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Instant as StdInstant;

use axum::Router;
use axum::extract::{MatchedPath, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{get, post};
use secrecy::ExposeSecret;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::auth::DEFAULT_ADMIN_KEY;
use crate::control;
use crate::error::{ApiErrorKind, Error, Result};
use crate::protocol;
use crate::state::{ProxyConfig, ProxyState};
use http_guard::ConnectionLimits;

fn endpoint_label(path: &str) -> &'static str {
    match path {
        "/chat/completions" | "/v1/chat/completions" => "chat_completions",
        "/messages" | "/v1/messages" => "messages",
        "/messages/count_tokens" | "/v1/messages/count_tokens" => "count_tokens",
        "/responses" | "/v1/responses" => "responses",
        "/responses/{id}" | "/v1/responses/{id}" => "get_response",
        "/rl/start_session" => "start_session",
        "/rl/set_reward" => "set_reward",
        "/rl/end_session" => "end_session",
        "/export_trajectories" => "export_trajectories",
        "/grant_capacity" => "grant_capacity",
        "/health" => "health",
        "/metrics" => "metrics",
        "/v1/models" | "/models" => "models",
        _ => "other",
    }
}

async fn track(State(state): State<ProxyState>, request: Request, next: Next) -> Response {
    let label = request
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| endpoint_label(p.as_str()));
    let start = StdInstant::now();
    let response = next.run(request).await;
    let metrics = &state.shared().metrics;
    metrics.request(label, response.status().as_u16(), start.elapsed());
    if let Some(kind) = response.extensions().get::<ApiErrorKind>() {
        metrics.error(kind.label());
    }
    response
}

/// The proxy's router: control endpoints, Chat Completions, Anthropic Messages, Responses, health and
/// metrics.
pub fn router(state: ProxyState) -> Router {
    Router::new()
        .route("/health", get(control::health))
        .route("/metrics", get(control::metrics))
        .route("/v1/models", get(control::models))
        .route("/models", get(control::models))
        .route("/grant_capacity", post(control::grant_capacity))
        .route("/rl/start_session", post(control::start_session))
        .route("/rl/set_reward", post(control::set_reward))
        .route("/rl/end_session", post(control::end_session))
        .route("/export_trajectories", post(control::export_trajectories))
        .route("/chat/completions", post(protocol::chat::handler))
        .route("/v1/chat/completions", post(protocol::chat::handler))
        .route("/v1/messages", post(protocol::anthropic::handler))
        .route("/messages", post(protocol::anthropic::handler))
        .route(
            "/v1/messages/count_tokens",
            post(protocol::anthropic::count_tokens),
        )
        .route("/messages/count_tokens", post(protocol::anthropic::count_tokens))
        .route("/v1/responses", post(protocol::responses::handler))
        .route("/responses", post(protocol::responses::handler))
        .route("/v1/responses/{id}", get(protocol::responses::get))
        .route("/responses/{id}", get(protocol::responses::get))
        .layer(middleware::from_fn_with_state(state.clone(), track))
        .with_state(state)
}

/// Refuses the public default admin key on a non-loopback address unless explicitly allowed.
pub fn check_bind(addr: &SocketAddr, config: &ProxyConfig) -> Result<()> {
    let is_default = config.admin_key.expose_secret() == DEFAULT_ADMIN_KEY;
    if is_default && !addr.ip().is_loopback() && !config.allow_default_admin_key {
        return Err(Error::Config(format!(
            "refusing to listen on {addr} with the public default admin key; set a private admin key"
        )));
    }
    Ok(())
}

/// Serves `router` on `listener` under the default [`ConnectionLimits`] until `shutdown` completes, then
/// finishes open requests ([`http_guard::serve_with`] takes the limits).
pub async fn serve(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    http_guard::serve_with(listener, router, ConnectionLimits::default(), shutdown).await
}

/// A running server: its address, and a handle to stop it.
#[derive(Debug)]
pub struct ProxyServer {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<std::io::Result<()>>,
    sweeper: Option<JoinHandle<()>>,
}

impl ProxyServer {
    /// Binds `addr` (port 0 picks a free port) and serves the proxy for `state`, sweeping idle sessions.
    pub async fn start(addr: SocketAddr, state: ProxyState) -> Result<Self> {
        check_bind(&addr, &state.shared().config)?;
        let listener = TcpListener::bind(addr).await.map_err(Error::Serve)?;
        Self::start_on(listener, state)
    }

    /// Serves the proxy for `state` on a listener the caller bound (with its own socket options, which
    /// accepted connections inherit), sweeping idle sessions.
    pub fn start_on(listener: TcpListener, state: ProxyState) -> Result<Self> {
        let addr = listener.local_addr().map_err(Error::Serve)?;
        check_bind(&addr, &state.shared().config)?;
        let sweeper = state.spawn_sweeper();
        let limits = state.shared().config.connection.clone();
        let mut server = Self::serve_listener(listener, router(state), limits)?;
        server.sweeper = Some(sweeper);
        Ok(server)
    }

    /// Binds `addr` and serves any router (for instance [`crate::engine::generate_router`]) under the
    /// default [`ConnectionLimits`].
    pub async fn serve_router(addr: SocketAddr, router: Router) -> Result<Self> {
        Self::serve_router_with(addr, router, ConnectionLimits::default()).await
    }

    /// Binds `addr` and serves any router under `limits`.
    pub async fn serve_router_with(
        addr: SocketAddr,
        router: Router,
        limits: ConnectionLimits,
    ) -> Result<Self> {
        limits.validate().map_err(Error::Config)?;
        let listener = TcpListener::bind(addr).await.map_err(Error::Serve)?;
        Self::serve_listener(listener, router, limits)
    }

    fn serve_listener(listener: TcpListener, router: Router, limits: ConnectionLimits) -> Result<Self> {
        limits.validate().map_err(Error::Config)?;
        let addr = listener.local_addr().map_err(Error::Serve)?;
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(http_guard::serve_with(listener, router, limits, async move {
            let _ = stopped.await;
        }));
        Ok(Self {
            addr,
            stop: Some(stop),
            task,
            sweeper: None,
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, finishes open requests, and returns.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(sweeper) = self.sweeper.take() {
            sweeper.abort();
        }
        match (&mut self.task).await {
            Ok(result) => result.map_err(Error::Serve),
            Err(e) => Err(Error::Serve(std::io::Error::other(e.to_string()))),
        }
    }
}
