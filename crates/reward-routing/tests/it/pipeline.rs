//! One training step's worth of groups, from episodes to advantages: routing, group assembly, the dynamic
//! filter, group metrics and training-time normalisation (reference section 7.4).

use reward_routing::{
    DynamicFilter, GroupRejection, NormConfig, Outcome, RewardConfig, RewardRule, RewardSettings, Scope,
    TaskOutcome, TaskStatus, TransformRegistry, assemble_group, group_metrics, route_outcome,
};

use crate::support::{episode, metric};

fn outcome(id: &str, status: TaskStatus, score: Option<f64>) -> Outcome {
    Outcome::Task(TaskOutcome::new(id, status, score))
}

#[test]
fn a_step_of_groups_becomes_advantages() {
    let rule = RewardRule::new(
        "astra",
        &RewardSettings {
            reward_threshold: Some(0.98),
            reward_transform_fn: "astra_partial_reward".into(),
        },
        &TransformRegistry::default(),
    )
    .expect("rule");
    let config = RewardConfig {
        drop_incomplete_group: false,
        reward_norm: Some(NormConfig {
            std_unbiased: false,
            eps: 0.0,
            ..NormConfig::group()
        }),
        ..RewardConfig::default()
    };
    config.validate().expect("valid");
    let filter = DynamicFilter::new();

    // Four prompts of two samples each.
    let prompts = [
        [
            outcome("a0", TaskStatus::Done, Some(1.0)),
            outcome("a1", TaskStatus::Done, Some(0.0)),
        ],
        [
            outcome("b0", TaskStatus::Done, Some(0.99)),
            outcome("b1", TaskStatus::Done, Some(1.0)),
        ],
        [
            outcome("c0", TaskStatus::Timeout, Some(0.0)),
            outcome("c1", TaskStatus::Done, Some(0.5)),
        ],
        [
            outcome("d0", TaskStatus::SetupFailed, None),
            outcome("d1", TaskStatus::Done, Some(1.0)),
        ],
    ];
    let mut batch = Vec::new();
    let mut rejections = Vec::new();
    let mut pass_at_k = Vec::new();
    for (p, samples) in prompts.into_iter().enumerate() {
        let routed: Vec<_> = samples
            .into_iter()
            .map(|o| route_outcome(&episode(&format!("row-{p}"), o), &rule))
            .collect();
        let rewards: Vec<Option<f64>> = routed.iter().map(|r| r.decision.reward()).collect();
        let metrics = group_metrics(
            Scope::Rollout,
            &episode("x", outcome("x", TaskStatus::Done, None)).row,
            &rule,
            &rewards,
            2,
        )
        .expect("group metrics");
        pass_at_k.push(metric(&metrics, "rollout/pass@k").expect("pass@k"));

        let results: Vec<_> = routed.iter().map(|r| r.sample_result(true)).collect();
        match assemble_group(&results, &config.group_settings()) {
            Ok(group) if filter.check(&group).expect("verdict").accept => batch.push(group),
            Ok(_) => rejections.push("filtered".to_string()),
            Err(rejection) => rejections.push(rejection.kind().to_string()),
        }
    }
    // Prompt b: both samples score >= 0.98 -> [1, 1], filtered as all-correct; prompt d: a system failure.
    assert_eq!(rejections, ["filtered", "sample_rejected"]);
    assert_eq!(pass_at_k, [1.0, 1.0, 0.0, 1.0]);
    let counters = filter.counters();
    assert_eq!((counters.accepted, counters.rejected_all_correct), (2, 1));

    let advantages = config.advantages(&batch).expect("advantages");
    // Prompt a: rewards [1, 0] -> [1, -1]. Prompt c: [0 (model failure), 0.05] -> [-1, 1].
    let flat: Vec<(f64, f64)> = advantages
        .iter()
        .flatten()
        .map(|a| (a.advantage, a.raw_reward))
        .collect();
    assert_eq!(flat.len(), 4);
    let expected = [(1.0, 1.0), (-1.0, 0.0), (-1.0, 0.0), (1.0, 0.05)];
    for ((adv, raw), (e_adv, e_raw)) in flat.iter().zip(expected) {
        assert!(
            (adv - e_adv).abs() < 1e-9 && (raw - e_raw).abs() < 1e-12,
            "{flat:?}"
        );
    }
}

#[test]
fn incomplete_groups_are_dropped_when_configured() {
    let config = RewardConfig {
        drop_incomplete_group: true,
        reward_normalization: true,
        ..RewardConfig::default()
    };
    let rule = RewardRule::raw("astra");
    let routed = [
        route_outcome(&episode("r", outcome("t0", TaskStatus::Done, Some(1.0))), &rule),
        route_outcome(&episode("r", outcome("t1", TaskStatus::Done, Some(0.0))), &rule),
    ];
    // The second session exported nothing.
    let results = [routed[0].sample_result(true), routed[1].sample_result(false)];
    assert_eq!(
        assemble_group(&results, &config.group_settings()),
        Err(GroupRejection::Incomplete { kept: 1, size: 2 })
    );
    let lenient = RewardConfig {
        drop_incomplete_group: false,
        ..config
    };
    let group = assemble_group(&results, &lenient.group_settings()).expect("group");
    assert_eq!(group.rewards(), [0.0], "a lone survivor carries no signal");
    assert_eq!(group.original_rewards(), [1.0]);
}
