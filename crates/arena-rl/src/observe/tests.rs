//! The metrics sink: per-row records reach `metrics.jsonl` but not TensorBoard, whose tags stay the same
//! however many rows a run sees.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write as _;

use reward_routing::Metric;

use super::*;

/// Runs `steps` steps over `rows` distinct rows (each step sees every row once, as the reference's
/// `route_outcome` reports them), and answers the TensorBoard tags and the JSONL keys written.
fn run(rows: usize, steps: u64) -> (BTreeSet<String>, BTreeSet<String>) {
    let dir = tempfile::tempdir().unwrap();
    let mut sink = MetricsSink::open(dir.path(), true, true, None).unwrap();
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

/// A run killed after writing steps 0-4 (and half a line of step 5) and resumed at step 3 writes steps 3 and 4
/// again: each step then appears once in `metrics.jsonl` and once per tag across the TensorBoard files.
#[test]
fn a_resumed_run_writes_each_step_once() {
    let dir = tempfile::tempdir().unwrap();
    let step_metrics = |step: u64, version: f64| {
        let mut m = StepMetrics::default();
        m.set("rollout/reward", step as f64 / 10.0);
        m.set("policy/version", version);
        m
    };
    {
        let mut sink = MetricsSink::open(dir.path(), true, true, Some(0)).unwrap();
        for step in 0..5 {
            sink.write_step(step, &step_metrics(step, 1.0)).unwrap();
        }
        // A kill mid-write: a torn JSONL line and a torn event record.
        let tb = sink.tensorboard_path().unwrap().to_path_buf();
        let mut f = OpenOptions::new()
            .append(true)
            .open(dir.path().join("metrics.jsonl"))
            .unwrap();
        f.write_all(b"{\"step\": 5, \"rollout/rew").unwrap();
        let mut f = OpenOptions::new().append(true).open(&tb).unwrap();
        f.write_all(&[7, 0, 0]).unwrap();
    }
    // The same second as the first process: the new event file must not replace the old one.
    let mut sink = MetricsSink::open(dir.path(), true, true, Some(3)).unwrap();
    assert_eq!(
        sink.rewards(),
        &[(0, 0.0), (1, 0.1), (2, 0.2)],
        "the curve keeps steps before 3"
    );
    for step in 3..6 {
        sink.write_step(step, &step_metrics(step, 2.0)).unwrap();
    }
    let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    let steps: Vec<(u64, f64)> = text
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (v["step"].as_u64().unwrap(), v["policy/version"].as_f64().unwrap())
        })
        .collect();
    assert_eq!(
        steps,
        [(0, 1.0), (1, 1.0), (2, 1.0), (3, 2.0), (4, 2.0), (5, 2.0)],
        "{text}"
    );
    let mut seen: BTreeMap<(String, i64), f32> = BTreeMap::new();
    let mut files = 0;
    for file in std::fs::read_dir(dir.path().join("tensorboard")).unwrap() {
        files += 1;
        for event in tfevents::read_events(&file.unwrap().path()).unwrap() {
            for (tag, value) in event.scalars {
                let step = event.step;
                assert!(
                    seen.insert((tag.clone(), step), value).is_none(),
                    "{tag} at step {step} twice"
                );
            }
        }
    }
    assert_eq!(
        files, 2,
        "the first process's events are kept beside the second's"
    );
    assert_eq!(seen.len(), 12, "{seen:?}");
    assert_eq!(seen[&("policy/version".to_string(), 2)], 1.0);
    assert_eq!(seen[&("policy/version".to_string(), 3)], 2.0);
    // A run that resumes nothing keeps everything.
    drop(sink);
    MetricsSink::open(dir.path(), true, true, None).unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap(),
        text
    );
}
