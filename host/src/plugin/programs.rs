//! Host programs run on a plugin's behalf, through the `exec` import or a runner plugin's
//! command channel. Both go through here so the rules are the same: no shell, an environment
//! of `PATH` and `HOME` only (never the operator's secrets), output and time capped.

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

/// `program` with `args`, no shell, and only `PATH` and `HOME` in its environment: tools such
/// as `ssh` and `kubectl` find their own configuration from `HOME`, and nothing else of the
/// host's environment (where secrets live) reaches them.
pub fn command(program: &str, args: &[String]) -> Command {
    let mut command = Command::new(program);
    command.args(args).env_clear();
    for name in ["PATH", "HOME"] {
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
    let stdout = child.stdout.take().expect("stdout is piped");
    let stderr = child.stderr.take().expect("stderr is piped");
    let out_reader = std::thread::spawn(move || read_capped(stdout, MAX_OUTPUT));
    let err_reader = std::thread::spawn(move || read_capped(stderr, MAX_OUTPUT));

    let started = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
            break status;
        }
        if started.elapsed() >= timeout {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "timed out after {} ms and was killed",
                timeout.as_millis()
            ));
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = writer.join();
    Ok(Output {
        status: status.code().unwrap_or(-1),
        stdout: out_reader.join().unwrap_or_default(),
        stderr: err_reader.join().unwrap_or_default(),
    })
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
