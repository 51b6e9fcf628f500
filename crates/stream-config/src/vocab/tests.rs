//! Shared vocabulary: protocol inference and task status sets.

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
