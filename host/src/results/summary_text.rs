//! The run's summary as text for the terminal: the table of variants (and pairwise
//! comparisons), and the list of failed cases under it.

use super::Summary;
use crate::eval::trial::TrialKey;
use crate::grade::{CaseOutcome, Grades, TrialGrade};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The summary table printed at the end of a run.
pub fn table(summary: &Summary) -> String {
    let mut out = String::new();
    // The pass rate leaves out the cases that were not decided; "of planned" beside it
    // counts them all, so a run whose failures turned into infra cannot look better.
    let _ = writeln!(
        out,
        "{:<20} {:>9} {:>14} {:>10} {:>7} {:>7} {:>11} {:>11} {:>6}  {}",
        "VARIANT",
        "PASS RATE",
        "95% CI",
        "OF PLANNED",
        "PASSED",
        "FAILED",
        "INCOMPLETE",
        "NOT GRADED",
        "INFRA",
        compared_heading(summary)
    );
    for (name, v) in &summary.variants {
        let variant = match &summary.baseline {
            Some(baseline) if baseline == name => format!("{name} (baseline)"),
            _ => name.clone(),
        };
        let rate = v
            .pass_rate
            .map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0));
        let ci = (v.figures.pass_rate_ci).map_or("-".to_string(), |[lo, hi]| {
            format!("[{:.1}, {:.1}]", lo * 100.0, hi * 100.0)
        });
        let planned = v.passed + v.failed + v.incomplete + v.not_graded + v.infra;
        let of_planned = format!("{}/{planned}", v.passed);
        let compared = (summary.comparisons.get(name)).map_or(String::new(), |c| c.line());
        let _ = writeln!(
            out,
            "{variant:<20} {rate:>9} {ci:>14} {of_planned:>10} {:>7} {:>7} {:>11} {:>11} {:>6}  {compared}",
            v.passed, v.failed, v.incomplete, v.not_graded, v.infra
        );
    }
    for line in figure_lines(summary) {
        let _ = writeln!(out, "{line}");
    }
    if !summary.pairs.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<20} {:<12} {:<12} {:>5} {:>5} {:>6} {:>11} {:>13}",
            "PAIR", "A", "B", "WINS", "TIES", "LOSSES", "NOT GRADED", "NOT COMPARED"
        );
        for p in &summary.pairs {
            let _ = writeln!(
                out,
                "{:<20} {:<12} {:<12} {:>5} {:>5} {:>6} {:>11} {:>13}",
                p.name, p.a, p.b, p.wins, p.ties, p.losses, p.not_graded, p.not_compared
            );
        }
    }
    let collect = if summary.missing.is_empty() {
        "complete".to_string()
    } else {
        format!("partial ({} trials missing)", summary.missing.len())
    };
    let grade = match summary.grade {
        super::Phase::Complete => "complete",
        super::Phase::Partial => "partial (some trials or pairs not graded)",
    };
    let _ = writeln!(out, "collect: {collect}; grade: {grade}");
    if summary.unsandboxed {
        let _ = writeln!(
            out,
            "sandbox: none: the agents ran as you, able to read the cases' answers and your \
             files (--runner-option isolation=bwrap sandboxes them)"
        );
    }
    if !summary.broken.is_empty() {
        let _ = writeln!(out, "broken tasks ({}):", summary.broken.len());
        for broken in &summary.broken {
            let did = match broken.expected {
                crate::eval::config::Expected::Pass => "failed, and must pass",
                crate::eval::config::Expected::Fail => "passed, and must fail",
            };
            let _ = writeln!(out, "  {}: its `{}` {did}", broken.case, broken.variant);
        }
    }
    for workspace in &summary.workspaces {
        let packed = &workspace.packed;
        let commit = (packed.commit.as_deref()).map_or(String::new(), |c| format!(" at {c}"));
        let _ = writeln!(
            out,
            "workspace: {} from {}{commit} ({} files, {} bytes)",
            packed.digest, workspace.source, packed.files, packed.bytes
        );
    }
    for line in summary.usage.lines() {
        let _ = writeln!(out, "{line}");
    }
    for (server, health) in &summary.servers {
        let _ = writeln!(out, "{}", health.line(server));
    }
    out
}

/// The heading of the comparison column: `VS BASELINE-NAME`, or nothing with one variant.
fn compared_heading(summary: &Summary) -> String {
    (summary.comparisons.values().next()).map_or(String::new(), |c| {
        format!("VS {}", c.baseline.to_uppercase())
    })
}

/// Under the table: each variant's pass@k and flakiness (with several trials a case), and for
/// each comparison that is not significant, how many cases would tell.
fn figure_lines(summary: &Summary) -> Vec<String> {
    let mut lines = Vec::new();
    for (name, v) in &summary.variants {
        let f = &v.figures;
        if f.pass_at_k.is_empty() {
            continue;
        }
        let at_k: Vec<String> = (f.pass_at_k.iter())
            .map(|(k, rate)| format!("pass@{k} {:.1}%", rate * 100.0))
            .collect();
        let flaky = f.flaky.map_or(String::new(), |share| {
            format!(", flaky {:.1}% of cases", share * 100.0)
        });
        lines.push(format!("{name}: {}{flaky}", at_k.join(", ")));
    }
    for (name, c) in &summary.comparisons {
        if let Some(needed) = c.cases_needed {
            lines.push(format!(
                "{name} vs {}: not significant over {} cases; about {needed} paired cases would \
                 detect a difference of {:.1} pp with 80% power (`mst power` plans others)",
                c.baseline,
                c.cases,
                (c.delta * 100.0).abs()
            ));
        }
    }
    lines
}

/// Lines of the failure list shown before "... and N more" (about a screenful).
pub const FAILURE_LINES: usize = 20;

/// Characters of a judge's reason or an infra cause kept on its line.
const REASON_CHARS: usize = 160;

/// The case outcomes the failure list tells of case by case.
const TOLD: [CaseOutcome; 3] = [
    CaseOutcome::Failed,
    CaseOutcome::NotGraded,
    CaseOutcome::Incomplete,
];

/// The first line of `text`, cut to [`REASON_CHARS`].
fn one_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    match line.char_indices().nth(REASON_CHARS) {
        Some((at, _)) => format!("{}…", &line[..at]),
        None => line.to_string(),
    }
}

/// `n` and `one` made plural unless it is 1.
fn plural(n: usize, one: &str) -> String {
    match n {
        1 => format!("1 {one}"),
        n => format!("{n} {one}s"),
    }
}

/// What the failure list tells of one case that did not pass: its planned trials, how
/// many failed, were not graded or are missing, and the first failure's and break's reason.
#[derive(Default)]
struct CaseTally {
    trials: usize,
    failed: usize,
    first_failure: Option<String>,
    not_graded: usize,
    first_break: Option<String>,
    missing: usize,
}

impl CaseTally {
    /// Counts one trial's `grade`, keeping the first reason of each kind.
    fn count(&mut self, grade: &TrialGrade) {
        self.trials += 1;
        match grade {
            TrialGrade::Graded {
                pass: false,
                judges,
                ..
            } => {
                self.failed += 1;
                if self.first_failure.is_none() {
                    self.first_failure = judges
                        .iter()
                        .find(|j| !j.pass)
                        .map(|j| format!(": {}: {}", j.judge, one_line(&j.reason)));
                }
            }
            TrialGrade::NotGraded { judge, error } => {
                self.not_graded += 1;
                if self.first_break.is_none() {
                    self.first_break = Some(format!(": judge `{judge}`: {}", one_line(error)));
                }
            }
            _ => {}
        }
    }
}

/// One pass over a run's grades (which may be read from a file as they come): a tally for
/// each case that did not pass, and the infrastructure failures by cause.
struct Tallies<'s> {
    summary: &'s Summary,
    /// By variant and case, as the summary names them.
    cases: BTreeMap<(&'s str, &'s str), CaseTally>,
    /// The trials that broke, by the first line of their cause.
    causes: BTreeMap<String, Vec<TrialKey>>,
}

impl<'s> Tallies<'s> {
    /// The tallies of `summary`'s cases from `grades` and the summary's missing trials.
    fn read(summary: &'s Summary, grades: &Grades) -> Self {
        let mut tallies = Self {
            summary,
            cases: BTreeMap::new(),
            causes: BTreeMap::new(),
        };
        for (key, grade) in grades.iter() {
            if let TrialGrade::Infra { reason } = &*grade {
                tallies
                    .causes
                    .entry(one_line(reason))
                    .or_default()
                    .push(key.clone().into_owned());
            }
            if let Some(tally) = tallies.of(&key) {
                tally.count(&grade);
            }
        }
        for key in &summary.missing {
            if let Some(tally) = tallies.of(key) {
                tally.trials += 1;
                tally.missing += 1;
            }
        }
        tallies
    }

    /// The tally of `key`'s case, if its outcome is one the list tells of case by case.
    fn of(&mut self, key: &TrialKey) -> Option<&mut CaseTally> {
        let summary = self.summary;
        let (variant, cases) = summary.cases.get_key_value(&*key.variant)?;
        let (case, outcome) = cases.get_key_value(&key.case)?;
        TOLD.contains(&outcome)
            .then(|| self.cases.entry((variant.as_str(), case)).or_default())
    }

    /// One line per case whose outcome is `wanted`: its variant, its name and what
    /// `describe` says of its tally.
    fn lines(&self, wanted: CaseOutcome, describe: impl Fn(&CaseTally) -> String) -> Vec<String> {
        let none = CaseTally::default();
        let mut lines = Vec::new();
        for (variant, cases) in &self.summary.cases {
            for (case, _) in cases.iter().filter(|(_, outcome)| *outcome == wanted) {
                let tally = self.cases.get(&(variant.as_str(), case)).unwrap_or(&none);
                lines.push(format!("{variant}  {case}  {}", describe(tally)));
            }
        }
        lines
    }

    /// One line per infrastructure cause, the commonest first (a broken runner shows as
    /// one big line): its trials, the cause and the cases it hit.
    fn infra_lines(&self) -> Vec<String> {
        let mut causes: Vec<(&String, &Vec<TrialKey>)> = self.causes.iter().collect();
        causes.sort_by_key(|(_, keys)| std::cmp::Reverse(keys.len()));
        causes
            .into_iter()
            .map(|(reason, keys)| {
                let mut cases: Vec<(&str, &str)> =
                    keys.iter().map(|k| (&*k.variant, &*k.case)).collect();
                cases.dedup();
                let first = format!("{}/{}", cases[0].0, cases[0].1);
                let more = match cases.len() {
                    1 => String::new(),
                    n => format!(" and {}", plural(n - 1, "other case")),
                };
                format!("{}: {reason} ({first}{more})", plural(keys.len(), "trial"))
            })
            .collect()
    }
}

/// One group of the failure list: its header, naming what and how many, and its lines.
struct FailureGroup {
    header: String,
    lines: Vec<String>,
}

/// What did not pass, for the end of a run's output: the failed, not-graded, infra and
/// missing groups (each case with its variant, trial count and first reason; infra trials
/// grouped by identical cause).
pub struct FailureList {
    run_id: String,
    groups: [FailureGroup; 4],
}

impl FailureList {
    /// The failure list of `summary`'s run, reading `grades` once.
    pub fn collect(summary: &Summary, grades: &Grades) -> Self {
        let tallies = Tallies::read(summary, grades);
        let failed = tallies.lines(CaseOutcome::Failed, |t| {
            let reason = t.first_failure.as_deref().unwrap_or_default();
            format!("{}/{} trials failed{reason}", t.failed, t.trials)
        });
        let not_graded = tallies.lines(CaseOutcome::NotGraded, |t| {
            let reason = t.first_break.as_deref().unwrap_or_default();
            format!("{}/{} trials not graded{reason}", t.not_graded, t.trials)
        });
        let missing = tallies.lines(CaseOutcome::Incomplete, |t| {
            format!("{}/{} trials missing", t.missing, t.trials)
        });
        let infra_trials: usize = tallies.causes.values().map(Vec::len).sum();
        let group = |header: String, lines| FailureGroup { header, lines };
        let groups = [
            group(format!("failed ({})", plural(failed.len(), "case")), failed),
            group(
                format!("not graded ({})", plural(not_graded.len(), "case")),
                not_graded,
            ),
            group(
                format!("infra ({})", plural(infra_trials, "trial")),
                tallies.infra_lines(),
            ),
            group(
                format!("missing ({})", plural(summary.missing.len(), "trial")),
                missing,
            ),
        ];
        Self {
            run_id: summary.run_id.clone(),
            groups,
        }
    }

    /// The list as text: at most `limit` lines shared fairly between the groups, then how
    /// many more `mst report` shows. Empty when everything passed.
    pub fn render(&self, limit: usize) -> String {
        let mut out = String::new();
        let mut hidden = 0;
        for (group, share) in self.groups.iter().zip(self.shares(limit)) {
            if group.lines.is_empty() {
                continue;
            }
            let _ = writeln!(out, "\n{}:", group.header);
            for line in &group.lines[..share] {
                let _ = writeln!(out, "  {line}");
            }
            hidden += group.lines.len() - share;
        }
        if hidden > 0 {
            let _ = writeln!(
                out,
                "... and {hidden} more: `mst report {}` shows them all",
                self.run_id
            );
        }
        out
    }

    /// How many lines of each group `limit` leaves room for: shares dealt one line at a
    /// time, so a long group never hides the others.
    fn shares(&self, limit: usize) -> [usize; 4] {
        let mut shown = [0usize; 4];
        let mut budget = limit;
        while budget > 0 {
            let before = budget;
            for (share, group) in shown.iter_mut().zip(&self.groups) {
                if budget > 0 && *share < group.lines.len() {
                    *share += 1;
                    budget -= 1;
                }
            }
            if budget == before {
                break;
            }
        }
        shown
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grade::{CaseRules, JudgeScore};
    use crate::results::RunRecord;

    fn key(variant: &str, case: &str, trial: u32) -> TrialKey {
        TrialKey {
            variant: variant.into(),
            case: case.into(),
            trial,
        }
    }

    fn graded(pass: bool, reason: &str) -> TrialGrade {
        TrialGrade::Graded {
            score: 0.0,
            pass,
            judges: smallvec::smallvec![
                JudgeScore {
                    judge: "exit".into(),
                    value: 1.0,
                    pass: true,
                    reason: "exit code 0".into(),
                },
                JudgeScore {
                    judge: "mentions".into(),
                    value: 0.0,
                    pass,
                    reason: reason.into(),
                },
            ],
        }
    }

    /// The summary of `planned` trials, `grades` holding those that came back.
    fn summary(planned: &[TrialKey], grades: &Grades) -> Summary {
        let record: RunRecord = serde_json::from_value(serde_json::json!({
            "runId": "r1", "eval": "e", "mst": "0", "createdAt": 0, "configPath": "eval.json",
            "configHash": "c", "datasetHash": "d", "runner": "local",
            "runnerOptions": {"isolation": "none"}, "shards": 1, "machines": [], "plugins": [], "filters": {"variants": [], "cases": [],
            "trials": null}, "trials": planned, "collect": "partial", "grade": "complete"
        }))
        .unwrap();
        Summary::new(&record, grades, &CaseRules::default())
    }

    #[test]
    fn the_table_shows_passed_of_planned_beside_the_rate_and_says_when_unsandboxed() {
        let planned = [key("v", "ok", 0), key("v", "down", 0)];
        let reason = "the machine says so".to_string();
        let grades: Grades = [
            (planned[0].clone(), graded(true, "fine")),
            (planned[1].clone(), TrialGrade::Infra { reason }),
        ]
        .into_iter()
        .collect();
        let mut summary = summary(&planned, &grades);
        let text = table(&summary);
        let row = text.lines().find(|l| l.starts_with("v ")).unwrap();
        let cells: Vec<&str> = row.split_whitespace().collect();
        // Infra leaves the rate, not the count of planned cases; one case decided gives a
        // wide interval.
        assert_eq!(
            cells[..5],
            ["v", "100.0%", "[20.7,", "100.0]", "1/2"],
            "{text}"
        );
        assert!(text.contains("sandbox: none"), "{text}");
        summary.unsandboxed = false;
        assert!(!table(&summary).contains("sandbox"));
    }

    #[test]
    fn failures_are_grouped_with_their_first_reason_and_infra_causes_merged() {
        let mut grades = BTreeMap::new();
        let mut planned = Vec::new();
        let mut add = |k: TrialKey, g: Option<TrialGrade>| {
            planned.push(k.clone());
            if let Some(g) = g {
                grades.insert(k, g);
            }
        };
        add(key("v", "ok", 0), Some(graded(true, "fine")));
        add(
            key("v", "bad", 0),
            Some(graded(false, "no Tokyo\nsecond line")),
        );
        add(key("v", "bad", 1), Some(graded(true, "fine")));
        add(key("v", "bad", 2), Some(graded(false, "other")));
        let broken = TrialGrade::NotGraded {
            judge: "rubric".into(),
            error: "the model said 500".into(),
        };
        add(key("v", "judge", 0), Some(broken));
        for case in ["i1", "i2"] {
            for trial in 0..2 {
                let reason = "cannot start `/no/agent`: not found".to_string();
                add(key("v", case, trial), Some(TrialGrade::Infra { reason }));
            }
        }
        let other = TrialGrade::Infra {
            reason: "cancelled".into(),
        };
        add(key("v", "i3", 0), Some(other));
        add(key("v", "gone", 0), None);
        add(key("v", "gone", 1), Some(graded(true, "fine")));
        let grades: Grades = grades.into_iter().collect();
        let text = FailureList::collect(&summary(&planned, &grades), &grades).render(FAILURE_LINES);
        let expected = "
failed (1 case):
  v  bad  2/3 trials failed: mentions: no Tokyo

not graded (1 case):
  v  judge  1/1 trials not graded: judge `rubric`: the model said 500

infra (5 trials):
  4 trials: cannot start `/no/agent`: not found (v/i1 and 1 other case)
  1 trial: cancelled (v/i3)

missing (1 trial):
  v  gone  1/2 trials missing
";
        assert_eq!(text, expected);
    }

    #[test]
    fn a_long_list_is_capped_fairly_and_counts_the_rest() {
        let mut grades = BTreeMap::new();
        for i in 0..30 {
            grades.insert(key("v", &format!("c{i:02}"), 0), graded(false, "wrong"));
        }
        let infra = TrialGrade::Infra {
            reason: "docker: no such image".into(),
        };
        grades.insert(key("v", "c30", 0), infra);
        let planned: Vec<TrialKey> = grades.keys().cloned().collect();
        let grades: Grades = grades.into_iter().collect();
        let text = FailureList::collect(&summary(&planned, &grades), &grades).render(FAILURE_LINES);
        assert_eq!(text.matches("trials failed").count(), 19, "{text}");
        assert!(
            text.contains("1 trial: docker: no such image (v/c30)"),
            "{text}"
        );
        assert!(
            text.ends_with("... and 11 more: `mst report r1` shows them all\n"),
            "{text}"
        );
        assert_eq!(
            FailureList::collect(&summary(&[], &Grades::default()), &Grades::default())
                .render(FAILURE_LINES),
            ""
        );
    }
}
