//! The control endpoints: health, metrics, capacity grants, and the session lifecycle (`start_session`,
//! `set_reward`, `end_session`, `export_trajectories`) of reference section 6.4, with this project's fixes
//! (random session ids, keys that stop at `end_session`, an export deadline, tombstones).
//!
//! Every request and reply body is a type of [`wire`], which clients use too.

pub mod wire;

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use secrecy::ExposeSecret;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::time::Instant;

use crate::error::{ApiError, ApiErrorKind};
use crate::export::{ExportOptions, ExportStyle, ExportedSession};
use crate::integrity;
use crate::metrics::Metrics;
use crate::state::{Caller, ProxyState, SessionRewards};
use wire::{
    EndSessionReply, EndSessionRequest, ExportRequest, GrantCapacityReply, GrantCapacityRequest, HealthReply,
    ModelCard, ModelList, SetRewardReply, SetRewardRequest, StartSessionReply, StartSessionRequest,
};

fn answer(result: Result<Response, ApiError>) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

/// Parses a control body; missing or mistyped fields are 422, as FastAPI answers.
fn body<T: for<'de> Deserialize<'de>>(bytes: &Bytes) -> Result<T, ApiError> {
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ApiError::unprocessable(format!("invalid request body: {e}")))
}

/// `GET /health`.
pub(crate) async fn health(State(state): State<ProxyState>) -> Response {
    let live = state.store().live_sessions();
    axum::Json(HealthReply {
        status: "ok".to_string(),
        initialized: true,
        model: state.model_name().to_string(),
        max_context_len: state.shared().engine.max_context_len() as u64,
        live_sessions: live as u64,
    })
    .into_response()
}

/// `GET /metrics`, OpenMetrics text format (which Prometheus scrapes).
pub(crate) async fn metrics(State(state): State<ProxyState>) -> Response {
    let text = state.shared().metrics.render(&state.gauges());
    let mut response = text.into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static(crate::metrics::CONTENT_TYPE),
    );
    response
}

/// `GET /v1/models`: the one model served.
pub(crate) async fn models(State(state): State<ProxyState>) -> Response {
    axum::Json(ModelList {
        object: "list".to_string(),
        data: vec![ModelCard {
            id: state.model_name().to_string(),
            object: "model".to_string(),
            created: 0,
            owned_by: "arena-rl".to_string(),
        }],
    })
    .into_response()
}

/// `POST /grant_capacity` (admin): capacity += `count` (default 1).
pub(crate) async fn grant_capacity(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    request: Body,
) -> Response {
    if let Err(e) = state.require_admin(&headers) {
        return e.into_response();
    }
    let bytes = match state.read_body(request).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    answer((|| {
        let grant: GrantCapacityRequest = body(&bytes)?;
        let capacity = state.store().grant(i64::from(grant.count.unwrap_or(1)));
        Ok(axum::Json(GrantCapacityReply { capacity }).into_response())
    })())
}

/// `POST /rl/start_session` (admin): `{task_id, api_key?, metadata?}` → `{session_id, api_key}`.
pub(crate) async fn start_session(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    request: Body,
) -> Response {
    if let Err(e) = state.require_admin(&headers) {
        return e.into_response();
    }
    let bytes = match state.read_body(request).await {
        Ok(bytes) => bytes,
        Err(e) => return e.into_response(),
    };
    answer((|| {
        let start: StartSessionRequest = body(&bytes)?;
        let metadata = match start.metadata {
            None | Some(Value::Null) => json!({}),
            Some(m @ Value::Object(_)) => m,
            Some(_) => return Err(ApiError::invalid("metadata must be an object").with_param("metadata")),
        };
        let key = start.api_key.filter(|k| !k.expose_secret().is_empty());
        if key
            .as_ref()
            .is_some_and(|k| crate::auth::secrets_equal(k, &state.shared().gateway_key))
        {
            return Err(ApiError::invalid("api_key must not be the gateway key").with_param("api_key"));
        }
        let selection = start.integrity.unwrap_or_default();
        let guard = integrity::session_guard(
            &state.shared().config.integrity,
            selection.profile.as_deref(),
            selection.base_commit.as_deref(),
        )
        .map_err(|m| ApiError::invalid(m).with_param("integrity.profile"))?;
        let mut store = state.store();
        let (id, key) = store.start(
            &start.task_id,
            key,
            &state.shared().config.admin_key,
            metadata,
            Instant::now(),
        )?;
        if let Ok(session) = store.get_mut(&id) {
            session.guard = guard;
        }
        drop(store);
        Metrics::add(&state.shared().metrics.sessions_started, 1);
        tracing::info!(session = &*id, "session started");
        Ok(axum::Json(StartSessionReply {
            session_id: id.to_string(),
            api_key: key,
        })
        .into_response())
    })())
}

/// The session an admin-or-session call targets: the caller's own session, or `session_id` for the admin.
fn target(caller: Caller, session_id: Option<String>) -> Result<String, ApiError> {
    match (caller, session_id) {
        (Caller::Session(own), None) => Ok(own.to_string()),
        (Caller::Session(own), Some(id)) if *own == *id => Ok(id),
        (Caller::Session(_), Some(_)) => Err(ApiError::new(
            ApiErrorKind::PermissionDenied,
            "a session key may only act on its own session",
        )),
        (Caller::Admin, Some(id)) => Ok(id),
        (Caller::Admin, None) => Err(ApiError::unprocessable(
            "session_id is required with the admin key",
        )),
    }
}

/// `POST /rl/set_reward`: with the session key until `end_session`, with the admin key (and `session_id`)
/// until export.
pub(crate) async fn set_reward(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    request: Body,
) -> Response {
    let (caller, bytes) = match caller_and_body(&state, &headers, request).await {
        Ok(read) => read,
        Err(e) => return e.into_response(),
    };
    answer((|| {
        let reward: SetRewardRequest = body(&bytes)?;
        if !reward.reward.is_finite() {
            return Err(ApiError::invalid("reward must be finite").with_param("reward"));
        }
        let keep = caller == Caller::Admin || state.shared().config.session_rewards == SessionRewards::Honour;
        let id = target(caller, reward.session_id)?;
        let mut store = state.store();
        let session = store.get_mut(&id)?;
        let set = session
            .trajectory
            .set_reward(reward.interaction_id.as_deref(), keep.then_some(reward.reward))
            .map_err(|m| ApiError::invalid(m).with_param("interaction_id"))?;
        if !keep {
            tracing::debug!(
                session = &*id,
                "not keeping a reward the session set with its own key"
            );
        }
        Ok(axum::Json(SetRewardReply {
            message: "success".to_string(),
            interaction_id: set,
        })
        .into_response())
    })())
}

/// `POST /rl/end_session`: ends the session (its key stops working) and reports its flags.
pub(crate) async fn end_session(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    request: Body,
) -> Response {
    let (caller, bytes) = match caller_and_body(&state, &headers, request).await {
        Ok(read) => read,
        Err(e) => return e.into_response(),
    };
    answer((|| {
        let end: EndSessionRequest = body(&bytes)?;
        let id = target(caller, end.session_id)?;
        let summary = state.store().end(&id, Instant::now())?;
        Metrics::add(&state.shared().metrics.sessions_ended, 1);
        Ok(axum::Json(EndSessionReply {
            message: "success".to_string(),
            session_id: summary.session_id.to_string(),
            interaction_count: summary.interaction_count,
            context_overflow: summary.context_overflow.is_some(),
            context_overflow_message: summary.context_overflow,
            system_error: summary.system_error.is_some(),
            system_error_message: summary.system_error,
            integrity_hits: summary.integrity_hits,
        })
        .into_response())
    })())
}

/// The caller of a session endpoint, then (only for a known caller) the body.
async fn caller_and_body(
    state: &ProxyState,
    headers: &HeaderMap,
    request: Body,
) -> Result<(Caller, Bytes), ApiError> {
    let caller = state.session_caller(headers)?;
    Ok((caller, state.read_body(request).await?))
}

/// `POST /export_trajectories` (admin): waits (with a deadline) for `end_session`, exports, and forgets
/// the session.
pub(crate) async fn export_trajectories(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    request: Body,
) -> Response {
    answer(export(&state, &headers, request).await)
}

async fn export(state: &ProxyState, headers: &HeaderMap, request: Body) -> Result<Response, ApiError> {
    state.require_admin(headers)?;
    let bytes = state.read_body(request).await?;
    let request: ExportRequest = body(&bytes)?;
    let _ = (request.supports_shared_tensor_references, request.is_eval);
    if !request.discount.is_finite() {
        return Err(ApiError::invalid("discount must be finite").with_param("discount"));
    }
    if request.final_reward.is_some_and(|r| !r.is_finite()) {
        return Err(ApiError::invalid("final_reward must be finite").with_param("final_reward"));
    }
    if let Some(r) = request.episode_reward {
        if request.style != ExportStyle::Concat {
            return Err(
                ApiError::invalid("Episode reward assignment requires concat export")
                    .with_param("episode_reward"),
            );
        }
        if !r.is_finite() {
            return Err(ApiError::invalid("Episode reward must be finite").with_param("episode_reward"));
        }
    }
    let wait = match request.wait_timeout_seconds {
        None => state.shared().config.export_wait_timeout,
        Some(s) if s.is_finite() && s >= 0.0 => Duration::from_secs_f64(s.min(86_400.0)),
        Some(_) => {
            return Err(
                ApiError::invalid("wait_timeout_seconds must be a non-negative number")
                    .with_param("wait_timeout_seconds"),
            );
        }
    };
    let id = request.session_id;
    let options = ExportOptions {
        style: request.style,
        discount: request.discount,
        drop_retry_orphans: request.drop_retry_orphans,
        final_reward: request.final_reward,
        episode_reward: request.episode_reward,
        max_amplification: state.shared().config.limits.max_export_amplification,
    };
    let mut ended = state.store().ended_watch(&id)?;
    if !*ended.borrow() {
        let waited = tokio::time::timeout(wait, ended.wait_for(|e| *e)).await;
        if waited.is_err() {
            return Err(ApiError::new(
                ApiErrorKind::Conflict,
                format!("session {id:?} did not end within {:.1}s", wait.as_secs_f64()),
            ));
        }
    }
    // The rewards are checked before the session is taken, so a refused export leaves it to a retry with
    // another discount or final reward.
    state
        .store()
        .get_mut(&id)?
        .trajectory
        .rewards(&id, &options)
        .map_err(|m| ApiError::invalid(m).with_param("discount"))?;
    let session = state.take_session(&id)?;
    let (trajectories, branches_dropped) = session
        .trajectory
        .export_counting(&session.id, &session.metadata, &options)
        .map_err(|m| ApiError::invalid(m).with_param("discount"))?;
    if branches_dropped > 0 {
        tracing::warn!(
            session = &*session.id,
            branches_dropped,
            "a concat export left out older branches past its token bound"
        );
    }
    Metrics::add(&state.shared().metrics.sessions_exported, 1);
    let exported = ExportedSession {
        session_id: session.id.to_string(),
        task_id: session.task_id.clone(),
        style: options.style,
        discount: options.discount,
        context_overflow: session.context_overflow.is_some(),
        system_error: session.system_error.is_some(),
        interaction_count: session.trajectory.len(),
        integrity_hits: session.integrity_hits.clone(),
        trajectories,
        branches_dropped,
    };
    Ok(axum::Json(exported).into_response())
}
