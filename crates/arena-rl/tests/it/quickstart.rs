//! `arena-rl quickstart`, short: the tiny policy is built, warmed up through the real proxy, and trained by
//! GRPO against an in-process arena-sim for a few steps; the command says where everything went.

use std::process::Command;

#[test]
fn a_short_quickstart_builds_warms_up_trains_and_says_where_everything_is() {
    let root = tempfile::tempdir().unwrap();
    let fileroot = format!("cluster.fileroot={}", root.path().display());
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_arena-rl"))
            .arg("quickstart")
            .args(["--warmup-steps", "20", "--warmup-conversations", "64"])
            .args([
                fileroot.as_str(),
                "trial_name=short",
                "actor.total_train_steps=3",
                "train_dataset.batch_size=2",
                "gconfig.n_samples=4",
                "checkpoint.save_every=3",
                "metrics.progress=false",
                // Port 0: the sim takes a free port, so parallel tests never collide.
                "econfig.arena_base_url=http://127.0.0.1:0",
            ])
            .args(extra)
            .env_remove("ARENA_OPENAPI_BASE")
            .env_remove("ARENA_OPENAPI_TOKEN")
            .env("RUST_LOG", "warn")
            .output()
            .expect("the arena-rl binary runs")
    };
    let out = run(&[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let line = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in:\n{stdout}"))
            .to_string()
    };
    assert!(line("quickstart: ").starts_with("3 RL step(s) in "), "{stdout}");
    let run_dir = root.path().join("quickstart/short");
    let metrics = line("metrics: ");
    assert_eq!(
        metrics,
        run_dir.join("metrics/metrics.jsonl").display().to_string()
    );
    let lines = std::fs::read_to_string(&metrics).unwrap();
    let steps: Vec<serde_json::Value> = lines
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|v: &serde_json::Value| v.get("rollout/reward").is_some())
        .collect();
    assert_eq!(steps.len(), 3, "{lines}");
    for s in &steps {
        let r = s["rollout/reward"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&r), "{s}");
    }
    // TensorBoard gets every step metric except the per-row `debug/task/<data_id>/raw_reward` records, so
    // its tags do not grow with the rows a run sees; metrics.jsonl keeps those records.
    let keys: std::collections::BTreeSet<String> = lines
        .lines()
        .flat_map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap();
            v.as_object().unwrap().keys().cloned().collect::<Vec<_>>()
        })
        .collect();
    assert!(
        keys.iter().any(|k| k.starts_with("debug/task/")),
        "per-row records in metrics.jsonl: {keys:?}"
    );
    let mut tags = std::collections::BTreeSet::new();
    for file in std::fs::read_dir(run_dir.join("metrics/tensorboard")).unwrap() {
        for event in arena_rl::observe::tfevents::read_events(&file.unwrap().path()).unwrap() {
            tags.extend(event.scalars.into_iter().map(|(t, _)| t));
        }
    }
    let bounded: std::collections::BTreeSet<String> = keys
        .iter()
        .filter(|k| *k != "step" && !k.starts_with("debug/task/"))
        .cloned()
        .collect();
    assert_eq!(
        tags, bounded,
        "TensorBoard's tags are the JSONL's names less the per-row ones"
    );
    assert!(std::path::Path::new(&line("reward curve: ")).is_file());
    let checkpoint = line("checkpoint: ");
    assert!(checkpoint.ends_with("checkpoints/step-3"), "{checkpoint}");
    assert!(std::path::Path::new(&checkpoint).is_dir(), "{checkpoint}");
    assert!(
        line("rollout/reward: ").starts_with("first 3 RL step(s) "),
        "{stdout}"
    );
    let policy = line("policy: ");
    assert!(policy.contains("(warmed up: "), "{policy}");
    // The saved config holds no credential: the quickstart makes fresh ones for its own Arena.
    let saved = std::fs::read_to_string(run_dir.join("config.yaml")).unwrap();
    assert!(!saved.contains("ARENA_OPENAPI_TOKEN="), "{saved}");

    // The same command again finds the built and warmed-up policy in the cache, and resumes the finished
    // trial instead of training it twice.
    let again = run(&[]);
    let stdout2 = String::from_utf8_lossy(&again.stdout).into_owned();
    assert!(
        again.status.success(),
        "{stdout2}\n{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(stdout2.contains("(cached)"), "{stdout2}");
}

/// The size flags that cannot make a policy are refused before anything is built, in one error that names
/// the sizes in effect and every problem.
#[test]
fn policy_size_flags_that_make_no_policy_are_refused_at_once() {
    let root = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args(["quickstart", "--prepare-policy", "--hidden-size", "96"])
        .args(["--num-heads", "5", "--num-layers", "0"])
        .arg(format!("cluster.fileroot={}", root.path().display()))
        .env("RUST_LOG", "warn")
        .output()
        .expect("the arena-rl binary runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    for needle in [
        "--hidden-size 96, --intermediate-size 288, --num-layers 0, --num-heads 5",
        "num_layers must be positive",
        "hidden_size 96 is not a multiple of num_heads 5",
    ] {
        assert!(stderr.contains(needle), "no {needle:?} in:\n{stderr}");
    }
    assert!(
        !root.path().join("quickstart-policy").exists(),
        "nothing is built"
    );
}

/// The README's headline, asserted: the quickstart at a reduced scale (800 warm-up steps, 50 GRPO steps)
/// learns, and its `actor.lr=0` control, the same run with frozen weights, does not. A trained run's
/// last-10-step mean reward must be at least 0.2 above the control's mean. A frozen policy's reward has the
/// same distribution at every step, so the control runs 10 steps and its mean over all of them is the
/// comparison.
///
/// The trained run keeps the learning rate constant (`actor.lr_scheduler_type=constant`): the quickstart's
/// cosine decays over its 450 steps, so from the end of its 23-step warm-up to step 50 it runs at 99-100%
/// of the peak rate, while a cosine over only 50 steps would spend half of them below 55% of it.
///
/// Up to [`ATTEMPTS`] trained runs, because about one run in five of this tiny policy collapses instead of
/// learning, and a collapse is absorbing: the policy starts ending its first turn right after the key's
/// digit (`"key": "x8` then end of turn, no tool call parsed, reward 0), mostly on "smallest" questions,
/// until every group of that family scores 0 and none trains. Measured on 2 cores with the earlier policy
/// (0.9M parameters, entropy bonus 0.02, no KL penalty), 60-step runs against a control of about 0.31, five
/// runs per setting: constant rate 0.315, 0.649, 0.766, 0.760, 0.000; with
/// `use_decoupled_loss` and `recompute_logprob` 0.709, 0.744, 0.770, 0.198, 0.717; without the entropy
/// bonus 0.774, 0.768, 0.570, 0.581, 0.403; 16 samples of 4 prompts 0.675, 0.297, 0.640, 0.231, 0.690;
/// 50-step runs, constant rate 0.646, 0.761, 0.658, and the quickstart's cosine over 50 steps 0.573,
/// 0.595, 0.431.
/// A pipeline that does not learn fails every attempt; one that learns fails all three about one time in
/// a hundred.
///
/// The supervised warm-up is the test's set-up, not what it asserts, and half its time: with
/// `ARENA_RL_CACHE` set (as `cargo xtask test` sets it) the warmed-up policy is kept there between runs,
/// under a hash of every source file that builds or trains it ([`warmup_sources_hash`]), so a change to the
/// trainer or the quickstart's policy code warms up afresh. The short quickstart test above always runs the
/// warm-up itself.
#[test]
fn the_quickstart_learns_and_its_frozen_control_does_not() {
    let root = tempfile::tempdir().unwrap();
    let warm = WarmCache::restore(root.path());
    // The control first: its run also warms up the policy when the cache has none.
    let control = learning_run(root.path(), "control", 10, &["actor.lr=0"], &[]);
    warm.keep(root.path());
    // Each attempt is a fresh trial from the same warmed-up policy (sampling is unseeded, so runs differ).
    let mut trained = Vec::new();
    for attempt in 1..=ATTEMPTS {
        let reward = learning_run(
            root.path(),
            &format!("learns-{attempt}"),
            50,
            &["actor.lr_scheduler_type=constant"],
            &[],
        );
        trained.push(reward);
        if reward - control >= 0.2 {
            return;
        }
    }
    panic!(
        "no trained run's last-10 mean reward is 0.2 above the control's {control:.3}: {trained:.3?} in {ATTEMPTS} attempts"
    );
}

/// The learning test's warmed-up policy (800 warm-up steps), kept in `ARENA_RL_CACHE` between runs under
/// [`warmup_sources_hash`], so only the first run after a change to the code that builds it pays for it.
pub(crate) struct WarmCache {
    kept: Option<std::path::PathBuf>,
    cached: bool,
}

impl WarmCache {
    /// Copies a kept policy into `<root>/quickstart-policy`, where the quickstart looks for it, if there is
    /// one.
    pub(crate) fn restore(root: &std::path::Path) -> Self {
        let kept = std::env::var_os("ARENA_RL_CACHE").map(|cache| {
            std::path::PathBuf::from(cache)
                .join("quickstart-learning")
                .join(format!("{:016x}", warmup_sources_hash()))
        });
        let cached = kept.as_ref().is_some_and(|k| k.is_dir());
        if let Some(k) = kept.as_ref().filter(|k| k.is_dir()) {
            copy_dir(k, &root.join("quickstart-policy"));
        }
        Self { kept, cached }
    }

    /// After a first run has warmed the policy up under `root`: keeps it (when it was not kept already).
    pub(crate) fn keep(&self, root: &std::path::Path) {
        let Some(k) = self.kept.as_ref().filter(|_| !self.cached) else {
            return;
        };
        // Policies warmed up by older sources are of no more use (this hash's, and another test's copy in
        // progress under it, stay).
        let parent = k.parent().unwrap();
        let current = k.file_name().unwrap().to_string_lossy().into_owned();
        for old in std::fs::read_dir(parent).into_iter().flatten().flatten() {
            if !old.file_name().to_string_lossy().starts_with(&current) {
                let _ = std::fs::remove_dir_all(old.path());
            }
        }
        let tmp = k.with_extension(format!("tmp-{}", std::process::id()));
        copy_dir(&root.join("quickstart-policy"), &tmp);
        let _ = std::fs::rename(&tmp, k);
        let _ = std::fs::remove_dir_all(&tmp);
    }
}

/// Runs `arena-rl quickstart` under `root` from the learning test's warm-up (800 steps on 1024
/// conversations; [`WarmCache`] keeps it) for `steps` RL steps of trial `trial`, with `extra` overrides and
/// `env` added to its environment; asserts it succeeds and returns its standard output.
pub(crate) fn warmed_quickstart(
    root: &std::path::Path,
    trial: &str,
    steps: u64,
    extra: &[&str],
    env: &[(String, String)],
) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .arg("quickstart")
        .args(["--warmup-steps", "800", "--warmup-conversations", "1024"])
        .args([
            format!("cluster.fileroot={}", root.display()).as_str(),
            &format!("trial_name={trial}"),
            &format!("actor.total_train_steps={steps}"),
            "metrics.progress=false",
            "econfig.arena_base_url=http://127.0.0.1:0",
        ])
        .args(extra)
        .env_remove("ARENA_OPENAPI_BASE")
        .env_remove("ARENA_OPENAPI_TOKEN")
        .env("RUST_LOG", "warn")
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("the arena-rl binary runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// One quickstart trial under `root` at the learning test's scale (800 warm-up steps on 1024
/// conversations), `steps` RL steps; returns the last-10-step mean reward it prints. `env` is added to the
/// command's environment.
pub(crate) fn learning_run(
    root: &std::path::Path,
    trial: &str,
    steps: u64,
    extra: &[&str],
    env: &[(String, String)],
) -> f64 {
    let stdout = warmed_quickstart(root, trial, steps, extra, env);
    let line = stdout
        .lines()
        .find(|l| l.starts_with("rollout/reward: "))
        .unwrap_or_else(|| panic!("no reward line in:\n{stdout}"));
    let last = line
        .split("last 10 RL step(s) ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no last-10 mean in {line:?}"));
    for info in stdout
        .lines()
        .filter(|l| l.starts_with("time: ") || l.starts_with("policy: "))
    {
        eprintln!("{trial}: {info}");
    }
    eprintln!("{trial}: {line}");
    last
}

/// Trained runs the learning test may take to see one learn (see its doc for why more than one).
pub(crate) const ATTEMPTS: usize = 3;

/// A hash of the sources that build and warm up the quickstart policy (the trainer, the quickstart's own
/// modules, the dependency lock): the key under which the learning test keeps its warmed-up policy.
fn warmup_sources_hash() -> u64 {
    use std::hash::{Hash as _, Hasher as _};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    for dir in ["crates/trainer/src", "crates/arena-rl/src/quickstart"] {
        collect_files(&root.join(dir), &mut files);
    }
    for file in [
        "crates/arena-rl/src/quickstart.rs",
        "crates/arena-rl/src/cmd/quickstart.rs",
        "Cargo.lock",
        "Cargo.toml",
    ] {
        files.push(root.join(file));
    }
    files.sort();
    let mut hasher = std::hash::DefaultHasher::new();
    for file in files {
        file.strip_prefix(&root).unwrap().hash(&mut hasher);
        std::fs::read(&file).unwrap().hash(&mut hasher);
    }
    hasher.finish()
}

fn collect_files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect_files(&path, out);
        } else {
            out.push(path);
        }
    }
}

fn copy_dir(from: &std::path::Path, to: &std::path::Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}
