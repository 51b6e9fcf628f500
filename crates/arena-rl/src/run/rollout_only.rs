//! The rollout-only mode: collects the steps' rollouts (no training), and writes every finished rollout, with
//! its group's fate and its advantage, as one JSON line to `<run dir>/rollouts.jsonl`.

use std::collections::BTreeMap;
use std::io::Write as _;

use reward_routing::{DynamicFilter, Scope};
use stream_config::{Env, RunConfig};

use super::serving::EngineHandle;
use super::{Collected, Run, RunSummary, finish, save_config, setup};
use crate::error::{Context as _, Result};
use crate::journal::SampleKey;
use crate::observe::{MetricsSink, StepMetrics};
use crate::run::start_trackers;

/// Sets the run up, writes `rollouts.jsonl`, and closes the run's routes.
pub async fn rollout_only(config: RunConfig, env: &Env, engine: Option<EngineHandle>) -> Result<RunSummary> {
    let run = setup(config, env, engine).await?;
    let result = rollout_inner(&run).await;
    finish(&run).await;
    result
}

async fn rollout_inner(run: &Run) -> Result<RunSummary> {
    let config = &run.config;
    let paths = &run.paths;
    save_config(run)?;
    let out_path = paths.run_dir.join("rollouts.jsonl");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&out_path)
        .with_context(|| format!("cannot create {}", out_path.display()))?;
    let mut sink = MetricsSink::open(
        &paths.metrics,
        config.metrics.jsonl,
        config.metrics.tensorboard,
        None,
    )?
    .with_trackers(start_trackers(run, None)?, false);
    let filter = DynamicFilter::new();
    let mut rejected = BTreeMap::new();
    let mut accepted_total = 0;
    for k in 0..run.total_steps() {
        let collected = run.collect(k, Scope::Rollout, &run.replay.rollouts).await?;
        let mut metrics = StepMetrics::default();
        let accepted = run.count_groups(&collected, Scope::Rollout, &filter, &mut metrics, &mut rejected);
        accepted_total += accepted.len() as u64;
        let groups = collected.accepted_with_records(&accepted);
        let advantages = run
            .reward
            .advantages(&groups.iter().map(|(g, _)| g.clone()).collect::<Vec<_>>())
            .context("computing advantages")?;
        let mut adv_of: BTreeMap<SampleKey, f64> = BTreeMap::new();
        for ((_, records), advs) in groups.iter().zip(&advantages) {
            for a in advs {
                if let Some(r) = records.get(a.index) {
                    adv_of.insert(r.key, a.advantage);
                }
            }
        }
        write_lines(&mut out, &collected, &adv_of).context("cannot write rollouts.jsonl")?;
        sink.write_step(k, &metrics)?;
        sink.durable_through(k);
    }
    out.sync_all()
        .with_context(|| format!("cannot sync {}", out_path.display()))?;
    tracing::info!(path = %out_path.display(), "rollouts exported");
    let curve = if config.metrics.reward_curve {
        Some(sink.draw_curve()?)
    } else {
        None
    };
    let summary = RunSummary {
        run_dir: paths.run_dir.clone(),
        steps_trained: 0,
        resumed_at: 0,
        metrics_dir: paths.metrics.clone(),
        reward_curve: curve,
        checkpoint: None,
        rewards: sink.rewards().to_vec(),
        rejected_groups: rejected,
        accepted_groups: accepted_total,
        cleaned: run.cleaned,
    };
    sink.close_trackers(summary.reward_curve.as_deref(), &summary.to_tracker_json())
        .await;
    Ok(summary)
}

/// One line per finished rollout of the step.
fn write_lines(
    out: &mut std::fs::File,
    collected: &Collected,
    adv_of: &BTreeMap<SampleKey, f64>,
) -> std::io::Result<()> {
    for g in &collected.groups {
        for r in &g.records {
            let line = serde_json::json!({
                "key": r.key.to_string(),
                "stream": r.stream,
                "data_id": r.data_id,
                "task_type": r.task_type,
                "task_id": r.task_id,
                "verdict": r.verdict,
                "trained": adv_of.contains_key(&r.key),
                "advantage": adv_of.get(&r.key),
                "policy_version": r.policy_version,
                "trajectories": r.trajectories,
            });
            writeln!(out, "{line}")?;
        }
    }
    Ok(())
}
