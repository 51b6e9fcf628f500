//! Pure functions from a [`RunConfig`] to each component's own config: the Arena client's, the proxy's, the
//! route registry's, reward-routing's and the trainer's. These mappings are the seam between the one config
//! format (`stream-config`) and crates that know nothing of it; they read the config and nothing else.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use arena_client::{ClientConfig, RegistryOptions, RetryPolicy};
use reward_routing::{GroupSettings, RewardConfig};
use rollout_proxy::{
    ConnectionLimits, IntegrityConfig, PauseMode, PoolLimits, ProxyConfig, ReasoningFormat, SessionLimits,
    SessionRewards, SglangConfig, ToolCallFormat,
};
use secrecy::SecretString;
use stream_config::{Env, RunConfig};
use trainer::{
    AdamWConfig, AdvNorm, DeviceKind, InferenceDtype, KlEstimator, LossAggregation, LrSchedule, PpoConfig,
    ScheduleKind, TrainConfig, TrainerOptions,
};

use crate::error::{Context as _, Error, Result};

/// The Arena client: `econfig.arena_base_url`, request timeout, poll interval and retries, with the token
/// and the optional `ARENA_LLM_BASE_URL` from the environment.
pub fn client_config(config: &RunConfig, env: &Env) -> Result<ClientConfig> {
    let token = env
        .get("ARENA_OPENAPI_TOKEN")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::Invalid("ARENA_OPENAPI_TOKEN is required (the Arena OpenAPI token)".into()))?;
    let base = &config.econfig.arena_base_url;
    if base.trim().is_empty() {
        return Err(Error::Invalid(
            "econfig.arena_base_url is required (ARENA_OPENAPI_BASE also sets it)".into(),
        ));
    }
    let mut client =
        ClientConfig::new(base, SecretString::from(token.to_string())).context("econfig.arena_base_url")?;
    client.timeout = config.econfig.arena_request_timeout.duration();
    client.poll_interval = config.econfig.arena_poll_interval.duration();
    client.cancel_tasks = config.econfig.arena_cancel_tasks;
    client.retry = RetryPolicy {
        retries: config.econfig.arena_request_retries,
        ..RetryPolicy::default()
    };
    if let Some(url) = env.get("ARENA_LLM_BASE_URL").filter(|u| !u.trim().is_empty()) {
        client.llm_base_url = Some(arena_client::validate_llm_base_url(url).context("ARENA_LLM_BASE_URL")?);
    }
    Ok(client)
}

/// The environment variable that holds the policy servers' `--api-key` (both `serve-policy` and the run's
/// client read it; never a command-line argument).
pub const POLICY_API_KEY_ENV: &str = "ARENA_RL_POLICY_API_KEY";

/// The client of the policy server at `url` (`rollout.policy_servers`): its pause mode and readiness
/// bound from the rollout section, its API key from [`POLICY_API_KEY_ENV`].
pub fn policy_server_config(config: &RunConfig, env: &Env, url: &str) -> Result<SglangConfig> {
    let mode = &config.rollout.policy_server_pause_mode;
    let mut server = SglangConfig::new(url);
    server.pause_mode = PauseMode::parse(mode).ok_or_else(|| {
        Error::Invalid(format!(
            "rollout.policy_server_pause_mode {mode:?} is not one of abort, retract, in_place"
        ))
    })?;
    server.ready_timeout = Some(config.rollout.policy_server_ready_timeout_seconds.duration());
    server.api_key = env
        .get(POLICY_API_KEY_ENV)
        .filter(|k| !k.is_empty())
        .map(|k| SecretString::from(k.to_string()));
    Ok(server)
}

/// The deadline of each route registration, probe and deletion (`econfig.arena_registration_timeout`).
pub fn registration_timeout(config: &RunConfig) -> Duration {
    config.econfig.arena_registration_timeout.duration()
}

/// The session-gateway registry's options (a persistent, worker-lifetime registry).
pub fn registry_options(config: &RunConfig) -> Result<RegistryOptions> {
    let mut options = RegistryOptions::new(config.econfig.arena_registration_probe_interval.get())
        .context("econfig.arena_registration_probe_interval")?;
    options.registration_timeout = registration_timeout(config);
    options.persistent = true;
    options.inbound_protos = config.econfig.arena_inbound_protos.clone();
    Ok(options)
}

/// The proxy's integrity rules (`guard`): the run-wide rule set for every session that names no profile,
/// and one profile, named after its Stream, for each Stream with rules of its own.
pub fn integrity_config(config: &RunConfig) -> Result<IntegrityConfig> {
    let compile = |stream: Option<&str>| {
        config.guard.rule_set(stream).map(Arc::new).map_err(|e| {
            Error::Invalid(match stream {
                Some(name) => format!("guard.streams.{name}: {e}"),
                None => format!("guard: {e}"),
            })
        })
    };
    let mut integrity = IntegrityConfig {
        default: Some(compile(None)?),
        profiles: BTreeMap::new(),
    };
    for name in config.guard.streams_with_own_rules() {
        integrity.profiles.insert(name.to_string(), compile(Some(name))?);
    }
    Ok(integrity)
}

/// The integrity profile a session of `stream` names at `start_session`: the Stream's own, when it has
/// rules of its own, else none (the run-wide rules).
pub fn integrity_profile(config: &RunConfig, stream: &str) -> Option<String> {
    config.guard.has_own_rules(stream).then(|| stream.to_string())
}

/// The rollout proxy: parsers, preprocessors, session and connection limits and its preparation pool
/// (`proxy.*`), export wait and default output budget; rewards a session sets on itself are dropped. Its
/// integrity rules, which can fail to compile, come from [`integrity_config`].
pub fn proxy_config(config: &RunConfig, admin_key: SecretString) -> ProxyConfig {
    let mut proxy = ProxyConfig::new(admin_key);
    proxy.tool_calls = match config.proxy.tool_call_parser {
        stream_config::ToolCallParser::Hermes => ToolCallFormat::Hermes,
        stream_config::ToolCallParser::Qwen3Coder => ToolCallFormat::Qwen3Coder,
        stream_config::ToolCallParser::None => ToolCallFormat::None,
    };
    proxy.reasoning = match config.proxy.reasoning_parser {
        stream_config::ReasoningParser::Think => ReasoningFormat::Think,
        stream_config::ReasoningParser::None => ReasoningFormat::None,
    };
    proxy.preprocessors = config.proxy.preprocessors.clone();
    let p = &config.proxy;
    proxy.limits = SessionLimits {
        max_sessions: p.max_sessions as usize,
        session_timeout: p.session_timeout_seconds.duration(),
        max_generations_per_session: p.max_generations_per_session,
        max_response_bytes_per_session: usize::try_from(p.max_response_bytes_per_session)
            .unwrap_or(usize::MAX),
        max_response_bytes: usize::try_from(p.max_response_bytes).unwrap_or(usize::MAX),
        ..SessionLimits::default()
    };
    proxy.connection = ConnectionLimits {
        header_read_timeout: p.header_read_timeout_seconds.duration(),
        body_read_timeout: p.body_read_timeout_seconds.duration(),
        idle_timeout: p.idle_timeout_seconds.duration(),
        write_timeout: p.write_timeout_seconds.duration(),
        max_body_bytes: usize::try_from(p.max_body_bytes).unwrap_or(usize::MAX),
        max_connections: p.max_connections as usize,
        ..ConnectionLimits::default()
    };
    proxy.pool = PoolLimits {
        threads: p
            .pool_threads
            .map_or_else(|| PoolLimits::default().threads, |n| n as usize),
        queue: p.pool_queue as usize,
    };
    proxy.export_wait_timeout = config.proxy.export_wait_timeout_seconds.duration();
    // The reward that trains, and that rollouts.jsonl reports, is Arena's; a session's key is in the
    // hands of the agent code being graded, so what it sets for itself is answered and dropped.
    proxy.session_rewards = SessionRewards::Ignore;
    proxy.default_max_new_tokens = Some(config.gconfig.max_new_tokens);
    proxy.sampling = sampling_defaults(config);
    proxy.harness_sampling = match config.gconfig.harness_sampling {
        stream_config::HarnessSampling::Honour => rollout_proxy::HarnessSampling::Honour,
        stream_config::HarnessSampling::Override => rollout_proxy::HarnessSampling::Override,
    };
    proxy
}

/// The run's sampling (`gconfig.temperature`, `top_p`, `top_k`): what fills a harness request's omissions,
/// or replaces its values under `gconfig.harness_sampling: override`.
pub fn sampling_defaults(config: &RunConfig) -> rollout_proxy::SamplingDefaults {
    let g = &config.gconfig;
    rollout_proxy::SamplingDefaults {
        temperature: Some(g.temperature as f32),
        top_p: Some(g.top_p as f32),
        top_k: g.top_k_limit(),
    }
}

/// `proxy.export_style` as the proxy's own type.
pub fn export_style(config: &RunConfig) -> rollout_proxy::ExportStyle {
    match config.proxy.export_style {
        stream_config::ExportStyle::Concat => rollout_proxy::ExportStyle::Concat,
        stream_config::ExportStyle::Individual => rollout_proxy::ExportStyle::Individual,
    }
}

/// Rollouts in flight at once: `rollout.max_concurrent_rollouts`, else a whole step's.
pub fn concurrency(config: &RunConfig) -> usize {
    let batch = config.train_dataset.batch_size as usize;
    config
        .rollout
        .max_concurrent_rollouts
        .map_or(batch * config.gconfig.n_samples as usize, |c| c as usize)
        .max(1)
}

/// Rollout-time group handling (`gconfig.drop_incomplete_group`, `reward_normalization`,
/// `reward_normalization_use_std`, `min_usable_group_size`).
pub fn group_settings(config: &RunConfig) -> GroupSettings {
    GroupSettings {
        drop_incomplete_group: config.gconfig.drop_incomplete_group,
        reward_normalization: config.gconfig.reward_normalization,
        mean_only: !config.gconfig.reward_normalization_use_std,
        min_usable_group_size: config.gconfig.min_usable_group_size as usize,
    }
}

/// A config norm level as the trainer's own (it depends on no workspace crate).
fn norm_level(l: stream_config::NormLevel) -> trainer::NormLevel {
    match l {
        stream_config::NormLevel::Batch => trainer::NormLevel::Batch,
        stream_config::NormLevel::Group => trainer::NormLevel::Group,
    }
}

/// The trainer's advantage normalisation from the config's (`actor.adv_norm`).
pub fn adv_norm(n: &stream_config::NormConfig) -> AdvNorm {
    AdvNorm {
        mean_level: n.mean_level.map(norm_level),
        mean_leave1out: n.mean_leave1out,
        std_level: n.std_level.map(norm_level),
        std_unbiased: n.std_unbiased,
        eps: n.eps,
        group_size: n.group_size as usize,
    }
}

/// reward-routing's settings: group handling, bias, scaling, clip and `actor.reward_norm`.
pub fn reward_config(config: &RunConfig) -> RewardConfig {
    RewardConfig {
        drop_incomplete_group: config.gconfig.drop_incomplete_group,
        reward_normalization: config.gconfig.reward_normalization,
        reward_bias: config.actor.reward_bias,
        reward_scaling: config.actor.reward_scaling,
        reward_clip: config.actor.reward_clip,
        reward_norm: config.actor.reward_norm.clone(),
    }
}

/// A device setting, checked against this build and machine: one error naming the field when this build
/// has no `cuda` feature or the machine no NVIDIA driver.
fn device(field: &str, value: &str) -> Result<DeviceKind> {
    let device: DeviceKind = value
        .parse()
        .map_err(|e| Error::Invalid(format!("{field} {value:?}: {e}")))?;
    device
        .check()
        .map_err(|e| Error::Invalid(format!("{field} {value:?}: {e}")))?;
    Ok(device)
}

/// The in-process policy's device (`model.device`).
pub fn policy_device(config: &RunConfig) -> Result<DeviceKind> {
    device("model.device", &config.model.device)
}

/// The in-process policy's weight dtype (`model.dtype`), checked against its device.
pub fn policy_dtype(config: &RunConfig) -> Result<InferenceDtype> {
    let invalid = |e: trainer::Error| Error::Invalid(format!("model.dtype {:?}: {e}", config.model.dtype));
    let dtype: InferenceDtype = config.model.dtype.parse().map_err(invalid)?;
    dtype.check_on(policy_device(config)?).map_err(invalid)?;
    Ok(dtype)
}

/// The trainer's device and precision (`actor.device`, `actor.bf16_autocast`).
pub fn trainer_options(config: &RunConfig) -> Result<TrainerOptions> {
    let device = device("actor.device", &config.actor.device)?;
    Ok(TrainerOptions {
        device,
        bf16_autocast: config.actor.bf16_autocast,
    })
}

/// How a training step trades memory for time (`actor.recompute_layers`; the chunk sizes keep trainer's
/// defaults).
pub fn memory_config(config: &RunConfig) -> trainer::MemoryConfig {
    trainer::MemoryConfig {
        recompute_layers: config.actor.recompute_layers,
        ..trainer::MemoryConfig::default()
    }
}

/// The trainer's GRPO settings: the `actor` section's objective, optimiser, schedule (its step counts are
/// set when the loop begins) and micro-batching, and `gconfig.temperature` as the temperature of the
/// sequences that record none (every exported token records its own, at which the trainer scores it).
pub fn train_config(config: &RunConfig) -> TrainConfig {
    let a = &config.actor;
    // Greedy sampling reports the untempered log-probabilities.
    let temperature = if config.gconfig.temperature > 0.0 {
        config.gconfig.temperature
    } else {
        1.0
    };
    TrainConfig {
        schedule: LrSchedule {
            lr: a.lr,
            kind: match a.lr_scheduler_type {
                stream_config::LrSchedulerType::Constant => ScheduleKind::Constant,
                stream_config::LrSchedulerType::Linear => ScheduleKind::Linear,
                stream_config::LrSchedulerType::Cosine => ScheduleKind::Cosine,
            },
            warmup_steps: 0,
            total_steps: 1,
            min_lr_ratio: a.min_lr_ratio,
        },
        adamw: AdamWConfig {
            beta1: a.beta1,
            beta2: a.beta2,
            eps: a.adam_eps,
            weight_decay: a.weight_decay,
        },
        gradient_clipping: a.gradient_clipping,
        max_tokens_per_mb: usize::try_from(a.max_tokens_per_mb).unwrap_or(usize::MAX),
        aggregation: match a.loss_agg_mode {
            stream_config::LossAggMode::TokenMean => LossAggregation::TokenMean,
            stream_config::LossAggMode::SeqMeanTokenMean => LossAggregation::SeqMeanTokenMean,
        },
        ppo: ppo_config(config, temperature),
    }
}

fn ppo_config(config: &RunConfig, temperature: f64) -> PpoConfig {
    let a = &config.actor;
    PpoConfig {
        eps_clip: a.eps_clip,
        eps_clip_higher: a.eps_clip_higher,
        c_clip: a.c_clip,
        use_decoupled_loss: a.use_decoupled_loss,
        recompute_logprob: a.recompute_logprob,
        behav_imp_weight_cap: a.behav_imp_weight_cap,
        kl_ctl: a.kl_ctl,
        kl_estimator: match a.kl_estimator {
            stream_config::KlEstimator::K1 => KlEstimator::K1,
            stream_config::KlEstimator::K2 => KlEstimator::K2,
            stream_config::KlEstimator::K3 => KlEstimator::K3,
        },
        entropy_coeff: a.entropy_coeff,
        adv_norm: a.adv_norm.as_ref().map(adv_norm),
        temperature,
    }
}

#[cfg(test)]
mod tests;
