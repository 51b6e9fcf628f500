//! What a finished Arena task means for training.
//!
//! `reward-routing` turns a rollout's outcome (what Arena reported, what the rollout proxy saw) into a
//! [`Decision`]: train with a reward, train with reward 0, or reject with a countable reason. It also assembles
//! groups, normalises their rewards into one advantage per sample, filters groups that cannot teach anything,
//! names every metric, and writes audit shards. The rules are those of the reference (AReaL's Arena
//! integration, `shared/spec/arena-reference.md` sections 4.4-4.6 and 7.4).
//!
//! It is pure: no async runtime, no network, and it does not care how results were fetched; its input types
//! ([`Episode`], [`TaskOutcome`], [`RowMeta`]) hold plain fields. It does not read configuration files (callers
//! pass [`RewardSettings`], [`RewardConfig`], [`AuditConfig`]), it does not record metrics anywhere (they are
//! plain [`Metric`] records for sinks elsewhere), and it does not touch token-level data: the trainer broadcasts
//! each sample's advantage over its tokens.
//!
//! Entry points:
//! - [`TransformRegistry`] and [`RewardRule`]: per-stream reward extraction, thresholds and transforms.
//! - [`route_outcome`]: one [`Episode`] to a [`Routed`] decision, metrics and audit record.
//! - [`assemble_group`], [`DynamicFilter`], [`RewardConfig::advantages`]: group post-processing, filtering and
//!   advantages.
//! - [`group_metrics`]: pass@k and `group_pass_<c>`.
//! - [`AuditWriter`]: the process's audit shard writer.

mod audit;
mod classify;
mod error;
mod filter;
mod group;
mod harness;
mod metrics;
mod norm;
mod outcome;
mod receipt;
mod reward;
mod route;
#[cfg(test)]
mod test_support;
mod transform;

pub use audit::{
    AuditConfig, AuditPosition, AuditRecord, AuditStats, AuditWriter, DEFAULT_MAX_RAW_BYTES,
    open_private_file,
};
pub use classify::{
    CLAUDE_AGENT_PHASE_EXITED, CLAUDE_REPORTED_ERROR, Failure, FailureDisposition, MODEL_OUTCOME_CODES,
    classify_failure, is_claude_agent_phase_failure,
};
pub use error::{Error, Result, TransformError};
pub use filter::{ALL_CORRECT_TOLERANCE, DynamicFilter, FilterCounters, FilterVerdict};
pub use group::{
    Group, GroupRejection, GroupSample, GroupSettings, ROLLOUT_NORM_EPS, SampleResult, assemble_group,
    normalize_rollout,
};
pub use harness::{
    HARNESS_OUTCOME_METRIC_CODES, OTHER_CODE, OUTCOME_CODE_MARKER, has_outcome_format, is_well_formed_code,
    metric_code, outcome_code,
};
pub use metrics::{DEBUG_SCOPE, Lifecycle, Metric, Scope, group_metrics};
pub use norm::{NormConfig, NormLevel, Normalize, RewardConfig, SampleAdvantage};
pub use outcome::{
    Episode, ErrorStage, IntegrityFinding, Outcome, RowMeta, TaskOutcome, task_type_from_json,
};
pub use receipt::{ReceiptProblem, check_receipt, format_conflict};
pub use reward::{RewardRule, RewardSettings};
pub use route::{AfterExport, Decision, RejectReason, Routed, route_outcome};
pub use stream_config::{FailurePolicy, IntegrityPolicy, RewardRef, TaskStatus};
pub use transform::{
    ASTRA_DEFAULT_THRESHOLD, ASTRA_PARTIAL_REWARD, AstraPartialReward, IDENTITY_REWARD, IdentityReward,
    REFERENCE_MODULE, ResolvedTransform, RewardTransform, ScoreOutOfRange, TransformRegistry,
};
