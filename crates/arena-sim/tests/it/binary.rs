//! The `arena-sim` binary serves a YAML world or a preset and prints its URL first.

use std::process::Stdio;

use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

use crate::world::WORLD;

/// One HTTP/1.1 request over a fresh connection; returns the status and JSON body.
async fn request(addr: &str, head: &str) -> (u16, Value) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("{head}\r\nHost: sim\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    let status = reply[9..12].parse().unwrap();
    let (_, body) = reply.split_once("\r\n\r\n").unwrap();
    (status, serde_json::from_str(body).unwrap_or(Value::Null))
}

#[tokio::test]
async fn the_binary_serves_a_yaml_world() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("world.yaml");
    std::fs::write(&path, WORLD).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_arena-sim"))
        .arg("--world")
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines.next_line().await.unwrap().expect("the base URL line");
    let addr = url.strip_prefix("http://").expect("an http URL").to_string();

    let (status, body) = request(
        &addr,
        "GET /openapi/v1/streams/team%2Fswe HTTP/1.1\r\nAuthorization: Bearer yaml-token",
    )
    .await;
    // The seeded 10% 503 rule may hit; the sim then answers with its injected-fault body.
    if status == 200 {
        assert_eq!(body["data"]["stream"]["stream_id"], "team/swe");
        assert_eq!(body["data"]["stream"]["default_reward_ref"]["version"], "2");
    } else {
        assert_eq!(status, 503);
    }
    let (status, _) = request(
        &addr,
        "GET /openapi/v1/streams/team%2Fswe HTTP/1.1\r\nAuthorization: Bearer nope",
    )
    .await;
    assert_eq!(status, 401);
    child.kill().await.unwrap();
}

#[tokio::test]
async fn a_bad_world_file_fails_with_one_message() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("world.yaml");
    std::fs::write(&path, "streams: [{stream_id: s, colour: red}]").unwrap();
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_arena-sim"))
        .arg("--world")
        .arg(&path)
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("invalid world") && stderr.contains("colour"),
        "{stderr}"
    );
}

#[tokio::test]
async fn the_binary_serves_the_quickstart_preset() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_arena-sim"))
        .args(["--preset", "quickstart"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = lines.next_line().await.unwrap().expect("the base URL line");
    let addr = url.strip_prefix("http://").expect("an http URL").to_string();
    let (status, body) = request(
        &addr,
        "GET /openapi/v1/streams/sim-messages HTTP/1.1\r\nAuthorization: Bearer arena-sim-token",
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let stream = &body["data"]["stream"];
    assert_eq!(stream["default_harness_ref"]["key"], "claude-sim");
    assert_eq!(stream["dataset_total"], arena_sim::QUICKSTART_ROWS);
    child.kill().await.unwrap();
}
