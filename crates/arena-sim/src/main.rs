//! The `arena-sim` binary: serves a YAML world on a socket until interrupted.
//!
//! `ARENA_SIM_TOKEN` and `ARENA_SIM_LLM_API_KEY`, when set, replace the world's control-plane token and gateway
//! key, so a script can serve a built-in world with credentials of its own without putting them on a command
//! line or in a file.

#![warn(clippy::too_many_lines)]

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use arena_sim::{ArenaSim, World};
use clap::Parser;

/// A real Arena on loopback: serves the OpenAPI control plane and the LLM gateway of a YAML world.
///
/// ARENA_SIM_TOKEN and ARENA_SIM_LLM_API_KEY, when set, replace the world's token and gateway key.
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
    /// The SmolLM2 run's stream of `sum` tasks (examples/configs/smollm2.yaml).
    Sums,
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
    let mut world = match (&args.world, args.preset) {
        (Some(path), _) => World::from_file(path)?,
        (None, Some(Preset::Quickstart)) => World::quickstart(),
        (None, Some(Preset::Sums)) => World::sums(),
        (None, None) => World::default(),
    };
    if let Some(token) = env_value("ARENA_SIM_TOKEN")? {
        world.token = token;
    }
    if let Some(key) = env_value("ARENA_SIM_LLM_API_KEY")? {
        world.llm_api_key = Some(key);
    }
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

/// A credential override from the environment: unset or empty means none; a value that is not UTF-8 is an
/// error naming the variable (never the value).
fn env_value(name: &str) -> Result<Option<String>> {
    match std::env::var(name) {
        Ok(v) if v.is_empty() => Ok(None),
        Ok(v) => Ok(Some(v)),
        Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => anyhow::bail!("{name} is not valid UTF-8"),
    }
}
