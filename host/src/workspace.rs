//! Workspaces: the files a task lays in front of its agent (a repository with a bug, a data
//! directory), packed once on the host into a plain tar named by its digest, shipped once per
//! shard in its bundle, and unpacked fresh into every trial's work directory before its client
//! starts (docs/config.md, "Workspaces").
//!
//! Whatever a workspace comes from (a directory, a `.tar`/`.tar.gz`, a git commit), it is read
//! as hostile: only regular files, directories and links that stay inside pass; a `..` or
//! absolute name, a link pointing out, a device, a fifo, a hard link, a name given twice, more
//! than [`MAX_ENTRIES`] entries or [`MAX_BYTES`] bytes (a bomb) refuse it before any trial.
//! The packed archive holds nothing else (no owners, no times), so the same files give the
//! same digest wherever they were packed.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

/// The most bytes of file contents one workspace may hold.
pub const MAX_BYTES: u64 = 1 << 30;

/// The most entries (files, directories, links) one workspace may hold.
pub const MAX_ENTRIES: u64 = 100_000;

/// How long one `git` step may take (a fetch over a slow network included).
const GIT_LIMIT: Duration = Duration::from_secs(600);

/// Where a workspace's files come from.
#[derive(Debug, Clone, Copy)]
pub enum Source<'a> {
    /// A directory, walked without following links.
    Dir(&'a Path),
    /// A tar archive, compressed with gzip when its name ends in `.gz` or `.tgz`.
    Tar(&'a Path),
    /// A git commit: `rev` (a commit, branch or tag) of `repo` (a path or any URL git fetches).
    Git { repo: &'a str, rev: &'a str },
}

/// A packed workspace: its archive is `<digest>.tar` ([`archive_name`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Packed {
    /// `sha256:` and the hex SHA-256 of the packed archive.
    pub digest: String,
    /// Regular files in it.
    pub files: u64,
    /// Bytes of their contents.
    pub bytes: u64,
    /// The commit a git workspace was packed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// What `run.json` records of one workspace of a run.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkspaceRecord {
    /// Where it came from, as resolved: a path, or a repository and the rev asked for.
    pub source: String,
    #[serde(flatten)]
    pub packed: Packed,
}

/// The archive's file name for `digest`, in a run's and a bundle's `workspaces/`.
pub fn archive_name(digest: &str) -> String {
    format!("{}.tar", digest.trim_start_matches("sha256:"))
}

/// Packs `source` into `dir`/[`archive_name`]: every entry checked, nothing written for a
/// source that is refused. Errors say what was refused and where.
pub fn pack(source: Source<'_>, dir: &Path) -> Result<Packed> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let staged = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    let mut packer = Packer::new(staged.reopen()?);
    let commit = match source {
        Source::Dir(root) => {
            packer.add_dir(root, Path::new(""))?;
            None
        }
        Source::Tar(path) => {
            packer.add_tar(open_tar(path)?, &path.display().to_string())?;
            None
        }
        Source::Git { repo, rev } => Some(packer.add_git(repo, rev)?),
    };
    let packed = packer.finish(commit)?;
    let path = dir.join(archive_name(&packed.digest));
    staged
        .persist(&path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(packed)
}

/// Unpacks the archive at `archive` into `into` (a trial's fresh work directory), checking
/// each entry again: the archive lies on a machine, where it is only as safe as the machine.
pub fn unpack(archive: &Path, into: &Path) -> Result<()> {
    let file = std::fs::File::open(archive)
        .with_context(|| format!("cannot open the workspace {}", archive.display()))?;
    unpack_from(std::io::BufReader::new(file), into, false)
        .map(drop)
        .with_context(|| format!("cannot unpack {}", archive.display()))
}

/// Unpacks the tar `archive` over `into`, a directory an agent worked in (and has left):
/// whatever it left where an entry goes (a link, a file where a directory goes, a directory
/// where a file goes) is removed first, so nothing is written through a link it planted.
/// Returns the names laid, in order, for [`remove_laid`].
pub fn lay_over(archive: impl Read, into: &Path) -> Result<Vec<PathBuf>> {
    unpack_from(archive, into, true)
}

/// Removes from `dir` what [`lay_over`] laid there (`laid`): its files and links, then its
/// directories that are empty once they are gone. Errors are ignored: what is left is the
/// agent's directory's to lose.
pub fn remove_laid(dir: &Path, laid: &[PathBuf]) {
    for name in laid.iter().rev() {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if meta.is_dir() => drop(std::fs::remove_dir(&path)),
            Ok(_) => drop(std::fs::remove_file(&path)),
            Err(_) => {}
        }
    }
}

/// Unpacks `archive` into `into`, each entry checked; with `clear`, what lies in an entry's
/// way is removed first. The names unpacked, in order.
fn unpack_from(archive: impl Read, into: &Path, clear: bool) -> Result<Vec<PathBuf>> {
    let mut tar = tar::Archive::new(archive);
    let mut seen = Seen::default();
    let mut laid = Vec::new();
    for entry in tar.entries()? {
        let mut entry = entry?;
        let Some((name, kind)) = checked(&entry, &mut seen)? else {
            continue;
        };
        if clear {
            clear_the_way(into, &name, &kind)?;
        }
        entry.set_preserve_mtime(false);
        entry.unpack_in(into)?;
        laid.push(name);
    }
    Ok(laid)
}

/// Removes what lies in the way of entry `name` of kind `kind` below `root`: a link or a file
/// where one of its parent directories goes, and at its own place a link, or a directory where
/// a file or link goes (or the reverse).
fn clear_the_way(root: &Path, name: &Path, kind: &Kind) -> Result<()> {
    let mut at = root.to_path_buf();
    let parts: Vec<_> = name.components().collect();
    for (index, part) in parts.iter().enumerate() {
        at.push(part);
        let Ok(meta) = std::fs::symlink_metadata(&at) else {
            return Ok(()); // nothing further down either
        };
        let last = index + 1 == parts.len();
        let wanted_dir = !last || matches!(kind, Kind::Dir);
        let in_the_way = meta.file_type().is_symlink()
            || meta.is_dir() != wanted_dir
            || (last && matches!(kind, Kind::Link(_)));
        if !in_the_way {
            continue;
        }
        let removed = match meta.is_dir() && !meta.file_type().is_symlink() {
            true => std::fs::remove_dir_all(&at),
            false => std::fs::remove_file(&at),
        };
        removed.with_context(|| format!("cannot remove {}, which is in the way", at.display()))?;
        return Ok(());
    }
    Ok(())
}

/// What a checked entry is.
enum Kind {
    File,
    Dir,
    Link(PathBuf),
}

/// The names an archive held so far and its totals, against the caps.
#[derive(Default)]
struct Seen {
    names: BTreeSet<PathBuf>,
    files: u64,
    bytes: u64,
}

impl Seen {
    /// Counts `name` (and `bytes` of contents); an error past a cap or for a name given twice.
    fn add(&mut self, name: &Path, bytes: Option<u64>) -> Result<()> {
        if self.names.len() as u64 >= MAX_ENTRIES {
            bail!("more than {MAX_ENTRIES} entries");
        }
        if !self.names.insert(name.to_path_buf()) {
            bail!("`{}` appears twice", name.display());
        }
        if let Some(bytes) = bytes {
            self.files += 1;
            self.bytes = self.bytes.saturating_add(bytes);
            if self.bytes > MAX_BYTES {
                bail!("more than {MAX_BYTES} bytes of files (a bomb?)");
            }
        }
        Ok(())
    }
}

/// `entry`'s plain relative name and kind, `None` for one to skip (the root, a pax global
/// header), or why it is refused.
fn checked<R: Read>(entry: &tar::Entry<'_, R>, seen: &mut Seen) -> Result<Option<(PathBuf, Kind)>> {
    use tar::EntryType;
    let raw = entry.path()?;
    let Some(name) = plain_name(&raw) else {
        bail!(
            "entry `{}` leaves the workspace (`..` or an absolute name)",
            raw.display()
        );
    };
    let kind = match entry.header().entry_type() {
        EntryType::XGlobalHeader => return Ok(None),
        _ if name.as_os_str().is_empty() => return Ok(None),
        EntryType::Regular | EntryType::Continuous => Kind::File,
        EntryType::Directory => Kind::Dir,
        EntryType::Symlink => {
            let target = entry
                .link_name()?
                .with_context(|| format!("link `{}` has no target", name.display()))?;
            Kind::Link(target.into_owned())
        }
        EntryType::Link => bail!("`{}` is a hard link", name.display()),
        other => bail!(
            "`{}` is a {other:?}, not a file, directory or link",
            name.display()
        ),
    };
    if let Kind::Link(target) = &kind {
        check_link(&name, target)?;
    }
    let bytes = matches!(kind, Kind::File).then(|| entry.size());
    seen.add(&name, bytes)
        .with_context(|| format!("at `{}`", name.display()))?;
    Ok(Some((name, kind)))
}

/// `raw` without `./` and trailing `/`, when it names something inside the root (the root
/// itself is empty); `None` for a name with `..`, a root or a prefix.
fn plain_name(raw: &Path) -> Option<PathBuf> {
    let mut name = PathBuf::new();
    for part in raw.components() {
        match part {
            Component::Normal(part) => name.push(part),
            Component::CurDir => {}
            _ => return None,
        }
    }
    Some(name)
}

/// Refuses a link at `name` whose `target` is absolute or climbs out of the workspace.
fn check_link(name: &Path, target: &Path) -> Result<()> {
    let mut depth = name.components().count() as i64 - 1;
    for part in target.components() {
        match part {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => depth -= 1,
            Component::RootDir | Component::Prefix(_) => {
                bail!(
                    "link `{}` points to the absolute `{}`",
                    name.display(),
                    target.display()
                )
            }
        }
        if depth < 0 {
            bail!(
                "link `{}` points out of the workspace (`{}`)",
                name.display(),
                target.display()
            );
        }
    }
    Ok(())
}

/// `path` as a tar stream, gunzipped when its name says so.
fn open_tar(path: &Path) -> Result<Box<dyn Read>> {
    let file = std::fs::File::open(path)
        .with_context(|| format!("cannot open the workspace archive {}", path.display()))?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let reader = std::io::BufReader::new(file);
    Ok(match name.ends_with(".gz") || name.ends_with(".tgz") {
        true => Box::new(flate2::read::GzDecoder::new(reader)),
        false => Box::new(reader),
    })
}

/// A writer that hashes what passes through it.
struct Hashing<W> {
    inner: W,
    hash: Sha256,
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let written = self.inner.write(bytes)?;
        self.hash.update(&bytes[..written]);
        Ok(written)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes the packed archive: checked entries only, each with a plain header.
struct Packer {
    out: tar::Builder<Hashing<std::io::BufWriter<std::fs::File>>>,
    seen: Seen,
}

impl Packer {
    fn new(file: std::fs::File) -> Self {
        let hashing = Hashing {
            inner: std::io::BufWriter::new(file),
            hash: Sha256::new(),
        };
        Packer {
            out: tar::Builder::new(hashing),
            seen: Seen::default(),
        }
    }

    /// Adds the tree below `root`, `at` its name in the archive, in name order.
    fn add_dir(&mut self, root: &Path, at: &Path) -> Result<()> {
        let dir = root.join(at);
        let mut children: Vec<_> = std::fs::read_dir(&dir)
            .with_context(|| format!("cannot read the workspace directory {}", dir.display()))?
            .collect::<std::io::Result<_>>()?;
        children.sort_by_key(|c| c.file_name());
        for child in children {
            let name = at.join(child.file_name());
            let path = child.path();
            let meta = std::fs::symlink_metadata(&path)?;
            let refused = |why: anyhow::Error| why.context(format!("in {}", root.display()));
            if meta.is_dir() {
                self.add(&name, Kind::Dir, 0o755, &mut std::io::empty(), 0)
                    .map_err(refused)?;
                self.add_dir(root, &name)?;
            } else if meta.is_symlink() {
                let target = std::fs::read_link(&path)?;
                self.add(&name, Kind::Link(target), 0o777, &mut std::io::empty(), 0)
                    .map_err(refused)?;
            } else if meta.is_file() {
                let mut file = std::fs::File::open(&path)
                    .with_context(|| format!("cannot read {}", path.display()))?;
                let mode = std::os::unix::fs::PermissionsExt::mode(&meta.permissions());
                self.add(&name, Kind::File, mode, &mut file, meta.len())
                    .map_err(refused)?;
            } else {
                bail!(
                    "{} is not a file, directory or link: a workspace holds nothing else",
                    path.display()
                );
            }
        }
        Ok(())
    }

    /// Adds every entry of the tar stream `input`, named `label` in errors.
    fn add_tar(&mut self, input: impl Read, label: &str) -> Result<()> {
        let mut tar = tar::Archive::new(input);
        let refused = |why: anyhow::Error| why.context(format!("workspace archive {label}"));
        for entry in tar.entries().map_err(|e| refused(e.into()))? {
            let mut entry = entry.map_err(|e| refused(e.into()))?;
            // Checked on its own to count it; `add` counts again in its own tally.
            let Some((name, kind)) = checked(&entry, &mut Seen::default()).map_err(refused)? else {
                continue;
            };
            let mode = entry.header().mode().unwrap_or(0o644);
            let size = entry.size();
            self.add(&name, kind, mode, &mut entry, size)
                .map_err(refused)?;
        }
        Ok(())
    }

    /// Adds `rev` of the git repository `repo`; its commit.
    fn add_git(&mut self, repo: &str, rev: &str) -> Result<String> {
        let scratch = tempfile::tempdir()?;
        let git_dir = scratch.path().join("repo.git");
        let git = |args: &[&str]| run_git(&git_dir, args);
        run_git(scratch.path(), &["init", "-q", "--bare", "repo.git"])?;
        // One commit if the server gives it by name; otherwise every branch and tag.
        let wanted = match git(&["fetch", "-q", "--no-tags", "--depth=1", "--", repo, rev]) {
            Ok(_) => "FETCH_HEAD".to_string(),
            Err(_) => {
                git(&[
                    "fetch",
                    "-q",
                    "--",
                    repo,
                    "+refs/heads/*:refs/heads/*",
                    "+refs/tags/*:refs/tags/*",
                ])
                .with_context(|| format!("workspace {{\"git\": {repo:?}}}: cannot fetch it"))?;
                rev.to_string()
            }
        };
        let commit = git(&[
            "rev-parse",
            "--verify",
            "--end-of-options",
            &format!("{wanted}^{{commit}}"),
        ])
        .with_context(|| format!("workspace {{\"git\": {repo:?}}}: no commit `{rev}` in it"))?;
        let commit = String::from_utf8_lossy(&commit).trim().to_string();
        let tar_path = scratch.path().join("tree.tar");
        let tar_arg = format!("--output={}", tar_path.display());
        git(&["archive", "--format=tar", &tar_arg, &commit])?;
        self.add_tar(open_tar(&tar_path)?, &format!("{repo} at {commit}"))?;
        Ok(commit)
    }

    /// Adds one entry, checked; `contents` must give `size` bytes for a file.
    fn add(
        &mut self,
        name: &Path,
        kind: Kind,
        mode: u32,
        contents: &mut dyn Read,
        size: u64,
    ) -> Result<()> {
        if let Kind::Link(target) = &kind {
            check_link(name, target)?;
        }
        self.seen
            .add(name, matches!(kind, Kind::File).then_some(size))?;
        let mut header = tar::Header::new_gnu();
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        match kind {
            Kind::File => {
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(if mode & 0o111 != 0 { 0o755 } else { 0o644 });
                header.set_size(size);
                // Exactly `size` bytes, however long the source claims to be.
                let mut limited = contents.take(size);
                self.out.append_data(&mut header, name, &mut limited)?;
            }
            Kind::Dir => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(0o755);
                header.set_size(0);
                self.out.append_data(&mut header, name, std::io::empty())?;
            }
            Kind::Link(target) => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                self.out.append_link(&mut header, name, target)?;
            }
        }
        Ok(())
    }

    fn finish(self, commit: Option<String>) -> Result<Packed> {
        let Packer { out, seen } = self;
        let mut hashing = out.into_inner()?;
        hashing.flush()?;
        Ok(Packed {
            digest: format!("sha256:{}", hex::encode(hashing.hash.finalize())),
            files: seen.files,
            bytes: seen.bytes,
            commit,
        })
    }
}

/// Runs `git args…` in `dir` with no configuration but the user's and no prompt; its stdout.
fn run_git(dir: &Path, args: &[&str]) -> Result<Vec<u8>> {
    let mut command = std::process::Command::new("git");
    command
        .args(args)
        .current_dir(dir)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_CONFIG_NOSYSTEM", "1");
    let finished = crate::process::run_to_end(&mut command, Vec::new(), GIT_LIMIT, 1 << 20)
        .map_err(|why| {
            anyhow::anyhow!("cannot run `git {}`: {why} (is git installed?)", args[0])
        })?;
    if finished.status.and_then(|s| s.code()) != Some(0) {
        bail!(
            "`git {}` failed: {}",
            args[0],
            String::from_utf8_lossy(&finished.stderr).trim()
        );
    }
    Ok(finished.stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry as written raw: name, type, contents (a link's target).
    type RawEntry<'a> = (&'a str, tar::EntryType, &'a str);

    /// A tar archive holding `entries` as given (names and links unchecked).
    fn raw_tar(entries: &[RawEntry<'_>]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, data) in entries {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(*kind);
            header.set_mode(0o644);
            // Written raw, so that names `tar` itself would refuse get in.
            let bytes = name.as_bytes();
            header.as_old_mut().name[..bytes.len()].copy_from_slice(bytes);
            if *kind == tar::EntryType::Symlink {
                header.set_link_name(data).unwrap();
                header.set_size(0);
                header.set_cksum();
                builder.append(&header, std::io::empty()).unwrap();
            } else {
                header.set_size(data.len() as u64);
                header.set_cksum();
                builder.append(&header, data.as_bytes()).unwrap();
            }
        }
        builder.into_inner().unwrap()
    }

    fn pack_tar(bytes: &[u8]) -> Result<Packed> {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("input.tar");
        std::fs::write(&input, bytes).unwrap();
        let out = dir.path().join("out");
        let packed = pack(Source::Tar(&input), &out);
        let written: Vec<_> = std::fs::read_dir(&out).unwrap().flatten().collect();
        // A refused source leaves nothing behind, an accepted one its archive only.
        assert_eq!(written.len(), usize::from(packed.is_ok()));
        packed
    }

    #[test]
    fn a_directory_packs_to_the_same_digest_wherever_it_lies_and_unpacks_whole() {
        let made = |at: &Path| {
            std::fs::create_dir_all(at.join("src")).unwrap();
            std::fs::write(at.join("src/lib.py"), "x = 1\n").unwrap();
            std::fs::write(at.join("run.sh"), "#!/bin/sh\n").unwrap();
            let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
            std::fs::set_permissions(at.join("run.sh"), mode).unwrap();
            std::os::unix::fs::symlink("src/lib.py", at.join("lib.py")).unwrap();
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        made(a.path());
        made(b.path());
        let out = tempfile::tempdir().unwrap();
        let first = pack(Source::Dir(a.path()), out.path()).unwrap();
        let second = pack(Source::Dir(b.path()), out.path()).unwrap();
        assert_eq!(first, second);
        assert_eq!((first.files, first.bytes), (2, 16));
        let into = tempfile::tempdir().unwrap();
        unpack(&out.path().join(archive_name(&first.digest)), into.path()).unwrap();
        assert_eq!(
            std::fs::read_to_string(into.path().join("lib.py")).unwrap(),
            "x = 1\n"
        );
        let mode = std::fs::metadata(into.path().join("run.sh"))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o111,
            0o111
        );
    }

    #[test]
    fn a_hostile_archive_is_refused_naming_the_entry() {
        use tar::EntryType::{Block, Directory, Fifo, Link, Regular, Symlink};
        let cases: &[(&[RawEntry<'_>], &str)] = &[
            (&[("../evil", Regular, "x")], "leaves the workspace"),
            (&[("/etc/evil", Regular, "x")], "leaves the workspace"),
            (&[("a/../../evil", Regular, "x")], "leaves the workspace"),
            (&[("out", Symlink, "/etc")], "absolute"),
            (
                &[("d", Directory, ""), ("d/out", Symlink, "../../x")],
                "points out",
            ),
            (&[("dev", Block, "")], "not a file, directory or link"),
            (&[("pipe", Fifo, "")], "not a file, directory or link"),
            (&[("a", Regular, "x"), ("b", Link, "a")], "hard link"),
            (&[("a", Regular, "x"), ("a", Symlink, "b")], "appears twice"),
        ];
        for (entries, why) in cases {
            let error = format!("{:#}", pack_tar(&raw_tar(entries)).unwrap_err());
            assert!(error.contains(why), "{entries:?}: {error}");
            assert!(error.contains("workspace archive"), "{error}");
        }
        // A link that stays inside is fine.
        let inside = [
            ("d", Directory, ""),
            ("d/up", Symlink, "../f"),
            ("f", Regular, "x"),
        ];
        assert_eq!(pack_tar(&raw_tar(&inside)).unwrap().files, 1);
    }

    #[test]
    fn hidden_files_laid_over_an_agents_directory_never_go_through_what_it_planted() {
        let files = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(files.path().join("tests")).unwrap();
        std::fs::write(files.path().join("tests/test_x.py"), "real\n").unwrap();
        std::fs::write(files.path().join("run.sh"), "real\n").unwrap();
        let out = tempfile::tempdir().unwrap();
        let packed = pack(Source::Dir(files.path()), out.path()).unwrap();
        let archive = std::fs::read(out.path().join(archive_name(&packed.digest))).unwrap();

        let (work, elsewhere) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let outside = elsewhere.path().join("victim");
        std::fs::write(&outside, "untouched\n").unwrap();
        // The agent made `tests` a link out, and `run.sh` a link to a file outside.
        std::os::unix::fs::symlink(elsewhere.path(), work.path().join("tests")).unwrap();
        std::os::unix::fs::symlink(&outside, work.path().join("run.sh")).unwrap();
        std::fs::write(work.path().join("kept.py"), "agent's\n").unwrap();
        let laid = lay_over(&archive[..], work.path()).unwrap();

        let read = |name: &str| std::fs::read_to_string(work.path().join(name)).unwrap();
        assert_eq!(read("tests/test_x.py"), "real\n");
        assert_eq!(read("run.sh"), "real\n");
        assert_eq!(read("kept.py"), "agent's\n");
        assert!(!std::fs::symlink_metadata(work.path().join("tests"))
            .unwrap()
            .is_symlink());
        assert_eq!(std::fs::read_to_string(&outside).unwrap(), "untouched\n");
        assert!(!elsewhere.path().join("test_x.py").exists());
        // Once its check ran, what was laid goes, and the agent's own files stay.
        remove_laid(work.path(), &laid);
        assert!(!work.path().join("tests").exists() && !work.path().join("run.sh").exists());
        assert_eq!(read("kept.py"), "agent's\n");
    }

    #[test]
    fn a_gzip_bomb_is_refused_once_its_files_pass_the_cap() {
        // A header claiming more than the cap: refused before a byte of it is read.
        let mut header = tar::Header::new_gnu();
        header.set_path("big").unwrap();
        header.set_size(MAX_BYTES + 1);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend(std::iter::repeat_n(0u8, 4096));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&bytes).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("bomb.tar.gz");
        std::fs::write(&input, gz.finish().unwrap()).unwrap();
        let error = format!(
            "{:#}",
            pack(Source::Tar(&input), &dir.path().join("out")).unwrap_err()
        );
        assert!(error.contains("bytes of files (a bomb?)"), "{error}");
    }

    #[test]
    fn a_git_workspace_is_the_commit_named_and_records_it() {
        let repo = tempfile::tempdir().unwrap();
        let git = |args: &[&str]| run_git(repo.path(), args).unwrap();
        git(&["init", "-q", "-b", "main"]);
        std::fs::write(repo.path().join("bug.py"), "wrong\n").unwrap();
        git(&["add", "bug.py"]);
        let who = ["-c", "user.name=t", "-c", "user.email=t@t"];
        git(&[&who[..], &["commit", "-q", "-m", "one"]].concat());
        let first = String::from_utf8(git(&["rev-parse", "HEAD"])).unwrap();
        std::fs::write(repo.path().join("bug.py"), "fixed\n").unwrap();
        git(&[&who[..], &["commit", "-q", "-am", "two"]].concat());
        let out = tempfile::tempdir().unwrap();
        let path = repo.path().to_str().unwrap();
        for rev in [first.trim(), "main~1"] {
            let packed = pack(Source::Git { repo: path, rev }, out.path()).unwrap();
            assert_eq!(packed.commit.as_deref(), Some(first.trim()));
            let into = tempfile::tempdir().unwrap();
            unpack(&out.path().join(archive_name(&packed.digest)), into.path()).unwrap();
            assert_eq!(
                std::fs::read_to_string(into.path().join("bug.py")).unwrap(),
                "wrong\n"
            );
        }
        let missing = pack(
            Source::Git {
                repo: path,
                rev: "nope",
            },
            out.path(),
        )
        .unwrap_err();
        assert!(
            format!("{missing:#}").contains("no commit `nope`"),
            "{missing:#}"
        );
    }
}
