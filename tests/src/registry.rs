//! A real OCI distribution registry on loopback for the OCI tests: Debian's `docker-registry`
//! (the reference registry), started on a free port with its storage in a temp dir, with or
//! without an htpasswd login, and stopped when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const REGISTRY: &str = "/usr/bin/docker-registry";
const HTPASSWD: &str = "/usr/bin/htpasswd";

/// Whether the registry (and `htpasswd`, for the login) exist here; panics when they must
/// (`MST_REQUIRE_REGISTRY=1`, set by `cargo xtask test`) and do not.
pub fn available() -> bool {
    let present = Path::new(REGISTRY).is_file() && Path::new(HTPASSWD).is_file();
    if !present && std::env::var_os("MST_REQUIRE_REGISTRY").is_some() {
        panic!(
            "MST_REQUIRE_REGISTRY is set but {REGISTRY} or {HTPASSWD} is missing \
             (apt-get install docker-registry apache2-utils)"
        );
    }
    if !present {
        eprintln!("skipped: no {REGISTRY} (apt-get install docker-registry apache2-utils)");
    }
    present
}

/// An address of this machine that is not loopback (the one its route out would use), if any.
pub fn outside_address() -> Option<std::net::IpAddr> {
    // Connecting a UDP socket sends nothing; it only picks the route and so the source address.
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("192.0.2.1:9").ok()?;
    let ip = socket.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// One running registry.
pub struct Registry {
    /// `HOST:PORT`, `127.0.0.1:PORT` unless started with [`Registry::start_on`].
    pub addr: String,
    dir: tempfile::TempDir,
    child: Child,
}

impl Registry {
    /// A registry anyone may push to and pull from.
    pub fn start() -> Registry {
        Self::start_with("127.0.0.1", None)
    }

    /// A registry that wants HTTP basic auth as `user` with `password` (bcrypt in htpasswd).
    pub fn start_with_login(user: &str, password: &str) -> Registry {
        Self::start_with("127.0.0.1", Some((user, password)))
    }

    /// A plain-HTTP registry on `ip`, an address of this machine other than loopback.
    pub fn start_on(ip: std::net::IpAddr) -> Registry {
        Self::start_with(&ip.to_string(), None)
    }

    fn start_with(host: &str, login: Option<(&str, &str)>) -> Registry {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::free_port();
        let addr = format!("{host}:{port}");
        let storage = dir.path().join("storage");
        let mut config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n\
             http:\n  addr: {addr}\n",
            crate::s(&storage)
        );
        if let Some((user, password)) = login {
            let htpasswd = dir.path().join("htpasswd");
            // The password goes in on stdin, never in argv.
            let mut child = Command::new(HTPASSWD)
                .args(["-B", "-i", "-n", user])
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .unwrap();
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(password.as_bytes())
                .unwrap();
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "htpasswd failed");
            std::fs::write(&htpasswd, out.stdout).unwrap();
            config.push_str(&format!(
                "auth:\n  htpasswd:\n    realm: mst-test\n    path: {}\n",
                crate::s(&htpasswd)
            ));
        }
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY)
            .arg("serve")
            .arg(&config_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "docker-registry did not start"
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        Registry { addr, dir, child }
    }

    /// `oci://127.0.0.1:PORT/PATH`.
    pub fn reference(&self, path: &str) -> String {
        format!("oci://{}/{path}", self.addr)
    }

    /// Where the registry keeps its files.
    pub fn storage(&self) -> PathBuf {
        self.dir.path().join("storage")
    }

    /// The file holding blob `digest` (`sha256:…`) in the registry's storage.
    pub fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
        self.storage()
            .join("docker/registry/v2/blobs/sha256")
            .join(&hex[..2])
            .join(hex)
            .join("data")
    }

    /// What the registry logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
