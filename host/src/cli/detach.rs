//! Runs that go on without the terminal: `mst run --detach` starts a supervisor (the same
//! `mst run`, with `--supervise`, in a session of its own) and returns once the run exists;
//! the supervisor logs the run's progress into its directory; `mst runs attach` follows it and
//! `mst runs stop` cancels it. Every run, attached or not, records its process
//! ([`RunProcess`], written by [`crate::run::run`]), so a run whose process died is listed as
//! `interrupted`.

use crate::results::run_process::{Collector, Progress, RunProcess, RunState};
use crate::results::{ResultsRoot, RunDir};
use crate::run::events::RunEvent;
use crate::shard::coordinator::ShardEvent;
use anyhow::{bail, Context as _, Result};
use std::io::{BufRead, Write};
use std::os::fd::FromRawFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// What the supervisor writes on its stdout once the run exists, before it lets go of the
/// terminal's pipes: this prefix, the run id, a newline.
const HANDOVER: &str = "mst-detached ";

/// The supervisor's log in the run directory: its stderr (notes, a line per trial) once it
/// took over.
const SUPERVISOR_LOG: &str = "supervisor.log";

/// How long the parent waits for the supervisor's last words on stderr after the hand-over.
const STDERR_DRAIN: Duration = Duration::from_secs(2);

/// `mst run --detach`: starts the supervisor with the same arguments and waits until it has
/// opened the run (printing the run id) or failed (printing why, exiting as it did).
pub(super) fn start(results_dir: &Path, json: bool) -> Result<u8> {
    let exe = std::env::current_exe().context("cannot find mst's own executable")?;
    let args = std::env::args_os()
        .skip(1)
        .filter(|arg| arg != "--detach")
        .chain(["--supervise".into()]);
    let mut command = Command::new(exe);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: setsid(2) is async-signal-safe; the supervisor leaves the terminal's session,
    // so closing the terminal (SIGHUP) or its Ctrl-C never reaches it.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, || {
            if libc::setsid() == -1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .context("cannot start the run's supervisor")?;
    let pid = child.id();
    let stderr = child.stderr.take().expect("piped");
    let (said_tx, said_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut said = Vec::new();
        let _ = std::io::Read::read_to_end(&mut { stderr }, &mut said);
        let _ = said_tx.send(said);
    });
    // The hand-over line, or the end of the supervisor's output (it failed before the run
    // existed); a line of anything else is passed on.
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut handed_over = None;
    let mut line = String::new();
    while handed_over.is_none() && stdout.read_line(&mut line).unwrap_or(0) > 0 {
        match line.trim_end().strip_prefix(HANDOVER) {
            Some(run_id) => handed_over = Some(run_id.to_string()),
            None => super::write_stdout_str(&line),
        }
        line.clear();
    }
    let Some(run_id) = handed_over else {
        // It failed before the run existed (a config error, an unreachable host): its words
        // and its exit code are the command's.
        let status = child.wait().context("waiting for the supervisor")?;
        let said = said_rx.recv().unwrap_or_default();
        super::write_stderr(format_args!("{}", String::from_utf8_lossy(&said)));
        return Ok(status.code().map_or(2, |c| c as u8));
    };
    if let Ok(said) = said_rx.recv_timeout(STDERR_DRAIN) {
        super::write_stderr(format_args!("{}", String::from_utf8_lossy(&said)));
    }
    // The run exists (the supervisor said so); its log is beside it.
    let log = ResultsRoot::new(results_dir)
        .find(&run_id)
        .ok()
        .map(|run| run.root.join(SUPERVISOR_LOG));
    let dir = results_dir.display();
    if json {
        outln!(
            "{}",
            serde_json::json!({"runId": run_id, "pid": pid, "state": RunState::Running,
                "log": log})
        );
    } else {
        outln!("run {run_id} goes on in the background (supervisor pid {pid})");
        outln!("follow:  mst runs attach {run_id} --results-dir {dir}");
        outln!("stop:    mst runs stop {run_id} --results-dir {dir}");
        if let Some(log) = &log {
            outln!("log:     {}", log.display());
        }
    }
    Ok(super::Code::Success.into())
}

/// A detached run's progress log, fed the run's events by its supervisor (`mst run
/// --supervise`), which also hands the terminal back to `mst run --detach` once the run exists.
/// The run's process record is the run's own ([`crate::run::run`]): it is written after the
/// log's last line, so whoever sees the run ended finds that line.
pub(super) struct Supervision {
    results: ResultsRoot,
    /// `progress.jsonl`, once the run exists.
    log: Mutex<Option<std::fs::File>>,
}

impl Supervision {
    /// For a detached run stored under `results`.
    pub(super) fn new(results: &Path) -> Self {
        Supervision {
            results: ResultsRoot::new(results),
            log: Mutex::new(None),
        }
    }

    /// Hears one of the run's events (`Finished` logs nothing here: its line carries the
    /// summary the terminal reporter makes, [`Supervision::finished`]).
    pub(super) fn event(&self, event: &RunEvent<'_>) {
        let line = match event {
            RunEvent::Failed(error) => Progress::Failed {
                exit_code: super::Code::Refused.into(),
                error: format!("{error:#}"),
            },
            RunEvent::Started {
                run_id,
                total,
                resumed,
            } => {
                match self.open(run_id) {
                    Ok(file) => *self.log.lock().expect("supervision") = Some(file),
                    // A supervisor that cannot hand over would hold the parent until the run
                    // ends: it stops here instead (before any machine exists; an ssh host's
                    // tunnel dies with it), and the parent prints why.
                    Err(e) => {
                        errln!("error: run {run_id}: cannot supervise it: {e:#}");
                        super::Code::Refused.exit();
                    }
                }
                Progress::Started {
                    total: *total,
                    resumed: *resumed,
                }
            }
            RunEvent::Shard(ShardEvent::TrialCollected { key, .. }) => Progress::Trial {
                trial: key.to_string(),
                collected: true,
            },
            RunEvent::Shard(ShardEvent::TrialInfra { key, .. }) => Progress::Trial {
                trial: key.to_string(),
                collected: false,
            },
            other => match other.note() {
                Some(message) => Progress::Note { message },
                None => return,
            },
        };
        self.log(&line);
    }

    /// Starts the progress log (anew for each collection: a resumed run's log tells of the
    /// resume only) and hands the supervisor's output over to the run's log, letting the
    /// parent return.
    fn open(&self, run_id: &str) -> Result<std::fs::File> {
        let dir = self.results.find(run_id)?;
        let file = std::fs::File::create(dir.progress_path())
            .context("cannot open the run's progress log")?;
        hand_over(&dir, run_id)?;
        Ok(file)
    }

    /// The run finished with `exit_code` and `summary` (the text `mst run` prints).
    pub(super) fn finished(&self, exit_code: u8, summary: &str) {
        self.log(&Progress::Finished {
            exit_code,
            summary: summary.to_string(),
        });
    }

    /// The run's end failed on `error` after it finished (a `--junit` file not written).
    pub(super) fn failed(&self, exit_code: u8, error: &anyhow::Error) {
        self.log(&Progress::Failed {
            exit_code,
            error: format!("{error:#}"),
        });
    }

    /// Appends one line to the progress log, if there is one (redacted: a note may quote a
    /// machine).
    fn log(&self, line: &Progress) {
        if let Some(file) = self.log.lock().expect("supervision").as_mut() {
            let mut text = serde_json::to_string(line).expect("progress serializes");
            text = crate::secrets::redactor().redact(&text).into_owned();
            text.push('\n');
            if let Err(e) = file.write_all(text.as_bytes()) {
                tracing::warn!("cannot write the run's progress: {e}");
            }
        }
    }
}

/// The supervisor lets go of the parent's pipes: its stderr goes to the run's log, then it
/// says which run it opened on stdout, which it then points at the log too.
fn hand_over(dir: &RunDir, run_id: &str) -> Result<()> {
    use std::os::fd::AsRawFd;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.root.join(SUPERVISOR_LOG))
        .context("cannot open the supervisor's log")?;
    let point = |fd: i32| {
        // SAFETY: dup2 onto this process's own standard descriptors, with a file it holds.
        match unsafe { libc::dup2(log.as_raw_fd(), fd) } {
            -1 => Err(std::io::Error::last_os_error()),
            _ => Ok(()),
        }
    };
    point(2).context("cannot point stderr at the supervisor's log")?;
    let mut stdout = std::io::stdout().lock();
    // A parent that is gone (its terminal closed) is not told: the run goes on all the same.
    let _ = writeln!(stdout, "{HANDOVER}{run_id}").and_then(|()| stdout.flush());
    point(1).context("cannot point stdout at the supervisor's log")?;
    Ok(())
}

/// `mst runs attach`: follows a detached run's progress (a bar on a terminal, a line per
/// trial otherwise) until it ends, then prints its summary and exits as `mst run` would have.
/// Ctrl-C leaves the run going.
pub(super) fn attach(
    dir: &RunDir,
    reporter: &super::progress::Reporter,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<u8> {
    let process = read_process(dir)?;
    match process.collector {
        Collector::Supervisor => {}
        Collector::Terminal => bail!(
            "run {} was started attached to a terminal (pid {}); only a run started with `mst run \
             --detach` logs the progress `mst runs attach` follows",
            dir.id(),
            process.owner.pid
        ),
        Collector::Server => bail!(
            "run {} was started from `mst serve` (pid {}): follow it in the web UI",
            dir.id(),
            process.owner.pid
        ),
    }
    let file = std::fs::File::open(dir.progress_path())
        .with_context(|| format!("{}: no progress log", dir.root.display()))?;
    let mut lines = std::io::BufReader::new(file);
    let mut pending = String::new();
    loop {
        if stop.load(std::sync::atomic::Ordering::SeqCst) {
            errln!(
                "detached from run {}: it goes on (`mst runs attach` again to follow it)",
                dir.id()
            );
            return Ok(super::Code::Interrupted.into());
        }
        let read = lines
            .read_line(&mut pending)
            .context("reading the progress log")?;
        if read > 0 && pending.ends_with('\n') {
            let line: Progress = serde_json::from_str(pending.trim_end())
                .with_context(|| format!("{} is damaged", dir.progress_path().display()))?;
            pending.clear();
            if let Some(code) = reporter.progress(&line) {
                return Ok(code);
            }
            continue;
        }
        // Nothing new: is anyone still writing? The supervisor logs its last line before it
        // records its end, so a run that ended has its last line in the log by now.
        let now = read_process(dir)?;
        match now.state() {
            RunState::Running => {}
            _ if lines.read_line(&mut pending)? > 0 => continue,
            RunState::Interrupted => return Err(interrupted(dir, &now)),
            RunState::Ended => {
                errln!(
                    "run {} ended, but its progress log says nothing of how; `mst runs show {}` \
                     prints its summary",
                    dir.id(),
                    dir.id()
                );
                return Ok(now.exit_code.unwrap_or(2));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `mst runs stop`: sends the run's process SIGTERM (its shards get `cancel`, then the grace,
/// then a kill, as for Ctrl-C) and waits until it has ended.
pub(super) fn stop(dir: &RunDir, wait: Duration) -> Result<RunProcess> {
    let process = read_process(dir)?;
    match process.state() {
        RunState::Ended => bail!(
            "run {} is not running: it ended (exit code {})",
            dir.id(),
            process.exit_code.unwrap_or(0)
        ),
        RunState::Interrupted => return Err(interrupted(dir, &process)),
        RunState::Running => {}
    }
    if process.collector == Collector::Server {
        bail!(
            "run {} is collected by `mst serve` (pid {}): signalling that process would stop the \
             server and every run and session it holds; stop the server to stop the run",
            dir.id(),
            process.owner.pid
        );
    }
    let here = crate::owner::Owner::current();
    let owner = &process.owner;
    let unknown = here.host.is_empty() || here.boot.is_empty() || here.pid_namespace.is_empty();
    if unknown
        || owner.host != here.host
        || owner.boot != here.boot
        || owner.pid_namespace != here.pid_namespace
        || owner.started == 0
    {
        bail!(
            "run {} is collected by pid {} on host `{}` (another machine, boot or pid \
             namespace, or a process this mst cannot tell from a later one with its pid): stop \
             it where it runs",
            dir.id(),
            owner.pid,
            owner.host
        );
    }
    signal_owner(owner).with_context(|| {
        format!(
            "cannot signal run {}'s process (pid {})",
            dir.id(),
            owner.pid
        )
    })?;
    let deadline = Instant::now() + wait;
    loop {
        let now = read_process(dir)?;
        match now.state() {
            RunState::Ended => return Ok(now),
            RunState::Interrupted => return Err(interrupted(dir, &now)),
            RunState::Running if Instant::now() > deadline => bail!(
                "run {} (pid {}) has not ended {} s after SIGTERM; `kill -9 {}` ends it at \
                 once, and `mst run --resume` collects what it lacks",
                dir.id(),
                now.owner.pid,
                wait.as_secs(),
                now.owner.pid
            ),
            RunState::Running => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// Sends `owner` (a process of this machine, boot and pid namespace) SIGTERM through a pidfd:
/// the descriptor pins the process, which is then checked to be the owner (its start time),
/// so a pid reused in between is never signalled. Where pidfds are unavailable (a kernel
/// before 5.3, a seccomp profile that refuses them), plain kill(2) after the same check. One
/// that ended meanwhile is not an error: the caller finds it ended.
fn signal_owner(owner: &crate::owner::Owner) -> Result<()> {
    // SAFETY: pidfd_open(2) with no flags; the descriptor it returns is owned below.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, owner.pid as libc::pid_t, 0) };
    if fd < 0 {
        let error = std::io::Error::last_os_error();
        return match error.raw_os_error() {
            Some(libc::ESRCH) => Ok(()),
            Some(libc::ENOSYS | libc::EPERM) if owner.is_alive_here() => {
                // SAFETY: kill(2) on the owner, just checked alive and the same one.
                match unsafe { libc::kill(owner.pid as libc::pid_t, libc::SIGTERM) } {
                    -1 => Err(std::io::Error::last_os_error().into()),
                    _ => Ok(()),
                }
            }
            Some(libc::ENOSYS | libc::EPERM) => Ok(()),
            _ => Err(error.into()),
        };
    }
    // SAFETY: a descriptor pidfd_open just returned, owned (and closed) by this value only.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd as libc::c_int) };
    if !owner.is_alive_here() {
        return Ok(());
    }
    // SAFETY: pidfd_send_signal(2) on the descriptor held above, no siginfo, no flags.
    let sent = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            libc::SIGTERM,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    match sent {
        -1 if std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) => {
            Err(std::io::Error::last_os_error().into())
        }
        _ => Ok(()),
    }
}

/// Refuses to resume run `run_id` while a process still collects into it: two would write
/// one directory, and `mst runs stop` would reach only the later.
pub(super) fn refuse_running(results: &Path, run_id: &str) -> Result<()> {
    let Ok(dir) = ResultsRoot::new(results).find(run_id) else {
        // `--resume` says what is wrong with a run it cannot find.
        return Ok(());
    };
    match dir.read_process()? {
        Some(process) if process.state() == RunState::Running => bail!(
            "--resume {run_id}: the run is still being collected (pid {} on `{}`); `mst runs \
             stop {run_id}` stops it, or wait until it ends",
            process.owner.pid,
            process.owner.host
        ),
        _ => Ok(()),
    }
}

/// The run's process record, or why there is none.
fn read_process(dir: &RunDir) -> Result<RunProcess> {
    dir.read_process()?.with_context(|| {
        format!(
            "run {} has no process record: it was collected by an mst before 0.x, or is a \
             playground session",
            dir.id()
        )
    })
}

/// Run `dir`'s process died without ending it: how to go on.
fn interrupted(dir: &RunDir, process: &RunProcess) -> anyhow::Error {
    let config = dir
        .read_record()
        .map(|r| r.config_path)
        .unwrap_or_else(|_| "eval.json".into());
    let id = dir.id();
    super::Exit::refused(anyhow::anyhow!(
        "run {id} was interrupted: its process (pid {}) is gone without ending it; `mst run \
         --config {config} --resume {id}` collects what it lacks",
        process.owner.pid
    ))
}
