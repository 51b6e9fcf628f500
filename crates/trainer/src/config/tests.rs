//! Unit tests for `config`: what parses, what is refused and how the refusal reads.

use std::path::Path;

use super::*;

/// Parses `json`; returns the config or the error message.
fn check(json: &str) -> std::result::Result<ModelConfig, String> {
    ModelConfig::from_json_str(json, Path::new("config.json")).map_err(|e| e.to_string())
}

const SMOLLM2: &str = r#"{
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 1, "dtype": "float32", "eos_token_id": 2, "head_dim": 64, "hidden_act": "silu",
  "hidden_size": 576, "initializer_range": 0.02, "intermediate_size": 1536, "max_position_embeddings": 8192,
  "mlp_bias": false, "model_type": "llama", "num_attention_heads": 9, "num_hidden_layers": 30,
  "num_key_value_heads": 3, "pad_token_id": 2, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
  "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "tie_word_embeddings": true,
  "transformers_version": "5.24.0", "unk_token_id": 0, "use_cache": true, "vocab_size": 49152
}"#;

/// A transformers 4.x style Qwen3 config (top-level `rope_theta`, `rope_scaling: null`, no `head_dim`).
const QWEN3_V4: &str = r#"{
  "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 151643, "eos_token_id": [151645, 151643], "hidden_act": "silu", "hidden_size": 256,
  "initializer_range": 0.02, "intermediate_size": 512, "max_position_embeddings": 40960, "max_window_layers": 36,
  "model_type": "qwen3", "num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
  "tie_word_embeddings": true, "torch_dtype": "bfloat16", "transformers_version": "4.51.0", "use_cache": true,
  "use_sliding_window": false, "vocab_size": 151936
}"#;

fn edit(base: &str, f: impl FnOnce(&mut serde_json::Map<String, Value>)) -> String {
    let mut v: Value = serde_json::from_str(base).expect("valid base");
    f(v.as_object_mut().expect("object"));
    v.to_string()
}

#[test]
fn reads_smollm2() {
    let c = check(SMOLLM2).expect("smollm2 parses");
    assert_eq!(c.architecture, Architecture::Llama);
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (9, 3, 64)
    );
    assert_eq!(c.rope_theta, 100_000.0);
    assert!(c.tie_word_embeddings && !c.qkv_bias && !c.o_bias && !c.qk_norm);
    assert_eq!(c.eos_token_ids, vec![2]);
    assert_eq!(c.num_parameters(), 134_515_008);
}

#[test]
fn reads_transformers_4_qwen3() {
    let c = check(QWEN3_V4).expect("qwen3 parses");
    assert_eq!(c.head_dim, 128, "Qwen3's class default, not hidden/heads");
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert!(c.qk_norm && !c.qkv_bias);
    assert_eq!(c.eos_token_ids, vec![151_645, 151_643]);
}

#[test]
fn qwen2_always_has_qkv_bias_and_no_o_bias() {
    let json = edit(QWEN3_V4, |m| {
        m.insert("architectures".into(), serde_json::json!(["Qwen2ForCausalLM"]));
        m.insert("model_type".into(), serde_json::json!("qwen2"));
        m.remove("attention_bias");
    });
    let c = check(&json).expect("qwen2 parses");
    assert!(c.qkv_bias && !c.o_bias && !c.qk_norm);
    assert_eq!(c.head_dim, 64);
}

#[test]
fn reads_llama3_rope_scaling_in_both_spellings() {
    let scaling = serde_json::json!({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192});
    let old = edit(SMOLLM2, |m| {
        m.remove("rope_parameters");
        m.insert("rope_theta".into(), serde_json::json!(500000.0));
        m.insert("rope_scaling".into(), scaling.clone());
    });
    let new = edit(SMOLLM2, |m| {
        let mut p = scaling.clone();
        p["rope_theta"] = serde_json::json!(500000.0);
        m.insert("rope_parameters".into(), p);
    });
    let expected = RopeScaling::Llama3 {
        factor: 32.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192,
    };
    for json in [old, new] {
        let c = check(&json).expect("llama3 parses");
        assert_eq!(c.rope_scaling, expected);
        assert_eq!(c.rope_theta, 500_000.0);
    }
}

#[test]
fn round_trips_through_hf_json() {
    for base in [SMOLLM2, QWEN3_V4] {
        let c = check(base).expect("parses");
        let again = check(&c.to_hf_json().to_string()).expect("written config parses");
        assert_eq!(c, again);
    }
    let mut c = ModelConfig::new(Architecture::Llama, 100, 32, 48, 1, 4, 2);
    c.qkv_bias = true;
    c.o_bias = true;
    c.mlp_bias = true;
    c.rope_scaling = RopeScaling::Linear { factor: 2.0 };
    assert_eq!(check(&c.to_hf_json().to_string()).expect("parses"), c);
}

#[test]
fn refusals_name_the_field() {
    let cases: Vec<(&str, String)> = vec![
        (
            "architecture",
            edit(SMOLLM2, |m| {
                m.insert("architectures".into(), serde_json::json!(["MistralForCausalLM"]));
            }),
        ),
        (
            "unknown fields",
            edit(SMOLLM2, |m| {
                m.insert("logit_softcapping".into(), serde_json::json!(30.0));
                m.insert("attn_temperature".into(), serde_json::json!(0.5));
            }),
        ),
        (
            "sliding window",
            edit(QWEN3_V4, |m| {
                m.insert("use_sliding_window".into(), serde_json::json!(true));
            }),
        ),
        (
            "layer types",
            edit(QWEN3_V4, |m| {
                m.insert(
                    "layer_types".into(),
                    serde_json::json!(["full_attention", "sliding_attention"]),
                );
            }),
        ),
        (
            "yarn",
            edit(SMOLLM2, |m| {
                m.insert(
                    "rope_parameters".into(),
                    serde_json::json!({"rope_type": "yarn", "factor": 4.0}),
                );
            }),
        ),
        (
            "activation and dropout",
            edit(SMOLLM2, |m| {
                m.insert("hidden_act".into(), serde_json::json!("gelu"));
                m.insert("attention_dropout".into(), serde_json::json!(0.1));
            }),
        ),
        (
            "missing and mistyped",
            edit(SMOLLM2, |m| {
                m.remove("hidden_size");
                m.insert("num_hidden_layers".into(), serde_json::json!("thirty"));
            }),
        ),
        (
            "heads",
            edit(SMOLLM2, |m| {
                m.insert("num_key_value_heads".into(), serde_json::json!(2));
            }),
        ),
        (
            "quantised",
            edit(SMOLLM2, |m| {
                m.insert(
                    "quantization_config".into(),
                    serde_json::json!({"quant_method": "gptq"}),
                );
            }),
        ),
        ("not json", "{\"architectures\": [".to_string()),
    ];
    let report: Vec<String> = cases
        .iter()
        .map(|(name, json)| match check(json) {
            Ok(_) => panic!("case `{name}` was accepted"),
            Err(e) => format!("{name}: {e}"),
        })
        .collect();
    insta::assert_snapshot!(report.join("\n"));
}
