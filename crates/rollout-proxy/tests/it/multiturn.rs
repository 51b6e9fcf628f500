//! The token-exact multi-turn tests: a 20-turn tool-using Chat Completions conversation, and thinking
//! conversations over Anthropic Messages (thinking blocks echoed back) and over Responses (chained by
//! `previous_response_id`, or stateless with the output items echoed back), each exported with `concat`
//! as one trajectory whose tokens are exactly the engine's sampled tokens interleaved with the template's
//! tokens for the messages in between, verified token by token; and how many times a chained conversation
//! renders the chat template.

use http::{Method, StatusCode};
use rollout_proxy::{ExportedTrajectory, SampledToken};
use serde_json::{Value, json};

use crate::common::{Proxy, call, model, tokens, turn};

const TURNS: usize = 20;
const SYSTEM: &str = "You run shell commands.";
const TASK: &str = "Count the files, one step at a time.";

fn output_text(k: usize) -> String {
    if k + 1 < TURNS {
        format!("<tool_call>\n{{\"name\": \"run\", \"arguments\": {{\"cmd\": \"step {k}\"}}}}\n</tool_call>")
    } else {
        "All done: 19 steps.".to_string()
    }
}

#[tokio::test]
async fn twenty_tool_turns_export_as_one_token_exact_trajectory() {
    let p = Proxy::default().await;
    let (session, key) = p.session("multi").await;
    let tools = json!([{"type": "function", "function": {"name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}}]);
    let mut messages = vec![
        json!({"role": "system", "content": SYSTEM}),
        json!({"role": "user", "content": TASK}),
    ];
    for k in 0..TURNS {
        p.engine.push_script(turn(&output_text(k)));
        let r = p
            .chat(
                &key,
                json!({"model": "smol", "messages": messages, "tools": tools}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "turn {k}: {}", r.text);
        let reply: Value = r.json()["choices"][0]["message"].clone();
        messages.push(reply.clone());
        if k + 1 < TURNS {
            let call = &reply["tool_calls"][0];
            assert_eq!(
                call["function"]["arguments"],
                json!(format!("{{\"cmd\":\"step {k}\"}}"))
            );
            messages
                .push(json!({"role": "tool", "tool_call_id": call["id"], "content": format!("output {k}")}));
        } else {
            assert_eq!(reply["content"], json!("All done: 19 steps."));
        }
    }
    let r = p.chat(&key, json!({"messages": messages})).await;
    assert_eq!(r.status, StatusCode::OK);
    p.end(&key).await;
    let exported = p.export(&session, "concat").await;
    // The 21st request above extended the 20th turn too: it is the one leaf.
    assert_eq!(
        exported.trajectories.len(),
        1,
        "one leaf: every turn extended the previous one"
    );
    let t = &exported.trajectories[0];
    assert_eq!(t.interaction_ids.len(), TURNS + 1);
    let outputs = p.engine.outputs();
    assert_eq!(outputs.len(), TURNS + 1);

    let templates: Vec<String> = (0..outputs.len())
        .map(|k| {
            if k == 0 {
                first_prompt()
            } else if k < TURNS {
                tool_turn(k - 1)
            } else {
                "\n<|im_start|>assistant\n".to_string()
            }
        })
        .collect();
    verify(t, &outputs, &templates);
    assert_eq!(t.prompt_len, tokens(&first_prompt()).len());
}

fn first_prompt() -> String {
    format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n"
    )
}

fn tool_turn(k: usize) -> String {
    format!("\n<|im_start|>tool\noutput {k}<|im_end|>\n<|im_start|>assistant\n")
}

/// Walks a trajectory: each turn's template tokens (mask 0, version -1), then exactly the tokens the engine
/// sampled for it (mask 1, their logprobs), and nothing else.
fn verify(t: &ExportedTrajectory, outputs: &[Vec<SampledToken>], templates: &[String]) {
    let mut at = 0;
    for (k, (output, template_text)) in outputs.iter().zip(templates).enumerate() {
        let expected = tokens(template_text);
        let end = at + expected.len();
        assert_eq!(
            &t.token_ids[at..end],
            expected.as_slice(),
            "template tokens before turn {k}"
        );
        assert!(
            t.loss_mask[at..end].iter().all(|m| *m == 0),
            "template tokens before turn {k} do not train"
        );
        assert!(t.versions[at..end].iter().all(|v| *v == -1));
        at = end;
        let sampled: Vec<u32> = output.iter().map(|s| s.id).collect();
        let end = at + sampled.len();
        assert_eq!(
            &t.token_ids[at..end],
            sampled.as_slice(),
            "sampled tokens of turn {k}"
        );
        assert!(
            t.loss_mask[at..end].iter().all(|m| *m == 1),
            "sampled tokens of turn {k} train"
        );
        let logprobs: Vec<f32> = output.iter().map(|s| s.logprob).collect();
        assert_eq!(&t.logprobs[at..end], logprobs.as_slice());
        at = end;
    }
    assert_eq!(at, t.token_ids.len(), "nothing else in the trajectory");
}

/// A thinking turn: reasoning, sometimes visible text, then a tool call (the last turn answers).
fn thinking_text(k: usize) -> String {
    let think = format!("<think>\nStep {k}: run the next command.\n</think>\n\n");
    if k + 1 == THINKING_TURNS {
        return format!("{think}All done: {k} steps.");
    }
    let say = if k.is_multiple_of(2) {
        format!("Running step {k}.\n")
    } else {
        String::new()
    };
    format!(
        "{think}{say}<tool_call>\n{{\"name\": \"run\", \"arguments\": {{\"cmd\": \"step {k}\"}}}}\n</tool_call>"
    )
}

const THINKING_TURNS: usize = 8;

/// Checks a finished multi-turn session exported with `concat`: one trajectory, token-exact, thinking
/// tokens included among the trained ones.
async fn check_thinking_session(p: &Proxy, session: &str) {
    let exported = p.export(session, "concat").await;
    assert_eq!(
        exported.trajectories.len(),
        1,
        "every turn extended the previous one"
    );
    let t = &exported.trajectories[0];
    assert_eq!(t.interaction_ids.len(), THINKING_TURNS);
    let outputs = p.engine.outputs();
    assert_eq!(outputs.len(), THINKING_TURNS);
    let templates: Vec<String> = (0..THINKING_TURNS)
        .map(|k| if k == 0 { first_prompt() } else { tool_turn(k - 1) })
        .collect();
    verify(t, &outputs, &templates);
    let trained: Vec<u32> = t
        .token_ids
        .iter()
        .zip(&t.loss_mask)
        .filter(|(_, m)| **m == 1)
        .map(|(id, _)| *id)
        .collect();
    let text = model().tokenizer.decode(&trained, false).expect("decodes");
    assert_eq!(
        text.matches("<think>\nStep ").count(),
        THINKING_TURNS,
        "each turn's thinking tokens train: {text}"
    );
}

#[tokio::test]
async fn messages_with_thinking_blocks_stay_token_exact() {
    let p = Proxy::default().await;
    let (session, key) = p.session("anthropic").await;
    let tools = json!([{"name": "run", "input_schema": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]);
    let mut messages = vec![json!({"role": "user", "content": TASK})];
    for k in 0..THINKING_TURNS {
        p.engine.push_script(turn(&thinking_text(k)));
        let body = json!({"model": "smol", "max_tokens": 512, "system": [{"type": "text", "text": SYSTEM}],
                          "messages": messages, "tools": tools, "thinking": {"type": "enabled", "budget_tokens": 256}});
        let r = p.messages(&key, body).await;
        assert_eq!(r.status, StatusCode::OK, "turn {k}: {}", r.text);
        let reply = r.json();
        assert_eq!(reply["content"][0]["type"], "thinking", "turn {k}");
        // The client echoes the assistant turn as it came, thinking block and signature included.
        messages.push(json!({"role": "assistant", "content": reply["content"]}));
        let calls: Vec<&Value> = reply["content"]
            .as_array()
            .expect("content")
            .iter()
            .filter(|b| b["type"] == "tool_use")
            .collect();
        if k + 1 < THINKING_TURNS {
            assert_eq!(reply["stop_reason"], "tool_use");
            let results: Vec<Value> = calls
                .iter()
                .map(|c| json!({"type": "tool_result", "tool_use_id": c["id"], "content": format!("output {k}")}))
                .collect();
            messages.push(json!({"role": "user", "content": results}));
        } else {
            assert_eq!(reply["stop_reason"], "end_turn");
        }
    }
    p.end(&key).await;
    check_thinking_session(&p, &session).await;
}

/// Responses turns: chained by `previous_response_id` (only the new items are sent), or stateless (the
/// whole conversation, output items echoed back as Codex does).
async fn responses_session(chained: bool) {
    let p = Proxy::default().await;
    let (session, key) = p.session("responses").await;
    let tools = json!([{"type": "function", "name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]);
    let mut history =
        vec![json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": TASK}]})];
    let mut previous: Option<String> = None;
    for k in 0..THINKING_TURNS {
        p.engine.push_script(turn(&thinking_text(k)));
        let mut body = json!({"model": "smol", "instructions": SYSTEM, "tools": tools, "store": chained});
        match &previous {
            Some(id) => {
                body["previous_response_id"] = json!(id);
                body["input"] = json!(history);
            }
            None => body["input"] = json!(history),
        }
        let r = p.responses(&key, body).await;
        assert_eq!(r.status, StatusCode::OK, "turn {k}: {}", r.text);
        let reply = r.json();
        let output = reply["output"].as_array().expect("output").clone();
        assert_eq!(output[0]["type"], "reasoning", "turn {k}");
        if chained {
            previous = Some(reply["id"].as_str().expect("id").to_string());
            history.clear();
        } else {
            history.extend(output.iter().cloned());
        }
        for item in output.iter().filter(|i| i["type"] == "function_call") {
            history.push(json!({"type": "function_call_output", "call_id": item["call_id"], "output": format!("output {k}")}));
        }
    }
    p.end(&key).await;
    check_thinking_session(&p, &session).await;
}

#[tokio::test]
async fn responses_chained_by_previous_response_id_stay_token_exact() {
    responses_session(true).await;
}

#[tokio::test]
async fn stateless_responses_echoing_their_items_stay_token_exact() {
    responses_session(false).await;
}

/// The value of counter `name` in the proxy's `/metrics`.
async fn counter(p: &Proxy, name: &str) -> u64 {
    let r = call(Method::GET, &p.url("/metrics"), &[], None).await;
    let line = format!("{name}_total ");
    let value = r
        .text
        .lines()
        .find_map(|l| l.strip_prefix(line.as_str()))
        .unwrap_or_else(|| panic!("no {name} in /metrics:\n{}", r.text));
    value.trim().parse::<f64>().expect("a number") as u64
}

/// A `previous_response_id` continuation whose rendering begins with the text its parent's sequence ends
/// at renders the chat template once, and one whose parent's output the template renders otherwise
/// (SmolLM2's template writes a tool call's content, which is empty) renders the earlier turns a second
/// time to find where they end; both extend the parent's exact tokens.
#[tokio::test]
async fn a_continuation_renders_the_template_once_unless_its_parents_output_renders_otherwise() {
    const CHAINED: usize = 6;
    const TOOL_TURN: usize = 1;
    let p = Proxy::default().await;
    let (session, key) = p.session("renders").await;
    let tools = json!([{"type": "function", "name": "run", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}}}]);
    let mut input = json!(TASK);
    let mut previous: Option<String> = None;
    let mut renders = Vec::new();
    let mut templates = vec![first_prompt()];
    for k in 0..CHAINED {
        let output = if k == TOOL_TURN {
            output_text(k)
        } else {
            format!("Answer {k}: the count so far is {}.", 3 * k)
        };
        p.engine.push_script(turn(&output));
        let mut body = json!({"model": "smol", "instructions": SYSTEM, "tools": tools, "input": input});
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let before = counter(&p, "rollout_proxy_template_renders").await;
        let r = p.responses(&key, body).await;
        assert_eq!(r.status, StatusCode::OK, "turn {k}: {}", r.text);
        renders.push(counter(&p, "rollout_proxy_template_renders").await - before);
        let reply = r.json();
        previous = Some(reply["id"].as_str().expect("id").to_string());
        if k == TOOL_TURN {
            let call_id = &reply["output"][0]["call_id"];
            assert_eq!(reply["output"][0]["type"], "function_call", "turn {k}: {reply}");
            input = json!([{"type": "function_call_output", "call_id": call_id, "output": format!("output {k}")}]);
            templates.push(tool_turn(k));
        } else {
            let next = format!("Go on with part {}.", k + 1);
            templates.push(format!(
                "\n<|im_start|>user\n{next}<|im_end|>\n<|im_start|>assistant\n"
            ));
            input = json!(next);
        }
    }
    templates.pop();
    let mut want = vec![1; CHAINED];
    want[TOOL_TURN + 1] = 2;
    assert_eq!(
        renders, want,
        "renders per request: one, but two right after the tool call"
    );
    assert_eq!(counter(&p, "rollout_proxy_prefix_mismatches").await, 0);
    p.end(&key).await;
    let exported = p.export(&session, "concat").await;
    assert_eq!(exported.trajectories.len(), 1, "every turn extended the last");
    let outputs = p.engine.outputs();
    assert_eq!(outputs.len(), CHAINED);
    verify(&exported.trajectories[0], &outputs, &templates);
}
