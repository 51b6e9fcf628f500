//! `cargo xtask submit --eval`: the GPU job runs `arena-rl eval` on a checkpoint instead of training.
//!
//! `arena-rl eval` runs the checkpoint inside its own process (it refuses `rollout.policy_servers`), so the
//! job is the trainer's node alone: no `serve-policy` replicas, no FSDP2 worker, no optimizer state. Its
//! flags mirror `arena-rl eval`'s; the paths are made absolute against the directory `xtask submit` runs in
//! and checked here, so a missing checkpoint fails on the login node in one line naming it.

use std::path::{Path, PathBuf};

use super::validate::Problems;

/// What `--eval` evaluates, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct EvalJob {
    /// A model folder, or a folder of `step-N` checkpoints (the newest).
    pub(crate) checkpoint: PathBuf,
    /// A second checkpoint to compare against.
    pub(crate) baseline: Option<PathBuf>,
    /// Samples per task (`k` of pass@k).
    pub(crate) samples: u32,
    /// The output folder; `None`: `<run dir>/eval`.
    pub(crate) out: Option<PathBuf>,
    /// A task manifest (a JSON file `arena-rl eval` checks).
    pub(crate) manifest: Option<PathBuf>,
    /// A Stream subset.
    pub(crate) streams: Vec<String>,
}

/// The `--eval` flags as given.
#[derive(Debug, Clone, Default)]
pub(crate) struct EvalFlags {
    pub(crate) checkpoint: Option<PathBuf>,
    pub(crate) baseline: Option<PathBuf>,
    pub(crate) samples: Option<u32>,
    pub(crate) out: Option<PathBuf>,
    pub(crate) manifest: Option<PathBuf>,
    pub(crate) streams: Vec<String>,
}

impl EvalFlags {
    /// Checks the flags, with relative paths taken under `cwd`; every problem is one line naming its flag.
    pub(crate) fn check(&self, cwd: &Path) -> Result<EvalJob, Problems> {
        let mut p = Problems::default();
        let abs = |path: &Path| cwd.join(path);
        let checkpoint = match &self.checkpoint {
            Some(c) => model_dir(&mut p, "--checkpoint", &abs(c)),
            None => {
                p.push("--eval needs --checkpoint DIR (a model folder or a folder of step-N checkpoints)");
                None
            }
        };
        let baseline = self
            .baseline
            .as_ref()
            .and_then(|b| model_dir(&mut p, "--baseline", &abs(b)));
        let manifest = self.manifest.as_ref().map(|m| abs(m));
        if let Some(m) = &manifest {
            if !m.is_file() {
                p.push(format!(
                    "--manifest {} does not exist or is not a file",
                    m.display()
                ));
            } else if let Err(e) = std::fs::File::open(m) {
                p.push(format!("--manifest {} is not readable: {e}", m.display()));
            }
        }
        for s in &self.streams {
            if s.is_empty()
                || !s
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
            {
                p.push(format!(
                    "--streams holds '{s}', which is not a Stream name (letters, digits, '.', '_', '-')"
                ));
            }
        }
        let samples = self.samples.unwrap_or(1);
        if samples == 0 {
            p.push("--samples must be at least 1");
        }
        if p.len() > 0 {
            return Err(p);
        }
        Ok(EvalJob {
            checkpoint: checkpoint.expect("checked above"),
            baseline,
            samples,
            out: self.out.as_ref().map(|o| abs(o)),
            manifest,
            streams: self.streams.clone(),
        })
    }
}

/// `dir` when it is a model folder (`config.json`) or holds `step-N` checkpoints, as `arena-rl eval` takes them.
fn model_dir(p: &mut Problems, flag: &str, dir: &Path) -> Option<PathBuf> {
    if !dir.is_dir() {
        p.push(format!(
            "{flag} {} does not exist or is not a directory",
            dir.display()
        ));
        return None;
    }
    if dir.join("config.json").is_file() {
        return Some(dir.to_path_buf());
    }
    let steps = std::fs::read_dir(dir).into_iter().flatten().flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        e.path().is_dir()
            && name
                .strip_prefix("step-")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    });
    if steps {
        return Some(dir.to_path_buf());
    }
    p.push(format!(
        "{flag} {} is neither a model folder (no config.json) nor a folder of step-N checkpoints",
        dir.display()
    ));
    None
}

impl EvalJob {
    /// The `arena-rl eval` flags after `--config`, one a line; `run_dir` gives the default output folder.
    pub(crate) fn args(&self, run_dir: &Path) -> Vec<String> {
        let q = |s: &str| super::render::quote(s);
        let path = |p: &Path| q(&p.display().to_string());
        let mut a = vec![format!("--checkpoint {}", path(&self.checkpoint))];
        if let Some(b) = &self.baseline {
            a.push(format!("--baseline {}", path(b)));
        }
        a.push(format!("--samples {}", self.samples));
        let out = self.out.clone().unwrap_or_else(|| run_dir.join("eval"));
        a.push(format!("--out {}", path(&out)));
        if let Some(m) = &self.manifest {
            a.push(format!("--manifest {}", path(m)));
        }
        if !self.streams.is_empty() {
            a.push(format!("--streams {}", q(&self.streams.join(","))));
        }
        a
    }
}
