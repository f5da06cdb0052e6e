//! The grading spill: the grades [`super::Grading`] makes while collection goes on, each
//! written to an unnamed file in the run directory as it is made, and where each trial's is,
//! kept in [`Slots`], one for each trial of the plan.
//!
//! Memory holds one bit a trial (which slots are written) until the run ends, and after it:
//! the grades are handed on in their files ([`Grades::in_file`]). A run of 100,000 trials once
//! held 24 bytes a trial here for the whole of its collection, the coordinator's largest list
//! after the plan (issue 16: memory flat in N).

use crate::eval::plan::Plan;
use crate::grade::slots::{Slot, Slots};
use crate::grade::Grades;
use crate::llm::UsageTotals;
use crate::results::tool_health::{ToolTotals, TraceTools};
use anyhow::Context;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};

/// A line of the spill file.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Spilled<G> {
    pub grade: G,
    #[serde(default, skip_serializing_if = "UsageTotals::is_empty")]
    pub usage: UsageTotals,
    /// The trace's tool calls by server.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: TraceTools,
}

/// The grading threads' shared end: the spill file, and each trial's slot.
pub(super) struct Spill {
    file: io::BufWriter<File>,
    written: u64,
    slots: Slots,
    /// The first write that failed; grading goes on, and [`Spill::finish`] reports it.
    broken: Option<io::Error>,
}

impl Spill {
    /// An empty spill in `dir` for a plan of `trials` trials.
    pub fn new(dir: &std::path::Path, trials: usize) -> anyhow::Result<Self> {
        let made = || -> io::Result<(File, Slots)> {
            Ok((tempfile::tempfile_in(dir)?, Slots::new_in(dir, trials)?))
        };
        let (file, slots) = made()
            .with_context(|| format!("cannot make the grading spill files in {}", dir.display()))?;
        Ok(Spill {
            file: io::BufWriter::new(file),
            written: 0,
            slots,
            broken: None,
        })
    }

    /// Takes `graded`'s files up again, to add the grades of trials it lacks.
    pub fn reopen(graded: Graded) -> io::Result<Self> {
        use std::io::Seek;
        let Graded { mut spill, slots } = graded;
        let written = spill.seek(io::SeekFrom::End(0))?;
        Ok(Spill {
            file: io::BufWriter::new(spill),
            written,
            slots,
            broken: None,
        })
    }

    /// Whether the plan's trial `trial` has a grade here.
    pub fn contains(&self, trial: usize) -> bool {
        self.slots.contains(trial)
    }

    /// Appends `line`, the grade of the trace of the plan's trial `trial` that arrived
    /// `order`th, `tallied` when the line carries the trace's tallies; a grade of a later
    /// version of the same trace, already here, stays.
    pub fn push(&mut self, (trial, order): (u32, u32), line: &[u8], tallied: bool) {
        if self.broken.is_none() {
            if let Err(e) = self.try_push(trial as usize, order, line, tallied) {
                self.broken = Some(e);
            }
        }
    }

    fn try_push(&mut self, trial: usize, order: u32, line: &[u8], tallied: bool) -> io::Result<()> {
        let slot = Slot {
            order,
            tallied,
            ..Slot::new(self.written, line.len())?
        };
        // A trial's first grade is written without reading its slot.
        if (self.slots.get(trial)?).is_some_and(|held| held.order > order) {
            return Ok(());
        }
        self.file.write_all(line)?;
        self.slots.set(trial, slot)?;
        self.written += u64::from(slot.len);
        Ok(())
    }

    /// The grades spilled, still in their files.
    pub fn finish(self) -> anyhow::Result<Graded> {
        let context = "cannot write the grading spill file";
        if let Some(e) = self.broken {
            return Err(e).context(context);
        }
        let spill = (self.file.into_inner().map_err(|e| e.into_error())).context(context)?;
        Ok(Graded {
            spill,
            slots: self.slots,
        })
    }
}

/// What [`super::Grading`] made of the traces it saw: the spill file, and each trial's slot.
/// Its trials are positions in the plan, which [`Graded::read`] is given.
pub struct Graded {
    spill: File,
    slots: Slots,
}

/// The grades [`Graded::read`] hands on, and the agents' model usage and tool calls in their
/// traces.
pub struct ReadBack {
    pub grades: Grades,
    /// The agents' usage in the graded traces, by variant.
    pub usage: BTreeMap<String, UsageTotals>,
    /// The graded traces' tool calls, by server.
    pub tools: ToolTotals,
}

impl Graded {
    /// How many traces were graded.
    pub fn len(&self) -> usize {
        self.slots.count()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Whether the trace of the plan's trial at `trial` was graded.
    pub fn contains(&self, trial: usize) -> bool {
        self.slots.contains(trial)
    }

    /// The grades, left in their files, with the model usage of the graded traces (read
    /// from the lines of the traces that used a model). `plan`: the run's, which grading was
    /// given.
    pub fn read(self, plan: &Plan) -> anyhow::Result<ReadBack> {
        let mut usage: BTreeMap<String, UsageTotals> = BTreeMap::new();
        let mut tools = ToolTotals::default();
        for slot in self.slots.each() {
            let (trial, slot) = slot.context("cannot read the grading spill's slots")?;
            if !slot.tallied {
                continue;
            }
            let Spilled {
                usage: used,
                tools: called,
                ..
            } = crate::files::read_json_at::<Spilled<serde::de::IgnoredAny>>(
                &self.spill,
                slot.at,
                slot.len as usize,
            )
            .context("cannot read back a grade from the grading spill file")?;
            let variant = plan.parts(trial).0;
            if !used.is_empty() {
                usage.entry(variant.to_string()).or_default().merge(&used);
            }
            tools.add(variant, &called);
        }
        let end = (self.spill.metadata())
            .context("cannot read the grading spill file")?
            .len();
        Ok(ReadBack {
            grades: Grades::in_file(self.spill, self.slots, plan.clone(), end),
            usage,
            tools,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::TrialKey;
    use crate::grade::TrialGrade;

    /// The plan of the spill tests: trials `v/a/0`, `v/b/0`, `v/c/0`.
    fn plan() -> Plan {
        Plan::from_keys(["c", "a", "b"].map(|case| TrialKey::new("v", case, 0))).unwrap()
    }

    /// A spill of trials of `plan` as the grading threads leave it, with `grades` pushed in
    /// this order.
    fn spilled(plan: &Plan, grades: &[(&str, u32, TrialGrade, u64)]) -> Graded {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::new(dir.path(), plan.len()).unwrap();
        for (case, order, grade, calls) in grades {
            let usage = UsageTotals {
                calls: *calls,
                ..UsageTotals::default()
            };
            let tallied = !usage.is_empty();
            let tools = TraceTools::new();
            let line = serde_json::to_vec(&Spilled {
                grade,
                usage,
                tools,
            })
            .unwrap();
            let trial = plan.keys().position(|k| &*k.case == *case).unwrap();
            spill.push((trial as u32, *order), &line, tallied);
        }
        assert!(spill.broken.is_none());
        spill.finish().unwrap()
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
        assert!(graded.contains(1), "a");
        assert!(!graded.contains(0), "c was never seen");
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
    fn a_later_version_graded_last_replaces_the_earlier_grade_and_its_usage() {
        let plan = plan();
        let graded = spilled(
            &plan,
            &[("a", 0, infra("first"), 10), ("a", 1, infra("second"), 0)],
        );
        let read = graded.read(&plan).unwrap();
        let grades: Vec<TrialGrade> = read.grades.values().map(|g| g.into_owned()).collect();
        assert_eq!(grades, [infra("second")]);
        assert!(read.usage.is_empty(), "the second version used no model");
    }

    #[test]
    fn a_spill_reopened_keeps_its_grades_and_takes_the_trials_it_lacks() {
        let plan = plan();
        let graded = spilled(&plan, &[("a", 0, infra("while collecting"), 2)]);
        assert!(graded.contains(1) && !graded.contains(2));
        let mut spill = Spill::reopen(graded).unwrap();
        let line = |reason: &str, calls: u64| {
            let usage = UsageTotals {
                calls,
                ..UsageTotals::default()
            };
            serde_json::to_vec(&Spilled {
                grade: infra(reason),
                usage,
                tools: TraceTools::new(),
            })
            .unwrap()
        };
        spill.push((2, 0), &line("at the end", 3), true);
        let read = spill.finish().unwrap().read(&plan).unwrap();
        let grades: Vec<(String, TrialGrade)> = (read.grades.iter())
            .map(|(key, grade)| (key.to_string(), grade.into_owned()))
            .collect();
        assert_eq!(
            grades,
            [
                ("v/a/0".to_string(), infra("while collecting")),
                ("v/b/0".to_string(), infra("at the end"))
            ]
        );
        assert_eq!(read.usage["v"].calls, 5, "both lines' usage");
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
}
