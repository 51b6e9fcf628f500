//! The rollout proxy under a long mixed load, as a training run and its misbehaving harnesses would give
//! it: many short sessions (start, one to three turns, end, export), each turn in Chat Completions,
//! Anthropic Messages or Responses, streamed or not; among the sessions, a share whose client abandons its
//! stream after the first bytes and a share whose client stops reading a long stream (so the proxy's write
//! timeout, 1 s here, must drop it). A stalled session runs apart from the client that started it, as a
//! hung harness would while its scheduler moves on.
//!
//! The proxy runs in a child process (this binary, `ARENA_RL_PROXY_SOAK_ROLE=proxy`) on a fake engine that
//! samples a token a millisecond, so its resident memory (`VmRSS`) and live heap (a counting allocator in
//! the child, which prints it every 250 ms) are the proxy's alone. Each criterion iteration is a round of
//! 96 sessions through 32 closed-loop clients; criterion reports sessions per second. The summary prints
//! request throughput, p50/p99 latency of the well-behaved requests by protocol, what became of the
//! abandoned and stalled streams, the proxy's memory over time, and its memory and session gauges once
//! every session has ended and been exported, against the baseline taken after a warm-up round; it is
//! also written to `<target>/criterion/proxy-soak-summary.json`.
//!
//! Needs `ARENA_RL_SMOLLM2` (`eval "$(cargo xtask fixtures)"`).

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/latency.rs"]
mod latency;
#[path = "common/summary.rs"]
mod summary;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, SamplingMode, Throughput};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use rollout_proxy::{
    ChatModel, ConnectionLimits, FakeEngine, FakeEngineConfig, ProxyConfig, ProxyServer, ProxyState,
};
use secrecy::SecretString;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpSocket;

const ROLE: &str = "ARENA_RL_PROXY_SOAK_ROLE";
const ADMIN: &str = "soak-admin-key";
const CLIENTS: usize = 32;
const ROUND: usize = 96;
/// Tokens of a well-behaved turn, and of a stream a client stops reading.
const TURN_TOKENS: u32 = 32;
const STALLED_TOKENS: u32 = 6000;
const WRITE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a stalling client reads nothing before it looks whether the proxy has closed its connection.
const STALL_LOOK: Duration = Duration::from_secs(4);

fn fixture(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: run `eval \"$(cargo xtask fixtures)\"` before `cargo bench --bench proxy_soak`"
        )
    })
}

/// The child: the proxy on a fake engine, its address on the first line of stdout, then its live heap
/// bytes every 250 ms.
fn proxy_role() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let model = Arc::new(ChatModel::from_dir(fixture("ARENA_RL_SMOLLM2")).expect("SmolLM2 loads"));
        let engine = Arc::new(FakeEngine::new(FakeEngineConfig {
            token_latency: Duration::from_millis(1),
            output_len: STALLED_TOKENS,
            max_context_len: 8192,
            vocab: 200..5000,
            eos_token: None,
            record: false,
            ..FakeEngineConfig::default()
        }));
        let mut config = ProxyConfig::new(SecretString::from(ADMIN));
        config.capacity_grants = false;
        config.connection = ConnectionLimits {
            write_timeout: WRITE_TIMEOUT,
            ..ConnectionLimits::default()
        };
        let state = ProxyState::new(config, model, engine).expect("state");
        // A modest send buffer (accepted connections inherit it), so that a stalled client's stream fills
        // it within a few hundred tokens whatever the kernel's autotuning would grow it to.
        let socket = TcpSocket::new_v4().expect("a socket");
        socket.set_send_buffer_size(16 * 1024).expect("a send buffer");
        socket.bind("127.0.0.1:0".parse().expect("addr")).expect("binds");
        let server = ProxyServer::start_on(socket.listen(4096).expect("listens"), state).expect("serves");
        println!("{}", server.local_addr());
        loop {
            println!("heap {}", counting_alloc::LIVE.load(Ordering::Relaxed));
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    });
}

struct ChildProcess(Child);

impl Drop for ChildProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The child's resident memory, in bytes.
fn rss(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// A small deterministic generator, so every run draws the same sessions.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Protocol {
    Chat,
    Messages,
    Responses,
}

impl Protocol {
    const ALL: [Self; 3] = [Self::Chat, Self::Messages, Self::Responses];

    fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::Messages => "messages",
            Self::Responses => "responses",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Self::Chat => "/v1/chat/completions",
            Self::Messages => "/v1/messages",
            Self::Responses => "/v1/responses",
        }
    }

    fn body(self, text: &str, tokens: u32, stream: bool) -> String {
        match self {
            Self::Chat => json!({"model": "smol", "max_tokens": tokens, "stream": stream,
                "messages": [{"role": "user", "content": text}]}),
            Self::Messages => json!({"model": "smol", "max_tokens": tokens, "stream": stream,
                "messages": [{"role": "user", "content": text}]}),
            Self::Responses => json!({"model": "smol", "max_output_tokens": tokens, "stream": stream,
                "input": text, "store": true}),
        }
        .to_string()
    }
}

/// What the clients saw, for the summary.
#[derive(Default)]
struct Tally {
    sessions: usize,
    requests: usize,
    latencies: BTreeMap<Protocol, Vec<Duration>>,
    abandoned: usize,
    stalled: usize,
    /// How long the proxy took to close a stalled stream, from the request.
    stall_closed: Vec<Duration>,
    /// Requests or control calls that did not succeed, by what they were.
    failures: BTreeMap<String, usize>,
}

type Http = Client<HttpConnector, Full<Bytes>>;

struct Load {
    client: Http,
    addr: SocketAddr,
    tally: Mutex<Tally>,
    next_seed: AtomicU64,
    /// Stalled sessions run apart from the client that started them (a harness that hangs while its
    /// scheduler moves on); a round ends once they have too.
    stalled: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Load {
    fn fail(&self, what: &str) {
        *self
            .tally
            .lock()
            .expect("tally")
            .failures
            .entry(what.to_string())
            .or_default() += 1;
    }

    async fn post(&self, path: &str, key: &str, body: String) -> Option<(http::StatusCode, Bytes)> {
        let request = http::Request::post(format!("http://{}{path}", self.addr))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .body(Full::new(Bytes::from(body)))
            .expect("request");
        let response = self.client.request(request).await.ok()?;
        let status = response.status();
        let bytes = response.into_body().collect().await.ok()?.to_bytes();
        Some((status, bytes))
    }

    async fn admin(&self, path: &str, body: Value) -> Option<Value> {
        match self.post(path, ADMIN, body.to_string()).await {
            Some((status, bytes)) if status.is_success() => serde_json::from_slice(&bytes).ok(),
            _ => {
                self.fail(path);
                None
            }
        }
    }

    /// One session: start, its turns (well-behaved, abandoned or stalled), end, export.
    async fn session(self: &Arc<Self>, rng: &mut Rng) {
        let Some(started) = self
            .admin(
                "/rl/start_session",
                json!({"task_id": format!("soak{}", rng.next())}),
            )
            .await
        else {
            return;
        };
        let (Some(id), Some(key)) = (started["session_id"].as_str(), started["api_key"].as_str()) else {
            self.fail("start_session reply");
            return;
        };
        let protocol = Protocol::ALL[rng.below(3) as usize];
        match rng.below(10) {
            0 => self.abandon(protocol, key).await,
            1 => {
                let (load, id, key) = (self.clone(), id.to_string(), key.to_string());
                let stalled = tokio::spawn(async move {
                    load.stall(protocol, &key).await;
                    load.finish(&id, &key).await;
                });
                self.stalled.lock().expect("stalled").push(stalled);
                return;
            }
            _ => {
                for turn in 0..=rng.below(3) {
                    let protocol = Protocol::ALL[rng.below(3) as usize];
                    let text = format!("Turn {turn} of a short task: summarise file {}.", rng.below(1000));
                    let body = protocol.body(&text, TURN_TOKENS, rng.below(2) == 0);
                    let start = Instant::now();
                    match self.post(protocol.path(), key, body).await {
                        Some((status, _)) if status.is_success() => {
                            let mut tally = self.tally.lock().expect("tally");
                            tally.requests += 1;
                            tally.latencies.entry(protocol).or_default().push(start.elapsed());
                        }
                        _ => self.fail(protocol.name()),
                    }
                }
            }
        }
        self.finish(id, key).await;
    }

    /// Ends a session and exports it, which frees everything it held.
    async fn finish(&self, id: &str, key: &str) {
        let _ = self.post("/rl/end_session", key, "{}".into()).await;
        self.admin(
            "/export_trajectories",
            json!({"session_id": id, "style": "individual"}),
        )
        .await;
        self.tally.lock().expect("tally").sessions += 1;
    }

    /// A stream the client drops after its first bytes.
    async fn abandon(&self, protocol: Protocol, key: &str) {
        let request = http::Request::post(format!("http://{}{}", self.addr, protocol.path()))
            .header("content-type", "application/json")
            .header("authorization", format!("Bearer {key}"))
            .header("x-api-key", key)
            .body(Full::new(Bytes::from(protocol.body(
                "Write a long essay.",
                STALLED_TOKENS,
                true,
            ))))
            .expect("request");
        match self.client.request(request).await {
            Ok(response) => {
                let mut body = response.into_body();
                let _ = body.frame().await;
                drop(body);
                self.tally.lock().expect("tally").abandoned += 1;
            }
            Err(_) => self.fail("abandon"),
        }
    }

    /// A long stream on a socket with a small receive buffer that the client never reads, until the proxy
    /// closes it.
    async fn stall(&self, protocol: Protocol, key: &str) {
        let socket = TcpSocket::new_v4().expect("a socket");
        let _ = socket.set_recv_buffer_size(4096);
        let Ok(mut stream) = socket.connect(self.addr).await else {
            self.fail("stall connect");
            return;
        };
        let body = protocol.body("Write a long essay.", STALLED_TOKENS, true);
        let request = format!(
            "POST {} HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\nx-api-key: {key}\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            protocol.path(),
            body.len()
        );
        let start = Instant::now();
        if stream.write_all(request.as_bytes()).await.is_err() {
            self.fail("stall send");
            return;
        }
        // The stream fills the socket's buffers within a few hundred tokens; reading nothing for four times
        // the write timeout leaves the proxy ample time to close the connection. The client then drains
        // what the kernel buffered, to the close (were the connection still open, reading would unblock the
        // stream, which then runs to its end).
        tokio::time::sleep(STALL_LOOK).await;
        let mut sink = vec![0u8; 64 * 1024];
        let closed = tokio::time::timeout(Duration::from_secs(30), async {
            while let Ok(n) = stream.read(&mut sink).await {
                if n == 0 {
                    break;
                }
            }
        })
        .await;
        let mut tally = self.tally.lock().expect("tally");
        tally.stalled += 1;
        if closed.is_ok() {
            tally.stall_closed.push(start.elapsed());
        } else {
            drop(tally);
            self.fail("stall never closed");
        }
    }

    /// A round: `sessions` sessions through `CLIENTS` closed-loop clients.
    async fn round(self: &Arc<Self>, sessions: usize) -> Duration {
        let next = Arc::new(AtomicUsize::new(0));
        let start = Instant::now();
        let mut tasks = Vec::new();
        for _ in 0..CLIENTS {
            let (load, next) = (self.clone(), next.clone());
            let seed = self.next_seed.fetch_add(1, Ordering::Relaxed);
            tasks.push(tokio::spawn(async move {
                let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1));
                while next.fetch_add(1, Ordering::Relaxed) < sessions {
                    load.session(&mut rng).await;
                }
            }));
        }
        for t in tasks {
            t.await.expect("a client task ends");
        }
        let stalled = std::mem::take(&mut *self.stalled.lock().expect("stalled"));
        for t in stalled {
            t.await.expect("a stalled session ends");
        }
        start.elapsed()
    }

    /// The proxy's gauges that must be back to zero once every session is exported.
    async fn gauges(&self) -> BTreeMap<String, f64> {
        let request = http::Request::get(format!("http://{}/metrics", self.addr))
            .body(Full::new(Bytes::new()))
            .expect("request");
        let Ok(response) = self.client.request(request).await else {
            return BTreeMap::new();
        };
        let Ok(body) = response.into_body().collect().await else {
            return BTreeMap::new();
        };
        let text = String::from_utf8_lossy(&body.to_bytes()).into_owned();
        [
            "rollout_proxy_live_sessions",
            "rollout_proxy_stored_tokens",
            "rollout_proxy_reserved_tokens",
            "rollout_proxy_stored_response_bytes",
            "rollout_proxy_aborted_generations_total",
            "rollout_proxy_generations_total",
        ]
        .into_iter()
        .filter_map(|name| {
            let value = text
                .lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))?
                .trim()
                .parse()
                .ok()?;
            Some((name.trim_start_matches("rollout_proxy_").to_string(), value))
        })
        .collect()
    }
}

/// One sample of the child's memory.
#[derive(Clone, Copy)]
struct MemorySample {
    at: Duration,
    rss: u64,
    heap: u64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
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
    let pid = child.id();
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let addr: SocketAddr = lines
        .next()
        .expect("the proxy prints its address")
        .expect("a line")
        .trim()
        .parse()
        .expect("an address");
    let _child = ChildProcess(child);
    let heap = Arc::new(AtomicU64::new(0));
    {
        let heap = heap.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                if let Some(n) = line.strip_prefix("heap ").and_then(|n| n.parse().ok()) {
                    heap.store(n, Ordering::Relaxed);
                }
            }
        });
    }
    let began = Instant::now();
    let samples: Arc<Mutex<Vec<MemorySample>>> = Arc::default();
    {
        let (samples, heap) = (samples.clone(), heap.clone());
        std::thread::spawn(move || {
            loop {
                let sample = MemorySample {
                    at: began.elapsed(),
                    rss: rss(pid),
                    heap: heap.load(Ordering::Relaxed),
                };
                samples.lock().expect("samples").push(sample);
                std::thread::sleep(Duration::from_millis(500));
            }
        });
    }

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let load = Arc::new(Load {
        client: Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(usize::MAX)
            .build(HttpConnector::new()),
        addr,
        tally: Mutex::default(),
        next_seed: AtomicU64::new(1),
        stalled: Mutex::default(),
    });
    // Warm-up: one round, then everything it held is gone; the baseline is what the proxy holds then.
    let settle = |load: &Arc<Load>| {
        runtime.block_on(async {
            // The stalled streams' last drops and the heap line trail the round by up to a second.
            tokio::time::sleep(Duration::from_millis(1500)).await;
            load.gauges().await
        })
    };
    runtime.block_on(load.round(ROUND));
    let warm_gauges = settle(&load);
    let baseline = MemorySample {
        at: began.elapsed(),
        rss: rss(pid),
        heap: heap.load(Ordering::Relaxed),
    };
    *load.tally.lock().expect("tally") = Tally::default();

    let soak_start = Instant::now();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(40));
    {
        let mut group = criterion.benchmark_group("proxy_soak");
        group.sampling_mode(SamplingMode::Flat);
        group.throughput(Throughput::Elements(ROUND as u64));
        group.bench_function("mixed_sessions", |b| {
            b.iter_custom(|iters| {
                runtime.block_on(async {
                    let mut total = Duration::ZERO;
                    for _ in 0..iters {
                        total += load.round(ROUND).await;
                    }
                    total
                })
            });
        });
        group.finish();
    }
    let soak_time = soak_start.elapsed();
    let end_gauges = settle(&load);
    let end = MemorySample {
        at: began.elapsed(),
        rss: rss(pid),
        heap: heap.load(Ordering::Relaxed),
    };

    let mut tally = load.tally.lock().expect("tally");
    let mut report = serde_json::Map::new();
    println!(
        "\nproxy soak: {CLIENTS} clients, rounds of {ROUND} sessions (80% one to three turns of {TURN_TOKENS} tokens in a random protocol, streamed or not; 10% abandon a stream after its first bytes; 10% stop reading a {STALLED_TOKENS}-token stream), a token a millisecond, write timeout {WRITE_TIMEOUT:?}"
    );
    let busy = soak_time.as_secs_f64();
    println!(
        "{} sessions and {} well-behaved requests in {busy:.1} s: {:.1} sessions/s, {:.1} requests/s; {} abandoned, {} stalled",
        tally.sessions,
        tally.requests,
        tally.sessions as f64 / busy,
        tally.requests as f64 / busy,
        tally.abandoned,
        tally.stalled
    );
    let mut all = Vec::new();
    for (protocol, latencies) in &mut tally.latencies {
        latencies.sort();
        all.extend(latencies.iter().copied());
        let (p50, p99) = (
            latency::percentile_ms(latencies, 0.5),
            latency::percentile_ms(latencies, 0.99),
        );
        println!(
            "  {:<10} {:>6} requests  p50 {p50:>7.2} ms  p99 {p99:>7.2} ms",
            protocol.name(),
            latencies.len()
        );
        report.insert(
            format!("latency_{}", protocol.name()),
            json!({"requests": latencies.len(), "p50_ms": p50, "p99_ms": p99}),
        );
    }
    all.sort();
    let (p50, p99) = (
        latency::percentile_ms(&all, 0.5),
        latency::percentile_ms(&all, 0.99),
    );
    println!(
        "  {:<10} {:>6} requests  p50 {p50:>7.2} ms  p99 {p99:>7.2} ms",
        "all",
        all.len()
    );
    tally.stall_closed.sort();
    let stall_p50 = latency::percentile_ms(&tally.stall_closed, 0.5);
    let stall_max = tally
        .stall_closed
        .last()
        .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0);
    println!(
        "stalled streams the proxy had closed when their client looked: {} of {} (p50 {stall_p50:.0} ms, max {stall_max:.0} ms after the request; the client looks after {STALL_LOOK:?}); generations aborted during the soak: {} (abandoned {} + stalled {} = {})",
        tally.stall_closed.len(),
        tally.stalled,
        end_gauges
            .get("aborted_generations_total")
            .copied()
            .unwrap_or(f64::NAN)
            - warm_gauges
                .get("aborted_generations_total")
                .copied()
                .unwrap_or(f64::NAN),
        tally.abandoned,
        tally.stalled,
        tally.abandoned + tally.stalled
    );
    if tally.failures.is_empty() {
        println!("no request or control call failed");
    } else {
        println!("failures: {:?}", tally.failures);
    }
    println!("memory of the proxy process over time (RSS / live heap):");
    let samples = samples.lock().expect("samples").clone();
    let every = (samples.len() / 24).max(1);
    let mut series = Vec::new();
    for s in samples.iter().step_by(every) {
        println!(
            "  {:>6.1} s  {:>8.1} MiB  {:>8.1} MiB",
            s.at.as_secs_f64(),
            mib(s.rss),
            mib(s.heap)
        );
        series.push(json!({"at_s": s.at.as_secs_f64(), "rss": s.rss, "heap": s.heap}));
    }
    let peak_rss = samples.iter().map(|s| s.rss).max().unwrap_or(0);
    let peak_heap = samples.iter().map(|s| s.heap).max().unwrap_or(0);
    println!(
        "baseline after the warm-up round: RSS {:.1} MiB, heap {:.1} MiB; peak RSS {:.1} MiB, heap {:.1} MiB; after every session ended and was exported: RSS {:.1} MiB ({:+.1}), heap {:.1} MiB ({:+.2})",
        mib(baseline.rss),
        mib(baseline.heap),
        mib(peak_rss),
        mib(peak_heap),
        mib(end.rss),
        mib(end.rss) - mib(baseline.rss),
        mib(end.heap),
        mib(end.heap) - mib(baseline.heap)
    );
    println!("proxy gauges after the warm-up: {warm_gauges:?}");
    println!("proxy gauges at the end: {end_gauges:?}");
    report.insert("sessions".into(), json!(tally.sessions));
    report.insert("requests".into(), json!(tally.requests));
    report.insert("seconds".into(), json!(busy));
    report.insert("sessions_per_s".into(), json!(tally.sessions as f64 / busy));
    report.insert("requests_per_s".into(), json!(tally.requests as f64 / busy));
    report.insert("p50_ms".into(), json!(p50));
    report.insert("p99_ms".into(), json!(p99));
    report.insert("abandoned".into(), json!(tally.abandoned));
    report.insert("stalled".into(), json!(tally.stalled));
    report.insert("stalled_closed".into(), json!(tally.stall_closed.len()));
    report.insert(
        "aborted_generations".into(),
        json!(
            end_gauges
                .get("aborted_generations_total")
                .copied()
                .unwrap_or(f64::NAN)
                - warm_gauges
                    .get("aborted_generations_total")
                    .copied()
                    .unwrap_or(f64::NAN)
        ),
    );
    report.insert("failures".into(), json!(tally.failures));
    report.insert(
        "memory".into(),
        json!({"baseline": {"rss": baseline.rss, "heap": baseline.heap},
               "peak": {"rss": peak_rss, "heap": peak_heap},
               "end": {"rss": end.rss, "heap": end.heap}, "series": series}),
    );
    report.insert("gauges_end".into(), json!(end_gauges));
    summary::write_summary(report, "proxy-soak-summary.json");
    criterion.final_summary();
}
