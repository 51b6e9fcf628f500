//! Counters for `GET /metrics`, exposed in the OpenMetrics text format by `prometheus-client`: requests by
//! endpoint and status, latencies, tokens, sessions, and errors by kind.
//!
//! Counter families are named without `_total` here; the OpenMetrics encoder appends it to each sample, so
//! Prometheus stores the same series names as before (`rollout_proxy_requests_total`, ...).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::time::Duration;

/// The `Content-Type` of the exposition.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0,
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    endpoint: &'static str,
    status: u16,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct EndpointLabels {
    endpoint: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RuleLabels {
    rule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ErrorLabels {
    kind: &'static str,
}

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The proxy's counters, and the registry that exposes them.
pub(crate) struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    latency: Family<EndpointLabels, Histogram, fn() -> Histogram>,
    errors: Family<ErrorLabels, Counter>,
    integrity_hits: Family<RuleLabels, Counter>,
    pub(crate) prompt_tokens: Counter,
    pub(crate) completion_tokens: Counter,
    pub(crate) generations: Counter,
    pub(crate) aborted_generations: Counter,
    pub(crate) prefix_mismatches: Counter,
    pub(crate) template_renders: Counter,
    pub(crate) sessions_started: Counter,
    pub(crate) sessions_ended: Counter,
    pub(crate) sessions_exported: Counter,
    pub(crate) sessions_expired: Counter,
    live_sessions: Gauge,
    stored_tokens: Gauge,
    reserved_tokens: Gauge,
    response_bytes: Gauge,
    pool_held: Gauge,
    request_bytes: Gauge,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

/// Gauges read from the session store when rendering.
pub(crate) struct Gauges {
    pub(crate) live_sessions: usize,
    pub(crate) stored_tokens: u64,
    pub(crate) reserved_tokens: u64,
    pub(crate) response_bytes: usize,
    /// Requests being prepared on the pool or waiting for a thread of it.
    pub(crate) pool_held: usize,
    pub(crate) request_bytes: usize,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            errors: Family::default(),
            integrity_hits: Family::default(),
            prompt_tokens: Counter::default(),
            completion_tokens: Counter::default(),
            generations: Counter::default(),
            aborted_generations: Counter::default(),
            prefix_mismatches: Counter::default(),
            template_renders: Counter::default(),
            sessions_started: Counter::default(),
            sessions_ended: Counter::default(),
            sessions_exported: Counter::default(),
            sessions_expired: Counter::default(),
            live_sessions: Gauge::default(),
            stored_tokens: Gauge::default(),
            reserved_tokens: Gauge::default(),
            response_bytes: Gauge::default(),
            pool_held: Gauge::default(),
            request_bytes: Gauge::default(),
        };
        m.register();
        m
    }
}

impl Metrics {
    /// Registers every metric (the registry holds clones that share the counts). Help texts end without a
    /// period: the registry appends one.
    /// Counts one integrity hit of `rule`.
    pub(crate) fn integrity_hit(&self, rule: String) {
        self.integrity_hits.get_or_create(&RuleLabels { rule }).inc();
    }

    fn register(&mut self) {
        let r = &mut self.registry;
        r.register(
            "rollout_proxy_requests",
            "HTTP requests by endpoint and status",
            self.requests.clone(),
        );
        r.register(
            "rollout_proxy_request_duration_seconds",
            "Time to the response head, by endpoint",
            self.latency.clone(),
        );
        r.register(
            "rollout_proxy_errors",
            "Error answers by kind",
            self.errors.clone(),
        );
        r.register(
            "rollout_proxy_integrity_hits",
            "Integrity rule hits in recorded generations, by rule",
            self.integrity_hits.clone(),
        );
        let counters: [(&str, &str, &Counter); 10] = [
            (
                "rollout_proxy_prompt_tokens",
                "Prompt tokens sent to the engine",
                &self.prompt_tokens,
            ),
            (
                "rollout_proxy_completion_tokens",
                "Tokens sampled by the engine",
                &self.completion_tokens,
            ),
            (
                "rollout_proxy_generations",
                "Generations recorded",
                &self.generations,
            ),
            (
                "rollout_proxy_aborted_generations",
                "Generations dropped before they finished (client gone, engine error)",
                &self.aborted_generations,
            ),
            (
                "rollout_proxy_prefix_mismatches",
                "Requests that extended an earlier interaction the template did not render as a prefix",
                &self.prefix_mismatches,
            ),
            (
                "rollout_proxy_template_renders",
                "Chat template renders of prompts (a request extending an earlier interaction renders twice unless its rendering begins with the text of the earlier one's tokens)",
                &self.template_renders,
            ),
            (
                "rollout_proxy_sessions_started",
                "Sessions started",
                &self.sessions_started,
            ),
            (
                "rollout_proxy_sessions_ended",
                "Sessions ended",
                &self.sessions_ended,
            ),
            (
                "rollout_proxy_sessions_exported",
                "Sessions exported",
                &self.sessions_exported,
            ),
            (
                "rollout_proxy_sessions_expired",
                "Sessions dropped after idling",
                &self.sessions_expired,
            ),
        ];
        for (name, help, counter) in counters {
            r.register(name, help, counter.clone());
        }
        let gauges: [(&str, &str, &Gauge); 6] = [
            (
                "rollout_proxy_live_sessions",
                "Sessions held (live or awaiting export)",
                &self.live_sessions,
            ),
            (
                "rollout_proxy_stored_tokens",
                "Tokens held in recorded trajectories",
                &self.stored_tokens,
            ),
            (
                "rollout_proxy_reserved_tokens",
                "Tokens reserved by running generations",
                &self.reserved_tokens,
            ),
            (
                "rollout_proxy_stored_response_bytes",
                "Bytes of JSON held in stored Responses answers",
                &self.response_bytes,
            ),
            (
                "rollout_proxy_pool_requests",
                "Requests being parsed, rendered and tokenised on the pool, or waiting for it",
                &self.pool_held,
            ),
            (
                "rollout_proxy_request_bytes",
                "Bytes generation requests hold while they are read and prepared (bodies, parsed estimates)",
                &self.request_bytes,
            ),
        ];
        for (name, help, gauge) in gauges {
            r.register(name, help, gauge.clone());
        }
    }

    pub(crate) fn request(&self, endpoint: &'static str, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels { endpoint, status })
            .inc();
        self.latency
            .get_or_create(&EndpointLabels { endpoint })
            .observe(elapsed.as_secs_f64());
    }

    pub(crate) fn error(&self, kind: &'static str) {
        self.errors.get_or_create(&ErrorLabels { kind }).inc();
    }

    pub(crate) fn add(counter: &Counter, n: u64) {
        counter.inc_by(n);
    }

    /// The OpenMetrics exposition, with the gauges set from the session store's figures.
    pub(crate) fn render(&self, gauges: &Gauges) -> String {
        let clamp = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.live_sessions.set(clamp(gauges.live_sessions as u64));
        self.stored_tokens.set(clamp(gauges.stored_tokens));
        self.reserved_tokens.set(clamp(gauges.reserved_tokens));
        self.response_bytes.set(clamp(gauges.response_bytes as u64));
        self.pool_held.set(clamp(gauges.pool_held as u64));
        self.request_bytes.set(clamp(gauges.request_bytes as u64));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding into a String cannot fail");
        out
    }
}

#[cfg(test)]
mod tests;
