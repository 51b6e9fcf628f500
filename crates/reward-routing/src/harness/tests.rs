//! Tests of outcome-code parsing (`arena-2026.md` 2.8).

use serde_json::{Value, json};

use super::*;

fn check(raw: Value, code: Option<&str>, metric: &str) {
    assert_eq!(outcome_code(&raw), code, "{raw}");
    assert_eq!(metric_code(&raw), metric, "{raw}");
}

#[test]
fn the_first_well_formed_source_names_the_code() {
    let outcome = |code: &str| json!({"schema": "areal.envarena-outcome.v1", "code": code, "class": "model"});
    check(
        json!({"outcome": outcome("AGENT_MAX_TURNS_EXCEEDED")}),
        Some("AGENT_MAX_TURNS_EXCEEDED"),
        "AGENT_MAX_TURNS_EXCEEDED",
    );
    check(
        json!({"outcome_code": "AGENT_RUN_TIMEOUT"}),
        Some("AGENT_RUN_TIMEOUT"),
        "AGENT_RUN_TIMEOUT",
    );
    check(
        json!({"error": "run failed\nGAMEAGENT_OUTCOME_CODE=LLM_RESPONSE_TIMEOUT GAMEAGENT_OUTCOME_CLASS=model"}),
        Some("LLM_RESPONSE_TIMEOUT"),
        "LLM_RESPONSE_TIMEOUT",
    );
    // The object wins over the flat key, a malformed object code falls through to the next source.
    check(
        json!({"outcome": outcome("GAMEAGENT_RUN_FAILED"), "outcome_code": "AGENT_RUN_TIMEOUT"}),
        Some("GAMEAGENT_RUN_FAILED"),
        "GAMEAGENT_RUN_FAILED",
    );
    check(
        json!({"outcome": outcome("bad-code"), "error": "GAMEAGENT_OUTCOME_CODE=LLM_RESPONSE_FAILED"}),
        Some("LLM_RESPONSE_FAILED"),
        "LLM_RESPONSE_FAILED",
    );
    // A well-formed code outside the metric set is OTHER; no code at all is OTHER too.
    check(
        json!({"outcome_code": "UNKNOWN_FAILURE"}),
        Some("UNKNOWN_FAILURE"),
        OTHER_CODE,
    );
    check(
        json!({"error": "harness: injected HARNESS_FAILED"}),
        None,
        OTHER_CODE,
    );
    check(Value::Null, None, OTHER_CODE);
    check(json!([1, 2]), None, OTHER_CODE);
}

#[test]
fn markers_are_whole_tokens_and_codes_well_formed() {
    for raw in [
        json!({"error": "XGAMEAGENT_OUTCOME_CODE=AGENT_MAX_TURNS_EXCEEDED"}),
        json!({"error": "GAMEAGENT_OUTCOME_CODE=AGENT_MAX_TURNS_EXCEEDED-invalid"}),
        json!({"error": "GAMEAGENT_OUTCOME_CODE="}),
        json!({"outcome_code": "agent_max_turns_exceeded"}),
        json!({"outcome_code": "1AGENT"}),
        json!({"outcome_code": "A".repeat(129)}),
        json!({"outcome": {"code": 7}}),
    ] {
        check(raw, None, OTHER_CODE);
    }
    assert!(is_well_formed_code(&"A".repeat(128)));
    check(
        json!({"error": "x\tGAMEAGENT_OUTCOME_CODE=AUTONOMOUS_INCOMPLETE_NO_SHIP\n"}),
        Some("AUTONOMOUS_INCOMPLETE_NO_SHIP"),
        "AUTONOMOUS_INCOMPLETE_NO_SHIP",
    );
}

#[test]
fn any_outcome_format_counts_as_present_even_malformed() {
    assert!(has_outcome_format(&json!({"outcome": null})));
    assert!(has_outcome_format(&json!({"outcome_code": "x"})));
    assert!(has_outcome_format(&json!({"error": "XGAMEAGENT_OUTCOME_CODE=x"})));
    assert!(!has_outcome_format(&json!({"error": "plain failure"})));
    assert!(!has_outcome_format(&Value::Null));
}
