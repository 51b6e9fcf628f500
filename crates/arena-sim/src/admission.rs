//! How every request is admitted: recorded in the log and counters, its credentials checked, and the world's
//! fault rules applied before handling ([`admit`], [`admit_with`]) and after ([`finish`]).
//!
//! A handler returns `Result<Response, Response>`: admission is one `?`, an `Err` is answered as it is,
//! and only a handled `Ok` answer goes through [`finish`], so a lost response or a maintenance page replaces
//! what the endpoint would have said, never a refusal.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::Value;

use crate::arena::Arena;
use crate::fault::{Endpoint, FaultKind};
use crate::harness::lock;
use crate::state::RecordedRequest;
use stream_config::TRANSIENT_403_MARKER;

/// What handlers read from a request's head: the URI as sent, the headers and the client's address.
pub(crate) struct RequestHead {
    pub(crate) uri: Uri,
    pub(crate) headers: HeaderMap,
    pub(crate) peer: Option<SocketAddr>,
}

impl RequestHead {
    /// The `Idempotency-Key` header, if any.
    pub(crate) fn idempotency_key(&self) -> Option<String> {
        self.headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    }
}

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for RequestHead {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        _state: &S,
    ) -> Result<Self, Self::Rejection> {
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

/// An admitted request: the fault still to apply while or after handling it, if any. It counts the
/// request as in flight until dropped.
pub(crate) struct Admitted {
    pub(crate) fault: Option<FaultKind>,
    pub(crate) _in_flight: InFlight,
}

/// Counts one request of an endpoint as in flight while it lives.
pub(crate) struct InFlight {
    arena: Arc<Arena>,
    endpoint: Endpoint,
}

impl InFlight {
    fn enter(arena: &Arc<Arena>, endpoint: Endpoint) -> Self {
        {
            let mut state = lock(&arena.state);
            let counters = &mut state.counters;
            let now = counters.in_flight.entry(endpoint).or_default();
            *now += 1;
            let now = *now;
            let max = counters.max_in_flight.entry(endpoint).or_default();
            *max = (*max).max(now);
        }
        Self {
            arena: arena.clone(),
            endpoint,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(n) = lock(&self.arena.state).counters.in_flight.get_mut(&self.endpoint) {
            *n = n.saturating_sub(1);
        }
        self.arena.bump();
    }
}

/// Admits a control-plane request: records it, checks the bearer token and applies the faults due before
/// handling; a refusal is the answer to send.
pub(crate) async fn admit(
    arena: &Arc<Arena>,
    endpoint: Endpoint,
    method: Method,
    req: &RequestHead,
    body: Option<Value>,
) -> Result<Admitted, Response> {
    let authorized = req
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t == arena.token);
    let (fault, in_flight) = record(arena, endpoint, method, req, body, authorized);
    if !authorized {
        return Err(error_body(
            StatusCode::UNAUTHORIZED,
            "missing or invalid bearer token",
        ));
    }
    admit_with(fault, in_flight, error_body).await
}

/// Applies the faults due before handling: an injected status (answered by `refuse`, in the endpoint's
/// error format), the marker 403, or a delay; any other fault stays on the [`Admitted`] for later.
pub(crate) async fn admit_with(
    fault: Option<FaultKind>,
    in_flight: InFlight,
    refuse: impl FnOnce(StatusCode, &str) -> Response,
) -> Result<Admitted, Response> {
    match fault {
        Some(FaultKind::Status(code)) => {
            let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Err(refuse(status, "injected fault"))
        }
        Some(FaultKind::Marker403) => Err(marker_403()),
        Some(FaultKind::DelayMs(ms)) => {
            tokio::time::sleep(Duration::from_millis(ms)).await;
            Ok(Admitted {
                fault: None,
                _in_flight: in_flight,
            })
        }
        other => Ok(Admitted {
            fault: other,
            _in_flight: in_flight,
        }),
    }
}

/// Records one request (log, counters, route sweep) and decides its fault; only authorized requests can
/// be faulted. The returned guard counts the request as in flight.
pub(crate) fn record(
    arena: &Arc<Arena>,
    endpoint: Endpoint,
    method: Method,
    req: &RequestHead,
    body: Option<Value>,
    authorized: bool,
) -> (Option<FaultKind>, InFlight) {
    let fault = {
        let mut state = lock(&arena.state);
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
            path: req.uri.path().to_string(),
            query: req.uri.query().map(str::to_string),
            authorized,
            idempotency_key: req.idempotency_key(),
            body,
            fault: fault.as_ref().map(|f| format!("{f:?}")),
            peer: req.peer,
        });
        fault
    };
    let in_flight = InFlight::enter(arena, endpoint);
    arena.bump();
    (fault, in_flight)
}

/// Holds a handled answer while a `hold_ms` fault says so, counted in `Counters::held_answers` until the
/// hold ends or the client goes away (the handler is then dropped).
pub(crate) async fn hold(arena: &Arc<Arena>, admitted: &Admitted) {
    let Some(FaultKind::HoldMs(ms)) = admitted.fault else {
        return;
    };
    struct Held<'a>(&'a Arc<Arena>);
    impl Drop for Held<'_> {
        fn drop(&mut self) {
            let mut state = lock(&self.0.state);
            state.counters.held_answers = state.counters.held_answers.saturating_sub(1);
            drop(state);
            self.0.bump();
        }
    }
    lock(&arena.state).counters.held_answers += 1;
    arena.bump();
    let _held = Held(arena);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// Applies the faults due after handling to a handled answer: a lost response or a maintenance page.
pub(crate) fn finish(admitted: &Admitted, response: Response) -> Response {
    match admitted.fault {
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

/// The transient 403 of Arena's gateway, with its marker.
pub(crate) fn marker_403() -> Response {
    (
        StatusCode::FORBIDDEN,
        format!("<html><body>Access denied ({TRANSIENT_403_MARKER})</body></html>"),
    )
        .into_response()
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

/// The control plane's error body: `{"error": {"code", "message"}}`.
pub(crate) fn error_body(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({"error": {"code": status.as_u16(), "message": message}})),
    )
        .into_response()
}

/// A request body as JSON, or as a JSON string when it is not JSON (so the log still shows it).
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
