//! Named fail-points: moments of the loop where a kill test stops this process, so that a SIGKILL lands
//! exactly there.
//!
//! `ARENA_RL_FAILPOINT=<name>[:<n>]` makes the `n`-th time (default the first) the process reaches the point
//! `name` print `ARENA-RL-FAILPOINT <name>` on a line of its own on stdout and then hold the thread that reached it forever (other
//! threads go on, as they would when a kill arrives), for the test to kill the process. Without the variable
//! a point costs one atomic load. The points, in the order a step meets them:
//!
//! - [`ROLLOUT_JOURNALED`]: a rollout and its audit record are journaled, the audit shard not yet written.
//! - [`JOURNAL_ROTATED`]: a new journal segment's head is written and synced, the checkpoint not yet saved.
//! - [`CHECKPOINT_WRITING`]: the training step's state is in the checkpoint's temporary directory, which is
//!   not published yet.
//! - [`CHECKPOINT_PUBLISHED`]: the checkpoint is published (and older ones pruned), the journal not yet
//!   trimmed.
//! - [`JOURNAL_RETIRED`]: the segments no kept checkpoint needs are retired.

use std::io::Write as _;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// After a rollout's journal record, before its audit record is appended to the shards.
pub const ROLLOUT_JOURNALED: &str = "rollout-journaled";
/// After a new journal segment is written, before the checkpoint that names it.
pub const JOURNAL_ROTATED: &str = "journal-rotated";
/// While a checkpoint is written: its state is staged, not published.
pub const CHECKPOINT_WRITING: &str = "checkpoint-writing";
/// Right after a checkpoint is published.
pub const CHECKPOINT_PUBLISHED: &str = "checkpoint-published";
/// After journal segments are retired.
pub const JOURNAL_RETIRED: &str = "journal-retired";

/// The variable that arms a point.
pub const ENV: &str = "ARENA_RL_FAILPOINT";

/// What stdout says when a point holds the process.
pub const REACHED: &str = "ARENA-RL-FAILPOINT";

struct Armed {
    name: String,
    nth: u64,
    seen: AtomicU64,
}

fn armed() -> Option<&'static Armed> {
    static ARMED: OnceLock<Option<Armed>> = OnceLock::new();
    ARMED
        .get_or_init(|| {
            let spec = stream_config::Env::from_process().get(ENV)?.trim().to_string();
            let (name, nth) = match spec.rsplit_once(':') {
                Some((name, n)) => (name.to_string(), n.parse().ok()?),
                None => (spec, 1),
            };
            Some(Armed {
                name,
                nth,
                seen: AtomicU64::new(0),
            })
        })
        .as_ref()
}

/// Marks the point `name`: holds this thread forever when the armed point is reached (see the module doc).
pub fn reach(name: &str) {
    let Some(armed) = armed() else {
        return;
    };
    if armed.name != name || armed.seen.fetch_add(1, Ordering::SeqCst) + 1 != armed.nth {
        return;
    }
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "\n{REACHED} {name}");
    let _ = out.flush();
    drop(out);
    loop {
        std::thread::park();
    }
}
