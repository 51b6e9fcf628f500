//! Layer recompute on the CPU: one decoder layer as a single autodiff node that keeps only its input.
//!
//! The forward pass runs the layer with the array kernels of `cpu_math.rs` and keeps nothing but the input `x`
//! (and handles to the layer's weights, which exist anyway). The backward pass runs the layer's forward
//! pass again, this time keeping its activations, and then walks back through it by hand, registering the
//! gradient of the input with the node's parent and each weight's gradient under the weight's own node, where
//! the learner collects it as it would from the layer's separate nodes. So between the forward and the
//! backward pass a layer holds one `[tokens, hidden]` array instead of about fifteen, at the price of one
//! more forward pass per layer.
//!
//! It is the one composition of a decoder layer besides `model`'s `DecoderLayer::forward`, which training and
//! generation share. That layer cannot be reused here: it runs either under burn's autodiff, which keeps
//! every activation until the backward pass and cannot run again inside one (it deadlocks on its graph
//! lock), or forward-only, keeping nothing the walk back needs; burn's own checkpointing would recompute
//! only operations marked memory-bound (none of these kernels is). What the second composition buys, by
//! `benches/trainer_memory` (one GRPO step of SmolLM2-135M's shape, 2,048 tokens, chunked): the shared layer
//! peaks at 4.27 GiB of heap, this node at 2.82 GiB (2.01 GiB before the step, so the step's own memory falls
//! from 2.26 to 0.81 GiB; measured again after the layer was shared), for 35.1 s a step instead of 30.6 s on a
//! quiet machine. `train::tests::chunks_blocks_and_layer_recompute_leave_the_step_unchanged` holds its loss
//! and gradients to the shared layer's.

use std::sync::Arc;

use burn::tensor::Tensor;
use burn_autodiff::NodeId;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops};
use burn_ndarray::NdArrayTensor;
use ndarray::{Array1, Array2, Array3, ArrayView2, Axis, Ix1, Ix2};

use super::{autodiff_tables, finish, prepare, primitive, slice, view};
use crate::backend::{Cpu, CpuAutodiff};
use crate::cpu_math::{self as math, AttnSaved};
use crate::kernels::{Pass, RopeRows};
use crate::model::{DecoderLayer, HfLinear, RmsNorm};
use crate::train::pack::SegmentRun;

/// One parameter: its values and, when it is trained, its autodiff node.
#[derive(Clone, Debug)]
struct W {
    t: NdArrayTensor,
    id: Option<NodeId>,
}

impl W {
    fn of<const D: usize>(t: Tensor<CpuAutodiff, D>) -> Self {
        let tracked = t.is_require_grad();
        let t = t.into_primitive().tensor();
        Self {
            id: tracked.then_some(t.node.id),
            t: t.primitive,
        }
    }
}

#[derive(Clone, Debug)]
struct Lin {
    w: W,
    b: Option<W>,
}

impl Lin {
    fn of(l: &HfLinear<CpuAutodiff>) -> Self {
        Self {
            w: W::of(l.weight.val()),
            b: l.bias.as_ref().map(|b| W::of(b.val())),
        }
    }

    /// `x W^T + b`.
    fn apply(&self, x: ArrayView2<'_, f32>) -> Array2<f32> {
        let mut y = math::project(x, view::<Ix2>(&self.w.t));
        if let Some(b) = &self.b {
            y += &view::<Ix1>(&b.t);
        }
        y
    }

    /// Given `dy` and the input `x`: adds `dy W` into `dx` (or writes it) and returns `(dW, db)`.
    fn back(
        &self,
        dy: ArrayView2<'_, f32>,
        x: ArrayView2<'_, f32>,
        dx: &mut Array2<f32>,
        accumulate: bool,
    ) -> (Array2<f32>, Option<Array1<f32>>) {
        math::gemm_into(dx.view_mut(), dy, view::<Ix2>(&self.w.t), 1.0, accumulate);
        let dw = math::matmul(dy.t(), x, 1.0);
        (dw, self.b.as_ref().map(|_| dy.sum_axis(Axis(0))))
    }
}

#[derive(Clone, Debug)]
struct Norm {
    w: W,
    eps: f32,
}

impl Norm {
    fn of(n: &RmsNorm<CpuAutodiff>) -> Self {
        Self {
            w: W::of(n.weight.val()),
            eps: n.eps as f32,
        }
    }

    fn apply(&self, x: ArrayView2<'_, f32>) -> (Array2<f32>, Vec<f32>) {
        math::rms_forward(x, view::<Ix1>(&self.w.t), self.eps)
    }
}

/// The weights of one decoder layer, in the order their gradients are produced.
#[derive(Clone, Debug)]
struct Params {
    input_norm: Norm,
    q: Lin,
    k: Lin,
    v: Lin,
    o: Lin,
    q_norm: Option<Norm>,
    k_norm: Option<Norm>,
    post_norm: Norm,
    gate: Lin,
    up: Lin,
    down: Lin,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
}

impl Params {
    fn of(l: &DecoderLayer<CpuAutodiff>) -> Self {
        let a = &l.self_attn;
        Self {
            input_norm: Norm::of(&l.input_layernorm),
            q: Lin::of(&a.q_proj),
            k: Lin::of(&a.k_proj),
            v: Lin::of(&a.v_proj),
            o: Lin::of(&a.o_proj),
            q_norm: a.q_norm.as_ref().map(Norm::of),
            k_norm: a.k_norm.as_ref().map(Norm::of),
            post_norm: Norm::of(&l.post_attention_layernorm),
            gate: Lin::of(&l.mlp.gate_proj),
            up: Lin::of(&l.mlp.up_proj),
            down: Lin::of(&l.mlp.down_proj),
            heads: a.num_heads,
            kv_heads: a.num_kv_heads,
            head_dim: a.head_dim,
        }
    }
}

/// Everything the layer's backward pass reads.
struct Acts {
    n1: Array2<f32>,
    inv1: Vec<f32>,
    /// Projections before the per-head norms (Qwen3), `[rows * heads, d]`, with their `1 / rms`.
    q_pre: Option<NormIn>,
    k_pre: Option<NormIn>,
    qr: Array3<f32>,
    kr: Array3<f32>,
    v: Array3<f32>,
    attn: Array2<f32>,
    attn_saved: Option<AttnSaved>,
    h: Array2<f32>,
    n2: Array2<f32>,
    inv2: Vec<f32>,
    g: Array2<f32>,
    u: Array2<f32>,
    s: Array2<f32>,
}

struct Rope<'a> {
    cos: &'a [f32],
    sin: &'a [f32],
}

/// A per-head norm's input `[rows * heads, d]` and each row's `1 / rms`.
type NormIn = (Array2<f32>, Vec<f32>);

/// The per-head norm of `[rows, heads * d]` and RoPE: `[rows, heads, d]`, and the normed input when kept.
fn heads_in(
    y: Array2<f32>,
    heads: usize,
    d: usize,
    norm: Option<&Norm>,
    rope: &Rope<'_>,
) -> (Array3<f32>, Option<NormIn>) {
    let rows = y.nrows();
    let (normed, pre) = match norm {
        Some(n) => {
            let flat = y
                .into_shape_with_order((rows * heads, d))
                .expect("a projection is [rows, heads * d]");
            let (out, inv) = n.apply(flat.view());
            (out, Some((flat, inv)))
        }
        None => (
            y.into_shape_with_order((rows * heads, d))
                .expect("a projection is [rows, heads * d]"),
            None,
        ),
    };
    let normed = normed
        .into_shape_with_order((rows, heads, d))
        .expect("the same number of elements");
    (math::rope(normed.view(), rope.cos, rope.sin, false), pre)
}

/// The layer's forward pass: its output and, with `keep`, its activations.
fn forward(
    p: &Params,
    x: ArrayView2<'_, f32>,
    rope: &Rope<'_>,
    runs: &[SegmentRun],
    pass: Pass,
    keep: bool,
) -> (Array2<f32>, Option<Acts>) {
    let rows = x.nrows();
    let (nh, nkv, d) = (p.heads, p.kv_heads, p.head_dim);
    let (n1, inv1) = p.input_norm.apply(x);
    let (qr, q_pre) = heads_in(p.q.apply(n1.view()), nh, d, p.q_norm.as_ref(), rope);
    let (kr, k_pre) = heads_in(p.k.apply(n1.view()), nkv, d, p.k_norm.as_ref(), rope);
    let v =
        p.v.apply(n1.view())
            .into_shape_with_order((rows, nkv, d))
            .expect("v is [rows, kv_heads * d]");
    let scale = 1.0 / (d as f32).sqrt();
    let (attn, attn_saved) = math::attention_forward(
        qr.view(),
        kr.view(),
        v.view(),
        runs,
        scale,
        pass.attention_block,
        keep,
    );
    let h = &x + &p.o.apply(attn.view());
    let (n2, inv2) = p.post_norm.apply(h.view());
    let g = p.gate.apply(n2.view());
    let u = p.up.apply(n2.view());
    let s = math::swiglu_forward(g.view(), u.view());
    let y = &h + &p.down.apply(s.view());
    let acts = keep.then(|| Acts {
        n1,
        inv1,
        q_pre,
        k_pre,
        qr,
        kr,
        v,
        attn,
        attn_saved,
        h,
        n2,
        inv2,
        g,
        u,
        s,
    });
    (y, acts)
}

/// A gradient for one parameter node.
type Grad = (NodeId, NdArrayTensor);

fn push_lin(out: &mut Vec<Grad>, lin: &Lin, (dw, db): (Array2<f32>, Option<Array1<f32>>)) {
    if let Some(id) = lin.w.id {
        out.push((id, primitive(dw)));
    }
    if let (Some(b), Some(db)) = (&lin.b, db)
        && let Some(id) = b.id
    {
        out.push((id, primitive(db)));
    }
}

fn push_norm(out: &mut Vec<Grad>, n: &Norm, dw: Array1<f32>) {
    if let Some(id) = n.w.id {
        out.push((id, primitive(dw)));
    }
}

/// The gradient of RoPE and the per-head norm, back to `[rows, heads * d]`.
fn heads_back(
    dr: Array3<f32>,
    norm: Option<&Norm>,
    pre: Option<&NormIn>,
    rope: &Rope<'_>,
    grads: &mut Vec<Grad>,
) -> Array2<f32> {
    let (rows, heads, d) = dr.dim();
    let dn = math::rope(dr.view(), rope.cos, rope.sin, true)
        .into_shape_with_order((rows * heads, d))
        .expect("the same number of elements");
    let dpre = match (norm, pre) {
        (Some(n), Some((x, inv))) => {
            let (dx, dw) = math::rms_backward(dn.view(), x.view(), view::<Ix1>(&n.w.t), inv);
            push_norm(grads, n, dw);
            dx
        }
        _ => dn,
    };
    dpre.into_shape_with_order((rows, heads * d))
        .expect("the same number of elements")
}

/// The layer's backward pass: the input's gradient and every trained weight's.
fn backward(
    p: &Params,
    x: ArrayView2<'_, f32>,
    a: Acts,
    dy: ArrayView2<'_, f32>,
    rope: &Rope<'_>,
) -> (Array2<f32>, Vec<Grad>) {
    let rows = x.nrows();
    let mut grads = Vec::new();
    // The MLP branch: y = h + down(swiglu(gate(n2), up(n2))).
    let mut ds = Array2::zeros(a.s.dim());
    let down = p.down.back(dy, a.s.view(), &mut ds, false);
    push_lin(&mut grads, &p.down, down);
    let (dg, du) = math::swiglu_backward(ds.view(), a.g.view(), a.u.view());
    let mut dn2 = Array2::zeros(a.n2.dim());
    let gate = p.gate.back(dg.view(), a.n2.view(), &mut dn2, false);
    push_lin(&mut grads, &p.gate, gate);
    let up = p.up.back(du.view(), a.n2.view(), &mut dn2, true);
    push_lin(&mut grads, &p.up, up);
    let (dh2, dpost) = math::rms_backward(dn2.view(), a.h.view(), view::<Ix1>(&p.post_norm.w.t), &a.inv2);
    push_norm(&mut grads, &p.post_norm, dpost);
    let dh = &dy + &dh2;
    // The attention branch: h = x + o(attention(rope(q), rope(k), v)).
    let mut dattn = Array2::zeros(a.attn.dim());
    let o = p.o.back(dh.view(), a.attn.view(), &mut dattn, false);
    push_lin(&mut grads, &p.o, o);
    let saved = a.attn_saved.expect("the recompute keeps the attention state");
    let (dqr, dkr, dv) = math::attention_backward(dattn.view(), a.qr.view(), a.kr.view(), a.v.view(), &saved);
    let dq = heads_back(dqr, p.q_norm.as_ref(), a.q_pre.as_ref(), rope, &mut grads);
    let dk = heads_back(dkr, p.k_norm.as_ref(), a.k_pre.as_ref(), rope, &mut grads);
    let dv = dv
        .into_shape_with_order((rows, p.kv_heads * p.head_dim))
        .expect("the same number of elements");
    let mut dn1 = Array2::zeros(a.n1.dim());
    let q = p.q.back(dq.view(), a.n1.view(), &mut dn1, false);
    push_lin(&mut grads, &p.q, q);
    let k = p.k.back(dk.view(), a.n1.view(), &mut dn1, true);
    push_lin(&mut grads, &p.k, k);
    let v = p.v.back(dv.view(), a.n1.view(), &mut dn1, true);
    push_lin(&mut grads, &p.v, v);
    let (dx1, din) = math::rms_backward(dn1.view(), x, view::<Ix1>(&p.input_norm.w.t), &a.inv1);
    push_norm(&mut grads, &p.input_norm, din);
    (dh + dx1, grads)
}

#[derive(Debug)]
struct LayerBackward;

#[derive(Clone, Debug)]
struct LayerState {
    x: NdArrayTensor,
    params: Arc<Params>,
    cos: NdArrayTensor,
    sin: NdArrayTensor,
    runs: Arc<Vec<SegmentRun>>,
    pass: Pass,
}

impl Backward<Cpu, 1> for LayerBackward {
    type State = LayerState;

    fn backward(self, ops: Ops<Self::State, 1>, grads: &mut Gradients, _: &mut Checkpointer) {
        let [node_x] = ops.parents;
        let dy = grads.consume::<Cpu>(&ops.node);
        let s = ops.state;
        let rope = Rope {
            cos: slice(&s.cos),
            sin: slice(&s.sin),
        };
        let x = view::<Ix2>(&s.x);
        let (_, acts) = forward(&s.params, x, &rope, &s.runs, s.pass, true);
        let acts = acts.expect("kept on request");
        let (dx, weight_grads) = backward(&s.params, x, acts, view::<Ix2>(&dy), &rope);
        if let Some(node) = node_x {
            grads.register::<Cpu>(node.id, primitive(dx));
        }
        for (id, g) in weight_grads {
            grads.register::<Cpu>(id, g);
        }
    }
}

/// One decoder layer as a single node that recomputes its activations in the backward pass.
pub(crate) fn recomputed(
    x: Tensor<CpuAutodiff, 2>,
    l: &DecoderLayer<CpuAutodiff>,
    rows: &RopeRows<CpuAutodiff>,
    runs: &[SegmentRun],
    pass: Pass,
) -> Tensor<CpuAutodiff, 2> {
    let x = x.into_primitive().tensor();
    let params = Params::of(l);
    let prep = prepare(LayerBackward, [&x]);
    let (cos, sin) = autodiff_tables(rows);
    let rope = Rope {
        cos: slice(&cos),
        sin: slice(&sin),
    };
    let (y, _) = forward(&params, view::<Ix2>(&x.primitive), &rope, runs, pass, false);
    finish(prep, primitive(y), || LayerState {
        x: x.primitive,
        params: Arc::new(params),
        cos: cos.clone(),
        sin: sin.clone(),
        runs: Arc::new(runs.to_vec()),
        pass,
    })
}
