//! LLM routes on the control plane: registration (E6), lookup (E7), deletion (E8) and renewal (E11).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::{Answer, reply, reported_id};
use crate::admission::{Admitted, RequestHead, admit, error_body, finish, parse_body};
use crate::arena::Arena;
use crate::fault::{Endpoint, FaultKind};
use crate::harness::lock;
use crate::state::RouteInfo;

/// Checks a registration body; answers the model name and `metadata.deployment_id`.
fn validate_registration(body: &Value) -> Result<(String, String), String> {
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

/// A route as the control plane shows it: the registration without the upstream keys, under `name`.
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

pub(super) async fn register_model(
    State(arena): State<Arc<Arena>>,
    req: RequestHead,
    bytes: Bytes,
) -> Answer {
    let body = parse_body(&bytes);
    let admitted = admit(&arena, Endpoint::RegisterModel, Method::POST, &req, body.clone()).await?;
    let body = body.unwrap_or(Value::Null);
    let (name, deployment_id) = validate_registration(&body)
        .map_err(|message| error_body(StatusCode::UNPROCESSABLE_ENTITY, &message))?;
    // The upstream URLs (never their keys) go to the log: where Arena's harnesses will send this route's calls,
    // which a test of a run on other hosts reads back.
    let base_urls: Vec<String> = body["endpoints"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["base_url"].as_str().map(str::to_string))
        .collect();
    tracing::info!(model_name = %name, base_urls = ?base_urls, "route registration");
    let registered = lock(&arena.state).register_route(&name, deployment_id, body);
    let response = match registered {
        Some(info) => reply(
            StatusCode::CREATED,
            public_route(
                &info,
                &reported_id(&name, admitted.fault == Some(FaultKind::WrongId)),
            ),
        ),
        None => error_body(StatusCode::CONFLICT, "model_name already exists"),
    };
    arena.bump();
    Ok(finish(&admitted, response))
}

/// Shared by E7 and E11: applies a GC fault, touches the route and renders it.
fn touch_route(arena: &Arena, admitted: &Admitted, name: &str) -> Option<Value> {
    let mut state = lock(&arena.state);
    if admitted.fault == Some(FaultKind::GcRoute) {
        state.remove_route(name, true);
    }
    let route = state.routes.get_mut(name)?;
    route.last_touch = std::time::Instant::now();
    let reported = reported_id(name, admitted.fault == Some(FaultKind::WrongId));
    Some(public_route(&route.info, &reported))
}

pub(super) async fn get_model(
    State(arena): State<Arc<Arena>>,
    Path(name): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::GetModel, Method::GET, &req, None).await?;
    let response = match touch_route(&arena, &admitted, &name) {
        Some(route) => reply(StatusCode::OK, json!({"data": route})),
        None => error_body(StatusCode::NOT_FOUND, "model not found"),
    };
    arena.bump();
    Ok(finish(&admitted, response))
}

pub(super) async fn renew_model(
    State(arena): State<Arc<Arena>>,
    Path(name): Path<String>,
    req: RequestHead,
    bytes: Bytes,
) -> Answer {
    let body = parse_body(&bytes);
    let admitted = admit(&arena, Endpoint::RenewModel, Method::PATCH, &req, body).await?;
    let response = match touch_route(&arena, &admitted, &name) {
        Some(route) => reply(StatusCode::OK, route),
        None => error_body(StatusCode::NOT_FOUND, "model not found"),
    };
    arena.bump();
    Ok(finish(&admitted, response))
}

pub(super) async fn delete_model(
    State(arena): State<Arc<Arena>>,
    Path(name): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::DeleteModel, Method::DELETE, &req, None).await?;
    let removed = lock(&arena.state).remove_route(&name, false);
    arena.bump();
    let response = if removed {
        StatusCode::NO_CONTENT.into_response()
    } else {
        error_body(StatusCode::NOT_FOUND, "model not found")
    };
    Ok(finish(&admitted, response))
}
