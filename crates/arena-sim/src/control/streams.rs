//! What preflight and the dataset download read: streams (E1, E2), dataset pages (E3), a stream's tasks
//! (E10) and harness versions (E9).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{Method, StatusCode};
use serde_json::{Value, json};

use super::{Answer, paging, query_str, reply, reported_id};
use crate::admission::{RequestHead, admit, error_body, finish};
use crate::arena::Arena;
use crate::fault::{Endpoint, FaultKind};
use crate::harness::lock;
use crate::world::RowDef;

pub(super) async fn list_streams(State(arena): State<Arc<Arena>>, req: RequestHead) -> Answer {
    let admitted = admit(&arena, Endpoint::ListStreams, Method::GET, &req, None).await?;
    let wanted = query_str(&req.uri, "status");
    let items: Vec<Value> = {
        let state = lock(&arena.state);
        state
            .streams
            .iter()
            .filter(|s| wanted.is_none() || s.def.status == wanted)
            .map(|s| s.to_json(&s.def.stream_id))
            .collect()
    };
    let total = items.len();
    Ok(finish(
        &admitted,
        reply(StatusCode::OK, json!({"items": items, "total": total})),
    ))
}

pub(super) async fn get_stream(
    State(arena): State<Arc<Arena>>,
    Path(stream_id): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::GetStream, Method::GET, &req, None).await?;
    let body = {
        let state = lock(&arena.state);
        state.stream(&stream_id).map(|s| {
            s.to_json(&reported_id(
                &stream_id,
                admitted.fault == Some(FaultKind::WrongId),
            ))
        })
    };
    let response = match body {
        Some(stream) => reply(StatusCode::OK, json!({"data": {"stream": stream}})),
        None => error_body(StatusCode::NOT_FOUND, "stream not found"),
    };
    Ok(finish(&admitted, response))
}

/// One dataset page as stored: the stream's row count, the page's rows, and the row before the page.
struct Page {
    total: usize,
    rows: Vec<RowDef>,
    previous: Option<String>,
}

pub(super) async fn dataset(
    State(arena): State<Arc<Arena>>,
    Path(stream_id): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::Dataset, Method::POST, &req, None).await?;
    let (limit, offset) = paging(&req.uri, 100)?;
    if limit == 0 || limit > 1000 {
        return Err(error_body(
            StatusCode::UNPROCESSABLE_ENTITY,
            "limit must be within 1..=1000",
        ));
    }
    let page = {
        let state = lock(&arena.state);
        state.stream(&stream_id).map(|s| {
            let start = usize::try_from(offset).unwrap_or(usize::MAX).min(s.rows.len());
            let end = start
                .saturating_add(usize::try_from(limit).unwrap_or(usize::MAX))
                .min(s.rows.len());
            Page {
                total: s.rows.len(),
                rows: s.rows[start..end].to_vec(),
                previous: start.checked_sub(1).map(|i| s.rows[i].data_id.clone()),
            }
        })
    };
    let Some(page) = page else {
        return Err(error_body(StatusCode::NOT_FOUND, "stream not found"));
    };
    let body = page_body(page, offset, limit, admitted.fault.as_ref(), arena.dataset_items);
    Ok(finish(&admitted, reply(StatusCode::OK, body)))
}

/// A dataset page's body, with the page faults (a changed total, wrong offset, limit or count, duplicate
/// ids) applied.
fn page_body(page: Page, offset: u64, limit: u64, fault: Option<&FaultKind>, items: bool) -> Value {
    let Page {
        total,
        rows: mut page,
        previous,
    } = page;
    let (mut total, mut offset_out, mut limit_out) = (total as u64, offset, limit);
    match fault {
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
    if fault == Some(&FaultKind::WrongCount) {
        count += 1;
    }
    let mut body = json!({
        "total": total,
        "offset": offset_out,
        "limit": limit_out,
        "count": count,
        "data_ids": page.iter().map(|r| r.data_id.clone()).collect::<Vec<_>>(),
    });
    if items {
        body["items"] = page
            .iter()
            .map(|r| json!({"data_id": r.data_id, "tags": r.tags}))
            .collect();
    }
    body
}

pub(super) async fn stream_tasks(
    State(arena): State<Arc<Arena>>,
    Path(stream_id): Path<String>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::StreamTasks, Method::GET, &req, None).await?;
    let (limit, offset) = paging(&req.uri, 20)?;
    let items = {
        let state = lock(&arena.state);
        let Some(stream) = state.stream(&stream_id) else {
            return Err(error_body(StatusCode::NOT_FOUND, "stream not found"));
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
    Ok(finish(
        &admitted,
        reply(StatusCode::OK, json!({"data": {"items": items}})),
    ))
}

pub(super) async fn harness_version(
    State(arena): State<Arc<Arena>>,
    Path((key, version)): Path<(String, String)>,
    req: RequestHead,
) -> Answer {
    let admitted = admit(&arena, Endpoint::HarnessVersion, Method::GET, &req, None).await?;
    let status = lock(&arena.state)
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
    Ok(finish(&admitted, response))
}
