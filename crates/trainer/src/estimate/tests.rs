//! The published shapes against the published parameter totals, the count against real models, tiny
//! versions through the training forward pass, and the memory report.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Int, Tensor, TensorData};

use super::*;
use crate::backend::Cpu;
use crate::model::{AttnInput, CausalLm};
use crate::optim::host_vec;
use crate::rope::RopeTable;
use crate::weights::Weights;
use crate::{TrainConfig, Trainer, TrainerOptions};

#[test]
fn parameter_counts_match_the_published_totals() {
    // (shape, total, non-embedding, the precision the model card gives them to)
    let cases = [
        (QWEN3_0_6B, 0.6e9, 0.44e9, 0.01e9),
        (QWEN3_1_7B, 1.7e9, 1.4e9, 0.05e9),
        (QWEN3_4B, 4.0e9, 3.6e9, 0.05e9),
        (QWEN3_8B, 8.2e9, 6.95e9, 0.05e9),
        (QWEN3_14B, 14.8e9, 13.2e9, 0.05e9),
        (QWEN3_32B, 32.8e9, 31.2e9, 0.05e9),
        (QWEN2_5_7B, 7.61e9, 6.53e9, 0.01e9),
        (SMOLLM2_135M, 0.135e9, 0.107e9, 0.0025e9),
    ];
    for (shape, total, non_embedding, tol) in cases {
        let c = shape.config();
        assert!(c.check().is_empty(), "{}: {:?}", shape.name, c.check());
        let (n, ne) = (
            parameter_count(&c) as f64,
            non_embedding_parameter_count(&c) as f64,
        );
        assert!(
            (n - total).abs() <= tol,
            "{}: {n} parameters, published {total}",
            shape.name
        );
        assert!(
            (ne - non_embedding).abs() <= tol,
            "{}: {ne} non-embedding parameters, published {non_embedding}",
            shape.name
        );
    }
}

#[test]
fn the_count_is_the_number_of_weights_of_a_real_model() {
    for shape in SHAPES {
        let c = shape.tiny();
        let w = Weights::from_model(&CausalLm::<Cpu>::init(&c, 0.02, 1, &Default::default()));
        let real: usize = w.names().map(|n| w.get(n).expect("listed").data.len()).sum();
        assert_eq!(parameter_count(&c), real as u64, "{}", shape.name);
    }
}

#[test]
fn tiny_versions_keep_the_architecture_and_train_forward_like_inference() {
    for shape in SHAPES {
        let full = shape.config();
        let c = shape.tiny();
        assert!(c.check().is_empty(), "{}: {:?}", shape.name, c.check());
        assert_eq!(
            (c.architecture, c.qkv_bias, c.qk_norm, c.tie_word_embeddings),
            (
                full.architecture,
                full.qkv_bias,
                full.qk_norm,
                full.tie_word_embeddings
            ),
            "{}",
            shape.name
        );
        assert_eq!(
            c.num_attention_heads / c.num_key_value_heads,
            full.num_attention_heads / full.num_key_value_heads
        );
        let weights = Weights::from_model(&CausalLm::<Cpu>::init(&c, 0.1, 3, &Default::default()));
        let tokens: Vec<u32> = (0..37).map(|i| (i * 31 % c.vocab_size) as u32).collect();
        let trainer = Trainer::new(
            c.clone(),
            &weights,
            TrainConfig::default(),
            TrainerOptions::default(),
        )
        .expect("a valid tiny model");
        let trained = &trainer
            .logprobs(std::slice::from_ref(&tokens), 1.0)
            .expect("scored")[0];
        // The inference decoder on the same weights.
        let model = CausalLm::<Cpu>::from_weights(&c, &weights, &Default::default()).expect("loads");
        let n = tokens.len();
        let input = AttnInput::<Cpu>::padded(&RopeTable::new(&c), &[n], n, false, &Default::default());
        let ids: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        let ids: Tensor<Cpu, 2, Int> = Tensor::from_data(TensorData::new(ids, [1, n]), &Default::default());
        let lp = host_vec(log_softmax(model.forward(ids, &input), 2));
        for t in 1..n {
            let want = lp[(t - 1) * c.vocab_size + tokens[t] as usize];
            assert!(
                (trained[t] - want).abs() < 1e-4,
                "{} token {t}: training pass {}, inference {want}",
                shape.name,
                trained[t]
            );
        }
    }
}

#[test]
fn the_report_adds_up_and_recompute_keeps_less() {
    let e = MemoryEstimate::new(
        SMOLLM2_135M.name,
        &SMOLLM2_135M.config(),
        &MemoryConfig::default(),
    );
    assert_eq!(e.weight_bytes, 4 * e.parameters);
    assert_eq!(e.adamw_bytes, 2 * e.weight_bytes);
    // 30 layers x (4 x 576 + 2 x 576 + 2 x 192 + 3 x 1536 + 9 + 2) floats, plus the head's 2 x 576 + 4.
    assert_eq!(e.activation_bytes_per_token, (30 * 8459 + 1156) * 4);
    assert_eq!(e.recompute_activation_bytes_per_token, (30 * 576 + 1156) * 4);
    assert!(e.step_bytes(8192, true) < e.step_bytes(8192, false));
    assert!(e.step_bytes(8192, true) < 8 << 30, "the 8k step's goal");
    // A chunk never holds more rows than the step has; unchunked, the whole step's logits.
    let whole = MemoryEstimate::new(
        SMOLLM2_135M.name,
        &SMOLLM2_135M.config(),
        &MemoryConfig::unchunked(),
    );
    assert_eq!(
        whole.step_bytes(2048, false) - e.step_bytes(2048, false),
        (2048 - 1024) * 49_152 * 4
    );
    let text = e.to_string();
    assert!(
        text.starts_with("HuggingFaceTB/SmolLM2-135M: 0.135B parameters"),
        "{text}"
    );
    assert!(text.contains("with layer recompute"), "{text}");
}

#[test]
fn qwen3_8b_fits_an_80_gb_gpu_sharded_over_eight_and_not_on_one() {
    const GPU: u64 = 80_000_000_000;
    let e = MemoryEstimate::new(QWEN3_8B.name, &QWEN3_8B.config(), &MemoryConfig::default());
    // The figure: about 131 GB of f32 state before any activation.
    assert!(
        (e.state_bytes() as f64 / 1e9 - 131.0).abs() < 1.0,
        "{}",
        e.state_bytes()
    );
    let eight = Fsdp2Layout { gpus: 8, bf16: true };
    let one = Fsdp2Layout { gpus: 1, bf16: true };
    for tokens in [8192, 32_768] {
        assert!(
            e.fsdp2_gpu_bytes(eight, tokens, true) < GPU,
            "{tokens} tokens on 8 GPUs"
        );
        assert!(
            e.fsdp2_gpu_bytes(one, tokens, true) > GPU,
            "{tokens} tokens on 1 GPU"
        );
    }
    // Sharding divides the state and nothing else; bf16 halves the activations; recompute keeps less.
    let state_share = e.state_bytes() - e.state_bytes().div_ceil(8);
    assert_eq!(
        e.fsdp2_gpu_bytes(one, 8192, true) - e.fsdp2_gpu_bytes(eight, 8192, true),
        state_share
    );
    let f32_layout = Fsdp2Layout { gpus: 8, bf16: false };
    assert!(e.fsdp2_gpu_bytes(eight, 32_768, false) < e.fsdp2_gpu_bytes(f32_layout, 32_768, false));
    assert!(e.fsdp2_gpu_bytes(eight, 32_768, true) < e.fsdp2_gpu_bytes(eight, 32_768, false));
    // The gathered units: Qwen3-8B's root (two 151,936 x 4,096 matrices) is larger than a layer.
    assert!(e.root_parameters > e.layer_parameters);
    assert_eq!(
        e.layer_parameters * 36 + e.root_parameters,
        e.parameters,
        "the units add up to the model"
    );
}
