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

/// The proxy a run starts (`run::settings::proxy_config`) answers a reward a session sets on itself, as
/// the reference does, but never exports it: only Arena's reward, through the workflow's admin calls,
/// reaches the trajectories (and so `rollouts.jsonl`).
#[tokio::test]
async fn a_run_s_proxy_never_exports_a_reward_a_session_sets_itself() {
    use std::sync::Arc;

    use arena_rl::proxy_control::ProxyControl;
    use rollout_proxy::{ChatModel, ExportStyle, FakeEngine, FakeEngineConfig, ProxyServer, ProxyState};
    use secrecy::SecretString;

    let Some(model) = std::env::var_os("ARENA_RL_SMOLLM2") else {
        panic!(
            "ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first"
        );
    };
    let config = stream_config::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\n",
        &[],
        &stream_config::Env::default(),
    )
    .expect("a config");
    let proxy_config = arena_rl::run::settings::proxy_config(&config, SecretString::from(ADMIN));
    assert_eq!(
        proxy_config.session_rewards,
        rollout_proxy::SessionRewards::Ignore
    );
    assert_eq!(
        proxy_config.connection,
        rollout_proxy::ConnectionLimits::default()
    );
    // Each limit of the `proxy` section reaches the proxy's own settings.
    let tuned = stream_config::load_run_config_str(
        "run.yaml",
        "experiment_name: e\ntrial_name: t\nproxy:\n  header_read_timeout_seconds: 1\n  body_read_timeout_seconds: 2\n  \
         idle_timeout_seconds: 3\n  write_timeout_seconds: 4\n  max_body_bytes: 5\n  max_connections: 6\n  \
         max_generations_per_session: 7\n  max_response_bytes_per_session: 8\n  max_response_bytes: 9\n  \
         pool_threads: 10\n  pool_queue: 11\n",
        &[],
        &stream_config::Env::default(),
    )
    .expect("a config");
    let tuned = arena_rl::run::settings::proxy_config(&tuned, SecretString::from(ADMIN));
    let secs = std::time::Duration::from_secs;
    assert_eq!(
        tuned.connection,
        rollout_proxy::ConnectionLimits {
            header_read_timeout: secs(1),
            body_read_timeout: secs(2),
            idle_timeout: secs(3),
            write_timeout: secs(4),
            max_body_bytes: 5,
            max_connections: 6,
            ..rollout_proxy::ConnectionLimits::default()
        }
    );
    assert_eq!(
        (
            tuned.limits.max_generations_per_session,
            tuned.limits.max_response_bytes_per_session,
            tuned.limits.max_response_bytes
        ),
        (7, 8, 9)
    );
    assert_eq!(
        tuned.pool,
        rollout_proxy::PoolLimits {
            threads: 10,
            queue: 11
        }
    );
    assert_eq!(proxy_config.pool, rollout_proxy::PoolLimits::default());
    let model = Arc::new(ChatModel::from_dir(model).expect("SmolLM2 loads"));
    let engine = Arc::new(FakeEngine::new(FakeEngineConfig {
        eos_token: model.stop_token_ids.first().copied(),
        ..FakeEngineConfig::default()
    }));
    let state = ProxyState::new(proxy_config, model, engine).expect("state");
    let server = ProxyServer::start("127.0.0.1:0".parse().expect("addr"), state)
        .await
        .expect("listens");
    let addr = server.local_addr().to_string();
    let control = ProxyControl::new(&format!("http://{addr}"), SecretString::from(ADMIN)).expect("a client");
    control.grant().await.expect("grants");
    let session = control.start("self-graded").await.expect("starts");
    let key = secrecy::ExposeSecret::expose_secret(&session.api_key).to_string();
    let chat = r#"{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}"#;
    let reply = http(&addr, "POST", "/v1/chat/completions", &key, chat).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let (_, body) = reply.split_once("\r\n\r\n").expect("a body");
    let first: serde_json::Value = serde_json::from_str(body).expect("JSON");
    let first = first["id"].as_str().expect("an id").to_string();
    let reply = http(&addr, "POST", "/v1/chat/completions", &key, chat).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    // On the older interaction, where the export's final reward would not overwrite it.
    let grade = format!(r#"{{"reward": 9.0, "interaction_id": "{first}"}}"#);
    let reply = http(&addr, "POST", "/rl/set_reward", &key, &grade).await;
    assert!(reply.starts_with("HTTP/1.1 200"), "the call is answered: {reply}");
    control.end(&session.session_id).await.expect("ends");
    let export = control
        .export(&session.session_id, ExportStyle::Individual, 1.0, Some(0.5), None)
        .await
        .expect("exports");
    assert_eq!(export.trajectories.len(), 2);
    assert_eq!(export.trajectories[0].interaction_id, first);
    assert_eq!(export.trajectories[0].original_reward, 0.0, "not the session's 9");
    assert_eq!(
        export.trajectories[0].reward, 0.5,
        "Arena's reward discounted back, and nothing else"
    );
    assert_eq!(export.trajectories[1].original_reward, 0.5);
    server.shutdown().await.expect("stops");
}
