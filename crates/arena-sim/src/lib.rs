//! A real Arena on loopback, for tests, examples, benches and the quickstart.
//!
//! `arena-sim` serves Arena's OpenAPI control plane (streams, datasets, task launch, polling and cancel,
//! LLM routes, harness versions, task histories) and its LLM gateway at `{base}/api` over a real socket, so
//! every test drives the real `arena-client` and the real rollout proxy over real HTTP.
//!
//! - Tasks are run by a pluggable [`Harness`]: [`ScriptedHarness`] returns configured outcomes (statuses,
//!   scores, raw payloads, delays, gates); the world's [`runners`](World::runners) run real harnesses, one per
//!   model protocol ([`LlmHarness`]: a multi-turn tool-use loop through the gateway or, in direct mode,
//!   straight to the proxy) and an external command such as Claude Code or Codex ([`CommandHarness`]).
//! - The LLM gateway (below) forwards Anthropic Messages, Chat Completions and Responses requests natively
//!   to a registered route's upstream, streaming the answer back unbuffered.
//! - [`tasks`] is the graded task family (the largest or smallest digit under a key, with one `lookup`
//!   tool), also the library API a supervised warm-up uses to write transcripts that match the harnesses'
//!   traffic; [`World::quickstart`] is the quickstart's Arena.
//! - Faults are injected per endpoint from a seeded generator ([`FaultRule`]), gateway endpoints included,
//!   and per runner ([`RunnerFault`]); [`Counters`] and the request log let tests prove what happened on the
//!   wire.
//!
//! # The LLM gateway
//!
//! `POST /api/v1/messages` (with or without `?beta=true`), `/api/v1/messages/count_tokens`,
//! `/api/v1/chat/completions`, `/api/chat/completions`, `/api/v1/responses` and `/api/responses`. The body's
//! `model` names a registered route; the caller's `ARENA_LLM_API_KEY` (bearer or `x-api-key`) must match
//! the world's `llm_api_key` (any non-empty key when unset). The request goes to the route's endpoint whose
//! `inbound_protos` lists the caller's protocol, with the upstream key as bearer and `x-api-key` and every
//! other end-to-end header passed on. It does not translate between protocols: a route without a native
//! upstream is a 400 in the caller's error format, and an unknown, deleted or garbage-collected model a 404.
//!
//! It never reads a client's internals: everything it knows arrived over HTTP.
//! Every connection is served under [`ConnectionLimits`] (header, body, idle and write timeouts, a body
//! limit, a connection limit; [`SimBuilder::connection_limits`]), so a stalled or flooding client cannot
//! hold it.
//!
//! Entry points: [`World`] (YAML or code, [`World::quickstart`]), [`ArenaSim::start`] /
//! [`ArenaSim::builder`], [`tasks::TaskInstance`], and the `arena-sim` binary.

// Handlers and state transitions stay short enough to read at once (threshold in the crate's clippy.toml).
#![cfg_attr(not(test), warn(clippy::too_many_lines))]
// A handler's `Err` is the HTTP answer to a refused request, moved once on its way out: boxing it buys nothing.
#![allow(clippy::result_large_err)]

mod admission;
mod arena;
mod control;
mod error;
mod fault;
mod gateway;
mod harness;
mod preset;
mod runner;
mod server;
mod sse;
mod state;
pub mod tasks;
mod world;

pub use error::{Error, Result};
pub use fault::{AllEndpoints, Endpoint, EndpointSelector, FaultKind, FaultRule};
pub use harness::{
    Envelope, Harness, HarnessContext, HarnessOutcome, HarnessRun, LaunchReply, LaunchRequest,
    ScriptedConfig, ScriptedHarness, ScriptedOutcome,
};
pub use http_guard::ConnectionLimits;
pub use preset::{
    QUICKSTART_CHAT_STREAM, QUICKSTART_MESSAGES_STREAM, QUICKSTART_REWARD, QUICKSTART_ROWS, SUMS_EVAL_ROWS,
    SUMS_EVAL_STREAM, SUMS_ROWS, SUMS_STREAM,
};
pub use runner::{
    CommandHarness, CommandRunnerDef, LlmHarness, LlmRunnerDef, Receipt, RunnerDef, RunnerFault,
};
pub use server::{ArenaSim, SimBuilder};
pub use state::{Counters, GatewayCounters, RecordedRequest, RouteInfo};
pub use world::{
    CancelEndpoint, HarnessVersionDef, RefDef, RouteDef, RowDef, StreamDef, TaskHistoryDef, UpstreamDef,
    World,
};
