//! [`SglangEngine`]: an [`InferenceEngine`] backed by an SGLang server's native HTTP API over plain HTTP/1.1
//! (token ids in, token ids and logprobs out, streamed), with weight-sync passthrough.
//!
//! It speaks SGLang's contract as SGLang's own source defines it (`python/sglang/srt/entrypoints/http_server.py`,
//! `managers/tokenizer_manager.py`):
//!
//! - Readiness: [`SglangEngine::connect`] waits while `/health` answers 503 (the server is starting) or the
//!   server cannot be reached yet, within [`SglangConfig::ready_timeout`].
//! - The context window: `/get_server_info`'s `context_length` when the server was started with one, else
//!   `/v1/models`' `max_model_len` (a default server reports `context_length: null`). SGLang refuses a
//!   prompt plus `max_new_tokens` that reaches the window, so the engine declares one token less and the
//!   proxy's caps never ask for a refused request.
//! - Streams: cumulative chunks (the default, each chunk repeats every token so far) and incremental ones
//!   (`--incremental-streaming-output`), told apart by the running `completion_tokens` count.
//! - Refusals: a 400, or for a streaming request a `data: {"error": ...}` chunk after the 200 header, mean the
//!   same; SGLang's two context-window refusals become [`EngineError::ContextLengthExceeded`] (the proxy's
//!   context-overflow path), other validation errors [`EngineError::InvalidRequest`].
//! - A `null` logprob (SGLang's serialisation of NaN) is a protocol error, never a number.
//! - Versions are strings on the wire: the loop's version in decimal, and `"default"` (a fresh server's)
//!   is version 0; anything else is a protocol error. Each token's version comes from the
//!   `meta_info.weight_versions` spans, else `weight_version`, else the version this client last installed.
//! - Weight updates: `/update_weights_from_disk` with `weight_version`, then `/get_weight_version` must
//!   answer it. Pausing around an update is [`crate::InferenceEngine::pause`] (`/pause_generation` with the
//!   configured [`PauseMode`]) and [`crate::InferenceEngine::resume`] (`/continue_generation`); an update
//!   flushes the cache unless the pause is `in_place` (whose held requests make a flush fail), so this
//!   client never calls `/flush_cache`, which answers 400 whenever requests run.
//! - `--api-key`: with [`SglangConfig::api_key`] every request carries `Authorization: Bearer <key>`.
//! - Interrupted turns continue: a generation the server aborts (an `abort` pause, an abort without a 4xx
//!   `status_code`) is resubmitted with the tokens produced so far appended to its prompt and the rest of its
//!   `max_new_tokens`, up to [`SglangConfig::max_resubmits`] times, so its caller sees one generation whose
//!   tokens each keep the version they were sampled under.
//!
//! # Which log-probabilities SGLang returns, and what this client records
//!
//! [`crate::InferenceEngine`] fixes the recorded quantity: the log-probability under the distribution the
//! token was drawn from, tempered, and truncated and renormalised when top-k or top-p truncate; greedy
//! tokens at temperature 1. SGLang's `/generate` with `return_logprob` returns something else when
//! sampling is truncated. From its source (`python/sglang/srt/layers/sampler.py`, `Sampler.forward`, on
//! the 2025-2026 main line): the standard path divides the logits by the temperature, takes the softmax
//! `probs`, samples through `_sample_from_probs` (whose top-k / top-p / min-p renormalisation works on its
//! own copy), and returns `torch.log(probs)`: **tempered and untruncated**. sgl-project/sglang#5961 (May
//! 2025) made it so; before it, `top_p_normalize_probs_torch` renormalised over top-p (never top-k), as
//! #2664 had introduced. Greedy requests are rewritten to temperature 1 and top-k 1
//! (`python/sglang/srt/sampling/sampling_params.py`, `SamplingParams.__init__`), and an all-greedy batch
//! returns `log_softmax(logits)`: temperature 1, untruncated, which is what the trait asks for. No
//! request field selects the truncated quantity. One server setting changes the answer: the environment
//! variable `SGLANG_RETURN_ORIGINAL_LOGPROB` (sgl-project/sglang#8375) returns the untempered
//! `log_softmax(logits)`, which no client can convert back, so it must stay unset on policy servers;
//! `--rl-on-policy-target` keeps the tempered values (computed with `log_softmax` in bf16).
//!
//! So when a request truncates (top-p below 1 or a top-k, not greedy), this client also asks for
//! `top_logprobs_num` (the top-k, at most [`SglangConfig::truncation_logprobs`]) and renormalises each
//! token's log-probability over the tokens SGLang's sampler kept: it keeps a token when it is among the
//! top-k and the probability mass before it is at most top-p (both on the tempered distribution:
//! flashinfer's `top_k_top_p_sampling_from_probs` with `filter_apply_order="joint"`, and
//! `top_k_top_p_min_p_sampling_from_probs_torch` alike). The kept mass is exact when the returned list
//! reaches the top-p boundary or the top-k; otherwise the tail is estimated (half the most it can hold),
//! an error of at most half the smallest returned probability over top-p in the log. A server whose
//! chunks say `"logprob_distribution": "sampled"` in `meta_info` (our own [`crate::generate_router`],
//! which serves engines that already record the sampled distribution) is taken as is.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::future::BoxFuture;
use futures::stream;
use http::{Method, Request, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, PauseMode, SampledToken,
    TokenStream, WeightUpdate,
};

#[cfg(test)]
mod tests;

/// Where an SGLang server is and what it can do.
#[derive(Debug, Clone)]
pub struct SglangConfig {
    /// The server's base URL, `http://host:port` (plain HTTP; SGLang runs inside the cluster).
    pub base_url: String,
    /// The server's context window; `None` asks the server (`/get_server_info`'s `context_length`, else
    /// `/v1/models`' `max_model_len`). The engine declares one token less (see the module docs).
    pub max_context_len: Option<usize>,
    /// Whether the served model accepts images.
    pub supports_images: bool,
    /// Stream tokens as they are sampled (otherwise one answer per generation).
    pub stream: bool,
    /// Connect timeout.
    pub connect_timeout: Duration,
    /// The whole of every call but `/generate` and the weight update (`/health`, `/get_server_info`,
    /// `/v1/models`, `/pause_generation`, `/continue_generation`, `/get_weight_version`): its answer's head
    /// and body. Past it the call is a transport error, so a server that accepts and never answers cannot
    /// hold a pause, an update or [`SglangEngine::connect`] (whose readiness probes each get the shorter of
    /// this and what is left of [`SglangConfig::ready_timeout`]).
    pub request_timeout: Duration,
    /// The whole of `/update_weights_from_disk` (loading a large checkpoint takes minutes).
    pub weight_update_timeout: Duration,
    /// `/generate`: the longest wait for its answer's head and then between two pieces of its body (a
    /// streamed chunk, or a non-streamed answer whole). Long enough for a generation held by a pause
    /// around a weight update, or queued behind a full batch.
    pub generate_idle_timeout: Duration,
    /// The most top log-probabilities per token to ask for when a request truncates (top-p below 1 or a
    /// top-k), to renormalise SGLang's untruncated log-probabilities over the kept tokens (see the
    /// module docs).
    pub truncation_logprobs: u32,
    /// SGLang's `--api-key`, sent as `Authorization: Bearer <key>` on every request.
    pub api_key: Option<SecretString>,
    /// How [`crate::InferenceEngine::pause`] pauses the server before a weight update.
    pub pause_mode: PauseMode,
    /// How many times one generation that the server aborts (an `abort` pause, a restart) is resubmitted
    /// with the tokens produced so far, so that its caller sees one uninterrupted generation; 0 passes the
    /// abort on.
    pub max_resubmits: u32,
    /// How long [`SglangEngine::connect`] waits for `/health` to answer 200; `None` does not ask.
    pub ready_timeout: Option<Duration>,
}

impl SglangConfig {
    /// Defaults for a server at `base_url`.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self {
            base_url: base_url.into(),
            max_context_len: None,
            supports_images: false,
            stream: true,
            connect_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(60),
            weight_update_timeout: Duration::from_secs(1800),
            generate_idle_timeout: Duration::from_secs(600),
            truncation_logprobs: 64,
            api_key: None,
            pause_mode: PauseMode::default(),
            max_resubmits: 8,
            ready_timeout: Some(Duration::from_secs(300)),
        }
    }
}

/// An SGLang server as an [`InferenceEngine`].
#[derive(Debug, Clone)]
pub struct SglangEngine {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    base: String,
    client: Client<HttpConnector, Full<Bytes>>,
    max_context_len: usize,
    supports_images: bool,
    stream: bool,
    truncation_logprobs: u32,
    version: AtomicU32,
    api_key: Option<SecretString>,
    pause_mode: PauseMode,
    max_resubmits: u32,
    request_timeout: Duration,
    weight_update_timeout: Duration,
    generate_idle_timeout: Duration,
}

#[derive(Serialize)]
struct WireGenerate<'a> {
    input_ids: &'a [u32],
    sampling_params: WireSampling<'a>,
    return_logprob: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_logprobs_num: Option<u32>,
    stream: bool,
    #[serde(skip_serializing_if = "<[Value]>::is_empty")]
    image_data: &'a [Value],
}

#[derive(Serialize)]
struct WireSampling<'a> {
    temperature: f32,
    top_p: f32,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_k: Option<u32>,
    max_new_tokens: u32,
    #[serde(skip_serializing_if = "<[u32]>::is_empty")]
    stop_token_ids: &'a [u32],
    #[serde(skip_serializing_if = "Option::is_none")]
    sampling_seed: Option<u64>,
    skip_special_tokens: bool,
    no_stop_trim: bool,
}

#[derive(Deserialize)]
struct WireChunk {
    #[serde(default)]
    meta_info: Option<WireMeta>,
    #[serde(default)]
    error: Option<Value>,
}

/// One `[logprob, token_id, text]` entry; a NaN logprob arrives as `null`.
type WireLogprob = (Option<f64>, u32, Option<Value>);

#[derive(Deserialize)]
struct WireMeta {
    #[serde(default)]
    finish_reason: Option<Value>,
    #[serde(default)]
    completion_tokens: Option<usize>,
    #[serde(default)]
    output_token_logprobs: Vec<WireLogprob>,
    /// Per output token, the most likely tokens' log-probabilities, most likely first (with
    /// `top_logprobs_num`).
    #[serde(default)]
    output_top_logprobs: Vec<Option<Vec<WireLogprob>>>,
    /// `"sampled"` when the logprobs already are of the distribution each token was drawn from.
    #[serde(default)]
    logprob_distribution: Option<String>,
    #[serde(default)]
    weight_version: Option<Value>,
    #[serde(default)]
    weight_versions: Vec<WireSpan>,
}

#[derive(Deserialize)]
struct WireSpan {
    version: Value,
    start: usize,
    end: usize,
}

/// A wire weight version: the loop's version in decimal, or a fresh server's `"default"` (version 0).
pub(crate) fn parse_version(v: &Value) -> Result<u32, EngineError> {
    match v {
        Value::String(s) if s == "default" => Ok(0),
        Value::String(s) if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) => s
            .parse()
            .map_err(|_| EngineError::Protocol(format!("weight version {s:?} is out of range"))),
        other => Err(EngineError::Protocol(format!(
            "weight version {other} is neither \"default\" nor a decimal version this client installed"
        ))),
    }
}

impl SglangEngine {
    /// A client for `config`, asking the server for its context window when the config does not say.
    pub async fn connect(config: SglangConfig) -> Result<Self, EngineError> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(config.connect_timeout));
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(usize::MAX)
            .build(connector);
        let base = config.base_url.trim_end_matches('/').to_string();
        if !base.starts_with("http://") {
            return Err(EngineError::InvalidRequest(format!(
                "the SGLang base URL must be plain http://host:port, got {base:?}"
            )));
        }
        let mut inner = Inner {
            base,
            client,
            max_context_len: config.max_context_len.unwrap_or(0),
            supports_images: config.supports_images,
            stream: config.stream,
            truncation_logprobs: config.truncation_logprobs.max(1),
            version: AtomicU32::new(0),
            api_key: config.api_key,
            pause_mode: config.pause_mode,
            max_resubmits: config.max_resubmits,
            request_timeout: config.request_timeout,
            weight_update_timeout: config.weight_update_timeout,
            generate_idle_timeout: config.generate_idle_timeout,
        };
        if let Some(timeout) = config.ready_timeout {
            inner.wait_ready(timeout).await?;
        }
        if config.max_context_len.is_none() {
            inner.max_context_len = inner.context_in_force().await?;
        }
        // SGLang refuses a prompt plus max_new_tokens that reaches the window (`_validate_one_request`).
        inner.max_context_len = inner.max_context_len.saturating_sub(1);
        Ok(Self {
            inner: Arc::new(inner),
        })
    }
}

/// What an SGLang refusal (an HTTP error, or a streamed error chunk) means: a prompt over the context window
/// is a context overflow (the proxy's context-overflow path), another 400 the client's invalid request,
/// anything else the upstream's error.
fn refusal(status: u16, body: &str) -> EngineError {
    let body: String = body.chars().take(500).collect();
    if status != 400 {
        return EngineError::Upstream { status, body };
    }
    let message = serde_json::from_str::<Value>(&body)
        .ok()
        .and_then(|v| {
            v.pointer("/error/message")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or(body);
    context_overflow(&message).unwrap_or(EngineError::InvalidRequest(message))
}

/// SGLang's two context-window refusals (`tokenizer_manager.py`'s `_validate_one_request`): "The input (N
/// tokens) is longer than the model's context length (M tokens)." and "Requested token count exceeds the
/// model's maximum context length of M tokens. You requested a total of T tokens: N tokens from the input
/// messages and K tokens for the completion. ..."
fn context_overflow(message: &str) -> Option<EngineError> {
    fn number_after<'a>(text: &'a str, marker: &str) -> Option<(usize, &'a str)> {
        let rest = &text[text.find(marker)? + marker.len()..];
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        Some((rest[..end].parse().ok()?, &rest[end..]))
    }
    if let Some((prompt, rest)) = number_after(message, "The input (")
        && let Some((max, _)) = number_after(rest, "context length (")
    {
        return Some(EngineError::ContextLengthExceeded { prompt, max });
    }
    let (max, rest) = number_after(message, "maximum context length of ")?;
    let (_total, rest) = number_after(rest, "a total of ")?;
    let (prompt, _) = number_after(rest, "tokens: ")?;
    Some(EngineError::ContextLengthExceeded { prompt, max })
}

impl Inner {
    /// Waits until `/health` answers 200: while it answers 503 (starting) or the server cannot be reached,
    /// it asks again every half second, up to `timeout`; any other answer is an error at once.
    async fn wait_ready(&self, timeout: Duration) -> Result<(), EngineError> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            // Each probe may take what is left of the wait, and at least the pause between probes, so the
            // last probe past the deadline still hears a starting server's 503.
            let probe = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(Duration::from_millis(500))
                .min(self.request_timeout);
            let last = match self
                .call_within(Method::GET, "/health", Bytes::new(), probe)
                .await
            {
                Ok(_) => return Ok(()),
                Err(EngineError::Upstream { status: 503, .. }) => "answers 503 (starting)".to_string(),
                Err(EngineError::Transport(e)) => format!("cannot be reached ({e})"),
                Err(e) => return Err(e),
            };
            if tokio::time::Instant::now() >= deadline {
                return Err(EngineError::Transport(format!(
                    "the SGLang server {} is not ready after {:?}: /health {last}",
                    self.base, timeout
                )));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The server's context window: `/get_server_info`'s `context_length` when the server was started with
    /// one, else `/v1/models`' `data[0].max_model_len`, the length in force (a default SGLang server reports
    /// `context_length: null`, "use the model's config.json"; `http_server.py` and `serving_models`).
    async fn context_in_force(&self) -> Result<usize, EngineError> {
        let json = |path: &'static str, body: Bytes| {
            serde_json::from_slice::<Value>(&body)
                .map_err(|e| EngineError::Protocol(format!("{path} is not JSON: {e}")))
        };
        let count = |v: Option<&Value>| v.and_then(Value::as_u64).and_then(|n| usize::try_from(n).ok());
        let info = json(
            "/get_server_info",
            self.call(Method::GET, "/get_server_info", Bytes::new()).await?,
        )?;
        if let Some(n) = count(info.get("context_length")) {
            return Ok(n);
        }
        let models = json(
            "/v1/models",
            self.call(Method::GET, "/v1/models", Bytes::new()).await?,
        )?;
        count(models.pointer("/data/0/max_model_len")).ok_or_else(|| {
            EngineError::Protocol(
                "neither /get_server_info's context_length nor /v1/models' data[0].max_model_len is a number; \
                 configure max_context_len"
                    .into(),
            )
        })
    }

    fn uri(&self, path: &str) -> Result<Uri, EngineError> {
        format!("{}{path}", self.base)
            .parse()
            .map_err(|e| EngineError::InvalidRequest(format!("bad SGLang URL: {e}")))
    }

    /// Sends a request and waits at most `limit` for its answer's head; a refusal's body is read within
    /// what is left of `limit` and at most [`ERROR_BODY_LIMIT`] bytes of it.
    async fn send(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        limit: Duration,
    ) -> Result<hyper::body::Incoming, EngineError> {
        let until = tokio::time::Instant::now() + limit;
        let mut request = Request::builder()
            .method(method)
            .uri(self.uri(path)?)
            .header(header::CONTENT_TYPE, "application/json");
        if let Some(key) = &self.api_key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {}", key.expose_secret()));
        }
        let request = request
            .body(Full::new(body))
            .map_err(|e| EngineError::Internal(e.to_string()))?;
        let response = tokio::time::timeout_at(until, self.client.request(request))
            .await
            .map_err(|_| no_answer(path, limit))?
            .map_err(|e| EngineError::Transport(format!("{path}: {e}")))?;
        let status = response.status();
        if !status.is_success() {
            // What a refusal says is only ever shown cut to 500 characters, and a broken server may send
            // an endless body: read a little of it, for no longer than the call may take.
            let body = read_limited(response.into_body(), ERROR_BODY_LIMIT, until, path, limit)
                .await
                .map(|(b, _)| b)
                .unwrap_or_default();
            return Err(refusal(status.as_u16(), &String::from_utf8_lossy(&body)));
        }
        Ok(response.into_body())
    }

    /// A whole call (head and body) within [`SglangConfig::request_timeout`].
    async fn call(&self, method: Method, path: &str, body: Bytes) -> Result<Bytes, EngineError> {
        self.call_within(method, path, body, self.request_timeout).await
    }

    /// A whole call (head and body) within `limit`, its answer at most [`ANSWER_LIMIT`] bytes.
    async fn call_within(
        &self,
        method: Method,
        path: &str,
        body: Bytes,
        limit: Duration,
    ) -> Result<Bytes, EngineError> {
        let until = tokio::time::Instant::now() + limit;
        let body = self.send(method, path, body, limit).await?;
        match read_limited(body, ANSWER_LIMIT, until, path, limit).await? {
            (bytes, false) => Ok(bytes),
            (_, true) => Err(EngineError::Protocol(format!(
                "{path}: the answer is longer than {ANSWER_LIMIT} bytes"
            ))),
        }
    }
}

/// The most of a refusal's body the client reads.
const ERROR_BODY_LIMIT: usize = 64 * 1024;

/// The most of a control call's answer the client reads (`/get_server_info` is a few KiB).
const ANSWER_LIMIT: usize = 4 * 1024 * 1024;

fn no_answer(path: &str, limit: Duration) -> EngineError {
    EngineError::Transport(format!("{path}: no complete answer within {limit:?}"))
}

/// Reads `body` until its end, `max` bytes (then answers what it read and `true`), or `until`.
async fn read_limited(
    mut body: hyper::body::Incoming,
    max: usize,
    until: tokio::time::Instant,
    path: &str,
    limit: Duration,
) -> Result<(Bytes, bool), EngineError> {
    let mut out = BytesMut::new();
    loop {
        match tokio::time::timeout_at(until, body.frame()).await {
            Err(_) => return Err(no_answer(path, limit)),
            Ok(None) => return Ok((out.freeze(), false)),
            Ok(Some(Err(e))) => return Err(EngineError::Transport(format!("{path}: {e}"))),
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    let room = max - out.len();
                    out.extend_from_slice(&data[..data.len().min(room)]);
                    if data.len() > room {
                        return Ok((out.freeze(), true));
                    }
                }
            }
        }
    }
}

/// How a request truncates, for renormalising SGLang's log-probabilities.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Truncation {
    top_p: f64,
    top_k: Option<usize>,
}

/// The probability mass SGLang's sampler keeps, from the most likely tokens' log-probabilities (most
/// likely first, tempered): a token stays when it is among the `top_k` and the mass before it is at most
/// `top_p`. An unreturned tail is estimated as half the most it can hold.
fn kept_mass(top: &[f64], t: Truncation) -> f64 {
    let limit = t.top_k.map_or(top.len(), |k| k.min(top.len()));
    let mut mass = 0.0;
    for lp in &top[..limit] {
        if mass > t.top_p {
            return mass;
        }
        mass += lp.exp();
    }
    let cut = mass > t.top_p || t.top_k.is_some_and(|k| k <= top.len());
    if cut || top.is_empty() {
        return mass.clamp(f64::MIN_POSITIVE, 1.0);
    }
    // The list ended inside the kept set. Every unreturned token is at most as likely as the last one, and
    // the kept set ends with the first token that takes the mass past top-p (or at the top-k).
    let smallest = top[top.len() - 1].exp();
    let (lower, room) = match t.top_k {
        Some(k) => (mass, (k - top.len()) as f64 * smallest),
        None => (t.top_p.max(mass), f64::INFINITY),
    };
    let upper = (mass + room).min(t.top_p + smallest).min(1.0).max(lower);
    ((lower + upper) / 2.0).clamp(f64::MIN_POSITIVE, 1.0)
}

/// Turns SGLang chunks into engine events.
struct Decoder {
    emitted: usize,
    fallback_version: u32,
    finished: bool,
    truncation: Option<Truncation>,
    /// Whether the abort that finished the generation carried a 4xx `status_code`.
    abort_is_refusal: bool,
}

impl Decoder {
    fn new(fallback_version: u32, truncation: Option<Truncation>) -> Self {
        Self {
            emitted: 0,
            fallback_version,
            finished: false,
            truncation,
            abort_is_refusal: false,
        }
    }
}

impl Decoder {
    fn chunk(&mut self, data: &[u8], out: &mut VecDeque<Result<EngineEvent, EngineError>>) {
        let chunk: WireChunk = match serde_json::from_slice(data) {
            Ok(c) => c,
            Err(e) => {
                out.push_back(Err(EngineError::Protocol(format!(
                    "a /generate chunk is not valid: {e}"
                ))));
                self.finished = true;
                return;
            }
        };
        if let Some(error) = chunk.error {
            // A streaming request's validation error arrives after the 200 header as an error chunk
            // (`tokenizer_manager.py`); it means what the non-streaming request's 400 would.
            let message = error
                .get("message")
                .and_then(Value::as_str)
                .map_or_else(|| error.to_string(), str::to_string);
            out.push_back(Err(refusal(400, &message)));
            self.finished = true;
            return;
        }
        let Some(meta) = chunk.meta_info else {
            out.push_back(Err(EngineError::Protocol(
                "a /generate chunk has no meta_info".into(),
            )));
            self.finished = true;
            return;
        };
        let list = &meta.output_token_logprobs;
        let total = meta.completion_tokens.unwrap_or(self.emitted + list.len());
        let (new, first_index) = if list.len() == total && total >= self.emitted {
            (&list[self.emitted..], self.emitted)
        } else if self.emitted + list.len() == total {
            (&list[..], self.emitted)
        } else {
            out.push_back(Err(EngineError::Protocol(format!(
                "a /generate chunk has {} logprobs for {total} completion tokens after {} seen",
                list.len(),
                self.emitted
            ))));
            self.finished = true;
            return;
        };
        let default_version = match meta.weight_version.as_ref().map(parse_version) {
            None => self.fallback_version,
            Some(Ok(v)) => v,
            Some(Err(e)) => {
                out.push_back(Err(e));
                self.finished = true;
                return;
            }
        };
        let renormalise = self
            .truncation
            .filter(|_| meta.logprob_distribution.as_deref() != Some("sampled"));
        let tops = &meta.output_top_logprobs;
        let top_offset = list.len() - new.len();
        for (offset, (logprob, id, _)) in new.iter().enumerate() {
            let index = first_index + offset;
            // SGLang writes a NaN logprob as null; recording any number in its place would corrupt the
            // importance weights silently.
            let Some(mut logprob) = *logprob else {
                out.push_back(Err(EngineError::Protocol(format!(
                    "output token {index} has a null (NaN) logprob"
                ))));
                self.finished = true;
                return;
            };
            if let Some(t) = renormalise {
                let Some(Some(top)) = tops.get(top_offset + offset) else {
                    out.push_back(Err(EngineError::Protocol(format!(
                        "output token {index} has no output_top_logprobs, which renormalising truncated sampling needs"
                    ))));
                    self.finished = true;
                    return;
                };
                let top: Vec<f64> = top.iter().filter_map(|(lp, _, _)| *lp).collect();
                logprob -= kept_mass(&top, t).ln();
            }
            let version = match meta
                .weight_versions
                .iter()
                .find(|s| s.start <= index && index < s.end)
                .map(|s| parse_version(&s.version))
            {
                None => default_version,
                Some(Ok(v)) => v,
                Some(Err(e)) => {
                    out.push_back(Err(e));
                    self.finished = true;
                    return;
                }
            };
            out.push_back(Ok(EngineEvent::Token(SampledToken {
                id: *id,
                logprob: logprob as f32,
                version,
            })));
        }
        self.emitted = total;
        if let Some(reason) = meta.finish_reason.filter(|r| !r.is_null()) {
            let kind = reason.get("type").and_then(Value::as_str).unwrap_or("");
            let finish = match kind {
                "stop" => FinishReason::Stop {
                    matched: reason
                        .get("matched")
                        .and_then(Value::as_u64)
                        .and_then(|m| u32::try_from(m).ok()),
                },
                "length" => FinishReason::Length,
                _ => {
                    // An abort that carries a client-error status is a refusal, not an interruption.
                    self.abort_is_refusal = reason
                        .get("status_code")
                        .and_then(Value::as_u64)
                        .is_some_and(|code| (400..500).contains(&code));
                    FinishReason::Abort {
                        message: reason
                            .get("message")
                            .and_then(Value::as_str)
                            .unwrap_or(kind)
                            .to_string(),
                    }
                }
            };
            out.push_back(Ok(EngineEvent::Finished(finish)));
            self.finished = true;
        }
    }
}

struct StreamState {
    inner: Arc<Inner>,
    body: Option<Bytes>,
    incoming: Option<hyper::body::Incoming>,
    buf: BytesMut,
    pending: VecDeque<Result<EngineEvent, EngineError>>,
    decoder: Decoder,
    streaming: bool,
    resume: Resume,
}

/// What resubmitting an interrupted generation needs: the prompt, the request as sent, the tokens produced
/// so far across every submission, and how many more submissions are allowed.
struct Resume {
    prompt: Arc<[u32]>,
    /// The first submission's body; a resubmission parses it again (rarely needed, so never kept parsed).
    request: Bytes,
    produced: Vec<u32>,
    max_new_tokens: u32,
    left: u32,
}

impl StreamState {
    /// Resubmits an interrupted generation with the tokens produced so far appended to its prompt and the
    /// rest of its budget (the reference's interruptible generation); `None` when that is not allowed,
    /// `Some(finish)` when the budget is already spent.
    fn resubmit(&mut self) -> Option<Option<FinishReason>> {
        if self.resume.left == 0 || self.decoder.abort_is_refusal {
            return None;
        }
        let produced = u32::try_from(self.resume.produced.len()).unwrap_or(u32::MAX);
        let remaining = self.resume.max_new_tokens.saturating_sub(produced);
        if remaining == 0 {
            return Some(Some(FinishReason::Length));
        }
        self.resume.left -= 1;
        let mut input: Vec<u32> = self.resume.prompt.to_vec();
        input.extend_from_slice(&self.resume.produced);
        let Ok(mut request) = serde_json::from_slice::<Value>(&self.resume.request) else {
            return None;
        };
        request["input_ids"] = Value::from(input);
        request["sampling_params"]["max_new_tokens"] = Value::from(remaining);
        tracing::debug!(server = %self.inner.base, produced, remaining, "resubmitting an aborted generation");
        self.body = Some(Bytes::from(request.to_string()));
        self.incoming = None;
        self.buf.clear();
        self.decoder = Decoder::new(
            self.inner.version.load(Ordering::Relaxed),
            self.decoder.truncation,
        );
        Some(None)
    }

    async fn next(&mut self) -> Option<Result<EngineEvent, EngineError>> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                match &event {
                    Ok(EngineEvent::Token(t)) => self.resume.produced.push(t.id),
                    Ok(EngineEvent::Finished(FinishReason::Abort { .. })) => match self.resubmit() {
                        None => {}
                        Some(None) => continue,
                        Some(Some(finish)) => return Some(Ok(EngineEvent::Finished(finish))),
                    },
                    _ => {}
                }
                return Some(event);
            }
            if self.decoder.finished {
                return None;
            }
            let Some(incoming) = self.incoming.as_mut() else {
                let body = self.body.take()?;
                let idle = self.inner.generate_idle_timeout;
                match self.inner.send(Method::POST, "/generate", body, idle).await {
                    Ok(incoming) => self.incoming = Some(incoming),
                    Err(e) => {
                        self.decoder.finished = true;
                        return Some(Err(e));
                    }
                }
                continue;
            };
            let idle = self.inner.generate_idle_timeout;
            let Ok(frame) = tokio::time::timeout(idle, incoming.frame()).await else {
                self.decoder.finished = true;
                return Some(Err(EngineError::Transport(format!(
                    "/generate: nothing from the server for {idle:?}"
                ))));
            };
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                    if self.streaming {
                        self.drain_events();
                    }
                }
                Some(Err(e)) => {
                    self.decoder.finished = true;
                    return Some(Err(EngineError::Transport(format!("/generate: {e}"))));
                }
                None => {
                    if !self.streaming {
                        let body = std::mem::take(&mut self.buf);
                        self.decoder.chunk(&body, &mut self.pending);
                    } else {
                        self.drain_events();
                    }
                    if !self.decoder.finished && self.pending.is_empty() {
                        self.decoder.finished = true;
                        return Some(Err(EngineError::Protocol(
                            "/generate ended before the generation finished".into(),
                        )));
                    }
                }
            }
        }
    }

    fn drain_events(&mut self) {
        while let Some(end) = find_event_end(&self.buf) {
            let event = self.buf.split_to(end.0);
            let _separator = self.buf.split_to(end.1);
            for line in event[..].split(|b: &u8| *b == b'\n') {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                let Some(data) = line.strip_prefix(b"data:") else {
                    continue;
                };
                let data = data.strip_prefix(b" ").unwrap_or(data);
                if data == b"[DONE]" || self.decoder.finished {
                    continue;
                }
                self.decoder.chunk(data, &mut self.pending);
            }
        }
    }
}

/// The end of the first SSE event in `buf`: (event length, separator length).
fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' && buf[i + 1] == b'\n' {
            return Some((i, 2));
        }
        if buf[i] == b'\r'
            && buf[i + 1] == b'\n'
            && buf.get(i + 2) == Some(&b'\r')
            && buf.get(i + 3) == Some(&b'\n')
        {
            return Some((i, 4));
        }
        i += 1;
    }
    None
}

impl InferenceEngine for SglangEngine {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        let sampling = &request.sampling;
        let truncation = sampling.is_truncated().then(|| Truncation {
            top_p: f64::from(sampling.top_p),
            top_k: sampling.top_k.map(|k| k as usize),
        });
        let top_logprobs_num = truncation.map(|t| {
            t.top_k
                .map_or(self.inner.truncation_logprobs, |k| {
                    u32::try_from(k).unwrap_or(u32::MAX)
                })
                .min(self.inner.truncation_logprobs)
        });
        let wire = WireGenerate {
            input_ids: &request.input_ids,
            sampling_params: WireSampling {
                temperature: sampling.temperature,
                top_p: sampling.top_p,
                top_k: sampling.top_k,
                max_new_tokens: sampling.max_new_tokens,
                stop_token_ids: &sampling.stop_token_ids,
                sampling_seed: sampling.seed,
                skip_special_tokens: false,
                no_stop_trim: true,
            },
            return_logprob: true,
            top_logprobs_num,
            stream: self.inner.stream,
            image_data: &request.images,
        };
        // Straight to bytes: a tree of the prompt's ids would cost an allocation per id on every request.
        let body = match serde_json::to_vec(&wire) {
            Ok(v) => Bytes::from(v),
            Err(e) => {
                let error = EngineError::Internal(format!("encoding /generate: {e}"));
                return Box::pin(stream::once(async move { Err(error) }));
            }
        };
        let state = StreamState {
            inner: self.inner.clone(),
            body: Some(body.clone()),
            incoming: None,
            buf: BytesMut::new(),
            pending: VecDeque::new(),
            decoder: Decoder::new(self.inner.version.load(Ordering::Relaxed), truncation),
            streaming: self.inner.stream,
            resume: Resume {
                prompt: request.input_ids.clone(),
                request: body,
                produced: Vec::new(),
                max_new_tokens: sampling.max_new_tokens,
                left: self.inner.max_resubmits,
            },
        };
        Box::pin(stream::unfold(state, |mut st| async move {
            let event = st.next().await?;
            Some((event, st))
        }))
    }

    fn max_context_len(&self) -> usize {
        self.inner.max_context_len
    }

    fn supports_images(&self) -> bool {
        self.inner.supports_images
    }

    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let version = update
                .version
                .unwrap_or_else(|| self.inner.version.load(Ordering::Relaxed) + 1);
            let body = serde_json::json!({
                "model_path": update.path,
                "weight_version": version.to_string(),
                // Requests held in place keep their cache, and a flush then fails (`scheduler.py`).
                "flush_cache": self.inner.pause_mode != PauseMode::InPlace,
            });
            let answer = match self
                .inner
                .call_within(
                    Method::POST,
                    "/update_weights_from_disk",
                    Bytes::from(body.to_string()),
                    self.inner.weight_update_timeout,
                )
                .await
            {
                Ok(answer) => answer,
                Err(EngineError::InvalidRequest(body)) => Bytes::from(body),
                Err(e) => return Err(e),
            };
            let answer: Value = serde_json::from_slice(&answer).unwrap_or(Value::Null);
            if answer.get("success").and_then(Value::as_bool) != Some(true) {
                let message = answer
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| answer.to_string(), str::to_string);
                return Err(EngineError::Internal(format!(
                    "{}: the weight update to version {version} failed: {message}",
                    self.inner.base
                )));
            }
            let reported = self.weight_version().await?;
            if reported != version {
                return Err(EngineError::Protocol(format!(
                    "{} reports weight version {reported} after the update to version {version}",
                    self.inner.base
                )));
            }
            self.inner.version.store(version, Ordering::Relaxed);
            Ok(())
        })
    }

    fn pause(&self, mode: PauseMode) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let body = serde_json::json!({"mode": mode.as_str()});
            self.inner
                .call(Method::POST, "/pause_generation", Bytes::from(body.to_string()))
                .await
                .map(|_| ())
        })
    }

    fn resume(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            self.inner
                .call(Method::POST, "/continue_generation", Bytes::new())
                .await
                .map(|_| ())
        })
    }
}

impl SglangEngine {
    /// The server's base URL.
    pub fn base_url(&self) -> &str {
        &self.inner.base
    }

    /// The pause mode this client pauses its server with before an update.
    pub fn pause_mode(&self) -> PauseMode {
        self.inner.pause_mode
    }

    /// The weight version the server reports now (`/get_weight_version`; `"default"` is 0).
    pub async fn weight_version(&self) -> Result<u32, EngineError> {
        let body = self
            .inner
            .call(Method::GET, "/get_weight_version", Bytes::new())
            .await?;
        let answer: Value = serde_json::from_slice(&body)
            .map_err(|e| EngineError::Protocol(format!("/get_weight_version is not JSON: {e}")))?;
        let version = answer
            .get("weight_version")
            .ok_or_else(|| EngineError::Protocol("/get_weight_version has no weight_version".into()))?;
        parse_version(version)
    }
}
