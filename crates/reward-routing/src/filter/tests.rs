//! Tests of the dynamic filter (reference section 8.1 items 39-42).

use super::*;
use crate::group::{GroupSettings, SampleResult, assemble_group};

fn check(rewards: &[f64], accept: bool, all_correct: bool) {
    let verdict = FilterVerdict::of(rewards).expect("verdict");
    assert_eq!(verdict, FilterVerdict { accept, all_correct }, "{rewards:?}");
}

#[test]
fn all_equal_groups_are_rejected_and_mixed_ones_accepted() {
    check(&[0.0, 0.0], false, false);
    check(&[1.0, 1.0], false, true);
    check(&[0.1, 0.1], false, false);
    check(&[0.0, 1.0], true, false);
    check(&[0.1, 0.1, 0.2], true, false);
    check(&[0.5], false, false);
}

#[test]
fn uniform_partial_rewards_count_as_all_wrong() {
    let verdict = FilterVerdict::of(&[0.1, 0.1]).expect("verdict");
    assert!(verdict.rejected_all_wrong());
    assert!(!verdict.rejected_all_correct());
    let names: Vec<(String, f64)> = verdict
        .metrics(Scope::Rollout)
        .into_iter()
        .map(|m| (m.name, m.value))
        .collect();
    assert_eq!(
        names,
        [
            ("rollout/rejected_by_failed_or_perfect".to_string(), 1.0),
            ("rollout/rejected_by_all_correct".to_string(), 0.0),
            ("rollout/rejected_by_all_wrong".to_string(), 1.0),
        ]
    );
}

#[test]
fn all_correct_has_a_tolerance_of_one_thousandth() {
    check(&[0.999, 0.999], false, true);
    check(&[0.9989, 0.9989], false, false);
}

#[test]
fn the_filter_judges_original_rewards_not_normalised_ones() {
    let normalise = GroupSettings {
        drop_incomplete_group: false,
        reward_normalization: true,
        mean_only: false,
        min_usable_group_size: 0,
    };
    let filter = DynamicFilter::new();

    // Normalised, a perfect group becomes [0, 0]: judged on those it would count as all-wrong.
    let perfect = assemble_group(
        &[SampleResult::Reward(1.0), SampleResult::Reward(1.0)],
        &normalise,
    )
    .expect("group");
    assert_eq!(perfect.rewards(), [0.0, 0.0]);
    let verdict = filter.check(&perfect).expect("verdict");
    assert!(verdict.rejected_all_correct(), "{verdict:?}");

    let mixed = assemble_group(
        &[SampleResult::Reward(1.0), SampleResult::Reward(0.0)],
        &normalise,
    )
    .expect("group");
    assert!(filter.check(&mixed).expect("verdict").accept);
    filter.check_rewards(&[0.0, 0.0]).expect("verdict");

    let counters = filter.counters();
    assert_eq!(
        counters,
        FilterCounters {
            accepted: 1,
            rejected_all_correct: 1,
            rejected_all_wrong: 1
        }
    );
    assert_eq!(counters.rejected(), 2);
}

#[test]
fn empty_or_non_finite_rewards_are_errors() {
    assert_eq!(
        FilterVerdict::of(&[]).expect_err("empty").to_string(),
        "dynamic filtering requires at least one reward"
    );
    assert_eq!(
        FilterVerdict::of(&[0.0, f64::NAN]).expect_err("nan").to_string(),
        "dynamic filtering rewards must be finite"
    );
    let filter = DynamicFilter::new();
    assert!(filter.check_rewards(&[f64::INFINITY]).is_err());
    assert_eq!(filter.counters(), FilterCounters::default());
}

#[test]
fn counters_add_up_across_threads() {
    let filter = DynamicFilter::new();
    std::thread::scope(|scope| {
        for _ in 0..8 {
            scope.spawn(|| {
                for _ in 0..100 {
                    filter.check_rewards(&[0.0, 1.0]).expect("verdict");
                    filter.check_rewards(&[1.0, 1.0]).expect("verdict");
                }
            });
        }
    });
    let counters = filter.counters();
    assert_eq!((counters.accepted, counters.rejected_all_correct), (800, 800));
}
