//! Host processes: every program mst starts on this host (a trial's command, a stdio MCP
//! server, a plugin's `exec`, a command channel's ssh or kubectl, a Docker host's ssh, the
//! local runner's worker, the provenance `git`) goes through here, so the rules are the same
//! everywhere:
//!
//! - each leads a process group of its own, so stopping it stops everything it started, and no
//!   background child is left holding its pipes; a program waited for on a thread is a
//!   [`GroupChild`] (or runs to its end in [`run_to_end`]), one served on an async runtime an
//!   [`AsyncGroupChild`], whose group goes when it is dropped;
//! - waits have deadlines;
//! - its output is read (on threads of their own, or on a trial's async runtime) capped, and
//!   drained past the cap, so a program that writes without end neither grows mst's memory
//!   nor blocks on a full pipe;
//! - the programs a trial starts (the local worker, a trial's command, a stdio MCP server, the
//!   provenance `git`) get [`minimal_env`], never mst's whole environment; a command channel's
//!   programs get [`crate::plugin::programs::PASSED_ENV`], and only a Docker host's ssh, which
//!   acts for the operator, gets mst's own ([`GroupCommand::inheriting_env`]).
//!
//! The one exception is `mst run --detach`'s supervisor (`cli::detach`): it is started in a
//! session of its own (`setsid`) precisely so that it outlives the terminal and the `mst` that
//! started it, which a process group of that `mst` would not.

use std::io::Read;
use std::process::{Child, ChildStderr, ChildStdin, ChildStdout, Command, ExitStatus};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Raises this process's soft limit on open files to at least `wanted`, within the hard limit;
/// never lowers it. Returns the soft limit now in force.
///
/// A coordinator holds a few descriptors per machine (the worker's pipes, its channel's), so
/// the common soft limit of 1,024 would end a run at a few hundred machines, while the hard
/// limit, the operator's real ceiling, is far higher (docs/scale.md). Raised only as far as a
/// run needs, since every program mst starts inherits it: some close or size tables by it.
pub fn allow_open_files(wanted: u64) -> u64 {
    // SAFETY: getrlimit fills the struct it is given; setrlimit only changes this process's
    // soft limit, within the hard one.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) != 0 {
            return wanted;
        }
        if limit.rlim_cur < wanted {
            let raised = libc::rlimit {
                rlim_cur: wanted.min(limit.rlim_max),
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                return raised.rlim_cur;
            }
        }
        limit.rlim_cur
    }
}

/// The variables of mst's own environment that the programs it starts for a trial get (the
/// local runner's worker, a trial's command, a stdio MCP server): where programs are, whose
/// home, the temporary directory and the locale. Everything else (cloud credentials, CI
/// tokens, the values behind `--allow-secret`) stays out; a program that needs more gets it
/// from the config (`clientOptions.env`, a server's `env`).
pub const MINIMAL_ENV: [&str; 6] = ["PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ"];

/// Names (comma-separated) of further variables to pass on, and the only way to widen
/// [`MINIMAL_ENV`]: whoever starts mst or its worker names them explicitly. A runner plugin's
/// containers carry the `--allow-env` names here, so their agents see those variables;
/// `MST_PASS_ENV=NAME mst run` lends NAME to the local runner's agents.
pub const PASS_ENV: &str = "MST_PASS_ENV";

/// [`MINIMAL_ENV`], the `LC_*` locale variables and what [`PASS_ENV`] names (itself included,
/// so it reaches the worker's own programs), with their values here: what a program started
/// with `env_clear()` is given back.
pub fn minimal_env() -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let named = std::env::var(PASS_ENV).unwrap_or_default();
    let named: Vec<&str> = named
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    std::env::vars_os()
        .filter(|(name, _)| {
            let name = name.to_string_lossy();
            MINIMAL_ENV.contains(&name.as_ref())
                || name.starts_with("LC_")
                || name == PASS_ENV
                || named.contains(&name.as_ref())
        })
        .collect()
}

/// `program` as `execvp` finds it on `path` (the PATH the program is given) when it is a bare
/// name found there: the first executable regular file of that name in a PATH directory.
/// Anything else (a path, a name found nowhere, a PATH with an empty entry, which means the
/// program's own working directory) is returned as it is, for the standard library to handle
/// as before. Spawning a resolved path lets the standard library start the program with
/// `posix_spawn` (a `vfork`-style clone sharing this process's memory): given a bare name and
/// a PATH of the child's own, it must `fork` instead, copying the page tables of this
/// process, which made starting a short client twice as costly (docs/performance.md).
pub fn resolve_program(program: &str, path: Option<&std::ffi::OsStr>) -> std::path::PathBuf {
    let bare = std::path::PathBuf::from(program);
    let Some(path) = path.filter(|_| !program.is_empty() && !program.contains('/')) else {
        return bare;
    };
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(path).collect();
    if dirs.iter().any(|dir| dir.as_os_str().is_empty()) {
        return bare;
    }
    dirs.into_iter()
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable_file(candidate))
        .unwrap_or(bare)
}

/// Whether `path` is (or links to) a regular file someone may execute.
pub fn is_executable_file(path: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// How often a deadline wait looks at the process, at most: it starts at [`FIRST_POLL`] and
/// doubles, since most programs a trial waits for have closed their output and are exiting
/// (a fixed 5 ms poll cost a short-lived client 2.5 ms on average: docs/performance.md).
const POLL: Duration = Duration::from_millis(5);
/// The first wait of a deadline wait.
const FIRST_POLL: Duration = Duration::from_micros(20);

/// A running host program that leads its own process group.
pub struct GroupChild {
    child: Child,
}

impl GroupChild {
    /// Starts `command` as the leader of a new process group (stdio as the command sets it).
    pub fn spawn(command: &mut Command) -> std::io::Result<Self> {
        #[cfg(unix)]
        std::os::unix::process::CommandExt::process_group(command, 0);
        Ok(GroupChild {
            child: command.spawn()?,
        })
    }

    /// The program's piped stdin, stdout and stderr (each once).
    pub fn take_pipes(&mut self) -> (Option<ChildStdin>, Option<ChildStdout>, Option<ChildStderr>) {
        (
            self.child.stdin.take(),
            self.child.stdout.take(),
            self.child.stderr.take(),
        )
    }

    /// Stops the program and everything in its process group at once (SIGKILL).
    pub fn kill_group(&mut self) {
        kill_group(self.child.id());
        let _ = self.child.kill();
    }

    /// Its exit status if it has ended (an error reading it counts as ended).
    pub fn try_wait(&mut self) -> Option<Option<ExitStatus>> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(Some(status)),
            Ok(None) => None,
            Err(_) => Some(None),
        }
    }

    /// Waits for it to end.
    pub fn wait(&mut self) -> Option<ExitStatus> {
        self.child.wait().ok()
    }

    /// Waits for it to end until `deadline`: `Some(status)` if it did, `None` if the deadline
    /// passed first (the program is still running).
    pub fn wait_until(&mut self, deadline: Instant) -> Option<Option<ExitStatus>> {
        let mut poll = FIRST_POLL;
        loop {
            if let Some(status) = self.try_wait() {
                return Some(status);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            std::thread::sleep(poll.min(deadline - now));
            poll = (poll * 2).min(POLL);
        }
    }
}

/// SIGKILL to the process group led by `leader` (which must not have been reaped yet, so that
/// its id still names the group, or whose group still has members).
fn kill_group(leader: u32) {
    // SAFETY: kill(2) with a negative pid signals a process group; the caller started its
    // leader in a new group and has not reaped it.
    #[cfg(unix)]
    unsafe {
        libc::kill(-(leader as i32), libc::SIGKILL);
    }
}

/// A program to start as an [`AsyncGroupChild`]: the command, with the environment the
/// programs a trial starts get ([`minimal_env`] plus what it is given) unless it is made with
/// [`GroupCommand::inheriting_env`]. Its stdio is the caller's to set ([`Self::command_mut`]).
pub struct GroupCommand {
    command: Command,
    die_with_parent: bool,
}

impl GroupCommand {
    /// `argv` as [`clean_command`] makes it: [`minimal_env`] plus `env`, the program found on
    /// that `PATH` so that it starts with `posix_spawn`. `argv` must not be empty.
    pub fn new(argv: &[String], env: &std::collections::BTreeMap<String, String>) -> Self {
        GroupCommand {
            command: clean_command(argv, env),
            die_with_parent: false,
        }
    }

    /// `command` as it is: one made by [`clean_command`] and changed since (a trial's program
    /// put in its sandbox).
    pub fn from_clean(command: Command) -> Self {
        GroupCommand {
            command,
            die_with_parent: false,
        }
    }

    /// `argv` with mst's whole environment: only for a program that acts for the operator
    /// rather than for a trial (a Docker host's ssh, which needs their agent and config).
    /// `argv` must not be empty.
    pub fn inheriting_env(argv: &[String]) -> Self {
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        GroupCommand {
            command,
            die_with_parent: false,
        }
    }

    /// Makes the program die (SIGKILL) with the thread that starts it, even when mst exits
    /// without dropping its [`AsyncGroupChild`] (a second Ctrl-C, SIGKILL). It costs the
    /// `posix_spawn` start (the hook runs in a forked child), so only a long-lived program
    /// that must not outlive mst asks for it.
    pub fn die_with_parent(&mut self) -> &mut Self {
        self.die_with_parent = true;
        self
    }

    /// The command, for its stdio, working directory and further variables.
    pub fn command_mut(&mut self) -> &mut Command {
        &mut self.command
    }
}

/// A running host program, served on a tokio runtime, that leads its own process group: the
/// whole group is killed when it is stopped or dropped (a trial's future dropped at its
/// deadline, a runtime dropped with its tasks).
pub struct AsyncGroupChild {
    child: tokio::process::Child,
    leader: u32,
    /// Set once [`Self::stop`] killed the group and reaped the leader: dropping it then sends
    /// nothing, since the group's id may by then belong to another process.
    stopped: bool,
}

impl AsyncGroupChild {
    /// Starts `command` as the leader of a new process group; must be called inside a tokio
    /// runtime, which then serves it.
    pub fn spawn(command: GroupCommand) -> std::io::Result<Self> {
        let GroupCommand {
            mut command,
            die_with_parent,
        } = command;
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        if die_with_parent {
            // SAFETY: prctl(2) is async-signal-safe and touches no memory of this process.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                    if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) == -1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        // A trial's program, not the worker reporting on it, is what the kernel kills when the
        // machine runs out of memory: the trial then ends with its cause, and the shard goes on.
        // Set in the child before it runs anything, so every process it starts inherits it (a
        // sandbox's own processes included; set after the spawn it missed those forked first).
        // Raising one's own score needs no privilege; where it fails, nothing else changes.
        // SAFETY: open(2), write(2) and close(2) are async-signal-safe, and the path and value
        // are static: nothing is allocated in the child.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, || {
                let path = c"/proc/self/oom_score_adj";
                let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd >= 0 {
                    libc::write(fd, b"500".as_ptr().cast(), 3);
                    libc::close(fd);
                }
                Ok(())
            });
        }
        let child = tokio::process::Command::from(command)
            .kill_on_drop(true)
            .spawn()?;
        let leader = child.id().expect("a child just started has its id");
        Ok(AsyncGroupChild {
            child,
            leader,
            stopped: false,
        })
    }

    /// The program's piped stdin, stdout and stderr (each once).
    pub fn take_pipes(
        &mut self,
    ) -> (
        Option<tokio::process::ChildStdin>,
        Option<tokio::process::ChildStdout>,
        Option<tokio::process::ChildStderr>,
    ) {
        (
            self.child.stdin.take(),
            self.child.stdout.take(),
            self.child.stderr.take(),
        )
    }

    /// Its exit status if it has ended.
    pub fn try_wait(&mut self) -> std::io::Result<Option<ExitStatus>> {
        self.child.try_wait()
    }

    /// Waits for it to end (an error reading its status counts as ended). Cancel-safe, so a
    /// `select!` may race it against a deadline.
    pub async fn wait(&mut self) -> Option<ExitStatus> {
        self.child.wait().await.ok()
    }

    /// SIGKILL to everything in its process group, leaving the program to be reaped: after
    /// it ended, for what it left behind.
    pub fn kill_group(&self) {
        kill_group(self.leader);
    }

    /// Stops the program and everything in its process group at once (SIGKILL), and reaps it.
    pub async fn stop(&mut self) -> Option<ExitStatus> {
        self.kill_group();
        let _ = self.child.start_kill();
        let status = self.wait().await;
        self.stopped = true;
        status
    }
}

impl Drop for AsyncGroupChild {
    fn drop(&mut self) {
        // The leader itself is killed and reaped by tokio (`kill_on_drop`).
        if !self.stopped {
            self.kill_group();
        }
    }
}

/// What a program that ran to its end left.
#[derive(Debug)]
pub struct Finished {
    pub status: Option<ExitStatus>,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The program `argv` as the machine's agents and checks run it: an environment of
/// [`minimal_env`] plus `env` and nothing else, the program found on that environment's `PATH`
/// (so that it starts with `posix_spawn`, see [`resolve_program`]), seeing the name it was
/// given as its `argv[0]` (busybox picks its applet by it). `argv` must not be empty.
pub fn clean_command(argv: &[String], env: &std::collections::BTreeMap<String, String>) -> Command {
    let base_env = minimal_env();
    // The PATH the program gets, which a bare program name is looked up on.
    let child_path = match env.get("PATH") {
        Some(path) => Some(std::ffi::OsString::from(path)),
        None => base_env
            .iter()
            .find(|(name, _)| name == "PATH")
            .map(|(_, value)| value.clone()),
    };
    let mut command = Command::new(resolve_program(&argv[0], child_path.as_deref()));
    std::os::unix::process::CommandExt::arg0(&mut command, &argv[0]);
    command
        .args(&argv[1..])
        .env_clear()
        .envs(base_env)
        .envs(env);
    command
}

/// Why [`run_to_end`] has no [`Finished`] program to give.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotFinished {
    /// It could not be started (no such program, not executable, …).
    NotStarted(String),
    /// It ran past its limit and was killed with its group.
    TimedOut(Duration),
}

impl std::fmt::Display for NotFinished {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotFinished::NotStarted(why) => f.write_str(why),
            NotFinished::TimedOut(limit) => {
                write!(f, "timed out after {} ms and was killed", limit.as_millis())
            }
        }
    }
}

impl From<NotFinished> for String {
    fn from(why: NotFinished) -> String {
        why.to_string()
    }
}

/// How long output may keep arriving after a program ended (from a process that left its
/// group); after that [`run_to_end`] returns what it has.
const LEFTOVER_WAIT: Duration = Duration::from_secs(5);

/// Runs `command` with `stdin` in a process group of its own, its stdout and stderr capped at
/// `cap` bytes each. Past `limit` the group is killed (SIGKILL) and this is an error; after the
/// program ends, whatever it left behind in its group goes too, and output still arriving from
/// a process that left the group is waited for only within `limit`.
pub fn run_to_end(
    command: &mut Command,
    stdin: Vec<u8>,
    limit: Duration,
    cap: u64,
) -> Result<Finished, NotFinished> {
    run_to_end_in(command, stdin, limit, cap, &RunningGroup::default())
}

/// The process group of a program [`run_to_end_in`] runs, while it runs: for a caller that
/// stops waiting early (a plugin call dropped at its time limit) to stop it too.
#[derive(Debug, Clone, Default)]
pub struct RunningGroup(std::sync::Arc<std::sync::Mutex<Option<u32>>>);

impl RunningGroup {
    /// SIGKILL to the group, if its program is still being run.
    pub fn kill(&self) {
        if let Some(leader) = self.0.lock().expect("group lock").take() {
            kill_group(leader);
        }
    }

    fn set(&self, leader: Option<u32>) {
        *self.0.lock().expect("group lock") = leader;
    }
}

/// [`run_to_end`], with the program's group in `group` while it runs.
pub fn run_to_end_in(
    command: &mut Command,
    stdin: Vec<u8>,
    limit: Duration,
    cap: u64,
    group: &RunningGroup,
) -> Result<Finished, NotFinished> {
    let result = run_and_wait(command, stdin, limit, cap, group);
    group.set(None);
    result
}

fn run_and_wait(
    command: &mut Command,
    stdin: Vec<u8>,
    limit: Duration,
    cap: u64,
    group: &RunningGroup,
) -> Result<Finished, NotFinished> {
    use std::io::Write;
    use std::process::Stdio;
    let mut child = GroupChild::spawn(
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    )
    .map_err(|e| NotFinished::NotStarted(e.to_string()))?;
    group.set(Some(child.child.id()));
    let (input, stdout, stderr) = child.take_pipes();
    let mut input = input.expect("stdin is piped");
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let stdout = CappedReader::spawn(stdout.expect("stdout is piped"), cap);
    let stderr = CappedReader::spawn(stderr.expect("stderr is piped"), cap);
    let deadline = Instant::now() + limit;
    let Some(status) = child.wait_until(deadline) else {
        child.kill_group();
        child.wait();
        return Err(NotFinished::TimedOut(limit));
    };
    // A background process holding the pipes would otherwise keep the readers waiting.
    child.kill_group();
    drop(writer);
    // One that left the group may hold them still: wait for them, but never past `limit`.
    let until = deadline.min(Instant::now() + LEFTOVER_WAIT);
    let stdout = stdout.finish_within(until.saturating_duration_since(Instant::now()));
    let stderr = stderr.finish_within(until.saturating_duration_since(Instant::now()));
    Ok(Finished {
        status,
        stdout,
        stderr,
    })
}

/// The exit code of `status`, or -1 when a signal ended the program.
pub fn exit_code(status: Option<ExitStatus>) -> i32 {
    status.and_then(|s| s.code()).unwrap_or(-1)
}

/// Reads `reader` line by line, handing each of the first `max_lines` lines (within
/// `max_bytes` in all) to `each`, and drains the rest unread. `each` returns `false` to stop
/// handing lines over (the reader still drains). Async, so one trial's program has its stdin,
/// stdout and stderr served on the trial's own thread, with no thread per pipe.
pub async fn read_lines_capped(
    reader: impl tokio::io::AsyncRead + Unpin,
    max_bytes: u64,
    max_lines: usize,
    mut each: impl FnMut(String) -> bool,
) {
    use tokio::io::{AsyncBufReadExt, AsyncReadExt};
    let mut reader = tokio::io::BufReader::new(reader);
    let (mut bytes, mut lines) = (0u64, 0usize);
    let mut line = Vec::new();
    loop {
        if bytes >= max_bytes || lines >= max_lines {
            // Over a cap: drain what is left so the writer never blocks.
            let _ = tokio::io::copy(&mut reader, &mut tokio::io::sink()).await;
            return;
        }
        line.clear();
        // A single line is bounded too: past the byte cap it is cut, not buffered whole.
        match (&mut reader)
            .take(max_bytes - bytes)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                bytes += n as u64;
                lines += 1;
                while line.last().is_some_and(|b| *b == b'\n' || *b == b'\r') {
                    line.pop();
                }
                if !each(String::from_utf8_lossy(&line).into_owned()) {
                    lines = max_lines;
                }
            }
        }
    }
}

/// Output read on a thread of its own: at most `cap` bytes kept, the rest drained so the writer
/// never blocks.
pub struct CappedReader {
    kept: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    ended: mpsc::Receiver<()>,
}

impl CappedReader {
    /// Starts reading `reader`, keeping at most `cap` bytes.
    pub fn spawn(mut reader: impl Read + Send + 'static, cap: u64) -> Self {
        let kept = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let (done, ended) = mpsc::channel();
        let buffer = kept.clone();
        std::thread::spawn(move || {
            let mut chunk = [0u8; 8192];
            loop {
                match reader.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut kept = buffer.lock().expect("output buffer");
                        let room = (cap as usize).saturating_sub(kept.len());
                        kept.extend_from_slice(&chunk[..n.min(room)]);
                    }
                }
            }
            let _ = done.send(());
        });
        CappedReader { kept, ended }
    }

    /// What was read, once the output has ended.
    pub fn finish(self) -> Vec<u8> {
        let _ = self.ended.recv();
        self.take()
    }

    /// What was read, waiting at most `limit` for the output to end (a process that left the
    /// group may hold the pipe open forever); what had arrived by then if it did not end.
    pub fn finish_within(self, limit: Duration) -> Vec<u8> {
        let _ = self.ended.recv_timeout(limit);
        self.take()
    }

    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.kept.lock().expect("output buffer"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;
    use std::process::Stdio;

    fn open_files_limit() -> libc::rlimit {
        // SAFETY: getrlimit fills the struct it is given.
        unsafe {
            let mut limit: libc::rlimit = std::mem::zeroed();
            assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0);
            limit
        }
    }

    #[test]
    fn the_open_file_limit_is_raised_as_far_as_asked_within_the_hard_one_and_never_lowered() {
        let before = open_files_limit();
        assert_eq!(allow_open_files(1), before.rlim_cur, "never lowered");
        assert_eq!(open_files_limit().rlim_cur, before.rlim_cur);
        let lowered = libc::rlimit {
            rlim_cur: before.rlim_cur - 10,
            rlim_max: before.rlim_max,
        };
        // SAFETY: lowering the soft limit within the hard one needs no privilege.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lowered) }, 0);
        assert_eq!(allow_open_files(before.rlim_cur - 5), before.rlim_cur - 5);
        assert_eq!(
            open_files_limit().rlim_cur,
            before.rlim_cur - 5,
            "as far as asked"
        );
        assert_eq!(
            allow_open_files(u64::MAX),
            before.rlim_max,
            "within the hard one"
        );
        // SAFETY: as above.
        assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &before) }, 0);
    }

    #[test]
    fn a_bare_program_name_is_found_on_the_childs_path_as_execvp_would() {
        use std::os::unix::fs::PermissionsExt;
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        // Not executable in the first directory, so `execvp` would go on to the second.
        std::fs::write(first.path().join("agent"), "#!/bin/sh\n").unwrap();
        let agent = second.path().join("agent");
        std::fs::write(&agent, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([first.path(), second.path()]).unwrap();
        assert_eq!(resolve_program("agent", Some(&path)), agent);
        // Left to the standard library: paths, names found nowhere, an empty PATH entry.
        assert_eq!(
            resolve_program("./agent", Some(&path)),
            Path::new("./agent")
        );
        assert_eq!(
            resolve_program("nowhere", Some(&path)),
            Path::new("nowhere")
        );
        let with_cwd = std::env::join_paths([Path::new(""), second.path()]).unwrap();
        assert_eq!(
            resolve_program("agent", Some(&with_cwd)),
            Path::new("agent")
        );
        assert_eq!(resolve_program("agent", None), Path::new("agent"));
    }

    #[test]
    fn a_group_is_killed_with_what_it_started() {
        let mut child = GroupChild::spawn(
            Command::new("sh")
                .args(["-c", "sleep 30 & echo started; wait"])
                .stdout(Stdio::piped()),
        )
        .unwrap();
        let (_, stdout, _) = child.take_pipes();
        let output = CappedReader::spawn(stdout.unwrap(), 1024);
        let deadline = Instant::now() + Duration::from_millis(300);
        assert!(child.wait_until(deadline).is_none(), "still running");
        let started = Instant::now();
        child.kill_group();
        child.wait();
        // The background sleep held stdout; killing the group closes it.
        assert_eq!(output.finish_within(Duration::from_secs(5)), b"started\n");
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    #[test]
    fn reads_are_capped_and_drained() {
        let big = vec![b'x'; 100_000];
        let capped = CappedReader::spawn(std::io::Cursor::new(big), 10);
        assert_eq!(capped.finish().len(), 10);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let text = "a\nb\nc\nd\n".repeat(1000);
        let mut seen = Vec::new();
        runtime.block_on(read_lines_capped(text.as_bytes(), 1 << 20, 3, |line| {
            seen.push(line);
            true
        }));
        assert_eq!(seen, ["a", "b", "c"]);
        let mut seen = Vec::new();
        let input = "0123456789\nnext\n".as_bytes();
        runtime.block_on(read_lines_capped(input, 4, 10, |line| {
            seen.push(line);
            true
        }));
        assert_eq!(seen, ["0123"], "a line past the byte cap is cut");
    }

    /// Whether process `pid` has ended: gone, or a zombie its new parent has not reaped yet.
    fn ended(pid: u32) -> bool {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // The state follows the name, which is in parentheses and may hold anything.
            Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| {
                matches!(rest.trim_start().chars().next(), Some('Z' | 'X'))
            }),
            Err(_) => true,
        }
    }

    /// Waits up to 5 s for process `pid` to end.
    fn ends_soon(pid: u32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if ended(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    #[tokio::test]
    async fn a_trials_program_is_the_oom_killers_first_choice_over_its_parent() {
        let argv = ["sleep", "30"].map(String::from);
        let child = AsyncGroupChild::spawn(GroupCommand::new(&argv, &Default::default())).unwrap();
        let score = |pid: u32| {
            std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj"))
                .unwrap()
                .trim()
                .parse::<i32>()
                .unwrap()
        };
        assert!(score(child.leader) >= 500, "the program");
        assert!(
            score(std::process::id()) < 500,
            "not the process that started it"
        );
        child.kill_group();
        // What it starts at once inherits the score: it is set before the program runs.
        let dir = tempfile::tempdir().unwrap();
        let seen = dir.path().join("seen");
        let script = format!("cat /proc/self/oom_score_adj > {}", seen.display());
        let argv = ["sh".to_string(), "-c".to_string(), script];
        let mut child =
            AsyncGroupChild::spawn(GroupCommand::new(&argv, &Default::default())).unwrap();
        child.wait().await;
        assert_eq!(std::fs::read_to_string(&seen).unwrap().trim(), "500");
    }

    /// A shell in its own group that starts a `sleep` in the background (a grandchild of
    /// this process) and waits for it: the started handle and the `sleep`'s pid.
    async fn with_grandchild() -> (AsyncGroupChild, u32) {
        let argv = ["sh", "-c", "sleep 30 & echo $!; wait"].map(String::from);
        let mut command = GroupCommand::new(&argv, &Default::default());
        command.command_mut().stdout(Stdio::piped());
        let mut child = AsyncGroupChild::spawn(command).unwrap();
        let (_, stdout, _) = child.take_pipes();
        // One line only: the sleep holds the pipe open, so it would not end.
        let mut line = String::new();
        let mut stdout = tokio::io::BufReader::new(stdout.unwrap());
        tokio::io::AsyncBufReadExt::read_line(&mut stdout, &mut line)
            .await
            .unwrap();
        let pid = line.trim().parse().expect("the shell said its sleep's pid");
        (child, pid)
    }

    #[tokio::test]
    async fn an_async_groups_grandchild_dies_when_it_is_stopped() {
        let (mut child, sleep) = with_grandchild().await;
        assert!(!ended(sleep), "the sleep runs");
        let status = child.stop().await;
        assert!(status.is_some_and(|s| !s.success()), "killed: {status:?}");
        assert!(ends_soon(sleep), "the sleep went with its group");
    }

    #[tokio::test]
    async fn an_async_groups_grandchild_dies_when_it_is_dropped() {
        let (child, sleep) = with_grandchild().await;
        assert!(!ended(sleep), "the sleep runs");
        drop(child);
        assert!(ends_soon(sleep), "the sleep went with its group");
    }

    #[tokio::test]
    async fn an_async_child_sees_the_minimal_environment_unless_it_inherits_mine() {
        std::env::set_var("MST_ASYNC_CANARY", "canary-async-env");
        let argv = ["env".to_string()];
        let env = |mut command: GroupCommand| async move {
            command.command_mut().stdout(Stdio::piped());
            let mut child = AsyncGroupChild::spawn(command).unwrap();
            let (_, stdout, _) = child.take_pipes();
            let mut lines = Vec::new();
            read_lines_capped(stdout.unwrap(), 1 << 20, usize::MAX, |line| {
                lines.push(line);
                true
            })
            .await;
            child.wait().await;
            lines
        };
        let given = [("FROM_CONFIG".to_string(), "yes".to_string())].into();
        let minimal = env(GroupCommand::new(&argv, &given)).await;
        assert!(
            !minimal.iter().any(|l| l.starts_with("MST_ASYNC_CANARY=")),
            "{minimal:?}"
        );
        assert!(
            minimal.iter().any(|l| l == "FROM_CONFIG=yes"),
            "{minimal:?}"
        );
        assert!(
            minimal.iter().any(|l| l.starts_with("PATH=")),
            "{minimal:?}"
        );
        let inherited = env(GroupCommand::inheriting_env(&argv)).await;
        assert!(
            inherited
                .iter()
                .any(|l| l == "MST_ASYNC_CANARY=canary-async-env"),
            "{inherited:?}"
        );
    }

    #[tokio::test]
    async fn an_async_childs_output_past_the_cap_is_drained_so_it_ends() {
        // 8 MiB of lines, far past a pipe's buffer: unread, the program would block on it;
        // closed unread, `head` would fail writing (SIGPIPE) and nothing would say `ended`.
        let argv = [
            "sh",
            "-c",
            "yes 0123456789abcdef | head -c 8388608 && echo ended >&2",
        ]
        .map(String::from);
        let mut command = GroupCommand::new(&argv, &Default::default());
        command
            .command_mut()
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = AsyncGroupChild::spawn(command).unwrap();
        let (_, stdout, stderr) = child.take_pipes();
        let (mut kept, mut said) = (0, Vec::new());
        let out = read_lines_capped(stdout.unwrap(), 1000, usize::MAX, |line| {
            kept += line.len();
            true
        });
        let err = read_lines_capped(stderr.unwrap(), 1000, 10, |line| {
            said.push(line);
            true
        });
        let ended = tokio::time::timeout(Duration::from_secs(20), async {
            tokio::join!(out, err);
            child.wait().await
        })
        .await
        .expect("the program ended: its output was drained");
        assert!(ended.is_some_and(|s| s.success()), "{ended:?}");
        assert!(kept <= 1000 && kept > 900, "kept {kept} bytes");
        assert_eq!(said, ["ended"]);
    }

    #[test]
    fn an_async_child_asked_to_die_with_its_parent_dies_with_the_thread_that_started_it() {
        let pid = std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async {
                let argv = ["sleep", "30"].map(String::from);
                let mut command = GroupCommand::new(&argv, &Default::default());
                command.die_with_parent();
                let child = AsyncGroupChild::spawn(command).unwrap();
                let pid = child.leader;
                // Never dropped: only the thread's end may stop it.
                std::mem::forget(child);
                pid
            })
        })
        .join()
        .unwrap();
        assert!(ends_soon(pid), "the sleep died with its thread");
    }
}
