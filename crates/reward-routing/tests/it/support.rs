//! What the rollout workflow will do with a [`Routed`], in the order of the reference's proxy workflow.

use std::fs;
use std::path::Path;

use reward_routing::{
    AuditWriter, Episode, Metric, Outcome, RewardRef, RewardRule, Routed, RowMeta, Scope, route_outcome,
};
use serde_json::Value;

/// A row of the stream `astra` with a pinned grader.
pub(crate) fn row(data_id: &str) -> RowMeta {
    RowMeta {
        data_id: data_id.into(),
        stream_name: "astra".into(),
        stream_id: "stream-astra".into(),
        task_type: "swe".into(),
        expected_reward_ref: RewardRef {
            key: "astra-grader".into(),
            version: "7".into(),
        },
    }
}

/// An episode with three interactions and no proxy flags.
pub(crate) fn episode(data_id: &str, outcome: Outcome) -> Episode {
    Episode {
        row: row(data_id),
        outcome,
        interaction_count: 3,
        context_overflow: false,
        proxy_system_error: false,
        integrity_hits: Default::default(),
        scope: Scope::Rollout,
        session_id: Some("sess-1".into()),
    }
}

/// Routes an episode, writes its audit record when the workflow would (rejections right away, trained rollouts
/// after their export), and returns the routing and every metric recorded.
pub(crate) fn run(
    episode: &Episode,
    rule: &RewardRule,
    writer: &AuditWriter,
    exported: bool,
) -> (Routed, Vec<Metric>) {
    let routed = route_outcome(episode, rule);
    let mut metrics = routed.metrics.clone();
    if let Some(record) = routed.audit_now() {
        metrics.push(writer.append_with_metric(record, episode.scope));
    } else {
        let after = routed.after_export(exported);
        metrics.extend(after.metrics);
        if let Some(record) = after.audit {
            metrics.push(writer.append_with_metric(&record, episode.scope));
        }
    }
    (routed, metrics)
}

/// The value of the one metric called `name`, if recorded.
pub(crate) fn metric(metrics: &[Metric], name: &str) -> Option<f64> {
    let found: Vec<f64> = metrics
        .iter()
        .filter(|m| m.name == name)
        .map(|m| m.value)
        .collect();
    assert!(found.len() <= 1, "{name} recorded {} times", found.len());
    found.first().copied()
}

/// Every line of every shard in `dir`, parsed; panics on a line that is not whole JSON.
pub(crate) fn shard_lines(dir: &Path) -> Vec<Value> {
    let mut paths: Vec<_> = fs::read_dir(dir)
        .expect("dump dir")
        .map(|entry| entry.expect("entry").path())
        .collect();
    paths.sort_by_key(|p| shard_index(p));
    let mut lines = Vec::new();
    for path in paths {
        let text = fs::read_to_string(&path).expect("shard");
        assert!(
            text.is_empty() || text.ends_with('\n'),
            "{} ends mid-line",
            path.display()
        );
        for line in text.lines() {
            lines.push(
                serde_json::from_str(line).unwrap_or_else(|e| {
                    panic!("{}: not a whole JSON line ({e}): {line:.80}", path.display())
                }),
            );
        }
    }
    lines
}

/// The rotation index in a shard name (`..._<pid>.jsonl` is 0, `..._<pid>.<n>.jsonl` is n).
fn shard_index(path: &Path) -> u64 {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let stem = name.strip_suffix(".jsonl").unwrap_or(name);
    match stem.rsplit_once('.') {
        Some((_, index)) => index.parse().unwrap_or(0),
        None => 0,
    }
}
