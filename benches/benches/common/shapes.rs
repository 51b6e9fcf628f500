//! The model shapes the trainer benches measure, with random weights (no checkpoint is committed or
//! fetched): the quickstart's tiny policy, and SmolLM2-135M-Instruct's shape, the smallest real model users
//! train, where the large matrix products the CPU peer is strongest at dominate.

use trainer::{Architecture, ModelConfig};

/// A model shape under a short name, the name the table and criterion ids carry.
pub(crate) struct Shape {
    /// `tiny` or `smollm2-135m`.
    pub(crate) name: &'static str,
    /// The configuration.
    pub(crate) config: ModelConfig,
}

/// The quickstart-sized model: vocabulary 4096, width 256, 4 layers (about 4M parameters).
pub(crate) fn tiny() -> Shape {
    let mut c = ModelConfig::new(Architecture::Llama, 4096, 256, 768, 4, 8, 4);
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 2048;
    Shape {
        name: "tiny",
        config: c,
    }
}

/// SmolLM2-135M's shape, as its `config.json` states it: vocabulary 49152, width 576, MLP 1536, 30 layers,
/// 9 query and 3 key/value heads of 64, tied embeddings, RoPE theta 100000 (about 135M parameters).
pub(crate) fn smollm2_135m() -> Shape {
    let mut c = ModelConfig::new(Architecture::Llama, 49152, 576, 1536, 30, 9, 3);
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 8192;
    c.rope_theta = 100_000.0;
    c.rms_norm_eps = 1e-5;
    Shape {
        name: "smollm2-135m",
        config: c,
    }
}
