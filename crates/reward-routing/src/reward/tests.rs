//! Tests of reward extraction (reference section 8.1 items 35, 43; 8.2 items 3, 34).

use std::sync::{Arc, Mutex};

use serde_json::json;
use stream_config::TaskStatus;

use super::*;
use crate::error::TransformError;

fn row() -> RowMeta {
    RowMeta {
        data_id: "row-7".into(),
        stream_name: "swe".into(),
        stream_id: "stream-swe".into(),
        task_type: "swe".into(),
        ..RowMeta::default()
    }
}

fn rule(threshold: Option<f64>, transform: &str) -> RewardRule {
    crate::test_support::rule("swe", threshold, transform)
}

fn check(rule: &RewardRule, cases: &[(f64, f64)]) {
    for &(score, expected) in cases {
        let got = rule.reward(score, &row()).expect("reward");
        assert!(
            (got - expected).abs() < 1e-12,
            "score {score}: got {got}, expected {expected}"
        );
    }
}

#[test]
fn a_threshold_alone_binarises() {
    check(
        &rule(Some(0.98), ""),
        &[(0.98, 1.0), (0.9799, 0.0), (1.0, 1.0), (0.0, 0.0)],
    );
}

#[test]
fn no_threshold_and_no_transform_keeps_raw_scores() {
    check(&rule(None, ""), &[(0.2, 0.2), (0.75, 0.75), (0.98, 0.98)]);
    check(&RewardRule::raw("swe"), &[(0.2, 0.2), (0.75, 0.75), (0.98, 0.98)]);
}

#[test]
fn a_transform_gets_the_threshold_only_when_configured() {
    check(
        &rule(None, "astra_partial_reward"),
        &[(0.9799, 0.09799), (0.98, 1.0)],
    );
    check(
        &rule(Some(0.9), "astra_partial_reward"),
        &[(0.8999, 0.08999), (0.9, 1.0)],
    );
}

#[test]
fn a_custom_transform_receives_score_row_and_threshold() {
    type Call = (f64, String, Option<f64>);
    let seen: Arc<Mutex<Vec<Call>>> = Arc::default();
    let log = Arc::clone(&seen);
    let mut registry = TransformRegistry::with_builtins();
    registry
        .register(
            "tests.test_swe_arena.custom_transform",
            move |score: f64, row: &RowMeta, threshold: Option<f64>| -> Result<f64, TransformError> {
                log.lock()
                    .expect("log")
                    .push((score, row.data_id.clone(), threshold));
                Ok(0.42)
            },
        )
        .expect("register");
    let settings = RewardSettings {
        reward_threshold: Some(0.98),
        reward_transform_fn: "tests.test_swe_arena.custom_transform".into(),
    };
    let rule = RewardRule::new("swe", &settings, &registry).expect("resolves");
    assert_eq!(rule.reward(0.5, &row()).expect("reward"), 0.42);
    assert_eq!(
        *seen.lock().expect("log"),
        [(0.5, "row-7".to_string(), Some(0.98))]
    );
    assert_eq!(
        rule.transform_name(),
        Some("tests.test_swe_arena.custom_transform")
    );
}

#[test]
fn non_finite_transform_outputs_are_errors() {
    let rule = crate::test_support::nan_rule("swe");
    let error = rule.reward(0.5, &row()).expect_err("NaN");
    assert_eq!(
        error.to_string(),
        "stream \"swe\": reward transform \"nan\" returned a non-finite value: NaN"
    );
}

#[test]
fn transform_refusals_name_stream_transform_and_score() {
    let error = rule(None, "astra_partial_reward")
        .reward(1.01, &row())
        .expect_err("out of range");
    assert_eq!(
        error.to_string(),
        "stream \"swe\": reward transform \"astra_partial_reward\" failed on score 1.01: Astra reward must be \
         finite and within [0, 1], got 1.01"
    );
}

#[test]
fn only_the_top_level_score_is_a_reward_input() {
    let rule = rule(None, "");
    let mut outcome = TaskOutcome::new("task-1", TaskStatus::Done, None);
    outcome.raw = json!({"score": 1.0, "reward": 1.0, "result": {"score": 1.0}});
    let error = rule.reward_of(&outcome, &row()).expect_err("no top-level score");
    assert_eq!(
        error.to_string(),
        "task \"task-1\" of stream \"swe\": terminal response is missing top-level 'score'"
    );

    outcome.score = Some(f64::INFINITY);
    assert!(matches!(
        rule.reward_of(&outcome, &row()),
        Err(Error::NonFiniteScore { .. })
    ));
    outcome.score = Some(0.25);
    assert_eq!(rule.reward_of(&outcome, &row()).expect("score"), 0.25);
}

#[test]
fn settings_are_checked_when_the_rule_is_built() {
    let registry = TransformRegistry::with_builtins();
    let bad_threshold = RewardSettings {
        reward_threshold: Some(f64::NAN),
        reward_transform_fn: String::new(),
    };
    assert!(matches!(
        RewardRule::new("swe", &bad_threshold, &registry),
        Err(Error::InvalidThreshold { .. })
    ));
    let unknown = RewardSettings {
        reward_threshold: None,
        reward_transform_fn: "examples.swe.reward_transforms.missing".into(),
    };
    assert!(matches!(
        RewardRule::new("swe", &unknown, &registry),
        Err(Error::UnknownTransform { .. })
    ));
}

#[test]
fn solved_means_positive_unless_a_transform_has_a_threshold() {
    let cases: [(RewardRule, &[(f64, bool)]); 4] = [
        (rule(None, ""), &[(0.0, false), (0.01, true), (1.0, true)]),
        (rule(Some(2.0), ""), &[(1.0, true), (0.0, false)]),
        (
            rule(Some(0.98), "astra_partial_reward"),
            &[(0.05, false), (0.09799, false), (0.98, true), (1.0, true)],
        ),
        (rule(None, "identity_reward"), &[(0.0, false), (0.09, true)]),
    ];
    for (rule, expectations) in cases {
        for &(reward, solved) in expectations {
            assert_eq!(rule.is_solved(reward), solved, "{rule:?} reward {reward}");
        }
    }
}

#[test]
fn settings_deserialize_strictly() {
    let settings: RewardSettings =
        serde_json::from_value(json!({"reward_threshold": 0.9})).expect("partial settings");
    assert_eq!(settings.reward_threshold, Some(0.9));
    assert!(settings.reward_transform_fn.is_empty());
    let error =
        serde_json::from_value::<RewardSettings>(json!({"threshold": 0.9})).expect_err("unknown field");
    assert!(error.to_string().contains("unknown field `threshold`"), "{error}");
}
