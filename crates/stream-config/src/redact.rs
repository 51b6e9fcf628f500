//! Credential redaction for configs that are saved or printed (spec 6.8).

use serde_json::Value;

/// What a redacted value becomes.
pub const REDACTED: &str = "<redacted>";

/// Whether a config key names a credential: lower-cased, it is `authorization`, `password`, `secret` or
/// `token`; contains `api_key` or `private_key`; or ends with `_password`, `_secret`, `_token` or
/// `_credential`. (`max_tokens` and `tokenizer_path` are not credentials.)
pub fn is_sensitive_key(key: &str) -> bool {
    let key = key.to_lowercase();
    matches!(key.as_str(), "authorization" | "password" | "secret" | "token")
        || key.contains("api_key")
        || key.contains("private_key")
        || ["_password", "_secret", "_token", "_credential"]
            .iter()
            .any(|suffix| key.ends_with(suffix))
}

/// A copy of `value` in which every non-empty value under a sensitive key (see [`is_sensitive_key`]) is
/// `"<redacted>"`, at any depth of mappings and lists. Empty strings and nulls stay as they are, so a reader
/// can tell "unset" from "set"; the input is not modified.
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_sensitive_key(k) && !is_unset(v) {
                        Value::String(REDACTED.to_string())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        other => other.clone(),
    }
}

fn is_unset(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        _ => false,
    }
}

#[cfg(test)]
mod tests;
