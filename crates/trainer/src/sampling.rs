//! Per-sequence sampling: temperature, top-k, top-p and a seeded generator, with the log-probability of
//! the sampled token under the distribution it was drawn from.
//!
//! The generator is SplitMix64 (the workspace's one copy, in the `seeds` crate), so that a seed means the
//! same tokens on every platform and release, and so that its whole state is one `u64` that a checkpoint
//! can store.

pub use seeds::SplitMix64;

use crate::cpu_math::{fast_exp, simd_fn};

#[cfg(test)]
mod tests;

/// How the next token is chosen.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy; otherwise logits are divided by it.
    pub temperature: f32,
    /// Keep the smallest set of most likely tokens whose probability reaches `top_p` (1.0 keeps all).
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens (0 keeps all).
    pub top_k: usize,
    /// Seed of this sequence's generator; `None` draws one.
    pub seed: Option<u64>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Problems with the parameters, if any.
    pub fn check(&self) -> Option<String> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Some(format!(
                "temperature must be a finite number >= 0, got {}",
                self.temperature
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Some(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        None
    }
}

/// Chooses a token from one row of logits and returns it with its log-probability.
///
/// Greedy decoding (temperature 0) reports the log-probability under the untempered softmax, since the
/// point mass it samples from would always say 0.
/// Otherwise the log-probability is under the tempered distribution after top-k and top-p filtering,
/// renormalised: exactly the distribution the token was drawn from.
pub fn sample(logits: &[f32], params: &SamplingParams, rng: &mut SplitMix64) -> (u32, f32) {
    if params.temperature == 0.0 {
        let (best, _) = logits
            .iter()
            .enumerate()
            .fold((0usize, f32::NEG_INFINITY), |(bi, bv), (i, &v)| {
                if v > bv { (i, v) } else { (bi, bv) }
            });
        return (best as u32, log_softmax_at(logits, 1.0, best));
    }
    // Exponentials in f32 with a vectorised `exp` (about 1 ulp), probabilities and sums in f64: libm's
    // scalar `exp` over a vocabulary of 10^5 costs as much as a decode step of a small model.
    let inv_t = 1.0 / params.temperature;
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut probs = vec![0.0f64; logits.len()];
    let total = tempered_exp(&mut probs, logits, max, inv_t);
    for p in &mut probs {
        *p /= total;
    }
    let vocab = probs.len();
    let top_k = if params.top_k == 0 {
        vocab
    } else {
        params.top_k.min(vocab)
    };
    if top_k == vocab && params.top_p >= 1.0 {
        return draw(&probs, None, rng);
    }
    let candidates = nucleus(&probs, top_k, f64::from(params.top_p));
    draw(&probs, Some(&candidates), rng)
}

/// The indices kept by top-k then top-p (over the top-k renormalised distribution), most likely first.
fn nucleus(probs: &[f64], top_k: usize, top_p: f64) -> Vec<usize> {
    let by_prob_desc = |a: &usize, b: &usize| probs[*b].total_cmp(&probs[*a]).then(a.cmp(b));
    let (mut idx, mass) = if top_k < probs.len() {
        let mut idx: Vec<usize> = (0..probs.len()).collect();
        idx.select_nth_unstable_by(top_k - 1, by_prob_desc);
        idx.truncate(top_k);
        let mass = idx.iter().map(|&i| probs[i]).sum::<f64>();
        (idx, mass)
    } else {
        // Sorting the whole vocabulary is slow. When the tokens above a small threshold already hold top_p
        // of the mass, the nucleus lies among them; otherwise fall back to the full sort.
        let mut idx: Vec<usize> = (0..probs.len()).filter(|&i| probs[i] >= 1e-6).collect();
        if idx.iter().map(|&i| probs[i]).sum::<f64>() < top_p {
            idx = (0..probs.len()).collect();
        }
        (idx, probs.iter().sum::<f64>())
    };
    idx.sort_unstable_by(by_prob_desc);
    let mut kept = 0;
    let mut cum = 0.0;
    for &i in &idx {
        cum += probs[i];
        kept += 1;
        if cum / mass >= top_p {
            break;
        }
    }
    idx.truncate(kept.max(1));
    idx
}

fn draw(probs: &[f64], candidates: Option<&[usize]>, rng: &mut SplitMix64) -> (u32, f32) {
    let (mass, last) = match candidates {
        Some(c) => (c.iter().map(|&i| probs[i]).sum::<f64>(), *c.last().unwrap_or(&0)),
        None => (probs.iter().sum::<f64>(), probs.len() - 1),
    };
    let target = rng.next_f64() * mass;
    let mut cum = 0.0;
    let mut chosen = last;
    let mut visit = |i: usize| -> bool {
        cum += probs[i];
        if cum > target && probs[i] > 0.0 {
            chosen = i;
            return true;
        }
        false
    };
    match candidates {
        Some(c) => {
            c.iter().any(|&i| visit(i));
        }
        None => {
            (0..probs.len()).any(&mut visit);
        }
    }
    (chosen as u32, (probs[chosen] / mass).ln() as f32)
}

simd_fn! {
    /// `out[i] = exp((logits[i] - max) * inv_t)` (the exponential in f32), returning the sum in f64.
    fn tempered_exp(out: &mut [f64], logits: &[f32], max: f32, inv_t: f32) -> f64 {
        let mut acc = [0.0f64; 8];
        let (chunks, outs) = (logits.chunks_exact(8), out.chunks_exact_mut(8));
        let mut rest = 0.0;
        for (o, &l) in outs.into_remainder().iter_mut().zip(chunks.remainder()) {
            *o = f64::from(fast_exp((l - max) * inv_t));
            rest += *o;
        }
        for (c, o) in chunks.zip(out.chunks_exact_mut(8)) {
            for ((a, o), &l) in acc.iter_mut().zip(o).zip(c) {
                *o = f64::from(fast_exp((l - max) * inv_t));
                *a += *o;
            }
        }
        acc.iter().sum::<f64>() + rest
    }
}

simd_fn! {
    /// `sum(exp((logits[i] - max) * inv_t))`, the exponential in f32 and the sum in f64.
    fn tempered_exp_sum(logits: &[f32], max: f32, inv_t: f32) -> f64 {
        let mut acc = [0.0f64; 8];
        let chunks = logits.chunks_exact(8);
        let mut rest = 0.0;
        for &l in chunks.remainder() {
            rest += f64::from(fast_exp((l - max) * inv_t));
        }
        for c in chunks {
            for (a, &l) in acc.iter_mut().zip(c) {
                *a += f64::from(fast_exp((l - max) * inv_t));
            }
        }
        acc.iter().sum::<f64>() + rest
    }
}

/// `log_softmax(logits / temperature)[index]`.
pub fn log_softmax_at(logits: &[f32], temperature: f64, index: usize) -> f32 {
    let max32 = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let max = max32 as f64;
    // The normaliser in f32 with a vectorised `exp` (about 1 ulp), summed in f64: libm's scalar `exp` over
    // the whole vocabulary was a tenth of a batched decode step.
    let sum = tempered_exp_sum(logits, max32, (1.0 / temperature) as f32);
    (((logits[index] as f64 - max) / temperature) - sum.ln()) as f32
}
