//! The engine that serves rollouts (the in-process burn policy, the fake engine, or a pool of SGLang-protocol
//! policy servers) and how a training step's new weights reach it.

use std::path::Path;
use std::sync::Arc;

use rollout_proxy::{
    ChatModel, EnginePool, FakeEngine, FakeEngineConfig, InferenceEngine, SglangEngine, WeightUpdate,
};
use stream_config::{Env, ModelEngine, RunConfig};

use crate::engine::PolicyEngine;
use crate::error::{Context as _, Error, Result};
use crate::train::NewWeights;

/// The engine that serves rollouts, and how new weights reach it.
#[derive(Clone)]
pub struct EngineHandle {
    /// What the proxy generates with.
    pub engine: Arc<dyn InferenceEngine>,
    /// The in-process policy, when there is one (in-memory weight swaps).
    pub policy: Option<PolicyEngine>,
    /// The pool of policy servers, when the engine is one (`rollout.policy_servers`), for its metrics.
    pub pool: Option<Arc<EnginePool>>,
}

impl EngineHandle {
    /// Installs `weights` as `version`.
    pub async fn publish(&self, weights: NewWeights, version: u64) -> Result<()> {
        match weights {
            NewWeights::Unchanged => Ok(()),
            NewWeights::InMemory(w) => {
                let Some(policy) = &self.policy else {
                    return Err(Error::Invalid(
                        "the training step returned weights in memory, but the policy runs on policy servers; \
                         it must save them to disk"
                            .into(),
                    ));
                };
                policy
                    .swap(w, version)
                    .await
                    .map(|_| ())
                    .with_context(|| format!("installing the weights of version {version}"))
            }
            NewWeights::OnDisk(path) => self
                .engine
                .update_weights_from_disk(WeightUpdate {
                    path: path.clone(),
                    version: u32::try_from(version).ok(),
                })
                .await
                .with_context(|| format!("cannot load the new weights from {}", path.display())),
        }
    }
}

/// The engine the config asks for: policy servers (`rollout.policy_servers`), else `model.engine`.
pub(crate) async fn build_engine(
    config: &RunConfig,
    env: &Env,
    model: &ChatModel,
    dir: &Path,
) -> Result<EngineHandle> {
    if !config.rollout.policy_servers.is_empty() {
        let mut engines: Vec<(String, Arc<dyn InferenceEngine>)> = Vec::new();
        let mut pause_mode = rollout_proxy::PauseMode::default();
        for url in &config.rollout.policy_servers {
            let server = super::settings::policy_server_config(config, env, url)?;
            pause_mode = server.pause_mode;
            let engine = SglangEngine::connect(server)
                .await
                .with_context(|| format!("cannot reach the policy server {url} (rollout.policy_servers)"))?;
            engines.push((url.clone(), Arc::new(engine)));
        }
        let pool = Arc::new(EnginePool::new(engines, pause_mode));
        return Ok(EngineHandle {
            engine: pool.clone(),
            policy: None,
            pool: Some(pool),
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
                pool: None,
            })
        }
        ModelEngine::Burn => {
            let dir = dir.to_path_buf();
            let options = trainer::PolicyOptions {
                max_batch: config.model.max_batch as usize,
                kv_cache_bytes: config.model.kv_cache_bytes,
                device: super::settings::policy_device(config)?,
                dtype: super::settings::policy_dtype(config)?,
                ..trainer::PolicyOptions::default()
            };
            let policy = tokio::task::spawn_blocking(move || PolicyEngine::load_with(&dir, options))
                .await
                .context("loading the policy")??;
            Ok(EngineHandle {
                engine: Arc::new(policy.clone()),
                policy: Some(policy),
                pool: None,
            })
        }
    }
}
