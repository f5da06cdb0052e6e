//! The image a shard runs, and the mst worker inside it.
//!
//! - An image labelled `org.mst.version=<this version>` (what `mst runner setup docker` builds)
//!   runs the mst it names in `org.mst.worker`.
//! - Any other image gets this mst's static worker placed into it once per Docker host: a
//!   derived image `mst-derived:<version>-<image id>` with the worker at `/opt/mst/bin/mst`, made
//!   by committing a never-started container, and reused by later runs.

use super::agent_clis::{CliProgram, CLI_DIR};
use crate::runner::archive;
use anyhow::{bail, Context, Result};
use bollard::query_parameters::{
    BuildImageOptionsBuilder, CommitContainerOptionsBuilder, CreateContainerOptionsBuilder,
    CreateImageOptionsBuilder, RemoveContainerOptionsBuilder, UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::StreamExt;
use std::collections::HashMap;
use std::path::Path;

/// Label: the mst version of the worker in an image.
pub const VERSION_LABEL: &str = "org.mst.version";
/// Label: where that worker is.
pub const WORKER_LABEL: &str = "org.mst.worker";
/// Label: the image a derived image was made from.
pub const DERIVED_FROM_LABEL: &str = "org.mst.derived-from";

/// The Dockerfile `mst runner setup docker --runner-option base=IMAGE` builds.
pub const DOCKERFILE: &str = include_str!("../../../../docker/Dockerfile");

/// The worker's path in images `setup` builds.
const SETUP_WORKER: &str = "/usr/local/bin/mst";
/// The user images `setup` builds run as: not root, and numeric, so no base needs a passwd
/// entry for it (65532 is distroless's `nonroot`).
pub const SETUP_USER: &str = "65532:65532";

/// The worker's path in derived images.
const PLACED_WORKER: &str = "/opt/mst/bin/mst";

/// The image a shard runs, resolved on one Docker host.
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkerImage {
    /// As the user named it.
    pub reference: String,
    /// The image id that actually runs (a derived image's, when the worker was placed).
    pub id: String,
    /// The worker inside it.
    pub worker: String,
    /// Whether mst placed its static worker into the image.
    pub placed: bool,
    /// The image's user as `(uid, gid)` when it is numeric (`USER 65532:65532`, as `setup`
    /// builds): files copied in are given to it in the tar itself, because Docker's
    /// `copyUIDGID` looks a user up in the Docker host's own passwd database, not the image's.
    #[serde(skip)]
    pub owner: Option<(u64, u64)>,
}

/// `(uid, gid)` of a numeric `USER` (`uid` alone means group 0, as Docker without a passwd
/// entry); `None` for a name or an empty user, which Docker resolves itself.
fn numeric_owner(user: &str) -> Option<(u64, u64)> {
    match user.split_once(':') {
        Some((uid, gid)) => Some((uid.parse().ok()?, gid.parse().ok()?)),
        None => Some((user.parse().ok()?, 0)),
    }
}

/// The image `--runner docker` runs when no `image` option is given.
pub fn default_reference() -> String {
    format!("mst-worker:{}", env!("CARGO_PKG_VERSION"))
}

fn is_not_found(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Resolves `reference` on `docker` (host `context`) to an image with this mst's worker,
/// deriving one when needed from the static worker `static_worker` finds.
pub async fn resolve(
    docker: &Docker,
    context: &str,
    reference: &str,
    static_worker: impl FnOnce() -> Result<std::path::PathBuf>,
    note: &(dyn Fn(&str) + Sync),
) -> Result<WorkerImage> {
    let ours = env!("CARGO_PKG_VERSION");
    let image = match docker.inspect_image(reference).await {
        Ok(image) => image,
        Err(e) if is_not_found(&e) => {
            if reference == default_reference() {
                bail!(
                    "image {reference} is not on docker context `{context}`: build it with \
                     `mst runner setup docker --runner-option contexts={context}`"
                );
            }
            bail!(
                "image {reference} is not on docker context `{context}`; mst does not pull \
                 images: `docker pull {reference}` there first"
            );
        }
        Err(e) => return Err(e).with_context(|| format!("inspecting image {reference}")),
    };
    let id = image.id.clone().unwrap_or_default();
    // A derived image is committed from this one, so it keeps this user.
    let owner = image
        .config
        .as_ref()
        .and_then(|c| c.user.as_deref())
        .and_then(numeric_owner);
    let labels = image
        .config
        .as_ref()
        .and_then(|c| c.labels.clone())
        .unwrap_or_default();
    if labels.get(VERSION_LABEL).map(String::as_str) == Some(ours) {
        return Ok(WorkerImage {
            reference: reference.to_string(),
            id,
            worker: labels
                .get(WORKER_LABEL)
                .cloned()
                .unwrap_or_else(|| SETUP_WORKER.into()),
            placed: false,
            owner,
        });
    }
    if let Some(theirs) = labels.get(VERSION_LABEL) {
        note(&format!(
            "image {reference} has mst {theirs}, not {ours}: placing this mst's worker into it"
        ));
    }
    let short = id
        .trim_start_matches("sha256:")
        .get(..12)
        .unwrap_or("unknown");
    let derived = format!("mst-derived:{ours}-{short}");
    if let Ok(existing) = docker.inspect_image(&derived).await {
        let labels = existing.config.and_then(|c| c.labels).unwrap_or_default();
        if labels.get(DERIVED_FROM_LABEL) == Some(&id) {
            return Ok(WorkerImage {
                reference: reference.to_string(),
                id: existing.id.unwrap_or_default(),
                worker: PLACED_WORKER.into(),
                placed: true,
                owner,
            });
        }
    }
    let worker = static_worker()?;
    note(&format!(
        "docker context `{context}`: placing mst's static worker ({}) into {reference} as {derived}",
        worker.display()
    ));
    let new_id = derive(docker, &id, &derived, &worker).await?;
    Ok(WorkerImage {
        reference: reference.to_string(),
        id: new_id,
        worker: PLACED_WORKER.into(),
        placed: true,
        owner,
    })
}

/// Commits `image` plus the worker at [`PLACED_WORKER`] as `tag`; the new image's id.
async fn derive(docker: &Docker, image: &str, tag: &str, worker: &Path) -> Result<String> {
    let bytes = std::fs::read(worker).with_context(|| worker.display().to_string())?;
    let tar = archive::tar_file(PLACED_WORKER.trim_start_matches('/'), &bytes, 0o755)?;
    let name = format!("mst-derive-{}-{}", std::process::id(), rand_suffix());
    let created = docker
        .create_container(
            Some(CreateContainerOptionsBuilder::new().name(&name).build()),
            bollard::models::ContainerCreateBody {
                image: Some(image.to_string()),
                cmd: Some(vec![PLACED_WORKER.into(), "idle".into()]),
                entrypoint: Some(Vec::new()),
                ..Default::default()
            },
        )
        .await
        .context("creating the container to place the worker in")?;
    let result = async {
        docker
            .upload_to_container(
                &created.id,
                Some(UploadToContainerOptionsBuilder::new().path("/").build()),
                bollard::body_full(tar.into()),
            )
            .await
            .context("copying the worker into the image")?;
        let (repo, tag) = tag.split_once(':').expect("derived tags have a colon");
        let change = format!(
            "LABEL {VERSION_LABEL}={} {WORKER_LABEL}={PLACED_WORKER} {DERIVED_FROM_LABEL}={image}",
            env!("CARGO_PKG_VERSION")
        );
        let committed = docker
            .commit_container(
                CommitContainerOptionsBuilder::new()
                    .container(&created.id)
                    .repo(repo)
                    .tag(tag)
                    .changes(&change)
                    .pause(false)
                    .build(),
                bollard::models::ContainerConfig::default(),
            )
            .await
            .context("committing the derived image")?;
        Ok::<_, anyhow::Error>(committed.id)
    }
    .await;
    let _ = docker
        .remove_container(
            &created.id,
            Some(
                RemoveContainerOptionsBuilder::new()
                    .force(true)
                    .v(true)
                    .build(),
            ),
        )
        .await;
    result
}

/// A short random suffix for temporary names.
pub fn rand_suffix() -> String {
    let nanos = crate::clock::since_epoch().subsec_nanos();
    format!("{:08x}", nanos ^ std::process::id().rotate_left(16))
}

/// What `mst runner setup docker` builds on one host: `reference`, with `worker` at
/// `SETUP_WORKER` and the agent CLIs `clis` in [`CLI_DIR`], from `base` with docker/Dockerfile
/// or, with no base, by importing a filesystem that holds only those (no registry needed).
pub struct SetupImage<'a> {
    pub reference: &'a str,
    pub base: Option<&'a str>,
    pub worker: &'a Path,
    pub clis: &'a [CliProgram],
}

/// Builds `image` on one host; returns its id.
pub async fn setup(docker: &Docker, image: &SetupImage<'_>) -> Result<String> {
    let reference = image.reference;
    let read = |path: &Path| std::fs::read(path).with_context(|| path.display().to_string());
    let worker = read(image.worker)?;
    let clis = (image.clis.iter())
        .map(|cli| Ok((cli.file, read(&cli.path)?)))
        .collect::<Result<Vec<_>>>()?;
    match image.base {
        Some(base) => build_from(docker, reference, base, &worker, &clis).await?,
        None => import(docker, reference, &worker, &clis).await?,
    }
    let built = docker
        .inspect_image(reference)
        .await
        .with_context(|| format!("{reference} was not built"))?;
    Ok(built.id.unwrap_or_default())
}

/// docker/Dockerfile, with the agent CLIs copied in when there are any (onto the `PATH`, before
/// the image drops root).
fn dockerfile(with_clis: bool) -> String {
    const USER_LINE: &str = "USER ${MST_USER}";
    if !with_clis {
        return DOCKERFILE.to_string();
    }
    let clis = format!("COPY agent-clis/ {CLI_DIR}/\nENV PATH={CLI_DIR}:${{PATH}}\n{USER_LINE}");
    DOCKERFILE.replacen(USER_LINE, &clis, 1)
}

/// Builds `reference` from `base` with docker/Dockerfile, the worker and `clis` in its context.
async fn build_from(
    docker: &Docker,
    reference: &str,
    base: &str,
    worker: &[u8],
    clis: &[(&str, Vec<u8>)],
) -> Result<()> {
    let dockerfile = dockerfile(!clis.is_empty());
    let mut context = tar::Builder::new(Vec::new());
    let files = [("Dockerfile".to_string(), dockerfile.as_bytes(), 0o644)]
        .into_iter()
        .chain([("mst".to_string(), worker, 0o755)])
        .chain(
            clis.iter()
                .map(|(file, data)| (format!("agent-clis/{file}"), &data[..], 0o755)),
        );
    for (name, data, mode) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(mode);
        header.set_mtime(0);
        context.append_data(&mut header, name, data)?;
    }
    let body = context.into_inner()?;
    let args = HashMap::from([
        ("BASE", base),
        ("MST_VERSION", env!("CARGO_PKG_VERSION")),
        ("MST_USER", SETUP_USER),
    ]);
    let options = BuildImageOptionsBuilder::new()
        .t(reference)
        .buildargs(&args)
        .rm(true)
        .forcerm(true)
        .build();
    build(
        docker,
        options,
        body,
        &format!("building {reference} from {base}"),
    )
    .await
}

/// Builds `reference` from the Dockerfile in `dir` (a task's environment), with `dir` as its
/// context, offline: its `FROM` images must be on the host already. The context is packed as a
/// workspace is, so a link out of it or a device refuses it. Returns the image's id.
pub async fn build_dir(docker: &Docker, reference: &str, dir: &Path) -> Result<String> {
    if !dir.join("Dockerfile").is_file() {
        bail!("--build {}: no Dockerfile in it", dir.display());
    }
    let scratch = tempfile::tempdir()?;
    let packed = crate::workspace::pack(crate::workspace::Source::Dir(dir), scratch.path())
        .with_context(|| format!("--build {}", dir.display()))?;
    let body = std::fs::read(
        scratch
            .path()
            .join(crate::workspace::archive_name(&packed.digest)),
    )?;
    let options = BuildImageOptionsBuilder::new()
        .t(reference)
        .rm(true)
        .forcerm(true)
        .build();
    let what = format!("building {reference} from {}", dir.display());
    build(docker, options, body, &what).await?;
    let built = (docker.inspect_image(reference).await)
        .with_context(|| format!("{reference} was not built"))?;
    Ok(built.id.unwrap_or_default())
}

/// Runs one build of `body` (a tar context), its error naming `what` with the build's log.
async fn build(
    docker: &Docker,
    options: bollard::query_parameters::BuildImageOptions,
    body: Vec<u8>,
    what: &str,
) -> Result<()> {
    let mut stream = docker.build_image(options, None, Some(bollard::body_full(body.into())));
    let mut log = String::new();
    while let Some(item) = stream.next().await {
        let info = item.with_context(|| what.to_string())?;
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            bail!("{what}: {detail}\n{log}");
        }
        if let Some(line) = info.stream {
            log.push_str(&line);
        }
    }
    Ok(())
}

/// Imports `reference` as a filesystem of only `/tmp`, the worker and `clis`.
async fn import(
    docker: &Docker,
    reference: &str,
    worker: &[u8],
    clis: &[(&str, Vec<u8>)],
) -> Result<()> {
    let mut rootfs = tar::Builder::new(Vec::new());
    for dir in ["tmp", "usr", "usr/local", "usr/local/bin"] {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Directory);
        header.set_mode(if dir == "tmp" { 0o1777 } else { 0o755 });
        header.set_size(0);
        header.set_mtime(0);
        rootfs.append_data(&mut header, dir, std::io::empty())?;
    }
    let cli_dir = CLI_DIR.trim_start_matches('/');
    let files = [(SETUP_WORKER.trim_start_matches('/').to_string(), worker)]
        .into_iter()
        .chain(
            clis.iter()
                .map(|(file, data)| (format!("{cli_dir}/{file}"), &data[..])),
        );
    for (path, data) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(data.len() as u64);
        header.set_mode(0o755);
        header.set_mtime(0);
        rootfs.append_data(&mut header, path, data)?;
    }
    let body = rootfs.into_inner()?;
    let (repo, tag) = reference.rsplit_once(':').unwrap_or((reference, "latest"));
    let ours = env!("CARGO_PKG_VERSION");
    let options = CreateImageOptionsBuilder::new()
        .from_src("-")
        .repo(repo)
        .tag(tag)
        .changes(vec![
            format!("LABEL {VERSION_LABEL}={ours} {WORKER_LABEL}={SETUP_WORKER}"),
            format!("CMD [\"{SETUP_WORKER}\", \"idle\"]"),
            format!("USER {SETUP_USER}"),
            "ENV HOME=/tmp".to_string(),
            format!("ENV PATH={CLI_DIR}"),
        ])
        .build();
    let mut stream =
        docker.create_image(Some(options), Some(bollard::body_full(body.into())), None);
    while let Some(item) = stream.next().await {
        let info = item.with_context(|| format!("importing {reference}"))?;
        if let Some(detail) = info.error_detail.and_then(|d| d.message) {
            bail!("importing {reference}: {detail}");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_numeric_users_are_resolved_by_mst() {
        assert_eq!(numeric_owner(SETUP_USER), Some((65532, 65532)));
        assert_eq!(numeric_owner("1000"), Some((1000, 0)));
        assert_eq!(numeric_owner(""), None);
        assert_eq!(numeric_owner("app"), None);
        assert_eq!(numeric_owner("app:1000"), None);
    }

    #[test]
    fn agent_clis_are_copied_onto_the_path_before_the_image_drops_root() {
        assert_eq!(dockerfile(false), DOCKERFILE);
        let with = dockerfile(true);
        let copy = with.find("COPY agent-clis/ /usr/local/bin/").expect(&with);
        let path = with.find("ENV PATH=/usr/local/bin:${PATH}").expect(&with);
        let user = with.find("USER ${MST_USER}").expect(&with);
        assert!(copy < path && path < user, "{with}");
    }
}
