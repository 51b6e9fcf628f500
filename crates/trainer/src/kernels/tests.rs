//! Unit tests for the generic kernels: attention over the cache stays within one block of scores, measured
//! with a counting allocator, and agrees with the unblocked computation.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::Tensor;

use super::*;
use crate::sampling::SplitMix64;

/// The system allocator, noting the largest single allocation made by a thread that measures.
struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
}

fn note(size: usize) {
    if MEASURING.try_with(Cell::get).unwrap_or(false) {
        LARGEST.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every call is forwarded to the system allocator unchanged; only sizes are noted.
#[expect(unsafe_code, reason = "a global allocator that counts what it forwards")]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract is the system allocator's.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: as above.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The result of `f` and the largest allocation it made, on a one-thread pool so that every allocation of
/// burn's parallel operations happens on the measuring thread.
fn largest_allocation<T: Send>(f: impl FnOnce() -> T + Send) -> (T, usize) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .expect("a one-thread pool starts");
    pool.install(|| {
        LARGEST.store(0, Ordering::Relaxed);
        MEASURING.set(true);
        let out = f();
        MEASURING.set(false);
        (out, LARGEST.load(Ordering::Relaxed))
    })
}

/// The generic kernels, which CUDA runs, on the CPU.
type Generic = burn_ndarray::NdArray<f64>;

fn random<const D: usize>(shape: [usize; D], rng: &mut SplitMix64) -> Tensor<Generic, D> {
    let data: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|_| rng.next_normal() as f32)
        .collect();
    host_tensor(data, shape, &Default::default())
}

#[test]
fn generic_cached_attention_holds_one_block_of_scores() {
    let mut rng = SplitMix64::new(21);
    let (batch, heads, kv_heads, len, d, rows) = (1, 4, 2, 1024, 8, 64);
    let q = random([batch, heads, len, d], &mut rng);
    let k = random([batch, kv_heads, len + 7, d], &mut rng);
    let v = random([batch, kv_heads, len + 7, d], &mut rng);
    // A causal prefill into the cache's first `len` columns, its spans built inside the measurement: what
    // says which keys a query sees takes memory linear in the queries too.
    let causal = || {
        let spans = (0..len as u32).map(|t| [0, t + 1]).collect();
        KeySpans::<Generic>::new(spans, [batch, len, len], &Default::default())
    };
    let element = std::mem::size_of::<f64>();
    let chunk = batch * heads * rows * len * element;
    let whole = batch * heads * len * len * element;
    assert!(
        whole >= 10 * chunk,
        "the prompt is long enough to tell them apart"
    );
    let (blocked, largest) = largest_allocation(|| {
        burn_cached_attention_in_blocks(q.clone(), k.clone(), v.clone(), &causal(), 0.3, rows)
    });
    assert!(
        largest <= chunk,
        "largest allocation {largest} bytes, one block of scores is {chunk}"
    );
    // The measurement sees the whole score matrix when there is one.
    let (dense, largest) = largest_allocation(|| {
        burn_cached_attention_in_blocks(q.clone(), k.clone(), v.clone(), &causal(), 0.3, len)
    });
    assert!(
        largest >= whole,
        "one block of every row allocates {largest} bytes, expected {whole}"
    );
    let (a, b) = (
        blocked.into_data().to_vec::<f64>().expect("f64"),
        dense.into_data().to_vec::<f64>().expect("f64"),
    );
    let worst = a.iter().zip(&b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max);
    assert!(worst < 1e-12, "blocked and whole attention differ by {worst}");
}

#[test]
fn query_blocks_fit_the_score_budget() {
    for (batch, heads, len, keys) in [(1, 32, 20_000, 20_000), (64, 32, 1, 4_000), (1, 4, 10, 10)] {
        let rows = cached_query_rows(batch, heads, len, keys);
        assert!((1..=len).contains(&rows), "{rows} rows for {len}");
        assert!(rows == 1 || batch * heads * rows * keys <= SCORE_BUDGET);
    }
    // A decode step is one block; a 20k-token prefill of an 8B model's 32 heads is many.
    assert_eq!(cached_query_rows(64, 32, 1, 4_000), 1);
    assert_eq!(cached_query_rows(1, 32, 20_000, 20_000), 104);
}
