//! The retry policy (reference section 1.3, plus full jitter) and which failures it retries.
//!
//! Retried: transport errors, HTTP 429, any status of 500 or more, and a 403 whose body carries Arena's
//! transient gateway marker.
//! A call that must not run twice (`launch_one_task` without an idempotency key) is retried only when the
//! request surely did not reach Arena: a connect error, a 429, or the marker 403.

use std::time::Duration;

use rand::RngExt;
use stream_config::TRANSIENT_403_MARKER;

/// How often and how patiently to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Retries after the first attempt (the reference's `request_retries`, default 3).
    pub retries: u32,
    /// Backoff ceiling before the second attempt; it doubles per attempt (default 1 s).
    pub base_delay: Duration,
    /// Upper bound of the ceiling (default 10 s).
    pub max_delay: Duration,
    /// Full jitter: sleep a uniform random time in `[0, ceiling]` instead of the ceiling itself.
    pub jitter: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            retries: 3,
            base_delay: Duration::from_secs(1),
            max_delay: Duration::from_secs(10),
            jitter: true,
        }
    }
}

impl RetryPolicy {
    /// Attempts in all.
    pub fn attempts(&self) -> u32 {
        self.retries.saturating_add(1)
    }

    /// The reference's backoff before attempt `k + 1` (k 0-based): `min(base * 2^k, max)`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 2u32.saturating_pow(attempt.min(31));
        self.base_delay.saturating_mul(factor).min(self.max_delay)
    }

    /// The sleep before attempt `k + 1`: the ceiling, or a uniform draw below it with jitter.
    pub fn delay(&self, attempt: u32) -> Duration {
        let ceiling = self.ceiling(attempt);
        if !self.jitter || ceiling.is_zero() {
            return ceiling;
        }
        ceiling.mul_f64(rand::rng().random_range(0.0..=1.0))
    }
}

/// Whether a call may be sent twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Reads, deletes, and writes Arena de-duplicates: retry whatever failed.
    Repeatable,
    /// Sent at most once: retry only when the request surely did not reach Arena.
    AtMostOnce,
}

/// A 429, a 5xx, or a 403 whose first 1000 characters carry the transient marker.
pub(crate) fn status_is_transient(status: u16, body: &[u8]) -> bool {
    match status {
        429 => true,
        s if s >= 500 => true,
        403 => {
            let text = String::from_utf8_lossy(body);
            let head: String = text.chars().take(1000).collect();
            head.contains(TRANSIENT_403_MARKER)
        }
        _ => false,
    }
}

/// Whether to try again after an HTTP reply.
pub(crate) fn retry_status(status: u16, body: &[u8], delivery: Delivery) -> bool {
    status_is_transient(status, body) && (delivery == Delivery::Repeatable || status < 500)
}

/// Whether to try again after a transport error.
pub(crate) fn retry_transport(err: &reqwest::Error, delivery: Delivery) -> bool {
    delivery == Delivery::Repeatable || err.is_connect()
}

#[cfg(test)]
mod tests;
