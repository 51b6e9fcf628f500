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
    let got = classify_failure(
        FailurePolicy::Pr1547,
        Failure::Task { status: &status, raw },
        overflow,
        interactions,
    );
    // Merged main only adds outcome codes, which these raws do not carry.
    if super::super::harness::outcome_code(raw).is_none() {
        let main = classify_failure(
            FailurePolicy::MergedMain,
            Failure::Task { status: &status, raw },
            overflow,
            interactions,
        );
        assert_eq!(main, got, "merged main differs: {status} {raw}");
    }
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
    for status in ["CANCELLED", "COLLECT_FAILED", "ERROR", "EVAL_FAILED", "FAILED"] {
        for interactions in [0, 5] {
            check(status, &none, true, interactions, System);
        }
    }
}

#[test]
fn errors_that_are_not_typed_task_failures_are_system_failures() {
    for (overflow, interactions) in [(false, 0), (true, 7)] {
        for policy in [FailurePolicy::MergedMain, FailurePolicy::Pr1547] {
            assert_eq!(
                classify_failure(policy, Failure::Other, overflow, interactions),
                System
            );
        }
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

/// `arena-2026.md` 2.4's comparison: merged main gives the allow-listed GameAgent codes a zero reward with
/// interactions, in each of the three encodings; #1748 keeps the generic response failures rejected
/// unless an overflow speaks for the model; #1547 knows no codes.
#[test]
fn merged_main_attributes_allow_listed_gameagent_codes_and_rejects_the_generic_ones() {
    let encodings = |code: &str| {
        [
            json!({"outcome": {"schema": "areal.envarena-outcome.v1", "code": code}}),
            json!({"outcome_code": code}),
            json!({"error": format!("agent failed GAMEAGENT_OUTCOME_CODE={code} GAMEAGENT_OUTCOME_CLASS=x")}),
        ]
    };
    let classify = |policy, raw: &Value, overflow, interactions| {
        let status = TaskStatus::HarnessFailed;
        classify_failure(
            policy,
            Failure::Task { status: &status, raw },
            overflow,
            interactions,
        )
    };
    for code in MODEL_OUTCOME_CODES {
        for raw in encodings(code) {
            assert_eq!(
                classify(FailurePolicy::MergedMain, &raw, false, 2),
                Model,
                "{raw}"
            );
            assert_eq!(
                classify(FailurePolicy::MergedMain, &raw, false, 0),
                Unknown,
                "{raw}"
            );
            assert_eq!(classify(FailurePolicy::Pr1547, &raw, false, 2), Unknown, "{raw}");
        }
    }
    for code in ["LLM_RESPONSE_FAILED", "GAMEAGENT_RUN_FAILED", "UNKNOWN_FAILURE"] {
        for raw in encodings(code) {
            assert_eq!(
                classify(FailurePolicy::MergedMain, &raw, false, 2),
                Unknown,
                "{raw}"
            );
            assert_eq!(classify(FailurePolicy::MergedMain, &raw, true, 2), Model, "{raw}");
        }
    }
    // A malformed marker is no code.
    let malformed = json!({"error": "GAMEAGENT_OUTCOME_CODE=AGENT_MAX_TURNS_EXCEEDED-invalid"});
    assert_eq!(classify(FailurePolicy::MergedMain, &malformed, false, 2), Unknown);
    // Codes belong to HARNESS_FAILED: a system status stays a system failure.
    let status = TaskStatus::SetupFailed;
    let raw = json!({"outcome_code": "AGENT_MAX_TURNS_EXCEEDED"});
    let got = classify_failure(
        FailurePolicy::MergedMain,
        Failure::Task {
            status: &status,
            raw: &raw,
        },
        false,
        2,
    );
    assert_eq!(got, System);
}
