//! The rollout proxy's session control, over its HTTP control endpoints on loopback with the admin key
//! (reference section 6.4): grant capacity, start a session, set its reward, end it, export it.
//!
//! The proxy has no in-process control API, so the workflow talks to the server it started the same way an
//! out-of-process workflow would. Transient failures (connection errors, 408/429/502/503/504) are retried a
//! few times, as the reference retries `end_session`.

use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use rollout_proxy::ExportedSession;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use serde_json::{Value, json};

/// A started session: its id and its own key.
pub struct Session {
    /// The session id (`<task_id>-<suffix>`).
    pub id: String,
    /// The session's proxy key.
    pub key: SecretString,
}

/// What `end_session` reports.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct EndReport {
    /// Interactions the session recorded.
    #[serde(default)]
    pub interaction_count: u64,
    /// A request overflowed the context window.
    #[serde(default)]
    pub context_overflow: bool,
    /// The proxy answered a request with an internal error.
    #[serde(default)]
    pub system_error: bool,
}

/// The control client of one proxy.
#[derive(Clone)]
pub struct ProxyControl {
    http: reqwest::Client,
    base: String,
    admin_key: SecretString,
}

const ATTEMPTS: u32 = 4;

impl ProxyControl {
    /// A client for the proxy at `base` (`http://127.0.0.1:PORT`).
    pub fn new(base: &str, admin_key: SecretString) -> Result<Self> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(3600))
            .build()
            .context("building the proxy control client")?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            admin_key,
        })
    }

    /// The proxy's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        let url = format!("{}{path}", self.base);
        let mut last = None;
        for attempt in 0..ATTEMPTS {
            if attempt > 0 {
                tokio::time::sleep(Duration::from_millis(100 << attempt)).await;
            }
            let sent = self
                .http
                .post(&url)
                .bearer_auth(self.admin_key.expose_secret())
                .json(&body)
                .send()
                .await;
            let response = match sent {
                Ok(r) => r,
                Err(e) => {
                    last = Some(anyhow!("POST {path}: {e}"));
                    continue;
                }
            };
            let status = response.status().as_u16();
            let text = response.text().await.unwrap_or_default();
            if (200..300).contains(&status) {
                return serde_json::from_str(&text)
                    .with_context(|| format!("POST {path}: the proxy answered something that is not JSON"));
            }
            let err = anyhow!(
                "POST {path}: the proxy answered HTTP {status}: {}",
                snippet(&text)
            );
            if matches!(status, 408 | 429 | 502 | 503 | 504) {
                last = Some(err);
                continue;
            }
            return Err(err);
        }
        Err(last.unwrap_or_else(|| anyhow!("POST {path}: no attempt was made")))
    }

    /// `POST /grant_capacity`: one more session may start.
    pub async fn grant(&self) -> Result<()> {
        self.post("/grant_capacity", json!({})).await.map(|_| ())
    }

    /// `POST /rl/start_session` for `task_id`.
    pub async fn start(&self, task_id: &str) -> Result<Session> {
        let reply = self
            .post("/rl/start_session", json!({"task_id": task_id}))
            .await?;
        let id = reply["session_id"]
            .as_str()
            .ok_or_else(|| anyhow!("start_session answered without a session_id"))?
            .to_string();
        let key = reply["api_key"]
            .as_str()
            .ok_or_else(|| anyhow!("start_session answered without an api_key"))?;
        Ok(Session {
            id,
            key: SecretString::from(key.to_string()),
        })
    }

    /// `POST /rl/end_session` for `session_id` (admin).
    pub async fn end(&self, session_id: &str) -> Result<EndReport> {
        let reply = self
            .post("/rl/end_session", json!({"session_id": session_id}))
            .await?;
        serde_json::from_value(reply).context("end_session answered an unexpected body")
    }

    /// `POST /rl/set_reward` on the session's last interaction (admin).
    pub async fn set_reward(&self, session_id: &str, reward: f64) -> Result<()> {
        if !reward.is_finite() {
            bail!("reward {reward} is not finite");
        }
        self.post(
            "/rl/set_reward",
            json!({"session_id": session_id, "reward": reward}),
        )
        .await
        .map(|_| ())
    }

    /// `POST /export_trajectories`: the session's trajectories; the proxy forgets the session.
    pub async fn export(
        &self,
        session_id: &str,
        style: rollout_proxy::ExportStyle,
        discount: f64,
        final_reward: Option<f64>,
    ) -> Result<ExportedSession> {
        let mut body = json!({"session_id": session_id, "style": style, "discount": discount});
        if let Some(r) = final_reward {
            body["final_reward"] = json!(r);
        }
        let reply = self.post("/export_trajectories", body).await?;
        serde_json::from_value(reply).context("export_trajectories answered an unexpected body")
    }

    /// `GET /health`'s `live_sessions`.
    pub async fn live_sessions(&self) -> Result<u64> {
        let reply: Value = self
            .http
            .get(format!("{}/health", self.base))
            .send()
            .await
            .context("GET /health")?
            .json()
            .await
            .context("GET /health answered something that is not JSON")?;
        reply["live_sessions"]
            .as_u64()
            .ok_or_else(|| anyhow!("GET /health answered without live_sessions"))
    }
}

fn snippet(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}
