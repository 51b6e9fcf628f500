//! The LLM gateway at `{base}/api`: what harnesses call instead of a model provider.
//!
//! A request names a registered route in its body's `model`; the gateway checks the caller's LLM key
//! (`Authorization: Bearer` or `x-api-key`), finds the route's upstream endpoint that serves the caller's
//! protocol natively (`inbound_protos`: `chat`, `anthropic`, `responses`), and forwards the request there
//! with the upstream key (as both `Authorization: Bearer` and `x-api-key`) and every other end-to-end header
//! (session headers, `anthropic-version`, `anthropic-beta`, ...). The answer streams back as the upstream
//! writes it, so server-sent events arrive one by one.
//!
//! It does not translate between protocols: a route without an upstream for the caller's protocol is a 400
//! in the caller's error format, as is a body without `model`; an unknown (deleted or garbage-collected)
//! model is a 404. Faults from the world's rules apply as on the control plane.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, HeaderName, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use stream_config::LlmProtocol;

use crate::admission::{Admitted, RequestHead, admit_with, finish, parse_body, record};
use crate::arena::Arena;
use crate::fault::{Endpoint, FaultKind};
use crate::harness::lock;
use crate::state::GatewayCounters;

/// The largest request body the gateway accepts (Claude Code sends about 100 KB per turn).
const MAX_BODY: usize = 32 * 1024 * 1024;

/// What a gateway handler answers: `Err` for a refusal in the caller's protocol, `Ok` for what the
/// upstream said (or what a fault made of it).
type Answer = Result<Response, Response>;

/// The gateway's routes, to merge with the control plane's.
pub(crate) fn routes() -> Router<Arc<Arena>> {
    Router::new()
        .route("/api/v1/messages", post(messages))
        .route("/api/v1/messages/count_tokens", post(count_tokens))
        .route("/api/v1/chat/completions", post(chat))
        .route("/api/chat/completions", post(chat))
        .route("/api/v1/responses", post(responses))
        .route("/api/responses", post(responses))
        .layer(DefaultBodyLimit::max(MAX_BODY))
}

async fn messages(State(arena): State<Arc<Arena>>, req: RequestHead, bytes: Bytes) -> Answer {
    let call = GatewayCall::new(Endpoint::GatewayMessages, LlmProtocol::Anthropic);
    call.forward(arena, req, bytes).await
}

async fn count_tokens(State(arena): State<Arc<Arena>>, req: RequestHead, bytes: Bytes) -> Answer {
    let call = GatewayCall::new(Endpoint::GatewayCountTokens, LlmProtocol::Anthropic);
    call.forward(arena, req, bytes).await
}

async fn chat(State(arena): State<Arc<Arena>>, req: RequestHead, bytes: Bytes) -> Answer {
    let call = GatewayCall::new(Endpoint::GatewayChat, LlmProtocol::ChatCompletions);
    call.forward(arena, req, bytes).await
}

async fn responses(State(arena): State<Arc<Arena>>, req: RequestHead, bytes: Bytes) -> Answer {
    let call = GatewayCall::new(Endpoint::GatewayResponses, LlmProtocol::Responses);
    call.forward(arena, req, bytes).await
}

/// The `inbound_protos` label of a protocol.
pub(crate) fn inbound_label(protocol: LlmProtocol) -> &'static str {
    match protocol {
        LlmProtocol::Anthropic => "anthropic",
        LlmProtocol::Responses => "responses",
        LlmProtocol::ChatCompletions => "chat",
    }
}

/// Where and how a request goes upstream.
struct Upstream {
    url: String,
    api_key: String,
    model: String,
}

/// One gateway call: the endpoint it counts under and the caller's protocol, which its errors speak.
#[derive(Clone, Copy)]
struct GatewayCall {
    endpoint: Endpoint,
    protocol: LlmProtocol,
}

impl GatewayCall {
    fn new(endpoint: Endpoint, protocol: LlmProtocol) -> Self {
        Self { endpoint, protocol }
    }

    /// An error in the caller's protocol.
    fn error(self, status: StatusCode, message: &str) -> Response {
        error(self.protocol, status, message)
    }

    /// Counts on the caller protocol's gateway counters.
    fn count(self, arena: &Arena, f: impl FnOnce(&mut GatewayCounters)) {
        count(arena, self.protocol, f);
    }

    async fn forward(self, arena: Arc<Arena>, req: RequestHead, bytes: Bytes) -> Answer {
        let body = parse_body(&bytes);
        let admitted = self.admit(&arena, &req, body.clone()).await?;
        let model = body
            .as_ref()
            .and_then(|b| b.get("model"))
            .and_then(Value::as_str)
            .map(str::to_string);
        let Some(model) = model else {
            self.count(&arena, |c| c.bad_requests += 1);
            return Err(self.error(
                StatusCode::BAD_REQUEST,
                "the body must be a JSON object with a string `model`",
            ));
        };
        let upstream = resolve(&arena, &admitted, &model, self.protocol, &req)?;
        let outgoing = if upstream.model == model {
            bytes
        } else {
            let mut body = body.unwrap_or(Value::Null);
            body["model"] = json!(upstream.model);
            Bytes::from(body.to_string())
        };
        let headers = self.upstream_headers(&arena, &req.headers, &upstream.api_key)?;
        let sent = arena
            .http
            .post(&upstream.url)
            .headers(headers)
            .body(outgoing)
            .send()
            .await;
        let answer = sent.map_err(|e| {
            self.count(&arena, |c| c.upstream_errors += 1);
            tracing::warn!(model = %model, url = %upstream.url, error = %e, "gateway upstream unreachable");
            self.error(
                StatusCode::BAD_GATEWAY,
                &format!("the upstream of model {model} could not be reached"),
            )
        })?;
        self.count(&arena, |c| c.forwarded += 1);
        if matches!(admitted.fault, Some(FaultKind::Drop | FaultKind::NonJson)) {
            // The model got the request and answered; the caller gets a lost response or a maintenance page.
            drop(answer);
            return Ok(finish(&admitted, StatusCode::OK.into_response()));
        }
        Ok(stream_back(answer, admitted))
    }

    /// Records the request, checks the caller's LLM key and applies the faults due before forwarding.
    async fn admit(
        self,
        arena: &Arc<Arena>,
        req: &RequestHead,
        body: Option<Value>,
    ) -> Result<Admitted, Response> {
        let key = caller_key(&req.headers);
        let authorized = !key.is_empty() && arena.llm_api_key.as_ref().is_none_or(|k| *k == key);
        let (fault, in_flight) = record(arena, self.endpoint, Method::POST, req, body, authorized);
        self.count(arena, |c| c.requests += 1);
        if !authorized {
            self.count(arena, |c| c.unauthorized += 1);
            return Err(self.error(StatusCode::UNAUTHORIZED, "invalid or missing LLM API key"));
        }
        admit_with(fault, in_flight, |status, message| self.error(status, message)).await
    }

    /// The caller's end-to-end headers with the upstream key as both bearer and `x-api-key`.
    fn upstream_headers(
        self,
        arena: &Arena,
        caller: &HeaderMap,
        api_key: &str,
    ) -> Result<HeaderMap, Response> {
        let mut headers = end_to_end(caller);
        for (name, value) in [
            (header::AUTHORIZATION, format!("Bearer {api_key}")),
            (HeaderName::from_static("x-api-key"), api_key.to_string()),
        ] {
            let Ok(value) = value.parse() else {
                self.count(arena, |c| c.upstream_errors += 1);
                return Err(self.error(
                    StatusCode::BAD_GATEWAY,
                    "the route's upstream api_key is not a valid header value",
                ));
            };
            headers.insert(name, value);
        }
        Ok(headers)
    }
}

/// The upstream's answer, streamed back as it arrives, without its hop-by-hop headers.
fn stream_back(answer: reqwest::Response, admitted: Admitted) -> Response {
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers() {
        if !is_hop_by_hop(name) {
            response = response.header(name, value);
        }
    }
    // The admission moves into the body stream, so the request counts as in flight until the body is done.
    let stream = futures::StreamExt::map(answer.bytes_stream(), move |chunk| {
        let _in_flight = &admitted;
        chunk.map_err(std::io::Error::other)
    });
    response
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::BAD_GATEWAY.into_response())
}

/// Finds the route's endpoint for the caller's protocol, applying a route-collecting fault first.
fn resolve(
    arena: &Arena,
    admitted: &Admitted,
    model: &str,
    protocol: LlmProtocol,
    req: &RequestHead,
) -> Result<Upstream, Response> {
    let mut state = lock(&arena.state);
    if admitted.fault == Some(FaultKind::GcRoute) {
        state.remove_route(model, true);
    }
    let Some(route) = state.routes.get_mut(model) else {
        drop(state);
        count(arena, protocol, |c| c.unknown_model += 1);
        return Err(error(
            protocol,
            StatusCode::NOT_FOUND,
            &format!("model {model} is not a registered route"),
        ));
    };
    route.last_touch = Instant::now();
    let label = inbound_label(protocol);
    let endpoints = route
        .info
        .payload
        .get("endpoints")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let chosen = endpoints.iter().find(|e| {
        e.get("enabled").and_then(Value::as_bool) != Some(false)
            && e.get("inbound_protos")
                .and_then(Value::as_array)
                .is_some_and(|p| p.iter().any(|p| p.as_str() == Some(label)))
    });
    let Some(e) = chosen else {
        drop(state);
        count(arena, protocol, |c| c.unsupported_protocol += 1);
        let offered: Vec<&str> = endpoints
            .iter()
            .filter_map(|e| e.get("inbound_protos").and_then(Value::as_array))
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        return Err(error(
            protocol,
            StatusCode::BAD_REQUEST,
            &format!(
                "model {model} has no upstream that serves the {label} protocol natively (inbound_protos: \
                 [{}]); this gateway does not translate between protocols",
                offered.join(", ")
            ),
        ));
    };
    let text = |field: &str| {
        e.get(field)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let rest = req.uri.path().strip_prefix("/api").unwrap_or(req.uri.path());
    Ok(Upstream {
        url: upstream_url(&text("base_url"), rest, req.uri.query()),
        api_key: text("api_key"),
        model: Some(text("upstream_model"))
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| model.to_string()),
    })
}

/// The upstream URL: the route's base URL and the caller's path after `/api` (one `/v1` when both have
/// it), with the caller's query (`?beta=true`).
pub(crate) fn upstream_url(base: &str, rest: &str, query: Option<&str>) -> String {
    let base = base.trim_end_matches('/');
    let rest = if base.ends_with("/v1") {
        rest.strip_prefix("/v1").unwrap_or(rest)
    } else {
        rest
    };
    match query {
        Some(q) if !q.is_empty() => format!("{base}{rest}?{q}"),
        _ => format!("{base}{rest}"),
    }
}

/// The caller's key: a bearer token, else `x-api-key`.
fn caller_key(headers: &HeaderMap) -> String {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme
                .eq_ignore_ascii_case("bearer")
                .then(|| token.trim().to_string())
        })
        .filter(|t| !t.is_empty());
    bearer.unwrap_or_else(|| {
        headers
            .get("x-api-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .trim()
            .to_string()
    })
}

/// The headers that go upstream: every end-to-end header except the caller's credentials and the body's
/// framing (reqwest sets `content-length` for the body it sends).
pub(crate) fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named_by_connection: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|n| n.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::new();
    for (name, value) in headers {
        let n = name.as_str();
        if is_hop_by_hop(name)
            || matches!(n, "host" | "content-length" | "authorization" | "x-api-key")
            || named_by_connection.iter().any(|c| c == n)
        {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "proxy-connection"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
    )
}

fn count(arena: &Arena, protocol: LlmProtocol, f: impl FnOnce(&mut GatewayCounters)) {
    f(lock(&arena.state).counters.gateway.entry(protocol).or_default());
    arena.bump();
}

/// An error in the caller's protocol: Anthropic's `{"type":"error","error":{type,message}}` or OpenAI's
/// `{"error":{message,type,param,code}}`.
pub(crate) fn error(protocol: LlmProtocol, status: StatusCode, message: &str) -> Response {
    let body = match protocol {
        LlmProtocol::Anthropic => {
            let kind = match status.as_u16() {
                400 => "invalid_request_error",
                401 => "authentication_error",
                403 => "permission_error",
                404 => "not_found_error",
                413 => "request_too_large",
                429 => "rate_limit_error",
                529 => "overloaded_error",
                _ => "api_error",
            };
            json!({"type": "error", "error": {"type": kind, "message": message}})
        }
        LlmProtocol::ChatCompletions | LlmProtocol::Responses => {
            let (kind, code) = match status.as_u16() {
                400 => ("invalid_request_error", Value::Null),
                401 => ("invalid_request_error", json!("invalid_api_key")),
                404 => ("invalid_request_error", json!("model_not_found")),
                429 => ("rate_limit_error", json!("rate_limit_exceeded")),
                _ => ("server_error", Value::Null),
            };
            json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
        }
    };
    (status, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests;
