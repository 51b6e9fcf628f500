//! Tests of the runners' pure parts: reading each protocol's answers, custom headers, the connection a
//! launch gives, injected failures and configuration problems.

use std::collections::BTreeMap;

use serde_json::json;

use super::llm::Connection;
use super::wire::{StreamReader, Turn, endpoint_url, parse_body, request_body};
use super::*;
use crate::harness::LaunchRequest;
use crate::sse::SseParser;

fn stream(protocol: LlmProtocol, events: &[(&str, Value)]) -> Result<Turn, String> {
    let text: String = events
        .iter()
        .map(|(name, data)| format!("event: {name}\ndata: {data}\n\n"))
        .collect();
    let mut reader = StreamReader::new(protocol).expect("a streaming protocol");
    let mut parser = SseParser::default();
    for chunk in text.as_bytes().chunks(5) {
        for event in parser.push(chunk) {
            reader.event(&event)?;
        }
    }
    reader.finish()
}

fn call(id: &str, key: &str) -> ToolCall {
    ToolCall {
        id: id.to_string(),
        name: "lookup".to_string(),
        arguments: json!({"key": key}),
    }
}

#[test]
fn anthropic_streams_become_turns() {
    let start = |i: u64, block: Value| {
        (
            "content_block_start",
            json!({"type": "content_block_start", "index": i, "content_block": block}),
        )
    };
    let delta = |i: u64, delta: Value| {
        (
            "content_block_delta",
            json!({"type": "content_block_delta", "index": i, "delta": delta}),
        )
    };
    let stop = ("message_stop", json!({"type": "message_stop"}));
    let turn = stream(
        LlmProtocol::Anthropic,
        &[
            (
                "message_start",
                json!({"type": "message_start", "message": {"content": []}}),
            ),
            start(0, json!({"type": "text", "text": ""})),
            delta(0, json!({"type": "text_delta", "text": "let me "})),
            ("ping", json!({"type": "ping"})),
            delta(0, json!({"type": "text_delta", "text": "look"})),
            start(
                1,
                json!({"type": "tool_use", "id": "toolu_9", "name": "lookup", "input": {}}),
            ),
            delta(1, json!({"type": "input_json_delta", "partial_json": "{\"ke"})),
            delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "y\": \"b2\"}"}),
            ),
            start(
                2,
                json!({"type": "tool_use", "id": "toolu_10", "name": "lookup", "input": {"key": "c3"}}),
            ),
            (
                "message_delta",
                json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}}),
            ),
            stop.clone(),
        ],
    )
    .unwrap();
    assert_eq!(turn.text, "let me look");
    assert_eq!(turn.calls, [call("toolu_9", "b2"), call("toolu_10", "c3")]);
    let cut = stream(
        LlmProtocol::Anthropic,
        &[start(0, json!({"type": "text", "text": "a"}))],
    );
    assert_eq!(cut.unwrap_err(), "the stream ended before message_stop");
    let error = stream(
        LlmProtocol::Anthropic,
        &[(
            "error",
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}),
        )],
    );
    assert_eq!(error.unwrap_err(), "Overloaded");
}

#[test]
fn responses_streams_become_turns() {
    let item = json!({"type": "function_call", "call_id": "call_7", "name": "lookup", "arguments": "{\"key\":\"d4\"}"});
    let text =
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "4"}]});
    let done = |output: Value| {
        (
            "response.completed",
            json!({"type": "response.completed", "response": {"output": output}}),
        )
    };
    let item_done = |item: &Value| {
        (
            "response.output_item.done",
            json!({"type": "response.output_item.done", "item": item}),
        )
    };
    let turn = stream(
        LlmProtocol::Responses,
        &[
            (
                "response.created",
                json!({"type": "response.created", "response": {}}),
            ),
            item_done(&item),
            done(json!([item.clone(), text.clone()])),
        ],
    )
    .unwrap();
    assert_eq!(
        turn,
        Turn {
            text: "4".into(),
            calls: vec![call("call_7", "d4")]
        }
    );
    // A completed event without its output falls back to the items seen.
    let turn = stream(LlmProtocol::Responses, &[item_done(&text), done(json!([]))]).unwrap();
    assert_eq!(turn.text, "4");
    let failed = stream(
        LlmProtocol::Responses,
        &[(
            "response.failed",
            json!({"type": "response.failed", "response": {"error": {"message": "context_length_exceeded"}}}),
        )],
    );
    assert_eq!(failed.unwrap_err(), "context_length_exceeded");
    let cut = stream(LlmProtocol::Responses, &[item_done(&text)]);
    assert_eq!(cut.unwrap_err(), "the stream ended before response.completed");
}

#[test]
fn whole_bodies_become_turns() {
    let chat = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"key\": \"e5\"}"}},
    ]}}]});
    assert_eq!(
        parse_body(LlmProtocol::ChatCompletions, &chat).unwrap(),
        Turn {
            text: String::new(),
            calls: vec![call("call_1", "e5")]
        }
    );
    let message = json!({"content": [{"type": "text", "text": "7"}, {"type": "tool_use", "id": "t", "name": "lookup", "input": {"key": "f6"}}]});
    assert_eq!(
        parse_body(LlmProtocol::Anthropic, &message).unwrap(),
        Turn {
            text: "7".into(),
            calls: vec![call("t", "f6")]
        }
    );
    assert!(parse_body(LlmProtocol::ChatCompletions, &json!({"choices": []})).is_err());
    assert!(parse_body(LlmProtocol::Responses, &json!({})).is_err());
}

#[test]
fn requests_follow_each_protocol() {
    assert_eq!(
        endpoint_url(LlmProtocol::Anthropic, "http://g/api/"),
        "http://g/api/v1/messages"
    );
    assert_eq!(
        endpoint_url(LlmProtocol::Responses, "http://g/api"),
        "http://g/api/responses"
    );
    assert_eq!(
        endpoint_url(LlmProtocol::ChatCompletions, "http://g/api"),
        "http://g/api/chat/completions"
    );
    let history = vec![json!({"role": "user", "content": "x"})];
    let bodies: Vec<Value> = LlmProtocol::ALL
        .iter()
        .flat_map(|p| {
            [
                request_body(*p, "m", &history, &TaskInstance::tools(*p), None),
                request_body(*p, "m", &history, &TaskInstance::tools(*p), Some(16)),
            ]
        })
        .collect();
    insta::assert_json_snapshot!("request_bodies", bodies);
}

#[test]
fn custom_headers_are_name_value_lines() {
    assert_eq!(
        custom_headers(
            "X-Session-Id: 1:0-0\nX-Session-Token:  tok \n\nbad line\n: no name\nX-Empty:\nA_b: c:d"
        ),
        [
            ("X-Session-Id".to_string(), "1:0-0".to_string()),
            ("X-Session-Token".to_string(), "tok".to_string()),
            ("A_b".to_string(), "c:d".to_string()),
        ]
    );
}

#[test]
fn the_sdk_environment_wins_over_the_launch() {
    let launch = |envs: &[(&str, &str)]| LaunchRequest {
        data_id: "d".into(),
        model_name: "m".into(),
        base_url: "http://gateway/api".into(),
        api_key: "llm-key".into(),
        envs: envs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        session_id: None,
        harness: None,
    };
    let plain = Connection::from_launch(LlmProtocol::Anthropic, &launch(&[]));
    assert_eq!(
        (
            plain.base_url.as_str(),
            plain.api_key.as_str(),
            plain.model.as_str()
        ),
        ("http://gateway/api", "llm-key", "m")
    );
    let direct = launch(&[
        ("ANTHROPIC_BASE_URL", "http://proxy"),
        ("ANTHROPIC_API_KEY", "session-key"),
        ("OPENAI_BASE_URL", "http://proxy/v1"),
        ("OPENAI_API_KEY", ""),
        ("ANTHROPIC_CUSTOM_HEADERS", "X-Session-Id: s"),
    ]);
    let a = Connection::from_launch(LlmProtocol::Anthropic, &direct);
    assert_eq!(
        (a.base_url.as_str(), a.api_key.as_str()),
        ("http://proxy", "session-key")
    );
    let o = Connection::from_launch(LlmProtocol::Responses, &direct);
    assert_eq!(
        (o.base_url.as_str(), o.api_key.as_str()),
        ("http://proxy/v1", "llm-key")
    );
    assert_eq!(o.headers, [("X-Session-Id".to_string(), "s".to_string())]);
}

#[test]
fn injected_failures_replay_from_the_seed() {
    let faults = [RunnerFault {
        status: "NO_OUTPUT".into(),
        probability: 0.3,
        ..Default::default()
    }];
    let draw = |seed: u64| -> Vec<bool> {
        (0..200)
            .map(|i| injected(&faults, seed, &format!("task-{i}")).is_some())
            .collect()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
    let hits = draw(7).iter().filter(|h| **h).count();
    assert!((30..90).contains(&hits), "about 30% of 200: {hits}");
    assert_eq!(injected(&[], 7, "t"), None);
}

#[test]
fn configuration_problems_are_named() {
    let bad = RunnerDef::Chat(LlmRunnerDef {
        max_turns: 0,
        timeout_ms: 0,
        max_tokens: None,
        start_delay_ms: 0,
        compact_after_calls: Vec::new(),
        faults: vec![RunnerFault {
            status: "DONE".into(),
            probability: 2.0,
            ..Default::default()
        }],
    });
    insta::assert_json_snapshot!("runner_problems", bad.problems("runners.x"));
    assert!(RunnerDef::llm(LlmProtocol::Anthropic).problems("r").is_empty());
    assert_eq!(
        RunnerDef::Command(CommandRunnerDef::new(&[" "])).problems("r"),
        ["r.argv must name a command"]
    );
}
