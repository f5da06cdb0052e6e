//! The container every shard runs in, hardened in ways no option or plugin can weaken: not
//! privileged, no new privileges, every capability dropped, mst's seccomp profile, no host
//! mounts. The operator's options (never a
//! plugin's spec) choose the network, a writable root filesystem, and the process and open-file
//! limits, all safe by default (docs/adr/0007-container-egress.md).

use super::machine::WORKDIR;
use super::options::{DockerOptions, Rootfs};
use bollard::models::{
    ContainerCreateBody, HostConfig, Mount, MountType, MountVolumeOptions,
    MountVolumeOptionsDriverConfig, ResourcesUlimits,
};
use std::collections::HashMap;

/// mst's seccomp profile (docker/seccomp.json; see docker/README.md for how it is made).
pub const SECCOMP_PROFILE: &str = include_str!("../../../../docker/seccomp.json");

/// The writable scratch directory of a read-only container.
pub const TMP: &str = "/tmp";

/// A writable directory of a read-only container (its work directory and `/tmp`): an anonymous
/// volume of Docker's `local` driver backed by a tmpfs of `size` bytes, empty, world-writable
/// and sticky, so any image user can use it whatever the image has there. A volume, not a
/// plain tmpfs, because Docker's archive API (which copies the bundle in and traces out) writes
/// only into volumes of a read-only container, and a plain tmpfs takes the mode of the image's
/// directory. It is removed with the container.
fn scratch_volume(target: &str, size: u64) -> Mount {
    Mount {
        target: Some(target.into()),
        typ: Some(MountType::VOLUME),
        read_only: Some(false),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            driver_config: Some(MountVolumeOptionsDriverConfig {
                name: Some("local".into()),
                options: Some(HashMap::from([
                    ("type".to_string(), "tmpfs".to_string()),
                    ("device".to_string(), "tmpfs".to_string()),
                    (
                        "o".to_string(),
                        format!("size={size},mode=1777,nosuid,nodev"),
                    ),
                ])),
            }),
            ..MountVolumeOptions::default()
        }),
        ..Mount::default()
    }
}

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
    let bytes = memory;
    let memory = i64::try_from(memory).unwrap_or(i64::MAX);
    let read_only = options.rootfs == Rootfs::ReadOnly;
    // Both are memory charged to the container: sized to its limit, so neither can outgrow
    // what the container may use anyway.
    let mounts = match read_only {
        true => vec![scratch_volume(WORKDIR, bytes), scratch_volume(TMP, bytes)],
        false => Vec::new(),
    };
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
            readonly_rootfs: Some(read_only),
            // Never a host path: the only mounts are the scratch volumes.
            binds: Some(Vec::new()),
            mounts: Some(mounts),
            devices: Some(Vec::new()),
            memory: Some(memory),
            // No swap beyond the memory limit: an out-of-memory container is stopped, not slowed.
            memory_swap: Some(memory),
            nano_cpus: options.cpus.map(|c| (c * 1e9) as i64),
            pids_limit: Some(options.pids),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(options.nofile),
                hard: Some(options.nofile),
            }]),
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
        assert!(
            host.tmpfs.is_none(),
            "no token directory: tokens stay in memory"
        );
        assert_eq!(host.memory, host.memory_swap);
        assert!(host.binds.unwrap().is_empty());
        // Safe by default: read-only root with a volume work directory, no network, limits.
        assert_eq!(host.readonly_rootfs, Some(true));
        let mounts = host.mounts.unwrap();
        let targets: Vec<_> = mounts.iter().map(|m| m.target.as_deref()).collect();
        assert_eq!(targets, [Some(WORKDIR), Some(TMP)]);
        assert!(
            mounts.iter().all(|m| m.source.is_none()),
            "anonymous volumes, never a host path"
        );
        assert_eq!(host.network_mode.as_deref(), Some("none"));
        assert_eq!(host.pids_limit, Some(options.pids));
        assert_eq!(host.ulimits.unwrap()[0].hard, Some(options.nofile));
        assert_eq!(body.env.unwrap(), Vec::<String>::new());
        let profile: serde_json::Value = serde_json::from_str(SECCOMP_PROFILE).unwrap();
        assert_eq!(profile["defaultAction"], "SCMP_ACT_ERRNO");
        // socket(2) for every family but AF_VSOCK (40), as Docker's default profile.
        let socket: Vec<&serde_json::Value> = profile["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|rule| rule["names"].as_array().unwrap().contains(&"socket".into()))
            .collect();
        assert_eq!(socket.len(), 1, "{socket:?}");
        assert_eq!(
            socket[0]["args"],
            serde_json::json!([{"index": 0, "value": 40, "op": "SCMP_CMP_NE"}])
        );
    }
}
