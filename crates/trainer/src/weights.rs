//! Parameters on the host under their Hugging Face names, to and from safetensors and burn modules.
//!
//! [`Weights`] is the backend-free currency of the crate: it is what a checkpoint folder loads into, what a
//! trained model exports, and what a weight swap ships to the inference engine.
//! Reading accepts f32, f16 and bf16 in one file or in shards with `model.safetensors.index.json`; writing
//! produces files transformers and SGLang load.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use safetensors::{Dtype, SafeTensors};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::model::CausalLm;

#[cfg(test)]
mod tests;

/// The single-file weights name.
pub const SINGLE_FILE: &str = "model.safetensors";
/// The sharded weights index name.
pub const INDEX_FILE: &str = "model.safetensors.index.json";

/// One tensor on the host, in f32.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

/// The element type safetensors files are written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SaveDtype {
    F32,
    F16,
    Bf16,
}

/// A set of named parameters (Hugging Face names) on the host.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Weights {
    tensors: BTreeMap<String, HostTensor>,
}

impl Weights {
    /// Adds or replaces one tensor.
    pub fn insert(&mut self, name: impl Into<String>, tensor: HostTensor) {
        self.tensors.insert(name.into(), tensor);
    }

    /// One tensor by name.
    pub fn get(&self, name: &str) -> Option<&HostTensor> {
        self.tensors.get(name)
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of scalars.
    pub fn num_elements(&self) -> usize {
        self.tensors.values().map(|t| t.data.len()).sum()
    }

    /// Reads the weights of a model folder: `model.safetensors`, or the shards its index lists.
    pub fn load_dir(dir: &Path) -> Result<Self> {
        let index = dir.join(INDEX_FILE);
        let single = dir.join(SINGLE_FILE);
        if index.exists() {
            let text = std::fs::read_to_string(&index).map_err(|e| Error::io("reading", &index, e))?;
            let parsed: IndexFile = serde_json::from_str(&text).map_err(|source| Error::Json {
                path: index.clone(),
                source,
            })?;
            let mut files: Vec<&String> = parsed.weight_map.values().collect();
            files.sort_unstable();
            files.dedup();
            let mut out = Self::default();
            for file in files {
                if file.contains('/') || file.contains('\\') || file.starts_with('.') {
                    return Err(Error::weights(
                        &index,
                        format!("shard name `{file}` is not a plain file name"),
                    ));
                }
                let shard = Self::load_file(&dir.join(file))?;
                for (name, t) in shard.tensors {
                    if parsed.weight_map.get(&name) != Some(file) {
                        return Err(Error::weights(
                            dir.join(file),
                            format!("tensor `{name}` is not listed for this shard in {INDEX_FILE}"),
                        ));
                    }
                    out.tensors.insert(name, t);
                }
            }
            if let Some(missing) = parsed.weight_map.keys().find(|n| !out.tensors.contains_key(*n)) {
                return Err(Error::weights(
                    &index,
                    format!("tensor `{missing}` is listed but not found in its shard"),
                ));
            }
            Ok(out)
        } else if single.exists() {
            Self::load_file(&single)
        } else {
            Err(Error::weights(
                dir,
                format!("no {SINGLE_FILE} or {INDEX_FILE} in this folder"),
            ))
        }
    }

    /// Reads one safetensors file, converting every tensor to f32.
    pub fn load_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
        let st = SafeTensors::deserialize(&bytes)
            .map_err(|e| Error::weights(path, format!("not a valid safetensors file: {e}")))?;
        let mut out = Self::default();
        for (name, view) in st.iter() {
            let raw = view.data();
            let data: Vec<f32> = match view.dtype() {
                Dtype::F32 => raw
                    .chunks_exact(4)
                    .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                    .collect(),
                Dtype::F16 => raw
                    .chunks_exact(2)
                    .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                Dtype::BF16 => raw
                    .chunks_exact(2)
                    .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
                    .collect(),
                other => {
                    return Err(Error::weights(
                        path,
                        format!("tensor `{name}` has dtype {other:?}; only F32, F16 and BF16 are supported"),
                    ));
                }
            };
            out.tensors.insert(
                name.to_string(),
                HostTensor {
                    shape: view.shape().to_vec(),
                    data,
                },
            );
        }
        Ok(out)
    }

    /// Writes the weights into `dir` as `model.safetensors`, or as shards of at most `max_shard_bytes` with
    /// an index when they do not fit in one.
    pub fn save_dir(&self, dir: &Path, dtype: SaveDtype, max_shard_bytes: Option<u64>) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        let elem = match dtype {
            SaveDtype::F32 => 4,
            SaveDtype::F16 | SaveDtype::Bf16 => 2,
        };
        let limit = max_shard_bytes.unwrap_or(u64::MAX);
        let mut shards: Vec<Vec<&str>> = vec![Vec::new()];
        let mut current = 0u64;
        for (name, t) in &self.tensors {
            let size = (t.data.len() * elem) as u64;
            if current > 0 && current + size > limit {
                shards.push(Vec::new());
                current = 0;
            }
            current += size;
            shards.last_mut().expect("at least one shard").push(name);
        }
        for stale in [SINGLE_FILE, INDEX_FILE] {
            let p = dir.join(stale);
            if p.exists() {
                std::fs::remove_file(&p).map_err(|e| Error::io("removing", &p, e))?;
            }
        }
        let metadata = Some(HashMap::from([("format".to_string(), "pt".to_string())]));
        if shards.len() == 1 {
            return self.write_file(&dir.join(SINGLE_FILE), &shards[0], dtype, metadata);
        }
        let n = shards.len();
        let mut weight_map = BTreeMap::new();
        let mut total = 0u64;
        for (i, names) in shards.iter().enumerate() {
            let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            self.write_file(&dir.join(&file), names, dtype, metadata.clone())?;
            for name in names {
                weight_map.insert((*name).to_string(), file.clone());
                total += (self.tensors[*name].data.len() * elem) as u64;
            }
        }
        let index = serde_json::json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join(INDEX_FILE);
        let text = serde_json::to_string_pretty(&index).expect("an index always serialises");
        std::fs::write(&path, text).map_err(|e| Error::io("writing", &path, e))
    }

    fn write_file(
        &self,
        path: &Path,
        names: &[&str],
        dtype: SaveDtype,
        metadata: Option<HashMap<String, String>>,
    ) -> Result<()> {
        let encoded: Vec<(String, Vec<usize>, Vec<u8>)> = names
            .iter()
            .map(|name| {
                let t = &self.tensors[*name];
                let bytes: Vec<u8> = match dtype {
                    SaveDtype::F32 => t.data.iter().flat_map(|x| x.to_le_bytes()).collect(),
                    SaveDtype::F16 => t
                        .data
                        .iter()
                        .flat_map(|x| half::f16::from_f32(*x).to_le_bytes())
                        .collect(),
                    SaveDtype::Bf16 => t
                        .data
                        .iter()
                        .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                        .collect(),
                };
                ((*name).to_string(), t.shape.clone(), bytes)
            })
            .collect();
        let st_dtype = match dtype {
            SaveDtype::F32 => Dtype::F32,
            SaveDtype::F16 => Dtype::F16,
            SaveDtype::Bf16 => Dtype::BF16,
        };
        let views = encoded
            .iter()
            .map(|(name, shape, bytes)| {
                safetensors::tensor::TensorView::new(st_dtype, shape.clone(), bytes)
                    .map(|v| (name.clone(), v))
                    .map_err(|e| Error::weights(path, format!("tensor `{name}`: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        safetensors::serialize_to_file(views, metadata, path)
            .map_err(|e| Error::weights(path, format!("writing: {e}")))
    }

    /// Fresh weights for `config` with Hugging Face's initialisation (normal(0, `std`) projections and
    /// embedding, unit norms, zero biases), drawn from a generator seeded with `seed`: the same seed gives the
    /// same weights (see [`CausalLm::init`]).
    pub fn init(config: &ModelConfig, std: f32, seed: u64) -> Self {
        Self::from_model(&CausalLm::<crate::backend::Cpu>::init(
            config,
            std,
            seed,
            &Default::default(),
        ))
    }

    /// Copies every parameter of `model` to the host, under its Hugging Face name.
    pub fn from_model<B: Backend>(model: &CausalLm<B>) -> Self {
        let mut collector = Collector {
            path: Vec::new(),
            out: Self::default(),
        };
        model.visit(&mut collector);
        collector.out
    }

    /// Checks that the weights are exactly the parameters of `config`'s model (an `lm_head.weight` next to
    /// tied embeddings is allowed and ignored, as transformers does).
    pub fn check_against(&self, config: &ModelConfig) -> std::result::Result<(), String> {
        let expected = expected_shapes(config);
        let mut problems = Vec::new();
        for (name, shape) in &expected {
            match self.tensors.get(name) {
                None => problems.push(format!("missing tensor `{name}`")),
                Some(t) if &t.shape != shape => problems.push(format!(
                    "tensor `{name}` has shape {:?}, expected {shape:?}",
                    t.shape
                )),
                Some(t) if t.data.len() != shape.iter().product::<usize>() => {
                    problems.push(format!("tensor `{name}` has the wrong number of elements"))
                }
                Some(_) => {}
            }
        }
        for name in self.tensors.keys() {
            let tied_head = config.tie_word_embeddings && name == "lm_head.weight";
            if !expected.contains_key(name) && !tied_head {
                problems.push(format!("unexpected tensor `{name}`"));
            }
        }
        if problems.is_empty() {
            Ok(())
        } else {
            problems.truncate(8);
            Err(problems.join("; "))
        }
    }
}

/// The Hugging Face name and shape of every parameter of `config`'s model.
pub fn expected_shapes(config: &ModelConfig) -> BTreeMap<String, Vec<usize>> {
    let (h, i, v, hd) = (
        config.hidden_size,
        config.intermediate_size,
        config.vocab_size,
        config.head_dim,
    );
    let (q, kv) = (config.num_attention_heads * hd, config.num_key_value_heads * hd);
    let mut m = BTreeMap::new();
    m.insert("model.embed_tokens.weight".to_string(), vec![v, h]);
    m.insert("model.norm.weight".to_string(), vec![h]);
    if !config.tie_word_embeddings {
        m.insert("lm_head.weight".to_string(), vec![v, h]);
    }
    for l in 0..config.num_hidden_layers {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        m.insert(p("self_attn.q_proj.weight"), vec![q, h]);
        m.insert(p("self_attn.k_proj.weight"), vec![kv, h]);
        m.insert(p("self_attn.v_proj.weight"), vec![kv, h]);
        m.insert(p("self_attn.o_proj.weight"), vec![h, q]);
        if config.qkv_bias {
            m.insert(p("self_attn.q_proj.bias"), vec![q]);
            m.insert(p("self_attn.k_proj.bias"), vec![kv]);
            m.insert(p("self_attn.v_proj.bias"), vec![kv]);
        }
        if config.o_bias {
            m.insert(p("self_attn.o_proj.bias"), vec![h]);
        }
        if config.qk_norm {
            m.insert(p("self_attn.q_norm.weight"), vec![hd]);
            m.insert(p("self_attn.k_norm.weight"), vec![hd]);
        }
        m.insert(p("mlp.gate_proj.weight"), vec![i, h]);
        m.insert(p("mlp.up_proj.weight"), vec![i, h]);
        m.insert(p("mlp.down_proj.weight"), vec![h, i]);
        if config.mlp_bias {
            m.insert(p("mlp.gate_proj.bias"), vec![i]);
            m.insert(p("mlp.up_proj.bias"), vec![i]);
            m.insert(p("mlp.down_proj.bias"), vec![h]);
        }
        m.insert(p("input_layernorm.weight"), vec![h]);
        m.insert(p("post_attention_layernorm.weight"), vec![h]);
    }
    m
}

#[derive(serde::Deserialize)]
struct IndexFile {
    weight_map: BTreeMap<String, String>,
}

struct Collector {
    path: Vec<String>,
    out: Weights,
}

impl<B: Backend> ModuleVisitor<B> for Collector {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let tensor = param.val();
        let shape = tensor.dims().to_vec();
        let data = tensor
            .into_data()
            .convert::<f32>()
            .into_vec::<f32>()
            .expect("converted to f32 just above");
        self.out
            .tensors
            .insert(self.path.join("."), HostTensor { shape, data });
    }
}

/// Replaces every float parameter by the tensor of the same name, keeping parameter ids (so optimizer
/// state stays attached) and each parameter's device.
struct Installer<'a> {
    path: Vec<String>,
    weights: &'a Weights,
}

impl<B: Backend> ModuleMapper<B> for Installer<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let name = self.path.join(".");
        let Some(host) = self.weights.tensors.get(&name) else {
            // `check_against` ran first, so every parameter has a tensor.
            return param;
        };
        let (id, old, mapper) = param.consume();
        let device = old.device();
        // A bf16 matrix (an inference policy's, `CausalLm::with_matrices_in`) stays bf16.
        let bf16 = old.dtype() == burn::tensor::DType::BF16;
        drop(old);
        let tensor: Tensor<B, D> =
            Tensor::from_data(TensorData::new(host.data.clone(), host.shape.clone()), &device);
        let tensor = if bf16 {
            tensor.cast(burn::tensor::FloatDType::BF16)
        } else {
            tensor
        };
        Param::from_mapped_value(id, tensor, mapper)
    }
}

impl<B: Backend> CausalLm<B> {
    /// Builds the model for `config` directly from `weights` (no random initialisation first).
    pub fn from_weights(config: &ModelConfig, weights: &Weights, device: &B::Device) -> Result<Self> {
        weights.check_against(config).map_err(Error::WeightMismatch)?;
        let template = crate::model::skeleton::<B>(config, device);
        Ok(template.map(&mut Installer {
            path: Vec::new(),
            weights,
        }))
    }

    /// Installs `weights` in place of the current parameters, keeping parameter ids and devices.
    pub fn load_weights(self, config: &ModelConfig, weights: &Weights) -> Result<Self> {
        weights.check_against(config).map_err(Error::WeightMismatch)?;
        Ok(self.map(&mut Installer {
            path: Vec::new(),
            weights,
        }))
    }
}

/// The files of a Hugging Face model folder this crate uses, and the validated config.
#[derive(Clone, Debug)]
pub struct ModelFolder {
    /// The folder.
    pub dir: PathBuf,
    /// Parsed and validated `config.json`.
    pub config: ModelConfig,
    /// `tokenizer.json`, when present.
    pub tokenizer_json: Option<PathBuf>,
    /// `tokenizer_config.json`, when present.
    pub tokenizer_config: Option<PathBuf>,
    /// `chat_template.jinja` (or `chat_template.json`), when present; older checkpoints keep the template
    /// inside `tokenizer_config.json` instead.
    pub chat_template: Option<PathBuf>,
    /// `generation_config.json`, when present.
    pub generation_config: Option<PathBuf>,
}

impl ModelFolder {
    /// Opens a folder: reads and validates `config.json` and finds the tokenizer and template files.
    /// Weights are read separately ([`Weights::load_dir`]).
    pub fn open(dir: &Path) -> Result<Self> {
        if !dir.is_dir() {
            return Err(Error::io(
                "opening model folder",
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "not a directory"),
            ));
        }
        let config_path = dir.join("config.json");
        if !config_path.exists() {
            return Err(Error::config(
                &config_path,
                "missing: a model folder needs config.json",
            ));
        }
        let mut config = ModelConfig::from_file(&config_path)?;
        let existing = |name: &str| Some(dir.join(name)).filter(|p| p.exists());
        let generation_config = existing("generation_config.json");
        if let Some(gen_path) = &generation_config
            && let Ok(text) = std::fs::read_to_string(gen_path)
            && let Ok(value) = serde_json::from_str::<serde_json::Value>(&text)
        {
            // generation_config.json's eos ids are the ones generation stops at (often more than config's).
            let ids: Vec<u32> = match value.get("eos_token_id") {
                Some(serde_json::Value::Array(a)) => a
                    .iter()
                    .filter_map(|v| v.as_u64().and_then(|n| u32::try_from(n).ok()))
                    .collect(),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| u32::try_from(n).ok())
                    .into_iter()
                    .collect(),
                None => Vec::new(),
            };
            for id in ids {
                if !config.eos_token_ids.contains(&id) {
                    config.eos_token_ids.push(id);
                }
            }
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            config,
            tokenizer_json: existing("tokenizer.json"),
            tokenizer_config: existing("tokenizer_config.json"),
            chat_template: existing("chat_template.jinja").or_else(|| existing("chat_template.json")),
            generation_config,
        })
    }
}

impl ModelFolder {
    /// Copies the tokenizer, chat template and generation config into `dest`, so a checkpoint written there
    /// is a complete folder for transformers, SGLang and the proxy.
    pub fn copy_tokenizer_files(&self, dest: &Path) -> Result<()> {
        std::fs::create_dir_all(dest).map_err(|e| Error::io("creating", dest, e))?;
        let files = [
            &self.tokenizer_json,
            &self.tokenizer_config,
            &self.chat_template,
            &self.generation_config,
        ];
        for src in files.into_iter().flatten() {
            let name = src.file_name().expect("found by file name");
            let to = dest.join(name);
            std::fs::copy(src, &to).map_err(|e| Error::io("copying", &to, e))?;
        }
        for extra in ["special_tokens_map.json", "vocab.json", "merges.txt"] {
            let src = self.dir.join(extra);
            if src.exists() {
                let to = dest.join(extra);
                std::fs::copy(&src, &to).map_err(|e| Error::io("copying", &to, e))?;
            }
        }
        Ok(())
    }
}

/// Writes a complete Hugging Face folder: `config.json`, `generation_config.json` and the weights.
/// Tokenizer files are the caller's to copy (see [`ModelFolder`]).
pub fn save_pretrained(
    dir: &Path,
    config: &ModelConfig,
    weights: &Weights,
    dtype: SaveDtype,
    max_shard_bytes: Option<u64>,
) -> Result<()> {
    weights.check_against(config).map_err(Error::WeightMismatch)?;
    std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
    let mut cfg = config.to_hf_json();
    let dtype_name = match dtype {
        SaveDtype::F32 => "float32",
        SaveDtype::F16 => "float16",
        SaveDtype::Bf16 => "bfloat16",
    };
    cfg["dtype"] = serde_json::json!(dtype_name);
    let write_json = |name: &str, value: &serde_json::Value| -> Result<()> {
        let path = dir.join(name);
        let text = serde_json::to_string_pretty(value).expect("JSON values always serialise");
        std::fs::write(&path, text + "\n").map_err(|e| Error::io("writing", &path, e))
    };
    write_json("config.json", &cfg)?;
    let mut generation = serde_json::json!({});
    if let Some(bos) = config.bos_token_id {
        generation["bos_token_id"] = bos.into();
    }
    match config.eos_token_ids.as_slice() {
        [] => {}
        [one] => generation["eos_token_id"] = (*one).into(),
        many => generation["eos_token_id"] = serde_json::json!(many),
    }
    if let Some(pad) = config.pad_token_id {
        generation["pad_token_id"] = pad.into();
    }
    write_json("generation_config.json", &generation)?;
    weights.save_dir(dir, dtype, max_shard_bytes)
}
