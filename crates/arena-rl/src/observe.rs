//! Observability of a run: per-step metrics to JSONL and TensorBoard event files, the reward-curve PNG, and
//! progress bars.
//!
//! Rollout metrics arrive as reward-routing's plain `(name, value)` records; [`StepMetrics`] averages every
//! name over one step (so 0/1 lifecycle flags become rates), and [`MetricsSink`] writes the averages as one
//! JSONL line and one TensorBoard scalar per name, except the reference's per-row records
//! (`debug/task/<data_id>/raw_reward`): their names grow with the dataset, so they go to `metrics.jsonl`
//! only, where the reference's contract wants them, and TensorBoard's tags stay a fixed set (the trackers
//! leave them out too, unless `metrics.trackers_per_row`).
//! `rollout/reward` is the mean training reward of the step before normalisation.

pub mod curve;
pub mod tfevents;
pub mod trackers;

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use crate::error::{Context as _, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use reward_routing::Metric;
use serde_json::{Map, Value, json};

use self::tfevents::EventWriter;

/// Metrics of one step, averaged per name.
#[derive(Debug, Default, Clone)]
pub struct StepMetrics {
    sums: BTreeMap<String, (f64, u64)>,
}

impl StepMetrics {
    /// Adds one record.
    pub fn add(&mut self, metric: &Metric) {
        self.add_value(&metric.name, metric.value);
    }

    /// Adds one value under `name`.
    pub fn add_value(&mut self, name: &str, value: f64) {
        if !value.is_finite() {
            return;
        }
        let slot = self.sums.entry(name.to_string()).or_insert((0.0, 0));
        slot.0 += value;
        slot.1 += 1;
    }

    /// Sets `name` to exactly `value` (replacing what was added).
    pub fn set(&mut self, name: &str, value: f64) {
        self.sums.insert(name.to_string(), (value, 1));
    }

    /// Adds every record.
    pub fn extend<'a>(&mut self, metrics: impl IntoIterator<Item = &'a Metric>) {
        for m in metrics {
            self.add(m);
        }
    }

    /// The mean of `name`, if any value was added.
    pub fn mean(&self, name: &str) -> Option<f64> {
        self.sums.get(name).map(|(s, n)| s / *n as f64)
    }

    /// Every name with its mean, sorted by name.
    pub fn means(&self) -> Vec<(String, f64)> {
        self.sums
            .iter()
            .map(|(k, (s, n))| (k.clone(), s / *n as f64))
            .collect()
    }

    /// Merges another step's records into this one.
    pub fn merge(&mut self, other: &StepMetrics) {
        for (k, (s, n)) in &other.sums {
            let slot = self.sums.entry(k.clone()).or_insert((0.0, 0));
            slot.0 += s;
            slot.1 += n;
        }
    }
}

/// Where a run's metrics go.
pub struct MetricsSink {
    dir: PathBuf,
    jsonl: Option<File>,
    tensorboard: Option<EventWriter>,
    rewards: Vec<(u64, f64)>,
    eval_rewards: Vec<(u64, f64)>,
    trackers: Option<trackers::Trackers>,
    /// Whether steps wait for [`MetricsSink::durable_through`] before reaching the trackers.
    trackers_at_checkpoint: bool,
    /// Steps written but not yet handed to the trackers (see [`MetricsSink::durable_through`]).
    pending: Vec<(u64, Vec<(String, f64)>)>,
}

impl MetricsSink {
    /// Opens the sinks under `dir` (JSONL appended, so a resumed run continues the same file). A run that
    /// resumes at step `resume_at` first forgets what an earlier process wrote for that step and later ones
    /// (and a torn last line or record a kill left), in `metrics.jsonl` and in every TensorBoard event file,
    /// so that each step it trains again appears once.
    pub fn open(dir: &Path, jsonl: bool, tensorboard: bool, resume_at: Option<u64>) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        if let Some(step) = resume_at {
            forget_from(dir, step)?;
        }
        let jsonl = jsonl
            .then(|| {
                let path = dir.join("metrics.jsonl");
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&path)
                    .with_context(|| format!("cannot open {}", path.display()))
            })
            .transpose()?;
        let tensorboard = tensorboard
            .then(|| EventWriter::create(&dir.join("tensorboard"), &hostname()))
            .transpose()?;
        let mut sink = Self {
            dir: dir.to_path_buf(),
            jsonl,
            tensorboard,
            rewards: Vec::new(),
            eval_rewards: Vec::new(),
            trackers: None,
            trackers_at_checkpoint: false,
            pending: Vec::new(),
        };
        sink.load_history();
        Ok(sink)
    }

    /// Reads earlier steps' rewards back from `metrics.jsonl`, so a resumed run's curve starts at step 0.
    fn load_history(&mut self) {
        let Ok(text) = std::fs::read_to_string(self.dir.join("metrics.jsonl")) else {
            return;
        };
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(step) = v["step"].as_u64() else { continue };
            if let Some(r) = v["rollout/reward"].as_f64() {
                self.rewards.retain(|(s, _)| *s != step);
                self.rewards.push((step, r));
            }
            if let Some(r) = v["eval-rollout/reward"].as_f64() {
                self.eval_rewards.retain(|(s, _)| *s != step);
                self.eval_rewards.push((step, r));
            }
        }
    }

    /// Feeds `trackers` too: each step as it is written, or with `at_checkpoint` once
    /// [`MetricsSink::durable_through`] says a resumed run will not train it again (`metrics.trackers_at_checkpoint`).
    pub fn with_trackers(mut self, trackers: Option<trackers::Trackers>, at_checkpoint: bool) -> Self {
        self.trackers = trackers;
        self.trackers_at_checkpoint = at_checkpoint;
        self
    }

    /// Hands the trackers every written step up to `step`: a kill from now on resumes after it, so no tracker
    /// sees a step twice.
    pub fn durable_through(&mut self, step: u64) {
        let Some(trackers) = &self.trackers else {
            return;
        };
        let (ready, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.pending)
            .into_iter()
            .partition(|(s, _)| *s <= step);
        self.pending = later;
        // Released by a checkpoint, steps arrive many at once however long each took: MLflow gets them whole.
        for (s, means) in ready {
            trackers.send(s, &means, self.trackers_at_checkpoint);
        }
    }

    /// Ends the trackers: every pending step, the reward curve and `summary`, waiting (bounded) for each to
    /// send what it holds.
    pub async fn close_trackers(&mut self, curve: Option<&Path>, summary: &Value) {
        self.durable_through(u64::MAX);
        if let Some(trackers) = self.trackers.take() {
            trackers.finish(curve, summary).await;
        }
    }

    /// The metrics directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Writes one step's metrics.
    pub fn write_step(&mut self, step: u64, metrics: &StepMetrics) -> Result<()> {
        let means = metrics.means();
        if let Some(r) = metrics.mean("rollout/reward") {
            self.rewards.push((step, r));
        }
        if let Some(r) = metrics.mean("eval-rollout/reward") {
            self.eval_rewards.push((step, r));
        }
        if let Some(f) = &mut self.jsonl {
            let mut line = Map::new();
            line.insert("step".into(), json!(step));
            for (k, v) in &means {
                line.insert(k.clone(), json!(v));
            }
            let mut text =
                serde_json::to_string(&Value::Object(line)).context("serialising a metrics.jsonl line")?;
            text.push('\n');
            f.write_all(text.as_bytes())
                .context("cannot append to metrics.jsonl")?;
        }
        if self.trackers.is_some() {
            self.pending.push((step, means.clone()));
            if !self.trackers_at_checkpoint {
                self.durable_through(step);
            }
        }
        if let Some(tb) = &mut self.tensorboard {
            let bounded: Vec<(String, f64)> = means.into_iter().filter(|(k, _)| !per_row(k)).collect();
            tb.scalars(step as i64, &bounded)?;
        }
        Ok(())
    }

    /// `(step, rollout/reward)` of every step so far.
    pub fn rewards(&self) -> &[(u64, f64)] {
        &self.rewards
    }

    /// Draws `reward_curve.png` in the metrics directory.
    pub fn draw_curve(&self) -> Result<PathBuf> {
        let path = self.dir.join("reward_curve.png");
        curve::draw(&path, &self.rewards, &self.eval_rewards)?;
        Ok(path)
    }

    /// The TensorBoard event file, if any.
    pub fn tensorboard_path(&self) -> Option<&Path> {
        self.tensorboard.as_ref().map(EventWriter::path)
    }
}

/// Replaces `path`'s contents with `data` through a synced temporary file and a rename, so a kill leaves
/// either the old file or the new one. The temporary name has no `tfevents` in it, so that TensorBoard never
/// reads a half-written one.
fn replace_file(path: &Path, data: &[u8]) -> Result<()> {
    let tmp = path.with_file_name(".arena-rl-rewrite.tmp");
    std::fs::write(&tmp, data)
        .and_then(|()| File::open(&tmp)?.sync_all())
        .and_then(|()| std::fs::rename(&tmp, path))
        .with_context(|| format!("cannot rewrite {}", path.display()))
}

/// Drops every record of step `step` and later from `metrics.jsonl` and the TensorBoard event files under
/// `dir`, with any torn tail; files that hold none are left untouched.
fn forget_from(dir: &Path, step: u64) -> Result<()> {
    let jsonl = dir.join("metrics.jsonl");
    if let Ok(text) = std::fs::read_to_string(&jsonl) {
        let kept: Vec<&str> = text
            .lines()
            .filter(|line| {
                serde_json::from_str::<Value>(line)
                    .ok()
                    .and_then(|v| v["step"].as_u64())
                    .is_some_and(|s| s < step)
            })
            .collect();
        if kept.len() != text.lines().count() || !(text.is_empty() || text.ends_with('\n')) {
            let body: String = kept.iter().map(|l| format!("{l}\n")).collect();
            replace_file(&jsonl, body.as_bytes())?;
            tracing::info!(
                from_step = step,
                dropped = text.lines().count() - kept.len(),
                "metrics.jsonl: the resumed run forgets the steps it trains again"
            );
        }
    }
    let Ok(files) = std::fs::read_dir(dir.join("tensorboard")) else {
        return Ok(());
    };
    for file in files.flatten() {
        let path = file.path();
        if !path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("events.out.tfevents."))
        {
            continue;
        }
        let (events, whole) = tfevents::read_good_events(&path)?;
        let kept: Vec<tfevents::Event> = events
            .iter()
            .filter(|e| e.file_version.is_some() || e.step < step as i64)
            .cloned()
            .collect();
        if !whole || kept.len() != events.len() {
            tfevents::rewrite_events(&path, &kept)?;
        }
    }
    Ok(())
}

/// Whether a metric is a per-row record (`debug/task/<data_id>/...`), one name per dataset row.
pub(crate) fn per_row(name: &str) -> bool {
    name.strip_prefix(reward_routing::DEBUG_SCOPE)
        .is_some_and(|rest| rest.starts_with("/task/"))
}

/// This machine's hostname (for event file names).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// A progress bar for one phase (`rollouts` or `training`), hidden when not on a terminal or disabled.
pub fn phase_bar(enabled: bool, phase: &str, len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(
        Some(len),
        if enabled {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        },
    );
    let style = ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(phase.to_string());
    bar
}

#[cfg(test)]
mod tests;
