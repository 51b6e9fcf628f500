//! `arena-rl proxy` as a user runs it: it prints its address once it listens, serves the proxy with the
//! fake engine and the SmolLM2 fixture, and exits cleanly on SIGTERM.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ADMIN: &str = "cli-proxy-admin-4b2e";

async fn http(addr: &str, method: &str, path: &str, key: &str, body: &str) -> String {
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connects");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("writes");
    let mut response = String::new();
    stream.read_to_string(&mut response).await.expect("reads");
    response
}

#[tokio::test]
async fn proxy_serves_the_fake_engine_and_stops_on_sigterm() {
    let Some(model) = std::env::var_os("ARENA_RL_SMOLLM2") else {
        panic!(
            "ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
    };
    let mut child = Command::new(env!("CARGO_BIN_EXE_arena-rl"))
        .args([
            "proxy",
            "--engine",
            "fake",
            "--port",
            "0",
            "--no-capacity-grants",
            "--model",
        ])
        .arg(model)
        .env("SWE_RL_ADMIN_API_KEY", ADMIN)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("prints its address");
    let addr = line
        .trim()
        .strip_prefix("rollout proxy listening on http://")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    let health = http(&addr, "GET", "/health", "", "").await;
    assert!(health.starts_with("HTTP/1.1 200"), "{health}");
    let started = http(&addr, "POST", "/rl/start_session", ADMIN, r#"{"task_id": "cli"}"#).await;
    assert!(started.starts_with("HTTP/1.1 200"), "{started}");
    let body = started.split("\r\n\r\n").nth(1).expect("body");
    let v: serde_json::Value = serde_json::from_str(body).expect("json");
    let key = v["api_key"].as_str().expect("key");
    let chat = http(
        &addr,
        "POST",
        "/v1/chat/completions",
        key,
        r#"{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}"#,
    )
    .await;
    assert!(chat.starts_with("HTTP/1.1 200"), "{chat}");
    assert!(chat.contains("\"completion_tokens\":5"), "{chat}");
    let wrong = http(
        &addr,
        "POST",
        "/rl/start_session",
        "not-the-key",
        r#"{"task_id": "x"}"#,
    )
    .await;
    assert!(wrong.starts_with("HTTP/1.1 403"), "{wrong}");
    let status = Command::new("kill")
        .arg(child.id().to_string())
        .status()
        .expect("kill runs");
    assert!(status.success());
    let output = child.wait_with_output().expect("exits");
    assert!(
        output.status.success(),
        "exit {:?}: {}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains(ADMIN),
        "the admin key is never printed"
    );
}
