//! The Docker runner's own options (`--runner-option key=value`), validated before anything
//! starts. `shards` and `keep` are the host's and never reach this module.
//!
//! The options are read with serde into [`Given`], one typed field per option: each field's
//! type says what it accepts (its `TryFrom<String>` or its variants), serde refuses an option
//! no field names, and [`OptionValue`] puts the option's name and value into every error.

use super::ssh::SshOptions;
use anyhow::Result;
use serde::de::{self, IntoDeserializer, Visitor};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// How containers share a Docker host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// As many containers as fit at the configured memory and CPUs.
    Shared,
    /// One container per host, for clients that need the whole host.
    Exclusive,
}

/// The container's root filesystem.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
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
    /// With `network=allow:HOST,…`: the hosts trials reach through the coordinator's egress
    /// proxy, over the shard protocol (the container's network is then `none`).
    pub egress: Option<crate::egress::Allowed>,
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
    /// The agent CLIs `setup` puts in the image (`agentClis=claude-code,codex`; `setup` only).
    pub agent_clis: Vec<String>,
    /// How ssh logs in to `ssh://` hosts.
    pub ssh: SshOptions,
    /// Whether any ssh option was given (refused when no host is an ssh one).
    pub ssh_set: bool,
}

/// The options the host takes before the runner sees them, first in the list of known ones.
const HOST_OPTIONS: [&str; 2] = ["shards", "keep"];

/// The options only `mst runner setup docker` takes.
const SETUP_OPTIONS: [&str; 2] = ["base", "agentClis"];

/// The default process limit: room for a build, not for a fork bomb.
pub const DEFAULT_PIDS: i64 = 4096;
/// The default open-file limit per process.
pub const DEFAULT_NOFILE: i64 = 16384;

impl DockerOptions {
    /// Parses and validates the options; `setup` also accepts `base` and `agentClis`.
    pub fn parse(options: &BTreeMap<String, String>, setup: bool) -> Result<Self> {
        // Taken out for `setup` only, so a run refuses them as options it lacks.
        let is_setup_only = |key: &str| setup && SETUP_OPTIONS.contains(&key);
        let setup_option = |key: &str| options.get(key).filter(|_| setup);
        let given = options
            .iter()
            .filter(|(key, _)| !is_setup_only(key))
            .map(|(key, value)| (key.as_str(), OptionValue { key, value }));
        let given = Given::deserialize(de::value::MapDeserializer::<_, OptionError>::new(given))
            .map_err(|error| error.explained(setup))?;
        let mut parsed = given.into_options(setup_option("base").cloned())?;
        parsed.agent_clis = setup_option("agentClis")
            .map(|list| {
                list.split(',')
                    .map(str::trim)
                    .filter(|name| !name.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(parsed)
    }
}

/// The options as given, each read as a type that accepts only what the option does. The
/// fields' order is the order messages list the known options in.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Given {
    contexts: Option<Contexts>,
    image: Option<Image>,
    memory: Option<Memory>,
    cpus: Option<Cpus>,
    ready_timeout: Option<ReadyTimeout>,
    network: Option<Network>,
    rootfs: Option<Rootfs>,
    pids: Option<Limit<16>>,
    nofile: Option<Limit<64>>,
    mode: Option<Mode>,
    worker: Option<Worker>,
    /// Checked by [`SshOptions::file`] once read, which names the option itself.
    ssh_identity: Option<String>,
    /// As `ssh_identity`.
    ssh_known_hosts: Option<String>,
    ssh_connect_timeout: Option<ConnectTimeout>,
}

impl Given {
    /// The options, the defaults filled in and the ssh files checked.
    fn into_options(self, base: Option<String>) -> Result<DockerOptions> {
        let mut ssh = SshOptions::default();
        let ssh_set = self.ssh_identity.is_some()
            || self.ssh_known_hosts.is_some()
            || self.ssh_connect_timeout.is_some();
        if let Some(path) = &self.ssh_identity {
            ssh.identity = Some(SshOptions::file("sshIdentity", path)?);
        }
        if let Some(path) = &self.ssh_known_hosts {
            ssh.known_hosts = Some(SshOptions::file("sshKnownHosts", path)?);
        }
        if let Some(ConnectTimeout(seconds)) = self.ssh_connect_timeout {
            ssh.connect_timeout = seconds;
        }
        Ok(DockerOptions {
            contexts: self.contexts.map_or_else(Vec::new, |c| c.0),
            image: self.image.map(|i| i.0),
            memory: self.memory.map(|m| m.0),
            cpus: self.cpus.map(|c| c.0),
            ready_timeout: self.ready_timeout.map_or(Duration::from_secs(60), |t| t.0),
            network: match &self.network {
                Some(Network::Named(name)) => name.clone(),
                _ => "none".into(),
            },
            egress: match self.network {
                Some(Network::Allow(allowed)) => Some(allowed),
                _ => None,
            },
            rootfs: self.rootfs.unwrap_or(Rootfs::ReadOnly),
            pids: self.pids.map_or(DEFAULT_PIDS, |l| l.0),
            nofile: self.nofile.map_or(DEFAULT_NOFILE, |l| l.0),
            mode: self.mode.unwrap_or(Mode::Shared),
            worker: self.worker.map(|w| w.0),
            base,
            agent_clis: Vec::new(),
            ssh,
            ssh_set,
        })
    }
}

/// `value` read as a `T` that `accepted` takes; `None` otherwise.
fn parsed<T: std::str::FromStr>(value: &str, accepted: impl Fn(&T) -> bool) -> Option<T> {
    value.parse::<T>().ok().filter(accepted)
}

/// `contexts`: Docker context names or endpoints, comma-separated.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct Contexts(Vec<String>);

impl TryFrom<String> for Contexts {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        let contexts: Vec<String> = value
            .split(',')
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .map(String::from)
            .collect();
        match contexts.is_empty() {
            true => Err("expected Docker context names or endpoints, comma-separated"),
            false => Ok(Self(contexts)),
        }
    }
}

/// `image`: an image name, kept as given.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct Image(String);

impl TryFrom<String> for Image {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.trim().is_empty() {
            true => Err("expected an image name"),
            false => Ok(Self(value)),
        }
    }
}

/// `memory`: a size in Docker's syntax, in bytes.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct Memory(u64);

impl TryFrom<String> for Memory {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        parse_bytes(&value)
            .map(Self)
            .ok_or("expected a size in Docker's syntax, e.g. 512m or 2g (at least 6m)")
    }
}

/// `cpus`: a number of CPUs, at least 0.01.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct Cpus(f64);

impl TryFrom<String> for Cpus {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        parse_cpus(&value)
            .map(Self)
            .ok_or("expected a number of CPUs, e.g. 1.5")
    }
}

/// A number of CPUs as Docker's `--cpus` takes it (`1.5`), at least 0.01; the local runner's
/// `cpus` too.
pub fn parse_cpus(text: &str) -> Option<f64> {
    parsed(text, |c: &f64| c.is_finite() && *c >= 0.01)
}

/// `readyTimeout`: seconds, more than none.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct ReadyTimeout(Duration);

impl TryFrom<String> for ReadyTimeout {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        let secs = parsed(&value, |s: &f64| s.is_finite() && *s > 0.0);
        secs.map(|secs| Self(Duration::from_secs_f64(secs)))
            .ok_or("expected seconds, e.g. 60")
    }
}

/// `network`: `bridge`, `none` or a user-defined network, never the host's or another
/// container's; or `allow:HOST,…`, egress by name through the coordinator.
#[derive(Deserialize)]
#[serde(try_from = "String")]
enum Network {
    Named(String),
    Allow(crate::egress::Allowed),
}

impl TryFrom<String> for Network {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        if let Some(list) = value.strip_prefix("allow:") {
            return crate::egress::Allowed::parse(list).map(Network::Allow);
        }
        if value == "host" || value.starts_with("container:") {
            return Err(
                "sharing the host's or another container's network is not allowed; use bridge, \
                 none, a user-defined network or allow:HOST,…"
                    .into(),
            );
        }
        match value.is_empty() {
            true => Err("expected bridge, none, a network name or allow:HOST,…".into()),
            false => Ok(Network::Named(value)),
        }
    }
}

/// `pids` and `nofile`: a whole number of at least `MIN` (fewer would not start the worker).
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct Limit<const MIN: i64>(i64);

impl<const MIN: i64> TryFrom<String> for Limit<MIN> {
    type Error = String;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        parsed(&value, |n: &i64| *n >= MIN)
            .map(Self)
            .ok_or_else(|| format!("expected a whole number ≥ {MIN}"))
    }
}

/// `worker`: an existing file.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct Worker(PathBuf);

impl TryFrom<String> for Worker {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        let path = PathBuf::from(value);
        match path.is_file() {
            true => Ok(Self(path)),
            false => Err("no such file"),
        }
    }
}

/// `sshConnectTimeout`: whole seconds from 1 to 600.
#[derive(Deserialize)]
#[serde(try_from = "String")]
struct ConnectTimeout(u64);

impl TryFrom<String> for ConnectTimeout {
    type Error = &'static str;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        parsed(&value, |s: &u64| (1..=600).contains(s))
            .map(Self)
            .ok_or("expected whole seconds from 1 to 600")
    }
}

/// One option's value: a string, read as its field's type. Every field of [`Given`] is an
/// `Option` (an option not given is `None`), so every value passes `deserialize_option`,
/// which names the option and the value in its error.
#[derive(Clone, Copy)]
struct OptionValue<'a> {
    key: &'a str,
    value: &'a str,
}

impl<'de> de::Deserializer<'de> for OptionValue<'_> {
    type Error = OptionError;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, OptionError> {
        visitor.visit_str(self.value)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, OptionError> {
        visitor
            .visit_some(self)
            .map_err(|error| error.named(self.key, self.value))
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, OptionError> {
        visitor.visit_enum(self.value.into_deserializer())
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct newtype_struct seq tuple tuple_struct map struct identifier ignored_any
    }
}

impl<'de> IntoDeserializer<'de, OptionError> for OptionValue<'_> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

/// Why reading the options stopped.
#[derive(Debug)]
enum OptionError {
    /// An option the runner does not take, and the options it does (serde's field names).
    Unknown {
        key: String,
        known: &'static [&'static str],
    },
    /// A value the option does not take: what the option expects.
    Invalid(String),
    /// The same, with the option and its value: `--runner-option key=value: what`.
    Refused(String),
}

impl OptionError {
    /// The error of option `key` given `value`.
    fn named(self, key: &str, value: &str) -> Self {
        match self {
            Self::Invalid(what) => Self::Refused(format!("--runner-option {key}={value}: {what}")),
            other => other,
        }
    }

    /// The error for people: an unknown option gets the list of known ones (`setup`'s own
    /// among them for `setup`, and a word on where they belong otherwise).
    fn explained(self, setup: bool) -> anyhow::Error {
        let Self::Unknown { key, known } = self else {
            return anyhow::anyhow!("{self}");
        };
        let setup_options = SETUP_OPTIONS.into_iter().filter(|_| setup);
        let known: Vec<&str> = HOST_OPTIONS
            .into_iter()
            .chain(known.iter().copied())
            .chain(setup_options)
            .collect();
        let hint = match SETUP_OPTIONS.contains(&key.as_str()) {
            true => format!(" (`{key}` is for `mst runner setup docker`)"),
            false => String::new(),
        };
        anyhow::anyhow!(
            "--runner-option {key}: the `docker` runner takes {}{hint}",
            known.join(", ")
        )
    }
}

impl std::fmt::Display for OptionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unknown { key, .. } => write!(f, "unknown option `{key}`"),
            Self::Invalid(message) | Self::Refused(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for OptionError {}

impl de::Error for OptionError {
    fn custom<T: std::fmt::Display>(what: T) -> Self {
        Self::Invalid(what.to_string())
    }

    fn unknown_field(key: &str, known: &'static [&'static str]) -> Self {
        Self::Unknown {
            key: key.to_string(),
            known,
        }
    }

    /// A word outside an enum's: the words it takes, as the other options say it.
    fn unknown_variant(_word: &str, expected: &'static [&'static str]) -> Self {
        Self::Invalid(format!("expected {}", expected.join(" or ")))
    }
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
            ("image", " ", "expected an image name"),
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

    #[test]
    fn refusals_name_the_option_and_what_it_takes() {
        let known = "shards, keep, contexts, image, memory, cpus, readyTimeout, network, \
                     rootfs, pids, nofile, mode, worker, sshIdentity, sshKnownHosts, \
                     sshConnectTimeout";
        let unknown = |setup| {
            let err = DockerOptions::parse(&opts(&[("colour", "red")]), setup).unwrap_err();
            format!("{err:#}")
        };
        let takes = "--runner-option colour: the `docker` runner takes";
        assert_eq!(unknown(false), format!("{takes} {known}"));
        assert_eq!(unknown(true), format!("{takes} {known}, base, agentClis"));
        let err = DockerOptions::parse(&opts(&[("base", "debian")]), false).unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            format!(
                "--runner-option base: the `docker` runner takes {known} \
                 (`base` is for `mst runner setup docker`)"
            )
        );
        let clis = opts(&[("agentClis", "codex, claude-code")]);
        assert!(DockerOptions::parse(&clis, false).is_err(), "setup only");
        let parsed = DockerOptions::parse(&clis, true).unwrap();
        assert_eq!(parsed.agent_clis, ["codex", "claude-code"]);
        // The option whose value is wrong is the one named, whatever comes after it.
        let err = DockerOptions::parse(&opts(&[("cpus", "0"), ("mode", "solo")]), false);
        assert_eq!(
            format!("{:#}", err.unwrap_err()),
            "--runner-option cpus=0: expected a number of CPUs, e.g. 1.5"
        );
        let err = DockerOptions::parse(&opts(&[("mode", "solo")]), false).unwrap_err();
        assert_eq!(
            format!("{err:#}"),
            "--runner-option mode=solo: expected shared or exclusive"
        );
    }
}
