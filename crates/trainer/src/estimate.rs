//! Sizes users train, and what training them costs in memory before anything is loaded.
//!
//! [`Shape`] holds the published shapes of the models users train ([`QWEN3_0_6B`], [`QWEN3_1_7B`],
//! [`QWEN3_4B`], [`QWEN3_8B`], [`QWEN3_14B`], [`QWEN3_32B`], [`QWEN2_5_7B`], written from their Hugging Face
//! `config.json`s, and [`SMOLLM2_135M`]);
//! [`Shape::config`] turns one into a [`ModelConfig`] and [`Shape::tiny`] into a random-initialisable small
//! model with the same architecture flags. [`MemoryEstimate`] is the dry run: parameters, the bytes of the
//! f32 weights, gradients and AdamW moments, and the activations kept per trained token by the chunked
//! training path with and without layer recompute, counted from what each kernel saves for its backward
//! pass (`kernels/cpu.rs`, `kernels/cpu/layer.rs`). It prints as a short report.
//! [`MemoryEstimate::fsdp2_gpu_bytes`] is the same step's peak on one GPU of an FSDP2 layout (the
//! `fsdp2-trainer` worker): the sharded state, the units gathered whole at a time, the kept activations
//! in the compute precision and the chunked output projection.

use std::fmt;

use crate::config::{Architecture, ModelConfig};
use crate::train::MemoryConfig;

/// The published shape of a model.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Shape {
    /// The Hugging Face name.
    pub name: &'static str,
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub vocab_size: usize,
    pub tie_word_embeddings: bool,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub max_position_embeddings: usize,
}

/// `Qwen/Qwen3-0.6B`: RMSNorm on each head of q and k, tied embeddings.
pub const QWEN3_0_6B: Shape = Shape {
    name: "Qwen/Qwen3-0.6B",
    architecture: Architecture::Qwen3,
    hidden_size: 1024,
    intermediate_size: 3072,
    num_hidden_layers: 28,
    num_attention_heads: 16,
    num_key_value_heads: 8,
    head_dim: 128,
    vocab_size: 151_936,
    tie_word_embeddings: true,
    rope_theta: 1_000_000.0,
    rms_norm_eps: 1e-6,
    max_position_embeddings: 40_960,
};

/// `Qwen/Qwen3-1.7B`.
pub const QWEN3_1_7B: Shape = Shape {
    name: "Qwen/Qwen3-1.7B",
    hidden_size: 2048,
    intermediate_size: 6144,
    ..QWEN3_0_6B
};

/// `Qwen/Qwen3-4B`.
pub const QWEN3_4B: Shape = Shape {
    name: "Qwen/Qwen3-4B",
    hidden_size: 2560,
    intermediate_size: 9728,
    num_hidden_layers: 36,
    num_attention_heads: 32,
    ..QWEN3_0_6B
};

/// `Qwen/Qwen3-8B`: untied embeddings from this size up.
pub const QWEN3_8B: Shape = Shape {
    name: "Qwen/Qwen3-8B",
    hidden_size: 4096,
    intermediate_size: 12_288,
    num_hidden_layers: 36,
    num_attention_heads: 32,
    tie_word_embeddings: false,
    ..QWEN3_0_6B
};

/// `Qwen/Qwen3-14B`.
pub const QWEN3_14B: Shape = Shape {
    name: "Qwen/Qwen3-14B",
    hidden_size: 5120,
    intermediate_size: 17_408,
    num_hidden_layers: 40,
    num_attention_heads: 40,
    ..QWEN3_8B
};

/// `Qwen/Qwen3-32B`: 64 query heads of 128 over a hidden width of 5120.
pub const QWEN3_32B: Shape = Shape {
    name: "Qwen/Qwen3-32B",
    hidden_size: 5120,
    intermediate_size: 25_600,
    num_hidden_layers: 64,
    num_attention_heads: 64,
    ..QWEN3_8B
};

/// `Qwen/Qwen2.5-7B`: biases on q, k and v, untied embeddings.
pub const QWEN2_5_7B: Shape = Shape {
    name: "Qwen/Qwen2.5-7B",
    architecture: Architecture::Qwen2,
    hidden_size: 3584,
    intermediate_size: 18_944,
    num_hidden_layers: 28,
    num_attention_heads: 28,
    num_key_value_heads: 4,
    head_dim: 128,
    vocab_size: 152_064,
    tie_word_embeddings: false,
    rope_theta: 1_000_000.0,
    rms_norm_eps: 1e-6,
    max_position_embeddings: 131_072,
};

/// `HuggingFaceTB/SmolLM2-135M`: the model the CPU figures are measured on.
pub const SMOLLM2_135M: Shape = Shape {
    name: "HuggingFaceTB/SmolLM2-135M",
    architecture: Architecture::Llama,
    hidden_size: 576,
    intermediate_size: 1536,
    num_hidden_layers: 30,
    num_attention_heads: 9,
    num_key_value_heads: 3,
    head_dim: 64,
    vocab_size: 49_152,
    tie_word_embeddings: true,
    rope_theta: 100_000.0,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 8192,
};

/// Every shape above.
pub const SHAPES: [Shape; 8] = [
    QWEN3_0_6B,
    QWEN3_1_7B,
    QWEN3_4B,
    QWEN3_8B,
    QWEN3_14B,
    QWEN3_32B,
    QWEN2_5_7B,
    SMOLLM2_135M,
];

impl Shape {
    /// The full model's config.
    pub fn config(&self) -> ModelConfig {
        let mut c = ModelConfig::new(
            self.architecture,
            self.vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_hidden_layers,
            self.num_attention_heads,
            self.num_key_value_heads,
        );
        c.head_dim = self.head_dim;
        c.tie_word_embeddings = self.tie_word_embeddings;
        c.rope_theta = self.rope_theta;
        c.rms_norm_eps = self.rms_norm_eps;
        c.max_position_embeddings = self.max_position_embeddings;
        c
    }

    /// A small model of the same architecture: the same flags (biases, per-head norms, tied embeddings),
    /// the same ratio of query to key/value heads and of intermediate to hidden width, two layers, head
    /// width 16, a vocabulary of 257 and 256 positions.
    pub fn tiny(&self) -> ModelConfig {
        let groups = self.num_attention_heads / self.num_key_value_heads.max(1);
        let kv_heads = 2;
        let heads = kv_heads * groups;
        let head_dim = 16;
        let hidden = heads * head_dim;
        let intermediate = (hidden * self.intermediate_size / self.hidden_size.max(1)).max(8);
        let mut c = ModelConfig::new(self.architecture, 257, hidden, intermediate, 2, heads, kv_heads);
        c.head_dim = head_dim;
        c.tie_word_embeddings = self.tie_word_embeddings;
        c.rope_theta = self.rope_theta;
        c.rms_norm_eps = self.rms_norm_eps;
        c.max_position_embeddings = 256;
        c
    }
}

/// Parameters of a model: embeddings, every layer, the final norm and an untied output projection.
pub fn parameter_count(c: &ModelConfig) -> u64 {
    let (h, i, d) = (
        c.hidden_size as u64,
        c.intermediate_size as u64,
        c.head_dim as u64,
    );
    let (q, kv) = (c.num_attention_heads as u64 * d, c.num_key_value_heads as u64 * d);
    let embed = c.vocab_size as u64 * h;
    let attention =
        h * (q + 2 * kv) + q * h + if c.qkv_bias { q + 2 * kv } else { 0 } + if c.o_bias { h } else { 0 };
    let qk_norm = if c.qk_norm { 2 * d } else { 0 };
    let mlp = 3 * h * i + if c.mlp_bias { 2 * i + h } else { 0 };
    let layer = attention + qk_norm + mlp + 2 * h;
    let head = if c.tie_word_embeddings { 0 } else { embed };
    embed + c.num_hidden_layers as u64 * layer + h + head
}

/// The parameters outside the embedding and output matrices (how model cards count "non-embedding").
pub fn non_embedding_parameter_count(c: &ModelConfig) -> u64 {
    let embed = c.vocab_size as u64 * c.hidden_size as u64;
    parameter_count(c) - embed * if c.tie_word_embeddings { 1 } else { 2 }
}

/// A dry-run estimate of one training step's memory on the chunked path, in f32.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryEstimate {
    pub model: String,
    pub parameters: u64,
    /// f32 master weights.
    pub weight_bytes: u64,
    /// One f32 gradient per parameter.
    pub gradient_bytes: u64,
    /// AdamW's two f32 moments per parameter.
    pub adamw_bytes: u64,
    /// Bytes kept per token of a micro-batch between the forward and the backward pass.
    pub activation_bytes_per_token: u64,
    /// The same with layer recompute: each layer keeps only its input.
    pub recompute_activation_bytes_per_token: u64,
    /// With layer recompute, the one layer being recomputed holds the full per-layer activations per token.
    pub recompute_layer_bytes_per_token: u64,
    /// Rows of logits the output projection holds at once (`MemoryConfig::logits_chunk`).
    pub logits_chunk_rows: u64,
    /// One row of logits (`vocab` floats).
    pub logits_row_bytes: u64,
    /// Parameters of one decoder layer.
    pub layer_parameters: u64,
    /// Parameters outside the layers (embeddings, an untied output projection, the final norm): the root
    /// unit of an FSDP2 layout.
    pub root_parameters: u64,
}

/// One GPU's share of an FSDP2 layout: how many GPUs shard the state, and the compute precision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fsdp2Layout {
    /// Data-parallel ranks the state is sharded over (one a GPU).
    pub gpus: u64,
    /// bf16 parameters and activations with f32 master weights and reduction (`actor.bf16_autocast`);
    /// f32 throughout otherwise.
    pub bf16: bool,
}

const F32: u64 = 4;

impl MemoryEstimate {
    /// The estimate for `config` trained with the chunk sizes of `memory`.
    pub fn new(name: &str, config: &ModelConfig, memory: &MemoryConfig) -> Self {
        let parameters = parameter_count(config);
        let (h, i, d) = (
            config.hidden_size as u64,
            config.intermediate_size as u64,
            config.head_dim as u64,
        );
        let nh = config.num_attention_heads as u64;
        let (q, kv) = (nh * d, config.num_key_value_heads as u64 * d);
        // What each node of a layer keeps, per token: the layer input and both norms' inputs and outputs
        // (x, norm(x), h, norm(h)), the rotated q and k and v and the attention output for o_proj, the
        // per-head norms' inputs (Qwen3), gate, up and their product, and one log-sum-exp per head.
        let per_layer = 4 * h + 2 * q + 2 * kv + if config.qk_norm { q + kv } else { 0 } + 3 * i + nh + 2;
        let layers = config.num_hidden_layers as u64;
        // After the layers: the final norm's input, the output projection's input and two numbers per row.
        let head = 2 * h + 4;
        let embed = config.vocab_size as u64 * h;
        let root_parameters = embed * if config.tie_word_embeddings { 1 } else { 2 } + h;
        Self {
            model: name.to_string(),
            parameters,
            weight_bytes: parameters * F32,
            gradient_bytes: parameters * F32,
            adamw_bytes: 2 * parameters * F32,
            activation_bytes_per_token: (layers * per_layer + head) * F32,
            recompute_activation_bytes_per_token: (layers * h + head) * F32,
            recompute_layer_bytes_per_token: per_layer * F32,
            logits_chunk_rows: memory.logits_chunk as u64,
            logits_row_bytes: config.vocab_size as u64 * F32,
            layer_parameters: (parameters - root_parameters) / layers.max(1),
            root_parameters,
        }
    }

    /// Weights, gradients and AdamW moments.
    pub fn state_bytes(&self) -> u64 {
        self.weight_bytes + self.gradient_bytes + self.adamw_bytes
    }

    /// The step's estimated peak for a micro-batch of `tokens` tokens: the state, the kept activations and
    /// the larger of one logits chunk and (with recompute) one recomputed layer.
    pub fn step_bytes(&self, tokens: u64, recompute: bool) -> u64 {
        let kept = if recompute {
            self.recompute_activation_bytes_per_token
        } else {
            self.activation_bytes_per_token
        };
        let logits = self.logits_chunk_rows.min(tokens) * self.logits_row_bytes;
        let transient = if recompute {
            logits.max(self.recompute_layer_bytes_per_token * tokens)
        } else {
            logits
        };
        self.state_bytes() + kept * tokens + transient
    }
}

impl MemoryEstimate {
    /// The step's estimated peak on one GPU of an FSDP2 layout, for a micro-batch of `tokens` tokens on
    /// that GPU:
    /// - the sharded state: f32 master weights, f32 gradients and AdamW's two f32 moments, over `gpus`;
    /// - the units gathered whole (`fully_shard` on each decoder layer, then the root): the one computing
    ///   and the one prefetched, in the compute precision, and one unit's unsharded f32 gradient before its
    ///   reduce-scatter;
    /// - the kept activations and the transient of [`MemoryEstimate::step_bytes`], in the compute
    ///   precision, except the output projection's chunk of logits, which stays f32 for the log-softmax.
    ///
    /// Attention's own workspace is left out: the worker uses memory-efficient kernels whose workspace
    /// grows with one sequence's length, not with its square.
    pub fn fsdp2_gpu_bytes(&self, layout: Fsdp2Layout, tokens: u64, recompute: bool) -> u64 {
        let gpus = layout.gpus.max(1);
        let compute = if layout.bf16 { 2 } else { F32 };
        let sharded = self.state_bytes().div_ceil(gpus);
        let unit = self.layer_parameters.max(self.root_parameters);
        let gathered = 2 * unit * compute + unit * F32;
        let kept = if recompute {
            self.recompute_activation_bytes_per_token
        } else {
            self.activation_bytes_per_token
        } / F32
            * compute
            * tokens;
        let logits = self.logits_chunk_rows.min(tokens) * self.logits_row_bytes;
        let transient = if recompute {
            logits.max(self.recompute_layer_bytes_per_token / F32 * compute * tokens)
        } else {
            logits
        };
        sharded + gathered + kept + transient
    }
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

impl fmt::Display for MemoryEstimate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{}: {:.3}B parameters",
            self.model,
            self.parameters as f64 / 1e9
        )?;
        writeln!(
            f,
            "  weights {:.2} GiB, gradients {:.2} GiB, AdamW moments {:.2} GiB (f32)",
            gib(self.weight_bytes),
            gib(self.gradient_bytes),
            gib(self.adamw_bytes)
        )?;
        writeln!(
            f,
            "  activations per token: {:.1} KiB, {:.1} KiB with layer recompute",
            self.activation_bytes_per_token as f64 / 1024.0,
            self.recompute_activation_bytes_per_token as f64 / 1024.0
        )?;
        for tokens in [8192u64, 32_768] {
            writeln!(
                f,
                "  one {}k-token micro-batch: about {:.1} GiB, {:.1} GiB with layer recompute",
                tokens / 1024,
                gib(self.step_bytes(tokens, false)),
                gib(self.step_bytes(tokens, true))
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
