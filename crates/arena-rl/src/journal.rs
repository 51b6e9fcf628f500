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
//! - `audit` in the same write, just before its `rollout`: the rollout's audit record, appended to the audit
//!   shards only once it is journaled, so that each rollout is audited once ([`AuditEntry`]).
//! - `step` after a training step (informational; the checkpoint decides where a resumed run starts).
//! - `answered` and `carried` only in a segment's head (below): a sample's answered-launch count, and a copy
//!   of a rollout or draw from an older segment.
//!
//! The journal's directory is created 0700 and the file 0600, neither ever opened through a symlink, and the
//! directory is fsynced once the file exists (`reward_routing::open_private_file`, as the audit shards).
//!
//! The journal is written in segments ([`segments`]): at each checkpoint the loop starts a new one
//! ([`Journal::rotate`]) whose head carries what a run resumed from that checkpoint needs of the older ones
//! (the nonce, open routes and tasks, launches in flight and their counts as `answered` entries, and every
//! rollout, audit record and draw of the checkpoint's steps on as `carried` copies), then retires the
//! segments no kept checkpoint needs ([`Journal::retire_before`]). The audit shards hold the audit; the
//! journal holds a rollout's record only until a resumed run has checked that the shards have it.
//!
//! On open, every segment is read back in order: a torn last line of the newest (a kill in the middle of a
//! write) is cut off, and [`JournalState`] says which routes and tasks a killed process left behind and
//! which rollouts are done. A journal written before segments is segment 0 and resumes as it is.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{BufRead as _, BufReader, Seek as _, SeekFrom, Write as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rollout_proxy::ExportedTrajectory;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

pub mod compact;
mod segments;

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
    /// What Arena and the reward routing made of the task (absent when no outcome was routed, and in
    /// journals written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingFacts>,
}

/// A routed rollout's outcome as an evaluation reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingFacts {
    /// Arena's terminal status (`DONE`, `HARNESS_FAILED`, ...), when a task finished.
    pub status: Option<String>,
    /// `success`, or the reference's failure disposition (`model_failure_zero`, `system_failure_reject`,
    /// `unknown_failure_reject`).
    pub disposition: String,
    /// The reward the routing decided (0 for a model failure), `None` when it rejected the rollout.
    pub reward: Option<f64>,
}

/// A finished rollout's audit record, as the journal holds it until a resumed run has checked that the audit
/// shards have it: a kill between the journal write and the audit append leaves it to the resumed run to
/// append, and the journal write comes first so that a rollout run again after a kill is never audited twice.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditEntry {
    /// Which rollout.
    pub key: SampleKey,
    /// Where the audit writer was about to append it; the record is there or later.
    pub at: reward_routing::AuditPosition,
    /// The task the record is about.
    pub task_id: String,
    /// The record's line, as the audit writer writes it.
    pub line: String,
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
    /// A finished rollout's audit record, journaled in the same write as its `rollout` entry (just before it)
    /// and appended to the audit shards right after.
    Audit(Box<AuditEntry>),
    /// A finished rollout.
    Rollout(Box<RolloutRecord>),
    /// How many launches of a sample Arena had answered, carried into a new segment.
    Answered {
        /// The rollout.
        key: SampleKey,
        /// Its answered launches.
        launches: u32,
    },
    /// A rollout or draw copied into a new segment from an older one (which may then be retired).
    Carried {
        /// The copied entry.
        entry: Box<Entry>,
    },
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
    /// Audit records of rollouts by key (the first of a key wins); only those of journaled rollouts count.
    pub audits: BTreeMap<SampleKey, AuditEntry>,
    /// Per audit shard stem (directory and stem), the earliest position an audit record was journaled at:
    /// every record this run journaled for those shards is there or later.
    pub audit_from: BTreeMap<(PathBuf, String), (u64, u64)>,
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
    /// The policy version after the last step journaled.
    last_version: u64,
    /// Lines cut off as torn.
    pub torn_lines: usize,
}

impl JournalState {
    fn apply(&mut self, entry: Entry) {
        self.track(&entry);
        match entry {
            Entry::Draw {
                step,
                group,
                stream,
                data_id,
            } => {
                self.draws.entry((step, group)).or_insert((stream, data_id));
            }
            Entry::Rollout(record) => {
                self.rollouts.entry(record.key).or_insert(*record);
            }
            Entry::Audit(audit) => {
                let at = &audit.at;
                let from = (at.index, at.offset);
                self.audit_from
                    .entry((at.dir.clone(), at.stem.clone()))
                    .and_modify(|earliest| *earliest = (*earliest).min(from))
                    .or_insert(from);
                self.audits.entry(audit.key).or_insert(*audit);
            }
            Entry::Carried { entry } => self.apply(*entry),
            _ => {}
        }
    }

    /// Everything an entry changes but the rollouts and draws themselves: what a live journal keeps in
    /// memory to write the head of its next segment.
    fn track(&mut self, entry: &Entry) {
        match entry {
            Entry::Route { name } => {
                self.open_routes.insert(name.clone());
            }
            Entry::RouteDeleted { name } => {
                self.open_routes.remove(name);
            }
            Entry::Begin { nonce } => {
                self.nonce.get_or_insert_with(|| nonce.clone());
            }
            Entry::Launch { key, idempotency_key } => {
                self.launches_in_flight.insert(*key);
                self.last_launch_key.insert(*key, idempotency_key.clone());
            }
            Entry::Task { key, task_id } => {
                self.launches_in_flight.remove(key);
                *self.answered_launches.entry(*key).or_default() += 1;
                let launch_key = self.last_launch_key.remove(key).flatten();
                self.task_launches.insert(task_id.clone(), (*key, launch_key));
                self.open_tasks.insert(task_id.clone());
            }
            Entry::TaskDone { task_id } => {
                self.open_tasks.remove(task_id);
                self.task_launches.remove(task_id);
            }
            Entry::Answered { key, launches } => {
                let n = self.answered_launches.entry(*key).or_default();
                *n = (*n).max(*launches);
            }
            Entry::Rollout(record) => {
                self.launches_in_flight.remove(&record.key);
                self.last_launch_key.remove(&record.key);
                // A launch answered with a finished task (a deduping Arena handing back a task that ended)
                // journals no `task_done`: the rollout that collected the task closes it.
                if let Some(task_id) = &record.task_id {
                    self.open_tasks.remove(task_id);
                    self.task_launches.remove(task_id);
                }
            }
            Entry::Step { step, version } => {
                if self.last_step.is_none_or(|s| *step >= s) {
                    self.last_step = Some(*step);
                    self.last_version = *version;
                }
            }
            Entry::Carried { entry } => self.track(entry),
            Entry::Draw { .. } | Entry::Audit(_) => {}
        }
    }

    /// The entries that open a new segment with what replay needs of the older ones, rollouts and draws
    /// aside: the nonce, open routes, open tasks with the launches that started them, launches in flight,
    /// the answered-launch counts of samples of `from_step` on, and the last step.
    fn head_entries(&self, from_step: u64) -> Vec<Entry> {
        let mut entries: Vec<Entry> = self
            .nonce
            .iter()
            .map(|n| Entry::Begin { nonce: n.clone() })
            .collect();
        entries.extend(
            self.open_routes
                .iter()
                .map(|name| Entry::Route { name: name.clone() }),
        );
        for task_id in &self.open_tasks {
            if let Some((key, idempotency_key)) = self.task_launches.get(task_id) {
                entries.push(Entry::Launch {
                    key: *key,
                    idempotency_key: idempotency_key.clone(),
                });
                entries.push(Entry::Task {
                    key: *key,
                    task_id: task_id.clone(),
                });
            }
        }
        for key in &self.launches_in_flight {
            entries.push(Entry::Launch {
                key: *key,
                idempotency_key: self.last_launch_key.get(key).cloned().flatten(),
            });
        }
        for (key, launches) in &self.answered_launches {
            if key.step >= from_step {
                entries.push(Entry::Answered {
                    key: *key,
                    launches: *launches,
                });
            }
        }
        entries.extend(self.last_step.map(|step| Entry::Step {
            step,
            version: self.last_version,
        }));
        entries
    }

    /// A copy without the rollouts, audits and draws, as a live journal tracks it.
    fn tracked(&self) -> Self {
        Self {
            rollouts: BTreeMap::new(),
            audits: BTreeMap::new(),
            audit_from: BTreeMap::new(),
            draws: BTreeMap::new(),
            ..self.clone()
        }
    }
}

/// The live segment of a journal and what it tracks.
struct Writer {
    file: File,
    segment: u32,
    live: JournalState,
    /// Where the last complete line ends: an append that fails is cut back to here.
    len: u64,
    /// A failed append left bytes past `len` that could not be cut yet; the next append cuts them first.
    dirty: bool,
}

/// The journal files of one rollout worker, in segments. Cloning shares it.
#[derive(Clone)]
pub struct Journal {
    inner: Arc<Mutex<Writer>>,
    path: PathBuf,
    dir: PathBuf,
    base: String,
}

impl std::fmt::Debug for Journal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Journal").field("path", &self.path).finish()
    }
}

fn journal_error(path: &Path, action: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.to_path_buf();
    move |source| Error::Journal { path, action, source }
}

/// Opens segment `n` privately (0700 directory, 0600 file, never through a symlink).
fn open_segment(dir: &Path, base: &str, n: u32) -> Result<File> {
    let name = segments::name(base, n);
    reward_routing::open_private_file(dir, &name)
        .map(|(file, _)| file)
        .map_err(|message| {
            journal_error(&dir.join(&name), "open")(std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                message,
            ))
        })
}

impl Journal {
    /// Opens (or creates) the journal at `path` with all its segments, replays them in order, and cuts off a
    /// torn last line of the newest (a sealed segment with one is corrupt).
    pub fn open(path: &Path) -> Result<(Self, JournalState)> {
        let absolute = std::path::absolute(path).map_err(journal_error(path, "resolve the path of"))?;
        let (Some(dir), Some(base)) = (absolute.parent(), absolute.file_name().and_then(|n| n.to_str()))
        else {
            return Err(Error::Invalid(format!(
                "the journal path {} names no file in a directory",
                path.display()
            )));
        };
        let mut numbers = segments::list(dir, base).map_err(journal_error(dir, "list the segments of"))?;
        if numbers.is_empty() {
            numbers.push(0);
        }
        let mut state = JournalState::default();
        let mut live = None;
        for (i, n) in numbers.iter().enumerate() {
            let mut file = open_segment(dir, base, *n)?;
            let shown = dir.join(segments::name(base, *n));
            let good_len = replay(&file, &shown, &mut state)?;
            let len = file
                .seek(SeekFrom::End(0))
                .map_err(journal_error(&shown, "read"))?;
            if len != good_len && i + 1 < numbers.len() {
                return Err(Error::JournalCorrupt {
                    path: shown,
                    at: good_len,
                    message: "a sealed segment ends in a torn line".into(),
                });
            }
            if len != good_len {
                file.set_len(good_len)
                    .and_then(|()| file.sync_data())
                    .map_err(journal_error(&shown, "cut the torn end of"))?;
            }
            live = Some((file, *n, good_len));
        }
        let (file, segment, len) = live.expect("at least one segment");
        let journal = Self {
            inner: Arc::new(Mutex::new(Writer {
                file,
                segment,
                live: state.tracked(),
                len,
                dirty: false,
            })),
            path: path.to_path_buf(),
            dir: dir.to_path_buf(),
            base: base.to_string(),
        };
        if state.nonce.is_none() {
            let nonce = rollout_proxy::auth::random_hex(16);
            journal.append(&Entry::Begin { nonce: nonce.clone() })?;
            state.nonce = Some(nonce);
        }
        Ok((journal, state))
    }

    /// The journal's path (its first segment's).
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn writer(&self) -> std::sync::MutexGuard<'_, Writer> {
        // The file handle has no state a panicking writer could leave half-changed: a torn line is what a
        // kill leaves too, and replay cuts it.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The live segment's number and the bytes written to it so far (where the next entry begins).
    pub fn position(&self) -> Result<(u32, u64)> {
        let writer = self.writer();
        Ok((writer.segment, writer.len))
    }

    /// The length of segment `n` now, or `None` when it is gone.
    pub fn segment_len(&self, n: u32) -> Result<Option<u64>> {
        let path = self.dir.join(segments::name(&self.base, n));
        match std::fs::symlink_metadata(&path) {
            Ok(meta) => Ok(Some(meta.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(journal_error(&path, "read")(e)),
        }
    }

    /// Appends `entry` as one line and fsyncs it before returning.
    pub fn append(&self, entry: &Entry) -> Result<()> {
        self.append_all(std::slice::from_ref(entry))
    }

    /// Appends `entries` as lines in one write and one fsync: they are durable together or, after a kill,
    /// a prefix of them is (replay cuts a torn last line). A write or fsync that fails (ENOSPC, EFBIG, EIO)
    /// is rolled back: the segment is cut back to its last complete line, so no fragment is left for a later
    /// append to complete into a corrupt line; if even the cut fails, the next append makes it first.
    pub fn append_all(&self, entries: &[Entry]) -> Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let mut lines = Vec::new();
        for entry in entries {
            serde_json::to_writer(&mut lines, entry)
                .map_err(|e| journal_error(&self.path, "serialise an entry for")(e.into()))?;
            lines.push(b'\n');
        }
        let mut writer = self.writer();
        let start = writer.len;
        if writer.dirty {
            writer
                .file
                .set_len(start)
                .and_then(|()| writer.file.sync_data())
                .map_err(journal_error(&self.path, "cut a failed append from"))?;
            writer.dirty = false;
        }
        let written = writer
            .file
            .write_all(&lines)
            .and_then(|()| writer.file.sync_data());
        if let Err(e) = written {
            writer.dirty = writer
                .file
                .set_len(start)
                .and_then(|()| writer.file.sync_data())
                .is_err();
            return Err(journal_error(&self.path, "append to")(e));
        }
        writer.len = start + lines.len() as u64;
        for entry in entries {
            writer.live.track(entry);
        }
        Ok(())
    }

    /// Starts a new segment whose head holds what a run resumed from a checkpoint of `from_step` (or later)
    /// needs of the older ones: the tracked state and, carried over, every rollout, audit and draw of
    /// `from_step` on. Written and synced before any later entry, so the older segments can be retired once a
    /// checkpoint that names the new segment is saved. Returns the new segment's number.
    pub fn rotate(&self, from_step: u64) -> Result<u32> {
        let mut writer = self.writer();
        let mut head = Vec::new();
        for entry in writer.live.head_entries(from_step) {
            serde_json::to_writer(&mut head, &entry)
                .map_err(|e| journal_error(&self.path, "serialise an entry for")(e.into()))?;
            head.push(b'\n');
        }
        let mut seen = BTreeSet::new();
        let sealed = segments::list(&self.dir, &self.base).map_err(journal_error(&self.dir, "list"))?;
        for n in sealed.iter().filter(|n| **n <= writer.segment) {
            let path = self.dir.join(segments::name(&self.base, *n));
            let file = open_segment(&self.dir, &self.base, *n)?;
            segments::carry_lines(&file, from_step, &mut seen, &mut head)
                .map_err(journal_error(&path, "read"))?;
        }
        let next = writer.segment + 1;
        let mut file = open_segment(&self.dir, &self.base, next)?;
        let shown = self.dir.join(segments::name(&self.base, next));
        // A new segment is whole or gone: one left half-written would be the live segment on resume.
        let written = file
            .set_len(0)
            .and_then(|()| file.write_all(&head))
            .and_then(|()| file.sync_data());
        if let Err(e) = written {
            drop(file);
            let _ = std::fs::remove_file(&shown).and_then(|()| File::open(&self.dir)?.sync_all());
            return Err(journal_error(&shown, "write the head of")(e));
        }
        writer.file = file;
        writer.segment = next;
        writer.len = head.len() as u64;
        writer.dirty = false;
        crate::failpoint::reach(crate::failpoint::JOURNAL_ROTATED);
        Ok(next)
    }

    /// Retires every segment older than `keep_from` (deleted, or moved into `retired/` beside them when
    /// `keep`): no kept checkpoint needs them, since the segment each names carries what it resumes from.
    pub fn retire_before(&self, keep_from: u32, keep: bool) -> Result<usize> {
        let writer = self.writer();
        let numbers: Vec<u32> = segments::list(&self.dir, &self.base)
            .map_err(journal_error(&self.dir, "list"))?
            .into_iter()
            .filter(|n| *n < keep_from.min(writer.segment))
            .collect();
        segments::retire(&self.dir, &self.base, &numbers, keep)
            .map_err(journal_error(&self.dir, "retire segments of"))?;
        if !numbers.is_empty() {
            crate::failpoint::reach(crate::failpoint::JOURNAL_RETIRED);
        }
        Ok(numbers.len())
    }
}

/// Replays every complete line of one segment into `state`; returns the length of its good prefix.
fn replay(file: &File, path: &Path, state: &mut JournalState) -> Result<u64> {
    let mut good_len = 0u64;
    let mut reader = BufReader::new(file);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = reader
            .read_until(b'\n', &mut line)
            .map_err(journal_error(path, "read"))?;
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
    Ok(good_len)
}

#[cfg(test)]
mod tests;
