//! Rotary position embedding tables, computed on the host in `f32` exactly as transformers computes them.
//!
//! transformers builds `inv_freq` in float32 and multiplies it by float32 positions; doing the same here
//! (rather than in `f64`) keeps long-position angles bit-close to the reference.

use crate::config::{ModelConfig, RopeScaling};

/// Inverse frequencies for one model; turns positions into `cos`/`sin` rows.
#[derive(Clone, Debug)]
pub struct RopeTable {
    inv_freq: Vec<f32>,
}

impl RopeTable {
    /// The table for `config`'s `head_dim`, `rope_theta` and `rope_scaling`.
    pub fn new(config: &ModelConfig) -> Self {
        let dim = config.head_dim;
        let base = config.rope_theta as f32;
        let mut inv_freq: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / base.powf((2 * i) as f32 / dim as f32))
            .collect();
        match &config.rope_scaling {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor } => {
                for f in &mut inv_freq {
                    *f /= *factor as f32;
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let (factor, low, high) = (*factor as f32, *low_freq_factor as f32, *high_freq_factor as f32);
                let old = *original_max_position_embeddings as f32;
                let low_wavelen = old / low;
                let high_wavelen = old / high;
                for f in &mut inv_freq {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    let scaled = if wavelen > low_wavelen { *f / factor } else { *f };
                    let smooth = (old / wavelen - low) / (high - low);
                    let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                    let medium = wavelen >= high_wavelen && wavelen <= low_wavelen;
                    *f = if medium { smoothed } else { scaled };
                }
            }
        }
        Self { inv_freq }
    }

    /// The head width the table serves.
    pub fn head_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// `cos` and `sin` rows (`head_dim` each, the half-table repeated twice) for every position, row-major.
    pub fn cos_sin(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let d = self.head_dim();
        let mut cos = Vec::with_capacity(positions.len() * d);
        let mut sin = Vec::with_capacity(positions.len() * d);
        let mut half_cos = vec![0.0f32; d / 2];
        let mut half_sin = vec![0.0f32; d / 2];
        for &p in positions {
            let p = p as f32;
            for (i, f) in self.inv_freq.iter().enumerate() {
                let angle = p * f;
                half_cos[i] = angle.cos();
                half_sin[i] = angle.sin();
            }
            cos.extend_from_slice(&half_cos);
            cos.extend_from_slice(&half_cos);
            sin.extend_from_slice(&half_sin);
            sin.extend_from_slice(&half_sin);
        }
        (cos, sin)
    }
}
