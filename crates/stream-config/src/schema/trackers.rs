//! The `metrics.trackers`, `metrics.wandb` and `metrics.mlflow` settings: which experiment trackers a run
//! feeds, and how each names the run.
//!
//! Credentials never live here: W&B reads `WANDB_API_KEY` and MLflow `MLFLOW_TRACKING_TOKEN` (or
//! `MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD`) from the environment, so a saved config holds none;
//! a tracking URI with a user or password in it is refused.

use serde::{Deserialize, Serialize};

use crate::env::Env;
use crate::error::Collector;
use crate::path::KeyPath;
use crate::schema::Seconds;

/// An experiment tracker a run can feed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tracker {
    /// Weights & Biases, through its official Python SDK in a sidecar process.
    Wandb,
    /// MLflow, over its tracking server's REST API.
    Mlflow,
}

/// Whether W&B sends records as they come (`online`) or writes them under `WANDB_DIR` for `wandb sync`
/// (`offline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WandbMode {
    /// Stream to the W&B server.
    Online,
    /// Write local run files only; `wandb sync` uploads them later.
    Offline,
}

impl WandbMode {
    /// The SDK's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Online => "online",
            Self::Offline => "offline",
        }
    }
}

/// The `metrics.wandb` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WandbSection {
    /// W&B project; empty means `WANDB_PROJECT`, else `experiment_name`.
    pub project: String,
    /// W&B entity (user or team); empty means `WANDB_ENTITY`, else the API key's default entity.
    pub entity: String,
    /// Run display name; empty means `trial_name`.
    pub name: String,
    /// Run group; empty means `experiment_name`, so a project's trials group by experiment.
    pub group: String,
    /// Run tags.
    pub tags: Vec<String>,
    /// `online` or `offline`; null means `WANDB_MODE`, else `online`.
    pub mode: Option<WandbMode>,
    /// The Python interpreter that has the `wandb` package; empty means `ARENA_RL_WANDB_PYTHON`, else
    /// `python3`.
    pub python: String,
    /// Most step records queued for the sidecar; further ones are counted and dropped from the queue (they stay
    /// in `metrics.jsonl`).
    pub queue: u32,
}

impl Default for WandbSection {
    fn default() -> Self {
        Self {
            project: String::new(),
            entity: String::new(),
            name: String::new(),
            group: String::new(),
            tags: Vec::new(),
            mode: None,
            python: String::new(),
            queue: 4096,
        }
    }
}

/// The `metrics.mlflow` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MlflowSection {
    /// The tracking server's `http://` or `https://` URL; empty means `MLFLOW_TRACKING_URI`. No credentials in
    /// it: they come from `MLFLOW_TRACKING_TOKEN` or `MLFLOW_TRACKING_USERNAME`/`MLFLOW_TRACKING_PASSWORD`.
    pub tracking_uri: String,
    /// Experiment name, created when missing; empty means `MLFLOW_EXPERIMENT_NAME`, else `experiment_name`.
    pub experiment: String,
    /// Run name; empty means `trial_name`.
    pub run_name: String,
    /// Run tags (`key: value`).
    pub tags: std::collections::BTreeMap<String, String>,
    /// Most step records buffered for the server (queued or waiting for a retry); further ones are counted and
    /// dropped (they stay in `metrics.jsonl`).
    pub queue: u32,
    /// The server stores at most one value of each metric per this many seconds: the steps that arrive within
    /// it go in one request holding each metric's newest value with its step (a metric a step leaves out keeps
    /// its own newest), and the run's last step always goes. A run whose steps take longer loses nothing; null
    /// sends every step. Steps replayed after a resume, and with `metrics.trackers_at_checkpoint` (they arrive at
    /// each checkpoint, many at once), go whole. `metrics.jsonl`, TensorBoard and W&B keep every
    /// step either way.
    pub min_interval_seconds: Option<Seconds>,
}

impl Default for MlflowSection {
    fn default() -> Self {
        Self {
            tracking_uri: String::new(),
            experiment: String::new(),
            run_name: String::new(),
            tags: Default::default(),
            queue: 4096,
            min_interval_seconds: Some(Seconds::of(MLFLOW_MIN_INTERVAL_SECONDS)),
        }
    }
}

/// The default of `metrics.mlflow.min_interval_seconds`: a step that takes longer is stored whole; a faster
/// run (a quickstart's steps take a fraction of a second) gets a point per metric every 10 s (the interval at
/// which MLflow's own system metrics are sampled), which a tracking server shared by a team stores at a small
/// fraction of the cost of every step.
const MLFLOW_MIN_INTERVAL_SECONDS: f64 = 10.0;

/// Characters W&B refuses in a project name.
const WANDB_PROJECT_FORBIDDEN: &[char] = &['/', '\\', '#', '?', '%', ':'];

pub(crate) fn validate(
    trackers: &[Tracker],
    wandb: &WandbSection,
    mlflow: &MlflowSection,
    path: &KeyPath,
    env: &Env,
    c: &mut Collector,
) {
    for (i, t) in trackers.iter().enumerate() {
        if trackers[..i].contains(t) {
            c.push(
                path.key("trackers"),
                format!("lists {:?} twice", format!("{t:?}").to_lowercase()),
            );
        }
    }
    let w = path.key("wandb");
    if wandb.project.contains(WANDB_PROJECT_FORBIDDEN) {
        c.push(
            w.key("project"),
            format!("{:?} must not contain / \\ # ? % or :", wandb.project),
        );
    }
    for (i, tag) in wandb.tags.iter().enumerate() {
        if tag.trim().is_empty() || tag.len() > 64 {
            c.push(
                w.key("tags"),
                format!("tag {i} must be 1 to 64 characters, got {tag:?}"),
            );
        }
    }
    if wandb.queue == 0 {
        c.push(w.key("queue"), "must be >= 1, got 0");
    }
    if trackers.contains(&Tracker::Wandb)
        && wandb.mode.is_none()
        && let Some(mode) = env.get("WANDB_MODE")
        && !matches!(mode, "" | "online" | "offline" | "disabled" | "dryrun" | "run")
    {
        c.push(
            w.key("mode"),
            format!("is unset and WANDB_MODE is {mode:?}; set metrics.wandb.mode to online or offline"),
        );
    }
    let m = path.key("mlflow");
    if mlflow.queue == 0 {
        c.push(m.key("queue"), "must be >= 1, got 0");
    }
    if let Some(interval) = mlflow.min_interval_seconds {
        interval.check(c, m.key("min_interval_seconds"));
    }
    for key in mlflow.tags.keys() {
        if key.trim().is_empty() {
            c.push(m.key("tags"), "a tag key must not be empty");
        }
    }
    let (uri, place) = if mlflow.tracking_uri.is_empty() {
        (
            env.get("MLFLOW_TRACKING_URI").unwrap_or(""),
            "MLFLOW_TRACKING_URI",
        )
    } else {
        (mlflow.tracking_uri.as_str(), "")
    };
    let uri_path = m.key("tracking_uri");
    if trackers.contains(&Tracker::Mlflow) && uri.is_empty() {
        c.push(
            uri_path.clone(),
            "is required when metrics.trackers lists mlflow (or set MLFLOW_TRACKING_URI)",
        );
    }
    if !uri.is_empty() {
        let from = if place.is_empty() {
            String::new()
        } else {
            format!(" (from {place})")
        };
        // The URI itself is never shown: a malformed one may hold a credential.
        if let Some(problem) = tracking_uri_problem(uri) {
            c.push(uri_path, format!("{problem}{from}"));
        }
    }
}

/// What is wrong with an MLflow tracking URI, without repeating it (it might carry a password).
fn tracking_uri_problem(uri: &str) -> Option<&'static str> {
    let Some(rest) = uri
        .strip_prefix("http://")
        .or_else(|| uri.strip_prefix("https://"))
    else {
        return Some("must be an http:// or https:// URL of an MLflow tracking server");
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.is_empty() || rest.contains(char::is_whitespace) {
        return Some("must be an http:// or https:// URL with a host");
    }
    if authority.contains('@') {
        return Some(
            "must not hold a user or password: set MLFLOW_TRACKING_TOKEN, or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD",
        );
    }
    None
}
