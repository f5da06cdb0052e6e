//! One run, start to end: config → plugins → datasets → plan → shards on the runner's
//! machines → gather → grade → results. `--resume` re-enters the same flow for the trials a
//! run is missing.

use super::config::{EvalConfig, JudgeConfig, PluginRef};
use super::dataset::{self, DatasetPlugins};
use super::plan::{self, shard_of};
use crate::grade::{self, GraderPlugins, Judge, TrialGrade};
use crate::home::Home;
use crate::plugin::installed::{InstallStore, PluginSource};
use crate::plugin::{Grants, Limits, LoadedPlugin, PluginHost, Secret};
use crate::results::{self, Filters, Phase, PluginRecord, RunDir, RunRecord, Summary};
use crate::runner::{self, RunnerOptions};
use crate::shard::bundle::{trace_path, Bundle, VariantSpec, BUNDLE_FILE};
use crate::shard::coordinator::{self, Progress, ShardSettings};
use crate::shard::limits::Limiter;
use crate::shard::protocol::{TrialKey, PROTOCOL};
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub config_path: PathBuf,
    /// `.mst/results` unless told otherwise.
    pub results_base: PathBuf,
    /// `--plugin` files or installed names, granted `plugin_grants`.
    pub plugins: Vec<String>,
    pub plugin_grants: Grants,
    pub plugin_limits: Limits,
    pub filters: Filters,
    pub runner: String,
    pub runner_options: Vec<String>,
    pub resume: Option<String>,
    pub shard_settings: Option<ShardSettings>,
    /// From `--secrets-file`.
    pub secrets: crate::secrets::Secrets,
}

/// What a run produced.
pub struct RunOutcome {
    pub dir: RunDir,
    pub record: RunRecord,
    pub summary: Summary,
}

/// Every plugin the run loaded, by the name it declares and by how the config refers to it.
struct Plugins {
    host: PluginHost,
    store: InstallStore,
    by_ref: BTreeMap<String, Arc<LoadedPlugin>>,
    /// Where each plugin (by name) came from, for `run.json`.
    sources: BTreeMap<String, serde_json::Value>,
}

impl Plugins {
    fn load(
        &mut self,
        reference: &str,
        base: &Path,
        grants: &Grants,
        limits: Limits,
        source: serde_json::Value,
    ) -> Result<()> {
        let (bytes, label) = PluginSource::find(&self.store, base, reference)?.read()?;
        let plugin = LoadedPlugin::load(&self.host, &bytes, &label, grants, limits)
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        let plugin = Arc::new(plugin);
        self.sources.insert(plugin.info().name.clone(), source);
        self.by_ref.insert(reference.to_string(), plugin.clone());
        self.by_ref.insert(plugin.info().name.clone(), plugin);
        Ok(())
    }

    fn find(&self, name: &str) -> Result<Arc<LoadedPlugin>> {
        if let Some(plugin) = self.by_ref.get(name) {
            return Ok(plugin.clone());
        }
        bail!("plugin `{name}` is not loaded: list it in the config's `plugins`, pass --plugin, or install it")
    }

    fn records(&self) -> Vec<PluginRecord> {
        let mut seen = BTreeSet::new();
        self.by_ref
            .values()
            .filter(|p| seen.insert(p.digest().to_string()))
            .map(|p| PluginRecord {
                name: p.info().name.clone(),
                version: p.info().version.clone(),
                kind: p.kind().to_string(),
                digest: p.digest().to_string(),
                source: self
                    .sources
                    .get(&p.info().name)
                    .cloned()
                    .unwrap_or_default(),
                declared: p.info().capabilities.clone(),
                granted: p.effective_grants().clone(),
            })
            .collect()
    }
}

impl DatasetPlugins for Plugins {
    fn dataset_plugin(&self, kind: &str) -> Result<Option<&LoadedPlugin>> {
        Ok(self.by_ref.get(kind).map(|p| p.as_ref()))
    }
}

impl GraderPlugins for Plugins {
    fn grader(&self, name: &str) -> Result<Arc<LoadedPlugin>> {
        self.find(name)
    }
}

fn grants_from(config: &super::config::PluginConfig, base: &Path) -> Result<Grants> {
    let read_dirs: Vec<PathBuf> = config.allow_read.iter().map(|d| base.join(d)).collect();
    Grants::from_lists(
        crate::plugin::capabilities::GrantLists {
            exec: &config.allow_exec,
            http: &config.allow_http,
            models: &config.allow_model,
            read_dirs: &read_dirs,
            secrets: &config.allow_secret,
            env: &config.allow_env,
        },
        |list| format!("allow{}{}", list[..1].to_uppercase(), &list[1..]),
    )
}

/// The git commit and dirty flag of the repository holding `dir`, when it is one.
fn git_state(dir: &Path) -> Option<results::GitState> {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("-C")
            .arg(dir)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
    };
    let commit = String::from_utf8(git(&["rev-parse", "HEAD"])?.stdout)
        .ok()?
        .trim()
        .to_string();
    let dirty = !git(&["status", "--porcelain"])?.stdout.is_empty();
    Some(results::GitState { commit, dirty })
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Builds the variant specs the workers need.
fn variant_specs(config: &EvalConfig) -> BTreeMap<String, VariantSpec> {
    config
        .variant_names()
        .into_iter()
        .map(|name| {
            let overrides = config.variants.get(&name).cloned().unwrap_or_default();
            let servers = match &overrides.servers {
                Some(labels) => labels
                    .iter()
                    .filter_map(|l| config.servers.get(l).map(|s| (l.clone(), s.clone())))
                    .collect(),
                None => config.servers.clone(),
            };
            let spec = VariantSpec {
                client: overrides.client.unwrap_or_else(|| config.client.clone()),
                model: overrides.model.or_else(|| config.model.clone()),
                client_options: overrides
                    .client_options
                    .or_else(|| config.client_options.clone()),
                servers,
            };
            (name, spec)
        })
        .collect()
}

/// The config, its plugins and its cases, loaded and checked.
struct Prepared {
    config: EvalConfig,
    config_hash: String,
    base: PathBuf,
    plugins: Plugins,
    cases: dataset::Cases,
}

/// Loads the config at `config_path` with its plugins (and `--plugin` ones) and resolves its
/// datasets.
fn prepare(
    home: &Home,
    config_path: &Path,
    extra_plugins: &[String],
    grants: &Grants,
    limits: Limits,
) -> Result<Prepared> {
    let (config, config_bytes) = EvalConfig::load(config_path)?;
    let base = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let config_hash = hex::encode(Sha256::digest(&config_bytes));

    let mut plugins = Plugins {
        host: PluginHost::new(home.cache_dir())?,
        store: InstallStore::new(home.plugins_dir()),
        by_ref: BTreeMap::new(),
        sources: BTreeMap::new(),
    };
    for reference in &config.plugins {
        let (path, grants) = match reference {
            PluginRef::Name(name) => (name.clone(), Grants::default()),
            PluginRef::Detailed(detail) => (detail.path.clone(), grants_from(detail, &base)?),
        };
        let source = serde_json::to_value(reference)?;
        plugins
            .load(&path, &base, &grants, limits, source)
            .with_context(|| format!("plugin `{path}`"))?;
    }
    let cwd = std::env::current_dir()?;
    for reference in extra_plugins {
        plugins
            .load(
                reference,
                &cwd,
                grants,
                limits,
                serde_json::json!("--plugin"),
            )
            .with_context(|| format!("--plugin {reference}"))?;
    }
    // Judges referring to installed graders load them on first use.
    let judge_configs: Vec<&JudgeConfig> = config
        .judges
        .iter()
        .chain(
            config
                .variants
                .values()
                .flat_map(|v| v.judges.iter().flatten()),
        )
        .collect();
    for judge in &judge_configs {
        if let Some(name) = &judge.plugin {
            if plugins.find(name).is_err() {
                plugins.load(
                    name,
                    &base,
                    &Grants::default(),
                    limits,
                    serde_json::json!({}),
                )?;
            }
        }
    }

    let cases = dataset::resolve(&config.datasets, &base, &plugins)?;
    Ok(Prepared {
        config,
        config_hash,
        base,
        plugins,
        cases,
    })
}

/// Runs (or resumes) an eval.
pub fn run(
    home: &Home,
    request: &RunRequest,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<RunOutcome> {
    let Prepared {
        config,
        config_hash,
        base,
        plugins,
        cases,
    } = prepare(
        home,
        &request.config_path,
        &request.plugins,
        &request.plugin_grants,
        request.plugin_limits,
    )?;
    let runs_dir = results::eval_runs_dir(&request.results_base, &config.name);
    let runner_options = RunnerOptions::parse(&request.runner_options)?;
    let runner = runner::runner(&request.runner, &runner_options, &|name| {
        plugins.find(name).ok()
    })?;

    let (dir, mut record) = match &request.resume {
        Some(run_id) => {
            let dir = RunDir::new(&runs_dir, run_id);
            let record = dir
                .read_record()
                .with_context(|| format!("--resume {run_id}"))?;
            if record.eval != config.name {
                bail!(
                    "--resume {run_id}: that run is of eval `{}`, not `{}`",
                    record.eval,
                    config.name
                );
            }
            if record.config_hash != config_hash {
                progress
                    .note("the config changed since this run started; resuming with the new one");
            }
            (dir, record)
        }
        None => {
            let filters = plan::Filters {
                variants: request.filters.variants.clone(),
                cases: request.filters.cases.clone(),
                trials: request.filters.trials,
            };
            let trials = plan::plan(&config, &cases.cases, &filters)?;
            let run_id = results::new_run_id();
            let record = RunRecord {
                run_id: run_id.clone(),
                eval: config.name.clone(),
                mst: env!("CARGO_PKG_VERSION").to_string(),
                created_at: now_secs(),
                config_path: request.config_path.display().to_string(),
                config_hash: config_hash.clone(),
                git: git_state(&base),
                dataset_hash: cases.content_hash.clone(),
                runner: request.runner.clone(),
                runner_options: runner_options.rest.clone(),
                shards: runner_options.shards,
                machines: Vec::new(),
                plugins: plugins.records(),
                filters: request.filters.clone(),
                trials,
                collect: Phase::Partial,
                grade: Phase::Partial,
            };
            (RunDir::new(&runs_dir, &run_id), record)
        }
    };
    crate::home::create_private_dir(&dir.root)?;
    dir.write_record(&record)?;

    let to_collect: Vec<TrialKey> = record
        .trials
        .iter()
        .filter(|k| !dir.root.join(trace_path(k)).is_file())
        .cloned()
        .collect();
    let cases_by_id: BTreeMap<&str, &super::trial::CaseRecord> =
        cases.cases.iter().map(|c| (c.id.as_str(), c)).collect();
    for key in &to_collect {
        if !cases_by_id.contains_key(key.case.as_str()) {
            bail!(
                "trial {key} refers to case `{}`, which the datasets no longer hold",
                key.case
            );
        }
    }

    // Tokens for servers that name one, by server label; a missing secret is a config error.
    let mut tokens: BTreeMap<String, Secret> = BTreeMap::new();
    for (label, server) in &config.servers {
        if let super::config::ServerConfig::Http(super::config::HttpServer {
            token: Some(name),
            ..
        }) = server
        {
            let value = request.secrets.get(name).with_context(|| {
                format!("servers.{label}.token names secret `{name}`, which --secrets-file does not hold")
            })?;
            tokens.insert(label.clone(), value.clone());
        }
    }
    progress.start(to_collect.len() as u64);

    // Collect: one machine per non-empty shard.
    let shards = runner_options.shards;
    let limiter = Limiter::new(config.limits.clone());
    let specs = variant_specs(&config);
    let settings = request.shard_settings.unwrap_or_default();
    // A client that cannot be configured is a config error, found before any machine exists.
    for (name, spec) in &specs {
        super::client::client(
            &spec.client,
            spec.client_options.as_ref(),
            &spec.servers,
            &BTreeMap::new(),
        )
        .with_context(|| format!("variant `{name}`"))?;
    }
    let staging = tempfile::tempdir()?;
    let mut bundles = Vec::new();
    for shard in 0..shards {
        let trials: Vec<TrialKey> = to_collect
            .iter()
            .filter(|k| shard_of(&k.case, shards) == shard)
            .cloned()
            .collect();
        if trials.is_empty() {
            continue;
        }
        let case_ids: BTreeSet<&str> = trials.iter().map(|k| k.case.as_str()).collect();
        let variants: BTreeSet<&str> = trials.iter().map(|k| k.variant.as_str()).collect();
        let bundle = Bundle {
            protocol: PROTOCOL.to_string(),
            mst: env!("CARGO_PKG_VERSION").to_string(),
            run_id: record.run_id.clone(),
            eval: config.name.clone(),
            shard,
            shards,
            concurrency: config.concurrency,
            timeout_ms: (config.timeout * 1000.0) as u64,
            heartbeat_ms: (settings.silence.as_millis() as u64 / 4).clamp(50, 5_000),
            variants: specs
                .iter()
                .filter(|(n, _)| variants.contains(n.as_str()))
                .map(|(n, s)| (n.clone(), s.clone()))
                .collect(),
            cases: case_ids
                .iter()
                .map(|id| (*cases_by_id[id]).clone())
                .collect(),
            trials,
        };
        let bundle_dir = staging.path().join(format!("shard-{shard}"));
        crate::files::write_atomic(&bundle_dir.join(BUNDLE_FILE), &serde_json::to_vec(&bundle)?)?;
        bundles.push((bundle, bundle_dir));
    }
    for line in runner.plan() {
        progress.note(&line);
    }
    let reports: Vec<coordinator::ShardReport> = std::thread::scope(|scope| {
        let handles: Vec<_> = bundles
            .iter()
            .map(|(bundle, bundle_dir)| {
                let (runner, limiter, dir, tokens) = (&runner, &limiter, &dir, &tokens);
                scope.spawn(move || {
                    let note = |message: &str| progress.note(message);
                    let request = runner::MachineRequest {
                        run_id: &bundle.run_id,
                        shard: bundle.shard,
                        shards: bundle.shards,
                        note: &note,
                        cancel,
                    };
                    let asked = std::time::Instant::now();
                    let mut machine = match runner.create_machine(&request) {
                        Ok(machine) => machine,
                        Err(e) => {
                            // A shard cancelled while its runner waited was never started.
                            let ended = match cancel.load(std::sync::atomic::Ordering::SeqCst) {
                                true => coordinator::ShardEnd::Cancelled,
                                false => coordinator::ShardEnd::Lost(format!(
                                    "cannot create a machine: {e:#}"
                                )),
                            };
                            return coordinator::ShardReport {
                                ended,
                                ..coordinator::ShardReport::new(
                                    bundle.shard,
                                    runner.name().to_string(),
                                )
                            };
                        }
                    };
                    let created = std::time::Instant::now();
                    let mut report = coordinator::run_shard(
                        machine.as_mut(),
                        bundle,
                        bundle_dir,
                        &dir.root,
                        limiter,
                        tokens,
                        progress,
                        cancel,
                        settings,
                    );
                    let since = machine.started_at().unwrap_or(asked);
                    report.create_ms = Some(created.duration_since(since).as_millis() as u64);
                    report.ready_ms = report
                        .hello_at
                        .map(|at| at.duration_since(since).as_millis() as u64);
                    // The machine's own account (out of memory, vanished) says more than a
                    // broken channel does; after a finished shard it taints its failed trials.
                    if let Some(diagnosis) = machine.diagnose() {
                        report.ended = match &report.ended {
                            coordinator::ShardEnd::Lost(why) => {
                                coordinator::ShardEnd::Lost(format!("{diagnosis} ({why})"))
                            }
                            coordinator::ShardEnd::Done
                            | coordinator::ShardEnd::DoneCleanupFailed => {
                                let moved = failed_trials_to_infra(
                                    &dir.root,
                                    &report.collected,
                                    &diagnosis,
                                );
                                coordinator::ShardEnd::Lost(format!(
                                    "the worker finished, but {diagnosis}; {moved} trial(s) \
                                     whose client failed count as infrastructure failures"
                                ))
                            }
                            // Cancelled or refused at hello: that is the cause.
                            other => other.clone(),
                        };
                    }
                    let failed = report.ended != coordinator::ShardEnd::Done;
                    let keep = match runner_options.keep {
                        runner::Keep::Always => true,
                        runner::Keep::Failed => failed,
                        runner::Keep::Never => false,
                    };
                    let disposing = std::time::Instant::now();
                    match machine.dispose(keep) {
                        Ok(kept) => report.kept = kept,
                        Err(e) => {
                            let why = format!("{e:#}");
                            progress.note(&format!(
                                "shard {}: cannot dispose of its machine: {why}",
                                bundle.shard
                            ));
                            report.dispose_error = Some(why);
                        }
                    }
                    report.dispose_ms = Some(disposing.elapsed().as_millis() as u64);
                    report
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("shard threads do not panic"))
            .collect()
    });
    for report in &reports {
        if report.ended != coordinator::ShardEnd::Done {
            progress.note(&format!(
                "shard {} ({}): {}",
                report.shard, report.machine, report.ended
            ));
        }
        record.machines.push(serde_json::to_value(report)?);
    }

    // Gather and grade everything collected so far (a resume regrades the whole run).
    let missing = record
        .trials
        .iter()
        .filter(|k| !dir.root.join(trace_path(k)).is_file())
        .count();
    record.collect = if missing == 0 {
        Phase::Complete
    } else {
        Phase::Partial
    };
    let grades = grade_all(&config, &plugins, &cases_by_id, &dir, &record.trials)?;
    let not_graded = grades
        .values()
        .any(|g| matches!(g, TrialGrade::NotGraded { .. }));
    record.grade = if not_graded {
        Phase::Partial
    } else {
        Phase::Complete
    };
    dir.write_record(&record)?;
    let summary = Summary::new(&record, &grades);
    dir.write_grades(&grades, &summary)?;
    Ok(RunOutcome {
        dir,
        record,
        summary,
    })
}

/// Marks the collected trials whose client did not exit 0 as infrastructure failures caused by
/// `why` (their machine failed under them, e.g. ran out of memory); how many were marked.
fn failed_trials_to_infra(run_dir: &Path, collected: &[TrialKey], why: &str) -> usize {
    let mut moved = 0;
    for key in collected {
        let path = run_dir.join(trace_path(key));
        let Ok(bytes) = std::fs::read(&path) else {
            continue;
        };
        let Ok(mut record) = serde_json::from_slice::<super::trial::TrialRecord>(&bytes) else {
            continue;
        };
        if record.trace.status == super::trial::TrialStatus::Completed
            && record.trace.exit_code != Some(0)
        {
            record.trace.status = super::trial::TrialStatus::Infra;
            // The last log event is an infra trial's reason.
            record.trace.events.push(super::trial::TraceEvent {
                seq: record.trace.events.len() as u64,
                at_ms: record.trace.duration_ms,
                kind: super::trial::EventKind::Log {
                    text: why.to_string(),
                },
            });
            if let Ok(bytes) = serde_json::to_vec(&record) {
                if crate::files::write_atomic(&path, &bytes).is_ok() {
                    moved += 1;
                }
            }
        }
    }
    moved
}

/// Grades every collected trace of `trials` in `dir` (missing ones are left out).
fn grade_all(
    config: &EvalConfig,
    plugins: &Plugins,
    cases_by_id: &BTreeMap<&str, &super::trial::CaseRecord>,
    dir: &RunDir,
    trials: &[TrialKey],
) -> Result<BTreeMap<TrialKey, TrialGrade>> {
    let default_judges: BTreeMap<String, Vec<Judge>> = config
        .variant_names()
        .into_iter()
        .map(|name| {
            let configs = config
                .variants
                .get(&name)
                .and_then(|v| v.judges.clone())
                .unwrap_or_else(|| config.judges.clone());
            let judges = configs
                .iter()
                .map(|j| Judge::from_config(j, plugins))
                .collect::<Result<Vec<_>>>()?;
            Ok((name, judges))
        })
        .collect::<Result<_>>()?;
    let mut grades: BTreeMap<TrialKey, TrialGrade> = BTreeMap::new();
    let mut case_judges: BTreeMap<String, Vec<Judge>> = BTreeMap::new();
    for key in trials {
        let Some(trace) = dir.read_trace(key) else {
            continue;
        };
        let case = cases_by_id.get(key.case.as_str());
        let threshold = case
            .and_then(|c| c.pass_threshold)
            .unwrap_or(config.pass_threshold);
        let judges = match case.and_then(|c| c.judges.as_ref()) {
            Some(configs) => {
                if !case_judges.contains_key(&key.case) {
                    let built = configs
                        .iter()
                        .map(|j| Judge::from_config(j, plugins))
                        .collect::<Result<Vec<_>>>()?;
                    case_judges.insert(key.case.clone(), built);
                }
                &case_judges[&key.case]
            }
            None => default_judges
                .get(&key.variant)
                .map(Vec::as_slice)
                .unwrap_or(&[]),
        };
        grades.insert(key.clone(), grade::grade_trial(judges, &trace, threshold));
    }
    Ok(grades)
}

/// Regrades a stored run's traces with the config's judges as they are now, into a new run
/// directory `<run-id>.g<N>` beside it (the traces stay where they are).
pub fn regrade(
    home: &Home,
    dir: &RunDir,
    config_path: Option<&Path>,
    extra_plugins: &[String],
    grants: &Grants,
    limits: Limits,
) -> Result<RunOutcome> {
    let record = dir.read_record()?;
    let config_path = config_path
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(&record.config_path));
    let Prepared {
        config,
        plugins,
        cases,
        ..
    } = prepare(home, &config_path, extra_plugins, grants, limits)?;
    if config.name != record.eval {
        bail!(
            "run {} is of eval `{}`, but {} is `{}`",
            record.run_id,
            record.eval,
            config_path.display(),
            config.name
        );
    }
    let cases_by_id: BTreeMap<&str, &super::trial::CaseRecord> =
        cases.cases.iter().map(|c| (c.id.as_str(), c)).collect();
    let grades = grade_all(&config, &plugins, &cases_by_id, dir, &record.trials)?;
    let runs_dir = dir.root.parent().context("a run directory has a parent")?;
    let run_id = (1..)
        .map(|n| format!("{}.g{n}", record.run_id))
        .find(|id| !RunDir::new(runs_dir, id).root.exists())
        .expect("some suffix is free");
    let out = RunDir::new(runs_dir, &run_id);
    let mut regraded = record.clone();
    regraded.run_id = run_id;
    regraded.created_at = now_secs();
    regraded.plugins = plugins.records();
    regraded.grade = if grades
        .values()
        .any(|g| matches!(g, TrialGrade::NotGraded { .. }))
    {
        Phase::Partial
    } else {
        Phase::Complete
    };
    crate::home::create_private_dir(&out.root)?;
    out.write_record(&regraded)?;
    let summary = Summary::new(&regraded, &grades);
    out.write_grades(&grades, &summary)?;
    Ok(RunOutcome {
        dir: out,
        record: regraded,
        summary,
    })
}
