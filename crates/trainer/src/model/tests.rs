//! Unit tests for `model`: the cached decode path equals the full pass, padding side does not matter, and
//! initialisation is a pure function of the seed.

use burn::tensor::{Tensor, TensorData};

use super::*;
use crate::backend::Cpu;
use crate::config::{Architecture, ModelConfig};
use crate::kernels::Kernels;

fn tiny(arch: Architecture) -> ModelConfig {
    let mut c = ModelConfig::new(arch, 64, 32, 48, 2, 4, 2);
    c.head_dim = 16;
    c
}

fn logits_of(model: &CausalLm<Cpu>, rope: &RopeTable, rows: &[Vec<i64>], left: bool) -> Vec<f32> {
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
    let mut ids: Vec<i64> = Vec::new();
    for r in rows {
        let pad = vec![0i64; width - r.len()];
        if left {
            ids.extend(pad.iter().chain(r));
        } else {
            ids.extend(r.iter().chain(&pad));
        }
    }
    let device = Default::default();
    let input = AttnInput::<Cpu>::padded(rope, &lengths, width, left, &device);
    let tokens = Tensor::from_data(TensorData::new(ids, [rows.len(), width]), &device);
    model
        .forward(tokens, &input)
        .into_data()
        .into_vec::<f32>()
        .expect("f32")
}

#[test]
fn cached_decoding_equals_the_full_pass() {
    for arch in [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3] {
        let config = tiny(arch);
        let device = Default::default();
        let model = CausalLm::<Cpu>::init(&config, 0.3, 1, &device);
        let rope = RopeTable::new(&config);
        let seq: Vec<i64> = vec![3, 9, 27, 17, 51, 1, 40, 8];
        let full = logits_of(&model, &rope, std::slice::from_ref(&seq), false);
        let vocab = config.vocab_size;
        // Prefill 3 tokens, then one at a time.
        let mut cache = KvCache::<Cpu>::new(&config, 1, seq.len(), &device);
        let prefill = AttnInput::padded(&rope, &[3], 3, false, &device);
        let ids = Tensor::from_data(TensorData::new(seq[..3].to_vec(), [1, 3]), &device);
        let h = model.forward_hidden(ids, &prefill, Some(&mut cache));
        let mut got = model.logits(h).into_data().into_vec::<f32>().expect("f32");
        for (t, &tok) in seq.iter().enumerate().skip(3) {
            let keys = t + 1;
            let input = AttnInput::new(&rope, &[t], vec![[0, keys as u32]], [1, 1, keys], &device);
            let ids = Tensor::from_data(TensorData::new(vec![tok], [1, 1]), &device);
            let h = model.forward_hidden(ids, &input, Some(&mut cache));
            got.extend(model.logits(h).into_data().into_vec::<f32>().expect("f32"));
        }
        assert_eq!(cache.len, seq.len());
        assert_eq!(got.len(), seq.len() * vocab);
        let worst = full
            .iter()
            .zip(&got)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(worst < 1e-5, "{arch:?}: cached decode differs by {worst}");
    }
}

#[test]
fn left_and_right_padding_agree_on_real_tokens() {
    let config = tiny(Architecture::Llama);
    let model = CausalLm::<Cpu>::init(&config, 0.3, 2, &Default::default());
    let rope = RopeTable::new(&config);
    let rows = vec![vec![1i64, 2, 3, 4, 5, 6], vec![7, 8], vec![9, 10, 11, 12]];
    let right = logits_of(&model, &rope, &rows, false);
    let left = logits_of(&model, &rope, &rows, true);
    let v = config.vocab_size;
    let mut worst = 0.0f32;
    for (b, r) in rows.iter().enumerate() {
        for t in 0..r.len() {
            let a = &right[(b * 6 + t) * v..(b * 6 + t + 1) * v];
            let l = &left[(b * 6 + 6 - r.len() + t) * v..(b * 6 + 6 - r.len() + t + 1) * v];
            for (x, y) in a.iter().zip(l) {
                assert!(x.is_finite() && y.is_finite());
                worst = worst.max((x - y).abs());
            }
        }
    }
    assert!(worst < 1e-5, "padding side changes logits by {worst}");
    // And the same row alone gives the same logits as inside the batch.
    let alone = logits_of(&model, &rope, &[rows[1].clone()], false);
    let inside = &right[6 * v..8 * v];
    let worst = alone
        .iter()
        .zip(inside)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f32::max);
    assert!(worst < 1e-5, "batching changes logits by {worst}");
}

#[test]
fn initialisation_is_a_function_of_the_seed() {
    let config = tiny(Architecture::Qwen3);
    let device = Default::default();
    let a = crate::Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.02, 9, &device));
    let b = crate::Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.02, 9, &device));
    let c = crate::Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.02, 10, &device));
    assert_eq!(a, b);
    assert_ne!(a, c);
    let embed = &a.get("model.embed_tokens.weight").expect("embed").data;
    let std = (embed.iter().map(|x| x * x).sum::<f32>() / embed.len() as f32).sqrt();
    assert!((std - 0.02).abs() < 0.002, "init std {std}");
    assert!(
        a.get("model.layers.0.self_attn.q_norm.weight")
            .expect("q_norm")
            .data
            .iter()
            .all(|&x| x == 1.0)
    );
}

/// A left-padded prefill of two rows into a cache with room, then three decode steps: every logit.
fn prefill_and_decode<B: Kernels>(model: &CausalLm<B>, config: &ModelConfig, rope: &RopeTable) -> Vec<f32> {
    let device = Default::default();
    let width = 5;
    let ids: Vec<i64> = vec![3, 9, 27, 17, 51, 0, 0, 0, 1, 40];
    let mut cache = KvCache::<B>::new(config, 2, width + 3, &device);
    let input = AttnInput::padded(rope, &[5, 2], width, true, &device);
    let ids = Tensor::from_data(TensorData::new(ids, [2, width]), &device);
    let mut out = B::to_host(model.logits(model.forward_hidden(ids, &input, Some(&mut cache))));
    for step in 0..3 {
        let keys = width + step + 1;
        // The second row's first real column is 3.
        let spans = vec![[0, keys as u32], [3, keys as u32]];
        let input = AttnInput::new(rope, &[5 + step, 2 + step], spans, [2, 1, keys], &device);
        let next = vec![7 + step as i64, 11];
        let ids = Tensor::from_data(TensorData::new(next, [2, 1]), &device);
        out.extend(B::to_host(model.logits(model.forward_hidden(
            ids,
            &input,
            Some(&mut cache),
        ))));
    }
    out
}

#[test]
fn the_generic_kernels_generate_like_the_cpu_kernels() {
    // burn-ndarray in f64 runs the generic kernels, the ones CUDA runs.
    type Generic = burn_ndarray::NdArray<f64>;
    for arch in [Architecture::Llama, Architecture::Qwen2, Architecture::Qwen3] {
        let config = tiny(arch);
        let model = CausalLm::<Cpu>::init(&config, 0.3, 4, &Default::default());
        // In the backend's own float type, as the trainer builds it.
        let weights = crate::Weights::from_model(&model);
        let generic = crate::train::learner::build::<Generic>(&config, &weights, &Default::default())
            .expect("the weights fit their own config");
        let cpu = <Cpu as Kernels>::for_inference(model);
        let rope = RopeTable::new(&config);
        let a = prefill_and_decode(&cpu, &config, &rope);
        let b = prefill_and_decode(&generic, &config, &rope);
        assert_eq!(a.len(), (2 * 5 + 3 * 2) * config.vocab_size);
        let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f32::max);
        assert!(worst < 1e-4, "{arch:?}: the kernels differ by {worst}");
    }
}
