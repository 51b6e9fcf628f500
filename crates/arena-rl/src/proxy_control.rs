//! The rollout proxy's session control, over its HTTP control endpoints on loopback with the admin key
//! (reference section 6.4): grant capacity, start a session, set its reward, end it, export it.
//!
//! The proxy has no in-process control API, so the workflow talks to the server it started the same way an
//! out-of-process workflow would, with the proxy's own wire types ([`rollout_proxy::control::wire`]).
//!
//! Retries follow what a failure says about whether the proxy acted on the request.
//! A connect error (nothing was sent) and a refusal the proxy answers before acting (408, 429, 503) are
//! retried for every call. A failure after the request may have been read (a timeout, a connection that
//! broke before the reply, 502 or 504 from something in between) is retried only for the idempotent calls,
//! where a second delivery changes nothing:
//!
//! - idempotent: `set_reward` (sets the same value on the same interaction again; after `end_session` no
//!   new interaction can arrive), `end_session` (ending an ended session answers the same flags, as the
//!   reference's workflow relies on when it retries it), and `GET /health`;
//! - not idempotent: `grant_capacity` (each delivery adds one more session of capacity), `start_session`
//!   (each delivery creates a session and spends capacity), `export_trajectories` (the proxy forgets the
//!   session once exported, so a second delivery cannot return what the first one took).

use std::time::Duration;

use rollout_proxy::ExportStyle;
use rollout_proxy::control::wire::{
    EndSessionReply, EndSessionRequest, ExportReply, ExportRequest, GrantCapacityReply, GrantCapacityRequest,
    HealthReply, IntegritySelection, SetRewardReply, SetRewardRequest, StartSessionReply,
    StartSessionRequest,
};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A started session: its id and its own key.
pub type Session = StartSessionReply;

/// How a request failed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The connection could not be established: the request never left.
    Connect,
    /// The request or its reply took longer than the client's timeout.
    Timeout,
    /// Anything else after connecting (a connection broken before the reply, a reply cut short).
    Other,
}

impl TransportKind {
    fn of(e: &reqwest::Error) -> Self {
        if e.is_connect() {
            Self::Connect
        } else if e.is_timeout() {
            Self::Timeout
        } else {
            Self::Other
        }
    }
}

impl std::fmt::Display for TransportKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Connect => "connect error",
            Self::Timeout => "timeout",
            Self::Other => "connection failed before the reply",
        })
    }
}

/// An error of the proxy control client.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// The HTTP client could not be built.
    #[error("cannot build the proxy control client")]
    Build(#[source] reqwest::Error),
    /// No reply after every allowed attempt.
    #[error("{call}: no reply from the proxy after {attempts} attempt(s): {kind}")]
    Transport {
        /// The call, e.g. `POST /rl/end_session`.
        call: &'static str,
        /// Attempts made.
        attempts: u32,
        /// How the last attempt failed.
        kind: TransportKind,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// The proxy answered with an error status.
    #[error("{call}: the proxy answered HTTP {status} after {attempts} attempt(s): {body}")]
    Status {
        /// The call.
        call: &'static str,
        /// The HTTP status of the last answer.
        status: u16,
        /// Attempts made.
        attempts: u32,
        /// The start of the answer's body.
        body: String,
    },
    /// The proxy answered with success, but not with the call's reply type.
    #[error("{call}: the proxy's reply is not a {reply}")]
    Reply {
        /// The call.
        call: &'static str,
        /// The expected reply type.
        reply: &'static str,
        /// Why it does not parse.
        #[source]
        source: serde_json::Error,
    },
    /// A reward that is not finite, refused before sending.
    #[error("reward {0} is not finite")]
    NonFiniteReward(f64),
}

/// Whether a second delivery of a call changes nothing (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Delivery {
    Idempotent,
    AtMostOnce,
}

/// How one attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    Transport(TransportKind),
    Status(u16),
}

/// Whether `failure` may be retried for a call of `delivery`.
fn retryable(delivery: Delivery, failure: Failure) -> bool {
    match failure {
        // Nothing was sent, or the proxy refused before acting.
        Failure::Transport(TransportKind::Connect) | Failure::Status(408 | 429 | 503) => true,
        // The proxy may have acted.
        Failure::Transport(TransportKind::Timeout | TransportKind::Other) | Failure::Status(502 | 504) => {
            delivery == Delivery::Idempotent
        }
        Failure::Status(_) => false,
    }
}

/// The control client of one proxy.
#[derive(Clone)]
pub struct ProxyControl {
    http: reqwest::Client,
    base: String,
    admin_key: SecretString,
    attempts: u32,
    first_backoff: Duration,
}

impl ProxyControl {
    /// A client for the proxy at `base` (`http://127.0.0.1:PORT`): 4 attempts, backoff from 200 ms.
    pub fn new(base: &str, admin_key: SecretString) -> Result<Self, ControlError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(3600))
            .build()
            .map_err(ControlError::Build)?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_string(),
            admin_key,
            attempts: 4,
            first_backoff: Duration::from_millis(200),
        })
    }

    /// The same client with at most `attempts` attempts per call (at least 1), waiting `first_backoff`
    /// before the first retry and twice as long before each further one.
    #[must_use]
    pub fn with_retries(mut self, attempts: u32, first_backoff: Duration) -> Self {
        self.attempts = attempts.max(1);
        self.first_backoff = first_backoff;
        self
    }

    /// The proxy's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        call: &'static str,
        delivery: Delivery,
        body: Option<&B>,
    ) -> Result<R, ControlError> {
        let (method, path) = call.split_once(' ').expect("calls are `METHOD /path`");
        let url = format!("{}{path}", self.base);
        let mut attempt = 0;
        loop {
            if attempt > 0 {
                tokio::time::sleep(
                    self.first_backoff
                        .saturating_mul(2u32.saturating_pow(attempt - 1)),
                )
                .await;
            }
            attempt += 1;
            let mut request = if method == "GET" {
                self.http.get(&url)
            } else {
                self.http.post(&url).bearer_auth(self.admin_key.expose_secret())
            };
            if let Some(body) = body {
                request = request.json(body);
            }
            let (failure, error) = match request.send().await {
                Ok(response) => {
                    let status = response.status().as_u16();
                    match response.text().await {
                        Ok(text) if (200..300).contains(&status) => {
                            return serde_json::from_str(&text).map_err(|source| ControlError::Reply {
                                call,
                                reply: std::any::type_name::<R>().rsplit("::").next().unwrap_or("reply"),
                                source,
                            });
                        }
                        Ok(text) => (
                            Failure::Status(status),
                            ControlError::Status {
                                call,
                                status,
                                attempts: attempt,
                                body: snippet(&text),
                            },
                        ),
                        Err(source) => transport(call, attempt, source),
                    }
                }
                Err(source) => transport(call, attempt, source),
            };
            if attempt >= self.attempts || !retryable(delivery, failure) {
                return Err(error);
            }
            tracing::debug!(call, attempt, error = %error, "retrying a proxy control call");
        }
    }

    /// `POST /grant_capacity`: one more session may start.
    pub async fn grant(&self) -> Result<GrantCapacityReply, ControlError> {
        self.call(
            "POST /grant_capacity",
            Delivery::AtMostOnce,
            Some(&GrantCapacityRequest::default()),
        )
        .await
    }

    /// `POST /rl/start_session` for `task_id`, with the proxy's default integrity rules.
    pub async fn start(&self, task_id: &str) -> Result<Session, ControlError> {
        self.start_with(task_id, None).await
    }

    /// `POST /rl/start_session` for `task_id`, naming the integrity profile and base commit to scan with; a
    /// base commit also goes into the session's metadata, so the exported trajectories carry it for a later
    /// audit (`arena-rl guard check`).
    pub async fn start_with(
        &self,
        task_id: &str,
        integrity: Option<IntegritySelection>,
    ) -> Result<Session, ControlError> {
        let metadata = integrity
            .as_ref()
            .and_then(|i| i.base_commit.as_ref())
            .map(|b| serde_json::json!({ "base_commit": b }));
        let request = StartSessionRequest {
            integrity,
            metadata,
            ..StartSessionRequest::new(task_id)
        };
        self.call("POST /rl/start_session", Delivery::AtMostOnce, Some(&request))
            .await
    }

    /// `POST /rl/end_session` for `session_id` (admin).
    pub async fn end(&self, session_id: &str) -> Result<EndSessionReply, ControlError> {
        let request = EndSessionRequest {
            session_id: Some(session_id.to_string()),
        };
        self.call("POST /rl/end_session", Delivery::Idempotent, Some(&request))
            .await
    }

    /// `POST /rl/set_reward` on the session's last interaction (admin).
    pub async fn set_reward(&self, session_id: &str, reward: f64) -> Result<SetRewardReply, ControlError> {
        if !reward.is_finite() {
            return Err(ControlError::NonFiniteReward(reward));
        }
        let request = SetRewardRequest {
            session_id: Some(session_id.to_string()),
            interaction_id: None,
            reward,
        };
        self.call("POST /rl/set_reward", Delivery::Idempotent, Some(&request))
            .await
    }

    /// `POST /export_trajectories`: the session's trajectories; the proxy forgets the session.
    /// `episode_reward`, sent only when it is `Some`, asks the proxy to score every chain of a `concat`
    /// export with it when the session's graph is unambiguous.
    pub async fn export(
        &self,
        session_id: &str,
        style: ExportStyle,
        discount: f64,
        final_reward: Option<f64>,
        episode_reward: Option<f64>,
    ) -> Result<ExportReply, ControlError> {
        let request = ExportRequest {
            discount,
            final_reward,
            episode_reward,
            ..ExportRequest::new(session_id, style)
        };
        self.call("POST /export_trajectories", Delivery::AtMostOnce, Some(&request))
            .await
    }

    /// `GET /health`.
    pub async fn health(&self) -> Result<HealthReply, ControlError> {
        self.call::<(), _>("GET /health", Delivery::Idempotent, None)
            .await
    }

    /// `GET /health`'s `live_sessions`.
    pub async fn live_sessions(&self) -> Result<u64, ControlError> {
        Ok(self.health().await?.live_sessions)
    }
}

fn transport(call: &'static str, attempts: u32, source: reqwest::Error) -> (Failure, ControlError) {
    let kind = TransportKind::of(&source);
    (
        Failure::Transport(kind),
        ControlError::Transport {
            call,
            attempts,
            kind,
            source,
        },
    )
}

fn snippet(text: &str) -> String {
    let text = text.trim();
    match text.char_indices().nth(300) {
        Some((i, _)) => format!("{}...", &text[..i]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests;
