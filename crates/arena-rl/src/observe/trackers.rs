//! Experiment trackers (`metrics.trackers`): Weights & Biases through its SDK in a sidecar, MLflow over its
//! REST API.
//!
//! Each tracker is a background task behind a bounded queue: [`Trackers::step`] never waits, and a record the
//! queue cannot take is counted and reported at the end (it is in `metrics.jsonl` either way). A tracker that
//! fails logs one warning and the run goes on.
//!
//! The metrics sink hands a step to the trackers as it is written, or with `metrics.trackers_at_checkpoint`
//! once the checkpoint that covers it is saved (then a resumed run's trackers hold exactly `metrics.jsonl`);
//! a tracker never takes a step twice: each tracker keeps its run id and the last step it took in the run's
//! `trackers/` folder, and a resumed run continues that run and replays from `metrics.jsonl` the steps it
//! missed. Every tracker gets the run config redacted by stream-config's [`stream_config::redact`].
//!
//! The per-row records (`debug/task/<data_id>/...`) stay in `metrics.jsonl` only unless
//! `metrics.trackers_per_row` is set, as for TensorBoard: one name per dataset row is thousands of one-point
//! metrics in a tracker's UI, and a tracking server stores every one.

pub mod mlflow;
pub mod wandb;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use secrecy::SecretString;
use serde_json::Value;
use stream_config::{Env, RunConfig, Seconds, Secrets, Tracker};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::error::{Context as _, Result};

/// What a tracker task receives.
#[derive(Debug)]
pub(crate) enum Msg {
    /// One step's metric means; `whole` when it must not be thinned: a resumed run replays it from
    /// `metrics.jsonl`, or a checkpoint released it with others at once (`metrics.trackers_at_checkpoint`), so
    /// its arrival says nothing of how fast the run steps.
    Step {
        step: u64,
        metrics: Vec<(String, f64)>,
        whole: bool,
    },
    /// The end of the run: the reward curve, if drawn, and the run's summary.
    Finish { curve: Option<PathBuf>, summary: Value },
}

/// The trackers a run feeds and how to reach them, resolved from the config and the environment.
#[derive(Debug, Clone, Default)]
pub struct TrackerSettings {
    /// W&B, when listed.
    pub wandb: Option<wandb::Settings>,
    /// MLflow, when listed.
    pub mlflow: Option<mlflow::Settings>,
    /// The redacted run config every tracker records.
    pub config: Value,
    /// Whether the per-row records (`debug/task/<data_id>/...`) reach the trackers
    /// (`metrics.trackers_per_row`); otherwise they stay in `metrics.jsonl` only.
    pub per_row: bool,
}

impl TrackerSettings {
    /// Resolves `metrics.trackers` (names default from `experiment_name` and `trial_name`; credentials are
    /// read from the environment only) and redacts the config by `secrets`.
    pub fn resolve(config: &RunConfig, env: &Env, secrets: &Secrets, run_dir: &Path) -> Result<Self> {
        let m = &config.metrics;
        if m.trackers.is_empty() {
            return Ok(Self::default());
        }
        let pick = |set: &str, var: &str, default: &str| -> String {
            if !set.is_empty() {
                set.to_string()
            } else {
                env.get(var)
                    .filter(|v| !v.is_empty())
                    .unwrap_or(default)
                    .to_string()
            }
        };
        let wandb = m.trackers.contains(&Tracker::Wandb).then(|| wandb::Settings {
            python: pick(&m.wandb.python, "ARENA_RL_WANDB_PYTHON", "python3"),
            project: pick(&m.wandb.project, "WANDB_PROJECT", &config.experiment_name),
            entity: pick(&m.wandb.entity, "WANDB_ENTITY", ""),
            name: if m.wandb.name.is_empty() {
                config.trial_name.clone()
            } else {
                m.wandb.name.clone()
            },
            group: if m.wandb.group.is_empty() {
                config.experiment_name.clone()
            } else {
                m.wandb.group.clone()
            },
            tags: m.wandb.tags.clone(),
            mode: match m.wandb.mode {
                Some(mode) => mode.as_str().to_string(),
                None => pick("", "WANDB_MODE", "online"),
            },
            dir: env
                .get("WANDB_DIR")
                .filter(|d| !d.is_empty())
                .map_or_else(|| run_dir.join("trackers"), PathBuf::from),
            env: env
                .iter()
                .filter(|(k, _)| k.starts_with("WANDB_"))
                .map(|(k, v)| (k.to_string(), SecretString::from(v.to_string())))
                .collect(),
            queue: m.wandb.queue as usize,
        });
        let mlflow = m.trackers.contains(&Tracker::Mlflow).then(|| mlflow::Settings {
            uri: pick(&m.mlflow.tracking_uri, "MLFLOW_TRACKING_URI", "")
                .trim_end_matches('/')
                .to_string(),
            token: env
                .get("MLFLOW_TRACKING_TOKEN")
                .filter(|t| !t.is_empty())
                .map(|t| SecretString::from(t.to_string())),
            basic: env
                .get("MLFLOW_TRACKING_USERNAME")
                .filter(|u| !u.is_empty())
                .map(|u| {
                    (
                        u.to_string(),
                        SecretString::from(env.get("MLFLOW_TRACKING_PASSWORD").unwrap_or("").to_string()),
                    )
                }),
            experiment: pick(
                &m.mlflow.experiment,
                "MLFLOW_EXPERIMENT_NAME",
                &config.experiment_name,
            ),
            run_name: if m.mlflow.run_name.is_empty() {
                config.trial_name.clone()
            } else {
                m.mlflow.run_name.clone()
            },
            tags: m.mlflow.tags.clone().into_iter().collect(),
            queue: m.mlflow.queue as usize,
            backoff: Duration::from_millis(250),
            min_interval: m
                .mlflow
                .min_interval_seconds
                .map_or(Duration::ZERO, Seconds::duration),
        });
        // The trackers' own credentials are secrets by value too, wherever they might appear.
        let mut secrets = secrets.clone();
        for name in [
            "WANDB_API_KEY",
            "MLFLOW_TRACKING_TOKEN",
            "MLFLOW_TRACKING_PASSWORD",
        ] {
            if let Some(v) = env.get(name) {
                secrets.add(v);
            }
        }
        let config = config.to_redacted_json(&secrets)?;
        Ok(Self {
            wandb,
            mlflow,
            config,
            per_row: m.trackers_per_row,
        })
    }

    /// Whether no tracker is listed.
    pub fn is_empty(&self) -> bool {
        self.wandb.is_none() && self.mlflow.is_none()
    }
}

/// A small JSON file of string values under the run's `trackers/` folder (a tracker's run id and last step),
/// rewritten through a rename on each change.
#[derive(Clone)]
pub(crate) struct State {
    dir: PathBuf,
    path: PathBuf,
    values: Arc<Mutex<BTreeMap<String, String>>>,
}

impl State {
    fn open(dir: &Path, name: &str) -> Self {
        let path = dir.join(format!("{name}.json"));
        let values = std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or_default();
        Self {
            dir: dir.to_path_buf(),
            path,
            values: Arc::new(Mutex::new(values)),
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    pub(crate) fn get(&self, key: &str) -> Option<String> {
        self.values.lock().expect("not poisoned").get(key).cloned()
    }

    pub(crate) fn set(&self, key: &str, value: &str) {
        let mut values = self.values.lock().expect("not poisoned");
        values.insert(key.to_string(), value.to_string());
        let text = serde_json::to_string_pretty(&*values).unwrap_or_default();
        let tmp = self.path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, text).and_then(|()| std::fs::rename(&tmp, &self.path)) {
            tracing::warn!(path = %self.path.display(), error = %e, "cannot save a tracker's state");
        }
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Counts what arrives after a tracker gave up, until the run finishes.
pub(crate) async fn drain(rx: &mut mpsc::Receiver<Msg>) -> u64 {
    let mut lost = 0;
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Step { .. } => lost += 1,
            Msg::Finish { .. } => break,
        }
    }
    lost
}

struct Feed {
    name: &'static str,
    tx: mpsc::Sender<Msg>,
    /// The last step this tracker took in an earlier process; later processes skip it and what came before.
    last: Option<u64>,
    overflow: Arc<AtomicU64>,
    task: JoinHandle<u64>,
}

/// The running trackers of one run.
pub struct Trackers {
    feeds: Vec<Feed>,
    /// Whether per-row records are sent (see [`TrackerSettings::per_row`]).
    per_row: bool,
}

/// How long [`Trackers::finish`] waits for each tracker to send what it holds.
const FINISH_WAIT: Duration = Duration::from_secs(180);

impl Trackers {
    /// Starts every tracker in `settings`, keeping state under `run_dir/trackers`. A resumed run (`resume_at`)
    /// replays from `metrics_dir/metrics.jsonl` the steps before `resume_at` that a tracker did not take.
    pub fn start(
        settings: &TrackerSettings,
        run_dir: &Path,
        metrics_dir: &Path,
        resume_at: Option<u64>,
    ) -> Result<Self> {
        let dir = run_dir.join("trackers");
        std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let mut feeds = Vec::new();
        if let Some(w) = &settings.wandb {
            let state = State::open(&dir, "wandb");
            let last = std::fs::read_to_string(dir.join("wandb.step"))
                .ok()
                .and_then(|t| t.trim().parse().ok());
            let (tx, rx) = mpsc::channel(w.queue.max(1));
            let task = tokio::spawn(wandb::run(w.clone(), settings.config.clone(), state, rx));
            feeds.push(Feed {
                name: "wandb",
                tx,
                last,
                overflow: Arc::default(),
                task,
            });
        }
        if let Some(m) = &settings.mlflow {
            let state = State::open(&dir, "mlflow");
            let last = state.get("last_step").and_then(|t| t.parse().ok());
            let (tx, rx) = mpsc::channel(m.queue.max(1));
            let task = tokio::spawn(mlflow::run(m.clone(), settings.config.clone(), state, rx));
            feeds.push(Feed {
                name: "mlflow",
                tx,
                last,
                overflow: Arc::default(),
                task,
            });
        }
        let trackers = Self {
            feeds,
            per_row: settings.per_row,
        };
        if let Some(resume_at) = resume_at {
            trackers.replay(&metrics_dir.join("metrics.jsonl"), resume_at);
        }
        Ok(trackers)
    }

    /// Sends the steps of `metrics.jsonl` before `resume_at` that a tracker has not taken.
    fn replay(&self, jsonl: &Path, resume_at: u64) {
        let Ok(text) = std::fs::read_to_string(jsonl) else {
            return;
        };
        for line in text.lines() {
            let Ok(Value::Object(map)) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            let Some(step) = map.get("step").and_then(Value::as_u64) else {
                continue;
            };
            if step >= resume_at {
                continue;
            }
            let metrics: Vec<(String, f64)> = map
                .iter()
                .filter(|(k, _)| k.as_str() != "step")
                .filter_map(|(k, v)| Some((k.clone(), v.as_f64()?)))
                .collect();
            self.send(step, &metrics, true);
        }
    }

    /// Queues one step for every tracker that has not taken it, without its per-row records unless
    /// [`TrackerSettings::per_row`]; never waits.
    pub fn step(&self, step: u64, metrics: &[(String, f64)]) {
        self.send(step, metrics, false);
    }

    /// [`Trackers::step`], marking the step `whole` (see [`Msg::Step`]) when it arrives with others at once.
    pub(crate) fn send(&self, step: u64, metrics: &[(String, f64)], whole: bool) {
        let sent: Vec<(String, f64)> = metrics
            .iter()
            .filter(|(name, _)| self.per_row || !super::per_row(name))
            .cloned()
            .collect();
        for feed in &self.feeds {
            if feed.last.is_some_and(|last| step <= last) {
                continue;
            }
            let msg = Msg::Step {
                step,
                metrics: sent.clone(),
                whole,
            };
            if feed.tx.try_send(msg).is_err() && feed.overflow.fetch_add(1, Ordering::Relaxed) == 0 {
                tracing::warn!(
                    tracker = feed.name,
                    step,
                    "the tracker's queue is full; steps it cannot take stay in metrics.jsonl"
                );
            }
        }
    }

    /// Sends the reward curve and the summary, then waits (bounded) for every tracker to finish; returns
    /// `(tracker, steps it did not get)` for each.
    pub async fn finish(mut self, curve: Option<&Path>, summary: &Value) -> Vec<(&'static str, u64)> {
        let mut report = Vec::new();
        let feeds = std::mem::take(&mut self.feeds);
        // Every tracker finishes at once (W&B's sidecar and MLflow's last requests overlap), then each is waited
        // for in turn.
        let mut finishing = Vec::new();
        for feed in feeds {
            let msg = Msg::Finish {
                curve: curve.map(Path::to_path_buf),
                summary: summary.clone(),
            };
            let _ = tokio::time::timeout(FINISH_WAIT, feed.tx.send(msg)).await;
            finishing.push((feed.name, feed.overflow, feed.task));
        }
        for (name, overflow, task) in finishing {
            let lost = match tokio::time::timeout(FINISH_WAIT, task).await {
                Ok(Ok(lost)) => lost,
                _ => {
                    tracing::warn!(tracker = name, "the tracker did not finish in time");
                    0
                }
            };
            let missed = lost + overflow.load(Ordering::Relaxed);
            if missed > 0 {
                tracing::warn!(
                    tracker = name,
                    steps = missed,
                    "steps did not reach the tracker; they are in metrics.jsonl"
                );
            }
            report.push((name, missed));
        }
        report
    }
}

impl Drop for Trackers {
    /// A run that ends without [`Trackers::finish`] (an error) stops its trackers as a kill would: MLflow's
    /// requests stop, and the W&B sidecar reads end-of-file and finishes its run on its own.
    fn drop(&mut self) {
        for feed in &self.feeds {
            feed.task.abort();
        }
    }
}
