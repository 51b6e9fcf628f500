//! The LLM harnesses complete a tool-use lifecycle end to end: the real client launches the row, the harness
//! calls the model through the gateway (or directly), runs the `lookup` tool, and the grader scores the
//! answer; failures surface as the reference's statuses.

use std::collections::BTreeMap;
use std::time::Duration;

use arena_client::{
    ArenaClient, LaunchRequest, RegistryOptions, RolloutReport, RolloutSpec, RouteRegistry, RouteSetup,
    RunOptions, TaskResult,
};
use arena_sim::tasks::shell::{SHELL_TOOL, ShellTask};
use arena_sim::tasks::{TaskFamily, TaskInstance, ToolCall, assistant_turn, tool_results};
use arena_sim::{ArenaSim, LlmRunnerDef, RunnerDef, RunnerFault, StreamDef, World};
use secrecy::SecretString;
use serde_json::{Value, json};
use stream_config::{LlmProtocol, TaskStatus};

use crate::support::{LLM_KEY, Proxy, Reply, Upstream, client, world};

const GATEWAY_KEY: &str = "upstream-gateway-key-3f1a";
const SESSION_TOKEN: &str = "session-token-77d0";

/// The harness key of each protocol's runner in these tests.
fn harness_key(protocol: LlmProtocol) -> &'static str {
    match protocol {
        LlmProtocol::Anthropic => "claude-sim",
        LlmProtocol::Responses => "codex-sim",
        LlmProtocol::ChatCompletions => "chat-sim",
    }
}

/// A world with one stream per protocol (`s-anthropic`, `s-responses`, `s-chat_completions`), two rows of
/// family `max` each, and a runner per protocol set up by `runner`.
fn harness_world(runner: impl Fn(LlmProtocol) -> LlmRunnerDef) -> World {
    let mut world = world();
    for protocol in LlmProtocol::ALL {
        let key = harness_key(protocol);
        world = world.stream(
            StreamDef::new(format!("s-{protocol}"))
                .harness(key, "1")
                .family(TaskFamily::Max)
                .generated(2),
        );
        let def = runner(protocol);
        let def = match protocol {
            LlmProtocol::Anthropic => RunnerDef::Anthropic(def),
            LlmProtocol::Responses => RunnerDef::Responses(def),
            LlmProtocol::ChatCompletions => RunnerDef::Chat(def),
        };
        world.runners.insert(key.to_string(), def);
    }
    world.stream(
        StreamDef::new("s-plain")
            .harness("chat-sim", "1")
            .row("untagged", &["domain:other"]),
    )
}

fn row(protocol: LlmProtocol) -> (String, String) {
    let stream = format!("s-{protocol}");
    let data_id = format!("{stream}-row-0");
    (stream, data_id)
}

fn task(protocol: LlmProtocol) -> TaskInstance {
    TaskInstance::from_data_id(TaskFamily::Max, &row(protocol).1)
}

/// One `session_gateway` rollout of the protocol's row, as the training loop runs it.
async fn session_rollout(
    sim: &ArenaSim,
    protocol: LlmProtocol,
    upstream_url: &str,
    session_id: &str,
    gateway_key: &SecretString,
    session_token: &SecretString,
) -> RolloutReport {
    let (stream_id, data_id) = row(protocol);
    let session = (session_id, gateway_key, session_token);
    row_rollout(sim, &stream_id, &data_id, upstream_url, session).await
}

/// One `session_gateway` rollout of a row, as the training loop runs it; `session` is the session id, the
/// gateway key and the session's token.
async fn row_rollout(
    sim: &ArenaSim,
    stream_id: &str,
    data_id: &str,
    upstream_url: &str,
    (session_id, gateway_key, session_token): (&str, &SecretString, &SecretString),
) -> RolloutReport {
    let client = client(sim);
    let mut options = RegistryOptions::new(60.0).expect("options");
    options.inbound_protos = ["chat", "anthropic", "responses"].map(String::from).to_vec();
    let registry = RouteRegistry::new(client.clone(), options);
    let spec = RolloutSpec {
        stream_id: stream_id.to_string(),
        data_id: data_id.to_string(),
        harness: None,
        task_envs: BTreeMap::new(),
        proxy_base_url: upstream_url.to_string(),
        session_key: SecretString::from("unused-in-session-gateway"),
        session_id: Some(session_id.to_string()),
        gateway_key: Some(gateway_key.clone()),
        session_token: Some(session_token.clone()),
        run: RunOptions {
            timeout: Duration::from_secs(60),
            idempotency_key: None,
            key_honoured: false,
        },
        reward_ref: Default::default(),
    };
    let setup = RouteSetup::SessionGateway {
        registry: registry.clone(),
        llm_api_key: SecretString::from(LLM_KEY),
    };
    let report = client.run_rollout(&setup, &spec).await;
    registry.close().await;
    report
}

/// Replaces every string in `ids` by `ID`.
fn same_ids(v: Value, ids: &[&str]) -> Value {
    match v {
        Value::String(s) if ids.contains(&s.as_str()) => Value::String("ID".to_string()),
        Value::Array(a) => a.into_iter().map(|v| same_ids(v, ids)).collect(),
        Value::Object(o) => o.into_iter().map(|(k, v)| (k, same_ids(v, ids))).collect(),
        other => other,
    }
}

fn done(report: RolloutReport) -> TaskResult {
    match report.result {
        Ok(r) => r,
        Err(e) => panic!("the rollout failed: {e}"),
    }
}

#[tokio::test]
async fn the_chat_harness_completes_a_lifecycle_through_the_real_proxy() {
    let proxy = Proxy::start().await;
    let sim = ArenaSim::start(harness_world(|_| LlmRunnerDef::default()))
        .await
        .expect("sim starts");
    let protocol = LlmProtocol::ChatCompletions;
    let task = task(protocol);
    proxy.script_lookup(&task.key);
    proxy.script(&task.target().to_string());
    let (session, key) = proxy.session("harness").await;
    let token = proxy.state.session_token(&session);
    let gateway_key = proxy.state.gateway_key();
    let report = session_rollout(&sim, protocol, &proxy.url(), &session, &gateway_key, &token).await;
    assert_eq!(report.cleanup, Some(true));
    let result = done(report);
    assert_eq!((result.status, result.score), (TaskStatus::Done, Some(1.0)));
    assert_eq!(result.raw["model_calls"], 2);
    assert_eq!(result.raw["harness"], "chat-sim@1");
    assert_eq!(result.raw["tool_calls"][0]["arguments"], json!({"key": task.key}));
    assert_eq!(result.raw["final_answer"], task.target().to_string());
    // Both calls reached the session the headers named; the second extended the first.
    assert_eq!(proxy.end(&key).await, 2);
    assert_eq!(proxy.engine.requests().len(), 2);
    let counters = sim.counters();
    assert_eq!(counters.gateway[&protocol].forwarded, 2);
    assert_eq!(counters.live_routes, 0, "the route was released");
}

/// Each protocol's harness against a protocol-correct upstream, through the gateway in `session_gateway`
/// mode: what it sends is the canonical transcript the task module gives a warm-up.
#[tokio::test]
async fn every_harness_sends_the_canonical_conversation() {
    for protocol in LlmProtocol::ALL {
        let upstream = Upstream::start().await;
        let sim = ArenaSim::start(harness_world(|_| LlmRunnerDef::default()))
            .await
            .expect("sim starts");
        let task = task(protocol);
        upstream.push(Reply::Lookup(task.key.clone()));
        upstream.push(Reply::Text(format!(" {}\n", task.target())));
        let report = session_rollout(
            &sim,
            protocol,
            &upstream.url(),
            "7:0-0",
            &SecretString::from(GATEWAY_KEY),
            &SecretString::from(SESSION_TOKEN),
        )
        .await;
        let result = done(report);
        assert_eq!(result.score, Some(1.0), "{protocol}: {}", result.raw);
        assert_eq!(result.raw["model_calls"], 2, "{protocol}");
        let seen = upstream.seen();
        assert_eq!(seen.len(), 2, "{protocol}");
        let path = match protocol {
            LlmProtocol::Anthropic => "/v1/messages",
            LlmProtocol::Responses => "/responses",
            LlmProtocol::ChatCompletions => "/chat/completions",
        };
        let history_field = if protocol == LlmProtocol::Responses {
            "input"
        } else {
            "messages"
        };
        // The upstream's call ids differ from the canonical ones; the rest is identical.
        let call_id = match protocol {
            LlmProtocol::Anthropic => "toolu_1",
            LlmProtocol::Responses | LlmProtocol::ChatCompletions => "call_1",
        };
        let call = ToolCall {
            id: call_id.to_string(),
            name: "lookup".to_string(),
            arguments: json!({"key": task.key}),
        };
        let mut second = task.messages(protocol);
        second.extend(assistant_turn(protocol, "", std::slice::from_ref(&call)));
        second.extend(tool_results(protocol, &[(call.clone(), task.tool_result(&call))]));
        let canonical = task.transcript(protocol);
        let ids = ["toolu_0", "toolu_1", "call_0", "call_1"];
        assert_eq!(
            same_ids(Value::from(second.clone()), &ids),
            same_ids(Value::from(canonical[..canonical.len() - 1].to_vec()), &ids),
            "{protocol}: the second request is the canonical transcript up to the answer"
        );
        for (i, (s, history)) in seen.iter().zip([task.messages(protocol), second]).enumerate() {
            assert_eq!(s.path, path, "{protocol}");
            assert_eq!(
                s.body[history_field],
                Value::from(history),
                "{protocol} request {i}"
            );
            assert_eq!(s.body["tools"], TaskInstance::tools(protocol), "{protocol}");
            assert_eq!(
                s.body["model"]
                    .as_str()
                    .map(|m| m.starts_with("stream-areal-session-")),
                Some(true)
            );
            assert_eq!(s.header("x-session-id"), Some("7:0-0"), "{protocol}");
            assert_eq!(s.header("x-session-token"), Some(SESSION_TOKEN), "{protocol}");
            assert_eq!(s.header("x-api-key"), Some(GATEWAY_KEY), "{protocol}");
            assert_eq!(
                s.header("authorization"),
                Some(format!("Bearer {GATEWAY_KEY}").as_str())
            );
        }
        let streamed = seen[0].body.get("stream").cloned();
        match protocol {
            LlmProtocol::Anthropic => {
                assert_eq!(streamed, Some(json!(true)));
                assert_eq!(seen[0].header("anthropic-version"), Some("2023-06-01"));
                assert_eq!(seen[0].body["max_tokens"], 1024);
            }
            LlmProtocol::Responses => {
                assert_eq!(
                    (streamed, seen[0].body["store"].clone()),
                    (Some(json!(true)), json!(false))
                );
            }
            LlmProtocol::ChatCompletions => assert_eq!(streamed, None),
        }
        assert_eq!(sim.counters().gateway[&protocol].forwarded, 2);
    }
}

#[tokio::test]
async fn in_direct_mode_the_harness_calls_the_model_itself() {
    let upstream = Upstream::start().await;
    let sim = ArenaSim::start(harness_world(|_| LlmRunnerDef::default()))
        .await
        .expect("sim starts");
    let protocol = LlmProtocol::Anthropic;
    let task = task(protocol);
    upstream.push(Reply::Lookup(task.key.clone()));
    upstream.push(Reply::Text("0".to_string()));
    let (stream_id, data_id) = row(protocol);
    let spec = RolloutSpec {
        stream_id,
        data_id,
        harness: None,
        task_envs: BTreeMap::new(),
        proxy_base_url: upstream.url(),
        session_key: SecretString::from("direct-session-key"),
        session_id: Some("9:1-0".to_string()),
        gateway_key: None,
        session_token: None,
        run: RunOptions::default(),
        reward_ref: Default::default(),
    };
    let result = done(client(&sim).run_rollout(&RouteSetup::Direct, &spec).await);
    let expected = (1.0 - f64::from(task.target()) / 4.0).max(0.0);
    assert_eq!(result.score, Some(expected), "{}", result.raw);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    assert_eq!(seen[0].header("x-api-key"), Some("direct-session-key"));
    assert!(sim.counters().gateway.is_empty(), "the gateway saw nothing");
}

/// A direct launch of one row, to observe failures.
async fn launch(sim: &ArenaSim, stream_id: &str, data_id: &str, upstream: &Upstream) -> TaskResult {
    let request = LaunchRequest {
        data_id: data_id.to_string(),
        model_name: "m".to_string(),
        base_url: upstream.url(),
        api_key: SecretString::from("k"),
        envs: BTreeMap::new(),
        session_id: None,
        harness: None,
    };
    let client: ArenaClient = client(sim);
    let run = client.run_task(stream_id, &request, &RunOptions::default()).await;
    match run.result {
        Ok(r) => r,
        Err(e) => match e.task_failed() {
            Some(f) => f.result.clone(),
            None => panic!("not a task failure: {e}"),
        },
    }
}

#[tokio::test]
async fn failures_surface_as_the_reference_statuses() {
    struct Case {
        what: &'static str,
        protocol: LlmProtocol,
        replies: Vec<Reply>,
        data_id: Option<&'static str>,
        runner: LlmRunnerDef,
        status: TaskStatus,
        error: &'static [&'static str],
        not_in_error: &'static [&'static str],
        model_calls: u64,
    }
    let overflow = json!({"type": "error", "error": {"type": "invalid_request_error",
        "message": "prompt is too long: 300 tokens > 256 maximum"}});
    let chat_overflow = json!({"error": {"message": "the prompt does not fit", "type": "invalid_request_error",
        "code": "context_length_exceeded"}});
    let cases = vec![
        Case {
            what: "a context overflow, as Claude Code reports it",
            protocol: LlmProtocol::Anthropic,
            replies: vec![Reply::Error(400, overflow)],
            data_id: None,
            runner: LlmRunnerDef::default(),
            status: TaskStatus::HarnessFailed,
            error: &[
                "harness: harness agent phase exited with code",
                "harness: agent phase error: claude reported error",
                "prompt is too long",
            ],
            not_in_error: &[],
            model_calls: 1,
        },
        Case {
            what: "a context overflow of another harness",
            protocol: LlmProtocol::ChatCompletions,
            replies: vec![Reply::Error(400, chat_overflow)],
            data_id: None,
            runner: LlmRunnerDef::default(),
            status: TaskStatus::HarnessFailed,
            error: &["model call 1 failed: api error: 400", "context_length_exceeded"],
            not_in_error: &["claude reported error"],
            model_calls: 1,
        },
        Case {
            what: "a server error on the second call",
            protocol: LlmProtocol::Responses,
            replies: vec![
                Reply::Lookup("zz".into()),
                Reply::Error(503, json!({"error": "busy"})),
            ],
            data_id: None,
            runner: LlmRunnerDef::default(),
            status: TaskStatus::HarnessFailed,
            error: &["model call 2 failed: api error: 503"],
            not_in_error: &["claude"],
            model_calls: 2,
        },
        Case {
            what: "tool calls until the turns run out",
            protocol: LlmProtocol::Anthropic,
            replies: vec![Reply::Lookup("a1".into()), Reply::Lookup("a2".into())],
            data_id: None,
            runner: LlmRunnerDef {
                max_turns: 2,
                ..LlmRunnerDef::default()
            },
            status: TaskStatus::NoOutput,
            error: &["no final answer after 2 model calls"],
            not_in_error: &[],
            model_calls: 2,
        },
        Case {
            what: "an empty final answer",
            protocol: LlmProtocol::ChatCompletions,
            replies: vec![Reply::Text("  ".into())],
            data_id: None,
            runner: LlmRunnerDef::default(),
            status: TaskStatus::NoOutput,
            error: &["no final answer"],
            not_in_error: &[],
            model_calls: 1,
        },
        Case {
            what: "a model that never answers",
            protocol: LlmProtocol::ChatCompletions,
            replies: vec![Reply::Hang],
            data_id: None,
            runner: LlmRunnerDef {
                timeout_ms: 200,
                ..LlmRunnerDef::default()
            },
            status: TaskStatus::Timeout,
            error: &["exceeded its time limit of 200 ms"],
            not_in_error: &[],
            model_calls: 1,
        },
        Case {
            what: "a grader crash",
            protocol: LlmProtocol::Anthropic,
            replies: vec![Reply::Text("7".into())],
            data_id: None,
            runner: LlmRunnerDef {
                faults: vec![RunnerFault {
                    status: "EVAL_FAILED".into(),
                    probability: 1.0,
                    ..Default::default()
                }],
                ..LlmRunnerDef::default()
            },
            status: TaskStatus::EvalFailed,
            error: &["grader: injected crash"],
            not_in_error: &[],
            model_calls: 1,
        },
        Case {
            what: "an injected harness failure",
            protocol: LlmProtocol::Responses,
            replies: vec![],
            data_id: None,
            runner: LlmRunnerDef {
                faults: vec![RunnerFault {
                    status: "harness_failed".into(),
                    probability: 1.0,
                    ..Default::default()
                }],
                ..LlmRunnerDef::default()
            },
            status: TaskStatus::HarnessFailed,
            error: &["harness: injected harness_failed"],
            not_in_error: &[],
            model_calls: 0,
        },
        Case {
            what: "a GameAgent outcome code once the model answered (arena-2026.md 2.8)",
            protocol: LlmProtocol::ChatCompletions,
            replies: vec![Reply::Text("7".into())],
            data_id: None,
            runner: LlmRunnerDef {
                faults: vec![RunnerFault {
                    outcome_code: Some("AGENT_MAX_TURNS_EXCEEDED".into()),
                    after_run: true,
                    ..RunnerFault::always("HARNESS_FAILED")
                }],
                ..LlmRunnerDef::default()
            },
            status: TaskStatus::HarnessFailed,
            error: &["GAMEAGENT_OUTCOME_CODE=AGENT_MAX_TURNS_EXCEEDED GAMEAGENT_OUTCOME_CLASS=model"],
            not_in_error: &[],
            model_calls: 1,
        },
        Case {
            what: "the grader's own ERROR status",
            protocol: LlmProtocol::Anthropic,
            replies: vec![],
            data_id: None,
            runner: LlmRunnerDef {
                faults: vec![RunnerFault::always("ERROR")],
                ..LlmRunnerDef::default()
            },
            status: TaskStatus::Error,
            error: &["harness: injected ERROR"],
            not_in_error: &[],
            model_calls: 0,
        },
        Case {
            what: "a row of no task family",
            protocol: LlmProtocol::ChatCompletions,
            replies: vec![],
            data_id: Some("untagged"),
            runner: LlmRunnerDef::default(),
            status: TaskStatus::SetupFailed,
            error: &["row untagged has no task family"],
            not_in_error: &[],
            model_calls: 0,
        },
    ];
    for case in cases {
        let upstream = Upstream::start().await;
        for r in &case.replies {
            upstream.push(r.clone());
        }
        let runner = case.runner.clone();
        let sim = ArenaSim::start(harness_world(move |_| runner.clone()))
            .await
            .expect("sim starts");
        let (stream_id, data_id) = match case.data_id {
            Some(d) => ("s-plain".to_string(), d.to_string()),
            None => row(case.protocol),
        };
        let result = launch(&sim, &stream_id, &data_id, &upstream).await;
        let what = case.what;
        assert_eq!(result.status, case.status, "{what}: {}", result.raw);
        assert_eq!(result.score, None, "{what}");
        let error = result.raw["error"]
            .as_str()
            .expect("raw.error is a string")
            .to_lowercase();
        for phrase in case.error {
            assert!(
                error.contains(&phrase.to_lowercase()),
                "{what}: {error:?} lacks {phrase:?}"
            );
        }
        for phrase in case.not_in_error {
            assert!(!error.contains(phrase), "{what}: {error:?} has {phrase:?}");
        }
        if error.contains("gameagent_outcome_code=") {
            assert_eq!(
                result.raw["outcome"]["code"], "AGENT_MAX_TURNS_EXCEEDED",
                "{what}"
            );
            assert_eq!(
                result.raw["outcome"]["schema"], "areal.envarena-outcome.v1",
                "{what}"
            );
        }
        let calls = result.raw.get("model_calls").and_then(Value::as_u64).unwrap_or(0);
        assert_eq!(calls, case.model_calls, "{what}: {}", result.raw);
        assert_eq!(upstream.seen().len() as u64, case.model_calls, "{what}");
    }
}

#[tokio::test]
async fn the_key_never_reaches_the_result() {
    let upstream = Upstream::start().await;
    upstream.push(Reply::Error(500, json!({"error": "boom"})));
    let sim = ArenaSim::start(harness_world(|_| LlmRunnerDef::default()))
        .await
        .expect("sim starts");
    let secret = "sk-distinctive-secret-0042";
    let request = LaunchRequest {
        data_id: row(LlmProtocol::ChatCompletions).1,
        model_name: "m".to_string(),
        base_url: upstream.url(),
        api_key: SecretString::from(secret),
        envs: BTreeMap::from([(
            "ANTHROPIC_CUSTOM_HEADERS".to_string(),
            "X-Session-Token: tok".to_string(),
        )]),
        session_id: None,
        harness: None,
    };
    let run = client(&sim)
        .run_task("s-chat_completions", &request, &RunOptions::default())
        .await;
    let failed = run.result.expect_err("the model failed");
    let raw = failed
        .task_failed()
        .expect("a task failure")
        .result
        .raw
        .to_string();
    assert!(
        raw.contains("api error: 500") || raw.contains("API Error: 500"),
        "{raw}"
    );
    assert!(!raw.contains(secret), "{raw}");
    assert_eq!(
        upstream.seen()[0].header("authorization"),
        Some(format!("Bearer {secret}").as_str())
    );
    assert_eq!(upstream.seen()[0].header("x-session-token"), Some("tok"));
}

/// The shell harness replays a script of commands as `bash` calls through the real proxy in each protocol:
/// the proxy's integrity guard records the offending ones on the session, the simulated shell answers
/// every call, and the grader scores the whole script run in order.
#[tokio::test]
async fn the_shell_harness_replays_commands_through_the_real_proxy_in_every_protocol() {
    let script = [
        "git status",
        "cd /testbed && git --no-pager log --all --oneline | head -5",
        "bash -lc 'git reflog show --all'",
        "python -c \"import subprocess; subprocess.run(['git', 'show', 'c0ffee1234'])\"",
    ];
    let tags = ShellTask::tags(&script);
    let tags: Vec<&str> = tags.iter().map(String::as_str).collect();
    let mut world = world();
    for protocol in LlmProtocol::ALL {
        let key = harness_key(protocol);
        world = world.stream(
            StreamDef::new(format!("sh-{protocol}"))
                .harness(key, "1")
                .row(&format!("sh-{protocol}-row"), &tags),
        );
        world.runners.insert(key.to_string(), RunnerDef::llm(protocol));
    }
    let sim = ArenaSim::start(world).await.expect("sim starts");
    let proxy = Proxy::start().await;
    for protocol in LlmProtocol::ALL {
        for command in script {
            let call = json!({"name": SHELL_TOOL, "arguments": {"command": command}});
            proxy.script(&format!("<tool_call>\n{call}\n</tool_call>"));
        }
        proxy.script("done");
        let (session, key) = proxy.session("shell").await;
        let token = proxy.state.session_token(&session);
        let gateway_key = proxy.state.gateway_key();
        let (stream, data_id) = (format!("sh-{protocol}"), format!("sh-{protocol}-row"));
        let report = row_rollout(
            &sim,
            &stream,
            &data_id,
            &proxy.url(),
            (&session, &gateway_key, &token),
        )
        .await;
        let result = done(report);
        assert_eq!(
            (result.status, result.score),
            (TaskStatus::Done, Some(1.0)),
            "{protocol}: {}",
            result.raw
        );
        let ran: Vec<&str> = result.raw["tool_calls"]
            .as_array()
            .expect("tool calls")
            .iter()
            .map(|c| c["arguments"]["command"].as_str().expect("a command"))
            .collect();
        assert_eq!(ran, script, "{protocol}");
        let end = proxy.end_reply(&key).await;
        assert_eq!(end["interaction_count"], 5, "{protocol}: {end}");
        assert_eq!(
            end["integrity_hits"],
            json!({"git-log-all-refs": 1, "git-object-by-hash": 1, "git-reflog": 1}),
            "{protocol}: {end}"
        );
    }
}
