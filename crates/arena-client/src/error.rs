//! The error type of `arena-client`: what failed, who failed (transport, Arena, a malformed reply, or us),
//! and whether trying again may help.

use std::fmt;

use crate::tasks::TaskFailed;

/// Who is to blame for an [`Error`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Party {
    /// The network: no usable reply arrived (connect failure, timeout, broken connection).
    Transport,
    /// Arena answered, and the answer was a refusal or a failure (an HTTP error, a failed task, a stream
    /// that is not ready).
    Arena,
    /// Arena answered something that breaks the wire contract.
    MalformedResponse,
    /// Our side: bad input or configuration, our own deadline, a closed registry.
    Us,
}

/// How a request failed on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportKind {
    /// The connection could not be established; the request never left.
    Connect,
    /// The request or its reply took longer than the client timeout.
    Timeout,
    /// The reply's body broke off (a lost response).
    Body,
    /// Any other failure while sending the request or reading the reply's head.
    Request,
}

impl TransportKind {
    pub(crate) fn of(e: &reqwest::Error) -> Self {
        if e.is_connect() {
            Self::Connect
        } else if e.is_timeout() {
            Self::Timeout
        } else if e.is_body() || e.is_decode() {
            Self::Body
        } else {
            Self::Request
        }
    }
}

impl fmt::Display for TransportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Connect => "connect error",
            Self::Timeout => "timeout",
            Self::Body => "response body error",
            Self::Request => "request error",
        })
    }
}

fn plural(n: &u32) -> &'static str {
    if *n == 1 { "" } else { "s" }
}

/// An error from talking to Arena.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No usable reply after every allowed attempt.
    #[error("{op}: request failed after {attempts} attempt{}: {kind}", plural(attempts))]
    Transport {
        /// The operation, e.g. `GET /openapi/v1/streams/s1`.
        op: String,
        /// Attempts made.
        attempts: u32,
        /// How the last attempt failed.
        kind: TransportKind,
        /// The underlying error.
        #[source]
        source: reqwest::Error,
    },
    /// Arena answered with an unexpected HTTP status.
    #[error("{op}: Arena OpenAPI returned HTTP {status}: {body}")]
    Http {
        /// The operation.
        op: String,
        /// The status code.
        status: u16,
        /// The first 500 characters of the body.
        body: String,
        /// Whether the status is one the retry policy retries (429, 5xx, the marker 403).
        retryable: bool,
    },
    /// A 2xx reply whose body is not JSON.
    #[error("{op}: returned a non-JSON response")]
    NonJson {
        /// The operation.
        op: String,
    },
    /// A reply that breaks the wire contract; the message names the field.
    #[error("{op}: {message}")]
    Malformed {
        /// The operation.
        op: String,
        /// What is wrong.
        message: String,
    },
    /// Arena ran the task and it failed.
    #[error(transparent)]
    TaskFailed(Box<TaskFailed>),
    /// Arena's state refuses what we asked (a stream that is not active, a drifted reward ref, an unpublished
    /// harness, an empty dataset, an unhealthy stream).
    #[error("{0}")]
    Rejected(String),
    /// Our own deadline passed before the task finished.
    #[error("timed out: task_id={}, data_id={data_id}, timeout_seconds={timeout_seconds}",
            task_id.as_deref().unwrap_or("<not launched>"))]
    Timeout {
        /// The task, if the launch was answered.
        task_id: Option<String>,
        /// The row.
        data_id: String,
        /// The deadline, in seconds.
        timeout_seconds: f64,
    },
    /// Bad input or configuration on our side; the message names the field and value.
    #[error("{0}")]
    Invalid(String),
    /// A route is known to be missing and its last restore failed less than a probe interval ago.
    #[error(
        "LLM route {model_name} is missing and restore retries are throttled until the probe interval passes"
    )]
    RestoreThrottled {
        /// The route.
        model_name: String,
    },
    /// An outer deadline passed (registration, probe or delete of an LLM route).
    #[error("{what} did not finish within {seconds} s")]
    Deadline {
        /// What was running.
        what: String,
        /// The deadline, in seconds.
        seconds: f64,
    },
    /// The route registry was closed.
    #[error("the LLM route registry is closed")]
    Closed,
    /// A caller's hook (see [`crate::RolloutHooks`]) could not record a moment, so the rollout stopped there.
    #[error("the rollout stopped {moment}: {message}")]
    Hook {
        /// Which moment, e.g. `before registering route stream-areal-..`.
        moment: String,
        /// What the hook reported.
        message: String,
    },
    /// Another error, with what we were doing.
    #[error("{context}: {inner}")]
    Context {
        /// What we were doing (e.g. `stream a`).
        context: String,
        /// The error.
        inner: Box<Error>,
    },
}

impl Error {
    /// Who failed.
    pub fn party(&self) -> Party {
        match self {
            Self::Transport { .. } | Self::Deadline { .. } => Party::Transport,
            Self::Http { .. } | Self::TaskFailed(_) | Self::Rejected(_) => Party::Arena,
            Self::NonJson { .. } | Self::Malformed { .. } => Party::MalformedResponse,
            Self::Timeout { .. } | Self::Invalid(_) | Self::Closed | Self::Hook { .. } => Party::Us,
            Self::RestoreThrottled { .. } => Party::Arena,
            Self::Context { inner, .. } => inner.party(),
        }
    }

    /// Whether the same call may succeed if tried again later.
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Transport { .. } | Self::Deadline { .. } | Self::RestoreThrottled { .. } => true,
            Self::Http { retryable, .. } => *retryable,
            Self::Context { inner, .. } => inner.is_retryable(),
            _ => false,
        }
    }

    /// The HTTP status, if Arena answered with an error status.
    pub fn http_status(&self) -> Option<u16> {
        match self {
            Self::Http { status, .. } => Some(*status),
            Self::Context { inner, .. } => inner.http_status(),
            _ => None,
        }
    }

    /// The failed task, if this is a task failure.
    pub fn task_failed(&self) -> Option<&TaskFailed> {
        match self {
            Self::TaskFailed(t) => Some(t),
            Self::Context { inner, .. } => inner.task_failed(),
            _ => None,
        }
    }

    /// Whether a caller's hook stopped the rollout (see [`crate::RolloutHooks`]).
    pub fn is_hook(&self) -> bool {
        match self {
            Self::Hook { .. } => true,
            Self::Context { inner, .. } => inner.is_hook(),
            _ => false,
        }
    }

    pub(crate) fn hook(moment: impl Into<String>, error: &crate::HookError) -> Self {
        Self::Hook {
            moment: moment.into(),
            message: error.to_string(),
        }
    }

    /// Wraps the error with what we were doing.
    pub fn context(self, context: impl Into<String>) -> Self {
        Self::Context {
            context: context.into(),
            inner: Box::new(self),
        }
    }

    pub(crate) fn malformed(op: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Malformed {
            op: op.into(),
            message: message.into(),
        }
    }
}

/// The result type of `arena-client`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
