//! The memory-bound operations of the training forward pass in burn tensor operations, computed in chunks
//! whose backward pass recomputes what it needs from small saved state: the output projection with
//! log-softmax, target log-probability and entropy (`chunk` rows of logits at a time; saved: each row's
//! log-sum-exp and entropy) and causal attention over packed sequences (`block` query rows at a time against
//! the keys their mask allows; saved: each row's log-sum-exp per head), flash-attention style.
//!
//! Chunking alone does not help under autodiff, which would keep every chunk's logits and probabilities for
//! the backward pass; so under `Autodiff<B>` each operation is one node ([`logp_autodiff`],
//! [`attention_autodiff`]) whose forward pass runs on the inner backend and whose backward pass recomputes
//! each chunk with inner-backend operations. These are the kernels of every backend but the CPU's (CUDA, and
//! the `f64` gradient checks); the CPU kernels do the same in `cpu_math.rs`.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use burn::tensor::ops::FloatTensor;
use burn::tensor::{IndexingUpdateOp, Int, Tensor, TensorData, TensorPrimitive};
use burn_autodiff::Autodiff;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};

use crate::kernels::{host_tensor, mm};
use crate::model::MASKED;
use crate::train::pack::SegmentRun;

/// The row ranges of `n` rows in chunks of `chunk` (the last one ragged).
pub(crate) fn ranges(n: usize, chunk: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let chunk = chunk.max(1);
    (0..n.div_ceil(chunk)).map(move |c| c * chunk..((c + 1) * chunk).min(n))
}

fn int_column<B: Backend>(values: &[i64], device: &B::Device) -> Tensor<B, 2, Int> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len(), 1]), device)
}

/// `z` with row `i` multiplied by `scales[i]`: untouched when every scale is 1 (the common case), one
/// scalar product when they all agree.
fn scale_rows<B: Backend>(z: Tensor<B, 2>, scales: &[f32]) -> Tensor<B, 2> {
    match scales.split_first() {
        Some((&first, rest)) if rest.iter().all(|&s| s == first) => {
            if first == 1.0 {
                z
            } else {
                z * f64::from(first)
            }
        }
        Some(_) => {
            let device = z.device();
            z * host_tensor::<B, 2>(scales.to_vec(), [scales.len(), 1], &device)
        }
        None => z,
    }
}

/// One chunk's tempered logits: `h W^T` with row `i` multiplied by `inv_temperatures[i]`.
fn logits<B: Backend>(
    h: Tensor<B, 2>,
    w: Tensor<B, 2>,
    inv_temperatures: &[f32],
    autocast: bool,
) -> Tensor<B, 2> {
    scale_rows(mm(h, w.transpose(), autocast), inv_temperatures)
}

/// Row-wise log-sum-exp over the last dimension, kept as a size-1 dimension.
fn logsumexp<B: Backend, const D: usize>(z: Tensor<B, D>) -> Tensor<B, D> {
    let max = z.clone().max_dim(D - 1);
    max.clone() + (z - max).exp().sum_dim(D - 1).log()
}

/// `[log p(target), entropy]` per row at the row's inverse temperature, `[N, 2]`, and each row's
/// log-sum-exp `[N, 1]`.
pub(crate) fn logp_forward<B: Backend>(
    h: Tensor<B, 2>,
    w: Tensor<B, 2>,
    targets: &[i64],
    inv_temperatures: &[f32],
    autocast: bool,
    chunk: usize,
) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let [n, hidden] = h.dims();
    let device = h.device();
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for r in ranges(n, chunk) {
        let z = logits(
            h.clone().slice([r.clone(), 0..hidden]),
            w.clone(),
            &inv_temperatures[r.clone()],
            autocast,
        );
        let lse = logsumexp(z.clone());
        let logp = z.clone().gather(1, int_column::<B>(&targets[r], &device)) - lse.clone();
        let p = (z.clone() - lse.clone()).exp();
        let entropy = lse.clone() - (p * z).sum_dim(1);
        outs.push(Tensor::cat(vec![logp, entropy], 1));
        lses.push(lse);
    }
    if outs.is_empty() {
        return (
            Tensor::zeros([0, 2], (&device, h.dtype())),
            Tensor::zeros([0, 1], (&device, h.dtype())),
        );
    }
    (Tensor::cat(outs, 0), Tensor::cat(lses, 0))
}

/// What [`logp_backward`] recomputes from.
#[derive(Clone, Debug)]
pub(crate) struct LogpSaved<B: Backend> {
    h: Tensor<B, 2>,
    w: Tensor<B, 2>,
    /// `[N, 1]`.
    lse: Tensor<B, 2>,
    /// `[N, 1]`.
    entropy: Tensor<B, 2>,
    targets: Arc<Vec<i64>>,
    inv_temperatures: Arc<Vec<f32>>,
    autocast: bool,
    chunk: usize,
}

/// The gradients `(dh, dw)` of [`logp_forward`] from the gradient `g` `[N, 2]` of its output.
pub(crate) fn logp_backward<B: Backend>(g: Tensor<B, 2>, s: &LogpSaved<B>) -> (Tensor<B, 2>, Tensor<B, 2>) {
    let [n, hidden] = s.h.dims();
    let device = s.h.device();
    let mut dh = Vec::new();
    let mut dw: Option<Tensor<B, 2>> = None;
    for r in ranges(n, s.chunk) {
        let hc = s.h.clone().slice([r.clone(), 0..hidden]);
        let inv_t = &s.inv_temperatures[r.clone()];
        let z = logits(hc.clone(), s.w.clone(), inv_t, s.autocast);
        let lp = z.clone() - s.lse.clone().slice([r.clone(), 0..1]);
        let p = lp.clone().exp();
        let a = g.clone().slice([r.clone(), 0..1]);
        let b = g.clone().slice([r.clone(), 1..2]);
        let entropy = s.entropy.clone().slice([r.clone(), 0..1]);
        // d logp / dz_j = [j = t] - p_j;  d H / dz_j = -p_j (log p_j + H).
        let dz = p.clone().neg() * a.clone() - p * (lp + entropy) * b;
        let dz = dz.scatter(
            1,
            int_column::<B>(&s.targets[r], &device),
            a,
            IndexingUpdateOp::Add,
        );
        let dz = scale_rows(dz, inv_t);
        dh.push(mm(dz.clone(), s.w.clone(), s.autocast));
        let part = mm(dz.transpose(), hc, s.autocast);
        dw = Some(match dw {
            Some(acc) => acc + part,
            None => part,
        });
    }
    let dw = dw.unwrap_or_else(|| s.w.zeros_like());
    if dh.is_empty() {
        return (s.h.zeros_like(), dw);
    }
    (Tensor::cat(dh, 0), dw)
}

/// The causal bias of query rows `r0..r1` against keys `0..r1`: `[1, 1, 1, r1 - r0, r1]`.
fn block_bias<B: Backend>(r0: usize, r1: usize, device: &B::Device) -> Tensor<B, 5> {
    let rows = r1 - r0;
    let mut bias = vec![0.0f32; rows * r1];
    for i in 0..rows {
        bias[i * r1 + r0 + i + 1..(i + 1) * r1].fill(MASKED);
    }
    host_tensor(bias, [1, 1, 1, rows, r1], device)
}

/// One run's `q` as `[c, heads, n, d]` and `k`, `v` as `[c, kv_heads, n, d]`.
fn run_views<B: Backend>(
    q: &Tensor<B, 3>,
    k: &Tensor<B, 3>,
    v: &Tensor<B, 3>,
    run: &SegmentRun,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>) {
    let [_, nh, d] = q.dims();
    let nkv = k.dims()[1];
    let (c, n) = (run.count, run.len);
    let span = run.start..run.start + c * n;
    let split = |t: &Tensor<B, 3>, heads: usize| {
        t.clone()
            .slice([span.clone(), 0..heads, 0..d])
            .reshape([c, n, heads, d])
            .swap_dims(1, 2)
    };
    (split(q, nh), split(k, nkv), split(v, nkv))
}

/// Back from `[c, heads, n, d]` to `[c * n, heads, d]`.
fn rows_of<B: Backend>(t: Tensor<B, 4>) -> Tensor<B, 3> {
    let [c, h, n, d] = t.dims();
    t.swap_dims(1, 2).reshape([c * n, h, d])
}

/// The scores of query block `r0..r1` of one run, with the causal bias: `[c, kv_heads, groups, rows, r1]`.
/// Heads of one key/value group are adjacent, so grouped-query attention is a reshape.
fn block_scores<B: Backend>(
    qs: &Tensor<B, 4>,
    ks: &Tensor<B, 4>,
    (r0, r1): (usize, usize),
    scale: f64,
    autocast: bool,
) -> (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 5>) {
    let [c, nh, _, d] = qs.dims();
    let nkv = ks.dims()[1];
    let groups = nh / nkv;
    let rows = r1 - r0;
    let qb = qs
        .clone()
        .slice([0..c, 0..nh, r0..r1, 0..d])
        .reshape([c, nkv, groups * rows, d]);
    let kb = ks.clone().slice([0..c, 0..nkv, 0..r1, 0..d]);
    let scores = (mm(qb.clone(), kb.clone().swap_dims(2, 3), autocast) * scale)
        .reshape([c, nkv, groups, rows, r1])
        + block_bias::<B>(r0, r1, &qs.device());
    (qb, kb, scores)
}

/// Causal attention within each sequence of a packed row in query blocks of `block` rows: the output
/// `[rows, heads * d]` and, per run, each row's log-sum-exp `[c, kv_heads, groups, n, 1]`.
pub(crate) fn attention_forward<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    runs: &[SegmentRun],
    scale: f64,
    autocast: bool,
    block: usize,
) -> (Tensor<B, 2>, Vec<Tensor<B, 5>>) {
    let [_, nh, d] = q.dims();
    let nkv = k.dims()[1];
    let groups = nh / nkv;
    let mut outs = Vec::with_capacity(runs.len());
    let mut lses = Vec::with_capacity(runs.len());
    for run in runs {
        let (qs, ks, vs) = run_views(&q, &k, &v, run);
        let c = run.count;
        let mut blocks = Vec::new();
        let mut run_lse = Vec::new();
        for r in ranges(run.len, block) {
            let rows = r.len();
            let (_, _, scores) = block_scores(&qs, &ks, (r.start, r.end), scale, autocast);
            let lse = logsumexp(scores.clone());
            let probs = (scores - lse.clone())
                .exp()
                .reshape([c, nkv, groups * rows, r.end]);
            let vb = vs.clone().slice([0..c, 0..nkv, 0..r.end, 0..d]);
            blocks.push(mm(probs, vb, autocast).reshape([c, nh, rows, d]));
            run_lse.push(lse);
        }
        outs.push(rows_of(Tensor::cat(blocks, 2)).reshape([c * run.len, nh * d]));
        lses.push(Tensor::cat(run_lse, 3));
    }
    let out = if outs.len() == 1 {
        outs.pop().expect("one run")
    } else {
        Tensor::cat(outs, 0)
    };
    (out, lses)
}

/// What [`attention_backward`] recomputes from.
#[derive(Clone, Debug)]
pub(crate) struct AttnSaved<B: Backend> {
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    lse: Vec<Tensor<B, 5>>,
    runs: Arc<Vec<SegmentRun>>,
    scale: f64,
    autocast: bool,
    block: usize,
}

/// The gradients `(dq, dk, dv)` of [`attention_forward`] from the output's gradient `[rows, heads * d]`,
/// recomputing each query block's probabilities from the saved log-sum-exp.
pub(crate) fn attention_backward<B: Backend>(
    dout: Tensor<B, 2>,
    s: &AttnSaved<B>,
) -> (Tensor<B, 3>, Tensor<B, 3>, Tensor<B, 3>) {
    let [_, nh, d] = s.q.dims();
    let nkv = s.k.dims()[1];
    let groups = nh / nkv;
    let (mut dqs, mut dks, mut dvs) = (Vec::new(), Vec::new(), Vec::new());
    for (run, lse) in s.runs.iter().zip(&s.lse) {
        let (c, n) = (run.count, run.len);
        let (qs, ks, vs) = run_views(&s.q, &s.k, &s.v, run);
        let dos = dout
            .clone()
            .slice([run.start..run.start + c * n, 0..nh * d])
            .reshape([c, n, nh, d])
            .swap_dims(1, 2);
        let mut dk = ks.zeros_like();
        let mut dv = vs.zeros_like();
        let mut dq_blocks = Vec::new();
        for r in ranges(n, s.block) {
            let rows = r.len();
            let (qb, kb, scores) = block_scores(&qs, &ks, (r.start, r.end), s.scale, s.autocast);
            let lse_b = lse.clone().slice([0..c, 0..nkv, 0..groups, r.clone(), 0..1]);
            let p = (scores - lse_b).exp().reshape([c, nkv, groups * rows, r.end]);
            let vb = vs.clone().slice([0..c, 0..nkv, 0..r.end, 0..d]);
            let dob = dos
                .clone()
                .slice([0..c, 0..nh, r.clone(), 0..d])
                .reshape([c, nkv, groups * rows, d]);
            let keys = [0..c, 0..nkv, 0..r.end, 0..d];
            dv = dv.clone().slice_assign(
                keys.clone(),
                dv.slice(keys.clone()) + mm(p.clone().swap_dims(2, 3), dob.clone(), s.autocast),
            );
            // dS = P (dP - rowsum(P dP)), with dP = dO V^T.
            let dp = mm(dob, vb.swap_dims(2, 3), s.autocast);
            let live = (p.clone() * dp.clone()).sum_dim(3);
            let ds = p * (dp - live);
            dq_blocks.push((mm(ds.clone(), kb, s.autocast) * s.scale).reshape([c, nh, rows, d]));
            dk = dk.clone().slice_assign(
                keys.clone(),
                dk.slice(keys) + mm(ds.swap_dims(2, 3), qb, s.autocast) * s.scale,
            );
        }
        dqs.push(rows_of(Tensor::cat(dq_blocks, 2)));
        dks.push(rows_of(dk));
        dvs.push(rows_of(dv));
    }
    let cat = |mut parts: Vec<Tensor<B, 3>>| {
        if parts.len() == 1 {
            parts.pop().expect("one run")
        } else {
            Tensor::cat(parts, 0)
        }
    };
    (cat(dqs), cat(dks), cat(dvs))
}

fn inner<B: Backend, const D: usize>(t: FloatTensor<B>) -> Tensor<B, D> {
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

fn primitive<B: Backend, const D: usize>(t: Tensor<B, D>) -> FloatTensor<B> {
    t.into_primitive().tensor()
}

#[derive(Debug)]
struct LogpBackward;

impl<B: Backend> Backward<B, 2> for LogpBackward {
    type State = LogpSaved<B>;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_h, node_w] = ops.parents;
        let g = inner::<B, 2>(grads.consume::<B>(&ops.node));
        let (dh, dw) = logp_backward(g, &ops.state);
        if let Some(node) = node_h {
            grads.register::<B>(node.id, primitive(dh));
        }
        if let Some(node) = node_w {
            grads.register::<B>(node.id, primitive(dw));
        }
    }
}

#[derive(Debug)]
struct AttnBackward;

impl<B: Backend> Backward<B, 3> for AttnBackward {
    type State = AttnSaved<B>;

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let dout = inner::<B, 2>(grads.consume::<B>(&ops.node));
        let (dq, dk, dv) = attention_backward(dout, &ops.state);
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<B>(node.id, primitive(grad));
            }
        }
    }
}

/// [`logp_forward`] as one autodiff node that keeps `h`, `w` and two numbers per row.
pub(crate) fn logp_autodiff<B: Backend>(
    h: Tensor<Autodiff<B>, 2>,
    w: Tensor<Autodiff<B>, 2>,
    targets: &[i64],
    inv_temperatures: &[f32],
    autocast: bool,
    chunk: usize,
) -> Tensor<Autodiff<B>, 2> {
    let (h, w) = (h.into_primitive().tensor(), w.into_primitive().tensor());
    let prep = LogpBackward
        .prepare::<NoCheckpointing>([h.node.clone(), w.node.clone()])
        .compute_bound()
        .stateful();
    let (hi, wi) = (inner::<B, 2>(h.primitive), inner::<B, 2>(w.primitive));
    let (out, lse) = logp_forward(hi.clone(), wi.clone(), targets, inv_temperatures, autocast, chunk);
    let n = targets.len();
    let out = match prep {
        OpsKind::Tracked(prep) => {
            let state = LogpSaved {
                h: hi,
                w: wi,
                lse,
                entropy: out.clone().slice([0..n, 1..2]),
                targets: Arc::new(targets.to_vec()),
                inv_temperatures: Arc::new(inv_temperatures.to_vec()),
                autocast,
                chunk,
            };
            prep.finish(state, primitive(out))
        }
        OpsKind::UnTracked(prep) => prep.finish(primitive(out)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// [`attention_forward`] as one autodiff node that keeps `q`, `k`, `v` and each row's log-sum-exp.
pub(crate) fn attention_autodiff<B: Backend>(
    q: Tensor<Autodiff<B>, 3>,
    k: Tensor<Autodiff<B>, 3>,
    v: Tensor<Autodiff<B>, 3>,
    runs: &[SegmentRun],
    scale: f64,
    autocast: bool,
    block: usize,
) -> Tensor<Autodiff<B>, 2> {
    let [q, k, v] = [q, k, v].map(|t| t.into_primitive().tensor());
    let prep = AttnBackward
        .prepare::<NoCheckpointing>([q.node.clone(), k.node.clone(), v.node.clone()])
        .compute_bound()
        .stateful();
    let [qi, ki, vi] = [q.primitive, k.primitive, v.primitive].map(inner::<B, 3>);
    let (out, lse) = attention_forward(qi.clone(), ki.clone(), vi.clone(), runs, scale, autocast, block);
    let out = match prep {
        OpsKind::Tracked(prep) => {
            let state = AttnSaved {
                q: qi,
                k: ki,
                v: vi,
                lse,
                runs: Arc::new(runs.to_vec()),
                scale,
                autocast,
                block,
            };
            prep.finish(state, primitive(out))
        }
        OpsKind::UnTracked(prep) => prep.finish(primitive(out)),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}
