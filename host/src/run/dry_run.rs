//! `mst plugin check --dry-run` for runner plugins, and `mst runner check` for the built-in
//! runners: the runner's options, one machine, one trial through the real shard protocol, and
//! disposal, each step timed, run by the same code as `mst run` with one shard. The trial is one case of the
//! user's own eval (`--config eval.json --case ID`, its first variant), or else a built-in
//! one-case eval whose client runs `sh -c cat` on the machine (so the machine needs a POSIX
//! `sh`).

use super::events::{Reporter, RunEvent};
use super::{run, RunOutcome, RunRequest};
use crate::eval::config::EvalConfig;
use crate::eval::plan::Filters;
use crate::eval::trial::TrialStatus;
use crate::home::Home;
use crate::plugin::set::PluginLoader;
use crate::plugin::{Grants, Limits};
use crate::runner::plugin::PluginRunner;
use crate::runner::RunnerOptions;
use crate::shard::coordinator::ShardReport;
use serde::Serialize;
use std::path::{Path, PathBuf};
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
    /// The runner to try.
    pub runner: DryRunner<'a>,
    /// `--runner-option key=value`; `shards` is forced to 1.
    pub runner_options: &'a [String],
    pub grants: Grants,
    pub limits: Limits,
    /// `--secrets-file`'s secrets, for the case's servers, models and `secretEnv`.
    pub secrets: crate::secrets::Secrets,
    /// One case of the user's own eval to run instead of the built-in one.
    pub case: Option<EvalCase<'a>>,
}

/// The runner a dry run tries.
#[derive(Debug, Clone, Copy)]
pub enum DryRunner<'a> {
    /// A runner plugin: a `.wasm` file or an installed plugin's name.
    Plugin(&'a str),
    /// A built-in runner (`local`, `docker`).
    BuiltIn(&'a str),
}

/// One case of an eval config.
pub struct EvalCase<'a> {
    pub config: &'a Path,
    pub case: &'a str,
}

/// Collects the run's notes instead of printing them.
#[derive(Default)]
struct Notes(Mutex<Vec<String>>);

impl Reporter for Notes {
    fn event(&self, event: &RunEvent<'_>) {
        if let Some(note) = event.note() {
            self.0.lock().expect("notes").push(note);
        }
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
            read_outcome(&mut report, &outcome, request.case.is_some());
        }
        Err(e) => {
            report.push("create machine", Status::Failed, None, format!("{e:#}"));
            report.skip(&STEPS_AFTER_OPTIONS[1..]);
        }
    }
    report
}

/// Lets the runner check the options (a plugin loaded first); its name.
fn check_options(home: &Home, request: &DryRunRequest<'_>) -> anyhow::Result<String> {
    let plugin = match request.runner {
        DryRunner::Plugin(plugin) => plugin,
        DryRunner::BuiltIn(name) => {
            let options = RunnerOptions::with_defaults(home, name, request.runner_options)?;
            crate::runner::runner(name, &options, &Default::default())?;
            return Ok(name.to_string());
        }
    };
    let loader = PluginLoader::new(home, request.limits)?;
    let cwd = std::env::current_dir()?;
    let plugin = loader.load(&cwd, plugin, &request.grants)?;
    let name = plugin.info().name.clone();
    let options = RunnerOptions::with_defaults(home, &name, request.runner_options)?;
    PluginRunner::new(Arc::new(plugin), &options.rest)?;
    Ok(name)
}

/// Writes the built-in one-case eval into `dir`; its config's path.
fn builtin_eval(dir: &Path) -> anyhow::Result<PathBuf> {
    let case =
        serde_json::json!({"id": "dry-run", "input": "mst dry run", "expected": "mst dry run"});
    std::fs::write(dir.join("cases.jsonl"), format!("{case}\n"))?;
    let config = serde_json::json!({
        "name": "dry-run",
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": ["sh", "-c", "cat"]},
        "judges": [{"assert": "exit-code", "value": 0}],
        "concurrency": 1,
        "timeout": 60
    });
    let path = dir.join("eval.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    Ok(path)
}

/// Runs the one case on one machine of runner `name`; its outcome, the run's notes, and the
/// directory holding its results (removed when dropped).
fn one_trial(
    home: &Home,
    request: &DryRunRequest<'_>,
    name: &str,
) -> anyhow::Result<(RunOutcome, Vec<String>, tempfile::TempDir)> {
    let dir = tempfile::tempdir()?;
    let (config_path, filters) = match &request.case {
        Some(EvalCase { config, case }) => {
            let (eval, _) = EvalConfig::load(config)?;
            let first = eval.variant_names().remove(0);
            let filters = Filters {
                variants: vec![first],
                cases: vec![case.to_string()],
                trials: Some(1),
            };
            (config.to_path_buf(), filters)
        }
        None => (builtin_eval(dir.path())?, Filters::default()),
    };
    let mut runner_options: Vec<String> = request
        .runner_options
        .iter()
        .filter(|o| !o.starts_with("shards="))
        .cloned()
        .collect();
    runner_options.push("shards=1".into());
    // A file is found from here, whatever directory the run resolves plugins from.
    let plugins = match request.runner {
        DryRunner::Plugin(plugin) => match Path::new(plugin).canonicalize() {
            Ok(path) if path.is_file() => vec![path.display().to_string()],
            _ => vec![plugin.to_string()],
        },
        DryRunner::BuiltIn(_) => Vec::new(),
    };
    let run_request = RunRequest {
        setup: super::Setup {
            config_path,
            results_base: dir.path().join("results"),
            plugins,
            plugin_grants: request.grants.clone(),
            plugin_limits: request.limits,
            runner: name.to_string(),
            runner_options,
            secrets: request.secrets.clone(),
        },
        filters,
        resume: None,
        force: false,
        shard_settings: None,
        collector: Default::default(),
    };
    let notes = Notes::default();
    let outcome = run(home, &run_request, &notes, &AtomicBool::new(false))?;
    let notes = notes.0.into_inner().expect("notes");
    Ok((outcome, notes, dir))
}

/// The machine's and the trial's steps, from the shard's report and the trace. With the
/// user's own case the trial must be collected; the built-in one must also pass.
fn read_outcome(report: &mut DryRun, outcome: &RunOutcome, user_case: bool) {
    let Some(machine) = outcome.shards.first() else {
        report.push(
            "create machine",
            Status::Failed,
            None,
            "the run made no machine (is the case in the eval?)".into(),
        );
        report.skip(&STEPS_AFTER_OPTIONS[1..]);
        return;
    };
    let ended = machine.ended.to_string();
    let Some(created) = machine.create_ms else {
        report.push("create machine", Status::Failed, None, ended);
        report.skip(&STEPS_AFTER_OPTIONS[1..]);
        return;
    };
    report.push(
        "create machine",
        Status::Ok,
        Some(created),
        machine.machine.clone(),
    );
    // `readyMs` counts from the start of the machine; this step is what came after it was made.
    match machine.ready_ms.map(|ready| ready.saturating_sub(created)) {
        Some(ready) => {
            let detail = match machine.placement["workerPlaced"].as_bool() {
                Some(true) => "the worker was placed on the machine",
                _ => "hello from the worker",
            };
            report.push("worker ready", Status::Ok, Some(ready), detail.to_string())
        }
        None => report.push("worker ready", Status::Failed, None, ended.clone()),
    }
    one_trial_step(report, outcome, user_case, &ended);
    dispose_step(report, machine);
}

fn one_trial_step(report: &mut DryRun, outcome: &RunOutcome, user_case: bool, ended: &str) {
    let key = outcome.record.trials.get(0);
    let trace = key.and_then(|key| outcome.dir.read_trace(&key));
    let Some(trace) = trace else {
        let detail = format!("no trace came back ({ended})");
        return report.push("one trial", Status::Failed, None, detail);
    };
    let passed = outcome
        .summary
        .variants
        .values()
        .map(|v| v.passed)
        .sum::<u32>()
        == 1;
    let collected = trace.trace.status == TrialStatus::Completed;
    let status = format!("{:?}", trace.trace.status).to_lowercase();
    let (ok, detail) = match (user_case, passed) {
        (false, true) => (true, format!("{status}: `sh -c cat` echoed the case back")),
        (true, _) if collected => {
            let verdict = if passed { "passed" } else { "did not pass" };
            (
                true,
                format!(
                    "{status}: case `{}` ran and {verdict} its judges",
                    trace.case.id
                ),
            )
        }
        _ => {
            let why = trace
                .trace
                .final_text
                .clone()
                .unwrap_or_else(|| "the trial did not pass".to_string());
            (false, format!("{status}: {why}"))
        }
    };
    let status = if ok { Status::Ok } else { Status::Failed };
    report.push("one trial", status, Some(trace.trace.duration_ms), detail);
}

fn dispose_step(report: &mut DryRun, machine: &ShardReport) {
    match (machine.dispose_ms, &machine.dispose_error) {
        (Some(took), None) => {
            let detail = match &machine.kept {
                Some(kept) => format!("kept: {kept}"),
                None => "released".to_string(),
            };
            report.push("dispose", Status::Ok, Some(took), detail)
        }
        (took, Some(why)) => report.push("dispose", Status::Failed, took, why.clone()),
        (None, None) => report.push("dispose", Status::Failed, None, "never ran".into()),
    }
}
