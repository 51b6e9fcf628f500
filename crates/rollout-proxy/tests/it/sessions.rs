//! Sessions, keys and the control endpoints over a real socket: reference section 8.4's cases 1-5, 13-20,
//! 23 and 26-28, and this project's fixes (keys stop at `end_session`, export deadlines, tombstones,
//! admission, the default admin key on public binds, idle expiry on a timer).

use std::net::SocketAddr;

use http::{Method, StatusCode};
use rollout_proxy::{EngineError, ProxyState, auth, check_bind};
use secrecy::{ExposeSecret, SecretString};
use serde_json::json;

use crate::common::{ADMIN, Proxy, call, config, engine_config, model, turn};

fn hello() -> serde_json::Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8})
}

#[tokio::test]
async fn session_keys_and_gateway_tokens_resolve_sessions() {
    let p = Proxy::default().await;
    let (a, key_a) = p.session("17:3").await;
    let (b, _) = p.session("17:4").await;
    // Case 1: an active session key resolves its session.
    let r = p.chat(&key_a, hello()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let gateway = p.state.gateway_key();
    let gw = gateway.expose_secret();
    let token_a = p.state.session_token(&a);
    let url = p.url("/v1/chat/completions");
    // Case 2: the gateway key in x-api-key next to another bearer, with a matching id and token.
    let r = call(
        Method::POST,
        &url,
        &[
            ("authorization", "Bearer arena-llm-key"),
            ("x-api-key", gw),
            ("x-session-id", &a),
            ("x-session-token", token_a.expose_secret()),
        ],
        Some(hello()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Case 3: the gateway key without session headers, or for an unknown session.
    let r = call(Method::POST, &url, &[("x-api-key", gw)], Some(hello())).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    let ghost = p.state.session_token("ghost-1");
    let r = call(
        Method::POST,
        &url,
        &[
            ("x-api-key", gw),
            ("x-session-id", "ghost-1"),
            ("x-session-token", ghost.expose_secret()),
        ],
        Some(hello()),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Case 4: A's token with B's id.
    let r = call(
        Method::POST,
        &url,
        &[
            ("x-api-key", gw),
            ("x-session-id", &b),
            ("x-session-token", token_a.expose_secret()),
        ],
        Some(hello()),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Case 5: the gateway capability may not set rewards or end sessions.
    for path in ["/rl/set_reward", "/rl/end_session"] {
        let r = call(
            Method::POST,
            &p.url(path),
            &[
                ("x-api-key", gw),
                ("x-session-id", &a),
                ("x-session-token", token_a.expose_secret()),
            ],
            Some(json!({"reward": 1.0})),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{path}: {}", r.text);
        assert!(r.text.contains("generation-only"));
    }
    // A session's key and its gateway token stop working at end_session.
    assert_eq!(p.end(&key_a).await.status, StatusCode::OK);
    assert_eq!(p.chat(&key_a, hello()).await.status, StatusCode::UNAUTHORIZED);
    let r = call(
        Method::POST,
        &url,
        &[
            ("x-api-key", gw),
            ("x-session-id", &a),
            ("x-session-token", token_a.expose_secret()),
        ],
        Some(hello()),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        p.chat("no-such-key", hello()).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        call(Method::POST, &url, &[], Some(hello())).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn start_session_keys() {
    let p = Proxy::default().await;
    // Case 15: without a key, a random token, longer than 10 characters and not the admin key.
    let (_, key) = p.session("t").await;
    assert!(key.len() > 10 && key != ADMIN);
    p.admin("/grant_capacity", json!({"count": 5})).await;
    // Case 14: a provided key is honoured.
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "api_key": "mine-123"}),
        )
        .await;
    assert_eq!(r.json()["api_key"], json!("mine-123"));
    let old = r.json()["session_id"].as_str().expect("id").to_string();
    // Case 16: the admin key as session key.
    let r = p
        .admin("/rl/start_session", json!({"task_id": "t", "api_key": ADMIN}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // Case 18: a key bound to an active session.
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "api_key": "mine-123"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    // Case 19: ending an empty session reports zero interactions.
    let r = p.end("mine-123").await;
    assert_eq!(r.json()["interaction_count"], json!(0));
    // Case 17: the key of a finished session is remapped to a new one.
    let r = p
        .admin(
            "/rl/start_session",
            json!({"task_id": "t", "api_key": "mine-123"}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let new = r.json()["session_id"].as_str().expect("id").to_string();
    assert_ne!(new, old);
    assert_eq!(p.chat("mine-123", hello()).await.status, StatusCode::OK);
    // Case 28: export by explicit id still targets the old session.
    let exported = p.export(&old, "individual").await;
    assert_eq!(
        (exported.session_id.as_str(), exported.interaction_count),
        (old.as_str(), 0)
    );
    // Session ids carry a random part.
    assert!(old.starts_with("t-") && old.len() == 18, "{old}");
}

#[tokio::test]
async fn control_endpoint_authorisation_and_bodies() {
    let p = Proxy::default().await;
    let (id, key) = p.session("t").await;
    let export = p.url("/export_trajectories");
    // Case 26: export with a session key.
    let r = call(
        Method::POST,
        &export,
        &[("authorization", &format!("Bearer {key}"))],
        Some(json!({"session_id": id})),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = call(Method::POST, &export, &[], Some(json!({"session_id": id}))).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    // Case 27: export without session_id.
    let r = p.admin("/export_trajectories", json!({})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.text);
    let r = p.admin("/rl/start_session", json!({})).await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    let r = call(
        Method::POST,
        &p.url("/rl/start_session"),
        &[("x-api-key", &key)],
        Some(json!({"task_id": "t"})),
    )
    .await;
    assert_eq!(
        r.status,
        StatusCode::FORBIDDEN,
        "a session key is not the admin key"
    );
    // Without capacity, start_session is refused with Retry-After.
    let r = p.admin("/rl/start_session", json!({"task_id": "t"})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        r.headers.get("retry-after").map(|v| v.to_str().expect("ascii")),
        Some("1")
    );
    // Rewards: by the session key until end_session, by the admin key until export.
    p.chat(&key, hello()).await;
    let reward = |k: String, body: serde_json::Value| {
        let url = p.url("/rl/set_reward");
        async move {
            call(
                Method::POST,
                &url,
                &[("authorization", &format!("Bearer {k}"))],
                Some(body),
            )
            .await
        }
    };
    assert_eq!(
        reward(key.clone(), json!({"reward": 0.5})).await.status,
        StatusCode::OK
    );
    assert_eq!(
        reward(key.clone(), json!({"reward": 0.5, "interaction_id": "nope"}))
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(p.end(&key).await.status, StatusCode::OK);
    assert_eq!(
        reward(key.clone(), json!({"reward": 0.0})).await.status,
        StatusCode::UNAUTHORIZED
    );
    let r = reward(ADMIN.into(), json!({"reward": 0.0})).await;
    assert_eq!(
        r.status,
        StatusCode::UNPROCESSABLE_ENTITY,
        "the admin names the session"
    );
    let r = reward(ADMIN.into(), json!({"reward": 0.25, "session_id": id})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Case 23: export with the admin key after the end; then the session is gone.
    let exported = p.export(&id, "concat").await;
    assert_eq!(exported.trajectories.len(), 1);
    assert_eq!(exported.trajectories[0].original_reward, 0.25);
    let r = p.admin("/export_trajectories", json!({"session_id": id})).await;
    assert_eq!(r.status, StatusCode::GONE);
    let r = p
        .admin("/export_trajectories", json!({"session_id": "never-0"}))
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    let health = call(Method::GET, &p.url("/health"), &[], None).await;
    assert_eq!(health.json()["status"], json!("ok"));
    let metrics = call(Method::GET, &p.url("/metrics"), &[], None).await;
    for needle in [
        "rollout_proxy_requests_total{endpoint=\"chat_completions\",status=\"200\"} 1",
        "rollout_proxy_sessions_exported_total 1",
        "rollout_proxy_errors_total{kind=\"rate_limited\"} 1",
        "rollout_proxy_request_duration_seconds_count{endpoint=\"start_session\"}",
    ] {
        assert!(
            metrics.text.contains(needle),
            "missing {needle} in\n{}",
            metrics.text
        );
    }
}

#[tokio::test]
async fn export_waits_for_end_session_with_a_deadline() {
    let p = Proxy::default().await;
    let (id, key) = p.session("t").await;
    p.chat(&key, hello()).await;
    let r = p
        .admin(
            "/export_trajectories",
            json!({"session_id": id, "wait_timeout_seconds": 0.05}),
        )
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert!(r.text.contains("did not end"), "{}", r.text);
    let waiting = p.admin(
        "/export_trajectories",
        json!({"session_id": id, "wait_timeout_seconds": 30}),
    );
    let ending = async {
        // The export is parked on the session's end signal; ending it releases the export.
        tokio::task::yield_now().await;
        p.end(&key).await
    };
    let (exported, ended) = tokio::join!(waiting, ending);
    assert_eq!(ended.status, StatusCode::OK);
    assert_eq!(exported.status, StatusCode::OK, "{}", exported.text);
    assert_eq!(exported.json()["interaction_count"], json!(1));
}

#[tokio::test]
async fn engine_failures_and_overflows_flag_the_session() {
    let p = Proxy::default().await;
    let (id, key) = p.session("t").await;
    // Case 13: a backend exception is a 500 and end_session reports system_error with the message.
    p.engine
        .fail_next(EngineError::Internal("the GPU caught fire".into()));
    let r = p.chat(&key, hello()).await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text);
    assert_eq!(r.json()["error"]["type"], json!("server_error"));
    // Case 20: a context overflow is 400 context_length_exceeded and flags the session.
    let long = "word ".repeat(5000);
    let r = p
        .chat(&key, json!({"messages": [{"role": "user", "content": long}]}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], json!("context_length_exceeded"));
    let end = p.end(&key).await.json();
    assert_eq!(end["system_error"], json!(true));
    assert!(
        end["system_error_message"]
            .as_str()
            .expect("message")
            .contains("the GPU caught fire")
    );
    assert_eq!(end["context_overflow"], json!(true));
    assert!(
        end["context_overflow_message"]
            .as_str()
            .expect("message")
            .contains("maximum context length is 4096")
    );
    let exported = p.export(&id, "individual").await;
    assert!(exported.system_error && exported.context_overflow);
}

#[tokio::test]
async fn the_token_budget_answers_429_in_openai_format() {
    let mut c = config();
    c.limits.max_stored_tokens = 60;
    let p = Proxy::start(c, engine_config()).await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn("ok"));
    assert_eq!(p.chat(&key, hello()).await.status, StatusCode::OK);
    let r = p.chat(&key, hello()).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.json()["error"]["type"], json!("rate_limit_error"));
    assert!(r.headers.contains_key("retry-after"));
}

#[tokio::test]
async fn the_default_admin_key_is_refused_on_public_binds() {
    let mut c = config();
    c.admin_key = SecretString::from(auth::DEFAULT_ADMIN_KEY);
    let public: SocketAddr = "0.0.0.0:0".parse().expect("addr");
    let loopback: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let err = check_bind(&public, &c).expect_err("refused");
    assert!(err.to_string().contains("public default admin key"), "{err}");
    check_bind(&loopback, &c).expect("loopback is fine");
    c.allow_default_admin_key = true;
    check_bind(&public, &c).expect("explicitly allowed");
}

#[tokio::test(start_paused = true)]
async fn idle_sessions_expire_on_the_sweeper_timer() {
    use tower::ServiceExt;
    let mut c = config();
    c.capacity_grants = false;
    c.limits.session_timeout = std::time::Duration::from_secs(60);
    c.sweep_interval = std::time::Duration::from_secs(10);
    let engine = std::sync::Arc::new(rollout_proxy::FakeEngine::new(engine_config()));
    let state = ProxyState::new(c, model(), engine).expect("state");
    let sweeper = state.spawn_sweeper();
    let app = rollout_proxy::router(state.clone());
    let request = |path: &str, key: &str, body: serde_json::Value| {
        http::Request::post(path)
            .header("authorization", format!("Bearer {key}"))
            .header("content-type", "application/json")
            .body(axum::body::Body::from(body.to_string()))
            .expect("request")
    };
    let r = app
        .clone()
        .oneshot(request("/rl/start_session", ADMIN, json!({"task_id": "t"})))
        .await
        .expect("answers");
    let body = http_body_util::BodyExt::collect(r.into_body())
        .await
        .expect("body")
        .to_bytes();
    let started: serde_json::Value = serde_json::from_slice(&body).expect("json");
    let key = started["api_key"].as_str().expect("key").to_string();
    tokio::time::sleep(std::time::Duration::from_secs(75)).await;
    let r = app
        .clone()
        .oneshot(request("/rl/end_session", &key, json!({})))
        .await
        .expect("answers");
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "the idle session was swept and its key dropped"
    );
    let id = started["session_id"].as_str().expect("id");
    let r = app
        .oneshot(request("/export_trajectories", ADMIN, json!({"session_id": id})))
        .await
        .expect("answers");
    assert_eq!(r.status(), StatusCode::GONE);
    sweeper.abort();
}

/// `arena-2026.md` 2.11 item 3: an overflow the engine reports after a stream's headers went out (SGLang's
/// refusal of a streamed request) arrives as a typed `context_length_exceeded` error event in each protocol,
/// not a generic server error, so a harness compacts instead of retrying; the session records an overflow.
#[tokio::test]
async fn an_overflow_after_the_stream_started_is_a_typed_event_in_every_protocol() {
    let p = Proxy::default().await;
    let overflow = || EngineError::ContextLengthExceeded {
        prompt: 120,
        max: 100,
    };
    let last_data = |text: &str| -> serde_json::Value {
        let line = text
            .lines()
            .rfind(|l| l.starts_with("data: ") && *l != "data: [DONE]")
            .expect("a data line");
        serde_json::from_str(line.trim_start_matches("data: ")).expect("json")
    };

    let (_, key) = p.session("chat").await;
    p.engine.fail_next(overflow());
    let r = p
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": "hi"}], "stream": true}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "the stream had started");
    let error = &last_data(&r.text)["error"];
    assert_eq!(error["type"], "context_length_exceeded", "{}", r.text);
    assert_eq!(error["code"], "context_length_exceeded", "{}", r.text);
    assert!(error["message"].as_str().is_some_and(|m| !m.is_empty()));
    let end = p.end(&key).await.json();
    assert_eq!(end["context_overflow"], json!(true), "{end}");

    let (_, key) = p.session("messages").await;
    p.engine.fail_next(overflow());
    let r = p
        .messages(
            &key,
            json!({"model": "m", "max_tokens": 16, "stream": true,
                   "messages": [{"role": "user", "content": "hi"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    let event = last_data(&r.text);
    assert_eq!(event["type"], "error", "{}", r.text);
    assert_eq!(
        event["error"]["message"],
        "prompt is too long: 120 tokens > 100 maximum"
    );
    assert_eq!(event["detail"]["type"], "context_length_exceeded");

    let (_, key) = p.session("responses").await;
    p.engine.fail_next(overflow());
    let r = p.responses(&key, json!({"input": "hi", "stream": true})).await;
    assert_eq!(r.status, StatusCode::OK);
    let failed = last_data(&r.text);
    assert_eq!(failed["type"], "response.failed", "{}", r.text);
    assert_eq!(failed["response"]["error"]["code"], "context_length_exceeded");
}

/// `arena-2026.md` 3.5 test 5 (`test_proxy_episode_return_requires_opt_in`), over a real socket: a session
/// whose harness compacted twice (three conversations, so three roots and three `concat` chains) gets the
/// episode's reward on every chain only when the export asks for it; asked for another style, the export
/// is refused and the session kept.
#[tokio::test]
async fn the_episode_reward_scores_every_compacted_chain_only_when_asked() {
    let p = Proxy::default().await;
    let compacted = |n: usize| {
        json!({"model": "m", "max_tokens": 8, "messages": [
            {"role": "user", "content": format!("[context compacted {n} times] hi")}
        ]})
    };
    let mut leaves_by_ask = Vec::new();
    for ask in [None, Some(0.5)] {
        let (id, key) = p.session("t").await;
        for n in 0..3 {
            assert_eq!(p.chat(&key, compacted(n)).await.status, StatusCode::OK);
        }
        assert_eq!(p.end(&key).await.status, StatusCode::OK);
        let r = p
            .admin(
                "/export_trajectories",
                json!({"session_id": id, "style": "individual", "episode_reward": 0.5}),
            )
            .await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
        assert!(
            r.text
                .contains("Episode reward assignment requires concat export"),
            "{}",
            r.text
        );
        let r = p
            .admin(
                "/export_trajectories",
                json!({"session_id": id, "style": "concat", "final_reward": 0.5, "episode_reward": ask}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let exported: rollout_proxy::ExportedSession = serde_json::from_str(&r.text).expect("parses");
        leaves_by_ask.push(
            exported
                .trajectories
                .iter()
                .map(|t| t.original_reward)
                .collect::<Vec<_>>(),
        );
    }
    assert_eq!(leaves_by_ask, [vec![0.0, 0.0, 0.5], vec![0.5, 0.5, 0.5]]);
}
