//! The per-token objectives and their aggregation, on `[N]` tensors of trained tokens.
//!
//! PPO-clip as the reference computes it (`ppo_actor_loss_fn`): with `r = exp(logp - prox)`,
//! `pg = max(-A r, -A clip(r, 1 - eps, 1 + eps_high))`, capped at `c |A|` by the dual clip, then multiplied by
//! the behaviour weight `pi_prox / pi_behave` (0 above the cap) in the decoupled objective.
//! Then `+ kl_ctl * KL(pi || pi_ref)` and `- entropy_coeff * H`, and the sum over tokens with the aggregation
//! weights (`1 / N` per token, or `1 / (S n_s)` per sequence), so that summing micro-batches gives the batch
//! loss and their gradients accumulate exactly.

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::kernels::host_tensor;
use crate::train::config::{KlEstimator, LossAggregation, PpoConfig};

/// The constant (non-differentiated) inputs of the PPO loss for `N` tokens.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct PpoConsts {
    /// Proximal log-probabilities (recomputed, or the behaviour ones).
    pub(crate) prox: Vec<f32>,
    /// `pi_prox / pi_behave` (decoupled objective; 0 for tokens above the cap), else 1.
    pub(crate) behav_weight: Vec<f32>,
    /// Advantages.
    pub(crate) adv: Vec<f32>,
    /// Aggregation weights.
    pub(crate) weight: Vec<f32>,
    /// Reference log-probabilities, when the KL penalty is on.
    pub(crate) ref_logp: Option<Vec<f32>>,
}

fn tensor<B: Backend>(v: &[f32], device: &B::Device) -> Tensor<B, 1> {
    host_tensor(v.to_vec(), [v.len()], device)
}

/// The per-token PPO policy-gradient loss (before the behaviour weight and aggregation).
pub(crate) fn clipped_pg<B: Backend>(
    logp: Tensor<B, 1>,
    prox: Tensor<B, 1>,
    adv: Tensor<B, 1>,
    cfg: &PpoConfig,
) -> Tensor<B, 1> {
    let ratio = (logp - prox).exp();
    let high = cfg.eps_clip_higher.unwrap_or(cfg.eps_clip);
    let clipped = ratio.clone().clamp(1.0 - cfg.eps_clip, 1.0 + high);
    let pg = (adv.clone().neg() * ratio).max_pair(adv.clone().neg() * clipped);
    match cfg.c_clip {
        Some(c) => pg.min_pair(adv.abs() * c),
        None => pg,
    }
}

/// The per-token KL estimate of `log_ratio = logp - ref_logp`.
pub(crate) fn kl_estimate<B: Backend>(
    logp: Tensor<B, 1>,
    ref_logp: Tensor<B, 1>,
    estimator: KlEstimator,
) -> Tensor<B, 1> {
    let log_ratio = logp - ref_logp;
    match estimator {
        KlEstimator::K1 => log_ratio,
        KlEstimator::K2 => log_ratio.clone() * log_ratio * 0.5,
        KlEstimator::K3 => log_ratio.clone().neg().exp() - 1.0 + log_ratio,
    }
}

/// The same estimate of one token on the host.
pub(crate) fn kl_value(log_ratio: f64, estimator: KlEstimator) -> f64 {
    match estimator {
        KlEstimator::K1 => log_ratio,
        KlEstimator::K2 => log_ratio * log_ratio / 2.0,
        KlEstimator::K3 => (-log_ratio).exp() - 1.0 + log_ratio,
    }
}

/// The aggregated PPO loss `[1]` of one micro-batch.
pub(crate) fn ppo_loss<B: Backend>(
    logp: Tensor<B, 1>,
    entropy: Option<Tensor<B, 1>>,
    c: &PpoConsts,
    cfg: &PpoConfig,
) -> Tensor<B, 1> {
    let device = logp.device();
    let pg = clipped_pg(
        logp.clone(),
        tensor(&c.prox, &device),
        tensor(&c.adv, &device),
        cfg,
    ) * tensor(&c.behav_weight, &device);
    let mut total = pg;
    if let Some(r) = &c.ref_logp
        && cfg.kl_ctl > 0.0
    {
        total = total + kl_estimate(logp, tensor(r, &device), cfg.kl_estimator) * cfg.kl_ctl;
    }
    if let Some(h) = entropy
        && cfg.entropy_coeff > 0.0
    {
        total = total - h * cfg.entropy_coeff;
    }
    (total * tensor(&c.weight, &device)).sum()
}

/// The aggregated cross-entropy loss `[1]` of one micro-batch: `-sum w_t logp_t`.
pub(crate) fn sft_loss<B: Backend>(logp: Tensor<B, 1>, weight: &[f32]) -> Tensor<B, 1> {
    let device = logp.device();
    (logp * tensor(weight, &device)).sum().neg()
}

/// The aggregation weight of each trained token of each sequence: `counts[s]` trained tokens in sequence `s`.
/// Pure (no burn types): an out-of-process trainer gets its weights from this function too.
pub fn token_weights(counts: &[usize], aggregation: LossAggregation) -> Vec<f32> {
    let total: usize = counts.iter().sum();
    let sequences = counts.iter().filter(|&&c| c > 0).count();
    counts
        .iter()
        .map(|&c| match (aggregation, c) {
            (_, 0) => 0.0,
            (LossAggregation::TokenMean, _) => (1.0 / total as f64) as f32,
            (LossAggregation::SeqMeanTokenMean, c) => (1.0 / (sequences * c) as f64) as f32,
        })
        .collect()
}

/// The behaviour weight `exp(prox - behave)` of one token, 0 above `cap`.
pub(crate) fn behaviour_weight(prox: f32, behave: f32, cap: Option<f64>) -> f32 {
    let w = (prox - behave).exp();
    match cap {
        Some(cap) if f64::from(w) > cap => 0.0,
        _ => w,
    }
}
