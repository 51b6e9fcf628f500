//! The durable rollout journal: one JSON record per line, appended and fsynced before the loop acts on it.
//!
//! What is journaled, and when:
//!
//! - `begin` when the journal is created: the run's random nonce, part of every launch's `Idempotency-Key`.
//! - `route` before the request that registers a gateway-mode route (the name is chosen first), and as soon as
//!   a session-gateway route is acquired; `route_deleted` after a route is gone.
//! - `launch` before a task launch (its sample and idempotency key), `task` as soon as Arena answers with a
//!   task id and before polling, `task_done` once the task is terminal or cancelled.
//! - `draw` before the rollouts of a prompt that dynamic sampling adds to a step (its group index and row).
//! - `rollout` once a rollout is finished, routed and exported: its decision and trajectories. Training
//!   consumes rollouts only from here, so a finished rollout is never lost and never run again.
//! - `step` after a training step (informational; the checkpoint decides where a resumed run starts).
//!
//! The journal's directory is created 0700 and the file 0600, neither ever opened through a symlink, and the
//! directory is fsynced once the file exists (`reward_routing::open_private_file`, as the audit shards).
//!
//! On open, the journal is read back: a torn last line (a kill in the middle of a write) is cut off, and
//! [`JournalState`] says which routes and tasks a killed process left behind and which rollouts are done.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rollout_proxy::ExportedTrajectory;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod compact;

/// Identifies one rollout of a run: training step (or evaluation round), group and sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct SampleKey {
    /// `true` for evaluation rollouts.
    pub eval: bool,
    /// The training step the rollout feeds (or the step after which the evaluation ran).
    pub step: u64,
    /// The prompt's index within the step's batch.
    pub group: u32,
    /// The sample's index within the group.
    pub sample: u32,
}

impl std::fmt::Display for SampleKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = if self.eval { "e" } else { "s" };
        write!(f, "{kind}{}g{}:{}", self.step, self.group, self.sample)
    }
}

/// How a finished rollout feeds its group.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// Trained with this reward (before normalisation).
    Reward {
        /// The reward set on the session's last interaction.
        reward: f64,
    },
    /// No trajectory (empty export, or a model failure without interactions): left out of its group.
    Dropped {
        /// Why.
        reason: String,
    },
    /// Rejected: the whole group is rejected.
    Rejected {
        /// The reason's stable label (`system_failure`, `arena_error`, ...).
        reason: String,
        /// What happened.
        message: String,
    },
}

/// A finished, routed, exported rollout.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RolloutRecord {
    /// Which rollout.
    pub key: SampleKey,
    /// The stream name.
    pub stream: String,
    /// The row.
    pub data_id: String,
    /// The task type (`domain:` tag).
    pub task_type: String,
    /// The task id, when one was launched.
    pub task_id: Option<String>,
    /// How it feeds its group.
    pub verdict: Verdict,
    /// The session's trajectories (empty unless trained); journaled in [`compact`] form.
    #[serde(with = "compact")]
    pub trajectories: Vec<ExportedTrajectory>,
    /// The policy version the session started under.
    pub policy_version: u64,
}

/// One journal line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Entry {
    /// Written when the journal is created (or first opened by a version that writes it): a random id of
    /// this run directory's run, in its launches' `Idempotency-Key`s, so that a new run under the same names
    /// never meets an old run's keys.
    Begin {
        /// 16 random bytes, hex.
        nonce: String,
    },
    /// A route name, journaled before it may exist in Arena.
    Route {
        /// The route's model name.
        name: String,
    },
    /// A route was deleted (or found gone).
    RouteDeleted {
        /// The route's model name.
        name: String,
    },
    /// A launch is about to be sent.
    Launch {
        /// The rollout.
        key: SampleKey,
        /// Its idempotency key, when launches carry one.
        idempotency_key: Option<String>,
    },
    /// Arena answered a launch with this task id.
    Task {
        /// The rollout.
        key: SampleKey,
        /// Arena's task id.
        task_id: String,
    },
    /// The task is terminal, cancelled, or no longer ours to clean.
    TaskDone {
        /// Arena's task id.
        task_id: String,
    },
    /// Dynamic sampling drew another prompt for a step, journaled before its rollouts start.
    Draw {
        /// The step.
        step: u64,
        /// The group index the draw fills (`train_dataset.batch_size` and up).
        group: u32,
        /// The drawn row's stream.
        stream: String,
        /// The drawn row.
        data_id: String,
    },
    /// A finished rollout.
    Rollout(Box<RolloutRecord>),
    /// A training step finished.
    Step {
        /// The step (0-based).
        step: u64,
        /// The policy version after it.
        version: u64,
    },
}

/// What the journal says, replayed.
#[derive(Debug, Default, Clone)]
pub struct JournalState {
    /// Routes that may still exist in Arena.
    pub open_routes: BTreeSet<String>,
    /// Tasks that may still run in Arena.
    pub open_tasks: BTreeSet<String>,
    /// Finished rollouts by key (the first record of a key wins).
    pub rollouts: BTreeMap<SampleKey, RolloutRecord>,
    /// The run's nonce (the `begin` line).
    pub nonce: Option<String>,
    /// Per sample, how many of its launches Arena answered with a task id. A sample launched again after
    /// such a task (which the resumed run cancels) needs a fresh `Idempotency-Key`; one whose launch was never
    /// answered reuses its key, so that an Arena that dedupes answers with the task it may have started.
    pub answered_launches: BTreeMap<SampleKey, u32>,
    /// Launches journaled with neither a task id nor a finished rollout after them: sent, or about to be,
    /// when the process was killed. Arena may have started a task for each.
    pub launches_in_flight: BTreeSet<SampleKey>,
    /// Per task Arena answered a launch with: the sample and that launch's `Idempotency-Key` (so that a
    /// resumed run can relaunch the sample of an open task under the key that started it).
    pub task_launches: BTreeMap<String, (SampleKey, Option<String>)>,
    /// Per sample, the key of its last journaled launch (replay's own bookkeeping).
    last_launch_key: BTreeMap<SampleKey, Option<String>>,
    /// Dynamic sampling's extra draws by `(step, group)`: the row's stream and data id.
    pub draws: BTreeMap<(u64, u32), (String, String)>,
    /// The last training step journaled.
    pub last_step: Option<u64>,
    /// Lines cut off as torn.
    pub torn_lines: usize,
}

impl JournalState {
    fn apply(&mut self, entry: Entry) {
        match entry {
            Entry::Route { name } => {
                self.open_routes.insert(name);
            }
            Entry::RouteDeleted { name } => {
                self.open_routes.remove(&name);
            }
            Entry::Begin { nonce } => {
                self.nonce.get_or_insert(nonce);
            }
            Entry::Launch { key, idempotency_key } => {
                self.launches_in_flight.insert(key);
                self.last_launch_key.insert(key, idempotency_key);
            }
            Entry::Draw {
                step,
                group,
                stream,
                data_id,
            } => {
                self.draws.entry((step, group)).or_insert((stream, data_id));
            }
            Entry::Task { key, task_id } => {
                self.launches_in_flight.remove(&key);
                *self.answered_launches.entry(key).or_default() += 1;
                let launch_key = self.last_launch_key.get(&key).cloned().flatten();
                self.task_launches.insert(task_id.clone(), (key, launch_key));
                self.open_tasks.insert(task_id);
            }
            Entry::TaskDone { task_id } => {
                self.open_tasks.remove(&task_id);
            }
            Entry::Rollout(record) => {
                self.launches_in_flight.remove(&record.key);
                // A launch answered with a finished task (a deduping Arena handing back a task that ended)
                // journals no `task_done`: the rollout that collected the task closes it.
                if let Some(task_id) = &record.task_id {
                    self.open_tasks.remove(task_id);
                }
                self.rollouts.entry(record.key).or_insert(*record);
            }
            Entry::Step { step, .. } => {
                self.last_step = Some(self.last_step.map_or(step, |s| s.max(step)));
            }
        }
    }
}

/// The journal file of one rollout worker. Cloning shares it.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Mutex<File>>,
    path: PathBuf,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

impl Journal {
    /// Opens (or creates) the journal at `path`, replays it, and cuts off a torn last line.
    pub fn open(path: &Path) -> Result<(Self, JournalState)> {
        let fail = |action: &'static str, at: &Path| {
            let path = at.to_path_buf();
            move |source| Error::Journal { path, action, source }
        };
        // Private and never through a symlink, as the audit shards: the directory 0700, the file 0600, the
        // directory fsynced after the file is created.
        let absolute = std::path::absolute(path).map_err(fail("resolve the path of", path))?;
        let (Some(dir), Some(name)) = (absolute.parent(), absolute.file_name().and_then(|n| n.to_str()))
        else {
            return Err(Error::Invalid(format!(
                "the journal path {} names no file in a directory",
                path.display()
            )));
        };
        let (mut file, _) = reward_routing::open_private_file(dir, name).map_err(|message| {
            fail("open", path)(std::io::Error::new(std::io::ErrorKind::PermissionDenied, message))
        })?;
        let (mut state, good_len) = replay(&file, path)?;
        let len = file.seek(SeekFrom::End(0)).map_err(fail("read", path))?;
        if len != good_len {
            file.set_len(good_len)
                .and_then(|()| file.sync_data())
                .map_err(fail("cut the torn end of", path))?;
        }
        let journal = Self {
            inner: Arc::new(Mutex::new(file)),
            path: path.to_path_buf(),
        };
        if state.nonce.is_none() {
            let nonce = rollout_proxy::auth::random_hex(16);
            journal.append(&Entry::Begin { nonce: nonce.clone() })?;
            state.nonce = Some(nonce);
        }
        Ok((journal, state))
    }

    /// The journal's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn file(&self) -> std::sync::MutexGuard<'_, File> {
        // The file handle has no state a panicking writer could leave half-changed: a torn line is what a
        // kill leaves too, and replay cuts it.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Bytes written so far: where the next entry begins.
    pub fn position(&self) -> Result<u64> {
        let file = self.file();
        let meta = file.metadata().map_err(|source| Error::Journal {
            path: self.path.clone(),
            action: "read",
            source,
        })?;
        Ok(meta.len())
    }

    /// Appends `entry` as one line and fsyncs it before returning.
    pub fn append(&self, entry: &Entry) -> Result<()> {
        let mut line = serde_json::to_vec(entry).map_err(|e| Error::Journal {
            path: self.path.clone(),
            action: "serialise an entry for",
            source: e.into(),
        })?;
        line.push(b'\n');
        let mut file = self.file();
        file.write_all(&line)
            .and_then(|()| file.sync_data())
            .map_err(|source| Error::Journal {
                path: self.path.clone(),
                action: "append to",
                source,
            })
    }
}

/// Reads every complete line of the journal; returns the state and the length of its good prefix.
fn replay(file: &File, path: &Path) -> Result<(JournalState, u64)> {
    let mut state = JournalState::default();
    let mut good_len = 0u64;
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(|source| Error::Journal {
                path: path.to_path_buf(),
                action: "read",
                source,
            })?;
        if n == 0 {
            break;
        }
        if !line.ends_with(b"\n") {
            state.torn_lines += 1;
            break;
        }
        match serde_json::from_slice::<Entry>(line.trim_ascii_end()) {
            Ok(entry) => {
                state.apply(entry);
                good_len += n as u64;
            }
            Err(e) => {
                return Err(Error::JournalCorrupt {
                    path: path.to_path_buf(),
                    at: good_len,
                    message: e.to_string(),
                });
            }
        }
    }
    Ok((state, good_len))
}

#[cfg(test)]
mod tests;
