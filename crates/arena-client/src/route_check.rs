//! The route check before a run's first launch: one request through Arena's gateway to the rollout proxy.
//!
//! A temporary route names the proxy's advertised URL with a probe session's key as its upstream key, and a
//! token count (Anthropic's `count_tokens`, which generates nothing) goes to Arena's gateway under that route's
//! name. The route is deleted whatever the outcome. Proof that the address the proxy advertises is one Arena's
//! hosts can reach, which a non-loopback address alone is not.

use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};

use crate::routes::{ModelRegistration, session_route_name};
use crate::{ArenaClient, Error};

/// What the route check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteCheck {
    /// The proxy's answer came back through Arena's gateway.
    Reached,
    /// Arena does not offer route registration (404 or 405), so nothing was checked.
    NotOffered,
    /// The gateway did not bring the proxy's answer back; the text says what it answered instead.
    Failed(String),
}

impl ArenaClient {
    /// Registers a temporary route to `upstream_base_url` (the proxy) presenting `upstream_key`, sends one
    /// `count_tokens` request through Arena's gateway under it with `llm_api_key`, and deletes the route.
    /// Each call waits at most `timeout`. Errors are Arena refusing the registration for another reason.
    pub async fn check_route(
        &self,
        upstream_base_url: &str,
        upstream_key: &SecretString,
        llm_api_key: &SecretString,
        timeout: Duration,
    ) -> crate::Result<RouteCheck> {
        let (model_name, deployment_id) = session_route_name();
        let registration = ModelRegistration {
            model_name: model_name.clone(),
            deployment_id,
            upstream_base_url: upstream_base_url.to_string(),
            upstream_api_key: upstream_key.clone(),
            inbound_protos: vec!["anthropic".to_string()],
        };
        let gateway = match self.register_model(&registration, Some(timeout)).await {
            Err(Error::Http {
                status: 404 | 405, ..
            }) => return Ok(RouteCheck::NotOffered),
            Err(e) => return Err(e),
            Ok(gateway) => gateway,
        };
        let answer = self
            .count_through_gateway(&gateway, &model_name, llm_api_key, timeout)
            .await;
        if let Err(e) = self.delete_model(&model_name, Some(timeout)).await {
            tracing::warn!(model_name, error = %e, "route check: deleting the probe route failed");
        }
        Ok(answer)
    }

    /// `POST {gateway}/v1/messages/count_tokens` for `model`.
    async fn count_through_gateway(
        &self,
        gateway: &str,
        model: &str,
        llm_api_key: &SecretString,
        timeout: Duration,
    ) -> RouteCheck {
        let url = format!("{}/v1/messages/count_tokens", gateway.trim_end_matches('/'));
        let body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "route check"}],
        });
        let sent = self
            .inner
            .http
            .post(&url)
            .bearer_auth(llm_api_key.expose_secret())
            .header("x-api-key", llm_api_key.expose_secret())
            .header("anthropic-version", "2023-06-01")
            .json(&body)
            .timeout(timeout)
            .send()
            .await;
        let response = match sent {
            Ok(r) => r,
            Err(e) => return RouteCheck::Failed(format!("{url}: {e}")),
        };
        let status = response.status();
        let text = response.text().await.unwrap_or_default();
        let counted = serde_json::from_str::<serde_json::Value>(&text)
            .ok()
            .and_then(|v| v.get("input_tokens").and_then(serde_json::Value::as_u64));
        match counted {
            Some(n) if status.is_success() && n > 0 => RouteCheck::Reached,
            _ => {
                let snippet: String = text.chars().take(200).collect::<String>().replace('\n', " ");
                RouteCheck::Failed(format!("{status} from {url}: {snippet}"))
            }
        }
    }
}
