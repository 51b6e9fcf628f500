//! Tests of routing one rollout (reference section 8.1 item 44; 8.2 items 28-30, 35; section 4.4's proxy rules).

use serde_json::{Value, json};
use stream_config::TaskStatus;

use super::*;

use stream_config::RewardRef;

const CLAUDE_TEXT: &str =
    "harness: harness agent phase exited with code 1; harness: agent phase error: claude reported error";

fn row() -> RowMeta {
    RowMeta {
        data_id: "row-9".into(),
        stream_name: "astra".into(),
        stream_id: "stream-astra".into(),
        task_type: "swe".into(),
        expected_reward_ref: RewardRef {
            key: "grader".into(),
            version: "3".into(),
        },
    }
}

fn rule(threshold: Option<f64>, transform: &str) -> RewardRule {
    crate::test_support::rule("astra", threshold, transform)
}

fn task(status: &str, score: Option<f64>, raw: Value) -> TaskOutcome {
    TaskOutcome {
        raw,
        trace_id: Some("trace-1".into()),
        ..TaskOutcome::new("task-1", TaskStatus::parse(status), score)
    }
}

fn episode(outcome: Outcome) -> Episode {
    Episode {
        row: row(),
        outcome,
        interaction_count: 3,
        context_overflow: false,
        proxy_system_error: false,
        integrity_hits: Default::default(),
        scope: Scope::Rollout,
        session_id: Some("sess-1".into()),
    }
}

fn value(metrics: &[Metric], name: &str) -> Option<f64> {
    let found: Vec<_> = metrics.iter().filter(|m| m.name == name).collect();
    assert!(found.len() <= 1, "{name} recorded twice: {metrics:?}");
    found.first().map(|m| m.value)
}

#[test]
fn a_success_trains_on_the_transformed_reward_with_metrics_on_both_sides() {
    let outcome = task("DONE", Some(0.75), json!({"log": "ok"}));
    let routed = route_outcome(
        &episode(Outcome::Task(outcome)),
        &rule(None, "astra_partial_reward"),
    );
    let Decision::Train(reward) = routed.decision else {
        panic!("{:?}", routed.decision)
    };
    assert!((reward - 0.075).abs() < 1e-12);
    assert_eq!(routed.disposition, None);
    assert!(routed.audit_now().is_none());
    for (name, expected) in [
        ("rollout/arena/result_processing_success", 1.0),
        ("rollout/arena/terminal_success", 1.0),
        ("rollout/arena/call_success", 1.0),
        ("rollout/context_overflow", 0.0),
        ("rollout/proxy_system_error", 0.0),
        ("rollout/decision/train", 1.0),
        ("rollout/decision/reject", 0.0),
    ] {
        assert_eq!(value(&routed.metrics, name), Some(expected), "{name}");
    }

    let after = routed.after_export(true);
    let m = &after.metrics;
    let close = |name: &str, expected: f64| {
        let got = value(m, name).unwrap_or_else(|| panic!("{name} missing from {m:?}"));
        assert!((got - expected).abs() < 1e-12, "{name}: {got} != {expected}");
    };
    close("rollout/reward", 0.075);
    close("rollout/swe/reward", 0.075);
    close("rollout/training_score", 0.075);
    close("rollout/stream/astra/training_score", 0.075);
    close("rollout/raw_reward", 0.75);
    close("rollout/swe/raw_reward", 0.75);
    close("rollout/arena_score", 0.75);
    close("rollout/stream/astra/arena_score", 0.75);
    close("rollout/arena_raw_present", 1.0);
    close("rollout/arena_trace_present", 1.0);
    close("rollout/arena_artifacts_present", 0.0);
    close("debug/task/row-9/raw_reward", 0.75);
    assert_eq!(value(m, "rollout/task/row-9/raw_reward"), None);
    assert_eq!(m.iter().filter(|m| m.name.starts_with("debug/")).count(), 1);

    let record = after.audit.expect("audit record");
    assert_eq!(record.training_score, Some(reward));
    assert_eq!(record.arena_score, Some(0.75));
    assert_eq!(record.status, TaskStatus::Done);
    assert_eq!(routed.sample_result(true), SampleResult::Reward(reward));
}

#[test]
fn streams_without_a_transform_train_on_the_raw_score() {
    for score in [0.2, 0.75, 0.98] {
        let routed = route_outcome(
            &episode(Outcome::Task(task("OK", Some(score), Value::Null))),
            &rule(None, ""),
        );
        assert_eq!(routed.decision, Decision::Train(score));
    }
}

#[test]
fn an_empty_export_records_no_episode_metrics_and_a_null_training_score() {
    let routed = route_outcome(
        &episode(Outcome::Task(task("DONE", Some(1.0), Value::Null))),
        &rule(None, ""),
    );
    let after = routed.after_export(false);
    assert!(after.metrics.is_empty());
    assert_eq!(after.audit.expect("record").training_score, None);
    assert_eq!(routed.sample_result(false), SampleResult::Dropped);
}

#[test]
fn a_context_overflow_forces_reward_zero_even_on_success() {
    let mut episode = episode(Outcome::Task(task("DONE", Some(1.0), Value::Null)));
    episode.context_overflow = true;
    let routed = route_outcome(&episode, &rule(None, ""));
    assert_eq!(routed.decision, Decision::ZeroReward);
    assert_eq!(routed.disposition, Some(FailureDisposition::ModelFailureZero));
    assert_eq!(value(&routed.metrics, "rollout/context_overflow"), Some(1.0));
    let after = routed.after_export(true);
    assert_eq!(value(&after.metrics, "rollout/training_score"), Some(0.0));
    assert_eq!(value(&after.metrics, "rollout/arena_score"), Some(1.0));
    assert_eq!(after.audit.expect("record").training_score, Some(0.0));

    episode.interaction_count = 0;
    let routed = route_outcome(&episode, &rule(None, ""));
    assert_eq!(routed.decision, Decision::Reject(RejectReason::NoInteractions));
    assert_eq!(routed.sample_result(true), SampleResult::Dropped);
}

#[test]
fn a_recovered_model_failure_is_audited_once_with_training_score_zero() {
    let raw = json!({"error": CLAUDE_TEXT, "steps": [1, 2]});
    let routed = route_outcome(
        &episode(Outcome::Task(task("HARNESS_FAILED", Some(0.0), raw.clone()))),
        &rule(None, ""),
    );
    assert_eq!(routed.decision, Decision::ZeroReward);
    assert_eq!(routed.disposition, Some(FailureDisposition::ModelFailureZero));
    assert!(
        routed.audit_now().is_none(),
        "recovered failures are audited after export"
    );
    assert_eq!(
        value(&routed.metrics, "rollout/arena/terminal_success"),
        Some(0.0)
    );
    assert_eq!(value(&routed.metrics, "rollout/arena/call_success"), Some(0.0));
    let record = routed.after_export(true).audit.expect("one record");
    assert_eq!(record.status, TaskStatus::HarnessFailed);
    assert_eq!(record.arena_score, Some(0.0));
    assert_eq!(record.training_score, Some(0.0));
    assert_eq!(record.raw, raw);
    assert_eq!(routed.sample_result(true), SampleResult::Reward(0.0));
}

#[test]
fn a_rejected_system_failure_is_audited_now_with_a_null_training_score() {
    let raw = json!({"error": "image pull failed"});
    let routed = route_outcome(
        &episode(Outcome::Task(task("SETUP_FAILED", None, raw.clone()))),
        &rule(None, ""),
    );
    assert_eq!(
        routed.decision,
        Decision::Reject(RejectReason::SystemFailure {
            status: TaskStatus::SetupFailed
        })
    );
    let record = routed.audit_now().expect("audited now");
    assert_eq!(record.training_score, None);
    assert_eq!(record.raw, raw, "the typed failure keeps raw");
    assert_eq!(value(&routed.metrics, "rollout/reject/system_failure"), Some(1.0));
    assert_eq!(value(&routed.metrics, "rollout/decision/reject"), Some(1.0));
    assert_eq!(
        routed.after_export(true),
        AfterExport {
            metrics: vec![],
            audit: None
        }
    );
    assert!(matches!(routed.sample_result(true), SampleResult::Rejected(_)));
}

#[test]
fn unattributed_failures_are_rejected_as_unknown() {
    let routed = route_outcome(
        &episode(Outcome::Task(task(
            "HARNESS_FAILED",
            None,
            json!({"error": "exit 137"}),
        ))),
        &rule(None, ""),
    );
    assert_eq!(routed.disposition, Some(FailureDisposition::UnknownFailureReject));
    assert_eq!(
        value(&routed.metrics, "rollout/reject/unknown_failure"),
        Some(1.0)
    );
    assert_eq!(
        routed.audit_now().map(|r| r.raw.clone()),
        Some(json!({"error": "exit 137"}))
    );
}

#[test]
fn a_non_finite_transform_output_rejects_and_keeps_raw_in_the_audit_record() {
    let rule = crate::test_support::nan_rule("astra");
    let raw = json!({"tests": {"passed": 3}});
    let routed = route_outcome(
        &episode(Outcome::Task(task("DONE", Some(0.5), raw.clone()))),
        &rule,
    );
    let Decision::Reject(RejectReason::ResultProcessing { message }) = &routed.decision else {
        panic!("{:?}", routed.decision)
    };
    assert!(message.contains("returned a non-finite value: NaN"), "{message}");
    assert_eq!(
        value(&routed.metrics, "rollout/arena/terminal_success"),
        Some(1.0)
    );
    assert_eq!(
        value(&routed.metrics, "rollout/arena/result_processing_success"),
        Some(0.0)
    );
    assert_eq!(value(&routed.metrics, "rollout/arena/call_success"), Some(0.0));
    let record = routed.audit_now().expect("audited now");
    assert_eq!(record.raw, raw);
    assert_eq!(record.training_score, None);
    assert_eq!(record.arena_score, Some(0.5));
}

#[test]
fn a_score_found_only_inside_raw_is_not_a_reward() {
    let routed = route_outcome(
        &episode(Outcome::Task(task("DONE", None, json!({"score": 1.0})))),
        &rule(None, ""),
    );
    let Decision::Reject(RejectReason::ResultProcessing { message }) = &routed.decision else {
        panic!("{:?}", routed.decision)
    };
    assert!(message.contains("missing top-level 'score'"), "{message}");
}

#[test]
fn a_proxy_system_error_rejects_any_failure_regardless_of_the_classifier() {
    let cases = [
        Outcome::Task(task("HARNESS_FAILED", None, json!({"error": CLAUDE_TEXT}))),
        Outcome::Task(task("TIMEOUT", None, Value::Null)),
        Outcome::Task(task("SETUP_FAILED", None, Value::Null)),
        Outcome::Task(task("DONE", None, Value::Null)),
        Outcome::LocalWait {
            task_id: Some("task-1".into()),
            cancelled: false,
        },
        Outcome::Error {
            message: "connection reset".into(),
            stage: ErrorStage::AfterLaunch,
        },
    ];
    for outcome in cases {
        let mut episode = episode(outcome);
        episode.proxy_system_error = true;
        let routed = route_outcome(&episode, &rule(None, ""));
        assert_eq!(
            routed.decision,
            Decision::Reject(RejectReason::ProxySystemError),
            "{episode:?}"
        );
        assert_eq!(routed.disposition, Some(FailureDisposition::SystemFailureReject));
        assert_eq!(value(&routed.metrics, "rollout/proxy_system_error"), Some(1.0));
        assert_eq!(
            value(&routed.metrics, "rollout/reject/proxy_system_error"),
            Some(1.0)
        );
    }
    // A task Arena graded as a success is still trained, as in the reference.
    let mut success = episode(Outcome::Task(task("DONE", Some(1.0), Value::Null)));
    success.proxy_system_error = true;
    assert_eq!(
        route_outcome(&success, &rule(None, "")).decision,
        Decision::Train(1.0)
    );
}

#[test]
fn local_waits_are_audited_with_their_status_when_the_task_id_is_known() {
    for (cancelled, status, kind) in [
        (false, TaskStatus::LocalWaitTimeout, "local_timeout"),
        (true, TaskStatus::LocalWaitCancelled, "local_cancelled"),
    ] {
        let routed = route_outcome(
            &episode(Outcome::LocalWait {
                task_id: Some("task-5".into()),
                cancelled,
            }),
            &rule(None, ""),
        );
        assert_eq!(
            routed.decision,
            Decision::Reject(RejectReason::LocalWait { cancelled })
        );
        assert_eq!(routed.decision.reward(), None);
        let record = routed.audit_now().expect("audited");
        assert_eq!(record.status, status);
        assert_eq!(record.task_id, "task-5");
        assert_eq!(record.arena_score, None);
        assert_eq!(record.raw, Value::Null);
        assert_eq!(
            value(&routed.metrics, "rollout/arena/terminal_success"),
            Some(0.0)
        );
        assert_eq!(
            value(&routed.metrics, &format!("rollout/reject/{kind}")),
            Some(1.0)
        );
    }
    let before_launch = route_outcome(
        &episode(Outcome::LocalWait {
            task_id: None,
            cancelled: false,
        }),
        &rule(None, ""),
    );
    assert!(before_launch.audit_now().is_none());
    assert_eq!(
        value(&before_launch.metrics, "rollout/arena/launch_success"),
        Some(0.0)
    );
    assert_eq!(
        value(&before_launch.metrics, "rollout/arena/terminal_success"),
        None
    );
}

#[test]
fn errors_record_the_metrics_of_their_stage_and_no_audit_record() {
    let cases = [
        (ErrorStage::BeforeLaunch, None, None),
        (ErrorStage::Launch, Some(0.0), None),
        (ErrorStage::AfterLaunch, None, Some(0.0)),
    ];
    for (stage, launch, terminal) in cases {
        let routed = route_outcome(
            &episode(Outcome::Error {
                message: "HTTP 502".into(),
                stage,
            }),
            &rule(None, ""),
        );
        assert_eq!(
            routed.decision,
            Decision::Reject(RejectReason::Error {
                message: "HTTP 502".into()
            })
        );
        assert_eq!(routed.disposition, Some(FailureDisposition::SystemFailureReject));
        assert!(routed.audit_now().is_none());
        assert_eq!(
            value(&routed.metrics, "rollout/arena/launch_success"),
            launch,
            "{stage:?}"
        );
        assert_eq!(
            value(&routed.metrics, "rollout/arena/terminal_success"),
            terminal,
            "{stage:?}"
        );
        assert_eq!(value(&routed.metrics, "rollout/reject/arena_error"), Some(1.0));
    }
}

#[test]
fn a_status_that_is_not_terminal_is_an_error() {
    let routed = route_outcome(
        &episode(Outcome::Task(task("AGENT_RUNNING", None, Value::Null))),
        &rule(None, ""),
    );
    let Decision::Reject(RejectReason::Error { message }) = &routed.decision else {
        panic!("{:?}", routed.decision)
    };
    assert_eq!(
        message,
        "task \"task-1\" reported status AGENT_RUNNING which is not terminal"
    );
}

#[test]
fn eval_rollouts_record_under_eval_rollout_and_debug_stays_apart() {
    let mut episode = episode(Outcome::Task(task("DONE", Some(0.5), Value::Null)));
    episode.scope = Scope::EvalRollout;
    let routed = route_outcome(&episode, &rule(None, ""));
    let after = routed.after_export(true);
    for metric in routed.metrics.iter().chain(&after.metrics) {
        assert!(
            metric.name.starts_with("eval-rollout/") || metric.name.starts_with("debug/"),
            "{}",
            metric.name
        );
    }
    assert_eq!(value(&after.metrics, "eval-rollout/swe/reward"), Some(0.5));
    assert_eq!(value(&after.metrics, "debug/task/row-9/raw_reward"), Some(0.5));
}

#[test]
fn reject_reasons_have_stable_kinds_and_dispositions() {
    let reasons = [
        RejectReason::ProxySystemError,
        RejectReason::SystemFailure {
            status: TaskStatus::Failed,
        },
        RejectReason::UnknownFailure {
            status: TaskStatus::HarnessFailed,
        },
        RejectReason::ResultProcessing { message: "m".into() },
        RejectReason::LocalWait { cancelled: false },
        RejectReason::LocalWait { cancelled: true },
        RejectReason::Error { message: "m".into() },
        RejectReason::NoInteractions,
    ];
    let table: Vec<String> = reasons
        .iter()
        .map(|r| {
            format!(
                "{} | {} | rejects group: {} | {r}",
                r.kind(),
                r.disposition().as_str(),
                r.rejects_group()
            )
        })
        .collect();
    insta::assert_yaml_snapshot!(table);
}

#[test]
fn the_metrics_of_a_success_are_stable() {
    let mut outcome = task("DONE", Some(0.9799), json!({"k": "v"}));
    outcome.artifacts_uri = Some("s3://bucket/x".into());
    let routed = route_outcome(
        &episode(Outcome::Task(outcome)),
        &rule(Some(0.98), "examples.swe.reward_transforms.astra_partial_reward"),
    );
    let after = routed.after_export(true);
    let lines: Vec<String> = routed
        .metrics
        .iter()
        .chain(&after.metrics)
        .map(|m| format!("{} = {}", m.name, m.value))
        .collect();
    insta::assert_yaml_snapshot!(lines);
}

#[test]
fn integrity_hits_cost_what_the_stream_policy_says_and_are_always_counted() {
    let done = || Outcome::Task(task("DONE", Some(1.0), json!({})));
    let rules = ["git-reflog".to_string(), "git-fetch".to_string()];
    let hit = |o: Outcome| Episode {
        integrity_hits: [("git-reflog".to_string(), 2)].into(),
        ..episode(o)
    };
    let check = |policy: IntegrityPolicy, ep: Episode, decision: Decision, kind: Option<&str>| {
        let rule = rule(None, "").with_integrity(policy, rules.clone());
        let routed = route_outcome(&ep, &rule);
        assert_eq!(routed.decision, decision, "{policy:?}");
        let total = ep.integrity_hits.values().sum::<u64>() as f64;
        assert_eq!(
            value(&routed.metrics, "rollout/reward/integrity_hits"),
            Some(total)
        );
        assert_eq!(
            value(&routed.metrics, "rollout/reward/integrity_hits/git-reflog"),
            Some(ep.integrity_hits.get("git-reflog").map_or(0.0, |n| *n as f64))
        );
        assert_eq!(
            value(&routed.metrics, "rollout/reward/integrity_hits/git-fetch"),
            Some(0.0)
        );
        assert_eq!(value(&routed.metrics, "rollout/stream/row/integrity_hits"), None);
        assert_eq!(
            value(&routed.metrics, "rollout/stream/astra/integrity_hits"),
            Some(total)
        );
        assert_eq!(
            value(&routed.metrics, "rollout/reject/integrity_violation"),
            kind.map(|_| 1.0)
        );
        routed
    };
    check(IntegrityPolicy::Record, hit(done()), Decision::Train(1.0), None);
    check(IntegrityPolicy::Zero, episode(done()), Decision::Train(1.0), None);
    let zero = check(IntegrityPolicy::Zero, hit(done()), Decision::ZeroReward, None);
    assert_eq!(zero.after_export(true).audit.unwrap().training_score, Some(0.0));
    let violation = Decision::Reject(RejectReason::IntegrityViolation {
        rules: vec!["git-reflog".into()],
    });
    let rejected = check(
        IntegrityPolicy::Reject,
        hit(done()),
        violation,
        Some("integrity_violation"),
    );
    // Only the sample is dropped, and its audit record is written at once.
    assert_eq!(rejected.sample_result(true), SampleResult::Dropped);
    assert!(rejected.audit_now().is_some());
    // A rollout already rejected for another reason keeps that reason.
    let timeout = Outcome::LocalWait {
        task_id: Some("t".into()),
        cancelled: false,
    };
    check(
        IntegrityPolicy::Reject,
        hit(timeout),
        Decision::Reject(RejectReason::LocalWait { cancelled: false }),
        None,
    );
    // A hit of a rule the stream does not list still gets its own metric.
    let ep = Episode {
        integrity_hits: [("user-rule".to_string(), 1)].into(),
        ..episode(done())
    };
    let routed = route_outcome(
        &ep,
        &rule(None, "").with_integrity(IntegrityPolicy::Record, rules),
    );
    assert_eq!(
        value(&routed.metrics, "rollout/reward/integrity_hits/user-rule"),
        Some(1.0)
    );
}

/// `arena-2026.md` 2.8: outcome codes become the one-hot `harness_error/<CODE>` (rejected or not), and the
/// audit record names the task, the session and the code.
#[test]
fn harness_outcome_codes_reach_metrics_and_the_audit_record() {
    let failed = |raw: Value| Outcome::Task(task("HARNESS_FAILED", None, raw));
    let code_of = |routed: &Routed| {
        let on: Vec<_> = routed
            .metrics
            .iter()
            .filter(|m| m.name.starts_with("rollout/harness_error/") && m.value == 1.0)
            .map(|m| m.name.trim_start_matches("rollout/harness_error/").to_string())
            .collect();
        assert_eq!(on.len(), 1, "{:?}", routed.metrics);
        on[0].clone()
    };
    // Merged main trains an allow-listed code at 0 and records it after the export.
    let routed = route_outcome(
        &episode(failed(json!({"outcome_code": "AGENT_MAX_TURNS_EXCEEDED"}))),
        &rule(None, ""),
    );
    assert_eq!(routed.decision, Decision::ZeroReward);
    assert_eq!(code_of(&routed), "AGENT_MAX_TURNS_EXCEEDED");
    assert_eq!(value(&routed.metrics, "rollout/harness_error"), Some(1.0));
    assert_eq!(value(&routed.metrics, "rollout/harness_success"), Some(0.0));
    let audit = routed.after_export(true).audit.expect("a record");
    let line: Value = serde_json::from_str(&audit.to_line(1 << 20)).expect("json");
    assert_eq!(line["arena_task_id"], "task-1");
    assert_eq!(line["session_id"], "sess-1");
    assert_eq!(line["harness_outcome_code"], "AGENT_MAX_TURNS_EXCEEDED");
    // A generic failure is rejected at once and still counted, as OTHER when outside the metric set.
    for (raw, code) in [
        (
            json!({"error": "x GAMEAGENT_OUTCOME_CODE=GAMEAGENT_RUN_FAILED"}),
            "GAMEAGENT_RUN_FAILED",
        ),
        (json!({"outcome_code": "SOMETHING_ELSE"}), "OTHER"),
        (json!({"error": "harness: injected"}), "OTHER"),
    ] {
        let routed = route_outcome(&episode(failed(raw.clone())), &rule(None, ""));
        assert!(matches!(routed.decision, Decision::Reject(_)), "{raw}");
        assert_eq!(code_of(&routed), code, "{raw}");
        let line: Value =
            serde_json::from_str(&routed.audit_now().expect("a record").to_line(1 << 20)).expect("json");
        assert_eq!(line["harness_outcome_code"], code);
    }
    // Other statuses have no code, and a session-less episode audits a null session.
    let ep = Episode {
        session_id: None,
        ..episode(Outcome::Task(task(
            "TIMEOUT",
            None,
            json!({"outcome_code": "AGENT_RUN_TIMEOUT"}),
        )))
    };
    let routed = route_outcome(&ep, &rule(None, ""));
    assert_eq!(value(&routed.metrics, "rollout/harness_error"), Some(0.0));
    assert_eq!(value(&routed.metrics, "rollout/harness_error/OTHER"), Some(0.0));
    let line: Value =
        serde_json::from_str(&routed.after_export(true).audit.expect("record").to_line(1 << 20))
            .expect("json");
    assert_eq!(line["harness_outcome_code"], Value::Null);
    assert_eq!(line["session_id"], Value::Null);
    // Under #1547's rules the same code is not model evidence.
    let routed = route_outcome(
        &episode(failed(json!({"outcome_code": "AGENT_MAX_TURNS_EXCEEDED"}))),
        &rule(None, "").with_failure_policy(FailurePolicy::Pr1547),
    );
    assert!(matches!(
        routed.decision,
        Decision::Reject(RejectReason::UnknownFailure { .. })
    ));
}

/// `arena-2026.md` 2.8: the metadata stamped on exported interactions, and the turn metrics split by harness
/// outcome.
#[test]
fn episode_metadata_and_turn_metrics_follow_the_task() {
    let routed = route_outcome(
        &episode(Outcome::Task(task("DONE", Some(1.0), json!({})))),
        &rule(None, ""),
    );
    assert_eq!(
        Value::Object(routed.episode_metadata()),
        json!({"session_id": "sess-1", "arena_task_id": "task-1", "arena_status": "DONE"})
    );
    let names: Vec<_> = routed
        .turn_metrics(4)
        .into_iter()
        .map(|m| (m.name, m.value))
        .collect();
    assert_eq!(
        names,
        [
            ("rollout/num_turns".to_string(), 4.0),
            ("rollout/num_turns_no_harness_err".to_string(), 4.0)
        ]
    );
    let failed = task(
        "HARNESS_FAILED",
        None,
        json!({"outcome": {"code": "AGENT_RUN_TIMEOUT"}}),
    );
    let routed = route_outcome(&episode(Outcome::Task(failed)), &rule(None, ""));
    assert_eq!(routed.decision, Decision::ZeroReward);
    assert_eq!(
        Value::Object(routed.episode_metadata()),
        json!({"session_id": "sess-1", "arena_task_id": "task-1", "arena_status": "HARNESS_FAILED",
               "harness_outcome_code": "AGENT_RUN_TIMEOUT"})
    );
    let names: Vec<_> = routed.turn_metrics(2).into_iter().map(|m| m.name).collect();
    assert_eq!(
        names,
        [
            "rollout/num_turns",
            "rollout/num_turns_harness_err",
            "rollout/num_turns_harness_err/AGENT_RUN_TIMEOUT"
        ]
    );
}

/// `arena-2026.md` 2.4, each row under each policy (`merged_main`, `strict_receipt`, `pr1547`):
/// `reward`, `zero`, `dropped` (an empty export) or `reject/<reason>`.
#[test]
fn the_disposition_table_holds_under_each_policy() {
    let receipt = crate::receipt::tests::healthy;
    let vetoed = || {
        let mut raw = crate::receipt::tests::healthy();
        raw["outcome_code"] = json!("AGENT_MAX_TURNS_EXCEEDED");
        raw
    };
    let none = || json!({});
    let claude = || json!({"error": CLAUDE_TEXT});
    let code = || json!({"outcome": {"code": "AGENT_MAX_TURNS_EXCEEDED"}});
    type Raw = fn() -> Value;
    /// (status, raw, interactions, overflow, proxy error, [merged_main, strict_receipt, pr1547])
    type Row = (&'static str, Raw, u64, bool, bool, [&'static str; 3]);
    let mut rows: Vec<Row> = vec![
        ("DONE", none, 3, false, false, ["reward", "reward", "reward"]),
        ("OK", receipt, 3, false, true, ["reward", "reward", "reward"]),
        ("DONE", none, 3, true, false, ["zero", "zero", "zero"]),
        ("DONE", none, 0, false, false, ["dropped", "dropped", "dropped"]),
        (
            "HARNESS_FAILED",
            receipt,
            3,
            false,
            false,
            ["reject/unknown_failure", "zero", "reject/unknown_failure"],
        ),
        (
            "HARNESS_FAILED",
            receipt,
            3,
            true,
            false,
            ["zero", "zero", "zero"],
        ),
        (
            "HARNESS_FAILED",
            receipt,
            3,
            false,
            true,
            ["reject/proxy_system_error"; 3],
        ),
        (
            "HARNESS_FAILED",
            receipt,
            0,
            true,
            false,
            ["reject/unknown_failure"; 3],
        ),
        (
            "HARNESS_FAILED",
            none,
            3,
            true,
            false,
            ["zero", "reject/unknown_failure", "zero"],
        ),
        (
            "HARNESS_FAILED",
            none,
            3,
            false,
            false,
            ["reject/unknown_failure"; 3],
        ),
        (
            "HARNESS_FAILED",
            claude,
            3,
            false,
            false,
            ["zero", "reject/unknown_failure", "zero"],
        ),
        (
            "HARNESS_FAILED",
            code,
            3,
            false,
            false,
            ["zero", "reject/unknown_failure", "reject/unknown_failure"],
        ),
        (
            "HARNESS_FAILED",
            vetoed,
            3,
            false,
            false,
            ["zero", "reject/unknown_failure", "reject/unknown_failure"],
        ),
        (
            "TIMEOUT",
            receipt,
            3,
            false,
            false,
            ["zero", "reject/unknown_failure", "zero"],
        ),
        (
            "NO_OUTPUT",
            none,
            3,
            true,
            false,
            ["zero", "reject/unknown_failure", "zero"],
        ),
        ("TIMEOUT", none, 0, false, false, ["reject/unknown_failure"; 3]),
        (
            "NO_OUTPUT",
            receipt,
            2,
            false,
            true,
            ["reject/proxy_system_error"; 3],
        ),
    ];
    for status in [
        "CANCELLED",
        "COLLECT_FAILED",
        "EVAL_FAILED",
        "FAILED",
        "SETUP_FAILED",
        "ERROR",
    ] {
        rows.push((status, receipt, 3, true, false, ["reject/system_failure"; 3]));
        rows.push((status, none, 0, false, false, ["reject/system_failure"; 3]));
    }
    let policies = [
        FailurePolicy::MergedMain,
        FailurePolicy::StrictReceipt,
        FailurePolicy::Pr1547,
    ];
    let label = |routed: &Routed, interactions: u64| match &routed.decision {
        Decision::Reject(r) => format!("reject/{}", r.kind()),
        _ if interactions == 0 => "dropped".to_string(),
        Decision::Train(_) => "reward".to_string(),
        Decision::ZeroReward => "zero".to_string(),
    };
    for (status, raw, interactions, overflow, proxy_error, expected) in rows {
        for (policy, want) in policies.iter().zip(expected) {
            let ep = Episode {
                interaction_count: interactions,
                context_overflow: overflow,
                proxy_system_error: proxy_error,
                ..episode(Outcome::Task(task(status, Some(1.0), raw())))
            };
            let routed = route_outcome(&ep, &rule(None, "").with_failure_policy(*policy));
            let what = format!(
                "{status} {} n={interactions} O={overflow} S={proxy_error} {policy:?}",
                raw()
            );
            assert_eq!(label(&routed, interactions), want, "{what}");
            // Every rejection is a metric and an audit field.
            let audit = routed
                .audit_now()
                .cloned()
                .or_else(|| routed.after_export(interactions > 0).audit)
                .expect("every task result is audited");
            match want.strip_prefix("reject/") {
                Some(kind) => {
                    assert_eq!(
                        value(&routed.metrics, &format!("rollout/{want}")),
                        Some(1.0),
                        "{what}"
                    );
                    assert_eq!(audit.rejection_reason.as_deref(), Some(kind), "{what}");
                    assert_eq!(audit.training_score, None, "{what}");
                }
                None if want == "dropped" => {
                    assert_eq!(audit.rejection_reason.as_deref(), Some("empty_export"), "{what}");
                    assert_eq!(audit.training_score, None, "{what}");
                }
                None => assert_eq!(audit.rejection_reason, None, "{what}"),
            }
        }
    }
    // Non-Arena errors and our own deadline are rejected alike under every policy.
    for policy in policies {
        let error = Outcome::Error {
            message: "connection refused".into(),
            stage: ErrorStage::AfterLaunch,
        };
        let wait = Outcome::LocalWait {
            task_id: Some("t".into()),
            cancelled: false,
        };
        for (outcome, kind) in [(error, "arena_error"), (wait, "local_timeout")] {
            let routed = route_outcome(&episode(outcome), &rule(None, "").with_failure_policy(policy));
            assert!(
                matches!(&routed.decision, Decision::Reject(r) if r.kind() == kind),
                "{policy:?}"
            );
        }
    }
}

/// Under the strict policy a `HARNESS_FAILED` task's receipt is checked in the open: `receipt_valid`, the
/// one-hot `receipt_problem/<kind>` and the audit record's `receipt_problem`.
#[test]
fn the_strict_policy_says_why_a_receipt_failed() {
    let strict = rule(None, "").with_failure_policy(FailurePolicy::StrictReceipt);
    let mut incomplete = crate::receipt::tests::healthy();
    incomplete["nativeExportHealthy"] = json!(false);
    for (raw, problem) in [
        (crate::receipt::tests::healthy(), None),
        (incomplete, Some("field")),
        (json!({"outcome_code": "AGENT_RUN_TIMEOUT"}), Some("vetoed")),
        (Value::Null, Some("not_an_object")),
    ] {
        let routed = route_outcome(
            &episode(Outcome::Task(task("HARNESS_FAILED", None, raw.clone()))),
            &strict,
        );
        assert_eq!(
            value(&routed.metrics, "rollout/receipt_valid"),
            Some(f64::from(u8::from(problem.is_none())))
        );
        for kind in ["not_an_object", "vetoed", "field", "attribution"] {
            let want = f64::from(u8::from(problem == Some(kind)));
            assert_eq!(
                value(&routed.metrics, &format!("rollout/receipt_problem/{kind}")),
                Some(want),
                "{raw}"
            );
        }
        let audit = routed
            .audit_now()
            .cloned()
            .or_else(|| routed.after_export(true).audit)
            .expect("record");
        assert_eq!(audit.receipt_problem.is_some(), problem.is_some(), "{raw}");
    }
    // Other policies do not look at receipts.
    let routed = route_outcome(
        &episode(Outcome::Task(task("HARNESS_FAILED", None, Value::Null))),
        &rule(None, ""),
    );
    assert_eq!(value(&routed.metrics, "rollout/receipt_valid"), None);
}

/// `arena-2026.md` 2.7: with sample-level rejection a grader failure or an unattributed terminal harness
/// failure drops only its sample in training; a proxy system error, another reason, or evaluation still
/// fails the group.
#[test]
fn sample_level_rejection_drops_only_terminal_task_failures_in_training() {
    let on = rule(None, "").with_sample_level_rejection(true);
    let failed = |status: &str| Outcome::Task(task(status, None, json!({})));
    for (ep, sample_only) in [
        (episode(failed("EVAL_FAILED")), true),
        (episode(failed("HARNESS_FAILED")), true),
        (episode(failed("TIMEOUT")), false), // TIMEOUT with interactions is merged main's zero reward
        (
            Episode {
                interaction_count: 0,
                ..episode(failed("TIMEOUT"))
            },
            true,
        ),
        (
            Episode {
                interaction_count: 0,
                ..episode(failed("NO_OUTPUT"))
            },
            true,
        ),
        (episode(failed("SETUP_FAILED")), false),
        (
            Episode {
                proxy_system_error: true,
                ..episode(failed("EVAL_FAILED"))
            },
            false,
        ),
        (
            Episode {
                scope: Scope::EvalRollout,
                ..episode(failed("EVAL_FAILED"))
            },
            false,
        ),
    ] {
        let routed = route_outcome(&ep, &on);
        let what = format!("{:?} {:?}", ep.outcome, ep.scope);
        let flag = ep.scope.as_str().to_string() + "/sample_level_rejection";
        assert_eq!(
            value(&routed.metrics, &flag),
            Some(f64::from(u8::from(sample_only))),
            "{what}"
        );
        match routed.sample_result(true) {
            SampleResult::Dropped => assert!(sample_only, "{what}"),
            SampleResult::Rejected(_) => assert!(!sample_only, "{what}"),
            SampleResult::Reward(_) => assert!(!sample_only && routed.decision.reward().is_some(), "{what}"),
        }
    }
    // Off (the default) the same grader failure fails the group.
    let routed = route_outcome(&episode(failed("EVAL_FAILED")), &rule(None, ""));
    assert!(matches!(routed.sample_result(true), SampleResult::Rejected(_)));
    assert_eq!(value(&routed.metrics, "rollout/sample_level_rejection"), None);
}
