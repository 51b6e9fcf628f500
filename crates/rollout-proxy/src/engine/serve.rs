//! [`generate_router`]: serves any [`InferenceEngine`] over SGLang's native HTTP API (`/generate` with
//! token ids, logprobs and streaming; `/update_weights_from_disk`; `/flush_cache`; `/get_server_info`).
//!
//! Streams are incremental (each chunk carries only the new tokens, as SGLang does with
//! `--incremental-streaming-output`), and every chunk also carries `completion_tokens`, the running total,
//! so a client can tell incremental chunks from cumulative ones. Unlike SGLang's, the logprobs are the
//! engine's own, of the distribution each token was drawn from (truncated where sampling truncates), and
//! every chunk says so with `"logprob_distribution": "sampled"`; `top_logprobs_num` is not served.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::{FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, SampledToken, SamplingParams,
    TokenStream, WeightUpdate,
};

/// A router that speaks SGLang's `/generate` (and its weight-update endpoints) for `engine`.
pub fn generate_router(engine: Arc<dyn InferenceEngine>) -> Router {
    Router::new()
        .route("/generate", post(generate))
        .route("/update_weights_from_disk", post(update_weights))
        .route("/flush_cache", get(flush_cache).post(flush_cache))
        .route("/get_server_info", get(server_info))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { "ok" }))
        .with_state(engine)
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

async fn generate(State(engine): State<Arc<dyn InferenceEngine>>, body: Bytes) -> Response {
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
    let prompt_tokens = input_ids.len();
    let request = GenerateRequest {
        input_ids: input_ids.into(),
        sampling: wire.sampling_params.into_params(),
        images,
    };
    let mut tokens = engine.generate(request);
    let rid = format!("{:032x}", rand::random::<u128>());
    if wire.stream {
        let state = StreamState {
            tokens,
            rid,
            prompt_tokens,
            emitted: 0,
            done: false,
        };
        let body = futures::stream::unfold(state, |mut st| async move {
            if st.done {
                return None;
            }
            let chunk = st.next_chunk().await;
            Some((Ok::<_, Infallible>(chunk), st))
        });
        return Response::builder()
            .header(header::CONTENT_TYPE, "text/event-stream")
            .header(header::CACHE_CONTROL, "no-cache")
            .body(Body::from_stream(body))
            .unwrap_or_else(|_| error(StatusCode::INTERNAL_SERVER_ERROR, "building the response failed"));
    }
    let mut out = Vec::new();
    let finish = loop {
        match tokens.next().await {
            Some(Ok(EngineEvent::Token(t))) => out.push(t),
            Some(Ok(EngineEvent::Finished(f))) => break f,
            Some(Err(e)) => return engine_error(&e),
            None => {
                break FinishReason::Abort {
                    message: "the engine ended the stream without finishing".into(),
                };
            }
        }
    };
    let meta = meta_info(&rid, prompt_tokens, &out, 0, out.len(), Some(&finish));
    axum::Json(json!({"text": "", "output_ids": ids(&out), "meta_info": meta})).into_response()
}

struct StreamState {
    tokens: TokenStream,
    rid: String,
    prompt_tokens: usize,
    emitted: usize,
    done: bool,
}

impl StreamState {
    /// Waits for at least one event, then takes every event that is already available, and frames them as
    /// one SSE chunk (or the closing `[DONE]`).
    async fn next_chunk(&mut self) -> Bytes {
        let mut batch: Vec<SampledToken> = Vec::new();
        let mut finish = None;
        let mut first = Some(self.tokens.next().await);
        loop {
            let event = match first.take() {
                Some(e) => e,
                None => match self.tokens.next().now_or_never() {
                    Some(e) => e,
                    None => break,
                },
            };
            match event {
                Some(Ok(EngineEvent::Token(t))) => batch.push(t),
                Some(Ok(EngineEvent::Finished(f))) => {
                    finish = Some(f);
                    break;
                }
                Some(Err(e)) => {
                    self.done = true;
                    let body = json!({"error": {"message": e.to_string()}});
                    return Bytes::from(format!("data: {body}\n\ndata: [DONE]\n\n"));
                }
                None => {
                    finish = Some(FinishReason::Abort {
                        message: "the engine ended the stream without finishing".into(),
                    });
                    break;
                }
            }
        }
        let start = self.emitted;
        self.emitted += batch.len();
        let meta = meta_info(
            &self.rid,
            self.prompt_tokens,
            &batch,
            start,
            self.emitted,
            finish.as_ref(),
        );
        let chunk = json!({"text": "", "output_ids": ids(&batch), "meta_info": meta});
        if finish.is_some() {
            self.done = true;
            Bytes::from(format!("data: {chunk}\n\ndata: [DONE]\n\n"))
        } else {
            Bytes::from(format!("data: {chunk}\n\n"))
        }
    }
}

fn ids(tokens: &[SampledToken]) -> Vec<u32> {
    tokens.iter().map(|t| t.id).collect()
}

/// SGLang's `meta_info` for `tokens`, which are output tokens `start..total` of the generation.
fn meta_info(
    rid: &str,
    prompt_tokens: usize,
    tokens: &[SampledToken],
    start: usize,
    total: usize,
    finish: Option<&FinishReason>,
) -> Value {
    let logprobs: Vec<Value> = tokens.iter().map(|t| json!([t.logprob, t.id, null])).collect();
    let mut spans: Vec<Value> = Vec::new();
    let mut run_start = start;
    for (i, window) in tokens.windows(2).enumerate() {
        if window[0].version != window[1].version {
            spans.push(
                json!({"version": window[0].version.to_string(), "start": run_start, "end": start + i + 1}),
            );
            run_start = start + i + 1;
        }
    }
    if let Some(last) = tokens.last() {
        spans.push(json!({"version": last.version.to_string(), "start": run_start, "end": total}));
    }
    let finish_reason = finish.map(|f| match f {
        FinishReason::Stop { matched } => json!({"type": "stop", "matched": matched}),
        FinishReason::Length => json!({"type": "length", "length": total}),
        FinishReason::Abort { message } => json!({"type": "abort", "message": message}),
    });
    let mut meta = json!({
        "id": rid,
        "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens,
        "completion_tokens": total,
        "output_token_logprobs": logprobs,
        // An extension of SGLang's meta_info: an InferenceEngine's logprobs already are of the distribution
        // each token was drawn from, so a client must not renormalise them (see `SglangEngine`).
        "logprob_distribution": "sampled",
    });
    if let (Some(last), Some(obj)) = (tokens.last(), meta.as_object_mut()) {
        obj.insert("weight_version".into(), json!(last.version.to_string()));
        obj.insert("weight_versions".into(), Value::Array(spans));
    }
    meta
}

#[derive(Deserialize)]
struct WireWeightUpdate {
    model_path: std::path::PathBuf,
    #[serde(default)]
    weight_version: Option<String>,
}

async fn update_weights(State(engine): State<Arc<dyn InferenceEngine>>, body: Bytes) -> Response {
    let wire: WireWeightUpdate = match serde_json::from_slice(&body) {
        Ok(w) => w,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid body: {e}")),
    };
    let version = match wire.weight_version.as_deref().map(str::parse::<u32>) {
        None => None,
        Some(Ok(v)) => Some(v),
        Some(Err(_)) => {
            return error(
                StatusCode::BAD_REQUEST,
                "weight_version must be a non-negative integer",
            );
        }
    };
    let update = WeightUpdate {
        path: wire.model_path,
        version,
    };
    match engine.update_weights_from_disk(update).await {
        Ok(()) => axum::Json(json!({"success": true, "message": "weights updated"})).into_response(),
        Err(e) => {
            let status = match e {
                EngineError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
                _ => StatusCode::BAD_REQUEST,
            };
            (
                status,
                axum::Json(json!({"success": false, "message": e.to_string()})),
            )
                .into_response()
        }
    }
}

async fn flush_cache(State(engine): State<Arc<dyn InferenceEngine>>) -> Response {
    match engine.flush_cache().await {
        Ok(()) => (StatusCode::OK, "Cache flushed.").into_response(),
        Err(e) => engine_error(&e),
    }
}

/// As a real server started without `--context-length` answers: `context_length` is null ("use the model's
/// config.json"; SGLang's `server_args.py`), and the length in force is `/v1/models`' (below).
async fn server_info(State(engine): State<Arc<dyn InferenceEngine>>) -> Response {
    axum::Json(json!({
        "context_length": null,
        "supports_images": engine.supports_images(),
    }))
    .into_response()
}

/// `/v1/models` as SGLang's OpenAI-compatible layer answers it (`serving_models`): one model, with the
/// context length in force as `max_model_len`.
async fn models(State(engine): State<Arc<dyn InferenceEngine>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": "policy",
            "object": "model",
            "owned_by": "sglang",
            "max_model_len": engine.max_context_len(),
        }],
    }))
    .into_response()
}
