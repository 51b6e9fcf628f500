//! The training forward pass: log-probabilities and entropies of the trained tokens of one packed row,
//! differentiable under autodiff.
//!
//! It runs the decoder of `model.rs` (the same layer generation runs) over a `[tokens, features]` row in
//! which several sequences sit end to end: projections, norms and the MLP see the whole row at once, while
//! attention runs per sequence, so no token attends across a sequence boundary and no work is spent on the
//! blocks a block-diagonal mask would throw away. Positions restart at 0 in every sequence. Only the rows
//! that predict a trained token reach the output projection. The operations come from [`Kernels`], so each
//! backend brings its fastest form; a [`Pass`] says how large the chunks of the output projection and the
//! attention blocks are, and whether each decoder layer recomputes its activations in the backward pass.
//! A test pins these log-probabilities to `CausalLm::forward` run on each sequence alone.

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

use crate::kernels::{Kernels, Pass, RopeRows};
use crate::model::CausalLm;
use crate::rope::RopeTable;
use crate::train::pack::Packed;

/// What one pass computes for the trained tokens of a row.
pub(crate) struct TokenOutputs<B: Backend> {
    /// `log pi(token)` for each trained token, `[N]`.
    pub(crate) logp: Tensor<B, 1>,
    /// The policy's entropy at each trained token's position, `[N]`.
    pub(crate) entropy: Tensor<B, 1>,
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
    let x = model.packed_hidden(ids, &rows, &p.runs, pass);
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
