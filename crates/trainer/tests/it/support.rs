//! Shared helpers: the transformers oracle (a Python script of this crate run in the fixture venv),
//! reading its float32 dumps, and comparing logits.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde_json::Value;
use trainer::backend::Cpu;
use trainer::model::{AttnInput, CausalLm};
use trainer::rope::RopeTable;
use trainer::{ModelConfig, Weights};

/// The Python of the torch venv, or a failure that says how to get it.
pub(crate) fn torch_python() -> PathBuf {
    match std::env::var_os("ARENA_RL_PY_TORCH") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "ARENA_RL_PY_TORCH is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        ),
    }
}

/// The converted SmolLM2 folder, or a failure that says how to get it.
pub(crate) fn smollm2_dir() -> PathBuf {
    match std::env::var_os("ARENA_RL_SMOLLM2") {
        Some(p) => PathBuf::from(p),
        None => panic!(
            "ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        ),
    }
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("python/hf_reference.py")
}

/// Runs the oracle on `job`, writing into `out`; returns its result.json.
pub(crate) fn run_oracle(job: &Value, out: &Path) -> Result<Value> {
    let job_path = out.join("job.json");
    std::fs::write(&job_path, serde_json::to_vec(job)?)?;
    let output = Command::new(torch_python())
        .arg(script())
        .arg(&job_path)
        .arg(out)
        .env("HF_HUB_OFFLINE", "1")
        .env("TRANSFORMERS_OFFLINE", "1")
        .env("TRANSFORMERS_VERBOSITY", "error")
        .output()
        .context("starting the transformers oracle")?;
    if !output.status.success() {
        bail!(
            "transformers oracle failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let text = std::fs::read_to_string(out.join("result.json"))?;
    Ok(serde_json::from_str(&text)?)
}

/// Reads `NAME.f32` written by the oracle.
pub(crate) fn read_f32(path: &Path) -> Result<Vec<f32>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    Ok(bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

/// A model folder loaded into the CPU backend.
pub(crate) struct Loaded {
    pub(crate) config: ModelConfig,
    pub(crate) model: CausalLm<Cpu>,
    pub(crate) rope: RopeTable,
}

pub(crate) fn load(dir: &Path) -> Result<Loaded> {
    let folder = trainer::ModelFolder::open(dir)?;
    let weights = Weights::load_dir(dir)?;
    let model = CausalLm::<Cpu>::from_weights(&folder.config, &weights, &Default::default())?;
    Ok(Loaded {
        rope: RopeTable::new(&folder.config),
        config: folder.config,
        model,
    })
}

impl Loaded {
    /// Logits `[batch * width * vocab]` for padded rows, computed by burn.
    pub(crate) fn logits(&self, rows: &[Vec<u32>], left: bool) -> Vec<f32> {
        let width = rows.iter().map(Vec::len).max().unwrap_or(0);
        let lengths: Vec<usize> = rows.iter().map(Vec::len).collect();
        let mut ids = Vec::new();
        for r in rows {
            let pad = std::iter::repeat_n(0i64, width - r.len());
            let real = r.iter().map(|&t| i64::from(t));
            if left {
                ids.extend(pad.chain(real));
            } else {
                ids.extend(real.chain(pad));
            }
        }
        let device = Default::default();
        let input = AttnInput::<Cpu>::padded(&self.rope, &lengths, width, left, &device);
        let tokens =
            burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(ids, [rows.len(), width]), &device);
        self.model
            .forward(tokens, &input)
            .into_data()
            .into_vec::<f32>()
            .expect("f32 logits")
    }
}

/// The largest absolute difference between `ours` and `theirs` over the real (unpadded) positions.
pub(crate) fn max_diff_valid(
    ours: &[f32],
    theirs: &[f32],
    rows: &[Vec<u32>],
    left: bool,
    vocab: usize,
) -> f32 {
    assert_eq!(ours.len(), theirs.len(), "logit tensors differ in size");
    let width = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut worst = 0.0f32;
    let mut at = (0, 0, 0);
    for (b, r) in rows.iter().enumerate() {
        let start = if left { width - r.len() } else { 0 };
        for t in start..start + r.len() {
            let off = (b * width + t) * vocab;
            for v in 0..vocab {
                let d = (ours[off + v] - theirs[off + v]).abs();
                assert!(d.is_finite(), "non-finite logit at row {b} position {t}");
                if d > worst {
                    worst = d;
                    at = (b, t, v);
                }
            }
        }
    }
    let off = (at.0 * width + at.1) * vocab + at.2;
    eprintln!(
        "largest logit difference at row {} position {} token {}: ours {} theirs {}",
        at.0, at.1, at.2, ours[off], theirs[off]
    );
    worst
}

/// A fresh temporary folder.
pub(crate) fn tempdir() -> tempfile::TempDir {
    tempfile::tempdir().expect("creating a temporary folder")
}
