//! The exposition's names and values, as Prometheus stores them.

use std::time::Duration;

use super::*;

#[test]
fn the_exposition_keeps_the_series_names_and_counts() {
    let m = Metrics::default();
    m.request("chat_completions", 200, Duration::from_millis(3));
    m.request("chat_completions", 200, Duration::from_secs(200));
    m.request("chat_completions", 429, Duration::from_millis(1));
    m.error("rate_limited");
    Metrics::add(&m.prompt_tokens, 12);
    let text = m.render(&Gauges {
        live_sessions: 2,
        stored_tokens: 40,
        reserved_tokens: 7,
        response_bytes: 4096,
        pool_held: 3,
        request_bytes: 5,
    });
    for line in [
        "# TYPE rollout_proxy_requests counter",
        "rollout_proxy_requests_total{endpoint=\"chat_completions\",status=\"200\"} 2",
        "rollout_proxy_requests_total{endpoint=\"chat_completions\",status=\"429\"} 1",
        "# TYPE rollout_proxy_request_duration_seconds histogram",
        "rollout_proxy_request_duration_seconds_bucket{le=\"0.005\",endpoint=\"chat_completions\"} 2",
        "rollout_proxy_request_duration_seconds_bucket{le=\"120.0\",endpoint=\"chat_completions\"} 2",
        "rollout_proxy_request_duration_seconds_bucket{le=\"+Inf\",endpoint=\"chat_completions\"} 3",
        "rollout_proxy_request_duration_seconds_count{endpoint=\"chat_completions\"} 3",
        "rollout_proxy_errors_total{kind=\"rate_limited\"} 1",
        "# HELP rollout_proxy_prompt_tokens Prompt tokens sent to the engine.",
        "rollout_proxy_prompt_tokens_total 12",
        "rollout_proxy_sessions_exported_total 0",
        "# TYPE rollout_proxy_live_sessions gauge",
        "rollout_proxy_live_sessions 2",
        "rollout_proxy_stored_tokens 40",
        "rollout_proxy_reserved_tokens 7",
        "rollout_proxy_stored_response_bytes 4096",
        "rollout_proxy_pool_requests 3",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line:?} in\n{text}");
    }
    assert_eq!(text.lines().last(), Some("# EOF"), "{text}");
}
