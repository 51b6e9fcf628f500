//! Hostile clients that would grow the proxy's memory, over raw loopback sockets at the sizes an
//! independent review used, with the growth read from this process's resident memory (`VmRSS`): heads
//! that never finish, held by connections that have shown no credential.

use std::sync::Arc;
use std::time::Duration;

use rollout_proxy::ConnectionLimits;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::common::{Proxy, call, config, engine_config, rss};

const MIB: u64 = 1024 * 1024;

/// Opens `n` connections to `addr`, each sending `head` and never finishing it; answers the streams.
async fn unfinished_heads(addr: std::net::SocketAddr, n: usize, head: Arc<Vec<u8>>) -> Vec<TcpStream> {
    let tasks: Vec<_> = (0..n)
        .map(|_| {
            let head = head.clone();
            tokio::spawn(async move {
                let mut s = TcpStream::connect(addr).await.expect("connects");
                // The proxy may answer and close before it has read all of it.
                let _ = s.write_all(&head).await;
                s
            })
        })
        .collect();
    let mut streams = Vec::with_capacity(n);
    for t in tasks {
        streams.push(t.await.expect("joins"));
    }
    streams
}

/// 600 connections each send 300 KiB of a head that never ends. hyper's default buffer (about 400 KiB)
/// held all of it until the header deadline (the review measured +319 MiB); with `max_head_bytes` each is
/// answered 431 (or reset) as soon as its head passes the limit, and 600 heads held just under the limit
/// cost at most the limit each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_heads_cannot_grow_the_proxy_past_the_head_limit() {
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(120),
        ..ConnectionLimits::default()
    };
    let max_head = limits.max_head_bytes as u64;
    let mut c = config();
    c.connection = limits;
    let p = Proxy::start(c, engine_config()).await;
    let addr = p.server.local_addr();
    let pad = |bytes: usize| {
        let mut head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nx-pad: ".to_vec();
        head.resize(head.len() + bytes, b'a');
        Arc::new(head)
    };
    let before = rss();
    let streams = unfinished_heads(addr, 600, pad(300 * 1024)).await;
    // Each connection ends long before the header deadline: a 431, or a reset when the proxy closed a
    // socket with unread bytes in it.
    let ends: Vec<_> = streams
        .into_iter()
        .map(|mut s| {
            tokio::spawn(async move {
                let mut first = [0u8; 12];
                let mut read = 0;
                loop {
                    match s.read(&mut first[read..]).await {
                        Ok(0) | Err(_) => {
                            // Closed or reset, after none or part of a 431.
                            return first[..read] == b"HTTP/1.1 431"[..read];
                        }
                        Ok(n) => {
                            read += n;
                            if read == first.len() {
                                return first == *b"HTTP/1.1 431";
                            }
                        }
                    }
                }
            })
        })
        .collect();
    for end in ends {
        let ok = tokio::time::timeout(Duration::from_secs(60), end)
            .await
            .expect("the proxy closes a head past max_head_bytes, not at the header deadline")
            .expect("joins");
        assert!(ok, "answered 431 or closed");
    }
    let oversized = rss().saturating_sub(before);
    // Heads just under the limit are held until the header deadline, each within the limit.
    let held = unfinished_heads(addr, 600, pad(max_head as usize - 1024)).await;
    let health = call(http::Method::GET, &p.url("/health"), &[], None).await;
    assert_eq!(health.status, http::StatusCode::OK);
    let grown = rss().saturating_sub(before);
    eprintln!(
        "600 x 300 KiB unfinished heads: +{} MiB; then 600 held heads of {} KiB: +{} MiB in all",
        oversized / MIB,
        (max_head - 1024) / 1024,
        grown / MIB
    );
    assert!(oversized < 64 * MIB, "+{} MiB", oversized / MIB);
    let bound = 600 * max_head * 2 + 64 * MIB;
    assert!(grown < bound, "+{} MiB, bound {} MiB", grown / MIB, bound / MIB);
    drop(held);
}

/// A gauge's value off `/metrics`.
async fn gauge(p: &Proxy, name: &str) -> f64 {
    let text = call(http::Method::GET, &p.url("/metrics"), &[], None).await.text;
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or_else(|| panic!("{name} in {text}"))
}

/// One connection of session `key` that declares a body of `declared` bytes and sends all but the last
/// MiB of it (`body`, shared by every connection so the clients cost this process nothing per
/// connection). Answers the writer (done once it has written what it will, holding the connection open) and
/// the reader (the status the connection was answered with, if it was).
async fn unfinished_body(
    addr: std::net::SocketAddr,
    key: &str,
    declared: usize,
    body: Arc<Vec<u8>>,
) -> (
    tokio::task::JoinHandle<tokio::net::tcp::OwnedWriteHalf>,
    tokio::task::JoinHandle<Option<u16>>,
) {
    let stream = TcpStream::connect(addr).await.expect("connects");
    let (mut reader, mut writer) = stream.into_split();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {declared}\r\n\r\n"
    );
    let write = tokio::spawn(async move {
        if writer.write_all(head.as_bytes()).await.is_ok() {
            let _ = writer.write_all(&body).await;
        }
        writer
    });
    let read = tokio::spawn(async move {
        let mut first = [0u8; 12];
        reader.read_exact(&mut first).await.ok()?;
        std::str::from_utf8(&first[9..12]).ok()?.parse().ok()
    });
    (write, read)
}

/// The status of one raw request of session `key` with `body`.
async fn raw_status(addr: std::net::SocketAddr, key: &str, body: &[u8]) -> u16 {
    let mut s = TcpStream::connect(addr).await.expect("connects");
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer {key}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("writes");
    let _ = s.write_all(body).await;
    let mut first = [0u8; 12];
    s.read_exact(&mut first).await.expect("answered");
    std::str::from_utf8(&first[9..12])
        .expect("status")
        .parse()
        .expect("status")
}

/// 24 connections of one session each declare a 30 MiB body and hold it unfinished (the review measured
/// +856 MiB); then a 20 MB body of `[0,0,...]`, whose parsed tree is 16 times its text (two of them peaked
/// at +2.1 GiB). The session's requests are admitted before their bodies are read: only as many bodies
/// as fit its `max_request_bytes_per_session` are read, every other connection is answered 429 without a
/// byte of its body read, and the tree is reserved before it is built, so the `[0,0,...]` body is 413.
/// The proxy's own accounting (`rollout_proxy_request_bytes`) holds exactly the admitted bodies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_sessions_unfinished_bodies_hold_at_most_its_request_budget() {
    use futures::StreamExt;
    const BODY: usize = 30 << 20;
    const CONNECTIONS: usize = 24;
    let mut c = config();
    c.connection.body_read_timeout = Duration::from_secs(120);
    c.limits.max_request_bytes_per_session = 64 << 20;
    let budget = c.limits.max_request_bytes_per_session;
    let p = Proxy::start(c, engine_config()).await;
    let (_, key) = p.session("t").await;
    let addr = p.server.local_addr();
    let mut zeros = br#"{"messages":[{"role":"user","content":"hi"}],"pad":[0"#.to_vec();
    while zeros.len() < 20_000_000 {
        zeros.extend_from_slice(b",0");
    }
    zeros.extend_from_slice(b"]}");
    assert_eq!(
        raw_status(addr, &key, &zeros).await,
        413,
        "its tree would not fit the session's budget"
    );
    drop(zeros);
    let mut body = br#"{"messages":[{"role":"user","content":""#.to_vec();
    body.resize(BODY - (1 << 20), b'a');
    let body = Arc::new(body);
    let before = rss();
    let mut writers = Vec::new();
    let mut answers = futures::stream::FuturesUnordered::new();
    for i in 0..CONNECTIONS {
        let (w, r) = unfinished_body(addr, &key, BODY, body.clone()).await;
        writers.push(Some(w));
        answers.push(async move { (i, r.await.expect("joins")) });
    }
    let admitted = budget / BODY;
    // Every connection past the budget is answered at once; the admitted ones never are.
    for _ in 0..CONNECTIONS - admitted {
        let (i, status) = tokio::time::timeout(Duration::from_secs(60), answers.next())
            .await
            .expect("a refusal is not held until the body deadline")
            .expect("an answer");
        assert_eq!(status, Some(429), "connection {i}");
        writers[i] = None;
    }
    let mut held = Vec::new();
    for w in writers.into_iter().flatten() {
        held.push(w.await.expect("joins"));
    }
    assert_eq!(held.len(), admitted);
    let accounted = gauge(&p, "rollout_proxy_request_bytes").await as usize;
    assert_eq!(
        accounted,
        admitted * BODY,
        "the admitted bodies, declared in full"
    );
    let grown = rss().saturating_sub(before);
    eprintln!(
        "{CONNECTIONS} x 30 MiB unfinished bodies of one session: {} refused at once, +{} MiB",
        CONNECTIONS - admitted,
        grown / MIB
    );
    assert!(
        grown < budget as u64 + 64 * MIB,
        "+{} MiB past the session's budget of {} MiB",
        grown / MIB,
        budget >> 20
    );
    drop(held);
}

/// 32 clients ask for one stored response of about 1 MiB (its echoed `text`) and never read the answer,
/// through receive buffers of 4 KiB. A GET cloned the stored tree under the store's lock and serialised
/// it on an async thread, so each unread GET held a copy until the write timeout (the review: 32 GETs,
/// 306 MiB); the store now keeps the answer's JSON and every GET shares it. `/health` is answered while
/// they are stalled, and the growth is within a few copies of the one answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unread_gets_of_a_stored_response_share_it_and_health_is_answered() {
    let mut c = config();
    c.connection.write_timeout = Duration::from_secs(120);
    // A small send buffer on the proxy's side (accepted connections inherit the listener's), so that what
    // an unread answer holds is the proxy's, not the kernel's.
    let listener = tokio::net::TcpSocket::new_v4().expect("a socket");
    listener.set_send_buffer_size(4096).expect("a small send buffer");
    listener
        .bind("127.0.0.1:0".parse().expect("addr"))
        .expect("binds");
    let p = Proxy::start_on(listener.listen(64).expect("listens"), c, engine_config());
    let (_, key) = p.session("t").await;
    let text = serde_json::json!({"format": {"type": "json_schema", "name": "big", "schema":
        {"description": "d".repeat(1000 * 1000)}}});
    let r = p
        .responses(
            &key,
            serde_json::json!({"input": "Hi", "max_output_tokens": 4, "text": text}),
        )
        .await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.text);
    let id = r.json()["id"].as_str().expect("an id").to_string();
    let stored = r.text.len() as u64;
    drop(r);
    let addr = p.server.local_addr();
    let before = rss();
    let mut stalled = Vec::new();
    for _ in 0..32 {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.set_recv_buffer_size(4096).expect("rcvbuf");
        let mut s = socket.connect(addr).await.expect("connects");
        let get =
            format!("GET /v1/responses/{id} HTTP/1.1\r\nhost: proxy\r\nauthorization: Bearer {key}\r\n\r\n");
        s.write_all(get.as_bytes()).await.expect("asks");
        let mut first = [0u8; 12];
        s.read_exact(&mut first).await.expect("the answer starts");
        assert_eq!(&first, b"HTTP/1.1 200");
        stalled.push(s);
    }
    let health = call(http::Method::GET, &p.url("/health"), &[], None).await;
    assert_eq!(health.status, http::StatusCode::OK);
    let grown = rss().saturating_sub(before);
    eprintln!(
        "32 unread GETs of a {} KiB stored response: +{} MiB",
        stored / 1024,
        grown / MIB
    );
    assert!(
        grown < 4 * stored + 8 * MIB,
        "+{} MiB for a {} KiB answer",
        grown / MIB,
        stored / 1024
    );
    drop(stalled);
}

/// 24 branches off one long turn (a client that replays the turn with a different last message each
/// time). A `concat` export writes each leaf's whole chain, so it repeated the long turn once per branch
/// (the review: 456 branches of a 17.6k-token turn, 199 MB, +730 MiB); it now writes at most
/// `max_export_amplification` times the tokens the session stored, the newest branches first, and says
/// how many it left out.
#[tokio::test]
async fn branches_off_one_long_turn_export_within_the_amplification_bound() {
    let p = Proxy::default().await;
    let (id, key) = p.session("t").await;
    let long = "word ".repeat(1000);
    let ask = |messages: serde_json::Value| serde_json::json!({"messages": messages, "max_tokens": 8});
    let first = p
        .chat(&key, ask(serde_json::json!([{"role": "user", "content": long}])))
        .await;
    assert_eq!(first.status, http::StatusCode::OK, "{}", first.text);
    let reply = first.json()["choices"][0]["message"]["content"]
        .as_str()
        .expect("a reply")
        .to_string();
    for b in 0..24 {
        let r = p
            .chat(
                &key,
                ask(serde_json::json!([
                    {"role": "user", "content": long},
                    {"role": "assistant", "content": reply},
                    {"role": "user", "content": format!("branch {b}")},
                ])),
            )
            .await;
        assert_eq!(r.status, http::StatusCode::OK, "{}", r.text);
    }
    let stored = gauge(&p, "rollout_proxy_stored_tokens").await as usize;
    assert_eq!(p.end(&key).await.status, http::StatusCode::OK);
    let r = p
        .admin(
            "/export_trajectories",
            serde_json::json!({"session_id": id, "style": "concat"}),
        )
        .await;
    assert_eq!(r.status, http::StatusCode::OK, "{}", r.text);
    let export = r.json();
    let trajectories = export["trajectories"].as_array().expect("trajectories");
    let written: usize = trajectories
        .iter()
        .map(|t| t["token_ids"].as_array().expect("tokens").len())
        .sum();
    eprintln!(
        "24 branches off a 1000-word turn: {} trajectories, {written} tokens for {stored} stored, {} KiB of export",
        trajectories.len(),
        r.text.len() / 1024
    );
    let bound = rollout_proxy::SessionLimits::default().max_export_amplification as usize;
    assert!(written <= bound * stored, "{written} > {bound} x {stored}");
    let dropped = export["branches_dropped"].as_u64().expect("some were left out") as usize;
    assert_eq!(trajectories.len() + dropped, 24);
}
