//! Chat Completions over a real socket and through the router: responses, streaming, tool calls,
//! reasoning, stop strings, images, keep-alives and UTF-8 safety.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use rollout_proxy::FakeEngine;
use serde_json::{Value, json};

use crate::common::{
    Proxy, engine_config, eos, frames, model, oneshot_state, oneshot_with, post, redact, start, tokens, turn,
};

fn user(text: &str) -> Value {
    json!({"model": "smol", "messages": [{"role": "user", "content": text}]})
}

#[tokio::test]
async fn non_streaming_chat() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn("Hello, world!"));
    let r = p.chat(&key, user("Say hello")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    let prompt = p.engine.requests()[0].input_ids.len();
    assert_eq!(v["usage"]["prompt_tokens"], json!(prompt));
    assert_eq!(
        v["usage"]["completion_tokens"],
        json!(turn("Hello, world!").len())
    );
    insta::assert_snapshot!(redact(&r.text));
}

#[tokio::test]
async fn streaming_chat_with_usage() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn("Hi there"));
    let mut body = user("Say hi");
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    let r = p.chat(&key, body).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    insta::assert_snapshot!(redact(&r.text));
}

#[tokio::test]
async fn tool_calls_reasoning_and_stop_strings() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    let tools = json!([{"type": "function", "function": {"name": "read", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    p.engine.push_script(turn("<think>\nI should read it.\n</think>\n\nReading.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>"));
    let mut body = user("Read a.txt");
    body["tools"] = tools.clone();
    let r = p.chat(&key, body.clone()).await;
    let v = r.json();
    let message = &v["choices"][0]["message"];
    assert_eq!(v["choices"][0]["finish_reason"], json!("tool_calls"));
    assert_eq!(message["reasoning_content"], json!("I should read it.\n"));
    assert_eq!(message["content"], json!("Reading.\n"));
    assert_eq!(
        message["tool_calls"][0]["function"],
        json!({"name": "read", "arguments": "{\"path\":\"a.txt\"}"})
    );
    assert!(
        message["tool_calls"][0]["id"]
            .as_str()
            .expect("id")
            .starts_with("call_")
    );

    // Streaming carries the tool call as a delta with its index, id and arguments.
    p.engine.push_script(turn(
        "<tool_call>{\"name\": \"read\", \"arguments\": {\"path\": \"b\"}}</tool_call>",
    ));
    body["stream"] = json!(true);
    let r = p.chat(&key, body.clone()).await;
    insta::assert_snapshot!(redact(&r.text));

    // tool_choice "none" leaves tool-call text as content; malformed calls stay content too.
    p.engine
        .push_script(turn("<tool_call>{\"name\": \"read\"}</tool_call>"));
    body["stream"] = json!(false);
    body["tool_choice"] = json!("none");
    let v = p.chat(&key, body.clone()).await.json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        json!("<tool_call>{\"name\": \"read\"}</tool_call>")
    );
    p.engine.push_script(turn("<tool_call>{oops}</tool_call>"));
    body["tool_choice"] = json!("auto");
    let v = p.chat(&key, body).await.json();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        json!("<tool_call>{oops}</tool_call>")
    );
    assert_eq!(v["choices"][0]["finish_reason"], json!("stop"));

    // A stop string ends the output (and the generation) where it appears.
    p.engine.push_script(turn("one two END three four"));
    let mut body = user("count");
    body["stop"] = json!(["END"]);
    let v = p.chat(&key, body).await.json();
    assert_eq!(v["choices"][0]["message"]["content"], json!("one two "));
    assert_eq!(v["choices"][0]["finish_reason"], json!("stop"));
    let sampled = v["usage"]["completion_tokens"].as_u64().expect("count") as usize;
    assert!(
        sampled < turn("one two END three four").len(),
        "generation stopped early"
    );

    // max_tokens caps the output and reports length.
    p.engine.push_script(turn("a b c d e f g h"));
    let mut body = user("letters");
    body["max_tokens"] = json!(3);
    let v = p.chat(&key, body).await.json();
    assert_eq!(v["choices"][0]["finish_reason"], json!("length"));
    assert_eq!(v["usage"]["completion_tokens"], json!(3));
}

#[tokio::test]
async fn bad_requests_are_clear_openai_errors() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    for (body, needle) in [
        (json!({"messages": []}), "messages must not be empty"),
        (json!({"model": "m"}), "messages is required"),
        (json!({"messages": ["hi"]}), "messages[0] must be an object"),
        (
            json!({"messages": [{"role": "wizard", "content": "x"}]}),
            "messages[0].role \\\"wizard\\\"",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "n": 2}),
            "n must be 1",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}),
            "temperature is invalid",
        ),
        (
            json!({"messages": [{"role": "user", "content": "x"}], "top_p": 0}),
            "top_p must be in (0, 1]",
        ),
        (
            json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": "data:,"}}]}]}),
            "accepts text only",
        ),
    ] {
        let r = p.chat(&key, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        assert!(r.text.contains(needle), "{body}: {}", r.text);
        assert_eq!(r.json()["error"]["type"], json!("invalid_request_error"));
    }
}

#[tokio::test(start_paused = true)]
async fn streams_are_incremental_and_ping_while_the_engine_is_silent() {
    let mut cfg = engine_config();
    cfg.token_latency = Duration::from_millis(250);
    let (_, engine, app) = oneshot_state(FakeEngine::new(cfg), Duration::from_millis(100));
    let key = start(&app).await;
    engine.push_script(turn("a b c"));
    let response = post(
        &app,
        "/v1/chat/completions",
        &key,
        json!({"stream": true, "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    let frames = frames(response).await;
    assert!(
        frames[0].contains("\"role\":\"assistant\""),
        "the role chunk comes first, before any token"
    );
    let pings = frames.iter().filter(|f| f.as_str() == ": ping\n\n").count();
    assert!(pings >= 4, "two pings per 250 ms token gap: {frames:?}");
    let content_frames = frames
        .iter()
        .filter(|f| f.contains("\"content\":\"") && !f.contains("\"role\""))
        .count();
    assert_eq!(content_frames, 3, "one frame per token as it arrives: {frames:?}");
    assert!(frames.last().expect("frames").ends_with("data: [DONE]\n\n"));
}

#[tokio::test(start_paused = true)]
async fn streaming_never_splits_a_utf8_character() {
    let (_, engine, app) = oneshot_state(FakeEngine::new(engine_config()), Duration::from_secs(15));
    let key = start(&app).await;
    let text = "crab 🦀 and 日本語 done";
    let ids = tokens(text);
    assert!(
        ids.len() > text.chars().count() - 6,
        "multi-byte characters span several tokens: {ids:?}"
    );
    let mut script = ids.clone();
    script.push(eos());
    engine.push_script(script);
    let response = post(
        &app,
        "/v1/chat/completions",
        &key,
        json!({"stream": true, "messages": [{"role": "user", "content": "x"}]}),
    )
    .await;
    let mut content = String::new();
    for frame in frames(response).await {
        for line in frame.lines() {
            let Some(data) = line.strip_prefix("data: ") else {
                continue;
            };
            if data == "[DONE]" {
                continue;
            }
            let v: Value = serde_json::from_str(data).expect("chunk");
            if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
                assert!(!c.contains('\u{FFFD}'), "a character was split: {c:?}");
                content.push_str(c);
            }
        }
    }
    assert_eq!(content, text);
}

#[tokio::test]
async fn images_reach_an_engine_that_accepts_them_unmodified() {
    let mut cfg = engine_config();
    cfg.supports_images = true;
    // SmolLM2's template only renders string content, so this model renders images as a placeholder.
    let smol = model();
    let template = rollout_proxy::template::ChatTemplate::new(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.content is string %}{{ m.content }}{% else %}{% for p in m.content %}{% if p.type == 'text' %}{{ p.text }}{% else %}<image>{% endif %}{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}",
        None,
        Some("<|im_end|>".into()),
    )
    .expect("compiles");
    let vision = rollout_proxy::ChatModel {
        name: "vision".into(),
        tokenizer: rollout_proxy::tokenizer::Tokenizer::from_model_dir(crate::common::fixture(
            "ARENA_RL_SMOLLM2",
        ))
        .expect("tokenizer"),
        template,
        stop_token_ids: smol.stop_token_ids.clone(),
    };
    let (_, engine, app) = oneshot_with(FakeEngine::new(cfg), Duration::from_secs(15), Arc::new(vision));
    let key = start(&app).await;
    let image = json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}});
    let body = json!({"messages": [
        {"role": "user", "content": "take a screenshot"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "shot", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "here"}, image.clone()]},
    ]});
    let r = post(&app, "/v1/chat/completions", &key, body).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(engine.requests()[0].images, vec![image]);
}
