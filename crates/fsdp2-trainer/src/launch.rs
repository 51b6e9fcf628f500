//! [`Worker`]: the FSDP2 worker started by this process under `torchrun --standalone`, in a process group
//! of its own that is killed when the handle drops.
//!
//! The key reaches the worker only through its environment (`ARENA_RL_TRAINER_API_KEY`), never its
//! command line. Its output goes to `<run dir>/trainer/worker.log`; when the group exits while a call is
//! outstanding, the call ends with a `rank_lost` error naming the rank torchrun reports as the first
//! failure.

use std::fs::OpenOptions;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use secrecy::{ExposeSecret, SecretString};

use crate::batch::Batch;
use crate::client::{Client, Watch};
use crate::error::{Error, Result};
use crate::protocol::{
    Dtype, Hello, InitRequest, InitResult, LoadResult, PublishResult, SaveResult, StepResult,
};

/// The environment variable that carries the key to both sides.
pub const API_KEY_ENV: &str = "ARENA_RL_TRAINER_API_KEY";

/// The key of a run: the given one (`ARENA_RL_TRAINER_API_KEY`, read by the caller), or a fresh random one.
pub fn api_key(given: Option<SecretString>) -> SecretString {
    match given {
        Some(k) if !k.expose_secret().is_empty() => k,
        _ => {
            let bytes: [u8; 32] = rand::random();
            SecretString::from(bytes.iter().map(|b| format!("{b:02x}")).collect::<String>())
        }
    }
}

/// How to start the worker on this machine.
#[derive(Clone, Debug, PartialEq)]
pub struct LaunchConfig {
    /// The command that is torchrun, e.g. `["torchrun"]` or `["python", "-m", "torch.distributed.run"]`.
    pub torchrun: Vec<String>,
    /// Processes (ranks) on this machine.
    pub nproc: u32,
    /// The run's folder: the worker refuses any path outside it.
    pub run_dir: PathBuf,
    /// The address rank 0 listens on; port 0 picks a free one.
    pub listen: String,
    /// Extra environment for the worker (never the key: that is the launcher's).
    pub env: Vec<(String, String)>,
    /// How long the worker may take to answer its first health check.
    pub ready_timeout: Duration,
}

impl LaunchConfig {
    /// `python -m torch.distributed.run` with `nproc` ranks, listening on a free loopback port.
    pub fn python(python: impl Into<String>, nproc: u32, run_dir: impl Into<PathBuf>) -> Self {
        Self {
            torchrun: vec![python.into(), "-m".into(), "torch.distributed.run".into()],
            nproc,
            run_dir: run_dir.into(),
            listen: "127.0.0.1:0".into(),
            env: Vec::new(),
            ready_timeout: Duration::from_secs(300),
        }
    }
}

/// The worker's process group, as a [`Watch`]: a call fails once the group's leader (torchrun) exits.
#[derive(Debug)]
pub struct Group {
    child: Child,
    log: PathBuf,
    exited: Option<String>,
}

impl Group {
    fn check(&mut self) -> Option<String> {
        if self.exited.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.exited = Some(status.to_string());
        }
        self.exited.clone()
    }

    /// The first failed rank torchrun reports in the log ("Root Cause ... rank : N").
    fn failed_rank(&self) -> Option<u32> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        let root = &log[log.rfind("Root Cause")?..];
        root.lines()
            .find_map(|l| l.trim().strip_prefix("rank")?.trim().strip_prefix(':'))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    fn kill(&mut self) {
        if self.check().is_some() {
            // The leader is gone; members it left behind may still hold the group.
            signal_group(self.child.id(), rustix::process::Signal::KILL);
            return;
        }
        signal_group(self.child.id(), rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        signal_group(self.child.id(), rustix::process::Signal::KILL);
        let _ = self.child.wait();
    }
}

fn signal_group(pid: u32, signal: rustix::process::Signal) {
    if let Some(pid) = i32::try_from(pid).ok().and_then(rustix::process::Pid::from_raw) {
        let _ = rustix::process::kill_process_group(pid, signal);
    }
}

impl Watch for Group {
    fn alive(&mut self, call: &str, step: Option<u64>) -> Result<()> {
        match self.check() {
            None => Ok(()),
            Some(status) => Err(Error::RankLost {
                call: call.to_string(),
                status,
                rank: self.failed_rank(),
                step,
                log: Some(self.log.clone()),
            }),
        }
    }

    fn progress(&mut self, call: &str, p: &crate::protocol::Progress) {
        tracing::trace!(call, phase = %p.phase, done = p.done, total = p.total, "fsdp2 trainer");
    }
}

/// A worker this process started, and its client. Dropping it kills the worker's process group.
#[derive(Debug)]
pub struct Worker {
    client: Client,
    group: Group,
}

impl Worker {
    /// Starts `torchrun --standalone --nproc-per-node N -m arena_rl_fsdp2 --listen ADDR --run-dir DIR` in a
    /// process group of its own, with `key` in its environment, and waits until rank 0 answers.
    pub fn launch(config: &LaunchConfig, key: SecretString) -> Result<Self> {
        let listen = free_address(&config.listen)?;
        let run_dir = &config.run_dir;
        let trainer_dir = run_dir.join("trainer");
        std::fs::create_dir_all(&trainer_dir).map_err(Error::io(&trainer_dir))?;
        let log = trainer_dir.join("worker.log");
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(Error::io(&log))?;
        let err = out.try_clone().map_err(Error::io(&log))?;
        let (program, args) = config
            .torchrun
            .split_first()
            .ok_or_else(|| Error::Config("the torchrun command is empty".into()))?;
        let mut command = Command::new(program);
        command
            .args(args)
            .args(["--standalone", "--nnodes", "1"])
            .arg(format!("--nproc-per-node={}", config.nproc))
            .args(["-m", "arena_rl_fsdp2", "--listen", &listen, "--run-dir"])
            .arg(run_dir)
            .envs(config.env.iter().map(|(k, v)| (k, v)))
            .env(API_KEY_ENV, key.expose_secret())
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        let shown = format!("{} (log {})", config.torchrun.join(" "), log.display());
        let child = command.spawn().map_err(|source| Error::Launch {
            command: shown,
            source,
        })?;
        tracing::info!(pid = child.id(), listen = %listen, nproc = config.nproc, log = %log.display(), "fsdp2 worker started");
        let mut worker = Self {
            client: Client::new(listen, key),
            group: Group {
                child,
                log,
                exited: None,
            },
        };
        worker
            .client
            .wait_ready(config.ready_timeout, &mut worker.group)?;
        Ok(worker)
    }

    /// The client of rank 0.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// torchrun's process id (the leader of the worker's process group).
    pub fn pid(&self) -> u32 {
        self.group.child.id()
    }

    /// The worker's log.
    pub fn log(&self) -> &Path {
        &self.group.log
    }

    /// The client and the watch of this worker's group, for calls this type does not wrap.
    pub fn parts(&mut self) -> (&Client, &mut dyn Watch) {
        (&self.client, &mut self.group)
    }

    /// `hello`, failing if the group has exited.
    pub fn hello(&mut self) -> Result<Hello> {
        self.group.alive("hello", None)?;
        self.client.hello()
    }

    /// See [`Client::init`].
    pub fn init(&mut self, request: &InitRequest) -> Result<InitResult> {
        self.client.init(request, &mut self.group)
    }

    /// See [`Client::step`].
    pub fn step(&mut self, batch: &Batch, path: &Path) -> Result<StepResult> {
        self.client.step(batch, path, &mut self.group)
    }

    /// See [`Client::publish`].
    pub fn publish(&mut self, path: &Path, dtype: Dtype) -> Result<PublishResult> {
        self.client.publish(path, dtype, &mut self.group)
    }

    /// See [`Client::save`].
    pub fn save(&mut self, path: &Path) -> Result<SaveResult> {
        self.client.save(path, &mut self.group)
    }

    /// See [`Client::load`].
    pub fn load(&mut self, path: &Path) -> Result<LoadResult> {
        self.client.load(path, &mut self.group)
    }

    /// Whether the process group has exited (and how).
    pub fn exited(&mut self) -> Option<String> {
        self.group.check()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.group.kill();
    }
}

/// `listen` with a free port when its port is 0.
fn free_address(listen: &str) -> Result<String> {
    let bad = || Error::Config(format!("the listen address {listen:?} is not HOST:PORT"));
    let (host, port) = listen.rsplit_once(':').ok_or_else(bad)?;
    if port != "0" {
        return Ok(listen.to_string());
    }
    let probe = std::net::TcpListener::bind((host, 0)).map_err(Error::io(listen))?;
    let port = probe.local_addr().map_err(Error::io(listen))?.port();
    Ok(format!("{host}:{port}"))
}
