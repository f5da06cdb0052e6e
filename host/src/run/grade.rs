//! Grading a run's collected traces: every trial's judges (chosen by [`JudgeSet`]) and every
//! pairwise judge's comparisons, on worker threads, one per core, so plugin graders run in
//! parallel. During a run, [`Grading`] grades each trace as it is stored, while collection
//! goes on; what it did not see is graded at the end ([`grade_rest`]).

use crate::eval::trial::{find_position, sorted_positions, CaseIndex, TrialKey, TrialRecord};
use crate::grade::pairwise::{self, CaseComparison, PairJudge, PairOutcome, PairResult};
use crate::grade::{GradeSpot, Grades, JudgeSet, TrialGrade};
use crate::model::UsageTotals;
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

/// Grades every collected trace of `trials` in `dir` (missing ones are left out), on one
/// worker thread per core. With `cases`, each trace is graded against the coordinator's own
/// case, whatever the stored trace holds.
pub fn grade_all(
    judges: &JudgeSet,
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&Cases<'_>>,
) -> Grades {
    grade_rest(judges, dir, trials, cases, |_| false)
}

/// [`grade_all`] for the trials that are not `graded` already (by [`Grading`], which did not
/// see those an earlier run of a resumed one collected).
pub fn grade_rest(
    judges: &JudgeSet,
    dir: &RunDir,
    trials: &[TrialKey],
    cases: Option<&Cases<'_>>,
    graded: impl Fn(&TrialKey) -> bool,
) -> Grades {
    let rest: Vec<TrialKey> = trials.iter().filter(|key| !graded(key)).cloned().collect();
    on_threads(&rest, threads(), |key| {
        Some(judges.grade(key, &read_trace(dir, key, cases)?))
    })
    .into_iter()
    .collect()
}

/// One stored trace to grade: its order of arrival, its key, the record as stored.
type Stored = (u32, TrialKey, TrialRecord);

/// Where grading left one stored trace's grade: the trial's position in the plan, the
/// trace's order of arrival (a later version of a trace replaces an earlier one's grade), and
/// the line in the spill file that holds its grade and the agent's model usage in it. 24
/// bytes: a run of 100,000 trials holds one for each.
struct Assessment {
    at: u64,
    trial: u32,
    order: u32,
    len: u32,
    used_models: bool,
}

/// A line of the spill file.
#[derive(serde::Serialize, serde::Deserialize)]
struct Spilled<G> {
    grade: G,
    #[serde(default, skip_serializing_if = "UsageTotals::is_empty")]
    usage: UsageTotals,
}

/// The grading threads' shared end: the spill file, and where each grade is in it.
struct Spill {
    file: std::io::BufWriter<std::fs::File>,
    written: u64,
    assessed: Vec<Assessment>,
    /// The first write that failed; grading goes on, and [`Grading::finish`] reports it.
    broken: Option<std::io::Error>,
}

/// Grades traces as the shards store them, on one thread per core, while collection goes on,
/// so that grading overlaps collecting and the traces are not read back from disk (the agents'
/// usage is summed from them on the way). A trace stored twice (a shard's machine failed after
/// its trial was graded, and the trial was rewritten as infra) keeps its last version's grade.
///
/// Each grade goes to a spill file (an unnamed file in the run directory, gone when the run
/// ends, however it ends) as it is made; memory holds only where it is, 24 bytes a trial
/// (100,000 grades in memory would be about 15 MB). They stay there: [`Graded::read`] hands
/// them on as [`Grades`] kept in that file, each read back when it is used.
pub struct Grading<'scope> {
    plan: &'scope [TrialKey],
    traces: mpsc::Sender<Stored>,
    next: AtomicU32,
    spill: Arc<Mutex<Spill>>,
    threads: Vec<std::thread::ScopedJoinHandle<'scope, ()>>,
}

/// What [`Grading`] made of the traces it saw: one assessment per trial, sorted by key, each
/// grade in the spill file.
/// Its trials are positions in the plan, which its methods are given.
pub struct Graded {
    spill: std::fs::File,
    assessed: Vec<Assessment>,
}

/// The grades [`Graded::read`] hands on, and the agents' model usage in their traces.
pub struct ReadBack {
    pub grades: Grades,
    /// The agents' usage in the graded traces, by variant.
    pub usage: BTreeMap<String, UsageTotals>,
}

impl Graded {
    /// Sorts `assessed` (of trials of `plan`) by trial and keeps each trial's last version.
    fn of(plan: &[TrialKey], spill: std::fs::File, mut assessed: Vec<Assessment>) -> Self {
        let key = |a: &Assessment| &plan[a.trial as usize];
        // Sorting in place: the later version of a trial first, which `dedup` keeps.
        assessed.sort_unstable_by(|a, b| key(a).cmp(key(b)).then(b.order.cmp(&a.order)));
        assessed.dedup_by(|later, first| later.trial == first.trial);
        Graded { spill, assessed }
    }

    /// How many traces were graded.
    pub fn len(&self) -> usize {
        self.assessed.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.assessed.is_empty()
    }

    /// Whether `key`'s trace was graded (`plan`: the run's, which grading was given).
    pub fn contains(&self, plan: &[TrialKey], key: &TrialKey) -> bool {
        self.assessed
            .binary_search_by(|a| plan[a.trial as usize].cmp(key))
            .is_ok()
    }

    /// The grades, left in the spill file and found there by trial, with the model usage of
    /// the graded traces (read from the lines of the traces that used a model).
    /// `plan`: the run's, which grading was given.
    pub fn read(self, plan: &Arc<[TrialKey]>) -> anyhow::Result<ReadBack> {
        let mut usage: BTreeMap<String, UsageTotals> = BTreeMap::new();
        let mut spots = Vec::with_capacity(self.assessed.len());
        for assessment in &self.assessed {
            let key = &plan[assessment.trial as usize];
            if assessment.used_models {
                let Spilled { usage: used, .. } =
                    crate::files::read_json_at::<Spilled<serde::de::IgnoredAny>>(
                        &self.spill,
                        assessment.at,
                        assessment.len as usize,
                    )
                    .context("cannot read back a grade from the grading spill file")?;
                usage
                    .entry(key.variant.to_string())
                    .or_default()
                    .merge(&used);
            }
            spots.push(GradeSpot {
                trial: assessment.trial,
                at: assessment.at,
                len: assessment.len,
            });
        }
        drop(self.assessed);
        let end = self
            .spill
            .metadata()
            .context("cannot read the grading spill file")?
            .len();
        Ok(ReadBack {
            grades: Grades::in_file(self.spill, plan.clone(), spots, end),
            usage,
        })
    }
}

impl<'scope> Grading<'scope> {
    /// Starts the grading threads in `scope`, grading with `judges` the traces of about
    /// `expected` trials of `plan`, their grades spilled into a file in `dir`.
    pub fn start<'env>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        judges: &'env JudgeSet,
        plan: &'env [TrialKey],
        expected: usize,
        dir: &std::path::Path,
    ) -> anyhow::Result<Self> {
        // The plan's positions sorted by key: a trace's trial is found by halves.
        let by_key = Arc::new(sorted_positions(plan, |key| key));
        let file = tempfile::tempfile_in(dir)
            .with_context(|| format!("cannot make the grading spill file in {}", dir.display()))?;
        let (traces, queue) = mpsc::channel::<Stored>();
        let queue = Arc::new(Mutex::new(queue));
        // Room for each trial once, made up front: a list grown by doubling could hold up to
        // twice the room it needs at the end of a run, when memory peaks.
        let spill = Arc::new(Mutex::new(Spill {
            file: std::io::BufWriter::new(file),
            written: 0,
            assessed: Vec::with_capacity(expected),
            broken: None,
        }));
        let threads = (0..threads())
            .map(|_| {
                let queue = queue.clone();
                let spill = spill.clone();
                let by_key = by_key.clone();
                scope.spawn(move || {
                    let mut line = Vec::new();
                    loop {
                        let next = queue.lock().expect("grading queue").recv();
                        let Ok((order, key, record)) = next else {
                            return;
                        };
                        let Some(trial) = find_position(plan, &by_key, |key| key, &key) else {
                            // The coordinator stores only the traces of planned trials.
                            tracing::warn!("trial {key} is not in the plan; it is not graded");
                            continue;
                        };
                        let grade = judges.grade(&key, &record);
                        let usage = trace_usage(&record.trace);
                        drop(record);
                        let used_models = !usage.is_empty();
                        line.clear();
                        serde_json::to_writer(&mut line, &Spilled { grade, usage })
                            .expect("a grade serialises");
                        spill.lock().expect("grading spill").push(
                            (trial as u32, order),
                            &line,
                            used_models,
                        );
                    }
                })
            })
            .collect();
        Ok(Grading {
            plan,
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
        let Spill {
            file,
            assessed,
            broken,
            ..
        } = spill.into_inner().expect("grading spill");
        if let Some(e) = broken {
            return Err(e).context("cannot write the grading spill file");
        }
        let file = file
            .into_inner()
            .map_err(|e| e.into_error())
            .context("cannot write the grading spill file")?;
        Ok(Graded::of(self.plan, file, assessed))
    }
}

impl Spill {
    /// Appends `line`, the grade of the trace of the plan's trial `trial` that arrived
    /// `order`th, which `used_models` when the agent made model calls.
    fn push(&mut self, (trial, order): (u32, u32), line: &[u8], used_models: bool) {
        if self.broken.is_some() {
            return;
        }
        let Ok(len) = u32::try_from(line.len()) else {
            self.broken = Some(std::io::Error::other(format!(
                "a grade is {} bytes, more than a grade may be",
                line.len()
            )));
            return;
        };
        match std::io::Write::write_all(&mut self.file, line) {
            Ok(()) => {
                self.assessed.push(Assessment {
                    at: self.written,
                    trial,
                    order,
                    len,
                    used_models,
                });
                self.written += line.len() as u64;
            }
            Err(e) => self.broken = Some(e),
        }
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
    // The planned trial indices of each (variant, case) the judges compare, looked up once
    // per comparison. Only theirs: an eval without pairwise judges builds nothing here (a map
    // of every trial was the largest thing a run of 100,000 trials held at its end).
    let compared = |variant: &str| judges.iter().any(|j| j.a == variant || j.b == variant);
    let mut planned: BTreeMap<(&str, &str), BTreeSet<u32>> = BTreeMap::new();
    for key in trials.iter().filter(|key| compared(&key.variant)) {
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

    /// The plan of the spill tests: trials `v/a/0`, `v/b/0`, `v/c/0`.
    fn plan() -> Arc<[TrialKey]> {
        ["c", "a", "b"]
            .map(|case| TrialKey::new("v", case, 0))
            .into()
    }

    /// A spill of trials of `plan` as the grading threads leave it, with `grades` pushed in
    /// this order.
    fn spilled(plan: &[TrialKey], grades: &[(&str, u32, TrialGrade, u64)]) -> Graded {
        let mut spill = Spill {
            file: std::io::BufWriter::new(tempfile::tempfile().unwrap()),
            written: 0,
            assessed: Vec::new(),
            broken: None,
        };
        for (case, order, grade, calls) in grades {
            let usage = UsageTotals {
                calls: *calls,
                ..UsageTotals::default()
            };
            let used_models = !usage.is_empty();
            let line = serde_json::to_vec(&Spilled { grade, usage }).unwrap();
            let trial = plan.iter().position(|k| &*k.case == *case).unwrap();
            spill.push((trial as u32, *order), &line, used_models);
        }
        assert!(spill.broken.is_none());
        Graded::of(plan, spill.file.into_inner().unwrap(), spill.assessed)
    }

    fn infra(reason: &str) -> TrialGrade {
        TrialGrade::Infra {
            reason: reason.into(),
        }
    }

    #[test]
    fn a_trace_graded_twice_keeps_its_later_versions_grade_whichever_finished_first() {
        // a's rewrite (stored third) finished grading before its first version did.
        let plan = plan();
        let graded = spilled(
            &plan,
            &[
                ("b", 1, infra("only"), 1),
                ("a", 2, infra("rewritten"), 0),
                ("a", 0, infra("first"), 10),
            ],
        );
        assert_eq!(graded.len(), 2);
        assert!(graded.contains(&plan, &TrialKey::new("v", "a", 0)));
        assert!(
            !graded.contains(&plan, &TrialKey::new("v", "c", 0)),
            "never seen"
        );
        let read = graded.read(&plan).unwrap();
        let reasons: Vec<String> = read
            .grades
            .values()
            .map(|g| match g.into_owned() {
                TrialGrade::Infra { reason } => reason,
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(reasons, ["rewritten", "only"]);
        // The first version's usage is not counted: its rewrite replaced it.
        assert_eq!(read.usage["v"].calls, 1);
    }

    #[test]
    fn grades_left_in_the_spill_read_back_whole_and_can_be_added_to() {
        let score = |reason: &str| crate::grade::JudgeScore {
            judge: "judge".into(),
            value: 0.5,
            pass: false,
            reason: reason.into(),
        };
        let graded_with = |reason: &str| TrialGrade::Graded {
            score: 0.5,
            pass: false,
            judges: smallvec::smallvec![score(reason)],
        };
        let broken = TrialGrade::NotGraded {
            judge: "judge".into(),
            error: "it trapped \u{1F4A5}\nand said so".into(),
        };
        let plan = plan();
        let graded = spilled(
            &plan,
            &[
                ("a", 0, graded_with("first \"quoted\""), 0),
                ("c", 2, graded_with("third"), 0),
                ("b", 1, broken.clone(), 0),
            ],
        );
        let mut read = graded.read(&plan).unwrap();
        assert!(read.usage.is_empty(), "no trace used a model");
        let grades: Vec<TrialGrade> = read.grades.values().map(|g| g.into_owned()).collect();
        assert_eq!(
            grades,
            [
                graded_with("first \"quoted\""),
                broken.clone(),
                graded_with("third")
            ]
        );
        // A resume's earlier traces, graded at the end, join them in the same file; the
        // later grade of a trial wins.
        read.grades.extend([
            (TrialKey::new("v", "b", 0), infra("regraded")),
            (TrialKey::new("v", "d", 0), infra("new")),
        ]);
        let keys: Vec<String> = read.grades.iter().map(|(k, _)| k.to_string()).collect();
        assert_eq!(keys.len(), 4, "{keys:?}");
        assert_eq!(
            read.grades.get(&TrialKey::new("v", "b", 0)).as_deref(),
            Some(&infra("regraded"))
        );
        assert_eq!(
            read.grades.get(&TrialKey::new("v", "a", 0)).as_deref(),
            Some(&graded_with("first \"quoted\""))
        );
        let back: Grades =
            serde_json::from_value(serde_json::to_value(&read.grades).unwrap()).unwrap();
        assert_eq!(back, read.grades, "grades.json holds what the file held");
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
