//! Tests of training-time normalisation and the reward pipeline (reference section 7.4).

use proptest::prelude::*;

use super::*;
use crate::group::{GroupSettings, SampleResult, assemble_group};

fn norm(mean: Option<NormLevel>, std: Option<NormLevel>) -> NormConfig {
    NormConfig {
        mean_level: mean,
        std_level: std,
        ..NormConfig::default()
    }
}

fn check(config: &NormConfig, x: &[f64], sizes: Option<&[usize]>, expected: &[f64]) {
    let got = config.normalize(x, sizes).expect("normalises");
    assert_eq!(got.len(), expected.len());
    for (g, e) in got.iter().zip(expected) {
        assert!(
            (g - e).abs() < 1e-9,
            "{config:?} on {x:?}: got {got:?}, expected {expected:?}"
        );
    }
}

fn group(values: &[f64]) -> Group {
    let samples: Vec<SampleResult> = values.iter().map(|v| SampleResult::Reward(*v)).collect();
    assemble_group(&samples, &GroupSettings::default()).expect("group")
}

#[test]
fn the_seven_four_examples_hold_at_training_time() {
    let population = NormConfig {
        std_unbiased: false,
        eps: 0.0,
        ..NormConfig::group()
    };
    check(&population, &[1.0, 0.0], Some(&[2]), &[1.0, -1.0]);
    check(
        &NormConfig::group(),
        &[0.3, 0.3, 0.3],
        Some(&[3]),
        &[0.0, 0.0, 0.0],
    );
    // Unbiased std of [1, 0] is sqrt(1/2).
    let s = 0.5f64.sqrt();
    check(
        &NormConfig::group(),
        &[1.0, 0.0],
        Some(&[2]),
        &[0.5 / (s + 1e-5), -0.5 / (s + 1e-5)],
    );
}

#[test]
fn singleton_groups_normalise_to_zero() {
    check(&NormConfig::group(), &[0.8], Some(&[1]), &[0.0]);
    let leave_one_out = NormConfig {
        mean_leave1out: true,
        ..NormConfig::group()
    };
    check(
        &leave_one_out,
        &[0.8, 1.0, 0.0],
        Some(&[1, 2]),
        &[0.0, 1.0 / (2f64.sqrt() + 1e-5), -1.0 / (2f64.sqrt() + 1e-5)],
    );
}

#[test]
fn leave_one_out_centres_each_value_on_the_others() {
    let config = NormConfig {
        mean_leave1out: true,
        std_level: None,
        ..NormConfig::group()
    };
    // Means of the others: 0, 0.5, 0.5.
    check(&config, &[1.0, 0.0, 1.0], Some(&[3]), &[0.5, -1.0, 0.5]);
    let batch = NormConfig {
        mean_leave1out: true,
        ..norm(Some(NormLevel::Batch), None)
    };
    // A batch of one has no other value: its mean is 0.
    check(&batch, &[0.8], None, &[0.8]);
}

#[test]
fn levels_pick_where_mean_and_std_are_taken() {
    let x = [1.0, 0.0, 3.0, 1.0];
    let sizes: &[usize] = &[2, 2];
    // Centring only: no std, no eps.
    check(
        &norm(Some(NormLevel::Group), None),
        &x,
        Some(sizes),
        &[0.5, -0.5, 1.0, -1.0],
    );
    check(
        &norm(Some(NormLevel::Batch), None),
        &x,
        Some(sizes),
        &[-0.25, -1.25, 1.75, -0.25],
    );
    // Scaling only: batch std around zero mean, unbiased: sqrt(11 / 3).
    let s = (11.0f64 / 3.0).sqrt() + 1e-5;
    check(
        &norm(None, Some(NormLevel::Batch)),
        &x,
        None,
        &[1.0 / s, 0.0, 3.0 / s, 1.0 / s],
    );
    check(&norm(None, None), &x, None, &x);
}

#[test]
fn fixed_group_size_is_used_when_real_sizes_are_unknown() {
    let config = NormConfig {
        group_size: 2,
        ..norm(Some(NormLevel::Group), None)
    };
    check(&config, &[1.0, 0.0, 3.0, 1.0], None, &[0.5, -0.5, 1.0, -1.0]);
    let error = config.normalize(&[1.0, 0.0, 3.0], None).expect_err("tail");
    assert_eq!(
        error.to_string(),
        "batch size 3 is not a multiple of reward_norm.group_size 2"
    );
}

#[test]
fn bad_inputs_are_errors_naming_the_problem() {
    let config = NormConfig::group();
    type Case<'a> = (&'a [f64], Option<&'a [usize]>, &'a str);
    let cases: [Case<'_>; 3] = [
        (
            &[1.0, 0.0],
            Some(&[1, 2]),
            "group sizes [1, 2] add up to 3, not to the batch size 2",
        ),
        (
            &[1.0, 0.0],
            Some(&[0, 2]),
            "group sizes must all be positive, got [0, 2]",
        ),
        (
            &[1.0, f64::NAN],
            Some(&[2]),
            "cannot normalise a non-finite value NaN",
        ),
    ];
    for (x, sizes, message) in cases {
        assert_eq!(
            config.normalize(x, sizes).expect_err(message).to_string(),
            message
        );
    }
    let bad_eps = NormConfig {
        eps: -1.0,
        ..NormConfig::group()
    };
    assert!(bad_eps.normalize(&[1.0], Some(&[1])).is_err());
}

#[test]
fn both_normalisations_at_once_are_a_config_error() {
    let config = RewardConfig {
        reward_normalization: true,
        reward_norm: Some(NormConfig::group()),
        ..RewardConfig::default()
    };
    let error = config.validate().expect_err("both");
    assert_eq!(
        error.to_string(),
        "gconfig.reward_normalization and actor.reward_norm cannot both be enabled: rewards would be \
         normalised twice"
    );
    assert!(config.advantages(&[group(&[1.0, 0.0])]).is_err());
}

#[test]
fn every_config_problem_is_reported_at_once() {
    let config = RewardConfig {
        drop_incomplete_group: true,
        reward_normalization: true,
        reward_bias: f64::NAN,
        reward_scaling: f64::INFINITY,
        reward_clip: 0.0,
        reward_norm: Some(NormConfig {
            eps: f64::NAN,
            group_size: 0,
            ..NormConfig::group()
        }),
    };
    insta::assert_snapshot!(config.validate().expect_err("invalid").to_string());
    RewardConfig::default().validate().expect("defaults are valid");
}

#[test]
fn the_pipeline_biases_scales_and_clips_before_normalising() {
    let config = RewardConfig {
        reward_bias: -0.5,
        reward_scaling: 4.0,
        reward_clip: 1.5,
        ..RewardConfig::default()
    };
    assert_eq!(config.shape(1.0), 1.5);
    assert_eq!(config.shape(0.0), -1.5);
    assert_eq!(config.shape(0.6), 0.3999999999999999);

    let batch = [group(&[1.0, 0.0]), group(&[0.6])];
    let advantages = config.advantages(&batch).expect("advantages");
    let flat: Vec<(usize, f64, f64)> = advantages
        .iter()
        .flatten()
        .map(|a| (a.index, a.advantage, a.raw_reward))
        .collect();
    assert_eq!(
        flat,
        [(0, 1.5, 1.0), (1, -1.5, 0.0), (0, 0.3999999999999999, 0.6)]
    );
}

#[test]
fn advantages_use_real_group_sizes_and_keep_raw_rewards() {
    let config = RewardConfig {
        reward_norm: Some(NormConfig::group()),
        ..RewardConfig::default()
    };
    let batch = [group(&[1.0, 0.0, 1.0]), group(&[0.5]), group(&[0.0, 1.0])];
    let advantages = config.advantages(&batch).expect("advantages");
    let sizes: Vec<usize> = advantages.iter().map(Vec::len).collect();
    assert_eq!(sizes, [3, 1, 2]);
    assert_eq!(advantages[1][0].advantage, 0.0, "a singleton group has no signal");
    assert_eq!(advantages[0][1].raw_reward, 0.0);
    assert!(advantages[0][0].advantage > 0.0 && advantages[0][1].advantage < 0.0);
    let group_sum: f64 = advantages[2].iter().map(|a| a.advantage).sum();
    assert!(group_sum.abs() < 1e-12);
}

#[test]
fn rollout_normalised_groups_keep_raw_rewards_through_the_pipeline() {
    let settings = GroupSettings {
        drop_incomplete_group: true,
        reward_normalization: true,
        mean_only: false,
        min_usable_group_size: 0,
    };
    let normalised =
        assemble_group(&[SampleResult::Reward(1.0), SampleResult::Reward(0.0)], &settings).expect("group");
    let config = RewardConfig {
        reward_normalization: true,
        reward_clip: 5.0,
        ..RewardConfig::default()
    };
    let advantages = config.advantages(&[normalised]).expect("advantages");
    let pairs: Vec<(f64, f64)> = advantages[0]
        .iter()
        .map(|a| (a.advantage, a.raw_reward))
        .collect();
    assert!(
        (pairs[0].0 - 1.0).abs() < 1e-7 && (pairs[1].0 + 1.0).abs() < 1e-7,
        "{pairs:?}"
    );
    assert_eq!((pairs[0].1, pairs[1].1), (1.0, 0.0));
}

#[test]
fn norm_config_deserialises_with_reference_names() {
    let config: NormConfig = serde_json::from_value(serde_json::json!({
        "mean_level": "group",
        "std_level": null,
        "group_size": 4
    }))
    .expect("config");
    assert_eq!(config.mean_level, Some(NormLevel::Group));
    assert_eq!(config.std_level, None);
    assert!(config.std_unbiased && !config.mean_leave1out);
    assert_eq!((config.eps, config.group_size), (1e-5, 4));
}

proptest! {
    #[test]
    fn group_normalised_rewards_have_mean_zero_and_unit_std(
        groups in prop::collection::vec(prop::collection::vec(-5.0f64..5.0, 1..10), 1..6),
        unbiased in any::<bool>(),
    ) {
        let config = NormConfig { std_unbiased: unbiased, ..NormConfig::group() };
        let sizes: Vec<usize> = groups.iter().map(Vec::len).collect();
        let flat: Vec<f64> = groups.iter().flatten().copied().collect();
        let out = config.normalize(&flat, Some(&sizes)).expect("normalises");
        let mut start = 0;
        for values in &groups {
            let n = values.len();
            let slice = &out[start..start + n];
            start += n;
            let mean = slice.iter().sum::<f64>() / n as f64;
            prop_assert!(mean.abs() < 1e-9, "mean {mean} of {slice:?}");
            if n < 2 {
                continue;
            }
            let denominator = if unbiased { n - 1 } else { n } as f64;
            let raw_mean = values.iter().sum::<f64>() / n as f64;
            let raw_std = (values.iter().map(|v| (v - raw_mean).powi(2)).sum::<f64>() / denominator).sqrt();
            let std = (slice.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / denominator).sqrt();
            // Exactly std / (std + eps): unit std up to eps, zero where the group's values are equal.
            prop_assert!((std - raw_std / (raw_std + config.eps)).abs() < 1e-9, "std {std}");
            if raw_std > 0.1 {
                prop_assert!((std - 1.0).abs() < 1e-3, "std {std}");
            }
        }
    }

    #[test]
    fn batch_normalised_rewards_have_mean_zero(values in prop::collection::vec(-5.0f64..5.0, 2..32)) {
        let out = NormConfig::default().normalize(&values, None).expect("normalises");
        let mean = out.iter().sum::<f64>() / out.len() as f64;
        prop_assert!(mean.abs() < 1e-9);
    }
}
