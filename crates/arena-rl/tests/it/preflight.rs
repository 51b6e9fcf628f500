//! `arena-rl preflight` against a running arena-sim: the `preflight.json` it writes, and one-line errors
//! with a non-zero exit for each way a submission must be stopped.

use std::path::Path;
use std::process::Output;

use arena_sim::{ArenaSim, RefDef, StreamDef, TaskHistoryDef, World};
use base64::Engine as _;
use serde_json::{Value, json};

const TOKEN: &str = "preflight-cli-token-7c1e";

fn healthy(stream: StreamDef, harness: (&str, &str)) -> StreamDef {
    StreamDef {
        recent_tasks: vec![TaskHistoryDef {
            status: "DONE".into(),
            harness_ref: Some(RefDef::new(harness.0, harness.1)),
            reward_ref: Some(RefDef::new("grader", "2")),
        }],
        ..stream
    }
}

async fn sim() -> ArenaSim {
    let world = World {
        token: TOKEN.to_string(),
        ..World::default()
    }
    .stream(healthy(
        StreamDef::new("team/swe")
            .harness("claude-code", "3")
            .reward("grader", "2")
            .row("r1", &["domain:swe"])
            .row("r2", &[]),
        ("claude-code", "3"),
    ))
    .stream(healthy(
        StreamDef::new("codex-s").reward("grader", "2").row("c1", &[]),
        ("openai-codex", "1"),
    ))
    .stream(healthy(
        StreamDef::new("draft-s").reward("grader", "2").row("d1", &[]),
        ("draft", "1"),
    ))
    .stream(
        StreamDef::new("empty-s")
            .harness("claude-code", "3")
            .reward("grader", "2"),
    )
    .stream(
        StreamDef::new("sick-s")
            .harness("claude-code", "3")
            .reward("grader", "2")
            .row("x", &[]),
    )
    .harness_version("claude-code", "3", "PUBLISHED")
    .harness_version("openai-codex", "1", "PUBLISHED")
    .harness_version("draft", "1", "DRAFT");
    ArenaSim::start(world).await.expect("arena-sim starts")
}

async fn preflight(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_arena-rl"));
    command
        .arg("preflight")
        .args(args)
        .current_dir(dir)
        .env_remove("ARENA_OPENAPI_TOKEN")
        .env("HTTPS_PROXY", "http://127.0.0.1:9")
        .env("HTTP_PROXY", "http://127.0.0.1:9")
        .env("ARENA_PREFLIGHT_HTTP_TIMEOUT", "5");
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().await.expect("the arena-rl binary runs")
}

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

const STREAMS: &str = "\
streams:
  - name: swe
    stream_id: team/swe
    sampling_weight: 3
    task_envs: {ANTHROPIC_CUSTOM_HEADERS: 'x-keepalive-enable: true', SECRET_FLAG: hush-hush}
    reward_threshold: 0.98
  - name: codex
    stream_id: codex-s
    harness: openai-codex@1
    expected_reward_ref: {key: grader, version: '2'}
";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preflight_writes_the_summary_json() {
    let sim = sim().await;
    let dir = tempfile::tempdir().unwrap();
    let streams = write(dir.path(), "streams.yaml", STREAMS);
    let base = format!("{}/openapi/v1", sim.base_url());
    let out = preflight(
        dir.path(),
        &[
            "--streams-file",
            &streams,
            "--base-url",
            &base,
            "--output",
            "preflight.json",
        ],
        &[("ARENA_OPENAPI_TOKEN", TOKEN)],
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let written = std::fs::read_to_string(dir.path().join("preflight.json")).unwrap();
    assert!(written.ends_with("}\n"));
    assert_eq!(written, String::from_utf8_lossy(&out.stdout));
    assert!(!written.contains("hush-hush"), "env values are withheld");
    let json: Value = serde_json::from_str(&written).unwrap();
    assert_eq!(
        json,
        json!({"streams": [
            {
                "name": "swe", "stream_id": "team/swe", "sampling_weight": 3.0,
                "harness": "claude-code@3", "llm_protocol": "anthropic",
                "task_envs": ["ANTHROPIC_CUSTOM_HEADERS", "SECRET_FLAG"],
                "expected_reward_ref": {"key": "grader", "version": "2"},
                "reward_threshold": 0.98, "reward_transform_fn": "",
                "dataset_total": 2, "recent_terminal_tasks": 1, "recent_failures": 0,
                "recent_failure_rate": 0.0, "unhealthy_override": false
            },
            {
                "name": "codex", "stream_id": "codex-s", "sampling_weight": 1.0,
                "harness": "openai-codex@1", "llm_protocol": "responses",
                "task_envs": [],
                "expected_reward_ref": {"key": "grader", "version": "2"},
                "reward_threshold": null, "reward_transform_fn": "",
                "dataset_total": 1, "recent_terminal_tasks": 1, "recent_failures": 0,
                "recent_failure_rate": 0.0, "unhealthy_override": false
            }
        ]})
    );
    // The same Streams from a base64 environment variable.
    let b64 = base64::engine::general_purpose::STANDARD.encode(STREAMS);
    let out = preflight(
        dir.path(),
        &["--streams-env-b64", "MY_STREAMS", "--base-url", &sim.base_url()],
        &[("ARENA_OPENAPI_TOKEN", TOKEN), ("MY_STREAMS", &b64)],
    )
    .await;
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout), written);
}

/// Runs a failing preflight and returns its one error line.
async fn failure(sim: &ArenaSim, streams_yaml: &str, extra: &[&str], env: &[(&str, &str)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let streams = write(dir.path(), "streams.yaml", streams_yaml);
    let base = sim.base_url();
    let mut args = vec![
        "--streams-file",
        streams.as_str(),
        "--base-url",
        base.as_str(),
        "--output",
        "p.json",
    ];
    args.extend_from_slice(extra);
    let out = preflight(dir.path(), &args, env).await;
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "expected a failure: {stderr}");
    assert_eq!(out.status.code(), Some(1));
    assert!(out.stdout.is_empty());
    assert!(
        !dir.path().join("p.json").exists(),
        "no preflight.json after a failure"
    );
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    assert!(!stderr.contains(TOKEN), "{stderr}");
    lines[0].to_string()
}

fn one(name: &str, stream_id: &str, more: &str) -> String {
    format!("- name: {name}\n  stream_id: {stream_id}\n{more}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_failure_is_one_line_and_a_non_zero_exit() {
    let sim = sim().await;
    let token = [("ARENA_OPENAPI_TOKEN", TOKEN)];
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let cases: Vec<(String, Vec<&str>, &str)> = vec![
        (
            "streams: [{name: 'bad/name', stream_id: s}]\n".into(),
            vec![],
            "may only contain",
        ),
        (
            "streams: {oops: 1}\n".into(),
            vec![],
            "`streams` must be a list, got a mapping",
        ),
        (
            one(
                "swe",
                "team/swe",
                "  expected_reward_ref: {key: grader, version: '1'}\n",
            ),
            vec![],
            "reward_ref drifted: pinned grader@1, live grader@2",
        ),
        (
            one("d", "draft-s", "  harness: draft@1\n"),
            vec![],
            "harness draft@1 is DRAFT, not PUBLISHED",
        ),
        (
            one("e", "empty-s", ""),
            vec![],
            "stream empty-s contains no dataset rows",
        ),
        (
            one("s", "sick-s", ""),
            vec![],
            "stream sick-s failed health check: terminal=0, failures=0, failure_rate=0",
        ),
        (
            one("swe", "team/swe", ""),
            vec!["--max-failure-rate", "1.5"],
            "--max-failure-rate must be within [0, 1]",
        ),
    ];
    for (yaml, extra, want) in cases {
        let line = failure(&sim, &yaml, &extra, &token).await;
        assert!(line.contains(want), "want {want:?} in {line}");
    }
    let line = failure(&sim, &one("swe", "team/swe", ""), &[], &[]).await;
    assert!(line.contains("ARENA_OPENAPI_TOKEN is required"), "{line}");
    // A finite but huge timeout is one error line, not a panic.
    for var in ["ARENA_PREFLIGHT_HTTP_TIMEOUT", "ARENA_PREFLIGHT_CONNECT_TIMEOUT"] {
        let env = [("ARENA_OPENAPI_TOKEN", TOKEN), (var, "1e20")];
        let line = failure(&sim, &one("swe", "team/swe", ""), &[], &env).await;
        assert!(
            line.contains(&format!("{var} must be a positive number of seconds")),
            "{line}"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let out = preflight(
        dir.path(),
        &["--streams-file", "missing.yaml", "--base-url", &sim.base_url()],
        &token,
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("Arena Streams file not found"), "{stderr}");
    // An unreachable Arena: the connect error is named after the configured retries.
    let streams = write(dir.path(), "s.yaml", &one("swe", "team/swe", ""));
    let out = preflight(
        dir.path(),
        &[
            "--streams-file",
            &streams,
            "--base-url",
            &closed,
            "--retries",
            "0",
        ],
        &token,
    )
    .await;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("request failed after 1 attempt: connect error"),
        "{stderr}"
    );
    // A blank --streams-env-b64 variable.
    let out = preflight(
        dir.path(),
        &[
            "--streams-env-b64",
            "EMPTY_STREAMS",
            "--base-url",
            &sim.base_url(),
        ],
        &[("ARENA_OPENAPI_TOKEN", TOKEN), ("EMPTY_STREAMS", " ")],
    )
    .await;
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("EMPTY_STREAMS, which is unset or empty"));
}
