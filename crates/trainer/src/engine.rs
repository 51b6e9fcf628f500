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
use crate::model::{AttnInput, CausalLm, KvCache, LayerKv, MASKED};
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
}

/// One sequence being decoded.
struct Seq {
    tx: mpsc::UnboundedSender<GenerationEvent>,
    request: GenerationRequest,
    rng: SplitMix64,
    /// The last sampled token, not yet in the cache.
    next_token: u32,
    /// Position (0-based) of `next_token` in the sequence.
    position: usize,
    /// First cache column that belongs to this row.
    start_col: usize,
    generated: usize,
}

pub(crate) struct GenerationLoop<B: Backend> {
    model: CausalLm<B>,
    config: ModelConfig,
    rope: RopeTable,
    device: B::Device,
    shared: Arc<Shared>,
    max_batch: usize,
    seqs: Vec<Seq>,
    cache: Option<KvCache<B>>,
    pending: VecDeque<(GenerationRequest, mpsc::UnboundedSender<GenerationEvent>)>,
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
    ) -> Self {
        Self {
            rope: RopeTable::new(&config),
            model: B::for_inference(model),
            config,
            device,
            shared,
            max_batch: max_batch.max(1),
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
            Command::Submit(req, tx) => self.pending.push_back((*req, tx)),
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
        self.pending.retain(|(_, tx)| !tx.is_closed());
        let keep: Vec<bool> = self.seqs.iter().map(|s| !s.tx.is_closed()).collect();
        if keep.iter().any(|k| !k) {
            self.retain_rows(&keep);
        }
    }

    /// Prefills as many waiting requests as the batch has room for, samples their first tokens and splices
    /// their keys and values into the shared cache.
    fn admit(&mut self) {
        let room = self.max_batch.saturating_sub(self.seqs.len());
        if room == 0 || self.pending.is_empty() {
            return;
        }
        let version = self.shared.version.load(Ordering::SeqCst);
        let group: Vec<_> = self.pending.drain(..room.min(self.pending.len())).collect();
        let lengths: Vec<usize> = group.iter().map(|(r, _)| r.input_ids.len()).collect();
        let n = group.len();
        let width = lengths.iter().copied().max().unwrap_or(0);
        let mut ids = Vec::with_capacity(n * width);
        for (req, _) in &group {
            ids.extend(std::iter::repeat_n(0i64, width - req.input_ids.len()));
            ids.extend(req.input_ids.iter().map(|&t| i64::from(t)));
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
        for (row, (request, tx)) in group.into_iter().enumerate() {
            let mut rng = SplitMix64::new(request.sampling.seed.unwrap_or_else(random_seed));
            let prompt = request.input_ids.len();
            let mut seq = Seq {
                tx,
                rng: SplitMix64::new(0),
                next_token: 0,
                position: prompt,
                start_col: width - prompt,
                generated: 0,
                request,
            };
            let done = if seq.request.max_new_tokens == 0 {
                Some(FinishReason::Length)
            } else {
                let (token, logprob) = sample(
                    &logits[row * vocab..(row + 1) * vocab],
                    &seq.request.sampling,
                    &mut rng,
                );
                seq.rng = rng;
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

    /// Adds prefilled rows (cache with `width` valid columns) to the running batch.
    fn splice(&mut self, fresh: KvCache<B>, width: usize, mut new_seqs: Vec<Seq>) {
        let Some(cache) = self.cache.take() else {
            let capacity = width + 1 + width.max(16);
            self.cache = Some(relayout(fresh, 0, width, capacity, &self.device));
            self.seqs = new_seqs;
            return;
        };
        let t = cache.len;
        let target = t.max(width);
        let capacity = cache.capacity().max(target + 1 + target.max(16) / 2);
        // The running rows' columns end where the new rows' do: both are right-aligned at `target`.
        let merged = assemble(
            &[(&cache, 0..t, target - t), (&fresh, 0..width, target - width)],
            capacity,
            &self.device,
        );
        for s in &mut self.seqs {
            s.start_col += target - t;
        }
        for s in &mut new_seqs {
            s.start_col += target - width;
        }
        self.cache = Some(KvCache {
            layers: merged,
            len: target,
        });
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
        let mut bias = vec![MASKED; b * keys];
        let mut positions = Vec::with_capacity(b);
        let mut ids = Vec::with_capacity(b);
        for (row, s) in self.seqs.iter().enumerate() {
            bias[row * keys + s.start_col..(row + 1) * keys].fill(0.0);
            positions.push(s.position);
            ids.push(i64::from(s.next_token));
        }
        let input = AttnInput::new(&self.rope, &positions, bias, [b, 1, keys], &self.device);
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
                let _ = s.tx.send(GenerationEvent::Finished {
                    reason,
                    prompt_tokens: s.request.input_ids.len(),
                    completion_tokens: s.generated,
                });
            }
        }
        if keep.iter().any(|k| !k) {
            self.retain_rows(&keep);
        }
    }

    /// Makes sure the cache has a free column for the next step: drops columns no row uses, then grows.
    fn ensure_room(&mut self) {
        let Some(cache) = self.cache.take() else {
            return;
        };
        if cache.len < cache.capacity() {
            self.cache = Some(cache);
            return;
        }
        let unused = self.seqs.iter().map(|s| s.start_col).min().unwrap_or(0);
        let live = cache.len - unused;
        let capacity = if live < cache.capacity() / 2 {
            cache.capacity()
        } else {
            (live + 1) * 2
        };
        let cache = shift_left(cache, unused, capacity, &self.device);
        for s in &mut self.seqs {
            s.start_col -= unused;
        }
        self.cache = Some(cache);
    }

    fn retain_rows(&mut self, keep: &[bool]) {
        let rows: Vec<usize> = keep
            .iter()
            .enumerate()
            .filter_map(|(i, &k)| k.then_some(i))
            .collect();
        let mut i = 0;
        self.seqs.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        self.cache = match self.cache.take() {
            Some(_) if rows.is_empty() => None,
            Some(cache) => Some(select_rows(cache, &rows, &self.device)),
            None => None,
        };
    }
}

impl Seq {
    /// Sends a token (which sits at `self.position`); returns why the sequence ends, if it does.
    fn emit(&mut self, token: u32, logprob: f32, version: u64, max_positions: usize) -> Option<FinishReason> {
        self.generated += 1;
        self.next_token = token;
        let _ = self.tx.send(GenerationEvent::Token {
            token_id: token,
            logprob,
            version,
        });
        if self.request.stop_token_ids.contains(&token) {
            Some(FinishReason::Stop)
        } else if self.generated >= self.request.max_new_tokens || self.position + 1 >= max_positions {
            // The whole sequence must fit the model's positions so that it can be trained on.
            Some(FinishReason::Length)
        } else {
            None
        }
    }

    fn finish(self, reason: FinishReason) {
        let _ = self.tx.send(GenerationEvent::Finished {
            reason,
            prompt_tokens: self.request.input_ids.len(),
            completion_tokens: self.generated,
        });
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
