//! Credential redaction for anything that is saved or printed: configs, Streams, metrics (spec 6.8).
//!
//! One function, [`redact`], applies three rules, so that every sink (the saved `config.yaml`, `Debug`,
//! printed Streams, experiment trackers) redacts alike:
//!
//! 1. **By name**: a non-empty value under a key that names a credential ([`is_sensitive_key`]).
//! 2. **By place**: every value of a `task_envs` or `arena_task_envs` mapping (Harness environments carry
//!    credentials under any name, `AWS_SECRET_ACCESS_KEY` or `GITHUB_PAT`), and the Streams inside
//!    `arena_streams_yaml_b64`, which are decoded, redacted by these same rules and encoded again (what cannot
//!    be decoded is withheld whole).
//! 3. **By value**: every known secret ([`Secrets`]: the credentials a run reads from its environment and its
//!    generated keys) wherever it appears in a string, say interpolated into a URL or a name by `${env:...}`,
//!    and so is every value rule 2 found that is at least [`MIN_SUBSTRING_LEN`] bytes long. A secret of that
//!    length or more is replaced wherever it occurs inside a string; a shorter known secret only where a whole
//!    string equals it, since a short value such as `1` occurs by chance inside innocent text (and a short
//!    Harness environment value such as `TRACE: 1` is no credential to hunt for elsewhere).

use std::collections::BTreeSet;
use std::fmt;

use base64::Engine as _;
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::Value;

use crate::Env;

/// What a redacted value becomes.
pub const REDACTED: &str = "<redacted>";

/// Secrets at least this long are redacted wherever they occur inside a string; shorter ones only where a
/// whole string equals them.
pub const MIN_SUBSTRING_LEN: usize = 8;

/// The environment variables that hold the run's own credentials: the Arena OpenAPI token, the key Arena's LLM
/// gateway presents, the proxy's admin key (under its default name; [`Secrets::from_env`] takes the configured
/// one too) and the policy servers' API key.
pub const SECRET_ENV_VARS: &[&str] = &[
    "ARENA_OPENAPI_TOKEN",
    "ARENA_LLM_API_KEY",
    "SWE_RL_ADMIN_API_KEY",
    "ARENA_RL_POLICY_API_KEY",
];

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

/// Whether an environment variable's name says it holds a credential: [`is_sensitive_key`], or one of its
/// `_`-separated words is `TOKEN`, `SECRET`, `PASSWORD`, `PASSWD`, `CREDENTIAL(S)`, `KEY`, `APIKEY` or `PAT`
/// (`AWS_SECRET_ACCESS_KEY`, `GITHUB_PAT`, `HF_TOKEN`). Variables that set config fields
/// (`ARENA_RL_<SECTION>__<FIELD>`) are not: their values are config values, redacted by their field's name.
pub fn is_secret_env_name(name: &str) -> bool {
    if name.starts_with(crate::ENV_PREFIX) && name.contains("__") {
        return false;
    }
    is_sensitive_key(name)
        || name.to_uppercase().split('_').any(|word| {
            matches!(
                word,
                "TOKEN"
                    | "SECRET"
                    | "PASSWORD"
                    | "PASSWD"
                    | "CREDENTIAL"
                    | "CREDENTIALS"
                    | "KEY"
                    | "APIKEY"
                    | "PAT"
            )
        })
}

/// Values that are secret wherever they appear (rule 3 of the module doc). `Debug` shows only how many.
#[derive(Clone, Default)]
pub struct Secrets {
    values: Vec<SecretString>,
}

impl Secrets {
    /// No secrets: [`redact`] then applies rules 1 and 2, and rule 3 to the values rule 2 finds.
    pub fn none() -> Self {
        Self::default()
    }

    /// The values of [`SECRET_ENV_VARS`], of the variables named in `names` (a configured admin key variable),
    /// and of every variable whose name says it holds a credential ([`is_secret_env_name`]).
    pub fn from_env(env: &Env, names: &[&str]) -> Self {
        let mut secrets = Self::none();
        for (name, value) in env.iter() {
            if SECRET_ENV_VARS.contains(&name) || names.contains(&name) || is_secret_env_name(name) {
                secrets.add(value);
            }
        }
        secrets
    }

    /// Adds a secret (a generated key, say); empty values are ignored.
    pub fn add(&mut self, value: &str) {
        if !value.is_empty() && !self.values.iter().any(|s| s.expose_secret() == value) {
            self.values.push(SecretString::from(value.to_string()));
        }
    }

    /// How many secrets are known.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether none is known.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// `text` with every secret replaced by `<redacted>` (rule 3 alone: for log lines and messages).
    pub fn redact_text(&self, text: &str) -> String {
        let mut by_length: Vec<&str> = self.values.iter().map(|s| s.expose_secret()).collect();
        // Longest first, so that a secret containing another is replaced whole.
        by_length.sort_by_key(|s| std::cmp::Reverse(s.len()));
        let mut out = text.to_string();
        for secret in by_length {
            if secret.len() >= MIN_SUBSTRING_LEN {
                if out.contains(secret) {
                    out = out.replace(secret, REDACTED);
                }
            } else if out == secret {
                return REDACTED.to_string();
            }
        }
        out
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secrets({} withheld)", self.values.len())
    }
}

/// A copy of `value` with every credential redacted by the three rules of the module doc: by name, by place
/// (`task_envs`, `arena_task_envs`, `arena_streams_yaml_b64`) and by the value of any of `secrets` or of the
/// long values found by place, at any depth of mappings and lists. Empty strings and nulls stay as they are, so a
/// reader can tell "unset" from "set"; mapping keys and the input are not modified.
pub fn redact(value: &Value, secrets: &Secrets) -> Value {
    let mut found = BTreeSet::new();
    collect_placed(value, &mut found);
    let mut all = secrets.clone();
    for value in found.iter().filter(|v| v.len() >= MIN_SUBSTRING_LEN) {
        all.add(value);
    }
    redact_with(value, &all)
}

/// Whether `key`'s mapping holds Harness environment variables, every value of which is withheld.
fn is_env_map(key: &str) -> bool {
    key == "task_envs" || key == "arena_task_envs"
}

const STREAMS_B64: &str = "arena_streams_yaml_b64";

/// Gathers the string values that rule 2 withholds, including those inside `arena_streams_yaml_b64`.
fn collect_placed(value: &Value, found: &mut BTreeSet<String>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                match v {
                    Value::Object(envs) if is_env_map(k) => {
                        found.extend(envs.values().filter_map(Value::as_str).map(str::to_string));
                    }
                    Value::String(text) if k == STREAMS_B64 => {
                        if let Some(doc) = decode_streams(text) {
                            collect_placed(&doc, found);
                        }
                    }
                    other => collect_placed(other, found),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| collect_placed(v, found)),
        _ => {}
    }
}

fn redact_with(value: &Value, secrets: &Secrets) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_unset(v) {
                        v.clone()
                    } else if is_sensitive_key(k) {
                        Value::String(REDACTED.to_string())
                    } else if is_env_map(k) {
                        match v {
                            Value::Object(envs) => Value::Object(
                                envs.iter()
                                    .map(|(name, env_value)| {
                                        let env_value = if is_unset(env_value) {
                                            env_value.clone()
                                        } else {
                                            Value::String(REDACTED.to_string())
                                        };
                                        (name.clone(), env_value)
                                    })
                                    .collect(),
                            ),
                            _ => Value::String(REDACTED.to_string()),
                        }
                    } else if k == STREAMS_B64 {
                        Value::String(redact_streams_b64(v, secrets))
                    } else {
                        redact_with(v, secrets)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(|v| redact_with(v, secrets)).collect()),
        Value::String(text) => Value::String(secrets.redact_text(text)),
        other => other.clone(),
    }
}

/// The Streams of `arena_streams_yaml_b64` as a JSON tree, if they decode and parse.
fn decode_streams(encoded: &str) -> Option<Value> {
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    serde_saphyr::from_str(std::str::from_utf8(&bytes).ok()?).ok()
}

/// `arena_streams_yaml_b64` with its Streams redacted and encoded again, or `<redacted>` when it does not
/// decode (its text is then unknown, so it is withheld whole).
fn redact_streams_b64(value: &Value, secrets: &Secrets) -> String {
    let redacted = value
        .as_str()
        .and_then(decode_streams)
        .map(|doc| redact_with(&doc, secrets))
        .and_then(|doc| serde_saphyr::to_string(&doc).ok());
    match redacted {
        Some(yaml) => base64::engine::general_purpose::STANDARD.encode(yaml.as_bytes()),
        None => REDACTED.to_string(),
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
