//! The rollout proxy against LiteLLM, in the same run, on the fixed workload: a 200-token prompt,
//! 32 generated tokens, and an upstream that answers at once; in four modes: Chat Completions
//! (non-streaming and streaming), and streaming Anthropic Messages and Responses.
//!
//! - arena-rl: the proxy with `SglangEngine` in front of `generate_router` serving a zero-latency fake; it
//!   serves every protocol natively.
//! - LiteLLM (`litellm[proxy]`, from `ARENA_RL_PY_CLIENTS`'s virtualenv) in front of a fake upstream that
//!   answers a fixed 32-token completion in the same protocol (`openai/` for Chat Completions and
//!   Responses, `anthropic/` for Messages), so that it passes each protocol through without translating.
//!
//! The system under test runs in its own process pinned to core 0 (`taskset -c 0`); this process (the load
//! generator and both fake upstreams) pins itself to core 1. Where it may (as root), the bench raises the
//! priority of both systems and of itself alike (see `Priority`), so that other work on a shared machine
//! does not decide the tails. Each criterion iteration is a closed loop of
//! `c` clients sending a batch of requests at concurrency 1, 64 and 1024; criterion reports requests per
//! second, and the summary at the end prints throughput, p50/p99 latency (to the last byte), each system's
//! CPU time per request (its process tree's user and system time over its batches, from `/proc`: what a
//! request costs, whether the system was saturated or waiting), their ratios, the machine's load average,
//! and the proxy's retained heap bytes per stored token (measured in this process with a counting
//! allocator). The summary is also written to
//! `<target>/criterion/proxy-summary.json`. `ARENA_RL_PROXY_BENCH_MODES` (comma-separated mode names)
//! limits the run to some modes. A request that fails (a connection refused or reset after five retries,
//! one broken before the answer, a body broken off, a status that is not a success) is counted by kind and
//! reported beside the figures, which count successes only: a peer that drops connections under load
//! never ends the run or loses its summary.
//!
//! `ARENA_RL_PROXY_BENCH_SYSTEMS` (comma-separated: `arena-rl`, `litellm`, `baseline`) measures only those,
//! for a quick look at one system or at a before and after without LiteLLM's long runs.
//!
//! `ARENA_RL_PROXY_BENCH_BASELINE`, the path of this bench built from an earlier commit, adds that build's
//! proxy as a third system under test (`baseline`, in its own process on core 0 like the current one), so
//! that a change's before and after are measured against LiteLLM in the same run; the summary then gives
//! both ratios and the current build's ratio over the baseline's. Since a single point moves by 20-40%
//! between runs on a small VM (and the CPU per request moves with it: the variation is in the work a
//! request costs, not in waiting), the before and after are also measured paired: per mode and level, 16
//! rounds of one batch on each build, the order alternating, and the quantiles of the rounds' throughput
//! ratios; drift during the run then weighs on both builds alike. The SGLang fake both proxies talk to
//! reports its context length (as a server started with `--context-length` does), which clients from
//! before `/v1/models` was read need.
//!
//! Needs `ARENA_RL_SMOLLM2` and `ARENA_RL_PY_CLIENTS` (`eval "$(cargo xtask fixtures)"`).

#[path = "common/counting_alloc.rs"]
mod counting_alloc;
#[path = "common/latency.rs"]
mod latency;
#[path = "common/proc_cpu.rs"]
mod proc_cpu;
#[path = "common/summary.rs"]
mod summary;
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
    ChatModel, FakeEngine, FakeEngineConfig, GenerateServer, GenerateServerConfig, ProxyConfig, ProxyServer,
    ProxyState, SglangConfig, SglangEngine,
};
use secrecy::SecretString;
use serde_json::{Value, json};

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

/// How the bench raises the scheduling priority of both systems under test and of itself (which needs
/// root): first-in-first-out real-time scheduling at the lowest real-time priority (`chrt -f 1`), else a
/// nice value of -10. Work of other users on a shared machine then preempts neither system, so tail
/// latencies measure the systems rather than their neighbours; both systems get the same treatment, and
/// the kernel's real-time throttling still leaves the machine 5% of each core.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Priority {
    Realtime,
    Nice,
    Normal,
}

impl Priority {
    /// Raises this process's priority before it starts threads (they inherit it).
    fn raise_own() -> Self {
        let pid = std::process::id().to_string();
        let ok = |program: &str, args: &[&str]| {
            Command::new(program)
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if ok("chrt", &["-a", "-f", "-p", "1", &pid]) {
            Self::Realtime
        } else if ok("renice", &["-n", "-10", "-p", &pid]) {
            Self::Nice
        } else {
            Self::Normal
        }
    }

    /// The words that run a command at this priority.
    fn prefix(self) -> &'static [&'static str] {
        match self {
            Self::Realtime => &["chrt", "-f", "1"],
            Self::Nice => &["nice", "-n", "-10"],
            Self::Normal => &[],
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Realtime => "SCHED_FIFO 1 (chrt -f 1)",
            Self::Nice => "nice -10",
            Self::Normal => "normal",
        }
    }
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

/// `program` pinned to `core` (when `taskset` exists), at `priority`.
fn pinned(core: usize, program: &str, priority: Priority) -> Command {
    let mut words: Vec<String> = priority.prefix().iter().map(|w| w.to_string()).collect();
    if Command::new("taskset").arg("--version").output().is_ok() {
        words.extend(["taskset".to_string(), "-c".to_string(), core.to_string()]);
    }
    words.push(program.to_string());
    let mut c = Command::new(&words[0]);
    c.args(&words[1..]);
    c
}

/// The SSE frame `event: <name>` (when named) and `data: <json>`.
fn frame(out: &mut String, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.push_str(&format!("event: {name}\n"));
    }
    out.push_str(&format!("data: {data}\n\n"));
}

/// A fake upstream answering 32 tokens at once in each protocol (JSON or SSE): Chat Completions, Anthropic
/// Messages and Responses.
fn upstream_fake() -> axum::Router {
    let words: Vec<String> = (0..GENERATED).map(|i| format!(" w{i}")).collect();
    let full = json!({"id": "chatcmpl-fake", "object": "chat.completion", "created": 0, "model": "smol",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": words.concat()}, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 200, "completion_tokens": GENERATED, "total_tokens": 200 + GENERATED}})
    .to_string();
    let mut chat_sse = String::new();
    for w in &words {
        let chunk = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "smol",
            "choices": [{"index": 0, "delta": {"content": w}, "finish_reason": null}]});
        frame(&mut chat_sse, None, &chunk);
    }
    let last = json!({"id": "chatcmpl-fake", "object": "chat.completion.chunk", "created": 0, "model": "smol",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]});
    frame(&mut chat_sse, None, &last);
    chat_sse.push_str("data: [DONE]\n\n");

    let mut messages_sse = String::new();
    let usage = json!({"input_tokens": 200, "output_tokens": 0});
    frame(
        &mut messages_sse,
        Some("message_start"),
        &json!({"type": "message_start", "message": {"id": "msg_fake",
        "type": "message", "role": "assistant", "model": "smol", "content": [], "stop_reason": null,
        "stop_sequence": null, "usage": usage}}),
    );
    frame(
        &mut messages_sse,
        Some("content_block_start"),
        &json!({"type": "content_block_start", "index": 0,
        "content_block": {"type": "text", "text": ""}}),
    );
    for w in &words {
        frame(
            &mut messages_sse,
            Some("content_block_delta"),
            &json!({"type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": w}}),
        );
    }
    frame(
        &mut messages_sse,
        Some("content_block_stop"),
        &json!({"type": "content_block_stop", "index": 0}),
    );
    frame(
        &mut messages_sse,
        Some("message_delta"),
        &json!({"type": "message_delta",
        "delta": {"stop_reason": "max_tokens", "stop_sequence": null}, "usage": {"output_tokens": GENERATED}}),
    );
    frame(
        &mut messages_sse,
        Some("message_stop"),
        &json!({"type": "message_stop"}),
    );

    let mut responses_sse = String::new();
    let response = |status: &str, output: Value| {
        json!({"id": "resp_fake", "object": "response", "created_at": 0, "status": status, "model": "smol",
               "output": output, "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
               "usage": {"input_tokens": 200, "input_tokens_details": {"cached_tokens": 0},
                         "output_tokens": GENERATED, "output_tokens_details": {"reasoning_tokens": 0},
                         "total_tokens": 200 + GENERATED}})
    };
    let item = |status: &str, text: &str| {
        json!({"type": "message", "id": "msg_fake", "status": status, "role": "assistant",
               "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    let mut seq = 0;
    let mut event = |out: &mut String, name: &str, mut data: Value| {
        data["type"] = json!(name);
        data["sequence_number"] = json!(seq);
        seq += 1;
        frame(out, Some(name), &data);
    };
    event(
        &mut responses_sse,
        "response.created",
        json!({"response": response("in_progress", json!([]))}),
    );
    event(
        &mut responses_sse,
        "response.in_progress",
        json!({"response": response("in_progress", json!([]))}),
    );
    event(
        &mut responses_sse,
        "response.output_item.added",
        json!({"output_index": 0, "item": item("in_progress", "")}),
    );
    event(
        &mut responses_sse,
        "response.content_part.added",
        json!({"item_id": "msg_fake", "output_index": 0,
        "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
    );
    for w in &words {
        event(
            &mut responses_sse,
            "response.output_text.delta",
            json!({"item_id": "msg_fake", "output_index": 0,
            "content_index": 0, "delta": w, "logprobs": []}),
        );
    }
    let text = words.concat();
    event(
        &mut responses_sse,
        "response.output_text.done",
        json!({"item_id": "msg_fake", "output_index": 0,
        "content_index": 0, "text": text, "logprobs": []}),
    );
    event(
        &mut responses_sse,
        "response.content_part.done",
        json!({"item_id": "msg_fake", "output_index": 0,
        "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}}),
    );
    event(
        &mut responses_sse,
        "response.output_item.done",
        json!({"output_index": 0, "item": item("completed", &text)}),
    );
    event(
        &mut responses_sse,
        "response.completed",
        json!({"response": response("completed", json!([item("completed", &text)]))}),
    );

    let answer = |full: Option<String>, sse: String| {
        let (full, sse) = (full.map(Bytes::from), Bytes::from(sse));
        axum::routing::post(move |body: Bytes| {
            let (full, sse) = (full.clone(), sse.clone());
            async move {
                let streaming = serde_json::from_slice::<Value>(&body)
                    .ok()
                    .and_then(|v| v.get("stream").and_then(Value::as_bool))
                    .unwrap_or(false);
                match full {
                    Some(full) if !streaming => ([("content-type", "application/json")], full),
                    _ => ([("content-type", "text/event-stream")], sse),
                }
            }
        })
    };
    axum::Router::new()
        .route("/v1/chat/completions", answer(Some(full), chat_sse))
        .route("/v1/messages", answer(None, messages_sse))
        .route("/v1/responses", answer(None, responses_sse))
}

/// One of the bench's request kinds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Chat,
    ChatStream,
    MessagesStream,
    ResponsesStream,
}

const MODES: [Mode; 4] = [
    Mode::Chat,
    Mode::ChatStream,
    Mode::MessagesStream,
    Mode::ResponsesStream,
];

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Chat => "chat",
            Self::ChatStream => "chat_stream",
            Self::MessagesStream => "messages_stream",
            Self::ResponsesStream => "responses_stream",
        }
    }

    fn path(self) -> &'static str {
        match self {
            Self::Chat | Self::ChatStream => "/v1/chat/completions",
            Self::MessagesStream => "/v1/messages",
            Self::ResponsesStream => "/v1/responses",
        }
    }

    /// The request body for the workload's system and user message; `model` names the upstream.
    fn body(self, messages: &Value, model: &str) -> Bytes {
        let system = &messages[0]["content"];
        let user = &messages[1]["content"];
        let body = match self {
            Self::Chat => json!({"model": model, "messages": messages, "max_tokens": GENERATED}),
            Self::ChatStream => {
                json!({"model": model, "messages": messages, "max_tokens": GENERATED, "stream": true})
            }
            Self::MessagesStream => json!({"model": model, "max_tokens": GENERATED, "system": system,
                "messages": [{"role": "user", "content": user}], "stream": true}),
            Self::ResponsesStream => json!({"model": model, "instructions": system, "input": user,
                "max_output_tokens": GENERATED, "stream": true, "store": false}),
        };
        Bytes::from(body.to_string())
    }
}

#[derive(Clone)]
struct Target {
    name: &'static str,
    url: String,
    keys: Arc<Vec<String>>,
    body: Bytes,
    /// The system's process, whose CPU time (with its descendants') is counted per request.
    pid: u32,
}

type Http = Client<HttpConnector, Full<Bytes>>;

/// Why a request failed: the run goes on, and the summary reports how many failed and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Failure {
    /// No connection, or it was refused or reset before an answer, after the retries.
    Connect,
    /// The connection broke after the request was sent, before the answer's head.
    Transport,
    /// The answer's body broke off (a peer that closed the connection mid-stream).
    Body,
    /// An answer that is not a success.
    Status,
}

impl Failure {
    fn name(self) -> &'static str {
        match self {
            Self::Connect => "connect",
            Self::Transport => "transport",
            Self::Body => "body",
            Self::Status => "status",
        }
    }
}

/// One request to its last byte: its latency, or why it failed.
async fn one(client: &Http, target: &Target, key: &str) -> Result<Duration, Failure> {
    let body = target.body.clone();
    let start = Instant::now();
    // A burst of 1024 new connections can overflow the listen backlog; a reset connection is retried (the
    // retry counts in the latency) rather than failing the request.
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
            Err(e) if e.is_connect() || format!("{e:?}").contains("ConnectionReset") => {
                note_failure(target, &format!("{e:?}"));
                return Err(Failure::Connect);
            }
            Err(e) => {
                note_failure(target, &format!("{e:?}"));
                return Err(Failure::Transport);
            }
        };
        let status = response.status();
        let bytes = match response.into_body().collect().await {
            Ok(collected) => collected.to_bytes(),
            Err(e) => {
                note_failure(target, &format!("the body broke off: {e:?}"));
                return Err(Failure::Body);
            }
        };
        if !status.is_success() {
            note_failure(
                target,
                &format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)),
            );
            return Err(Failure::Status);
        }
        break;
    }
    Ok(start.elapsed())
}

static RETRIES: AtomicUsize = AtomicUsize::new(0);
static FAILURES_SHOWN: AtomicUsize = AtomicUsize::new(0);

/// Prints the first few failures as they happen, so a failing peer is visible before the summary.
fn note_failure(target: &Target, what: &str) {
    if FAILURES_SHOWN.fetch_add(1, Ordering::Relaxed) < 5 {
        eprintln!("{}: a request failed: {what}", target.name);
    }
}

/// What a batch of requests came to: the wall time, each success's latency, and the failures by kind.
#[derive(Default)]
struct Batch {
    elapsed: Duration,
    latencies: Vec<Duration>,
    failures: BTreeMap<Failure, usize>,
}

/// Runs `total` requests through `c` closed-loop clients.
async fn load(client: &Http, target: &Target, c: usize, total: usize) -> Batch {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for worker in 0..c.min(total) {
        let (client, target, next) = (client.clone(), target.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let key = target.keys[worker % target.keys.len()].clone();
            let mut outcomes = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                outcomes.push(one(&client, &target, &key).await);
            }
            outcomes
        }));
    }
    let mut batch = Batch {
        latencies: Vec::with_capacity(total),
        ..Batch::default()
    };
    for t in tasks {
        for outcome in t.await.expect("a client task ends") {
            match outcome {
                Ok(latency) => batch.latencies.push(latency),
                Err(failure) => *batch.failures.entry(failure).or_default() += 1,
            }
        }
    }
    batch.elapsed = start.elapsed();
    batch
}

#[derive(Default)]
struct Stats {
    requests: usize,
    busy: Duration,
    latencies: Vec<Duration>,
    failures: BTreeMap<Failure, usize>,
    /// CPU seconds the system used over its batches.
    cpu: f64,
    /// Whether `/proc` could not be read around some batch (then `cpu` is not the whole).
    cpu_unread: bool,
}

impl Stats {
    /// CPU microseconds per successful request.
    fn cpu_us_per_request(&self) -> f64 {
        if self.cpu_unread || self.requests == 0 {
            return f64::NAN;
        }
        self.cpu * 1e6 / self.requests as f64
    }

    fn failed(&self) -> usize {
        self.failures.values().sum()
    }

    /// The failures by kind, as `body 3, connect 1`, or `-`.
    fn failures_text(&self) -> String {
        if self.failures.is_empty() {
            return "-".into();
        }
        self.failures
            .iter()
            .map(|(kind, n)| format!("{} {n}", kind.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Rounds of the paired before-and-after comparison per mode and level.
const PAIRS: usize = 16;

/// The paired comparison's per-round ratios (this build's throughput over the baseline's), sorted.
struct PairedRatio {
    ratios: Vec<f64>,
}

impl PairedRatio {
    fn quantile(&self, q: f64) -> f64 {
        if self.ratios.is_empty() {
            return f64::NAN;
        }
        self.ratios[((self.ratios.len() - 1) as f64 * q).round() as usize]
    }
}

/// [`PAIRS`] rounds of one batch through `ours` and one through `base` at `c` clients, the order alternating
/// from round to round; a round with a failed request in either batch counts neither.
async fn paired_ratio(client: &Http, ours: &Target, base: &Target, c: usize) -> PairedRatio {
    // Longer batches than criterion's at low concurrency, so that one round is not a few milliseconds.
    let batch = (4 * c).max(1024);
    let rate = |b: &Batch| {
        b.failures
            .is_empty()
            .then(|| b.latencies.len() as f64 / b.elapsed.as_secs_f64())
    };
    let mut ratios = Vec::with_capacity(PAIRS);
    for round in 0..PAIRS {
        let (first, second) = if round % 2 == 0 {
            (ours, base)
        } else {
            (base, ours)
        };
        let a = load(client, first, c, batch).await;
        let b = load(client, second, c, batch).await;
        let (ours_batch, base_batch) = if round % 2 == 0 { (a, b) } else { (b, a) };
        if let (Some(o), Some(b)) = (rate(&ours_batch), rate(&base_batch)) {
            ratios.push(o / b);
        }
    }
    ratios.sort_by(f64::total_cmp);
    PairedRatio { ratios }
}

/// One system's figures at one mode and level, as the summary reports them.
struct Row {
    rps: f64,
    p50: f64,
    p99: f64,
    requests: usize,
    errors: usize,
    /// CPU microseconds per successful request (NaN where `/proc` could not be read).
    cpu_us: f64,
}

impl Row {
    fn json(&self) -> Value {
        json!({"rps": self.rps, "p50_ms": self.p50, "p99_ms": self.p99, "requests": self.requests,
               "errors": self.errors, "cpu_us_per_request": self.cpu_us})
    }
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
        let before = counting_alloc::LIVE.load(Ordering::Relaxed);
        let tokens_before = stored_tokens(&app).await;
        for key in &keys[..1000] {
            chat(key.clone()).await;
        }
        let after = counting_alloc::LIVE.load(Ordering::Relaxed);
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
    let priority = Priority::raise_own();
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
    let modes: Vec<Mode> = match std::env::var("ARENA_RL_PROXY_BENCH_MODES") {
        Ok(names) => MODES
            .into_iter()
            .filter(|m| names.split(',').any(|n| n.trim() == m.name()))
            .collect(),
        Err(_) => MODES.to_vec(),
    };

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
        let sglang_config = GenerateServerConfig {
            context_length: Some(8192),
            ..GenerateServerConfig::default()
        };
        let sglang =
            ProxyServer::serve_router(any, GenerateServer::with_engine(sglang_config, fake).router())
                .await
                .expect("sglang fake");
        let openai = ProxyServer::serve_router(any, upstream_fake())
            .await
            .expect("openai fake");
        (sglang.local_addr(), openai.local_addr(), (sglang, openai))
    });

    // The systems under test (core 0).
    let exe = std::env::current_exe().expect("own path");
    let start_proxy = |exe: &str| -> (Child, String) {
        let mut proxy = pinned(0, exe, priority)
            .env(ROLE, "proxy")
            .env("ARENA_RL_PROXY_BENCH_UPSTREAM", format!("http://{sglang_addr}"))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting the proxy process {exe}: {e}"));
        let mut line = String::new();
        BufReader::new(proxy.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("proxy address");
        (proxy, line.trim().to_string())
    };
    let (proxy, proxy_addr) = start_proxy(exe.to_str().expect("utf-8 path"));
    let baseline = std::env::var("ARENA_RL_PROXY_BENCH_BASELINE")
        .ok()
        .filter(|p| !p.is_empty())
        .map(|path| {
            println!("baseline: the proxy of {path}");
            start_proxy(&path)
        });
    let python = std::path::PathBuf::from(fixture("ARENA_RL_PY_CLIENTS"));
    let litellm_bin = python.with_file_name("litellm");
    let dir = tempfile::tempdir().expect("temp dir");
    let litellm_config = dir.path().join("litellm.yaml");
    std::fs::write(
        &litellm_config,
        format!(
            "model_list:\n  - model_name: smol\n    litellm_params:\n      model: openai/smol\n      api_base: http://{openai_addr}/v1\n      api_key: upstream-key\n  - model_name: smol-anthropic\n    litellm_params:\n      model: anthropic/smol\n      api_base: http://{openai_addr}\n      api_key: upstream-key\ngeneral_settings:\n  master_key: {LITELLM_KEY}\nlitellm_settings:\n  drop_params: true\n  telemetry: false\n"
        ),
    )
    .expect("config");
    let litellm_port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let litellm = pinned(0, litellm_bin.to_str().expect("utf-8 path"), priority)
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
    let (baseline_child, baseline_addr) = baseline.unzip();
    let (proxy_pid, litellm_pid) = (proxy.id(), litellm.id());
    let baseline_pid = baseline_child.as_ref().map(Child::id);
    let _children = Children([proxy, litellm].into_iter().chain(baseline_child).collect());

    let client: Http = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(usize::MAX)
        .build(HttpConnector::new());
    let sessions = |addr: &str| {
        runtime.block_on(async {
            let mut keys = Vec::new();
            for i in 0..LEVELS[LEVELS.len() - 1] {
                let r = rollout_proxy_call(
                    &client,
                    &format!("http://{addr}/rl/start_session"),
                    json!({"task_id": format!("bench{i}")}),
                )
                .await;
                keys.push(r["api_key"].as_str().expect("key").to_string());
            }
            Arc::new(keys)
        })
    };
    let ours_keys = sessions(&proxy_addr);
    let baseline_keys = baseline_addr.as_deref().map(sessions);
    let litellm_keys = Arc::new(vec![LITELLM_KEY.to_string()]);
    // Per mode, the two systems under test with their bodies.
    // A diagnostic knob: only these systems are measured (the others' figures are then missing).
    let systems: Option<Vec<String>> = std::env::var("ARENA_RL_PROXY_BENCH_SYSTEMS")
        .ok()
        .map(|names| names.split(',').map(|n| n.trim().to_string()).collect());
    let targets = |mode: Mode| -> Vec<Target> {
        let litellm_model = if mode == Mode::MessagesStream {
            "smol-anthropic"
        } else {
            "smol"
        };
        let mut targets = vec![
            Target {
                name: "arena-rl",
                url: format!("http://{proxy_addr}{}", mode.path()),
                keys: ours_keys.clone(),
                body: mode.body(&body_messages, "smol"),
                pid: proxy_pid,
            },
            Target {
                name: "litellm",
                url: format!("http://127.0.0.1:{litellm_port}{}", mode.path()),
                keys: litellm_keys.clone(),
                body: mode.body(&body_messages, litellm_model),
                pid: litellm_pid,
            },
        ];
        if let (Some(addr), Some(keys), Some(pid)) = (&baseline_addr, &baseline_keys, baseline_pid) {
            targets.push(Target {
                name: "baseline",
                url: format!("http://{addr}{}", mode.path()),
                keys: keys.clone(),
                body: mode.body(&body_messages, "smol"),
                pid,
            });
        }
        if let Some(names) = &systems {
            targets.retain(|t| names.iter().any(|n| n == t.name));
        }
        targets
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
        // Warm every system up in every mode (LiteLLM initialises its router and providers on first use).
        for &mode in &modes {
            for target in &targets(mode) {
                load(&client, target, 4, 16).await;
            }
        }
    });

    let stats: Arc<Mutex<BTreeMap<String, Stats>>> = Arc::default();
    let meter = proc_cpu::CpuMeter::new();
    let mut criterion = Criterion::default()
        .configure_from_args()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    for &mode in &modes {
        let targets = targets(mode);
        let mode = mode.name();
        let mut group = criterion.benchmark_group(format!("proxy_{mode}"));
        group.sampling_mode(SamplingMode::Flat);
        for &c in &LEVELS {
            for target in &targets {
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
                                let cpu_before = meter.seconds(target.pid);
                                let done = load(&client, target, c, batch).await;
                                let cpu = cpu_before.zip(meter.seconds(target.pid)).map(|(b, a)| a - b);
                                total += done.elapsed;
                                let mut s = stats.lock().expect("stats");
                                let entry = s.entry(key.clone()).or_default();
                                match cpu {
                                    Some(cpu) => entry.cpu += cpu,
                                    None => entry.cpu_unread = true,
                                }
                                entry.requests += done.latencies.len();
                                entry.busy += done.elapsed;
                                entry.latencies.extend(done.latencies);
                                for (kind, n) in done.failures {
                                    *entry.failures.entry(kind).or_default() += n;
                                }
                            }
                            total
                        })
                    });
                });
            }
        }
        group.finish();
    }

    // With a baseline, the before and after again, paired: batches on the two builds alternate, so that
    // whatever drifts on the machine during the run weighs on both alike.
    let paired: Vec<(String, usize, PairedRatio)> = if baseline_addr.is_some() {
        modes
            .iter()
            .flat_map(|&mode| LEVELS.iter().map(move |&c| (mode, c)))
            .filter_map(|(mode, c)| {
                let targets = targets(mode);
                let ours = targets.iter().find(|t| t.name == "arena-rl")?;
                let base = targets.iter().find(|t| t.name == "baseline")?;
                let ratio = runtime.block_on(paired_ratio(&client, ours, base, c));
                Some((mode.name().to_string(), c, ratio))
            })
            .collect()
    } else {
        Vec::new()
    };
    let (bytes_per_token, measured_tokens) = memory_per_token(&runtime, &body);
    let mut report = serde_json::Map::new();
    println!(
        "\nproxy bench: {prompt_tokens}-token prompt, {GENERATED} generated tokens, pinned to separate cores: {pinned_ok}, priority of both systems and the load generator: {}",
        priority.describe()
    );
    println!(
        "{:<16} {:>5} {:>12} {:>12} {:>10} {:>10} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>7} {:>8} {:>8}",
        "mode",
        "c",
        "arena-rl/s",
        "litellm/s",
        "ours p50",
        "ours p99",
        "llm p50",
        "llm p99",
        "tput x",
        "p99 /",
        "ours cpu",
        "llm cpu",
        "cpu x",
        "ours err",
        "llm err"
    );
    let mut failures = Vec::new();
    let mut baseline_rows = Vec::new();
    let mut s = stats.lock().expect("stats");
    for mode in modes.iter().map(|m| m.name()) {
        for c in LEVELS {
            // Throughput and latencies count successes only; failures are reported beside them.
            let mut row = |name: &str| {
                let st = s.entry(format!("{mode}/{name}/{c}")).or_default();
                st.latencies.sort();
                if st.failed() > 0 {
                    failures.push(format!("{mode} c={c} {name}: {}", st.failures_text()));
                }
                Row {
                    rps: st.requests as f64 / st.busy.as_secs_f64().max(1e-9),
                    p50: latency::percentile_ms(&st.latencies, 0.5),
                    p99: latency::percentile_ms(&st.latencies, 0.99),
                    requests: st.requests,
                    errors: st.failed(),
                    cpu_us: st.cpu_us_per_request(),
                }
            };
            let ours = row("arena-rl");
            let llm = row("litellm");
            println!(
                "{mode:<16} {c:>5} {:>12.0} {:>12.1} {:>9.2}ms {:>9.2}ms {:>9.1}ms {:>9.1}ms {:>9.1} {:>9.1} {:>8.0}us {:>8.0}us {:>7.1} {:>8} {:>8}",
                ours.rps,
                llm.rps,
                ours.p50,
                ours.p99,
                llm.p50,
                llm.p99,
                ours.rps / llm.rps,
                llm.p99 / ours.p99,
                ours.cpu_us,
                llm.cpu_us,
                llm.cpu_us / ours.cpu_us,
                ours.errors,
                llm.errors,
            );
            let mut entry = json!({"arena_rl": ours.json(), "litellm": llm.json(),
                       "throughput_ratio": ours.rps / llm.rps, "p99_ratio": llm.p99 / ours.p99,
                       "cpu_ratio": llm.cpu_us / ours.cpu_us});
            if baseline_addr.is_some() {
                let base = row("baseline");
                baseline_rows.push(format!(
                    "{mode:<16} {c:>5} {:>12.0} {:>9.2}ms {:>9.2}ms {:>11.1} {:>11.1} {:>9.3} {:>8.0}us {:>8.0}us {:>9.3} {:>8}",
                    base.rps,
                    base.p50,
                    base.p99,
                    base.rps / llm.rps,
                    ours.rps / llm.rps,
                    ours.rps / base.rps,
                    base.cpu_us,
                    ours.cpu_us,
                    base.cpu_us / ours.cpu_us,
                    base.errors,
                ));
                let mut baseline = base.json();
                baseline["throughput_ratio"] = json!(base.rps / llm.rps);
                entry["baseline"] = baseline;
                entry["after_over_before"] = json!(ours.rps / base.rps);
                entry["cpu_before_over_after"] = json!(base.cpu_us / ours.cpu_us);
            }
            report.insert(format!("{mode}/{c}"), entry);
        }
    }
    if !baseline_rows.is_empty() {
        println!(
            "\nbefore and after, same run: the baseline build's proxy against LiteLLM, beside this build's \
             (after/bef: throughput, this build over the baseline; cpu b/a: CPU per request, the baseline's over \
             this build's; above 1 means this build is faster)\n{:<16} {:>5} {:>12} {:>11} {:>11} {:>11} {:>11} {:>9} {:>10} {:>10} {:>9} {:>8}",
            "mode",
            "c",
            "baseline/s",
            "base p50",
            "base p99",
            "base tput x",
            "ours tput x",
            "after/bef",
            "base cpu",
            "ours cpu",
            "cpu b/a",
            "base err"
        );
        for row in &baseline_rows {
            println!("{row}");
        }
    }
    if !paired.is_empty() {
        println!(
            "\nbefore and after, paired: {PAIRS} rounds per point, each one batch on this build and one on the baseline \
             in alternating order; the ratio of each round's throughputs (this build over the baseline; above 1 means \
             this build is faster)\n{:<16} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
            "mode", "c", "min", "p25", "median", "p75", "max"
        );
        let mut json_pairs = serde_json::Map::new();
        for (mode, c, r) in &paired {
            println!(
                "{mode:<16} {c:>5} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>9.3}",
                r.quantile(0.0),
                r.quantile(0.25),
                r.quantile(0.5),
                r.quantile(0.75),
                r.quantile(1.0)
            );
            json_pairs.insert(
                format!("{mode}/{c}"),
                json!({"median": r.quantile(0.5), "p25": r.quantile(0.25), "p75": r.quantile(0.75), "rounds": r.ratios}),
            );
        }
        report.insert("paired_after_over_before".into(), Value::Object(json_pairs));
    }
    if failures.is_empty() {
        println!("no request failed");
    } else {
        println!(
            "failed requests (not counted in throughput or latency): {}",
            failures.join("; ")
        );
    }
    println!(
        "connection retries (refused or reset before an answer, then served): {}",
        RETRIES.load(Ordering::Relaxed)
    );
    report.insert("failures".into(), json!(failures));
    report.insert("retries".into(), json!(RETRIES.load(Ordering::Relaxed)));
    println!(
        "retained heap per stored token: {bytes_per_token:.2} bytes ({measured_tokens} tokens in 1000 sessions)"
    );
    report.insert("bytes_per_stored_token".into(), json!(bytes_per_token));
    report.insert("prompt_tokens".into(), json!(prompt_tokens));
    report.insert("pinned".into(), json!(pinned_ok));
    report.insert("priority".into(), json!(priority.describe()));
    summary::write_summary(report, "proxy-summary.json");
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
