//! Tests of `cargo xtask submit` short of Slurm: validation (one test per error), profiles, the rendered
//! scripts (insta snapshots for both profiles and every `N_NODES`, plus `bash -n`), and the config check.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::profile::{self, Profile};
use super::validate::{self, Launch, Problems};
use super::{Ctx, Env, Mode, check_config, defaults, render};

/// A shared filesystem as a cluster site has it: a checkout with a built binary, an image, a model directory,
/// a file root, a credentials file and a streams file.
struct Site {
    _dir: tempfile::TempDir,
    root: PathBuf,
}

impl Site {
    fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().canonicalize().expect("canonical temp dir");
        let checkout = root.join("arena-rl");
        for profile in [
            Profile::Local,
            Profile::Grpo,
            Profile::FlashV3,
            Profile::MultinodeCpu,
        ] {
            write(&checkout.join(profile.default_config()), "experiment_name: x\n");
        }
        write(
            &checkout.join("examples/configs/flash_v3_streams.yaml"),
            "streams: []\n",
        );
        let bin = checkout.join("target/release/arena-rl");
        write(&bin, "#!/bin/sh\n");
        chmod(&bin, 0o755);
        write(&root.join("images/arena-rl.sif"), "image");
        std::fs::create_dir_all(root.join("models/policy")).expect("model dir");
        std::fs::create_dir_all(root.join("runs")).expect("file root");
        write(
            &root.join("secrets/arena.env"),
            "export ARENA_OPENAPI_TOKEN=from-the-file\n",
        );
        Self { _dir: dir, root }
    }

    fn path(&self, rel: &str) -> String {
        self.root.join(rel).display().to_string()
    }

    /// A complete, valid launch environment.
    fn env(&self) -> Vec<(String, String)> {
        [
            ("AREAL_IMAGE", self.path("images/arena-rl.sif")),
            ("AREAL_PYTHON", "/usr/bin/python3".into()),
            ("MODEL_PATH", self.path("models/policy")),
            ("AREAL_FILEROOT", self.path("runs")),
            ("ARENA_CREDENTIALS_FILE", self.path("secrets/arena.env")),
            ("AREAL_CONTROLLER_MOUNTS", format!("{0}:{0}", self.root.display())),
            ("AREAL_WORKER_MOUNTS", format!("{0}:{0}", self.root.display())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            timestamp: "20260102-030405".into(),
            pid: 4242,
            host: "login01".into(),
            checkout: self.root.join("arena-rl"),
        }
    }

    /// Validates the base environment changed by `changes` (`None` removes a variable).
    fn launch(
        &self,
        profile: Profile,
        mode: Mode,
        changes: &[(&str, Option<&str>)],
        overrides: &[&str],
    ) -> Result<Launch, Problems> {
        let mut vars = self.env();
        for (name, value) in changes {
            vars.retain(|(k, _)| k != name);
            if let Some(v) = value {
                vars.push((name.to_string(), v.to_string()));
            }
        }
        let env: Env = vars.into_iter().collect();
        let overrides: Vec<String> = overrides.iter().map(|s| s.to_string()).collect();
        validate::validate(profile, mode, &overrides, &env, &self.ctx())
    }

    /// Rendered scripts with the temporary root shown as `/shared`.
    fn scripts(&self, launch: &Launch) -> (String, String) {
        let s = render::render(launch);
        let root = self.root.display().to_string();
        (
            s.controller.replace(&root, "/shared"),
            s.train.replace(&root, "/shared"),
        )
    }
}

fn write(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().expect("a parent")).expect("parent dir");
    std::fs::write(path, text).expect("write");
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A change to the base environment: a new value, or `None` to remove the variable.
type Change<'a> = (&'a str, Option<&'a str>);

/// One validation case: `changes` to a valid environment produce exactly `want` (with the site root shown as
/// `/shared`).
fn check(profile: Profile, changes: &[(&str, Option<&str>)], overrides: &[&str], want: &[&str]) {
    let site = Site::new();
    let changes: Vec<(&str, Option<String>)> = changes
        .iter()
        .map(|(k, v)| {
            (
                *k,
                v.map(|v| v.replace("/shared", &site.root.display().to_string())),
            )
        })
        .collect();
    let changes: Vec<(&str, Option<&str>)> = changes.iter().map(|(k, v)| (*k, v.as_deref())).collect();
    let got = match site.launch(profile, Mode::Submit, &changes, overrides) {
        Ok(_) => Vec::new(),
        Err(p) => p
            .lines()
            .iter()
            .map(|l| l.replace(&site.root.display().to_string(), "/shared"))
            .collect(),
    };
    assert_eq!(got, want, "changes {changes:?}, overrides {overrides:?}");
}

#[test]
fn a_complete_environment_is_valid_for_every_profile() {
    for profile in [Profile::Local, Profile::Grpo, Profile::FlashV3] {
        check(profile, &[], &[], &[]);
    }
    // The container's variables are not needed on the host.
    check(
        Profile::Grpo,
        &[
            ("AREAL_CONTAINER_BIN", Some("none")),
            ("AREAL_IMAGE", None),
            ("AREAL_CONTROLLER_MOUNTS", None),
            ("AREAL_WORKER_MOUNTS", None),
        ],
        &[],
        &[],
    );
}

#[test]
fn each_invalid_variable_is_one_line_naming_it() {
    use Profile::Grpo;
    let cases: &[(&str, Option<&str>, &str)] = &[
        (
            "AREAL_DIR",
            Some("arena-rl"),
            "AREAL_DIR must be an absolute shared path, got 'arena-rl'",
        ),
        (
            "AREAL_DIR",
            Some("/shared/images/arena-rl.sif"),
            "AREAL_DIR is not a directory: '/shared/images/arena-rl.sif'",
        ),
        (
            "CONFIG_PATH",
            Some("examples/configs/missing.yaml"),
            "CONFIG_PATH is not a readable file: '/shared/arena-rl/examples/configs/missing.yaml'",
        ),
        (
            "CONFIG_PATH",
            Some("/shared/models"),
            "CONFIG_PATH is not a readable file: '/shared/models'",
        ),
        (
            "AREAL_CONTAINER_BIN",
            Some("apptainer --debug"),
            "AREAL_CONTAINER_BIN must be a command name or path without spaces or quotes, or 'none', got 'apptainer --debug'",
        ),
        (
            "AREAL_IMAGE",
            None,
            "AREAL_IMAGE is required (the container image the jobs run in)",
        ),
        (
            "AREAL_IMAGE",
            Some("images/arena-rl.sif"),
            "AREAL_IMAGE must be an absolute shared path, got 'images/arena-rl.sif'",
        ),
        (
            "AREAL_IMAGE",
            Some("/shared/images/missing.sif"),
            "AREAL_IMAGE is not readable: '/shared/images/missing.sif'",
        ),
        (
            "ROLLOUT_IMAGE",
            Some("/shared/images/sglang.sif"),
            "ROLLOUT_IMAGE is not readable: '/shared/images/sglang.sif'",
        ),
        (
            "AREAL_CONTROLLER_MOUNTS",
            None,
            "AREAL_CONTROLLER_MOUNTS is required (the --bind list of the controller's container)",
        ),
        (
            "AREAL_WORKER_MOUNTS",
            None,
            "AREAL_WORKER_MOUNTS is required (the --bind list of the workers' containers)",
        ),
        (
            "AREAL_WORKER_MOUNTS",
            Some("/a:/a\n/b"),
            "AREAL_WORKER_MOUNTS must not contain control characters",
        ),
        (
            "MODEL_PATH",
            None,
            "MODEL_PATH is required (the policy's model directory)",
        ),
        (
            "MODEL_PATH",
            Some("models/policy"),
            "MODEL_PATH must be an absolute shared path, got 'models/policy'",
        ),
        (
            "MODEL_PATH",
            Some("/shared/images/arena-rl.sif"),
            "MODEL_PATH is not a readable directory: '/shared/images/arena-rl.sif'",
        ),
        (
            "AREAL_FILEROOT",
            None,
            "AREAL_FILEROOT is required (the shared directory for run outputs)",
        ),
        (
            "AREAL_FILEROOT",
            Some("runs"),
            "AREAL_FILEROOT must be an absolute shared path, got 'runs'",
        ),
        (
            "AREAL_FILEROOT",
            Some("/shared/my runs"),
            "AREAL_FILEROOT must not contain whitespace or quotes (it appears in #SBATCH directives), got '/shared/my runs'",
        ),
        (
            "ARENA_CREDENTIALS_FILE",
            None,
            "ARENA_CREDENTIALS_FILE is required (the file that exports ARENA_OPENAPI_BASE, ARENA_OPENAPI_TOKEN, ARENA_LLM_API_KEY and SWE_RL_ADMIN_API_KEY)",
        ),
        (
            "ARENA_CREDENTIALS_FILE",
            Some("~/arena.env"),
            "ARENA_CREDENTIALS_FILE must be an absolute shared path, got '~/arena.env'",
        ),
        (
            "ARENA_CREDENTIALS_FILE",
            Some("/shared/secrets/missing.env"),
            "ARENA_CREDENTIALS_FILE is not a readable file: '/shared/secrets/missing.env'",
        ),
        (
            "ARENA_RL_BIN",
            Some("target/release/arena-rl"),
            "ARENA_RL_BIN must be an absolute shared path, got 'target/release/arena-rl'",
        ),
        (
            "ARENA_RL_BIN",
            Some("/shared/secrets/arena.env"),
            "ARENA_RL_BIN is not an executable file: '/shared/secrets/arena.env' (build it with `cargo build --release -p arena-rl --features cuda`)",
        ),
        (
            "TRIAL_NAME",
            Some("../escape"),
            "TRIAL_NAME may only contain letters, digits, '.', '_' and '-', start with a letter or digit, and be at most 128 characters, got '../escape'",
        ),
        (
            "SBATCH_TIMELIMIT",
            Some("1h"),
            "SBATCH_TIMELIMIT must be a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS), got '1h'",
        ),
        (
            "ARENA_CONTROLLER_TIME",
            Some("1:2:3:4"),
            "ARENA_CONTROLLER_TIME must be a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS), got '1:2:3:4'",
        ),
        (
            "SBATCH_PARTITION",
            Some("gpu long"),
            "SBATCH_PARTITION may only contain letters, digits and '_.,:+-', got 'gpu long'",
        ),
        (
            "SBATCH_ACCOUNT",
            Some("team;rm"),
            "SBATCH_ACCOUNT may only contain letters, digits and '_.,:+-', got 'team;rm'",
        ),
        (
            "SBATCH_RESERVATION",
            Some("r'1"),
            "SBATCH_RESERVATION may only contain letters, digits and '_.,:+-', got 'r'1'",
        ),
        (
            "ARENA_PREFLIGHT_MIN_TASKS",
            Some("-1"),
            "ARENA_PREFLIGHT_MIN_TASKS must be a non-negative integer, got '-1'",
        ),
        (
            "ARENA_STREAM_ID",
            Some("a\nb"),
            "ARENA_STREAM_ID must not contain control characters",
        ),
        (
            "ARENA_OPENAPI_BASE",
            Some("arena.example/openapi"),
            "ARENA_OPENAPI_BASE must be an http:// or https:// URL",
        ),
        (
            "ARENA_OPENAPI_BASE",
            Some("https://bob:hunter2@arena.example"),
            "ARENA_OPENAPI_BASE must not carry credentials (user:password@host); put them in the credentials file",
        ),
        (
            "ARENA_POLICY_PORT",
            Some("80"),
            "ARENA_POLICY_PORT must be a port from 1024 to 65535, got '80'",
        ),
        (
            "ARENA_POLICY_PORT",
            Some("65533"),
            "ARENA_POLICY_PORT=65533 leaves no room for 4 policy servers per node",
        ),
        (
            "ARENA_SUPERVISE_INTERVAL",
            Some("0"),
            "ARENA_SUPERVISE_INTERVAL must be a number of seconds from 1 to 3600, got '0'",
        ),
        (
            "N_GPUS_PER_NODE",
            Some("eight"),
            "N_GPUS_PER_NODE must be an integer from 0 to 64, got 'eight'",
        ),
        (
            "N_GPUS_PER_NODE",
            Some("3"),
            "N_GPUS_PER_NODE=3 does not fit the rollout layout sglang:d4p1t2 (4 replicas of 2 GPUs each)",
        ),
        (
            "N_GPUS_PER_NODE",
            Some("6"),
            "N_GPUS_PER_NODE=6 does not fit the rollout layout sglang:d4p1t2: 4 replicas do not fill whole nodes of 3",
        ),
        (
            "LEARNING_RATE",
            Some("0"),
            "LEARNING_RATE must be a number above 0 and at most 1, such as 1e-6 or 0.000003, got '0'",
        ),
        (
            "LEARNING_RATE",
            Some("1e-6 actor.lr=1"),
            "LEARNING_RATE must be a number above 0 and at most 1, such as 1e-6 or 0.000003, got '1e-6 actor.lr=1'",
        ),
        (
            "LEARNING_RATE",
            Some("inf"),
            "LEARNING_RATE must be a number above 0 and at most 1, such as 1e-6 or 0.000003, got 'inf'",
        ),
        (
            "CHECKPOINT_EVERY",
            Some("0"),
            "CHECKPOINT_EVERY must be a number of steps from 1 to 1000000, got '0'",
        ),
        (
            "CHECKPOINT_EVERY",
            Some("ten"),
            "CHECKPOINT_EVERY must be a number of steps from 1 to 1000000, got 'ten'",
        ),
    ];
    for (name, value, want) in cases {
        check(Grpo, &[(name, *value)], &[], &[want]);
    }
}

#[test]
fn flash_v3_rules_name_the_variable() {
    use Profile::FlashV3;
    let cases: &[(&[Change], &str)] = &[
        (
            &[("N_NODES", Some("3"))],
            "N_NODES must be 2, 4, 8 or 16, got '3'",
        ),
        (
            &[("N_NODES", Some("08"))],
            "N_NODES must be 2, 4, 8 or 16, got '08'",
        ),
        (
            &[("CONTEXT_LENGTH", Some("032768"))],
            "CONTEXT_LENGTH must be a positive decimal integer without leading zeros, got '032768'",
        ),
        (
            &[("CONTEXT_LENGTH", Some("1"))],
            "CONTEXT_LENGTH must be at least 2, got '1'",
        ),
        (
            &[("CONTEXT_LENGTH", Some("-4"))],
            "CONTEXT_LENGTH must be a positive decimal integer without leading zeros, got '-4'",
        ),
        (
            &[("MAX_TOKENS", Some("131072"))],
            "MAX_TOKENS must be less than CONTEXT_LENGTH (131072), got '131072'",
        ),
        (
            &[("CONTEXT_LENGTH", Some("4096")), ("MAX_NEW_TOKENS", Some("5000"))],
            "MAX_NEW_TOKENS must be less than CONTEXT_LENGTH (4096), got '5000'",
        ),
        (
            &[("MAX_NEW_TOKENS", Some("0"))],
            "MAX_NEW_TOKENS must be a positive integer, got '0'",
        ),
        (
            &[("MAX_TOKENS", Some("1e5"))],
            "MAX_TOKENS must be a positive integer, got '1e5'",
        ),
        (
            &[("TRAIN_BATCH_SIZE", Some("0"))],
            "TRAIN_BATCH_SIZE must be a positive integer, got '0'",
        ),
        (
            &[("N_SAMPLES", Some("twelve"))],
            "N_SAMPLES must be a positive integer, got 'twelve'",
        ),
        (
            &[("TOTAL_TRAIN_STEPS", Some("-5"))],
            "TOTAL_TRAIN_STEPS must be a positive integer, got '-5'",
        ),
        (
            &[("MAX_CONCURRENT_ROLLOUTS", Some("1.5"))],
            "MAX_CONCURRENT_ROLLOUTS must be a positive integer, got '1.5'",
        ),
        (
            &[("DATASET_CONFIG", Some("/shared/missing.yaml"))],
            "DATASET_CONFIG is not a readable file: '/shared/missing.yaml'",
        ),
        (
            &[("N_GPUS_PER_NODE", Some("6"))],
            "N_GPUS_PER_NODE=6 does not fit the rollout layout sglang:d16t4p1 (16 replicas of 4 GPUs each)",
        ),
    ];
    for (changes, want) in cases {
        check(FlashV3, changes, &[], &[want]);
    }
}

#[test]
fn bad_overrides_are_refused_and_credentials_are_not_echoed() {
    let cases: &[(&str, &str)] = &[
        (
            "gconfig.n_samples",
            "override 'gconfig.n_samples' must have the form dotted.key=value",
        ),
        (
            "gconfig..n_samples=2",
            "override 'gconfig..n_samples' is not a dotted key of letters, digits and '_'",
        ),
        (
            "gconfig n=2",
            "override 'gconfig n' is not a dotted key of letters, digits and '_'",
        ),
        (
            "econfig.arena_openapi_token=s3cr3t-value",
            "override 'econfig.arena_openapi_token' looks like a credential; put credentials in ARENA_CREDENTIALS_FILE, never on a command line",
        ),
        (
            "proxy.admin_api_key=s3cr3t-value",
            "override 'proxy.admin_api_key' looks like a credential; put credentials in ARENA_CREDENTIALS_FILE, never on a command line",
        ),
        (
            "econfig.arena_streams_file=/tmp/s.yaml",
            "override 'econfig.arena_streams_file' changes the Streams, which the controller's preflight reads from the config file: edit the config (or, for flash-v3, set DATASET_CONFIG) instead",
        ),
        (
            "econfig.stream_id=abc",
            "override 'econfig.stream_id' changes the Streams, which the controller's preflight reads from the config file: edit the config (or, for flash-v3, set DATASET_CONFIG) instead",
        ),
        (
            "cluster.n_nodes=3",
            "override 'cluster.n_nodes' would contradict the job's allocation, which the profile sets from N_NODES and N_GPUS_PER_NODE: set those instead",
        ),
        (
            "cluster.n_gpus_per_node=4",
            "override 'cluster.n_gpus_per_node' would contradict the job's allocation, which the profile sets from N_NODES and N_GPUS_PER_NODE: set those instead",
        ),
        (
            "actor.backend=fsdp2",
            "override 'actor.backend' would contradict the actor layout the GPU job starts: set ACTOR_LAYOUT (burn or fsdp2:dN) instead",
        ),
        (
            "actor.fsdp2.attach=node1:8471",
            "override 'actor.fsdp2.attach' would contradict the actor layout the GPU job starts: set ACTOR_LAYOUT (burn or fsdp2:dN) instead",
        ),
        (
            "actor.fsdp2.nproc_per_node=4",
            "override 'actor.fsdp2.nproc_per_node' would contradict the actor layout the GPU job starts: set ACTOR_LAYOUT (burn or fsdp2:dN) instead",
        ),
        (
            "experiment_name=a\nb",
            "override 'experiment_name' must not contain control characters",
        ),
    ];
    for (o, want) in cases {
        check(Profile::Grpo, &[], &[o], &[want]);
    }
}

#[test]
fn every_problem_is_reported_at_once() {
    check(
        Profile::FlashV3,
        &[
            ("MODEL_PATH", None),
            ("AREAL_FILEROOT", Some("runs")),
            ("N_NODES", Some("5")),
            ("SBATCH_TIMELIMIT", Some("soon")),
            ("TRIAL_NAME", Some("a/b")),
        ],
        &["nokey"],
        &[
            "N_NODES must be 2, 4, 8 or 16, got '5'",
            "MODEL_PATH is required (the policy's model directory)",
            "AREAL_FILEROOT must be an absolute shared path, got 'runs'",
            "TRIAL_NAME may only contain letters, digits, '.', '_' and '-', start with a letter or digit, and be at most 128 characters, got 'a/b'",
            "SBATCH_TIMELIMIT must be a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS), got 'soon'",
            "override 'nokey' must have the form dotted.key=value",
        ],
    );
}

#[test]
fn print_profile_prints_thirteen_lines_with_the_flash_v3_rules() {
    let lines = |profile, vars: &[(&str, &str)]| {
        let env: Env = vars.iter().map(|(k, v)| (*k, *v)).collect();
        validate::profile_knobs(profile, &env)
            .map(|k| k.lines().join("\n"))
            .map_err(|p| p.lines().join("\n"))
    };
    let mut all = String::new();
    for (profile, vars) in [
        (Profile::Local, &[][..]),
        (Profile::Grpo, &[][..]),
        (Profile::FlashV3, &[][..]),
        (Profile::FlashV3, &[("N_NODES", "2")][..]),
        (
            Profile::Grpo,
            &[("LEARNING_RATE", "2e-6"), ("CHECKPOINT_EVERY", "25")][..],
        ),
        (Profile::Local, &[("CHECKPOINT_EVERY", "5")][..]),
        (
            Profile::FlashV3,
            &[("N_NODES", "4"), ("CONTEXT_LENGTH", "65536")][..],
        ),
        (
            Profile::FlashV3,
            &[("N_NODES", "16"), ("MAX_TOKENS", "100000")][..],
        ),
        (
            Profile::FlashV3,
            &[
                ("CONTEXT_LENGTH", "32768"),
                ("MAX_NEW_TOKENS", "8192"),
                ("TRAIN_BATCH_SIZE", "16"),
                ("N_SAMPLES", "8"),
                ("TOTAL_TRAIN_STEPS", "10"),
                ("MAX_CONCURRENT_ROLLOUTS", "64"),
            ][..],
        ),
    ] {
        let out = lines(profile, vars).expect("valid knobs");
        assert_eq!(out.lines().count(), 13, "{out}");
        all.push_str(&format!("# {} {vars:?}\n{out}\n", profile.name()));
    }
    insta::assert_snapshot!(all);
    // Errors come before any path is looked at: this environment has none.
    assert_eq!(
        lines(Profile::FlashV3, &[("N_NODES", "32"), ("CONTEXT_LENGTH", "0")]),
        Err("N_NODES must be 2, 4, 8 or 16, got '32'\nCONTEXT_LENGTH must be a positive decimal integer without leading zeros, got '0'".into())
    );
}

#[test]
fn sglang_layouts_place_replicas_on_whole_nodes() {
    use profile::Serving::{Burn, Sglang};
    let parsed =
        |layout: &str| profile::parse_rollout(layout).map(|l| (l.serving, l.replicas, l.gpus_per_replica()));
    assert_eq!(parsed("sglang:d4t4p1"), Ok((Sglang { tp: 4, pp: 1 }, 4, 4)));
    assert_eq!(parsed("sglang:d4p1t2"), Ok((Sglang { tp: 2, pp: 1 }, 4, 2)));
    assert_eq!(parsed("sglang:d2t2p2"), Ok((Sglang { tp: 2, pp: 2 }, 2, 4)));
    assert_eq!(parsed("burn:d8"), Ok((Burn, 8, 1)));
    assert_eq!(parsed("burn:d2t1p1"), Ok((Burn, 2, 1)));
    for bad in [
        "d4t4p1",
        "sglang:d4d2",
        "sglang:x1",
        "sglang:d0",
        "sglang:d",
        "sglang:t2",
        "burn:d",
        "vllm:d2",
    ] {
        assert!(profile::parse_rollout(bad).is_err(), "{bad}");
    }
    let site = Site::new();
    let mut seen = Vec::new();
    for n in ["2", "4", "8", "16"] {
        let l = site
            .launch(Profile::FlashV3, Mode::Submit, &[("N_NODES", Some(n))], &[])
            .expect("valid");
        let p = l.placement;
        seen.push((
            p.job_nodes(),
            p.serve_nodes,
            p.replicas_per_node,
            p.gpus_per_replica,
        ));
    }
    // Flash V3 serves d replicas of t4 GPUs: two per 8-GPU node, on N_NODES nodes, after the trainer's one.
    assert_eq!(seen, [(3, 2, 2, 4), (5, 4, 2, 4), (9, 8, 2, 4), (17, 16, 2, 4)]);
}

/// `ACTOR_LAYOUT` and the profiles' actors: burn trains in the loop's process on one node; `fsdp2:dN` fills
/// whole trainer nodes with N ranks (all on one node without GPUs); anything else is one line naming it.
#[test]
fn actor_layouts_place_the_fsdp2_worker_on_whole_trainer_nodes() {
    use profile::ActorLayout::{Burn, Fsdp2};
    for (layout, want) in [
        ("burn", Ok(Burn)),
        ("burn:1gpu", Ok(Burn)),
        ("burn:cpu", Ok(Burn)),
        ("fsdp2:d8", Ok(Fsdp2 { ranks: 8 })),
        ("fsdp2:d8p1t1", Ok(Fsdp2 { ranks: 8 })),
        ("fsdp2:t1d16", Ok(Fsdp2 { ranks: 16 })),
    ] {
        assert_eq!(profile::parse_actor(layout), want, "{layout}");
    }
    for bad in [
        "fsdp:d8p1t1",
        "fsdp2:",
        "fsdp2:d0",
        "fsdp2:d8d8",
        "fsdp2:x2",
        "megatron:d2",
        "fsdp2:p1",
    ] {
        assert!(profile::parse_actor(bad).is_err(), "{bad}");
    }
    check(
        Profile::Grpo,
        &[("ACTOR_LAYOUT", Some("fsdp2:d8t2"))],
        &[],
        &[
            "ACTOR_LAYOUT asks for pipeline or tensor parallelism, which the FSDP2 trainer does not have (only p1t1), got 'fsdp2:d8t2'",
        ],
    );
    check(
        Profile::Grpo,
        &[("ACTOR_LAYOUT", Some("fsdp:d8p1t1"))],
        &[],
        &[
            "ACTOR_LAYOUT must be burn, burn:cpu, burn:1gpu or fsdp2:dN (N data-parallel ranks; p1 and t1 may follow), got 'fsdp:d8p1t1'",
        ],
    );
    check(
        Profile::Grpo,
        &[("ACTOR_LAYOUT", Some("fsdp2:d12"))],
        &[],
        &[
            "N_GPUS_PER_NODE=8 does not fit the actor layout fsdp2:d12: 12 ranks do not fill whole nodes of 8 GPUs",
        ],
    );

    check(
        Profile::Grpo,
        &[
            ("ROLLOUT_LAYOUT", Some("burn:d8")),
            ("SGLANG_LAUNCHER", Some("python3 launch.py")),
        ],
        &[],
        &[
            "SGLANG_LAUNCHER is set ('python3 launch.py'), but the rollout layout starts no SGLang server: it runs arena-rl serve-policy replicas (a burn: layout); unset SGLANG_LAUNCHER or set ROLLOUT_LAYOUT=sglang:dDtTpP",
        ],
    );
    check(
        Profile::Local,
        &[("SGLANG_LAUNCHER", Some("python3 launch.py"))],
        &[],
        &[
            "SGLANG_LAUNCHER is set ('python3 launch.py'), but the rollout layout starts no SGLang server: it runs the policy in the trainer's process (in-process); unset SGLANG_LAUNCHER or set ROLLOUT_LAYOUT=sglang:dDtTpP",
        ],
    );
    let site = Site::new();
    let placed = |profile, changes: &[Change<'_>]| {
        let l = site.launch(profile, Mode::Submit, changes, &[]).expect("valid");
        let p = l.placement;
        (
            l.knobs.actor.clone(),
            p.trainer_nodes,
            p.trainer_ranks_per_node,
            p.serve_nodes,
            p.job_nodes(),
        )
    };
    // grpo runs the reference's FSDP d8p1t1 on the trainer node's 8 GPUs, then 2 nodes of SGLang d4t2.
    assert_eq!(placed(Profile::Grpo, &[]), ("fsdp2:d8p1t1".into(), 1, 8, 1, 2));
    assert_eq!(
        placed(Profile::Grpo, &[("ACTOR_LAYOUT", Some("fsdp2:d16"))]),
        ("fsdp2:d16p1t1".into(), 2, 8, 1, 3)
    );
    assert_eq!(
        placed(Profile::Grpo, &[("ACTOR_LAYOUT", Some("fsdp2:d4"))]),
        ("fsdp2:d4p1t1".into(), 1, 4, 1, 2)
    );
    assert_eq!(
        placed(Profile::Grpo, &[("ACTOR_LAYOUT", Some("burn"))]),
        ("burn:1gpu".into(), 1, 0, 1, 2)
    );
    assert_eq!(placed(Profile::Local, &[]), ("burn:cpu".into(), 1, 0, 0, 1));
    assert_eq!(
        placed(Profile::Local, &[("ACTOR_LAYOUT", Some("fsdp2:d2"))]),
        ("fsdp2:d2p1t1".into(), 1, 2, 0, 1)
    );
    assert_eq!(
        placed(Profile::FlashV3, &[("N_NODES", Some("2"))]),
        ("burn:1gpu".into(), 1, 0, 2, 3)
    );
    // multinode-cpu: burn on the trainer's node, its one CPU replica on a second node.
    assert_eq!(
        placed(Profile::MultinodeCpu, &[]),
        ("burn:cpu".into(), 1, 0, 1, 2)
    );
    let l = site
        .launch(Profile::MultinodeCpu, Mode::Submit, &[], &[])
        .expect("valid");
    assert_eq!(
        (l.placement.replicas_per_node, l.placement.gpus_per_replica),
        (1, 0)
    );
}

/// An `fsdp2:` actor renders the worker's step (torchrun over the trainer nodes with c10d rendezvous on the
/// first, rank 0 listening for the loop, the job's own key in the environment only) and the overrides that
/// point the loop at it; `--rollout-only` trains nothing and starts no worker.
#[test]
fn an_fsdp2_actor_starts_the_worker_and_points_the_loop_at_rank_0() {
    let site = Site::new();
    let mut l = site
        .launch(
            Profile::Local,
            Mode::Submit,
            &[("ACTOR_LAYOUT", Some("fsdp2:d2"))],
            &[],
        )
        .expect("valid");
    let (_, train) = site.scripts(&l);
    for want in [
        "trainer_nodes=1\ntrainer_ranks_per_node=2\n",
        "    export ARENA_RL_TRAINER_PORT=29510\n",
        "    export ARENA_RL_RDZV_PORT=29400\n",
        "    export ARENA_RL_TRAINER_PYTHON=python3\n",
        "exec \"$ARENA_RL_TRAINER_PYTHON\" -m torch.distributed.run --nnodes \"$trainer_nodes\"",
        "--rdzv-backend c10d",
        "--listen \"0.0.0.0:$ARENA_RL_TRAINER_PORT\" --run-dir \"$ARENA_RUN_DIR\"",
        "\"actor.fsdp2.attach=$ARENA_TRAINER_ATTACH\"",
        "--step fsdp2-worker",
        "export ARENA_RL_TRAINER_DEVICE=cpu",
    ] {
        assert!(train.contains(want), "{want:?} missing from:\n{train}");
    }
    // The key is drawn when the job runs and passed in the environment; no line of the script sets it to a
    // value or passes it as an argument.
    assert!(
        train.contains("ARENA_RL_TRAINER_API_KEY=\"$(od -An -N32 -tx1 /dev/urandom"),
        "{train}"
    );
    for line in train.lines().filter(|l| l.contains("ARENA_RL_TRAINER_API_KEY")) {
        let line = line.trim();
        assert!(
            line.starts_with('#')
                || line.starts_with("if [[ -z \"${ARENA_RL_TRAINER_API_KEY:-}\" ]]")
                || line.starts_with("ARENA_RL_TRAINER_API_KEY=\"$(od ")
                || line == "export ARENA_RL_TRAINER_API_KEY"
                || line.starts_with("echo \"train: ARENA_RL_TRAINER_API_KEY is not set"),
            "{line}"
        );
    }
    let overrides = render::profile_overrides(&l);
    for want in ["actor.backend=fsdp2", "actor.fsdp2.nproc_per_node=2"] {
        assert!(overrides.contains(&want.to_string()), "{overrides:?}");
    }
    // The run config applied: the worker's Python and the run folder come from it.
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let config = checkout.join(Profile::Local.default_config());
    let env: Env = site.env().into_iter().collect();
    let mut l2 = site
        .launch(
            Profile::Local,
            Mode::Submit,
            &[
                ("ACTOR_LAYOUT", Some("fsdp2:d2")),
                ("CONFIG_PATH", Some(config.to_str().expect("utf-8"))),
                ("TRIAL_NAME", Some("t1")),
            ],
            &["actor.fsdp2.python=/opt/torch/bin/python"],
        )
        .expect("valid");
    let loaded = check_config(&l2, &env).unwrap_or_else(|p| panic!("{}", p.lines().join("\n")));
    l2.apply_config(&loaded);
    assert_eq!(l2.run.worker_python, "/opt/torch/bin/python");
    assert_eq!(l2.run.run_dir, site.root.join("runs/arena-local/t1"));
    let (_, train) = site.scripts(&l2);
    assert!(
        train.contains("    export ARENA_RUN_DIR=/shared/runs/arena-local/t1\n"),
        "{train}"
    );

    // On GPU nodes: every GPU of the node, bf16 with f32 masters, activation checkpointing.
    let g = site.launch(Profile::Grpo, Mode::Submit, &[], &[]).expect("valid");
    let overrides = render::profile_overrides(&g);
    for want in [
        "actor.device=cuda",
        "actor.backend=fsdp2",
        "actor.fsdp2.nproc_per_node=8",
        "actor.bf16_autocast=true",
        "actor.recompute_layers=true",
    ] {
        assert!(overrides.contains(&want.to_string()), "{want}: {overrides:?}");
    }

    l.rollout_only = Some(4);
    let (_, rollout) = site.scripts(&l);
    assert!(rollout.contains("trainer_ranks_per_node=0\n"), "{rollout}");
    assert!(!rollout.contains("actor.fsdp2.attach"), "{rollout}");
    assert!(!render::profile_overrides(&l).contains(&"actor.backend=fsdp2".to_string()));
}

/// With several trainer nodes, c10d may give rank 0 to any of them: the loop's step finds it as the node whose
/// ARENA_RL_TRAINER_PORT accepts a connection (two loopback addresses stand for two nodes, only one listens),
/// and gives up after actor.fsdp2.ready_timeout_seconds naming the nodes and the port.
#[test]
fn the_loop_finds_rank_0_among_several_trainer_nodes() {
    let site = Site::new();
    let mut l = site
        .launch(
            Profile::Grpo,
            Mode::Submit,
            &[("ACTOR_LAYOUT", Some("fsdp2:d16"))],
            &[],
        )
        .expect("valid");
    l.run.worker_ready_seconds = 2;
    let (_, train) = site.scripts(&l);
    let start = train.find("worker_rank0() {").expect("the rank-0 finder");
    let end = start + train[start..].find("\n}\n").expect("its end") + 3;
    let finder = &train[start..end];
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a port on 127.0.0.1");
    let port = listener.local_addr().expect("bound").port().to_string();
    let find = |nodes: &str| {
        Command::new("bash")
            .arg("-c")
            .arg(format!("{finder}worker_rank0"))
            .env("ARENA_TRAINER_NODES", nodes)
            .env("ARENA_RL_TRAINER_PORT", &port)
            .output()
            .expect("bash runs")
    };
    let out = find("127.0.0.2,127.0.0.1");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        format!("127.0.0.1:{port}\n")
    );
    // One trainer node is rank 0's without asking.
    let out = find("node-a");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("node-a:{port}\n"));
    drop(listener);
    let out = find("127.0.0.2,127.0.0.3");
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "train: no trainer node (127.0.0.2,127.0.0.3) listens on ARENA_RL_TRAINER_PORT={port} after 2 s\n"
        )
    );
}

/// A config that trains with FSDP2 under a burn actor would start a worker the job did not place: refused,
/// pointing at ACTOR_LAYOUT.
#[test]
fn an_fsdp2_config_under_a_burn_actor_is_refused() {
    let site = Site::new();
    let config = site.root.join("fsdp2.yaml");
    write(&config, "experiment_name: x\nactor:\n  backend: fsdp2\n");
    let l = site
        .launch(
            Profile::Local,
            Mode::Submit,
            &[("CONFIG_PATH", Some(config.to_str().expect("utf-8")))],
            &[],
        )
        .expect("valid");
    let env: Env = site.env().into_iter().collect();
    let err = check_config(&l, &env).expect_err("refused").lines().join("\n");
    assert!(
        err.ends_with("sets actor.backend: fsdp2, but the local profile's actor is burn:cpu: set ACTOR_LAYOUT=fsdp2:dN (N ranks) to have the job start the FSDP2 worker"),
        "{err}"
    );
}

fn snapshot(site: &Site, launch: &Launch) -> String {
    let (controller, train) = site.scripts(launch);
    format!("==> controller.sbatch <==\n{controller}\n==> train.sbatch <==\n{train}")
}

#[test]
fn rendered_scripts_for_every_profile_and_node_count() {
    let site = Site::new();
    let mut cases: Vec<(String, Launch)> = Vec::new();
    for (name, profile) in [
        ("local", Profile::Local),
        ("grpo", Profile::Grpo),
        ("multinode_cpu", Profile::MultinodeCpu),
    ] {
        let l = site.launch(profile, Mode::Submit, &[], &[]).expect("valid");
        cases.push((name.into(), l));
    }
    for n in ["2", "4", "8", "16"] {
        let l = site
            .launch(Profile::FlashV3, Mode::Submit, &[("N_NODES", Some(n))], &[])
            .expect("valid");
        cases.push((format!("flash_v3_n{n}"), l));
    }
    for (name, launch) in cases {
        insta::assert_snapshot!(format!("scripts_{name}"), snapshot(&site, &launch));
    }
}

/// `--print-profile`'s `nodes` is what the GPU job allocates (`#SBATCH --nodes`) and what the run is told
/// (`cluster.n_nodes`), for every profile and `N_NODES`; flash-v3 printed `N_NODES` while allocating one more.
#[test]
fn print_profile_nodes_are_the_jobs_allocation() {
    let site = Site::new();
    let mut cases: Vec<(Profile, Option<&str>)> = vec![
        (Profile::Local, None),
        (Profile::Grpo, None),
        (Profile::MultinodeCpu, None),
    ];
    cases.extend(["2", "4", "8", "16"].map(|n| (Profile::FlashV3, Some(n))));
    for (profile, n_nodes) in cases {
        let changes: Vec<(&str, Option<&str>)> = n_nodes.map(|n| ("N_NODES", Some(n))).into_iter().collect();
        let launch = site.launch(profile, Mode::Submit, &changes, &[]).expect("valid");
        let scripts = render::render(&launch);
        let mut vars = site.env();
        vars.extend(
            changes
                .iter()
                .filter_map(|(k, v)| v.map(|v| (k.to_string(), v.to_string()))),
        );
        let env: Env = vars.into_iter().collect();
        let printed = validate::profile_knobs(profile, &env).expect("valid").nodes;
        let allocated = format!("#SBATCH --nodes={printed}\n");
        assert!(
            scripts.train.contains(&allocated),
            "{profile:?} {changes:?}: prints nodes={printed}"
        );
        assert!(
            render::profile_overrides(&launch).contains(&format!("cluster.n_nodes={printed}")),
            "{profile:?} {changes:?}"
        );
    }
}

#[test]
fn rendered_scripts_with_every_option_set() {
    let site = Site::new();
    let l = site
        .launch(
            Profile::Grpo,
            Mode::CheckArena,
            &[
                ("AREAL_CONTAINER_BIN", Some("none")),
                ("AREAL_IMAGE", None),
                ("AREAL_CONTROLLER_MOUNTS", None),
                ("AREAL_WORKER_MOUNTS", None),
                ("TRIAL_NAME", Some("smoke-7")),
                ("CONFIG_PATH", Some("examples/configs/local.yaml")),
                (
                    "ARENA_RL_BIN",
                    Some(&site.path("arena-rl/target/release/arena-rl")),
                ),
                ("SBATCH_PARTITION", Some("gpu")),
                ("SBATCH_ACCOUNT", Some("rl-team")),
                ("SBATCH_RESERVATION", Some("friday")),
                ("SBATCH_TIMELIMIT", Some("2-00:00:00")),
                ("ARENA_CONTROLLER_TIME", Some("2-01:00:00")),
                ("ARENA_PREFLIGHT_MIN_TASKS", Some("0")),
                ("ARENA_STREAM_ID", Some("stream/a")),
                ("ARENA_OPENAPI_BASE", Some("https://arena.example/openapi/v1")),
                ("ARENA_POLICY_PORT", Some("31000")),
                ("ARENA_SUPERVISE_INTERVAL", Some("5")),
                ("N_GPUS_PER_NODE", Some("4")),
            ],
            &["gconfig.temperature=0.7", "experiment_name=it's mine"],
        )
        .expect("valid");
    insta::assert_snapshot!(snapshot(&site, &l));
}

#[test]
fn rendered_scripts_are_valid_bash_and_hold_no_credential() {
    let site = Site::new();
    let secrets = [
        ("ARENA_OPENAPI_TOKEN", Some("tok-0f9e8d7c6b5a")),
        ("ARENA_LLM_API_KEY", Some("llm-1a2b3c4d5e6f")),
        ("SWE_RL_ADMIN_API_KEY", Some("adm-9z8y7x6w5v4u")),
        ("WANDB_API_KEY", Some("wandb-key-5e6f7a8b9c0d")),
        ("MLFLOW_TRACKING_TOKEN", Some("mlflow-token-1f2e3d4c")),
    ];
    for (profile, extra) in [
        (Profile::Local, None),
        (Profile::Local, Some(("ACTOR_LAYOUT", Some("fsdp2:d2")))),
        (Profile::Grpo, None),
        (Profile::Grpo, Some(("ACTOR_LAYOUT", Some("fsdp2:d16")))),
        (Profile::FlashV3, Some(("N_NODES", Some("2")))),
        (Profile::FlashV3, Some(("N_NODES", Some("16")))),
    ] {
        let mut changes = secrets.to_vec();
        changes.extend(extra);
        for mode in [Mode::Submit, Mode::CheckArena] {
            let l = site.launch(profile, mode, &changes, &[]).expect("valid");
            let s = render::render(&l);
            for (name, text) in [("controller", &s.controller), ("train", &s.train)] {
                for (_, secret) in &secrets {
                    let secret = secret.expect("set");
                    assert!(!text.contains(secret), "{name} script holds {secret}");
                }
                let path = site.root.join(format!("{name}.sh"));
                std::fs::write(&path, text).expect("write");
                let out = Command::new("bash")
                    .arg("-n")
                    .arg(&path)
                    .output()
                    .expect("bash runs");
                assert!(
                    out.status.success(),
                    "bash -n {name}: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

#[test]
fn the_default_trial_name_has_the_time_and_pid() {
    let site = Site::new();
    let l = site.launch(Profile::Grpo, Mode::Submit, &[], &[]).expect("valid");
    assert_eq!(l.trial, "arena-20260102-030405-4242");
    assert_eq!(
        l.submission_dir,
        site.root.join("runs/submissions/arena-20260102-030405-4242")
    );
}

/// The real profile configs load through `stream-config` with the profile's overrides: the keys the profile
/// sets exist in the schema, and a typo in a user override is caught before anything is submitted.
#[test]
fn profile_configs_load_with_the_profile_overrides() {
    let site = Site::new();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let streams = site.root.join("streams.yaml");
    write(
        &streams,
        "streams:\n  - name: alpha\n    stream_id: stream-a\n    harness: claude-code@1\n",
    );
    for (profile, extra) in [
        (Profile::Local, None),
        (Profile::Grpo, None),
        (
            Profile::FlashV3,
            Some(("DATASET_CONFIG", Some(streams.to_str().expect("utf-8")))),
        ),
    ] {
        let config = checkout.join(profile.default_config());
        let mut changes = vec![("CONFIG_PATH", Some(config.to_str().expect("utf-8")))];
        changes.extend(extra);
        let l = site.launch(profile, Mode::Submit, &changes, &[]).expect("valid");
        let env: Env = site.env().into_iter().collect();
        if let Err(p) = check_config(&l, &env) {
            panic!("{}: {}", profile.name(), p.lines().join("\n"));
        }
        let typo = site
            .launch(profile, Mode::Submit, &changes, &["gconfig.n_sample=3"])
            .expect("valid");
        let err = check_config(&typo, &env).expect_err("unknown key");
        let text = err.lines().join("\n");
        assert!(
            text.starts_with(&format!("CONFIG_PATH {}: ", config.display())) && text.contains("n_sample"),
            "{text}"
        );
    }
}

/// `ARENA_STREAM_ID` names the Stream of a single-stream config; with a config that lists its Streams it
/// would have no effect, so it is refused before anything is written.
#[test]
fn a_stream_id_with_a_streams_list_is_refused() {
    let site = Site::new();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let config = checkout.join(Profile::Local.default_config());
    let listed = config.to_str().expect("utf-8");
    let env: Env = site.env().into_iter().collect();
    let changes = [
        ("CONFIG_PATH", Some(listed)),
        ("ARENA_STREAM_ID", Some("stream-9")),
    ];
    let l = site
        .launch(Profile::Local, Mode::Submit, &changes, &[])
        .expect("valid");
    let err = check_config(&l, &env).expect_err("refused").lines().join("\n");
    assert!(
        err.starts_with("ARENA_STREAM_ID is set, but CONFIG_PATH") && err.contains("would have no effect"),
        "{err}"
    );
}

/// `--rollout-only N`: the trainer step runs `arena-rl rollout` for the steps of batch x samples that make at
/// least N rollouts; without it, `arena-rl train` for the profile's steps.
#[test]
fn rollout_only_runs_the_rollout_loop_for_enough_steps() {
    let site = Site::new();
    let mut l = site
        .launch(Profile::Local, Mode::Submit, &[], &[])
        .expect("valid");
    let (_, train) = site.scripts(&l);
    assert!(train.contains("exec \"$ARENA_RL_BIN\" train --config"), "{train}");
    assert!(render::profile_overrides(&l).contains(&"actor.total_train_steps=2".to_string()));
    // local: batch 2 x 2 samples, so 10 rollouts take 3 steps (12 rollouts).
    l.rollout_only = Some(10);
    let (_, rollout) = site.scripts(&l);
    assert!(
        rollout.contains("exec \"$ARENA_RL_BIN\" rollout --config"),
        "{rollout}"
    );
    assert!(!rollout.contains("\" train --config"), "{rollout}");
    assert!(render::profile_overrides(&l).contains(&"actor.total_train_steps=3".to_string()));
}

/// One knob case: the profile with `changes` and `overrides`, loaded as `arena-rl train` loads it (the
/// profile's real config file, then the profile's overrides, then the user's); returns what `knob` reads from
/// that config, after checking that the rendered GPU job passes the profile's `arg` to `arena-rl train`.
fn check_knob<T: std::fmt::Debug + PartialEq>(
    profile: Profile,
    changes: &[Change],
    overrides: &[&str],
    arg: fn(&profile::Knobs) -> String,
    knob: fn(&stream_config::RunConfig) -> T,
    want: T,
) {
    let site = Site::new();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let streams = site.root.join("streams.yaml");
    write(
        &streams,
        "streams:\n  - name: alpha\n    stream_id: stream-a\n    harness: claude-code@1\n",
    );
    let config = checkout.join(profile.default_config());
    let mut all = vec![("CONFIG_PATH", Some(config.to_str().expect("utf-8")))];
    if profile == Profile::FlashV3 {
        all.push(("DATASET_CONFIG", Some(streams.to_str().expect("utf-8"))));
    }
    all.extend(changes.iter().copied());
    let l = site
        .launch(profile, Mode::Submit, &all, overrides)
        .expect("valid");
    let env: Env = site.env().into_iter().collect();
    let c = check_config(&l, &env).unwrap_or_else(|p| panic!("{}: {}", profile.name(), p.lines().join("\n")));
    assert_eq!(knob(&c), want, "{} {changes:?} {overrides:?}", profile.name());
    let train = render::render(&l).train;
    let arg = arg(&l.knobs);
    assert!(
        train.lines().any(|line| line.trim() == format!("{arg} \\")),
        "train.sbatch does not pass {arg} to arena-rl train:\n{train}"
    );
}

/// `context` has no config key of its own (the policy's context window is its model's): it sets what the
/// reference derives from it, the trainer's micro-batch budget (`ACTOR_MAX_TOKENS_PER_MB = CONTEXT_LENGTH`),
/// over the config file's value; the user's override still wins.
#[test]
fn context_sets_the_trainer_micro_batch_budget() {
    let arg = |k: &profile::Knobs| format!("actor.max_tokens_per_mb={}", k.context);
    let knob = |c: &stream_config::RunConfig| c.actor.max_tokens_per_mb;
    check_knob(Profile::Local, &[], &[], arg, knob, 2048);
    check_knob(Profile::Grpo, &[], &[], arg, knob, 32768);
    check_knob(Profile::FlashV3, &[], &[], arg, knob, 131072);
    let small = [("CONTEXT_LENGTH", Some("32768"))];
    check_knob(Profile::FlashV3, &small, &[], arg, knob, 32768);
    check_knob(
        Profile::FlashV3,
        &small,
        &["actor.max_tokens_per_mb=4096"],
        arg,
        knob,
        4096,
    );
}

/// `max_tokens` bounds prompt and output together; no output is longer than it, so it caps the run's default
/// output budget `gconfig.max_new_tokens` when `MAX_NEW_TOKENS` is above it (both below the context, as the
/// reference allows). flash_v3.yaml's own 131071 loses to the knobs.
#[test]
fn max_tokens_caps_the_output_budget() {
    let arg = |k: &profile::Knobs| format!("gconfig.max_new_tokens={}", k.max_new_tokens.min(k.max_tokens));
    let knob = |c: &stream_config::RunConfig| c.gconfig.max_new_tokens;
    check_knob(Profile::Local, &[], &[], arg, knob, 64);
    check_knob(Profile::Grpo, &[], &[], arg, knob, 8192);
    check_knob(Profile::FlashV3, &[], &[], arg, knob, 131071);
    let cases: &[(&[Change], u32)] = &[
        (&[("MAX_TOKENS", Some("20000"))], 20000),
        (
            &[("MAX_TOKENS", Some("1000")), ("MAX_NEW_TOKENS", Some("4000"))],
            1000,
        ),
        (
            &[("MAX_TOKENS", Some("9000")), ("MAX_NEW_TOKENS", Some("512"))],
            512,
        ),
        (
            &[("CONTEXT_LENGTH", Some("8192")), ("MAX_NEW_TOKENS", Some("8000"))],
            8000,
        ),
    ];
    for (changes, want) in cases {
        check_knob(Profile::FlashV3, changes, &[], arg, knob, *want);
    }
    let changes = [("MAX_TOKENS", Some("1000")), ("MAX_NEW_TOKENS", Some("4000"))];
    check_knob(
        Profile::FlashV3,
        &changes,
        &["gconfig.max_new_tokens=100"],
        arg,
        knob,
        100,
    );
}

/// `concurrency` is the number of rollouts in flight, `rollout.max_concurrent_rollouts`.
#[test]
fn concurrency_sets_the_rollouts_in_flight() {
    let arg = |k: &profile::Knobs| format!("rollout.max_concurrent_rollouts={}", k.concurrency);
    let knob = |c: &stream_config::RunConfig| c.rollout.max_concurrent_rollouts;
    check_knob(Profile::Local, &[], &[], arg, knob, Some(4));
    check_knob(Profile::Grpo, &[], &[], arg, knob, Some(16));
    check_knob(Profile::FlashV3, &[], &[], arg, knob, Some(1500));
    let changes = [("MAX_CONCURRENT_ROLLOUTS", Some("77"))];
    check_knob(Profile::FlashV3, &changes, &[], arg, knob, Some(77));
    check_knob(
        Profile::FlashV3,
        &changes,
        &["rollout.max_concurrent_rollouts=3"],
        arg,
        knob,
        Some(3),
    );
}

/// `--eval`: the trainer step runs `arena-rl eval` on the checkpoint, on the trainer's node alone (grpo's
/// policy servers and its FSDP2 worker are not started: the eval serves the checkpoint in its own process and
/// trains nothing), on the node's first GPU, with the output folder under the run folder.
#[test]
fn eval_runs_arena_rl_eval_on_the_trainer_node_alone() {
    let site = Site::new();
    write(&site.root.join("ckpt/step-3/config.json"), "{}");
    write(&site.root.join("models/policy/config.json"), "{}");
    write(&site.root.join("tasks.json"), "[]");
    let mut l = site
        .launch(
            Profile::Grpo,
            Mode::Submit,
            &[("TRIAL_NAME", Some("ev-1"))],
            &["gconfig.temperature=0.6"],
        )
        .expect("valid");
    let flags = super::eval::EvalFlags {
        checkpoint: Some("ckpt".into()),
        baseline: Some("models/policy".into()),
        samples: Some(4),
        manifest: Some("tasks.json".into()),
        ..Default::default()
    };
    l.set_eval(Some(flags.check(&site.root).expect("valid")));
    let (controller, train) = site.scripts(&l);
    insta::assert_snapshot!(snapshot(&site, &l));
    assert!(
        controller.contains("--eval: the GPU job evaluates a checkpoint"),
        "{controller}"
    );
    assert!(
        train.contains("exec \"$ARENA_RL_BIN\" eval --config \"$CONFIG_PATH\""),
        "{train}"
    );
    assert!(train.contains("#SBATCH --nodes=1\n"), "{train}");
    assert!(
        train.contains("trainer_nodes=1\ntrainer_ranks_per_node=0\n"),
        "{train}"
    );
    assert!(train.contains("replicas_per_node=0\n"), "{train}");
    for line in [
        "--checkpoint /shared/ckpt",
        "--baseline /shared/models/policy",
        "--samples 4",
        "--out /shared/runs/ev-1/eval",
        "--manifest /shared/tasks.json",
        "model.device=cuda:0",
        "model.dtype=bf16",
        "gconfig.temperature=0.6",
    ] {
        assert!(
            train.contains(&format!("                {line} \\\n"))
                || train.contains(&format!("                {line}\n")),
            "{line}:\n{train}"
        );
    }
    let overrides = render::profile_overrides(&l);
    assert!(
        overrides.contains(&"cluster.n_nodes=1".to_string()),
        "{overrides:?}"
    );
    assert!(
        !overrides
            .iter()
            .any(|o| o.starts_with("actor.") && o.contains("fsdp2")),
        "{overrides:?}"
    );
    assert!(render::worker_ranks(&l).is_none());
    let path = site.root.join("train.sh");
    std::fs::write(&path, &train).expect("write");
    let out = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("bash runs");
    assert!(
        out.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `--eval`'s flags are checked before anything is written, one line each naming the flag and the path.
#[test]
fn eval_refuses_a_checkpoint_that_is_not_there_in_one_line() {
    let site = Site::new();
    std::fs::create_dir_all(site.root.join("empty")).expect("dir");
    let check = |flags: super::eval::EvalFlags| -> Vec<String> {
        match flags.check(&site.root) {
            Ok(_) => Vec::new(),
            Err(p) => p
                .lines()
                .iter()
                .map(|l| l.replace(&site.root.display().to_string(), "/shared"))
                .collect(),
        }
    };
    assert_eq!(
        check(super::eval::EvalFlags {
            checkpoint: Some("nope/step-9".into()),
            ..Default::default()
        }),
        ["--checkpoint /shared/nope/step-9 does not exist or is not a directory"]
    );
    assert_eq!(
        check(super::eval::EvalFlags {
            checkpoint: Some("empty".into()),
            manifest: Some("/shared-missing/m.json".into()),
            streams: vec!["sim chat".into()],
            ..Default::default()
        }),
        [
            "--checkpoint /shared/empty is neither a model folder (no config.json) nor a folder of step-N checkpoints",
            "--manifest /shared-missing/m.json does not exist or is not a file",
            "--streams holds 'sim chat', which is not a Stream name (letters, digits, '.', '_', '-')",
        ]
    );
}

/// The Python of the `sglang` venv (`cargo xtask fixtures`), whose parser the SGLang tests use.
fn sglang_python() -> String {
    std::env::var("ARENA_RL_PY_SGLANG").unwrap_or_else(|_| {
        panic!("ARENA_RL_PY_SGLANG is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
    })
}

/// This checkout's `xtask/sglang` folder: the launcher and the argument checker.
fn sglang_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sglang")
}

fn sha256_hex(text: &str) -> String {
    use std::io::Write as _;
    let mut child = Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(text.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("sha256sum ends");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_string()
}

/// `sglang:dDtTpP` starts SGLang servers: the rendered train.sbatch's policy-server step, run as Slurm runs
/// replica 1 of grpo's `sglang:d4p1t2` on an 8-GPU node, execs the default launcher (`xtask/sglang/launch.py`),
/// which hands SGLang's own `prepare_server_args` (sglang 0.5.23) the arguments, the key added in process:
/// SGLang reads the model, address, port, tensor and pipeline sizes, context length, device, dtype and the
/// job's key, and the replica sees its own two GPUs. The key is on no process's command line, not in the
/// server's environment, and not in its output (SGLang's repr of its arguments is redacted); a misspelled
/// flag is refused by SGLang's parser, and the launcher refuses `--api-key` on its command line or no key.
#[test]
fn sglang_layouts_start_sglang_servers_whose_arguments_sglangs_parser_accepts() {
    let python = sglang_python();
    let site = Site::new();
    write(
        &site.root.join("secrets/arena.env"),
        "export ARENA_OPENAPI_BASE=http://arena.invalid/openapi/v1\nexport ARENA_OPENAPI_TOKEN=t\nexport ARENA_LLM_API_KEY=l\nexport SWE_RL_ADMIN_API_KEY=a\n",
    );
    let launcher = format!("{python} {}", sglang_dir().join("launch.py").display());
    let l = site
        .launch(
            Profile::Grpo,
            Mode::Submit,
            &[("SGLANG_LAUNCHER", Some(&launcher))],
            &[],
        )
        .expect("valid");
    let train = render::render(&l).train;
    let script = site.root.join("train.sbatch");
    std::fs::write(&script, &train).expect("write");
    let key = "5f1e0c9a7b3d4e2f8a6c1b0d9e8f7a6b5c4d3e2f1a0b9c8d7e6f5a4b3c2d1e0f";
    assert!(!train.contains(key));
    let record = site.root.join("server-args.json");
    let run = |args: &[&str], key: Option<&str>| {
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .args(args)
            .env("SLURM_LOCALID", "1")
            .env("CUDA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7")
            .env("SGLANG_RETURN_ORIGINAL_LOGPROB", "1")
            .env("ARENA_RL_SGLANG_ENTRY", "check_args")
            .env("PYTHONPATH", sglang_dir())
            .env("ARENA_RL_SGLANG_RECORD", &record)
            .env_remove("ARENA_RL_POLICY_API_KEY");
        if let Some(key) = key {
            cmd.env("ARENA_RL_POLICY_API_KEY", key);
        }
        cmd.output().expect("bash runs")
    };
    let out = run(&["--step", "policy-server"], Some(key));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert!(!text.contains(key), "the key is in the server's output:\n{text}");
    assert!(text.contains("api_key='[redacted]'"), "{text}");
    let got: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).expect("the record")).expect("json");
    let model = site.path("models/policy");
    let want = serde_json::json!({
        "model_path": model,
        "host": "0.0.0.0",
        "port": 30001,
        "tp_size": 2,
        "pp_size": 1,
        "dp_size": 1,
        "context_length": 32768,
        "device": "cuda",
        "dtype": "bfloat16",
        "api_key_set": true,
        "api_key_sha256": sha256_hex(key),
        "cmdlines_holding_the_key": [],
        "cuda_visible_devices": "2,3",
        "key_in_environment": false,
        "sglang_return_original_logprob": null,
    });
    for (field, value) in want.as_object().expect("an object") {
        assert_eq!(&got[field], value, "{field}: {got}");
    }
    // The launcher's own command line is what train.sbatch rendered, with no key.
    let cmdline: Vec<String> = serde_json::from_value(got["cmdline"].clone()).expect("a list");
    assert_eq!(cmdline[0], python);
    assert!(cmdline[1].ends_with("xtask/sglang/launch.py"), "{cmdline:?}");
    assert!(!cmdline.iter().any(|a| a.contains(key)), "{cmdline:?}");

    // SGLang's parser refuses a misspelled flag: the arguments above are checked, not waved through.
    let argv: Vec<String> = cmdline[2..]
        .iter()
        .map(|a| {
            if a == "--tp-size" {
                "--tp-sise".into()
            } else {
                a.clone()
            }
        })
        .collect();
    let out = Command::new(&python)
        .arg(sglang_dir().join("check_args.py"))
        .args(&argv)
        .output()
        .expect("python runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("error: unrecognized arguments: --tp-sise 2"),
        "{err}"
    );

    // No key, or a key on the command line, is refused before SGLang starts.
    let out = run(&["--step", "policy-server"], None);
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "train: ARENA_RL_POLICY_API_KEY is not set; a policy server on every interface needs one\n"
    );
    let out = Command::new(&python)
        .arg(sglang_dir().join("launch.py"))
        .args(["--model-path", "/m", "--api-key", "on-the-command-line"])
        .env("ARENA_RL_POLICY_API_KEY", key)
        .output()
        .expect("python runs");
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "sglang launcher: --api-key must not be on the command line; the launcher reads the key from ARENA_RL_POLICY_API_KEY\n"
    );
}

/// What each rollout layout runs on the policy nodes: SGLang servers over T x P GPUs each (`--tp-size`,
/// `--pp-size`) for `sglang:`, `arena-rl serve-policy` on one GPU each for `burn:dD` (a burn layout that would
/// give a replica GPUs it leaves idle is refused in one line), all replicas on one node's CPUs without GPUs;
/// GPU profiles wait 30 minutes for the servers, CPU ones the schema's 300 s.
#[test]
fn rollout_layouts_run_sglang_or_serve_policy_on_every_gpu_they_are_given() {
    check(
        Profile::Grpo,
        &[("ROLLOUT_LAYOUT", Some("burn:d4t2"))],
        &[],
        &[
            "ROLLOUT_LAYOUT gives each serve-policy replica 2 GPUs, but burn serves on one and would leave the others idle: use burn:d4 (one GPU each), or sglang:d4t2p1 to serve with SGLang, got 'burn:d4t2'",
        ],
    );
    check(
        Profile::Grpo,
        &[("ROLLOUT_LAYOUT", Some("vllm:d4"))],
        &[],
        &[
            "ROLLOUT_LAYOUT must be sglang:dDtTpP (D SGLang servers of T x P GPUs each), burn:dD (D serve-policy replicas of one GPU each) or in-process, got 'vllm:d4'",
        ],
    );
    check(
        Profile::Grpo,
        &[("SGLANG_LAUNCHER", Some("python3 'launch.py'"))],
        &[],
        &[
            "SGLANG_LAUNCHER must be a command and its arguments separated by spaces, without quotes or shell characters, got 'python3 'launch.py''",
        ],
    );
    let site = Site::new();
    let placed = |profile, changes: &[Change<'_>]| {
        let l = site.launch(profile, Mode::Submit, changes, &[]).expect("valid");
        let p = l.placement;
        let train = render::render(&l).train;
        let overrides = render::profile_overrides(&l);
        (
            (
                p.serve_nodes,
                p.replicas_per_node,
                p.gpus_per_replica,
                p.job_nodes(),
            ),
            train,
            overrides,
        )
    };
    let ready = format!(
        "rollout.policy_server_ready_timeout_seconds={}",
        render::GPU_POLICY_READY_SECONDS
    );

    let (shape, train, overrides) = placed(Profile::Grpo, &[]);
    assert_eq!(shape, (1, 4, 2, 2));
    let launcher = format!(
        "exec python3 {}/arena-rl/xtask/sglang/launch.py --model-path",
        site.root.display()
    );
    assert!(train.contains(&launcher), "{train}");
    assert!(
        train.contains("--tp-size 2 --pp-size 1 --context-length 32768 \\\n                --device cuda --dtype bfloat16\n"),
        "{train}"
    );
    assert!(!train.contains("serve-policy --model"), "{train}");
    assert!(overrides.contains(&ready), "{overrides:?}");

    let (shape, train, overrides) = placed(Profile::Grpo, &[("ROLLOUT_LAYOUT", Some("burn:d8"))]);
    assert_eq!(shape, (1, 8, 1, 2));
    assert!(
        train.contains("exec \"$ARENA_RL_BIN\" serve-policy --model \"$MODEL_PATH\" --host 0.0.0.0"),
        "{train}"
    );
    assert!(
        train.contains("--device cuda \\\n                --dtype bf16"),
        "{train}"
    );
    assert!(!train.contains("--tp-size"), "{train}");
    assert!(overrides.contains(&ready), "{overrides:?}");

    let (shape, _, _) = placed(
        Profile::FlashV3,
        &[("N_NODES", Some("2")), ("ROLLOUT_LAYOUT", Some("sglang:d2t4p2"))],
    );
    assert_eq!(shape, (2, 1, 8, 3));

    // Without GPUs every replica shares one node's CPUs, and the launcher is the site's.
    let (shape, train, overrides) = placed(
        Profile::Local,
        &[
            ("ROLLOUT_LAYOUT", Some("sglang:d2")),
            (
                "SGLANG_LAUNCHER",
                Some("/opt/py/bin/python /opt/as_serve_policy.py"),
            ),
        ],
    );
    assert_eq!(shape, (1, 2, 0, 2));
    assert!(
        train.contains("exec /opt/py/bin/python /opt/as_serve_policy.py --model-path \"$MODEL_PATH\""),
        "{train}"
    );
    assert!(train.contains("--device cpu --dtype float32\n"), "{train}");

    // `--print-profile` prints the layout that runs and the nodes it takes.
    let env: Env = [("ROLLOUT_LAYOUT", "burn:d16")].into_iter().collect();
    let knobs = validate::profile_knobs(Profile::Grpo, &env).expect("valid");
    assert_eq!((knobs.rollout.as_str(), knobs.nodes), ("burn:d16", 3));
    assert!(
        !overrides
            .iter()
            .any(|o| o.starts_with("rollout.policy_server_ready")),
        "{overrides:?}"
    );
}

/// The GPU profiles' run defaults (module `defaults`): the learning rate by model size (flash-v3's fixed
/// 3e-6), a checkpoint every 10 steps, and bf16 weights in 4 GiB shards for the policy servers; each passed
/// only where the user's config does not set its key, and loaded by the run config as the value it names.
/// `LEARNING_RATE` and `CHECKPOINT_EVERY` pass over the config; CPU profiles and runs that train nothing get
/// none.
#[test]
fn gpu_profiles_pass_run_defaults_where_the_users_config_sets_none() {
    let site = Site::new();
    let checkout = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let env: Env = site.env().into_iter().collect();
    let streams = site.root.join("streams.yaml");
    write(
        &streams,
        "streams:\n  - name: alpha\n    stream_id: stream-a\n    harness: claude-code@1\n",
    );
    let launch = |profile: Profile, extra: &[Change]| {
        let config = checkout.join(profile.default_config());
        let mut changes = vec![("CONFIG_PATH", Some(config.to_str().expect("utf-8")))];
        if profile == Profile::FlashV3 {
            changes.push(("DATASET_CONFIG", Some(streams.to_str().expect("utf-8"))));
        }
        changes.extend(extra.iter().copied());
        site.launch(profile, Mode::Submit, &changes, &[]).expect("valid")
    };
    let nothing_set = |_: &str| false;
    let args = |l: &Launch| l.run_defaults.iter().map(|c| c.arg.clone()).collect::<Vec<_>>();
    let weights = [
        "rollout.weights_dtype=bf16".to_string(),
        "rollout.weights_shard_bytes=4294967296".to_string(),
    ];

    // grpo, Qwen3-8B-sized: 1e-6, and the run config reads every default as its value.
    let mut l = launch(Profile::Grpo, &[]);
    l.run_defaults = defaults::resolve(&l, &nothing_set, Some(8_190_000_000));
    let mut want = vec![
        "actor.lr=1e-6".to_string(),
        "checkpoint.save_every=10".to_string(),
    ];
    want.extend(weights.clone());
    assert_eq!(args(&l), want);
    let c = check_config(&l, &env).unwrap_or_else(|p| panic!("{}", p.lines().join("\n")));
    assert_eq!(c.actor.lr, 1e-6);
    assert_eq!(c.checkpoint.save_every, 10);
    assert_eq!(c.rollout.weights_dtype.as_deref(), Some("bf16"));
    assert_eq!(c.rollout.weights_shard_bytes, Some(4 << 30));
    let train = render::render(&l).train;
    for arg in &want {
        assert!(
            train.lines().any(|line| line.trim() == format!("{arg} \\")),
            "{arg} not passed:\n{train}"
        );
    }
    // A model below 3B parameters trains at 1e-5; a config that sets a key keeps its value.
    l.run_defaults = defaults::resolve(&l, &nothing_set, Some(135_000_000));
    assert_eq!(args(&l)[0], "actor.lr=1e-5");
    let sets_lr_and_checkpoints = |key: &str| matches!(key, "actor.lr" | "checkpoint.save_every");
    l.run_defaults = defaults::resolve(&l, &sets_lr_and_checkpoints, Some(135_000_000));
    assert_eq!(args(&l), weights);
    // Without the fit check's parameter count, no rate by size is passed.
    l.run_defaults = defaults::resolve(&l, &nothing_set, None);
    assert!(
        !args(&l).iter().any(|a| a.starts_with("actor.lr=")),
        "{:?}",
        args(&l)
    );

    // flash-v3 (burn on one GPU, SGLang servers): its own 3e-6 whatever the size.
    let mut l = launch(Profile::FlashV3, &[]);
    l.run_defaults = defaults::resolve(&l, &nothing_set, Some(8_190_000_000));
    let mut want = vec![
        "actor.lr=3e-6".to_string(),
        "checkpoint.save_every=10".to_string(),
    ];
    want.extend(weights.clone());
    assert_eq!(args(&l), want);
    assert_eq!(check_config(&l, &env).expect("loads").actor.lr, 3e-6);

    // The variables pass over the config, and the defaults of their keys go.
    let mut l = launch(
        Profile::Grpo,
        &[
            ("LEARNING_RATE", Some("2.5e-6")),
            ("CHECKPOINT_EVERY", Some("25")),
        ],
    );
    l.run_defaults = defaults::resolve(&l, &nothing_set, Some(8_190_000_000));
    assert_eq!(args(&l), weights);
    let overrides = render::profile_overrides(&l);
    assert!(
        overrides.contains(&"actor.lr=2.5e-6".to_string()),
        "{overrides:?}"
    );
    assert!(
        overrides.contains(&"checkpoint.save_every=25".to_string()),
        "{overrides:?}"
    );
    let c = check_config(&l, &env).expect("loads");
    assert_eq!((c.actor.lr, c.checkpoint.save_every), (2.5e-6, 25));

    // CPU profiles keep the config's values unless a variable is set.
    for profile in [Profile::Local, Profile::MultinodeCpu] {
        let mut l = launch(profile, &[]);
        l.run_defaults = defaults::resolve(&l, &nothing_set, Some(135_000_000));
        assert_eq!(args(&l), Vec::<String>::new(), "{profile:?}");
    }
    let l = launch(Profile::Local, &[("CHECKPOINT_EVERY", Some("5"))]);
    assert!(render::profile_overrides(&l).contains(&"checkpoint.save_every=5".to_string()));

    // `--rollout-only` trains nothing: no learning rate, no checkpoints.
    let mut l = launch(Profile::Grpo, &[("CHECKPOINT_EVERY", Some("25"))]);
    l.rollout_only = Some(64);
    l.run_defaults = defaults::resolve(&l, &nothing_set, Some(8_190_000_000));
    assert_eq!(args(&l), Vec::<String>::new());
    assert!(
        !render::profile_overrides(&l)
            .iter()
            .any(|o| o.starts_with("checkpoint."))
    );
}
