//! The `guard` section: the reward-integrity guard's rules and what a hit costs, run-wide and per Stream
//! (docs/integrity-guard.md).
//!
//! Rules are data in the format of the built-in ones (`integrity-guard`'s `defaults.yaml`); this module
//! compiles them only to validate them, reporting each problem at the key path of the value
//! (`guard.streams.NAME.rules[2].any_arg[0]`). The proxy and the audit command compile them again from
//! [`GuardSection::rule_set`].

use std::collections::BTreeMap;

use integrity_guard::{RuleSet, RuleSpec};
use serde::{Deserialize, Serialize};

use crate::error::Collector;
use crate::path::KeyPath;

/// What a rollout whose agent hit an integrity rule costs (`guard.on_hit`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IntegrityPolicy {
    /// Train as if nothing happened; the hits are recorded in metrics and the audit record.
    #[default]
    Record,
    /// Train the sample with reward 0.
    Zero,
    /// Do not train on the sample (reject reason `integrity_violation`).
    Reject,
}

impl IntegrityPolicy {
    /// The setting's spelling: `record`, `zero` or `reject`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Record => "record",
            Self::Zero => "zero",
            Self::Reject => "reject",
        }
    }
}

/// The `guard` section: the run-wide settings, and per Stream settings that replace them field by field.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardSection {
    /// Scan with the built-in rules (`integrity-guard`'s `defaults.yaml`); false keeps only `rules`.
    pub builtin: bool,
    /// Ids of built-in rules to leave out.
    pub disable: Vec<String>,
    /// The run's own rules, in the format of the built-in ones (`id`, `category`, `programs`, ...), added
    /// after the built-in ones; ids must be unique among both.
    pub rules: Vec<RuleSpec>,
    /// What a hit costs a rollout: `record` (train as usual), `zero` (reward 0) or `reject` (not trained).
    pub on_hit: IntegrityPolicy,
    /// Settings for single Streams, by Stream name; each field a Stream sets replaces the run-wide one.
    pub streams: BTreeMap<String, StreamGuard>,
}

impl Default for GuardSection {
    fn default() -> Self {
        Self {
            builtin: true,
            disable: Vec::new(),
            rules: Vec::new(),
            on_hit: IntegrityPolicy::Record,
            streams: BTreeMap::new(),
        }
    }
}

/// One Stream's `guard.streams.NAME` entry: each field set replaces the run-wide one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StreamGuard {
    /// Replaces `guard.builtin` for this Stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub builtin: Option<bool>,
    /// Replaces `guard.disable` for this Stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disable: Option<Vec<String>>,
    /// Replaces `guard.rules` for this Stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rules: Option<Vec<RuleSpec>>,
    /// Replaces `guard.on_hit` for this Stream.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub on_hit: Option<IntegrityPolicy>,
}

impl StreamGuard {
    /// Whether the entry changes which rules apply (not only the policy).
    pub fn sets_rules(&self) -> bool {
        self.builtin.is_some() || self.disable.is_some() || self.rules.is_some()
    }
}

impl GuardSection {
    /// The policy of `stream` (the run-wide one when it sets none, or for `None`).
    pub fn policy(&self, stream: Option<&str>) -> IntegrityPolicy {
        self.entry(stream).and_then(|s| s.on_hit).unwrap_or(self.on_hit)
    }

    /// Whether `stream` has rules of its own (a proxy profile), rather than the run-wide ones.
    pub fn has_own_rules(&self, stream: &str) -> bool {
        self.entry(Some(stream)).is_some_and(StreamGuard::sets_rules)
    }

    /// The Streams with rules of their own, by name.
    pub fn streams_with_own_rules(&self) -> impl Iterator<Item = &str> {
        self.streams
            .iter()
            .filter(|(_, s)| s.sets_rules())
            .map(|(name, _)| name.as_str())
    }

    fn entry(&self, stream: Option<&str>) -> Option<&StreamGuard> {
        stream.and_then(|s| self.streams.get(s))
    }

    /// The rule set of `stream` (the run-wide one for `None` or a Stream without its own rules).
    pub fn rule_set(&self, stream: Option<&str>) -> integrity_guard::Result<RuleSet> {
        let entry = self.entry(stream);
        RuleSet::assemble(
            entry.and_then(|s| s.builtin).unwrap_or(self.builtin),
            entry.and_then(|s| s.disable.as_deref()).unwrap_or(&self.disable),
            entry
                .and_then(|s| s.rules.clone())
                .unwrap_or_else(|| self.rules.clone()),
        )
    }

    /// Compiles the run-wide rules and each Stream's, reporting each problem at its key path; a problem in a
    /// field a Stream inherits is reported once, at the run-wide field.
    pub(crate) fn validate(&self, path: &KeyPath, c: &mut Collector) {
        if let Err(integrity_guard::Error::InvalidRules(problems)) = self.rule_set(None) {
            for p in problems {
                c.push(format!("{path}.{}", p.path), p.message);
            }
        }
        for (name, entry) in &self.streams {
            if !entry.sets_rules() {
                continue;
            }
            let Err(integrity_guard::Error::InvalidRules(problems)) = self.rule_set(Some(name)) else {
                continue;
            };
            let own = |field: &str| match field {
                "disable" => entry.disable.is_some(),
                "rules" => entry.rules.is_some(),
                _ => true,
            };
            for p in problems {
                let field = p.path.split(['[', '.']).next().unwrap_or_default();
                if own(field) {
                    c.push(format!("{path}.streams.{name}.{}", p.path), p.message);
                }
            }
        }
    }

    /// Every Stream `guard.streams` names must be configured.
    pub(crate) fn check_stream_names(&self, configured: &[&str], path: &KeyPath, c: &mut Collector) {
        for name in self.streams.keys() {
            if !configured.contains(&name.as_str()) {
                c.push(
                    path.key("streams").key(name),
                    format!(
                        "{name:?} is not a configured stream (the streams are {})",
                        configured.join(", ")
                    ),
                );
            }
        }
    }
}

#[cfg(test)]
mod tests;
