//! The OpenAPI control plane (E1-E11 and cancel): its routes and what its handlers share.
//!
//! Each endpoint group is one module: [`streams`] (streams, datasets, task histories, harness versions),
//! [`tasks`] (launch, poll, cancel) and [`llm_models`] (LLM route registration, lookup, renewal, deletion).

mod llm_models;
mod streams;
mod tasks;

use std::sync::Arc;

use axum::Router;
use axum::http::{StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::Value;

use crate::admission::error_body;
use crate::arena::Arena;

/// What a control-plane handler answers: `Err` for a refusal sent as it is, `Ok` for a handled answer.
type Answer = Result<Response, Response>;

/// The control plane's routes, to merge with the gateway's.
pub(crate) fn routes() -> Router<Arc<Arena>> {
    Router::new()
        .route("/openapi/v1/streams", get(streams::list_streams))
        .route("/openapi/v1/streams/{stream_id}", get(streams::get_stream))
        .route("/openapi/v1/streams/{stream_id}/dataset", post(streams::dataset))
        .route(
            "/openapi/v1/streams/{stream_id}/launch_one_task",
            post(tasks::launch_one_task),
        )
        .route(
            "/openapi/v1/streams/{stream_id}/tasks",
            get(streams::stream_tasks),
        )
        .route("/openapi/v1/tasks/{task_id}/result", get(tasks::task_result))
        .route("/openapi/v1/tasks/{task_id}/cancel", post(tasks::cancel_task))
        .route("/openapi/v1/llm/models", post(llm_models::register_model))
        .route(
            "/openapi/v1/llm/models/{model_name}",
            get(llm_models::get_model)
                .delete(llm_models::delete_model)
                .patch(llm_models::renew_model),
        )
        .route(
            "/openapi/v1/harnesses/{key}/versions/{version}",
            get(streams::harness_version),
        )
}

fn reply(status: StatusCode, body: Value) -> Response {
    (status, axum::Json(body)).into_response()
}

/// The id to report: the real one, or another when the request carries a wrong-id fault.
fn reported_id(id: &str, wrong: bool) -> String {
    if wrong {
        format!("{id}-other")
    } else {
        id.to_string()
    }
}

/// `limit` and `offset` from the query, with defaults; an unparsable value is a 422.
fn paging(uri: &Uri, default_limit: u64) -> Result<(u64, u64), Response> {
    let mut out = (default_limit, 0);
    for pair in uri.query().unwrap_or_default().split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let slot = match k {
            "limit" => &mut out.0,
            "offset" => &mut out.1,
            _ => continue,
        };
        *slot = v.parse().map_err(|_| {
            error_body(
                StatusCode::UNPROCESSABLE_ENTITY,
                &format!("{k} must be a non-negative integer"),
            )
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
