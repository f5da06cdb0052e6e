//! What changed between two runs of one eval, per variant and case: `mst runs diff` and the
//! report's baseline comparison both show a [`RunDiff`] (its JSON shape: `docs/results.md`).

use super::stored::StoredRun;
use crate::grade::{CaseOutcome, TrialGrade};
use anyhow::{bail, Result};
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

/// How a (variant, case) changed from run A (before) to run B (after).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Change {
    /// Passed before, not now.
    Broke,
    /// Not passing before, passed now.
    Fixed,
    /// The verdict kind held, but B's trials disagree (some passed, some did not).
    Flaky,
    /// Not passing in either run.
    StillFailing,
    /// Only in B.
    Added,
    /// Only in A.
    Removed,
    /// Passed in both, every trial of B passing.
    Unchanged,
}

impl Change {
    /// The groups in the order people read them: what needs attention first.
    pub const ORDER: [Change; 7] = [
        Change::Broke,
        Change::Fixed,
        Change::Flaky,
        Change::StillFailing,
        Change::Added,
        Change::Removed,
        Change::Unchanged,
    ];

    /// How the terminal names the group.
    pub fn label(self) -> &'static str {
        match self {
            Change::Broke => "broke",
            Change::Fixed => "fixed",
            Change::Flaky => "flaky",
            Change::StillFailing => "still failing",
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Unchanged => "unchanged passing",
        }
    }
}

/// One run's side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunSide {
    pub run_id: String,
    /// sha256 of the run's resolved cases (`run.json`'s `datasetHash`).
    pub dataset_hash: String,
}

/// One variant's pass rate in each run (absent where the variant did not run or decided no
/// case).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VariantDiff {
    pub variant: String,
    pub before: Option<f64>,
    pub after: Option<f64>,
    /// `after - before`, when both exist.
    pub delta: Option<f64>,
    /// Run B against run A over the cases both decided, paired by case: whether the change
    /// is beyond noise (McNemar's exact test; `baseline` is run A's id).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<super::stats::Comparison>,
}

/// A case's verdict in one run and how many of its trials passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseSide {
    pub outcome: CaseOutcome,
    pub passed_trials: u32,
    pub trials: u32,
}

impl std::fmt::Display for CaseSide {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let outcome = serde_json::to_value(self.outcome).expect("outcomes serialize");
        write!(
            f,
            "{} ({}/{} passed)",
            outcome.as_str().unwrap_or("?"),
            self.passed_trials,
            self.trials
        )
    }
}

/// One (variant, case) in either run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseDiff {
    pub variant: String,
    pub case: String,
    pub change: Change,
    /// Absent for an added case.
    pub before: Option<CaseSide>,
    /// Absent for a removed case.
    pub after: Option<CaseSide>,
}

/// Two runs of one eval compared: run A ([`RunDiff::before`]) and run B
/// ([`RunDiff::after`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunDiff {
    pub eval: String,
    pub before: RunSide,
    pub after: RunSide,
    /// The dataset hashes differ (the cases that came or went are `added`/`removed`).
    pub datasets_differ: bool,
    /// Every variant of either run, by name.
    pub variants: Vec<VariantDiff>,
    /// How many (variant, case) entries changed each way (every kind present, zeros too).
    pub counts: BTreeMap<Change, u32>,
    /// Every (variant, case) of either run, by variant then case.
    pub cases: Vec<CaseDiff>,
}

/// Lines listed per group in the terminal before "... and N more".
const GROUP_LINES: usize = 20;

impl RunDiff {
    /// Compares run `a` (before) with run `b` (after). Refuses runs of different evals, and
    /// runs whose datasets differ with no (variant, case) in common (nothing to compare).
    pub fn between(a: &StoredRun, b: &StoredRun) -> Result<RunDiff> {
        let (ra, rb) = (&a.record, &b.record);
        if ra.eval != rb.eval {
            bail!(
                "run `{}` is of eval `{}` and run `{}` of eval `{}`: only runs of one eval compare",
                ra.run_id,
                ra.eval,
                rb.run_id,
                rb.eval
            );
        }
        let datasets_differ = ra.dataset_hash != rb.dataset_hash;
        let keys: BTreeSet<(&str, &str)> = case_keys(a).chain(case_keys(b)).collect();
        let (sides_a, sides_b) = (Sides::of(a), Sides::of(b));
        let common = keys
            .iter()
            .any(|&(v, c)| sides_a.get(v, c).is_some() && sides_b.get(v, c).is_some());
        if datasets_differ && !common {
            bail!(
                "runs `{}` and `{}` of eval `{}` have no case in common (their datasets differ): \
                 compare a run with an earlier run of the same cases",
                ra.run_id,
                rb.run_id,
                ra.eval
            );
        }
        let cases: Vec<CaseDiff> = keys
            .iter()
            .map(|&(variant, case)| {
                let (before, after) = (sides_a.get(variant, case), sides_b.get(variant, case));
                CaseDiff {
                    variant: variant.to_string(),
                    case: case.to_string(),
                    change: change(before, after),
                    before,
                    after,
                }
            })
            .collect();
        let mut counts: BTreeMap<Change, u32> = Change::ORDER.iter().map(|c| (*c, 0)).collect();
        for case in &cases {
            *counts.entry(case.change).or_default() += 1;
        }
        let names: BTreeSet<&String> = a
            .summary
            .variants
            .keys()
            .chain(b.summary.variants.keys())
            .collect();
        let rate =
            |run: &StoredRun, name: &str| run.summary.variants.get(name).and_then(|v| v.pass_rate);
        let variants = names
            .into_iter()
            .map(|name| {
                let (before, after) = (rate(a, name), rate(b, name));
                VariantDiff {
                    variant: name.clone(),
                    before,
                    after,
                    delta: before.zip(after).map(|(x, y)| y - x),
                    comparison: paired(&cases, name, &ra.run_id),
                }
            })
            .collect();
        Ok(RunDiff {
            eval: ra.eval.clone(),
            before: RunSide {
                run_id: ra.run_id.clone(),
                dataset_hash: ra.dataset_hash.clone(),
            },
            after: RunSide {
                run_id: rb.run_id.clone(),
                dataset_hash: rb.dataset_hash.clone(),
            },
            datasets_differ,
            variants,
            counts,
            cases,
        })
    }

    /// Whether some case passed in A and not in B (`mst runs diff` then exits 1).
    pub fn broke(&self) -> bool {
        self.counts.get(&Change::Broke).is_some_and(|n| *n > 0)
    }

    /// The comparison for people: a header, each variant's rate change, the changed cases
    /// grouped (at most [`GROUP_LINES`] lines each), then the counts.
    pub fn text(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{}: {} -> {}",
            self.eval, self.before.run_id, self.after.run_id
        );
        if self.datasets_differ {
            let _ = writeln!(
                out,
                "the datasets differ: cases only in one run are listed as added or removed"
            );
        }
        let percent =
            |rate: Option<f64>| rate.map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0));
        for v in &self.variants {
            let delta = v
                .delta
                .map_or(String::new(), |d| format!(" ({:+.1} points)", d * 100.0));
            let noise = v.comparison.as_ref().map_or(String::new(), |c| {
                let verdict = if c.significant {
                    "beyond noise"
                } else {
                    "within noise"
                };
                format!(
                    "; over {} cases in both: {}: {verdict}",
                    c.cases,
                    c.figures()
                )
            });
            let _ = writeln!(
                out,
                "{}: {} -> {}{delta}{noise}",
                v.variant,
                percent(v.before),
                percent(v.after)
            );
        }
        let width = |f: fn(&CaseDiff) -> &str| {
            self.cases
                .iter()
                .filter(|c| c.change != Change::Unchanged)
                .map(|c| f(c).chars().count())
                .max()
                .unwrap_or(0)
        };
        let (vw, cw) = (width(|c| &c.variant), width(|c| &c.case));
        let side = |s: &Option<CaseSide>| s.map_or("-".to_string(), |s| s.to_string());
        for change in Change::ORDER {
            if change == Change::Unchanged {
                continue;
            }
            let group: Vec<&CaseDiff> = self.cases.iter().filter(|c| c.change == change).collect();
            if group.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{} ({}):", change.label(), group.len());
            for c in group.iter().take(GROUP_LINES) {
                let _ = writeln!(
                    out,
                    "  {:<vw$}  {:<cw$}  {} -> {}",
                    c.variant,
                    c.case,
                    side(&c.before),
                    side(&c.after)
                );
            }
            if group.len() > GROUP_LINES {
                let _ = writeln!(out, "  ... and {} more", group.len() - GROUP_LINES);
            }
        }
        let counts: Vec<String> = Change::ORDER
            .iter()
            .map(|c| format!("{} {}", self.counts.get(c).copied().unwrap_or(0), c.label()))
            .collect();
        let _ = writeln!(out, "\n{}", counts.join(", "));
        out
    }
}

/// Run B's verdicts on `variant`'s cases against run A's (`before`), over the cases both
/// decided.
fn paired(cases: &[CaseDiff], variant: &str, before: &str) -> Option<super::stats::Comparison> {
    let decided = |side: Option<CaseSide>| side?.outcome.verdict();
    let mut table = super::stats::Paired::default();
    for case in cases.iter().filter(|c| c.variant == variant) {
        if let (Some(was), Some(is)) = (decided(case.before), decided(case.after)) {
            table.add(is, was);
        }
    }
    super::stats::Comparison::of_table(table, &super::stats::Sample::default(), before)
}

/// The (variant, case) pairs `run` has a verdict for.
fn case_keys(run: &StoredRun) -> impl Iterator<Item = (&str, &str)> {
    run.summary
        .cases
        .iter()
        .flat_map(|(v, cases)| cases.iter().map(move |(c, _)| (v.as_str(), c)))
}

/// Each case of a run under each variant: its verdict and how many of its planned trials
/// passed, counted in one pass over the plan (a run of 10,000 trials compares at once).
struct Sides<'a> {
    run: &'a StoredRun,
    /// (variant, case) → (trials passed, trials planned).
    trials: BTreeMap<(&'a str, &'a str), (u32, u32)>,
}

impl<'a> Sides<'a> {
    fn of(run: &'a StoredRun) -> Self {
        let mut trials: BTreeMap<(&str, &str), (u32, u32)> = BTreeMap::new();
        let plan = &run.record.trials;
        for (variant, case, positions) in plan.groups() {
            let counts = trials.entry((variant, case)).or_default();
            for key in plan.keys_in(positions) {
                counts.1 += 1;
                if matches!(
                    run.grades.get(&key).as_deref(),
                    Some(TrialGrade::Graded { pass: true, .. })
                ) {
                    counts.0 += 1;
                }
            }
        }
        Sides { run, trials }
    }

    /// `case` under `variant`, if the run's summary has it.
    fn get(&self, variant: &str, case: &str) -> Option<CaseSide> {
        let outcome = self.run.summary.cases.get(variant)?.get(case)?;
        let (passed_trials, trials) = self
            .trials
            .get(&(variant, case))
            .copied()
            .unwrap_or_default();
        Some(CaseSide {
            outcome,
            passed_trials,
            trials,
        })
    }
}

fn change(before: Option<CaseSide>, after: Option<CaseSide>) -> Change {
    let (before, after) = match (before, after) {
        (None, _) => return Change::Added,
        (_, None) => return Change::Removed,
        (Some(b), Some(a)) => (b, a),
    };
    let passed = |s: CaseSide| s.outcome == CaseOutcome::Passed;
    // Trials that disagree, whatever the verdict: a flip that only a rerun would show.
    let flaky = after.passed_trials > 0 && after.passed_trials < after.trials;
    match (passed(before), passed(after)) {
        (true, false) => Change::Broke,
        (false, true) => Change::Fixed,
        _ if flaky => Change::Flaky,
        (true, true) => Change::Unchanged,
        (false, false) => Change::StillFailing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::TrialKey;
    use crate::grade::CaseRules;
    use crate::results::{Phase, RunRecord, Summary};

    /// A stored run of eval `eval` over `dataset`, each (variant, case, trial passes) graded:
    /// `Some(true)` passed, `Some(false)` failed, `None` infra.
    fn stored(
        id: &str,
        eval: &str,
        dataset: &str,
        trials: &[(&str, &str, &[Option<bool>])],
    ) -> StoredRun {
        let mut record = RunRecord {
            format: 1,
            run_id: id.into(),
            eval: eval.into(),
            mst: "0".into(),
            created_at: 0,
            config_path: "eval.json".into(),
            config_hash: "c".into(),
            git: None,
            dataset_hash: dataset.into(),
            runner: "local".into(),
            runner_options: BTreeMap::new(),
            shards: 1,
            machines: Vec::new(),
            plugins: Vec::new(),
            filters: Default::default(),
            trials: Default::default(),
            baseline: None,
            collect: Phase::Complete,
            grade: Phase::Complete,
            conversation: false,
            timings: None,
            grading: None,
            workspaces: Vec::new(),
            references: BTreeMap::new(),
            tool_lists: Default::default(),
        };
        let mut grades = BTreeMap::new();
        let mut planned = Vec::new();
        for (variant, case, passes) in trials {
            for (n, pass) in passes.iter().enumerate() {
                let key = TrialKey {
                    variant: (*variant).into(),
                    case: (*case).into(),
                    trial: n as u32,
                };
                let grade = match pass {
                    Some(pass) => TrialGrade::Graded {
                        score: f64::from(u8::from(*pass)),
                        pass: *pass,
                        judges: Default::default(),
                    },
                    None => TrialGrade::Infra {
                        reason: "gone".into(),
                    },
                };
                planned.push(key.clone());
                grades.insert(key, grade);
            }
        }
        record.trials = crate::eval::plan::Plan::from_keys(planned).unwrap();
        let grades: crate::grade::Grades = grades.into_iter().collect();
        let summary = Summary::new(&record, &grades, &CaseRules::default());
        StoredRun {
            record,
            summary,
            grades,
            pairs: Vec::new(),
            finished_at: 0,
        }
    }

    const Y: Option<bool> = Some(true);
    const N: Option<bool> = Some(false);
    const INFRA: Option<bool> = None;

    #[test]
    fn every_change_is_told_apart_with_both_outcomes_and_trial_counts() {
        let a = stored(
            "a",
            "e",
            "h1",
            &[
                ("v", "fixed", &[N, N, N]),
                ("v", "broke", &[Y, Y, Y]),
                ("v", "infra", &[Y, Y, Y]),
                ("v", "still", &[N, N, N]),
                ("v", "flaky", &[Y, Y, Y]),
                ("v", "same", &[Y, Y, Y]),
                ("v", "gone", &[Y, Y, Y]),
            ],
        );
        let b = stored(
            "b",
            "e",
            "h2",
            &[
                ("v", "fixed", &[Y, Y, Y]),
                ("v", "broke", &[N, N, N]),
                ("v", "infra", &[Y, INFRA, Y]),
                ("v", "still", &[N, N, N]),
                ("v", "flaky", &[Y, N, Y]),
                ("v", "same", &[Y, Y, Y]),
                ("v", "new", &[Y, Y, Y]),
            ],
        );
        let diff = RunDiff::between(&a, &b).unwrap();
        let of = |case: &str| diff.cases.iter().find(|c| c.case == case).unwrap();
        assert_eq!(of("fixed").change, Change::Fixed);
        assert_eq!(of("broke").change, Change::Broke);
        assert_eq!(of("infra").change, Change::Broke);
        assert_eq!(of("infra").after.unwrap().outcome, CaseOutcome::Infra);
        assert_eq!(of("infra").after.unwrap().passed_trials, 2);
        assert_eq!(of("still").change, Change::StillFailing);
        assert_eq!(of("flaky").change, Change::Flaky, "passed both times, 2/3");
        assert_eq!(of("same").change, Change::Unchanged);
        assert_eq!(of("new").change, Change::Added);
        assert!(of("new").before.is_none());
        assert_eq!(of("gone").change, Change::Removed);
        assert!(of("gone").after.is_none());
        assert!(diff.datasets_differ && diff.broke());
        assert_eq!(diff.counts[&Change::Broke], 2);
        assert_eq!(diff.counts[&Change::Unchanged], 1);
        // 5 of 7 passed before, 4 of 6 after (the infra case is left out of the rate).
        let v = &diff.variants[0];
        assert!((v.before.unwrap() - 5.0 / 7.0).abs() < 1e-9);
        assert!((v.after.unwrap() - 4.0 / 6.0).abs() < 1e-9);
        assert!((v.delta.unwrap() - (4.0 / 6.0 - 5.0 / 7.0)).abs() < 1e-9);
        let json = serde_json::to_value(&diff).unwrap();
        assert_eq!(json["after"]["runId"], "b");
        assert_eq!(json["datasetsDiffer"], true);
        assert_eq!(json["counts"]["still-failing"], 1);
        let infra = json["cases"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["case"] == "infra")
            .unwrap();
        assert_eq!(
            infra["after"],
            serde_json::json!({"outcome": "infra", "passedTrials": 2, "trials": 3})
        );
        let text = diff.text();
        assert!(
            text.contains("v  infra  passed (3/3 passed) -> infra (2/3 passed)"),
            "{text}"
        );
        let broke = text.find("broke (2):").unwrap();
        let fixed = text.find("fixed (1):").unwrap();
        assert!(broke < fixed, "{text}");
    }

    #[test]
    fn runs_of_other_evals_or_without_a_common_case_are_refused() {
        let a = stored("a", "e", "h1", &[("v", "x", &[Y])]);
        let other = stored("b", "f", "h1", &[("v", "x", &[Y])]);
        let error = RunDiff::between(&a, &other).unwrap_err().to_string();
        assert!(
            error.contains("`a` is of eval `e`") && error.contains("`b` of eval `f`"),
            "{error}"
        );
        let disjoint = stored("b", "e", "h2", &[("v", "y", &[Y])]);
        let error = RunDiff::between(&a, &disjoint).unwrap_err().to_string();
        assert!(error.contains("no case in common"), "{error}");
        // The same dataset run under other variants compares: everything added and removed.
        let same_data = stored("b", "e", "h1", &[("w", "x", &[Y])]);
        let diff = RunDiff::between(&a, &same_data).unwrap();
        assert_eq!(diff.counts[&Change::Added], 1);
        assert!(!diff.datasets_differ);
    }

    #[test]
    fn a_long_group_is_capped() {
        let passes: &[Option<bool>] = &[Y];
        let fails: &[Option<bool>] = &[N];
        let names: Vec<String> = (0..25).map(|i| format!("c{i:02}")).collect();
        let a: Vec<(&str, &str, &[Option<bool>])> =
            names.iter().map(|n| ("v", n.as_str(), passes)).collect();
        let b: Vec<(&str, &str, &[Option<bool>])> =
            names.iter().map(|n| ("v", n.as_str(), fails)).collect();
        let diff =
            RunDiff::between(&stored("a", "e", "h", &a), &stored("b", "e", "h", &b)).unwrap();
        let text = diff.text();
        assert!(text.contains("c19") && !text.contains("c20"), "{text}");
        assert!(text.contains("  ... and 5 more\n"), "{text}");
    }
}
