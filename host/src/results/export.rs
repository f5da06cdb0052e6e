//! `mst runs export`: a stored run rewritten in another tool's run layout, so that tool's
//! reports and dashboards can read it. One format today: `mst.run/v1`, the run directory of MST
//! (gleanwork/mcp-server-tester). The field mapping, and what is approximated, is in
//! `docs/results.md` ("Exporting for MST tooling").
//!
//! ```text
//! <out>/latest.json                                   only for a complete run
//! <out>/runs/<id>/run.json
//!                 traces/<variant>/<case>/<trial>.json   one per trial that came back
//!                 scores/<judge>/<variant>/<case>/<trial>.json
//!                 scores/<pairwise judge>/<variant>/<case>.json
//!                 results.json, summary.json
//! ```

use super::stored::StoredRun;
use super::{CaseOutcomes, PairSummary, Phase, ResultsRoot, RunRecord};
use crate::eval::trial::{TrialKey, TrialRecord, TrialStatus};
use crate::grade::pairwise::{PairOutcome, PairResult};
use crate::grade::{CaseOutcome, TrialGrade};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use serde_json::{json, Map, Value};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The formats `--format` takes.
pub const FORMATS: &[&str] = &[MST_RUN_V1];

/// MST's run format: every record's `format`.
const MST_RUN_V1: &str = "mst.run/v1";

/// What an export wrote.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Exported {
    /// The format written (`mst.run/v1`).
    pub format: String,
    /// The mst run id.
    pub run_id: String,
    /// The id the exported records carry (MST's run id pattern).
    pub exported_run_id: String,
    /// The `--out` directory.
    pub out: PathBuf,
    /// Every file written, relative to `out`.
    pub files: Vec<String>,
}

/// Exports run `run_id` (found under `root`) in `format` into `out`, which must be missing or
/// empty. Everything is read and converted before the first file is written, so a damaged run
/// writes nothing.
pub fn export(root: &ResultsRoot, run_id: &str, format: &str, out: &Path) -> Result<Exported> {
    if !FORMATS.contains(&format) {
        bail!(
            "unknown export format `{format}`; `--format` takes {}",
            FORMATS.join(", ")
        );
    }
    refuse_non_empty(out)?;
    let dir = root.find(run_id)?;
    dir.read_record()?
        .refuse_conversation("exported as cases")?;
    let run = StoredRun::read(&dir)?;
    let stored = Stored {
        traces: run.read_traces(&dir),
        run,
    };
    let files = mst_run_v1(&stored);
    let redactor = crate::secrets::redactor();
    for (path, value) in &files {
        let bytes = serde_json::to_vec_pretty(value)?;
        crate::files::write_atomic(&out.join(path), &redactor.redact_json(&bytes))?;
    }
    Ok(Exported {
        format: format.to_string(),
        run_id: stored.record.run_id.clone(),
        exported_run_id: mst_run_id(&stored.record.run_id, stored.record.created_at),
        out: out.to_path_buf(),
        files: files.into_iter().map(|(path, _)| path).collect(),
    })
}

/// An export never mixes its files with others: `out` must be missing or an empty directory.
fn refuse_non_empty(out: &Path) -> Result<()> {
    match std::fs::read_dir(out) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                bail!(
                    "--out {} is not empty; export into a new or empty directory (an export \
                     never writes over or beside other files)",
                    out.display()
                );
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "--out {} cannot be read as a directory; name a new or empty directory",
                out.display()
            )
        }),
    }
}

/// A stored run with the traces an export reads.
struct Stored {
    run: StoredRun,
    traces: BTreeMap<TrialKey, TrialRecord>,
}

impl std::ops::Deref for Stored {
    type Target = StoredRun;
    fn deref(&self) -> &StoredRun {
        &self.run
    }
}

impl Stored {
    /// One trial's facts as both the trial record and the case result state them.
    fn trial_facts(&self, key: &TrialKey) -> Option<TrialFacts> {
        let trace = self.traces.get(key)?;
        let grade = self.grades.get(key);
        let grade = grade.as_deref();
        let infra = trace.trace.status == TrialStatus::Infra
            || matches!(grade, Some(TrialGrade::Infra { .. }));
        let error = match (grade, trace.trace.status) {
            (Some(TrialGrade::Infra { reason }), _) => Some(reason.clone()),
            (_, TrialStatus::TimedOut) => Some(
                (trace.trace.stopped.clone())
                    .unwrap_or_else(|| "the trial's deadline passed".to_string()),
            ),
            _ => None,
        };
        let grading_error = match grade {
            Some(TrialGrade::NotGraded { judge, error }) => Some(format!("{judge}: {error}")),
            _ => None,
        };
        Some(TrialFacts {
            pass: matches!(grade, Some(TrialGrade::Graded { pass: true, .. })),
            graded: matches!(grade, Some(TrialGrade::Graded { .. })),
            duration_ms: trace.trace.duration_ms,
            infrastructure_error: infra,
            error,
            grading_error,
        })
    }
}

/// A trial as MST states it.
struct TrialFacts {
    pass: bool,
    graded: bool,
    duration_ms: u64,
    infrastructure_error: bool,
    error: Option<String>,
    grading_error: Option<String>,
}

impl TrialFacts {
    /// The fields a trial record and a case's trial result share; `infra` names the
    /// infrastructure flag (`infrastructureError` in a trial record, `isInfrastructureError` in
    /// a case's `trialResults`, as MST names them).
    fn fields(&self, infra: &str) -> Map<String, Value> {
        let mut map = Map::new();
        map.insert("durationMs".into(), json!(self.duration_ms));
        map.insert(infra.into(), json!(self.infrastructure_error));
        if let Some(error) = &self.error {
            map.insert("error".into(), json!(error));
        }
        if let Some(error) = &self.grading_error {
            map.insert("gradingError".into(), json!(error));
        }
        map
    }
}

/// An mst run id in MST's pattern (`^\d{8}T\d{6}Z-[0-9a-f]{6}(\.g\d+)?$`). mst's ids have a
/// 4-hex suffix, so the suffix becomes the first 6 hex digits of the sha256 of the id (the same
/// run always gets the same id); the time stamp, and a regrade's `.gN`, stay.
pub fn mst_run_id(run_id: &str, created_at: u64) -> String {
    let pattern = regex::Regex::new(r"^\d{8}T\d{6}Z-[0-9a-f]{6}(\.g\d+)?$").expect("valid");
    if pattern.is_match(run_id) {
        return run_id.to_string();
    }
    let regrade = regex::Regex::new(r"\.g\d+$").expect("valid");
    let generation = regrade.find(run_id).map_or("", |m| m.as_str());
    let stamp = regex::Regex::new(r"^\d{8}T\d{6}Z").expect("valid");
    let stamp = stamp.find(run_id).map_or_else(
        || crate::clock::utc_compact(created_at),
        |m| m.as_str().to_string(),
    );
    let digest = hex::encode(Sha256::digest(run_id.as_bytes()));
    format!("{stamp}-{}{generation}", &digest[..6])
}

/// The longest path segment MST writes, in bytes.
const MAX_SEGMENT: usize = 200;

/// A variant, case or judge name as one path segment, as MST's layout names them:
/// URI-component encoding, with `*` and a leading or trailing `.` encoded too; a name longer than
/// [`MAX_SEGMENT`] bytes is cut and ends in `~` and 16 hex digits of its sha256.
fn segment(name: &str) -> String {
    let kept = |b: u8| b.is_ascii_alphanumeric() || b"-_.!~'()".contains(&b);
    let mut out = String::new();
    for (i, b) in name.bytes().enumerate() {
        let edge_dot = b == b'.' && (i == 0 || i + 1 == name.len());
        match kept(b) && !edge_dot {
            true => out.push(b as char),
            false => out.push_str(&format!("%{b:02X}")),
        }
    }
    if out.len() <= MAX_SEGMENT {
        return out;
    }
    let mut cut = MAX_SEGMENT - 17;
    // Never split an escape.
    while out[..cut].rfind('%').is_some_and(|p| p + 3 > cut) {
        cut -= 1;
    }
    let digest = hex::encode(Sha256::digest(name.as_bytes()));
    format!("{}~{}", &out[..cut], &digest[..16])
}

/// A record: `format`, `kind` and `runId` first, then `fields` (`null` members left out).
fn envelope(kind: &str, run_id: &str, fields: Value) -> Value {
    let mut map = Map::new();
    map.insert("format".into(), json!(MST_RUN_V1));
    map.insert("kind".into(), json!(kind));
    map.insert("runId".into(), json!(run_id));
    if let Value::Object(fields) = without_nulls(fields) {
        map.extend(fields);
    }
    Value::Object(map)
}

/// Drops `null` members, so an absent optional field is left out rather than written `null`.
fn without_nulls(mut value: Value) -> Value {
    if let Value::Object(map) = &mut value {
        map.retain(|_, v| !v.is_null());
    }
    value
}

/// What every file of one export shares.
struct Target<'a> {
    /// The exported run id.
    id: String,
    /// `runs/<id>`.
    base: String,
    /// MST's one dataset: mst resolves every dataset into one case list with one hash.
    dataset: &'a str,
    created_at: String,
    /// `--variant` or `--case` limited the run: MST's partial run (`--trials` changes how
    /// often, not what, so it only shows in `selection`).
    filtered: bool,
}

/// Every file of the `mst.run/v1` export, by path relative to `--out`.
fn mst_run_v1(run: &Stored) -> Vec<(String, Value)> {
    let record = &run.record;
    let id = mst_run_id(&record.run_id, record.created_at);
    let target = Target {
        base: format!("runs/{id}"),
        id,
        dataset: &record.eval,
        created_at: crate::clock::utc_rfc3339(record.created_at),
        filtered: !record.filters.variants.is_empty() || !record.filters.cases.is_empty(),
    };
    let mut files = vec![run_file(run, &target)];
    files.extend(trial_files(run, &target));
    files.extend(preference_files(run, &target));
    files.extend(results_and_summary(run, &target));
    // MST points `latest.json` only at a complete, full run.
    if record.collect == Phase::Complete && record.grade == Phase::Complete && !target.filtered {
        files.push((
            "latest.json".to_string(),
            envelope(
                "latest",
                &target.id,
                json!({"mstRunId": record.run_id, "createdAt": target.created_at, "path": target.base}),
            ),
        ));
    }
    files
}

/// The case ids planned, in plan order.
fn planned_cases(record: &RunRecord) -> Vec<&str> {
    record.trials.cases().collect()
}

/// `run.json`.
fn run_file(run: &Stored, target: &Target<'_>) -> (String, Value) {
    let record = &run.record;
    let variants: Vec<Value> = run
        .variants()
        .into_iter()
        .map(|name| {
            let collected = run.traces.iter().find_map(|(k, t)| {
                (&*k.variant == name)
                    .then_some(t.collected_by.as_ref())
                    .flatten()
            });
            without_nulls(json!({
                "name": name,
                "client": collected.map(|c| &c.client),
                "clientVersion": collected.map(|c| &c.client_version),
            }))
        })
        .collect();
    let filters = &record.filters;
    let selection = (target.filtered || filters.trials.is_some()).then(|| {
        without_nulls(json!({
            "variants": filters.variants, "cases": filters.cases, "trials": filters.trials,
        }))
    });
    let fields = json!({
        "mstRunId": record.run_id,
        "evalName": record.eval,
        "configId": record.eval,
        "contentHash": record.config_hash,
        "createdAt": target.created_at,
        "finishedAt": crate::clock::utc_rfc3339(run.finished_at),
        "mst": {"version": record.mst},
        "baseline": record.baseline,
        "variants": variants,
        "datasets": [{
            "name": target.dataset,
            "caseCount": planned_cases(record).len(),
            "contentHash": record.dataset_hash,
        }],
        "partial": target.filtered,
        "selection": selection,
        "redactStoredResponses": false,
        "environment": {
            "name": record.runner,
            "shards": record.shards.max(1),
            "options": record.runner_options,
        },
        "phases": {"collect": record.collect, "grade": record.grade},
        "configPath": record.config_path,
        "git": record.git,
    });
    (
        format!("{}/run.json", target.base),
        envelope("run", &target.id, fields),
    )
}

/// One trial record per trial that came back, and one score record per judge score.
fn trial_files(run: &Stored, target: &Target<'_>) -> Vec<(String, Value)> {
    let mut files = Vec::new();
    for key in run.record.trials.keys() {
        let (Some(facts), Some(trace)) = (run.trial_facts(&key), run.traces.get(&key)) else {
            continue;
        };
        let mut trace_value = serde_json::to_value(&trace.trace).unwrap_or_default();
        if let Value::Object(map) = &mut trace_value {
            // It is the record's `durationMs`.
            map.remove("durationMs");
        }
        let mut fields = facts.fields("infrastructureError");
        fields.extend(
            json!({
                "variant": key.variant, "caseId": key.case, "datasetName": target.dataset,
                "trial": key.trial, "input": trace.case.input, "trace": trace_value,
                "collectedBy": trace.collected_by,
            })
            .as_object()
            .cloned()
            .unwrap_or_default(),
        );
        let (variant, case) = (segment(&key.variant), segment(&key.case));
        files.push((
            format!("{}/traces/{variant}/{case}/{}.json", target.base, key.trial),
            envelope("trial", &target.id, Value::Object(fields)),
        ));
        let grade = run.grades.get(&key);
        let Some(TrialGrade::Graded { judges, .. }) = grade.as_deref() else {
            continue;
        };
        for score in judges {
            let fields = json!({
                "grader": score.judge, "variant": key.variant, "caseId": key.case,
                "trial": key.trial,
                "score": {"pass": score.pass, "score": score.value, "reason": score.reason},
            });
            files.push((
                format!(
                    "{}/scores/{}/{variant}/{case}/{}.json",
                    target.base,
                    segment(&score.judge),
                    key.trial
                ),
                envelope("score", &target.id, fields),
            ));
        }
    }
    files
}

/// One preference record per pairwise judge and case.
fn preference_files(run: &Stored, target: &Target<'_>) -> Vec<(String, Value)> {
    let mut files = Vec::new();
    for pair in &run.pairs {
        let (variant, baseline) = candidate_and_baseline(pair, run.record.baseline.as_deref());
        for case in &pair.cases {
            let winner = match case.outcome {
                PairOutcome::AWins => Some(pair.a.as_str()),
                PairOutcome::BWins => Some(pair.b.as_str()),
                PairOutcome::Tie => Some("tie"),
                PairOutcome::NotGraded | PairOutcome::NotCompared => None,
            };
            let fields = json!({
                "judge": pair.name, "variant": variant, "baseline": baseline,
                "caseId": case.case,
                "preference": without_nulls(json!({
                    "judge": pair.name, "plugin": pair.plugin, "winner": winner,
                    "outcome": case.outcome, "trial": case.trial,
                    "reason": case.reason, "orders": case.orders,
                })),
            });
            files.push((
                format!(
                    "{}/scores/{}/{}/{}.json",
                    target.base,
                    segment(&pair.name),
                    segment(variant),
                    segment(&case.case)
                ),
                envelope("preference", &target.id, fields),
            ));
        }
    }
    files
}

/// `results.json` (one result per variant and case) and `summary.json` (per variant).
fn results_and_summary(run: &Stored, target: &Target<'_>) -> Vec<(String, Value)> {
    let cases = planned_cases(&run.record);
    let mut case_results = Vec::new();
    let mut variant_summaries = Vec::new();
    for variant in run.variants() {
        let outcomes = run.summary.cases.get(variant);
        let mut case_rates = Vec::new();
        for &case in &cases {
            let Some(outcome) = outcomes.and_then(|o| o.get(case)) else {
                continue;
            };
            let (result, rate) = case_result(run, target, variant, case, outcome);
            case_rates.extend(rate);
            case_results.push(result);
        }
        variant_summaries.push(variant_summary(run, variant, &case_rates));
    }
    let summary = run_summary(run, target, variant_summaries);
    let results = json!({"mstRunId": run.record.run_id, "cases": case_results});
    vec![
        (
            format!("{}/results.json", target.base),
            envelope("results", &target.id, results),
        ),
        (
            format!("{}/summary.json", target.base),
            envelope("summary", &target.id, summary),
        ),
    ]
}

/// One case's result in `results.json`, and its pass rate over its graded trials (`None`
/// when none was graded), which the variant's `trial_pass_rate` averages.
fn case_result(
    run: &Stored,
    target: &Target<'_>,
    variant: &str,
    case: &str,
    outcome: CaseOutcome,
) -> (Value, Option<f64>) {
    let trials: Vec<(u32, TrialFacts)> = run
        .trials_of(variant, case)
        .filter_map(|k| run.trial_facts(&k).map(|f| (k.trial, f)))
        .collect();
    let graded = trials.iter().filter(|(_, f)| f.graded).count();
    let passed = trials.iter().filter(|(_, f)| f.pass).count();
    let rate = (graded > 0).then(|| passed as f64 / graded as f64);
    let trial_results: Vec<Value> = trials
        .iter()
        .map(|(n, f)| {
            let mut fields = f.fields("isInfrastructureError");
            fields.insert("trial".into(), json!(n));
            fields.insert("pass".into(), json!(f.pass));
            Value::Object(fields)
        })
        .collect();
    let result = without_nulls(json!({
        "id": case, "variant": variant, "datasetName": target.dataset,
        "pass": outcome == CaseOutcome::Passed,
        "outcome": outcome,
        "durationMs": trials.iter().map(|(_, f)| f.duration_ms).sum::<u64>(),
        "plannedTrials": run.trials_of(variant, case).count(),
        "passRate": rate,
        "infrastructureErrorCount":
            trials.iter().filter(|(_, f)| f.infrastructure_error).count(),
        "trialResults": trial_results,
    }));
    (result, rate)
}

/// `variant`'s entry in `summary.json`: its case counts, its metrics (`case_rates` are its
/// cases' pass rates) and its pairwise comparisons as the candidate.
fn variant_summary(run: &Stored, variant: &str, case_rates: &[f64]) -> Value {
    let counts = run
        .summary
        .variants
        .get(variant)
        .cloned()
        .unwrap_or_default();
    let trial_pass_rate =
        (!case_rates.is_empty()).then(|| case_rates.iter().sum::<f64>() / case_rates.len() as f64);
    let pairwise = candidate_pairs(run, variant);
    let total =
        counts.passed + counts.failed + counts.incomplete + counts.not_graded + counts.infra;
    without_nulls(json!({
        "name": variant,
        "total": total,
        "passed": counts.passed, "failed": counts.failed, "incomplete": counts.incomplete,
        "notGraded": counts.not_graded, "infra": counts.infra, "passRate": counts.pass_rate,
        "metrics": without_nulls(json!({
            "passed_rate": counts.pass_rate, "trial_pass_rate": trial_pass_rate,
        })),
        "pairwise": (!pairwise.is_empty()).then_some(pairwise),
        "usage": run.summary.usage.variants.get(variant),
    }))
}

/// The pairwise judges' counts for `variant` where it is the candidate, counted for it.
fn candidate_pairs(run: &Stored, variant: &str) -> Vec<Value> {
    run.pairs
        .iter()
        .filter_map(|p| {
            let (candidate, baseline) = candidate_and_baseline(p, run.record.baseline.as_deref());
            (candidate == variant).then(|| {
                // mst counts for `a`; MST for the candidate.
                let mut counts = PairSummary::new(p);
                if p.b == variant {
                    std::mem::swap(&mut counts.wins, &mut counts.losses);
                }
                json!({"judge": p.name, "baseline": baseline, "wins": counts.wins,
                       "losses": counts.losses, "ties": counts.ties,
                       "notGraded": counts.not_graded, "notCompared": counts.not_compared})
            })
        })
        .collect()
}

/// `summary.json`'s run-wide fields around `variant_summaries`.
fn run_summary(run: &Stored, target: &Target<'_>, variant_summaries: Vec<Value>) -> Value {
    let record = &run.record;
    let (passed, failed) = run
        .summary
        .variants
        .values()
        .fold((0, 0), |(p, f), v| (p + v.passed, f + v.failed));
    let total: usize = run.summary.cases.values().map(CaseOutcomes::len).sum();
    // As MST does: the run's metrics are its first variant's.
    let metrics = variant_summaries
        .first()
        .map_or_else(|| json!({}), |v| v["metrics"].clone());
    json!({
        "mstRunId": record.run_id,
        "configId": record.eval,
        "contentHash": record.config_hash,
        "timestamp": target.created_at,
        "configName": record.eval,
        "baseline": record.baseline,
        "total": total, "passed": passed, "failed": failed,
        "passRate": (passed + failed > 0).then(|| f64::from(passed) / f64::from(passed + failed)),
        "partial": target.filtered,
        "variants": variant_summaries,
        "metrics": metrics,
    })
}

/// The pair as MST states it: a candidate variant compared with a baseline. The run's baseline
/// when it is one of the two, else mst's `a`.
fn candidate_and_baseline<'a>(pair: &'a PairResult, baseline: Option<&str>) -> (&'a str, &'a str) {
    match baseline == Some(pair.b.as_str()) {
        true => (&pair.a, &pair.b),
        false => (&pair.b, &pair.a),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_get_mst_s_pattern_deterministically() {
        let id = mst_run_id("20261130T020303Z-7abf", 0);
        assert!(
            id.starts_with("20261130T020303Z-") && id.len() == 23,
            "{id}"
        );
        assert_eq!(id, mst_run_id("20261130T020303Z-7abf", 0));
        assert_ne!(id, mst_run_id("20261130T020303Z-7abe", 0));
        let regrade = mst_run_id("20261130T020303Z-7abf.g2", 0);
        assert!(regrade.ends_with(".g2"), "{regrade}");
        assert_eq!(
            mst_run_id("20261007T182504Z-7f3c2a", 0),
            "20261007T182504Z-7f3c2a"
        );
        assert!(mst_run_id("odd", 86_400).starts_with("19700102T000000Z-"));
    }

    #[test]
    fn segments_are_uri_components() {
        assert_eq!(segment("case 1/a*b"), "case%201%2Fa%2Ab");
        assert_eq!(segment(".x."), "%2Ex%2E");
        assert_eq!(segment(".."), "%2E%2E", "never a parent directory");
        assert_eq!(segment("é"), "%C3%A9");
        let long = segment(&"é".repeat(150));
        assert!(long.len() <= MAX_SEGMENT && long.contains('~'), "{long}");
    }
}
