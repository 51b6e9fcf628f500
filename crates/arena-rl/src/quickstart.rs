//! The quickstart: a tiny policy that the project builds itself learns `arena-sim`'s task family by RL in
//! minutes on a CPU.
//!
//! [`run`] is `arena-rl train` on the embedded [`QUICKSTART_YAML`] with `arena-sim` started in-process on
//! the configured address (`World::quickstart()`: an Anthropic-protocol and a Chat Completions stream in
//! `session_gateway` mode). Before the loop starts it builds the policy ([`policy`]: tokenizer, chat
//! template, Llama config and weights from a seed, cached per spec under the fileroot) and warms it up on the
//! task format ([`warmup`]: transcripts written through the real proxy, the final answer replaced by a random
//! digit, so the warmed-up policy calls the tool right but answers at chance). The loop then trains it with
//! the configured [`TrainStep`]; [`QuickstartSummary`] says where everything went and compares the first and
//! last RL steps' mean `rollout/reward`.

pub mod policy;
pub mod warmup;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use crate::error::{Context as _, Error, Result};
use arena_sim::{ArenaSim, World};
use stream_config::{Env, RunConfig, load_run_config_str};

use crate::observe::phase_bar;
use crate::run::{Plugins, RunSummary, train};
use crate::train::TrainStep;

use self::policy::PolicySpec;

/// The quickstart's run config, embedded so that the command works from any directory.
pub const QUICKSTART_YAML: &str = include_str!("../../../examples/configs/quickstart.yaml");

/// The name the embedded config goes by in errors.
pub const QUICKSTART_NAME: &str = "examples/configs/quickstart.yaml";

/// How many RL steps each end of the curve averages in [`QuickstartSummary`].
pub const CURVE_WINDOW: usize = 10;

/// The supervised warm-up's settings.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct WarmupSettings {
    /// Conversations written (both protocols, both families).
    pub conversations: usize,
    /// Optimiser steps (0 skips the warm-up).
    pub steps: u64,
    /// Conversations per step.
    pub batch_size: usize,
    /// Learning rate.
    pub lr: f64,
    /// The fraction of the teacher's answers drawn from the question's half of the digits
    /// ([`warmup::teacher_answer`]); 0 makes every answer uniformly random.
    pub family_prior: f64,
}

impl Default for WarmupSettings {
    fn default() -> Self {
        Self {
            conversations: 2048,
            steps: 1500,
            batch_size: 32,
            lr: 3e-3,
            family_prior: 0.1,
        }
    }
}

/// Builds the RL step for the run config and the warmed-up policy folder.
pub type StepFactory = Box<dyn FnOnce(&RunConfig, &std::path::Path) -> Result<Box<dyn TrainStep>> + Send>;

/// The mean reward over a window of steps, and how many steps it covers.
pub type WindowMean = Option<(f64, usize)>;

/// What a quickstart run is made of besides its config.
pub struct Options {
    /// Dotted overrides of the embedded config.
    pub overrides: Vec<String>,
    /// The tiny policy.
    pub policy: PolicySpec,
    /// The warm-up.
    pub warmup: WarmupSettings,
    /// Give the run a fresh trial name (`<trial_name>-<UTC time>`) unless `trial_name` is overridden, so
    /// that every run starts from the warmed-up policy instead of resuming an earlier run's checkpoint.
    pub fresh_trial: bool,
    /// Builds the RL step for the config and the warmed-up policy folder.
    pub step: StepFactory,
}

/// What a quickstart run reports.
#[derive(Debug, Clone)]
pub struct QuickstartSummary {
    /// The loop's summary.
    pub run: RunSummary,
    /// The policy folder before the warm-up.
    pub initial_policy: PathBuf,
    /// The policy folder RL started from.
    pub warm_policy: PathBuf,
    /// Whether the policy folder came from the cache.
    pub policy_cached: bool,
    /// Seconds spent building the policy, warming it up, and in the RL loop.
    pub seconds: PhaseSeconds,
    /// Mean `rollout/reward` of the first [`CURVE_WINDOW`] RL steps, and how many steps that is.
    pub first: WindowMean,
    /// Mean `rollout/reward` of the last [`CURVE_WINDOW`] RL steps, and how many steps that is.
    pub last: WindowMean,
}

/// Wall time per phase.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct PhaseSeconds {
    /// Tokenizer, template, config and weights.
    pub policy: f64,
    /// Warm-up transcripts and supervised steps.
    pub warmup: f64,
    /// The RL loop.
    pub rl: f64,
}

/// The mean of the first and of the last `window` values of `rewards` (by step), with their counts.
pub fn curve_ends(rewards: &[(u64, f64)], window: usize) -> (WindowMean, WindowMean) {
    let mut sorted = rewards.to_vec();
    sorted.sort_by_key(|(s, _)| *s);
    let mean = |xs: &[(u64, f64)]| {
        (!xs.is_empty()).then(|| (xs.iter().map(|(_, r)| r).sum::<f64>() / xs.len() as f64, xs.len()))
    };
    let n = sorted.len().min(window);
    (mean(&sorted[..n]), mean(&sorted[sorted.len() - n..]))
}

/// Loads the embedded config with `overrides`; with `fresh_trial` and no `trial_name` override, the trial
/// name gets a UTC time suffix (before interpolation, so paths built from `${trial_name}` follow it).
pub fn load_config(overrides: &[String], fresh_trial: bool, env: &Env) -> Result<RunConfig> {
    let config = load_run_config_str(QUICKSTART_NAME, QUICKSTART_YAML, overrides, env)?;
    let trial_overridden = overrides
        .iter()
        .any(|o| o.trim_start().starts_with("trial_name="));
    if !fresh_trial || trial_overridden {
        return Ok(config);
    }
    let mut with_trial = overrides.to_vec();
    with_trial.push(format!("trial_name={}-{}", config.trial_name, utc_stamp()));
    Ok(load_run_config_str(
        QUICKSTART_NAME,
        QUICKSTART_YAML,
        &with_trial,
        env,
    )?)
}

/// `YYYYmmdd-HHMMSS` in UTC.
fn utc_stamp() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}{month:02}{day:02}-{:02}{:02}{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// The credentials the in-process Arena and the run share: fresh random ones for every run, whatever the
/// environment holds (the quickstart never talks to a real Arena).
fn sim_credentials(env: &Env) -> (Env, String, String) {
    let hex = |bytes: [u8; 16]| bytes.iter().map(|b| format!("{b:02x}")).collect::<String>();
    let token = hex(rand::random());
    let llm_key = hex(rand::random());
    let mut env = env.clone();
    env.set("ARENA_OPENAPI_TOKEN", token.clone());
    env.set("ARENA_LLM_API_KEY", llm_key.clone());
    (env, token, llm_key)
}

/// Starts `arena-sim`'s quickstart world on the config's `econfig.arena_base_url` (port 0 picks a free one,
/// and the config is pointed at it).
async fn start_sim(config: &mut RunConfig, token: &str, llm_key: &str) -> Result<ArenaSim> {
    let base = config.econfig.arena_base_url.trim_end_matches('/').to_string();
    let addr: SocketAddr = base
        .strip_prefix("http://")
        .and_then(|rest| rest.parse().ok())
        .ok_or_else(|| {
            Error::Invalid(format!(
                "econfig.arena_base_url {base:?} must be http://IP:PORT: the quickstart serves arena-sim there"
            ))
        })?;
    let mut world = World::quickstart();
    world.token = token.to_string();
    world.llm_api_key = Some(llm_key.to_string());
    let sim = ArenaSim::builder(world).bind(addr).start().await.map_err(|e| {
        Error::failed(
            format!("cannot start arena-sim on {addr} (econfig.arena_base_url)"),
            e,
        )
    })?;
    config.econfig.arena_base_url = sim.base_url();
    Ok(sim)
}

/// The policy a quickstart run starts RL from.
#[derive(Debug, Clone)]
pub struct PreparedPolicy {
    /// The policy folder before the warm-up.
    pub initial: PathBuf,
    /// The warmed-up policy folder (the same as `initial` when the warm-up has no steps).
    pub warm: PathBuf,
    /// Whether the initial policy came from the cache.
    pub cached: bool,
    /// Seconds spent building the policy and warming it up.
    pub seconds: PhaseSeconds,
}

/// Builds the tiny policy of `spec` and warms it up under `cache` (both reused when an earlier run of the
/// same spec and settings left them there).
pub async fn prepare(
    spec: &PolicySpec,
    warmup_settings: &WarmupSettings,
    cache: &std::path::Path,
    progress: bool,
) -> Result<PreparedPolicy> {
    let started = Instant::now();
    let bar = phase_bar(progress, "policy", 1);
    bar.set_message("tokenizer, template, weights");
    let spec_for_build = spec.clone();
    let cache_for_build = cache.to_path_buf();
    let built = tokio::task::spawn_blocking(move || policy::ensure(&spec_for_build, &cache_for_build))
        .await
        .context("building the quickstart policy")??;
    bar.finish_and_clear();
    let policy_seconds = started.elapsed().as_secs_f64();
    tracing::info!(
        dir = %built.dir.display(),
        parameters = built.config.num_parameters(),
        vocab = built.config.vocab_size,
        cached = built.cached,
        "quickstart policy ready"
    );

    let started = Instant::now();
    let warm = warmup::ensure_warm(&built.dir, cache, spec, warmup_settings, progress).await?;
    let warmup_seconds = started.elapsed().as_secs_f64();
    if let Some((first, last)) = warm.loss {
        tracing::info!(first, last, dir = %warm.dir.display(), "warm-up done (loss of the first and last tenth)");
    }
    Ok(PreparedPolicy {
        initial: built.dir,
        warm: warm.dir,
        cached: built.cached,
        seconds: PhaseSeconds {
            policy: policy_seconds,
            warmup: warmup_seconds,
            rl: 0.0,
        },
    })
}

/// The folder under which the quickstart caches its policies: `<cluster.fileroot>/quickstart-policy`.
pub fn policy_cache(config: &RunConfig) -> PathBuf {
    PathBuf::from(&config.cluster.fileroot).join("quickstart-policy")
}

/// Runs the quickstart: the policy, the warm-up, arena-sim, and the RL loop.
pub async fn run(options: Options, env: &Env) -> Result<QuickstartSummary> {
    let Options {
        overrides,
        policy: spec,
        warmup: warmup_settings,
        fresh_trial,
        step,
    } = options;
    let (env, token, llm_key) = sim_credentials(env);
    let mut config = load_config(&overrides, fresh_trial, &env)?;
    let progress = config.metrics.progress;
    let prepared = prepare(&spec, &warmup_settings, &policy_cache(&config), progress).await?;
    let warm = prepared.warm.clone();

    config.model.path = warm.display().to_string();
    let sim = start_sim(&mut config, &token, &llm_key).await?;
    let step = step(&config, &warm)?;
    let started = Instant::now();
    let result = train(config, &env, Plugins { engine: None, step }).await;
    let rl_seconds = started.elapsed().as_secs_f64();
    sim.shutdown().await;
    let run = result?;
    let (first, last) = curve_ends(&run.rewards, CURVE_WINDOW);
    Ok(QuickstartSummary {
        run,
        initial_policy: prepared.initial,
        warm_policy: warm,
        policy_cached: prepared.cached,
        seconds: PhaseSeconds {
            rl: rl_seconds,
            ..prepared.seconds
        },
        first,
        last,
    })
}

#[cfg(test)]
mod tests;
