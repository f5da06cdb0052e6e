//! Which mst process owns something (a container, a runner plugin's machines, a run being
//! collected), told apart from every other process that ever had its pid: by host, boot, pid
//! namespace, pid and start time. Whoever finds the thing later can prove its owner gone, or
//! learn that it cannot tell. Containers carry these facts as labels, the runner plugins'
//! ledger as the same map, a run as `process.json`.

use serde::{Deserialize, Serialize};
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

/// A process that may own containers, machines and runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Owner {
    pub host: String,
    pub boot: String,
    pub pid_namespace: String,
    pub pid: u32,
    /// Start time in clock ticks since boot; 0 when unknown.
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

    /// The owner `labels` name, when they name one (a pid at least).
    fn from_labels(labels: &HashMap<String, String>) -> Option<Owner> {
        let text = |key: &str| labels.get(key).cloned().unwrap_or_default();
        Some(Owner {
            host: text(HOST),
            boot: text(BOOT),
            pid_namespace: text(PID_NAMESPACE),
            pid: labels.get(PID)?.parse().ok()?,
            started: labels
                .get(STARTED)
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
        })
    }

    /// Whether `self` is provably gone, as seen from this process (`self` being `here`'s
    /// view): one on `here`'s machine, in its boot and pid namespace, whose process no longer
    /// exists or whose pid now names a process started at another time. Anything `here`
    /// cannot prove gone (another machine, boot or namespace; a live pid whose start time was
    /// not recorded) is taken as alive.
    pub fn is_gone(&self, here: &Owner) -> bool {
        let same = |ours: &str, theirs: &str| !ours.is_empty() && ours == theirs;
        if !same(&here.host, &self.host)
            || !same(&here.boot, &self.boot)
            || !same(&here.pid_namespace, &self.pid_namespace)
        {
            return false;
        }
        match start_time(self.pid) {
            None => true,
            Some(now) => self.started != 0 && self.started != now,
        }
    }

    /// Whether this process (of this machine, boot and pid namespace: the caller checked) is
    /// alive and the same one: its pid's start time is the recorded one.
    pub fn is_alive_here(&self) -> bool {
        self.started != 0 && start_time(self.pid) == Some(self.started)
    }

    /// Whether a container (or ledger entry) with `labels` was made by an mst that is gone,
    /// as seen from this owner ([`Owner::is_gone`]).
    pub fn is_orphan(&self, labels: &HashMap<String, String>) -> bool {
        Owner::from_labels(labels).is_some_and(|owner| owner.is_gone(self))
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

/// A live process's start time (field 22 of /proc/PID/stat), `None` when it is gone: no such
/// process, or a zombie (dead, not yet reaped; an orphan's may never be where no init reaps).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last `)`.
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    let state = fields.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_containers_of_gone_processes_on_this_host_are_orphans() {
        let me = Owner::current();
        assert!(me.started > 0);
        assert!(!me.is_orphan(&me.labels()), "a live owner");
        assert!(!me.is_gone(&me), "a live owner");
        let mut gone = me.labels();
        gone.insert(PID.into(), "4194303".into());
        assert!(me.is_orphan(&gone), "no such process");
        let mut reused = me.labels();
        reused.insert(STARTED.into(), "1".into());
        assert!(me.is_orphan(&reused), "the pid now names another process");
        let mut unknown_start = me.labels();
        unknown_start.remove(STARTED);
        assert!(!me.is_orphan(&unknown_start), "alive, start not recorded");
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

    #[test]
    fn a_dead_process_not_yet_reaped_is_gone() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .unwrap();
        let me = Owner::current();
        let owner = Owner {
            pid: child.id(),
            started: start_time(child.id()).unwrap(),
            ..me.clone()
        };
        assert!(!owner.is_gone(&me), "alive");
        // Not waited for: once it exits it is a zombie until `wait` below.
        let zombie = || {
            std::fs::read_to_string(format!("/proc/{}/stat", owner.pid))
                .is_ok_and(|s| s.rsplit_once(')').unwrap().1.trim_start().starts_with('Z'))
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !zombie() {
            assert!(std::time::Instant::now() < deadline, "it never exited");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert!(owner.is_gone(&me), "a zombie is gone");
        child.wait().unwrap();
    }

    #[test]
    fn an_owner_reads_back_as_written() {
        let me = Owner::current();
        let text = serde_json::to_string(&me).unwrap();
        assert!(text.contains("\"pidNamespace\""), "{text}");
        assert_eq!(serde_json::from_str::<Owner>(&text).unwrap(), me);
    }
}
