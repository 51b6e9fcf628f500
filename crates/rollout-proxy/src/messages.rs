//! Conversation messages as every protocol hands them to the core: OpenAI-style message objects
//! (`role`, `content`, `tool_calls`, `tool_call_id`), normalised as the reference does, run through
//! configurable preprocessors, prepared for the chat template, and hashed for prefix matching.

#[cfg(test)]
mod tests;

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use serde_json::{Map, Value};

/// Content block types that carry an image.
pub const IMAGE_BLOCK_TYPES: [&str; 3] = ["image", "image_url", "input_image"];

/// Normalises `messages` in place: a message whose `content` is a list becomes one string when its role
/// is `system` or the content holds no image block anywhere (text parts joined with newlines, nested
/// `content` lists such as tool results flattened too); content with images stays structured.
///
/// When any element is not an object, nothing is changed and the index of the first such element is
/// returned, so a list is never left half-normalised.
pub fn normalize_messages(messages: &mut [Value]) -> Result<(), usize> {
    if let Some(bad) = messages.iter().position(|m| !m.is_object()) {
        return Err(bad);
    }
    for message in messages.iter_mut() {
        let is_system = message.get("role").and_then(Value::as_str) == Some("system");
        if let Some(content) = message.get_mut("content")
            && content.is_array()
            && (is_system || !contains_image(content))
        {
            *content = Value::String(flatten_content(content));
        }
    }
    Ok(())
}

/// Flattens content to text: strings as they are; lists joined with `\n` (empty parts skipped); objects by
/// their `text`, else their `content` (recursively), else their JSON with sorted keys; other scalars in
/// their JSON form.
pub fn flatten_content(content: &Value) -> String {
    match content {
        Value::Null => String::new(),
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(flatten_content)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Object(o) => match (o.get("text"), o.get("content")) {
            (Some(Value::String(text)), _) => text.clone(),
            (_, Some(inner)) => flatten_content(inner),
            _ => sorted_json(content),
        },
        other => other.to_string(),
    }
}

fn sorted_json(value: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(o) => {
                let mut keys: Vec<&String> = o.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), sort(&o[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(value).to_string()
}

/// Whether `value` holds an image block anywhere.
pub fn contains_image(value: &Value) -> bool {
    match value {
        Value::Array(items) => items.iter().any(contains_image),
        Value::Object(o) => {
            o.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| IMAGE_BLOCK_TYPES.contains(&t))
                || o.values().any(contains_image)
        }
        _ => false,
    }
}

/// Every image block in `messages`, unmodified, in order.
pub fn collect_images(messages: &[Value]) -> Vec<Value> {
    fn walk(value: &Value, out: &mut Vec<Value>) {
        match value {
            Value::Array(items) => items.iter().for_each(|v| walk(v, out)),
            Value::Object(o) => {
                if o.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| IMAGE_BLOCK_TYPES.contains(&t))
                {
                    out.push(value.clone());
                } else {
                    o.values().for_each(|v| walk(v, out));
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for message in messages {
        if let Some(content) = message.get("content") {
            walk(content, &mut out);
        }
    }
    out
}

/// A message rewrite applied to every request before rendering.
pub trait Preprocessor: Send + Sync + std::fmt::Debug {
    /// The name it is configured by.
    fn name(&self) -> &'static str;
    /// Rewrites `messages` in place.
    fn apply(&self, messages: &mut Vec<Value>);
}

/// The built-in preprocessor called `name`: `strip-anthropic-billing-header`, `strip-system-reminders`,
/// `strip-anthropic-cache-fields` or `normalize-tool-call-arguments`.
pub fn preprocessor(name: &str) -> Option<Arc<dyn Preprocessor>> {
    let p: Arc<dyn Preprocessor> = match name {
        "strip-anthropic-billing-header" => Arc::new(StripBillingHeader),
        "strip-system-reminders" => Arc::new(StripSystemReminders),
        "strip-anthropic-cache-fields" => Arc::new(StripCacheFields),
        "normalize-tool-call-arguments" => Arc::new(NormalizeToolCallArguments),
        _ => return None,
    };
    Some(p)
}

/// The names [`preprocessor`] knows.
pub const PREPROCESSORS: [&str; 4] = [
    "strip-anthropic-billing-header",
    "strip-system-reminders",
    "strip-anthropic-cache-fields",
    "normalize-tool-call-arguments",
];

fn for_each_text(value: &mut Value, f: &mut dyn FnMut(&mut String)) {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter_mut().for_each(|v| for_each_text(v, f)),
        Value::Object(o) => {
            if let Some(Value::String(text)) = o.get_mut("text") {
                f(text);
            }
            if let Some(content) = o.get_mut("content") {
                for_each_text(content, f);
            }
        }
        _ => {}
    }
}

/// Drops the `x-anthropic-billing-header: ...` lines Claude Code puts at the top of its system prompt.
#[derive(Debug)]
struct StripBillingHeader;

impl Preprocessor for StripBillingHeader {
    fn name(&self) -> &'static str {
        "strip-anthropic-billing-header"
    }
    fn apply(&self, messages: &mut Vec<Value>) {
        for message in messages.iter_mut() {
            if message.get("role").and_then(Value::as_str) != Some("system") {
                continue;
            }
            if let Some(content) = message.get_mut("content") {
                for_each_text(content, &mut |text| {
                    if text.contains("x-anthropic-billing-header:") {
                        *text = text
                            .lines()
                            .filter(|l| !l.trim_start().starts_with("x-anthropic-billing-header:"))
                            .collect::<Vec<_>>()
                            .join("\n")
                            .trim_start()
                            .to_string();
                    }
                });
            }
        }
    }
}

/// Removes `<system-reminder>...</system-reminder>` spans from every text.
#[derive(Debug)]
struct StripSystemReminders;

impl Preprocessor for StripSystemReminders {
    fn name(&self) -> &'static str {
        "strip-system-reminders"
    }
    fn apply(&self, messages: &mut Vec<Value>) {
        const OPEN: &str = "<system-reminder>";
        const CLOSE: &str = "</system-reminder>";
        for message in messages.iter_mut() {
            if let Some(content) = message.get_mut("content") {
                for_each_text(content, &mut |text| {
                    if let Some(stripped) = strip_spans(text, OPEN, CLOSE) {
                        *text = stripped;
                    }
                });
            }
        }
    }
}

/// `text` without its `open ... close` spans (an unclosed one runs to the end), in one pass over the text
/// as sent: a tag that only forms once a span is gone stays text. `None` when there is none.
pub(crate) fn strip_spans(text: &str, open: &str, close: &str) -> Option<String> {
    let first = text.find(open)?;
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    let mut next = Some(first);
    while let Some(start) = next {
        out.push_str(&text[at..start]);
        at = text[start + open.len()..]
            .find(close)
            .map_or(text.len(), |e| start + open.len() + e + close.len());
        next = text[at..].find(open).map(|s| at + s);
    }
    out.push_str(&text[at..]);
    Some(out)
}

/// Removes `cache_control` fields from messages and content blocks.
#[derive(Debug)]
struct StripCacheFields;

impl Preprocessor for StripCacheFields {
    fn name(&self) -> &'static str {
        "strip-anthropic-cache-fields"
    }
    fn apply(&self, messages: &mut Vec<Value>) {
        fn strip(value: &mut Value) {
            match value {
                Value::Object(o) => {
                    o.remove("cache_control");
                    o.values_mut().for_each(strip);
                }
                Value::Array(items) => items.iter_mut().for_each(strip),
                _ => {}
            }
        }
        messages.iter_mut().for_each(strip);
    }
}

/// Makes every tool call's `arguments` a compact JSON string (objects are serialised; strings that hold
/// JSON are re-serialised).
#[derive(Debug)]
struct NormalizeToolCallArguments;

impl Preprocessor for NormalizeToolCallArguments {
    fn name(&self) -> &'static str {
        "normalize-tool-call-arguments"
    }
    fn apply(&self, messages: &mut Vec<Value>) {
        for message in messages.iter_mut() {
            let Some(Value::Array(calls)) = message.get_mut("tool_calls") else {
                continue;
            };
            for call in calls.iter_mut() {
                let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments")) else {
                    continue;
                };
                let normal = match &*args {
                    Value::String(s) => serde_json::from_str::<Value>(s).map(|v| v.to_string()).ok(),
                    Value::Null => Some("{}".to_string()),
                    other => Some(other.to_string()),
                };
                if let Some(normal) = normal {
                    *args = Value::String(normal);
                }
            }
        }
    }
}

/// Prepares messages for an HF chat template: `developer` becomes `system`, a missing or null `content`
/// becomes `""`, and tool-call `arguments` strings holding a JSON object become that object (HF templates
/// write them with `tojson`).
pub fn for_template(messages: &[Value]) -> Vec<Value> {
    messages
        .iter()
        .map(|message| {
            let mut message = message.clone();
            if let Some(o) = message.as_object_mut() {
                if o.get("role").and_then(Value::as_str) == Some("developer") {
                    o.insert("role".into(), Value::String("system".into()));
                }
                if o.get("content").is_none_or(Value::is_null) {
                    o.insert("content".into(), Value::String(String::new()));
                }
                if let Some(Value::Array(calls)) = o.get_mut("tool_calls") {
                    for call in calls.iter_mut() {
                        if let Some(args) = call.get_mut("function").and_then(|f| f.get_mut("arguments"))
                            && let Value::String(s) = &*args
                            && let Ok(parsed @ Value::Object(_)) = serde_json::from_str::<Value>(s)
                        {
                            *args = parsed;
                        }
                    }
                }
            }
            message
        })
        .collect()
}

/// A hash of what a message means for prefix matching: its role, its trimmed text (or structured
/// content), its tool calls' names and arguments (as parsed JSON) and its `tool_call_id`. Fields clients
/// add or drop when echoing an assistant message back (`refusal`, `annotations`, reasoning, tool-call ids)
/// do not count.
pub fn message_key(message: &Value) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    let role = message.get("role").and_then(Value::as_str).unwrap_or("");
    let role = if role == "developer" { "system" } else { role };
    role.hash(&mut h);
    match message.get("content") {
        None | Some(Value::Null) => "".hash(&mut h),
        Some(Value::String(s)) => s.trim().hash(&mut h),
        Some(other) => hash_value(other, &mut h),
    }
    if let Some(Value::Array(calls)) = message.get("tool_calls") {
        calls.len().hash(&mut h);
        for call in calls {
            let function = call.get("function").unwrap_or(call);
            function
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("")
                .hash(&mut h);
            match function.get("arguments") {
                Some(Value::String(s)) => match serde_json::from_str::<Value>(s) {
                    Ok(parsed) => hash_value(&parsed, &mut h),
                    Err(_) => s.hash(&mut h),
                },
                Some(other) => hash_value(other, &mut h),
                None => hash_value(&Value::Object(Map::new()), &mut h),
            }
        }
    } else {
        0usize.hash(&mut h);
    }
    message
        .get("tool_call_id")
        .and_then(Value::as_str)
        .unwrap_or("")
        .hash(&mut h);
    h.finish()
}

/// The running key of a message list: `chain(chain(0, k1), k2)...`.
pub fn chain(previous: u64, key: u64) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    previous.hash(&mut h);
    key.hash(&mut h);
    h.finish()
}

/// Hashes JSON structurally, with object keys in sorted order and `cache_control` ignored.
fn hash_value(value: &Value, h: &mut std::hash::DefaultHasher) {
    match value {
        Value::Null => 0u8.hash(h),
        Value::Bool(b) => (1u8, b).hash(h),
        Value::Number(n) => (2u8, n.to_string()).hash(h),
        Value::String(s) => (3u8, s).hash(h),
        Value::Array(items) => {
            (4u8, items.len()).hash(h);
            items.iter().for_each(|v| hash_value(v, h));
        }
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().filter(|k| *k != "cache_control").collect();
            keys.sort();
            (5u8, keys.len()).hash(h);
            for k in keys {
                k.hash(h);
                hash_value(&o[k], h);
            }
        }
    }
}
