//! The protocol-neutral generation core that every wire protocol (Chat Completions here; Messages and
//! Responses on top of the same core) drives:
//!
//! 1. [`prepare`]: find the session's interaction this request extends, build the prompt tokens (the
//!    parent's exact tokens followed by the rendering of only the new messages), check the context window
//!    and admit the generation against the token budget.
//! 2. [`Generation`]: run the engine, detokenise incrementally, cut at stop strings, parse reasoning and tool
//!    calls, and yield protocol-neutral [`GenEvent`]s as tokens arrive.
//! 3. On finish, record the interaction (prompt delta, sampled tokens, logprobs, versions, and the
//!    temperature, top-p and top-k it was sampled at) in the session.
//!
//! A generation that is dropped before it finishes (the client went away) aborts the engine stream and
//! releases its reservation without recording anything.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures::StreamExt;
use serde_json::{Map, Value, json};
use tokio::time::Instant;

use crate::engine::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, SampledToken, SamplingParams, TokenStream,
};
use crate::engine::{check_temperature, check_top_p};
use crate::error::{ApiError, ApiErrorKind};
use crate::integrity::MAX_HITS_PER_INTERACTION;
use crate::messages::{chain, collect_images, for_template, message_key};
use crate::metrics::Metrics;
use crate::parse::{OutputParser, Parsed, StopMatcher, ToolCallFormat};
use crate::sampling::resolve;
use crate::state::ProxyState;
use crate::template::RenderOptions;
use crate::tokenizer::{IncrementalDecoder, StagedPieces};
use crate::trajectory::{Finish, Interaction, TextHash, TextPrint, TokenSampling, encode_versions};

/// A generation request in protocol-neutral form: OpenAI-style messages (already normalised and
/// preprocessed), tools, and sampling settings as the client gave them.
#[derive(Debug, Clone, Default)]
pub struct GenerationInput {
    /// Messages (`role`, `content`, `tool_calls`, `tool_call_id`).
    pub messages: Vec<Value>,
    /// Tool definitions in OpenAI's form.
    pub tools: Option<Vec<Value>>,
    /// Whether to parse tool calls out of the output (`tool_choice: "none"` turns it off).
    pub parse_tools: bool,
    /// Extra chat template variables.
    pub template_kwargs: Option<Map<String, Value>>,
    /// Sampling temperature.
    pub temperature: Option<f32>,
    /// Nucleus mass.
    pub top_p: Option<f32>,
    /// Top-k.
    pub top_k: Option<u32>,
    /// The most tokens to generate.
    pub max_tokens: Option<u32>,
    /// A sampling seed.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Vec<String>,
}

/// A tool call the model made, with the id the client sees.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCallOut {
    /// Position among the output's tool calls.
    pub index: usize,
    /// The call id (`call_...` for OpenAI, protocol-specific otherwise).
    pub id: String,
    /// The function name.
    pub name: String,
    /// The arguments, a JSON text.
    pub arguments: String,
}

/// What a generation yields as it goes.
#[derive(Debug, Clone, PartialEq)]
pub enum GenEvent {
    /// Reasoning text.
    Reasoning(String),
    /// Visible content.
    Content(String),
    /// A complete tool call.
    ToolCall(ToolCallOut),
}

/// Why the output ended, as protocols report it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishKind {
    /// A stop token or stop string.
    Stop,
    /// The token limit.
    Length,
    /// The output ended with tool calls.
    ToolCalls,
}

/// A finished generation.
#[derive(Debug, Clone)]
pub struct Summary {
    /// The interaction id (the completion id the client sees).
    pub id: String,
    /// UNIX seconds at the start.
    pub created: u64,
    /// Why it ended.
    pub finish: FinishKind,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Sampled tokens.
    pub completion_tokens: usize,
    /// All content.
    pub content: String,
    /// All reasoning.
    pub reasoning: String,
    /// All tool calls.
    pub tool_calls: Vec<ToolCallOut>,
    /// The stop string that ended the output, when one did.
    pub stop_sequence: Option<String>,
}

impl Summary {
    /// The assistant message this output stands for, in the core's form (see [`output_message`]).
    pub fn message(&self) -> Value {
        output_message(&self.content, &self.reasoning, &self.tool_calls)
    }
}

/// The assistant message of an output in the core's (OpenAI) form: `content`, `reasoning_content` when
/// there is reasoning, and `tool_calls` with their ids. A later request extends the interaction when it
/// repeats a message with the same [`message_key`] (reasoning and ids do not count).
pub fn output_message(content: &str, reasoning: &str, tool_calls: &[ToolCallOut]) -> Value {
    let mut message = Map::new();
    message.insert("role".into(), Value::String("assistant".into()));
    message.insert("content".into(), Value::String(content.to_string()));
    if !reasoning.is_empty() {
        message.insert("reasoning_content".into(), Value::String(reasoning.to_string()));
    }
    if !tool_calls.is_empty() {
        let calls = tool_calls
            .iter()
            .map(|c| {
                json!({"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}})
            })
            .collect();
        message.insert("tool_calls".into(), Value::Array(calls));
    }
    Value::Object(message)
}

/// One step of a generation: events, and possibly its end.
#[derive(Debug)]
pub struct Step {
    /// Events produced by this step.
    pub events: Vec<GenEvent>,
    /// Set on the last step.
    pub end: Option<Result<Summary, ApiError>>,
}

/// A generation that passed admission, ready to start.
pub struct Prepared {
    state: ProxyState,
    session: Arc<str>,
    id: String,
    created: u64,
    prompt: Arc<[u32]>,
    delta_start: usize,
    parent: Option<u32>,
    input_key: u64,
    sampling: SamplingParams,
    stop: Vec<String>,
    images: Vec<Value>,
    tools: Option<Vec<Value>>,
    parse_tools: bool,
    starts_in_reasoning: bool,
    reserved: u64,
    admitted: bool,
    /// The rendering the prompt was taken from.
    rendering: TextHash,
}

impl Drop for Prepared {
    fn drop(&mut self) {
        if self.admitted {
            self.state
                .store()
                .complete(&self.session, self.reserved, None, Instant::now());
            Metrics::add(&self.state.shared().metrics.aborted_generations, 1);
        }
    }
}

impl Prepared {
    /// The prompt tokens.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The interaction id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// UNIX seconds at the start.
    pub fn created(&self) -> u64 {
        self.created
    }

    /// How the engine will be asked to sample (the request's, session's and run's values resolved).
    pub fn sampling(&self) -> &SamplingParams {
        &self.sampling
    }
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

fn template_error(e: crate::error::Error) -> ApiError {
    match e {
        crate::error::Error::Template(message) => {
            ApiError::invalid(format!("the chat template refused the conversation: {message}"))
                .with_param("messages")
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// Fills fields the request left out from the session's `generation_args` (the run's sampling values come
/// after both, in [`resolve`]).
fn apply_defaults(input: &mut GenerationInput, defaults: &Map<String, Value>) {
    let f32_of = |k: &str| defaults.get(k).and_then(Value::as_f64).map(|v| v as f32);
    let u64_of = |k: &str| defaults.get(k).and_then(Value::as_u64);
    if input.temperature.is_none() {
        input.temperature = f32_of("temperature");
    }
    if input.top_p.is_none() {
        input.top_p = f32_of("top_p");
    }
    if input.top_k.is_none() {
        input.top_k = u64_of("top_k").and_then(|k| u32::try_from(k).ok());
    }
    if input.seed.is_none() {
        input.seed = u64_of("seed");
    }
    if input.max_tokens.is_none() {
        input.max_tokens = ["max_tokens", "max_completion_tokens", "max_new_tokens"]
            .iter()
            .find_map(|k| u64_of(k))
            .and_then(|v| u32::try_from(v).ok());
    }
    if input.stop.is_empty() {
        match defaults.get("stop") {
            Some(Value::String(s)) => input.stop = vec![s.clone()],
            Some(Value::Array(items)) => {
                input.stop = items
                    .iter()
                    .filter_map(Value::as_str)
                    .map(str::to_string)
                    .collect();
            }
            _ => {}
        }
    }
}

/// A request's prompt in its session.
struct Prompt {
    tokens: Vec<u32>,
    /// Where the tokens this request adds begin (after the parent's sequence).
    delta_start: usize,
    parent: Option<u32>,
    input_key: u64,
    images: Vec<Value>,
    starts_in_reasoning: bool,
    /// Pieces new to the tokenizer's memory, remembered only once the prompt fits the context window.
    staged: StagedPieces,
    /// The rendering the tokens were taken from.
    rendering: TextHash,
}

/// How many tokens the prompt of `input` has in `session`, computed exactly as a generation would (the
/// parent's tokens plus the rendering of the new messages), without admitting anything.
pub fn count_prompt_tokens(
    state: &ProxyState,
    session: &Arc<str>,
    mut input: GenerationInput,
) -> Result<usize, ApiError> {
    let prompt = build_prompt(state, session, &mut input, Instant::now())?;
    let tokens = prompt.tokens.len();
    if tokens < state.shared().engine.max_context_len() {
        state.shared().model.tokenizer.remember(prompt.staged);
    }
    Ok(tokens)
}

/// Builds the prompt for `input` in `session` and admits it. `id_prefix` is the protocol's id prefix
/// (`chatcmpl-`, `msg_`, `resp_`).
pub fn prepare(
    state: &ProxyState,
    session: &Arc<str>,
    mut input: GenerationInput,
    id_prefix: &str,
) -> Result<Prepared, ApiError> {
    prepare_keeping_messages(state, session, &mut input, id_prefix)
}

/// [`prepare`], leaving `input.messages` to the caller (its other fields are taken), so a protocol that
/// keeps the messages (the Responses store) need not copy them first.
pub(crate) fn prepare_keeping_messages(
    state: &ProxyState,
    session: &Arc<str>,
    input: &mut GenerationInput,
    id_prefix: &str,
) -> Result<Prepared, ApiError> {
    let shared = state.shared();
    let now = Instant::now();
    let Prompt {
        tokens: prompt,
        delta_start,
        parent: parent_index,
        input_key,
        images,
        starts_in_reasoning,
        staged,
        rendering,
    } = build_prompt(state, session, input, now)?;
    let model = &shared.model;
    let max_ctx = shared.engine.max_context_len();
    if prompt.len() >= max_ctx {
        let message = format!(
            "this model's maximum context length is {max_ctx} tokens, but the prompt has {} tokens",
            prompt.len()
        );
        if let Ok(s) = state.store().get_mut(session) {
            s.context_overflow.get_or_insert_with(|| message.clone());
        }
        return Err(ApiError::new(ApiErrorKind::ContextLengthExceeded, message)
            .with_param("messages")
            .with_context_len(prompt.len(), max_ctx));
    }
    model.tokenizer.remember(staged);
    let remaining = u32::try_from(max_ctx - prompt.len()).unwrap_or(u32::MAX);
    let max_new = match input.max_tokens {
        Some(0) => return Err(ApiError::invalid("max_tokens must be at least 1").with_param("max_tokens")),
        Some(n) => n.min(remaining),
        None => shared
            .config
            .default_max_new_tokens
            .unwrap_or(remaining)
            .min(remaining),
    };
    // These hold the request's values, or the session's `generation_args` where the request named none.
    if let Some(t) = input.temperature {
        check_temperature(t).map_err(|m| ApiError::invalid(m).with_param("temperature"))?;
    }
    if let Some(p) = input.top_p {
        check_top_p(p).map_err(|m| ApiError::invalid(m).with_param("top_p"))?;
    }
    // The request's own values are checked above even when the run overrides them: a harness that sends
    // nonsense hears about it either way.
    let sampling = resolve(
        (input.temperature, input.top_p, input.top_k),
        &shared.config.sampling,
        shared.config.harness_sampling,
    );
    let reserved = (prompt.len() - delta_start) as u64 + u64::from(max_new);
    state.store().admit(session, reserved, now)?;
    let created = unix_now();
    Ok(Prepared {
        state: state.clone(),
        session: session.clone(),
        id: format!("{id_prefix}{}", crate::auth::random_hex(12)),
        created,
        prompt: prompt.into(),
        delta_start,
        parent: parent_index,
        input_key,
        sampling: SamplingParams {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k,
            max_new_tokens: max_new,
            stop_token_ids: model.stop_token_ids.clone(),
            seed: input.seed,
        },
        stop: std::mem::take(&mut input.stop),
        images,
        tools: input.tools.take(),
        parse_tools: input.parse_tools,
        starts_in_reasoning,
        reserved,
        admitted: true,
        rendering,
    })
}

/// Finds the parent, renders and tokenises: the parent's exact tokens followed by the rendering of only
/// the new messages (the whole conversation when there is no parent).
fn build_prompt(
    state: &ProxyState,
    session: &Arc<str>,
    input: &mut GenerationInput,
    now: Instant,
) -> Result<Prompt, ApiError> {
    let shared = state.shared();
    if input.messages.is_empty() {
        return Err(ApiError::invalid("messages must not be empty").with_param("messages"));
    }
    let images = collect_images(&input.messages);
    if !images.is_empty() && !shared.engine.supports_images() {
        return Err(ApiError::invalid(
            "this model accepts text only, but the conversation contains image content",
        )
        .with_param("messages"));
    }
    let mut running = 0u64;
    let chain_keys: Vec<u64> = input
        .messages
        .iter()
        .map(|m| {
            running = chain(running, message_key(m));
            running
        })
        .collect();
    let input_key = running;
    let (defaults, parent) = {
        let mut store = state.store();
        let s = store.active_mut(session, now)?;
        (
            s.generation_defaults.clone(),
            s.trajectory.find_parent(&chain_keys),
        )
    };
    apply_defaults(input, &defaults);

    let model = &shared.model;
    let messages = for_template(&input.messages);
    let options = RenderOptions {
        tools: input.tools.as_deref(),
        add_generation_prompt: true,
        extra: input.template_kwargs.as_ref(),
    };
    let full = model
        .template
        .render(&messages, options)
        .map_err(template_error)?;
    Metrics::add(&shared.metrics.template_renders, 1);
    let mut staged = StagedPieces::default();
    let mut encode = |text: &str| {
        model
            .tokenizer
            .encode_staged(text, &mut staged)
            .map_err(|e| ApiError::internal(format!("tokenizing the prompt failed: {e}")))
    };
    let mut parent_index = None;
    let (prompt, delta_start) = match parent {
        None => (encode(&full)?, 0),
        Some(p) => match p.text.and_then(|t| t.rest_of(&full)) {
            // This rendering begins with exactly the text the parent's sequence ends at (the rendering its
            // prompt came from, then its output as decoded and its stop token): what follows is what this
            // request adds, found without rendering the parent's messages again, and the same tokens the
            // prefix rendering below would add. It does not begin so where the template renders the
            // parent's output otherwise than it was sampled (a tool call rewritten, reasoning dropped).
            Some(rest) => {
                let start = p.tokens.len();
                let mut tokens = p.tokens;
                tokens.extend(encode(rest)?);
                parent_index = Some(p.index);
                (tokens, start)
            }
            None => {
                let prefix = model
                    .template
                    .render(
                        &messages[..p.covered],
                        RenderOptions {
                            add_generation_prompt: false,
                            ..options
                        },
                    )
                    .map_err(template_error)?;
                Metrics::add(&shared.metrics.template_renders, 1);
                if let Some(rest) = full.strip_prefix(prefix.as_str()) {
                    let tail = turn_close(state, &prefix, p.stop_token);
                    let mut added = String::with_capacity(tail.len() + rest.len());
                    added.push_str(tail);
                    added.push_str(rest);
                    let start = p.tokens.len();
                    let mut tokens = p.tokens;
                    tokens.extend(encode(&added)?);
                    parent_index = Some(p.index);
                    (tokens, start)
                } else {
                    Metrics::add(&shared.metrics.prefix_mismatches, 1);
                    tracing::warn!(
                        session = &**session,
                        "the template does not render the earlier turns as a prefix; tokenising the whole conversation"
                    );
                    (encode(&full)?, 0)
                }
            }
        },
    };
    Ok(Prompt {
        tokens: prompt,
        delta_start,
        parent: parent_index,
        input_key,
        images,
        starts_in_reasoning: full.trim_end().ends_with("<think>"),
        staged,
        rendering: TextHash::of(&full),
    })
}

/// What closes the parent's assistant turn after its sampled tokens: the template's turn end, less the
/// stop token the model already sampled (for ChatML, the `\n` after a sampled `<|im_end|>`).
fn turn_close<'a>(state: &'a ProxyState, prefix: &str, stop_token: Option<u32>) -> &'a str {
    let model = &state.shared().model;
    let Some(end) = model.template.assistant_turn_end() else {
        return "";
    };
    if !prefix.ends_with(end) {
        return "";
    }
    match stop_token.and_then(|id| model.tokenizer.decode(&[id], false).ok()) {
        Some(text) if !text.is_empty() && end.starts_with(text.as_str()) => &end[text.len()..],
        _ => end,
    }
}

/// A running generation.
pub struct Generation {
    prepared: Prepared,
    stream: Option<TokenStream>,
    decoder: IncrementalDecoder,
    stop: StopMatcher,
    parser: OutputParser,
    tokens: Vec<SampledToken>,
    content: String,
    reasoning: String,
    tool_calls: Vec<ToolCallOut>,
    tool_id_prefix: &'static str,
    done: bool,
    /// The output's text as decoded, while every token has text (a stop token at the end aside).
    raw: Option<String>,
    /// Output tokens with no text of their own (stop and other special tokens).
    textless: usize,
}

impl Generation {
    /// Starts `prepared` on the engine. Tool calls get ids `tool_id_prefix` + random hex.
    pub fn start(prepared: Prepared, tool_id_prefix: &'static str) -> Self {
        let shared = prepared.state.shared();
        let request = GenerateRequest {
            input_ids: prepared.prompt.clone(),
            sampling: prepared.sampling.clone(),
            images: prepared.images.clone(),
            affinity: Some(prepared.session.clone()),
        };
        let stream = shared.engine.generate(request);
        let format = if prepared.parse_tools {
            shared.config.tool_calls
        } else {
            ToolCallFormat::None
        };
        let parser = OutputParser::new(
            shared.config.reasoning,
            format,
            prepared.tools.as_deref(),
            prepared.starts_in_reasoning,
        );
        let stop = StopMatcher::new(prepared.stop.clone());
        Self {
            prepared,
            stream: Some(stream),
            decoder: IncrementalDecoder::new(),
            stop,
            parser,
            tokens: Vec::new(),
            content: String::new(),
            reasoning: String::new(),
            tool_calls: Vec::new(),
            tool_id_prefix,
            done: false,
            raw: Some(String::new()),
            textless: 0,
        }
    }

    /// The interaction id.
    pub fn id(&self) -> &str {
        &self.prepared.id
    }

    /// UNIX seconds at the start.
    pub fn created(&self) -> u64 {
        self.prepared.created
    }

    /// Prompt tokens.
    pub fn prompt_tokens(&self) -> usize {
        self.prepared.prompt.len()
    }

    /// Waits for the engine's next event and processes it. Cancel-safe: the only await is the engine
    /// stream's `next`, so a caller may race it against a timer. After the step with `end` set, it returns
    /// empty steps.
    pub async fn next(&mut self) -> Step {
        let Some(stream) = self.stream.as_mut() else {
            return Step {
                events: Vec::new(),
                end: None,
            };
        };
        let event = stream.next().await;
        self.handle(event)
    }

    /// Runs to the end, collecting everything.
    pub async fn collect(mut self) -> Result<Summary, ApiError> {
        loop {
            if let Some(end) = self.next().await.end {
                return end;
            }
        }
    }

    fn handle(&mut self, event: Option<Result<EngineEvent, EngineError>>) -> Step {
        let mut events = Vec::new();
        let end = match event {
            Some(Ok(EngineEvent::Token(token))) => match self.on_token(token, &mut events) {
                Ok(false) => None,
                Ok(true) => Some(self.finish(FinishReason::Stop { matched: None }, true, &mut events)),
                Err(e) => Some(Err(self.fail(e))),
            },
            Some(Ok(EngineEvent::Finished(reason))) => Some(self.finish(reason, false, &mut events)),
            Some(Err(e)) => Some(Err(self.fail(ApiError::from_engine(&e)))),
            None => Some(Err(self.fail(ApiError::from_engine(&EngineError::Protocol(
                "the engine ended the stream without finishing".into(),
            ))))),
        };
        if end.is_some() {
            self.stream = None;
            self.done = true;
        }
        Step { events, end }
    }

    /// Answers whether a stop string ended the output.
    fn on_token(&mut self, token: SampledToken, events: &mut Vec<GenEvent>) -> Result<bool, ApiError> {
        self.tokens.push(token);
        let model = &self.prepared.state.shared().model;
        let stop = model.stop_token_ids.contains(&token.id);
        if stop || model.tokenizer.is_special(token.id) {
            self.textless += 1;
        }
        if stop {
            return Ok(false);
        }
        let text = self
            .decoder
            .push(&model.tokenizer, token.id)
            .map_err(|e| ApiError::internal(e.to_string()))?;
        let Some(text) = text else {
            return Ok(false);
        };
        if let Some(raw) = &mut self.raw {
            raw.push_str(&text);
        }
        let (safe, hit) = self.stop.push(&text);
        let mut parsed = Vec::new();
        self.parser.push(&safe, &mut parsed);
        self.emit(parsed, events);
        Ok(hit)
    }

    fn emit(&mut self, parsed: Vec<Parsed>, events: &mut Vec<GenEvent>) {
        for p in parsed {
            match p {
                Parsed::Reasoning(text) => {
                    self.reasoning.push_str(&text);
                    events.push(GenEvent::Reasoning(text));
                }
                Parsed::Content(text) => {
                    self.content.push_str(&text);
                    events.push(GenEvent::Content(text));
                }
                Parsed::ToolCall(call) => {
                    let out = ToolCallOut {
                        index: self.tool_calls.len(),
                        id: format!("{}{}", self.tool_id_prefix, crate::auth::random_hex(12)),
                        name: call.name,
                        arguments: call.arguments,
                    };
                    self.tool_calls.push(out.clone());
                    events.push(GenEvent::ToolCall(out));
                }
            }
        }
    }

    fn fail(&mut self, error: ApiError) -> ApiError {
        let state = self.prepared.state.clone();
        let shared = state.shared();
        self.prepared.admitted = false;
        let mut store = state.store();
        store.complete(
            &self.prepared.session,
            self.prepared.reserved,
            None,
            Instant::now(),
        );
        if let Ok(s) = store.get_mut(&self.prepared.session) {
            if error.kind.status().is_server_error() {
                s.system_error.get_or_insert_with(|| error.message.clone());
            } else if error.kind == ApiErrorKind::ContextLengthExceeded {
                // The engine's own refusal (SGLang counting prompt plus completion) is the same overflow the
                // local check finds, only found later; AReaL #1751 flags it as a system error instead, which
                // would reject a task Arena graded. See docs/failure-dispositions.md.
                s.context_overflow.get_or_insert_with(|| error.message.clone());
            }
        }
        drop(store);
        Metrics::add(&shared.metrics.aborted_generations, 1);
        tracing::warn!(session = &*self.prepared.session, error = %error, "generation failed");
        error
    }

    fn finish(
        &mut self,
        reason: FinishReason,
        stop_string: bool,
        events: &mut Vec<GenEvent>,
    ) -> Result<Summary, ApiError> {
        if let FinishReason::Abort { message } = &reason {
            return Err(self.fail(ApiError::internal(format!(
                "the engine aborted the generation: {message}"
            ))));
        }
        let state = self.prepared.state.clone();
        let model = &state.shared().model;
        let mut parsed = Vec::new();
        if !stop_string {
            let rest = self
                .decoder
                .finish(&model.tokenizer)
                .map_err(|e| ApiError::internal(e.to_string()));
            let rest = match rest {
                Ok(r) => r,
                Err(e) => return Err(self.fail(e)),
            };
            if let Some(raw) = &mut self.raw {
                raw.push_str(&rest);
            }
            let (safe, _) = self.stop.push(&rest);
            self.parser.push(&safe, &mut parsed);
            let held = self.stop.finish();
            self.parser.push(&held, &mut parsed);
        }
        self.parser.finish(&mut parsed);
        self.emit(parsed, events);
        let finish = match reason {
            FinishReason::Length => FinishKind::Length,
            _ if !self.tool_calls.is_empty() => FinishKind::ToolCalls,
            _ => FinishKind::Stop,
        };
        let stop_token = match reason {
            FinishReason::Stop { matched: Some(id) } if self.tokens.last().map(|t| t.id) == Some(id) => {
                Some(id)
            }
            FinishReason::Stop { matched: None } if !stop_string => self
                .tokens
                .last()
                .map(|t| t.id)
                .filter(|id| model.stop_token_ids.contains(id)),
            _ => None,
        };
        // The sequence's text is known when every output token has text, or all but the stop token that
        // ends it; an output cut at a stop string stands for more than the client is shown.
        let text = match self.raw.take() {
            Some(mut raw) if !stop_string && self.textless == usize::from(stop_token.is_some()) => {
                match stop_token.map(|id| model.tokenizer.decode(&[id], false)) {
                    Some(Ok(end)) => {
                        raw.push_str(&end);
                        Some(raw)
                    }
                    Some(Err(_)) => None,
                    None => Some(raw),
                }
            }
            _ => None,
        }
        .map(|raw| TextPrint {
            prompt: self.prepared.rendering,
            output: TextHash::of(&raw),
        });
        let output_message = output_message(&self.content, "", &self.tool_calls);
        let p = &self.prepared;
        let guard = p
            .state
            .store()
            .get_mut(&p.session)
            .ok()
            .and_then(|s| s.guard.clone());
        let mut integrity_hits = guard.map_or_else(Vec::new, |g| {
            g.scan(
                &self.content,
                self.tool_calls
                    .iter()
                    .map(|c| (c.name.as_str(), c.arguments.as_str())),
            )
        });
        if !integrity_hits.is_empty() {
            let rules: Vec<&str> = integrity_hits.iter().map(|h| h.rule.as_str()).collect();
            tracing::info!(session = &*p.session, interaction = %p.id, rules = ?rules, "integrity rules hit");
        }
        integrity_hits.truncate(MAX_HITS_PER_INTERACTION);
        let hit_rules: Vec<String> = integrity_hits.iter().map(|h| h.rule.clone()).collect();
        let interaction = Interaction {
            id: p.id.clone().into_boxed_str(),
            parent: p.parent,
            prompt_delta: p.prompt[p.delta_start..].into(),
            output: self.tokens.iter().map(|t| t.id).collect(),
            logprobs: self.tokens.iter().map(|t| t.logprob).collect(),
            versions: encode_versions(self.tokens.iter().map(|t| t.version)),
            sampling: TokenSampling::of(&p.sampling),
            input_key: p.input_key,
            chain_key: chain(p.input_key, message_key(&output_message)),
            stop_token,
            finish: match finish {
                FinishKind::Stop => Finish::Stop,
                FinishKind::Length => Finish::Length,
                FinishKind::ToolCalls => Finish::ToolCalls,
            },
            reward: None,
            integrity_hits: integrity_hits.into_boxed_slice(),
            text,
        };
        let state = p.state.clone();
        let shared = state.shared();
        let recorded = state
            .store()
            .complete(&p.session, p.reserved, Some(interaction), Instant::now());
        self.prepared.admitted = false;
        if recorded {
            Metrics::add(&shared.metrics.generations, 1);
            for rule in hit_rules {
                shared.metrics.integrity_hit(rule);
            }
        }
        Metrics::add(&shared.metrics.prompt_tokens, self.prepared.prompt.len() as u64);
        Metrics::add(&shared.metrics.completion_tokens, self.tokens.len() as u64);
        Ok(Summary {
            id: self.prepared.id.clone(),
            created: self.prepared.created,
            finish,
            prompt_tokens: self.prepared.prompt.len(),
            completion_tokens: self.tokens.len(),
            content: std::mem::take(&mut self.content),
            reasoning: std::mem::take(&mut self.reasoning),
            tool_calls: std::mem::take(&mut self.tool_calls),
            stop_sequence: self.stop.matched().map(str::to_string),
        })
    }
}
