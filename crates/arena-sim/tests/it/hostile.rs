//! Hostile connections against the sim over raw loopback TCP: heads that never finish, idle keep-alives,
//! trickled and oversized bodies, more connections than the limit, and a forwarded stream the client stops
//! reading; each time the sim still serves afterwards.

use std::time::Duration;

use arena_sim::{ArenaSim, ConnectionLimits};
use rollout_proxy::FakeEngineConfig;
use secrecy::ExposeSecret;
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{Instant, timeout};

use crate::support::{LLM_KEY, Proxy, TOKEN, http, register, world};

/// Small limits, so that each test takes about a second.
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

async fn sim(limits: ConnectionLimits) -> ArenaSim {
    ArenaSim::builder(world())
        .connection_limits(limits)
        .start()
        .await
        .expect("sim starts")
}

/// Headroom for a loaded machine above a configured deadline; the lower bound is always exact.
const SLACK: Duration = Duration::from_secs(3);

fn list_streams() -> String {
    format!("GET /openapi/v1/streams HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {TOKEN}\r\n\r\n")
}

/// Reads one response's status and head, then its `Content-Length` bytes of body.
async fn read_response(stream: &mut (impl AsyncRead + Unpin)) -> (u16, String, String) {
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
    let body = String::from_utf8_lossy(&buf[head_end..head_end + length]).into_owned();
    (status, head, body)
}

/// Waits until the sim closes `stream` (EOF or reset), failing after `within` or on any response bytes.
async fn closed(stream: &mut (impl AsyncRead + Unpin), within: Duration) -> Instant {
    let mut chunk = [0u8; 1024];
    match timeout(within, stream.read(&mut chunk)).await {
        Ok(Ok(0) | Err(_)) => Instant::now(),
        Ok(Ok(n)) => panic!(
            "expected a close, got bytes: {:?}",
            String::from_utf8_lossy(&chunk[..n])
        ),
        Err(_) => panic!("the sim held the connection open past {within:?}"),
    }
}

/// Writes `bytes` one at a time, `every` apart, until done or the sim closes the connection.
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

async fn assert_serves(sim: &ArenaSim) {
    let mut stream = TcpStream::connect(sim.addr()).await.expect("connects");
    stream.write_all(list_streams().as_bytes()).await.expect("writes");
    let (status, head, _) = read_response(&mut stream).await;
    assert_eq!(status, 200, "{head}");
}

#[tokio::test]
async fn heads_that_never_finish_and_idle_keep_alives_are_closed_on_time() {
    let sim = sim(limits()).await;
    let header = limits().header_read_timeout;
    let idle = limits().idle_timeout;

    let mut silent = TcpStream::connect(sim.addr()).await.expect("connects");
    let start = Instant::now();
    let at = closed(&mut silent, header + SLACK).await;
    assert!(at - start >= header, "closed after {:?}", at - start);

    let stream = TcpStream::connect(sim.addr()).await.expect("connects");
    let (mut read, write) = stream.into_split();
    let start = Instant::now();
    let head = format!("{}x-slow: {}\r\n\r\n", list_streams().trim_end(), "a".repeat(400));
    trickle(write, head.into_bytes(), Duration::from_millis(10));
    let at = closed(&mut read, header + SLACK).await;
    assert!(at - start >= header, "closed after {:?}", at - start);

    let mut stream = TcpStream::connect(sim.addr()).await.expect("connects");
    let sent = Instant::now();
    stream.write_all(list_streams().as_bytes()).await.expect("writes");
    let (status, head, _) = read_response(&mut stream).await;
    assert_eq!(status, 200, "{head}");
    let at = closed(&mut stream, idle + SLACK).await;
    assert!(at - sent >= idle, "idle closed after {:?}", at - sent);
    assert_serves(&sim).await;
}

#[tokio::test]
async fn trickled_and_oversized_bodies_are_refused() {
    let sim = sim(limits()).await;
    let body_limit = limits().body_read_timeout;
    let post = |length: &str| {
        format!(
            "POST /api/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {LLM_KEY}\r\n\
content-type: application/json\r\n{length}\r\n"
        )
    };

    let stream = TcpStream::connect(sim.addr()).await.expect("connects");
    let (mut read, mut write) = stream.into_split();
    let start = Instant::now();
    write
        .write_all(post("content-length: 1000\r\n").as_bytes())
        .await
        .expect("writes");
    trickle(write, vec![b' '; 1000], Duration::from_millis(20));
    let (status, _, body) = read_response(&mut read).await;
    assert_eq!(status, 408, "{body}");
    assert!(start.elapsed() >= body_limit, "cut after {:?}", start.elapsed());
    closed(&mut read, SLACK).await;

    // Declared too large: answered before a byte of the body is sent.
    let mut stream = TcpStream::connect(sim.addr()).await.expect("connects");
    stream
        .write_all(post("content-length: 100000\r\n").as_bytes())
        .await
        .expect("writes");
    let (status, _, body) = timeout(SLACK, read_response(&mut stream))
        .await
        .expect("answers at once");
    assert_eq!(status, 413, "{body}");

    // Sent chunked without a length: cut when the limit is crossed.
    let mut stream = TcpStream::connect(sim.addr()).await.expect("connects");
    stream
        .write_all(post("transfer-encoding: chunked\r\n").as_bytes())
        .await
        .expect("writes");
    for _ in 0..4 {
        let chunk = format!("800\r\n{}\r\n", " ".repeat(0x800));
        if stream.write_all(chunk.as_bytes()).await.is_err() {
            break;
        }
    }
    let (status, _, body) = read_response(&mut stream).await;
    assert_eq!(status, 413, "{body}");
    assert_serves(&sim).await;
}

#[tokio::test]
async fn over_the_connection_limit_a_connection_is_refused_and_a_freed_slot_serves() {
    let sim = sim(ConnectionLimits {
        max_connections: 2,
        header_read_timeout: Duration::from_secs(30),
        idle_timeout: Duration::from_secs(30),
        ..limits()
    })
    .await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = TcpStream::connect(sim.addr()).await.expect("connects");
        stream.write_all(list_streams().as_bytes()).await.expect("writes");
        assert_eq!(read_response(&mut stream).await.0, 200);
        held.push(stream);
    }

    // One more is refused at once: the client has sent nothing yet, so the best-effort 503 arrives.
    let mut extra = TcpStream::connect(sim.addr()).await.expect("the kernel accepts");
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
        let mut stream = TcpStream::connect(sim.addr()).await.expect("connects");
        let _ = stream.write_all(list_streams().as_bytes()).await;
        let mut buf = [0u8; 12];
        if stream.read_exact(&mut buf).await.is_ok() && &buf == b"HTTP/1.1 200" {
            break;
        }
        assert!(Instant::now() < deadline, "no slot was freed");
        tokio::task::yield_now().await;
    }
    timeout(SLACK, sim.shutdown())
        .await
        .expect("shuts down with an idle keep-alive open");
}

/// A gauge or counter of the proxy's `/metrics`.
async fn proxy_metric(proxy: &Proxy, name: &str) -> f64 {
    let text = http()
        .get(format!("{}/metrics", proxy.url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{name} in /metrics:\n{text}"))
}

/// Polls a proxy metric until `done` holds of it; panics at `within`.
async fn proxy_metric_until(
    proxy: &Proxy,
    name: &str,
    within: Duration,
    done: impl Fn(f64) -> bool,
) -> Instant {
    let until = Instant::now() + within;
    loop {
        let value = proxy_metric(proxy, name).await;
        if done(value) {
            return Instant::now();
        }
        assert!(Instant::now() < until, "{name} stayed at {value} for {within:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_forwarded_stream_the_client_stops_reading_is_closed_at_the_write_timeout() {
    // A token a millisecond for 100,000 tokens: the stream would run for minutes if it were not closed.
    let proxy = Proxy::with_engine(FakeEngineConfig {
        token_latency: Duration::from_millis(1),
        output_len: 100_000,
        max_context_len: 200_000,
        ..FakeEngineConfig::default()
    })
    .await;
    let write_timeout = limits().write_timeout;
    // A small send buffer on the sim's side too (accepted connections inherit the listener's), so that a
    // few hundred frames fill it whatever the kernel's autotuning would grow it to.
    let listener = TcpSocket::new_v4().expect("a socket");
    listener.set_send_buffer_size(4096).expect("a small send buffer");
    listener
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("binds");
    let sim = ArenaSim::builder(world())
        .listener(listener.listen(64).expect("listens"))
        .connection_limits(limits())
        .start()
        .await
        .expect("sim starts");
    let gateway_key = proxy.state.gateway_key();
    register(
        &sim,
        "stalled-chat",
        &proxy.url(),
        gateway_key.expose_secret(),
        &["chat"],
    )
    .await;
    let (session, _key) = proxy.session("stall").await;
    let token = proxy.state.session_token(&session);

    // A client with a small receive buffer that sends a streamed request and never reads.
    let socket = TcpSocket::new_v4().expect("a socket");
    socket.set_recv_buffer_size(4096).expect("a small receive buffer");
    let mut stream = socket.connect(sim.addr()).await.expect("connects");
    let body = json!({"model": "stalled-chat", "stream": true,
                      "messages": [{"role": "user", "content": "Talk."}]})
    .to_string();
    let request = format!(
        "POST /api/v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {LLM_KEY}\r\n\
         x-session-id: {session}\r\nx-session-token: {}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{body}",
        token.expose_secret(),
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("sends");
    let started = Instant::now();
    proxy_metric_until(&proxy, "rollout_proxy_reserved_tokens", SLACK, |v| v > 0.0).await;
    // The sim's write stalls, it closes the client's connection and drops the upstream stream with it:
    // the proxy's generation ends unfinished and its reservation is released, long before the proxy's own
    // write timeout (60 s) or the stream's end.
    let released = proxy_metric_until(
        &proxy,
        "rollout_proxy_reserved_tokens",
        write_timeout + 4 * SLACK,
        |v| v == 0.0,
    )
    .await;
    assert!(
        released - started >= write_timeout,
        "released after {:?}",
        released - started
    );
    assert_eq!(
        proxy_metric(&proxy, "rollout_proxy_aborted_generations_total").await,
        1.0
    );
    let mut drained = Vec::new();
    timeout(SLACK, stream.read_to_end(&mut drained))
        .await
        .expect("the sim closed the connection")
        .ok();
    assert!(
        drained.starts_with(b"HTTP/1.1 200"),
        "{:?}",
        String::from_utf8_lossy(&drained[..drained.len().min(200)])
    );
    assert_serves(&sim).await;
}
