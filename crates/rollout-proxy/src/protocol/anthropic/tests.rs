//! Tests of the Messages translation: system, tool results, thinking and tool use in the core's form.

use serde_json::json;

use super::*;

fn check(system: Option<Value>, messages: Value) -> Result<Vec<Value>, ApiError> {
    to_core_messages(system, serde_json::from_value(messages).expect("a list"))
}

#[test]
fn a_claude_code_turn_becomes_the_core_messages() {
    let image =
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}});
    let out = check(
        Some(json!([{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}])),
        json!([
            {"role": "user", "content": "Fix it."},
            {"role": "system", "content": [{"type": "text", "text": "# Environment"}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "Look first.", "signature": "arena-rl:msg_1"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Looking."},
                {"type": "tool_use", "id": "toolu_1", "name": "read", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_2", "name": "shot", "input": {}},
            ]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "text of a"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "no display"}, image.clone()]},
                {"type": "text", "text": "<system-reminder>x</system-reminder>"},
            ]},
        ]),
    )
    .expect("translates");
    assert_eq!(
        out,
        vec![
            json!({"role": "system", "content": [{"type": "text", "text": "sys", "cache_control": {"type": "ephemeral"}}]}),
            json!({"role": "user", "content": "Fix it."}),
            json!({"role": "system", "content": [{"type": "text", "text": "# Environment"}]}),
            json!({"role": "assistant", "content": "Looking.", "reasoning_content": "Look first.", "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"a\"}"}},
                {"id": "toolu_2", "type": "function", "function": {"name": "shot", "arguments": "{}"}},
            ]}),
            json!({"role": "tool", "tool_call_id": "toolu_1", "content": "text of a"}),
            json!({"role": "tool", "tool_call_id": "toolu_2", "is_error": true,
                   "content": [{"type": "text", "text": "no display"}, image]}),
            json!({"role": "user", "content": [{"type": "text", "text": "<system-reminder>x</system-reminder>"}]}),
        ]
    );
}

#[test]
fn text_before_a_tool_result_keeps_its_place() {
    let out = check(
        None,
        json!([{"role": "user", "content": [
            {"type": "text", "text": "first"},
            {"type": "tool_result", "tool_use_id": "t"},
        ]}]),
    )
    .expect("translates");
    assert_eq!(out[0]["role"], "user");
    assert_eq!(
        out[1],
        json!({"role": "tool", "tool_call_id": "t", "content": ""})
    );
}

#[test]
fn malformed_messages_name_the_place() {
    for (messages, needle) in [
        (json!([3]), "messages[0] must be an object"),
        (
            json!([{"role": "user", "content": [{"type": "tool_result"}]}]),
            "messages[0].content[0].tool_use_id is required",
        ),
        (
            json!([{"role": "assistant", "content": [{"type": "tool_use", "name": "f"}]}]),
            "messages[0].content[0] has no id",
        ),
        (
            json!([{"role": "tool", "content": "x"}]),
            "messages[0].role must be",
        ),
        (
            json!([{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "is_error": "yes"}]}]),
            "messages[0].content[0].is_error must be a boolean",
        ),
    ] {
        let e = check(None, messages).expect_err(needle);
        assert!(e.message.contains(needle), "{}", e.message);
        assert_eq!(e.param.as_deref(), Some("messages"));
    }
}

#[test]
fn provider_tools_are_left_out_and_function_tools_converted() {
    let tools = to_core_tools(Some(vec![
        json!({"name": "read", "description": "d", "input_schema": {"type": "object"}}),
        json!({"type": "web_search_20250305", "name": "web_search", "max_uses": 5}),
    ]))
    .expect("converts");
    assert_eq!(
        tools,
        Some(vec![
            json!({"type": "function", "function": {"name": "read", "description": "d", "parameters": {"type": "object"}}})
        ])
    );
    assert!(to_core_tools(Some(vec![json!({"input_schema": {}})])).is_err());
}

#[test]
fn tool_inputs_are_always_objects() {
    let call = |arguments: &str| ToolCallOut {
        index: 0,
        id: "toolu_1".into(),
        name: "f".into(),
        arguments: arguments.into(),
    };
    assert_eq!(tool_input(&call("{\"a\":1}")), json!({"a": 1}));
    assert_eq!(tool_input(&call("[1]")), json!({"value": [1]}));
}

/// AReaL #1747: an explicit `is_error` is carried both ways, `false` as well as `true`; an absent one stays
/// absent.
#[test]
fn an_explicit_is_error_is_carried_true_and_false() {
    let out = check(
        None,
        json!([{"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "a", "content": "ok", "is_error": false},
            {"type": "tool_result", "tool_use_id": "b", "content": "bad", "is_error": true},
            {"type": "tool_result", "tool_use_id": "c", "content": "?"},
        ]}]),
    )
    .expect("translates");
    assert_eq!(
        out,
        vec![
            json!({"role": "tool", "tool_call_id": "a", "content": "ok", "is_error": false}),
            json!({"role": "tool", "tool_call_id": "b", "content": "bad", "is_error": true}),
            json!({"role": "tool", "tool_call_id": "c", "content": "?"}),
        ]
    );
}
