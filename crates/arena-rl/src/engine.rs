//! The burn policy as the proxy's inference engine: [`PolicyEngine`] wraps `trainer::Policy` and implements
//! `rollout_proxy::InferenceEngine`, so the proxy and `arena-rl serve-policy` serve it without naming burn.
//!
//! Weight updates from disk (`update_weights_from_disk`, also reachable over SGLang's HTTP protocol through
//! `generate_router`) load a Hugging Face folder with `trainer::Weights::load_dir` and swap it in between two
//! decoding steps; sequences in flight continue, their later tokens carrying the new version.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::future::BoxFuture;
use rollout_proxy::{
    EngineError, EngineEvent, FinishReason, GenerateRequest, InferenceEngine, PauseMode, SampledToken,
    TokenStream, WeightUpdate,
};
use trainer::{
    DeviceKind, GenerationEvent, GenerationRequest, InferenceDtype, Policy, PolicyOptions, Weights,
};

/// `trainer::Policy` as an [`InferenceEngine`]. Cloning shares the policy.
#[derive(Clone, Debug)]
pub struct PolicyEngine {
    policy: Policy,
    /// When set, weight updates from disk load only folders under this (canonical) directory.
    weights_root: Option<PathBuf>,
}

impl PolicyEngine {
    /// Wraps a loaded policy.
    pub fn new(policy: Policy) -> Self {
        Self {
            policy,
            weights_root: None,
        }
    }

    /// Loads weight updates from disk only from folders under `root` (after resolving symlinks and `..`), as
    /// `arena-rl serve-policy --weights-root` does: whoever may ask for an update names a path, and the
    /// server must not read any file it can. `root` must be an existing directory.
    pub fn with_weights_root(mut self, root: &Path) -> crate::Result<Self> {
        let canonical = root.canonicalize().ok().filter(|r| r.is_dir()).ok_or_else(|| {
            crate::Error::Invalid(format!(
                "the weights root {} is not an existing directory",
                root.display()
            ))
        })?;
        self.weights_root = Some(canonical);
        Ok(self)
    }

    /// The folder an update names, resolved, when it is under the weights root (or there is none).
    fn weights_path(&self, path: &Path) -> Result<PathBuf, EngineError> {
        let Some(root) = &self.weights_root else {
            return Ok(path.to_path_buf());
        };
        let outside = || {
            EngineError::InvalidRequest(format!(
                "{} is not a folder under the weights root {}: this server loads weights only from there",
                path.display(),
                root.display()
            ))
        };
        let resolved = path.canonicalize().map_err(|_| outside())?;
        if resolved.starts_with(root) {
            Ok(resolved)
        } else {
            Err(outside())
        }
    }

    /// Loads the Hugging Face folder `dir` onto `device`, decoding at most `max_batch` sequences together.
    /// A device this build or machine cannot use (CUDA without the `cuda` feature, or without a driver) is
    /// one error naming it.
    pub fn load(dir: &Path, max_batch: usize, device: DeviceKind) -> crate::Result<Self> {
        Self::load_as(dir, max_batch, device, InferenceDtype::F32)
    }

    /// [`PolicyEngine::load`] with the weight matrices in `dtype` (bf16 needs a CUDA device).
    pub fn load_as(
        dir: &Path,
        max_batch: usize,
        device: DeviceKind,
        dtype: InferenceDtype,
    ) -> crate::Result<Self> {
        Self::load_with(
            dir,
            PolicyOptions {
                max_batch,
                device,
                dtype,
                ..PolicyOptions::default()
            },
        )
    }

    /// [`PolicyEngine::load`] with every option of the policy (the key/value cache's budget among them).
    pub fn load_with(dir: &Path, options: PolicyOptions) -> crate::Result<Self> {
        use crate::error::Context as _;
        let (device, dtype) = (options.device, options.dtype);
        let policy = Policy::load(dir, options).with_context(|| {
            format!(
                "cannot load the policy from {} onto {device} in {dtype}",
                dir.display()
            )
        })?;
        Ok(Self::new(policy))
    }

    /// The wrapped policy (for the trainer, which swaps weights in directly).
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The version new tokens are sampled with.
    pub fn version(&self) -> u64 {
        self.policy.version()
    }

    /// Installs `weights` as `version` between two decoding steps.
    pub async fn swap(&self, weights: Weights, version: u64) -> Result<u64, EngineError> {
        let receipt = self
            .policy
            .swap_weights(weights, version)
            .map_err(|e| EngineError::Internal(format!("weight swap refused: {e}")))?;
        receipt
            .installed()
            .await
            .map_err(|e| EngineError::Internal(format!("weight swap failed: {e}")))
    }
}

fn version_u32(version: u64) -> u32 {
    u32::try_from(version).unwrap_or(u32::MAX)
}

impl InferenceEngine for PolicyEngine {
    fn generate(&self, request: GenerateRequest) -> TokenStream {
        let sampling = &request.sampling;
        let params = trainer::SamplingParams {
            temperature: sampling.temperature,
            top_p: sampling.top_p,
            top_k: sampling.top_k.map_or(0, |k| k as usize),
            seed: sampling.seed,
        };
        let submitted = self.policy.submit(GenerationRequest {
            input_ids: request.input_ids.to_vec(),
            sampling: params,
            stop_token_ids: sampling.stop_token_ids.clone(),
            max_new_tokens: sampling.max_new_tokens as usize,
        });
        let stop_ids = sampling.stop_token_ids.clone();
        match submitted {
            Err(e) => Box::pin(futures::stream::once(async move {
                Err(EngineError::InvalidRequest(e.to_string()))
            })),
            Ok(stream) => {
                let state = (stream, None::<u32>, false);
                Box::pin(futures::stream::unfold(state, move |(mut stream, last, done)| {
                    let stop_ids = stop_ids.clone();
                    async move {
                        if done {
                            return None;
                        }
                        match stream.recv().await {
                            Some(GenerationEvent::Token {
                                token_id,
                                logprob,
                                version,
                            }) => Some((
                                Ok(EngineEvent::Token(SampledToken {
                                    id: token_id,
                                    logprob,
                                    version: version_u32(version),
                                })),
                                (stream, Some(token_id), false),
                            )),
                            Some(GenerationEvent::Finished { reason, .. }) => {
                                let finish = match reason {
                                    trainer::FinishReason::Stop => FinishReason::Stop {
                                        matched: last.filter(|t| stop_ids.contains(t)),
                                    },
                                    trainer::FinishReason::Length => FinishReason::Length,
                                };
                                Some((Ok(EngineEvent::Finished(finish)), (stream, last, true)))
                            }
                            None => Some((
                                Err(EngineError::Internal("the policy engine stopped".to_string())),
                                (stream, last, true),
                            )),
                        }
                    }
                }))
            }
        }
    }

    fn max_context_len(&self) -> usize {
        self.policy.config().max_position_embeddings
    }

    fn update_weights_from_disk(&self, update: WeightUpdate) -> BoxFuture<'_, Result<(), EngineError>> {
        Box::pin(async move {
            let path = self.weights_path(&update.path)?;
            let weights = tokio::task::spawn_blocking(move || Weights::load_dir(&path))
                .await
                .map_err(|e| EngineError::Internal(format!("weight loading panicked: {e}")))?
                .map_err(|e| {
                    EngineError::InvalidRequest(format!(
                        "cannot load weights from {}: {e}",
                        update.path.display()
                    ))
                })?;
            weights
                .check_against(self.policy.config())
                .map_err(|e| EngineError::InvalidRequest(format!("{}: {e}", update.path.display())))?;
            let version = update
                .version
                .map_or_else(|| self.policy.version() + 1, u64::from);
            self.swap(weights, version).await.map(|_| ())
        })
    }

    fn flush_cache(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        // The policy keeps no prefix cache across requests: there is nothing to drop.
        Box::pin(async { Ok(()) })
    }

    /// Holds the engine between decoding steps (`trainer::Policy::pause`); every mode holds alike, since
    /// aborting is the server's business and this engine keeps each sequence's cache either way.
    fn pause(&self, _mode: PauseMode) -> BoxFuture<'_, Result<(), EngineError>> {
        let result = self
            .policy
            .pause()
            .map_err(|e| EngineError::Internal(format!("pausing the policy: {e}")));
        Box::pin(async move { result })
    }

    fn resume(&self) -> BoxFuture<'_, Result<(), EngineError>> {
        let result = self
            .policy
            .resume()
            .map_err(|e| EngineError::Internal(format!("resuming the policy: {e}")));
        Box::pin(async move { result })
    }
}

/// Shares an engine as the proxy takes it.
pub fn shared(engine: PolicyEngine) -> Arc<dyn InferenceEngine> {
    Arc::new(engine)
}
