//! The model configuration: Hugging Face `config.json` for the Llama family, read strictly and written back.
//!
//! One decoder covers `LlamaForCausalLM`, `Qwen2ForCausalLM` and `Qwen3ForCausalLM`; their differences are
//! flags here (biases, q/k norm).
//! Reading is strict: an unknown architecture, an unknown field, or a known field with a value that would
//! change the maths in a way this implementation does not compute is an error naming the field, never
//! silently ignored.

use std::path::Path;

use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

#[cfg(test)]
mod tests;

/// The Hugging Face architecture a checkpoint declares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Architecture {
    /// `LlamaForCausalLM` (Llama 2/3, SmolLM2, TinyLlama).
    Llama,
    /// `Qwen2ForCausalLM`: biases on q, k and v.
    Qwen2,
    /// `Qwen3ForCausalLM`: RMSNorm on each head of q and k.
    Qwen3,
}

impl Architecture {
    /// The class name in `config.json`'s `architectures`.
    pub fn hf_class(self) -> &'static str {
        match self {
            Self::Llama => "LlamaForCausalLM",
            Self::Qwen2 => "Qwen2ForCausalLM",
            Self::Qwen3 => "Qwen3ForCausalLM",
        }
    }

    /// The `model_type` in `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }

    fn from_class(class: &str) -> Option<Self> {
        [Self::Llama, Self::Qwen2, Self::Qwen3]
            .into_iter()
            .find(|a| a.hf_class() == class)
    }
}

/// How rotary position frequencies are rescaled (`rope_scaling` / `rope_parameters.rope_type`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum RopeScaling {
    /// Plain RoPE (`rope_type: "default"`).
    Default,
    /// Positions divided by `factor` (`rope_type: "linear"`).
    Linear { factor: f64 },
    /// Llama 3.1's frequency-dependent scaling (`rope_type: "llama3"`).
    Llama3 {
        factor: f64,
        low_freq_factor: f64,
        high_freq_factor: f64,
        original_max_position_embeddings: usize,
    },
}

/// Everything that determines the model's maths, plus the special token ids a checkpoint declares.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelConfig {
    /// Which Hugging Face class this is.
    pub architecture: Architecture,
    /// Number of token ids (rows of the embedding).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Number of decoder layers.
    pub num_hidden_layers: usize,
    /// Number of query heads.
    pub num_attention_heads: usize,
    /// Number of key/value heads (grouped-query attention when fewer than query heads).
    pub num_key_value_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Longest sequence the checkpoint was trained for; generation stops there.
    pub max_position_embeddings: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// RoPE frequency rescaling.
    pub rope_scaling: RopeScaling,
    /// The output projection reuses the token embedding.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections.
    pub qkv_bias: bool,
    /// Bias on the attention output projection.
    pub o_bias: bool,
    /// Biases on the MLP projections.
    pub mlp_bias: bool,
    /// RMSNorm over each head of q and k before RoPE (Qwen3).
    pub qk_norm: bool,
    /// Beginning-of-sequence token, if declared.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (one or several), if declared.
    pub eos_token_ids: Vec<u32>,
    /// Padding token, if declared.
    pub pad_token_id: Option<u32>,
}

/// Fields that never change the forward pass: bookkeeping, generation defaults, output switches.
const HARMLESS_FIELDS: &[&str] = &[
    "_name_or_path",
    "_model_name_or_path",
    "_attn_implementation_autoset",
    "architectures",
    "model_type",
    "transformers_version",
    "dtype",
    "torch_dtype",
    "use_cache",
    "initializer_range",
    "output_attentions",
    "output_hidden_states",
    "return_dict",
    "unk_token_id",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "sep_token_id",
    "decoder_start_token_id",
    "tokenizer_class",
    "id2label",
    "label2id",
    "problem_type",
    "chunk_size_feed_forward",
    "is_encoder_decoder",
    "is_decoder",
    "add_cross_attention",
    "tie_encoder_decoder",
    "prefix",
    "task_specific_params",
    "finetuning_task",
    "cross_attention_hidden_size",
    "tf_legacy_loss",
    "use_bfloat16",
    "pruned_heads",
    "torchscript",
    "max_length",
    "min_length",
    "do_sample",
    "early_stopping",
    "num_beams",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "length_penalty",
    "no_repeat_ngram_size",
    "bad_words_ids",
    "num_return_sequences",
    "pretraining_tp",
    // Only meaningful with `use_sliding_window: true`, which is rejected.
    "sliding_window",
    "max_window_layers",
];

impl ModelConfig {
    /// A configuration with Hugging Face's defaults for `architecture` and the given sizes; adjust the public
    /// fields afterwards (for example to build a tiny random policy).
    pub fn new(
        architecture: Architecture,
        vocab_size: usize,
        hidden_size: usize,
        intermediate_size: usize,
        num_hidden_layers: usize,
        num_attention_heads: usize,
        num_key_value_heads: usize,
    ) -> Self {
        Self {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim: hidden_size / num_attention_heads.max(1),
            max_position_embeddings: 4096,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_scaling: RopeScaling::Default,
            tie_word_embeddings: false,
            qkv_bias: architecture == Architecture::Qwen2,
            o_bias: false,
            mlp_bias: false,
            qk_norm: architecture == Architecture::Qwen3,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            pad_token_id: None,
        }
    }

    /// Reads and validates `config.json` (the file, not its folder).
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io("reading", path, e))?;
        Self::from_json_str(&text, path)
    }

    /// Parses `config.json` text; `path` only names the file in errors.
    pub fn from_json_str(text: &str, path: &Path) -> Result<Self> {
        let value: Value = serde_json::from_str(text).map_err(|source| Error::Json {
            path: path.to_path_buf(),
            source,
        })?;
        let Value::Object(map) = value else {
            return Err(Error::config(path, "expected a JSON object"));
        };
        Self::from_map(&map).map_err(|message| Error::config(path, message))
    }

    fn from_map(map: &Map<String, Value>) -> std::result::Result<Self, String> {
        let mut problems = Vec::new();
        let arch = match map.get("architectures") {
            Some(Value::Array(classes)) if classes.len() == 1 => {
                let class = classes[0].as_str().unwrap_or_default();
                Architecture::from_class(class).ok_or_else(|| {
                    format!(
                        "unsupported architecture `{class}` in `architectures` (supported: LlamaForCausalLM, \
                         Qwen2ForCausalLM, Qwen3ForCausalLM)"
                    )
                })
            }
            Some(other) => Err(format!(
                "`architectures` must list exactly one class, found {other}"
            )),
            None => match map.get("model_type").and_then(Value::as_str) {
                Some("llama") => Ok(Architecture::Llama),
                Some("qwen2") => Ok(Architecture::Qwen2),
                Some("qwen3") => Ok(Architecture::Qwen3),
                Some(other) => Err(format!("unsupported `model_type` `{other}`")),
                None => Err("missing `architectures` (and `model_type`)".to_string()),
            },
        };
        let arch = arch?;
        if let Some(mt) = map.get("model_type").and_then(Value::as_str)
            && mt != arch.model_type()
        {
            problems.push(format!(
                "`model_type` `{mt}` does not match architecture {}",
                arch.hf_class()
            ));
        }

        let mut r = Reader {
            map,
            problems: &mut problems,
        };
        let vocab_size = r.usize("vocab_size", None);
        let hidden_size = r.usize("hidden_size", None);
        let intermediate_size = r.usize("intermediate_size", None);
        let num_hidden_layers = r.usize("num_hidden_layers", None);
        let num_attention_heads = r.usize("num_attention_heads", None);
        let num_key_value_heads = r.usize("num_key_value_heads", Some(num_attention_heads));
        let default_head_dim = match arch {
            // Qwen3's config class defaults head_dim to 128 rather than deriving it.
            Architecture::Qwen3 => 128,
            _ => hidden_size / num_attention_heads.max(1),
        };
        let head_dim = match map.get("head_dim") {
            None | Some(Value::Null) => default_head_dim,
            Some(_) => r.usize("head_dim", None),
        };
        let max_position_embeddings = r.usize("max_position_embeddings", Some(2048));
        let rms_norm_eps = r.f64("rms_norm_eps", Some(1e-6));
        let tie_word_embeddings = r.bool("tie_word_embeddings", false);
        let attention_bias = r.bool("attention_bias", false);
        let mlp_bias = r.bool("mlp_bias", false);
        let act = map.get("hidden_act").and_then(Value::as_str).unwrap_or("silu");
        if act != "silu" {
            r.problems
                .push(format!("`hidden_act` `{act}` is not supported (only silu)"));
        }
        let dropout = r.f64("attention_dropout", Some(0.0));
        if dropout != 0.0 {
            r.problems.push(format!(
                "`attention_dropout` {dropout} is not supported (only 0.0)"
            ));
        }
        if r.bool("use_sliding_window", false) {
            r.problems
                .push("`use_sliding_window: true` is not supported".to_string());
        }
        if let Some(Value::Array(types)) = map.get("layer_types") {
            if types.len() != num_hidden_layers {
                r.problems.push(format!(
                    "`layer_types` lists {} layers but `num_hidden_layers` is {num_hidden_layers}",
                    types.len()
                ));
            }
            for (i, t) in types.iter().enumerate() {
                if t.as_str() != Some("full_attention") {
                    r.problems.push(format!(
                        "`layer_types[{i}]` is {t}; only full_attention is supported"
                    ));
                }
            }
        }
        if map.contains_key("quantization_config") {
            r.problems
                .push("`quantization_config`: quantised checkpoints are not supported".to_string());
        }
        let (rope_theta, rope_scaling) = rope(map, r.problems);

        let bos_token_id = r.token("bos_token_id");
        let pad_token_id = r.token("pad_token_id");
        let eos_token_ids = match map.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Array(ids)) => ids
                .iter()
                .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                .collect(),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .into_iter()
                .collect(),
        };

        let known: &[&str] = &[
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
            "rms_norm_eps",
            "tie_word_embeddings",
            "attention_bias",
            "mlp_bias",
            "hidden_act",
            "attention_dropout",
            "use_sliding_window",
            "layer_types",
            "rope_theta",
            "rope_scaling",
            "rope_parameters",
            "quantization_config",
        ];
        let mut unknown: Vec<&str> = map
            .keys()
            .map(String::as_str)
            .filter(|k| !known.contains(k) && !HARMLESS_FIELDS.contains(k))
            .collect();
        unknown.sort_unstable();
        if !unknown.is_empty() {
            problems.push(format!(
                "unknown field(s) {}: they may change the model's maths, which this implementation would \
                 silently ignore",
                unknown
                    .iter()
                    .map(|k| format!("`{k}`"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }

        let config = Self {
            architecture: arch,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            tie_word_embeddings,
            qkv_bias: arch == Architecture::Qwen2 || attention_bias,
            o_bias: arch != Architecture::Qwen2 && attention_bias,
            mlp_bias: arch == Architecture::Llama && mlp_bias,
            qk_norm: arch == Architecture::Qwen3,
            bos_token_id,
            eos_token_ids,
            pad_token_id,
        };
        if problems.is_empty() {
            problems.extend(config.check());
        }
        if problems.is_empty() {
            Ok(config)
        } else {
            Err(problems.join("; "))
        }
    }

    /// Consistency problems of a configuration built in code or read from a file.
    pub fn check(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, value) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if value == 0 {
                problems.push(format!("`{name}` must be positive"));
            }
        }
        if self.num_key_value_heads != 0 && !self.num_attention_heads.is_multiple_of(self.num_key_value_heads)
        {
            problems.push(format!(
                "`num_attention_heads` {} is not a multiple of `num_key_value_heads` {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            problems.push(format!("`head_dim` {} must be even for RoPE", self.head_dim));
        }
        if self.rms_norm_eps.is_nan() || self.rms_norm_eps <= 0.0 {
            problems.push(format!("`rms_norm_eps` {} must be positive", self.rms_norm_eps));
        }
        if self.rope_theta.is_nan() || self.rope_theta <= 0.0 {
            problems.push(format!("`rope_theta` {} must be positive", self.rope_theta));
        }
        if self.architecture == Architecture::Qwen2 && !self.qkv_bias {
            problems.push("Qwen2 always has q/k/v biases".to_string());
        }
        if (self.architecture == Architecture::Qwen3) != self.qk_norm {
            problems.push("q/k RMSNorm is exactly Qwen3's".to_string());
        }
        if self.mlp_bias && self.architecture != Architecture::Llama {
            problems.push("MLP biases exist only in LlamaForCausalLM".to_string());
        }
        if self.architecture != Architecture::Qwen2 && self.qkv_bias != self.o_bias {
            problems.push(format!(
                "{} has one `attention_bias` for q, k, v and o together",
                self.architecture.hf_class()
            ));
        }
        if self.architecture == Architecture::Qwen2 && self.o_bias {
            problems.push("Qwen2 has no bias on o_proj".to_string());
        }
        problems
    }

    /// The number of parameters (tied embeddings counted once).
    pub fn num_parameters(&self) -> usize {
        let (h, kv, q) = (
            self.hidden_size,
            self.num_key_value_heads * self.head_dim,
            self.num_attention_heads * self.head_dim,
        );
        let mut layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate_size + 2 * h;
        if self.qkv_bias {
            layer += q + 2 * kv;
        }
        if self.o_bias {
            layer += h;
        }
        if self.mlp_bias {
            layer += 2 * self.intermediate_size + h;
        }
        if self.qk_norm {
            layer += 2 * self.head_dim;
        }
        let embed = self.vocab_size * h;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        embed + head + h + self.num_hidden_layers * layer
    }

    /// The `config.json` that transformers (5.x, and 4.x through `rope_theta`/`rope_scaling`) reads back
    /// into the same model.
    pub fn to_hf_json(&self) -> Value {
        let mut rope = Map::new();
        rope.insert("rope_theta".into(), json!(self.rope_theta));
        match &self.rope_scaling {
            RopeScaling::Default => {
                rope.insert("rope_type".into(), json!("default"));
            }
            RopeScaling::Linear { factor } => {
                rope.insert("rope_type".into(), json!("linear"));
                rope.insert("factor".into(), json!(factor));
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                rope.insert("rope_type".into(), json!("llama3"));
                rope.insert("factor".into(), json!(factor));
                rope.insert("low_freq_factor".into(), json!(low_freq_factor));
                rope.insert("high_freq_factor".into(), json!(high_freq_factor));
                rope.insert(
                    "original_max_position_embeddings".into(),
                    json!(original_max_position_embeddings),
                );
            }
        }
        let eos = match self.eos_token_ids.as_slice() {
            [] => Value::Null,
            [one] => json!(one),
            many => json!(many),
        };
        let mut out = json!({
            "architectures": [self.architecture.hf_class()],
            "model_type": self.architecture.model_type(),
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_parameters": Value::Object(rope),
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": eos,
            "pad_token_id": self.pad_token_id,
            "dtype": "float32",
            "use_cache": true,
        });
        let obj = out.as_object_mut().expect("built as an object");
        match self.architecture {
            Architecture::Llama => {
                obj.insert("attention_bias".into(), json!(self.qkv_bias));
                obj.insert("mlp_bias".into(), json!(self.mlp_bias));
            }
            Architecture::Qwen2 => {
                obj.insert("use_sliding_window".into(), json!(false));
            }
            Architecture::Qwen3 => {
                obj.insert("attention_bias".into(), json!(self.qkv_bias));
                obj.insert("use_sliding_window".into(), json!(false));
            }
        }
        out
    }
}

/// Typed field access that records a problem instead of stopping at the first one.
struct Reader<'a> {
    map: &'a Map<String, Value>,
    problems: &'a mut Vec<String>,
}

impl Reader<'_> {
    fn usize(&mut self, key: &str, default: Option<usize>) -> usize {
        match (self.map.get(key), default) {
            (None | Some(Value::Null), Some(d)) => d,
            (None | Some(Value::Null), None) => {
                self.problems.push(format!("missing `{key}`"));
                0
            }
            (Some(v), _) => match v.as_u64().and_then(|n| usize::try_from(n).ok()) {
                Some(n) => n,
                None => {
                    self.problems
                        .push(format!("`{key}` must be a non-negative integer, found {v}"));
                    0
                }
            },
        }
    }

    fn f64(&mut self, key: &str, default: Option<f64>) -> f64 {
        match (self.map.get(key), default) {
            (None | Some(Value::Null), Some(d)) => d,
            (None | Some(Value::Null), None) => {
                self.problems.push(format!("missing `{key}`"));
                0.0
            }
            (Some(v), _) => v.as_f64().unwrap_or_else(|| {
                self.problems.push(format!("`{key}` must be a number, found {v}"));
                0.0
            }),
        }
    }

    fn bool(&mut self, key: &str, default: bool) -> bool {
        match self.map.get(key) {
            None | Some(Value::Null) => default,
            Some(Value::Bool(b)) => *b,
            Some(v) => {
                self.problems
                    .push(format!("`{key}` must be true or false, found {v}"));
                default
            }
        }
    }

    fn token(&mut self, key: &str) -> Option<u32> {
        match self.map.get(key) {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => Some(n),
                None => {
                    self.problems
                        .push(format!("`{key}` must be a token id, found {v}"));
                    None
                }
            },
        }
    }
}

/// RoPE base and scaling from either transformers 5's `rope_parameters` or 4's `rope_theta`/`rope_scaling`.
fn rope(map: &Map<String, Value>, problems: &mut Vec<String>) -> (f64, RopeScaling) {
    let params = match (map.get("rope_parameters"), map.get("rope_scaling")) {
        (Some(Value::Object(p)), _) => Some(("rope_parameters", p)),
        (_, Some(Value::Object(p))) => Some(("rope_scaling", p)),
        (Some(v @ (Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_))), _) => {
            problems.push(format!("`rope_parameters` must be an object, found {v}"));
            None
        }
        _ => None,
    };
    let theta_top = map.get("rope_theta").and_then(Value::as_f64);
    let theta_param = params.and_then(|(_, p)| p.get("rope_theta").and_then(Value::as_f64));
    let theta = theta_param.or(theta_top).unwrap_or(10_000.0);
    let Some((field, p)) = params else {
        return (theta, RopeScaling::Default);
    };
    let kind = p
        .get("rope_type")
        .or_else(|| p.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("default");
    let num = |key: &str, problems: &mut Vec<String>| -> f64 {
        p.get(key).and_then(Value::as_f64).unwrap_or_else(|| {
            problems.push(format!("`{field}.{key}` is required for rope_type `{kind}`"));
            1.0
        })
    };
    let allowed: &[&str] = match kind {
        "default" => &[],
        "linear" => &["factor"],
        "llama3" => &[
            "factor",
            "low_freq_factor",
            "high_freq_factor",
            "original_max_position_embeddings",
        ],
        other => {
            problems.push(format!(
                "`{field}.rope_type` `{other}` is not supported (default, linear, llama3)"
            ));
            return (theta, RopeScaling::Default);
        }
    };
    for key in p.keys() {
        if !["rope_type", "type", "rope_theta"].contains(&key.as_str()) && !allowed.contains(&key.as_str()) {
            problems.push(format!(
                "`{field}.{key}` is not supported with rope_type `{kind}`"
            ));
        }
    }
    let scaling = match kind {
        "linear" => RopeScaling::Linear {
            factor: num("factor", problems),
        },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor", problems),
            low_freq_factor: num("low_freq_factor", problems),
            high_freq_factor: num("high_freq_factor", problems),
            original_max_position_embeddings: num("original_max_position_embeddings", problems) as usize,
        },
        _ => RopeScaling::Default,
    };
    (theta, scaling)
}
