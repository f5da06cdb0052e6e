//! Careful file access for everything mst reads that someone else wrote: inputs named on the
//! command line, and above all files coming back from machines, which are hostile.
//!
//! Reads refuse anything but a regular file, never follow a final symlink, open non-blocking
//! (a FIFO must not hang the host) and stop at a size cap. Writes are atomic: a temporary file
//! in the same directory, then a rename.

use anyhow::{bail, Context, Result};
use std::io::{Read, Write};
use std::path::{Component, Path};

/// The largest file mst reads as a plugin, config or dataset named by the user.
pub const MAX_INPUT_BYTES: u64 = 256 * 1024 * 1024;

/// Reads a file the user named: regular files only, at most [`MAX_INPUT_BYTES`].
pub fn read_input(path: &Path) -> Result<Vec<u8>> {
    read_regular(path, MAX_INPUT_BYTES, false)
}

/// Reads a regular file of at most `cap` bytes. With `no_follow`, a symlink (even to a regular
/// file) is refused; the file is opened non-blocking so that a FIFO planted in its place
/// cannot hang the reader.
pub fn read_regular(path: &Path, cap: u64, no_follow: bool) -> Result<Vec<u8>> {
    let file = open_regular(path, cap, no_follow)?;
    let mut bytes = Vec::new();
    file.take(cap + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    if bytes.len() as u64 > cap {
        bail!(
            "{} grew past the {} byte limit while being read",
            path.display(),
            cap
        );
    }
    Ok(bytes)
}

/// Opens a regular file of at most `cap` bytes for reading, checked as [`read_regular`]
/// checks it; the reader takes care not to read past `cap` should it grow.
pub fn open_regular(path: &Path, cap: u64, no_follow: bool) -> Result<std::fs::File> {
    let meta = if no_follow {
        std::fs::symlink_metadata(path)
    } else {
        std::fs::metadata(path)
    }
    .with_context(|| format!("cannot read {}", path.display()))?;
    if !meta.file_type().is_file() {
        bail!("{} is not a regular file", path.display());
    }
    if meta.len() > cap {
        bail!("{} is larger than the {} byte limit", path.display(), cap);
    }
    let mut options = std::fs::OpenOptions::new();
    options.read(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        let mut flags = libc::O_NONBLOCK;
        if no_follow {
            flags |= libc::O_NOFOLLOW;
        }
        options.custom_flags(flags);
    }
    let file = options
        .open(path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    // Check again on the open handle: the path may have been swapped after the first look.
    if !file.metadata()?.file_type().is_file() {
        bail!("{} is not a regular file", path.display());
    }
    Ok(file)
}

/// Writes `bytes` to `path` atomically (temporary file in the same directory, then rename):
/// readers see the old file or the whole new one, never a part. Used for per-trial traces,
/// where a trace lost to a power cut is merely missing (and `--resume` collects it again).
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write(path, bytes, false)
}

/// Like [`write_atomic`], and flushed to disk before the rename: for records a run cannot
/// rebuild (`run.json`, grades, summaries).
pub fn write_durable(path: &Path, bytes: &[u8]) -> Result<()> {
    write(path, bytes, true)
}

/// Like [`write_atomic`] for a file written piece by piece: `write` streams it (buffered) into
/// a temporary file beside `path`, which replaces `path` only once `write` succeeded. Nothing
/// the size of the file is held in memory.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    stream(path, false, write)
}

/// [`write_atomic_with`], flushed to disk before the rename as [`write_durable`] is.
pub fn write_durable_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    stream(path, true, write)
}

fn write(path: &Path, bytes: &[u8], durable: bool) -> Result<()> {
    stream(path, durable, |out| out.write_all(bytes))
}

fn stream(
    path: &Path,
    durable: bool,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = path
        .parent()
        .context("a file to write has a parent directory")?;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let file = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("cannot write in {}", dir.display()))?;
    let mut out = std::io::BufWriter::new(file);
    write(&mut out)
        .and_then(|()| out.flush())
        .with_context(|| format!("cannot write {}", path.display()))?;
    let file = out
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("cannot write {}", path.display()))?;
    if durable {
        file.as_file().sync_data()?;
    }
    file.persist(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// Whether `relative` is a plain relative path: no root, no `..`, no `.`, not empty.
pub fn is_plain_relative(relative: &str) -> bool {
    let path = Path::new(relative);
    !relative.is_empty() && path.components().all(|c| matches!(c, Component::Normal(_)))
}

/// A name safe to use as one path component: ids are kept when they are plain
/// (`[A-Za-z0-9._-]`, not starting with `.`), otherwise every other byte is `%XX`-escaped.
pub fn path_component(name: &str) -> String {
    let plain = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.');
    let mut out = String::with_capacity(name.len());
    for (i, b) in name.bytes().enumerate() {
        if plain(b) && !(i == 0 && b == b'.') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    out
}

/// Serialises what the function's iterator yields as a JSON array, each item made as it is
/// written: a large list streamed into a file without being gathered in memory first.
pub struct SeqOf<F>(pub F);

impl<F, I> serde::Serialize for SeqOf<F>
where
    F: Fn() -> I,
    I: Iterator,
    I::Item: serde::Serialize,
{
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq((self.0)())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_cannot_escape() {
        assert_eq!(path_component("tz-1"), "tz-1");
        assert_eq!(path_component("../etc"), "%2E.%2Fetc");
        assert_eq!(path_component("a/b c"), "a%2Fb%20c");
        assert_eq!(path_component(""), "%00");
        assert!(is_plain_relative("a/b/1.json"));
        for bad in ["/etc/passwd", "../x", "a/../b", "./a", ""] {
            assert!(!is_plain_relative(bad), "{bad}");
        }
    }

    #[test]
    fn reads_refuse_links_fifos_and_big_files() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "hello").unwrap();
        assert_eq!(read_regular(&file, 10, true).unwrap(), b"hello");
        assert!(read_regular(&file, 3, true).is_err());
        let link = dir.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(read_regular(&link, 10, true)
            .unwrap_err()
            .to_string()
            .contains("not a regular file"));
        let fifo = dir.path().join("p");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(
            read_regular(&fifo, 10, true).is_err(),
            "a FIFO is refused, not waited on"
        );
    }

    #[test]
    fn atomic_writes_replace_whole_files() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/x.json");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert_eq!(
            std::fs::read_dir(dir.path().join("sub")).unwrap().count(),
            1,
            "no temporary left"
        );
    }
}
