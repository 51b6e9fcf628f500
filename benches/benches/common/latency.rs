//! Latency percentiles the proxy benches print.

use std::time::Duration;

/// The `p` quantile (0 to 1) of `sorted` latencies, in milliseconds (nearest rank; NaN when empty).
pub(crate) fn percentile_ms(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}
