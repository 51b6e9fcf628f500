//! The inference engine abstraction the proxy serves the policy through, and its implementations: a
//! deterministic fake for tests and benches, an SGLang `/generate` client, a pool of SGLang servers with
//! paused weight updates ([`EnginePool`]), and [`GenerateServer`] ([`generate_router`]), which serves any
//! engine over SGLang's HTTP contract so that other machines (and this crate's tests) can reach it.
//!
//! The trait speaks token ids only; it knows nothing of HTTP, chat templates or sessions, beyond an opaque
//! affinity key per request ([`GenerateRequest::affinity`]) that routing may use.

mod fake;
mod pool;
mod serve;
mod sglang;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use futures::future::BoxFuture;

pub use fake::{FakeEngine, FakeEngineConfig};
pub use pool::{EnginePool, MAX_AFFINITY_KEYS, POOL_ATTEMPTS};
pub use serve::{GenerateServer, GenerateServerConfig, generate_router};
pub use sglang::{SglangConfig, SglangEngine};

/// The smallest temperature above 0 a generation may be sampled at. Below it the scaled logits `l / t` and
/// the recorded log-probabilities leave what f32 holds (at 1e-40, `1 / t` is infinite and the
/// log-probability NaN), and well before that they are useless for training; vLLM raises temperatures
/// under 0.01 to 0.01 for the same reason. The proxy refuses them instead of changing them, so the
/// distribution a token is drawn from is always the one recorded. 0 (greedy) stays allowed.
pub const MIN_TEMPERATURE: f32 = 0.01;

/// Checks a temperature named by a request, a session's `generation_args` or the run: 0, or finite and
/// at least [`MIN_TEMPERATURE`]. The error names the value.
pub(crate) fn check_temperature(t: f32) -> Result<(), String> {
    if t == 0.0 || (t.is_finite() && t >= MIN_TEMPERATURE) {
        Ok(())
    } else {
        Err(format!(
            "temperature must be 0 (greedy) or a finite number of at least {MIN_TEMPERATURE}, got {}",
            shown(t)
        ))
    }
}

/// Checks a top-p: in (0, 1]. The error names the value.
pub(crate) fn check_top_p(p: f32) -> Result<(), String> {
    if p > 0.0 && p <= 1.0 {
        Ok(())
    } else {
        Err(format!("top_p must be in (0, 1], got {}", shown(p)))
    }
}

/// A sampling value as a person reads it (`1e-40`, not forty zeros).
fn shown(v: f32) -> String {
    if v != 0.0 && v.is_finite() && !(1e-4..1e6).contains(&v.abs()) {
        format!("{v:e}")
    } else {
        format!("{v}")
    }
}

/// How to sample one generation.
///
/// Greedy decoding (`temperature` 0) ignores `top_p` and `top_k`: the argmax is drawn from no
/// distribution, and its token is recorded under the untempered, untruncated softmax (see
/// [`SampledToken::logprob`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    pub top_p: f32,
    /// Keep only the `top_k` most likely tokens; `None` keeps all.
    pub top_k: Option<u32>,
    /// The most tokens to generate.
    pub max_new_tokens: u32,
    /// Token ids that end the generation when sampled (the sampled stop token is part of the output).
    pub stop_token_ids: Vec<u32>,
    /// A seed for reproducible sampling.
    pub seed: Option<u64>,
}

impl SamplingParams {
    /// Whether the tokens are drawn from a truncated distribution: top-p below 1 or a top-k, and not
    /// greedy (greedy tokens are recorded untruncated).
    pub fn is_truncated(&self) -> bool {
        self.temperature > 0.0 && (self.top_p < 1.0 || self.top_k.is_some())
    }

    /// The temperature the recorded log-probabilities are of: `temperature`, or 1 for greedy decoding.
    pub fn logprob_temperature(&self) -> f32 {
        if self.temperature > 0.0 {
            self.temperature
        } else {
            1.0
        }
    }
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 16,
            stop_token_ids: Vec::new(),
            seed: None,
        }
    }
}

/// One generation to run.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt.
    pub input_ids: Arc<[u32]>,
    /// How to sample.
    pub sampling: SamplingParams,
    /// Image blocks of the conversation, exactly as the client sent them, in order; empty for text-only
    /// prompts. Only engines that declare [`InferenceEngine::supports_images`] receive any.
    pub images: Vec<serde_json::Value>,
    /// An opaque key that groups requests which share a prefix (the proxy sends its session id), so that an
    /// engine of several servers can send them to the same one and reuse its prefix cache; `None` has no
    /// preference. Engines give it no other meaning.
    pub affinity: Option<Arc<str>>,
}

/// One sampled token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledToken {
    /// The token id.
    pub id: u32,
    /// Its behaviour log-probability: the log-probability of the token under the distribution it was
    /// actually drawn from. That is the softmax of the logits divided by the temperature, restricted to the
    /// tokens top-k and top-p keep and renormalised over them when [`SamplingParams::is_truncated`]. A
    /// greedy token (temperature 0) is recorded under the plain softmax (temperature 1, untruncated),
    /// since the point mass it was taken from would always say 0. Every engine records this quantity;
    /// the trainer's importance weights rely on it.
    pub logprob: f32,
    /// The policy (weights) version that sampled it; it may change in the middle of a sequence.
    pub version: u32,
}

/// Why a generation ended.
#[derive(Debug, Clone, PartialEq)]
pub enum FinishReason {
    /// A stop token was sampled (`matched`), or the engine stopped on its own (`None`).
    Stop {
        /// The stop token id, when a stop token ended the generation.
        matched: Option<u32>,
    },
    /// `max_new_tokens` were generated.
    Length,
    /// The engine aborted the generation.
    Abort {
        /// Why.
        message: String,
    },
}

/// What a generation stream yields: tokens as they are sampled, then exactly one finish.
#[derive(Debug, Clone, PartialEq)]
pub enum EngineEvent {
    /// A token was sampled.
    Token(SampledToken),
    /// The generation ended; nothing follows.
    Finished(FinishReason),
}

/// A generation in progress. Dropping it aborts the generation.
pub type TokenStream = Pin<Box<dyn Stream<Item = Result<EngineEvent, EngineError>> + Send>>;

/// How a pause treats the generations in flight: SGLang's `/pause_generation` modes
/// (`python/sglang/srt/managers/io_struct.py`, `PauseGenerationReqInput.mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PauseMode {
    /// Running generations end with an abort finish.
    Abort,
    /// Running generations are kept and their key/value cache is dropped, to be recomputed on continue.
    #[default]
    Retract,
    /// Running generations are kept with their key/value cache; a cache flush fails until they finish.
    InPlace,
}

impl PauseMode {
    /// The name SGLang's wire uses.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Abort => "abort",
            Self::Retract => "retract",
            Self::InPlace => "in_place",
        }
    }

    /// The mode `name` names on the wire (`abort`, `retract`, `in_place`).
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "abort" => Some(Self::Abort),
            "retract" => Some(Self::Retract),
            "in_place" => Some(Self::InPlace),
            _ => None,
        }
    }
}

impl std::fmt::Display for PauseMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request to load new weights.
#[derive(Debug, Clone, PartialEq)]
pub struct WeightUpdate {
    /// Where the weights are (a folder the engine can read).
    pub path: PathBuf,
    /// The policy version the new weights are; `None` lets the engine count on from its current one.
    pub version: Option<u32>,
}

/// Errors of an inference engine.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EngineError {
    /// The engine does not implement this operation.
    #[error("the engine does not support {0}")]
    Unsupported(&'static str),
    /// The prompt does not fit the engine's context window.
    #[error("the prompt has {prompt} tokens but the context window holds {max}")]
    ContextLengthExceeded {
        /// Prompt tokens.
        prompt: usize,
        /// The context window.
        max: usize,
    },
    /// The engine refused the request as invalid.
    #[error("the engine refused the request: {0}")]
    InvalidRequest(String),
    /// The engine could not be reached.
    #[error("engine transport failed: {0}")]
    Transport(String),
    /// The engine answered with an HTTP error.
    #[error("engine answered HTTP {status}: {body}")]
    Upstream {
        /// The status code.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// The engine's answer could not be understood.
    #[error("engine answered something unexpected: {0}")]
    Protocol(String),
    /// The engine failed internally.
    #[error("engine failed: {0}")]
    Internal(String),
}

/// A policy that generates tokens. Object-safe: the proxy holds an `Arc<dyn InferenceEngine>`.
///
/// What an engine returns as a token's log-probability is fixed by this trait, whatever the engine's
/// own convention: the log-probability under the distribution the token was drawn from, tempered, and
/// truncated and renormalised when top-k or top-p truncate; greedy tokens at temperature 1, untruncated
/// ([`SampledToken::logprob`]). The in-process sampler (`trainer::sampling::sample`) records exactly
/// that; [`FakeEngine`] records scripted or pseudo-random values and claims nothing about a
/// distribution; [`SglangEngine`] converts SGLang's tempered, untruncated log-probabilities into it
/// (its module documents how, from SGLang's own sampler).
pub trait InferenceEngine: Send + Sync {
    /// Starts a generation. The stream yields tokens as they are sampled and then one
    /// [`EngineEvent::Finished`]; dropping it aborts the generation. Each token's `logprob` is its
    /// behaviour log-probability as [`SampledToken::logprob`] defines it.
    fn generate(&self, request: GenerateRequest) -> TokenStream;

    /// The most tokens a prompt plus its generation may hold.
    fn max_context_len(&self) -> usize;

    /// Whether the engine accepts image inputs.
    fn supports_images(&self) -> bool {
        false
    }

    /// Loads new weights from disk (weight sync); unsupported unless an engine implements it.
    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        let _ = update;
        Box::pin(async { Err(EngineError::Unsupported("update_weights_from_disk")) })
    }

    /// Drops cached prefixes (after a weight update); unsupported unless an engine implements it.
    fn flush_cache(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async { Err(EngineError::Unsupported("flush_cache")) })
    }

    /// Holds generation between two steps until [`InferenceEngine::resume`]: no token is sampled and no
    /// request admitted, while weight updates are still taken, so tokens sampled after the resume carry the
    /// new version. An engine that only holds its own work treats every `mode` alike (aborting is its
    /// server's business); unsupported unless an engine implements it.
    fn pause(&self, mode: PauseMode) -> BoxFuture<'_, Result<(), EngineError>> {
        let _ = mode;
        Box::pin(async { Err(EngineError::Unsupported("pause")) })
    }

    /// Lifts a [`InferenceEngine::pause`].
    fn resume(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async { Err(EngineError::Unsupported("resume")) })
    }
}
