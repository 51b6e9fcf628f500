//! The training forward pass: log-probabilities and entropies of the trained tokens of one packed row,
//! differentiable under autodiff.
//!
//! It runs the decoder of `model.rs` over a `[tokens, features]` row in which several sequences sit end to
//! end: projections, norms and the MLP see the whole row at once, while attention runs per sequence, so no
//! token attends across a sequence boundary and no work is spent on the blocks a block-diagonal mask would
//! throw away. Positions restart at 0 in every sequence. Only the rows that predict a trained token reach
//! the output projection. The operations come from [`Kernels`], so each backend brings its fastest form; a
//! [`Pass`] says how large the chunks of the output projection and the attention blocks are, and whether
//! each decoder layer recomputes its activations in the backward pass.
//! A test pins these log-probabilities to `CausalLm::forward` run on each sequence alone.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::kernels::{Kernels, Pass, RopeRows};
use crate::model::{Attention, CausalLm, DecoderLayer, HfLinear, Mlp, RmsNorm};
use crate::rope::RopeTable;
use crate::train::pack::{Packed, SegmentRun};

/// What one pass computes for the trained tokens of a row.
pub(crate) struct TokenOutputs<B: Backend> {
    /// `log pi(token)` for each trained token, `[N]`.
    pub(crate) logp: Tensor<B, 1>,
    /// The policy's entropy at each trained token's position, `[N]`.
    pub(crate) entropy: Tensor<B, 1>,
}

fn linear<B: Kernels>(x: Tensor<B, 2>, l: &HfLinear<B>, autocast: bool) -> Tensor<B, 2> {
    let y = B::project(x, l.weight.val(), autocast);
    match &l.bias {
        Some(b) => y + b.val().unsqueeze_dim(0),
        None => y,
    }
}

fn norm<B: Kernels>(x: Tensor<B, 2>, n: &RmsNorm<B>) -> Tensor<B, 2> {
    B::rms_norm(x, n.weight.val(), n.eps)
}

/// Qwen3's per-head norm on `[rows, heads, d]`.
fn head_norm<B: Kernels>(x: Tensor<B, 3>, n: &RmsNorm<B>) -> Tensor<B, 3> {
    let [t, h, d] = x.dims();
    norm(x.reshape([t * h, d]), n).reshape([t, h, d])
}

fn attention<B: Kernels>(
    x: Tensor<B, 2>,
    a: &Attention<B>,
    rows: &RopeRows<B>,
    runs: &[SegmentRun],
    pass: Pass,
) -> Tensor<B, 2> {
    let autocast = pass.autocast;
    let [t, _] = x.dims();
    let (nh, nkv, d) = (a.num_heads, a.num_kv_heads, a.head_dim);
    let q = linear(x.clone(), &a.q_proj, autocast).reshape([t, nh, d]);
    let k = linear(x.clone(), &a.k_proj, autocast).reshape([t, nkv, d]);
    let v = linear(x, &a.v_proj, autocast).reshape([t, nkv, d]);
    let (q, k) = match (&a.q_norm, &a.k_norm) {
        (Some(qn), Some(kn)) => (head_norm(q, qn), head_norm(k, kn)),
        _ => (q, k),
    };
    let out = B::packed_attention(
        B::rope(q, rows),
        B::rope(k, rows),
        v,
        runs,
        1.0 / (d as f64).sqrt(),
        autocast,
        pass.attention_block,
    );
    linear(out, &a.o_proj, autocast)
}

fn mlp<B: Kernels>(x: Tensor<B, 2>, m: &Mlp<B>, autocast: bool) -> Tensor<B, 2> {
    let gate = linear(x.clone(), &m.gate_proj, autocast);
    let up = linear(x, &m.up_proj, autocast);
    linear(B::swiglu(gate, up), &m.down_proj, autocast)
}

/// One decoder layer over a packed row whose sequences are `runs`.
pub(crate) fn layer<B: Kernels>(
    x: Tensor<B, 2>,
    l: &DecoderLayer<B>,
    rows: &RopeRows<B>,
    runs: &[SegmentRun],
    pass: Pass,
) -> Tensor<B, 2> {
    let h = x.clone() + attention(norm(x, &l.input_layernorm), &l.self_attn, rows, runs, pass);
    h.clone() + mlp(norm(h, &l.post_attention_layernorm), &l.mlp, pass.autocast)
}

/// Log-probabilities and entropies of the trained tokens of `p` under `model`, each at its own temperature.
pub(crate) fn token_logprobs<B: Kernels>(
    model: &CausalLm<B>,
    rope_table: &RopeTable,
    p: &Packed,
    pass: Pass,
) -> TokenOutputs<B> {
    let device = model.model.embed_tokens.weight.device();
    let t = p.tokens.len();
    let (cos, sin) = rope_table.cos_sin(&p.positions);
    let rows = RopeRows::new(cos, sin, t, rope_table.head_dim(), &device);
    let ids: Tensor<B, 1, Int> = Tensor::from_data(TensorData::new(p.tokens.clone(), [t]), &device);
    let mut x = model.model.embed_tokens.weight.val().select(0, ids);
    for l in &model.model.layers {
        x = B::decoder_layer(x, l, &rows, &p.runs, pass);
    }
    let x = norm(x, &model.model.norm);
    let n = p.trained();
    let picked: Tensor<B, 1, Int> = Tensor::from_data(TensorData::new(p.rows.clone(), [n]), &device);
    let h = x.select(0, picked);
    let w = match &model.lm_head {
        Some(head) => head.weight.val(),
        None => model.model.embed_tokens.weight.val(),
    };
    let both = B::token_logp(
        h,
        w,
        &p.targets,
        &p.inv_temperatures,
        pass.autocast,
        pass.logits_chunk,
    );
    TokenOutputs {
        logp: both.clone().slice([0..n, 0..1]).reshape([n]),
        entropy: both.slice([0..n, 1..2]).reshape([n]),
    }
}
