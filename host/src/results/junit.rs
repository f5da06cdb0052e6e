//! The run's summary as JUnit XML (`mst run --junit FILE`), for CI systems: one test suite per
//! variant, one test case per eval case.

use super::markup::escape;
use super::Summary;
use crate::grade::CaseOutcome;
use std::fmt::Write as _;

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
