//! The optimiser side of a training step: AdamW with decoupled weight decay, global gradient-norm clipping and
//! learning-rate schedules.
//!
//! The update is the one `torch.optim.AdamW` computes (bias-corrected moments, decay applied to every
//! parameter before the step, as the reference's FSDP engine configures it), and clipping is
//! `torch.nn.utils.clip_grad_norm_` over all parameters at once (burn's own clipping works per tensor).
//! State lives on the training device, keyed by each parameter's Hugging Face name, so a checkpoint stores it
//! under names that survive a reload of the model.

use std::collections::BTreeMap;

use burn::tensor::Tensor;
use burn::tensor::backend::Backend;

use crate::error::{Error, Result};
use crate::weights::HostTensor;

#[cfg(test)]
mod tests;

/// AdamW's hyper-parameters (the reference's `actor.optimizer`: `beta1`, `beta2`, `eps`, `weight_decay`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    /// Decay of the first moment.
    pub beta1: f64,
    /// Decay of the second moment.
    pub beta2: f64,
    /// Added to the root of the second moment.
    pub eps: f64,
    /// Decoupled weight decay, multiplied by the learning rate.
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
        }
    }
}

impl AdamWConfig {
    /// Every out-of-range field, named.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                out.push(format!("{name} must be in [0, 1), got {v}"));
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            out.push(format!("eps must be finite and positive, got {}", self.eps));
        }
        if !(self.weight_decay.is_finite() && self.weight_decay >= 0.0) {
            out.push(format!(
                "weight_decay must be finite and >= 0, got {}",
                self.weight_decay
            ));
        }
        out
    }
}

/// The shape of a learning-rate schedule after its warm-up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    /// The base rate throughout.
    #[default]
    Constant,
    /// Linear decay from the base rate to `min_lr_ratio` times it at `total_steps`.
    Linear,
    /// Half-cosine decay from the base rate to `min_lr_ratio` times it at `total_steps`.
    Cosine,
}

/// A learning rate per optimiser step: linear warm-up from 0, then constant, linear or cosine decay.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct LrSchedule {
    /// The base rate.
    pub lr: f64,
    /// What follows the warm-up.
    pub kind: ScheduleKind,
    /// Steps of linear warm-up (the rate at step `s < warmup_steps` is `lr * s / warmup_steps`).
    pub warmup_steps: u64,
    /// The step at which decay reaches its floor.
    pub total_steps: u64,
    /// The floor of the decay, as a fraction of `lr`.
    pub min_lr_ratio: f64,
}

impl LrSchedule {
    /// A constant rate without warm-up.
    pub fn constant(lr: f64) -> Self {
        Self {
            lr,
            kind: ScheduleKind::Constant,
            warmup_steps: 0,
            total_steps: 1,
            min_lr_ratio: 0.0,
        }
    }

    /// Every out-of-range field, named.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        // 0 is allowed: a run with frozen weights is the control that shows what training changes.
        if !(self.lr.is_finite() && self.lr >= 0.0) {
            out.push(format!("lr must be finite and >= 0, got {}", self.lr));
        }
        if !(0.0..=1.0).contains(&self.min_lr_ratio) {
            out.push(format!(
                "min_lr_ratio must be in [0, 1], got {}",
                self.min_lr_ratio
            ));
        }
        if self.total_steps == 0 {
            out.push("total_steps must be >= 1, got 0".to_string());
        }
        out
    }

    /// The rate of the optimiser step that follows `step` completed ones (0-based, as `torch`'s `LambdaLR`
    /// counts).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * step as f64 / self.warmup_steps.max(1) as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let progress = ((step - self.warmup_steps) as f64 / span).min(1.0);
        let floor = self.min_lr_ratio;
        let factor = match self.kind {
            ScheduleKind::Constant => 1.0,
            ScheduleKind::Linear => floor + (1.0 - floor) * (1.0 - progress),
            ScheduleKind::Cosine => {
                floor + (1.0 - floor) * 0.5 * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        };
        self.lr * factor
    }
}

/// One parameter's moments, flattened.
#[derive(Clone, Debug)]
struct Moments<B: Backend> {
    shape: Vec<usize>,
    exp_avg: Tensor<B, 1>,
    exp_avg_sq: Tensor<B, 1>,
}

/// AdamW state for a set of named parameters on one device.
#[derive(Clone, Debug)]
pub struct AdamW<B: Backend> {
    config: AdamWConfig,
    moments: BTreeMap<String, Moments<B>>,
    steps: u64,
}

impl<B: Backend> AdamW<B> {
    /// Fresh state: no moments, no step taken.
    pub fn new(config: AdamWConfig) -> Self {
        Self {
            config,
            moments: BTreeMap::new(),
            steps: 0,
        }
    }

    /// The hyper-parameters.
    pub fn config(&self) -> &AdamWConfig {
        &self.config
    }

    /// Replaces the hyper-parameters (the moments and the step count stay).
    pub fn set_config(&mut self, config: AdamWConfig) {
        self.config = config;
    }

    /// Completed optimiser steps.
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Updates one parameter with its gradient at rate `lr`, as step `steps() + 1`. Call [`AdamW::finish_step`]
    /// once every parameter of the step is updated.
    pub fn update<const D: usize>(
        &mut self,
        name: &str,
        param: Tensor<B, D>,
        grad: Tensor<B, 1>,
        lr: f64,
    ) -> Tensor<B, D> {
        let dims = param.dims();
        let n: usize = dims.iter().product();
        let device = param.device();
        let c = &self.config;
        let dtype = param.dtype();
        let entry = self.moments.entry(name.to_string()).or_insert_with(|| Moments {
            shape: dims.to_vec(),
            exp_avg: Tensor::zeros([n], (&device, dtype)),
            exp_avg_sq: Tensor::zeros([n], (&device, dtype)),
        });
        let t = (self.steps + 1) as i32;
        let exp_avg = entry.exp_avg.clone() * c.beta1 + grad.clone() * (1.0 - c.beta1);
        let exp_avg_sq = entry.exp_avg_sq.clone() * c.beta2 + grad.clone() * grad * (1.0 - c.beta2);
        let bias1 = 1.0 - c.beta1.powi(t);
        let bias2_sqrt = (1.0 - c.beta2.powi(t)).sqrt();
        let denom = exp_avg_sq.clone().sqrt() / bias2_sqrt + c.eps;
        let flat = param.reshape([n]) * (1.0 - lr * c.weight_decay);
        let flat = flat - exp_avg.clone() / denom * (lr / bias1);
        entry.exp_avg = exp_avg;
        entry.exp_avg_sq = exp_avg_sq;
        flat.reshape(dims)
    }

    /// Counts the step whose parameters were just updated.
    pub fn finish_step(&mut self) {
        self.steps += 1;
    }

    /// The moments on the host, as `<name>.exp_avg` and `<name>.exp_avg_sq` in each parameter's shape.
    pub fn to_host(&self) -> BTreeMap<String, HostTensor> {
        let mut out = BTreeMap::new();
        for (name, m) in &self.moments {
            for (suffix, t) in [("exp_avg", &m.exp_avg), ("exp_avg_sq", &m.exp_avg_sq)] {
                out.insert(
                    format!("{name}.{suffix}"),
                    HostTensor {
                        shape: m.shape.clone(),
                        data: host_vec(t.clone()),
                    },
                );
            }
        }
        out
    }

    /// Restores moments written by [`AdamW::to_host`] and the step count; every moment must belong to one of
    /// `params` (name and shape).
    pub fn load_host(
        &mut self,
        tensors: &BTreeMap<String, HostTensor>,
        steps: u64,
        params: &BTreeMap<String, Vec<usize>>,
        device: &B::Device,
    ) -> Result<()> {
        let mut moments = BTreeMap::new();
        for (key, host) in tensors {
            let Some((name, suffix)) = key.rsplit_once('.') else {
                return Err(Error::WeightMismatch(format!(
                    "optimizer state `{key}` has no moment suffix"
                )));
            };
            let Some(shape) = params.get(name) else {
                return Err(Error::WeightMismatch(format!(
                    "optimizer state `{key}` belongs to no parameter of the model"
                )));
            };
            if &host.shape != shape || host.data.len() != shape.iter().product::<usize>() {
                return Err(Error::WeightMismatch(format!(
                    "optimizer state `{key}` has shape {:?}, the parameter has {shape:?}",
                    host.shape
                )));
            }
            let n = host.data.len();
            let tensor = crate::kernels::host_tensor::<B, 1>(host.data.clone(), [n], device);
            let entry = moments.entry(name.to_string()).or_insert_with(|| Moments {
                shape: shape.clone(),
                exp_avg: tensor.zeros_like(),
                exp_avg_sq: tensor.zeros_like(),
            });
            match suffix {
                "exp_avg" => entry.exp_avg = tensor,
                "exp_avg_sq" => entry.exp_avg_sq = tensor,
                other => {
                    return Err(Error::WeightMismatch(format!(
                        "optimizer state `{key}` has an unknown moment `{other}`"
                    )));
                }
            }
        }
        self.moments = moments;
        self.steps = steps;
        Ok(())
    }
}

/// Gradients of one optimiser step, flattened and keyed by parameter name, summed over micro-batches.
#[derive(Debug)]
pub struct GradStore<B: Backend> {
    grads: BTreeMap<String, Tensor<B, 1>>,
}

impl<B: Backend> Default for GradStore<B> {
    fn default() -> Self {
        Self {
            grads: BTreeMap::new(),
        }
    }
}

impl<B: Backend> GradStore<B> {
    /// Adds a micro-batch's gradient of `name`.
    pub fn add(&mut self, name: &str, grad: Tensor<B, 1>) {
        match self.grads.remove(name) {
            Some(old) => self.grads.insert(name.to_string(), old + grad),
            None => self.grads.insert(name.to_string(), grad),
        };
    }

    /// Takes the gradient of `name` out of the store.
    pub fn remove(&mut self, name: &str) -> Option<Tensor<B, 1>> {
        self.grads.remove(name)
    }

    /// The gradient of `name`, if any.
    pub fn get(&self, name: &str) -> Option<&Tensor<B, 1>> {
        self.grads.get(name)
    }

    /// Number of parameters with a gradient.
    pub fn len(&self) -> usize {
        self.grads.len()
    }

    /// True when no parameter has a gradient.
    pub fn is_empty(&self) -> bool {
        self.grads.is_empty()
    }

    /// The L2 norm of all gradients together (each tensor's sum of squares in the backend's precision,
    /// summed in `f64`).
    pub fn global_norm(&self) -> f64 {
        self.grads
            .values()
            .map(|g| host_scalar((g.clone() * g.clone()).sum()))
            .sum::<f64>()
            .sqrt()
    }

    /// Scales every gradient so the global norm is at most `max_norm` (`clip_grad_norm_`'s rule: the factor
    /// is `max_norm / (norm + 1e-6)` when that is below 1); returns the norm before clipping.
    /// A `max_norm` of 0 disables clipping.
    pub fn clip(&mut self, max_norm: f64) -> f64 {
        let norm = self.global_norm();
        if max_norm > 0.0 {
            let factor = max_norm / (norm + 1e-6);
            if factor < 1.0 {
                for g in self.grads.values_mut() {
                    *g = g.clone() * factor;
                }
            }
        }
        norm
    }
}

/// A one-element tensor's value on the host as `f64` (full precision on an `f64` backend).
pub(crate) fn host_scalar<B: Backend, const D: usize>(t: Tensor<B, D>) -> f64 {
    t.into_data()
        .convert::<f64>()
        .into_vec::<f64>()
        .expect("converted to f64 just above")[0]
}

/// A tensor's elements on the host as `f32`.
pub(crate) fn host_vec<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32 just above")
}
