//! Host programs run on a plugin's behalf, through the `exec` import or a runner plugin's
//! command channel. Both go through here so the rules are the same: no shell, an environment
//! of `PATH`, `HOME` and `KUBECONFIG` only (never the operator's secrets), output and time
//! capped, and nothing the program started outlives it.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Bytes kept of a program's stdout or stderr.
pub const MAX_OUTPUT: usize = 16 * 1024 * 1024;

/// What a finished program left.
#[derive(Debug)]
pub struct Output {
    /// Its exit code, or -1 when a signal ended it.
    pub status: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The environment variables a host program gets: where to find programs and their own
/// configuration (`ssh` reads `~/.ssh`, `kubectl` `~/.kube/config` or `$KUBECONFIG`). Nothing
/// else of the host's environment, where secrets live, reaches them; `SSH_AUTH_SOCK` is left
/// out on purpose: it would lend the operator's whole agent (use the ssh runner's `identity`).
pub const PASSED_ENV: [&str; 3] = ["PATH", "HOME", "KUBECONFIG"];

/// `program` with `args`, no shell, only [`PASSED_ENV`] in its environment, leading its own
/// process group (so a timeout can stop everything it started).
pub fn command(program: &str, args: &[String]) -> Command {
    let mut command = Command::new(program);
    command.args(args).env_clear();
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    for name in PASSED_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}

/// Reads at most `cap` bytes from `reader`, then drains the rest so the writer never blocks.
pub fn read_capped(mut reader: impl Read, cap: usize) -> Vec<u8> {
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf) {
            Ok(0) | Err(_) => return kept,
            Ok(n) => {
                let room = cap.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
            }
        }
    }
}

/// Runs `program` (see [`command`]) with `stdin`, killing it at `timeout`.
pub fn run(
    program: &str,
    args: &[String],
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<Output, String> {
    let mut child = command(program, args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let mut input = child.stdin.take().expect("stdin is piped");
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&stdin);
    });
    let stdout = reader(child.stdout.take().expect("stdout is piped"));
    let stderr = reader(child.stderr.take().expect("stderr is piped"));

    let started = Instant::now();
    let group = child.id() as i32;
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() >= timeout {
            kill_group(group);
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "timed out after {} ms and was killed",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    // Whatever it left behind in its group goes too: a background process holding the pipes
    // would otherwise keep the readers (and this call) waiting.
    kill_group(group);
    drop(writer);
    Ok(Output {
        status: status.code().unwrap_or(-1),
        stdout: stdout.recv_timeout(LEFTOVER_WAIT).unwrap_or_default(),
        stderr: stderr.recv_timeout(LEFTOVER_WAIT).unwrap_or_default(),
    })
}

/// How long output may keep arriving after the program ended (from a process that left its
/// group); after that the call returns what it has.
const LEFTOVER_WAIT: Duration = Duration::from_secs(5);

/// Reads `pipe` (capped) on a thread of its own; the contents arrive on the receiver.
fn reader(pipe: impl Read + Send + 'static) -> std::sync::mpsc::Receiver<Vec<u8>> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(read_capped(pipe, MAX_OUTPUT));
    });
    rx
}

/// SIGKILL to process group `group`.
fn kill_group(group: i32) {
    // SAFETY: kill(2) on a process group `command` created for a program we started.
    #[cfg(unix)]
    unsafe {
        libc::kill(-group, libc::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_time_out_and_are_killed() {
        let started = Instant::now();
        let err = run(
            "sleep",
            &["5".into()],
            Vec::new(),
            Duration::from_millis(100),
        )
        .unwrap_err();
        assert!(err.contains("timed out"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(4));
    }

    #[test]
    fn what_a_program_leaves_behind_is_stopped_with_it() {
        let started = Instant::now();
        let out = run(
            "sh",
            &["-c".into(), "sleep 30 & echo started".into()],
            Vec::new(),
            Duration::from_secs(20),
        )
        .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "started");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the background sleep held the pipe: {:?}",
            started.elapsed()
        );
    }

    #[test]
    fn programs_get_stdin_and_no_environment() {
        let out = run("cat", &[], b"piped".to_vec(), Duration::from_secs(5)).unwrap();
        assert_eq!(
            (out.status, out.stdout.as_slice()),
            (0, b"piped".as_slice())
        );
        std::env::set_var("MST_TEST_LEAK", "leaked");
        let out = run("env", &[], Vec::new(), Duration::from_secs(5)).unwrap();
        let env = String::from_utf8_lossy(&out.stdout);
        assert!(
            !env.contains("MST_TEST_LEAK") && env.contains("PATH="),
            "{env}"
        );
    }
}
