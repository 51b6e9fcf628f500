//! Arena on another host: `arena-sim` in a network namespace of its own, reachable from the run only through
//! a veth pair, and the run (`arena-rl train`, the quickstart's tiny policy) in this one.
//!
//! The proxy bound to every interface advertises the address of the interface that routes to Arena, checks
//! the route through Arena's gateway and trains; bound to loopback, or advertising an address Arena cannot
//! reach, the run stops at start with one line and launches nothing.
//!
//! Needs root (`ip netns`); where a namespace cannot be made the test fails and says why. Names carry the
//! process id, so a test finds and removes what an earlier killed run left, and everything it makes is
//! removed when it ends, also when it fails.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

/// Every namespace and host-side link this test makes starts with this, then the owner's process id.
const PREFIX: &str = "arlrt";
const TOKEN: &str = "tok-netns-5d0c2e81aa";
const LLM_KEY: &str = "llm-netns-b7193f0c4e";
const ADMIN_KEY: &str = "adm-netns-60e4a9d2f1";

pub(crate) fn ip(args: &[&str]) -> Output {
    Command::new("ip").args(args).output().expect("`ip` runs")
}

pub(crate) fn ip_ok(args: &[&str]) {
    let out = ip(args);
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
}

/// Removes what an earlier run of a test whose names start with `prefix` left when it was killed (its process,
/// whose id follows the prefix, is gone): the processes still inside its namespaces (stopped by their ids),
/// the namespaces, their `/etc/netns` folders, and the links in this namespace.
pub(crate) fn remove_leftovers(prefix: &str) {
    let alive = |name: &str| -> bool {
        let rest = name.trim_start_matches(prefix);
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        !pid.is_empty() && Path::new(&format!("/proc/{pid}")).exists()
    };
    let list = ip(&["netns", "list"]);
    for line in String::from_utf8_lossy(&list.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.starts_with(prefix) && !alive(name) {
            let pids = ip(&["netns", "pids", name]);
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-KILL", pid]).status();
            }
            let _ = ip(&["netns", "delete", name]);
            let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(name));
        }
    }
    if let Ok(dirs) = std::fs::read_dir("/etc/netns") {
        for dir in dirs.flatten() {
            let name = dir.file_name().to_string_lossy().into_owned();
            if name.starts_with(prefix) && !alive(&name) {
                let _ = std::fs::remove_dir_all(dir.path());
            }
        }
    }
    let links = ip(&["-o", "link", "show"]);
    for line in String::from_utf8_lossy(&links.stdout).lines() {
        let Some(name) = line.split(": ").nth(1).map(|n| n.split('@').next().unwrap_or(n)) else {
            continue;
        };
        if name.starts_with(prefix) && !alive(name) {
            let _ = ip(&["link", "delete", name]);
        }
    }
}

/// Arena's host: a namespace with one end of a veth pair; the other end stays in this namespace.
struct ArenaHost {
    ns: String,
    link: String,
    /// This host's address on the pair (what the proxy should advertise).
    local: String,
    /// Arena's address on the pair.
    remote: String,
}

impl ArenaHost {
    fn create() -> Self {
        let uid = Command::new("id").arg("-u").output().expect("`id -u` runs");
        assert_eq!(
            String::from_utf8_lossy(&uid.stdout).trim(),
            "0",
            "this test makes a network namespace for Arena's host and needs root (CI runs as root)"
        );
        remove_leftovers(PREFIX);
        let pid = std::process::id();
        let host = Self {
            ns: format!("{PREFIX}{pid}n"),
            link: format!("{PREFIX}{pid}h"),
            local: format!("10.{}.{}.1", 100 + pid % 100, (pid / 100) % 250),
            remote: format!("10.{}.{}.2", 100 + pid % 100, (pid / 100) % 250),
        };
        // From here on, Drop removes what exists.
        ip_ok(&["netns", "add", &host.ns]);
        let peer = format!("{PREFIX}{pid}a");
        ip_ok(&["link", "add", &host.link, "type", "veth", "peer", "name", &peer]);
        ip_ok(&["link", "set", &peer, "netns", &host.ns]);
        ip_ok(&[
            "netns", "exec", &host.ns, "ip", "link", "set", &peer, "name", "arena0",
        ]);
        ip_ok(&["addr", "add", &format!("{}/24", host.local), "dev", &host.link]);
        ip_ok(&["link", "set", &host.link, "up"]);
        let exec = |args: &[&str]| {
            let mut full = vec!["netns", "exec", &host.ns, "ip"];
            full.extend(args);
            ip_ok(&full);
        };
        exec(&["addr", "add", &format!("{}/24", host.remote), "dev", "arena0"]);
        exec(&["link", "set", "arena0", "up"]);
        exec(&["link", "set", "lo", "up"]);
        host
    }

    /// `arena-sim --preset quickstart` inside the namespace, on Arena's address.
    fn start_sim(&self, bin: &Path) -> Sim {
        let mut child = Command::new("ip")
            .args(["netns", "exec", &self.ns])
            .arg(bin)
            .args(["--preset", "quickstart", "--bind", &format!("{}:0", self.remote)])
            .env("ARENA_SIM_TOKEN", TOKEN)
            .env("ARENA_SIM_LLM_API_KEY", LLM_KEY)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("arena-sim starts in the namespace");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped stdout"))
            .read_line(&mut line)
            .expect("arena-sim prints its base URL");
        let base_url = line.trim().to_string();
        assert!(
            base_url.starts_with(&format!("http://{}:", self.remote)),
            "arena-sim printed {line:?}"
        );
        Sim { child, base_url }
    }
}

impl Drop for ArenaHost {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.ns]);
        let _ = ip(&["link", "delete", &self.link]);
    }
}

/// `arena-sim` in Arena's namespace (`ip netns exec` runs it as its own process), stopped by its PID.
struct Sim {
    child: Child,
    base_url: String,
}

impl Drop for Sim {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Sim {
    /// The ids of the tasks launched in `stream` (its history rows have none).
    fn launched(&self, stream: &str) -> usize {
        let out = Command::new("curl")
            .args(["-sf", "--noproxy", "*", "-H"])
            .arg(format!("Authorization: Bearer {TOKEN}"))
            .arg(format!(
                "{}/openapi/v1/streams/{stream}/tasks?limit=100",
                self.base_url
            ))
            .output()
            .expect("curl runs");
        assert!(out.status.success(), "listing {stream}'s tasks failed");
        let body: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
        let items = body
            .get("data")
            .and_then(|d| d.get("items").or(Some(d)))
            .or_else(|| body.get("items"))
            .cloned()
            .unwrap_or_default();
        let text = items.to_string();
        text.matches("\"task_id\"").count()
    }
}

/// `arena-rl train` on the quickstart config against `arena`, with `overrides` after the test's own.
fn train(arena_rl: &Path, work: &Path, model: &Path, arena: &str, overrides: &[&str]) -> Output {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let started = std::time::Instant::now();
    let out = Command::new(arena_rl)
        .arg("train")
        .arg("--config")
        .arg(root.join("examples/configs/quickstart.yaml"))
        .arg(format!("econfig.arena_base_url={arena}"))
        .arg(format!("model.path={}", model.display()))
        .arg(format!("cluster.fileroot={}", work.join("runs").display()))
        .args([
            "actor.total_train_steps=2",
            "train_dataset.batch_size=2",
            "gconfig.n_samples=2",
        ])
        .args(overrides)
        .env_clear()
        .env("HOME", work)
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("ARENA_OPENAPI_TOKEN", TOKEN)
        .env("ARENA_LLM_API_KEY", LLM_KEY)
        .env("SWE_RL_ADMIN_API_KEY", ADMIN_KEY)
        .env("RUST_LOG", "info")
        .output()
        .expect("arena-rl train runs");
    eprintln!(
        "arena-rl train {overrides:?}: {:.1} s",
        started.elapsed().as_secs_f64()
    );
    out
}

pub(crate) fn prepare_policy(arena_rl: &Path, work: &Path) -> PathBuf {
    let fileroot = work.join("policy");
    let out = Command::new(arena_rl)
        .args(["quickstart", "--prepare-policy", "--warmup-steps", "0"])
        .arg(format!("cluster.fileroot={}", fileroot.display()))
        .env_clear()
        .env("HOME", work)
        .output()
        .expect("arena-rl quickstart --prepare-policy runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The lines of `stderr` that are errors: the run's own one-line refusal.
fn error_lines(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|l| l.starts_with("Error") || l.starts_with("error"))
        .collect()
}

#[test]
fn a_proxy_on_every_interface_is_reached_from_arenas_host_and_loopback_is_refused() {
    let (arena_rl, arena_sim) = crate::slurm::binaries();
    let host = ArenaHost::create();
    let sim = host.start_sim(&arena_sim);
    let work = tempfile::Builder::new()
        .prefix("netns-")
        .tempdir_in("/tmp")
        .expect("work dir");
    let model = prepare_policy(&arena_rl, work.path());
    let streams = ["sim-messages", "sim-chat"];
    let launched = |sim: &Sim| streams.iter().map(|s| sim.launched(s)).sum::<usize>();
    assert_eq!(launched(&sim), 0);

    // Loopback: refused at start, in one line naming both settings; nothing launched in Arena.
    let out = train(
        &arena_rl,
        work.path(),
        &model,
        &sim.base_url,
        &["proxy.host=127.0.0.1", "trial_name=loopback"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a loopback proxy trained:\n{stderr}");
    let errors = error_lines(&stderr);
    assert!(
        errors.len() == 1 && errors[0].contains("proxy.host") && errors[0].contains("proxy.public_url"),
        "{stderr}"
    );
    assert!(errors[0].contains("127.0.0.1"), "{stderr}");
    assert_eq!(launched(&sim), 0, "a refused run launched tasks");

    // An address that does not lead to the proxy: the route check through Arena's gateway stops the run.
    let out = train(
        &arena_rl,
        work.path(),
        &model,
        &sim.base_url,
        &[
            "proxy.host=0.0.0.0",
            &format!("proxy.public_url=http://{}:9", host.local),
            "trial_name=wrong-url",
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a wrong public URL trained:\n{stderr}");
    let errors = error_lines(&stderr);
    assert!(
        errors.len() == 1
            && errors[0].contains("route check")
            && errors[0].contains(&format!("{}:9", host.local)),
        "{stderr}"
    );
    assert_eq!(launched(&sim), 0, "a run whose route check failed launched tasks");

    // Every interface: the run advertises the veth address, its route check passes, and it trains two steps
    // in which every rollout was rewarded (Arena's harnesses reached the proxy through that address only).
    let out = train(
        &arena_rl,
        work.path(),
        &model,
        &sim.base_url,
        &["proxy.host=0.0.0.0", "trial_name=reached"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let advertised = format!("proxy=http://{}:", host.local);
    assert!(
        stderr
            .lines()
            .any(|l| l.contains("the proxy advertises this address to Arena") && l.contains(&advertised)),
        "{stderr}"
    );
    assert!(
        stderr.contains("route check: Arena's gateway reaches the proxy"),
        "{stderr}"
    );
    let metrics = std::fs::read_to_string(work.path().join("runs/quickstart/reached/metrics/metrics.jsonl"))
        .expect("metrics.jsonl written");
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
        launched(&sim) >= 8,
        "two steps of 2 x 2 rollouts launched fewer tasks"
    );
}
