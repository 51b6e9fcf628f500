//! Setting a run up: paths, the journal and a killed run's leftovers, the Arena client, the healthy streams
//! and this worker's rows, the proxy with its engine, and the route setup of the mode.
//!
//! Every component config is parsed and checked first (`check.rs`), every mistake at once; then the journal is
//! opened (and a killed run's routes and tasks settled, `leftovers.rs`) before anything else can fail.

use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

use arena_client::{ArenaClient, Party, RegistryOptions, RouteRegistry, RouteSetup};
use reward_routing::{AuditConfig, AuditWriter, RewardConfig, TransformRegistry};
use rollout_proxy::{ChatModel, IntegrityConfig, ProxyServer, ProxyState};
use secrecy::{ExposeSecret as _, SecretString};
use stream_config::{Env, RouteMode, RunConfig, StreamConfig};
use tokio::sync::Semaphore;

use super::check::Checked;
use super::serving::{EngineHandle, build_engine};
use super::settings;
use crate::error::{Context as _, Error, Result};
use crate::journal::{Entry, Journal, JournalState};
use crate::proxy_control::ProxyControl;
use crate::resolve::{PromptRow, ResolvedStream, load_rows, resolve_streams};
use crate::train::TrainStep;
use crate::workflow::Workflow;

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
    /// The worker's held-out evaluation rows (`valid_dataset.streams`), mixed; empty when evaluation uses
    /// the first batch of `rows`.
    pub eval_rows: Vec<PromptRow>,
    /// What the journal held at start.
    pub replay: JournalState,
    /// The proxy server.
    pub proxy: ProxyServer,
    /// Advantages and group settings.
    pub reward: RewardConfig,
    /// Leftovers cleaned at start: `(routes deleted, tasks cancelled)`.
    pub cleaned: (usize, usize),
    /// Every secret the run knows (its credentials from the environment, the proxy's admin and gateway keys,
    /// every Stream's `task_envs` values), redacted by value from whatever the run saves.
    pub secrets: stream_config::Secrets,
    /// The experiment trackers the metrics go to (`metrics.trackers`), with the redacted config they record.
    pub trackers: crate::observe::trackers::TrackerSettings,
}

/// `model.path`, which must be a directory.
pub(crate) fn model_dir(config: &RunConfig) -> Result<PathBuf> {
    if config.model.path.trim().is_empty() {
        return Err(Error::Invalid(
            "model.path is required (a Hugging Face folder with tokenizer.json and a chat template; MODEL_PATH also sets it)"
                .into(),
        ));
    }
    let dir = PathBuf::from(&config.model.path);
    if !dir.is_dir() {
        return Err(Error::Invalid(format!(
            "model.path {} is not a directory",
            dir.display()
        )));
    }
    Ok(dir)
}

fn admin_key(config: &RunConfig, env: &Env) -> SecretString {
    match env.get(&config.proxy.admin_key_env) {
        Some(k) if !k.is_empty() => SecretString::from(k.to_string()),
        _ => SecretString::from(rollout_proxy::auth::random_hex(24)),
    }
}

/// Appends the audit records of journaled rollouts that the audit shards lack: a kill came between a
/// rollout's journal write and its audit append. Only the shards' tails from the earliest position the journal
/// names for each are read. Each record appended again is journaled again first with its new position, so a
/// later resume finds it there. A shard that cannot be read is logged and its records are not appended again
/// (an audit failure never stops a run, and they may be there).
fn complete_audits(writer: &AuditWriter, journal: &Journal, replay: &JournalState) -> Result<()> {
    let mut written = BTreeSet::new();
    for ((dir, stem), (index, offset)) in &replay.audit_from {
        let from = reward_routing::AuditPosition {
            dir: dir.clone(),
            stem: stem.clone(),
            index: *index,
            offset: *offset,
        };
        match from.task_ids_since() {
            Ok(ids) => written.extend(ids),
            Err(e) => {
                tracing::warn!(
                    dir = %dir.display(), %stem, error = %e,
                    "cannot read a killed process's audit shards; not appending its records again"
                );
                written.extend(
                    replay
                        .audits
                        .values()
                        .filter(|a| a.at.dir == *dir && a.at.stem == *stem)
                        .map(|a| a.task_id.clone()),
                );
            }
        }
    }
    let mut appended = 0;
    for (key, audit) in &replay.audits {
        if !replay.rollouts.contains_key(key) || written.contains(&audit.task_id) {
            continue;
        }
        let again = crate::journal::AuditEntry {
            at: writer.position(),
            ..audit.clone()
        };
        journal.append(&Entry::Audit(Box::new(again)))?;
        appended += usize::from(writer.append_line(&audit.line, &audit.task_id));
    }
    if appended > 0 {
        tracing::info!(
            records = appended,
            "appended the audit records a killed process had journaled but not written"
        );
    }
    Ok(())
}

/// The proxy as the run uses it: the server, its state, its control client and its address for Arena.
struct StartedProxy {
    server: ProxyServer,
    state: ProxyState,
    control: ProxyControl,
    public_url: String,
    admin: SecretString,
}

/// Sets a run up: paths, journal, leftovers, Arena, streams and rows, proxy, engine, routing.
///
/// Every component config is parsed and checked first ([`Checked`]), every mistake reported at once, so a
/// typo in the config stops the run before the journal opens, Arena is called or a dataset downloads.
pub async fn setup(config: RunConfig, env: &Env, engine: Option<EngineHandle>) -> Result<Run> {
    let checked = Checked::of(&config, env, engine.is_some())?;
    let paths = RunPaths::of(&config);
    let (journal, replay) = Journal::open(&paths.journal)?;
    if replay.torn_lines > 0 {
        tracing::warn!(journal = %paths.journal.display(), "cut a torn last journal line (the process was killed mid-write)");
    }
    let client = ArenaClient::new(checked.client).context("building the Arena client")?;
    let (cleaned, resume_keys) =
        super::leftovers::clean_leftovers(&client, &journal, &replay, &config, &paths).await?;
    let healthy = healthy_streams(&client, &config, checked.streams).await?;
    let (rows, eval_rows) = worker_rows(&client, &healthy, &config).await?;
    let model = Arc::new(
        ChatModel::from_dir(&checked.model_dir)
            .with_context(|| format!("loading the model folder {}", checked.model_dir.display()))?,
    );
    let engine = match engine {
        Some(e) => e,
        None => build_engine(&config, env, &model, &checked.model_dir).await?,
    };
    let proxy = start_proxy(
        &config,
        env,
        model,
        &engine,
        &checked.reach,
        checked.integrity,
        checked.proxy_host,
    )
    .await?;
    tracing::info!(proxy = %proxy.public_url, "the proxy advertises this address to Arena");
    let (routing, gateway_key) = route_setup(&config, checked.routes, &client, &journal, &proxy.state);
    checked
        .reach
        .check(&client, env, &proxy.control, &proxy.public_url)
        .await?;
    let audit = if config.econfig.arena_result_dump_dir.trim().is_empty() {
        None
    } else {
        let mut audit_config = AuditConfig::new(&config.econfig.arena_result_dump_dir);
        audit_config.max_raw_bytes = config.econfig.arena_result_dump_max_bytes;
        Some(AuditWriter::shared(audit_config).context("econfig.arena_result_dump_dir")?)
    };
    if let Some(writer) = &audit {
        complete_audits(writer, &journal, &replay)?;
    }
    let reward = checked.reward;
    let secrets = run_secrets(&config, env, &proxy.admin, gateway_key.as_ref(), &healthy);
    let trackers =
        crate::observe::trackers::TrackerSettings::resolve(&config, env, &secrets, &paths.run_dir)?;
    let token_state = proxy.state.clone();
    let workflow = Arc::new(Workflow {
        client,
        routing,
        gateway_key,
        proxy: proxy.control,
        proxy_public_url: proxy.public_url,
        session_token: Arc::new(move |id: &str| token_state.session_token(id)),
        streams: healthy,
        journal,
        audit,
        limiter: Arc::new(Semaphore::new(settings::concurrency(&config))),
        episode_timeout: config.econfig.timeout.duration(),
        idempotent_launch: config.econfig.arena_idempotent_launch,
        run_id: format!(
            "{}-{}-{}",
            config.experiment_name,
            config.trial_name,
            replay.nonce.as_deref().unwrap_or_default()
        ),
        answered_launches: replay.answered_launches.clone(),
        resume_keys,
        export_style: settings::export_style(&config),
        turn_discount: config.proxy.turn_discount,
        episode_reward_for_export: config.proxy.episode_reward_for_export,
        n_samples: config.gconfig.n_samples,
        policy_version: Arc::new(AtomicU64::new(0)),
        group_settings: settings::group_settings(&config),
    });
    Ok(Run {
        config,
        paths,
        workflow,
        engine,
        rows,
        eval_rows,
        replay,
        proxy: proxy.server,
        reward,
        cleaned,
        secrets,
        trackers,
    })
}

/// Every secret the run knows: its credentials from the environment, the proxy's admin and gateway keys, and
/// every Stream's `task_envs` values long enough to redact by value.
fn run_secrets(
    config: &RunConfig,
    env: &Env,
    admin: &SecretString,
    gateway_key: Option<&SecretString>,
    streams: &[ResolvedStream],
) -> stream_config::Secrets {
    let mut secrets = config.secrets(env);
    secrets.add(admin.expose_secret());
    if let Some(key) = gateway_key {
        secrets.add(key.expose_secret());
    }
    for stream in streams {
        let long = |v: &&String| v.len() >= stream_config::MIN_SUBSTRING_LEN;
        stream
            .config
            .task_envs
            .values()
            .filter(long)
            .for_each(|v| secrets.add(v));
    }
    secrets
}

/// Arena refused the stream (not ACTIVE, an incomplete reward ref): the stream is unhealthy, not the run.
fn refused_stream(e: &Error) -> Option<&arena_client::Error> {
    match e.root() {
        Error::Arena {
            source: source @ arena_client::Error::Rejected(_),
            ..
        } => Some(source),
        _ => None,
    }
}

/// Resolves every configured stream. A stream Arena refuses stops the run, naming it and Arena's reason, unless
/// `econfig.arena_skip_refused_streams` leaves it out (the new mixture weights are logged); all refused is
/// [`Error::NoHealthyStream`], and an Arena that does not answer is [`Error::ArenaUnreachable`].
async fn healthy_streams(
    client: &ArenaClient,
    config: &RunConfig,
    stream_configs: Vec<StreamConfig>,
) -> Result<Vec<ResolvedStream>> {
    let transforms = TransformRegistry::with_builtins();
    let mut healthy: Vec<ResolvedStream> = Vec::new();
    let mut unhealthy: Vec<String> = Vec::new();
    for s in &stream_configs {
        match resolve_streams(client, std::slice::from_ref(s), &transforms).await {
            Ok(resolved) => {
                for mut r in resolved {
                    r.with_guard(config)?;
                    healthy.push(r);
                }
            }
            Err(e) => {
                if let Some(refused) = refused_stream(&e) {
                    tracing::warn!(stream = %s.name, error = %e, "stream skipped");
                    unhealthy.push(format!("{} ({refused})", s.name));
                    continue;
                }
                return Err(match e.root() {
                    Error::Arena { source, .. } if source.party() == Party::Transport => {
                        Error::ArenaUnreachable {
                            base: config.econfig.arena_base_url.clone(),
                            source: arena_error(e),
                        }
                    }
                    _ => e,
                });
            }
        }
    }
    if healthy.is_empty() {
        return Err(Error::NoHealthyStream(unhealthy));
    }
    if !unhealthy.is_empty() {
        if !config.econfig.arena_skip_refused_streams {
            return Err(Error::Invalid(format!(
                "Arena refused stream {}; fix it, or set econfig.arena_skip_refused_streams: true to train on the \
                 others (the mixture changes)",
                unhealthy.join(", stream ")
            )));
        }
        let total: f64 = healthy.iter().map(|s| s.config.sampling_weight).sum();
        let weights: Vec<String> = healthy
            .iter()
            .map(|s| {
                format!(
                    "{}={:.3}",
                    s.config.name,
                    s.config.sampling_weight / total.max(f64::MIN_POSITIVE)
                )
            })
            .collect();
        tracing::warn!(
            refused = %unhealthy.join(", "),
            mixture = %weights.join(" "),
            "econfig.arena_skip_refused_streams: training without the refused streams, at the new mixture weights"
        );
    }
    Ok(healthy)
}

/// The Arena error under `e`'s context wrappers (`e` is known to hold one).
fn arena_error(e: Error) -> arena_client::Error {
    match e {
        Error::Arena { source, .. } => source,
        Error::Context { inner, .. } => arena_error(*inner),
        other => arena_client::Error::Invalid(other.to_string()),
    }
}

/// Downloads, mixes and shards the streams' rows: the training rows, of which a worker needs at least one
/// batch, and the rows of the streams `valid_dataset.streams` holds out for evaluation (mixed by weight
/// among themselves, all of them once).
async fn worker_rows(
    client: &ArenaClient,
    healthy: &[ResolvedStream],
    config: &RunConfig,
) -> Result<(Vec<PromptRow>, Vec<PromptRow>)> {
    let batch_size = config.train_dataset.batch_size as usize;
    let worker = (
        config.rollout.worker_index as usize,
        config.rollout.n_workers as usize,
    );
    let held_out: &[String] = config.valid_dataset.as_ref().map_or(&[], |v| &v.streams);
    let (eval, train): (Vec<ResolvedStream>, Vec<ResolvedStream>) = healthy
        .iter()
        .cloned()
        .partition(|s| held_out.contains(&s.config.name));
    if train.is_empty() {
        return Err(Error::Invalid(
            "every healthy stream is held out for evaluation by valid_dataset.streams; none is left to train on"
                .into(),
        ));
    }
    let eval_rows = if held_out.is_empty() {
        Vec::new()
    } else {
        if eval.is_empty() {
            return Err(Error::Invalid(format!(
                "valid_dataset.streams [{}]: Arena refused every held-out stream, so nothing is left to \
                 evaluate on (see the warnings above)",
                held_out.join(", ")
            )));
        }
        let eval_batch = config.valid_dataset.as_ref().map_or(1, |v| v.batch_size as usize);
        load_rows(client, &eval, 0, eval_batch, worker)
            .await
            .context("valid_dataset.streams")?
    };
    let rows = load_rows(
        client,
        &train,
        config.econfig.arena_mixture_epoch_size,
        batch_size,
        worker,
    )
    .await?;
    let drop_last = config.train_dataset.drop_last;
    if drop_last && rows.len() < batch_size {
        return Err(Error::Invalid(format!(
            "the streams hold {} rows for this worker, fewer than train_dataset.batch_size {batch_size} \
             (with train_dataset.drop_last, no full batch remains)",
            rows.len()
        )));
    }
    let tail = if drop_last {
        rows.len() % batch_size.max(1)
    } else {
        0
    };
    if tail > 0 {
        tracing::warn!(
            rows = rows.len(),
            batch_size,
            "drop_last will omit {tail} tail rows of every epoch"
        );
    }
    Ok((rows, eval_rows))
}

/// Starts the proxy in-process on `proxy.host:proxy.port` with the engine and its integrity rules.
async fn start_proxy(
    config: &RunConfig,
    env: &Env,
    model: Arc<ChatModel>,
    engine: &EngineHandle,
    reach: &super::reach::Reach,
    integrity: IntegrityConfig,
    host: IpAddr,
) -> Result<StartedProxy> {
    let admin = admin_key(config, env);
    let mut proxy_config = settings::proxy_config(config, admin.clone());
    proxy_config.integrity = integrity;
    let state = ProxyState::new(proxy_config, model, engine.engine.clone())
        .context("configuring the rollout proxy")?;
    let addr = SocketAddr::new(host, config.proxy.port);
    let server = ProxyServer::start(addr, state.clone())
        .await
        .map_err(|e| Error::ProxyPort {
            addr,
            reason: e.to_string(),
        })?;
    let bound = server.local_addr();
    let public_url = reach.public_url(config, bound);
    // The control client reaches the proxy on loopback unless it is bound to one specific other address.
    let control_base = if bound.ip().is_unspecified() || bound.ip().is_loopback() {
        format!("http://127.0.0.1:{}", bound.port())
    } else {
        format!("http://{bound}")
    };
    let control = ProxyControl::new(&control_base, admin.clone())?;
    Ok(StartedProxy {
        server,
        state,
        control,
        public_url,
        admin,
    })
}

/// The route setup of `econfig.arena_llm_route_mode` from its checked key and registry options (none in
/// direct mode), and the proxy's gateway key in session-gateway mode.
fn route_setup(
    config: &RunConfig,
    routes: Option<(SecretString, RegistryOptions)>,
    client: &ArenaClient,
    journal: &Journal,
    state: &ProxyState,
) -> (RouteSetup, Option<SecretString>) {
    let Some((llm_api_key, mut options)) = routes else {
        return (RouteSetup::Direct, None);
    };
    if config.econfig.arena_llm_route_mode == RouteMode::Gateway {
        // The route is renewed every probe interval while its task is in flight, so a task that waits
        // (Arena's queue, a paused generation) keeps it (arena-2026.md 2.12).
        let renewal = arena_client::GatewayRenewal {
            interval: options.probe_interval,
            clock: Arc::new(arena_client::SystemClock::default()),
        };
        let setup = RouteSetup::Gateway {
            llm_api_key,
            inbound_protos: config.econfig.arena_inbound_protos.clone(),
            registration_timeout: settings::registration_timeout(config),
            renewal: Some(renewal),
        };
        return (setup, None);
    }
    // The name is journaled before the POST that creates it, so a killed run's successor deletes it even
    // when the registration landed and its answer was never read.
    let route_journal = journal.clone();
    options.before_register = Some(Arc::new(move |name: &str| {
        route_journal
            .append(&Entry::Route {
                name: name.to_string(),
            })
            .map_err(|e| e.to_string())
    }));
    let setup = RouteSetup::SessionGateway {
        registry: RouteRegistry::new(client.clone(), options),
        llm_api_key,
    };
    (setup, Some(state.gateway_key()))
}
