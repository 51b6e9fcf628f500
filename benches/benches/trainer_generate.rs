//! Generation speed of `trainer`'s policy against transformers on the CPU, same model, same run.
//!
//! Three workloads, greedy and without early stops: decoding at batch 1 and at batch 16 (16-token prompts,
//! 64 new tokens each; generated tokens per second) and prefill (one 512-token prompt and one new token;
//! prompt tokens per second), at two shapes (`common/shapes.rs`): the quickstart's tiny model and
//! SmolLM2-135M's. `cargo bench --bench trainer_generate -- smollm2` runs the large shape alone.
//! transformers runs them through `crates/trainer/python/bench_generate.py` in the `ARENA_RL_PY_TORCH` venv
//! (`cargo xtask fixtures` prepares it), workload by workload between burn's measurements; the bench ends
//! with a table of both rates and their ratio (burn over transformers; above 1 means burn is faster).

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
    GenerationRequest, Policy, PolicyOptions, SamplingParams, SaveDtype, Weights, save_pretrained,
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

/// One row of the table: shape, workload, burn's rate, transformers' rate and torch's thread count.
type Row = (&'static str, &'static str, f64, f64, u64);

/// Measures every workload on `shape`: transformers first, then burn, workload by workload, so both see the
/// same machine load; `repeats` timed transformers runs per thread count.
fn measure_shape(
    criterion: &mut Criterion,
    shape: &shapes::Shape,
    repeats: usize,
    rows: &mut Vec<Row>,
) -> Result<()> {
    let selected = |w: &Workload| criterion_selects(&format!("{}/{}", shape.name, w.name));
    if !WORKLOADS.iter().any(selected) {
        return Ok(());
    }
    let tmp = tempfile::tempdir()?;
    let config = &shape.config;
    let model = CausalLm::<Cpu>::init(config, 0.2, 1, &Default::default());
    let weights = Weights::from_model(&model);
    drop(model);
    save_pretrained(tmp.path(), config, &weights, SaveDtype::F32, None)?;
    let policy = Policy::from_weights(config.clone(), &weights, PolicyOptions::default())?;
    drop(weights);
    let mut peer = TorchPeer::start(
        "the transformers bench",
        "bench_generate.py",
        tmp.path(),
        Stdio::inherit(),
    )?;
    let mut group = criterion.benchmark_group(format!("trainer_generate/{}", shape.name));
    for w in WORKLOADS.iter().filter(|w| selected(w)) {
        let (theirs, threads) = peer.measure(&w.request(repeats))?;
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
            continue;
        }
        let per_run = median(samples);
        rows.push((
            shape.name,
            w.name,
            w.tokens() as f64 / per_run.as_secs_f64(),
            theirs,
            threads,
        ));
    }
    group.finish();
    Ok(())
}

/// Whether the command line's filter (the first argument that is not a flag, as criterion reads it) keeps
/// the bench `trainer_generate/<id>`; a shape none of whose workloads runs is not even built.
fn criterion_selects(id: &str) -> bool {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    filter.is_none_or(|f| format!("trainer_generate/{id}").contains(&f))
}

fn main() -> Result<()> {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6))
        .configure_from_args();
    let mut rows = Vec::new();
    measure_shape(&mut criterion, &shapes::tiny(), 5, &mut rows)?;
    measure_shape(&mut criterion, &shapes::smollm2_135m(), 3, &mut rows)?;
    criterion.final_summary();

    println!(
        "\ntrainer_generate: burn (ndarray) against transformers on the CPU (torch at its faster thread count)"
    );
    println!(
        "{:<14}{:<14}{:>14}{:>16}{:>15}{:>10}",
        "shape", "workload", "burn tok/s", "torch tok/s", "torch threads", "ratio"
    );
    for (shape, name, ours, theirs, threads) in rows {
        println!(
            "{shape:<14}{name:<14}{ours:>14.1}{theirs:>16.1}{threads:>15}{:>10.2}",
            ours / theirs
        );
    }
    Ok(())
}
