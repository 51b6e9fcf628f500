//! Memory and time of one GRPO step of a SmolLM2-135M-shaped model (30 layers, hidden 576, intermediate
//! 1536, 9 heads / 3 key-value heads, vocabulary 49152, tied embeddings; random weights, nothing downloaded)
//! on the CPU, at agent-like sequence lengths.
//!
//! Cases, all in one run: 2k tokens with the whole computations (one logits chunk, one attention block per
//! sequence: `MemoryConfig::unchunked`), chunked (the defaults), and chunked with layer recompute; then 8k
//! tokens chunked, with and without layer recompute. Each case takes one short warm-up step (which
//! allocates the AdamW moments) and then one measured step; a counting global allocator gives the heap's peak during it
//! (criterion only times), printed next to `trainer::estimate`'s dry-run figure for the same step. The goal:
//! the 8k-token step fits in 8 GiB.
//!
//! Step time is also measured by criterion for the 2k cases (`TRAINER_MEMORY_CRITERION=1`; ten steps per
//! case, so minutes on two cores); the table prints the single measured step's time either way, and each
//! case's ratio to the unchunked 2k step measured in the same run.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use criterion::Criterion;
use trainer::backend::Cpu;
use trainer::estimate::{MemoryEstimate, SMOLLM2_135M};
use trainer::model::CausalLm;
use trainer::{
    MemoryConfig, ModelConfig, RlBatch, TrainConfig, TrainSequence, Trainer, TrainerOptions, Weights,
};

/// The system allocator, counting the bytes live and their peak since the last reset.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(size: usize) {
    let now = LIVE.fetch_add(size, Ordering::Relaxed) + size;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

// SAFETY: every call forwards to `System` with the caller's layout; the counters only observe sizes.
#[expect(unsafe_code, reason = "a global allocator is an unsafe trait")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            grew(layout.size());
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            grew(new_size);
        }
        p
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// SmolLM2-135M's shape, with room for 8k tokens.
fn config() -> ModelConfig {
    let mut c = SMOLLM2_135M.config();
    c.max_position_embeddings = c.max_position_embeddings.max(8192);
    c
}

/// One sequence of `tokens` tokens, the last seven eighths trained, with a positive advantage.
fn batch(tokens: usize, vocab: usize) -> RlBatch {
    RlBatch {
        sequences: vec![TrainSequence {
            tokens: (0..tokens).map(|i| ((i * 7919) % vocab) as u32).collect(),
            loss_mask: (0..tokens).map(|i| i >= tokens / 8).collect(),
            logprobs: vec![-8.3; tokens],
            versions: vec![0; tokens],
            advantage: 1.0,
            truncated: Vec::new(),
            temperatures: Vec::new(),
        }],
        group_sizes: vec![],
        policy_version: 0,
    }
}

struct Case {
    name: &'static str,
    tokens: usize,
    memory: MemoryConfig,
}

fn cases() -> Vec<Case> {
    let chunked = MemoryConfig::default();
    let recompute = MemoryConfig {
        recompute_layers: true,
        ..chunked
    };
    vec![
        Case {
            name: "2k unchunked",
            tokens: 2048,
            memory: MemoryConfig::unchunked(),
        },
        Case {
            name: "2k chunked",
            tokens: 2048,
            memory: chunked,
        },
        Case {
            name: "2k chunked+recompute",
            tokens: 2048,
            memory: recompute,
        },
        Case {
            name: "8k chunked",
            tokens: 8192,
            memory: chunked,
        },
        Case {
            name: "8k chunked+recompute",
            tokens: 8192,
            memory: recompute,
        },
    ]
}

fn gib(bytes: usize) -> f64 {
    bytes as f64 / (1u64 << 30) as f64
}

fn main() -> Result<()> {
    let config = config();
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(&config, 0.02, 1, &Default::default()));
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let with_criterion = std::env::var_os("TRAINER_MEMORY_CRITERION").is_some();
    let warm_up = batch(256, config.vocab_size);
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(1))
        .measurement_time(Duration::from_secs(1))
        .configure_from_args();
    let mut rows = Vec::new();
    for case in cases() {
        if !filter.is_empty() && !filter.iter().any(|f| case.name.contains(f.as_str())) {
            continue;
        }
        let batch = batch(case.tokens, config.vocab_size);
        let mut trainer = Trainer::new(
            config.clone(),
            &weights,
            TrainConfig::default(),
            TrainerOptions::default(),
        )?;
        trainer.set_memory(case.memory)?;
        // A short warm-up step allocates the AdamW moments (all the step keeps between steps) and halves
        // the 8k cases' run time against a full-length one.
        trainer.grpo_step(&warm_up)?;
        let before = LIVE.load(Ordering::Relaxed);
        PEAK.store(before, Ordering::Relaxed);
        let start = Instant::now();
        trainer.grpo_step(&batch)?;
        let seconds = start.elapsed().as_secs_f64();
        let peak = PEAK.load(Ordering::Relaxed);
        println!(
            "{}: step {seconds:.1} s, heap before the step {:.2} GiB, peak during it {:.2} GiB",
            case.name,
            gib(before),
            gib(peak)
        );
        if with_criterion && case.tokens == 2048 {
            criterion.bench_function(&format!("trainer_memory/{}", case.name), |b| {
                b.iter(|| trainer.grpo_step(&batch).expect("valid batch"))
            });
        }
        let estimate = MemoryEstimate::new(SMOLLM2_135M.name, &config, &case.memory);
        let tokens = case.tokens as u64;
        rows.push((
            case.name,
            case.tokens,
            seconds,
            before,
            peak,
            estimate.step_bytes(tokens, case.memory.recompute_layers),
        ));
    }
    if with_criterion {
        criterion.final_summary();
    }
    // Everything that is not the trainer (the host copy of the weights, the batch) is live before each step
    // too; it is counted, as the whole process's heap is what has to fit.
    let base = rows.iter().find(|r| r.0 == "2k unchunked").map(|r| (r.2, r.4));
    println!(
        "\ntrainer_memory: one GRPO step of a SmolLM2-135M-shaped model on the CPU (heap peak by a counting \
         allocator)"
    );
    println!(
        "{:<24}{:>8}{:>10}{:>14}{:>14}{:>14}{:>12}{:>12}",
        "case", "tokens", "step s", "before GiB", "peak GiB", "estimate GiB", "time/2k-u", "peak/2k-u"
    );
    for (name, tokens, seconds, before, peak, estimate) in rows {
        let (t, p) = base.map_or((f64::NAN, f64::NAN), |(bs, bp)| {
            (seconds / bs, peak as f64 / bp as f64)
        });
        println!(
            "{name:<24}{tokens:>8}{seconds:>10.1}{:>14.2}{:>14.2}{:>14.2}{t:>12.2}{p:>12.2}",
            gib(before),
            gib(peak),
            gib(estimate as usize)
        );
    }
    Ok(())
}
