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
use std::io::{BufRead, Read};
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
    /// The stored trials to grade, by key; each is taken when it is graded.
    trials: Mutex<HashMap<TrialKey, TrialRecord>>,
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
        let trials = read_trials(&bundle_dir.join(GRADE_TRIALS_FILE))?;
        Ok(GradeClient {
            judges,
            trials: Mutex::new(trials),
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

/// The stored trials of the trials file, by key.
fn read_trials(path: &Path) -> Result<HashMap<TrialKey, TrialRecord>> {
    let file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut trials = HashMap::new();
    let mut reader = std::io::BufReader::new(file);
    let mut line = Vec::new();
    let mut number = 0;
    loop {
        line.clear();
        let read = (&mut reader)
            .take(MAX_TRIAL_BYTES as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            break;
        }
        number += 1;
        if line.len() > MAX_TRIAL_BYTES {
            bail!(
                "{} line {number}: over {MAX_TRIAL_BYTES} bytes",
                path.display()
            );
        }
        let record: TrialRecord = serde_json::from_slice(&line)
            .with_context(|| format!("{} line {number} is not a trial", path.display()))?;
        let key = TrialKey::new(
            record.variant.as_str(),
            record.case.id.clone(),
            record.trial,
        );
        trials.insert(key, record);
    }
    Ok(trials)
}

impl Client for GradeClient {
    fn name(&self) -> &'static str {
        "grade"
    }

    fn run(&self, input: &TrialInput<'_>) -> TraceRecord {
        let mut recorder = Recorder::new(input, Instant::now());
        let key = TrialKey::new(input.variant, input.case.id.clone(), input.trial);
        let stored = self.trials.lock().expect("trials lock").remove(&key);
        let Some(record) = stored else {
            recorder.push(EventKind::Log {
                text: format!("the bundle holds no stored trial {key}"),
            });
            return recorder.finish(TrialStatus::Infra, None, None);
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
