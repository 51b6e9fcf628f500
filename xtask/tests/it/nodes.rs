//! A Slurm cluster of several nodes on this machine, for tests that cross hosts.
//!
//! Each node is a network namespace with its own hostname (a UTS namespace), its own address on a bridge, a
//! hosts file (`/etc/netns/NAME/hosts`, which `ip netns exec` binds over `/etc/hosts`) that resolves the other
//! nodes' names and maps its own to 127.0.1.1 as Debian does, its own `munged` and one `slurmd`; `slurmctld`
//! runs on the first node, which is also where clients log in. Arena's host is one more namespace on the
//! bridge, with no Slurm and no names: it reaches a node only through an address the node gives it.
//!
//! The bridge lives in a namespace of its own, so nothing is added to this machine's network: every address
//! is inside the namespaces the cluster made (a /24 of 10.0.0.0/8 chosen from the process id). Names start
//! with [`PREFIX`] and the process id, so a later run removes what a killed one left
//! ([`crate::netns::remove_leftovers`]); everything the cluster made is removed when it is dropped, also when
//! the test fails. Where something cannot be made, [`NodeCluster::start`] panics saying why: never skipped.
//!
//! A node's processes share one mount namespace, made by `ip netns exec` and held by a `sleep` process; in it
//! the cluster's munge folder is the node's own (a bind mount), so the one `slurm.conf` names one socket
//! path and each node's Slurm reaches its own `munged`. A command runs on a node by entering the holder's
//! namespaces with `nsenter` ([`NodeCluster::on`]); whatever `slurmd` starts there inherits them.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::cluster::{Unavailable, ensure_installed, path_with_sbin, set_mode, which};
use crate::netns::{ip, ip_ok, remove_leftovers};

/// Every namespace, link and folder the cluster makes starts with this, then the owner's process id.
const PREFIX: &str = "arlmn";
/// The Slurm ports; each node has its own network, so they need not be free on this machine.
const SLURMCTLD_PORT: u16 = 6817;
const SLURMD_PORT: u16 = 6818;

/// The holder's script: the node's munge folder, its hostname, and the cgroup mounts slurmd's start-up checks
/// (`ip netns exec` mounts a fresh /sys without this machine's /sys/fs/cgroup, and slurmd 22.05 refuses to
/// start without a cgroup v1 `systemd` hierarchy; the cluster's proctrack/linuxproc and task/none use none).
const HOLDER: &str = r#"mount --bind "$1" "$2" && mount -t tmpfs cgroup /sys/fs/cgroup &&
mkdir /sys/fs/cgroup/systemd && mount -t cgroup -o none,name=systemd cgroup /sys/fs/cgroup/systemd &&
hostname "$3" && exec sleep infinity"#;

/// One node: its hostname (also its Slurm node name) and address.
pub(crate) struct Node {
    pub(crate) name: String,
    pub(crate) addr: String,
    ns: String,
    /// The process that holds the node's mount and UTS namespaces.
    holder: Option<Child>,
}

/// A running cluster of [`Node`]s and Arena's host.
pub(crate) struct NodeCluster {
    tag: String,
    nodes: Vec<Node>,
    arena_ns: String,
    arena_addr: String,
    switch_ns: String,
    /// Every namespace made, in order.
    namespaces: Vec<String>,
    /// Started daemons, in start order, with the node each runs on.
    daemons: Vec<(String, Child)>,
    conf: PathBuf,
    /// Removed after [`Drop::drop`] has stopped every process that uses it.
    dir: tempfile::TempDir,
}

fn root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// Whether the process whose id follows `prefix` at the start of `name` still runs.
fn owner_alive(name: &str) -> bool {
    let pid: String = name[PREFIX.len()..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    !pid.is_empty() && Path::new(&format!("/proc/{pid}")).exists()
}

impl NodeCluster {
    /// Makes `n` nodes and Arena's host, starts munge and Slurm on the nodes, and waits until every node is
    /// idle. Installs Slurm with apt-get when it is missing (as root). Panics, saying why, where it cannot.
    pub(crate) fn start(n: usize) -> Self {
        assert!(
            root(),
            "the multi-node cluster makes network namespaces and needs root (CI runs as root)"
        );
        if let Err(Unavailable(why)) = ensure_installed() {
            panic!("the multi-node cluster needs Slurm and munge: {why}");
        }
        remove_leftovers(PREFIX);
        if let Ok(dirs) = std::fs::read_dir("/tmp") {
            for dir in dirs.flatten() {
                let name = dir.file_name().to_string_lossy().into_owned();
                if name.starts_with(PREFIX) && !owner_alive(&name) {
                    let _ = std::fs::remove_dir_all(dir.path());
                }
            }
        }
        let pid = std::process::id();
        let tag = format!("{PREFIX}{pid}");
        let dir = tempfile::Builder::new()
            .prefix(&format!("{tag}-"))
            .tempdir_in("/tmp")
            .expect("a folder for the cluster");
        // A /24 of its own for each run, inside namespaces that reach nothing else.
        let subnet = format!("10.{}.{}", 200 + pid % 50, (pid / 50) % 250);
        let mut c = Self {
            nodes: Vec::new(),
            arena_ns: format!("{tag}ar"),
            arena_addr: format!("{subnet}.100"),
            switch_ns: format!("{tag}sw"),
            tag,
            namespaces: Vec::new(),
            daemons: Vec::new(),
            conf: dir.path().join("slurm.conf"),
            dir,
        };
        // From here on, Drop removes what exists.
        let switch = c.switch_ns.clone();
        c.add_namespace(&switch);
        let bridge = format!("{}br", c.tag);
        ip_ok(&["-n", &switch, "link", "add", &bridge, "type", "bridge"]);
        ip_ok(&["-n", &switch, "link", "set", &bridge, "up"]);
        for i in 1..=n {
            let node = Node {
                name: format!("node{i}"),
                addr: format!("{subnet}.{}", 10 + i),
                ns: format!("{}n{i}", c.tag),
                holder: None,
            };
            c.add_namespace(&node.ns);
            c.plug(&node.ns, &format!("{}v{i}", c.tag), &node.addr);
            c.nodes.push(node);
        }
        let (arena_ns, arena_addr) = (c.arena_ns.clone(), c.arena_addr.clone());
        c.add_namespace(&arena_ns);
        c.plug(&arena_ns, &format!("{}va", c.tag), &arena_addr);
        for i in 0..n {
            let mut hosts = String::from("127.0.0.1\tlocalhost\n");
            for (j, other) in c.nodes.iter().enumerate() {
                let addr = if i == j { "127.0.1.1" } else { &other.addr };
                let _ = writeln!(hosts, "{addr}\t{}", other.name);
            }
            let etc = Path::new("/etc/netns").join(&c.nodes[i].ns);
            std::fs::create_dir_all(&etc).expect("/etc/netns/NAME");
            std::fs::write(etc.join("hosts"), hosts).expect("the node's hosts file");
        }
        c.write_config();
        for i in 0..n {
            c.hold(i);
        }
        let r = c.dir.path().display().to_string();
        for i in 0..n {
            c.spawn(
                i,
                "munged",
                &[
                    "--foreground",
                    "--force",
                    &format!("--socket={r}/munge/munge.sock"),
                    &format!("--key-file={r}/munge/munge.key"),
                    &format!("--pid-file={r}/munge/munged.pid"),
                    &format!("--seed-file={r}/munge/munged.seed"),
                    &format!("--log-file={r}/munge/munged.log"),
                ],
            );
            let socket = c.node_dir(i).join("munge/munge.sock");
            c.wait_for(&format!("{}'s munge socket", c.nodes[i].name), |_| {
                socket.exists()
            });
        }
        let conf = c.conf.display().to_string();
        c.spawn(0, "slurmctld", &["-D", "-f", &conf]);
        for i in 0..n {
            let name = c.nodes[i].name.clone();
            c.spawn(i, "slurmd", &["-D", "-N", &name, "-f", &conf]);
        }
        c.wait_for("every node to be idle", |c| {
            c.on(0, "sinfo")
                .args(["-h", "-N", "-o", "%N %T"])
                .output()
                .is_ok_and(|o| {
                    let text = String::from_utf8_lossy(&o.stdout);
                    text.lines().filter(|l| l.ends_with(" idle")).count() == n
                })
        });
        c
    }

    fn add_namespace(&mut self, ns: &str) {
        ip_ok(&["netns", "add", ns]);
        self.namespaces.push(ns.to_string());
        ip_ok(&["-n", ns, "link", "set", "lo", "up"]);
    }

    /// Joins `ns` to the bridge with a veth pair: `link` on the bridge's side, `eth0` with `addr` on the other.
    fn plug(&self, ns: &str, link: &str, addr: &str) {
        let switch = &self.switch_ns;
        let bridge = format!("{}br", self.tag);
        ip_ok(&[
            "-n", switch, "link", "add", link, "type", "veth", "peer", "name", "eth0", "netns", ns,
        ]);
        ip_ok(&["-n", switch, "link", "set", link, "master", &bridge]);
        ip_ok(&["-n", switch, "link", "set", link, "up"]);
        ip_ok(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", "eth0"]);
        ip_ok(&["-n", ns, "link", "set", "eth0", "up"]);
    }

    fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join("nodes").join(&self.nodes[i].name)
    }

    /// One munge key for all nodes, a munge folder for each, and one `slurm.conf`.
    fn write_config(&self) {
        let root = self.dir.path();
        for sub in ["munge", "state", "log"] {
            std::fs::create_dir_all(root.join(sub)).expect("cluster folders");
        }
        set_mode(&root.join("munge"), 0o700);
        let mut key = [0u8; 128];
        std::io::Read::read_exact(
            &mut std::fs::File::open("/dev/urandom").expect("/dev/urandom"),
            &mut key,
        )
        .expect("a random munge key");
        for i in 0..self.nodes.len() {
            let munge = self.node_dir(i).join("munge");
            std::fs::create_dir_all(&munge).expect("a node's munge folder");
            std::fs::create_dir_all(root.join("spool").join(&self.nodes[i].name)).expect("a node's spool");
            std::fs::write(munge.join("munge.key"), key).expect("munge key");
            set_mode(&munge.join("munge.key"), 0o400);
            set_mode(&munge, 0o700);
        }
        // Every node has this machine's CPUs and memory, as `slurmd -C` reports them.
        let hardware = Command::new(which("slurmd").expect("installed"))
            .arg("-C")
            .output()
            .expect("slurmd -C runs");
        let hardware = String::from_utf8_lossy(&hardware.stdout)
            .lines()
            .find(|l| l.starts_with("NodeName="))
            .map(|l| l.split_whitespace().skip(1).collect::<Vec<_>>().join(" "))
            .expect("slurmd -C prints a NodeName line");
        let names = format!("node[1-{}]", self.nodes.len());
        let r = root.display();
        let conf = format!(
            "ClusterName={tag}\n\
             SlurmctldHost={head}\n\
             SlurmctldPort={SLURMCTLD_PORT}\n\
             SlurmdPort={SLURMD_PORT}\n\
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
             SlurmdSpoolDir={r}/spool/%n\n\
             SlurmctldPidFile={r}/log/slurmctld.pid\n\
             SlurmdPidFile={r}/log/slurmd-%n.pid\n\
             SlurmctldLogFile={r}/log/slurmctld.log\n\
             SlurmdLogFile={r}/log/slurmd-%n.log\n\
             NodeName={names} {hardware} State=UNKNOWN\n\
             PartitionName=debug Nodes={names} Default=YES MaxTime=INFINITE State=UP\n",
            head = self.nodes[0].name,
            tag = self.tag,
        );
        std::fs::write(&self.conf, conf).expect("slurm.conf");
    }

    /// Starts node `i`'s holder: in the node's network namespace (and the mount namespace `ip netns exec`
    /// makes, with the node's hosts file), a UTS namespace with the node's hostname and the node's munge
    /// folder bound over the cluster's; then waits until it holds them.
    fn hold(&mut self, i: usize) {
        let node = &self.nodes[i];
        let log = std::fs::File::create(self.dir.path().join(format!("log/holder-{}.out", node.name)))
            .expect("holder output file");
        let child = Command::new("ip")
            .args(["netns", "exec", &node.ns, "unshare", "--uts", "--", "sh", "-c"])
            .arg(HOLDER)
            .arg("sh")
            .arg(self.node_dir(i).join("munge"))
            .arg(self.dir.path().join("munge"))
            .arg(&node.name)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .expect("ip netns exec runs");
        let pid = child.id();
        self.nodes[i].holder = Some(child);
        let name = self.nodes[i].name.clone();
        self.wait_for(&format!("{name}'s namespaces"), |_| {
            std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep")
        });
    }

    /// A command that runs on node `i` (its network, mount and UTS namespaces), pointed at this cluster.
    pub(crate) fn on(&self, i: usize, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let holder = self.nodes[i].holder.as_ref().expect("the node is held").id();
        let mut cmd = Command::new(which("nsenter").expect("nsenter (util-linux) is installed"));
        cmd.args(["-t", &holder.to_string(), "-n", "-m", "-u", "--"])
            .arg(program)
            .envs(self.env());
        cmd
    }

    /// A command that runs on Arena's host (its network namespace only).
    pub(crate) fn on_arena(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.arena_ns]).arg(program);
        cmd
    }

    /// The run's prefix (`arlmn<pid>`): a folder under /tmp whose name starts with it is removed by a later
    /// run once this process is gone.
    pub(crate) fn tag(&self) -> &str {
        &self.tag
    }

    /// Arena's host's address.
    pub(crate) fn arena_addr(&self) -> &str {
        &self.arena_addr
    }

    pub(crate) fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// The environment that points Slurm clients at this cluster.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        vec![
            ("SLURM_CONF".into(), self.conf.display().to_string()),
            ("PATH".into(), path_with_sbin()),
        ]
    }

    fn spawn(&mut self, i: usize, name: &str, args: &[&str]) {
        let node = self.nodes[i].name.clone();
        let log = std::fs::File::create(self.dir.path().join(format!("log/{name}-{node}.out")))
            .expect("daemon output file");
        let child = self
            .on(i, which(name).expect("installed"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup"))
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {name} on {node}: {e}"));
        self.daemons.push((format!("{name} on {node}"), child));
    }

    /// Waits up to 30 s for `ready`; panics with the logs when a daemon or holder exits first, or on time out.
    fn wait_for(&mut self, what: &str, ready: impl Fn(&Self) -> bool) {
        let start = Instant::now();
        while !ready(self) {
            let exited = self
                .daemons
                .iter_mut()
                .map(|(name, child)| (name.clone(), child))
                .chain(
                    self.nodes
                        .iter_mut()
                        .filter_map(|n| Some((format!("{}'s holder", n.name), n.holder.as_mut()?))),
                )
                .find_map(|(name, child)| Some((name, child.try_wait().ok()??)));
            if let Some((name, status)) = exited {
                panic!(
                    "{name} exited ({status}) while waiting for {what}:\n{}",
                    self.logs()
                );
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "timed out after 30 s waiting for {what}:\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// A job's state (`JobState=` of `scontrol show job`), or `None` when the controller does not know it.
    pub(crate) fn job_state(&self, job: &str) -> Option<String> {
        let out = self
            .on(0, "scontrol")
            .args(["show", "job", "-o", job])
            .output()
            .ok()?;
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .find_map(|w| w.strip_prefix("JobState="))
            .map(str::to_string)
    }

    /// The tails of every log of the cluster's daemons, for failure messages.
    pub(crate) fn logs(&self) -> String {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.dir.path().join("log"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "out"))
            .collect();
        files.extend((0..self.nodes.len()).map(|i| self.node_dir(i).join("munge/munged.log")));
        files.sort();
        let mut out = String::new();
        for file in files {
            if let Ok(text) = std::fs::read_to_string(&file) {
                let lines: Vec<&str> = text.lines().collect();
                let tail = &lines[lines.len().saturating_sub(15)..];
                let _ = writeln!(out, "--- {}\n{}", file.display(), tail.join("\n"));
            }
        }
        out
    }
}

/// Stops `child` by its id: SIGTERM, then SIGKILL after `grace`.
fn stop(name: &str, child: &mut Child, grace: Duration) {
    let pid = child.id().to_string();
    let _ = Command::new("kill").args(["-TERM", &pid]).status();
    let start = Instant::now();
    while !matches!(child.try_wait(), Ok(Some(_))) {
        if start.elapsed() > grace {
            eprintln!("nodes: {name} (pid {pid}) ignored SIGTERM; killing it");
            let _ = child.kill();
            let _ = child.wait();
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Drop for NodeCluster {
    /// Cancels what is left in the queue, stops the daemons and then every process left in the cluster's
    /// namespaces (a job's steps, the holders) by their ids, and deletes the namespaces (with their links)
    /// and the hosts files.
    fn drop(&mut self) {
        if self.daemons.iter().any(|(name, _)| name.starts_with("slurmctld"))
            && let Ok(out) = self.on(0, "squeue").args(["-h", "-o", "%i"]).output()
        {
            for job in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                let _ = self.on(0, "scancel").arg(job).output();
            }
        }
        while let Some((name, mut child)) = self.daemons.pop() {
            stop(&name, &mut child, Duration::from_secs(10));
        }
        for ns in &self.namespaces {
            let pids = ip(&["netns", "pids", ns]);
            for pid in String::from_utf8_lossy(&pids.stdout).split_whitespace() {
                let _ = Command::new("kill")
                    .args(["-KILL", pid])
                    .stderr(Stdio::null())
                    .status();
            }
        }
        for node in &mut self.nodes {
            if let Some(mut holder) = node.holder.take() {
                let _ = holder.kill();
                let _ = holder.wait();
            }
        }
        for ns in self.namespaces.iter().rev() {
            let _ = ip(&["netns", "delete", ns]);
            let _ = std::fs::remove_dir_all(Path::new("/etc/netns").join(ns));
        }
        // Only when no other test's namespace needs it.
        let _ = std::fs::remove_dir("/etc/netns");
    }
}
