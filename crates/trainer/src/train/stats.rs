//! What a step reports: plain numbers, and [`StepStats::records`] to hand them to any metrics sink as
//! `(name, value)` pairs.

/// Minimum, mean and maximum of a per-token quantity.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Range {
    pub min: f64,
    pub mean: f64,
    pub max: f64,
}

/// Accumulates a [`Range`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct RangeAcc {
    min: f64,
    max: f64,
    sum: f64,
    n: u64,
}

impl Default for RangeAcc {
    fn default() -> Self {
        Self {
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            sum: 0.0,
            n: 0,
        }
    }
}

impl RangeAcc {
    pub(crate) fn push(&mut self, v: f64) {
        self.min = self.min.min(v);
        self.max = self.max.max(v);
        self.sum += v;
        self.n += 1;
    }

    pub(crate) fn finish(&self) -> Option<Range> {
        (self.n > 0).then(|| Range {
            min: self.min,
            mean: self.sum / self.n as f64,
            max: self.max,
        })
    }
}

/// One optimiser step, as it happened.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StepStats {
    /// Optimiser steps completed, this one included.
    pub step: u64,
    /// The aggregated loss that was minimised.
    pub loss: f64,
    /// The learning rate of this step.
    pub lr: f64,
    /// The global gradient norm before clipping.
    pub grad_norm: f64,
    /// Sequences with at least one trained token.
    pub sequences: usize,
    /// Trained tokens.
    pub tokens: usize,
    /// Tokens run through the model (prompts included, trailing untrained tokens cut).
    pub forward_tokens: usize,
    /// Forward/backward passes (micro-batches).
    pub micro_batches: usize,
    /// Mean entropy of the policy at the trained positions.
    pub entropy: f64,
    /// Fraction of trained tokens whose ratio was clipped (PPO only).
    pub clip_fraction: f64,
    /// Fraction of trained tokens capped by the dual clip (PPO only).
    pub dual_clip_fraction: f64,
    /// Mean of `logp - prox` over trained tokens (PPO only).
    pub approx_kl: f64,
    /// Mean KL estimate to the reference policy, when the penalty is on.
    pub ref_kl: Option<f64>,
    /// `pi / pi_prox` over trained tokens (PPO only).
    pub importance_weight: Option<Range>,
    /// `pi_prox / pi_behave` over trained tokens below the cap (decoupled objective only).
    pub behave_imp_weight: Option<Range>,
    /// Fraction of trained tokens dropped by `behav_imp_weight_cap`.
    pub behave_dropped_fraction: f64,
    /// The advantages after normalisation, per trained token (PPO only).
    pub advantage: Option<Range>,
    /// `policy_version - version` over trained tokens (PPO only).
    pub staleness: Option<Range>,
    /// `|behaviour - proximal|` log-probability of the trained tokens sampled under this step's version and
    /// drawn from an untruncated distribution: near zero when the trainer scores each token
    /// under the distribution it was sampled from (`None` when there was no such token).
    pub behave_logprob_drift: Option<Range>,
    /// The same for tokens drawn from a truncated distribution (top-p < 1 or top-k), whose recorded behaviour
    /// log-probability is of the truncated distribution: the behaviour weight corrects the difference.
    pub behave_logprob_drift_truncated: Option<Range>,
    /// Wall time of the step.
    pub seconds: f64,
}

impl StepStats {
    /// The statistics as `(name, value)` records under `prefix` (for example `train/`).
    pub fn records(&self, prefix: &str) -> Vec<(String, f64)> {
        let mut out = vec![
            ("loss", self.loss),
            ("lr", self.lr),
            ("grad_norm", self.grad_norm),
            ("sequences", self.sequences as f64),
            ("trained_tokens", self.tokens as f64),
            ("forward_tokens", self.forward_tokens as f64),
            ("micro_batches", self.micro_batches as f64),
            ("entropy", self.entropy),
            ("clip_fraction", self.clip_fraction),
            ("dual_clip_fraction", self.dual_clip_fraction),
            ("approx_kl", self.approx_kl),
            ("behave_dropped_fraction", self.behave_dropped_fraction),
            ("seconds", self.seconds),
        ]
        .into_iter()
        .map(|(k, v)| (format!("{prefix}{k}"), v))
        .collect::<Vec<_>>();
        if let Some(kl) = self.ref_kl {
            out.push((format!("{prefix}ref_kl"), kl));
        }
        for (name, range) in [
            ("importance_weight", self.importance_weight),
            ("behave_imp_weight", self.behave_imp_weight),
            ("advantage", self.advantage),
            ("staleness", self.staleness),
            ("behave_logprob_drift", self.behave_logprob_drift),
            (
                "behave_logprob_drift_truncated",
                self.behave_logprob_drift_truncated,
            ),
        ] {
            if let Some(r) = range {
                out.push((format!("{prefix}{name}/min"), r.min));
                out.push((format!("{prefix}{name}/mean"), r.mean));
                out.push((format!("{prefix}{name}/max"), r.max));
            }
        }
        out
    }
}
