//! Which mst process owns a container, recorded in its labels, so that a run can remove the
//! containers of an mst that was killed outright (SIGKILL, a crash) and leave everyone else's.

use std::collections::HashMap;

/// Label: the host name of the machine whose mst started the container.
pub const HOST: &str = "mst.owner.host";
/// Label: that mst's process id.
pub const PID: &str = "mst.owner.pid";
/// Label: that process's start time in clock ticks since boot, so a reused pid is not taken
/// for the owner.
pub const STARTED: &str = "mst.owner.started";
/// Label: the boot of the machine (its kernel's boot id), so two machines that share a host
/// name, or a machine before and after a reboot, are told apart.
pub const BOOT: &str = "mst.owner.boot";
/// Label: the owner's pid namespace, so processes this mst cannot see are not taken for gone.
pub const PID_NAMESPACE: &str = "mst.owner.pidns";
/// Label: the run the container belongs to.
pub const RUN: &str = "mst.run";
/// Label: the shard it runs.
pub const SHARD: &str = "mst.shard";

/// A process that may own containers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub host: String,
    pub boot: String,
    pub pid_namespace: String,
    pub pid: u32,
    pub started: u64,
}

impl Owner {
    /// This process.
    pub fn current() -> Owner {
        let pid = std::process::id();
        Owner {
            host: host_name(),
            boot: std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
                .map(|b| b.trim().to_string())
                .unwrap_or_default(),
            pid_namespace: std::fs::read_link("/proc/self/ns/pid")
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
            pid,
            started: start_time(pid).unwrap_or(0),
        }
    }

    /// The labels that name this owner.
    pub fn labels(&self) -> HashMap<String, String> {
        HashMap::from([
            (HOST.to_string(), self.host.clone()),
            (BOOT.to_string(), self.boot.clone()),
            (PID_NAMESPACE.to_string(), self.pid_namespace.clone()),
            (PID.to_string(), self.pid.to_string()),
            (STARTED.to_string(), self.started.to_string()),
        ])
    }

    /// Whether a container with `labels` was started by an mst that is gone: one on this
    /// machine, in this boot and this pid namespace, whose process no longer exists. Anything
    /// this process cannot prove to be an orphan is left alone.
    pub fn is_orphan(&self, labels: &HashMap<String, String>) -> bool {
        let same = |key: &str, ours: &str| {
            !ours.is_empty() && labels.get(key).map(String::as_str) == Some(ours)
        };
        if !same(HOST, &self.host)
            || !same(BOOT, &self.boot)
            || !same(PID_NAMESPACE, &self.pid_namespace)
        {
            return false;
        }
        let Some(pid) = labels.get(PID).and_then(|p| p.parse::<u32>().ok()) else {
            return false;
        };
        let started = labels.get(STARTED).and_then(|s| s.parse::<u64>().ok());
        match start_time(pid) {
            None => true,
            Some(now) => started.is_some_and(|s| s != now),
        }
    }
}

/// This machine's host name.
fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// A live process's start time (field 22 of /proc/PID/stat), `None` when it is gone.
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_containers_of_gone_processes_on_this_host_are_orphans() {
        let me = Owner::current();
        assert!(me.started > 0);
        assert!(!me.is_orphan(&me.labels()), "a live owner");
        let mut gone = me.labels();
        gone.insert(PID.into(), "4194303".into());
        assert!(me.is_orphan(&gone), "no such process");
        let mut reused = me.labels();
        reused.insert(STARTED.into(), "1".into());
        assert!(me.is_orphan(&reused), "the pid now names another process");
        for (key, other) in [
            (HOST, "another-machine"),
            (BOOT, "another-boot"),
            (PID_NAMESPACE, "pid:[1]"),
        ] {
            let mut elsewhere = gone.clone();
            elsewhere.insert(key.into(), other.into());
            assert!(
                !me.is_orphan(&elsewhere),
                "{key}: cannot tell, so left alone"
            );
        }
        assert!(!me.is_orphan(&HashMap::new()));
    }
}
