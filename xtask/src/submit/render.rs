//! Renders the two batch scripts of a submission from a validated [`Launch`]: `controller.sbatch` (CPU only:
//! preflight, then submit and supervise the GPU job) and `train.sbatch` (the GPU job: `arena-rl` roles placed
//! with `srun`).
//!
//! The templates under `templates/` are plain bash with `{{name}}` placeholders. A placeholder alone on a line
//! is a block: it is replaced by zero or more whole lines. Every value is single-quoted for the shell, and no
//! credential is ever a value: the scripts carry only the credentials file's path.

use std::fmt::Write as _;

use super::Mode;
use super::profile::{ActorLayout, Placement, Profile, Serving};
use super::validate::Launch;

const CONTROLLER: &str = include_str!("templates/controller.sh");
const TRAIN: &str = include_str!("templates/train.sh");

/// The file names of the rendered scripts inside the submission directory.
pub(crate) const CONTROLLER_FILE: &str = "controller.sbatch";
pub(crate) const TRAIN_FILE: &str = "train.sbatch";

/// The two rendered scripts.
#[derive(Debug, Clone)]
pub(crate) struct Scripts {
    pub(crate) controller: String,
    pub(crate) train: String,
}

pub(crate) fn render(l: &Launch) -> Scripts {
    let common = common(l);
    let mut controller_vars = common.clone();
    controller_vars.extend([
        ("controller_resources", controller_resources(l.profile)),
        ("controller_time", l.controller_time.clone()),
        (
            "check_note",
            match l.mode {
                Mode::CheckArena => ", --check-arena: preflight only".into(),
                Mode::Submit if l.eval.is_some() => ", --eval: the GPU job evaluates a checkpoint".into(),
                Mode::Submit => String::new(),
            },
        ),
        ("preflight", preflight(l)),
    ]);
    let mut train_vars = common;
    train_vars.extend([
        ("job_nodes", l.placement.job_nodes().to_string()),
        ("train_resources", train_resources(l)),
        ("worker_time", l.worker_time.clone()),
        ("gpus_per_node", l.placement.gpus_per_node.to_string()),
        ("replicas_per_node", l.placement.replicas_per_node.to_string()),
        ("tasks_per_node", l.placement.replicas_per_node.max(1).to_string()),
        ("placement", placement(l)),
        ("gpus_per_replica", l.placement.gpus_per_replica.to_string()),
        ("trainer_nodes", l.placement.trainer_nodes.to_string()),
        ("trainer_ranks_per_node", worker_ranks(l).unwrap_or(0).to_string()),
        ("worker_ready_seconds", l.run.worker_ready_seconds.to_string()),
        ("policy_server_exec", policy_server_exec(l)),
        ("train_args", train_args(l)),
        (
            "run_command",
            if l.eval.is_some() {
                "eval"
            } else if l.rollout_only.is_some() {
                "rollout"
            } else {
                "train"
            }
            .into(),
        ),
    ]);
    Scripts {
        controller: fill(CONTROLLER, &controller_vars),
        train: fill(TRAIN, &train_vars),
    }
}

/// The dotted overrides the profile passes to `arena-rl train`, before the user's.
///
/// Every key is one the run-config schema has (a test loads them); docs/slurm.md lists what each knob sets.
/// `context` has no key of its own: the policy's context window is its model's, so the knob sets what the
/// reference derives from it, the trainer's micro-batch budget (`ACTOR_MAX_TOKENS_PER_MB = CONTEXT_LENGTH`).
/// `max_tokens` bounds prompt and output together; the one part of that bound a key can carry is that no
/// output is longer than `max_tokens`, so it caps the run's default output budget.
pub(crate) fn profile_overrides(l: &Launch) -> Vec<String> {
    let k = &l.knobs;
    let mut o = vec![
        format!("trial_name={}", l.trial),
        format!("cluster.fileroot={}", l.fileroot.display()),
        format!("cluster.n_nodes={}", l.placement.job_nodes()),
        format!("cluster.n_gpus_per_node={}", l.placement.gpus_per_node),
        format!("train_dataset.batch_size={}", k.batch),
        format!("gconfig.n_samples={}", k.samples),
        format!("gconfig.max_new_tokens={}", k.max_new_tokens.min(k.max_tokens)),
        format!("actor.total_train_steps={}", steps(l)),
        format!("actor.max_tokens_per_mb={}", k.context),
        format!("rollout.max_concurrent_rollouts={}", k.concurrency),
        // Every interface: the run advertises the address of the one that routes to Arena (docs/slurm.md).
        "proxy.host=0.0.0.0".to_string(),
    ];
    if l.eval.is_some() {
        o.extend(eval_device_overrides(&l.placement));
    } else {
        o.extend(device_overrides(&l.placement));
        if l.placement.serve_nodes > 0 && l.placement.gpus_per_node > 0 {
            o.push(format!(
                "rollout.policy_server_ready_timeout_seconds={GPU_POLICY_READY_SECONDS}"
            ));
        }
    }
    if let Some(ranks) = worker_ranks(l) {
        // The loop attaches to the worker the job starts (`actor.fsdp2.attach`, set when the job runs).
        o.push("actor.backend=fsdp2".to_string());
        o.push(format!("actor.fsdp2.nproc_per_node={ranks}"));
        if l.placement.gpus_per_node > 0 {
            // FSDP2's GPU precision (bf16 parameters and activations, f32 master weights and reduction) and
            // activation checkpointing, as the fit check assumes.
            o.push("actor.bf16_autocast=true".to_string());
            o.push("actor.recompute_layers=true".to_string());
        }
    }
    if let Some(d) = &l.dataset_config {
        o.push(format!("econfig.arena_streams_file={}", d.display()));
    }
    o.extend(super::defaults::set_overrides(l));
    o.extend(l.run_defaults.iter().map(|c| c.arg.clone()));
    o
}

/// The FSDP2 worker's ranks on each trainer node, when the job starts one: an `fsdp2:` actor that trains
/// (`--rollout-only` and `--eval` train nothing, so they start no worker).
pub(crate) fn worker_ranks(l: &Launch) -> Option<u32> {
    match l.placement.actor {
        ActorLayout::Fsdp2 { .. } if l.trains() => Some(l.placement.trainer_ranks_per_node),
        _ => None,
    }
}

/// Training steps, or with `--rollout-only N` the steps of `batch` x `samples` rollouts that make at least N.
pub(crate) fn steps(l: &Launch) -> u64 {
    match l.rollout_only {
        Some(n) => n.div_ceil((l.knobs.batch * l.knobs.samples).max(1)),
        None => l.knobs.steps,
    }
}

/// Where the trainer and the in-process policy compute: on a GPU node the trainer takes the first GPU, and an
/// in-process policy (no policy servers) the second when there is one, with bf16 weight matrices (the dtype
/// checkpoints ship in); without GPUs both stay on the CPU in f32.
pub(crate) fn device_overrides(p: &Placement) -> Vec<String> {
    if p.gpus_per_node == 0 {
        return Vec::new();
    }
    // burn trains on the first GPU; the FSDP2 worker on every GPU of its ranks.
    let actor = match p.actor {
        ActorLayout::Burn => "actor.device=cuda:0",
        ActorLayout::Fsdp2 { .. } => "actor.device=cuda",
    };
    let mut o = vec![actor.to_string()];
    if p.serve_nodes == 0 {
        let policy = u32::from(p.gpus_per_node >= 2);
        o.push(format!("model.device=cuda:{policy}"));
        o.push("model.dtype=bf16".to_string());
    }
    o
}

/// Where `arena-rl eval` runs the checkpoint: nothing trains, so on the node's first GPU in bf16; on the CPU
/// in f32 without GPUs.
fn eval_device_overrides(p: &Placement) -> Vec<String> {
    if p.gpus_per_node == 0 {
        return Vec::new();
    }
    vec!["model.device=cuda:0".to_string(), "model.dtype=bf16".to_string()]
}

/// How long the trainer waits for every policy server's `/health` on GPU nodes (the schema's 300 s is sized
/// for the CPU): a 32B model in bf16 is 64 GB to read from a shared filesystem, at a few hundred MB/s per node
/// when every replica reads at once (several minutes), then SGLang initialises NCCL over its tensor-parallel
/// ranks, captures CUDA graphs for each decode batch size (one to a few minutes) and runs a warm-up request.
/// 30 minutes covers that with room for a slow filesystem; a server that dies fails the job at once, so the
/// wait only bounds a server that hangs. `rollout.policy_server_ready_timeout_seconds=N` overrides it.
pub(crate) const GPU_POLICY_READY_SECONDS: u32 = 1800;

/// The command of the policy-server step, after its replica's port and GPUs are chosen: an SGLang server
/// through `SGLANG_LAUNCHER`, or `arena-rl serve-policy` for `burn:` layouts. Neither is given the API key:
/// both read `ARENA_RL_POLICY_API_KEY` from the environment.
fn policy_server_exec(l: &Launch) -> String {
    let p = &l.placement;
    let indent = "            ";
    let lines: Vec<String> = match p.serving {
        Serving::Sglang { tp, pp } => {
            let (device, dtype) = if p.gpus_per_replica > 0 {
                ("cuda", "bfloat16")
            } else {
                ("cpu", "float32")
            };
            let launcher: Vec<String> = l.sglang_launcher.iter().map(|w| quote(w)).collect();
            vec![
                "# SGLang returns tempered log-probabilities, which the proxy records, unless this is set."
                    .into(),
                "unset SGLANG_RETURN_ORIGINAL_LOGPROB".into(),
                format!(
                    "exec {} --model-path \"$MODEL_PATH\" --host 0.0.0.0 \\",
                    launcher.join(" ")
                ),
                format!(
                    "    --port \"$((ARENA_POLICY_PORT + local_id))\" --tp-size {tp} --pp-size {pp} --context-length {} \\",
                    l.knobs.context
                ),
                format!("    --device {device} --dtype {dtype}"),
            ]
        }
        Serving::Burn | Serving::InProcess => {
            let (device, dtype) = if p.gpus_per_replica > 0 {
                ("cuda", "bf16")
            } else {
                ("cpu", "f32")
            };
            vec![
                "exec \"$ARENA_RL_BIN\" serve-policy --model \"$MODEL_PATH\" --host 0.0.0.0 \\".into(),
                format!("    --port \"$((ARENA_POLICY_PORT + local_id))\" --device {device} \\"),
                format!("    --dtype {dtype} --weights-root \"$AREAL_FILEROOT\""),
            ]
        }
    };
    lines
        .iter()
        .map(|line| format!("{indent}{line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

fn common(l: &Launch) -> Vec<(&'static str, String)> {
    vec![
        ("trial", l.trial.clone()),
        ("profile", l.profile.name().into()),
        ("areal_dir", l.areal_dir.display().to_string()),
        ("submission_dir", l.submission_dir.display().to_string()),
        ("site_directives", site_directives(l)),
        ("host", l.host.clone()),
        ("timestamp", l.timestamp.clone()),
        ("launch_values", launch_values(l)),
    ]
}

/// The variables both scripts export before anything else (and again after sourcing the credentials file).
pub(crate) fn launch_env(l: &Launch) -> Vec<(&'static str, String)> {
    let path = |p: &std::path::Path| Some(p.display().to_string());
    let fsdp2 = worker_ranks(l).is_some();
    let values: Vec<(&'static str, Option<String>)> = vec![
        ("AREAL_DIR", path(&l.areal_dir)),
        ("CONFIG_PATH", path(&l.config)),
        ("AREAL_CONTAINER_BIN", Some(l.container_bin.clone())),
        ("AREAL_IMAGE", l.image.as_deref().and_then(path)),
        ("ROLLOUT_IMAGE", l.rollout_image.as_deref().and_then(path)),
        ("AREAL_CONTROLLER_MOUNTS", l.controller_mounts.clone()),
        ("AREAL_WORKER_MOUNTS", l.worker_mounts.clone()),
        ("MODEL_PATH", path(&l.model)),
        ("AREAL_FILEROOT", path(&l.fileroot)),
        ("ARENA_CREDENTIALS_FILE", path(&l.credentials)),
        ("ARENA_RL_BIN", path(&l.bin)),
        ("TRIAL_NAME", Some(l.trial.clone())),
        ("ARENA_SUBMISSION_DIR", path(&l.submission_dir)),
        (
            "ARENA_CHECK_ONLY",
            Some(match l.mode {
                Mode::CheckArena => "--check-arena".into(),
                Mode::Submit => String::new(),
            }),
        ),
        ("ARENA_STREAM_ID", l.stream_id.clone()),
        ("ARENA_OPENAPI_BASE", l.openapi_base.clone()),
        ("ARENA_PREFLIGHT_MIN_TASKS", Some(l.min_tasks.to_string())),
        ("SBATCH_TIMELIMIT", Some(l.worker_time.clone())),
        ("DATASET_CONFIG", l.dataset_config.as_deref().and_then(path)),
        ("ARENA_POLICY_PORT", Some(l.policy_port.to_string())),
        (
            "TRAINER_IMAGE",
            fsdp2.then(|| l.trainer_image.as_deref().and_then(path)).flatten(),
        ),
        ("ARENA_RL_TRAINER_PORT", fsdp2.then(|| l.trainer_port.to_string())),
        ("ARENA_RL_RDZV_PORT", fsdp2.then(|| l.rdzv_port.to_string())),
        (
            "ARENA_RL_TRAINER_PYTHON",
            fsdp2.then(|| l.run.worker_python.clone()),
        ),
        (
            "ARENA_RUN_DIR",
            fsdp2.then(|| l.run.run_dir.display().to_string()),
        ),
        ("ARENA_SUPERVISE_INTERVAL", Some(l.supervise_interval.to_string())),
        ("SLURM_EXPORT_ENV", Some("ALL".into())),
    ];
    values
        .into_iter()
        .filter_map(|(name, value)| Some((name, value?)))
        .collect()
}

fn launch_values(l: &Launch) -> String {
    let mut out = String::new();
    for (name, value) in launch_env(l) {
        let _ = writeln!(out, "    export {name}={}", quote(&value));
    }
    out.trim_end().to_string()
}

fn controller_resources(profile: Profile) -> String {
    if profile.small_controller() {
        "#SBATCH --cpus-per-task=1\n#SBATCH --mem=2G".into()
    } else {
        "#SBATCH --cpus-per-task=4\n#SBATCH --mem=16G\n#SBATCH --gres=gpu:0".into()
    }
}

/// A GPU job takes its nodes whole (`--exclusive`, all their memory with `--mem=0`): the trainer's node runs the
/// loop, the proxy and tokenisation for every session in flight, and a shared node would give it what is left.
/// A CPU-only job (`local`) shares its node with the controller, so it asks for nothing more than its task.
fn train_resources(l: &Launch) -> String {
    match l.placement.gpus_per_node {
        0 => String::new(),
        g => format!("#SBATCH --gres=gpu:{g}\n#SBATCH --exclusive\n#SBATCH --mem=0"),
    }
}

fn placement(l: &Launch) -> String {
    let p = &l.placement;
    if l.eval.is_some() {
        let devices = eval_device_overrides(p).join(", ");
        let devices = if devices.is_empty() {
            "on the CPU".to_string()
        } else {
            devices
        };
        return format!(
            "# Placement (--eval): one node runs `arena-rl eval`, which serves the checkpoint in its own process\n\
             # ({devices}); nothing trains, no policy servers, no FSDP2 worker."
        );
    }
    let devices = device_overrides(p).join(", ");
    let devices = if devices.is_empty() {
        "everything on the CPU".to_string()
    } else {
        devices
    };
    let plural = |n: u32, one: &str, many: &str| {
        if n == 1 {
            format!("{n} {one}")
        } else {
            format!("{n} {many}")
        }
    };
    let worker = worker_ranks(l).map(|ranks| {
        format!(
            "\n# The FSDP2 worker (actor {}): torchrun on the first {}, {} each ({}); the loop attaches to\n\
             # its rank 0.",
            p.actor_name(),
            plural(p.trainer_nodes, "node", "nodes"),
            plural(ranks, "rank", "ranks"),
            if p.gpus_per_node == 0 {
                "CPU processes over gloo, in f32"
            } else {
                "one a GPU"
            },
        )
    });
    let trainer = if worker.is_some() {
        "the loop and the rollout proxy"
    } else {
        "the loop, the rollout proxy and the trainer"
    };
    let worker = worker.unwrap_or_default();
    if p.serve_nodes == 0 {
        return format!(
            "# Placement: one node runs `arena-rl train`: {trainer}, with\n\
             # the policy served in-process ({devices}).{worker}"
        );
    }
    let servers = match p.serving {
        Serving::Sglang { tp, pp } => plural(
            p.replicas_per_node,
            &format!("SGLang server (tp {tp}, pp {pp})"),
            &format!("SGLang servers (tp {tp}, pp {pp})"),
        ),
        Serving::Burn | Serving::InProcess => plural(
            p.replicas_per_node,
            "`arena-rl serve-policy` replica",
            "`arena-rl serve-policy` replicas",
        ),
    };
    let each = if p.gpus_per_replica == 0 {
        "on the CPU".to_string()
    } else {
        format!("of {} each", plural(p.gpus_per_replica, "GPU", "GPUs"))
    };
    format!(
        "# Placement: the first node runs `arena-rl train` ({trainer}); the\n\
         # {} {} each run {servers} {each} (docs/slurm.md); {devices}.{worker}",
        if p.trainer_nodes == 1 { "other" } else { "last" },
        plural(p.serve_nodes, "node", "nodes"),
    )
}

fn site_directives(l: &Launch) -> String {
    [
        ("partition", &l.partition),
        ("account", &l.account),
        ("reservation", &l.reservation),
    ]
    .into_iter()
    .filter_map(|(flag, v)| v.as_ref().map(|v| format!("#SBATCH --{flag}={v}")))
    .collect::<Vec<_>>()
    .join("\n")
}

fn preflight(l: &Launch) -> String {
    let tail = "--base-url \"$ARENA_OPENAPI_BASE\" \\\n        \
                --min-terminal-tasks \"$ARENA_PREFLIGHT_MIN_TASKS\" --output \"$ARENA_SUBMISSION_DIR/preflight.json\"";
    if l.dataset_config.is_some() {
        format!("    \"$ARENA_RL_BIN\" preflight --streams-file \"$DATASET_CONFIG\" {tail}")
    } else {
        format!(
            "    ARENA_STREAMS_B64=\"$(\"$ARENA_RL_BIN\" streams project \"$CONFIG_PATH\")\"\n    \
             export ARENA_STREAMS_B64\n    \
             \"$ARENA_RL_BIN\" preflight --streams-env-b64 ARENA_STREAMS_B64 {tail}"
        )
    }
}

/// The arguments of `arena-rl train` (or `rollout`, `eval`) after `--config`: `--eval`'s flags, the profile's
/// overrides, the policy servers, then the user's overrides (later ones win).
fn train_args(l: &Launch) -> String {
    let mut args: Vec<String> = match &l.eval {
        Some(e) => e.args(&l.run.run_dir),
        None => Vec::new(),
    };
    args.extend(profile_overrides(l).iter().map(|o| quote(o)));
    args.push("\"rollout.policy_servers=[$ARENA_POLICY_SERVERS]\"".into());
    if worker_ranks(l).is_some() {
        args.push("\"actor.fsdp2.attach=$ARENA_TRAINER_ATTACH\"".into());
    }
    args.extend(l.overrides.iter().map(|o| quote(o)));
    let indent = "                ";
    args.iter()
        .map(|a| format!("{indent}{a}"))
        .collect::<Vec<_>>()
        .join(" \\\n")
}

/// Quotes a value for bash: single quotes, with `'` written as `'\''`.
pub(crate) fn quote(s: &str) -> String {
    if !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_-./:=@,+%".contains(&b))
    {
        return s.to_string();
    }
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Replaces `{{name}}` placeholders in one pass (values are never scanned for placeholders); a placeholder
/// alone on a line is replaced with its lines, or removed with its line when empty.
fn fill(template: &str, vars: &[(&str, String)]) -> String {
    let lookup = |name: &str| {
        vars.iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
            .unwrap_or_else(|| panic!("the template placeholder {{{{{name}}}}} has no value"))
    };
    let mut out = String::with_capacity(template.len() * 2);
    for line in template.lines() {
        if let Some(name) = line.strip_prefix("{{").and_then(|l| l.strip_suffix("}}"))
            && !name.contains('}')
        {
            let value = lookup(name);
            if !value.is_empty() {
                out.push_str(value);
                out.push('\n');
            }
            continue;
        }
        let mut rest = line;
        while let Some(start) = rest.find("{{") {
            let end = rest[start..]
                .find("}}")
                .map(|e| start + e)
                .unwrap_or_else(|| panic!("unclosed placeholder in template line {line:?}"));
            out.push_str(&rest[..start]);
            out.push_str(lookup(&rest[start + 2..end]));
            rest = &rest[end + 2..];
        }
        out.push_str(rest);
        out.push('\n');
    }
    out
}
