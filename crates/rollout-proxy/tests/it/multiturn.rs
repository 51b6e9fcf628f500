//! The token-exact multi-turn test: a 20-turn tool-using conversation exported with `concat` is one
//! trajectory whose tokens are exactly the engine's sampled tokens interleaved with the template's tokens
//! for the messages in between, verified token by token.

use http::StatusCode;
use serde_json::{Value, json};

use crate::common::{Proxy, tokens, turn};

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

    // Walk the trajectory: template tokens (mask 0), then a turn's sampled tokens (mask 1), and so on.
    let mut at = 0;
    for (k, output) in outputs.iter().enumerate() {
        let template_text = if k == 0 {
            format!(
                "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n"
            )
        } else if k < TURNS {
            format!(
                "\n<|im_start|>tool\noutput {}<|im_end|>\n<|im_start|>assistant\n",
                k - 1
            )
        } else {
            "\n<|im_start|>assistant\n".to_string()
        };
        let expected = tokens(&template_text);
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
    assert_eq!(t.prompt_len, tokens(&format!(
        "<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{TASK}<|im_end|>\n<|im_start|>assistant\n"
    )).len());
}
