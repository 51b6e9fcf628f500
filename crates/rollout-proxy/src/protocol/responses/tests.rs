//! Tests of the Responses translation (items into turns).

use serde_json::json;

use super::*;

#[test]
fn consecutive_assistant_items_form_one_turn_in_the_models_order() {
    let out = input_messages(json!([
        {"role": "developer", "content": "be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}, {"type": "input_image", "image_url": "data:,"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "think"}]},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Calling"}, {"type": "output_text", "text": " now."}]},
        {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"},
        {"type": "function_call", "call_id": "call_2", "name": "g", "arguments": "{\"x\":1}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "one"},
        {"type": "function_call_output", "call_id": "call_2", "output": [{"type": "input_text", "text": "two"}]},
        {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "again"}]},
        {"type": "message", "role": "assistant", "content": "Done."},
        {"type": "function_call", "call_id": "call_3", "name": "f", "arguments": "{}"},
        {"type": "message", "role": "assistant", "content": "After a call, a new turn."},
    ]))
    .expect("translates");
    assert_eq!(
        out,
        vec![
            json!({"role": "developer", "content": "be brief"}),
            json!({"role": "user", "content": [{"type": "text", "text": "hi"}, {"type": "input_image", "image_url": "data:,"}]}),
            json!({"role": "assistant", "content": "Calling now.", "reasoning_content": "think", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "call_2", "type": "function", "function": {"name": "g", "arguments": "{\"x\":1}"}},
            ]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "one"}),
            json!({"role": "tool", "tool_call_id": "call_2", "content": [{"type": "input_text", "text": "two"}]}),
            json!({"role": "assistant", "content": "Done.", "reasoning_content": "again", "tool_calls": [
                {"id": "call_3", "type": "function", "function": {"name": "f", "arguments": "{}"}},
            ]}),
            json!({"role": "assistant", "content": "After a call, a new turn."}),
        ]
    );
    assert_eq!(
        input_messages(json!("just text")).expect("a string"),
        vec![json!({"role": "user", "content": "just text"})]
    );
}
