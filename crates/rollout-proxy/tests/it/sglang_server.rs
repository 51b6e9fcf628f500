//! The SGLang imitation (`GenerateServer`) over real sockets, held to SGLang's own contract: cumulative and
//! incremental streams, string weight versions, server info and `/v1/models`, `/health` while loading, the
//! API key, a busy `/flush_cache`, streamed validation errors, and the update lock with its pause modes.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::{Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollout_proxy::{FakeEngine, FakeEngineConfig, GenerateServer, GenerateServerConfig, ProxyServer};
use secrecy::SecretString;
use serde_json::{Value, json};

use crate::common::call;

fn fake(output_len: u32, latency_ms: u64) -> Arc<FakeEngine> {
    Arc::new(FakeEngine::new(FakeEngineConfig {
        output_len,
        token_latency: Duration::from_millis(latency_ms),
        max_context_len: 100,
        ..FakeEngineConfig::default()
    }))
}

async fn serve(server: &GenerateServer) -> (ProxyServer, String) {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let listening = ProxyServer::serve_router(addr, server.router())
        .await
        .expect("listens");
    let base = format!("http://{}", listening.local_addr());
    (listening, base)
}

fn request(stream: bool, prompt: usize, max_new: u32) -> Value {
    json!({"input_ids": (1..=prompt as u32).collect::<Vec<_>>(), "stream": stream, "return_logprob": true,
        "sampling_params": {"max_new_tokens": max_new, "temperature": 1.0}})
}

/// The JSON of every `data:` event of an SSE body, and whether it ended with `[DONE]`.
fn events(text: &str) -> (Vec<Value>, bool) {
    let mut out = Vec::new();
    let mut done = false;
    for event in text.split("\n\n").filter(|e| !e.is_empty()) {
        let data = event.strip_prefix("data: ").expect("a data event");
        if data == "[DONE]" {
            done = true;
        } else {
            assert!(!done, "nothing follows [DONE]: {text}");
            out.push(serde_json::from_str(data).expect("JSON data"));
        }
    }
    (out, done)
}

fn ids(chunk: &Value) -> Vec<u64> {
    chunk["output_ids"]
        .as_array()
        .expect("output_ids")
        .iter()
        .map(|v| v.as_u64().expect("id"))
        .collect()
}

/// A streaming `/generate` read event by event as it arrives.
struct Stream {
    body: hyper::body::Incoming,
    buf: BytesMut,
}

impl Stream {
    async fn open(base: &str, body: Value) -> Self {
        let client: Client<HttpConnector, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let request = http::Request::post(format!("{base}/generate"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.to_string())))
            .expect("request");
        let response = client.request(request).await.expect("sends");
        assert_eq!(response.status(), StatusCode::OK);
        Self {
            body: response.into_body(),
            buf: BytesMut::new(),
        }
    }

    /// The next chunk's JSON; `None` at `[DONE]`.
    async fn next(&mut self) -> Option<Value> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let event = self.buf.split_to(end + 2);
                let data = std::str::from_utf8(&event[..end]).expect("utf-8");
                let data = data.strip_prefix("data: ").expect("a data event");
                if data == "[DONE]" {
                    return None;
                }
                return Some(serde_json::from_str(data).expect("JSON data"));
            }
            let frame = self.body.frame().await?.expect("frame");
            if let Ok(data) = frame.into_data() {
                self.buf.extend_from_slice(&data);
            }
        }
    }

    /// Every chunk up to `[DONE]`; answers the last.
    async fn last(&mut self) -> Value {
        let mut last = Value::Null;
        while let Some(chunk) = self.next().await {
            last = chunk;
        }
        last
    }
}

async fn post(base: &str, path: &str, body: Value) -> crate::common::Response {
    call(Method::POST, &format!("{base}{path}"), &[], Some(body)).await
}

async fn get(base: &str, path: &str) -> crate::common::Response {
    call(Method::GET, &format!("{base}{path}"), &[], None).await
}

#[tokio::test]
async fn streams_are_cumulative_by_default_and_incremental_on_request() {
    for incremental in [false, true] {
        let engine = fake(8, 3);
        let config = GenerateServerConfig {
            incremental_streaming_output: incremental,
            ..GenerateServerConfig::default()
        };
        let (_server, base) = serve(&GenerateServer::with_engine(config, engine.clone())).await;
        let r = post(&base, "/generate", request(true, 3, 20)).await;
        assert_eq!(r.status, StatusCode::OK);
        let (chunks, done) = events(&r.text);
        assert!(done && chunks.len() >= 2, "{incremental}: {}", r.text);
        let sampled: Vec<u64> = engine.outputs()[0].iter().map(|t| u64::from(t.id)).collect();
        let mut seen: Vec<u64> = Vec::new();
        for chunk in &chunks {
            let chunk_ids = ids(chunk);
            let logprobs = chunk["meta_info"]["output_token_logprobs"]
                .as_array()
                .expect("logprobs")
                .len();
            assert_eq!(logprobs, chunk_ids.len(), "one logprob per id in the chunk");
            if incremental {
                seen.extend(chunk_ids);
            } else {
                assert!(
                    chunk_ids.len() >= seen.len() && chunk_ids[..seen.len()] == seen[..],
                    "each cumulative chunk repeats every earlier token"
                );
                seen = chunk_ids;
            }
            assert_eq!(
                chunk["meta_info"]["completion_tokens"],
                json!(seen.len()),
                "completion_tokens is the running total in both modes"
            );
        }
        assert_eq!(seen, sampled, "incremental={incremental}");
    }
}

#[tokio::test]
async fn versions_are_strings_default_on_a_fresh_server() {
    let engine = fake(4, 0);
    let server = GenerateServer::with_engine(GenerateServerConfig::default(), engine.clone());
    let (_listening, base) = serve(&server).await;
    assert_eq!(
        get(&base, "/get_weight_version").await.json(),
        json!({"weight_version": "default"})
    );
    let answer = post(&base, "/generate", request(false, 2, 10)).await.json();
    assert_eq!(answer["meta_info"]["weight_version"], json!("default"));
    assert_eq!(
        answer["meta_info"]["weight_versions"],
        json!([{"version": "default", "start": 0, "end": 4}])
    );
    for label in ["7", "step-a"] {
        let r = post(
            &base,
            "/update_weights_from_disk",
            json!({"model_path": "/ckpt", "weight_version": label}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(r.json()["success"], json!(true));
        assert_eq!(r.json()["num_paused_requests"], json!(0));
        assert_eq!(
            get(&base, "/get_weight_version").await.json()["weight_version"],
            json!(label)
        );
        let answer = post(&base, "/generate", request(false, 2, 10)).await.json();
        assert_eq!(answer["meta_info"]["weight_version"], json!(label));
    }
    // An update that names no version keeps the label, as SGLang's does.
    let r = post(&base, "/update_weights_from_disk", json!({"model_path": "/ckpt"})).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(server.weight_version(), "step-a");
    assert_eq!(engine.weight_updates().len(), 3);
}

#[tokio::test]
async fn server_info_reports_no_context_length_unless_configured() {
    let engine = fake(4, 0);
    let (_default, base) = serve(&GenerateServer::with_engine(
        GenerateServerConfig::default(),
        engine.clone(),
    ))
    .await;
    assert_eq!(
        get(&base, "/get_server_info").await.json()["context_length"],
        Value::Null
    );
    let models = get(&base, "/v1/models").await.json();
    assert_eq!(
        models["data"][0]["max_model_len"],
        json!(100),
        "the engine's context is in force"
    );
    let config = GenerateServerConfig {
        context_length: Some(64),
        ..GenerateServerConfig::default()
    };
    let (_configured, base) = serve(&GenerateServer::with_engine(config, engine)).await;
    assert_eq!(
        get(&base, "/get_server_info").await.json()["context_length"],
        json!(64)
    );
    assert_eq!(
        get(&base, "/v1/models").await.json()["data"][0]["max_model_len"],
        json!(64)
    );
    // The configured context is the one requests are held to.
    let r = post(&base, "/generate", request(false, 60, 10)).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
}

#[tokio::test]
async fn health_answers_503_until_the_model_is_loaded() {
    let server = GenerateServer::new(GenerateServerConfig::default());
    let (_listening, base) = serve(&server).await;
    assert_eq!(
        get(&base, "/health").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        get(&base, "/health_generate").await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    let r = post(&base, "/generate", request(false, 2, 4)).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    assert!(server.install(fake(4, 0)));
    assert!(!server.install(fake(4, 0)), "the first engine stays");
    assert_eq!(get(&base, "/health").await.status, StatusCode::OK);
    assert_eq!(
        post(&base, "/generate", request(false, 2, 4)).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn an_api_key_guards_every_endpoint_but_health() {
    let config = GenerateServerConfig {
        api_key: Some(SecretString::from("k-123".to_string())),
        ..GenerateServerConfig::default()
    };
    let (_listening, base) = serve(&GenerateServer::with_engine(config, fake(4, 0))).await;
    let generate = || Some(request(false, 2, 4));
    for (method, path, body) in [
        (Method::POST, "/generate", generate()),
        (Method::GET, "/get_server_info", None),
        (Method::GET, "/v1/models", None),
        (Method::GET, "/get_weight_version", None),
        (Method::POST, "/flush_cache", None),
        (
            Method::POST,
            "/pause_generation",
            Some(json!({"mode": "retract"})),
        ),
        (Method::POST, "/continue_generation", None),
        (
            Method::POST,
            "/update_weights_from_disk",
            Some(json!({"model_path": "/x"})),
        ),
    ] {
        let url = format!("{base}{path}");
        for headers in [
            &[][..],
            &[("authorization", "Bearer wrong")][..],
            &[("authorization", "k-123")][..],
        ] {
            let r = call(method.clone(), &url, headers, body.clone()).await;
            assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{path} with {headers:?}");
            assert_eq!(r.json(), json!({"error": "Unauthorized"}));
        }
        let r = call(method.clone(), &url, &[("authorization", "Bearer k-123")], body).await;
        assert_eq!(r.status, StatusCode::OK, "{path}: {}", r.text);
    }
    assert_eq!(get(&base, "/health").await.status, StatusCode::OK);
}

#[tokio::test]
async fn validation_errors_are_a_400_or_an_error_chunk_after_a_200() {
    let (_listening, base) = serve(&GenerateServer::with_engine(
        GenerateServerConfig::default(),
        fake(4, 0),
    ))
    .await;
    for (prompt, max_new, phrase) in [
        (
            100,
            4,
            "The input (100 tokens) is longer than the model's context length (100 tokens).",
        ),
        // SGLang refuses a prompt plus max_new_tokens that reaches the context, not only one past it.
        (
            60,
            40,
            "maximum context length of 100 tokens. You requested a total of 100 tokens",
        ),
    ] {
        let plain = post(&base, "/generate", request(false, prompt, max_new)).await;
        assert_eq!(plain.status, StatusCode::BAD_REQUEST);
        let message = plain.json()["error"]["message"]
            .as_str()
            .expect("message")
            .to_string();
        assert!(message.contains(phrase), "{message}");
        let streamed = post(&base, "/generate", request(true, prompt, max_new)).await;
        assert_eq!(
            streamed.status,
            StatusCode::OK,
            "the header is sent before validation"
        );
        let (chunks, done) = events(&streamed.text);
        assert!(done);
        assert_eq!(chunks, vec![json!({"error": {"message": message}})]);
    }
    assert_eq!(
        post(&base, "/generate", request(false, 60, 39)).await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn flush_cache_is_refused_while_a_generation_runs() {
    let engine = fake(30, 20);
    let (_listening, base) = serve(&GenerateServer::with_engine(
        GenerateServerConfig::default(),
        engine.clone(),
    ))
    .await;
    let mut stream = Stream::open(&base, request(true, 2, 40)).await;
    stream.next().await.expect("a first chunk");
    let busy = post(&base, "/flush_cache", json!({})).await;
    assert_eq!(busy.status, StatusCode::BAD_REQUEST, "{}", busy.text);
    assert!(
        busy.text.starts_with("Cache flushed."),
        "SGLang's text, whatever the outcome"
    );
    assert_eq!(engine.flushes(), 0);
    let last = stream.last().await;
    assert_eq!(last["meta_info"]["completion_tokens"], json!(30));
    assert_eq!(
        post(&base, "/flush_cache", json!({})).await.status,
        StatusCode::OK
    );
    assert_eq!(engine.flushes(), 1);
}

/// Without a pause an update takes the writer lock: it waits for the running generation, and a generation
/// that arrives while it waits runs after it, on the new weights.
#[tokio::test]
async fn an_update_without_a_pause_drains_running_generations() {
    let engine = fake(40, 10);
    let (_listening, base) = serve(&GenerateServer::with_engine(
        GenerateServerConfig::default(),
        engine.clone(),
    ))
    .await;
    let mut first = Stream::open(&base, request(true, 2, 50)).await;
    first.next().await.expect("a first chunk");
    let update = tokio::spawn({
        let base = base.clone();
        async move {
            post(
                &base,
                "/update_weights_from_disk",
                json!({"model_path": "/c", "weight_version": "1"}),
            )
            .await
            .status
        }
    });
    let mut later = None;
    let mut last = Value::Null;
    while let Some(chunk) = first.next().await {
        let n = chunk["meta_info"]["completion_tokens"].as_u64().expect("count");
        // The generation runs for 400 ms; well before its end the update has not reached the engine.
        if n <= 10 {
            assert!(
                engine.weight_updates().is_empty(),
                "the update waited for the running generation"
            );
        }
        if n >= 5 && later.is_none() {
            later = Some(tokio::spawn({
                let base = base.clone();
                async move { post(&base, "/generate", request(false, 3, 5)).await.json() }
            }));
        }
        last = chunk;
    }
    assert_eq!(
        last["meta_info"]["weight_versions"],
        json!([{"version": "default", "start": 0, "end": 40}])
    );
    assert_eq!(update.await.expect("update task"), StatusCode::OK);
    let later = later.expect("spawned").await.expect("generation task");
    assert_eq!(
        later["meta_info"]["weight_version"],
        json!("1"),
        "queued behind the update: {later}"
    );
}

/// Paused in place (or retracted), a running generation is held, the update skips the lock, and the
/// tokens after the continue carry the new version: two spans in one generation.
#[tokio::test]
async fn a_paused_update_gives_per_token_versions_across_the_update() {
    for mode in ["in_place", "retract"] {
        let engine = fake(30, 25);
        let (_listening, base) = serve(&GenerateServer::with_engine(
            GenerateServerConfig::default(),
            engine.clone(),
        ))
        .await;
        let mut stream = Stream::open(&base, request(true, 2, 40)).await;
        stream.next().await.expect("a first chunk");
        let r = post(&base, "/pause_generation", json!({"mode": mode})).await;
        assert_eq!(
            r.json(),
            json!({"message": "Generation paused successfully.", "status": "ok"})
        );
        // A new request waits while paused.
        let waiting = tokio::spawn({
            let base = base.clone();
            async move { post(&base, "/generate", request(false, 3, 4)).await.json() }
        });
        let flushing = post(
            &base,
            "/update_weights_from_disk",
            json!({"model_path": "/c", "weight_version": "1"}),
        )
        .await;
        if mode == "in_place" {
            // In place, the held generation keeps its cache, so the update's flush cannot run.
            assert_eq!(flushing.status, StatusCode::BAD_REQUEST, "{}", flushing.text);
            assert_eq!(flushing.json()["success"], json!(false));
            assert_eq!(flushing.json()["num_paused_requests"], json!(1));
            let r = post(
                &base,
                "/update_weights_from_disk",
                json!({"model_path": "/c", "weight_version": "1", "flush_cache": false}),
            )
            .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        } else {
            assert_eq!(flushing.status, StatusCode::OK, "{}", flushing.text);
            assert_eq!(flushing.json()["num_paused_requests"], json!(1));
        }
        assert_eq!(
            post(&base, "/continue_generation", json!({})).await.status,
            StatusCode::OK
        );
        let last = stream.last().await;
        let spans = last["meta_info"]["weight_versions"]
            .as_array()
            .expect("spans")
            .clone();
        assert_eq!(spans.len(), 2, "{mode}: {spans:?}");
        let cut = spans[0]["end"].as_u64().expect("end");
        assert_eq!(spans[0], json!({"version": "default", "start": 0, "end": cut}));
        assert_eq!(spans[1], json!({"version": "1", "start": cut, "end": 30}));
        assert!(cut >= 1);
        let waited = waiting.await.expect("task");
        assert_eq!(
            waited["meta_info"]["weight_versions"],
            json!([{"version": "1", "start": 0, "end": 4}])
        );
    }
}

#[tokio::test]
async fn an_abort_pause_ends_running_generations_with_their_tokens() {
    for incremental in [false, true] {
        let engine = fake(30, 20);
        let config = GenerateServerConfig {
            incremental_streaming_output: incremental,
            ..GenerateServerConfig::default()
        };
        let (_listening, base) = serve(&GenerateServer::with_engine(config, engine.clone())).await;
        let mut stream = Stream::open(&base, request(true, 2, 40)).await;
        stream.next().await.expect("a first chunk");
        let r = post(&base, "/pause_generation", json!({"mode": "abort"})).await;
        assert_eq!(r.status, StatusCode::OK);
        let last = stream.last().await;
        let meta = &last["meta_info"];
        assert_eq!(meta["finish_reason"]["type"], json!("abort"), "{last}");
        let n = meta["completion_tokens"].as_u64().expect("count");
        assert!((1..30).contains(&n), "{n}");
        assert_eq!(
            ids(&last).len() as u64,
            n,
            "the abort chunk is cumulative (incremental={incremental})"
        );
        assert_eq!(
            meta["output_token_logprobs"].as_array().expect("logprobs").len() as u64,
            n
        );
        // Nothing runs now: a flush may run, and the update flushes.
        let r = post(
            &base,
            "/update_weights_from_disk",
            json!({"model_path": "/c", "weight_version": "2"}),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert_eq!(
            post(&base, "/continue_generation", json!({})).await.status,
            StatusCode::OK
        );
        let answer = post(&base, "/generate", request(false, 2, 3)).await.json();
        assert_eq!(answer["meta_info"]["weight_version"], json!("2"));
    }
}

#[tokio::test]
async fn pause_modes_are_checked() {
    let (_listening, base) = serve(&GenerateServer::with_engine(
        GenerateServerConfig::default(),
        fake(4, 0),
    ))
    .await;
    let r = post(&base, "/pause_generation", json!({"mode": "sideways"})).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.text.contains("sideways"), "{}", r.text);
    // An older SGLang's body-less pause aborts; the server then answers again after a continue.
    let r = call(Method::POST, &format!("{base}/pause_generation"), &[], None).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        post(&base, "/continue_generation", json!({})).await.status,
        StatusCode::OK
    );
    assert_eq!(
        post(&base, "/generate", request(false, 2, 3)).await.status,
        StatusCode::OK
    );
}
