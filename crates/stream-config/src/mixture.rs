//! The deterministic weighted mixture of Stream rows (spec 2.4).
//!
//! Counts are water-filled without replacement (a stream never contributes more rows than it has); the
//! interleave repeatedly emits the stream minimising `(emitted + 1) / weight`, ties broken by stream name.
//! No randomness: the output depends only on row order, stream order, names and weights.
//!
//! The interleave is a k-way merge: each stream's keys `1/w, 2/w, ...` increase, so picking the smallest
//! head every step is what a binary heap does, comparing the same floats as the reference. Streams of equal
//! weight share their keys round after round, so the heap holds one entry per distinct weight and each pop
//! emits a whole round. It costs O(rows + rounds × log weights) instead of the reference's
//! O(rows × streams).

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

/// Streams of one exact weight. Their keys `(emitted + 1) / weight` are equal in every round, so one round
/// emits every active member, in name order, with a single heap operation.
struct Class {
    weight: f64,
    /// Rows each active member has emitted so far.
    round: usize,
    /// `(name rank, stream)` of the members that still have rows to emit, in rank order.
    members: Vec<(u32, u32)>,
}

impl Class {
    fn key(&self) -> f64 {
        (self.round + 1) as f64 / self.weight
    }
}

/// Calls `emit(stream)` once per output row, in mixture order.
///
/// Equivalent to the reference's loop (pick the smallest `(emitted + 1) / weight`, ties by name): streams are
/// grouped by exact weight, a binary heap orders the groups by their next key, and groups whose keys tie
/// exactly are merged by name.
fn interleave(streams: &[MixtureStream<'_>], counts: &[usize], mut emit: impl FnMut(usize)) {
    let mut by_name: Vec<usize> = (0..streams.len()).collect();
    by_name.sort_by(|&a, &b| streams[a].name.cmp(streams[b].name).then(a.cmp(&b)));
    let mut classes: Vec<Class> = Vec::new();
    for (rank, &i) in by_name.iter().enumerate() {
        if counts[i] == 0 {
            continue;
        }
        let weight = streams[i].weight;
        let member = (rank as u32, i as u32);
        match classes
            .iter_mut()
            .find(|c| c.weight.to_bits() == weight.to_bits())
        {
            Some(c) => c.members.push(member),
            None => classes.push(Class {
                weight,
                round: 0,
                members: vec![member],
            }),
        }
    }
    let mut heap: Vec<(f64, u32)> = classes
        .iter()
        .enumerate()
        .map(|(c, class)| (class.key(), c as u32))
        .collect();
    for i in (0..heap.len() / 2).rev() {
        sift_down(&mut heap, i);
    }
    let mut tied: Vec<u32> = Vec::new();
    let mut batch: Vec<(u32, u32)> = Vec::new();
    while let Some(&(key, first)) = heap.first() {
        let alone = heap.len() < 2 || heap[1].0 != key && heap.get(2).is_none_or(|h| h.0 != key);
        if alone {
            // The common case: one class holds the smallest key; emit its round and re-key it in place.
            let class = &mut classes[first as usize];
            for &(_, s) in &class.members {
                emit(s as usize);
            }
            advance(class, counts);
            if class.members.is_empty() {
                let last = heap.len() - 1;
                heap.swap(0, last);
                heap.pop();
            } else {
                heap[0].0 = class.key();
            }
            sift_down(&mut heap, 0);
            continue;
        }
        // Several classes tie exactly: their members share one key and go out in name order.
        tied.clear();
        while heap.first().is_some_and(|h| h.0 == key) {
            let last = heap.len() - 1;
            heap.swap(0, last);
            if let Some((_, c)) = heap.pop() {
                tied.push(c);
            }
            sift_down(&mut heap, 0);
        }
        batch.clear();
        for &c in &tied {
            batch.extend_from_slice(&classes[c as usize].members);
        }
        batch.sort_unstable();
        for &(_, s) in &batch {
            emit(s as usize);
        }
        for &c in &tied {
            let class = &mut classes[c as usize];
            advance(class, counts);
            if !class.members.is_empty() {
                heap.push((class.key(), c));
                let last = heap.len() - 1;
                sift_up(&mut heap, last);
            }
        }
    }
}

/// Ends a round: every member emitted one row; members that reached their count leave.
fn advance(class: &mut Class, counts: &[usize]) {
    class.round += 1;
    let round = class.round;
    class.members.retain(|&(_, s)| counts[s as usize] > round);
}

/// Restores the heap below `pos` after its key grew: walks the hole down to a leaf along the smaller
/// children (one branch-free comparison per level), then moves the entry back up to its place. A re-keyed
/// stream usually belongs near the bottom, so this does about half the comparisons of a classic sift.
fn sift_down(heap: &mut [(f64, u32)], mut pos: usize) {
    let end = heap.len();
    if pos >= end {
        return;
    }
    let start = pos;
    let entry = heap[pos];
    let mut child = 2 * pos + 1;
    while child + 1 < end {
        child += usize::from(heap[child + 1].0 < heap[child].0);
        heap[pos] = heap[child];
        pos = child;
        child = 2 * pos + 1;
    }
    if child + 1 == end {
        heap[pos] = heap[child];
        pos = child;
    }
    while pos > start {
        let parent = (pos - 1) / 2;
        if entry.0 < heap[parent].0 {
            heap[pos] = heap[parent];
            pos = parent;
        } else {
            break;
        }
    }
    heap[pos] = entry;
}

fn sift_up(heap: &mut [(f64, u32)], mut i: usize) {
    while i > 0 {
        let parent = (i - 1) / 2;
        if heap[i].0 < heap[parent].0 {
            heap.swap(i, parent);
            i = parent;
        } else {
            return;
        }
    }
}

#[cfg(test)]
mod tests;
