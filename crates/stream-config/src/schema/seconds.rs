//! [`Seconds`]: the one type of every duration setting, written as a plain number of seconds.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::error::Collector;
use crate::path::KeyPath;

/// A duration setting in seconds (`timeout: 1800`, `arena_poll_interval: 0.05`).
///
/// Any number parses, so that [`crate::RunConfig::problems`] can report every out-of-range duration at once,
/// naming its field; a validated config holds only values in `(0, Seconds::MAX]`. [`Seconds::duration`]
/// never panics, even on a value that did not pass validation.
#[derive(Debug, Clone, Copy, PartialEq, PartialOrd, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Seconds(f64);

impl Seconds {
    /// The longest accepted duration, 10^9 s (about 31.7 years): far beyond any run, and small enough to add
    /// to any clock reading without overflow (a `Duration` itself could hold about 1.8 * 10^19 s).
    pub const MAX: f64 = 1e9;

    /// `secs` if it is a valid duration setting (finite, positive, at most [`Seconds::MAX`]).
    pub fn new(secs: f64) -> Option<Self> {
        Self::valid(secs).then_some(Self(secs))
    }

    /// A default of the schema (checked by the schema's tests).
    pub(crate) const fn of(secs: f64) -> Self {
        Self(secs)
    }

    fn valid(secs: f64) -> bool {
        secs.is_finite() && secs > 0.0 && secs <= Self::MAX
    }

    /// The value as written.
    pub fn get(self) -> f64 {
        self.0
    }

    /// The duration; a value that did not pass validation saturates into `[0, Seconds::MAX]` (NaN is zero).
    pub fn duration(self) -> Duration {
        if self.0 > 0.0 {
            Duration::from_secs_f64(self.0.min(Self::MAX))
        } else {
            Duration::ZERO
        }
    }

    /// Records a problem at `path` unless the value is valid.
    pub(crate) fn check(self, c: &mut Collector, path: KeyPath) {
        if !Self::valid(self.0) {
            c.push(
                path,
                format!(
                    "must be a positive number of seconds, at most {:e}, got {}",
                    Self::MAX,
                    self.0
                ),
            );
        }
    }
}

impl fmt::Display for Seconds {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} s", self.0)
    }
}
