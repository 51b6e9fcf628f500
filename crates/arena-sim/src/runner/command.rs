//! The external-command harness: runs a CLI (Claude Code, Codex, or anything that behaves like one) with the
//! environment Arena gives a harness, and grades what it prints.
//!
//! Each run gets a fresh directory with `home/` (the CLI's `HOME`), `work/` (its working directory) and
//! `bin/lookup`, the task's tool as a shell command on the CLI's `PATH`; every call of it is logged, and the
//! log is what the grader sees as the tool calls. The CLI's final stdout is the final answer.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use stream_config::TaskStatus;

use super::{
    CommandRunnerDef, RunnerFault, custom_headers, grade, graded_raw, injected, merged, outcome, task_of,
};
use crate::harness::{Harness, HarnessContext, HarnessOutcome, HarnessRun, LaunchReply};
use crate::tasks::{LOOKUP, TaskInstance, ToolCall};

/// A harness that runs a configured command line.
#[derive(Clone)]
pub struct CommandHarness {
    inner: Arc<Inner>,
}

struct Inner {
    key: String,
    def: CommandRunnerDef,
    seed: u64,
}

impl CommandHarness {
    pub(crate) fn new(key: &str, def: CommandRunnerDef, seed: u64) -> Self {
        Self {
            inner: Arc::new(Inner {
                key: key.to_string(),
                def,
                seed,
            }),
        }
    }
}

impl Harness for CommandHarness {
    fn start(&self, ctx: HarnessContext) -> HarnessRun {
        let inner = self.inner.clone();
        HarnessRun {
            reply: LaunchReply::default(),
            outcome: Box::pin(async move { inner.run(ctx).await }),
        }
    }
}

/// The environment Arena gives a harness process, before the runner's own `env`: both SDKs pointed at the
/// launch's base URL and key, the model, the launch's `envs` (which may override those), and quiet CLIs.
pub(crate) fn arena_env(ctx: &HarnessContext) -> BTreeMap<String, String> {
    let r = &ctx.request;
    let mut env = BTreeMap::new();
    for (name, value) in [
        ("ANTHROPIC_BASE_URL", r.base_url.as_str()),
        ("ANTHROPIC_API_KEY", r.api_key.as_str()),
        ("ANTHROPIC_MODEL", r.model_name.as_str()),
        ("OPENAI_BASE_URL", r.base_url.as_str()),
        ("OPENAI_API_KEY", r.api_key.as_str()),
        ("MODEL_NAME", r.model_name.as_str()),
        ("BASE_URL", r.base_url.as_str()),
        ("API_KEY", r.api_key.as_str()),
        ("DISABLE_TELEMETRY", "1"),
        ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
    ] {
        env.insert(name.to_string(), value.to_string());
    }
    env.extend(r.envs.clone());
    env
}

impl Inner {
    async fn run(&self, ctx: HarnessContext) -> HarnessOutcome {
        ctx.set_status("AGENT_RUNNING");
        let task = match task_of(&ctx) {
            Ok(t) => t,
            Err(o) => return *o,
        };
        let program = self.def.argv.first().cloned().unwrap_or_default();
        let base = json!({
            "harness": ctx.harness.clone().unwrap_or_else(|| self.key.clone()),
            "command": program,
        });
        let fault = injected(&self.def.faults, self.seed, &ctx.task_id);
        if let Some(f) = fault.filter(|f| f.before_run()) {
            return outcome(f.task_status(), None, merged(base, f.raw()));
        }
        let dir = match Workdir::create(&task) {
            Ok(d) => d,
            Err(e) => {
                let raw = json!({"error": format!("setup: cannot prepare the run directory: {e}")});
                return outcome(TaskStatus::SetupFailed, None, merged(base, raw));
            }
        };
        let mut command = self.command(&ctx, &task, &dir, &program);
        let child = match command.spawn() {
            Ok(c) => c,
            Err(e) => {
                let raw = json!({"error": format!("setup: cannot start {program}: {e}")});
                return outcome(TaskStatus::SetupFailed, None, merged(base, raw));
            }
        };
        let limit = Duration::from_millis(self.def.timeout_ms);
        let result = tokio::time::timeout(limit, child.wait_with_output()).await;
        let calls = dir.lookups();
        let base = merged(base, json!({"tool_calls": calls}));
        let output = match result {
            Err(_) => {
                let raw = json!({"error": format!(
                    "harness: {program} exceeded its time limit of {} ms", self.def.timeout_ms
                )});
                return outcome(TaskStatus::Timeout, None, merged(base, raw));
            }
            Ok(Err(e)) => {
                let raw = json!({"error": format!("harness: waiting for {program} failed: {e}")});
                return outcome(TaskStatus::HarnessFailed, None, merged(base, raw));
            }
            Ok(Ok(output)) => output,
        };
        if let Some(f) = fault.filter(|f| f.after_run) {
            return outcome(f.task_status(), None, merged(base, f.raw()));
        }
        judge(&ctx, &task, &program, base, &output, &calls, fault)
    }

    /// The CLI's command line, with Arena's environment, its own `HOME` and the task's tool on its `PATH`.
    fn command(
        &self,
        ctx: &HarnessContext,
        task: &TaskInstance,
        dir: &Workdir,
        program: &str,
    ) -> tokio::process::Command {
        let prompt = format!("{}{}", task.prompt(), self.def.prompt_suffix);
        let fill = |arg: &str| {
            arg.replace("{prompt}", &prompt)
                .replace("{model}", &ctx.request.model_name)
                .replace("{base_url}", &ctx.request.base_url)
                .replace("{workdir}", &dir.work().to_string_lossy())
        };
        let mut command = tokio::process::Command::new(fill(program));
        command
            .args(self.def.argv.iter().skip(1).map(|a| fill(a)))
            .env_clear()
            .current_dir(dir.work())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        for name in &self.def.inherit_env {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
        command.envs(arena_env(ctx)).envs(&self.def.env);
        let path = match std::env::var_os("PATH").filter(|_| self.def.inherit_env.iter().any(|n| n == "PATH"))
        {
            Some(p) => {
                let mut paths = vec![dir.bin()];
                paths.extend(std::env::split_paths(&p));
                std::env::join_paths(paths).unwrap_or_else(|_| dir.bin().into_os_string())
            }
            None => dir.bin().into_os_string(),
        };
        command.env("PATH", path).env("HOME", dir.home());
        command
    }
}

/// Grades what a finished CLI printed, or says why it failed.
fn judge(
    ctx: &HarnessContext,
    task: &TaskInstance,
    program: &str,
    base: Value,
    output: &std::process::Output,
    calls: &[ToolCall],
    fault: Option<&RunnerFault>,
) -> HarnessOutcome {
    let secrets = secrets(ctx);
    let stdout = redact(&String::from_utf8_lossy(&output.stdout), &secrets);
    let stderr = redact(&String::from_utf8_lossy(&output.stderr), &secrets);
    let streams = json!({
        "exit_code": output.status.code(),
        "stdout_tail": tail(&stdout),
        "stderr_tail": tail(&stderr),
    });
    let base = merged(base, streams);
    if !output.status.success() {
        // Arena's phrasing for an agent CLI that failed; the last line it wrote says why.
        let code = output
            .status
            .code()
            .map_or_else(|| "a signal".to_string(), |c| c.to_string());
        let name = Path::new(program)
            .file_name()
            .map_or_else(|| program.to_string(), |n| n.to_string_lossy().into_owned());
        let last = last_line(&stdout)
            .or_else(|| last_line(&stderr))
            .unwrap_or("no output");
        let raw = json!({"error": format!(
            "harness: harness agent phase exited with code {code}\nharness: agent phase error: {name} \
             reported error: {last}"
        )});
        return outcome(TaskStatus::HarnessFailed, None, merged(base, raw));
    }
    let answer = stdout.trim().to_string();
    if answer.is_empty() {
        let raw = json!({"error": format!("harness: {program} printed no final answer")});
        return outcome(TaskStatus::NoOutput, None, merged(base, raw));
    }
    ctx.set_status("EVALUATING");
    let crash = fault.is_some_and(|f| f.task_status() == TaskStatus::EvalFailed);
    match grade(task, Some(&answer), calls, crash) {
        Ok(g) => outcome(
            TaskStatus::Done,
            Some(g.score),
            merged(base, graded_raw(task, &g, &answer, calls)),
        ),
        Err(e) => outcome(TaskStatus::EvalFailed, None, merged(base, json!({"error": e}))),
    }
}

/// A run's directory, removed when dropped.
struct Workdir {
    root: tempfile::TempDir,
}

impl Workdir {
    fn create(task: &TaskInstance) -> std::io::Result<Self> {
        let root = tempfile::Builder::new().prefix("arena-sim-run-").tempdir()?;
        let this = Self { root };
        for dir in [this.home(), this.work(), this.bin()] {
            std::fs::create_dir(dir)?;
        }
        // The key is a letter and a digit and the digits are digits, so nothing here needs quoting beyond the
        // log path, which is a fresh temporary path without quotes.
        let script = format!(
            "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{log}'\nif [ \"$1\" = '{key}' ]; then\n  echo '{digits}'\n\
             else\n  echo \"no key $1\"\n  exit 1\nfi\n",
            log = this.log().display(),
            key = task.key,
            digits = task.digits_text(),
        );
        let lookup = this.bin().join(LOOKUP);
        std::fs::write(&lookup, script)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&lookup, std::fs::Permissions::from_mode(0o755))?;
        }
        Ok(this)
    }

    fn home(&self) -> std::path::PathBuf {
        self.root.path().join("home")
    }

    fn work(&self) -> std::path::PathBuf {
        self.root.path().join("work")
    }

    fn bin(&self) -> std::path::PathBuf {
        self.root.path().join("bin")
    }

    fn log(&self) -> std::path::PathBuf {
        self.root.path().join("lookup.log")
    }

    /// The `lookup` calls the CLI made, as tool calls (first argument = key).
    fn lookups(&self) -> Vec<ToolCall> {
        std::fs::read_to_string(self.log())
            .unwrap_or_default()
            .lines()
            .map(|line| {
                let key = line.split_whitespace().next().unwrap_or_default();
                ToolCall {
                    id: String::new(),
                    name: LOOKUP.to_string(),
                    arguments: json!({"key": key}),
                }
            })
            .collect()
    }
}

/// The credentials a run was given: its key and the values of credential-like custom headers (the session
/// token), which must not reach `raw` even if the CLI prints them.
fn secrets(ctx: &HarnessContext) -> Vec<String> {
    let mut secrets = vec![ctx.request.api_key.clone()];
    for (name, value) in &ctx.request.envs {
        if name.ends_with("_API_KEY") {
            secrets.push(value.clone());
        }
    }
    let headers = ctx.request.envs.get("ANTHROPIC_CUSTOM_HEADERS");
    for (name, value) in headers.map(|h| custom_headers(h)).unwrap_or_default() {
        let name = name.to_ascii_lowercase();
        if name.contains("token") || name.contains("key") || name == "authorization" {
            secrets.push(value);
        }
    }
    secrets.retain(|s| s.len() >= 4);
    secrets
}

fn redact(text: &str, secrets: &[String]) -> String {
    secrets
        .iter()
        .fold(text.to_string(), |t, s| t.replace(s.as_str(), "<redacted>"))
}

fn tail(text: &str) -> Value {
    const MAX: usize = 2000;
    let start = text.char_indices().rev().nth(MAX).map_or(0, |(i, _)| i);
    json!(&text[start..])
}

fn last_line(text: &str) -> Option<&str> {
    text.lines().map(str::trim).rfind(|l| !l.is_empty())
}
