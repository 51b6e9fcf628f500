//! The `arena-sim` binary: serves a YAML world on a socket until interrupted.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use arena_sim::{ArenaSim, World};
use clap::Parser;

/// A real Arena on loopback: serves the OpenAPI control plane and the LLM gateway of a YAML world.
#[derive(Parser)]
#[command(name = "arena-sim", version)]
struct Args {
    /// The world to serve (YAML); without it (and without --preset), an empty world.
    #[arg(long, conflicts_with = "preset")]
    world: Option<PathBuf>,
    /// A built-in world instead of a file.
    #[arg(long, value_enum)]
    preset: Option<Preset>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1:0")]
    bind: SocketAddr,
}

/// The built-in worlds.
#[derive(Clone, Copy, clap::ValueEnum)]
enum Preset {
    /// The quickstart's two streams (Anthropic and Chat Completions harnesses) and grader.
    Quickstart,
}

#[tokio::main]
async fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let world = match (&args.world, args.preset) {
        (Some(path), _) => World::from_file(path)?,
        (None, Some(Preset::Quickstart)) => World::quickstart(),
        (None, None) => World::default(),
    };
    let sim = ArenaSim::builder(world)
        .bind(args.bind)
        .start()
        .await
        .context("starting arena-sim")?;
    // The first stdout line is the base URL, so scripts can read where the sim listens.
    println!("{}", sim.base_url());
    tokio::signal::ctrl_c().await.context("waiting for ctrl-c")?;
    sim.shutdown().await;
    Ok(())
}
