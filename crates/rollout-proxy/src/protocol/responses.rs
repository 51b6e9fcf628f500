//! OpenAI Responses (`POST /responses`, `POST /v1/responses`, `GET /v1/responses/{id}`) on the generation
//! core, with stateful chaining.
//!
//! `input` items become the core's messages: `message` items by role, `function_call` items as the
//! assistant's tool calls, `function_call_output` items as tool messages, `reasoning` items as the
//! assistant's reasoning (consecutive assistant items form one assistant turn, as the model produced
//! them). `instructions` is a leading system message.
//!
//! With `store` (the default), the answer is kept in its session: `GET /v1/responses/{id}` returns it, and
//! a later request with `previous_response_id` continues the conversation it ended. The stored chain
//! holds each response's new input and its output in the core's form, so the continued conversation
//! extends the earlier interaction's exact tokens. Chains never cross sessions.
//!
//! What a session stores is bounded: at most [`store::MAX_STORED_RESPONSES`] responses, and at most
//! `SessionLimits::max_response_bytes_per_session` bytes of their JSON (input, output and the response
//! object with its echoed `metadata`, `tools`, `text` and `reasoning`), within
//! `SessionLimits::max_response_bytes` across sessions. Past either, the session's oldest responses are
//! forgotten first, as past the count (a later `previous_response_id` naming one is a 400
//! `previous_response_not_found`); a response larger than the room a session has is answered but not kept.

mod store;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use serde::Serialize;
use serde_json::{Map, Value, json};

use crate::error::{ApiError, ApiErrorKind, Protocol};
use crate::generation::{
    self, FinishKind, GenEvent, Generation, GenerationInput, Prepared, Summary, ToolCallOut,
};
use crate::protocol::{
    bounds, normalise, prepare_off_thread, session_of, take, take_json, take_list, warn_ignored,
};
use crate::sse::{self, SseProtocol};
use crate::state::ProxyState;
use store::{ResponseStore, StoredResponse};

/// The Responses store of `state` (made on first use).
fn stored_responses(state: &ProxyState) -> Arc<ResponseStore> {
    state.side(|config| ResponseStore::new(&config.limits))
}

/// `POST /responses`.
pub(crate) async fn handler(State(state): State<ProxyState>, headers: HeaderMap, body: Body) -> Response {
    match run(&state, &headers, body).await {
        Ok(response) => response,
        Err(e) => e.in_protocol(Protocol::OpenAi).into_response(),
    }
}

/// `GET /v1/responses/{id}`: a stored response of the caller's session (the admin may read any session's).
pub(crate) async fn get(
    State(state): State<ProxyState>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    let not_found = || {
        ApiError::new(
            ApiErrorKind::NotFound,
            format!("Response with id '{id}' not found."),
        )
        .with_param("response_id")
    };
    let found = if state.require_admin(&headers).is_ok() {
        stored_responses(&state).find(&id)
    } else {
        match session_of(&state, &headers) {
            Ok(session) => {
                let known = state.store().get_mut(&session).is_ok();
                known
                    .then(|| stored_responses(&state).get(&session, &id))
                    .flatten()
            }
            Err(e) => return e.into_response(),
        }
    };
    match found {
        Some(json) => ([(axum::http::header::CONTENT_TYPE, "application/json")], json).into_response(),
        None => not_found().into_response(),
    }
}

fn decimal(v: f32) -> Value {
    v.to_string()
        .parse::<f64>()
        .ok()
        .and_then(serde_json::Number::from_f64)
        .map_or(Value::Null, Value::Number)
}

/// What the response object echoes of its request.
struct RequestEcho {
    model: String,
    instructions: Value,
    max_output_tokens: Value,
    parallel_tool_calls: bool,
    previous_response_id: Option<String>,
    store: bool,
    temperature: Value,
    top_p: Value,
    tool_choice: Value,
    tools: Value,
    metadata: Value,
    reasoning: Value,
    text: Value,
}

/// A request parsed, rendered, tokenised and admitted, and how to answer it.
struct Request {
    echo: RequestEcho,
    prepared: Prepared,
    keep: Option<PendingStore>,
    stream: bool,
}

async fn run(state: &ProxyState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let Request {
        echo,
        prepared,
        keep,
        stream,
    } = prepare_off_thread(state, headers, body, prepare).await?;
    let generation = Generation::start(prepared, "call_");
    if stream {
        let protocol = ResponsesStream {
            echo,
            id: generation.id().to_string(),
            created: generation.created(),
            sequence: 0,
            output: Vec::new(),
            open: None,
            keep,
        };
        return Ok(sse::response(
            generation,
            protocol,
            state.shared().config.ping_interval,
        ));
    }
    let summary = generation.collect().await?;
    let output = output_items(&summary);
    let response = response_object(&echo, &summary.id, summary.created, &output, Some(&summary));
    if let Some(keep) = keep {
        keep.store(&summary, &response);
    }
    Ok(axum::Json(&response).into_response())
}

/// Reads a Responses body into the core's form, with the stored chain it continues, and admits its
/// generation (on the pool).
fn prepare(state: &ProxyState, session: Arc<str>, mut map: Map<String, Value>) -> Result<Request, ApiError> {
    let input: Value = take_json(&mut map, "input")?
        .ok_or_else(|| ApiError::invalid("input is required").with_param("input"))?;
    let instructions: Option<Value> = take_json(&mut map, "instructions")?;
    let previous: Option<String> = take(&mut map, "previous_response_id")?;
    let store = take::<bool>(&mut map, "store")?.unwrap_or(true);
    let stream = take::<bool>(&mut map, "stream")?.unwrap_or(false);
    let model: Option<String> = take(&mut map, "model")?;
    let tools: Option<Vec<Value>> = take_list(&mut map, "tools")?;
    bounds::tools(tools.as_deref())?;
    let tool_choice: Option<Value> = take_json(&mut map, "tool_choice")?;
    let temperature: Option<f32> = take(&mut map, "temperature")?;
    let top_p: Option<f32> = take(&mut map, "top_p")?;
    let max_output_tokens: Option<u32> = take(&mut map, "max_output_tokens")?;
    let parallel_tool_calls = take::<bool>(&mut map, "parallel_tool_calls")?.unwrap_or(true);
    let top_k = match take::<i64>(&mut map, "top_k")? {
        Some(k) if k > 0 => u32::try_from(k).ok(),
        _ => None,
    };
    let metadata = take_json(&mut map, "metadata")?;
    bounds::openai_metadata(metadata.as_ref())?;
    let reasoning = take_json(&mut map, "reasoning")?;
    bounds::json_field(reasoning.as_ref(), "reasoning", bounds::MAX_REASONING_BYTES)?;
    let text = take_json(&mut map, "text")?;
    bounds::json_field(text.as_ref(), "text", bounds::MAX_TEXT_BYTES)?;
    let mut echo = RequestEcho {
        model: model.unwrap_or_else(|| state.model_name().to_string()),
        instructions: instructions.clone().unwrap_or(Value::Null),
        max_output_tokens: max_output_tokens.map_or(Value::Null, Value::from),
        parallel_tool_calls,
        previous_response_id: previous.clone(),
        store,
        temperature: Value::from(temperature.unwrap_or(1.0)),
        top_p: Value::from(top_p.unwrap_or(1.0)),
        tool_choice: tool_choice.clone().unwrap_or_else(|| json!("auto")),
        tools: Value::Array(tools.clone().unwrap_or_default()),
        metadata: metadata.unwrap_or_else(|| json!({})),
        reasoning: reasoning.unwrap_or_else(|| json!({"effort": null, "summary": null})),
        text: text.unwrap_or_else(|| json!({"format": {"type": "text"}})),
    };
    // Accepted and without effect: they ask for provider-side caching, storage of extra fields or billing.
    for field in [
        "include",
        "prompt_cache_key",
        "client_metadata",
        "truncation",
        "user",
        "service_tier",
    ] {
        map.remove(field);
    }

    let new_messages = normalise(state, input_messages(input)?)?;
    let mut messages = Vec::new();
    if let Some(instructions) = instructions {
        let text = match instructions {
            Value::String(s) => s,
            other => crate::messages::flatten_content(&other),
        };
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    if let Some(previous) = &previous {
        state.store().get_mut(&session)?;
        let earlier = stored_responses(state)
            .conversation(&session, previous)
            .map(|turns| store::messages(&turns))
            .ok_or_else(|| {
                ApiError::invalid(format!("Previous response with id '{previous}' not found."))
                    .with_param("previous_response_id")
                    .with_code("previous_response_not_found")
            })?;
        messages.extend(earlier);
    }
    let new_start = messages.len();
    messages.extend(new_messages);
    let mut generation_input = GenerationInput {
        messages,
        parse_tools: tool_choice.as_ref().and_then(Value::as_str) != Some("none"),
        tools: function_tools(tools)?,
        template_kwargs: None,
        temperature,
        top_p,
        top_k,
        max_tokens: max_output_tokens,
        seed: None,
        stop: Vec::new(),
    };
    warn_ignored(&map, "responses");
    let prepared = generation::prepare_keeping_messages(state, &session, &mut generation_input, "resp_")?;
    let new_messages = generation_input.messages.split_off(new_start);
    // The response object reports the values the output was sampled at (the run's defaults or override
    // included), written as the shortest decimal of the f32 so that 0.6 reads back as 0.6.
    echo.temperature = decimal(prepared.sampling().temperature);
    echo.top_p = decimal(prepared.sampling().top_p);
    let keep = store.then(|| PendingStore {
        state: state.clone(),
        session,
        previous: previous.map(String::into_boxed_str),
        input: new_messages,
    });
    Ok(Request {
        echo,
        prepared,
        keep,
        stream,
    })
}

/// What to store of a response once it is complete (`store: true`).
struct PendingStore {
    state: ProxyState,
    session: Arc<str>,
    previous: Option<Box<str>>,
    input: Vec<Value>,
}

impl PendingStore {
    fn store(self, summary: &Summary, response: &ResponseObject<'_>) {
        let Ok(response) = serde_json::to_vec(response) else {
            return;
        };
        let stored = StoredResponse {
            previous: self.previous,
            input: self.input.into(),
            output: summary.message().into(),
            response: response.into(),
        };
        let responses = stored_responses(&self.state);
        let sessions = self.state.store();
        responses.insert(&sessions, &self.session, &summary.id, stored);
    }
}

/// Function tools in Chat Completions' form; other tool kinds (built-in tools the provider runs) are left
/// out, since the policy cannot call them.
fn function_tools(tools: Option<Vec<Value>>) -> Result<Option<Vec<Value>>, ApiError> {
    let Some(tools) = tools else {
        return Ok(None);
    };
    let mut out = Vec::new();
    for (i, tool) in tools.into_iter().enumerate() {
        if tool.get("type").and_then(Value::as_str) != Some("function") {
            let kind = tool.get("type").and_then(Value::as_str).unwrap_or("?");
            tracing::debug!(tool = kind, "leaving out a non-function tool");
            continue;
        }
        let name = tool
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| ApiError::invalid(format!("tools[{i}].name is required")).with_param("tools"))?;
        let mut function = Map::new();
        function.insert("name".into(), Value::String(name.to_string()));
        for field in ["description", "parameters", "strict"] {
            if let Some(v) = tool.get(field).filter(|v| !v.is_null()) {
                function.insert(field.into(), v.clone());
            }
        }
        out.push(json!({"type": "function", "function": function}));
    }
    Ok((!out.is_empty()).then_some(out))
}

fn bad_item(i: usize, what: impl std::fmt::Display) -> ApiError {
    ApiError::invalid(format!("input[{i}]{what}")).with_param("input")
}

/// Where the assistant turn being assembled from consecutive items is.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Phase {
    Reasoning,
    Message,
    Calls,
}

/// `input` (a string, or a list of items) as the core's messages.
fn input_messages(input: Value) -> Result<Vec<Value>, ApiError> {
    let items = match input {
        Value::String(text) => return Ok(vec![json!({"role": "user", "content": text})]),
        Value::Array(items) => items,
        _ => return Err(ApiError::invalid("input must be a string or a list of items").with_param("input")),
    };
    let mut out: Vec<Value> = Vec::with_capacity(items.len());
    // The assistant message being assembled, and how far it got: a model's turn is its reasoning, then its
    // text, then its calls, so an item that goes back in that order starts a new turn.
    let mut turn: Option<(usize, Phase)> = None;
    for (i, item) in items.into_iter().enumerate() {
        let Value::Object(mut item) = item else {
            return Err(bad_item(i, " must be an object"));
        };
        let kind = match item.get("type").and_then(Value::as_str) {
            Some(t) => t.to_string(),
            None if item.contains_key("role") => "message".to_string(),
            None => return Err(bad_item(i, ".type is required")),
        };
        let role = item.get("role").and_then(Value::as_str).map(str::to_string);
        let phase = match (kind.as_str(), role.as_deref()) {
            ("reasoning", _) => Some(Phase::Reasoning),
            ("message", Some("assistant")) => Some(Phase::Message),
            ("function_call", _) => Some(Phase::Calls),
            _ => None,
        };
        let Some(phase) = phase else {
            turn = None;
            out.push(non_assistant_item(i, &kind, role.as_deref(), &mut item)?);
            continue;
        };
        let at = match turn {
            Some((at, last)) if last <= phase => at,
            _ => {
                out.push(json!({"role": "assistant", "content": ""}));
                out.len() - 1
            }
        };
        turn = Some((at, phase));
        let message = out[at].as_object_mut().expect("assistant messages are objects");
        match phase {
            Phase::Reasoning => {
                let text = reasoning_text(&item);
                append_text(message, "reasoning_content", &text);
            }
            Phase::Message => {
                let text = match item.remove("content") {
                    Some(Value::String(s)) => s,
                    Some(Value::Array(parts)) => parts
                        .iter()
                        .filter_map(|p| p.get("text").or_else(|| p.get("refusal")).and_then(Value::as_str))
                        .collect(),
                    _ => String::new(),
                };
                append_text(message, "content", &text);
            }
            Phase::Calls => {
                let field = |name: &str| {
                    item.get(name)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| bad_item(i, format!(".{name} is required")))
                };
                let call = json!({
                    "id": field("call_id")?, "type": "function",
                    "function": {"name": field("name")?, "arguments": field("arguments")?},
                });
                match message.get_mut("tool_calls") {
                    Some(Value::Array(calls)) => calls.push(call),
                    _ => {
                        message.insert("tool_calls".into(), Value::Array(vec![call]));
                    }
                }
            }
        }
    }
    Ok(out)
}

fn append_text(message: &mut Map<String, Value>, field: &str, text: &str) {
    match message.get_mut(field) {
        Some(Value::String(s)) => s.push_str(text),
        _ => {
            message.insert(field.into(), Value::String(text.to_string()));
        }
    }
}

/// A reasoning item's text: its `content` (`reasoning_text` parts), else its summary.
fn reasoning_text(item: &Map<String, Value>) -> String {
    let parts = |field: &str| -> String {
        item.get(field)
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect()
            })
            .unwrap_or_default()
    };
    let content = parts("content");
    if content.is_empty() {
        parts("summary")
    } else {
        content
    }
}

/// A user, system or developer message, or a tool result.
fn non_assistant_item(
    i: usize,
    kind: &str,
    role: Option<&str>,
    item: &mut Map<String, Value>,
) -> Result<Value, ApiError> {
    match (kind, role) {
        ("message", Some(role @ ("user" | "system" | "developer"))) => {
            let content = match item.remove("content") {
                Some(Value::String(s)) => Value::String(s),
                Some(Value::Array(parts)) => Value::Array(
                    parts
                        .into_iter()
                        .map(|p| match p.get("type").and_then(Value::as_str) {
                            Some("input_text" | "output_text" | "text") => {
                                json!({"type": "text", "text": p.get("text").cloned().unwrap_or_default()})
                            }
                            _ => p,
                        })
                        .collect(),
                ),
                _ => return Err(bad_item(i, ".content must be a string or a list of parts")),
            };
            Ok(json!({"role": role, "content": content}))
        }
        ("message", role) => Err(bad_item(
            i,
            format!(".role must be user, system, developer or assistant, got {role:?}"),
        )),
        ("function_call_output", _) => {
            let id = item
                .get("call_id")
                .and_then(Value::as_str)
                .map(str::to_string)
                .ok_or_else(|| bad_item(i, ".call_id is required"))?;
            let output = item
                .remove("output")
                .unwrap_or_else(|| Value::String(String::new()));
            Ok(json!({"role": "tool", "tool_call_id": id, "content": output}))
        }
        (other, _) => Err(bad_item(
            i,
            format!(
                ".type {other:?} is not supported (message, function_call, function_call_output and reasoning are)"
            ),
        )),
    }
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}{}", crate::auth::random_hex(12))
}

fn reasoning_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "reasoning", "id": id, "summary": [], "content": [{"type": "reasoning_text", "text": text}], "status": status})
}

fn message_item(id: &str, text: &str, status: &str) -> Value {
    json!({"type": "message", "id": id, "status": status, "role": "assistant",
           "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]})
}

fn call_item(id: &str, call: &ToolCallOut, status: &str) -> Value {
    json!({"type": "function_call", "id": id, "call_id": call.id, "name": call.name,
           "arguments": call.arguments, "status": status})
}

/// The output items of a finished generation: reasoning, text, then function calls.
fn output_items(summary: &Summary) -> Vec<Value> {
    let mut out = Vec::new();
    if !summary.reasoning.is_empty() {
        out.push(reasoning_item(&item_id("rs_"), &summary.reasoning, "completed"));
    }
    if !summary.content.is_empty() {
        out.push(message_item(&item_id("msg_"), &summary.content, "completed"));
    }
    for call in &summary.tool_calls {
        out.push(call_item(&item_id("fc_"), call, "completed"));
    }
    out
}

#[derive(Serialize)]
struct ResponseUsage {
    input_tokens: usize,
    input_tokens_details: Value,
    output_tokens: usize,
    output_tokens_details: Value,
    total_tokens: usize,
}

/// The response object, borrowing what it echoes.
#[derive(Serialize)]
struct ResponseObject<'a> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    status: &'static str,
    error: Option<Value>,
    incomplete_details: Option<Value>,
    instructions: &'a Value,
    max_output_tokens: &'a Value,
    model: &'a str,
    output: &'a [Value],
    parallel_tool_calls: bool,
    previous_response_id: Option<&'a str>,
    reasoning: &'a Value,
    store: bool,
    temperature: &'a Value,
    text: &'a Value,
    tool_choice: &'a Value,
    tools: &'a Value,
    top_p: &'a Value,
    truncation: &'static str,
    usage: Option<ResponseUsage>,
    metadata: &'a Value,
}

/// A `response.*` event carrying the whole response.
#[derive(Serialize)]
struct ResponseEvent<'a> {
    #[serde(rename = "type")]
    kind: &'a str,
    sequence_number: u64,
    response: ResponseObject<'a>,
}

/// The response object; `summary` is `None` while it is in progress.
fn response_object<'a>(
    echo: &'a RequestEcho,
    id: &'a str,
    created: u64,
    output: &'a [Value],
    summary: Option<&Summary>,
) -> ResponseObject<'a> {
    let (status, incomplete_details) = match summary.map(|s| s.finish) {
        None => ("in_progress", None),
        Some(FinishKind::Length) => ("incomplete", Some(json!({"reason": "max_output_tokens"}))),
        Some(_) => ("completed", None),
    };
    ResponseObject {
        id,
        object: "response",
        created_at: created,
        status,
        error: None,
        incomplete_details,
        instructions: &echo.instructions,
        max_output_tokens: &echo.max_output_tokens,
        model: &echo.model,
        output,
        parallel_tool_calls: echo.parallel_tool_calls,
        previous_response_id: echo.previous_response_id.as_deref(),
        reasoning: &echo.reasoning,
        store: echo.store,
        temperature: &echo.temperature,
        text: &echo.text,
        tool_choice: &echo.tool_choice,
        tools: &echo.tools,
        top_p: &echo.top_p,
        truncation: "disabled",
        usage: summary.map(|s| ResponseUsage {
            input_tokens: s.prompt_tokens,
            input_tokens_details: json!({"cached_tokens": 0}),
            output_tokens: s.completion_tokens,
            output_tokens_details: json!({"reasoning_tokens": 0}),
            total_tokens: s.prompt_tokens + s.completion_tokens,
        }),
        metadata: &echo.metadata,
    }
}

/// The output item a stream has open.
struct OpenItem {
    kind: Phase,
    id: String,
    text: String,
}

/// Responses streaming: `response.created` and `response.in_progress` at once; each output item opens
/// with `response.output_item.added` (and `response.content_part.added`), streams its deltas as the
/// output is parsed, and closes with the matching `.done` events; the stream ends with
/// `response.completed` (`response.incomplete` at the token limit) holding the whole response.
struct ResponsesStream {
    echo: RequestEcho,
    id: String,
    created: u64,
    sequence: u64,
    output: Vec<Value>,
    open: Option<OpenItem>,
    keep: Option<PendingStore>,
}

#[derive(Serialize)]
struct TextDelta<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    sequence_number: u64,
    item_id: &'a str,
    output_index: usize,
    content_index: usize,
    delta: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    logprobs: Option<[(); 0]>,
}

impl ResponsesStream {
    /// Frames event `name` with `fields` after its `type` and `sequence_number`.
    fn emit(&mut self, out: &mut BytesMut, name: &str, fields: Value) {
        let mut event = Map::new();
        event.insert("type".into(), Value::String(name.to_string()));
        event.insert("sequence_number".into(), Value::from(self.sequence));
        if let Value::Object(fields) = fields {
            event.extend(fields);
        }
        self.sequence += 1;
        sse::event(out, name, &event);
    }

    fn part(kind: Phase, text: &str) -> Value {
        match kind {
            Phase::Reasoning => json!({"type": "reasoning_text", "text": text}),
            _ => json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []}),
        }
    }

    fn open(&mut self, kind: Phase, out: &mut BytesMut) {
        if self.open.as_ref().is_some_and(|o| o.kind == kind) {
            return;
        }
        self.close(out);
        let (id, item) = match kind {
            Phase::Reasoning => {
                let id = item_id("rs_");
                let item = json!({"type": "reasoning", "id": id, "summary": [], "content": [], "status": "in_progress"});
                (id, item)
            }
            _ => {
                let id = item_id("msg_");
                let item = json!({"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []});
                (id, item)
            }
        };
        let index = self.output.len();
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let part = Self::part(kind, "");
        self.emit(
            out,
            "response.content_part.added",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        self.open = Some(OpenItem {
            kind,
            id,
            text: String::new(),
        });
    }

    fn delta(&mut self, kind: Phase, text: &str, out: &mut BytesMut) {
        self.open(kind, out);
        let open = self.open.as_mut().expect("opened above");
        open.text.push_str(text);
        let (name, logprobs) = match kind {
            Phase::Reasoning => ("response.reasoning_text.delta", None),
            _ => ("response.output_text.delta", Some([])),
        };
        let frame = TextDelta {
            kind: name,
            sequence_number: self.sequence,
            item_id: &open.id,
            output_index: self.output.len(),
            content_index: 0,
            delta: text,
            logprobs,
        };
        sse::event(out, name, &frame);
        self.sequence += 1;
    }

    fn close(&mut self, out: &mut BytesMut) {
        let Some(OpenItem { kind, id, text }) = self.open.take() else {
            return;
        };
        let index = self.output.len();
        let (done, item) = match kind {
            Phase::Reasoning => (
                "response.reasoning_text.done",
                reasoning_item(&id, &text, "completed"),
            ),
            _ => ("response.output_text.done", message_item(&id, &text, "completed")),
        };
        let mut event = json!({"item_id": id, "output_index": index, "content_index": 0, "text": text});
        if kind != Phase::Reasoning {
            event["logprobs"] = json!([]);
        }
        self.emit(out, done, event);
        let part = Self::part(kind, &text);
        self.emit(
            out,
            "response.content_part.done",
            json!({"item_id": id, "output_index": index, "content_index": 0, "part": part}),
        );
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }

    fn call(&mut self, call: &ToolCallOut, out: &mut BytesMut) {
        self.close(out);
        let id = item_id("fc_");
        let index = self.output.len();
        let mut added = call_item(&id, call, "in_progress");
        added["arguments"] = json!("");
        self.emit(
            out,
            "response.output_item.added",
            json!({"output_index": index, "item": added}),
        );
        self.emit(
            out,
            "response.function_call_arguments.delta",
            json!({"item_id": id, "output_index": index, "delta": call.arguments}),
        );
        self.emit(
            out,
            "response.function_call_arguments.done",
            json!({"item_id": id, "output_index": index, "name": call.name, "arguments": call.arguments}),
        );
        let item = call_item(&id, call, "completed");
        self.emit(
            out,
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
        self.output.push(item);
    }
}

impl SseProtocol for ResponsesStream {
    fn start(&mut self, _generation: &Generation, out: &mut BytesMut) {
        for name in ["response.created", "response.in_progress"] {
            let event = ResponseEvent {
                kind: name,
                sequence_number: self.sequence,
                response: response_object(&self.echo, &self.id, self.created, &[], None),
            };
            sse::event(out, name, &event);
            self.sequence += 1;
        }
    }

    fn events(&mut self, events: &[GenEvent], out: &mut BytesMut) {
        let mut i = 0;
        while i < events.len() {
            match &events[i] {
                GenEvent::Reasoning(_) | GenEvent::Content(_) => {
                    let reasoning = matches!(events[i], GenEvent::Reasoning(_));
                    let mut text = String::new();
                    while let Some(e) = events.get(i) {
                        match (e, reasoning) {
                            (GenEvent::Reasoning(t), true) | (GenEvent::Content(t), false) => {
                                text.push_str(t)
                            }
                            _ => break,
                        }
                        i += 1;
                    }
                    let kind = if reasoning {
                        Phase::Reasoning
                    } else {
                        Phase::Message
                    };
                    self.delta(kind, &text, out);
                }
                GenEvent::ToolCall(call) => {
                    self.call(call, out);
                    i += 1;
                }
            }
        }
    }

    fn done(&mut self, summary: &Summary, out: &mut BytesMut) {
        self.close(out);
        let response = response_object(&self.echo, &self.id, self.created, &self.output, Some(summary));
        if let Some(keep) = self.keep.take() {
            keep.store(summary, &response);
        }
        let name = if summary.finish == FinishKind::Length {
            "response.incomplete"
        } else {
            "response.completed"
        };
        let event = ResponseEvent {
            kind: name,
            sequence_number: self.sequence,
            response,
        };
        sse::event(out, name, &event);
        self.sequence += 1;
    }

    fn error(&mut self, error: &ApiError, out: &mut BytesMut) {
        self.close(out);
        let mut response = response_object(&self.echo, &self.id, self.created, &self.output, None);
        let code = match error.kind {
            ApiErrorKind::RateLimited => "rate_limit_exceeded",
            ApiErrorKind::ContextLengthExceeded => "context_length_exceeded",
            _ => "server_error",
        };
        response.status = "failed";
        response.error = Some(json!({"code": code, "message": error.message}));
        let event = ResponseEvent {
            kind: "response.failed",
            sequence_number: self.sequence,
            response,
        };
        sse::event(out, "response.failed", &event);
        self.sequence += 1;
    }
}
