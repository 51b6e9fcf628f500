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

/// Without `SWE_RL_ADMIN_API_KEY` the proxy makes a random admin key, writes it to a new file of mode 0600
/// and names the file in its log (never the key); the public default key is refused, the file's key works,
/// and an existing file is never overwritten.
#[tokio::test]
async fn without_an_admin_key_the_proxy_makes_one_in_a_private_file() {
    use std::os::unix::fs::PermissionsExt as _;
    let model = std::env::var_os("ARENA_RL_SMOLLM2").expect("ARENA_RL_SMOLLM2 is set by cargo xtask test");
    let dir = tempfile::tempdir().unwrap();
    let key_file = dir.path().join("admin.key");
    let spawn = |file: &std::path::Path| {
        Command::new(env!("CARGO_BIN_EXE_arena-rl"))
            .args([
                "proxy",
                "--engine",
                "fake",
                "--port",
                "0",
                "--no-capacity-grants",
                "--model",
            ])
            .arg(&model)
            .arg("--admin-key-file")
            .arg(file)
            .env_remove("SWE_RL_ADMIN_API_KEY")
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starts")
    };
    let mut child = spawn(&key_file);
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("prints its address");
    let addr = line
        .trim()
        .strip_prefix("rollout proxy listening on http://")
        .expect("address")
        .to_string();
    let key = std::fs::read_to_string(&key_file).expect("the key file exists");
    assert_eq!(
        std::fs::metadata(&key_file).unwrap().permissions().mode() & 0o777,
        0o600
    );
    assert_eq!(key.len(), 48);
    let public = http(
        &addr,
        "POST",
        "/rl/start_session",
        "areal-admin-key",
        r#"{"task_id": "x"}"#,
    )
    .await;
    assert!(public.starts_with("HTTP/1.1 403"), "{public}");
    let started = http(&addr, "POST", "/rl/start_session", &key, r#"{"task_id": "x"}"#).await;
    assert!(started.starts_with("HTTP/1.1 200"), "{started}");
    child.kill().unwrap();
    let out = child.wait_with_output().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(log.contains("admin.key"), "the log names the file: {log}");
    assert!(!log.contains(&key), "the log never shows the key: {log}");
    // A second proxy refuses to reuse (overwrite) the file.
    let second = spawn(&key_file).wait_with_output().unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains("admin.key") && err.contains("must not exist"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&key_file).unwrap(), key);
}
