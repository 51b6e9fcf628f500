//! The task family the sim's graders score: "largest (or smallest) digit under a key", with one tool.
//!
//! A row is a task instance generated deterministically from its `data_id`: a short key such as `q3` and the
//! six digits stored under it. The prompt asks for the largest (family [`TaskFamily::Max`], tag `domain:max`)
//! or smallest ([`TaskFamily::Min`], tag `domain:min`) digit under the key; the only tool is `lookup(key)`,
//! which answers the digits (`4 9 1 7 5 2`). The model must call `lookup` with the right key and answer with one
//! digit; the score is `max(0, 1 - |answer - target| / 4)`, and 0 without a valid lookup or a single-digit
//! answer. Prompts and tool definitions are short because the quickstart's policy has a context of a few
//! hundred tokens. With six digits the largest (smallest) one is concentrated near 9 (0), so the reward has
//! room to rise in stages: a policy answering uniformly random digits earns about 0.31 on average, one that
//! answers 8 to every "largest" and 1 to every "smallest" question about 0.77, and one that reads the digits
//! 1.0.
//!
//! A third family, [`TaskFamily::Sum`] (tag `domain:sum`, module [`sum`]), needs no tool: "what is 7 + 5?",
//! graded with partial credit for closeness and for answering with the number alone. It is sized for a small
//! pretrained instruct model (SmolLM2-135M-Instruct), which solves some of it untrained.
//!
//! A fourth kind of row, [`shell::ShellTask`] (tags `domain:shell` and `cmd:<command>`), is not graded on
//! digits: it replays a script of shell commands as tool calls (see [`shell`]).
//!
//! This module is also the library API that a supervised warm-up uses to produce transcripts: the harnesses
//! build every request from [`TaskInstance::messages`], [`TaskInstance::tools`], [`assistant_turn`] and
//! [`tool_results`], so [`TaskInstance::transcript`] is exactly the conversation a harness sends.

use std::fmt;

use seeds::{SplitMix64, fnv1a};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stream_config::LlmProtocol;

/// The name of the one tool.
pub const LOOKUP: &str = "lookup";

/// How many digits are stored under a key.
pub const DIGITS: usize = 6;

/// A family of tasks: which digit the prompt asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskFamily {
    /// The largest digit; rows carry `domain:max`.
    Max,
    /// The smallest digit; rows carry `domain:min`.
    Min,
    /// The sum of two one-digit numbers, no tool; rows carry `domain:sum`.
    Sum,
}

impl TaskFamily {
    /// Every family.
    pub const ALL: [TaskFamily; 3] = [Self::Max, Self::Min, Self::Sum];
    /// The families of the `lookup` task, the quickstart's.
    pub const LOOKUP: [TaskFamily; 2] = [Self::Max, Self::Min];

    /// The family's label (`max`, `min`, `sum`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Max => "max",
            Self::Min => "min",
            Self::Sum => "sum",
        }
    }

    /// Whether its tasks are answered with the `lookup` tool.
    pub fn uses_lookup(self) -> bool {
        self != Self::Sum
    }

    /// The dataset tag of its rows (`domain:max`).
    pub fn domain_tag(self) -> String {
        format!("domain:{}", self.as_str())
    }

    /// The family named by a row's `domain:` tag, if any (the first `domain:` tag that names one wins).
    pub fn from_tags(tags: &Value) -> Option<Self> {
        tags.as_array()?
            .iter()
            .filter_map(Value::as_str)
            .filter_map(|t| t.strip_prefix("domain:"))
            .find_map(|d| Self::ALL.into_iter().find(|f| f.as_str() == d.trim()))
    }
}

impl fmt::Display for TaskFamily {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One tool call as the model made it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call id the model's protocol gave it (`toolu_...`, `call_...`); empty where there is none.
    #[serde(default)]
    pub id: String,
    /// The tool name.
    pub name: String,
    /// The arguments: the parsed JSON object, or the raw text as a JSON string when it does not parse.
    pub arguments: Value,
}

impl ToolCall {
    /// A call whose arguments arrive as JSON text (Chat Completions, Responses, Anthropic's streamed input).
    pub fn from_text(id: impl Into<String>, name: impl Into<String>, arguments: &str) -> Self {
        let arguments = if arguments.trim().is_empty() {
            json!({})
        } else {
            serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.to_string()))
        };
        Self {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }

    /// The arguments as compact JSON text, as Chat Completions and Responses carry them.
    pub fn arguments_text(&self) -> String {
        match &self.arguments {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }
}

/// What a tool answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The text the model reads.
    pub content: String,
    /// Whether the call was wrong (unknown tool, missing key); the text then says why.
    pub is_error: bool,
}

/// The grader's verdict.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Grade {
    /// The score in [0, 1].
    pub score: f64,
    /// Whether some `lookup` call named the task's key.
    pub lookup_ok: bool,
    /// The number the final answer gave, if it gave one (a single digit for the `lookup` families).
    pub answer: Option<u32>,
    /// The right answer.
    pub target: u32,
}

/// One task: a key and the digits under it, and which digit is asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskInstance {
    /// The family.
    pub family: TaskFamily,
    /// The row it was generated from.
    pub data_id: String,
    /// The key the prompt names (a letter and a digit, e.g. `q3`).
    pub key: String,
    /// The digits stored under the key.
    pub digits: [u8; DIGITS],
}

impl TaskInstance {
    /// The instance of a row: the same `data_id` always gives the same key and digits, on every machine.
    pub fn from_data_id(family: TaskFamily, data_id: &str) -> Self {
        let mut rng = SplitMix64::new(fnv1a(data_id.as_bytes()));
        let letter = char::from(b'a' + (rng.next_u64() % 26) as u8);
        let key = format!("{letter}{}", rng.next_u64() % 10);
        let mut digits = [0u8; DIGITS];
        for d in &mut digits {
            *d = (rng.next_u64() % 10) as u8;
        }
        Self {
            family,
            data_id: data_id.to_string(),
            key,
            digits,
        }
    }

    /// The digit the prompt asks for (a `sum` task's target is [`TaskInstance::sum_target`]).
    pub fn target(&self) -> u8 {
        let digits = self.digits.iter().copied();
        match self.family {
            TaskFamily::Max => digits.max(),
            TaskFamily::Min => digits.min(),
            TaskFamily::Sum => None,
        }
        .unwrap_or(0)
    }

    /// A `sum` task's two operands (1 to 9), from the instance's first two digits.
    pub fn operands(&self) -> (u32, u32) {
        sum::operands(&self.digits)
    }

    /// A `sum` task's answer.
    pub fn sum_target(&self) -> u32 {
        let (a, b) = self.operands();
        a + b
    }

    /// The task prompt, e.g. `largest digit under key q3?` or `What is 7 + 5? ...`.
    pub fn prompt(&self) -> String {
        let which = match self.family {
            TaskFamily::Max => "largest",
            TaskFamily::Min => "smallest",
            TaskFamily::Sum => return sum::prompt(self.operands()),
        };
        format!("{which} digit under key {}?", self.key)
    }

    /// The digits as the tool answers them (`4 9 1 7 5 2`).
    pub fn digits_text(&self) -> String {
        self.digits
            .iter()
            .map(u8::to_string)
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The tools this task offers in one protocol's shape: the `lookup` tool ([`TaskInstance::tools`]), or
    /// none (an empty list) for a `sum` task.
    pub fn offered_tools(&self, protocol: LlmProtocol) -> Value {
        if self.family.uses_lookup() {
            Self::tools(protocol)
        } else {
            json!([])
        }
    }

    /// The tool definitions in one protocol's shape (Anthropic `input_schema`, Responses' flat functions,
    /// Chat Completions' nested functions).
    pub fn tools(protocol: LlmProtocol) -> Value {
        let parameters = json!({
            "type": "object",
            "properties": {"key": {"type": "string"}},
            "required": ["key"],
        });
        function_tool(protocol, LOOKUP, "digits under a key", parameters)
    }

    /// The conversation a harness opens with, in one protocol's shape: one user message with the prompt
    /// (Anthropic `messages`, Responses `input`, Chat Completions `messages`). There is no system prompt.
    pub fn messages(&self, protocol: LlmProtocol) -> Vec<Value> {
        let prompt = self.prompt();
        match protocol {
            LlmProtocol::Anthropic | LlmProtocol::ChatCompletions => {
                vec![json!({"role": "user", "content": prompt})]
            }
            LlmProtocol::Responses => vec![json!({"type": "message", "role": "user", "content": prompt})],
        }
    }

    /// What the tool answers to one call; never fails, wrong calls get an error text the model can read.
    pub fn tool_result(&self, call: &ToolCall) -> ToolResult {
        if call.name != LOOKUP {
            return ToolResult {
                content: format!("unknown tool {}", call.name),
                is_error: true,
            };
        }
        match lookup_key(&call.arguments) {
            None => ToolResult {
                content: "key is required".to_string(),
                is_error: true,
            },
            Some(key) if key == self.key => ToolResult {
                content: self.digits_text(),
                is_error: false,
            },
            Some(key) => ToolResult {
                content: format!("no key {key}"),
                is_error: true,
            },
        }
    }

    /// Grades a run: 0 without a `lookup` of the right key or without a single-digit final answer (surrounding
    /// whitespace allowed), else `max(0, 1 - |answer - target| / 4)`.
    /// A `sum` task is graded by [`sum::grade`] instead, whatever tools were called.
    pub fn grade(&self, final_answer: Option<&str>, tool_calls: &[ToolCall]) -> Grade {
        if self.family == TaskFamily::Sum {
            return sum::grade(self.sum_target(), final_answer);
        }
        let lookup_ok = tool_calls
            .iter()
            .any(|c| c.name == LOOKUP && lookup_key(&c.arguments).as_deref() == Some(self.key.as_str()));
        let answer = final_answer.and_then(single_digit);
        let target = self.target();
        let score = match answer {
            Some(a) if lookup_ok => {
                let distance = f64::from(a.abs_diff(target));
                (1.0 - distance / 4.0).max(0.0)
            }
            _ => 0.0,
        };
        Grade {
            score,
            lookup_ok,
            answer: answer.map(u32::from),
            target: u32::from(target),
        }
    }

    /// The full conversation of a perfect run in one protocol's shape, built by the same functions the
    /// harness uses: the opening messages, the assistant's `lookup` call, the tool's result, and the
    /// assistant's final answer (the target digit). Chat Completions' tool call id is `call_0`, Anthropic's
    /// `toolu_0`, Responses' `call_0`; chat templates normally do not render them.
    pub fn transcript(&self, protocol: LlmProtocol) -> Vec<Value> {
        if self.family == TaskFamily::Sum {
            let mut messages = self.messages(protocol);
            messages.extend(assistant_turn(protocol, &self.sum_target().to_string(), &[]));
            return messages;
        }
        let id = match protocol {
            LlmProtocol::Anthropic => "toolu_0",
            LlmProtocol::Responses | LlmProtocol::ChatCompletions => "call_0",
        };
        let call = ToolCall {
            id: id.to_string(),
            name: LOOKUP.to_string(),
            arguments: json!({"key": self.key}),
        };
        let result = self.tool_result(&call);
        let mut messages = self.messages(protocol);
        messages.extend(assistant_turn(protocol, "", std::slice::from_ref(&call)));
        messages.extend(tool_results(protocol, &[(call, result)]));
        messages.extend(assistant_turn(protocol, &self.target().to_string(), &[]));
        messages
    }
}

/// The messages (or Responses input items) that record one assistant turn: its text and its tool calls.
///
/// Anthropic: one assistant message with a `text` block (if any text) and `tool_use` blocks. Chat
/// Completions: one assistant message with `content` (null when empty and there are tool calls) and
/// `tool_calls`. Responses: an assistant `message` item (if any text) and one `function_call` item per call.
pub fn assistant_turn(protocol: LlmProtocol, text: &str, calls: &[ToolCall]) -> Vec<Value> {
    match protocol {
        LlmProtocol::Anthropic => {
            let mut content = Vec::new();
            if !text.is_empty() {
                content.push(json!({"type": "text", "text": text}));
            }
            content.extend(calls.iter().map(|c| {
                let input = match &c.arguments {
                    Value::Object(_) => c.arguments.clone(),
                    _ => json!({}),
                };
                json!({"type": "tool_use", "id": c.id, "name": c.name, "input": input})
            }));
            vec![json!({"role": "assistant", "content": content})]
        }
        LlmProtocol::ChatCompletions => {
            let content = if text.is_empty() && !calls.is_empty() {
                Value::Null
            } else {
                Value::String(text.to_string())
            };
            let mut message = json!({"role": "assistant", "content": content});
            if !calls.is_empty() {
                message["tool_calls"] = calls
                    .iter()
                    .map(|c| {
                        json!({
                            "id": c.id,
                            "type": "function",
                            "function": {"name": c.name, "arguments": c.arguments_text()},
                        })
                    })
                    .collect();
            }
            vec![message]
        }
        LlmProtocol::Responses => {
            let mut items = Vec::new();
            if !text.is_empty() {
                items.push(json!({
                    "type": "message",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text}],
                }));
            }
            items.extend(calls.iter().map(|c| {
                json!({
                    "type": "function_call", "call_id": c.id, "name": c.name, "arguments": c.arguments_text(),
                })
            }));
            items
        }
    }
}

/// The messages (or input items) that carry tool results back: Anthropic one user message of `tool_result`
/// blocks (with `is_error` on wrong calls), Chat Completions one `tool` message per call, Responses one
/// `function_call_output` item per call.
pub fn tool_results(protocol: LlmProtocol, results: &[(ToolCall, ToolResult)]) -> Vec<Value> {
    match protocol {
        LlmProtocol::Anthropic => {
            let blocks: Vec<Value> = results
                .iter()
                .map(|(call, r)| {
                    let mut block =
                        json!({"type": "tool_result", "tool_use_id": call.id, "content": r.content});
                    if r.is_error {
                        block["is_error"] = json!(true);
                    }
                    block
                })
                .collect();
            vec![json!({"role": "user", "content": blocks})]
        }
        LlmProtocol::ChatCompletions => results
            .iter()
            .map(|(call, r)| json!({"role": "tool", "tool_call_id": call.id, "content": r.content}))
            .collect(),
        LlmProtocol::Responses => results
            .iter()
            .map(|(call, r)| json!({"type": "function_call_output", "call_id": call.id, "output": r.content}))
            .collect(),
    }
}

/// The `key` argument of a lookup call, trimmed.
fn lookup_key(arguments: &Value) -> Option<String> {
    let key = arguments.get("key")?.as_str()?.trim();
    (!key.is_empty()).then(|| key.to_string())
}

/// The answer when it is exactly one ASCII digit, surrounding whitespace aside.
fn single_digit(answer: &str) -> Option<u8> {
    match answer.trim().as_bytes() {
        [d] if d.is_ascii_digit() => Some(d - b'0'),
        _ => None,
    }
}

pub mod shell;
pub mod sum;

#[cfg(test)]
mod tests;

/// One function tool, `name` taking `parameters` (a JSON schema), as a one-element tool list in
/// `protocol`'s shape (Anthropic `input_schema`, Responses' flat functions, Chat Completions' nested ones).
pub(crate) fn function_tool(
    protocol: LlmProtocol,
    name: &str,
    description: &str,
    parameters: Value,
) -> Value {
    match protocol {
        LlmProtocol::Anthropic => {
            json!([{"name": name, "description": description, "input_schema": parameters}])
        }
        LlmProtocol::Responses => json!([{
            "type": "function", "name": name, "description": description, "parameters": parameters,
        }]),
        LlmProtocol::ChatCompletions => json!([{
            "type": "function",
            "function": {"name": name, "description": description, "parameters": parameters},
        }]),
    }
}
