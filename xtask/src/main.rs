//! `cargo xtask`: the project's automation, in Rust.
//!
//! `cargo xtask test` is the one test command of the README: it prepares the test fixtures (virtualenvs with
//! pinned Python packages, npm CLIs, converted models) in a cache outside the checkout, then runs the whole
//! Rust suite, in which the real-client suites are ordinary integration tests that find those fixtures
//! through environment variables.
//!
//! `cargo xtask submit` launches a run on a Slurm cluster (see `submit.rs` and docs/slurm.md).

mod fixtures;
mod submit;
#[cfg(test)]
mod tidy;

use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "arena-rl project automation")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Prepare the test fixtures, then run the whole test suite (nextest when installed, else cargo test).
    Test {
        /// Skip fixture preparation (tests that need a fixture then fail and say which one).
        #[arg(long)]
        no_fixtures: bool,
        /// Extra arguments passed to `cargo nextest run` / `cargo test` (after `--`).
        #[arg(last = true)]
        args: Vec<String>,
    },
    /// Prepare the test fixtures and print the environment variables that point tests at them.
    Fixtures,
    /// Validate the launch environment, render the Slurm scripts and submit the controller (docs/slurm.md).
    Submit(submit::SubmitArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Cmd::Test { no_fixtures, args } => test(no_fixtures, &args),
        Cmd::Fixtures => {
            for (key, value) in fixtures::prepare_all()? {
                println!("export {key}={}", shell_quote(&value));
            }
            Ok(())
        }
        Cmd::Submit(args) => submit::run(args),
    }
}

fn test(no_fixtures: bool, args: &[String]) -> Result<()> {
    let env = if no_fixtures {
        Vec::new()
    } else {
        fixtures::prepare_all()?
    };
    let nextest = Command::new("cargo")
        .args(["nextest", "--version"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    let mut cmd = Command::new("cargo");
    if nextest {
        cmd.args(["nextest", "run", "--workspace", "--no-fail-fast"]);
    } else {
        cmd.args(["test", "--workspace", "--no-fail-fast"]);
    }
    cmd.args(args).envs(env);
    eprintln!("xtask: running {cmd:?}");
    let status = cmd.status().context("running cargo")?;
    if !status.success() {
        bail!("tests failed ({status})");
    }
    Ok(())
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}
