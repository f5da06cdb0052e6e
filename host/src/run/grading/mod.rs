//! Grading a run's collected traces: every trial's judges (chosen by [`JudgeSet`]) and every
//! pairwise judge's comparisons, on worker threads, one per core, so plugin graders run in
//! parallel. During a run, [`Grading`] grades each trace as it is stored, while collection
//! goes on; what it did not see is graded at the end ([`grade_rest`]).

use crate::eval::plan::Plan;
use crate::eval::trial::{CaseIndex, TrialKey, TrialRecord};
use crate::grade::pairwise::{self, CaseComparison, PairJudge, PairOutcome, PairResult};
use crate::grade::{Grades, JudgeSet, TrialGrade};
use crate::results::stored::StoredRun;
use crate::results::usage::trace_usage;
use crate::results::{Phase, RunDir};
use anyhow::Context;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Mutex};

/// The coordinator's own cases by id: a trace is graded against them, whatever it holds.
pub type Cases<'a> = CaseIndex<'a>;

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
    match cases.map(|cases| cases.get(&key.case)) {
        Some(Ok(Some(case))) => trace.case = case.into_owned(),
        // Graded against the case the trace holds, as when no cases are given.
        Some(Err(e)) => tracing::warn!("{key}: {e:#}"),
        Some(Ok(None)) | None => {}
    }
    Some(trace)
}

/// Grades every collected trace of the trials of `plan` in `dir` (missing ones are left out),
/// on one worker thread per core, each grade spilled as it is made to a file in `dir` (or in
/// the temporary directory, when `dir` cannot take one). With `cases`, each trace is graded
/// against the coordinator's own case, whatever the stored trace holds.
pub fn grade_all(
    judges: &JudgeSet,
    dir: &RunDir,
    plan: &Plan,
    cases: Option<&Cases<'_>>,
) -> anyhow::Result<Grades> {
    let spill = (Spill::new(&dir.root, plan.len()))
        .or_else(|_| Spill::new(&std::env::temp_dir(), plan.len()))?;
    Ok(grade_into(spill, judges, dir, plan, cases)?
        .read(plan)?
        .grades)
}

/// Adds to `graded` (of trials of `plan`) the grades of the trials it lacks whose traces are
/// in `dir` (an earlier collection's, on a resume), on one worker thread per core, each
/// spilled into `graded`'s files as it is made: memory holds none of them. With `cases`, each
/// trace is graded against the coordinator's own case.
pub fn grade_rest(
    judges: &JudgeSet,
    dir: &RunDir,
    plan: &Plan,
    cases: Option<&Cases<'_>>,
    graded: Graded,
) -> anyhow::Result<Graded> {
    let spill = Spill::reopen(graded).context("cannot reopen the grading spill file")?;
    grade_into(spill, judges, dir, plan, cases)
}

/// Grades into `spill` the trials of `plan` it lacks whose traces are in `dir`, on one
/// worker thread per core.
fn grade_into(
    spill: Spill,
    judges: &JudgeSet,
    dir: &RunDir,
    plan: &Plan,
    cases: Option<&Cases<'_>>,
) -> anyhow::Result<Graded> {
    let rest: Vec<u32> = (0..plan.len() as u32)
        .filter(|&at| !spill.contains(at as usize))
        .collect();
    let spill = Mutex::new(spill);
    on_chunks(&rest, threads(), |positions| {
        let mut line = Vec::new();
        for &at in positions {
            let key = plan.key(at as usize);
            let Some(record) = read_trace(dir, &key, cases) else {
                continue;
            };
            let tallied = spilled_line(judges, &key, record, &mut line);
            // Each trial once: its order of arrival decides nothing here.
            (spill.lock().expect("grading spill")).push((at, 0), &line, tallied);
        }
    });
    spill.into_inner().expect("grading spill").finish()
}

/// Grades `record`, the trace of `key`, into `line` as the spill file holds it (its grade and
/// the agent's model usage); whether the agent made model calls.
fn spilled_line(
    judges: &JudgeSet,
    key: &TrialKey,
    record: TrialRecord,
    line: &mut Vec<u8>,
) -> bool {
    let grade = judges.grade(key, &record);
    let usage = trace_usage(&record.trace);
    let tools = crate::results::tool_health::trace_tools(&record.trace);
    drop(record);
    let tallied = !usage.is_empty() || !tools.is_empty();
    line.clear();
    let spilled = Spilled {
        grade,
        usage,
        tools,
    };
    serde_json::to_writer(&mut *line, &spilled).expect("a grade serialises");
    tallied
}

mod spill;

pub use spill::{Graded, ReadBack};
use spill::{Spill, Spilled};

/// One stored trace to grade: its order of arrival, its key, the record as stored.
type Stored = (u32, TrialKey, TrialRecord);

/// Grades traces as the shards store them, on one thread per core, while collection goes on,
/// so that grading overlaps collecting and the traces are not read back from disk (the agents'
/// usage is summed from them on the way). A trace stored twice (a shard's machine failed after
/// its trial was graded, and the trial was rewritten as infra) keeps its last version's grade.
///
/// Each grade goes to a spill file (an unnamed file in the run directory, gone when the run
/// ends, however it ends) as it is made, and where it is to a slot of the trial's in a second
/// one ([`spill`]): memory holds one bit a trial (100,000 grades in memory would be about 15
/// MB). They stay there: [`Graded::read`] hands them on as [`Grades`] kept in that file, each
/// read back when it is used.
pub struct Grading<'scope> {
    traces: mpsc::Sender<Stored>,
    next: AtomicU32,
    spill: Arc<Mutex<Spill>>,
    threads: Vec<std::thread::ScopedJoinHandle<'scope, ()>>,
}

impl<'scope> Grading<'scope> {
    /// Starts the grading threads in `scope`, grading with `judges` the traces of trials of
    /// `plan`, their grades spilled into files in `dir`.
    pub fn start<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        judges: &'env JudgeSet,
        plan: &'env Plan,
        dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        let spill = Arc::new(Mutex::new(Spill::new(dir, plan.len())?));
        let (traces, queue) = mpsc::channel::<Stored>();
        let queue = Arc::new(Mutex::new(queue));
        let threads = (0..threads())
            .map(|_| {
                let queue = queue.clone();
                let spill = spill.clone();
                scope.spawn(move || {
                    let mut line = Vec::new();
                    loop {
                        let next = queue.lock().expect("grading queue").recv();
                        let Ok((order, key, record)) = next else {
                            return;
                        };
                        let Some(trial) = plan.position(&key) else {
                            // The coordinator stores only the traces of planned trials.
                            tracing::warn!("trial {key} is not in the plan; it is not graded");
                            continue;
                        };
                        let tallied = spilled_line(judges, &key, record, &mut line);
                        spill.lock().expect("grading spill").push(
                            (trial as u32, order),
                            &line,
                            tallied,
                        );
                    }
                })
            })
            .collect();
        Ok(Grading {
            traces,
            next: AtomicU32::new(0),
            spill,
            threads,
        })
    }

    /// Queues `record`, the trace of `key` as stored, for grading.
    pub fn stored(&self, key: &TrialKey, record: TrialRecord) {
        let order = self.next.fetch_add(1, Ordering::Relaxed);
        // The threads end only when this is dropped.
        let _ = self.traces.send((order, key.clone(), record));
    }

    /// Waits for every queued trace to be graded.
    pub fn finish(self) -> anyhow::Result<Graded> {
        drop(self.traces);
        for thread in self.threads {
            thread.join().expect("grading threads do not panic");
        }
        let spill = Arc::into_inner(self.spill).expect("the grading threads ended");
        (spill.into_inner().expect("grading spill")).finish()
    }
}

/// Runs every pairwise judge over every case either of its variants planned, on one worker
/// thread per core: one comparison (two calls, one per order) per case and pair.
pub fn pairwise_all(
    judges: &[PairJudge],
    dir: &RunDir,
    plan: &Plan,
    cases: Option<&Cases<'_>>,
) -> Vec<PairResult> {
    // The planned trial indices of each (variant, case) the judges compare, looked up once
    // per comparison. Only theirs: an eval without pairwise judges builds nothing here (a map
    // of every trial was the largest thing a run of 100,000 trials held at its end).
    let compared = |variant: &str| judges.iter().any(|j| j.a == variant || j.b == variant);
    let mut planned: BTreeMap<(&str, &str), BTreeSet<u32>> = BTreeMap::new();
    for (variant, case, positions) in plan.groups().filter(|(v, _, _)| compared(v)) {
        planned
            .entry((variant, case))
            .or_default()
            .extend(0..positions.len() as u32);
    }
    let jobs: Vec<(usize, String)> = judges
        .iter()
        .enumerate()
        .flat_map(|(index, judge)| {
            let of_pair: BTreeSet<&str> = planned
                .keys()
                .filter(|(variant, _)| *variant == judge.a || *variant == judge.b)
                .map(|(_, case)| *case)
                .collect();
            of_pair
                .into_iter()
                .map(move |case| (index, case.to_string()))
        })
        .collect();
    let mut done = on_threads(&jobs, threads(), |(index, case)| {
        Some(compare_case(&judges[*index], dir, &planned, case, cases))
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

/// `judge`'s comparison of `case`: the lowest trial index both variants planned and collected
/// without an infrastructure failure, or why there is none.
fn compare_case(
    judge: &PairJudge,
    dir: &RunDir,
    planned: &BTreeMap<(&str, &str), BTreeSet<u32>>,
    case: &str,
    cases: Option<&Cases<'_>>,
) -> CaseComparison {
    let none = BTreeSet::new();
    let of_a = planned.get(&(judge.a.as_str(), case)).unwrap_or(&none);
    let of_b = planned.get(&(judge.b.as_str(), case)).unwrap_or(&none);
    let usable = |variant: &str, trial: u32| {
        let key = TrialKey {
            variant: variant.into(),
            case: case.into(),
            trial,
        };
        read_trace(dir, &key, cases).filter(pairwise::comparable)
    };
    if let Some((a, b)) = first_of_both(of_a, of_b, |trial| {
        Some((usable(&judge.a, trial)?, usable(&judge.b, trial)?))
    }) {
        return judge.compare(&a.case, &a, &b);
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

/// The first `both(trial)` that is some, over the trial indices in `of_a` and `of_b`, lowest
/// first.
fn first_of_both<T>(
    of_a: &BTreeSet<u32>,
    of_b: &BTreeSet<u32>,
    both: impl Fn(u32) -> Option<T>,
) -> Option<T> {
    of_a.intersection(of_b).find_map(|trial| both(*trial))
}

/// `grade` for every key, the keys split into `threads` chunks graded on threads of their own.
fn on_threads<K: Clone + Ord + Sync + Send, V: Send>(
    trials: &[K],
    threads: usize,
    grade: impl Fn(&K) -> Option<V> + Sync,
) -> BTreeMap<K, V> {
    let graded = on_chunks(trials, threads, |keys| {
        (keys.iter())
            .filter_map(|key| Some((key.clone(), grade(key)?)))
            .collect::<Vec<_>>()
    });
    graded.into_iter().flatten().collect()
}

/// Runs `work` over `items` split into at most `threads` even chunks of at least one item
/// each, each on a thread of its own; what each chunk gave, in order.
fn on_chunks<T: Sync, R: Send>(
    items: &[T],
    threads: usize,
    work: impl Fn(&[T]) -> R + Sync,
) -> Vec<R> {
    let chunk = items.len().div_ceil(threads.max(1)).max(1);
    let work = &work;
    std::thread::scope(|scope| {
        let handles: Vec<_> = (items.chunks(chunk))
            .map(|chunk| scope.spawn(move || work(chunk)))
            .collect();
        (handles.into_iter())
            .map(|handle| handle.join().expect("grading threads do not panic"))
            .collect()
    })
}

/// Whether every graded trial got a grade from all its judges, and every compared case a
/// verdict from its pairwise judge.
pub fn grade_phase(grades: &Grades, pairs: &[PairResult]) -> Phase {
    let trial_broke = grades
        .values()
        .any(|g| matches!(*g, TrialGrade::NotGraded { .. }));
    let pair_broke = pairs
        .iter()
        .flat_map(|p| &p.cases)
        .any(|c| c.outcome == PairOutcome::NotGraded);
    match trial_broke || pair_broke {
        true => Phase::Partial,
        false => Phase::Complete,
    }
}

/// Writes a graded run's result files from `run`, the run in memory: grades, scores and
/// summary, the pairwise verdicts, and the report (`report.html`) people open; hands `run`
/// back for the caller's summary.
pub(super) fn write_results(
    dir: &crate::results::RunDir,
    run: StoredRun,
) -> anyhow::Result<StoredRun> {
    dir.write_grades(&run.grades, &run.summary)?;
    dir.write_pairwise(&run.pairs)?;
    // The report is made from the run in memory, not read back. A run whose report cannot be
    // written still has all its results, so that is a warning, not a failed run, and the run
    // is read back from the files just written.
    match crate::view::html::write_run(run, dir, None, None) {
        Ok((_, run)) => Ok(run),
        Err(e) => {
            tracing::warn!(
                "the report of {} was not written: {e:#}",
                dir.root.display()
            );
            StoredRun::read(dir)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::sync::Mutex;

    #[test]
    fn a_pair_compares_the_lowest_trial_usable_under_both_variants() {
        let of_a = BTreeSet::from([0, 1, 2, 3]);
        let of_b = BTreeSet::from([1, 2, 3, 4]);
        // Trial 1 is unusable (say, b's is infra): 2 is compared, 3 never looked at.
        let asked = Mutex::new(Vec::new());
        let picked = first_of_both(&of_a, &of_b, |trial| {
            asked.lock().unwrap().push(trial);
            (trial != 1).then_some(trial)
        });
        assert_eq!(picked, Some(2));
        assert_eq!(
            asked.into_inner().unwrap(),
            [1, 2],
            "0 and 4 are not in both"
        );
        assert_eq!(first_of_both(&of_a, &BTreeSet::from([7]), Some), None);
    }

    #[test]
    fn trials_are_graded_on_worker_threads_and_none_is_lost() {
        let trials: Vec<TrialKey> = (0..10)
            .map(|i| TrialKey {
                variant: "v".into(),
                case: format!("c{i}").into(),
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
            (&*key.case != "c3").then(|| TrialGrade::Infra {
                reason: key.case.to_string(),
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
                    reason: key.case.to_string()
                }
            );
        }
    }
}
