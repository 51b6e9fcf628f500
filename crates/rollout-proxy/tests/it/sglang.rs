//! `SglangEngine` against `generate_router` serving the fake engine over real sockets (and against a
//! hand-written cumulative SGLang stream), and the proxy in front of it as in the bench.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::response::IntoResponse;
use axum::routing::post;
use futures::StreamExt;
use http::StatusCode;
use rollout_proxy::{
    EngineEvent, FakeEngine, FinishReason, GenerateRequest, GenerateServer, GenerateServerConfig,
    InferenceEngine, ProxyServer, ProxyState, SamplingParams, SglangConfig, SglangEngine, WeightUpdate,
    generate_router,
};
use secrecy::SecretString;
use serde_json::json;

use crate::common::{Proxy, config, engine_config, model, turn};

async fn upstream(engine: Arc<FakeEngine>) -> ProxyServer {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    ProxyServer::serve_router(addr, generate_router(engine))
        .await
        .expect("listens")
}

async fn run(
    engine: &dyn InferenceEngine,
    prompt: Vec<u32>,
    max_new: u32,
) -> (Vec<(u32, f32, u32)>, FinishReason) {
    let mut stream = engine.generate(GenerateRequest {
        input_ids: prompt.into(),
        sampling: SamplingParams {
            max_new_tokens: max_new,
            stop_token_ids: vec![7],
            ..SamplingParams::default()
        },
        images: Vec::new(),
        affinity: None,
    });
    let mut tokens = Vec::new();
    while let Some(event) = stream.next().await {
        match event.expect("no error") {
            EngineEvent::Token(t) => tokens.push((t.id, t.logprob, t.version)),
            EngineEvent::Finished(f) => return (tokens, f),
        }
    }
    panic!("the stream ended without a finish");
}

#[tokio::test]
async fn sglang_engine_returns_exactly_what_the_upstream_sampled() {
    let fake = Arc::new(FakeEngine::new(rollout_proxy::FakeEngineConfig {
        output_len: 40,
        eos_token: Some(7),
        max_context_len: 1000,
        ..Default::default()
    }));
    let server = upstream(fake.clone()).await;
    let incremental = GenerateServer::with_engine(
        GenerateServerConfig {
            incremental_streaming_output: true,
            ..GenerateServerConfig::default()
        },
        fake.clone(),
    );
    let incremental = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), incremental.router())
        .await
        .expect("listens");
    for (stream, server) in [(true, &server), (false, &server), (true, &incremental)] {
        let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
        config.stream = stream;
        let engine = SglangEngine::connect(config).await.expect("connects");
        assert_eq!(
            engine.max_context_len(),
            999,
            "read from /v1/models (the server info's context_length is null, as a default SGLang's), less the \
             token SGLang's prompt-plus-max_new_tokens check keeps"
        );
        let (tokens, finish) = run(&engine, vec![1, 2, 3], 64).await;
        let sampled = fake.outputs().pop().expect("sampled");
        let expected: Vec<(u32, f32, u32)> = sampled.iter().map(|t| (t.id, t.logprob, t.version)).collect();
        assert_eq!(tokens, expected, "stream={stream}");
        assert_eq!(finish, FinishReason::Stop { matched: Some(7) });
        let (tokens, finish) = run(&engine, vec![4, 5], 5).await;
        assert_eq!((tokens.len(), finish), (5, FinishReason::Length));
    }
    // Weight sync passes through, and later tokens carry the new version.
    let engine = SglangEngine::connect(SglangConfig::new(format!("http://{}", server.local_addr())))
        .await
        .expect("connects");
    engine
        .update_weights_from_disk(WeightUpdate {
            path: "/ckpt/step-3".into(),
            version: Some(3),
        })
        .await
        .expect("updates and confirms the version with /get_weight_version");
    assert_eq!(engine.weight_version().await.expect("asks"), 3);
    assert_eq!(
        fake.weight_updates()[0].path,
        std::path::PathBuf::from("/ckpt/step-3")
    );
    assert_eq!(
        fake.flushes(),
        1,
        "the update flushed; the client sends no /flush_cache of its own"
    );
    let (tokens, _) = run(&engine, vec![9], 4).await;
    assert!(tokens.iter().all(|t| t.2 == 3), "{tokens:?}");
}

#[tokio::test]
async fn sglang_engine_reads_cumulative_streams_and_reports_errors() {
    // SGLang's default streaming repeats every token so far in each chunk.
    let app = axum::Router::new().route(
        "/generate",
        post(|| async {
            let chunk = |ids: &[u32], done: bool| {
                let lp: Vec<_> = ids.iter().map(|i| json!([-0.5, i, null])).collect();
                let finish = if done { json!({"type": "stop", "matched": 7}) } else { json!(null) };
                format!(
                    "data: {}\n\n",
                    json!({"output_ids": ids, "meta_info": {"completion_tokens": ids.len(), "output_token_logprobs": lp,
                        "finish_reason": finish, "weight_versions": [{"version": "2", "start": 0, "end": 1}, {"version": "3", "start": 1, "end": ids.len()}]}})
                )
            };
            let body = [chunk(&[11], false), chunk(&[11, 12], false), chunk(&[11, 12, 7], true), "data: [DONE]\n\n".into()].concat();
            ([("content-type", "text/event-stream")], body)
        }),
    );
    let server = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), app)
        .await
        .expect("listens");
    let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
    config.max_context_len = Some(100);
    config.ready_timeout = None;
    let engine = SglangEngine::connect(config).await.expect("connects");
    let (tokens, finish) = run(&engine, vec![1], 10).await;
    assert_eq!(tokens, vec![(11, -0.5, 2), (12, -0.5, 3), (7, -0.5, 3)]);
    assert_eq!(finish, FinishReason::Stop { matched: Some(7) });

    let mut config = SglangConfig::new("http://127.0.0.1:9");
    config.max_context_len = Some(100);
    config.ready_timeout = None;
    let unreachable = SglangEngine::connect(config).await.expect("no request yet");
    let mut stream = unreachable.generate(GenerateRequest {
        input_ids: vec![1].into(),
        sampling: SamplingParams::default(),
        images: Vec::new(),
        affinity: None,
    });
    let err = stream
        .next()
        .await
        .expect("an event")
        .expect_err("transport error");
    assert!(err.to_string().contains("transport"), "{err}");
}

#[tokio::test]
async fn the_proxy_serves_chat_through_sglang() {
    let fake = Arc::new(FakeEngine::new(engine_config()));
    let server = upstream(fake.clone()).await;
    let engine = SglangEngine::connect(SglangConfig::new(format!("http://{}", server.local_addr())))
        .await
        .expect("connects");
    let state = ProxyState::new(config(), model(), Arc::new(engine)).expect("state");
    let proxy = ProxyServer::start("127.0.0.1:0".parse().expect("addr"), state.clone())
        .await
        .expect("listens");
    let p = Proxy {
        server: proxy,
        state,
        engine: fake.clone(),
    };
    let (session, key) = p.session("t").await;
    fake.push_script(turn("Through SGLang."));
    for stream in [false, true] {
        let r = p
            .chat(
                &key,
                json!({"stream": stream, "messages": [{"role": "user", "content": "hi"}]}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK);
        if !stream {
            assert_eq!(
                r.json()["choices"][0]["message"]["content"],
                json!("Through SGLang.")
            );
        }
    }
    p.end(&key).await;
    let exported = p.export(&session, "individual").await;
    let outputs = fake.outputs();
    for (t, o) in exported.trajectories.iter().zip(&outputs) {
        let sampled: Vec<u32> = t
            .token_ids
            .iter()
            .zip(&t.loss_mask)
            .filter(|(_, m)| **m == 1)
            .map(|(id, _)| *id)
            .collect();
        assert_eq!(sampled, o.iter().map(|s| s.id).collect::<Vec<_>>());
    }
    assert_eq!(exported.trajectories.len(), 2);
}

/// Runs one generation with `sampling` on `engine`; answers the logprobs.
async fn logprobs_of(engine: &dyn InferenceEngine, sampling: SamplingParams) -> Vec<f32> {
    let mut stream = engine.generate(GenerateRequest {
        input_ids: vec![1, 2].into(),
        sampling,
        images: Vec::new(),
        affinity: None,
    });
    let mut out = Vec::new();
    while let Some(event) = stream.next().await {
        match event.expect("no error") {
            EngineEvent::Token(t) => out.push(t.logprob),
            EngineEvent::Finished(_) => return out,
        }
    }
    panic!("the stream ended without a finish");
}

#[tokio::test]
async fn sglang_engine_renormalises_truncated_sampling_over_the_kept_tokens() {
    // Like SGLang: tempered, untruncated logprobs, and the top ones when asked for. Token 11 has
    // probability 0.5 and token 13 0.3, among tokens of 0.5, 0.3, 0.2.
    let bodies = Arc::new(std::sync::Mutex::new(Vec::<serde_json::Value>::new()));
    let seen = bodies.clone();
    let app = axum::Router::new().route(
        "/generate",
        post(move |body: axum::body::Bytes| {
            let seen = seen.clone();
            async move {
                let request: serde_json::Value = serde_json::from_slice(&body).expect("json body");
                let asked = request["top_logprobs_num"].as_u64().unwrap_or(0) as usize;
                seen.lock().expect("lock").push(request);
                let top: Vec<_> = [(0.5f64, 11), (0.3, 13), (0.2, 12)]
                    .iter()
                    .take(asked)
                    .map(|(p, id)| json!([p.ln(), id, null]))
                    .collect();
                let mut meta = json!({"completion_tokens": 2, "finish_reason": {"type": "length"},
                    "output_token_logprobs": [[0.5f64.ln(), 11, null], [0.3f64.ln(), 13, null]]});
                if asked > 0 {
                    meta["output_top_logprobs"] = json!([top, top]);
                }
                let chunk = json!({"output_ids": [11, 13], "meta_info": meta});
                (
                    [("content-type", "text/event-stream")],
                    format!("data: {chunk}\n\ndata: [DONE]\n\n"),
                )
            }
        }),
    );
    let server = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), app)
        .await
        .expect("listens");
    let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
    config.max_context_len = Some(100);
    config.ready_timeout = None;
    let engine = SglangEngine::connect(config).await.expect("connects");
    let sampling = |temperature: f32, top_p: f32, top_k: Option<u32>| SamplingParams {
        temperature,
        top_p,
        top_k,
        max_new_tokens: 2,
        ..SamplingParams::default()
    };
    let close = |got: Vec<f32>, expect: [f64; 2]| {
        assert_eq!(got.len(), 2);
        for (g, e) in got.iter().zip(expect) {
            assert!((f64::from(*g) - e).abs() < 1e-6, "{got:?} vs {expect:?}");
        }
    };
    // Untruncated: SGLang's values as they are, and no top logprobs asked for.
    close(
        logprobs_of(&engine, sampling(0.7, 1.0, None)).await,
        [0.5f64.ln(), 0.3f64.ln()],
    );
    // top-p 0.6 keeps 0.5 and 0.3 (the mass before the 0.3 is 0.5 <= 0.6): renormalised by 0.8.
    close(
        logprobs_of(&engine, sampling(0.7, 0.6, None)).await,
        [(0.5f64 / 0.8).ln(), (0.3f64 / 0.8).ln()],
    );
    // top-k 3 keeps everything seen: renormalised by 1.
    close(
        logprobs_of(&engine, sampling(1.3, 1.0, Some(3))).await,
        [0.5f64.ln(), 0.3f64.ln()],
    );
    // Greedy is recorded untruncated whatever top-p says.
    close(
        logprobs_of(&engine, sampling(0.0, 0.5, None)).await,
        [0.5f64.ln(), 0.3f64.ln()],
    );
    let asked: Vec<serde_json::Value> = bodies
        .lock()
        .expect("lock")
        .iter()
        .map(|b| b["top_logprobs_num"].clone())
        .collect();
    assert_eq!(asked, vec![json!(null), json!(64), json!(3), json!(null)]);
}

#[tokio::test]
async fn logprobs_served_by_generate_router_are_not_renormalised_again() {
    let fake = Arc::new(FakeEngine::new(rollout_proxy::FakeEngineConfig {
        output_len: 12,
        max_context_len: 1000,
        ..Default::default()
    }));
    let server = upstream(fake.clone()).await;
    let engine = SglangEngine::connect(SglangConfig::new(format!("http://{}", server.local_addr())))
        .await
        .expect("connects");
    let got = logprobs_of(
        &engine,
        SamplingParams {
            temperature: 0.6,
            top_p: 0.9,
            top_k: Some(20),
            max_new_tokens: 12,
            ..SamplingParams::default()
        },
    )
    .await;
    let sampled: Vec<f32> = fake.outputs()[0].iter().map(|t| t.logprob).collect();
    assert_eq!(got, sampled, "the engine's own logprobs, exactly");
    let asked = &fake.requests()[0].sampling;
    assert_eq!(
        (asked.temperature, asked.top_p, asked.top_k),
        (0.6, 0.9, Some(20))
    );
}

/// The context window: `/get_server_info`'s `context_length` when the server was started with one (then
/// `/v1/models` is not asked), else `/v1/models`' `max_model_len`; neither is one clear error.
#[tokio::test]
async fn the_context_comes_from_the_server_info_else_from_v1_models() {
    use axum::routing::get;
    let serve = |info: serde_json::Value, models: Option<serde_json::Value>| async move {
        let mut app = axum::Router::new()
            .route("/get_server_info", get(move || async move { axum::Json(info) }))
            .route("/health", get(|| async { "" }));
        if let Some(m) = models {
            app = app.route("/v1/models", get(move || async move { axum::Json(m) }));
        }
        let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        ProxyServer::serve_router(addr, app).await.expect("listens")
    };
    let connect = |server: &ProxyServer| {
        SglangEngine::connect(SglangConfig::new(format!("http://{}", server.local_addr())))
    };
    let started_with = serve(json!({"context_length": 2048}), None).await;
    assert_eq!(
        connect(&started_with).await.expect("connects").max_context_len(),
        2047
    );
    let default = serve(
        json!({"context_length": null}),
        Some(json!({"data": [{"id": "m", "max_model_len": 8192}]})),
    )
    .await;
    assert_eq!(connect(&default).await.expect("connects").max_context_len(), 8191);
    let neither = serve(json!({}), Some(json!({"data": []}))).await;
    let Err(err) = connect(&neither).await else {
        panic!("a server with no context length is refused")
    };
    let err = err.to_string();
    assert!(
        err.contains("context_length") && err.contains("max_model_len"),
        "{err}"
    );
}

/// A streaming request's validation error arrives after SGLang's 200 header as an error chunk; it means what
/// the non-streaming 400 means: SGLang's two context refusals are a context overflow, another validation error
/// the client's invalid request, never a token.
#[tokio::test]
async fn streamed_error_chunks_mean_what_a_400_means() {
    use rollout_proxy::EngineError;
    let overflow = |prompt, max| Some(EngineError::ContextLengthExceeded { prompt, max });
    for (message, expected) in [
        (
            "The input (120 tokens) is longer than the model's context length (100 tokens).",
            overflow(120, 100),
        ),
        (
            "Requested token count exceeds the model's maximum context length of 100 tokens. You requested a \
             total of 130 tokens: 90 tokens from the input messages and 40 tokens for the completion. Please \
             reduce the number of tokens in the input messages or the completion to fit within the limit.",
            overflow(90, 100),
        ),
        ("temperature must be non-negative", None),
    ] {
        for stream in [true, false] {
            let body = json!({"error": {"message": message}});
            let app = axum::Router::new().route(
                "/generate",
                post(move || async move {
                    if stream {
                        let text = format!("data: {body}\n\ndata: [DONE]\n\n");
                        ([("content-type", "text/event-stream")], text).into_response()
                    } else {
                        (StatusCode::BAD_REQUEST, axum::Json(body)).into_response()
                    }
                }),
            );
            let server = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), app)
                .await
                .expect("listens");
            let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
            config.max_context_len = Some(100);
            config.ready_timeout = None;
            config.stream = stream;
            let engine = SglangEngine::connect(config).await.expect("connects");
            let mut tokens = engine.generate(GenerateRequest {
                input_ids: vec![1].into(),
                sampling: SamplingParams::default(),
                images: Vec::new(),
                affinity: None,
            });
            let err = tokens.next().await.expect("an event").expect_err("an error");
            match &expected {
                Some(e) => assert_eq!(err.to_string(), e.to_string(), "{message}"),
                None => assert!(
                    matches!(&err, EngineError::InvalidRequest(m) if m == message),
                    "{message}: {err:?}"
                ),
            }
            assert!(tokens.next().await.is_none(), "nothing follows the error");
        }
    }
}

/// Against the imitation: its real refusals reach the client as the same errors.
#[tokio::test]
async fn the_imitations_refusals_are_context_overflows() {
    let fake = Arc::new(FakeEngine::new(rollout_proxy::FakeEngineConfig {
        max_context_len: 50,
        ..Default::default()
    }));
    let server = upstream(fake).await;
    for stream in [true, false] {
        let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
        config.max_context_len = Some(50);
        config.stream = stream;
        let engine = SglangEngine::connect(config).await.expect("connects");
        let mut tokens = engine.generate(GenerateRequest {
            input_ids: vec![1; 40].into(),
            sampling: SamplingParams {
                max_new_tokens: 10,
                ..SamplingParams::default()
            },
            images: Vec::new(),
            affinity: None,
        });
        let err = tokens.next().await.expect("an event").expect_err("refused");
        assert!(
            matches!(
                err,
                rollout_proxy::EngineError::ContextLengthExceeded { prompt: 40, max: 50 }
            ),
            "stream={stream}: {err:?}"
        );
    }
}

/// A server whose chunk carries a `null` logprob (SGLang's NaN) or a version this client never installed
/// fails the generation with a protocol error, over a real socket.
#[tokio::test]
async fn a_null_logprob_or_a_foreign_version_is_a_protocol_error() {
    for (logprob, version, phrase) in [
        (json!(null), json!("default"), "null (NaN) logprob"),
        (json!(-0.5), json!("step-a"), "neither \"default\" nor a decimal"),
        (json!(-0.5), json!(4), "neither \"default\" nor a decimal"),
    ] {
        let chunk = json!({"output_ids": [11], "meta_info": {"completion_tokens": 1, "weight_version": version,
            "finish_reason": {"type": "length"}, "output_token_logprobs": [[logprob, 11, null]]}});
        let app = axum::Router::new().route(
            "/generate",
            post(move || async move {
                (
                    [("content-type", "text/event-stream")],
                    format!("data: {chunk}\n\ndata: [DONE]\n\n"),
                )
            }),
        );
        let server = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), app)
            .await
            .expect("listens");
        let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
        config.max_context_len = Some(100);
        config.ready_timeout = None;
        let engine = SglangEngine::connect(config).await.expect("connects");
        let mut tokens = engine.generate(GenerateRequest {
            input_ids: vec![1].into(),
            sampling: SamplingParams::default(),
            images: Vec::new(),
            affinity: None,
        });
        let err = tokens
            .next()
            .await
            .expect("an event")
            .expect_err("a protocol error");
        assert!(
            matches!(&err, rollout_proxy::EngineError::Protocol(m) if m.contains(phrase)),
            "{err:?}"
        );
    }
}

/// With `--api-key` the client sends the key on every request; without it the server refuses it, and the
/// connect says who answered what.
#[tokio::test]
async fn the_api_key_reaches_every_request() {
    let fake = Arc::new(FakeEngine::new(rollout_proxy::FakeEngineConfig::default()));
    let key = SecretString::from("sk-policy".to_string());
    let server = GenerateServer::with_engine(
        GenerateServerConfig {
            api_key: Some(key.clone()),
            ..GenerateServerConfig::default()
        },
        fake.clone(),
    );
    let server = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), server.router())
        .await
        .expect("listens");
    let url = format!("http://{}", server.local_addr());
    let Err(err) = SglangEngine::connect(SglangConfig::new(url.clone())).await else {
        panic!("a keyless client is refused");
    };
    assert!(err.to_string().contains("401"), "{err}");
    let mut config = SglangConfig::new(url);
    config.api_key = Some(key);
    let engine = SglangEngine::connect(config)
        .await
        .expect("connects with the key");
    let (tokens, _) = run(&engine, vec![1, 2], 4).await;
    assert_eq!(tokens.len(), 4);
    engine
        .update_weights_from_disk(WeightUpdate {
            path: "/ckpt".into(),
            version: Some(1),
        })
        .await
        .expect("updates with the key");
    engine
        .pause(rollout_proxy::PauseMode::Retract)
        .await
        .expect("pauses with the key");
    engine.resume().await.expect("continues with the key");
    assert!(
        !format!("{engine:?}").contains("sk-policy"),
        "the key never shows in Debug"
    );
}

/// `connect` waits while `/health` answers 503 (the model is loading) and gives up after its bound, naming
/// the server and what it answered.
#[tokio::test]
async fn connect_waits_for_health() {
    let loading = GenerateServer::new(GenerateServerConfig::default());
    let listening = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), loading.router())
        .await
        .expect("listens");
    let url = format!("http://{}", listening.local_addr());
    let mut config = SglangConfig::new(url.clone());
    config.ready_timeout = Some(std::time::Duration::from_millis(800));
    let err = SglangEngine::connect(config.clone())
        .await
        .expect_err("never ready");
    let text = err.to_string();
    assert!(text.contains(&url) && text.contains("503"), "{text}");
    config.ready_timeout = Some(std::time::Duration::from_secs(30));
    let connecting = tokio::spawn(SglangEngine::connect(config));
    // Whenever the load ends, the waiting client goes on.
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    let fake = Arc::new(FakeEngine::new(rollout_proxy::FakeEngineConfig {
        max_context_len: 300,
        ..Default::default()
    }));
    assert!(loading.install(fake));
    let engine = connecting.await.expect("task").expect("ready once loaded");
    assert_eq!(engine.max_context_len(), 299);
}

/// An update whose server does not report the new version afterwards is an error naming the server.
#[tokio::test]
async fn an_update_is_confirmed_with_get_weight_version() {
    use axum::routing::get;
    let app = axum::Router::new()
        .route(
            "/update_weights_from_disk",
            post(|| async {
                axum::Json(json!({"success": true, "message": "ok", "num_paused_requests": 0}))
            }),
        )
        .route(
            "/get_weight_version",
            get(|| async { axum::Json(json!({"weight_version": "default"})) }),
        );
    let server = ProxyServer::serve_router("127.0.0.1:0".parse().expect("addr"), app)
        .await
        .expect("listens");
    let url = format!("http://{}", server.local_addr());
    let mut config = SglangConfig::new(url.clone());
    config.max_context_len = Some(100);
    config.ready_timeout = None;
    let engine = SglangEngine::connect(config).await.expect("connects");
    let err = engine
        .update_weights_from_disk(WeightUpdate {
            path: "/c".into(),
            version: Some(2),
        })
        .await
        .expect_err("unconfirmed");
    let text = err.to_string();
    assert!(
        text.contains(&url) && text.contains("version 0") && text.contains("version 2"),
        "{text}"
    );
}
