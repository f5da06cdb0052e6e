//! One shard's container: the channel (put, exec, get) over Docker's API, and what the
//! container says about itself when the shard fails (out of memory, gone, stopped).

use super::image::WorkerImage;
use super::pipes;
use crate::runner::archive;
use crate::runner::channel::{Channel, KeptMachine, Process, ProcessHandle};
use anyhow::{bail, Context, Result};
use bollard::exec::{CreateExecOptions, StartExecOptions, StartExecResults};
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, KillContainerOptionsBuilder,
    RemoveContainerOptionsBuilder, RenameContainerOptionsBuilder, UploadToContainerOptions,
    UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use std::io::Read;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;

/// The machine's work directory inside the container.
pub const WORKDIR: &str = "/mst-work";

/// `tar` and the options to unpack it at `path` so that its files belong to the image's user:
/// given to a numeric user in the tar itself, else by Docker (`copyUIDGID`, which resolves a
/// named user on the Docker host).
pub(super) fn upload(
    image: &WorkerImage,
    path: &str,
    tar: Vec<u8>,
) -> Result<(UploadToContainerOptions, Vec<u8>)> {
    let builder = UploadToContainerOptionsBuilder::new().path(path);
    Ok(match image.owner {
        Some((uid, gid)) => (builder.build(), archive::owned_by(&tar, uid, gid)?),
        None => (builder.copy_uidgid("1").build(), tar),
    })
}

/// A running shard container.
pub struct DockerMachine {
    pub(super) runtime: Handle,
    pub(super) docker: Docker,
    /// The context it runs on, as the user named it.
    pub(super) context: String,
    pub(super) name: String,
    pub(super) id: String,
    pub(super) image: WorkerImage,
    pub(super) memory: u64,
    /// Released when the machine is disposed of or dropped.
    pub(super) slot: Option<super::Slot>,
    pub(super) disposed: bool,
    /// Set when Docker reports an out-of-memory kill in the container. Docker's
    /// `State.OOMKilled` only covers the container's first process; the event covers any.
    pub(super) oom: Arc<AtomicBool>,
    pub(super) oom_watch: Option<tokio::task::JoinHandle<()>>,
    /// When its creation began (after the slot was free).
    pub(super) started_at: Instant,
    /// Set when mst itself stopped the container (to end a failed shard), so that stop is not
    /// reported as the failure's cause.
    pub(super) stopped_by_us: Arc<AtomicBool>,
}

/// Watches `docker`'s events for out-of-memory kills in container `id`, setting `flag`.
pub(super) fn watch_oom(
    runtime: &Handle,
    docker: &Docker,
    id: &str,
    flag: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let since = crate::clock::unix_secs().saturating_sub(1).to_string();
    let filters = std::collections::HashMap::from([
        ("container", vec![id.to_string()]),
        ("event", vec!["oom".to_string()]),
    ]);
    let mut events = docker.events(Some(
        bollard::query_parameters::EventsOptionsBuilder::new()
            .since(&since)
            .filters(&filters)
            .build(),
    ));
    runtime.spawn(async move {
        while let Some(Ok(_)) = events.next().await {
            flag.store(true, Ordering::Relaxed);
        }
    })
}

impl DockerMachine {
    fn block_on<F: std::future::Future>(&self, future: F) -> F::Output {
        self.runtime.block_on(future)
    }

    /// Removes the container; errors only when Docker refuses.
    fn remove(&self) -> Result<()> {
        match self.block_on(
            self.docker.remove_container(
                &self.id,
                Some(
                    RemoveContainerOptionsBuilder::new()
                        .force(true)
                        .v(true)
                        .build(),
                ),
            ),
        ) {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => Ok(()),
            Err(e) => Err(e).with_context(|| format!("removing container {}", self.name)),
        }
    }
}

/// An exec in a shard container.
struct DockerExec {
    runtime: Handle,
    docker: Docker,
    container: String,
    exec: String,
    stopped_by_us: Arc<AtomicBool>,
}

impl ProcessHandle for DockerExec {
    fn kill(&mut self) {
        // An exec cannot be signalled on its own; the container is the shard's, so stop it.
        self.stopped_by_us.store(true, Ordering::Relaxed);
        let _ = self.runtime.block_on(self.docker.kill_container(
            &self.container,
            Some(KillContainerOptionsBuilder::new().signal("KILL").build()),
        ));
    }

    fn wait(&mut self) -> Option<i32> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            match self.runtime.block_on(self.docker.inspect_exec(&self.exec)) {
                Ok(state) if state.running == Some(false) => {
                    return state.exit_code.map(|c| c as i32)
                }
                Ok(_) => std::thread::sleep(Duration::from_millis(20)),
                Err(_) => return None,
            }
        }
        None
    }
}

impl Channel for DockerMachine {
    fn describe(&self) -> String {
        format!("docker container {} on `{}`", self.name, self.context)
    }

    fn put(&mut self, src: &Path, dest: &str) -> Result<()> {
        if !crate::files::is_plain_relative(dest) {
            bail!("refusing machine path {dest:?}: only plain relative paths are allowed");
        }
        // Owned by the container's user, whoever the image runs as.
        let (options, tar) = upload(&self.image, WORKDIR, archive::tar_directory(src, dest)?)?;
        self.block_on(self.docker.upload_to_container(
            &self.id,
            Some(options),
            bollard::body_full(tar.into()),
        ))
        .with_context(|| format!("copying {} into {}", src.display(), self.name))
    }

    fn exec(&mut self, argv: &[String]) -> Result<Process> {
        let mut argv: Vec<String> = argv
            .iter()
            .map(|a| a.replace("{workdir}", WORKDIR))
            .collect();
        if argv.first().map(String::as_str) == Some("mst") {
            argv[0] = self.image.worker.clone();
        }
        let created = self
            .block_on(self.docker.create_exec(
                &self.id,
                CreateExecOptions {
                    attach_stdin: Some(true),
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    tty: Some(false),
                    cmd: Some(argv),
                    working_dir: Some(WORKDIR.to_string()),
                    ..Default::default()
                },
            ))
            .with_context(|| format!("starting the worker in {}", self.name))?;
        let started = self
            .block_on(self.docker.start_exec(
                &created.id,
                Some(StartExecOptions {
                    detach: false,
                    tty: false,
                    output_capacity: None,
                }),
            ))
            .with_context(|| format!("attaching to the worker in {}", self.name))?;
        let StartExecResults::Attached { output, input } = started else {
            bail!("Docker started the worker detached");
        };
        let (stdin, stdout, stderr) = pipes::attach(&self.runtime, output, input);
        Ok(Process {
            stdin: Box::new(stdin),
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            handle: Box::new(DockerExec {
                runtime: self.runtime.clone(),
                docker: self.docker.clone(),
                container: self.id.clone(),
                exec: created.id,
                stopped_by_us: self.stopped_by_us.clone(),
            }),
        })
    }

    fn get(&mut self, src: &str, dest: &Path, cap: u64) -> Result<()> {
        if !crate::files::is_plain_relative(src) {
            bail!("refusing machine path {src:?}: only plain relative paths are allowed");
        }
        let name = Path::new(src)
            .file_name()
            .and_then(|n| n.to_str())
            .context("no file name")?
            .to_string();
        let path = format!("{WORKDIR}/{src}");
        let stream = self.docker.download_from_container(
            &self.id,
            Some(
                DownloadFromContainerOptionsBuilder::new()
                    .path(&path)
                    .build(),
            ),
        );
        // Never more than the cap plus room for tar headers is read from the machine.
        let reader = StreamReader {
            runtime: self.runtime.clone(),
            stream: Box::pin(stream),
            pending: bytes::Bytes::new(),
            left: cap + 64 * 1024,
        };
        let bytes = archive::single_file(reader, &name, cap)
            .with_context(|| format!("copying {src} back from {}", self.name))?;
        crate::files::write_atomic(dest, &bytes)
    }

    fn get_many(&mut self, files: &[(String, std::path::PathBuf)], cap: u64) -> Vec<Result<()>> {
        // Each archive request costs the engine tens of milliseconds (Docker 20.10 re-executes
        // itself to read a container's files), so one request fetches the whole batch: the
        // archive of the directory the files share (`results/` for traces, a trial's own
        // directory for its artefacts), from which only the wanted files are kept.
        // (The stream is lazy: `copy_wanted` refuses bad paths before any request is made.)
        let sources: Vec<&str> = files.iter().map(|(src, _)| src.as_str()).collect();
        let common = archive::common_dir(&sources);
        // The archive names its entries from the fetched directory's own name down.
        let above = common.rsplit_once('/').map_or("", |(above, _)| above);
        let files: Vec<(String, std::path::PathBuf)> = files
            .iter()
            .map(|(src, dest)| {
                let named = src
                    .strip_prefix(above)
                    .unwrap_or(src)
                    .trim_start_matches('/');
                (named.to_string(), dest.clone())
            })
            .collect();
        let files = &files[..];
        let stream = self.docker.download_from_container(
            &self.id,
            Some(
                DownloadFromContainerOptionsBuilder::new()
                    .path(&format!("{WORKDIR}/{common}"))
                    .build(),
            ),
        );
        let reader = StreamReader {
            runtime: self.runtime.clone(),
            stream: Box::pin(stream),
            pending: bytes::Bytes::new(),
            left: archive::batch_limit(files.len(), cap),
        };
        archive::copy_wanted(reader, files, cap, &self.name)
    }

    fn batch_copies(&self) -> bool {
        true
    }

    fn dispose(&mut self, keep: bool) -> Result<Option<KeptMachine>> {
        self.disposed = true;
        self.slot.take();
        if keep {
            let kept = format!("{}-kept", self.name);
            self.block_on(self.docker.rename_container(
                &self.id,
                RenameContainerOptionsBuilder::new().name(&kept).build(),
            ))
            .with_context(|| format!("renaming {} to {kept}", self.name))?;
            let docker = docker_cli(&self.context);
            // A failed shard's container was stopped when the shard ended: start it first.
            let start = match self.stopped_by_us.load(Ordering::Relaxed) {
                true => format!("{docker} start {kept} && "),
                false => String::new(),
            };
            return Ok(Some(KeptMachine {
                at: format!(
                    "container {kept} on `{}` (remove it with: {docker} rm -f -v {kept})",
                    self.context
                ),
                enter: Some(format!("{start}{docker} exec -it {kept} sh")),
            }));
        }
        self.remove()?;
        Ok(None)
    }

    fn diagnose(&mut self) -> Option<String> {
        use bollard::models::ContainerStateStatusEnum as Status;
        let state = match self.block_on(self.docker.inspect_container(&self.id, None)) {
            Ok(container)
                if !matches!(
                    container.state.as_ref().and_then(|s| s.status),
                    Some(Status::REMOVING | Status::DEAD)
                ) =>
            {
                container.state.unwrap_or_default()
            }
            _ => {
                return Some(format!(
                    "container {} on `{}` vanished mid-run",
                    self.name, self.context
                ))
            }
        };
        if state.oom_killed == Some(true) || self.oom.load(Ordering::Relaxed) {
            return Some(format!(
                "container {} on `{}` ran out of memory (limit {})",
                self.name,
                self.context,
                super::options::mib(self.memory)
            ));
        }
        if state.running != Some(true) && !self.stopped_by_us.load(Ordering::Relaxed) {
            return Some(format!(
                "container {} on `{}` stopped (exit code {})",
                self.name,
                self.context,
                state.exit_code.unwrap_or(-1)
            ));
        }
        None
    }

    fn started_at(&self) -> Option<Instant> {
        Some(self.started_at)
    }

    fn provenance(&self) -> serde_json::Value {
        serde_json::json!({
            "context": self.context,
            "container": self.name,
            "image": self.image.reference,
            "imageId": self.image.id,
            "workerPlaced": self.image.placed,
        })
    }
}

impl Drop for DockerMachine {
    fn drop(&mut self) {
        if let Some(watch) = self.oom_watch.take() {
            watch.abort();
        }
        if !self.disposed {
            let _ = self.remove();
        }
    }
}

/// A blocking reader over the archive stream, refusing to read past `left` bytes.
struct StreamReader {
    runtime: Handle,
    stream: std::pin::Pin<
        Box<dyn futures_util::Stream<Item = Result<bytes::Bytes, bollard::errors::Error>> + Send>,
    >,
    pending: bytes::Bytes,
    left: u64,
}

impl Read for StreamReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pending.is_empty() {
            match self.runtime.block_on(self.stream.next()) {
                None => return Ok(0),
                Some(Ok(chunk)) => self.pending = chunk,
                Some(Err(e)) => {
                    let message = match e {
                        bollard::errors::Error::DockerResponseServerError {
                            status_code: 404,
                            ..
                        } => "no such file on the machine".to_string(),
                        other => other.to_string(),
                    };
                    return Err(std::io::Error::other(message));
                }
            }
        }
        let n = buf.len().min(self.pending.len());
        if n as u64 > self.left {
            return Err(std::io::Error::other(
                "the machine sent more than the size cap",
            ));
        }
        self.left -= n as u64;
        buf[..n].copy_from_slice(&self.pending[..n]);
        self.pending = self.pending.slice(n..);
        Ok(n)
    }
}

/// The docker CLI aimed at `context` as the user named it: an endpoint (`unix://…`,
/// `tcp://…`, `ssh://…`) with `-H`, a context name with `--context`, the default as it is.
fn docker_cli(context: &str) -> String {
    match context {
        "" | "default" => "docker".to_string(),
        endpoint if endpoint.contains("://") => format!("docker -H {endpoint}"),
        name => format!("docker --context {name}"),
    }
}
