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
