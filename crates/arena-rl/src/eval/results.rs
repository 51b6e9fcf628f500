//! `results.jsonl`: one line per evaluated sample (its Stream, domain, task, sample index, Arena status,
//! reward, whether it passed, and the routing's disposition), appended as groups finish.
//!
//! The journal decides what runs again; this file only reports. A rerun reads it back, cuts a torn last
//! line a kill left, and appends only samples it does not hold, each group's lines in one write followed by
//! an fsync, so every sample appears once.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use reward_routing::RewardRule;
use serde::{Deserialize, Serialize};

use super::stats::Sample;
use crate::error::{Context as _, Error, Result};
use crate::journal::{RolloutRecord, Verdict};

/// One evaluated sample.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultLine {
    /// The journal's sample key (`e0g<task index>:<sample>`).
    pub key: String,
    /// The Stream's name.
    pub stream: String,
    /// The task type (`domain:` tag).
    pub domain: String,
    /// The task: the row's `data_id` (the manifest's `env:key@version` reference).
    pub task_id: String,
    /// The sample's index among the task's samples.
    pub sample: u32,
    /// Arena's task id, when one was launched.
    pub arena_task: Option<String>,
    /// Arena's terminal status, when the task finished.
    pub status: Option<String>,
    /// The routed reward; `None` when the sample is excluded.
    pub reward: Option<f64>,
    /// Whether the reward counts as solved under the Stream's rule (reward above 0, or at or above its
    /// threshold); `None` when excluded.
    pub passed: Option<bool>,
    /// `success`, or the failure disposition (`model_failure_zero` counts as a failed sample;
    /// `system_failure_reject` and `unknown_failure_reject` exclude it).
    pub disposition: String,
}

impl ResultLine {
    /// The line of a finished rollout; `rule` is its Stream's reward rule.
    pub fn of(record: &RolloutRecord, rule: Option<&RewardRule>) -> Self {
        let (status, disposition, reward) = match &record.routing {
            Some(r) => {
                // A model failure without any interaction has no trajectory to train on, but for an
                // evaluation it is the model's failure all the same.
                let reward = r
                    .reward
                    .or((r.disposition == "model_failure_zero").then_some(0.0));
                (r.status.clone(), r.disposition.clone(), reward)
            }
            None => {
                let reason = match &record.verdict {
                    Verdict::Rejected { reason, .. } | Verdict::Dropped { reason } => reason.clone(),
                    Verdict::Reward { .. } => "unrouted".to_string(),
                };
                (None, reason, None)
            }
        };
        Self {
            key: record.key.to_string(),
            stream: record.stream.clone(),
            domain: record.task_type.clone(),
            task_id: record.data_id.clone(),
            sample: record.key.sample,
            arena_task: record.task_id.clone(),
            status,
            reward,
            passed: reward.map(|r| rule.map_or(r > 0.0, |rule| rule.is_solved(r))),
            disposition,
        }
    }

    /// The sample as the statistics see it.
    pub fn sample(&self) -> Sample {
        Sample {
            stream: self.stream.clone(),
            domain: self.domain.clone(),
            task: self.task_id.clone(),
            scored: self.reward.zip(self.passed),
        }
    }
}

/// An open `results.jsonl`.
pub struct ResultsFile {
    path: PathBuf,
    file: File,
    recorded: BTreeSet<String>,
    lines: Vec<ResultLine>,
}

impl ResultsFile {
    /// Opens (or creates) `path`, reading back what it holds and cutting a torn last line.
    pub fn open(path: &Path) -> Result<Self> {
        let text = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let complete = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
        let mut lines = Vec::new();
        for (n, line) in text[..complete].split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let parsed: ResultLine = serde_json::from_slice(line).map_err(|e| {
                Error::Invalid(format!(
                    "{} line {}: not an eval result: {e}",
                    path.display(),
                    n + 1
                ))
            })?;
            lines.push(parsed);
        }
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("cannot open {}", path.display()))?;
        if complete < text.len() {
            tracing::warn!(path = %path.display(), "cut a torn last line (the evaluation was killed mid-write)");
            file.set_len(complete as u64)
                .with_context(|| format!("cannot cut the torn line of {}", path.display()))?;
        }
        Ok(Self {
            path: path.to_path_buf(),
            file,
            recorded: lines.iter().map(|l| l.key.clone()).collect(),
            lines,
        })
    }

    /// Appends the lines whose samples it does not hold yet, in one write and an fsync; returns how many.
    pub fn append(&mut self, lines: Vec<ResultLine>) -> Result<usize> {
        let new: Vec<ResultLine> = lines
            .into_iter()
            .filter(|l| !self.recorded.contains(&l.key))
            .collect();
        if new.is_empty() {
            return Ok(0);
        }
        let mut buf = Vec::new();
        for line in &new {
            serde_json::to_writer(&mut buf, line).context("serialising an eval result")?;
            buf.push(b'\n');
        }
        self.file
            .write_all(&buf)
            .and_then(|()| self.file.sync_data())
            .with_context(|| format!("cannot append to {}", self.path.display()))?;
        self.recorded.extend(new.iter().map(|l| l.key.clone()));
        let n = new.len();
        self.lines.extend(new);
        Ok(n)
    }

    /// Every line it holds, in file order.
    pub fn lines(&self) -> &[ResultLine] {
        &self.lines
    }

    /// Whether it holds the sample `key`.
    pub fn holds(&self, key: &str) -> bool {
        self.recorded.contains(key)
    }
}

#[cfg(test)]
mod tests;
