//! `cargo xtask submit`: launches an arena-rl run on a Slurm cluster, with the environment contract of the
//! reference's `submit_arena.sh` and `submit_arena_flash_v3.sh` (docs/slurm.md).
//!
//! It validates the launch environment (every problem one line, exit status 2, before anything is written),
//! checks the run config with `stream-config`, renders the CPU-only controller and the GPU job into
//! `$AREAL_FILEROOT/submissions/$TRIAL_NAME/`, and submits the controller with `sbatch --parsable`.
//! Everything else (preflight, training, serving) is the `arena-rl` binary's, run by the scripts.
//! Credentials never pass through here: the scripts name the credentials file, and the jobs source it.

mod defaults;
mod env;
mod eval;
mod fit;
mod profile;
mod render;
mod validate;

#[cfg(test)]
mod tests;

use std::io::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};

pub(crate) use env::{Ctx, Env};
pub(crate) use profile::Profile;
pub(crate) use validate::{Launch, Problems};

/// `cargo xtask submit [--check-arena | --print-profile | --rollout-only N | --eval --checkpoint DIR ...]
/// [--profile local|grpo|flash-v3|multinode-cpu] [--dry-run] [overrides...]`
#[derive(Debug, clap::Args)]
pub(crate) struct SubmitArgs {
    /// Run only the controller's Arena preflight (writes preflight.json), not the training job.
    #[arg(long, conflicts_with = "print_profile")]
    check_arena: bool,
    /// Run the rollout-only loop (`arena-rl rollout`: scored rollouts written to rollouts.jsonl, no training) for
    /// at least ROLLOUTS rollouts, in steps of the profile's batch x samples, instead of training.
    #[arg(long, value_name = "ROLLOUTS", conflicts_with = "check_arena", value_parser = clap::value_parser!(u64).range(1..))]
    rollout_only: Option<u64>,
    /// Run `arena-rl eval` on --checkpoint instead of training: the checkpoint in the trainer node's process
    /// (no policy servers, no FSDP2 worker, no optimizer state), results under the run folder's `eval/`.
    #[arg(long, requires = "checkpoint", conflicts_with_all = ["check_arena", "rollout_only"])]
    eval: bool,
    /// With --eval: the checkpoint, a model folder or a folder of step-N checkpoints (the newest).
    #[arg(long, value_name = "DIR", requires = "eval")]
    checkpoint: Option<std::path::PathBuf>,
    /// With --eval: a second checkpoint to compare against (the same forms).
    #[arg(long, value_name = "DIR", requires = "eval")]
    baseline: Option<std::path::PathBuf>,
    /// With --eval: samples per task (`k` of pass@k), 1 by default.
    #[arg(long, value_name = "K", requires = "eval", value_parser = clap::value_parser!(u32).range(1..))]
    samples: Option<u32>,
    /// With --eval: the output folder (a rerun with the same folder resumes); `<run dir>/eval` by default.
    #[arg(long, value_name = "DIR", requires = "eval")]
    out: Option<std::path::PathBuf>,
    /// With --eval: a task manifest (a JSON list of `env:key@version` references, as `arena-rl eval` takes).
    #[arg(long, value_name = "FILE", requires = "eval", conflicts_with = "streams")]
    manifest: Option<std::path::PathBuf>,
    /// With --eval: evaluate every row of these Streams (comma-separated names).
    #[arg(long, value_name = "NAME,NAME", requires = "eval", value_delimiter = ',')]
    streams: Vec<String>,
    /// Print the profile's thirteen key=value lines and exit, touching nothing.
    #[arg(long, conflicts_with = "dry_run")]
    print_profile: bool,
    /// Launch profile; its config is examples/configs/<profile>.yaml unless CONFIG_PATH says otherwise.
    #[arg(long, value_enum, default_value = "grpo")]
    profile: Profile,
    /// Validate and print the controller script instead of writing and submitting anything.
    #[arg(long)]
    dry_run: bool,
    /// Dotted run-config overrides (`key=value`) for `arena-rl train`, after the profile's own.
    #[arg(value_name = "OVERRIDES")]
    overrides: Vec<String>,
}

/// Whether the controller goes on to training.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Submit,
    /// `--check-arena`: preflight only.
    CheckArena,
}

/// Sbatch input variables that would override the controller's own directives (sbatch lets the environment
/// beat `#SBATCH` lines); the reference passes those options on the command line, which beats both.
const CONTROLLER_SHADOWS: [&str; 5] = [
    "SBATCH_TIMELIMIT",
    "SBATCH_MEM_PER_NODE",
    "SBATCH_GRES",
    "SBATCH_EXPORT",
    "SBATCH_JOB_NAME",
];

pub(crate) fn run(args: SubmitArgs) -> Result<()> {
    let env = Env::from_process();
    if args.print_profile {
        match validate::profile_knobs(args.profile, &env) {
            Ok(knobs) => {
                for line in knobs.lines() {
                    println!("{line}");
                }
                return Ok(());
            }
            Err(problems) => fail(&problems),
        }
    }
    let mode = if args.check_arena {
        Mode::CheckArena
    } else {
        Mode::Submit
    };
    let ctx = Ctx::current()?;
    // The eval's paths are the user's, relative to where this runs (checked before AREAL_DIR is entered).
    let eval = if args.eval {
        let flags = eval::EvalFlags {
            checkpoint: args.checkpoint.clone(),
            baseline: args.baseline.clone(),
            samples: args.samples,
            out: args.out.clone(),
            manifest: args.manifest.clone(),
            streams: args.streams.clone(),
        };
        let cwd = std::env::current_dir().context("reading the current directory")?;
        match flags.check(&cwd) {
            Ok(job) => Some(job),
            Err(problems) => fail(&problems),
        }
    } else {
        None
    };
    let mut launch = match validate::validate(args.profile, mode, &args.overrides, &env, &ctx) {
        Ok(l) => l,
        Err(problems) => fail(&problems),
    };
    launch.rollout_only = args.rollout_only;
    launch.set_eval(eval);
    // As the reference does, relative paths in the config are read from the checkout.
    std::env::set_current_dir(&launch.areal_dir)
        .with_context(|| format!("entering AREAL_DIR {}", launch.areal_dir.display()))?;
    let config = match check_config(&launch, &env) {
        Ok(config) => config,
        Err(problems) => fail(&problems),
    };
    launch.apply_config(&config);
    // `--check-arena` and `--eval` train nothing, so the trainer's state need not fit.
    let parameters = if mode == Mode::Submit && launch.eval.is_none() {
        match fit::check(&launch, &config) {
            Ok(parameters) => Some(parameters),
            Err(problems) => fail(&problems),
        }
    } else {
        None
    };
    let config_env = config_env(&launch, &env);
    let user_sets = |key: &str| {
        // A config that loaded once loads again; were it not to, the user's value is assumed.
        stream_config::user_sets(&launch.config, &launch.overrides, &config_env, key).unwrap_or(true)
    };
    launch.run_defaults = defaults::resolve(&launch, &user_sets, parameters);
    for chosen in &launch.run_defaults {
        eprintln!(
            "xtask: {} ({}; set it in your config to choose another)",
            chosen.arg, chosen.why
        );
    }
    let scripts = render::render(&launch);
    if args.dry_run {
        print!("{}", scripts.controller);
        eprintln!(
            "xtask: dry run: nothing written or submitted (the scripts would go to {})",
            launch.submission_dir.display()
        );
        return Ok(());
    }
    let controller = write_scripts(&launch, &scripts)?;
    let job = sbatch(&controller, &env)?;
    println!("{job}");
    eprintln!(
        "xtask: submitted the controller of trial {} as job {job}; logs and preflight.json go to {}",
        launch.trial,
        launch.submission_dir.display()
    );
    Ok(())
}

/// Prints one line per problem and exits with status 2, as the reference's scripts do.
fn fail(problems: &Problems) -> ! {
    let mut err = std::io::stderr().lock();
    for line in problems.lines() {
        let _ = writeln!(err, "xtask submit: {line}");
    }
    std::process::exit(2)
}

/// Loads the run config the job will load (the profile's and the user's overrides, the launch environment and
/// the values the scripts export), so a broken config or override fails here rather than in the queue.
///
/// Returns the loaded config, which is the one `arena-rl train` will run with.
/// The environment the job's `arena-rl train` reads the config with: this one and the launch's variables.
fn config_env(l: &Launch, env: &Env) -> stream_config::Env {
    let mut vars: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    vars.extend(render::launch_env(l).into_iter().map(|(k, v)| (k.to_string(), v)));
    stream_config::Env::from_pairs(vars)
}

pub(crate) fn check_config(l: &Launch, env: &Env) -> Result<stream_config::RunConfig, Problems> {
    let config_env = config_env(l, env);
    let mut overrides = render::profile_overrides(l);
    overrides.extend(l.overrides.iter().cloned());
    match stream_config::load_run_config(&l.config, &overrides, &config_env) {
        Ok(config) => {
            let e = &config.econfig;
            let listed = !e.arena_streams.is_empty()
                || !e.arena_streams_file.trim().is_empty()
                || !e.arena_streams_yaml_b64.trim().is_empty();
            if config.actor.backend == stream_config::TrainerBackend::Fsdp2
                && l.placement.actor == profile::ActorLayout::Burn
            {
                let mut problems = Problems::default();
                problems.push(format!(
                    "CONFIG_PATH {} sets actor.backend: fsdp2, but the {} profile's actor is {}: set ACTOR_LAYOUT=fsdp2:dN (N ranks) to have the job start the FSDP2 worker",
                    l.config.display(),
                    l.profile.name(),
                    l.knobs.actor
                ));
                return Err(problems);
            }
            if l.stream_id.is_some() && listed {
                let mut problems = Problems::default();
                problems.push(format!(
                    "ARENA_STREAM_ID is set, but CONFIG_PATH {} lists its Streams (econfig.arena_streams, \
                     arena_streams_file or DATASET_CONFIG), so it would have no effect: unset it, or use a \
                     single-stream config (econfig.stream_id and econfig.arena_harness, no streams list)",
                    l.config.display()
                ));
                return Err(problems);
            }
            Ok(config)
        }
        Err(e) => {
            let mut problems = Problems::default();
            for p in e.problems() {
                problems.push(format!("CONFIG_PATH {}: {p}", l.config.display()));
            }
            Err(problems)
        }
    }
}

/// Writes both scripts into the submission directory and returns the controller's path.
pub(crate) fn write_scripts(l: &Launch, scripts: &render::Scripts) -> Result<std::path::PathBuf> {
    let dir = &l.submission_dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    for (name, text) in [
        (render::TRAIN_FILE, &scripts.train),
        (render::CONTROLLER_FILE, &scripts.controller),
    ] {
        write_executable(&dir.join(name), text)?;
    }
    Ok(dir.join(render::CONTROLLER_FILE))
}

fn write_executable(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
        .with_context(|| format!("making {} executable", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

/// The experiment trackers' credentials: like Arena's, they reach the jobs only through the credentials file.
/// The trackers' other settings (`WANDB_MODE`, `WANDB_DIR`, `WANDB_PROJECT`, `MLFLOW_TRACKING_URI`, ...) travel
/// by name in the job's environment (`--export=ALL`), never written into the rendered scripts.
const TRACKER_CREDENTIALS: [&str; 3] = [
    "WANDB_API_KEY",
    "MLFLOW_TRACKING_TOKEN",
    "MLFLOW_TRACKING_PASSWORD",
];

/// Submits the controller and returns its job id.
///
/// The child's environment drops the credentials, the trackers' too (only the credentials file carries them), the variables
/// that would shadow the controller's directives, and the `SLURM_*` settings of any allocation this runs in.
fn sbatch(controller: &Path, env: &Env) -> Result<String> {
    let mut cmd = Command::new("sbatch");
    cmd.arg("--parsable").arg(controller);
    for (name, _) in env.iter() {
        let shadow = CONTROLLER_SHADOWS.contains(&name)
            || validate::CREDENTIALS[1..].contains(&name)
            || TRACKER_CREDENTIALS.contains(&name)
            || (name.starts_with("SLURM_") && name != "SLURM_CONF");
        if shadow {
            cmd.env_remove(name);
        }
    }
    let out = cmd
        .output()
        .context("running sbatch (is the Slurm client installed and on PATH?)")?;
    if !out.status.success() {
        bail!(
            "sbatch --parsable {} failed ({}): {}",
            controller.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let id = stdout.trim().split(';').next().unwrap_or("").to_string();
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_digit()) {
        bail!("sbatch --parsable printed no job id: {:?}", stdout.trim());
    }
    Ok(id)
}
