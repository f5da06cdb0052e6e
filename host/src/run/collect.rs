//! Collection: the trials still to collect split into shards, one bundle staged per non-empty
//! shard ([`Staging`]) and one machine, each shard's session run on its own thread, the
//! machine's own account of what went wrong, and disposal; then each shard's report, told and
//! recorded ([`Collection::run_and_record`], for a run and a regrade on machines alike).

use super::events::{Reporter, RunEvent};
use crate::eval::config::EvalConfig;
use crate::eval::plan::{shard_of, Plan};
use crate::eval::positions::Positions;
use crate::eval::trial::{CaseIndex, TrialKey, TrialStatus};
use crate::results::RunDir;
use crate::runner::channel::Channel;
use crate::runner::{Keep, MachineRequest, Runner};
use crate::shard::bundle::{
    variants_of, Bundle, BundleWorkspaces, ShardIndex, ShardTrials, WORKSPACES_DIR,
};
use crate::shard::coordinator::{ShardContext, ShardEnd, ShardReport, ShardSession, StoredTrace};
use anyhow::Result;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Instant;

/// One shard's bundle, staged locally.
pub struct StagedShard {
    /// The bundle as staged, but for its cases: they are in the staged file, and the session
    /// looks cases up in the coordinator's own, so they are not held twice while the shard runs.
    pub bundle: Bundle,
    pub dir: PathBuf,
    /// The bundle's trials as positions in the run's plan, when it was staged from one (its
    /// own list of trials is then empty).
    pub in_plan: Option<Positions>,
    /// The image its machine runs, when its trials name one.
    pub image: Option<String>,
}

impl StagedShard {
    /// The shard's trials: positions in `plan` (the run's, which it was staged from), or the
    /// bundle's own list.
    pub fn trials<'a>(&'a self, plan: &'a Plan) -> ShardTrials<'a> {
        match &self.in_plan {
            Some(at) => ShardTrials::InPlan { plan, at },
            None => self.bundle.own_trials(),
        }
    }
}

/// What the bundles of one collection share as they are staged: the eval and run they
/// belong to, the run's shard count, how often their workers send `heartbeat`, and the
/// directory they are staged below.
pub struct Staging<'a> {
    pub config: &'a EvalConfig,
    pub run_id: &'a str,
    pub shards: u32,
    pub heartbeat_ms: u64,
    /// Each shard's bundle is staged in a directory of its own below it ([`Staging::shard_dir`]).
    pub dir: &'a Path,
    /// The run's workspaces: each bundle gets those of its trials.
    pub workspaces: Option<&'a super::workspaces::RunWorkspaces>,
    /// The images the run's trials name: each shard's trials share one.
    pub images: Option<&'a super::images::TrialImages>,
    /// Whether the trials' egress travels over the protocol (the bundles' `egress`).
    pub egress: bool,
}

impl Staging<'_> {
    /// Shard `shard`'s bundle of `trials` ([`Bundle::for_eval`]).
    pub fn bundle(&self, shard: u32, trials: Vec<TrialKey>) -> Bundle {
        let index = ShardIndex {
            index: shard,
            of: self.shards,
        };
        let mut bundle =
            Bundle::for_eval(self.config, self.run_id, trials, index, self.heartbeat_ms);
        bundle.egress = self.egress;
        bundle
    }

    /// Where shard `shard`'s bundle is staged.
    pub fn shard_dir(&self, shard: u32) -> PathBuf {
        self.dir.join(format!("shard-{shard}"))
    }

    /// Splits the trials of `plan` at the positions `to_collect` into bundles, one per shard
    /// that gets trials, and stages each with the cases of `cases` they name.
    pub fn stage_bundles(
        &self,
        cases: &CaseIndex<'_>,
        plan: &Plan,
        to_collect: &[u32],
    ) -> Result<Vec<StagedShard>> {
        // Each case's shard is worked out once: its trials lie together in the plan. Only the
        // shards that get trials are made (a runner may allow billions). Trials that name an
        // image go to shards of that image.
        let mut of_shard: BTreeMap<(Option<&str>, u32), Positions> = BTreeMap::new();
        let mut last: Option<(&str, u32)> = None;
        for &at in to_collect {
            let case = plan.case_of(at as usize);
            let shard = match last {
                Some((of, shard)) if of == case => shard,
                _ => shard_of(case, self.shards),
            };
            last = Some((case, shard));
            let image = (self.images.filter(|images| !images.is_empty()))
                .and_then(|images| images.of(&plan.key(at as usize).variant, case))
                .map(String::as_str);
            // A fresh machine per trial: each trial a shard of its own.
            let shard = if self.config.fresh_machine { at } else { shard };
            of_shard.entry((image, shard)).or_default().push(at);
        }
        // Without images, shard `s` of the run is shard `s`; with them (or a machine per
        // trial), each (image, shard) pair is a shard of its own, numbered in order.
        let numbered =
            self.config.fresh_machine || of_shard.keys().any(|(image, _)| image.is_some());
        let count = of_shard.len() as u32;
        let mut staged = Vec::new();
        for (number, ((image, shard), mut at)) in of_shard.into_iter().enumerate() {
            let shard = if numbered { number as u32 } else { shard };
            // Held while the shard runs: no room to spare.
            at.shrink_to_fit();
            let trials = ShardTrials::InPlan { plan, at: &at };
            let mut bundle = self.bundle(shard, Vec::new());
            if numbered {
                bundle.shards = count;
            }
            bundle.variants = variants_of(self.config, trials.iter());
            let dir = self.shard_dir(shard);
            if let Some(workspaces) = self.workspaces {
                bundle.workspaces = bundle_workspaces(workspaces, &bundle, trials);
                ship_workspaces(workspaces, &bundle.workspaces, &dir)?;
            }
            write_bundle(&dir, &mut bundle, Some(trials), cases)?;
            staged.push(StagedShard {
                bundle,
                dir,
                in_plan: Some(at),
                image: image.map(str::to_string),
            });
        }
        Ok(staged)
    }
}

/// Which of the run's `workspaces` the trials of `bundle` (its `trials`) get.
pub fn bundle_workspaces(
    workspaces: &super::workspaces::RunWorkspaces,
    bundle: &Bundle,
    trials: ShardTrials<'_>,
) -> BundleWorkspaces {
    let variants = (workspaces.trials.variants.iter())
        .filter(|(name, _)| bundle.variants.contains_key(*name))
        .map(|(name, digest)| (name.clone(), digest.clone()))
        .collect();
    let mut cases = BTreeMap::new();
    if !workspaces.trials.cases.is_empty() {
        for key in trials.iter() {
            if let Some(digest) = workspaces.trials.cases.get(&*key.case) {
                cases.insert(key.case.to_string(), digest.clone());
            }
        }
    }
    BundleWorkspaces { variants, cases }
}

/// Puts the archives `named` in the bundle directory `dir`: hard links to the run's packed
/// ones where the file system allows, copies elsewhere. Shipped with the bundle, each once
/// per shard.
pub fn ship_workspaces(
    workspaces: &super::workspaces::RunWorkspaces,
    named: &BundleWorkspaces,
    dir: &Path,
) -> Result<()> {
    use anyhow::Context as _;
    let into = dir.join(WORKSPACES_DIR);
    std::fs::create_dir_all(&into)?;
    for digest in named.digests() {
        let name = crate::workspace::archive_name(digest);
        let (from, to) = (workspaces.dir.join(&name), into.join(&name));
        std::fs::hard_link(&from, &to)
            .or_else(|_| std::fs::copy(&from, &to).map(drop))
            .with_context(|| {
                format!("cannot put the workspace {} in the bundle", from.display())
            })?;
    }
    Ok(())
}

/// Writes `bundle` into the directory `dir` as its worker reads it ([`crate::shard::bundle::write`]),
/// with the cases its trials (`in_plan`, or its own) name as their client sees them
/// ([`CaseRecord::for_client`]: never the answers), written straight from the coordinator's
/// `cases` rather than copied into the bundle first (a run of 100,000 cases would otherwise
/// hold a second copy of them), and the checks of those that have their own.
///
/// [`CaseRecord::for_client`]: crate::eval::trial::CaseRecord::for_client
pub fn write_bundle(
    dir: &Path,
    bundle: &mut Bundle,
    in_plan: Option<ShardTrials<'_>>,
    cases: &CaseIndex<'_>,
) -> Result<()> {
    crate::shard::bundle::write(dir, bundle, in_plan, |id| cases.get(id))
}

/// What the shards of one collection share.
pub struct Collection<'a> {
    /// The plan the shards were staged from (their trials are positions in it).
    pub plan: &'a Plan,
    pub runner: &'a dyn Runner,
    pub keep: Keep,
    pub run_dir: &'a RunDir,
    pub context: &'a ShardContext<'a>,
    pub reporter: &'a dyn Reporter,
}

impl Collection<'_> {
    /// Runs every staged shard on a machine of its own, in parallel, after telling the
    /// runner's plan; then tells of each shard that did not end `done`, and records every
    /// shard's report in `machines` (a run's record of its machines, or its grading's). The
    /// reports, in order.
    pub fn run_and_record(
        &self,
        staged: &[StagedShard],
        machines: &mut Vec<serde_json::Value>,
    ) -> Result<Vec<ShardReport>> {
        for line in self.runner.plan() {
            self.reporter.event(&RunEvent::RunnerPlan(&line));
        }
        let shards = self.run(staged);
        for report in &shards {
            if report.ended != ShardEnd::Done {
                self.reporter.event(&RunEvent::ShardEnded {
                    shard: report.shard,
                    machine: &report.machine,
                    ended: &report.ended,
                });
            }
            machines.push(serde_json::to_value(report)?);
        }
        Ok(shards)
    }

    /// Runs every staged shard on a machine of its own, in parallel; their reports in order.
    fn run(&self, shards: &[StagedShard]) -> Vec<ShardReport> {
        // Three descriptors a machine (docs/scale.md), one to spare, beyond mst's own.
        crate::process::allow_open_files(256 + 4 * shards.len() as u64);
        std::thread::scope(|scope| {
            let handles: Vec<_> = shards
                .iter()
                .map(|staged| scope.spawn(move || self.shard(staged)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("shard threads do not panic"))
                .collect()
        })
    }

    /// One shard's whole life: a machine, the session, the machine's diagnosis, disposal.
    fn shard(&self, staged: &StagedShard) -> ShardReport {
        let bundle = &staged.bundle;
        let note = |message: &str| {
            self.reporter.event(&RunEvent::RunnerNote {
                shard: bundle.shard,
                message,
            })
        };
        let request = MachineRequest {
            run_id: &bundle.run_id,
            shard: bundle.shard,
            shards: bundle.shards,
            note: &note,
            cancel: self.context.cancel,
            image: staged.image.as_deref(),
        };
        let asked = Instant::now();
        let mut machine = match self.runner.create_machine(&request) {
            Ok(machine) => machine,
            Err(e) => return self.not_created(bundle.shard, e),
        };
        let created = Instant::now();
        let trials = staged.trials(self.plan);
        let mut report = ShardSession::new(self.context, bundle, trials, self.run_dir)
            .run(machine.as_mut(), &staged.dir);
        // Times count from when the runner started making the machine, after any wait for
        // room on its hosts (`waitMs` is that wait).
        let since = machine.started_at().unwrap_or(asked);
        report.wait_ms = Some(since.saturating_duration_since(asked).as_millis() as u64);
        report.create_ms = Some(created.duration_since(since).as_millis() as u64);
        report.ready_ms = report
            .hello_at
            .map(|at| at.duration_since(since).as_millis() as u64);
        self.diagnose(machine.as_mut(), trials, &mut report);
        self.dispose(machine.as_mut(), &mut report);
        report
    }

    /// The report of a shard whose machine could not be made. A shard cancelled while its
    /// runner waited was never started.
    fn not_created(&self, shard: u32, error: anyhow::Error) -> ShardReport {
        let ended = match self.context.cancel.load(Ordering::SeqCst) {
            true => ShardEnd::Cancelled,
            false => ShardEnd::Lost(format!("cannot create a machine: {error:#}")),
        };
        ShardReport {
            ended,
            ..ShardReport::new(shard, self.runner.name().to_string())
        }
    }

    /// The machine's own account (out of memory, vanished) says more than a broken channel
    /// does; after a finished shard it taints the trials whose client failed.
    fn diagnose(
        &self,
        machine: &mut dyn Channel,
        trials: ShardTrials<'_>,
        report: &mut ShardReport,
    ) {
        let Some(diagnosis) = machine.diagnose() else {
            return;
        };
        report.ended = match &report.ended {
            ShardEnd::Lost(why) => ShardEnd::Lost(format!("{diagnosis} ({why})")),
            ShardEnd::Done | ShardEnd::DoneCleanupFailed => {
                let collected = (report.collected.ones()).filter_map(|at| trials.get(at));
                let moved = failed_trials_to_infra(
                    self.run_dir,
                    collected,
                    &diagnosis,
                    self.context.stored,
                );
                ShardEnd::Lost(format!(
                    "the worker finished, but {diagnosis}; {moved} trial(s) whose client failed \
                     count as infrastructure failures"
                ))
            }
            // Cancelled or refused at hello: that is the cause.
            other => other.clone(),
        };
    }

    fn dispose(&self, machine: &mut dyn Channel, report: &mut ShardReport) {
        let keep = match self.keep {
            Keep::Always => true,
            // A shard that did not end `done`, or any trial that failed on its machine.
            Keep::Failed => report.ended != ShardEnd::Done || report.failed_trials > 0,
            Keep::Never => false,
        };
        let disposing = Instant::now();
        match machine.dispose(keep) {
            Ok(kept) => report.kept = kept,
            Err(e) => {
                let why = format!("{e:#}");
                self.reporter.event(&RunEvent::DisposeFailed {
                    shard: report.shard,
                    why: &why,
                });
                report.dispose_error = Some(why);
            }
        }
        report.dispose_ms = Some(disposing.elapsed().as_millis() as u64);
    }
}

/// Marks the collected trials whose client did not exit 0 as infrastructure failures caused by
/// `why` (their machine failed under them, e.g. ran out of memory), telling `stored` of each
/// rewritten trace; how many were marked.
fn failed_trials_to_infra(
    run_dir: &RunDir,
    collected: impl Iterator<Item = TrialKey>,
    why: &str,
    stored: Option<&StoredTrace<'_>>,
) -> usize {
    let mut moved = 0;
    for key in collected {
        let Some(mut record) = run_dir.read_trace(&key) else {
            continue;
        };
        if record.trace.status != TrialStatus::Completed || record.trace.exit_code == Some(0) {
            continue;
        }
        record.mark_infra(why);
        if let Ok(record) = run_dir.store_trace(&key, record) {
            moved += 1;
            if let Some(stored) = stored {
                stored(&key, record);
            }
        }
    }
    moved
}
