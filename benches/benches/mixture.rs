//! The weighted mixture (spec 2.4) at 10 million rows over 50 streams, against the reference's algorithm
//! transliterated naively (a linear scan over every stream for every row), measured in the same run.
//!
//! Goal: well under a second for `mixture_order`, and far faster than the peer. After criterion's report the
//! bench prints the ratio of the two medians from a few extra timed runs.

use std::hint::black_box;

#[path = "common/timing.rs"]
mod timing;
use timing::median;

use criterion::{Criterion, criterion_group};
use stream_config::mixture::{MixtureStream, mixture_order, plan};

const STREAMS: usize = 50;
const ROWS: usize = 10_000_000;

fn names() -> Vec<String> {
    (0..STREAMS)
        .map(|i| format!("stream-{:02}", (i * 17) % STREAMS))
        .collect()
}

/// Uneven streams summing to `ROWS` rows; `weight(i)` gives stream `i` its weight.
fn streams(names: &[String], weight: impl Fn(usize) -> f64) -> Vec<MixtureStream<'_>> {
    let sizes: Vec<usize> = (0..STREAMS).map(|i| 1 + (i * 37) % 11).collect();
    let total: usize = sizes.iter().sum();
    let mut rows: Vec<usize> = sizes.iter().map(|s| ROWS * s / total).collect();
    rows[0] += ROWS - rows.iter().sum::<usize>();
    names
        .iter()
        .zip(rows)
        .enumerate()
        .map(|(i, (name, rows))| MixtureStream {
            name,
            weight: weight(i),
            rows,
        })
        .collect()
}

/// A named way of weighting stream `i`.
type Scenario = (&'static str, fn(usize) -> f64);

/// The two shapes measured: a handful of distinct weights (how configs look: 1:1, 3:1), and 50 distinct
/// weights (the worst case for grouping streams by weight).
fn scenarios() -> [Scenario; 2] {
    [
        ("five_weights", |i| [1.0, 0.5, 2.0, 3.0, 1.5][i % 5]),
        ("distinct_weights", |i| 1.0 + i as f64 * 0.173),
    ]
}

/// The reference's interleave: every step scans all streams for the smallest `(emitted + 1) / weight`,
/// ties by name.
fn naive_order(s: &[MixtureStream<'_>], counts: &[usize]) -> Vec<usize> {
    let target: usize = counts.iter().sum();
    let mut emitted = vec![0usize; s.len()];
    let mut out = Vec::with_capacity(target);
    while out.len() < target {
        let mut best: Option<(f64, &str, usize)> = None;
        for (i, stream) in s.iter().enumerate() {
            if emitted[i] >= counts[i] {
                continue;
            }
            let key = (emitted[i] + 1) as f64 / stream.weight;
            if best.is_none_or(|(k, n, _)| key < k || (key == k && stream.name < n)) {
                best = Some((key, stream.name, i));
            }
        }
        let (_, _, i) = best.expect("a stream with rows left");
        emitted[i] += 1;
        out.push(i);
    }
    out
}

fn bench(c: &mut Criterion) {
    let names = names();
    for (scenario, weight) in scenarios() {
        let s = streams(&names, weight);
        let counts = plan(&s, 0, 1).expect("valid mixture").counts;
        assert_eq!(
            mixture_order(&s, 0, 1).expect("valid mixture"),
            naive_order(&s, &counts),
            "the peer computes the same order"
        );
        let mut group = c.benchmark_group(format!("mixture_10M_rows_50_streams/{scenario}"));
        group.sample_size(10);
        group.bench_function("stream_config", |b| {
            b.iter(|| black_box(mixture_order(black_box(&s), 0, 1).expect("valid mixture")))
        });
        group.bench_function("reference_naive", |b| {
            b.iter(|| black_box(naive_order(black_box(&s), black_box(&counts))))
        });
        group.finish();
    }
}

fn ratio_report() {
    let names = names();
    for (scenario, weight) in scenarios() {
        let s = streams(&names, weight);
        let counts = plan(&s, 0, 1).expect("valid mixture").counts;
        let ours = median(5, || drop(black_box(mixture_order(&s, 0, 1))));
        let peer = median(3, || drop(black_box(naive_order(&s, &counts))));
        println!(
            "mixture/{scenario}, {ROWS} rows x {STREAMS} streams: stream_config {:.1} ms, \
             reference_naive {:.1} ms, ratio (peer / ours) {:.1}x",
            ours.as_secs_f64() * 1e3,
            peer.as_secs_f64() * 1e3,
            peer.as_secs_f64() / ours.as_secs_f64()
        );
    }
}

criterion_group!(benches, bench);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    if std::env::args().any(|a| a == "--bench") {
        ratio_report();
    }
}
