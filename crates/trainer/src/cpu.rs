//! A faster projection `x W^T` for the plain CPU backend, where burn-ndarray's generic matmul is slow for
//! the small row counts of decoding.
//!
//! burn-ndarray 0.21 reshapes both matmul operands to three dimensions, which copies them, and
//! matrixmultiply then packs the weight again: three passes over every weight matrix per call, when
//! decoding needs one.
//! Here, for the inference backend only ([`crate::backend::Cpu`], never under autodiff), a projection of
//! up to [`SMALL_ROWS`] rows reads each weight row once and takes its dot products with every input row;
//! larger inputs (prefill, scoring) go to the `gemm` crate, reading both operands in place.

use std::any::Any;

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_ndarray::NdArrayTensor;
use ndarray::{Array2, ArrayView2, ArrayViewMut2, Axis, Ix2};
use rayon::prelude::*;

use crate::backend::Cpu;

#[cfg(test)]
mod tests;

/// Up to this many input rows, the dot-product kernel beats the packed matrix product.
pub(crate) const SMALL_ROWS: usize = 4;

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
    let out = if x_view.nrows() <= SMALL_ROWS {
        rows_times_weight(x_view, w_view)
    } else {
        matmul_transposed(x_view, w_view)
    };
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

/// `x W^T` with the `gemm` crate (runtime-selected SIMD kernels), reading both operands in place.
fn matmul_transposed(x: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>) -> Array2<f32> {
    let (m, k, n) = (x.nrows(), x.ncols(), w.nrows());
    let mut out = Array2::<f32>::zeros((m, n));
    let parallel = m * n * k >= 4 * PARALLEL_WORK;
    gemm_into(out.view_mut(), x, w.t(), 1.0, parallel);
    out
}

/// `dst = scale * a b` for any strides; `dst` must not overlap `a` or `b`.
#[expect(unsafe_code, reason = "gemm's entry point takes raw pointers and strides")]
fn gemm_into(
    mut dst: ArrayViewMut2<'_, f32>,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    scale: f32,
    parallel: bool,
) {
    let (m, k, n) = (a.nrows(), a.ncols(), b.ncols());
    assert!(
        b.nrows() == k && dst.nrows() == m && dst.ncols() == n,
        "gemm operand shapes disagree"
    );
    let parallelism = if parallel {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    let (d_rs, d_cs) = (dst.strides()[0], dst.strides()[1]);
    // SAFETY: the shapes were checked above; every pointer comes from a live ndarray view with its own
    // strides, so gemm reads `m x k` and `k x n` elements and writes `m x n` elements inside those views;
    // `dst` is a mutable view, so it aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            d_cs,
            d_rs,
            false,
            a.as_ptr(),
            a.strides()[1],
            a.strides()[0],
            b.as_ptr(),
            b.strides()[1],
            b.strides()[0],
            0.0,
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// Grouped-query attention `softmax(scale * q k^T + bias) v` on the plain CPU backend: per head, two gemm
/// calls on views of `q`, `k` and `v` (no copies) around a fused masked softmax, heads in parallel.
///
/// `q` is `[batch, heads, len, d]`, `k` and `v` `[batch, kv_heads, keys, d]` (views of the cache are
/// fine), `bias` `[batch, 1, 1, len, keys]`; returns `[batch, heads, len, d]`.
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
    let [_, kv_heads, keys, _] = k.dims();
    if bias.dims() != [batch, 1, 1, len, keys] || heads % kv_heads != 0 {
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
    let mut out = vec![0.0f32; batch * heads * len * d];
    let head = |(i, block): (usize, &mut [f32])| {
        let (b, h) = (i / heads, i % heads);
        let g = h / groups;
        let qh = qv.slice(ndarray::s![b, h, .., ..]);
        let kh = kv.slice(ndarray::s![b, g, .., ..]);
        let vh = vv.slice(ndarray::s![b, g, .., ..]);
        let mut scores = Array2::<f32>::zeros((len, keys));
        gemm_into(scores.view_mut(), qh, kh.t(), scale, false);
        for (t, mut row) in scores.axis_iter_mut(Axis(0)).enumerate() {
            let row = row.as_slice_mut().expect("rows of a fresh array are contiguous");
            let mask = &bias[(b * len + t) * keys..(b * len + t + 1) * keys];
            softmax_row(row, mask, threshold);
        }
        let out_h = ndarray::ArrayViewMut2::from_shape((len, d), block).expect("sized as len x d");
        gemm_into(out_h, scores.view(), vh, 1.0, false);
    };
    if batch * heads * len * keys * d >= PARALLEL_WORK {
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

/// In place: `row = softmax(row)` over the keys `mask` allows (above `threshold`); masked keys get 0.
fn softmax_row(row: &mut [f32], mask: &[f32], threshold: f32) {
    let mut max = f32::NEG_INFINITY;
    for (x, m) in row.iter().zip(mask) {
        if *m > threshold && *x > max {
            max = *x;
        }
    }
    if max == f32::NEG_INFINITY {
        // Every key masked (a padding row): attend uniformly, as an additive bias would.
        let uniform = 1.0 / row.len() as f32;
        row.fill(uniform);
        return;
    }
    let mut sum = 0.0f32;
    for (x, m) in row.iter_mut().zip(mask) {
        *x = if *m > threshold { (*x - max).exp() } else { 0.0 };
        sum += *x;
    }
    let inv = 1.0 / sum;
    for x in row.iter_mut() {
        *x *= inv;
    }
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
