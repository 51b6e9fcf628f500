//! [`Policy`]: the handle crates above `trainer` use to generate, score and swap weights, without naming a
//! single burn type.
//!
//! A policy owns one engine thread (see `engine.rs`) that runs the model on the chosen device; the handle
//! talks to it over channels, so it is cheap to clone and safe to use from any thread or async task.
//! A submitted request yields a [`GenerationStream`] of tokens and then one finish event; dropping the
//! stream aborts the sequence at the next step.

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, oneshot};

use crate::backend::{DeviceKind, InferenceDtype};
use crate::config::ModelConfig;
use crate::engine::{Command, GenerationLoop, Shared};
use crate::error::{Error, Result};
use crate::kernels::Kernels;
use crate::model::CausalLm;
use crate::sampling::SamplingParams;
use crate::weights::{ModelFolder, Weights};

/// One generation request: a tokenised prompt and how to continue it.
#[derive(Clone, Debug, PartialEq)]
pub struct GenerationRequest {
    /// The prompt's token ids (at least one).
    pub input_ids: Vec<u32>,
    /// Temperature, top-p, top-k and seed.
    pub sampling: SamplingParams,
    /// Generation stops after this token is emitted (the token is part of the output).
    pub stop_token_ids: Vec<u32>,
    /// At most this many new tokens.
    pub max_new_tokens: usize,
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// A stop token was sampled.
    Stop,
    /// `max_new_tokens`, the model's context length, or (for a sequence generating alone) the key/value
    /// cache's budget ([`PolicyOptions::kv_cache_bytes`]) was reached.
    Length,
}

/// What a [`GenerationStream`] yields: tokens, then exactly one `Finished`.
#[derive(Clone, Debug, PartialEq)]
pub enum GenerationEvent {
    /// One sampled token.
    Token {
        token_id: u32,
        /// Log-probability under the distribution it was sampled from (see [`crate::sampling::sample`]).
        logprob: f32,
        /// The policy version whose weights produced this token.
        version: u64,
    },
    /// The sequence ended.
    Finished {
        reason: FinishReason,
        prompt_tokens: usize,
        completion_tokens: usize,
    },
}

/// Per-position logits of one scored sequence, row-major `[len, vocab]`.
#[derive(Clone, Debug, PartialEq)]
pub struct Logits {
    pub len: usize,
    pub vocab: usize,
    pub data: Vec<f32>,
}

impl Logits {
    /// The logits at position `i`.
    pub fn row(&self, i: usize) -> &[f32] {
        &self.data[i * self.vocab..(i + 1) * self.vocab]
    }
}

/// The receiving end of one request. Dropping it aborts the sequence.
#[derive(Debug)]
pub struct GenerationStream {
    rx: mpsc::UnboundedReceiver<GenerationEvent>,
}

impl GenerationStream {
    /// The next event, waiting asynchronously; `None` after `Finished` (or if the engine died).
    pub async fn recv(&mut self) -> Option<GenerationEvent> {
        self.rx.recv().await
    }

    /// The next event, blocking the thread; never call it from inside an async runtime.
    pub fn blocking_recv(&mut self) -> Option<GenerationEvent> {
        self.rx.blocking_recv()
    }

    /// Polls for the next event (for wrapping the stream in a `futures::Stream`).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<GenerationEvent>> {
        self.rx.poll_recv(cx)
    }

    /// Blocks until the sequence ends and returns its tokens, log-probabilities, versions and finish reason.
    pub fn collect_blocking(mut self) -> Result<Completion> {
        let mut out = Completion::default();
        while let Some(ev) = self.blocking_recv() {
            match ev {
                GenerationEvent::Token {
                    token_id,
                    logprob,
                    version,
                } => {
                    out.token_ids.push(token_id);
                    out.logprobs.push(logprob);
                    out.versions.push(version);
                }
                GenerationEvent::Finished { reason, .. } => {
                    out.finish_reason = Some(reason);
                    return Ok(out);
                }
            }
        }
        Err(Error::EngineStopped)
    }
}

/// A whole generated sequence (see [`GenerationStream::collect_blocking`]).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Completion {
    pub token_ids: Vec<u32>,
    pub logprobs: Vec<f32>,
    pub versions: Vec<u64>,
    pub finish_reason: Option<FinishReason>,
}

/// Where and how a policy runs.
#[derive(Clone, Debug)]
pub struct PolicyOptions {
    /// The compute device.
    pub device: DeviceKind,
    /// At most this many sequences decode together; more wait their turn.
    pub max_batch: usize,
    /// Memory the key/value cache may take (f32 keys and values of every layer, rows times columns).
    /// Requests are admitted only while the batch fits it with room to grow, and the newest sequences are
    /// set aside and resumed later, unchanged, when the batch outgrows it; a prompt it cannot hold is
    /// refused. [`DEFAULT_KV_CACHE_BYTES`] unless set.
    pub kv_cache_bytes: u64,
    /// The version the initial weights carry.
    pub version: u64,
    /// The element type of the weight matrices (bf16 needs a CUDA device).
    pub dtype: InferenceDtype,
}

/// The key/value cache's default budget: 8 GiB.
pub const DEFAULT_KV_CACHE_BYTES: u64 = 8 << 30;

impl Default for PolicyOptions {
    fn default() -> Self {
        Self {
            device: DeviceKind::Cpu,
            max_batch: 64,
            kv_cache_bytes: DEFAULT_KV_CACHE_BYTES,
            version: 0,
            dtype: InferenceDtype::F32,
        }
    }
}

/// What the key/value cache holds, in slots of one token of one sequence (rows times columns).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheStats {
    /// The slots [`PolicyOptions::kv_cache_bytes`] buys for this model.
    pub budget_tokens: u64,
    /// Slots allocated now.
    pub tokens: u64,
    /// The most slots allocated at once since the policy started.
    pub peak_tokens: u64,
    /// Sequences set aside (and later resumed) to keep the cache within its budget.
    pub retractions: u64,
}

/// The bytes one token of one sequence takes in the key/value cache: f32 keys and values of every layer,
/// whatever the weights' dtype.
pub fn kv_cache_bytes_per_token(config: &ModelConfig) -> u64 {
    2 * config.num_hidden_layers as u64 * config.num_key_value_heads as u64 * config.head_dim as u64 * 4
}

/// The cache slots `bytes` buys for `config`; at least two are needed to generate anything.
fn cache_budget(config: &ModelConfig, bytes: u64) -> Result<usize> {
    let per_token = kv_cache_bytes_per_token(config).max(1);
    let tokens = bytes / per_token;
    if tokens < 2 {
        return Err(Error::Options(format!(
            "kv_cache_bytes {bytes} holds {tokens} tokens of this model ({per_token} bytes each); at least 2 are needed"
        )));
    }
    Ok(usize::try_from(tokens).unwrap_or(usize::MAX))
}

/// A loaded policy served by its own engine thread. Cloning shares the engine.
#[derive(Clone, Debug)]
pub struct Policy {
    tx: Arc<Mutex<Sender<Command>>>,
    shared: Arc<Shared>,
    config: Arc<ModelConfig>,
    folder: Option<Arc<ModelFolder>>,
    /// Cache slots the engine may hold.
    cache_tokens: usize,
}

impl Policy {
    /// Loads a Hugging Face folder (config, safetensors, tokenizer files) and starts its engine.
    pub fn load(dir: &Path, options: PolicyOptions) -> Result<Self> {
        let folder = ModelFolder::open(dir)?;
        let weights = Weights::load_dir(dir)?;
        let mut policy = Self::from_weights(folder.config.clone(), &weights, options)?;
        policy.folder = Some(Arc::new(folder));
        Ok(policy)
    }

    /// Starts an engine for `config` with `weights`.
    pub fn from_weights(config: ModelConfig, weights: &Weights, options: PolicyOptions) -> Result<Self> {
        let problems = config.check();
        if !problems.is_empty() {
            return Err(Error::config("<model config>", problems.join("; ")));
        }
        weights.check_against(&config).map_err(Error::WeightMismatch)?;
        options.device.check()?;
        options.dtype.check_on(options.device)?;
        let cache_tokens = cache_budget(&config, options.kv_cache_bytes)?;
        match options.device {
            DeviceKind::Cpu => Self::spawn::<crate::backend::Cpu>(
                config,
                weights,
                options,
                cache_tokens,
                burn_ndarray::NdArrayDevice::Cpu,
            ),
            #[cfg(feature = "cuda")]
            DeviceKind::Cuda(i) => Self::spawn::<crate::backend::Cuda>(
                config,
                weights,
                options,
                cache_tokens,
                burn_cuda::CudaDevice::new(i),
            ),
            #[cfg(not(feature = "cuda"))]
            DeviceKind::Cuda(_) => Err(Error::Device(
                options.device.to_string(),
                crate::backend::NO_CUDA.to_string(),
            )),
        }
    }

    fn spawn<B: Kernels>(
        config: ModelConfig,
        weights: &Weights,
        options: PolicyOptions,
        cache_tokens: usize,
        device: B::Device,
    ) -> Result<Self> {
        let model = CausalLm::<B>::from_weights(&config, weights, &device)?.with_matrices_in(options.dtype);
        let shared = Arc::new(Shared::default());
        shared.version.store(options.version, Ordering::SeqCst);
        let (tx, rx) = std::sync::mpsc::channel();
        let engine = GenerationLoop::new(
            model,
            config.clone(),
            device,
            shared.clone(),
            options.max_batch,
            cache_tokens,
        );
        // The engine loop runs inside its own rayon pool: burn-ndarray parallelises with `rayon::scope`, which
        // called from outside a pool hands every operation to a pool thread and waits, a thread switch per op.
        let threads = std::thread::available_parallelism().map_or(1, usize::from);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("trainer-engine-{i}"))
            .build()
            .map_err(|e| Error::Device("cpu".into(), format!("starting the engine's thread pool: {e}")))?;
        std::thread::Builder::new()
            .name("trainer-engine".into())
            .spawn(move || pool.install(move || engine.run(rx)))
            .map_err(|e| Error::io("spawning the engine thread", "trainer-engine", e))?;
        Ok(Self {
            tx: Arc::new(Mutex::new(tx)),
            shared,
            config: Arc::new(config),
            folder: None,
            cache_tokens,
        })
    }

    fn send(&self, cmd: Command) -> Result<()> {
        self.tx
            .lock()
            .map_err(|_| Error::EngineStopped)?
            .send(cmd)
            .map_err(|_| Error::EngineStopped)
    }

    /// Queues a request; its tokens arrive on the returned stream as they are sampled.
    pub fn submit(&self, request: GenerationRequest) -> Result<GenerationStream> {
        if request.input_ids.is_empty() {
            return Err(Error::Request("input_ids is empty".to_string()));
        }
        if let Some(bad) = request
            .input_ids
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(Error::Request(format!(
                "token id {bad} is out of range for vocabulary size {}",
                self.config.vocab_size
            )));
        }
        if request.input_ids.len() >= self.config.max_position_embeddings {
            return Err(Error::Request(format!(
                "prompt of {} tokens leaves no room within max_position_embeddings {}",
                request.input_ids.len(),
                self.config.max_position_embeddings
            )));
        }
        if request.input_ids.len() >= self.cache_tokens {
            return Err(Error::Request(format!(
                "prompt of {} tokens leaves no room within the key/value cache's {} tokens (kv_cache_bytes)",
                request.input_ids.len(),
                self.cache_tokens
            )));
        }
        if let Some(problem) = request.sampling.check() {
            return Err(Error::Request(problem));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        self.send(Command::Submit(Box::new(request), tx))?;
        Ok(GenerationStream { rx })
    }

    /// Installs new weights between two decoding steps; sequences in flight continue, and their later
    /// tokens carry `version`. The returned receipt resolves once the weights are in place.
    pub fn swap_weights(&self, weights: Weights, version: u64) -> Result<SwapReceipt> {
        let (ack, rx) = oneshot::channel();
        self.send(Command::Swap(Box::new(weights), version, ack))?;
        Ok(SwapReceipt { rx })
    }

    /// Lets the engine take at most `steps` more decode steps (one token for every sequence in flight each),
    /// after which it holds between steps, neither admitting nor decoding, until the next call; `None` lifts
    /// the limit. Commands keep being handled while it holds, so a caller can place a weight swap or a
    /// scoring pass after an exact number of tokens (tests do; generation is otherwise never held).
    /// A prefill's first token is not a decode step. Dropping every handle lifts the hold.
    pub fn limit_decode_steps(&self, steps: Option<u64>) -> Result<()> {
        self.send(Command::Budget(steps))
    }

    /// Holds the engine between two decoding steps until [`Policy::resume`]: no request is admitted and no
    /// token sampled, while weight swaps and scoring are still handled, so the tokens sequences in flight
    /// sample after the resume carry the swapped-in version. Independent of [`Policy::limit_decode_steps`];
    /// dropping every handle lifts it.
    pub fn pause(&self) -> Result<()> {
        self.send(Command::Pause(true))
    }

    /// Lifts a [`Policy::pause`].
    pub fn resume(&self) -> Result<()> {
        self.send(Command::Pause(false))
    }

    /// Per-position logits of `input_ids` under the current weights (run between decoding steps).
    /// Blocks the thread; from async code use [`Policy::score_async`].
    pub fn score(&self, input_ids: &[u32]) -> Result<Logits> {
        self.send_score(input_ids)?
            .blocking_recv()
            .map_err(|_| Error::EngineStopped)?
    }

    /// [`Policy::score`] without blocking the thread.
    pub async fn score_async(&self, input_ids: &[u32]) -> Result<Logits> {
        self.send_score(input_ids)?
            .await
            .map_err(|_| Error::EngineStopped)?
    }

    fn send_score(&self, input_ids: &[u32]) -> Result<oneshot::Receiver<Result<Logits>>> {
        if input_ids.is_empty() {
            return Err(Error::Request("input_ids is empty".to_string()));
        }
        if let Some(bad) = input_ids.iter().find(|&&t| t as usize >= self.config.vocab_size) {
            return Err(Error::Request(format!(
                "token id {bad} is out of range for vocabulary size {}",
                self.config.vocab_size
            )));
        }
        if input_ids.len() > self.config.max_position_embeddings {
            return Err(Error::Request(format!(
                "{} tokens exceed max_position_embeddings {}",
                input_ids.len(),
                self.config.max_position_embeddings
            )));
        }
        let (reply, rx) = oneshot::channel();
        self.send(Command::Score(input_ids.to_vec(), reply))?;
        Ok(rx)
    }

    /// The version of the weights new tokens are sampled with.
    pub fn version(&self) -> u64 {
        self.shared.version.load(Ordering::SeqCst)
    }

    /// Sequences decoding or waiting, as of the engine's last step.
    pub fn in_flight(&self) -> u64 {
        self.shared.active.load(Ordering::Relaxed)
    }

    /// What the key/value cache holds now, at most so far, and its budget.
    pub fn cache_stats(&self) -> CacheStats {
        CacheStats {
            budget_tokens: self.cache_tokens as u64,
            tokens: self.shared.cache_tokens.load(Ordering::Relaxed),
            peak_tokens: self.shared.peak_cache_tokens.load(Ordering::Relaxed),
            retractions: self.shared.retractions.load(Ordering::Relaxed),
        }
    }

    /// The model configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The folder the policy was loaded from, with its tokenizer and chat-template paths.
    pub fn folder(&self) -> Option<&ModelFolder> {
        self.folder.as_deref()
    }
}

/// Resolves when a weight swap has been installed (or refused).
#[derive(Debug)]
pub struct SwapReceipt {
    rx: oneshot::Receiver<Result<u64>>,
}

impl SwapReceipt {
    /// Blocks until the swap is done; returns the installed version. Never call it inside an async runtime.
    pub fn wait(self) -> Result<u64> {
        self.rx.blocking_recv().map_err(|_| Error::EngineStopped)?
    }

    /// Waits asynchronously until the swap is done; returns the installed version.
    pub async fn installed(self) -> Result<u64> {
        self.rx.await.map_err(|_| Error::EngineStopped)?
    }
}
