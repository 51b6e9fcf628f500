//! Which rollouts offer their reward to every chain of their export (`arena-2026.md` 3.5 tests 3 and 4).

use reward_routing::{Decision, RejectReason, TaskStatus};
use rollout_proxy::ExportStyle::{Concat, Individual};

use super::episode_reward_for_export;

#[test]
fn only_a_successful_tasks_reward_is_offered_and_only_when_asked_for_a_concat_export() {
    assert_eq!(
        episode_reward_for_export(true, Concat, &Decision::Train(0.5275)),
        Some(0.5275)
    );
    assert_eq!(
        episode_reward_for_export(true, Concat, &Decision::Train(0.0)),
        Some(0.0),
        "a success scored 0 is a score"
    );
    // test_arena_non_success_does_not_fill_missing_scores[HARNESS_FAILED|EVAL_FAILED|RUNNING]: a model
    // failure's zero and the rejections are never offered.
    for decision in [
        Decision::ZeroReward,
        Decision::Reject(RejectReason::SystemFailure {
            status: TaskStatus::EvalFailed,
        }),
        Decision::Reject(RejectReason::UnknownFailure {
            status: TaskStatus::HarnessFailed,
        }),
        Decision::Reject(RejectReason::SystemFailure {
            status: TaskStatus::Other("RUNNING".into()),
        }),
    ] {
        assert_eq!(
            episode_reward_for_export(true, Concat, &decision),
            None,
            "{decision:?}"
        );
    }
    // test_arena_individual_export_retains_turn_rewards, and the default.
    assert_eq!(
        episode_reward_for_export(true, Individual, &Decision::Train(1.0)),
        None
    );
    assert_eq!(
        episode_reward_for_export(false, Concat, &Decision::Train(1.0)),
        None
    );
}
