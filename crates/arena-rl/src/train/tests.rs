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
