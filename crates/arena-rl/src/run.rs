//! A run from its config: setup (paths, journal and leftover cleanup, Arena client, streams and rows, the
//! proxy and its engine, routing), then the training loop ([`train`]) or the rollout-only mode
//! ([`rollout_only`]).
//!
//! Setup failures are one line each: a bad config, an unreachable Arena, every stream unhealthy, the proxy
//! port taken, a checkpoint from another model. The journal is opened (and a killed run's routes and tasks
//! cleaned) before anything can fail later, and nothing journaled is ever deleted.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow, bail};
use arena_client::{ArenaClient, ClientConfig, RegistryOptions, RetryPolicy, RouteRegistry};
use reward_routing::{
    AuditConfig, AuditWriter, DynamicFilter, GroupSettings, RewardConfig, Scope, TransformRegistry,
};
use rollout_proxy::{
    ChatModel, FakeEngine, FakeEngineConfig, InferenceEngine, ProxyConfig, ProxyServer, ProxyState,
    ReasoningFormat, SessionLimits, SglangConfig, SglangEngine, ToolCallFormat, WeightUpdate,
};
use secrecy::SecretString;
use stream_config::{Env, ModelEngine, RouteMode, RunConfig};
use tokio::sync::{Semaphore, watch};

use crate::engine::PolicyEngine;
use crate::journal::{Entry, Journal, JournalState, RolloutRecord, SampleKey, Verdict};
use crate::observe::{MetricsSink, StepMetrics, phase_bar};
use crate::pool::EnginePool;
use crate::proxy_ctl::ProxyControl;
use crate::resolve::{PromptRow, ResolvedStream, load_rows, resolve_streams, seed_of, step_batch};
use crate::train::{NewWeights, TrainStep, build_batch};
use crate::workflow::{GroupFate, GroupRun, Routing, Workflow};

/// Where a run writes.
#[derive(Debug, Clone)]
pub struct RunPaths {
    /// `<cluster.fileroot>/<experiment_name>/<trial_name>`.
    pub run_dir: PathBuf,
    /// The journal file of this worker.
    pub journal: PathBuf,
    /// Checkpoints.
    pub checkpoints: PathBuf,
    /// Metric files.
    pub metrics: PathBuf,
}

impl RunPaths {
    /// The paths of `config` (empty directories in the config mean the defaults under the run directory).
    pub fn of(config: &RunConfig) -> Self {
        let run_dir = Path::new(&config.cluster.fileroot)
            .join(&config.experiment_name)
            .join(&config.trial_name);
        let pick = |dir: &str, default: &str| {
            if dir.is_empty() {
                run_dir.join(default)
            } else {
                PathBuf::from(dir)
            }
        };
        let journal_dir = pick(&config.rollout.journal_dir, "journal");
        Self {
            journal: journal_dir.join(format!("journal-w{}.jsonl", config.rollout.worker_index)),
            checkpoints: pick(&config.checkpoint.dir, "checkpoints"),
            metrics: pick(&config.metrics.dir, "metrics"),
            run_dir,
        }
    }
}

/// The engine that serves rollouts, and how new weights reach it.
#[derive(Clone)]
pub struct EngineHandle {
    /// What the proxy generates with.
    pub engine: Arc<dyn InferenceEngine>,
    /// The in-process policy, when there is one (in-memory weight swaps).
    pub policy: Option<PolicyEngine>,
}

impl EngineHandle {
    /// Installs `weights` as `version`.
    pub async fn publish(&self, weights: NewWeights, version: u64) -> Result<()> {
        match weights {
            NewWeights::Unchanged => Ok(()),
            NewWeights::InMemory(w) => {
                let Some(policy) = &self.policy else {
                    bail!(
                        "the training step returned weights in memory, but the policy runs on policy servers; \
                         it must save them to disk"
                    );
                };
                policy
                    .swap(w, version)
                    .await
                    .map(|_| ())
                    .map_err(|e| anyhow!("{e}"))
            }
            NewWeights::OnDisk(path) => self
                .engine
                .update_weights_from_disk(WeightUpdate {
                    path: path.clone(),
                    version: u32::try_from(version).ok(),
                })
                .await
                .map_err(|e| anyhow!("cannot load the new weights from {}: {e}", path.display())),
        }
    }
}

/// What a caller may plug into a run: the engine (tests use a fake) and the training step.
pub struct Plugins {
    /// Overrides the engine the config would build (`model.engine`, `rollout.policy_servers`).
    pub engine: Option<EngineHandle>,
    /// The training step (ignored by the rollout-only mode).
    pub step: Box<dyn TrainStep>,
}

/// A run set up and ready to roll out.
pub struct Run {
    /// The config.
    pub config: RunConfig,
    /// The paths.
    pub paths: RunPaths,
    /// The workflow.
    pub workflow: Arc<Workflow>,
    /// The engine.
    pub engine: EngineHandle,
    /// The worker's prompt rows, mixed.
    pub rows: Vec<PromptRow>,
    /// What the journal held at start.
    pub replay: JournalState,
    /// The proxy server.
    pub proxy: ProxyServer,
    /// Advantages and group settings.
    pub reward: RewardConfig,
    /// Leftovers cleaned at start: `(routes deleted, tasks cancelled)`.
    pub cleaned: (usize, usize),
}

fn model_dir(config: &RunConfig) -> Result<PathBuf> {
    if config.model.path.trim().is_empty() {
        bail!(
            "model.path is required (a Hugging Face folder with tokenizer.json and a chat template; MODEL_PATH also sets it)"
        );
    }
    let dir = PathBuf::from(&config.model.path);
    if !dir.is_dir() {
        bail!("model.path {} is not a directory", dir.display());
    }
    Ok(dir)
}

/// A fingerprint of the model folder's architecture (`config.json`), stored in checkpoints.
pub fn model_fingerprint(dir: &Path) -> String {
    let text = std::fs::read(dir.join("config.json")).unwrap_or_default();
    format!("{:016x}", seed_of(&String::from_utf8_lossy(&text)))
}

async fn build_engine(config: &RunConfig, model: &ChatModel, dir: &Path) -> Result<EngineHandle> {
    if !config.rollout.policy_servers.is_empty() {
        let mut engines: Vec<Arc<dyn InferenceEngine>> = Vec::new();
        for url in &config.rollout.policy_servers {
            let engine = SglangEngine::connect(SglangConfig::new(url.clone()))
                .await
                .map_err(|e| anyhow!("cannot reach the policy server {url} (rollout.policy_servers): {e}"))?;
            engines.push(Arc::new(engine));
        }
        return Ok(EngineHandle {
            engine: Arc::new(EnginePool::new(engines)),
            policy: None,
        });
    }
    match config.model.engine {
        ModelEngine::Fake => {
            let vocab_end = u32::try_from(model.tokenizer.vocab_size())
                .unwrap_or(u32::MAX)
                .min(32_000);
            Ok(EngineHandle {
                engine: Arc::new(FakeEngine::new(FakeEngineConfig {
                    vocab: 100.min(vocab_end.saturating_sub(1))..vocab_end,
                    eos_token: model.stop_token_ids.first().copied(),
                    record: false,
                    ..FakeEngineConfig::default()
                })),
                policy: None,
            })
        }
        ModelEngine::Burn => {
            let dir = dir.to_path_buf();
            let max_batch = config.model.max_batch as usize;
            let policy = tokio::task::spawn_blocking(move || PolicyEngine::load(&dir, max_batch))
                .await
                .context("loading the policy")??;
            Ok(EngineHandle {
                engine: Arc::new(policy.clone()),
                policy: Some(policy),
            })
        }
    }
}

fn admin_key(config: &RunConfig, env: &Env) -> SecretString {
    match env.get(&config.proxy.admin_key_env) {
        Some(k) if !k.is_empty() => SecretString::from(k.to_string()),
        _ => {
            let bytes: [u8; 24] = rand::random();
            SecretString::from(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
        }
    }
}

/// Sets a run up: paths, journal, leftovers, Arena, streams and rows, proxy, engine, routing.
pub async fn setup(config: RunConfig, env: &Env, engine: Option<EngineHandle>) -> Result<Run> {
    let paths = RunPaths::of(&config);
    let dir = model_dir(&config)?;
    let (journal, replay) = Journal::open(&paths.journal)?;
    if replay.torn_lines > 0 {
        tracing::warn!(journal = %paths.journal.display(), "cut a torn last journal line (the process was killed mid-write)");
    }

    let token = env
        .get("ARENA_OPENAPI_TOKEN")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| anyhow!("ARENA_OPENAPI_TOKEN is required (the Arena OpenAPI token)"))?;
    let base = &config.econfig.arena_base_url;
    if base.trim().is_empty() {
        bail!("econfig.arena_base_url is required (ARENA_OPENAPI_BASE also sets it)");
    }
    let mut client_config = ClientConfig::new(base, SecretString::from(token.to_string()))?;
    client_config.timeout = config.econfig.arena_request_timeout.duration();
    client_config.poll_interval = config.econfig.arena_poll_interval.duration();
    client_config.retry = RetryPolicy {
        retries: config.econfig.arena_request_retries,
        ..RetryPolicy::default()
    };
    if let Some(url) = env.get("ARENA_LLM_BASE_URL").filter(|u| !u.trim().is_empty()) {
        client_config.llm_base_url = Some(arena_client::validate_llm_base_url(url)?);
    }
    let client = ArenaClient::new(client_config)?;
    let registration_timeout = config.econfig.arena_registration_timeout.duration();

    let cleaned = Workflow::clean_leftovers(
        &client,
        &journal,
        &replay.open_routes,
        &replay.open_tasks,
        registration_timeout,
    )
    .await
    .with_context(|| {
        format!(
            "cleaning up after the previous run of {}",
            paths.run_dir.display()
        )
    })?;
    if cleaned != (0, 0) {
        tracing::info!(
            routes = cleaned.0,
            tasks = cleaned.1,
            "cleaned up routes and tasks a killed run left behind"
        );
    }

    let stream_configs = stream_config::load_stream_configs_with_env(&config.econfig, env)?;
    let transforms = TransformRegistry::with_builtins();
    let mut healthy: Vec<ResolvedStream> = Vec::new();
    let mut unhealthy: Vec<String> = Vec::new();
    for s in &stream_configs {
        match resolve_streams(&client, std::slice::from_ref(s), &transforms).await {
            Ok(resolved) => healthy.extend(resolved),
            Err(e) if is_unhealthy(&e) => {
                tracing::warn!(stream = %s.name, error = %format!("{e:#}"), "stream skipped");
                unhealthy.push(format!("{} ({})", s.name, root_message(&e)));
            }
            Err(e) => return Err(unreachable_or(e, base)),
        }
    }
    if healthy.is_empty() {
        bail!("every stream is unhealthy: {}", unhealthy.join("; "));
    }
    let batch_size = config.train_dataset.batch_size as usize;
    let rows = load_rows(
        &client,
        &healthy,
        config.econfig.arena_mixture_epoch_size,
        batch_size,
        (
            config.rollout.worker_index as usize,
            config.rollout.n_workers as usize,
        ),
    )
    .await?;
    if rows.len() < batch_size {
        bail!(
            "the streams hold {} rows for this worker, fewer than train_dataset.batch_size {batch_size}",
            rows.len()
        );
    }

    let model = Arc::new(
        ChatModel::from_dir(&dir).with_context(|| format!("loading the model folder {}", dir.display()))?,
    );
    let engine = match engine {
        Some(e) => e,
        None => build_engine(&config, &model, &dir).await?,
    };
    let admin = admin_key(&config, env);
    let mut proxy_config = ProxyConfig::new(admin.clone());
    proxy_config.tool_calls = match config.proxy.tool_call_parser {
        stream_config::ToolCallParser::Hermes => ToolCallFormat::Hermes,
        stream_config::ToolCallParser::Qwen3Coder => ToolCallFormat::Qwen3Coder,
        stream_config::ToolCallParser::None => ToolCallFormat::None,
    };
    proxy_config.reasoning = match config.proxy.reasoning_parser {
        stream_config::ReasoningParser::Think => ReasoningFormat::Think,
        stream_config::ReasoningParser::None => ReasoningFormat::None,
    };
    proxy_config.preprocessors = config.proxy.preprocessors.clone();
    proxy_config.limits = SessionLimits {
        max_sessions: config.proxy.max_sessions as usize,
        session_timeout: config.proxy.session_timeout_seconds.duration(),
        ..SessionLimits::default()
    };
    proxy_config.export_wait_timeout = config.proxy.export_wait_timeout_seconds.duration();
    proxy_config.default_max_new_tokens = Some(config.gconfig.max_new_tokens);
    let state = ProxyState::new(proxy_config, model, engine.engine.clone())?;
    let host: std::net::IpAddr = config
        .proxy
        .host
        .parse()
        .map_err(|_| anyhow!("proxy.host {:?} is not an IP address", config.proxy.host))?;
    let addr = SocketAddr::new(host, config.proxy.port);
    let proxy = ProxyServer::start(addr, state.clone()).await.map_err(|e| {
        anyhow!(
            "cannot start the rollout proxy on {addr} (proxy.host, proxy.port): {e}; is the port taken by another process?"
        )
    })?;
    let bound = proxy.local_addr();
    let public_url = if config.proxy.public_url.is_empty() {
        let host = if bound.ip().is_unspecified() {
            crate::observe::hostname()
        } else {
            bound.ip().to_string()
        };
        format!("http://{host}:{}", bound.port())
    } else {
        config.proxy.public_url.trim_end_matches('/').to_string()
    };
    // The control client reaches the proxy on loopback unless it is bound to one specific other address.
    let control_base = if bound.ip().is_unspecified() || bound.ip().is_loopback() {
        format!("http://127.0.0.1:{}", bound.port())
    } else {
        format!("http://{bound}")
    };
    let control = ProxyControl::new(&control_base, admin)?;

    let mode = config.econfig.arena_llm_route_mode;
    let needs_llm_key = mode != RouteMode::Direct;
    let llm_api_key = if needs_llm_key {
        Some(arena_client::llm_api_key(env)?)
    } else {
        None
    };
    let routing = match (mode, llm_api_key) {
        (RouteMode::Direct, _) | (_, None) => Routing::Direct,
        (RouteMode::Gateway, Some(key)) => Routing::Gateway {
            llm_api_key: key,
            inbound_protos: config.econfig.arena_inbound_protos.clone(),
            registration_timeout,
        },
        (RouteMode::SessionGateway, Some(key)) => {
            let mut options = RegistryOptions::new(config.econfig.arena_registration_probe_interval.get())?;
            options.registration_timeout = registration_timeout;
            options.persistent = true;
            options.inbound_protos = config.econfig.arena_inbound_protos.clone();
            // The name is journaled before the POST that creates it, so a killed run's successor deletes it
            // even when the registration landed and its answer was never read.
            let route_journal = journal.clone();
            options.before_register = Some(Arc::new(move |name: &str| {
                route_journal
                    .append(&Entry::Route {
                        name: name.to_string(),
                    })
                    .map_err(|e| format!("{e:#}"))
            }));
            Routing::SessionGateway {
                registry: RouteRegistry::new(client.clone(), options),
                llm_api_key: key,
                gateway_key: state.gateway_key(),
            }
        }
    };
    let audit = if config.econfig.arena_result_dump_dir.trim().is_empty() {
        None
    } else {
        let mut audit_config = AuditConfig::new(&config.econfig.arena_result_dump_dir);
        audit_config.max_raw_bytes = config.econfig.arena_result_dump_max_bytes;
        Some(AuditWriter::shared(audit_config)?)
    };
    let reward = reward_config(&config);
    reward.validate()?;
    let n_samples = config.gconfig.n_samples;
    let concurrency = config
        .rollout
        .max_concurrent_rollouts
        .map_or(batch_size * n_samples as usize, |c| c as usize)
        .max(1);
    let token_state = state.clone();
    let workflow = Arc::new(Workflow {
        client,
        routing,
        proxy: control,
        proxy_public_url: public_url,
        session_token: Arc::new(move |id: &str| token_state.session_token(id)),
        streams: healthy,
        journal,
        audit,
        limiter: Arc::new(Semaphore::new(concurrency)),
        episode_timeout: config.econfig.timeout.duration(),
        idempotent_launch: config.econfig.arena_idempotent_launch,
        run_id: format!("{}-{}", config.experiment_name, config.trial_name),
        export_style: match config.proxy.export_style {
            stream_config::ExportStyle::Concat => rollout_proxy::ExportStyle::Concat,
            stream_config::ExportStyle::Individual => rollout_proxy::ExportStyle::Individual,
        },
        turn_discount: config.proxy.turn_discount,
        n_samples,
        policy_version: Arc::new(AtomicU64::new(0)),
        group_settings: GroupSettings {
            drop_incomplete_group: config.gconfig.drop_incomplete_group,
            reward_normalization: config.gconfig.reward_normalization,
        },
    });
    Ok(Run {
        config,
        paths,
        workflow,
        engine,
        rows,
        replay,
        proxy,
        reward,
        cleaned,
    })
}

/// Arena refused the stream (not ACTIVE, an incomplete reward ref): the stream is unhealthy, not the run.
fn is_unhealthy(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<arena_client::Error>(),
            Some(arena_client::Error::Rejected(_))
        )
    })
}

fn root_message(e: &anyhow::Error) -> String {
    e.root_cause().to_string()
}

fn unreachable_or(e: anyhow::Error, base: &str) -> anyhow::Error {
    let text = format!("{e:#}");
    if text.contains("connect") || text.contains("request failed after") {
        anyhow!("cannot reach Arena at {base}: {text}")
    } else {
        e
    }
}

/// reward-routing's settings from the config.
pub fn reward_config(config: &RunConfig) -> RewardConfig {
    let norm = |n: &stream_config::NormConfig| reward_routing::NormConfig {
        mean_level: n.mean_level.map(level),
        mean_leave1out: n.mean_leave1out,
        std_level: n.std_level.map(level),
        std_unbiased: n.std_unbiased,
        eps: n.eps,
        group_size: n.group_size as usize,
    };
    RewardConfig {
        drop_incomplete_group: config.gconfig.drop_incomplete_group,
        reward_normalization: config.gconfig.reward_normalization,
        reward_bias: config.actor.reward_bias,
        reward_scaling: config.actor.reward_scaling,
        reward_clip: config.actor.reward_clip,
        reward_norm: config.actor.reward_norm.as_ref().map(norm),
    }
}

fn level(l: stream_config::NormLevel) -> reward_routing::NormLevel {
    match l {
        stream_config::NormLevel::Batch => reward_routing::NormLevel::Batch,
        stream_config::NormLevel::Group => reward_routing::NormLevel::Group,
    }
}

/// One step's collected groups.
pub struct Collected {
    /// The step.
    pub step: u64,
    /// Its groups.
    pub groups: Vec<GroupRun>,
    /// Wall time of the rollouts.
    pub seconds: f64,
}

impl Run {
    /// Total training steps: `actor.total_train_steps`, else one pass over the rows.
    pub fn total_steps(&self) -> u64 {
        let batch = self.config.train_dataset.batch_size.max(1);
        self.config
            .actor
            .total_train_steps
            .unwrap_or((self.rows.len() as u64 / batch).max(1))
    }

    /// Runs every group of step `step` (samples already journaled are reused).
    pub async fn collect(
        &self,
        step: u64,
        scope: Scope,
        done: &BTreeMap<SampleKey, RolloutRecord>,
    ) -> Collected {
        let started = Instant::now();
        let (rows, batch) = match scope {
            Scope::EvalRollout => {
                let b = self
                    .config
                    .valid_dataset
                    .as_ref()
                    .map_or(1, |d| d.batch_size as usize);
                (step_batch(&self.rows, b, 0, false, 0), b)
            }
            Scope::Rollout => {
                let b = self.config.train_dataset.batch_size as usize;
                let seed = seed_of(&format!(
                    "{}/{}",
                    self.config.experiment_name, self.config.trial_name
                ));
                (
                    step_batch(&self.rows, b, step, self.config.train_dataset.shuffle, seed),
                    b,
                )
            }
        };
        let bar = phase_bar(
            self.config.metrics.progress,
            if scope == Scope::EvalRollout {
                "eval"
            } else {
                "rollouts"
            },
            (batch * self.workflow.n_samples as usize) as u64,
        );
        bar.set_message(format!("step {step}"));
        let futures = rows.iter().enumerate().map(|(g, row)| {
            let wf = self.workflow.clone();
            let bar = bar.clone();
            async move {
                let run = wf.run_group(step, g as u32, row, scope, done).await;
                bar.inc(run.records.len() as u64);
                run
            }
        });
        let groups = futures::future::join_all(futures).await;
        bar.finish_and_clear();
        Collected {
            step,
            groups,
            seconds: started.elapsed().as_secs_f64(),
        }
    }
}

/// What a finished run reports.
#[derive(Debug, Clone)]
pub struct RunSummary {
    /// The run directory.
    pub run_dir: PathBuf,
    /// Steps trained by this process.
    pub steps_trained: u64,
    /// Steps the run resumed at.
    pub resumed_at: u64,
    /// The metrics directory.
    pub metrics_dir: PathBuf,
    /// The reward curve, if drawn.
    pub reward_curve: Option<PathBuf>,
    /// The newest checkpoint, if any.
    pub checkpoint: Option<PathBuf>,
    /// `(step, rollout/reward)` of every step.
    pub rewards: Vec<(u64, f64)>,
    /// Rejected groups by reason, over the whole run.
    pub rejected_groups: BTreeMap<String, u64>,
    /// Accepted groups over the whole run.
    pub accepted_groups: u64,
    /// Routes and tasks cleaned at start.
    pub cleaned: (usize, usize),
}

/// The loop's own state in a checkpoint: the caller blob of the trainer's checkpoint (JSON in
/// `caller_state.bin`; the directory layout, atomic publication and pruning are `trainer::Checkpoints`').
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CheckpointMeta {
    /// Training steps done.
    pub steps: u64,
    /// The policy version of its weights.
    pub version: u64,
    /// The model folder it belongs to.
    pub model_path: String,
    /// [`model_fingerprint`] of that folder.
    pub model_fingerprint: String,
    /// The data cursor: the next step whose rows the run rolls out (rows are a function of the step).
    pub data_cursor: u64,
    /// Bytes of this worker's journal when the checkpoint was written; a resumed run refuses a journal that
    /// is now shorter (truncated or replaced), since the rollouts the checkpoint trained on would be lost.
    pub journal_bytes: u64,
}

/// The newest complete checkpoint under `dir` and the loop's state in it.
pub fn latest_checkpoint(dir: &Path) -> Result<Option<(PathBuf, CheckpointMeta)>> {
    let Some(ckpt) = trainer::Checkpoints::new(dir).latest()? else {
        return Ok(None);
    };
    let blob = ckpt.caller_state()?;
    let meta: CheckpointMeta = serde_json::from_slice(&blob).with_context(|| {
        format!(
            "checkpoint {} holds no loop state this version reads",
            ckpt.dir.display()
        )
    })?;
    Ok(Some((ckpt.dir, meta)))
}

/// Writes the checkpoint of `meta.steps` under `dir`: the step's own state, then the loop's state as the
/// caller blob, published atomically, keeping the newest `keep_last`.
fn save_checkpoint(
    dir: &Path,
    meta: &CheckpointMeta,
    step: &mut dyn TrainStep,
    keep_last: usize,
) -> Result<PathBuf> {
    let staged = trainer::Checkpoints::new(dir).begin(meta.steps)?;
    step.save(staged.dir())?;
    let blob = serde_json::to_vec_pretty(meta).context("serialising the loop state")?;
    let ckpt = staged.commit(&blob, keep_last)?;
    Ok(ckpt.dir)
}

fn count_groups(
    run: &Run,
    collected: &Collected,
    scope: Scope,
    filter: &DynamicFilter,
    metrics: &mut StepMetrics,
    rejected: &mut BTreeMap<String, u64>,
) -> Vec<(reward_routing::Group, usize)> {
    let mut accepted = Vec::new();
    let prefix = scope.as_str();
    let mut rewards = Vec::new();
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    for (i, g) in collected.groups.iter().enumerate() {
        metrics.extend(g.metrics.iter());
        for r in &g.records {
            if let Verdict::Reward { reward } = r.verdict {
                rewards.push(reward);
            }
        }
        let (fate, m) = run.workflow.judge(g, filter, scope);
        metrics.extend(m.iter());
        match fate {
            GroupFate::Accepted(group) => accepted.push((group, i)),
            GroupFate::Rejected { reason } => {
                *reasons.entry(reason.clone()).or_default() += 1;
                *rejected.entry(reason).or_default() += 1;
            }
        }
    }
    for (reason, n) in reasons {
        metrics.set(&format!("{prefix}/group_rejected/{reason}"), n as f64);
    }
    let n = collected.groups.len().max(1) as f64;
    metrics.set(&format!("{prefix}/groups_accepted"), accepted.len() as f64);
    metrics.set(
        &format!("{prefix}/groups_rejected"),
        (collected.groups.len() - accepted.len()) as f64,
    );
    metrics.set(&format!("{prefix}/group_accept_rate"), accepted.len() as f64 / n);
    if !rewards.is_empty() {
        metrics.set(
            &format!("{prefix}/reward"),
            rewards.iter().sum::<f64>() / rewards.len() as f64,
        );
    }
    accepted
}

/// The training loop. Rollouts of step `k` start once the policy has reached version
/// `k - rollout.max_head_offpolicyness`; step `k` trains on them once they are all journaled; the new weights
/// reach the engine and the version advances; every `eval_every` steps the policy is evaluated.
pub async fn train(config: RunConfig, env: &Env, plugins: Plugins) -> Result<RunSummary> {
    let Plugins { engine, mut step } = plugins;
    let run = Arc::new(setup(config, env, engine).await?);
    let result = train_inner(&run, &mut step).await;
    finish(&run).await;
    result
}

async fn finish(run: &Run) {
    let failed = run.workflow.close().await;
    if !failed.is_empty() {
        tracing::warn!(routes = ?failed, "some LLM routes could not be deleted at shutdown");
    }
}

async fn train_inner(run: &Arc<Run>, step_impl: &mut Box<dyn TrainStep>) -> Result<RunSummary> {
    let config = &run.config;
    let paths = &run.paths;
    std::fs::create_dir_all(&paths.run_dir)?;
    std::fs::write(paths.run_dir.join("config.yaml"), config.to_redacted_yaml()?)
        .context("cannot save the redacted run config")?;
    let dir = model_dir(config)?;
    let fingerprint = model_fingerprint(&dir);

    let total = run.total_steps();
    let mut moved: Box<dyn TrainStep> =
        std::mem::replace(step_impl, Box::new(crate::train::FrozenPolicy::default()));
    let (returned, begun) = tokio::task::spawn_blocking(move || {
        let out = moved.begin(total);
        (moved, out)
    })
    .await
    .context("the training step panicked while starting")?;
    *step_impl = returned;
    begun?;

    let mut resumed_at = 0;
    let mut version = 0;
    let mut checkpoint = None;
    if let Some((ckpt, meta)) = latest_checkpoint(&paths.checkpoints)? {
        if meta.model_fingerprint != fingerprint {
            bail!(
                "checkpoint {} was saved from another model ({}) than model.path {}; use a new trial_name or checkpoint.dir",
                ckpt.display(),
                meta.model_path,
                dir.display()
            );
        }
        let journal_bytes = run.workflow.journal.position()?;
        if journal_bytes < meta.journal_bytes {
            bail!(
                "the journal {} holds {journal_bytes} bytes, fewer than the {} it held when checkpoint {} was saved: \
                 it was truncated or replaced, and the rollouts that checkpoint trained on are gone",
                run.workflow.journal.path().display(),
                meta.journal_bytes,
                ckpt.display()
            );
        }
        let weights = step_impl.load(&ckpt)?;
        run.engine.publish(weights, meta.version).await?;
        resumed_at = meta.data_cursor;
        version = meta.version;
        tracing::info!(checkpoint = %ckpt.display(), steps = meta.steps, "resuming from checkpoint");
        checkpoint = Some(ckpt);
    }
    run.workflow.policy_version.store(version, Ordering::SeqCst);
    let mut sink = MetricsSink::open(&paths.metrics, config.metrics.jsonl, config.metrics.tensorboard)?;
    let done = Arc::new(run.replay.rollouts.clone());
    let (trained_tx, trained_rx) = watch::channel(resumed_at);
    let head = u64::from(config.rollout.max_head_offpolicyness);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<tokio::task::JoinHandle<Collected>>(head as usize + 1);
    let producer = {
        let run = run.clone();
        let done = done.clone();
        let mut trained_rx = trained_rx.clone();
        tokio::spawn(async move {
            for k in resumed_at..total {
                // Bounded off-policyness: step k's rollouts wait until step k - head - 1 is trained.
                let need = k.saturating_sub(head);
                if trained_rx.wait_for(|t| *t >= need).await.is_err() {
                    return;
                }
                let run = run.clone();
                let done = done.clone();
                let handle = tokio::spawn(async move { run.collect(k, Scope::Rollout, &done).await });
                if tx.send(handle).await.is_err() {
                    return;
                }
            }
        })
    };
    let filter = DynamicFilter::new();
    let mut rejected = BTreeMap::new();
    let mut accepted_total = 0;
    let mut trained = 0;
    let train_bar = phase_bar(config.metrics.progress, "training", total - resumed_at);
    while let Some(handle) = rx.recv().await {
        let collected = handle.await.context("a rollout task failed")?;
        let k = collected.step;
        let mut metrics = StepMetrics::default();
        let accepted = count_groups(
            run,
            &collected,
            Scope::Rollout,
            &filter,
            &mut metrics,
            &mut rejected,
        );
        accepted_total += accepted.len() as u64;
        let groups: Vec<(reward_routing::Group, &[RolloutRecord])> = accepted
            .iter()
            .map(|(g, i)| (g.clone(), collected.groups[*i].records.as_slice()))
            .collect();
        let mut batch = build_batch(&run.reward, &groups)?;
        batch.policy_version = version;
        let staleness = collected
            .groups
            .iter()
            .flat_map(|g| g.records.iter())
            .map(|r| version.saturating_sub(r.policy_version))
            .max()
            .unwrap_or(0);
        let started = Instant::now();
        let mut moved: Box<dyn TrainStep> =
            std::mem::replace(step_impl, Box::new(crate::train::FrozenPolicy::default()));
        let (returned, output) = tokio::task::spawn_blocking(move || {
            let out = moved.train(k, &batch);
            (moved, out)
        })
        .await
        .context("the training step panicked")?;
        *step_impl = returned;
        let output = output.with_context(|| format!("training step {k}"))?;
        version += 1;
        run.engine.publish(output.weights, version).await?;
        run.workflow.policy_version.store(version, Ordering::SeqCst);
        for (name, value) in &output.metrics {
            metrics.set(name, *value);
        }
        metrics.set("timing/rollout_seconds", collected.seconds);
        metrics.set("timing/train_seconds", started.elapsed().as_secs_f64());
        metrics.set("policy/version", version as f64);
        metrics.set("policy/max_staleness", staleness as f64);
        if config.checkpoint.save_every > 0 && ((k + 1) % config.checkpoint.save_every == 0 || k + 1 == total)
        {
            let meta = CheckpointMeta {
                steps: k + 1,
                version,
                model_path: dir.display().to_string(),
                model_fingerprint: fingerprint.clone(),
                data_cursor: k + 1,
                journal_bytes: run.workflow.journal.position()?,
            };
            let mut moved: Box<dyn TrainStep> =
                std::mem::replace(step_impl, Box::new(crate::train::FrozenPolicy::default()));
            let root = paths.checkpoints.clone();
            let keep = config.checkpoint.keep_last as usize;
            let (returned, saved) = tokio::task::spawn_blocking(move || {
                let out = save_checkpoint(&root, &meta, moved.as_mut(), keep);
                (moved, out)
            })
            .await
            .context("the training step panicked while saving")?;
            *step_impl = returned;
            checkpoint = Some(saved.with_context(|| format!("saving the checkpoint of step {k}"))?);
        }
        run.workflow.journal.append(&Entry::Step { step: k, version })?;
        if config.eval_every > 0 && (k + 1) % config.eval_every == 0 {
            let eval = run.collect(k, Scope::EvalRollout, &done).await;
            let mut ignore = BTreeMap::new();
            count_groups(
                run,
                &eval,
                Scope::EvalRollout,
                &DynamicFilter::new(),
                &mut metrics,
                &mut ignore,
            );
        }
        let reward = metrics.mean("rollout/reward");
        tracing::info!(
            step = k,
            version,
            reward = reward.unwrap_or(f64::NAN),
            accepted = accepted.len(),
            groups = collected.groups.len(),
            "step trained"
        );
        sink.write_step(k, &metrics)?;
        trained += 1;
        train_bar.inc(1);
        let _ = trained_tx.send(k + 1);
    }
    train_bar.finish_and_clear();
    producer.await.context("the rollout scheduler failed")?;
    let curve = if config.metrics.reward_curve {
        Some(sink.draw_curve()?)
    } else {
        None
    };
    Ok(RunSummary {
        run_dir: paths.run_dir.clone(),
        steps_trained: trained,
        resumed_at,
        metrics_dir: paths.metrics.clone(),
        reward_curve: curve,
        checkpoint,
        rewards: sink.rewards().to_vec(),
        rejected_groups: rejected,
        accepted_groups: accepted_total,
        cleaned: run.cleaned,
    })
}

/// The rollout-only mode: collects the steps' rollouts (no training), and writes every finished rollout,
/// with its group's fate and its advantage, as one JSON line to `<run dir>/rollouts.jsonl`.
pub async fn rollout_only(config: RunConfig, env: &Env, engine: Option<EngineHandle>) -> Result<RunSummary> {
    let run = setup(config, env, engine).await?;
    let result = rollout_inner(&run).await;
    finish(&run).await;
    result
}

async fn rollout_inner(run: &Run) -> Result<RunSummary> {
    use std::io::Write as _;
    let config = &run.config;
    let paths = &run.paths;
    std::fs::create_dir_all(&paths.run_dir)?;
    std::fs::write(paths.run_dir.join("config.yaml"), config.to_redacted_yaml()?)
        .context("cannot save the redacted run config")?;
    let out_path = paths.run_dir.join("rollouts.jsonl");
    let mut out = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(&out_path)
        .with_context(|| format!("cannot create {}", out_path.display()))?;
    let mut sink = MetricsSink::open(&paths.metrics, config.metrics.jsonl, config.metrics.tensorboard)?;
    let filter = DynamicFilter::new();
    let mut rejected = BTreeMap::new();
    let mut accepted_total = 0;
    let total = run.total_steps();
    for k in 0..total {
        let collected = run.collect(k, Scope::Rollout, &run.replay.rollouts).await;
        let mut metrics = StepMetrics::default();
        let accepted = count_groups(
            run,
            &collected,
            Scope::Rollout,
            &filter,
            &mut metrics,
            &mut rejected,
        );
        accepted_total += accepted.len() as u64;
        let groups: Vec<(reward_routing::Group, &[RolloutRecord])> = accepted
            .iter()
            .map(|(g, i)| (g.clone(), collected.groups[*i].records.as_slice()))
            .collect();
        let advantages = run
            .reward
            .advantages(&groups.iter().map(|(g, _)| g.clone()).collect::<Vec<_>>())?;
        let mut adv_of: BTreeMap<SampleKey, f64> = BTreeMap::new();
        for ((_, records), advs) in groups.iter().zip(&advantages) {
            for a in advs {
                if let Some(r) = records.get(a.index) {
                    adv_of.insert(r.key, a.advantage);
                }
            }
        }
        for g in &collected.groups {
            for r in &g.records {
                let line = serde_json::json!({
                    "key": r.key.to_string(),
                    "stream": r.stream,
                    "data_id": r.data_id,
                    "task_type": r.task_type,
                    "task_id": r.task_id,
                    "verdict": r.verdict,
                    "trained": adv_of.contains_key(&r.key),
                    "advantage": adv_of.get(&r.key),
                    "policy_version": r.policy_version,
                    "trajectories": r.trajectories,
                });
                writeln!(out, "{line}").context("cannot write rollouts.jsonl")?;
            }
        }
        sink.write_step(k, &metrics)?;
    }
    out.sync_all()?;
    tracing::info!(path = %out_path.display(), "rollouts exported");
    let curve = if config.metrics.reward_curve {
        Some(sink.draw_curve()?)
    } else {
        None
    };
    Ok(RunSummary {
        run_dir: paths.run_dir.clone(),
        steps_trained: 0,
        resumed_at: 0,
        metrics_dir: paths.metrics.clone(),
        reward_curve: curve,
        checkpoint: None,
        rewards: sink.rewards().to_vec(),
        rejected_groups: rejected,
        accepted_groups: accepted_total,
        cleaned: run.cleaned,
    })
}
