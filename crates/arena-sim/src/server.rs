//! The HTTP side: the axum router serving E1-E11, cancel and the LLM gateway, the shared state behind it,
//! and the [`ArenaSim`] handle tests hold.

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, State as AxState};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::fault::{Endpoint, FaultKind, FaultRule};
use crate::harness::{
    Harness, HarnessContext, HarnessSet, LaunchReply, LaunchRequest, ScriptedHarness, lock,
};
use crate::state::{Counters, RecordedRequest, RouteInfo, RouteState, State, TaskState};
use crate::world::{CancelEndpoint, RefDef, RowDef, World};
use crate::{Error, Result};

/// The marker in a 403 body that Arena's gateway sends for a transient rejection.
pub const TRANSIENT_403_MARKER: &str = "spanner-http-ant-group-watch-all";

pub(crate) struct Shared {
    pub(crate) state: Mutex<State>,
    token: String,
    pub(crate) llm_api_key: Option<String>,
    dataset_items: bool,
    cancel_endpoint: CancelEndpoint,
    task_id_prefix: String,
    harnesses: HarnessSet,
    base_url: String,
    /// The gateway's pooled client for upstream calls.
    pub(crate) http: reqwest::Client,
    changed: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }
}

/// Builds a sim: a world plus harnesses, then [`SimBuilder::start`].
pub struct SimBuilder {
    world: World,
    harnesses: HashMap<String, Arc<dyn Harness>>,
    addr: SocketAddr,
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

    /// Binds the socket and starts serving.
    pub async fn start(self) -> Result<ArenaSim> {
        self.world.validate()?;
        let listener = TcpListener::bind(self.addr).await.map_err(|source| Error::Bind {
            addr: self.addr,
            source,
        })?;
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
        let shared = Arc::new(Shared {
            state: Mutex::new(State::new(&self.world)),
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
        let app = router(shared.clone());
        let server = tokio::spawn(async move {
            let shutdown = async {
                let _ = stop_rx.await;
            };
            if let Err(e) = axum::serve(listener, app).with_graceful_shutdown(shutdown).await {
                tracing::error!(error = %e, "arena-sim server stopped");
            }
        });
        tracing::info!(%base_url, "arena-sim listening");
        Ok(ArenaSim {
            shared,
            scripted,
            addr,
            stop: Some(stop_tx),
            server: Some(server),
        })
    }
}

/// A running sim. Dropping it stops the server.
pub struct ArenaSim {
    shared: Arc<Shared>,
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
        self.shared.base_url.clone()
    }

    /// The LLM gateway URL handed to harnesses (`{base}/api`).
    pub fn gateway_url(&self) -> String {
        format!("{}/api", self.shared.base_url)
    }

    /// The scripted harness, to change outcomes or open gates while running.
    pub fn scripted(&self) -> Arc<ScriptedHarness> {
        self.scripted.clone()
    }

    /// A snapshot of the counters.
    pub fn counters(&self) -> Counters {
        lock(&self.shared.state).counters.clone()
    }

    /// Every request so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        lock(&self.shared.state).log.clone()
    }

    /// The requests that hit one endpoint.
    pub fn requests_to(&self, endpoint: Endpoint) -> Vec<RecordedRequest> {
        lock(&self.shared.state)
            .log
            .iter()
            .filter(|r| r.endpoint == endpoint)
            .cloned()
            .collect()
    }

    /// Forgets the request log (counters stay).
    pub fn clear_requests(&self) {
        lock(&self.shared.state).log.clear();
    }

    /// Waits until the counters satisfy `cond`; wakes on every request and task change, never polls.
    pub async fn wait_until(&self, cond: impl Fn(&Counters) -> bool) {
        let mut rx = self.shared.changed.subscribe();
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
        lock(&self.shared.state).faults.push(rule);
    }

    /// Removes every fault rule.
    pub fn clear_faults(&self) {
        lock(&self.shared.state).faults.clear();
    }

    /// The routes registered now.
    pub fn routes(&self) -> Vec<RouteInfo> {
        lock(&self.shared.state)
            .routes
            .values()
            .map(|r| r.info.clone())
            .collect()
    }

    /// Garbage-collects one route now, as Arena does with idle routes; false if it did not exist.
    pub fn gc_route(&self, model_name: &str) -> bool {
        let removed = lock(&self.shared.state).remove_route(model_name, true);
        self.shared.bump();
        removed
    }

    /// Changes a stream's live reward ref (a grader rollout between preflight and launch).
    pub fn set_reward_ref(&self, stream_id: &str, reward: Option<RefDef>) {
        if let Some(s) = lock(&self.shared.state).stream_mut(stream_id) {
            s.def.default_reward_ref = reward;
        }
    }

    /// Changes a stream's status.
    pub fn set_stream_status(&self, stream_id: &str, status: Option<&str>) {
        if let Some(s) = lock(&self.shared.state).stream_mut(stream_id) {
            s.def.status = status.map(str::to_string);
        }
    }

    /// The status a poll of this task would report now, without counting as a poll.
    pub fn task_status(&self, task_id: &str) -> Option<String> {
        lock(&self.shared.state)
            .tasks
            .get(task_id)
            .map(TaskState::current_status)
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

fn router(shared: Arc<Shared>) -> Router {
    crate::gateway::routes()
        .route("/openapi/v1/streams", get(list_streams))
        .route("/openapi/v1/streams/{stream_id}", get(get_stream))
        .route("/openapi/v1/streams/{stream_id}/dataset", post(dataset))
        .route(
            "/openapi/v1/streams/{stream_id}/launch_one_task",
            post(launch_one_task),
        )
        .route("/openapi/v1/streams/{stream_id}/tasks", get(stream_tasks))
        .route("/openapi/v1/tasks/{task_id}/result", get(task_result))
        .route("/openapi/v1/tasks/{task_id}/cancel", post(cancel_task))
        .route("/openapi/v1/llm/models", post(register_model))
        .route(
            "/openapi/v1/llm/models/{model_name}",
            get(get_model).delete(delete_model).patch(renew_model),
        )
        .route(
            "/openapi/v1/harnesses/{key}/versions/{version}",
            get(harness_version),
        )
        .with_state(shared)
}

pub(crate) type Sim = AxState<Arc<Shared>>;

/// What every handler needs from the request head.
pub(crate) struct Req {
    pub(crate) uri: Uri,
    pub(crate) headers: HeaderMap,
    peer: Option<SocketAddr>,
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for Req {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> std::result::Result<Self, Self::Rejection> {
        Ok(Self {
            uri: parts.uri.clone(),
            headers: parts.headers.clone(),
            peer: parts
                .extensions
                .get::<axum::extract::ConnectInfo<SocketAddr>>()
                .map(|c| c.0),
        })
    }
}

/// What a handler learns from [`begin`]: the fault to apply while handling, if any. It counts the request
/// as in flight until dropped.
pub(crate) struct Call {
    pub(crate) fault: Option<FaultKind>,
    pub(crate) _in_flight: InFlight,
}

pub(crate) struct InFlight {
    shared: Arc<Shared>,
    endpoint: Endpoint,
}

impl InFlight {
    fn enter(shared: &Arc<Shared>, endpoint: Endpoint) -> Self {
        {
            let mut state = lock(&shared.state);
            let counters = &mut state.counters;
            let now = counters.in_flight.entry(endpoint).or_default();
            *now += 1;
            let now = *now;
            let max = counters.max_in_flight.entry(endpoint).or_default();
            *max = (*max).max(now);
        }
        Self {
            shared: shared.clone(),
            endpoint,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(n) = lock(&self.shared.state)
            .counters
            .in_flight
            .get_mut(&self.endpoint)
        {
            *n = n.saturating_sub(1);
        }
        self.shared.bump();
    }
}

fn error_body(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(json!({"error": {"code": status.as_u16(), "message": message}})),
    )
        .into_response()
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// Records the request, checks the bearer token, decides and applies pre-handling faults.
async fn begin(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    method: Method,
    req: &Req,
    body: Option<Value>,
) -> std::result::Result<Call, Response> {
    let authorized = req
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == shared.token);
    let (fault, in_flight) = admit(shared, endpoint, method, req, body, authorized);
    if !authorized {
        return Err(error_body(
            StatusCode::UNAUTHORIZED,
            "missing or invalid bearer token",
        ));
    }
    match fault {
        Some(FaultKind::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Err(error_body(status, "injected fault"))
        }
        Some(FaultKind::Marker403) => Err(marker_403()),
        Some(FaultKind::DelayMs(ms)) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(Call {
                fault: None,
                _in_flight: in_flight,
            })
        }
        other => Ok(Call {
            fault: other,
            _in_flight: in_flight,
        }),
    }
}

/// The transient 403 of Arena's gateway, with its marker.
pub(crate) fn marker_403() -> Response {
    (
        StatusCode::FORBIDDEN,
        format!("<html><body>Access denied ({TRANSIENT_403_MARKER})</body></html>"),
    )
        .into_response()
}

/// Records one request (log, counters, route sweep) and decides its fault; only authorized requests can
/// be faulted. The returned guard counts the request as in flight.
pub(crate) fn admit(
    shared: &Arc<Shared>,
    endpoint: Endpoint,
    method: Method,
    req: &Req,
    body: Option<Value>,
    authorized: bool,
) -> (Option<FaultKind>, InFlight) {
    let (uri, headers) = (&req.uri, &req.headers);
    let fault = {
        let mut state = lock(&shared.state);
        state.sweep_routes(Instant::now());
        *state.counters.requests.entry(endpoint).or_default() += 1;
        let fault = if authorized {
            state.faults.decide(endpoint)
        } else {
            state.counters.unauthorized += 1;
            None
        };
        if fault.is_some() {
            *state.counters.faults.entry(endpoint).or_default() += 1;
        }
        state.log.push(RecordedRequest {
            endpoint,
            method: method.to_string(),
            path: uri.path().to_string(),
            query: uri.query().map(str::to_string),
            authorized,
            idempotency_key: headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            body,
            fault: fault.as_ref().map(|f| format!("{f:?}")),
            peer: req.peer,
        });
        fault
    };
    let in_flight = InFlight::enter(shared, endpoint);
    shared.bump();
    (fault, in_flight)
}

/// Applies post-handling faults to a response.
pub(crate) fn finish(call: &Call, response: Response) -> Response {
    match call.fault {
        Some(FaultKind::Drop) => lost_response(),
        Some(FaultKind::NonJson) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "text/html")],
            "<html>maintenance</html>",
        )
            .into_response(),
        _ => response,
    }
}

/// A response whose body fails at once: the client has sent its request and gets no usable reply.
pub(crate) fn lost_response() -> Response {
    let body = futures::stream::once(async {
        Err::<Bytes, std::io::Error>(std::io::Error::other("arena-sim dropped the connection"))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

pub(crate) fn parse_body(bytes: &Bytes) -> Option<Value> {
    if bytes.is_empty() {
        None
    } else {
        Some(
            serde_json::from_slice(bytes)
                .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned())),
        )
    }
}

/// `limit` and `offset` from the query, with defaults; an unparsable value is a 422.
fn paging(uri: &Uri, default_limit: u64) -> std::result::Result<(u64, u64), Box<Response>> {
    let mut out = (default_limit, 0);
    for pair in uri.query().unwrap_or_default().split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match k {
            "limit" => &mut out.0,
            "offset" => &mut out.1,
            _ => continue,
        };
        *slot = v.parse().map_err(|_| {
            Box::new(error_body(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("{k} must be a non-negative integer"),
            ))
        })?;
    }
    Ok(out)
}

fn query_str(uri: &Uri, name: &str) -> Option<String> {
    uri.query()?.split('&').find_map(|pair| {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        (k == name).then(|| v.to_string())
    })
}

async fn list_streams(AxState(sim): Sim, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::ListStreams, Method::GET, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let wanted = query_str(&req.uri, "status");
    let items: Vec<Value> = {
        let state = lock(&sim.state);
        state
            .streams
            .iter()
            .filter(|s| wanted.is_none() || s.def.status == wanted)
            .map(|s| s.to_json(&s.def.stream_id))
            .collect()
    };
    let total = items.len();
    finish(
        &call,
        reply(StatusCode::OK, json!({"items": items, "total": total})),
    )
}

async fn get_stream(AxState(sim): Sim, Path(stream_id): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::GetStream, Method::GET, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let body = {
        let state = lock(&sim.state);
        state.stream(&stream_id).map(|s| {
            let reported = if call.fault == Some(FaultKind::WrongId) {
                format!("{stream_id}-other")
            } else {
                stream_id.clone()
            };
            s.to_json(&reported)
        })
    };
    let response = match body {
        Some(stream) => reply(StatusCode::OK, json!({"data": {"stream": stream}})),
        None => error_body(StatusCode::NOT_FOUND, "stream not found"),
    };
    finish(&call, response)
}

async fn dataset(AxState(sim): Sim, Path(stream_id): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::Dataset, Method::POST, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (limit, offset) = match paging(&req.uri, 100) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    if limit == 0 || limit > 1000 {
        return error_body(StatusCode::UNPROCESSABLE_ENTITY, "limit must be within 1..=1000");
    }
    let rows: Option<(usize, Vec<RowDef>, Option<String>)> = {
        let state = lock(&sim.state);
        state.stream(&stream_id).map(|s| {
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(s.rows.len());
            let end = start
                .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
                .min(s.rows.len());
            let previous = start.checked_sub(1).map(|i| s.rows[i].data_id.clone());
            (s.rows.len(), s.rows[start..end].to_vec(), previous)
        })
    };
    let Some((total, mut page, previous)) = rows else {
        return error_body(StatusCode::NOT_FOUND, "stream not found");
    };
    let (mut total, mut offset_out, mut limit_out) = (total as u64, offset, limit);
    match call.fault {
        Some(FaultKind::ChangeTotal) => total += 1,
        Some(FaultKind::WrongOffset) => offset_out += 1,
        Some(FaultKind::WrongLimit) => limit_out += 1,
        Some(FaultKind::DuplicateIds) => {
            if let Some(prev) = previous {
                if let Some(first) = page.first_mut() {
                    first.data_id = prev;
                }
            } else if page.len() >= 2 {
                let first = page[0].clone();
                if let Some(last) = page.last_mut() {
                    *last = first;
                }
            }
        }
        _ => {}
    }
    let mut count = page.len();
    if call.fault == Some(FaultKind::WrongCount) {
        count += 1;
    }
    let mut body = json!({
        "total": total,
        "offset": offset_out,
        "limit": limit_out,
        "count": count,
        "data_ids": page.iter().map(|r| r.data_id.clone()).collect::<Vec<_>>(),
    });
    if sim.dataset_items {
        body["items"] = page
            .iter()
            .map(|r| json!({"data_id": r.data_id, "tags": r.tags}))
            .collect();
    }
    finish(&call, reply(StatusCode::OK, body))
}

fn parse_ref(harness: &str) -> Option<RefDef> {
    let (k, v) = harness.split_once('@')?;
    Some(RefDef::new(k, v))
}

fn validate_launch(body: &Value) -> std::result::Result<LaunchRequest, String> {
    let obj = body.as_object().ok_or("body must be a JSON object")?;
    for field in ["data_id", "model_name", "base_url", "api_key"] {
        match obj.get(field) {
            Some(Value::String(s)) if !s.is_empty() => {}
            _ => return Err(format!("{field} must be a non-empty string")),
        }
    }
    if let Some(envs) = obj.get("envs") {
        let map = envs.as_object().ok_or("envs must be an object")?;
        if let Some((k, _)) = map.iter().find(|(k, v)| k.is_empty() || !v.is_string()) {
            return Err(format!("envs.{k} must be a string"));
        }
    }
    serde_json::from_value(body.clone()).map_err(|e| format!("invalid launch request: {e}"))
}

async fn launch_one_task(
    AxState(sim): Sim,
    Path(stream_id): Path<String>,
    req: Req,
    bytes: Bytes,
) -> Response {
    let body = parse_body(&bytes);
    let call = match begin(&sim, Endpoint::LaunchOneTask, Method::POST, &req, body.clone()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let request = match validate_launch(&body.unwrap_or(Value::Null)) {
        Ok(r) => r,
        Err(message) => return error_body(StatusCode::UNPROCESSABLE_ENTITY, &message),
    };
    let idempotency_key = req
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let gateway_url = format!("{}/api", sim.base_url);
    let started = {
        let mut state = lock(&sim.state);
        if let Some(existing) = idempotency_key
            .as_ref()
            .and_then(|k| state.idempotency.get(k).cloned())
        {
            state.counters.idempotent_replays += 1;
            let envelope = state.tasks.get_mut(&existing).map(TaskState::poll);
            drop(state);
            sim.bump();
            let response = reply(StatusCode::OK, envelope.unwrap_or(Value::Null));
            return finish(&call, response);
        }
        let Some(stream) = state.stream(&stream_id) else {
            return error_body(StatusCode::NOT_FOUND, "stream not found");
        };
        if stream.def.status.as_deref() != Some("ACTIVE") {
            return error_body(StatusCode::CONFLICT, "stream is not ACTIVE");
        }
        let Some(row) = stream.rows.iter().find(|r| r.data_id == request.data_id) else {
            return error_body(StatusCode::NOT_FOUND, "data_id is not in the stream's dataset");
        };
        let tags = row.tags.clone();
        let task_family = crate::tasks::TaskFamily::from_tags(&tags).or(stream.def.task_family);
        let harness = request.harness.clone().or_else(|| {
            stream
                .def
                .default_harness_ref
                .as_ref()
                .map(|h| format!("{}@{}", h.key, h.version))
        });
        let reward_ref = stream.def.default_reward_ref.clone();
        if request.base_url.trim_end_matches('/') == gateway_url {
            if sim.llm_api_key.as_ref().is_some_and(|k| *k != request.api_key) {
                return error_body(StatusCode::UNAUTHORIZED, "invalid LLM gateway key");
            }
            match state.routes.get_mut(&request.model_name) {
                Some(route) => route.last_touch = Instant::now(),
                None => {
                    return error_body(
                        StatusCode::BAD_REQUEST,
                        "model_name is not a registered LLM route",
                    );
                }
            }
        }
        let task_id = format!("{}{}", sim.task_id_prefix, state.next_task);
        state.next_task += 1;
        let (status_tx, status_rx) = watch::channel("PENDING".to_string());
        let ctx = HarnessContext {
            task_id: task_id.clone(),
            stream_id: stream_id.clone(),
            request: request.clone(),
            harness: harness.clone(),
            tags,
            task_family,
            gateway_url,
            status: status_tx,
        };
        let run = sim.harnesses.select(harness.as_deref()).start(ctx);
        let placeholder_score = match run.reply {
            LaunchReply::Pending { placeholder_score } => placeholder_score,
            LaunchReply::Final => None,
        };
        let (done_tx, done_rx) = oneshot::channel::<()>();
        let shared = sim.clone();
        let id = task_id.clone();
        let outcome = run.outcome;
        let handle = tokio::spawn(async move {
            let outcome = outcome.await;
            {
                let mut state = lock(&shared.state);
                if let Some(task) = state.tasks.get_mut(&id) {
                    task.progress = outcome.progress.iter().cloned().collect::<VecDeque<_>>();
                    task.outcome = Some(outcome);
                    task.abort = None;
                }
            }
            shared.bump();
            let _ = done_tx.send(());
        });
        state.tasks.insert(
            task_id.clone(),
            TaskState {
                task_id: task_id.clone(),
                stream_id: stream_id.clone(),
                harness_ref: harness.as_deref().and_then(parse_ref),
                reward_ref,
                status: status_rx,
                outcome: None,
                progress: VecDeque::new(),
                abort: Some(handle.abort_handle()),
                placeholder_score,
            },
        );
        if let Some(s) = state.stream_mut(&stream_id) {
            s.launched.push(task_id.clone());
        }
        if let Some(k) = idempotency_key {
            state.idempotency.insert(k, task_id.clone());
        }
        state.counters.launches += 1;
        let who = request
            .session_id
            .clone()
            .unwrap_or_else(|| format!("data:{}", request.data_id));
        *state.counters.launches_by_session.entry(who).or_default() += 1;
        (task_id, run.reply, done_rx)
    };
    sim.bump();
    let (task_id, launch_reply, done_rx) = started;
    let response = match launch_reply {
        LaunchReply::Final => {
            let _ = done_rx.await;
            let envelope = {
                let mut state = lock(&sim.state);
                state.tasks.get_mut(&task_id).map(|t| {
                    t.progress.clear();
                    t.poll()
                })
            };
            reply(StatusCode::OK, envelope.unwrap_or(Value::Null))
        }
        LaunchReply::Pending { .. } => {
            let envelope = lock(&sim.state).tasks.get_mut(&task_id).map(|t| {
                let mut e = json!({"task_id": t.task_id, "status": "PENDING"});
                if let Some(s) = t.placeholder_score {
                    e["score"] = json!(s);
                }
                e
            });
            reply(StatusCode::ACCEPTED, envelope.unwrap_or(Value::Null))
        }
    };
    finish(&call, response)
}

async fn task_result(AxState(sim): Sim, Path(task_id): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::TaskResult, Method::GET, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let envelope = lock(&sim.state).tasks.get_mut(&task_id).map(TaskState::poll);
    sim.bump();
    let response = match envelope {
        Some(mut e) => {
            if call.fault == Some(FaultKind::WrongId)
                && let Some(obj) = e.as_object_mut()
            {
                obj.insert("task_id".into(), json!(format!("{task_id}-other")));
            }
            reply(StatusCode::OK, e)
        }
        None => error_body(StatusCode::NOT_FOUND, "task not found"),
    };
    finish(&call, response)
}

async fn cancel_task(AxState(sim): Sim, Path(task_id): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::CancelTask, Method::POST, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    match sim.cancel_endpoint {
        CancelEndpoint::Enabled => {}
        CancelEndpoint::NotFound => return error_body(StatusCode::NOT_FOUND, "not found"),
        CancelEndpoint::MethodNotAllowed => {
            return error_body(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
        }
    }
    let response = {
        let mut state = lock(&sim.state);
        let result = state.tasks.get_mut(&task_id).map(|task| {
            let was_running = task.outcome.is_none();
            if let Some(abort) = task.abort.take() {
                abort.abort();
            }
            if was_running {
                task.outcome = Some(crate::harness::HarnessOutcome {
                    status: "CANCELLED".to_string(),
                    score: None,
                    raw: Value::Null,
                    artifacts_uri: None,
                    trace_id: None,
                    computed_at: None,
                    progress: Vec::new(),
                    envelope: crate::harness::Envelope::Plain,
                });
                task.progress.clear();
            }
            (was_running, task.current_status())
        });
        match result {
            Some((was_running, status)) => {
                if was_running {
                    state.counters.cancels += 1;
                }
                reply(StatusCode::OK, json!({"task_id": task_id, "status": status}))
            }
            None => error_body(StatusCode::NOT_FOUND, "task not found"),
        }
    };
    sim.bump();
    finish(&call, response)
}

async fn stream_tasks(AxState(sim): Sim, Path(stream_id): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::StreamTasks, Method::GET, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let (limit, offset) = match paging(&req.uri, 20) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let items = {
        let state = lock(&sim.state);
        let Some(stream) = state.stream(&stream_id) else {
            return error_body(StatusCode::NOT_FOUND, "stream not found");
        };
        let launched = stream.launched.iter().rev().filter_map(|id| {
            let t = state.tasks.get(id)?;
            Some(json!({"task": {
                "task_id": t.task_id,
                "stream_id": t.stream_id,
                "status": t.current_status(),
                "harness_ref": t.harness_ref,
                "reward_ref": t.reward_ref,
            }}))
        });
        let history = stream.history().iter().map(|h| {
            json!({"task": {
                "status": h.status,
                "harness_ref": h.harness_ref,
                "reward_ref": h.reward_ref,
            }})
        });
        launched
            .chain(history)
            .skip(usize::try_from(offset).unwrap_or(usize::MAX))
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .collect::<Vec<_>>()
    };
    finish(&call, reply(StatusCode::OK, json!({"data": {"items": items}})))
}

async fn harness_version(
    AxState(sim): Sim,
    Path((key, version)): Path<(String, String)>,
    req: Req,
) -> Response {
    let call = match begin(&sim, Endpoint::HarnessVersion, Method::GET, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let status = lock(&sim.state)
        .harness_versions
        .get(&(key.clone(), version.clone()))
        .cloned();
    let response = match status {
        Some(status) => reply(
            StatusCode::OK,
            json!({"data": {"key": key, "version": version, "status": status}}),
        ),
        None => error_body(StatusCode::NOT_FOUND, "harness version not found"),
    };
    finish(&call, response)
}

fn validate_registration(body: &Value) -> std::result::Result<(String, String), String> {
    let obj = body.as_object().ok_or("body must be a JSON object")?;
    let name = match obj.get("model_name") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        _ => return Err("model_name must be a non-empty string".into()),
    };
    let endpoints = obj
        .get("endpoints")
        .and_then(Value::as_array)
        .filter(|e| !e.is_empty())
        .ok_or("endpoints must be a non-empty list")?;
    for (i, e) in endpoints.iter().enumerate() {
        for field in ["endpoint_id", "upstream_model", "base_url", "api_key"] {
            match e.get(field) {
                Some(Value::String(s)) if !s.is_empty() => {}
                _ => return Err(format!("endpoints[{i}].{field} must be a non-empty string")),
            }
        }
        let protos = e
            .get("inbound_protos")
            .and_then(Value::as_array)
            .filter(|p| !p.is_empty() && p.iter().all(Value::is_string))
            .ok_or(format!(
                "endpoints[{i}].inbound_protos must be a non-empty list of strings"
            ))?;
        if let Some(p) = protos
            .iter()
            .filter_map(Value::as_str)
            .find(|p| !["chat", "anthropic", "responses"].contains(p))
        {
            return Err(format!("endpoints[{i}].inbound_protos has unknown {p:?}"));
        }
    }
    let deployment = obj
        .get("metadata")
        .and_then(|m| m.get("deployment_id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Ok((name, deployment))
}

fn public_route(info: &RouteInfo, name: &str) -> Value {
    let mut payload = info.payload.clone();
    if let Some(endpoints) = payload.get_mut("endpoints").and_then(Value::as_array_mut) {
        for e in endpoints {
            if let Some(obj) = e.as_object_mut() {
                obj.remove("api_key");
            }
        }
    }
    payload["model_name"] = json!(name);
    payload
}

async fn register_model(AxState(sim): Sim, req: Req, bytes: Bytes) -> Response {
    let body = parse_body(&bytes);
    let call = match begin(&sim, Endpoint::RegisterModel, Method::POST, &req, body.clone()).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let body = body.unwrap_or(Value::Null);
    let (name, deployment_id) = match validate_registration(&body) {
        Ok(v) => v,
        Err(message) => return error_body(StatusCode::UNPROCESSABLE_ENTITY, &message),
    };
    let response = {
        let mut state = lock(&sim.state);
        if state.routes.contains_key(&name) {
            error_body(StatusCode::CONFLICT, "model_name already exists")
        } else {
            let count = state
                .counters
                .registrations_by_name
                .entry(name.clone())
                .or_default();
            *count += 1;
            let info = RouteInfo {
                model_name: name.clone(),
                deployment_id,
                payload: body,
                registrations: *count,
            };
            state.routes.insert(
                name.clone(),
                RouteState {
                    info: info.clone(),
                    last_touch: Instant::now(),
                },
            );
            state.counters.registrations += 1;
            state.counters.live_routes = state.routes.len();
            let reported = if call.fault == Some(FaultKind::WrongId) {
                format!("{name}-other")
            } else {
                name.clone()
            };
            reply(StatusCode::CREATED, public_route(&info, &reported))
        }
    };
    sim.bump();
    finish(&call, response)
}

/// Shared by E7 and E11: applies a GC fault, touches the route and renders it.
fn touch_route(sim: &Shared, call: &Call, name: &str) -> Option<Value> {
    let mut state = lock(&sim.state);
    if call.fault == Some(FaultKind::GcRoute) {
        state.remove_route(name, true);
    }
    let route = state.routes.get_mut(name)?;
    route.last_touch = Instant::now();
    let reported = if call.fault == Some(FaultKind::WrongId) {
        format!("{name}-other")
    } else {
        name.to_string()
    };
    Some(public_route(&route.info, &reported))
}

async fn get_model(AxState(sim): Sim, Path(name): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::GetModel, Method::GET, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let response = match touch_route(&sim, &call, &name) {
        Some(route) => reply(StatusCode::OK, json!({"data": route})),
        None => error_body(StatusCode::NOT_FOUND, "model not found"),
    };
    sim.bump();
    finish(&call, response)
}

async fn renew_model(AxState(sim): Sim, Path(name): Path<String>, req: Req, bytes: Bytes) -> Response {
    let body = parse_body(&bytes);
    let call = match begin(&sim, Endpoint::RenewModel, Method::PATCH, &req, body).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let response = match touch_route(&sim, &call, &name) {
        Some(route) => reply(StatusCode::OK, route),
        None => error_body(StatusCode::NOT_FOUND, "model not found"),
    };
    sim.bump();
    finish(&call, response)
}

async fn delete_model(AxState(sim): Sim, Path(name): Path<String>, req: Req) -> Response {
    let call = match begin(&sim, Endpoint::DeleteModel, Method::DELETE, &req, None).await {
        Ok(c) => c,
        Err(r) => return r,
    };
    let removed = lock(&sim.state).remove_route(&name, false);
    sim.bump();
    let response = if removed {
        StatusCode::NO_CONTENT.into_response()
    } else {
        error_body(StatusCode::NOT_FOUND, "model not found")
    };
    finish(&call, response)
}
