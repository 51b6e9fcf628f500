//! Tests of metric names and group metrics (reference section 8.1 items 45-50, 52, 53).

use super::*;

fn row(task_type: &str) -> RowMeta {
    RowMeta {
        data_id: "d1".into(),
        stream_name: "astra".into(),
        stream_id: "s1".into(),
        task_type: task_type.into(),
        ..RowMeta::default()
    }
}

fn rule(threshold: Option<f64>, transform: &str) -> RewardRule {
    crate::test_support::rule("astra", threshold, transform)
}

fn value(metrics: &[Metric], name: &str) -> f64 {
    let found: Vec<_> = metrics.iter().filter(|m| m.name == name).collect();
    assert_eq!(found.len(), 1, "{name} in {metrics:?}");
    found[0].value
}

fn pass(rule: &RewardRule, rewards: &[Option<f64>]) -> f64 {
    let metrics =
        group_metrics(Scope::Rollout, &row("swe"), rule, rewards, rewards.len()).expect("group metrics");
    let global = value(&metrics, "rollout/pass@k");
    assert_eq!(value(&metrics, "rollout/swe/pass@k"), global);
    assert_eq!(value(&metrics, "rollout/stream/astra/pass@k"), global);
    global
}

#[test]
fn pass_at_k_is_one_when_any_reward_is_positive() {
    let raw = rule(None, "");
    assert_eq!(pass(&raw, &[Some(0.0), None, Some(0.3)]), 1.0);
    assert_eq!(pass(&raw, &[None, Some(1.0)]), 1.0);
    assert_eq!(pass(&raw, &[Some(0.0), Some(0.0), None]), 0.0);
    assert_eq!(pass(&raw, &[None, None]), 0.0);
}

#[test]
fn partial_credit_is_not_a_pass_under_a_transform_with_threshold() {
    let astra = rule(Some(0.98), "astra_partial_reward");
    assert_eq!(pass(&astra, &[Some(0.05), Some(0.09)]), 0.0);
    assert_eq!(pass(&astra, &[Some(0.09799), Some(1.0)]), 1.0);
    let metrics = group_metrics(
        Scope::Rollout,
        &row("swe"),
        &astra,
        &[Some(1.0), Some(0.09799)],
        2,
    )
    .expect("metrics");
    assert_eq!(value(&metrics, "rollout/group_pass_1"), 1.0);
    assert_eq!(value(&metrics, "rollout/group_pass_0"), 0.0);
    assert_eq!(value(&metrics, "rollout/group_pass_2"), 0.0);
}

#[test]
fn threshold_only_passes_are_judged_on_the_binary_output() {
    assert_eq!(pass(&rule(Some(2.0), ""), &[Some(1.0), Some(0.0)]), 1.0);
    assert_eq!(pass(&rule(Some(0.0), ""), &[Some(0.0), Some(0.0)]), 0.0);
}

#[test]
fn eval_rollouts_use_the_eval_scope() {
    let metrics =
        group_metrics(Scope::EvalRollout, &row("math"), &rule(None, ""), &[Some(1.0)], 1).expect("metrics");
    assert!(
        metrics.iter().all(|m| m.name.starts_with("eval-rollout/")),
        "{metrics:?}"
    );
    assert_eq!(value(&metrics, "eval-rollout/math/pass@k"), 1.0);
    assert_eq!(value(&metrics, "eval-rollout/group_pass_1"), 1.0);
}

#[test]
fn invalid_task_types_aggregate_under_unknown() {
    for task_type in ["", "   ", "\t"] {
        let metrics = group_metrics(Scope::Rollout, &row(task_type), &rule(None, ""), &[Some(1.0)], 1)
            .expect("metrics");
        assert_eq!(value(&metrics, "rollout/unknown/pass@k"), 1.0);
    }
    let metrics =
        group_metrics(Scope::Rollout, &row(" swe "), &rule(None, ""), &[Some(1.0)], 1).expect("metrics");
    assert_eq!(value(&metrics, "rollout/swe/pass@k"), 1.0);
}

#[test]
fn group_pass_is_one_hot_over_solved_counts() {
    let groups: [&[Option<f64>]; 4] = [
        &[Some(0.0), Some(0.0), Some(0.0), Some(0.0)],
        &[Some(1.0), None, Some(0.0), Some(0.0)],
        &[Some(1.0), Some(0.5), None, Some(0.0)],
        &[Some(1.0), Some(1.0), Some(1.0), Some(1.0)],
    ];
    let mut sums = [0.0; 5];
    for rewards in groups {
        let metrics =
            group_metrics(Scope::Rollout, &row("swe"), &rule(None, ""), rewards, 4).expect("metrics");
        let one_hot: Vec<f64> = (0..=4)
            .map(|c| value(&metrics, &format!("rollout/group_pass_{c}")))
            .collect();
        assert_eq!(one_hot.iter().sum::<f64>(), 1.0, "{one_hot:?}");
        for (sum, v) in sums.iter_mut().zip(one_hot) {
            *sum += v;
        }
    }
    let means: Vec<f64> = sums.iter().map(|s| s / 4.0).collect();
    assert_eq!(means, [0.25, 0.25, 0.25, 0.0, 0.25]);
}

#[test]
fn the_reward_count_must_match_the_group_size() {
    let error =
        group_metrics(Scope::Rollout, &row("swe"), &rule(None, ""), &[Some(1.0)], 2).expect_err("mismatch");
    assert_eq!(error.to_string(), "expected 2 Arena rewards for pass@k, got 1");
}

#[test]
fn lifecycle_names_are_the_reference_ones() {
    let names: Vec<&str> = Lifecycle::ALL.iter().map(|l| l.name()).collect();
    insta::assert_yaml_snapshot!(names);
    let metric = Lifecycle::CallSuccess.metric(Scope::EvalRollout, true);
    assert_eq!(metric, Metric::new("eval-rollout/arena/call_success", 1.0));
    assert_eq!(
        Metric::debug("task/x/raw_reward", 0.5).name,
        "debug/task/x/raw_reward"
    );
}

#[test]
fn json_task_types_that_are_not_non_blank_strings_are_unknown() {
    use serde_json::json;

    use crate::outcome::task_type_from_json;

    let cases = [
        (None, "unknown"),
        (Some(json!(null)), "unknown"),
        (Some(json!("")), "unknown"),
        (Some(json!("   ")), "unknown"),
        (Some(json!(1)), "unknown"),
        (Some(json!(["swe"])), "unknown"),
        (Some(json!(" swe ")), "swe"),
    ];
    for (json, expected) in cases {
        let task_type = task_type_from_json(json.as_ref());
        assert_eq!(task_type, expected, "{json:?}");
        let metrics = group_metrics(Scope::Rollout, &row(&task_type), &rule(None, ""), &[Some(0.0)], 1)
            .expect("metrics");
        assert_eq!(value(&metrics, &format!("rollout/{expected}/pass@k")), 0.0);
    }
}

/// `arena-2026.md` 2.8: `all_correct`, `all_wrong` and the one-hot `group_pass_count_<c>_ratio`, each also per
/// domain and per stream, with `domain/<type>/pass@k`.
#[test]
fn all_correct_all_wrong_and_pass_count_ratios_are_written_three_times() {
    let raw = rule(None, "");
    for (rewards, solved) in [
        (vec![Some(1.0), Some(1.0), Some(1.0)], 3),
        (vec![Some(0.0), None, Some(0.0)], 0),
        (vec![Some(1.0), None, Some(0.0)], 1),
    ] {
        let metrics = group_metrics(Scope::Rollout, &row("swe"), &raw, &rewards, 3).expect("metrics");
        for prefix in ["", "domain/swe/", "stream/astra/"] {
            let v = |name: &str| value(&metrics, &format!("rollout/{prefix}{name}"));
            assert_eq!(
                v("all_correct"),
                f64::from(u8::from(solved == 3)),
                "{prefix} {rewards:?}"
            );
            assert_eq!(
                v("all_wrong"),
                f64::from(u8::from(solved == 0)),
                "{prefix} {rewards:?}"
            );
            assert_eq!(
                v("pass@k"),
                f64::from(u8::from(solved > 0)),
                "{prefix} {rewards:?}"
            );
            for c in 0..=3 {
                let want = f64::from(u8::from(c == solved));
                assert_eq!(v(&format!("group_pass_count_{c}_ratio")), want, "{prefix} {c}");
            }
        }
    }
}
