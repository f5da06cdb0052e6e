//! The local machine's sandbox (`--runner-option isolation=bwrap`): the worker, and everything
//! it starts (agents, stdio MCP servers, checks), run inside one bubblewrap sandbox, the tool
//! Flatpak and the agent CLIs use. Inside there is a read-only view of the system (`/usr`,
//! `/etc` and the top-level links or directories into them), the worker's own program, what the
//! operator exposes read-only (`expose=PATH,…`), and the machine's directory, the only place it
//! may write besides a fresh `/tmp`. `HOME` is an empty directory of the machine's own. Nothing
//! else of the operator's is there: not the eval, its datasets, the secrets file, the results
//! or the operator's home. Processes see only their own (a PID namespace) and have no network
//! but their own loopback, where the model gateway serves, unless the operator passes
//! `network=host`. Every capability is dropped, and the sandbox ends with the worker.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The directories at the file system's top that hold the system's programs and libraries:
/// bound read-only where they are directories, recreated where they are links (`/bin` →
/// `usr/bin` on a merged-`/usr` system).
const SYSTEM_DIRS: [&str; 8] = [
    "/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32",
];

/// The name of the machine's home directory, inside its own directory.
pub const HOME_DIR: &str = "home";

/// How a sandboxed machine reaches the network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Network {
    /// Only its own loopback (the default).
    None,
    /// The host's network, as the worker would have it unsandboxed.
    Host,
}

/// A bubblewrap sandbox for one local machine.
#[derive(Debug, Clone)]
pub struct Sandbox {
    /// The `bwrap` program.
    bwrap: PathBuf,
    network: Network,
    /// What the operator exposes, read-only, at the same paths.
    expose: Vec<PathBuf>,
}

impl Sandbox {
    /// The sandbox the options ask for: `network` (`none` or `host`) and `expose` (absolute
    /// paths, comma-separated, each of which must exist). Refused, saying what to install,
    /// when bubblewrap is not on the PATH.
    pub fn new(network: Option<&str>, expose: Option<&str>) -> Result<Self> {
        let network = match network.unwrap_or("none") {
            "none" => Network::None,
            "host" => Network::Host,
            other => bail!(
                "--runner-option network={other}: the `local` runner's sandbox takes `none` (its \
                 own loopback only, the default) or `host`"
            ),
        };
        let mut exposed = Vec::new();
        for path in expose.into_iter().flat_map(|e| e.split(',')) {
            let path = Path::new(path.trim());
            if !path.is_absolute() {
                bail!(
                    "--runner-option expose={}: each path must be absolute",
                    path.display()
                );
            }
            let path = path.canonicalize().with_context(|| {
                format!("--runner-option expose={}: no such path", path.display())
            })?;
            exposed.push(path);
        }
        let bwrap = find_on_path("bwrap").context(
            "--runner-option isolation=bwrap needs bubblewrap, which is not on the PATH: install \
             it (Debian and Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap), \
             or pass isolation=none to run unsandboxed",
        )?;
        Ok(Sandbox {
            bwrap,
            network,
            expose: exposed,
        })
    }

    /// The program to start and its arguments: `program args` inside the sandbox, with
    /// `root` (the machine's directory) its only writable directory and `HOME` there.
    pub fn wrap(&self, root: &Path, program: &Path, args: &[String]) -> (PathBuf, Vec<OsString>) {
        let mut argv: Vec<OsString> = [
            "--die-with-parent",
            // A session of its own: no controlling terminal to push keystrokes into
            // (TIOCSTI, CVE-2017-5226).
            "--new-session",
            "--unshare-pid",
            "--unshare-ipc",
            "--unshare-uts",
            "--unshare-cgroup-try",
            "--cap-drop",
            "ALL",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        match self.network {
            Network::None => argv.push("--unshare-net".into()),
            // On the host's network, names resolve as the host's do: systemd-resolved's
            // `/etc/resolv.conf` links into `/run`.
            Network::Host => {
                let resolved = Path::new("/run/systemd/resolve");
                if resolved.is_dir() {
                    push(&mut argv, &["--ro-bind"], &[resolved, resolved]);
                }
            }
        }
        for dir in SYSTEM_DIRS {
            match std::fs::read_link(dir) {
                Ok(target) => push(&mut argv, &["--symlink"], &[&target, Path::new(dir)]),
                Err(_) if Path::new(dir).is_dir() => {
                    push(&mut argv, &["--ro-bind"], &[Path::new(dir), Path::new(dir)])
                }
                Err(_) => {}
            }
        }
        push(&mut argv, &["--proc", "/proc", "--dev", "/dev"], &[]);
        push(&mut argv, &["--tmpfs", "/tmp"], &[]);
        for path in self.expose.iter().map(PathBuf::as_path).chain([program]) {
            push(&mut argv, &["--ro-bind"], &[path, path]);
        }
        let home = root.join(HOME_DIR);
        push(&mut argv, &["--bind"], &[root, root]);
        push(&mut argv, &["--setenv", "HOME"], &[&home]);
        push(
            &mut argv,
            &["--setenv", "TMPDIR", "/tmp", "--chdir"],
            &[root],
        );
        argv.push("--".into());
        argv.push(program.into());
        argv.extend(args.iter().map(OsString::from));
        (self.bwrap.clone(), argv)
    }
}

/// Appends `words`, then `paths`, to `argv`.
fn push(argv: &mut Vec<OsString>, words: &[&str], paths: &[&Path]) {
    argv.extend(words.iter().map(OsString::from));
    argv.extend(paths.iter().map(|p| p.as_os_str().to_owned()));
}

/// `name` as an executable file in a directory of this process's PATH.
fn find_on_path(name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join(name))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked_and_the_argv_binds_only_what_it_should() {
        let err = Sandbox::new(Some("bridge"), None).unwrap_err().to_string();
        assert!(
            err.contains("network=bridge") && err.contains("`host`"),
            "{err}"
        );
        let err = Sandbox::new(None, Some("relative/dir"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be absolute"), "{err}");
        let err = format!(
            "{:#}",
            Sandbox::new(None, Some("/no/such/dir")).unwrap_err()
        );
        assert!(err.contains("no such path"), "{err}");
        let sandbox = Sandbox {
            bwrap: PathBuf::from("/usr/bin/bwrap"),
            network: Network::None,
            expose: vec![PathBuf::from("/opt/tools")],
        };
        let root = Path::new("/tmp/mst-local-x");
        let (program, argv) = sandbox.wrap(root, Path::new("/opt/mst/mst"), &["collect".into()]);
        assert_eq!(program, Path::new("/usr/bin/bwrap"));
        let argv: Vec<String> = argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = argv.join(" ");
        for expected in [
            "--unshare-net",
            "--new-session",
            "--unshare-pid",
            "--cap-drop ALL",
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
        let host = Sandbox {
            network: Network::Host,
            ..sandbox
        };
        let (_, argv) = host.wrap(root, Path::new("/opt/mst/mst"), &[]);
        assert!(!argv.iter().any(|a| a == "--unshare-net"));
    }
}
