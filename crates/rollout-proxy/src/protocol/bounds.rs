//! Bounds on request fields, as the real APIs bound them where they say so and generously where they do
//! not, so that no field a session key can send grows the proxy's memory or the per-token work without
//! limit. Each refusal is a 400 in the protocol's own error body whose message and `param` name the field.
//!
//! - Stop strings: OpenAI allows at most [`MAX_OPENAI_STOP`] (4); Anthropic's `stop_sequences` at most
//!   [`MAX_ANTHROPIC_STOP`]; each at most [`MAX_STOP_BYTES`] bytes. Every sampled token is scanned for
//!   them, so the scan costs at most count times length per token.
//! - `metadata`: OpenAI's rules (at most [`MAX_METADATA_KEYS`] keys of at most [`MAX_METADATA_KEY_CHARS`]
//!   characters, string values of at most [`MAX_METADATA_VALUE_CHARS`]); Anthropic's holds only
//!   `user_id`, a string of at most [`MAX_USER_ID_CHARS`] characters.
//! - `tools`: at most [`MAX_TOOLS`] tools of at most [`MAX_TOOLS_BYTES`] of JSON together (Claude Code
//!   sends 24 tools in about 60 KB).
//! - Responses' `text` at most [`MAX_TEXT_BYTES`] of JSON (it may hold a JSON schema), `reasoning` at most
//!   [`MAX_REASONING_BYTES`].

#[cfg(test)]
mod tests;

use serde_json::{Map, Value};

use crate::error::ApiError;

/// OpenAI's limit on stop strings (Chat Completions' `stop`).
pub(crate) const MAX_OPENAI_STOP: usize = 4;
/// The limit on Anthropic's `stop_sequences`.
pub(crate) const MAX_ANTHROPIC_STOP: usize = 16;
/// The longest stop string, in bytes.
pub(crate) const MAX_STOP_BYTES: usize = 256;
/// OpenAI's limit on `metadata` keys.
pub(crate) const MAX_METADATA_KEYS: usize = 16;
/// OpenAI's limit on a `metadata` key, in characters.
pub(crate) const MAX_METADATA_KEY_CHARS: usize = 64;
/// OpenAI's limit on a `metadata` value, in characters.
pub(crate) const MAX_METADATA_VALUE_CHARS: usize = 512;
/// Anthropic's limit on `metadata.user_id`, in characters.
pub(crate) const MAX_USER_ID_CHARS: usize = 256;
/// The most tools one request may define.
pub(crate) const MAX_TOOLS: usize = 512;
/// The most JSON all of a request's tools may take together, in bytes.
pub(crate) const MAX_TOOLS_BYTES: usize = 4 * 1024 * 1024;
/// The most JSON Responses' `text` may take, in bytes.
pub(crate) const MAX_TEXT_BYTES: usize = 1024 * 1024;
/// The most JSON Responses' `reasoning` may take, in bytes.
pub(crate) const MAX_REASONING_BYTES: usize = 16 * 1024;

fn refuse(field: &str, message: String) -> ApiError {
    ApiError::invalid(message).with_param(field)
}

/// Checks stop strings against a count limit and [`MAX_STOP_BYTES`].
pub(crate) fn stop(stops: &[String], field: &str, max_count: usize) -> Result<(), ApiError> {
    if stops.len() > max_count {
        return Err(refuse(
            field,
            format!(
                "Invalid '{field}': array too long. Expected an array with maximum length {max_count}, but got an array with length {} instead.",
                stops.len()
            ),
        ));
    }
    if let Some((i, s)) = stops.iter().enumerate().find(|(_, s)| s.len() > MAX_STOP_BYTES) {
        return Err(refuse(
            field,
            format!(
                "Invalid '{field}[{i}]': string too long. Expected at most {MAX_STOP_BYTES} bytes, but got {} bytes instead.",
                s.len()
            ),
        ));
    }
    Ok(())
}

/// Checks OpenAI's `metadata`: an object of at most 16 string values, keys of at most 64 characters and
/// values of at most 512.
pub(crate) fn openai_metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let map = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(map)) => map,
        Some(_) => {
            return Err(refuse(
                "metadata",
                "Invalid 'metadata': expected an object.".into(),
            ));
        }
    };
    if map.len() > MAX_METADATA_KEYS {
        return Err(refuse(
            "metadata",
            format!(
                "Invalid 'metadata': too many properties. Expected an object with at most {MAX_METADATA_KEYS} properties, but got {} instead.",
                map.len()
            ),
        ));
    }
    for (key, value) in map {
        if key.chars().count() > MAX_METADATA_KEY_CHARS {
            return Err(refuse(
                "metadata",
                format!("Invalid 'metadata': a key is longer than {MAX_METADATA_KEY_CHARS} characters."),
            ));
        }
        let Value::String(value) = value else {
            return Err(refuse(
                "metadata",
                format!("Invalid type for 'metadata.{key}': expected a string."),
            ));
        };
        if value.chars().count() > MAX_METADATA_VALUE_CHARS {
            return Err(refuse(
                "metadata",
                format!(
                    "Invalid 'metadata.{key}': string too long. Expected at most {MAX_METADATA_VALUE_CHARS} characters."
                ),
            ));
        }
    }
    Ok(())
}

/// Checks Anthropic's `metadata`: an object whose only field is `user_id`, a string of at most 256
/// characters (or null).
pub(crate) fn anthropic_metadata(metadata: Option<&Value>) -> Result<(), ApiError> {
    let map = match metadata {
        None | Some(Value::Null) => return Ok(()),
        Some(Value::Object(map)) => map,
        Some(_) => return Err(refuse("metadata", "metadata: Input should be an object".into())),
    };
    for (key, value) in map {
        if key != "user_id" {
            return Err(refuse(
                "metadata",
                format!("metadata.{key}: Extra inputs are not permitted"),
            ));
        }
        match value {
            Value::Null => {}
            Value::String(s) if s.chars().count() <= MAX_USER_ID_CHARS => {}
            Value::String(_) => {
                return Err(refuse(
                    "metadata",
                    format!("metadata.user_id: String should have at most {MAX_USER_ID_CHARS} characters"),
                ));
            }
            _ => {
                return Err(refuse(
                    "metadata",
                    "metadata.user_id: Input should be a valid string".into(),
                ));
            }
        }
    }
    Ok(())
}

/// Checks a request's tool definitions against [`MAX_TOOLS`] and [`MAX_TOOLS_BYTES`].
pub(crate) fn tools(tools: Option<&[Value]>) -> Result<(), ApiError> {
    let Some(tools) = tools else {
        return Ok(());
    };
    if tools.len() > MAX_TOOLS {
        return Err(refuse(
            "tools",
            format!(
                "Invalid 'tools': array too long. Expected an array with maximum length {MAX_TOOLS}, but got an array with length {} instead.",
                tools.len()
            ),
        ));
    }
    let mut size = 0;
    for tool in tools {
        size += json_size(tool, MAX_TOOLS_BYTES + 1 - size);
        if size > MAX_TOOLS_BYTES {
            return Err(refuse(
                "tools",
                format!(
                    "Invalid 'tools': the tool definitions take more than {MAX_TOOLS_BYTES} bytes of JSON."
                ),
            ));
        }
    }
    Ok(())
}

/// Checks that `value` of `field` takes at most `max` bytes of JSON.
pub(crate) fn json_field(value: Option<&Value>, field: &str, max: usize) -> Result<(), ApiError> {
    match value {
        Some(v) if json_size(v, max + 1) > max => Err(refuse(
            field,
            format!("Invalid '{field}': it takes more than {max} bytes of JSON."),
        )),
        _ => Ok(()),
    }
}

/// The memory `value` takes as a tree, itself included: each node, each string's and key's bytes, each
/// list's slots and each map entry's key, hash and index (`serde_json` keeps maps in order, in an
/// `IndexMap`). What a stored tree is budgeted by; its JSON can be dozens of times smaller.
pub(crate) fn tree_bytes(value: &Value) -> usize {
    const NODE: usize = std::mem::size_of::<Value>();
    const ENTRY: usize = NODE + std::mem::size_of::<String>() + 2 * std::mem::size_of::<usize>();
    fn below(value: &Value) -> usize {
        match value {
            Value::Null | Value::Bool(_) | Value::Number(_) => 0,
            Value::String(s) => s.capacity(),
            Value::Array(items) => items.capacity() * NODE + items.iter().map(below).sum::<usize>(),
            Value::Object(map) => map.iter().map(|(k, v)| ENTRY + k.capacity() + below(v)).sum(),
        }
    }
    NODE + below(value)
}

/// The length of `value`'s compact JSON, counting strings by their unescaped bytes; it stops counting
/// once the total reaches `cap`.
pub(crate) fn json_size(value: &Value, cap: usize) -> usize {
    fn walk(value: &Value, cap: usize, total: &mut usize) {
        if *total >= cap {
            return;
        }
        match value {
            Value::Null | Value::Bool(_) => *total += 5,
            Value::Number(n) => *total += number_len(n),
            Value::String(s) => *total += s.len() + 2,
            Value::Array(items) => {
                *total += 2 + items.len();
                for item in items {
                    walk(item, cap, total);
                }
            }
            Value::Object(map) => walk_map(map, cap, total),
        }
    }
    fn walk_map(map: &Map<String, Value>, cap: usize, total: &mut usize) {
        *total += 2;
        for (k, v) in map {
            *total += k.len() + 4;
            walk(v, cap, total);
            if *total >= cap {
                return;
            }
        }
    }
    fn number_len(n: &serde_json::Number) -> usize {
        // Digits of the integer part are what a hostile body could inflate; 24 covers any f64 or i64.
        n.as_u64()
            .map_or(24, |u| u.checked_ilog10().map_or(1, |d| d as usize + 1))
    }
    let mut total = 0;
    walk(value, cap, &mut total);
    total.min(cap)
}
