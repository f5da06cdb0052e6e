//! Evidence of a failed trial, gathered on the machine it ran on: the tail of its client's
//! output, the machine's free memory, load and disk, and its process list at the moment of
//! failure. The worker writes it into the trial's artefact directory (`mst-diagnosis/`), which
//! comes back with the trial's other artefacts (docs/results.md, "Artefacts").
//!
//! Everything here reads `/proc` and `statvfs` of the machine it runs on; elsewhere than on
//! Linux the facts it cannot read are left out rather than guessed.

use std::collections::VecDeque;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

/// Bytes kept of each of a client's output streams: its last 256 KiB.
pub const TAIL_BYTES: usize = 256 * 1024;
/// Processes listed at most: a host with more (the local runner shares the operator's) is cut.
pub const MAX_PROCESSES: usize = 2_000;
/// The directory, inside a trial's artefacts, that holds the worker's own diagnosis.
pub const DIAGNOSIS_DIR: &str = "mst-diagnosis";

/// The last [`TAIL_BYTES`] of an output stream, shared between the reader that fills it and
/// the worker that writes it out when the trial failed.
#[derive(Clone, Default)]
pub struct OutputTail(Arc<Mutex<VecDeque<u8>>>);

impl OutputTail {
    /// Adds `bytes`, dropping the oldest beyond the cap.
    pub fn push(&self, bytes: &[u8]) {
        let mut tail = self.0.lock().expect("output tail");
        let bytes = &bytes[bytes.len().saturating_sub(TAIL_BYTES)..];
        let over = (tail.len() + bytes.len()).saturating_sub(TAIL_BYTES);
        tail.drain(..over);
        tail.extend(bytes);
    }

    /// What is kept, oldest first.
    pub fn bytes(&self) -> Vec<u8> {
        let tail = self.0.lock().expect("output tail");
        let (front, back) = tail.as_slices();
        [front, back].concat()
    }
}

/// An async reader that copies every byte it reads into an [`OutputTail`] on the way, so a
/// client keeps the end of its program's output whatever part of it the trace keeps.
pub struct TailReader<R> {
    inner: R,
    tail: Option<OutputTail>,
}

impl<R> TailReader<R> {
    /// `inner`, with what is read from it also kept in `tail` (read as it is without one).
    pub fn new(inner: R, tail: Option<OutputTail>) -> Self {
        TailReader { inner, tail }
    }
}

impl<R: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for TailReader<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        if let (Poll::Ready(Ok(())), Some(tail)) = (&polled, &self.tail) {
            tail.push(&buf.filled()[before..]);
        }
        polled
    }
}

/// One trial's evidence as it is gathered: where its artefacts go (`$MST_ARTIFACTS`), the
/// tails of its client's output, and the process list taken at the moment it failed (a
/// client that kills its program at the deadline takes it first, while the program still
/// runs).
pub struct TrialEvidence {
    /// The trial's artefact directory on the machine.
    dir: PathBuf,
    pub stdout: OutputTail,
    pub stderr: OutputTail,
    processes: Mutex<Option<String>>,
    /// Whether the directory was handed to the client: one no one was told of is still empty
    /// after the trial, unless a diagnosis was written there.
    handed_out: std::sync::atomic::AtomicBool,
}

impl TrialEvidence {
    /// Evidence gathered into `dir`.
    pub fn new(dir: PathBuf) -> Self {
        TrialEvidence {
            dir,
            stdout: OutputTail::default(),
            stderr: OutputTail::default(),
            processes: Mutex::new(None),
            handed_out: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The artefact directory, for the worker's own use.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The artefact directory, to give the client (`$MST_ARTIFACTS`): from then on it may
    /// hold anything.
    pub fn hand_out(&self) -> &Path {
        self.handed_out
            .store(true, std::sync::atomic::Ordering::Relaxed);
        &self.dir
    }

    /// Whether [`Self::hand_out`] was called.
    pub fn handed_out(&self) -> bool {
        self.handed_out.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Takes the process list now, unless it was taken already: call it at the moment of
    /// failure, before anything is killed.
    pub fn at_failure(&self) {
        let mut processes = self.processes.lock().expect("processes");
        if processes.is_none() {
            *processes = Some(process_list());
        }
    }

    /// Writes the diagnosis of a failed trial into `mst-diagnosis/` of its artefact
    /// directory: `why` and the machine's state (`system.json`), the process list
    /// (`processes.txt`) and the output tails (`stdout.txt`, `stderr.txt`, when the client
    /// ran a program), each with every secret the worker holds redacted.
    pub fn write_diagnosis(&self, why: &str) -> std::io::Result<()> {
        self.at_failure();
        // Made here, never found: one the client made (or planted as a link) is refused.
        let dir = self.dir.join(DIAGNOSIS_DIR);
        std::fs::create_dir(&dir)?;
        let facts = MachineFacts::read(&self.dir);
        let system = serde_json::json!({"failure": why, "machine": facts});
        let mut system = serde_json::to_vec_pretty(&system).expect("facts serialize");
        system.push(b'\n');
        write_redacted(&dir.join("system.json"), &system)?;
        let processes = self.processes.lock().expect("processes").take();
        write_redacted(
            &dir.join("processes.txt"),
            processes.unwrap_or_default().as_bytes(),
        )?;
        for (name, tail) in [("stdout.txt", &self.stdout), ("stderr.txt", &self.stderr)] {
            let bytes = tail.bytes();
            if !bytes.is_empty() {
                write_redacted(&dir.join(name), &bytes)?;
            }
        }
        Ok(())
    }
}

/// Writes `bytes` to a new file at `path` with every held secret redacted. A file already
/// there (the client may have planted a link by that name) is refused, never followed.
fn write_redacted(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let redacted = crate::secrets::redactor();
    let bytes = redacted.redact_bytes(bytes);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    file.write_all(&bytes)
}

/// The machine's state, as far as this platform tells it.
#[derive(Debug, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineFacts {
    /// `MemTotal` and `MemAvailable` from `/proc/meminfo`, in bytes.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_total_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_available_bytes: Option<u64>,
    /// The 1, 5 and 15 minute load averages from `/proc/loadavg`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub load: Option<[f64; 3]>,
    /// The file system holding the trial's artefacts (its work directory's disk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_total_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disk_free_bytes: Option<u64>,
    /// When the facts were read, in Unix milliseconds.
    pub at_ms: u64,
}

impl MachineFacts {
    /// Reads the facts now, with the disk that holds `path`.
    pub fn read(path: &Path) -> Self {
        let mut facts = MachineFacts {
            at_ms: crate::clock::unix_millis(),
            ..MachineFacts::default()
        };
        if let Ok(meminfo) = std::fs::read_to_string("/proc/meminfo") {
            facts.memory_total_bytes = meminfo_bytes(&meminfo, "MemTotal");
            facts.memory_available_bytes = meminfo_bytes(&meminfo, "MemAvailable");
        }
        if let Ok(loadavg) = std::fs::read_to_string("/proc/loadavg") {
            facts.load = parse_load(&loadavg);
        }
        if let Ok(stat) = statvfs(path) {
            facts.disk_total_bytes = Some(stat.0);
            facts.disk_free_bytes = Some(stat.1);
        }
        facts
    }
}

/// The value of `key` in `/proc/meminfo`'s text, in bytes (the file says kB).
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    meminfo.lines().find_map(|line| {
        let rest = line.strip_prefix(key)?.strip_prefix(':')?;
        let kib: u64 = rest.split_whitespace().next()?.parse().ok()?;
        Some(kib * 1024)
    })
}

/// The three load averages of `/proc/loadavg`'s text.
fn parse_load(loadavg: &str) -> Option<[f64; 3]> {
    let mut fields = loadavg.split_whitespace().map(str::parse::<f64>);
    Some([
        fields.next()?.ok()?,
        fields.next()?.ok()?,
        fields.next()?.ok()?,
    ])
}

/// Total and free (for an unprivileged user) bytes of the file system holding `path`.
fn statvfs(path: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::other("a path with a NUL byte"))?;
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `stat` a valid, writable statvfs.
    if unsafe { libc::statvfs(path.as_ptr(), &mut stat) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let block = stat.f_frsize as u64;
    Ok((
        (stat.f_blocks as u64).saturating_mul(block),
        (stat.f_bavail as u64).saturating_mul(block),
    ))
}

/// The processes of this worker's run on the machine, from `/proc`, one per line: pid,
/// parent, state, resident memory and command line (at most [`MAX_PROCESSES`], each line cut
/// at 1,000 bytes). Empty where there is no `/proc`.
///
/// Which processes: those in the worker's session and those descended from the worker, which
/// covers what its trials started and left running (a program runs in a process group of its
/// own, in the worker's session), but not the rest of a shared host's: on the `local` runner
/// or an SSH host, other users' command lines are none of a run's business. In a container
/// the worker's session is usually the container's every process.
pub fn process_list() -> String {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return String::new();
    };
    let mut stats: Vec<(u32, ProcStat)> = entries
        .filter_map(|e| {
            let pid: u32 = e.ok()?.file_name().to_str()?.parse().ok()?;
            Some((pid, proc_stat(pid)?))
        })
        .collect();
    stats.sort_unstable_by_key(|(pid, _)| *pid);
    let me = std::process::id();
    let my_session = stats
        .iter()
        .find(|(pid, _)| *pid == me)
        .map(|(_, s)| s.session);
    let parents: std::collections::HashMap<u32, u32> =
        stats.iter().map(|(pid, stat)| (*pid, stat.ppid)).collect();
    let descends_from_me = |mut pid: u32| {
        // Bounded: a parent chain is at most as long as the list.
        for _ in 0..=parents.len() {
            if pid == me {
                return true;
            }
            match parents.get(&pid) {
                Some(&parent) if parent != 0 && parent != pid => pid = parent,
                _ => return false,
            }
        }
        false
    };
    let ours: Vec<u32> = stats
        .iter()
        .filter(|(pid, stat)| Some(stat.session) == my_session || descends_from_me(*pid))
        .map(|(pid, _)| *pid)
        .collect();
    let mut out = String::from("    PID    PPID S     RSS_KIB COMMAND\n");
    for &pid in ours.iter().take(MAX_PROCESSES) {
        if let Some(line) = process_line(pid) {
            out.push_str(&line);
            out.push('\n');
        }
    }
    if ours.len() > MAX_PROCESSES {
        out.push_str(&format!(
            "[{} more processes not listed]\n",
            ours.len() - MAX_PROCESSES
        ));
    }
    out
}

/// What `/proc/PID/stat` says of a process's family.
struct ProcStat {
    ppid: u32,
    session: u32,
}

/// `pid`'s parent and session, from `/proc/PID/stat` (its name, in parentheses, may hold
/// spaces and parentheses itself: the fields are read after the last `)`).
fn proc_stat(pid: u32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&stat)
}

fn parse_stat(stat: &str) -> Option<ProcStat> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    // state, ppid, pgrp, session, …
    let mut fields = after_name.split_whitespace().skip(1);
    let ppid = fields.next()?.parse().ok()?;
    let _pgrp = fields.next()?;
    let session = fields.next()?.parse().ok()?;
    Some(ProcStat { ppid, session })
}

/// One process's line, or `None` when it is gone (it may end while the list is read).
fn process_line(pid: u32) -> Option<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status.lines().find_map(|line| {
            let rest = line.strip_prefix(key)?.strip_prefix(':')?;
            Some(rest.split_whitespace().next().unwrap_or("").to_string())
        })
    };
    let ppid = field("PPid").unwrap_or_default();
    let state = field("State").unwrap_or_default();
    let rss = field("VmRSS").unwrap_or_else(|| "0".into());
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let mut command = cmdline
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(String::from_utf8_lossy)
        .collect::<Vec<_>>()
        .join(" ");
    if command.is_empty() {
        // A kernel thread, or one whose arguments are gone: its name, in brackets.
        command = format!("[{}]", field("Name").unwrap_or_default());
    }
    let mut line = format!("{pid:>7} {ppid:>7} {state:1} {rss:>11} {command}");
    if line.len() > 1_000 {
        let mut cut = 1_000;
        while !line.is_char_boundary(cut) {
            cut -= 1;
        }
        line.truncate(cut);
    }
    // One process, one line: a newline in an argument would forge another.
    Some(line.replace(['\n', '\r'], " "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_the_last_bytes_across_pushes_of_any_size() {
        let tail = OutputTail::default();
        tail.push(b"hello ");
        tail.push(b"world");
        assert_eq!(tail.bytes(), b"hello world");
        let big = vec![b'x'; TAIL_BYTES];
        tail.push(&big);
        tail.push(b"END");
        let kept = tail.bytes();
        assert_eq!(kept.len(), TAIL_BYTES);
        assert!(kept.ends_with(b"xEND"));
        let huge: Vec<u8> = (0..3 * TAIL_BYTES).map(|i| (i % 251) as u8).collect();
        tail.push(&huge);
        assert_eq!(tail.bytes(), huge[2 * TAIL_BYTES..]);
    }

    #[test]
    fn meminfo_and_loadavg_are_read_as_the_kernel_writes_them() {
        let meminfo =
            "MemTotal:       24570000 kB\nMemFree:  100 kB\nMemAvailable:   12000000 kB\n";
        assert_eq!(meminfo_bytes(meminfo, "MemTotal"), Some(24_570_000 * 1024));
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable"),
            Some(12_000_000 * 1024)
        );
        assert_eq!(meminfo_bytes(meminfo, "Mem"), None);
        assert_eq!(
            parse_load("0.52 1.25 2.00 3/456 7890\n"),
            Some([0.52, 1.25, 2.0])
        );
        assert_eq!(parse_load("garbage"), None);
    }

    #[test]
    fn a_stat_line_is_read_after_the_processs_name_whatever_the_name_holds() {
        let stat = "4242 (a (weird) name) S 17 4242 4200 0 -1 4194560 100 0 0 0";
        let parsed = parse_stat(stat).unwrap();
        assert_eq!((parsed.ppid, parsed.session), (17, 4200));
        assert!(parse_stat("garbage").is_none());
    }

    #[test]
    fn the_process_list_holds_this_process_and_what_it_started_but_not_other_sessions() {
        // A child in a session of its own that this process started: a descendant, listed.
        let mut child = std::process::Command::new("setsid")
            .args(["sleep", "30"])
            .spawn()
            .unwrap();
        std::thread::sleep(std::time::Duration::from_millis(200));
        let list = process_list();
        let listed = |pid: u32| {
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(&pid.to_string()))
        };
        let _ = child.kill();
        let _ = child.wait();
        assert!(listed(std::process::id()), "{list}");
        assert!(listed(child.id()), "{list}");
        // PID 1 is in no session of ours (unless this test runs as the session's init).
        let one = proc_stat(1).map(|s| s.session);
        let mine = proc_stat(std::process::id()).map(|s| s.session);
        if one != mine {
            assert!(!listed(1), "{list}");
        }
    }

    #[test]
    fn the_process_list_holds_this_process_and_the_facts_this_disk() {
        let list = process_list();
        let me = std::process::id();
        assert!(
            list.lines()
                .any(|l| l.split_whitespace().next() == Some(&me.to_string())),
            "{list}"
        );
        let facts = MachineFacts::read(Path::new("."));
        assert!(facts.memory_total_bytes.unwrap() > 0);
        assert!(facts.disk_total_bytes.unwrap() >= facts.disk_free_bytes.unwrap());
        assert!(facts.load.is_some());
    }

    #[test]
    fn a_diagnosis_never_writes_through_a_planted_link() {
        let dir = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let evidence = TrialEvidence::new(dir.path().to_path_buf());
        std::os::unix::fs::symlink(outside.path(), dir.path().join(DIAGNOSIS_DIR)).unwrap();
        assert!(evidence.write_diagnosis("exit 1").is_err());
        assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
        // Where nothing was planted, it is written.
        let clean = tempfile::tempdir().unwrap();
        let evidence = TrialEvidence::new(clean.path().to_path_buf());
        evidence.stderr.push(b"boom\n");
        evidence.write_diagnosis("exit 1").unwrap();
        let written = clean.path().join(DIAGNOSIS_DIR);
        assert_eq!(
            std::fs::read(written.join("stderr.txt")).unwrap(),
            b"boom\n"
        );
        assert!(!written.join("stdout.txt").exists());
        let system: serde_json::Value =
            serde_json::from_slice(&std::fs::read(written.join("system.json")).unwrap()).unwrap();
        assert_eq!(system["failure"], "exit 1");
        assert!(system["machine"]["memoryAvailableBytes"].as_u64().unwrap() > 0);
        assert!(std::fs::read_to_string(written.join("processes.txt"))
            .unwrap()
            .contains("PID"));
    }
}
