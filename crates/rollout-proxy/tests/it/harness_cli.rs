//! The real harness CLIs (npm `@anthropic-ai/claude-code` and `@openai/codex`, from `ARENA_RL_NODE_BIN`)
//! against a live proxy, bound to their session as Arena binds them in `session_gateway` mode (the gateway
//! key, plus the session id and token as extra headers). The fake engine is scripted to answer with a tool
//! call and then a final message: each CLI runs the tool, sends its output back, prints the answer and
//! exits 0, every request it sends is answered without a protocol error, and the session exports as one
//! trajectory holding exactly the sampled tokens.

use std::path::PathBuf;
use std::process::{Command, Output};

use secrecy::ExposeSecret;

use crate::common::{Proxy, call, config, engine_config, fixture, model, turn};

const MARKER: &str = "arena-rl-tool-ran";
const ANSWER: &str = "Done: the marker printed.";

/// A proxy with room for the CLIs' long system prompts, and a session bound through the gateway key.
async fn proxy(task: &str) -> (Proxy, String, String, String) {
    let mut engine = engine_config();
    engine.max_context_len = 65_536;
    let p = Proxy::start(config(), engine).await;
    let (session, _) = p.session(task).await;
    let token = p.state.session_token(&session).expose_secret().to_string();
    let gateway = p.state.gateway_key().expose_secret().to_string();
    (p, session, token, gateway)
}

/// Runs `program` in an empty working folder with a fresh `HOME` and only `env` (plus `PATH`).
async fn run(program: &str, args: Vec<String>, env: Vec<(&'static str, String)>) -> Output {
    let bin: PathBuf = fixture("ARENA_RL_NODE_BIN").join(program);
    tokio::task::spawn_blocking(move || {
        let home = tempfile::tempdir().expect("home");
        let work = tempfile::tempdir().expect("working folder");
        Command::new(&bin)
            .args(args)
            .current_dir(work.path())
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", home.path())
            .envs(env)
            .output()
            .unwrap_or_else(|e| panic!("{} runs: {e}", bin.display()))
    })
    .await
    .expect("joins")
}

/// Checks the run: exit 0 with the answer, two generations (the second carrying the tool's output back),
/// every request answered 200, and one token-exact trajectory.
async fn check(p: &Proxy, session: &str, out: &Output, endpoint: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the CLI failed:\n{stdout}\n{stderr}");
    assert!(
        stdout.contains(ANSWER),
        "the CLI printed the answer:\n{stdout}\n{stderr}"
    );
    let requests = p.engine.requests();
    assert_eq!(requests.len(), 2, "a tool call, then the final message");
    let second = model()
        .tokenizer
        .decode(&requests[1].input_ids, false)
        .expect("decodes");
    assert!(second.contains(MARKER), "the tool ran and its output came back");

    let metrics = call(http::Method::GET, &p.url("/metrics"), &[], None).await.text;
    let answered: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("rollout_proxy_requests_total{"))
        .filter(|l| !l.contains("endpoint=\"grant_capacity\"") && !l.contains("endpoint=\"start_session\""))
        .collect();
    assert!(!answered.is_empty());
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

    let r = p
        .admin("/rl/end_session", serde_json::json!({"session_id": session}))
        .await;
    assert_eq!(r.json()["interaction_count"], 2);
    let exported = p.export(session, "concat").await;
    assert_eq!(
        exported.trajectories.len(),
        1,
        "the second turn extended the first"
    );
    let t = &exported.trajectories[0];
    let sampled: Vec<u32> = t
        .token_ids
        .iter()
        .zip(&t.loss_mask)
        .filter(|(_, m)| **m == 1)
        .map(|(id, _)| *id)
        .collect();
    let engine: Vec<u32> = p.engine.outputs().concat().iter().map(|s| s.id).collect();
    assert_eq!(sampled, engine);
}

#[tokio::test]
async fn claude_code_completes_a_tool_run_against_the_proxy() {
    let (p, session, token, gateway) = proxy("claude-code").await;
    p.engine.push_script(turn(&format!(
        "<tool_call>\n{{\"name\": \"Bash\", \"arguments\": {{\"command\": \"echo {MARKER}\", \"description\": \"Print a marker\"}}}}\n</tool_call>"
    )));
    p.engine.push_script(turn(ANSWER));
    let args = [
        "-p",
        "Print the marker with Bash.",
        "--model",
        "smol",
        "--allowedTools",
        "Bash(echo:*)",
    ];
    let env = vec![
        ("ANTHROPIC_BASE_URL", p.url("")),
        ("ANTHROPIC_API_KEY", gateway),
        (
            "ANTHROPIC_CUSTOM_HEADERS",
            format!("x-session-id: {session}\nx-session-token: {token}"),
        ),
        ("DISABLE_TELEMETRY", "1".into()),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1".into()),
    ];
    let out = run("claude", args.map(String::from).to_vec(), env).await;
    check(&p, &session, &out, "messages").await;
}

#[tokio::test]
async fn codex_completes_a_tool_run_against_the_proxy() {
    let (p, session, token, gateway) = proxy("codex").await;
    p.engine.push_script(turn(&format!(
        "<tool_call>\n{{\"name\": \"exec_command\", \"arguments\": {{\"cmd\": \"echo {MARKER}\"}}}}\n</tool_call>"
    )));
    p.engine.push_script(turn(ANSWER));
    // Codex ignores OPENAI_BASE_URL; a custom provider points it at the proxy and adds the session headers.
    let provider = format!(
        "model_providers.arena={{name=\"arena\",base_url=\"{}\",env_key=\"OPENAI_API_KEY\",wire_api=\"responses\",\
         http_headers={{\"x-session-id\"=\"{session}\",\"x-session-token\"=\"{token}\"}}}}",
        p.url("/v1")
    );
    let args = vec![
        "exec".to_string(),
        "--skip-git-repo-check".into(),
        "-c".into(),
        provider,
        "-c".into(),
        "model_provider=arena".into(),
        "-m".into(),
        "smol".into(),
        "Print the marker with a shell command.".into(),
    ];
    let out = run("codex", args, vec![("OPENAI_API_KEY", gateway)]).await;
    check(&p, &session, &out, "responses").await;
}
