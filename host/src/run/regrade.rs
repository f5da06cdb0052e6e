//! Regrading a stored run into `<run-id>.g<N>` beside it: its traces graded again with the
//! config's judges as they are now (the traces stay where they are). The judges run in the
//! coordinator, or with a runner in grade shards on its machines (ADR 0011): a grade shard is a
//! collection whose client is the plugin judges, so the shard protocol, copy-back caps, lost
//! shards and `keep` are collection's own; its answers are kept in the regrade's
//! `grading/` directory, which `--resume` reads back. The machines score; the coordinator
//! checks each answer, makes the assertions' calls itself and decides every verdict.

use super::collect::{self, Collection, StagedShard};
use super::events::{Reporter, RunEvent};
use super::prepare::{self, PluginRequest, Prepared};
use super::RunOutcome;
use crate::eval::config::VariantSpec;
use crate::eval::plan::shard_of;
use crate::eval::trial::{CaseIndex, CaseRecord, TrialKey, TrialRecord, TrialStatus};
use crate::grade::remote::{GradePlugin, GradeWork, GRADE_TRIALS_FILE};
use crate::grade::{Grades, JudgeCalls, JudgeSet, TrialGrade};
use crate::home::Home;
use crate::plugin::{Grants, Limits};
use crate::results::stored::StoredRun;
use crate::results::{GradingRecord, RunDir, RunRecord, Summary};
use crate::runner::{self, RunnerOptions};
use crate::secrets::Secrets;
use crate::shard::coordinator::{ShardContext, ShardReport, ShardSettings};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Mutex;

/// The directory of a regrade on machines that holds the machines' answers, one stored
/// "trace" per graded trial (docs/results.md).
pub const GRADING_DIR: &str = "grading";

/// What `mst grade` asks for.
pub struct RegradeRequest<'a> {
    /// The config whose judges to use; `None`: the one the run recorded.
    pub config_path: Option<&'a Path>,
    /// `--plugin` files or installed names, granted `grants`.
    pub extra_plugins: &'a [String],
    pub grants: &'a Grants,
    pub limits: Limits,
    pub secrets: &'a Secrets,
    /// Grade on a runner's machines; `None`: in the coordinator.
    pub on: Option<GradeOn<'a>>,
}

/// Grading on machines: the runner, and how the grade shards run.
pub struct GradeOn<'a> {
    /// `local`, `docker` or a runner plugin's name.
    pub runner: &'a str,
    /// `--runner-option` (`shards`, `keep`, and the runner's own).
    pub runner_options: &'a [String],
    /// The regrade (`<run-id>.g<N>`) to go on with: only its trials not graded yet are sent.
    pub resume: Option<&'a str>,
    /// Go on with it even though what it was graded with changed.
    pub force: bool,
    pub settings: ShardSettings,
    pub reporter: &'a dyn Reporter,
    pub cancel: &'a AtomicBool,
}

/// Regrades the run in `dir` into a new `<run-id>.g<N>` (or, with `--resume`, the one named).
pub fn regrade(home: &Home, dir: &RunDir, request: &RegradeRequest<'_>) -> Result<RunOutcome> {
    let record = dir.read_record()?;
    record.refuse_conversation("graded")?;
    let config_path = request
        .config_path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(&record.config_path));
    let prepared = prepare::prepare(
        home,
        &config_path,
        &PluginRequest {
            extra: request.extra_plugins,
            grants: request.grants,
            limits: request.limits,
            runner: request.on.as_ref().map(|on| on.runner),
            secrets: request.secrets,
        },
    )?;
    if prepared.config.name != record.eval {
        bail!(
            "run {} is of eval `{}`, but {} is `{}`",
            record.run_id,
            record.eval,
            config_path.display(),
            prepared.config.name
        );
    }
    let traces = dir.traces_dir(&record.run_id);
    let grading = std::time::Instant::now();
    let (out, mut regraded, grades, shards) = match &request.on {
        None => {
            let grades =
                super::grading::grade_all(&prepared.judges, &traces, &record.trials, None)?;
            let out = dir.next_regrade(&record.run_id)?;
            let mut regraded = record.clone();
            // Graded here, whatever graded the run (or regrade) it grades.
            regraded.grading = None;
            (out, regraded, grades, Vec::new())
        }
        Some(on) => on_machines(home, dir, &record, &prepared, request.limits, on)?,
    };
    let pairs = super::grading::pairwise_all(&prepared.pairwise, &traces, &record.trials, None);
    let grade_ms = grading.elapsed().as_millis() as u64;
    regraded.run_id = out.id();
    regraded.created_at = crate::clock::unix_secs();
    // Like the judges, the baseline is the regrading config's.
    regraded.baseline = prepared.config.baseline.clone();
    regraded.plugins = prepared.plugin_records();
    prepared.count_usage(&mut regraded.plugins);
    let ungraded = regraded.grading.as_ref().map_or(0, |g| g.ungraded);
    regraded.grade = match ungraded {
        0 => super::grading::grade_phase(&grades, &pairs),
        // Trials the machines did not grade: `--resume` grades them.
        _ => crate::results::Phase::Partial,
    };
    regraded.timings = Some(crate::results::Timings {
        grade_after_ms: grade_ms,
        ..Default::default()
    });
    crate::home::create_private_dir(&out.root)?;
    out.write_record(&regraded)?;
    let mut summary =
        Summary::new(&regraded, &grades, prepared.judges.case_rules()).with_pairs(&pairs);
    // The agents' usage is the graded run's; the plugins' is this regrade's own.
    summary.usage =
        crate::results::usage::UsageSummary::of_run(&traces, &regraded.trials, &regraded.plugins);
    let tools = crate::results::tool_health::ToolTotals::default();
    summary.servers = crate::results::tool_health::ToolTotals::of_traces(
        &traces,
        &regraded.trials,
        tools,
        |_| false,
    )
    .health();
    let run = StoredRun::graded(regraded, summary, grades, pairs);
    let run = super::grading::write_results(&out, run)?;
    let outcome = RunOutcome::of(out, run, shards);
    if let Some(on) = &request.on {
        on.reporter.event(&RunEvent::Finished(&outcome));
    }
    Ok(outcome)
}

/// What a regrade on machines made: its directory, its record (with `grading` set, which
/// counts the trials the shards left ungraded), the grades and the grade shards' reports.
type OnMachines = (RunDir, RunRecord, Grades, Vec<ShardReport>);

/// A regrade whose plugin judges run in grade shards on `on`'s machines.
fn on_machines(
    home: &Home,
    dir: &RunDir,
    record: &RunRecord,
    prepared: &Prepared,
    limits: Limits,
    on: &GradeOn<'_>,
) -> Result<OnMachines> {
    // Before anything is written: the judges of the run's trials must be able to go.
    refuse_judges_that_need_secrets(record, prepared)?;
    let options = RunnerOptions::with_defaults(home, on.runner, on.runner_options)?;
    let (out, mut regraded) = regrade_record(dir, record, prepared, &options, on)?;
    let runner = runner::runner(on.runner, &options, &prepared.plugins)?;
    regraded.run_id = out.id();
    regraded.created_at = crate::clock::unix_secs();
    regraded.plugins = prepared.plugin_records();
    regraded.grade = crate::results::Phase::Partial;
    regraded.timings = None;
    // The directory exists from the start, so an interrupted grading can be resumed; until it
    // ends, its record says the grading is partial.
    crate::home::create_private_dir(&out.root)?;
    out.write_record(&regraded)?;
    let answers = RunDir {
        root: out.root.join(GRADING_DIR),
    };
    crate::home::create_private_dir(&answers.root)?;

    let staging_dir = tempfile::tempdir()?;
    let staging = collect::Staging {
        config: &prepared.config,
        run_id: &regraded.run_id,
        shards: options.shards,
        heartbeat_ms: on.settings.heartbeat_ms(),
        dir: staging_dir.path(),
        workspaces: None,
        images: None,
        egress: false,
    };
    let plan = plan(dir, record, prepared, &answers, &staging)?;
    let mut grades = plan.graded;
    on.reporter.event(&RunEvent::Started {
        run_id: &regraded.run_id,
        total: plan.trials.values().map(|keys| keys.len() as u64).sum(),
        resumed: on.resume.is_some(),
    });
    let staged = stage(prepared, &staging, plan.trials, &plan.cases, limits)?;
    let sent: usize = staged.iter().map(|shard| shard.bundle.trials.len()).sum();
    let answered: Mutex<BTreeMap<TrialKey, Option<TrialGrade>>> = Mutex::default();
    let stored = |key: &TrialKey, answer: TrialRecord| {
        let own = plan.assertions.get(key).map_or(&[][..], Vec::as_slice);
        let grade = machine_grade(&prepared.judges, key, own, &answer);
        answered.lock().expect("answers").insert(key.clone(), grade);
    };
    let events = |event| on.reporter.event(&RunEvent::Shard(event));
    let cases = CaseIndex::new(&plan.cases);
    let tokens = crate::shard::tokens::ServerTokens::none();
    let context = ShardContext {
        limiter: &prepared.limiter,
        cases: &cases,
        tokens: &tokens,
        settings: on.settings,
        events: &events,
        cancel: on.cancel,
        resume: None,
        copied: &AtomicU64::new(0),
        artifacts: None,
        stored: Some(&stored),
        // The judges' model calls, made here with the keys only the coordinator holds.
        models: Some(&prepared.model_access),
        check_files: None,
        egress: None,
    };
    // The grade shards' trials are their bundles' own: no plan.
    let no_plan = crate::eval::plan::Plan::default();
    let collection = Collection {
        plan: &no_plan,
        runner: runner.as_ref(),
        keep: options.keep,
        run_dir: &answers,
        context: &context,
        reporter: on.reporter,
    };
    let grading = regraded.grading.get_or_insert_with(GradingRecord::default);
    let shards = collection.run_and_record(&staged, &mut grading.machines)?;
    let graded: Vec<(TrialKey, TrialGrade)> = (answered.into_inner().expect("answers"))
        .into_iter()
        .filter_map(|(key, grade)| Some((key, grade?)))
        .collect();
    grading.ungraded = (sent - graded.len()) as u64;
    grades.extend(graded);
    Ok((out, regraded, grades, shards))
}

/// The record of the regrade on machines that `on` asks for, and where it goes: the regrade
/// `--resume` names, checked against what it was graded with, or a new one. Nothing is
/// written yet.
fn regrade_record(
    dir: &RunDir,
    record: &RunRecord,
    prepared: &Prepared,
    options: &RunnerOptions,
    on: &GradeOn<'_>,
) -> Result<(RunDir, RunRecord)> {
    let grading = GradingRecord {
        runner: on.runner.to_string(),
        runner_options: options.rest.clone(),
        shards: options.shards,
        config_hash: prepared.config_hash.clone(),
        dataset_hash: prepared.cases.content_hash.clone(),
        machines: Vec::new(),
        ungraded: 0,
    };
    Ok(match on.resume {
        Some(id) => {
            let (out, mut regrade) = resume(dir, record, prepared, &grading, id, on.force)?;
            // What it is graded with from now on (the same, unless --force), and every
            // grading's machines.
            let machines = regrade
                .grading
                .take()
                .map(|g| g.machines)
                .unwrap_or_default();
            regrade.grading = Some(GradingRecord {
                machines,
                ..grading
            });
            (out, regrade)
        }
        None => {
            let mut regraded = record.clone();
            regraded.grading = Some(grading);
            (dir.next_regrade(&record.run_id)?, regraded)
        }
    })
}

/// The regrade `id` (of run `record`) to go on with, refused when it is not a regrade of that
/// run on machines, or when what it was graded with (`now` says what that is today: runner,
/// options, shard count, config, datasets) or a plugin changed since.
fn resume(
    dir: &RunDir,
    record: &RunRecord,
    prepared: &Prepared,
    now: &GradingRecord,
    id: &str,
    force: bool,
) -> Result<(RunDir, RunRecord)> {
    let is_of_run = id
        .strip_prefix(&format!("{}.g", record.run_id))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()));
    if !is_of_run {
        bail!(
            "--resume {id}: a regrade of run {} is named {}.gN (see `mst runs list`)",
            record.run_id,
            record.run_id
        );
    }
    let runs = dir.root.parent().context("a run directory has a parent")?;
    let out = RunDir::new(runs, id);
    let regrade = out.read_record().with_context(|| {
        format!(
            "--resume {id}: no regrade `{id}` beside run {}",
            record.run_id
        )
    })?;
    let Some(then) = &regrade.grading else {
        bail!("--resume {id}: that is not a regrade on machines (`mst grade --runner`)");
    };
    let mut changed = Vec::new();
    let mut differs = |what: &str, before: &dyn std::fmt::Debug, after: &dyn std::fmt::Debug| {
        changed.push(format!(
            "the {what} changed ({before:?} then, {after:?} now)"
        ));
    };
    if then.runner != now.runner {
        differs("runner", &then.runner, &now.runner);
    }
    if then.runner_options != now.runner_options {
        differs("runner options", &then.runner_options, &now.runner_options);
    }
    if then.shards != now.shards {
        differs("shard count", &then.shards, &now.shards);
    }
    if then.config_hash != now.config_hash {
        changed.push("the config changed".to_string());
    }
    if then.dataset_hash != now.dataset_hash {
        changed.push("the datasets' content changed".to_string());
    }
    let plugins = prepared.plugin_records();
    for before in &regrade.plugins {
        match plugins.iter().find(|p| p.name == before.name) {
            Some(after) if after.digest != before.digest => {
                changed.push(format!("plugin `{}` changed", before.name))
            }
            // As recorded (the grants' live parts are not part of the record).
            Some(after) if json(&after.granted) != json(&before.granted) => {
                changed.push(format!("plugin `{}` is granted otherwise", before.name))
            }
            Some(_) => {}
            None => changed.push(format!("plugin `{}` is no longer loaded", before.name)),
        }
    }
    for after in &plugins {
        if !regrade.plugins.iter().any(|p| p.name == after.name) {
            changed.push(format!("plugin `{}` is new", after.name));
        }
    }
    if !changed.is_empty() && !force {
        bail!(
            "--resume {id}: {} since its grading began, so its grades may not be comparable; \
             resume with what it was graded with, add --force to go on anyway (e.g. with more \
             memory for its machines), or start a new regrade (without --resume)",
            changed.join("; ")
        );
    }
    Ok((out, regrade))
}

/// `value` as JSON, as the record holds it.
fn json(value: &impl serde::Serialize) -> serde_json::Value {
    serde_json::to_value(value).unwrap_or_default()
}

/// Refuses the run's plugin judges that are granted a secret ([`refuse_if_it_needs_secrets`]),
/// each judge once.
fn refuse_judges_that_need_secrets(record: &RunRecord, prepared: &Prepared) -> Result<()> {
    let mut checked = std::collections::BTreeSet::new();
    for key in record.trials.keys() {
        for judge in prepared.judges.plugin_judges(&key) {
            // A judge's name may be another judge's elsewhere; its plugin and options differ.
            let plugin = judge.plugin().map(|p| p.digest());
            if checked.insert((judge.name.clone(), plugin)) {
                refuse_if_it_needs_secrets(judge)?;
            }
        }
    }
    Ok(())
}

/// A judge whose plugin is granted a secret needs what only the coordinator holds, which no
/// grade shard gets. (Its model calls are no reason: they go through the machine's gateway to
/// the coordinator, which holds the keys.)
fn refuse_if_it_needs_secrets(judge: &crate::grade::Judge) -> Result<()> {
    let Some(plugin) = judge.plugin() else {
        return Ok(());
    };
    let names = &plugin.effective_grants().secret_names;
    if !names.is_empty() {
        let held: Vec<String> = names.iter().map(|s| format!("secret `{s}`")).collect();
        bail!(
            "judge `{}` (plugin {}) is granted {}: secrets stay on the coordinator, so it cannot \
             grade on a runner's machines; grade without --runner, or drop the grant",
            judge.name,
            plugin.label(),
            held.join(", ")
        );
    }
    Ok(())
}

/// Which trials go to which grade shard, and what is graded without one.
struct Plan {
    /// Grades made here: trials whose grade follows from their trace (infra, no judges), and
    /// on `--resume` those a machine already answered.
    graded: Grades,
    /// The trials each grade shard grades, by shard; their stored trials are staged already.
    trials: BTreeMap<u32, Vec<TrialKey>>,
    /// The cases those trials name, as the run stored them (answers included).
    cases: Vec<CaseRecord>,
    /// The calls of those trials' assertion judges, made as they were read (trials with
    /// none are left out): joined with the machines' calls without reading a trace again.
    assertions: BTreeMap<TrialKey, Vec<crate::grade::JudgeCall>>,
}

/// Reads each stored trial once: graded here when no plugin judge needs a machine or a
/// machine answered it already (`--resume`), or written to its shard's trials file where
/// `staging` stages its bundle. Missing trials are left out.
fn plan(
    dir: &RunDir,
    record: &RunRecord,
    prepared: &Prepared,
    answers: &RunDir,
    staging: &collect::Staging<'_>,
) -> Result<Plan> {
    let traces = dir.traces_dir(&record.run_id);
    let judges = &prepared.judges;
    let mut answered = answers.trace_check();
    let mut graded = Vec::new();
    let mut trials: BTreeMap<u32, Vec<TrialKey>> = BTreeMap::new();
    let mut files: BTreeMap<u32, (PathBuf, std::io::BufWriter<std::fs::File>)> = BTreeMap::new();
    let mut cases: BTreeMap<arcstr::ArcStr, CaseRecord> = BTreeMap::new();
    let mut assertions = BTreeMap::new();
    for key in record.trials.keys() {
        let key = &key;
        let Some(stored) = traces.read_trace(key) else {
            continue;
        };
        if !judges.needs_machine(key, &stored) {
            graded.push((key.clone(), judges.grade(key, &stored)));
            continue;
        }
        let own = judges.assertion_calls(key, &stored);
        let answer = answered(key).then(|| answers.read_trace(key)).flatten();
        if let Some(grade) = answer.and_then(|a| machine_grade(judges, key, &own, &a)) {
            graded.push((key.clone(), grade));
            continue;
        }
        if !own.is_empty() {
            assertions.insert(key.clone(), own);
        }
        let shard = shard_of(&key.case, staging.shards);
        let (path, file) = match files.entry(shard) {
            std::collections::btree_map::Entry::Occupied(file) => file.into_mut(),
            std::collections::btree_map::Entry::Vacant(slot) => {
                let dir = staging.shard_dir(shard);
                let path = dir.join(GRADE_TRIALS_FILE);
                let file = std::fs::create_dir_all(&dir)
                    .and_then(|()| std::fs::File::create(&path))
                    .with_context(|| format!("cannot stage {}", path.display()))?;
                slot.insert((path, std::io::BufWriter::new(file)))
            }
        };
        serde_json::to_writer(&mut *file, &stored)
            .map_err(std::io::Error::from)
            .and_then(|()| file.write_all(b"\n"))
            .with_context(|| format!("cannot stage {}", path.display()))?;
        trials.entry(shard).or_default().push(key.clone());
        cases.entry(stored.case.id.clone()).or_insert(stored.case);
    }
    for (path, file) in files.into_values() {
        file.into_inner()
            .map_err(|e| e.into_error())
            .and_then(|file| file.sync_all())
            .with_context(|| format!("cannot stage {}", path.display()))?;
    }
    Ok(Plan {
        graded: graded.into_iter().collect(),
        trials,
        cases: cases.into_values().collect(),
        assertions,
    })
}

/// Stages each grade shard's bundle beside its trials file: the judges of its variants and
/// cases, and the grader plugins they call, copied in by digest with their grants.
fn stage(
    prepared: &Prepared,
    staging: &collect::Staging<'_>,
    trials: BTreeMap<u32, Vec<TrialKey>>,
    cases: &[CaseRecord],
    limits: Limits,
) -> Result<Vec<StagedShard>> {
    let config = &prepared.config;
    let plugins = grade_plugins(prepared, &trials)?;
    let dataset = CaseIndex::kept(&prepared.cases);
    let index = CaseIndex::new(cases);
    // The worker's client is the judges: no agent, servers, checks or artefacts.
    let grade_spec = VariantSpec {
        client: "grade".into(),
        model: None,
        client_options: None,
        servers: BTreeMap::new(),
        provider: None,
        checks: Vec::new(),
        tool_policy: Default::default(),
    };
    // Only the plugin judges travel: the coordinator makes the assertions' calls itself.
    let plugin_judges = |configs: &[crate::eval::config::JudgeConfig]| {
        let judges = configs.iter().filter(|judge| judge.plugin.is_some());
        judges.cloned().collect::<Vec<_>>()
    };
    let mut staged = Vec::new();
    for (shard, keys) in trials {
        let dir = staging.shard_dir(shard);
        let most_judges = keys
            .iter()
            .map(|key| prepared.judges.plugin_judges(key).len())
            .max()
            .unwrap_or(1) as u64;
        let mut bundle = staging.bundle(shard, keys);
        let variant_judges = bundle
            .variants
            .keys()
            .map(|name| (name.clone(), plugin_judges(config.variant_judges(name))))
            .collect();
        for spec in bundle.variants.values_mut() {
            *spec = grade_spec.clone();
        }
        let mut case_judges = BTreeMap::new();
        // Each case once: a case's trials lie together.
        for trials in bundle.trials.chunk_by(|a, b| a.case == b.case) {
            let id = &trials[0].case;
            if let Some(case) = dataset.get(id)? {
                if let Some(judges) = &case.more().judges {
                    case_judges.insert(id.to_string(), plugin_judges(judges));
                }
            }
        }
        bundle.artifacts = None;
        bundle.timeout_ms = (limits.call_timeout.as_millis() as u64).saturating_mul(most_judges);
        bundle.grading = Some(GradeWork {
            variant_judges,
            case_judges,
            plugins: plugins.iter().map(|(plugin, _)| plugin.clone()).collect(),
            plugin_memory_bytes: limits.memory_bytes as u64,
            plugin_timeout_ms: limits.call_timeout.as_millis() as u64,
        });
        for (plugin, bytes) in &plugins {
            let path = dir.join(plugin.file());
            std::fs::create_dir_all(path.parent().expect("a plugin file has a directory"))
                .and_then(|()| std::fs::write(&path, bytes))
                .with_context(|| format!("cannot stage {}", path.display()))?;
        }
        collect::write_bundle(&dir, &mut bundle, None, &index)?;
        staged.push(StagedShard {
            bundle,
            dir,
            in_plan: None,
            image: None,
        });
    }
    Ok(staged)
}

/// The grader plugins the judges of `trials` call, each once with its component and grants.
fn grade_plugins(
    prepared: &Prepared,
    trials: &BTreeMap<u32, Vec<TrialKey>>,
) -> Result<Vec<(GradePlugin, Vec<u8>)>> {
    let mut plugins: BTreeMap<String, (GradePlugin, Vec<u8>)> = BTreeMap::new();
    let used = trials.values().flatten();
    let judges = used.flat_map(|key| prepared.judges.plugin_judges(key));
    for plugin in judges.filter_map(|judge| judge.plugin()) {
        if plugins.contains_key(plugin.digest()) {
            continue;
        }
        let grants = plugin.effective_grants();
        let shipped = GradePlugin {
            name: plugin.info().name.clone(),
            references: prepared.plugins.references(plugin),
            digest: plugin.digest().to_string(),
            exec: grants.exec.iter().map(|g| g.program.clone()).collect(),
            read_dirs: grants.read_dirs.clone(),
            http: grants.http.iter().cloned().collect(),
            models: grants.models.iter().cloned().collect(),
            name_version: plugin.name_version().to_string(),
        };
        // A machine names the plugin making a model call by `name version`: two components
        // called alike would share one grant.
        let twin = plugins
            .values()
            .find(|(p, _)| p.name_version == shipped.name_version);
        if let Some((twin, _)) = twin {
            bail!(
                "plugins {} and {} both call themselves `{}`, so grade shards could not tell \
                 their model calls apart: load one of them",
                twin.digest,
                shipped.digest,
                shipped.name_version
            );
        }
        let bytes = prepared.plugins.component(plugin)?;
        plugins.insert(plugin.digest().to_string(), (shipped, bytes));
    }
    Ok(plugins.into_values().collect())
}

/// The grade of trial `key` from a machine's `answer` (its grade shard's stored "trace") and
/// the trial's own `assertions` calls: `None` when the machine could not grade it (the trial
/// stays ungraded, for `--resume`); a `not-graded` grade naming the shard when its answer is
/// refused.
fn machine_grade(
    judges: &JudgeSet,
    key: &TrialKey,
    assertions: &[crate::grade::JudgeCall],
    answer: &TrialRecord,
) -> Option<TrialGrade> {
    if answer.trace.status != TrialStatus::Completed {
        return None;
    }
    let calls = answer
        .trace
        .final_text
        .as_deref()
        .ok_or_else(|| "it holds no answer".to_string())
        .and_then(|text| {
            serde_json::from_str::<JudgeCalls>(text).map_err(|e| format!("not judge calls: {e}"))
        });
    match calls.and_then(|calls| judges.grade_calls(key, assertions, calls)) {
        Ok(grade) => Some(grade),
        Err(why) => {
            let shard = answer.collected_by.as_ref().map(|c| c.shard.to_string());
            Some(TrialGrade::NotGraded {
                judge: format!("grade shard {}", shard.as_deref().unwrap_or("?")),
                error: format!("the machine's answer was refused: {why}"),
            })
        }
    }
}
