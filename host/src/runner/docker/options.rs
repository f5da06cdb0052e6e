//! The Docker runner's own options (`--runner-option key=value`), validated before anything
//! starts. `shards` and `keep` are the host's and never reach this module.

use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How containers share a Docker host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// As many containers as fit at the configured memory and CPUs.
    Shared,
    /// One container per host, for clients that need the whole host.
    Exclusive,
}

/// The container's root filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rootfs {
    /// Read-only, with a writable work directory and `/tmp` (the default): a trial cannot
    /// change the image's programs, the worker included, for the trials after it.
    ReadOnly,
    /// Writable, for clients that write outside the work directory and `/tmp`.
    Writable,
}

/// Everything `--runner docker` accepts besides `shards` and `keep`.
#[derive(Debug, Clone)]
pub struct DockerOptions {
    /// Docker hosts by context name or endpoint; empty means the current context.
    pub contexts: Vec<String>,
    /// The image each shard runs; `None` means `mst-worker:<version>`.
    pub image: Option<String>,
    /// Each container's memory limit in bytes.
    pub memory: Option<u64>,
    /// Each container's CPUs.
    pub cpus: Option<f64>,
    /// How long a new container has to be running and reachable.
    pub ready_timeout: Duration,
    /// The container network, so its egress: `none` (default: the worker needs none), `bridge`,
    /// or a user-defined network (docs/adr/0007-container-egress.md).
    pub network: String,
    /// Read-only (default) or writable root filesystem.
    pub rootfs: Rootfs,
    /// The most processes the container may run.
    pub pids: i64,
    /// The most open files per process (soft and hard `nofile`).
    pub nofile: i64,
    /// Shared or exclusive hosts.
    pub mode: Mode,
    /// A static mst binary to place into images that have none.
    pub worker: Option<PathBuf>,
    /// The image `mst runner setup docker` builds on (`setup` only).
    pub base: Option<String>,
    /// How ssh logs in to `ssh://` hosts.
    pub ssh: super::ssh::SshOptions,
    /// Whether any ssh option was given (refused when no host is an ssh one).
    pub ssh_set: bool,
}

/// The option names, for error messages.
const KNOWN: &str = "shards, keep, contexts, image, memory, cpus, readyTimeout, network, rootfs, \
                     pids, nofile, mode, worker, sshIdentity, sshKnownHosts, sshConnectTimeout";

/// The default process limit: room for a build, not for a fork bomb.
pub const DEFAULT_PIDS: i64 = 4096;
/// The default open-file limit per process.
pub const DEFAULT_NOFILE: i64 = 16384;

impl DockerOptions {
    /// Parses and validates the options; `setup` also accepts `base`.
    pub fn parse(options: &BTreeMap<String, String>, setup: bool) -> Result<Self> {
        let mut parsed = DockerOptions {
            contexts: Vec::new(),
            image: None,
            memory: None,
            cpus: None,
            ready_timeout: Duration::from_secs(60),
            network: "none".into(),
            rootfs: Rootfs::ReadOnly,
            pids: DEFAULT_PIDS,
            nofile: DEFAULT_NOFILE,
            mode: Mode::Shared,
            worker: None,
            base: None,
            ssh: super::ssh::SshOptions::default(),
            ssh_set: false,
        };
        for (key, value) in options {
            let bad = |what: &str| anyhow::anyhow!("--runner-option {key}={value}: {what}");
            match key.as_str() {
                "contexts" => {
                    parsed.contexts = value
                        .split(',')
                        .map(str::trim)
                        .filter(|c| !c.is_empty())
                        .map(String::from)
                        .collect();
                    if parsed.contexts.is_empty() {
                        return Err(bad(
                            "expected Docker context names or endpoints, comma-separated",
                        ));
                    }
                }
                "image" if !value.trim().is_empty() => parsed.image = Some(value.clone()),
                "sshIdentity" | "sshKnownHosts" => {
                    let path = super::ssh::SshOptions::file(key, value)?;
                    match key.as_str() {
                        "sshIdentity" => parsed.ssh.identity = Some(path),
                        _ => parsed.ssh.known_hosts = Some(path),
                    }
                    parsed.ssh_set = true;
                }
                "sshConnectTimeout" => {
                    parsed.ssh.connect_timeout = value
                        .parse::<u64>()
                        .ok()
                        .filter(|s| (1..=600).contains(s))
                        .ok_or_else(|| bad("expected whole seconds from 1 to 600"))?;
                    parsed.ssh_set = true;
                }
                "memory" => {
                    parsed.memory = Some(parse_bytes(value).ok_or_else(|| {
                        bad("expected a size in Docker's syntax, e.g. 512m or 2g (at least 6m)")
                    })?)
                }
                "cpus" => {
                    parsed.cpus = Some(
                        value
                            .parse::<f64>()
                            .ok()
                            .filter(|c| c.is_finite() && *c >= 0.01)
                            .ok_or_else(|| bad("expected a number of CPUs, e.g. 1.5"))?,
                    )
                }
                "readyTimeout" => {
                    let secs = value
                        .parse::<f64>()
                        .ok()
                        .filter(|s| s.is_finite() && *s > 0.0)
                        .ok_or_else(|| bad("expected seconds, e.g. 60"))?;
                    parsed.ready_timeout = Duration::from_secs_f64(secs);
                }
                "network" => {
                    if value == "host" || value.starts_with("container:") {
                        return Err(bad(
                            "sharing the host's or another container's network is not allowed; \
                             use bridge, none or a user-defined network",
                        ));
                    }
                    if value.is_empty() {
                        return Err(bad("expected bridge, none or a network name"));
                    }
                    parsed.network = value.clone();
                }
                "rootfs" => {
                    parsed.rootfs = match value.as_str() {
                        "readonly" => Rootfs::ReadOnly,
                        "writable" => Rootfs::Writable,
                        _ => return Err(bad("expected readonly or writable")),
                    }
                }
                "pids" => {
                    parsed.pids =
                        limit(value, 16).ok_or_else(|| bad("expected a whole number ≥ 16"))?
                }
                "nofile" => {
                    parsed.nofile =
                        limit(value, 64).ok_or_else(|| bad("expected a whole number ≥ 64"))?
                }
                "mode" => {
                    parsed.mode = match value.as_str() {
                        "shared" => Mode::Shared,
                        "exclusive" => Mode::Exclusive,
                        _ => return Err(bad("expected shared or exclusive")),
                    }
                }
                "worker" => {
                    let path = PathBuf::from(value);
                    if !path.is_file() {
                        return Err(bad("no such file"));
                    }
                    parsed.worker = Some(path);
                }
                "base" if setup => parsed.base = Some(value.clone()),
                _ => {
                    let known = if setup {
                        format!("{KNOWN}, base")
                    } else {
                        KNOWN.to_string()
                    };
                    bail!(
                        "--runner-option {key}: the `docker` runner takes {known}{}",
                        if key == "base" {
                            " (`base` is for `mst runner setup docker`)"
                        } else {
                            ""
                        }
                    )
                }
            }
        }
        Ok(parsed)
    }
}

/// A whole-number limit of at least `min` (fewer would not start the worker).
fn limit(text: &str, min: i64) -> Option<i64> {
    text.parse::<i64>().ok().filter(|n| *n >= min)
}

/// A size in Docker's syntax (`512m`, `2g`, `1.5g`, `1048576`), in bytes; at least 6 MiB,
/// Docker's own minimum.
pub fn parse_bytes(text: &str) -> Option<u64> {
    let text = text.trim().to_ascii_lowercase();
    let text = text.strip_suffix('b').unwrap_or(&text);
    let (number, unit) = match text.char_indices().last()? {
        (i, c @ ('k' | 'm' | 'g' | 't')) => (&text[..i], c),
        _ => (text, ' '),
    };
    let scale: u64 = match unit {
        'k' => 1 << 10,
        'm' => 1 << 20,
        'g' => 1 << 30,
        't' => 1 << 40,
        _ => 1,
    };
    let value: f64 = number
        .parse()
        .ok()
        .filter(|v: &f64| v.is_finite() && *v > 0.0)?;
    let bytes = (value * scale as f64) as u64;
    (bytes >= 6 << 20).then_some(bytes)
}

/// Bytes as GiB with one decimal, for messages.
pub fn gib(bytes: u64) -> String {
    format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// Bytes as MiB, for messages about small limits.
pub fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn sizes_follow_dockers_syntax() {
        assert_eq!(parse_bytes("512m"), Some(512 << 20));
        assert_eq!(parse_bytes("2g"), Some(2 << 30));
        assert_eq!(parse_bytes("1.5G"), Some(3 << 29));
        assert_eq!(parse_bytes("8388608"), Some(8 << 20));
        assert_eq!(parse_bytes("1m"), None, "below Docker's minimum");
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes("-2g"), None);
    }

    #[test]
    fn options_are_checked_before_anything_starts() {
        let parsed = DockerOptions::parse(
            &opts(&[
                ("contexts", "a, unix:///tmp/x.sock"),
                ("memory", "1g"),
                ("cpus", "1.5"),
                ("mode", "exclusive"),
                ("readyTimeout", "5"),
            ]),
            false,
        )
        .unwrap();
        assert_eq!(parsed.contexts, ["a", "unix:///tmp/x.sock"]);
        assert_eq!(parsed.memory, Some(1 << 30));
        assert_eq!(parsed.mode, Mode::Exclusive);
        assert_eq!(parsed.ready_timeout, Duration::from_secs(5));
        for (key, value, says) in [
            ("memory", "huge", "Docker's syntax"),
            ("cpus", "0", "number of CPUs"),
            ("network", "host", "not allowed"),
            ("rootfs", "rw", "readonly or writable"),
            ("pids", "8", "≥ 16"),
            ("nofile", "many", "≥ 64"),
            ("mode", "solo", "shared or exclusive"),
            ("contexts", ",", "comma-separated"),
            ("worker", "/no/such/mst", "no such file"),
            ("sshIdentity", "/no/such/key", "no such file"),
            ("sshKnownHosts", "/etc/ssh/%u_known", "no such file"),
            ("sshConnectTimeout", "0", "whole seconds"),
            ("colour", "red", "takes shards, keep"),
            ("base", "debian", "for `mst runner setup docker`"),
        ] {
            let err = DockerOptions::parse(&opts(&[(key, value)]), false).unwrap_err();
            assert!(err.to_string().contains(says), "{key}={value}: {err}");
            assert!(err.to_string().contains(key), "{err}");
        }
        assert!(DockerOptions::parse(&opts(&[("base", "debian")]), true).is_ok());
        // A file whose path ssh would read as syntax (once resolved, links followed).
        let dir = tempfile::tempdir().unwrap();
        for name in ["%u_known", "quo\"te"] {
            let file = dir.path().join(name);
            std::fs::write(&file, "").unwrap();
            let err =
                DockerOptions::parse(&opts(&[("sshKnownHosts", &file.to_string_lossy())]), false)
                    .unwrap_err();
            assert!(
                format!("{err:#}").contains("ssh would read as syntax"),
                "{err:#}"
            );
            let link = dir.path().join("plain");
            std::os::unix::fs::symlink(&file, &link).unwrap();
            let err =
                DockerOptions::parse(&opts(&[("sshKnownHosts", &link.to_string_lossy())]), false)
                    .unwrap_err();
            assert!(
                format!("{err:#}").contains("ssh would read as syntax"),
                "{err:#}"
            );
            std::fs::remove_file(&link).unwrap();
        }
        let ssh = DockerOptions::parse(&opts(&[("sshKnownHosts", "/etc/hostname")]), false);
        assert_eq!(
            ssh.unwrap().ssh.known_hosts.as_deref(),
            Some(std::path::Path::new("/etc/hostname"))
        );
        // Safe by default: no network, a read-only root, bounded processes and files.
        let defaults = DockerOptions::parse(&opts(&[]), false).unwrap();
        assert_eq!(defaults.network, "none");
        assert_eq!(defaults.rootfs, Rootfs::ReadOnly);
        assert_eq!(
            (defaults.pids, defaults.nofile),
            (DEFAULT_PIDS, DEFAULT_NOFILE)
        );
    }
}
