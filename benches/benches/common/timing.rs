//! Timing helpers the benches share for their same-run ratio reports.

use std::time::{Duration, Instant};

/// The median of `runs` timings of `f`.
pub(crate) fn median(runs: usize, mut f: impl FnMut()) -> Duration {
    let mut times: Vec<Duration> = (0..runs)
        .map(|_| {
            let start = Instant::now();
            f();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[runs / 2]
}
