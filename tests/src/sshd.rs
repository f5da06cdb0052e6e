//! Real OpenSSH servers on loopback for the `ssh` runner's tests: each [`Sshd`] is one "host"
//! with its own port, host key and config, accepting one client key made at test time.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// The account sessions log in as when it exists (`cargo xtask test` creates it as root): its
/// shell is `/bin/sh`, so no shell start-up file of the machine's own (root's `.bashrc` runs
/// `pyenv init` here, whose lock a killed session leaves behind, stalling every later login)
/// runs in the sessions the tests kill.
pub const TEST_USER: &str = "mst-ssh-test";

/// Keys and files shared by the servers: the client key and its known_hosts.
pub struct SshKeys {
    pub dir: tempfile::TempDir,
}

impl SshKeys {
    /// The client's private key.
    pub fn identity(&self) -> PathBuf {
        self.dir.path().join("client")
    }
    /// The known_hosts file listing every server started with these keys.
    pub fn known_hosts(&self) -> PathBuf {
        self.dir.path().join("known_hosts")
    }
}

/// One running `sshd`.
pub struct Sshd {
    pub port: u16,
    /// The account it lets the client key in as: [`TEST_USER`] when it exists, else the one
    /// running the tests.
    pub user: String,
    child: Option<Child>,
    config: PathBuf,
}

fn run(program: &str, args: &[&str]) {
    let status = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap_or_else(|e| panic!("{program}: {e}"));
    assert!(status.success(), "{program} {args:?} failed");
}

/// Whether sshd exists here; panics when it must (`MST_REQUIRE_SSHD=1`, set by
/// `cargo xtask test`) and does not.
pub fn available() -> bool {
    let present = Path::new(SSHD).is_file() && Path::new("/usr/bin/ssh").is_file();
    if !present && std::env::var_os("MST_REQUIRE_SSHD").is_some() {
        panic!(
            "MST_REQUIRE_SSHD is set but {SSHD} or ssh is missing (apt-get install openssh-server)"
        );
    }
    present
}

/// Makes the client key.
pub fn keys() -> SshKeys {
    let dir = tempfile::tempdir().unwrap();
    // The test account reads the authorized (public) key from here.
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let client = dir.path().join("client");
    run(
        "ssh-keygen",
        &["-q", "-t", "ed25519", "-N", "", "-f", crate::s(&client)],
    );
    std::fs::write(dir.path().join("known_hosts"), "").unwrap();
    SshKeys { dir }
}

impl Sshd {
    /// Starts an sshd on a free loopback port that accepts `keys`' client key, and adds its
    /// host key to `keys`' known_hosts.
    pub fn start(keys: &SshKeys, name: &str) -> Sshd {
        Self::start_with(keys, name, "")
    }

    /// [`Sshd::start`] with `extra` lines in its config (e.g. `SetEnv` for its sessions).
    pub fn start_with(keys: &SshKeys, name: &str, extra: &str) -> Sshd {
        let dir = keys.dir.path();
        let host_key = dir.join(format!("host-{name}"));
        run(
            "ssh-keygen",
            &["-q", "-t", "ed25519", "-N", "", "-f", crate::s(&host_key)],
        );
        // Privilege separation needs this directory (Debian's service would make it).
        std::fs::create_dir_all("/run/sshd").unwrap();
        let port = crate::free_port();
        let exists = |user: &str| {
            Command::new("id")
                .arg("-u")
                .arg(user)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let user = match exists(TEST_USER) {
            true => TEST_USER.to_string(),
            false => String::from_utf8(Command::new("id").arg("-un").output().unwrap().stdout)
                .unwrap()
                .trim()
                .to_string(),
        };
        let config = dir.join(format!("sshd-{name}.conf"));
        std::fs::write(
            &config,
            format!(
                "Port {port}\nListenAddress 127.0.0.1\nHostKey {}\nPidFile {}\n\
                 AuthorizedKeysFile {}\nAllowUsers {user}\nStrictModes no\nUsePAM no\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
                 PermitRootLogin prohibit-password\nMaxStartups 100\nMaxSessions 100\nLogLevel ERROR\n\
                 {extra}",
                crate::s(&host_key),
                crate::s(&dir.join(format!("sshd-{name}.pid"))),
                crate::s(&dir.join("client.pub")),
            ),
        )
        .unwrap();
        let public = std::fs::read_to_string(host_key.with_extension("pub")).unwrap();
        let mut known = std::fs::read_to_string(keys.known_hosts()).unwrap();
        let mut fields = public.split_whitespace();
        let (kind, key) = (fields.next().unwrap(), fields.next().unwrap());
        known.push_str(&format!("[127.0.0.1]:{port} {kind} {key}\n"));
        std::fs::write(keys.known_hosts(), known).unwrap();
        let mut sshd = Sshd {
            port,
            user: user.clone(),
            child: None,
            config,
        };
        sshd.restart();
        sshd
    }

    /// Starts (again) the server with its config and waits until it accepts connections.
    pub fn restart(&mut self) {
        let child = Command::new(SSHD)
            .args(["-D", "-e", "-f", crate::s(&self.config)])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("sshd starts");
        self.child = Some(child);
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "sshd on port {} never listened",
                self.port
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `host:port`, as run.json's machine descriptions name it.
    pub fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `user@host:port` for the runner's `hosts` option.
    pub fn destination(&self) -> String {
        format!("{}@{}", self.user, self.host())
    }

    /// Kills the server and every session it started: the host is gone.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let pid = child.id() as i32;
            let mut tree = vec![pid];
            let mut i = 0;
            while i < tree.len() {
                tree.extend(children(tree[i]));
                i += 1;
            }
            for pid in tree {
                // SAFETY: kill(2) on processes this test started (sshd and its sessions).
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
            }
            let _ = child.wait();
        }
    }
}

/// The pids whose parent is `pid`.
fn children(pid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // `pid (comm) state ppid …`: comm may hold spaces, so read after the last `)`.
        let ppid = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<i32>().ok());
        if ppid == Some(pid) {
            found.push(child);
        }
    }
    found
}

impl Drop for Sshd {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The ssh runner's arguments for `hosts` with the test's keys.
pub fn runner_args(plugin: &std::path::Path, keys: &SshKeys, hosts: &[&Sshd]) -> Vec<String> {
    let hosts: Vec<String> = hosts.iter().map(|h| h.destination()).collect();
    let mut args: Vec<String> = ["--plugin", crate::s(plugin), "--runner", "mst/runner/ssh"]
        .map(String::from)
        .to_vec();
    for option in [
        format!("hosts={}", hosts.join(",")),
        format!("identity={}", crate::s(&keys.identity())),
        format!("knownHosts={}", crate::s(&keys.known_hosts())),
    ] {
        args.extend(["--runner-option".to_string(), option]);
    }
    args.extend(["--allow-exec".to_string(), "ssh".to_string()]);
    args
}
