//! Journal: replay, torn tails, corruption.

use std::io::Write as _;

use super::*;

fn key(step: u64, group: u32, sample: u32) -> SampleKey {
    SampleKey {
        eval: false,
        step,
        group,
        sample,
    }
}

fn record(k: SampleKey, reward: f64) -> Entry {
    Entry::Rollout(Box::new(RolloutRecord {
        key: k,
        stream: "s".into(),
        data_id: "d".into(),
        task_type: "max".into(),
        task_id: Some("t".into()),
        verdict: Verdict::Reward { reward },
        trajectories: Vec::new(),
        policy_version: 0,
        routing: None,
    }))
}

#[test]
fn replay_tracks_open_routes_tasks_and_first_rollouts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j/journal.jsonl");
    let (journal, state) = Journal::open(&path).unwrap();
    assert!(state.rollouts.is_empty());
    for entry in [
        Entry::Route { name: "r1".into() },
        Entry::Route { name: "r2".into() },
        Entry::RouteDeleted { name: "r1".into() },
        Entry::Task {
            key: key(0, 0, 0),
            task_id: "t1".into(),
        },
        Entry::Task {
            key: key(0, 0, 1),
            task_id: "t2".into(),
        },
        Entry::TaskDone { task_id: "t2".into() },
        record(key(0, 0, 0), 0.5),
        record(key(0, 0, 0), 0.9),
        Entry::Step { step: 0, version: 1 },
    ] {
        journal.append(&entry).unwrap();
    }
    drop(journal);
    let (_, state) = Journal::open(&path).unwrap();
    assert_eq!(state.open_routes.iter().collect::<Vec<_>>(), ["r2"]);
    assert_eq!(state.open_tasks.iter().collect::<Vec<_>>(), ["t1"]);
    assert_eq!(state.rollouts.len(), 1);
    assert_eq!(
        state.rollouts[&key(0, 0, 0)].verdict,
        Verdict::Reward { reward: 0.5 }
    );
    assert_eq!(state.last_step, Some(0));
}

#[test]
fn a_torn_last_line_is_cut_and_appending_continues() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    journal.append(&Entry::Route { name: "r".into() }).unwrap();
    drop(journal);
    let whole = std::fs::metadata(&path).unwrap().len();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"type\":\"route_del")
        .unwrap();
    let (journal, state) = Journal::open(&path).unwrap();
    assert_eq!(state.torn_lines, 1);
    assert_eq!(std::fs::metadata(&path).unwrap().len(), whole);
    journal.append(&Entry::RouteDeleted { name: "r".into() }).unwrap();
    drop(journal);
    let (_, state) = Journal::open(&path).unwrap();
    assert!(state.open_routes.is_empty());
    assert_eq!(state.torn_lines, 0);
}

#[test]
fn a_corrupt_complete_line_refuses_to_resume() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    std::fs::write(&path, "{\"type\":\"route\",\"name\":\"r\"}\nnot json\n").unwrap();
    let err = Journal::open(&path).unwrap_err().to_string();
    assert!(err.contains("is corrupt at byte 28"), "{err}");
}

#[test]
fn sample_keys_print_compactly() {
    assert_eq!(key(3, 1, 2).to_string(), "s3g1:2");
    let eval = SampleKey {
        eval: true,
        ..key(4, 0, 0)
    };
    assert_eq!(eval.to_string(), "e4g0:0");
}

#[test]
fn the_journal_is_private_and_never_opened_through_a_symlink() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal/journal-w0.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    journal.append(&record(key(0, 0, 0), 1.0)).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&path), 0o600);
    assert_eq!(mode(path.parent().unwrap()), 0o700);
    // A symlink in place of the file, or of its directory, is refused with the path named.
    let target = dir.path().join("elsewhere.jsonl");
    std::fs::write(&target, "").unwrap();
    let linked = dir.path().join("journal/linked.jsonl");
    std::os::unix::fs::symlink(&target, &linked).unwrap();
    let err = Journal::open(&linked).unwrap_err().to_string();
    assert!(err.contains("symlink") && err.contains("linked.jsonl"), "{err}");
    std::os::unix::fs::symlink(dir.path().join("journal"), dir.path().join("via")).unwrap();
    let err = Journal::open(&dir.path().join("via/journal-w0.jsonl"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("symlink") && err.contains("via"), "{err}");
    // Reopening the real one still replays it.
    let (_, state) = Journal::open(&path).unwrap();
    assert_eq!(state.rollouts.len(), 1);
}

fn draw(step: u64, group: u32) -> Entry {
    Entry::Draw {
        step,
        group,
        stream: "s".into(),
        data_id: format!("d{step}-{group}"),
    }
}

/// A journal of four steps with a route, an open task, a launch in flight and a relaunched sample.
fn four_steps(journal: &Journal) {
    let launch = |k: SampleKey, idem: &str| Entry::Launch {
        key: k,
        idempotency_key: Some(idem.into()),
    };
    journal
        .append_all(&[
            Entry::Route { name: "r".into() },
            launch(key(2, 0, 0), "k-s2g0:0"),
            Entry::Task {
                key: key(2, 0, 0),
                task_id: "t-cancelled".into(),
            },
            Entry::TaskDone {
                task_id: "t-cancelled".into(),
            },
            launch(key(2, 0, 0), "k-s2g0:0-r1"),
            Entry::Task {
                key: key(2, 0, 0),
                task_id: "t-open".into(),
            },
            launch(key(3, 0, 1), "k-s3g0:1"),
        ])
        .unwrap();
    for step in 0..4 {
        journal.append(&draw(step, 2)).unwrap();
        journal.append(&record(key(step, 0, 2), step as f64)).unwrap();
        journal
            .append(&Entry::Step {
                step,
                version: step + 1,
            })
            .unwrap();
    }
}

#[test]
fn a_new_segment_carries_what_resuming_needs_and_the_old_ones_retire() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("j/journal-w0.jsonl");
    let (journal, before) = Journal::open(&path).unwrap();
    four_steps(&journal);
    let (_, full) = Journal::open(&path).unwrap();
    assert_eq!(journal.rotate(2).unwrap(), 1);
    assert_eq!(journal.position().unwrap().0, 1);
    journal.append(&record(key(4, 0, 0), 4.0)).unwrap();
    // Killed before the checkpoint that retires segment 0: both segments replay, to the same state.
    let (_, both) = Journal::open(&path).unwrap();
    assert_eq!(both.rollouts.len(), full.rollouts.len() + 1);
    assert_eq!(journal.retire_before(1, false).unwrap(), 1);
    assert!(!path.exists(), "segment 0 is deleted");
    let (journal, after) = Journal::open(&path).unwrap();
    assert_eq!(after.nonce, before.nonce);
    assert_eq!(after.open_routes, full.open_routes);
    assert_eq!(after.open_tasks.iter().collect::<Vec<_>>(), ["t-open"]);
    assert_eq!(
        after.task_launches["t-open"],
        (key(2, 0, 0), Some("k-s2g0:0-r1".to_string())),
        "an open task keeps the key that started it"
    );
    assert_eq!(
        after.answered_launches[&key(2, 0, 0)],
        2,
        "the count behind fresh keys survives"
    );
    assert_eq!(
        after.launches_in_flight.iter().collect::<Vec<_>>(),
        [&key(3, 0, 1)]
    );
    assert_eq!(
        after.rollouts.keys().map(|k| k.step).collect::<Vec<_>>(),
        [2, 3, 4],
        "the rollouts of the checkpoint's steps on, and the new one"
    );
    assert_eq!(
        after.rollouts[&key(3, 0, 2)],
        full.rollouts[&key(3, 0, 2)],
        "carried bit for bit"
    );
    assert_eq!(after.draws.keys().collect::<Vec<_>>(), [&(2, 2), &(3, 2)]);
    assert_eq!(after.last_step, Some(3));
    // A second rotation with both segments present carries each rollout once.
    assert_eq!(journal.rotate(3).unwrap(), 2);
    let carried = std::fs::read_to_string(dir.path().join("j/journal-w0.000002.jsonl")).unwrap();
    assert_eq!(carried.matches(r#""type":"carried""#).count(), 3, "{carried}");
    assert_eq!(journal.retire_before(2, true).unwrap(), 1);
    assert!(
        dir.path().join("j/retired/journal-w0.000001.jsonl").is_file(),
        "kept aside when asked"
    );
    let (_, last) = Journal::open(&path).unwrap();
    assert_eq!(last.rollouts.keys().map(|k| k.step).collect::<Vec<_>>(), [3, 4]);
}

#[test]
fn a_sealed_segment_with_a_torn_line_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal-w0.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    journal.rotate(0).unwrap();
    drop(journal);
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap()
        .write_all(b"{\"type\":\"rou")
        .unwrap();
    let err = Journal::open(&path).unwrap_err().to_string();
    assert!(
        err.contains("journal-w0.jsonl") && err.contains("sealed segment"),
        "{err}"
    );
}

#[test]
fn entries_appended_together_share_one_write_and_a_kill_keeps_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    let start = journal.position().unwrap().1;
    journal.append_all(&[draw(0, 2), draw(0, 3), draw(0, 4)]).unwrap();
    journal.append_all(&[]).unwrap();
    let end = journal.position().unwrap().1;
    drop(journal);
    // A kill inside that one write leaves its first lines and a torn one.
    let text = std::fs::read(&path).unwrap();
    let third = text[..end as usize - 1]
        .iter()
        .rposition(|b| *b == b'\n')
        .unwrap()
        + 1;
    assert!(third as u64 > start);
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(third as u64 + 5)
        .unwrap();
    let (_, state) = Journal::open(&path).unwrap();
    assert_eq!(state.torn_lines, 1);
    assert_eq!(state.draws.keys().collect::<Vec<_>>(), [&(0, 2), &(0, 3)]);
}

fn audit(k: SampleKey, stem: &str, offset: u64) -> Entry {
    Entry::Audit(Box::new(AuditEntry {
        key: k,
        at: reward_routing::AuditPosition {
            dir: PathBuf::from("/audit"),
            stem: stem.into(),
            index: 0,
            offset,
        },
        task_id: "t".into(),
        line: "{\"task_id\":\"t\"}\n".into(),
    }))
}

#[test]
fn audit_records_are_carried_with_every_position_and_replayed_from_the_earliest() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("journal.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    journal
        .append_all(&[audit(key(0, 0, 0), "a", 40), record(key(0, 0, 0), 1.0)])
        .unwrap();
    journal
        .append_all(&[audit(key(1, 0, 0), "a", 90), record(key(1, 0, 0), 1.0)])
        .unwrap();
    // A resumed run appended step 1's record again elsewhere, and journaled where.
    journal.append(&audit(key(1, 0, 0), "b", 0)).unwrap();
    journal.rotate(1).unwrap();
    journal.retire_before(1, false).unwrap();
    drop(journal);
    let (_, state) = Journal::open(&path).unwrap();
    assert_eq!(state.audits.keys().copied().collect::<Vec<_>>(), [key(1, 0, 0)]);
    let from: Vec<_> = state
        .audit_from
        .iter()
        .map(|((_, s), at)| (s.as_str(), *at))
        .collect();
    assert_eq!(
        from,
        [("a", (0, 90)), ("b", (0, 0))],
        "both positions of step 1's record, none of step 0's"
    );
}
