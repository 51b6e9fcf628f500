//! Everything about an arena-rl run's configuration and its Arena Streams, with no network and no async.
//!
//! This crate owns the one config format of the project and the vocabulary that crates which may not depend
//! on each other must share ([`LlmProtocol`], [`RouteMode`], [`TaskStatus`]).
//!
//! What it does:
//!
//! - **Run config** ([`load_run_config`]): a YAML file that may `extends:` others, then the environment
//!   (`ARENA_RL_<SECTION>__<FIELD>` and the reference's own variables, [`REFERENCE_ENV_VARS`]), then dotted
//!   overrides (`econfig.arena_mixture_epoch_size=12`), merged with figment; `${env:NAME}`,
//!   `${env:NAME,default}` and `${path.to.key}` resolved after merging; typed into [`RunConfig`] with unknown
//!   fields rejected; then validated, every problem reported at once. Errors name file, line and key path.
//! - **Streams** ([`load_stream_configs`]): the three exclusive sources, the legacy single-stream fallback,
//!   the per-entry rules, run-level merging, unique names and ids; [`StreamConfig::resolved_protocol`] infers
//!   the Harness protocol.
//! - **Mixture** ([`mixture::build_weighted_rows`]): deterministic, weighted, without replacement.
//! - **Projection** ([`project_streams`]) of a config's Streams to the base64 YAML preflight takes.
//! - **Redaction** ([`redact`]) of credentials in any config tree before it is saved or printed: by key name,
//!   by place (`task_envs`, the base64 Stream list) and by the value of every known secret ([`Secrets`]).
//!
//! What it does not do: talk to Arena, spawn tasks, or read the process environment anywhere but
//! [`Env::from_process`] (every loader takes an [`Env`], so tests pass a map).
//!
//! ## Adding a config section
//!
//! A later issue that needs, say, a `proxy` section adds a struct in `schema.rs` (or a module under
//! `schema/`) with `#[derive(Serialize, Deserialize)]`, `#[serde(deny_unknown_fields, default)]`, a doc
//! comment on every field and a `Default` with the reference's defaults; adds it as a field of [`RunConfig`];
//! and checks its rules in [`RunConfig::problems`]. YAML, `ARENA_RL_PROXY__<FIELD>` variables, overrides,
//! interpolation and file/line error reporting then work for it unchanged. A reference variable that sets a
//! field goes in [`REFERENCE_ENV_VARS`]. Secrets never live in the config: read them from [`Env`] into a
//! `secrecy::SecretString` where they are used.

#![warn(missing_docs)]

mod env;
mod error;
mod interpolate;
mod load;
pub mod mixture;
mod path;
mod projection;
mod redact;
mod schema;
mod stream;
mod vocab;
mod yaml;

pub use env::Env;
pub use error::{Error, Problem, Problems, Result};
pub use load::{ENV_PREFIX, REFERENCE_ENV_VARS, load_run_config, load_run_config_str, user_sets};
pub use projection::{Projection, project_streams, render_streams_yaml};
pub use redact::{
    MIN_SUBSTRING_LEN, REDACTED, SECRET_ENV_VARS, Secrets, is_secret_env_name, is_sensitive_key, redact,
};
pub use schema::{
    ActorConfig, BranchWeight, CheckpointSection, ClusterConfig, DatasetConfig, DatasetSource, EConfig,
    ExportStyle, Fsdp2Config, GenerationConfig, GuardSection, HarnessSampling, IntegrityPolicy, KlEstimator,
    LossAggMode, LrSchedulerType, MetricsSection, MlflowSection, ModelEngine, ModelSection, NormConfig,
    NormLevel, ProxySection, ReasoningParser, RolloutSection, RunConfig, Seconds, StreamGuard,
    ToolCallParser, Tracker, TrainerBackend, WandbMode, WandbSection,
};
pub use stream::{
    ArenaRef, RewardRef, RewardRefDrift, STREAM_FIELDS, StreamConfig, env_key, load_stream_configs,
    load_stream_configs_with_env, parse_stream_config, reward_ref_drift,
};
pub use vocab::{
    FailurePolicy, LlmProtocol, RouteMode, TRANSIENT_403_MARKER, TaskStatus, UNKNOWN_TASK_TYPE,
    metric_task_type, task_type_from_tags,
};
