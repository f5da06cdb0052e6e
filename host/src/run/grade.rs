//! Grading a run's collected traces: every trial's judges (chosen by [`JudgeSet`]) on worker
//! threads, one per core, so plugin graders run in parallel.

use crate::eval::trial::{CaseRecord, TrialKey};
use crate::grade::{JudgeSet, TrialGrade};
use crate::results::{Phase, RunDir};
use std::collections::BTreeMap;

/// Grades every collected trace of `trials` in `dir` (missing ones are left out), on one
/// worker thread per core. With `cases`, each trace is graded against the coordinator's own
/// case, whatever the stored trace holds.
pub fn grade_all(
    judges: &JudgeSet,
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&BTreeMap<&str, &CaseRecord>>,
) -> BTreeMap<TrialKey, TrialGrade> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16);
    on_threads(trials, threads, |key| {
        let mut trace = dir.read_trace(key)?;
        if let Some(case) = cases.and_then(|cases| cases.get(key.case.as_str())) {
            trace.case = (*case).clone();
        }
        Some(judges.grade(key, &trace))
    })
}

/// `grade` for every key, the keys split into `threads` chunks graded on threads of their own.
fn on_threads(
    trials: &[TrialKey],
    threads: usize,
    grade: impl Fn(&TrialKey) -> Option<TrialGrade> + Sync,
) -> BTreeMap<TrialKey, TrialGrade> {
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

/// Whether every graded trial got a grade from all its judges.
pub fn grade_phase(grades: &BTreeMap<TrialKey, TrialGrade>) -> Phase {
    match grades
        .values()
        .any(|g| matches!(g, TrialGrade::NotGraded { .. }))
    {
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
