//! Tasks on the control plane: launch (E4), poll (E5) and cancel.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};
use tokio::sync::oneshot;

use super::{Answer, reply};
use crate::admission::{RequestHead, admit, error_body, finish, hold, parse_body};
use crate::arena::Arena;
use crate::fault::{Endpoint, FaultKind};
use crate::harness::{LaunchReply, LaunchRequest, lock};
use crate::state::{LaunchRefused, LaunchSettings, Launched, TaskState};
use crate::world::CancelEndpoint;

/// Checks a launch body and reads it.
fn validate_launch(body: &Value) -> Result<LaunchRequest, String> {
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

/// How a refused launch is answered.
fn refusal(why: LaunchRefused) -> axum::response::Response {
    let (status, message) = match why {
        LaunchRefused::UnknownStream => (StatusCode::NOT_FOUND, "stream not found"),
        LaunchRefused::StreamNotActive => (StatusCode::CONFLICT, "stream is not ACTIVE"),
        LaunchRefused::UnknownRow => (StatusCode::NOT_FOUND, "data_id is not in the stream's dataset"),
        LaunchRefused::WrongGatewayKey => (StatusCode::UNAUTHORIZED, "invalid LLM gateway key"),
        LaunchRefused::UnknownRoute => (
            StatusCode::BAD_REQUEST,
            "model_name is not a registered LLM route",
        ),
    };
    error_body(status, message)
}

pub(super) async fn launch_one_task(
    State(arena): State<Arc<Arena>>,
    Path(stream_id): Path<String>,
    req: RequestHead,
    bytes: Bytes,
) -> Answer {
    let body = parse_body(&bytes);
    let admitted = admit(&arena, Endpoint::LaunchOneTask, Method::POST, &req, body.clone()).await?;
    let request = validate_launch(&body.unwrap_or(Value::Null))
        .map_err(|message| error_body(StatusCode::UNPROCESSABLE_ENTITY, &message))?;
    let gateway_url = arena.gateway_url();
    let settings = LaunchSettings {
        task_id_prefix: &arena.task_id_prefix,
        gateway_url: &gateway_url,
        llm_api_key: arena.llm_api_key.as_deref(),
    };
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let launched = lock(&arena.state).launch(&stream_id, &request, req.idempotency_key(), &settings, |ctx| {
        let (reply, abort) = arena.start_task(ctx, done_tx);
        (reply, Some(abort))
    });
    let (task_id, launch_reply) = match launched.map_err(refusal)? {
        Launched::Replayed(envelope) => {
            arena.bump();
            return Ok(finish(&admitted, reply(StatusCode::OK, envelope)));
        }
        Launched::Started { task_id, reply } => (task_id, reply),
    };
    arena.bump();
    hold(&arena, &admitted).await;
    let response = match launch_reply {
        LaunchReply::Final => {
            let _ = done_rx.await;
            let envelope = lock(&arena.state)
                .tasks
                .get_mut(&task_id)
                .map(TaskState::final_envelope);
            reply(StatusCode::OK, envelope.unwrap_or(Value::Null))
        }
        LaunchReply::Pending { .. } => {
            let envelope = lock(&arena.state)
                .tasks
                .get(&task_id)
                .map(TaskState::pending_envelope);
            reply(StatusCode::ACCEPTED, envelope.unwrap_or(Value::Null))
        }
    };
    Ok(finish(&admitted, response))
}

pub(super) async fn task_result(
    State(arena): State<Arc<Arena>>,
    Path(task_id): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::TaskResult, Method::GET, &req, None).await?;
    let envelope = lock(&arena.state).tasks.get_mut(&task_id).map(TaskState::poll);
    arena.bump();
    let response = match envelope {
        Some(mut e) => {
            if admitted.fault == Some(FaultKind::WrongId)
                && let Some(obj) = e.as_object_mut()
            {
                obj.insert("task_id".into(), json!(format!("{task_id}-other")));
            }
            reply(StatusCode::OK, e)
        }
        None => error_body(StatusCode::NOT_FOUND, "task not found"),
    };
    Ok(finish(&admitted, response))
}

pub(super) async fn cancel_task(
    State(arena): State<Arc<Arena>>,
    Path(task_id): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::CancelTask, Method::POST, &req, None).await?;
    match arena.cancel_endpoint {
        CancelEndpoint::Enabled => {}
        CancelEndpoint::NotFound => return Err(error_body(StatusCode::NOT_FOUND, "not found")),
        CancelEndpoint::MethodNotAllowed => {
            return Err(error_body(StatusCode::METHOD_NOT_ALLOWED, "method not allowed"));
        }
    }
    let cancelled = lock(&arena.state).cancel(&task_id);
    let response = match cancelled {
        Some(status) => reply(StatusCode::OK, json!({"task_id": task_id, "status": status})),
        None => error_body(StatusCode::NOT_FOUND, "task not found"),
    };
    arena.bump();
    Ok(finish(&admitted, response))
}
