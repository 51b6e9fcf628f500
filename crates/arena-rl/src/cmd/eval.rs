//! `arena-rl eval`: evaluates a checkpoint on Arena tasks (a manifest of `env:key@version` references, a
//! Stream subset, or every configured Stream), `--samples` times each, optionally against a baseline, and
//! prints the table; `results.jsonl`, `report.txt`, `eval.png` and the metrics are under `--out`.

use std::path::PathBuf;

use anyhow::{Context as _, Result};
use arena_rl::run::{EvalEngines, EvalOptions, RunPaths, evaluate};
use stream_config::{Env, load_run_config};

use super::train::init_logging;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The run config (YAML; it may `extends:` others): the Streams, Arena, the proxy and the model engine.
    #[arg(long)]
    config: PathBuf,
    /// The checkpoint to evaluate: a model folder (a `step-N` checkpoint is one; its optimizer state is
    /// not read) or a folder of `step-N` checkpoints (the newest).
    #[arg(long)]
    checkpoint: PathBuf,
    /// A second checkpoint to compare against (the same forms).
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Samples per task (`k` of pass@k).
    #[arg(long, default_value_t = 1)]
    samples: u32,
    /// The output folder; a rerun with the same folder resumes. Default: `<run dir>/eval`.
    #[arg(long)]
    out: Option<PathBuf>,
    /// A task manifest: a JSON list of `env:key@version` references (or `{"stream": NAME, "tasks": [...]}`,
    /// or `{"streams": [NAME, ...]}`).
    #[arg(long, conflicts_with = "streams")]
    manifest: Option<PathBuf>,
    /// Evaluate every row of these Streams (comma-separated names). Default: `valid_dataset.streams`, else
    /// every configured Stream.
    #[arg(long, value_delimiter = ',')]
    streams: Vec<String>,
    /// Dotted overrides, e.g. `econfig.timeout=600`.
    #[arg(value_name = "SECTION.FIELD=VALUE")]
    overrides: Vec<String>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    init_logging();
    let env = Env::from_process();
    let config = load_run_config(&args.config, &args.overrides, &env)?;
    let options = EvalOptions {
        out: args
            .out
            .unwrap_or_else(|| RunPaths::of(&config).run_dir.join("eval")),
        checkpoint: args.checkpoint,
        baseline: args.baseline,
        samples: args.samples,
        manifest: args.manifest,
        streams: args.streams,
    };
    let summary = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(evaluate(config, &env, &options, EvalEngines::default()))?;
    print!("{}", summary.table);
    println!("results: {}", summary.out.display());
    println!("chart: {}", summary.png.display());
    Ok(())
}
