//! `cargo xtask submit --profile multinode-cpu` on a Slurm cluster of three namespace nodes ([`crate::nodes`]),
//! against `arena-sim` on a host of its own that reaches the run only through the address the run advertises.
//!
//! The profile puts the trainer (the loop and the rollout proxy) on one node and its policy server, an
//! `sglang:` layout's server, on another; `SGLANG_LAUNCHER` is `xtask/sglang/as_serve_policy.py`, which checks
//! the arguments it receives with SGLang's own parser (`ARENA_RL_PY_SGLANG`) and then serves with
//! `arena-rl serve-policy`. With the proxy on every interface (the profile's setting) the controller and the train job end
//! COMPLETED after two steps in which every rollout was rewarded, and every route Arena registered leads to
//! the trainer node's address; with the proxy left on loopback the trainer stops at start with the one-line
//! refusal and nothing is launched in Arena.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::nodes::NodeCluster;

/// Distinctive credentials, given to arena-sim and the credentials file only.
const TOKEN: &str = "tok-multinode-4e1b77c2d9";
const LLM_KEY: &str = "llm-multinode-0a5f3c8e61";
const ADMIN_KEY: &str = "adm-multinode-93d2b6e0f4";
/// How long a submission may take, queue and two steps of the tiny policy in a debug build included.
const LIMIT: Duration = Duration::from_secs(600);

/// `arena-sim --preset quickstart` on Arena's host, stopped by its id.
struct Sim {
    child: Child,
    base_url: String,
    log: PathBuf,
}

impl Sim {
    fn start(cluster: &NodeCluster, bin: &Path, log: PathBuf) -> Self {
        let mut child = cluster
            .on_arena(bin)
            .args(["--preset", "quickstart", "--bind"])
            .arg(format!("{}:0", cluster.arena_addr()))
            .env("ARENA_SIM_TOKEN", TOKEN)
            .env("ARENA_SIM_LLM_API_KEY", LLM_KEY)
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).expect("arena-sim's log"))
            .spawn()
            .expect("arena-sim starts on Arena's host");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("arena-sim prints its base URL");
        let base_url = line.trim().to_string();
        assert!(
            base_url.starts_with(&format!("http://{}:", cluster.arena_addr())),
            "arena-sim printed {line:?}"
        );
        Self { child, base_url, log }
    }

    /// Tasks launched in the quickstart's two Streams, as Arena lists them (from its own host).
    fn launched(&self, cluster: &NodeCluster) -> usize {
        ["sim-messages", "sim-chat"]
            .iter()
            .map(|stream| {
                let out = cluster
                    .on_arena("curl")
                    .args(["-sf", "--noproxy", "*", "-H"])
                    .arg(format!("Authorization: Bearer {TOKEN}"))
                    .arg(format!(
                        "{}/openapi/v1/streams/{stream}/tasks?limit=100",
                        self.base_url
                    ))
                    .output()
                    .expect("curl runs");
                assert!(out.status.success(), "listing {stream}'s tasks failed");
                String::from_utf8_lossy(&out.stdout)
                    .matches("\"task_id\"")
                    .count()
            })
            .sum()
    }

    /// The lines of arena-sim's log that record a route registration.
    fn registrations(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("route registration"))
            .map(str::to_string)
            .collect()
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

/// The Python with SGLang's parser (`sglang==0.5.23`, the fixture `cargo xtask test` prepares).
fn sglang_python() -> String {
    std::env::var("ARENA_RL_PY_SGLANG").unwrap_or_else(|_| {
        panic!("ARENA_RL_PY_SGLANG is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
    })
}

/// Everything a submission needs: the cluster, arena-sim and a shared folder (policy, file root, credentials).
struct Site {
    // Dropped in this order: arena-sim, the files, then the cluster.
    sim: Sim,
    work: tempfile::TempDir,
    arena_rl: PathBuf,
    model: PathBuf,
    cluster: NodeCluster,
}

impl Site {
    fn path(&self, rel: &str) -> PathBuf {
        self.work.path().join(rel)
    }

    /// `xtask submit --profile multinode-cpu OVERRIDES` from the first node (the login node), with the
    /// SGLang launcher that checks its arguments and serves with serve-policy, recording them under
    /// `records/<trial>`; returns the controller's job id.
    fn submit(&self, trial: &str, overrides: &[&str]) -> String {
        let launcher = format!(
            "{} {}",
            sglang_python(),
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("sglang/as_serve_policy.py")
                .display()
        );
        let out = self
            .cluster
            .on(0, env!("CARGO_BIN_EXE_xtask"))
            .args(["submit", "--profile", "multinode-cpu"])
            .args(overrides)
            .env_clear()
            .envs(self.cluster.env())
            .env("HOME", self.work.path())
            .env("AREAL_CONTAINER_BIN", "none")
            .env("MODEL_PATH", &self.model)
            .env("AREAL_FILEROOT", self.path("runs"))
            .env("ARENA_CREDENTIALS_FILE", self.path("arena.env"))
            .env("ARENA_RL_BIN", &self.arena_rl)
            .env("ARENA_OPENAPI_BASE", &self.sim.base_url)
            .env("ARENA_SUPERVISE_INTERVAL", "1")
            .env("TRIAL_NAME", trial)
            .env("SGLANG_LAUNCHER", launcher)
            .env(
                "ARENA_RL_SGLANG_RECORD_DIR",
                self.path(&format!("records/{trial}")),
            )
            .output()
            .expect("xtask runs");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "xtask submit failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let job = stdout.trim().to_string();
        assert!(job.bytes().all(|b| b.is_ascii_digit()), "job id {job:?}");
        job
    }

    /// Waits for the controller `job` of `trial` to end; returns its state, its log, the train job's id and
    /// log, and when the run's first metrics line (its first trained step) was first seen.
    fn wait(&self, trial: &str, job: &str) -> Ended {
        let start = Instant::now();
        let metrics = self.path(&format!("runs/arena-local/{trial}/metrics/metrics.jsonl"));
        let mut first_step = None;
        let state = loop {
            if first_step.is_none()
                && std::fs::read_to_string(&metrics).is_ok_and(|m| m.lines().next().is_some())
            {
                first_step = Some(Instant::now());
            }
            match self.cluster.job_state(job).as_deref() {
                Some("PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING") | None => {}
                Some(done) => break done.to_string(),
            }
            assert!(
                start.elapsed() < LIMIT,
                "the controller {job} did not end in {LIMIT:?}\n{}",
                self.cluster.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        };
        let dir = self.path(&format!("runs/submissions/{trial}"));
        let read = |p: PathBuf| std::fs::read_to_string(p).unwrap_or_default();
        let train_job = read(dir.join("train.jobid")).trim().to_string();
        Ended {
            state,
            log: read(dir.join(format!("controller-{job}.log"))),
            train_log: read(dir.join(format!("train-{train_job}.log"))),
            train_job,
            first_step,
        }
    }
}

struct Ended {
    state: String,
    log: String,
    train_job: String,
    train_log: String,
    first_step: Option<Instant>,
}

#[test]
fn multinode_cpu_trains_across_namespace_nodes_and_a_loopback_proxy_is_refused() {
    let (arena_rl, arena_sim) = crate::slurm::binaries();
    let started = Instant::now();
    let cluster = NodeCluster::start(3);
    eprintln!(
        "a cluster of 3 nodes is idle after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let work = tempfile::Builder::new()
        .prefix(&format!("{}-work-", cluster.tag()))
        .tempdir_in("/tmp")
        .expect("work dir");
    let sim = Sim::start(&cluster, &arena_sim, work.path().join("arena-sim.log"));
    let model = crate::netns::prepare_policy(&arena_rl, work.path());
    std::fs::create_dir_all(work.path().join("runs")).expect("file root");
    std::fs::write(
        work.path().join("arena.env"),
        format!(
            "export ARENA_OPENAPI_BASE={}\nexport ARENA_OPENAPI_TOKEN={TOKEN}\n\
             export ARENA_LLM_API_KEY={LLM_KEY}\nexport SWE_RL_ADMIN_API_KEY={ADMIN_KEY}\n",
            sim.base_url
        ),
    )
    .expect("credentials file");
    let site = Site {
        sim,
        work,
        arena_rl,
        model,
        cluster,
    };
    assert_eq!(site.sim.launched(&site.cluster), 0);

    // The proxy left on loopback: the trainer stops at start with the one-line refusal, before Arena launches
    // anything, and the job and its controller fail.
    let job = site.submit("mn-loopback", &["proxy.host=127.0.0.1"]);
    let ended = site.wait("mn-loopback", &job);
    let train_log = &ended.train_log;
    assert_eq!(
        ended.state, "FAILED",
        "controller log:\n{}\ntrain log:\n{train_log}",
        ended.log
    );
    let errors: Vec<&str> = train_log
        .lines()
        .filter(|l| l.starts_with("Error") || l.starts_with("error"))
        .collect();
    assert!(
        errors.len() == 1
            && errors[0].contains("proxy.host")
            && errors[0].contains("proxy.public_url")
            && errors[0].contains("127.0.0.1"),
        "{train_log}"
    );
    assert_eq!(
        site.sim.launched(&site.cluster),
        0,
        "a refused run launched tasks"
    );
    assert!(
        site.sim.registrations().is_empty(),
        "a refused run registered a route"
    );

    // The profile as it is: trainer and policy server on two nodes, Arena reaching the trainer's proxy.
    let trial = "mn-train";
    let submitted = Instant::now();
    let job = site.submit(trial, &[]);
    let ended = site.wait(trial, &job);
    let train_log = &ended.train_log;
    assert_eq!(
        ended.state,
        "COMPLETED",
        "controller log:\n{}\ntrain log:\n{train_log}\n{}",
        ended.log,
        site.cluster.logs()
    );
    assert_eq!(
        site.cluster.job_state(&ended.train_job).as_deref(),
        Some("COMPLETED"),
        "{train_log}"
    );
    let first_step = ended
        .first_step
        .expect("the first metrics line was seen while the job ran");
    eprintln!(
        "xtask submit to the first trained step: {:.1} s (to COMPLETED: {:.1} s)",
        (first_step - submitted).as_secs_f64(),
        submitted.elapsed().as_secs_f64()
    );

    // Placement: the trainer on one node, its policy server on another.
    let placed = train_log
        .lines()
        .find_map(|l| l.strip_prefix(&format!("train: trial {trial}: trainer on ")))
        .unwrap_or_else(|| panic!("no placement line in:\n{train_log}"));
    let (trainer, servers) = placed
        .split_once("; policy servers: ")
        .unwrap_or_else(|| panic!("placement {placed:?}"));
    let nodes = site.cluster.nodes();
    let trainer = nodes
        .iter()
        .find(|n| n.name == trainer)
        .unwrap_or_else(|| panic!("the trainer's node {trainer:?} is not a node of the cluster"));
    let server = nodes
        .iter()
        .find(|n| n.name != trainer.name && servers == format!("http://{}:30000", n.name));
    assert!(
        server.is_some(),
        "policy servers {servers:?}, trainer on {}",
        trainer.name
    );

    // On its own node the trainer's hostname resolves to 127.0.1.1, as on Debian, so a URL built from it would
    // be loopback: the trainer advertised its node's address instead, Arena's gateway reached it, and every
    // route Arena registered leads there.
    let index = nodes.iter().position(|n| n.name == trainer.name).expect("a node");
    let resolved = site
        .cluster
        .on(index, "getent")
        .args(["hosts", &trainer.name])
        .output()
        .expect("getent runs");
    let resolved = String::from_utf8_lossy(&resolved.stdout);
    assert!(
        resolved.starts_with("127.0.1.1 "),
        "{} resolves to {resolved:?} on itself",
        trainer.name
    );
    let advertised = format!("http://{}:", trainer.addr);
    assert!(
        train_log.lines().any(|l| {
            l.contains("the proxy advertises this address to Arena")
                && l.contains(&format!("proxy={advertised}"))
        }),
        "{train_log}"
    );
    assert!(
        train_log.contains("route check: Arena's gateway reaches the proxy"),
        "{train_log}"
    );
    let registrations = site.sim.registrations();
    assert!(!registrations.is_empty(), "arena-sim recorded no route");
    for line in &registrations {
        assert!(line.contains(&advertised), "a route not to {advertised}: {line}");
    }
    eprintln!(
        "trainer on {} ({}), policy server on {}; arena-sim recorded {} route registration(s), all to {advertised}",
        trainer.name,
        trainer.addr,
        server.map_or("", |s| s.name.as_str()),
        registrations.len()
    );

    // The policy server received SGLang's arguments for one CPU server of the layout, which SGLang's parser
    // accepted (the launcher records SGLang's reading), with its key in the environment and on no command line.
    let records: Vec<PathBuf> = std::fs::read_dir(site.path(&format!("records/{trial}")))
        .expect("the launcher recorded its arguments")
        .map(|e| e.expect("entry").path())
        .collect();
    assert_eq!(records.len(), 1, "{records:?}");
    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&records[0]).expect("a record")).expect("JSON");
    let model = site.model.display().to_string();
    for (field, want) in [
        ("model_path", serde_json::json!(model)),
        ("host", serde_json::json!("0.0.0.0")),
        ("port", serde_json::json!(30000)),
        ("tp_size", serde_json::json!(1)),
        ("pp_size", serde_json::json!(1)),
        ("dp_size", serde_json::json!(1)),
        ("context_length", serde_json::json!(256)),
        ("device", serde_json::json!("cpu")),
        ("dtype", serde_json::json!("float32")),
        ("key_in_environment", serde_json::json!(true)),
        ("cmdlines_holding_the_key", serde_json::json!([])),
    ] {
        assert_eq!(record[field], want, "{field} in {record}");
    }

    // Two steps, every rollout rewarded.
    let run = site.path(&format!("runs/arena-local/{trial}"));
    assert!(
        train_log.contains(&format!("trained 2 step(s) in {}", run.display())),
        "{train_log}"
    );
    let metrics = std::fs::read_to_string(run.join("metrics/metrics.jsonl")).expect("metrics.jsonl");
    let lines: Vec<serde_json::Value> = metrics
        .lines()
        .map(|l| serde_json::from_str(l).expect("a metrics line is JSON"))
        .collect();
    assert_eq!(lines.len(), 2, "{metrics}");
    for line in &lines {
        let rejected: Vec<(&String, &serde_json::Value)> = line
            .as_object()
            .expect("an object")
            .iter()
            .filter(|(k, v)| k.starts_with("rollout/group_rejected/sample_") && v.as_f64() != Some(0.0))
            .collect();
        assert!(rejected.is_empty(), "rejected rollouts: {rejected:?}\n{metrics}");
        assert!(line.get("rollout/reward").is_some(), "{line}");
    }
    assert!(
        site.sim.launched(&site.cluster) >= 8,
        "two steps of 2 x 2 rollouts launched fewer tasks"
    );
}
