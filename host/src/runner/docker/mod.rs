//! The `docker` runner: each shard in a hardened container on one of several Docker hosts,
//! driven through the Docker API (bollard), never the docker CLI.
//!
//! - [`options`]: the runner's options, validated before anything starts.
//! - [`context`]: Docker hosts by context name or endpoint, and how many containers each holds.
//! - [`ssh`]: Docker hosts over SSH (`ssh://`), through `docker system dial-stdio` as the docker
//!   CLI reaches them.
//! - [`image`]: the image a shard runs and the mst worker inside it (`mst runner setup docker`).
//! - [`agent_clis`]: the agent CLIs `setup` can put in that image, copied from the host.
//! - [`hardening`]: the container configuration no option can weaken.
//! - [`machine`]: one shard's container as a [`Channel`].
//! - [`pipes`]: bytes in and out of an attached exec; the archive API's tar streams are
//!   [`crate::runner::archive`]'s.
//!
//! Each container carries [`crate::owner`]'s labels naming the mst process that owns it, so a
//! later run removes the containers of an mst that is gone.

pub mod agent_clis;
pub mod context;
pub mod hardening;
pub mod image;
pub mod machine;
pub mod options;
pub mod pipes;
pub mod ssh;

use super::channel::Channel;
use super::{MachineRequest, Runner};
use crate::owner::{self, Owner};
use anyhow::{bail, Context as _, Result};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, RemoveContainerOptionsBuilder,
    StartContainerOptionsBuilder,
};
use context::DockerContext;
use image::WorkerImage;
use options::DockerOptions;
use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

/// Label: the run a container belongs to.
pub const RUN_LABEL: &str = "mst.run";
/// Label: the shard it runs.
pub const SHARD_LABEL: &str = "mst.shard";

/// Free container slots per Docker host; a shard waits here for room.
struct Slots {
    free: Mutex<Vec<usize>>,
    freed: Condvar,
}

/// A held slot on host `index`, given back when dropped.
pub struct Slot {
    slots: Arc<Slots>,
    index: usize,
}

impl Slots {
    /// Takes a slot on the host with the most room, waiting for one when all are full; `None`
    /// once `cancel` is set (the user pressed Ctrl-C while this shard waited).
    fn acquire(self: &Arc<Self>, cancel: &AtomicBool) -> Option<Slot> {
        let mut free = self.free.lock().expect("slots");
        loop {
            if cancel.load(Ordering::SeqCst) {
                return None;
            }
            let best = (0..free.len()).filter(|&i| free[i] > 0).max_by_key(|&i| {
                // Most room first; among equals, the earlier host.
                (free[i], std::cmp::Reverse(i))
            });
            if let Some(index) = best {
                free[index] -= 1;
                return Some(Slot {
                    slots: self.clone(),
                    index,
                });
            }
            // Woken by a freed slot, or soon enough to notice a cancel.
            free = self
                .freed
                .wait_timeout(free, std::time::Duration::from_millis(200))
                .expect("slots")
                .0;
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut free = self.slots.free.lock().expect("slots");
        free[self.index] += 1;
        self.slots.freed.notify_all();
    }
}

/// The built-in Docker runner.
pub struct DockerRunner {
    runtime: tokio::runtime::Runtime,
    options: DockerOptions,
    contexts: Vec<DockerContext>,
    slots: Arc<Slots>,
    /// The resolved image per host, resolved once (a derived image is built at most once).
    images: Vec<Mutex<BTreeMap<String, WorkerImage>>>,
    owner: Owner,
    plan: Vec<String>,
    /// Labels a runner plugin asked for; mst's own labels always win.
    extra_labels: Vec<(String, String)>,
    /// `NAME=value` a runner plugin asked for and the operator passed (`--allow-env`).
    env: Vec<String>,
}

/// A runtime for Docker API calls, driven from the shard threads.
pub fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("mst-docker")
        .enable_all()
        .build()
        .context("cannot start the Docker client's runtime")
}

impl DockerRunner {
    /// Validates the options, connects to every host, sizes it, and removes containers left by
    /// mst processes on this machine that are gone.
    pub fn new(options: &BTreeMap<String, String>) -> Result<Self> {
        Self::with_options(DockerOptions::parse(options, false)?)
    }

    /// As [`DockerRunner::new`], from options already parsed (a runner plugin's container
    /// spec, whose context is set apart from the comma-separated `contexts` syntax).
    pub fn with_options(options: DockerOptions) -> Result<Self> {
        let runtime = runtime()?;
        let contexts = runtime.block_on(context::open_all(&options))?;
        let owner = Owner::current();
        let mut plan: Vec<String> = contexts.iter().map(|c| c.describe(options.mode)).collect();
        plan.push(confinement(&options));
        for context in &contexts {
            let removed = runtime.block_on(remove_orphans(&context.docker, &owner))?;
            if removed > 0 {
                plan.push(format!(
                    "docker context `{}`: removed {removed} container(s) left by an mst that is gone",
                    context.name
                ));
            }
        }
        Ok(DockerRunner {
            slots: Arc::new(Slots {
                free: Mutex::new(contexts.iter().map(|c| c.slots).collect()),
                freed: Condvar::new(),
            }),
            images: contexts.iter().map(|_| Mutex::default()).collect(),
            runtime,
            options,
            contexts,
            owner,
            plan,
            extra_labels: Vec::new(),
            env: Vec::new(),
        })
    }

    /// Sets every container's environment (`NAME=value`; a runner plugin's, as the operator
    /// passed it).
    pub fn with_env(mut self, env: Vec<String>) -> Self {
        self.env = env;
        self
    }

    /// Adds labels to every container (a runner plugin's); mst's own labels cannot be
    /// overridden.
    pub fn with_labels(mut self, labels: Vec<(String, String)>) -> Self {
        self.extra_labels = labels;
        self
    }

    /// The image a shard on host `index` runs: the one its trials name (`named`), else the
    /// runner's `image`, else mst's own; each resolved once per host (a derived image is built
    /// at most once).
    fn image_on(
        &self,
        index: usize,
        named: Option<&str>,
        note: &(dyn Fn(&str) + Sync),
    ) -> Result<WorkerImage> {
        let reference = (named.map(str::to_string))
            .or_else(|| self.options.image.clone())
            .unwrap_or_else(image::default_reference);
        let mut cached = self.images[index].lock().expect("image cache");
        if let Some(image) = cached.get(&reference) {
            return Ok(image.clone());
        }
        let context = &self.contexts[index];
        let resolved = self.runtime.block_on(image::resolve(
            &context.docker,
            &context.name,
            &reference,
            || super::worker_binary::find(self.options.worker.as_deref()),
            note,
        ))?;
        cached.insert(reference, resolved.clone());
        Ok(resolved)
    }
}

/// One line saying how containers are confined, and how to loosen what clients may need.
fn confinement(options: &DockerOptions) -> String {
    let network = match options.network.as_str() {
        "none" => "no network (--runner-option network=bridge for clients that call out)".into(),
        network => format!("network `{network}`"),
    };
    let rootfs = match options.rootfs {
        options::Rootfs::ReadOnly => {
            "a read-only root filesystem with a writable work directory and /tmp"
        }
        options::Rootfs::Writable => "a writable root filesystem",
    };
    format!(
        "containers get {network}, {rootfs}, at most {} processes and {} open files each",
        options.pids, options.nofile
    )
}

/// Removes containers on `docker` whose owning mst process on this host is gone (kept ones and
/// other machines' are left alone); how many were removed.
async fn remove_orphans(docker: &bollard::Docker, owner: &Owner) -> Result<usize> {
    let filters = HashMap::from([(
        "label".to_string(),
        vec![format!("{}={}", owner::HOST, owner.host)],
    )]);
    let containers = docker
        .list_containers(Some(
            ListContainersOptionsBuilder::new()
                .all(true)
                .filters(&filters)
                .build(),
        ))
        .await
        .context("listing containers")?;
    let mut removed = 0;
    for container in containers {
        let kept = container
            .names
            .iter()
            .flatten()
            .any(|n| n.ends_with("-kept"));
        let labels = container.labels.unwrap_or_default();
        if kept || !owner.is_orphan(&labels) {
            continue;
        }
        // Another run may be removing the same orphan (404, 409): not this run's failure.
        if let Some(id) = container.id {
            let options = RemoveContainerOptionsBuilder::new()
                .force(true)
                .v(true)
                .build();
            if docker.remove_container(&id, Some(options)).await.is_ok() {
                removed += 1;
            }
        }
    }
    Ok(removed)
}

impl Runner for DockerRunner {
    fn name(&self) -> &str {
        "docker"
    }

    fn max_shards(&self) -> u32 {
        // Shards beyond the hosts' room wait for a free slot.
        u32::MAX
    }

    fn plan(&self) -> Vec<String> {
        self.plan.clone()
    }

    fn egress(&self) -> Option<&crate::egress::Allowed> {
        self.options.egress.as_ref()
    }

    fn create_machine(&self, request: &MachineRequest<'_>) -> Result<Box<dyn Channel>> {
        let Some(slot) = self.slots.acquire(request.cancel) else {
            bail!("cancelled while waiting for room on the Docker hosts");
        };
        // The machine starts here: preparing its image on this host is part of making it.
        let started_at = Instant::now();
        let context = &self.contexts[slot.index];
        let image = self.image_on(slot.index, request.image, request.note)?;
        let run = request.run_id.get(..24).unwrap_or(request.run_id);
        let name = format!(
            "mst-{}-s{}-{}",
            run.replace(|c: char| !c.is_ascii_alphanumeric() && c != '-', "-"),
            request.shard,
            image::rand_suffix()
        );
        let body = hardening::container_body(
            &image.id,
            vec![image.worker.clone(), "idle".into()],
            self.labels(request),
            // The worker reports the image it runs in (`hello`), which run.json records.
            (self.env.iter().cloned())
                .chain([format!("MST_IMAGE_DIGEST={}", image.id)])
                .collect(),
            context.memory_each,
            &self.options,
        );
        let deadline = Instant::now() + self.options.ready_timeout;
        let id = self.create_container(context, &name, body)?;
        // From here on the machine owns the container: dropping it removes the container.
        let docker = context.docker.clone();
        let mut machine = machine::DockerMachine {
            runtime: self.runtime.handle().clone(),
            docker: docker.clone(),
            context: context.name.clone(),
            name: name.clone(),
            id: id.clone(),
            image,
            memory: context.memory_each,
            slot: Some(slot),
            disposed: false,
            oom: Arc::new(AtomicBool::new(false)),
            oom_watch: None,
            started_at,
            stopped_by_us: Arc::new(AtomicBool::new(false)),
        };
        machine.oom_watch = Some(machine::watch_oom(
            self.runtime.handle(),
            &docker,
            &id,
            machine.oom.clone(),
        ));
        self.start_container(context, &mut machine, deadline)?;
        Ok(Box::new(machine))
    }
}

impl DockerRunner {
    /// The labels of a shard's container: the operator's extra ones (never in mst's own
    /// namespaces), then the owner's, the run's and the shard's, which win.
    fn labels(&self, request: &MachineRequest<'_>) -> HashMap<String, String> {
        let mut labels: HashMap<String, String> = self
            .extra_labels
            .iter()
            .filter(|(k, _)| !k.starts_with("mst.") && !k.starts_with("org.mst."))
            .cloned()
            .collect();
        labels.extend(self.owner.labels());
        labels.insert(RUN_LABEL.into(), request.run_id.to_string());
        labels.insert(SHARD_LABEL.into(), request.shard.to_string());
        labels
    }

    fn too_slow(&self, context: &DockerContext, name: &str) -> anyhow::Error {
        anyhow::anyhow!(
            "container {name} on `{}` was not running within readyTimeout ({}s)",
            context.name,
            self.options.ready_timeout.as_secs_f64()
        )
    }

    /// Creates container `name` from `body` within `readyTimeout`; its id. One Docker made
    /// too late is removed by name.
    fn create_container(
        &self,
        context: &DockerContext,
        name: &str,
        body: bollard::models::ContainerCreateBody,
    ) -> Result<String> {
        let docker = &context.docker;
        let timeout = self.options.ready_timeout;
        let created = self
            .runtime
            .block_on(async {
                // The timer must be made inside the runtime.
                tokio::time::timeout(
                    timeout,
                    docker.create_container(
                        Some(CreateContainerOptionsBuilder::new().name(name).build()),
                        body,
                    ),
                )
                .await
            })
            .map_err(|_| {
                // Docker may have created it after all: remove it by name.
                let options = RemoveContainerOptionsBuilder::new()
                    .force(true)
                    .v(true)
                    .build();
                let _ = self
                    .runtime
                    .block_on(docker.remove_container(name, Some(options)));
                self.too_slow(context, name)
            })?
            .with_context(|| format!("creating container {name} on `{}`", context.name))?;
        Ok(created.id)
    }

    /// Gives the container its work directory and starts it, by `deadline`.
    fn start_container(
        &self,
        context: &DockerContext,
        machine: &mut machine::DockerMachine,
        deadline: Instant,
    ) -> Result<()> {
        let docker = &context.docker;
        let id = machine.id.clone();
        // A read-only container's work directory is its volume; a writable one's is made here,
        // owned by the image's user.
        let workdir = match self.options.rootfs {
            options::Rootfs::ReadOnly => None,
            options::Rootfs::Writable => Some(machine::upload(
                &machine.image,
                "/",
                crate::runner::archive::tar_dir(machine::WORKDIR.trim_start_matches('/'), 0o700)?,
            )?),
        };
        let start = async {
            if let Some((options, workdir)) = workdir {
                docker
                    .upload_to_container(&id, Some(options), bollard::body_full(workdir.into()))
                    .await
                    .context("creating its work directory")?;
            }
            docker
                .start_container(&id, Some(StartContainerOptionsBuilder::new().build()))
                .await
                .context("starting it")?;
            Ok::<_, anyhow::Error>(())
        };
        let left = deadline.saturating_duration_since(Instant::now());
        match self
            .runtime
            .block_on(async { tokio::time::timeout(left, start).await })
        {
            Err(_) => Err(self.too_slow(context, &machine.name)),
            Ok(Err(e)) => {
                let why = machine
                    .diagnose()
                    .map(|d| format!(": {d}"))
                    .unwrap_or_default();
                let name = &machine.name;
                Err(e.context(format!("container {name} on `{}`{why}", context.name)))
            }
            Ok(Ok(())) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn shards_spread_over_hosts_and_wait_for_a_free_slot() {
        let slots = Arc::new(Slots {
            free: Mutex::new(vec![1, 1]),
            freed: Condvar::new(),
        });
        let never = AtomicBool::new(false);
        let first = slots.acquire(&never).unwrap();
        let second = slots.acquire(&never).unwrap();
        assert_eq!((first.index, second.index), (0, 1), "one per host");
        let (tx, rx) = std::sync::mpsc::channel();
        let waiting = slots.clone();
        let handle = std::thread::spawn(move || {
            let third = waiting.acquire(&AtomicBool::new(false)).unwrap();
            tx.send(third.index).unwrap();
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "a third shard waits while both hosts are full"
        );
        drop(second);
        assert_eq!(rx.recv_timeout(Duration::from_secs(5)).unwrap(), 1);
        handle.join().unwrap();
        let cancelled = AtomicBool::new(true);
        assert!(slots.acquire(&cancelled).is_none(), "a cancelled wait ends");
        drop(first);
        assert_eq!(
            *slots.free.lock().unwrap(),
            vec![1, 1],
            "all slots given back"
        );
    }
}
