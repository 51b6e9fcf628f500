//! Ready-made worlds: the quickstart's Arena, and the Arena of the SmolLM2 run (`sum` tasks).

use stream_config::LlmProtocol;

use crate::runner::{LlmRunnerDef, RunnerDef};
use crate::tasks::TaskFamily;
use crate::world::{StreamDef, World};

/// The quickstart's stream of Anthropic-protocol tasks (family `max`, harness `claude-sim@1`).
pub const QUICKSTART_MESSAGES_STREAM: &str = "sim-messages";
/// The quickstart's stream of Chat Completions tasks (family `min`, harness `chat-sim@1`).
pub const QUICKSTART_CHAT_STREAM: &str = "sim-chat";
/// The reward ref both quickstart streams score with.
pub const QUICKSTART_REWARD: (&str, &str) = ("sim-grader", "1");
/// Rows per quickstart stream.
pub const QUICKSTART_ROWS: u64 = 300;
/// The SmolLM2 run's stream of `sum` tasks (harness `chat-sim@1`, Chat Completions).
pub const SUMS_STREAM: &str = "sim-sums";
/// Rows of the SmolLM2 run's stream.
pub const SUMS_ROWS: u64 = 2000;
/// The SmolLM2 run's held-out stream: `sum` rows of its own (their `data_id`s differ from [`SUMS_STREAM`]'s),
/// which the run evaluates on and never trains on (`valid_dataset.streams`).
pub const SUMS_EVAL_STREAM: &str = "sim-sums-eval";
/// Rows of the held-out stream.
pub const SUMS_EVAL_ROWS: u64 = 64;

impl World {
    /// The quickstart's Arena: two active streams of [`QUICKSTART_ROWS`] generated rows each,
    /// `sim-messages` (family `max`, rows tagged `domain:max`, default harness `claude-sim@1`, so protocol
    /// inference gives `anthropic`) and `sim-chat` (family `min`, `domain:min`, harness `chat-sim@1`, Chat
    /// Completions), both scored by `sim-grader@1`, with published harness versions and a short healthy task
    /// history so that preflight passes. The harness keys `claude-sim`, `chat-sim` and `codex-sim` (Responses)
    /// run the LLM harnesses with 3 turns, a 64-token generation limit per turn and a 120 s time limit.
    ///
    /// The fields are public: change `llm_api_key`, the runners' limits or the row counts before starting it.
    pub fn quickstart() -> Self {
        let (reward_key, reward_version) = QUICKSTART_REWARD;
        let stream = |id: &str, harness: &str, family: TaskFamily| {
            let mut s = StreamDef::new(id)
                .harness(harness, "1")
                .reward(reward_key, reward_version)
                .family(family)
                .generated(QUICKSTART_ROWS);
            for _ in 0..3 {
                s = s.history("DONE", (harness, "1"), QUICKSTART_REWARD);
            }
            s
        };
        let llm = |protocol: LlmProtocol| {
            let def = LlmRunnerDef {
                max_turns: 3,
                max_tokens: Some(64),
                ..LlmRunnerDef::default()
            };
            match protocol {
                LlmProtocol::Anthropic => RunnerDef::Anthropic(def),
                LlmProtocol::Responses => RunnerDef::Responses(def),
                LlmProtocol::ChatCompletions => RunnerDef::Chat(def),
            }
        };
        let mut world = World::default()
            .stream(stream(QUICKSTART_MESSAGES_STREAM, "claude-sim", TaskFamily::Max))
            .stream(stream(QUICKSTART_CHAT_STREAM, "chat-sim", TaskFamily::Min))
            .harness_version("claude-sim", "1", "PUBLISHED")
            .harness_version("chat-sim", "1", "PUBLISHED")
            .harness_version("codex-sim", "1", "PUBLISHED");
        world
            .runners
            .insert("claude-sim".to_string(), llm(LlmProtocol::Anthropic));
        world
            .runners
            .insert("chat-sim".to_string(), llm(LlmProtocol::ChatCompletions));
        world
            .runners
            .insert("codex-sim".to_string(), llm(LlmProtocol::Responses));
        world
    }

    /// The Arena of the SmolLM2 run (`examples/configs/smollm2.yaml`, docs/smollm2.md): one active stream,
    /// [`SUMS_STREAM`], of [`SUMS_ROWS`] generated `sum` rows (`domain:sum`, "what is 7 + 5?", no tool),
    /// run by the Chat Completions harness `chat-sim@1` in one turn of at most 16 tokens and scored by
    /// `sim-grader@1`, with a published harness version and a healthy history so preflight passes; and
    /// [`SUMS_EVAL_STREAM`], [`SUMS_EVAL_ROWS`] more such rows held out for evaluation.
    pub fn sums() -> Self {
        let (reward_key, reward_version) = QUICKSTART_REWARD;
        let sums = |id: &str, rows: u64| {
            let mut stream = StreamDef::new(id)
                .harness("chat-sim", "1")
                .reward(reward_key, reward_version)
                .family(TaskFamily::Sum)
                .generated(rows);
            for _ in 0..3 {
                stream = stream.history("DONE", ("chat-sim", "1"), QUICKSTART_REWARD);
            }
            stream
        };
        let mut world = World::default()
            .stream(sums(SUMS_STREAM, SUMS_ROWS))
            .stream(sums(SUMS_EVAL_STREAM, SUMS_EVAL_ROWS))
            .harness_version("chat-sim", "1", "PUBLISHED");
        world.runners.insert(
            "chat-sim".to_string(),
            RunnerDef::Chat(LlmRunnerDef {
                max_turns: 1,
                max_tokens: Some(16),
                ..LlmRunnerDef::default()
            }),
        );
        world
    }
}
