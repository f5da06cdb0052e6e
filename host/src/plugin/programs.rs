//! Host programs run on a plugin's behalf, through the `exec` import or a runner plugin's
//! command channel. Both go through here so the rules are the same: no shell, an environment
//! of `PATH`, `HOME`, `KUBECONFIG` and `SLURM_CONF` only (never the operator's secrets), and a
//! private empty working directory, never mst's (where a `tar -x` reading the plugin's stdin
//! would land in the operator's eval repository); the process rules (own group, deadline,
//! capped output) are [`crate::process`]'s.

use crate::process::{run_to_end_in, RunningGroup};
use std::process::Command;
use std::time::Duration;

/// Bytes kept of a program's stdout or stderr.
pub const MAX_OUTPUT: u64 = 16 * 1024 * 1024;

/// What a finished program left.
#[derive(Debug)]
pub struct Output {
    /// Its exit code, or -1 when a signal ended it.
    pub status: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// The environment variables a host program gets: where to find programs and their own
/// configuration (`ssh` reads `~/.ssh`, `kubectl` `~/.kube/config` or `$KUBECONFIG`, Slurm's
/// commands `$SLURM_CONF` when the cluster's is not in `/etc/slurm`). Nothing
/// else of the host's environment, where secrets live, reaches them; `SSH_AUTH_SOCK` is left
/// out on purpose: it would lend the operator's whole agent (use the ssh runner's `identity`).
pub const PASSED_ENV: [&str; 4] = ["PATH", "HOME", "KUBECONFIG", "SLURM_CONF"];

/// `program` with `args`, no shell, only [`PASSED_ENV`] in its environment, in `cwd` (a
/// private empty directory of the caller's, [`private_dir`]). Start it through
/// [`crate::process`] (as [`run`] and command channels do), so that a timeout stops everything
/// it started.
pub fn command(program: &str, args: &[String], cwd: &std::path::Path) -> Command {
    let mut command = Command::new(program);
    command.args(args).current_dir(cwd).env_clear();
    for name in PASSED_ENV {
        if let Some(value) = std::env::var_os(name) {
            command.env(name, value);
        }
    }
    command
}

/// Runs `program` (see [`command`]) with `stdin`, killing its group at `timeout`.
pub fn run(
    program: &str,
    args: &[String],
    stdin: Vec<u8>,
    timeout: Duration,
) -> Result<Output, String> {
    run_in(program, args, stdin, timeout, &RunningGroup::default())
}

/// [`run`], with the program's group in `group` while it runs, so that a caller that stops
/// waiting first can kill it.
pub fn run_in(
    program: &str,
    args: &[String],
    stdin: Vec<u8>,
    timeout: Duration,
    group: &RunningGroup,
) -> Result<Output, String> {
    let cwd = private_dir()?;
    let finished = run_to_end_in(
        &mut command(program, args, cwd.path()),
        stdin,
        timeout,
        MAX_OUTPUT,
        group,
    )?;
    Ok(Output {
        status: crate::process::exit_code(finished.status),
        stdout: finished.stdout,
        stderr: finished.stderr,
    })
}

/// A new private (0700) empty directory for host programs to run in, removed when dropped.
pub fn private_dir() -> Result<tempfile::TempDir, String> {
    use std::os::unix::fs::PermissionsExt;
    tempfile::Builder::new()
        .prefix("mst-exec-")
        .permissions(std::fs::Permissions::from_mode(0o700))
        .tempdir()
        .map_err(|e| format!("cannot make a working directory for the program: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

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
    fn programs_run_in_a_private_empty_directory_never_msts() {
        let out = run(
            "sh",
            &["-c".into(), "pwd; ls -A | wc -l".into()],
            Vec::new(),
            Duration::from_secs(5),
        )
        .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let (dir, entries) = text.trim().split_once('\n').unwrap();
        let dir = std::path::Path::new(dir);
        assert_ne!(dir, std::env::current_dir().unwrap());
        assert!(
            dir.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("mst-exec-"),
            "{text}"
        );
        assert_eq!(entries.trim(), "0", "{text}");
        assert!(!dir.exists(), "removed once the program ended");
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
