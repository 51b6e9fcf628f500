//! The deterministic weighted mixture of Stream rows (spec 2.4).
//!
//! Counts are water-filled without replacement (a stream never contributes more rows than it has); the
//! interleave repeatedly emits the stream minimising `(emitted + 1) / weight`, ties broken by stream name.
//! No randomness: the output depends only on row order, stream order, names and weights.
//!
//! The interleave is a k-way merge: each stream's keys `1/w, 2/w, ...` increase, so picking the smallest
//! head every step is what a binary heap over the streams does, comparing the same floats as the reference.
//! It costs O(rows × log streams) instead of the reference's O(rows × streams).

use std::cmp::Ordering;

use crate::error::{Error, Result};
use crate::stream::StreamConfig;

/// One stream as the mixture sees it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixtureStream<'a> {
    /// Stream name: ties are broken by ascending name.
    pub name: &'a str,
    /// Relative weight (finite, > 0).
    pub weight: f64,
    /// How many rows the stream has.
    pub rows: usize,
}

/// How many rows each stream contributes and in which order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MixturePlan {
    /// Rows taken from each stream (its first `counts[i]` rows, in API order), in stream order.
    pub counts: Vec<usize>,
    /// Output size: the sum of `counts`.
    pub target: usize,
}

impl MixturePlan {
    /// Rows that a `drop_last` loader with this batch size leaves out of the last epoch (the reference logs
    /// "drop_last will omit N tail rows").
    pub fn tail_rows(&self, batch_size: usize) -> usize {
        if batch_size == 0 {
            0
        } else {
            self.target % batch_size
        }
    }
}

/// Mixes the rows of `streams` (rows in API order, one `Vec` per stream, in the same order as `streams`).
///
/// `epoch_size` 0 takes every row once (never padded to `size_multiple`); a positive `epoch_size` must not
/// exceed the number of rows and must be divisible by `size_multiple` (the training batch size).
pub fn build_weighted_rows<R>(
    streams: &[StreamConfig],
    rows: Vec<Vec<R>>,
    epoch_size: i64,
    size_multiple: usize,
) -> Result<Vec<R>> {
    if rows.len() != streams.len() {
        return Err(Error::Invalid(format!(
            "the mixture got rows for {} streams but {} streams are configured",
            rows.len(),
            streams.len()
        )));
    }
    let inputs: Vec<MixtureStream<'_>> = streams
        .iter()
        .zip(&rows)
        .map(|(s, r)| MixtureStream {
            name: &s.name,
            weight: s.sampling_weight,
            rows: r.len(),
        })
        .collect();
    let plan = plan(&inputs, epoch_size, size_multiple)?;
    let mut sources: Vec<std::vec::IntoIter<R>> = rows.into_iter().map(Vec::into_iter).collect();
    let mut out = Vec::with_capacity(plan.target);
    interleave(&inputs, &plan.counts, |i| {
        if let Some(row) = sources[i].next() {
            out.push(row);
        }
    });
    Ok(out)
}

/// The stream index of every output position, in order (what [`build_weighted_rows`] emits).
pub fn mixture_order(
    streams: &[MixtureStream<'_>],
    epoch_size: i64,
    size_multiple: usize,
) -> Result<Vec<usize>> {
    let plan = plan(streams, epoch_size, size_multiple)?;
    let mut order = Vec::with_capacity(plan.target);
    interleave(streams, &plan.counts, |i| order.push(i));
    Ok(order)
}

/// Checks the inputs and computes the per-stream counts (spec 2.4 steps 1-5).
pub fn plan(streams: &[MixtureStream<'_>], epoch_size: i64, size_multiple: usize) -> Result<MixturePlan> {
    if epoch_size < 0 {
        return Err(Error::Invalid(format!(
            "arena_mixture_epoch_size must be >= 0, got {epoch_size}"
        )));
    }
    if size_multiple == 0 {
        return Err(Error::Invalid(
            "the mixture size multiple (training batch size) must be a positive integer, got 0".into(),
        ));
    }
    if streams.is_empty() {
        return Err(Error::Invalid(
            "the mixture needs at least one Arena Stream".into(),
        ));
    }
    for s in streams {
        if s.rows == 0 {
            return Err(Error::Invalid(format!(
                "Arena Stream {:?} contains no dataset rows",
                s.name
            )));
        }
        if !(s.weight.is_finite() && s.weight > 0.0) {
            return Err(Error::Invalid(format!(
                "Arena Stream {:?}: sampling_weight must be finite and positive, got {}",
                s.name, s.weight
            )));
        }
    }
    let masses: Vec<f64> = streams.iter().map(|s| s.rows as f64 * s.weight).collect();
    let total_mass: f64 = masses.iter().sum();
    if let Some(bad) = masses.iter().position(|m| !(m.is_finite() && *m > 0.0)) {
        return Err(Error::Invalid(format!(
            "Arena Stream weights overflowed the mixture mass: stream {:?} has {} rows x weight {}",
            streams[bad].name, streams[bad].rows, streams[bad].weight
        )));
    }
    if !(total_mass.is_finite() && total_mass > 0.0) {
        return Err(Error::Invalid(format!(
            "Arena Stream weights overflowed the mixture mass: the total of rows x weight over {} streams is {total_mass}",
            streams.len()
        )));
    }
    let capacities: Vec<usize> = streams.iter().map(|s| s.rows).collect();
    let total: usize = capacities.iter().sum();
    let target = if epoch_size == 0 {
        total
    } else {
        let epoch = usize::try_from(epoch_size).unwrap_or(usize::MAX);
        if epoch > total {
            return Err(Error::Invalid(format!(
                "arena_mixture_epoch_size={epoch_size} cannot exceed the {total} unique source rows"
            )));
        }
        if epoch % size_multiple != 0 {
            return Err(Error::Invalid(format!(
                "arena_mixture_epoch_size={epoch_size} must be divisible by the training batch size {size_multiple}"
            )));
        }
        epoch
    };
    let counts = if target == total {
        capacities
    } else {
        water_fill(streams, &masses, target)?
    };
    Ok(MixturePlan { counts, target })
}

/// Proportional counts without replacement: streams whose share reaches their capacity are capped and the
/// rest is shared again; the final shares are floored and the remainder goes one row each by descending
/// fractional part, ties by ascending name.
fn water_fill(streams: &[MixtureStream<'_>], masses: &[f64], target: usize) -> Result<Vec<usize>> {
    let mut counts = vec![0usize; streams.len()];
    let mut active: Vec<usize> = (0..streams.len()).collect();
    let mut remaining = target;
    loop {
        let active_mass: f64 = active.iter().map(|&i| masses[i]).sum();
        let (capped, kept): (Vec<usize>, Vec<usize>) = active
            .iter()
            .partition(|&&i| remaining as f64 * masses[i] / active_mass >= streams[i].rows as f64);
        if capped.is_empty() {
            break;
        }
        for &i in &capped {
            counts[i] = streams[i].rows;
            remaining = remaining.saturating_sub(streams[i].rows);
        }
        active = kept;
        if active.is_empty() {
            break;
        }
    }
    if !active.is_empty() {
        let active_mass: f64 = active.iter().map(|&i| masses[i]).sum();
        let mut fractions = Vec::with_capacity(active.len());
        for &i in &active {
            let exact = remaining as f64 * masses[i] / active_mass;
            let floor = exact.floor();
            counts[i] = floor as usize;
            fractions.push((exact - floor, i));
        }
        let assigned: usize = counts.iter().sum();
        let extra = target.saturating_sub(assigned);
        fractions.sort_by(|a, b| {
            b.0.partial_cmp(&a.0)
                .unwrap_or(Ordering::Equal)
                .then_with(|| streams[a.1].name.cmp(streams[b.1].name))
        });
        for &(_, i) in fractions.iter().take(extra) {
            counts[i] += 1;
        }
    }
    let sum: usize = counts.iter().sum();
    if sum != target || counts.iter().zip(streams).any(|(c, s)| *c > s.rows) {
        return Err(Error::Invalid(format!(
            "the mixture could not split {target} rows over the streams' capacities (got {sum}); check the weights"
        )));
    }
    Ok(counts)
}

/// A heap entry: the stream's next key `(emitted + 1) / weight`, then its name rank.
#[derive(Clone, Copy)]
struct Head {
    key: f64,
    rank: u32,
    stream: u32,
}

impl Head {
    fn before(&self, other: &Head) -> bool {
        match self.key.partial_cmp(&other.key) {
            Some(Ordering::Less) => true,
            Some(Ordering::Greater) => false,
            _ => self.rank < other.rank,
        }
    }
}

/// Calls `emit(stream)` once per output row, in mixture order.
fn interleave(streams: &[MixtureStream<'_>], counts: &[usize], mut emit: impl FnMut(usize)) {
    let mut by_name: Vec<usize> = (0..streams.len()).collect();
    by_name.sort_by(|&a, &b| streams[a].name.cmp(streams[b].name).then(a.cmp(&b)));
    let mut rank = vec![0u32; streams.len()];
    for (r, &i) in by_name.iter().enumerate() {
        rank[i] = r as u32;
    }
    let mut emitted = vec![0usize; streams.len()];
    let mut heap: Vec<Head> = (0..streams.len())
        .filter(|&i| counts[i] > 0)
        .map(|i| Head {
            key: 1.0 / streams[i].weight,
            rank: rank[i],
            stream: i as u32,
        })
        .collect();
    for i in (0..heap.len() / 2).rev() {
        sift_down(&mut heap, i);
    }
    while let Some(top) = heap.first().copied() {
        let i = top.stream as usize;
        emit(i);
        emitted[i] += 1;
        if emitted[i] < counts[i] {
            heap[0].key = (emitted[i] + 1) as f64 / streams[i].weight;
        } else {
            let last = heap.len() - 1;
            heap.swap(0, last);
            heap.pop();
        }
        sift_down(&mut heap, 0);
    }
}

fn sift_down(heap: &mut [Head], mut i: usize) {
    let n = heap.len();
    loop {
        let left = 2 * i + 1;
        if left >= n {
            return;
        }
        let right = left + 1;
        let child = if right < n && heap[right].before(&heap[left]) {
            right
        } else {
            left
        };
        if heap[child].before(&heap[i]) {
            heap.swap(child, i);
            i = child;
        } else {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
