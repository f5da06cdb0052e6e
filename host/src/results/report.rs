//! Reports for people and CI systems: the summary table and JUnit XML.

use super::Summary;
use crate::eval::trial::TrialKey;
use crate::grade::{CaseOutcome, Grades, TrialGrade};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// The summary table printed at the end of a run.
pub fn table(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<20} {:>9} {:>7} {:>7} {:>11} {:>11} {:>6}",
        "VARIANT", "PASS RATE", "PASSED", "FAILED", "INCOMPLETE", "NOT GRADED", "INFRA"
    );
    for (name, v) in &summary.variants {
        let variant = match &summary.baseline {
            Some(baseline) if baseline == name => format!("{name} (baseline)"),
            _ => name.clone(),
        };
        let rate = v
            .pass_rate
            .map_or("-".to_string(), |r| format!("{:.1}%", r * 100.0));
        let _ = writeln!(
            out,
            "{variant:<20} {rate:>9} {:>7} {:>7} {:>11} {:>11} {:>6}",
            v.passed, v.failed, v.incomplete, v.not_graded, v.infra
        );
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
    for line in summary.usage.lines() {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// Lines of the failure list shown before "... and N more" (about a screenful).
const FAILURE_LINES: usize = 20;

/// Characters of a judge's reason or an infra cause kept on its line.
const REASON_CHARS: usize = 160;

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

/// What [`failures`] tells of one case that did not pass: its planned trials, how many
/// failed, were not graded or are missing, and the first failure's and break's reason.
#[derive(Default)]
struct CaseTally {
    trials: usize,
    failed: usize,
    first_failure: Option<String>,
    not_graded: usize,
    first_break: Option<String>,
    missing: usize,
}

/// What did not pass, for the end of a run's output: the failed, not-graded, infra and
/// missing groups (each case with its variant, trial count and first reason; infra trials
/// grouped by identical cause), at most [`FAILURE_LINES`] lines shared fairly between the
/// groups, then how many more `mst report` shows. Empty when everything passed.
pub fn failures(summary: &Summary, grades: &Grades) -> String {
    // One pass over the grades (which may be read from a file as they come): a tally for
    // each case that did not pass, and the infrastructure failures by cause.
    // The outcome of `key`'s case, with its variant and case as the summary names them.
    let outcome_of = |key: &TrialKey| {
        let (variant, cases) = summary.cases.get_key_value(&*key.variant)?;
        let (case, outcome) = cases.get_key_value(&key.case)?;
        Some((variant.as_str(), case, outcome))
    };
    let told = [
        CaseOutcome::Failed,
        CaseOutcome::NotGraded,
        CaseOutcome::Incomplete,
    ];
    let mut tallies: BTreeMap<(&str, &str), CaseTally> = BTreeMap::new();
    // One line per cause, the commonest first: a broken runner shows as one big line.
    let mut causes: BTreeMap<String, Vec<TrialKey>> = BTreeMap::new();
    for (key, grade) in grades.iter() {
        if let TrialGrade::Infra { reason } = &*grade {
            causes
                .entry(one_line(reason))
                .or_default()
                .push(key.clone().into_owned());
        }
        let Some((variant, case, _)) = outcome_of(&key).filter(|(_, _, o)| told.contains(o)) else {
            continue;
        };
        let tally = tallies.entry((variant, case)).or_default();
        tally.trials += 1;
        match &*grade {
            TrialGrade::Graded {
                pass: false,
                judges,
                ..
            } => {
                tally.failed += 1;
                if tally.first_failure.is_none() {
                    tally.first_failure = judges
                        .iter()
                        .find(|j| !j.pass)
                        .map(|j| format!(": {}: {}", j.judge, one_line(&j.reason)));
                }
            }
            TrialGrade::NotGraded { judge, error } => {
                tally.not_graded += 1;
                if tally.first_break.is_none() {
                    tally.first_break = Some(format!(": judge `{judge}`: {}", one_line(error)));
                }
            }
            _ => {}
        }
    }
    for key in &summary.missing {
        if let Some((variant, case, _)) = outcome_of(key).filter(|(_, _, o)| told.contains(o)) {
            let tally = tallies.entry((variant, case)).or_default();
            tally.trials += 1;
            tally.missing += 1;
        }
    }
    let cases_with = |wanted: CaseOutcome| {
        summary.cases.iter().flat_map(move |(variant, cases)| {
            cases
                .iter()
                .filter(move |(_, outcome)| *outcome == wanted)
                .map(move |(case, _)| (variant.as_str(), case))
        })
    };
    let none = CaseTally::default();
    let of = |variant, case| tallies.get(&(variant, case)).unwrap_or(&none);
    let mut failed = Vec::new();
    for (variant, case) in cases_with(CaseOutcome::Failed) {
        let tally = of(variant, case);
        failed.push(format!(
            "{variant}  {case}  {}/{} trials failed{}",
            tally.failed,
            tally.trials,
            tally.first_failure.as_deref().unwrap_or_default()
        ));
    }
    let mut not_graded = Vec::new();
    for (variant, case) in cases_with(CaseOutcome::NotGraded) {
        let tally = of(variant, case);
        not_graded.push(format!(
            "{variant}  {case}  {}/{} trials not graded{}",
            tally.not_graded,
            tally.trials,
            tally.first_break.as_deref().unwrap_or_default()
        ));
    }
    let infra_trials: usize = causes.values().map(Vec::len).sum();
    let mut causes: Vec<(String, Vec<TrialKey>)> = causes.into_iter().collect();
    causes.sort_by_key(|(_, keys)| std::cmp::Reverse(keys.len()));
    let infra: Vec<String> = causes
        .iter()
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
        .collect();
    let mut missing = Vec::new();
    for (variant, case) in cases_with(CaseOutcome::Incomplete) {
        let tally = of(variant, case);
        missing.push(format!(
            "{variant}  {case}  {}/{} trials missing",
            tally.missing, tally.trials
        ));
    }
    let groups = [
        (format!("failed ({})", plural(failed.len(), "case")), failed),
        (
            format!("not graded ({})", plural(not_graded.len(), "case")),
            not_graded,
        ),
        (format!("infra ({})", plural(infra_trials, "trial")), infra),
        (
            format!("missing ({})", plural(summary.missing.len(), "trial")),
            missing,
        ),
    ];
    // Shares dealt one line at a time, so a long group never hides the others.
    let mut shown = [0usize; 4];
    let mut budget = FAILURE_LINES;
    while budget > 0 {
        let before = budget;
        for (share, (_, lines)) in shown.iter_mut().zip(&groups) {
            if budget > 0 && *share < lines.len() {
                *share += 1;
                budget -= 1;
            }
        }
        if budget == before {
            break;
        }
    }
    let mut out = String::new();
    let mut hidden = 0;
    for ((header, lines), share) in groups.iter().zip(shown) {
        if lines.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n{header}:");
        for line in &lines[..share] {
            let _ = writeln!(out, "  {line}");
        }
        hidden += lines.len() - share;
    }
    if hidden > 0 {
        let _ = writeln!(
            out,
            "... and {hidden} more: `mst report {}` shows them all",
            summary.run_id
        );
    }
    out
}

/// `text` made safe as XML or HTML text and attribute values: the five markup characters
/// escaped, and control characters (which XML 1.0 forbids) dropped but for newline and tab.
pub fn escape(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&apos;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

/// JUnit XML: one test suite per variant, one test case per eval case.
pub fn junit(summary: &Summary) -> String {
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(out, "<testsuites name=\"{}\">", escape(&summary.eval));
    for (variant, cases) in &summary.cases {
        let failures = cases.count(|o| o == CaseOutcome::Failed);
        let errors = cases.count(|o| matches!(o, CaseOutcome::NotGraded | CaseOutcome::Infra));
        let skipped = cases.count(|o| o == CaseOutcome::Incomplete);
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">",
            escape(variant),
            cases.len()
        );
        for (case, outcome) in cases.iter() {
            let _ = write!(
                out,
                "    <testcase classname=\"{}\" name=\"{}\"",
                escape(variant),
                escape(case)
            );
            match outcome {
                CaseOutcome::Passed => out.push_str("/>\n"),
                CaseOutcome::Failed => {
                    out.push_str("><failure message=\"failed its judges\"/></testcase>\n")
                }
                CaseOutcome::NotGraded => {
                    out.push_str("><error message=\"not graded: a judge failed\"/></testcase>\n")
                }
                CaseOutcome::Infra => {
                    out.push_str("><error message=\"infrastructure failure\"/></testcase>\n")
                }
                CaseOutcome::Incomplete => {
                    out.push_str("><skipped message=\"incomplete: trials missing\"/></testcase>\n")
                }
            }
        }
        out.push_str("  </testsuite>\n");
    }
    out.push_str("</testsuites>\n");
    out
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
            "configHash": "c", "datasetHash": "d", "runner": "local", "runnerOptions": {},
            "shards": 1, "machines": [], "plugins": [], "filters": {"variants": [], "cases": [],
            "trials": null}, "trials": planned, "collect": "partial", "grade": "complete"
        }))
        .unwrap();
        Summary::new(&record, grades, &CaseRules::default())
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
        let text = failures(&summary(&planned, &grades), &grades);
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
        let text = failures(&summary(&planned, &grades), &grades);
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
            failures(&summary(&[], &Grades::default()), &Grades::default()),
            ""
        );
    }
}
