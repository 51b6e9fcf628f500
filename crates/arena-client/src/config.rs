//! Client configuration and the one place where the Arena environment variables are read.
//!
//! Variables: `ARENA_OPENAPI_BASE` (control-plane base URL), `ARENA_OPENAPI_TOKEN` (bearer token),
//! `ARENA_LLM_API_KEY` (the key harnesses present to Arena's LLM gateway; read only when a gateway mode needs
//! it) and `ARENA_LLM_BASE_URL` (overrides the gateway URL `{base}/api`).
//! The environment arrives as a `stream_config::Env` snapshot, so tests pass a map instead of touching the
//! process environment.

use std::fmt;
use std::time::Duration;

use secrecy::SecretString;
use stream_config::Env;

use crate::retry::RetryPolicy;
use crate::{Error, Result};

fn required(env: &Env, name: &str, why: &str) -> Result<String> {
    match env.get(name) {
        Some(v) if !v.trim().is_empty() => Ok(v.to_string()),
        _ => Err(Error::Invalid(format!("{name} is required {why}"))),
    }
}

/// The key harnesses present to Arena's LLM gateway, from `ARENA_LLM_API_KEY`.
///
/// Only the `gateway` and `session_gateway` route modes need it; stream discovery and datasets do not.
pub fn llm_api_key(env: &Env) -> Result<SecretString> {
    required(
        env,
        "ARENA_LLM_API_KEY",
        "to launch tasks in gateway or session_gateway route mode",
    )
    .map(SecretString::from)
}

/// How to reach Arena's control plane.
#[derive(Clone)]
pub struct ClientConfig {
    /// The control-plane base URL, without `/openapi/v1` and without a trailing `/`.
    pub base_url: String,
    /// The bearer token of every control-plane call.
    pub token: SecretString,
    /// Timeout of one HTTP request (default 60 s).
    pub timeout: Duration,
    /// Timeout of connecting (default: none beyond `timeout`).
    pub connect_timeout: Option<Duration>,
    /// Retries and backoff.
    pub retry: RetryPolicy,
    /// Pause between polls of a task's result (default 5 s).
    pub poll_interval: Duration,
    /// Whether to honour `HTTP(S)_PROXY` and friends (preflight turns this off).
    pub use_env_proxy: bool,
    /// The LLM gateway URL handed to harnesses; `None` means `{base_url}/api`.
    pub llm_base_url: Option<String>,
    /// Whether to send `POST /openapi/v1/tasks/{task_id}/cancel` for a task we stop waiting for (default
    /// true: a 404 or 405 then says this Arena has none, logged once). Arena's published schema has no such
    /// endpoint; with `false` no cancel is ever sent and each abandoned task is logged as left running.
    pub cancel_tasks: bool,
}

impl fmt::Debug for ClientConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientConfig")
            .field("base_url", &self.base_url)
            .field("token", &"<redacted>")
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("retry", &self.retry)
            .field("poll_interval", &self.poll_interval)
            .field("use_env_proxy", &self.use_env_proxy)
            .field("llm_base_url", &self.llm_base_url)
            .field("cancel_tasks", &self.cancel_tasks)
            .finish()
    }
}

impl ClientConfig {
    /// A configuration with the reference's defaults.
    pub fn new(base_url: &str, token: SecretString) -> Result<Self> {
        let base_url = normalise_base(base_url)?;
        Ok(Self {
            base_url,
            token,
            timeout: Duration::from_secs(60),
            connect_timeout: None,
            retry: RetryPolicy::default(),
            poll_interval: Duration::from_secs(5),
            use_env_proxy: true,
            llm_base_url: None,
            cancel_tasks: true,
        })
    }

    /// Reads `ARENA_OPENAPI_BASE`, `ARENA_OPENAPI_TOKEN` and `ARENA_LLM_BASE_URL`.
    pub fn from_env(env: &Env) -> Result<Self> {
        let base = required(env, "ARENA_OPENAPI_BASE", "(the Arena control-plane URL)")?;
        let token = required(env, "ARENA_OPENAPI_TOKEN", "(the Arena OpenAPI token)")?;
        let mut config = Self::new(&base, SecretString::from(token))?;
        if let Some(url) = env.get("ARENA_LLM_BASE_URL").filter(|u| !u.trim().is_empty()) {
            config.llm_base_url = Some(validate_llm_base_url(url)?);
        }
        Ok(config)
    }
}

/// Strips a trailing `/` (and a trailing `/openapi/v1`, which the client appends itself).
pub(crate) fn normalise_base(base_url: &str) -> Result<String> {
    let trimmed = base_url.trim().trim_end_matches('/');
    let trimmed = trimmed.strip_suffix("/openapi/v1").unwrap_or(trimmed);
    let parsed = url::Url::parse(trimmed)
        .map_err(|e| Error::Invalid(format!("invalid Arena base URL {trimmed:?}: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(Error::Invalid(format!(
            "invalid Arena base URL {trimmed:?}: expected an absolute http or https URL"
        )));
    }
    Ok(trimmed.to_string())
}

/// Checks an `ARENA_LLM_BASE_URL` override; errors never echo the value, which may carry credentials.
pub fn validate_llm_base_url(url: &str) -> Result<String> {
    let bad = |why: &str| Error::Invalid(format!("invalid Arena LLM base URL (ARENA_LLM_BASE_URL): {why}"));
    let trimmed = url.trim().trim_end_matches('/');
    let parsed = url::Url::parse(trimmed).map_err(|_| bad("not an absolute URL"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("the scheme must be http or https"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("a host is required"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("user information is not allowed"));
    }
    if parsed.query().is_some() {
        return Err(bad("a query is not allowed"));
    }
    if parsed.fragment().is_some() {
        return Err(bad("a fragment is not allowed"));
    }
    if parsed.port() == Some(0) {
        return Err(bad("the port must be within 1..65535"));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests;
