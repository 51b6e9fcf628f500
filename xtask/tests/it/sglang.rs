//! The test launcher `xtask/sglang/as_serve_policy.py`, which CPU-only clusters put behind `SGLANG_LAUNCHER`:
//! it checks SGLang's arguments with SGLang's own parser (`ARENA_RL_PY_SGLANG`), records them, and replaces
//! itself with `arena-rl serve-policy` serving the same model on the same address, the key taken from the
//! environment.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

const KEY: &str = "sglang-as-serve-policy-4d2c9e71b8a0";

fn sglang_python() -> String {
    std::env::var("ARENA_RL_PY_SGLANG").unwrap_or_else(|_| {
        panic!("ARENA_RL_PY_SGLANG is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
    })
}

fn launcher() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("sglang/as_serve_policy.py")
}

/// One HTTP/1.1 GET, with the key when `key` is set: (status, body).
fn get(addr: &str, path: &str, key: Option<&str>) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).expect("the server accepts");
    let auth = key
        .map(|k| format!("Authorization: Bearer {k}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .expect("send");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// SGLang's arguments for a CPU server become `arena-rl serve-policy` on the same address and model with the
/// same context length: it answers `/health` without a key, refuses `/get_server_info` without one and reports
/// the context length with it; what it received is recorded with SGLang's reading of it; the running server's
/// command line holds no key. Sizes serve-policy does not have are refused with exit 2 before it starts, and
/// a context length beyond the model's window once it has read the model (the quickstart policy's is 256).
#[test]
fn as_serve_policy_checks_sglangs_arguments_then_serves_with_serve_policy() {
    let python = sglang_python();
    let (arena_rl, _) = crate::slurm::binaries();
    let work = tempfile::tempdir().expect("temp dir");
    let fileroot = work.path().join("runs");
    std::fs::create_dir_all(&fileroot).expect("file root");
    let out = Command::new(&arena_rl)
        .args(["quickstart", "--prepare-policy", "--warmup-steps", "0"])
        .arg(format!("cluster.fileroot={}", fileroot.display()))
        .env("HOME", work.path())
        .output()
        .expect("arena-rl quickstart --prepare-policy runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let model = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let records = work.path().join("records");
    let launch = |args: &[&str]| {
        let mut cmd = Command::new(&python);
        cmd.arg(launcher())
            .args(args)
            .env("ARENA_RL_BIN", &arena_rl)
            .env("AREAL_FILEROOT", &fileroot)
            .env("ARENA_RL_POLICY_API_KEY", KEY)
            .env("ARENA_RL_SGLANG_RECORD_DIR", &records)
            .env("HOME", work.path());
        cmd
    };

    let refused = launch(&["--model-path", &model, "--tp-size", "2", "--device", "cpu"])
        .output()
        .expect("python runs");
    assert_eq!(refused.status.code(), Some(2));
    assert_eq!(
        String::from_utf8_lossy(&refused.stderr),
        "as_serve_policy: serve-policy has no tensor, pipeline or data parallelism, got {'tp_size': 2, 'pp_size': 1, 'dp_size': 1}\n"
    );
    let refused = launch(&["--model-path", &model, "--context-lenght", "256"])
        .output()
        .expect("python runs");
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("unrecognized arguments: --context-lenght 256"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    // A context the model does not have is refused, as SGLang refuses it, once serve-policy has read the model.
    let refused = launch(&[
        "--model-path",
        &model,
        "--port",
        "0",
        "--context-length",
        "4096",
        "--device",
        "cpu",
    ])
    .output()
    .expect("python runs");
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        err.contains(&format!(
            "--context-length 4096 is greater than the context window of the model in {model} (256 tokens"
        )),
        "{err}"
    );

    let args = [
        "--model-path",
        &model,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--context-length",
        "256",
        "--device",
        "cpu",
        "--dtype",
        "float32",
    ];
    let mut server = launch(&args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("the launcher starts");
    let pid = server.id();
    let mut lines = BufReader::new(server.stdout.take().expect("stdout")).lines();
    let mut addr = None;
    for line in lines.by_ref() {
        let line = line.expect("a line");
        if let Some(rest) = line.strip_prefix("policy server listening on http://") {
            addr = rest.split_whitespace().next().map(String::from);
        }
        if line.starts_with("policy server ready") {
            break;
        }
    }
    let addr = addr.expect("serve-policy said where it listens");
    let (health, _) = get(&addr, "/health", None);
    let (unauthorised, _) = get(&addr, "/get_server_info", None);
    let (ok, info) = get(&addr, "/get_server_info", Some(KEY));
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).expect("the server's command line");
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!((health, unauthorised, ok), (200, 401, 200), "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).expect("json");
    assert_eq!(info["context_length"], 256, "{info}");
    let cmdline: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    assert_eq!(cmdline[1], "serve-policy", "{cmdline:?}");
    for want in [
        format!("--model {model}"),
        "--host 127.0.0.1 --port 0 --device cpu --dtype f32".into(),
        format!("--weights-root {}", fileroot.display()),
        "--context-length 256".into(),
    ] {
        assert!(cmdline.join(" ").contains(&want), "{want}: {cmdline:?}");
    }
    assert!(!cmdline.iter().any(|a| a.contains(KEY)), "{cmdline:?}");

    let record: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(records.join("127.0.0.1-0.json")).expect("the record"))
            .expect("json");
    assert_eq!(record["model_path"], model.as_str());
    assert_eq!(record["context_length"], 256);
    assert_eq!(record["device"], "cpu");
    assert_eq!(record["api_key_set"], false);
    assert_eq!(record["argv"], serde_json::json!(args));
}
