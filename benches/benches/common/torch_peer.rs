//! The Python peer of the trainer benches: a script under `crates/trainer/python/`, run in the
//! `ARENA_RL_PY_TORCH` venv (`cargo xtask fixtures` prepares it), that measures one workload per JSON request
//! line and answers one JSON line with `tokens_per_second` and `torch_threads`.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// The running peer.
pub(crate) struct TorchPeer {
    name: &'static str,
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl TorchPeer {
    /// Starts `crates/trainer/python/<script>` on the model folder `dir`; `name` says what it is in errors
    /// ("the PyTorch bench"); `stderr` is where its diagnostics go.
    pub(crate) fn start(name: &'static str, script: &str, dir: &Path, stderr: Stdio) -> Result<Self> {
        let python = std::env::var_os("ARENA_RL_PY_TORCH").context(
            "ARENA_RL_PY_TORCH is not set: run `eval \"$(cargo xtask fixtures)\"` before this bench",
        )?;
        let script = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../crates/trainer/python")
            .join(script);
        let mut child = Command::new(python)
            .arg(script)
            .arg(dir)
            .env("TRANSFORMERS_VERBOSITY", "error")
            // Idle OpenMP workers must sleep, not spin, while burn is being measured.
            .env("OMP_WAIT_POLICY", "PASSIVE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdin = child.stdin.take().context("piped stdin")?;
        let stdout = BufReader::new(child.stdout.take().context("piped stdout")?);
        Ok(Self {
            name,
            child,
            stdin,
            stdout,
        })
    }

    /// Tokens per second and torch's thread count for one workload `request`.
    pub(crate) fn measure(&mut self, request: &serde_json::Value) -> Result<(f64, u64)> {
        writeln!(self.stdin, "{request}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("{} exited early ({:?})", self.name, self.child.wait()?);
        }
        let answer: serde_json::Value = serde_json::from_str(&line)?;
        Ok((
            answer["tokens_per_second"]
                .as_f64()
                .context("tokens_per_second")?,
            answer["torch_threads"].as_u64().unwrap_or(0),
        ))
    }
}

/// The median of `xs` (the upper one for an even count).
pub(crate) fn median(mut xs: Vec<Duration>) -> Duration {
    xs.sort();
    xs[xs.len() / 2]
}
