//! How a rollout whose session branched weighs in a batch.

use reward_routing::{GroupSettings, SampleResult, assemble_group};
use rollout_proxy::ExportedTrajectory;
use serde_json::json;

use super::*;
use crate::journal::Verdict;

fn trajectory(i: usize) -> ExportedTrajectory {
    serde_json::from_value(json!({
        "session_id": "s", "interaction_id": format!("i{i}"), "interaction_ids": [format!("i{i}")],
        "token_ids": [1, 2, 3], "loss_mask": [0, 1, 1], "logprobs": [0.0, -0.5, -0.5],
        "versions": [-1, 0, 0], "prompt_len": 1, "reward": 1.0, "original_reward": 1.0,
        "finish_reason": "stop", "metadata": {},
    }))
    .expect("a trajectory")
}

fn record(sample: u32, reward: f64, branches: usize) -> RolloutRecord {
    RolloutRecord {
        key: SampleKey {
            eval: false,
            step: 0,
            group: 0,
            sample,
        },
        stream: "s".into(),
        data_id: "d".into(),
        task_type: "max".into(),
        task_id: Some(format!("t{sample}")),
        verdict: Verdict::Reward { reward },
        trajectories: (0..branches).map(trajectory).collect(),
        policy_version: 0,
        routing: None,
    }
}

#[test]
fn a_branched_rollout_weighs_as_one_unless_each_branch_is_asked_for() {
    let records = [record(0, 1.0, 3), record(1, 0.5, 1)];
    let group = assemble_group(
        &[SampleResult::Reward(1.0), SampleResult::Reward(0.5)],
        &GroupSettings::default(),
    )
    .expect("a group");
    let weight = |branches: BranchWeight| {
        let batch = build_batch(
            &RewardConfig::default(),
            branches,
            &[(group.clone(), &records[..])],
        )
        .expect("a batch");
        assert_eq!(batch.group_sizes, [4]);
        let of = |sample: u32| -> f64 {
            batch
                .samples
                .iter()
                .filter(|s| s.key.sample == sample)
                .map(|s| s.advantage)
                .sum()
        };
        (of(0), of(1))
    };
    let (branched, single) = weight(BranchWeight::Split);
    assert!(
        (branched - 1.0).abs() < 1e-12 && (single - 0.5).abs() < 1e-12,
        "{branched} {single}"
    );
    assert_eq!(
        weight(BranchWeight::Each),
        (3.0, 0.5),
        "the reference's: one advantage per branch"
    );
}

/// The FSDP2 engine's batch file carries the advantages and aggregation weights the burn engine computes,
/// by the same `trainer` functions, and every token's temperature.
#[test]
fn the_fsdp2_batch_carries_the_trainers_own_advantages_and_weights() {
    let mut config = trainer::TrainConfig {
        aggregation: trainer::LossAggregation::SeqMeanTokenMean,
        ..trainer::TrainConfig::default()
    };
    config.ppo.adv_norm = Some(trainer::AdvNorm::default());
    config.ppo.temperature = 0.7;
    let seq = |n: usize, trained: usize, advantage: f32, temps: bool| trainer::TrainSequence {
        tokens: (1..=n as u32).collect(),
        loss_mask: (0..n).map(|t| t >= n - trained).collect(),
        logprobs: vec![-0.5; n],
        versions: vec![0; n],
        advantage,
        truncated: Vec::new(),
        temperatures: if temps { vec![1.0; n] } else { Vec::new() },
    };
    let rl = trainer::RlBatch {
        sequences: vec![
            seq(5, 2, 1.0, true),
            seq(8, 5, -0.5, false),
            seq(3, 1, 0.25, true),
        ],
        group_sizes: vec![2, 1],
        policy_version: 3,
    };
    let batch = Fsdp2Engine::grpo_batch(&config, &rl, 7).expect("a batch");
    let adv = trainer::normalized_advantages(&rl, config.ppo.adv_norm.as_ref()).unwrap();
    let weights = trainer::token_weights(&[2, 5, 1], config.aggregation);
    assert_eq!(
        (batch.step, batch.policy_version, batch.group_sizes.clone()),
        (7, 3, vec![2, 1])
    );
    for (i, s) in batch.sequences.iter().enumerate() {
        assert_eq!(s.advantage, adv[i] as f32);
        assert_eq!(s.weight, weights[i]);
        assert_eq!(s.tokens, rl.sequences[i].tokens);
    }
    assert_ne!(adv[0], 1.0, "normalised");
    assert_eq!(
        batch.sequences[1].temperatures,
        vec![0.7; 8],
        "no temperatures: gconfig's"
    );
    assert_eq!(batch.sequences[1].truncated, vec![false; 8]);
    batch.to_bytes().expect("a valid file");
}

/// The worker's statistics give the same metric records as the burn engine's.
#[test]
fn fsdp2_statistics_become_the_trainers_step_stats() {
    let stats: fsdp2_trainer::Stats = serde_json::from_value(json!({
        "loss": 0.5, "lr": 1e-3, "grad_norm": 2.0, "sequences": 3, "tokens": 8, "forward_tokens": 16,
        "micro_batches": 2, "entropy": 1.5, "clip_fraction": 0.25, "dual_clip_fraction": 0.0,
        "approx_kl": 0.01, "ref_kl": null, "importance_weight": {"min": 0.9, "mean": 1.0, "max": 1.1},
        "behave_imp_weight": null, "behave_dropped_fraction": 0.0, "advantage": {"min": -1.0, "mean": 0.0, "max": 1.0},
        "staleness": {"min": 0.0, "mean": 0.5, "max": 1.0}, "behave_logprob_drift": null,
        "behave_logprob_drift_truncated": null, "seconds": 0.2
    }))
    .unwrap();
    let got = step_stats(4, &stats);
    let want = trainer::StepStats {
        step: 4,
        loss: 0.5,
        lr: 1e-3,
        grad_norm: 2.0,
        sequences: 3,
        tokens: 8,
        forward_tokens: 16,
        micro_batches: 2,
        entropy: 1.5,
        clip_fraction: 0.25,
        approx_kl: 0.01,
        importance_weight: Some(trainer::train::Range {
            min: 0.9,
            mean: 1.0,
            max: 1.1,
        }),
        advantage: Some(trainer::train::Range {
            min: -1.0,
            mean: 0.0,
            max: 1.0,
        }),
        staleness: Some(trainer::train::Range {
            min: 0.0,
            mean: 0.5,
            max: 1.0,
        }),
        seconds: 0.2,
        ..trainer::StepStats::default()
    };
    assert_eq!(got, want);
    assert_eq!(got.records("train/"), want.records("train/"));
}
