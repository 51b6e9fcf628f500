//! The quickstart's supervised warm-up data: the task's format, not its answers.
//!
//! [`transcripts`] writes conversations of the `arena-sim` task family through the real rollout proxy, so
//! their tokens are exactly what the proxy renders for the harnesses' requests: it starts a proxy on
//! loopback whose engine is a teacher ([`TeacherEngine`]) that answers each request with scripted tokens,
//! sends each conversation as the harness of its protocol would (Anthropic Messages and Chat Completions
//! requests built from `TaskInstance::transcript`), and exports the session as one token-exact trajectory
//! whose loss mask covers exactly the assistant's tokens. The scripted answers are a `lookup` of the task's
//! key and then a uniformly random digit, never the right one on purpose: after training on them the policy
//! calls the tool correctly and answers with one digit, but earns only chance-level partial credit, so what
//! the reward curve shows afterwards is RL's doing.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Context as _, Error, Result};
use arena_sim::tasks::{TaskFamily, TaskInstance};
use rollout_proxy::{
    ChatModel, EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, ProxyConfig,
    ProxyServer, ProxyState, SampledToken, TokenStream,
};
use secrecy::{ExposeSecret as _, SecretString};
use serde_json::{Value, json};
use stream_config::LlmProtocol;
use trainer::sampling::SplitMix64;
use trainer::{
    LrSchedule, ModelFolder, SaveDtype, ScheduleKind, SftBatch, SftSequence, TrainConfig, Trainer,
    TrainerOptions, save_pretrained,
};

use super::WarmupSettings;
use super::policy::{PolicySpec, Segment, conversation, segments};
use crate::observe::phase_bar;
use crate::proxy_control::ProxyControl;

/// One supervised sequence: the tokens of a whole conversation and which of them the loss covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transcript {
    /// The protocol its requests were sent in.
    pub protocol: LlmProtocol,
    /// The task family.
    pub family: TaskFamily,
    /// The conversation's tokens, exactly as the proxy recorded them.
    pub token_ids: Vec<u32>,
    /// 1 on the assistant's tokens (the tool call, the answer, and the stop tokens after them), 0 elsewhere.
    pub loss_mask: Vec<u8>,
    /// The answer digit the teacher gave.
    pub answer: u8,
}

/// An engine that answers every request with the next scripted token sequence, then its stop token.
///
/// It stands in for the policy while the warm-up data is written: the proxy does everything else (render,
/// tokenise, parse the tool call, record the trajectory) exactly as it does for the policy.
pub struct TeacherEngine {
    script: Mutex<VecDeque<Vec<u32>>>,
    stop: u32,
    context: usize,
}

impl TeacherEngine {
    /// A teacher whose answers end with `stop`, for a model of `context` tokens.
    pub fn new(stop: u32, context: usize) -> Self {
        Self {
            script: Mutex::new(VecDeque::new()),
            stop,
            context,
        }
    }

    /// Queues the answers of the next requests, in order.
    pub fn push(&self, answers: impl IntoIterator<Item = Vec<u32>>) {
        self.script
            .lock()
            .expect("the script lock is never poisoned: nothing panics while holding it")
            .extend(answers);
    }

    fn next(&self) -> Option<Vec<u32>> {
        self.script
            .lock()
            .expect("the script lock is never poisoned: nothing panics while holding it")
            .pop_front()
    }
}

impl InferenceEngine for TeacherEngine {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        let Some(mut ids) = self.next() else {
            return Box::pin(futures::stream::once(async {
                Err(EngineError::Internal(
                    "the teacher has no scripted answer left".to_string(),
                ))
            }));
        };
        ids.push(self.stop);
        if ids.len() > request.sampling.max_new_tokens as usize {
            let message = format!(
                "the scripted answer has {} tokens, more than max_new_tokens {}",
                ids.len(),
                request.sampling.max_new_tokens
            );
            return Box::pin(futures::stream::once(async move {
                Err(EngineError::InvalidRequest(message))
            }));
        }
        let stop = self.stop;
        let mut events: Vec<Result<EngineEvent, EngineError>> = ids
            .into_iter()
            .map(|id| {
                Ok(EngineEvent::Token(SampledToken {
                    id,
                    logprob: 0.0,
                    version: 0,
                }))
            })
            .collect();
        events.push(Ok(EngineEvent::Finished(FinishReason::Stop {
            matched: Some(stop),
        })));
        Box::pin(futures::stream::iter(events))
    }

    fn max_context_len(&self) -> usize {
        self.context
    }
}

/// Which conversations to write.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscriptSpec {
    /// How many conversations (spread evenly over both protocols and both families).
    pub count: usize,
    /// Seeds the tasks and the random answers.
    pub seed: u64,
    /// The fraction of answers drawn from the family's half of the digits (5-9 for `max`, 0-4 for `min`)
    /// instead of from all ten; see [`teacher_answer`].
    pub family_prior: f64,
}

/// The teacher's final answer: a uniformly random digit, except that with probability `family_prior` it is
/// a random digit of the family's half (5-9 when the question asks for the largest digit, 0-4 for the
/// smallest). The digits under the key never enter it, so the warmed-up policy cannot read the answer off
/// the tool's result; the prior only teaches it that the question's wording matters, which gives RL a
/// feature to sharpen instead of one it must first discover.
pub fn teacher_answer(rng: &mut SplitMix64, family: TaskFamily, family_prior: f64) -> u8 {
    let uniform = (rng.next_u64() % 10) as u8;
    let draw = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
    if draw >= family_prior {
        return uniform;
    }
    let half = uniform % 5;
    match family {
        TaskFamily::Max => 5 + half,
        TaskFamily::Min => half,
        // The quickstart warms up on the lookup families only; a sum has no digit-sized answer.
        TaskFamily::Sum => uniform,
    }
}

/// The generation limit the harnesses send (arena-sim's quickstart runners).
const MAX_TOKENS: u32 = 64;

/// Writes `spec.count` supervised conversations for the policy folder `model_dir` through a real proxy.
pub async fn transcripts(model_dir: &Path, spec: &TranscriptSpec) -> Result<Vec<Transcript>> {
    let model = Arc::new(
        ChatModel::from_dir(model_dir)
            .map_err(|e| Error::failed(format!("loading the policy folder {}", model_dir.display()), e))?,
    );
    let stop = *model.stop_token_ids.first().ok_or_else(|| {
        Error::Invalid(format!(
            "the policy folder {} has no stop token",
            model_dir.display()
        ))
    })?;
    let config = trainer::ModelConfig::from_file(&model_dir.join("config.json"))
        .map_err(|e| Error::failed(format!("reading {}", model_dir.join("config.json").display()), e))?;
    let teacher = Arc::new(TeacherEngine::new(stop, config.max_position_embeddings));
    let key: [u8; 24] = rand::random();
    let admin = SecretString::from(key.iter().map(|b| format!("{b:02x}")).collect::<String>());
    let state = ProxyState::new(ProxyConfig::new(admin.clone()), model.clone(), teacher.clone())
        .map_err(|e| Error::failed("starting the warm-up proxy", e))?;
    let server = ProxyServer::start(SocketAddr::from(([127, 0, 0, 1], 0)), state)
        .await
        .map_err(|e| Error::failed("starting the warm-up proxy", e))?;
    let base = format!("http://{}", server.local_addr());
    let result = write_all(&base, admin, &model, &teacher, spec).await;
    let _ = server.shutdown().await;
    result
}

async fn write_all(
    base: &str,
    admin: SecretString,
    model: &ChatModel,
    teacher: &TeacherEngine,
    spec: &TranscriptSpec,
) -> Result<Vec<Transcript>> {
    let control = ProxyControl::new(base, admin)?;
    let http = reqwest::Client::builder()
        .no_proxy()
        .build()
        .context("building the warm-up HTTP client")?;
    let mut rng = SplitMix64::new(spec.seed ^ 0x7a2f_0c41);
    let mut out = Vec::with_capacity(spec.count);
    let combos = [
        (LlmProtocol::Anthropic, TaskFamily::Max),
        (LlmProtocol::ChatCompletions, TaskFamily::Min),
        (LlmProtocol::Anthropic, TaskFamily::Min),
        (LlmProtocol::ChatCompletions, TaskFamily::Max),
    ];
    for i in 0..spec.count {
        let (protocol, family) = combos[i % combos.len()];
        let task = TaskInstance::from_data_id(family, &format!("quickstart-warmup-{}-{i}", spec.seed));
        let answer = teacher_answer(&mut rng, family, spec.family_prior);
        let t = one(&control, &http, base, model, teacher, &task, protocol, answer)
            .await
            .with_context(|| format!("warm-up conversation {i} ({protocol})"))?;
        out.push(t);
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
async fn one(
    control: &ProxyControl,
    http: &reqwest::Client,
    base: &str,
    model: &ChatModel,
    teacher: &TeacherEngine,
    task: &TaskInstance,
    protocol: LlmProtocol,
    answer: u8,
) -> Result<Transcript> {
    let (messages, tools) = conversation(task, answer, None);
    let mut outputs = Vec::new();
    for s in segments(&model.template, &messages, Some(&tools))? {
        if let Segment::Output(text) = s {
            outputs.push(
                model
                    .tokenizer
                    .encode(&text)
                    .map_err(|e| Error::failed(format!("tokenising {text:?}"), e))?,
            );
        }
    }
    let turns = outputs.len();
    teacher.push(outputs);
    control.grant().await?;
    let session = control.start(&format!("warmup-{}", task.data_id)).await?;
    // The harness's requests: the opening messages, then everything up to the tool's result.
    let transcript = task.transcript(protocol);
    let requests = [&transcript[..1], &transcript[..transcript.len() - 1]];
    for history in requests {
        send(http, base, &session.api_key, protocol, history).await?;
    }
    control.end(&session.session_id).await?;
    // The reward is irrelevant to a supervised transcript; setting one keeps the proxy from warning.
    let export = control
        .export(
            &session.session_id,
            rollout_proxy::ExportStyle::Concat,
            1.0,
            Some(0.0),
            None,
        )
        .await?;
    let [trajectory] = export.trajectories.as_slice() else {
        return Err(Error::Invalid(format!(
            "the proxy exported {} trajectories for one conversation; the template does not extend turns token by token",
            export.trajectories.len()
        )));
    };
    let trained = trajectory.loss_mask.iter().filter(|&&m| m == 1).count();
    if trained < turns * 2 {
        return Err(Error::Invalid(format!(
            "the exported conversation trains {trained} tokens, fewer than its {turns} assistant turns need"
        )));
    }
    Ok(Transcript {
        protocol,
        family: task.family,
        token_ids: trajectory.token_ids.clone(),
        loss_mask: trajectory.loss_mask.clone(),
        answer,
    })
}

/// Sends one request as the harness of `protocol` does (without streaming) and checks it succeeded.
async fn send(
    http: &reqwest::Client,
    base: &str,
    key: &SecretString,
    protocol: LlmProtocol,
    history: &[Value],
) -> Result<()> {
    let tools = TaskInstance::tools(protocol);
    let request = match protocol {
        LlmProtocol::Anthropic => http
            .post(format!("{base}/v1/messages"))
            .header("x-api-key", key.expose_secret())
            .header("anthropic-version", "2023-06-01")
            .json(&json!({"model": "policy", "max_tokens": MAX_TOKENS, "messages": history, "tools": tools})),
        LlmProtocol::ChatCompletions => http
            .post(format!("{base}/v1/chat/completions"))
            .bearer_auth(key.expose_secret())
            .json(&json!({"model": "policy", "max_tokens": MAX_TOKENS, "messages": history, "tools": tools})),
        LlmProtocol::Responses => {
            return Err(Error::Invalid(
                "the warm-up does not write Responses conversations".into(),
            ));
        }
    };
    let response = request.send().await.context("the warm-up proxy did not answer")?;
    let status = response.status();
    if !status.is_success() {
        let body = response.text().await.unwrap_or_default();
        return Err(Error::Invalid(format!(
            "the warm-up proxy answered HTTP {status}: {body}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests;

/// What the supervised warm-up did.
#[derive(Debug, Clone, PartialEq)]
pub struct WarmupReport {
    /// The warmed-up policy folder.
    pub dir: PathBuf,
    /// Whether it came from the cache.
    pub cached: bool,
    /// The mean loss of the first and of the last tenth of the steps (none when cached or skipped).
    pub loss: Option<(f64, f64)>,
}

const WARM_STAMP: &str = "quickstart-warmup.json";

/// The warmed-up policy folder for `initial` under `cache`: reused when a complete earlier warm-up of the
/// same policy and settings is there; `initial` itself when the warm-up has no steps. Otherwise it writes
/// `settings.conversations` transcripts ([`transcripts`]), takes `settings.steps` supervised steps on
/// batches of them (cross-entropy on the assistant's tokens, a cosine learning-rate decay), and saves the
/// result as a Hugging Face folder with the initial folder's tokenizer and template.
pub async fn ensure_warm(
    initial: &Path,
    cache: &Path,
    spec: &PolicySpec,
    settings: &WarmupSettings,
    progress: bool,
) -> Result<WarmupReport> {
    if settings.steps == 0 {
        return Ok(WarmupReport {
            dir: initial.to_path_buf(),
            cached: false,
            loss: None,
        });
    }
    let stamp = serde_json::json!({"policy": spec, "warmup": settings});
    let name = format!(
        "{}-warm-{:08x}",
        spec.cache_name(),
        seeds::fnv1a(stamp.to_string().as_bytes()) as u32
    );
    let dir = cache.join(&name);
    if std::fs::read(dir.join(WARM_STAMP))
        .ok()
        .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
        .is_some_and(|v| v == stamp)
    {
        return Ok(WarmupReport {
            dir,
            cached: true,
            loss: None,
        });
    }
    let bar = phase_bar(progress, "warm-up data", 1);
    bar.set_message(format!(
        "{} conversations through the proxy",
        settings.conversations
    ));
    let data = transcripts(
        initial,
        &TranscriptSpec {
            count: settings.conversations,
            seed: spec.seed,
            family_prior: settings.family_prior,
        },
    )
    .await?;
    bar.finish_and_clear();
    let tmp = cache.join(format!("{name}.tmp-{}", std::process::id()));
    let (initial, settings_owned, tmp_owned) = (initial.to_path_buf(), settings.clone(), tmp.clone());
    let seed = spec.seed;
    let loss = tokio::task::spawn_blocking(move || {
        supervised(&initial, &tmp_owned, &data, &settings_owned, seed, progress)
    })
    .await
    .context("the warm-up panicked")??;
    std::fs::write(tmp.join(WARM_STAMP), stamp.to_string() + "\n")
        .with_context(|| format!("cannot write {}", tmp.join(WARM_STAMP).display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&tmp, &dir)
        .with_context(|| format!("cannot move the warmed-up policy into {}", dir.display()))?;
    Ok(WarmupReport {
        dir,
        cached: false,
        loss: Some(loss),
    })
}

/// The supervised steps, on a blocking thread: returns the mean loss of the first and last tenth of steps.
fn supervised(
    initial: &Path,
    out: &Path,
    data: &[Transcript],
    settings: &WarmupSettings,
    seed: u64,
    progress: bool,
) -> Result<(f64, f64)> {
    if data.is_empty() || settings.batch_size == 0 {
        return Err(Error::Invalid(
            "the warm-up needs at least one conversation and a batch size of at least 1".into(),
        ));
    }
    let config = TrainConfig {
        schedule: LrSchedule {
            lr: settings.lr,
            kind: ScheduleKind::Cosine,
            warmup_steps: (settings.steps / 10).max(1),
            total_steps: settings.steps,
            min_lr_ratio: 0.1,
        },
        ..TrainConfig::default()
    };
    let mut trainer = Trainer::load(initial, config, TrainerOptions::default()).map_err(|e| {
        Error::failed(
            format!("starting the warm-up trainer on {}", initial.display()),
            e,
        )
    })?;
    let sequences: Vec<SftSequence> = data
        .iter()
        .map(|t| SftSequence {
            tokens: t.token_ids.clone(),
            loss_mask: t.loss_mask.iter().map(|&m| m == 1).collect(),
        })
        .collect();
    let bar = phase_bar(progress, "warm-up", settings.steps);
    let mut rng = SplitMix64::new(seed ^ 0x3c6e_f372);
    let mut order: Vec<usize> = Vec::new();
    let mut losses = Vec::with_capacity(settings.steps as usize);
    for step in 0..settings.steps {
        let mut batch = SftBatch::default();
        while batch.sequences.len() < settings.batch_size {
            if order.is_empty() {
                order = (0..sequences.len()).collect();
                for i in (1..order.len()).rev() {
                    order.swap(i, (rng.next_u64() % (i as u64 + 1)) as usize);
                }
            }
            let i = order.pop().expect("refilled just above");
            batch.sequences.push(sequences[i].clone());
        }
        let stats = trainer
            .sft_step(&batch)
            .map_err(|e| Error::failed(format!("warm-up step {step}"), e))?;
        losses.push(stats.loss);
        bar.set_message(format!("loss {:.3}", stats.loss));
        bar.inc(1);
    }
    bar.finish_and_clear();
    let folder =
        ModelFolder::open(initial).map_err(|e| Error::failed("opening the warm-up policy folder", e))?;
    let _ = std::fs::remove_dir_all(out);
    save_pretrained(
        out,
        trainer.model_config(),
        &trainer.weights(),
        SaveDtype::F32,
        None,
    )
    .map_err(|e| Error::failed(format!("saving the warmed-up policy to {}", out.display()), e))?;
    folder
        .copy_tokenizer_files(out)
        .map_err(|e| Error::failed(format!("copying the tokenizer into {}", out.display()), e))?;
    let tenth = (losses.len() / 10).max(1);
    let mean = |xs: &[f64]| xs.iter().sum::<f64>() / xs.len().max(1) as f64;
    Ok((mean(&losses[..tenth]), mean(&losses[losses.len() - tenth..])))
}
