//! Results: the run directory and everything in it (see `docs/results.md`).
//!
//! `.mst/results/<eval>/runs/<run-id>/` holds `run.json` (provenance and phases), every trial's
//! trace in `traces.jsonl` ([`trace_log`]), `scores/<judge>.json`, `grades.json`,
//! `pairwise.json` (when the eval has pairwise judges), `summary.json`, and
//! `shards/<n>.worker.log`, and `process.json` ([`run_process`]: the process collecting into it).
//! [`export`] rewrites a stored run in another tool's layout; [`diff`]
//! compares two runs of one eval.

pub mod case_outcomes;
pub mod diff;
pub mod durations;
pub mod export;
pub mod junit;
pub mod layout;
pub mod markup;
pub mod run_process;
pub mod stats;
pub mod stored;
pub mod summary_text;
pub mod tool_health;
pub mod trace_log;
pub mod usage;

pub use case_outcomes::CaseOutcomes;
pub use layout::{trace_path, trial_dir, ResultsRoot, RunDir};

use crate::eval::plan::{Filters, Plan};
use crate::eval::trial::TrialKey;
use crate::grade::pairwise::{PairOutcome, PairResult};
use crate::grade::{CaseOutcome, Grades, TrialGrade};

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Whether a phase finished for every trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Complete,
    Partial,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Phase::Complete => "complete",
            Phase::Partial => "partial",
        })
    }
}

/// A plugin a run used.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PluginRecord {
    pub name: String,
    pub version: String,
    pub kind: String,
    pub digest: String,
    /// Where the run got it: its entry in the config's `plugins`, or `"--plugin"`.
    pub source: serde_json::Value,
    /// Everything it declared it may ask for.
    pub declared: Vec<crate::plugin::capabilities::Capability>,
    /// What it received: the declaration intersected with the operator's grants (secret names
    /// only, never values).
    pub granted: crate::plugin::capabilities::Effective,
    /// What its `model` calls used while this run graded (absent when it made none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<crate::llm::UsageTotals>,
}

/// The git state of the config's repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GitState {
    pub commit: String,
    pub dirty: bool,
    /// The `origin` remote's URL, without credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub origin: Option<String>,
}

/// The `run.json` format this build writes; a record of a later format is refused, so an
/// older mst never half-reads (and rewrites) a newer run. Format 2 keeps the traces in one
/// log, `traces.jsonl`; format 1 kept a file per trial, which this build still reads.
pub const RUN_FORMAT: u32 = 2;

fn first_format() -> u32 {
    1
}

/// `run.json`: where and how a run ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
    /// [`RUN_FORMAT`] when written; records from before the field was added are format 1.
    #[serde(default = "first_format")]
    pub format: u32,
    pub run_id: String,
    pub eval: String,
    pub mst: String,
    /// Seconds since the Unix epoch.
    pub created_at: u64,
    pub config_path: String,
    /// sha256 of the config file's bytes.
    pub config_hash: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git: Option<GitState>,
    pub dataset_hash: String,
    pub runner: String,
    /// The runner's options (never secrets).
    pub runner_options: BTreeMap<String, String>,
    pub shards: u32,
    /// Each shard's machine and how it ended, over every collection (first run and resumes).
    pub machines: Vec<serde_json::Value>,
    pub plugins: Vec<PluginRecord>,
    /// The command line's filters, so `--resume` plans the same trials.
    pub filters: Filters,
    /// Every planned trial, listed as keys. Shared: grades kept in a file name their trials
    /// by position in it (`grade::Grades`).
    pub trials: Plan,
    /// The config's `baseline` variant, which the others are compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    pub collect: Phase,
    pub grade: Phase,
    /// A playground conversation session: its turns are dependent evidence, never cases, so
    /// it lists no trials and cannot be graded or read as cases.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conversation: bool,
    /// Where the last collection's time went (a regrade's: its grading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timings: Option<Timings>,
    /// A regrade whose judges ran on machines (`mst grade RUN --runner …`): where and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grading: Option<GradingRecord>,
    /// The workspaces its trials got, each once, with its digest.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<crate::workspace::WorkspaceRecord>,
    /// The eval's reference variants and what each must do on every case.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub references: BTreeMap<String, crate::eval::config::Expected>,
    /// The MCP tools each variant's clients were shown, through its `tools` and `dryRun`, by
    /// variant and server: the effective tool list, from the trials' `tools-listed` events.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tool_lists: tool_health::ToolLists,
}

/// Where a regrade's judges ran when they ran on machines, and with what: a `--resume` of the
/// regrade is refused when any of it changed. The machines' answers are in
/// `grading/traces.jsonl`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GradingRecord {
    /// The runner the grade shards ran on.
    pub runner: String,
    /// The runner's options (never secrets).
    pub runner_options: BTreeMap<String, String>,
    /// The grade shards' count.
    pub shards: u32,
    /// sha256 of the regrading config's bytes (its judges).
    pub config_hash: String,
    /// sha256 over the cases the regrading config resolved (their own judges).
    pub dataset_hash: String,
    /// Each grade shard's machine and how it ended, over every grading of the regrade (a
    /// resumed one lists both), as `machines` lists a collection's.
    pub machines: Vec<serde_json::Value>,
    /// Trials the last grading sent to machines that came back without a grade (lost,
    /// cancelled, or their machine could not grade them): what `--resume` grades.
    #[serde(default)]
    pub ungraded: u64,
}

/// Where a run's time went: collecting (trials were graded as they arrived, meanwhile) and
/// grading what was left once collection ended (a regrade: all of it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Timings {
    /// From the first machine asked for to the last shard's end.
    pub collect_ms: u64,
    /// Trials graded as their traces were stored, while collection went on.
    pub graded_while_collecting: u64,
    /// Grading after collection ended: the stored traces still queued, the trials not graded
    /// yet (a resumed run's earlier ones) and the pairwise comparisons.
    pub grade_after_ms: u64,
}

impl RunRecord {
    /// Refuses `doing` (e.g. `graded`) on a playground conversation session: its turns depend
    /// on each other, so they are evidence of one conversation, never cases.
    pub fn refuse_conversation(&self, doing: &str) -> anyhow::Result<()> {
        if self.conversation {
            anyhow::bail!(
                "`{}` is a playground conversation session: its turns continue one another, so \
                 they are not cases and cannot be {doing}; read its turns with `mst serve` \
                 (`GET /api/v1/sessions/{}`) or in its session.json",
                self.run_id,
                self.run_id
            );
        }
        Ok(())
    }
}

/// Per variant: how many cases ended each way.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantSummary {
    pub passed: u32,
    pub failed: u32,
    pub incomplete: u32,
    pub not_graded: u32,
    pub infra: u32,
    /// passed / (passed + failed); incomplete, not-graded and infra cases are left out.
    pub pass_rate: Option<f64>,
    /// Its interval, mean score, pass@k and flakiness ([`stats::VariantFigures`]).
    #[serde(flatten)]
    pub figures: stats::VariantFigures,
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub run_id: String,
    pub eval: String,
    pub collect: Phase,
    pub grade: Phase,
    /// The run's `baseline` variant, which the others are compared with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    pub variants: BTreeMap<String, VariantSummary>,
    /// `cases[variant][case]`.
    pub cases: BTreeMap<String, CaseOutcomes>,
    /// The rules that made the case verdicts (`casePass`): the eval's, and cases' own.
    #[serde(default)]
    pub case_pass: crate::grade::CaseRules,
    /// Trials whose trace never came back.
    pub missing: Vec<TrialKey>,
    /// Each variant but the baseline (the config's `baseline`, or the first variant) against
    /// it, over the cases both decided.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub comparisons: BTreeMap<String, stats::Comparison>,
    /// Per pairwise judge: how its cases ended, counted for its variant `a`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairs: Vec<PairSummary>,
    /// What the agents' and the plugins' model calls used (absent when none was made).
    #[serde(default, skip_serializing_if = "usage::UsageSummary::is_empty")]
    pub usage: usage::UsageSummary,
    /// How each MCP server fared: calls, errors, latency, tools never called (absent when no
    /// call was recorded with its server).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub servers: BTreeMap<String, tool_health::ServerHealth>,
    /// The trials ran unsandboxed (the `local` runner without `isolation=bwrap`): their
    /// agents could read and write what the operator can, the cases' answers among it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsandboxed: bool,
    /// The workspaces laid into its trials' work directories, with their digests.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub workspaces: Vec<crate::workspace::WorkspaceRecord>,
    /// Cases a reference variant did not do as expected on (its `oracle` failed, its `nop`
    /// passed): broken tasks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub broken: Vec<BrokenCase>,
}

/// A case a reference variant did not do as expected on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BrokenCase {
    pub case: String,
    pub variant: String,
    /// What the variant must do on it.
    pub expected: crate::eval::config::Expected,
}

/// The cases of `cases` (by variant) that a reference variant of `references` did otherwise
/// than expected on; a case it did not decide (missing, infra, not graded) is not counted.
fn broken_cases(
    references: &BTreeMap<String, crate::eval::config::Expected>,
    cases: &BTreeMap<String, CaseOutcomes>,
) -> Vec<BrokenCase> {
    use crate::eval::config::Expected;
    let mut broken = Vec::new();
    for (variant, expected) in references {
        let Some(outcomes) = cases.get(variant) else {
            continue;
        };
        for (case, outcome) in outcomes.iter() {
            let wrong = matches!(
                (expected, outcome),
                (Expected::Pass, CaseOutcome::Failed) | (Expected::Fail, CaseOutcome::Passed)
            );
            if wrong {
                broken.push(BrokenCase {
                    case: case.to_string(),
                    variant: variant.clone(),
                    expected: *expected,
                });
            }
        }
    }
    broken
}

/// One pairwise judge's cases, counted for variant `a` (a win is a case both orders gave
/// to `a`, a loss one both gave to `b`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PairSummary {
    pub name: String,
    pub a: String,
    pub b: String,
    pub wins: u32,
    pub ties: u32,
    pub losses: u32,
    /// The grader failed in either order.
    pub not_graded: u32,
    /// No trial of both variants to compare (missing or infra).
    pub not_compared: u32,
}

impl PairSummary {
    /// Counts `pair`'s case outcomes.
    pub fn new(pair: &PairResult) -> Self {
        let mut summary = PairSummary {
            name: pair.name.clone(),
            a: pair.a.clone(),
            b: pair.b.clone(),
            ..PairSummary::default()
        };
        for case in &pair.cases {
            *match case.outcome {
                PairOutcome::AWins => &mut summary.wins,
                PairOutcome::Tie => &mut summary.ties,
                PairOutcome::BWins => &mut summary.losses,
                PairOutcome::NotGraded => &mut summary.not_graded,
                PairOutcome::NotCompared => &mut summary.not_compared,
            } += 1;
        }
        summary
    }
}

/// A case's tally for the figures: its verdict when decided, its graded trials and their mean
/// score.
fn case_tally(outcome: CaseOutcome, grades: &[Option<&TrialGrade>]) -> stats::CaseTally {
    let scored: smallvec::SmallVec<[(f64, bool); 4]> = grades
        .iter()
        .filter_map(|g| match g {
            Some(TrialGrade::Graded { score, pass, .. }) => Some((*score, *pass)),
            _ => None,
        })
        .collect();
    let trials = scored.len() as u32;
    stats::CaseTally {
        passed: outcome.verdict(),
        trials,
        trials_passed: scored.iter().filter(|(_, pass)| *pass).count() as u32,
        score: (trials > 0).then(|| scored.iter().map(|(s, _)| s).sum::<f64>() / f64::from(trials)),
    }
}

/// Each variant of `names` but the baseline (at `base`) against it, from `paired` (by variant).
fn comparisons(
    names: &[arcstr::ArcStr],
    paired: &[stats::PairedTally],
    base: usize,
) -> BTreeMap<String, stats::Comparison> {
    let Some(base_name) = names.get(base) else {
        return BTreeMap::new();
    };
    (names.iter().zip(paired).enumerate())
        .filter(|(i, _)| *i != base)
        .filter_map(|(_, (name, mine))| Some((name.to_string(), mine.comparison(base_name)?)))
        .collect()
}

impl Summary {
    /// Builds the summary from the planned trials and their grades (absent = missing), each
    /// case's verdict by its rule in `rules`.
    pub fn new(record: &RunRecord, grades: &Grades, rules: &crate::grade::CaseRules) -> Self {
        // A case's trials of a variant lie together in the plan: grades are looked up one
        // case at a time, as they may be read from a file, never all held at once.
        let plan = &record.trials;
        let names = plan.variants();
        let mut missing: Vec<TrialKey> = Vec::new();
        let mut counts = vec![VariantSummary::default(); names.len()];
        let mut outcomes: Vec<Vec<CaseOutcome>> = (names.iter())
            .map(|_| Vec::with_capacity(plan.cases().len()))
            .collect();
        // The figures are tallied a case at a time: the case's tally under each variant, then
        // each variant's against the baseline's once the case's last variant is in.
        let base = (record.baseline.as_deref())
            .and_then(|b| names.iter().position(|n| n.as_str() == b))
            .unwrap_or(0);
        let mut tallies = vec![stats::VariantTally::default(); names.len()];
        let mut paired = vec![stats::PairedTally::default(); names.len()];
        let mut this_case = vec![None; names.len()];
        let mut case_grades = Vec::new();
        for (group, (_, case, positions)) in plan.groups().enumerate() {
            // Each case's groups come a variant at a time, in the plan's order.
            let variant = group % names.len();
            case_grades.clear();
            for trial in plan.keys_in(positions) {
                let grade = grades.get(&trial);
                if grade.is_none() {
                    // In the plan's order, as the groups come; a case's keys share its id.
                    let trial = match missing.last() {
                        Some(last) if last.case == trial.case => TrialKey {
                            case: last.case.clone(),
                            ..trial
                        },
                        _ => trial,
                    };
                    missing.push(trial);
                }
                case_grades.push(grade);
            }
            let borrowed: smallvec::SmallVec<[Option<&TrialGrade>; 4]> =
                case_grades.iter().map(Option::as_deref).collect();
            let outcome = crate::grade::case_outcome(&borrowed, rules.of(case));
            let counts = &mut counts[variant];
            match outcome {
                CaseOutcome::Passed => counts.passed += 1,
                CaseOutcome::Failed => counts.failed += 1,
                CaseOutcome::Incomplete => counts.incomplete += 1,
                CaseOutcome::NotGraded => counts.not_graded += 1,
                CaseOutcome::Infra => counts.infra += 1,
            }
            outcomes[variant].push(outcome);
            let tally = case_tally(outcome, &borrowed);
            tallies[variant].add(&tally);
            this_case[variant] = Some(tally);
            if variant + 1 == names.len() {
                for (mine, paired) in this_case.iter().zip(&mut paired) {
                    if let (Some(mine), Some(baseline)) = (mine, &this_case[base]) {
                        paired.add(mine, baseline);
                    }
                }
            }
        }
        let mut variants = BTreeMap::new();
        let mut cases = BTreeMap::new();
        // A plan without cases counts nothing under any variant.
        if plan.cases().len() > 0 {
            for (((name, mut counts), outcomes), tallies) in
                names.iter().zip(counts).zip(outcomes).zip(&tallies)
            {
                let decided = counts.passed + counts.failed;
                counts.pass_rate =
                    (decided > 0).then(|| f64::from(counts.passed) / f64::from(decided));
                counts.figures = tallies.figures();
                variants.insert(name.to_string(), counts);
                let outcomes = CaseOutcomes::of_plan(plan.clone(), outcomes);
                cases.insert(name.to_string(), outcomes);
            }
        }
        let broken = broken_cases(&record.references, &cases);
        let comparisons = comparisons(names, &paired, base);
        Summary {
            run_id: record.run_id.clone(),
            eval: record.eval.clone(),
            collect: record.collect,
            grade: record.grade,
            baseline: record.baseline.clone(),
            variants,
            cases,
            case_pass: rules.clone(),
            missing,
            comparisons,
            pairs: Vec::new(),
            usage: usage::UsageSummary::default(),
            servers: BTreeMap::new(),
            unsandboxed: record.runner == "local"
                && record.runner_options.get("isolation").map(String::as_str) == Some("none"),
            workspaces: record.workspaces.clone(),
            broken,
        }
    }

    /// This summary with the pairwise judges' counts.
    pub fn with_pairs(mut self, pairs: &[PairResult]) -> Self {
        self.pairs = pairs.iter().map(PairSummary::new).collect();
        self
    }

    /// 0 all passed, 1 some case failed (or broke), 2 the run could not complete.
    pub fn exit_code(&self) -> u8 {
        if self.collect == Phase::Partial || self.grade == Phase::Partial {
            return 2;
        }
        let all_passed = self
            .variants
            .values()
            .all(|v| v.failed == 0 && v.infra == 0 && v.not_graded == 0 && v.incomplete == 0);
        if all_passed {
            0
        } else {
            1
        }
    }
}
