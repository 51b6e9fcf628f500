//! The settings of a training step: the PPO objective, token aggregation, advantage normalisation,
//! micro-batching, the optimiser and its schedule; and how a step trades memory for time ([`MemoryConfig`]:
//! chunk sizes and layer recompute, which change no result).
//!
//! Names and defaults follow the reference's `actor` config where it has the knob (`eps_clip`, `c_clip`,
//! `behav_imp_weight_cap`, `kl_ctl`, `kl_estimator`, `adv_norm`, `optimizer.*`, `mb_spec.max_tokens_per_mb`).
//! `validate` reports every problem at once, each naming its field.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::optim::{AdamWConfig, LrSchedule};

/// How per-token losses become one number (the reference's `loss_agg_mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum LossAggregation {
    /// Mean over every trained token of the batch: each token weighs `1 / N`, so long sequences weigh more
    /// (the reference's default).
    #[default]
    #[serde(rename = "token-mean")]
    TokenMean,
    /// Mean over each sequence's trained tokens, then mean over sequences: each sequence weighs the same.
    #[serde(rename = "seq-mean-token-mean")]
    SeqMeanTokenMean,
}

/// How the KL divergence to the reference policy is estimated per token, from `log_ratio = logp - ref_logp`
/// (Schulman's estimators, as the reference names them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KlEstimator {
    /// `log_ratio` (unbiased, high variance, can be negative).
    #[default]
    K1,
    /// `log_ratio^2 / 2`.
    K2,
    /// `exp(-log_ratio) - 1 + log_ratio` (unbiased, non-negative).
    K3,
}

/// Where an advantage-normalisation statistic is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NormLevel {
    /// Over every trained token of the batch.
    Batch,
    /// Over the trained tokens of each group's sequences.
    Group,
}

/// Token-level advantage normalisation (the reference's `actor.adv_norm`): every trained token is one value,
/// so a sequence weighs by its number of trained tokens; output `(x - mean) / (std + eps)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdvNorm {
    /// Where the mean is taken; `None` subtracts nothing.
    pub mean_level: Option<NormLevel>,
    /// Each token's mean is over the other tokens of its scope.
    pub mean_leave1out: bool,
    /// Where the std is taken; `None` divides by 1 with no eps.
    pub std_level: Option<NormLevel>,
    /// Unbiased (n - 1) std; one value alone has std 1.
    pub std_unbiased: bool,
    /// Added to the std.
    pub eps: f64,
    /// Sequences per group when the batch gives no group sizes.
    pub group_size: usize,
}

impl Default for AdvNorm {
    fn default() -> Self {
        Self {
            mean_level: Some(NormLevel::Batch),
            mean_leave1out: false,
            std_level: Some(NormLevel::Batch),
            std_unbiased: true,
            eps: 1e-5,
            group_size: 1,
        }
    }
}

/// The GRPO objective: decoupled PPO-clip with optional dual clip, KL penalty and entropy bonus.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PpoConfig {
    /// Lower (and, without `eps_clip_higher`, upper) clip range of the ratio to the proximal policy.
    pub eps_clip: f64,
    /// Upper clip range, when it differs from `eps_clip` (DAPO's clip-higher).
    pub eps_clip_higher: Option<f64>,
    /// Dual clip: a negative-advantage token's loss is capped at `c_clip * |A|` (must be > 1).
    pub c_clip: Option<f64>,
    /// The decoupled objective: the proximal policy is recomputed with the weights before this step, the
    /// clipped ratio is to it, and each token is weighted by `pi_prox / pi_behave`.
    pub use_decoupled_loss: bool,
    /// Recompute the proximal log-probabilities even without the decoupled objective (they then replace the
    /// behaviour log-probabilities).
    pub recompute_logprob: bool,
    /// With the decoupled objective, tokens whose `pi_prox / pi_behave` exceeds this cap are dropped (weight 0).
    pub behav_imp_weight_cap: Option<f64>,
    /// Coefficient of the KL penalty to the frozen reference policy (the initial weights); 0 disables it and
    /// keeps no reference copy.
    pub kl_ctl: f64,
    /// Per-token KL estimator.
    pub kl_estimator: KlEstimator,
    /// Coefficient of the entropy bonus (subtracted from the loss); 0 disables it.
    pub entropy_coeff: f64,
    /// Token-level advantage normalisation; `None` uses the advantages as given.
    pub adv_norm: Option<AdvNorm>,
    /// Sampling temperature of the behaviour policy for sequences that record none
    /// (`TrainSequence::temperatures` empty): logits are divided by it before the log-softmax. A sequence
    /// that records its tokens' temperatures is scored at those instead.
    pub temperature: f64,
}

impl Default for PpoConfig {
    fn default() -> Self {
        Self {
            eps_clip: 0.2,
            eps_clip_higher: None,
            c_clip: None,
            use_decoupled_loss: false,
            recompute_logprob: false,
            behav_imp_weight_cap: None,
            kl_ctl: 0.0,
            kl_estimator: KlEstimator::K1,
            entropy_coeff: 0.0,
            adv_norm: None,
            temperature: 1.0,
        }
    }
}

impl PpoConfig {
    /// Whether the proximal log-probabilities are recomputed before the update.
    pub fn recomputes(&self) -> bool {
        self.use_decoupled_loss || self.recompute_logprob
    }
}

/// Everything a training step needs besides the model and the data.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The learning rate per optimiser step.
    pub schedule: LrSchedule,
    /// AdamW's hyper-parameters.
    pub adamw: AdamWConfig,
    /// Global gradient-norm clip; 0 disables it.
    pub gradient_clipping: f64,
    /// Most tokens packed into one forward/backward pass; a longer sequence gets a pass of its own.
    pub max_tokens_per_mb: usize,
    /// How per-token losses are averaged.
    pub aggregation: LossAggregation,
    /// The RL objective (unused by supervised steps).
    pub ppo: PpoConfig,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            schedule: LrSchedule::constant(1e-3),
            adamw: AdamWConfig::default(),
            gradient_clipping: 1.0,
            max_tokens_per_mb: 8192,
            aggregation: LossAggregation::TokenMean,
            ppo: PpoConfig::default(),
        }
    }
}

impl TrainConfig {
    /// Checks every field; the error lists every problem.
    pub fn validate(&self) -> Result<()> {
        let mut p: Vec<String> = Vec::new();
        p.extend(self.schedule.problems());
        p.extend(self.adamw.problems());
        if !(self.gradient_clipping.is_finite() && self.gradient_clipping >= 0.0) {
            p.push(format!(
                "gradient_clipping must be finite and >= 0, got {}",
                self.gradient_clipping
            ));
        }
        if self.max_tokens_per_mb == 0 {
            p.push("max_tokens_per_mb must be >= 1, got 0".to_string());
        }
        let ppo = &self.ppo;
        let positive = |name: &str, v: f64, p: &mut Vec<String>| {
            if !(v.is_finite() && v > 0.0) {
                p.push(format!("{name} must be finite and positive, got {v}"));
            }
        };
        positive("eps_clip", ppo.eps_clip, &mut p);
        if let Some(v) = ppo.eps_clip_higher {
            positive("eps_clip_higher", v, &mut p);
        }
        positive("temperature", ppo.temperature, &mut p);
        if let Some(c) = ppo.c_clip
            && !(c.is_finite() && c > 1.0)
        {
            p.push(format!("c_clip must be finite and > 1, got {c}"));
        }
        if let Some(cap) = ppo.behav_imp_weight_cap {
            if !(cap.is_finite() && cap > 1.0) {
                p.push(format!("behav_imp_weight_cap must be finite and > 1, got {cap}"));
            }
            if !ppo.use_decoupled_loss {
                p.push("behav_imp_weight_cap needs use_decoupled_loss".to_string());
            }
        }
        for (name, v) in [("kl_ctl", ppo.kl_ctl), ("entropy_coeff", ppo.entropy_coeff)] {
            if !(v.is_finite() && v >= 0.0) {
                p.push(format!("{name} must be finite and >= 0, got {v}"));
            }
        }
        if let Some(n) = &ppo.adv_norm {
            if !(n.eps.is_finite() && n.eps >= 0.0) {
                p.push(format!("adv_norm.eps must be finite and >= 0, got {}", n.eps));
            }
            if n.group_size == 0 {
                p.push("adv_norm.group_size must be >= 1, got 0".to_string());
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(Error::TrainConfig(p.join("; ")))
        }
    }
}

/// How a step trades memory for time. None of it changes the maths: chunked and whole computations agree
/// to rounding (the tests check values and gradients).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemoryConfig {
    /// Rows of logits the output projection computes at once (log-softmax, target log-probability and
    /// entropy); its backward pass recomputes each chunk's logits from two saved numbers per row, so the step
    /// holds `logits_chunk x vocab` logits at a time instead of `tokens x vocab`.
    pub logits_chunk: usize,
    /// Query rows per attention block: the forward pass keeps one log-sum-exp per row and head, and the
    /// backward pass recomputes each block's probabilities, so no `tokens x tokens` state is kept.
    pub attention_block: usize,
    /// Keep only each decoder layer's input for the backward pass and recompute the layer's activations
    /// there (one more forward pass per step, activations linear in the layers' inputs alone). Only the CPU
    /// backend implements it; elsewhere it is refused.
    pub recompute_layers: bool,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            logits_chunk: 1024,
            attention_block: 256,
            recompute_layers: false,
        }
    }
}

impl MemoryConfig {
    /// Whole computations (one chunk, one block per sequence), as before chunking: for comparisons.
    pub fn unchunked() -> Self {
        Self {
            logits_chunk: usize::MAX,
            attention_block: usize::MAX,
            recompute_layers: false,
        }
    }

    /// Checks every field; the error lists every problem.
    pub fn validate(&self) -> Result<()> {
        let mut p = Vec::new();
        for (name, v) in [
            ("logits_chunk", self.logits_chunk),
            ("attention_block", self.attention_block),
        ] {
            if v == 0 {
                p.push(format!("memory.{name} must be >= 1, got 0"));
            }
        }
        if p.is_empty() {
            Ok(())
        } else {
            Err(Error::TrainConfig(p.join("; ")))
        }
    }
}
