//! Two real Docker engines for the end-to-end tests, each with its own socket, data root,
//! exec root and bridge, acting as two Docker hosts; and a test image imported offline (no
//! registry) from Debian's busybox-static. Started by `cargo xtask test`, stopped when it ends.
//!
//! Set `MST_TEST_DOCKER_A` and `MST_TEST_DOCKER_B` to endpoints to use engines of your own.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The image the tests build `mst-worker` from.
pub const TEST_IMAGE: &str = "mst-test-busybox:1";

/// Programs the test image links to busybox.
const APPLETS: &[&str] = &[
    "sh", "cat", "echo", "sleep", "head", "tr", "dd", "ls", "mkdir", "mkfifo", "ln", "rm",
    "printf", "seq", "true", "false", "env", "wc", "sort", "yes",
];

/// Running engines; dropping this stops the ones it started.
pub struct Engines {
    started: Vec<(Child, PathBuf)>,
    /// Endpoints, for `MST_TEST_DOCKER_A` and `_B`.
    pub endpoints: Vec<String>,
}

impl Drop for Engines {
    fn drop(&mut self) {
        for (child, _) in &mut self.started {
            // SIGTERM lets dockerd stop its containers and containerd cleanly.
            // SAFETY: kill(2) on a child this process started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
        for (child, log) in &mut self.started {
            let deadline = Instant::now() + Duration::from_secs(30);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Ok(None) = child.try_wait() {
                eprintln!(
                    "xtask: dockerd did not stop in 30 s (log: {})",
                    log.display()
                );
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

fn have(program: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Installs the Debian packages of `needs` (program or file, package) that are missing.
pub fn ensure_packages(needs: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = needs
        .iter()
        .filter(|(what, _)| {
            if what.starts_with('/') {
                !Path::new(what).exists()
            } else {
                !have(what)
            }
        })
        .map(|(_, package)| *package)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    eprintln!("xtask: installing {}", missing.join(" "));
    let install = |update: bool| {
        if update {
            let _ = Command::new("apt-get").args(["update", "-q"]).status();
        }
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    // Package lists may be stale on a fresh machine: update once and retry.
    if !install(false) && !install(true) {
        bail!(
            "cannot install {} from Debian's packages: run as root, or install them yourself \
             (the Docker tests also take engines of your own in MST_TEST_DOCKER_A and _B)",
            missing.join(" ")
        );
    }
    Ok(())
}

/// Starts (or finds) the two engines and imports the test image into each.
pub fn start(root: &Path) -> Result<Engines> {
    if let (Ok(a), Ok(b)) = (
        std::env::var("MST_TEST_DOCKER_A"),
        std::env::var("MST_TEST_DOCKER_B"),
    ) {
        let engines = Engines {
            started: Vec::new(),
            endpoints: vec![a, b],
        };
        import_test_image(&engines)?;
        return Ok(engines);
    }
    ensure_packages(&[
        ("dockerd", "docker.io"),
        ("/bin/busybox", "busybox-static"),
        ("ip", "iproute2"),
    ])?;
    // Sockets live under /run: a socket path must stay under 108 bytes wherever the clone is.
    let run = Path::new("/run/mst-test-docker");
    let data = root.join("target/docker");
    let mut engines = Engines {
        started: Vec::new(),
        endpoints: Vec::new(),
    };
    for (name, subnet) in [("a", "172.30.0.1/24"), ("b", "172.31.0.1/24")] {
        let bridge = format!("mst-test-{name}");
        // Each engine gets its own bridge and leaves iptables alone, so two can share a host.
        let exists = Command::new("ip")
            .args(["link", "show", &bridge])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !exists {
            crate::run(Command::new("ip").args(["link", "add", &bridge, "type", "bridge"]))?;
            crate::run(Command::new("ip").args(["addr", "add", subnet, "dev", &bridge]))?;
        }
        crate::run(Command::new("ip").args(["link", "set", &bridge, "up"]))?;
        let exec_root = run.join(name);
        std::fs::create_dir_all(&exec_root)?;
        std::fs::create_dir_all(data.join(name))?;
        let socket = run.join(format!("{name}.sock"));
        let log_path = data.join(format!("{name}.log"));
        let log = std::fs::File::create(&log_path)?;
        let child = Command::new("dockerd")
            .arg("--host")
            .arg(format!("unix://{}", socket.display()))
            .arg("--data-root")
            .arg(data.join(name))
            .arg("--exec-root")
            .arg(&exec_root)
            .arg("--pidfile")
            .arg(exec_root.join("dockerd.pid"))
            .args(["--bridge", &bridge, "--iptables=false", "--ip-masq=false"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("starting dockerd")?;
        engines.started.push((child, log_path.clone()));
        let endpoint = format!("unix://{}", socket.display());
        wait_ready(&endpoint, &log_path)?;
        engines.endpoints.push(endpoint);
    }
    import_test_image(&engines)?;
    Ok(engines)
}

fn docker(endpoint: &str) -> Command {
    let mut command = Command::new("docker");
    command.args(["--host", endpoint]);
    command
}

fn wait_ready(endpoint: &str, log: &Path) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let ok = docker(endpoint)
            .args(["version", "--format", "{{.Server.Version}}"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    bail!(
        "dockerd at {endpoint} did not come up in 60 s; see {}",
        log.display()
    )
}

/// Imports [`TEST_IMAGE`] (busybox and its applets) into each engine, offline.
fn import_test_image(engines: &Engines) -> Result<()> {
    let rootfs = crate::tempfile_dir("mst-test-rootfs")?;
    for dir in ["bin", "tmp", "etc"] {
        std::fs::create_dir_all(rootfs.join(dir))?;
    }
    std::fs::copy("/bin/busybox", rootfs.join("bin/busybox"))
        .context("/bin/busybox (Debian's busybox-static)")?;
    for applet in APPLETS {
        std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet))?;
    }
    std::fs::write(rootfs.join("etc/passwd"), "root:x:0:0:root:/:/bin/sh\n")?;
    for endpoint in &engines.endpoints {
        let tar = Command::new("tar")
            .arg("-C")
            .arg(&rootfs)
            .args(["-c", "."])
            .stdout(Stdio::piped())
            .spawn()?;
        crate::run(
            docker(endpoint)
                .args(["import", "--change", "ENV PATH=/bin", "-", TEST_IMAGE])
                .stdin(tar.stdout.context("tar stdout")?),
        )?;
    }
    std::fs::remove_dir_all(&rootfs)?;
    Ok(())
}
