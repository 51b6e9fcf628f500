//! Async client for Arena's OpenAPI control plane.
//!
//! Arena serves dataset rows in streams and runs a harness per launched task; this crate is how arena-rl
//! talks to it: stream discovery and checks ([`ArenaClient::get_stream`]), the paginated dataset download
//! ([`ArenaClient::get_all_dataset_rows`], [`Dataset::shard`]), task launch and polling with typed
//! failures and best-effort cancel ([`ArenaClient::run_task`]), LLM routes on Arena's gateway and the
//! session-gateway [`RouteRegistry`], a whole rollout's Arena side ([`ArenaClient::run_rollout`]), and the
//! pre-submission checks ([`preflight`]).
//!
//! Every call shares one pooled HTTP client and one retry policy ([`RetryPolicy`]: 429, 5xx, transport
//! errors and Arena's transient 403, with full-jitter backoff); a launch is never sent twice unless the
//! caller supplies an idempotency key. Errors say who failed and whether a retry may help ([`Error`]).
//! Credentials are [`secrecy::SecretString`]s and appear in no `Debug`, error or log line.
//!
//! It is a client only: it never serves HTTP, knows nothing about models, sessions or training, and never
//! reads the process environment itself: [`ClientConfig::from_env`] takes a `stream_config::Env`.

mod client;
mod clock;
mod config;
mod dataset;
mod error;
mod hooks;
mod lifecycle;
mod preflight;
mod registry;
mod renewal;
mod retry;
mod route_check;
mod routes;
mod streams;
mod tasks;

pub use client::{ArenaClient, encode_segment};
pub use clock::{Clock, ManualClock, SystemClock};
pub use config::{ClientConfig, llm_api_key, validate_llm_base_url};
pub use dataset::{Dataset, DatasetOptions, DatasetRow, base_commit_of_item};
pub use error::{Error, Party, Result, TransportKind};
pub use hooks::{HookError, HookResult, NoHooks, RolloutHooks};
pub use lifecycle::{
    GatewayRenewal, RewardRefCheck, RolloutReport, RolloutSpec, RouteSetup, valid_session_id,
};
pub use preflight::{PreflightOptions, StreamSummary, preflight, preflight_stream};
pub use registry::{AcquireReport, BeforeRegister, CloseReport, RegistryOptions, RouteLease, RouteRegistry};
pub use renewal::{Renewal, RenewalStats, RenewalStep, maintain};
pub use retry::RetryPolicy;
pub use route_check::RouteCheck;
pub use routes::{
    MODEL_NAME_PREFIX, ModelRegistration, direct_envs, random_uuid, rollout_model_name, session_gateway_envs,
    session_route_name,
};
pub use streams::{HarnessVersion, StreamInfo, TaskSummary, resolve_protocol};
pub use tasks::{
    CancelOutcome, LAUNCH_FALLBACK_TASK_ID, LaunchRequest, Launched, RunOptions, TaskFailed, TaskResult,
    TaskRun, parse_task_result,
};
