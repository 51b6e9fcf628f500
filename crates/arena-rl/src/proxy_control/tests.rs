//! Retry classification, and the client against a scripted HTTP server on a real loopback socket: calls
//! that must not be delivered twice are not retried once the proxy may have read them.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use super::*;

#[test]
fn only_idempotent_calls_are_retried_once_the_proxy_may_have_acted() {
    use Delivery::{AtMostOnce, Idempotent};
    use TransportKind::{Connect, Other, Timeout};
    let check = |failure: Failure, at_most_once: bool, idempotent: bool| {
        assert_eq!(
            (retryable(AtMostOnce, failure), retryable(Idempotent, failure)),
            (at_most_once, idempotent),
            "{failure:?}"
        );
    };
    check(Failure::Transport(Connect), true, true);
    check(Failure::Status(408), true, true);
    check(Failure::Status(429), true, true);
    check(Failure::Status(503), true, true);
    check(Failure::Transport(Timeout), false, true);
    check(Failure::Transport(Other), false, true);
    check(Failure::Status(502), false, true);
    check(Failure::Status(504), false, true);
    for status in [400, 401, 403, 404, 409, 410, 422, 500] {
        check(Failure::Status(status), false, false);
    }
}

/// What the scripted server does with each request, in order; after the script it drops the connection.
#[derive(Clone, Copy)]
enum Step {
    /// Read the request, then close the connection without a reply.
    Drop,
    /// Answer with this status and body.
    Answer(u16, &'static str),
}

/// A server on loopback that follows `script` and records each request's path and body.
async fn scripted(script: Vec<Step>) -> (String, Arc<Mutex<Vec<(String, String)>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        let mut steps = script.into_iter();
        while let Ok((socket, _)) = listener.accept().await {
            let mut socket = BufReader::new(socket);
            loop {
                let mut head = String::new();
                let mut line = String::new();
                while socket.read_line(&mut line).await.is_ok_and(|n| n > 0) && line != "\r\n" {
                    head.push_str(&line);
                    line.clear();
                }
                if head.is_empty() {
                    break;
                }
                let length = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length:")
                            .map(str::to_string)
                    })
                    .and_then(|v| v.trim().parse::<usize>().ok())
                    .unwrap_or(0);
                let mut body = vec![0; length];
                socket.read_exact(&mut body).await.expect("body");
                let path = head.split(' ').nth(1).unwrap_or_default().to_string();
                log.lock()
                    .expect("log")
                    .push((path, String::from_utf8_lossy(&body).into_owned()));
                match steps.next().unwrap_or(Step::Drop) {
                    Step::Drop => break,
                    Step::Answer(status, body) => {
                        let reply = format!(
                            "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        );
                        socket
                            .get_mut()
                            .write_all(reply.as_bytes())
                            .await
                            .expect("writes");
                    }
                }
            }
        }
    });
    (base, seen)
}

fn client(base: &str) -> ProxyControl {
    ProxyControl::new(base, SecretString::from("admin-key"))
        .expect("client")
        .with_retries(3, Duration::from_millis(1))
}

fn attempts(e: &ControlError) -> u32 {
    match e {
        ControlError::Transport { attempts, .. } | ControlError::Status { attempts, .. } => *attempts,
        other => panic!("not a wire failure: {other}"),
    }
}

#[tokio::test]
async fn a_lost_reply_is_not_resent_for_calls_that_act_once() {
    let (base, seen) = scripted(vec![Step::Drop; 9]).await;
    let c = client(&base);
    let failures = [
        c.grant().await.map(|_| ()),
        c.start("17:3").await.map(|_| ()),
        c.export("s-1", ExportStyle::Concat, 1.0, None, None)
            .await
            .map(|_| ()),
    ];
    for failure in failures {
        let e = failure.expect_err("the server never answers");
        assert!(
            matches!(
                e,
                ControlError::Transport {
                    kind: TransportKind::Other,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(attempts(&e), 1, "{e}");
    }
    let paths: Vec<String> = seen.lock().expect("log").iter().map(|(p, _)| p.clone()).collect();
    assert_eq!(
        paths,
        ["/grant_capacity", "/rl/start_session", "/export_trajectories"]
    );
}

#[tokio::test]
async fn a_lost_reply_is_resent_for_idempotent_calls() {
    let reply = r#"{"message":"success","session_id":"s-1","interaction_count":2,"context_overflow":false,"context_overflow_message":null,"system_error":false,"system_error_message":null}"#;
    let (base, seen) = scripted(vec![Step::Drop, Step::Drop, Step::Answer(200, reply)]).await;
    let ended = client(&base)
        .end("s-1")
        .await
        .expect("the third attempt is answered");
    assert_eq!(ended.interaction_count, 2);
    assert_eq!(seen.lock().expect("log").len(), 3);

    let (base, seen) = scripted(vec![Step::Drop; 3]).await;
    let e = client(&base)
        .set_reward("s-1", 0.5)
        .await
        .expect_err("never answered");
    assert_eq!(attempts(&e), 3, "{e}");
    let seen = seen.lock().expect("log");
    assert_eq!(seen.len(), 3);
    let body: serde_json::Value = serde_json::from_str(&seen[0].1).expect("json");
    assert_eq!(body, serde_json::json!({"session_id": "s-1", "reward": 0.5}));
}

#[tokio::test]
async fn refusals_before_acting_are_retried_and_502_is_not_for_start() {
    let started = r#"{"session_id":"17:3-ab","api_key":"k-1"}"#;
    let (base, seen) = scripted(vec![Step::Answer(429, "{}"), Step::Answer(200, started)]).await;
    let session = client(&base).start("17:3").await.expect("started on the retry");
    assert_eq!(
        (session.session_id.as_str(), session.api_key.expose_secret()),
        ("17:3-ab", "k-1")
    );
    assert_eq!(seen.lock().expect("log").len(), 2);

    let (base, seen) = scripted(vec![Step::Answer(502, "bad gateway"), Step::Answer(200, started)]).await;
    let e = client(&base).start("17:3").await.expect_err("not resent");
    assert!(
        matches!(&e, ControlError::Status { status: 502, attempts: 1, body, .. } if body == "bad gateway"),
        "{e}"
    );
    assert_eq!(seen.lock().expect("log").len(), 1);

    let (base, _) = scripted(vec![Step::Answer(422, r#"{"error":{"message":"bad"}}"#)]).await;
    let e = client(&base).grant().await.expect_err("refused");
    assert!(
        matches!(
            e,
            ControlError::Status {
                status: 422,
                attempts: 1,
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn a_connect_error_is_retried_for_every_call() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    drop(listener);
    let e = client(&base).start("17:3").await.expect_err("nothing listens");
    assert!(
        matches!(
            e,
            ControlError::Transport {
                kind: TransportKind::Connect,
                attempts: 3,
                ..
            }
        ),
        "{e}"
    );
}

#[tokio::test]
async fn replies_that_are_not_the_wire_type_are_typed_errors() {
    let (base, _) = scripted(vec![Step::Answer(200, r#"{"session_id":"s"}"#)]).await;
    let e = client(&base).start("t").await.expect_err("no api_key");
    assert!(
        matches!(
            e,
            ControlError::Reply {
                call: "POST /rl/start_session",
                ..
            }
        ),
        "{e}"
    );
    let e = client(&base)
        .set_reward("s", f64::NAN)
        .await
        .expect_err("refused here");
    assert!(matches!(e, ControlError::NonFiniteReward(r) if r.is_nan()), "{e}");
}

/// `arena-2026.md` 3.5 test 6 (`test_proxy_client_sends_episode_reward_only_when_requested`): the export
/// request carries `episode_reward` exactly when one is given, 0.0 included.
#[tokio::test]
async fn the_episode_reward_is_sent_only_when_requested() {
    for (asked, sent) in [
        (None, None),
        (Some(0.0), Some(serde_json::json!(0.0))),
        (Some(0.5), Some(serde_json::json!(0.5))),
    ] {
        let (base, seen) = scripted(vec![Step::Drop]).await;
        let _ = client(&base)
            .export("s-1", ExportStyle::Concat, 1.0, Some(0.5), asked)
            .await;
        let seen = seen.lock().expect("log");
        let body: serde_json::Value = serde_json::from_str(&seen[0].1).expect("json");
        assert_eq!(body.get("episode_reward").cloned(), sent, "{body}");
    }
}
