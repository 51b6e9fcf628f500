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

/// `arena-2026.md` 3.2 items 1, 4, 5, 12-15 under the strict receipt policy: without a valid receipt nothing
/// is the model's, a system status wins over a perfect receipt, and the receipt counts for `HARNESS_FAILED`
/// alone.
#[test]
fn the_strict_policy_is_conservative() {
    let strict = |status: &str, raw: &Value, overflow: bool, interactions: u64| {
        let status = TaskStatus::parse(status);
        classify_failure(
            FailurePolicy::StrictReceipt,
            Failure::Task { status: &status, raw },
            overflow,
            interactions,
        )
    };
    let none = Value::Null;
    for (status, overflow, interactions) in [
        ("HARNESS_FAILED", true, 1),
        ("HARNESS_FAILED", true, 0),
        ("HARNESS_FAILED", false, 1),
        ("TIMEOUT", false, 1),
        ("TIMEOUT", true, 0),
        ("NO_OUTPUT", false, 1),
        ("NO_OUTPUT", false, 0),
    ] {
        assert_eq!(strict(status, &none, overflow, interactions), Unknown, "{status}");
    }
    assert_eq!(strict("SETUP_FAILED", &none, true, 1), System);
    assert_eq!(
        strict("HARNESS_FAILED", &json!({"error": CLAUDE_TEXT}), true, 3),
        Unknown
    );
    for code in [
        "AGENT_MAX_TURNS_EXCEEDED",
        "AGENT_RUN_TIMEOUT",
        "AUTONOMOUS_INCOMPLETE_NO_SHIP",
        "LLM_RESPONSE_TIMEOUT",
    ] {
        for raw in [
            json!({"outcome": {"code": code}}),
            json!({"outcome_code": code}),
            json!({"error": format!("GAMEAGENT_OUTCOME_CODE={code}")}),
        ] {
            assert_eq!(strict("HARNESS_FAILED", &raw, false, 2), Unknown, "{raw}");
        }
    }
    for raw in [
        json!({"outcome_code": "UNKNOWN_FAILURE"}),
        json!({"error": "XGAMEAGENT_OUTCOME_CODE=AGENT_MAX_TURNS_EXCEEDED"}),
        json!({"error": "GAMEAGENT_OUTCOME_CODE=AGENT_MAX_TURNS_EXCEEDED-invalid"}),
    ] {
        assert_eq!(strict("HARNESS_FAILED", &raw, false, 2), Unknown, "{raw}");
    }
    // Item 14: runner-style messages without a receipt.
    for message in [
        "shared model request budget exhausted",
        "model stopped without visible output or tool calls",
        "tool calls and finish reason disagree",
        "invalid tool name",
    ] {
        let raw = json!({
            "error": format!("harness agent phase exited with code 1: {message}"),
            "harness": {"exit_code": 1, "phase": "agent", "result_status": "ERROR"},
        });
        assert_eq!(strict("HARNESS_FAILED", &raw, false, 2), Unknown, "{message}");
    }
    let receipt = crate::receipt::tests::healthy();
    assert_eq!(strict("HARNESS_FAILED", &receipt, false, 1), Model);
    assert_eq!(strict("HARNESS_FAILED", &receipt, false, 0), Unknown, "item 11");
    assert_eq!(strict("SETUP_FAILED", &receipt, false, 3), System, "item 12");
    for (overflow, interactions) in [(false, 0), (true, 0), (false, 3), (true, 3)] {
        assert_eq!(
            strict("ERROR", &receipt, overflow, interactions),
            System,
            "item 13"
        );
    }
    for status in ["TIMEOUT", "NO_OUTPUT"] {
        for overflow in [false, true] {
            assert_eq!(strict(status, &receipt, overflow, 2), Unknown, "item 15 {status}");
        }
    }
    assert_eq!(
        classify_failure(FailurePolicy::StrictReceipt, Failure::Other, true, 3),
        System,
        "item 2"
    );
}
