//! Shared pieces of the loop tests: a model folder with a tool-aware chat template, an engine that answers
//! the sim's tasks like a policy that knows the task format, and a quickstart config pointed at a sim.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use arena_rl::run::EngineHandle;
use futures::future::BoxFuture;
use rollout_proxy::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, SampledToken, TokenStream,
    WeightUpdate, tokenizer::Tokenizer,
};
use stream_config::{Env, RunConfig};

/// The SmolLM2 fixture folder (`ARENA_RL_SMOLLM2`), for its tokenizer.
pub(crate) fn smollm2() -> PathBuf {
    std::env::var_os("ARENA_RL_SMOLLM2").map(PathBuf::from).unwrap_or_else(|| {
        panic!("ARENA_RL_SMOLLM2 is not set: run `cargo xtask test`, or `eval \"$(cargo xtask fixtures)\"` first")
    })
}

/// ChatML with Hermes tool calls and tool responses.
const TEMPLATE: &str = "{% for m in messages %}<|im_start|>{{ m.role }}\n\
{% if m.content %}{{ m.content }}{% endif %}\
{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments if c.function.arguments is string else c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endif %}\
<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

/// A model folder in `dir`: SmolLM2's tokenizer, a tool-aware template, and a `config.json`.
pub(crate) fn model_folder(dir: &Path) -> PathBuf {
    let src = smollm2();
    let out = dir.join("model");
    std::fs::create_dir_all(&out).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        std::fs::copy(src.join(f), out.join(f)).unwrap();
    }
    std::fs::write(out.join("chat_template.jinja"), TEMPLATE).unwrap();
    out
}

/// Answers like a policy that knows the task: first a `lookup` of the key in the prompt, then a digit once the
/// tool has answered. Every `wrong_every`-th answer is off by two, so groups have mixed rewards; or, made by
/// [`OracleEngine::settled`], every answer about a key ending in an even digit is right (those groups' rewards
/// are all equal, and the dynamic filter drops them) and every other answer about any other key is wrong.
pub(crate) struct OracleEngine {
    tokenizer: Tokenizer,
    stop: u32,
    calls: AtomicU64,
    wrong_every: u64,
    version: AtomicU64,
    /// `Some` in [`OracleEngine::settled`] mode: answers so far per key.
    per_key: Option<std::sync::Mutex<std::collections::HashMap<String, u64>>>,
}

impl OracleEngine {
    pub(crate) fn new(model: &Path, wrong_every: u64) -> Self {
        let tokenizer = Tokenizer::from_model_dir(model).unwrap();
        let stop = tokenizer.token_to_id("<|im_end|>").unwrap();
        Self {
            tokenizer,
            stop,
            calls: AtomicU64::new(0),
            wrong_every,
            version: AtomicU64::new(0),
            per_key: None,
        }
    }

    /// Groups of rows whose key ends in an even digit score alike (always right); the others alternate.
    pub(crate) fn settled(model: &Path) -> Self {
        Self {
            per_key: Some(Default::default()),
            ..Self::new(model, 0)
        }
    }

    /// Whether this answer about `key` is wrong.
    fn wrong(&self, key: &str) -> bool {
        let Some(per_key) = &self.per_key else {
            let n = self.calls.fetch_add(1, Ordering::Relaxed);
            return self.wrong_every > 0 && n.is_multiple_of(self.wrong_every);
        };
        let settled = key
            .chars()
            .last()
            .and_then(|c| c.to_digit(10))
            .is_some_and(|d| d % 2 == 0);
        let mut seen = per_key.lock().unwrap();
        let n = seen.entry(key.to_string()).or_default();
        *n += 1;
        !settled && n.is_multiple_of(2)
    }

    pub(crate) fn handle(self) -> EngineHandle {
        EngineHandle {
            engine: Arc::new(self),
            policy: None,
            pool: None,
        }
    }

    fn answer(&self, prompt: &str) -> String {
        // A shell row (arena-sim's `tasks::shell`): follow its script, one `bash` call per turn, then answer.
        if let Some(next) = arena_sim::tasks::shell::next_command(prompt) {
            return match next {
                Some(command) => {
                    let call = serde_json::json!({"name": "bash", "arguments": {"command": command}});
                    format!("<tool_call>{call}</tool_call>")
                }
                None => "done".to_string(),
            };
        }
        let last_user = prompt.rfind("digit under key ").map_or("", |i| &prompt[i..]);
        let key: String = last_user
            .trim_start_matches("digit under key ")
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let tool = prompt.rfind("<|im_start|>tool\n").map(|i| &prompt[i + 17..]);
        match tool {
            None => format!(
                "<tool_call>{{\"name\": \"lookup\", \"arguments\": {{\"key\": \"{key}\"}}}}</tool_call>"
            ),
            Some(rest) => {
                let digits: Vec<u8> = rest
                    .split("<|im_end|>")
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .filter_map(|d| d.parse().ok())
                    .collect();
                let largest = prompt.contains("largest digit");
                let target = if largest {
                    digits.iter().max()
                } else {
                    digits.iter().min()
                }
                .copied()
                .unwrap_or(0);
                let answer = if self.wrong(&key) {
                    (target + 2) % 10
                } else {
                    target
                };
                answer.to_string()
            }
        }
    }
}

impl InferenceEngine for OracleEngine {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        let prompt = self
            .tokenizer
            .decode(&request.input_ids, false)
            .unwrap_or_default();
        let mut ids = self.tokenizer.encode(&self.answer(&prompt)).unwrap();
        ids.push(self.stop);
        ids.truncate(request.sampling.max_new_tokens as usize);
        let version = self.version.load(Ordering::Relaxed) as u32;
        let stopped = ids.last() == Some(&self.stop);
        let mut events: Vec<_> = ids
            .into_iter()
            .map(|id| {
                Ok(EngineEvent::Token(SampledToken {
                    id,
                    logprob: -0.5,
                    version,
                }))
            })
            .collect();
        events.push(Ok(EngineEvent::Finished(if stopped {
            FinishReason::Stop {
                matched: Some(self.stop),
            }
        } else {
            FinishReason::Length
        })));
        Box::pin(futures::stream::iter(events))
    }

    fn max_context_len(&self) -> usize {
        4096
    }

    /// Takes the version of weights published on disk (it answers by rule, so it reads only their config).
    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            if !update.path.join("config.json").is_file() {
                return Err(EngineError::InvalidRequest(format!(
                    "{} is not a model folder",
                    update.path.display()
                )));
            }
            if let Some(v) = update.version {
                self.version.store(u64::from(v), Ordering::Relaxed);
            }
            Ok(())
        })
    }
}

/// The quickstart config against the sim at `base`, writing under `root`, Chat Completions stream only
/// (overrides first, then `extra`).
pub(crate) fn config(base: &str, root: &Path, model: &Path, extra: &[&str]) -> RunConfig {
    let text = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/configs/quickstart.yaml"),
    )
    .unwrap();
    let mut overrides: Vec<String> = vec![
        format!("econfig.arena_base_url={base}"),
        format!("cluster.fileroot={}", root.display()),
        format!("model.path={}", model.display()),
        "metrics.progress=false".to_string(),
        "econfig.arena_streams=[{name: sim-chat, stream_id: sim-chat, harness: chat-sim@1, llm_protocol: chat_completions, expected_reward_ref: {key: sim-grader, version: \"1\"}}]".to_string(),
        "econfig.arena_poll_interval=0.05".to_string(),
        // One round of launches per step, as the reference runs it; tests of dynamic sampling raise it.
        "rollout.max_oversample_factor=1".to_string(),
    ];
    overrides.extend(extra.iter().map(|s| (*s).to_string()));
    stream_config::load_run_config_str("quickstart.yaml", &text, &overrides, &env()).unwrap()
}

/// A run's `metrics.jsonl` in `metrics_dir` as text (for messages), and its training steps' lines (those
/// with `rollout/reward`), parsed.
pub(crate) fn step_metrics(metrics_dir: &Path) -> (String, Vec<serde_json::Value>) {
    let text = std::fs::read_to_string(metrics_dir.join("metrics.jsonl")).unwrap();
    let steps = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("rollout/reward").is_some())
        .collect();
    (text, steps)
}

/// The credentials a run reads.
pub(crate) fn env() -> Env {
    Env::from_pairs([
        ("ARENA_OPENAPI_TOKEN", "sim-token"),
        ("ARENA_LLM_API_KEY", "sim-llm-key"),
    ])
}
