//! The wire protocols served on the generation core, and what they share: reading a JSON body field by
//! field with clear errors, and turning messages into the core's normalised form.
//!
//! Every generation handler goes through [`prepare_off_thread`]: the key is checked and the body read on
//! the async threads, then everything that costs CPU in proportion to the body (parsing it, rendering the
//! chat template, tokenising, admitting the generation) runs on the bounded pool of [`crate::pool`],
//! unless the body is small enough that the hand-off would cost more than the work.

pub(crate) mod anthropic;
pub(crate) mod bounds;
pub(crate) mod chat;
pub(crate) mod responses;

use std::sync::Arc;

use axum::body::Body;
use axum::http::HeaderMap;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::admission::tree_estimate;
use crate::error::ApiError;
use crate::messages::normalize_messages;
use crate::state::ProxyState;

/// Checks the session key, reads the body, then parses it as a JSON object and hands it to `work` on the
/// preparation pool (a full pool answers 503 at once, before the body is parsed).
pub(crate) async fn prepare_off_thread<T, F>(
    state: &ProxyState,
    headers: &HeaderMap,
    body: Body,
    work: F,
) -> Result<T, ApiError>
where
    T: Send + 'static,
    F: FnOnce(&ProxyState, Arc<str>, Map<String, Value>) -> Result<T, ApiError> + Send + 'static,
{
    let session = session_of(state, headers)?;
    json_content_type(headers)?;
    // The session's place and bytes are claimed before a byte of the body is read, and held until the
    // request is prepared (its generation admitted, or refused).
    let mut claim = state.claim(&session)?;
    let body = state.read_claimed_body(body, &mut claim).await?;
    let owned = state.clone();
    // A small body is prepared in well under a millisecond, less than the hand-off to a thread costs; its
    // work stays on the async thread, between two awaits. A small Responses body that continues a stored
    // conversation (`previous_response_id`) is not small work: the conversation it rebuilds and renders
    // may be as long as the context window, so it goes to the pool.
    if body.len() < INLINE_BODY_BYTES {
        let map = parse_object(&body)?;
        drop(body);
        if !map.contains_key(CONTINUES) {
            return work(state, session, map);
        }
        return state
            .shared()
            .pool
            .run(move || {
                let prepared = work(&owned, session, map);
                drop(claim);
                prepared
            })
            .await;
    }
    state
        .shared()
        .pool
        .run(move || {
            // A JSON tree takes up to dozens of times its text (`[0,0,...]` 16x): it is reserved before
            // it is built.
            claim.reserve(tree_estimate(&body) - body.len(), "the parsed request")?;
            let map = parse_object(&body)?;
            // The body's bytes are no longer needed once parsed; free them before the long part.
            drop(body);
            let prepared = work(&owned, session, map);
            drop(claim);
            prepared
        })
        .await
}

/// The Responses field that continues a stored conversation.
const CONTINUES: &str = "previous_response_id";

/// Bodies below this many bytes are prepared on the async thread that read them (see
/// [`prepare_off_thread`]); larger ones on the pool.
pub(crate) const INLINE_BODY_BYTES: usize = 8 * 1024;

/// A `Content-Type` that is not JSON is 422 (as FastAPI answers); none at all is taken as JSON.
fn json_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    if let Some(ct) = headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        && !ct.to_ascii_lowercase().contains("json")
    {
        return Err(ApiError::unprocessable(format!(
            "Content-Type must be application/json, got {ct:?}"
        )));
    }
    Ok(())
}

/// Parses a JSON object body; a body that is not JSON, or not an object, is 422 (as FastAPI answers).
pub(crate) fn parse_object(body: &[u8]) -> Result<Map<String, Value>, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(_) => Err(ApiError::unprocessable("the request body must be a JSON object")),
        Err(e) => Err(ApiError::unprocessable(format!(
            "the request body is not valid JSON: {e}"
        ))),
    }
}

/// Takes field `name` out of `map` as a `T`; null counts as absent.
pub(crate) fn take<T: DeserializeOwned>(
    map: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<T>, ApiError> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|e| ApiError::invalid(format!("{name} is invalid: {e}")).with_param(name)),
    }
}

/// Takes field `name` out of `map` as it was parsed, moved rather than rebuilt (`take::<Value>` would
/// build a second tree of it); null counts as absent.
pub(crate) fn take_json(map: &mut Map<String, Value>, name: &str) -> Result<Option<Value>, ApiError> {
    Ok(map.remove(name).filter(|v| !v.is_null()))
}

/// Takes field `name` out of `map` as a list of JSON values, moved rather than rebuilt; null counts as
/// absent.
pub(crate) fn take_list(map: &mut Map<String, Value>, name: &str) -> Result<Option<Vec<Value>>, ApiError> {
    match map.remove(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(other) => Err(ApiError::invalid(format!(
            "{name} is invalid: invalid type: {}, expected a sequence",
            kind(&other)
        ))
        .with_param(name)),
    }
}

/// How serde names a JSON value's type in its errors.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "sequence",
        Value::Object(_) => "map",
    }
}

/// Stop strings given as a string or a list of strings.
pub(crate) fn stop_strings(value: Option<Value>, name: &str) -> Result<Vec<String>, ApiError> {
    match value {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![s]),
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                _ => Err(
                    ApiError::invalid(format!("{name} must be a string or a list of strings"))
                        .with_param(name),
                ),
            })
            .collect(),
        Some(_) => {
            Err(ApiError::invalid(format!("{name} must be a string or a list of strings")).with_param(name))
        }
    }
}

const ROLES: [&str; 6] = ["system", "developer", "user", "assistant", "tool", "function"];

/// Checks roles, normalises content (reference section 6.5) and applies the configured preprocessors.
pub(crate) fn normalise(state: &ProxyState, mut messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    if let Err(index) = normalize_messages(&mut messages) {
        return Err(ApiError::invalid(format!("messages[{index}] must be an object")).with_param("messages"));
    }
    for (i, m) in messages.iter().enumerate() {
        match m.get("role").and_then(Value::as_str) {
            Some(role) if ROLES.contains(&role) => {}
            Some(role) => {
                return Err(ApiError::invalid(format!(
                    "messages[{i}].role {role:?} is not one of {ROLES:?}"
                ))
                .with_param("messages"));
            }
            None => {
                return Err(ApiError::invalid(format!("messages[{i}] has no role")).with_param("messages"));
            }
        }
    }
    for p in &state.shared().preprocessors {
        p.apply(&mut messages);
    }
    Ok(messages)
}

/// Warns about request fields this proxy ignores, unless they hold their default.
pub(crate) fn warn_ignored(map: &Map<String, Value>, endpoint: &str) {
    for (k, v) in map {
        let default = matches!(v, Value::Null | Value::Bool(false))
            || v.as_f64() == Some(0.0)
            || (k == "n" && v.as_u64() == Some(1))
            || v.as_array().is_some_and(Vec::is_empty)
            || v.as_object().is_some_and(Map::is_empty);
        if !default {
            tracing::debug!(
                endpoint,
                field = k.as_str(),
                "ignoring an unsupported request field"
            );
        }
    }
}

/// The session a generation request is bound to.
pub(crate) fn session_of(state: &ProxyState, headers: &HeaderMap) -> Result<Arc<str>, ApiError> {
    state.generation_session(headers)
}
