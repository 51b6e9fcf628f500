//! Every computation whose best form depends on the backend, as one trait each backend implements
//! (burn's extension pattern): projections, RMSNorm, RoPE, SwiGLU, attention in its two memory layouts
//! (packed sequences for training, key/value cache columns for generation), the output projection fused
//! with the log-softmax, the target's log-probability and the entropy, whole decoder layers, and the moves
//! and host copies of the generation engine's cache and logits.
//!
//! The provided methods are burn tensor operations (used on CUDA and by the `f64` gradient checks); packed
//! attention and the output projection come from `train/chunked.rs`, in query blocks and chunks of rows, and
//! under autodiff they are nodes of their own that keep one log-sum-exp per row instead of probabilities, so
//! the memory a step keeps grows linearly with the sequence. The CPU backends override every operation with
//! kernels that read operands in place and, under autodiff, bring their own backward pass (`kernels/cpu.rs`
//! over the array kernels of `cpu_math.rs`): burn-ndarray copies every strided matmul operand and takes
//! several allocating passes per elementwise chain, so a step spent more time moving memory than
//! multiplying. Only the CPU's autodiff backend implements layer recompute ([`Kernels::RECOMPUTES_LAYERS`]).

pub(crate) mod cpu;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

#[cfg(test)]
use burn::tensor::activation::log_softmax;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Element, FloatDType, Int, Tensor, TensorData};

use crate::model::{CausalLm, DecoderLayer, MASKED};
use crate::train::chunked;
use crate::train::pack::SegmentRun;

/// How one forward pass computes: bf16 products, the chunk sizes of the memory-bound operations, and
/// whether decoder layers recompute their activations in the backward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    pub(crate) autocast: bool,
    /// Rows of logits per chunk of the output projection.
    pub(crate) logits_chunk: usize,
    /// Query rows per attention block.
    pub(crate) attention_block: usize,
    pub(crate) recompute: bool,
}

/// The float type of backend `B`'s tensors. Backends on the same device share its default dtype (burn keys
/// device settings by device), so training code names the element type explicitly: an `f64` backend used
/// next to the `f32` one must still compute in `f64`.
pub(crate) fn float_dtype<B: Backend>() -> DType {
    <B::FloatElem as Element>::dtype()
}

/// A float tensor of `B`'s element type from host `f32` data.
pub(crate) fn host_tensor<B: Backend, const D: usize>(
    data: Vec<f32>,
    shape: [usize; D],
    device: &B::Device,
) -> Tensor<B, D> {
    Tensor::from_data(TensorData::new(data, shape), (device, float_dtype::<B>()))
}

/// Matrix product, in bf16 with f32 results when `autocast` is on.
pub(crate) fn mm<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
    autocast: bool,
) -> Tensor<B, D> {
    if autocast {
        a.cast(FloatDType::BF16)
            .matmul(b.cast(FloatDType::BF16))
            .cast(FloatDType::F32)
    } else {
        a.matmul(b)
    }
}

#[cfg(test)]
fn causal_bias<B: Backend>(n: usize, device: &B::Device) -> Tensor<B, 5> {
    let mut bias = vec![0.0f32; n * n];
    for q in 0..n {
        for k in q + 1..n {
            bias[q * n + k] = MASKED;
        }
    }
    host_tensor(bias, [1, 1, 1, n, n], device)
}

/// The rotary tables of a pass's rows (a packed row's tokens, or a batch's `[batch * len]` positions):
/// `cos` and `sin` per row, `head_dim` wide (the half-table twice), as `[rows, 1, head_dim]` tensors; the
/// CPU kernels read their memory directly.
#[derive(Clone, Debug)]
pub(crate) struct RopeRows<B: Backend> {
    pub(crate) cos: Tensor<B, 3>,
    pub(crate) sin: Tensor<B, 3>,
}

impl<B: Backend> RopeRows<B> {
    pub(crate) fn new(
        cos: Vec<f32>,
        sin: Vec<f32>,
        rows: usize,
        head_dim: usize,
        device: &B::Device,
    ) -> Self {
        Self {
            cos: host_tensor(cos, [rows, 1, head_dim], device),
            sin: host_tensor(sin, [rows, 1, head_dim], device),
        }
    }
}

/// The key columns each query of a `[batch, len]` pass attends to: query `t` of row `b` sees the columns
/// `lo..hi` of `keys`, one contiguous span (a row's own columns up to the query's, or a padding query's
/// own column alone). Held on the host for the CPU kernels and as `[batch, 1, 1, len, 1]` integer tensors
/// for the generic ones, so no `len x keys` mask exists outside one block of scores.
#[derive(Clone, Debug)]
pub(crate) struct KeySpans<B: Backend> {
    /// `[lo, hi)` of each query, `batch * len` of them in row-major order.
    pub(crate) host: Arc<[[u32; 2]]>,
    pub(crate) lo: Tensor<B, 5, Int>,
    pub(crate) hi: Tensor<B, 5, Int>,
    /// The key columns the pass reads: the cached ones before it, then its own.
    pub(crate) keys: usize,
}

impl<B: Backend> KeySpans<B> {
    /// Spans of `batch * len` queries over `keys` columns, each non-empty and within them.
    pub(crate) fn new(spans: Vec<[u32; 2]>, [batch, len, keys]: [usize; 3], device: &B::Device) -> Self {
        debug_assert_eq!(spans.len(), batch * len, "one span per query");
        debug_assert!(
            spans.iter().all(|&[lo, hi]| lo < hi && hi as usize <= keys),
            "spans are non-empty and within the keys"
        );
        let ends = |i: usize| -> Tensor<B, 5, Int> {
            let data: Vec<i64> = spans.iter().map(|s| i64::from(s[i])).collect();
            Tensor::from_data(TensorData::new(data, [batch, 1, 1, len, 1]), device)
        };
        Self {
            lo: ends(0),
            hi: ends(1),
            host: spans.into(),
            keys,
        }
    }
}

/// The backend-specific operations of training and generation on one backend.
pub(crate) trait Kernels: Backend {
    /// Whether [`Kernels::decoder_layer`] honours [`Pass::recompute`].
    const RECOMPUTES_LAYERS: bool = false;

    /// `x W^T` for `x` `[rows, in]` and `W` `[out, in]`, in bf16 with f32 results when `autocast` is on or
    /// the weight is bf16 (an inference policy's, [`CausalLm::with_matrices_in`]).
    fn project(x: Tensor<Self, 2>, w: Tensor<Self, 2>, autocast: bool) -> Tensor<Self, 2> {
        if autocast || w.dtype() == DType::BF16 {
            let w = if w.dtype() == DType::BF16 {
                w
            } else {
                w.cast(FloatDType::BF16)
            };
            return x
                .cast(FloatDType::BF16)
                .matmul(w.transpose())
                .cast(FloatDType::F32);
        }
        x.matmul(w.transpose())
    }

    /// RMSNorm over the last dimension of `x` `[rows, dim]` with scale `w` `[dim]`.
    fn rms_norm(x: Tensor<Self, 2>, w: Tensor<Self, 1>, eps: f64) -> Tensor<Self, 2> {
        let ms = (x.clone() * x.clone()).mean_dim(1);
        // A division, not `recip()`: burn-ndarray's SIMD reciprocal is an approximation (~1e-4 relative).
        x / (ms + eps).sqrt() * w.unsqueeze::<2>()
    }

    /// Rotary embedding (Hugging Face's half-rotation layout) on `x` `[rows, heads, head_dim]`.
    fn rope(x: Tensor<Self, 3>, rows: &RopeRows<Self>) -> Tensor<Self, 3> {
        let [t, h, d] = x.dims();
        let half = d / 2;
        let x1 = x.clone().slice([0..t, 0..h, 0..half]);
        let x2 = x.clone().slice([0..t, 0..h, half..d]);
        let rotated = Tensor::cat(vec![x2.neg(), x1], 2);
        x * rows.cos.clone() + rotated * rows.sin.clone()
    }

    /// `silu(gate) * up`.
    fn swiglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        // x * sigmoid(x) as one division; burn's generic sigmoid takes four transcendental passes.
        gate.clone() / (gate.neg().exp() + 1.0) * up
    }

    /// Causal attention within each sequence of a packed row: `q` `[rows, heads, d]` and `k`, `v`
    /// `[rows, kv_heads, d]` (after RoPE), `runs` covering the rows, queries in blocks of `block` rows;
    /// returns `[rows, heads * d]`.
    fn packed_attention(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        runs: &[SegmentRun],
        scale: f64,
        autocast: bool,
        block: usize,
    ) -> Tensor<Self, 2> {
        chunked::attention_forward(q, k, v, runs, scale, autocast, block).0
    }

    /// Attention over key/value cache columns: `q` `[batch, heads, len, d]` (after RoPE), `k` and `v`
    /// `[batch, kv_heads, columns, d]` of which the first `spans.keys` are used, each query attending to
    /// its span of them ([`KeySpans`]); returns `[batch, heads, len, d]`.
    fn cached_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        spans: &KeySpans<Self>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        burn_cached_attention(q, k, v, spans, scale)
    }

    /// The output projection of hidden states `h` `[N, hidden]` with `w` `[vocab, hidden]`, row `i`
    /// multiplied by `inv_temperatures[i]`, then per row the log-probability of `targets[i]` and the entropy
    /// of that tempered distribution: `[N, 2]`, computed `chunk` rows at a time.
    fn token_logp(
        h: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        targets: &[i64],
        inv_temperatures: &[f32],
        autocast: bool,
        chunk: usize,
    ) -> Tensor<Self, 2> {
        chunked::logp_forward(h, w, targets, inv_temperatures, autocast, chunk).0
    }

    /// One decoder layer over a packed training row whose sequences are `runs`; with `recompute` (and
    /// autodiff) its activations are recomputed in the backward pass instead of kept. Only the CPU's
    /// autodiff backend overrides it.
    fn decoder_layer(
        x: Tensor<Self, 2>,
        l: &DecoderLayer<Self>,
        rows: &RopeRows<Self>,
        runs: &[SegmentRun],
        pass: Pass,
    ) -> Tensor<Self, 2> {
        l.forward_packed(x, rows, runs, pass)
    }

    /// `model` with its weights laid out for generation; the generic layout is the training one.
    fn for_inference(model: CausalLm<Self>) -> CausalLm<Self> {
        model
    }

    /// Zeros of `shape` (a fresh key/value cache).
    fn zeros<const D: usize>(shape: [usize; D], device: &Self::Device) -> Tensor<Self, D> {
        Tensor::zeros(shape, (device, float_dtype::<Self>()))
    }

    /// A zeroed `[rows, heads, capacity, d]` tensor holding `parts` stacked along the rows: part
    /// `(t, cols, at)` contributes every row of `t` (`[n, heads, _, d]`), its columns `cols` written from
    /// column `at` (the generation engine's cache moves).
    fn assemble(
        parts: &[(&Tensor<Self, 4>, Range<usize>, usize)],
        capacity: usize,
        device: &Self::Device,
    ) -> Tensor<Self, 4> {
        let placed = parts
            .iter()
            .map(|(t, cols, at)| {
                let [b, h, _, d] = t.dims();
                Self::zeros([b, h, capacity, d], device).slice_assign(
                    [0..b, 0..h, *at..*at + cols.len(), 0..d],
                    (*t).clone().slice([0..b, 0..h, cols.clone(), 0..d]),
                )
            })
            .collect();
        Tensor::cat(placed, 0)
    }

    /// The elements of `t` in row-major order, on the host.
    fn to_host<const D: usize>(t: Tensor<Self, D>) -> Vec<f32> {
        t.into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("converted to f32 just above")
    }
}

/// Score elements (`batch x heads x query rows x keys`) that one block of the generic attention over the
/// cache may hold: 2^26, 256 MiB in f32 (a 20k-token prefill of an 8B model would otherwise hold 51 GB).
pub(crate) const SCORE_BUDGET: usize = 1 << 26;

/// Query rows per block of the generic attention over the cache: as many as [`SCORE_BUDGET`] allows, at
/// least one, at most `len`.
pub(crate) fn cached_query_rows(batch: usize, heads: usize, len: usize, keys: usize) -> usize {
    (SCORE_BUDGET / (batch * heads * keys).max(1)).clamp(1, len.max(1))
}

/// Grouped-query attention over cache columns in burn tensor operations (see
/// [`Kernels::cached_attention`]), in blocks of query rows sized by [`cached_query_rows`].
pub(crate) fn burn_cached_attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    spans: &KeySpans<B>,
    scale: f64,
) -> Tensor<B, 4> {
    let [batch, heads, len, _] = q.dims();
    let rows = cached_query_rows(batch, heads, len, spans.keys);
    burn_cached_attention_in_blocks(q, k, v, spans, scale, rows)
}

/// [`burn_cached_attention`] in blocks of `rows` query rows: only one block's `[batch, heads, rows, keys]`
/// scores, and its `[batch, rows, keys]` mask built from the spans, exist at a time, so memory grows
/// linearly with the keys, not with `len x keys`.
pub(crate) fn burn_cached_attention_in_blocks<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    spans: &KeySpans<B>,
    scale: f64,
    rows: usize,
) -> Tensor<B, 4> {
    let [batch, nh, len, d] = q.dims();
    let nkv = k.dims()[1];
    let keys = spans.keys;
    let device = q.device();
    let groups = nh / nkv;
    let (k, v) = if k.dims()[2] == keys {
        (k, v)
    } else {
        let keep = [0..batch, 0..nkv, 0..keys, 0..d];
        (k.slice(keep.clone()), v.slice(keep))
    };
    let kt = k.swap_dims(2, 3);
    // Queries of one key/value head are contiguous, so grouped-query attention is a reshape, not a repeat.
    let q = q.reshape([batch, nkv, groups, len, d]);
    let columns = Tensor::<B, 1, Int>::arange(0..keys as i64, &device).reshape([1, 1, 1, 1, keys]);
    let block = |t0: usize, t1: usize| {
        let n = t1 - t0;
        let (qb, lo, hi) = if n == len {
            (q.clone(), spans.lo.clone(), spans.hi.clone())
        } else {
            let queries = [0..batch, 0..1, 0..1, t0..t1, 0..1];
            (
                q.clone().slice([0..batch, 0..nkv, 0..groups, t0..t1, 0..d]),
                spans.lo.clone().slice(queries.clone()),
                spans.hi.clone().slice(queries),
            )
        };
        // The block's additive mask: 0 inside each query's span, MASKED outside.
        let shape = [batch, 1, 1, n, keys];
        let cols = columns.clone().expand(shape);
        let outside = cols
            .clone()
            .lower(lo.expand(shape))
            .bool_or(cols.greater_equal(hi.expand(shape)));
        let mask = outside.float().cast(float_dtype::<B>()) * f64::from(MASKED);
        let scores = qb.reshape([batch, nkv, groups * n, d]).matmul(kt.clone()) * scale;
        let scores = scores.reshape([batch, nkv, groups, n, keys]) + mask;
        softmax(scores, 4)
            .reshape([batch, nkv, groups * n, keys])
            .matmul(v.clone())
            .reshape([batch, nkv, groups, n, d])
    };
    let out = if rows >= len {
        block(0, len)
    } else {
        Tensor::cat(
            chunked::ranges(len, rows)
                .map(|r| block(r.start, r.end))
                .collect(),
            3,
        )
    };
    out.reshape([batch, nh, len, d])
}

/// Causal attention without blocks, the whole `n x n` score matrix per sequence under burn's autodiff: the
/// reference the blocked kernels are checked against.
#[cfg(test)]
pub(crate) fn dense_attention<B: Backend>(
    q: Tensor<B, 3>,
    k: Tensor<B, 3>,
    v: Tensor<B, 3>,
    runs: &[SegmentRun],
    scale: f64,
) -> Tensor<B, 2> {
    let [_, nh, d] = q.dims();
    let nkv = k.dims()[1];
    let groups = nh / nkv;
    let device = q.device();
    let mut outs = Vec::with_capacity(runs.len());
    for run in runs {
        let (c, n) = (run.count, run.len);
        let span = run.start..run.start + c * n;
        let qs = q
            .clone()
            .slice([span.clone(), 0..nh, 0..d])
            .reshape([c, n, nh, d])
            .swap_dims(1, 2)
            .reshape([c, nkv, groups * n, d]);
        let ks = k
            .clone()
            .slice([span.clone(), 0..nkv, 0..d])
            .reshape([c, n, nkv, d])
            .swap_dims(1, 2);
        let vs = v
            .clone()
            .slice([span, 0..nkv, 0..d])
            .reshape([c, n, nkv, d])
            .swap_dims(1, 2);
        let scores = qs.matmul(ks.swap_dims(2, 3)) * scale;
        let scores = scores.reshape([c, nkv, groups, n, n]) + causal_bias::<B>(n, &device);
        let probs = softmax(scores, 4).reshape([c, nkv, groups * n, n]);
        outs.push(
            probs
                .matmul(vs)
                .reshape([c, nh, n, d])
                .swap_dims(1, 2)
                .reshape([c * n, nh * d]),
        );
    }
    Tensor::cat(outs, 0)
}

/// The output projection, each row's temperature, log-softmax, target log-probability and entropy over all
/// rows at once under burn's autodiff: the reference the chunked kernels are checked against.
#[cfg(test)]
pub(crate) fn dense_token_logp<B: Backend>(
    h: Tensor<B, 2>,
    w: Tensor<B, 2>,
    targets: &[i64],
    inv_temperatures: &[f32],
) -> Tensor<B, 2> {
    let n = targets.len();
    let device = h.device();
    let inv = host_tensor::<B, 2>(inv_temperatures.to_vec(), [n, 1], &device);
    let logits = h.matmul(w.transpose()) * inv;
    let log_probs = log_softmax(logits, 1);
    let targets: Tensor<B, 2, Int> = Tensor::from_data(TensorData::new(targets.to_vec(), [n, 1]), &device);
    let logp = log_probs.clone().gather(1, targets);
    let entropy = (log_probs.clone().exp() * log_probs).sum_dim(1).neg();
    Tensor::cat(vec![logp, entropy], 1)
}

/// The kernels of `Autodiff<$inner>`: the chunked operations as autodiff nodes of their own.
macro_rules! autodiff_kernels {
    ($inner:ty) => {
        impl Kernels for burn_autodiff::Autodiff<$inner> {
            fn packed_attention(
                q: Tensor<Self, 3>,
                k: Tensor<Self, 3>,
                v: Tensor<Self, 3>,
                runs: &[SegmentRun],
                scale: f64,
                autocast: bool,
                block: usize,
            ) -> Tensor<Self, 2> {
                chunked::attention_autodiff::<$inner>(q, k, v, runs, scale, autocast, block)
            }

            fn token_logp(
                h: Tensor<Self, 2>,
                w: Tensor<Self, 2>,
                targets: &[i64],
                inv_temperatures: &[f32],
                autocast: bool,
                chunk: usize,
            ) -> Tensor<Self, 2> {
                chunked::logp_autodiff::<$inner>(h, w, targets, inv_temperatures, autocast, chunk)
            }
        }
    };
}

impl Kernels for burn_ndarray::NdArray<f64> {}
autodiff_kernels!(burn_ndarray::NdArray<f64>);
#[cfg(feature = "cuda")]
impl Kernels for crate::backend::Cuda {}
#[cfg(feature = "cuda")]
autodiff_kernels!(crate::backend::Cuda);
