//! What the experiment trackers cost a run (issue 36's acceptance bench, not CI): a short quickstart with
//! `metrics.trackers: [wandb, mlflow]` against the same quickstart without trackers, in the same run, paired.
//!
//! Each quickstart is a process of this bench in the `quickstart` role running what `arena-rl quickstart`
//! runs (`arena_rl::quickstart::run` with the GRPO step: the tiny policy, arena-sim in process, the real
//! proxy and loop, `examples/configs/quickstart.yaml`'s settings: 8 prompts by 8 samples a step, about 180
//! metrics a step), on a policy warmed up once before the pairs (`--warmup-steps 20`, 64 conversations;
//! the cache every run then starts from). The tracked runs feed W&B through its official SDK in offline mode
//! (the sidecar on `ARENA_RL_PY_TRACKERS`'s interpreter, writing under a fresh `WANDB_DIR`) and MLflow over
//! REST to a real `mlflow server` (SQLite backend, its artifact proxy, one worker, its background job runner
//! off: that polls whether or not anyone logs) that the bench starts once and keeps for every run.
//!
//! A run's cost is its process's wall time, from start to exit (the trackers' start, every step, the
//! sidecar's and MLflow's finish included); the tracked run's cost also counts the CPU time the MLflow
//! server's process group spent meanwhile (read from `/proc`), since on a shared machine that server takes
//! cores from the run, and elsewhere it is a cost the run causes. The pairs alternate which side goes first.
//! The table gives each pair and the medians: the tracked cost over the plain wall time (the goal is at most
//! 1.02), the milliseconds the trackers add, the MLflow server's CPU milliseconds, and the ratio of the wall
//! times alone, and the cost counting only the server CPU the run caused (its CPU less its idle rate, read in
//! the plain run of the same pair, over the tracked run's wall time: the job runner MLflow's server starts
//! polls whether or not anyone logs); each row also shows the server's CPU time during the plain run. After
//! the pairs, MLflow's own client checks that every tracked run is a FINISHED MLflow run holding every step,
//! and each tracked run left its W&B offline run file.
//!
//! A quickstart step takes a fraction of a second, so the trackers' start and finish (about a second and a
//! half) and the MLflow server's work per step weigh on it far more than on a run whose steps take minutes.
//!
//! Each run starts once the MLflow server's process group is idle (under 5% of a core over a second), so that no
//! run pays for what the previous one left the server. Each row also gives the CPU time of the run's own
//! processes (the quickstart, the W&B sidecar and its `wandb-core`, read from this process's reaped children).
//! `ARENA_RL_TRACKERS_BENCH_TRACKERS` (`wandb,mlflow` by default) picks the trackers of the tracked runs, to
//! see each one's share; `ARENA_RL_TRACKERS_BENCH_OVERRIDES` adds config overrides to them (space-separated,
//! for example `metrics.mlflow.min_interval_seconds=null` to send MLflow every step).
//!
//! `cargo bench -p benches --bench trackers_quickstart` runs one unmeasured pair and then
//! `ARENA_RL_TRACKERS_BENCH_PAIRS` pairs (default 6, so that each side goes first as often: the machine's speed drifts
//! by a few percent from one run to the next) of `ARENA_RL_TRACKERS_BENCH_STEPS` RL steps (default
//! 120, a pair about 75 s); `-- --test` runs one pair of 2 steps. The summary is also written to
//! `<target>/criterion/trackers-quickstart-summary.json`. Needs `ARENA_RL_PY_TRACKERS`
//! (`eval "$(cargo xtask fixtures)"`).

#[path = "common/summary.rs"]
mod summary;

use std::io::{Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail, ensure};
use arena_rl::quickstart::{self, Options, WarmupSettings, policy::PolicySpec};
use arena_rl::run::RunPaths;
use arena_rl::train::{GrpoStep, TrainStep};
use serde_json::{Value, json};
use stream_config::Env;

const ROLE: &str = "ARENA_RL_TRACKERS_BENCH_ROLE";
const OVERRIDES: &str = "ARENA_RL_TRACKERS_BENCH_OVERRIDES";

/// The warm-up every run's policy comes from (prepared once, then read from the cache).
fn warmup() -> WarmupSettings {
    WarmupSettings {
        conversations: 64,
        steps: 20,
        ..WarmupSettings::default()
    }
}

/// The child: one quickstart with the overrides it was given; prints one JSON line with what it did.
fn quickstart_role() -> Result<()> {
    let overrides: Vec<String> = serde_json::from_str(&std::env::var(OVERRIDES)?)?;
    let options = Options {
        overrides,
        policy: PolicySpec::default(),
        warmup: warmup(),
        fresh_trial: true,
        step: Box::new(|config, _| {
            let step = GrpoStep::from_run_config(config, &RunPaths::of(config).run_dir)?;
            Ok(Box::new(step) as Box<dyn TrainStep>)
        }),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let summary = runtime.block_on(quickstart::run(options, &Env::from_process()))?;
    ensure!(
        summary.policy_cached,
        "the warmed-up policy was not taken from the cache"
    );
    println!(
        "{}",
        json!({"run_dir": summary.run.run_dir, "steps": summary.run.rewards.len(), "rl_seconds": summary.seconds.rl})
    );
    Ok(())
}

/// Seconds of CPU used so far by every process of process group `group` (user and system time, with the
/// children each has reaped), from `/proc`.
fn group_cpu_seconds(group: u32) -> f64 {
    let mut ticks = 0u64;
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if !entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
        {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The command name may hold spaces and parentheses; the fields after it are separated by spaces.
        let Some(rest) = text.rfind(')').map(|at| &text[at + 1..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): pgrp is field 5, utime 14, stime 15, cutime 16, cstime 17.
        if fields.get(2).and_then(|f| f.parse::<u32>().ok()) != Some(group) {
            continue;
        }
        ticks += fields
            .get(11..15)
            .map_or(0, |t| t.iter().map(|f| f.parse::<u64>().unwrap_or(0)).sum());
    }
    ticks as f64 / clock_ticks()
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times.
fn clock_ticks() -> f64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// The `mlflow server` process group, killed whole on drop (uvicorn and its workers are its children).
struct MlflowServer {
    child: Child,
    uri: String,
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.wait();
    }
}

fn http_ok(port: u16, path: &str) -> bool {
    let Ok(mut stream) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let request = format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let mut answer = String::new();
    stream.write_all(request.as_bytes()).is_ok()
        && stream.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.1 200")
}

fn mlflow_server(python: &Path, dir: &Path) -> Result<MlflowServer> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let log = std::fs::File::create(dir.join("mlflow-server.log"))?;
    let child = Command::new(python)
        .args(["-m", "mlflow", "server", "--host", "127.0.0.1", "--port"])
        .arg(port.to_string())
        .arg("--backend-store-uri")
        .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
        .arg("--artifacts-destination")
        .arg(dir.join("mlartifacts"))
        .args(["--workers", "1"])
        // Its job runner (MLflow's background jobs, which no tracking uses) polls whether or not anyone logs.
        .env("MLFLOW_SERVER_ENABLE_JOB_EXECUTION", "false")
        .current_dir(dir)
        .stdout(log.try_clone()?)
        .stderr(log)
        .stdin(Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting mlflow server")?;
    let server = MlflowServer {
        child,
        uri: format!("http://127.0.0.1:{port}"),
    };
    let deadline = Instant::now() + Duration::from_secs(180);
    while !http_ok(port, "/health") {
        if Instant::now() > deadline {
            bail!(
                "mlflow server did not answer: {}",
                std::fs::read_to_string(dir.join("mlflow-server.log")).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The server's helpers (its job runner and task consumers) go on starting after `/health` answers:
    // wait until the group is idle, so that their start is not counted against a run.
    settle(server.child.id(), Duration::from_secs(120));
    Ok(server)
}

/// Waits (at most `limit`) until process group `group` spends under 5% of a core over a second: a run starts
/// only once the server has done what the previous run left it (SQLite's writes, its job runner's start).
fn settle(group: u32, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let before = group_cpu_seconds(group);
        std::thread::sleep(Duration::from_secs(1));
        if group_cpu_seconds(group) - before < 0.05 || Instant::now() > deadline {
            break;
        }
    }
}

/// Seconds of CPU spent so far by this process's reaped children and their reaped descendants (user and
/// system time): a quickstart, its W&B sidecar and the sidecar's `wandb-core`.
fn children_cpu_seconds() -> f64 {
    let Ok(text) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    let Some(rest) = text.rfind(')').map(|at| &text[at + 1..]) else {
        return f64::NAN;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3: cutime is field 16, cstime 17.
    fields.get(13..15).map_or(f64::NAN, |t| {
        t.iter().map(|f| f.parse::<u64>().unwrap_or(0)).sum::<u64>() as f64
    }) / clock_ticks()
}

/// One quickstart run, measured.
struct Measured {
    wall: f64,
    /// CPU seconds of the quickstart process and everything it started (the W&B sidecar included).
    cpu: f64,
    server_cpu: f64,
    rl_seconds: f64,
    run_dir: PathBuf,
}

/// Runs one quickstart in a child process with `overrides` and `env`, timing it from start to exit and
/// reading the MLflow server group's CPU time before and after.
fn run_quickstart(
    overrides: &[String],
    env: &[(String, String)],
    server: &MlflowServer,
    steps: usize,
) -> Result<Measured> {
    let group = server.child.id();
    settle(group, Duration::from_secs(30));
    let cpu_before = group_cpu_seconds(group);
    let own_before = children_cpu_seconds();
    let started = Instant::now();
    let out = Command::new(std::env::current_exe()?)
        .env(ROLE, "quickstart")
        .env(OVERRIDES, serde_json::to_string(overrides)?)
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env_remove("ARENA_OPENAPI_BASE")
        .env_remove("ARENA_OPENAPI_TOKEN")
        .stdin(Stdio::null())
        .output()?;
    let wall = started.elapsed().as_secs_f64();
    let server_cpu = group_cpu_seconds(group) - cpu_before;
    let cpu = children_cpu_seconds() - own_before;
    ensure!(
        out.status.success(),
        "a quickstart failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let report: Value = stdout
        .lines()
        .rev()
        .find_map(|l| serde_json::from_str(l).ok())
        .with_context(|| format!("no report from the quickstart: {stdout}"))?;
    ensure!(
        report["steps"].as_u64() == Some(steps as u64),
        "the quickstart trained {} steps, not {steps}",
        report["steps"]
    );
    Ok(Measured {
        wall,
        cpu,
        server_cpu,
        rl_seconds: report["rl_seconds"].as_f64().unwrap_or(f64::NAN),
        run_dir: PathBuf::from(report["run_dir"].as_str().unwrap_or_default()),
    })
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// Every tracked run as MLflow's client reads it back: `[status, points of rollout/reward, its last step]`.
const MLFLOW_READER: &str = r#"
import json, sys
from mlflow.tracking import MlflowClient
client = MlflowClient(sys.argv[1])
runs = []
for e in client.search_experiments():
    for r in client.search_runs([e.experiment_id]):
        h = client.get_metric_history(r.info.run_id, "rollout/reward")
        runs.append([r.info.status, len(h), max((m.step for m in h), default=-1)])
print(json.dumps(runs))
"#;

fn main() -> Result<()> {
    if std::env::var(ROLE).as_deref() == Ok("quickstart") {
        return quickstart_role();
    }
    let test_mode = std::env::args().any(|a| a == "--test");
    let number = |var: &str, default: usize| {
        std::env::var(var)
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .unwrap_or(default)
    };
    let (pairs, steps) = if test_mode {
        (1, 2)
    } else {
        (
            number("ARENA_RL_TRACKERS_BENCH_PAIRS", 6).max(1),
            number("ARENA_RL_TRACKERS_BENCH_STEPS", 120).max(1),
        )
    };
    // Which trackers the tracked runs feed (`ARENA_RL_TRACKERS_BENCH_TRACKERS`, default `wandb,mlflow`), and
    // further overrides for them (`ARENA_RL_TRACKERS_BENCH_OVERRIDES`, space-separated).
    let trackers: Vec<String> = std::env::var("ARENA_RL_TRACKERS_BENCH_TRACKERS")
        .unwrap_or_else(|_| "wandb,mlflow".into())
        .split(',')
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .collect();
    ensure!(
        !trackers.is_empty() && trackers.iter().all(|t| t == "wandb" || t == "mlflow"),
        "ARENA_RL_TRACKERS_BENCH_TRACKERS must list wandb, mlflow or both, got {trackers:?}"
    );
    let (wandb, mlflow) = (
        trackers.iter().any(|t| t == "wandb"),
        trackers.iter().any(|t| t == "mlflow"),
    );
    let extra: Vec<String> = std::env::var("ARENA_RL_TRACKERS_BENCH_OVERRIDES")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_string)
        .collect();
    let python = std::env::var_os("ARENA_RL_PY_TRACKERS")
        .map(PathBuf::from)
        .context(
            "ARENA_RL_PY_TRACKERS is not set: run `eval \"$(cargo xtask fixtures)\"` before this bench",
        )?;
    let tmp = tempfile::tempdir()?;
    let root = tmp.path();
    let fileroot = root.join("runs");
    std::fs::create_dir_all(&fileroot)?;

    let started = Instant::now();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let config = quickstart::load_config(
        &[format!("cluster.fileroot={}", fileroot.display())],
        false,
        &Env::from_process(),
    )?;
    runtime.block_on(quickstart::prepare(
        &PolicySpec::default(),
        &warmup(),
        &quickstart::policy_cache(&config),
        false,
    ))?;
    drop(runtime);
    println!("policy warmed up in {:.1} s", started.elapsed().as_secs_f64());
    let server = mlflow_server(&python, root)?;
    println!("mlflow server at {}", server.uri);

    let base: Vec<String> = vec![
        format!("cluster.fileroot={}", fileroot.display()),
        format!("actor.total_train_steps={steps}"),
        format!("checkpoint.save_every={steps}"),
        "metrics.progress=false".into(),
        "econfig.arena_base_url=http://127.0.0.1:0".into(),
    ];
    let mut plain = base.clone();
    plain.push("metrics.trackers=[]".into());
    let mut tracked = base;
    tracked.extend([
        format!("metrics.trackers=[{}]", trackers.join(",")),
        "metrics.wandb.mode=offline".into(),
        format!("metrics.wandb.python={}", python.display()),
        format!("metrics.mlflow.tracking_uri={}", server.uri),
    ]);
    tracked.extend(extra.iter().cloned());
    let mut tracked_runs = 0usize;
    let mut run_tracked = |label: &str| -> Result<Measured> {
        tracked_runs += 1;
        let wandb_dir = root.join(format!("wandb-{label}"));
        let m = run_quickstart(
            &tracked,
            &[("WANDB_DIR".into(), wandb_dir.display().to_string())],
            &server,
            steps,
        )?;
        let files = if !wandb {
            1
        } else {
            std::fs::read_dir(wandb_dir.join("wandb"))
                .map(|d| {
                    d.flatten()
                        .filter(|e| e.file_name().to_string_lossy().starts_with("offline-run-"))
                        .count()
                })
                .unwrap_or(0)
        };
        ensure!(
            files == 1,
            "run {label}: {files} W&B offline runs under {}",
            wandb_dir.display()
        );
        ensure!(
            !mlflow || m.run_dir.join("trackers/mlflow.json").exists(),
            "run {label}: no MLflow run id in {}",
            m.run_dir.display()
        );
        Ok(m)
    };
    let run_plain = || run_quickstart(&plain, &[], &server, steps);

    if !test_mode {
        // One unmeasured pair: the page cache, Python's bytecode and the server's first requests warm up.
        run_plain()?;
        run_tracked("warm-up")?;
    }
    println!(
        "\n{pairs} pair(s) of a {steps}-step quickstart (median of the pairs at the end; load average before: {})",
        std::fs::read_to_string("/proc/loadavg")
            .unwrap_or_default()
            .trim()
    );
    println!(
        "tracked runs feed {} ({})",
        trackers.join(" and "),
        extra.join(" ")
    );
    println!(
        "{:>4} {:>7} {:>9} {:>9} {:>12} {:>12} {:>11} {:>11} {:>7} {:>8}",
        "pair",
        "first",
        "plain s",
        "tracked s",
        "mlflow cpu s",
        "(idle) cpu s",
        "plain cpu s",
        "tracked cpu",
        "ratio",
        "added ms"
    );
    let (mut ratios, mut added, mut cpus, mut wall_ratios) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut caused_ratios, mut cpu_added) = (Vec::new(), Vec::new());
    let mut rows = Vec::new();
    for pair in 0..pairs {
        let tracked_first = pair % 2 == 1;
        let (p, t) = if tracked_first {
            let t = run_tracked(&pair.to_string())?;
            (run_plain()?, t)
        } else {
            let p = run_plain()?;
            (p, run_tracked(&pair.to_string())?)
        };
        let cost = t.wall + t.server_cpu;
        let ratio = cost / p.wall;
        // What the server spends because of the run: its CPU during the tracked run less what it spends idle
        // over as long (its rate during the plain run of the same pair).
        let caused = (t.server_cpu - p.server_cpu / p.wall * t.wall).max(0.0);
        caused_ratios.push((t.wall + caused) / p.wall);
        println!(
            "{pair:>4} {:>7} {:>9.2} {:>9.2} {:>12.3} {:>12.3} {:>11.2} {:>11.2} {ratio:>7.4} {:>8.0}",
            if tracked_first { "tracked" } else { "plain" },
            p.wall,
            t.wall,
            t.server_cpu,
            p.server_cpu,
            p.cpu,
            t.cpu,
            (cost - p.wall) * 1e3
        );
        cpu_added.push(t.cpu - p.cpu);
        ratios.push(ratio);
        added.push((cost - p.wall) * 1e3);
        cpus.push(t.server_cpu * 1e3);
        wall_ratios.push(t.wall / p.wall);
        rows.push(
            json!({"tracked_first": tracked_first, "plain_wall_s": p.wall, "tracked_wall_s": t.wall,
                         "mlflow_server_cpu_s": t.server_cpu, "plain_rl_s": p.rl_seconds,
                         "tracked_rl_s": t.rl_seconds, "plain_server_cpu_s": p.server_cpu,
                         "plain_cpu_s": p.cpu, "tracked_cpu_s": t.cpu,
                         "mlflow_server_cpu_caused_s": caused}),
        );
    }
    let (ratio, added, cpu, wall_ratio, caused_ratio, client_cpu) = (
        median(&mut ratios),
        median(&mut added),
        median(&mut cpus),
        median(&mut wall_ratios),
        median(&mut caused_ratios),
        median(&mut cpu_added) * 1e3,
    );
    println!(
        "\ntrackers_quickstart: tracked cost (wall + MLflow server CPU) over plain wall, median of {pairs}: {ratio:.4} \
         (goal <= 1.02); added {added:.0} ms; MLflow server CPU {cpu:.0} ms; wall alone {wall_ratio:.4}; \
         wall + the server CPU the run caused (less its idle rate) {caused_ratio:.4}; the tracked run's own \
         processes (the quickstart, the W&B sidecar) spent {client_cpu:.0} ms more CPU than the plain run's"
    );

    if mlflow {
        let out = Command::new(&python)
            .arg("-c")
            .arg(MLFLOW_READER)
            .arg(&server.uri)
            .output()?;
        ensure!(
            out.status.success(),
            "MLflow's client failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let runs: Vec<(String, usize, i64)> = serde_json::from_slice(&out.stdout)?;
        // Every step with `metrics.mlflow.min_interval_seconds: null`, else a point per interval and the last step.
        ensure!(
            runs.len() == tracked_runs
                && runs.iter().all(|(status, points, last)| {
                    status == "FINISHED" && (1..=steps).contains(points) && *last == steps as i64 - 1
                }),
            "MLflow holds {runs:?} (status, points of rollout/reward, last step) for {tracked_runs} tracked runs \
         of {steps} steps"
        );
        let mut points: Vec<f64> = runs.iter().map(|r| r.1 as f64).collect();
        println!(
            "MLflow's client reads {tracked_runs} FINISHED runs ending at step {} with a median of {} points of \
         rollout/reward each",
            steps - 1,
            median(&mut points)
        );
    }

    let mut report = serde_json::Map::new();
    report.insert("pairs".into(), json!(rows));
    report.insert("steps".into(), json!(steps));
    report.insert("median_cost_ratio".into(), json!(ratio));
    report.insert("median_added_ms".into(), json!(added));
    report.insert("median_mlflow_server_cpu_ms".into(), json!(cpu));
    report.insert("median_wall_ratio".into(), json!(wall_ratio));
    report.insert("median_caused_cost_ratio".into(), json!(caused_ratio));
    report.insert("median_client_cpu_added_ms".into(), json!(client_cpu));
    report.insert("trackers".into(), json!(trackers));
    report.insert("overrides".into(), json!(extra));
    summary::write_summary(report, "trackers-quickstart-summary.json");
    Ok(())
}
