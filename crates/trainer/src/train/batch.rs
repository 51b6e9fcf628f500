//! The trainer's own input: token-exact sequences with their loss masks, behaviour log-probabilities, policy
//! versions and one advantage per sequence (RL), or just tokens and masks (supervised).
//!
//! Every per-token array is aligned with `tokens`: entry `t` describes token `t`, which the model predicts
//! from tokens `0..t`. So `loss_mask[0]` is always false, and `logprobs[t]` is the log-probability the
//! behaviour policy gave token `t` when it sampled it.

use crate::error::{Error, Result};
use crate::train::config::{AdvNorm, NormLevel};

/// One sampled trajectory.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TrainSequence {
    /// Prompt and output tokens, exactly as sampled.
    pub tokens: Vec<u32>,
    /// True on tokens the loss covers (sampled by the policy), false on prompt, tool and template tokens.
    pub loss_mask: Vec<bool>,
    /// The behaviour policy's log-probability of each sampled token (anything elsewhere).
    pub logprobs: Vec<f32>,
    /// The policy version that sampled each token (-1 or anything elsewhere).
    pub versions: Vec<i64>,
    /// The sequence's advantage, broadcast over its trained tokens.
    pub advantage: f32,
    /// True on tokens drawn from a truncated distribution (top-p < 1 or top-k); empty means none. Only the
    /// behaviour log-probability drift metric reads it, to report truncated tokens apart.
    pub truncated: Vec<bool>,
    /// The temperature each sampled token was drawn at (anything elsewhere); the trainer scores each trained
    /// token at its own. Empty means every token at `PpoConfig::temperature`. A greedy token (temperature
    /// 0) is scored at temperature 1, the distribution the sampler records its log-probability under.
    pub temperatures: Vec<f32>,
}

/// One RL step's input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RlBatch {
    /// The sequences, group by group.
    pub sequences: Vec<TrainSequence>,
    /// How many sequences each group holds, in order (for group-level advantage normalisation); empty means
    /// groups of `adv_norm.group_size`.
    pub group_sizes: Vec<usize>,
    /// The version of the weights this step starts from (staleness is measured against it).
    pub policy_version: u64,
}

/// One supervised sequence: cross-entropy on the tokens the mask selects.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SftSequence {
    /// The tokens.
    pub tokens: Vec<u32>,
    /// True on tokens to learn (the answer), false on context.
    pub loss_mask: Vec<bool>,
}

/// One supervised step's input.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SftBatch {
    /// The sequences.
    pub sequences: Vec<SftSequence>,
}

/// Checks the tokens and mask of sequence `i`.
pub(crate) fn check_tokens(i: usize, tokens: &[u32], mask: &[bool], vocab: usize) -> Result<()> {
    if tokens.is_empty() {
        return Err(Error::Batch(format!("sequence {i}: tokens is empty")));
    }
    if mask.len() != tokens.len() {
        return Err(Error::Batch(format!(
            "sequence {i}: loss_mask has {} entries for {} tokens",
            mask.len(),
            tokens.len()
        )));
    }
    if let Some(t) = tokens.iter().find(|&&t| t as usize >= vocab) {
        return Err(Error::Batch(format!(
            "sequence {i}: token {t} is outside the vocabulary of {vocab}"
        )));
    }
    if mask[0] {
        return Err(Error::Batch(format!(
            "sequence {i}: loss_mask[0] is set, but the first token has no context to be predicted from"
        )));
    }
    Ok(())
}

impl RlBatch {
    /// Checks shapes, token ids, log-probabilities, temperatures and advantages; the error names the
    /// sequence and field.
    pub fn check(&self, vocab: usize) -> Result<()> {
        if self.sequences.is_empty() {
            return Err(Error::Batch("the batch has no sequences".to_string()));
        }
        for (i, s) in self.sequences.iter().enumerate() {
            check_tokens(i, &s.tokens, &s.loss_mask, vocab)?;
            let temperatures = (!s.temperatures.is_empty()).then_some(("temperatures", s.temperatures.len()));
            let lengths = [("logprobs", s.logprobs.len()), ("versions", s.versions.len())];
            for (field, len) in lengths.into_iter().chain(temperatures) {
                if len != s.tokens.len() {
                    return Err(Error::Batch(format!(
                        "sequence {i}: {field} has {len} entries for {} tokens",
                        s.tokens.len()
                    )));
                }
            }
            if !s.advantage.is_finite() {
                return Err(Error::Batch(format!(
                    "sequence {i}: advantage {} is not finite",
                    s.advantage
                )));
            }
            for (t, (&m, &lp)) in s.loss_mask.iter().zip(&s.logprobs).enumerate() {
                if m && !(lp.is_finite() && lp <= 0.0) {
                    return Err(Error::Batch(format!(
                        "sequence {i}: logprobs[{t}] = {lp} is not a log-probability"
                    )));
                }
            }
            for (t, &temperature) in s.temperatures.iter().enumerate() {
                if s.loss_mask[t] && !(temperature.is_finite() && temperature >= 0.0) {
                    return Err(Error::Batch(format!(
                        "sequence {i}: temperatures[{t}] = {temperature} is not a sampling temperature \
                         (finite and >= 0)"
                    )));
                }
            }
        }
        if !self.group_sizes.is_empty() {
            let total: usize = self.group_sizes.iter().sum();
            if total != self.sequences.len() || self.group_sizes.contains(&0) {
                return Err(Error::Batch(format!(
                    "group_sizes {:?} do not split {} sequences into non-empty groups",
                    self.group_sizes,
                    self.sequences.len()
                )));
            }
        }
        Ok(())
    }
}

impl SftBatch {
    /// Checks shapes and token ids; the error names the sequence and field.
    pub fn check(&self, vocab: usize) -> Result<()> {
        if self.sequences.is_empty() {
            return Err(Error::Batch("the batch has no sequences".to_string()));
        }
        for (i, s) in self.sequences.iter().enumerate() {
            check_tokens(i, &s.tokens, &s.loss_mask, vocab)?;
        }
        Ok(())
    }
}

/// The advantage of each sequence after token-level normalisation (`None` returns them as given).
///
/// Each trained token is one value; a sequence's tokens all carry its advantage, so the statistics are
/// token-weighted and every token of a sequence normalises to the same number. A GRPO step computes them
/// with this function; an out-of-process trainer gets them computed by it (`fsdp2-trainer`'s batch file).
pub fn normalized_advantages(batch: &RlBatch, norm: Option<&AdvNorm>) -> Result<Vec<f64>> {
    let values: Vec<f64> = batch.sequences.iter().map(|s| f64::from(s.advantage)).collect();
    let Some(norm) = norm else {
        return Ok(values);
    };
    let counts: Vec<usize> = batch
        .sequences
        .iter()
        .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
        .collect();
    let groups = group_ranges(batch, norm)?;
    let n = values.len();
    let scopes = |level: Option<NormLevel>| -> Vec<std::ops::Range<usize>> {
        match level {
            Some(NormLevel::Batch) => std::iter::once(0..n).collect(),
            Some(NormLevel::Group) => groups.clone(),
            None => Vec::new(),
        }
    };
    let weighted = |range: &std::ops::Range<usize>, f: &dyn Fn(usize) -> f64| -> f64 {
        range.clone().map(|i| counts[i] as f64 * f(i)).sum()
    };
    let mut mean = vec![0.0; n];
    for range in scopes(norm.mean_level) {
        let total: usize = counts[range.clone()].iter().sum();
        let sum = weighted(&range, &|i| values[i]);
        for i in range {
            mean[i] = match (norm.mean_leave1out, total) {
                (_, 0) => 0.0,
                (true, 1) => values[i],
                (true, t) => (sum - values[i]) / (t - 1) as f64,
                (false, t) => sum / t as f64,
            };
        }
    }
    let (std, eps) = match norm.std_level {
        None => (vec![1.0; n], 0.0),
        Some(level) => {
            let mut std = vec![1.0; n];
            for range in scopes(Some(level)) {
                let total: usize = counts[range.clone()].iter().sum();
                let sq = weighted(&range, &|i| (values[i] - mean[i]).powi(2));
                let value = match (norm.std_unbiased, total) {
                    (true, 0 | 1) | (false, 0) => 1.0,
                    (true, t) => (sq / (t - 1) as f64).sqrt(),
                    (false, t) => (sq / t as f64).sqrt(),
                };
                std[range].fill(value);
            }
            (std, norm.eps)
        }
    };
    Ok(values
        .iter()
        .zip(&mean)
        .zip(&std)
        .map(|((v, m), s)| (v - m) / (s + eps))
        .collect())
}

/// The sequence index ranges of the batch's groups.
fn group_ranges(batch: &RlBatch, norm: &AdvNorm) -> Result<Vec<std::ops::Range<usize>>> {
    let n = batch.sequences.len();
    let sizes: Vec<usize> = if batch.group_sizes.is_empty() {
        if !n.is_multiple_of(norm.group_size) {
            return Err(Error::Batch(format!(
                "{n} sequences do not split into groups of adv_norm.group_size {}",
                norm.group_size
            )));
        }
        vec![norm.group_size; n / norm.group_size]
    } else {
        batch.group_sizes.clone()
    };
    let mut start = 0;
    Ok(sizes
        .into_iter()
        .map(|s| {
            let r = start..start + s;
            start += s;
            r
        })
        .collect())
}
