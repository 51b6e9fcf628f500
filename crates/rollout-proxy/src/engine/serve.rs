//! [`GenerateServer`] (and [`generate_router`], its default): serves any [`InferenceEngine`] over SGLang's
//! native HTTP API, following SGLang's own contract point by point so that a client tested against it
//! (our [`crate::SglangEngine`]) meets no surprise on a real server. Each behaviour and the SGLang file it
//! mirrors (`python/sglang/srt/...` on the 2025-2026 main line):
//!
//! - `/generate` (`entrypoints/http_server.py`, `managers/tokenizer_manager.py`): token ids in; streams are
//!   **cumulative** by default (every chunk repeats all output ids and logprobs so far) and incremental with
//!   [`GenerateServerConfig::incremental_streaming_output`] (`server_args.py`'s
//!   `--incremental-streaming-output`: only the new tokens, `completion_tokens` still the running total,
//!   events queued together merged into one chunk); an abort chunk is cumulative in both modes.
//!   Validation errors (a prompt of at least the context length, or prompt plus `max_new_tokens` reaching
//!   it, worded as `_validate_one_request` words them) are a 400 for a plain request and, after a 200
//!   header, a `data: {"error": {"message": ...}}` chunk then `[DONE]` for a streaming one.
//! - Versions (`http_server.py`'s `_update_weight_version_if_provided`, `/get_weight_version`): strings,
//!   `"default"` on a fresh server; `meta_info.weight_version` and per-token `weight_versions` spans
//!   (`{version, start, end}`, counted from output token 0) name the version each token was sampled under.
//! - The update lock (`utils/aio_rwlock.py`, `tokenizer_manager.py`'s `model_update_lock`): a generation
//!   holds the reader lock from admission to its end; `/update_weights_from_disk` takes the writer lock
//!   unless the server is paused, and a waiting writer goes before new readers (tokio's lock is fair), so
//!   an update without a pause waits for every running generation and new ones queue behind it.
//! - `/pause_generation {"mode"}` and `/continue_generation` (`scheduler.py`'s `pause_generation`):
//!   `abort` ends running generations with an abort finish; `retract` and `in_place` keep them held
//!   between two tokens (the engine is paused too, through [`InferenceEngine::pause`]), and tokens sampled
//!   after the continue carry the new version. New requests wait while paused. A retracted generation
//!   holds no cache, so a flush may run (the fix peers carry for the retract mode's waiting queue); an
//!   `in_place` one keeps its cache, so a flush fails until it ends. The engine here keeps every sequence's
//!   cache in both modes (it has no memory pressure to relieve), so retracted tokens are not recomputed.
//! - `/flush_cache` (`http_server.py`): 200 `Cache flushed...` when idle, 400 with the same text while a
//!   generation runs; `/update_weights_from_disk` flushes by default (`flush_cache: true`) and fails as
//!   SGLang's scheduler does when that flush cannot run (SGLang asserts; this server answers 400).
//! - `/update_weights_from_disk` answers `{success, message, num_paused_requests}`, 200 or 400.
//! - `/get_server_info` (`http_server.py`, `server_args.py`): `context_length` is what the server was
//!   configured with, `null` by default; `/v1/models` (`http_server.py`'s `available_models`) gives
//!   `data[0].max_model_len`, the length in force.
//! - `/health` and `/health_generate` answer 503 until the engine is installed ([`GenerateServer::install`];
//!   SGLang's `ServerStatus.Starting`), then 200 (SGLang also runs a one-token generation; this server
//!   does not).
//! - `--api-key` (`utils/common.py`'s `add_api_key_middleware`): with [`GenerateServerConfig::api_key`],
//!   every request but `/health*` and `/metrics` must carry `Authorization: Bearer <key>`, else 401
//!   `{"error": "Unauthorized"}`, checked before the body is read.
//!
//! Unlike SGLang's, the logprobs are the engine's own, of the distribution each token was drawn from
//! (truncated where sampling truncates), and every chunk says so with `"logprob_distribution": "sampled"`;
//! `top_logprobs_num` is not served.

use std::convert::Infallible;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{FutureExt, StreamExt};
use secrecy::SecretString;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{OwnedRwLockReadGuard, RwLock, watch};

use super::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, PauseMode, SampledToken,
    SamplingParams, TokenStream, WeightUpdate,
};

/// How a [`GenerateServer`] behaves where SGLang's server arguments choose.
#[derive(Debug, Clone)]
pub struct GenerateServerConfig {
    /// Stream only the new tokens in each chunk (SGLang's `--incremental-streaming-output`); cumulative
    /// chunks otherwise, SGLang's default.
    pub incremental_streaming_output: bool,
    /// Require `Authorization: Bearer <key>` on every endpoint but `/health*` (SGLang's `--api-key`).
    pub api_key: Option<SecretString>,
    /// The context length the server reports in `/get_server_info` (SGLang's `--context-length`); `None`
    /// reports `null`, as a server started without it. `/v1/models` reports this or the engine's.
    pub context_length: Option<usize>,
    /// The model name `/v1/models` reports.
    pub served_model_name: String,
}

impl Default for GenerateServerConfig {
    fn default() -> Self {
        Self {
            incremental_streaming_output: false,
            api_key: None,
            context_length: None,
            served_model_name: "policy".into(),
        }
    }
}

/// An SGLang-protocol server over an engine that may still be loading. Cloning shares it.
#[derive(Clone)]
pub struct GenerateServer {
    shared: Arc<Shared>,
}

struct Shared {
    config: GenerateServerConfig,
    engine: OnceLock<Arc<dyn InferenceEngine>>,
    update_lock: Arc<RwLock<()>>,
    /// The pause in force, if any.
    paused: watch::Sender<Option<PauseMode>>,
    /// Counts abort-mode pauses; running generations end when it moves.
    aborts: watch::Sender<u64>,
    /// Generations past admission (holding the reader lock) and not yet ended.
    in_engine: watch::Sender<usize>,
    versions: Mutex<Versions>,
}

/// The weight-version labels: the engine counts versions as numbers, the wire names them with strings.
struct Versions {
    current: String,
    /// Engine version -> label, newest last.
    labels: Vec<(u32, String)>,
    next: u32,
}

impl Shared {
    fn engine(&self) -> Option<&Arc<dyn InferenceEngine>> {
        self.engine.get()
    }

    fn label(&self, version: u32) -> String {
        let versions = lock(&self.versions);
        versions
            .labels
            .iter()
            .rev()
            .find(|(v, _)| *v == version)
            .map_or_else(|| version.to_string(), |(_, l)| l.clone())
    }

    fn context_in_force(&self, engine: &dyn InferenceEngine) -> usize {
        self.config
            .context_length
            .unwrap_or_else(|| engine.max_context_len())
    }

    /// Whether a cache flush may run now: nothing holds cache (retracted generations hold none).
    fn flush_allowed(&self) -> bool {
        *self.in_engine.borrow() == 0 || *self.paused.borrow() == Some(PauseMode::Retract)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl GenerateServer {
    /// A server that answers `/health` with 503 until [`GenerateServer::install`] gives it an engine.
    pub fn new(config: GenerateServerConfig) -> Self {
        Self {
            shared: Arc::new(Shared {
                config,
                engine: OnceLock::new(),
                update_lock: Arc::new(RwLock::new(())),
                paused: watch::Sender::new(None),
                aborts: watch::Sender::new(0),
                in_engine: watch::Sender::new(0),
                versions: Mutex::new(Versions {
                    current: "default".into(),
                    labels: vec![(0, "default".into())],
                    next: 1,
                }),
            }),
        }
    }

    /// A server over a loaded `engine`.
    pub fn with_engine(config: GenerateServerConfig, engine: Arc<dyn InferenceEngine>) -> Self {
        let server = Self::new(config);
        server.install(engine);
        server
    }

    /// Installs the loaded engine (the model is loaded: `/health` answers 200 from now on). The first
    /// engine stays; answers whether this one was installed.
    pub fn install(&self, engine: Arc<dyn InferenceEngine>) -> bool {
        self.shared.engine.set(engine).is_ok()
    }

    /// The current weight version's label (`"default"` until an update names one).
    pub fn weight_version(&self) -> String {
        lock(&self.shared.versions).current.clone()
    }

    /// The router to serve.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/generate", post(generate))
            .route("/update_weights_from_disk", post(update_weights))
            .route("/pause_generation", post(pause_generation))
            .route("/continue_generation", post(continue_generation))
            .route("/flush_cache", get(flush_cache).post(flush_cache))
            .route("/get_server_info", get(server_info))
            .route("/get_model_info", get(model_info))
            .route("/get_weight_version", get(weight_version))
            .route("/v1/models", get(models))
            .route("/health", get(health))
            .route("/health_generate", get(health))
            .layer(axum::middleware::from_fn_with_state(
                self.shared.clone(),
                authenticate,
            ))
            .with_state(self.shared.clone())
    }
}

/// A router that speaks SGLang's `/generate` (and its weight-update endpoints) for a loaded `engine`, with
/// SGLang's defaults: cumulative streams, no API key, `context_length` null.
pub fn generate_router(engine: Arc<dyn InferenceEngine>) -> Router {
    GenerateServer::with_engine(GenerateServerConfig::default(), engine).router()
}

async fn authenticate(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    if let Some(key) = &shared.config.api_key {
        let path = request.uri().path();
        if !path.starts_with("/health") && !path.starts_with("/metrics") {
            let presented = request
                .headers()
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(|v| SecretString::from(v.to_string()));
            if !presented.is_some_and(|p| crate::auth::secrets_equal(&p, key)) {
                return (
                    StatusCode::UNAUTHORIZED,
                    axum::Json(json!({"error": "Unauthorized"})),
                )
                    .into_response();
            }
        }
    }
    next.run(request).await
}

fn starting() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server is starting: the model is not loaded yet",
    )
}

async fn health(State(shared): State<Arc<Shared>>) -> Response {
    if shared.engine().is_some() {
        StatusCode::OK.into_response()
    } else {
        StatusCode::SERVICE_UNAVAILABLE.into_response()
    }
}

#[derive(Deserialize)]
struct WireGenerate {
    input_ids: Option<Vec<u32>>,
    #[serde(default)]
    sampling_params: WireSampling,
    #[serde(default)]
    stream: bool,
    #[serde(default)]
    image_data: Option<Value>,
}

/// SGLang's sampling parameters, the subset an [`InferenceEngine`] understands.
#[derive(Deserialize, Default)]
pub(crate) struct WireSampling {
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    max_new_tokens: Option<u32>,
    #[serde(default)]
    stop_token_ids: Option<Vec<u32>>,
    sampling_seed: Option<u64>,
}

impl WireSampling {
    fn into_params(self) -> SamplingParams {
        let defaults = SamplingParams::default();
        SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            top_k: self
                .top_k
                .filter(|k| *k >= 1 && *k < (1 << 30))
                .and_then(|k| u32::try_from(k).ok()),
            max_new_tokens: self.max_new_tokens.unwrap_or(128),
            stop_token_ids: self.stop_token_ids.unwrap_or_default(),
            seed: self.sampling_seed,
        }
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Response {
    let message = message.into();
    (
        status,
        axum::Json(json!({"error": {"message": message, "code": status.as_u16()}})),
    )
        .into_response()
}

fn engine_error(err: &EngineError) -> Response {
    let status = match err {
        EngineError::ContextLengthExceeded { .. } | EngineError::InvalidRequest(_) => StatusCode::BAD_REQUEST,
        EngineError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    error(status, err.to_string())
}

/// `tokenizer_manager.py`'s `_validate_one_request`, in its words: the prompt must be shorter than the
/// context, and so must the prompt plus `max_new_tokens`.
fn validate(prompt: usize, max_new_tokens: u32, context: usize) -> Result<(), String> {
    if prompt >= context {
        return Err(format!(
            "The input ({prompt} tokens) is longer than the model's context length ({context} tokens)."
        ));
    }
    let total = prompt + max_new_tokens as usize;
    if total >= context {
        return Err(format!(
            "Requested token count exceeds the model's maximum context length of {context} tokens. You \
             requested a total of {total} tokens: {prompt} tokens from the input messages and \
             {max_new_tokens} tokens for the completion. Please reduce the number of tokens in the input \
             messages or the completion to fit within the limit."
        ));
    }
    Ok(())
}

/// The framing of a refusal that happens after admission: a 400 for a plain request, an error chunk after
/// a 200 header for a streaming one (`http_server.py`'s `stream_results`).
fn refuse(stream: bool, message: &str) -> Response {
    if !stream {
        return error(StatusCode::BAD_REQUEST, message);
    }
    let body = json!({"error": {"message": message}});
    sse(Body::from(format!("data: {body}\n\ndata: [DONE]\n\n")))
}

fn sse(body: Body) -> Response {
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(body)
        .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "building the response failed"))
}

async fn generate(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    let wire: WireGenerate = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid /generate body: {e}")),
    };
    let Some(input_ids) = wire.input_ids else {
        return error(
            StatusCode::BAD_REQUEST,
            "input_ids is required (this server does not tokenize text)",
        );
    };
    let images = match wire.image_data {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(one) => vec![one],
    };
    if !images.is_empty() && !engine.supports_images() {
        return error(
            StatusCode::BAD_REQUEST,
            "this engine does not accept image inputs",
        );
    }
    let checked = (wire.sampling_params.temperature.map(super::check_temperature))
        .transpose()
        .and((wire.sampling_params.top_p.map(super::check_top_p)).transpose());
    if let Err(message) = checked {
        return error(StatusCode::BAD_REQUEST, message);
    }
    // New requests wait while the server is paused, then hold the reader lock for their whole generation.
    let mut paused = shared.paused.subscribe();
    let _ = paused.wait_for(Option::is_none).await;
    let read = shared.update_lock.clone().read_owned().await;
    let prompt_tokens = input_ids.len();
    let sampling = wire.sampling_params.into_params();
    if let Err(message) = validate(
        prompt_tokens,
        sampling.max_new_tokens,
        shared.context_in_force(&*engine),
    ) {
        return refuse(wire.stream, &message);
    }
    let tokens = engine.generate(GenerateRequest {
        input_ids: input_ids.into(),
        sampling,
        images,
        affinity: None,
    });
    let mut generation = Generation::start(&shared, tokens, read, prompt_tokens);
    if wire.stream {
        let incremental = shared.config.incremental_streaming_output;
        let body = futures::stream::unfold(Some(generation), move |state| async move {
            let mut g = state?;
            let (chunk, more) = g.next_chunk(incremental).await;
            Some((Ok::<_, Infallible>(chunk), more.then_some(g)))
        });
        return sse(Body::from_stream(body));
    }
    loop {
        match generation.step().await {
            Step::Tokens(None) => {}
            Step::Tokens(Some(finish)) => {
                let meta = generation.meta(0, Some(&finish));
                let ids = ids(&generation.out);
                return axum::Json(json!({"text": "", "output_ids": ids, "meta_info": meta})).into_response();
            }
            Step::Error(e) => return engine_error(&e),
        }
    }
}

/// Ends a generation's hold on the engine when dropped.
struct InEngine(Arc<Shared>);

impl Drop for InEngine {
    fn drop(&mut self) {
        self.0.in_engine.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// One admitted generation.
struct Generation {
    shared: Arc<Shared>,
    tokens: TokenStream,
    out: Vec<SampledToken>,
    /// Tokens already framed (incremental streams).
    sent: usize,
    rid: String,
    prompt_tokens: usize,
    aborts: watch::Receiver<u64>,
    paused: watch::Receiver<Option<PauseMode>>,
    /// The reader lock and the in-engine count, released as soon as the generation ends.
    hold: Option<(OwnedRwLockReadGuard<()>, InEngine)>,
}

enum Step {
    /// New tokens were appended to `out`; the finish, when the generation ended.
    Tokens(Option<FinishReason>),
    Error(EngineError),
}

impl Generation {
    fn start(
        shared: &Arc<Shared>,
        tokens: TokenStream,
        read: OwnedRwLockReadGuard<()>,
        prompt: usize,
    ) -> Self {
        shared.in_engine.send_modify(|n| *n += 1);
        Self {
            shared: shared.clone(),
            tokens,
            out: Vec::new(),
            sent: 0,
            rid: format!("{:032x}", rand::random::<u128>()),
            prompt_tokens: prompt,
            aborts: shared.aborts.subscribe(),
            paused: shared.paused.subscribe(),
            hold: Some((read, InEngine(shared.clone()))),
        }
    }

    fn end(&mut self) {
        self.hold = None;
        self.tokens = Box::pin(futures::stream::empty());
    }

    /// Waits for at least one event (holding while paused, unless an abort ends the generation), then
    /// takes every event already available.
    async fn step(&mut self) -> Step {
        let (aborts, paused, tokens) = (&mut self.aborts, &mut self.paused, &mut self.tokens);
        let first = tokio::select! {
            biased;
            _ = aborts.changed() => None,
            event = async {
                // Tokens the engine sampled before a pause are held too, so no chunk moves while paused.
                let _ = paused.wait_for(|p| p.is_none() || *p == Some(PauseMode::Abort)).await;
                tokens.next().await
            } => Some(event),
        };
        let Some(mut event) = first else {
            self.end();
            return Step::Tokens(Some(FinishReason::Abort {
                message: "Abort in waiting queue".into(),
            }));
        };
        loop {
            match event {
                Some(Ok(EngineEvent::Token(t))) => self.out.push(t),
                Some(Ok(EngineEvent::Finished(f))) => {
                    self.end();
                    return Step::Tokens(Some(f));
                }
                Some(Err(e)) => {
                    self.end();
                    return Step::Error(e);
                }
                None => {
                    self.end();
                    return Step::Tokens(Some(FinishReason::Abort {
                        message: "the engine ended the stream without finishing".into(),
                    }));
                }
            }
            match self.tokens.next().now_or_never() {
                Some(next) => event = next,
                None => return Step::Tokens(None),
            }
        }
    }

    /// The next SSE chunk, and whether more follow.
    async fn next_chunk(&mut self, incremental: bool) -> (Bytes, bool) {
        match self.step().await {
            Step::Error(e) => {
                let body = json!({"error": {"message": e.to_string()}});
                (Bytes::from(format!("data: {body}\n\ndata: [DONE]\n\n")), false)
            }
            Step::Tokens(finish) => {
                // An abort chunk repeats every token, in incremental mode too (`tokenizer_manager.py`).
                let cumulative = !incremental || matches!(finish, Some(FinishReason::Abort { .. }));
                let from = if cumulative { 0 } else { self.sent };
                let meta = self.meta(from, finish.as_ref());
                let chunk = json!({"text": "", "output_ids": ids(&self.out[from..]), "meta_info": meta});
                self.sent = self.out.len();
                match finish {
                    Some(_) => (Bytes::from(format!("data: {chunk}\n\ndata: [DONE]\n\n")), false),
                    None => (Bytes::from(format!("data: {chunk}\n\n")), true),
                }
            }
        }
    }

    /// SGLang's `meta_info` for output tokens `from..`.
    fn meta(&self, from: usize, finish: Option<&FinishReason>) -> Value {
        let tokens = &self.out[from..];
        let total = self.out.len();
        let logprobs: Vec<Value> = tokens.iter().map(|t| json!([t.logprob, t.id, null])).collect();
        let mut spans: Vec<Value> = Vec::new();
        let mut run_start = from;
        for (i, window) in tokens.windows(2).enumerate() {
            if window[0].version != window[1].version {
                let label = self.shared.label(window[0].version);
                spans.push(json!({"version": label, "start": run_start, "end": from + i + 1}));
                run_start = from + i + 1;
            }
        }
        if let Some(last) = tokens.last() {
            spans.push(json!({"version": self.shared.label(last.version), "start": run_start, "end": total}));
        }
        let finish_reason = finish.map(|f| match f {
            FinishReason::Stop { matched } => json!({"type": "stop", "matched": matched}),
            FinishReason::Length => json!({"type": "length", "length": total}),
            FinishReason::Abort { message } => json!({"type": "abort", "message": message}),
        });
        let weight_version = self.out.last().map_or_else(
            || lock(&self.shared.versions).current.clone(),
            |t| self.shared.label(t.version),
        );
        json!({
            "id": self.rid,
            "finish_reason": finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": total,
            "output_token_logprobs": logprobs,
            "weight_version": weight_version,
            "weight_versions": spans,
            // An extension of SGLang's meta_info: an InferenceEngine's logprobs already are of the distribution
            // each token was drawn from, so a client must not renormalise them (see `SglangEngine`).
            "logprob_distribution": "sampled",
        })
    }
}

fn ids(tokens: &[SampledToken]) -> Vec<u32> {
    tokens.iter().map(|t| t.id).collect()
}

/// `io_struct.py`'s `UpdateWeightFromDiskReqInput`, the fields this server acts on.
#[derive(Deserialize)]
struct WireWeightUpdate {
    model_path: std::path::PathBuf,
    #[serde(default)]
    weight_version: Option<String>,
    #[serde(default = "yes")]
    flush_cache: bool,
    #[serde(default)]
    abort_all_requests: bool,
}

fn yes() -> bool {
    true
}

fn update_answer(status: StatusCode, success: bool, message: String, paused: usize) -> Response {
    let body = json!({"success": success, "message": message, "num_paused_requests": paused});
    (status, axum::Json(body)).into_response()
}

async fn update_weights(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    let wire: WireWeightUpdate = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return update_answer(StatusCode::BAD_REQUEST, false, format!("invalid body: {e}"), 0),
    };
    if wire.abort_all_requests {
        shared.aborts.send_modify(|n| *n += 1);
    }
    let paused = shared.paused.borrow().is_some();
    // Paused, the update skips the lock and the held generations continue on the new weights; otherwise it
    // waits for every running generation, and new ones wait for it.
    let _write = if paused {
        None
    } else {
        Some(shared.update_lock.clone().write_owned().await)
    };
    let held = if paused { *shared.in_engine.borrow() } else { 0 };
    if wire.flush_cache && !shared.flush_allowed() {
        let message = format!(
            "cannot flush the cache after the update: {held} requests are running (pause in retract mode, or \
             pass flush_cache: false)"
        );
        return update_answer(StatusCode::BAD_REQUEST, false, message, held);
    }
    let version = {
        let mut versions = lock(&shared.versions);
        let v = versions.next;
        versions.next += 1;
        v
    };
    let update = WeightUpdate {
        path: wire.model_path,
        version: Some(version),
    };
    match engine.update_weights_from_disk(update).await {
        Ok(()) => {
            let mut message = "Succeeded to update model weights.".to_string();
            {
                let mut versions = lock(&shared.versions);
                if let Some(label) = wire.weight_version {
                    message.push_str(&format!(" Weight version updated to {label}."));
                    versions.current = label;
                }
                let label = versions.current.clone();
                versions.labels.push((version, label));
            }
            if wire.flush_cache {
                let _ = engine.flush_cache().await;
            }
            update_answer(StatusCode::OK, true, message, held)
        }
        Err(e) => {
            let status = match e {
                EngineError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
                _ => StatusCode::BAD_REQUEST,
            };
            update_answer(status, false, e.to_string(), held)
        }
    }
}

#[derive(Deserialize, Default)]
struct WirePause {
    #[serde(default)]
    mode: Option<String>,
}

/// How long an abort-mode pause waits for the aborted generations to let go of the engine.
const ABORT_DRAIN: Duration = Duration::from_secs(10);

async fn pause_generation(State(shared): State<Arc<Shared>>, body: Bytes) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    // Older SGLang versions take no body; their pause aborts (`io_struct.py`'s default mode).
    let wire: WirePause = if body.iter().all(u8::is_ascii_whitespace) {
        WirePause::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(w) => w,
            Err(e) => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("invalid /pause_generation body: {e}"),
                );
            }
        }
    };
    let mode = match wire.mode.as_deref() {
        None => PauseMode::Abort,
        Some(name) => match PauseMode::parse(name) {
            Some(mode) => mode,
            None => {
                return error(
                    StatusCode::BAD_REQUEST,
                    format!("mode {name:?} is not one of abort, retract, in_place"),
                );
            }
        },
    };
    shared.paused.send_replace(Some(mode));
    match engine.pause(mode).await {
        Ok(()) | Err(EngineError::Unsupported(_)) => {}
        Err(e) => return engine_error(&e),
    }
    if mode == PauseMode::Abort {
        shared.aborts.send_modify(|n| *n += 1);
        let mut in_engine = shared.in_engine.subscribe();
        let _ = tokio::time::timeout(ABORT_DRAIN, in_engine.wait_for(|n| *n == 0)).await;
    }
    axum::Json(json!({"message": "Generation paused successfully.", "status": "ok"})).into_response()
}

async fn continue_generation(State(shared): State<Arc<Shared>>) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    match engine.resume().await {
        Ok(()) | Err(EngineError::Unsupported(_)) => {}
        Err(e) => return engine_error(&e),
    }
    shared.paused.send_replace(None);
    axum::Json(json!({"message": "Generation continued successfully.", "status": "ok"})).into_response()
}

async fn flush_cache(State(shared): State<Arc<Shared>>) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    let text = "Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting \
                requests, the operation will not be performed.)\n";
    if !shared.flush_allowed() {
        return (StatusCode::BAD_REQUEST, text).into_response();
    }
    match engine.flush_cache().await {
        Ok(()) | Err(EngineError::Unsupported(_)) => (StatusCode::OK, text).into_response(),
        Err(e) => engine_error(&e),
    }
}

/// As a real server answers: `context_length` is what it was started with, `null` by default ("use the
/// model's config.json"; `server_args.py`), and the length in force is `/v1/models`' (below).
async fn server_info(State(shared): State<Arc<Shared>>) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    axum::Json(json!({
        "context_length": shared.config.context_length,
        "served_model_name": shared.config.served_model_name,
        "weight_version": lock(&shared.versions).current,
        "incremental_streaming_output": shared.config.incremental_streaming_output,
        "supports_images": engine.supports_images(),
        "version": concat!("arena-rl-imitation-", env!("CARGO_PKG_VERSION")),
    }))
    .into_response()
}

async fn model_info(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({
        "model_path": shared.config.served_model_name,
        "is_generation": true,
        "weight_version": lock(&shared.versions).current,
    }))
    .into_response()
}

async fn weight_version(State(shared): State<Arc<Shared>>) -> Response {
    axum::Json(json!({"weight_version": lock(&shared.versions).current})).into_response()
}

/// `/v1/models` as SGLang's `available_models` answers it: one model, with the context length in force as
/// `max_model_len`.
async fn models(State(shared): State<Arc<Shared>>) -> Response {
    let Some(engine) = shared.engine().cloned() else {
        return starting();
    };
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": shared.config.served_model_name,
            "object": "model",
            "owned_by": "sglang",
            "root": shared.config.served_model_name,
            "max_model_len": shared.context_in_force(&*engine),
        }],
    }))
    .into_response()
}
