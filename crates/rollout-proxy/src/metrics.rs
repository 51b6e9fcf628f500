//! Counters for `GET /metrics`, rendered in the Prometheus text format: requests by endpoint and status,
//! latencies, tokens, sessions, and errors by kind.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

#[derive(Debug, Default)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

/// The proxy's counters.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    requests: Mutex<BTreeMap<(&'static str, u16), u64>>,
    latency: Mutex<BTreeMap<&'static str, Histogram>>,
    errors: Mutex<BTreeMap<&'static str, u64>>,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) completion_tokens: AtomicU64,
    pub(crate) generations: AtomicU64,
    pub(crate) aborted_generations: AtomicU64,
    pub(crate) prefix_mismatches: AtomicU64,
    pub(crate) sessions_started: AtomicU64,
    pub(crate) sessions_ended: AtomicU64,
    pub(crate) sessions_exported: AtomicU64,
    pub(crate) sessions_expired: AtomicU64,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Gauges read from the session store when rendering.
pub(crate) struct Gauges {
    pub(crate) live_sessions: usize,
    pub(crate) stored_tokens: u64,
    pub(crate) reserved_tokens: u64,
}

impl Metrics {
    pub(crate) fn request(&self, endpoint: &'static str, status: u16, elapsed: Duration) {
        *lock(&self.requests).entry((endpoint, status)).or_default() += 1;
        let secs = elapsed.as_secs_f64();
        let mut latency = lock(&self.latency);
        let h = latency.entry(endpoint).or_default();
        h.count += 1;
        h.sum += secs;
        for (i, bound) in BUCKETS.iter().enumerate() {
            if secs <= *bound {
                h.counts[i] += 1;
            }
        }
    }

    pub(crate) fn error(&self, kind: &'static str) {
        *lock(&self.errors).entry(kind).or_default() += 1;
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn render(&self, gauges: &Gauges) -> String {
        let mut out = String::new();
        out.push_str("# HELP rollout_proxy_requests_total HTTP requests by endpoint and status.\n");
        out.push_str("# TYPE rollout_proxy_requests_total counter\n");
        for ((endpoint, status), n) in lock(&self.requests).iter() {
            let _ = writeln!(
                out,
                "rollout_proxy_requests_total{{endpoint=\"{endpoint}\",status=\"{status}\"}} {n}"
            );
        }
        out.push_str(
            "# HELP rollout_proxy_request_duration_seconds Time to the response head, by endpoint.\n",
        );
        out.push_str("# TYPE rollout_proxy_request_duration_seconds histogram\n");
        for (endpoint, h) in lock(&self.latency).iter() {
            for (i, bound) in BUCKETS.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "rollout_proxy_request_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"{bound}\"}} {}",
                    h.counts[i]
                );
            }
            let _ = writeln!(
                out,
                "rollout_proxy_request_duration_seconds_bucket{{endpoint=\"{endpoint}\",le=\"+Inf\"}} {}",
                h.count
            );
            let _ = writeln!(
                out,
                "rollout_proxy_request_duration_seconds_sum{{endpoint=\"{endpoint}\"}} {}",
                h.sum
            );
            let _ = writeln!(
                out,
                "rollout_proxy_request_duration_seconds_count{{endpoint=\"{endpoint}\"}} {}",
                h.count
            );
        }
        out.push_str("# HELP rollout_proxy_errors_total Error answers by kind.\n");
        out.push_str("# TYPE rollout_proxy_errors_total counter\n");
        for (kind, n) in lock(&self.errors).iter() {
            let _ = writeln!(out, "rollout_proxy_errors_total{{kind=\"{kind}\"}} {n}");
        }
        let counters: [(&str, &str, &AtomicU64); 9] = [
            (
                "rollout_proxy_prompt_tokens_total",
                "Prompt tokens sent to the engine.",
                &self.prompt_tokens,
            ),
            (
                "rollout_proxy_completion_tokens_total",
                "Tokens sampled by the engine.",
                &self.completion_tokens,
            ),
            (
                "rollout_proxy_generations_total",
                "Generations recorded.",
                &self.generations,
            ),
            (
                "rollout_proxy_aborted_generations_total",
                "Generations dropped before they finished (client gone, engine error).",
                &self.aborted_generations,
            ),
            (
                "rollout_proxy_prefix_mismatches_total",
                "Requests that extended an earlier interaction the template did not render as a prefix.",
                &self.prefix_mismatches,
            ),
            (
                "rollout_proxy_sessions_started_total",
                "Sessions started.",
                &self.sessions_started,
            ),
            (
                "rollout_proxy_sessions_ended_total",
                "Sessions ended.",
                &self.sessions_ended,
            ),
            (
                "rollout_proxy_sessions_exported_total",
                "Sessions exported.",
                &self.sessions_exported,
            ),
            (
                "rollout_proxy_sessions_expired_total",
                "Sessions dropped after idling.",
                &self.sessions_expired,
            ),
        ];
        for (name, help, counter) in counters {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                counter.load(Ordering::Relaxed)
            );
        }
        let gauges: [(&str, &str, u64); 3] = [
            (
                "rollout_proxy_live_sessions",
                "Sessions held (live or awaiting export).",
                gauges.live_sessions as u64,
            ),
            (
                "rollout_proxy_stored_tokens",
                "Tokens held in recorded trajectories.",
                gauges.stored_tokens,
            ),
            (
                "rollout_proxy_reserved_tokens",
                "Tokens reserved by running generations.",
                gauges.reserved_tokens,
            ),
        ];
        for (name, help, value) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}");
        }
        out
    }
}
