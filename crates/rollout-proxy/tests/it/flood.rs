//! A flood of large prompts from 12 clients over real loopback sockets, against a proxy whose preparation
//! pool has one thread and a queue of two: `/health` and the control endpoints keep answering within
//! 250 ms at the 95th percentile, the requests past the pool are refused at once with 503 in their
//! protocol's body, a small request (prepared without the pool) is still served, the memory the flood
//! adds stays under a stated bound, and the proxy serves normally afterwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use http::{Method, StatusCode};
use rollout_proxy::PoolLimits;
use serde_json::json;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::common::{ADMIN, Proxy, call, config, engine_config, rss};
use crate::hostile::{metric, read_response, wait_for};

const CLIENTS: usize = 12;
/// Words in each flooding prompt (about 330 KB of JSON, far past the 4,096-token context window, so each
/// is parsed, rendered and tokenised in full and then refused for overflow, remembering nothing).
const WORDS: usize = 40_000;

/// What the flooding clients heard.
#[derive(Default)]
struct Tally {
    /// Prepared in full and refused for overflow (400).
    prepared: AtomicU64,
    /// Refused at once by the full pool (503).
    refused: AtomicU64,
}

/// A prompt of `WORDS` distinct-looking words.
fn large_prompt(seed: u64) -> String {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut text = String::with_capacity(WORDS * 8);
    for _ in 0..WORDS {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        text.push_str(&format!("w{:x} ", x % 0xF_FFFF));
    }
    text
}

/// Sends the same large chat request on one keep-alive connection until `stop`, counting the answers.
async fn flood(addr: SocketAddr, key: String, seed: u64, stop: Arc<AtomicBool>, tally: Arc<Tally>) {
    let body =
        json!({"messages": [{"role": "user", "content": large_prompt(seed)}], "max_tokens": 4}).to_string();
    let mut request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    request.extend_from_slice(body.as_bytes());
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    while !stop.load(Ordering::Relaxed) {
        stream.write_all(&request).await.expect("sends");
        let r = read_response(&mut stream).await;
        match r.status {
            400 => {
                assert_eq!(r.body["error"]["code"], "context_length_exceeded", "{}", r.body);
                tally.prepared.fetch_add(1, Ordering::Relaxed);
            }
            503 => {
                assert_eq!(r.body["error"]["type"], "server_error", "{}", r.body);
                assert!(r.head.contains("retry-after: 1"), "{}", r.head);
                tally.refused.fetch_add(1, Ordering::Relaxed);
            }
            other => panic!("unexpected {other}: {} {}", r.head, r.body),
        }
    }
}

fn p95(mut samples: Vec<Duration>) -> Duration {
    samples.sort_unstable();
    samples[(samples.len() * 95).div_ceil(100) - 1]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_flood_of_large_prompts_health_and_control_answer_within_250_ms_p95() {
    let mut c = config();
    c.pool = PoolLimits { threads: 1, queue: 2 };
    let proxy = Proxy::start(c, engine_config()).await;
    let addr = proxy.server.local_addr();
    let (_, key) = proxy.session("flood").await;
    let (_, quiet) = proxy.session("quiet").await;
    let baseline = rss();

    let stop = Arc::new(AtomicBool::new(false));
    let tally = Arc::new(Tally::default());
    let clients: Vec<_> = (0..CLIENTS as u64)
        .map(|seed| tokio::spawn(flood(addr, key.clone(), seed, stop.clone(), tally.clone())))
        .collect();
    // The pool and its queue are full before anything is measured.
    wait_for(
        &proxy,
        "rollout_proxy_pool_requests",
        Duration::from_secs(60),
        |v| v >= 3.0,
    )
    .await;

    let mut health = Vec::new();
    let mut control = Vec::new();
    let mut peak = 0;
    for i in 0..100 {
        let start = Instant::now();
        let r = call(Method::GET, &proxy.url("/health"), &[], None).await;
        health.push(start.elapsed());
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        if i % 5 == 0 {
            let start = Instant::now();
            let r = proxy.admin("/grant_capacity", json!({})).await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            let r = proxy
                .admin("/rl/start_session", json!({"task_id": format!("c{i}")}))
                .await;
            assert_eq!(r.status, StatusCode::OK, "{}", r.text);
            control.push(start.elapsed());
        }
        if i % 25 == 0 {
            let r = proxy
                .chat(
                    &quiet,
                    json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
                )
                .await;
            assert_eq!(
                r.status,
                StatusCode::OK,
                "a small request during the flood: {}",
                r.text
            );
        }
        peak = peak.max(rss());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let held = metric(&proxy, "rollout_proxy_pool_requests").await;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        client.await.expect("a flooding client ends");
    }

    let (prepared, refused) = (
        tally.prepared.load(Ordering::Relaxed),
        tally.refused.load(Ordering::Relaxed),
    );
    let (health_p95, control_p95) = (p95(health.clone()), p95(control.clone()));
    let grown = peak.saturating_sub(baseline);
    eprintln!(
        "flood of {CLIENTS} clients, {WORDS}-word prompts: {prepared} prepared and refused for overflow, \
         {refused} refused at once by the full pool; /health p95 {health_p95:?} (max {:?}); \
         grant_capacity + start_session p95 {control_p95:?}; pool held {held} at the end; \
         memory grew {} MiB over the baseline",
        health.iter().max().expect("samples"),
        grown >> 20
    );
    assert!(prepared > 0, "the pool prepared requests");
    assert!(refused > 0, "the full pool refused requests at once");
    assert!(
        health_p95 <= Duration::from_millis(250),
        "/health p95 {health_p95:?} under the flood"
    );
    assert!(
        control_p95 <= Duration::from_millis(250),
        "control p95 {control_p95:?} under the flood"
    );
    // Each place in the pool (3) and each connection (12) holds at most one body, its parsed JSON, its
    // rendering and its tokens: about 8 MB a place; 256 MiB is well above that and far below a leak's
    // growth over hundreds of requests.
    assert!(grown < 256 << 20, "memory grew {} MiB", grown >> 20);

    // Alive, and serving: the pool drains and an ordinary request is answered.
    wait_for(
        &proxy,
        "rollout_proxy_pool_requests",
        Duration::from_secs(60),
        |v| v == 0.0,
    )
    .await;
    let r = proxy
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let r = call(
        Method::GET,
        &proxy.url("/health"),
        &[("authorization", &format!("Bearer {ADMIN}"))],
        None,
    )
    .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}
