//! The journal on a full file system (issue 30 item 7): an append that fails half way (a short write, then
//! EFBIG, as `RLIMIT_FSIZE` makes it; ENOSPC and EIO fail the same way) is rolled back, so an append after
//! space is freed lands on a line of its own and the journal resumes. Without the rollback the fragment and
//! the next line became one corrupt line mid-file, and resuming stopped with `JournalCorrupt`.
//!
//! The writer is this test binary re-executed as a child ([`child`]) with `SIGXFSZ` ignored (inherited from
//! the shell that execs it), so the limit only fails its writes.

use std::path::{Path, PathBuf};
use std::process::Command;

use arena_rl::journal::{Entry, Journal};
use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

const DIR: &str = "ARENA_RL_FULL_JOURNAL_DIR";

fn route(name: &str) -> Entry {
    Entry::Route { name: name.into() }
}

/// The child: appends, fills the file-size limit with one append, frees it, appends again; then a rotation
/// fails the same way.
#[test]
fn child() {
    let Some(dir) = std::env::var_os(DIR) else {
        return;
    };
    let path = PathBuf::from(dir).join("journal.jsonl");
    let (journal, _) = Journal::open(&path).unwrap();
    journal.append(&route("before")).unwrap();
    let (_, len) = journal.position().unwrap();
    let unlimited = getrlimit(Resource::Fsize);
    setrlimit(
        Resource::Fsize,
        Rlimit {
            current: Some(len + 100),
            maximum: unlimited.maximum,
        },
    )
    .unwrap();
    let failed = journal.append(&route(&"x".repeat(1000)));
    setrlimit(Resource::Fsize, unlimited).unwrap();
    let error = failed.expect_err("an append past the file-size limit fails");
    println!("FAILED-APPEND {error}");
    journal.append(&route("after")).unwrap();
    // A new segment whose head cannot be written is removed, and appending goes on in the old one.
    setrlimit(
        Resource::Fsize,
        Rlimit {
            current: Some(10),
            maximum: unlimited.maximum,
        },
    )
    .unwrap();
    let failed = journal.rotate(1);
    setrlimit(Resource::Fsize, unlimited).unwrap();
    println!(
        "FAILED-ROTATE {}",
        failed.expect_err("a head past the limit fails")
    );
    journal.append(&route("last")).unwrap();
    println!("CHILD-DONE");
}

fn run_child(dir: &Path) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg("trap '' XFSZ; exec \"$0\" \"$@\"")
        .arg(std::env::current_exe().unwrap())
        .args([
            "journal_full::child",
            "--exact",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR, dir)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success() && stdout.contains("CHILD-DONE"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

#[test]
fn an_append_that_fails_half_way_is_rolled_back_and_the_journal_resumes() {
    let dir = tempfile::tempdir().unwrap();
    let stdout = run_child(dir.path());
    assert!(
        stdout.contains("File too large"),
        "the append failed with EFBIG: {stdout}"
    );
    let text = std::fs::read_to_string(dir.path().join("journal.jsonl")).unwrap();
    for line in text.lines() {
        serde_json::from_str::<Entry>(line)
            .unwrap_or_else(|e| panic!("{e}: a corrupt line {line:?} in\n{text}"));
    }
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["journal.jsonl"], "the half-written segment was removed");
    let (_, state) = Journal::open(&dir.path().join("journal.jsonl")).unwrap();
    assert_eq!(
        state.open_routes.iter().collect::<Vec<_>>(),
        ["after", "before", "last"]
    );
    assert_eq!(state.torn_lines, 0);
}
