//! The machines a runner plugin made, written down per mst process in
//! `$MST_HOME/machines/<plugin>/`, so that a later run releases, through the plugin's own
//! `dispose-machine`, those of an mst that died without disposing of them (SIGKILL, a crash,
//! a lost machine). A plugin cannot tell whether the mst that made a machine is alive (the
//! runner interface gives it the run id only); the host can, with the owner facts the Docker
//! runner labels its containers with ([`Owner`]). Kept machines are not written down: they
//! are left on purpose.

use crate::owner::Owner;
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// What one process's file holds.
#[derive(Serialize, Deserialize, Default)]
struct Entry {
    /// The owning process ([`Owner::labels`]).
    owner: HashMap<String, String>,
    /// The plugin's machine ids not yet disposed of.
    machines: Vec<String>,
}

/// This process's record of one runner plugin's machines.
pub struct Ledger {
    dir: PathBuf,
    path: PathBuf,
    owner: Owner,
    machines: Mutex<Vec<String>>,
}

/// Letters, digits, `.`, `_`, `-`; anything else becomes `-`.
fn file_part(text: &str) -> String {
    text.chars()
        .map(|c| match c.is_ascii_alphanumeric() || "._-".contains(c) {
            true => c,
            false => '-',
        })
        .collect()
}

impl Ledger {
    /// The ledger of `plugin` under `root` (`$MST_HOME`) for this process.
    pub fn open(root: &Path, plugin: &str) -> Ledger {
        let owner = Owner::current();
        let dir = root.join("machines").join(file_part(plugin));
        let path = dir.join(format!(
            "{}-{}-{}.json",
            file_part(&owner.host),
            owner.pid,
            owner.started
        ));
        Ledger {
            dir,
            path,
            owner,
            machines: Mutex::new(Vec::new()),
        }
    }

    /// Writes down a machine just made. A failure to write is a warning, not the shard's end:
    /// the machine works, only its clean-up after a crash is at stake.
    pub fn add(&self, id: &str) {
        let mut machines = self.machines.lock().expect("ledger");
        machines.push(id.to_string());
        self.save(&machines);
    }

    /// Crosses out a machine disposed of (or kept).
    pub fn remove(&self, id: &str) {
        let mut machines = self.machines.lock().expect("ledger");
        if let Some(at) = machines.iter().position(|m| m == id) {
            machines.remove(at);
        }
        self.save(&machines);
    }

    fn save(&self, machines: &[String]) {
        let written = match machines.is_empty() {
            true => match std::fs::remove_file(&self.path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e.into()),
                _ => Ok(()),
            },
            false => crate::home::create_private_dir(&self.dir).and_then(|()| {
                let entry = Entry {
                    owner: self.owner.labels(),
                    machines: machines.to_vec(),
                };
                let tmp = self.path.with_extension("tmp");
                std::fs::write(&tmp, serde_json::to_vec(&entry)?)?;
                std::fs::rename(&tmp, &self.path)?;
                Ok(())
            }),
        };
        if let Err(e) = written {
            tracing::warn!(
                "cannot record runner machines in {}: {e:#}; if this mst dies, its machines \
                 are not released by the next run",
                self.path.display()
            );
        }
    }

    /// Takes the machines of processes that are gone (this machine, this boot, pid gone or
    /// reused) out of the ledger: their ids, for the caller to dispose of. Files this process
    /// cannot prove to be an orphan's are left alone.
    pub fn take_orphans(&self) -> Vec<String> {
        let mut ids = Vec::new();
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return ids;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path == self.path || path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let Ok(entry) = std::fs::read(&path)
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(serde_json::from_slice::<Entry>(&b)?))
            else {
                continue;
            };
            // Removed first: two runs starting at once never both release the same machines.
            if self.owner.is_orphan(&entry.owner) && std::fs::remove_file(&path).is_ok() {
                ids.extend(entry.machines);
            }
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn machines_of_a_gone_process_are_taken_once_and_live_ones_never() {
        let home = tempfile::tempdir().unwrap();
        let ours = Ledger::open(home.path(), "acme/runner/x");
        ours.add("m1");
        ours.add("m2");
        ours.remove("m1");
        let written: Entry = serde_json::from_slice(&std::fs::read(&ours.path).unwrap()).unwrap();
        assert_eq!(written.machines, ["m2"]);

        // Another process of this machine that is gone: a pid that cannot exist.
        let mut gone = Owner::current();
        gone.pid = u32::MAX;
        let entry = Entry {
            owner: gone.labels(),
            machines: vec!["old".into()],
        };
        std::fs::write(
            ours.dir.join("gone.json"),
            serde_json::to_vec(&entry).unwrap(),
        )
        .unwrap();
        // And one of another machine, which this process cannot judge.
        let mut elsewhere = gone.clone();
        elsewhere.host = "another-host".into();
        let entry = Entry {
            owner: elsewhere.labels(),
            machines: vec!["theirs".into()],
        };
        std::fs::write(
            ours.dir.join("elsewhere.json"),
            serde_json::to_vec(&entry).unwrap(),
        )
        .unwrap();

        let next = Ledger::open(home.path(), "acme/runner/x");
        assert_eq!(next.take_orphans(), ["old"]);
        assert!(next.take_orphans().is_empty(), "taken once");
        assert!(ours.dir.join("elsewhere.json").exists());
        ours.remove("m2");
        assert!(!ours.path.exists(), "an empty ledger is no file");
    }
}
