//! A deterministic fake engine for tests and benches: seeded pseudo-random tokens (or scripted ones), a
//! configurable delay per token, injectable failures, pause and resume, and a log of what it was asked and
//! what it sampled.
//!
//! A paused fake holds every stream before its next token. Each token carries the version in force when the
//! stream yields it (and is so recorded), as an engine that samples it after a weight update would.

use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use std::ops::Range;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream;
use seeds::SplitMix64;

use super::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, PauseMode, SampledToken,
    TokenStream, WeightUpdate,
};

/// How a [`FakeEngine`] behaves.
#[derive(Debug, Clone)]
pub struct FakeEngineConfig {
    /// Seeds the pseudo-random tokens; the same seed and prompt give the same tokens.
    pub seed: u64,
    /// Delay before each token (zero: all tokens at once).
    pub token_latency: Duration,
    /// The context window it declares.
    pub max_context_len: usize,
    /// Token ids it draws from when unscripted (keep special tokens out).
    pub vocab: Range<u32>,
    /// How many tokens an unscripted generation has before its end-of-sequence token (capped by
    /// `max_new_tokens`).
    pub output_len: u32,
    /// The token it ends an unscripted generation with, if any; it ends with a stop only if the request
    /// lists it among its stop tokens.
    pub eos_token: Option<u32>,
    /// Whether it declares image support.
    pub supports_images: bool,
    /// Whether it keeps a log of requests and outputs (tests); benches turn it off.
    pub record: bool,
}

impl Default for FakeEngineConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            token_latency: Duration::ZERO,
            max_context_len: 8192,
            vocab: 100..1000,
            output_len: 16,
            eos_token: None,
            supports_images: false,
            record: true,
        }
    }
}

/// A deterministic in-process engine. Scripted outputs ([`FakeEngine::push_script`]) are answered first,
/// in order; otherwise it samples pseudo-random tokens seeded by the config seed, the prompt and the
/// request seed.
#[derive(Debug)]
pub struct FakeEngine {
    config: FakeEngineConfig,
    scripts: Mutex<VecDeque<Vec<u32>>>,
    failures: Mutex<VecDeque<EngineError>>,
    version: Arc<AtomicU32>,
    paused: Arc<tokio::sync::watch::Sender<bool>>,
    log: Arc<Mutex<FakeLog>>,
}

#[derive(Debug, Default)]
struct FakeLog {
    requests: Vec<GenerateRequest>,
    outputs: Vec<Vec<SampledToken>>,
    weight_updates: Vec<WeightUpdate>,
    flushes: usize,
}

impl FakeEngine {
    /// A fake engine with `config`.
    pub fn new(config: FakeEngineConfig) -> Self {
        Self {
            config,
            scripts: Mutex::new(VecDeque::new()),
            failures: Mutex::new(VecDeque::new()),
            version: Arc::new(AtomicU32::new(0)),
            paused: Arc::new(tokio::sync::watch::Sender::new(false)),
            log: Arc::new(Mutex::new(FakeLog::default())),
        }
    }

    /// The next generation samples exactly `tokens` (truncated to `max_new_tokens`).
    pub fn push_script(&self, tokens: Vec<u32>) {
        lock(&self.scripts).push_back(tokens);
    }

    /// The next generation fails with `error` instead of sampling.
    pub fn fail_next(&self, error: EngineError) {
        lock(&self.failures).push_back(error);
    }

    /// Every request received so far (when recording).
    pub fn requests(&self) -> Vec<GenerateRequest> {
        lock(&self.log).requests.clone()
    }

    /// Every output sampled so far, in order (when recording).
    pub fn outputs(&self) -> Vec<Vec<SampledToken>> {
        lock(&self.log).outputs.clone()
    }

    /// Weight updates received so far.
    pub fn weight_updates(&self) -> Vec<WeightUpdate> {
        lock(&self.log).weight_updates.clone()
    }

    /// How many times the cache was flushed.
    pub fn flushes(&self) -> usize {
        lock(&self.log).flushes
    }

    /// The current policy version.
    pub fn version(&self) -> u32 {
        self.version.load(Ordering::Relaxed)
    }

    fn sample(&self, request: &GenerateRequest) -> (Vec<SampledToken>, FinishReason) {
        let version = self.version();
        let max_new = request.sampling.max_new_tokens as usize;
        let scripted = lock(&self.scripts).pop_front();
        let mut hasher = std::hash::DefaultHasher::new();
        self.config.seed.hash(&mut hasher);
        request.input_ids.hash(&mut hasher);
        request.sampling.seed.hash(&mut hasher);
        let mut rng = SplitMix64::new(hasher.finish());
        let ids: Vec<u32> = match scripted {
            Some(ids) => ids,
            None => {
                let span = u64::from(
                    self.config
                        .vocab
                        .end
                        .saturating_sub(self.config.vocab.start)
                        .max(1),
                );
                let mut ids: Vec<u32> = (0..self.config.output_len)
                    .map(|_| self.config.vocab.start + (rng.next_u64() % span) as u32)
                    .collect();
                ids.extend(self.config.eos_token);
                ids
            }
        };
        let mut out = Vec::with_capacity(ids.len().min(max_new));
        let mut finish = None;
        for id in ids {
            if out.len() == max_new {
                finish = Some(FinishReason::Length);
                break;
            }
            let logprob = -(((rng.next_u64() % 4000) + 1) as f32) / 1000.0;
            out.push(SampledToken { id, logprob, version });
            if request.sampling.stop_token_ids.contains(&id) {
                finish = Some(FinishReason::Stop { matched: Some(id) });
                break;
            }
        }
        let finish = finish.unwrap_or(if out.len() == max_new {
            FinishReason::Length
        } else {
            FinishReason::Stop { matched: None }
        });
        (out, finish)
    }
}

impl InferenceEngine for FakeEngine {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        if let Some(error) = lock(&self.failures).pop_front() {
            return Box::pin(stream::once(async move { Err(error) }));
        }
        if request.input_ids.len() >= self.config.max_context_len {
            let error = EngineError::ContextLengthExceeded {
                prompt: request.input_ids.len(),
                max: self.config.max_context_len,
            };
            return Box::pin(stream::once(async move { Err(error) }));
        }
        let (tokens, finish) = self.sample(&request);
        let logged = self.config.record.then(|| {
            let mut log = lock(&self.log);
            log.outputs.push(tokens.clone());
            log.requests.push(request);
            log.outputs.len() - 1
        });
        let stream = FakeStream {
            tokens: tokens.into(),
            finish: Some(finish),
            delay: self.config.token_latency,
            paused: self.paused.subscribe(),
            version: self.version.clone(),
            emitted: 0,
            log: logged.map(|i| (self.log.clone(), i)),
        };
        Box::pin(stream::unfold(stream, |mut s| async move {
            let event = s.next().await?;
            Some((event, s))
        }))
    }

    fn max_context_len(&self) -> usize {
        self.config.max_context_len
    }

    fn supports_images(&self) -> bool {
        self.config.supports_images
    }

    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let next = update.version.unwrap_or_else(|| self.version() + 1);
            self.version.store(next, Ordering::Relaxed);
            lock(&self.log).weight_updates.push(update);
            Ok(())
        })
    }

    fn flush_cache(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            lock(&self.log).flushes += 1;
            Ok(())
        })
    }

    fn pause(&self, _mode: PauseMode) -> BoxFuture<'_, Result<(), EngineError>> {
        self.paused.send_replace(true);
        Box::pin(async { Ok(()) })
    }

    fn resume(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        self.paused.send_replace(false);
        Box::pin(async { Ok(()) })
    }
}

/// One generation's remaining events.
struct FakeStream {
    tokens: VecDeque<SampledToken>,
    finish: Option<FinishReason>,
    delay: Duration,
    paused: tokio::sync::watch::Receiver<bool>,
    version: Arc<AtomicU32>,
    emitted: usize,
    /// The log and this generation's entry in it, to record versions that changed since the request.
    log: Option<(Arc<Mutex<FakeLog>>, usize)>,
}

impl FakeStream {
    async fn next(&mut self) -> Option<Result<EngineEvent, EngineError>> {
        if self.tokens.is_empty() {
            return self.finish.take().map(|f| Ok(EngineEvent::Finished(f)));
        }
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        if *self.paused.borrow() {
            // The sender lives as long as the engine; a dropped engine simply lets the stream go on.
            let _ = self.paused.wait_for(|paused| !*paused).await;
        }
        let mut token = self.tokens.pop_front()?;
        let version = self.version.load(Ordering::Relaxed);
        if token.version != version {
            token.version = version;
            if let Some((log, entry)) = &self.log
                && let Some(t) = lock(log)
                    .outputs
                    .get_mut(*entry)
                    .and_then(|o| o.get_mut(self.emitted))
            {
                t.version = version;
            }
        }
        self.emitted += 1;
        Some(Ok(EngineEvent::Token(token)))
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
