//! The continuous-batching generation loop that runs on the policy's engine thread, generic over the
//! backend.
//!
//! All sequences in flight share one key/value cache whose columns are batch time steps, not sequence
//! positions: every row's newest key sits in the same column, so one decode step writes one column for the
//! whole batch, and each row masks the columns before its own first token.
//! New requests are prefilled together (left-padded) between decode steps and spliced into the cache;
//! finished or abandoned rows are cut out of it.
//! Commands (submit, weight swap, scoring) are handled between steps, so a swap never interrupts a step and
//! never drops a sequence.
//! The cache never holds more than the policy's token budget (rows times allocated columns, from
//! [`crate::PolicyOptions::kv_cache_bytes`]): a request is admitted only when the batch with it fits with room
//! to grow, and when the batch outgrows the budget while decoding, the newest rows are retracted (their
//! tokens so far kept, their random state with them) and wait at the head of the queue to be prefilled
//! again, so they continue exactly as if never interrupted; a lone row that fills the budget ends with
//! [`FinishReason::Length`].
//! A decode-step budget ([`Command::Budget`]) makes the loop hold between steps, still handling commands,
//! so a caller can place a swap after an exact number of tokens; a pause ([`Command::Pause`]) holds it the
//! same way until it is lifted, so a weight update lands while nothing decodes.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, TryRecvError};

use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use tokio::sync::{mpsc, oneshot};

use crate::config::ModelConfig;
use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::model::{AttnInput, CausalLm, KvCache, LayerKv};
use crate::policy::{FinishReason, GenerationEvent, GenerationRequest, Logits};
use crate::rope::RopeTable;
use crate::sampling::{SplitMix64, sample};
use crate::weights::Weights;

/// What the handle asks of the engine thread.
pub(crate) enum Command {
    Submit(Box<GenerationRequest>, mpsc::UnboundedSender<GenerationEvent>),
    Swap(Box<Weights>, u64, oneshot::Sender<Result<u64>>),
    Score(Vec<u32>, oneshot::Sender<Result<Logits>>),
    /// At most this many more decode steps, then hold (no admission, no decoding) until the next budget;
    /// `None` lifts the limit.
    Budget(Option<u64>),
    /// Hold between steps (`true`) until lifted (`false`), independently of the budget.
    Pause(bool),
}

/// State shared between the handle and the engine thread.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub(crate) version: AtomicU64,
    pub(crate) active: AtomicU64,
    /// Key/value cache slots (rows times allocated columns) the engine holds now, and at most so far.
    pub(crate) cache_tokens: AtomicU64,
    pub(crate) peak_cache_tokens: AtomicU64,
    /// Rows taken out of the batch to keep the cache within its budget, since the start.
    pub(crate) retractions: AtomicU64,
}

/// One sequence being decoded.
struct Seq {
    tx: mpsc::UnboundedSender<GenerationEvent>,
    request: GenerationRequest,
    rng: SplitMix64,
    /// The tokens sampled so far; the last one is not in the cache yet.
    sampled: Vec<u32>,
    /// Position (0-based) of the last sampled token in the sequence.
    position: usize,
    /// First cache column that belongs to this row.
    start_col: usize,
}

/// A request waiting for admission: new, or retracted from the batch with what it had sampled.
struct Waiting {
    request: GenerationRequest,
    tx: mpsc::UnboundedSender<GenerationEvent>,
    resumed: Option<Resumed>,
}

/// What a retracted row carries back to the queue so that it continues exactly where it stopped.
struct Resumed {
    sampled: Vec<u32>,
    rng: SplitMix64,
}

impl Waiting {
    /// Tokens its prefill feeds: the prompt and everything it has sampled.
    fn len(&self) -> usize {
        self.request.input_ids.len() + self.resumed.as_ref().map_or(0, |r| r.sampled.len())
    }

    /// At most this many more tokens to sample.
    fn remaining(&self) -> usize {
        let sampled = self.resumed.as_ref().map_or(0, |r| r.sampled.len());
        self.request.max_new_tokens.saturating_sub(sampled)
    }
}

/// Columns a cache of `len` live columns is allocated with: room for `len / 2` (at least 8) more tokens
/// before it moves again.
fn grown(len: usize) -> usize {
    len + 1 + len.max(16) / 2
}

pub(crate) struct GenerationLoop<B: Backend> {
    model: CausalLm<B>,
    config: ModelConfig,
    rope: RopeTable,
    device: B::Device,
    shared: Arc<Shared>,
    max_batch: usize,
    /// Cache slots (rows times columns) the cache may take.
    max_cache_tokens: usize,
    seqs: Vec<Seq>,
    cache: Option<KvCache<B>>,
    pending: VecDeque<Waiting>,
    /// Decode steps left before the loop holds; `None` is no limit.
    budget: Option<u64>,
    /// Whether a pause holds the loop between steps.
    paused: bool,
}

impl<B: Kernels> GenerationLoop<B> {
    pub(crate) fn new(
        model: CausalLm<B>,
        config: ModelConfig,
        device: B::Device,
        shared: Arc<Shared>,
        max_batch: usize,
        max_cache_tokens: usize,
    ) -> Self {
        Self {
            rope: RopeTable::new(&config),
            model: B::for_inference(model),
            config,
            device,
            shared,
            max_batch: max_batch.max(1),
            max_cache_tokens: max_cache_tokens.max(2),
            seqs: Vec::new(),
            cache: None,
            pending: VecDeque::new(),
            budget: None,
            paused: false,
        }
    }

    /// Runs until every handle is gone and no work is left.
    pub(crate) fn run(mut self, rx: Receiver<Command>) {
        let mut open = true;
        loop {
            let idle = self.seqs.is_empty() && self.pending.is_empty();
            if idle || self.held() {
                if open {
                    match rx.recv() {
                        Ok(cmd) => self.handle(cmd),
                        Err(_) => open = false,
                    }
                }
                if !open {
                    if idle {
                        return;
                    }
                    // Nobody is left to lift the hold: finish the work that is in flight.
                    self.budget = None;
                    self.paused = false;
                }
                if self.held() {
                    self.publish_active();
                    continue;
                }
            }
            while open {
                match rx.try_recv() {
                    Ok(cmd) => self.handle(cmd),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => open = false,
                }
            }
            self.drop_abandoned();
            if !self.held() {
                self.admit();
            }
            if !self.seqs.is_empty() && !self.held() {
                self.decode_step();
                self.budget = self.budget.map(|b| b.saturating_sub(1));
            }
            self.publish_active();
        }
    }

    /// Whether a spent decode-step budget or a pause holds the loop between steps.
    fn held(&self) -> bool {
        self.budget == Some(0) || self.paused
    }

    fn publish_active(&self) {
        self.shared
            .active
            .store((self.seqs.len() + self.pending.len()) as u64, Ordering::Relaxed);
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit(request, tx) => self.pending.push_back(Waiting {
                request: *request,
                tx,
                resumed: None,
            }),
            Command::Swap(weights, version, ack) => {
                let model = std::mem::replace(
                    &mut self.model,
                    crate::model::skeleton(&self.config, &self.device),
                );
                let result = match weights.check_against(&self.config) {
                    Ok(()) => {
                        self.model = B::for_inference(
                            model
                                .load_weights(&self.config, &weights)
                                .expect("weights were checked against the config just above"),
                        );
                        self.shared.version.store(version, Ordering::SeqCst);
                        Ok(version)
                    }
                    Err(e) => {
                        self.model = model;
                        Err(Error::WeightMismatch(e))
                    }
                };
                // The caller may have stopped waiting; the swap stands either way.
                let _ = ack.send(result);
            }
            Command::Score(tokens, reply) => {
                let _ = reply.send(Ok(self.score(&tokens)));
            }
            Command::Budget(steps) => self.budget = steps,
            Command::Pause(paused) => self.paused = paused,
        }
    }

    fn score(&self, tokens: &[u32]) -> Logits {
        let len = tokens.len();
        let input = AttnInput::padded(&self.rope, &[len], len, false, &self.device);
        let ids = self.int_tensor(tokens.iter().map(|&t| t as i64).collect(), [1, len]);
        let logits = self.model.forward(ids, &input);
        let vocab = self.config.vocab_size;
        Logits {
            len,
            vocab,
            data: B::to_host(logits),
        }
    }

    fn int_tensor(&self, data: Vec<i64>, shape: [usize; 2]) -> Tensor<B, 2, Int> {
        Tensor::from_data(TensorData::new(data, shape), &self.device)
    }

    fn drop_abandoned(&mut self) {
        self.pending.retain(|w| !w.tx.is_closed());
        let keep: Vec<bool> = self.seqs.iter().map(|s| !s.tx.is_closed()).collect();
        if keep.iter().any(|k| !k) {
            self.retain_rows(&keep);
        }
    }

    /// The columns before the first one any row uses (`unused`), and the columns from there to the newest.
    fn live_columns(&self) -> (usize, usize) {
        match &self.cache {
            Some(cache) => {
                let unused = self.seqs.iter().map(|s| s.start_col).min().unwrap_or(cache.len);
                (unused, cache.len - unused)
            }
            None => (0, 0),
        }
    }

    /// Stores the cache and publishes the slots it holds.
    fn set_cache(&mut self, cache: Option<KvCache<B>>) {
        let tokens = cache.as_ref().map_or(0, |c| (c.batch() * c.capacity()) as u64);
        self.shared.cache_tokens.store(tokens, Ordering::Relaxed);
        self.shared.peak_cache_tokens.fetch_max(tokens, Ordering::Relaxed);
        self.cache = cache;
    }

    /// How many waiting requests, from the head of the queue and at most `room`, join the batch: as many as
    /// keep the cache within its budget with room for every row to grow by a quarter of its columns (at
    /// least 8), or by what the rows may still sample where that is less. A request that finds the batch
    /// empty is always admitted: the handle refuses prompts the budget cannot hold.
    fn admissible(&self, room: usize) -> usize {
        let rows = self.seqs.len();
        let (_, live) = self.live_columns();
        let mut left = self
            .seqs
            .iter()
            .map(|s| s.request.max_new_tokens.saturating_sub(s.sampled.len()))
            .max()
            .unwrap_or(0);
        let (mut width, mut n) = (0, 0);
        for waiting in self.pending.iter().take(room) {
            let wide = width.max(waiting.len());
            let more = left.max(waiting.remaining());
            let target = live.max(wide);
            let columns = target + 1 + more.min(target.max(32) / 4);
            if rows + n > 0 && (rows + n + 1) * columns > self.max_cache_tokens {
                break;
            }
            (width, left, n) = (wide, more, n + 1);
        }
        n
    }

    /// Prefills as many waiting requests as the batch and the cache's budget have room for, samples their
    /// next tokens and splices their keys and values into the shared cache.
    fn admit(&mut self) {
        let room = self.max_batch.saturating_sub(self.seqs.len());
        if room == 0 || self.pending.is_empty() {
            return;
        }
        let n = self.admissible(room);
        if n == 0 {
            return;
        }
        let version = self.shared.version.load(Ordering::SeqCst);
        let group: Vec<Waiting> = self.pending.drain(..n).collect();
        let lengths: Vec<usize> = group.iter().map(Waiting::len).collect();
        let width = lengths.iter().copied().max().unwrap_or(0);
        let mut ids = Vec::with_capacity(n * width);
        for (waiting, &len) in group.iter().zip(&lengths) {
            ids.extend(std::iter::repeat_n(0i64, width - len));
            ids.extend(waiting.request.input_ids.iter().map(|&t| i64::from(t)));
            if let Some(resumed) = &waiting.resumed {
                ids.extend(resumed.sampled.iter().map(|&t| i64::from(t)));
            }
        }
        let input = AttnInput::padded(&self.rope, &lengths, width, true, &self.device);
        let mut fresh = KvCache::new(&self.config, n, width, &self.device);
        let hidden = self
            .model
            .forward_hidden(self.int_tensor(ids, [n, width]), &input, Some(&mut fresh));
        let last = hidden.slice([0..n, width - 1..width]);
        let logits = B::to_host(self.model.logits(last));
        let vocab = self.config.vocab_size;

        let mut new_seqs = Vec::new();
        let mut keep = Vec::new();
        for (row, (waiting, len)) in group.into_iter().zip(lengths).enumerate() {
            let Waiting { request, tx, resumed } = waiting;
            let (sampled, rng) = match resumed {
                Some(r) => (r.sampled, r.rng),
                None => (
                    Vec::new(),
                    SplitMix64::new(request.sampling.seed.unwrap_or_else(random_seed)),
                ),
            };
            let mut seq = Seq {
                tx,
                request,
                rng,
                sampled,
                position: len,
                start_col: width - len,
            };
            let done = if seq.sampled.len() >= seq.request.max_new_tokens {
                Some(FinishReason::Length)
            } else {
                let (token, logprob) = sample(
                    &logits[row * vocab..(row + 1) * vocab],
                    &seq.request.sampling,
                    &mut seq.rng,
                );
                seq.emit(token, logprob, version, self.config.max_position_embeddings)
            };
            match done {
                Some(reason) => seq.finish(reason),
                None => {
                    keep.push(row);
                    new_seqs.push(seq);
                }
            }
        }
        if new_seqs.is_empty() {
            return;
        }
        let fresh = if keep.len() == n {
            fresh
        } else {
            select_rows(fresh, &keep, &self.device)
        };
        self.splice(fresh, width, new_seqs);
    }

    /// Adds prefilled rows (cache with `width` valid columns) to the running batch, dropping the columns no
    /// running row uses.
    fn splice(&mut self, fresh: KvCache<B>, width: usize, mut new_seqs: Vec<Seq>) {
        let rows = self.seqs.len() + new_seqs.len();
        let most = self.max_cache_tokens / rows;
        let (unused, live) = self.live_columns();
        let Some(cache) = self.cache.take() else {
            let capacity = (width + 1 + width.max(16)).min(most).max(width + 1);
            self.set_cache(Some(relayout(fresh, 0, width, capacity, &self.device)));
            self.seqs = new_seqs;
            return;
        };
        let target = live.max(width);
        let capacity = cache.capacity().max(grown(target)).min(most).max(target + 1);
        // The running rows' columns end where the new rows' do: both are right-aligned at `target`.
        let merged = assemble(
            &[
                (&cache, unused..cache.len, target - live),
                (&fresh, 0..width, target - width),
            ],
            capacity,
            &self.device,
        );
        drop(cache);
        for s in &mut self.seqs {
            s.start_col = s.start_col - unused + (target - live);
        }
        for s in &mut new_seqs {
            s.start_col += target - width;
        }
        self.set_cache(Some(KvCache {
            layers: merged,
            len: target,
        }));
        self.seqs.extend(new_seqs);
    }

    /// Feeds every row's pending token, samples the next one, and retires finished rows.
    fn decode_step(&mut self) {
        let version = self.shared.version.load(Ordering::SeqCst);
        self.ensure_room();
        let Some(cache) = self.cache.as_mut() else {
            return;
        };
        let b = self.seqs.len();
        let keys = cache.len + 1;
        let mut spans = Vec::with_capacity(b);
        let mut positions = Vec::with_capacity(b);
        let mut ids = Vec::with_capacity(b);
        for s in &self.seqs {
            // A row sees its own columns: from its first to the one this step writes.
            spans.push([s.start_col as u32, keys as u32]);
            positions.push(s.position);
            ids.push(i64::from(s.next_token()));
        }
        let input = AttnInput::new(&self.rope, &positions, spans, [b, 1, keys], &self.device);
        let ids = Tensor::from_data(TensorData::new(ids, [b, 1]), &self.device);
        let hidden = self.model.forward_hidden(ids, &input, Some(cache));
        let logits = B::to_host(self.model.logits(hidden));
        let vocab = self.config.vocab_size;
        let max_positions = self.config.max_position_embeddings;
        let mut keep = vec![true; b];
        for (row, s) in self.seqs.iter_mut().enumerate() {
            s.position += 1;
            let (token, logprob) = sample(
                &logits[row * vocab..(row + 1) * vocab],
                &s.request.sampling,
                &mut s.rng,
            );
            if let Some(reason) = s.emit(token, logprob, version, max_positions) {
                keep[row] = false;
                let _ = s.tx.send(s.finished(reason));
            }
        }
        if keep.iter().any(|k| !k) {
            self.retain_rows(&keep);
        }
    }

    /// Makes sure the cache has a free column for the next step within its budget: drops the columns no row
    /// uses, then grows; when the rows cannot all have one more column, retracts the newest rows to the head
    /// of the queue, and a lone row that fills the budget ends with [`FinishReason::Length`].
    fn ensure_room(&mut self) {
        loop {
            let (unused, live) = self.live_columns();
            let Some(cache) = self.cache.take() else {
                return;
            };
            if cache.len < cache.capacity() {
                self.cache = Some(cache);
                return;
            }
            let rows = self.seqs.len().max(1);
            let most = self.max_cache_tokens / rows;
            if live + 1 > most {
                self.cache = Some(cache);
                if rows == 1 {
                    if let Some(s) = self.seqs.first() {
                        let _ = s.tx.send(s.finished(FinishReason::Length));
                    }
                    self.retain_rows(&[false]);
                    return;
                }
                self.retract_newest();
                continue;
            }
            let wanted = if live < cache.capacity() / 2 {
                cache.capacity()
            } else {
                (live + 1) * 2
            };
            let capacity = wanted.min(most).max(live + 1);
            let cache = shift_left(cache, unused, capacity, &self.device);
            for s in &mut self.seqs {
                s.start_col -= unused;
            }
            self.set_cache(Some(cache));
            return;
        }
    }

    /// Takes the newest row out of the batch and puts it at the head of the queue with the tokens it has
    /// sampled and its random state, to be prefilled again when the cache has room.
    fn retract_newest(&mut self) {
        let mut keep = vec![true; self.seqs.len()];
        if let Some(last) = keep.last_mut() {
            *last = false;
        }
        for seq in self.retain_rows(&keep) {
            self.shared.retractions.fetch_add(1, Ordering::Relaxed);
            self.pending.push_front(Waiting {
                request: seq.request,
                tx: seq.tx,
                resumed: Some(Resumed {
                    sampled: seq.sampled,
                    rng: seq.rng,
                }),
            });
        }
    }

    /// Keeps the rows `keep` marks, in the cache and the batch; returns the others.
    fn retain_rows(&mut self, keep: &[bool]) -> Vec<Seq> {
        let rows: Vec<usize> = keep
            .iter()
            .enumerate()
            .filter_map(|(i, &k)| k.then_some(i))
            .collect();
        let (kept, dropped): (Vec<_>, Vec<_>) = std::mem::take(&mut self.seqs)
            .into_iter()
            .zip(keep)
            .partition(|(_, k)| **k);
        self.seqs = kept.into_iter().map(|(s, _)| s).collect();
        let cache = match self.cache.take() {
            Some(_) if rows.is_empty() => None,
            Some(cache) => Some(select_rows(cache, &rows, &self.device)),
            None => None,
        };
        self.set_cache(cache);
        dropped.into_iter().map(|(s, _)| s).collect()
    }
}

impl Seq {
    /// The last sampled token, which the next decode step feeds.
    fn next_token(&self) -> u32 {
        *self.sampled.last().expect("a decoding row has sampled a token")
    }

    /// Sends a token (which sits at `self.position`); returns why the sequence ends, if it does.
    fn emit(&mut self, token: u32, logprob: f32, version: u64, max_positions: usize) -> Option<FinishReason> {
        self.sampled.push(token);
        let _ = self.tx.send(GenerationEvent::Token {
            token_id: token,
            logprob,
            version,
        });
        if self.request.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.sampled.len() >= self.request.max_new_tokens || self.position + 1 >= max_positions {
            // The whole sequence must fit the model's positions so that it can be trained on.
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    /// The event that ends this sequence.
    fn finished(&self, reason: FinishReason) -> GenerationEvent {
        GenerationEvent::Finished {
            reason,
            prompt_tokens: self.request.input_ids.len(),
            completion_tokens: self.sampled.len(),
        }
    }

    fn finish(self, reason: FinishReason) {
        let _ = self.tx.send(self.finished(reason));
    }
}

/// Copies columns `0..valid` of every layer to `shift..shift + valid` of a zeroed cache of `capacity`.
fn relayout<B: Kernels>(
    cache: KvCache<B>,
    shift: usize,
    valid: usize,
    capacity: usize,
    device: &B::Device,
) -> KvCache<B> {
    KvCache {
        layers: assemble(&[(&cache, 0..valid, shift)], capacity, device),
        len: shift + valid,
    }
}

/// Drops the first `unused` columns and reallocates to `capacity`.
fn shift_left<B: Kernels>(
    cache: KvCache<B>,
    unused: usize,
    capacity: usize,
    device: &B::Device,
) -> KvCache<B> {
    let len = cache.len;
    KvCache {
        layers: assemble(&[(&cache, unused..len, 0)], capacity, device),
        len: len - unused,
    }
}

/// The layers of a zeroed cache of `capacity` columns holding `parts` stacked along the rows: part
/// `(cache, cols, at)` contributes every row of `cache`, its columns `cols` written from column `at`.
fn assemble<B: Kernels>(
    parts: &[(&KvCache<B>, std::ops::Range<usize>, usize)],
    capacity: usize,
    device: &B::Device,
) -> Vec<LayerKv<B>> {
    let layers = parts.first().map_or(0, |(c, _, _)| c.layers.len());
    let stack = |pick: &dyn Fn(&LayerKv<B>) -> &Tensor<B, 4>, i: usize| {
        let pieces: Vec<_> = parts
            .iter()
            .map(|(c, cols, at)| (pick(&c.layers[i]), cols.clone(), *at))
            .collect();
        B::assemble(&pieces, capacity, device)
    };
    (0..layers)
        .map(|i| LayerKv {
            k: stack(&|l| &l.k, i),
            v: stack(&|l| &l.v, i),
        })
        .collect()
}

fn select_rows<B: Backend>(cache: KvCache<B>, rows: &[usize], device: &B::Device) -> KvCache<B> {
    let idx = Tensor::<B, 1, Int>::from_data(
        TensorData::new(rows.iter().map(|&r| r as i64).collect::<Vec<_>>(), [rows.len()]),
        device,
    );
    KvCache {
        layers: cache
            .layers
            .into_iter()
            .map(|l| LayerKv {
                k: l.k.select(0, idx.clone()),
                v: l.v.select(0, idx.clone()),
            })
            .collect(),
        len: cache.len,
    }
}

/// A seed for requests that bring none.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.finish()
}
