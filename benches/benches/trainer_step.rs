//! Training speed of `trainer`'s GRPO step against the same step in PyTorch on the CPU, same tiny model,
//! same run.
//!
//! One step is: forward over the batch, PPO-clip loss on the trained tokens, backward, gradient-norm clipping
//! and one AdamW update. Two workloads: 8 sequences of 256 tokens and 4 of 512, the last three quarters of
//! each trained. PyTorch runs them through `crates/trainer/python/bench_train.py` in the `ARENA_RL_PY_TORCH`
//! venv (`cargo xtask fixtures` prepares it), workload by workload between burn's measurements; the bench ends
//! with a table of both rates (every token of the batch counts) and their ratio (burn over PyTorch; above 1
//! means burn is faster).

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

#[path = "common/torch_peer.rs"]
mod torch_peer;
use criterion::{Criterion, Throughput};
use torch_peer::{TorchPeer, median};
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{
    Architecture, ModelConfig, RlBatch, SaveDtype, TrainConfig, TrainSequence, Trainer, TrainerOptions,
    Weights, save_pretrained,
};

struct Workload {
    name: &'static str,
    batch: usize,
    seq_len: usize,
    prompt_len: usize,
}

const WORKLOADS: [Workload; 2] = [
    Workload {
        name: "b8x256",
        batch: 8,
        seq_len: 256,
        prompt_len: 64,
    },
    Workload {
        name: "b4x512",
        batch: 4,
        seq_len: 512,
        prompt_len: 128,
    },
];

impl Workload {
    fn tokens(&self) -> usize {
        self.batch * self.seq_len
    }

    /// The batch `bench_train.py` builds: the same token ids, behaviour log-probabilities and advantages.
    fn batch(&self, vocab: usize) -> RlBatch {
        let sequences = (0..self.batch)
            .map(|s| TrainSequence {
                tokens: (0..self.seq_len)
                    .map(|i| (((s * self.seq_len + i) * 7919) % vocab) as u32)
                    .collect(),
                loss_mask: (0..self.seq_len).map(|i| i >= self.prompt_len).collect(),
                logprobs: vec![-8.3; self.seq_len],
                versions: vec![0; self.seq_len],
                advantage: if s % 2 == 0 { 1.0 } else { -1.0 },
                truncated: Vec::new(),
                temperatures: Vec::new(),
            })
            .collect();
        RlBatch {
            sequences,
            group_sizes: vec![],
            policy_version: 0,
        }
    }
}

/// The quickstart-sized model of the generation bench: about 4M parameters.
fn config() -> ModelConfig {
    let mut c = ModelConfig::new(Architecture::Llama, 4096, 256, 768, 4, 8, 4);
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 2048;
    c
}

impl Workload {
    /// The peer's request for this workload.
    fn request(&self, repeats: usize) -> serde_json::Value {
        serde_json::json!({"name": self.name, "batch": self.batch, "seq_len": self.seq_len,
            "prompt_len": self.prompt_len, "repeats": repeats})
    }
}

fn main() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let config = config();
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.02, 1, &Default::default()));
    save_pretrained(tmp.path(), &config, &weights, SaveDtype::F32, None)?;

    let mut peer = TorchPeer::start("the PyTorch bench", "bench_train.py", tmp.path(), Stdio::null())?;
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    let mut group = criterion.benchmark_group("trainer_step");
    let mut rows = Vec::new();
    for w in &WORKLOADS {
        // PyTorch first, then burn, workload by workload, so both see the same machine load.
        let (theirs, threads) = peer.measure(&w.request(5))?;
        let batch = w.batch(config.vocab_size);
        // Both sides start each workload from the same weights and take the same steps.
        let mut trainer = Trainer::new(
            config.clone(),
            &weights,
            TrainConfig::default(),
            TrainerOptions::default(),
        )?;
        let samples = Arc::new(Mutex::new(Vec::new()));
        group.throughput(Throughput::Elements(w.tokens() as u64));
        let recorded = samples.clone();
        group.bench_function(w.name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    trainer.grpo_step(&batch).expect("valid batch");
                }
                let elapsed = start.elapsed();
                recorded
                    .lock()
                    .expect("not poisoned")
                    .push(elapsed / iters as u32);
                elapsed
            })
        });
        let samples = samples.lock().expect("not poisoned").clone();
        if samples.is_empty() {
            // Filtered out on the command line.
            continue;
        }
        let per_step = median(samples);
        rows.push((
            w.name,
            w.tokens() as f64 / per_step.as_secs_f64(),
            theirs,
            threads,
        ));
    }
    group.finish();
    drop(peer);
    criterion.final_summary();

    println!(
        "\ntrainer_step: one GRPO step, burn (ndarray + the trainer's CPU kernels) against PyTorch on the CPU"
    );
    println!(
        "{:<10}{:>14}{:>15}{:>15}{:>10}",
        "workload", "burn tok/s", "torch tok/s", "torch threads", "ratio"
    );
    for (name, ours, theirs, threads) in rows {
        println!(
            "{name:<10}{ours:>14.1}{theirs:>15.1}{threads:>15}{:>10.2}",
            ours / theirs
        );
    }
    Ok(())
}
