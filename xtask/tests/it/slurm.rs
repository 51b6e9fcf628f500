//! The real-Slurm tests, on a one-node cluster on this machine with `AREAL_CONTAINER_BIN=none`, against a
//! running `arena-sim`: `xtask submit --check-arena` (the controller job runs under Slurm, and its
//! `preflight.json` is what the world implies), and a real `xtask submit --profile local` whose controller
//! submits the train job, which trains the quickstart's tiny policy for two steps; both jobs end COMPLETED.
//!
//! Where Slurm cannot be installed or started, the tests say so on stderr and pass without running.

use std::ffi::OsStr;
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

/// The quickstart's two Streams (the ids and harnesses of examples/configs/quickstart.yaml) serving `sum`
/// tasks ("What is 7 + 5?"), graded with partial credit for any integer near the sum, one turn of at most 32
/// tokens: even the untrained tiny policy gets rewards that differ within a group now and then, so GRPO steps
/// reach the trainer (the lookup tasks of the quickstart preset need a tool call it never makes).
const SUMS_WORLD: &str = r#"
token: tok-slurm-7c1e5b90d2
llm_api_key: llm-slurm-3f8a61c4e7
streams:
  - stream_id: sim-messages
    default_harness_ref: {key: claude-sim, version: "1"}
    default_reward_ref: {key: sim-grader, version: "1"}
    generated_rows: 64
    task_family: sum
    recent_tasks:
      - {status: DONE, harness_ref: {key: claude-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
      - {status: DONE, harness_ref: {key: claude-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
  - stream_id: sim-chat
    default_harness_ref: {key: chat-sim, version: "1"}
    default_reward_ref: {key: sim-grader, version: "1"}
    generated_rows: 64
    task_family: sum
    recent_tasks:
      - {status: DONE, harness_ref: {key: chat-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
      - {status: DONE, harness_ref: {key: chat-sim, version: "1"}, reward_ref: {key: sim-grader, version: "1"}}
harnesses:
  - {key: claude-sim, version: "1"}
  - {key: chat-sim, version: "1"}
runners:
  claude-sim: {kind: anthropic, max_turns: 1, max_tokens: 32}
  chat-sim: {kind: chat, max_turns: 1, max_tokens: 32}
"#;

/// Builds the binaries the jobs run (debug profile, the test's own target directory) and returns
/// (`arena-rl`, `arena-sim`).
pub(crate) fn binaries() -> (PathBuf, PathBuf) {
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

/// The world an `arena-sim` serves.
enum SimWorld<'a> {
    /// A YAML world; its `token` must be [`TOKEN`].
    Yaml(&'a str),
    /// The built-in quickstart world (`--preset quickstart`), given the test's token and LLM key through the
    /// environment, never on the command line.
    Quickstart,
}

impl Sim {
    fn start(bin: &Path, args: &[&OsStr], envs: &[(&str, &str)]) -> Self {
        let mut child = Command::new(bin)
            .args(args)
            .envs(envs.iter().copied())
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
/// The training test uses it the same way as the `--check-arena` test: `Site::start`, then `prepare_policy`
/// (the model the train job loads), then `submit` without `--check-arena`, then `wait_controller` and
/// `cluster.job_state` on the id in `train.jobid`.
struct Site {
    // Dropped in this order: arena-sim, then the files, then the cluster's daemons.
    sim: Sim,
    work: tempfile::TempDir,
    arena_rl: PathBuf,
    /// `MODEL_PATH` of the submissions: an empty directory until `prepare_policy`.
    model: PathBuf,
    cluster: Cluster,
}

impl Site {
    /// Starts the cluster and `arena-sim` serving `world`; `None` (after saying why) where Slurm is unavailable.
    fn start(world: SimWorld<'_>) -> Option<Self> {
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
        let sim = match world {
            SimWorld::Yaml(text) => {
                let path = w.join("world.yaml");
                write(&path, text);
                Sim::start(&arena_sim, &["--world".as_ref(), path.as_os_str()], &[])
            }
            SimWorld::Quickstart => Sim::start(
                &arena_sim,
                &["--preset".as_ref(), "quickstart".as_ref()],
                &[("ARENA_SIM_TOKEN", TOKEN), ("ARENA_SIM_LLM_API_KEY", LLM_KEY)],
            ),
        };
        let model = w.join("model");
        std::fs::create_dir_all(&model).expect("model dir");
        std::fs::create_dir_all(w.join("runs")).expect("file root");
        Some(Self {
            sim,
            work,
            arena_rl,
            model,
            cluster,
        })
    }

    /// Builds the quickstart's tiny policy without its supervised warm-up (`arena-rl quickstart
    /// --prepare-policy --warmup-steps 0`, about a second) under the work directory, and makes it the
    /// submissions' `MODEL_PATH`.
    fn prepare_policy(&mut self) {
        let fileroot = self.path("policy");
        let out = Command::new(&self.arena_rl)
            .args(["quickstart", "--prepare-policy", "--warmup-steps", "0"])
            .arg(format!("cluster.fileroot={}", fileroot.display()))
            .env_clear()
            .env("HOME", self.work.path())
            .env("PATH", crate::cluster::path_with_sbin())
            .output()
            .expect("arena-rl quickstart --prepare-policy runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "arena-rl quickstart --prepare-policy failed:\n{stderr}"
        );
        let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        assert!(
            dir.starts_with(&fileroot) && dir.join("config.json").is_file(),
            "arena-rl quickstart --prepare-policy printed {dir:?}, not a model folder under {}",
            fileroot.display()
        );
        self.model = dir;
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }

    /// `xtask submit ARGS` with the host as the container and the credentials file `credentials` (under the
    /// work directory); returns the controller's job id after checking xtask's output holds no credential.
    fn submit(&self, trial: &str, credentials: &str, args: &[&str]) -> String {
        self.submit_with(trial, credentials, args, &[])
    }

    /// [`Site::submit`] with more launch variables.
    fn submit_with(&self, trial: &str, credentials: &str, args: &[&str], vars: &[(&str, String)]) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_xtask"))
            .arg("submit")
            .args(args)
            .env_clear()
            .envs(self.cluster.env())
            .env("HOME", self.work.path())
            .env("AREAL_CONTAINER_BIN", "none")
            .env("MODEL_PATH", &self.model)
            .env("AREAL_FILEROOT", self.path("runs"))
            .env("ARENA_CREDENTIALS_FILE", self.path(credentials))
            .env("ARENA_RL_BIN", &self.arena_rl)
            .env("ARENA_OPENAPI_BASE", &self.sim.base_url)
            .env("ARENA_SUPERVISE_INTERVAL", "1")
            .env("TRIAL_NAME", trial)
            // Set on the login node, never passed on: the credentials file is the only source.
            .env("ARENA_LLM_API_KEY", LLM_KEY)
            .envs(vars.iter().map(|(k, v)| (*k, v)))
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

    /// Waits up to `limit` for the controller `job` of `trial`; returns its final state and log.
    fn wait_controller(&self, trial: &str, job: &str, limit: Duration) -> (String, String) {
        let state = self.cluster.wait_job(job, limit);
        let log =
            std::fs::read_to_string(self.path(&format!("runs/submissions/{trial}/controller-{job}.log")))
                .unwrap_or_default();
        (state, log)
    }
}

/// How long a controller that only runs the preflight may take.
const PREFLIGHT_LIMIT: Duration = Duration::from_secs(120);

#[test]
fn check_arena_runs_the_preflight_under_slurm() {
    let Some(site) = Site::start(SimWorld::Yaml(WORLD)) else {
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
    let (state, log) = site.wait_controller("slurm-check", &job, PREFLIGHT_LIMIT);
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
    let (state, log) = site.wait_controller("slurm-partial", &job, PREFLIGHT_LIMIT);
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

/// How long the training submission may take: the preflight, the train job's two steps of the tiny policy in a
/// debug build (about 10 s here), and Slurm's scheduling, with room for a loaded machine.
const TRAIN_LIMIT: Duration = Duration::from_secs(600);

#[test]
fn submit_trains_the_local_profile_for_two_steps_under_slurm() {
    let Some(mut site) = Site::start(SimWorld::Quickstart) else {
        return;
    };
    site.prepare_policy();
    write(&site.path("arena.env"), &credentials(&site.sim.base_url, true));
    let trial = "slurm-train";
    // The local profile's knobs are the quickstart-sized run: batch 2, 2 samples, 2 steps.
    let job = site.submit(trial, "arena.env", &["--profile", "local"]);
    let (state, log) = site.wait_controller(trial, &job, TRAIN_LIMIT);
    let dir = site.path(&format!("runs/submissions/{trial}"));
    let train_job = std::fs::read_to_string(dir.join("train.jobid"))
        .map(|t| t.trim().to_string())
        .unwrap_or_default();
    let train_log = std::fs::read_to_string(dir.join(format!("train-{train_job}.log"))).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "controller log:\n{log}\ntrain log:\n{train_log}\n{}",
        site.cluster.logs()
    );
    assert!(log.contains("controller: preflight passed"), "{log}");
    assert!(dir.join("preflight.json").is_file(), "no preflight.json");
    assert!(
        log.contains(&format!("controller: the GPU job {train_job} ended: COMPLETED")),
        "{log}"
    );
    assert_eq!(
        site.cluster.job_state(&train_job).as_deref(),
        Some("COMPLETED"),
        "the train job's state; its log:\n{train_log}"
    );
    assert!(
        train_log.contains("train: trial slurm-train: trainer on ")
            && train_log.contains("policy servers: in-process"),
        "{train_log}"
    );
    assert!(
        train_log.contains("train: the trainer exited with status 0"),
        "{train_log}"
    );

    // `arena-rl train` ran in the run directory of the profile's fileroot and trial, for two steps.
    let run = site.path(&format!("runs/arena-local/{trial}"));
    assert!(
        train_log.contains(&format!("trained 2 step(s) in {}", run.display())),
        "{train_log}"
    );
    let metrics = std::fs::read_to_string(run.join("metrics/metrics.jsonl")).expect("metrics.jsonl written");
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a metrics line is JSON");
            v["step"].as_u64().expect("a metrics line has a step")
        })
        .collect();
    assert_eq!(steps, [0, 1], "metrics.jsonl:\n{metrics}");
    // The run config the trainer saved holds the profile's knobs: context 2048 as the micro-batch budget,
    // max_new_tokens 64 (under max_tokens 2047), concurrency 4.
    let saved = run.join("config.yaml");
    let config = stream_config::load_run_config(&saved, &[], &stream_config::Env::from_pairs([("", ""); 0]))
        .unwrap_or_else(|e| panic!("{} does not load: {e}", saved.display()));
    assert_eq!(
        (
            config.actor.max_tokens_per_mb,
            config.gconfig.max_new_tokens,
            config.rollout.max_concurrent_rollouts,
        ),
        (2048, 64, Some(4)),
        "{}",
        saved.display()
    );
    let checkpoint = run.join("checkpoints/step-2");
    let manifest: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(checkpoint.join("checkpoint.json")).expect("checkpoint.json written"),
    )
    .expect("checkpoint.json is JSON");
    assert_eq!(manifest["step"], 2, "{manifest}");
    assert!(checkpoint.join("model.safetensors").is_file());

    // No credential in the submission, the run's outputs (config, journal, results, checkpoint), or the jobs'
    // scripts and environments that Slurm stored, the train job's included.
    for (path, text) in files(&site.path("runs")) {
        assert_no_credentials(&path.display().to_string(), &text);
    }
    let stored = files(&site.cluster.state_dir());
    assert!(
        stored.iter().any(|(_, text)| text.contains("--step trainer")),
        "the train job's stored script was not found under {}",
        site.cluster.state_dir().display()
    );
    for (path, text) in stored {
        assert_no_credentials(&path.display().to_string(), &text);
    }
}

#[test]
fn rollout_only_runs_the_rollout_loop_under_slurm() {
    let Some(mut site) = Site::start(SimWorld::Quickstart) else {
        return;
    };
    site.prepare_policy();
    write(&site.path("arena.env"), &credentials(&site.sim.base_url, true));
    let trial = "slurm-rollout";
    // local: batch 2 x 2 samples, so 6 rollouts take 2 steps (8 rollouts).
    let job = site.submit(trial, "arena.env", &["--profile", "local", "--rollout-only", "6"]);
    let (state, log) = site.wait_controller(trial, &job, TRAIN_LIMIT);
    let dir = site.path(&format!("runs/submissions/{trial}"));
    let train_job = std::fs::read_to_string(dir.join("train.jobid"))
        .map(|t| t.trim().to_string())
        .unwrap_or_default();
    let train_log = std::fs::read_to_string(dir.join(format!("train-{train_job}.log"))).unwrap_or_default();
    assert_eq!(
        state, "COMPLETED",
        "controller log:\n{log}\ntrain log:\n{train_log}"
    );
    let run = site.path(&format!("runs/arena-local/{trial}"));
    assert!(
        train_log.contains(&format!("rolled out 2 step(s) in {}", run.display())),
        "{train_log}"
    );
    let rollouts = std::fs::read_to_string(run.join("rollouts.jsonl")).expect("rollouts.jsonl written");
    assert!(rollouts.lines().count() >= 6, "{rollouts}");
    assert!(
        !run.join("checkpoints/step-2/model.safetensors").exists(),
        "rollout-only trained"
    );
}

/// A free TCP port on every interface.
fn free_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Watches this machine's processes while a job runs: the FSDP2 worker's key, read from the environment of
/// the process that runs `arena_rl_fsdp2`, and every command line seen, so the test can check that the key
/// was never an argument.
struct ProcessWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<(Option<String>, std::collections::HashSet<String>)>,
}

impl ProcessWatch {
    fn start() -> Self {
        use std::sync::atomic::Ordering;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let (mut key, mut lines) = (None, std::collections::HashSet::new());
            while !flag.load(Ordering::Relaxed) {
                for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                    let dir = entry.path();
                    let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
                        continue;
                    };
                    let line = String::from_utf8_lossy(&cmdline).replace('\0', " ");
                    if key.is_none() && line.contains("arena_rl_fsdp2") {
                        key = std::fs::read(dir.join("environ")).ok().and_then(|env| {
                            env.split(|&b| b == 0).find_map(|var| {
                                let var = String::from_utf8_lossy(var);
                                var.strip_prefix("ARENA_RL_TRAINER_API_KEY=").map(str::to_string)
                            })
                        });
                    }
                    lines.insert(line);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            (key, lines)
        });
        Self { stop, thread }
    }

    fn finish(self) -> (Option<String>, std::collections::HashSet<String>) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().expect("the watch thread")
    }
}

/// The `local` profile with a two-rank FSDP2 worker (`ACTOR_LAYOUT=fsdp2:d2`: CPU ranks over gloo): the
/// train job starts `torchrun` with c10d rendezvous on its trainer node, `arena-rl train` attaches to rank 0
/// under the job's own random key, trains two steps of the quickstart's tiny policy, and both jobs end
/// COMPLETED; the key is in no command line, no file of the submission or the run, and nothing Slurm stored.
#[test]
fn fsdp2_trains_the_local_profile_with_a_two_rank_worker_under_slurm() {
    let python = std::env::var("ARENA_RL_PY_TORCH").unwrap_or_else(|_| {
        panic!("ARENA_RL_PY_TORCH is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
    });
    let Some(mut site) = Site::start(SimWorld::Yaml(SUMS_WORLD)) else {
        return;
    };
    site.prepare_policy();
    write(&site.path("arena.env"), &credentials(&site.sim.base_url, true));
    let trial = "slurm-fsdp2";
    let watch = ProcessWatch::start();
    let python_override = format!("actor.fsdp2.python={python}");
    let port = free_port().to_string();
    // Four groups of eight a step: a group whose rewards differ, which the worker trains on, is all but
    // certain in two steps (one in eight groups had one with the profile's 2 x 2).
    let job = site.submit_with(
        trial,
        "arena.env",
        &[
            "--profile",
            "local",
            &python_override,
            "train_dataset.batch_size=4",
            "gconfig.n_samples=8",
        ],
        &[
            ("ACTOR_LAYOUT", "fsdp2:d2".into()),
            ("ARENA_RL_TRAINER_PORT", port.clone()),
            ("ARENA_RL_RDZV_PORT", free_port().to_string()),
        ],
    );
    let (state, log) = site.wait_controller(trial, &job, TRAIN_LIMIT);
    let (key, command_lines) = watch.finish();
    let dir = site.path(&format!("runs/submissions/{trial}"));
    let train_job = std::fs::read_to_string(dir.join("train.jobid"))
        .map(|t| t.trim().to_string())
        .unwrap_or_default();
    let train_log = std::fs::read_to_string(dir.join(format!("train-{train_job}.log"))).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "controller log:\n{log}\ntrain log:\n{train_log}\n{}",
        site.cluster.logs()
    );
    assert_eq!(
        site.cluster.job_state(&train_job).as_deref(),
        Some("COMPLETED"),
        "the train job's state; its log:\n{train_log}"
    );
    for want in [
        "train: fsdp2 worker: 2 rank(s) on each of ",
        "train: the loop attaches to the fsdp2 worker's rank 0 at ",
        // Rank 0 of the worker says so on the job's log, and logs each operation: the first GRPO step the
        // loop sent it was trained on both ranks.
        ", world size 2, device cpu",
        " init done in ",
        " step grpo step 0 done in ",
        " save done in ",
        "train: the trainer exited with status 0",
    ] {
        assert!(train_log.contains(want), "{want:?} missing from:\n{train_log}");
    }
    let run = site.path(&format!("runs/arena-local/{trial}"));
    assert!(
        train_log.contains(&format!("trained 2 step(s) in {}", run.display())),
        "{train_log}"
    );
    let metrics = std::fs::read_to_string(run.join("metrics/metrics.jsonl")).expect("metrics.jsonl written");
    let steps: Vec<u64> = metrics
        .lines()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("a metrics line is JSON");
            v["step"].as_u64().expect("a metrics line has a step")
        })
        .collect();
    assert_eq!(steps, [0, 1], "metrics.jsonl:\n{metrics}");
    // The loop ran with the layout's backend, attached to the worker the job started.
    let saved = run.join("config.yaml");
    let config = stream_config::load_run_config(&saved, &[], &stream_config::Env::from_pairs([("", ""); 0]))
        .unwrap_or_else(|e| panic!("{} does not load: {e}", saved.display()));
    assert_eq!(config.actor.backend, stream_config::TrainerBackend::Fsdp2);
    assert_eq!(config.actor.fsdp2.nproc_per_node, 2);
    assert!(
        config
            .actor
            .fsdp2
            .attach
            .as_deref()
            .is_some_and(|a| a.ends_with(&format!(":{port}"))),
        "attach {:?}, ARENA_RL_TRAINER_PORT {port}",
        config.actor.fsdp2.attach
    );
    // The worker saved its sharded state with the final checkpoint, one file a rank.
    let state = run.join("checkpoints/step-2/trainer");
    for rank in ["__0_0.distcp", "__1_0.distcp", "trainer.json"] {
        assert!(state.join(rank).is_file(), "no {rank} in {}", state.display());
    }

    // The job's trainer key: in the worker's environment, never on a command line or in a file.
    let key = key.expect("the fsdp2 worker's process and its ARENA_RL_TRAINER_API_KEY were seen");
    assert_eq!(key.len(), 64, "a random 32-byte key in hex");
    assert!(
        command_lines
            .iter()
            .any(|l| l.contains("arena_rl_fsdp2 --listen")),
        "the worker's command line was not seen"
    );
    for line in &command_lines {
        assert!(!line.contains(&key), "a command line holds the trainer key");
    }
    let mut stored = files(&site.path("runs"));
    stored.extend(files(&site.cluster.state_dir()));
    for (path, text) in stored {
        assert!(!text.contains(&key), "{} holds the trainer key", path.display());
        assert_no_credentials(&path.display().to_string(), &text);
    }
}

/// `--eval` on the `local` profile: the train job runs `arena-rl eval` on the quickstart's tiny policy
/// (a model folder) over `--streams sim-chat` (three `sum` rows here) twice each; both jobs end COMPLETED,
/// `eval/candidate/results.jsonl` under the run folder holds the 3 x 2 samples, `eval/report.txt` the
/// table, nothing was trained, and no credential is in any file of the submission or the evaluation.
#[test]
fn eval_runs_arena_rl_eval_under_slurm() {
    let world = SUMS_WORLD.replace("generated_rows: 64", "generated_rows: 3");
    let Some(mut site) = Site::start(SimWorld::Yaml(&world)) else {
        return;
    };
    site.prepare_policy();
    write(&site.path("arena.env"), &credentials(&site.sim.base_url, true));
    let trial = "slurm-eval";
    let checkpoint = site.model.display().to_string();
    let job = site.submit(
        trial,
        "arena.env",
        &[
            "--profile",
            "local",
            "--eval",
            "--checkpoint",
            &checkpoint,
            "--streams",
            "sim-chat",
            "--samples",
            "2",
        ],
    );
    let (state, log) = site.wait_controller(trial, &job, TRAIN_LIMIT);
    let dir = site.path(&format!("runs/submissions/{trial}"));
    let train_job = std::fs::read_to_string(dir.join("train.jobid"))
        .map(|t| t.trim().to_string())
        .unwrap_or_default();
    let train_log = std::fs::read_to_string(dir.join(format!("train-{train_job}.log"))).unwrap_or_default();
    assert_eq!(
        state,
        "COMPLETED",
        "controller log:\n{log}\ntrain log:\n{train_log}\n{}",
        site.cluster.logs()
    );
    assert_eq!(
        site.cluster.job_state(&train_job).as_deref(),
        Some("COMPLETED"),
        "the train job's state; its log:\n{train_log}"
    );
    let run = site.path(&format!("runs/arena-local/{trial}"));
    let out = run.join("eval");
    assert!(
        train_log.contains("pass rate [95% CI]")
            && train_log.contains("stream/sim-chat")
            && train_log.contains(&format!("results: {}", out.display())),
        "{train_log}"
    );
    let results =
        std::fs::read_to_string(out.join("candidate/results.jsonl")).expect("results.jsonl written");
    let lines: Vec<serde_json::Value> = results
        .lines()
        .map(|l| serde_json::from_str(l).expect("a result line is JSON"))
        .collect();
    assert_eq!(lines.len(), 6, "3 tasks x 2 samples:\n{results}");
    assert!(lines.iter().all(|l| l["stream"] == "sim-chat"), "{results}");
    let tasks: std::collections::BTreeSet<&str> =
        lines.iter().filter_map(|l| l["task_id"].as_str()).collect();
    assert_eq!(tasks.len(), 3, "{results}");
    let report = std::fs::read_to_string(out.join("report.txt")).expect("report.txt written");
    assert!(report.contains("stream/sim-chat"), "{report}");
    assert!(out.join("eval.png").is_file(), "no eval.png");
    assert!(!run.join("checkpoints").exists(), "--eval trained");
    for (path, text) in files(&dir).into_iter().chain(files(&out)) {
        assert_no_credentials(&path.display().to_string(), &text);
    }
}
