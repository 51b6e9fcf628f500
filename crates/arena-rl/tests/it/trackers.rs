//! Experiment trackers against the real components: a real `mlflow server` on loopback (SQLite backend), read
//! back through MLflow's own client (`mlflow.tracking.MlflowClient`), and the official `wandb` SDK in offline
//! mode, its offline run files read back record by record.
//!
//! wandb 0.31 no longer ships its Python reader of run files (`wandb.sdk.internal.datastore.DataStore` was
//! removed with the move to `wandb-core`), so the reader here parses the file's LevelDB-log framing (`:W&B`
//! header, 32 KiB blocks, FULL/FIRST/MIDDLE/LAST chunks, as `DataStore` did) and decodes every record with the
//! wandb package's own protobuf schema, `wandb.proto.wandb_internal_pb2.Record`.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use arena_rl::observe::trackers::mlflow::mlflow_key;
use arena_rl::observe::trackers::{TrackerSettings, Trackers};
use arena_rl::observe::{MetricsSink, StepMetrics};
use serde_json::{Value, json};
use stream_config::{Env, RunConfig, Tracker, WandbMode};

const WANDB_SECRET: &str = "wandb-api-key-0123456789abcdef0123456789";
const MLFLOW_SECRET: &str = "mlflow-token-fedcba9876543210";
const CONFIG_SECRET: &str = "arena-openapi-token-5f5f5f5f5f";

const MLFLOW_READER: &str = r#"
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
run = client.get_run(sys.argv[2])
history = {k: [[m.step, m.value] for m in client.get_metric_history(run.info.run_id, k)] for k in run.data.metrics}
artifacts = [a.path for a in client.list_artifacts(run.info.run_id)]
print(json.dumps({"params": run.data.params, "history": history, "artifacts": artifacts,
                  "status": run.info.status, "name": run.info.run_name, "tags": run.data.tags}))
"#;

const WANDB_READER: &str = r#"
import glob, json, struct, sys
from wandb.proto import wandb_internal_pb2

def records(path):
    data = open(path, "rb").read()
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert ident == b":W&B" and magic == 0xBEE1, (ident, magic)
    pos, buf = 7, b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 and length == 0:
            break
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        buf = chunk if kind in (1, 2) else buf + chunk
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(buf)
            yield rec

files = sorted(glob.glob(sys.argv[1] + "/wandb/offline-run-*/run-*.wandb"))
history, config, summary, runs = [], {}, {}, []
for f in files:
    for rec in records(f):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            runs.append({"id": rec.run.run_id, "project": rec.run.project, "name": rec.run.display_name,
                         "group": rec.run.run_group, "tags": list(rec.run.tags)})
            for item in rec.run.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in rec.config.update:
                config[item.key] = json.loads(item.value_json)
        elif kind == "history":
            row = {(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item}
            history.append(row)
        elif kind == "summary":
            for item in rec.summary.update:
                summary[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
print(json.dumps({"files": len(files), "runs": runs, "history": history, "config": config, "summary": summary}))
"#;

fn python_out(python: &Path, script: &str, args: &[&str]) -> Value {
    python_out_with(python, script, args, &[])
}

fn python_out_with(python: &Path, script: &str, args: &[&str], env: &[(&str, &str)]) -> Value {
    let out = Command::new(python)
        .arg("-c")
        .arg(script)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("python runs");
    assert!(
        out.status.success(),
        "reader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("reader prints JSON")
}

/// The `mlflow server` process group: the server starts uvicorn, a job runner and task consumers as children,
/// so the whole group is killed, or they would outlive the test.
struct Server(std::process::Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(group) = rustix::process::Pid::from_raw(self.0.id() as i32) {
            let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
        }
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Starts `mlflow server` on loopback with a SQLite backend and its artifact proxy; waits for `/health`.
async fn mlflow_server(python: &Path, dir: &Path) -> (Server, String) {
    mlflow_server_with(python, dir, None).await
}

/// [`mlflow_server`], with MLflow's basic-auth app on when `auth` names its config file (admin user and
/// password, the permission database).
async fn mlflow_server_with(python: &Path, dir: &Path, auth: Option<&Path>) -> (Server, String) {
    let port = free_port();
    let log = std::fs::File::create(dir.join("mlflow-server.log")).expect("log");
    let mut command = Command::new(python);
    if let Some(config) = auth {
        command
            .env("MLFLOW_AUTH_CONFIG_PATH", config)
            .env("MLFLOW_FLASK_SERVER_SECRET_KEY", "csrf-key-for-this-test")
            .args(["-m", "mlflow", "server", "--app-name", "basic-auth"]);
    } else {
        command.args(["-m", "mlflow", "server"]);
    }
    let child = command
        .args(["--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--backend-store-uri")
        .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
        .arg("--artifacts-destination")
        .arg(dir.join("mlartifacts"))
        .args(["--workers", "1"])
        .current_dir(dir)
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("mlflow server starts");
    let server = Server(child);
    let uri = format!("http://127.0.0.1:{port}");
    let _ = rustls::crypto::ring::default_provider().install_default();
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = http.get(format!("{uri}/health")).send().await
            && r.status().is_success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "mlflow server did not answer: {}",
            std::fs::read_to_string(dir.join("mlflow-server.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (server, uri)
}

/// The metrics of step `step` in a session (`session` changes the values, so a step trained again differs).
fn step_metrics(step: u64, session: u64) -> StepMetrics {
    let mut m = StepMetrics::default();
    m.set("rollout/reward", 0.25 * step as f64 + 0.01 * session as f64);
    m.set("actor/loss", 1.0 / (step as f64 + 1.0));
    m.set("debug/task/row#1/raw_reward", step as f64);
    m
}

/// Waits until `cond` holds, polling (a condition of another process, not a guessed delay).
async fn wait_for(what: &str, cond: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Fields of `/proc/PID/stat` after the command name (which may hold spaces): the first is field 3, the state.
fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 1..];
    Some(rest.split_whitespace().map(str::to_string).collect())
}

/// A process's scheduling policy (`/proc/PID/stat` field 41: 0 normal, 5 SCHED_IDLE).
fn scheduling_policy(pid: u32) -> Option<u32> {
    proc_stat_fields(pid)?.get(41 - 3)?.parse().ok()
}

/// The processes whose parent is `pid` (field 4).
fn children_of(pid: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            proc_stat_fields(*child)
                .and_then(|f| f.get(1)?.parse::<u32>().ok())
                .is_some_and(|parent| parent == pid)
        })
        .collect()
}

fn read_state(dir: &Path, name: &str) -> Value {
    std::fs::read_to_string(dir.join(name))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null)
}

fn files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            files_under(&path, out);
        } else {
            out.push(path);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlflow_and_wandb_get_every_step_the_config_and_no_secret_across_a_kill_and_resume() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_TRACKERS").map(PathBuf::from) else {
        eprintln!(
            "skipping: ARENA_RL_PY_TRACKERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, uri) = mlflow_server(&python, tmp.path()).await;
    let run_dir = tmp.path().join("run");
    let metrics_dir = run_dir.join("metrics");
    let wandb_dir = tmp.path().join("wandb-dir");

    let mut config = RunConfig {
        experiment_name: "exp".into(),
        trial_name: "trial-1".into(),
        ..RunConfig::default()
    };
    config.metrics.trackers = vec![Tracker::Wandb, Tracker::Mlflow];
    // Every metric, the per-row record (`debug/task/row#1/...`, whose `#` MLflow refuses) included.
    config.metrics.trackers_per_row = true;
    config.metrics.wandb.mode = Some(WandbMode::Offline);
    config.metrics.wandb.tags = vec!["arena".into()];
    config.metrics.mlflow.tracking_uri = uri.clone();
    config.metrics.mlflow.tags.insert("team".into(), "rl".into());
    // The default metrics.mlflow.min_interval_seconds, though the steps here come far faster: with
    // trackers_at_checkpoint they are released by checkpoints, many at once, and MLflow gets every one.
    // A credential interpolated into a config value must reach no tracker.
    config.model.path = format!("/models/{CONFIG_SECRET}/smol");
    let env = Env::from_pairs([
        ("ARENA_OPENAPI_TOKEN", CONFIG_SECRET),
        ("WANDB_API_KEY", WANDB_SECRET),
        ("WANDB_DIR", wandb_dir.to_str().expect("utf-8")),
        ("MLFLOW_TRACKING_TOKEN", MLFLOW_SECRET),
        ("ARENA_RL_WANDB_PYTHON", python.to_str().expect("utf-8")),
    ]);
    let secrets = config.secrets(&env);
    let settings = TrackerSettings::resolve(&config, &env, &secrets, &run_dir).expect("settings");
    let started = Instant::now();

    // First process: steps 0..=3 written, the checkpoint of step 2 saved, then killed before step 3's.
    let trackers = Trackers::start(&settings, &run_dir, &metrics_dir, None).expect("trackers");
    let mut sink = MetricsSink::open(&metrics_dir, true, false, None)
        .expect("sink")
        .with_trackers(Some(trackers), true);
    for k in 0..=3 {
        sink.write_step(k, &step_metrics(k, 1)).expect("write");
        if k <= 2 {
            sink.durable_through(k);
        }
    }
    let state_dir = run_dir.join("trackers");
    wait_for("both trackers to take step 2", || {
        read_state(&state_dir, "mlflow.json")["last_step"] == "2"
            && std::fs::read_to_string(state_dir.join("wandb.step")).is_ok_and(|s| s == "2")
    })
    .await;
    let sidecar = read_state(&state_dir, "wandb.json")["sidecar_pid"]
        .as_str()
        .expect("the sidecar's pid")
        .to_string();
    // The sidecar and its wandb-core take only the CPU the training leaves (SCHED_IDLE, policy 5).
    let sidecar_pid: u32 = sidecar.parse().expect("a pid");
    let family = std::iter::once(sidecar_pid)
        .chain(children_of(sidecar_pid))
        .map(|pid| (pid, scheduling_policy(pid)))
        .collect::<Vec<_>>();
    assert!(
        family.len() >= 2 && family.iter().all(|(_, policy)| *policy == Some(5)),
        "the sidecar and wandb-core run at SCHED_IDLE: (pid, policy) {family:?}"
    );
    drop(sink);
    wait_for("the first sidecar to finish its run", || {
        !Path::new(&format!("/proc/{sidecar}")).exists()
            || std::fs::read_to_string(format!("/proc/{sidecar}/stat")).is_ok_and(|s| s.contains(") Z "))
    })
    .await;

    // Second process: resumes at step 3 and trains steps 3..=5 (step 3 with new values).
    let trackers = Trackers::start(&settings, &run_dir, &metrics_dir, Some(3)).expect("trackers");
    let mut sink = MetricsSink::open(&metrics_dir, true, false, Some(3))
        .expect("sink")
        .with_trackers(Some(trackers), true);
    for k in 3..=5 {
        sink.write_step(k, &step_metrics(k, 2)).expect("write");
        sink.durable_through(k);
    }
    let curve = sink.draw_curve().expect("curve");
    let summary = json!({"steps_trained": 3, "resumed_at": 3, "final_reward": 1.27});
    sink.close_trackers(Some(&curve), &summary).await;
    eprintln!("trackers: both sessions took {:?}", started.elapsed());

    let jsonl: Vec<Value> = std::fs::read_to_string(metrics_dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(
        jsonl
            .iter()
            .map(|v| v["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5]
    );
    let redacted = config.to_redacted_json(&secrets).expect("redacted");

    // MLflow, through its own client.
    let run_id = read_state(&state_dir, "mlflow.json")["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    let ml = python_out(&python, MLFLOW_READER, &[&uri, &run_id]);
    assert_eq!(ml["status"], "FINISHED", "{ml}");
    assert_eq!(ml["name"], "trial-1");
    assert_eq!(ml["tags"]["team"], "rl");
    let mut expected: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for line in &jsonl {
        let step = line["step"].as_u64().unwrap();
        for (k, v) in line.as_object().unwrap() {
            if k != "step" {
                expected
                    .entry(mlflow_key(k))
                    .or_default()
                    .push((step, v.as_f64().unwrap()));
            }
        }
    }
    let mut got: BTreeMap<String, Vec<(u64, f64)>> = BTreeMap::new();
    for (k, points) in ml["history"].as_object().unwrap() {
        let mut points: Vec<(u64, f64)> = points
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
            .collect();
        points.sort_by_key(|p| p.0);
        got.insert(k.clone(), points);
    }
    assert_eq!(got, expected, "MLflow's history is metrics.jsonl, each step once");
    assert_eq!(ml["params"]["experiment_name"], "exp");
    assert_eq!(
        ml["params"]["actor.lr"],
        redacted["actor"]["lr"].to_string().as_str()
    );
    assert_eq!(ml["params"]["model.path"], "/models/<redacted>/smol");
    let artifacts: Vec<&str> = ml["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(artifacts.contains(&"reward_curve.png"), "{artifacts:?}");
    assert!(artifacts.contains(&"summary.json"), "{artifacts:?}");

    // W&B, from its offline run files.
    let wb = python_out(&python, WANDB_READER, &[wandb_dir.to_str().unwrap()]);
    assert_eq!(wb["files"], 2, "one offline run file per process: {wb}");
    let id = read_state(&state_dir, "wandb.json")["id"].clone();
    for r in wb["runs"].as_array().unwrap() {
        assert_eq!(r["id"], id);
        assert_eq!(r["project"], "exp");
        assert_eq!(r["name"], "trial-1");
        assert_eq!(r["group"], "exp");
        assert_eq!(r["tags"], json!(["arena"]));
    }
    let rows: Vec<&Value> = wb["history"].as_array().unwrap().iter().collect();
    assert_eq!(
        rows.iter()
            .map(|r| r["_step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [0, 1, 2, 3, 4, 5],
        "every step once, in order"
    );
    for (row, line) in rows.iter().zip(&jsonl) {
        for (k, v) in line.as_object().unwrap() {
            if k != "step" {
                assert_eq!(row[k].as_f64(), v.as_f64(), "step {} {k}", line["step"]);
            }
        }
        let extra: Vec<&String> = row
            .as_object()
            .unwrap()
            .keys()
            .filter(|k| !k.starts_with('_') && line.get(k.as_str()).is_none())
            .collect();
        assert!(extra.is_empty(), "W&B has metrics metrics.jsonl lacks: {extra:?}");
    }
    for (k, v) in redacted.as_object().unwrap() {
        assert_eq!(&wb["config"][k], v, "W&B config {k}");
    }
    assert_eq!(wb["summary"]["final_reward"], 1.27);
    assert_eq!(
        wb["summary"]["reward_curve"]["_type"], "image-file",
        "{}",
        wb["summary"]
    );

    // No secret in any file the trackers, the sidecar or the server wrote.
    let mut files = Vec::new();
    files_under(tmp.path(), &mut files);
    for path in &files {
        let data = std::fs::read(path).unwrap_or_default();
        for secret in [WANDB_SECRET, MLFLOW_SECRET, CONFIG_SECRET] {
            assert!(
                !data.windows(secret.len()).any(|w| w == secret.as_bytes()),
                "{} holds a secret",
                path.display()
            );
        }
    }
}

/// MLflow with its basic-auth app on, in live mode (each step sent as it is written) across two kills: a wrong
/// password costs the run nothing and leaves no run behind; the next process, with the right one, replays the
/// steps before its resume point from `metrics.jsonl`; a step the tracker already took before a kill is not
/// sent again, so it keeps the killed attempt's values (as docs/trackers.md says); the password is in no file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlflow_with_basic_auth_in_live_mode_takes_every_step_once_across_kills() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_TRACKERS").map(PathBuf::from) else {
        eprintln!(
            "skipping: ARENA_RL_PY_TRACKERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    const PASSWORD: &str = "mlflow-admin-password-7c1d9e";
    let tmp = tempfile::tempdir().expect("tempdir");
    let server_dir = tmp.path().join("server");
    std::fs::create_dir_all(&server_dir).expect("server dir");
    // The server's own config holds the password; it lives apart from what the secret scan below reads.
    let auth_dir = tempfile::tempdir().expect("tempdir");
    let auth = auth_dir.path().join("auth.ini");
    std::fs::write(
        &auth,
        format!(
            "[mlflow]\ndefault_permission = READ\ndatabase_uri = sqlite:///{}\nadmin_username = admin\n\
             admin_password = {PASSWORD}\n\
             authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n",
            auth_dir.path().join("auth.db").display()
        ),
    )
    .expect("auth config");
    let (_server, uri) = mlflow_server_with(&python, &server_dir, Some(&auth)).await;
    let run_dir = tmp.path().join("run");
    let metrics_dir = run_dir.join("metrics");
    let state_dir = run_dir.join("trackers");
    let mut config = RunConfig {
        experiment_name: "exp".into(),
        trial_name: "live".into(),
        ..RunConfig::default()
    };
    config.metrics.trackers = vec![Tracker::Mlflow];
    config.metrics.mlflow.tracking_uri = uri.clone();
    config.metrics.mlflow.min_interval_seconds = None;
    let settings_with = |password: &str| {
        let env = Env::from_pairs([
            ("MLFLOW_TRACKING_USERNAME", "admin"),
            ("MLFLOW_TRACKING_PASSWORD", password),
        ]);
        TrackerSettings::resolve(&config, &env, &config.secrets(&env), &run_dir).expect("settings")
    };

    // First process, wrong password: steps 0..=3 written, checkpoint through 2, then killed.
    let trackers =
        Trackers::start(&settings_with("not-the-password"), &run_dir, &metrics_dir, None).expect("trackers");
    let mut sink = MetricsSink::open(&metrics_dir, true, false, None)
        .expect("sink")
        .with_trackers(Some(trackers), false);
    for k in 0..=3 {
        sink.write_step(k, &step_metrics(k, 1)).expect("write");
        if k <= 2 {
            sink.durable_through(k);
        }
    }
    drop(sink);
    assert_eq!(
        read_state(&state_dir, "mlflow.json")["run_id"],
        Value::Null,
        "no run was made with a wrong password"
    );

    // Second process, the right password, resumed at 3: steps 0..=2 replayed, 3 and 4 live, killed after
    // MLflow took step 4.
    let settings = settings_with(PASSWORD);
    let trackers = Trackers::start(&settings, &run_dir, &metrics_dir, Some(3)).expect("trackers");
    let mut sink = MetricsSink::open(&metrics_dir, true, false, Some(3))
        .expect("sink")
        .with_trackers(Some(trackers), false);
    for k in 3..=4 {
        sink.write_step(k, &step_metrics(k, 2)).expect("write");
    }
    sink.durable_through(3);
    wait_for("MLflow to take step 4", || {
        read_state(&state_dir, "mlflow.json")["last_step"] == "4"
    })
    .await;
    drop(sink);

    // Third process, resumed at 4: step 4 trained again (new values, which MLflow already has the first of)
    // and step 5.
    let trackers = Trackers::start(&settings, &run_dir, &metrics_dir, Some(4)).expect("trackers");
    let mut sink = MetricsSink::open(&metrics_dir, true, false, Some(4))
        .expect("sink")
        .with_trackers(Some(trackers), false);
    for k in 4..=5 {
        sink.write_step(k, &step_metrics(k, 3)).expect("write");
        sink.durable_through(k);
    }
    sink.close_trackers(None, &json!({})).await;

    let jsonl: Vec<Value> = std::fs::read_to_string(metrics_dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let sessions: Vec<u64> = jsonl
        .iter()
        .map(|l| {
            let step = l["step"].as_u64().unwrap();
            (0..=3)
                .find(|&s| l["rollout/reward"].as_f64() == Some(0.25 * step as f64 + 0.01 * s as f64))
                .expect("a session's value")
        })
        .collect();
    assert_eq!(sessions, [1, 1, 1, 2, 3, 3], "metrics.jsonl after the resumes");
    let run_id = read_state(&state_dir, "mlflow.json")["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    let ml = python_out_with(
        &python,
        MLFLOW_READER,
        &[&uri, &run_id],
        &[
            ("MLFLOW_TRACKING_USERNAME", "admin"),
            ("MLFLOW_TRACKING_PASSWORD", PASSWORD),
        ],
    );
    assert_eq!(ml["status"], "FINISHED", "{ml}");
    let mut points: Vec<(u64, f64)> = ml["history"][mlflow_key("rollout/reward")]
        .as_array()
        .expect("the reward's history")
        .iter()
        .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
        .collect();
    points.sort_by_key(|p| p.0);
    let expected: Vec<(u64, f64)> = [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 3)]
        .into_iter()
        .map(|(step, session)| (step, 0.25 * step as f64 + 0.01 * session as f64))
        .collect();
    assert_eq!(
        points, expected,
        "each step once; step 4 keeps the value MLflow took before the kill"
    );

    let mut files = Vec::new();
    files_under(tmp.path(), &mut files);
    for path in &files {
        let data = std::fs::read(path).unwrap_or_default();
        assert!(
            !data.windows(PASSWORD.len()).any(|w| w == PASSWORD.as_bytes()),
            "{} holds the password",
            path.display()
        );
    }
}

/// `metrics.mlflow.min_interval_seconds` against the real server: live steps that come faster than the
/// interval reach MLflow as each metric's newest value with its own step (the run's last step included), and a
/// resumed run replays the steps MLflow never got whole before thinning its live steps again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mlflow_stores_each_metrics_newest_value_per_interval_and_replays_whole() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_TRACKERS").map(PathBuf::from) else {
        eprintln!("skipping: ARENA_RL_PY_TRACKERS is not set: run `cargo xtask test`");
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, uri) = mlflow_server(&python, tmp.path()).await;
    let run_dir = tmp.path().join("run");
    let metrics_dir = run_dir.join("metrics");
    let mut config = RunConfig {
        experiment_name: "exp".into(),
        trial_name: "thin".into(),
        ..RunConfig::default()
    };
    config.metrics.trackers = vec![Tracker::Mlflow];
    config.metrics.mlflow.tracking_uri = uri.clone();
    config.metrics.mlflow.min_interval_seconds = stream_config::Seconds::new(3600.0);
    let env = Env::default();
    let settings =
        TrackerSettings::resolve(&config, &env, &config.secrets(&env), &run_dir).expect("settings");
    let step = |k: u64| {
        let mut m = vec![("rollout/reward".to_string(), k as f64 / 10.0)];
        if k % 4 == 2 {
            m.push(("eval-rollout/reward".to_string(), 1.0 + k as f64));
        }
        m
    };

    // First process: steps 0..=5 live, one request at the end (the interval is an hour).
    let trackers = Trackers::start(&settings, &run_dir, &metrics_dir, None).expect("trackers");
    for k in 0..=5 {
        trackers.step(k, &step(k));
    }
    assert!(
        trackers
            .finish(None, &json!({}))
            .await
            .iter()
            .all(|(_, missed)| *missed == 0)
    );
    let state_dir = run_dir.join("trackers");
    assert_eq!(read_state(&state_dir, "mlflow.json")["last_step"], "5");
    // metrics.jsonl as a killed run leaves it: steps 0..=7 written, 6 and 7 never sent.
    std::fs::create_dir_all(&metrics_dir).expect("metrics dir");
    let jsonl: String = (0..=7u64)
        .map(|k| {
            let mut line = serde_json::Map::new();
            line.insert("step".into(), json!(k));
            for (name, v) in step(k) {
                line.insert(name, json!(v));
            }
            format!("{}\n", Value::Object(line))
        })
        .collect();
    std::fs::write(metrics_dir.join("metrics.jsonl"), jsonl).expect("jsonl");

    // The resumed process (from step 8): 6 and 7 replayed whole, 8 and 9 live and thinned.
    let trackers = Trackers::start(&settings, &run_dir, &metrics_dir, Some(8)).expect("trackers");
    for k in 8..=9 {
        trackers.step(k, &step(k));
    }
    trackers.finish(None, &json!({})).await;

    let run_id = read_state(&state_dir, "mlflow.json")["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    let ml = python_out(&python, MLFLOW_READER, &[&uri, &run_id]);
    assert_eq!(ml["status"], "FINISHED", "{ml}");
    let history = |key: &str| -> Vec<(u64, f64)> {
        let mut points: Vec<(u64, f64)> = ml["history"][key]
            .as_array()
            .unwrap_or_else(|| panic!("no {key} in {ml}"))
            .iter()
            .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64().unwrap()))
            .collect();
        points.sort_by_key(|p| p.0);
        points
    };
    assert_eq!(
        history("rollout/reward"),
        [(5, 0.5), (6, 0.6), (7, 0.7), (9, 0.9)]
    );
    // Logged at steps 2 and 6 only: the first process's newest is step 2's, the replay sends step 6's.
    assert_eq!(history("eval-rollout/reward"), [(2, 3.0), (6, 7.0)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_sidecar_and_an_unreachable_mlflow_cost_the_run_nothing_and_are_counted() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let run_dir = tmp.path().join("run");
    let mut config = RunConfig {
        experiment_name: "exp".into(),
        trial_name: "t".into(),
        ..RunConfig::default()
    };
    config.metrics.trackers = vec![Tracker::Wandb, Tracker::Mlflow];
    // A sidecar that exits at once, and a server port nobody listens on.
    config.metrics.wandb.python = "false".into();
    config.metrics.mlflow.tracking_uri = format!("http://127.0.0.1:{}", free_port());
    let env = Env::default();
    let settings =
        TrackerSettings::resolve(&config, &env, &config.secrets(&env), &run_dir).expect("settings");
    let trackers = Trackers::start(&settings, &run_dir, &run_dir.join("metrics"), None).expect("start");
    for k in 0..5 {
        trackers.step(k, &[("rollout/reward".to_string(), k as f64)]);
    }
    let report = trackers.finish(None, &json!({})).await;
    assert_eq!(report, [("wandb", 5), ("mlflow", 5)]);
}

/// `train`, the entrypoint, feeds W&B: the real loop against arena-sim, the sidecar in offline mode, every
/// step of `metrics.jsonl` in the offline run file with every metric but the per-row records
/// (`debug/task/<data_id>/...`, left out by default as for TensorBoard), the saved config's values as the W&B
/// config.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn train_feeds_wandb_every_step_it_writes_to_metrics_jsonl() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_TRACKERS").map(PathBuf::from) else {
        eprintln!(
            "skipping: ARENA_RL_PY_TRACKERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    let mut world = arena_sim::World::quickstart();
    world.token = "sim-token".into();
    let sim = arena_sim::ArenaSim::start(world).await.expect("sim");
    let root = tempfile::tempdir().expect("tempdir");
    let model = crate::support::model_folder(root.path());
    let python_override = format!("metrics.wandb.python={}", python.display());
    let config = crate::support::config(
        &sim.base_url(),
        root.path(),
        &model,
        &[
            "actor.total_train_steps=2",
            "train_dataset.batch_size=1",
            "gconfig.n_samples=2",
            "metrics.trackers=[wandb]",
            "metrics.wandb.mode=offline",
            &python_override,
        ],
    );
    let mut env = crate::support::env();
    let wandb_dir = root.path().join("wandb-dir");
    env.set("WANDB_DIR", wandb_dir.to_str().expect("utf-8"));
    let summary = arena_rl::run::train(
        config,
        &env,
        arena_rl::run::Plugins {
            engine: Some(crate::support::OracleEngine::new(&model, 2).handle()),
            step: Box::new(arena_rl::train::FrozenPolicy::default()),
        },
    )
    .await
    .expect("train");
    assert_eq!(summary.steps_trained, 2);
    let jsonl: Vec<Value> = std::fs::read_to_string(summary.metrics_dir.join("metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    let wb = python_out(&python, WANDB_READER, &[wandb_dir.to_str().unwrap()]);
    let rows = wb["history"].as_array().expect("history");
    assert_eq!(rows.len(), jsonl.len(), "{wb}");
    let mut per_row = 0;
    for (row, line) in rows.iter().zip(&jsonl) {
        assert_eq!(row["_step"], line["step"]);
        for (k, v) in line.as_object().unwrap() {
            if k.starts_with("debug/task/") {
                per_row += 1;
                assert!(
                    row.get(k).is_none(),
                    "step {}: the per-row {k} reached W&B",
                    line["step"]
                );
            } else if k != "step" {
                assert_eq!(row[k].as_f64(), v.as_f64(), "step {} {k}", line["step"]);
            }
        }
    }
    assert!(
        per_row > 0,
        "the run wrote no per-row record to leave out: {jsonl:?}"
    );
    assert_eq!(wb["config"]["experiment_name"], "quickstart", "{}", wb["config"]);
    assert_eq!(wb["config"]["econfig"]["arena_base_url"], sim.base_url());
    assert_eq!(wb["summary"]["steps_trained"], 2);
    assert!(wb["summary"]["reward_curve"].is_object(), "{}", wb["summary"]);
}

/// `arena-rl eval` feeds MLflow: a real evaluation against arena-sim (three manifest tasks, two samples each,
/// an engine that answers every second one wrong) with `metrics.trackers: [mlflow]`; MLflow's own client reads
/// back one finished run whose metrics are the evaluation's `metrics.jsonl` but its per-row records (left out
/// by default), value for value, at step 0, with
/// `eval.png` among its artifacts.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eval_feeds_mlflow_the_figures_of_its_metrics_jsonl() {
    let Some(python) = std::env::var_os("ARENA_RL_PY_TRACKERS").map(PathBuf::from) else {
        eprintln!(
            "skipping: ARENA_RL_PY_TRACKERS is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
        return;
    };
    let tmp = tempfile::tempdir().expect("tempdir");
    let (_server, uri) = mlflow_server(&python, tmp.path()).await;
    let sim = arena_sim::ArenaSim::start(crate::eval::world(3))
        .await
        .expect("sim");
    let root = tmp.path().join("eval-root");
    std::fs::create_dir_all(&root).expect("root");
    let model = crate::support::model_folder(&root);
    let options = crate::eval::options(
        &root,
        &model,
        r#"["env:min-00@v1", "env:min-01@v1", "env:min-02@v1"]"#,
        2,
        false,
    );
    let uri_override = format!("metrics.mlflow.tracking_uri={uri}");
    let config = crate::support::config(
        &sim.base_url(),
        &root,
        &model,
        &[
            &crate::eval::stream_override(&[crate::eval::STREAM]),
            "metrics.trackers=[mlflow]",
            &uri_override,
        ],
    );
    let engines = arena_rl::run::EvalEngines {
        candidate: Some(crate::support::OracleEngine::new(&model, 2).handle()),
        baseline: None,
    };
    let started = Instant::now();
    let summary = arena_rl::run::evaluate(config, &crate::support::env(), &options, engines)
        .await
        .expect("eval");
    eprintln!("eval with mlflow took {:?}", started.elapsed());
    assert_eq!(summary.ran.0, 6, "3 tasks x 2 samples");
    let jsonl: Vec<Value> = std::fs::read_to_string(options.out.join("metrics/metrics.jsonl"))
        .expect("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json"))
        .collect();
    assert_eq!(jsonl.len(), 1, "one step: {jsonl:?}");
    let line = jsonl[0].as_object().expect("an object");
    assert_eq!(line["step"], 0);
    let pass_rate = line["eval/all/pass_rate"].as_f64().expect("eval/all/pass_rate");
    assert!(
        pass_rate > 0.0 && pass_rate < 1.0,
        "every second answer wrong: {pass_rate}"
    );

    let run_id = read_state(&options.out.join("trackers"), "mlflow.json")["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    let ml = python_out(&python, MLFLOW_READER, &[&uri, &run_id]);
    assert_eq!(ml["status"], "FINISHED", "{ml}");
    // Every figure but the per-row records (`debug/task/<task>/...`), which stay in metrics.jsonl by default.
    assert!(
        line.keys().any(|k| k.starts_with("debug/task/")),
        "no per-row record to leave out: {line:?}"
    );
    let expected: BTreeMap<String, Vec<(u64, f64)>> = line
        .iter()
        .filter(|(k, _)| k.as_str() != "step" && !k.starts_with("debug/task/"))
        .map(|(k, v)| (mlflow_key(k), vec![(0, v.as_f64().expect("a number"))]))
        .collect();
    let got: BTreeMap<String, Vec<(u64, f64)>> = ml["history"]
        .as_object()
        .expect("history")
        .iter()
        .map(|(k, points)| {
            let points = points
                .as_array()
                .expect("points")
                .iter()
                .map(|p| (p[0].as_u64().expect("step"), p[1].as_f64().expect("value")))
                .collect();
            (k.clone(), points)
        })
        .collect();
    assert_eq!(got, expected, "MLflow holds the evaluation's metrics.jsonl");
    for key in ["eval/all/pass_rate_lo", "eval/stream/sim-env/pass@2"] {
        assert!(got.contains_key(&mlflow_key(key)), "{key} missing from {got:?}");
    }
    let artifacts: Vec<&str> = ml["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(artifacts.contains(&"eval.png"), "{artifacts:?}");
    // The chart MLflow holds is the evaluation's `eval.png`, byte for byte.
    let fetched = tmp.path().join("fetched");
    std::fs::create_dir_all(&fetched).expect("fetched dir");
    python_out(
        &python,
        "import json, sys\nfrom mlflow.tracking import MlflowClient\n\
         p = MlflowClient(sys.argv[1]).download_artifacts(sys.argv[2], 'eval.png', sys.argv[3])\n\
         print(json.dumps(p))",
        &[&uri, &run_id, fetched.to_str().expect("utf-8")],
    );
    assert_eq!(
        std::fs::read(fetched.join("eval.png")).expect("downloaded eval.png"),
        std::fs::read(&summary.png).expect("eval.png")
    );
}
