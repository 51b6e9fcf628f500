//! The real Claude Code CLI (npm `@anthropic-ai/claude-code`, from `ARENA_RL_NODE_BIN`) as the external-command
//! harness, through the whole chain the training loop uses in `session_gateway` mode: `arena-client` registers
//! a route to the real rollout proxy and launches a row; the sim runs `claude -p` with Arena's environment;
//! the CLI's requests (over 4k tokens of system prompt and tools each) go through the sim's LLM gateway to the
//! proxy, whose fake engine is scripted to call `lookup` through Claude Code's `Bash` tool and then answer;
//! the grader sees the logged `lookup` call and the printed answer. The Codex CLI (`@openai/codex`) runs the
//! same task over the Responses protocol in `direct` mode.
//!
//! Where `ARENA_RL_NODE_BIN` is unset the test fails naming it, unless npm itself is unavailable (then no
//! fixture can exist and the test says so and passes without running the CLI).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use arena_client::{RegistryOptions, RolloutReport, RolloutSpec, RouteRegistry, RouteSetup, RunOptions};
use arena_sim::tasks::{TaskFamily, TaskInstance};
use arena_sim::{ArenaSim, CommandRunnerDef, RunnerDef, StreamDef};
use secrecy::SecretString;
use serde_json::json;
use stream_config::{LlmProtocol, TaskStatus};

use crate::support::{LLM_KEY, Proxy, client, fixture, http, model, world};

/// Room for Claude Code's prompts (about 4.2k SmolLM2 tokens, plus the tool round trip).
const CONTEXT: usize = 65_536;

/// A context a tiny CPU policy could have (the quickstart's is smaller still); Claude Code's prompt is
/// asserted to exceed it, which is why the fake engine serves the CLI.
const TINY_CONTEXT: usize = 2048;

/// The folder holding the `claude` and `codex` launchers, or `None` (after saying why) where npm is missing.
fn node_bin() -> Option<PathBuf> {
    if std::env::var_os("ARENA_RL_NODE_BIN").is_none() {
        let npm = std::process::Command::new("npm").arg("--version").output();
        if !npm.is_ok_and(|o| o.status.success()) {
            eprintln!(
                "skipped: ARENA_RL_NODE_BIN is unset and npm is not available, so the Claude Code CLI \
                 cannot be installed on this machine"
            );
            return None;
        }
    }
    Some(fixture("ARENA_RL_NODE_BIN"))
}

/// How the launch reaches the proxy.
enum Mode {
    /// Through the sim's gateway on a registered route advertising this protocol; the session is bound by the
    /// session headers.
    SessionGateway(&'static str),
    /// Straight to the proxy with this session key.
    Direct(SecretString),
}

/// One rollout of the stream's first row with the runner `def`, as the training loop runs it.
async fn rollout(
    def: CommandRunnerDef,
    mode: Mode,
    proxy: &Proxy,
    session: &str,
) -> (ArenaSim, RolloutReport) {
    let mut world = world().stream(
        StreamDef::new("cli")
            .harness("agent-cli", "1")
            .family(TaskFamily::Max)
            .generated(1),
    );
    world
        .runners
        .insert("agent-cli".to_string(), RunnerDef::Command(def));
    let sim = ArenaSim::start(world).await.expect("sim starts");
    let client = client(&sim);
    let mut spec = RolloutSpec {
        stream_id: "cli".to_string(),
        data_id: "cli-row-0".to_string(),
        harness: None,
        task_envs: BTreeMap::new(),
        proxy_base_url: proxy.url(),
        session_key: SecretString::from("unused-in-session-gateway"),
        session_id: Some(session.to_string()),
        gateway_key: None,
        session_token: None,
        run: RunOptions {
            timeout: Duration::from_secs(180),
            idempotency_key: None,
            key_honoured: false,
        },
        reward_ref: Default::default(),
    };
    let report = match mode {
        Mode::SessionGateway(inbound) => {
            let mut options = RegistryOptions::new(60.0).expect("options");
            options.inbound_protos = vec![inbound.to_string()];
            let registry = RouteRegistry::new(client.clone(), options);
            spec.gateway_key = Some(proxy.state.gateway_key());
            spec.session_token = Some(proxy.state.session_token(session));
            let setup = RouteSetup::SessionGateway {
                registry: registry.clone(),
                llm_api_key: SecretString::from(LLM_KEY),
            };
            let report = client.run_rollout(&setup, &spec).await;
            registry.close().await;
            report
        }
        Mode::Direct(key) => {
            spec.session_key = key;
            client.run_rollout(&RouteSetup::Direct, &spec).await
        }
    };
    (sim, report)
}

/// The proxy's request counters other than the admin calls: every one for `endpoint` (or Claude Code's
/// `count_tokens`), every one answered 200.
async fn check_metrics(proxy: &Proxy, endpoint: &str) {
    let metrics = http()
        .get(format!("{}/metrics", proxy.url()))
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics text");
    let answered: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("rollout_proxy_requests_total{"))
        .filter(|l| {
            !["grant_capacity", "start_session", "end_session"]
                .iter()
                .any(|e| l.contains(&format!("endpoint=\"{e}\"")))
        })
        .collect();
    assert!(
        answered
            .iter()
            .any(|l| l.contains(&format!("endpoint=\"{endpoint}\""))),
        "{metrics}"
    );
    for line in &answered {
        assert!(
            line.contains(&format!("endpoint=\"{endpoint}\"")) || line.contains("endpoint=\"count_tokens\""),
            "only the protocol's endpoints were called: {answered:?}"
        );
        assert!(
            line.contains("status=\"200\""),
            "every request answered 200: {answered:?}"
        );
    }
}

/// A proxy scripted to run `lookup KEY` through the CLI's own shell tool (`tool`, whose arguments `arguments`
/// builds from the command) and then answer; with the session under test and a second, decoy session that the
/// CLI's requests must not reach.
struct Scripted {
    proxy: Proxy,
    task: TaskInstance,
    session: String,
    key: SecretString,
    decoy: SecretString,
}

impl Scripted {
    async fn start(tool: &str, arguments: impl Fn(&str) -> String) -> Self {
        let proxy = Proxy::with_context(CONTEXT).await;
        let task = TaskInstance::from_data_id(TaskFamily::Max, "cli-row-0");
        let command = format!("lookup {}", task.key);
        proxy.script(&format!(
            "<tool_call>\n{{\"name\": \"{tool}\", \"arguments\": {}}}\n</tool_call>",
            arguments(&command)
        ));
        proxy.script(&task.target().to_string());
        let (_, decoy) = proxy.session("decoy").await;
        let (session, key) = proxy.session("agent-cli").await;
        Self {
            proxy,
            task,
            session,
            key,
            decoy,
        }
    }

    /// Checks the graded result and what the proxy saw: two generations (the second carrying the tool's
    /// output back), all answered 200 on `endpoint`, both in the session under test. Answers the first
    /// prompt's length in tokens.
    async fn check(&self, report: RolloutReport, endpoint: &str) -> usize {
        let result = match report.result {
            Ok(r) => r,
            Err(e) => panic!("the rollout failed: {e}"),
        };
        assert_eq!(
            (result.status.clone(), result.score),
            (TaskStatus::Done, Some(1.0)),
            "{:#}",
            result.raw
        );
        assert_eq!(
            result.raw["tool_calls"],
            json!([{"id": "", "name": "lookup", "arguments": {"key": self.task.key}}]),
            "the grader saw the CLI run the tool"
        );
        assert_eq!(result.raw["final_answer"], self.task.target().to_string());
        assert_eq!(result.raw["exit_code"], 0);
        let requests = self.proxy.engine.requests();
        assert_eq!(requests.len(), 2, "a tool call, then the final answer");
        let second = model()
            .tokenizer
            .decode(&requests[1].input_ids, false)
            .expect("decodes");
        assert!(
            second.contains(&self.task.digits_text()),
            "the lookup output came back to the model"
        );
        check_metrics(&self.proxy, endpoint).await;
        assert_eq!(self.proxy.end(&self.key).await, 2);
        assert_eq!(self.proxy.end(&self.decoy).await, 0);
        requests[0].input_ids.len()
    }
}

#[tokio::test]
async fn claude_code_completes_a_graded_lifecycle_through_gateway_and_proxy() {
    let Some(bin) = node_bin() else { return };
    let run = Scripted::start("Bash", |command| {
        json!({"command": command, "description": "Read the digits"}).to_string()
    })
    .await;
    let claude = bin.join("claude").to_string_lossy().into_owned();
    let def = CommandRunnerDef::new(&[
        &claude,
        "-p",
        "{prompt}",
        "--model",
        "{model}",
        "--allowedTools",
        "Bash(lookup:*)",
    ]);

    let (sim, report) = rollout(def, Mode::SessionGateway("anthropic"), &run.proxy, &run.session).await;

    assert_eq!(report.cleanup, Some(true), "the route was released");
    let model_name = report.model_name.clone().expect("a registered model name");
    let prompt = run.check(report, "messages").await;
    assert!(
        prompt > TINY_CONTEXT,
        "Claude Code's prompt ({prompt} tokens) is far longer than a tiny policy's context"
    );
    // Both requests went through the gateway, for the registered name, and the route is gone.
    let counters = sim.counters();
    let gateway = &counters.gateway[&LlmProtocol::Anthropic];
    assert!(gateway.forwarded >= 2, "{gateway:?}");
    assert_eq!(gateway.requests, gateway.forwarded, "{gateway:?}");
    assert_eq!(counters.registrations_by_name.get(&model_name), Some(&1));
    assert_eq!(counters.live_routes, 0, "no route is left registered");
}

/// Codex over the Responses protocol. Arena delivers session headers only through `ANTHROPIC_CUSTOM_HEADERS`,
/// which Codex ignores, so a Codex harness reaches the proxy in `direct` mode with the session key; Codex
/// also ignores `OPENAI_BASE_URL`, so a custom provider on its command line points it at `{base_url}`.
/// Its default read-only sandbox would stop `lookup` from logging the call (the grader would then score 0),
/// and its login shell would reset `PATH` and lose `lookup`: the harness turns both off, as a harness inside
/// Arena's own sandbox would.
#[tokio::test]
async fn codex_completes_a_graded_lifecycle_in_direct_mode() {
    let Some(bin) = node_bin() else { return };
    let run = Scripted::start("exec_command", |command| json!({"cmd": command}).to_string()).await;
    let codex = bin.join("codex").to_string_lossy().into_owned();
    let def = CommandRunnerDef::new(&[
        &codex,
        "exec",
        "--skip-git-repo-check",
        "--sandbox",
        "danger-full-access",
        "-c",
        "allow_login_shell=false",
        "-c",
        "model_providers.arena={name=\"arena\",base_url=\"{base_url}/v1\",env_key=\"OPENAI_API_KEY\",\
         wire_api=\"responses\"}",
        "-c",
        "model_provider=arena",
        "-m",
        "{model}",
        "{prompt}",
    ]);

    let mode = Mode::Direct(run.key.clone());
    let (sim, report) = rollout(def, mode, &run.proxy, &run.session).await;

    assert_eq!(report.cleanup, None, "direct mode registers nothing");
    run.check(report, "responses").await;
    let counters = sim.counters();
    assert!(counters.gateway.is_empty(), "the gateway saw nothing");
    assert_eq!(counters.registrations, 0);
}
