//! The rollout proxy against LiteLLM, in the same run, on the fixed workload: a 200-token chat
//! prompt, 32 generated tokens, and an upstream that answers at once.
//!
//! - arena-rl: the proxy with `SglangEngine` in front of `generate_router` serving a zero-latency fake.
//! - LiteLLM (`litellm[proxy]`, from `ARENA_RL_PY_CLIENTS`'s virtualenv) in front of a fake OpenAI server
//!   that answers a fixed 32-token completion.
//!
//! The system under test runs in its own process pinned to core 0 (`taskset -c 0`); this process (the load
//! generator and both fake upstreams) pins itself to core 1. Each criterion iteration is a closed loop of
//! `c` clients sending a batch of requests (non-streaming and streaming chat) at concurrency 1, 64 and 1024;
//! criterion reports requests per second, and the summary at the end prints throughput, p50/p99 latency,
//! their ratios, and the proxy's retained heap bytes per stored token (measured in this process with a
//! counting allocator). The summary is also written to `<target>/criterion/proxy-summary.json`.
//!
//! Needs `ARENA_RL_SMOLLM2` and `ARENA_RL_PY_CLIENTS` (`eval "$(cargo xtask fixtures)"`).

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, SamplingMode, Throughput};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollout_proxy::{
    ChatModel, FakeEngine, FakeEngineConfig, ProxyConfig, ProxyServer, ProxyState, SglangConfig,
    SglangEngine, generate_router,
};
use secrecy::SecretString;
use serde_json::{Value, json};

/// Counts live heap bytes, so the bench can report what the session store retains per token.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call forwards to the system allocator unchanged and only adds bookkeeping.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's layout.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's pointer and layout.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE.fetch_add(new_size, Ordering::Relaxed);
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        // SAFETY: forwarded with the caller's arguments.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const ROLE: &str = "ARENA_RL_PROXY_BENCH_ROLE";
const ADMIN: &str = "bench-admin-key";
const LITELLM_KEY: &str = "sk-bench-master";
const GENERATED: u32 = 32;
const LEVELS: [usize; 3] = [1, 64, 1024];

fn fixture(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run `eval \"$(cargo xtask fixtures)\"` before `cargo bench --bench proxy`")
    })
}

fn model() -> Arc<ChatModel> {
    Arc::new(ChatModel::from_dir(fixture("ARENA_RL_SMOLLM2")).expect("SmolLM2 loads"))
}

fn config() -> ProxyConfig {
    let mut c = ProxyConfig::new(SecretString::from(ADMIN));
    c.capacity_grants = false;
    c.limits.max_sessions = 4096;
    c.limits.max_stored_tokens = 4_000_000_000;
    c
}

/// A user message that makes the SmolLM2 template render a prompt of about 200 tokens.
fn messages(model: &ChatModel) -> Value {
    let mut text = String::new();
    let sentence = "Please refactor the parser module so that errors carry the offending line number. ";
    loop {
        let messages = json!([{"role": "system", "content": "You are a careful coding agent."}, {"role": "user", "content": text}]);
        let rendered = model
            .template
            .render(messages.as_array().expect("array"), Default::default())
            .expect("renders");
        if model.tokenizer.encode(&rendered).expect("encodes").len() >= 200 {
            return messages;
        }
        text.push_str(sentence);
    }
}

/// Pins this process (all its threads) to `core` when `taskset` is available.
fn pin_self(core: usize) -> bool {
    Command::new("taskset")
        .args([
            "-a",
            "-p",
            "-c",
            &core.to_string(),
            &std::process::id().to_string(),
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The proxy process: serves the proxy on one worker thread in front of the SGLang fake at `upstream`.
fn proxy_role(upstream: String) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async move {
        let engine = SglangEngine::connect(SglangConfig::new(upstream))
            .await
            .expect("connects to the fake SGLang");
        let state = ProxyState::new(config(), model(), Arc::new(engine)).expect("state");
        let server = ProxyServer::start("127.0.0.1:0".parse().expect("addr"), state)
            .await
            .expect("listens");
        println!("{}", server.local_addr());
        std::future::pending::<()>().await;
    });
}

struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn pinned(core: usize, program: &str) -> Command {
    if Command::new("taskset").arg("--version").output().is_ok() {
        let mut c = Command::new("taskset");
        c.args(["-c", &core.to_string(), program]);
        c
    } else {
        Command::new(program)
    }
}

/// A fake OpenAI Chat Completions server answering 32 tokens at once (JSON or SSE).
fn openai_fake() -> axum::Router {
    let words: Vec<String> = (0..GENERATED).map(|i| format!(" w{i}")).collect();
    let full = json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "smol",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": words.concat()}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 200, "completion_tokens": GENERATED, "total_tokens": 200 + GENERATED}})
    .to_string();
    let mut sse = String::new();
    for w in &words {
        let chunk = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "smol",
            "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": null}]});
        sse.push_str(&format!("data: {chunk}\n\n"));
    }
    let last = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "smol",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
    sse.push_str(&format!("data: {last}\n\ndata: [DONE]\n\n"));
    let (full, sse) = (Bytes::from(full), Bytes::from(sse));
    axum::Router::new().route(
        "/v1/chat/completions",
        axum::routing::post(move |body: Bytes| {
            let (full, sse) = (full.clone(), sse.clone());
            async move {
                let streaming = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get("stream").and_then(Value::as_bool))
                    .unwrap_or(false);
                if streaming {
                    ([("content-type", "text/event-stream")], sse)
                } else {
                    ([("content-type", "application/json")], full)
                }
            }
        }),
    )
}

#[derive(Clone)]
struct Target {
    name: &'static str,
    url: String,
    keys: Arc<Vec<String>>,
    body: Value,
}

type Http = Client<HttpConnector, Full<Bytes>>;

async fn one(client: &Http, target: &Target, key: &str, stream: bool) -> Duration {
    let mut body = target.body.clone();
    body["stream"] = json!(stream);
    let body = Bytes::from(body.to_string());
    let start = Instant::now();
    // A burst of 1024 new connections can overflow the listen backlog; a reset connection is retried (the
    // retry counts in the latency) rather than failing the run.
    for attempt in 0.. {
        let request = http::Request::post(&target.url)
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(Full::new(body.clone()))
            .expect("request");
        let response = match client.request(request).await {
            Ok(r) => r,
            Err(e) if attempt < 5 && (e.is_connect() || format!("{e:?}").contains("ConnectionReset")) => {
                RETRIES.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
            Err(e) => panic!("{}: the system under test did not answer: {e:?}", target.name),
        };
        let status = response.status();
        let bytes = response.into_body().collect().await.expect("body").to_bytes();
        assert!(
            status.is_success(),
            "{}: HTTP {status}: {}",
            target.name,
            String::from_utf8_lossy(&bytes)
        );
        break;
    }
    start.elapsed()
}

static RETRIES: AtomicUsize = AtomicUsize::new(0);

/// Runs `total` requests through `c` closed-loop clients; answers the wall time and each latency.
async fn load(
    client: &Http,
    target: &Target,
    c: usize,
    total: usize,
    stream: bool,
) -> (Duration, Vec<Duration>) {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..c.min(total) {
        let (client, target, next) = (client.clone(), target.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let key = target.keys[worker % target.keys.len()].clone();
            let mut latencies = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                latencies.push(one(&client, &target, &key, stream).await);
            }
            latencies
        }));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    (start.elapsed(), all)
}

#[derive(Default)]
struct Stats {
    requests: usize,
    busy: Duration,
    latencies: Vec<Duration>,
}

fn percentile(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i].as_secs_f64() * 1000.0
}

/// Heap bytes the proxy retains per stored token after `n` first-turn sessions of the workload.
fn memory_per_token(runtime: &tokio::runtime::Runtime, body: &Value) -> (f64, u64) {
    runtime.block_on(async {
        let fake = Arc::new(FakeEngine::new(FakeEngineConfig {
            output_len: GENERATED,
            eos_token: None,
            record: false,
            ..FakeEngineConfig::default()
        }));
        let state = ProxyState::new(config(), model(), fake).expect("state");
        let app = rollout_proxy::router(state.clone());
        let post = |path: &str, key: &str, body: String| {
            http::Request::post(path)
                .header("authorization", format!("Bearer {key}"))
                .header("content-type", "application/json")
                .body(axum::body::Body::from(body))
                .expect("request")
        };
        use tower::ServiceExt;
        // Warm up lazily allocated state (tokenizer caches, metrics maps) before measuring.
        let mut keys = Vec::new();
        for i in 0..1001 {
            let r = app
                .clone()
                .oneshot(post(
                    "/rl/start_session",
                    ADMIN,
                    json!({"task_id": format!("mem{i}")}).to_string(),
                ))
                .await
                .expect("answers");
            let v: Value = serde_json::from_slice(&r.into_body().collect().await.expect("body").to_bytes())
                .expect("json");
            keys.push(v["api_key"].as_str().expect("key").to_string());
        }
        let chat = |key: String| {
            let app = app.clone();
            let body = body.to_string();
            async move {
                let r = app
                    .oneshot(post("/v1/chat/completions", &key, body))
                    .await
                    .expect("answers");
                assert!(r.status().is_success());
                r.into_body().collect().await.expect("body");
            }
        };
        chat(keys[1000].clone()).await;
        let before = LIVE.load(Ordering::Relaxed);
        let tokens_before = stored_tokens(&app).await;
        for key in &keys[..1000] {
            chat(key.clone()).await;
        }
        let after = LIVE.load(Ordering::Relaxed);
        let tokens = stored_tokens(&app).await - tokens_before;
        ((after.saturating_sub(before)) as f64 / tokens as f64, tokens)
    })
}

async fn stored_tokens(app: &axum::Router) -> u64 {
    use tower::ServiceExt;
    let r = app
        .clone()
        .oneshot(
            http::Request::get("/metrics")
                .body(axum::body::Body::empty())
                .expect("request"),
        )
        .await
        .expect("answers");
    let text =
        String::from_utf8(r.into_body().collect().await.expect("body").to_bytes().to_vec()).expect("utf-8");
    text.lines()
        .find_map(|l| l.strip_prefix("rollout_proxy_stored_tokens "))
        .and_then(|v| v.trim().parse().ok())
        .expect("stored tokens gauge")
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("proxy") {
        proxy_role(std::env::var("ARENA_RL_PROXY_BENCH_UPSTREAM").expect("upstream"));
        return;
    }
    let two_cores = std::thread::available_parallelism()
        .map(|n| n.get() >= 2)
        .unwrap_or(false);
    let pinned_ok = two_cores && pin_self(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let model = model();
    let body_messages = messages(&model);
    let prompt_tokens = model
        .tokenizer
        .encode(
            &model
                .template
                .render(
                    body_messages.as_array().expect("array"),
                    rollout_proxy::template::RenderOptions {
                        add_generation_prompt: true,
                        ..Default::default()
                    },
                )
                .expect("renders"),
        )
        .expect("encodes")
        .len();
    let body = json!({"model": "smol", "messages": body_messages, "max_tokens": GENERATED});

    // Upstreams, in this process (core 1).
    let (sglang_addr, openai_addr, _upstreams) = runtime.block_on(async {
        let fake = Arc::new(FakeEngine::new(FakeEngineConfig {
            output_len: GENERATED,
            eos_token: None,
            record: false,
            max_context_len: 8192,
            ..FakeEngineConfig::default()
        }));
        let any: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let sglang = ProxyServer::serve_router(any, generate_router(fake))
            .await
            .expect("sglang fake");
        let openai = ProxyServer::serve_router(any, openai_fake())
            .await
            .expect("openai fake");
        (sglang.local_addr(), openai.local_addr(), (sglang, openai))
    });

    // The systems under test (core 0).
    let exe = std::env::current_exe().expect("own path");
    let mut proxy = pinned(0, exe.to_str().expect("utf-8 path"))
        .env(ROLE, "proxy")
        .env("ARENA_RL_PROXY_BENCH_UPSTREAM", format!("http://{sglang_addr}"))
        .stdout(Stdio::piped())
        .spawn()
        .expect("proxy process");
    let mut line = String::new();
    BufReader::new(proxy.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("proxy address");
    let proxy_addr = line.trim().to_string();
    let python = std::path::PathBuf::from(fixture("ARENA_RL_PY_CLIENTS"));
    let litellm_bin = python.with_file_name("litellm");
    let dir = tempfile::tempdir().expect("temp dir");
    let litellm_config = dir.path().join("litellm.yaml");
    std::fs::write(
        &litellm_config,
        format!(
            "model_list:\n  - model_name: smol\n    litellm_params:\n      model: openai/smol\n      api_base: http://{openai_addr}/v1\n      api_key: upstream-key\ngeneral_settings:\n  master_key: {LITELLM_KEY}\nlitellm_settings:\n  drop_params: true\n  telemetry: false\n"
        ),
    )
    .expect("config");
    let litellm_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let litellm = pinned(0, litellm_bin.to_str().expect("utf-8 path"))
        .args([
            "--config",
            litellm_config.to_str().expect("utf-8 path"),
            "--port",
            &litellm_port.to_string(),
            "--num_workers",
            "1",
        ])
        .env("LITELLM_LOG", "ERROR")
        .env("LITELLM_TELEMETRY", "False")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("litellm starts");
    let _children = Children(vec![proxy, litellm]);

    let client: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(HttpConnector::new());
    let ours = runtime.block_on(async {
        let mut keys = Vec::new();
        for i in 0..LEVELS[LEVELS.len() - 1] {
            let r = rollout_proxy_call(
                &client,
                &format!("http://{proxy_addr}/rl/start_session"),
                json!({"task_id": format!("bench{i}")}),
            )
            .await;
            keys.push(r["api_key"].as_str().expect("key").to_string());
        }
        Target {
            name: "arena-rl",
            url: format!("http://{proxy_addr}/v1/chat/completions"),
            keys: Arc::new(keys),
            body: body.clone(),
        }
    });
    let litellm = Target {
        name: "litellm",
        url: format!("http://127.0.0.1:{litellm_port}/v1/chat/completions"),
        keys: Arc::new(vec![LITELLM_KEY.to_string()]),
        body: body.clone(),
    };
    runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let probe = http::Request::get(format!("http://127.0.0.1:{litellm_port}/health/liveliness"))
                .body(Full::new(Bytes::new()))
                .expect("request");
            if client.request(probe).await.is_ok_and(|r| r.status().is_success()) {
                break;
            }
            assert!(Instant::now() < deadline, "LiteLLM did not start within 180 s");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        // Warm both up (LiteLLM initialises its router on the first request).
        for target in [&ours, &litellm] {
            load(&client, target, 4, 16, false).await;
        }
    });

    let stats: Arc<Mutex<BTreeMap<String, Stats>>> = Arc::default();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for stream in [false, true] {
        let mode = if stream { "chat_stream" } else { "chat" };
        let mut group = criterion.benchmark_group(format!("proxy_{mode}"));
        group.sampling_mode(SamplingMode::Flat);
        for &c in &LEVELS {
            for target in [&ours, &litellm] {
                // One iteration is a batch through `c` closed-loop clients; LiteLLM's batches are smaller
                // so that its 1024-client level finishes in minutes.
                let batch = if target.name == "litellm" {
                    c.max(32)
                } else {
                    (4 * c).max(256)
                };
                group.throughput(Throughput::Elements(batch as u64));
                let key = format!("{mode}/{}/{c}", target.name);
                group.bench_with_input(BenchmarkId::new(target.name, c), &c, |b, &c| {
                    b.iter_custom(|iters| {
                        runtime.block_on(async {
                            let mut total = Duration::ZERO;
                            for _ in 0..iters {
                                let (elapsed, latencies) = load(&client, target, c, batch, stream).await;
                                total += elapsed;
                                let mut s = stats.lock().expect("stats");
                                let entry = s.entry(key.clone()).or_default();
                                entry.requests += latencies.len();
                                entry.busy += elapsed;
                                entry.latencies.extend(latencies);
                            }
                            total
                        })
                    });
                });
            }
        }
        group.finish();
    }

    let (bytes_per_token, measured_tokens) = memory_per_token(&runtime, &body);
    let mut report = serde_json::Map::new();
    println!(
        "\nproxy bench: {prompt_tokens}-token prompt, {GENERATED} generated tokens, pinned to separate cores: {pinned_ok}"
    );
    println!(
        "{:<12} {:>5} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9}",
        "mode",
        "c",
        "arena-rl/s",
        "litellm/s",
        "ours p50",
        "ours p99",
        "llm p50",
        "llm p99",
        "tput x",
        "p99 /"
    );
    let mut s = stats.lock().expect("stats");
    for mode in ["chat", "chat_stream"] {
        for c in LEVELS {
            let mut row = |name: &str| {
                let st = s.entry(format!("{mode}/{name}/{c}")).or_default();
                st.latencies.sort();
                let rps = st.requests as f64 / st.busy.as_secs_f64().max(1e-9);
                (
                    rps,
                    percentile(&st.latencies, 0.5),
                    percentile(&st.latencies, 0.99),
                    st.requests,
                )
            };
            let (ours_rps, ours_p50, ours_p99, ours_n) = row("arena-rl");
            let (llm_rps, llm_p50, llm_p99, llm_n) = row("litellm");
            println!(
                "{mode:<12} {c:>5} {ours_rps:>12.0} {llm_rps:>12.1} {ours_p50:>9.2}ms {ours_p99:>9.2}ms {llm_p50:>9.1}ms {llm_p99:>9.1}ms {:>9.1} {:>9.1}",
                ours_rps / llm_rps,
                llm_p99 / ours_p99
            );
            report.insert(
                format!("{mode}/{c}"),
                json!({"arena_rl": {"rps": ours_rps, "p50_ms": ours_p50, "p99_ms": ours_p99, "requests": ours_n},
                       "litellm": {"rps": llm_rps, "p50_ms": llm_p50, "p99_ms": llm_p99, "requests": llm_n},
                       "throughput_ratio": ours_rps / llm_rps, "p99_ratio": llm_p99 / ours_p99}),
            );
        }
    }
    println!(
        "retained heap per stored token: {bytes_per_token:.2} bytes ({measured_tokens} tokens in 1000 sessions)"
    );
    report.insert("bytes_per_stored_token".into(), json!(bytes_per_token));
    report.insert("prompt_tokens".into(), json!(prompt_tokens));
    report.insert("pinned".into(), json!(pinned_ok));
    let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = std::path::Path::new(&target_dir)
        .join("criterion")
        .join("proxy-summary.json");
    if std::fs::create_dir_all(path.parent().expect("parent")).is_ok() {
        let _ = std::fs::write(
            &path,
            serde_json::to_string_pretty(&Value::Object(report)).expect("json"),
        );
        println!("summary written to {}", path.display());
    }
    criterion.final_summary();
}

async fn rollout_proxy_call(client: &Http, url: &str, body: Value) -> Value {
    let request = http::Request::post(url)
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {ADMIN}"))
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let response = client.request(request).await.expect("proxy answers");
    let bytes = response.into_body().collect().await.expect("body").to_bytes();
    serde_json::from_slice(&bytes).expect("json")
}
