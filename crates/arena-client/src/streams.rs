//! Streams (E1, E2), harness versions (E9) and a stream's recent tasks (E10).

use reqwest::Method;
use serde_json::Value;
use stream_config::{ArenaRef, LlmProtocol};

use crate::client::{ArenaClient, Call, encode_segment, unwrap_data};
use crate::{Error, Result};

/// A stream as E1 or E2 describe it.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// The stream id.
    pub stream_id: String,
    /// `ACTIVE`, ...; `None` when Arena left it out.
    pub status: Option<String>,
    /// The whole stream object, verbatim.
    pub raw: Value,
}

impl StreamInfo {
    /// Reads a stream object; `stream_id` must be a non-empty string.
    fn from_object(op: &str, value: &Value) -> Result<Self> {
        let info = Self::from_list_item(op, value)?;
        if info.stream_id.is_empty() {
            return Err(Error::malformed(op, "stream_id must be a non-empty string"));
        }
        Ok(info)
    }

    /// Reads a list item, whose id is checked only if the item is chosen.
    fn from_list_item(op: &str, value: &Value) -> Result<Self> {
        let stream_id = value
            .get("stream_id")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let status = match value.get("status") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => {
                return Err(Error::malformed(
                    op,
                    format!("status must be a string, got {other}"),
                ));
            }
        };
        Ok(Self {
            stream_id,
            status,
            raw: value.clone(),
        })
    }

    /// The live reward ref: `None` when null or absent; an object must carry non-empty string `key` and
    /// `version`, else the error says "default_reward_ref is incomplete".
    pub fn live_reward_ref(&self) -> Result<Option<ArenaRef>> {
        match self.raw.get("default_reward_ref") {
            None | Some(Value::Null) => Ok(None),
            Some(v) => ArenaRef::from_json(Some(v)).map(Some).ok_or_else(|| {
                Error::Rejected(format!(
                    "stream {} default_reward_ref is incomplete: {v}",
                    self.stream_id
                ))
            }),
        }
    }

    /// The default harness as `key@version`, when both parts are non-empty strings.
    pub fn default_harness(&self) -> Option<String> {
        ArenaRef::from_json(self.raw.get("default_harness_ref")).map(|r| r.to_string())
    }
}

/// The harness protocol of a stream (reference section 2.5 step 3): a non-empty override wins and must be
/// one of the three labels; else it is inferred from the configured harness, else from the stream's default
/// harness key.
pub fn resolve_protocol(
    override_label: Option<&str>,
    harness: Option<&str>,
    stream: Option<&StreamInfo>,
) -> Result<LlmProtocol> {
    if let Some(label) = override_label.map(str::trim).filter(|l| !l.is_empty()) {
        return label.parse().map_err(|_| {
            Error::Invalid(format!(
                "unsupported Arena LLM protocol override {label:?}: expected one of anthropic, responses, chat_completions"
            ))
        });
    }
    if let Some(h) = harness.map(str::trim).filter(|h| !h.is_empty()) {
        return Ok(LlmProtocol::infer_from_harness(h));
    }
    let key = stream
        .and_then(|s| s.raw.get("default_harness_ref"))
        .and_then(|r| r.get("key"))
        .and_then(Value::as_str)
        .unwrap_or_default();
    Ok(LlmProtocol::infer_from_harness(key))
}

/// A harness version (E9).
#[derive(Debug, Clone, PartialEq)]
pub struct HarnessVersion {
    /// `PUBLISHED`, `DRAFT`, ...
    pub status: Option<String>,
    /// The reply, verbatim.
    pub raw: Value,
}

/// One task of a stream's recent history (E10).
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSummary {
    /// The status, trimmed and upper-cased.
    pub status: String,
    /// The harness that ran it.
    pub harness_ref: Option<ArenaRef>,
    /// The grader that scored it.
    pub reward_ref: Option<ArenaRef>,
}

impl ArenaClient {
    /// E1: lists streams, with `?status=` when given. Non-object items are dropped.
    pub async fn list_streams(&self, status: Option<&str>) -> Result<Vec<StreamInfo>> {
        let mut call = Call::new(Method::GET, "/streams".to_string());
        if let Some(s) = status {
            call = call.query("status", s);
        }
        let op = call.op();
        let body = self.send_json(&call).await?;
        let items = body
            .get("items")
            .and_then(Value::as_array)
            .ok_or_else(|| Error::malformed(&op, "expected an object with an items list"))?;
        items
            .iter()
            .filter(|i| i.is_object())
            .map(|i| StreamInfo::from_list_item(&op, i))
            .collect()
    }

    /// E1 with `status=ACTIVE`: the first active stream (one page, as the reference does).
    pub async fn first_active_stream(&self) -> Result<StreamInfo> {
        let first = self
            .list_streams(Some("ACTIVE"))
            .await?
            .into_iter()
            .next()
            .ok_or_else(|| Error::Rejected("Arena has no ACTIVE stream".to_string()))?;
        if first.stream_id.is_empty() {
            return Err(Error::malformed(
                "GET /openapi/v1/streams",
                "the first ACTIVE stream has no non-empty stream_id",
            ));
        }
        Ok(first)
    }

    /// E2: one stream. Unwraps `data` then `stream`; the returned id must match, and a present status must
    /// be `ACTIVE`.
    pub async fn get_stream(&self, stream_id: &str) -> Result<StreamInfo> {
        let call = Call::new(Method::GET, format!("/streams/{}", encode_segment(stream_id)));
        let op = call.op();
        let body = self.send_json(&call).await?;
        let data = unwrap_data(&body);
        let stream = match data.get("stream") {
            Some(s @ Value::Object(_)) => s,
            _ => data,
        };
        if !stream.is_object() {
            return Err(Error::malformed(&op, "expected a stream object"));
        }
        let info = StreamInfo::from_object(&op, stream)?;
        if info.stream_id != stream_id {
            return Err(Error::malformed(
                &op,
                format!(
                    "returned id {:?} for requested stream {stream_id:?}",
                    info.stream_id
                ),
            ));
        }
        if let Some(status) = &info.status
            && status != "ACTIVE"
        {
            return Err(Error::Rejected(format!(
                "stream {stream_id} is {status}, not ACTIVE"
            )));
        }
        Ok(info)
    }

    /// The stream with this id, or the first active one when `stream_id` is empty.
    pub async fn resolve_stream(&self, stream_id: &str) -> Result<StreamInfo> {
        if stream_id.trim().is_empty() {
            self.first_active_stream().await
        } else {
            self.get_stream(stream_id).await
        }
    }

    /// E9: a harness version.
    pub async fn get_harness_version(&self, key: &str, version: &str) -> Result<HarnessVersion> {
        let call = Call::new(
            Method::GET,
            format!(
                "/harnesses/{}/versions/{}",
                encode_segment(key),
                encode_segment(version)
            ),
        );
        let body = self.send_json(&call).await?;
        let status = body
            .get("data")
            .and_then(|d| d.get("status"))
            .or_else(|| body.get("status"))
            .and_then(Value::as_str)
            .map(str::to_string);
        Ok(HarnessVersion { status, raw: body })
    }

    /// E10: one page of a stream's recent tasks (`limit`, offset 0).
    pub async fn list_stream_tasks(&self, stream_id: &str, limit: u32) -> Result<Vec<TaskSummary>> {
        let call = Call::new(
            Method::GET,
            format!("/streams/{}/tasks", encode_segment(stream_id)),
        )
        .query("limit", limit)
        .query("offset", 0);
        let op = call.op();
        let body = self.send_json(&call).await?;
        let data = body.get("data").unwrap_or(&body);
        let items = match data {
            Value::Array(items) => items,
            Value::Object(obj) => match obj.get("items") {
                Some(Value::Array(items)) => items,
                _ => return Err(Error::malformed(&op, "data must carry an items list")),
            },
            _ => return Err(Error::malformed(&op, "data must be a list or an object")),
        };
        Ok(items
            .iter()
            .map(|item| item.get("task").filter(|t| t.is_object()).unwrap_or(item))
            .map(|task| TaskSummary {
                status: task
                    .get("status")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .trim()
                    .to_uppercase(),
                harness_ref: ArenaRef::from_json(task.get("harness_ref")),
                reward_ref: ArenaRef::from_json(task.get("reward_ref")),
            })
            .collect())
    }
}
