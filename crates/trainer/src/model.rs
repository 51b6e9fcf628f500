//! The Llama-family decoder in burn, generic over the backend.
//!
//! Module and field names follow Hugging Face exactly (`model.layers.3.self_attn.q_proj.weight`), and every
//! weight keeps Hugging Face's shape (`[out, in]` for projections), so burn's own parameter paths are the
//! safetensors names and loading or saving is a rename-free copy.
//! The decoder layer is composed here once (`DecoderLayer::forward`) for generation and training alike:
//! its attention takes either a packed training row's sequences or key/value cache columns (`Keys`), and
//! every backend-specific operation in it comes from [`Kernels`]. `train/forward.rs` runs it over packed
//! rows (through `Kernels::decoder_layer`, which the CPU's autodiff backend overrides with its
//! layer-recompute node), [`CausalLm::forward_hidden`] over padded batches and the cache.

#![expect(
    private_bounds,
    reason = "the forward passes need the crate's own `Kernels`, which every backend it runs on implements"
)]

use burn::module::ModuleMapper;
use burn::module::{Module, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, FloatDType, Int, Tensor, TensorData};

use crate::backend::InferenceDtype;
use crate::config::ModelConfig;
use crate::kernels::{Kernels, KeySpans, Pass, RopeRows};
use crate::rope::RopeTable;
use crate::train::pack::SegmentRun;

#[cfg(test)]
mod tests;

/// Additive attention bias for masked positions: finite, so a masked score stays finite.
pub const MASKED: f32 = -1.0e30;

/// A projection `y = x W^T + b` with `W` stored as `[out, in]`, like `torch.nn.Linear`.
#[derive(Module, Debug)]
pub struct HfLinear<B: Backend> {
    /// `[out_features, in_features]`.
    pub weight: Param<Tensor<B, 2>>,
    /// `[out_features]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
}

impl<B: Kernels> HfLinear<B> {
    /// `x W^T + b` for `x` `[rows, in]`, the product in bf16 when `autocast` is on (see [`Kernels::project`]).
    fn forward(&self, x: Tensor<B, 2>, autocast: bool) -> Tensor<B, 2> {
        let y = B::project(x, self.weight.val(), autocast);
        match &self.bias {
            Some(b) => y + b.val().unsqueeze_dim(0),
            None => y,
        }
    }
}

/// Root-mean-square normalisation over the last dimension, with a learned scale.
#[derive(Module, Debug)]
pub struct RmsNorm<B: Backend> {
    /// `[dim]`.
    pub weight: Param<Tensor<B, 1>>,
    /// Added to the mean square before the square root.
    pub eps: f64,
}

impl<B: Kernels> RmsNorm<B> {
    /// The norm of each row of `x` `[rows, dim]`.
    fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::rms_norm(x, self.weight.val(), self.eps)
    }

    /// The norm of each head of `x` `[rows, heads, dim]` (Qwen3's per-head norm).
    fn per_head(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [rows, heads, d] = x.dims();
        self.forward(x.reshape([rows * heads, d]))
            .reshape([rows, heads, d])
    }
}

/// The token embedding, `[vocab, hidden]`.
#[derive(Module, Debug)]
pub struct Embedding<B: Backend> {
    /// `[vocab_size, hidden_size]`.
    pub weight: Param<Tensor<B, 2>>,
}

/// Grouped-query self-attention with RoPE.
#[derive(Module, Debug)]
pub struct Attention<B: Backend> {
    pub q_proj: HfLinear<B>,
    pub k_proj: HfLinear<B>,
    pub v_proj: HfLinear<B>,
    pub o_proj: HfLinear<B>,
    /// Qwen3's per-head RMSNorm on queries.
    pub q_norm: Option<RmsNorm<B>>,
    /// Qwen3's per-head RMSNorm on keys.
    pub k_norm: Option<RmsNorm<B>>,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

/// The SwiGLU feed-forward block.
#[derive(Module, Debug)]
pub struct Mlp<B: Backend> {
    pub gate_proj: HfLinear<B>,
    pub up_proj: HfLinear<B>,
    pub down_proj: HfLinear<B>,
}

/// One pre-norm decoder layer.
#[derive(Module, Debug)]
pub struct DecoderLayer<B: Backend> {
    pub self_attn: Attention<B>,
    pub mlp: Mlp<B>,
    pub input_layernorm: RmsNorm<B>,
    pub post_attention_layernorm: RmsNorm<B>,
}

/// The decoder stack (`model.` in Hugging Face names).
#[derive(Module, Debug)]
pub struct Decoder<B: Backend> {
    pub embed_tokens: Embedding<B>,
    pub layers: Vec<DecoderLayer<B>>,
    pub norm: RmsNorm<B>,
}

/// A causal language model: decoder plus output projection (absent when tied to the embedding).
#[derive(Module, Debug)]
pub struct CausalLm<B: Backend> {
    pub model: Decoder<B>,
    pub lm_head: Option<HfLinear<B>>,
}

/// Where each query sits and what it may attend to, for one forward pass of `[batch, len]` tokens.
///
/// `rope` holds the rotary tables of the `batch * len` queries, and `spans` the key columns each one
/// attends to, a contiguous span `lo..hi` of `keys`, which counts the cached columns before this pass plus
/// `len`: what a pass holds grows with `batch * len`, never with `len * keys`.
#[derive(Clone, Debug)]
pub struct AttnInput<B: Backend> {
    pub(crate) rope: RopeRows<B>,
    pub(crate) spans: KeySpans<B>,
}

impl<B: Backend> AttnInput<B> {
    /// Builds the tensors from host data: `positions` is `[batch * len]` (row-major), and `spans` the
    /// `[lo, hi)` key columns of each query in the same order (non-empty, within `keys`).
    pub fn new(
        rope: &RopeTable,
        positions: &[usize],
        spans: Vec<[u32; 2]>,
        [batch, len, keys]: [usize; 3],
        device: &B::Device,
    ) -> Self {
        let (cos, sin) = rope.cos_sin(positions);
        Self {
            rope: RopeRows::new(cos, sin, batch * len, rope.head_dim(), device),
            spans: KeySpans::new(spans, [batch, len, keys], device),
        }
    }

    /// A causal pass over padded rows without a cache: row `b` holds `lengths[b]` real tokens, placed at the
    /// start (right padding) or at the end (left padding) of `len` columns.
    /// Real tokens get positions `0..lengths[b]` and attend causally to their row's real tokens; a padding
    /// query attends to itself alone, junk that no real token sees.
    pub fn padded(rope: &RopeTable, lengths: &[usize], len: usize, left: bool, device: &B::Device) -> Self {
        let batch = lengths.len();
        let mut positions = Vec::with_capacity(batch * len);
        let mut spans = Vec::with_capacity(batch * len);
        for &n in lengths {
            let start = if left { len - n } else { 0 };
            for t in 0..len {
                positions.push(t.saturating_sub(start));
                let real = (start..start + n).contains(&t);
                let lo = if real { start } else { t };
                spans.push([lo as u32, t as u32 + 1]);
            }
        }
        Self::new(rope, &positions, spans, [batch, len, len], device)
    }
}

/// The keys and values of one layer for a batch of rows, `[batch, kv_heads, capacity, head_dim]`.
#[derive(Clone, Debug)]
pub struct LayerKv<B: Backend> {
    pub k: Tensor<B, 4>,
    pub v: Tensor<B, 4>,
}

/// A key/value cache: one [`LayerKv`] per layer, all with the same column layout.
#[derive(Clone, Debug)]
pub struct KvCache<B: Backend> {
    pub layers: Vec<LayerKv<B>>,
    /// Columns `0..len` hold keys (valid or masked); later columns are free.
    pub len: usize,
}

impl<B: Kernels> KvCache<B> {
    /// An empty cache of `capacity` zeroed columns.
    pub fn new(config: &ModelConfig, batch: usize, capacity: usize, device: &B::Device) -> Self {
        let shape = [batch, config.num_key_value_heads, capacity, config.head_dim];
        let zeros = || B::zeros(shape, device);
        Self {
            layers: (0..config.num_hidden_layers)
                .map(|_| LayerKv {
                    k: zeros(),
                    v: zeros(),
                })
                .collect(),
            len: 0,
        }
    }
}

impl<B: Backend> KvCache<B> {
    /// Number of rows.
    pub fn batch(&self) -> usize {
        self.layers.first().map_or(0, |l| l.k.dims()[0])
    }

    /// Number of allocated columns.
    pub fn capacity(&self) -> usize {
        self.layers.first().map_or(0, |l| l.k.dims()[2])
    }
}

/// What the queries of one decoder layer's pass attend to.
pub(crate) enum Keys<'a, B: Backend> {
    /// A packed training row: sequences end to end (`runs`), each token attending causally within its own
    /// sequence, queries in blocks of `block` rows.
    Packed { runs: &'a [SegmentRun], block: usize },
    /// Generation: `batch` rows of equal length attending to the cache columns their `spans` name; with
    /// `kv` = (the layer's cache, `col`), this pass's keys and values are first written at columns `col..`,
    /// and without it the pass's own keys are all the keys.
    Cached {
        batch: usize,
        spans: &'a KeySpans<B>,
        kv: Option<(&'a mut LayerKv<B>, usize)>,
    },
}

impl<B: Kernels> Attention<B> {
    /// Self-attention over `x` `[rows, hidden]` (a packed row, or `batch * len` rows in batch order).
    fn forward(
        &self,
        x: Tensor<B, 2>,
        rope: &RopeRows<B>,
        keys: Keys<'_, B>,
        autocast: bool,
    ) -> Tensor<B, 2> {
        let rows = x.dims()[0];
        let (nh, nkv, d) = (self.num_heads, self.num_kv_heads, self.head_dim);
        let q = self.q_proj.forward(x.clone(), autocast).reshape([rows, nh, d]);
        let k = self.k_proj.forward(x.clone(), autocast).reshape([rows, nkv, d]);
        let v = self.v_proj.forward(x, autocast).reshape([rows, nkv, d]);
        let (q, k) = match (&self.q_norm, &self.k_norm) {
            (Some(qn), Some(kn)) => (qn.per_head(q), kn.per_head(k)),
            _ => (q, k),
        };
        let (q, k) = (B::rope(q, rope), B::rope(k, rope));
        let scale = 1.0 / (d as f64).sqrt();
        let out = match keys {
            Keys::Packed { runs, block } => B::packed_attention(q, k, v, runs, scale, autocast, block),
            Keys::Cached { batch, spans, kv } => {
                let len = rows / batch;
                // `[batch, heads, len, d]`: moving the heads forward is a stride change that the attention
                // kernels read as is.
                let heads = |t: Tensor<B, 3>, h: usize| t.reshape([batch, len, h, d]).swap_dims(1, 2);
                let (q, k, v) = (heads(q, nh), heads(k, nkv), heads(v, nkv));
                let (k, v) = match kv {
                    Some((kv, col)) => {
                        let cap = kv.k.dims()[2];
                        debug_assert!(col + len <= cap, "cache too small");
                        let ranges = [0..batch, 0..nkv, col..col + len, 0..d];
                        // Move the cache tensors out so they are uniquely owned and the write happens in place.
                        let placeholder = || Tensor::empty([0, 0, 0, 0], &k.device());
                        let old_k = std::mem::replace(&mut kv.k, placeholder());
                        let old_v = std::mem::replace(&mut kv.v, placeholder());
                        kv.k = old_k.slice_assign(ranges.clone(), k);
                        kv.v = old_v.slice_assign(ranges, v);
                        (kv.k.clone(), kv.v.clone())
                    }
                    None => (k, v),
                };
                // The kernels read the cache's first `spans.keys` columns in place.
                B::cached_attention(q, k, v, spans, scale)
                    .swap_dims(1, 2)
                    .reshape([rows, nh * d])
            }
        };
        self.o_proj.forward(out, autocast)
    }
}

impl<B: Kernels> Mlp<B> {
    fn forward(&self, x: Tensor<B, 2>, autocast: bool) -> Tensor<B, 2> {
        let gate = self.gate_proj.forward(x.clone(), autocast);
        let up = self.up_proj.forward(x, autocast);
        self.down_proj.forward(B::swiglu(gate, up), autocast)
    }
}

impl<B: Kernels> DecoderLayer<B> {
    /// The layer over `x` `[rows, hidden]`, whose rows have the rotary tables `rope` and attend to `keys`.
    pub(crate) fn forward(
        &self,
        x: Tensor<B, 2>,
        rope: &RopeRows<B>,
        keys: Keys<'_, B>,
        autocast: bool,
    ) -> Tensor<B, 2> {
        let h = x.clone()
            + self
                .self_attn
                .forward(self.input_layernorm.forward(x), rope, keys, autocast);
        h.clone()
            + self
                .mlp
                .forward(self.post_attention_layernorm.forward(h), autocast)
    }

    /// The layer over a packed training row whose sequences are `runs`, computing as `pass` says.
    pub(crate) fn forward_packed(
        &self,
        x: Tensor<B, 2>,
        rope: &RopeRows<B>,
        runs: &[SegmentRun],
        pass: Pass,
    ) -> Tensor<B, 2> {
        let keys = Keys::Packed {
            runs,
            block: pass.attention_block,
        };
        self.forward(x, rope, keys, pass.autocast)
    }
}

impl<B: Kernels> CausalLm<B> {
    /// The embeddings of `tokens` `[rows]`, `[rows, hidden]` in f32.
    fn embed(&self, tokens: Tensor<B, 1, Int>) -> Tensor<B, 2> {
        let x = self.model.embed_tokens.weight.val().select(0, tokens);
        if x.dtype() == DType::BF16 {
            x.cast(FloatDType::F32)
        } else {
            x
        }
    }

    /// Final hidden states `[rows, hidden]` of one packed training row, `tokens` `[rows]`: its sequences are
    /// `runs`, `rope` holds each row's rotary tables, and each layer runs through
    /// [`Kernels::decoder_layer`] (which may recompute it in the backward pass).
    pub(crate) fn packed_hidden(
        &self,
        tokens: Tensor<B, 1, Int>,
        rope: &RopeRows<B>,
        runs: &[SegmentRun],
        pass: Pass,
    ) -> Tensor<B, 2> {
        let mut x = self.embed(tokens);
        for layer in &self.model.layers {
            x = B::decoder_layer(x, layer, rope, runs, pass);
        }
        self.model.norm.forward(x)
    }

    /// Final hidden states `[batch, len, hidden]` for `tokens` `[batch, len]`.
    ///
    /// With a cache, this pass's keys and values are written at columns `cache.len..cache.len + len` (the
    /// cache must have room) and `cache.len` advances; `input`'s spans then index all `cache.len + len`
    /// columns.
    pub fn forward_hidden(
        &self,
        tokens: Tensor<B, 2, Int>,
        input: &AttnInput<B>,
        mut cache: Option<&mut KvCache<B>>,
    ) -> Tensor<B, 3> {
        let [batch, len] = tokens.dims();
        let hidden = self.model.embed_tokens.weight.dims()[1];
        let mut x = self.embed(tokens.reshape([batch * len]));
        let col = cache.as_ref().map_or(0, |c| c.len);
        for (i, layer) in self.model.layers.iter().enumerate() {
            let keys = Keys::Cached {
                batch,
                spans: &input.spans,
                kv: cache.as_deref_mut().map(|c| (&mut c.layers[i], col)),
            };
            x = layer.forward(x, &input.rope, keys, false);
        }
        if let Some(c) = cache {
            c.len = col + len;
        }
        self.model.norm.forward(x).reshape([batch, len, hidden])
    }

    /// Projects hidden states `[batch, len, hidden]` to logits `[batch, len, vocab]`.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let [batch, len, h] = hidden.dims();
        let x = hidden.reshape([batch * len, h]);
        let logits = match &self.lm_head {
            Some(head) => head.forward(x, false),
            None => B::project(x, self.model.embed_tokens.weight.val(), false),
        };
        let vocab = logits.dims()[1];
        logits.reshape([batch, len, vocab])
    }

    /// Logits `[batch, len, vocab]` for one pass without a cache.
    pub fn forward(&self, tokens: Tensor<B, 2, Int>, input: &AttnInput<B>) -> Tensor<B, 3> {
        self.logits(self.forward_hidden(tokens, input, None))
    }
}

impl<B: Backend> CausalLm<B> {
    /// The model with its weight matrices (projections and the embedding) in `dtype`, for inference; norms
    /// stay f32. Weights installed later ([`CausalLm::load_weights`]) keep each parameter's dtype.
    pub fn with_matrices_in(self, dtype: InferenceDtype) -> Self {
        match dtype {
            InferenceDtype::F32 => self,
            InferenceDtype::Bf16 => self.map(&mut MatricesTo(FloatDType::BF16)),
        }
    }

    /// Builds the model for `config` with Hugging Face's initialisation (normal(0, `std`) projections and
    /// embedding, unit norms, zero biases), drawn from a generator seeded with `seed`: the same seed gives
    /// the same weights on every backend.
    pub fn init(config: &ModelConfig, std: f32, seed: u64, device: &B::Device) -> Self {
        let mut rng = crate::sampling::SplitMix64::new(seed);
        build(
            config,
            &mut |shape| {
                let data: Vec<f32> = (0..shape[0] * shape[1])
                    .map(|_| rng.next_normal() as f32 * std)
                    .collect();
                Tensor::from_data(TensorData::new(data, shape), device)
            },
            &mut |n, ones| {
                if ones {
                    Tensor::ones([n], device)
                } else {
                    Tensor::zeros([n], device)
                }
            },
        )
    }
}

/// Casts every two-dimensional parameter (the weight matrices and the embedding) to one float type.
struct MatricesTo(FloatDType);

impl<B: Backend> ModuleMapper<B> for MatricesTo {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        if D != 2 {
            return param;
        }
        let (id, tensor, mapper) = param.consume();
        Param::from_mapped_value(id, tensor.cast(self.0), mapper)
    }
}

/// The model's structure with one-element placeholder tensors, to be filled by a weight installer.
pub(crate) fn skeleton<B: Backend>(config: &ModelConfig, device: &B::Device) -> CausalLm<B> {
    build(config, &mut |_| Tensor::zeros([1, 1], device), &mut |_, _| {
        Tensor::zeros([1], device)
    })
}

/// Assembles the module tree; `matrix` makes each 2-D weight (in a fixed order), `vector(n, is_norm)` each
/// norm scale or bias.
fn build<B: Backend>(
    config: &ModelConfig,
    matrix: &mut dyn FnMut([usize; 2]) -> Tensor<B, 2>,
    vector: &mut dyn FnMut(usize, bool) -> Tensor<B, 1>,
) -> CausalLm<B> {
    let (h, i, v) = (config.hidden_size, config.intermediate_size, config.vocab_size);
    let (q, kv) = (
        config.num_attention_heads * config.head_dim,
        config.num_key_value_heads * config.head_dim,
    );
    let mut param2 = |shape: [usize; 2]| Param::initialized(ParamId::new(), matrix(shape));
    let embed = param2([v, h]);
    let mut mats = Vec::with_capacity(config.num_hidden_layers);
    for _ in 0..config.num_hidden_layers {
        mats.push([
            param2([q, h]),
            param2([kv, h]),
            param2([kv, h]),
            param2([h, q]),
            param2([i, h]),
            param2([i, h]),
            param2([h, i]),
        ]);
    }
    let lm_head = (!config.tie_word_embeddings).then(|| param2([v, h]));
    let mut param1 = |n: usize, ones: bool| Param::initialized(ParamId::new(), vector(n, ones));
    let mut norm = |n: usize| RmsNorm {
        weight: param1(n, true),
        eps: config.rms_norm_eps,
    };
    let final_norm = norm(h);
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for [wq, wk, wv, wo, wg, wu, wd] in mats {
        let mut bias = |n: usize, on: bool| on.then(|| Param::initialized(ParamId::new(), vector(n, false)));
        let q_proj = HfLinear {
            weight: wq,
            bias: bias(q, config.qkv_bias),
        };
        let k_proj = HfLinear {
            weight: wk,
            bias: bias(kv, config.qkv_bias),
        };
        let v_proj = HfLinear {
            weight: wv,
            bias: bias(kv, config.qkv_bias),
        };
        let o_proj = HfLinear {
            weight: wo,
            bias: bias(h, config.o_bias),
        };
        let gate_proj = HfLinear {
            weight: wg,
            bias: bias(i, config.mlp_bias),
        };
        let up_proj = HfLinear {
            weight: wu,
            bias: bias(i, config.mlp_bias),
        };
        let down_proj = HfLinear {
            weight: wd,
            bias: bias(h, config.mlp_bias),
        };
        let mut norm = |n: usize| RmsNorm {
            weight: Param::initialized(ParamId::new(), vector(n, true)),
            eps: config.rms_norm_eps,
        };
        let (q_norm, k_norm) = if config.qk_norm {
            (Some(norm(config.head_dim)), Some(norm(config.head_dim)))
        } else {
            (None, None)
        };
        layers.push(DecoderLayer {
            self_attn: Attention {
                q_proj,
                k_proj,
                v_proj,
                o_proj,
                q_norm,
                k_norm,
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_key_value_heads,
                head_dim: config.head_dim,
            },
            mlp: Mlp {
                gate_proj,
                up_proj,
                down_proj,
            },
            input_layernorm: norm(h),
            post_attention_layernorm: norm(h),
        });
    }
    CausalLm {
        model: Decoder {
            embed_tokens: Embedding { weight: embed },
            layers,
            norm: final_norm,
        },
        lm_head: lm_head.map(|weight| HfLinear { weight, bias: None }),
    }
}
