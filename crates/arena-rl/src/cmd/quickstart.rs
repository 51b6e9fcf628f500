//! `arena-rl quickstart [overrides]`: the main job on this machine. It builds a tiny policy, warms it up on the
//! task format, starts `arena-sim` in-process and runs `arena-rl train` on the embedded
//! `examples/configs/quickstart.yaml`, then says where the metrics, checkpoint and reward curve are and how
//! much the mean reward rose.

use std::io::Write as _;

use anyhow::{Context as _, Result};
use arena_rl::quickstart::{
    self, CURVE_WINDOW, Options, QuickstartSummary, WarmupSettings, policy::PolicySpec,
};
use arena_rl::run::RunPaths;
use arena_rl::train::{GrpoStep, TrainStep};
use stream_config::{Env, load_stream_configs_with_env};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Seeds the tiny policy (corpus, tokenizer, weights) and the warm-up data.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Supervised warm-up steps on the task format before RL (0 skips the warm-up).
    #[arg(long)]
    warmup_steps: Option<u64>,
    /// The warm-up's learning rate.
    #[arg(long)]
    warmup_lr: Option<f64>,
    /// Conversations the warm-up trains on.
    #[arg(long)]
    warmup_conversations: Option<usize>,
    /// Conversations per warm-up step.
    #[arg(long)]
    warmup_batch_size: Option<usize>,
    /// The fraction of warm-up answers drawn from the question's half of the digits (5-9 for "largest",
    /// 0-4 for "smallest") rather than from all ten; 0 makes them uniformly random.
    #[arg(long)]
    warmup_family_prior: Option<f64>,
    /// Width of the tiny policy's residual stream (default 96).
    #[arg(long)]
    hidden_size: Option<usize>,
    /// Width of its SwiGLU MLP (default three times the hidden size).
    #[arg(long)]
    intermediate_size: Option<usize>,
    /// Its decoder layers (default 3).
    #[arg(long)]
    num_layers: Option<usize>,
    /// Its attention heads (default 3; the hidden size must split into even-width heads).
    #[arg(long)]
    num_heads: Option<usize>,
    /// Only load and validate the config (with the overrides), print the resolved Streams, and exit.
    #[arg(long)]
    check: bool,
    /// Only build and warm up the tiny policy (or find it in the cache), print its folder, and exit: the
    /// `MODEL_PATH` for `arena-rl train --config examples/configs/local.yaml` against an arena-sim of your own.
    #[arg(long, conflicts_with = "check")]
    prepare_policy: bool,
    /// Dotted overrides of the quickstart config, e.g. `actor.lr=0` or `gconfig.n_samples=4`
    /// (values in YAML flow syntax).
    #[arg(value_name = "SECTION.FIELD=VALUE")]
    overrides: Vec<String>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    if args.check {
        return check(&args.overrides);
    }
    // The warm-up alone opens thousands of proxy sessions: per-session lines stay out of the default view.
    crate::cmd::train::init_logging_with("info,rollout_proxy::control=warn");
    let mut warmup = WarmupSettings::default();
    if let Some(steps) = args.warmup_steps {
        warmup.steps = steps;
    }
    if let Some(lr) = args.warmup_lr {
        warmup.lr = lr;
    }
    if let Some(n) = args.warmup_conversations {
        warmup.conversations = n;
    }
    if let Some(n) = args.warmup_batch_size {
        warmup.batch_size = n;
    }
    if let Some(p) = args.warmup_family_prior {
        anyhow::ensure!(
            (0.0..=1.0).contains(&p),
            "--warmup-family-prior {p} must be between 0 and 1"
        );
        warmup.family_prior = p;
    }
    let spec = args.policy_spec()?;
    if args.prepare_policy {
        return prepare_policy(&args.overrides, &spec, &warmup);
    }
    let options = Options {
        overrides: args.overrides,
        policy: spec,
        warmup,
        fresh_trial: true,
        step: Box::new(|config, _| {
            let step = GrpoStep::from_run_config(config, &RunPaths::of(config).run_dir)?;
            Ok(Box::new(step) as Box<dyn TrainStep>)
        }),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let summary = runtime.block_on(quickstart::run(options, &Env::from_process()))?;
    report(&summary)?;
    Ok(())
}

impl Args {
    /// The tiny policy of `--seed` and the size flags; every problem with it in one error.
    fn policy_spec(&self) -> Result<PolicySpec> {
        let mut spec = PolicySpec {
            seed: self.seed,
            ..PolicySpec::default()
        };
        if let Some(width) = self.hidden_size {
            spec.hidden_size = width;
            spec.intermediate_size = 3 * width;
        }
        if let Some(n) = self.intermediate_size {
            spec.intermediate_size = n;
        }
        if let Some(n) = self.num_layers {
            spec.num_layers = n;
        }
        if let Some(n) = self.num_heads {
            spec.num_heads = n;
        }
        let problems = spec.problems();
        anyhow::ensure!(
            problems.is_empty(),
            "the policy size flags (--hidden-size {}, --intermediate-size {}, --num-layers {}, --num-heads {}) \
             do not make a policy: {}",
            spec.hidden_size,
            spec.intermediate_size,
            spec.num_layers,
            spec.num_heads,
            problems.join("; ")
        );
        Ok(spec)
    }
}

/// `--prepare-policy`: the warmed-up policy folder on stdout.
fn prepare_policy(overrides: &[String], spec: &PolicySpec, warmup: &WarmupSettings) -> Result<()> {
    let config = quickstart::load_config(overrides, false, &Env::from_process())?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let prepared = runtime.block_on(quickstart::prepare(
        spec,
        warmup,
        &quickstart::policy_cache(&config),
        config.metrics.progress,
    ))?;
    writeln!(std::io::stdout().lock(), "{}", prepared.warm.display())?;
    Ok(())
}

/// `--check`: the config as the run would load it, and its Streams.
fn check(overrides: &[String]) -> Result<()> {
    let env = Env::from_process();
    let config = quickstart::load_config(overrides, false, &env)?;
    let mut streams = load_stream_configs_with_env(&config.econfig, &env)
        .with_context(|| format!("{}: the Streams do not load", quickstart::QUICKSTART_NAME))?;
    for s in &mut streams {
        s.llm_protocol = Some(s.resolved_protocol(None));
    }
    let parts: Vec<String> = streams
        .iter()
        .map(|s| {
            format!(
                "{} (weight {}, {})",
                s.name,
                s.sampling_weight,
                s.resolved_protocol(None)
            )
        })
        .collect();
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "# {} is valid: experiment {:?}, trial {:?}, Arena at {}, route mode {}",
        quickstart::QUICKSTART_NAME,
        config.experiment_name,
        config.trial_name,
        config.econfig.arena_base_url,
        config.econfig.arena_llm_route_mode
    )?;
    writeln!(out, "# {} Streams: {}", streams.len(), parts.join(", "))?;
    writeln!(out, "{}", stream_config::render_streams_yaml(&streams)?)?;
    Ok(())
}

fn report(s: &QuickstartSummary) -> Result<()> {
    let mut out = std::io::stdout().lock();
    let run = &s.run;
    writeln!(
        out,
        "quickstart: {} RL step(s) in {} ({} groups accepted, rejected: {:?})",
        run.rewards.len(),
        run.run_dir.display(),
        run.accepted_groups,
        run.rejected_groups
    )?;
    writeln!(
        out,
        "time: policy {:.1}s{}, warm-up {:.1}s, RL {:.1}s",
        s.seconds.policy,
        if s.policy_cached { " (cached)" } else { "" },
        s.seconds.warmup,
        s.seconds.rl
    )?;
    writeln!(
        out,
        "policy: {} (warmed up: {})",
        s.initial_policy.display(),
        s.warm_policy.display()
    )?;
    writeln!(
        out,
        "metrics: {}",
        run.metrics_dir.join("metrics.jsonl").display()
    )?;
    writeln!(
        out,
        "tensorboard: {}",
        run.metrics_dir.join("tensorboard").display()
    )?;
    if let Some(c) = &run.checkpoint {
        writeln!(out, "checkpoint: {}", c.display())?;
    }
    if let Some(p) = &run.reward_curve {
        writeln!(out, "reward curve: {}", p.display())?;
    }
    match (s.first, s.last) {
        (Some((first, n)), Some((last, m))) => writeln!(
            out,
            "rollout/reward: first {n} RL step(s) {first:.3}, last {m} RL step(s) {last:.3}, rise {:+.3} (window {CURVE_WINDOW})",
            last - first
        )?,
        _ => writeln!(out, "rollout/reward: no RL step reported a reward")?,
    }
    Ok(())
}
