//! LLM routes on Arena's gateway (E6, E7, E8, E11): the registration payload of reference section 5.1,
//! generated names, and the launch environment each route mode adds (section 5.2).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use rand::RngExt;
use reqwest::Method;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Value, json};

use crate::client::{ArenaClient, Call, encode_segment, unwrap_data};
use crate::{Error, Result};

/// Every gateway model name this client registers starts with this.
pub const MODEL_NAME_PREFIX: &str = "stream-areal-";

fn random_hex(chars: usize) -> String {
    let mut rng = rand::rng();
    (0..chars)
        .map(|_| char::from_digit(rng.random_range(0..16u32), 16).unwrap_or('0'))
        .collect()
}

/// A random UUID (version 4) in its usual text form.
pub fn random_uuid() -> String {
    let mut bytes: [u8; 16] = rand::rng().random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `stream-areal-<12 hex>`: a per-rollout gateway model, or the unregistered label of direct mode.
pub fn rollout_model_name() -> String {
    format!("{MODEL_NAME_PREFIX}{}", random_hex(12))
}

/// `(stream-areal-session-<16 hex>, session-<same 16 hex>)`: a rollout worker's shared route and its
/// deployment id.
pub fn session_route_name() -> (String, String) {
    let hex = random_hex(16);
    (
        format!("{MODEL_NAME_PREFIX}session-{hex}"),
        format!("session-{hex}"),
    )
}

/// What to register: one upstream (the rollout proxy) under one gateway model name.
#[derive(Clone)]
pub struct ModelRegistration {
    /// The gateway model name; must start with `stream-areal-`.
    pub model_name: String,
    /// The endpoint and deployment id.
    pub deployment_id: String,
    /// The upstream's URL (the rollout proxy); a trailing `/` is stripped.
    pub upstream_base_url: String,
    /// The key the gateway presents upstream.
    pub upstream_api_key: SecretString,
    /// Protocols the gateway may send upstream (`econfig.arena_inbound_protos`, default `["chat"]`).
    pub inbound_protos: Vec<String>,
}

impl fmt::Debug for ModelRegistration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ModelRegistration")
            .field("model_name", &self.model_name)
            .field("deployment_id", &self.deployment_id)
            .field("upstream_base_url", &self.upstream_base_url)
            .field("upstream_api_key", &"<redacted>")
            .field("inbound_protos", &self.inbound_protos)
            .finish()
    }
}

impl ModelRegistration {
    /// The E6 body (reference section 5.1).
    pub fn payload(&self) -> Result<Value> {
        if !self.model_name.starts_with(MODEL_NAME_PREFIX) {
            return Err(Error::Invalid(format!(
                "LLM route model_name {:?} must start with {MODEL_NAME_PREFIX:?}",
                self.model_name
            )));
        }
        if self.inbound_protos.is_empty() {
            return Err(Error::Invalid(
                "arena_inbound_protos must name at least one protocol".to_string(),
            ));
        }
        Ok(json!({
            "model_name": self.model_name,
            "endpoints": [{
                "endpoint_id": self.deployment_id,
                "upstream_model": self.model_name,
                "base_url": self.upstream_base_url.trim_end_matches('/'),
                "api_key": self.upstream_api_key.expose_secret(),
                "inbound_protos": self.inbound_protos,
                "enabled": true,
            }],
            "enabled": true,
            "metadata": {"deployment_id": self.deployment_id},
        }))
    }
}

fn check_model_name(op: &str, body: &Value, expected: &str) -> Result<()> {
    let data = unwrap_data(body);
    match data.get("model_name").and_then(Value::as_str) {
        Some(name) if name == expected => Ok(()),
        other => Err(Error::malformed(
            op,
            format!(
                "unexpected model_name {} for {expected:?}",
                other.map_or_else(|| "nothing".to_string(), |n| format!("{n:?}"))
            ),
        )),
    }
}

impl ArenaClient {
    /// E6: registers a route and returns the gateway URL harnesses use.
    pub async fn register_model(
        &self,
        registration: &ModelRegistration,
        timeout: Option<Duration>,
    ) -> Result<String> {
        let payload = registration.payload()?;
        let call = Call::new(Method::POST, "/llm/models".to_string())
            .json(&payload)
            .timeout(timeout);
        let op = call.op();
        let reply = self.send(&call).await?;
        if !matches!(reply.status, 200 | 201) {
            return Err(reply.status_error());
        }
        let body = reply.json()?;
        check_model_name(&op, &body, &registration.model_name)?;
        Ok(self.llm_gateway_url().to_string())
    }

    /// E7: whether a route exists (404 means absent).
    pub async fn model_exists(&self, model_name: &str, timeout: Option<Duration>) -> Result<bool> {
        let call =
            Call::new(Method::GET, format!("/llm/models/{}", encode_segment(model_name))).timeout(timeout);
        self.route_present(&call, model_name).await
    }

    /// Sends a call about one route: 404 means absent; otherwise the reply must name the route.
    async fn route_present(&self, call: &Call<'_>, model_name: &str) -> Result<bool> {
        let reply = self.send(call).await?;
        if reply.status == 404 {
            return Ok(false);
        }
        let body = reply.json()?;
        check_model_name(&call.op(), &body, model_name)?;
        Ok(true)
    }

    /// E8: deletes a route; 404 and every 2xx are success.
    pub async fn delete_model(&self, model_name: &str, timeout: Option<Duration>) -> Result<()> {
        let call = Call::new(
            Method::DELETE,
            format!("/llm/models/{}", encode_segment(model_name)),
        )
        .timeout(timeout);
        let reply = self.send(&call).await?;
        if reply.status == 404 || reply.is_success() {
            Ok(())
        } else {
            Err(reply.status_error())
        }
    }

    /// E11: renews a live route; `false` when Arena no longer has it (re-register under the same name).
    pub async fn renew_model(&self, model_name: &str, timeout: Option<Duration>) -> Result<bool> {
        let body = json!({});
        let call = Call::new(
            Method::PATCH,
            format!("/llm/models/{}", encode_segment(model_name)),
        )
        .json(&body)
        .timeout(timeout);
        self.route_present(&call, model_name).await
    }
}

impl ArenaClient {
    /// Deletes a route whose registration POST was abandoned in flight. The POST may still land after a
    /// first delete found nothing, so the route is looked for again, at growing intervals, until `timeout`
    /// (the registration deadline) has passed, and deleted whenever it is there.
    pub(crate) async fn delete_abandoned_route(&self, name: &str, timeout: Duration) {
        let started = tokio::time::Instant::now();
        let mut wait = Duration::from_millis(100);
        loop {
            match self.delete_model(name, Some(timeout)).await {
                Ok(()) => {}
                Err(e) => {
                    tracing::warn!(model_name = %name, error = %e, "background LLM route cleanup failed")
                }
            }
            if started.elapsed() + wait > timeout {
                return;
            }
            tokio::time::sleep(wait).await;
            wait = (wait * 2).min(Duration::from_secs(10));
            match self.model_exists(name, Some(timeout)).await {
                Ok(false) => {}
                Ok(true) => {
                    tracing::info!(model_name = %name, "an abandoned LLM route registration landed late; deleting it");
                    continue;
                }
                Err(e) => {
                    tracing::warn!(model_name = %name, error = %e, "cannot look for an abandoned LLM route")
                }
            }
            if started.elapsed() + wait > timeout {
                return;
            }
        }
    }
}

/// `session_gateway` mode's addition: the session headers appended to `ANTHROPIC_CUSTOM_HEADERS`.
pub fn session_gateway_envs(
    envs: &mut BTreeMap<String, String>,
    session_id: &str,
    session_token: &SecretString,
) {
    let headers = format!(
        "X-Session-Id: {session_id}\nX-Session-Token: {}",
        session_token.expose_secret()
    );
    let value = match envs.get("ANTHROPIC_CUSTOM_HEADERS").filter(|v| !v.is_empty()) {
        Some(existing) => format!("{existing}\n{headers}"),
        None => headers,
    };
    envs.insert("ANTHROPIC_CUSTOM_HEADERS".to_string(), value);
}

/// `direct` mode's additions: both SDKs pointed at the proxy with the session key, and the proxy host added
/// to `NO_PROXY`/`no_proxy` so the sandbox's egress proxy is bypassed.
pub fn direct_envs(envs: &mut BTreeMap<String, String>, proxy_base_url: &str, session_key: &SecretString) {
    for name in ["ANTHROPIC_BASE_URL", "OPENAI_BASE_URL"] {
        envs.insert(name.to_string(), proxy_base_url.to_string());
    }
    for name in ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"] {
        envs.insert(name.to_string(), session_key.expose_secret().to_string());
    }
    let configured = envs
        .get("NO_PROXY")
        .filter(|v| !v.is_empty())
        .or_else(|| envs.get("no_proxy"))
        .cloned()
        .unwrap_or_default();
    let mut hosts: Vec<String> = configured
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(host) = url::Url::parse(proxy_base_url)
        .ok()
        .and_then(|u| u.host_str().map(str::to_string))
    {
        let host = host.trim_start_matches('[').trim_end_matches(']').to_string();
        if !hosts.contains(&host) {
            hosts.push(host);
        }
    }
    let joined = hosts.join(",");
    envs.insert("NO_PROXY".to_string(), joined.clone());
    envs.insert("no_proxy".to_string(), joined);
}

#[cfg(test)]
mod tests;
