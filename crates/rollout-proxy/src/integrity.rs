//! The reward-integrity guard on the generation path: every recorded generation's tool calls and command
//! blocks are scanned with the session's rules ([`integrity_guard`]), and each hit is kept on the
//! interaction, counted per rule on the session, reported by `end_session` and exported on the
//! trajectories that contain it.
//!
//! The proxy only records: what a hit costs the sample is the caller's decision. A session picks its rules
//! at `start_session` ([`crate::control::wire::IntegritySelection`]): a named profile of
//! [`IntegrityConfig::profiles`] (the training loop names one per Stream) or the default, and the task's
//! base commit when the row gives one. A session's scanner keeps what one agent session defines (aliases,
//! variables, written scripts) from one generation to the next.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use serde::{Deserialize, Serialize};

pub use integrity_guard::{Hit, RuleSet, Scanner};

/// Hits kept per interaction; more are counted but not kept.
pub const MAX_HITS_PER_INTERACTION: usize = 32;

/// Which rules the proxy scans generations with.
#[derive(Clone)]
pub struct IntegrityConfig {
    /// The rules of sessions that name no profile; `None` scans them not at all.
    pub default: Option<Arc<RuleSet>>,
    /// Rule sets a session may name at `start_session`.
    pub profiles: BTreeMap<String, Arc<RuleSet>>,
}

impl Default for IntegrityConfig {
    /// The built-in rules for every session, no profiles.
    fn default() -> Self {
        Self {
            default: Some(RuleSet::shared_builtin()),
            profiles: BTreeMap::new(),
        }
    }
}

impl std::fmt::Debug for IntegrityConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntegrityConfig")
            .field("default_rules", &self.default.as_ref().map(|r| r.len()))
            .field("profiles", &self.profiles.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// One hit as recorded and exported: the interaction whose output held the command, the rule, and the
/// command it matched (unwrapped and shell-quoted).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IntegrityHit {
    /// The interaction (completion id as the client saw it).
    pub interaction_id: String,
    /// The rule's id.
    pub rule: String,
    /// The rule's category.
    pub category: String,
    /// The command it matched.
    pub matched: String,
}

/// A session's scanner, shared by its generations (one at a time).
#[derive(Debug)]
pub(crate) struct SessionGuard {
    scanner: Mutex<Scanner>,
}

impl SessionGuard {
    pub(crate) fn new(rules: Arc<RuleSet>, base_commit: Option<&str>) -> Self {
        Self {
            scanner: Mutex::new(Scanner::new(rules, base_commit)),
        }
    }

    /// Scans one output: its visible text (command blocks only) and each tool call, given as its function
    /// name and its arguments' JSON text (this module sits below the generation path, so it takes the
    /// calls' parts rather than the generation's own type).
    pub(crate) fn scan<'a>(
        &self,
        content: &str,
        tool_calls: impl IntoIterator<Item = (&'a str, &'a str)>,
    ) -> Vec<Hit> {
        let mut scanner = self.scanner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut hits = scanner.scan_text(content);
        for (name, arguments) in tool_calls {
            for hit in scanner.scan_tool_call(name, arguments) {
                if !hits.contains(&hit) {
                    hits.push(hit);
                }
            }
        }
        hits
    }
}

/// The session guard `start_session` asked for: `profile` names one of `config.profiles` (absent: the
/// default). An unknown profile is an error naming it.
pub(crate) fn session_guard(
    config: &IntegrityConfig,
    profile: Option<&str>,
    base_commit: Option<&str>,
) -> Result<Option<Arc<SessionGuard>>, String> {
    let rules = match profile {
        None => config.default.clone(),
        Some(name) => match config.profiles.get(name) {
            Some(rules) => Some(rules.clone()),
            None => {
                let known: Vec<&str> = config.profiles.keys().map(String::as_str).collect();
                return Err(format!(
                    "unknown integrity profile {name:?}; this proxy has {}",
                    if known.is_empty() {
                        "none".to_string()
                    } else {
                        known.join(", ")
                    }
                ));
            }
        },
    };
    Ok(rules.map(|r| Arc::new(SessionGuard::new(r, base_commit))))
}

/// Counts hits per rule into `counts`.
pub(crate) fn count(counts: &mut BTreeMap<String, u64>, hits: &[Hit]) {
    for hit in hits {
        *counts.entry(hit.rule.clone()).or_default() += 1;
    }
}
