//! Anthropic Messages (`POST /v1/messages`, `POST /v1/messages/count_tokens`) on the generation core.
//!
//! Requests are translated into the core's messages: `system` becomes a system message, `tool_use` blocks
//! become tool calls, `tool_result` blocks become tool messages (with `is_error`), `thinking` blocks become
//! the assistant's reasoning, images stay structured. Answers carry `thinking` (from the reasoning parser),
//! `text` and `tool_use` blocks; streams follow Anthropic's event sequence as tokens arrive.
//!
//! Reasoning does not count when a request is matched against earlier turns, so a thinking block the proxy
//! emitted and the harness sends back maps onto the exact tokens sampled for it: the next turn extends the
//! earlier interaction's token sequence, thinking tokens included.

#[cfg(test)]
mod tests;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, Protocol};
use crate::generation::{self, FinishKind, GenEvent, Generation, GenerationInput, Summary, ToolCallOut};
use crate::protocol::{bounds, normalise, prepare_off_thread, take, take_json, take_list, warn_ignored};
use crate::sse::{self, SseProtocol};
use crate::state::ProxyState;

/// `POST /v1/messages`.
pub(crate) async fn handler(State(state): State<ProxyState>, headers: HeaderMap, body: Body) -> Response {
    match run(&state, &headers, body).await {
        Ok(response) => response,
        Err(e) => e.in_protocol(Protocol::Anthropic).into_response(),
    }
}

/// `POST /v1/messages/count_tokens`: the prompt's length exactly as a generation would see it.
pub(crate) async fn count_tokens(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    count(&state, &headers, body)
        .await
        .unwrap_or_else(|e| e.in_protocol(Protocol::Anthropic).into_response())
}

async fn count(state: &ProxyState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let tokens = prepare_off_thread(state, headers, body, |state, session, mut map| {
        let request = parse(state, &mut map)?;
        generation::count_prompt_tokens(state, &session, request.input)
    })
    .await?;
    Ok(axum::Json(json!({"input_tokens": tokens})).into_response())
}

struct Request {
    input: GenerationInput,
    model: Option<String>,
    stream: bool,
}

async fn run(state: &ProxyState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let (request, prepared) = prepare_off_thread(state, headers, body, |state, session, mut map| {
        let mut request = parse(state, &mut map)?;
        let input = std::mem::take(&mut request.input);
        Ok((request, generation::prepare(state, &session, input, "msg_")?))
    })
    .await?;
    let generation = Generation::start(prepared, "toolu_");
    let model = request.model.unwrap_or_else(|| state.model_name().to_string());
    if request.stream {
        let protocol = MessagesStream {
            model,
            id: generation.id().to_string(),
            index: 0,
            open: Open::None,
            held_whitespace: String::new(),
        };
        return Ok(sse::response(
            generation,
            protocol,
            state.shared().config.ping_interval,
        ));
    }
    let summary = generation.collect().await?;
    Ok(axum::Json(message(&summary, &model)).into_response())
}

/// Reads a Messages request body into the core's form.
fn parse(state: &ProxyState, map: &mut Map<String, Value>) -> Result<Request, ApiError> {
    let messages: Vec<Value> = take_list(map, "messages")?
        .ok_or_else(|| ApiError::invalid("messages: field required").with_param("messages"))?;
    let system: Option<Value> = take_json(map, "system")?;
    let model: Option<String> = take(map, "model")?;
    let tools: Option<Vec<Value>> = take_list(map, "tools")?;
    bounds::tools(tools.as_deref())?;
    let tool_choice: Option<Value> = take_json(map, "tool_choice")?;
    let thinking: Option<Value> = take_json(map, "thinking")?;
    let stream = take::<bool>(map, "stream")?.unwrap_or(false);
    let top_k = match take::<i64>(map, "top_k")? {
        Some(k) if k > 0 => u32::try_from(k).ok(),
        _ => None,
    };
    let stop: Vec<String> = take(map, "stop_sequences")?.unwrap_or_default();
    bounds::stop(&stop, "stop_sequences", bounds::MAX_ANTHROPIC_STOP)?;
    // Checked as Anthropic checks it, and then without effect: it concerns the provider's abuse tracking.
    bounds::anthropic_metadata(take_json(map, "metadata")?.as_ref())?;
    let messages = normalise(state, to_core_messages(system, messages)?)?;
    let mut template_kwargs: Option<Map<String, Value>> = None;
    if let Some(enabled) = thinking_enabled(thinking.as_ref())? {
        template_kwargs
            .get_or_insert_with(Map::new)
            .insert("enable_thinking".into(), Value::Bool(enabled));
    }
    let input = GenerationInput {
        messages,
        parse_tools: tool_choice
            .as_ref()
            .and_then(|c| c.get("type"))
            .and_then(Value::as_str)
            != Some("none"),
        tools: to_core_tools(tools)?,
        template_kwargs,
        temperature: take(map, "temperature")?,
        top_p: take(map, "top_p")?,
        top_k,
        max_tokens: take(map, "max_tokens")?,
        seed: None,
        stop,
    };
    warn_ignored(map, "messages");
    Ok(Request { input, model, stream })
}

/// `thinking: {"type": "enabled" | "adaptive" | "disabled"}` as the template's `enable_thinking`.
fn thinking_enabled(thinking: Option<&Value>) -> Result<Option<bool>, ApiError> {
    let Some(config) = thinking else {
        return Ok(None);
    };
    match config.get("type").and_then(Value::as_str) {
        Some("enabled" | "adaptive") => Ok(Some(true)),
        Some("disabled") => Ok(Some(false)),
        other => Err(ApiError::invalid(format!(
            "thinking.type must be \"enabled\", \"adaptive\" or \"disabled\", got {other:?}"
        ))
        .with_param("thinking")),
    }
}

/// Anthropic tool definitions (`name`, `description`, `input_schema`) as OpenAI function tools. Tools the
/// provider runs itself (they have a `type` and no `input_schema`, such as web search) are left out: the
/// policy cannot call them.
fn to_core_tools(tools: Option<Vec<Value>>) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    let mut out = Vec::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let name = tool.get("name").and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(format!("tools[{i}].name: field required")).with_param("tools")
        })?;
        let Some(schema) = tool.get("input_schema") else {
            tracing::debug!(tool = name, "leaving out a tool without input_schema");
            continue;
        };
        let mut function = Map::new();
        function.insert("name".into(), Value::String(name.to_string()));
        if let Some(d) = tool.get("description") {
            function.insert("description".into(), d.clone());
        }
        function.insert("parameters".into(), schema.clone());
        out.push(json!({"type": "function", "function": function}));
    }
    Ok((!out.is_empty()).then_some(out))
}

fn bad_message(at: String, what: &str) -> ApiError {
    ApiError::invalid(format!("{at} {what}")).with_param("messages")
}

/// Translates `system` and Anthropic messages into the core's messages (before normalisation).
fn to_core_messages(system: Option<Value>, messages: Vec<Value>) -> Result<Vec<Value>, ApiError> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    match system {
        None => {}
        Some(Value::String(s)) if s.is_empty() => {}
        Some(content @ (Value::String(_) | Value::Array(_))) => {
            out.push(json!({"role": "system", "content": content}));
        }
        Some(_) => {
            return Err(
                ApiError::invalid("system must be a string or a list of text blocks").with_param("system"),
            );
        }
    }
    for (i, message) in messages.into_iter().enumerate() {
        let Value::Object(mut message) = message else {
            return Err(bad_message(format!("messages[{i}]"), "must be an object"));
        };
        let role = message
            .get("role")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let content = message.remove("content").unwrap_or(Value::Null);
        match (role.as_str(), content) {
            // Claude Code sends mid-conversation system messages (its environment notes) as `system`.
            ("user" | "assistant" | "system", Value::String(text)) => {
                out.push(json!({"role": role, "content": text}));
            }
            ("system", blocks @ Value::Array(_)) => {
                out.push(json!({"role": "system", "content": blocks}));
            }
            ("user", Value::Array(blocks)) => user_blocks(i, blocks, &mut out)?,
            ("assistant", Value::Array(blocks)) => out.push(assistant_blocks(i, blocks)?),
            ("user" | "assistant" | "system", _) => {
                return Err(bad_message(
                    format!("messages[{i}].content"),
                    "must be a string or a list of content blocks",
                ));
            }
            (other, _) => {
                return Err(bad_message(
                    format!("messages[{i}].role"),
                    &format!("must be \"user\", \"assistant\" or \"system\", got {other:?}"),
                ));
            }
        }
    }
    Ok(out)
}

fn block_type(i: usize, j: usize, block: &Value) -> Result<&str, ApiError> {
    block.get("type").and_then(Value::as_str).ok_or_else(|| {
        bad_message(
            format!("messages[{i}].content[{j}]"),
            "must be an object with a type",
        )
    })
}

/// A user turn: `tool_result` blocks become tool messages, everything else user content, in order.
fn user_blocks(i: usize, blocks: Vec<Value>, out: &mut Vec<Value>) -> Result<(), ApiError> {
    let mut pending: Vec<Value> = Vec::new();
    let flush = |pending: &mut Vec<Value>, out: &mut Vec<Value>| {
        if !pending.is_empty() {
            out.push(json!({"role": "user", "content": std::mem::take(pending)}));
        }
    };
    for (j, block) in blocks.into_iter().enumerate() {
        match block_type(i, j, &block)? {
            "tool_result" => {
                flush(&mut pending, out);
                let id = block.get("tool_use_id").and_then(Value::as_str).ok_or_else(|| {
                    bad_message(format!("messages[{i}].content[{j}].tool_use_id"), "is required")
                })?;
                let mut tool = json!({
                    "role": "tool",
                    "tool_call_id": id,
                    "content": block.get("content").cloned().unwrap_or_else(|| Value::String(String::new())),
                });
                // An explicit `is_error` is carried as given, `false` included (AReaL #1747), so a template
                // can tell "succeeded" from "not said"; Anthropic's API accepts only a boolean there.
                match block.get("is_error") {
                    None | Some(Value::Null) => {}
                    Some(Value::Bool(b)) => tool["is_error"] = Value::Bool(*b),
                    Some(_) => {
                        return Err(bad_message(
                            format!("messages[{i}].content[{j}].is_error"),
                            "must be a boolean",
                        ));
                    }
                }
                out.push(tool);
            }
            "thinking" | "redacted_thinking" => {}
            _ => pending.push(block),
        }
    }
    flush(&mut pending, out);
    Ok(())
}

/// An assistant turn: text joined as the output was, thinking as reasoning, `tool_use` as tool calls.
fn assistant_blocks(i: usize, blocks: Vec<Value>) -> Result<Value, ApiError> {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.iter().enumerate() {
        match block_type(i, j, block)? {
            "text" => text.push_str(block.get("text").and_then(Value::as_str).unwrap_or_default()),
            "thinking" => {
                reasoning.push_str(block.get("thinking").and_then(Value::as_str).unwrap_or_default())
            }
            "tool_use" => {
                let at = || format!("messages[{i}].content[{j}]");
                let id = block
                    .get("id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad_message(at(), "has no id"))?;
                let name = block
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad_message(at(), "has no name"))?;
                let input = block.get("input").cloned().unwrap_or_else(|| json!({}));
                calls.push(json!({
                    "id": id, "type": "function",
                    "function": {"name": name, "arguments": input.to_string()},
                }));
            }
            other => tracing::debug!(block = other, "ignoring an assistant content block"),
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    Ok(message)
}

/// A tool call's arguments as a `tool_use` block's `input`, which must be an object.
fn tool_input(call: &ToolCallOut) -> Value {
    match serde_json::from_str::<Value>(&call.arguments) {
        Ok(v @ Value::Object(_)) => v,
        Ok(other) => json!({"value": other}),
        Err(_) => json!({"arguments": call.arguments}),
    }
}

fn stop_reason(summary: &Summary) -> &'static str {
    match summary.finish {
        FinishKind::Length => "max_tokens",
        FinishKind::ToolCalls => "tool_use",
        FinishKind::Stop if summary.stop_sequence.is_some() => "stop_sequence",
        FinishKind::Stop => "end_turn",
    }
}

/// The signature of a thinking block: the interaction it was sampled in.
fn signature(id: &str) -> String {
    format!("arena-rl:{id}")
}

#[derive(Serialize)]
struct Usage {
    input_tokens: usize,
    output_tokens: usize,
    cache_creation_input_tokens: usize,
    cache_read_input_tokens: usize,
}

fn usage(input: usize, output: usize) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 0,
    }
}

fn message(summary: &Summary, model: &str) -> Value {
    let mut content = Vec::new();
    if !summary.reasoning.is_empty() {
        content.push(
            json!({"type": "thinking", "thinking": summary.reasoning, "signature": signature(&summary.id)}),
        );
    }
    if !summary.content.trim().is_empty() {
        content.push(json!({"type": "text", "text": summary.content}));
    }
    for call in &summary.tool_calls {
        content
            .push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": tool_input(call)}));
    }
    json!({
        "id": summary.id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(summary),
        "stop_sequence": summary.stop_sequence,
        "usage": usage(summary.prompt_tokens, summary.completion_tokens),
    })
}

/// Which content block is open in a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    None,
    Thinking,
    Text,
}

/// Messages streaming: `message_start` and a `ping` at once, then content blocks as the output is parsed
/// (`thinking_delta` then `signature_delta`, `text_delta`, a tool call as one `input_json_delta`), then
/// `message_delta` with the stop reason and usage, and `message_stop`.
struct MessagesStream {
    model: String,
    id: String,
    index: usize,
    open: Open,
    /// Whitespace that would open a text block by itself; Anthropic rejects blank text blocks when a client
    /// sends them back, so it waits for visible text.
    held_whitespace: String,
}

#[derive(Serialize)]
struct BlockDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    index: usize,
    delta: DeltaBody<'a>,
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum DeltaBody<'a> {
    #[serde(rename = "text_delta")]
    Text { text: &'a str },
    #[serde(rename = "thinking_delta")]
    Thinking { thinking: &'a str },
    #[serde(rename = "signature_delta")]
    Signature { signature: &'a str },
    #[serde(rename = "input_json_delta")]
    InputJson { partial_json: &'a str },
}

impl MessagesStream {
    fn delta(&self, out: &mut BytesMut, delta: DeltaBody<'_>) {
        let frame = BlockDelta {
            kind: "content_block_delta",
            index: self.index,
            delta,
        };
        sse::event(out, "content_block_delta", &frame);
    }

    fn open(&mut self, kind: Open, out: &mut BytesMut) {
        if self.open == kind {
            return;
        }
        self.close(out);
        let block = match kind {
            Open::Thinking => json!({"type": "thinking", "thinking": "", "signature": ""}),
            Open::Text => json!({"type": "text", "text": ""}),
            Open::None => return,
        };
        sse::event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        );
        self.open = kind;
    }

    fn close(&mut self, out: &mut BytesMut) {
        match self.open {
            Open::None => return,
            Open::Thinking => {
                let signature = signature(&self.id);
                self.delta(
                    out,
                    DeltaBody::Signature {
                        signature: &signature,
                    },
                );
            }
            Open::Text => {}
        }
        sse::event(
            out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.index}),
        );
        self.index += 1;
        self.open = Open::None;
    }

    fn text(&mut self, text: &str, out: &mut BytesMut) {
        if self.open != Open::Text {
            if text.trim().is_empty() {
                self.held_whitespace.push_str(text);
                return;
            }
            self.open(Open::Text, out);
            if !self.held_whitespace.is_empty() {
                let mut all = std::mem::take(&mut self.held_whitespace);
                all.push_str(text);
                self.delta(out, DeltaBody::Text { text: &all });
                return;
            }
        }
        self.delta(out, DeltaBody::Text { text });
    }

    fn tool_call(&mut self, call: &ToolCallOut, out: &mut BytesMut) {
        self.close(out);
        self.held_whitespace.clear();
        let block = json!({"type": "tool_use", "id": call.id, "name": call.name, "input": {}});
        sse::event(
            out,
            "content_block_start",
            &json!({"type": "content_block_start", "index": self.index, "content_block": block}),
        );
        let input = tool_input(call).to_string();
        self.delta(out, DeltaBody::InputJson { partial_json: &input });
        sse::event(
            out,
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": self.index}),
        );
        self.index += 1;
    }
}

impl SseProtocol for MessagesStream {
    fn start(&mut self, generation: &Generation, out: &mut BytesMut) {
        let message = json!({
            "id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": [],
            "stop_reason": null, "stop_sequence": null, "usage": usage(generation.prompt_tokens(), 0),
        });
        sse::event(
            out,
            "message_start",
            &json!({"type": "message_start", "message": message}),
        );
        self.ping(out);
    }

    fn events(&mut self, events: &[GenEvent], out: &mut BytesMut) {
        // Consecutive text of one kind that arrived together goes out as one delta.
        let mut i = 0;
        while i < events.len() {
            match &events[i] {
                GenEvent::Reasoning(_) => {
                    let mut text = String::new();
                    while let Some(GenEvent::Reasoning(t)) = events.get(i) {
                        text.push_str(t);
                        i += 1;
                    }
                    self.open(Open::Thinking, out);
                    self.delta(out, DeltaBody::Thinking { thinking: &text });
                }
                GenEvent::Content(_) => {
                    let mut text = String::new();
                    while let Some(GenEvent::Content(t)) = events.get(i) {
                        text.push_str(t);
                        i += 1;
                    }
                    self.text(&text, out);
                }
                GenEvent::ToolCall(call) => {
                    self.tool_call(call, out);
                    i += 1;
                }
            }
        }
    }

    fn done(&mut self, summary: &Summary, out: &mut BytesMut) {
        self.close(out);
        let delta = json!({
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason(summary), "stop_sequence": summary.stop_sequence},
            "usage": {"output_tokens": summary.completion_tokens},
        });
        sse::event(out, "message_delta", &delta);
        sse::event(out, "message_stop", &json!({"type": "message_stop"}));
    }

    fn error(&mut self, error: &ApiError, out: &mut BytesMut) {
        sse::event(
            out,
            "error",
            &error.clone().in_protocol(Protocol::Anthropic).body(),
        );
    }

    fn ping(&mut self, out: &mut BytesMut) {
        out.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    }
}
