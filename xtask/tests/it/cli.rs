//! `xtask submit` as a user runs it: exit statuses, `--print-profile` and `--dry-run` that touch nothing.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn xtask(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .envs(env.iter().copied())
        .output()
        .expect("xtask runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn print_profile_prints_thirteen_lines_and_needs_no_paths() {
    let out = xtask(
        &["submit", "--print-profile", "--profile", "flash-v3"],
        &[("N_NODES", "4"), ("CONTEXT_LENGTH", "65536")],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "nodes=5\nactor=burn:1gpu\nrollout=sglang:d8t4p1\ncontext=65536\n\
         max_tokens=65535\nmax_new_tokens=65535\nbatch=32\nsamples=12\nsteps=500\nconcurrency=1500\ngpu_memory_gib=80\n\
         lr=3e-6\ncheckpoint_every=10\n"
    );
}

#[test]
fn invalid_environment_exits_2_with_one_line_per_problem() {
    let out = xtask(
        &["submit", "--print-profile", "--profile", "flash-v3"],
        &[("N_NODES", "3")],
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        text(&out.stderr),
        "xtask submit: N_NODES must be 2, 4, 8 or 16, got '3'\n"
    );
    assert!(out.stdout.is_empty());

    // Nothing set: every required variable is named, and nothing is created.
    let out = xtask(&["submit", "--profile", "grpo"], &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    for name in [
        "AREAL_IMAGE",
        "AREAL_CONTROLLER_MOUNTS",
        "AREAL_WORKER_MOUNTS",
        "MODEL_PATH",
        "AREAL_FILEROOT",
        "ARENA_CREDENTIALS_FILE",
    ] {
        assert!(
            stderr.contains(&format!("xtask submit: {name} is required")),
            "{name} missing from:\n{stderr}"
        );
    }
    assert!(
        stderr.lines().all(|l| l.starts_with("xtask submit: ")),
        "{stderr}"
    );

    // Unknown arguments are refused with the same status.
    let out = xtask(&["submit", "--bogus"], &[]);
    assert_eq!(out.status.code(), Some(2));
}

/// A valid launch on this machine: the host instead of a container, a stand-in model directory and binary.
struct Launch {
    dir: tempfile::TempDir,
}

impl Launch {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("model")).expect("model");
        std::fs::create_dir_all(root.join("runs")).expect("runs");
        std::fs::write(root.join("arena.env"), "export ARENA_OPENAPI_TOKEN=tok\n").expect("creds");
        let bin = root.join("arena-rl");
        // A stand-in for the binary: its only use here is `model estimate --json`, the submit-time fit check
        // (the real binary's answers are tested in `the_trainers_estimate_refuses_what_cannot_train`).
        std::fs::write(
            &bin,
            "#!/bin/sh\necho '{\"architecture\":\"LlamaForCausalLM\",\"parameters\":1000,\"step_bytes\":1000,\"step_bytes_recompute\":1000}'\n",
        )
        .expect("bin");
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Self { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AREAL_CONTAINER_BIN", "none".into()),
            ("MODEL_PATH", self.path("model").display().to_string()),
            ("AREAL_FILEROOT", self.path("runs").display().to_string()),
            (
                "ARENA_CREDENTIALS_FILE",
                self.path("arena.env").display().to_string(),
            ),
            ("ARENA_RL_BIN", self.path("arena-rl").display().to_string()),
            ("TRIAL_NAME", "dry".into()),
        ]
    }
}

fn run(launch: &Launch, args: &[&str], extra: &[(&'static str, String)]) -> Output {
    let mut env = launch.env();
    env.extend(extra.iter().cloned());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    xtask(args, &env)
}

fn is_empty_dir(dir: &Path) -> bool {
    std::fs::read_dir(dir).expect("readable").next().is_none()
}

#[test]
fn dry_run_prints_the_controller_and_writes_nothing() {
    let launch = Launch::new();
    let out = run(
        &launch,
        &[
            "submit",
            "--dry-run",
            "--check-arena",
            "--profile",
            "local",
            "gconfig.temperature=0.5",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    assert!(
        script.starts_with("#!/usr/bin/env bash\n#SBATCH --job-name=dry-controller\n"),
        "{script}"
    );
    assert!(
        script.contains("export ARENA_CHECK_ONLY=--check-arena\n"),
        "{script}"
    );
    assert!(is_empty_dir(&launch.path("runs")), "a dry run wrote files");
}

#[test]
fn a_broken_config_override_fails_before_anything_is_written() {
    let launch = Launch::new();
    let out = run(
        &launch,
        &["submit", "--profile", "local", "gconfig.n_samples=0"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.starts_with("xtask submit: CONFIG_PATH ") && stderr.contains("gconfig.n_samples"),
        "{stderr}"
    );
    assert!(is_empty_dir(&launch.path("runs")));
}

#[test]
fn without_sbatch_the_scripts_are_written_and_the_error_says_why() {
    let launch = Launch::new();
    // A PATH with `date` (for the default trial name's clock) but no Slurm client.
    let bin = launch.path("path");
    std::fs::create_dir_all(&bin).expect("path dir");
    let date = String::from_utf8(
        Command::new("sh")
            .args(["-c", "command -v date"])
            .output()
            .expect("sh runs")
            .stdout,
    )
    .expect("utf-8");
    std::os::unix::fs::symlink(date.trim(), bin.join("date")).expect("symlink");
    let out = run(
        &launch,
        &["submit", "--profile", "local"],
        &[("PATH", bin.display().to_string())],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("running sbatch"),
        "{}",
        text(&out.stderr)
    );
    let dir = launch.path("runs/submissions/dry");
    for name in ["controller.sbatch", "train.sbatch"] {
        let script = std::fs::read_to_string(dir.join(name)).expect("rendered");
        assert!(script.starts_with("#!/usr/bin/env bash\n"));
    }
}

/// A model folder holding only `config.json` of the given shape (the fit check reads nothing else).
fn model_config(dir: &Path, architecture: &str, model_type: &str, shape: [u64; 6]) {
    let [hidden, intermediate, layers, heads, kv_heads, vocab] = shape;
    std::fs::create_dir_all(dir).expect("model dir");
    let config = serde_json::json!({
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden / heads,
        "vocab_size": vocab,
        "tie_word_embeddings": false,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 40960,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).expect("config.json");
}

/// With the real `arena-rl` binary: a model the trainer cannot load, and a model whose one training step does
/// not fit one GPU of the profile, are refused in one line before anything is written; a small model passes.
#[test]
fn the_trainers_estimate_refuses_what_cannot_train() {
    let (arena_rl, _) = crate::slurm::binaries();
    let launch = Launch::new();
    let real_bin = [("ARENA_RL_BIN", arena_rl.display().to_string())];
    let with_model = |name: &str| {
        let mut extra = real_bin.to_vec();
        extra.push(("MODEL_PATH", launch.path(name).display().to_string()));
        extra
    };
    let qwen3_8b = [4096, 12288, 36, 32, 8, 151936];
    model_config(
        &launch.path("bailing"),
        "BailingMoeV3ForCausalLM",
        "bailing_moe",
        qwen3_8b,
    );
    model_config(&launch.path("qwen3-8b"), "Qwen3ForCausalLM", "qwen3", qwen3_8b);
    model_config(
        &launch.path("small"),
        "Qwen3ForCausalLM",
        "qwen3",
        [256, 512, 2, 4, 2, 1024],
    );

    let out = run(
        &launch,
        &["submit", "--dry-run", "--profile", "flash-v3"],
        &with_model("bailing"),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with(&format!(
            "xtask submit: MODEL_PATH {}: the trainer cannot load this model: ",
            launch.path("bailing").display()
        )) && stderr.contains("BailingMoeV3ForCausalLM"),
        "{stderr}"
    );

    // burn trains on one GPU: the Qwen3-8B shape's state alone does not fit.
    let mut burn = with_model("qwen3-8b");
    burn.push(("ACTOR_LAYOUT", "burn".into()));
    let out = run(&launch, &["submit", "--dry-run", "--profile", "grpo"], &burn);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("Qwen3ForCausalLM, 8.19B parameters) does not fit the grpo actor burn:1gpu")
            && stderr.contains("one step of 32768 tokens")
            && stderr.ends_with("more than GPU_MEMORY_GIB=80\n"),
        "{stderr}"
    );
    // The limit is the profile's setting.
    let mut big_gpu = burn.clone();
    big_gpu.push(("GPU_MEMORY_GIB", "4096".into()));
    let out = run(&launch, &["submit", "--dry-run", "--profile", "grpo"], &big_gpu);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    // The learning rate by the parameter count the estimate gave, with the profile's other run defaults.
    for line in [
        "xtask: actor.lr=1e-6 (grpo's rule for 8.19B parameters: 3B parameters or more",
        "xtask: checkpoint.save_every=10 (grpo checkpoints every 10 steps;",
        "xtask: rollout.weights_dtype=bf16 (",
        "xtask: rollout.weights_shard_bytes=4294967296 (",
    ] {
        assert!(stderr.lines().any(|l| l.starts_with(line)), "{line}\n{stderr}");
    }

    let out = run(
        &launch,
        &["submit", "--dry-run", "--profile", "grpo"],
        &with_model("small"),
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("xtask: actor.lr=1e-5 (grpo's rule for 0.00B parameters: below 3B parameters"),
        "{stderr}"
    );
    // The user's own learning rate stands: no default is passed for it.
    let out = run(
        &launch,
        &["submit", "--dry-run", "--profile", "grpo", "actor.lr=2e-6"],
        &with_model("small"),
    );
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("actor.lr="), "{stderr}");
    assert!(stderr.contains("xtask: checkpoint.save_every=10 ("), "{stderr}");
    assert!(is_empty_dir(&launch.path("runs")));
}

/// The real binary's `model estimate --fsdp2-gpus N`: one GPU of an FSDP2 layout. The Qwen3-8B shape at 32k
/// tokens with activation checkpointing fits an 80 GB GPU sharded over 8 GPUs, and not on 1.
#[test]
fn the_estimate_gives_one_gpu_of_an_fsdp2_layout() {
    let (arena_rl, _) = crate::slurm::binaries();
    let estimate = |args: &[&str]| {
        let out = Command::new(&arena_rl)
            .args(["model", "estimate", "--shape", "qwen3-8b", "--tokens", "32768"])
            .args(args)
            .output()
            .expect("arena-rl runs");
        assert!(out.status.success(), "{}", text(&out.stderr));
        text(&out.stdout)
    };
    let json = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["--json"];
        all.extend(args);
        serde_json::from_str(&estimate(&all)).expect("one JSON object")
    };
    const GB80: u64 = 80_000_000_000;
    let eight = json(&["--fsdp2-gpus", "8"]);
    let one = json(&["--fsdp2-gpus", "1"]);
    let f = &eight["fsdp2"];
    assert_eq!(
        (f["gpus"].as_u64(), f["compute_dtype"].as_str()),
        (Some(8), Some("bf16")),
        "{eight}"
    );
    let bytes = |v: &serde_json::Value, key: &str| v["fsdp2"][key].as_u64().expect("a byte count");
    assert!(bytes(&eight, "gpu_bytes_recompute") < GB80, "{eight}");
    assert!(bytes(&one, "gpu_bytes_recompute") > GB80, "{one}");
    // The state is sharded: an eighth of about 131 GB a GPU.
    let state = eight["state_bytes"].as_u64().expect("state_bytes");
    assert_eq!(bytes(&eight, "sharded_state_bytes"), state.div_ceil(8));
    assert_eq!(bytes(&one, "sharded_state_bytes"), state);
    // Without checkpointing, 32k tokens of kept activations do not fit even on 8; in f32 a GPU holds more.
    assert!(bytes(&eight, "gpu_bytes") > GB80, "{eight}");
    let f32 = json(&["--fsdp2-gpus", "8", "--f32"]);
    assert_eq!(f32["fsdp2"]["compute_dtype"], "f32");
    assert!(bytes(&f32, "gpu_bytes_recompute") > bytes(&eight, "gpu_bytes_recompute"));
    // Without --fsdp2-gpus the JSON has no FSDP2 part; the text report has its line.
    assert!(json(&[]).get("fsdp2").is_none());
    let report = estimate(&["--fsdp2-gpus", "8"]);
    assert!(
        report.contains("FSDP2 over 8 GPUs (bf16 compute, f32 master weights and reduction): ")
            && report.contains("with activation checkpointing (actor.recompute_layers)"),
        "{report}"
    );
}

/// `xtask submit` holds an `fsdp2:` actor to one GPU's share of its layout (GPUs = its data-parallel ranks),
/// through the real binary: the Qwen3-8B shape fits grpo's `fsdp2:d8p1t1` on 80 GiB GPUs and is refused on
/// `fsdp2:d1` in one line naming the model, the layout, the estimate and the limit.
#[test]
fn submit_refuses_an_fsdp2_layout_too_small_for_the_model() {
    let (arena_rl, _) = crate::slurm::binaries();
    let launch = Launch::new();
    model_config(
        &launch.path("qwen3-8b"),
        "Qwen3ForCausalLM",
        "qwen3",
        [4096, 12288, 36, 32, 8, 151936],
    );
    let env = |layout: &str| {
        vec![
            ("ARENA_RL_BIN", arena_rl.display().to_string()),
            ("MODEL_PATH", launch.path("qwen3-8b").display().to_string()),
            ("ACTOR_LAYOUT", layout.to_string()),
        ]
    };
    let out = run(
        &launch,
        &["submit", "--dry-run", "--profile", "grpo"],
        &env("fsdp2:d8p1t1"),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));

    let out = run(
        &launch,
        &["submit", "--dry-run", "--profile", "grpo"],
        &env("fsdp2:d1"),
    );
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    let head = format!(
        "xtask submit: MODEL_PATH {} (Qwen3ForCausalLM, 8.19B parameters) does not fit the grpo actor fsdp2:d1p1t1: \
         the trainer's estimate of one step of 32768 tokens (actor.max_tokens_per_mb, with activation checkpointing) is ",
        launch.path("qwen3-8b").display()
    );
    assert!(
        stderr.starts_with(&head) && stderr.ends_with(" GiB on its one GPU, more than GPU_MEMORY_GIB=80\n"),
        "{stderr}"
    );
    let gib: f64 = stderr[head.len()..]
        .split(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .expect("the estimate in GiB");
    assert!(gib > 80.0, "{stderr}");
    assert!(is_empty_dir(&launch.path("runs")));
}

/// `--eval` with another mode, or with a checkpoint that is not there, is refused with exit status 2 before
/// anything is written; a valid `--eval --dry-run` prints the controller and writes nothing.
#[test]
fn eval_is_refused_with_another_mode_or_a_missing_checkpoint() {
    let launch = Launch::new();
    std::fs::write(launch.path("model/config.json"), "{}").expect("config.json");
    let model = launch.path("model").display().to_string();
    let out = run(
        &launch,
        &[
            "submit",
            "--eval",
            "--checkpoint",
            &model,
            "--rollout-only",
            "6",
            "--profile",
            "local",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("'--eval' cannot be used with '--rollout-only <ROLLOUTS>'"),
        "{stderr}"
    );
    let missing = launch.path("checkpoints/step-9").display().to_string();
    let out = run(
        &launch,
        &["submit", "--eval", "--checkpoint", &missing, "--profile", "local"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stderr),
        format!("xtask submit: --checkpoint {missing} does not exist or is not a directory\n")
    );
    // --checkpoint without --eval.
    let out = run(
        &launch,
        &["submit", "--checkpoint", &model, "--profile", "local"],
        &[],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    let out = run(
        &launch,
        &[
            "submit",
            "--dry-run",
            "--eval",
            "--checkpoint",
            &model,
            "--samples",
            "2",
            "--profile",
            "local",
        ],
        &[],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let script = text(&out.stdout);
    assert!(
        script.contains("(profile local, --eval: the GPU job evaluates a checkpoint)"),
        "{script}"
    );
    assert!(is_empty_dir(&launch.path("runs")), "a dry run wrote files");
}
