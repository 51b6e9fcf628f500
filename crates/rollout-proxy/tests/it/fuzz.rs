//! Property tests that throw arbitrary and mutated request bodies at each protocol's endpoint (Chat
//! Completions, Anthropic Messages and its `count_tokens`, Responses) through the real router, the
//! SmolLM2 chat template and tokenizer: every answer is a success or a client error in the protocol's own
//! error body, and a stream ends. A panic while preparing fails the test: it unwinds through the router
//! for a small body, and is a 500 for a body prepared on the pool.
//! Inputs are bounded in size (depth, breadth, string length); no case has a time limit.

use std::time::Duration;

use http_body_util::BodyExt;
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};
use rollout_proxy::FakeEngine;
use serde_json::{Map, Value, json};
use tower::ServiceExt;

use crate::common::{engine_config, oneshot_state, start};

/// Keys each protocol reads, at the top and inside messages, items and blocks, so that arbitrary objects
/// reach the parsers' branches rather than only the "unknown field" path.
const CHAT_KEYS: &[&str] = &[
    "messages",
    "model",
    "tools",
    "tool_choice",
    "stream",
    "stream_options",
    "include_usage",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "top_k",
    "stop",
    "chat_template_kwargs",
    "temperature",
    "top_p",
    "seed",
    "metadata",
    "role",
    "content",
    "tool_calls",
    "tool_call_id",
    "name",
    "reasoning_content",
    "type",
    "text",
    "image_url",
    "url",
    "function",
    "arguments",
    "parameters",
    "id",
];
const MESSAGES_KEYS: &[&str] = &[
    "messages",
    "system",
    "model",
    "tools",
    "tool_choice",
    "thinking",
    "budget_tokens",
    "stream",
    "top_k",
    "stop_sequences",
    "metadata",
    "user_id",
    "temperature",
    "top_p",
    "max_tokens",
    "role",
    "content",
    "type",
    "text",
    "id",
    "name",
    "input",
    "input_schema",
    "is_error",
    "tool_use_id",
    "thinking",
    "signature",
    "source",
    "media_type",
    "data",
    "cache_control",
];
const RESPONSES_KEYS: &[&str] = &[
    "input",
    "instructions",
    "previous_response_id",
    "store",
    "stream",
    "model",
    "tools",
    "tool_choice",
    "temperature",
    "top_p",
    "max_output_tokens",
    "parallel_tool_calls",
    "top_k",
    "metadata",
    "reasoning",
    "effort",
    "text",
    "format",
    "include",
    "type",
    "role",
    "content",
    "call_id",
    "name",
    "arguments",
    "output",
    "id",
    "summary",
    "parameters",
    "strict",
];
/// Strings the parsers compare against.
const WORDS: &[&str] = &[
    "user",
    "assistant",
    "system",
    "developer",
    "tool",
    "function",
    "text",
    "image",
    "image_url",
    "input_text",
    "output_text",
    "message",
    "function_call",
    "function_call_output",
    "reasoning",
    "tool_use",
    "tool_result",
    "thinking",
    "redacted_thinking",
    "enabled",
    "disabled",
    "auto",
    "none",
    "required",
    "any",
    "json_schema",
    "<think>",
    "</think>",
    "<tool_call>",
    "{\"name\": \"f\"}",
    "",
    "\u{0}",
    "é",
];

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        prop_oneof![Just(u64::MAX), Just(u64::from(u32::MAX) + 1), 0..8u64].prop_map(Value::from),
        prop_oneof![Just(-1.0f64), Just(0.5), Just(1e308), Just(-0.0), any::<f64>()]
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        prop::sample::select(WORDS).prop_map(Value::from),
        "\\PC{0,24}".prop_map(Value::from),
    ]
}

/// Arbitrary JSON of bounded depth and breadth whose keys are mostly ones `keys` names.
fn value(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, move |inner| {
        let key = prop_oneof![4 => prop::sample::select(keys).prop_map(str::to_string), 1 => "\\PC{0,8}"];
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((key, inner), 0..6)
                .prop_map(|pairs| Value::Object(pairs.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// One change somewhere in a JSON value: the place is found by walking down with `path`.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(Vec<Index>, Value),
    Remove(Vec<Index>),
    Insert(Vec<Index>, String, Value),
    Wrap(Vec<Index>),
}

fn mutation(keys: &'static [&'static str]) -> impl Strategy<Value = Mutation> {
    let path = prop::collection::vec(any::<Index>(), 0..5);
    prop_oneof![
        (path.clone(), value(keys)).prop_map(|(p, v)| Mutation::Replace(p, v)),
        path.clone().prop_map(Mutation::Remove),
        (path.clone(), prop::sample::select(keys), value(keys)).prop_map(|(p, k, v)| Mutation::Insert(
            p,
            k.to_string(),
            v
        )),
        path.prop_map(Mutation::Wrap),
    ]
}

/// The value at the end of `path`, stopping early at a leaf or an empty container.
fn walk<'a>(at: &'a mut Value, path: &[Index]) -> &'a mut Value {
    let Some((step, rest)) = path.split_first() else {
        return at;
    };
    let descends = match &*at {
        Value::Object(map) => !map.is_empty(),
        Value::Array(items) => !items.is_empty(),
        _ => false,
    };
    if !descends {
        return at;
    }
    match at {
        Value::Object(map) => {
            let key = map.keys().nth(step.index(map.len())).expect("in range").clone();
            walk(map.get_mut(&key).expect("present"), rest)
        }
        Value::Array(items) => {
            let i = step.index(items.len());
            walk(&mut items[i], rest)
        }
        other => other,
    }
}

fn mutate(mut body: Value, mutations: &[Mutation]) -> Value {
    for m in mutations {
        match m {
            Mutation::Replace(path, v) => *walk(&mut body, path) = v.clone(),
            Mutation::Remove(path) => {
                let (last, parent) = path
                    .split_last()
                    .map_or((None, &path[..0]), |(l, p)| (Some(l), p));
                match (walk(&mut body, parent), last) {
                    (Value::Object(map), Some(i)) if !map.is_empty() => {
                        let key = map.keys().nth(i.index(map.len())).expect("in range").clone();
                        map.remove(&key);
                    }
                    (Value::Array(items), Some(i)) if !items.is_empty() => {
                        items.remove(i.index(items.len()));
                    }
                    _ => {}
                }
            }
            Mutation::Insert(path, key, v) => match walk(&mut body, path) {
                Value::Object(map) => {
                    map.insert(key.clone(), v.clone());
                }
                Value::Array(items) => items.push(v.clone()),
                _ => {}
            },
            Mutation::Wrap(path) => {
                let at = walk(&mut body, path);
                *at = Value::Array(vec![at.take()]);
            }
        }
    }
    body
}

/// A body: arbitrary JSON, a seed with a few mutations, or a mutated seed's bytes cut or spliced.
fn body(seeds: Vec<Value>, keys: &'static [&'static str]) -> impl Strategy<Value = Vec<u8>> {
    let mutated = (
        prop::sample::select(seeds),
        prop::collection::vec(mutation(keys), 1..5),
    )
        .prop_map(|(seed, ms)| mutate(seed, &ms))
        .boxed();
    prop_oneof![
        1 => value(keys).prop_map(|v| v.to_string().into_bytes()),
        4 => mutated.clone().prop_map(|v| v.to_string().into_bytes()),
        1 => (mutated, any::<Index>(), any::<Index>(), "\\PC{0,4}").prop_map(|(v, cut, at, splice)| {
            let mut bytes = v.to_string().into_bytes();
            bytes.truncate(cut.index(bytes.len() + 1).max(bytes.len() / 2));
            let at = at.index(bytes.len() + 1);
            bytes.splice(at..at, splice.into_bytes());
            bytes
        }),
    ]
}

/// What a client hears: the status, and the body (every frame of a stream, to its end).
async fn send(app: &axum::Router, path: &str, key: &str, body: Vec<u8>) -> (u16, String) {
    let request = http::Request::post(path)
        .header("authorization", format!("Bearer {key}"))
        .header("x-api-key", key)
        .header("content-type", "application/json")
        .body(axum::body::Body::from(body))
        .expect("request");
    let response = app.clone().oneshot(request).await.expect("answers");
    let status = response.status().as_u16();
    let bytes = response
        .into_body()
        .collect()
        .await
        .expect("the body ends")
        .to_bytes();
    (status, String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs 256 cases of `seeds`' bodies at `path` against one session.
fn check(path: &'static str, anthropic: bool, seeds: Vec<Value>, keys: &'static [&'static str]) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    let _entered = rt.enter();
    let (_state, _engine, app) = oneshot_state(FakeEngine::new(engine_config()), Duration::from_secs(15));
    let key = rt.block_on(start(&app));
    let mut runner = TestRunner::new(Config {
        cases: 256,
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&body(seeds, keys), |bytes| {
        let (status, text) = rt.block_on(send(&app, path, &key, bytes));
        prop_assert!(status < 500, "{path} answered {status}: {text}");
        if status >= 400 {
            let body: Value = serde_json::from_str(&text).map_err(|e| {
                TestCaseError::fail(format!("{path} answered {status} without JSON ({e}): {text}"))
            })?;
            if anthropic {
                prop_assert_eq!(&body["type"], "error", "{}", text);
                prop_assert!(body["error"]["type"].is_string(), "{}", text);
            } else {
                prop_assert!(body["error"]["message"].is_string(), "{}", text);
            }
        }
        Ok(())
    });
    if let Err(e) = result {
        panic!("{e}");
    }
}

fn tools_openai() -> Value {
    json!([{"type": "function", "function": {"name": "ls", "description": "List.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}])
}

#[test]
fn chat_completions_never_fails_inside_on_arbitrary_bodies() {
    let seeds = vec![
        json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        json!({"model": "m", "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "List files."}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
                "function": {"name": "ls", "arguments": "{\"path\": \".\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "a.txt"}],
            "tools": tools_openai(), "tool_choice": "auto", "stream": true,
            "stream_options": {"include_usage": true}, "stop": ["\n\n"], "temperature": 0.7, "top_p": 0.9,
            "top_k": 20, "seed": 3, "max_completion_tokens": 4, "metadata": {"k": "v"},
            "chat_template_kwargs": {"enable_thinking": false}}),
    ];
    check("/v1/chat/completions", false, seeds, CHAT_KEYS);
}

fn messages_seeds() -> Vec<Value> {
    vec![
        json!({"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}),
        json!({"model": "m", "max_tokens": 4, "system": [{"type": "text", "text": "Be brief."}],
            "stream": true, "thinking": {"type": "enabled", "budget_tokens": 1024},
            "metadata": {"user_id": "u"}, "stop_sequences": ["END"], "temperature": 0.5, "top_k": 5,
            "tools": [{"name": "ls", "description": "List.", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "auto"},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "List files."}]},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "I should list.", "signature": "s"},
                    {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "."}}]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt", "is_error": false}]}]}),
    ]
}

#[test]
fn anthropic_messages_never_fails_inside_on_arbitrary_bodies() {
    check("/v1/messages", true, messages_seeds(), MESSAGES_KEYS);
}

#[test]
fn anthropic_count_tokens_never_fails_inside_on_arbitrary_bodies() {
    check("/v1/messages/count_tokens", true, messages_seeds(), MESSAGES_KEYS);
}

#[test]
fn responses_never_fails_inside_on_arbitrary_bodies() {
    let seeds = vec![
        json!({"model": "m", "input": "Hi", "max_output_tokens": 4}),
        json!({"model": "m", "instructions": "Be brief.", "stream": true, "store": true,
            "max_output_tokens": 4, "parallel_tool_calls": false, "temperature": 0.5,
            "reasoning": {"effort": "low", "summary": "auto"}, "text": {"format": {"type": "text"}},
            "metadata": {"k": "v"}, "include": ["reasoning.encrypted_content"], "tool_choice": "auto",
            "tools": [{"type": "function", "name": "ls", "description": "List.",
                "parameters": {"type": "object"}, "strict": false}, {"type": "web_search"}],
            "input": [
                {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "List."}]},
                {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Think."}]},
                {"type": "function_call", "call_id": "call_1", "name": "ls", "arguments": "{}"},
                {"type": "function_call_output", "call_id": "call_1", "output": "a.txt"}]}),
        json!({"model": "m", "input": "Go on.", "previous_response_id": "resp_missing"}),
    ];
    check("/v1/responses", false, seeds, RESPONSES_KEYS);
}
