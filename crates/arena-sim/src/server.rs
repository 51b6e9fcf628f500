//! The sim as tests hold it: [`SimBuilder`] binds a socket and serves the router (the LLM gateway and the
//! control plane), and [`ArenaSim`] is the running server's handle (counters, request log, world changes).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::arena::Arena;
use crate::fault::{Endpoint, FaultRule};
use crate::harness::{Harness, HarnessSet, ScriptedHarness, lock};
use crate::state::{ArenaState, Counters, RecordedRequest, RouteInfo, TaskState};
use crate::world::{RefDef, World};
use crate::{Error, Result};
use http_guard::{ConnectionLimits, serve_with};

/// Builds a sim: a world plus harnesses, then [`SimBuilder::start`].
pub struct SimBuilder {
    world: World,
    harnesses: HashMap<String, Arc<dyn Harness>>,
    addr: SocketAddr,
    listener: Option<TcpListener>,
    limits: ConnectionLimits,
}

impl SimBuilder {
    /// Runs launches whose harness key (the part before `@`) is `key` with this harness instead of the
    /// scripted one.
    pub fn harness(mut self, key: &str, harness: Arc<dyn Harness>) -> Self {
        self.harnesses.insert(key.to_string(), harness);
        self
    }

    /// Binds this address instead of `127.0.0.1:0`.
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.addr = addr;
        self
    }

    /// Serves on a listener the caller bound (with its own socket options, which accepted connections
    /// inherit) instead of binding one.
    pub fn listener(mut self, listener: TcpListener) -> Self {
        self.listener = Some(listener);
        self
    }

    /// Serves under these header, body, idle and write timeouts, body limit and connection limit instead of
    /// the defaults.
    pub fn connection_limits(mut self, limits: ConnectionLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Binds the socket and starts serving.
    pub async fn start(self) -> Result<ArenaSim> {
        self.world.validate()?;
        self.limits.validate().map_err(Error::World)?;
        let listener = match self.listener {
            Some(listener) => listener,
            None => TcpListener::bind(self.addr).await.map_err(|source| Error::Bind {
                addr: self.addr,
                source,
            })?,
        };
        let addr = listener.local_addr().map_err(|source| Error::Bind {
            addr: self.addr,
            source,
        })?;
        let base_url = format!("http://{addr}");
        let http = http_client().map_err(Error::World)?;
        let mut harnesses = self.harnesses;
        for (key, def) in &self.world.runners {
            harnesses
                .entry(key.clone())
                .or_insert_with(|| def.build(key, self.world.seed, http.clone()));
        }
        let scripted = Arc::new(ScriptedHarness::new(self.world.scripted.clone()));
        let arena = Arc::new(Arena {
            state: Mutex::new(ArenaState::new(&self.world)),
            token: self.world.token.clone(),
            llm_api_key: self.world.llm_api_key.clone(),
            dataset_items: self.world.dataset_items,
            cancel_endpoint: self.world.cancel_endpoint,
            task_id_prefix: self.world.task_id_prefix.clone(),
            harnesses: HarnessSet {
                by_key: harnesses,
                fallback: scripted.clone(),
            },
            base_url: base_url.clone(),
            http,
            changed: watch::channel(0).0,
        });
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let app = router(arena.clone());
        let limits = self.limits;
        let server = tokio::spawn(async move {
            let shutdown = async {
                let _ = stop_rx.await;
            };
            if let Err(e) = serve_with(listener, app, limits, shutdown).await {
                tracing::error!(error = %e, "arena-sim server stopped");
            }
        });
        tracing::info!(%base_url, "arena-sim listening");
        Ok(ArenaSim {
            arena,
            scripted,
            addr,
            stop: Some(stop_tx),
            server: Some(server),
        })
    }
}

/// A running sim. Dropping it stops the server.
pub struct ArenaSim {
    arena: Arc<Arena>,
    scripted: Arc<ScriptedHarness>,
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    server: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for ArenaSim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArenaSim").field("addr", &self.addr).finish()
    }
}

impl ArenaSim {
    /// A builder for this world.
    pub fn builder(world: World) -> SimBuilder {
        SimBuilder {
            world,
            harnesses: HashMap::new(),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            listener: None,
            limits: ConnectionLimits::default(),
        }
    }

    /// Starts a sim on a free loopback port with the scripted harness.
    pub async fn start(world: World) -> Result<Self> {
        Self::builder(world).start().await
    }

    /// The socket address served.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The control-plane base URL (`http://127.0.0.1:PORT`), without `/openapi/v1`.
    pub fn base_url(&self) -> String {
        self.arena.base_url.clone()
    }

    /// The LLM gateway URL handed to harnesses (`{base}/api`).
    pub fn gateway_url(&self) -> String {
        format!("{}/api", self.arena.base_url)
    }

    /// The scripted harness, to change outcomes or open gates while running.
    pub fn scripted(&self) -> Arc<ScriptedHarness> {
        self.scripted.clone()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        lock(&self.arena.state).counters.clone()
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.arena.state).log.clone()
    }

    /// The requests that hit one endpoint.
    pub fn requests_to(&self, endpoint: Endpoint) -> Vec<RecordedRequest> {
        lock(&self.arena.state)
            .log
            .iter()
            .filter(|r| r.endpoint == endpoint)
            .cloned()
            .collect()
    }

    /// Forgets the request log (counters stay).
    pub fn clear_requests(&self) {
        lock(&self.arena.state).log.clear();
    }

    /// Waits until the counters satisfy `cond`; wakes on every request and task change, never polls.
    pub async fn wait_until(&self, cond: impl Fn(&Counters) -> bool) {
        let mut rx = self.arena.changed.subscribe();
        loop {
            if cond(&self.counters()) {
                return;
            }
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    /// Adds a fault rule at the end of the list.
    pub fn add_fault(&self, rule: FaultRule) {
        lock(&self.arena.state).faults.push(rule);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        lock(&self.arena.state).faults.clear();
    }

    /// The routes registered now.
    pub fn routes(&self) -> Vec<RouteInfo> {
        lock(&self.arena.state)
            .routes
            .values()
            .map(|r| r.info.clone())
            .collect()
    }

    /// Garbage-collects one route now, as Arena does with idle routes; false if it did not exist.
    pub fn gc_route(&self, model_name: &str) -> bool {
        let removed = lock(&self.arena.state).remove_route(model_name, true);
        self.arena.bump();
        removed
    }

    /// Changes a stream's live reward ref (a grader rollout between preflight and launch).
    pub fn set_reward_ref(&self, stream_id: &str, reward: Option<RefDef>) {
        if let Some(s) = lock(&self.arena.state).stream_mut(stream_id) {
            s.def.default_reward_ref = reward;
        }
    }

    /// Changes a stream's status.
    pub fn set_stream_status(&self, stream_id: &str, status: Option<&str>) {
        if let Some(s) = lock(&self.arena.state).stream_mut(stream_id) {
            s.def.status = status.map(str::to_string);
        }
    }

    /// The status a poll of this task would report now, without counting as a poll.
    pub fn task_status(&self, task_id: &str) -> Option<String> {
        lock(&self.arena.state)
            .tasks
            .get(task_id)
            .map(TaskState::current_status)
    }

    /// Every task launched so far with the status a poll would report now, by task id.
    pub fn tasks(&self) -> std::collections::BTreeMap<String, String> {
        lock(&self.arena.state)
            .tasks
            .iter()
            .map(|(id, t)| (id.clone(), t.current_status()))
            .collect()
    }

    /// Stops the server and waits for it.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            let _ = server.await;
        }
    }
}

/// The pooled client the gateway forwards with and the LLM harnesses call models with: no overall timeout
/// (streams last as long as the model writes), a connect timeout, and no proxy from the environment.
pub(crate) fn http_client() -> std::result::Result<reqwest::Client, String> {
    // reqwest is built without a bundled TLS provider; an error only means one is installed already.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(30))
        .no_proxy()
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

impl Drop for ArenaSim {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(server) = self.server.take() {
            server.abort();
        }
    }
}

fn router(arena: Arc<Arena>) -> Router {
    crate::gateway::routes()
        .merge(crate::control::routes())
        .with_state(arena)
}
