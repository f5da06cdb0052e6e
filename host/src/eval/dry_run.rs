//! `mst plugin check --dry-run` for runner plugins: after the static check, the plugin's
//! options, one machine, one trial through the real shard protocol, and disposal, each step
//! timed. The trial is a one-case eval whose client runs `sh -c cat` on the machine (so the
//! machine needs a POSIX `sh`), run by the same code as `mst run` with one shard.

use super::run::{run, RunRequest};
use crate::home::Home;
use crate::plugin::{Grants, Limits, LoadedPlugin, PluginHost};
use crate::runner::plugin::PluginRunner;
use crate::runner::RunnerOptions;
use crate::shard::coordinator::Progress;
use crate::shard::protocol::TrialKey;
use serde::Serialize;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How one step went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Status {
    Ok,
    Failed,
    /// Not reached: an earlier step failed.
    Skipped,
}

/// One step of the dry run.
#[derive(Debug, Clone, Serialize)]
pub struct Step {
    pub name: &'static str,
    pub status: Status,
    /// How long it took, when it ran.
    #[serde(rename = "ms", skip_serializing_if = "Option::is_none")]
    pub millis: Option<u64>,
    /// What it made, or why it failed.
    pub detail: String,
}

/// The whole dry run.
#[derive(Debug, Clone, Serialize)]
pub struct DryRun {
    pub steps: Vec<Step>,
    /// What the run said along the way (the runner's plan, notes about shards).
    pub notes: Vec<String>,
}

impl DryRun {
    /// Whether every step succeeded.
    pub fn ok(&self) -> bool {
        self.steps.iter().all(|s| s.status == Status::Ok)
    }

    /// The steps as aligned lines for a person.
    pub fn render(&self) -> String {
        let mut out = String::from("dry run:\n");
        for step in &self.steps {
            let took = step.millis.map(|ms| format!("{ms} ms")).unwrap_or_default();
            let status = match step.status {
                Status::Ok => "ok",
                Status::Failed => "FAILED",
                Status::Skipped => "skipped",
            };
            out.push_str(&format!(
                "  {:<16} {:<8} {:>9}  {}\n",
                step.name, status, took, step.detail
            ));
        }
        out
    }

    fn push(&mut self, name: &'static str, status: Status, millis: Option<u64>, detail: String) {
        self.steps.push(Step {
            name,
            status,
            millis,
            detail,
        });
    }

    /// Marks `names` as not reached.
    fn skip(&mut self, names: &[&'static str]) {
        for name in names {
            self.push(name, Status::Skipped, None, String::new());
        }
    }
}

/// What to dry-run.
pub struct DryRunRequest<'a> {
    /// The runner plugin's `.wasm` file.
    pub file: &'a Path,
    /// `--runner-option key=value`; `shards` is forced to 1.
    pub runner_options: &'a [String],
    pub grants: Grants,
    pub limits: Limits,
}

/// Collects notes instead of printing them.
#[derive(Default)]
struct Notes(Mutex<Vec<String>>);

impl Progress for Notes {
    fn start(&self, _total: u64) {}
    fn trial(&self, _key: &TrialKey, _collected: bool) {}
    fn note(&self, message: &str) {
        self.0.lock().expect("notes").push(message.to_string());
    }
}

const STEPS_AFTER_OPTIONS: [&str; 4] = ["create machine", "worker ready", "one trial", "dispose"];

/// Runs the dry run. Never returns an error: every failure is a step's.
pub fn dry_run(home: &Home, request: DryRunRequest<'_>) -> DryRun {
    let mut report = DryRun {
        steps: Vec::new(),
        notes: Vec::new(),
    };
    let started = Instant::now();
    let name = match check_options(home, &request) {
        Ok(name) => {
            let ms = started.elapsed().as_millis() as u64;
            report.push(
                "options",
                Status::Ok,
                Some(ms),
                format!("{name} accepts them"),
            );
            name
        }
        Err(e) => {
            let ms = started.elapsed().as_millis() as u64;
            report.push("options", Status::Failed, Some(ms), format!("{e:#}"));
            report.skip(&STEPS_AFTER_OPTIONS);
            return report;
        }
    };
    match one_trial(home, &request, &name) {
        Ok((outcome, notes, _results)) => {
            report.notes = notes;
            read_outcome(&mut report, &outcome);
        }
        Err(e) => {
            report.push("create machine", Status::Failed, None, format!("{e:#}"));
            report.skip(&STEPS_AFTER_OPTIONS[1..]);
        }
    }
    report
}

/// Loads the plugin and lets it check the options; its name.
fn check_options(home: &Home, request: &DryRunRequest<'_>) -> anyhow::Result<String> {
    let options = RunnerOptions::parse(request.runner_options)?;
    let bytes = crate::files::read_input(request.file)?;
    let host = PluginHost::new(home.cache_dir())?;
    let label = request.file.display().to_string();
    let plugin = LoadedPlugin::load(&host, &bytes, &label, &request.grants, request.limits)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let name = plugin.info().name.clone();
    PluginRunner::new(Arc::new(plugin), &options.rest)?;
    Ok(name)
}

/// Runs the one-case eval on one machine of runner `name`; its outcome, the run's notes, and
/// the directory holding its results (removed when dropped).
fn one_trial(
    home: &Home,
    request: &DryRunRequest<'_>,
    name: &str,
) -> anyhow::Result<(super::run::RunOutcome, Vec<String>, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let case =
        serde_json::json!({"id": "dry-run", "input": "mst dry run", "expected": "mst dry run"});
    std::fs::write(dir.path().join("cases.jsonl"), format!("{case}\n"))?;
    let config = serde_json::json!({
        "name": "dry-run",
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": ["sh", "-c", "cat"]},
        "judges": [{"assert": "exit-code", "value": 0}],
        "concurrency": 1,
        "timeout": 60
    });
    std::fs::write(
        dir.path().join("eval.json"),
        serde_json::to_vec_pretty(&config)?,
    )?;
    let mut runner_options: Vec<String> = request
        .runner_options
        .iter()
        .filter(|o| !o.starts_with("shards="))
        .cloned()
        .collect();
    runner_options.push("shards=1".into());
    let file = request
        .file
        .canonicalize()
        .unwrap_or_else(|_| request.file.to_path_buf());
    let run_request = RunRequest {
        config_path: dir.path().join("eval.json"),
        results_base: dir.path().join("results"),
        plugins: vec![file.display().to_string()],
        plugin_grants: request.grants.clone(),
        plugin_limits: request.limits,
        filters: Default::default(),
        runner: name.to_string(),
        runner_options,
        resume: None,
        shard_settings: None,
        secrets: Default::default(),
    };
    let notes = Notes::default();
    let outcome = run(home, &run_request, &notes, &AtomicBool::new(false))?;
    let notes = notes.0.into_inner().expect("notes");
    Ok((outcome, notes, dir))
}

/// The machine's and the trial's steps, from what the run recorded.
fn read_outcome(report: &mut DryRun, outcome: &super::run::RunOutcome) {
    let Some(machine) = outcome.record.machines.first() else {
        report.push(
            "create machine",
            Status::Failed,
            None,
            "the run made no machine".into(),
        );
        report.skip(&STEPS_AFTER_OPTIONS[1..]);
        return;
    };
    let ms = |field: &str| machine[field].as_u64();
    let ended = match machine["ended"]["reason"].as_str() {
        Some(reason) => reason.to_string(),
        None => machine["ended"]["status"]
            .as_str()
            .unwrap_or("?")
            .to_string(),
    };
    let description = machine["machine"].as_str().unwrap_or_default().to_string();
    let Some(created) = ms("createMs") else {
        report.push("create machine", Status::Failed, None, ended);
        report.skip(&STEPS_AFTER_OPTIONS[1..]);
        return;
    };
    report.push("create machine", Status::Ok, Some(created), description);
    // `readyMs` counts from asking for the machine; this step is what came after it was made.
    match ms("readyMs").map(|ready| ready.saturating_sub(created)) {
        Some(ready) => {
            let worker = &machine["placement"]["workerPlaced"];
            let detail = match worker.as_bool() {
                Some(true) => "the worker was placed on the machine".to_string(),
                _ => "hello from the worker".to_string(),
            };
            report.push("worker ready", Status::Ok, Some(ready), detail)
        }
        None => report.push("worker ready", Status::Failed, None, ended.clone()),
    }
    let trace_file = outcome.dir.root.join("default/dry-run/0.json");
    let trace = std::fs::read(&trace_file)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok());
    let passed = outcome
        .summary
        .variants
        .values()
        .map(|v| v.passed)
        .sum::<u32>()
        == 1;
    match &trace {
        Some(trace) => {
            let trace = &trace["trace"];
            let status = trace["status"].as_str().unwrap_or("?");
            let detail = match passed {
                true => format!("{status}: `sh -c cat` echoed the case back"),
                false => format!(
                    "{status}: {}",
                    trace["error"]
                        .as_str()
                        .or(trace["finalText"].as_str())
                        .unwrap_or("the trial did not pass")
                ),
            };
            let status = if passed { Status::Ok } else { Status::Failed };
            report.push("one trial", status, trace["durationMs"].as_u64(), detail);
        }
        None => report.push(
            "one trial",
            Status::Failed,
            None,
            format!("no trace came back ({ended})"),
        ),
    }
    match (ms("disposeMs"), machine["disposeError"].as_str()) {
        (Some(took), None) => {
            let detail = match machine["kept"].as_str() {
                Some(kept) => format!("kept: {kept}"),
                None => "released".to_string(),
            };
            report.push("dispose", Status::Ok, Some(took), detail)
        }
        (took, Some(why)) => report.push("dispose", Status::Failed, took, why.to_string()),
        (None, None) => report.push("dispose", Status::Failed, None, "never ran".into()),
    }
}
