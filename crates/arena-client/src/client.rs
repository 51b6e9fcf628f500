//! The client core: one pooled HTTP client, URL building with encoded path segments, the retry loop and
//! the JSON reply rules shared by every endpoint.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use bytes::Bytes;
use percent_encoding::{AsciiSet, NON_ALPHANUMERIC, utf8_percent_encode};
use reqwest::Method;
use secrecy::{ExposeSecret, SecretString};
use serde_json::Value;

use crate::config::ClientConfig;
use crate::error::TransportKind;
use crate::retry::{Delivery, RetryPolicy, retry_status, retry_transport, status_is_transient};
use crate::{Error, Result};

/// Python's `quote(s, safe="")`: everything but letters, digits and `_.-~` is encoded, `/` included.
const SEGMENT: &AsciiSet = &NON_ALPHANUMERIC
    .remove(b'_')
    .remove(b'.')
    .remove(b'-')
    .remove(b'~');

/// Percent-encodes one path segment with no safe characters.
pub fn encode_segment(segment: &str) -> String {
    utf8_percent_encode(segment, SEGMENT).to_string()
}

/// The Arena OpenAPI client. Cheap to clone: clones share one connection pool.
#[derive(Clone)]
pub struct ArenaClient {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) http: reqwest::Client,
    base: String,
    token: SecretString,
    retry: RetryPolicy,
    pub(crate) poll_interval: Duration,
    llm_base_url: String,
    /// `ClientConfig::cancel_tasks`.
    pub(crate) cancel_tasks: bool,
    /// Set once an Arena without the cancel endpoint was seen, so the warning is logged once.
    pub(crate) cancel_unsupported: AtomicBool,
}

impl fmt::Debug for ArenaClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ArenaClient")
            .field("base_url", &self.inner.base)
            .field("retry", &self.inner.retry)
            .finish_non_exhaustive()
    }
}

/// One request to send.
pub(crate) struct Call<'a> {
    pub(crate) method: Method,
    /// Path below `{base}/openapi/v1`, segments already encoded.
    pub(crate) path: String,
    pub(crate) query: Vec<(&'static str, String)>,
    pub(crate) body: Option<&'a Value>,
    pub(crate) delivery: Delivery,
    pub(crate) idempotency_key: Option<&'a str>,
    pub(crate) timeout: Option<Duration>,
}

impl<'a> Call<'a> {
    pub(crate) fn new(method: Method, path: String) -> Self {
        Self {
            method,
            path,
            query: Vec::new(),
            body: None,
            delivery: Delivery::Repeatable,
            idempotency_key: None,
            timeout: None,
        }
    }

    pub(crate) fn query(mut self, name: &'static str, value: impl ToString) -> Self {
        self.query.push((name, value.to_string()));
        self
    }

    pub(crate) fn json(mut self, body: &'a Value) -> Self {
        self.body = Some(body);
        self
    }

    pub(crate) fn timeout(mut self, timeout: Option<Duration>) -> Self {
        self.timeout = timeout;
        self
    }

    /// The operation label used in errors and logs: method and path (never a header or body).
    pub(crate) fn op(&self) -> String {
        format!("{} /openapi/v1{}", self.method, self.path)
    }
}

/// A reply: status and body.
pub(crate) struct Reply {
    pub(crate) op: String,
    pub(crate) status: u16,
    pub(crate) body: Bytes,
}

impl Reply {
    pub(crate) fn is_success(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// The error for an unexpected status.
    pub(crate) fn status_error(&self) -> Error {
        let text = String::from_utf8_lossy(&self.body);
        Error::Http {
            op: self.op.clone(),
            status: self.status,
            body: text.chars().take(500).collect(),
            retryable: status_is_transient(self.status, &self.body),
        }
    }

    /// The JSON body of a 2xx reply.
    pub(crate) fn json(&self) -> Result<Value> {
        if !self.is_success() {
            return Err(self.status_error());
        }
        serde_json::from_slice(&self.body).map_err(|_| Error::NonJson { op: self.op.clone() })
    }
}

impl ArenaClient {
    /// Builds the client and its connection pool.
    pub fn new(config: ClientConfig) -> Result<Self> {
        // reqwest is built without a bundled TLS provider; ring is ours. An error only means a provider is
        // already installed, which is all we need.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .pool_idle_timeout(Duration::from_secs(30));
        if let Some(t) = config.connect_timeout {
            builder = builder.connect_timeout(t);
        }
        if !config.use_env_proxy {
            builder = builder.no_proxy();
        }
        let http = builder
            .build()
            .map_err(|e| Error::Invalid(format!("cannot build the HTTP client: {e}")))?;
        let llm_base_url = config
            .llm_base_url
            .clone()
            .unwrap_or_else(|| format!("{}/api", config.base_url));
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                base: config.base_url,
                token: config.token,
                retry: config.retry,
                poll_interval: config.poll_interval,
                llm_base_url,
                cancel_tasks: config.cancel_tasks,
                cancel_unsupported: AtomicBool::new(false),
            }),
        })
    }

    /// The control-plane base URL (without `/openapi/v1`).
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// The LLM gateway URL handed to harnesses: `{base}/api`, or the `ARENA_LLM_BASE_URL` override.
    pub fn llm_gateway_url(&self) -> &str {
        &self.inner.llm_base_url
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> &RetryPolicy {
        &self.inner.retry
    }

    /// Sends a call with the retry policy and returns the final reply, whatever its status.
    pub(crate) async fn send(&self, call: &Call<'_>) -> Result<Reply> {
        let op = call.op();
        let url = format!("{}/openapi/v1{}", self.inner.base, call.path);
        let attempts = self.inner.retry.attempts();
        let mut attempt = 0;
        loop {
            let last = attempt + 1 >= attempts;
            let mut request = self
                .inner
                .http
                .request(call.method.clone(), &url)
                .bearer_auth(self.inner.token.expose_secret());
            if !call.query.is_empty() {
                request = request.query(&call.query);
            }
            if let Some(body) = call.body {
                request = request.json(body);
            }
            if let Some(key) = call.idempotency_key {
                request = request.header("Idempotency-Key", key);
            }
            if let Some(timeout) = call.timeout {
                request = request.timeout(timeout);
            }
            let outcome = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    response.bytes().await.map(|body| (status, body))
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok((status, body)) => {
                    if last || !retry_status(status, &body, call.delivery) {
                        tracing::debug!(%op, status, attempt, "arena request done");
                        return Ok(Reply { op, status, body });
                    }
                    let delay = self.inner.retry.delay(attempt);
                    tracing::warn!(%op, status, attempt, delay_ms = delay.as_millis() as u64,
                        "arena request got a transient status; retrying");
                    tokio::time::sleep(delay).await;
                }
                Err(source) => {
                    let kind = TransportKind::of(&source);
                    if last || !retry_transport(&source, call.delivery) {
                        tracing::debug!(%op, %kind, attempt, "arena request failed");
                        return Err(Error::Transport {
                            op,
                            attempts: attempt + 1,
                            kind,
                            source,
                        });
                    }
                    let delay = self.inner.retry.delay(attempt);
                    tracing::warn!(%op, %kind, attempt, delay_ms = delay.as_millis() as u64,
                        "arena request failed in transport; retrying");
                    tokio::time::sleep(delay).await;
                }
            }
            attempt += 1;
        }
    }

    /// Sends a call and returns the JSON body of a 2xx reply.
    pub(crate) async fn send_json(&self, call: &Call<'_>) -> Result<Value> {
        self.send(call).await?.json()
    }
}

/// Takes `data` if it is present and an object.
pub(crate) fn unwrap_data(value: &Value) -> &Value {
    match value.get("data") {
        Some(inner @ Value::Object(_)) => inner,
        _ => value,
    }
}

#[cfg(test)]
mod tests;
