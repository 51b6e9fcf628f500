//! The leftover plan: each combination of {Arena dedupes, Arena cancels} over a killed run's journal.

use super::*;
use crate::journal::{Journal, RolloutRecord, Verdict};

fn key(eval: bool, sample: u32) -> SampleKey {
    SampleKey {
        eval,
        step: 3,
        group: 1,
        sample,
    }
}

/// A journal as a killed process leaves it: three answered launches whose tasks are open (a training
/// sample still to run, an evaluation sample, a training sample whose rollout finished) and one whose
/// task is done.
fn replay() -> JournalState {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j/journal.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    let launched = |k: SampleKey, task: &str| {
        journal
            .append(&Entry::Launch {
                key: k,
                idempotency_key: Some(format!("run-{k}")),
            })
            .unwrap();
        journal
            .append(&Entry::Task {
                key: k,
                task_id: task.into(),
            })
            .unwrap();
    };
    launched(key(false, 0), "t-open");
    launched(key(true, 0), "t-eval");
    launched(key(false, 1), "t-finished");
    launched(key(false, 2), "t-done");
    journal
        .append(&Entry::TaskDone {
            task_id: "t-done".into(),
        })
        .unwrap();
    journal
        .append(&Entry::Rollout(Box::new(RolloutRecord {
            key: key(false, 1),
            stream: "s".into(),
            data_id: "d".into(),
            task_type: "max".into(),
            task_id: None,
            verdict: Verdict::Dropped { reason: "x".into() },
            trajectories: Vec::new(),
            policy_version: 0,
            routing: None,
        })))
        .unwrap();
    drop(journal);
    Journal::open(&path).unwrap().1
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_string()).collect()
}

#[test]
fn each_combination_of_dedupe_and_cancel_has_its_plan() {
    let replay = replay();
    assert_eq!(replay.open_tasks, set(&["t-eval", "t-finished", "t-open"]));
    for idempotent in [false, true] {
        let plan = plan_leftovers(&replay, idempotent, true);
        assert_eq!(
            plan.cancel, replay.open_tasks,
            "Arena cancels: every open task is cancelled"
        );
        assert!(plan.collect.is_empty() && plan.abandon.is_empty(), "{plan:?}");
    }
    let plan = plan_leftovers(&replay, true, false);
    assert!(plan.cancel.is_empty());
    assert_eq!(
        plan.collect,
        BTreeMap::from([(key(false, 0), format!("run-{}", key(false, 0)))]),
        "Arena dedupes: the sample still to run is relaunched under the key that started its task"
    );
    assert_eq!(
        plan.abandon,
        set(&["t-eval", "t-finished"]),
        "samples that never launch again cannot collect their tasks"
    );
    let plan = plan_leftovers(&replay, false, false);
    assert!(plan.cancel.is_empty() && plan.collect.is_empty());
    assert_eq!(
        plan.abandon, replay.open_tasks,
        "Arena can do neither: all are left running"
    );
}
