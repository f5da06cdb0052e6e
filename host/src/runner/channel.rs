//! The channel to a machine: run a command with stdin and stdout attached, copy a directory to
//! the machine, copy one file back. Every runner provides these, so the coordinator's code is
//! the same whatever the machine is.

use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

/// A command running on a machine.
pub struct Process {
    pub stdin: Box<dyn Write + Send>,
    pub stdout: Box<dyn Read + Send>,
    pub stderr: Box<dyn Read + Send>,
    pub handle: Box<dyn ProcessHandle>,
}

/// Controls a running command.
pub trait ProcessHandle: Send {
    /// Stops it at once.
    fn kill(&mut self);
    /// Waits for it to end; its exit code, if it had one.
    fn wait(&mut self) -> Option<i32>;
    /// Waits at most `limit` for it to end: `Some(exit code)` if it did. Runners whose
    /// processes always end with their machine's side may keep the blocking default.
    fn wait_timeout(&mut self, _limit: std::time::Duration) -> Option<Option<i32>> {
        Some(self.wait())
    }
}

/// A host process with its stdio piped, leading its own process group.
pub struct ChildProcess(Child);

impl ChildProcess {
    /// Starts `command` as the leader of a new process group with stdin, stdout and stderr
    /// piped; `what` names it in the error.
    pub fn spawn(mut command: Command, what: &str) -> Result<Process> {
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {what}"))?;
        Ok(Process {
            stdin: Box::new(child.stdin.take().expect("piped")),
            stdout: Box::new(child.stdout.take().expect("piped")),
            stderr: Box::new(child.stderr.take().expect("piped")),
            handle: Box::new(ChildProcess(child)),
        })
    }
}

impl ProcessHandle for ChildProcess {
    fn kill(&mut self) {
        // Kill the group: everything the process started goes too, so no orphan keeps the
        // channel's pipes open.
        // SAFETY: kill(2) on the group `spawn` created for this process.
        unsafe {
            libc::kill(-(self.0.id() as i32), libc::SIGKILL);
        }
        let _ = self.0.kill();
    }
    fn wait(&mut self) -> Option<i32> {
        self.0.wait().ok().and_then(|s| s.code())
    }
    fn wait_timeout(&mut self, limit: std::time::Duration) -> Option<Option<i32>> {
        let started = std::time::Instant::now();
        loop {
            match self.0.try_wait() {
                Ok(Some(status)) => return Some(status.code()),
                Err(_) => return Some(None),
                Ok(None) if started.elapsed() >= limit => return None,
                Ok(None) => std::thread::sleep(std::time::Duration::from_millis(10)),
            }
        }
    }
}

/// A machine's channel. Paths on the machine are relative to its work directory.
pub trait Channel: Send {
    /// One line for progress output, e.g. `local (/tmp/mst-…)`.
    fn describe(&self) -> String;
    /// Copies the local directory `src` to `dest` on the machine.
    fn put(&mut self, src: &Path, dest: &str) -> Result<()>;
    /// Starts `argv` on the machine; `{workdir}` in an argument expands to the work directory.
    fn exec(&mut self, argv: &[String]) -> Result<Process>;
    /// Copies the file `src` (relative, no `..`) from the machine to the local path `dest`,
    /// refusing links, devices, FIFOs and files over `cap` bytes.
    fn get(&mut self, src: &str, dest: &Path, cap: u64) -> Result<()>;
    /// Copies several files back, as [`get`](Channel::get) does each; one result per file.
    fn get_many(&mut self, files: &[(String, std::path::PathBuf)], cap: u64) -> Vec<Result<()>> {
        files
            .iter()
            .map(|(src, dest)| self.get(src, dest, cap))
            .collect()
    }
    /// Whether copies cost enough that the coordinator should batch them (a few per second)
    /// rather than copy each trace the moment it is reported.
    fn batch_copies(&self) -> bool {
        false
    }
    /// Releases the machine; with `keep`, leaves it for inspection and says where.
    fn dispose(&mut self, keep: bool) -> Result<Option<String>>;
    /// After a shard failed: what the machine itself says went wrong (it ran out of memory, it
    /// vanished), if anything.
    fn diagnose(&mut self) -> Option<String> {
        None
    }
    /// When the runner started making this machine, after any wait for room on its hosts.
    fn started_at(&self) -> Option<std::time::Instant> {
        None
    }
    /// What `run.json` records about the machine (host, image, …).
    fn provenance(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
}
