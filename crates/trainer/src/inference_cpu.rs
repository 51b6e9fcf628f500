//! Faster inference kernels for the plain CPU backend ([`crate::backend::Cpu`], never under autodiff), where
//! burn-ndarray's generic operations copy their operands and make several allocating passes per call.
//!
//! - Projections `x W^T`: the engine stores every weight matrix column-major ([`for_inference`]), which the
//!   `gemm` crate reads in place at any row count; gemm repacks a row-major weight on every call, which for
//!   a decode batch cost three times the multiplication. Row-major weights (tests, scoring outside the
//!   engine) of up to [`SMALL_ROWS`] rows take a dot-product kernel instead.
//! - Attention reads the key/value cache in place, in blocks of query rows multiplied only by the keys
//!   their mask allows, around a vectorised masked softmax.
//! - RMSNorm, RoPE and SwiGLU are the training path's one-pass forward kernels (`cpu_math.rs`, shared with the training kernels).
//! - The engine's cache moves ([`assemble`]) and fresh caches ([`zeros`]) take one copy or none, where
//!   burn's zeros, slice, slice-assign and concatenation each copy.
//!
//! The hot elementwise loops are compiled for AVX-512 and AVX2 as well as the portable target and chosen at
//! run time (`simd_fn!`), with bit-identical results.

use std::any::Any;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_ndarray::NdArrayTensor;
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis, Ix2};
use rayon::prelude::*;

use crate::backend::Cpu;
use crate::cpu_math::simd_fn;
use crate::model::CausalLm;

#[cfg(test)]
mod tests;

/// Up to this many input rows, the dot-product kernel beats the packed matrix product.
pub(crate) const SMALL_ROWS: usize = 4;

/// Query rows per attention block; each block multiplies only by the keys its rows may see.
const QUERY_BLOCK: usize = 64;

/// Below this many input rows a projection stays on one thread: for a decode batch, waking the pool costs
/// more than the second core saves.
const PARALLEL_ROWS: usize = 32;

/// A weight of at least this many elements is split over threads even for few rows: an output projection
/// over the vocabulary, and the projections of a model of SmolLM2-135M's width (576 by 1536: one thread
/// for those left the second core idle through most of a decode step at batch 16).
const PARALLEL_WEIGHT: usize = 1 << 18;

/// Below this many multiply-adds a projection stays on one thread.
const PARALLEL_WORK: usize = 1 << 16;

/// `x W^T` for `x` `[rows, in]` and `W` `[out, in]` when `B` is the plain CPU backend; `None` otherwise.
pub(crate) fn project<B: Backend>(x: &Tensor<B, 2>, w: &Tensor<B, 2>) -> Option<Tensor<B, 2>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Cpu>() {
        return None;
    }
    let x_prim = x.clone().into_primitive().tensor();
    let w_prim = w.clone().into_primitive().tensor();
    let x_nd = (&x_prim as &dyn Any).downcast_ref::<NdArrayTensor>()?;
    let w_nd = (&w_prim as &dyn Any).downcast_ref::<NdArrayTensor>()?;
    let (NdArrayTensor::F32(xs), NdArrayTensor::F32(ws)) = (x_nd, w_nd) else {
        return None;
    };
    let x_view = xs.view().into_dimensionality::<Ix2>().ok()?;
    let w_view = ws.view().into_dimensionality::<Ix2>().ok()?;
    if x_view.ncols() != w_view.ncols() {
        return None;
    }
    // A column-major weight (see [`for_inference`]) is read in place by gemm at any row count; a row-major
    // one would be repacked by gemm on every call, so few rows take the dot-product kernel instead.
    let column_major = w_view.strides()[0] == 1 && w_view.nrows() > 1;
    let out = if !column_major && x_view.nrows() <= SMALL_ROWS {
        rows_times_weight(x_view, w_view)
    } else {
        matmul_transposed(x_view, w_view)
    };
    from_array(out.into_dyn())
}

/// Stores every matrix of `model` column-major (`W^T` contiguous, the logical `[out, in]` shape unchanged)
/// when `B` is the plain CPU backend; other backends get the model back as it is.
///
/// gemm multiplies a row-major `[out, in]` weight by first repacking it, a full pass over the matrix on
/// every call: for a decode batch, where each weight meets a handful of rows, that repacking cost three
/// times the multiplication itself. A column-major weight is a layout gemm's kernels read directly.
/// Only the inference engine uses this; the training path keeps Hugging Face's row-major layout.
pub(crate) fn for_inference<B: Backend>(model: CausalLm<B>) -> CausalLm<B> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Cpu>() {
        return model;
    }
    model.map(&mut ColumnMajor)
}

struct ColumnMajor;

impl<B: Backend> ModuleMapper<B> for ColumnMajor {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if D != 2 {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        let tensor = match cpu_primitive(&tensor) {
            Some(NdArrayTensor::F32(s)) => {
                // Reverse the axes, copy into standard layout, reverse back: the same matrix, transposed in
                // memory.
                let transposed = s.view().reversed_axes().as_standard_layout().into_owned();
                from_array(transposed.reversed_axes()).unwrap_or(tensor)
            }
            _ => tensor,
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

/// Zeros of `shape` on the plain CPU backend, from zeroed memory: burn-ndarray fills a vector element by
/// element and then copies it.
pub(crate) fn zeros<B: Backend, const D: usize>(shape: [usize; D]) -> Option<Tensor<B, D>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Cpu>() {
        return None;
    }
    from_array(ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&shape)))
}

/// On the plain CPU backend, a zeroed `[rows, heads, capacity, d]` tensor holding `parts` stacked along the
/// rows: part `(t, cols, at)` contributes every row of `t` (`[n, heads, _, d]`), its columns `cols`
/// written from column `at`. One copy per element, where burn's zeros, slice, slice-assign and
/// concatenation make four.
pub(crate) fn assemble<B: Backend>(
    parts: &[(&Tensor<B, 4>, std::ops::Range<usize>, usize)],
    capacity: usize,
) -> Option<Tensor<B, 4>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Cpu>() {
        return None;
    }
    let [_, heads, _, d] = parts.first()?.0.dims();
    let prims: Vec<_> = parts
        .iter()
        .map(|(t, _, _)| (*t).clone().into_primitive().tensor())
        .collect();
    let mut views = Vec::with_capacity(parts.len());
    for p in &prims {
        let view = f32_view::<B>(p)?.into_dimensionality::<ndarray::Ix4>().ok()?;
        let (_, h, _, dd) = view.dim();
        if h != heads || dd != d {
            return None;
        }
        views.push(view);
    }
    let rows: usize = views.iter().map(|v| v.dim().0).sum();
    let mut out = ndarray::Array4::<f32>::zeros((rows, heads, capacity, d));
    let mut row = 0;
    for (view, (_, cols, at)) in views.iter().zip(parts) {
        let n = view.dim().0;
        if cols.end > view.dim().2 || at + cols.len() > capacity {
            return None;
        }
        out.slice_mut(ndarray::s![row..row + n, .., *at..*at + cols.len(), ..])
            .assign(&view.slice(ndarray::s![.., .., cols.clone(), ..]));
        row += n;
    }
    from_array(out.into_dyn())
}

/// The elements of `t` in row-major order, copied straight from memory on the plain CPU backend: burn's
/// `into_data` walks ndarray's dynamic-rank iterator element by element, a tenth of a decode step for the
/// logits alone.
pub(crate) fn host_f32<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    if std::any::TypeId::of::<B>() == std::any::TypeId::of::<Cpu>() {
        let prim = t.clone().into_primitive().tensor();
        if let Some(NdArrayTensor::F32(storage)) = (&prim as &dyn Any).downcast_ref::<NdArrayTensor>() {
            let view = storage.view();
            if let Some(slice) = view.as_slice() {
                return slice.to_vec();
            }
            return view.iter().copied().collect();
        }
    }
    t.into_data()
        .convert::<f32>()
        .into_vec::<f32>()
        .expect("converted to f32 just above")
}

/// The tensor's elements as a contiguous `[rows, last]` view, when it is an f32 CPU tensor in standard layout.
fn rows_view<'a>(p: &'a NdArrayTensor, dims: &[usize]) -> Option<ArrayView2<'a, f32>> {
    let NdArrayTensor::F32(s) = p else {
        return None;
    };
    let last = *dims.last()?;
    let rows: usize = dims[..dims.len() - 1].iter().product();
    let view = s.view();
    view.as_slice()?;
    view.into_shape_with_order((rows, last)).ok()
}

/// The primitive of a plain-CPU tensor; `None` for any other backend.
fn cpu_primitive<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Option<NdArrayTensor> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Cpu>() {
        return None;
    }
    let prim = t.clone().into_primitive().tensor();
    let boxed: Box<dyn Any> = Box::new(prim);
    boxed.downcast::<NdArrayTensor>().ok().map(|b| *b)
}

/// RMSNorm over the last dimension in one pass, `x / sqrt(mean(x^2) + eps) * w`, on the plain CPU backend.
pub(crate) fn rms_norm<B: Backend, const D: usize>(
    x: &Tensor<B, D>,
    w: &Tensor<B, 1>,
    eps: f64,
) -> Option<Tensor<B, D>> {
    let dims = x.dims();
    let (xp, wp) = (cpu_primitive(x)?, cpu_primitive(w)?);
    let xv = rows_view(&xp, &dims)?;
    let NdArrayTensor::F32(ws) = &wp else {
        return None;
    };
    let wv = ws.view().into_dimensionality::<ndarray::Ix1>().ok()?;
    if wv.len() != xv.ncols() {
        return None;
    }
    let (y, _) = crate::cpu_math::rms_forward(xv, wv, eps as f32);
    let y = y.into_shape_with_order(ndarray::IxDyn(&dims)).ok()?;
    from_array(y)
}

/// Rotary embedding on `x` `[batch, len, heads, d]` (before the heads move forward) with `cos`/`sin`
/// `[batch, 1, len, d]`, in one pass on the plain CPU backend.
pub(crate) fn rope<B: Backend>(
    x: &Tensor<B, 4>,
    cos: &Tensor<B, 4>,
    sin: &Tensor<B, 4>,
) -> Option<Tensor<B, 4>> {
    let [batch, len, heads, d] = x.dims();
    if cos.dims() != [batch, 1, len, d] || sin.dims() != [batch, 1, len, d] || d % 2 != 0 {
        return None;
    }
    let (xp, cp, sp) = (cpu_primitive(x)?, cpu_primitive(cos)?, cpu_primitive(sin)?);
    let xv = rows_view(&xp, &[batch * len, heads * d])?
        .into_shape_with_order((batch * len, heads, d))
        .ok()?;
    let (NdArrayTensor::F32(cs), NdArrayTensor::F32(ss)) = (&cp, &sp) else {
        return None;
    };
    let (cv, sv) = (cs.view(), ss.view());
    let y = crate::cpu_math::rope(xv, cv.as_slice()?, sv.as_slice()?, false);
    let y = y
        .into_shape_with_order(ndarray::IxDyn(&[batch, len, heads, d]))
        .ok()?;
    from_array(y)
}

/// `silu(gate) * up` in one pass on the plain CPU backend.
pub(crate) fn swiglu<B: Backend, const D: usize>(
    gate: &Tensor<B, D>,
    up: &Tensor<B, D>,
) -> Option<Tensor<B, D>> {
    let dims = gate.dims();
    if up.dims() != dims {
        return None;
    }
    let (gp, up) = (cpu_primitive(gate)?, cpu_primitive(up)?);
    let y = crate::cpu_math::swiglu_forward(rows_view(&gp, &dims)?, rows_view(&up, &dims)?);
    let y = y.into_shape_with_order(ndarray::IxDyn(&dims)).ok()?;
    from_array(y)
}

/// `x W^T` with the `gemm` crate (runtime-selected SIMD kernels), reading both operands in place.
fn matmul_transposed(x: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>) -> Array2<f32> {
    let (m, k, n) = (x.nrows(), x.ncols(), w.nrows());
    let mut out = Array2::<f32>::zeros((m, n));
    let parallel = m * n * k >= 4 * PARALLEL_WORK && (m >= PARALLEL_ROWS || n * k >= PARALLEL_WEIGHT);
    gemm_into(out.view_mut(), x, w.t(), 1.0, parallel);
    out
}

/// `dst = scale * a b` for any strides, on rayon's threads when `parallel`; `dst` must not overlap `a` or
/// `b`.
fn gemm_into(
    dst: ArrayViewMut2<'_, f32>,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    scale: f32,
    parallel: bool,
) {
    crate::cpu_math::gemm_with(dst, a, b, scale, false, parallel);
}

/// Grouped-query attention `softmax(scale * q k^T + bias) v` on the plain CPU backend: per head, two gemm
/// calls on views of `q`, `k` and `v` (no copies) around a fused masked softmax, heads in parallel.
///
/// `q` is `[batch, heads, len, d]`, `k` and `v` `[batch, kv_heads, columns, d]` of which the first `keys`
/// columns are used (the whole key/value cache can be passed as is), `bias` `[batch, 1, 1, len, keys]`;
/// returns `[batch, heads, len, d]`.
pub(crate) fn attention<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    bias: &Tensor<B, 5>,
    scale: f32,
) -> Option<Tensor<B, 4>> {
    if std::any::TypeId::of::<B>() != std::any::TypeId::of::<Cpu>() {
        return None;
    }
    let [batch, heads, len, d] = q.dims();
    let [_, kv_heads, columns, _] = k.dims();
    let [_, _, _, _, keys] = bias.dims();
    if bias.dims() != [batch, 1, 1, len, keys] || keys > columns || heads % kv_heads != 0 {
        return None;
    }
    let groups = heads / kv_heads;
    let prims = [q, k, v].map(|t| t.clone().into_primitive().tensor());
    let b_prim = bias.clone().into_primitive().tensor();
    let qv = f32_view::<B>(&prims[0])?
        .into_dimensionality::<ndarray::Ix4>()
        .ok()?;
    let kv = f32_view::<B>(&prims[1])?
        .into_dimensionality::<ndarray::Ix4>()
        .ok()?;
    let vv = f32_view::<B>(&prims[2])?
        .into_dimensionality::<ndarray::Ix4>()
        .ok()?;
    let bv = f32_view::<B>(&b_prim)?;
    let bias = bv.as_slice()?;
    let threshold = crate::model::MASKED / 2.0;
    // Each block of query rows only needs the keys between its first and last allowed one (a causal
    // prefill skips the masked upper triangle); a row with no allowed key keeps every key.
    let blocks = len.div_ceil(QUERY_BLOCK);
    let key_ranges: Vec<(usize, usize)> = (0..batch * blocks)
        .map(|i| {
            let (b, block) = (i / blocks, i % blocks);
            let (mut lo, mut hi) = (keys, 0);
            for t in block * QUERY_BLOCK..((block + 1) * QUERY_BLOCK).min(len) {
                let mask = &bias[(b * len + t) * keys..(b * len + t + 1) * keys];
                let allowed = |m: &f32| *m > threshold;
                match (mask.iter().position(allowed), mask.iter().rposition(allowed)) {
                    (Some(first), Some(last)) => {
                        lo = lo.min(first);
                        hi = hi.max(last + 1);
                    }
                    _ => return (0, keys),
                }
            }
            (lo, hi)
        })
        .collect();
    let mut out = vec![0.0f32; batch * heads * len * d];
    let head = |(i, out_h): (usize, &mut [f32])| {
        let (b, h) = (i / heads, i % heads);
        let g = h / groups;
        let qh = qv.slice(ndarray::s![b, h, .., ..]);
        let kh = kv.slice(ndarray::s![b, g, .., ..]);
        let vh = vv.slice(ndarray::s![b, g, .., ..]);
        let mut scores = vec![0.0f32; QUERY_BLOCK.min(len) * keys];
        for block in 0..blocks {
            let (t0, t1) = (block * QUERY_BLOCK, ((block + 1) * QUERY_BLOCK).min(len));
            let (lo, hi) = key_ranges[b * blocks + block];
            let (rows, width) = (t1 - t0, hi - lo);
            let scores = &mut scores[..rows * width];
            let mut sc =
                ArrayViewMut2::from_shape((rows, width), &mut *scores).expect("sized as rows x width");
            gemm_into(
                sc.view_mut(),
                qh.slice(ndarray::s![t0..t1, ..]),
                kh.slice(ndarray::s![lo..hi, ..]).t(),
                scale,
                false,
            );
            let first = (b * len + t0) * keys + lo;
            softmax_rows(scores, width, &bias[first..], keys, threshold);
            let probs = ArrayView2::from_shape((rows, width), &*scores).expect("sized as rows x width");
            let dst =
                ArrayViewMut2::from_shape((rows, d), &mut out_h[t0 * d..t1 * d]).expect("sized as rows x d");
            gemm_into(dst, probs, vh.slice(ndarray::s![lo..hi, ..]), 1.0, false);
        }
    };
    // A decode step's heads are too small to be worth waking the pool for.
    if batch * heads * len * keys * d >= 16 * PARALLEL_WORK {
        out.par_chunks_mut(len * d).enumerate().for_each(head);
    } else {
        out.chunks_mut(len * d).enumerate().for_each(head);
    }
    let array = ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[batch, heads, len, d]), out).ok()?;
    from_array(array)
}

/// The f32 array inside a CPU tensor primitive.
fn f32_view<B: Backend>(p: &B::FloatTensorPrimitive) -> Option<ndarray::ArrayViewD<'_, f32>> {
    match (p as &dyn Any).downcast_ref::<NdArrayTensor>() {
        Some(NdArrayTensor::F32(s)) => Some(s.view()),
        _ => None,
    }
}

simd_fn! {
    /// [`softmax_row`] on each `width`-long row of `scores`; row `r`'s mask starts at `mask[r * stride]`.
    fn softmax_rows(scores: &mut [f32], width: usize, mask: &[f32], stride: usize, threshold: f32) {
        for (r, row) in scores.chunks_mut(width).enumerate() {
            softmax_row(row, &mask[r * stride..r * stride + width], threshold);
        }
    }
}

/// In place: `row = softmax(row)` over the keys `mask` allows (above `threshold`); masked keys get 0.
#[inline(always)]
fn softmax_row(row: &mut [f32], mask: &[f32], threshold: f32) {
    // The largest allowed score, with sixteen independent lanes and no branch, so the loop vectorises.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let (rows, masks) = (row.chunks_exact(16), mask.chunks_exact(16));
    let mut max = f32::NEG_INFINITY;
    for (x, m) in rows.remainder().iter().zip(masks.remainder()) {
        if *m > threshold && *x > max {
            max = *x;
        }
    }
    for (xs, ms) in rows.zip(masks) {
        for ((lane, x), m) in lanes.iter_mut().zip(xs).zip(ms) {
            let v = if *m > threshold { *x } else { f32::NEG_INFINITY };
            *lane = if v > *lane { v } else { *lane };
        }
    }
    for lane in lanes {
        if lane > max {
            max = lane;
        }
    }
    if max == f32::NEG_INFINITY {
        // Every key masked (a padding row): attend uniformly, as an additive bias would.
        let uniform = 1.0 / row.len() as f32;
        row.fill(uniform);
        return;
    }
    // Branch-free, so the loop vectorises; `fast_exp` is within about 1 ulp of `exp`.
    for (x, m) in row.iter_mut().zip(mask) {
        let e = crate::cpu_math::fast_exp(*x - max);
        *x = if *m > threshold { e } else { 0.0 };
    }
    let sum = sum8(row);
    let inv = 1.0 / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
}

/// Sum with eight independent accumulators (so the loop vectorises).
#[inline(always)]
fn sum8(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest: f32 = chunks.remainder().iter().sum();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + rest
}

fn from_array<B: Backend, const D: usize>(array: ndarray::ArrayD<f32>) -> Option<Tensor<B, D>> {
    let prim = NdArrayTensor::from(array.into_shared());
    let boxed: Box<dyn Any> = Box::new(prim);
    let prim = *boxed.downcast::<B::FloatTensorPrimitive>().ok()?;
    Some(Tensor::from_primitive(TensorPrimitive::Float(prim)))
}

/// `x W^T` by dot products: each weight row is read once, for all input rows.
fn rows_times_weight(x: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>) -> Array2<f32> {
    let (rows, out_features) = (x.nrows(), w.nrows());
    let x = x.as_standard_layout();
    let w = w.as_standard_layout();
    let x_rows: Vec<&[f32]> = x
        .axis_iter(Axis(0))
        .map(|r| r.to_slice().expect("standard layout rows are contiguous"))
        .collect();
    let w_data = w.as_slice().expect("standard layout is contiguous");
    let width = w.ncols();
    // Output transposed ([out, rows]) so each task writes one contiguous block.
    let mut out_t = vec![0.0f32; out_features * rows];
    let work = |(o, block): (usize, &mut [f32])| {
        let w_row = &w_data[o * width..(o + 1) * width];
        for (r, slot) in block.iter_mut().enumerate() {
            *slot = dot(x_rows[r], w_row);
        }
    };
    if rows * out_features * width >= PARALLEL_WORK {
        out_t.par_chunks_mut(rows).enumerate().for_each(work);
    } else {
        out_t.chunks_mut(rows).enumerate().for_each(work);
    }
    Array2::from_shape_vec((out_features, rows), out_t)
        .expect("sized above")
        .reversed_axes()
        .as_standard_layout()
        .into_owned()
}

/// A dot product with sixteen independent accumulators, which the compiler vectorises.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 16];
    let (ac, bc) = (a.chunks_exact(16), b.chunks_exact(16));
    let (ar, br) = (ac.remainder(), bc.remainder());
    for (x, y) in ac.zip(bc) {
        for j in 0..16 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut sum = 0.0;
    for (x, y) in ar.iter().zip(br) {
        sum += x * y;
    }
    // Pairwise reduction of the accumulators.
    for step in [8, 4, 2, 1] {
        for j in 0..step {
            acc[j] += acc[j + step];
        }
    }
    acc[0] + sum
}
