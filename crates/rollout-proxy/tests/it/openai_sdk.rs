//! The real `openai` Python SDK (from the clients virtualenv, `ARENA_RL_PY_CLIENTS`) against a running
//! proxy with the fake engine: plain and streaming chat, a tool call and tool result round trip, and a
//! context overflow it parses as `BadRequestError`; the export then holds exactly the sampled tokens.

use std::process::Command;

use serde_json::Value;

use crate::common::{Proxy, fixture, turn};

const SCRIPT: &str = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
out = {}
r = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Say hello"}])
out["plain"] = {"content": r.choices[0].message.content, "finish": r.choices[0].finish_reason,
                "usage": r.usage.completion_tokens, "id": r.id}
chunks = list(client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Count"}],
                                             stream=True, stream_options={"include_usage": True}))
out["stream"] = {"content": "".join(c.choices[0].delta.content or "" for c in chunks if c.choices),
                 "finish": [c.choices[0].finish_reason for c in chunks if c.choices][-1],
                 "usage": chunks[-1].usage.completion_tokens, "chunks": len(chunks)}
tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
messages = [{"role": "user", "content": "Weather in Paris?"}]
r = client.chat.completions.create(model="smol", messages=messages, tools=tools)
call = r.choices[0].message.tool_calls[0]
out["tool_call"] = {"finish": r.choices[0].finish_reason, "name": call.function.name,
                    "arguments": json.loads(call.function.arguments)}
messages.append(r.choices[0].message)
messages.append({"role": "tool", "tool_call_id": call.id, "content": "18C and sunny"})
r = client.chat.completions.create(model="smol", messages=messages, tools=tools)
out["after_tool"] = {"content": r.choices[0].message.content, "finish": r.choices[0].finish_reason}
try:
    client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "word " * 6000}])
    out["overflow"] = "no error"
except openai.BadRequestError as e:
    out["overflow"] = {"status": e.status_code, "code": e.code, "type": type(e).__name__}
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_openai_sdk_drives_a_session_end_to_end() {
    let python = fixture("ARENA_RL_PY_CLIENTS");
    let p = Proxy::default().await;
    let (session, key) = p.session("sdk").await;
    p.engine.push_script(turn("Hello from the policy!"));
    p.engine.push_script(turn("one, two, three"));
    p.engine.push_script(turn(
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
    ));
    p.engine.push_script(turn("It is 18C and sunny in Paris."));
    let base = p.url("/v1");
    let output = tokio::task::spawn_blocking(move || {
        Command::new(python)
            .arg("-c")
            .arg(SCRIPT)
            .arg(base)
            .arg(key)
            .output()
    })
    .await
    .expect("joins")
    .expect("python runs");
    assert!(
        output.status.success(),
        "the SDK script failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let out: Value = serde_json::from_slice(&output.stdout).expect("the script prints JSON");
    assert_eq!(out["plain"]["content"], "Hello from the policy!");
    assert_eq!(out["plain"]["finish"], "stop");
    assert_eq!(out["plain"]["usage"], turn("Hello from the policy!").len());
    assert_eq!(out["stream"]["content"], "one, two, three");
    assert_eq!(out["stream"]["finish"], "stop");
    assert_eq!(out["stream"]["usage"], turn("one, two, three").len());
    assert_eq!(out["tool_call"]["finish"], "tool_calls");
    assert_eq!(out["tool_call"]["name"], "get_weather");
    assert_eq!(out["tool_call"]["arguments"]["city"], "Paris");
    assert_eq!(out["after_tool"]["content"], "It is 18C and sunny in Paris.");
    assert_eq!(out["overflow"]["status"], 400);
    assert_eq!(out["overflow"]["code"], "context_length_exceeded");
    assert_eq!(out["overflow"]["type"], "BadRequestError");

    let r = p
        .admin("/rl/end_session", serde_json::json!({"session_id": session}))
        .await;
    assert_eq!(r.json()["context_overflow"], true);
    let exported = p.export(&session, "concat").await;
    let outputs = p.engine.outputs();
    assert_eq!(outputs.len(), 4, "the overflow never reached the engine");
    // Three leaves: the plain chat, the streamed chat, and the tool round trip as one sequence.
    assert_eq!(exported.trajectories.len(), 3);
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
    let engine: Vec<Vec<u32>> = outputs.iter().map(|o| o.iter().map(|s| s.id).collect()).collect();
    assert_eq!(sampled[0], engine[0]);
    assert_eq!(sampled[1], engine[1]);
    assert_eq!(
        sampled[2],
        [engine[2].clone(), engine[3].clone()].concat(),
        "the tool round trip is one chain"
    );
    assert_eq!(exported.trajectories[2].interaction_ids.len(), 2);
    assert_eq!(
        exported.trajectories[0].interaction_id,
        out["plain"]["id"].as_str().expect("id")
    );
}

const RESPONSES_SCRIPT: &str = r#"
import json, sys, openai
client = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)
out = {}
r = client.responses.create(model="smol", instructions="Be brief.", input="Say hello")
out["plain"] = {"text": r.output_text, "status": r.status, "id": r.id, "output_tokens": r.usage.output_tokens}
events = list(client.responses.create(model="smol", input="Count", stream=True))
out["stream"] = {"types": [e.type for e in events],
                 "text": "".join(e.delta for e in events if e.type == "response.output_text.delta"),
                 "final": events[-1].response.output_text}
with client.responses.stream(model="smol", input="Spell it") as s:
    final = s.get_final_response()
out["helper"] = final.output_text
tools = [{"type": "function", "name": "get_weather", "description": "Weather in a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
r = client.responses.create(model="smol", input="Weather in Paris?", tools=tools)
call = [i for i in r.output if i.type == "function_call"][0]
out["call"] = {"name": call.name, "arguments": json.loads(call.arguments), "kinds": [i.type for i in r.output]}
r2 = client.responses.create(model="smol", previous_response_id=r.id, tools=tools,
                             input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C and sunny"}])
out["after_call"] = {"text": r2.output_text, "previous": r2.previous_response_id, "id": r2.id}
r3 = client.responses.create(model="smol", previous_response_id=r2.id, input="And tomorrow?")
out["chained"] = r3.output_text
out["retrieved"] = client.responses.retrieve(r2.id).output_text
try:
    client.responses.retrieve("resp_unknown")
    out["missing"] = "found"
except openai.NotFoundError as e:
    out["missing"] = {"status": e.status_code, "class": type(e).__name__}
print(json.dumps(out))
"#;

#[tokio::test]
async fn the_openai_sdk_drives_the_responses_api_with_chaining() {
    let p = Proxy::default().await;
    let (session, key) = p.session("responses-sdk").await;
    for text in [
        "Hello from the policy!",
        "one, two, three",
        "p-a-r-i-s",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>",
        "It is 18C and sunny in Paris.",
        "Rain tomorrow.",
    ] {
        p.engine.push_script(turn(text));
    }
    let out = crate::common::python(RESPONSES_SCRIPT, &[&p.url("/v1"), &key]).await;
    assert_eq!(out["plain"]["text"], "Hello from the policy!");
    assert_eq!(out["plain"]["status"], "completed");
    assert_eq!(
        out["plain"]["output_tokens"],
        turn("Hello from the policy!").len()
    );
    assert_eq!(out["stream"]["text"], "one, two, three");
    assert_eq!(out["stream"]["final"], "one, two, three");
    let types: Vec<&str> = out["stream"]["types"]
        .as_array()
        .expect("types")
        .iter()
        .map(|t| t.as_str().expect("type"))
        .collect();
    assert_eq!(types[..2], ["response.created", "response.in_progress"]);
    assert_eq!(types.last(), Some(&"response.completed"));
    assert!(types.contains(&"response.output_text.done"));
    assert_eq!(out["helper"], "p-a-r-i-s");
    assert_eq!(out["call"]["name"], "get_weather");
    assert_eq!(out["call"]["arguments"]["city"], "Paris");
    assert_eq!(out["call"]["kinds"], serde_json::json!(["function_call"]));
    assert_eq!(out["after_call"]["text"], "It is 18C and sunny in Paris.");
    assert_eq!(out["chained"], "Rain tomorrow.");
    assert_eq!(out["retrieved"], "It is 18C and sunny in Paris.");
    assert_eq!(out["missing"]["status"], 404);
    assert_eq!(out["missing"]["class"], "NotFoundError");

    p.end(&key).await;
    let exported = p.export(&session, "concat").await;
    let engine: Vec<Vec<u32>> = p
        .engine
        .outputs()
        .iter()
        .map(|o| o.iter().map(|s| s.id).collect())
        .collect();
    let chain = exported
        .trajectories
        .iter()
        .find(|t| t.interaction_ids.len() == 3)
        .expect("the previous_response_id chain is one trajectory");
    let sampled: Vec<u32> = chain
        .token_ids
        .iter()
        .zip(&chain.loss_mask)
        .filter(|(_, m)| **m == 1)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        sampled,
        [engine[3].clone(), engine[4].clone(), engine[5].clone()].concat()
    );
    assert_eq!(
        chain.interaction_ids[1],
        out["after_call"]["id"].as_str().expect("id")
    );
}
