//! Files in and out of machines as tar streams (Docker's archive API, a command channel's put
//! and get programs). What comes back is hostile: only the wanted regular files are accepted,
//! never a link, device or FIFO, and never more than the cap is read.

use super::channel::Refused;
use anyhow::{bail, Context, Result};
use std::io::Read;
use std::path::Path;

/// A tar of the local directory `src`, placed at `dest` (a relative path) inside the archive,
/// with every parent directory of `dest` included so the upload creates them.
pub fn tar_directory(src: &Path, dest: &str) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let mut prefix = std::path::PathBuf::new();
    for part in Path::new(dest).components() {
        prefix.push(part);
        append_dir(&mut builder, &prefix)?;
    }
    builder
        .append_dir_all(dest, src)
        .with_context(|| format!("cannot pack {}", src.display()))?;
    Ok(builder.into_inner()?)
}

/// The tar `archive` with every entry owned by `uid:gid` (for a machine that unpacks it as
/// root and keeps the owners it is given).
pub fn owned_by(archive: &[u8], uid: u64, gid: u64) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut entries = tar::Archive::new(archive);
    for entry in entries.entries().context("not a tar stream")? {
        let mut entry = entry.context("unreadable tar entry")?;
        let mut header = entry.header().clone();
        header.set_uid(uid);
        header.set_gid(gid);
        let path = entry.path()?.into_owned();
        match entry.link_name()? {
            Some(target) => {
                let target = target.into_owned();
                builder.append_link(&mut header, &path, &target)?
            }
            None => builder.append_data(&mut header, &path, &mut entry)?,
        }
    }
    Ok(builder.into_inner()?)
}

/// A tar holding one empty directory `path` with `mode`.
pub fn tar_dir(path: &str, mode: u32) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(mode);
    header.set_size(0);
    header.set_mtime(0);
    builder.append_data(&mut header, path, std::io::empty())?;
    Ok(builder.into_inner()?)
}

/// A tar holding one file at `path` with `mode`, and its parent directories.
pub fn tar_file(path: &str, contents: &[u8], mode: u32) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut prefix = std::path::PathBuf::new();
    let parent = Path::new(path).parent().unwrap_or(Path::new(""));
    for part in parent.components() {
        prefix.push(part);
        append_dir(&mut builder, &prefix)?;
    }
    let mut header = tar::Header::new_gnu();
    header.set_size(contents.len() as u64);
    header.set_mode(mode);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    builder.append_data(&mut header, path, contents)?;
    Ok(builder.into_inner()?)
}

fn append_dir(builder: &mut tar::Builder<Vec<u8>>, path: &Path) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    header.set_mtime(0);
    builder.append_data(&mut header, path, std::io::empty())?;
    Ok(())
}

/// The one regular file named `name` in the tar stream `archive`, at most `cap` bytes.
pub fn single_file(archive: impl Read, name: &str, cap: u64) -> Result<Vec<u8>> {
    let mut archive = tar::Archive::new(archive);
    let mut entries = archive.entries().context("not a tar stream")?;
    let entry = match entries.next() {
        Some(entry) => entry.context("unreadable tar entry")?,
        None => bail!("the machine sent an empty archive"),
    };
    let path = entry.path().context("unreadable path")?.into_owned();
    if path != Path::new(name) {
        bail!("the machine sent {} instead of {name}", path.display());
    }
    read_regular(entry, name, cap)
}

/// Reads the files of `wanted` (relative paths as the archive names them) out of the tar
/// stream `archive`, calling `found(index, contents)` for each as it streams past; entries not
/// wanted are skipped. Returns the indexes never found.
pub fn wanted_files(
    archive: impl Read,
    wanted: &[&str],
    cap: u64,
    mut found: impl FnMut(usize, Result<Vec<u8>>),
) -> Result<Vec<usize>> {
    let mut left: std::collections::BTreeMap<&Path, usize> = wanted
        .iter()
        .enumerate()
        .map(|(i, w)| (Path::new(*w), i))
        .collect();
    let mut archive = tar::Archive::new(archive);
    for entry in archive.entries().context("not a tar stream")? {
        let entry = entry.context("unreadable tar entry")?;
        let path = entry.path().context("unreadable path")?.into_owned();
        if let Some(index) = left.remove(path.as_path()) {
            found(index, read_regular(entry, wanted[index], cap));
        }
        if left.is_empty() {
            break;
        }
    }
    Ok(left.into_values().collect())
}

/// The deepest directory holding every one of `sources` (relative paths, `/`-separated):
/// what one archive request fetches for a batch. A batch of traces shares `results`; one
/// trial's artefacts share their own directory, so a request never streams the other trials'.
/// It stops above any name with characters outside `[A-Za-z0-9._%-]` (the names mst makes),
/// since a channel's get program may pass it through a shell.
pub fn common_dir(sources: &[&str]) -> String {
    let mut common: Option<Vec<&str>> = None;
    for source in sources {
        let mut parts: Vec<&str> = source.split('/').collect();
        parts.pop();
        common = Some(match common {
            None => parts,
            Some(so_far) => so_far
                .into_iter()
                .zip(parts)
                .take_while(|(a, b)| a == b)
                .map(|(a, _)| a)
                .collect(),
        });
    }
    let plain = |part: &&str| {
        !part.is_empty()
            && part
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'%' | b'-'))
    };
    let common = common.unwrap_or_default();
    let plain_prefix: Vec<&str> = common.iter().copied().take_while(plain).collect();
    plain_prefix.join("/")
}

/// How many bytes of archive a batch of `files` copies may stream: the batch may pass other
/// files, so the whole stream is bounded, not just each file.
pub fn batch_limit(files: usize, cap: u64) -> u64 {
    cap.saturating_mul(files as u64 + 4) + (64 << 20)
}

/// Copies `files` (pairs of a path relative to the machine's work directory, as the archive
/// names it, and a local destination) out of the tar stream `archive`, each written atomically;
/// one result per file. `machine` names the machine in errors.
pub fn copy_wanted(
    archive: impl Read,
    files: &[(String, std::path::PathBuf)],
    cap: u64,
    machine: &str,
) -> Vec<Result<()>> {
    let wanted: Vec<&str> = files.iter().map(|(src, _)| src.as_str()).collect();
    if let Some(bad) = wanted.iter().find(|w| !crate::files::is_plain_relative(w)) {
        return files
            .iter()
            .map(|_| Err(anyhow::anyhow!("refusing machine path {bad:?}")))
            .collect();
    }
    let mut results: Vec<Option<Result<()>>> = files.iter().map(|_| None).collect();
    let outcome = wanted_files(archive, &wanted, cap, |index, contents| {
        results[index] =
            Some(contents.and_then(|bytes| crate::files::write_atomic(&files[index].1, &bytes)));
    });
    let (why, missing) = match outcome {
        Ok(missing) => ("no such file on the machine".to_string(), missing),
        Err(e) => (format!("{e:#}"), Vec::new()),
    };
    for index in missing {
        results[index] = Some(Err(anyhow::anyhow!("{}: {why}", wanted[index])));
    }
    results
        .into_iter()
        .zip(&wanted)
        .map(|(result, name)| {
            result.unwrap_or_else(|| {
                Err(anyhow::anyhow!("copying {name} back from {machine}: {why}"))
            })
        })
        .collect()
}

/// The contents of `entry` (called `name` in messages) if it is a regular file within `cap`;
/// anything else is [`Refused`].
fn read_regular(mut entry: tar::Entry<'_, impl Read>, name: &str, cap: u64) -> Result<Vec<u8>> {
    let refused = |why: String| Err(Refused(why).into());
    match entry.header().entry_type() {
        tar::EntryType::Regular | tar::EntryType::Continuous => {}
        tar::EntryType::Symlink | tar::EntryType::Link => {
            return refused(format!(
                "{name} is a link on the machine; links are never followed"
            ))
        }
        tar::EntryType::Fifo => {
            return refused(format!("{name} is a FIFO on the machine, not a file"))
        }
        tar::EntryType::Char | tar::EntryType::Block => {
            return refused(format!("{name} is a device on the machine, not a file"))
        }
        other => {
            return refused(format!(
                "{name} is not a regular file on the machine ({other:?})"
            ))
        }
    }
    let size = entry.header().size().context("unreadable size")?;
    if size > cap {
        return refused(format!("{name} is {size} bytes, over the {cap}-byte cap"));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    (&mut entry).take(cap + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 != size {
        bail!("{name}: the archive's size and contents disagree");
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_fetched_from_the_deepest_directory_it_shares() {
        assert_eq!(
            common_dir(&["results/a/c/0.json", "results/b/c/1.json"]),
            "results"
        );
        assert_eq!(
            common_dir(&[
                "artifacts/v/c/0/x.txt",
                "artifacts/v/c/0/mst-diagnosis/y.txt"
            ]),
            "artifacts/v/c/0"
        );
        assert_eq!(
            common_dir(&["artifacts/v/c/0/my logs/a", "artifacts/v/c/0/my logs/b"]),
            "artifacts/v/c/0"
        );
        assert_eq!(common_dir(&["top.json"]), "");
        assert_eq!(common_dir(&[]), "");
    }

    fn archive_with(kind: tar::EntryType, name: &str, body: &[u8]) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        if kind == tar::EntryType::Symlink {
            header.set_link_name("/etc/shadow").unwrap();
        }
        builder.append_data(&mut header, name, body).unwrap();
        builder.into_inner().unwrap()
    }

    #[test]
    fn only_one_capped_regular_file_comes_back() {
        let ok = archive_with(tar::EntryType::Regular, "t.json", b"{}");
        assert_eq!(single_file(&ok[..], "t.json", 10).unwrap(), b"{}");
        let err = single_file(&ok[..], "t.json", 1).unwrap_err();
        assert!(err.to_string().contains("cap"), "{err}");
        let err = single_file(&ok[..], "other.json", 10).unwrap_err();
        assert!(err.to_string().contains("instead of"), "{err}");
        for (kind, says) in [
            (tar::EntryType::Symlink, "link"),
            (tar::EntryType::Fifo, "FIFO"),
            (tar::EntryType::Char, "device"),
            (tar::EntryType::Directory, "not a regular file"),
        ] {
            let archive = archive_with(kind, "t.json", b"");
            let err = single_file(&archive[..], "t.json", 10).unwrap_err();
            assert!(err.to_string().contains(says), "{kind:?}: {err}");
        }
        assert!(single_file(&b"garbage"[..], "t.json", 10).is_err());
    }

    #[test]
    fn wanted_files_are_picked_out_of_a_directory_archive() {
        let mut builder = tar::Builder::new(Vec::new());
        for (name, kind, body) in [
            ("results/a.json", tar::EntryType::Regular, &b"{}"[..]),
            ("results/other.json", tar::EntryType::Regular, &b"[]"[..]),
            ("results/link.json", tar::EntryType::Symlink, &b""[..]),
        ] {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(kind);
            header.set_size(body.len() as u64);
            if kind == tar::EntryType::Symlink {
                header.set_link_name("/etc/passwd").unwrap();
            }
            builder.append_data(&mut header, name, body).unwrap();
        }
        let archive = builder.into_inner().unwrap();
        let wanted = ["results/link.json", "results/a.json", "results/gone.json"];
        let mut got = Vec::new();
        let missing = wanted_files(&archive[..], &wanted, 10, |i, r| got.push((i, r))).unwrap();
        assert_eq!(missing, [2]);
        assert_eq!(got.len(), 2);
        assert_eq!(got[0].0, 1);
        assert_eq!(got[0].1.as_ref().unwrap(), b"{}");
        assert!(got[1].1.as_ref().unwrap_err().to_string().contains("link"));
    }

    #[test]
    fn uploads_carry_their_parent_directories() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("bundle.json"), "{}").unwrap();
        std::os::unix::fs::symlink("bundle.json", dir.path().join("link")).unwrap();
        // Given to the machine's user (7:8), links kept as links.
        let tar = owned_by(&tar_directory(dir.path(), "mst-work/bundle").unwrap(), 7, 8).unwrap();
        let mut names = Vec::new();
        for entry in tar::Archive::new(&tar[..]).entries().unwrap() {
            let entry = entry.unwrap();
            let header = entry.header();
            assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (7, 8));
            let name = entry.path().unwrap().display().to_string();
            if name.ends_with("/link") {
                assert_eq!(
                    entry.link_name().unwrap().unwrap().to_str(),
                    Some("bundle.json")
                );
            }
            names.push(name);
        }
        assert_eq!(names[0], "mst-work");
        assert!(
            names.contains(&"mst-work/bundle/bundle.json".to_string()),
            "{names:?}"
        );
    }
}
