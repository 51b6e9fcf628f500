//! A real LiteLLM proxy (the gateway the reference's Arena uses, from the clients virtualenv) in front of
//! the rollout proxy, configured with it as an Anthropic upstream and as an OpenAI upstream under the
//! generation-only gateway key. A Claude-style and a Chat-style request, each with its own session's
//! `x-session-id` and `x-session-token`, pass through LiteLLM and are bound to the right sessions.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use http::{Method, StatusCode};
use secrecy::ExposeSecret;
use serde_json::json;

use crate::common::{Proxy, call, fixture, turn};

const MASTER_KEY: &str = "sk-it-litellm-master";

/// Kills LiteLLM when the test ends, however it ends.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn litellm_forwards_both_protocols_to_the_right_sessions() {
    let python = fixture("ARENA_RL_PY_CLIENTS");
    let p = Proxy::default().await;
    let (claude_session, _) = p.session("via-litellm-claude").await;
    let (chat_session, _) = p.session("via-litellm-chat").await;
    let gateway = p.state.gateway_key().expose_secret().to_string();
    let dir = tempfile::tempdir().expect("temp dir");
    let config = dir.path().join("litellm.yaml");
    std::fs::write(
        &config,
        format!(
            "model_list:\n\
             \x20 - model_name: claude-upstream\n\
             \x20   litellm_params:\n\
             \x20     model: anthropic/smol\n\
             \x20     api_base: {base}\n\
             \x20     api_key: {gateway}\n\
             \x20 - model_name: chat-upstream\n\
             \x20   litellm_params:\n\
             \x20     model: openai/smol\n\
             \x20     api_base: {base}/v1\n\
             \x20     api_key: {gateway}\n\
             general_settings:\n\
             \x20 master_key: {MASTER_KEY}\n\
             \x20 forward_client_headers_to_llm_api: true\n\
             litellm_settings:\n\
             \x20 telemetry: false\n",
            base = p.url(""),
        ),
    )
    .expect("config");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let log = std::fs::File::create(dir.path().join("litellm.log")).expect("log file");
    let child = Command::new(python.with_file_name("litellm"))
        .arg("--config")
        .arg(&config)
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--num_workers",
            "1",
        ])
        .env("LITELLM_TELEMETRY", "False")
        .env("LITELLM_LOG", "ERROR")
        .env("NO_PROXY", "*")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("litellm starts");
    let _litellm = Killed(child);
    let litellm = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        // Probe the port first: the request helper treats a refused connection as a failure.
        let listening = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok();
        if listening
            && call(Method::GET, &format!("{litellm}/health/liveliness"), &[], None)
                .await
                .status
                .is_success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "LiteLLM did not start within 180 s:\n{}",
            std::fs::read_to_string(dir.path().join("litellm.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    let headers = |session: &str| {
        let token = p.state.session_token(session).expose_secret().to_string();
        (session.to_string(), token)
    };
    let (id, token) = headers(&claude_session);
    p.engine.push_script(turn("Claude-style answer."));
    let r = call(
        Method::POST,
        &format!("{litellm}/v1/messages"),
        &[
            ("x-api-key", MASTER_KEY),
            ("anthropic-version", "2023-06-01"),
            ("x-session-id", &id),
            ("x-session-token", &token),
        ],
        Some(json!({"model": "claude-upstream", "max_tokens": 32,
                    "messages": [{"role": "user", "content": "Hello over Messages"}]})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["content"][0]["text"], "Claude-style answer.");

    let (id, token) = headers(&chat_session);
    p.engine.push_script(turn("Chat-style answer."));
    let r = call(
        Method::POST,
        &format!("{litellm}/v1/chat/completions"),
        &[
            ("authorization", &format!("Bearer {MASTER_KEY}")),
            ("x-session-id", &id),
            ("x-session-token", &token),
        ],
        Some(json!({"model": "chat-upstream", "messages": [{"role": "user", "content": "Hello over Chat"}]})),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "Chat-style answer.");

    // Each request landed in its own session, with exactly the tokens the engine sampled.
    let outputs = p.engine.outputs();
    for (session, output) in [(&claude_session, &outputs[0]), (&chat_session, &outputs[1])] {
        let r = p.admin("/rl/end_session", json!({"session_id": session})).await;
        assert_eq!(r.json()["interaction_count"], 1, "{session}: {}", r.text);
        let exported = p.export(session, "concat").await;
        let t = &exported.trajectories[0];
        let sampled: Vec<u32> = t
            .token_ids
            .iter()
            .zip(&t.loss_mask)
            .filter(|(_, m)| **m == 1)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(sampled, output.iter().map(|s| s.id).collect::<Vec<_>>());
    }
}
