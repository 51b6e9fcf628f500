//! The LLM gateway over real sockets: each protocol forwarded natively (Chat Completions to the real
//! rollout proxy, Anthropic and Responses to a protocol-correct upstream), server-sent events arriving one
//! by one, session and protocol headers passed on, and every refusal in the caller's own error format.

use std::sync::Arc;
use std::time::Duration;

use arena_sim::{ArenaSim, Endpoint, FaultKind, FaultRule, GatewayCounters};
use futures::StreamExt;
use secrecy::ExposeSecret;
use serde_json::{Value, json};
use stream_config::LlmProtocol;
use tokio::sync::Semaphore;

use crate::support::{LLM_KEY, Proxy, Reply, UPSTREAM_KEY, Upstream, http, register, world};

async fn sim() -> ArenaSim {
    ArenaSim::start(world()).await.expect("sim starts")
}

async fn post(sim: &ArenaSim, path: &str, headers: &[(&str, &str)], body: &Value) -> (u16, Value) {
    let mut request = http().post(format!("{}{path}", sim.base_url())).json(body);
    for (k, v) in headers {
        request = request.header(*k, *v);
    }
    let r = request.send().await.expect("sent");
    let status = r.status().as_u16();
    let text = r.text().await.expect("body");
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn bearer() -> (&'static str, String) {
    ("authorization", format!("Bearer {LLM_KEY}"))
}

#[tokio::test]
async fn chat_reaches_the_real_proxy_with_the_session_headers() {
    let proxy = Proxy::start().await;
    let sim = sim().await;
    let gateway_key = proxy.state.gateway_key();
    register(
        &sim,
        "stream-areal-session-chat",
        &proxy.url(),
        gateway_key.expose_secret(),
        &["chat"],
    )
    .await;
    let (session, key) = proxy.session("gw").await;
    let token = proxy.state.session_token(&session);
    for path in ["/api/v1/chat/completions", "/api/chat/completions"] {
        proxy.script("forwarded natively");
        let body = json!({"model": "stream-areal-session-chat",
                          "messages": [{"role": "user", "content": "hi"}]});
        let (status, reply) = post(
            &sim,
            path,
            &[
                ("authorization", &format!("Bearer {LLM_KEY}")),
                ("x-session-id", &session),
                ("x-session-token", token.expose_secret()),
            ],
            &body,
        )
        .await;
        assert_eq!(status, 200, "{path}: {reply}");
        assert_eq!(reply["choices"][0]["message"]["content"], "forwarded natively");
    }
    // The proxy bound both calls to the session named by the headers: that is how it authenticated them.
    assert_eq!(proxy.end(&key).await, 2);
    // Without the session headers the proxy refuses the gateway key, and the gateway passes that on.
    let (status, _) = post(
        &sim,
        "/api/v1/chat/completions",
        &[("x-api-key", LLM_KEY)],
        &json!({"model": "stream-areal-session-chat", "messages": []}),
    )
    .await;
    assert_eq!(status, 401);
    let counters = &sim.counters().gateway[&LlmProtocol::ChatCompletions];
    assert_eq!((counters.requests, counters.forwarded), (3, 3), "{counters:?}");
}

#[tokio::test]
async fn anthropic_streams_arrive_event_by_event_with_every_header() {
    let gate = Arc::new(Semaphore::new(0));
    let upstream = Upstream::gated(gate.clone()).await;
    upstream.push(Reply::Text("streamed answer".to_string()));
    let sim = sim().await;
    register(
        &sim,
        "claude-route",
        &upstream.url(),
        UPSTREAM_KEY,
        &["anthropic"],
    )
    .await;
    let response = http()
        .post(format!("{}/api/v1/messages?beta=true", sim.base_url()))
        .header("x-api-key", LLM_KEY)
        .header("anthropic-version", "2023-06-01")
        .header(
            "anthropic-beta",
            "claude-code-20250219,interleaved-thinking-2025-05-14",
        )
        .header("x-app", "cli")
        .header("X-Session-Id", "s-1")
        .header("X-Session-Token", "tok-1")
        .json(&json!({"model": "claude-route", "max_tokens": 8, "stream": true,
                      "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .expect("sent");
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    let mut chunks = response.bytes_stream();
    let mut seen = String::new();
    // The upstream holds every event after the first until the gate opens: if the gateway buffered, this
    // read would never finish (the timeout only turns that hang into a failure).
    while !seen.contains("\n\n") {
        let chunk = tokio::time::timeout(Duration::from_secs(20), chunks.next())
            .await
            .expect("the first event arrives before the rest is written")
            .expect("a chunk")
            .expect("no error");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.starts_with("event: message_start\n"), "{seen}");
    assert!(!seen.contains("message_stop"), "{seen}");
    gate.add_permits(1);
    while let Some(chunk) = chunks.next().await {
        seen.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
    }
    assert!(
        seen.ends_with("event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n"),
        "{seen}"
    );

    let up = &upstream.seen()[0];
    assert_eq!(
        (up.path.as_str(), up.query.as_deref()),
        ("/v1/messages", Some("beta=true"))
    );
    assert_eq!(
        up.header("authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
    assert_eq!(up.header("x-api-key"), Some(UPSTREAM_KEY));
    assert_eq!(up.header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(
        up.header("anthropic-beta"),
        Some("claude-code-20250219,interleaved-thinking-2025-05-14")
    );
    assert_eq!(up.header("x-app"), Some("cli"));
    assert_eq!(up.header("x-session-id"), Some("s-1"));
    assert_eq!(up.header("x-session-token"), Some("tok-1"));
    assert_eq!(up.body["model"], "claude-route");
    let counters = &sim.counters().gateway[&LlmProtocol::Anthropic];
    assert_eq!(counters.forwarded, 1);
    assert_eq!(sim.counters().requests_to(Endpoint::GatewayMessages), 1);
}

#[tokio::test]
async fn responses_and_count_tokens_are_forwarded_natively() {
    let upstream = Upstream::start().await;
    upstream.push(Reply::Text("one".to_string()));
    upstream.push(Reply::Lookup("k1".to_string()));
    let sim = sim().await;
    // An upstream base URL that ends in /v1 gets one /v1, not two.
    register(
        &sim,
        "codex-route",
        &format!("{}/v1/", upstream.url()),
        UPSTREAM_KEY,
        &["responses", "anthropic"],
    )
    .await;
    let (k, v) = bearer();
    for path in ["/api/v1/responses", "/api/responses"] {
        let r = http()
            .post(format!("{}{path}", sim.base_url()))
            .header(k, &v)
            .json(&json!({"model": "codex-route", "input": "hi", "stream": true}))
            .send()
            .await
            .expect("sent");
        assert_eq!(r.status(), 200);
        let text = r.text().await.expect("body");
        assert!(text.contains("event: response.completed"), "{text}");
    }
    let (status, body) = post(
        &sim,
        "/api/v1/messages/count_tokens",
        &[("x-api-key", LLM_KEY)],
        &json!({"model": "codex-route", "messages": []}),
    )
    .await;
    assert_eq!((status, body), (200, json!({"input_tokens": 12})));
    let paths: Vec<String> = upstream.seen().iter().map(|s| s.path.clone()).collect();
    assert_eq!(
        paths,
        ["/v1/responses", "/v1/responses", "/v1/messages/count_tokens"]
    );
    let counters = sim.counters();
    assert_eq!(counters.gateway[&LlmProtocol::Responses].forwarded, 2);
    assert_eq!(counters.gateway[&LlmProtocol::Anthropic].forwarded, 1);
}

#[tokio::test]
async fn the_route_decides_the_upstream_model() {
    let upstream = Upstream::start().await;
    let sim = ArenaSim::start(
        arena_sim::World::from_yaml(&format!(
            "token: t\nllm_api_key: {LLM_KEY}\nroutes:\n  - model_name: public-name\n    upstream:\n      \
             base_url: {}\n      api_key: {UPSTREAM_KEY}\n      upstream_model: private-name\n",
            upstream.url()
        ))
        .expect("world parses"),
    )
    .await
    .expect("sim starts");
    let (status, reply) = post(
        &sim,
        "/api/v1/chat/completions",
        &[("x-api-key", LLM_KEY)],
        &json!({"model": "public-name", "messages": [], "temperature": 0.5}),
    )
    .await;
    assert_eq!(status, 200, "{reply}");
    let seen = &upstream.seen()[0];
    assert_eq!(
        seen.body,
        json!({"model": "private-name", "messages": [], "temperature": 0.5})
    );
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {UPSTREAM_KEY}").as_str())
    );
}

/// Every refusal, in each caller's format.
#[tokio::test]
async fn refusals_speak_the_callers_protocol() {
    let upstream = Upstream::start().await;
    let sim = sim().await;
    register(&sim, "chat-only", &upstream.url(), UPSTREAM_KEY, &["chat"]).await;
    register(
        &sim,
        "collected",
        &upstream.url(),
        UPSTREAM_KEY,
        &["chat", "anthropic"],
    )
    .await;
    register(&sim, "nowhere", "http://127.0.0.1:1", UPSTREAM_KEY, &["chat"]).await;
    assert!(sim.gc_route("collected"));
    let good = [("x-api-key", LLM_KEY)];
    type Headers<'a> = Vec<(&'a str, &'a str)>;
    let cases: Vec<(&str, &str, Headers, Value)> = vec![
        (
            "no key",
            "/api/v1/messages",
            vec![],
            json!({"model": "chat-only"}),
        ),
        (
            "wrong key",
            "/api/v1/chat/completions",
            vec![("authorization", "Bearer nope")],
            json!({"model": "chat-only"}),
        ),
        (
            "no model",
            "/api/v1/responses",
            good.to_vec(),
            json!({"input": "hi"}),
        ),
        (
            "unknown model",
            "/api/v1/messages",
            good.to_vec(),
            json!({"model": "never"}),
        ),
        (
            "collected route",
            "/api/chat/completions",
            good.to_vec(),
            json!({"model": "collected"}),
        ),
        (
            "not native",
            "/api/v1/messages",
            good.to_vec(),
            json!({"model": "chat-only"}),
        ),
        (
            "not native",
            "/api/responses",
            good.to_vec(),
            json!({"model": "chat-only"}),
        ),
        (
            "unreachable",
            "/api/v1/chat/completions",
            good.to_vec(),
            json!({"model": "nowhere"}),
        ),
    ];
    let mut replies = Vec::new();
    for (what, path, headers, body) in cases {
        let (status, reply) = post(&sim, path, &headers, &body).await;
        replies.push(json!({"case": what, "path": path, "status": status, "body": reply}));
    }
    insta::assert_json_snapshot!("gateway_refusals", replies);
    assert!(upstream.seen().is_empty(), "nothing was forwarded");
    let counters = sim.counters().gateway;
    assert_eq!(
        counters[&LlmProtocol::Anthropic],
        GatewayCounters {
            requests: 3,
            unauthorized: 1,
            unknown_model: 1,
            unsupported_protocol: 1,
            ..GatewayCounters::default()
        }
    );
    assert_eq!(counters[&LlmProtocol::ChatCompletions].upstream_errors, 1);
    assert_eq!(counters[&LlmProtocol::Responses].bad_requests, 1);
}

#[tokio::test]
async fn faults_hit_the_gateway_too() {
    let upstream = Upstream::start().await;
    let sim = sim().await;
    register(&sim, "m", &upstream.url(), UPSTREAM_KEY, &["chat", "anthropic"]).await;
    sim.add_fault(FaultRule::on(Endpoint::GatewayChat, FaultKind::Status(429)).times(1));
    sim.add_fault(FaultRule::on(Endpoint::GatewayChat, FaultKind::Drop).times(1));
    sim.add_fault(FaultRule::on(Endpoint::GatewayMessages, FaultKind::GcRoute).times(1));
    let body = json!({"model": "m", "messages": []});
    let (status, reply) = post(&sim, "/api/v1/chat/completions", &[("x-api-key", LLM_KEY)], &body).await;
    assert_eq!(status, 429);
    assert_eq!(reply["error"]["code"], "rate_limit_exceeded");
    let lost = http()
        .post(format!("{}/api/v1/chat/completions", sim.base_url()))
        .header("x-api-key", LLM_KEY)
        .json(&body)
        .send()
        .await;
    let lost = match lost {
        Ok(r) => r.bytes().await.map(|_| ()),
        Err(e) => Err(e),
    };
    assert!(lost.is_err(), "the answer is lost");
    assert_eq!(upstream.seen().len(), 1, "the lost request reached the model");
    // A route collected under the harness's feet stops forwarding.
    let (status, reply) = post(&sim, "/api/v1/messages", &[("x-api-key", LLM_KEY)], &body).await;
    assert_eq!(status, 404);
    assert_eq!(reply["error"]["type"], "not_found_error");
    assert!(sim.routes().is_empty());
    assert_eq!(sim.counters().gc_removals, 1);
    assert_eq!(sim.counters().faults[&Endpoint::GatewayChat], 2);
}
