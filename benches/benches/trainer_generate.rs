//! Generation speed of `trainer`'s policy against transformers on the CPU, same tiny model, same run.
//!
//! Three workloads, greedy and without early stops: decoding at batch 1 and at batch 16 (16-token prompts,
//! 64 new tokens each; generated tokens per second) and prefill (one 512-token prompt and one new token;
//! prompt tokens per second).
//! transformers runs them through `crates/trainer/python/bench_generate.py` in the `ARENA_RL_PY_TORCH` venv
//! (`cargo xtask fixtures` prepares it), workload by workload between burn's measurements; the bench ends
//! with a table of both rates and their ratio (burn over transformers; above 1 means burn is faster).

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
    Architecture, GenerationRequest, ModelConfig, Policy, PolicyOptions, SamplingParams, SaveDtype, Weights,
    save_pretrained,
};

struct Workload {
    name: &'static str,
    batch: usize,
    prompt_len: usize,
    new_tokens: usize,
}

const WORKLOADS: [Workload; 3] = [
    Workload {
        name: "decode_b1",
        batch: 1,
        prompt_len: 16,
        new_tokens: 64,
    },
    Workload {
        name: "decode_b16",
        batch: 16,
        prompt_len: 16,
        new_tokens: 64,
    },
    Workload {
        name: "prefill_512",
        batch: 1,
        prompt_len: 512,
        new_tokens: 1,
    },
];

impl Workload {
    /// The tokens the rate counts: generated ones when decoding, prompt ones for prefill.
    fn tokens(&self) -> usize {
        self.batch
            * if self.new_tokens > 1 {
                self.new_tokens
            } else {
                self.prompt_len
            }
    }

    fn prompts(&self, vocab: usize) -> Vec<Vec<u32>> {
        (0..self.batch)
            .map(|b| {
                (0..self.prompt_len)
                    .map(|t| ((7 * b + 13 * t + 1) % vocab) as u32)
                    .collect()
            })
            .collect()
    }
}

/// The quickstart-sized model: about 4M parameters.
fn config() -> ModelConfig {
    let mut c = ModelConfig::new(Architecture::Llama, 4096, 256, 768, 4, 8, 4);
    c.tie_word_embeddings = true;
    c.max_position_embeddings = 2048;
    c
}

fn generate(policy: &Policy, prompts: &[Vec<u32>], new_tokens: usize) {
    let streams: Vec<_> = prompts
        .iter()
        .map(|p| {
            policy
                .submit(GenerationRequest {
                    input_ids: p.clone(),
                    sampling: SamplingParams::greedy(),
                    stop_token_ids: vec![],
                    max_new_tokens: new_tokens,
                })
                .expect("valid request")
        })
        .collect();
    for s in streams {
        let out = s.collect_blocking().expect("engine alive");
        assert_eq!(out.token_ids.len(), new_tokens);
    }
}

impl Workload {
    /// The peer's request for this workload.
    fn request(&self, repeats: usize) -> serde_json::Value {
        serde_json::json!({"name": self.name, "batch": self.batch, "prompt_len": self.prompt_len,
            "new_tokens": self.new_tokens, "repeats": repeats})
    }
}

fn main() -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let config = config();
    let model = CausalLm::<Cpu>::init(&config, 0.2, 1, &Default::default());
    let weights = Weights::from_model(&model);
    save_pretrained(tmp.path(), &config, &weights, SaveDtype::F32, None)?;
    let policy = Policy::from_weights(config.clone(), &weights, PolicyOptions::default())?;

    let mut peer = TorchPeer::start(
        "the transformers bench",
        "bench_generate.py",
        tmp.path(),
        Stdio::inherit(),
    )?;
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6))
        .configure_from_args();
    let mut group = criterion.benchmark_group("trainer_generate");
    let mut rows = Vec::new();
    for w in &WORKLOADS {
        // transformers first, then burn, workload by workload, so both see the same machine load.
        let (theirs, threads) = peer.measure(&w.request(5))?;
        let prompts = w.prompts(config.vocab_size);
        let samples = Arc::new(Mutex::new(Vec::new()));
        group.throughput(Throughput::Elements(w.tokens() as u64));
        let recorded = samples.clone();
        group.bench_function(w.name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                for _ in 0..iters {
                    generate(&policy, &prompts, w.new_tokens);
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
        let per_run = median(samples);
        rows.push((w.name, w.tokens() as f64 / per_run.as_secs_f64(), theirs, threads));
    }
    group.finish();
    drop(peer);
    criterion.final_summary();

    println!(
        "\ntrainer_generate: burn (ndarray) against transformers on the CPU (torch at its faster thread count)"
    );
    println!(
        "{:<14}{:>14}{:>16}{:>15}{:>10}",
        "workload", "burn tok/s", "torch tok/s", "torch threads", "ratio"
    );
    for (name, ours, theirs, threads) in rows {
        println!(
            "{name:<14}{ours:>14.1}{theirs:>16.1}{threads:>15}{:>10.2}",
            ours / theirs
        );
    }
    Ok(())
}
