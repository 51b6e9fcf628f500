//! `arena-rl serve-policy --model DIR --host H --port P`: serves the burn policy over SGLang's HTTP protocol
//! (`rollout_proxy::GenerateServer`, which follows SGLang's contract: cumulative streams unless
//! `--incremental-streaming-output`, string weight versions, pause and continue around updates from disk),
//! for runs whose proxy reaches policies on other nodes through `rollout.policy_servers`.
//!
//! It listens before it loads the model, answering `/health` with 503 until the model is in memory, as a
//! starting SGLang server does. The API key (SGLang's `--api-key`) comes from the environment variable
//! `ARENA_RL_POLICY_API_KEY`, never from the command line; without one it refuses to listen beyond
//! loopback. Weight updates load only folders under `--weights-root`. Runs until SIGTERM or Ctrl-C.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use arena_rl::engine::PolicyEngine;
use arena_rl::run::settings::POLICY_API_KEY_ENV;
use rollout_proxy::{GenerateServer, GenerateServerConfig, InferenceEngine, ProxyServer};
use secrecy::SecretString;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The Hugging Face model folder (config.json, safetensors).
    #[arg(long)]
    model: PathBuf,
    /// The directory weight updates may load from (`/update_weights_from_disk` names a folder under it, after
    /// symlinks are resolved): the run's shared file root, where the trainer publishes them.
    #[arg(long)]
    weights_root: PathBuf,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// Memory the key/value cache may take, in bytes (f32 keys and values: 2 x layers x key/value heads x
    /// head_dim x 4 bytes a token). Requests wait while the batch would outgrow it, the newest sequences
    /// are set aside and resumed unchanged when it is full, and a prompt it cannot hold is refused.
    #[arg(long, default_value_t = trainer::DEFAULT_KV_CACHE_BYTES)]
    kv_cache_bytes: u64,
    /// The device: `cpu`, `cuda` (the first GPU) or `cuda:N` (needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: trainer::DeviceKind,
    /// The weight matrices' element type: `f32`, or `bf16` (CUDA only; half the memory, the dtype
    /// checkpoints ship in).
    #[arg(long, default_value = "f32")]
    dtype: trainer::InferenceDtype,
    /// Stream only the new tokens in each `/generate` chunk (SGLang's `--incremental-streaming-output`);
    /// chunks are cumulative otherwise, SGLang's default.
    #[arg(long)]
    incremental_streaming_output: bool,
    /// The context length to serve and report in `/get_server_info` (SGLang's `--context-length`); by
    /// default the model's `max_position_embeddings` is in force and `/get_server_info` reports null. More
    /// than the model's window is refused once the model is loaded, as SGLang refuses it.
    #[arg(long)]
    context_length: Option<usize>,
}

pub(crate) fn run(args: Args) -> Result<()> {
    super::train::init_logging();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async {
        args.device
            .check()
            .with_context(|| format!("--device {}", args.device))?;
        args.dtype
            .check_on(args.device)
            .with_context(|| format!("--dtype {} on --device {}", args.dtype, args.device))?;
        let api_key = std::env::var(POLICY_API_KEY_ENV)
            .ok()
            .filter(|k| !k.is_empty())
            .map(SecretString::from);
        if api_key.is_none() && !args.host.is_loopback() {
            anyhow::bail!(
                "--host {} is not a loopback address and {POLICY_API_KEY_ENV} is not set: anyone who reached \
                 the port could generate, pause and load weights; set {POLICY_API_KEY_ENV} or listen on 127.0.0.1",
                args.host
            );
        }
        let weights_root = args.weights_root.clone();
        if !weights_root.is_dir() {
            anyhow::bail!(
                "--weights-root {} is not an existing directory",
                weights_root.display()
            );
        }
        let server = GenerateServer::new(GenerateServerConfig {
            incremental_streaming_output: args.incremental_streaming_output,
            api_key,
            context_length: args.context_length,
            ..GenerateServerConfig::default()
        });
        let addr = SocketAddr::new(args.host, args.port);
        let listening = ProxyServer::serve_router(addr, server.router())
            .await
            .with_context(|| format!("cannot listen on {addr} (--host, --port); is the port taken?"))?;
        println!(
            "policy server listening on http://{} (loading the model)",
            listening.local_addr()
        );
        let model = args.model.clone();
        let options = trainer::PolicyOptions {
            max_batch: args.max_batch,
            kv_cache_bytes: args.kv_cache_bytes,
            device: args.device,
            dtype: args.dtype,
            ..trainer::PolicyOptions::default()
        };
        let engine = tokio::task::spawn_blocking(move || {
            PolicyEngine::load_with(&model, options)?.with_weights_root(&weights_root)
        })
        .await
        .context("loading the policy")??;
        // As SGLang refuses to start (`python/sglang/srt/configs/model_config.py`, `_derive_context_length`):
        // a window the model does not have would let the proxy send prompts past its positions.
        if let Some(asked) = args.context_length
            && asked > engine.max_context_len()
        {
            anyhow::bail!(
                "--context-length {asked} is greater than the context window of the model in {} ({} tokens, \
                 max_position_embeddings in its config.json)",
                args.model.display(),
                engine.max_context_len()
            );
        }
        let engine: Arc<dyn InferenceEngine> = Arc::new(engine);
        server.install(engine);
        say("policy server ready: the model is loaded");
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("listening for Ctrl-C")?,
            _ = term.recv() => {}
        }
        listening.shutdown().await?;
        Ok(())
    })
}

fn say(line: &str) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}
