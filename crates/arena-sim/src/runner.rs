//! Harnesses that really run a task: one LLM harness per protocol and an external-command harness.
//!
//! A world's `runners` map a harness key to a [`RunnerDef`]. The LLM harnesses ([`RunnerDef::Anthropic`],
//! [`RunnerDef::Responses`], [`RunnerDef::Chat`]) run a multi-turn tool-use loop against the model with
//! exactly what Arena gives a harness (the launch's `base_url`, `api_key`, `model_name` and `envs`), execute
//! the task's tool calls, and grade the final answer; the command harness ([`RunnerDef::Command`]) runs a
//! CLI such as Claude Code or Codex with the environment Arena would give it and grades what it prints.
//!
//! Failures surface as the reference's statuses: an HTTP error from the model is `HARNESS_FAILED` with a
//! `raw.error` string, no final answer is `NO_OUTPUT`, a run past its time limit is `TIMEOUT`, a grader
//! crash is `EVAL_FAILED`, and a row without a task family (or a command that cannot start) is
//! `SETUP_FAILED`. Each runner may also inject failures with a seeded probability ([`RunnerFault`]).

mod command;
mod llm;
mod wire;

use std::collections::BTreeMap;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stream_config::{LlmProtocol, TaskStatus};

use crate::harness::{Envelope, Harness, HarnessContext, HarnessOutcome};
use crate::tasks::{Grade, TaskInstance, ToolCall};
use seeds::fnv1a;

pub use command::CommandHarness;
pub use llm::LlmHarness;

/// How a harness key runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RunnerDef {
    /// A Claude-style harness: Anthropic Messages at `{base}/v1/messages`, streaming.
    Anthropic(LlmRunnerDef),
    /// A Codex-style harness: OpenAI Responses at `{base}/responses`, streaming.
    Responses(LlmRunnerDef),
    /// A Chat Completions harness at `{base}/chat/completions`, not streaming.
    Chat(LlmRunnerDef),
    /// An external CLI (the real Claude Code or Codex) run with the environment Arena gives a harness.
    Command(CommandRunnerDef),
}

/// Settings of an LLM harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LlmRunnerDef {
    /// The most model calls in one run; a run still calling tools after them has no final answer.
    #[serde(default = "default_max_turns")]
    pub max_turns: u32,
    /// The whole run's time limit, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// The generation limit sent with each request (`max_tokens`, Responses' `max_output_tokens`). Without
    /// it the Anthropic harness sends 1024 (the field is required there) and the others send none, leaving
    /// the limit to the model server.
    #[serde(default)]
    pub max_tokens: Option<u32>,
    /// Failures to inject, drawn per task from the world's seed.
    #[serde(default)]
    pub faults: Vec<RunnerFault>,
    /// How long a task waits in Arena's queue (status `PENDING`, no model call) before its harness starts,
    /// in milliseconds; with `route_gc_idle_ms` it makes a route expire unless the client renews it.
    #[serde(default)]
    pub start_delay_ms: u64,
    /// The model calls after which the harness compacts its context, as Claude Code's auto-compaction
    /// does: the next call's conversation opens with a rewritten first message (a summary header), so it
    /// extends no earlier request and the rollout proxy records it as a new root, one more `concat` chain.
    /// The later turns still see the earlier exchange, so the task goes on where it was.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub compact_after_calls: Vec<u32>,
}

impl Default for LlmRunnerDef {
    fn default() -> Self {
        Self {
            max_turns: default_max_turns(),
            timeout_ms: default_timeout_ms(),
            max_tokens: None,
            faults: Vec::new(),
            start_delay_ms: 0,
            compact_after_calls: Vec::new(),
        }
    }
}

/// Settings of the external-command harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandRunnerDef {
    /// The command line, run without a shell. `{prompt}`, `{model}`, `{base_url}` and `{workdir}` in an
    /// argument are replaced by the task prompt, the launch's model name, the LLM base URL and the run's
    /// working directory; keys are never put on the command line (they travel in the environment).
    pub argv: Vec<String>,
    /// Extra environment, applied after what Arena sets (so it can override it).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Variables the command inherits from the sim's own environment.
    #[serde(default = "default_inherit")]
    pub inherit_env: Vec<String>,
    /// The run's time limit, in milliseconds.
    #[serde(default = "default_timeout_ms")]
    pub timeout_ms: u64,
    /// Appended to the task prompt: how a CLI reaches the task's tool (a `lookup` command on its `PATH`).
    #[serde(default = "default_prompt_suffix")]
    pub prompt_suffix: String,
    /// Failures to inject, drawn per task from the world's seed.
    #[serde(default)]
    pub faults: Vec<RunnerFault>,
}

impl CommandRunnerDef {
    /// A command harness running `argv` with the defaults.
    pub fn new(argv: &[&str]) -> Self {
        Self {
            argv: argv.iter().map(|a| a.to_string()).collect(),
            env: BTreeMap::new(),
            inherit_env: default_inherit(),
            timeout_ms: default_timeout_ms(),
            prompt_suffix: default_prompt_suffix(),
            faults: Vec::new(),
        }
    }
}

/// A failure a runner injects: with `probability`, a task ends with `status` (any of Arena's failure
/// statuses, `ERROR` included). `EVAL_FAILED` strikes after the run, as a grader crash; the others before the
/// model is called, unless `after_run` says the harness failed once its dialogue with the model was over.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunnerFault {
    /// The terminal status, e.g. `HARNESS_FAILED` or `EVAL_FAILED`.
    pub status: String,
    /// The chance per task.
    #[serde(default = "one")]
    pub probability: f64,
    /// A GameAgent outcome code the failure reports as AReaL-Harness writes it: `raw.outcome` (schema
    /// `areal.envarena-outcome.v1`) and a `GAMEAGENT_OUTCOME_CODE=<code>` marker in `raw.error`
    /// (`arena-2026.md` 2.8). Written verbatim, so a malformed code can be injected too.
    #[serde(default)]
    pub outcome_code: Option<String>,
    /// Strike after the run's dialogue with the model (so the session has interactions) instead of before
    /// the first model call.
    #[serde(default)]
    pub after_run: bool,
    /// A native RL receipt (version 1, `arena-2026.md` 2.2) the failure's `raw` carries.
    #[serde(default)]
    pub receipt: Option<Receipt>,
}

/// The native RL receipts a runner fault can write into `raw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Receipt {
    /// A healthy run whose one failed run (`main`) failed for want of a public answer: a model failure.
    Healthy,
    /// The same, but the export was not healthy.
    Incomplete,
    /// The same healthy fields under receipt version 2.
    WrongVersion,
    /// The healthy receipt beside a GameAgent outcome code, a format conflict.
    Vetoed,
}

impl Receipt {
    /// The receipt's fields.
    pub fn fields(self) -> Value {
        let mut r = json!({
            "nativeRlReceiptVersion": 1,
            "nativeExecutionHealthy": true,
            "nativeExportHealthy": true,
            "status": "ERROR",
            "trajectoryHealth": "healthy",
            "nativeStopReason": "completed",
            "nativeFailure": null,
            "runTerminals": {"main": "run.failed", "child": "run.completed"},
            "exportedRunCount": 2,
            "runFailures": [{"runId": "main", "error": {"code": "RUNTIME_EXECUTION_FAILED", "details": {
                "runtimeFailure": {"code": "DSH_PUBLIC_ANSWER_MISSING", "reason": "public_answer_missing"}}}}],
        });
        match self {
            Self::Healthy => {}
            Self::Incomplete => r["nativeExportHealthy"] = json!(false),
            Self::WrongVersion => r["nativeRlReceiptVersion"] = json!(2),
            Self::Vetoed => r["outcome_code"] = json!("AGENT_MAX_TURNS_EXCEEDED"),
        }
        r
    }
}

impl RunnerFault {
    /// A fault that always ends a task with `status`, before the model is called.
    pub fn always(status: &str) -> Self {
        Self {
            status: status.to_string(),
            probability: 1.0,
            ..Self::default()
        }
    }

    /// Whether it strikes before the model is called (not after the run, not a grader crash).
    pub(crate) fn before_run(&self) -> bool {
        !self.after_run && TaskStatus::parse(&self.status) != TaskStatus::EvalFailed
    }

    /// The status it ends a task with.
    pub(crate) fn task_status(&self) -> TaskStatus {
        TaskStatus::parse(&self.status)
    }

    /// The `raw` fields of the failure: its error text, and its outcome code in both of the harness's forms.
    pub(crate) fn raw(&self) -> Value {
        let raw = self.outcome_raw();
        match self.receipt {
            Some(receipt) => merged(receipt.fields(), raw),
            None => raw,
        }
    }

    fn outcome_raw(&self) -> Value {
        let status = self.task_status();
        match &self.outcome_code {
            None => json!({"error": format!("harness: injected {status}")}),
            Some(code) => json!({
                "error": format!(
                    "harness: injected {status}\nGAMEAGENT_OUTCOME_CODE={code} GAMEAGENT_OUTCOME_CLASS=model"
                ),
                "outcome": {
                    "schema": "areal.envarena-outcome.v1",
                    "code": code,
                    "class": "model",
                    "source": "arena-sim",
                    "details": {"reason": "injected"},
                },
            }),
        }
    }
}

fn default_max_turns() -> u32 {
    4
}

fn default_timeout_ms() -> u64 {
    120_000
}

fn default_inherit() -> Vec<String> {
    vec!["PATH".to_string()]
}

fn default_prompt_suffix() -> String {
    " Run the shell command `lookup KEY` to read the digits under a key. Answer with the digit only."
        .to_string()
}

fn one() -> f64 {
    1.0
}

impl RunnerDef {
    /// The LLM harness of a protocol with default settings.
    pub fn llm(protocol: LlmProtocol) -> Self {
        let def = LlmRunnerDef::default();
        match protocol {
            LlmProtocol::Anthropic => Self::Anthropic(def),
            LlmProtocol::Responses => Self::Responses(def),
            LlmProtocol::ChatCompletions => Self::Chat(def),
        }
    }

    /// The protocol an LLM harness speaks (`None` for a command).
    pub fn protocol(&self) -> Option<LlmProtocol> {
        match self {
            Self::Anthropic(_) => Some(LlmProtocol::Anthropic),
            Self::Responses(_) => Some(LlmProtocol::Responses),
            Self::Chat(_) => Some(LlmProtocol::ChatCompletions),
            Self::Command(_) => None,
        }
    }

    /// Builds the harness.
    pub(crate) fn build(&self, key: &str, seed: u64, http: reqwest::Client) -> Arc<dyn Harness> {
        match self {
            Self::Anthropic(d) | Self::Responses(d) | Self::Chat(d) => {
                let protocol = self.protocol().unwrap_or(LlmProtocol::ChatCompletions);
                Arc::new(LlmHarness::new(key, protocol, d.clone(), seed, http))
            }
            Self::Command(d) => Arc::new(CommandHarness::new(key, d.clone(), seed)),
        }
    }

    /// Everything wrong with it, each message starting with `at`.
    pub(crate) fn problems(&self, at: &str) -> Vec<String> {
        let (timeout_ms, faults) = match self {
            Self::Anthropic(d) | Self::Responses(d) | Self::Chat(d) => (d.timeout_ms, &d.faults),
            Self::Command(d) => (d.timeout_ms, &d.faults),
        };
        let mut problems = Vec::new();
        if let Self::Anthropic(d) | Self::Responses(d) | Self::Chat(d) = self
            && d.max_turns == 0
        {
            problems.push(format!("{at}.max_turns must be at least 1"));
        }
        if let Self::Command(d) = self
            && d.argv.first().is_none_or(|a| a.trim().is_empty())
        {
            problems.push(format!("{at}.argv must name a command"));
        }
        if timeout_ms == 0 {
            problems.push(format!("{at}.timeout_ms must be positive"));
        }
        for (i, f) in faults.iter().enumerate() {
            if !TaskStatus::parse(&f.status).is_failure() {
                problems.push(format!(
                    "{at}.faults[{i}].status {:?} is not a failure status (CANCELLED, COLLECT_FAILED, ERROR, \
                     EVAL_FAILED, FAILED, HARNESS_FAILED, NO_OUTPUT, SETUP_FAILED, TIMEOUT)",
                    f.status
                ));
            }
            if !(0.0..=1.0).contains(&f.probability) {
                problems.push(format!(
                    "{at}.faults[{i}].probability {} must be within [0, 1]",
                    f.probability
                ));
            }
        }
        problems
    }
}

/// A terminal outcome in the plain envelope.
pub(crate) fn outcome(status: TaskStatus, score: Option<f64>, raw: Value) -> HarnessOutcome {
    HarnessOutcome {
        status: status.as_str().to_string(),
        score,
        raw,
        artifacts_uri: None,
        trace_id: None,
        computed_at: None,
        progress: Vec::new(),
        envelope: Envelope::Plain,
    }
}

/// The task of a launch, or the `SETUP_FAILED` outcome of a row that names no family.
pub(crate) fn task_of(ctx: &HarnessContext) -> Result<TaskInstance, Box<HarnessOutcome>> {
    match ctx.task_family {
        Some(family) => Ok(TaskInstance::from_data_id(family, &ctx.request.data_id)),
        None => Err(Box::new(outcome(
            TaskStatus::SetupFailed,
            None,
            json!({"error": format!(
                "setup: row {} has no task family (give its stream a task_family or the row a domain:max or \
                 domain:min tag)",
                ctx.request.data_id
            )}),
        ))),
    }
}

/// The injected failure for one task, if any: drawn from the world's seed and the task id, so a run
/// replays.
pub(crate) fn injected<'a>(faults: &'a [RunnerFault], seed: u64, task_id: &str) -> Option<&'a RunnerFault> {
    let mut rng = StdRng::seed_from_u64(seed ^ fnv1a(task_id.as_bytes()));
    faults
        .iter()
        .find(|f| f.probability >= 1.0 || (f.probability > 0.0 && rng.random_bool(f.probability)))
}

/// Grades, turning a crashing grader (a panic, or an injected `EVAL_FAILED`) into an error.
pub(crate) fn grade(
    task: &TaskInstance,
    answer: Option<&str>,
    calls: &[ToolCall],
    crash: bool,
) -> Result<Grade, String> {
    if crash {
        return Err("grader: injected crash".to_string());
    }
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| task.grade(answer, calls)))
        .map_err(|_| "grader: the grader panicked".to_string())
}

/// The `raw` payload of a graded run.
pub(crate) fn graded_raw(task: &TaskInstance, g: &Grade, final_answer: &str, calls: &[ToolCall]) -> Value {
    json!({
        "family": task.family,
        "data_id": task.data_id,
        "key": task.key,
        "target": g.target,
        "final_answer": final_answer,
        "answer": g.answer,
        "lookup_ok": g.lookup_ok,
        "tool_calls": calls,
        "score": g.score,
    })
}

/// Headers from `ANTHROPIC_CUSTOM_HEADERS`: one `Name: value` per line; blank or malformed lines are skipped.
pub(crate) fn custom_headers(value: &str) -> Vec<(String, String)> {
    value
        .lines()
        .filter_map(|line| {
            let (name, value) = line.split_once(':')?;
            let (name, value) = (name.trim(), value.trim());
            let valid = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_".contains(&b))
                && !value.is_empty();
            valid.then(|| (name.to_string(), value.to_string()))
        })
        .collect()
}

/// Merges two JSON objects (the second wins); used to add run facts to a payload.
pub(crate) fn merged(mut a: Value, b: Value) -> Value {
    if let (Some(a), Value::Object(b)) = (a.as_object_mut(), b) {
        a.extend(b);
    }
    a
}

#[cfg(test)]
mod tests;
