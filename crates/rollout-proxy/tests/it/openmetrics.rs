//! `GET /metrics` read by the real OpenMetrics parser of Python's `prometheus_client` (from the readers
//! virtualenv, `ARENA_RL_PY_READERS`), as Prometheus would scrape it.

use std::io::Write as _;
use std::process::{Command, Stdio};

use http::Method;
use serde_json::{Value, json};

use crate::common::{Proxy, call};

/// Parses the exposition from stdin and prints every family with its samples as JSON.
const PARSE: &str = r#"
import json, sys
from prometheus_client.openmetrics.parser import text_string_to_metric_families
families = {}
for f in text_string_to_metric_families(sys.stdin.read()):
    families[f.name] = {
        "type": f.type,
        "help": f.documentation,
        "samples": [[s.name, s.labels, s.value] for s in f.samples],
    }
print(json.dumps(families))
"#;

fn parse(python: &std::ffi::OsStr, text: &str) -> Value {
    let mut child = Command::new(python)
        .arg("-c")
        .arg(PARSE)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("writes the exposition");
    let out = child.wait_with_output().expect("python runs");
    assert!(
        out.status.success(),
        "the OpenMetrics parser refused the exposition:\n{}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("the script prints JSON")
}

/// The value of the one sample named `name` whose labels include `labels`.
fn sample(families: &Value, family: &str, name: &str, labels: &Value) -> f64 {
    let samples = families[family]["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("no family {family} in {families}"));
    let matching: Vec<f64> = samples
        .iter()
        .filter(|s| s[0] == name)
        .filter(|s| {
            labels
                .as_object()
                .expect("labels object")
                .iter()
                .all(|(k, v)| &s[1][k] == v)
        })
        .map(|s| s[2].as_f64().expect("a number"))
        .collect();
    assert_eq!(matching.len(), 1, "{name} {labels} in {samples:?}");
    matching[0]
}

#[tokio::test]
async fn prometheus_clients_openmetrics_parser_reads_the_exposition() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_READERS") else {
        eprintln!(
            "skipping: ARENA_RL_PY_READERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8});
    p.chat(&key, body.clone()).await;
    p.chat(&key, body.clone()).await;
    assert_eq!(
        p.chat("not-a-key", body).await.status,
        http::StatusCode::UNAUTHORIZED
    );
    let r = call(Method::GET, &p.url("/metrics"), &[], None).await;
    assert_eq!(
        r.headers.get("content-type").map(|v| v.to_str().expect("ascii")),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let families = parse(&python, &r.text);

    assert_eq!(families["rollout_proxy_requests"]["type"], "counter");
    assert_eq!(
        families["rollout_proxy_requests"]["help"],
        "HTTP requests by endpoint and status."
    );
    let chat = json!({"endpoint": "chat_completions", "status": "200"});
    assert_eq!(
        sample(
            &families,
            "rollout_proxy_requests",
            "rollout_proxy_requests_total",
            &chat
        ),
        2.0
    );
    let refused = json!({"endpoint": "chat_completions", "status": "401"});
    assert_eq!(
        sample(
            &families,
            "rollout_proxy_requests",
            "rollout_proxy_requests_total",
            &refused
        ),
        1.0
    );
    let latency = "rollout_proxy_request_duration_seconds";
    assert_eq!(families[latency]["type"], "histogram");
    let endpoint = json!({"endpoint": "chat_completions"});
    let count = sample(&families, latency, &format!("{latency}_count"), &endpoint);
    assert_eq!(count, 3.0, "two answers and one refusal");
    let inf = json!({"endpoint": "chat_completions", "le": "+Inf"});
    assert_eq!(
        sample(&families, latency, &format!("{latency}_bucket"), &inf),
        count
    );
    assert!(sample(&families, latency, &format!("{latency}_sum"), &endpoint) > 0.0);

    let total = |family: &str| sample(&families, family, &format!("{family}_total"), &json!({}));
    assert_eq!(total("rollout_proxy_sessions_started"), 1.0);
    assert_eq!(total("rollout_proxy_generations"), 2.0);
    assert!(total("rollout_proxy_completion_tokens") > 0.0);
    assert_eq!(families["rollout_proxy_live_sessions"]["type"], "gauge");
    let live = sample(
        &families,
        "rollout_proxy_live_sessions",
        "rollout_proxy_live_sessions",
        &json!({}),
    );
    assert_eq!(live, 1.0);
    let errors = json!({"kind": "unauthenticated"});
    assert_eq!(
        sample(
            &families,
            "rollout_proxy_errors",
            "rollout_proxy_errors_total",
            &errors
        ),
        1.0
    );
    let mut names: Vec<&str> = families
        .as_object()
        .expect("families")
        .keys()
        .map(String::as_str)
        .collect();
    names.sort_unstable();
    let want = [
        "aborted_generations",
        "completion_tokens",
        "errors",
        "generations",
        "live_sessions",
        "pool_requests",
        "prefix_mismatches",
        "prompt_tokens",
        "request_bytes",
        "request_duration_seconds",
        "requests",
        "reserved_tokens",
        "sessions_ended",
        "sessions_expired",
        "sessions_exported",
        "sessions_started",
        "stored_response_bytes",
        "stored_tokens",
        "template_renders",
    ]
    .map(|n| format!("rollout_proxy_{n}"));
    assert_eq!(names, want, "every family parses, under its old name");
}
