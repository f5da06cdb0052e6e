//! A trial's artefacts on both sides of the channel. On the machine, the worker hands each
//! trial an empty directory (`$MST_ARTIFACTS`), writes its diagnosis there when the trial
//! failed, and lists what the trial left in its `trial` message. On the host, the coordinator
//! copies the listed files back with the channel's hostile-safe reads, under the eval's caps,
//! redacted, into `artifacts/<variant>/<case>/<trial>/` of the run directory.
//!
//! A trial that leaves nothing costs no directory: the worker keeps one directory per trial
//! running at once and hands it on while it stays empty (as it does scratch directories, see
//! docs/performance.md); only a trial that left something has its directory moved to its
//! own place.

use crate::diagnosis::TrialEvidence;
use crate::eval::trial::{TraceRecord, TrialKey};
use crate::results::trial_dir;
use crate::runner::channel::{Channel, Refused};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// The directory on the machine, beside `results/`, that holds the trials' artefacts.
pub const MACHINE_DIR: &str = "artifacts";
/// The most files one trial lists (its `trial` line must stay within the line cap).
pub const MAX_FILES: usize = 128;
/// The longest path of one listed file, in bytes.
pub const MAX_PATH_BYTES: usize = 240;
/// Where the worker's reusable directories are, inside [`MACHINE_DIR`]: a leading `.` is
/// never the start of a trial's directory (names are escaped), so the two cannot meet.
const SLOTS: &str = ".slots";

/// One file a trial left, as its `trial` message lists it: a path relative to the trial's
/// artefact directory (`/`-separated) and its size on the machine. Added within
/// `mst.shard/v1`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArtifactFile {
    pub path: String,
    pub bytes: u64,
}

/// The bundle's `artifacts`: present when trials keep artefacts. Added within `mst.shard/v1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct BundleArtifacts {
    /// The most bytes the worker lists for one trial (the coordinator's cap too).
    pub max_trial_bytes: u64,
}

/// Whether a listed path may be copied: plain and relative (no root, `.` or `..`), within
/// [`MAX_PATH_BYTES`], with no control characters and no backslash. The machine wrote the
/// list: this is the coordinator's check, not the worker's courtesy.
pub fn check_listed(path: &str) -> Result<(), String> {
    if path.len() > MAX_PATH_BYTES {
        return Err(format!(
            "a path of {} bytes, over {MAX_PATH_BYTES}",
            path.len()
        ));
    }
    // Each `/`-separated name plain: no root (a leading empty name), `.`, `..`, and not `a//b`
    // or `a/./b`, which name a file under another name.
    let odd_part = path.split('/').any(|part| matches!(part, "" | "." | ".."));
    if odd_part || path.chars().any(|c| c.is_control() || c == '\\') {
        return Err(format!(
            "{:?} is not a plain relative path",
            crate::secrets::clean(path)
        ));
    }
    Ok(())
}

/// The worker's artefact directories: one per trial running at once, handed on while empty.
pub struct ArtifactSlots {
    root: PathBuf,
    max_trial_bytes: u64,
    idle: Mutex<Vec<PathBuf>>,
    made: AtomicU64,
}

impl ArtifactSlots {
    /// Slots below `root` (the machine's [`MACHINE_DIR`]), listing at most `max_trial_bytes`
    /// of each trial.
    pub fn new(root: PathBuf, limits: BundleArtifacts) -> Self {
        ArtifactSlots {
            root,
            max_trial_bytes: limits.max_trial_bytes,
            idle: Mutex::default(),
            made: AtomicU64::new(0),
        }
    }

    /// An empty directory for one trial's evidence.
    pub fn take(&self) -> Result<TrialEvidence, String> {
        if let Some(dir) = self.idle.lock().expect("slots").pop() {
            return Ok(TrialEvidence::new(dir));
        }
        let n = self.made.fetch_add(1, Ordering::Relaxed);
        let dir = self.root.join(SLOTS).join(n.to_string());
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot make the artefact directory {}: {e}", dir.display()))?;
        Ok(TrialEvidence::new(dir))
    }

    /// After the trial: its diagnosis when it failed, then the list of what it left, its
    /// directory moved to [`trial_dir`] when that is not empty. `None` for a trial stopped by
    /// `cancel`, whose artefacts are dropped with it.
    pub fn finish(
        &self,
        evidence: TrialEvidence,
        key: &TrialKey,
        trace: Option<&TraceRecord>,
    ) -> Vec<ArtifactFile> {
        let slot = evidence.dir().to_path_buf();
        let failure = trace.and_then(TraceRecord::failure);
        if failure.is_none() && !evidence.handed_out() {
            // No one wrote there (an `api` or `mcp` trial that passed): no look needed.
            self.idle.lock().expect("slots").push(slot);
            return Vec::new();
        }
        // The client may have replaced its directory with a link (or removed it): nothing is
        // written or listed through it, and it is not handed on.
        if !std::fs::symlink_metadata(&slot).is_ok_and(|meta| meta.file_type().is_dir()) {
            eprintln!(
                "mst collect: trial {key}: its artefact directory is no longer a directory; \
                 nothing of it is kept"
            );
            let _ = std::fs::remove_file(&slot);
            return Vec::new();
        }
        if let Some(why) = failure {
            if let Err(e) = evidence.write_diagnosis(&why) {
                eprintln!("mst collect: trial {key}: cannot write its diagnosis: {e}");
            }
        }
        drop(evidence);
        let (listed, untouched) = match trace {
            Some(_) => self.list(&slot, key),
            None => (Vec::new(), false),
        };
        if untouched {
            // Nothing in it at all (most trials): handed on as it is, with no second look.
            self.idle.lock().expect("slots").push(slot);
            return listed;
        }
        if listed.is_empty() {
            self.give_back(slot);
            return listed;
        }
        let dest = self.root.join(trial_dir(key));
        let moved = dest
            .parent()
            .map_or(Ok(()), std::fs::create_dir_all)
            .and_then(|()| std::fs::rename(&slot, &dest));
        match moved {
            Ok(()) => listed,
            Err(e) => {
                eprintln!(
                    "mst collect: trial {key}: cannot move its artefacts to {}: {e}",
                    dest.display()
                );
                self.give_back(slot);
                Vec::new()
            }
        }
    }

    /// Empties `slot` for the next trial; one that cannot be emptied is left, and a new one
    /// made when needed.
    fn give_back(&self, slot: PathBuf) {
        if super::worker::empty_dir(&slot).is_ok() {
            self.idle.lock().expect("slots").push(slot);
        }
    }

    /// The regular files below `slot`, the worker's diagnosis first, then by path, within
    /// [`MAX_FILES`] and the trial's byte cap. Links, FIFOs and devices are never listed (nor
    /// followed); what is left out is said in the worker's log. Also whether `slot` held
    /// nothing at all.
    fn list(&self, slot: &Path, key: &TrialKey) -> (Vec<ArtifactFile>, bool) {
        let mut found = Vec::new();
        let mut skipped = Vec::new();
        walk(slot, "", &mut found, &mut skipped);
        let untouched = found.is_empty() && skipped.is_empty();
        let diagnosis = crate::diagnosis::DIAGNOSIS_DIR;
        found.sort_by(|a: &ArtifactFile, b| {
            let theirs = |f: &ArtifactFile| !f.path.starts_with(diagnosis);
            (theirs(a), &a.path).cmp(&(theirs(b), &b.path))
        });
        let mut listed = Vec::new();
        let mut bytes = 0u64;
        for file in found {
            if listed.len() == MAX_FILES {
                skipped.push(format!("{}: past {MAX_FILES} files", file.path));
            } else if bytes.saturating_add(file.bytes) > self.max_trial_bytes {
                skipped.push(format!(
                    "{}: past the trial's cap of {} bytes",
                    file.path, self.max_trial_bytes
                ));
            } else {
                bytes += file.bytes;
                listed.push(file);
            }
        }
        for why in skipped {
            eprintln!("mst collect: trial {key}: artefact left out: {why}");
        }
        (listed, untouched)
    }
}

/// Collects the regular files below `dir` (as paths after `prefix`) into `found`, and says
/// why anything else was passed over in `skipped`.
fn walk(dir: &Path, prefix: &str, found: &mut Vec<ArtifactFile>, skipped: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        skipped.push(format!("{prefix}: unreadable directory"));
        return;
    };
    for entry in entries.flatten() {
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            skipped.push(format!("{prefix}: a name that is not UTF-8"));
            continue;
        };
        let path = match prefix {
            "" => name,
            _ => format!("{prefix}/{name}"),
        };
        // `file_type` does not follow links.
        match entry.file_type() {
            Ok(kind) if kind.is_dir() => walk(&entry.path(), &path, found, skipped),
            Ok(kind) if kind.is_file() => match (check_listed(&path), entry.metadata()) {
                (Ok(()), Ok(meta)) => found.push(ArtifactFile {
                    path,
                    bytes: meta.len(),
                }),
                (Err(why), _) => skipped.push(why),
                (_, Err(e)) => skipped.push(format!("{path}: {e}")),
            },
            _ => skipped.push(format!(
                "{path}: not a regular file (links are never followed)"
            )),
        }
    }
}

/// What the coordinator brought back of a shard's artefacts, for `run.json`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct ArtifactTally {
    /// Trials with at least one artefact copied back.
    pub trials: u64,
    pub files: u64,
    pub bytes: u64,
    /// Files listed but not copied back (refused, over a cap, lost on the way).
    pub skipped: u64,
}

impl ArtifactTally {
    /// Whether nothing was listed at all.
    pub fn is_empty(&self) -> bool {
        *self == ArtifactTally::default()
    }
}

/// The coordinator's side: the caps and where copies land.
pub struct ArtifactCopier<'a> {
    /// The run directory's `artifacts/`.
    pub root: PathBuf,
    pub max_trial_bytes: u64,
    pub max_run_bytes: u64,
    /// Artefact bytes every shard of the run brought back so far.
    pub run_bytes: &'a AtomicU64,
}

impl ArtifactCopier<'_> {
    /// Takes up to `wanted` bytes of the run's room before a copy, so that shards copying at
    /// once never pass the run's cap together; how many it got.
    fn reserve(&self, wanted: u64) -> u64 {
        let mut got = 0;
        let _ = self
            .run_bytes
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |used| {
                got = wanted.min(self.max_run_bytes.saturating_sub(used));
                Some(used + got)
            });
        got
    }

    /// Copies the files the worker listed for `key` back from `channel`: each path checked,
    /// each file read with the channel's refusing reader, the trial's and the run's caps kept,
    /// every held secret redacted; what cannot come back is skipped and said in `skipped`
    /// (never the trial's outcome: artefacts are evidence, not results). A trial collected
    /// again (a resume) replaces its earlier artefacts.
    pub fn copy(
        &self,
        channel: &mut dyn Channel,
        key: &TrialKey,
        listed: &[ArtifactFile],
        tally: &mut ArtifactTally,
        skipped: &mut dyn FnMut(String),
    ) {
        let dir = self.root.join(trial_dir(key));
        if dir.exists() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        let mut seen = std::collections::BTreeSet::new();
        let mut wanted: Vec<(String, PathBuf)> = Vec::new();
        // What the worker says they weigh: the room reserved for them (the reader's cap
        // holds whatever a file really weighs).
        let mut claimed = 0u64;
        for file in listed.iter().take(MAX_FILES) {
            let checked = check_listed(&file.path).and_then(|()| match seen.insert(&file.path) {
                true => Ok(()),
                false => Err(format!("{} is listed twice", file.path)),
            });
            match checked {
                Ok(()) => {
                    claimed = claimed.saturating_add(file.bytes);
                    wanted.push((
                        format!("{MACHINE_DIR}/{}/{}", trial_dir(key), file.path),
                        dir.join(&file.path),
                    ))
                }
                Err(why) => skipped(why),
            }
        }
        if listed.len() > MAX_FILES {
            skipped(format!(
                "{} files past the first {MAX_FILES}",
                listed.len() - MAX_FILES
            ));
        }
        tally.skipped += (listed.len() - wanted.len()) as u64;
        if wanted.is_empty() {
            return;
        }
        let room = self.reserve(claimed.min(self.max_trial_bytes));
        if room == 0 && claimed > 0 {
            skipped(format!(
                "{} file(s): the run's artefacts reached their cap of {} bytes",
                wanted.len(),
                self.max_run_bytes
            ));
            tally.skipped += wanted.len() as u64;
            return;
        }
        // The landing places are ours: made here, below the run directory.
        for (_, dest) in &wanted {
            if let Some(parent) = dest.parent() {
                let _ = std::fs::create_dir_all(parent);
            }
        }
        let fetched = channel.read_many(&wanted, room);
        let mut trial_bytes = 0u64;
        let mut copied_any = false;
        for ((_, dest), fetched) in wanted.iter().zip(fetched) {
            let stored = fetched.and_then(|bytes| {
                let size = bytes.len() as u64;
                if trial_bytes + size > room {
                    anyhow::bail!(
                        "past the {room} bytes taken for this trial's artefacts (what the \
                         worker listed, within the trial's and the run's caps)"
                    );
                }
                trial_bytes += size;
                let redacted = crate::secrets::redactor();
                crate::files::write_atomic(dest, &redacted.redact_bytes(&bytes))?;
                Ok(size)
            });
            match stored {
                Ok(size) => {
                    tally.files += 1;
                    tally.bytes += size;
                    copied_any = true;
                }
                Err(e) => {
                    let _ = std::fs::remove_file(dest);
                    tally.skipped += 1;
                    let name = dest.strip_prefix(&dir).unwrap_or(dest).display();
                    let kind = if Refused::is(&e) {
                        "refused"
                    } else {
                        "not copied"
                    };
                    skipped(format!("{name}: {kind}: {e:#}"));
                }
            }
        }
        // What was reserved and not used goes back to the run.
        self.run_bytes
            .fetch_sub(room - trial_bytes, Ordering::SeqCst);
        if copied_any {
            tally.trials += 1;
        } else {
            let _ = std::fs::remove_dir_all(&dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> TrialKey {
        TrialKey {
            variant: "base".into(),
            case: "../c 1".into(),
            trial: 2,
        }
    }

    #[test]
    fn listed_paths_must_be_plain_relative_and_printable() {
        assert!(check_listed("report.txt").is_ok());
        assert!(check_listed("logs/app.log").is_ok());
        assert!(check_listed(".hidden").is_ok());
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a/../../x",
            "a/./b",
            "a//b",
            "a/",
            "a\nb",
            "a\\b",
        ] {
            assert!(check_listed(bad).is_err(), "{bad:?} passed");
        }
        assert!(check_listed(&"x".repeat(MAX_PATH_BYTES + 1)).is_err());
        assert_eq!(trial_dir(&key()), "base/%2E.%2Fc%201/2");
    }

    #[test]
    fn room_is_taken_before_a_copy_so_shards_never_pass_the_runs_cap_together() {
        let used = AtomicU64::new(0);
        let copier = ArtifactCopier {
            root: PathBuf::from("unused"),
            max_trial_bytes: 8,
            max_run_bytes: 10,
            run_bytes: &used,
        };
        assert_eq!(copier.reserve(8), 8);
        assert_eq!(copier.reserve(8), 2);
        assert_eq!(copier.reserve(1), 0);
        assert_eq!(used.load(Ordering::SeqCst), 10);
    }

    #[test]
    fn a_slot_is_reused_while_empty_and_moved_with_what_a_trial_left() {
        let root = tempfile::tempdir().unwrap();
        let slots = ArtifactSlots::new(
            root.path().to_path_buf(),
            BundleArtifacts {
                max_trial_bytes: 10,
            },
        );
        let passed = TraceRecord::default();
        let evidence = slots.take().unwrap();
        let first = evidence.hand_out().to_path_buf();
        assert!(slots.finish(evidence, &key(), Some(&passed)).is_empty());
        // Nothing left: the same directory serves the next trial.
        let evidence = slots.take().unwrap();
        assert_eq!(evidence.dir(), first);
        std::fs::write(evidence.hand_out().join("a.txt"), "12345").unwrap();
        std::fs::create_dir(evidence.hand_out().join("sub")).unwrap();
        std::fs::write(evidence.hand_out().join("sub/b.txt"), "123456").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", evidence.hand_out().join("link")).unwrap();
        let listed = slots.finish(evidence, &key(), Some(&passed));
        // `sub/b.txt` would pass the 10-byte cap; the link is never listed.
        assert_eq!(
            listed,
            vec![ArtifactFile {
                path: "a.txt".into(),
                bytes: 5
            }]
        );
        let moved = root.path().join(trial_dir(&key()));
        assert_eq!(std::fs::read(moved.join("a.txt")).unwrap(), b"12345");
        // A failed trial gets the worker's diagnosis, listed first.
        let failed = TraceRecord {
            exit_code: Some(3),
            ..TraceRecord::default()
        };
        let slots = ArtifactSlots::new(
            root.path().join("other"),
            BundleArtifacts {
                max_trial_bytes: 1 << 20,
            },
        );
        let evidence = slots.take().unwrap();
        evidence.stderr.push(b"it broke");
        std::fs::write(evidence.hand_out().join("a.txt"), "x").unwrap();
        let listed = slots.finish(evidence, &key(), Some(&failed));
        let paths: Vec<&str> = listed.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "mst-diagnosis/processes.txt",
                "mst-diagnosis/stderr.txt",
                "mst-diagnosis/system.json",
                "a.txt"
            ]
        );
        // A directory the client swapped for a link to elsewhere: nothing listed through it,
        // no diagnosis written there, and the link is not handed on.
        let elsewhere = tempfile::tempdir().unwrap();
        std::fs::write(elsewhere.path().join("other.txt"), "not the trial's").unwrap();
        let evidence = slots.take().unwrap();
        let swapped = evidence.hand_out().to_path_buf();
        std::fs::remove_dir(&swapped).unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), &swapped).unwrap();
        assert!(slots.finish(evidence, &key(), Some(&failed)).is_empty());
        assert_eq!(std::fs::read_dir(elsewhere.path()).unwrap().count(), 1);
        assert!(!swapped.exists() && slots.take().unwrap().dir() != swapped);
        // A cancelled trial's artefacts go with it.
        let evidence = slots.take().unwrap();
        std::fs::write(evidence.hand_out().join("a.txt"), "x").unwrap();
        let dir = evidence.hand_out().to_path_buf();
        assert!(slots.finish(evidence, &key(), None).is_empty());
        assert_eq!(std::fs::read_dir(dir).unwrap().count(), 0);
    }
}
