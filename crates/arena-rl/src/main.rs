//! The `arena-rl` command line: train, roll out, serve and inspect, against Arena or `arena-sim`.

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "arena-rl",
    version,
    about = "Reinforcement learning for LLM coding agents against Arena"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {}

#[expect(unreachable_code, reason = "the first commands land with stream-config")]
fn main() -> Result<()> {
    match Cli::parse().command {}
}
