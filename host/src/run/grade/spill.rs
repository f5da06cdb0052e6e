//! The grading spill: the grades [`super::Grading`] makes while collection goes on, each
//! written to an unnamed file in the run directory as it is made, and where each trial's is,
//! kept in a second file of fixed slots, one for each trial of the plan.
//!
//! Memory holds one bit a trial (which slots are written) until the run ends: a run of
//! 100,000 trials once held 24 bytes a trial here for the whole of its collection, the
//! coordinator's largest list after the plan (issue 16: memory flat in N).

use crate::eval::trial::TrialKey;
use crate::grade::{GradeSpot, Grades};
use crate::model::UsageTotals;
use anyhow::Context;
use fixedbitset::FixedBitSet;
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// A line of the spill file.
#[derive(serde::Serialize, serde::Deserialize)]
pub(super) struct Spilled<G> {
    pub grade: G,
    #[serde(default, skip_serializing_if = "UsageTotals::is_empty")]
    pub usage: UsageTotals,
}

/// Where one trial's grade is in the spill file: `len` bytes at `at`, the grade of the
/// trace that arrived `order`th (a later version of a trace replaces an earlier one's grade),
/// and whether the agent made model calls in that trace (its usage is in the line).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Slot {
    at: u64,
    len: u32,
    order: u32,
    used_models: bool,
}

/// A slot's size in the slots file: `at`, then `len` with [`USED_MODELS`] as its top bit,
/// then `order`; little-endian.
const SLOT: u64 = 16;

/// The bit of a slot's `len` word that says the agent made model calls.
const USED_MODELS: u32 = 1 << 31;

impl Slot {
    fn encode(self) -> [u8; SLOT as usize] {
        let flagged = self.len | if self.used_models { USED_MODELS } else { 0 };
        let mut bytes = [0; SLOT as usize];
        bytes[..8].copy_from_slice(&self.at.to_le_bytes());
        bytes[8..12].copy_from_slice(&flagged.to_le_bytes());
        bytes[12..].copy_from_slice(&self.order.to_le_bytes());
        bytes
    }

    fn decode(bytes: &[u8; SLOT as usize]) -> Self {
        let word = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        Slot {
            at: u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes")),
            len: word(8) & !USED_MODELS,
            order: word(12),
            used_models: word(8) & USED_MODELS != 0,
        }
    }
}

/// `len`, a grade line's length, as a slot holds it: below [`USED_MODELS`].
fn slot_len(len: usize) -> io::Result<u32> {
    u32::try_from(len)
        .ok()
        .filter(|len| len & USED_MODELS == 0)
        .ok_or_else(|| {
            io::Error::other(format!("a grade is {len} bytes, more than a grade may be"))
        })
}

/// The grading threads' shared end: the spill file, and each trial's slot.
pub(super) struct Spill {
    file: io::BufWriter<File>,
    written: u64,
    /// One [`Slot`] per trial of the plan, at its position; a sparse file, whose unwritten
    /// slots cost nothing.
    slots: File,
    /// Which slots hold a grade: a trial's first grade is written without reading its slot.
    filled: FixedBitSet,
    /// The first write that failed; grading goes on, and [`Spill::finish`] reports it.
    broken: Option<io::Error>,
}

impl Spill {
    /// An empty spill in `dir` for a plan of `trials` trials.
    pub fn new(dir: &std::path::Path, trials: usize) -> anyhow::Result<Self> {
        let made = || -> io::Result<(File, File)> {
            let slots = tempfile::tempfile_in(dir)?;
            slots.set_len(trials as u64 * SLOT)?;
            Ok((tempfile::tempfile_in(dir)?, slots))
        };
        let (file, slots) = made()
            .with_context(|| format!("cannot make the grading spill files in {}", dir.display()))?;
        Ok(Spill {
            file: io::BufWriter::new(file),
            written: 0,
            slots,
            filled: FixedBitSet::with_capacity(trials),
            broken: None,
        })
    }

    /// Takes `graded`'s files up again, to add the grades of trials it lacks.
    pub fn reopen(graded: Graded) -> io::Result<Self> {
        use std::io::Seek;
        let Graded {
            mut spill,
            slots,
            filled,
        } = graded;
        let written = spill.seek(io::SeekFrom::End(0))?;
        Ok(Spill {
            file: io::BufWriter::new(spill),
            written,
            slots,
            filled,
            broken: None,
        })
    }

    /// Appends `line`, the grade of the trace of the plan's trial `trial` that arrived
    /// `order`th, which `used_models` when the agent made model calls; a grade of a later
    /// version of the same trace, already here, stays.
    pub fn push(&mut self, (trial, order): (u32, u32), line: &[u8], used_models: bool) {
        if self.broken.is_none() {
            if let Err(e) = self.try_push(trial, order, line, used_models) {
                self.broken = Some(e);
            }
        }
    }

    fn try_push(
        &mut self,
        trial: u32,
        order: u32,
        line: &[u8],
        used_models: bool,
    ) -> io::Result<()> {
        let len = slot_len(line.len())?;
        let at = u64::from(trial) * SLOT;
        if self.filled.contains(trial as usize) {
            let mut held = [0; SLOT as usize];
            self.slots.read_exact_at(&mut held, at)?;
            if Slot::decode(&held).order > order {
                return Ok(());
            }
        }
        self.file.write_all(line)?;
        let slot = Slot {
            at: self.written,
            len,
            order,
            used_models,
        };
        self.slots.write_all_at(&slot.encode(), at)?;
        self.filled.insert(trial as usize);
        self.written += u64::from(len);
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
            filled: self.filled,
        })
    }
}

/// What [`super::Grading`] made of the traces it saw: the spill file, and each trial's slot
/// in the slots file. Its trials are positions in the plan, which [`Graded::read`] is given.
pub struct Graded {
    spill: File,
    slots: File,
    /// Which trials were graded, by position in the plan.
    filled: FixedBitSet,
}

/// The grades [`Graded::read`] hands on, and the agents' model usage in their traces.
pub struct ReadBack {
    pub grades: Grades,
    /// The agents' usage in the graded traces, by variant.
    pub usage: BTreeMap<String, UsageTotals>,
}

impl Graded {
    /// How many traces were graded.
    pub fn len(&self) -> usize {
        self.filled.count_ones(..)
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.filled.is_clear()
    }

    /// Whether the trace of the plan's trial at `trial` was graded.
    pub fn contains(&self, trial: usize) -> bool {
        self.filled.contains(trial)
    }

    /// The grades, left in the spill file and found there by trial, with the model usage of
    /// the graded traces (read from the lines of the traces that used a model).
    /// `plan`: the run's, which grading was given.
    pub fn read(self, plan: &Arc<[TrialKey]>) -> anyhow::Result<ReadBack> {
        // Where each grade is, made only now: the end of a run holds 16 bytes a grade once
        // the cases and the shards' lists are gone, not while they are held.
        let mut spots = Vec::with_capacity(self.len());
        let mut usage: BTreeMap<String, UsageTotals> = BTreeMap::new();
        // Every slot in order, in large reads: positioned writes left the file's offset at 0.
        let mut slots = io::BufReader::with_capacity(1 << 16, &self.slots);
        let mut bytes = [0; SLOT as usize];
        for (trial, key) in plan.iter().enumerate() {
            slots
                .read_exact(&mut bytes)
                .context("cannot read the grading spill's slots")?;
            if !self.filled.contains(trial) {
                continue;
            }
            let slot = Slot::decode(&bytes);
            if slot.used_models {
                let Spilled { usage: used, .. } = crate::files::read_json_at::<
                    Spilled<serde::de::IgnoredAny>,
                >(
                    &self.spill, slot.at, slot.len as usize
                )
                .context("cannot read back a grade from the grading spill file")?;
                usage
                    .entry(key.variant.to_string())
                    .or_default()
                    .merge(&used);
            }
            spots.push(GradeSpot {
                trial: trial as u32,
                len: slot.len,
                at: slot.at,
            });
        }
        spots.sort_unstable_by(|a, b| plan[a.trial as usize].cmp(&plan[b.trial as usize]));
        let end = (self.spill.metadata())
            .context("cannot read the grading spill file")?
            .len();
        Ok(ReadBack {
            grades: Grades::in_file(self.spill, plan.clone(), spots, end),
            usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grade::TrialGrade;

    /// The plan of the spill tests: trials `v/a/0`, `v/b/0`, `v/c/0`.
    fn plan() -> Arc<[TrialKey]> {
        ["c", "a", "b"]
            .map(|case| TrialKey::new("v", case, 0))
            .into()
    }

    /// A spill of trials of `plan` as the grading threads leave it, with `grades` pushed in
    /// this order.
    fn spilled(plan: &[TrialKey], grades: &[(&str, u32, TrialGrade, u64)]) -> Graded {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::new(dir.path(), plan.len()).unwrap();
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
        spill.finish().unwrap()
    }

    fn infra(reason: &str) -> TrialGrade {
        TrialGrade::Infra {
            reason: reason.into(),
        }
    }

    #[test]
    fn a_slot_reads_back_as_written_its_flag_apart_from_its_length() {
        for used_models in [false, true] {
            let slot = Slot {
                at: u64::MAX - 7,
                len: USED_MODELS - 1,
                order: 0xdead_beef,
                used_models,
            };
            assert_eq!(Slot::decode(&slot.encode()), slot);
        }
        // An unwritten slot of the sparse file.
        let empty = Slot::decode(&[0; SLOT as usize]);
        assert_eq!((empty.len, empty.used_models), (0, false));
    }

    #[test]
    fn a_grade_too_long_for_its_slot_is_refused_by_its_length() {
        assert_eq!(slot_len(USED_MODELS as usize - 1).unwrap(), USED_MODELS - 1);
        for len in [USED_MODELS as usize, u32::MAX as usize + 1] {
            let error = slot_len(len).unwrap_err().to_string();
            assert!(
                error.contains(&format!("a grade is {len} bytes")),
                "{error}"
            );
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
