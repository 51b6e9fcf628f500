//! The training step itself, generic over an autodiff backend: micro-batches forward and backward, gradients
//! summed into one store, clipped, and one AdamW update.
//!
//! The proximal policy of the decoupled objective is the weights before this step's update, which are
//! exactly the weights every micro-batch's forward pass runs with (there is one optimiser step per batch), so
//! its log-probabilities are that forward pass's values, detached: the same numbers a separate no-grad pass
//! would compute, without running it.

use std::collections::BTreeMap;
use std::time::Instant;

use burn::module::{AutodiffModule, Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::{AutodiffBackend, Backend};
use burn::tensor::{DType, FloatDType, Tensor};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::{Kernels, Pass, float_dtype};
use crate::model::CausalLm;
use crate::optim::{AdamW, GradStore, host_scalar, host_vec};
use crate::rope::RopeTable;
use crate::train::batch::{RlBatch, SftBatch, normalized_advantages};
use crate::train::config::{MemoryConfig, TrainConfig};
use crate::train::forward::token_logprobs;
use crate::train::loss::{PpoConsts, behaviour_weight, kl_value, ppo_loss, sft_loss, token_weights};
use crate::train::pack::{Packed, Temperatures, effective_len, pack, plan};
use crate::train::stats::{RangeAcc, StepStats};
use crate::weights::{HostTensor, Weights, expected_shapes};

/// A model being trained, its optimiser state and (with a KL penalty) its frozen reference.
pub(crate) struct Learner<A: AutodiffBackend> {
    model: Option<CausalLm<A>>,
    reference: Option<CausalLm<A::InnerBackend>>,
    optim: AdamW<A::InnerBackend>,
    model_config: ModelConfig,
    rope: RopeTable,
    config: TrainConfig,
    memory: MemoryConfig,
    autocast: bool,
    device: A::Device,
}

/// Converts every parameter to the backend's float type (weights arrive as `f32`).
struct ToFloat(FloatDType);

impl<B: Backend> ModuleMapper<B> for ToFloat {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let (id, tensor, mapper) = param.consume();
        let tensor = if tensor.dtype() == DType::from(self.0) {
            tensor
        } else {
            tensor.cast(self.0)
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// The model of `weights` on `device` in `B`'s float type.
pub(crate) fn build<B: Backend>(
    config: &ModelConfig,
    weights: &Weights,
    device: &B::Device,
) -> Result<CausalLm<B>> {
    Ok(CausalLm::<B>::from_weights(config, weights, device)?.map(&mut ToFloat(float_dtype::<B>().into())))
}

/// Marks every parameter as trainable.
struct RequireGrad;

impl<A: AutodiffBackend> ModuleMapper<A> for RequireGrad {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<A, D>>) -> Param<Tensor<A, D>> {
        param.set_require_grad(true)
    }
}

/// Moves each parameter's gradient from a backward pass into a [`GradStore`], by Hugging Face name.
struct Accumulate<'a, A: AutodiffBackend> {
    path: Vec<String>,
    grads: &'a mut A::Gradients,
    store: &'a mut GradStore<A::InnerBackend>,
}

impl<A: AutodiffBackend> ModuleVisitor<A> for Accumulate<'_, A> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<A, D>>) {
        if let Some(g) = param.val().grad_remove(self.grads) {
            let n: usize = g.dims().iter().product();
            self.store.add(&self.path.join("."), g.reshape([n]));
        }
    }
}

/// Applies one AdamW update to every parameter that has a gradient.
struct Update<'a, A: AutodiffBackend> {
    path: Vec<String>,
    grads: &'a mut GradStore<A::InnerBackend>,
    optim: &'a mut AdamW<A::InnerBackend>,
    lr: f64,
}

impl<A: AutodiffBackend> ModuleMapper<A> for Update<'_, A> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<A, D>>) -> Param<Tensor<A, D>> {
        let name = self.path.join(".");
        let (id, tensor, mapper) = param.consume();
        let tensor = match self.grads.remove(&name) {
            Some(g) => {
                let updated = self.optim.update(&name, tensor.inner(), g, self.lr);
                Tensor::from_inner(updated).require_grad()
            }
            None => tensor,
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Per-token statistics of one step.
#[derive(Default)]
pub(crate) struct Tally {
    has_ref: bool,
    tokens: u64,
    clipped: u64,
    dual_clipped: u64,
    dropped: u64,
    log_ratio: f64,
    entropy: f64,
    ref_kl: f64,
    ratio: RangeAcc,
    behave: RangeAcc,
    adv: RangeAcc,
    staleness: RangeAcc,
    drift: RangeAcc,
    drift_truncated: RangeAcc,
}

/// A step's micro-batches and the aggregation weight of each sequence.
struct Plan {
    packs: Vec<Packed>,
    seq_weight: Vec<f32>,
    shape: Shape,
}

/// The size of one step's work.
pub(crate) struct Shape {
    pub(crate) sequences: usize,
    pub(crate) forward_tokens: usize,
    pub(crate) micro_batches: usize,
}

impl<A: AutodiffBackend + Kernels> Learner<A>
where
    A::InnerBackend: Kernels,
{
    /// Builds the trainable model from `weights` on `device`; with a KL penalty, the same weights become the
    /// frozen reference.
    pub(crate) fn new(
        model_config: &ModelConfig,
        weights: &Weights,
        config: TrainConfig,
        device: &A::Device,
        autocast: bool,
    ) -> Result<Self> {
        config.validate()?;
        let model = build::<A>(model_config, weights, device)?.map(&mut RequireGrad);
        let reference = if config.ppo.kl_ctl > 0.0 {
            Some(build::<A::InnerBackend>(model_config, weights, device)?)
        } else {
            None
        };
        Ok(Self {
            model: Some(model),
            reference,
            optim: AdamW::new(config.adamw.clone()),
            rope: RopeTable::new(model_config),
            model_config: model_config.clone(),
            config,
            memory: MemoryConfig::default(),
            autocast,
            device: device.clone(),
        })
    }

    fn model(&self) -> &CausalLm<A> {
        self.model
            .as_ref()
            .expect("the model is only taken out during an update")
    }

    /// How this learner's forward passes compute.
    fn pass(&self) -> Pass {
        Pass {
            autocast: self.autocast,
            logits_chunk: self.memory.logits_chunk,
            attention_block: self.memory.attention_block,
            recompute: self.memory.recompute_layers,
        }
    }

    /// The micro-batches of the sequences `(tokens, mask)`, scored at `temperatures`, and the aggregation
    /// weight of each sequence.
    fn plan(&self, tokens: &[&[u32]], masks: &[&[bool]], temperatures: Temperatures<'_>) -> Result<Plan> {
        let lengths: Vec<usize> = masks.iter().map(|m| effective_len(m)).collect();
        let bins = plan(&lengths, self.config.max_tokens_per_mb);
        if bins.is_empty() {
            return Err(Error::Batch("no sequence has a trained token".to_string()));
        }
        let counts: Vec<usize> = masks.iter().map(|m| m.iter().filter(|&&x| x).count()).collect();
        Ok(Plan {
            packs: bins
                .iter()
                .map(|order| pack(tokens, masks, temperatures, order))
                .collect(),
            seq_weight: token_weights(&counts, self.config.aggregation),
            shape: Shape {
                sequences: counts.iter().filter(|&&c| c > 0).count(),
                forward_tokens: lengths.iter().sum(),
                micro_batches: bins.len(),
            },
        })
    }

    /// Back-propagates one micro-batch's loss into `store`; returns the loss.
    fn backward_into(&self, loss: Tensor<A, 1>, store: &mut GradStore<A::InnerBackend>) -> f64 {
        let value = host_scalar(loss.clone().detach());
        let mut grads = loss.backward();
        self.model().visit(&mut Accumulate::<A> {
            path: Vec::new(),
            grads: &mut grads,
            store,
        });
        value
    }

    /// The PPO loss of `batch` and its gradients summed over micro-batches, without updating anything.
    pub(crate) fn grpo_gradients(
        &self,
        batch: &RlBatch,
    ) -> Result<(f64, GradStore<A::InnerBackend>, Tally, Shape)> {
        batch.check(self.model_config.vocab_size)?;
        let cfg = &self.config.ppo;
        if cfg.kl_ctl > 0.0 && self.reference.is_none() {
            return Err(Error::TrainConfig(
                "kl_ctl > 0 but no reference policy is kept".to_string(),
            ));
        }
        let adv = normalized_advantages(batch, cfg.adv_norm.as_ref())?;
        let tokens: Vec<&[u32]> = batch.sequences.iter().map(|s| s.tokens.as_slice()).collect();
        let masks: Vec<&[bool]> = batch.sequences.iter().map(|s| s.loss_mask.as_slice()).collect();
        let per_token: Vec<&[f32]> = batch
            .sequences
            .iter()
            .map(|s| s.temperatures.as_slice())
            .collect();
        let temperatures = Temperatures {
            per_token: &per_token,
            default: cfg.temperature,
        };
        let Plan {
            packs,
            seq_weight,
            shape,
        } = self.plan(&tokens, &masks, temperatures)?;
        let model = self.model();
        let mut store = GradStore::<A::InnerBackend>::default();
        let mut tally = Tally::default();
        let mut loss = 0.0;
        let high = cfg.eps_clip_higher.unwrap_or(cfg.eps_clip);
        for p in &packs {
            let out = token_logprobs(model, &self.rope, p, self.pass());
            let ent = if cfg.entropy_coeff > 0.0 {
                out.entropy
            } else {
                out.entropy.detach()
            };
            let logp = host_vec(out.logp.clone().detach());
            let behave: Vec<f32> = p
                .origin
                .iter()
                .map(|&(s, t)| batch.sequences[s].logprobs[t])
                .collect();
            let prox = if cfg.recomputes() {
                logp.clone()
            } else {
                behave.clone()
            };
            let behav_weight: Vec<f32> = if cfg.use_decoupled_loss {
                prox.iter()
                    .zip(&behave)
                    .map(|(&px, &b)| behaviour_weight(px, b, cfg.behav_imp_weight_cap))
                    .collect()
            } else {
                vec![1.0; p.trained()]
            };
            let ref_logp = match &self.reference {
                Some(r) if cfg.kl_ctl > 0.0 => {
                    Some(host_vec(token_logprobs(r, &self.rope, p, self.pass()).logp))
                }
                _ => None,
            };
            let consts = PpoConsts {
                adv: p.origin.iter().map(|&(s, _)| adv[s] as f32).collect(),
                weight: p.origin.iter().map(|&(s, _)| seq_weight[s]).collect(),
                prox,
                behav_weight,
                ref_logp,
            };
            let ent_host = host_vec(ent.clone().detach());
            let mb_loss = ppo_loss(out.logp, (cfg.entropy_coeff > 0.0).then_some(ent), &consts, cfg);
            loss += self.backward_into(mb_loss, &mut store);
            for (i, &(s, t)) in p.origin.iter().enumerate() {
                let a = f64::from(consts.adv[i]);
                let log_ratio = f64::from(logp[i] - consts.prox[i]);
                let ratio = log_ratio.exp();
                let l1 = -a * ratio;
                let l2 = -a * ratio.clamp(1.0 - cfg.eps_clip, 1.0 + high);
                tally.tokens += 1;
                tally.clipped += u64::from(l1 < l2);
                if let Some(c) = cfg.c_clip {
                    tally.dual_clipped += u64::from(c * a.abs() < l1.max(l2));
                }
                tally.log_ratio += log_ratio;
                tally.ratio.push(ratio);
                tally.entropy += f64::from(ent_host[i]);
                tally.adv.push(a);
                if cfg.use_decoupled_loss {
                    if consts.behav_weight[i] == 0.0 {
                        tally.dropped += 1;
                    } else {
                        tally.behave.push(f64::from(consts.behav_weight[i]));
                    }
                }
                if let Some(r) = &consts.ref_logp {
                    tally.has_ref = true;
                    tally.ref_kl += kl_value(f64::from(logp[i] - r[i]), cfg.kl_estimator);
                }
                let v = batch.sequences[s].versions[t];
                if v >= 0 {
                    tally.staleness.push(batch.policy_version as f64 - v as f64);
                }
                // The weights this pass runs with are the proximal policy's, so a token sampled under the
                // same version must have been recorded with this very log-probability.
                if v >= 0 && v as u64 == batch.policy_version {
                    let drift = f64::from((behave[i] - logp[i]).abs());
                    if batch.sequences[s].truncated.get(t).copied().unwrap_or(false) {
                        tally.drift_truncated.push(drift);
                    } else {
                        tally.drift.push(drift);
                    }
                }
            }
        }
        Ok((loss, store, tally, shape))
    }

    /// Clips the summed gradients and takes one AdamW step; returns the rate and the norm before clipping.
    fn apply(&mut self, mut store: GradStore<A::InnerBackend>) -> (f64, f64) {
        let grad_norm = store.clip(self.config.gradient_clipping);
        let lr = self.config.schedule.lr_at(self.optim.steps());
        let model = self.model.take().expect("the model is present between steps");
        let model = model.map(&mut Update::<A> {
            path: Vec::new(),
            grads: &mut store,
            optim: &mut self.optim,
            lr,
        });
        self.optim.finish_step();
        self.model = Some(model);
        (lr, grad_norm)
    }

    /// [`AnyLearner::logprobs`] with each token at its temperature of `temperatures`, as a step scores it.
    pub(crate) fn logprobs_at(
        &self,
        sequences: &[Vec<u32>],
        temperatures: Temperatures<'_>,
    ) -> Result<Vec<Vec<f32>>> {
        for (i, s) in sequences.iter().enumerate() {
            let mask: Vec<bool> = (0..s.len()).map(|t| t > 0).collect();
            crate::train::batch::check_tokens(i, s, &mask, self.model_config.vocab_size)?;
        }
        let masks: Vec<Vec<bool>> = sequences
            .iter()
            .map(|s| (0..s.len()).map(|t| t > 0).collect())
            .collect();
        let tokens: Vec<&[u32]> = sequences.iter().map(Vec::as_slice).collect();
        let mask_refs: Vec<&[bool]> = masks.iter().map(Vec::as_slice).collect();
        let mut out: Vec<Vec<f32>> = sequences.iter().map(|s| vec![0.0; s.len()]).collect();
        let lengths: Vec<usize> = mask_refs.iter().map(|m| effective_len(m)).collect();
        let inner = self.model().valid();
        for order in plan(&lengths, self.config.max_tokens_per_mb) {
            let p = pack(&tokens, &mask_refs, temperatures, &order);
            let lp = host_vec(token_logprobs(&inner, &self.rope, &p, self.pass()).logp);
            for (&(s, t), v) in p.origin.iter().zip(lp) {
                out[s][t] = v;
            }
        }
        Ok(out)
    }
}

/// A learner with its backend erased: what [`crate::Trainer`] holds, so that the handle is not generic over
/// the burn backend. Its methods are [`Learner`]'s own; `Trainer` documents them.
pub(crate) trait AnyLearner: Send {
    fn grpo_step(&mut self, batch: &RlBatch) -> Result<StepStats>;
    fn sft_step(&mut self, batch: &SftBatch) -> Result<StepStats>;
    fn weights(&self) -> Weights;
    fn steps(&self) -> u64;
    fn config(&self) -> &TrainConfig;
    fn set_config(&mut self, config: TrainConfig) -> Result<()>;
    fn memory(&self) -> MemoryConfig;
    fn set_memory(&mut self, memory: MemoryConfig) -> Result<()>;
    fn logprobs(&self, sequences: &[Vec<u32>], temperature: f64) -> Result<Vec<Vec<f32>>>;
    fn optimizer_host(&self) -> BTreeMap<String, HostTensor>;
    fn restore(
        &mut self,
        weights: &Weights,
        moments: &BTreeMap<String, HostTensor>,
        steps: u64,
    ) -> Result<()>;
}

impl<A: AutodiffBackend + Kernels> AnyLearner for Learner<A>
where
    A::InnerBackend: Kernels,
    Learner<A>: Send,
{
    /// One GRPO step on `batch`.
    fn grpo_step(&mut self, batch: &RlBatch) -> Result<StepStats> {
        let started = Instant::now();
        let (loss, store, tally, shape) = self.grpo_gradients(batch)?;
        let (lr, grad_norm) = self.apply(store);
        let n = tally.tokens.max(1) as f64;
        Ok(StepStats {
            step: self.steps(),
            loss,
            lr,
            grad_norm,
            sequences: shape.sequences,
            tokens: tally.tokens as usize,
            forward_tokens: shape.forward_tokens,
            micro_batches: shape.micro_batches,
            entropy: tally.entropy / n,
            clip_fraction: tally.clipped as f64 / n,
            dual_clip_fraction: tally.dual_clipped as f64 / n,
            approx_kl: tally.log_ratio / n,
            ref_kl: tally.has_ref.then(|| tally.ref_kl / n),
            importance_weight: tally.ratio.finish(),
            behave_imp_weight: tally.behave.finish(),
            behave_dropped_fraction: tally.dropped as f64 / n,
            advantage: tally.adv.finish(),
            staleness: tally.staleness.finish(),
            behave_logprob_drift: tally.drift.finish(),
            behave_logprob_drift_truncated: tally.drift_truncated.finish(),
            seconds: started.elapsed().as_secs_f64(),
        })
    }

    /// One supervised step on `batch`: cross-entropy on the masked tokens.
    fn sft_step(&mut self, batch: &SftBatch) -> Result<StepStats> {
        let started = Instant::now();
        batch.check(self.model_config.vocab_size)?;
        let tokens: Vec<&[u32]> = batch.sequences.iter().map(|s| s.tokens.as_slice()).collect();
        let masks: Vec<&[bool]> = batch.sequences.iter().map(|s| s.loss_mask.as_slice()).collect();
        let Plan {
            packs,
            seq_weight,
            shape,
        } = self.plan(&tokens, &masks, Temperatures::uniform(1.0))?;
        let model = self.model();
        let mut store = GradStore::<A::InnerBackend>::default();
        let (mut loss, mut ent_sum, mut n) = (0.0, 0.0, 0usize);
        for p in &packs {
            let out = token_logprobs(model, &self.rope, p, self.pass());
            let ent = host_vec(out.entropy.detach());
            ent_sum += ent.iter().map(|&e| f64::from(e)).sum::<f64>();
            n += p.trained();
            let weight: Vec<f32> = p.origin.iter().map(|&(s, _)| seq_weight[s]).collect();
            loss += self.backward_into(sft_loss(out.logp, &weight), &mut store);
        }
        let (lr, grad_norm) = self.apply(store);
        Ok(StepStats {
            step: self.steps(),
            loss,
            lr,
            grad_norm,
            sequences: shape.sequences,
            tokens: n,
            forward_tokens: shape.forward_tokens,
            micro_batches: shape.micro_batches,
            entropy: ent_sum / n.max(1) as f64,
            seconds: started.elapsed().as_secs_f64(),
            ..StepStats::default()
        })
    }

    fn weights(&self) -> Weights {
        Weights::from_model(self.model())
    }

    fn steps(&self) -> u64 {
        self.optim.steps()
    }

    fn config(&self) -> &TrainConfig {
        &self.config
    }

    fn set_config(&mut self, config: TrainConfig) -> Result<()> {
        config.validate()?;
        if config.ppo.kl_ctl > 0.0 && self.reference.is_none() {
            return Err(Error::TrainConfig(
                "kl_ctl > 0 needs the reference policy, which is only kept when the trainer is built with \
                 kl_ctl > 0"
                    .to_string(),
            ));
        }
        self.optim.set_config(config.adamw.clone());
        self.config = config;
        Ok(())
    }

    fn memory(&self) -> MemoryConfig {
        self.memory
    }

    fn set_memory(&mut self, memory: MemoryConfig) -> Result<()> {
        memory.validate()?;
        if memory.recompute_layers && !A::RECOMPUTES_LAYERS {
            return Err(Error::TrainConfig(
                "memory.recompute_layers is only implemented on the cpu device".to_string(),
            ));
        }
        self.memory = memory;
        Ok(())
    }

    /// Per-token log-probabilities of whole sequences under the current weights at `temperature` (0 for
    /// the first token).
    fn logprobs(&self, sequences: &[Vec<u32>], temperature: f64) -> Result<Vec<Vec<f32>>> {
        self.logprobs_at(sequences, Temperatures::uniform(temperature))
    }

    /// The optimiser moments on the host.
    fn optimizer_host(&self) -> BTreeMap<String, HostTensor> {
        self.optim.to_host()
    }

    /// Replaces weights, moments and step count with a saved state.
    fn restore(
        &mut self,
        weights: &Weights,
        moments: &BTreeMap<String, HostTensor>,
        steps: u64,
    ) -> Result<()> {
        let model = build::<A>(&self.model_config, weights, &self.device)?.map(&mut RequireGrad);
        let params = expected_shapes(&self.model_config);
        self.optim.load_host(moments, steps, &params, &self.device)?;
        self.model = Some(model);
        Ok(())
    }
}
