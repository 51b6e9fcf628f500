//! Reward transforms: named functions from an Arena score to a training reward, chosen per stream by
//! `reward_transform_fn` (reference section 4.5).
//!
//! The reference imports a Python function by dotted path; here a [`TransformRegistry`] maps names to
//! [`RewardTransform`]s. It holds the built-ins [`IDENTITY_REWARD`] and [`ASTRA_PARTIAL_REWARD`], answers to the
//! reference's import paths for them (`examples.swe.reward_transforms.<name>`), and takes user transforms by
//! name.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::error::{Error, Result, TransformError};
use crate::outcome::RowMeta;

/// The name of the built-in transform that keeps a score in [0, 1] unchanged.
pub const IDENTITY_REWARD: &str = "identity_reward";
/// The name of the built-in transform that keeps partial scores at one tenth strength.
pub const ASTRA_PARTIAL_REWARD: &str = "astra_partial_reward";
/// The Python module of the reference's built-in transforms; `<module>.<name>` resolves to the built-in.
pub const REFERENCE_MODULE: &str = "examples.swe.reward_transforms";
/// The threshold [`AstraPartialReward`] uses when the stream configures none.
pub const ASTRA_DEFAULT_THRESHOLD: f64 = 0.98;

/// A reward transform: from an Arena score to the reward that training sees.
///
/// `reward_threshold` is the stream's `reward_threshold`, or `None` when the stream configures none (the
/// reference then omits the keyword so the function's own default applies). Returning a non-finite value is an
/// error that routing reports; returning `Err` refuses the score.
pub trait RewardTransform: Send + Sync {
    /// Maps `score` to a reward.
    fn transform(
        &self,
        score: f64,
        row: &RowMeta,
        reward_threshold: Option<f64>,
    ) -> Result<f64, TransformError>;
}

impl<F> RewardTransform for F
where
    F: Fn(f64, &RowMeta, Option<f64>) -> Result<f64, TransformError> + Send + Sync,
{
    fn transform(
        &self,
        score: f64,
        row: &RowMeta,
        reward_threshold: Option<f64>,
    ) -> Result<f64, TransformError> {
        self(score, row, reward_threshold)
    }
}

/// A score outside [0, 1] or not finite, refused by a built-in transform.
#[derive(Debug)]
pub struct ScoreOutOfRange {
    /// Which reward the message names (`Arena`, `Astra`).
    pub what: &'static str,
    /// The refused score.
    pub score: f64,
}

impl fmt::Display for ScoreOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} reward must be finite and within [0, 1], got {}",
            self.what, self.score
        )
    }
}

impl std::error::Error for ScoreOutOfRange {}

fn check_unit_interval(what: &'static str, score: f64) -> Result<f64, TransformError> {
    if score.is_finite() && (0.0..=1.0).contains(&score) {
        Ok(score)
    } else {
        Err(Box::new(ScoreOutOfRange { what, score }))
    }
}

/// `identity_reward`: the score must be finite and within [0, 1] and is returned unchanged; the threshold is
/// ignored (it still decides what counts as solved for pass@k).
#[derive(Debug, Clone, Copy, Default)]
pub struct IdentityReward;

impl RewardTransform for IdentityReward {
    fn transform(
        &self,
        score: f64,
        _row: &RowMeta,
        _reward_threshold: Option<f64>,
    ) -> Result<f64, TransformError> {
        check_unit_interval("Arena", score)
    }
}

/// `astra_partial_reward`: the score must be finite and within [0, 1]; below the threshold (default
/// [`ASTRA_DEFAULT_THRESHOLD`]) it is kept at one tenth strength, at or above it the reward is 1.
#[derive(Debug, Clone, Copy, Default)]
pub struct AstraPartialReward;

impl RewardTransform for AstraPartialReward {
    fn transform(
        &self,
        score: f64,
        _row: &RowMeta,
        reward_threshold: Option<f64>,
    ) -> Result<f64, TransformError> {
        let score = check_unit_interval("Astra", score)?;
        let threshold = reward_threshold.unwrap_or(ASTRA_DEFAULT_THRESHOLD);
        Ok(if score < threshold { score * 0.1 } else { 1.0 })
    }
}

/// A transform found in the registry, with the name it is registered under.
#[derive(Clone)]
pub struct ResolvedTransform {
    name: String,
    transform: Arc<dyn RewardTransform>,
}

impl ResolvedTransform {
    /// The registered name (the built-in's short name for a reference import path).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Calls the transform.
    pub fn transform(
        &self,
        score: f64,
        row: &RowMeta,
        reward_threshold: Option<f64>,
    ) -> Result<f64, TransformError> {
        self.transform.transform(score, row, reward_threshold)
    }
}

impl fmt::Debug for ResolvedTransform {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResolvedTransform")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Named reward transforms.
#[derive(Clone)]
pub struct TransformRegistry {
    transforms: BTreeMap<String, Arc<dyn RewardTransform>>,
}

impl Default for TransformRegistry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl fmt::Debug for TransformRegistry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.transforms.keys()).finish()
    }
}

impl TransformRegistry {
    /// A registry without any transform.
    pub fn empty() -> Self {
        Self {
            transforms: BTreeMap::new(),
        }
    }

    /// A registry holding [`IDENTITY_REWARD`] and [`ASTRA_PARTIAL_REWARD`].
    pub fn with_builtins() -> Self {
        let mut registry = Self::empty();
        registry
            .transforms
            .insert(IDENTITY_REWARD.to_string(), Arc::new(IdentityReward));
        registry
            .transforms
            .insert(ASTRA_PARTIAL_REWARD.to_string(), Arc::new(AstraPartialReward));
        registry
    }

    /// Registers a user transform under `name` (for example a dotted path kept from a Python config).
    pub fn register(
        &mut self,
        name: impl Into<String>,
        transform: impl RewardTransform + 'static,
    ) -> Result<()> {
        let name = name.into();
        if name.is_empty() {
            return Err(Error::InvalidTransformName {
                name,
                why: "it is empty",
            });
        }
        if name.chars().any(char::is_whitespace) {
            return Err(Error::InvalidTransformName {
                name,
                why: "it contains whitespace",
            });
        }
        if self.transforms.contains_key(&name) {
            return Err(Error::DuplicateTransform { name });
        }
        self.transforms.insert(name, Arc::new(transform));
        Ok(())
    }

    /// Finds the transform a stream's `reward_transform_fn` names: a registered name, or the reference's import
    /// path of a built-in (`examples.swe.reward_transforms.astra_partial_reward`). Surrounding whitespace is
    /// ignored, as the reference trims the field.
    pub fn get(&self, name: &str) -> Option<ResolvedTransform> {
        let name = name.trim();
        if let Some((key, transform)) = self.transforms.get_key_value(name) {
            return Some(ResolvedTransform {
                name: key.clone(),
                transform: Arc::clone(transform),
            });
        }
        let short = name
            .strip_prefix(REFERENCE_MODULE)
            .and_then(|rest| rest.strip_prefix('.'))?;
        if ![IDENTITY_REWARD, ASTRA_PARTIAL_REWARD].contains(&short) {
            return None;
        }
        let (key, transform) = self.transforms.get_key_value(short)?;
        Some(ResolvedTransform {
            name: key.clone(),
            transform: Arc::clone(transform),
        })
    }

    /// Like [`TransformRegistry::get`], with an error naming the stream and the registered names.
    pub fn resolve(&self, stream: &str, name: &str) -> Result<ResolvedTransform> {
        self.get(name).ok_or_else(|| Error::UnknownTransform {
            stream: stream.to_string(),
            name: name.to_string(),
            known: self.names().collect::<Vec<_>>().join(", "),
        })
    }

    /// The registered names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.transforms.keys().map(String::as_str)
    }
}

#[cfg(test)]
mod tests;
