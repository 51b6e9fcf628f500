//! Tests of the request-field bounds: each limit accepts its edge and refuses one past it, naming the field.

use serde_json::json;

use super::*;

/// Answers the refusal's message, checking its `param` names `field`.
fn refused(result: Result<(), ApiError>, field: &str) -> String {
    let error = result.expect_err("refused");
    let body = error.body();
    assert_eq!(body["error"]["param"], field, "{body}");
    body["error"]["message"].as_str().expect("a message").to_string()
}

#[test]
fn stop_strings_are_bounded_in_count_and_length() {
    let four: Vec<String> = (0..4).map(|i| format!("stop{i}")).collect();
    stop(&four, "stop", MAX_OPENAI_STOP).expect("four pass");
    let five: Vec<String> = (0..5).map(|i| format!("stop{i}")).collect();
    let message = refused(stop(&five, "stop", MAX_OPENAI_STOP), "stop");
    assert!(
        message.contains("maximum length 4") && message.contains("length 5"),
        "{message}"
    );
    stop(&five, "stop_sequences", MAX_ANTHROPIC_STOP).expect("Anthropic allows more");
    let edge = vec!["x".repeat(MAX_STOP_BYTES)];
    stop(&edge, "stop", MAX_OPENAI_STOP).expect("the longest passes");
    let long = vec!["ok".into(), "x".repeat(MAX_STOP_BYTES + 1)];
    let message = refused(
        stop(&long, "stop_sequences", MAX_ANTHROPIC_STOP),
        "stop_sequences",
    );
    assert!(message.contains("'stop_sequences[1]'"), "{message}");
}

#[test]
fn openai_metadata_follows_openai_rules() {
    let sixteen: Map<String, Value> = (0..16)
        .map(|i| (format!("k{i}"), json!("v".repeat(MAX_METADATA_VALUE_CHARS))))
        .collect();
    openai_metadata(Some(&Value::Object(sixteen.clone()))).expect("16 keys of 512 pass");
    let mut seventeen = sixteen;
    seventeen.insert("k16".into(), json!("v"));
    let message = refused(openai_metadata(Some(&Value::Object(seventeen))), "metadata");
    assert!(message.contains("at most 16"), "{message}");
    let long_key = json!({"k".repeat(MAX_METADATA_KEY_CHARS + 1): "v"});
    refused(openai_metadata(Some(&long_key)), "metadata");
    let key_edge = json!({"k".repeat(MAX_METADATA_KEY_CHARS): "v"});
    openai_metadata(Some(&key_edge)).expect("a 64-character key passes");
    let long_value = json!({"k": "é".repeat(MAX_METADATA_VALUE_CHARS + 1)});
    let message = refused(openai_metadata(Some(&long_value)), "metadata");
    assert!(message.contains("'metadata.k'"), "{message}");
    let nested = json!({"k": {"deep": "v"}});
    let message = refused(openai_metadata(Some(&nested)), "metadata");
    assert!(message.contains("expected a string"), "{message}");
    refused(openai_metadata(Some(&json!(["a"]))), "metadata");
    openai_metadata(None).expect("absent passes");
    openai_metadata(Some(&Value::Null)).expect("null passes");
}

#[test]
fn anthropic_metadata_holds_only_a_bounded_user_id() {
    // Claude Code's own form: user_<hash>_account_<uuid>_session_<uuid>.
    let claude_code = json!({"user_id": format!("user_{}_account_{}_session_{}", "a".repeat(64),
        "0".repeat(36), "1".repeat(36))});
    anthropic_metadata(Some(&claude_code)).expect("Claude Code's metadata passes");
    anthropic_metadata(Some(&json!({"user_id": null}))).expect("null passes");
    let long = json!({"user_id": "u".repeat(MAX_USER_ID_CHARS + 1)});
    let message = refused(anthropic_metadata(Some(&long)), "metadata");
    assert!(message.contains("metadata.user_id"), "{message}");
    let extra = json!({"user_id": "u", "blob": "x"});
    let message = refused(anthropic_metadata(Some(&extra)), "metadata");
    assert!(message.contains("metadata.blob"), "{message}");
    refused(anthropic_metadata(Some(&json!({"user_id": 7}))), "metadata");
}

#[test]
fn tools_are_bounded_in_count_and_size() {
    let tool = json!({"type": "function", "function": {"name": "t", "parameters": {"type": "object"}}});
    let many = vec![tool.clone(); MAX_TOOLS];
    tools(Some(&many)).expect("512 small tools pass");
    let too_many = vec![tool; MAX_TOOLS + 1];
    let message = refused(tools(Some(&too_many)), "tools");
    assert!(message.contains("maximum length 512"), "{message}");
    let big = json!({"name": "big", "description": "d".repeat(MAX_TOOLS_BYTES)});
    refused(tools(Some(&[big])), "tools");
}

#[test]
fn json_size_is_the_compact_length_and_stops_at_the_cap() {
    for value in [
        json!({"a": [1, "xy", null, true], "bc": {"d": 12345}}),
        json!("plain"),
        json!([]),
        json!({"n": 0, "m": 9}),
    ] {
        let exact = serde_json::to_string(&value).expect("serialises").len();
        let size = json_size(&value, usize::MAX);
        // Literals count 5 (as `false`), so the estimate is never below the real length by more than that.
        assert!(
            size + 1 >= exact && size <= exact + 8,
            "{value}: {size} vs {exact}"
        );
    }
    let huge = json!(vec!["x".repeat(1000); 1000]);
    assert_eq!(json_size(&huge, 10_000), 10_000);
    json_field(Some(&huge), "text", 2_000_000).expect("under the limit passes");
    let message = refused(json_field(Some(&huge), "text", 10_000), "text");
    assert!(message.contains("'text'"), "{message}");
}
