//! Careful file access for everything mst reads that someone else wrote: inputs named on the
//! command line, and above all files coming back from machines, which are hostile.
//!
//! Reads refuse anything but a regular file, never follow a final symlink, open non-blocking
//! (a FIFO must not hang the host) and stop at a size cap. Writes are atomic: a temporary file
//! in the same directory, then a rename.
//!
//! Also the files mst keeps for itself: fixed-size records in an unnamed file ([`Records`],
//! `records.rs`).

mod records;

use anyhow::{bail, Context, Result};
pub use records::{Appender, Pack, ReadAt, Records, Unpack};
use std::io::{Read, Write};
use std::path::{Component, Path};

/// The largest file mst reads as a plugin, config or dataset named by the user.
pub const MAX_INPUT_BYTES: u64 = 256 * 1024 * 1024;

/// The JSON value in the `len` bytes of `file` at `at`: a line of a file kept with an index of
/// where each line is (the kept cases, grades, a grade shard's trials, the trace log). A short
/// read is `UnexpectedEof`, bad JSON `InvalidData`; callers say which file and line.
pub fn read_json_at<T: serde::de::DeserializeOwned>(
    file: &std::fs::File,
    at: u64,
    len: usize,
) -> std::io::Result<T> {
    use std::os::unix::fs::FileExt;
    let mut bytes = vec![0; len];
    file.read_exact_at(&mut bytes, at)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The JSON value in the file at `path` (a result file mst wrote, or one the user named),
/// opened as [`read_input`] opens it and parsed as it is read, never held whole: a run of
/// 100,000 trials has a `grades.json` of about 70 MB. An error names the file.
pub fn read_json_file<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    read_json_file_with(path, std::marker::PhantomData::<T>, MAX_INPUT_BYTES)
}

/// [`read_json_file`] through `seed`, which may keep what it reads elsewhere than in memory,
/// of a file of at most `cap` bytes (a run's own files grow with its trials).
pub fn read_json_file_with<'de, S: serde::de::DeserializeSeed<'de>>(
    path: &Path,
    seed: S,
    cap: u64,
) -> Result<S::Value> {
    let file = open_regular(path, cap, false)?;
    // One byte over the cap: a file that grew past it is cut there, and reads as damaged.
    let reader = std::io::BufReader::with_capacity(1 << 16, file.take(cap + 1));
    let mut json = serde_json::Deserializer::from_reader(reader);
    (seed.deserialize(&mut json))
        .and_then(|value| json.end().map(|()| value))
        .with_context(|| format!("{} is damaged", path.display()))
}

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

/// A file of lines someone else wrote (a machine's JSON lines: the work file a worker reads,
/// the stored trials a grade shard reads, a `.jsonl` dataset), opened as [`open_regular`]
/// opens it and read a line at a time: never past `cap` bytes in all (a file that grows past
/// it while it is read is an error, never a silently shorter file), nor `line_cap` in one
/// line. Errors name the file and the line.
pub struct LineReader {
    path: std::path::PathBuf,
    reader: std::io::BufReader<std::io::Take<std::fs::File>>,
    cap: u64,
    line_cap: usize,
    line: Vec<u8>,
    /// The number of the line last read, from 1 (0 before the first).
    number: u64,
    /// Where the line last read starts, and where the next one does.
    offset: u64,
    next_offset: u64,
}

impl LineReader {
    /// Opens `path` (a regular file, never through a link) of at most `cap` bytes.
    pub fn open(path: &Path, cap: u64, line_cap: usize) -> Result<Self> {
        let file = open_regular(path, cap, true)?;
        Ok(LineReader {
            path: path.to_path_buf(),
            // One byte over the cap: a file that grew past it is seen to have.
            reader: std::io::BufReader::new(file.take(cap + 1)),
            cap,
            line_cap,
            line: Vec::new(),
            number: 0,
            offset: 0,
            next_offset: 0,
        })
    }

    /// The next line as it is in the file (its `\n` included, when it has one), or `None` at
    /// the end. A line over `line_cap` bytes is an error.
    pub fn next_line(&mut self) -> Result<Option<&[u8]>> {
        use std::io::BufRead;
        self.line.clear();
        let read = (&mut self.reader)
            .take(self.line_cap as u64 + 1)
            .read_until(b'\n', &mut self.line)
            .with_context(|| format!("cannot read {}", self.path.display()))?;
        if read == 0 {
            return Ok(None);
        }
        self.number += 1;
        if self.line.len() > self.line_cap {
            bail!(
                "{} line {}: over {} bytes",
                self.path.display(),
                self.number,
                self.line_cap
            );
        }
        self.offset = self.next_offset;
        self.next_offset += read as u64;
        if self.next_offset > self.cap {
            bail!(
                "{} grew past the {} byte limit while being read",
                self.path.display(),
                self.cap
            );
        }
        Ok(Some(&self.line))
    }

    /// The number of the line last read, from 1.
    pub fn number(&self) -> u64 {
        self.number
    }

    /// Where in the file the line last read starts.
    pub fn offset(&self) -> u64 {
        self.offset
    }

    /// The file's path, for errors.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The same open file, to be read again from its start (so that a file swapped in under
    /// the same name meanwhile is never what is read).
    pub fn rewound(self) -> Result<Self> {
        use std::io::Seek;
        let mut file = self.reader.into_inner().into_inner();
        file.rewind()
            .with_context(|| format!("cannot read {}", self.path.display()))?;
        Ok(LineReader {
            reader: std::io::BufReader::new(file.take(self.cap + 1)),
            number: 0,
            offset: 0,
            next_offset: 0,
            ..self
        })
    }

    /// The open file, for reading at offsets.
    pub fn into_file(self) -> std::fs::File {
        self.reader.into_inner().into_inner()
    }
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
    fn a_line_reader_keeps_to_its_caps_and_says_where_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lines.jsonl");
        std::fs::write(&path, "one\ntwo two\nthree").unwrap();
        let mut lines = LineReader::open(&path, 100, 8).unwrap();
        let mut seen = Vec::new();
        while let Some(line) = lines.next_line().unwrap() {
            let line = String::from_utf8(line.to_vec()).unwrap();
            seen.push((lines.number(), lines.offset(), line));
        }
        assert_eq!(
            seen,
            [
                (1, 0, "one\n".to_string()),
                (2, 4, "two two\n".into()),
                (3, 12, "three".into())
            ]
        );
        // Read again from the start, on the same open file.
        let mut lines = lines.rewound().unwrap();
        assert_eq!(lines.next_line().unwrap(), Some(&b"one\n"[..]));
        assert_eq!((lines.number(), lines.offset()), (1, 0));

        // A line over its cap is refused by its number.
        let mut lines = LineReader::open(&path, 100, 4).unwrap();
        assert!(lines.next_line().unwrap().is_some());
        let err = lines.next_line().unwrap_err().to_string();
        assert!(err.contains("lines.jsonl line 2: over 4 bytes"), "{err}");

        // A file that grows past the cap after it was opened is an error once the cap is
        // passed, whether or not a line ends at the cap: never a file silently cut short.
        for grown in [
            "one\ntwo two\nthree\nfour and more\n",
            "one\ntwo two\nthree and more\n",
        ] {
            std::fs::write(&path, "one\ntwo two\nthree").unwrap();
            let mut lines = LineReader::open(&path, 18, 100).unwrap();
            std::fs::write(&path, grown).unwrap();
            let err = loop {
                match lines.next_line() {
                    Ok(Some(_)) => continue,
                    Ok(None) => panic!("{grown:?} was read to its end"),
                    Err(e) => break e.to_string(),
                }
            };
            assert!(
                err.contains("grew past the 18 byte limit"),
                "{grown:?}: {err}"
            );
        }
        // A file of exactly the cap is read whole.
        std::fs::write(&path, "one\ntwo two\nthree").unwrap();
        let mut lines = LineReader::open(&path, 17, 100).unwrap();
        let mut read = 0;
        while let Some(line) = lines.next_line().unwrap() {
            read += line.len();
        }
        assert_eq!(read, 17);

        // Never through a link.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&path, &link).unwrap();
        assert!(LineReader::open(&link, 100, 100).is_err());
    }

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
