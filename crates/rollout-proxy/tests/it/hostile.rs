//! Hostile connections against the proxy and `serve-policy`'s `/generate` server, over raw loopback TCP:
//! heads that never finish, idle keep-alives, trickled and oversized bodies, huge bodies without a key,
//! more connections than the limit, a stream the client stops reading, and more generations in flight
//! than a session may have; each time the server still answers `/health` afterwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use rollout_proxy::{
    ConnectionLimits, FakeEngine, FakeEngineConfig, ProxyServer, SessionRewards, generate_router,
};
use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout};

use crate::common::{ADMIN, Proxy, call, config, engine_config};

/// Small limits, so that each test takes well under a second or two.
fn limits() -> ConnectionLimits {
    ConnectionLimits {
        header_read_timeout: Duration::from_millis(300),
        body_read_timeout: Duration::from_millis(300),
        idle_timeout: Duration::from_millis(600),
        max_body_bytes: 4096,
        max_connections: 64,
        write_timeout: Duration::from_millis(500),
        max_head_bytes: 64 * 1024,
    }
}

async fn proxy(limits: ConnectionLimits) -> Proxy {
    let mut c = config();
    c.connection = limits;
    Proxy::start(c, engine_config()).await
}

/// Headroom for a loaded machine above a configured deadline; the lower bound is always exact.
const SLACK: Duration = Duration::from_secs(3);

/// An HTTP/1.1 response read off a raw socket.
pub(crate) struct RawResponse {
    pub(crate) status: u16,
    pub(crate) head: String,
    pub(crate) body: Value,
}

/// Reads one response (its head, then `Content-Length` bytes of JSON body).
pub(crate) async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> RawResponse {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.expect("reads the response");
        assert!(
            n > 0,
            "the connection closed before a response: {:?}",
            String::from_utf8_lossy(&buf)
        );
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("a status line: {head}"));
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .map_or(0, |v| v.trim().parse().expect("a content length"));
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await.expect("reads the body");
        assert!(n > 0, "the connection closed inside the body");
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = &buf[head_end..head_end + length];
    RawResponse {
        status,
        head,
        body: serde_json::from_slice(body).unwrap_or(Value::Null),
    }
}

/// Waits until the server closes `stream` (EOF or reset) and answers when, failing after `within`;
/// anything but a close (bytes of a response) fails too.
async fn closed(stream: &mut (impl AsyncRead + Unpin), within: Duration) -> Instant {
    let mut chunk = [0u8; 1024];
    match timeout(within, stream.read(&mut chunk)).await {
        Ok(Ok(0) | Err(_)) => Instant::now(),
        Ok(Ok(n)) => panic!(
            "expected a close, got bytes: {:?}",
            String::from_utf8_lossy(&chunk[..n])
        ),
        Err(_) => panic!("the server held the connection open past {within:?}"),
    }
}

/// Writes `bytes` one at a time, `every` apart, until done or the server closes the connection.
fn trickle(mut writer: tokio::net::tcp::OwnedWriteHalf, bytes: Vec<u8>, every: Duration) {
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval(every);
        for b in bytes {
            ticks.tick().await;
            if writer.write_all(&[b]).await.is_err() {
                return;
            }
        }
    });
}

async fn assert_alive(addr: SocketAddr) {
    let r = call(Method::GET, &format!("http://{addr}/health"), &[], None).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test]
async fn a_head_that_never_finishes_is_closed_at_the_header_timeout() {
    let proxy = proxy(limits()).await;
    let addr = proxy.server.local_addr();
    let limit = limits().header_read_timeout;

    // Silent from the start.
    let mut silent = TcpStream::connect(addr).await.expect("connects");
    let start = Instant::now();
    let at = closed(&mut silent, limit + SLACK).await;
    assert!(
        at - start >= limit,
        "closed after {:?}, before {limit:?}",
        at - start
    );

    // A head trickled a byte at a time: trickling does not move the deadline.
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut read, write) = stream.into_split();
    let start = Instant::now();
    let head = format!(
        "GET /health HTTP/1.1\r\nhost: x\r\nx-slow: {}\r\n\r\n",
        "a".repeat(400)
    );
    trickle(write, head.into_bytes(), Duration::from_millis(10));
    let mut chunk = [0u8; 64];
    let n = timeout(limit + SLACK, read.read(&mut chunk))
        .await
        .expect("closed in time")
        .unwrap_or(0);
    assert_eq!(n, 0, "no response to a head that never finished");
    let after = start.elapsed();
    assert!(after >= limit, "closed after {after:?}, before {limit:?}");
    assert_alive(addr).await;
}

#[tokio::test]
async fn an_idle_keep_alive_is_closed_at_the_idle_timeout() {
    let proxy = proxy(limits()).await;
    let addr = proxy.server.local_addr();
    let idle = limits().idle_timeout;
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("writes");
    let r = read_response(&mut stream).await;
    assert_eq!(r.status, 200, "{}", r.head);
    assert!(!r.head.contains("connection: close"), "kept alive: {}", r.head);
    let sent = Instant::now();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .expect("writes");
    assert_eq!(read_response(&mut stream).await.status, 200);
    let at = closed(&mut stream, idle + SLACK).await;
    // Longer than the header timeout: the idle deadline is its own.
    assert!(at - sent >= idle, "closed after {:?}, before {idle:?}", at - sent);
    assert_alive(addr).await;
}

#[tokio::test]
async fn a_trickled_body_is_cut_at_the_body_timeout_with_408() {
    let proxy = proxy(limits()).await;
    let addr = proxy.server.local_addr();
    let (_, key) = proxy.session("trickle").await;
    let limit = limits().body_read_timeout;
    for (path, auth, expected) in [
        (
            "/v1/chat/completions",
            format!("authorization: Bearer {key}"),
            "invalid_request_error",
        ),
        ("/v1/messages", format!("x-api-key: {key}"), "timeout_error"),
    ] {
        let stream = TcpStream::connect(addr).await.expect("connects");
        let (mut read, mut write) = stream.into_split();
        let start = Instant::now();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\n{auth}\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n"
        );
        write.write_all(head.as_bytes()).await.expect("writes the head");
        trickle(write, vec![b' '; 1000], Duration::from_millis(20));
        let r = read_response(&mut read).await;
        let after = start.elapsed();
        assert_eq!(r.status, 408, "{path}: {}", r.body);
        assert!(after >= limit, "{path}: cut after {after:?}, before {limit:?}");
        assert!(after < limit + SLACK, "{path}: cut after {after:?}");
        assert_eq!(
            r.body.pointer("/error/type"),
            Some(&Value::from(expected)),
            "{path}: {}",
            r.body
        );
        if path == "/v1/messages" {
            assert_eq!(r.body["type"], "error", "Anthropic's error envelope: {}", r.body);
        }
        closed(&mut read, SLACK).await;
    }
    assert_alive(addr).await;
}

#[tokio::test]
async fn a_body_over_the_limit_is_413_in_the_protocol_s_error_body() {
    let proxy = proxy(limits()).await;
    let addr = proxy.server.local_addr();
    let (_, key) = proxy.session("large").await;

    // Declared too large: refused before a byte of the body is sent.
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\ncontent-type: application/json\r\ncontent-length: 100000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("writes");
    let r = timeout(SLACK, read_response(&mut stream))
        .await
        .expect("answers at once");
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.body["error"]["type"], "invalid_request_error", "{}", r.body);
    assert!(
        r.body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("4096")),
        "{}",
        r.body
    );

    // Sent chunked, without a length: cut when the limit is crossed.
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let head = format!(
        "POST /v1/messages HTTP/1.1\r\nhost: x\r\nx-api-key: {key}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("writes");
    for _ in 0..4 {
        let chunk = format!("800\r\n{}\r\n", " ".repeat(0x800));
        if stream.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let r = read_response(&mut stream).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert_eq!(r.body["type"], "error", "{}", r.body);
    assert_eq!(r.body["error"]["type"], "request_too_large", "{}", r.body);

    // The control endpoints too.
    let mut stream = TcpStream::connect(addr).await.expect("connects");
    let head = format!(
        "POST /rl/start_session HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {ADMIN}\r\ncontent-length: 5000\r\n\r\n"
    );
    stream.write_all(head.as_bytes()).await.expect("writes");
    let r = read_response(&mut stream).await;
    assert_eq!(r.status, 413, "{}", r.body);
    assert_alive(addr).await;
}

#[tokio::test]
async fn credentials_are_checked_before_the_body_is_read() {
    // A long body deadline: an answer within SLACK proves the server did not wait for the body.
    let proxy = proxy(ConnectionLimits {
        body_read_timeout: Duration::from_secs(60),
        max_body_bytes: 1 << 40,
        ..limits()
    })
    .await;
    let addr = proxy.server.local_addr();
    let (_, key) = proxy.session("keys").await;
    let gateway = secrecy::ExposeSecret::expose_secret(&proxy.state.gateway_key()).to_string();
    for (path, auth, status) in [
        ("/v1/chat/completions", String::new(), 401),
        ("/v1/messages", "x-api-key: not-a-key\r\n".to_string(), 401),
        (
            "/v1/responses",
            "authorization: Bearer not-a-key\r\n".to_string(),
            401,
        ),
        ("/v1/messages/count_tokens", String::new(), 401),
        ("/rl/start_session", String::new(), 401),
        (
            "/rl/start_session",
            format!("authorization: Bearer {key}\r\n"),
            403,
        ),
        (
            "/grant_capacity",
            "authorization: Bearer not-a-key\r\n".to_string(),
            403,
        ),
        ("/export_trajectories", String::new(), 401),
        ("/rl/set_reward", String::new(), 401),
        (
            "/rl/end_session",
            format!("authorization: Bearer {gateway}\r\n"),
            403,
        ),
    ] {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: x\r\n{auth}content-type: application/json\r\ncontent-length: 1000000000000\r\n\r\n{{\"a\":"
        );
        stream.write_all(head.as_bytes()).await.expect("writes");
        let r = timeout(SLACK, read_response(&mut stream))
            .await
            .unwrap_or_else(|_| panic!("{path}: no prompt answer; the body was waited for"));
        assert_eq!(r.status, status, "{path}: {}", r.body);
        assert!(
            r.body.get("error").is_some(),
            "{path}: the protocol's error body: {}",
            r.body
        );
        closed(&mut stream, SLACK).await;
    }
    assert_alive(addr).await;
}

#[tokio::test]
async fn over_the_connection_limit_a_connection_is_refused_and_a_freed_slot_serves() {
    let proxy = proxy(ConnectionLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        ..limits()
    })
    .await;
    let addr = proxy.server.local_addr();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        stream
            .write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .expect("writes");
        assert_eq!(read_response(&mut stream).await.status, 200);
        held.push(stream);
    }

    // One more is refused at once: the client has sent nothing yet, so the best-effort 503 arrives.
    let mut extra = TcpStream::connect(addr).await.expect("the kernel accepts");
    let mut buf = Vec::new();
    timeout(SLACK, extra.read_to_end(&mut buf))
        .await
        .expect("refused at once")
        .expect("closed cleanly");
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").expect("a response");
    assert!(head.starts_with("HTTP/1.1 503"), "refused: {text}");
    let length = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .expect("the 503 has a length");
    assert_eq!(length, body.len().to_string(), "{text}");
    let body: serde_json::Value = serde_json::from_str(body).expect("a JSON error body");
    assert_eq!(body["error"]["code"], 503, "{text}");

    drop(held.pop());
    let deadline = Instant::now() + SLACK;
    loop {
        let mut stream = TcpStream::connect(addr).await.expect("connects");
        let _ = stream.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").await;
        let mut buf = [0u8; 12];
        if stream.read_exact(&mut buf).await.is_ok() && &buf == b"HTTP/1.1 200" {
            break;
        }
        assert!(Instant::now() < deadline, "no slot was freed");
        tokio::task::yield_now().await;
    }

    // Graceful shutdown still finishes with an idle keep-alive open.
    timeout(SLACK, proxy.server.shutdown())
        .await
        .expect("shuts down with an idle keep-alive open")
        .expect("shuts down cleanly");
}

#[tokio::test]
async fn serve_policy_s_generate_server_holds_the_same_limits() {
    let engine = Arc::new(FakeEngine::new(engine_config()));
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = ProxyServer::serve_router_with(addr, generate_router(engine), limits())
        .await
        .expect("listens");
    let addr = server.local_addr();

    let mut silent = TcpStream::connect(addr).await.expect("connects");
    let start = Instant::now();
    let at = closed(&mut silent, limits().header_read_timeout + SLACK).await;
    assert!(at - start >= limits().header_read_timeout);

    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut read, mut write) = stream.into_split();
    let start = Instant::now();
    write
        .write_all(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 500\r\n\r\n")
        .await
        .expect("writes");
    trickle(write, vec![b' '; 500], Duration::from_millis(20));
    let r = read_response(&mut read).await;
    assert_eq!(r.status, 408, "{}", r.body);
    assert!(start.elapsed() >= limits().body_read_timeout);
    assert_eq!(r.body["error"]["code"], 408, "{}", r.body);

    let mut stream = TcpStream::connect(addr).await.expect("connects");
    stream
        .write_all(b"POST /generate HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 10000\r\n\r\n")
        .await
        .expect("writes");
    let r = timeout(SLACK, read_response(&mut stream))
        .await
        .expect("answers at once");
    assert_eq!(r.status, 413, "{}", r.body);
    assert_alive(addr).await;
    server.shutdown().await.expect("shuts down");
}

/// A gauge or counter's value from the proxy's `/metrics`.
pub(crate) async fn metric(proxy: &Proxy, name: &str) -> f64 {
    let r = call(Method::GET, &proxy.url("/metrics"), &[], None).await;
    r.text
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{}", r.text))
}

/// Polls `metric` until `done` holds of it, or panics at `within`.
pub(crate) async fn wait_for(proxy: &Proxy, name: &str, within: Duration, done: impl Fn(f64) -> bool) -> f64 {
    let until = Instant::now() + within;
    loop {
        let value = metric(proxy, name).await;
        if done(value) {
            return value;
        }
        assert!(Instant::now() < until, "{name} stayed at {value} for {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends a streamed chat request on a socket whose receive buffer is small, and never reads it.
async fn stalled_stream(addr: SocketAddr, key: &str) -> TcpStream {
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("a small receive buffer");
    let mut stream = socket.connect(addr).await.expect("connects");
    let body = json!({"messages": [{"role": "user", "content": "Talk."}], "stream": true}).to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("sends");
    stream
}

#[tokio::test]
async fn a_stream_the_client_stops_reading_is_dropped_at_the_write_timeout() {
    let write_timeout = Duration::from_millis(400);
    let mut c = config();
    c.connection = ConnectionLimits {
        write_timeout,
        ..limits()
    };
    // A token a millisecond for 100,000 tokens: it would run for minutes if it were not dropped.
    let engine = FakeEngineConfig {
        token_latency: Duration::from_millis(1),
        output_len: 100_000,
        max_context_len: 200_000,
        ..engine_config()
    };
    // Small socket buffers on both ends (accepted connections inherit the listener's), so that a few
    // hundred frames fill them whatever the kernel's autotuning would grow them to.
    let listener = TcpSocket::new_v4().expect("a socket");
    listener.set_send_buffer_size(4096).expect("a small send buffer");
    listener
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("binds");
    let proxy = Proxy::start_on(listener.listen(64).expect("listens"), c, engine);
    let addr = proxy.server.local_addr();
    let (session, key) = proxy.session("stall").await;
    let started = Instant::now();
    let mut stream = stalled_stream(addr, &key).await;
    let reserved = wait_for(&proxy, "rollout_proxy_reserved_tokens", SLACK, |v| v > 0.0).await;
    assert!(reserved > 100_000.0, "the stream reserves its output: {reserved}");
    wait_for(
        &proxy,
        "rollout_proxy_reserved_tokens",
        write_timeout + 4 * SLACK,
        |v| v == 0.0,
    )
    .await;
    let released = started.elapsed();
    assert!(released >= write_timeout, "released after {released:?}");
    assert_eq!(
        metric(&proxy, "rollout_proxy_aborted_generations_total").await,
        1.0
    );
    // The server closed the connection: what the kernel buffered reads out, then the end.
    let mut drained = Vec::new();
    timeout(SLACK, stream.read_to_end(&mut drained))
        .await
        .expect("the connection ends")
        .ok();
    assert!(drained.starts_with(b"HTTP/1.1 200"));
    // The session is free again (the sweep would now see no generation running) and nothing was recorded.
    let r = proxy
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(proxy.end(&key).await.status, StatusCode::OK);
    let export = proxy.export(&session, "individual").await;
    assert_eq!(
        export.trajectories.len(),
        1,
        "only the answered request is recorded"
    );
    assert_alive(addr).await;
}

#[tokio::test]
async fn a_session_over_its_generation_limit_gets_429_in_its_protocol() {
    let mut c = config();
    c.limits.max_generations_per_session = 2;
    // Slow tokens keep the first two generations running while the third is refused.
    let engine = FakeEngineConfig {
        token_latency: Duration::from_millis(5),
        output_len: 100_000,
        max_context_len: 200_000,
        ..engine_config()
    };
    let proxy = Proxy::start(c, engine).await;
    let addr = proxy.server.local_addr();
    let (_, key) = proxy.session("limit").await;
    let (_, other) = proxy.session("limit-other").await;
    let _first = stalled_stream(addr, &key).await;
    let _second = stalled_stream(addr, &key).await;
    // Each stream reserves the rest of the 200,000-token window.
    wait_for(&proxy, "rollout_proxy_reserved_tokens", SLACK, |v| v > 300_000.0).await;
    let r = proxy
        .messages(
            &key,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert!(r.headers.contains_key("retry-after"));
    let body = r.json();
    assert_eq!(body["type"], "error", "{body}");
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("2 generations in flight")),
        "{body}"
    );
    let r = proxy
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS, "{}", r.text);
    assert_eq!(r.json()["error"]["type"], "rate_limit_error");
    let r = proxy
        .chat(
            &other,
            json!({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "another session is served: {}", r.text);
    assert_alive(addr).await;
}

#[tokio::test]
async fn a_prompt_refused_for_overflow_leaves_nothing_in_the_tokenizer_s_memory() {
    let proxy = Proxy::default().await;
    let (_, key) = proxy.session("overflow").await;
    let memory = || proxy.state.model().tokenizer.piece_memory();
    // Distinct words, so that every piece is new: far more tokens than the 4,096-token window.
    let words: Vec<String> = (0..6000).map(|i| format!("w{i}x")).collect();
    let before = memory();
    let r = proxy
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": words.join(" ")}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded", "{}", r.text);
    assert_eq!(memory(), before, "the refused prompt's pieces are not remembered");
    let r = proxy
        .chat(
            &key,
            json!({"messages": [{"role": "user", "content": words[..50].join(" ")}], "max_tokens": 4}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert!(
        memory().0 >= before.0 + 50,
        "a served prompt's pieces are: {:?}",
        memory()
    );
}

#[tokio::test]
async fn stored_responses_stay_within_the_session_s_byte_budget() {
    let mut c = config();
    c.limits.max_response_bytes_per_session = 64 * 1024;
    let proxy = Proxy::start(c, engine_config()).await;
    let (session, key) = proxy.session("stored-bytes").await;
    // Each answer echoes 8 KB of metadata and 16 KB of tools: a session key could fill memory with them.
    let metadata: serde_json::Map<String, Value> = (0..16)
        .map(|i| (format!("k{i}"), json!("m".repeat(500))))
        .collect();
    let tools: Vec<Value> = (0..16)
        .map(|i| json!({"type": "function", "name": format!("t{i}"), "description": "d".repeat(1000)}))
        .collect();
    let mut ids = Vec::new();
    for _ in 0..12 {
        let r = proxy
            .responses(
                &key,
                json!({"input": "Hi", "max_output_tokens": 4, "metadata": metadata, "tools": tools}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        ids.push(r.json()["id"].as_str().expect("an id").to_string());
        let held = metric(&proxy, "rollout_proxy_stored_response_bytes").await;
        assert!(held <= 64.0 * 1024.0, "{held}");
    }
    let auth = format!("Bearer {key}");
    for (id, status) in [(&ids[0], StatusCode::NOT_FOUND), (&ids[11], StatusCode::OK)] {
        let url = proxy.url(&format!("/v1/responses/{id}"));
        let r = call(Method::GET, &url, &[("authorization", &auth)], None).await;
        assert_eq!(r.status, status, "the oldest went first: {}", r.text);
    }
    let r = proxy
        .responses(
            &key,
            json!({"input": "Again", "max_output_tokens": 4, "previous_response_id": ids[0]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "previous_response_not_found");
    let r = proxy
        .responses(
            &key,
            json!({"input": "Again", "max_output_tokens": 4, "previous_response_id": ids[11]}),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK, "the newest chain continues: {}", r.text);
    // The export frees them.
    assert_eq!(proxy.end(&key).await.status, StatusCode::OK);
    proxy.export(&session, "individual").await;
    assert_eq!(metric(&proxy, "rollout_proxy_stored_response_bytes").await, 0.0);
}

#[tokio::test]
async fn a_reward_a_session_sets_itself_is_answered_but_not_exported_under_ignore() {
    for (mode, kept) in [(SessionRewards::Honour, 5.0), (SessionRewards::Ignore, 0.0)] {
        let mut c = config();
        c.session_rewards = mode;
        let proxy = Proxy::start(c, engine_config()).await;
        let (session, key) = proxy.session("self-graded").await;
        let ask = |text: &str| json!({"messages": [{"role": "user", "content": text}], "max_tokens": 4});
        let first = proxy.chat(&key, ask("One")).await.json()["id"]
            .as_str()
            .expect("an id")
            .to_string();
        assert_eq!(proxy.chat(&key, ask("Two")).await.status, StatusCode::OK);
        let auth = format!("Bearer {key}");
        let url = proxy.url("/rl/set_reward");
        let r = call(
            Method::POST,
            &url,
            &[("authorization", &auth)],
            Some(json!({"reward": 5.0, "interaction_id": first})),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{mode:?}: {}", r.text);
        assert_eq!(
            r.json()["interaction_id"],
            first.as_str(),
            "answered as the reference answers"
        );
        let r = call(
            Method::POST,
            &url,
            &[("authorization", &auth)],
            Some(json!({"reward": 5.0, "interaction_id": "nope"})),
        )
        .await;
        assert_eq!(
            r.status,
            StatusCode::BAD_REQUEST,
            "{mode:?}: an unknown id is still refused"
        );
        assert_eq!(proxy.end(&key).await.status, StatusCode::OK);
        let r = proxy
            .admin(
                "/export_trajectories",
                json!({"session_id": session, "style": "individual", "final_reward": 1.0, "discount": 1.0}),
            )
            .await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let export: rollout_proxy::ExportedSession = serde_json::from_str(&r.text).expect("an export");
        let oldest = &export.trajectories[0];
        assert_eq!(oldest.interaction_id, first);
        assert_eq!(oldest.original_reward, kept, "{mode:?}");
        assert_eq!(
            oldest.reward,
            kept + 1.0,
            "{mode:?}: the final reward discounted back"
        );
        assert_eq!(export.trajectories[1].original_reward, 1.0, "{mode:?}");
    }
}
