//! The reference's acceptance cases (shared/spec/arena-reference.md section 8) that need more than one module:
//! routing, metrics and the audit shard together, as the workflow will drive them.

use reward_routing::{
    AuditConfig, AuditWriter, Decision, Outcome, RejectReason, RewardRule, RewardSettings, RowMeta, Scope,
    TaskOutcome, TaskStatus, TransformError, TransformRegistry,
};
use serde_json::{Value, json};

use crate::support::{episode, metric, run, shard_lines};

const CLAUDE_TEXT: &str = "Harness: harness agent phase exited with code 1. \
                           Harness: agent phase error: Claude reported error: context window exceeded";

fn writer() -> (tempfile::TempDir, AuditWriter) {
    let root = tempfile::tempdir().expect("tempdir");
    let writer = AuditWriter::new(AuditConfig::new(root.path().join("arena_results"))).expect("writer");
    (root, writer)
}

fn task(id: &str, status: TaskStatus, score: Option<f64>, raw: Value) -> TaskOutcome {
    TaskOutcome {
        raw,
        ..TaskOutcome::new(id, status, score)
    }
}

fn rule(threshold: Option<f64>, transform: &str, registry: &TransformRegistry) -> RewardRule {
    let settings = RewardSettings {
        reward_threshold: threshold,
        reward_transform_fn: transform.into(),
    };
    RewardRule::new("astra", &settings, registry).expect("rule")
}

/// 8.1 item 44: metrics on both sides of a transform.
#[test]
fn transformed_and_raw_rewards_are_recorded_side_by_side() {
    let (_root, writer) = writer();
    let astra = rule(
        None,
        "examples.swe.reward_transforms.astra_partial_reward",
        &TransformRegistry::default(),
    );
    let done = episode(
        "row-44",
        Outcome::Task(task("t44", TaskStatus::Done, Some(0.75), json!({}))),
    );
    let (_, metrics) = run(&done, &astra, &writer, true);
    let close = |name: &str, expected: f64| {
        let got = metric(&metrics, name).unwrap_or_else(|| panic!("{name} missing"));
        assert!((got - expected).abs() < 1e-12, "{name} = {got}");
    };
    close("rollout/reward", 0.075);
    close("rollout/swe/reward", 0.075);
    close("rollout/raw_reward", 0.75);
    close("rollout/swe/raw_reward", 0.75);
    close("debug/task/row-44/raw_reward", 0.75);
    assert!(metric(&metrics, "rollout/debug/task/row-44/raw_reward").is_none());
    close("rollout/arena/result_dump_success", 1.0);
}

/// 8.1 item 50: eval rollouts record under `eval-rollout/`.
#[test]
fn eval_rollouts_record_under_the_eval_scope() {
    let (_root, writer) = writer();
    let mut eval = episode(
        "row-50",
        Outcome::Task(task("t50", TaskStatus::Ok, Some(1.0), Value::Null)),
    );
    eval.scope = Scope::EvalRollout;
    let (_, metrics) = run(&eval, &RewardRule::raw("astra"), &writer, true);
    assert_eq!(metric(&metrics, "eval-rollout/swe/reward"), Some(1.0));
    assert_eq!(
        metric(&metrics, "eval-rollout/arena/result_dump_success"),
        Some(1.0)
    );
    assert!(metrics.iter().all(|m| !m.name.starts_with("rollout/")));
}

/// 8.2 item 3: streams without a transform keep raw rewards.
#[test]
fn streams_without_a_transform_keep_raw_rewards() {
    let (_root, writer) = writer();
    for (i, score) in [0.2, 0.75, 0.98].into_iter().enumerate() {
        let done = episode(
            "row-3",
            Outcome::Task(task(&format!("t{i}"), TaskStatus::Done, Some(score), Value::Null)),
        );
        let (routed, _) = run(
            &done,
            &rule(None, "", &TransformRegistry::default()),
            &writer,
            true,
        );
        assert_eq!(routed.decision, Decision::Train(score));
    }
    let scores: Vec<Value> = shard_lines(writer.dir())
        .iter()
        .map(|l| l["training_score"].clone())
        .collect();
    assert_eq!(scores, [json!(0.2), json!(0.75), json!(0.98)]);
}

/// 8.2 item 28: a recovered model failure is audited once, after export, with training score 0.
#[test]
fn a_recovered_model_failure_has_one_audit_record_with_training_score_zero() {
    let (_root, writer) = writer();
    let raw = json!({"error": CLAUDE_TEXT, "transcript": ["turn 1", "turn 2"]});
    let failed = episode(
        "row-28",
        Outcome::Task(task("t28", TaskStatus::HarnessFailed, Some(0.0), raw.clone())),
    );
    let (routed, metrics) = run(&failed, &RewardRule::raw("astra"), &writer, true);
    assert_eq!(routed.decision, Decision::ZeroReward);
    assert_eq!(metric(&metrics, "rollout/training_score"), Some(0.0));
    let lines = shard_lines(writer.dir());
    assert_eq!(lines.len(), 1);
    let record = &lines[0];
    assert_eq!(record["status"], "HARNESS_FAILED");
    assert_eq!(record["arena_score"], json!(0.0));
    assert_eq!(record["training_score"], json!(0.0));
    assert_eq!(record["raw"], raw);
    assert_eq!(
        record["expected_reward_ref"],
        json!({"key": "astra-grader", "version": "7"})
    );
}

/// 8.2 item 29: a rejected system failure is audited with a null training score.
#[test]
fn a_rejected_system_failure_is_audited_with_a_null_training_score() {
    let (_root, writer) = writer();
    for (status, interactions) in [(TaskStatus::SetupFailed, 3), (TaskStatus::Timeout, 0)] {
        let mut failed = episode(
            "row-29",
            Outcome::Task(task("t29", status, None, json!({"why": "infra"}))),
        );
        failed.interaction_count = interactions;
        let (routed, _) = run(&failed, &RewardRule::raw("astra"), &writer, true);
        assert!(matches!(routed.decision, Decision::Reject(_)));
    }
    let lines = shard_lines(writer.dir());
    assert_eq!(lines.len(), 2);
    for line in &lines {
        assert_eq!(line["training_score"], Value::Null);
        assert_eq!(line["raw"], json!({"why": "infra"}));
    }
}

/// 8.2 item 30: a transform returning NaN is an error; the record keeps raw with a null training score.
#[test]
fn a_nan_transform_is_an_error_audited_with_raw_kept() {
    let (_root, writer) = writer();
    let mut registry = TransformRegistry::with_builtins();
    registry
        .register(
            "tests.nan_transform",
            |_: f64, _: &RowMeta, _: Option<f64>| -> Result<f64, TransformError> { Ok(f64::NAN) },
        )
        .expect("register");
    let raw = json!({"grader": {"passed": 2, "total": 3}});
    let done = episode(
        "row-30",
        Outcome::Task(task("t30", TaskStatus::Done, Some(0.66), raw.clone())),
    );
    let (routed, metrics) = run(
        &done,
        &rule(None, "tests.nan_transform", &registry),
        &writer,
        true,
    );
    let Decision::Reject(RejectReason::ResultProcessing { message }) = &routed.decision else {
        panic!("{:?}", routed.decision)
    };
    assert!(message.contains("non-finite"), "{message}");
    assert_eq!(metric(&metrics, "rollout/arena/terminal_success"), Some(1.0));
    assert_eq!(
        metric(&metrics, "rollout/arena/result_processing_success"),
        Some(0.0)
    );
    assert_eq!(metric(&metrics, "rollout/training_score"), None);
    let lines = shard_lines(writer.dir());
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["raw"], raw);
    assert_eq!(lines[0]["training_score"], Value::Null);
    assert_eq!(lines[0]["arena_score"], json!(0.66));
}

/// 8.2 item 31: heterogeneous `raw` payloads survive the shard; score and trace come from the top level.
#[test]
fn heterogeneous_raw_payloads_survive_the_shard() {
    let (_root, writer) = writer();
    let raws = [
        Value::Null,
        json!({"a": {"b": {"c": [1, 2, {"d": "e"}]}}}),
        json!({"score": 0.0, "trace_id": "inner"}),
        json!([{"x": 1}, [2], "three", null]),
    ];
    for (i, raw) in raws.iter().enumerate() {
        let outcome = TaskOutcome {
            raw: raw.clone(),
            trace_id: Some(format!("trace-{i}")),
            ..TaskOutcome::new(format!("t31-{i}"), TaskStatus::Done, Some(0.9))
        };
        run(
            &episode("row-31", Outcome::Task(outcome)),
            &RewardRule::raw("astra"),
            &writer,
            true,
        );
    }
    let lines = shard_lines(writer.dir());
    assert_eq!(lines.len(), raws.len());
    for (i, (line, raw)) in lines.iter().zip(&raws).enumerate() {
        assert_eq!(&line["raw"], raw);
        assert_eq!(line["raw_present"], !raw.is_null());
        assert_eq!(line["arena_score"], json!(0.9), "the score inside raw is ignored");
        assert_eq!(line["training_score"], json!(0.9));
        assert_eq!(line["trace_id"], format!("trace-{i}"));
    }
}

/// 8.2 item 32 (reward side): whatever envelope the client unwrapped, a bare score routes like any result.
#[test]
fn a_result_without_raw_or_trace_routes_like_any_other() {
    let (_root, writer) = writer();
    let bare = episode(
        "row-32",
        Outcome::Task(TaskOutcome::new("launch_one_task", TaskStatus::Done, Some(0.75))),
    );
    let (routed, metrics) = run(&bare, &RewardRule::raw("astra"), &writer, true);
    assert_eq!(routed.decision, Decision::Train(0.75));
    assert_eq!(metric(&metrics, "rollout/arena_raw_present"), Some(0.0));
    assert_eq!(metric(&metrics, "rollout/arena_trace_present"), Some(0.0));
    let lines = shard_lines(writer.dir());
    assert_eq!(lines[0]["raw_size_bytes"], 4);
    assert_eq!(lines[0]["task_id"], "launch_one_task");
}

/// 8.2 item 34: a score only inside `raw` is an error naming the top-level score.
#[test]
fn a_score_only_inside_raw_is_refused() {
    let (_root, writer) = writer();
    let done = episode(
        "row-34",
        Outcome::Task(task(
            "t34",
            TaskStatus::Done,
            None,
            json!({"score": 1.0, "reward": 1.0}),
        )),
    );
    let (routed, metrics) = run(&done, &RewardRule::raw("astra"), &writer, true);
    let Decision::Reject(RejectReason::ResultProcessing { message }) = &routed.decision else {
        panic!("{:?}", routed.decision)
    };
    assert!(message.contains("top-level 'score'"), "{message}");
    assert_eq!(
        metric(&metrics, "rollout/arena/result_processing_success"),
        Some(0.0)
    );
    assert_eq!(shard_lines(writer.dir())[0]["arena_score"], Value::Null);
}

/// 8.2 item 35: a failed task keeps `raw`, through routing and into the shard.
#[test]
fn a_failed_task_keeps_raw() {
    let (_root, writer) = writer();
    let raw = json!({"error": "grader crashed", "stderr": "Traceback ..."});
    let failed = episode(
        "row-35",
        Outcome::Task(task("t35", TaskStatus::EvalFailed, None, raw.clone())),
    );
    let (routed, _) = run(&failed, &RewardRule::raw("astra"), &writer, true);
    assert_eq!(routed.audit_now().map(|r| &r.raw), Some(&raw));
    assert_eq!(shard_lines(writer.dir())[0]["raw"], raw);
}

/// 8.2 items 24-27 through routing: the classifier table decides train-with-zero or reject.
#[test]
fn the_classifier_decides_zero_reward_or_rejection() {
    let (_root, writer) = writer();
    let cases = [
        (TaskStatus::Timeout, Value::Null, 2, false, Decision::ZeroReward),
        (
            TaskStatus::NoOutput,
            Value::Null,
            0,
            false,
            Decision::Reject(RejectReason::UnknownFailure {
                status: TaskStatus::NoOutput,
            }),
        ),
        (
            TaskStatus::HarnessFailed,
            Value::Null,
            2,
            true,
            Decision::ZeroReward,
        ),
        (
            TaskStatus::HarnessFailed,
            json!({"error": CLAUDE_TEXT}),
            1,
            false,
            Decision::ZeroReward,
        ),
        (
            TaskStatus::HarnessFailed,
            json!({"error": "OOM killed"}),
            1,
            false,
            Decision::Reject(RejectReason::UnknownFailure {
                status: TaskStatus::HarnessFailed,
            }),
        ),
        (
            TaskStatus::Cancelled,
            Value::Null,
            5,
            true,
            Decision::Reject(RejectReason::SystemFailure {
                status: TaskStatus::Cancelled,
            }),
        ),
    ];
    for (status, raw, interactions, overflow, expected) in cases {
        let mut failed = episode(
            "row-24",
            Outcome::Task(task("t24", status.clone(), Some(0.0), raw)),
        );
        failed.interaction_count = interactions;
        failed.context_overflow = overflow;
        let (routed, _) = run(&failed, &RewardRule::raw("astra"), &writer, true);
        assert_eq!(
            routed.decision, expected,
            "{status} interactions {interactions} overflow {overflow}"
        );
    }
    let transport = episode(
        "row-25",
        Outcome::Error {
            message: "502 from arena".into(),
            stage: reward_routing::ErrorStage::AfterLaunch,
        },
    );
    let (routed, _) = run(&transport, &RewardRule::raw("astra"), &writer, true);
    assert_eq!(
        routed.disposition.map(|d| d.as_str()),
        Some("system_failure_reject")
    );
}
