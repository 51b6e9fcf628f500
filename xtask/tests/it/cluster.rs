//! A one-node Slurm cluster on this machine, for tests: Debian's `slurmctld`, `slurmd`, `slurm-client` and
//! `munge`, installed with apt-get when missing (as root), started in a private directory with their own
//! ports, munge socket and key, and stopped by their own PIDs when the cluster is dropped.
//!
//! Nothing outside the directory is touched: clients find the cluster through `SLURM_CONF`
//! ([`Cluster::env`]). A machine where Slurm cannot be installed or run yields [`Unavailable`] with the
//! reason, for the test to print and skip.

use std::fmt::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Why no cluster could be started here.
#[derive(Debug)]
pub(crate) struct Unavailable(pub(crate) String);

/// A running one-node cluster.
pub(crate) struct Cluster {
    dir: tempfile::TempDir,
    conf: PathBuf,
    /// Started daemons, in start order: munged, slurmctld, slurmd.
    daemons: Vec<(&'static str, Child)>,
}

/// The packages that make a one-node cluster (Debian 12: Slurm 22.05).
const PACKAGES: [&str; 4] = ["slurmctld", "slurmd", "slurm-client", "munge"];
const PROGRAMS: [&str; 6] = ["munged", "slurmctld", "slurmd", "sbatch", "scontrol", "sinfo"];

/// `PATH` with the system directories the daemons live in.
pub(crate) fn path_with_sbin() -> String {
    let path = std::env::var("PATH").unwrap_or_default();
    format!("{path}:/usr/local/sbin:/usr/sbin:/sbin:/usr/bin:/bin")
}

pub(crate) fn which(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&path_with_sbin())
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Installs the packages when a program is missing and this process may: root, with apt-get.
pub(crate) fn ensure_installed() -> Result<(), Unavailable> {
    let missing: Vec<&str> = PROGRAMS.into_iter().filter(|p| which(p).is_none()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    let uid = Command::new("id").arg("-u").output().map_err(|e| {
        Unavailable(format!(
            "{} are not installed and `id -u` failed: {e}",
            missing.join(", ")
        ))
    })?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Err(Unavailable(format!(
            "{} are not installed, and installing them needs root",
            missing.join(", ")
        )));
    }
    let Some(apt) = which("apt-get") else {
        return Err(Unavailable(format!(
            "{} are not installed, and there is no apt-get to install {}",
            missing.join(", "),
            PACKAGES.join(" ")
        )));
    };
    let apt_get = |args: &[&str]| {
        Command::new(&apt)
            .args(["-o", "DPkg::Lock::Timeout=300", "-q"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
    };
    let mut install: Vec<&str> = vec!["install", "-y", "--no-install-recommends"];
    install.extend(PACKAGES);
    let mut out = apt_get(&install).map_err(|e| Unavailable(format!("running apt-get: {e}")))?;
    if !out.status.success() {
        // A fresh machine may have no package lists yet.
        let _ = apt_get(&["update"]);
        out = apt_get(&install).map_err(|e| Unavailable(format!("running apt-get: {e}")))?;
    }
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(3).collect();
        return Err(Unavailable(format!(
            "apt-get install {} failed ({}): {}",
            PACKAGES.join(" "),
            out.status,
            tail.into_iter().rev().collect::<Vec<_>>().join(" / ")
        )));
    }
    match PROGRAMS.into_iter().find(|p| which(p).is_none()) {
        Some(p) => Err(Unavailable(format!("{p} is still missing after apt-get install"))),
        None => Ok(()),
    }
}

fn free_port() -> u16 {
    TcpListener::bind("0.0.0.0:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

impl Cluster {
    /// Installs Slurm if needed and starts a one-node cluster; waits until the node is idle.
    pub(crate) fn start() -> Result<Self, Unavailable> {
        ensure_installed()?;
        let dir = tempfile::Builder::new()
            .prefix("slurm-")
            .tempdir_in("/tmp")
            .map_err(|e| Unavailable(format!("creating a directory for the cluster: {e}")))?;
        let root = dir.path().to_path_buf();
        for sub in ["munge", "state", "spool", "log"] {
            std::fs::create_dir_all(root.join(sub)).expect("cluster directories");
        }
        let mut key = [0u8; 128];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
            &mut key,
        )
        .expect("random key");
        let key_path = root.join("munge/munge.key");
        std::fs::write(&key_path, key).expect("munge key");
        set_mode(&key_path, 0o400);
        set_mode(&root.join("munge"), 0o700);

        let node = Command::new(which("slurmd").expect("installed"))
            .arg("-C")
            .output()
            .map_err(|e| Unavailable(format!("slurmd -C: {e}")))?;
        let node_line = String::from_utf8_lossy(&node.stdout)
            .lines()
            .find(|l| l.starts_with("NodeName="))
            .map(str::to_string)
            .ok_or_else(|| Unavailable("slurmd -C printed no NodeName line".into()))?;
        let node_name = node_line
            .split_whitespace()
            .next()
            .and_then(|w| w.strip_prefix("NodeName="))
            .expect("NodeName=...")
            .to_string();

        let r = root.display();
        let mut conf = String::new();
        let _ = write!(
            conf,
            "ClusterName=xtasktest\n\
             SlurmctldHost={node_name}\n\
             SlurmctldPort={ctld}\n\
             SlurmdPort={slurmd}\n\
             AuthType=auth/munge\n\
             CredType=cred/munge\n\
             AuthInfo=socket={r}/munge/munge.sock\n\
             SlurmUser=root\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             JobCompType=jobcomp/filetxt\n\
             JobCompLoc={r}/log/jobcomp.txt\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             ReturnToService=2\n\
             MpiDefault=none\n\
             StateSaveLocation={r}/state\n\
             SlurmdSpoolDir={r}/spool\n\
             SlurmctldPidFile={r}/slurmctld.pid\n\
             SlurmdPidFile={r}/slurmd.pid\n\
             SlurmctldLogFile={r}/log/slurmctld.log\n\
             SlurmdLogFile={r}/log/slurmd.log\n\
             {node_line} State=UNKNOWN\n\
             PartitionName=debug Nodes={node_name} Default=YES MaxTime=INFINITE State=UP\n",
            ctld = free_port(),
            slurmd = free_port(),
        );
        let conf_path = root.join("slurm.conf");
        std::fs::write(&conf_path, conf).expect("slurm.conf");

        let mut cluster = Self {
            dir,
            conf: conf_path,
            daemons: Vec::new(),
        };
        cluster.spawn(
            "munged",
            &[
                "--foreground",
                "--force",
                &format!("--socket={r}/munge/munge.sock"),
                &format!("--key-file={r}/munge/munge.key"),
                &format!("--pid-file={r}/munge/munged.pid"),
                &format!("--seed-file={r}/munge/munged.seed"),
                &format!("--log-file={r}/log/munged.log"),
            ],
        )?;
        cluster.wait_for("the munge socket", Duration::from_secs(10), |c| {
            c.dir.path().join("munge/munge.sock").exists()
        })?;
        let conf = cluster.conf.display().to_string();
        cluster.spawn("slurmctld", &["-D", "-f", &conf])?;
        cluster.spawn("slurmd", &["-D", "-f", &conf])?;
        cluster.wait_for("the node to be idle", Duration::from_secs(30), |c| {
            c.command("sinfo")
                .args(["-h", "-o", "%T"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "idle")
        })?;
        Ok(cluster)
    }

    fn spawn(&mut self, name: &'static str, args: &[&str]) -> Result<(), Unavailable> {
        let log = std::fs::File::create(self.dir.path().join(format!("log/{name}.out")))
            .expect("daemon output file");
        let child = Command::new(which(name).expect("installed"))
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .map_err(|e| Unavailable(format!("starting {name}: {e}")))?;
        self.daemons.push((name, child));
        Ok(())
    }

    fn wait_for(
        &mut self,
        what: &str,
        limit: Duration,
        ready: impl Fn(&Self) -> bool,
    ) -> Result<(), Unavailable> {
        let start = Instant::now();
        while !ready(self) {
            let exited = self
                .daemons
                .iter_mut()
                .find_map(|(name, child)| Some((*name, child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                return Err(Unavailable(format!(
                    "{name} exited ({status}) while waiting for {what}:\n{}",
                    self.logs_of(name)
                )));
            }
            if start.elapsed() > limit {
                return Err(Unavailable(format!(
                    "timed out after {limit:?} waiting for {what}:\n{}",
                    self.logs()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// The environment that points Slurm clients at this cluster.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            ("SLURM_CONF".into(), self.conf.display().to_string()),
            ("PATH".into(), path_with_sbin()),
        ]
    }

    /// Where slurmctld keeps its state, including each job's script and environment.
    pub(crate) fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// A Slurm client command for this cluster.
    pub(crate) fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new(program);
        cmd.envs(self.env());
        cmd
    }

    /// A job's state (`JobState=` of `scontrol show job`), or `None` when the controller does not know it.
    pub(crate) fn job_state(&self, job: &str) -> Option<String> {
        let out = self
            .command("scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout);
        text.split_whitespace()
            .find_map(|w| w.strip_prefix("JobState="))
            .map(str::to_string)
    }

    /// Waits until `job` leaves the pending and running states and returns its final state.
    pub(crate) fn wait_job(&self, job: &str, limit: Duration) -> String {
        let start = Instant::now();
        loop {
            let state = self.job_state(job);
            match state.as_deref() {
                Some("PENDING" | "CONFIGURING" | "RUNNING" | "COMPLETING") | None => {}
                Some(done) => return done.to_string(),
            }
            assert!(
                start.elapsed() < limit,
                "job {job} still {state:?} after {limit:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn logs_of(&self, name: &str) -> String {
        let mut out = String::new();
        for file in [format!("log/{name}.out"), format!("log/{name}.log")] {
            if let Ok(text) = std::fs::read_to_string(self.dir.path().join(&file)) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(20)..];
                let _ = writeln!(out, "--- {file}\n{}", tail.join("\n"));
            }
        }
        out
    }

    /// The tails of every daemon's logs, for failure messages.
    pub(crate) fn logs(&self) -> String {
        ["munged", "slurmctld", "slurmd"]
            .iter()
            .map(|n| self.logs_of(n))
            .collect()
    }
}

impl Drop for Cluster {
    /// Cancels what is left in the queue, then stops each daemon by its PID: SIGTERM, then SIGKILL after 10 s.
    fn drop(&mut self) {
        if self.daemons.len() == 3
            && let Ok(out) = self.command("squeue").args(["-h", "-o", "%i"]).output()
        {
            for job in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.command("scancel").arg(job).output();
            }
        }
        while let Some((name, mut child)) = self.daemons.pop() {
            let pid = child.id().to_string();
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
            let start = Instant::now();
            while !matches!(child.try_wait(), Ok(Some(_))) {
                if start.elapsed() > Duration::from_secs(10) {
                    eprintln!("cluster: {name} (pid {pid}) ignored SIGTERM; killing it");
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

pub(crate) fn set_mode(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}
