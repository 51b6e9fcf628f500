//! Launch profiles: the reference's `grpo` smoke profile, the `flash-v3` profile with its node-count table and
//! token-length rules, `local` (one node, no GPU) and `multinode-cpu` (the `local` run with its policy served
//! by a `serve-policy` replica on a second node, no GPU).
//!
//! A profile fixes thirteen knobs (what `--print-profile` prints) and the placement of `arena-rl` roles on the GPU
//! job's nodes. The knobs reach the run config as dotted overrides on the `arena-rl train` command line.

use super::env::Env;
use super::validate::{Problems, int_var};

/// Which launch profile `cargo xtask submit` renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Profile {
    /// One node, no GPU: the quickstart-sized run, for tests and small sites.
    Local,
    /// The reference's two-node smoke profile (`arena_grpo.yaml`).
    Grpo,
    /// The reference's Flash V3 profile: `N_NODES` 2, 4, 8 or 16.
    #[value(name = "flash-v3")]
    FlashV3,
    /// Two nodes, no GPU: the `local` run with its policy on another node (`sglang:d1`, one `serve-policy`
    /// replica on the CPU), so the trainer, the proxy and the policy server talk across hosts.
    #[value(name = "multinode-cpu")]
    MultinodeCpu,
}

impl Profile {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Profile::Local => "local",
            Profile::Grpo => "grpo",
            Profile::FlashV3 => "flash-v3",
            Profile::MultinodeCpu => "multinode-cpu",
        }
    }

    /// The profile's run config, relative to the checkout.
    pub(crate) fn default_config(self) -> &'static str {
        match self {
            // The same quickstart-sized run as `local`; only the placement differs.
            Profile::Local | Profile::MultinodeCpu => "examples/configs/local.yaml",
            Profile::Grpo => "examples/configs/grpo.yaml",
            Profile::FlashV3 => "examples/configs/flash_v3.yaml",
        }
    }

    /// GPUs a node of the GPU job has when `N_GPUS_PER_NODE` does not say.
    pub(crate) fn default_gpus_per_node(self) -> u32 {
        match self {
            Profile::Local | Profile::MultinodeCpu => 0,
            Profile::Grpo | Profile::FlashV3 => 8,
        }
    }

    /// Whether the controller job is the reference's CPU-only job (4 CPUs, 16G, `--gres=gpu:0`) or a small one
    /// that fits on a laptop-sized node next to the training job.
    pub(crate) fn small_controller(self) -> bool {
        self.default_gpus_per_node() == 0
    }
}

/// The Flash V3 topology table: `N_NODES` -> (Megatron actor layout, SGLang rollout layout).
pub(crate) const FLASH_V3_TOPOLOGY: [(u32, &str, &str); 4] = [
    (2, "megatron:(attn:d1p2t4c2|ffn:d1p2e8)", "sglang:d4t4p1"),
    (4, "megatron:(attn:d2p2t4c2|ffn:d2p2e8)", "sglang:d8t4p1"),
    (8, "megatron:(attn:d2p2t2c8|ffn:d4p2e8)", "sglang:d16t4p1"),
    (16, "megatron:(attn:d4p2t2c8|ffn:d8p2e8)", "sglang:d32t4p1"),
];

/// The thirteen knobs of a profile, as `--print-profile` prints them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Knobs {
    /// Nodes: the reference's count (`N_NODES` for Flash V3) until `--print-profile` replaces it with what
    /// the GPU job allocates (the trainer's node plus the policy servers').
    pub(crate) nodes: u32,
    /// What trains: `burn:cpu`, `burn:1gpu` (burn on the trainer node's first GPU), or `fsdp2:dN` (the FSDP2
    /// worker over N data-parallel ranks, `torchrun` on the trainer nodes); `ACTOR_LAYOUT` overrides the
    /// profile's. The reference's `megatron:...` layouts are not run.
    pub(crate) actor: String,
    /// What serves the policy: `sglang:dDtTpP` (SGLang servers, the reference's layouts), `burn:dD`
    /// (`serve-policy` replicas) or `in-process`; `ROLLOUT_LAYOUT` overrides the profile's.
    pub(crate) rollout: String,
    pub(crate) context: u64,
    pub(crate) max_tokens: u64,
    pub(crate) max_new_tokens: u64,
    pub(crate) batch: u64,
    pub(crate) samples: u64,
    pub(crate) steps: u64,
    pub(crate) concurrency: u64,
    /// Memory of one GPU of the job's nodes (`GPU_MEMORY_GIB`; 80, an H100's, on GPU profiles; 0 on `local`):
    /// the limit `cargo xtask submit` holds the trainer's per-GPU estimate to.
    pub(crate) gpu_memory_gib: u32,
    /// The AdamW learning rate (`actor.lr`): `LEARNING_RATE`, or the profile's default (module
    /// [`super::defaults`]).
    pub(crate) lr: Pick<Lr>,
    /// Steps between checkpoints (`checkpoint.save_every`): `CHECKPOINT_EVERY`, or the profile's default.
    pub(crate) checkpoint_every: Pick<u64>,
}

/// A run setting the reference leaves to the config, as a profile passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Pick<T> {
    /// Nothing is passed: the run config's value stands (CPU profiles).
    Config,
    /// The profile's default: passed unless the user's config (its files, `ARENA_RL_` variables or
    /// overrides) sets the key.
    Default(T),
    /// Its environment variable: passed over the config file, as the other knobs are.
    Set(T),
}

impl<T: std::fmt::Display> std::fmt::Display for Pick<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pick::Config => f.write_str("config"),
            Pick::Default(v) | Pick::Set(v) => v.fmt(f),
        }
    }
}

/// A learning rate as a profile passes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Lr {
    /// By the model's parameter count, which `cargo xtask submit` reads from the trainer's estimate
    /// ([`super::defaults::learning_rate`]).
    BySize,
    /// This rate, as written (a positive decimal or `1e-6` form).
    Rate(String),
}

impl std::fmt::Display for Lr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Lr::BySize => f.write_str("by-model-size"),
            Lr::Rate(r) => f.write_str(r),
        }
    }
}

impl Knobs {
    /// The thirteen `key=value` lines of `--print-profile`: the reference's ten, in its order, then the GPU
    /// memory, the learning rate and the steps between checkpoints (`config` where the run config decides).
    pub(crate) fn lines(&self) -> Vec<String> {
        vec![
            format!("nodes={}", self.nodes),
            format!("actor={}", self.actor),
            format!("rollout={}", self.rollout),
            format!("context={}", self.context),
            format!("max_tokens={}", self.max_tokens),
            format!("max_new_tokens={}", self.max_new_tokens),
            format!("batch={}", self.batch),
            format!("samples={}", self.samples),
            format!("steps={}", self.steps),
            format!("concurrency={}", self.concurrency),
            format!("gpu_memory_gib={}", self.gpu_memory_gib),
            format!("lr={}", self.lr),
            format!("checkpoint_every={}", self.checkpoint_every),
        ]
    }
}

/// Reads the profile's knobs, applying the Flash V3 rules to its environment variables.
pub(crate) fn knobs(profile: Profile, env: &Env, problems: &mut Problems) -> Option<Knobs> {
    let default_gib = if profile.default_gpus_per_node() == 0 {
        0
    } else {
        80
    };
    let gib = int_var(
        problems,
        env,
        "GPU_MEMORY_GIB",
        default_gib,
        0..=4096,
        "an integer from 0 to 4096",
    );
    let layout = match env.get("ACTOR_LAYOUT") {
        None => Some(None),
        Some(v) => match parse_actor(v) {
            Ok(_) => Some(Some(v.to_string())),
            Err(why) => {
                problems.push(format!("ACTOR_LAYOUT {why}, got '{v}'"));
                None
            }
        },
    };
    let rollout = match env.get("ROLLOUT_LAYOUT") {
        None => Some(None),
        Some(v) => match parse_rollout(v) {
            Ok(_) => Some(Some(v.to_string())),
            Err(why) => {
                problems.push(format!("ROLLOUT_LAYOUT {why}, got '{v}'"));
                None
            }
        },
    };
    let lr = match env.get("LEARNING_RATE") {
        None => Some(None),
        Some(v) => match parse_rate(v) {
            Some(_) => Some(Some(v.to_string())),
            None => {
                problems.push(format!(
                    "LEARNING_RATE must be a number above 0 and at most 1, such as 1e-6 or 0.000003, got '{v}'"
                ));
                None
            }
        },
    };
    let checkpoint_every = match env.get("CHECKPOINT_EVERY") {
        None => Some(None),
        Some(_) => int_var(
            problems,
            env,
            "CHECKPOINT_EVERY",
            1,
            1..=1_000_000,
            "a number of steps from 1 to 1000000",
        )
        .map(Some),
    };
    let mut knobs = profile_knobs(profile, env, problems)?;
    knobs.gpu_memory_gib = gib?;
    if let Some(rate) = lr? {
        knobs.lr = Pick::Set(Lr::Rate(rate));
    }
    if let Some(n) = checkpoint_every? {
        knobs.checkpoint_every = Pick::Set(n);
    }
    if let Some(layout) = layout? {
        knobs.actor = layout;
    }
    if let Some(rollout) = rollout? {
        knobs.rollout = rollout;
    }
    Some(knobs)
}

/// What trains, parsed from the `actor` knob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ActorLayout {
    /// burn, in the `arena-rl train` process, on the trainer node's first GPU or its CPU.
    Burn,
    /// The FSDP2 worker (`actor.backend: fsdp2`) over this many data-parallel ranks, one a GPU (or CPU
    /// processes on nodes without GPUs).
    Fsdp2 { ranks: u32 },
}

/// A learning rate: a finite number above 0 and at most 1, in decimal or exponent form (`1e-6`, `3.0e-6`,
/// `0.000003`); `None` otherwise.
pub(crate) fn parse_rate(v: &str) -> Option<f64> {
    let plain = !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit() || b".eE-+".contains(&b));
    match v.parse::<f64>() {
        Ok(r) if plain && r.is_finite() && r > 0.0 && r <= 1.0 => Some(r),
        _ => None,
    }
}

/// Parses an actor layout: `burn`, `burn:cpu` or `burn:1gpu`, or `fsdp2:dN` with optional `p1` and `t1` (the
/// reference's notation; FSDP2 shards over data-parallel ranks only). `Err` says what is wrong, for a line
/// that names the variable.
pub(crate) fn parse_actor(layout: &str) -> Result<ActorLayout, String> {
    const WANT: &str =
        "must be burn, burn:cpu, burn:1gpu or fsdp2:dN (N data-parallel ranks; p1 and t1 may follow)";
    if matches!(layout, "burn" | "burn:cpu" | "burn:1gpu") {
        return Ok(ActorLayout::Burn);
    }
    let Some(spec) = layout.strip_prefix("fsdp2:") else {
        return Err(WANT.into());
    };
    let (mut d, mut p, mut t) = (None, None, None);
    let mut rest = spec;
    while let Some(letter) = rest.chars().next() {
        let digits = rest[letter.len_utf8()..]
            .bytes()
            .take_while(u8::is_ascii_digit)
            .count();
        let n: u32 = match rest[letter.len_utf8()..letter.len_utf8() + digits].parse() {
            Ok(n) if n > 0 => n,
            _ => return Err(WANT.into()),
        };
        let slot = match letter {
            'd' => &mut d,
            'p' => &mut p,
            't' => &mut t,
            _ => return Err(WANT.into()),
        };
        if slot.replace(n).is_some() {
            return Err(WANT.into());
        }
        rest = &rest[letter.len_utf8() + digits..];
    }
    if p.unwrap_or(1) != 1 || t.unwrap_or(1) != 1 {
        return Err(
            "asks for pipeline or tensor parallelism, which the FSDP2 trainer does not have (only p1t1)"
                .into(),
        );
    }
    match d {
        Some(ranks) if ranks <= 4096 => Ok(ActorLayout::Fsdp2 { ranks }),
        Some(_) => Err("must have at most 4096 data-parallel ranks".into()),
        None => Err(WANT.into()),
    }
}

fn profile_knobs(profile: Profile, env: &Env, problems: &mut Problems) -> Option<Knobs> {
    match profile {
        // A quickstart-sized smoke run of examples/configs/quickstart.yaml's Streams: two steps of 2 x 2 rollouts.
        Profile::Local => Some(Knobs {
            nodes: 1,
            actor: "burn:cpu".into(),
            rollout: "in-process".into(),
            context: 2048,
            max_tokens: 2047,
            max_new_tokens: 64,
            batch: 2,
            samples: 2,
            steps: 2,
            concurrency: 4,
            gpu_memory_gib: 0,
            lr: Pick::Config,
            checkpoint_every: Pick::Config,
        }),
        // The same run with its policy on a second node: one `serve-policy` replica on the CPU, which the trainer
        // reaches over the network and publishes each update to, as an SGLang layout's servers are reached.
        Profile::MultinodeCpu => Some(Knobs {
            nodes: 2,
            actor: "burn:cpu".into(),
            rollout: "sglang:d1".into(),
            // The server's --context-length, which SGLang refuses above the model's window: the quickstart
            // policy's 256 tokens.
            context: 256,
            max_tokens: 255,
            max_new_tokens: 64,
            batch: 2,
            samples: 2,
            steps: 2,
            concurrency: 4,
            gpu_memory_gib: 0,
            lr: Pick::Config,
            checkpoint_every: Pick::Config,
        }),
        Profile::Grpo => Some(Knobs {
            nodes: 2,
            // The reference trains with FSDP `d8p1t1`: the FSDP2 worker over the trainer node's 8 GPUs.
            actor: "fsdp2:d8p1t1".into(),
            rollout: "sglang:d4p1t2".into(),
            context: 32768,
            max_tokens: 32767,
            max_new_tokens: 8192,
            batch: 8,
            samples: 2,
            steps: 1,
            concurrency: 16,
            gpu_memory_gib: 0,
            lr: Pick::Default(Lr::BySize),
            checkpoint_every: Pick::Default(super::defaults::GPU_CHECKPOINT_EVERY),
        }),
        Profile::FlashV3 => flash_v3(env, problems),
    }
}

fn flash_v3(env: &Env, problems: &mut Problems) -> Option<Knobs> {
    let before = problems.len();
    let nodes = match env.get("N_NODES").unwrap_or("8") {
        "2" => Some(2),
        "4" => Some(4),
        "8" => Some(8),
        "16" => Some(16),
        other => {
            problems.push(format!("N_NODES must be 2, 4, 8 or 16, got '{other}'"));
            None
        }
    };
    let context = match env.get("CONTEXT_LENGTH").unwrap_or("131072") {
        s if is_decimal(s) => match s.parse::<u64>() {
            Ok(n) if n >= 2 => Some(n),
            _ => {
                problems.push(format!("CONTEXT_LENGTH must be at least 2, got '{s}'"));
                None
            }
        },
        s => {
            problems.push(format!(
                "CONTEXT_LENGTH must be a positive decimal integer without leading zeros, got '{s}'"
            ));
            None
        }
    };
    let max_tokens = below_context(env, "MAX_TOKENS", context, problems);
    let max_new_tokens = below_context(env, "MAX_NEW_TOKENS", context, problems);
    let batch = positive(env, "TRAIN_BATCH_SIZE", 32, problems);
    let samples = positive(env, "N_SAMPLES", 12, problems);
    let steps = positive(env, "TOTAL_TRAIN_STEPS", 500, problems);
    let concurrency = positive(env, "MAX_CONCURRENT_ROLLOUTS", 1500, problems);
    if problems.len() != before {
        return None;
    }
    let (nodes, context) = (nodes?, context?);
    let (_, _reference_actor, rollout) = FLASH_V3_TOPOLOGY
        .iter()
        .find(|(n, _, _)| *n == nodes)
        .expect("N_NODES was checked against the table");
    Some(Knobs {
        nodes,
        // The reference trains with the table's Megatron layout (MoE experts, tensor and context parallelism),
        // which neither trainer has; burn trains on the trainer node's first GPU.
        actor: "burn:1gpu".into(),
        rollout: (*rollout).into(),
        context,
        max_tokens: max_tokens.unwrap_or(context - 1),
        max_new_tokens: max_new_tokens.or(max_tokens).unwrap_or(context - 1),
        batch: batch?,
        samples: samples?,
        steps: steps?,
        concurrency: concurrency?,
        gpu_memory_gib: 0,
        // The seed article's Flash V3 run trains with Adam at 3e-6.
        lr: Pick::Default(Lr::Rate(super::defaults::FLASH_V3_LR.into())),
        checkpoint_every: Pick::Default(super::defaults::GPU_CHECKPOINT_EVERY),
    })
}

/// `MAX_TOKENS` / `MAX_NEW_TOKENS`: unset means the default (`None`); set, a positive integer strictly below
/// `CONTEXT_LENGTH`.
fn below_context(env: &Env, name: &str, context: Option<u64>, problems: &mut Problems) -> Option<u64> {
    env.get(name)?;
    let n = positive(env, name, 0, problems)?;
    match context {
        Some(c) if n >= c => {
            problems.push(format!(
                "{name} must be less than CONTEXT_LENGTH ({c}), got '{n}'"
            ));
            None
        }
        _ => Some(n),
    }
}

fn positive(env: &Env, name: &str, default: u64, problems: &mut Problems) -> Option<u64> {
    int_var(problems, env, name, default, 1..=u64::MAX, "a positive integer")
}

/// A positive decimal without a leading zero (`^[1-9][0-9]*$`).
fn is_decimal(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| (b'1'..=b'9').contains(&b)) && s.bytes().all(|b| b.is_ascii_digit())
}

/// Where the GPU job's `arena-rl` roles run.
///
/// The first node runs `arena-rl train` (the loop and the rollout proxy; with burn, the trainer too). An
/// `fsdp2:dN` actor adds the FSDP2 worker: `torchrun` over the first `trainer_nodes` nodes with
/// `trainer_ranks_per_node` ranks each (one a GPU), whose rank 0 the loop attaches to.
/// The rollout layout `sglang:dDtTpP` becomes D SGLang servers with T x P GPUs each (`burn:dD`: D
/// `arena-rl serve-policy` replicas with one GPU each), packed onto whole nodes after the trainer's (all on one
/// node without GPUs); the trainer reaches them through `rollout.policy_servers`.
/// Without a rollout layout (`in-process`) the policy is served inside the trainer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Placement {
    /// GPUs each node of the GPU job asks for (`--gres=gpu:N`); 0 asks for none.
    pub(crate) gpus_per_node: u32,
    /// What serves the policy for rollouts.
    pub(crate) serving: Serving,
    /// What trains.
    pub(crate) actor: ActorLayout,
    /// Nodes that train: 1 for burn; for FSDP2 the nodes its ranks fill (the first runs the loop too).
    pub(crate) trainer_nodes: u32,
    /// FSDP2 ranks `torchrun` starts on each trainer node (0 for burn).
    pub(crate) trainer_ranks_per_node: u32,
    /// Nodes that run `arena-rl serve-policy` replicas.
    pub(crate) serve_nodes: u32,
    /// Policy-server replicas on each of those nodes.
    pub(crate) replicas_per_node: u32,
    /// GPUs made visible to each replica, all of which it uses (0 on CPU nodes).
    pub(crate) gpus_per_replica: u32,
}

impl Placement {
    /// Nodes the GPU job allocates: the trainer's, then the policy servers'.
    pub(crate) fn job_nodes(&self) -> u32 {
        self.trainer_nodes + self.serve_nodes
    }

    /// The `actor` knob as it runs: `burn:cpu` or `burn:1gpu` by the nodes' GPUs, `fsdp2:dNp1t1`.
    pub(crate) fn actor_name(&self) -> String {
        match self.actor {
            ActorLayout::Burn if self.gpus_per_node == 0 => "burn:cpu".into(),
            ActorLayout::Burn => "burn:1gpu".into(),
            ActorLayout::Fsdp2 { ranks } => format!("fsdp2:d{ranks}p1t1"),
        }
    }
}

/// What serves the policy for rollouts: `in-process`, or replicas on nodes of their own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Serving {
    /// Inside `arena-rl train` (no policy servers).
    InProcess,
    /// `arena-rl serve-policy` replicas (`burn:dD`): burn serves on one device, so one GPU each.
    Burn,
    /// SGLang servers (`sglang:dDtTpP`), started by `SGLANG_LAUNCHER`, each over T x P GPUs of one node.
    Sglang { tp: u32, pp: u32 },
}

/// A parsed rollout layout: what serves, and how many replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RolloutLayout {
    pub(crate) serving: Serving,
    pub(crate) replicas: u32,
}

impl RolloutLayout {
    /// GPUs each replica is given (and uses).
    pub(crate) fn gpus_per_replica(&self) -> u32 {
        match self.serving {
            Serving::InProcess => 0,
            Serving::Burn => 1,
            Serving::Sglang { tp, pp } => tp * pp,
        }
    }
}

/// Parses a rollout layout: `in-process`; `sglang:dDtTpP` (letters in any order, each at most once, missing
/// ones 1); or `burn:dD` (`t1` and `p1` may follow: burn serves on one GPU, so a replica given more is
/// refused rather than left with GPUs it does not use). `Err` says what is wrong, for a line that names the
/// variable.
pub(crate) fn parse_rollout(layout: &str) -> Result<RolloutLayout, String> {
    const WANT: &str = "must be sglang:dDtTpP (D SGLang servers of T x P GPUs each), burn:dD (D serve-policy replicas of one GPU each) or in-process";
    if layout == "in-process" {
        return Ok(RolloutLayout {
            serving: Serving::InProcess,
            replicas: 0,
        });
    }
    let (burn, spec) = match (layout.strip_prefix("sglang:"), layout.strip_prefix("burn:")) {
        (Some(spec), _) => (false, spec),
        (_, Some(spec)) => (true, spec),
        _ => return Err(WANT.into()),
    };
    let (mut d, mut t, mut p) = (None, None, None);
    let mut rest = spec;
    while let Some(letter) = rest.chars().next() {
        let at = letter.len_utf8();
        let digits = rest[at..].bytes().take_while(u8::is_ascii_digit).count();
        let n: u32 = match rest[at..at + digits].parse() {
            Ok(n) if (1..=4096).contains(&n) => n,
            _ => return Err(WANT.into()),
        };
        let slot = match letter {
            'd' => &mut d,
            't' => &mut t,
            'p' => &mut p,
            _ => return Err(WANT.into()),
        };
        if slot.replace(n).is_some() {
            return Err(WANT.into());
        }
        rest = &rest[at + digits..];
    }
    let (tp, pp) = (t.unwrap_or(1), p.unwrap_or(1));
    let Some(replicas) = d else {
        return Err(WANT.into());
    };
    if burn && tp * pp != 1 {
        return Err(format!(
            "gives each serve-policy replica {} GPUs, but burn serves on one and would leave the others idle: use burn:d{replicas} (one GPU each), or sglang:d{replicas}t{tp}p{pp} to serve with SGLang",
            tp * pp
        ));
    }
    let serving = if burn {
        Serving::Burn
    } else {
        Serving::Sglang { tp, pp }
    };
    Ok(RolloutLayout { serving, replicas })
}

/// Places the roles for `knobs` on nodes with `N_GPUS_PER_NODE` GPUs (default 8 for GPU profiles, 0 for `local`).
pub(crate) fn placement(
    profile: Profile,
    knobs: &Knobs,
    env: &Env,
    problems: &mut Problems,
) -> Option<Placement> {
    let gpus_per_node = int_var(
        problems,
        env,
        "N_GPUS_PER_NODE",
        profile.default_gpus_per_node(),
        0..=64,
        "an integer from 0 to 64",
    )?;
    // The rollout layout first: its problems are the ones the reference's scripts report.
    let layout = parse_rollout(&knobs.rollout).expect("rollout layouts are checked when read");
    let (serve_nodes, replicas_per_node, gpus_per_replica) = if layout.serving == Serving::InProcess {
        (0, 0, 0)
    } else if gpus_per_node == 0 {
        // Without GPUs (a CPU profile) every replica runs on one node, on its CPUs.
        (1, layout.replicas, 0)
    } else {
        let (replicas, per_replica) = (layout.replicas, layout.gpus_per_replica());
        if gpus_per_node % per_replica != 0 {
            problems.push(format!(
                "N_GPUS_PER_NODE={gpus_per_node} does not fit the rollout layout {} ({replicas} replicas of {per_replica} GPUs each)",
                knobs.rollout
            ));
            return None;
        }
        let replicas_per_node = (gpus_per_node / per_replica).min(replicas);
        if replicas % replicas_per_node != 0 {
            problems.push(format!(
                "N_GPUS_PER_NODE={gpus_per_node} does not fit the rollout layout {}: {replicas} replicas do not fill whole nodes of {replicas_per_node}",
                knobs.rollout
            ));
            return None;
        }
        (replicas / replicas_per_node, replicas_per_node, per_replica)
    };
    let actor = parse_actor(&knobs.actor).expect("actor layouts are checked when read");
    let (trainer_nodes, trainer_ranks_per_node) = match actor {
        ActorLayout::Burn => (1, 0),
        // Without GPUs (a CPU profile) every rank runs on the one trainer node.
        ActorLayout::Fsdp2 { ranks } if gpus_per_node == 0 || ranks <= gpus_per_node => (1, ranks),
        ActorLayout::Fsdp2 { ranks } if ranks % gpus_per_node == 0 => (ranks / gpus_per_node, gpus_per_node),
        ActorLayout::Fsdp2 { ranks } => {
            problems.push(format!(
                "N_GPUS_PER_NODE={gpus_per_node} does not fit the actor layout {}: {ranks} ranks do not fill whole nodes of {gpus_per_node} GPUs",
                knobs.actor
            ));
            return None;
        }
    };
    Some(Placement {
        gpus_per_node,
        serving: layout.serving,
        actor,
        trainer_nodes,
        trainer_ranks_per_node,
        serve_nodes,
        replicas_per_node,
        gpus_per_replica,
    })
}
