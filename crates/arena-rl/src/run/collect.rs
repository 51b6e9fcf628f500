//! One step's rollouts: the step's rows, every group of them run through the workflow, and the groups'
//! fates counted into the step's metrics; and what a finished run reports.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use reward_routing::{DynamicFilter, Group, Scope};

use super::Run;
use crate::error::Result;
use crate::journal::{RolloutRecord, SampleKey, Verdict};
use crate::observe::{StepMetrics, phase_bar};
use crate::resolve::{RowCursor, seed_of};
use crate::workflow::{GroupFate, GroupRun};

/// One step's collected groups.
pub struct Collected {
    /// The step.
    pub step: u64,
    /// Its groups.
    pub groups: Vec<GroupRun>,
    /// Wall time of the rollouts.
    pub seconds: f64,
}

impl Collected {
    /// The accepted groups with their samples' records, for the batch and the advantages.
    pub(crate) fn accepted_with_records<'a>(
        &'a self,
        accepted: &[(Group, usize)],
    ) -> Vec<(Group, &'a [RolloutRecord])> {
        accepted
            .iter()
            .map(|(g, i)| (g.clone(), self.groups[*i].records.as_slice()))
            .collect()
    }
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Steps trained by this process.
    pub steps_trained: u64,
    /// Steps the run resumed at.
    pub resumed_at: u64,
    /// The metrics directory.
    pub metrics_dir: PathBuf,
    /// The reward curve, if drawn.
    pub reward_curve: Option<PathBuf>,
    /// The newest checkpoint, if any.
    pub checkpoint: Option<PathBuf>,
    /// `(step, rollout/reward)` of every step.
    pub rewards: Vec<(u64, f64)>,
    /// Rejected groups by reason, over the whole run.
    pub rejected_groups: BTreeMap<String, u64>,
    /// Accepted groups over the whole run.
    pub accepted_groups: u64,
    /// Routes and tasks cleaned at start.
    pub cleaned: (usize, usize),
}

impl Run {
    /// Total training steps: `actor.total_train_steps`, else one pass over the rows.
    pub fn total_steps(&self) -> u64 {
        self.config
            .actor
            .total_train_steps
            .unwrap_or(self.train_cursor().batches_per_epoch().max(1))
    }

    /// Which rows each training step rolls out (`train_dataset`: batch size, shuffle, drop_last).
    pub fn train_cursor(&self) -> RowCursor {
        let d = &self.config.train_dataset;
        let seed = seed_of(&format!(
            "{}/{}",
            self.config.experiment_name, self.config.trial_name
        ));
        RowCursor::new(
            self.rows.len(),
            d.batch_size as usize,
            d.shuffle,
            d.drop_last,
            seed,
        )
    }

    /// The rows each evaluation rolls out: the first batch of `valid_dataset` (one row without it).
    fn eval_cursor(&self) -> RowCursor {
        let (batch, drop_last) = self
            .config
            .valid_dataset
            .as_ref()
            .map_or((1, true), |d| (d.batch_size as usize, d.drop_last));
        RowCursor::new(self.rows.len(), batch, false, drop_last, 0)
    }

    /// Runs every group of step `step` (samples already journaled are reused).
    pub async fn collect(
        &self,
        step: u64,
        scope: Scope,
        done: &BTreeMap<SampleKey, RolloutRecord>,
    ) -> Result<Collected> {
        let started = Instant::now();
        let (cursor, cursor_step) = match scope {
            Scope::EvalRollout => (self.eval_cursor(), 0),
            Scope::Rollout => (self.train_cursor(), step),
        };
        let rows = cursor.step_rows(&self.rows, cursor_step);
        let label = if scope == Scope::EvalRollout {
            "eval"
        } else {
            "rollouts"
        };
        let bar = phase_bar(
            self.config.metrics.progress,
            label,
            (rows.len() * self.workflow.n_samples as usize) as u64,
        );
        bar.set_message(format!("step {step}"));
        let futures = rows.iter().enumerate().map(|(g, row)| {
            let wf = self.workflow.clone();
            let bar = bar.clone();
            async move {
                let run = wf.run_group(step, g as u32, row, scope, done).await?;
                bar.inc(run.records.len() as u64);
                Ok::<_, crate::Error>(run)
            }
        });
        let groups = futures::future::try_join_all(futures).await?;
        bar.finish_and_clear();
        Ok(Collected {
            step,
            groups,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Judges every collected group, records the step's group metrics and mean reward, and returns the
    /// accepted groups with their index in `collected`; rejections are also counted into `rejected`.
    pub(crate) fn count_groups(
        &self,
        collected: &Collected,
        scope: Scope,
        filter: &DynamicFilter,
        metrics: &mut StepMetrics,
        rejected: &mut BTreeMap<String, u64>,
    ) -> Vec<(Group, usize)> {
        let mut accepted = Vec::new();
        let prefix = scope.as_str();
        let mut rewards = Vec::new();
        let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
        for (i, g) in collected.groups.iter().enumerate() {
            metrics.extend(g.metrics.iter());
            rewards.extend(g.records.iter().filter_map(|r| match r.verdict {
                Verdict::Reward { reward } => Some(reward),
                _ => None,
            }));
            let (fate, m) = self.workflow.judge(g, filter, scope);
            metrics.extend(m.iter());
            match fate {
                GroupFate::Accepted(group) => accepted.push((group, i)),
                GroupFate::Rejected { reason } => {
                    *reasons.entry(reason.clone()).or_default() += 1;
                    *rejected.entry(reason).or_default() += 1;
                }
            }
        }
        for (reason, n) in reasons {
            metrics.set(&format!("{prefix}/group_rejected/{reason}"), n as f64);
        }
        let n = collected.groups.len().max(1) as f64;
        metrics.set(&format!("{prefix}/groups_accepted"), accepted.len() as f64);
        metrics.set(
            &format!("{prefix}/groups_rejected"),
            (collected.groups.len() - accepted.len()) as f64,
        );
        metrics.set(&format!("{prefix}/group_accept_rate"), accepted.len() as f64 / n);
        if !rewards.is_empty() {
            metrics.set(
                &format!("{prefix}/reward"),
                rewards.iter().sum::<f64>() / rewards.len() as f64,
            );
        }
        accepted
    }
}
