//! [`Fsdp2Engine`]: the training engine of `actor.backend: fsdp2`, a PyTorch FSDP2 worker in other
//! processes (`fsdp2-trainer`), driven through the `arena-rl-trainer/1` protocol.
//!
//! What the burn engine computes before its forward passes is computed here with the same `trainer`
//! functions and written into the batch file: each sequence's advantage after `adv_norm`
//! (`trainer::normalized_advantages`) and its tokens' aggregation weight (`trainer::token_weights`), so the
//! worker applies them as given and there is one definition of both. Tokens that record no temperature get
//! `gconfig.temperature`, as the burn engine scores them. The worker's statistics become a
//! `trainer::StepStats`, so the metric names are the same. New weights are always a Hugging Face folder
//! under `<run dir>/weights/step-N` (f32, or bf16 under `actor.bf16_autocast`), which the in-process policy
//! and policy servers load from disk; the engine's state in a checkpoint is the worker's sharded
//! `torch.distributed.checkpoint` folder in `<checkpoint>/trainer`, which loads at another world size.

use std::path::{Path, PathBuf};

use fsdp2_trainer::protocol::{Dtype, InitRequest, ModelInfo};
use fsdp2_trainer::{Attached, Batch, Client, LaunchConfig, Sequence, StepKind, Worker};
use secrecy::SecretString;
use stream_config::{Env, Fsdp2Config, RunConfig};
use trainer::{RlBatch, TrainConfig};

use super::burn::{keep_newest, not_begun};
use super::engine::TrainEngine;
use super::{NewWeights, TrainBatch, to_rl_batch};
use crate::error::{Context as _, Error, Result};
use crate::run::settings;

/// The worker, started here or attached to.
enum Connection {
    Launched(Worker),
    Attached(Client, Attached),
}

impl Connection {
    fn parts(&mut self) -> (&Client, &mut dyn fsdp2_trainer::Watch) {
        match self {
            Self::Launched(w) => w.parts(),
            Self::Attached(c, watch) => (c, watch),
        }
    }
}

/// The FSDP2 worker behind the seam.
pub struct Fsdp2Engine {
    model_dir: PathBuf,
    run_dir: PathBuf,
    config: TrainConfig,
    warmup_steps_proportion: f64,
    settings: Fsdp2Config,
    param_dtype: Dtype,
    /// What `publish` writes: `rollout.weights_dtype`, or the parameter dtype when it is null.
    publish_dtype: Dtype,
    /// `rollout.weights_shard_bytes` (the worker's 4 GiB when null).
    publish_shard_bytes: Option<u64>,
    activation_checkpointing: bool,
    seed: u64,
    key: SecretString,
    /// Extra environment for a launched worker (`actor.device: cpu` keeps it off the GPUs; tests put the
    /// worker's package on `PYTHONPATH`).
    env: Vec<(String, String)>,
    connection: Option<Connection>,
    /// Optimiser steps the worker has completed.
    steps: u64,
    model: Option<ModelInfo>,
}

impl std::fmt::Debug for Fsdp2Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fsdp2Engine")
            .field("model_dir", &self.model_dir)
            .field("run_dir", &self.run_dir)
            .field("steps", &self.steps)
            .finish_non_exhaustive()
    }
}

impl Fsdp2Engine {
    /// The engine a run config describes: `model.path`, the trainer's settings ([`settings::train_config`],
    /// the same as burn's), `actor.fsdp2`, and the key from `ARENA_RL_TRAINER_API_KEY` in `env` (a fresh
    /// random one when unset and the worker is started here). Nothing starts until [`TrainEngine::begin`].
    pub fn from_run_config(config: &RunConfig, run_dir: &Path, env: &Env) -> Result<Self> {
        let given = env
            .get(fsdp2_trainer::API_KEY_ENV)
            .filter(|k| !k.is_empty())
            .map(|k| SecretString::from(k.to_string()));
        if config.actor.fsdp2.attach.is_some() && given.is_none() {
            return Err(Error::Invalid(format!(
                "actor.fsdp2.attach needs the worker's key in {}",
                fsdp2_trainer::API_KEY_ENV
            )));
        }
        std::fs::create_dir_all(run_dir).with_context(|| format!("cannot create {}", run_dir.display()))?;
        let run_dir = run_dir
            .canonicalize()
            .with_context(|| format!("cannot resolve {}", run_dir.display()))?;
        let param_dtype = if config.actor.bf16_autocast {
            Dtype::Bf16
        } else {
            Dtype::F32
        };
        Ok(Self {
            model_dir: PathBuf::from(&config.model.path),
            run_dir,
            config: settings::train_config(config),
            warmup_steps_proportion: config.actor.warmup_steps_proportion,
            settings: config.actor.fsdp2.clone(),
            param_dtype,
            publish_dtype: match config.rollout.weights_dtype.as_deref() {
                Some("bf16") => Dtype::Bf16,
                Some(_) => Dtype::F32,
                None => param_dtype,
            },
            publish_shard_bytes: config.rollout.weights_shard_bytes,
            activation_checkpointing: config.actor.recompute_layers,
            // The worker draws no random numbers in a step (no dropout, deterministic packing); the seed is for
            // anything it may add.
            seed: 1,
            key: fsdp2_trainer::api_key(given),
            env: if config.actor.device == "cpu" {
                vec![("ARENA_RL_TRAINER_DEVICE".to_string(), "cpu".to_string())]
            } else {
                Vec::new()
            },
            connection: None,
            steps: 0,
            model: None,
        })
    }

    /// Adds environment for a worker this engine starts.
    pub fn with_worker_env(mut self, env: Vec<(String, String)>) -> Self {
        self.env.extend(env);
        self
    }

    fn connection(&mut self) -> Result<&mut Connection> {
        self.connection.as_mut().ok_or_else(not_begun)
    }

    fn connect(&self) -> Result<Connection> {
        match &self.settings.attach {
            Some(addr) => {
                let client = Client::new(addr.clone(), self.key.clone());
                client
                    .wait_ready(self.settings.ready_timeout_seconds.duration(), &mut Attached)
                    .with_context(|| {
                        format!("attaching to the fsdp2 worker at {addr} (actor.fsdp2.attach)")
                    })?;
                Ok(Connection::Attached(client, Attached))
            }
            None => {
                let mut launch = LaunchConfig::python(
                    self.settings.python.clone(),
                    self.settings.nproc_per_node,
                    self.run_dir.clone(),
                );
                launch.env = self.env.clone();
                launch.ready_timeout = self.settings.ready_timeout_seconds.duration();
                let worker = Worker::launch(&launch, self.key.clone())
                    .context("starting the fsdp2 worker (actor.fsdp2)")?;
                Ok(Connection::Launched(worker))
            }
        }
    }

    /// The batch file of a GRPO step: the trainer's input with the advantages normalised and the
    /// aggregation weights computed, by the functions the burn engine uses.
    pub fn grpo_batch(config: &TrainConfig, rl: &RlBatch, step: u64) -> Result<Batch> {
        let adv =
            trainer::normalized_advantages(rl, config.ppo.adv_norm.as_ref()).context("actor.adv_norm")?;
        let counts: Vec<usize> = rl
            .sequences
            .iter()
            .map(|s| s.loss_mask.iter().filter(|&&m| m).count())
            .collect();
        let weights = trainer::token_weights(&counts, config.aggregation);
        let default_temperature = config.ppo.temperature as f32;
        let sequences = rl
            .sequences
            .iter()
            .zip(adv.iter().zip(&weights))
            .map(|(s, (&advantage, &weight))| {
                let n = s.tokens.len();
                Sequence {
                    tokens: s.tokens.clone(),
                    loss_mask: s.loss_mask.clone(),
                    logprobs: s.logprobs.clone(),
                    versions: s.versions.clone(),
                    temperatures: if s.temperatures.is_empty() {
                        vec![default_temperature; n]
                    } else {
                        s.temperatures.clone()
                    },
                    truncated: if s.truncated.is_empty() {
                        vec![false; n]
                    } else {
                        s.truncated.clone()
                    },
                    advantage: advantage as f32,
                    weight,
                }
            })
            .collect::<Vec<_>>();
        let group_sizes = if rl.group_sizes.is_empty() {
            vec![sequences.len() as u64]
        } else {
            rl.group_sizes.iter().map(|&g| g as u64).collect()
        };
        Ok(Batch {
            kind: StepKind::Grpo,
            step,
            policy_version: rl.policy_version,
            sequences,
            group_sizes,
        })
    }

    fn batch_path(&self, step: u64) -> PathBuf {
        self.run_dir
            .join("trainer")
            .join("batches")
            .join(format!("step-{step}.safetensors"))
    }
}

/// The worker's statistics as the trainer's, so the metric names are the same.
pub fn step_stats(step: u64, s: &fsdp2_trainer::Stats) -> trainer::StepStats {
    let range = |r: &Option<fsdp2_trainer::Range>| {
        r.map(|r| trainer::train::Range {
            min: r.min,
            mean: r.mean,
            max: r.max,
        })
    };
    trainer::StepStats {
        step,
        loss: s.loss,
        lr: s.lr,
        grad_norm: s.grad_norm,
        sequences: s.sequences as usize,
        tokens: s.tokens as usize,
        forward_tokens: s.forward_tokens as usize,
        micro_batches: s.micro_batches as usize,
        entropy: s.entropy,
        clip_fraction: s.clip_fraction,
        dual_clip_fraction: s.dual_clip_fraction,
        approx_kl: s.approx_kl,
        ref_kl: s.ref_kl,
        importance_weight: range(&s.importance_weight),
        behave_imp_weight: range(&s.behave_imp_weight),
        behave_dropped_fraction: s.behave_dropped_fraction,
        advantage: range(&s.advantage),
        staleness: range(&s.staleness),
        behave_logprob_drift: range(&s.behave_logprob_drift),
        behave_logprob_drift_truncated: range(&s.behave_logprob_drift_truncated),
        seconds: s.seconds,
    }
}

impl TrainEngine for Fsdp2Engine {
    fn begin(&mut self, total_steps: u64) -> Result<()> {
        let mut config = self.config.clone();
        config.schedule.total_steps = total_steps.max(1);
        config.schedule.warmup_steps = (self.warmup_steps_proportion * total_steps as f64) as u64;
        let mut connection = self.connect()?;
        let (client, watch) = connection.parts();
        let hello = client.hello().context("fsdp2 worker hello")?;
        tracing::info!(
            torch = %hello.torch,
            transformers = %hello.transformers,
            world_size = hello.world_size,
            device = %hello.device,
            "fsdp2 worker answered"
        );
        let request = InitRequest {
            protocol: fsdp2_trainer::PROTOCOL,
            model_path: self
                .model_dir
                .canonicalize()
                .with_context(|| format!("cannot resolve model.path {}", self.model_dir.display()))?,
            train: serde_json::to_value(&config).context("serialising the train config")?,
            total_steps: config.schedule.total_steps,
            param_dtype: self.param_dtype,
            reduce_dtype: Dtype::F32,
            activation_checkpointing: self.activation_checkpointing,
            logprob_chunk_tokens: self.settings.logprob_chunk_tokens,
            seed: self.seed,
        };
        let init = client
            .init(&request, watch)
            .with_context(|| format!("loading {} into the fsdp2 worker", self.model_dir.display()))?;
        client
            .expect_model(&self.model_dir, &init.model)
            .context("checking the fsdp2 worker's model against model.path")?;
        tracing::info!(
            model = %self.model_dir.display(),
            parameters = init.model.parameters,
            world_size = hello.world_size,
            total_steps,
            "fsdp2 GRPO trainer ready"
        );
        self.steps = init.step;
        self.model = Some(init.model);
        self.connection = Some(connection);
        Ok(())
    }

    fn grpo_step(&mut self, step: u64, batch: &TrainBatch) -> Result<trainer::StepStats> {
        let rl = to_rl_batch(batch);
        let completed = self.steps;
        let file = Self::grpo_batch(&self.config, &rl, completed)?;
        let path = self.batch_path(completed);
        let (client, watch) = self.connection()?.parts();
        let result = client
            .step(&file, &path, watch)
            .with_context(|| format!("GRPO step {step}"))?;
        // The previous batch can no longer be replayed; this one can, until the next step succeeds.
        if let Some(previous) = completed.checked_sub(1) {
            let _ = std::fs::remove_file(self.batch_path(previous));
        }
        self.steps = result.step;
        Ok(step_stats(result.step, &result.stats))
    }

    fn weights(&mut self) -> Result<NewWeights> {
        let dir = self.run_dir.join("weights");
        let out = dir.join(format!("step-{}", self.steps));
        let (dtype, shard_bytes) = (self.publish_dtype, self.publish_shard_bytes);
        let (client, watch) = self.connection()?.parts();
        let published = client
            .publish_sharded(&out, dtype, shard_bytes, watch)
            .with_context(|| format!("publishing the fsdp2 trainer's weights to {}", out.display()))?;
        keep_newest(&dir, 2)?;
        Ok(NewWeights::OnDisk(published.path))
    }

    fn save(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("trainer");
        let (client, watch) = self.connection()?.parts();
        client.save(&path, watch).with_context(|| {
            format!(
                "saving the fsdp2 trainer into {} (checkpoint.dir must be inside the run folder)",
                path.display()
            )
        })?;
        Ok(())
    }

    fn load(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("trainer");
        let (client, watch) = self.connection()?.parts();
        let loaded = client
            .load(&path, watch)
            .with_context(|| format!("restoring the fsdp2 trainer from {}", path.display()))?;
        self.steps = loaded.step;
        Ok(())
    }
}
