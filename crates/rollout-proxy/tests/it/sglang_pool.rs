//! `EnginePool` over two SGLang imitations on loopback, through real `SglangEngine` clients: a weight update
//! pauses, updates, confirms and continues every server, keeps per-token versions across the update, retries
//! a server that fails once, and stops with one error naming a server that never agrees; a generation an
//! `abort` pause interrupts is resubmitted and its caller sees one generation; a generation whose server dies
//! under it moves to another server with the tokens produced so far; a server that died is left out of
//! updates while the others go on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::routing::{get, post};
use futures::StreamExt;
use rollout_proxy::{
    EngineEvent, EnginePool, FakeEngine, FakeEngineConfig, GenerateRequest, GenerateServer,
    GenerateServerConfig, InferenceEngine, PauseMode, ProxyServer, SamplingParams, SglangConfig,
    SglangEngine, WeightUpdate,
};
use serde_json::json;

async fn listen(router: axum::Router) -> (ProxyServer, String) {
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = ProxyServer::serve_router(addr, router).await.expect("listens");
    let url = format!("http://{}", server.local_addr());
    (server, url)
}

async fn client(url: &str, mode: PauseMode) -> Arc<SglangEngine> {
    let mut config = SglangConfig::new(url);
    config.pause_mode = mode;
    Arc::new(SglangEngine::connect(config).await.expect("connects"))
}

/// A pool over the servers at `a` and `b`, paused in `retract` mode around updates.
async fn retract_pool(a: &str, b: &str) -> EnginePool {
    let mut engines: Vec<(String, Arc<dyn InferenceEngine>)> = Vec::new();
    for url in [a, b] {
        engines.push((url.to_string(), client(url, PauseMode::Retract).await));
    }
    EnginePool::new(engines, PauseMode::Retract)
}

fn fake(latency_ms: u64) -> Arc<FakeEngine> {
    Arc::new(FakeEngine::new(FakeEngineConfig {
        output_len: 30,
        token_latency: Duration::from_millis(latency_ms),
        max_context_len: 200,
        ..FakeEngineConfig::default()
    }))
}

fn request() -> GenerateRequest {
    GenerateRequest {
        input_ids: vec![1, 2, 3].into(),
        sampling: SamplingParams {
            max_new_tokens: 40,
            ..SamplingParams::default()
        },
        images: Vec::new(),
        affinity: None,
    }
}

#[tokio::test]
async fn an_update_pauses_updates_confirms_and_continues_every_server() {
    for mode in [PauseMode::Retract, PauseMode::InPlace] {
        let (a, b) = (fake(20), fake(20));
        let sa = GenerateServer::with_engine(GenerateServerConfig::default(), a.clone());
        let sb = GenerateServer::with_engine(GenerateServerConfig::default(), b.clone());
        let (_la, ua) = listen(sa.router()).await;
        let (_lb, ub) = listen(sb.router()).await;
        let (ca, cb) = (client(&ua, mode).await, client(&ub, mode).await);
        let pool = EnginePool::new(
            vec![
                (ua.clone(), ca.clone() as Arc<dyn InferenceEngine>),
                (ub.clone(), cb.clone() as Arc<dyn InferenceEngine>),
            ],
            mode,
        );
        // One generation on each server (the pool balances by load), running across the update.
        let mut streams = vec![pool.generate(request()), pool.generate(request())];
        for s in &mut streams {
            assert!(matches!(s.next().await, Some(Ok(EngineEvent::Token(_)))));
        }
        assert_eq!(a.requests().len() + b.requests().len(), 2);
        assert_eq!(
            (a.requests().len(), b.requests().len()),
            (1, 1),
            "least loaded first"
        );
        pool.update_weights_from_disk(WeightUpdate {
            path: "/ckpt/step-1".into(),
            version: Some(1),
        })
        .await
        .expect("the pool agrees on version 1");
        for (server, engine) in [(&sa, &ca), (&sb, &cb)] {
            assert_eq!(server.weight_version(), "1");
            assert_eq!(engine.weight_version().await.expect("asks"), 1);
        }
        for mut s in streams {
            let mut versions = vec![0];
            while let Some(event) = s.next().await {
                match event.expect("no error") {
                    EngineEvent::Token(t) => versions.push(t.version),
                    EngineEvent::Finished(_) => break,
                }
            }
            assert_eq!(versions.len(), 30, "{mode}: the generation ran to its end");
            let cut = versions
                .iter()
                .position(|v| *v == 1)
                .expect("tokens after the update");
            assert!(versions[..cut].iter().all(|v| *v == 0) && versions[cut..].iter().all(|v| *v == 1));
        }
        assert_eq!(
            (a.weight_updates().len(), b.weight_updates().len()),
            (1, 1),
            "one update per server"
        );
    }
}

/// A server that refuses its first update is asked again; one that never agrees stops the update with an
/// error naming it, and the other servers are continued (generation goes on).
#[tokio::test]
async fn a_failing_server_is_retried_and_a_pool_that_cannot_agree_says_which_server() {
    let good = fake(0);
    let server = GenerateServer::with_engine(GenerateServerConfig::default(), good.clone());
    let (_lg, ug) = listen(server.router()).await;
    // A server that fails `failures` updates, then behaves; it reports the version it last accepted.
    let flaky = |failures: usize| {
        let calls = Arc::new(AtomicUsize::new(0));
        let version = Arc::new(std::sync::Mutex::new("default".to_string()));
        let (c, v) = (calls.clone(), version.clone());
        let router = axum::Router::new()
            .route("/health", get(|| async { "" }))
            .route(
                "/get_server_info",
                get(|| async { axum::Json(json!({"context_length": 100})) }),
            )
            .route(
                "/pause_generation",
                post(|| async { axum::Json(json!({"status": "ok"})) }),
            )
            .route(
                "/continue_generation",
                post(|| async { axum::Json(json!({"status": "ok"})) }),
            )
            .route(
                "/update_weights_from_disk",
                post(move |body: axum::body::Bytes| async move {
                    let body: serde_json::Value = serde_json::from_slice(&body).expect("json");
                    if c.fetch_add(1, Ordering::SeqCst) < failures {
                        let answer =
                            json!({"success": false, "message": "disk busy", "num_paused_requests": 0});
                        return (http::StatusCode::BAD_REQUEST, axum::Json(answer));
                    }
                    *v.lock().expect("lock") = body["weight_version"].as_str().expect("a string").to_string();
                    (
                        http::StatusCode::OK,
                        axum::Json(json!({"success": true, "message": "ok"})),
                    )
                }),
            )
            .route(
                "/get_weight_version",
                get(move || {
                    let v = version.clone();
                    async move { axum::Json(json!({"weight_version": *v.lock().expect("lock")})) }
                }),
            );
        (router, calls)
    };
    let (router, calls) = flaky(1);
    let (_lf, uf) = listen(router).await;
    let pool = retract_pool(&ug, &uf).await;
    pool.update_weights_from_disk(WeightUpdate {
        path: "/c".into(),
        version: Some(4),
    })
    .await
    .expect("the second attempt succeeds");
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert_eq!(server.weight_version(), "4");

    let (router, calls) = flaky(usize::MAX);
    let (_lb, ub) = listen(router).await;
    let pool = retract_pool(&ug, &ub).await;
    let err = pool
        .update_weights_from_disk(WeightUpdate {
            path: "/c".into(),
            version: Some(5),
        })
        .await
        .expect_err("the pool cannot agree");
    let text = err.to_string();
    assert!(
        text.contains(&ub)
            && text.contains("weight version 5")
            && text.contains("disk busy")
            && !text.contains(&ug),
        "{text}"
    );
    assert_eq!(
        calls.load(Ordering::SeqCst),
        rollout_proxy::POOL_ATTEMPTS as usize
    );
    // The good server was continued: it generates again.
    let mut s = client(&ug, PauseMode::Retract).await.generate(request());
    assert!(matches!(s.next().await, Some(Ok(EngineEvent::Token(_)))));
}

/// Paused in `abort` mode, the server ends the running generation; the client resubmits it with the tokens
/// produced so far appended to the prompt and the rest of its budget, so its caller sees one generation of
/// the full length, its tokens before the update of version 0 and after it of version 1.
#[tokio::test]
async fn an_aborted_generation_is_resubmitted_and_keeps_accumulating() {
    let engine = Arc::new(FakeEngine::new(FakeEngineConfig {
        output_len: 100,
        token_latency: Duration::from_millis(15),
        max_context_len: 300,
        ..FakeEngineConfig::default()
    }));
    let server = GenerateServer::with_engine(GenerateServerConfig::default(), engine.clone());
    let (_listening, url) = listen(server.router()).await;
    let sglang = client(&url, PauseMode::Abort).await;
    let pool = EnginePool::new(
        vec![(url.clone(), sglang.clone() as Arc<dyn InferenceEngine>)],
        PauseMode::Abort,
    );
    let mut stream = pool.generate(GenerateRequest {
        input_ids: vec![1, 2, 3].into(),
        sampling: SamplingParams {
            max_new_tokens: 30,
            ..SamplingParams::default()
        },
        images: Vec::new(),
        affinity: None,
    });
    let mut tokens = Vec::new();
    match stream.next().await {
        Some(Ok(EngineEvent::Token(t))) => tokens.push(t),
        other => panic!("expected a first token, got {other:?}"),
    }
    pool.update_weights_from_disk(WeightUpdate {
        path: "/ckpt".into(),
        version: Some(1),
    })
    .await
    .expect("updates");
    let finish = loop {
        match stream.next().await.expect("an event").expect("no error") {
            EngineEvent::Token(t) => tokens.push(t),
            EngineEvent::Finished(f) => break f,
        }
    };
    assert_eq!(
        finish,
        rollout_proxy::FinishReason::Length,
        "the caller never sees the abort"
    );
    assert_eq!(tokens.len(), 30);
    let requests = engine.requests();
    assert_eq!(requests.len(), 2, "one resubmission");
    let cut = requests[1].input_ids.len() - 3;
    assert!((1..30).contains(&cut), "{cut}");
    let ids: Vec<u32> = tokens.iter().map(|t| t.id).collect();
    assert_eq!(requests[1].input_ids[..3], [1, 2, 3]);
    assert_eq!(
        requests[1].input_ids[3..],
        ids[..cut],
        "the tokens produced so far extend the prompt"
    );
    assert_eq!(
        requests[1].sampling.max_new_tokens as usize,
        30 - cut,
        "the rest of the budget"
    );
    assert!(tokens[..cut].iter().all(|t| t.version == 0) && tokens[cut..].iter().all(|t| t.version == 1));
    let outputs = engine.outputs();
    let resumed: Vec<u32> = outputs[1].iter().map(|t| t.id).collect();
    assert_eq!(ids[cut..], resumed[..], "then the resubmission's tokens, exactly");
}

/// Requests with one affinity key stay on one server, new keys spread over the least loaded, and the keys
/// of a server whose connection fails move to the others.
#[tokio::test]
async fn sessions_stick_to_a_server_and_a_dead_servers_sessions_move() {
    let (a, b) = (fake(0), fake(0));
    let (la, ua) =
        listen(GenerateServer::with_engine(GenerateServerConfig::default(), a.clone()).router()).await;
    let (_lb, ub) =
        listen(GenerateServer::with_engine(GenerateServerConfig::default(), b.clone()).router()).await;
    let pool = retract_pool(&ua, &ub).await;
    let keyed = |key: &str, prompt: u32| GenerateRequest {
        input_ids: vec![prompt].into(),
        affinity: Some(key.into()),
        ..request()
    };
    async fn finish(pool: &EnginePool, request: GenerateRequest) -> Result<(), rollout_proxy::EngineError> {
        let mut s = pool.generate(request);
        while let Some(event) = s.next().await {
            if matches!(event?, EngineEvent::Finished(_)) {
                return Ok(());
            }
        }
        panic!("no finish")
    }
    let keys = ["s1", "s2", "s3", "s4"];
    for round in 0..3u32 {
        for (i, key) in keys.iter().enumerate() {
            finish(&pool, keyed(key, 10 * round + i as u32 + 1))
                .await
                .expect("served");
        }
    }
    let home: Vec<usize> = keys.iter().map(|k| pool.server_of(k).expect("routed")).collect();
    assert!(
        home.contains(&0) && home.contains(&1),
        "new keys spread: {home:?}"
    );
    let seen =
        |engine: &FakeEngine| -> Vec<u32> { engine.requests().iter().map(|r| r.input_ids[0]).collect() };
    for (i, server) in home.iter().enumerate() {
        let engine = if *server == 0 { &a } else { &b };
        let expected: Vec<u32> = (0..3).map(|round| 10 * round + i as u32 + 1).collect();
        assert!(
            expected.iter().all(|p| seen(engine).contains(p)),
            "every request of {} went to its server",
            keys[i]
        );
    }
    assert_eq!(a.requests().len() + b.requests().len(), 12);
    // Server A goes away: the next request of one of its keys finds its connection refused and is served
    // by B, and so is the key from then on.
    let moved = keys[home.iter().position(|s| *s == 0).expect("a key on A")];
    la.shutdown().await.expect("stops");
    finish(&pool, keyed(moved, 90))
        .await
        .expect("moved to the other server");
    assert!(seen(&b).contains(&90));
    assert_eq!(pool.server_of(moved), Some(1));
    assert_eq!(
        pool.generations_moved(),
        1,
        "its connection was refused, so it moved"
    );
    finish(&pool, keyed(moved, 91))
        .await
        .expect("served by the other server");
    assert_eq!(pool.server_of(moved), Some(1));
    assert!(seen(&b).contains(&91));
    // A new key avoids the dead server from the start.
    finish(&pool, keyed("s9", 92)).await.expect("served");
    assert_eq!(pool.server_of("s9"), Some(1));
}

/// A server that died is left out of the next weight update: the others are paused, updated, confirmed and
/// continued, the dead one serves nothing (new keys and its old keys go to the others), and a pool with
/// no server left to reach is one error.
#[tokio::test]
async fn a_dead_server_is_left_out_of_updates_and_the_others_go_on() {
    let (a, b) = (fake(0), fake(0));
    let server_a = GenerateServer::with_engine(GenerateServerConfig::default(), a.clone());
    let server_b = GenerateServer::with_engine(GenerateServerConfig::default(), b.clone());
    let (la, ua) = listen(server_a.router()).await;
    let (lb, ub) = listen(server_b.router()).await;
    let pool = retract_pool(&ua, &ub).await;
    let update = |version: u32| WeightUpdate {
        path: "/c".into(),
        version: Some(version),
    };
    pool.update_weights_from_disk(update(1))
        .await
        .expect("both update");
    assert_eq!(
        (server_a.weight_version(), server_b.weight_version()),
        ("1".into(), "1".into())
    );
    la.shutdown().await.expect("stops");
    pool.update_weights_from_disk(update(2))
        .await
        .expect("the live server updates without the dead one");
    assert_eq!(server_b.weight_version(), "2");
    assert_eq!(
        server_a.weight_version(),
        "1",
        "the dead server was never reached"
    );
    // Every new key goes to the live server, at the new version.
    for key in ["k1", "k2", "k3"] {
        let mut s = pool.generate(GenerateRequest {
            affinity: Some(key.into()),
            ..request()
        });
        let mut versions = Vec::new();
        while let Some(event) = s.next().await {
            match event.expect("served") {
                EngineEvent::Token(t) => versions.push(t.version),
                EngineEvent::Finished(_) => break,
            }
        }
        assert!(
            !versions.is_empty() && versions.iter().all(|v| *v == 2),
            "{versions:?}"
        );
        assert_eq!(pool.server_of(key), Some(1));
    }
    lb.shutdown().await.expect("stops");
    let err = pool
        .update_weights_from_disk(update(3))
        .await
        .expect_err("no server is left");
    assert!(
        err.to_string().contains("no policy server can be reached"),
        "{err}"
    );
}

/// A TCP forwarder in front of `target` whose connections can all be cut at once, as a server's death
/// (or a network partition) cuts them: the client sees its connection reset in the middle of a stream.
struct Cuttable {
    url: String,
    cut: tokio::sync::watch::Sender<bool>,
}

impl Cuttable {
    async fn new(target: &str) -> Self {
        let target: SocketAddr = target
            .strip_prefix("http://")
            .expect("http url")
            .parse()
            .expect("addr");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let (cut, watch) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let mut watch = watch.clone();
                if *watch.borrow() {
                    continue;
                }
                tokio::spawn(async move {
                    let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        // Both ends close as a dying process's do, in the middle of whatever they carry.
                        _ = watch.wait_for(|cut| *cut) => {}
                    }
                });
            }
        });
        Self { url, cut }
    }

    fn cut(&self) {
        let _ = self.cut.send(true);
    }
}

/// A generation whose server dies in the middle of its stream moves to the other server: resubmitted there
/// with its prompt and the tokens produced so far and the rest of its budget, so its caller sees one
/// generation of the full length; the dead server is marked down, and a pool with no other server left
/// passes the transport error on.
#[tokio::test]
async fn a_generation_whose_server_dies_moves_to_another_with_its_tokens() {
    let (a, b) = (fake(20), fake(0));
    let (_la, ua) =
        listen(GenerateServer::with_engine(GenerateServerConfig::default(), a.clone()).router()).await;
    let (_lb, ub) =
        listen(GenerateServer::with_engine(GenerateServerConfig::default(), b.clone()).router()).await;
    let front = Cuttable::new(&ua).await;
    let pool = retract_pool(&front.url, &ub).await;
    let mut stream = pool.generate(GenerateRequest {
        affinity: Some("s1".into()),
        sampling: SamplingParams {
            max_new_tokens: 30,
            ..SamplingParams::default()
        },
        ..request()
    });
    assert_eq!(
        pool.server_of("s1"),
        Some(0),
        "a new key goes to the first server"
    );
    let mut tokens = Vec::new();
    for _ in 0..5 {
        match stream.next().await {
            Some(Ok(EngineEvent::Token(t))) => tokens.push(t.id),
            other => panic!("expected a token from the first server, got {other:?}"),
        }
    }
    front.cut();
    let finish = loop {
        match stream
            .next()
            .await
            .expect("an event")
            .expect("the caller never sees the failure")
        {
            EngineEvent::Token(t) => tokens.push(t.id),
            EngineEvent::Finished(f) => break f,
        }
    };
    assert_eq!(finish, rollout_proxy::FinishReason::Length);
    assert_eq!(tokens.len(), 30, "the generation ran to its full length");
    let moved = b.requests();
    assert_eq!(moved.len(), 1, "resubmitted once, to the other server");
    let cut = moved[0].input_ids.len() - 3;
    assert!((5..30).contains(&cut), "{cut} tokens came from the first server");
    assert_eq!(moved[0].input_ids[..3], [1, 2, 3]);
    assert_eq!(
        moved[0].input_ids[3..],
        tokens[..cut],
        "the tokens produced so far extend the prompt"
    );
    assert_eq!(
        moved[0].sampling.max_new_tokens as usize,
        30 - cut,
        "the rest of the budget"
    );
    let resumed: Vec<u32> = b.outputs()[0].iter().map(|t| t.id).collect();
    assert_eq!(
        tokens[cut..],
        resumed[..],
        "then the other server's tokens, exactly"
    );
    assert_eq!(pool.server_of("s1"), Some(1), "the key moved with it");
    assert_eq!(pool.generations_moved(), 1);

    // A generation whose servers both die has nowhere to go: the caller sees the failure.
    let (x, y) = (Cuttable::new(&ua).await, Cuttable::new(&ub).await);
    let pool = retract_pool(&x.url, &y.url).await;
    let mut stream = pool.generate(request());
    assert!(matches!(stream.next().await, Some(Ok(EngineEvent::Token(_)))));
    x.cut();
    y.cut();
    let mut saw = None;
    while let Some(event) = stream.next().await {
        if let Err(e) = event {
            saw = Some(e);
            break;
        }
    }
    assert!(
        matches!(saw, Some(rollout_proxy::EngineError::Transport(_))),
        "{saw:?}"
    );
}

/// A TCP server that accepts every connection, reads what it is sent, and never answers.
async fn silent_server() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    url
}

/// A server that refuses every request with a 500 whose body never ends.
async fn endless_refusal() -> String {
    let endless = || async {
        let chunks = futures::stream::repeat_with(|| {
            Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 64 * 1024]))
        });
        (
            http::StatusCode::INTERNAL_SERVER_ERROR,
            axum::body::Body::from_stream(chunks),
        )
    };
    let router = axum::Router::new()
        .route("/pause_generation", post(endless))
        .route("/generate", post(endless));
    let (server, url) = listen(router).await;
    std::mem::forget(server);
    url
}

/// Every call to a server that accepts and never answers ends within the client's configured deadline (each
/// assertion allows a bound derived from it, never a guess at timing): `connect`'s readiness wait, a
/// generation, a pause; a pool's weight update leaves that server out and the other server updates; a
/// refusal with an endless body is read only in part.
#[tokio::test]
async fn a_server_that_never_answers_cannot_stall_a_send_or_the_pools_update() {
    let limit = Duration::from_millis(300);
    let quiet = |url: &str| {
        let mut config = SglangConfig::new(url);
        config.pause_mode = PauseMode::Retract;
        config.request_timeout = limit;
        config.generate_idle_timeout = limit;
        config.weight_update_timeout = limit;
        config
    };
    let silent = silent_server().await;
    let mut config = quiet(&silent);
    config.ready_timeout = Some(limit * 3);
    let err = tokio::time::timeout(limit * 10, SglangEngine::connect(config))
        .await
        .expect("connect gives up at its ready deadline")
        .expect_err("never ready");
    assert!(err.to_string().contains("not ready"), "{err}");

    let mut config = quiet(&silent);
    config.ready_timeout = None;
    config.max_context_len = Some(200);
    let engine = Arc::new(SglangEngine::connect(config).await.expect("asks nothing"));
    let mut stream = engine.generate(request());
    let first = tokio::time::timeout(limit * 4, stream.next())
        .await
        .expect("the generation ends at its idle deadline")
        .expect("an event");
    assert!(
        first.as_ref().is_err_and(|e| e.to_string().contains("/generate")),
        "{first:?}"
    );
    let err = tokio::time::timeout(limit * 4, engine.pause(PauseMode::Retract))
        .await
        .expect("the pause ends at its deadline")
        .expect_err("no answer");
    assert!(err.to_string().contains("no complete answer"), "{err}");

    let good = fake(0);
    let server = GenerateServer::with_engine(GenerateServerConfig::default(), good.clone());
    let (_live, url) = listen(server.router()).await;
    let pool = EnginePool::new(
        vec![
            ("silent".into(), engine.clone() as Arc<dyn InferenceEngine>),
            (url.clone(), client(&url, PauseMode::Retract).await),
        ],
        PauseMode::Retract,
    );
    // Each of the pool's attempts at the silent server ends within `limit`, with 200 ms between attempts.
    let bound = (limit + Duration::from_millis(200)) * 3 * rollout_proxy::POOL_ATTEMPTS + limit * 4;
    tokio::time::timeout(
        bound,
        pool.update_weights_from_disk(WeightUpdate {
            path: "/c".into(),
            version: Some(1),
        }),
    )
    .await
    .expect("the update is not stalled by the silent server")
    .expect("the live server updates");
    assert_eq!(server.weight_version(), "1");
    assert_eq!(pool.servers_down(), 1);

    let refusing = endless_refusal().await;
    let mut config = quiet(&refusing);
    config.ready_timeout = None;
    config.max_context_len = Some(200);
    config.request_timeout = Duration::from_secs(600);
    let engine = SglangEngine::connect(config).await.expect("asks nothing");
    let err = tokio::time::timeout(Duration::from_secs(60), engine.pause(PauseMode::Retract))
        .await
        .expect("an endless refusal is read only in part")
        .expect_err("refused");
    assert!(
        err.to_string().contains("500"),
        "{}",
        &err.to_string()[..200.min(err.to_string().len())]
    );
    assert!(err.to_string().len() < 1024, "the refusal is cut");
}
