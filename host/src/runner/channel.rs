//! The channel to a machine: run a command with stdin and stdout attached, copy a directory to
//! the machine, copy one file back. Every runner provides these, so the coordinator's code is
//! the same whatever the machine is.

use crate::process::GroupChild;
use anyhow::{Context, Result};
use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Stdio};

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
pub struct ChildProcess(GroupChild);

impl ChildProcess {
    /// Starts `command` as the leader of a new process group with stdin, stdout and stderr
    /// piped; `what` names it in the error.
    pub fn spawn(mut command: Command, what: &str) -> Result<Process> {
        let mut child = GroupChild::spawn(
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        )
        .with_context(|| format!("cannot start {what}"))?;
        let (stdin, stdout, stderr) = child.take_pipes();
        Ok(Process {
            stdin: Box::new(stdin.expect("piped")),
            stdout: Box::new(stdout.expect("piped")),
            stderr: Box::new(stderr.expect("piped")),
            handle: Box::new(ChildProcess(child)),
        })
    }
}

impl ProcessHandle for ChildProcess {
    fn kill(&mut self) {
        // The whole group: everything the process started goes too, so no orphan keeps the
        // channel's pipes open.
        self.0.kill_group();
    }
    fn wait(&mut self) -> Option<i32> {
        self.0.wait().and_then(|s| s.code())
    }
    fn wait_timeout(&mut self, limit: std::time::Duration) -> Option<Option<i32>> {
        self.0
            .wait_until(std::time::Instant::now() + limit)
            .map(|status| status.and_then(|s| s.code()))
    }
}

/// What [`Channel::get`] refused to copy: the machine offered something other than a regular
/// file within the cap (a link, a FIFO, a device, a file over the cap). Unlike a copy that
/// failed on the way (which leaves the trial missing, for a resume), this is the machine's
/// doing, and its trial counts as an infrastructure failure.
#[derive(Debug)]
pub struct Refused(pub String);

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

impl Refused {
    /// Whether `error` (or anything it wraps) is a refusal.
    pub fn is(error: &anyhow::Error) -> bool {
        error.downcast_ref::<Refused>().is_some()
    }
}

/// A machine left for inspection (`keep`), as the run prints it and `run.json` records it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KeptMachine {
    /// Where it is, and how to remove it when that is not obvious.
    pub at: String,
    /// A command that gets a shell inside it, e.g. `docker exec -it NAME sh`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enter: Option<String>,
}

impl std::fmt::Display for KeptMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.enter {
            Some(enter) => write!(f, "{}; get in with: {enter}", self.at),
            None => f.write_str(&self.at),
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
    /// Reads several files back into memory, each as [`get`](Channel::get) would copy it to
    /// its landing path (which a channel may use on the way, and which the caller overwrites
    /// or removes); one result per file. The coordinator checks a trace in memory before it
    /// stores it, so a channel that can read in place (the local one) spares a copy.
    fn read_many(
        &mut self,
        files: &[(String, std::path::PathBuf)],
        cap: u64,
    ) -> Vec<Result<Vec<u8>>> {
        self.get_many(files, cap)
            .into_iter()
            .zip(files)
            .map(|(got, (_, landed))| {
                got?;
                crate::files::read_regular(landed, cap, true)
            })
            .collect()
    }
    /// Whether copies cost enough that the coordinator should batch them (a few per second)
    /// rather than copy each trace the moment it is reported.
    fn batch_copies(&self) -> bool {
        false
    }
    /// Releases the machine; with `keep`, leaves it for inspection and says where it is and
    /// how to get into it.
    fn dispose(&mut self, keep: bool) -> Result<Option<KeptMachine>>;
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
