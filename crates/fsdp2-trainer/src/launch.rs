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
        let run_dir = &config.run_dir;
        let trainer_dir = run_dir.join("trainer");
        std::fs::create_dir_all(&trainer_dir).map_err(Error::io(&trainer_dir))?;
        // With port 0 rank 0 binds a port the system picks and writes it here: a port probed on this side
        // and bound later by the worker could be taken in between (another worker, torchrun's own store).
        let address_file = picks_port(&config.listen)?.then(|| trainer_dir.join("rank0.address"));
        if let Some(file) = &address_file {
            match std::fs::remove_file(file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(Error::io(file)(e)),
                _ => {}
            }
        }
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
            .args(["-m", "arena_rl_fsdp2", "--listen", &config.listen, "--run-dir"])
            .arg(run_dir)
            .args(
                address_file
                    .iter()
                    .flat_map(|f| [std::ffi::OsStr::new("--address-file"), f.as_os_str()]),
            )
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
        tracing::info!(pid = child.id(), listen = %config.listen, nproc = config.nproc, log = %log.display(), "fsdp2 worker started");
        let mut group = Group {
            child,
            log,
            exited: None,
        };
        let listen = match &address_file {
            Some(file) => wait_for_address(file, config.ready_timeout, &mut group)?,
            None => config.listen.clone(),
        };
        let mut worker = Self {
            client: Client::new(listen, key),
            group,
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

    /// See [`Client::publish_sharded`].
    pub fn publish_sharded(
        &mut self,
        path: &Path,
        dtype: Dtype,
        max_shard_bytes: Option<u64>,
    ) -> Result<PublishResult> {
        self.client
            .publish_sharded(path, dtype, max_shard_bytes, &mut self.group)
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

/// Whether `listen` (HOST:PORT) leaves the port to the system (port 0).
fn picks_port(listen: &str) -> Result<bool> {
    let (_, port) = listen
        .rsplit_once(':')
        .filter(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok())
        .ok_or_else(|| Error::Config(format!("the listen address {listen:?} is not HOST:PORT")))?;
    Ok(port == "0")
}

/// The address rank 0 wrote to `file` once bound, waiting for it while the group lives, up to `deadline`.
fn wait_for_address(file: &Path, deadline: Duration, group: &mut dyn Watch) -> Result<String> {
    let started = Instant::now();
    loop {
        group.alive("start", None)?;
        match std::fs::read_to_string(file) {
            Ok(address) if !address.trim().is_empty() => return Ok(address.trim().to_string()),
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(file)(e)),
        }
        if started.elapsed() >= deadline {
            return Err(Error::Timeout(format!(
                "the worker wrote no address to {} within {} s",
                file.display(),
                deadline.as_secs()
            )));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_zero_is_left_to_the_worker_and_bad_addresses_are_refused() {
        assert!(picks_port("127.0.0.1:0").unwrap());
        assert!(picks_port("[::1]:0").unwrap());
        assert!(!picks_port("0.0.0.0:8471").unwrap());
        for bad in ["localhost", ":0", "127.0.0.1:port", "127.0.0.1:70000"] {
            let e = picks_port(bad).unwrap_err().to_string();
            assert!(e.contains(bad) && e.contains("HOST:PORT"), "{bad}: {e}");
        }
    }

    /// A group that never exits, for waiting on a file alone.
    struct Alive;

    impl Watch for Alive {
        fn alive(&mut self, _call: &str, _step: Option<u64>) -> Result<()> {
            Ok(())
        }
    }

    #[test]
    fn the_address_is_read_once_written_and_its_absence_times_out_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("rank0.address");
        let e = wait_for_address(&file, Duration::from_millis(200), &mut Alive).unwrap_err();
        assert!(e.to_string().contains("rank0.address"), "{e}");
        std::fs::write(&file, "127.0.0.1:41234\n").unwrap();
        let got = wait_for_address(&file, Duration::from_secs(1), &mut Alive).unwrap();
        assert_eq!(got, "127.0.0.1:41234");
    }
}
