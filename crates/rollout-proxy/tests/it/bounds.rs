//! Request fields bounded as the real APIs bound them, over real sockets: each refusal is a 400 in the
//! protocol's own error body that names the field, and a request shaped like Claude Code's (27 KB of
//! system prompt, 24 tools, metadata) still passes.

use http::StatusCode;
use serde_json::{Value, json};

use rollout_proxy::FakeEngineConfig;

use crate::common::{Proxy, Response, config, engine_config};

fn ask() -> Value {
    json!([{"role": "user", "content": "Hi"}])
}

/// Checks an OpenAI-shaped 400 naming `param`, with `needle` in its message.
fn openai_refusal(r: &Response, param: &str, needle: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let body = r.json();
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    assert_eq!(body["error"]["param"], param, "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(needle), "{message}");
}

/// Checks an Anthropic-shaped 400 with `needle` in its message.
fn anthropic_refusal(r: &Response, needle: &str) {
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    let body = r.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "invalid_request_error", "{body}");
    let message = body["error"]["message"].as_str().expect("a message");
    assert!(message.contains(needle), "{message}");
}

fn tool(i: usize) -> Value {
    json!({"type": "function", "function": {"name": format!("t{i}"), "parameters": {"type": "object"}}})
}

#[tokio::test]
async fn chat_completions_refuses_fields_past_openai_s_bounds() {
    let proxy = Proxy::default().await;
    let (_, key) = proxy.session("bounds-chat").await;
    let five: Vec<String> = (0..5).map(|i| format!("s{i}")).collect();
    let r = proxy
        .chat(&key, json!({"messages": ask(), "stop": five, "max_tokens": 4}))
        .await;
    openai_refusal(&r, "stop", "maximum length 4");
    let r = proxy
        .chat(
            &key,
            json!({"messages": ask(), "stop": ["x".repeat(257)], "max_tokens": 4}),
        )
        .await;
    openai_refusal(&r, "stop", "'stop[0]'");
    let metadata: serde_json::Map<String, Value> = (0..17).map(|i| (format!("k{i}"), json!("v"))).collect();
    let r = proxy
        .chat(
            &key,
            json!({"messages": ask(), "metadata": metadata, "max_tokens": 4}),
        )
        .await;
    openai_refusal(&r, "metadata", "at most 16");
    let tools: Vec<Value> = (0..513).map(tool).collect();
    let r = proxy
        .chat(&key, json!({"messages": ask(), "tools": tools, "max_tokens": 4}))
        .await;
    openai_refusal(&r, "tools", "maximum length 512");
    // At the bounds it is served.
    let four: Vec<String> = (0..4).map(|i| format!("s{i}")).collect();
    let metadata: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("k{i}"), json!("v".repeat(512))))
        .collect();
    let r = proxy
        .chat(
            &key,
            json!({"messages": ask(), "stop": four, "metadata": metadata, "tools": [tool(0)], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn messages_refuses_fields_past_anthropic_s_bounds_and_serves_claude_code_s_shape() {
    let engine = FakeEngineConfig {
        max_context_len: 65_536,
        ..engine_config()
    };
    let proxy = Proxy::start(config(), engine).await;
    let (_, key) = proxy.session("bounds-messages").await;
    let seventeen: Vec<String> = (0..17).map(|i| format!("s{i}")).collect();
    let r = proxy
        .messages(
            &key,
            json!({"messages": ask(), "max_tokens": 4, "stop_sequences": seventeen}),
        )
        .await;
    anthropic_refusal(&r, "'stop_sequences'");
    let r = proxy
        .messages(
            &key,
            json!({"messages": ask(), "max_tokens": 4, "metadata": {"user_id": "u".repeat(257)}}),
        )
        .await;
    anthropic_refusal(&r, "metadata.user_id");
    let r = proxy
        .messages(
            &key,
            json!({"messages": ask(), "max_tokens": 4, "metadata": {"user_id": "u", "blob": "x"}}),
        )
        .await;
    anthropic_refusal(&r, "metadata.blob");
    let r = proxy
        .messages(
            &key,
            json!({"messages": ask(), "max_tokens": 4, "tools": [{"name": "big", "input_schema": {"type": "object"},
                "description": "d".repeat(4 * 1024 * 1024 + 1)}]}),
        )
        .await;
    // Over the tools' byte bound, but under the 32 MiB body limit.
    anthropic_refusal(&r, "'tools'");

    // Claude Code's request: a 27 KB system prompt in blocks, 24 tools with real-sized schemas, metadata,
    // thinking and context management, sixteen stop sequences at most.
    let tools: Vec<Value> = (0..24)
        .map(|i| {
            json!({"name": format!("Tool{i}"), "description": "Runs a thing. ".repeat(100),
                "input_schema": {"type": "object", "properties": {"command": {"type": "string",
                "description": "what to run ".repeat(40)}}, "required": ["command"]}})
        })
        .collect();
    let system = json!([
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1"},
        {"type": "text", "text": "You are Claude Code. ".repeat(1300), "cache_control": {"type": "ephemeral"}},
    ]);
    let user_id = format!(
        "user_{}_account_{}_session_{}",
        "a".repeat(64),
        "0".repeat(36),
        "1".repeat(36)
    );
    let body = json!({
        "model": "claude-sonnet", "max_tokens": 8, "stream": false, "system": system, "tools": tools,
        "messages": ask(), "metadata": {"user_id": user_id}, "thinking": {"type": "adaptive"},
        "context_management": {"edits": []}, "stop_sequences": (0..16).map(|i| format!("s{i}")).collect::<Vec<_>>(),
    });
    assert!(body.to_string().len() > 27_000 + 24 * 1000);
    let r = proxy.messages(&key, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn responses_refuses_fields_past_their_bounds() {
    let proxy = Proxy::default().await;
    let (_, key) = proxy.session("bounds-responses").await;
    let metadata = json!({"k": {"nested": true}});
    let r = proxy
        .responses(
            &key,
            json!({"input": "Hi", "max_output_tokens": 4, "metadata": metadata}),
        )
        .await;
    openai_refusal(&r, "metadata", "expected a string");
    let text = json!({"format": {"type": "json_schema", "name": "s", "schema": {"description": "d".repeat(1024 * 1024)}}});
    let r = proxy
        .responses(&key, json!({"input": "Hi", "max_output_tokens": 4, "text": text}))
        .await;
    openai_refusal(&r, "text", "'text'");
    let reasoning = json!({"effort": "low", "summary": "s".repeat(17 * 1024)});
    let r = proxy
        .responses(
            &key,
            json!({"input": "Hi", "max_output_tokens": 4, "reasoning": reasoning}),
        )
        .await;
    openai_refusal(&r, "reasoning", "'reasoning'");
    let tools: Vec<Value> = (0..513)
        .map(|i| json!({"type": "function", "name": format!("t{i}"), "parameters": {"type": "object"}}))
        .collect();
    let r = proxy
        .responses(
            &key,
            json!({"input": "Hi", "max_output_tokens": 4, "tools": tools}),
        )
        .await;
    openai_refusal(&r, "tools", "maximum length 512");
    // Codex's shape passes: reasoning, text, client metadata and its tools.
    let r = proxy
        .responses(
            &key,
            json!({"input": "Hi", "max_output_tokens": 4, "reasoning": {"effort": "medium", "summary": "auto"},
                "text": {"verbosity": "medium"}, "client_metadata": {"x": "y"}, "metadata": {"run": "r1"},
                "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}},
                          {"type": "web_search"}]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json()["metadata"], json!({"run": "r1"}));
}
