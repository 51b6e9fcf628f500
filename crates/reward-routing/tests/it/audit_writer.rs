//! The shared audit writer under concurrency, and refusal of a symlinked dump directory.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::symlink;
use std::sync::Arc;

use reward_routing::{
    AuditConfig, AuditRecord, AuditStats, AuditWriter, Outcome, RewardRule, TaskOutcome, TaskStatus,
};
use serde_json::json;

use crate::support::{episode, metric, row, run, shard_lines};

const THREADS: usize = 16;
const PER_THREAD: usize = 150;

fn record(thread: usize, seq: usize) -> AuditRecord {
    // Every tenth record carries up to ~200 KB of padding, so that some lines take several write calls.
    let padding_len = if seq.is_multiple_of(10) {
        (thread * 7919 + seq * 104_729) % 200_000
    } else {
        0
    };
    let padding = "p".repeat(padding_len);
    let task = TaskOutcome {
        raw: json!({"thread": thread, "seq": seq, "padding": padding, "text": "ünïcode\n\"quoted\""}),
        ..TaskOutcome::new(format!("task-{thread}-{seq}"), TaskStatus::Done, Some(0.5))
    };
    AuditRecord::from_task(&row(&format!("row-{seq}")), &task, Some(0.5))
}

fn hammer(config: AuditConfig) -> Vec<serde_json::Value> {
    let dir = config.dir.clone();
    let writer = AuditWriter::shared(config).expect("writer");
    std::thread::scope(|scope| {
        for thread in 0..THREADS {
            let writer = Arc::clone(&writer);
            scope.spawn(move || {
                for seq in 0..PER_THREAD {
                    assert!(writer.append(&record(thread, seq)), "{:?}", writer.last_error());
                }
            });
        }
    });
    assert_eq!(
        writer.stats(),
        AuditStats {
            written: (THREADS * PER_THREAD) as u64,
            failed: 0
        }
    );
    shard_lines(&dir)
}

fn check_whole_and_ordered(lines: &[serde_json::Value]) {
    assert_eq!(lines.len(), THREADS * PER_THREAD);
    let mut seen: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for line in lines {
        let thread = line["raw"]["thread"].as_u64().expect("thread");
        let seq = line["raw"]["seq"].as_u64().expect("seq");
        assert_eq!(line["task_id"], format!("task-{thread}-{seq}"));
        assert_eq!(line["raw"]["text"], "ünïcode\n\"quoted\"");
        seen.entry(thread).or_default().push(seq);
    }
    assert_eq!(seen.len(), THREADS);
    for (thread, seqs) in seen {
        // Each thread's records appear once each, in the order the thread wrote them.
        assert_eq!(
            seqs,
            (0..PER_THREAD as u64).collect::<Vec<_>>(),
            "thread {thread}"
        );
    }
}

#[test]
fn sixteen_threads_write_only_whole_json_lines() {
    let root = tempfile::tempdir().expect("tempdir");
    let lines = hammer(AuditConfig::new(root.path().join("arena_results")));
    check_whole_and_ordered(&lines);
    assert_eq!(
        fs::read_dir(root.path().join("arena_results"))
            .expect("dir")
            .count(),
        1
    );
}

#[test]
fn sixteen_threads_write_only_whole_json_lines_across_rotations() {
    let root = tempfile::tempdir().expect("tempdir");
    let dir = root.path().join("rotating");
    let limit = 512 * 1024;
    let lines = hammer(AuditConfig {
        rotate_bytes: Some(limit),
        ..AuditConfig::new(&dir)
    });
    check_whole_and_ordered(&lines);
    let shards: Vec<u64> = fs::read_dir(&dir)
        .expect("dir")
        .map(|e| e.expect("entry").metadata().expect("meta").len())
        .collect();
    assert!(shards.len() > 2, "{shards:?}");
    assert!(shards.iter().all(|len| *len <= limit), "{shards:?}");
}

#[test]
fn a_symlinked_dump_directory_is_refused_with_nothing_written_through_it() {
    let root = tempfile::tempdir().expect("tempdir");
    let real = root.path().join("real_results");
    fs::create_dir(&real).expect("real");
    let link = root.path().join("arena_results");
    symlink(&real, &link).expect("symlink");

    let writer = AuditWriter::shared(AuditConfig::new(&link)).expect("writer");
    let rejected = episode(
        "row-1",
        Outcome::Task(TaskOutcome::new("task-1", TaskStatus::SetupFailed, None)),
    );
    let (routed, metrics) = run(&rejected, &RewardRule::raw("astra"), &writer, false);
    assert!(routed.audit_now().is_some(), "a record was due");
    assert_eq!(metric(&metrics, "rollout/arena/result_dump_success"), Some(0.0));

    let trained = episode(
        "row-2",
        Outcome::Task(TaskOutcome::new("task-2", TaskStatus::Done, Some(1.0))),
    );
    let (routed, metrics) = run(&trained, &RewardRule::raw("astra"), &writer, true);
    assert_eq!(
        routed.decision.reward(),
        Some(1.0),
        "the rollout itself is unaffected"
    );
    assert_eq!(metric(&metrics, "rollout/arena/result_dump_success"), Some(0.0));

    assert_eq!(
        writer.stats(),
        AuditStats {
            written: 0,
            failed: 2
        }
    );
    assert_eq!(fs::read_dir(&real).expect("real").count(), 0);
    assert!(
        fs::symlink_metadata(&link)
            .expect("link")
            .file_type()
            .is_symlink()
    );
}
