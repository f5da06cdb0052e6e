//! Grading a run's collected traces: every trial's judges (chosen by [`JudgeSet`]) and every
//! pairwise judge's comparisons, on worker threads, one per core, so plugin graders run in
//! parallel. During a run, [`Grading`] grades each trace as it is stored, while collection
//! goes on; what it did not see is graded at the end ([`grade_rest`]).

use crate::eval::trial::{CaseRecord, TrialKey, TrialRecord};
use crate::grade::pairwise::{self, CaseComparison, PairJudge, PairOutcome, PairResult};
use crate::grade::{Grades, JudgeSet, TrialGrade};
use crate::model::UsageTotals;
use crate::results::stored::StoredRun;
use crate::results::usage::trace_usage;
use crate::results::{Phase, RunDir};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};

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
    if let Some(case) = cases.and_then(|cases| cases.get(&*key.case)) {
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
) -> Grades {
    grade_rest(judges, dir, trials, cases, Grades::default())
}

/// [`grade_all`] for the trials `graded` has no grade for (those [`Grading`] did not see:
/// collected by an earlier run of a resumed one); `graded` joins them.
pub fn grade_rest(
    judges: &JudgeSet,
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&Cases<'_>>,
    mut graded: Grades,
) -> Grades {
    let rest: Vec<TrialKey> = trials
        .iter()
        .filter(|key| !graded.contains_key(key))
        .cloned()
        .collect();
    graded.extend(on_threads(&rest, threads(), |key| {
        Some(judges.grade(key, &read_trace(dir, key, cases)?))
    }));
    graded
}

/// One stored trace to grade: its order of arrival, its key, the record as stored.
type Stored = (u64, TrialKey, TrialRecord);

/// What grading made of one stored trace: its key, the trace's order of arrival (a later
/// version of a trace replaces an earlier one's grade), its grade and the agent's model usage
/// in it.
struct Assessment {
    key: TrialKey,
    order: u64,
    grade: TrialGrade,
    usage: UsageTotals,
}

/// Grades traces as the shards store them, on one thread per core, while collection goes on,
/// so that grading overlaps collecting and the traces are not read back from disk (the agents'
/// usage is summed from them on the way). A trace stored twice (a shard's machine failed after
/// its trial was graded, and the trial was rewritten as infra) keeps its last version's grade.
/// The threads append each grade to one flat list, sorted once at the end: a run holds each
/// trial's grade once, densely, rather than in a map's half-full nodes.
pub struct Grading<'scope> {
    traces: mpsc::Sender<Stored>,
    next: AtomicU64,
    assessed: Arc<Mutex<Vec<Assessment>>>,
    threads: Vec<std::thread::ScopedJoinHandle<'scope, ()>>,
}

/// What [`Grading`] made of the traces it saw: one assessment per trial, sorted by key.
#[derive(Default)]
pub struct Graded(Vec<Assessment>);

impl Graded {
    /// Sorts `assessed` by trial and keeps each trial's last version.
    fn of(mut assessed: Vec<Assessment>) -> Self {
        // Sorting in place: the later version of a trial first, which `dedup` keeps.
        assessed.sort_unstable_by(|a, b| a.key.cmp(&b.key).then(b.order.cmp(&a.order)));
        assessed.dedup_by(|later, first| later.key == first.key);
        Graded(assessed)
    }

    /// How many traces were graded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The usage of `key`'s trace, if it was seen (none counted: zero).
    pub fn usage_of(&self, key: &TrialKey) -> Option<UsageTotals> {
        let at = self.0.binary_search_by(|a| a.key.cmp(key)).ok()?;
        Some(self.0[at].usage)
    }

    /// The grades, by trial.
    pub fn into_grades(self) -> Grades {
        // Made in place in the assessments' list (already sorted, each trial once), which
        // then gives back the room their order and usage took.
        let mut grades: Vec<_> = self.0.into_iter().map(|a| (a.key, a.grade)).collect();
        grades.shrink_to_fit();
        Grades::from_sorted(grades)
    }
}

impl<'scope> Grading<'scope> {
    /// Starts the grading threads in `scope`, grading with `judges` the traces of about
    /// `expected` trials.
    pub fn start<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        judges: &'env JudgeSet,
        expected: usize,
    ) -> Self {
        let (traces, queue) = mpsc::channel::<Stored>();
        let queue = Arc::new(Mutex::new(queue));
        // Room for each trial once, made up front: a list grown by doubling could hold up to
        // twice the room it needs at the end of a run, when memory peaks.
        let assessed = Arc::new(Mutex::new(Vec::with_capacity(expected)));
        let threads = (0..threads())
            .map(|_| {
                let queue = queue.clone();
                let assessed = assessed.clone();
                scope.spawn(move || loop {
                    let next = queue.lock().expect("grading queue").recv();
                    let Ok((order, key, record)) = next else {
                        return;
                    };
                    let grade = judges.grade(&key, &record);
                    let usage = trace_usage(&record.trace);
                    drop(record);
                    let assessment = Assessment {
                        key,
                        order,
                        grade,
                        usage,
                    };
                    assessed.lock().expect("grades").push(assessment);
                })
            })
            .collect();
        Grading {
            traces,
            next: AtomicU64::new(0),
            assessed,
            threads,
        }
    }

    /// Queues `record`, the trace of `key` as stored, for grading.
    pub fn stored(&self, key: &TrialKey, record: TrialRecord) {
        let order = self.next.fetch_add(1, Ordering::Relaxed);
        // The threads end only when this is dropped.
        let _ = self.traces.send((order, key.clone(), record));
    }

    /// Waits for every queued trace to be graded.
    pub fn finish(self) -> Graded {
        drop(self.traces);
        for thread in self.threads {
            thread.join().expect("grading threads do not panic");
        }
        let assessed = Arc::into_inner(self.assessed).expect("the grading threads ended");
        Graded::of(assessed.into_inner().expect("grades"))
    }
}

/// Runs every pairwise judge over every case either of its variants planned, on one worker
/// thread per core: one comparison (two calls, one per order) per case and pair.
pub fn pairwise_all(
    judges: &[PairJudge],
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&Cases<'_>>,
) -> Vec<PairResult> {
    // The planned trial indices of each (variant, case), looked up once per comparison.
    let mut planned: BTreeMap<(&str, &str), BTreeSet<u32>> = BTreeMap::new();
    for key in trials {
        planned
            .entry((&*key.variant, &*key.case))
            .or_default()
            .insert(key.trial);
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
pub fn grade_phase(grades: &Grades, pairs: &[PairResult]) -> Phase {
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
    fn a_trace_graded_twice_keeps_its_later_versions_grade_whichever_finished_first() {
        let key = |case: &str| TrialKey {
            variant: "v".into(),
            case: case.into(),
            trial: 0,
        };
        let assessment = |case: &str, order, reason: &str| Assessment {
            key: key(case),
            order,
            grade: TrialGrade::Infra {
                reason: reason.into(),
            },
            usage: UsageTotals {
                calls: order,
                ..UsageTotals::default()
            },
        };
        // c1's rewrite (stored third) finished grading before its first version did.
        let graded = Graded::of(vec![
            assessment("c2", 1, "only"),
            assessment("c1", 2, "rewritten"),
            assessment("c1", 0, "first"),
        ]);
        assert_eq!(graded.len(), 2);
        assert_eq!(graded.usage_of(&key("c1")).map(|u| u.calls), Some(2));
        assert_eq!(graded.usage_of(&key("c3")), None, "never seen");
        let grades = graded.into_grades();
        let reasons: Vec<String> = grades
            .values()
            .map(|g| match g {
                TrialGrade::Infra { reason } => reason.clone(),
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(reasons, ["rewritten", "only"]);
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
