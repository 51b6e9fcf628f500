//! The external-command harness with a tiny shell script that behaves like an agent CLI: it reads its
//! prompt, runs the task's `lookup` tool from its `PATH`, and prints its answer (or fails like Claude Code).

use std::collections::BTreeMap;
use std::path::Path;

use arena_client::{LaunchRequest, RunOptions, TaskResult};
use arena_sim::tasks::{TaskFamily, TaskInstance};
use arena_sim::{ArenaSim, CommandRunnerDef, RunnerDef, StreamDef};
use secrecy::SecretString;
use serde_json::json;
use stream_config::TaskStatus;

use crate::support::{LLM_KEY, UPSTREAM_KEY, client, register, world};

/// Like `claude -p PROMPT --model NAME`: finds the key in the prompt, looks it up, records what Arena gave
/// it, and prints the largest digit.
const SOLVER: &str = r#"#!/bin/sh
[ "$1" = "-p" ] || exit 64
key=$(printf '%s' "$2" | sed -n 's/.*under key \([a-z][0-9]\).*/\1/p')
digits=$(lookup "$key") || exit 3
lookup zz >/dev/null 2>&1
{
  echo "model=$4"
  echo "home=$HOME"
  echo "pwd=$(pwd)"
  echo "base=$ANTHROPIC_BASE_URL"
  echo "openai=$OPENAI_BASE_URL"
  echo "key_ok=$([ "$ANTHROPIC_API_KEY" = "$EXPECTED_KEY" ] && echo yes)"
  echo "session=$(printf '%s' "$ANTHROPIC_CUSTOM_HEADERS" | grep -c '^X-Session-')"
  echo "telemetry=$DISABLE_TELEMETRY"
  echo "leak=${CARGO_MANIFEST_DIR:-none}"
} > "$DUMP"
echo "thinking about $ANTHROPIC_API_KEY" >&2
printf '%s\n' $digits | sort -n | tail -n 1
"#;

fn script(dir: &Path, name: &str, body: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, body).expect("script written");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    path.to_string_lossy().into_owned()
}

async fn run(def: CommandRunnerDef) -> (ArenaSim, TaskResult, TaskInstance) {
    let mut world = world().stream(
        StreamDef::new("cli")
            .harness("claude-code", "2")
            .family(TaskFamily::Max)
            .generated(1),
    );
    world
        .runners
        .insert("claude-code".to_string(), RunnerDef::Command(def));
    let sim = ArenaSim::start(world).await.expect("sim starts");
    register(
        &sim,
        "stream-areal-session-cli",
        "http://127.0.0.1:1",
        UPSTREAM_KEY,
        &["anthropic"],
    )
    .await;
    let request = LaunchRequest {
        data_id: "cli-row-0".to_string(),
        model_name: "stream-areal-session-cli".to_string(),
        base_url: sim.gateway_url(),
        api_key: SecretString::from(LLM_KEY),
        envs: BTreeMap::from([(
            "ANTHROPIC_CUSTOM_HEADERS".to_string(),
            "X-Session-Id: 3:0-0\nX-Session-Token: tok-secret-1234".to_string(),
        )]),
        session_id: Some("3:0-0".to_string()),
        harness: None,
    };
    let run = client(&sim)
        .run_task("cli", &request, &RunOptions::default())
        .await;
    let result = match run.result {
        Ok(r) => r,
        Err(e) => e.task_failed().expect("a task failure").result.clone(),
    };
    (
        sim,
        result,
        TaskInstance::from_data_id(TaskFamily::Max, "cli-row-0"),
    )
}

#[tokio::test]
async fn a_cli_gets_arenas_environment_and_its_answer_is_graded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let solver = script(dir.path(), "claude", SOLVER);
    let dump = dir.path().join("dump");
    let mut def = CommandRunnerDef::new(&[&solver, "-p", "{prompt}", "--model", "{model}"]);
    def.env.insert("DUMP".into(), dump.to_string_lossy().into_owned());
    def.env.insert("EXPECTED_KEY".into(), LLM_KEY.into());
    let (sim, result, task) = run(def).await;
    assert_eq!(
        (result.status.clone(), result.score),
        (TaskStatus::Done, Some(1.0)),
        "{}",
        result.raw
    );
    assert_eq!(result.raw["final_answer"], task.target().to_string());
    assert_eq!(
        result.raw["tool_calls"],
        json!([
            {"id": "", "name": "lookup", "arguments": {"key": task.key}},
            {"id": "", "name": "lookup", "arguments": {"key": "zz"}},
        ])
    );
    assert_eq!(result.raw["exit_code"], 0);
    let stderr = result.raw["stderr_tail"].as_str().expect("stderr tail");
    assert_eq!(stderr, "thinking about <redacted>\n", "the key is redacted");
    let dump = std::fs::read_to_string(dump).expect("the CLI wrote its environment");
    let field = |name: &str| {
        dump.lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")))
            .unwrap_or_else(|| panic!("{name} in {dump}"))
            .to_string()
    };
    assert_eq!(field("model"), "stream-areal-session-cli");
    assert_eq!(field("base"), sim.gateway_url());
    assert_eq!(field("openai"), sim.gateway_url());
    assert_eq!(field("key_ok"), "yes");
    assert_eq!(field("session"), "2", "both session header lines");
    assert_eq!(field("telemetry"), "1");
    assert_eq!(field("leak"), "none", "only PATH is inherited");
    let home = field("home");
    assert!(
        home.ends_with("/home") && home.contains("arena-sim-run-"),
        "{home}"
    );
    assert!(field("pwd").ends_with("/work"));
    assert!(!Path::new(&home).exists(), "the run directory is removed");
}

#[tokio::test]
async fn cli_failures_map_to_the_reference_statuses() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cases = [
        (
            60_000,
            "claude",
            "#!/bin/sh\necho 'API Error: 400 prompt is too long'\nexit 1\n",
            TaskStatus::HarnessFailed,
            "harness: harness agent phase exited with code 1\nharness: agent phase error: claude reported \
             error: API Error: 400 prompt is too long",
        ),
        (
            60_000,
            "quiet",
            "#!/bin/sh\nexit 0\n",
            TaskStatus::NoOutput,
            "printed no final answer",
        ),
        (
            300,
            "slow",
            "#!/bin/sh\nexec sleep 30\n",
            TaskStatus::Timeout,
            "exceeded its time limit of 300 ms",
        ),
    ];
    for (timeout_ms, name, body, status, error) in cases {
        let path = script(dir.path(), name, body);
        let mut def = CommandRunnerDef::new(&[&path, "-p", "{prompt}"]);
        def.timeout_ms = timeout_ms;
        let (_sim, result, _) = run(def).await;
        assert_eq!(result.status, status, "{name}: {}", result.raw);
        let text = result.raw["error"].as_str().expect("raw.error");
        assert!(text.contains(error), "{name}: {text:?}");
    }
    let (_sim, result, _) = run(CommandRunnerDef::new(&["/nonexistent/claude"])).await;
    assert_eq!(result.status, TaskStatus::SetupFailed, "{}", result.raw);
}
