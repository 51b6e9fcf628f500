//! The trajectory export format: what `POST /export_trajectories` answers, as JSON.
//!
//! # Request: [`crate::control::wire::ExportRequest`]
//!
//! ```json
//! {"session_id": "17:3-5f0c...", "style": "concat", "discount": 1.0, "drop_retry_orphans": false,
//!  "final_reward": 0.75, "wait_timeout_seconds": 60}
//! ```
//!
//! Only `session_id` is required (422 without it). `style` is `individual` (default: one trajectory per
//! interaction) or `concat` (one per leaf of the interaction tree). `final_reward`, when given, becomes the
//! reward of the newest interaction before discounting. The export waits for `end_session` for at most
//! `wait_timeout_seconds` (default: the server's `export_wait_timeout`), then answers 409.
//!
//! # Answer: [`ExportedSession`]
//!
//! Every trajectory is one token sequence with eight parallel arrays of the same length:
//!
//! | field | meaning |
//! |---|---|
//! | `token_ids` | the prompt and output tokens, exactly as the engine saw and sampled them |
//! | `loss_mask` | 1 on tokens the policy sampled (for `individual`, only this interaction's own output), 0 on prompt, tool and template tokens |
//! | `logprobs` | the sampling log-probability of each sampled token, 0.0 elsewhere |
//! | `versions` | the policy version that sampled each sampled token, -1 elsewhere |
//! | `temperatures` | the temperature each sampled token's log-probability is of (1 for a greedy token), 1.0 elsewhere |
//! | `top_ps` | the top-p each sampled token was drawn under (1.0 for a greedy token), 1.0 elsewhere |
//! | `top_ks` | the top-k each sampled token was drawn under, 0 for none (and for a greedy token), 0 elsewhere |
//! | `truncated` | 1 on sampled tokens drawn from a truncated distribution (top-p < 1 or a top-k, not greedy), 0 elsewhere |
//!
//! The four sampling arrays cover every output token of the chain, also those an `individual` export does
//! not train on (they were sampled at those values all the same); prompt, tool and template tokens carry
//! the neutral values. They are per token because one `concat` trajectory can span turns sampled at
//! different temperatures. Records written before they existed deserialise with them empty.
//!
//! # What `logprobs` are
//!
//! A sampled token's log-probability is of the distribution it was drawn from
//! ([`crate::SampledToken::logprob`]): the softmax of the logits divided by `temperatures[i]`, restricted
//! to the tokens top-k and top-p kept and renormalised over them when `truncated[i]` is 1. A greedy token
//! (temperature 0) is recorded, and exported, at temperature 1 and untruncated. A trainer scores each token
//! at `temperatures[i]` over the whole vocabulary; on truncated tokens the difference from `logprobs` is
//! real, not drift, and the decoupled loss's behaviour weight corrects it.
//!
//! In `concat` style each leaf is a complete sequence: a prefix shared by several leaves (a turn that was
//! retried, or branched) appears in full in every leaf that extends it, as in the reference. Rewards are
//! discounted once over the session's interactions from newest to oldest (`r_i += discount * r_{i+1}`,
//! unset rewards count as 0); `reward` is the discounted value and `original_reward` the value as set.
//! Under [`crate::SessionRewards::Ignore`] a reward a session set with its own key was never kept, so
//! only the admin's rewards and `final_reward` appear here.
//!
//! # The episode's reward (`episode_reward`, opt-in)
//!
//! A harness that compacts its context starts a new conversation the proxy records as a new root, so one
//! episode exports several `concat` chains, and only the newest carries the reward. A leaf's missing reward
//! is never inferred from the episode's; `episode_reward` (finite, `concat` only, else 400) asks for it when
//! the graph is unambiguous: then every exported leaf gets `reward` and `original_reward` equal to it, so
//! each chain is scored once and the episode stays one rollout (AReaL #1751's `assign_episode_reward`,
//! `arena-2026.md` 2.10). Nothing changes, with a warning, when a turn is reached from two leaves (a shared
//! ancestor: a retried or branched turn), a turn of a chain has no output, a turn that is not a leaf has a
//! reward, or a leaf's reward differs from the episode's; nor when no leaf lacks a reward.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::integrity::IntegrityHit;

/// How to cut a session into trajectories.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExportStyle {
    /// One trajectory per interaction, its loss mask on its own output only.
    #[default]
    Individual,
    /// One trajectory per leaf of the interaction tree, its loss mask on every sampled token of the chain.
    Concat,
}

/// How to export (the body of `POST /export_trajectories` less the session and the wait).
#[derive(Debug, Clone, PartialEq)]
pub struct ExportOptions {
    /// The style.
    pub style: ExportStyle,
    /// The reward discount `γ`.
    pub discount: f64,
    /// Drop retried requests nothing built on (identical-input duplicates).
    pub drop_retry_orphans: bool,
    /// Overrides the newest interaction's reward before discounting.
    pub final_reward: Option<f64>,
    /// The episode's reward, for every leaf of a `concat` export when the session's graph is unambiguous
    /// (a compacted session's chains; the rules are in the module docs).
    pub episode_reward: Option<f64>,
    /// A `concat` export writes at most this many times the tokens the session stored (see
    /// [`crate::SessionLimits::max_export_amplification`]).
    pub max_amplification: u32,
}

impl Default for ExportOptions {
    fn default() -> Self {
        Self {
            style: ExportStyle::Individual,
            discount: 1.0,
            drop_retry_orphans: false,
            final_reward: None,
            episode_reward: None,
            max_amplification: 4,
        }
    }
}

/// A session's export.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedSession {
    /// The session.
    pub session_id: String,
    /// The task id it was started with.
    pub task_id: String,
    /// The style used.
    pub style: ExportStyle,
    /// The discount used.
    pub discount: f64,
    /// Whether a request of the session overflowed the context window.
    pub context_overflow: bool,
    /// Whether the proxy or engine failed on a request of the session.
    pub system_error: bool,
    /// How many interactions the session recorded (before orphan dropping).
    pub interaction_count: usize,
    /// Integrity hits of the session's generations, per rule id; absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub integrity_hits: BTreeMap<String, u64>,
    /// The trajectories, oldest first.
    pub trajectories: Vec<ExportedTrajectory>,
    /// Leaves a `concat` export left out, oldest first, because writing each branch's shared prefix again
    /// would pass the export's bound on tokens; absent when none.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub branches_dropped: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// One token-exact trajectory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ExportedTrajectory {
    /// The session.
    pub session_id: String,
    /// The interaction (completion id as the client saw it) this trajectory ends with.
    pub interaction_id: String,
    /// Every interaction of the chain, root first, this one last.
    pub interaction_ids: Vec<String>,
    /// Prompt and output tokens.
    pub token_ids: Vec<u32>,
    /// 1 on sampled tokens that train, else 0.
    pub loss_mask: Vec<u8>,
    /// Sampling log-probabilities (0.0 where not sampled).
    pub logprobs: Vec<f32>,
    /// Policy versions (-1 where not sampled).
    pub versions: Vec<i64>,
    /// The temperature each token's behaviour log-probability is of: its sampling temperature, 1 for a
    /// greedy token and 1 where not sampled. Empty in records written before it was recorded.
    #[serde(default)]
    pub temperatures: Vec<f32>,
    /// The top-p each token was drawn under (1 where not sampled, and for greedy tokens). Empty in old
    /// records.
    #[serde(default)]
    pub top_ps: Vec<f32>,
    /// The top-k each token was drawn under, 0 for none (and where not sampled, and for greedy tokens).
    /// Empty in old records.
    #[serde(default)]
    pub top_ks: Vec<u32>,
    /// 1 where the token was drawn from a truncated distribution (top-p below 1 or a top-k, not greedy),
    /// so its `logprobs` entry is of the truncated, renormalised distribution; else 0. Empty in old
    /// records.
    #[serde(default)]
    pub truncated: Vec<u8>,
    /// Tokens before the first token this trajectory trains on.
    pub prompt_len: usize,
    /// The reward after discounting.
    pub reward: f64,
    /// The reward as set (0 when never set).
    pub original_reward: f64,
    /// Why the last interaction's generation ended: `stop`, `length` or `tool_calls`.
    pub finish_reason: String,
    /// The session's metadata from `start_session`.
    pub metadata: Value,
    /// The integrity hits of the chain's interactions (at most
    /// [`crate::integrity::MAX_HITS_PER_INTERACTION`] each), oldest first; absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub integrity_hits: Vec<IntegrityHit>,
}
