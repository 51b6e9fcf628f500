//! Weights & Biases through its official SDK: a supervised Python sidecar (`python/wandb_sidecar.py`) fed the
//! run's records as JSON lines over its stdin, in order.
//!
//! The sidecar is its own process group, so a Ctrl-C meant for arena-rl does not cut W&B's run short; when
//! arena-rl ends without finishing (killed), the sidecar reads end-of-file and finishes the run, which flushes
//! what it logged. If the sidecar dies, the run goes on with one warning and the records stay in
//! `metrics.jsonl`.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::mpsc;

use super::{Msg, State};

/// The sidecar's source, written next to the run's tracker state so the script matches the binary.
pub const SIDECAR: &str = include_str!("../../../python/wandb_sidecar.py");

/// How the run reaches W&B.
#[derive(Clone)]
pub struct Settings {
    /// The interpreter that has `wandb`.
    pub python: String,
    /// Project.
    pub project: String,
    /// Entity, if set.
    pub entity: String,
    /// Run display name.
    pub name: String,
    /// Run group.
    pub group: String,
    /// Tags.
    pub tags: Vec<String>,
    /// `online` or `offline`.
    pub mode: String,
    /// Where `wandb/` goes (`WANDB_DIR`, else the run's tracker folder).
    pub dir: PathBuf,
    /// The `WANDB_*` variables passed to the sidecar by name (values may be credentials).
    pub env: Vec<(String, SecretString)>,
    /// Bound of the queue to the sidecar.
    pub queue: usize,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("wandb::Settings")
            .field("project", &self.project)
            .field("name", &self.name)
            .field("mode", &self.mode)
            .field("env", &self.env.iter().map(|(k, _)| k).collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

/// Waits this long for the sidecar to finish the W&B run after the last record.
const FINISH_TIMEOUT: Duration = Duration::from_secs(120);

/// The background task: starts the sidecar, feeds it until [`Msg::Finish`] or the channel closes; returns how
/// many step records did not reach it.
pub(super) async fn run(settings: Settings, config: Value, state: State, mut rx: mpsc::Receiver<Msg>) -> u64 {
    let dir = state.dir().to_path_buf();
    let script = dir.join("wandb_sidecar.py");
    let log_path = dir.join("wandb-sidecar.log");
    let id = match state.get("id") {
        Some(id) => id,
        None => {
            let id = new_id();
            state.set("id", &id);
            id
        }
    };
    let spawned = spawn(&settings, &dir, &script, &log_path);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(
                python = %settings.python,
                error = %e,
                "W&B: cannot start the sidecar; the run goes on and its metrics stay in metrics.jsonl"
            );
            return super::drain(&mut rx).await;
        }
    };
    if let Some(pid) = child.id() {
        state.set("sidecar_pid", &pid.to_string());
    }
    let mut stdin = child.stdin.take().expect("stdin is piped");
    let init = json!({
        "type": "init",
        "id": id,
        "project": settings.project,
        "entity": settings.entity,
        "name": settings.name,
        "group": settings.group,
        "tags": settings.tags,
        "mode": settings.mode,
        "dir": settings.dir,
        "config": config,
    });
    let mut alive = send(&mut stdin, &init).await;
    // Steps written to the sidecar; those it never acknowledged in `wandb.step` are counted as lost at the end.
    let mut sent = Vec::new();
    let mut lost = 0u64;
    let mut finished = false;
    while let Some(msg) = rx.recv().await {
        match msg {
            Msg::Step { step, metrics, .. } => {
                if alive && !matches!(child.try_wait(), Ok(None)) {
                    alive = false;
                    sidecar_died(&log_path);
                }
                if !alive {
                    lost += 1;
                    continue;
                }
                let metrics: serde_json::Map<String, Value> =
                    metrics.into_iter().map(|(k, v)| (k, json!(v))).collect();
                alive = send(
                    &mut stdin,
                    &json!({"type": "log", "step": step, "metrics": metrics}),
                )
                .await;
                sent.push(step);
                if !alive {
                    sidecar_died(&log_path);
                }
            }
            Msg::Finish { curve, summary } => {
                if alive {
                    if let Some(path) = curve {
                        alive = send(
                            &mut stdin,
                            &json!({"type": "image", "key": "reward_curve", "path": path}),
                        )
                        .await;
                    }
                    if alive && send(&mut stdin, &json!({"type": "summary", "summary": summary})).await {
                        send(&mut stdin, &json!({"type": "finish"})).await;
                    }
                }
                finished = true;
                break;
            }
        }
    }
    drop(stdin);
    if finished {
        wait(child, &log_path).await;
    }
    let acked: Option<u64> = std::fs::read_to_string(dir.join("wandb.step"))
        .ok()
        .and_then(|t| t.trim().parse().ok());
    lost + sent.iter().filter(|s| acked.is_none_or(|a| **s > a)).count() as u64
}

fn sidecar_died(log_path: &std::path::Path) {
    tracing::warn!(
        log = %log_path.display(),
        "W&B: the sidecar exited; the run goes on and its metrics stay in metrics.jsonl (`wandb sync` uploads what it wrote)"
    );
}

/// Writes the sidecar script and starts it, its output going to `log_path`.
fn spawn(
    settings: &Settings,
    dir: &std::path::Path,
    script: &std::path::Path,
    log_path: &std::path::Path,
) -> std::io::Result<tokio::process::Child> {
    std::fs::write(script, SIDECAR)
        .and_then(|()| std::fs::create_dir_all(&settings.dir))
        .and_then(|()| std::fs::File::create(log_path))
        .and_then(|log| {
            let mut cmd = tokio::process::Command::new(&settings.python);
            cmd.arg("-u")
                .arg(script)
                .arg(dir.join("wandb.step"))
                .stdin(Stdio::piped())
                .stdout(log.try_clone()?)
                .stderr(log)
                .process_group(0)
                .env("WANDB_SILENT", "true");
            for (k, v) in &settings.env {
                cmd.env(k, v.expose_secret());
            }
            cmd.spawn()
        })
}

/// Waits (bounded) for the sidecar to finish the W&B run.
async fn wait(mut child: tokio::process::Child, log_path: &std::path::Path) {
    match tokio::time::timeout(FINISH_TIMEOUT, child.wait()).await {
        Ok(Ok(status)) if status.success() => {}
        Ok(Ok(status)) => tracing::warn!(
            %status,
            log = %log_path.display(),
            "W&B: the sidecar failed; the run's metrics are in metrics.jsonl"
        ),
        Ok(Err(e)) => tracing::warn!(error = %e, "W&B: cannot wait for the sidecar"),
        Err(_) => tracing::warn!(
            log = %log_path.display(),
            "W&B: the sidecar did not finish in time; it goes on in the background"
        ),
    }
}

async fn send(stdin: &mut tokio::process::ChildStdin, msg: &Value) -> bool {
    let mut line = msg.to_string();
    line.push('\n');
    stdin.write_all(line.as_bytes()).await.is_ok() && stdin.flush().await.is_ok()
}

/// A new W&B run id: 12 characters of lowercase letters and digits.
fn new_id() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let bytes: [u8; 12] = rand::random();
    bytes
        .iter()
        .map(|b| ALPHABET[*b as usize % ALPHABET.len()] as char)
        .collect()
}
