//! Micro-batches: sequences packed into one row of at most `max_tokens_per_mb` tokens (first-fit
//! decreasing, as the reference allocates them), each keeping its own positions and attending only to itself.
//!
//! A sequence is cut after its last trained token (later tokens cannot influence the loss of a causal model),
//! and sequences with no trained token are left out. Within a row, sequences are ordered longest first, so
//! equal lengths sit next to each other and their attention runs as one batched product.
//!
//! Each trained token carries the inverse of the temperature it is scored at: the one it was sampled at,
//! so a row can hold tokens of several temperatures (sequences sampled apart, or turns of one trajectory).

/// One sequence's place in a packed row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Index of the sequence in the batch.
    pub(crate) seq: usize,
    /// First row of the segment in the packed row.
    pub(crate) start: usize,
    /// Tokens of the segment (the sequence up to its last trained token).
    pub(crate) len: usize,
}

/// A run of adjacent segments of the same length: `count` segments of `len` tokens from row `start`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SegmentRun {
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) count: usize,
}

/// The host side of one forward pass.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Packed {
    /// Token ids of the packed row.
    pub(crate) tokens: Vec<i64>,
    /// Position of each row inside its own sequence.
    pub(crate) positions: Vec<usize>,
    /// The segments, in row order.
    pub(crate) segments: Vec<Segment>,
    /// Runs of equal-length segments, covering the row.
    pub(crate) runs: Vec<SegmentRun>,
    /// For each trained token: the row whose output predicts it.
    pub(crate) rows: Vec<i64>,
    /// For each trained token: its id.
    pub(crate) targets: Vec<i64>,
    /// For each trained token: `(sequence, position)` in the batch.
    pub(crate) origin: Vec<(usize, usize)>,
    /// For each trained token: `1 / temperature` of the distribution it is scored under.
    pub(crate) inv_temperatures: Vec<f32>,
}

impl Packed {
    /// Number of trained tokens.
    pub(crate) fn trained(&self) -> usize {
        self.targets.len()
    }
}

/// The length a sequence contributes: up to and including its last trained token; 0 when nothing is trained.
pub(crate) fn effective_len(mask: &[bool]) -> usize {
    mask.iter().rposition(|&m| m).map_or(0, |last| last + 1)
}

/// Assigns sequences (by effective length; zero-length ones are skipped) to micro-batches of at most
/// `max_tokens` tokens, first-fit decreasing; each micro-batch lists its sequences longest first.
pub(crate) fn plan(lengths: &[usize], max_tokens: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = (0..lengths.len()).filter(|&i| lengths[i] > 0).collect();
    order.sort_by(|&a, &b| lengths[b].cmp(&lengths[a]).then(a.cmp(&b)));
    let mut bins: Vec<(usize, Vec<usize>)> = Vec::new();
    for i in order {
        let len = lengths[i];
        match bins.iter_mut().find(|(used, _)| used + len <= max_tokens) {
            Some((used, seqs)) => {
                *used += len;
                seqs.push(i);
            }
            None => bins.push((len, vec![i])),
        }
    }
    bins.into_iter().map(|(_, seqs)| seqs).collect()
}

/// The temperatures of a batch's sequences: per token for each sequence (empty: none recorded), and the
/// temperature of sequences that record none.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Temperatures<'a> {
    pub(crate) per_token: &'a [&'a [f32]],
    pub(crate) default: f64,
}

impl Temperatures<'_> {
    /// Every token at `temperature`.
    pub(crate) fn uniform(temperature: f64) -> Temperatures<'static> {
        Temperatures {
            per_token: &[],
            default: temperature,
        }
    }

    /// The inverse temperature token `t` of sequence `seq` is scored at: the one recorded for it, where a
    /// greedy token (temperature <= 0) counts as temperature 1 because the sampler records its
    /// log-probability there, or the default when the sequence records none.
    pub(crate) fn inverse(&self, seq: usize, t: usize) -> f32 {
        let recorded = self.per_token.get(seq).and_then(|r| r.get(t));
        let temperature = match recorded {
            Some(&x) if x > 0.0 => f64::from(x),
            Some(_) => 1.0,
            None => self.default,
        };
        (1.0 / temperature) as f32
    }
}

/// Packs the sequences `order` (tokens and masks by batch index) into one row, each trained token scored
/// at its temperature of `temperatures`.
pub(crate) fn pack(
    tokens: &[&[u32]],
    masks: &[&[bool]],
    temperatures: Temperatures<'_>,
    order: &[usize],
) -> Packed {
    let mut p = Packed::default();
    for &seq in order {
        let len = effective_len(masks[seq]);
        let start = p.tokens.len();
        p.tokens.extend(tokens[seq][..len].iter().map(|&t| i64::from(t)));
        p.positions.extend(0..len);
        for t in 1..len {
            if masks[seq][t] {
                p.rows.push((start + t - 1) as i64);
                p.targets.push(i64::from(tokens[seq][t]));
                p.origin.push((seq, t));
                p.inv_temperatures.push(temperatures.inverse(seq, t));
            }
        }
        match p.runs.last_mut() {
            Some(run) if run.len == len => run.count += 1,
            _ => p.runs.push(SegmentRun { start, len, count: 1 }),
        }
        p.segments.push(Segment { seq, start, len });
    }
    p
}
