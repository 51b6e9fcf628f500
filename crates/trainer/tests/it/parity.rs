//! Parity with transformers on tiny random Llama, Qwen2 and Qwen3 checkpoints made by transformers itself:
//! logits within 1e-4 (right- and left-padded batches) and 32 greedy tokens identical through the engine.

use anyhow::Result;
use serde_json::{Value, json};
use trainer::{GenerationRequest, Policy, PolicyOptions, SamplingParams};

use crate::support::{load, max_diff_valid, read_f32, run_oracle, tempdir};

const TOLERANCE: f32 = 1e-4;

/// Rows of different lengths, so every batch is padded.
fn rows() -> Vec<Vec<u32>> {
    vec![
        vec![5, 17, 99, 3, 250, 7, 7, 1, 42, 11, 64, 128, 200, 31, 9, 77],
        vec![1, 2, 3, 4, 5],
        vec![250, 19, 88, 123, 54, 6, 201, 13, 90],
    ]
}

fn check(arch: &str, config: Value, make_extra: Value) -> Result<()> {
    let tmp = tempdir();
    let model_dir = tmp.path().join("model");
    let out = tmp.path().join("out");
    std::fs::create_dir_all(&out)?;
    let rows = rows();
    let mut make = json!({"arch": arch, "config": config, "seed": 7});
    for (k, v) in make_extra.as_object().expect("object") {
        make[k] = v.clone();
    }
    let prompts = [rows[0].clone(), rows[1].clone(), vec![3]];
    let job = json!({
        "model": model_dir,
        "make": make,
        "logits": [
            {"name": "right", "rows": rows, "padding": "right"},
            {"name": "left", "rows": rows, "padding": "left"},
        ],
        "greedy": prompts.iter().enumerate().map(|(i, p)| json!({
            "name": format!("g{i}"), "input_ids": p, "max_new_tokens": 32
        })).collect::<Vec<_>>(),
    });
    let result = run_oracle(&job, &out)?;
    let loaded = load(&model_dir)?;
    let vocab = loaded.config.vocab_size;
    for (name, left) in [("right", false), ("left", true)] {
        let theirs = read_f32(&out.join(format!("{name}.f32")))?;
        let ours = loaded.logits(&rows, left);
        let diff = max_diff_valid(&ours, &theirs, &rows, left, vocab);
        eprintln!("{arch} {name}-padded: max |logit diff| = {diff:e}");
        assert!(diff < TOLERANCE, "{arch} {name}-padded logits differ by {diff}");
    }

    // Greedy through the engine: all prompts at once (continuous batching), each must match transformers.
    let policy = Policy::load(&model_dir, PolicyOptions::default())?;
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            policy.submit(GenerationRequest {
                input_ids: p.clone(),
                sampling: SamplingParams::greedy(),
                stop_token_ids: vec![],
                max_new_tokens: 32,
            })
        })
        .collect::<Result<_, _>>()?;
    for (i, stream) in streams.into_iter().enumerate() {
        let ours = stream.collect_blocking()?;
        let theirs: Vec<u32> = serde_json::from_value(result["greedy"][format!("g{i}")].clone())?;
        assert_eq!(ours.token_ids.len(), 32);
        assert_eq!(
            ours.token_ids, theirs,
            "{arch}: greedy tokens differ for prompt {i}"
        );
        assert!(
            theirs.iter().collect::<std::collections::BTreeSet<_>>().len() > 1,
            "{arch}: a constant continuation would not test much"
        );
    }
    Ok(())
}

fn base() -> Value {
    json!({
        "vocab_size": 256, "hidden_size": 64, "intermediate_size": 112, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
        "rms_norm_eps": 1e-5,
    })
}

fn with(mut v: Value, extra: Value) -> Value {
    for (k, x) in extra.as_object().expect("object") {
        v[k] = x.clone();
    }
    v
}

#[test]
fn llama_with_biases_and_llama3_rope_matches_transformers() -> Result<()> {
    let config = with(
        base(),
        json!({
            "attention_bias": true, "mlp_bias": true, "tie_word_embeddings": false,
            "rope_parameters": {"rope_type": "llama3", "rope_theta": 50000.0, "factor": 8.0,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8},
        }),
    );
    check("llama", config, json!({}))
}

#[test]
fn llama_tied_multi_query_f16_matches_transformers() -> Result<()> {
    let config = with(
        base(),
        json!({"num_key_value_heads": 1, "tie_word_embeddings": true, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}),
    );
    check("llama", config, json!({"dtype": "f16"}))
}

#[test]
fn qwen2_bf16_matches_transformers() -> Result<()> {
    let config = with(
        base(),
        json!({"rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    );
    check("qwen2", config, json!({"dtype": "bf16"}))
}

#[test]
fn qwen3_sharded_matches_transformers() -> Result<()> {
    let config = with(
        base(),
        json!({"head_dim": 32, "tie_word_embeddings": true, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}}),
    );
    check("qwen3", config, json!({"max_shard_size": "100KB"}))
}
