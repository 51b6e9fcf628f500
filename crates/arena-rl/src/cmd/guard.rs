//! `arena-rl guard check`: audits commands, or a run's exported trajectories, with the integrity guard's
//! rules (docs/integrity-guard.md).
//!
//! Input on stdin is one command per line, or JSONL of exported trajectories (the proxy's
//! `ExportedTrajectory`) or of records that hold them under `trajectories` (a session's export,
//! `rollouts.jsonl`); it prints one JSON line per input line with its hits and exits 0 whatever it finds. A malformed line gets a JSON line with its `error`
//! and a `line N: ...` message on stderr, and the audit goes on to the end, so one bad line does not hide
//! the rest of a run; the exit status is then 1, so a script knows the audit was partial.

use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use integrity_guard::{Hit, RuleSet, Scanner};
use rollout_proxy::parse::{OutputParser, Parsed};
use rollout_proxy::tokenizer::Tokenizer;
use rollout_proxy::{ExportedTrajectory, ReasoningFormat, ToolCallFormat};
use serde_json::{Value, json};
use stream_config::{Env, load_run_config, load_stream_configs_with_env};

#[derive(clap::Subcommand)]
pub(crate) enum Command {
    /// Scan commands (one per line) or exported trajectories (JSONL) from stdin and print one JSON line per
    /// input line with its hits (rule, category, matched command). Exits 0 whatever it finds; 1 when a line
    /// was malformed (each is reported, and the rest is still audited).
    Check(CheckArgs),
}

/// What stdin holds.
#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum InputKind {
    /// JSONL when the first non-blank line is a JSON object, else commands.
    Auto,
    /// One shell command per line.
    Commands,
    /// One exported trajectory, or a record with `trajectories` (a session export, a `rollouts.jsonl`
    /// line), per line.
    Export,
}

#[derive(clap::Args)]
pub(crate) struct CheckArgs {
    /// A run config: its `guard` rules (and its proxy's tool-call and reasoning parsers) instead of the
    /// built-in rules.
    #[arg(long, value_name = "PATH")]
    config: Option<PathBuf>,
    /// The Stream whose rules to use (`guard.streams.NAME`); without it, the run-wide rules.
    #[arg(long, value_name = "NAME", requires = "config")]
    stream: Option<String>,
    /// The task's base commit: a hash naming it is not evidence (exports: only where the trajectory's
    /// metadata gives none).
    #[arg(long, value_name = "HASH")]
    base_commit: Option<String>,
    /// What stdin holds.
    #[arg(long, value_enum, default_value = "auto")]
    input: InputKind,
    /// Commands: scan the lines as one session, so aliases, variables and scripts defined on one line apply
    /// to the later ones (default: each line alone).
    #[arg(long)]
    session: bool,
    /// Exports: the policy's model folder, whose tokenizer decodes the sampled tokens so they are scanned
    /// again with these rules; without it, the hits the proxy recorded when it generated them are printed.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
}

/// The rules and parsers an audit uses.
struct Audit {
    rules: Arc<RuleSet>,
    base_commit: Option<String>,
    tools: ToolCallFormat,
    reasoning: ReasoningFormat,
    tokenizer: Option<Tokenizer>,
}

pub(crate) fn run(command: Command) -> Result<()> {
    let Command::Check(args) = command;
    let audit = Audit::new(&args)?;
    let stdin = std::io::stdin().lock();
    let mut out = std::io::stdout().lock();
    let malformed = audit.check(stdin, &mut out, args.input, args.session)?;
    out.flush()?;
    if malformed > 0 {
        bail!("{malformed} malformed input line(s); every other line was audited");
    }
    Ok(())
}

impl Audit {
    fn new(args: &CheckArgs) -> Result<Self> {
        let mut audit = Self {
            rules: RuleSet::shared_builtin(),
            base_commit: args.base_commit.clone(),
            tools: ToolCallFormat::Hermes,
            reasoning: ReasoningFormat::Think,
            tokenizer: None,
        };
        if let Some(path) = &args.config {
            let env = Env::from_process();
            let config = load_run_config(path, &[], &env)?;
            if let Some(name) = &args.stream {
                let streams = load_stream_configs_with_env(&config.econfig, &env)?;
                if !streams.iter().any(|s| &s.name == name) {
                    let names: Vec<&str> = streams.iter().map(|s| s.name.as_str()).collect();
                    bail!(
                        "--stream {name:?} is not a Stream of {} (its Streams: {})",
                        path.display(),
                        names.join(", ")
                    );
                }
            }
            audit.rules = Arc::new(config.guard.rule_set(args.stream.as_deref())?);
            let settings = arena_rl::run::settings::proxy_config(&config, secrecy::SecretString::from(""));
            audit.tools = settings.tool_calls;
            audit.reasoning = settings.reasoning;
        }
        if let Some(dir) = &args.model {
            audit.tokenizer = Some(
                Tokenizer::from_model_dir(dir)
                    .with_context(|| format!("--model {}: cannot load its tokenizer", dir.display()))?,
            );
        }
        Ok(audit)
    }

    /// Audits every line of `input` into `out`; returns how many lines were malformed.
    fn check(
        &self,
        input: impl BufRead,
        out: &mut impl Write,
        kind: InputKind,
        session: bool,
    ) -> Result<u64> {
        let mut kind = kind;
        let mut shared = Scanner::new(self.rules.clone(), self.base_commit.as_deref());
        let mut malformed = 0;
        for (i, bytes) in input.split(b'\n').enumerate() {
            let line = i + 1;
            let bytes = bytes.context("cannot read stdin")?;
            let record = match String::from_utf8(bytes) {
                Err(_) => Err("not UTF-8 text".to_string()),
                Ok(text) => {
                    let text = text.strip_suffix('\r').unwrap_or(&text).to_string();
                    if text.trim().is_empty() {
                        continue;
                    }
                    if kind == InputKind::Auto {
                        kind = match serde_json::from_str::<Value>(&text) {
                            Ok(Value::Object(_)) => InputKind::Export,
                            _ => InputKind::Commands,
                        };
                    }
                    match kind {
                        InputKind::Export => self.export_line(&text),
                        _ => {
                            let hits = if session {
                                shared.scan_command(&text)
                            } else {
                                Scanner::new(self.rules.clone(), self.base_commit.as_deref())
                                    .scan_command(&text)
                            };
                            Ok(json!({"command": text, "hits": hits}))
                        }
                    }
                }
            };
            let mut value = match record {
                Ok(value) => value,
                Err(error) => {
                    malformed += 1;
                    eprintln!("line {line}: {error}");
                    json!({"error": error})
                }
            };
            let object = value.as_object_mut().expect("every record is an object");
            object.insert("line".into(), json!(line));
            writeln!(out, "{value}").context("cannot write stdout")?;
        }
        Ok(malformed)
    }

    /// One line of JSONL: an exported trajectory, or a record that holds several (a session's export, a
    /// `rollouts.jsonl` line); their sampled text scanned again as one session (with `--model`), or the
    /// hits the proxy recorded, each once.
    fn export_line(&self, text: &str) -> Result<Value, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
        let (trajectories, id) = if let Some(list) = value.get("trajectories") {
            let trajectories: Vec<ExportedTrajectory> = serde_json::from_value(list.clone())
                .map_err(|e| format!("its trajectories are not exported trajectories: {e}"))?;
            let id: serde_json::Map<String, Value> = ["key", "stream", "data_id", "task_id", "session_id"]
                .into_iter()
                .filter_map(|k| Some((k.to_string(), value.get(k)?.clone())))
                .collect();
            (trajectories, json!({ "record": id }))
        } else {
            let t: ExportedTrajectory = serde_json::from_value(value)
                .map_err(|e| format!("not an exported trajectory (nor a record with `trajectories`): {e}"))?;
            let id = json!({"trajectory": {"session_id": t.session_id, "interaction_id": t.interaction_id}});
            (vec![t], id)
        };
        let mut out = id;
        let Some(tokenizer) = &self.tokenizer else {
            let mut seen = std::collections::HashSet::new();
            let hits: Vec<Value> = trajectories
                .iter()
                .flat_map(|t| &t.integrity_hits)
                .filter(|h| seen.insert((&h.interaction_id, &h.rule, &h.matched)))
                .map(|h| json!({"rule": h.rule, "category": h.category, "matched": h.matched}))
                .collect();
            out["source"] = json!("recorded");
            out["hits"] = json!(hits);
            return Ok(out);
        };
        let base = trajectories
            .iter()
            .find_map(|t| t.metadata.get("base_commit").and_then(Value::as_str))
            .or(self.base_commit.as_deref());
        let mut scanner = Scanner::new(self.rules.clone(), base);
        let mut hits: Vec<Hit> = Vec::new();
        for span in trajectories.iter().flat_map(sampled_spans) {
            let text = tokenizer
                .decode(span, false)
                .map_err(|e| format!("cannot decode its tokens with --model: {e}"))?;
            for hit in self.scan_output(&mut scanner, &text) {
                if !hits.contains(&hit) {
                    hits.push(hit);
                }
            }
        }
        out["source"] = json!("rescanned");
        out["hits"] = json!(hits);
        Ok(out)
    }

    /// Scans one generation's text as the proxy does: its content's command blocks and each tool call.
    fn scan_output(&self, scanner: &mut Scanner, text: &str) -> Vec<Hit> {
        let mut parser = OutputParser::new(self.reasoning, self.tools, None, false);
        let mut parsed = Vec::new();
        parser.push(text, &mut parsed);
        parser.finish(&mut parsed);
        let mut content = String::new();
        let mut calls = Vec::new();
        for piece in parsed {
            match piece {
                Parsed::Content(c) => content.push_str(&c),
                Parsed::ToolCall(call) => calls.push(call),
                Parsed::Reasoning(_) => {}
            }
        }
        let mut hits = scanner.scan_text(&content);
        for call in calls {
            hits.extend(scanner.scan_tool_call(&call.name, &call.arguments));
        }
        hits
    }
}

/// The runs of tokens the policy sampled (a policy version >= 0), each one generation's output; records
/// without versions fall back to the loss mask.
fn sampled_spans(t: &ExportedTrajectory) -> Vec<&[u32]> {
    let sampled = |i: usize| match t.versions.get(i) {
        Some(v) => *v >= 0,
        None => t.loss_mask.get(i).is_some_and(|m| *m == 1),
    };
    let mut spans = Vec::new();
    let mut start = None;
    for i in 0..=t.token_ids.len() {
        match (start, i < t.token_ids.len() && sampled(i)) {
            (None, true) => start = Some(i),
            (Some(s), false) => {
                spans.push(&t.token_ids[s..i]);
                start = None;
            }
            _ => {}
        }
    }
    spans
}
