//! The local machine's resource limits (`--runner-option memory=SIZE`, `pids=N`, `cpus=N`): a control group
//! made for the machine under mst's own, which the worker joins as it starts, so that it and
//! everything it starts share the limits (an agent past `memory` is killed by the kernel, as
//! in a container). Both hierarchies are supported: cgroup v2 (one tree, the `memory`, `pids`
//! and `cpu` controllers delegated to mst's group) and v1 (a tree per controller).

use anyhow::{bail, Context, Result};
use std::ffi::CString;
use std::path::{Path, PathBuf};

/// Where the control groups are mounted.
const ROOT: &str = "/sys/fs/cgroup";

/// The limits a local machine may get.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    /// Bytes of memory (swap included where the kernel counts it) for all its processes.
    pub memory: Option<u64>,
    /// How many processes and threads it may have at once.
    pub pids: Option<u64>,
    /// How many CPUs' worth of time it may use (1.5: one and a half), as Docker's `--cpus`.
    pub cpus: Option<f64>,
}

/// The scheduler period the CPU quota is a share of, in microseconds (the kernel's and
/// Docker's default).
const CPU_PERIOD_US: u64 = 100_000;

impl Limits {
    /// Whether any limit is set.
    pub fn any(&self) -> bool {
        self.memory.is_some() || self.pids.is_some() || self.cpus.is_some()
    }

    /// The CPU quota per [`CPU_PERIOD_US`], in microseconds.
    fn cpu_quota_us(&self) -> Option<u64> {
        self.cpus
            .map(|cpus| (cpus * CPU_PERIOD_US as f64).round() as u64)
    }
}

/// A machine's control group(s): one directory on cgroup v2, one per controller on v1.
#[derive(Debug)]
pub struct Cgroup {
    dirs: Vec<PathBuf>,
    /// Each directory's `cgroup.procs`, ready for [`Cgroup::join`] in a child about to exec.
    procs: Vec<CString>,
}

impl Cgroup {
    /// Makes the control group `name` below this process's own with `limits`, or says what
    /// this host lacks for them.
    pub fn create(name: &str, limits: &Limits) -> Result<Self> {
        let own = std::fs::read_to_string("/proc/self/cgroup")
            .context("cannot read /proc/self/cgroup")?;
        let mut cgroup = Cgroup {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        let made = match Path::new(ROOT).join("cgroup.controllers").exists() {
            true => cgroup.make_v2(&own, name, limits),
            false => cgroup.make_v1(&own, name, limits),
        };
        match made {
            Ok(()) => Ok(cgroup),
            Err(e) => {
                cgroup.remove();
                Err(e.context(format!(
                    "--runner-option memory/pids/cpus: cannot make a control group for the local \
                     machine (this needs write access to {ROOT}: on cgroup v2, a group \
                     delegated to mst with no other process in it, e.g. under `systemd-run \
                     --user --scope -p Delegate=yes mst …`, since v2 enables controllers only \
                     for groups whose parent holds no process; on v1, the memory, pids and cpu \
                     hierarchies); run mst where it has that, or leave the limits out"
                )))
            }
        }
    }

    fn make_v2(&mut self, own: &str, name: &str, limits: &Limits) -> Result<()> {
        let Some(path) = own.lines().find_map(|line| line.strip_prefix("0::")) else {
            bail!("/proc/self/cgroup names no cgroup v2 group");
        };
        let parent = Path::new(ROOT).join(path.trim_start_matches('/'));
        let wanted: Vec<&str> = [
            limits.memory.map(|_| "memory"),
            limits.pids.map(|_| "pids"),
            limits.cpus.map(|_| "cpu"),
        ]
        .into_iter()
        .flatten()
        .collect();
        let enable: String = wanted.iter().map(|c| format!("+{c} ")).collect();
        write(&parent.join("cgroup.subtree_control"), enable.trim())?;
        let dir = self.make_dir(&parent, name)?;
        if let Some(bytes) = limits.memory {
            write(&dir.join("memory.max"), &bytes.to_string())?;
            write(&dir.join("memory.swap.max"), "0").ok();
        }
        if let Some(pids) = limits.pids {
            write(&dir.join("pids.max"), &pids.to_string())?;
        }
        if let Some(quota) = limits.cpu_quota_us() {
            write(&dir.join("cpu.max"), &format!("{quota} {CPU_PERIOD_US}"))?;
        }
        Ok(())
    }

    fn make_v1(&mut self, own: &str, name: &str, limits: &Limits) -> Result<()> {
        if let Some(bytes) = limits.memory {
            let dir = self.make_dir(&v1_parent(own, "memory")?, name)?;
            write(&dir.join("memory.limit_in_bytes"), &bytes.to_string())?;
            // Where swap is counted, it counts against the same limit.
            let swap = dir.join("memory.memsw.limit_in_bytes");
            if swap.exists() {
                write(&swap, &bytes.to_string())?;
            }
        }
        if let Some(pids) = limits.pids {
            let dir = self.make_dir(&v1_parent(own, "pids")?, name)?;
            write(&dir.join("pids.max"), &pids.to_string())?;
        }
        if let Some(quota) = limits.cpu_quota_us() {
            let dir = self.make_dir(&v1_parent(own, "cpu")?, name)?;
            write(&dir.join("cpu.cfs_period_us"), &CPU_PERIOD_US.to_string())?;
            write(&dir.join("cpu.cfs_quota_us"), &quota.to_string())?;
        }
        Ok(())
    }

    /// Makes `parent/name`, remembered for [`Cgroup::join`] and [`Cgroup::remove`].
    fn make_dir(&mut self, parent: &Path, name: &str) -> Result<PathBuf> {
        let dir = parent.join(name);
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let procs = dir.join("cgroup.procs");
        self.procs
            .push(CString::new(procs.as_os_str().as_encoded_bytes()).context("a path with a NUL")?);
        self.dirs.push(dir.clone());
        Ok(dir)
    }

    /// The `cgroup.procs` files a process writes itself into to join, for a child between
    /// `fork` and `exec` ([`join`]).
    pub fn procs(&self) -> Vec<CString> {
        self.procs.clone()
    }

    /// Removes the groups; a group that still holds a process (one that outlived the worker)
    /// stays, and is named.
    pub fn remove(&mut self) -> Vec<PathBuf> {
        let mut left = Vec::new();
        for dir in self.dirs.drain(..).rev() {
            // The kernel lets a group go only once its last process has been reaped.
            let removed = (0..20).any(|_| {
                std::fs::remove_dir(&dir).is_ok() || {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                    false
                }
            });
            if !removed {
                left.push(dir);
            }
        }
        left
    }
}

/// Writes the calling process into each of `procs` (`cgroup.procs` files): called in a child
/// between `fork` and `exec`, so only async-signal-safe calls (`open`, `write`, `close`).
pub fn join(procs: &[CString]) -> std::io::Result<()> {
    for path in procs {
        // SAFETY: a valid C string; the descriptor is closed before returning.
        let fd = unsafe { libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // "0" is the writing process itself, on v1 and v2 alike.
        let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        let error = std::io::Error::last_os_error();
        unsafe { libc::close(fd) };
        if written != 1 {
            return Err(error);
        }
    }
    Ok(())
}

/// This process's own group in v1's hierarchy of `controller`.
fn v1_parent(own: &str, controller: &str) -> Result<PathBuf> {
    // Each line is `ID:CONTROLLERS:PATH`.
    let path = own
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once(':')?;
            rest.split_once(':')
        })
        .find(|(controllers, _)| controllers.split(',').any(|c| c == controller))
        .map(|(_, path)| path)
        .with_context(|| format!("this host has no cgroup v1 `{controller}` hierarchy"))?;
    Ok(Path::new(ROOT)
        .join(controller)
        .join(path.trim_start_matches('/')))
}

/// Writes `value` to the control file `path`.
fn write(path: &Path, value: &str) -> Result<()> {
    std::fs::write(path, value)
        .with_context(|| format!("cannot write {value:?} to {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_v1_group_is_made_below_this_process_own_in_each_controllers_tree() {
        let own = "9:name=systemd:/\n8:pids:/\n4:memory:/api/abc\n2:cpu,cpuacct:/x\n0::/\n";
        assert_eq!(
            v1_parent(own, "memory").unwrap(),
            Path::new("/sys/fs/cgroup/memory/api/abc")
        );
        assert_eq!(
            v1_parent(own, "pids").unwrap(),
            Path::new("/sys/fs/cgroup/pids")
        );
        assert!(v1_parent(own, "blkio").is_err());
    }
}
