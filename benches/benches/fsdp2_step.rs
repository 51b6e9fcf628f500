//! One GRPO step of the FSDP2 worker through the `arena-rl-trainer/1` protocol (the Rust client writing the
//! batch file and driving rank 0 over HTTP, as `actor.backend: fsdp2` does) against the worker's own step
//! function called in process with no server (`python -m arena_rl_fsdp2.inprocess`), same run, same model,
//! same batch, on the CPU (issue 29's acceptance bench).
//!
//! The model is SmolLM2-135M's shape (`common/shapes.rs`): the real weights when `ARENA_RL_SMOLLM2` names a
//! folder that holds them, random ones otherwise. The batch is built like `trainer_step`'s, smaller: 2
//! sequences of 256 tokens, the last three quarters trained (a step of 4 x 512 took 131 s on 2 shared cores
//! at a load average of 11, and criterion takes at least 11 of them). Both sides run under
//! `torch.distributed.run --standalone --nproc-per-node 1` in the `ARENA_RL_PY_TORCH` venv (`cargo xtask
//! fixtures`), one after the other, never at once: the in-process steps first, then the worker started by
//! [`fsdp2_trainer::Worker::launch`] and measured by criterion.
//!
//! The table at the end gives both medians per step, the ratio (in process over protocol: 1 means the
//! protocol costs nothing, the goal is at least 0.9), the milliseconds the protocol adds, and its bytes: the
//! batch file the client writes and rank 0 reads each step, and rank 0's peak resident memory against the
//! in-process rank's. A second figure of the added time needs no second run: the client's wall time of a
//! step less the worker's own engine time for it (`stats.seconds`, measured as the in-process side measures
//! it). `cargo bench -p benches --bench fsdp2_step`; `FSDP2_STEP_INPROCESS_STEPS` (default 6) sets the
//! in-process steps, of which the first is dropped as warm-up.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

#[path = "common/shapes.rs"]
#[expect(dead_code, reason = "only SmolLM2-135M's shape is measured here")]
mod shapes;
#[path = "common/summary.rs"]
mod summary;
use criterion::{Criterion, SamplingMode, Throughput};
use fsdp2_trainer::protocol::{Dtype, InitRequest};
use fsdp2_trainer::{Batch, LaunchConfig, Sequence, StepKind, Worker};
use serde_json::json;
use trainer::backend::Cpu;
use trainer::model::CausalLm;
use trainer::{SaveDtype, TrainConfig, Weights, save_pretrained};

const SEQUENCES: usize = 2;
const SEQ_LEN: usize = 256;
const PROMPT_LEN: usize = 64;

fn python() -> Result<String> {
    std::env::var("ARENA_RL_PY_TORCH")
        .context("ARENA_RL_PY_TORCH is not set: run `eval \"$(cargo xtask fixtures)\"` before this bench")
}

/// The worker's package folder, put on `PYTHONPATH`.
fn worker_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/fsdp2-trainer/worker")
}

/// The environment of both sides: the worker's package, the CPU, quiet transformers.
fn worker_env() -> Vec<(String, String)> {
    vec![
        ("PYTHONPATH".into(), worker_dir().display().to_string()),
        ("ARENA_RL_TRAINER_DEVICE".into(), "cpu".into()),
        ("TRANSFORMERS_VERBOSITY".into(), "error".into()),
    ]
}

/// The model folder: SmolLM2-135M's own weights when the fixture has them, else its shape with random
/// weights written into `tmp`. Returns the folder and what it is.
fn model_folder(tmp: &Path) -> Result<(PathBuf, &'static str)> {
    if let Some(dir) = std::env::var_os("ARENA_RL_SMOLLM2").map(PathBuf::from)
        && (dir.join("model.safetensors").is_file() || dir.join("model.safetensors.index.json").is_file())
    {
        return Ok((dir, "SmolLM2-135M weights (ARENA_RL_SMOLLM2)"));
    }
    let shape = shapes::smollm2_135m();
    let weights = Weights::from_model(&CausalLm::<Cpu>::init(
        &shape.config,
        0.02,
        1,
        &Default::default(),
    ));
    let dir = tmp.join("model");
    save_pretrained(&dir, &shape.config, &weights, SaveDtype::F32, None)?;
    Ok((dir, "SmolLM2-135M shape, random weights"))
}

/// `trainer_step`'s batch at this shape, as the protocol's batch file for step `step`.
fn batch(step: u64, vocab: usize) -> Batch {
    let trained = (SEQ_LEN - PROMPT_LEN) as f32;
    let sequences = (0..SEQUENCES)
        .map(|s| Sequence {
            tokens: (0..SEQ_LEN)
                .map(|i| (((s * SEQ_LEN + i) * 7919) % vocab) as u32)
                .collect(),
            loss_mask: (0..SEQ_LEN).map(|i| i >= PROMPT_LEN).collect(),
            logprobs: vec![-8.3; SEQ_LEN],
            versions: vec![0; SEQ_LEN],
            temperatures: vec![1.0; SEQ_LEN],
            truncated: vec![false; SEQ_LEN],
            advantage: if s % 2 == 0 { 1.0 } else { -1.0 },
            // Token-mean over the batch.
            weight: 1.0 / (SEQUENCES as f32 * trained),
        })
        .collect();
    Batch {
        kind: StepKind::Grpo,
        step,
        policy_version: step,
        sequences,
        group_sizes: vec![SEQUENCES as u64],
    }
}

fn init_request(model: &Path) -> Result<InitRequest> {
    let mut train = TrainConfig::default();
    // A schedule long enough that every measured step runs at the same rate.
    train.schedule.total_steps = 10_000;
    Ok(InitRequest {
        protocol: fsdp2_trainer::PROTOCOL,
        model_path: model.to_path_buf(),
        train: serde_json::to_value(&train)?,
        total_steps: train.schedule.total_steps,
        param_dtype: Dtype::F32,
        reduce_dtype: Dtype::F32,
        activation_checkpointing: false,
        logprob_chunk_tokens: 1024,
        seed: 1,
    })
}

/// What the in-process side measured: per-step seconds (warm-up dropped) and its rank's peak RSS.
struct InProcess {
    seconds: Vec<f64>,
    max_rss: u64,
}

fn in_process(
    model: &Path,
    init: &InitRequest,
    batch_file: &Path,
    dir: &Path,
    steps: usize,
) -> Result<InProcess> {
    let init_path = dir.join("init.json");
    std::fs::write(&init_path, serde_json::to_vec(init)?)?;
    let out_path = dir.join("inprocess.json");
    let output = Command::new(python()?)
        .args(["-m", "torch.distributed.run", "--standalone", "--nnodes", "1"])
        .args(["--nproc-per-node=1", "-m", "arena_rl_fsdp2.inprocess", "--model"])
        .arg(model)
        .arg("--init")
        .arg(&init_path)
        .arg("--batch")
        .arg(batch_file)
        .args(["--repeat", &steps.to_string(), "--out"])
        .arg(&out_path)
        .envs(worker_env())
        .output()
        .context("starting the in-process step")?;
    if !output.status.success() {
        bail!(
            "the in-process step failed ({}):\n{}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let out: serde_json::Value = serde_json::from_slice(&std::fs::read(&out_path)?)?;
    let seconds: Vec<f64> = out["steps"]
        .as_array()
        .context("steps")?
        .iter()
        .skip(1)
        .filter_map(|s| s["seconds"].as_f64())
        .collect();
    if seconds.is_empty() {
        bail!("the in-process step gave no timed step past the first: {out}");
    }
    Ok(InProcess {
        seconds,
        max_rss: out["max_rss_bytes"].as_u64().unwrap_or(0),
    })
}

/// The peak resident memory (`VmHWM`) of the rank-0 process under torchrun `leader`.
fn rank0_peak_rss(leader: u32) -> Option<u64> {
    let children = std::fs::read_to_string(format!("/proc/{leader}/task/{leader}/children")).ok()?;
    children.split_whitespace().find_map(|pid| {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kb * 1024)
    })
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> Result<()> {
    let mut criterion = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10))
        .configure_from_args();
    let tmp = tempfile::tempdir()?;
    let (model, what) = model_folder(tmp.path())?;
    let vocab = shapes::smollm2_135m().config.vocab_size;
    let init = init_request(&model)?;
    let run_dir = tmp.path().join("run");
    std::fs::create_dir_all(&run_dir)?;
    let run_dir = run_dir.canonicalize()?;

    // The in-process side first, on a batch file the same client code wrote.
    let batch_file = tmp.path().join("batch.safetensors");
    batch(0, vocab).write(&batch_file)?;
    let file_bytes = std::fs::metadata(&batch_file)?.len();
    let steps = std::env::var("FSDP2_STEP_INPROCESS_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6usize);
    let ours = in_process(&model, &init, &batch_file, tmp.path(), steps)?;

    // Then the protocol: a worker of its own, one step per criterion iteration.
    let mut config = LaunchConfig::python(python()?, 1, &run_dir);
    config.env = worker_env();
    config.ready_timeout = Duration::from_secs(300);
    let mut worker = Worker::launch(&config, fsdp2_trainer::api_key(None)).context("starting the worker")?;
    worker.init(&init).context("init")?;
    let next = Arc::new(Mutex::new(0u64));
    let walls = Arc::new(Mutex::new(Vec::<(f64, f64)>::new()));
    let mut group = criterion.benchmark_group("fsdp2_step/smollm2-135m");
    group.sampling_mode(SamplingMode::Flat);
    group.throughput(Throughput::Elements((SEQUENCES * SEQ_LEN) as u64));
    let failure: Arc<Mutex<Option<String>>> = Arc::default();
    {
        let (next, walls, failure) = (next.clone(), walls.clone(), failure.clone());
        let worker = &mut worker;
        group.bench_function("protocol_b2x256", |b| {
            b.iter_custom(|iters| {
                let mut total = Duration::ZERO;
                for _ in 0..iters {
                    let mut step = next.lock().expect("not poisoned");
                    let file = batch(*step, vocab);
                    let path = run_dir.join(format!("trainer/batches/step-{step}.safetensors"));
                    let start = Instant::now();
                    match worker.step(&file, &path) {
                        Ok(r) => {
                            let wall = start.elapsed();
                            total += wall;
                            walls
                                .lock()
                                .expect("not poisoned")
                                .push((wall.as_secs_f64(), r.stats.seconds));
                            *step = r.step;
                        }
                        Err(e) => {
                            failure.lock().expect("not poisoned").get_or_insert(e.to_string());
                            total += start.elapsed();
                        }
                    }
                    let _ = std::fs::remove_file(&path);
                }
                total
            })
        });
    }
    group.finish();
    let theirs_rss = rank0_peak_rss(worker.pid()).unwrap_or(0);
    drop(worker);
    criterion.final_summary();
    if let Some(e) = failure.lock().expect("not poisoned").take() {
        bail!("a protocol step failed: {e}");
    }
    let walls = walls.lock().expect("not poisoned").clone();
    if walls.is_empty() {
        bail!("criterion ran no protocol step");
    }
    // The first protocol step is warm-up, as the in-process side's is (unless it is the only one, as under
    // `--test`).
    let skip = usize::from(walls.len() > 1);
    let protocol = median(walls.iter().skip(skip).map(|w| w.0).collect());
    let inside = median(walls.iter().skip(skip).map(|w| w.1).collect());
    let added_within = median(walls.iter().skip(skip).map(|w| w.0 - w.1).collect());
    let in_process = median(ours.seconds.clone());
    let ratio = in_process / protocol;
    let mb = |b: u64| b as f64 / 1e6;
    println!(
        "\nfsdp2_step: one GRPO step at SmolLM2-135M's shape ({what}), {SEQUENCES}x{SEQ_LEN} tokens, CPU, world size 1"
    );
    println!("{:<34}{:>12}{:>8}", "", "ms/step", "steps");
    println!(
        "{:<34}{:>12.1}{:>8}",
        "in process (no server)",
        in_process * 1e3,
        ours.seconds.len()
    );
    println!(
        "{:<34}{:>12.1}{:>8}",
        "through the protocol (client)",
        protocol * 1e3,
        walls.len() - skip
    );
    println!(
        "{:<34}{:>12.1}{:>8}",
        "  of which the worker's engine",
        inside * 1e3,
        walls.len() - skip
    );
    println!("ratio (in process / protocol): {ratio:.3} (goal >= 0.9)");
    println!(
        "protocol adds per step: {:+.1} ms against the in-process run, {:.1} ms client wall less the worker's engine time",
        (protocol - in_process) * 1e3,
        added_within * 1e3
    );
    println!(
        "protocol bytes per step: batch file {:.2} MB written by the client and read by rank 0; rank 0 peak RSS {:.1} MB against {:.1} MB in process ({:+.1} MB)",
        mb(file_bytes),
        mb(theirs_rss),
        mb(ours.max_rss),
        mb(theirs_rss) - mb(ours.max_rss)
    );
    let report = json!({
        "model": what,
        "tokens_per_step": SEQUENCES * SEQ_LEN,
        "in_process_ms": in_process * 1e3,
        "protocol_ms": protocol * 1e3,
        "protocol_engine_ms": inside * 1e3,
        "ratio": ratio,
        "added_ms": (protocol - in_process) * 1e3,
        "added_ms_within_protocol_steps": added_within * 1e3,
        "batch_file_mb": mb(file_bytes),
        "rank0_peak_rss_mb": mb(theirs_rss),
        "in_process_peak_rss_mb": mb(ours.max_rss),
        "in_process_steps": ours.seconds.len(),
        "protocol_steps": walls.len() - skip,
    });
    summary::write_summary(report.as_object().cloned().unwrap_or_default(), "fsdp2_step.json");
    Ok(())
}
