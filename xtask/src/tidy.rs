//! The layering test: which workspace crate may depend on which, and where heavy dependencies may live
//! (`../shared/STYLE.md`, "Dependency direction").
//!
//! It reads `cargo metadata` and checks normal dependencies only: dev-dependencies may cross the layering
//! where a test needs it, and `benches` is a leaf that may depend on anything. It also reads the sources for
//! the rules no manifest shows: `anyhow` only at `arena-rl`'s edges (`main.rs`, `cmd/`), no Arena
//! registration, launch or poll in `arena-rl` (`arena-client`'s `run_rollout` owns the lifecycle), and one
//! definition of each piece of shared vocabulary, in `stream-config`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::path::Path;
use std::process::Command;

use serde_json::Value;

/// The workspace crates each crate may depend on; a crate missing here may depend on none.
const ALLOWED: &[(&str, &[&str])] = &[
    ("stream-config", &[]),
    ("arena-client", &["stream-config"]),
    ("reward-routing", &["stream-config"]),
    ("rollout-proxy", &[]),
    ("trainer", &[]),
    ("arena-sim", &["stream-config"]),
    (
        "arena-rl",
        &[
            "stream-config",
            "arena-client",
            "reward-routing",
            "rollout-proxy",
            "trainer",
            "arena-sim",
        ],
    ),
    ("xtask", &["stream-config"]),
];

/// Crates exempt from every rule here.
const LEAVES: &[&str] = &["benches"];

/// Direct dependencies that only some crates may declare: (name prefix, the crates that may).
const HEAVY: &[(&str, &[&str])] = &[
    ("burn", &["trainer"]),
    ("cubecl", &["trainer"]),
    ("axum", &["rollout-proxy", "arena-sim"]),
    ("hyper", &["rollout-proxy", "arena-sim"]),
    ("tower-http", &["rollout-proxy", "arena-sim"]),
    ("actix", &["rollout-proxy", "arena-sim"]),
    ("warp", &["rollout-proxy", "arena-sim"]),
    ("poem", &["rollout-proxy", "arena-sim"]),
];

/// Async runtimes that must not be reachable, even transitively, from these crates.
const NO_RUNTIME: &[&str] = &["stream-config", "reward-routing"];
const RUNTIMES: &[&str] = &["tokio", "async-std", "smol", "async-executor"];

struct Metadata {
    /// Workspace crate name -> its direct normal dependencies (names).
    direct: BTreeMap<String, BTreeSet<String>>,
    /// Package id -> (name, ids of normal dependencies).
    graph: BTreeMap<String, (String, Vec<String>)>,
    /// Workspace crate name -> package id.
    ids: BTreeMap<String, String>,
}

fn metadata() -> Metadata {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root");
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1"])
        .current_dir(root)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: Value = serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON");
    let members: BTreeSet<&str> = meta["workspace_members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let mut direct = BTreeMap::new();
    let mut ids = BTreeMap::new();
    for pkg in meta["packages"].as_array().unwrap() {
        let id = pkg["id"].as_str().unwrap();
        if !members.contains(id) {
            continue;
        }
        let name = pkg["name"].as_str().unwrap().to_string();
        let deps = pkg["dependencies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"].is_null())
            .map(|d| d["name"].as_str().unwrap().to_string())
            .collect();
        ids.insert(name.clone(), id.to_string());
        direct.insert(name, deps);
    }
    let mut graph = BTreeMap::new();
    for node in meta["resolve"]["nodes"].as_array().unwrap() {
        let id = node["id"].as_str().unwrap().to_string();
        let name = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| p["id"] == node["id"])
            .map(|p| p["name"].as_str().unwrap().to_string())
            .unwrap_or_default();
        let deps = node["deps"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                d["dep_kinds"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|k| k["kind"].is_null())
            })
            .map(|d| d["pkg"].as_str().unwrap().to_string())
            .collect();
        graph.insert(id, (name, deps));
    }
    Metadata { direct, graph, ids }
}

fn check_layering(meta: &Metadata) -> Vec<String> {
    let workspace: BTreeSet<&str> = meta.direct.keys().map(String::as_str).collect();
    let mut problems = Vec::new();
    for (krate, deps) in &meta.direct {
        if LEAVES.contains(&krate.as_str()) {
            continue;
        }
        let allowed = ALLOWED
            .iter()
            .find(|(k, _)| k == krate)
            .map(|(_, a)| *a)
            .unwrap_or(&[]);
        for dep in deps {
            if workspace.contains(dep.as_str()) && !allowed.contains(&dep.as_str()) {
                problems.push(format!("{krate} may not depend on the workspace crate {dep}"));
            }
            for (prefix, homes) in HEAVY {
                if dep.starts_with(prefix) && !homes.contains(&krate.as_str()) {
                    problems.push(format!(
                        "{krate} may not depend on {dep}: it belongs in {homes:?} only"
                    ));
                }
            }
        }
    }
    for krate in NO_RUNTIME {
        let Some(start) = meta.ids.get(*krate) else {
            continue;
        };
        let mut seen = BTreeSet::new();
        let mut queue = VecDeque::from([start.clone()]);
        while let Some(id) = queue.pop_front() {
            if !seen.insert(id.clone()) {
                continue;
            }
            let Some((name, deps)) = meta.graph.get(&id) else {
                continue;
            };
            if RUNTIMES.contains(&name.as_str()) {
                problems.push(format!(
                    "{krate} reaches the async runtime {name} through its dependencies"
                ));
            }
            queue.extend(deps.iter().cloned());
        }
    }
    problems
}

#[test]
fn workspace_layering_holds() {
    let problems = check_layering(&metadata());
    assert!(
        problems.is_empty(),
        "layering violations:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn layering_check_catches_violations() {
    let mut meta = metadata();
    meta.direct
        .entry("stream-config".into())
        .or_default()
        .insert("arena-client".into());
    meta.direct
        .entry("reward-routing".into())
        .or_default()
        .insert("burn-ndarray".into());
    meta.direct
        .entry("arena-client".into())
        .or_default()
        .insert("axum".into());
    let sc = meta.ids["stream-config"].clone();
    meta.graph
        .insert("fake-tokio".into(), ("tokio".into(), Vec::new()));
    meta.graph
        .get_mut(&sc)
        .expect("stream-config is resolved")
        .1
        .push("fake-tokio".into());
    let problems = check_layering(&meta);
    let want = [
        "stream-config may not depend on the workspace crate arena-client",
        "reward-routing may not depend on burn-ndarray",
        "arena-client may not depend on axum",
        "stream-config reaches the async runtime tokio",
    ];
    for w in want {
        assert!(
            problems.iter().any(|p| p.starts_with(w)),
            "missing {w:?} in {problems:?}"
        );
    }
}

/// Every `.rs` file under `dir`, with its text.
fn sources(dir: &Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d)
            .expect("the source folder is readable")
            .flatten()
        {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("sources are UTF-8");
                out.push((path, text));
            }
        }
    }
    out.sort();
    out
}

fn workspace_root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
}

/// Source rules of `arena-rl`'s library: what it must not contain, by file.
fn check_arena_rl_sources(files: &[(std::path::PathBuf, String)], src: &Path) -> Vec<String> {
    const LIFECYCLE: &[&str] = &[
        ".register_model(",
        ".launch_one_task(",
        ".wait_for_task(",
        ".get_task_result(",
        ".run_task(",
        ".acquire(",
    ];
    let mut problems = Vec::new();
    for (path, text) in files {
        let rel = path.strip_prefix(src).unwrap_or(path);
        let edge = rel == Path::new("main.rs") || rel.starts_with("cmd");
        if !edge && text.contains("anyhow") {
            problems.push(format!(
                "arena-rl/src/{} uses anyhow: the library returns crate::Error (anyhow is for main.rs and cmd/)",
                rel.display()
            ));
        }
        for call in LIFECYCLE {
            if text.contains(call) {
                problems.push(format!(
                    "arena-rl/src/{} calls {call}..): a rollout's Arena side is arena_client::ArenaClient::run_rollout_with",
                    rel.display()
                ));
            }
        }
    }
    problems
}

/// Shared vocabulary defined outside `stream-config`.
fn check_vocabulary(files: &[(std::path::PathBuf, String)], root: &Path) -> Vec<String> {
    const DEFINITIONS: &[&str] = &[
        "pub struct RewardRef {",
        "pub struct ArenaRef {",
        "const UNKNOWN_TASK_TYPE",
        "const TRANSIENT_403_MARKER",
        "fn task_type_from_tags",
        "fn reward_ref_drift",
    ];
    let home = root.join("crates/stream-config/src");
    let mut problems = Vec::new();
    for (path, text) in files {
        if path.starts_with(&home) {
            continue;
        }
        for def in DEFINITIONS {
            if text.contains(def) {
                let rel = path.strip_prefix(root).unwrap_or(path);
                problems.push(format!(
                    "{} defines `{def}`: it lives in stream-config",
                    rel.display()
                ));
            }
        }
    }
    problems
}

/// arena-sim's rooms stay small: no source file (tests aside) over this many lines.
const ARENA_SIM_MAX_FILE_LINES: usize = 500;

/// arena-sim's source files over [`ARENA_SIM_MAX_FILE_LINES`] lines (its `tests.rs` files aside).
fn check_arena_sim_sizes(files: &[(std::path::PathBuf, String)], src: &Path) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| path.file_name().is_none_or(|n| n != "tests.rs"))
        .filter(|(_, text)| text.lines().count() > ARENA_SIM_MAX_FILE_LINES)
        .map(|(path, text)| {
            format!(
                "arena-sim/src/{} has {} lines (at most {ARENA_SIM_MAX_FILE_LINES}): split it into rooms",
                path.strip_prefix(src).unwrap_or(path).display(),
                text.lines().count()
            )
        })
        .collect()
}

#[test]
fn arena_sim_files_stay_small() {
    let src = workspace_root().join("crates/arena-sim/src");
    let problems = check_arena_sim_sizes(&sources(&src), &src);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let long = "x\n".repeat(ARENA_SIM_MAX_FILE_LINES + 1);
    let fake = Path::new("/x/crates/arena-sim/src");
    let files = vec![
        (fake.join("server.rs"), long.clone()),
        (fake.join("state/tests.rs"), long),
        (fake.join("sse.rs"), "x\n".to_string()),
    ];
    let problems = check_arena_sim_sizes(&files, fake);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("arena-sim/src/server.rs has 501 lines"),
        "{problems:?}"
    );
}

#[test]
fn arena_rl_sources_keep_their_rules() {
    let src = workspace_root().join("crates/arena-rl/src");
    let problems = check_arena_rl_sources(&sources(&src), &src);
    assert!(
        problems.is_empty(),
        "source rules broken:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn shared_vocabulary_is_defined_once() {
    let root = workspace_root();
    let files = sources(&root.join("crates"));
    let problems = check_vocabulary(&files, root);
    assert!(
        problems.is_empty(),
        "vocabulary defined twice:\n  {}",
        problems.join("\n  ")
    );
}

#[test]
fn source_rules_catch_violations() {
    let src = Path::new("/x/crates/arena-rl/src");
    let files = vec![
        (src.join("run.rs"), "use anyhow::Result;".to_string()),
        (src.join("cmd/train.rs"), "use anyhow::Result;".to_string()),
        (
            src.join("workflow.rs"),
            "client.launch_one_task(s, &r, None)".to_string(),
        ),
    ];
    let problems = check_arena_rl_sources(&files, src);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("run.rs uses anyhow"), "{problems:?}");
    assert!(
        problems[1].contains("workflow.rs calls .launch_one_task("),
        "{problems:?}"
    );
    let root = Path::new("/x");
    let files = vec![
        (
            root.join("crates/arena-client/src/streams.rs"),
            "pub struct ArenaRef {".to_string(),
        ),
        (
            root.join("crates/stream-config/src/stream.rs"),
            "pub struct ArenaRef {".to_string(),
        ),
    ];
    let problems = check_vocabulary(&files, root);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].starts_with("crates/arena-client/src/streams.rs defines"),
        "{problems:?}"
    );
}
