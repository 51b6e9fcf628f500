//! OpenAI Chat Completions (`POST /chat/completions`, `/v1/chat/completions`) on the generation core.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::BytesMut;
use serde::Serialize;
use serde_json::{Map, Value};

use crate::error::{ApiError, ApiErrorKind, Protocol};
use crate::generation::{
    self, FinishKind, GenEvent, Generation, GenerationInput, Prepared, Summary, ToolCallOut,
};
use crate::protocol::{
    bounds, normalise, prepare_off_thread, stop_strings, take, take_json, take_list, warn_ignored,
};
use crate::sse::{self, SseProtocol};
use crate::state::ProxyState;

/// `POST /chat/completions`.
pub(crate) async fn handler(State(state): State<ProxyState>, headers: HeaderMap, body: Body) -> Response {
    match run(&state, &headers, body).await {
        Ok(response) => response,
        Err(e) => e.in_protocol(Protocol::OpenAi).into_response(),
    }
}

/// A request parsed, rendered, tokenised and admitted, and how to answer it.
struct Request {
    prepared: Prepared,
    model: Option<String>,
    stream: bool,
    include_usage: bool,
}

async fn run(state: &ProxyState, headers: &HeaderMap, body: Body) -> Result<Response, ApiError> {
    let Request {
        prepared,
        model,
        stream,
        include_usage,
    } = prepare_off_thread(state, headers, body, prepare).await?;
    let generation = Generation::start(prepared, "call_");
    let model = model.unwrap_or_else(|| state.model_name().to_string());
    if stream {
        let protocol = ChatStream {
            model,
            include_usage,
            id: generation.id().to_string(),
            created: generation.created(),
        };
        return Ok(sse::response(
            generation,
            protocol,
            state.shared().config.ping_interval,
        ));
    }
    let summary = generation.collect().await?;
    Ok(axum::Json(completion(&summary, &model)).into_response())
}

/// Reads a Chat Completions body into the core's form and admits its generation (on the pool).
fn prepare(state: &ProxyState, session: Arc<str>, mut map: Map<String, Value>) -> Result<Request, ApiError> {
    let messages: Vec<Value> = take_list(&mut map, "messages")?
        .ok_or_else(|| ApiError::invalid("messages is required").with_param("messages"))?;
    let model: Option<String> = take(&mut map, "model")?;
    let tools: Option<Vec<Value>> = take_list(&mut map, "tools")?;
    bounds::tools(tools.as_deref())?;
    bounds::openai_metadata(map.get("metadata"))?;
    let tool_choice: Option<Value> = take_json(&mut map, "tool_choice")?;
    let stream = take::<bool>(&mut map, "stream")?.unwrap_or(false);
    let include_usage = take_json(&mut map, "stream_options")?
        .and_then(|o| o.get("include_usage").and_then(Value::as_bool))
        .unwrap_or(false);
    let max_tokens = match take::<u32>(&mut map, "max_completion_tokens")? {
        Some(n) => Some(n),
        None => take::<u32>(&mut map, "max_tokens")?,
    };
    map.remove("max_tokens");
    if let Some(n) = take::<u32>(&mut map, "n")?
        && n != 1
    {
        return Err(ApiError::invalid("n must be 1").with_param("n"));
    }
    let top_k = match take::<i64>(&mut map, "top_k")? {
        Some(k) if k > 0 => u32::try_from(k).ok(),
        _ => None,
    };
    let stop = stop_strings(map.remove("stop"), "stop")?;
    bounds::stop(&stop, "stop", bounds::MAX_OPENAI_STOP)?;
    let input = GenerationInput {
        messages: normalise(state, messages)?,
        parse_tools: tool_choice.as_ref().and_then(Value::as_str) != Some("none"),
        tools: tools.filter(|t| !t.is_empty()),
        template_kwargs: take(&mut map, "chat_template_kwargs")?,
        temperature: take(&mut map, "temperature")?,
        top_p: take(&mut map, "top_p")?,
        top_k,
        max_tokens,
        seed: take(&mut map, "seed")?,
        stop,
    };
    warn_ignored(&map, "chat/completions");
    Ok(Request {
        prepared: generation::prepare(state, &session, input, "chatcmpl-")?,
        model,
        stream,
        include_usage,
    })
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: usize,
    completion_tokens: usize,
    total_tokens: usize,
}

fn usage(summary: &Summary) -> Usage {
    Usage {
        prompt_tokens: summary.prompt_tokens,
        completion_tokens: summary.completion_tokens,
        total_tokens: summary.prompt_tokens + summary.completion_tokens,
    }
}

#[derive(Serialize)]
struct WireFunction<'a> {
    name: &'a str,
    arguments: &'a str,
}

#[derive(Serialize)]
struct WireToolCall<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    index: Option<usize>,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    function: WireFunction<'a>,
}

fn wire_call(call: &ToolCallOut, with_index: bool) -> WireToolCall<'_> {
    WireToolCall {
        index: with_index.then_some(call.index),
        id: &call.id,
        kind: "function",
        function: WireFunction {
            name: &call.name,
            arguments: &call.arguments,
        },
    }
}

fn finish_reason(kind: FinishKind) -> &'static str {
    match kind {
        FinishKind::Stop => "stop",
        FinishKind::Length => "length",
        FinishKind::ToolCalls => "tool_calls",
    }
}

#[derive(Serialize)]
struct Message<'a> {
    role: &'static str,
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<WireToolCall<'a>>,
}

#[derive(Serialize)]
struct Choice<'a> {
    index: usize,
    message: Message<'a>,
    logprobs: Option<()>,
    finish_reason: &'static str,
}

#[derive(Serialize)]
struct Completion<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: [Choice<'a>; 1],
    usage: Usage,
}

fn completion<'a>(summary: &'a Summary, model: &'a str) -> Completion<'a> {
    let content = if summary.content.is_empty() && !summary.tool_calls.is_empty() {
        None
    } else {
        Some(summary.content.as_str())
    };
    Completion {
        id: &summary.id,
        object: "chat.completion",
        created: summary.created,
        model,
        choices: [Choice {
            index: 0,
            message: Message {
                role: "assistant",
                content,
                reasoning_content: (!summary.reasoning.is_empty()).then_some(summary.reasoning.as_str()),
                tool_calls: summary.tool_calls.iter().map(|c| wire_call(c, false)).collect(),
            },
            logprobs: None,
            finish_reason: finish_reason(summary.finish),
        }],
        usage: usage(summary),
    }
}

/// Chat Completions streaming: a role chunk at once, then content, reasoning and tool-call deltas as they
/// are parsed, a final chunk with the finish reason, usage when asked for, and `[DONE]`.
struct ChatStream {
    model: String,
    include_usage: bool,
    id: String,
    created: u64,
}

#[derive(Serialize, Default)]
struct Delta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reasoning_content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_calls: Option<[WireToolCall<'a>; 1]>,
}

#[derive(Serialize)]
struct ChunkChoice<'a> {
    index: usize,
    delta: Delta<'a>,
    logprobs: Option<()>,
    finish_reason: Option<&'static str>,
}

#[derive(Serialize)]
struct Chunk<'a> {
    id: &'a str,
    object: &'static str,
    created: u64,
    model: &'a str,
    choices: Vec<ChunkChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Usage>,
}

impl ChatStream {
    fn chunk<'a>(&'a self, delta: Delta<'a>, finish: Option<&'static str>) -> Chunk<'a> {
        Chunk {
            id: &self.id,
            object: "chat.completion.chunk",
            created: self.created,
            model: &self.model,
            choices: vec![ChunkChoice {
                index: 0,
                delta,
                logprobs: None,
                finish_reason: finish,
            }],
            usage: None,
        }
    }
}

impl SseProtocol for ChatStream {
    fn start(&mut self, _generation: &Generation, out: &mut BytesMut) {
        let delta = Delta {
            role: Some("assistant"),
            content: Some(""),
            ..Delta::default()
        };
        sse::data(out, &self.chunk(delta, None));
    }

    fn events(&mut self, events: &[GenEvent], out: &mut BytesMut) {
        // Consecutive text of one kind that arrived together goes out as one chunk.
        let mut i = 0;
        while i < events.len() {
            match &events[i] {
                GenEvent::Content(_) | GenEvent::Reasoning(_) => {
                    let reasoning = matches!(events[i], GenEvent::Reasoning(_));
                    let mut text = String::new();
                    while let Some(e) = events.get(i) {
                        match (e, reasoning) {
                            (GenEvent::Content(t), false) | (GenEvent::Reasoning(t), true) => {
                                text.push_str(t)
                            }
                            _ => break,
                        }
                        i += 1;
                    }
                    let delta = if reasoning {
                        Delta {
                            reasoning_content: Some(&text),
                            ..Delta::default()
                        }
                    } else {
                        Delta {
                            content: Some(&text),
                            ..Delta::default()
                        }
                    };
                    sse::data(out, &self.chunk(delta, None));
                }
                GenEvent::ToolCall(call) => {
                    let delta = Delta {
                        tool_calls: Some([wire_call(call, true)]),
                        ..Delta::default()
                    };
                    sse::data(out, &self.chunk(delta, None));
                    i += 1;
                }
            }
        }
    }

    fn done(&mut self, summary: &Summary, out: &mut BytesMut) {
        sse::data(
            out,
            &self.chunk(Delta::default(), Some(finish_reason(summary.finish))),
        );
        if self.include_usage {
            let chunk = Chunk {
                id: &self.id,
                object: "chat.completion.chunk",
                created: self.created,
                model: &self.model,
                choices: Vec::new(),
                usage: Some(usage(summary)),
            };
            sse::data(out, &chunk);
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
    }

    fn error(&mut self, error: &ApiError, out: &mut BytesMut) {
        let mut body = error.clone().in_protocol(Protocol::OpenAi).body();
        // Inside a stream an overflow is typed as AReaL's proxy types it (`arena-2026.md` 2.11), so a harness
        // that reads only `type` compacts instead of retrying; the 400 before a stream keeps OpenAI's type.
        if error.kind == ApiErrorKind::ContextLengthExceeded {
            body["error"]["type"] = "context_length_exceeded".into();
        }
        sse::data(out, &body);
    }
}
