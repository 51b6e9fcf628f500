//! The real `anthropic` Python SDK (from the clients virtualenv, `ARENA_RL_PY_CLIENTS`) against a running
//! proxy with the fake engine: create, the raw event stream, the `messages.stream` helper with
//! `get_final_message`, a tool use round trip with thinking, count_tokens, and a context overflow it parses
//! as `BadRequestError`; the export then holds exactly the tokens the engine sampled.

use serde_json::Value;

use crate::common::{Proxy, python, turn};

const SCRIPT: &str = r#"
import json, sys, anthropic
client = anthropic.Anthropic(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
out = {}
m = client.messages.create(model="smol", max_tokens=64, system="Be brief.",
                           messages=[{"role": "user", "content": "Say hello"}])
out["create"] = {"text": m.content[0].text, "stop": m.stop_reason, "output_tokens": m.usage.output_tokens,
                 "id": m.id}
events = [e.type for e in client.messages.create(model="smol", max_tokens=64, stream=True,
                                                 messages=[{"role": "user", "content": "Count"}])]
out["raw_stream"] = events
with client.messages.stream(model="smol", max_tokens=64, messages=[{"role": "user", "content": "Spell it"}]) as s:
    text = "".join(s.text_stream)
    final = s.get_final_message()
out["helper"] = {"text": text, "final": final.content[0].text, "stop": final.stop_reason}
tools = [{"name": "get_weather", "description": "Weather in a city",
          "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
messages = [{"role": "user", "content": "Weather in Paris?"}]
with client.messages.stream(model="smol", max_tokens=256, messages=messages, tools=tools,
                            thinking={"type": "enabled", "budget_tokens": 128}) as s:
    m = s.get_final_message()
use = [b for b in m.content if b.type == "tool_use"][0]
out["tool_use"] = {"stop": m.stop_reason, "kinds": [b.type for b in m.content], "name": use.name,
                   "input": use.input, "thinking": m.content[0].thinking}
messages.append({"role": "assistant", "content": m.content})
messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "18C and sunny"}]})
count = client.messages.count_tokens(model="smol", messages=messages, tools=tools)
out["count_tokens"] = count.input_tokens
m = client.messages.create(model="smol", max_tokens=256, messages=messages, tools=tools)
out["after_tool"] = {"text": m.content[0].text, "stop": m.stop_reason, "input_tokens": m.usage.input_tokens}
try:
    client.messages.create(model="smol", max_tokens=16, stream=True,
                           messages=[{"role": "user", "content": "word " * 6000}])
    out["overflow"] = "no error"
except anthropic.BadRequestError as e:
    out["overflow"] = {"status": e.status_code, "type": e.body["error"]["type"], "message": e.body["error"]["message"],
                       "class": type(e).__name__}
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_anthropic_sdk_drives_a_session_end_to_end() {
    let p = Proxy::default().await;
    let (session, key) = p.session("anthropic-sdk").await;
    p.engine.push_script(turn("Hello from the policy!"));
    p.engine.push_script(turn("one, two, three"));
    p.engine.push_script(turn("p-a-r-i-s"));
    p.engine.push_script(turn(
        "<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    ));
    p.engine.push_script(turn("It is 18C and sunny in Paris."));
    let out: Value = python(SCRIPT, &[&p.url(""), &key]).await;
    assert_eq!(out["create"]["text"], "Hello from the policy!");
    assert_eq!(out["create"]["stop"], "end_turn");
    assert_eq!(
        out["create"]["output_tokens"],
        turn("Hello from the policy!").len()
    );
    assert_eq!(
        out["raw_stream"],
        serde_json::json!([
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]),
        "the SDK sees Anthropic's sequence (it drops pings)"
    );
    assert_eq!(out["helper"]["text"], "p-a-r-i-s");
    assert_eq!(out["helper"]["final"], "p-a-r-i-s");
    assert_eq!(out["helper"]["stop"], "end_turn");
    assert_eq!(out["tool_use"]["stop"], "tool_use");
    assert_eq!(
        out["tool_use"]["kinds"],
        serde_json::json!(["thinking", "tool_use"])
    );
    assert_eq!(out["tool_use"]["input"]["city"], "Paris");
    assert_eq!(out["tool_use"]["thinking"], "The user wants the weather.\n");
    assert_eq!(out["after_tool"]["text"], "It is 18C and sunny in Paris.");
    assert_eq!(
        out["count_tokens"], out["after_tool"]["input_tokens"],
        "count_tokens counts what the generation then saw"
    );
    assert_eq!(out["overflow"]["status"], 400);
    assert_eq!(out["overflow"]["class"], "BadRequestError");
    assert_eq!(out["overflow"]["type"], "invalid_request_error");
    assert!(
        out["overflow"]["message"]
            .as_str()
            .expect("message")
            .starts_with("prompt is too long"),
        "{}",
        out["overflow"]
    );

    let r = p
        .admin("/rl/end_session", serde_json::json!({"session_id": session}))
        .await;
    assert_eq!(r.json()["context_overflow"], true);
    let exported = p.export(&session, "concat").await;
    let engine: Vec<Vec<u32>> = p
        .engine
        .outputs()
        .iter()
        .map(|o| o.iter().map(|s| s.id).collect())
        .collect();
    assert_eq!(engine.len(), 5, "the overflow never reached the engine");
    let sampled: Vec<Vec<u32>> = exported
        .trajectories
        .iter()
        .map(|t| {
            t.token_ids
                .iter()
                .zip(&t.loss_mask)
                .filter(|(_, m)| **m == 1)
                .map(|(id, _)| *id)
                .collect()
        })
        .collect();
    assert_eq!(
        sampled,
        [
            engine[0].clone(),
            engine[1].clone(),
            engine[2].clone(),
            [engine[3].clone(), engine[4].clone()].concat()
        ],
        "the tool round trip with its thinking block is one chain"
    );
    assert_eq!(
        exported.trajectories[0].interaction_id,
        out["create"]["id"].as_str().expect("id")
    );
}
