//! From the launch environment to a checked [`Launch`]: every invalid variable or path is one line naming it,
//! all reported at once, before anything is written or submitted.

use std::path::{Path, PathBuf};

use super::Mode;
use super::env::{Ctx, Env};
use super::profile::{self, Knobs, Placement, Profile, Serving};

/// Problems found in the launch environment, one line each.
#[derive(Debug, Default)]
pub(crate) struct Problems(Vec<String>);

impl Problems {
    pub(crate) fn push(&mut self, line: impl Into<String>) {
        self.0.push(line.into());
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn lines(&self) -> &[String] {
        &self.0
    }
}

/// The variables a controller sources from the credentials file; it fails unless all four are set.
pub(crate) const CREDENTIALS: [&str; 4] = [
    "ARENA_OPENAPI_BASE",
    "ARENA_OPENAPI_TOKEN",
    "ARENA_LLM_API_KEY",
    "SWE_RL_ADMIN_API_KEY",
];

/// A validated launch: everything the scripts are rendered from.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    pub(crate) profile: Profile,
    pub(crate) mode: Mode,
    pub(crate) knobs: Knobs,
    pub(crate) placement: Placement,
    pub(crate) trial: String,
    pub(crate) areal_dir: PathBuf,
    pub(crate) config: PathBuf,
    /// `none` runs on the host.
    pub(crate) container_bin: String,
    pub(crate) image: Option<PathBuf>,
    /// The image of the `serve-policy` steps (`ROLLOUT_IMAGE`, default the image).
    pub(crate) rollout_image: Option<PathBuf>,
    /// The image of the FSDP2 worker's step (`TRAINER_IMAGE`, default the image).
    pub(crate) trainer_image: Option<PathBuf>,
    pub(crate) controller_mounts: Option<String>,
    pub(crate) worker_mounts: Option<String>,
    pub(crate) model: PathBuf,
    pub(crate) fileroot: PathBuf,
    pub(crate) credentials: PathBuf,
    pub(crate) bin: PathBuf,
    pub(crate) submission_dir: PathBuf,
    /// Flash V3's streams file (`DATASET_CONFIG`), read by its config through `${env:DATASET_CONFIG}`.
    pub(crate) dataset_config: Option<PathBuf>,
    pub(crate) worker_time: String,
    pub(crate) controller_time: String,
    pub(crate) partition: Option<String>,
    pub(crate) account: Option<String>,
    pub(crate) reservation: Option<String>,
    pub(crate) min_tasks: u64,
    pub(crate) stream_id: Option<String>,
    pub(crate) openapi_base: Option<String>,
    pub(crate) policy_port: u16,
    /// The command that starts one SGLang server (`SGLANG_LAUNCHER`, split at whitespace), given SGLang's
    /// arguments and the key in `ARENA_RL_POLICY_API_KEY`; by default the checkout's launcher,
    /// `python3 $AREAL_DIR/xtask/sglang/launch.py`, which runs `python -m sglang.launch_server`.
    pub(crate) sglang_launcher: Vec<String>,
    /// The port the FSDP2 worker's rank 0 serves the protocol on (`ARENA_RL_TRAINER_PORT`).
    pub(crate) trainer_port: u16,
    /// The port of `torchrun`'s c10d rendezvous on the first trainer node (`ARENA_RL_RDZV_PORT`).
    pub(crate) rdzv_port: u16,
    /// What the run config says about the run (its folder, the worker's Python); [`Launch::apply_config`]
    /// sets it from the loaded config.
    pub(crate) run: RunFacts,
    /// Seconds between the controller's looks at the GPU job.
    pub(crate) supervise_interval: u32,
    /// The user's dotted `key=value` overrides, after the profile's own.
    pub(crate) overrides: Vec<String>,
    /// The profile's run defaults that apply ([`super::defaults::resolve`], after the fit check).
    pub(crate) run_defaults: Vec<super::defaults::Chosen>,
    /// `--rollout-only N`: the GPU job runs `arena-rl rollout` for at least N rollouts instead of training.
    pub(crate) rollout_only: Option<u64>,
    /// `--eval`: the GPU job runs `arena-rl eval` on a checkpoint instead of training ([`Launch::set_eval`]).
    pub(crate) eval: Option<super::eval::EvalJob>,
    /// Where and when this was rendered (for the scripts' header).
    pub(crate) host: String,
    pub(crate) timestamp: String,
}

/// What the FSDP2 worker's step needs from the run config the job will load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunFacts {
    /// The run's folder, `cluster.fileroot/experiment_name/trial_name`: the worker refuses paths outside it.
    pub(crate) run_dir: PathBuf,
    /// The Python that runs `torch.distributed.run` (`actor.fsdp2.python`).
    pub(crate) worker_python: String,
    /// Seconds the worker may take to listen (`actor.fsdp2.ready_timeout_seconds`, whole seconds).
    pub(crate) worker_ready_seconds: u64,
}

impl RunFacts {
    fn of(config: &stream_config::RunConfig) -> Self {
        Self {
            run_dir: Path::new(&config.cluster.fileroot)
                .join(&config.experiment_name)
                .join(&config.trial_name),
            worker_python: config.actor.fsdp2.python.clone(),
            worker_ready_seconds: config
                .actor
                .fsdp2
                .ready_timeout_seconds
                .duration()
                .as_secs()
                .max(1),
        }
    }
}

impl Launch {
    /// Takes the run's folder and the worker's Python from the loaded run config (`check_config`'s).
    pub(crate) fn apply_config(&mut self, config: &stream_config::RunConfig) {
        self.run = RunFacts::of(config);
    }

    /// `--eval`: `arena-rl eval` runs the checkpoint in its own process (it refuses policy servers), so the
    /// job is the trainer's node alone, with no policy servers and no FSDP2 worker.
    pub(crate) fn set_eval(&mut self, eval: Option<super::eval::EvalJob>) {
        if eval.is_some() {
            let p = &mut self.placement;
            p.trainer_nodes = 1;
            p.trainer_ranks_per_node = 0;
            p.serving = profile::Serving::InProcess;
            p.serve_nodes = 0;
            p.replicas_per_node = 0;
            p.gpus_per_replica = 0;
        }
        self.eval = eval;
    }

    /// Whether the GPU job trains (not `--rollout-only`, not `--eval`).
    pub(crate) fn trains(&self) -> bool {
        self.rollout_only.is_none() && self.eval.is_none()
    }
}

/// Reads only what `--print-profile` needs: the profile's knobs, with no path checks.
pub(crate) fn profile_knobs(profile: Profile, env: &Env) -> Result<Knobs, Problems> {
    let mut problems = Problems::default();
    let knobs = profile::knobs(profile, env, &mut problems);
    // `nodes` is what the GPU job allocates: the trainer's node and the policy servers' nodes.
    let placement = knobs
        .as_ref()
        .and_then(|k| profile::placement(profile, k, env, &mut problems));
    match (knobs, placement) {
        (Some(mut k), Some(placement)) if problems.len() == 0 => {
            k.nodes = placement.job_nodes();
            k.actor = placement.actor_name();
            Ok(k)
        }
        _ => Err(problems),
    }
}

/// Checks the launch environment for `profile` and returns the launch, or every problem found.
pub(crate) fn validate(
    profile: Profile,
    mode: Mode,
    overrides: &[String],
    env: &Env,
    ctx: &Ctx,
) -> Result<Launch, Problems> {
    let mut p = Problems::default();
    let knobs = profile::knobs(profile, env, &mut p);
    let placement = knobs
        .as_ref()
        .and_then(|k| profile::placement(profile, k, env, &mut p));
    let knobs = knobs.map(|mut k| {
        if let Some(pl) = &placement {
            k.actor = pl.actor_name();
        }
        k
    });

    let areal_dir = match env.get("AREAL_DIR") {
        Some(dir) => absolute(&mut p, "AREAL_DIR", dir),
        None => Some(ctx.checkout.clone()),
    };
    // Paths under a broken AREAL_DIR are not checked: its one line says enough.
    let areal_dir = areal_dir.filter(|dir| {
        if !dir.is_dir() {
            p.push(format!("AREAL_DIR is not a directory: '{}'", dir.display()));
            return false;
        }
        directive_safe(&mut p, "AREAL_DIR", dir)
    });
    let under_checkout = |rel: &str| areal_dir.as_ref().map(|d| d.join(rel));

    let config = match env.get("CONFIG_PATH") {
        Some(c) => {
            plain(&mut p, "CONFIG_PATH", c).and_then(|_| under_checkout(c).or_else(|| Some(PathBuf::from(c))))
        }
        None => under_checkout(profile.default_config()),
    };
    if let Some(c) = &config
        && areal_dir.is_some()
    {
        readable_file(&mut p, "CONFIG_PATH", c);
    }

    let container_bin = env.get("AREAL_CONTAINER_BIN").unwrap_or("apptainer");
    let containerised = container_bin != "none";
    if !word(container_bin) {
        p.push(format!(
            "AREAL_CONTAINER_BIN must be a command name or path without spaces or quotes, or 'none', got '{container_bin}'"
        ));
    }
    let image = if containerised {
        required(&mut p, env, "AREAL_IMAGE", "the container image the jobs run in")
            .and_then(|s| absolute(&mut p, "AREAL_IMAGE", s))
            .inspect(|i| readable(&mut p, "AREAL_IMAGE", i))
    } else {
        None
    };
    let rollout_image = match env.get("ROLLOUT_IMAGE") {
        Some(s) if containerised => {
            absolute(&mut p, "ROLLOUT_IMAGE", s).inspect(|i| readable(&mut p, "ROLLOUT_IMAGE", i))
        }
        _ => image.clone(),
    };
    let trainer_image = match env.get("TRAINER_IMAGE") {
        Some(s) if containerised => {
            absolute(&mut p, "TRAINER_IMAGE", s).inspect(|i| readable(&mut p, "TRAINER_IMAGE", i))
        }
        _ => image.clone(),
    };
    let mut mounts = |name: &str, what: &str| {
        if containerised {
            required(&mut p, env, name, what)
                .filter(|m| printable(&mut p, name, m))
                .map(String::from)
        } else {
            None
        }
    };
    let controller_mounts = mounts(
        "AREAL_CONTROLLER_MOUNTS",
        "the --bind list of the controller's container",
    );
    let worker_mounts = mounts(
        "AREAL_WORKER_MOUNTS",
        "the --bind list of the workers' containers",
    );

    let model = required(&mut p, env, "MODEL_PATH", "the policy's model directory")
        .and_then(|s| absolute(&mut p, "MODEL_PATH", s));
    if let Some(m) = &model
        && std::fs::read_dir(m).is_err()
    {
        p.push(format!(
            "MODEL_PATH is not a readable directory: '{}'",
            m.display()
        ));
    }
    let fileroot = required(
        &mut p,
        env,
        "AREAL_FILEROOT",
        "the shared directory for run outputs",
    )
    .and_then(|s| absolute(&mut p, "AREAL_FILEROOT", s));
    let fileroot = fileroot.filter(|f| directive_safe(&mut p, "AREAL_FILEROOT", f));
    let credentials = required(
        &mut p,
        env,
        "ARENA_CREDENTIALS_FILE",
        "the file that exports ARENA_OPENAPI_BASE, ARENA_OPENAPI_TOKEN, ARENA_LLM_API_KEY and SWE_RL_ADMIN_API_KEY",
    )
    .and_then(|s| absolute(&mut p, "ARENA_CREDENTIALS_FILE", s));
    if let Some(c) = &credentials {
        readable_file(&mut p, "ARENA_CREDENTIALS_FILE", c);
    }

    let bin = match env.get("ARENA_RL_BIN") {
        Some(b) => absolute(&mut p, "ARENA_RL_BIN", b),
        None => under_checkout("target/release/arena-rl"),
    };
    if let Some(b) = &bin
        && areal_dir.is_some()
        && !is_executable(b)
    {
        let features = if profile.default_gpus_per_node() == 0 {
            ""
        } else {
            " --features cuda"
        };
        p.push(format!(
            "ARENA_RL_BIN is not an executable file: '{}' (build it with `cargo build --release -p arena-rl{features}`)",
            b.display()
        ));
    }

    let trial = match env.get("TRIAL_NAME") {
        Some(t) => t.to_string(),
        None => format!("arena-{}-{}", ctx.timestamp, ctx.pid),
    };
    if !trial_name_ok(&trial) {
        p.push(format!(
            "TRIAL_NAME may only contain letters, digits, '.', '_' and '-', start with a letter or digit, and be at most 128 characters, got '{trial}'"
        ));
    }

    let worker_time = slurm_time(&mut p, env, "SBATCH_TIMELIMIT", "01:00:00");
    let controller_time = slurm_time(&mut p, env, "ARENA_CONTROLLER_TIME", "01:30:00");
    let mut site = |name: &str| {
        let v = env.get(name)?;
        if v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.,:+-".contains(&b))
        {
            Some(v.to_string())
        } else {
            p.push(format!(
                "{name} may only contain letters, digits and '_.,:+-', got '{v}'"
            ));
            None
        }
    };
    let partition = site("SBATCH_PARTITION");
    let account = site("SBATCH_ACCOUNT");
    let reservation = site("SBATCH_RESERVATION");

    let min_tasks = int_var(
        &mut p,
        env,
        "ARENA_PREFLIGHT_MIN_TASKS",
        1,
        0..=u64::MAX,
        "a non-negative integer",
    );
    let stream_id = env
        .get("ARENA_STREAM_ID")
        .filter(|s| printable(&mut p, "ARENA_STREAM_ID", s))
        .map(String::from);
    let openapi_base = env.get("ARENA_OPENAPI_BASE").and_then(|u| {
        let rest = u
            .strip_prefix("http://")
            .or_else(|| u.strip_prefix("https://"));
        match rest {
            None => {
                // The value is not echoed: a malformed URL may still hold a credential.
                p.push("ARENA_OPENAPI_BASE must be an http:// or https:// URL");
                None
            }
            Some(rest) if rest.split(['/', '?', '#']).next().unwrap_or("").contains('@') => {
                p.push(
                    "ARENA_OPENAPI_BASE must not carry credentials (user:password@host); put them in the credentials file",
                );
                None
            }
            Some(_) => printable(&mut p, "ARENA_OPENAPI_BASE", u).then(|| u.to_string()),
        }
    });
    let policy_port = int_var(
        &mut p,
        env,
        "ARENA_POLICY_PORT",
        30000_u16,
        1024..=65535,
        "a port from 1024 to 65535",
    );
    if let (Some(port), Some(pl)) = (policy_port, &placement)
        && u32::from(port) + pl.replicas_per_node > 65536
    {
        p.push(format!(
            "ARENA_POLICY_PORT={port} leaves no room for {} policy servers per node",
            pl.replicas_per_node
        ));
    }

    // A launcher that nothing would run is a mistake in the submission, not a setting to ignore.
    if let (Some(v), Some(pl)) = (env.get("SGLANG_LAUNCHER"), &placement)
        && !matches!(pl.serving, Serving::Sglang { .. })
    {
        let what = match pl.serving {
            Serving::Burn => "arena-rl serve-policy replicas (a burn: layout)",
            _ => "the policy in the trainer's process (in-process)",
        };
        p.push(format!(
            "SGLANG_LAUNCHER is set ('{v}'), but the rollout layout starts no SGLang server: it runs {what}; unset SGLANG_LAUNCHER or set ROLLOUT_LAYOUT=sglang:dDtTpP"
        ));
    }
    let sglang_launcher = match env.get("SGLANG_LAUNCHER") {
        Some(v) => {
            let words: Vec<String> = v.split_ascii_whitespace().map(String::from).collect();
            if words.is_empty() || !words.iter().all(|w| word(w)) {
                p.push(format!(
                    "SGLANG_LAUNCHER must be a command and its arguments separated by spaces, without quotes or shell characters, got '{v}'"
                ));
                None
            } else {
                Some(words)
            }
        }
        None => areal_dir.as_ref().map(|d| {
            vec![
                "python3".to_string(),
                d.join("xtask/sglang/launch.py").display().to_string(),
            ]
        }),
    };

    let trainer_port = int_var(
        &mut p,
        env,
        "ARENA_RL_TRAINER_PORT",
        29510_u16,
        1024..=65535,
        "a port from 1024 to 65535",
    );
    let rdzv_port = int_var(
        &mut p,
        env,
        "ARENA_RL_RDZV_PORT",
        29400_u16,
        1024..=65535,
        "a port from 1024 to 65535",
    );
    if let (Some(t), Some(r)) = (trainer_port, rdzv_port)
        && t == r
    {
        p.push(format!(
            "ARENA_RL_TRAINER_PORT and ARENA_RL_RDZV_PORT must differ, both are {t}"
        ));
    }

    let supervise_interval = int_var(
        &mut p,
        env,
        "ARENA_SUPERVISE_INTERVAL",
        30_u32,
        1..=3600,
        "a number of seconds from 1 to 3600",
    );

    let dataset_config = if profile == Profile::FlashV3 {
        let path = match env.get("DATASET_CONFIG") {
            Some(d) => plain(&mut p, "DATASET_CONFIG", d)
                .and_then(|_| under_checkout(d).or_else(|| Some(PathBuf::from(d)))),
            None => under_checkout("examples/configs/flash_v3_streams.yaml"),
        };
        if let Some(d) = &path
            && areal_dir.is_some()
        {
            readable_file(&mut p, "DATASET_CONFIG", d);
        }
        path
    } else {
        None
    };

    for o in overrides {
        check_override(&mut p, o);
    }

    if p.len() > 0 {
        return Err(p);
    }
    let fileroot = fileroot.expect("checked above");
    let submission_dir = fileroot.join("submissions").join(&trial);
    // The schema's defaults until `apply_config` reads the run config.
    let mut defaults = stream_config::RunConfig::default();
    defaults.cluster.fileroot = fileroot.display().to_string();
    defaults.trial_name.clone_from(&trial);
    let run = RunFacts::of(&defaults);
    Ok(Launch {
        profile,
        mode,
        knobs: knobs.expect("checked above"),
        placement: placement.expect("checked above"),
        trial,
        areal_dir: areal_dir.expect("checked above"),
        config: config.expect("checked above"),
        container_bin: container_bin.to_string(),
        image,
        rollout_image,
        trainer_image,
        controller_mounts,
        worker_mounts,
        model: model.expect("checked above"),
        fileroot,
        credentials: credentials.expect("checked above"),
        bin: bin.expect("checked above"),
        submission_dir,
        dataset_config,
        worker_time: worker_time.expect("checked above"),
        controller_time: controller_time.expect("checked above"),
        partition,
        account,
        reservation,
        min_tasks: min_tasks.expect("checked above"),
        stream_id,
        openapi_base,
        policy_port: policy_port.expect("checked above"),
        sglang_launcher: sglang_launcher.expect("checked above"),
        trainer_port: trainer_port.expect("checked above"),
        rdzv_port: rdzv_port.expect("checked above"),
        run,
        supervise_interval: supervise_interval.expect("checked above"),
        overrides: overrides.to_vec(),
        run_defaults: Vec::new(),
        rollout_only: None,
        eval: None,
        host: ctx.host.clone(),
        timestamp: ctx.timestamp.clone(),
    })
}

/// An integer variable: unset gives `default`; set, it must be decimal digits within `range`, else the problem
/// is "NAME must be WHAT, got 'VALUE'".
pub(crate) fn int_var<T: std::str::FromStr + PartialOrd>(
    p: &mut Problems,
    env: &Env,
    name: &str,
    default: T,
    range: std::ops::RangeInclusive<T>,
    what: &str,
) -> Option<T> {
    let Some(s) = env.get(name) else {
        return Some(default);
    };
    match s.parse::<T>() {
        Ok(n) if s.bytes().all(|b| b.is_ascii_digit()) && range.contains(&n) => Some(n),
        _ => {
            p.push(format!("{name} must be {what}, got '{s}'"));
            None
        }
    }
}

fn required<'e>(p: &mut Problems, env: &'e Env, name: &str, what: &str) -> Option<&'e str> {
    let v = env.get(name);
    if v.is_none() {
        p.push(format!("{name} is required ({what})"));
    }
    v
}

/// Values are rendered into scripts: control characters (newlines above all) are refused everywhere.
fn printable(p: &mut Problems, name: &str, value: &str) -> bool {
    let ok = !value.chars().any(char::is_control);
    if !ok {
        p.push(format!("{name} must not contain control characters"));
    }
    ok
}

fn plain<'v>(p: &mut Problems, name: &str, value: &'v str) -> Option<&'v str> {
    printable(p, name, value).then_some(value)
}

fn absolute(p: &mut Problems, name: &str, value: &str) -> Option<PathBuf> {
    let value = plain(p, name, value)?;
    if value.starts_with('/') {
        Some(PathBuf::from(value))
    } else {
        p.push(format!("{name} must be an absolute shared path, got '{value}'"));
        None
    }
}

/// Paths that appear in `#SBATCH` directives, which sbatch splits at whitespace.
fn directive_safe(p: &mut Problems, name: &str, path: &Path) -> bool {
    let bad = path
        .to_string_lossy()
        .chars()
        .any(|c| c.is_whitespace() || c == '"' || c == '\'');
    if bad {
        p.push(format!(
            "{name} must not contain whitespace or quotes (it appears in #SBATCH directives), got '{}'",
            path.display()
        ));
    }
    !bad
}

fn readable_file(p: &mut Problems, name: &str, path: &Path) {
    if !(path.is_file() && std::fs::File::open(path).is_ok()) {
        p.push(format!("{name} is not a readable file: '{}'", path.display()));
    }
}

/// A container image may be a file (SIF) or a directory (a sandbox).
fn readable(p: &mut Problems, name: &str, path: &Path) {
    let ok = if path.is_dir() {
        std::fs::read_dir(path).is_ok()
    } else {
        std::fs::File::open(path).is_ok()
    };
    if !ok {
        p.push(format!("{name} is not readable: '{}'", path.display()));
    }
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn word(s: &str) -> bool {
    !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c.is_control() || "'\"`$\\;&|<>(){}".contains(c))
}

pub(crate) fn trial_name_ok(t: &str) -> bool {
    t.len() <= 128
        && t.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
}

/// Slurm's time formats: `M`, `M:S`, `H:M:S`, `D-H`, `D-H:M`, `D-H:M:S`, or `INFINITE` / `UNLIMITED`.
fn slurm_time(p: &mut Problems, env: &Env, name: &str, default: &str) -> Option<String> {
    let v = env.get(name).unwrap_or(default);
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let clock = |s: &str, max: usize| {
        let parts: Vec<&str> = s.split(':').collect();
        parts.len() <= max && parts.iter().all(|x| digits(x))
    };
    let ok = matches!(v, "INFINITE" | "UNLIMITED" | "infinite" | "unlimited")
        || match v.split_once('-') {
            Some((days, rest)) => digits(days) && clock(rest, 3),
            None => clock(v, 3),
        };
    if ok {
        Some(v.to_string())
    } else {
        p.push(format!(
            "{name} must be a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS), got '{v}'"
        ));
        None
    }
}

/// Keys that choose the Streams: the preflight projects them from the config file and would not see an override.
const STREAM_KEYS: [&str; 4] = [
    "econfig.arena_streams",
    "econfig.arena_streams_file",
    "econfig.arena_streams_yaml_b64",
    "econfig.stream_id",
];

/// Keys the profile sets from the job's allocation (`N_NODES`, `N_GPUS_PER_NODE`); an override would make the
/// run believe in nodes or GPUs the job does not have.
const PLACEMENT_KEYS: [&str; 2] = ["cluster.n_nodes", "cluster.n_gpus_per_node"];

/// Keys the profile sets from its actor layout (`ACTOR_LAYOUT`): the backend, and where and how many FSDP2
/// ranks run, which the GPU job starts itself.
const ACTOR_KEYS: [&str; 3] = [
    "actor.backend",
    "actor.fsdp2.attach",
    "actor.fsdp2.nproc_per_node",
];

/// A user override: `dotted.key=value`, never a credential (those come from the credentials file only).
fn check_override(p: &mut Problems, o: &str) {
    let Some((key, value)) = o.split_once('=') else {
        p.push(format!("override '{o}' must have the form dotted.key=value"));
        return;
    };
    let key_ok = !key.is_empty()
        && key
            .split('.')
            .all(|seg| !seg.is_empty() && seg.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'));
    if !key_ok {
        p.push(format!(
            "override '{key}' is not a dotted key of letters, digits and '_'"
        ));
    } else if stream_config::is_sensitive_key(key.rsplit('.').next().unwrap_or(key)) {
        // The value is not echoed.
        p.push(format!(
            "override '{key}' looks like a credential; put credentials in ARENA_CREDENTIALS_FILE, never on a command line"
        ));
    } else if STREAM_KEYS.contains(&key) {
        p.push(format!(
            "override '{key}' changes the Streams, which the controller's preflight reads from the config file: edit the config (or, for flash-v3, set DATASET_CONFIG) instead"
        ));
    } else if PLACEMENT_KEYS.contains(&key) {
        p.push(format!(
            "override '{key}' would contradict the job's allocation, which the profile sets from N_NODES and N_GPUS_PER_NODE: set those instead"
        ));
    } else if ACTOR_KEYS.contains(&key) {
        p.push(format!(
            "override '{key}' would contradict the actor layout the GPU job starts: set ACTOR_LAYOUT (burn or fsdp2:dN) instead"
        ));
    } else if value.chars().any(char::is_control) {
        p.push(format!("override '{key}' must not contain control characters"));
    }
}
