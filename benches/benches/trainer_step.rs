//! Training speed of `trainer`'s GRPO step against the same step in PyTorch on the CPU, same model, same run.
//!
//! One step is: forward over the batch, PPO-clip loss on the trained tokens, backward, gradient-norm clipping
//! and one AdamW update. Two shapes (`common/shapes.rs`): the quickstart's tiny model, at 8 sequences of
//! 256 tokens and 4 of 512, and SmolLM2-135M's shape at 4 sequences of 512; the last three quarters of each
//! sequence are trained. PyTorch runs them through `crates/trainer/python/bench_train.py` in the
//! `ARENA_RL_PY_TORCH` venv (`cargo xtask fixtures` prepares it), workload by workload between burn's
//! measurements; the bench ends with a table of both rates (every token of the batch counts) and their ratio
//! (burn over PyTorch; above 1 means burn is faster). `cargo bench --bench trainer_step -- smollm2` runs the
//! large shape alone.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Result;

#[path = "common/shapes.rs"]
mod shapes;
#[path = "common/torch_peer.rs"]
mod torch_peer;
use criterion::{Criterion, Throughput};
use torch_peer::{TorchPeer, median};
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{
    RlBatch, SaveDtype, TrainConfig, TrainSequence, Trainer, TrainerOptions, Weights, save_pretrained,
};

struct Workload {
    name: &'static str,
    batch: usize,
    seq_len: usize,
    prompt_len: usize,
}

const B8X256: Workload = Workload {
    name: "b8x256",
    batch: 8,
    seq_len: 256,
    prompt_len: 64,
};
const B4X512: Workload = Workload {
    name: "b4x512",
    batch: 4,
    seq_len: 512,
    prompt_len: 128,
};

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

impl Workload {
    /// The peer's request for this workload.
    fn request(&self, repeats: usize) -> serde_json::Value {
        serde_json::json!({"name": self.name, "batch": self.batch, "seq_len": self.seq_len,
            "prompt_len": self.prompt_len, "repeats": repeats})
    }
}

/// One row of the table: shape, workload, burn's rate, PyTorch's rate and thread count.
type Row = (&'static str, &'static str, f64, f64, u64);

/// Measures `workloads` on `shape`: PyTorch first, then burn, workload by workload, so both see the same
/// machine load; `repeats` timed PyTorch steps per thread count.
fn measure_shape(
    criterion: &mut Criterion,
    shape: &shapes::Shape,
    workloads: &[&Workload],
    repeats: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let ids: Vec<String> = workloads
        .iter()
        .map(|w| format!("{}/{}", shape.name, w.name))
        .collect();
    if !ids.iter().any(|id| criterion_selects(id)) {
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let config = &shape.config;
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(config, 0.02, 1, &Default::default()));
    save_pretrained(tmp.path(), config, &weights, SaveDtype::F32, None)?;
    let mut peer = TorchPeer::start("the PyTorch bench", "bench_train.py", tmp.path(), Stdio::null())?;
    let mut group = criterion.benchmark_group(format!("trainer_step/{}", shape.name));
    for w in workloads {
        if !criterion_selects(&format!("{}/{}", shape.name, w.name)) {
            continue;
        }
        let (theirs, threads) = peer.measure(&w.request(repeats))?;
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
            continue;
        }
        let per_step = median(samples);
        rows.push((
            shape.name,
            w.name,
            w.tokens() as f64 / per_step.as_secs_f64(),
            theirs,
            threads,
        ));
    }
    group.finish();
    Ok(())
}

/// Whether the command line's filter (the first argument that is not a flag, as criterion reads it) keeps
/// the bench `trainer_step/<id>`; the peer is only started for shapes that run.
fn criterion_selects(id: &str) -> bool {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    filter.is_none_or(|f| format!("trainer_step/{id}").contains(&f))
}

fn main() -> Result<()> {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    let mut rows = Vec::new();
    measure_shape(&mut criterion, &shapes::tiny(), &[&B8X256, &B4X512], 5, &mut rows)?;
    // A step at this shape takes seconds: the fewest samples criterion allows, and 3 PyTorch repeats.
    measure_shape(&mut criterion, &shapes::smollm2_135m(), &[&B4X512], 3, &mut rows)?;
    criterion.final_summary();

    println!(
        "\ntrainer_step: one GRPO step, burn (ndarray + the trainer's CPU kernels) against PyTorch on the CPU"
    );
    println!(
        "{:<14}{:<10}{:>14}{:>15}{:>15}{:>10}",
        "shape", "workload", "burn tok/s", "torch tok/s", "torch threads", "ratio"
    );
    for (shape, name, ours, theirs, threads) in rows {
        println!(
            "{shape:<14}{name:<10}{ours:>14.1}{theirs:>15.1}{threads:>15}{:>10.2}",
            ours / theirs
        );
    }
    Ok(())
}
