//! Orchestration: one run end to end, as a pipeline of owners. [`prepare`] checks the config,
//! plugins, cases and judges; [`resume`] opens a new run or the one being resumed; [`collect`]
//! stages bundles and runs each shard's session on its machine; [`grade`] grades the traces;
//! [`regrade`] grades a stored run again, in the coordinator or in grade shards on machines;
//! [`crate::results`] writes the files. [`dry_run`] runs one case on one machine of a runner
//! plugin. Everything a run tells as it goes is a typed [`events::RunEvent`].
//!
//! This is the top of the house: it imports every folder below it, and none imports it.

pub mod collect;
pub mod dry_run;
pub mod events;
pub mod grading;
pub mod images;
pub mod prepare;
pub mod regrade;
pub mod resume;
pub mod workspaces;

use crate::eval::plan::Filters;
use crate::eval::trial::{CaseIndex, TrialKey};
use crate::grade::Grades;
use crate::home::Home;
use crate::plugin::{Grants, Limits};
use crate::results::run_process::{Collector, RunProcess};
use crate::results::stored::StoredRun;
use crate::results::tool_health::ToolTotals;
use crate::results::usage::UsageSummary;
use crate::results::{Phase, ResultsRoot, RunDir, RunRecord, Summary, Timings};
use crate::runner::{self, RunnerOptions};
use crate::shard::artifacts::ArtifactCopier;
use crate::shard::coordinator::{ShardContext, ShardReport, ShardSettings};
use anyhow::{bail, Context, Result};
use collect::Collection;
use events::{Reporter, RunEvent};
use prepare::PluginRequest;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::time::Instant;

/// What collecting trials needs, whoever asks (`mst run`, `mst serve`): the eval, its plugins
/// and secrets, the runner and where results go.
#[derive(Debug, Clone, Default)]
pub struct Setup {
    pub config_path: PathBuf,
    /// `.mst/results` unless told otherwise.
    pub results_base: PathBuf,
    /// `--plugin` files or installed names, granted `plugin_grants`.
    pub plugins: Vec<String>,
    pub plugin_grants: Grants,
    pub plugin_limits: Limits,
    pub runner: String,
    pub runner_options: Vec<String>,
    /// From `--secrets-file`.
    pub secrets: crate::secrets::Secrets,
}

/// An eval ready to collect: prepared and checked, its servers' tokens, its runner.
pub struct Ready {
    pub prepared: prepare::Prepared,
    pub tokens: crate::shard::tokens::ServerTokens,
    pub runner_options: RunnerOptions,
    pub runner: Box<dyn runner::Runner>,
}

/// Prepares `setup`'s eval, runs `check` on it (before the runner exists: a config error must
/// not wait for a runner to reach its hosts), then makes the runner.
pub fn ready(
    home: &Home,
    setup: &Setup,
    check: impl FnOnce(&prepare::Prepared) -> Result<()>,
) -> Result<Ready> {
    let prepared = prepare::prepare(
        home,
        &setup.config_path,
        &PluginRequest {
            extra: &setup.plugins,
            grants: &setup.plugin_grants,
            limits: setup.plugin_limits,
            runner: Some(&setup.runner),
            secrets: &setup.secrets,
        },
    )?;
    check(&prepared)?;
    let tokens = prepared.server_tokens(&setup.secrets)?;
    // Every secret is held now, the servers' tokens too.
    prepared.check_ids_hold_no_secret()?;
    let runner_options = RunnerOptions::with_defaults(home, &setup.runner, &setup.runner_options)?;
    let runner = runner::runner(&setup.runner, &runner_options, &prepared.plugins)?;
    Ok(Ready {
        prepared,
        tokens,
        runner_options,
        runner,
    })
}

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub setup: Setup,
    pub filters: Filters,
    pub resume: Option<String>,
    /// Resume even when the shard count, runner, datasets or a plugin changed.
    pub force: bool,
    pub shard_settings: Option<ShardSettings>,
    /// Which kind of process collects it (recorded in `process.json`).
    pub collector: Collector,
}

/// What a run produced.
pub struct RunOutcome {
    pub dir: RunDir,
    pub record: RunRecord,
    pub summary: Summary,
    /// Every graded trial's grade, as `grades.json` holds them.
    pub grades: Grades,
    /// How each shard of this collection went (a regrade has none).
    pub shards: Vec<ShardReport>,
}

impl RunOutcome {
    /// The outcome of `run`, just written into `dir`, collected by `shards`.
    pub(crate) fn of(dir: RunDir, run: StoredRun, shards: Vec<ShardReport>) -> Self {
        RunOutcome {
            dir,
            record: run.record,
            summary: run.summary,
            grades: run.grades,
            shards,
        }
    }
}

/// Runs (or resumes) an eval; `reporter` hears every event, `Finished` last.
pub fn run(
    home: &Home,
    request: &RunRequest,
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
) -> Result<RunOutcome> {
    let mut ready = ready(home, &request.setup, |prepared| {
        prepared.check_clients(&request.filters)
    })?;
    ready.prepared.pack_workspaces(home)?;
    ready.prepared.images = images::of_run(&ready.prepared.config, &ready.prepared.cases)?;
    let fresh = ready.prepared.config.fresh_machine;
    images::refuse_unless_docker(&ready.prepared.images, ready.runner.name(), fresh)?;
    let root = ResultsRoot::new(&request.setup.results_base);
    let (dir, record) = resume::open(
        &root,
        request,
        &ready.prepared,
        &ready.runner_options,
        reporter,
    )?;
    // The run says which process collects it, and when that process is done, how it ended: a
    // run whose process died without saying is `interrupted` (`mst runs list`). A supervisor
    // that cannot say so could be neither followed nor stopped: it does not start.
    let process = RunProcess::current(request.collector);
    if let Err(e) = dir.write_process(&process) {
        let e = e.context(format!("run {}: cannot record its process", record.run_id));
        match request.collector {
            Collector::Supervisor => return Err(e),
            _ => tracing::warn!("{e:#}"),
        }
    }
    let mut end = RunEnd {
        dir: &dir,
        process,
        exit_code: 2,
    };
    let outcome = collect_and_grade(request, ready, (dir.clone(), record), reporter, cancel);
    match &outcome {
        Ok(outcome) => end.exit_code = reporter.exit_code(outcome.summary.exit_code()),
        // Told before the end is recorded: whoever sees the run ended has heard why.
        Err(error) => reporter.event(&RunEvent::Failed(error)),
    }
    outcome
}

/// Records a run's end in `process.json` when dropped: after the run returned, and also when
/// it panicked (exit code 2), so a run whose process lives on (`mst serve`) is never left
/// `running`.
struct RunEnd<'a> {
    dir: &'a RunDir,
    process: RunProcess,
    exit_code: u8,
}

impl Drop for RunEnd<'_> {
    fn drop(&mut self) {
        self.process.ended_at = Some(crate::clock::unix_secs());
        self.process.exit_code = Some(self.exit_code);
        if let Err(e) = self.dir.write_process(&self.process) {
            tracing::warn!("cannot record the run's end: {e:#}");
        }
    }
}

/// Collects the trials of run `dir` that have no trace yet and grades them: the run from its
/// `Started` event to its `Finished` one.
fn collect_and_grade(
    request: &RunRequest,
    ready: Ready,
    (dir, mut record): (RunDir, RunRecord),
    reporter: &dyn Reporter,
    cancel: &AtomicBool,
) -> Result<RunOutcome> {
    let Ready {
        mut prepared,
        tokens,
        runner_options,
        runner,
    } = ready;

    // The cases are planned now. They are looked up (in their file) while bundles are staged
    // and traces checked and graded, and dropped before the run's files are written.
    let case_list = std::mem::take(&mut prepared.cases);
    let cases = CaseIndex::kept(&case_list);
    let to_collect = trials_to_collect(&record, &dir, &cases)?;
    reporter.event(&RunEvent::Started {
        run_id: &record.run_id,
        total: to_collect.len() as u64,
        resumed: request.resume.is_some(),
    });

    let settings = request.shard_settings.unwrap_or_default();
    let staging_dir = tempfile::tempdir()?;
    let staging = collect::Staging {
        config: &prepared.config,
        run_id: &record.run_id,
        shards: runner_options.shards,
        heartbeat_ms: settings.heartbeat_ms(),
        dir: staging_dir.path(),
        workspaces: Some(&prepared.workspaces),
        images: Some(&prepared.images),
        egress: runner.egress().is_some(),
    };
    let staged = staging.stage_bundles(&cases, &record.trials, &to_collect)?;
    // The bundles hold these keys now.
    let collecting_trials = to_collect.len();
    dir.expect_traces(collecting_trials);
    drop(to_collect);
    let events = |event| reporter.event(&RunEvent::Shard(event));
    let collecting = Instant::now();
    // Each trace is graded as it is stored, on threads of their own, while collection goes on.
    let (judges, plan, run_id) = (&prepared.judges, &record.trials, &record.run_id);
    let (shards, graded, timings) = std::thread::scope(|scope| -> Result<_> {
        let grading = grading::Grading::start(scope, judges, plan, &dir.root)?;
        let stored = |key: &TrialKey, trace| grading.stored(key, trace);
        let artifact_bytes = AtomicU64::new(0);
        let artifacts = prepared.config.artifacts.enabled.then(|| ArtifactCopier {
            root: dir.artifacts_dir(),
            max_trial_bytes: prepared.config.artifacts.max_trial_bytes(),
            max_run_bytes: prepared.config.artifacts.max_run_bytes(),
            run_bytes: &artifact_bytes,
        });
        let context = ShardContext {
            limiter: &prepared.limiter,
            cases: &cases,
            tokens: &tokens,
            settings,
            events: &events,
            cancel,
            resume: None,
            copied: &AtomicU64::new(0),
            artifacts: artifacts.as_ref(),
            stored: Some(&stored),
            models: Some(&prepared.model_access),
            check_files: Some(&prepared.workspaces.check_files),
            egress: runner.egress(),
        };
        let collection = Collection {
            plan,
            runner: runner.as_ref(),
            keep: runner_options.keep,
            run_dir: &dir,
            context: &context,
            reporter,
        };
        let shards = collection.run_and_record(&staged, &mut record.machines)?;
        let collect_ms = collecting.elapsed().as_millis() as u64;
        let draining = Instant::now();
        let graded = grading.finish().with_context(|| {
            format!(
                "run {run_id} stored its traces but could not keep their grades; `mst grade \
                 {run_id}` grades them again"
            )
        })?;
        let timings = Timings {
            collect_ms,
            graded_while_collecting: graded.len() as u64,
            // Grading the traces still queued when collection ended; `finish` adds the rest.
            grade_after_ms: draining.elapsed().as_millis() as u64,
        };
        Ok((shards, graded, timings))
    })?;
    // The bundles' plans are done with: what each shard collected is in its report.
    drop(staged);
    record.timings = Some(timings);

    let (graded, pairs) = grade_rest(&prepared, &cases, &dir, &mut record, graded)?;
    drop(cases);
    drop(case_list);
    let outcome = finish(&prepared, dir, record, shards, graded, pairs)?;
    reporter.event(&RunEvent::Finished(&outcome));
    Ok(outcome)
}

/// The planned trials that have no trace yet; each must refer to a case the datasets hold.
fn trials_to_collect(record: &RunRecord, dir: &RunDir, cases: &CaseIndex<'_>) -> Result<Vec<u32>> {
    let mut has_trace = dir.trace_check();
    // Positions in the plan, four bytes a trial, not a second list of keys beside it. The
    // keys come in the plan's order, a case's together: each case is looked for once.
    let mut to_collect = Vec::new();
    let mut checked: Option<arcstr::ArcStr> = None;
    for (at, key) in record.trials.keys().enumerate() {
        if has_trace(&key) {
            continue;
        }
        if checked.as_ref() != Some(&key.case) {
            if !cases.contains(&key.case) {
                bail!(
                    "trial {key} refers to case `{}`, which the datasets no longer hold",
                    key.case
                );
            }
            checked = Some(key.case.clone());
        }
        to_collect.push(at as u32);
    }
    Ok(to_collect)
}

/// Grades everything collected so far that `graded` (what was graded while collecting) lacks
/// (a resume grades the earlier collections' traces too), into its files, and runs the
/// pairwise judges: the last work that needs the cases.
fn grade_rest(
    prepared: &prepare::Prepared,
    cases: &CaseIndex<'_>,
    dir: &RunDir,
    record: &mut RunRecord,
    graded: grading::Graded,
) -> Result<(grading::Graded, Vec<crate::grade::pairwise::PairResult>)> {
    let grading = Instant::now();
    let trials = &record.trials;
    let graded = grading::grade_rest(&prepared.judges, dir, trials, Some(cases), graded)
        .with_context(|| {
            format!(
                "run {} stored its traces but could not keep their grades; `mst grade {0}` \
                 grades them again",
                record.run_id
            )
        })?;
    let pairs = grading::pairwise_all(&prepared.pairwise, dir, trials, Some(cases));
    if let Some(timings) = &mut record.timings {
        timings.grade_after_ms += grading.elapsed().as_millis() as u64;
    }
    Ok((graded, pairs))
}

/// Reads back what was graded, and writes the record, grades, scores and summary.
fn finish(
    prepared: &prepare::Prepared,
    dir: RunDir,
    mut record: RunRecord,
    shards: Vec<ShardReport>,
    graded: grading::Graded,
    pairs: Vec<crate::grade::pairwise::PairResult>,
) -> Result<RunOutcome> {
    let missing = {
        let mut has_trace = dir.trace_check();
        record.trials.keys().filter(|k| !has_trace(k)).count()
    };
    record.collect = match missing {
        0 => Phase::Complete,
        _ => Phase::Partial,
    };
    let read_back = graded.read(&record.trials)?;
    // The agents' usage, from what grading saw and from the traces it did not.
    let grades = read_back.grades;
    let usage = UsageSummary::of_agents(&dir, &record.trials, read_back.usage, |key| {
        grades.contains_key(key)
    });
    let tools = ToolTotals::of_traces(&dir, &record.trials, read_back.tools, |key| {
        grades.contains_key(key)
    });
    record.grade = grading::grade_phase(&grades, &pairs);
    record.tool_lists = tools.tool_lists().clone();
    prepared.count_usage(&mut record.plugins);
    dir.write_record(&record)?;
    let mut summary =
        Summary::new(&record, &grades, prepared.judges.case_rules()).with_pairs(&pairs);
    summary.usage = usage.with_plugins(&record.plugins);
    summary.servers = tools.health();
    let run = StoredRun::graded(record, summary, grades, pairs);
    let run = grading::write_results(&dir, run)?;
    Ok(RunOutcome::of(dir, run, shards))
}
