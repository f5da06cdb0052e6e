//! The `grade` client of a grade shard (`mst grade RUN --runner …`, docs/runners.md): its
//! trials are stored trials to grade. For each it runs that trial's plugin judges (the only
//! judges a grade bundle carries; assertions are graded by the coordinator) on this machine and
//! answers with their calls ([`JudgeCalls`], as JSON in the trace's final text); the
//! coordinator checks them and decides the verdict. No config names it: a worker builds it
//! when its bundle carries `grading`.

use super::{Client, Recorder, TrialInput};
use crate::eval::trial::{EventKind, TraceRecord, TrialKey, TrialRecord, TrialStatus};
use crate::grade::{call_judges, JudgeCalls, JudgeSet};
use crate::plugin::set::PluginSet;
use crate::plugin::{Grants, Limits, LoadedPlugin, PluginHost};
use crate::shard::bundle::{GradePlugin, GradeWork, GRADE_TRIALS_FILE};
use anyhow::{bail, Context, Result};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest grader plugin a grade shard loads.
const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// The largest line of the trials file: one stored trial.
const MAX_TRIAL_BYTES: usize = 256 << 20;

/// Runs the judges of the stored trials its bundle carries.
pub struct GradeClient {
    judges: JudgeSet,
    /// The stored trials to grade; each is read, once, when it is graded.
    trials: TrialsFile,
    /// Where the plugins' compiled code is cached while the shard runs; removed with it.
    _cache: tempfile::TempDir,
}

impl GradeClient {
    /// Loads what `work` names from `bundle_dir`: each plugin checked against its digest and
    /// given its grants, the judges built on them, and the stored trials.
    pub fn load(work: &GradeWork, bundle_dir: &Path) -> Result<Self> {
        let cache = tempfile::Builder::new()
            .prefix("mst-grade-cache-")
            .tempdir()
            .context("cannot make a directory for the graders' compiled code")?;
        let host = PluginHost::new(cache.path().to_path_buf())?;
        let limits = Limits {
            memory_bytes: usize::try_from(work.plugin_memory_bytes).unwrap_or(usize::MAX),
            call_timeout: Duration::from_millis(work.plugin_timeout_ms),
        };
        let mut plugins = PluginSet::default();
        for plugin in &work.plugins {
            let loaded = load_plugin(&host, plugin, bundle_dir, limits)
                .with_context(|| format!("grader plugin `{}`", plugin.name))?;
            plugins.insert(Arc::new(loaded), &plugin.references);
        }
        let judges = JudgeSet::from_configs(&work.variant_judges, &work.case_judges, &plugins)?;
        let trials = TrialsFile::open(&bundle_dir.join(GRADE_TRIALS_FILE))?;
        Ok(GradeClient {
            judges,
            trials,
            _cache: cache,
        })
    }
}

/// Loads `plugin` from the bundle: the file its digest names, which must hash to it.
fn load_plugin(
    host: &PluginHost,
    plugin: &GradePlugin,
    bundle_dir: &Path,
    limits: Limits,
) -> Result<LoadedPlugin> {
    // The digest names a file: 64 hex digits and nothing else.
    if plugin.digest.len() != 64 || !plugin.digest.bytes().all(|b| b.is_ascii_hexdigit()) {
        bail!("its digest {:?} is not a sha256", plugin.digest);
    }
    let path = bundle_dir.join(plugin.file());
    let bytes = crate::files::read_regular(&path, MAX_PLUGIN_BYTES, true)?;
    let actual = crate::plugin::loaded::digest(&bytes);
    if !actual.eq_ignore_ascii_case(&plugin.digest) {
        bail!(
            "{} has sha256 {actual}, not the {} the coordinator sent",
            path.display(),
            plugin.digest
        );
    }
    let grants = Grants {
        exec: plugin.exec.iter().cloned().collect(),
        read_dirs: plugin.read_dirs.clone(),
        http: plugin.http.iter().cloned().collect(),
        ..Grants::default()
    };
    let loaded = LoadedPlugin::load(host, &bytes, &plugin.name, &grants, limits)
        .map_err(|failure| anyhow::Error::new(*failure))?;
    if loaded.info().name != plugin.name {
        bail!(
            "the component declares the name `{}`, not `{}`",
            loaded.info().name,
            plugin.name
        );
    }
    Ok(loaded)
}

/// The trials file, and where each stored trial is in it: a trial is read when it is graded,
/// so the worker holds one trial's trace at a time per grading thread, not the shard's.
struct TrialsFile {
    file: std::fs::File,
    /// Each trial's line: its offset and length; taken when the trial is graded.
    lines: Mutex<HashMap<TrialKey, (u64, usize)>>,
}

/// The fields of a stored trial's line that name it.
#[derive(serde::Deserialize)]
struct KeyOfLine {
    case: CaseIdOfLine,
    variant: String,
    trial: u32,
}

/// A stored trial's case id.
#[derive(serde::Deserialize)]
struct CaseIdOfLine {
    id: String,
}

impl TrialsFile {
    /// Indexes the trials file at `path` by key, reading it once.
    fn open(path: &Path) -> Result<Self> {
        let cap = crate::shard::bundle::MAX_BUNDLE_BYTES;
        let mut reader = crate::files::LineReader::open(path, cap, MAX_TRIAL_BYTES)?;
        let mut lines = HashMap::new();
        while let Some(line) = reader.next_line()? {
            let len = line.len();
            let key = serde_json::from_slice::<KeyOfLine>(line).with_context(|| {
                format!("{} line {} is not a trial", path.display(), reader.number())
            })?;
            let key = TrialKey::new(key.variant, key.case.id, key.trial);
            lines.insert(key, (reader.offset(), len));
        }
        Ok(TrialsFile {
            file: reader.into_file(),
            lines: Mutex::new(lines),
        })
    }

    /// The stored trial `key`, once: `None` when the file has none (or it was taken).
    fn take(&self, key: &TrialKey) -> Option<Result<TrialRecord, String>> {
        let (offset, len) = self.lines.lock().expect("trials lock").remove(key)?;
        Some(
            crate::files::read_json_at(&self.file, offset, len)
                .map_err(|e| format!("the bundle's stored trial {key} cannot be read: {e}")),
        )
    }
}

impl Client for GradeClient {
    fn name(&self) -> &'static str {
        "grade"
    }

    fn run(&self, input: &TrialInput<'_>) -> TraceRecord {
        let mut recorder = Recorder::new(input, Instant::now());
        let key = TrialKey::new(input.variant, input.case.id.clone(), input.trial);
        let record = match self.trials.take(&key) {
            Some(Ok(record)) => record,
            failed => {
                let text = match failed {
                    Some(Err(why)) => why,
                    _ => format!("the bundle holds no stored trial {key}"),
                };
                recorder.push(EventKind::Log { text });
                return recorder.finish(TrialStatus::Infra, None, None);
            }
        };
        let calls = match call_judges(self.judges.judges_for(&key), &record) {
            // Cut as the coordinator's check expects; the plugin's stderr may run long.
            JudgeCalls::NotGraded { judge, error } => JudgeCalls::NotGraded {
                judge,
                error: crate::plugin::bounds::cut(error, crate::plugin::bounds::MAX_ERROR),
            },
            scores => scores,
        };
        let answer = serde_json::to_string(&calls).expect("judge calls serialise");
        recorder.finish(TrialStatus::Completed, Some(answer), Some(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::CaseRecord;

    #[test]
    fn stored_trials_are_read_one_at_a_time_and_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(GRADE_TRIALS_FILE);
        let record = |case: &str, answer: &str| {
            let mut record = TrialRecord::answered(CaseRecord::new(case, "q".into()), answer);
            record.variant = "v".into();
            record
        };
        let (a, b) = (record("a", "first"), record("b", "second, longer"));
        let lines = [&a, &b]
            .map(|r| serde_json::to_string(r).unwrap())
            .join("\n");
        std::fs::write(&path, lines + "\n").unwrap();
        let trials = TrialsFile::open(&path).unwrap();
        let key = |case: &str| TrialKey::new("v", case, 0);
        assert_eq!(trials.take(&key("b")), Some(Ok(b)));
        assert_eq!(trials.take(&key("a")), Some(Ok(a)));
        assert_eq!(trials.take(&key("a")), None, "taken once");
        assert_eq!(trials.take(&key("c")), None);

        std::fs::write(&path, "{\"not\": \"a trial\"}\n").unwrap();
        let error = format!("{:#}", TrialsFile::open(&path).err().unwrap());
        assert!(error.contains("line 1 is not a trial"), "{error}");

        // A link (or anything but a regular file) in its place is not read.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        let error = format!("{:#}", TrialsFile::open(&path).err().unwrap());
        assert!(error.contains("not a regular file"), "{error}");
    }

    #[test]
    fn a_bundles_plugin_must_be_named_by_a_digest_and_hash_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let cache = tempfile::tempdir().unwrap();
        let host = PluginHost::new(cache.path().to_path_buf()).unwrap();
        let plugin = |digest: &str| GradePlugin {
            name: "acme/grader/x".into(),
            references: Vec::new(),
            digest: digest.into(),
            exec: Vec::new(),
            read_dirs: Vec::new(),
            http: Vec::new(),
        };
        let refused = |plugin: &GradePlugin| {
            let error = load_plugin(&host, plugin, dir.path(), Limits::default()).err();
            format!("{:#}", error.expect("refused"))
        };
        // A digest that would name a file elsewhere is refused before any path is made.
        for digest in [
            "../../etc/passwd",
            &"a".repeat(63),
            &format!("{}/", "a".repeat(63)),
        ] {
            assert!(
                refused(&plugin(digest)).contains("is not a sha256"),
                "{digest}"
            );
        }
        // A file that does not hash to its name is refused before it is compiled.
        let named = "0".repeat(64);
        let plugins_dir = dir.path().join(crate::shard::bundle::GRADE_PLUGINS_DIR);
        std::fs::create_dir_all(plugins_dir).unwrap();
        std::fs::write(
            dir.path().join(plugin(&named).file()),
            b"\0asm not a grader",
        )
        .unwrap();
        let error = refused(&plugin(&named));
        assert!(
            error.contains("not the") && error.contains(&named),
            "{error}"
        );
        // A link in its place is not followed.
        let real = dir.path().join("real.wasm");
        std::fs::write(&real, b"x").unwrap();
        let linked = crate::plugin::loaded::digest(b"x");
        std::os::unix::fs::symlink(&real, dir.path().join(plugin(&linked).file())).unwrap();
        let error = refused(&plugin(&linked));
        assert!(error.contains("is not a regular file"), "{error}");
    }
}
