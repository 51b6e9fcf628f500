//! The CPU kernels plugged into burn: [`Kernels`] for the plain CPU backend (generation, and training's
//! forward-only passes) and for `Autodiff<Cpu>`, where each fused operation is one autodiff node with its
//! own backward pass. Both compute with the array kernels of `crate::cpu_math`, reading burn-ndarray's
//! arrays in place.
//!
//! Generation also lays the weight matrices out column-major ([`Kernels::for_inference`]), which gemm
//! reads in place at any row count, and moves its key/value cache and logits with one copy or none, where
//! burn's zeros, slice, slice-assign, concatenation and `into_data` each copy.
//!
//! Each autodiff node keeps what its backward pass reads (its inputs; attention and the output projection
//! add only one log-sum-exp per row and head, and recompute their probabilities block by block and chunk by
//! chunk), and registers the gradients of the parents that require them. With layer recompute a whole
//! decoder layer is one node (`cpu/layer.rs`). Tests compare every kernel with burn's own operations and
//! differentiation of whole, unchunked computations.

mod layer;
#[cfg(test)]
mod tests;

use std::ops::Range;
use std::sync::Arc;

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::ops::FloatTensor;
use burn::tensor::{Tensor, TensorPrimitive};
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_ndarray::NdArrayTensor;
use ndarray::{Ix1, Ix2, Ix3, Ix4};

use crate::backend::{Cpu, CpuAutodiff};
use crate::cpu_math as math;
use crate::kernels::{Kernels, KeySpans, Pass, RopeRows};
use crate::model::{CausalLm, DecoderLayer};
use crate::train::pack::SegmentRun;
use math::{AttnSaved, LogitsSaved};

pub(super) fn view<D: ndarray::Dimension>(p: &NdArrayTensor) -> ndarray::ArrayView<'_, f32, D> {
    match p {
        NdArrayTensor::F32(s) => s
            .view()
            .into_dimensionality::<D>()
            .expect("the training kernels are called with tensors of their rank"),
        _ => panic!("the CPU training kernels run in f32"),
    }
}

pub(super) fn primitive<D: ndarray::Dimension>(a: ndarray::Array<f32, D>) -> NdArrayTensor {
    NdArrayTensor::from(a.into_dyn().into_shared())
}

fn tensor<const D: usize>(p: NdArrayTensor) -> Tensor<Cpu, D> {
    Tensor::from_primitive(TensorPrimitive::Float(p))
}

/// The elements of a contiguous f32 array, in memory order.
pub(super) fn slice(p: &NdArrayTensor) -> &[f32] {
    match p {
        NdArrayTensor::F32(s) => s
            .view()
            .to_slice()
            .expect("the rotary tables are built contiguous from host data"),
        _ => panic!("the CPU kernels run in f32"),
    }
}

/// The rotary tables of `rows` on the CPU backend.
fn tables(rows: &RopeRows<Cpu>) -> (NdArrayTensor, NdArrayTensor) {
    (
        rows.cos.clone().into_primitive().tensor(),
        rows.sin.clone().into_primitive().tensor(),
    )
}

/// The rotary tables of `rows` under autodiff: constants, so only their values matter.
pub(super) fn autodiff_tables(rows: &RopeRows<CpuAutodiff>) -> (NdArrayTensor, NdArrayTensor) {
    (
        rows.cos.clone().into_primitive().tensor().primitive,
        rows.sin.clone().into_primitive().tensor().primitive,
    )
}

fn targets(t: &[i64]) -> Vec<usize> {
    t.iter()
        .map(|&t| usize::try_from(t).expect("targets are token ids"))
        .collect()
}

impl Kernels for Cpu {
    fn project(x: Tensor<Self, 2>, w: Tensor<Self, 2>, _autocast: bool) -> Tensor<Self, 2> {
        let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
        tensor(primitive(math::project(view::<Ix2>(&x), view::<Ix2>(&w))))
    }

    fn rms_norm(x: Tensor<Self, 2>, w: Tensor<Self, 1>, eps: f64) -> Tensor<Self, 2> {
        let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
        let (y, _) = math::rms_forward(view::<Ix2>(&x), view::<Ix1>(&w), eps as f32);
        tensor(primitive(y))
    }

    fn rope(x: Tensor<Self, 3>, rows: &RopeRows<Self>) -> Tensor<Self, 3> {
        let x = x.into_primitive().tensor();
        let (cos, sin) = tables(rows);
        tensor(primitive(math::rope(
            view::<Ix3>(&x),
            slice(&cos),
            slice(&sin),
            false,
        )))
    }

    fn swiglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let (g, u) = (gate.into_primitive().tensor(), up.into_primitive().tensor());
        tensor(primitive(math::swiglu_forward(view::<Ix2>(&g), view::<Ix2>(&u))))
    }

    fn packed_attention(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        runs: &[SegmentRun],
        scale: f64,
        _autocast: bool,
        block: usize,
    ) -> Tensor<Self, 2> {
        let [q, k, v] = [q, k, v].map(|t| t.into_primitive().tensor());
        let (out, _) = math::attention_forward(
            view::<Ix3>(&q),
            view::<Ix3>(&k),
            view::<Ix3>(&v),
            runs,
            scale as f32,
            block,
            false,
        );
        tensor(primitive(out))
    }

    fn token_logp(
        h: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        t: &[i64],
        inv_temperatures: &[f32],
        _autocast: bool,
        chunk: usize,
    ) -> Tensor<Self, 2> {
        let (h, w) = (h.into_primitive().tensor(), w.into_primitive().tensor());
        let (out, _) = math::logits_forward(
            view::<Ix2>(&h),
            view::<Ix2>(&w),
            &targets(t),
            inv_temperatures,
            chunk,
            false,
        );
        tensor(primitive(out))
    }

    fn cached_attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        spans: &KeySpans<Self>,
        scale: f64,
    ) -> Tensor<Self, 4> {
        let [q, k, v] = [q, k, v].map(|t| t.into_primitive().tensor());
        let out = math::cached_attention(
            view::<Ix4>(&q),
            view::<Ix4>(&k),
            view::<Ix4>(&v),
            &spans.host,
            spans.keys,
            scale as f32,
        );
        tensor(primitive(out))
    }

    fn for_inference(model: CausalLm<Self>) -> CausalLm<Self> {
        model.map(&mut ColumnMajor)
    }

    fn zeros<const D: usize>(shape: [usize; D], _device: &Self::Device) -> Tensor<Self, D> {
        // From zeroed memory: burn-ndarray fills a vector element by element and then copies it.
        tensor(primitive(ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&shape))))
    }

    fn assemble(
        parts: &[(&Tensor<Self, 4>, Range<usize>, usize)],
        capacity: usize,
        _device: &Self::Device,
    ) -> Tensor<Self, 4> {
        let prims: Vec<_> = parts
            .iter()
            .map(|(t, _, _)| (*t).clone().into_primitive().tensor())
            .collect();
        let views: Vec<_> = prims
            .iter()
            .zip(parts)
            .map(|(p, (_, cols, at))| (view::<Ix4>(p), cols.clone(), *at))
            .collect();
        let out = math::assemble(&views, capacity)
            .expect("the engine assembles cache parts of one layout that fit the capacity");
        tensor(primitive(out))
    }

    fn to_host<const D: usize>(t: Tensor<Self, D>) -> Vec<f32> {
        // Straight from memory: burn's `into_data` walks ndarray's dynamic-rank iterator element by
        // element, a tenth of a decode step for the logits alone.
        let prim = t.into_primitive().tensor();
        let NdArrayTensor::F32(storage) = &prim else {
            panic!("the CPU kernels run in f32")
        };
        let view = storage.view();
        match view.as_slice() {
            Some(slice) => slice.to_vec(),
            None => view.iter().copied().collect(),
        }
    }
}

/// Stores every matrix column-major (`W^T` contiguous, the logical `[out, in]` shape unchanged).
///
/// gemm multiplies a row-major `[out, in]` weight by first repacking it, a full pass over the matrix on
/// every call: for a decode batch, where each weight meets a handful of rows, that repacking cost three
/// times the multiplication itself. A column-major weight is a layout gemm's kernels read directly.
/// Only the inference engine uses this; the training path keeps Hugging Face's row-major layout.
struct ColumnMajor;

impl ModuleMapper<Cpu> for ColumnMajor {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<Cpu, D>>) -> Param<Tensor<Cpu, D>> {
        if D != 2 {
            return param;
        }
        let (id, t, mapper) = param.consume();
        let t = match t.into_primitive().tensor() {
            NdArrayTensor::F32(s) => {
                // Reverse the axes, copy into standard layout, reverse back: the same matrix, transposed in
                // memory.
                let transposed = s.view().reversed_axes().as_standard_layout().into_owned();
                tensor(primitive(transposed.reversed_axes()))
            }
            other => tensor(other),
        };
        Param::from_mapped_value(id, t, mapper)
    }
}

#[derive(Debug)]
struct ProjectBackward;

impl Backward<Cpu, 2> for ProjectBackward {
    type State = (NdArrayTensor, NdArrayTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Cpu>(&ops.node);
        let (x, w) = ops.state;
        let (dy, x, w) = (view::<Ix2>(&dy), view::<Ix2>(&x), view::<Ix2>(&w));
        if let Some(node) = node_x {
            grads.register::<Cpu>(node.id, primitive(math::matmul(dy, w, 1.0)));
        }
        if let Some(node) = node_w {
            grads.register::<Cpu>(node.id, primitive(math::matmul(dy.t(), x, 1.0)));
        }
    }
}

#[derive(Debug)]
struct RmsNormBackward;

impl Backward<Cpu, 2> for RmsNormBackward {
    type State = (NdArrayTensor, NdArrayTensor, Arc<Vec<f32>>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x, node_w] = ops.parents;
        let dy = grads.consume::<Cpu>(&ops.node);
        let (x, w, inv) = ops.state;
        let (dx, dw) = math::rms_backward(view::<Ix2>(&dy), view::<Ix2>(&x), view::<Ix1>(&w), &inv);
        if let Some(node) = node_x {
            grads.register::<Cpu>(node.id, primitive(dx));
        }
        if let Some(node) = node_w {
            grads.register::<Cpu>(node.id, primitive(dw));
        }
    }
}

#[derive(Debug)]
struct RopeBackward;

impl Backward<Cpu, 1> for RopeBackward {
    type State = (NdArrayTensor, NdArrayTensor);

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<Cpu>(&ops.node);
        let (cos, sin) = ops.state;
        if let Some(node) = node_x {
            let dx = math::rope(view::<Ix3>(&dy), slice(&cos), slice(&sin), true);
            grads.register::<Cpu>(node.id, primitive(dx));
        }
    }
}

#[derive(Debug)]
struct SwigluBackward;

impl Backward<Cpu, 2> for SwigluBackward {
    type State = (NdArrayTensor, NdArrayTensor);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_g, node_u] = ops.parents;
        let dy = grads.consume::<Cpu>(&ops.node);
        let (g, u) = ops.state;
        let (dg, du) = math::swiglu_backward(view::<Ix2>(&dy), view::<Ix2>(&g), view::<Ix2>(&u));
        if let Some(node) = node_g {
            grads.register::<Cpu>(node.id, primitive(dg));
        }
        if let Some(node) = node_u {
            grads.register::<Cpu>(node.id, primitive(du));
        }
    }
}

#[derive(Debug)]
struct AttentionBackward;

impl Backward<Cpu, 3> for AttentionBackward {
    type State = (NdArrayTensor, NdArrayTensor, NdArrayTensor, Arc<AttnSaved>);

    fn backward(self, ops: Ops<Self::State, 3>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_q, node_k, node_v] = ops.parents;
        let dout = grads.consume::<Cpu>(&ops.node);
        let (q, k, v, saved) = ops.state;
        let (dq, dk, dv) = math::attention_backward(
            view::<Ix2>(&dout),
            view::<Ix3>(&q),
            view::<Ix3>(&k),
            view::<Ix3>(&v),
            &saved,
        );
        for (node, grad) in [(node_q, dq), (node_k, dk), (node_v, dv)] {
            if let Some(node) = node {
                grads.register::<Cpu>(node.id, primitive(grad));
            }
        }
    }
}

#[derive(Debug)]
struct LogitsBackward;

impl Backward<Cpu, 2> for LogitsBackward {
    type State = (NdArrayTensor, NdArrayTensor, Arc<LogitsSaved>);

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_h, node_w] = ops.parents;
        let g = grads.consume::<Cpu>(&ops.node);
        let (h, w, saved) = ops.state;
        let (dh, dw) = math::logits_backward(view::<Ix2>(&g), view::<Ix2>(&h), view::<Ix2>(&w), &saved);
        if let Some(node) = node_h {
            grads.register::<Cpu>(node.id, primitive(dh));
        }
        if let Some(node) = node_w {
            grads.register::<Cpu>(node.id, primitive(dw));
        }
    }
}

type Prep<BO, const N: usize> = OpsKind<BO, Cpu, <BO as Backward<Cpu, N>>::State, NoCheckpointing, N>;

/// Starts the autodiff node of `op` over `parents`.
pub(super) fn prepare<BO: Backward<Cpu, N>, const N: usize>(
    op: BO,
    parents: [&FloatTensor<CpuAutodiff>; N],
) -> Prep<BO, N> {
    op.prepare::<NoCheckpointing>(parents.map(|p| p.node.clone()))
        .compute_bound()
        .stateful()
}

/// Finishes the node with its output, keeping `state` for the backward pass when the node is tracked.
pub(super) fn finish<BO: Backward<Cpu, N>, const N: usize, const D: usize>(
    prep: Prep<BO, N>,
    out: NdArrayTensor,
    state: impl FnOnce() -> BO::State,
) -> Tensor<CpuAutodiff, D> {
    let out = match prep {
        OpsKind::Tracked(prep) => prep.finish(state(), out),
        OpsKind::UnTracked(prep) => prep.finish(out),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

fn tracked<BO: Backward<Cpu, N>, const N: usize>(prep: &Prep<BO, N>) -> bool {
    matches!(prep, OpsKind::Tracked(_))
}

impl Kernels for CpuAutodiff {
    const RECOMPUTES_LAYERS: bool = true;

    fn decoder_layer(
        x: Tensor<Self, 2>,
        l: &DecoderLayer<Self>,
        rows: &RopeRows<Self>,
        runs: &[SegmentRun],
        pass: Pass,
    ) -> Tensor<Self, 2> {
        if pass.recompute {
            layer::recomputed(x, l, rows, runs, pass)
        } else {
            l.forward_packed(x, rows, runs, pass)
        }
    }

    fn project(x: Tensor<Self, 2>, w: Tensor<Self, 2>, _autocast: bool) -> Tensor<Self, 2> {
        let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
        let prep = prepare(ProjectBackward, [&x, &w]);
        let y = math::project(view::<Ix2>(&x.primitive), view::<Ix2>(&w.primitive));
        finish(prep, primitive(y), || (x.primitive, w.primitive))
    }

    fn rms_norm(x: Tensor<Self, 2>, w: Tensor<Self, 1>, eps: f64) -> Tensor<Self, 2> {
        let (x, w) = (x.into_primitive().tensor(), w.into_primitive().tensor());
        let prep = prepare(RmsNormBackward, [&x, &w]);
        let (y, inv) = math::rms_forward(view::<Ix2>(&x.primitive), view::<Ix1>(&w.primitive), eps as f32);
        finish(prep, primitive(y), || (x.primitive, w.primitive, Arc::new(inv)))
    }

    fn rope(x: Tensor<Self, 3>, rows: &RopeRows<Self>) -> Tensor<Self, 3> {
        let x = x.into_primitive().tensor();
        let prep = prepare(RopeBackward, [&x]);
        let (cos, sin) = autodiff_tables(rows);
        let y = math::rope(view::<Ix3>(&x.primitive), slice(&cos), slice(&sin), false);
        finish(prep, primitive(y), || (cos, sin))
    }

    fn swiglu(gate: Tensor<Self, 2>, up: Tensor<Self, 2>) -> Tensor<Self, 2> {
        let (g, u) = (gate.into_primitive().tensor(), up.into_primitive().tensor());
        let prep = prepare(SwigluBackward, [&g, &u]);
        let y = math::swiglu_forward(view::<Ix2>(&g.primitive), view::<Ix2>(&u.primitive));
        finish(prep, primitive(y), || (g.primitive, u.primitive))
    }

    fn packed_attention(
        q: Tensor<Self, 3>,
        k: Tensor<Self, 3>,
        v: Tensor<Self, 3>,
        runs: &[SegmentRun],
        scale: f64,
        _autocast: bool,
        block: usize,
    ) -> Tensor<Self, 2> {
        let [q, k, v] = [q, k, v].map(|t| t.into_primitive().tensor());
        let prep = prepare(AttentionBackward, [&q, &k, &v]);
        let (out, saved) = math::attention_forward(
            view::<Ix3>(&q.primitive),
            view::<Ix3>(&k.primitive),
            view::<Ix3>(&v.primitive),
            runs,
            scale as f32,
            block,
            tracked(&prep),
        );
        finish(prep, primitive(out), || {
            let saved = saved.expect("log-sum-exps are kept for tracked passes");
            (q.primitive, k.primitive, v.primitive, Arc::new(saved))
        })
    }

    fn token_logp(
        h: Tensor<Self, 2>,
        w: Tensor<Self, 2>,
        t: &[i64],
        inv_temperatures: &[f32],
        _autocast: bool,
        chunk: usize,
    ) -> Tensor<Self, 2> {
        let (h, w) = (h.into_primitive().tensor(), w.into_primitive().tensor());
        let prep = prepare(LogitsBackward, [&h, &w]);
        let (out, saved) = math::logits_forward(
            view::<Ix2>(&h.primitive),
            view::<Ix2>(&w.primitive),
            &targets(t),
            inv_temperatures,
            chunk,
            tracked(&prep),
        );
        finish(prep, primitive(out), || {
            let saved = saved.expect("log-sum-exps are kept for tracked passes");
            (h.primitive, w.primitive, Arc::new(saved))
        })
    }
}
