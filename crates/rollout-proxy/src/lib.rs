//! The rollout proxy: the HTTP server harnesses talk to instead of a model provider.
//!
//! It binds every request to a training session, renders the conversation with the model's own chat
//! template, generates with the policy through an [`InferenceEngine`], answers in the harness's protocol,
//! and records every sampled token with its log-probability and policy version. A turn that extends an
//! earlier one reuses that turn's exact tokens and appends only the rendering of the new messages, so the
//! exported trajectories are exactly what was sampled ([`export`] documents the format).
//!
//! What it deliberately does not do: it never names burn or any model implementation (engines plug in
//! through [`InferenceEngine`]), it depends on no other workspace crate but the shared leaf crates
//! (`http-guard`, whose [`serve_with`] it is served under, and `seeds`), and it does not translate between
//! protocols through a gateway: each protocol is served natively on the protocol-neutral core
//! ([`generation`], [`sse`], [`error::Protocol`]), which sits below them and imports none of them. It runs no provider-side tools (web search and the like
//! are left out of the rendered tools) and keeps no state across sessions: stored Responses chains live
//! and die with their session.
//!
//! Entry points:
//!
//! - [`ProxyState::new`] with a [`ProxyConfig`], a [`ChatModel`] ([`ChatModel::from_dir`]) and an
//!   `Arc<dyn InferenceEngine>`; then [`router`] for tests (no socket needed), or [`ProxyServer::start`] /
//!   [`serve`] to listen without naming the HTTP stack, under [`ConnectionLimits`] (header, body, idle and
//!   write timeouts, a body limit, a connection limit; [`serve_with`]).
//! - Work: generation requests of 8 KiB or more are parsed, rendered and tokenised on a bounded pool of
//!   blocking threads with admission ([`PoolLimits`]; a full pool answers 503 at once), never on the async
//!   threads that answer `/health`, the control endpoints and running streams.
//! - Bounds: request fields as the real APIs bound them (stop strings, `metadata`, `tools`, Responses
//!   `text` and `reasoning`; each refusal a 400 naming the field), [`SessionLimits`] (sessions, tokens,
//!   generations in flight per session, stored Responses bytes per session and in all), the tokenizer's
//!   piece memory in bytes, and [`SessionRewards`] for rewards a session sets on itself. The repository's
//!   `docs/proxy-limits.md` lists every bound with its default.
//! - Protocols: Chat Completions (`/v1/chat/completions`), Anthropic Messages (`/v1/messages`,
//!   `/v1/messages/count_tokens`) and Responses (`/v1/responses`, `GET /v1/responses/{id}`), each also
//!   without the `/v1` prefix; the control endpoints of reference section 6.4, whose request and reply
//!   bodies are the serde types of [`control::wire`] (for the proxy and its clients alike).
//! - Sampling: [`ProxyConfig::sampling`] ([`SamplingDefaults`]) and [`ProxyConfig::harness_sampling`]
//!   ([`HarnessSampling`]) decide each generation's temperature, top-p and top-k ([`sampling`]); the
//!   values are recorded per interaction and exported per token, and [`SampledToken::logprob`] says what
//!   every engine's log-probabilities are.
//! - Engines: [`FakeEngine`] (deterministic, for tests and benches), [`SglangEngine`] (a client of SGLang's
//!   HTTP contract), [`EnginePool`] (several SGLang servers, with paused and confirmed weight updates), and
//!   [`GenerateServer`] ([`generate_router`]), which serves any engine over SGLang's contract.
//! - Reusable pieces: [`template::ChatTemplate`] (HF chat templates), [`tokenizer::Tokenizer`] and
//!   [`tokenizer::IncrementalDecoder`], [`parse`] (reasoning, tool calls, stop strings).

mod admission;
pub mod auth;
pub mod control;
pub mod engine;
pub mod error;
pub mod export;
pub mod generation;
pub mod integrity;
pub mod messages;
mod metrics;
pub mod model;
pub mod parse;
mod pool;
mod protocol;
pub mod sampling;
mod server;
pub mod session;
pub mod sse;
mod state;
pub mod template;
pub mod tokenizer;
mod trajectory;

pub use engine::{
    EngineError, EngineEvent, EnginePool, FakeEngine, FakeEngineConfig, FinishReason, GenerateRequest,
    GenerateServer, GenerateServerConfig, InferenceEngine, MIN_TEMPERATURE, POOL_ATTEMPTS, PauseMode,
    SampledToken, SamplingParams, SglangConfig, SglangEngine, TokenStream, WeightUpdate, generate_router,
};
pub use error::{ApiError, ApiErrorKind, Error, Protocol, Result};
pub use export::{ExportOptions, ExportStyle, ExportedSession, ExportedTrajectory};
pub use http_guard::{self as connection, BodyRefused, ConnectionLimits, serve_with};
pub use integrity::{IntegrityConfig, IntegrityHit};
pub use model::ChatModel;
pub use parse::{ReasoningFormat, ToolCallFormat};
pub use pool::PoolLimits;
pub use sampling::{HarnessSampling, SamplingDefaults};
pub use server::{ProxyServer, check_bind, router, serve};
pub use session::SessionLimits;
pub use state::{ProxyConfig, ProxyState, SessionRewards};
