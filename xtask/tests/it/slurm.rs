//! The real-Slurm test: `xtask submit --check-arena` on a one-node cluster on this machine, against a running
//! `arena-sim`, with `AREAL_CONTAINER_BIN=none`. The controller job runs under Slurm, and its
//! `preflight.json` is what the world implies.
//!
//! Where Slurm cannot be installed or started, the test says so on stderr and passes without running.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::cluster::{Cluster, Unavailable};

/// Distinctive credentials: none of them may appear in any file of the submission or in xtask's output.
const TOKEN: &str = "tok-slurm-7c1e5b90d2";
const LLM_KEY: &str = "llm-slurm-3f8a61c4e7";
const ADMIN_KEY: &str = "adm-slurm-92b0d5e13a";

/// The quickstart's two Streams (examples/configs/quickstart.yaml, which the `local` profile uses), each with
/// a published harness, the pinned grader, rows, and a history of two successes and one failure.
const WORLD: &str = r#"
token: tok-slurm-7c1e5b90d2
streams:
  - stream_id: sim-messages
    default_harness_ref: {key: claude-sim, version: "1"}
    default_reward_ref: {key: sim-grader, version: "1"}
    generated_rows: 6
    recent_tasks:
      - {status: DONE, harness_ref: {key: claude-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
      - {status: DONE, harness_ref: {key: claude-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
      - {status: HARNESS_FAILED, harness_ref: {key: claude-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
  - stream_id: sim-chat
    default_harness_ref: {key: chat-sim, version: "1"}
    default_reward_ref: {key: sim-grader, version: "1"}
    generated_rows: 4
    recent_tasks:
      - {status: DONE, harness_ref: {key: chat-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
harnesses:
  - {key: claude-sim, version: "1"}
  - {key: chat-sim, version: "1"}
"#;

/// Builds the binaries the jobs run (debug profile, the test's own target directory) and returns
/// (`arena-rl`, `arena-sim`).
fn binaries() -> (PathBuf, PathBuf) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let out = Command::new(env!("CARGO"))
        .args([
            "build",
            "-p",
            "arena-rl",
            "-p",
            "arena-sim",
            "--bins",
            "--message-format=json-render-diagnostics",
        ])
        .current_dir(root)
        .stderr(Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo build -p arena-rl -p arena-sim failed"
    );
    let mut found = (None, None);
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let exe = msg["executable"].as_str().map(PathBuf::from);
        match msg["target"]["name"].as_str() {
            Some("arena-rl") if exe.is_some() => found.0 = exe,
            Some("arena-sim") if exe.is_some() => found.1 = exe,
            _ => {}
        }
    }
    (
        found.0.expect("cargo built arena-rl"),
        found.1.expect("cargo built arena-sim"),
    )
}

/// A running `arena-sim`, stopped by its PID when dropped.
struct Sim {
    child: Child,
    base_url: String,
}

impl Sim {
    fn start(bin: &Path, world: &Path) -> Self {
        let mut child = Command::new(bin)
            .arg("--world")
            .arg(world)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("arena-sim starts");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("arena-sim prints its base URL");
        let base_url = line.trim().to_string();
        assert!(base_url.starts_with("http://"), "arena-sim printed {line:?}");
        Self { child, base_url }
    }
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("parent dir");
    std::fs::write(path, text).expect("write");
}

fn credentials(base_url: &str, admin: bool) -> String {
    let mut text = format!(
        "# Arena credentials for the Slurm test.\n\
         export ARENA_OPENAPI_BASE={base_url}\n\
         export ARENA_OPENAPI_TOKEN={TOKEN}\n\
         export ARENA_LLM_API_KEY={LLM_KEY}\n"
    );
    if admin {
        text.push_str(&format!("export SWE_RL_ADMIN_API_KEY={ADMIN_KEY}\n"));
    }
    text
}

/// Every file under `dir`, with its text.
fn files(dir: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).expect("readable dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            out.extend(files(&path));
        } else {
            let text = String::from_utf8_lossy(&std::fs::read(&path).expect("readable")).into_owned();
            out.push((path, text));
        }
    }
    out
}

fn assert_no_credentials(what: &str, text: &str) {
    for secret in [TOKEN, LLM_KEY, ADMIN_KEY] {
        assert!(!text.contains(secret), "{what} contains a credential");
    }
}

/// Everything a submission under Slurm needs: the cluster, the binaries, a running `arena-sim`, and a shared
/// directory with a model directory, a file root and credentials files.
///
/// A test of a whole training run uses it the same way as the `--check-arena` test below: `Site::start`, then
/// `submit` without `--check-arena`, then `cluster.wait_job` on the controller and on the id in `train.jobid`.
struct Site {
    // Dropped in this order: arena-sim, then the files, then the cluster's daemons.
    sim: Sim,
    work: tempfile::TempDir,
    arena_rl: PathBuf,
    cluster: Cluster,
}

impl Site {
    /// Starts the cluster and `arena-sim` serving `world`; `None` (after saying why) where Slurm is unavailable.
    fn start(world: &str) -> Option<Self> {
        let cluster = match Cluster::start() {
            Ok(c) => c,
            Err(Unavailable(reason)) => {
                eprintln!("SKIPPED: the real-Slurm test needs a one-node Slurm cluster: {reason}");
                return None;
            }
        };
        let (arena_rl, arena_sim) = binaries();
        let work = tempfile::Builder::new()
            .prefix("submit-")
            .tempdir_in("/tmp")
            .expect("work dir");
        let w = work.path();
        write(&w.join("world.yaml"), world);
        let sim = Sim::start(&arena_sim, &w.join("world.yaml"));
        std::fs::create_dir_all(w.join("model")).expect("model dir");
        std::fs::create_dir_all(w.join("runs")).expect("file root");
        Some(Self {
            sim,
            work,
            arena_rl,
            cluster,
        })
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }

    /// `xtask submit ARGS` with the host as the container and the credentials file `credentials` (under the
    /// work directory); returns the controller's job id after checking xtask's output holds no credential.
    fn submit(&self, trial: &str, credentials: &str, args: &[&str]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg("submit")
            .args(args)
            .env_clear()
            .envs(self.cluster.env())
            .env("HOME", self.work.path())
            .env("AREAL_CONTAINER_BIN", "none")
            .env("MODEL_PATH", self.path("model"))
            .env("AREAL_FILEROOT", self.path("runs"))
            .env("ARENA_CREDENTIALS_FILE", self.path(credentials))
            .env("ARENA_RL_BIN", &self.arena_rl)
            .env("ARENA_OPENAPI_BASE", &self.sim.base_url)
            .env("ARENA_SUPERVISE_INTERVAL", "1")
            .env("TRIAL_NAME", trial)
            // Set on the login node, never passed on: the credentials file is the only source.
            .env("ARENA_LLM_API_KEY", LLM_KEY)
            .output()
            .expect("xtask runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "xtask submit failed:\n{stderr}");
        assert_no_credentials("xtask's output", &format!("{stdout}{stderr}"));
        let job = stdout.trim().to_string();
        assert!(job.bytes().all(|b| b.is_ascii_digit()), "job id {job:?}");
        job
    }

    /// Waits for the controller `job` of `trial`; returns its final state and log.
    fn wait_controller(&self, trial: &str, job: &str) -> (String, String) {
        let state = self.cluster.wait_job(job, Duration::from_secs(120));
        let log =
            std::fs::read_to_string(self.path(&format!("runs/submissions/{trial}/controller-{job}.log")))
                .unwrap_or_default();
        (state, log)
    }
}

#[test]
fn check_arena_runs_the_preflight_under_slurm() {
    let Some(site) = Site::start(WORLD) else {
        return;
    };
    // The file's base URL is stale: the explicit launch value must win over it.
    write(
        &site.path("arena.env"),
        &credentials("http://127.0.0.1:9/stale", true),
    );
    write(&site.path("partial.env"), &credentials(&site.sim.base_url, false));
    let check = ["--check-arena", "--profile", "local"];

    // The complete credentials file: the controller runs the preflight and stops.
    let job = site.submit("slurm-check", "arena.env", &check);
    let (state, log) = site.wait_controller("slurm-check", &job);
    assert_eq!(
        state,
        "COMPLETED",
        "controller log:\n{log}\n{}",
        site.cluster.logs()
    );
    assert!(
        log.contains("controller: --check-arena: stopping before training"),
        "{log}"
    );
    let dir = site.path("runs/submissions/slurm-check");
    let preflight: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("preflight.json")).expect("preflight.json written"),
    )
    .expect("preflight.json is JSON");
    insta::assert_json_snapshot!("preflight", preflight);
    for (path, text) in files(&dir) {
        assert_no_credentials(&path.display().to_string(), &text);
    }
    // Slurm keeps each job's script and environment: no credential was handed to it.
    let state_dir = site.cluster.state_dir();
    let stored = files(&state_dir);
    assert!(
        stored.iter().any(|(_, text)| text.contains("slurm-check")),
        "the job's stored environment was not found under {}",
        state_dir.display()
    );
    for (path, text) in stored {
        assert_no_credentials(&path.display().to_string(), &text);
    }
    assert!(
        !dir.join("train.jobid").exists(),
        "--check-arena submitted a GPU job"
    );

    // Without SWE_RL_ADMIN_API_KEY the controller fails before the preflight, naming the variable.
    let job = site.submit("slurm-partial", "partial.env", &check);
    let (state, log) = site.wait_controller("slurm-partial", &job);
    assert_eq!(state, "FAILED", "controller log:\n{log}");
    assert!(
        log.contains("controller: SWE_RL_ADMIN_API_KEY is not set; export it from"),
        "{log}"
    );
    assert!(
        !site
            .path("runs/submissions/slurm-partial/preflight.json")
            .exists()
    );
}
