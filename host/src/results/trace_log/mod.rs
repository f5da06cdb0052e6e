//! A run's traces as one append-only log, `traces.jsonl`: one trial record per line, compact
//! JSON, the later line of a trial replacing an earlier one (a trace rewritten as infra, a
//! resumed run collecting a trial again).
//!
//! Run format 1 kept a file per trial in a directory per case. At 100,000 trials that is
//! 200,000 inodes: ext4 allocates them more slowly the more it has recently freed, so a run
//! got slower the more runs had been deleted before it (issue 16, docs/performance.md). The
//! log costs one inode per run, whatever its size.
//!
//! The index (where each trial's last line starts, and its length) is one per log per process
//! ([`TraceLog::of`]), kept in a file of its own rather than in memory (`index.rs`): built as
//! this process appends, and brought up to date by reading only the bytes added since it last
//! looked, so readers in other processes (`mst serve` following a run, `mst grade`) see each
//! new trace without reading the log again.
//! Trials are indexed by a 64-bit hash of their key under a per-log random key; a read checks
//! that the line it finds is the trial's, and [`TraceLog::contains`] is wrong only on a 64-bit
//! collision. A line cut short (a crash mid-append) is skipped by readers and closed off by
//! the next writer, so it loses that one trace (which `--resume` collects again) and nothing
//! else.

mod index;

use crate::eval::trial::{TrialKey, TrialRecord};
use anyhow::{bail, Context, Result};
use index::{Line, LineIndex};
use serde::Deserialize;
use std::fs::File;
use std::hash::BuildHasher;
use std::io::{BufRead, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

/// The log's name in a run directory.
pub const TRACES_FILE: &str = "traces.jsonl";

/// The largest trace line a reader takes (the copy-back caps stop larger ones long before).
const MAX_LINE_BYTES: u64 = 256 << 20;

/// How many logs a process keeps an index for (a long-lived `mst serve` reads many runs).
const KEPT_LOGS: usize = 16;

/// One run's trace log, shared by every thread of this process that reads or writes it.
pub struct TraceLog {
    path: PathBuf,
    hasher: std::collections::hash_map::RandomState,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Each indexed trial's last line, by key hash.
    index: LineIndex,
    /// The log's bytes indexed so far: everything before holds whole lines only.
    scanned: u64,
    /// The open log, for reading (and appending, once this process appended).
    file: Option<File>,
    /// Whether `file` was opened to append.
    appending: bool,
}

/// What a reader takes from a trace line: anything that says which trial the line is for.
pub trait TraceLine: serde::de::DeserializeOwned {
    /// Whether this line is `key`'s trace.
    fn is_of(&self, key: &TrialKey) -> bool;
}

impl TraceLine for TrialRecord {
    fn is_of(&self, key: &TrialKey) -> bool {
        *self.variant == *key.variant && *self.case.id == *key.case && self.trial == key.trial
    }
}

/// The trial a line is for: only the key's fields are read, the rest is skipped.
#[derive(Deserialize)]
struct LineKey<'a> {
    #[serde(borrow)]
    case: CaseId<'a>,
    #[serde(default)]
    variant: Option<std::borrow::Cow<'a, str>>,
    #[serde(default)]
    trial: u32,
}

#[derive(Deserialize)]
struct CaseId<'a> {
    #[serde(borrow)]
    id: std::borrow::Cow<'a, str>,
}

impl TraceLog {
    /// The log of the run directory `root`, shared with every other user of it in this process.
    pub fn of(root: &Path) -> Arc<TraceLog> {
        static LOGS: OnceLock<Mutex<Vec<Arc<TraceLog>>>> = OnceLock::new();
        let path = root.join(TRACES_FILE);
        let mut logs = LOGS
            .get_or_init(Default::default)
            .lock()
            .expect("trace logs");
        if let Some(at) = logs.iter().position(|log| log.path == path) {
            // Most recently used last: the oldest goes first when the list is full.
            let log = logs.remove(at);
            logs.push(log.clone());
            return log;
        }
        if logs.len() == KEPT_LOGS {
            logs.remove(0);
        }
        let log = Arc::new(TraceLog {
            path,
            hasher: Default::default(),
            state: Mutex::default(),
        });
        logs.push(log.clone());
        log
    }

    fn hash(&self, variant: &str, case: &str, trial: u32) -> u64 {
        self.hasher.hash_one((variant, case, trial))
    }

    /// Appends `line` (one compact JSON trial record, no newline) as the trace of `key`.
    pub fn append(&self, key: &TrialKey, line: &[u8]) -> Result<()> {
        if line.contains(&b'\n') {
            bail!("a trace line for {key} holds a newline");
        }
        let mut state = self.state.lock().expect("trace log");
        self.open(&mut state, true)?;
        let file = state.file.as_ref().expect("open");
        let mut record = Vec::with_capacity(line.len() + 2);
        // A line cut short by a crash is closed off, so this one starts a line of its own.
        // (The index covers whole lines only: a log it covers ends with one.)
        let len = file.metadata()?.len();
        if len > 0 && len != state.scanned {
            let mut last = [0u8];
            file.read_exact_at(&mut last, len - 1)?;
            if last[0] != b'\n' {
                record.push(b'\n');
            }
        }
        let start = record.len() as u64;
        record.extend_from_slice(line);
        record.push(b'\n');
        // O_APPEND: one write, at the end, whoever else appends.
        (&mut &*file)
            .write_all(&record)
            .with_context(|| format!("cannot write {}", self.path.display()))?;
        let end = (&mut &*file).stream_position()?;
        let offset = end - record.len() as u64 + start;
        let hash = self.hash(&key.variant, &key.case, key.trial);
        state
            .index
            .insert(
                hash,
                Line {
                    offset,
                    len: line.len() as u32,
                },
            )
            .with_context(|| format!("cannot index {}", self.path.display()))?;
        // Nobody else wrote in between: the index covers this line too.
        if end - record.len() as u64 == state.scanned {
            state.scanned = end;
        }
        Ok(())
    }

    /// Makes room in the index for `more` traces at once: one table made up front, rather
    /// than tables doubled one after another as the traces arrive. A failure leaves the index
    /// as it was (each append then makes its own room, and reports its own failure).
    pub fn reserve(&self, more: usize) {
        let mut state = self.state.lock().expect("trace log");
        if let Err(e) = state.index.reserve(more) {
            tracing::warn!(
                "cannot make room in the index of {} for {more} traces: {e}",
                self.path.display()
            );
        }
    }

    /// The last trace of `key` in the log, if it has one.
    pub fn read(&self, key: &TrialKey) -> Option<TrialRecord> {
        self.read_line::<TrialRecord>(key).map(|(record, _)| record)
    }

    /// The last trace of `key` in the log read as `T` (the whole record, or only what a caller
    /// needs of it), with its line as written (compact JSON, no newline): a caller that writes
    /// the trace out copies the line rather than writing it afresh.
    pub fn read_line<T: TraceLine>(&self, key: &TrialKey) -> Option<(T, Vec<u8>)> {
        let mut state = self.state.lock().expect("trace log");
        self.refresh(&mut state).ok()?;
        let line = state
            .index
            .get(self.hash(&key.variant, &key.case, key.trial))
            .ok()??;
        let mut bytes = vec![0; line.len as usize];
        state
            .file
            .as_ref()?
            .read_exact_at(&mut bytes, line.offset)
            .ok()?;
        drop(state);
        let read: T = serde_json::from_slice(&bytes).ok()?;
        // Keys are indexed by a hash: the line found must be the trial's.
        read.is_of(key).then_some((read, bytes))
    }

    /// Whether the log holds a trace of `key`.
    pub fn contains(&self, key: &TrialKey) -> bool {
        let mut state = self.state.lock().expect("trace log");
        self.refresh(&mut state).is_ok()
            && matches!(
                state
                    .index
                    .get(self.hash(&key.variant, &key.case, key.trial)),
                Ok(Some(_))
            )
    }

    /// Opens the log (creating it when `create`), refusing anything but a regular file: a run
    /// directory is mst's own, but a link or FIFO planted there must not be followed or hang
    /// the reader.
    fn open(&self, state: &mut State, create: bool) -> Result<()> {
        // Opened by a reader: appending needs a handle of its own.
        if create && !state.appending {
            state.file = None;
        }
        if state.file.is_none() {
            let mut options = std::fs::OpenOptions::new();
            options
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK);
            if create {
                if let Some(dir) = self.path.parent() {
                    std::fs::create_dir_all(dir)
                        .with_context(|| format!("cannot create {}", dir.display()))?;
                }
                // Traces hold what agents said and did: the operator's alone, as every
                // other file of the run.
                options.append(true).create(true).mode(0o600);
            }
            let file = options
                .open(&self.path)
                .with_context(|| format!("cannot open {}", self.path.display()))?;
            if !file.metadata()?.file_type().is_file() {
                bail!("{} is not a regular file", self.path.display());
            }
            state.file = Some(file);
            state.appending = create;
        }
        Ok(())
    }

    /// Indexes the lines added since the index last looked (all of them the first time, or
    /// when the log shrank: it was replaced).
    fn refresh(&self, state: &mut State) -> Result<()> {
        // A reader's log may have been replaced (the run removed and made again, as a
        // long-lived `mst serve` can see): then it is read afresh. The writer's is its own.
        if !state.appending {
            use std::os::unix::fs::MetadataExt;
            let now = std::fs::symlink_metadata(&self.path).ok();
            let held = state.file.as_ref().and_then(|f| f.metadata().ok());
            // An inode number may be reused at once; its birth time is not.
            let same = |a: &std::fs::Metadata, b: &std::fs::Metadata| {
                (a.dev(), a.ino(), a.created().ok()) == (b.dev(), b.ino(), b.created().ok())
            };
            if !matches!((&now, &held), (Some(now), Some(held)) if same(now, held)) {
                *state = State::default();
            }
            if now.is_none() {
                return Ok(());
            }
        }
        if state.file.is_none() {
            self.open(state, false)?;
        }
        let file = state.file.as_ref().expect("open");
        let len = file.metadata()?.len();
        if len < state.scanned {
            state.index.clear();
            state.scanned = 0;
        }
        if len == state.scanned {
            return Ok(());
        }
        let mut reader = std::io::BufReader::with_capacity(1 << 16, file);
        reader.seek(SeekFrom::Start(state.scanned))?;
        let mut reader = reader.take(len - state.scanned);
        let mut line = Vec::new();
        let mut offset = state.scanned;
        'lines: loop {
            line.clear();
            let mut read = (&mut reader)
                .take(MAX_LINE_BYTES + 1)
                .read_until(b'\n', &mut line)?;
            if line.last() != Some(&b'\n') {
                if read as u64 <= MAX_LINE_BYTES {
                    // Not a whole line yet: being written, or cut short; looked at next time.
                    break;
                }
                // Too long to be a trace: skipped to its end.
                line.clear();
                loop {
                    let more = (&mut reader).take(1 << 16).read_until(b'\n', &mut line)?;
                    read += more;
                    if more == 0 {
                        break 'lines;
                    }
                    if line.last() == Some(&b'\n') {
                        offset += read as u64;
                        continue 'lines;
                    }
                    line.clear();
                }
            }
            let body = &line[..line.len() - 1];
            if let Ok(key) = serde_json::from_slice::<LineKey<'_>>(body) {
                let variant = crate::eval::trial::variant_or_default(key.variant.as_deref());
                let hash = self.hash(variant, &key.case.id, key.trial);
                let len = body.len() as u32;
                state
                    .index
                    .insert(hash, Line { offset, len })
                    .with_context(|| format!("cannot index {}", self.path.display()))?;
            }
            offset += read as u64;
        }
        state.scanned = offset;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::CaseRecord;

    fn key(case: &str, trial: u32) -> TrialKey {
        TrialKey {
            variant: "default".into(),
            case: case.into(),
            trial,
        }
    }

    fn line(key: &TrialKey, answer: &str) -> Vec<u8> {
        let case = CaseRecord::new(&*key.case, serde_json::json!("input"));
        let mut record = TrialRecord::answered(case, answer);
        record.variant = key.variant.to_string();
        record.trial = key.trial;
        serde_json::to_vec(&record).unwrap()
    }

    fn answer(record: Option<TrialRecord>) -> Option<String> {
        record?.trace.final_text
    }

    #[test]
    fn the_last_line_of_a_trial_wins_and_other_processes_see_new_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = TraceLog::of(dir.path());
        let (a, b) = (key("a", 0), key("b", 1));
        log.append(&a, &line(&a, "zeroth")).unwrap();
        let mode = std::fs::metadata(dir.path().join(TRACES_FILE))
            .unwrap()
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o600
        );
        log.append(&a, &line(&a, "first")).unwrap();
        log.append(&b, &line(&b, "b")).unwrap();
        log.append(&a, &line(&a, "second")).unwrap();
        assert_eq!(answer(log.read(&a)).as_deref(), Some("second"));
        assert!(log.contains(&b) && !log.contains(&key("a", 1)));
        assert!(log.read(&key("c", 0)).is_none());

        // Another process: an index of its own, built from the file, then from what is added.
        let other = TraceLog {
            path: dir.path().join(TRACES_FILE),
            hasher: Default::default(),
            state: Mutex::default(),
        };
        assert_eq!(answer(other.read(&a)).as_deref(), Some("second"));
        let c = key("c", 0);
        log.append(&c, &line(&c, "late")).unwrap();
        assert_eq!(answer(other.read(&c)).as_deref(), Some("late"));
    }

    #[test]
    fn a_reader_reads_a_replaced_log_afresh() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (key("a", 0), key("b", 0));
        let path = dir.path().join(TRACES_FILE);
        std::fs::write(&path, [line(&a, "old"), b"\n".to_vec()].concat()).unwrap();
        let log = TraceLog::of(dir.path());
        assert_eq!(answer(log.read(&a)).as_deref(), Some("old"));
        // Removed and made again, longer than before: nothing of the old index is trusted.
        std::fs::remove_file(&path).unwrap();
        assert!(!log.contains(&a));
        let text = [
            line(&b, "b"),
            b"\n".to_vec(),
            line(&a, "new"),
            b"\n".to_vec(),
        ]
        .concat();
        std::fs::write(&path, text).unwrap();
        assert_eq!(answer(log.read(&a)).as_deref(), Some("new"));
        assert_eq!(answer(log.read(&b)).as_deref(), Some("b"));
    }

    #[test]
    fn a_line_cut_short_is_skipped_and_closed_off_by_the_next_append() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (key("a", 0), key("b", 0));
        let whole = line(&a, "whole");
        let mut bytes = whole.clone();
        bytes.push(b'\n');
        bytes.extend_from_slice(&line(&b, "cut")[..20]);
        std::fs::write(dir.path().join(TRACES_FILE), &bytes).unwrap();
        let log = TraceLog::of(dir.path());
        assert!(log.read(&a).is_some());
        assert!(!log.contains(&b), "a cut line is no trace");
        log.append(&b, &line(&b, "again")).unwrap();
        assert_eq!(answer(log.read(&b)).as_deref(), Some("again"));
        let text = std::fs::read_to_string(dir.path().join(TRACES_FILE)).unwrap();
        assert_eq!(text.lines().count(), 3, "{text}");
        assert!(text.ends_with('\n'));
    }

    #[test]
    fn a_link_or_fifo_in_place_of_the_log_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("elsewhere");
        std::fs::write(&target, "").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join(TRACES_FILE)).unwrap();
        let a = key("a", 0);
        let log = TraceLog::of(dir.path());
        assert!(log.append(&a, &line(&a, "x")).is_err());
        assert_eq!(
            std::fs::read(&target).unwrap(),
            b"",
            "nothing written through it"
        );

        let fifo_dir = tempfile::tempdir().unwrap();
        let fifo = fifo_dir.path().join(TRACES_FILE);
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let log = TraceLog::of(fifo_dir.path());
        assert!(log.read(&a).is_none(), "a FIFO is refused, not waited on");
        assert!(!log.contains(&a));
    }

    #[test]
    fn a_newline_is_never_written_inside_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let a = key("a", 0);
        assert!(TraceLog::of(dir.path()).append(&a, b"{\n}").is_err());
    }
}
