//! Publishing, listing, pruning and the leftovers of interrupted writers (the killed-process case runs as a
//! real SIGKILL in the integration tests).

use super::*;

fn fill(dir: &Path, text: &str) -> Result<()> {
    std::fs::write(dir.join("payload.txt"), text).map_err(|e| Error::io("writing", dir, e))
}

fn names(root: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn saves_list_newest_and_prune_to_keep_last() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = Checkpoints::for_run(tmp.path(), "exp", "trial");
    assert_eq!(ckpts.root(), tmp.path().join("exp/trial/checkpoints"));
    assert_eq!(
        ckpts.latest().unwrap(),
        None,
        "a missing root holds no checkpoint"
    );
    for step in [1u64, 2, 10, 3] {
        let c = ckpts
            .save(step, format!("cursor {step}").as_bytes(), 2, |d| {
                fill(d, &step.to_string())
            })
            .unwrap();
        assert_eq!(c.dir, ckpts.root().join(format!("step-{step}")));
    }
    // Steps order numerically (10 after 3), and only the two newest survive.
    let steps: Vec<u64> = ckpts.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, vec![3, 10]);
    let latest = ckpts.latest().unwrap().unwrap();
    assert_eq!(latest.step, 10);
    assert_eq!(latest.caller_state().unwrap(), b"cursor 10");
    assert_eq!(
        std::fs::read_to_string(latest.dir.join("payload.txt")).unwrap(),
        "10"
    );
    assert_eq!(names(ckpts.root()), ["step-10", "step-3"]);
}

#[test]
fn resaving_a_step_replaces_it_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = Checkpoints::new(tmp.path());
    ckpts.save(4, b"old", 0, |d| fill(d, "old")).unwrap();
    ckpts
        .save(4, b"new", 0, |d| {
            std::fs::write(d.join("other.txt"), "x").map_err(|e| Error::io("writing", d, e))
        })
        .unwrap();
    let c = ckpts.latest().unwrap().unwrap();
    assert_eq!(c.caller_state().unwrap(), b"new");
    assert!(
        !c.dir.join("payload.txt").exists(),
        "nothing of the old checkpoint remains"
    );
    assert_eq!(names(tmp.path()), ["step-4"]);
}

#[test]
fn unfinished_and_foreign_folders_are_never_picked_up() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = Checkpoints::new(tmp.path());
    ckpts.save(1, b"one", 0, |d| fill(d, "1")).unwrap();
    // What a writer killed before its rename leaves: a full temporary directory.
    let staged = ckpts.begin(2).unwrap();
    fill(staged.dir(), "2").unwrap();
    std::fs::write(staged.dir().join(CALLER_STATE_FILE), b"two").unwrap();
    std::fs::write(
        staged.dir().join(MARKER_FILE),
        br#"{"format":1,"step":2,"caller_state_bytes":3}"#,
    )
    .unwrap();
    std::mem::forget(staged);
    // A folder named like a checkpoint without a marker, one with a marker for another step, and a stray file.
    std::fs::create_dir_all(tmp.path().join("step-7")).unwrap();
    std::fs::create_dir_all(tmp.path().join("step-8")).unwrap();
    std::fs::write(
        tmp.path().join("step-8").join(MARKER_FILE),
        br#"{"format":1,"step":3,"caller_state_bytes":0}"#,
    )
    .unwrap();
    std::fs::write(tmp.path().join("step-9"), b"a file").unwrap();
    assert_eq!(ckpts.latest().unwrap().unwrap().step, 1);
    // The next writer removes the leftover and publishes.
    ckpts.save(3, b"three", 0, |d| fill(d, "3")).unwrap();
    assert!(
        !names(tmp.path()).iter().any(|n| n.starts_with('.')),
        "{:?}",
        names(tmp.path())
    );
    assert_eq!(ckpts.latest().unwrap().unwrap().step, 3);
}

#[test]
fn a_failed_fill_leaves_nothing_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = Checkpoints::new(tmp.path());
    let err = ckpts
        .save(5, b"", 0, |d| {
            fill(d, "partial")?;
            Err(Error::Batch("the fill failed".to_string()))
        })
        .unwrap_err();
    assert!(err.to_string().contains("the fill failed"));
    assert!(names(tmp.path()).is_empty(), "{:?}", names(tmp.path()));
    assert_eq!(ckpts.latest().unwrap(), None);
}

#[test]
fn replacing_without_exchange_publishes_the_new_one_and_removes_the_old() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = Checkpoints::new(tmp.path());
    ckpts.save(4, b"old", 0, |d| fill(d, "old")).unwrap();
    let staged = ckpts.begin(4).unwrap();
    fill(staged.dir(), "new").unwrap();
    staged.commit_with(b"new", 0, false).unwrap();
    assert_eq!(ckpts.latest().unwrap().unwrap().caller_state().unwrap(), b"new");
    assert_eq!(names(tmp.path()), ["step-4"]);
}

#[test]
fn a_writer_killed_between_moving_aside_and_publishing_is_undone_by_the_next_reader() {
    let tmp = tempfile::tempdir().unwrap();
    let ckpts = Checkpoints::new(tmp.path());
    ckpts.save(3, b"three", 0, |d| fill(d, "3")).unwrap();
    ckpts.save(4, b"old", 0, |d| fill(d, "old")).unwrap();
    // What `replace_aside` leaves between its two renames: the old step 4 aside, the new one unpublished.
    std::fs::rename(tmp.path().join("step-4"), tmp.path().join(".step-4.old-77")).unwrap();
    std::fs::create_dir(tmp.path().join(".step-4.tmp-77")).unwrap();
    // An aside copy whose step is published again is a leftover, not a checkpoint to restore.
    ckpts.save(5, b"five", 0, |d| fill(d, "5")).unwrap();
    std::fs::create_dir(tmp.path().join(".step-5.old-78")).unwrap();
    let latest = ckpts.latest().unwrap().unwrap();
    assert_eq!(latest.caller_state().unwrap(), b"five");
    let steps: Vec<u64> = ckpts.list().unwrap().iter().map(|c| c.step).collect();
    assert_eq!(steps, [3, 4, 5], "step 4 was moved back");
    assert_eq!(ckpts.list().unwrap()[1].caller_state().unwrap(), b"old");
    drop(ckpts.begin(6).unwrap());
    assert_eq!(
        names(tmp.path()),
        ["step-3", "step-4", "step-5"],
        "the next writer removed the rest"
    );
}
