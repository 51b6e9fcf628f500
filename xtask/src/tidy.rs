//! The layering test: which workspace crate may depend on which, and where heavy dependencies may live
//! (`../shared/STYLE.md`, "Dependency direction").
//!
//! It reads `cargo metadata` and checks normal dependencies only: dev-dependencies may cross the layering
//! where a test needs it, and `benches` is a leaf that may depend on anything. It also reads the sources for
//! the rules no manifest shows: `anyhow` only at `arena-rl`'s edges (`main.rs`, `cmd/`), no Arena
//! registration, launch or poll in `arena-rl` (`arena-client`'s `run_rollout` owns the lifecycle), one
//! definition of each piece of shared vocabulary, in `stream-config`, one copy of each shared mechanism, in
//! its leaf crate ([`SHARED_LEAVES`]), no circle among `rollout-proxy`'s modules, and no run-time type test
//! in `trainer` ([`TYPE_TESTS`]).

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
    ("fsdp2-trainer", &[]),
    ("arena-sim", &["stream-config"]),
    (
        "arena-rl",
        &[
            "stream-config",
            "arena-client",
            "reward-routing",
            "rollout-proxy",
            "trainer",
            "fsdp2-trainer",
            "arena-sim",
        ],
    ),
    ("xtask", &["stream-config"]),
];

/// Crates exempt from every rule here.
const LEAVES: &[&str] = &["benches"];

/// Small leaf crates that each hold one shared mechanism (`../shared/STYLE.md`): any crate that would
/// otherwise copy it may depend on one; they depend on no workspace crate and carry their own tests. Each
/// is listed with what defines its mechanism, which no other crate may define again.
const SHARED_LEAVES: &[(&str, &[&str])] = &[
    (
        "http-guard",
        &[
            "struct ConnectionLimits",
            "enum BodyRefused",
            "struct Watchdog",
            "struct Guarded",
            "fn serve_with(",
        ],
    ),
    (
        // The integrity guard's rules: the config loader validates user rules with it, the proxy scans
        // generations with it and `arena-rl guard check` audits with it.
        "integrity-guard",
        &[
            "struct RuleSpec",
            "struct RuleSet",
            "struct Scanner",
            "DEFAULT_RULES_YAML: &str",
        ],
    ),
    (
        "seeds",
        &[
            "struct SplitMix",
            "fn splitmix(",
            "fn fnv1a(",
            // SplitMix64's mixer, however the copy is named.
            "0xbf58_476d_1ce4_e5b9",
            "0xbf58476d1ce4e5b9",
        ],
    ),
];

/// Direct dependencies that only some crates may declare: (name prefix, the crates that may).
const HEAVY: &[(&str, &[&str])] = &[
    ("burn", &["trainer"]),
    ("cubecl", &["trainer"]),
    ("axum", &["rollout-proxy", "arena-sim", "http-guard"]),
    ("hyper", &["rollout-proxy", "arena-sim", "http-guard"]),
    ("tower-http", &["rollout-proxy", "arena-sim"]),
    ("actix", &["rollout-proxy", "arena-sim"]),
    ("warp", &["rollout-proxy", "arena-sim"]),
    ("poem", &["rollout-proxy", "arena-sim"]),
];

/// Async runtimes that must not be reachable, even transitively, from these crates.
const NO_RUNTIME: &[&str] = &["stream-config", "reward-routing", "integrity-guard"];
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
        let shared_leaf = SHARED_LEAVES.iter().any(|(leaf, _)| leaf == krate);
        for dep in deps {
            let leaf_dep = SHARED_LEAVES.iter().any(|(leaf, _)| leaf == dep);
            if workspace.contains(dep.as_str()) && shared_leaf {
                problems.push(format!(
                    "{krate} may not depend on the workspace crate {dep}: a shared leaf crate depends on none"
                ));
            } else if workspace.contains(dep.as_str()) && !allowed.contains(&dep.as_str()) && !leaf_dep {
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
    meta.direct
        .entry("http-guard".into())
        .or_default()
        .insert("stream-config".into());
    let problems = check_layering(&meta);
    let want = [
        "http-guard may not depend on the workspace crate stream-config: a shared leaf crate depends on none",
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
        "enum LlmProtocol {",
        "enum RouteMode {",
        "enum TaskStatus {",
        // Durations: every duration setting is a `Seconds`.
        "struct Seconds(",
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

/// Run-time type tests that would choose a backend behind burn's back; `trainer` dispatches through
/// `impl Kernels for` each backend instead.
const TYPE_TESTS: &[&str] = &["TypeId", "type_name", "Any::is", ".is::<", "downcast"];

/// `trainer`'s sources that test types at run time ([`TYPE_TESTS`], outside comments, as whole words).
fn check_trainer_dispatch(files: &[(std::path::PathBuf, String)], src: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (path, text) in files {
        let code = without_comments(text);
        for word in TYPE_TESTS {
            let starts_word = word.starts_with(|c: char| c.is_alphanumeric());
            let hit = code.match_indices(word).any(|(i, _)| {
                !starts_word
                    || !code[..i]
                        .chars()
                        .next_back()
                        .is_some_and(|c| c.is_alphanumeric() || c == '_')
            });
            if hit {
                problems.push(format!(
                    "trainer/src/{} uses `{word}`: backend-specific code is an `impl Kernels for` the backend",
                    path.strip_prefix(src).unwrap_or(path).display()
                ));
            }
        }
    }
    problems
}

#[test]
fn trainer_dispatches_through_kernels() {
    let src = workspace_root().join("crates/trainer/src");
    let problems = check_trainer_dispatch(&sources(&src), &src);
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    let fake = Path::new("/x/crates/trainer/src");
    let files = vec![
        (
            fake.join("a.rs"),
            "if TypeId::of::<B>() == TypeId::of::<Cpu>() {}".to_string(),
        ),
        (
            fake.join("b.rs"),
            "let t = (&p as &dyn Any).downcast_ref::<T>();".to_string(),
        ),
        (
            fake.join("c.rs"),
            "let dtype_name = 1; // a TypeId in a comment".to_string(),
        ),
        (fake.join("d.rs"), "if any.is::<NdArrayTensor>() {}".to_string()),
    ];
    let problems = check_trainer_dispatch(&files, fake);
    assert_eq!(problems.len(), 3, "{problems:?}");
    assert!(
        problems[0].starts_with("trainer/src/a.rs uses `TypeId`"),
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
        (
            root.join("crates/arena-sim/src/tasks.rs"),
            "pub(crate) enum TaskStatus {".to_string(),
        ),
        (
            root.join("crates/arena-client/src/config.rs"),
            "pub enum RouteMode {\n}\npub enum LlmProtocol {".to_string(),
        ),
        (
            root.join("crates/reward-routing/src/time.rs"),
            "struct Seconds(f64);".to_string(),
        ),
    ];
    let problems = check_vocabulary(&files, root);
    assert_eq!(problems.len(), 5, "{problems:?}");
    assert!(
        problems[0].starts_with("crates/arena-client/src/streams.rs defines"),
        "{problems:?}"
    );
    for def in ["TaskStatus", "LlmProtocol", "RouteMode", "Seconds"] {
        assert!(
            problems.iter().any(|p| p.contains(def)),
            "{def} defined again is caught: {problems:?}"
        );
    }
}

/// Where a shared leaf crate's mechanism is defined again outside it, and leaf crates without tests.
fn check_shared_leaves(files: &[(std::path::PathBuf, String)], root: &Path) -> Vec<String> {
    let mut problems = Vec::new();
    for (leaf, definitions) in SHARED_LEAVES {
        let home = root.join("crates").join(leaf).join("src");
        if !files.is_empty()
            && !files
                .iter()
                .any(|(p, t)| p.starts_with(&home) && t.contains("#[test]"))
        {
            problems.push(format!(
                "the shared leaf crate {leaf} carries no tests of its own"
            ));
        }
        for (path, text) in files {
            if path.starts_with(&home) {
                continue;
            }
            let lower = text.to_ascii_lowercase();
            for def in *definitions {
                if lower.contains(&def.to_ascii_lowercase()) {
                    let rel = path.strip_prefix(root).unwrap_or(path);
                    problems.push(format!(
                        "{} defines `{def}` again: use the {leaf} crate's",
                        rel.display()
                    ));
                }
            }
        }
    }
    problems
}

#[test]
fn shared_mechanisms_live_in_their_leaf_crates() {
    let root = workspace_root();
    let mut files = sources(&root.join("crates"));
    files.extend(sources(&root.join("benches")));
    files.extend(
        sources(&root.join("xtask/src"))
            .into_iter()
            .filter(|(p, _)| !p.ends_with("tidy.rs")),
    );
    let problems = check_shared_leaves(&files, root);
    assert!(
        problems.is_empty(),
        "shared mechanisms copied:\n  {}",
        problems.join("\n  ")
    );
    let fake = Path::new("/x");
    let files = vec![
        (
            fake.join("crates/http-guard/src/lib.rs"),
            "pub struct Watchdog {}".to_string(),
        ),
        (fake.join("crates/http-guard/src/tests.rs"), "#[test]".to_string()),
        (
            fake.join("crates/integrity-guard/src/scan/tests.rs"),
            "#[test]".to_string(),
        ),
        (
            fake.join("crates/seeds/src/lib.rs"),
            "#[test] pub fn fnv1a(".to_string(),
        ),
        (
            fake.join("crates/arena-sim/src/conn.rs"),
            "struct Watchdog {".to_string(),
        ),
        (
            fake.join("crates/trainer/src/rng.rs"),
            "z.wrapping_mul(0xBF58_476D_1CE4_E5B9)".to_string(),
        ),
    ];
    let problems = check_shared_leaves(&files, fake);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems[0].starts_with("crates/arena-sim/src/conn.rs defines `struct Watchdog` again"),
        "{problems:?}"
    );
    assert!(
        problems[1].starts_with("crates/trainer/src/rng.rs defines `0xbf58"),
        "{problems:?}"
    );
}

/// The module path of a source file under `src` (`lib.rs` is the root, `a/mod.rs` is `a`).
fn module_path(path: &Path, src: &Path) -> Vec<String> {
    let rel = path.strip_prefix(src).unwrap_or(path);
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if let Some(last) = parts.pop() {
        let stem = last.trim_end_matches(".rs");
        if !matches!(stem, "lib" | "main" | "mod") {
            parts.push(stem.to_string());
        }
    }
    parts
}

/// `text` without its `//` comments (doc links name modules without depending on them).
fn without_comments(text: &str) -> String {
    text.lines()
        .map(|line| line.find("//").map_or(line, |i| &line[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_at(text: &str) -> &str {
    let end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(text.len());
    &text[..end]
}

/// The first segments of the paths a `{...}` group at the start of `text` lists.
fn group_heads(text: &str) -> Vec<&str> {
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item_start = 1;
    for (i, c) in text.char_indices() {
        match c {
            '{' => depth += 1,
            '}' | ',' if depth == 1 => {
                heads.push(ident_at(text[item_start..i].trim_start()));
                item_start = i + 1;
                if c == '}' {
                    break;
                }
            }
            '}' => depth -= 1,
            _ => {}
        }
    }
    heads.retain(|h| !h.is_empty());
    heads
}

/// The names a crate root re-exports from its modules (`pub use a::{B, c::D as E}` gives B and E from a).
fn reexports(lib: &str, modules: &BTreeSet<String>) -> BTreeMap<String, String> {
    let mut names = BTreeMap::new();
    for statement in without_comments(lib).split(';') {
        let Some(rest) = statement.trim().strip_prefix("pub use ") else {
            continue;
        };
        let module = ident_at(rest.trim_start_matches("crate::"));
        if !modules.contains(module) {
            continue;
        }
        for leaf in rest.split(['{', '}', ',']) {
            let leaf = leaf.trim();
            let name = leaf.rsplit([' ', ':']).next().unwrap_or("");
            if !name.is_empty() && name != "self" && name != module {
                names.insert(name.to_string(), module.to_string());
            }
        }
    }
    names
}

/// Circles among a crate's top-level modules, read from every `crate::` path in every file (`use` lines,
/// grouped imports and paths in expressions alike) and every `super::` that climbs to the root; a name the
/// root re-exports counts as its module. Submodules count as their top-level module.
fn module_cycles(files: &[(std::path::PathBuf, String)], src: &Path, krate: &str) -> Vec<String> {
    let paths: Vec<Vec<String>> = files.iter().map(|(p, _)| module_path(p, src)).collect();
    let modules: BTreeSet<String> = paths.iter().filter_map(|p| p.first().cloned()).collect();
    let names = files
        .iter()
        .zip(&paths)
        .find(|(_, p)| p.is_empty())
        .map(|((_, text), _)| reexports(text, &modules))
        .unwrap_or_default();
    // module -> module it uses -> the first file that does.
    let mut edges: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for ((path, text), module) in files.iter().zip(&paths) {
        let Some(from) = module.first() else {
            continue;
        };
        let text = without_comments(text);
        let mut heads = Vec::new();
        for (i, _) in text.match_indices("crate::") {
            let before = text[..i].chars().next_back();
            if before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
                continue;
            }
            let rest = text[i + "crate::".len()..].trim_start();
            if rest.starts_with('{') {
                heads.extend(group_heads(rest));
            } else {
                heads.push(ident_at(rest));
            }
        }
        for (i, _) in text.match_indices("super::") {
            if text[..i].ends_with("super::")
                || text[..i]
                    .chars()
                    .next_back()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
            {
                continue;
            }
            let mut rest = &text[i..];
            let mut climbs = 0;
            while let Some(r) = rest.strip_prefix("super::") {
                climbs += 1;
                rest = r.trim_start();
            }
            if climbs >= module.len() {
                if rest.starts_with('{') {
                    heads.extend(group_heads(rest));
                } else {
                    heads.push(ident_at(rest));
                }
            }
        }
        for head in heads {
            let to = if modules.contains(head) {
                head.to_string()
            } else if let Some(m) = names.get(head) {
                m.clone()
            } else {
                continue;
            };
            if to != *from {
                let file = path.strip_prefix(src).unwrap_or(path).display().to_string();
                edges.entry(from.clone()).or_default().entry(to).or_insert(file);
            }
        }
    }
    // A circle through each module, if any, found by walking back from what it uses; each reported once.
    let mut problems = Vec::new();
    let mut reported: BTreeSet<BTreeSet<String>> = BTreeSet::new();
    for start in &modules {
        let mut came_from: BTreeMap<String, String> = BTreeMap::new();
        let mut queue = VecDeque::from([start.clone()]);
        let mut found = false;
        while let Some(at) = queue.pop_front() {
            for next in edges.get(&at).map(|e| e.keys()).into_iter().flatten() {
                if next == start {
                    came_from.insert(start.clone(), at.clone());
                    found = true;
                    break;
                }
                if !came_from.contains_key(next) {
                    came_from.insert(next.clone(), at.clone());
                    queue.push_back(next.clone());
                }
            }
            if found {
                break;
            }
        }
        if !found {
            continue;
        }
        let mut circle = vec![start.clone()];
        let mut at = came_from[start].clone();
        while at != *start {
            circle.push(at.clone());
            at = came_from[&at].clone();
        }
        circle.reverse();
        let members: BTreeSet<String> = circle.iter().cloned().collect();
        if !reported.insert(members) {
            continue;
        }
        circle.rotate_right(1);
        let steps: Vec<String> = circle
            .iter()
            .zip(circle.iter().cycle().skip(1))
            .map(|(a, b)| format!("{a} -> {b} ({})", edges[a][b]))
            .collect();
        problems.push(format!("{krate}'s modules form a circle: {}", steps.join(", ")));
    }
    problems
}

#[test]
fn rollout_proxy_modules_form_no_circle() {
    let src = workspace_root().join("crates/rollout-proxy/src");
    let problems = module_cycles(&sources(&src), &src, "rollout-proxy");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn module_circles_are_found_in_every_kind_of_path() {
    let src = Path::new("/x/src");
    let file = |p: &str, t: &str| (src.join(p), t.to_string());
    // state -> session (grouped import), session -> protocol (a path in an expression, through a
    // submodule), protocol/chat -> state (a root re-export reached by `super::super::`).
    let files = vec![
        file(
            "lib.rs",
            "mod state;\npub use state::{ProxyState, other::Thing as Renamed};",
        ),
        file("state.rs", "use crate::{auth, session::{Store, Other}};"),
        file(
            "session.rs",
            "fn f() { let x = crate::protocol::chat::go(); } // crate::nothing",
        ),
        file("protocol.rs", "pub mod chat;"),
        file(
            "protocol/chat.rs",
            "use super::super::Renamed;\nuse super::helpers;",
        ),
        file(
            "auth.rs",
            "/// [`crate::state::ProxyState`] names it in a doc link only.",
        ),
    ];
    let problems = module_cycles(&files, src, "demo");
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert_eq!(
        problems[0],
        "demo's modules form a circle: protocol -> state (protocol/chat.rs), state -> session (state.rs), \
         session -> protocol (session.rs)"
    );
    let fixed: Vec<_> = files
        .into_iter()
        .filter(|(p, _)| !p.ends_with("session.rs"))
        .collect();
    assert!(module_cycles(&fixed, src, "demo").is_empty());
}
