//! The container every shard runs in, hardened in ways no option or plugin can weaken: not
//! privileged, no new privileges, every capability dropped, mst's seccomp profile, a process
//! limit, no host mounts, and a private tmpfs at `/run/mst` for tokens.

use super::options::DockerOptions;
use bollard::models::{ContainerCreateBody, HostConfig};
use std::collections::HashMap;

/// mst's seccomp profile (docker/seccomp.json; see docker/README.md for how it is made).
pub const SECCOMP_PROFILE: &str = include_str!("../../../../docker/seccomp.json");

/// Where the worker's token directory lives: a tmpfs, so tokens never touch a disk or a layer.
/// Writable by any user (sticky), so images with a non-root `USER` can use it; the worker's own
/// token directory inside is 0700.
pub const TOKEN_TMPFS: &str = "/run/mst";

/// The most processes one container may run.
const PIDS_LIMIT: i64 = 4096;

/// The container for one shard: `image` running `command`, labelled with `labels`, with only
/// `env` (`NAME=value`: what the operator passed with `--allow-env`, usually nothing).
pub fn container_body(
    image: &str,
    command: Vec<String>,
    labels: HashMap<String, String>,
    env: Vec<String>,
    memory: u64,
    options: &DockerOptions,
) -> ContainerCreateBody {
    let memory = i64::try_from(memory).unwrap_or(i64::MAX);
    ContainerCreateBody {
        image: Some(image.to_string()),
        cmd: Some(command),
        // The image's entrypoint would wrap our command in something we did not choose.
        entrypoint: Some(Vec::new()),
        labels: Some(labels),
        // Secrets never travel in the environment: tokens arrive over the worker's stdin.
        env: Some(env),
        host_config: Some(HostConfig {
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(Vec::new()),
            security_opt: Some(vec![
                "no-new-privileges:true".into(),
                format!("seccomp={SECCOMP_PROFILE}"),
            ]),
            tmpfs: Some(HashMap::from([(
                TOKEN_TMPFS.to_string(),
                "rw,noexec,nosuid,nodev,size=1m,mode=1777".to_string(),
            )])),
            binds: Some(Vec::new()),
            mounts: Some(Vec::new()),
            devices: Some(Vec::new()),
            memory: Some(memory),
            // No swap beyond the memory limit: an out-of-memory container is stopped, not slowed.
            memory_swap: Some(memory),
            nano_cpus: options.cpus.map(|c| (c * 1e9) as i64),
            pids_limit: Some(PIDS_LIMIT),
            network_mode: Some(options.network.clone()),
            // docker-init reaps the processes clients leave behind and forwards signals.
            init: Some(true),
            ..HostConfig::default()
        }),
        ..ContainerCreateBody::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hardening_is_always_on() {
        let options = DockerOptions::parse(&Default::default(), false).unwrap();
        let body = container_body(
            "img",
            vec!["mst".into()],
            HashMap::new(),
            Vec::new(),
            64 << 20,
            &options,
        );
        let host = body.host_config.unwrap();
        assert_eq!(host.privileged, Some(false));
        assert_eq!(host.cap_drop.unwrap(), ["ALL"]);
        let security = host.security_opt.unwrap();
        assert!(security.contains(&"no-new-privileges:true".to_string()));
        assert!(security.iter().any(|s| s.starts_with("seccomp={")));
        assert!(host.tmpfs.unwrap().contains_key(TOKEN_TMPFS));
        assert_eq!(host.memory, host.memory_swap);
        assert!(host.binds.unwrap().is_empty());
        assert_eq!(body.env.unwrap(), Vec::<String>::new());
        let profile: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
    }
}
