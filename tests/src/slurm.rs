//! A private single-node Slurm cluster for the `slurm` runner's tests: `munged`, `slurmctld`
//! and `slurmd` (Debian's `munge` and `slurm-wlm`) in a temporary directory, on free ports,
//! with their own munge key and socket, stopped (jobs cancelled first) when dropped. Nothing of
//! the machine's own Slurm or munge configuration is read or touched: the clients find this
//! cluster through `SLURM_CONF`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DAEMONS: [&str; 3] = [
    "/usr/sbin/munged",
    "/usr/sbin/slurmctld",
    "/usr/sbin/slurmd",
];

/// Whether a cluster can be started here (Slurm and munge installed, running as root, which
/// `slurmd` needs to start job steps). Panics with the reason when it must
/// (`MST_REQUIRE_SLURM=1`, set by `cargo xtask test`) and cannot.
pub fn available() -> bool {
    let missing: Vec<&str> = DAEMONS
        .iter()
        .chain(&["/usr/bin/salloc", "/usr/bin/srun"])
        .copied()
        .filter(|p| !Path::new(p).is_file())
        .collect();
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let why = match (missing.is_empty(), root) {
        (false, _) => format!(
            "{} missing (apt-get install slurm-wlm munge)",
            missing.join(", ")
        ),
        (true, false) => "slurmd must run as root".to_string(),
        (true, true) => return true,
    };
    if std::env::var_os("MST_REQUIRE_SLURM").is_some() {
        panic!("MST_REQUIRE_SLURM is set but no Slurm cluster can start here: {why}");
    }
    eprintln!("skipped: no Slurm here: {why}");
    false
}

/// One running cluster of one node.
pub struct Cluster {
    dir: tempfile::TempDir,
    /// The node's name (also its partition's only node).
    pub node: String,
    /// CPUs the node offers.
    pub cpus: u32,
    daemons: Vec<Child>,
}

impl Cluster {
    /// Starts a cluster whose node offers `cpus` CPUs, and waits until it takes jobs.
    pub fn start(cpus: u32) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let path = |name: &str| crate::s(&root.join(name)).to_string();
        for sub in ["state", "spool"] {
            std::fs::create_dir(dir.path().join(sub)).unwrap();
        }
        let mut key = vec![0u8; 1024];
        std::io::Read::read_exact(&mut std::fs::File::open("/dev/urandom").unwrap(), &mut key)
            .unwrap();
        std::fs::write(dir.path().join("munge.key"), key).unwrap();
        std::fs::set_permissions(
            dir.path().join("munge.key"),
            std::os::unix::fs::PermissionsExt::from_mode(0o400),
        )
        .unwrap();
        let host = String::from_utf8(Command::new("hostname").arg("-s").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        let (ctld_port, slurmd_port) = (crate::free_port(), crate::free_port());
        // A name of its own, so clusters of tests running at once never share a node.
        let node = format!("mst{slurmd_port}");
        let config = format!(
            "ClusterName=mst{ctld_port}\nSlurmctldHost={host}(127.0.0.1)\n\
             SlurmctldPort={ctld_port}\nSlurmdPort={slurmd_port}\n\
             SlurmUser=root\nSlurmdUser=root\n\
             AuthType=auth/munge\nAuthInfo=socket={sock}\nCredType=cred/munge\n\
             StateSaveLocation={state}\nSlurmdSpoolDir={spool}\n\
             SlurmctldPidFile={ctld_pid}\nSlurmdPidFile={slurmd_pid}\n\
             SlurmctldLogFile={ctld_log}\nSlurmdLogFile={slurmd_log}\n\
             ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
             SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\n\
             JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n\
             JobAcctGatherType=jobacct_gather/none\nMpiDefault=none\nReturnToService=2\n\
             SchedulerType=sched/backfill\n\
             NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} \
             RealMemory=1000 State=UNKNOWN\n\
             PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP\n",
            sock = path("munge.sock"),
            state = path("state"),
            spool = path("spool"),
            ctld_pid = path("slurmctld.pid"),
            slurmd_pid = path("slurmd.pid"),
            ctld_log = path("slurmctld.log"),
            slurmd_log = path("slurmd.log"),
        );
        std::fs::write(dir.path().join("slurm.conf"), config).unwrap();
        let mut cluster = Cluster {
            node,
            cpus,
            daemons: Vec::new(),
            dir,
        };
        let conf = cluster.conf();
        let munged = [
            "-F",
            "--force",
            &format!("--socket={}", path("munge.sock")),
            &format!("--key-file={}", path("munge.key")),
            &format!("--log-file={}", path("munged.log")),
            &format!("--pid-file={}", path("munged.pid")),
            &format!("--seed-file={}", path("munged.seed")),
        ]
        .map(String::from);
        cluster.spawn(DAEMONS[0], &munged);
        wait_for(Duration::from_secs(10), "munged's socket", || {
            cluster.dir.path().join("munge.sock").exists()
        });
        cluster.spawn(
            DAEMONS[1],
            &["-D".into(), "-f".into(), crate::s(&conf).into()],
        );
        let name = cluster.node.clone();
        cluster.spawn(
            DAEMONS[2],
            &[
                "-D".into(),
                "-N".into(),
                name,
                "-f".into(),
                crate::s(&conf).into(),
            ],
        );
        let started = Instant::now();
        loop {
            let state = cluster.output("sinfo", &["--noheader", "--Node", "--format=%t"]);
            if state.trim() == "idle" {
                break;
            }
            if started.elapsed() > Duration::from_secs(60) {
                panic!(
                    "the Slurm node never became idle (sinfo: {state:?})\n{}",
                    cluster.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        cluster
    }

    fn spawn(&mut self, program: &str, args: &[String]) {
        let child = Command::new(program)
            .args(args)
            .env("SLURM_CONF", self.conf())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        self.daemons.push(child);
    }

    /// The cluster's `slurm.conf`: what `SLURM_CONF` must name for its clients (mst included).
    pub fn conf(&self) -> PathBuf {
        self.dir.path().join("slurm.conf")
    }

    /// A Slurm client command (`squeue`, `scancel`, …) pointed at this cluster.
    pub fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command.env("SLURM_CONF", self.conf());
        command
    }

    /// What a Slurm client printed on stdout (stderr on failure is empty output).
    pub fn output(&self, program: &str, args: &[&str]) -> String {
        self.command(program)
            .args(args)
            .stderr(Stdio::null())
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    }

    /// The cluster's jobs as `id|name|state|reason|comment` lines (finished ones included
    /// while Slurm remembers them).
    pub fn jobs(&self) -> Vec<String> {
        self.output(
            "squeue",
            &["--noheader", "--states=all", "--format=%i|%j|%T|%r|%k"],
        )
        .lines()
        .map(str::to_string)
        .collect()
    }

    /// The cluster's live (pending or running) jobs, as [`Cluster::jobs`] lines.
    pub fn live_jobs(&self) -> Vec<String> {
        self.jobs()
            .into_iter()
            .filter(|j| {
                j.contains("|PENDING|") || j.contains("|RUNNING|") || j.contains("|CONFIGURING|")
            })
            .collect()
    }

    /// The daemons' logs, for failures.
    pub fn logs(&self) -> String {
        ["munged.log", "slurmctld.log", "slurmd.log"]
            .iter()
            .map(|name| {
                let text = std::fs::read_to_string(self.dir.path().join(name)).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(20).collect();
                let tail: Vec<&str> = tail.into_iter().rev().collect();
                format!("--- {name}\n{}", tail.join("\n"))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // Jobs first, so their steps (slurmstepd runs apart from slurmd) end with them.
        let _ = self
            .command("scancel")
            .arg("--full")
            .arg("--partition=debug")
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while !self.live_jobs().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for child in self.daemons.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // Step daemons outlive slurmd (a `slurmstepd` still reporting a step's end would wait
        // for it forever), and so may what they ran: everything that inherited this cluster's
        // configuration goes.
        let ours = format!("SLURM_CONF={}", crate::s(&self.conf()));
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
            if environ.split(|b| *b == 0).any(|v| v == ours.as_bytes()) {
                // SAFETY: kill(2) on a process of this test's cluster.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
        }
    }
}

/// Waits up to `limit` for `ready`, panicking with `what`.
fn wait_for(limit: Duration, what: &str, ready: impl Fn() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "{what} never appeared");
        std::thread::sleep(Duration::from_millis(50));
    }
}
