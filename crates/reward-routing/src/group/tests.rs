//! Tests of group post-processing at rollout time (reference section 7.4).

use proptest::prelude::*;
use stream_config::TaskStatus;

use super::*;

const NORMALISE: GroupSettings = GroupSettings {
    drop_incomplete_group: false,
    reward_normalization: true,
    mean_only: false,
    min_usable_group_size: 0,
};

fn rewards(values: &[f64]) -> Vec<SampleResult> {
    values.iter().map(|v| SampleResult::Reward(*v)).collect()
}

fn assert_close(got: &[f64], expected: &[f64], tolerance: f64) {
    assert_eq!(got.len(), expected.len(), "{got:?} vs {expected:?}");
    for (g, e) in got.iter().zip(expected) {
        assert!((g - e).abs() <= tolerance, "{got:?} vs {expected:?}");
    }
}

#[test]
fn one_and_zero_normalise_to_one_and_minus_one() {
    let group = assemble_group(&rewards(&[1.0, 0.0]), &NORMALISE).expect("group");
    assert_close(&group.rewards(), &[1.0, -1.0], 1e-7);
    assert_eq!(group.original_rewards(), [1.0, 0.0]);
}

#[test]
fn equal_rewards_normalise_to_zero() {
    for value in [0.0, 0.1, 1.0] {
        let group = assemble_group(&rewards(&[value; 4]), &NORMALISE).expect("group");
        assert_eq!(group.rewards(), [0.0; 4]);
        assert_eq!(group.original_rewards(), [value; 4]);
    }
}

#[test]
fn singleton_groups_are_left_alone_and_a_lone_survivor_normalises_to_zero() {
    let single = assemble_group(&rewards(&[0.7]), &NORMALISE).expect("group");
    assert_eq!(single.rewards(), [0.7]);
    assert_eq!(single.size(), 1);

    let survivor =
        assemble_group(&[SampleResult::Dropped, SampleResult::Reward(0.7)], &NORMALISE).expect("group");
    assert_eq!(survivor.rewards(), [0.0]);
    assert_eq!(survivor.original_rewards(), [0.7]);
    assert_eq!(survivor.samples()[0].index, 1);
    assert_eq!((survivor.len(), survivor.size()), (1, 2));
}

#[test]
fn without_normalisation_rewards_pass_through() {
    let group = assemble_group(&rewards(&[0.2, 0.9]), &GroupSettings::default()).expect("group");
    assert_eq!(group.rewards(), [0.2, 0.9]);
    assert_eq!(group.rewards(), group.original_rewards());
}

#[test]
fn dropped_samples_are_left_out_or_reject_an_incomplete_group() {
    let samples = [
        SampleResult::Reward(1.0),
        SampleResult::Dropped,
        SampleResult::Reward(0.0),
    ];
    let group = assemble_group(&samples, &GroupSettings::default()).expect("group");
    let indices: Vec<usize> = group.samples().iter().map(|s| s.index).collect();
    assert_eq!(indices, [0, 2]);

    let strict = GroupSettings {
        drop_incomplete_group: true,
        reward_normalization: false,
        mean_only: false,
        min_usable_group_size: 0,
    };
    assert_eq!(
        assemble_group(&samples, &strict),
        Err(GroupRejection::Incomplete { kept: 2, size: 3 })
    );
    assert_eq!(
        assemble_group(
            &[SampleResult::Dropped, SampleResult::Dropped],
            &GroupSettings::default()
        ),
        Err(GroupRejection::AllDropped)
    );
}

#[test]
fn one_rejected_sample_rejects_the_group() {
    let reason = RejectReason::SystemFailure {
        status: TaskStatus::SetupFailed,
    };
    let samples = [
        SampleResult::Reward(1.0),
        SampleResult::Rejected(reason.clone()),
        SampleResult::Dropped,
    ];
    let rejection = assemble_group(&samples, &NORMALISE).expect_err("rejected");
    assert_eq!(rejection, GroupRejection::SampleRejected { index: 1, reason });
    assert_eq!(rejection.kind(), "sample_rejected");
    assert_eq!(
        rejection.to_string(),
        "sample 1 was rejected: arena system failure SETUP_FAILED"
    );
}

#[test]
fn non_finite_rewards_reject_the_group() {
    let rejection = assemble_group(&rewards(&[0.5, f64::NAN]), &NORMALISE).expect_err("non-finite");
    assert_eq!(rejection.kind(), "invalid_reward");
}

proptest! {
    #[test]
    fn rollout_normalised_groups_have_mean_zero_and_unit_population_std(
        values in prop::collection::vec(-10.0f64..10.0, 2..16)
    ) {
        let normalised = normalize_rollout(&values);
        let n = values.len() as f64;
        let mean = normalised.iter().sum::<f64>() / n;
        prop_assert!(mean.abs() < 1e-9, "mean {mean}");

        let raw_mean = values.iter().sum::<f64>() / n;
        let raw_std = (values.iter().map(|v| (v - raw_mean).powi(2)).sum::<f64>() / n).sqrt();
        let std = (normalised.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n).sqrt();
        // Exactly std / (std + 1e-8): one where the rewards differ, zero where they are equal.
        prop_assert!((std - raw_std / (raw_std + ROLLOUT_NORM_EPS)).abs() < 1e-9, "std {std}");
        if raw_std > 1e-3 {
            prop_assert!((std - 1.0).abs() < 1e-4, "std {std}");
        }
    }

    #[test]
    fn assembling_keeps_original_rewards_and_order(
        values in prop::collection::vec(prop::option::of(0.0f64..1.0), 1..12)
    ) {
        let samples: Vec<SampleResult> = values
            .iter()
            .map(|v| v.map_or(SampleResult::Dropped, SampleResult::Reward))
            .collect();
        match assemble_group(&samples, &NORMALISE) {
            Ok(group) => {
                let kept: Vec<f64> = values.iter().flatten().copied().collect();
                prop_assert_eq!(group.original_rewards(), kept);
                prop_assert!(group.samples().windows(2).all(|w| w[0].index < w[1].index));
            }
            Err(rejection) => {
                prop_assert_eq!(rejection, GroupRejection::AllDropped);
                prop_assert!(values.iter().all(Option::is_none));
            }
        }
    }
}

/// `arena-2026.md` 2.9: mean-only groups subtract the mean and never divide ({0.5275, 1.0} -> each minus
/// 0.76375); constant non-binary rewards centre to 0.
#[test]
fn mean_only_groups_subtract_the_mean_alone() {
    let mean_only = GroupSettings {
        mean_only: true,
        ..NORMALISE
    };
    let group = assemble_group(
        &[SampleResult::Reward(0.5275), SampleResult::Reward(1.0)],
        &mean_only,
    )
    .expect("a group");
    let rewards: Vec<f64> = group.samples().iter().map(|s| s.reward).collect();
    assert!((rewards[0] - (0.5275 - 0.76375)).abs() < 1e-12, "{rewards:?}");
    assert!((rewards[1] - (1.0 - 0.76375)).abs() < 1e-12, "{rewards:?}");
    assert_eq!(group.samples()[0].original_reward, 0.5275);
    let flat = assemble_group(
        &[SampleResult::Reward(0.1), SampleResult::Reward(0.1)],
        &mean_only,
    )
    .expect("a group");
    assert!(flat.samples().iter().all(|s| s.reward.abs() < 1e-15));
    // With the std the same pair is z-scored instead.
    let z = assemble_group(
        &[SampleResult::Reward(0.5275), SampleResult::Reward(1.0)],
        &NORMALISE,
    )
    .expect("a group");
    assert!((z.samples()[0].reward + 1.0).abs() < 1e-6);
}

/// `arena-2026.md` 2.7 and 2.9: dropped samples leave a group usable down to `min_usable_group_size`.
#[test]
fn a_group_needs_its_minimum_of_usable_samples() {
    let samples = [
        SampleResult::Reward(1.0),
        SampleResult::Dropped,
        SampleResult::Reward(0.0),
    ];
    for (min, usable) in [(0, true), (1, true), (2, true), (3, false)] {
        let settings = GroupSettings {
            min_usable_group_size: min,
            ..NORMALISE
        };
        match assemble_group(&samples, &settings) {
            Ok(group) => assert!(usable && group.len() == 2, "min {min}"),
            Err(e) => {
                assert!(!usable, "min {min}: {e}");
                assert_eq!(e, GroupRejection::TooFewUsable { kept: 2, min: 3 });
                assert_eq!(e.kind(), "too_few_usable");
            }
        }
    }
}
