//! The evaluation mode (`arena-rl eval`): a checkpoint, and optionally a baseline, run on the tasks a
//! manifest selects, each task `k` times, through the training loop's own setup and rollout workflow
//! (`Workflow::run_group` in the evaluation scope), with no trainer and no optimizer state.
//!
//! Each model is evaluated into its own folder under the output folder (`candidate/`, `baseline/`) with its
//! own journal: a rerun with the same output folder reuses every journaled sample and relaunches a killed
//! run's tasks as training does (`run::leftovers`), so with an Arena that dedupes launches no task is run
//! twice. The journal keys a sample by its task's position in the selection, so a rerun with another
//! selection stops with `Error::JournalMismatch`, and a folder records which checkpoint it evaluates.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::StreamExt as _;
use futures::stream::FuturesUnordered;
use reward_routing::{DynamicFilter, Scope};
use stream_config::{Env, RunConfig};

use super::serving::EngineHandle;
use super::{Run, finish, setup};
use crate::error::{Context as _, Error, Result};
use crate::eval::manifest::Manifest;
use crate::eval::report::Figures;
use crate::eval::results::{ResultLine, ResultsFile};
use crate::eval::stats::{aggregate, compare};
use crate::journal::SampleKey;
use crate::observe::{MetricsSink, StepMetrics, phase_bar};
use crate::resolve::PromptRow;

/// What to evaluate and where.
#[derive(Debug, Clone)]
pub struct EvalOptions {
    /// The checkpoint: a model folder (a `step-N` checkpoint is one), or a folder of `step-N` checkpoints
    /// (the newest is taken).
    pub checkpoint: PathBuf,
    /// A second checkpoint to compare against.
    pub baseline: Option<PathBuf>,
    /// Samples per task (`k`).
    pub samples: u32,
    /// The output folder.
    pub out: PathBuf,
    /// A task manifest (JSON, `eval::manifest`).
    pub manifest: Option<PathBuf>,
    /// A Stream subset, when there is no manifest; with neither, `valid_dataset.streams`, else every
    /// configured Stream.
    pub streams: Vec<String>,
}

/// Engines to evaluate with instead of loading the checkpoints (tests).
#[derive(Default)]
pub struct EvalEngines {
    /// For the checkpoint.
    pub candidate: Option<EngineHandle>,
    /// For the baseline.
    pub baseline: Option<EngineHandle>,
}

/// What an evaluation produced.
#[derive(Debug, Clone)]
pub struct EvalSummary {
    /// The figures.
    pub figures: Figures,
    /// The terminal table (also `report.txt`).
    pub table: String,
    /// `eval.png`.
    pub png: PathBuf,
    /// The output folder.
    pub out: PathBuf,
    /// Samples this process ran (the rest came from the journal), per model: checkpoint, baseline.
    pub ran: (usize, usize),
}

/// Evaluates the checkpoint (and the baseline) and writes the report.
pub async fn evaluate(
    config: RunConfig,
    env: &Env,
    options: &EvalOptions,
    engines: EvalEngines,
) -> Result<EvalSummary> {
    if options.samples == 0 {
        return Err(Error::Invalid("--samples must be at least 1".into()));
    }
    if !config.rollout.policy_servers.is_empty() {
        return Err(Error::Invalid(
            "arena-rl eval runs the checkpoint in this process; rollout.policy_servers must be empty".into(),
        ));
    }
    let manifest = manifest(&config, options)?;
    let one = |label: &'static str, dir: PathBuf, engine| {
        let (config, manifest) = (config.clone(), &manifest);
        async move { evaluate_one(label, &dir, config, env, options, manifest, engine).await }
    };
    let (candidate, ran_c, rollout_metrics) =
        one("candidate", options.checkpoint.clone(), engines.candidate).await?;
    let (baseline, ran_b) = match &options.baseline {
        Some(dir) => {
            let (lines, ran, _) = one("baseline", dir.clone(), engines.baseline).await?;
            (Some(lines), ran)
        }
        None => (None, 0),
    };
    let k = u64::from(options.samples);
    let samples = |lines: &[ResultLine]| lines.iter().map(ResultLine::sample).collect::<Vec<_>>();
    let cand = aggregate(&samples(&candidate), k);
    let base = baseline.as_deref().map(|b| aggregate(&samples(b), k));
    let figures = Figures {
        k,
        differences: base.as_ref().map(|b| compare(&cand, b)).unwrap_or_default(),
        candidate: cand,
        baseline: base,
    };
    write_report(&config, env, options, &figures, rollout_metrics, (ran_c, ran_b)).await
}

/// The manifest from `--manifest`, else a Stream subset (`--streams`, `valid_dataset.streams`), else `None`
/// (every Stream).
fn manifest(config: &RunConfig, options: &EvalOptions) -> Result<Option<(Manifest, String)>> {
    if let Some(path) = &options.manifest {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {origin}"))?;
        return Ok(Some((Manifest::from_json(&text, &origin)?, origin)));
    }
    if !options.streams.is_empty() {
        return Ok(Some((
            Manifest::Streams(options.streams.clone()),
            "--streams".into(),
        )));
    }
    let held_out = config
        .valid_dataset
        .as_ref()
        .map(|v| v.streams.clone())
        .unwrap_or_default();
    Ok((!held_out.is_empty()).then(|| (Manifest::Streams(held_out), "valid_dataset.streams".into())))
}

/// The model folder of `--checkpoint`/`--baseline`.
pub fn checkpoint_model(dir: &Path) -> Result<PathBuf> {
    if dir.join("config.json").is_file() {
        return Ok(dir.to_path_buf());
    }
    let latest = trainer::Checkpoints::new(dir)
        .latest()
        .with_context(|| format!("cannot list the checkpoints in {}", dir.display()))?;
    latest.map(|c| c.dir).ok_or_else(|| {
        Error::Invalid(format!(
            "{} is neither a model folder (no config.json) nor a folder of step-N checkpoints",
            dir.display()
        ))
    })
}

/// The run config of one model's evaluation: its weights, `k` samples, its folder's journal, every Stream's
/// rows once (the selection picks from them), one worker, 64 rollouts at once unless the config says.
fn eval_config(mut config: RunConfig, model: &Path, dir: &Path, samples: u32) -> RunConfig {
    config.model.path = model.display().to_string();
    config.gconfig.n_samples = samples;
    config.rollout.journal_dir = dir.join("journal").display().to_string();
    config.rollout.n_workers = 1;
    config.rollout.worker_index = 0;
    config.econfig.arena_mixture_epoch_size = 0;
    config.train_dataset.batch_size = 1;
    config.train_dataset.drop_last = false;
    config.valid_dataset = None;
    // A training step's worth of rollouts would be `k` here (one row per batch); the reference's evaluation
    // recipe runs 64 at once.
    config.rollout.max_concurrent_rollouts.get_or_insert(64);
    config
}

/// Records which checkpoint `dir` evaluates, or refuses when it holds another's evaluation.
fn claim(dir: &Path, model: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let model =
        std::fs::canonicalize(model).with_context(|| format!("cannot resolve {}", model.display()))?;
    let path = dir.join("checkpoint.txt");
    match std::fs::read_to_string(&path) {
        Ok(text) if Path::new(text.trim()) == model => Ok(()),
        Ok(text) => Err(Error::Invalid(format!(
            "{} holds an evaluation of {}, not of {}; give another --out",
            dir.display(),
            text.trim(),
            model.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            crate::fsutil::write_private(&path, format!("{}\n", model.display()).as_bytes())
                .with_context(|| format!("cannot write {}", path.display()))
        }
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// One model's result lines, how many samples ran now, and the workflow's `eval-rollout/` records.
type Evaluated = (Vec<ResultLine>, usize, StepMetrics);

/// Evaluates one model into `<out>/<label>`.
async fn evaluate_one(
    label: &str,
    checkpoint: &Path,
    config: RunConfig,
    env: &Env,
    options: &EvalOptions,
    manifest: &Option<(Manifest, String)>,
    engine: Option<EngineHandle>,
) -> Result<Evaluated> {
    let model = checkpoint_model(checkpoint)?;
    let dir = options.out.join(label);
    claim(&dir, &model)?;
    let config = eval_config(config, &model, &dir, options.samples);
    tracing::info!(%label, model = %model.display(), out = %dir.display(), "evaluating");
    let mut run = setup(config, env, engine).await?;
    collect_finished_tasks(&mut run);
    let result = run_selection(&run, &dir, label, manifest).await;
    finish(&run).await;
    let Run { proxy, .. } = run;
    if let Err(e) = proxy.shutdown().await {
        tracing::warn!(error = %e, "stopping the rollout proxy");
    }
    result
}

/// An evaluation needs a task's result, not its trajectory: a sample whose task finished before a kill cut
/// its rollout record is launched again under the key that started that task, so an Arena that dedupes
/// launches (`econfig.arena_idempotent_launch`) answers with the finished task instead of running it again,
/// as training must (its trajectory is gone with the killed proxy). Tasks the resumed run cancelled, or
/// relaunches already under their first key (`run::leftovers`), are left as they are.
fn collect_finished_tasks(run: &mut Run) {
    if !run.config.econfig.arena_idempotent_launch {
        return;
    }
    let replay = &run.replay;
    let open: BTreeSet<SampleKey> = replay
        .open_tasks
        .iter()
        .filter_map(|t| replay.task_launches.get(t).map(|(key, _)| *key))
        .collect();
    let Some(wf) = Arc::get_mut(&mut run.workflow) else {
        return;
    };
    for (key, &answered) in &replay.answered_launches {
        if answered == 0
            || replay.rollouts.contains_key(key)
            || open.contains(key)
            || wf.resume_keys.contains_key(key)
        {
            continue;
        }
        // The key `Workflow::launch_key` gave the sample's last launch, when one fewer had been answered.
        let last = match answered - 1 {
            0 => format!("{}-{key}", wf.run_id),
            n => format!("{}-{key}-r{n}", wf.run_id),
        };
        wf.resume_keys.insert(*key, last);
    }
}

/// The selected rows: from each healthy Stream's rows, in the config's order.
fn select(run: &Run, manifest: &Option<(Manifest, String)>) -> Result<Vec<PromptRow>> {
    let streams: Vec<(String, Vec<PromptRow>)> = run
        .workflow
        .streams
        .iter()
        .map(|s| {
            let name = s.config.name.clone();
            let rows = run.rows.iter().filter(|r| r.stream == name).cloned().collect();
            (name, rows)
        })
        .collect();
    match manifest {
        Some((m, origin)) => m.select(&streams, origin),
        None => Ok(streams.into_iter().flat_map(|(_, rows)| rows).collect()),
    }
}

/// Runs every selected task's group, appending each group's lines to `results.jsonl` as it finishes.
async fn run_selection(
    run: &Run,
    dir: &Path,
    label: &str,
    manifest: &Option<(Manifest, String)>,
) -> Result<Evaluated> {
    let rows = select(run, manifest)?;
    if rows.is_empty() {
        return Err(Error::Invalid("the selection holds no task to evaluate".into()));
    }
    let mut results = ResultsFile::open(&dir.join("results.jsonl"))?;
    let done = &run.replay.rollouts;
    let k = run.workflow.n_samples;
    let bar = phase_bar(
        run.config.metrics.progress,
        label,
        rows.len() as u64 * u64::from(k),
    );
    bar.set_position(done.keys().filter(|key| key.eval && key.step == 0).count() as u64);
    let mut pending: FuturesUnordered<_> = rows
        .iter()
        .enumerate()
        .map(|(i, row)| {
            let wf = Arc::clone(&run.workflow);
            async move { wf.run_group(0, i as u32, row, Scope::EvalRollout, done).await }
        })
        .collect();
    let mut ran = 0;
    let mut metrics = StepMetrics::default();
    while let Some(group) = pending.next().await {
        let group = group?;
        let rule = run
            .workflow
            .streams
            .iter()
            .find(|s| s.config.name == group.row.stream);
        let lines: Vec<ResultLine> = group
            .records
            .iter()
            .map(|r| ResultLine::of(r, rule.map(|s| &s.rule)))
            .collect();
        ran += group
            .records
            .iter()
            .filter(|r| !done.contains_key(&r.key))
            .count();
        bar.inc(
            group
                .records
                .iter()
                .filter(|r| !done.contains_key(&r.key))
                .count() as u64,
        );
        metrics.extend(group.metrics.iter());
        // The reference's group metrics (`eval-rollout/pass@k`, `group_pass_<c>`, per domain and Stream).
        let (_, judged) = run
            .workflow
            .judge(&group, &DynamicFilter::new(), Scope::EvalRollout);
        metrics.extend(judged.iter());
        results.append(lines)?;
    }
    bar.finish_and_clear();
    let keys: BTreeSet<String> = (0..rows.len())
        .flat_map(|g| (0..k).map(move |s| format!("e0g{g}:{s}")))
        .collect();
    let lines = results
        .lines()
        .iter()
        .filter(|l| keys.contains(&l.key))
        .cloned()
        .collect();
    Ok((lines, ran, metrics))
}

/// Writes `report.txt`, `eval.png` and the metric records, and returns the summary.
async fn write_report(
    config: &RunConfig,
    env: &Env,
    options: &EvalOptions,
    figures: &Figures,
    mut metrics: StepMetrics,
    ran: (usize, usize),
) -> Result<EvalSummary> {
    let out = &options.out;
    let table = figures.table();
    let report = out.join("report.txt");
    std::fs::write(&report, &table).with_context(|| format!("cannot write {}", report.display()))?;
    let png = out.join("eval.png");
    crate::eval::plot::draw(&png, figures)?;
    let sink = MetricsSink::open(
        &out.join("metrics"),
        config.metrics.jsonl,
        config.metrics.tensorboard,
        Some(0),
    )?;
    // The experiment trackers get the evaluation as one step, with its plot and its counts; their state lives
    // in the output folder, so each evaluation is a tracker run of its own.
    let trackers =
        crate::observe::trackers::TrackerSettings::resolve(config, env, &config.secrets(env), out)?;
    let trackers = if trackers.is_empty() {
        None
    } else {
        Some(crate::observe::trackers::Trackers::start(
            &trackers,
            out,
            &out.join("metrics"),
            None,
        )?)
    };
    let mut sink = sink.with_trackers(trackers, false);
    metrics.merge(&figures.metrics());
    sink.write_step(0, &metrics)?;
    let counts = serde_json::json!({"candidate_tasks": ran.0, "baseline_tasks": ran.1, "samples": figures.k});
    sink.close_trackers(Some(&png), &counts).await;
    Ok(EvalSummary {
        figures: figures.clone(),
        table,
        png,
        out: out.clone(),
        ran,
    })
}
