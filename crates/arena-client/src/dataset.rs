//! Dataset rows (E3): the paginated download with every consistency check of reference section 1.4, pages
//! fetched concurrently but checked and emitted in API order, the task type from `domain:` tags, and
//! deterministic sharding for data-parallel workers.

use std::collections::HashSet;
use std::ops::Deref;

use futures::{StreamExt, TryStreamExt};
use reqwest::Method;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use stream_config::{LlmProtocol, task_type_from_tags};

use crate::client::{ArenaClient, Call, encode_segment, unwrap_data};
use crate::{Error, Result};

/// One dataset row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetRow {
    /// The row id.
    pub data_id: String,
    /// The stream it belongs to.
    pub stream_id: String,
    /// The protocol of the stream's harness.
    pub llm_protocol: LlmProtocol,
    /// The single `domain:<x>` tag's `<x>`, else `unknown`.
    pub arena_task_type: String,
    /// The task's base commit, when the row's item gives one (see [`base_commit_of_item`]); the integrity
    /// guard does not count a hash naming it as evidence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_commit: Option<String>,
}

/// The base commit a dataset item gives, if any: its `base_commit` field, else its `metadata.base_commit`,
/// else a `base_commit:<hash>` tag; a value counts only when it is 7 to 64 hex digits (trimmed, lower-cased).
pub fn base_commit_of_item(item: Option<&Value>) -> Option<String> {
    let item = item?;
    let hex = |v: &str| {
        let v = v.trim();
        ((7..=64).contains(&v.len()) && v.chars().all(|c| c.is_ascii_hexdigit()))
            .then(|| v.to_ascii_lowercase())
    };
    let tags = item.get("tags").and_then(Value::as_array);
    item.get("base_commit")
        .and_then(Value::as_str)
        .and_then(hex)
        .or_else(|| {
            item.get("metadata")
                .and_then(|m| m.get("base_commit"))
                .and_then(Value::as_str)
                .and_then(hex)
        })
        .or_else(|| {
            tags?
                .iter()
                .filter_map(Value::as_str)
                .find_map(|t| t.strip_prefix("base_commit:").and_then(hex))
        })
}

/// How the download runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetOptions {
    /// Rows per page (the reference's cap, 1000).
    pub page_size: u64,
    /// Pages in flight at once (default 4).
    pub concurrency: usize,
    /// The most rows a stream may report (default 10 million): Arena's `total` is checked against it before
    /// anything is requested or allocated for it.
    pub max_rows: u64,
}

impl Default for DatasetOptions {
    fn default() -> Self {
        Self {
            page_size: 1000,
            concurrency: 4,
            max_rows: 10_000_000,
        }
    }
}

/// A stream's rows, in API order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Dataset {
    rows: Vec<DatasetRow>,
}

impl Dataset {
    /// Wraps rows.
    pub fn new(rows: Vec<DatasetRow>) -> Self {
        Self { rows }
    }

    /// The rows.
    pub fn into_rows(self) -> Vec<DatasetRow> {
        self.rows
    }

    /// Part `index` of `count` disjoint parts: every `count`-th row starting at `index`, in API order.
    ///
    /// The parts are deterministic, cover every row exactly once, and differ in size by at most one.
    pub fn shard(&self, index: usize, count: usize) -> Result<Dataset> {
        if count == 0 || index >= count {
            return Err(Error::Invalid(format!(
                "shard index {index} must be below the shard count {count} (which must be positive)"
            )));
        }
        Ok(Dataset {
            rows: self.rows.iter().skip(index).step_by(count).cloned().collect(),
        })
    }
}

impl Deref for Dataset {
    type Target = [DatasetRow];

    fn deref(&self) -> &[DatasetRow] {
        &self.rows
    }
}

/// One checked page: ids and, per id, its item (if the page had items).
struct Page {
    ids: Vec<String>,
    items: Vec<Option<Value>>,
}

fn non_negative_int(value: Option<&Value>) -> Option<u64> {
    match value {
        Some(Value::Number(n)) => n.as_u64(),
        _ => None,
    }
}

/// Checks one page against the request and the probed total (reference section 1.4 steps 3-4).
fn check_page(op: &str, body: &Value, total: Option<u64>, offset: u64, limit: u64) -> Result<(u64, Page)> {
    let page = unwrap_page(body);
    let bad = |m: String| Error::malformed(op, m);
    let page_total = non_negative_int(page.get("total")).ok_or_else(|| {
        bad(format!(
            "total must be a non-negative integer, got {}",
            show(page.get("total"))
        ))
    })?;
    if let Some(t) = total
        && page_total != t
    {
        return Err(bad(format!(
            "total changed during pagination: probe said {t}, page at offset {offset} says {page_total}"
        )));
    }
    let got_offset = non_negative_int(page.get("offset"));
    if got_offset != Some(offset) {
        return Err(bad(format!(
            "pagination returned offset {} for requested offset {offset}",
            show(page.get("offset"))
        )));
    }
    let got_limit = non_negative_int(page.get("limit"));
    if got_limit != Some(limit) {
        return Err(bad(format!(
            "pagination returned limit {} for requested limit {limit}",
            show(page.get("limit"))
        )));
    }
    let ids: Vec<String> = match page.get("data_ids") {
        Some(Value::Array(ids)) => ids
            .iter()
            .map(|id| match id {
                Value::String(s) if !s.is_empty() => Ok(s.clone()),
                other => Err(bad(format!("data_ids must be non-empty strings, got {other}"))),
            })
            .collect::<Result<_>>()?,
        other => return Err(bad(format!("data_ids must be a list, got {}", show(other)))),
    };
    let count = non_negative_int(page.get("count"));
    if count != Some(ids.len() as u64) {
        return Err(bad(format!(
            "pagination returned count {} for {} data_ids",
            show(page.get("count")),
            ids.len()
        )));
    }
    let mut seen = HashSet::new();
    if let Some(dup) = ids.iter().find(|id| !seen.insert(id.as_str())) {
        return Err(bad(format!(
            "pagination returned duplicate ids: {dup:?} within one page"
        )));
    }
    let tags = match page.get("items") {
        None | Some(Value::Null) => vec![None; ids.len()],
        Some(Value::Array(items)) => check_items(op, items, &ids)?,
        Some(other) => return Err(bad(format!("items must be a list, got {other}"))),
    };
    Ok((page_total, Page { ids, items: tags }))
}

fn check_items(op: &str, items: &[Value], ids: &[String]) -> Result<Vec<Option<Value>>> {
    let bad = |m: String| Error::malformed(op, m);
    if items.len() != ids.len() {
        return Err(bad(format!(
            "items has {} entries for {} data_ids",
            items.len(),
            ids.len()
        )));
    }
    let mut by_id = std::collections::HashMap::new();
    for (i, item) in items.iter().enumerate() {
        let Some(obj) = item.as_object() else {
            return Err(bad(format!("items[{i}] must be an object")));
        };
        let id = match obj.get("data_id") {
            Some(Value::String(s)) if !s.is_empty() => s.as_str(),
            _ => return Err(bad(format!("items[{i}].data_id must be a non-empty string"))),
        };
        if by_id.insert(id, Some(item.clone())).is_some() {
            return Err(bad(format!("items contain the data_id {id:?} twice")));
        }
    }
    ids.iter()
        .map(|id| {
            by_id
                .remove(id.as_str())
                .ok_or_else(|| bad(format!("items do not match data_ids: {id:?} has no item")))
        })
        .collect()
}

fn unwrap_page(body: &Value) -> &Value {
    if body.get("total").is_none() {
        unwrap_data(body)
    } else {
        body
    }
}

fn show(value: Option<&Value>) -> String {
    value.map_or_else(|| "nothing".to_string(), Value::to_string)
}

impl ArenaClient {
    async fn dataset_page(&self, stream_id: &str, offset: u64, limit: u64) -> Result<(String, Value)> {
        let call = Call::new(
            Method::POST,
            format!("/streams/{}/dataset", encode_segment(stream_id)),
        )
        .query("limit", limit)
        .query("offset", offset);
        let op = call.op();
        Ok((op.clone(), self.send_json(&call).await?))
    }

    /// E3 with `limit=1`: the probe page and the total it reports, which must be at least 1.
    async fn probe(&self, stream_id: &str) -> Result<(String, Value, u64)> {
        let (op, body) = self.dataset_page(stream_id, 0, 1).await?;
        let total = unwrap_page(&body).get("total");
        let total = non_negative_int(total).ok_or_else(|| {
            Error::malformed(
                &op,
                format!("total must be a non-negative integer, got {}", show(total)),
            )
        })?;
        if total == 0 {
            return Err(Error::Rejected(format!(
                "stream {stream_id} contains no dataset rows"
            )));
        }
        Ok((op, body, total))
    }

    /// E3 with `limit=1`: the number of rows, which must be at least 1.
    pub async fn dataset_total(&self, stream_id: &str) -> Result<u64> {
        Ok(self.probe(stream_id).await?.2)
    }

    /// Every row of a stream, in API order, with the default options.
    pub async fn get_all_dataset_rows(&self, stream_id: &str, llm_protocol: LlmProtocol) -> Result<Dataset> {
        self.get_all_dataset_rows_with(stream_id, llm_protocol, &DatasetOptions::default())
            .await
    }

    /// Every row of a stream, in API order: a `limit=1` probe, then pages of at most `page_size` rows,
    /// `concurrency` in flight, each checked against the probe (reference section 1.4).
    pub async fn get_all_dataset_rows_with(
        &self,
        stream_id: &str,
        llm_protocol: LlmProtocol,
        options: &DatasetOptions,
    ) -> Result<Dataset> {
        if options.page_size == 0 || options.concurrency == 0 {
            return Err(Error::Invalid(
                "dataset page_size and concurrency must be positive".to_string(),
            ));
        }
        let (probe_op, probe, total) = self.probe(stream_id).await?;
        if total > options.max_rows {
            return Err(Error::malformed(
                probe_op,
                format!(
                    "total {total} is more rows than the {} a stream may hold here; refusing to page it",
                    options.max_rows
                ),
            ));
        }
        let pages: Vec<(String, Page)> = if total == 1 {
            let (_, page) = check_page(&probe_op, &probe, Some(1), 0, 1)?;
            vec![(probe_op, page)]
        } else {
            let requests: Vec<(u64, u64)> = (0..total)
                .step_by(usize::try_from(options.page_size).unwrap_or(usize::MAX))
                .map(|offset| (offset, options.page_size.min(total - offset)))
                .collect();
            futures::stream::iter(requests)
                .map(|(offset, limit)| async move {
                    let (op, body) = self.dataset_page(stream_id, offset, limit).await?;
                    let (_, page) = check_page(&op, &body, Some(total), offset, limit)?;
                    Ok::<_, Error>((op, page))
                })
                .buffered(options.concurrency)
                .try_collect()
                .await?
        };
        let mut seen = HashSet::new();
        let mut rows = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
        for (op, page) in pages {
            for (id, item) in page.ids.into_iter().zip(page.items) {
                if !seen.insert(id.clone()) {
                    return Err(Error::malformed(
                        op,
                        format!("pagination returned duplicate ids: {id:?} appeared on an earlier page"),
                    ));
                }
                rows.push(DatasetRow {
                    arena_task_type: task_type_from_tags(item.as_ref().and_then(|i| i.get("tags"))),
                    base_commit: base_commit_of_item(item.as_ref()),
                    data_id: id,
                    stream_id: stream_id.to_string(),
                    llm_protocol,
                });
            }
        }
        if rows.len() as u64 != total {
            return Err(Error::malformed(
                format!("POST /openapi/v1/streams/{}/dataset", encode_segment(stream_id)),
                format!("pagination returned {} ids but total is {total}", rows.len()),
            ));
        }
        Ok(Dataset { rows })
    }
}

#[cfg(test)]
mod tests;
