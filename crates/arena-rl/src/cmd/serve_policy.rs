//! `arena-rl serve-policy --model DIR --host H --port P`: serves the burn policy over SGLang's `/generate`
//! protocol (`rollout_proxy::generate_router`), with weight updates from disk (`/update_weights_from_disk`),
//! for runs whose proxy reaches policies on other nodes through `rollout.policy_servers`. Runs until SIGTERM
//! or Ctrl-C.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, Result};
use arena_rl::engine::PolicyEngine;
use rollout_proxy::{InferenceEngine, ProxyServer, generate_router};

#[derive(clap::Args)]
pub(crate) struct Args {
    /// The Hugging Face model folder (config.json, safetensors).
    #[arg(long)]
    model: PathBuf,
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// The port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 30000)]
    port: u16,
    /// Most sequences decoded together.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
    /// The device: `cpu`, `cuda` (the first GPU) or `cuda:N` (needs a build with `--features cuda`).
    #[arg(long, default_value = "cpu")]
    device: trainer::DeviceKind,
    /// The weight matrices' element type: `f32`, or `bf16` (CUDA only; half the memory, the dtype
    /// checkpoints ship in).
    #[arg(long, default_value = "f32")]
    dtype: trainer::InferenceDtype,
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
        let engine = PolicyEngine::load_as(&args.model, args.max_batch, args.device, args.dtype)?;
        let engine: Arc<dyn InferenceEngine> = Arc::new(engine);
        let addr = SocketAddr::new(args.host, args.port);
        let server = ProxyServer::serve_router(addr, generate_router(engine))
            .await
            .with_context(|| format!("cannot listen on {addr} (--host, --port); is the port taken?"))?;
        println!("policy server listening on http://{}", server.local_addr());
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .context("listening for SIGTERM")?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.context("listening for Ctrl-C")?,
            _ = term.recv() => {}
        }
        server.shutdown().await?;
        Ok(())
    })
}
