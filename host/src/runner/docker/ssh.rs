//! Docker hosts over SSH (`ssh://[user@]host[:port]`), reached the way the docker CLI reaches
//! them: every connection to the engine is one `ssh … -- docker system dial-stdio` on the
//! remote host, whose stdin and stdout carry the connection's bytes. bollard speaks HTTP to a
//! private unix socket here ([`SshTunnel`]), and each connection accepted on it is piped
//! through an ssh of its own.
//!
//! Host keys are always checked strictly (`StrictHostKeyChecking=yes`, no prompt): against the
//! operator's known_hosts, or the file `sshKnownHosts` names. An unknown or changed key is
//! refused in ssh's own words, and nothing is sent.

use crate::process::{read_lines_capped, AsyncGroupChild, GroupCommand};
use anyhow::{bail, Context as _, Result};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;

/// The most of ssh's stderr kept to explain a failed connection.
const STDERR_CAP: usize = 4096;

/// How long an ssh whose output ended has to exit (it is killed after).
const ENDING: std::time::Duration = std::time::Duration::from_secs(5);

/// How ssh logs in: the operator's runner options (`sshIdentity`, `sshKnownHosts`,
/// `sshConnectTimeout`). Paths are absolute files that exist, holding no `"` (it would end
/// the quoted value), `%` (ssh expands its tokens there) or control character.
#[derive(Debug, Clone)]
pub struct SshOptions {
    /// A private key to log in with, and no other (`IdentitiesOnly`).
    pub identity: Option<PathBuf>,
    /// The known_hosts file host keys are checked against; ssh's own files without it.
    pub known_hosts: Option<PathBuf>,
    /// Seconds ssh waits to connect.
    pub connect_timeout: u64,
}

impl SshOptions {
    /// Checks a path given for `option`: an existing file, made absolute, that ssh reads
    /// as it is.
    pub fn file(option: &str, value: &str) -> Result<PathBuf> {
        let path = std::fs::canonicalize(value)
            .ok()
            .filter(|p| p.is_file())
            .with_context(|| format!("--runner-option {option}={value}: no such file"))?;
        plain_path(&path).with_context(|| format!("--runner-option {option}={value}"))?;
        Ok(path)
    }
}

/// Refuses a path ssh would read as syntax in an option's quoted value: `"` would end it, `%`
/// starts one of its tokens, a control character ends the line.
fn plain_path(path: &Path) -> Result<()> {
    let text = path.to_string_lossy();
    if text.contains(['"', '%']) || text.chars().any(char::is_control) {
        bail!(
            "{text:?} holds `\"`, `%` or a control character, which ssh would read as syntax; \
             use a path without them"
        );
    }
    Ok(())
}

impl Default for SshOptions {
    fn default() -> Self {
        SshOptions {
            identity: None,
            known_hosts: None,
            connect_timeout: 30,
        }
    }
}

/// An `ssh://` endpoint, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SshEndpoint {
    pub user: Option<String>,
    pub host: String,
    pub port: Option<u16>,
}

impl SshEndpoint {
    /// Parses `ssh://[user@]host[:port]` as the docker CLI accepts it: no path, query or
    /// password, and (mst's own rule) nothing ssh could read as an option.
    pub fn parse(endpoint: &str) -> Result<Self> {
        let bad = |why: &str| {
            anyhow::anyhow!(
                "Docker endpoint {endpoint:?}: {why}; expected ssh://[user@]host[:port]"
            )
        };
        let rest = endpoint
            .strip_prefix("ssh://")
            .ok_or_else(|| bad("not an ssh:// endpoint"))?;
        if rest.contains(['/', '?', '#']) {
            return Err(bad("an ssh endpoint takes no path"));
        }
        let (user, address) = match rest.rsplit_once('@') {
            Some((user, address)) => (Some(user), address),
            None => (None, rest),
        };
        let (host, port) = match address.strip_prefix('[') {
            // [IPv6]:port
            Some(v6) => {
                let (host, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad("an unclosed [ in the host"))?;
                match after {
                    "" => (host, None),
                    _ => (
                        host,
                        Some(after.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
                    ),
                }
            }
            None => match address.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (address, None),
            },
        };
        let port = port
            .map(|p| {
                p.parse::<u16>()
                    .ok()
                    .filter(|p| *p > 0)
                    .ok_or_else(|| bad(&format!("port {p:?} is not a port number")))
            })
            .transpose()?;
        // Plain names only: a leading `-` would be an ssh option, and nothing here is a shell
        // word or an ssh_config token.
        let plain = |s: &str, extra: &str| {
            !s.is_empty()
                && !s.starts_with('-')
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c) || extra.contains(c))
        };
        if !plain(host, ":") {
            return Err(bad(&format!("{host:?} is not a host name or address")));
        }
        if let Some(user) = user {
            if user.contains(':') {
                return Err(bad("a password does not belong in the endpoint"));
            }
            if !plain(user, "") {
                return Err(bad(&format!("{user:?} is not a user name")));
            }
        }
        Ok(SshEndpoint {
            user: user.map(String::from),
            host: host.to_string(),
            port,
        })
    }

    /// `ssh`'s arguments that log in to the host, up to (not including) the destination.
    fn login_args(&self, options: &SshOptions) -> Vec<String> {
        let mut args = vec![
            "-T".to_string(),
            "-oBatchMode=yes".into(),
            "-oStrictHostKeyChecking=yes".into(),
            format!("-oConnectTimeout={}", options.connect_timeout),
            "-oServerAliveInterval=15".into(),
            "-oServerAliveCountMax=3".into(),
            "-oLogLevel=ERROR".into(),
        ];
        // Quoted: ssh splits an option's value at spaces ([`SshOptions`] refuses `"` and `%`).
        // The operator's file only: not the system's as well.
        if let Some(known) = &options.known_hosts {
            args.push(format!("-oUserKnownHostsFile=\"{}\"", known.display()));
            args.push("-oGlobalKnownHostsFile=/dev/null".into());
        }
        if let Some(identity) = &options.identity {
            args.push("-oIdentitiesOnly=yes".into());
            args.push(format!("-oIdentityFile=\"{}\"", identity.display()));
        }
        if let Some(port) = self.port {
            args.push(format!("-oPort={port}"));
        }
        if let Some(user) = &self.user {
            args.push(format!("-oUser={user}"));
        }
        args
    }

    /// `ssh`'s arguments for the master connection: logged in once, holding `control` (a
    /// socket) for the dials to share, running nothing.
    pub fn master_args(&self, options: &SshOptions, control: &Path) -> Vec<String> {
        let mut args = self.login_args(options);
        args.extend([
            "-M".to_string(),
            "-N".into(),
            "-oControlPersist=no".into(),
            format!("-oControlPath=\"{}\"", control.display()),
            "--".into(),
            self.host.clone(),
        ]);
        args
    }

    /// `ssh`'s arguments for one connection to the remote engine, a session of the master
    /// at `control` (or, should the master be gone, a login of its own).
    pub fn dial_args(&self, options: &SshOptions, control: &Path) -> Vec<String> {
        let mut args = self.login_args(options);
        args.push("-oControlMaster=no".into());
        args.push(format!("-oControlPath=\"{}\"", control.display()));
        args.extend(["--", &self.host, "docker", "system", "dial-stdio"].map(String::from));
        args
    }
}

/// A private unix socket whose every connection is piped to the remote engine through an ssh
/// of its own, a session of one master connection that logged in once (a login per
/// connection costs a key exchange: about 0.2 s here, for each of the dozens of API calls a
/// shard makes). Dropping it stops accepting, ends the master and removes the sockets.
pub struct SshTunnel {
    /// Holds the sockets, 0700.
    dir: tempfile::TempDir,
    accept: tokio::task::JoinHandle<()>,
    /// The master connection; killed when dropped.
    _master: AsyncGroupChild,
    /// What the last ssh that failed said on stderr.
    last_error: Arc<Mutex<Option<String>>>,
}

impl SshTunnel {
    /// Listens on a fresh private socket for `endpoint`; must be called inside a tokio runtime,
    /// which then serves it.
    pub async fn open(endpoint: &SshEndpoint, options: &SshOptions) -> Result<Self> {
        let owner = crate::owner::Owner::current();
        remove_stale_dirs(&owner);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-{}-", owner.pid, owner.started))
            .tempdir()
            .context("cannot make a directory for the ssh tunnel's socket")?;
        let control = dir.path().join("master");
        plain_path(&control).context("the ssh tunnel's directory ($TMPDIR)")?;
        let mut command = ssh_command(&endpoint.master_args(options, &control));
        command.command_mut().stdout(Stdio::null());
        let mut master = AsyncGroupChild::spawn(command).context("cannot run ssh")?;
        let (_, _, stderr) = master.take_pipes();
        let said = tokio::spawn(read_stderr(stderr));
        // Logged in once the master's control socket exists; an ssh that exits first (a host
        // key refused, a login denied) says why.
        let deadline = tokio::time::Instant::now()
            + std::time::Duration::from_secs(options.connect_timeout + 5);
        while !control.exists() {
            if let Some(status) = master.try_wait().context("waiting for ssh")? {
                let said = said.await.unwrap_or_default();
                bail!(
                    "ssh: {}",
                    match said.is_empty() {
                        true => format!("it exited ({status}) before logging in"),
                        false => said,
                    }
                );
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "ssh did not log in within {} s",
                    options.connect_timeout + 5
                );
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let path = dir.path().join("docker.sock");
        let listener = tokio::net::UnixListener::bind(&path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        let args = Arc::new(endpoint.dial_args(options, &control));
        let last_error = Arc::new(Mutex::new(None));
        let errors = last_error.clone();
        let accept = tokio::spawn(async move {
            while let Ok((connection, _)) = listener.accept().await {
                tokio::spawn(pipe(connection, args.clone(), errors.clone()));
            }
        });
        Ok(SshTunnel {
            dir,
            accept,
            _master: master,
            last_error,
        })
    }

    /// The endpoint bollard connects to.
    pub fn local_endpoint(&self) -> String {
        format!("unix://{}", self.dir.path().join("docker.sock").display())
    }

    /// What ssh said when a connection last failed, if one did.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().expect("ssh error").clone()
    }
}

impl Drop for SshTunnel {
    fn drop(&mut self) {
        self.accept.abort();
    }
}

/// Carries one connection's bytes through one `ssh … docker system dial-stdio`, until either
/// side closes.
async fn pipe(
    connection: tokio::net::UnixStream,
    args: Arc<Vec<String>>,
    last_error: Arc<Mutex<Option<String>>>,
) {
    let mut command = ssh_command(&args);
    command
        .command_mut()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped());
    let mut child = match AsyncGroupChild::spawn(command) {
        Ok(child) => child,
        Err(e) => {
            *last_error.lock().expect("ssh error") = Some(format!("cannot run ssh: {e}"));
            return;
        }
    };
    let (Some(mut stdin), Some(mut stdout), Some(stderr)) = child.take_pipes() else {
        return;
    };
    let (mut from_client, mut to_client) = connection.into_split();
    // Client to engine; the remote sees end of input once the client is done sending.
    let up = tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut stdin).await;
        let _ = stdin.shutdown().await;
    });
    let said = tokio::spawn(read_stderr(Some(stderr)));
    // Engine to client, until the engine (or ssh) is done.
    let _ = tokio::io::copy(&mut stdout, &mut to_client).await;
    up.abort();
    // Why ssh ended is recorded before the client hears the end, so that the error it then
    // reports can say it.
    let status = tokio::time::timeout(ENDING, child.wait()).await;
    let said = tokio::time::timeout(ENDING, said).await;
    if let (Ok(Some(status)), Ok(Ok(said))) = (status, said) {
        if !status.success() && !said.is_empty() {
            *last_error.lock().expect("ssh error") = Some(said);
        }
    }
    let _ = to_client.shutdown().await;
}

/// The start of a tunnel directory's name in `$TMPDIR`, followed by its mst's pid and start
/// time, so a later mst can tell whose it was.
const DIR_PREFIX: &str = "mst-docker-ssh-";

/// Removes the tunnel directories of mst processes of this machine that are gone: one that
/// exits without unwinding (a second Ctrl-C, SIGKILL) cannot remove its own, though its ssh
/// processes die with it.
fn remove_stale_dirs(here: &crate::owner::Owner) {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    let me = unsafe { libc::geteuid() };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(DIR_PREFIX) else {
            continue;
        };
        let mut parts = rest.splitn(3, '-');
        let (Some(Ok(pid)), Some(Ok(started))) = (
            parts.next().map(str::parse::<u32>),
            parts.next().map(str::parse::<u64>),
        ) else {
            continue;
        };
        let owner = crate::owner::Owner {
            pid,
            started,
            ..here.clone()
        };
        // Only a directory (never followed if a link), and only its owner's: another user's
        // is not ours to judge, and remove_dir_all refuses to cross what it cannot read.
        let own = entry
            .metadata()
            .is_ok_and(|m| m.is_dir() && std::os::unix::fs::MetadataExt::uid(&m) == me);
        if own && owner.is_gone(here) {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// An `ssh` with `args`, to start as an [`AsyncGroupChild`]: stdin null and stderr piped
/// unless set otherwise, with the operator's environment (their agent and ssh config). In a
/// process group of its own, a Ctrl-C at the terminal does not cut the connections the run
/// needs to stop its containers; it dies with the thread that started it (the run's, or its
/// runtime's), even when mst exits without dropping it (a second Ctrl-C, SIGKILL): a master
/// left logged in would hold the host for nothing.
fn ssh_command(args: &[String]) -> GroupCommand {
    let argv: Vec<String> = std::iter::once("ssh".to_string())
        .chain(args.iter().cloned())
        .collect();
    let mut command = GroupCommand::inheriting_env(&argv);
    command.die_with_parent();
    command
        .command_mut()
        .stdin(Stdio::null())
        .stderr(Stdio::piped());
    command
}

/// What an ssh said on stderr, up to [`STDERR_CAP`], read to its end (drained past the cap, so
/// ssh never blocks on a full pipe).
async fn read_stderr(stderr: Option<tokio::process::ChildStderr>) -> String {
    let Some(stderr) = stderr else {
        return String::new();
    };
    let mut lines = Vec::new();
    read_lines_capped(stderr, STDERR_CAP as u64, usize::MAX, |line| {
        lines.push(line);
        true
    })
    .await;
    // ssh ends its lines with \r\n.
    lines.join("\n").replace('\r', "").trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tunnel_directories_of_gone_processes_are_removed_and_live_ones_kept() {
        let here = crate::owner::Owner::current();
        let temp = std::env::temp_dir();
        let gone = temp.join(format!("{DIR_PREFIX}4194303-1-test"));
        let ours = temp.join(format!("{DIR_PREFIX}{}-{}-test", here.pid, here.started));
        for dir in [&gone, &ours] {
            std::fs::create_dir_all(dir.join("inside")).unwrap();
        }
        remove_stale_dirs(&here);
        assert!(!gone.exists(), "a gone process's directory is removed");
        assert!(ours.exists(), "a live one's is kept");
        std::fs::remove_dir_all(&ours).unwrap();
    }

    #[test]
    fn ssh_endpoints_parse_as_the_docker_cli_takes_them_and_nothing_becomes_an_option() {
        let parsed = SshEndpoint::parse("ssh://ci@build-1.example:2222").unwrap();
        assert_eq!(
            parsed,
            SshEndpoint {
                user: Some("ci".into()),
                host: "build-1.example".into(),
                port: Some(2222)
            }
        );
        assert_eq!(SshEndpoint::parse("ssh://[::1]:22").unwrap().host, "::1");
        assert_eq!(SshEndpoint::parse("ssh://h").unwrap().port, None);
        for (bad, why) in [
            ("ssh://h/var/run/docker.sock", "no path"),
            ("ssh://-oProxyCommand=x", "not a host"),
            ("ssh://-p@h", "not a user"),
            ("ssh://u:secret@h", "password"),
            ("ssh://h:0", "not a port"),
            ("ssh://h:x", "not a port"),
            ("ssh://", "not a host"),
            ("ssh://h;rm", "not a host"),
            ("ssh://h h", "not a host"),
            ("ssh://h:2375/", "no path"),
        ] {
            let err = SshEndpoint::parse(bad).unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
        let args = SshEndpoint::parse("ssh://ci@h:2222").unwrap().dial_args(
            &SshOptions {
                identity: Some("/k/id".into()),
                known_hosts: Some("/k/known".into()),
                connect_timeout: 5,
            },
            Path::new("/run/m"),
        );
        let tail: Vec<&str> = args
            .iter()
            .rev()
            .take(5)
            .rev()
            .map(String::as_str)
            .collect();
        assert_eq!(tail, ["--", "h", "docker", "system", "dial-stdio"]);
        for wanted in [
            "-oStrictHostKeyChecking=yes",
            "-oBatchMode=yes",
            "-oUserKnownHostsFile=\"/k/known\"",
            "-oIdentityFile=\"/k/id\"",
            "-oPort=2222",
            "-oUser=ci",
            "-oControlMaster=no",
            "-oControlPath=\"/run/m\"",
        ] {
            assert!(args.iter().any(|a| a == wanted), "{wanted}: {args:?}");
        }
    }
}
