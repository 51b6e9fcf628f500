//! Shared vocabulary: protocol inference, task status sets and task types from tags.

use super::*;

#[test]
fn protocol_inference_follows_the_harness_name() {
    let check = |harness: &str, want: LlmProtocol| {
        assert_eq!(LlmProtocol::infer_from_harness(harness), want, "{harness}");
    };
    check("Claude-Code-With-Skills", LlmProtocol::Anthropic);
    check("claude@1", LlmProtocol::Anthropic);
    check("openai-codex", LlmProtocol::Responses);
    check("swe-agent", LlmProtocol::ChatCompletions);
    check("", LlmProtocol::ChatCompletions);
}

#[test]
fn task_status_sets_match_the_reference() {
    let failures = [
        "CANCELLED",
        "ERROR",
        "COLLECT_FAILED",
        "EVAL_FAILED",
        "FAILED",
        "HARNESS_FAILED",
        "NO_OUTPUT",
        "SETUP_FAILED",
        "TIMEOUT",
    ];
    for s in failures {
        let status = TaskStatus::parse(&format!("  {} ", s.to_lowercase()));
        assert!(
            status.is_failure() && status.is_terminal() && !status.is_success(),
            "{s}"
        );
        assert_eq!(status.as_str(), s);
    }
    for s in ["DONE", "ok"] {
        assert!(TaskStatus::parse(s).is_success());
    }
    for s in ["PENDING", "AGENT_RUNNING", "LOCAL_WAIT_TIMEOUT"] {
        assert!(!TaskStatus::parse(s).is_terminal(), "{s}");
    }
    assert_eq!(
        TaskStatus::parse("agent_running"),
        TaskStatus::Other("AGENT_RUNNING".into())
    );
}

#[test]
fn unsupported_protocol_names_the_value() {
    let err = "gemini".parse::<LlmProtocol>().unwrap_err().to_string();
    assert!(
        err.contains("unsupported llm_protocol") && err.contains("gemini"),
        "{err}"
    );
}

fn check_tags(tags: serde_json::Value, want: &str) {
    assert_eq!(task_type_from_tags(Some(&tags)), want, "{tags}");
}

#[test]
fn task_type_comes_from_exactly_one_domain() {
    check_tags(serde_json::json!(["domain:swe", "lang:py"]), "swe");
    check_tags(serde_json::json!(["domain: math ", "domain:math"]), "math");
    check_tags(serde_json::json!(["lang:py"]), "unknown");
    check_tags(serde_json::json!(["domain:swe", "domain:math"]), "unknown");
    check_tags(serde_json::json!(["domain:swe", 3]), "unknown");
    check_tags(serde_json::json!(["domain:  "]), "unknown");
    check_tags(serde_json::json!({"domain": "swe"}), "unknown");
    check_tags(serde_json::json!("domain:swe"), "unknown");
    assert_eq!(task_type_from_tags(None), "unknown");
}

#[test]
fn metric_task_types_are_trimmed_or_unknown() {
    assert_eq!(metric_task_type(" swe "), "swe");
    assert_eq!(metric_task_type("  "), UNKNOWN_TASK_TYPE);
}
