//! `SglangEngine` against `generate_router` serving the fake engine over real sockets (and against a
//! hand-written cumulative SGLang stream), and the proxy in front of it as in the bench.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::routing::post;
use futures::StreamExt;
use http::StatusCode;
use rollout_proxy::{
    EngineEvent, FakeEngine, FinishReason, GenerateRequest, InferenceEngine, ProxyServer, ProxyState,
    SamplingParams, SglangConfig, SglangEngine, WeightUpdate, generate_router,
};
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
    for stream in [true, false] {
        let mut config = SglangConfig::new(format!("http://{}", server.local_addr()));
        config.stream = stream;
        let engine = SglangEngine::connect(config).await.expect("connects");
        assert_eq!(engine.max_context_len(), 1000, "read from /get_server_info");
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
        .expect("updates");
    engine.flush_cache().await.expect("flushes");
    assert_eq!(
        fake.weight_updates()[0].path,
        std::path::PathBuf::from("/ckpt/step-3")
    );
    assert_eq!(fake.flushes(), 1);
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
    let engine = SglangEngine::connect(config).await.expect("connects");
    let (tokens, finish) = run(&engine, vec![1], 10).await;
    assert_eq!(tokens, vec![(11, -0.5, 2), (12, -0.5, 3), (7, -0.5, 3)]);
    assert_eq!(finish, FinishReason::Stop { matched: Some(7) });

    let mut config = SglangConfig::new("http://127.0.0.1:9");
    config.max_context_len = Some(100);
    let unreachable = SglangEngine::connect(config).await.expect("no request yet");
    let mut stream = unreachable.generate(GenerateRequest {
        input_ids: vec![1].into(),
        sampling: SamplingParams::default(),
        images: Vec::new(),
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
