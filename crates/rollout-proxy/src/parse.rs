//! Parsing generated text as it streams: reasoning (`<think>...</think>`), tool calls in the Hermes/Qwen
//! form (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`) or Qwen3-Coder's
//! (`<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>`), and stop strings.
//!
//! Text that might be the start of a tag is held back until it is clear; a tool-call block is buffered
//! whole and only becomes a tool call if it parses, otherwise it is passed on as content.

#[cfg(test)]
mod tests;

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

const THINK_OPEN: &str = "<think>";
const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";

/// How tool calls appear in generated text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolCallFormat {
    /// `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5, Qwen 3).
    #[default]
    Hermes,
    /// `<tool_call><function=NAME><parameter=P>value</parameter></function></tool_call>` (Qwen3-Coder).
    Qwen3Coder,
    /// Tool calls are not parsed; everything is content.
    None,
}

/// How reasoning appears in generated text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReasoningFormat {
    /// `<think>...</think>` at the start of the output (or an open `<think>` at the end of the prompt).
    #[default]
    Think,
    /// Reasoning is not parsed.
    None,
}

/// A tool call found in the output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedToolCall {
    /// The function name.
    pub name: String,
    /// Its arguments, as a JSON text.
    pub arguments: String,
}

/// A piece of parsed output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed {
    /// Reasoning text.
    Reasoning(String),
    /// Visible content.
    Content(String),
    /// A complete tool call.
    ToolCall(ParsedToolCall),
}

#[derive(Debug)]
enum State {
    Start,
    Reasoning,
    Content,
    ToolCall(String),
}

/// A streaming parser of one generation's text.
#[derive(Debug)]
pub struct OutputParser {
    reasoning: ReasoningFormat,
    tools: ToolCallFormat,
    schemas: HashMap<String, HashMap<String, String>>,
    state: State,
    held: String,
    strip_leading_ws: bool,
}

impl OutputParser {
    /// A parser for one generation. `tools` are the request's tool definitions (their parameter types
    /// decide how Qwen3-Coder values are read); `starts_in_reasoning` says the prompt ended with an open
    /// `<think>`.
    pub fn new(
        reasoning: ReasoningFormat,
        tools: ToolCallFormat,
        tool_defs: Option<&[Value]>,
        starts_in_reasoning: bool,
    ) -> Self {
        let mut schemas = HashMap::new();
        if tools == ToolCallFormat::Qwen3Coder {
            for def in tool_defs.unwrap_or_default() {
                let function = def.get("function").unwrap_or(def);
                let Some(name) = function.get("name").and_then(Value::as_str) else {
                    continue;
                };
                let params = function
                    .get("parameters")
                    .or_else(|| function.get("input_schema"))
                    .and_then(|p| p.get("properties"))
                    .and_then(Value::as_object)
                    .map(|props| {
                        props
                            .iter()
                            .filter_map(|(k, v)| Some((k.clone(), v.get("type")?.as_str()?.to_string())))
                            .collect()
                    })
                    .unwrap_or_default();
                schemas.insert(name.to_string(), params);
            }
        }
        let state = match (reasoning, starts_in_reasoning) {
            (ReasoningFormat::Think, true) => State::Reasoning,
            (ReasoningFormat::Think, false) => State::Start,
            (ReasoningFormat::None, _) => State::Content,
        };
        Self {
            reasoning,
            tools,
            schemas,
            state,
            held: String::new(),
            strip_leading_ws: starts_in_reasoning,
        }
    }

    /// Feeds the next text delta.
    pub fn push(&mut self, text: &str, out: &mut Vec<Parsed>) {
        let mut buf = std::mem::take(&mut self.held);
        buf.push_str(text);
        self.process(buf, out, false);
    }

    /// Ends the generation: everything held back is flushed.
    pub fn finish(&mut self, out: &mut Vec<Parsed>) {
        let buf = std::mem::take(&mut self.held);
        self.process(buf, out, true);
        match std::mem::replace(&mut self.state, State::Content) {
            State::ToolCall(inner) => match self.parse_tool_call(&inner) {
                Some(call) => out.push(Parsed::ToolCall(call)),
                None => self.content(format!("{TOOL_OPEN}{inner}"), out),
            },
            State::Start | State::Reasoning | State::Content => {}
        }
    }

    fn process(&mut self, mut buf: String, out: &mut Vec<Parsed>, end: bool) {
        loop {
            match &mut self.state {
                State::Start => {
                    let trimmed = buf.trim_start();
                    if let Some(rest) = trimmed.strip_prefix(THINK_OPEN) {
                        buf = rest.to_string();
                        self.state = State::Reasoning;
                        self.strip_leading_ws = true;
                    } else if !end && THINK_OPEN.starts_with(trimmed) {
                        self.held = buf;
                        return;
                    } else {
                        self.state = State::Content;
                    }
                }
                State::Reasoning => {
                    if let Some(at) = buf.find(THINK_CLOSE) {
                        let rest = buf[at + THINK_CLOSE.len()..].to_string();
                        buf.truncate(at);
                        self.reasoning_text(buf, out);
                        buf = rest;
                        self.state = State::Content;
                        self.strip_leading_ws = true;
                    } else {
                        let keep = if end { 0 } else { held_suffix(&buf, THINK_CLOSE) };
                        self.held = buf.split_off(buf.len() - keep);
                        self.reasoning_text(buf, out);
                        return;
                    }
                }
                State::Content => {
                    if self.tools == ToolCallFormat::None {
                        self.content(buf, out);
                        return;
                    }
                    if let Some(at) = buf.find(TOOL_OPEN) {
                        let rest = buf[at + TOOL_OPEN.len()..].to_string();
                        buf.truncate(at);
                        self.content(buf, out);
                        buf = rest;
                        self.state = State::ToolCall(String::new());
                    } else {
                        let keep = if end { 0 } else { held_suffix(&buf, TOOL_OPEN) };
                        self.held = buf.split_off(buf.len() - keep);
                        self.content(buf, out);
                        return;
                    }
                }
                State::ToolCall(inner) => {
                    inner.push_str(&buf);
                    let Some(at) = inner.find(TOOL_CLOSE) else {
                        return;
                    };
                    let rest = inner[at + TOOL_CLOSE.len()..].to_string();
                    inner.truncate(at);
                    let inner = std::mem::take(inner);
                    self.state = State::Content;
                    match self.parse_tool_call(&inner) {
                        Some(call) => {
                            out.push(Parsed::ToolCall(call));
                            self.strip_leading_ws = true;
                        }
                        None => self.content(format!("{TOOL_OPEN}{inner}{TOOL_CLOSE}"), out),
                    }
                    buf = rest;
                }
            }
        }
    }

    fn reasoning_text(&mut self, mut text: String, out: &mut Vec<Parsed>) {
        if self.strip_leading_ws {
            let trimmed = text.trim_start_matches('\n');
            if trimmed.len() != text.len() {
                text = trimmed.to_string();
            }
            if !text.is_empty() {
                self.strip_leading_ws = false;
            }
        }
        if !text.is_empty() && self.reasoning == ReasoningFormat::Think {
            out.push(Parsed::Reasoning(text));
        }
    }

    fn content(&mut self, mut text: String, out: &mut Vec<Parsed>) {
        if self.strip_leading_ws {
            let trimmed = text.trim_start();
            if trimmed.len() != text.len() {
                text = trimmed.to_string();
            }
            if !text.is_empty() {
                self.strip_leading_ws = false;
            }
        }
        if text.is_empty() {
            return;
        }
        match out.last_mut() {
            Some(Parsed::Content(prev)) => prev.push_str(&text),
            _ => out.push(Parsed::Content(text)),
        }
    }

    fn parse_tool_call(&self, inner: &str) -> Option<ParsedToolCall> {
        match self.tools {
            ToolCallFormat::Hermes => parse_hermes(inner),
            ToolCallFormat::Qwen3Coder => parse_qwen3_coder(inner, &self.schemas),
            ToolCallFormat::None => None,
        }
    }
}

/// How many bytes at the end of `buf` could be the start of `tag` (a proper prefix of it).
fn held_suffix(buf: &str, tag: &str) -> usize {
    (1..tag.len())
        .rev()
        .find(|&k| buf.ends_with(&tag[..k]))
        .unwrap_or(0)
}

fn parse_hermes(inner: &str) -> Option<ParsedToolCall> {
    let value: Value = serde_json::from_str(inner.trim()).ok()?;
    let name = value.get("name")?.as_str()?.to_string();
    if name.is_empty() {
        return None;
    }
    let arguments = match value.get("arguments").or_else(|| value.get("parameters")) {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => {
            serde_json::from_str::<Value>(s).ok()?;
            s.clone()
        }
        Some(other) => other.to_string(),
    };
    Some(ParsedToolCall { name, arguments })
}

fn parse_qwen3_coder(
    inner: &str,
    schemas: &HashMap<String, HashMap<String, String>>,
) -> Option<ParsedToolCall> {
    let body = inner.trim().strip_prefix("<function=")?;
    let (name, mut rest) = body.split_once('>')?;
    let name = name.trim().to_string();
    if name.is_empty() {
        return None;
    }
    let types = schemas.get(&name);
    let mut args = Map::new();
    loop {
        rest = rest.trim_start();
        if let Some(after) = rest.strip_prefix("</function>") {
            if !after.trim().is_empty() {
                return None;
            }
            break;
        }
        let param = rest.strip_prefix("<parameter=")?;
        let (key, after) = param.split_once('>')?;
        let end = after.find("</parameter>")?;
        let raw = &after[..end];
        let raw = raw.strip_prefix('\n').unwrap_or(raw);
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let value = match types.and_then(|t| t.get(key.trim())).map(String::as_str) {
            Some("string") | None => Value::String(raw.to_string()),
            Some(_) => serde_json::from_str(raw).unwrap_or_else(|_| Value::String(raw.to_string())),
        };
        args.insert(key.trim().to_string(), value);
        rest = &after[end + "</parameter>".len()..];
    }
    Some(ParsedToolCall {
        name,
        arguments: Value::Object(args).to_string(),
    })
}

/// Finds stop strings in streamed text, holding back text that might be the start of one.
///
/// The work per pushed piece is linear in the piece and the held text (at most the longest stop string)
/// for each stop string: a match is found with `str::find`, and how much to hold back with each stop
/// string's prefix function (Knuth-Morris-Pratt), so a hostile stop string cannot make it quadratic.
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// For each stop string `s` and each `k`, the length of the longest proper prefix of `s[..=k]` that
    /// is also its suffix.
    prefix: Vec<Vec<usize>>,
    held: String,
    matched: Option<usize>,
}

/// The prefix function of `s`'s bytes.
fn prefix_function(s: &[u8]) -> Vec<usize> {
    let mut pi = vec![0; s.len()];
    let mut k = 0;
    for i in 1..s.len() {
        while k > 0 && s[i] != s[k] {
            k = pi[k - 1];
        }
        if s[i] == s[k] {
            k += 1;
        }
        pi[i] = k;
    }
    pi
}

/// The length of the longest suffix of `text` that is a proper prefix of `s` (whose prefix function is
/// `pi`). It ends where `text` does and begins at a byte equal to `s`'s first, so it is a whole number of
/// characters.
fn held_prefix(text: &[u8], s: &[u8], pi: &[usize]) -> usize {
    let mut k = 0;
    for &b in text {
        while k > 0 && (k == s.len() || s[k] != b) {
            k = pi[k - 1];
        }
        if s[k] == b {
            k += 1;
        }
    }
    if k == s.len() { pi[k - 1] } else { k }
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        let stops: Vec<String> = stops.into_iter().filter(|s| !s.is_empty()).collect();
        Self {
            prefix: stops.iter().map(|s| prefix_function(s.as_bytes())).collect(),
            stops,
            held: String::new(),
            matched: None,
        }
    }

    /// Whether there is anything to match.
    pub fn is_empty(&self) -> bool {
        self.stops.is_empty()
    }

    /// Feeds `text`; returns the text that is safe to pass on and whether a stop string ended the output
    /// (the stop string and everything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, bool) {
        if self.stops.is_empty() {
            return (text.to_string(), false);
        }
        self.held.push_str(text);
        let first = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((self.held.find(s.as_str())?, i)))
            .min();
        if let Some((at, which)) = first {
            let out = self.held[..at].to_string();
            self.held.clear();
            self.matched = Some(which);
            return (out, true);
        }
        let held = self.held.as_bytes();
        let keep = self
            .stops
            .iter()
            .zip(&self.prefix)
            .map(|(s, pi)| {
                // Only the last `s.len() - 1` bytes can begin a prefix of `s`.
                let from = held.len().saturating_sub(s.len() - 1);
                held_prefix(&held[from..], s.as_bytes(), pi)
            })
            .max()
            .unwrap_or(0);
        let out = self.held[..self.held.len() - keep].to_string();
        self.held.drain(..self.held.len() - keep);
        (out, false)
    }

    /// The stop string that ended the output, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// The text still held back at the end of the output.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.held)
    }
}
