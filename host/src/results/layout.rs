//! The run directory's layout: where runs of an eval live, what each file in a run directory is
//! called, and the one place that reads and writes them.
//!
//! ```text
//! <results>/<eval>/runs/<run-id>/run.json          provenance and phases
//!                                 traces.jsonl      every trial's trace, a line each
//!                                 grades.json, scores/<judge>.json, summary.json
//!                                 pairwise.json      pairwise verdicts per pair and case
//!                                 shards/<n>.worker.log
//! <results>/<eval>/sessions/<session-id>/          a playground session (`mst serve`)
//! ```

use super::trace_log::{TraceLine, TraceLog};
use super::{RunRecord, Summary};
use crate::eval::trial::{TrialKey, TrialRecord};
use crate::grade::pairwise::PairResult;
use crate::grade::Grades;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where a trial's trace file is, relative to a results directory:
/// `<variant>/<case>/<trial>.json`, each name made safe as a single path component. A worker
/// writes a trace too large for its `trial` message there on its machine; run format 1 kept
/// every trace so (a run directory of format 2 keeps them in
/// [`super::trace_log::TRACES_FILE`]).
pub fn trace_path(key: &TrialKey) -> String {
    format!("{}.json", trial_dir(key))
}

/// A trial's own place below a directory of trials, `<variant>/<case>/<trial>`, each name
/// made safe as a single path component: its trace file is this plus `.json`, its artefacts
/// ([`RunDir::artifacts_dir`], and the machine's) are this directory.
pub fn trial_dir(key: &TrialKey) -> String {
    format!(
        "{}/{}/{}",
        crate::files::path_component(&key.variant),
        crate::files::path_component(&key.case),
        key.trial
    )
}

/// A run's directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
}

/// Where runs are stored (`--results-dir`, `.mst/results` by default): one folder per eval,
/// each with its `runs/`.
#[derive(Debug, Clone)]
pub struct ResultsRoot {
    pub base: PathBuf,
}

impl ResultsRoot {
    /// The results root at `base`.
    pub fn new(base: impl Into<PathBuf>) -> Self {
        ResultsRoot { base: base.into() }
    }

    /// The folder holding the runs of `eval`.
    pub fn runs_dir(&self, eval: &str) -> PathBuf {
        self.base
            .join(crate::files::path_component(eval))
            .join("runs")
    }

    /// The directory for run `run_id` of `eval` (which may not exist yet).
    pub fn run(&self, eval: &str, run_id: &str) -> RunDir {
        RunDir::new(&self.runs_dir(eval), run_id)
    }

    /// The folder holding the playground sessions of `eval` (`mst serve`).
    pub fn sessions_dir(&self, eval: &str) -> PathBuf {
        self.base
            .join(crate::files::path_component(eval))
            .join("sessions")
    }

    /// The directory of playground session `id` of `eval`: laid out as a run directory (one
    /// trace per task), with `session.json` for its record.
    pub fn session(&self, eval: &str, id: &str) -> RunDir {
        RunDir::new(&self.sessions_dir(eval), id)
    }

    /// Every run directory holding a `run.json`, under any eval: its runs, and its playground
    /// sessions (whose tasks are their trials).
    fn run_dirs(&self) -> impl Iterator<Item = RunDir> {
        std::fs::read_dir(&self.base)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|eval| {
                ["runs", "sessions"].into_iter().flat_map(move |kind| {
                    std::fs::read_dir(eval.path().join(kind))
                        .into_iter()
                        .flatten()
                        .flatten()
                })
            })
            .map(|run| RunDir { root: run.path() })
            .filter(|dir| dir.root.join(RUN_FILE).is_file())
    }

    /// The directory of `run_id`, under whichever eval holds it.
    pub fn find(&self, run_id: &str) -> Result<RunDir> {
        let wanted = crate::files::path_component(run_id);
        self.run_dirs()
            .find(|dir| dir.root.file_name().is_some_and(|n| n == wanted.as_str()))
            .with_context(|| {
                format!(
                    "no run `{run_id}` under {}; `mst runs list` shows the runs",
                    self.base.display()
                )
            })
    }

    /// Every stored run that can be read, oldest first, as `mst runs list` shows it.
    pub fn list(&self) -> Vec<super::run_process::RunListing> {
        let mut runs: Vec<super::run_process::RunListing> = self
            .run_dirs()
            .filter_map(|dir| {
                let record = dir.read_record().ok()?;
                Some(super::run_process::RunListing::of(&dir, &record))
            })
            .collect();
        runs.sort_by(|a, b| (a.created_at, &a.run_id).cmp(&(b.created_at, &b.run_id)));
        runs
    }
}

/// `run.json`'s name in a run directory.
const RUN_FILE: &str = "run.json";

/// `process.json`'s name in a run directory ([`super::run_process::RunProcess`]).
const PROCESS_FILE: &str = "process.json";

/// A new run id: UTC time plus a random suffix, sortable by time.
pub fn new_run_id() -> String {
    let now = crate::clock::since_epoch();
    let suffix =
        hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(now.as_nanos().to_le_bytes())[..2]);
    format!("{}-{suffix}", crate::clock::utc_compact(now.as_secs()))
}

impl RunDir {
    /// The directory of `run_id` under `runs_dir`.
    pub fn new(runs_dir: &Path, run_id: &str) -> Self {
        RunDir {
            root: runs_dir.join(crate::files::path_component(run_id)),
        }
    }

    /// Where the trace of `key` is in a run of format 1 (a file per trial).
    fn format_1_trace_file(&self, key: &TrialKey) -> PathBuf {
        self.root.join(trace_path(key))
    }

    /// The run's trace log, `traces.jsonl`.
    fn trace_log(&self) -> std::sync::Arc<TraceLog> {
        TraceLog::of(&self.root)
    }

    /// Whether a trial's trace was collected: in the trace log, or (a run of format 1, or one
    /// resumed from it) in its own file. Made once for checking many trials: whether a variant
    /// has format-1 trace files is looked up once per variant, so a run of format 2 (no
    /// variant directories) is never asked for a file per trial it cannot have.
    pub fn trace_check(&self) -> impl FnMut(&TrialKey) -> bool + '_ {
        let log = self.trace_log();
        let mut format_1: std::collections::HashMap<arcstr::ArcStr, bool> =
            std::collections::HashMap::new();
        move |key| {
            log.contains(key)
                || (*format_1.entry(key.variant.clone()).or_insert_with(|| {
                    let variant = crate::files::path_component(&key.variant);
                    self.root.join(variant).is_dir()
                }) && self.format_1_trace_file(key).is_file())
        }
    }

    /// Makes room for `trials` more traces ([`TraceLog::reserve`]).
    pub fn expect_traces(&self, trials: usize) {
        self.trace_log().reserve(trials);
    }

    /// Where the trials' artefacts are: `artifacts/<variant>/<case>/<trial>/`
    /// (docs/results.md, "Artefacts").
    pub fn artifacts_dir(&self) -> PathBuf {
        self.root.join("artifacts")
    }

    /// The run's id: its directory's name.
    pub fn id(&self) -> String {
        self.root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }

    /// A detached run's progress log (`progress.jsonl`, [`super::run_process::Progress`]).
    pub fn progress_path(&self) -> PathBuf {
        self.root.join("progress.jsonl")
    }

    /// Writes `process.json`: the process collecting into the run.
    pub fn write_process(&self, process: &super::run_process::RunProcess) -> Result<()> {
        self.write_json(PROCESS_FILE, process)
    }

    /// Reads `process.json`; `None` when the run has none (a run or playground session of
    /// an mst from before it was written).
    pub fn read_process(&self) -> Result<Option<super::run_process::RunProcess>> {
        let path = self.root.join(PROCESS_FILE);
        match std::fs::read(&path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => {
                Err(anyhow::Error::from(e).context(format!("cannot read {}", path.display())))
            }
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .with_context(|| format!("{} is damaged", path.display())),
        }
    }

    /// Where shard `shard`'s worker log goes.
    pub fn worker_log(&self, shard: u32) -> PathBuf {
        self.root.join("shards").join(format!("{shard}.worker.log"))
    }

    /// The first free `<run-id>.g<N>` beside this run, for a regrade.
    pub fn next_regrade(&self, run_id: &str) -> Result<RunDir> {
        let runs_dir = self.root.parent().context("a run directory has a parent")?;
        Ok((1..)
            .map(|n| RunDir::new(runs_dir, &format!("{run_id}.g{n}")))
            .find(|dir| !dir.root.exists())
            .expect("some suffix is free"))
    }

    /// The cases of `record`'s trials, once each, in trial order, as their traces hold them
    /// (a playground session's tasks become cases this way: `mst runs cases SESSION`).
    pub fn cases(&self, record: &RunRecord) -> Vec<crate::eval::trial::CaseRecord> {
        let traces = self.traces_dir(&record.run_id);
        let mut seen = std::collections::BTreeSet::new();
        (record.trials.keys())
            .filter_map(|key| traces.read_trace(&key))
            .map(|trial| trial.case)
            .filter(|case| seen.insert(case.id.clone()))
            .collect()
    }

    /// The run directory holding this run's traces: its own, or for a regrade
    /// (`<run-id>.gN`, which holds no traces) the graded run's beside it.
    pub fn traces_dir(&self, run_id: &str) -> RunDir {
        let graded = run_id
            .rsplit_once(".g")
            .filter(|(_, n)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|(base, _)| Some(RunDir::new(self.root.parent()?, base)));
        match graded {
            Some(dir) if dir.root.is_dir() => dir,
            _ => self.clone(),
        }
    }

    /// Every JSON file of a run goes through here: no held secret reaches the disk (a judge's
    /// reason, a machine's error in `run.json`). Serialised, redacted and written as one
    /// stream, so a file the size of 100,000 grades is never held in memory. `name` is a file
    /// of the run directory (a playground session's `session.json` too).
    pub fn write_json(&self, name: &str, value: &impl Serialize) -> Result<()> {
        let redactor = crate::secrets::redactor();
        crate::files::write_durable_with(&self.root.join(name), |out| {
            let mut out = redactor.json_writer(out);
            serde_json::to_writer_pretty(&mut out, value)?;
            out.flush()
        })
    }

    /// Writes shard `shard`'s worker log (the worker's stderr, as it came): held secrets
    /// redacted and control characters escaped, so `cat` on it is safe.
    pub fn write_worker_log(&self, shard: u32, log: &[u8]) -> Result<()> {
        crate::files::write_atomic(&self.worker_log(shard), &crate::secrets::clean_bytes(log))
    }

    /// Writes the trace of `key` (held secrets redacted): the coordinator's copy of what a
    /// machine sent, or its own record of a trial that produced none.
    pub fn write_trace(&self, key: &TrialKey, record: &TrialRecord) -> Result<()> {
        self.write_trace_bytes(key, record).map(drop)
    }

    /// Writes a trace as [`RunDir::write_trace`] does and returns the record as stored: itself,
    /// or, when redaction changed anything, the redacted file read back. Graders are handed
    /// this, so they see what a later reader of the file sees and never a secret.
    pub fn store_trace(&self, key: &TrialKey, record: TrialRecord) -> Result<TrialRecord> {
        match self.write_trace_bytes(key, &record)? {
            None => Ok(record),
            Some(redacted) => Ok(serde_json::from_slice(&redacted)?),
        }
    }

    /// Appends the redacted trace to the log; the bytes written when redaction changed them.
    fn write_trace_bytes(&self, key: &TrialKey, record: &TrialRecord) -> Result<Option<Vec<u8>>> {
        let bytes = serde_json::to_vec(record)?;
        let log = self.trace_log();
        match crate::secrets::redactor().redact_json(&bytes) {
            std::borrow::Cow::Borrowed(_) => {
                log.append(key, &bytes)?;
                Ok(None)
            }
            std::borrow::Cow::Owned(redacted) => {
                log.append(key, &redacted)?;
                Ok(Some(redacted))
            }
        }
    }

    /// Writes `run.json`.
    pub fn write_record(&self, record: &RunRecord) -> Result<()> {
        self.write_json(RUN_FILE, record)
    }

    /// Reads `run.json`.
    pub fn read_record(&self) -> Result<RunRecord> {
        let path = self.root.join(RUN_FILE);
        // Only a file that is not there is no run; one that cannot be read says why.
        if matches!(path.try_exists(), Ok(false)) {
            anyhow::bail!("no run at {}: it has no {RUN_FILE}", self.root.display());
        }
        let newer = |format: u32| {
            anyhow::anyhow!(
                "{} is run format {format}, written by a newer mst (this one reads format {}); \
                 use that mst",
                path.display(),
                super::RUN_FORMAT
            )
        };
        // Read as it is parsed: a run of 100,000 trials has a `run.json` of about 17 MB.
        let record: RunRecord = match crate::files::read_json_file(&path) {
            Ok(record) => record,
            Err(e) => {
                // A newer format may lay out what this mst cannot read: said first.
                #[derive(serde::Deserialize)]
                struct Format {
                    format: u32,
                }
                return match crate::files::read_json_file::<Format>(&path) {
                    Ok(Format { format }) if format > super::RUN_FORMAT => Err(newer(format)),
                    _ => Err(e),
                };
            }
        };
        if record.format > super::RUN_FORMAT {
            return Err(newer(record.format));
        }
        Ok(record)
    }

    /// The trace of `key`, if it was collected: its last line in the trace log, or its own
    /// file in a run of format 1.
    pub fn read_trace(&self, key: &TrialKey) -> Option<TrialRecord> {
        self.trace_log()
            .read(key)
            .or_else(|| self.read_format_1_trace(key))
    }

    /// The trace of `key` read as `T`, with its compact JSON: its line in the trace log as
    /// written, or a format-1 file's record written afresh (so every trace is copied out in
    /// today's shape).
    pub fn read_trace_line<T: TraceLine>(&self, key: &TrialKey) -> Option<(T, Vec<u8>)> {
        let record = match self.trace_log().read_line(key) {
            // As this mst writes a line (UTF-8, no `\u` escape but a control character's,
            // which serde_json writes as `\u00XX`): what it copies out is what was written.
            Some((read, line)) if is_plain_json(&line) => return Some((read, line)),
            // Written elsewhere, or by hand: written afresh from the record, as a reader that
            // parses it sees it (an escape such as `\u0073` spelled out, where the redaction
            // of held secrets looks for it).
            Some((_, line)) => serde_json::from_slice::<TrialRecord>(&line).ok()?,
            None => self.read_format_1_trace(key)?,
        };
        let line = serde_json::to_vec(&record).ok()?;
        Some((serde_json::from_slice(&line).ok()?, line))
    }

    fn read_format_1_trace(&self, key: &TrialKey) -> Option<TrialRecord> {
        let path = self.format_1_trace_file(key);
        // Most runs have no such file: a missing trial is answered by one `lstat`, not by an
        // error with its context (and a backtrace, under `RUST_BACKTRACE`: at the end of a
        // cancelled run, grading alone took 10 s to look for 2,000 missing trials).
        if std::fs::symlink_metadata(&path).is_err() {
            return None;
        }
        let bytes = crate::files::read_regular(&path, 256 << 20, true).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes grades, per-judge scores and the summary. Entries are made from `grades` as they
    /// are written rather than gathered into lists or JSON trees first, so writing takes no
    /// memory however many trials a run has.
    pub fn write_grades(&self, grades: &Grades, summary: &Summary) -> Result<()> {
        #[derive(Serialize)]
        struct ScoreEntry {
            key: TrialKey,
            value: f64,
            pass: bool,
            reason: String,
        }
        self.write_json("grades.json", grades)?;
        // Each judge once, found in one pass (grades may be read from a file as they come).
        let mut judges: BTreeSet<Arc<str>> = BTreeSet::new();
        for grade in grades.values() {
            for score in grade.scores() {
                if !judges.contains(&score.judge) {
                    judges.insert(score.judge.clone());
                }
            }
        }
        for judge in judges {
            // Each judge's scores are written as they are found, not gathered first.
            let scores = || {
                grades.iter().flat_map(|(key, grade)| {
                    let entries: Vec<ScoreEntry> = (grade.scores().iter())
                        .filter(|score| score.judge == judge)
                        .map(|score| ScoreEntry {
                            key: key.as_ref().clone(),
                            value: score.value,
                            pass: score.pass,
                            reason: score.reason.clone(),
                        })
                        .collect();
                    entries
                })
            };
            self.write_json(
                &format!("scores/{}.json", crate::files::path_component(&judge)),
                &crate::files::SeqOf(scores),
            )?;
        }
        self.write_json("summary.json", summary)
    }

    /// Writes `pairwise.json`, every pairwise judge's verdicts per case (nothing when the
    /// eval has no pairwise judges).
    pub fn write_pairwise(&self, pairs: &[PairResult]) -> Result<()> {
        match pairs.is_empty() {
            true => Ok(()),
            false => self.write_json("pairwise.json", &pairs),
        }
    }
}

/// Whether `line` is JSON text as serde_json writes it: valid UTF-8, and no `\u` escape but a
/// control character's (`\u0000` to `\u001f`). (A `\\u` is an escaped backslash and a `u`,
/// counted as an escape here: a needless rewrite, never a missed one.)
fn is_plain_json(line: &[u8]) -> bool {
    std::str::from_utf8(line).is_ok()
        && line
            .windows(6)
            .filter(|w| w.starts_with(b"\\u"))
            .all(|w| w[2..4] == *b"00" && matches!(w[4], b'0' | b'1'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_json_as_serde_json_writes_it_is_copied_as_written() {
        assert!(is_plain_json(br#"{"said":"tab\there \u001f <b> \"q\""}"#));
        assert!(!is_plain_json(br#"{"said":"\u0073ecret"}"#));
        assert!(!is_plain_json(br#"{"said":"\u00e9"}"#));
        assert!(!is_plain_json(b"{\"said\":\"\xff\"}"));
        // A line that spells a held secret with escapes is written afresh, so the redaction
        // sees the secret as it is written when a trace is stored.
        let record: TrialRecord = serde_json::from_slice(
            br#"{"case":{"id":"c","input":1},"trace":{"finalText":"\u0073ecret"}}"#,
        )
        .unwrap();
        let line = serde_json::to_vec(&record).unwrap();
        assert!(is_plain_json(&line), "{}", String::from_utf8_lossy(&line));
        assert!(String::from_utf8_lossy(&line).contains("secret"));
        // Read from a run's log: the hand-written line comes back written afresh, a plain one
        // as it was.
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path(), "r1");
        let key = |case: &str| TrialKey::new("default", case, 0);
        let plain = r#"{"case":{"id":"plain","input":1},"trace":{"finalText":"as written"}}"#;
        let escaped = r#"{"case":{"id":"escaped","input":1},"trace":{"finalText":"\u0073ecret"}}"#;
        std::fs::create_dir_all(&run.root).unwrap();
        std::fs::write(
            run.root.join(super::super::trace_log::TRACES_FILE),
            format!("{plain}\n{escaped}\n"),
        )
        .unwrap();
        let (_, line) = run.read_trace_line::<TrialRecord>(&key("plain")).unwrap();
        assert_eq!(line, plain.as_bytes());
        let (read, line) = run.read_trace_line::<TrialRecord>(&key("escaped")).unwrap();
        assert_eq!(read.trace.final_text.as_deref(), Some("secret"));
        assert!(String::from_utf8_lossy(&line).contains(r#""finalText":"secret""#));
    }

    #[test]
    fn traces_go_to_the_log_and_a_format_1_run_s_files_are_still_read() {
        use crate::eval::trial::CaseRecord;
        use crate::results::trace_log::TRACES_FILE;
        let dir = tempfile::tempdir().unwrap();
        let run = RunDir::new(dir.path(), "r1");
        let key = |case: &str| TrialKey {
            variant: "default".into(),
            case: case.into(),
            trial: 0,
        };
        let answered = |case: &str, text: &str| {
            TrialRecord::answered(CaseRecord::new(case, serde_json::json!("q")), text)
        };
        // Format 1: a file per trial.
        let old = run.root.join("default/c1/0.json");
        std::fs::create_dir_all(old.parent().unwrap()).unwrap();
        std::fs::write(
            &old,
            serde_json::to_vec(&answered("c1", "from a file")).unwrap(),
        )
        .unwrap();
        let mut check = run.trace_check();
        assert!(check(&key("c1")));
        let other = TrialKey {
            variant: "other".into(),
            ..key("c1")
        };
        assert_eq!(
            [check(&key("c1")), check(&key("c3")), check(&other)],
            [true, false, false]
        );
        let read = run.read_trace(&key("c1")).unwrap();
        assert_eq!(read.trace.final_text.as_deref(), Some("from a file"));

        // A new trace goes to the log, one line; the log's version of a trial wins.
        run.write_trace(&key("c2"), &answered("c2", "logged"))
            .unwrap();
        run.write_trace(&key("c1"), &answered("c1", "rewritten"))
            .unwrap();
        assert!(!run.root.join("default/c2").exists());
        let log = std::fs::read_to_string(run.root.join(TRACES_FILE)).unwrap();
        assert_eq!(log.lines().count(), 2, "{log}");
        let read = |case| run.read_trace(&key(case)).unwrap().trace.final_text;
        assert_eq!(read("c2").as_deref(), Some("logged"));
        assert_eq!(read("c1").as_deref(), Some("rewritten"));
        assert!(!run.trace_check()(&key("c3")) && run.read_trace(&key("c3")).is_none());
    }

    #[test]
    fn run_ids_are_utc_timestamps() {
        let id = new_run_id();
        assert_eq!(id.len(), "20261130T015500Z-abcd".len(), "{id}");
    }
}
