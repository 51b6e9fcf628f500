//! How long the rollout proxy takes to answer `/health` while clients press its Responses store: the latency
//! figures of the hardening issue's items 3 and 10, which its tests assert by structure only (no global lock
//! held while serialising a stored answer; a continuation's chain copied outside the lock and prepared on the
//! blocking pool).
//!
//! The proxy runs in a child process (this binary, `ARENA_RL_PROXY_HEALTH_ROLE=proxy`) on a fake engine
//! with no token latency. Three scenarios, each a criterion benchmark of one `/health` round trip on its own
//! connection:
//! - `idle`: nothing else runs;
//! - `store_gets`: four clients loop `GET /v1/responses/{id}` of one stored answer of
//!   [`BIG_ANSWER_TOKENS`] tokens;
//! - `continuations`: six clients loop a 3-word `previous_response_id` continuation (not stored) of their
//!   own chain of [`CHAIN_TURNS`] stored turns.
//!
//! Before the scenarios, [`CPU_CONTINUATIONS`] continuations sent one at a time give the proxy's CPU time per
//! continuation (its process's user and system time, from `/proc`).
//!
//! The summary prints p50/p95/p99 of `/health` in each scenario, with the load's own request rate, and
//! writes it to `<target>/criterion/proxy-health-summary.json`. Needs `ARENA_RL_SMOLLM2`
//! (`eval "$(cargo xtask fixtures)"`).

#[path = "common/latency.rs"]
mod latency;
#[path = "common/proc_cpu.rs"]
mod proc_cpu;
#[path = "common/summary.rs"]
mod summary;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollout_proxy::{ChatModel, FakeEngine, FakeEngineConfig, ProxyConfig, ProxyServer, ProxyState};
use secrecy::SecretString;
use serde_json::{Value, json};

const ROLE: &str = "ARENA_RL_PROXY_HEALTH_ROLE";
const ADMIN: &str = "health-admin-key";
/// Tokens of the stored answer the GET loops read (about 0.2 MB of JSON).
const BIG_ANSWER_TOKENS: u32 = 40_000;
const GET_CLIENTS: usize = 4;
/// Stored turns of each continuing client's chain, each with a user message of about 1.5 KB.
const CHAIN_TURNS: usize = 40;
const CONTINUING_CLIENTS: usize = 6;
/// Continuations sent one at a time to measure the proxy's CPU time per continuation.
const CPU_CONTINUATIONS: usize = 200;

fn fixture(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run `eval \"$(cargo xtask fixtures)\"` before `cargo bench --bench proxy_health`"
        )
    })
}

/// The child: the proxy on a fake engine, its address on the first line of stdout.
fn proxy_role() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let model = Arc::new(ChatModel::from_dir(fixture("ARENA_RL_SMOLLM2")).expect("SmolLM2 loads"));
        let engine = Arc::new(FakeEngine::new(FakeEngineConfig {
            token_latency: Duration::ZERO,
            output_len: BIG_ANSWER_TOKENS,
            max_context_len: 131_072,
            vocab: 200..5000,
            eos_token: None,
            record: false,
            ..FakeEngineConfig::default()
        }));
        let mut config = ProxyConfig::new(SecretString::from(ADMIN));
        config.capacity_grants = false;
        let state = ProxyState::new(config, model, engine).expect("state");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binds");
        let server = ProxyServer::start_on(listener, state).expect("serves");
        println!("{}", server.local_addr());
        std::future::pending::<()>().await;
    });
}

struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

type Http = Client<HttpConnector, Full<Bytes>>;

struct Proxy {
    client: Http,
    addr: SocketAddr,
}

impl Proxy {
    async fn send(
        &self,
        method: http::Method,
        path: &str,
        key: &str,
        body: Option<Value>,
    ) -> Result<(http::StatusCode, Bytes), String> {
        let request = http::Request::builder()
            .method(method)
            .uri(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .body(Full::new(Bytes::from(
                body.map(|b| b.to_string()).unwrap_or_default(),
            )))
            .expect("request");
        let response = self.client.request(request).await.map_err(|e| e.to_string())?;
        let status = response.status();
        let bytes = response
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        Ok((status, bytes))
    }

    async fn ok(&self, path: &str, key: &str, body: Value) -> Value {
        let (status, bytes) = self
            .send(http::Method::POST, path, key, Some(body))
            .await
            .unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(
            status.is_success(),
            "{path}: {status} {}",
            String::from_utf8_lossy(&bytes)
        );
        serde_json::from_slice(&bytes).expect("a JSON answer")
    }

    /// A new session's key.
    async fn session(&self, task: &str) -> String {
        let started = self
            .ok("/rl/start_session", ADMIN, json!({"task_id": task}))
            .await;
        started["api_key"].as_str().expect("a key").to_string()
    }
}

/// A load that runs on the runtime until it is stopped, counting its requests and failures.
struct Load {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
    started: Instant,
}

impl Load {
    fn none() -> Self {
        Self {
            stop: Arc::default(),
            done: Arc::default(),
            failed: Arc::default(),
            tasks: Vec::new(),
            started: Instant::now(),
        }
    }

    /// Runs `request` in a loop on `clients` tasks.
    fn start<F, Fut>(runtime: &tokio::runtime::Runtime, clients: usize, request: F) -> Self
    where
        F: Fn(usize) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = bool> + Send,
    {
        let mut load = Self::none();
        let request = Arc::new(request);
        for i in 0..clients {
            let (stop, done, failed, request) = (
                load.stop.clone(),
                load.done.clone(),
                load.failed.clone(),
                request.clone(),
            );
            load.tasks.push(runtime.spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    if request(i).await {
                        done.fetch_add(1, Ordering::Relaxed);
                    } else {
                        failed.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
        load
    }

    /// Stops the load; returns its requests per second and its failures.
    fn stop(self, runtime: &tokio::runtime::Runtime) -> (f64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let seconds = self.started.elapsed().as_secs_f64();
        runtime.block_on(async {
            for task in self.tasks {
                let _ = task.await;
            }
        });
        (
            self.done.load(Ordering::Relaxed) as f64 / seconds,
            self.failed.load(Ordering::Relaxed),
        )
    }
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("proxy") {
        proxy_role();
        return;
    }
    let exe = std::env::current_exe().expect("own path");
    let mut child = Command::new(exe)
        .env(ROLE, "proxy")
        .stdout(Stdio::piped())
        .spawn()
        .expect("the proxy process starts");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr: SocketAddr = lines
        .next()
        .expect("the proxy prints its address")
        .expect("a line")
        .trim()
        .parse()
        .expect("an address");
    let proxy_pid = child.id();
    let _child = ChildProcess(child);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let proxy = Arc::new(Proxy {
        client: Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(HttpConnector::new()),
        addr,
    });
    // `/health` goes over a client of its own, so its connection never waits behind the load's.
    let health = Proxy {
        client: Client::builder(TokioExecutor::new()).build(HttpConnector::new()),
        addr,
    };

    // The stored answer the GET loops read, and each continuing client's chain.
    let (big, chains) = runtime.block_on(async {
        let key = proxy.session("store-gets").await;
        let answer = proxy
            .ok(
                "/v1/responses",
                &key,
                json!({"model": "smol", "input": "Write out the whole log.", "store": true,
                       "max_output_tokens": BIG_ANSWER_TOKENS}),
            )
            .await;
        let big = (key, answer["id"].as_str().expect("a response id").to_string());
        let mut chains = Vec::new();
        for c in 0..CONTINUING_CLIENTS {
            let key = proxy.session(&format!("chain{c}")).await;
            let mut previous: Option<String> = None;
            for turn in 0..CHAIN_TURNS {
                let text = format!("Turn {turn}: here is the next file to review. ").repeat(30);
                let mut body =
                    json!({"model": "smol", "input": text, "store": true, "max_output_tokens": 32});
                if let Some(id) = &previous {
                    body["previous_response_id"] = json!(id);
                }
                let answer = proxy.ok("/v1/responses", &key, body).await;
                previous = Some(answer["id"].as_str().expect("a response id").to_string());
            }
            chains.push((key, previous.expect("a chain")));
        }
        (big, chains)
    });
    let stored_bytes = runtime.block_on(async {
        let path = format!("/v1/responses/{}", big.1);
        let (_, bytes) = proxy
            .send(http::Method::GET, &path, &big.0, None)
            .await
            .expect("the stored answer");
        bytes.len()
    });
    println!("stored answer: {stored_bytes} bytes of JSON; each chain {CHAIN_TURNS} turns");
    // What one continuation costs the proxy, alone: its CPU time over continuations sent one at a time,
    // which the machine's other work moves far less than a rate or a latency.
    let continuation_cpu_ms = runtime.block_on(async {
        let meter = proc_cpu::CpuMeter::new();
        let before = meter.seconds(proxy_pid);
        for i in 0..CPU_CONTINUATIONS {
            let (key, previous) = &chains[i % chains.len()];
            let body = json!({"model": "smol", "input": "and now?", "store": false,
                              "max_output_tokens": 1, "previous_response_id": previous});
            proxy.ok("/v1/responses", key, body).await;
        }
        before
            .zip(meter.seconds(proxy_pid))
            .map(|(b, a)| (a - b) * 1e3 / CPU_CONTINUATIONS as f64)
    });
    if let Some(ms) = continuation_cpu_ms {
        println!(
            "one continuation of a {CHAIN_TURNS}-turn chain: {ms:.2} ms of the proxy's CPU (mean of {CPU_CONTINUATIONS}, one at a time)"
        );
    }
    let big = Arc::new(big);
    let chains = Arc::new(chains);

    let latencies: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(20)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(8));
    let mut report = serde_json::Map::new();
    println!();
    for scenario in ["idle", "store_gets", "continuations"] {
        let load = match scenario {
            "store_gets" => {
                let (proxy, big) = (proxy.clone(), big.clone());
                Load::start(&runtime, GET_CLIENTS, move |_| {
                    let (proxy, big) = (proxy.clone(), big.clone());
                    async move {
                        let path = format!("/v1/responses/{}", big.1);
                        matches!(proxy.send(http::Method::GET, &path, &big.0, None).await,
                                 Ok((s, _)) if s.is_success())
                    }
                })
            }
            "continuations" => {
                let (proxy, chains) = (proxy.clone(), chains.clone());
                Load::start(&runtime, CONTINUING_CLIENTS, move |i| {
                    let (proxy, chains) = (proxy.clone(), chains.clone());
                    async move {
                        let (key, previous) = &chains[i];
                        let body = json!({"model": "smol", "input": "and now?", "store": false,
                                          "max_output_tokens": 1, "previous_response_id": previous});
                        matches!(proxy.send(http::Method::POST, "/v1/responses", key, Some(body)).await,
                                 Ok((s, _)) if s.is_success())
                    }
                })
            }
            _ => Load::none(),
        };
        latencies.lock().expect("latencies").clear();
        {
            let mut group = criterion.benchmark_group("proxy_health");
            group.sampling_mode(SamplingMode::Flat);
            group.bench_function(scenario, |b| {
                b.iter_custom(|iters| {
                    runtime.block_on(async {
                        let mut total = Duration::ZERO;
                        for _ in 0..iters {
                            let start = Instant::now();
                            let answer = health.send(http::Method::GET, "/health", "", None).await;
                            let took = start.elapsed();
                            assert!(
                                matches!(answer, Ok((s, _)) if s.is_success()),
                                "/health failed: {answer:?}"
                            );
                            latencies.lock().expect("latencies").push(took);
                            total += took;
                        }
                        total
                    })
                });
            });
            group.finish();
        }
        let (rate, failed) = load.stop(&runtime);
        let mut sorted = latencies.lock().expect("latencies").clone();
        sorted.sort();
        let [p50, p95, p99] = [0.5, 0.95, 0.99].map(|p| latency::percentile_ms(&sorted, p));
        println!(
            "proxy_health/{scenario}: /health p50 {p50:.3} ms, p95 {p95:.3} ms, p99 {p99:.3} ms over {} requests; \
             load {rate:.0} requests/s, {failed} failed",
            sorted.len()
        );
        report.insert(
            scenario.into(),
            json!({"p50_ms": p50, "p95_ms": p95, "p99_ms": p99, "health_requests": sorted.len(),
                   "load_requests_per_second": rate, "load_failures": failed}),
        );
    }
    report.insert("stored_answer_bytes".into(), json!(stored_bytes));
    report.insert("continuation_cpu_ms".into(), json!(continuation_cpu_ms));
    summary::write_summary(report, "proxy-health-summary.json");
}
