//! The error type of `reward-routing`.

use std::fmt;

/// What a reward transform returns when it refuses a score.
pub type TransformError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error from resolving transforms, extracting rewards, computing group statistics or configuring audit
/// shards.
///
/// Failures of a single rollout never surface here as panics: [`crate::route_outcome`] turns them into a
/// [`crate::Decision::Reject`] with a countable reason, and audit write failures are counted by the writer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A stream names a `reward_transform_fn` that nobody registered.
    #[error("stream {stream:?}: unknown reward_transform_fn {name:?}; registered transforms: {known}")]
    UnknownTransform {
        /// The stream whose settings name the transform.
        stream: String,
        /// The name as configured.
        name: String,
        /// The registered names, comma separated.
        known: String,
    },
    /// A transform was registered twice under one name.
    #[error("reward transform {name:?} is already registered")]
    DuplicateTransform {
        /// The name registered twice.
        name: String,
    },
    /// A transform name that could never be configured (empty or with whitespace).
    #[error("invalid reward transform name {name:?}: {why}")]
    InvalidTransformName {
        /// The rejected name.
        name: String,
        /// Why it was rejected.
        why: &'static str,
    },
    /// A stream's `reward_threshold` is NaN or infinite.
    #[error("stream {stream:?}: reward_threshold must be finite, got {value}")]
    InvalidThreshold {
        /// The stream.
        stream: String,
        /// The threshold.
        value: f64,
    },
    /// A terminal task result without a top-level `score`; `raw` is never searched for one.
    #[error("task {task_id:?} of stream {stream:?}: terminal response is missing top-level 'score'")]
    MissingScore {
        /// The stream.
        stream: String,
        /// The Arena task id.
        task_id: String,
    },
    /// A top-level `score` that is NaN or infinite.
    #[error("task {task_id:?} of stream {stream:?}: top-level 'score' must be finite, got {score}")]
    NonFiniteScore {
        /// The stream.
        stream: String,
        /// The Arena task id.
        task_id: String,
        /// The score.
        score: f64,
    },
    /// A reward transform refused the score.
    #[error("stream {stream:?}: reward transform {transform:?} failed on score {score}: {source}")]
    TransformFailed {
        /// The stream.
        stream: String,
        /// The transform's registered name.
        transform: String,
        /// The score it was given.
        score: f64,
        /// What the transform said.
        #[source]
        source: TransformError,
    },
    /// A reward transform returned NaN or an infinity.
    #[error("stream {stream:?}: reward transform {transform:?} returned a non-finite value: {value}")]
    NonFiniteReward {
        /// The stream.
        stream: String,
        /// The transform's registered name.
        transform: String,
        /// What it returned.
        value: f64,
    },
    /// Group metrics were asked for with a different number of rewards than the group size.
    #[error("expected {expected} Arena rewards for pass@k, got {got}")]
    GroupSizeMismatch {
        /// The group size (`n_samples`).
        expected: usize,
        /// The number of rewards given.
        got: usize,
    },
    /// The dynamic filter was given no rewards or a non-finite one.
    #[error("dynamic filtering {0}")]
    FilterInput(&'static str),
    /// Values handed to a normaliser that cannot be normalised (non-finite values, group sizes that do not add
    /// up).
    #[error("{0}")]
    Normalization(String),
    /// A configuration that breaks one or more rules; every problem is listed.
    #[error("{}", Problems(.0))]
    InvalidConfig(Vec<String>),
}

/// The result type of `reward-routing`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

struct Problems<'a>(&'a [String]);

impl fmt::Display for Problems<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            [one] => f.write_str(one),
            many => {
                write!(f, "{} problems:", many.len())?;
                for problem in many {
                    write!(f, "\n  - {problem}")?;
                }
                Ok(())
            }
        }
    }
}
