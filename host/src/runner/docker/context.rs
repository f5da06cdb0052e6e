//! Docker hosts: resolving a context name or endpoint the way the docker CLI does, connecting
//! with bollard, and sizing each host from `docker info`.

use super::options::{gib, DockerOptions, Mode};
use super::ssh::{SshEndpoint, SshOptions, SshTunnel};
use anyhow::{bail, Context as _, Result};
use bollard::Docker;
use sha2::{Digest, Sha256};
use std::path::PathBuf;

/// Seconds bollard waits for one API call.
const API_TIMEOUT_SECS: u64 = 600;

/// One Docker host a run may use.
pub struct DockerContext {
    /// As the user named it (`default`, `hostB`, `unix:///…`).
    pub name: String,
    /// The endpoint it resolved to.
    pub endpoint: String,
    /// The connected client.
    pub docker: Docker,
    /// Total memory and CPUs, from `docker info`.
    pub memory_total: u64,
    pub cpus_total: f64,
    /// How many containers run on it at a time, and each one's limits.
    pub slots: usize,
    pub memory_each: u64,
    pub cpus_each: Option<f64>,
    /// For an `ssh://` host: the tunnel the client speaks through, open as long as this is.
    pub tunnel: Option<SshTunnel>,
}

impl DockerContext {
    /// One line saying what was decided for this host.
    pub fn describe(&self, mode: Mode) -> String {
        format!(
            "docker context `{}` ({}) has {} and {} CPUs: {} container{} at a time, {} each{}{}",
            self.name,
            self.endpoint,
            gib(self.memory_total),
            self.cpus_total,
            self.slots,
            if self.slots == 1 { "" } else { "s" },
            gib(self.memory_each),
            self.cpus_each
                .map(|c| format!(" and {c} CPUs"))
                .unwrap_or_default(),
            if mode == Mode::Exclusive {
                " (exclusive)"
            } else {
                ""
            }
        )
    }
}

/// The docker CLI's configuration directory.
fn docker_config_dir() -> Option<PathBuf> {
    std::env::var_os("DOCKER_CONFIG")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".docker")))
}

/// Refuses an endpoint mst cannot connect over (`npipe://`, `fd://`, a malformed `ssh://`).
fn check_scheme(name: &str, endpoint: &str) -> Result<()> {
    if endpoint.starts_with("ssh://") {
        return SshEndpoint::parse(endpoint)
            .map(drop)
            .with_context(|| format!("docker context `{name}`"));
    }
    if !["unix://", "tcp://", "http://"]
        .iter()
        .any(|scheme| endpoint.starts_with(scheme))
    {
        bail!(
            "Docker endpoint {endpoint:?} (`{name}`): mst connects over unix://, tcp://, http:// \
             or ssh://"
        );
    }
    Ok(())
}

/// The endpoint of a context name or endpoint, as the docker CLI would resolve it.
pub fn resolve_endpoint(name: &str) -> Result<String> {
    if name.contains("://") {
        check_scheme(name, name)?;
        return Ok(name.to_string());
    }
    if name == "default" {
        return Ok(std::env::var("DOCKER_HOST")
            .ok()
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "unix:///var/run/docker.sock".into()));
    }
    let dir = docker_config_dir().context("cannot find the docker configuration directory")?;
    let meta = dir
        .join("contexts/meta")
        .join(hex::encode(Sha256::digest(name.as_bytes())))
        .join("meta.json");
    let text = std::fs::read_to_string(&meta).map_err(|_| {
        anyhow::anyhow!(
            "no Docker context `{name}` (looked for {}); `docker context ls` lists them, or give \
             an endpoint such as unix:///var/run/docker.sock",
            meta.display()
        )
    })?;
    let value: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", meta.display()))?;
    let endpoint = value["Endpoints"]["docker"]["Host"]
        .as_str()
        .map(String::from)
        .with_context(|| format!("{}: Endpoints.docker.Host is missing", meta.display()))?;
    check_scheme(name, &endpoint)?;
    Ok(endpoint)
}

/// The one endpoint a runner plugin's container spec may use, from its `context`: a docker
/// context name (as `docker context create` allows) or a `unix://` socket path, and only one
/// that is, or resolves to, a local socket. The bundle and tokens go wherever it points, so a
/// plugin never reaches a network engine: not by naming one in any spelling (`tcp://`,
/// `HTTP://`, `ssh://`), not by smuggling one after a comma or whitespace, and not through a
/// context or `DOCKER_HOST` that points at one.
pub fn spec_endpoint(context: &str) -> Result<String> {
    let refuse = |why: &str| {
        anyhow::anyhow!(
            "its container spec names the Docker context {context:?}, {why}: a runner plugin may \
             name one docker context you configured that points at a unix:// socket, or one \
             unix:// socket: not a network address (leave the spec's context unset to use \
             your current context)"
        )
    };
    let socket = |path: &str| {
        path.starts_with('/')
            && !path.contains("//")
            && path
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
    };
    let name = |name: &str| {
        // The docker CLI's rule for context names.
        name.chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphanumeric())
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_.+-".contains(c))
    };
    match context.strip_prefix("unix://") {
        Some(path) if socket(path) => return Ok(context.to_string()),
        Some(_) => return Err(refuse("which is not a single plain socket path")),
        None if !name(context) => {
            return Err(refuse(
                "which is neither a context name nor a unix:// socket",
            ))
        }
        None => {}
    }
    let endpoint = resolve_endpoint(context)?;
    match endpoint.strip_prefix("unix://") {
        Some(path) if socket(path) => Ok(endpoint),
        _ => Err(refuse(&format!("which points at {endpoint:?}"))),
    }
}

/// The context the docker CLI would use now: `DOCKER_HOST`, `DOCKER_CONTEXT`, the config's
/// `currentContext`, else `default`.
pub fn current_context() -> String {
    // As the docker CLI: DOCKER_HOST wins over any context.
    if std::env::var("DOCKER_HOST").is_ok_and(|h| !h.is_empty()) {
        return "default".into();
    }
    if let Ok(context) = std::env::var("DOCKER_CONTEXT") {
        if !context.is_empty() {
            return context;
        }
    }
    docker_config_dir()
        .and_then(|d| std::fs::read_to_string(d.join("config.json")).ok())
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["currentContext"].as_str().map(String::from))
        .unwrap_or_else(|| "default".into())
}

/// Connects to `endpoint` and agrees on an API version with the engine; an `ssh://` endpoint
/// through a tunnel of its own ([`SshTunnel`]), returned to be kept open with the client.
pub async fn connect(
    name: &str,
    endpoint: &str,
    ssh: &SshOptions,
) -> Result<(Docker, Option<SshTunnel>)> {
    let tunnel = match endpoint.starts_with("ssh://") {
        true => Some(
            SshTunnel::open(&SshEndpoint::parse(endpoint)?, ssh)
                .await
                .with_context(|| format!("docker context `{name}` ({endpoint}) does not answer"))?,
        ),
        false => None,
    };
    let local = tunnel.as_ref().map(SshTunnel::local_endpoint);
    let reach = local.as_deref().unwrap_or(endpoint);
    let docker = if let Some(path) = reach.strip_prefix("unix://") {
        Docker::connect_with_unix(path, API_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
    } else {
        Docker::connect_with_http(reach, API_TIMEOUT_SECS, bollard::API_DEFAULT_VERSION)
    }
    .with_context(|| format!("docker context `{name}` ({endpoint})"))?;
    match docker.negotiate_version().await {
        Ok(docker) => Ok((docker, tunnel)),
        Err(e) => {
            // Over ssh, what ssh said (a host key refused, a login denied) is the reason; the
            // HTTP error is only that the connection closed.
            let said = tunnel.as_ref().and_then(SshTunnel::last_error);
            let e = match said {
                Some(said) => anyhow::anyhow!("ssh: {said}"),
                None => anyhow::Error::from(e),
            };
            Err(e.context(format!(
                "docker context `{name}` ({endpoint}) does not answer"
            )))
        }
    }
}

/// Connects to each named context (or the current one) and sizes it for `options`.
pub async fn open_all(options: &DockerOptions) -> Result<Vec<DockerContext>> {
    let names = if options.contexts.is_empty() {
        vec![current_context()]
    } else {
        options.contexts.clone()
    };
    let mut contexts = Vec::new();
    for name in names {
        let endpoint = resolve_endpoint(&name)?;
        let (docker, tunnel) = connect(&name, &endpoint, &options.ssh).await?;
        let info = docker
            .info()
            .await
            .with_context(|| format!("docker info on context `{name}`"))?;
        let memory_total = info.mem_total.unwrap_or(0).max(0) as u64;
        let cpus_total = info.ncpu.unwrap_or(1).max(1) as f64;
        let (slots, memory_each) = capacity(memory_total, cpus_total, options)
            .with_context(|| format!("docker context `{name}`"))?;
        contexts.push(DockerContext {
            name,
            endpoint,
            docker,
            memory_total,
            cpus_total,
            slots,
            memory_each,
            cpus_each: options.cpus,
            tunnel,
        });
    }
    if options.ssh_set && contexts.iter().all(|c| c.tunnel.is_none()) {
        bail!(
            "--runner-option sshIdentity, sshKnownHosts and sshConnectTimeout are for ssh:// \
             hosts, and no context in this run is one"
        );
    }
    Ok(contexts)
}

/// What a host can spare for containers: its memory less 1 GiB for Docker itself, or half of it
/// on a host under 2 GiB.
fn spare(memory_total: u64) -> u64 {
    if memory_total < 2 << 30 {
        memory_total / 2
    } else {
        memory_total - (1 << 30)
    }
}

/// How many containers fit on a host, and each one's memory.
fn capacity(memory_total: u64, cpus_total: f64, options: &DockerOptions) -> Result<(usize, u64)> {
    if let Some(cpus) = options.cpus {
        if cpus > cpus_total {
            bail!("--runner-option cpus={cpus}: the host has {cpus_total} CPUs");
        }
    }
    let spare = spare(memory_total);
    if let Some(memory) = options.memory {
        if memory > spare {
            bail!(
                "--runner-option memory: {} is more than the host can spare ({} of {})",
                gib(memory),
                gib(spare),
                gib(memory_total)
            );
        }
    }
    Ok(match options.mode {
        Mode::Exclusive => (1, options.memory.unwrap_or(spare)),
        Mode::Shared => {
            let each = options.memory.unwrap_or((2u64 << 30).min(spare));
            let by_memory = (spare / each.max(1)) as usize;
            let by_cpus = options
                .cpus
                .map_or(usize::MAX, |c| (cpus_total / c).floor() as usize);
            (by_memory.min(by_cpus).max(1), each)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn options(pairs: &[(&str, &str)]) -> DockerOptions {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        DockerOptions::parse(&map, false).unwrap()
    }

    #[test]
    fn hosts_are_sized_from_their_memory_and_cpus() {
        let gib = 1u64 << 30;
        // Shared: 2 GiB each by default, within what the host can spare.
        assert_eq!(
            capacity(16 * gib, 8.0, &options(&[])).unwrap(),
            (7, 2 * gib)
        );
        assert_eq!(
            capacity(
                16 * gib,
                8.0,
                &options(&[("memory", "512m"), ("cpus", "2")])
            )
            .unwrap(),
            (4, gib / 2),
            "CPUs bound it"
        );
        // Exclusive: one container with all the host can spare.
        assert_eq!(
            capacity(12 * gib, 6.0, &options(&[("mode", "exclusive")])).unwrap(),
            (1, 11 * gib)
        );
        assert_eq!(
            capacity(gib, 1.0, &options(&[("mode", "exclusive")])).unwrap(),
            (1, gib / 2),
            "half of a small host"
        );
        let err = capacity(4 * gib, 2.0, &options(&[("cpus", "3")])).unwrap_err();
        assert!(err.to_string().contains("2 CPUs"), "{err}");
        let err = capacity(4 * gib, 2.0, &options(&[("memory", "8g")])).unwrap_err();
        assert!(err.to_string().contains("can spare"), "{err}");
    }

    #[test]
    fn endpoints_and_named_contexts_resolve() {
        assert_eq!(
            resolve_endpoint("unix:///x.sock").unwrap(),
            "unix:///x.sock"
        );
        assert_eq!(
            resolve_endpoint("ssh://ci@host:22").unwrap(),
            "ssh://ci@host:22"
        );
        for refused in [
            "ssh://host/path",
            "ssh://-oProxyCommand=x",
            "npipe:////./pipe/docker",
        ] {
            assert!(resolve_endpoint(refused).is_err(), "{refused}");
        }
        for smuggled in [
            "unix:///var/run/docker.sock,tcp://203.0.113.9:2375",
            "unix:///var/run/docker.sock tcp://203.0.113.9:2375",
            " tcp://203.0.113.9:2375",
            "TCP://203.0.113.9:2375",
            "Unix:///var/run/docker.sock",
            "http://203.0.113.9:2375",
            "https://203.0.113.9:2376",
            "ssh://attacker",
            "unix://relative.sock",
            "unix:///x.sock\n",
            "hostB,tcp://203.0.113.9:2375",
            "",
        ] {
            let err = spec_endpoint(smuggled).unwrap_err().to_string();
            assert!(err.contains("not a network address"), "{smuggled:?}: {err}");
        }
        assert_eq!(spec_endpoint("unix:///x.sock").unwrap(), "unix:///x.sock");
        let dir = tempfile::tempdir().unwrap();
        let meta = dir
            .path()
            .join("contexts/meta")
            .join(hex::encode(Sha256::digest(b"hostB")));
        std::fs::create_dir_all(&meta).unwrap();
        std::fs::write(
            meta.join("meta.json"),
            r#"{"Name":"hostB","Endpoints":{"docker":{"Host":"tcp://10.0.0.2:2375"}}}"#,
        )
        .unwrap();
        // SAFETY: this is the only test that sets DOCKER_CONFIG.
        unsafe { std::env::set_var("DOCKER_CONFIG", dir.path()) };
        assert_eq!(resolve_endpoint("hostB").unwrap(), "tcp://10.0.0.2:2375");
        // The operator may use a context that points at the network; a plugin may not.
        let err = spec_endpoint("hostB").unwrap_err().to_string();
        assert!(err.contains("points at \"tcp://10.0.0.2:2375\""), "{err}");
        let err = resolve_endpoint("hostC").unwrap_err();
        assert!(
            err.to_string().contains("no Docker context `hostC`"),
            "{err}"
        );
    }
}
