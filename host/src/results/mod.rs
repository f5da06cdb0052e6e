//! Results: the run directory and everything in it (see `docs/results.md`).
//!
//! `.mst/results/<eval>/runs/<run-id>/` holds `run.json` (provenance and phases), one trace per
//! trial at `<variant>/<case>/<trial>.json`, `scores/<judge>.json`, `grades.json`,
//! `summary.json`, and `shards/<n>.worker.log`.

pub mod report;

use crate::grade::{CaseOutcome, TrialGrade};
use crate::shard::protocol::TrialKey;
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Whether a phase finished for every trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    Complete,
    Partial,
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
}

/// The git state of the config's repository.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GitState {
    pub commit: String,
    pub dirty: bool,
}

/// `run.json`: where and how a run ran.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRecord {
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
    pub trials: Vec<TrialKey>,
    pub collect: Phase,
    pub grade: Phase,
}

/// The filters a run was planned with.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Filters {
    pub variants: Vec<String>,
    pub cases: Vec<String>,
    pub trials: Option<u32>,
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
}

/// `summary.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Summary {
    pub run_id: String,
    pub eval: String,
    pub collect: Phase,
    pub grade: Phase,
    pub variants: BTreeMap<String, VariantSummary>,
    /// `cases[variant][case]`.
    pub cases: BTreeMap<String, BTreeMap<String, CaseOutcome>>,
    /// Trials whose trace never came back.
    pub missing: Vec<TrialKey>,
}

impl Summary {
    /// Builds the summary from the planned trials and their grades (absent = missing).
    pub fn new(record: &RunRecord, grades: &BTreeMap<TrialKey, TrialGrade>) -> Self {
        let mut per_case: BTreeMap<(String, String), Vec<Option<&TrialGrade>>> = BTreeMap::new();
        let mut missing = Vec::new();
        for key in &record.trials {
            let grade = grades.get(key);
            if grade.is_none() {
                missing.push(key.clone());
            }
            per_case
                .entry((key.variant.clone(), key.case.clone()))
                .or_default()
                .push(grade);
        }
        let mut variants: BTreeMap<String, VariantSummary> = BTreeMap::new();
        let mut cases: BTreeMap<String, BTreeMap<String, CaseOutcome>> = BTreeMap::new();
        for ((variant, case), trials) in per_case {
            let outcome = crate::grade::case_outcome(&trials);
            let counts = variants.entry(variant.clone()).or_default();
            match outcome {
                CaseOutcome::Passed => counts.passed += 1,
                CaseOutcome::Failed => counts.failed += 1,
                CaseOutcome::Incomplete => counts.incomplete += 1,
                CaseOutcome::NotGraded => counts.not_graded += 1,
                CaseOutcome::Infra => counts.infra += 1,
            }
            cases.entry(variant).or_default().insert(case, outcome);
        }
        for counts in variants.values_mut() {
            let decided = counts.passed + counts.failed;
            counts.pass_rate = (decided > 0).then(|| f64::from(counts.passed) / f64::from(decided));
        }
        Summary {
            run_id: record.run_id.clone(),
            eval: record.eval.clone(),
            collect: record.collect,
            grade: record.grade,
            variants,
            cases,
            missing,
        }
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

/// A run's directory.
#[derive(Debug, Clone)]
pub struct RunDir {
    pub root: PathBuf,
}

/// The results root for `eval` below `base` (usually `.mst/results`).
pub fn eval_runs_dir(base: &Path, eval: &str) -> PathBuf {
    base.join(crate::files::path_component(eval)).join("runs")
}

/// A new run id: UTC time plus a random suffix, sortable by time.
pub fn new_run_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let secs = now.as_secs();
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    let suffix =
        hex::encode(&<sha2::Sha256 as sha2::Digest>::digest(now.as_nanos().to_le_bytes())[..2]);
    format!(
        "{y:04}{m:02}{d:02}T{:02}{:02}{:02}Z-{suffix}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

impl RunDir {
    /// The directory of `run_id` under `runs_dir`.
    pub fn new(runs_dir: &Path, run_id: &str) -> Self {
        RunDir {
            root: runs_dir.join(crate::files::path_component(run_id)),
        }
    }

    fn write_json(&self, name: &str, value: &impl Serialize) -> Result<()> {
        crate::files::write_durable(&self.root.join(name), &serde_json::to_vec_pretty(value)?)
    }

    /// Writes `run.json`.
    pub fn write_record(&self, record: &RunRecord) -> Result<()> {
        self.write_json("run.json", record)
    }

    /// Reads `run.json`.
    pub fn read_record(&self) -> Result<RunRecord> {
        let path = self.root.join("run.json");
        let bytes = crate::files::read_input(&path)
            .with_context(|| format!("no run at {}", self.root.display()))?;
        serde_json::from_slice(&bytes).with_context(|| format!("{} is damaged", path.display()))
    }

    /// The trace of `key`, if it was collected.
    pub fn read_trace(&self, key: &TrialKey) -> Option<crate::eval::trial::TrialRecord> {
        let path = self.root.join(crate::shard::bundle::trace_path(key));
        let bytes = crate::files::read_regular(&path, 256 << 20, true).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Writes grades, per-judge scores and the summary. Entries borrow from `grades` rather
    /// than building JSON trees, so memory stays flat however many trials a run has.
    pub fn write_grades(
        &self,
        grades: &BTreeMap<TrialKey, TrialGrade>,
        summary: &Summary,
    ) -> Result<()> {
        #[derive(Serialize)]
        struct GradeEntry<'a> {
            key: &'a TrialKey,
            grade: &'a TrialGrade,
        }
        #[derive(Serialize)]
        struct ScoreEntry<'a> {
            key: &'a TrialKey,
            value: f64,
            pass: bool,
            reason: &'a str,
        }
        let listed: Vec<GradeEntry<'_>> = grades
            .iter()
            .map(|(key, grade)| GradeEntry { key, grade })
            .collect();
        self.write_json("grades.json", &listed)?;
        let mut per_judge: BTreeMap<&str, Vec<ScoreEntry<'_>>> = BTreeMap::new();
        for (key, grade) in grades {
            if let TrialGrade::Graded { judges, .. } = grade {
                for score in judges {
                    per_judge
                        .entry(score.judge.as_str())
                        .or_default()
                        .push(ScoreEntry {
                            key,
                            value: score.value,
                            pass: score.pass,
                            reason: &score.reason,
                        });
                }
            }
        }
        for (judge, scores) in per_judge {
            self.write_json(
                &format!("scores/{}.json", crate::files::path_component(judge)),
                &scores,
            )?;
        }
        self.write_json("summary.json", summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_utc_timestamps() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(20_787), (2026, 11, 30));
        let id = new_run_id();
        assert_eq!(id.len(), "20261130T015500Z-abcd".len(), "{id}");
    }
}
