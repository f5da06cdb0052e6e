//! Grading a run's collected traces: every trial's judges (chosen by [`JudgeSet`]) on worker
//! threads, one per core, so plugin graders run in parallel.

use crate::eval::trial::TrialKey;
use crate::grade::{JudgeSet, TrialGrade};
use crate::results::{Phase, RunDir};
use std::collections::BTreeMap;

/// Grades every collected trace of `trials` in `dir` (missing ones are left out).
pub fn grade_all(
    judges: &JudgeSet,
    dir: &RunDir,
    trials: &[TrialKey],
) -> BTreeMap<TrialKey, TrialGrade> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16);
    let chunk = trials.len().div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = trials
            .chunks(chunk)
            .map(|keys| {
                scope.spawn(move || {
                    keys.iter()
                        .filter_map(|key| {
                            let trace = dir.read_trace(key)?;
                            Some((key.clone(), judges.grade(key, &trace)))
                        })
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
