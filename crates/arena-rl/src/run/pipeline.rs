//! The training loop. Rollouts of step `k` start once the policy has reached version
//! `k - rollout.max_head_offpolicyness`; step `k` trains on them once they are all journaled; the new weights
//! reach the engine and the version advances; every `eval_every` steps the policy is evaluated.
//!
//! A producer task starts each step's collection as soon as the off-policyness bound allows; the consumer
//! trains the steps in order. The training step runs on a blocking thread ([`on_blocking`]). A step's metrics
//! are written before its checkpoint, and a resumed run forgets the metrics of the steps it trains again, so
//! each step appears once in `metrics.jsonl` and TensorBoard.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use reward_routing::{DynamicFilter, Scope};
use stream_config::{Env, RunConfig};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::checkpoint::{
    CheckpointMeta, check_resume, latest_checkpoint, model_fingerprint, oldest_needed_segment,
    save_checkpoint,
};
use super::setup::model_dir;
use super::{Collected, Plugins, Run, RunSummary, finish, save_config, setup};
use crate::error::{Context as _, Result};
use crate::journal::{Entry, RolloutRecord, SampleKey};
use crate::observe::{MetricsSink, StepMetrics, phase_bar};
use crate::run::start_trackers;
use crate::train::{FrozenPolicy, TrainStep, build_batch};

/// Sets the run up and trains it; the run's routes are closed whatever happens.
pub async fn train(config: RunConfig, env: &Env, plugins: Plugins) -> Result<RunSummary> {
    let Plugins { engine, step } = plugins;
    let run = Arc::new(setup(config, env, engine).await?);
    let result = TrainingLoop::start(run.clone(), step).await;
    let result = match result {
        Ok(training) => training.run().await,
        Err(e) => Err(e),
    };
    finish(&run).await;
    result
}

/// Runs `f` on the training step on a blocking thread, handing the step back afterwards.
async fn on_blocking<T: Send + 'static>(
    step: &mut Box<dyn TrainStep>,
    what: &str,
    f: impl FnOnce(&mut dyn TrainStep) -> Result<T> + Send + 'static,
) -> Result<T> {
    let mut moved: Box<dyn TrainStep> = std::mem::replace(step, Box::new(FrozenPolicy::default()));
    let (returned, out) = tokio::task::spawn_blocking(move || {
        let out = f(moved.as_mut());
        (moved, out)
    })
    .await
    .context(what.to_string())?;
    *step = returned;
    out
}

/// The consumer side of the training loop: the training step, the policy version, and what the run has done
/// so far.
struct TrainingLoop {
    run: Arc<Run>,
    step: Box<dyn TrainStep>,
    model_dir: PathBuf,
    fingerprint: String,
    total: u64,
    resumed_at: u64,
    version: u64,
    checkpoint: Option<PathBuf>,
    done: Arc<BTreeMap<SampleKey, RolloutRecord>>,
    rejected: BTreeMap<String, u64>,
    accepted_total: u64,
    trained: u64,
    warned_idle: bool,
}

impl TrainingLoop {
    /// Saves the redacted config, begins the training step and resumes from the newest checkpoint.
    async fn start(run: Arc<Run>, mut step: Box<dyn TrainStep>) -> Result<Self> {
        save_config(&run)?;
        let model_dir = model_dir(&run.config)?;
        let fingerprint = model_fingerprint(&model_dir)?;
        let total = run.total_steps();
        on_blocking(&mut step, "the training step while starting", move |s| {
            s.begin(total)
        })
        .await?;
        let mut training = Self {
            done: Arc::new(run.replay.rollouts.clone()),
            run,
            step,
            model_dir,
            fingerprint,
            total,
            resumed_at: 0,
            version: 0,
            checkpoint: None,
            rejected: BTreeMap::new(),
            accepted_total: 0,
            trained: 0,
            warned_idle: false,
        };
        training.resume().await?;
        training
            .run
            .workflow
            .policy_version
            .store(training.version, Ordering::SeqCst);
        Ok(training)
    }

    async fn resume(&mut self) -> Result<()> {
        let Some((ckpt, meta)) = latest_checkpoint(&self.run.paths.checkpoints)? else {
            return Ok(());
        };
        check_resume(
            &ckpt,
            &meta,
            &self.model_dir,
            &self.fingerprint,
            &self.run.workflow.journal,
        )?;
        let weights = self.step.load(&ckpt)?;
        self.run.engine.publish(weights, meta.version).await?;
        self.resumed_at = meta.data_cursor;
        self.version = meta.version;
        tracing::info!(checkpoint = %ckpt.display(), steps = meta.steps, "resuming from checkpoint");
        self.checkpoint = Some(ckpt);
        Ok(())
    }

    /// Starts each step's collection once the step `head + 1` before it has trained.
    fn spawn_producer(
        &self,
        trained: watch::Receiver<u64>,
    ) -> (JoinHandle<()>, mpsc::Receiver<JoinHandle<Result<Collected>>>) {
        let head = u64::from(self.run.config.rollout.max_head_offpolicyness);
        let (tx, rx) = mpsc::channel(head as usize + 1);
        let run = self.run.clone();
        let done = self.done.clone();
        let (from, total) = (self.resumed_at, self.total);
        let producer = tokio::spawn(async move {
            let mut trained = trained;
            for k in from..total {
                // Bounded off-policyness: step k's rollouts wait until step k - head - 1 is trained.
                let need = k.saturating_sub(head);
                if trained.wait_for(|t| *t >= need).await.is_err() {
                    return;
                }
                let run = run.clone();
                let done = done.clone();
                let handle = tokio::spawn(async move { run.collect(k, Scope::Rollout, &done).await });
                if tx.send(handle).await.is_err() {
                    return;
                }
            }
        });
        (producer, rx)
    }

    async fn run(mut self) -> Result<RunSummary> {
        let config = &self.run.config.clone();
        let paths = self.run.paths.clone();
        let mut sink = MetricsSink::open(
            &paths.metrics,
            config.metrics.jsonl,
            config.metrics.tensorboard,
            Some(self.resumed_at),
        )?
        .with_trackers(
            start_trackers(&self.run, Some(self.resumed_at))?,
            config.metrics.trackers_at_checkpoint,
        );
        let (trained_tx, trained_rx) = watch::channel(self.resumed_at);
        let (producer, mut rx) = self.spawn_producer(trained_rx);
        let filter = DynamicFilter::new();
        let bar = phase_bar(config.metrics.progress, "training", self.total - self.resumed_at);
        while let Some(handle) = rx.recv().await {
            let collected = handle.await.context("a step's rollouts")??;
            let k = collected.step;
            let metrics = self.train_step(&collected, &filter).await?;
            // Metrics before the checkpoint: a kill between the two resumes at the earlier checkpoint, which
            // forgets this step's line and writes it again, so every step's metrics appear exactly once.
            sink.write_step(k, &metrics)?;
            // Trackers see a step once no resume can train it again: at its checkpoint, or at once when the
            // run keeps none (it then starts over).
            if self.maybe_checkpoint(k).await? || config.checkpoint.save_every == 0 {
                sink.durable_through(k);
            }
            self.run.workflow.journal.append(&Entry::Step {
                step: k,
                version: self.version,
            })?;
            self.trained += 1;
            bar.inc(1);
            let _ = trained_tx.send(k + 1);
        }
        bar.finish_and_clear();
        producer.await.context("the rollout scheduler")?;
        let curve = if config.metrics.reward_curve {
            Some(sink.draw_curve()?)
        } else {
            None
        };
        let summary = RunSummary {
            run_dir: paths.run_dir.clone(),
            steps_trained: self.trained,
            resumed_at: self.resumed_at,
            metrics_dir: paths.metrics.clone(),
            reward_curve: curve,
            checkpoint: self.checkpoint,
            rewards: sink.rewards().to_vec(),
            rejected_groups: self.rejected,
            accepted_groups: self.accepted_total,
            cleaned: self.run.cleaned,
        };
        sink.close_trackers(summary.reward_curve.as_deref(), &summary.to_tracker_json())
            .await;
        Ok(summary)
    }

    /// Trains one collected step: judge its groups, train on the accepted ones, publish the new weights and
    /// evaluate when due. Returns the step's metrics; the caller writes them, then checkpoints.
    async fn train_step(&mut self, collected: &Collected, filter: &DynamicFilter) -> Result<StepMetrics> {
        let run = self.run.clone();
        let k = collected.step;
        let mut metrics = StepMetrics::default();
        let mut accepted = run.count_groups(
            collected,
            Scope::Rollout,
            filter,
            &mut metrics,
            &mut self.rejected,
        );
        // Dynamic sampling's last round may overshoot: the step trains on its batch's worth, in draw order.
        let surplus = accepted.len().saturating_sub(collected.scheduled);
        accepted.truncate(collected.scheduled);
        metrics.set("rollout/groups_trained", accepted.len() as f64);
        metrics.set("rollout/groups_surplus", surplus as f64);
        if accepted.is_empty() {
            self.warn_idle(k, &metrics);
        }
        self.accepted_total += accepted.len() as u64;
        let mut batch = build_batch(
            &run.reward,
            run.config.actor.branch_weight,
            &collected.accepted_with_records(&accepted),
        )?;
        batch.policy_version = self.version;
        let staleness = collected
            .groups
            .iter()
            .flat_map(|g| g.records.iter())
            .map(|r| self.version.saturating_sub(r.policy_version))
            .max()
            .unwrap_or(0);
        let started = Instant::now();
        let output = on_blocking(&mut self.step, "the training step", move |s| s.train(k, &batch))
            .await
            .with_context(|| format!("training step {k}"))?;
        self.version += 1;
        run.engine.publish(output.weights, self.version).await?;
        run.workflow.policy_version.store(self.version, Ordering::SeqCst);
        for (name, value) in &output.metrics {
            metrics.set(name, *value);
        }
        metrics.set("timing/rollout_seconds", collected.seconds);
        metrics.set("timing/train_seconds", started.elapsed().as_secs_f64());
        metrics.set("policy/version", self.version as f64);
        metrics.set("policy/max_staleness", staleness as f64);
        if let Some(pool) = &run.engine.pool {
            // Policy servers the pool has marked down, and the generations moved off a failing server so
            // far: a fleet that is losing servers shows here before the run slows.
            metrics.set("policy/servers_down", pool.servers_down() as f64);
            metrics.set("policy/generations_moved", pool.generations_moved() as f64);
        }
        self.maybe_evaluate(k, &mut metrics).await?;
        tracing::info!(
            step = k,
            version = self.version,
            reward = metrics.mean("rollout/reward").unwrap_or(f64::NAN),
            accepted = accepted.len(),
            groups = collected.groups.len(),
            "step trained"
        );
        Ok(metrics)
    }

    /// Says once per run that a step trains on nothing, and why: every group rejected or dropped by the
    /// dynamic filter (equal rewards), with the knob that draws more prompts.
    fn warn_idle(&mut self, k: u64, metrics: &StepMetrics) {
        if self.warned_idle {
            return;
        }
        self.warned_idle = true;
        let reasons: Vec<String> = metrics
            .means()
            .into_iter()
            .filter_map(|(name, n)| {
                let reason = name.strip_prefix("rollout/group_rejected/")?;
                Some(format!("{reason}: {n}"))
            })
            .collect();
        tracing::warn!(
            step = k,
            reasons = %reasons.join(", "),
            max_oversample_factor = self.run.config.rollout.max_oversample_factor,
            "step {k} trains on nothing: no group of it is informative (the counts say why; all_correct and \
             all_wrong are groups whose rewards are all equal). Raise rollout.max_oversample_factor to draw \
             more prompts per step; actor.entropy_coeff and a higher actor.eps_clip_higher slow a collapse \
             of the policy's entropy (train/entropy). Said once per run; rollout/groups_trained counts every step"
        );
    }

    /// Writes the checkpoint of step `k` when `checkpoint.save_every` (or the last step) asks for one.
    /// Saves a checkpoint after step `k` when one is due; returns whether it did.
    async fn maybe_checkpoint(&mut self, k: u64) -> Result<bool> {
        let config = &self.run.config;
        let every = config.checkpoint.save_every;
        if every == 0 || (!(k + 1).is_multiple_of(every) && k + 1 != self.total) {
            return Ok(false);
        }
        // A new journal segment carries what a run resumed from this checkpoint needs (the rollouts and draws
        // of step k + 1 on: step k and its evaluation are done); the older ones are retired once the
        // checkpoint is saved and no kept checkpoint names them.
        let journal = self.run.workflow.journal.clone();
        let (journal_segment, journal_bytes) =
            tokio::task::spawn_blocking(move || journal.rotate(k + 1).and_then(|_| journal.position()))
                .await
                .context("rotating the journal")??;
        let meta = CheckpointMeta {
            steps: k + 1,
            version: self.version,
            model_path: self.model_dir.display().to_string(),
            model_fingerprint: self.fingerprint.clone(),
            data_cursor: k + 1,
            journal_bytes,
            journal_segment,
        };
        let root = self.run.paths.checkpoints.clone();
        let keep = config.checkpoint.keep_last as usize;
        let saved = on_blocking(&mut self.step, "the training step while saving", move |s| {
            save_checkpoint(&root, &meta, s, keep)
        })
        .await
        .with_context(|| format!("saving the checkpoint of step {k}"))?;
        self.checkpoint = Some(saved);
        let needed = oldest_needed_segment(&self.run.paths.checkpoints)?;
        self.run
            .workflow
            .journal
            .retire_before(needed, config.rollout.journal_keep_retired)?;
        Ok(true)
    }

    /// Evaluates the policy every `eval_every` steps, adding `eval-rollout/` metrics to the step's.
    async fn maybe_evaluate(&self, k: u64, metrics: &mut StepMetrics) -> Result<()> {
        let every = self.run.config.eval_every;
        if every == 0 || !(k + 1).is_multiple_of(every) {
            return Ok(());
        }
        let eval = self.run.collect(k, Scope::EvalRollout, &self.done).await?;
        let mut ignore = BTreeMap::new();
        self.run.count_groups(
            &eval,
            Scope::EvalRollout,
            &DynamicFilter::new(),
            metrics,
            &mut ignore,
        );
        Ok(())
    }
}
