//! Tests of the v1 receipt (`arena-2026.md` 3.2 items 8-10 and 16-19).

use serde_json::{Value, json};

use super::*;

/// The worked example of 2.2: two runs, `main` failed for want of a public answer, `child` completed.
pub(crate) fn healthy() -> Value {
    json!({
        "nativeRlReceiptVersion": 1,
        "nativeExecutionHealthy": true,
        "nativeExportHealthy": true,
        "status": "ERROR",
        "trajectoryHealth": "healthy",
        "nativeStopReason": "completed",
        "nativeFailure": null,
        "runTerminals": {"main": "run.failed", "child": "run.completed"},
        "exportedRunCount": 2,
        "runFailures": [failure("main")],
    })
}

fn failure(run: &str) -> Value {
    json!({"runId": run, "error": {"code": "RUNTIME_EXECUTION_FAILED", "details": {"runtimeFailure": {
        "code": "DSH_PUBLIC_ANSWER_MISSING", "reason": "public_answer_missing"}}}})
}

fn with(edit: impl FnOnce(&mut Map<String, Value>)) -> Value {
    let mut raw = healthy();
    edit(raw.as_object_mut().expect("object"));
    raw
}

#[test]
fn the_worked_example_is_a_healthy_model_failure() {
    assert_eq!(check_receipt(&healthy()), Ok(()));
    assert!(!format_conflict(&healthy()));
}

/// Items 9, 17, 18: every field, its type and its value, one at a time.
#[test]
fn every_missing_or_wrong_field_rejects() {
    let set = |key: &str, value: Value| {
        let key = key.to_string();
        with(move |r| {
            r.insert(key, value);
        })
    };
    let mut bad = vec![
        set("nativeRlReceiptVersion", Value::Null),
        set("nativeRlReceiptVersion", json!(true)),
        set("nativeRlReceiptVersion", json!(1.0)),
        set("nativeRlReceiptVersion", json!(2)),
        set("nativeExecutionHealthy", json!(false)),
        set("nativeExecutionHealthy", json!(1)),
        set("nativeExportHealthy", json!(false)),
        set("status", json!("OK")),
        set("trajectoryHealth", json!("degraded")),
        set("nativeStopReason", json!("cancelled")),
        set("nativeFailure", json!({"code": "PROVIDER_FAILED"})),
        set("exportedRunCount", json!(3)),
        set("exportedRunCount", json!(2.0)),
        set(
            "runTerminals",
            json!({"main": "run.failed", "child": "run.cancelled"}),
        ),
        set("runTerminals", json!({})),
        set(
            "runTerminals",
            json!({"": "run.failed", "child": "run.completed"}),
        ),
        set(
            "runTerminals",
            json!({"main": "run.failed", "child": "run.failed"}),
        ),
        set("runFailures", json!([])),
        set("runFailures", json!([null])),
    ];
    for key in [
        "nativeRlReceiptVersion",
        "nativeExecutionHealthy",
        "nativeExportHealthy",
        "status",
        "trajectoryHealth",
        "nativeStopReason",
        "nativeFailure",
        "runTerminals",
        "exportedRunCount",
        "runFailures",
    ] {
        bad.push(with(|r| {
            r.remove(key);
        }));
    }
    for raw in bad {
        assert!(check_receipt(&raw).is_err(), "{raw}");
    }
}

/// Item 10: the failures must attribute every failed run once, to the model's missing public answer.
#[test]
fn malformed_attribution_rejects() {
    let failures = |list: Value| {
        with(|r| {
            r.insert("runFailures".into(), list);
        })
    };
    let mut other_code = failure("main");
    other_code["error"]["code"] = json!("SYSTEM_FAILURE");
    let mut native_code = failure("main");
    native_code["error"]["details"]["runtimeFailure"]["code"] = json!("PROVIDER_FAILED");
    let mut reason = failure("main");
    reason["error"]["details"]["runtimeFailure"]["reason"] = json!("timeout");
    let mut no_details = failure("main");
    no_details["error"]
        .as_object_mut()
        .expect("object")
        .remove("details");
    for raw in [
        failures(json!([failure("main"), failure("main")])),
        failures(json!([failure("nobody")])),
        failures(json!([failure("child")])),
        failures(json!([other_code])),
        failures(json!([native_code])),
        failures(json!([reason])),
        failures(json!([no_details])),
        json!({"error": "DSH_PUBLIC_ANSWER_MISSING public_answer_missing"}),
    ] {
        assert!(check_receipt(&raw).is_err(), "{raw}");
    }
}

/// Items 16 and 19: another format vetoes a perfect receipt; nothing that is not an object qualifies.
#[test]
fn conflicting_formats_veto_and_non_objects_never_qualify() {
    for (key, value) in [
        ("outcome", json!({"code": "AGENT_MAX_TURNS_EXCEEDED"})),
        ("outcome_code", json!("SYSTEM_FAILURE")),
        ("error", json!("x GAMEAGENT_OUTCOME_CODE=AGENT_RUN_TIMEOUT")),
        (
            "error",
            json!("Harness: agent phase error: Claude reported error: max turns"),
        ),
    ] {
        let raw = with(|r| {
            r.insert(key.into(), value);
        });
        assert!(format_conflict(&raw), "{raw}");
        assert_eq!(check_receipt(&raw), Err(ReceiptProblem::Vetoed), "{raw}");
    }
    for raw in [
        Value::Null,
        json!({}),
        json!([]),
        json!({"nativeExportHealthy": false}),
    ] {
        assert!(check_receipt(&raw).is_err(), "{raw}");
    }
    assert_eq!(check_receipt(&json!([])), Err(ReceiptProblem::NotAnObject));
}
