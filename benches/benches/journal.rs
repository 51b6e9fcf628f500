//! The rollout journal at agent scale: bytes per token on disk and append throughput with its per-entry
//! fsync, for the compact trajectory form the journal writes against the plain JSON arrays it wrote before
//! (`{"type": "rollout", ...}` with every per-token array spelled out), measured in the same run; and small
//! entries (dynamic sampling's draws) appended with one fsync each against rounds of 8 in one write and one
//! fsync, as the loop writes a draw round.
//!
//! The trajectory is agent-shaped: 32k tokens, half prompt, then turns of 128 sampled tokens and 128 tokens of
//! tool output. Goal: at most 8 bytes per token. After criterion's report the bench prints both sizes and
//! both throughputs, and their ratios.

use std::hint::black_box;
use std::io::Write as _;
use std::time::Instant;

#[path = "common/timing.rs"]
mod timing;
use timing::median;

use arena_rl::journal::{Entry, Journal, RolloutRecord, SampleKey, Verdict};
use criterion::{Criterion, criterion_group};
use rollout_proxy::ExportedTrajectory;

const TOKENS: usize = 32_768;

fn trajectory() -> ExportedTrajectory {
    let prompt = TOKENS / 2;
    let sampled = |i: usize| i >= prompt && (i - prompt) % 256 < 128;
    ExportedTrajectory {
        session_id: "session-0123456789".into(),
        interaction_id: "chatcmpl-0123456789".into(),
        interaction_ids: (0..64).map(|i| format!("chatcmpl-{i:010}")).collect(),
        token_ids: (0..TOKENS)
            .map(|i| (i as u32).wrapping_mul(2_654_435_761) % 151_000)
            .collect(),
        loss_mask: (0..TOKENS).map(|i| u8::from(sampled(i))).collect(),
        logprobs: (0..TOKENS)
            .map(|i| {
                if sampled(i) {
                    -((i % 1000) as f32) / 997.0
                } else {
                    0.0
                }
            })
            .collect(),
        versions: (0..TOKENS).map(|i| if sampled(i) { 41 } else { -1 }).collect(),
        temperatures: vec![1.0; TOKENS],
        top_ps: vec![1.0; TOKENS],
        top_ks: vec![0; TOKENS],
        truncated: vec![0; TOKENS],
        prompt_len: prompt,
        reward: 0.5,
        original_reward: 0.5,
        finish_reason: "stop".into(),
        metadata: serde_json::json!({"task_id": "bench"}),
        integrity_hits: Vec::new(),
    }
}

fn record(n: u32, t: &ExportedTrajectory) -> RolloutRecord {
    RolloutRecord {
        key: SampleKey {
            eval: false,
            step: 0,
            group: n / 8,
            sample: n % 8,
        },
        stream: "bench".into(),
        data_id: format!("row-{n}"),
        task_type: "swe".into(),
        task_id: Some(format!("task-{n}")),
        verdict: Verdict::Reward { reward: 0.5 },
        trajectories: vec![t.clone()],
        policy_version: 41,
        routing: None,
    }
}

/// The line the journal wrote before the compact form: the record with its arrays as JSON.
fn plain_line(r: &RolloutRecord) -> Vec<u8> {
    let mut line = serde_json::to_vec(&serde_json::json!({
        "type": "rollout",
        "key": r.key,
        "stream": r.stream,
        "data_id": r.data_id,
        "task_type": r.task_type,
        "task_id": r.task_id,
        "verdict": r.verdict,
        "trajectories": r.trajectories,
        "policy_version": r.policy_version,
    }))
    .expect("serialises");
    line.push(b'\n');
    line
}

/// Appends `n` records to a fresh compact journal; returns its size.
fn compact_run(dir: &std::path::Path, n: u32, t: &ExportedTrajectory) -> u64 {
    let path = dir.join(format!("compact-{}.jsonl", Instant::now().elapsed().as_nanos()));
    let (journal, _) = Journal::open(&path).expect("opens");
    let before = journal.position().expect("size").1;
    for i in 0..n {
        journal
            .append(&Entry::Rollout(Box::new(record(i, t))))
            .expect("appends");
    }
    let size = journal.position().expect("size").1 - before;
    drop(journal);
    std::fs::remove_file(&path).expect("removes");
    size
}

/// Appends `n` plain lines, each written and fsynced as the journal did; returns the size.
fn plain_run(dir: &std::path::Path, n: u32, t: &ExportedTrajectory) -> u64 {
    let path = dir.join("plain.jsonl");
    let mut file = std::fs::File::create(&path).expect("creates");
    let mut size = 0;
    for i in 0..n {
        let line = plain_line(&record(i, t));
        file.write_all(&line)
            .and_then(|()| file.sync_data())
            .expect("appends");
        size += line.len() as u64;
    }
    drop(file);
    std::fs::remove_file(&path).expect("removes");
    size
}

/// Appends `n` small entries (dynamic sampling's draws) to a fresh journal: one write and fsync each, or in
/// rounds of `batch` with one write and fsync per round (`Journal::append_all`, as a draw round is written).
fn draws_run(dir: &std::path::Path, n: u32, batch: usize) {
    let path = dir.join(format!("draws-{}.jsonl", Instant::now().elapsed().as_nanos()));
    let (journal, _) = Journal::open(&path).expect("opens");
    let draws: Vec<Entry> = (0..n)
        .map(|i| Entry::Draw {
            step: u64::from(i) / 8,
            group: i % 8,
            stream: "bench".into(),
            data_id: format!("row-{i}"),
        })
        .collect();
    for round in draws.chunks(batch) {
        journal.append_all(round).expect("appends");
    }
    drop(journal);
    std::fs::remove_file(&path).expect("removes");
}

fn bench(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = trajectory();
    let mut g = c.benchmark_group("journal_append_32k_tokens");
    g.sample_size(10);
    g.bench_function("compact", |b| {
        b.iter(|| black_box(compact_run(dir.path(), 4, &t)))
    });
    g.bench_function("plain_json", |b| {
        b.iter(|| black_box(plain_run(dir.path(), 4, &t)))
    });
    g.finish();
    let mut g = c.benchmark_group("journal_append_64_draws");
    g.sample_size(10);
    g.bench_function("rounds_of_8_batched", |b| b.iter(|| draws_run(dir.path(), 64, 8)));
    g.bench_function("one_fsync_each", |b| b.iter(|| draws_run(dir.path(), 64, 1)));
    g.finish();
}

fn ratio_report() {
    let dir = tempfile::tempdir().expect("tempdir");
    let t = trajectory();
    let n = 16;
    let compact_bytes = compact_run(dir.path(), n, &t);
    let plain_bytes = plain_run(dir.path(), n, &t);
    let tokens = f64::from(n) * TOKENS as f64;
    let ours = median(5, || {
        black_box(compact_run(dir.path(), n, &t));
    });
    let peer = median(5, || {
        black_box(plain_run(dir.path(), n, &t));
    });
    println!(
        "journal, {n} rollouts of {TOKENS} tokens: bytes per token compact {:.2}, plain JSON {:.2} \
         (ratio {:.1}x); append with fsync compact {:.0} tokens/s, plain {:.0} tokens/s (ratio {:.1}x)",
        compact_bytes as f64 / tokens,
        plain_bytes as f64 / tokens,
        plain_bytes as f64 / compact_bytes as f64,
        tokens / ours.as_secs_f64(),
        tokens / peer.as_secs_f64(),
        peer.as_secs_f64() / ours.as_secs_f64()
    );
    let draws = 64;
    let batched = median(5, || draws_run(dir.path(), draws, 8));
    let single = median(5, || draws_run(dir.path(), draws, 1));
    println!(
        "journal, {draws} draw entries: in rounds of 8 with one fsync each round {:.0} entries/s, one fsync \
         per entry {:.0} entries/s (ratio {:.1}x)",
        f64::from(draws) / batched.as_secs_f64(),
        f64::from(draws) / single.as_secs_f64(),
        single.as_secs_f64() / batched.as_secs_f64()
    );
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|a| a == "--bench") {
        ratio_report();
    }
}
