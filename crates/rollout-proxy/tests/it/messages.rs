//! Anthropic Messages over a real socket: answers with thinking, text and tool use, the streamed event
//! sequence, stop reasons, count_tokens, preprocessors, and errors in Anthropic's format (including
//! section 8.4 item 21: a streaming request that overflows the context answers 400 before any event).

use std::time::Duration;

use http::{Method, StatusCode};
use rollout_proxy::FakeEngine;
use serde_json::{Value, json};

use crate::common::{
    Proxy, call, config, engine_config, frames, oneshot_state, post, redact, start, tokens, turn,
};

const READ_TOOL: &str = r#"[{"name": "read", "description": "Read a file", "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}}, "cache_control": {"type": "ephemeral"}}]"#;

fn tools() -> Value {
    serde_json::from_str(READ_TOOL).expect("tools")
}

fn ask(text: &str) -> Value {
    json!({"model": "smol", "max_tokens": 256, "system": "You read files.",
           "messages": [{"role": "user", "content": text}]})
}

const THINK_AND_CALL: &str = "<think>\nI should read it.\n</think>\n\nReading.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>";

#[tokio::test]
async fn a_message_carries_thinking_text_and_tool_use() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn(THINK_AND_CALL));
    let mut body = ask("Read a.txt");
    body["tools"] = tools();
    body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
    body["metadata"] = json!({"user_id": "u1"});
    let r = p.messages(&key, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(v["stop_reason"], "tool_use");
    assert_eq!(v["content"][0]["type"], "thinking");
    assert_eq!(v["content"][0]["thinking"], "I should read it.\n");
    assert_eq!(v["content"][1], json!({"type": "text", "text": "Reading.\n"}));
    assert_eq!(v["content"][2]["input"], json!({"path": "a.txt"}));
    assert!(v["content"][2]["id"].as_str().expect("id").starts_with("toolu_"));
    assert_eq!(
        v["usage"]["input_tokens"],
        json!(p.engine.requests()[0].input_ids.len())
    );
    assert_eq!(v["usage"]["output_tokens"], json!(turn(THINK_AND_CALL).len()));
    insta::assert_snapshot!(redact(&r.text));
}

#[tokio::test]
async fn the_stream_follows_anthropics_event_sequence() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn(THINK_AND_CALL));
    let mut body = ask("Read a.txt");
    body["tools"] = tools();
    body["stream"] = json!(true);
    let r = p.messages(&key, body.clone()).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    insta::assert_snapshot!("stream_thinking_text_tool_use", redact(&r.text));
}

#[tokio::test(start_paused = true)]
async fn the_stream_is_incremental_with_ping_events_and_no_blank_text_block() {
    let mut cfg = engine_config();
    cfg.token_latency = Duration::from_millis(250);
    let (_, engine, app) = oneshot_state(FakeEngine::new(cfg), Duration::from_millis(200));
    let key = start(&app).await;
    // Leading whitespace waits for visible text rather than opening a text block by itself.
    engine.push_script(turn("\n\nPlain answer."));
    let mut body = ask("Answer plainly");
    body["stream"] = json!(true);
    let frames = frames(post(&app, "/v1/messages", &key, body).await).await;
    assert!(frames[0].starts_with("event: message_start\n"), "{frames:?}");
    let text_deltas = frames.iter().filter(|f| f.contains("\"text_delta\"")).count();
    assert!(text_deltas >= 3, "one frame per token as it arrives: {frames:?}");
    insta::assert_snapshot!("stream_plain_text", redact(&frames.concat()));
}

#[tokio::test]
async fn stop_sequences_and_the_token_limit_set_the_stop_reason() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn("one two END three"));
    let mut body = ask("count");
    body["stop_sequences"] = json!(["END", "NEVER"]);
    let v = p.messages(&key, body).await.json();
    assert_eq!(v["stop_reason"], "stop_sequence");
    assert_eq!(v["stop_sequence"], "END");
    assert_eq!(v["content"][0]["text"], "one two ");

    p.engine.push_script(turn("a b c d e f"));
    let mut body = ask("letters");
    body["max_tokens"] = json!(2);
    let v = p.messages(&key, body).await.json();
    assert_eq!(v["stop_reason"], "max_tokens");
    assert_eq!(v["usage"]["output_tokens"], 2);

    p.engine.push_script(turn("done"));
    let v = p.messages(&key, ask("finish")).await.json();
    assert_eq!(v["stop_reason"], "end_turn");
    assert_eq!(v["stop_sequence"], Value::Null);
}

#[tokio::test]
async fn count_tokens_is_the_prompt_a_generation_sees() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    let mut body = ask("How long is this?");
    body["tools"] = tools();
    let r = call(
        Method::POST,
        &p.url("/v1/messages/count_tokens"),
        &[("authorization", &format!("Bearer {key}"))],
        Some(body.clone()),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let counted = r.json()["input_tokens"].as_u64().expect("count") as usize;
    assert!(p.engine.requests().is_empty(), "counting generates nothing");
    p.engine.push_script(turn("Short."));
    p.messages(&key, body).await;
    assert_eq!(counted, p.engine.requests()[0].input_ids.len());
}

#[tokio::test]
async fn claude_code_preprocessors_clean_the_rendered_prompt() {
    let mut c = config();
    c.preprocessors = [
        "strip-anthropic-billing-header",
        "strip-system-reminders",
        "strip-anthropic-cache-fields",
        "normalize-tool-call-arguments",
    ]
    .map(String::from)
    .to_vec();
    let p = Proxy::start(c, engine_config()).await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn("ok"));
    let body = json!({"model": "smol", "max_tokens": 16,
    "system": [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332; cc_entrypoint=cli;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
    ],
    "messages": [{"role": "user", "content": [
        {"type": "text", "text": "<system-reminder>Be brief.</system-reminder>"},
        {"type": "text", "text": "Fix the bug.", "cache_control": {"type": "ephemeral"}},
    ]}]});
    let r = p.messages(&key, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let prompt = &p.engine.requests()[0].input_ids;
    let expected = tokens(
        "<|im_start|>system\nYou are a coding agent.<|im_end|>\n<|im_start|>user\n\nFix the bug.<|im_end|>\n<|im_start|>assistant\n",
    );
    assert_eq!(prompt.as_ref(), expected.as_slice());
}

#[tokio::test]
async fn errors_use_anthropics_body_and_status() {
    let p = Proxy::default().await;
    let (session, key) = p.session("t").await;
    for (body, needle) in [
        (json!({"max_tokens": 5}), "messages: field required"),
        (
            json!({"messages": [{"role": "tool", "content": "x"}]}),
            "messages[0].role must be \\\"user\\\", \\\"assistant\\\" or \\\"system\\\"",
        ),
        (
            json!({"messages": [{"role": "user", "content": 7}]}),
            "messages[0].content must be a string or a list",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"text": "no type"}]}]}),
            "messages[0].content[0] must be an object with a type",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "sometimes"}}),
            "thinking.type must be",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "system": 3}),
            "system must be a string",
        ),
    ] {
        let r = p.messages(&key, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        let v = r.json();
        assert_eq!(v["type"], "error", "{}", r.text);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(r.text.contains(needle), "{body}: {}", r.text);
    }
    let r = p.messages("not-a-key", ask("x")).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        r.json(),
        json!({"type": "error", "error": {"type": "authentication_error", "message": "invalid or inactive session key"}})
    );

    // Section 8.4 item 21: a streaming request that overflows answers 400 with the structured detail
    // before any event, and the session is flagged.
    let mut body = ask(&"word ".repeat(6000));
    body["stream"] = json!(true);
    let r = p.messages(&key, body).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.headers["content-type"], "application/json");
    let v = r.json();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let message = v["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("prompt is too long: ") && message.ends_with(" tokens > 4096 maximum"),
        "{message}"
    );
    assert_eq!(v["detail"]["type"], "context_length_exceeded");
    assert!(
        p.engine.requests().is_empty(),
        "the overflow never reached the engine"
    );
    let r = p.admin("/rl/end_session", json!({"session_id": session})).await;
    let end = r.json();
    assert_eq!(end["context_overflow"], true);
    assert!(
        end["context_overflow_message"]
            .as_str()
            .expect("message")
            .contains("maximum context length is 4096")
    );
}

#[tokio::test]
async fn the_gateway_key_with_session_headers_binds_messages_to_the_session() {
    let p = Proxy::default().await;
    let (session, _) = p.session("gw").await;
    let token = secrecy::ExposeSecret::expose_secret(&p.state.session_token(&session)).to_string();
    let gateway = secrecy::ExposeSecret::expose_secret(&p.state.gateway_key()).to_string();
    p.engine.push_script(turn("bound"));
    let r = call(
        Method::POST,
        &p.url("/v1/messages?beta=true"),
        &[
            ("x-api-key", &gateway),
            ("x-session-id", &session),
            ("x-session-token", &token),
            (
                "anthropic-beta",
                "claude-code-20250219,interleaved-thinking-2025-05-14",
            ),
        ],
        Some(ask("hi")),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = p.admin("/rl/end_session", json!({"session_id": session})).await;
    assert_eq!(r.json()["interaction_count"], 1);
}

#[tokio::test]
async fn an_engine_failure_after_the_stream_started_is_an_error_event() {
    let p = Proxy::default().await;
    let (session, key) = p.session("t").await;
    p.engine.fail_next(rollout_proxy::EngineError::Internal(
        "the accelerator fell over".into(),
    ));
    let mut body = ask("hi");
    body["stream"] = json!(true);
    let r = p.messages(&key, body).await;
    assert_eq!(r.status, StatusCode::OK, "the stream had started");
    let events: Vec<&str> = r.text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(events, ["message_start", "ping", "error"]);
    let error = r.text.lines().rfind(|l| !l.is_empty()).expect("lines");
    assert!(error.contains("\"type\":\"api_error\""), "{error}");
    assert!(error.contains("the accelerator fell over"), "{error}");
    let end = p
        .admin("/rl/end_session", json!({"session_id": session}))
        .await
        .json();
    assert_eq!(end["system_error"], true);
    assert_eq!(end["interaction_count"], 0);
}
