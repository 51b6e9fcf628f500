//! A real Arena on loopback, for tests, examples and benches.
//!
//! `arena-sim` serves Arena's OpenAPI control plane (streams, datasets, task launch, polling and cancel,
//! LLM routes, harness versions, task histories) over a real socket, so every test drives the real
//! `arena-client` over real HTTP.
//! Tasks are run by a pluggable [`Harness`]; this crate ships [`ScriptedHarness`], which returns configured
//! outcomes (statuses, scores, raw payloads, delays, gates).
//! Faults are injected per endpoint from a seeded generator ([`FaultRule`]), and [`Counters`] and the request
//! log let tests prove what happened on the wire.
//!
//! It does not yet serve the LLM gateway at `{base}/api`, run harnesses that call a model, or grade: those come
//! with the end-to-end work, through the same [`Harness`] trait.
//! It never reads a client's internals: everything it knows arrived over HTTP.
//!
//! Entry points: [`World`] (YAML or code), [`ArenaSim::start`] / [`ArenaSim::builder`], and the `arena-sim`
//! binary.

mod error;
mod fault;
mod harness;
mod server;
mod state;
mod world;

pub use error::{Error, Result};
pub use fault::{AllEndpoints, Endpoint, EndpointSelector, FaultKind, FaultRule};
pub use harness::{
    Envelope, Harness, HarnessContext, HarnessOutcome, HarnessRun, LaunchReply, LaunchRequest,
    ScriptedConfig, ScriptedHarness, ScriptedOutcome,
};
pub use server::{ArenaSim, SimBuilder, TRANSIENT_403_MARKER};
pub use state::{Counters, RecordedRequest, RouteInfo};
pub use world::{
    CancelEndpoint, HarnessVersionDef, RefDef, RouteDef, RowDef, StreamDef, TaskHistoryDef, World,
};
