//! Errors: the crate's own [`Error`] for loading and configuration, and [`ApiError`], an HTTP-facing error
//! that each protocol renders as its own error body and status.

use std::path::PathBuf;

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use crate::engine::EngineError;

/// Errors of loading models, templates and configuration, and of running the server.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        source: std::io::Error,
    },
    /// `tokenizer.json` could not be loaded or used.
    #[error("tokenizer {path}: {message}")]
    Tokenizer {
        /// The tokenizer file, or the model folder.
        path: PathBuf,
        /// What went wrong.
        message: String,
    },
    /// The chat template could not be found, compiled or rendered.
    #[error("chat template: {0}")]
    Template(String),
    /// A configuration value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The inference engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// Binding or serving the listener failed.
    #[error("serving: {0}")]
    Serve(#[source] std::io::Error),
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The wire protocol a request came in on, which decides how its errors look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// OpenAI (Chat Completions, Responses) and the proxy's own control endpoints:
    /// `{"error": {"message", "type", "param", "code"}}`.
    OpenAi,
    /// Anthropic Messages: `{"type": "error", "error": {"type", "message"}}`.
    Anthropic,
}

/// What kind of failure an [`ApiError`] is; it fixes the status code and the protocol's error type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiErrorKind {
    /// 400: the request is malformed or unsupported.
    InvalidRequest,
    /// 400: the prompt does not fit the engine's context window.
    ContextLengthExceeded,
    /// 401: no credential, or an unknown one.
    Unauthenticated,
    /// 403: a valid credential without the needed capability.
    PermissionDenied,
    /// 404: no such session or object.
    NotFound,
    /// 408: the request body did not arrive within the body deadline.
    RequestTimeout,
    /// 409: the request conflicts with the current state.
    Conflict,
    /// 410: the session ended, expired or was exported.
    Gone,
    /// 413: the request body is over the size limit.
    PayloadTooLarge,
    /// 422: the body is well-formed JSON with missing or mistyped fields, or not JSON at all.
    Unprocessable,
    /// 429: admission control refused the request; `Retry-After` says when to try again.
    RateLimited,
    /// 503: the proxy's preparation pool and its queue are full; `Retry-After` says when to try again.
    Overloaded,
    /// 500: the engine or the proxy failed.
    Internal,
    /// 502: the upstream engine answered with an error.
    Upstream,
    /// 504: a deadline passed.
    Timeout,
}

impl ApiErrorKind {
    /// The HTTP status of this kind.
    pub fn status(self) -> StatusCode {
        match self {
            Self::InvalidRequest | Self::ContextLengthExceeded => StatusCode::BAD_REQUEST,
            Self::Unauthenticated => StatusCode::UNAUTHORIZED,
            Self::PermissionDenied => StatusCode::FORBIDDEN,
            Self::NotFound => StatusCode::NOT_FOUND,
            Self::RequestTimeout => StatusCode::REQUEST_TIMEOUT,
            Self::PayloadTooLarge => StatusCode::PAYLOAD_TOO_LARGE,
            Self::Conflict => StatusCode::CONFLICT,
            Self::Gone => StatusCode::GONE,
            Self::Unprocessable => StatusCode::UNPROCESSABLE_ENTITY,
            Self::RateLimited => StatusCode::TOO_MANY_REQUESTS,
            Self::Overloaded => StatusCode::SERVICE_UNAVAILABLE,
            Self::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            Self::Upstream => StatusCode::BAD_GATEWAY,
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
        }
    }

    /// The label used for this kind in metrics.
    pub fn label(self) -> &'static str {
        match self {
            Self::InvalidRequest => "invalid_request",
            Self::ContextLengthExceeded => "context_length_exceeded",
            Self::Unauthenticated => "unauthenticated",
            Self::PermissionDenied => "permission_denied",
            Self::NotFound => "not_found",
            Self::RequestTimeout => "request_timeout",
            Self::PayloadTooLarge => "payload_too_large",
            Self::Conflict => "conflict",
            Self::Gone => "gone",
            Self::Unprocessable => "unprocessable",
            Self::RateLimited => "rate_limited",
            Self::Overloaded => "overloaded",
            Self::Internal => "internal",
            Self::Upstream => "upstream",
            Self::Timeout => "timeout",
        }
    }

    fn openai_type(self) -> &'static str {
        match self {
            Self::InvalidRequest
            | Self::ContextLengthExceeded
            | Self::Unprocessable
            | Self::Conflict
            | Self::RequestTimeout
            | Self::PayloadTooLarge => "invalid_request_error",
            Self::Unauthenticated => "authentication_error",
            Self::PermissionDenied => "permission_error",
            Self::NotFound | Self::Gone => "not_found_error",
            Self::RateLimited => "rate_limit_error",
            Self::Internal | Self::Upstream | Self::Timeout | Self::Overloaded => "server_error",
        }
    }

    fn anthropic_type(self) -> &'static str {
        match self {
            Self::InvalidRequest
            | Self::ContextLengthExceeded
            | Self::Unprocessable
            | Self::Conflict
            | Self::Gone => "invalid_request_error",
            Self::Unauthenticated => "authentication_error",
            Self::PermissionDenied => "permission_error",
            Self::NotFound => "not_found_error",
            Self::PayloadTooLarge => "request_too_large",
            Self::RateLimited => "rate_limit_error",
            Self::Overloaded => "overloaded_error",
            Self::Internal | Self::Upstream => "api_error",
            Self::Timeout | Self::RequestTimeout => "timeout_error",
        }
    }
}

/// An error answered to an HTTP client, in the protocol the request came in on.
///
/// Messages are lowercase, name the offending field or value and never contain a secret; internals go to
/// the log, not into the message.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// The kind, which fixes the status.
    pub kind: ApiErrorKind,
    /// A human-readable message.
    pub message: String,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// Seconds after which a refused request may be retried (429 and 503 only).
    pub retry_after: Option<u64>,
    /// The protocol whose error body to answer with.
    pub protocol: Protocol,
    /// OpenAI's `code`, when it is more specific than the kind's.
    code: Option<&'static str>,
    /// For a context overflow: the prompt's tokens and the context window.
    overflow: Option<(usize, usize)>,
}

impl ApiError {
    /// An error of `kind` with `message`, answered in OpenAI's format until [`ApiError::in_protocol`].
    pub fn new(kind: ApiErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            param: None,
            retry_after: None,
            protocol: Protocol::OpenAi,
            code: None,
            overflow: None,
        }
    }

    /// 400 invalid request.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ApiErrorKind::InvalidRequest, message)
    }

    /// 422 unprocessable body.
    pub fn unprocessable(message: impl Into<String>) -> Self {
        Self::new(ApiErrorKind::Unprocessable, message)
    }

    /// 500 internal error.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ApiErrorKind::Internal, message)
    }

    /// Names the request field at fault.
    pub fn with_param(mut self, param: impl Into<String>) -> Self {
        self.param = Some(param.into());
        self
    }

    /// Sets `Retry-After`.
    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Sets OpenAI's error `code` (for instance `previous_response_not_found`).
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// Records, for a context overflow, the prompt's length and the context window, so that each protocol
    /// can phrase it as its clients expect (Anthropic: `prompt is too long: N tokens > M maximum`).
    pub fn with_context_len(mut self, prompt: usize, max: usize) -> Self {
        self.overflow = Some((prompt, max));
        self
    }

    /// Answers in `protocol`'s error format.
    pub fn in_protocol(mut self, protocol: Protocol) -> Self {
        self.protocol = protocol;
        self
    }

    /// The JSON error body in this error's protocol.
    pub fn body(&self) -> serde_json::Value {
        match self.protocol {
            Protocol::OpenAi => {
                let code = self.code.or(match self.kind {
                    ApiErrorKind::ContextLengthExceeded => Some("context_length_exceeded"),
                    ApiErrorKind::RateLimited => Some("rate_limit_exceeded"),
                    _ => None,
                });
                json!({"error": {
                    "message": self.message,
                    "type": self.kind.openai_type(),
                    "param": self.param,
                    "code": code,
                }})
            }
            Protocol::Anthropic if self.kind == ApiErrorKind::ContextLengthExceeded => {
                // Anthropic's own phrasing (which Claude Code recognises), plus the reference's structured
                // detail for callers that look for `context_length_exceeded`.
                let message = match self.overflow {
                    Some((prompt, max)) => format!("prompt is too long: {prompt} tokens > {max} maximum"),
                    None => self.message.clone(),
                };
                json!({
                    "type": "error",
                    "error": {"type": self.kind.anthropic_type(), "message": message},
                    "detail": {"type": "context_length_exceeded", "message": self.message},
                })
            }
            Protocol::Anthropic => json!({
                "type": "error",
                "error": {"type": self.kind.anthropic_type(), "message": self.message},
            }),
        }
    }

    /// Turns an engine failure into an API error: context overflow is the client's, everything else ours.
    pub fn from_engine(err: &EngineError) -> Self {
        match err {
            EngineError::ContextLengthExceeded { prompt, max } => {
                Self::new(ApiErrorKind::ContextLengthExceeded, err.to_string())
                    .with_param("messages")
                    .with_context_len(*prompt, *max)
            }
            EngineError::InvalidRequest(_) => Self::invalid(err.to_string()),
            EngineError::Upstream { .. } | EngineError::Transport(_) | EngineError::Protocol(_) => {
                Self::new(ApiErrorKind::Upstream, err.to_string())
            }
            EngineError::Unsupported(_) | EngineError::Internal(_) => Self::internal(err.to_string()),
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.message, self.kind.label())
    }
}

impl std::error::Error for ApiError {}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = self.kind.status();
        let mut response = (status, axum::Json(self.body())).into_response();
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response.extensions_mut().insert(self.kind);
        response
    }
}
