//! Tests of the result envelope parser (reference section 4.2).

use serde_json::{Value, json};
use stream_config::TaskStatus;

use super::parse_task_result;

fn check(input: Value, want: Result<(&str, &str, Option<f64>), &str>) {
    let got = parse_task_result(&input, "fallback");
    match (got, want) {
        (Ok(r), Ok((id, status, score))) => {
            assert_eq!(
                (r.task_id.as_str(), r.status.as_str(), r.score),
                (id, status, score),
                "{input}"
            );
        }
        (Err(e), Err(fragment)) => assert!(e.contains(fragment), "{input}: {e}"),
        (got, want) => panic!("{input}: got {got:?}, want {want:?}"),
    }
}

#[test]
fn envelopes() {
    check(json!(0.5), Ok(("fallback", "DONE", Some(0.5))));
    check(
        json!({"task_id": "t", "status": " done ", "score": 1}),
        Ok(("t", "DONE", Some(1.0))),
    );
    check(json!({"score": 0.25}), Ok(("fallback", "DONE", Some(0.25))));
    check(json!({"task_id": "t"}), Ok(("t", "PENDING", None)));
    check(
        json!({"data": {"status": "ok", "score": 0.5}}),
        Ok(("fallback", "OK", Some(0.5))),
    );
    check(
        json!({"result": {"output": {"task_id": "t", "status": "AGENT_RUNNING"}}}),
        Ok(("t", "AGENT_RUNNING", None)),
    );
    check(
        json!({"task": {"task_id": "t", "status": "PENDING", "score": null}}),
        Ok(("t", "PENDING", None)),
    );
    check(
        json!({"a": {"b": {"c": {"d": {"e": {"status": "DONE"}}}}}}),
        Err("status must be a non-blank string"),
    );
    check(
        json!({"data": {"data": {"data": {"data": {"data": {"score": 1}}}}}}),
        Err("status must be a non-blank string"),
    );
    check(
        json!({"data": {"data": {"data": {"data": {"score": 1}}}}}),
        Ok(("fallback", "DONE", Some(1.0))),
    );
}

#[test]
fn field_rules() {
    check(
        json!({"status": "DONE", "score": true}),
        Err("score must be a number"),
    );
    check(
        json!({"status": "DONE", "score": "1"}),
        Err("score must be a number"),
    );
    check(json!({"status": " "}), Err("status must be a non-blank string"));
    check(json!({"status": 3}), Err("status must be a non-blank string"));
    check(
        json!({"task_id": "", "status": "DONE"}),
        Err("task_id must be a non-empty string"),
    );
    check(
        json!({"task_id": 7, "status": "DONE"}),
        Err("task_id must be a non-empty string"),
    );
    check(
        json!({"status": "DONE", "trace_id": 5}),
        Err("trace_id must be a string or null"),
    );
    check(
        json!({"status": "DONE", "artifacts_uri": []}),
        Err("artifacts_uri must be a string or null"),
    );
    check(
        json!({"status": "DONE", "computed_at": {}}),
        Err("computed_at must be a string or null"),
    );
    check(json!("DONE"), Err("must be an object or a number"));
    check(json!(null), Err("must be an object or a number"));
}

#[test]
fn raw_is_kept_verbatim_and_never_searched() {
    let raw = json!({"score": 1.0, "result": {"score": 2}});
    let r = parse_task_result(&json!({"status": "DONE", "raw": raw, "trace_id": "tr"}), "f").unwrap();
    assert_eq!(r.raw, raw);
    assert_eq!(r.score, None);
    assert_eq!(r.trace_id.as_deref(), Some("tr"));
    assert_eq!(r.status, TaskStatus::Done);
    for raw in [json!(null), json!([1, {"a": null}]), json!("text")] {
        let r = parse_task_result(&json!({"status": "FAILED", "raw": raw}), "f").unwrap();
        assert_eq!(r.raw, raw);
    }
}
