//! Grading a run's collected traces: every trial's judges (chosen by [`JudgeSet`]) and every
//! pairwise judge's comparisons, on worker threads, one per core, so plugin graders run in
//! parallel.

use crate::eval::trial::{CaseRecord, TrialKey, TrialRecord};
use crate::grade::pairwise::{self, CaseComparison, PairJudge, PairOutcome, PairResult};
use crate::grade::{JudgeSet, TrialGrade};
use crate::results::{Phase, RunDir};
use std::collections::{BTreeMap, BTreeSet};

/// The coordinator's own cases by id: a trace is graded against them, whatever it holds.
pub type Cases<'a> = BTreeMap<&'a str, &'a CaseRecord>;

/// One grading thread per core, at most 16.
fn threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16)
}

/// The stored trace of `key`, its case replaced by the coordinator's when `cases` has it.
fn read_trace(dir: &RunDir, key: &TrialKey, cases: Option<&Cases<'_>>) -> Option<TrialRecord> {
    let mut trace = dir.read_trace(key)?;
    if let Some(case) = cases.and_then(|cases| cases.get(key.case.as_str())) {
        trace.case = (*case).clone();
    }
    Some(trace)
}

/// Grades every collected trace of `trials` in `dir` (missing ones are left out), on one
/// worker thread per core. With `cases`, each trace is graded against the coordinator's own
/// case, whatever the stored trace holds.
pub fn grade_all(
    judges: &JudgeSet,
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&Cases<'_>>,
) -> BTreeMap<TrialKey, TrialGrade> {
    on_threads(trials, threads(), |key| {
        Some(judges.grade(key, &read_trace(dir, key, cases)?))
    })
}

/// Runs every pairwise judge over every case either of its variants planned, on one worker
/// thread per core: one comparison (two calls, one per order) per case and pair.
pub fn pairwise_all(
    judges: &[PairJudge],
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&Cases<'_>>,
) -> Vec<PairResult> {
    let jobs: Vec<(usize, String)> = judges
        .iter()
        .enumerate()
        .flat_map(|(index, judge)| {
            let planned: BTreeSet<&str> = trials
                .iter()
                .filter(|k| k.variant == judge.a || k.variant == judge.b)
                .map(|k| k.case.as_str())
                .collect();
            planned
                .into_iter()
                .map(move |case| (index, case.to_string()))
        })
        .collect();
    let mut done = on_threads(&jobs, threads(), |(index, case)| {
        Some(compare_case(&judges[*index], dir, trials, case, cases))
    });
    judges
        .iter()
        .enumerate()
        .map(|(index, judge)| PairResult {
            name: judge.name.clone(),
            plugin: judge.plugin_name.clone(),
            a: judge.a.clone(),
            b: judge.b.clone(),
            cases: jobs
                .iter()
                .filter(|(i, _)| *i == index)
                .filter_map(|job| done.remove(job))
                .collect(),
        })
        .collect()
}

/// `judge`'s comparison of `case`: the lowest trial index both variants collected without an
/// infrastructure failure, or why there is none.
fn compare_case(
    judge: &PairJudge,
    dir: &RunDir,
    trials: &[TrialKey],
    case: &str,
    cases: Option<&Cases<'_>>,
) -> CaseComparison {
    let indices = |variant: &str| -> BTreeSet<u32> {
        trials
            .iter()
            .filter(|k| k.variant == variant && k.case == case)
            .map(|k| k.trial)
            .collect()
    };
    let (of_a, of_b) = (indices(&judge.a), indices(&judge.b));
    let usable = |variant: &str, trial: u32| {
        let key = TrialKey {
            variant: variant.to_string(),
            case: case.to_string(),
            trial,
        };
        read_trace(dir, &key, cases).filter(pairwise::comparable)
    };
    for trial in of_a.intersection(&of_b) {
        if let (Some(a), Some(b)) = (usable(&judge.a, *trial), usable(&judge.b, *trial)) {
            return judge.compare(&a.case, &a, &b);
        }
    }
    CaseComparison::not_compared(
        case,
        format!(
            "no trial index of case `{case}` was collected under both `{}` and `{}` without an \
             infrastructure failure",
            judge.a, judge.b
        ),
    )
}

/// `grade` for every key, the keys split into `threads` chunks graded on threads of their own.
fn on_threads<K: Clone + Ord + Sync + Send, V: Send>(
    trials: &[K],
    threads: usize,
    grade: impl Fn(&K) -> Option<V> + Sync,
) -> BTreeMap<K, V> {
    let chunk = trials.len().div_ceil(threads.max(1)).max(1);
    let grade = &grade;
    std::thread::scope(|scope| {
        let handles: Vec<_> = trials
            .chunks(chunk)
            .map(|keys| {
                scope.spawn(move || {
                    keys.iter()
                        .filter_map(|key| Some((key.clone(), grade(key)?)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("grading threads do not panic"))
            .collect()
    })
}

/// Whether every graded trial got a grade from all its judges, and every compared case a
/// verdict from its pairwise judge.
pub fn grade_phase(grades: &BTreeMap<TrialKey, TrialGrade>, pairs: &[PairResult]) -> Phase {
    let trial_broke = grades
        .values()
        .any(|g| matches!(g, TrialGrade::NotGraded { .. }));
    let pair_broke = pairs
        .iter()
        .flat_map(|p| &p.cases)
        .any(|c| c.outcome == PairOutcome::NotGraded);
    match trial_broke || pair_broke {
        true => Phase::Partial,
        false => Phase::Complete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    #[test]
    fn trials_are_graded_on_worker_threads_and_none_is_lost() {
        let trials: Vec<TrialKey> = (0..10)
            .map(|i| TrialKey {
                variant: "v".into(),
                case: format!("c{i}"),
                trial: 0,
            })
            .collect();
        let threads = Mutex::new(BTreeSet::new());
        let grades = on_threads(&trials, 4, |key| {
            threads
                .lock()
                .unwrap()
                .insert(format!("{:?}", std::thread::current().id()));
            // Trial c3 was never collected.
            (key.case != "c3").then(|| TrialGrade::Infra {
                reason: key.case.clone(),
            })
        });
        assert_eq!(
            threads.into_inner().unwrap().len(),
            4,
            "one thread per chunk"
        );
        assert_eq!(grades.len(), 9);
        for (key, grade) in &grades {
            assert_eq!(
                grade,
                &TrialGrade::Infra {
                    reason: key.case.clone()
                }
            );
        }
    }
}
