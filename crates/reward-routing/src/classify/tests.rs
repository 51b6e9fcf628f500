//! Tests of failure classification (reference section 8.2 items 24-27).

use serde_json::{Value, json};
use stream_config::TaskStatus;

use super::*;
use FailureDisposition::{
    ModelFailureZero as Model, SystemFailureReject as System, UnknownFailureReject as Unknown,
};

const CLAUDE_TEXT: &str = "Harness: harness agent phase exited with code 1\n\
                           Harness: agent phase error: Claude reported error: max turns reached";

fn check(status: &str, raw: &Value, overflow: bool, interactions: u64, expected: FailureDisposition) {
    let status = TaskStatus::parse(status);
    let got = classify_failure(Failure::Task { status: &status, raw }, overflow, interactions);
    assert_eq!(
        got, expected,
        "status {status} overflow {overflow} interactions {interactions} raw {raw}"
    );
}

#[test]
fn the_reference_table_holds() {
    let none = Value::Null;
    // (status, overflow, interactions, expected)
    let table = [
        ("HARNESS_FAILED", false, 0, Unknown),
        ("HARNESS_FAILED", false, 1, Unknown),
        ("HARNESS_FAILED", true, 0, Unknown),
        ("HARNESS_FAILED", true, 1, Model),
        ("TIMEOUT", false, 0, Unknown),
        ("TIMEOUT", false, 1, Model),
        ("TIMEOUT", true, 0, Unknown),
        ("TIMEOUT", true, 1, Model),
        ("NO_OUTPUT", false, 0, Unknown),
        ("NO_OUTPUT", false, 3, Model),
        ("NO_OUTPUT", true, 0, Unknown),
        ("NO_OUTPUT", true, 3, Model),
        ("SETUP_FAILED", false, 0, System),
        ("SETUP_FAILED", false, 1, System),
        ("SETUP_FAILED", true, 0, System),
        ("SETUP_FAILED", true, 1, System),
    ];
    for (status, overflow, interactions, expected) in table {
        check(status, &none, overflow, interactions, expected);
    }
    for status in ["CANCELLED", "COLLECT_FAILED", "EVAL_FAILED", "FAILED"] {
        for interactions in [0, 5] {
            check(status, &none, true, interactions, System);
        }
    }
}

#[test]
fn errors_that_are_not_typed_task_failures_are_system_failures() {
    for (overflow, interactions) in [(false, 0), (true, 7)] {
        assert_eq!(classify_failure(Failure::Other, overflow, interactions), System);
    }
}

#[test]
fn the_claude_agent_phase_text_attributes_harness_failures_to_the_model() {
    let raw = json!({"error": CLAUDE_TEXT});
    assert!(is_claude_agent_phase_failure(&raw));
    check("HARNESS_FAILED", &raw, false, 2, Model);
    check("HARNESS_FAILED", &raw, false, 0, Unknown);
    // The text rule belongs to HARNESS_FAILED only.
    check("SETUP_FAILED", &raw, false, 2, System);
    check("NO_OUTPUT", &raw, false, 0, Unknown);
    // Lower-casing makes the match case-insensitive.
    let shouted = json!({"error": CLAUDE_TEXT.to_uppercase()});
    check("HARNESS_FAILED", &shouted, false, 1, Model);
}

#[test]
fn ambiguous_harness_failure_text_stays_unknown() {
    let ambiguous = [
        json!({"error": "Harness: harness agent phase exited with code 137"}),
        json!({"error": "Harness: agent phase error: Claude reported error"}),
        json!({"error": "sandbox was killed"}),
        json!({"error": {"message": CLAUDE_TEXT}}),
        json!({"message": CLAUDE_TEXT}),
        json!([CLAUDE_TEXT]),
        json!(CLAUDE_TEXT),
        Value::Null,
    ];
    for raw in &ambiguous {
        assert!(!is_claude_agent_phase_failure(raw), "{raw}");
        check("HARNESS_FAILED", raw, false, 4, Unknown);
    }
}

#[test]
fn dispositions_have_the_reference_names() {
    assert_eq!(Model.as_str(), "model_failure_zero");
    assert_eq!(System.as_str(), "system_failure_reject");
    assert_eq!(Unknown.as_str(), "unknown_failure_reject");
}
