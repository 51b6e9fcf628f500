//! The metrics sink: per-row records reach `metrics.jsonl` but not TensorBoard, whose tags stay the same
//! however many rows a run sees.

use std::collections::BTreeSet;

use reward_routing::Metric;

use super::*;

/// Runs `steps` steps over `rows` distinct rows (each step sees every row once, as the reference's
/// `route_outcome` reports them), and answers the TensorBoard tags and the JSONL keys written.
fn run(rows: usize, steps: u64) -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = MetricsSink::open(dir.path(), true, true).unwrap();
    for step in 0..steps {
        let mut metrics = StepMetrics::default();
        for row in 0..rows {
            let score = (row % 3) as f64 / 2.0;
            metrics.extend(&[
                Metric::new("rollout/reward", score),
                Metric::new("rollout/max/raw_reward", score),
                Metric::new("rollout/stream/sim-chat/arena_score", score),
                Metric::debug(format_args!("task/row-{row}/raw_reward"), score),
            ]);
        }
        metrics.set("policy/version", step as f64);
        sink.write_step(step, &metrics).unwrap();
    }
    let events = tfevents::read_events(sink.tensorboard_path().unwrap()).unwrap();
    let tags = events
        .iter()
        .flat_map(|e| e.scalars.iter().map(|(t, _)| t.clone()))
        .collect();
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let keys = text
        .lines()
        .flat_map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v.as_object().unwrap().keys().cloned().collect::<Vec<_>>()
        })
        .collect();
    (tags, keys)
}

#[test]
fn tensorboard_tags_do_not_grow_with_the_rows_but_the_jsonl_keeps_every_row() {
    let (few_tags, few_keys) = run(3, 2);
    let (many_tags, many_keys) = run(2000, 2);
    let want: BTreeSet<String> = [
        "policy/version",
        "rollout/max/raw_reward",
        "rollout/reward",
        "rollout/stream/sim-chat/arena_score",
    ]
    .map(String::from)
    .into();
    assert_eq!(few_tags, want);
    assert_eq!(many_tags, want, "2000 rows, the same tags as 3");
    let per_row = |keys: &BTreeSet<String>| keys.iter().filter(|k| k.starts_with("debug/task/")).count();
    assert_eq!(per_row(&few_keys), 3);
    assert_eq!(per_row(&many_keys), 2000);
    assert!(many_keys.contains("debug/task/row-1999/raw_reward"));
    assert!(many_keys.is_superset(&many_tags));
}

#[test]
fn only_the_debug_task_records_are_per_row() {
    for (name, want) in [
        ("debug/task/row-1/raw_reward", true),
        ("debug/task/", true),
        ("debug/other", false),
        ("rollout/task/row-1/raw_reward", false),
        ("debugx/task/row-1", false),
        ("rollout/reward", false),
    ] {
        assert_eq!(per_row(name), want, "{name}");
    }
}
