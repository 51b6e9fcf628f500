//! Audit shards (reference section 4.6): one compact JSON line per routed task result, appended to a private
//! per-process shard.
//!
//! Unlike the reference, whose lock belonged to each agent instance, one [`AuditWriter`] serves every worker of
//! a process ([`AuditWriter::shared`]), so lines never interleave; and shards can rotate at a configurable size.
//! A write failure is logged and counted and never reaches the rollout.

mod secure;

pub use secure::open_private_file;

use std::collections::{BTreeSet, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, Weak};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use stream_config::TaskStatus;

use crate::error::{Error, Result};
use crate::harness::metric_code;
use crate::metrics::{Lifecycle, Metric, Scope};
use crate::outcome::{IntegrityFinding, RowMeta, TaskOutcome};
use stream_config::RewardRef;

/// The reference's default for `arena_result_dump_max_bytes`: a larger `raw` is replaced by null.
pub const DEFAULT_MAX_RAW_BYTES: u64 = 1_000_000;

/// How many rotated shard names a writer tries before giving up on finding one below the rotation size.
const MAX_ROTATION_PROBES: u64 = 10_000;

/// One audit record: what Arena reported for a task and what training made of it.
#[derive(Debug, Clone, PartialEq)]
pub struct AuditRecord {
    /// The configured stream name.
    pub arena_stream_name: String,
    /// Arena's stream id.
    pub stream_id: String,
    /// The row's data id.
    pub data_id: String,
    /// Arena's task id.
    pub task_id: String,
    /// The task status (or `LOCAL_WAIT_TIMEOUT` / `LOCAL_WAIT_CANCELLED`).
    pub status: TaskStatus,
    /// The grader version the stream pins.
    pub expected_reward_ref: RewardRef,
    /// The top-level score.
    pub arena_score: Option<f64>,
    /// The reward actually trained, or `None` when rejected or not trained.
    pub training_score: Option<f64>,
    /// The opaque `raw` payload (`Null` when absent).
    pub raw: Value,
    /// `artifacts_uri`.
    pub artifacts_uri: Option<String>,
    /// `trace_id`.
    pub trace_id: Option<String>,
    /// `computed_at`.
    pub computed_at: Option<String>,
    /// The integrity hits of the rollout's session (rule and matched command), as its export carried them;
    /// the line leaves the field out when there are none.
    pub integrity_hits: Vec<IntegrityFinding>,
    /// The proxy session the rollout ran in (`session_id`, null when unknown).
    pub session_id: Option<String>,
    /// For a `HARNESS_FAILED` task, its outcome code as metrics name it (one of
    /// [`crate::HARNESS_OUTCOME_METRIC_CODES`] or `OTHER`); null for every other status.
    pub harness_outcome_code: Option<String>,
    /// Why the rollout was not trained on ([`crate::RejectReason::kind`], or `empty_export`); null when it
    /// was.
    pub rejection_reason: Option<String>,
    /// Under the strict receipt policy, why a `HARNESS_FAILED` task's `raw` was not a valid receipt; null
    /// otherwise.
    pub receipt_problem: Option<String>,
}

/// The wire form of a record, fields in the reference's order.
#[derive(Serialize)]
struct Line<'a> {
    arena_stream_name: &'a str,
    stream_id: &'a str,
    data_id: &'a str,
    task_id: &'a str,
    status: &'a str,
    expected_reward_ref: &'a RewardRef,
    arena_score: Option<f64>,
    training_score: Option<f64>,
    raw: &'a Value,
    raw_present: bool,
    raw_size_bytes: u64,
    raw_truncated: bool,
    artifacts_uri: Option<&'a str>,
    trace_id: Option<&'a str>,
    computed_at: Option<&'a str>,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    integrity_hits: &'a [IntegrityFinding],
    arena_task_id: &'a str,
    session_id: Option<&'a str>,
    harness_outcome_code: Option<&'a str>,
    rejection_reason: Option<&'a str>,
    receipt_problem: Option<&'a str>,
}

impl AuditRecord {
    /// The record of a task result.
    pub fn from_task(row: &RowMeta, task: &TaskOutcome, training_score: Option<f64>) -> Self {
        Self {
            arena_stream_name: row.stream_name.clone(),
            stream_id: row.stream_id.clone(),
            data_id: row.data_id.clone(),
            task_id: task.task_id.clone(),
            status: task.status.clone(),
            expected_reward_ref: row.expected_reward_ref.clone(),
            arena_score: task.score,
            training_score,
            raw: task.raw.clone(),
            artifacts_uri: task.artifacts_uri.clone(),
            trace_id: task.trace_id.clone(),
            computed_at: task.computed_at.clone(),
            integrity_hits: Vec::new(),
            session_id: None,
            harness_outcome_code: (task.status == TaskStatus::HarnessFailed)
                .then(|| metric_code(&task.raw).to_string()),
            rejection_reason: None,
            receipt_problem: None,
        }
    }

    /// The record of a task we stopped waiting for: status `LOCAL_WAIT_TIMEOUT` or `LOCAL_WAIT_CANCELLED`, no
    /// score.
    pub fn local_wait(row: &RowMeta, task_id: &str, cancelled: bool) -> Self {
        let status = if cancelled {
            TaskStatus::LocalWaitCancelled
        } else {
            TaskStatus::LocalWaitTimeout
        };
        Self::from_task(row, &TaskOutcome::new(task_id, status, None), None)
    }

    /// The same record with the session's integrity hits.
    pub fn with_integrity_hits(mut self, hits: Vec<IntegrityFinding>) -> Self {
        self.integrity_hits = hits;
        self
    }

    /// The same record with the rollout's proxy session (an empty id stays null).
    pub fn with_session_id(mut self, session_id: Option<&str>) -> Self {
        self.session_id = session_id.filter(|s| !s.is_empty()).map(str::to_string);
        self
    }

    /// The same record with why it was not trained on.
    pub fn with_rejection_reason(mut self, reason: Option<&str>) -> Self {
        self.rejection_reason = reason.map(str::to_string);
        self
    }

    /// The same record with why its `raw` was not a valid receipt.
    pub fn with_receipt_problem(mut self, problem: Option<String>) -> Self {
        self.receipt_problem = problem;
        self
    }

    /// The same record with another `training_score`.
    pub fn with_training_score(mut self, training_score: Option<f64>) -> Self {
        self.training_score = training_score;
        self
    }

    /// The record as one compact JSON line ending in `\n`. `raw_size_bytes` is the UTF-8 length of `raw` as
    /// compact JSON; a `raw` larger than `max_raw_bytes` is written as null with `raw_truncated: true`.
    pub fn to_line(&self, max_raw_bytes: u64) -> String {
        let raw_size_bytes = compact_len(&self.raw);
        let raw_truncated = raw_size_bytes > max_raw_bytes;
        let line = Line {
            arena_stream_name: &self.arena_stream_name,
            stream_id: &self.stream_id,
            data_id: &self.data_id,
            task_id: &self.task_id,
            status: self.status.as_str(),
            expected_reward_ref: &self.expected_reward_ref,
            arena_score: self.arena_score,
            training_score: self.training_score,
            raw: if raw_truncated { &Value::Null } else { &self.raw },
            raw_present: !self.raw.is_null(),
            raw_size_bytes,
            raw_truncated,
            artifacts_uri: self.artifacts_uri.as_deref(),
            trace_id: self.trace_id.as_deref(),
            computed_at: self.computed_at.as_deref(),
            integrity_hits: &self.integrity_hits,
            arena_task_id: &self.task_id,
            session_id: self.session_id.as_deref(),
            harness_outcome_code: self.harness_outcome_code.as_deref(),
            rejection_reason: self.rejection_reason.as_deref(),
            receipt_problem: self.receipt_problem.as_deref(),
        };
        let mut text = serde_json::to_string(&line).expect("an audit line is plain JSON data");
        text.push('\n');
        text
    }
}

/// The length of `value` as compact JSON, without building the string.
fn compact_len(value: &Value) -> u64 {
    struct Counter(u64);
    impl Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    serde_json::to_writer(&mut counter, value).expect("a JSON value serialises");
    counter.0
}

/// Where and how audit shards are written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditConfig {
    /// The shard directory (`arena_result_dump_dir`); created without following symlinks.
    pub dir: PathBuf,
    /// `arena_result_dump_max_bytes`: a larger `raw` is written as null.
    pub max_raw_bytes: u64,
    /// Start a new shard when appending would take the current one past this many bytes; `None` never rotates
    /// (the reference's behaviour).
    pub rotate_bytes: Option<u64>,
}

impl AuditConfig {
    /// Shards in `dir` with the reference's defaults: 1,000,000-byte `raw` limit, no rotation.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            max_raw_bytes: DEFAULT_MAX_RAW_BYTES,
            rotate_bytes: None,
        }
    }

    /// Every problem with these settings, and the absolute directory when there is none.
    fn check(&self) -> Result<PathBuf> {
        let mut problems = Vec::new();
        if self.dir.as_os_str().is_empty() {
            problems.push("arena_result_dump_dir must not be empty".to_string());
        }
        if self.dir.components().any(|c| matches!(c, Component::ParentDir)) {
            problems.push(format!(
                "arena_result_dump_dir {:?} must not contain '..'",
                self.dir
            ));
        }
        if self.max_raw_bytes == 0 {
            problems.push("arena_result_dump_max_bytes must be positive".to_string());
        }
        if self.rotate_bytes == Some(0) {
            problems.push("the audit shard rotation size must be positive".to_string());
        }
        if !problems.is_empty() {
            return Err(Error::InvalidConfig(problems));
        }
        let dir = if self.dir.is_absolute() {
            self.dir.clone()
        } else {
            std::env::current_dir()
                .map_err(|e| {
                    Error::InvalidConfig(vec![format!(
                        "cannot resolve the relative arena_result_dump_dir {:?}: {e}",
                        self.dir
                    )])
                })?
                .join(&self.dir)
        };
        Ok(dir
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
            .collect())
    }
}

/// Counts of an [`AuditWriter`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AuditStats {
    /// Records written.
    pub written: u64,
    /// Records that could not be written.
    pub failed: u64,
}

/// Appends audit records to private shards, from any number of threads.
///
/// Shards are named `arena_results_<hostname>_<pid>.jsonl`, rotated ones
/// `arena_results_<hostname>_<pid>.<n>.jsonl`. The directory is opened component by component without
/// following symlinks (new directories get mode 0700), must be owned by the effective uid, and is set to 0700;
/// shards are opened append/no-follow, must be regular files owned by the effective uid, and are set to 0600.
/// Each record is written whole under one lock, so lines never interleave.
#[derive(Debug)]
pub struct AuditWriter {
    config: AuditConfig,
    dir: PathBuf,
    stem: String,
    state: Mutex<State>,
    written: AtomicU64,
    failed: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    shard: Option<Shard>,
    index: u64,
    last_error: Option<String>,
}

#[derive(Debug)]
struct Shard {
    file: File,
    len: u64,
}

fn writers() -> &'static Mutex<HashMap<PathBuf, Weak<AuditWriter>>> {
    static WRITERS: OnceLock<Mutex<HashMap<PathBuf, Weak<AuditWriter>>>> = OnceLock::new();
    WRITERS.get_or_init(Default::default)
}

impl AuditWriter {
    /// A writer for `config`. Nothing is touched on disk until the first record.
    pub fn new(config: AuditConfig) -> Result<Self> {
        let dir = config.check()?;
        Ok(Self {
            config,
            dir,
            stem: format!("arena_results_{}_{}", secure::hostname(), std::process::id()),
            state: Mutex::default(),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        })
    }

    /// The process's one writer for `config.dir`: the existing one if another worker made it, else a new one.
    /// Asking for the same directory with other settings is an error.
    pub fn shared(config: AuditConfig) -> Result<Arc<Self>> {
        let dir = config.check()?;
        let mut writers = writers().lock().unwrap_or_else(PoisonError::into_inner);
        writers.retain(|_, writer| writer.strong_count() > 0);
        if let Some(existing) = writers.get(&dir).and_then(Weak::upgrade) {
            if existing.config.max_raw_bytes == config.max_raw_bytes
                && existing.config.rotate_bytes == config.rotate_bytes
            {
                return Ok(existing);
            }
            return Err(Error::InvalidConfig(vec![format!(
                "an audit writer for {} already exists in this process with other settings",
                dir.display()
            )]));
        }
        let writer = Arc::new(Self::new(config)?);
        writers.insert(dir, Arc::downgrade(&writer));
        Ok(writer)
    }

    /// The absolute shard directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Appends one record. Returns whether it was written; a failure is logged and counted, never raised.
    pub fn append(&self, record: &AuditRecord) -> bool {
        self.append_line(&self.line(record), &record.task_id)
    }

    /// `record` as this writer writes it ([`AuditRecord::to_line`] with its `raw` limit).
    pub fn line(&self, record: &AuditRecord) -> String {
        record.to_line(self.config.max_raw_bytes)
    }

    /// Where the next record goes: the current shard at its current length, or later (another thread's record
    /// may come first, and a rotation moves on to the next shard). The position of a shard not yet opened
    /// is its start.
    pub fn position(&self) -> AuditPosition {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        AuditPosition {
            dir: self.dir.clone(),
            stem: self.stem.clone(),
            index: state.index,
            offset: state.shard.as_ref().map_or(0, |shard| shard.len),
        }
    }

    /// Appends a line made by [`AuditWriter::line`] (for task `task_id`, named in a failure's log line).
    /// Returns whether it was written; a failure is logged and counted, never raised.
    pub fn append_line(&self, line: &str, task_id: &str) -> bool {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        match self.write_line(&mut state, line.as_bytes()) {
            Ok(()) => {
                self.written.fetch_add(1, Ordering::Relaxed);
                true
            }
            Err(error) => {
                // Reopen on the next record: a failed write may have left a partial line, which the reopen
                // terminates before writing anything else.
                state.shard = None;
                self.failed.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    task_id = %task_id,
                    dir = %self.dir.display(),
                    "failed to persist arena result audit record: {error}"
                );
                state.last_error = Some(error);
                false
            }
        }
    }

    /// Appends one record and returns the `arena/result_dump_success` metric for it.
    pub fn append_with_metric(&self, record: &AuditRecord, scope: Scope) -> Metric {
        Lifecycle::ResultDumpSuccess.metric(scope, self.append(record))
    }

    /// Records written and records that failed.
    pub fn stats(&self) -> AuditStats {
        AuditStats {
            written: self.written.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    /// The last failure, for diagnostics.
    pub fn last_error(&self) -> Option<String> {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .last_error
            .clone()
    }

    /// The file name of shard `index`.
    pub fn shard_name(&self, index: u64) -> String {
        if index == 0 {
            format!("{}.jsonl", self.stem)
        } else {
            format!("{}.{index}.jsonl", self.stem)
        }
    }

    fn write_line(&self, state: &mut State, line: &[u8]) -> Result<(), String> {
        for _ in 0..MAX_ROTATION_PROBES {
            let shard = match &mut state.shard {
                Some(shard) => shard,
                None => state.shard.insert(self.open_shard(state.index)?),
            };
            let full = self
                .config
                .rotate_bytes
                .is_some_and(|limit| shard.len > 0 && shard.len + line.len() as u64 > limit);
            if full {
                state.shard = None;
                state.index += 1;
                continue;
            }
            shard
                .file
                .write_all(line)
                .map_err(|e| format!("writing {}: {e}", self.shard_name(state.index)))?;
            shard.len += line.len() as u64;
            return Ok(());
        }
        Err(format!(
            "no shard below the rotation size among {MAX_ROTATION_PROBES} names after {}",
            self.shard_name(state.index)
        ))
    }

    fn open_shard(&self, index: u64) -> Result<Shard, String> {
        let name = self.shard_name(index);
        let (file, len) = secure::open_shard(&self.dir, &name)?;
        Ok(Shard { file, len })
    }
}

/// A place in an [`AuditWriter`]'s shards ([`AuditWriter::position`]): byte `offset` of shard `index` of the
/// shards named `stem` in `dir`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditPosition {
    /// The absolute shard directory.
    pub dir: PathBuf,
    /// The shard name stem (`arena_results_<hostname>_<pid>`).
    pub stem: String,
    /// The shard's rotation index (0 is `<stem>.jsonl`, `n` is `<stem>.<n>.jsonl`).
    pub index: u64,
    /// The byte offset in that shard.
    pub offset: u64,
}

impl AuditPosition {
    /// The task ids of every complete record from this position on: the rest of its shard, then each later
    /// shard of the same stem up to the first missing one. A line a failed or killed write left unfinished
    /// is not a record. A resumed run reads what its killed process wrote after a journaled rollout this way,
    /// to find whether that rollout's record was written.
    pub fn task_ids_since(&self) -> std::io::Result<BTreeSet<String>> {
        use std::io::{BufRead as _, Seek as _};
        #[derive(Deserialize)]
        struct TaskId {
            task_id: String,
        }
        let mut ids = BTreeSet::new();
        for index in self.index.. {
            let name = if index == 0 {
                format!("{}.jsonl", self.stem)
            } else {
                format!("{}.{index}.jsonl", self.stem)
            };
            let mut file = match File::open(self.dir.join(name)) {
                Ok(file) => file,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => break,
                Err(e) => return Err(e),
            };
            if index == self.index {
                file.seek(std::io::SeekFrom::Start(self.offset))?;
            }
            let mut reader = std::io::BufReader::new(file);
            let mut line = Vec::new();
            loop {
                line.clear();
                if reader.read_until(b'\n', &mut line)? == 0 || !line.ends_with(b"\n") {
                    break;
                }
                if let Ok(record) = serde_json::from_slice::<TaskId>(&line) {
                    ids.insert(record.task_id);
                }
            }
        }
        Ok(ids)
    }
}

#[cfg(test)]
mod tests;
