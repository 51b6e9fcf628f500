//! The figures of an evaluation, computed from per-sample outcomes with no IO: Wilson 95% intervals of pass
//! rates, the unbiased pass@k estimator, per-Stream and per-domain aggregation, and the difference between
//! two checkpoints' pass rates with Newcombe's interval.
//!
//! A sample is scored (it passed or not, with its reward) or excluded: a rollout the reward routing rejects
//! (an Arena system failure, a local timeout) says nothing about the model and is counted apart. The intervals
//! treat the scored samples of a group as independent draws, which k samples of one task are not quite.

use std::collections::BTreeMap;

/// The 0.975 quantile of the standard normal distribution (two-sided 95%), as `scipy.stats.norm.ppf(0.975)`.
pub const Z95: f64 = 1.959_963_984_540_054;

/// A closed interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Interval {
    /// Lower bound.
    pub lo: f64,
    /// Upper bound.
    pub hi: f64,
}

/// The Wilson score interval (95%) of `successes` out of `n`; `None` without trials or with more successes
/// than trials.
pub fn wilson(successes: u64, n: u64) -> Option<Interval> {
    if n == 0 || successes > n {
        return None;
    }
    let (n, p) = (n as f64, successes as f64 / n as f64);
    let z2 = Z95 * Z95;
    let denom = 1.0 + z2 / n;
    let centre = (p + z2 / (2.0 * n)) / denom;
    let half = Z95 * (p * (1.0 - p) / n + z2 / (4.0 * n * n)).sqrt() / denom;
    Some(Interval {
        lo: (centre - half).max(0.0),
        hi: (centre + half).min(1.0),
    })
}

/// The unbiased pass@k estimator of Chen et al. (2021) for a task with `n` samples of which `c` passed:
/// `1 - C(n-c, k) / C(n, k)`, computed as `1 - prod_{i=n-c+1..=n} (1 - k/i)` so that no binomial coefficient
/// is ever formed. `None` when `k` is 0, `k > n` or `c > n`.
pub fn pass_at_k(n: u64, c: u64, k: u64) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    let kept: f64 = (n - c + 1..=n).map(|i| 1.0 - k as f64 / i as f64).product();
    Some(1.0 - kept)
}

/// The difference `a - b` of two pass rates, each `(successes, n)`, with its 95% interval.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Difference {
    /// `a`'s rate minus `b`'s.
    pub estimate: f64,
    /// Newcombe's hybrid score interval (his method 10), built from the two Wilson intervals.
    pub interval: Interval,
}

/// The difference of two independent pass rates with Newcombe's (1998) hybrid score interval; `None` when
/// either side has no trials.
pub fn difference(a: (u64, u64), b: (u64, u64)) -> Option<Difference> {
    let (wa, wb) = (wilson(a.0, a.1)?, wilson(b.0, b.1)?);
    let (pa, pb) = (a.0 as f64 / a.1 as f64, b.0 as f64 / b.1 as f64);
    let d = pa - pb;
    let below = ((pa - wa.lo).powi(2) + (wb.hi - pb).powi(2)).sqrt();
    let above = ((wa.hi - pa).powi(2) + (pb - wb.lo).powi(2)).sqrt();
    Some(Difference {
        estimate: d,
        interval: Interval {
            lo: (d - below).max(-1.0),
            hi: (d + above).min(1.0),
        },
    })
}

/// One evaluated sample.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The Stream the task came from.
    pub stream: String,
    /// The task type (`domain:` tag).
    pub domain: String,
    /// The task (its `data_id`).
    pub task: String,
    /// `Some(reward, passed)` when scored, `None` when excluded.
    pub scored: Option<(f64, bool)>,
}

/// The figures of one group of samples (all, one Stream, or one domain).
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// Distinct tasks.
    pub tasks: u64,
    /// Scored samples.
    pub n: u64,
    /// Scored samples that passed.
    pub passed: u64,
    /// Samples excluded (rejected by the reward routing).
    pub excluded: u64,
    /// `passed / n`, `None` without scored samples.
    pub pass_rate: Option<f64>,
    /// The Wilson 95% interval of the pass rate.
    pub interval: Option<Interval>,
    /// The mean reward of the scored samples.
    pub mean_reward: Option<f64>,
    /// The `k` of [`Summary::pass_at_k`].
    pub k: u64,
    /// The mean over tasks with at least `k` scored samples of their unbiased pass@k.
    pub pass_at_k: Option<f64>,
    /// Tasks left out of pass@k for having fewer than `k` scored samples.
    pub tasks_short: u64,
}

impl Summary {
    /// The figures of `samples` with pass@`k`.
    pub fn of<'a>(samples: impl IntoIterator<Item = &'a Sample>, k: u64) -> Self {
        let mut per_task: BTreeMap<(&str, &str), (u64, u64)> = BTreeMap::new();
        let (mut n, mut passed, mut excluded, mut reward_sum) = (0, 0, 0, 0.0);
        for s in samples {
            let task = per_task.entry((&s.stream, &s.task)).or_default();
            match s.scored {
                Some((reward, pass)) => {
                    n += 1;
                    passed += u64::from(pass);
                    reward_sum += reward;
                    task.0 += 1;
                    task.1 += u64::from(pass);
                }
                None => excluded += 1,
            }
        }
        let estimates: Vec<f64> = per_task
            .values()
            .filter_map(|&(tn, tc)| pass_at_k(tn, tc, k))
            .collect();
        Self {
            tasks: per_task.len() as u64,
            n,
            passed,
            excluded,
            pass_rate: (n > 0).then(|| passed as f64 / n as f64),
            interval: wilson(passed, n),
            mean_reward: (n > 0).then(|| reward_sum / n as f64),
            k,
            pass_at_k: (!estimates.is_empty())
                .then(|| estimates.iter().sum::<f64>() / estimates.len() as f64),
            tasks_short: per_task.len() as u64 - estimates.len() as u64,
        }
    }
}

/// Which samples a row of the report covers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum GroupKey {
    /// Every sample.
    All,
    /// One Stream's samples.
    Stream(String),
    /// One task type's samples, across Streams.
    Domain(String),
}

impl std::fmt::Display for GroupKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::All => f.write_str("all"),
            Self::Stream(s) => write!(f, "stream/{s}"),
            Self::Domain(d) => write!(f, "domain/{d}"),
        }
    }
}

/// The summary of every sample, of each Stream and of each domain, in that order.
pub fn aggregate(samples: &[Sample], k: u64) -> Vec<(GroupKey, Summary)> {
    let mut keys = vec![GroupKey::All];
    let streams: std::collections::BTreeSet<&str> = samples.iter().map(|s| s.stream.as_str()).collect();
    let domains: std::collections::BTreeSet<&str> = samples.iter().map(|s| s.domain.as_str()).collect();
    keys.extend(streams.into_iter().map(|s| GroupKey::Stream(s.to_string())));
    keys.extend(domains.into_iter().map(|d| GroupKey::Domain(d.to_string())));
    keys.into_iter()
        .map(|key| {
            let summary = Summary::of(samples.iter().filter(|s| key.covers(s)), k);
            (key, summary)
        })
        .collect()
}

impl GroupKey {
    /// Whether `sample` belongs to this group.
    pub fn covers(&self, sample: &Sample) -> bool {
        match self {
            Self::All => true,
            Self::Stream(s) => sample.stream == *s,
            Self::Domain(d) => sample.domain == *d,
        }
    }
}

/// A checkpoint's pass rate against a baseline's, per group the two share (by [`GroupKey`]).
pub fn compare(
    candidate: &[(GroupKey, Summary)],
    baseline: &[(GroupKey, Summary)],
) -> Vec<(GroupKey, Option<Difference>)> {
    candidate
        .iter()
        .filter_map(|(key, c)| {
            let (_, b) = baseline.iter().find(|(k, _)| k == key)?;
            Some((key.clone(), difference((c.passed, c.n), (b.passed, b.n))))
        })
        .collect()
}

#[cfg(test)]
mod tests;
