//! One step's rollouts: the step's rows, every group of them run through the workflow, and the groups'
//! fates counted into the step's metrics; and what a finished run reports.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use reward_routing::{DynamicFilter, Group, Scope};

use super::Run;
use crate::error::Result;
use crate::journal::{Entry, RolloutRecord, SampleKey, Verdict};
use crate::observe::{StepMetrics, phase_bar};
use crate::resolve::{PromptRow, RowCursor, seed_of};
use crate::workflow::{GroupFate, GroupRun};

/// One step's collected groups.
pub struct Collected {
    /// The step.
    pub step: u64,
    /// Its groups: the batch's, then dynamic sampling's extra draws, in draw order.
    pub groups: Vec<GroupRun>,
    /// How many of `groups` the step's batch scheduled (the rest are extra draws).
    pub scheduled: usize,
    /// Rounds of launches: 1, plus one per round of extra draws.
    pub rounds: u32,
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

impl RunSummary {
    /// What the experiment trackers record as the run's summary.
    pub fn to_tracker_json(&self) -> serde_json::Value {
        serde_json::json!({
            "steps_trained": self.steps_trained,
            "resumed_at": self.resumed_at,
            "final_reward": self.rewards.last().map(|(_, r)| *r),
            "accepted_groups": self.accepted_groups,
            "rejected_groups": self.rejected_groups,
            "checkpoint": self.checkpoint.as_ref().map(|p| p.display().to_string()),
        })
    }
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

    /// The rows evaluations draw from: the held-out streams' rows (`valid_dataset.streams`), else the
    /// training rows.
    fn eval_pool(&self) -> &[PromptRow] {
        if self.eval_rows.is_empty() {
            &self.rows
        } else {
            &self.eval_rows
        }
    }

    /// The rows each evaluation rolls out: the first `valid_dataset.batch_size` of [`Run::eval_pool`] (one
    /// row without it).
    fn eval_cursor(&self) -> RowCursor {
        let (batch, drop_last) = self
            .config
            .valid_dataset
            .as_ref()
            .map_or((1, true), |d| (d.batch_size as usize, d.drop_last));
        RowCursor::new(self.eval_pool().len(), batch, false, drop_last, 0)
    }

    /// Runs every group of step `step` (samples already journaled are reused). A training step whose batch
    /// leaves fewer than its size of informative groups draws more prompts ([`extra_draws`]) until it
    /// has them or `rollout.max_oversample_factor` times the batch was launched; each extra draw is journaled
    /// with its group index before its rollouts start, and a resumed run redraws the same rows.
    pub async fn collect(
        &self,
        step: u64,
        scope: Scope,
        done: &BTreeMap<SampleKey, RolloutRecord>,
    ) -> Result<Collected> {
        let started = Instant::now();
        let (cursor, cursor_step, pool) = match scope {
            Scope::EvalRollout => (self.eval_cursor(), 0, self.eval_pool()),
            Scope::Rollout => (self.train_cursor(), step, self.rows.as_slice()),
        };
        let rows = cursor.step_rows(pool, cursor_step);
        let scheduled = rows.len();
        let label = if scope == Scope::EvalRollout {
            "eval"
        } else {
            "rollouts"
        };
        let per_group = u64::from(self.workflow.n_samples);
        let bar = phase_bar(self.config.metrics.progress, label, scheduled as u64 * per_group);
        bar.set_message(format!("step {step}"));
        let mut groups = self.run_groups(step, 0, &rows, scope, done, &bar).await?;
        let rounds = if scope == Scope::Rollout {
            1 + self
                .draw_more(step, &cursor, scheduled, &mut groups, done, &bar)
                .await?
        } else {
            1
        };
        bar.finish_and_clear();
        Ok(Collected {
            step,
            groups,
            scheduled,
            rounds,
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// Dynamic sampling: rounds of extra draws for training step `step` until its `batch` groups are
    /// informative or the budget is spent. Returns the rounds run.
    async fn draw_more(
        &self,
        step: u64,
        cursor: &RowCursor,
        batch: usize,
        groups: &mut Vec<GroupRun>,
        done: &BTreeMap<SampleKey, RolloutRecord>,
        bar: &indicatif::ProgressBar,
    ) -> Result<u32> {
        let per_group = u64::from(self.workflow.n_samples);
        let mut rounds = 0;
        let (mut informative, mut judged) = (0, 0);
        loop {
            // Only the groups added since the last round are judged; the earlier ones keep their fate.
            informative += groups[judged..]
                .iter()
                .filter(|g| {
                    let (fate, _) = self.workflow.judge(g, &DynamicFilter::new(), Scope::Rollout);
                    matches!(fate, GroupFate::Accepted(_))
                })
                .count();
            judged = groups.len();
            let factor = self.config.rollout.max_oversample_factor;
            let n = extra_draws(batch, groups.len(), informative, factor);
            if n == 0 {
                return Ok(rounds);
            }
            let extra: Vec<PromptRow> = cursor
                .extra_indices(step, groups.len() - batch, n)
                .into_iter()
                .filter_map(|i| self.rows.get(i).cloned())
                .collect();
            if extra.is_empty() {
                return Ok(rounds);
            }
            let first = groups.len();
            // The round's draws go to the journal in one write and one fsync, all before any of their
            // rollouts starts (a kill may leave a prefix of them, which the resumed run completes).
            let mut draws = Vec::new();
            for (j, row) in extra.iter().enumerate() {
                draws.extend(self.draw_entry(step, (first + j) as u32, row)?);
            }
            self.workflow.journal.append_all(&draws)?;
            rounds += 1;
            bar.inc_length(extra.len() as u64 * per_group);
            bar.set_message(format!("step {step}, extra round {rounds}"));
            groups.extend(
                self.run_groups(step, first, &extra, Scope::Rollout, done, bar)
                    .await?,
            );
        }
    }

    /// The entry that journals extra draw `group` of `step` before its rollouts start, unless the journal
    /// holds it already; a draw the journal holds must name the same row.
    fn draw_entry(&self, step: u64, group: u32, row: &PromptRow) -> Result<Option<Entry>> {
        let journal = &self.workflow.journal;
        match self.replay.draws.get(&(step, group)) {
            Some((stream, data_id)) if *stream == row.stream && *data_id == row.row.data_id => Ok(None),
            Some((stream, data_id)) => Err(crate::Error::JournalMismatch {
                path: journal.path().to_path_buf(),
                what: "draw",
                key: format!("s{step}g{group}"),
                journaled: format!("{stream}/{data_id}"),
                drawn: format!("{}/{}", row.stream, row.row.data_id),
            }),
            None => Ok(Some(Entry::Draw {
                step,
                group,
                stream: row.stream.clone(),
                data_id: row.row.data_id.clone(),
            })),
        }
    }

    /// Runs the groups of `rows` as groups `first..` of step `step`, concurrently.
    async fn run_groups(
        &self,
        step: u64,
        first: usize,
        rows: &[PromptRow],
        scope: Scope,
        done: &BTreeMap<SampleKey, RolloutRecord>,
        bar: &indicatif::ProgressBar,
    ) -> Result<Vec<GroupRun>> {
        let futures = rows.iter().enumerate().map(|(g, row)| {
            let wf = self.workflow.clone();
            let bar = bar.clone();
            async move {
                let run = wf.run_group(step, (first + g) as u32, row, scope, done).await?;
                bar.inc(run.records.len() as u64);
                Ok::<_, crate::Error>(run)
            }
        });
        futures::future::try_join_all(futures).await
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
        if let Some(nll) = sampled_nll(collected) {
            metrics.set(&format!("{prefix}/sampled_nll"), nll);
        }
        metrics.set(&format!("{prefix}/groups_drawn"), collected.groups.len() as f64);
        metrics.set(
            &format!("{prefix}/groups_extra"),
            (collected.groups.len() - collected.scheduled) as f64,
        );
        metrics.set(&format!("{prefix}/draw_rounds"), f64::from(collected.rounds));
        if !rewards.is_empty() {
            metrics.set(
                &format!("{prefix}/reward"),
                rewards.iter().sum::<f64>() / rewards.len() as f64,
            );
        }
        accepted
    }
}

/// The mean `-log p` of every token the policy sampled in a step's rollouts, trained or not: a Monte Carlo
/// estimate of the sampling distribution's per-token entropy, on every step (`train/entropy` needs a step
/// that trains). `None` without sampled tokens.
fn sampled_nll(collected: &Collected) -> Option<f64> {
    let (mut sum, mut n) = (0.0f64, 0u64);
    for t in collected
        .groups
        .iter()
        .flat_map(|g| g.records.iter())
        .flat_map(|r| r.trajectories.iter())
    {
        for (&m, &lp) in t.loss_mask.iter().zip(&t.logprobs) {
            if m != 0 && lp.is_finite() {
                sum -= f64::from(lp);
                n += 1;
            }
        }
    }
    (n > 0).then(|| sum / n as f64)
}

/// How many prompts dynamic sampling draws next, given the batch's size, the groups drawn so far and how many
/// of them are informative: none once the batch is full of informative groups or the budget
/// (`ceil(batch * factor)` groups, `factor` being `rollout.max_oversample_factor`) is spent; else the missing
/// groups scaled by the acceptance seen so far (so that one round usually fills the step), within the budget.
pub(crate) fn extra_draws(batch: usize, drawn: usize, informative: usize, factor: f64) -> usize {
    let budget = (batch as f64 * factor).ceil() as usize;
    if informative >= batch || drawn >= budget || batch == 0 {
        return 0;
    }
    let missing = batch - informative;
    let wanted = (missing * drawn).div_ceil(informative.max(1));
    wanted.max(missing).min(budget - drawn)
}

#[cfg(test)]
mod tests;
