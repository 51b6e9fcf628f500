//! The array side of the CPU kernels (`kernels/cpu.rs`), for generation and training alike: forward and
//! backward of each fused operation on ndarray views, without burn. One projection for every layout of its
//! weight, and one attention per memory layout: packed sequences ([`attention_forward`] and its backward
//! pass) and key/value cache columns ([`cached_attention`]). Rows are independent, so large inputs are split
//! over rayon by rows.

use ndarray::{
    Array1, Array2, Array3, Array4, ArrayView1, ArrayView2, ArrayView3, ArrayView4, ArrayViewMut2, Axis, Zip,
    s,
};
use rayon::prelude::*;

use crate::train::pack::SegmentRun;

/// Below this many multiply-adds a product stays on one thread.
const PARALLEL_WORK: usize = 1 << 18;
/// Elementwise work is split over threads above this many elements.
const PARALLEL_ELEMENTS: usize = 1 << 15;

/// Defines a function whose body is compiled three times: for AVX-512, for AVX2 with FMA, and for the
/// portable target (SSE2 only, a quarter of AVX-512's width), and runs the widest version this CPU has.
/// For the loops inside, written to auto-vectorise, that is the difference between 4 and 16 lanes.
/// Helpers the body calls must be `#[inline(always)]` so that they are compiled with its features.
///
/// The three versions give bit-identical results: Rust never fuses `a * b + c` into one rounding on its own,
/// and every reduction here has a fixed order of accumulators whatever the vector width.
macro_rules! simd_fn {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx2,fma")]
                fn avx512($($arg: $ty),*) $(-> $ret)? $body
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) $(-> $ret)? $body
                #[cfg(test)]
                let level = $crate::cpu_math::SIMD_LEVEL.load(std::sync::atomic::Ordering::Relaxed);
                #[cfg(not(test))]
                let level = 2;
                if level >= 2 && std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU has AVX-512F (and so AVX2 and FMA), checked just above.
                    #[expect(unsafe_code, reason = "runs code compiled for CPU features checked at run time")]
                    let out = unsafe { avx512($($arg),*) };
                    return out;
                }
                if level >= 1
                    && std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has AVX2 and FMA, checked just above.
                    #[expect(unsafe_code, reason = "runs code compiled for CPU features checked at run time")]
                    let out = unsafe { avx2($($arg),*) };
                    return out;
                }
            }
            $body
        }
    };
}
pub(crate) use simd_fn;

/// Test hook: the widest code `simd_fn!` may run (2: AVX-512, 1: AVX2, 0: portable), so that tests can
/// compare the versions.
#[cfg(test)]
pub(crate) static SIMD_LEVEL: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(2);

/// `e^x` to about 1 ulp (Cephes' polynomial after reduction by powers of two), written so the compiler
/// vectorises loops over it; inputs below -87.3 give about 1e-38 instead of 0, inputs above about 88.03 give
/// infinity (exp itself overflows at 88.72).
#[inline(always)]
pub(crate) fn fast_exp(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a rounding instruction.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.336_54, 88.722_83);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 0.166_666_65;
    p = p * r + 0.5;
    let y = p * r * r + r + 1.0;
    // `2^n` from the bits of `t`, whose low mantissa bits hold `n` (`t`'s own bits are those of ROUND plus
    // n): integer arithmetic that vectorises, where `n as i32` is a scalar conversion per lane.
    let bits = t.to_bits().wrapping_sub(ROUND.to_bits()).wrapping_add(127) << 23;
    y * f32::from_bits(bits)
}

/// Sum with eight independent accumulators (so the loop vectorises).
fn sum(xs: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = xs.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (a, x) in acc.iter_mut().zip(c) {
            *a += x;
        }
    }
    acc.iter().sum::<f32>() + rest.iter().sum::<f32>()
}

/// Dot product with eight independent accumulators.
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let (ca, cb) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Applies `f` to each row of `out` with its index, in parallel when the array is large.
fn rows_mut(out: &mut Array2<f32>, f: impl Fn(usize, &mut [f32]) + Sync + Send) {
    let (rows, cols) = out.dim();
    let slice = out.as_slice_mut().expect("fresh arrays are contiguous");
    if rows * cols >= PARALLEL_ELEMENTS && rows > 1 {
        slice
            .par_chunks_mut(cols.max(1))
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    } else {
        slice
            .chunks_mut(cols.max(1))
            .enumerate()
            .for_each(|(i, r)| f(i, r));
    }
}

/// `dst = scale * a b (+ dst when accumulating)` for any strides; `dst` must not overlap `a` or `b`.
/// Large products run on rayon's threads unless the caller already runs inside a rayon task.
pub(crate) fn gemm_into(
    dst: ArrayViewMut2<'_, f32>,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    scale: f32,
    accumulate: bool,
) {
    let work = a.nrows() * a.ncols() * b.ncols();
    let parallel = work >= PARALLEL_WORK && rayon::current_thread_index().is_none();
    gemm_with(dst, a, b, scale, accumulate, parallel);
}

/// [`gemm_into`] with the caller's choice of threading.
#[expect(unsafe_code, reason = "gemm's entry point takes raw pointers and strides")]
pub(crate) fn gemm_with(
    mut dst: ArrayViewMut2<'_, f32>,
    a: ArrayView2<'_, f32>,
    b: ArrayView2<'_, f32>,
    scale: f32,
    accumulate: bool,
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
            accumulate,
            a.as_ptr(),
            a.strides()[1],
            a.strides()[0],
            b.as_ptr(),
            b.strides()[1],
            b.strides()[0],
            if accumulate { 1.0 } else { 0.0 },
            scale,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `a b` into a fresh array.
pub(crate) fn matmul(a: ArrayView2<'_, f32>, b: ArrayView2<'_, f32>, scale: f32) -> Array2<f32> {
    let mut out = Array2::zeros((a.nrows(), b.ncols()));
    gemm_into(out.view_mut(), a, b, scale, false);
    out
}

/// RMSNorm forward: `y = x / rms(x) * w`; also returns each row's `1 / rms`.
pub(crate) fn rms_forward(
    x: ArrayView2<'_, f32>,
    w: ArrayView1<'_, f32>,
    eps: f32,
) -> (Array2<f32>, Vec<f32>) {
    let x = x.as_standard_layout();
    let w = w.to_vec();
    let dim = x.ncols();
    let xs = x.as_slice().expect("standard layout");
    let inv: Vec<f32> = xs
        .chunks(dim.max(1))
        .map(|xr| 1.0 / (dot(xr, xr) / dim as f32 + eps).sqrt())
        .collect();
    let mut y = Array2::<f32>::zeros(x.dim());
    rows_mut(&mut y, |i, row| {
        scale_row(row, &xs[i * dim..(i + 1) * dim], inv[i], &w)
    });
    (y, inv)
}

simd_fn! {
    /// `out = x * r * w`, elementwise.
    fn scale_row(out: &mut [f32], x: &[f32], r: f32, w: &[f32]) {
        for ((o, a), b) in out.iter_mut().zip(x).zip(w) {
            *o = a * r * b;
        }
    }
}

/// RMSNorm backward: `(dx, dw)`.
pub(crate) fn rms_backward(
    dy: ArrayView2<'_, f32>,
    x: ArrayView2<'_, f32>,
    w: ArrayView1<'_, f32>,
    inv: &[f32],
) -> (Array2<f32>, Array1<f32>) {
    let (dy, x) = (dy.as_standard_layout(), x.as_standard_layout());
    let w = w.to_vec();
    let dim = x.ncols();
    let (dys, xs) = (dy.as_slice().expect("standard"), x.as_slice().expect("standard"));
    let mut dx = Array2::<f32>::zeros(x.dim());
    rows_mut(&mut dx, |i, row| {
        let (dyr, xr, r) = (&dys[i * dim..(i + 1) * dim], &xs[i * dim..(i + 1) * dim], inv[i]);
        // a = dy * w; dx = r a - x r^3 (a . x) / dim
        let mut ax = 0.0;
        for j in 0..dim {
            ax += dyr[j] * w[j] * xr[j];
        }
        let c = r * r * r * ax / dim as f32;
        for j in 0..dim {
            row[j] = r * dyr[j] * w[j] - xr[j] * c;
        }
    });
    let mut dw = Array1::<f32>::zeros(dim);
    for i in 0..x.nrows() {
        let (dyr, xr, r) = (&dys[i * dim..(i + 1) * dim], &xs[i * dim..(i + 1) * dim], inv[i]);
        for (j, d) in dw.iter_mut().enumerate() {
            *d += dyr[j] * xr[j] * r;
        }
    }
    (dx, dw)
}

/// RoPE forward (`inverse = false`) or its transpose (`inverse = true`, the backward pass) on
/// `[rows, heads, d]` with per-row `cos`/`sin` `[rows * d]`.
pub(crate) fn rope(x: ArrayView3<'_, f32>, cos: &[f32], sin: &[f32], inverse: bool) -> Array3<f32> {
    let x = x.as_standard_layout();
    let (rows, heads, d) = x.dim();
    let half = d / 2;
    let xs = x.as_slice().expect("standard layout");
    let mut out = Array2::<f32>::zeros((rows, heads * d));
    let sign = if inverse { -1.0 } else { 1.0 };
    rows_mut(&mut out, |t, row| {
        let (c, s) = (&cos[t * d..t * d + half], &sin[t * d..t * d + half]);
        for h in 0..heads {
            let base = t * heads * d + h * d;
            let (x1, x2) = (&xs[base..base + half], &xs[base + half..base + d]);
            let (o1, o2) = row[h * d..(h + 1) * d].split_at_mut(half);
            for j in 0..half {
                o1[j] = x1[j] * c[j] - sign * x2[j] * s[j];
                o2[j] = x2[j] * c[j] + sign * x1[j] * s[j];
            }
        }
    });
    out.into_shape_with_order((rows, heads, d))
        .expect("the same number of elements")
}

/// `silu(g) * u`.
pub(crate) fn swiglu_forward(g: ArrayView2<'_, f32>, u: ArrayView2<'_, f32>) -> Array2<f32> {
    let (g, u) = (g.as_standard_layout(), u.as_standard_layout());
    let cols = g.ncols();
    let (gs, us) = (g.as_slice().expect("standard"), u.as_slice().expect("standard"));
    let mut out = Array2::<f32>::zeros(g.dim());
    rows_mut(&mut out, |i, row| {
        swiglu_row(row, &gs[i * cols..(i + 1) * cols], &us[i * cols..(i + 1) * cols]);
    });
    out
}

simd_fn! {
    /// `out = silu(g) * u`, elementwise.
    fn swiglu_row(out: &mut [f32], g: &[f32], u: &[f32]) {
        for ((o, &g), &u) in out.iter_mut().zip(g).zip(u) {
            *o = g / (1.0 + fast_exp(-g)) * u;
        }
    }
}

/// The backward pass of [`swiglu_forward`]: `(dg, du)`.
pub(crate) fn swiglu_backward(
    dy: ArrayView2<'_, f32>,
    g: ArrayView2<'_, f32>,
    u: ArrayView2<'_, f32>,
) -> (Array2<f32>, Array2<f32>) {
    let (dy, g, u) = (
        dy.as_standard_layout(),
        g.as_standard_layout(),
        u.as_standard_layout(),
    );
    let cols = g.ncols();
    let (dys, gs, us) = (
        dy.as_slice().expect("standard"),
        g.as_slice().expect("standard"),
        u.as_slice().expect("standard"),
    );
    let mut dg = Array2::<f32>::zeros(g.dim());
    let mut du = Array2::<f32>::zeros(g.dim());
    rows_mut(&mut du, |i, row| {
        let (dyr, gr) = (&dys[i * cols..(i + 1) * cols], &gs[i * cols..(i + 1) * cols]);
        for j in 0..cols {
            row[j] = dyr[j] * gr[j] / (1.0 + fast_exp(-gr[j]));
        }
    });
    rows_mut(&mut dg, |i, row| {
        let r = i * cols..(i + 1) * cols;
        let (dyr, gr, ur) = (&dys[r.clone()], &gs[r.clone()], &us[r]);
        for j in 0..cols {
            let s = 1.0 / (1.0 + fast_exp(-gr[j]));
            row[j] = dyr[j] * ur[j] * s * (1.0 + gr[j] * (1.0 - s));
        }
    });
    (dg, du)
}

/// What the fused output projection keeps for its backward pass: two numbers per row, never the
/// `[N, vocab]` probabilities, which the backward pass recomputes chunk by chunk.
#[derive(Debug)]
pub(crate) struct LogitsSaved {
    /// `log sum_j exp(z_j)` of each row's tempered logits.
    pub(crate) lse: Vec<f32>,
    /// Entropy of each row.
    pub(crate) entropy: Vec<f32>,
    pub(crate) targets: Vec<usize>,
    /// `1 / temperature` of each row.
    pub(crate) inv_temperatures: Vec<f32>,
    /// Rows per chunk.
    pub(crate) chunk: usize,
}

/// The row ranges of `n` rows in chunks of `chunk` (the last one ragged).
fn chunk_ranges(n: usize, chunk: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let chunk = chunk.max(1);
    (0..n.div_ceil(chunk)).map(move |c| c * chunk..((c + 1) * chunk).min(n))
}

/// The one inverse temperature of a chunk's rows, if they share it: then it scales the product itself,
/// and no row is scaled on its own.
fn shared(inv_temperatures: &[f32]) -> Option<f32> {
    let (&first, rest) = inv_temperatures.split_first()?;
    rest.iter().all(|&x| x == first).then_some(first)
}

/// `logits = h W^T / T` with each row's own `T`, then per row `[log p(target), entropy]`, computed `chunk`
/// rows at a time so that only one chunk's logits exist at once; keeps each row's log-sum-exp and entropy
/// when `keep`.
pub(crate) fn logits_forward(
    h: ArrayView2<'_, f32>,
    w: ArrayView2<'_, f32>,
    targets: &[usize],
    inv_temperatures: &[f32],
    chunk: usize,
    keep: bool,
) -> (Array2<f32>, Option<LogitsSaved>) {
    let n = h.nrows();
    let vocab = w.nrows();
    let mut out = Array2::<f32>::zeros((n, 2));
    let mut lse_all = Vec::with_capacity(n);
    let mut z = Array2::<f32>::zeros((chunk.clamp(1, n.max(1)), vocab));
    for range in chunk_ranges(n, chunk) {
        let rows = range.len();
        let inv_t = &inv_temperatures[range.clone()];
        let one_scale = shared(inv_t);
        let mut zc = z.slice_mut(s![..rows, ..]);
        gemm_into(
            zc.view_mut(),
            h.slice(s![range.clone(), ..]),
            w.t(),
            one_scale.unwrap_or(1.0),
            false,
        );
        let slice = zc
            .as_slice_mut()
            .expect("leading rows of a fresh array are contiguous");
        let targets = &targets[range.clone()];
        let per_row = |(i, row): (usize, &mut [f32])| {
            if one_scale.is_none() {
                row.iter_mut().for_each(|z| *z *= inv_t[i]);
            }
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let target = row[targets[i]];
            // sum_j e_j and sum_j e_j z_j with e_j = exp(z_j - max), for the log-sum-exp and the entropy.
            let (total, zdot) = exp_sums(row, max);
            let lse = max + total.ln();
            (target - lse, lse - zdot / total, lse)
        };
        let stats: Vec<(f32, f32, f32)> = if rows * vocab >= PARALLEL_ELEMENTS {
            slice.par_chunks_mut(vocab).enumerate().map(per_row).collect()
        } else {
            slice.chunks_mut(vocab).enumerate().map(per_row).collect()
        };
        for (i, (logp, ent, lse)) in stats.into_iter().enumerate() {
            out[[range.start + i, 0]] = logp;
            out[[range.start + i, 1]] = ent;
            lse_all.push(lse);
        }
    }
    let saved = keep.then(|| LogitsSaved {
        lse: lse_all,
        entropy: out.column(1).to_vec(),
        targets: targets.to_vec(),
        inv_temperatures: inv_temperatures.to_vec(),
        chunk,
    });
    (out, saved)
}

simd_fn! {
    /// `(sum_j exp(z_j - max), sum_j exp(z_j - max) z_j)` over a row, with eight accumulators each.
    fn exp_sums(row: &[f32], max: f32) -> (f32, f32) {
        let mut e8 = [0.0f32; 8];
        let mut ez8 = [0.0f32; 8];
        let chunks = row.chunks_exact(8);
        let rest = chunks.remainder();
        for c in chunks {
            for j in 0..8 {
                let e = fast_exp(c[j] - max);
                e8[j] += e;
                ez8[j] += e * c[j];
            }
        }
        let (mut e, mut ez) = (0.0, 0.0);
        for &v in rest {
            let x = fast_exp(v - max);
            e += x;
            ez += x * v;
        }
        (e8.iter().sum::<f32>() + e, ez8.iter().sum::<f32>() + ez)
    }
}

simd_fn! {
    /// The logits' gradient of one row, in place over the row's logits `z`:
    /// `(a ([j = t] - p_j) - b p_j (log p_j + H)) / T` with `p_j = exp(z_j - lse)`.
    fn logits_grad_row(row: &mut [f32], lse: f32, a: f32, b: f32, entropy: f32, inv_temperature: f32) {
        if b == 0.0 {
            let c = -a * inv_temperature;
            for z in row.iter_mut() {
                *z = c * fast_exp(*z - lse);
            }
        } else {
            for z in row.iter_mut() {
                let lp = *z - lse;
                let p = fast_exp(lp);
                *z = (-a * p - b * p * (lp + entropy)) * inv_temperature;
            }
        }
    }
}

/// The backward pass of [`logits_forward`] from the gradient `[N, 2]` of `[logp, entropy]`: `(dh, dw)`.
/// Each chunk's logits are recomputed from `h` and `w`, turned into their gradient in place and multiplied
/// out, so the backward pass too holds one chunk of logits at a time.
pub(crate) fn logits_backward(
    grad: ArrayView2<'_, f32>,
    h: ArrayView2<'_, f32>,
    w: ArrayView2<'_, f32>,
    saved: &LogitsSaved,
) -> (Array2<f32>, Array2<f32>) {
    let n = h.nrows();
    let vocab = w.nrows();
    let mut dh = Array2::<f32>::zeros((n, h.ncols()));
    let mut dw = Array2::<f32>::zeros((vocab, h.ncols()));
    let mut z = Array2::<f32>::zeros((saved.chunk.clamp(1, n.max(1)), vocab));
    for (c, range) in chunk_ranges(n, saved.chunk).enumerate() {
        let rows = range.len();
        let mut zc = z.slice_mut(s![..rows, ..]);
        let hc = h.slice(s![range.clone(), ..]);
        let one_scale = shared(&saved.inv_temperatures[range.clone()]);
        gemm_into(zc.view_mut(), hc, w.t(), one_scale.unwrap_or(1.0), false);
        let slice = zc
            .as_slice_mut()
            .expect("leading rows of a fresh array are contiguous");
        let start = range.start;
        let per_row = |(i, row): (usize, &mut [f32])| {
            let r = start + i;
            let inv_t = saved.inv_temperatures[r];
            if one_scale.is_none() {
                row.iter_mut().for_each(|z| *z *= inv_t);
            }
            let a = grad[[r, 0]];
            logits_grad_row(row, saved.lse[r], a, grad[[r, 1]], saved.entropy[r], inv_t);
            row[saved.targets[r]] += a * inv_t;
        };
        if rows * vocab >= PARALLEL_ELEMENTS {
            slice.par_chunks_mut(vocab).enumerate().for_each(per_row);
        } else {
            slice.chunks_mut(vocab).enumerate().for_each(per_row);
        }
        gemm_into(dh.slice_mut(s![range, ..]), zc.view(), w, 1.0, false);
        gemm_into(dw.view_mut(), zc.t(), hc, 1.0, c > 0);
    }
    (dh, dw)
}

/// One `(sequence, query head)` task of attention: rows `start..start + len`, query head `h`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Task {
    start: usize,
    len: usize,
    h: usize,
}

fn tasks(runs: &[SegmentRun], heads: usize) -> Vec<Task> {
    let mut out = Vec::new();
    for run in runs {
        for i in 0..run.count {
            for h in 0..heads {
                out.push(Task {
                    start: run.start + i * run.len,
                    len: run.len,
                    h,
                });
            }
        }
    }
    out
}

/// What the attention forward pass keeps for its backward pass: the log-sum-exp of every row's scores per
/// head (`[rows * heads]`, row-major), from which the backward pass recomputes the probabilities block by
/// block; no `T x T` state survives the forward pass.
#[derive(Debug)]
pub(crate) struct AttnSaved {
    tasks: Vec<Task>,
    /// Per task: the log-sum-exp of each of its rows.
    lse: Vec<Vec<f32>>,
    scale: f32,
    block: usize,
}

/// `f(i)` for every task index, in parallel when there is enough work.
fn run_tasks<T: Send>(n: usize, work: usize, f: impl Fn(usize) -> T + Sync + Send) -> Vec<T> {
    if work >= PARALLEL_WORK {
        (0..n).into_par_iter().map(f).collect()
    } else {
        (0..n).map(f).collect()
    }
}

/// In place over the scores `[rows, keys]` of query rows `r0..r0 + rows` of a sequence: each row `i`
/// becomes the softmax of its causal part `0..=r0 + i` (later entries 0); returns each row's log-sum-exp.
fn causal_softmax(p: &mut Array2<f32>, r0: usize) -> Vec<f32> {
    let mut lse = Vec::with_capacity(p.nrows());
    for (i, mut row) in p.rows_mut().into_iter().enumerate() {
        let row = row.as_slice_mut().expect("rows of a fresh array are contiguous");
        let (live, dead) = row.split_at_mut(r0 + i + 1);
        let max = live.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        live.iter_mut().for_each(|x| *x = fast_exp(*x - max));
        let total = sum(live);
        let inv = 1.0 / total;
        live.iter_mut().for_each(|x| *x *= inv);
        dead.fill(0.0);
        lse.push(max + total.ln());
    }
    lse
}

/// The probabilities of query rows `r0..r0 + rows` again, from the scores and the saved log-sum-exp.
fn causal_probs(p: &mut Array2<f32>, r0: usize, lse: &[f32]) {
    for (i, mut row) in p.rows_mut().into_iter().enumerate() {
        let row = row.as_slice_mut().expect("rows of a fresh array are contiguous");
        let (live, dead) = row.split_at_mut(r0 + i + 1);
        let l = lse[i];
        live.iter_mut().for_each(|x| *x = fast_exp(*x - l));
        dead.fill(0.0);
    }
}

/// The query blocks of a sequence of `len` rows: `(r0, r1)`, the last one ragged.
fn query_blocks(len: usize, block: usize) -> impl Iterator<Item = (usize, usize)> {
    chunk_ranges(len, block).map(|r| (r.start, r.end))
}

/// Attention forward, flash-attention style: each sequence's queries in blocks of `block` rows, each block
/// multiplied only by the keys its causal mask allows; returns `[rows, heads * d]` and, when `keep`, the
/// per-row log-sum-exp. Only one block's scores exist at a time per thread.
pub(crate) fn attention_forward(
    q: ArrayView3<'_, f32>,
    k: ArrayView3<'_, f32>,
    v: ArrayView3<'_, f32>,
    runs: &[SegmentRun],
    scale: f32,
    block: usize,
    keep: bool,
) -> (Array2<f32>, Option<AttnSaved>) {
    let (rows, nh, d) = q.dim();
    let nkv = k.dim().1;
    let groups = nh / nkv;
    let tasks = tasks(runs, nh);
    let work: usize = runs.iter().map(|r| r.count * r.len * r.len * d * nh).sum();
    let results = run_tasks(tasks.len(), work, |i| {
        let t = tasks[i];
        let g = t.h / groups;
        let mut out = Array2::<f32>::zeros((t.len, d));
        let mut lse = Vec::with_capacity(t.len);
        for (r0, r1) in query_blocks(t.len, block) {
            let qb = q.slice(s![t.start + r0..t.start + r1, t.h, ..]);
            let kb = k.slice(s![t.start..t.start + r1, g, ..]);
            let vb = v.slice(s![t.start..t.start + r1, g, ..]);
            let mut p = matmul(qb, kb.t(), scale);
            lse.extend(causal_softmax(&mut p, r0));
            gemm_into(out.slice_mut(s![r0..r1, ..]), p.view(), vb, 1.0, false);
        }
        (out, lse)
    });
    let mut out = Array2::<f32>::zeros((rows, nh * d));
    let mut kept = Vec::with_capacity(if keep { tasks.len() } else { 0 });
    for (t, (o, lse)) in tasks.iter().zip(results) {
        out.slice_mut(s![t.start..t.start + t.len, t.h * d..(t.h + 1) * d])
            .assign(&o);
        if keep {
            kept.push(lse);
        }
    }
    let saved = keep.then_some(AttnSaved {
        tasks,
        lse: kept,
        scale,
        block,
    });
    (out, saved)
}

/// Attention backward: gradients of `q`, `k` and `v` from the output's gradient `[rows, heads * d]`,
/// recomputing each query block's probabilities from the saved log-sum-exp.
pub(crate) fn attention_backward(
    dout: ArrayView2<'_, f32>,
    q: ArrayView3<'_, f32>,
    k: ArrayView3<'_, f32>,
    v: ArrayView3<'_, f32>,
    saved: &AttnSaved,
) -> (Array3<f32>, Array3<f32>, Array3<f32>) {
    let (rows, nh, d) = q.dim();
    let nkv = k.dim().1;
    let groups = nh / nkv;
    let scale = saved.scale;
    let dout = dout.as_standard_layout();
    let dout = dout
        .view()
        .into_shape_with_order((rows, nh, d))
        .expect("the output gradient is [rows, heads * d]");
    let tasks = &saved.tasks;
    let work: usize = tasks.iter().map(|t| t.len * t.len * d).sum();
    let results = run_tasks(tasks.len(), work, |i| {
        let t = tasks[i];
        let g = t.h / groups;
        let lse = &saved.lse[i];
        let mut dq = Array2::<f32>::zeros((t.len, d));
        let mut dk = Array2::<f32>::zeros((t.len, d));
        let mut dv = Array2::<f32>::zeros((t.len, d));
        for (r0, r1) in query_blocks(t.len, saved.block) {
            let qb = q.slice(s![t.start + r0..t.start + r1, t.h, ..]);
            let dob = dout.slice(s![t.start + r0..t.start + r1, t.h, ..]);
            let kb = k.slice(s![t.start..t.start + r1, g, ..]);
            let vb = v.slice(s![t.start..t.start + r1, g, ..]);
            let mut p = matmul(qb, kb.t(), scale);
            causal_probs(&mut p, r0, &lse[r0..r1]);
            gemm_into(dv.slice_mut(s![..r1, ..]), p.t(), dob, 1.0, true);
            // dS = P (dP - rowsum(P dP)), with dP = dO V^T; only the causal part is non-zero.
            let mut ds = matmul(dob, vb.t(), 1.0);
            for (r, (mut ds_row, p_row)) in ds.axis_iter_mut(Axis(0)).zip(p.axis_iter(Axis(0))).enumerate() {
                let live_len = r0 + r + 1;
                let ds_row = ds_row.as_slice_mut().expect("fresh arrays are contiguous");
                let p_row = p_row.to_slice().expect("fresh arrays are contiguous");
                let live = dot(&ds_row[..live_len], &p_row[..live_len]);
                Zip::from(&mut ds_row[..live_len])
                    .and(&p_row[..live_len])
                    .for_each(|x, &pv| *x = pv * (*x - live));
                ds_row[live_len..].fill(0.0);
            }
            gemm_into(dq.slice_mut(s![r0..r1, ..]), ds.view(), kb, scale, false);
            gemm_into(dk.slice_mut(s![..r1, ..]), ds.t(), qb, scale, true);
        }
        (dq, dk, dv)
    });
    let mut dq = Array3::<f32>::zeros((rows, nh, d));
    let mut dk = Array3::<f32>::zeros((rows, nkv, d));
    let mut dv = Array3::<f32>::zeros((rows, nkv, d));
    for (t, (dqt, dkt, dvt)) in tasks.iter().zip(results) {
        let span = t.start..t.start + t.len;
        let g = t.h / groups;
        dq.slice_mut(s![span.clone(), t.h, ..]).assign(&dqt);
        // The heads of one key/value group add their gradients, in head order.
        let mut dkg = dk.slice_mut(s![span.clone(), g, ..]);
        dkg += &dkt;
        let mut dvg = dv.slice_mut(s![span, g, ..]);
        dvg += &dvt;
    }
    (dq, dk, dv)
}

/// Up to this many input rows, the dot-product kernel beats the packed matrix product for a row-major
/// weight.
pub(crate) const SMALL_ROWS: usize = 4;

/// Below this many input rows a projection stays on one thread unless its weight is large: for a decode
/// batch, waking the pool costs more than the second core saves.
const PARALLEL_ROWS: usize = 32;

/// A weight of at least this many elements is split over threads even for few rows: an output projection
/// over the vocabulary, and the projections of a model of SmolLM2-135M's width (576 by 1536: one thread
/// for those left the second core idle through most of a decode step at batch 16).
const PARALLEL_WEIGHT: usize = 1 << 18;

/// Below this many multiply-adds the dot-product projection stays on one thread.
const PARALLEL_DOTS: usize = 1 << 16;

/// Below this much work (`batch * heads * len * keys * d`) attention over the cache stays on one thread: a
/// decode step's heads are too small to be worth waking the pool for.
const PARALLEL_CACHED_ATTENTION: usize = 1 << 20;

/// Query rows per block of attention over the cache; each block multiplies only by the keys its rows may
/// see.
pub(crate) const QUERY_BLOCK: usize = 64;

/// The projection `x W^T` of every CPU path, for `x` `[rows, in]` and `W` `[out, in]` in any layout.
///
/// A column-major weight (the inference engine's, see `kernels/cpu.rs`) is read in place by gemm at any
/// row count; a row-major one would be repacked by gemm on every call, which for a decode batch cost three
/// times the multiplication, so a handful of rows take the dot-product kernel instead.
/// Large products run on rayon's threads, also from inside a pool (the generation engine runs in its own).
pub(crate) fn project(x: ArrayView2<'_, f32>, w: ArrayView2<'_, f32>) -> Array2<f32> {
    let column_major = w.strides()[0] == 1 && w.nrows() > 1;
    if !column_major && x.nrows() <= SMALL_ROWS {
        return rows_times_weight(x, w);
    }
    let (m, k, n) = (x.nrows(), x.ncols(), w.nrows());
    let mut out = Array2::<f32>::zeros((m, n));
    let parallel = m * n * k >= PARALLEL_WORK && (m >= PARALLEL_ROWS || n * k >= PARALLEL_WEIGHT);
    gemm_with(out.view_mut(), x, w.t(), 1.0, false, parallel);
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
            *slot = dot16(x_rows[r], w_row);
        }
    };
    if rows * out_features * width >= PARALLEL_DOTS {
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

/// A dot product with sixteen independent accumulators and a pairwise reduction, which the compiler
/// vectorises.
pub(crate) fn dot16(a: &[f32], b: &[f32]) -> f32 {
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
    for step in [8, 4, 2, 1] {
        for j in 0..step {
            acc[j] += acc[j + step];
        }
    }
    acc[0] + sum
}

/// Grouped-query attention `softmax(scale * q k^T) v` over a key/value cache, each query over its own span
/// of keys: per head, two gemm calls on views of `q`, `k` and `v` (no copies) around a fused softmax,
/// heads in parallel.
///
/// `q` is `[batch, heads, len, d]`, `k` and `v` `[batch, kv_heads, columns, d]` of which the first `keys`
/// columns are used (the whole cache is passed as is), `spans` the `[lo, hi)` key columns of each of the
/// `batch * len` queries (row-major); returns `[batch, heads, len, d]`.
/// Each block of [`QUERY_BLOCK`] query rows multiplies only the keys of its rows' spans, so a causal
/// prefill skips the masked upper triangle and holds one block's scores per thread.
pub(crate) fn cached_attention(
    q: ArrayView4<'_, f32>,
    k: ArrayView4<'_, f32>,
    v: ArrayView4<'_, f32>,
    spans: &[[u32; 2]],
    keys: usize,
    scale: f32,
) -> Array4<f32> {
    let (batch, heads, len, d) = q.dim();
    let kv_heads = k.dim().1;
    let groups = heads / kv_heads;
    let blocks = len.div_ceil(QUERY_BLOCK);
    let key_ranges: Vec<(usize, usize)> = (0..batch * blocks)
        .map(|i| {
            let (b, block) = (i / blocks, i % blocks);
            let rows = b * len + block * QUERY_BLOCK..b * len + ((block + 1) * QUERY_BLOCK).min(len);
            spans[rows].iter().fold((keys, 0), |(lo, hi), s| {
                (lo.min(s[0] as usize), hi.max(s[1] as usize))
            })
        })
        .collect();
    let mut out = vec![0.0f32; batch * heads * len * d];
    let head = |(i, out_h): (usize, &mut [f32])| {
        let (b, h) = (i / heads, i % heads);
        let g = h / groups;
        let qh = q.slice(s![b, h, .., ..]);
        let kh = k.slice(s![b, g, .., ..]);
        let vh = v.slice(s![b, g, .., ..]);
        let mut scores = vec![0.0f32; QUERY_BLOCK.min(len) * keys];
        for block in 0..blocks {
            let (t0, t1) = (block * QUERY_BLOCK, ((block + 1) * QUERY_BLOCK).min(len));
            let (lo, hi) = key_ranges[b * blocks + block];
            let (rows, width) = (t1 - t0, hi - lo);
            let scores = &mut scores[..rows * width];
            let mut sc =
                ArrayViewMut2::from_shape((rows, width), &mut *scores).expect("sized as rows x width");
            gemm_with(
                sc.view_mut(),
                qh.slice(s![t0..t1, ..]),
                kh.slice(s![lo..hi, ..]).t(),
                scale,
                false,
                false,
            );
            softmax_rows(scores, width, &spans[b * len + t0..b * len + t1], lo);
            let probs = ArrayView2::from_shape((rows, width), &*scores).expect("sized as rows x width");
            let dst =
                ArrayViewMut2::from_shape((rows, d), &mut out_h[t0 * d..t1 * d]).expect("sized as rows x d");
            gemm_with(dst, probs, vh.slice(s![lo..hi, ..]), 1.0, false, false);
        }
    };
    if batch * heads * len * keys * d >= PARALLEL_CACHED_ATTENTION {
        out.par_chunks_mut(len * d).enumerate().for_each(head);
    } else {
        out.chunks_mut(len * d).enumerate().for_each(head);
    }
    Array4::from_shape_vec((batch, heads, len, d), out).expect("sized above")
}

simd_fn! {
    /// [`softmax_span`] on each `width`-long row of `scores`, whose first column is key `first`; row `r`
    /// attends to the keys `spans[r]`.
    fn softmax_rows(scores: &mut [f32], width: usize, spans: &[[u32; 2]], first: usize) {
        for (row, span) in scores.chunks_mut(width).zip(spans) {
            softmax_span(row, span[0] as usize - first, span[1] as usize - first);
        }
    }
}

/// In place: `row[lo..hi] = softmax(row[lo..hi])`, and 0 outside the span (a non-empty one).
#[inline(always)]
fn softmax_span(row: &mut [f32], lo: usize, hi: usize) {
    let (before, rest) = row.split_at_mut(lo);
    let (span, after) = rest.split_at_mut(hi - lo);
    before.fill(0.0);
    after.fill(0.0);
    // The largest score, with sixteen independent lanes and no branch, so the loop vectorises.
    let mut lanes = [f32::NEG_INFINITY; 16];
    let chunks = span.chunks_exact(16);
    let mut max = f32::NEG_INFINITY;
    for x in chunks.remainder() {
        max = if *x > max { *x } else { max };
    }
    for xs in chunks {
        for (lane, x) in lanes.iter_mut().zip(xs) {
            *lane = if *x > *lane { *x } else { *lane };
        }
    }
    for lane in lanes {
        max = if lane > max { lane } else { max };
    }
    // `fast_exp` is within about 1 ulp of `exp`.
    for x in span.iter_mut() {
        *x = fast_exp(*x - max);
    }
    let inv = 1.0 / sum8(span);
    for x in span.iter_mut() {
        *x *= inv;
    }
}

/// [`sum`], inlined into the SIMD versions of its caller.
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

/// A zeroed `[rows, heads, capacity, d]` array holding `parts` stacked along the rows: part `(t, cols, at)`
/// contributes every row of `t` (`[n, heads, _, d]`), its columns `cols` written from column `at`.
/// One copy per element, where burn's zeros, slice, slice-assign and concatenation make four.
/// `None` when the parts disagree in heads or width, or a part does not fit.
pub(crate) fn assemble(
    parts: &[(ArrayView4<'_, f32>, std::ops::Range<usize>, usize)],
    capacity: usize,
) -> Option<Array4<f32>> {
    let (_, heads, _, d) = parts.first()?.0.dim();
    let mut rows = 0;
    for (view, cols, at) in parts {
        let (n, h, width, dd) = view.dim();
        if h != heads || dd != d || cols.end > width || at + cols.len() > capacity {
            return None;
        }
        rows += n;
    }
    let mut out = Array4::<f32>::zeros((rows, heads, capacity, d));
    let mut row = 0;
    for (view, cols, at) in parts {
        let n = view.dim().0;
        out.slice_mut(s![row..row + n, .., *at..*at + cols.len(), ..])
            .assign(&view.slice(s![.., .., cols.clone(), ..]));
        row += n;
    }
    Some(out)
}
