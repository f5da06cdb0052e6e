//! Bubblewrap sandboxes (Debian's `bubblewrap`, the tool Flatpak and the agent CLIs use), in
//! two layers on the `local` runner with `isolation=bwrap`:
//!
//! - the **machine's** ([`Bwrap::machine`]): the worker runs in it, with a read-only view of
//!   the system (`/usr`, `/etc` and the top-level links or directories into them), its own
//!   program, what the operator exposes read-only (`expose=PATH,…`) and the machine's
//!   directory, the only place it may write besides a fresh `/tmp`; in user, PID, IPC and UTS
//!   namespaces of its own and, unless the operator passes `network=host`, a network namespace
//!   holding only its loopback, where the model gateway serves. Nothing else of the operator's
//!   is there: not the eval, its datasets, the secrets file, the results or their home.
//! - each **trial process's** ([`TrialSandbox`]): every program a trial starts (its agent,
//!   each stdio MCP server, each check) runs in a sandbox of its own inside the machine's, in
//!   its own PID namespace, with every capability dropped, a fresh `/tmp`, and nothing of the
//!   machine's directory but the trial's work directory and home: not the bundle (every case's
//!   input and the shard's settings), the results, the other trials or the worker (whose memory holds every
//!   token). It shares the machine's network namespace, so the gateway stays reachable.
//!
//! The machine's sandbox keeps its capabilities inside its own user namespace, which is what
//! lets the worker start the trials' sandboxes in it; they give the host's user nothing more.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directories at the file system's top that hold the system's programs and libraries:
/// bound read-only where they are directories, recreated where they are links (`/bin` →
/// `usr/bin` on a merged-`/usr` system).
const SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The variable through which a runner tells its worker to sandbox each trial's programs: a
/// [`TrialSandboxRequest`] as JSON (`{"expose":[]}`). The `local` runner sets it with
/// `isolation=bwrap`, the `ssh` runner plugin by default. Not passed on to anything the
/// worker starts.
pub const TRIAL_SANDBOX_ENV: &str = "MST_TRIAL_SANDBOX";

/// What a runner asks of its worker through [`TRIAL_SANDBOX_ENV`]: a sandbox for each of its
/// trials' programs, made with the machine's own bubblewrap, showing them `expose` (absolute
/// paths) read-only besides the system; with `egress`, the unix socket of the machine's
/// egress proxy ([`crate::egress`]), which each trial reaches through a proxy port of its own.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrialSandboxRequest {
    #[serde(default)]
    pub expose: Vec<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub egress: Option<PathBuf>,
}

/// What to install when bubblewrap is missing, and the way around it.
pub const INSTALL_HINT: &str = "install bubblewrap (Debian and Ubuntu: apt-get install \
     bubblewrap; Fedora: dnf install bubblewrap), or pass --runner-option isolation=none to run \
     unsandboxed";

/// How a machine's sandbox reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// Only its own loopback (the default).
    None,
    /// The host's network, as the worker would have it unsandboxed.
    Host,
}

/// The `bwrap` program and what every sandbox it makes shows read-only besides the system.
#[derive(Debug, Clone)]
pub struct Bwrap {
    /// The `bwrap` program.
    program: PathBuf,
    /// What the operator exposes, read-only, at the same paths.
    expose: Vec<PathBuf>,
    /// The system directories as this host has them, as bwrap arguments: read once, not at
    /// every program a trial starts.
    system: Vec<OsString>,
}

impl Bwrap {
    /// Bubblewrap as found on the PATH, exposing `expose` (absolute paths that exist); refused,
    /// saying what to install, when it is not there.
    pub fn find(expose: Vec<PathBuf>) -> Result<Self> {
        let path = std::env::var_os("PATH").unwrap_or_default();
        let program = crate::process::resolve_program("bwrap", Some(&path));
        if !program.is_absolute() {
            bail!(
                "the sandbox needs bubblewrap (`bwrap`), which is not on the PATH: {INSTALL_HINT}"
            );
        }
        Ok(Bwrap {
            program,
            expose,
            system: system_view(),
        })
    }

    /// What a worker is to be told ([`TRIAL_SANDBOX_ENV`]) for its trials' sandboxes to show
    /// what this one does.
    pub fn trial_request(&self) -> TrialSandboxRequest {
        TrialSandboxRequest {
            expose: self.expose.clone(),
            egress: None,
        }
    }

    /// The machine's sandbox around `program args`: `root` (the machine's directory) is its
    /// only writable directory and its `HOME` the `home` directory in it.
    pub fn machine(
        &self,
        root: &Path,
        network: Network,
        program: &Path,
        args: &[String],
    ) -> (PathBuf, Vec<OsString>) {
        let mut argv = Vec::new();
        // Its own user namespace: the capabilities it keeps (as root), which the worker needs
        // to make the trials' sandboxes, hold only inside it.
        push(&mut argv, &["--unshare-user"], &[]);
        if network == Network::None {
            push(&mut argv, &["--unshare-net"], &[]);
        }
        self.common(&mut argv);
        // On the host's network, names resolve as the host's do: systemd-resolved's
        // `/etc/resolv.conf` links into `/run`.
        let resolved = Path::new("/run/systemd/resolve");
        if network == Network::Host && resolved.is_dir() {
            push(&mut argv, &["--ro-bind"], &[resolved, resolved]);
        }
        push(&mut argv, &["--ro-bind"], &[program, program]);
        push(&mut argv, &["--bind"], &[root, root]);
        push(&mut argv, &["--setenv", "HOME"], &[&root.join(HOME_DIR)]);
        push(&mut argv, &["--chdir"], &[root]);
        push(&mut argv, &["--"], &[program]);
        argv.extend(args.iter().map(OsString::from));
        (self.program.clone(), argv)
    }

    /// What every sandbox has: a session of its own, its own PID, IPC, UTS (and, where the
    /// kernel has them, control group) namespaces, the system read-only, `/proc`, `/dev`, a
    /// fresh `/tmp` as `TMPDIR`, and what the operator exposes.
    fn common(&self, argv: &mut Vec<OsString>) {
        push(
            argv,
            &[
                "--die-with-parent",
                // No controlling terminal to push keystrokes into (TIOCSTI, CVE-2017-5226).
                "--new-session",
                "--unshare-pid",
                "--unshare-ipc",
                "--unshare-uts",
                "--unshare-cgroup-try",
            ],
            &[],
        );
        argv.extend(self.system.iter().cloned());
        push(
            argv,
            &["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"],
            &[],
        );
        push(argv, &["--setenv", "TMPDIR", "/tmp"], &[]);
        for path in &self.expose {
            push(argv, &["--ro-bind"], &[path, path]);
        }
    }
}

/// The name of the machine's home directory, inside its own directory.
pub const HOME_DIR: &str = "home";

/// The sandbox of one trial's programs: the machine's [`Bwrap`] and the trial's directories,
/// the only ones its programs may write.
#[derive(Debug)]
pub struct TrialSandbox<'a> {
    bwrap: &'a Bwrap,
    writable: Vec<PathBuf>,
}

impl<'a> TrialSandbox<'a> {
    /// Sandboxes for the programs of a trial whose own directories are `writable` (its work
    /// directory and its home).
    pub fn new(bwrap: &'a Bwrap, writable: Vec<PathBuf>) -> Self {
        TrialSandbox { bwrap, writable }
    }

    /// `command` (made by [`crate::process::clean_command`]: its environment cleared to what
    /// it is given; no stdio set yet) run in a sandbox of its own: the same program, arguments,
    /// environment and working directory, with every capability dropped. Refused when its
    /// program is a name not found on the PATH or a path to no executable file: inside, the
    /// sandbox would start and the program's absence would look like its failure.
    pub fn confine(&self, command: Command) -> Result<Command, String> {
        let program = Path::new(command.get_program());
        let missing = match program.is_absolute() {
            true => !crate::process::is_executable_file(program),
            // A path relative to its working directory is looked up inside.
            false => !program.as_os_str().as_encoded_bytes().contains(&b'/'),
        };
        if missing {
            return Err(format!(
                "{} is not an executable file in the sandbox, which shows the system's \
                 directories and what --runner-option expose=DIR,… names (a program in a home \
                 directory, as pyenv's or nvm's are, needs its directory exposed)",
                program.display()
            ));
        }
        let mut argv = Vec::new();
        push(&mut argv, &["--cap-drop", "ALL"], &[]);
        self.bwrap.common(&mut argv);
        for dir in &self.writable {
            push(&mut argv, &["--bind"], &[dir, dir]);
        }
        if let Some(dir) = command.get_current_dir() {
            push(&mut argv, &["--chdir"], &[dir]);
        }
        push(&mut argv, &["--"], &[Path::new(command.get_program())]);
        argv.extend(command.get_args().map(OsString::from));
        let mut confined = Command::new(&self.bwrap.program);
        confined.args(argv).env_clear();
        for (name, value) in command.get_envs() {
            if let Some(value) = value {
                confined.env(name, value);
            }
        }
        if let Some(dir) = command.get_current_dir() {
            confined.current_dir(dir);
        }
        Ok(confined)
    }
}

/// Appends `words`, then `paths`, to `argv`.
/// The system directories as this host has them, as bwrap arguments: each a link where it is
/// one (`/bin` → `usr/bin` on merged-/usr systems), else a read-only bind.
fn system_view() -> Vec<OsString> {
    let mut argv = Vec::new();
    for dir in SYSTEM_DIRS {
        match std::fs::read_link(dir) {
            Ok(target) => push(&mut argv, &["--symlink"], &[&target, Path::new(dir)]),
            Err(_) if Path::new(dir).is_dir() => {
                push(&mut argv, &["--ro-bind"], &[Path::new(dir), Path::new(dir)])
            }
            Err(_) => {}
        }
    }
    argv
}

fn push(argv: &mut Vec<OsString>, words: &[&str], paths: &[&Path]) {
    argv.extend(words.iter().map(OsString::from));
    argv.extend(paths.iter().map(|p| p.as_os_str().to_owned()));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bwrap() -> Bwrap {
        Bwrap {
            program: PathBuf::from("/usr/bin/bwrap"),
            expose: vec![PathBuf::from("/opt/tools")],
            system: system_view(),
        }
    }

    fn joined(argv: &[OsString]) -> String {
        let words: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        words.join(" ")
    }

    #[test]
    fn a_machine_binds_only_what_it_should() {
        let root = Path::new("/tmp/mst-local-x");
        let (program, argv) = bwrap().machine(
            root,
            Network::None,
            Path::new("/opt/mst/mst"),
            &["collect".into()],
        );
        assert_eq!(program, Path::new("/usr/bin/bwrap"));
        let joined = joined(&argv);
        for expected in [
            "--unshare-user",
            "--unshare-net",
            "--new-session",
            "--unshare-pid",
            "--ro-bind /opt/tools /opt/tools",
            "--ro-bind /opt/mst/mst /opt/mst/mst",
            "--bind /tmp/mst-local-x /tmp/mst-local-x",
            "--setenv HOME /tmp/mst-local-x/home",
            "--tmpfs /tmp",
            "-- /opt/mst/mst collect",
        ] {
            assert!(joined.contains(expected), "{expected}: {joined}");
        }
        // The writable machine comes after the fresh /tmp it lies in, or the tmpfs would hide it.
        let tmpfs = joined.find("--tmpfs /tmp").unwrap();
        assert!(joined.find("--bind /tmp/mst-local-x").unwrap() > tmpfs);
        let (_, argv) = bwrap().machine(root, Network::Host, Path::new("/opt/mst/mst"), &[]);
        assert!(!argv.iter().any(|a| a == "--unshare-net"));
    }

    #[test]
    fn a_trial_program_keeps_its_command_and_writes_only_its_trial() {
        let mut command = Command::new("/usr/bin/sh");
        command
            .args(["-c", "echo hi"])
            .env_clear()
            .env("HOME", "/tmp/mst-home-1")
            .current_dir("/tmp/mst-trial-1");
        let bwrap = bwrap();
        let sandbox = TrialSandbox::new(
            &bwrap,
            vec!["/tmp/mst-trial-1".into(), "/tmp/mst-home-1".into()],
        );
        let confined = sandbox.confine(command).unwrap();
        assert_eq!(confined.get_program(), "/usr/bin/bwrap");
        let argv: Vec<OsString> = confined.get_args().map(OsString::from).collect();
        let joined = joined(&argv);
        for expected in [
            "--cap-drop ALL",
            "--unshare-pid",
            "--tmpfs /tmp",
            "--bind /tmp/mst-trial-1 /tmp/mst-trial-1",
            "--bind /tmp/mst-home-1 /tmp/mst-home-1",
            "--chdir /tmp/mst-trial-1",
            "-- /usr/bin/sh -c echo hi",
        ] {
            assert!(joined.contains(expected), "{expected}: {joined}");
        }
        // The trial shares the machine's network: the gateway serves on its loopback.
        assert!(!joined.contains("--unshare-net"), "{joined}");
        assert!(!joined.contains("--unshare-user"), "{joined}");
        let envs: Vec<_> = confined.get_envs().collect();
        assert_eq!(
            envs,
            vec![(
                std::ffi::OsStr::new("HOME"),
                Some(std::ffi::OsStr::new("/tmp/mst-home-1"))
            )]
        );
        assert_eq!(
            confined.get_current_dir(),
            Some(Path::new("/tmp/mst-trial-1"))
        );
        // A program that is not there is refused before any sandbox starts.
        for program in ["/no/such/program", "no-such-program-on-path"] {
            let err = sandbox.confine(Command::new(program)).unwrap_err();
            assert!(err.contains(program), "{err}");
        }
    }
}
