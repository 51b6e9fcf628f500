//! `arena-rl train` and `arena-rl rollout`: the training loop (GRPO with `trainer`, or frozen weights with
//! the fake engine), and the rollout-only mode that exports scored trajectories to JSONL without training.
//!
//! Both load the run config (`--config FILE` plus dotted overrides), set up logging (`RUST_LOG`, default
//! `info`), run until done, and print where the run's files are. Credentials come from the environment
//! (`ARENA_OPENAPI_TOKEN`, `ARENA_LLM_API_KEY`, the proxy admin key), never from the command line.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use arena_rl::run::{Plugins, RunPaths, RunSummary, rollout_only, train};
use arena_rl::train::{FrozenPolicy, GrpoStep, TrainStep};
use stream_config::{Env, ModelEngine, RunConfig, load_run_config};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The run config (YAML; it may `extends:` others).
    #[arg(long)]
    config: PathBuf,
    /// Dotted overrides, e.g. `actor.total_train_steps=10` or `rollout.policy_servers=[http://h:30000]`.
    #[arg(value_name = "SECTION.FIELD=VALUE")]
    overrides: Vec<String>,
}

/// Logs to stderr as text; `RUST_LOG` filters (default `info`).
pub(crate) fn init_logging() {
    init_logging_with("info");
}

/// Logs to stderr with `RUST_LOG`'s filter, or `default` when it is unset.
pub(crate) fn init_logging_with(default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")
}

pub(crate) fn run_train(args: Args) -> Result<()> {
    init_logging();
    let env = Env::from_process();
    let config = load_run_config(&args.config, &args.overrides, &env)?;
    let step = training_step(&config)?;
    let summary = runtime()?.block_on(train(config, &env, Plugins { engine: None, step }))?;
    report(&summary, "trained");
    Ok(())
}

/// GRPO on the model, except with the fake engine, whose tokens no weight change can move.
fn training_step(config: &RunConfig) -> Result<Box<dyn TrainStep>> {
    if config.model.engine == ModelEngine::Fake && config.rollout.policy_servers.is_empty() {
        tracing::warn!("model.engine is fake: the weights stay frozen");
        return Ok(Box::new(FrozenPolicy::default()));
    }
    Ok(Box::new(GrpoStep::from_run_config(
        config,
        &RunPaths::of(config).run_dir,
    )?))
}

pub(crate) fn run_rollout(args: Args) -> Result<()> {
    init_logging();
    let env = Env::from_process();
    let config = load_run_config(&args.config, &args.overrides, &env)?;
    let summary = runtime()?.block_on(rollout_only(config, &env, None))?;
    report(&summary, "rolled out");
    println!("rollouts: {}", summary.run_dir.join("rollouts.jsonl").display());
    Ok(())
}

fn report(summary: &RunSummary, verb: &str) {
    let steps = summary.rewards.len();
    println!(
        "{verb} {steps} step(s) in {} ({} groups accepted, rejected: {:?})",
        summary.run_dir.display(),
        summary.accepted_groups,
        summary.rejected_groups
    );
    println!("metrics: {}", summary.metrics_dir.display());
    if let Some(c) = &summary.checkpoint {
        println!("checkpoint: {}", c.display());
    }
    if let Some(p) = &summary.reward_curve {
        println!("reward curve: {}", p.display());
    }
}
