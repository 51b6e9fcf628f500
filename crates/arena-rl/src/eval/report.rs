//! What a person reads: the terminal table, and the same figures as metric records for the run's sinks.

use std::fmt::Write as _;

use super::stats::{Difference, GroupKey, Interval, Summary};
use crate::observe::StepMetrics;

/// An evaluation's figures: the checkpoint's, the baseline's and their differences.
#[derive(Debug, Clone)]
pub struct Figures {
    /// The samples per task (`k` of pass@k).
    pub k: u64,
    /// The checkpoint's groups.
    pub candidate: Vec<(GroupKey, Summary)>,
    /// The baseline's groups, with `--baseline`.
    pub baseline: Option<Vec<(GroupKey, Summary)>>,
    /// Checkpoint minus baseline, per group both have.
    pub differences: Vec<(GroupKey, Option<Difference>)>,
}

fn opt(v: Option<f64>, width: usize) -> String {
    v.map_or_else(|| format!("{:>width$}", "-"), |v| format!("{v:>width$.3}"))
}

fn rate(s: &Summary) -> String {
    match (s.pass_rate, s.interval) {
        (Some(p), Some(Interval { lo, hi })) => format!("{p:.3} [{lo:.3}, {hi:.3}]"),
        _ => "-".to_string(),
    }
}

fn signed(d: &Option<Difference>) -> String {
    match d {
        Some(d) => format!(
            "{:+.3} [{:+.3}, {:+.3}]",
            d.estimate, d.interval.lo, d.interval.hi
        ),
        None => "-".to_string(),
    }
}

impl Figures {
    /// The table: one row per group (all, each Stream, each domain) with tasks, scored samples, excluded
    /// samples, the pass rate with its Wilson interval, the mean reward and pass@k; with a baseline, its pass
    /// rate and the difference with Newcombe's interval.
    pub fn table(&self) -> String {
        let width = self
            .candidate
            .iter()
            .map(|(k, _)| k.to_string().len())
            .max()
            .unwrap_or(3)
            .max(5);
        let pass_k = format!("pass@{}", self.k);
        let mut out = format!(
            "{:<width$} {:>5} {:>6} {:>5}  {:<22} {:>11} {:>8}",
            "group", "tasks", "n", "excl", "pass rate [95% CI]", "mean reward", pass_k
        );
        if self.baseline.is_some() {
            let _ = write!(
                out,
                "  {:<22}  {:<24}",
                "baseline [95% CI]", "difference [95% CI]"
            );
        }
        out.push('\n');
        for (key, s) in &self.candidate {
            let _ = write!(
                out,
                "{:<width$} {:>5} {:>6} {:>5}  {:<22} {} {}",
                key.to_string(),
                s.tasks,
                s.n,
                s.excluded,
                rate(s),
                opt(s.mean_reward, 11),
                opt(s.pass_at_k, 8),
            );
            if let Some(base) = &self.baseline {
                let b = base.iter().find(|(k, _)| k == key).map(|(_, b)| rate(b));
                let d = self.differences.iter().find(|(k, _)| k == key).map(|(_, d)| d);
                let _ = write!(
                    out,
                    "  {:<22}  {:<24}",
                    b.unwrap_or_else(|| "-".into()),
                    d.map_or_else(|| "-".into(), signed)
                );
            }
            out.push('\n');
        }
        out
    }

    /// The figures as metric records: `eval/<group>/{n, excluded, pass_rate, pass_rate_lo, pass_rate_hi,
    /// mean_reward, pass@k}`, and with a baseline `eval/<group>/{baseline_pass_rate, diff, diff_lo,
    /// diff_hi}`.
    pub fn metrics(&self) -> StepMetrics {
        let mut m = StepMetrics::default();
        let mut put = |group: &GroupKey, name: &str, v: Option<f64>| {
            if let Some(v) = v {
                m.set(&format!("eval/{group}/{name}"), v);
            }
        };
        for (key, s) in &self.candidate {
            put(key, "n", Some(s.n as f64));
            put(key, "excluded", Some(s.excluded as f64));
            put(key, "pass_rate", s.pass_rate);
            put(key, "pass_rate_lo", s.interval.map(|i| i.lo));
            put(key, "pass_rate_hi", s.interval.map(|i| i.hi));
            put(key, "mean_reward", s.mean_reward);
            put(key, &format!("pass@{}", self.k), s.pass_at_k);
        }
        for (key, s) in self.baseline.iter().flatten() {
            put(key, "baseline_pass_rate", s.pass_rate);
        }
        for (key, d) in &self.differences {
            put(key, "diff", d.map(|d| d.estimate));
            put(key, "diff_lo", d.map(|d| d.interval.lo));
            put(key, "diff_hi", d.map(|d| d.interval.hi));
        }
        m
    }
}
