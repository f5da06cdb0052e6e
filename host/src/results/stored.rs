//! A stored run read whole: its record, summary, grades and pairwise verdicts, the one reader
//! that exports, reports and comparisons share.

use super::{RunDir, RunRecord, Summary};
use crate::eval::trial::{TrialKey, TrialRecord};
use crate::grade::pairwise::PairResult;
use crate::grade::Grades;
use anyhow::{Context, Result};
use std::collections::BTreeMap;

/// Everything of a graded run but its traces (read those with [`StoredRun::read_traces`]).
pub struct StoredRun {
    pub record: RunRecord,
    pub summary: Summary,
    pub grades: Grades,
    pub pairs: Vec<PairResult>,
    /// When grading last wrote `summary.json` (seconds since the epoch).
    pub finished_at: u64,
}

impl StoredRun {
    /// A run just graded, as its files will hold it (finished now).
    pub fn graded(
        record: RunRecord,
        summary: Summary,
        grades: Grades,
        pairs: Vec<PairResult>,
    ) -> Self {
        StoredRun {
            record,
            summary,
            grades,
            pairs,
            finished_at: crate::clock::unix_secs(),
        }
    }

    /// Reads the run in `dir`; a run with no summary (never graded, or grading broke) is refused
    /// with the command that grades it.
    pub fn read(dir: &RunDir) -> Result<Self> {
        let record = dir.read_record()?;
        let summary_path = dir.root.join("summary.json");
        let summary: Summary = crate::files::read_json_file(&summary_path).with_context(|| {
            format!(
                "run `{}` has no readable summary; `mst grade {}` grades it again",
                record.run_id, record.run_id
            )
        })?;
        let grades_path = dir.root.join("grades.json");
        let grades: Grades = match grades_path.exists() {
            true => Grades::read_file(&grades_path, record.trials.clone())?,
            false => Grades::default(),
        };
        let pairwise_path = dir.root.join("pairwise.json");
        let pairs: Vec<PairResult> = match pairwise_path.exists() {
            true => crate::files::read_json_file(&pairwise_path)?,
            false => Vec::new(),
        };
        let finished_at = std::fs::metadata(&summary_path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(record.created_at, |d| d.as_secs());
        Ok(StoredRun {
            grades,
            record,
            summary,
            pairs,
            finished_at,
        })
    }

    /// The trace of planned trial `key`, when it came back (a regrade's comes from the graded
    /// run).
    pub fn read_trace(&self, dir: &RunDir, key: &TrialKey) -> Option<TrialRecord> {
        dir.traces_dir(&self.record.run_id).read_trace(key)
    }

    /// [`Self::read_trace`] with the trace's compact JSON ([`RunDir::read_trace_line`]).
    pub fn read_trace_line<T: super::trace_log::TraceLine>(
        &self,
        dir: &RunDir,
        key: &TrialKey,
    ) -> Option<(T, Vec<u8>)> {
        dir.traces_dir(&self.record.run_id).read_trace_line(key)
    }

    /// The traces of the planned trials that came back (a regrade's come from the graded run).
    pub fn read_traces(&self, dir: &RunDir) -> BTreeMap<TrialKey, TrialRecord> {
        let traces_dir = dir.traces_dir(&self.record.run_id);
        (self.record.trials.keys())
            .filter_map(|key| Some((key.clone(), traces_dir.read_trace(&key)?)))
            .collect()
    }

    /// The variants, the baseline first, then as the plan met them.
    pub fn variants(&self) -> Vec<&str> {
        let mut names: Vec<&str> = self.record.baseline.iter().map(String::as_str).collect();
        for variant in self.record.trials.variants() {
            if !names.contains(&variant.as_str()) {
                names.push(variant);
            }
        }
        names
    }

    /// The planned trials of `case` under `variant`.
    pub fn trials_of<'a>(
        &'a self,
        variant: &'a str,
        case: &'a str,
    ) -> impl Iterator<Item = TrialKey> + 'a {
        let plan = &self.record.trials;
        (plan.trials_of(variant, case).into_iter()).flat_map(|at| plan.keys_in(at))
    }
}
