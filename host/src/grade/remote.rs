//! Grading on a runner's machines (`mst grade RUN --runner …`, ADR 0011, docs/runners.md):
//! what a grade shard's bundle carries for its judges ([`GradeWork`], with its stored trials in
//! [`GRADE_TRIALS_FILE`] and its grader plugins in [`GRADE_PLUGINS_DIR`]), and what runs them on
//! the machine ([`RemoteGrader`]). For each stored trial it runs that trial's plugin judges (the
//! only judges a grade bundle carries; assertions are graded by the coordinator) and answers
//! with their calls ([`JudgeCalls`], as JSON); the coordinator checks them and decides the
//! verdict.
//!
//! The worker's `grade` client wraps a [`RemoteGrader`]: clients are a layer above grading, so
//! the trace it records is the worker's to make (`shard/worker.rs`).

use crate::eval::config::JudgeConfig;
use crate::eval::trial::{TrialKey, TrialRecord};
use crate::grade::{call_judges, JudgeCalls, JudgeSet};
use crate::llm::ModelAccess;
use crate::plugin::set::PluginSet;
use crate::plugin::{Grants, Limits, LoadedPlugin, PluginHost};
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The file in a grade shard's bundle directory holding the stored trials to grade, one trial
/// record (case with its answers, and trace) per line.
pub const GRADE_TRIALS_FILE: &str = "trials.jsonl";

/// The directory in a grade shard's bundle directory holding its grader plugins, each as
/// `<sha256>.wasm`.
pub const GRADE_PLUGINS_DIR: &str = "plugins";

/// What a grade shard's worker needs to run the judges: their configs, the grader plugins
/// they call with what the operator granted each, and the plugins' per-call caps.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GradeWork {
    /// The judges of each variant the shard's trials name.
    pub variant_judges: BTreeMap<String, Vec<JudgeConfig>>,
    /// The judges of the cases that have their own (they replace the variant's).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub case_judges: BTreeMap<String, Vec<JudgeConfig>>,
    /// The grader plugins the judges call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub plugins: Vec<GradePlugin>,
    /// The most memory one plugin call may use, in bytes.
    pub plugin_memory_bytes: u64,
    /// The most time one plugin call may take, in milliseconds.
    pub plugin_timeout_ms: u64,
}

/// One grader plugin of a grade shard: found in the bundle by its digest, checked against it
/// before it is compiled, and granted what the operator granted it on the coordinator (a
/// program to `exec` is that program on the machine).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct GradePlugin {
    /// The name the plugin declares.
    pub name: String,
    /// Every name the judges use for it (its declared name, a path, an installed name).
    pub references: Vec<String>,
    /// sha256 of the component, hex.
    pub digest: String,
    /// Programs it may run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exec: Vec<String>,
    /// Directories it may read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub read_dirs: Vec<std::path::PathBuf>,
    /// HTTP hosts it may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub http: Vec<String>,
    /// Model providers it may call: its calls go through the machine's model gateway to the
    /// coordinator, which holds the keys.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub models: Vec<String>,
    /// Its declared `name version`, which its model calls name.
    pub name_version: String,
}

impl GradeWork {
    /// Whether a judge may call models: each trial then gets a gateway token.
    pub fn calls_models(&self) -> bool {
        self.plugins.iter().any(|p| !p.models.is_empty())
    }
}

impl GradePlugin {
    /// Where the component is in the bundle directory.
    pub fn file(&self) -> String {
        format!("{GRADE_PLUGINS_DIR}/{}.wasm", self.digest)
    }
}

/// The largest grader plugin a grade shard loads.
const MAX_PLUGIN_BYTES: u64 = 256 << 20;

/// The largest line of the trials file: one stored trial.
const MAX_TRIAL_BYTES: usize = 256 << 20;

/// Runs the judges of the stored trials a grade shard's bundle carries.
pub struct RemoteGrader {
    judges: JudgeSet,
    /// The stored trials to grade; each is read, once, when it is graded.
    trials: TrialsFile,
    /// Where the plugins' compiled code is cached while the shard runs; removed with it.
    _cache: tempfile::TempDir,
}

impl RemoteGrader {
    /// Loads what `work` names from `bundle_dir`: each plugin checked against its digest and
    /// given its grants, the judges built on them, and the stored trials, whose file may hold
    /// at most `max_trials_bytes` (the worker's cap on a bundle's files).
    pub fn load(work: &GradeWork, bundle_dir: &Path, max_trials_bytes: u64) -> Result<Self> {
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
        let trials = TrialsFile::open(&bundle_dir.join(GRADE_TRIALS_FILE), max_trials_bytes)?;
        Ok(RemoteGrader {
            judges,
            trials,
            _cache: cache,
        })
    }

    /// The answer for stored trial `key`: its judges' calls as JSON, their model calls made
    /// through `models` (the machine's gateway with the trial's token). `Err` says why it
    /// cannot be graded here (the bundle holds no such trial, or it cannot be read): an
    /// `infra` trial.
    pub fn answer(
        &self,
        key: &TrialKey,
        models: Option<&Arc<ModelAccess>>,
    ) -> Result<String, String> {
        let record = match self.trials.take(key) {
            Some(record) => record?,
            None => return Err(format!("the bundle holds no stored trial {key}")),
        };
        let calls = match call_judges(self.judges.judges_for(key), &record, models) {
            // Cut as the coordinator's check expects; the plugin's stderr may run long.
            JudgeCalls::NotGraded { judge, error } => JudgeCalls::NotGraded {
                judge,
                error: crate::plugin::bounds::cut(error, crate::plugin::bounds::MAX_ERROR),
            },
            scores => scores,
        };
        Ok(serde_json::to_string(&calls).expect("judge calls serialise"))
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
        models: plugin.models.iter().cloned().collect(),
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
#[derive(Deserialize)]
struct KeyOfLine {
    case: CaseIdOfLine,
    variant: String,
    trial: u32,
}

/// A stored trial's case id.
#[derive(Deserialize)]
struct CaseIdOfLine {
    id: String,
}

impl TrialsFile {
    /// Indexes the trials file at `path`, of at most `cap` bytes, by key, reading it once.
    fn open(path: &Path, cap: u64) -> Result<Self> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::CaseRecord;

    /// The trials file's cap in these tests: far above what they write.
    const CAP: u64 = 1 << 20;

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
        let trials = TrialsFile::open(&path, CAP).unwrap();
        let key = |case: &str| TrialKey::new("v", case, 0);
        assert_eq!(trials.take(&key("b")), Some(Ok(b)));
        assert_eq!(trials.take(&key("a")), Some(Ok(a)));
        assert_eq!(trials.take(&key("a")), None, "taken once");
        assert_eq!(trials.take(&key("c")), None);

        std::fs::write(&path, "{\"not\": \"a trial\"}\n").unwrap();
        let error = format!("{:#}", TrialsFile::open(&path, CAP).err().unwrap());
        assert!(error.contains("line 1 is not a trial"), "{error}");

        // A link (or anything but a regular file) in its place is not read.
        std::fs::remove_file(&path).unwrap();
        std::os::unix::fs::symlink(dir.path().join("elsewhere"), &path).unwrap();
        let error = format!("{:#}", TrialsFile::open(&path, CAP).err().unwrap());
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
            models: Vec::new(),
            name_version: "acme/grader/x 1.0.0".into(),
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
        let plugins_dir = dir.path().join(GRADE_PLUGINS_DIR);
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
