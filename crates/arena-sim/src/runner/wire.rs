//! The three model protocols as the LLM harnesses speak them: endpoint paths, request bodies, and reading an
//! answer (a whole JSON body, or server-sent events as they arrive) into one assistant turn.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use stream_config::LlmProtocol;

use crate::sse::SseEvent;
use crate::tasks::ToolCall;

/// What the model said in one turn.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct Turn {
    /// Its text, blocks joined in order.
    pub(crate) text: String,
    /// Its tool calls, in order.
    pub(crate) calls: Vec<ToolCall>,
}

/// The endpoint a harness of `protocol` calls under `base` (as the SDKs build it: Anthropic appends
/// `/v1/messages`, OpenAI's clients `/responses` and `/chat/completions` to a base that already has `/v1`).
pub(crate) fn endpoint_url(protocol: LlmProtocol, base: &str) -> String {
    let base = base.trim_end_matches('/');
    match protocol {
        LlmProtocol::Anthropic => format!("{base}/v1/messages"),
        LlmProtocol::Responses => format!("{base}/responses"),
        LlmProtocol::ChatCompletions => format!("{base}/chat/completions"),
    }
}

/// The request body of one turn, offering `tools` (a list in the protocol's shape; an empty one is left out).
pub(crate) fn request_body(
    protocol: LlmProtocol,
    model: &str,
    history: &[Value],
    tools: &Value,
    max_tokens: Option<u32>,
) -> Value {
    let mut body = body_with_tools(protocol, model, history, tools, max_tokens);
    if tools.as_array().is_some_and(Vec::is_empty)
        && let Some(o) = body.as_object_mut()
    {
        o.remove("tools");
    }
    body
}

fn body_with_tools(
    protocol: LlmProtocol,
    model: &str,
    history: &[Value],
    tools: &Value,
    max_tokens: Option<u32>,
) -> Value {
    match protocol {
        LlmProtocol::Anthropic => json!({
            "model": model,
            "max_tokens": max_tokens.unwrap_or(1024),
            "messages": history,
            "tools": tools,
            "stream": true,
        }),
        LlmProtocol::Responses => {
            let mut body = json!({
                "model": model, "input": history, "tools": tools, "stream": true, "store": false,
            });
            if let Some(m) = max_tokens {
                body["max_output_tokens"] = json!(m);
            }
            body
        }
        LlmProtocol::ChatCompletions => {
            let mut body = json!({"model": model, "messages": history, "tools": tools});
            if let Some(m) = max_tokens {
                body["max_tokens"] = json!(m);
            }
            body
        }
    }
}

/// Reads a whole (non-streamed) answer.
pub(crate) fn parse_body(protocol: LlmProtocol, body: &Value) -> Result<Turn, String> {
    match protocol {
        LlmProtocol::Anthropic => {
            let content = body
                .get("content")
                .and_then(Value::as_array)
                .ok_or("the message has no content list")?;
            let mut turn = Turn::default();
            for block in content {
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => turn.text.push_str(str_at(block, "text")),
                    Some("tool_use") => turn.calls.push(ToolCall {
                        id: str_at(block, "id").to_string(),
                        name: str_at(block, "name").to_string(),
                        arguments: block.get("input").cloned().unwrap_or_else(|| json!({})),
                    }),
                    _ => {}
                }
            }
            Ok(turn)
        }
        LlmProtocol::Responses => {
            let output = body
                .get("output")
                .and_then(Value::as_array)
                .ok_or("the response has no output list")?;
            Ok(responses_output(output))
        }
        LlmProtocol::ChatCompletions => {
            let message = body
                .pointer("/choices/0/message")
                .ok_or("the completion has no choices[0].message")?;
            let calls = message
                .get("tool_calls")
                .and_then(Value::as_array)
                .map(|calls| {
                    calls
                        .iter()
                        .map(|c| {
                            ToolCall::from_text(
                                str_at(c, "id"),
                                c.pointer("/function/name")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default(),
                                c.pointer("/function/arguments")
                                    .and_then(Value::as_str)
                                    .unwrap_or_default(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            Ok(Turn {
                text: str_at(message, "content").to_string(),
                calls,
            })
        }
    }
}

fn str_at<'a>(v: &'a Value, field: &str) -> &'a str {
    v.get(field).and_then(Value::as_str).unwrap_or_default()
}

/// The text and function calls of a Responses `output` list.
fn responses_output(output: &[Value]) -> Turn {
    let mut turn = Turn::default();
    for item in output {
        match item.get("type").and_then(Value::as_str) {
            Some("message") => {
                for part in item
                    .get("content")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    if part.get("type").and_then(Value::as_str) == Some("output_text") {
                        turn.text.push_str(str_at(part, "text"));
                    }
                }
            }
            Some("function_call") => turn.calls.push(ToolCall::from_text(
                str_at(item, "call_id"),
                str_at(item, "name"),
                str_at(item, "arguments"),
            )),
            _ => {}
        }
    }
    turn
}

/// Reads a streamed answer event by event.
pub(crate) enum StreamReader {
    /// Anthropic Messages events.
    Anthropic(AnthropicReader),
    /// OpenAI Responses events.
    Responses(ResponsesReader),
}

impl StreamReader {
    /// A reader for `protocol`'s events (Chat Completions streams are not read: that harness does not stream).
    pub(crate) fn new(protocol: LlmProtocol) -> Option<Self> {
        match protocol {
            LlmProtocol::Anthropic => Some(Self::Anthropic(AnthropicReader::default())),
            LlmProtocol::Responses => Some(Self::Responses(ResponsesReader::default())),
            LlmProtocol::ChatCompletions => None,
        }
    }

    /// Takes one event; an error event ends the answer with its message.
    pub(crate) fn event(&mut self, event: &SseEvent) -> Result<(), String> {
        let data: Value = serde_json::from_str(&event.data).map_err(|_| {
            format!(
                "the stream sent an event that is not JSON: {}",
                preview(&event.data)
            )
        })?;
        let kind = data
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(event.event.as_str())
            .to_string();
        match self {
            Self::Anthropic(r) => r.event(&kind, data),
            Self::Responses(r) => r.event(&kind, data),
        }
    }

    /// Whether the final event arrived.
    pub(crate) fn done(&self) -> bool {
        match self {
            Self::Anthropic(r) => r.stopped,
            Self::Responses(r) => r.completed.is_some(),
        }
    }

    /// The turn, once the stream is over.
    pub(crate) fn finish(self) -> Result<Turn, String> {
        match self {
            Self::Anthropic(r) => r.finish(),
            Self::Responses(r) => r.finish(),
        }
    }
}

enum Block {
    Text(String),
    Tool {
        id: String,
        name: String,
        input: Value,
        json: String,
    },
    Other,
}

/// Anthropic's `message_start`, `content_block_*`, `message_delta`, `message_stop`, `ping` and `error`.
#[derive(Default)]
pub(crate) struct AnthropicReader {
    blocks: BTreeMap<u64, Block>,
    stopped: bool,
}

impl AnthropicReader {
    fn event(&mut self, kind: &str, data: Value) -> Result<(), String> {
        let index = data.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "content_block_start" => {
                let block = data.get("content_block").cloned().unwrap_or(Value::Null);
                let block = match block.get("type").and_then(Value::as_str) {
                    Some("text") => Block::Text(str_at(&block, "text").to_string()),
                    Some("tool_use") => Block::Tool {
                        id: str_at(&block, "id").to_string(),
                        name: str_at(&block, "name").to_string(),
                        input: block.get("input").cloned().unwrap_or_else(|| json!({})),
                        json: String::new(),
                    },
                    _ => Block::Other,
                };
                self.blocks.insert(index, block);
            }
            "content_block_delta" => {
                let delta = data.get("delta").cloned().unwrap_or(Value::Null);
                match (
                    self.blocks.get_mut(&index),
                    delta.get("type").and_then(Value::as_str),
                ) {
                    (Some(Block::Text(text)), Some("text_delta")) => text.push_str(str_at(&delta, "text")),
                    (Some(Block::Tool { json, .. }), Some("input_json_delta")) => {
                        json.push_str(str_at(&delta, "partial_json"));
                    }
                    _ => {}
                }
            }
            "message_stop" => self.stopped = true,
            "error" => {
                let message = data
                    .pointer("/error/message")
                    .and_then(Value::as_str)
                    .map_or_else(|| data.to_string(), str::to_string);
                return Err(message);
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<Turn, String> {
        if !self.stopped {
            return Err("the stream ended before message_stop".to_string());
        }
        let mut turn = Turn::default();
        for block in self.blocks.into_values() {
            match block {
                Block::Text(t) => turn.text.push_str(&t),
                Block::Tool {
                    id,
                    name,
                    input,
                    json,
                } => turn.calls.push(if json.trim().is_empty() {
                    ToolCall {
                        id,
                        name,
                        arguments: input,
                    }
                } else {
                    ToolCall::from_text(id, name, &json)
                }),
                Block::Other => {}
            }
        }
        Ok(turn)
    }
}

/// Responses' `response.*` events: the output comes from `response.completed` (or `response.incomplete`),
/// else from the `response.output_item.done` items.
#[derive(Default)]
pub(crate) struct ResponsesReader {
    items: Vec<Value>,
    completed: Option<Vec<Value>>,
}

impl ResponsesReader {
    fn event(&mut self, kind: &str, data: Value) -> Result<(), String> {
        match kind {
            "response.output_item.done" => {
                if let Some(item) = data.get("item") {
                    self.items.push(item.clone());
                }
            }
            "response.completed" | "response.incomplete" => {
                let output = data
                    .pointer("/response/output")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                self.completed = Some(output);
            }
            "response.failed" => {
                let message = data
                    .pointer("/response/error/message")
                    .and_then(Value::as_str)
                    .unwrap_or("the response failed");
                return Err(message.to_string());
            }
            "error" => {
                let message = data
                    .get("message")
                    .or_else(|| data.pointer("/error/message"))
                    .and_then(Value::as_str)
                    .map_or_else(|| data.to_string(), str::to_string);
                return Err(message);
            }
            _ => {}
        }
        Ok(())
    }

    fn finish(self) -> Result<Turn, String> {
        let Some(output) = self.completed else {
            return Err("the stream ended before response.completed".to_string());
        };
        let output = if output.is_empty() { self.items } else { output };
        Ok(responses_output(&output))
    }
}

/// The start of a text, for error messages.
pub(crate) fn preview(text: &str) -> String {
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text.to_string(),
    }
}
