//! The quickstart's tiny policy, built by the project itself from a seed: no download, no Python.
//!
//! [`build`] renders a synthetic corpus from `arena-sim`'s task family with the quickstart chat template
//! ([`CHAT_TEMPLATE`]), cut exactly where the rollout proxy cuts a conversation into prompt and output
//! tokens ([`segments`]); trains a byte-level BPE tokenizer on it with the `tokenizers` crate (digits are
//! split off before BPE, so each digit is one token of its own); sizes a Llama-family config to that
//! vocabulary; draws seeded weights; and writes a Hugging Face folder (`config.json`, `model.safetensors`,
//! `tokenizer.json`, `tokenizer_config.json`, `chat_template.jinja`, `generation_config.json`) that both
//! `rollout_proxy::ChatModel::from_dir` and `trainer::Policy::load` read. The same [`PolicySpec`] always
//! gives the same bytes, so [`ensure`] caches a folder per spec and a later run reuses it.

use std::path::{Path, PathBuf};

use crate::error::{Context as _, Error, Result};
use arena_sim::tasks::{TaskFamily, TaskInstance, ToolCall, assistant_turn, tool_results};
use rollout_proxy::messages::for_template;
use rollout_proxy::template::{ChatTemplate, RenderOptions};
use seeds::fnv1a;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use stream_config::LlmProtocol;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::PostProcessorWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, TokenizerBuilder, TokenizerImpl};
use trainer::sampling::SplitMix64;
use trainer::{Architecture, ModelConfig, SaveDtype, Weights};

/// The chat template: ChatML turns, one compact system line per tool, Hermes `<tool_call>` calls.
pub const CHAT_TEMPLATE: &str = include_str!("chat_template.jinja");
/// Opens a turn.
pub const IM_START: &str = "<|im_start|>";
/// Ends a turn; the policy's stop token.
pub const IM_END: &str = "<|im_end|>";
/// End of a document (unused by the template, kept so the vocabulary has a conventional padding token).
pub const ENDOFTEXT: &str = "<|endoftext|>";

/// What the tiny policy is built from. Everything is deterministic in these fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicySpec {
    /// Seeds the corpus, hence the tokenizer, and the weights.
    pub seed: u64,
    /// The BPE vocabulary size (special tokens and the 256 byte symbols included).
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Attention heads (key/value heads are the same number).
    pub num_heads: usize,
    /// The context window, in tokens.
    pub context: usize,
    /// Standard deviation of the initial weights.
    pub init_std: f32,
    /// Conversations rendered into the tokenizer's training corpus.
    pub corpus_conversations: usize,
}

impl Default for PolicySpec {
    fn default() -> Self {
        Self {
            seed: 0,
            vocab_size: 512,
            hidden_size: 96,
            intermediate_size: 288,
            num_layers: 3,
            num_heads: 3,
            context: 256,
            init_std: 0.02,
            corpus_conversations: 2000,
        }
    }
}

impl PolicySpec {
    /// Every problem with the spec, at once.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.vocab_size < 300 {
            problems.push(format!(
                "vocab_size {} is too small: the 256 byte symbols and the special tokens alone take 259",
                self.vocab_size
            ));
        }
        for (name, value) in [
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_layers", self.num_layers),
            ("num_heads", self.num_heads),
            ("corpus_conversations", self.corpus_conversations),
        ] {
            if value == 0 {
                problems.push(format!("{name} must be positive"));
            }
        }
        if self.num_heads > 0 && (!self.hidden_size.is_multiple_of(self.num_heads)) {
            problems.push(format!(
                "hidden_size {} is not a multiple of num_heads {}",
                self.hidden_size, self.num_heads
            ));
        } else if self.num_heads > 0 && !(self.hidden_size / self.num_heads).is_multiple_of(2) {
            problems.push("the head width (hidden_size / num_heads) must be even for RoPE".to_string());
        }
        if self.context < 64 {
            problems.push(format!(
                "context {} is too short for one task conversation",
                self.context
            ));
        }
        if !(self.init_std.is_finite() && self.init_std > 0.0) {
            problems.push(format!("init_std {} must be positive", self.init_std));
        }
        problems
    }

    /// The model config for a tokenizer of `vocab_size` ids whose stop token is `eos`.
    pub fn model_config(&self, vocab_size: usize, eos: u32, pad: Option<u32>) -> ModelConfig {
        let mut config = ModelConfig::new(
            Architecture::Llama,
            vocab_size,
            self.hidden_size,
            self.intermediate_size,
            self.num_layers,
            self.num_heads,
            self.num_heads,
        );
        config.max_position_embeddings = self.context;
        config.rms_norm_eps = 1e-5;
        config.tie_word_embeddings = true;
        config.eos_token_ids = vec![eos];
        config.pad_token_id = pad;
        config
    }

    /// A short stable name of the spec, for cache folders: `seed-<seed>-<hash of the rest>`.
    pub fn cache_name(&self) -> String {
        // The task family's shape is part of what a folder was built from (the tokenizer's corpus), so a
        // change of it must not reuse an old folder.
        let text = format!(
            "{}|digits={}",
            serde_json::to_string(self).expect("a spec always serialises"),
            arena_sim::tasks::DIGITS
        );
        format!("seed-{}-{:08x}", self.seed, fnv1a(text.as_bytes()) as u32)
    }
}

/// The quickstart template, compiled as the proxy compiles it.
pub fn chat_template() -> Result<ChatTemplate> {
    ChatTemplate::new(CHAT_TEMPLATE, None, Some(IM_END.to_string()))
        .map_err(|e| Error::failed("the quickstart chat template does not compile", e))
}

/// One stretch of a conversation as the proxy tokenises it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Text the proxy renders and tokenises as prompt: the whole first prompt, then for each later turn
    /// what closes the previous assistant turn and the new messages up to the next generation prompt.
    Prompt(String),
    /// What the model writes in one assistant turn, before its stop token.
    Output(String),
}

/// Cuts a conversation (OpenAI-form messages, as the proxy hands them to the template) into the prompt and
/// output stretches the proxy produces for it: the first request renders the messages before the first
/// assistant turn with the generation prompt; the model writes the turn's text (the stop token ends it);
/// each later request reuses those tokens and appends the rest of the turn's rendering after the stop token
/// plus the new messages with the generation prompt.
pub fn segments(
    template: &ChatTemplate,
    messages: &[Value],
    tools: Option<&[Value]>,
) -> Result<Vec<Segment>> {
    let messages = for_template(messages);
    let render = |upto: usize, generation: bool| {
        template
            .render(
                &messages[..upto],
                RenderOptions {
                    tools,
                    add_generation_prompt: generation,
                    extra: None,
                },
            )
            .map_err(|e| Error::failed("rendering a conversation with the quickstart template", e))
    };
    let turn_end = template
        .assistant_turn_end()
        .ok_or_else(|| Error::Invalid("the quickstart template has no assistant turn end".into()))?;
    let close = turn_end.strip_prefix(IM_END).ok_or_else(|| {
        Error::Invalid(format!(
            "the quickstart template's assistant turns do not end with {IM_END}"
        ))
    })?;
    let mut out = Vec::new();
    let mut done = 0usize;
    let mut pending_close = "";
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let prompt = render(i, true)?;
        let with_turn = render(i + 1, false)?;
        let (Some(new), Some(turn)) = (prompt.get(done..), with_turn.strip_prefix(prompt.as_str())) else {
            return Err(Error::Invalid(
                "the quickstart template does not render earlier turns as a prefix of later ones".into(),
            ));
        };
        let text = turn.strip_suffix(turn_end).ok_or_else(|| {
            Error::Invalid(format!(
                "assistant turn {i} does not end with the template's turn end"
            ))
        })?;
        out.push(Segment::Prompt(format!("{pending_close}{new}")));
        out.push(Segment::Output(text.to_string()));
        done = with_turn.len();
        pending_close = close;
    }
    Ok(out)
}

/// A conversation of the task family in the core's message form, with `answer` as the final answer, plus the
/// tools; `wrong_key` first looks up a key that does not exist (the tool answers an error) and then the
/// right one.
pub fn conversation(task: &TaskInstance, answer: u8, wrong_key: Option<&str>) -> (Vec<Value>, Vec<Value>) {
    let protocol = LlmProtocol::ChatCompletions;
    let mut messages = task.messages(protocol);
    let mut calls: Vec<String> = wrong_key.map(str::to_string).into_iter().collect();
    calls.push(task.key.clone());
    for (n, key) in calls.iter().enumerate() {
        let call = ToolCall {
            id: format!("call_{n}"),
            name: arena_sim::tasks::LOOKUP.to_string(),
            arguments: json!({"key": key}),
        };
        let result = task.tool_result(&call);
        messages.extend(assistant_turn(protocol, "", std::slice::from_ref(&call)));
        messages.extend(tool_results(protocol, &[(call, result)]));
    }
    messages.extend(assistant_turn(protocol, &answer.to_string(), &[]));
    let tools = TaskInstance::tools(protocol)
        .as_array()
        .cloned()
        .unwrap_or_default();
    (messages, tools)
}

/// The tokenizer's training texts: `n` conversations of both families (one in ten with a wrong lookup
/// first), each cut into the stretches the proxy tokenises separately.
pub fn corpus(seed: u64, n: usize) -> Result<Vec<String>> {
    let template = chat_template()?;
    let mut rng = SplitMix64::new(seed ^ 0x5eed_c0de);
    let mut texts = Vec::with_capacity(n * 6);
    for i in 0..n {
        let family = TaskFamily::LOOKUP[i % TaskFamily::LOOKUP.len()];
        let task = TaskInstance::from_data_id(family, &format!("quickstart-corpus-{seed}-{i}"));
        let answer = (rng.next_u64() % 10) as u8;
        let wrong = rng.next_u64().is_multiple_of(10).then(|| {
            let letter = char::from(b'a' + (rng.next_u64() % 26) as u8);
            format!("{letter}{}", rng.next_u64() % 10)
        });
        let (messages, tools) = conversation(&task, answer, wrong.as_deref().filter(|k| *k != task.key));
        for s in segments(&template, &messages, Some(&tools))? {
            match s {
                Segment::Prompt(t) | Segment::Output(t) => texts.push(t),
            }
        }
    }
    Ok(texts)
}

type Bpe = TokenizerImpl<BPE, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// Trains the byte-level BPE tokenizer on `texts` and returns its `tokenizer.json`.
///
/// Before the byte-level mapping, digits are split off one by one and a letter right before a digit is cut
/// out on its own, so identifiers such as the key `q3` are spelled character by character (every digit and
/// such letter is one token, the same wherever it appears: in the prompt, the tool call and the tool's
/// answer); other text merges freely (words are not split), so the task's fixed phrases become few tokens.
pub fn train_tokenizer(texts: &[String], vocab_size: usize) -> Result<String> {
    let specials: Vec<AddedToken> = [ENDOFTEXT, IM_START, IM_END]
        .iter()
        .map(|t| AddedToken::from(*t, true))
        .collect();
    let letter_before_digit = Split::new(
        SplitPattern::Regex(r"\p{L}(?=\p{N})".to_string()),
        SplitDelimiterBehavior::Isolated,
        false,
    )
    .map_err(|e| Error::failed("building the tokenizer's identifier split", e))?;
    let pre_tokenizer = Sequence::new(vec![
        letter_before_digit.into(),
        Digits::new(true).into(),
        ByteLevel::new(false, false, false).into(),
    ]);
    let mut tokenizer: Bpe = TokenizerBuilder::new()
        .with_model(BPE::default())
        .with_normalizer(None)
        .with_pre_tokenizer(Some(pre_tokenizer.into()))
        .with_post_processor(None)
        .with_decoder(Some(ByteLevel::default().into()))
        .build()
        .map_err(|e| Error::failed("building the tokenizer", e))?;
    // Registered before training so that the corpus's special tokens are cut out, not learned as text.
    tokenizer
        .add_special_tokens(specials.clone())
        .map_err(|e| Error::failed("registering the special tokens", e))?;
    let mut trainer = BpeTrainerBuilder::new()
        .vocab_size(vocab_size)
        .min_frequency(2)
        .show_progress(false)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    tokenizer
        .train(&mut trainer, texts.iter())
        .map_err(|e| Error::failed("training the tokenizer", e))?;
    tokenizer
        .to_string(true)
        .map_err(|e| Error::failed("serialising the tokenizer", e))
}

/// What [`build`] made.
#[derive(Debug, Clone)]
pub struct BuiltPolicy {
    /// The Hugging Face folder.
    pub dir: PathBuf,
    /// Its model config.
    pub config: ModelConfig,
    /// Whether it was reused from the cache instead of built.
    pub cached: bool,
}

const STAMP: &str = "quickstart-policy.json";

/// Builds the tiny policy of `spec` into `dir` (created; files in it are overwritten).
pub fn build(spec: &PolicySpec, dir: &Path) -> Result<BuiltPolicy> {
    let problems = spec.problems();
    if !problems.is_empty() {
        return Err(Error::Invalid(format!(
            "the quickstart policy spec is invalid: {}",
            problems.join("; ")
        )));
    }
    let texts = corpus(spec.seed, spec.corpus_conversations)?;
    let tokenizer_json = train_tokenizer(&texts, spec.vocab_size)?;
    let tokenizer = rollout_proxy::tokenizer::Tokenizer::from_bytes(tokenizer_json.as_bytes())
        .map_err(|e| Error::failed("the trained tokenizer does not load", e))?;
    let eos = tokenizer
        .token_to_id(IM_END)
        .ok_or_else(|| Error::Invalid(format!("the trained tokenizer has no {IM_END}")))?;
    let pad = tokenizer.token_to_id(ENDOFTEXT);
    let config = spec.model_config(tokenizer.vocab_size(), eos, pad);
    let problems = config.check();
    if !problems.is_empty() {
        return Err(Error::Invalid(format!(
            "the quickstart model config is invalid: {}",
            problems.join("; ")
        )));
    }
    let weights = Weights::init(&config, spec.init_std, spec.seed);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    trainer::save_pretrained(dir, &config, &weights, SaveDtype::F32, None)
        .map_err(|e| Error::failed(format!("writing the quickstart policy to {}", dir.display()), e))?;
    let write = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))
    };
    write("tokenizer.json", &tokenizer_json)?;
    write("chat_template.jinja", CHAT_TEMPLATE)?;
    let tokenizer_config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": null,
        "eos_token": IM_END,
        "pad_token": ENDOFTEXT,
        "model_max_length": spec.context,
        "clean_up_tokenization_spaces": false,
    });
    write(
        "tokenizer_config.json",
        &(serde_json::to_string_pretty(&tokenizer_config).context("serialising tokenizer_config.json")?
            + "\n"),
    )?;
    write(
        STAMP,
        &(serde_json::to_string_pretty(spec).context("serialising the policy spec")? + "\n"),
    )?;
    Ok(BuiltPolicy {
        dir: dir.to_path_buf(),
        config,
        cached: false,
    })
}

/// The tiny policy of `spec` under `root/<spec's cache name>`: reused when a complete earlier build of the
/// same spec is there, built (into a temporary folder renamed into place) otherwise.
pub fn ensure(spec: &PolicySpec, root: &Path) -> Result<BuiltPolicy> {
    let dir = root.join(spec.cache_name());
    if let Ok(text) = std::fs::read_to_string(dir.join(STAMP))
        && serde_json::from_str::<PolicySpec>(&text).is_ok_and(|s| &s == spec)
    {
        let config = ModelConfig::from_file(&dir.join("config.json")).map_err(|e| {
            Error::Invalid(format!(
                "the cached quickstart policy {} is unreadable: {e}",
                dir.display()
            ))
        })?;
        return Ok(BuiltPolicy {
            dir,
            config,
            cached: true,
        });
    }
    let tmp = root.join(format!("{}.tmp-{}", spec.cache_name(), std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    let built = build(spec, &tmp)?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("cannot move the quickstart policy into {}", dir.display()))?;
    Ok(BuiltPolicy { dir, ..built })
}

#[cfg(test)]
mod tests;

/// A policy small enough for unit tests (a second to build), seeded with `seed`.
#[cfg(test)]
pub(crate) fn small_spec(seed: u64) -> PolicySpec {
    PolicySpec {
        seed,
        vocab_size: 400,
        hidden_size: 32,
        intermediate_size: 64,
        num_layers: 1,
        num_heads: 2,
        context: 128,
        corpus_conversations: 200,
        ..PolicySpec::default()
    }
}
