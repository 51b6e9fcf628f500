//! Hostile connections against the proxy and `serve-policy`'s `/generate` server, over raw loopback TCP:
//! heads that never finish, idle keep-alives, trickled and oversized bodies, huge bodies without a key,
//! and more connections than the limit; each time the server still answers `/health` afterwards.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::{Method, StatusCode};
use rollout_proxy::{ConnectionLimits, FakeEngine, ProxyServer, generate_router};
use serde_json::Value;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
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
struct RawResponse {
    status: u16,
    head: String,
    body: Value,
}

/// Reads one response (its head, then `Content-Length` bytes of JSON body).
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> RawResponse {
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
