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
use ndarray::{Array2, ArrayView2, Axis, Ix2};
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
    let prim = NdArrayTensor::from(out.into_dyn().into_shared());
    let boxed: Box<dyn Any> = Box::new(prim);
    let prim = *boxed.downcast::<B::FloatTensorPrimitive>().ok()?;
    Some(Tensor::from_primitive(TensorPrimitive::Float(prim)))
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

/// `x W^T` with the `gemm` crate (runtime-selected AVX2/AVX-512 kernels), reading both operands in place.
#[expect(unsafe_code, reason = "gemm's entry point takes raw pointers and strides")]
fn matmul_transposed(x: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>) -> Array2<f32> {
    let (m, k, n) = (x.nrows(), x.ncols(), w.nrows());
    let mut out = Array2::<f32>::zeros((m, n));
    let [x_rs, x_cs] = [x.strides()[0], x.strides()[1]];
    let [w_rs, w_cs] = [w.strides()[0], w.strides()[1]];
    let parallelism = if m * n * k >= 4 * PARALLEL_WORK {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the pointers come from live views of `m x k` and `n x k` elements with their own strides, and
    // from `out`, a freshly allocated standard-layout `m x n` array that aliases neither input; gemm reads
    // exactly those extents (the right-hand side is W^T, `k x n`, so its row stride is W's column stride).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            x_cs,
            x_rs,
            w.as_ptr(),
            w_rs,
            w_cs,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
    out
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
