//! The one place `cargo xtask submit` reads the process environment and the facts of the moment (time, pid,
//! host), so that tests pass a map and fixed values instead.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

/// Launch-time environment variables; an empty value counts as unset, as `${VAR:-default}` does in the
/// reference's scripts.
///
/// It wraps `stream-config`'s environment, so the run config is checked against the same variables.
#[derive(Debug, Clone, Default)]
pub(crate) struct Env(stream_config::Env);

impl Env {
    /// The process environment (variables whose name or value is not UTF-8 are skipped: none of ours is).
    pub(crate) fn from_process() -> Self {
        Self(stream_config::Env::from_process())
    }

    pub(crate) fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).filter(|v| !v.is_empty())
    }

    /// Every variable, empty ones included.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter()
    }
}

impl<K: Into<String>, V: Into<String>> FromIterator<(K, V)> for Env {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> Self {
        Self(stream_config::Env::from_pairs(iter))
    }
}

/// When, where and by which process a submission is rendered.
#[derive(Debug, Clone)]
pub(crate) struct Ctx {
    /// Local time as `YYYYmmdd-HHMMSS`, for the default `TRIAL_NAME`.
    pub(crate) timestamp: String,
    pub(crate) pid: u32,
    pub(crate) host: String,
    /// The checkout `cargo xtask` runs from: the default `AREAL_DIR`.
    pub(crate) checkout: PathBuf,
}

impl Ctx {
    pub(crate) fn current() -> Result<Self> {
        let out = Command::new("date")
            .arg("+%Y%m%d-%H%M%S")
            .output()
            .context("running date")?;
        if !out.status.success() {
            bail!("date +%Y%m%d-%H%M%S failed ({})", out.status);
        }
        let timestamp = String::from_utf8_lossy(&out.stdout).trim().to_string();
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown-host".into());
        let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = manifest.parent().expect("xtask lives in the workspace root");
        // The physical path, as the reference resolves its checkout before sbatch copies the script.
        let checkout = root
            .canonicalize()
            .with_context(|| format!("resolving the checkout {}", root.display()))?;
        Ok(Self {
            timestamp,
            pid: std::process::id(),
            host,
            checkout,
        })
    }
}
