//! OpenAI Responses over a real socket: output items, the streamed event sequence, stored responses,
//! `previous_response_id` chaining within a session, and errors in OpenAI's format.

use std::time::Duration;

use http::{Method, StatusCode};
use rollout_proxy::FakeEngine;
use serde_json::{Value, json};

use crate::common::{Proxy, call, engine_config, frames, oneshot_state, post, redact, start, turn};

fn tools() -> Value {
    json!([{"type": "function", "name": "read", "description": "Read a file",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}},
           {"type": "web_search"}])
}

const THINK_AND_CALL: &str = "<think>\nI should read it.\n</think>\n\nReading.\n<tool_call>\n{\"name\": \"read\", \"arguments\": {\"path\": \"a.txt\"}}\n</tool_call>";

#[tokio::test]
async fn a_response_has_reasoning_message_and_function_call_items() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn(THINK_AND_CALL));
    let body = json!({"model": "smol", "instructions": "You read files.", "input": "Read a.txt",
                      "tools": tools(), "parallel_tool_calls": false, "max_output_tokens": 256});
    let r = p.responses(&key, body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let v = r.json();
    assert_eq!(v["status"], "completed");
    let output = v["output"].as_array().expect("output");
    let kinds: Vec<&str> = output.iter().map(|i| i["type"].as_str().expect("type")).collect();
    assert_eq!(kinds, ["reasoning", "message", "function_call"]);
    assert_eq!(output[0]["content"][0]["text"], "I should read it.\n");
    assert_eq!(output[1]["content"][0]["text"], "Reading.\n");
    assert_eq!(output[2]["arguments"], "{\"path\":\"a.txt\"}");
    assert!(
        output[2]["call_id"]
            .as_str()
            .expect("call id")
            .starts_with("call_")
    );
    assert_eq!(
        v["usage"]["input_tokens"],
        json!(p.engine.requests()[0].input_ids.len())
    );
    insta::assert_snapshot!(redact(&r.text));
}

#[tokio::test]
async fn the_stream_follows_the_responses_event_sequence() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.push_script(turn(THINK_AND_CALL));
    let body = json!({"model": "smol", "input": [{"role": "user", "content": "Read a.txt"}],
                      "tools": tools(), "stream": true, "store": false});
    let r = p.responses(&key, body).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.headers["content-type"], "text/event-stream");
    let sequence: Vec<u64> = r
        .text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| {
            serde_json::from_str::<Value>(d).expect("json")["sequence_number"]
                .as_u64()
                .expect("seq")
        })
        .collect();
    assert_eq!(sequence, (0..sequence.len() as u64).collect::<Vec<_>>());
    insta::assert_snapshot!(redact(&r.text));
}

#[tokio::test(start_paused = true)]
async fn the_stream_is_incremental_and_ends_incomplete_at_the_token_limit() {
    let mut cfg = engine_config();
    cfg.token_latency = Duration::from_millis(250);
    let (_, engine, app) = oneshot_state(FakeEngine::new(cfg), Duration::from_secs(15));
    let key = start(&app).await;
    engine.push_script(turn("one two three four five six"));
    let body = json!({"input": "count", "stream": true, "max_output_tokens": 4});
    let frames = frames(post(&app, "/responses", &key, body).await).await;
    let deltas = frames
        .iter()
        .filter(|f| f.contains("response.output_text.delta"))
        .count();
    assert_eq!(deltas, 4, "one frame per token as it arrives: {frames:?}");
    let last = frames.last().expect("frames");
    assert!(last.contains("event: response.incomplete\n"), "{last}");
    assert!(!frames.concat().contains("response.completed"));
    assert!(
        last.contains("\"incomplete_details\":{\"reason\":\"max_output_tokens\"}"),
        "{last}"
    );
}

#[tokio::test]
async fn stored_responses_are_served_and_chained_within_their_session() {
    let p = Proxy::default().await;
    let (session, key) = p.session("a").await;
    let (_, other_key) = p.session("b").await;
    p.engine.push_script(turn("First answer."));
    let first = p.responses(&key, json!({"input": "Question one"})).await.json();
    let id = first["id"].as_str().expect("id").to_string();

    let get = |key: String, id: String| {
        let url = p.url(&format!("/v1/responses/{id}"));
        async move {
            call(
                Method::GET,
                &url,
                &[("authorization", &format!("Bearer {key}"))],
                None,
            )
            .await
        }
    };
    let r = get(key.clone(), id.clone()).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json(), first);
    let r = get(crate::common::ADMIN.to_string(), id.clone()).await;
    assert_eq!(r.json(), first, "the admin reads any session's responses");

    // Another session cannot see or continue it.
    let r = get(other_key.clone(), id.clone()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.json(),
        json!({"error": {"message": format!("Response with id '{id}' not found."),
                         "type": "not_found_error", "param": "response_id", "code": null}})
    );
    let r = p
        .responses(&other_key, json!({"input": "go on", "previous_response_id": id}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    assert_eq!(r.json()["error"]["param"], "previous_response_id");

    // store: false keeps nothing.
    p.engine.push_script(turn("Not kept."));
    let unstored = p
        .responses(&key, json!({"input": "Question two", "store": false}))
        .await
        .json();
    let r = get(key.clone(), unstored["id"].as_str().expect("id").to_string()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);

    // A chained turn extends the first interaction.
    p.engine.push_script(turn("Second answer."));
    let second = p
        .responses(
            &key,
            json!({"input": "Question three", "previous_response_id": id}),
        )
        .await
        .json();
    assert_eq!(second["previous_response_id"], json!(id));
    p.end(&key).await;
    let exported = p.export(&session, "concat").await;
    let chained = exported
        .trajectories
        .iter()
        .find(|t| t.interaction_id == second["id"].as_str().expect("id"))
        .expect("the chained turn is a leaf");
    assert_eq!(
        chained.interaction_ids,
        [id, second["id"].as_str().expect("id").to_string()]
    );
}

#[tokio::test]
async fn bad_requests_are_clear_openai_errors() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    for (body, needle) in [
        (json!({"model": "m"}), "input is required"),
        (json!({"input": 5}), "input must be a string or a list of items"),
        (json!({"input": [7]}), "input[0] must be an object"),
        (json!({"input": [{"content": "x"}]}), "input[0].type is required"),
        (
            json!({"input": [{"type": "message", "role": "tool", "content": "x"}]}),
            "input[0].role must be user, system, developer or assistant",
        ),
        (
            json!({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id is required",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "x"}]}),
            "input[0].type \\\"item_reference\\\" is not supported",
        ),
        (
            json!({"input": "x", "previous_response_id": "resp_nope"}),
            "Previous response with id 'resp_nope' not found.",
        ),
    ] {
        let r = p.responses(&key, body.clone()).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        assert!(r.text.contains(needle), "{body}: {}", r.text);
        assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    }
    let r = p
        .responses(&key, json!({"input": "word ".repeat(6000), "stream": true}))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
}

#[tokio::test]
async fn an_engine_failure_after_the_stream_started_is_response_failed() {
    let p = Proxy::default().await;
    let (_, key) = p.session("t").await;
    p.engine.fail_next(rollout_proxy::EngineError::Internal(
        "the accelerator fell over".into(),
    ));
    let r = p.responses(&key, json!({"input": "hi", "stream": true})).await;
    assert_eq!(r.status, StatusCode::OK, "the stream had started");
    let events: Vec<&str> = r.text.lines().filter_map(|l| l.strip_prefix("event: ")).collect();
    assert_eq!(
        events,
        ["response.created", "response.in_progress", "response.failed"]
    );
    let last = r.text.lines().rfind(|l| !l.is_empty()).expect("lines");
    let failed: Value = serde_json::from_str(last.trim_start_matches("data: ")).expect("json");
    assert_eq!(failed["response"]["status"], "failed");
    assert_eq!(failed["response"]["error"]["code"], "server_error");
    assert_eq!(failed["sequence_number"], 2);
}
