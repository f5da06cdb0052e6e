//! Reports for people and CI systems: the summary table and JUnit XML.

use super::Summary;
use crate::grade::CaseOutcome;
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

fn escape(text: &str) -> String {
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
        let failures = cases
            .values()
            .filter(|o| **o == CaseOutcome::Failed)
            .count();
        let errors = cases
            .values()
            .filter(|o| matches!(o, CaseOutcome::NotGraded | CaseOutcome::Infra))
            .count();
        let skipped = cases
            .values()
            .filter(|o| **o == CaseOutcome::Incomplete)
            .count();
        let _ = writeln!(
            out,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" errors=\"{errors}\" skipped=\"{skipped}\">",
            escape(variant),
            cases.len()
        );
        for (case, outcome) in cases {
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
