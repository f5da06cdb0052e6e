//! [`Grades`]: every trial's grade, as a run holds it and as `grades.json` stores it.

use super::slots::{Slot, Slots};
use super::TrialGrade;
use crate::eval::plan::Plan;
use crate::eval::trial::TrialKey;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;

/// The most a trial's entry in `grades.json` is taken to hold, for the file's size cap.
const GRADE_BYTES: u64 = 16 * 1024;

/// How large the `grades.json` of a run of `trials` may be: a run's own file grows with its
/// trials (339 MB at a million), past the cap of a file a user hands mst.
fn file_cap(trials: usize) -> u64 {
    (crate::files::MAX_INPUT_BYTES).max(trials as u64 * GRADE_BYTES)
}

/// Every graded trial's grade, in the order of their keys, each trial once: held in memory (a
/// short list, or grades a file could not take), or left in a file ([`Grades::in_file`]):
/// the one grading wrote them to as it went, where a run just collected or regraded keeps
/// them, or a copy of a stored run's `grades.json` ([`Grades::read_file`]). A grade left in
/// a file is found through [`Slots`], one for each trial of the run's plan, in a second file:
/// memory holds one bit a trial rather than the grades (about 150 bytes a trial), and each is
/// read back when it is used.
#[derive(Debug, Default)]
pub struct Grades(Store);

#[derive(Debug)]
enum Store {
    /// A flat list sorted by key rather than a tree: each grade its own size and no more.
    Held(Vec<(TrialKey, TrialGrade)>),
    InFile(GradeFile),
}

impl Default for Store {
    fn default() -> Self {
        Store::Held(Vec::new())
    }
}

/// Grades in a file of JSON objects, each with the grade in its `grade` field, and each
/// trial's slot: where its grade is.
#[derive(Debug)]
struct GradeFile {
    file: std::fs::File,
    /// By the trial's position in `plan`.
    slots: Slots,
    /// The run's plan.
    plan: Plan,
    /// The file's length: grades added later go here.
    end: u64,
}

/// What a line of a grades file is read as: its grade, whatever else it holds.
#[derive(Deserialize)]
struct GradeLine {
    grade: TrialGrade,
}

impl GradeFile {
    /// The position in the plan of `key`'s trial, if the file has its grade.
    fn find(&self, key: &TrialKey) -> Option<usize> {
        self.plan
            .position(key)
            .filter(|&trial| self.slots.contains(trial))
    }

    /// The grade of the plan's trial at `trial`, which the file has. A file of the run's own
    /// that cannot be read back (a disk fault) makes the trial's grade say so, and the run's
    /// grading `partial`, rather than lose it silently.
    fn read(&self, trial: usize) -> TrialGrade {
        let read = self.slots.get(trial).and_then(|slot| {
            let slot = slot.ok_or_else(|| std::io::Error::other("it has no slot"))?;
            crate::files::read_json_at::<GradeLine>(&self.file, slot.at, slot.len as usize)
        });
        match read {
            Ok(line) => line.grade,
            Err(e) => {
                tracing::warn!(
                    "cannot read the grade of {} back: {e}",
                    self.plan.key(trial)
                );
                TrialGrade::NotGraded {
                    judge: "mst".into(),
                    error: format!("its grade could not be read back from the grading file: {e}"),
                }
            }
        }
    }

    /// The positions of the trials graded, in the order of their keys.
    fn graded(&self) -> impl Iterator<Item = usize> + '_ {
        (self.plan.positions_by_key()).filter(|&trial| self.slots.contains(trial))
    }

    /// Appends `grade` of the plan's trial at `trial` to the file, and where it is to its
    /// slot: an earlier grade of the trial is replaced.
    fn push(&mut self, trial: usize, grade: &TrialGrade) -> std::io::Result<()> {
        use std::os::unix::fs::FileExt;
        let mut line = Vec::new();
        grade_line(grade, &mut line)?;
        self.file.write_all_at(&line, self.end)?;
        self.spot(trial, line.len())
    }

    /// Notes that the file's next `len` bytes are the grade of the plan's trial `trial`.
    fn spot(&mut self, trial: usize, len: usize) -> std::io::Result<()> {
        self.slots.set(trial, Slot::new(self.end, len)?)?;
        self.end += len as u64;
        Ok(())
    }
}

/// `grade` as a line of a grades file holds it, in `line`.
fn grade_line(grade: &TrialGrade, line: &mut Vec<u8>) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Line<'a> {
        grade: &'a TrialGrade,
    }
    line.clear();
    serde_json::to_writer(&mut *line, &Line { grade })?;
    Ok(())
}

/// Sorts `items` by trial, as `order` compares them (stably, so that a trial's entries stay
/// in the order they came), and keeps each trial's last.
fn keep_last_by<T>(items: &mut Vec<T>, order: impl Fn(&T, &T) -> std::cmp::Ordering) {
    items.sort_by(&order);
    let same = |a: &T, b: &T| order(a, b).is_eq();
    // `dedup_by` keeps the first of a run of equals: move each run's last to its front.
    let mut start = 0;
    while start < items.len() {
        let end = start + items[start..].partition_point(|item| same(item, &items[start]));
        items.swap(start, end - 1);
        start = end;
    }
    items.dedup_by(|later, first| same(later, first));
    items.shrink_to_fit();
}

impl Grades {
    /// The grades in `file` of trials of `plan`, each where its trial's slot in `slots`
    /// says; `end` the file's length.
    pub(crate) fn in_file(file: std::fs::File, slots: Slots, plan: Plan, end: u64) -> Self {
        Grades(Store::InFile(GradeFile {
            file,
            slots,
            plan,
            end,
        }))
    }

    /// The grade of `key`, if it was graded.
    pub fn get(&self, key: &TrialKey) -> Option<Cow<'_, TrialGrade>> {
        match &self.0 {
            Store::Held(grades) => {
                let at = grades.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
                Some(Cow::Borrowed(&grades[at].1))
            }
            Store::InFile(file) => Some(Cow::Owned(file.read(file.find(key)?))),
        }
    }

    /// Whether `key` was graded.
    pub fn contains_key(&self, key: &TrialKey) -> bool {
        match &self.0 {
            Store::Held(grades) => grades.binary_search_by(|(k, _)| k.cmp(key)).is_ok(),
            Store::InFile(file) => file.find(key).is_some(),
        }
    }

    /// How many trials were graded.
    pub fn len(&self) -> usize {
        match &self.0 {
            Store::Held(grades) => grades.len(),
            Store::InFile(file) => file.slots.count(),
        }
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The grades, by trial, each read as it is reached.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (Cow<'_, TrialKey>, Cow<'_, TrialGrade>)> + '_> {
        match &self.0 {
            Store::Held(grades) => Box::new(
                (grades.iter()).map(|(key, grade)| (Cow::Borrowed(key), Cow::Borrowed(grade))),
            ),
            Store::InFile(file) => Box::new(file.graded().map(|trial| {
                (
                    Cow::Owned(file.plan.key(trial)),
                    Cow::Owned(file.read(trial)),
                )
            })),
        }
    }

    /// The grades alone, by trial.
    pub fn values(&self) -> impl Iterator<Item = Cow<'_, TrialGrade>> {
        self.iter().map(|(_, grade)| grade)
    }

    /// Adds `more`; a trial already here keeps the grade that came last.
    pub fn extend(&mut self, more: impl IntoIterator<Item = (TrialKey, TrialGrade)>) {
        match &mut self.0 {
            Store::Held(grades) => {
                let len = grades.len();
                grades.extend(more);
                if grades.len() > len {
                    keep_last_by(grades, |a, b| a.0.cmp(&b.0));
                }
            }
            Store::InFile(file) => {
                let mut unwritten = Vec::new();
                for (key, grade) in more {
                    // After a write failed, every later grade is held: a trial's last grade
                    // stays last.
                    let pushed = match (file.plan.position(&key), unwritten.is_empty()) {
                        (Some(trial), true) => file.push(trial, &grade),
                        (None, _) => {
                            Err(std::io::Error::other("the trial is not in the run's plan"))
                        }
                        (Some(_), false) => Err(std::io::Error::other("an earlier grade is held")),
                    };
                    if let Err(e) = pushed {
                        tracing::warn!("the grade of {key} stays in memory: {e}");
                        unwritten.push((key, grade));
                    }
                }
                // A grade the file could not take is kept all the same: every grade in
                // memory then, the file's read back.
                if !unwritten.is_empty() {
                    let mut grades: Vec<_> = std::mem::take(self).into_iter().collect();
                    grades.extend(unwritten);
                    keep_last_by(&mut grades, |a, b| a.0.cmp(&b.0));
                    self.0 = Store::Held(grades);
                }
            }
        }
    }
}

impl IntoIterator for Grades {
    type Item = (TrialKey, TrialGrade);
    type IntoIter = Box<dyn Iterator<Item = (TrialKey, TrialGrade)>>;

    /// The grades, by trial, each read as it is reached.
    fn into_iter(self) -> Self::IntoIter {
        match self.0 {
            Store::Held(grades) => Box::new(grades.into_iter()),
            Store::InFile(file) => {
                let mut positions = file.plan.positions_by_key();
                Box::new(std::iter::from_fn(move || {
                    let trial = positions.find(|&trial| file.slots.contains(trial))?;
                    Some((file.plan.key(trial), file.read(trial)))
                }))
            }
        }
    }
}

impl PartialEq for Grades {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl FromIterator<(TrialKey, TrialGrade)> for Grades {
    fn from_iter<I: IntoIterator<Item = (TrialKey, TrialGrade)>>(grades: I) -> Self {
        let mut grades: Vec<_> = grades.into_iter().collect();
        keep_last_by(&mut grades, |a, b| a.0.cmp(&b.0));
        Grades(Store::Held(grades))
    }
}

/// One entry of `grades.json`.
#[derive(Serialize)]
struct GradeEntry<'a> {
    key: Cow<'a, TrialKey>,
    grade: Cow<'a, TrialGrade>,
}

#[derive(Deserialize)]
struct OwnedGradeEntry {
    key: TrialKey,
    grade: TrialGrade,
}

impl Grades {
    /// The grades in `grades.json` at `path`, of trials of `plan` (the run's), copied as they
    /// are read into an unnamed file and kept there, found through their slots
    /// ([`Grades::in_file`]): a run of 100,000 trials then holds a bit a trial, where the
    /// grades and their keys held in memory were about 200 bytes. Grades of a trial the plan
    /// lacks bring them all into memory.
    pub fn read_file(path: &std::path::Path, plan: Plan) -> anyhow::Result<Self> {
        // Beside the file (a disk, where `$TMPDIR` may be memory), else in `$TMPDIR`; written
        // through a second handle of it, buffered.
        let made = |dir: &std::path::Path| -> std::io::Result<_> {
            let file = tempfile::tempfile_in(dir)?;
            Ok((file.try_clone()?, file, Slots::new_in(dir, plan.len())?))
        };
        let beside =
            (path.parent()).map_or_else(|| Err(std::io::Error::other("no directory")), made);
        let copy = beside.or_else(|_| made(&std::env::temp_dir()));
        let (writer, file, slots) = match copy {
            Ok(copy) => copy,
            Err(e) => {
                tracing::warn!("the grades of {} are held in memory: {e}", path.display());
                return crate::files::read_json_file(path);
            }
        };
        let mut into = IntoFile {
            writer: std::io::BufWriter::new(writer),
            broken: None,
            line: Vec::new(),
            grades: GradeFile {
                file,
                slots,
                plan,
                end: 0,
            },
            held: Vec::new(),
        };
        let cap = file_cap(into.grades.plan.len());
        crate::files::read_json_file_with(path, &mut into, cap)?;
        let IntoFile {
            writer,
            broken,
            grades,
            held,
            ..
        } = into;
        let flushed = writer.into_inner().map_err(|e| e.into_error());
        if let Some(e) = broken.or(flushed.err()) {
            // The copy is not whole: every grade is read again, into memory.
            tracing::warn!("the grades of {} are held in memory: {e}", path.display());
            return crate::files::read_json_file(path);
        }
        let mut grades = Grades(Store::InFile(grades));
        // After the copied ones, so a trial's last grade stays last.
        grades.extend(held);
        Ok(grades)
    }
}

/// [`Grades::read_file`]'s reading: each grade of a planned trial written to the copy as it is
/// read; one of a trial the plan lacks held. After a write fails nothing more is copied: the
/// file is read again, into memory.
struct IntoFile {
    /// The copy being written (a second handle of `grades.file`).
    writer: std::io::BufWriter<std::fs::File>,
    /// The first write that failed.
    broken: Option<std::io::Error>,
    line: Vec<u8>,
    /// The copy, and each grade's slot.
    grades: GradeFile,
    held: Vec<(TrialKey, TrialGrade)>,
}

impl<'de> serde::de::DeserializeSeed<'de> for &mut IntoFile {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> serde::de::Visitor<'de> for &mut IntoFile {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a list of grades, each with its `key` and `grade`")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let plan = self.grades.plan.clone();
        while let Some(OwnedGradeEntry { key, grade }) = seq.next_element()? {
            if self.broken.is_some() {
                continue;
            }
            let Some(trial) = plan.position(&key) else {
                self.held.push((key, grade));
                continue;
            };
            let written = grade_line(&grade, &mut self.line)
                .and_then(|()| std::io::Write::write_all(&mut self.writer, &self.line))
                .and_then(|()| self.grades.spot(trial, self.line.len()));
            if let Err(e) = written {
                self.broken = Some(e);
            }
        }
        Ok(())
    }
}

/// `grades.json`'s form: a list of `{"key", "grade"}`, written straight from the grades.
impl Serialize for Grades {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_seq(self.iter().map(|(key, grade)| GradeEntry { key, grade }))
    }
}

impl<'de> Deserialize<'de> for Grades {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let entries = Vec::<OwnedGradeEntry>::deserialize(deserializer)?;
        Ok(entries.into_iter().map(|e| (e.key, e.grade)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(case: &str) -> TrialKey {
        TrialKey::new("v", case, 0)
    }

    #[test]
    fn a_million_trials_grades_may_pass_the_cap_of_a_users_file() {
        assert_eq!(file_cap(10), crate::files::MAX_INPUT_BYTES);
        // A million-trial run's grades.json, as measured: 339 MB.
        assert!(file_cap(1_000_000) > 339_000_000);
    }

    fn infra(reason: &str) -> TrialGrade {
        TrialGrade::Infra {
            reason: reason.into(),
        }
    }

    #[test]
    fn grades_json_read_into_a_file_keeps_each_trials_last_grade_and_any_the_plan_lacks() {
        let plan = Plan::from_keys(["c", "a", "b"].map(key)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("grades.json");
        let written: Grades = [(key("b"), infra("b")), (key("a"), infra("a1"))]
            .into_iter()
            .collect();
        // As written, then a later grade of `a` and one of a trial the plan lacks.
        let mut entries = serde_json::to_value(&written).unwrap();
        let more = [(key("a"), infra("a2")), (key("z"), infra("z"))];
        for (key, grade) in &more {
            let entry = serde_json::json!({"key": key, "grade": grade});
            entries.as_array_mut().unwrap().push(entry);
        }
        std::fs::write(&path, entries.to_string()).unwrap();
        let read = Grades::read_file(&path, plan.clone()).unwrap();
        let listed: Vec<(String, TrialGrade)> = (read.iter())
            .map(|(k, g)| (k.case.to_string(), g.into_owned()))
            .collect();
        assert_eq!(
            listed,
            [
                ("a".into(), infra("a2")),
                ("b".into(), infra("b")),
                ("z".into(), infra("z"))
            ]
        );
        // Only planned trials: kept in the file, and the same grades as read into memory.
        std::fs::write(&path, serde_json::to_string(&written).unwrap()).unwrap();
        let in_file = Grades::read_file(&path, plan.clone()).unwrap();
        assert!(matches!(in_file.0, Store::InFile(_)));
        let held: Grades = crate::files::read_json_file(&path).unwrap();
        assert_eq!(in_file, held);
        assert_eq!(in_file.get(&key("a")).as_deref(), Some(&infra("a1")));
        assert!(in_file.get(&key("c")).is_none());
        // Damaged: named, never a shorter list of grades.
        std::fs::write(
            &path,
            r#"[{"key": {"variant": "v", "case": "a", "trial": 0}, "gra"#,
        )
        .unwrap();
        let error = format!("{:#}", Grades::read_file(&path, plan).unwrap_err());
        assert!(error.contains("grades.json is damaged"), "{error}");
    }

    #[test]
    fn a_trial_graded_twice_keeps_its_last_grade() {
        let mut grades: Grades = [
            (key("b"), infra("b1")),
            (key("a"), infra("a1")),
            (key("b"), infra("b2")),
            (key("b"), infra("b3")),
        ]
        .into_iter()
        .collect();
        assert_eq!(grades.len(), 2);
        assert_eq!(grades.get(&key("b")).as_deref(), Some(&infra("b3")));
        grades.extend([(key("a"), infra("a2")), (key("c"), infra("c1"))]);
        let listed: Vec<(String, TrialGrade)> = (grades.iter())
            .map(|(k, g)| (k.case.to_string(), g.into_owned()))
            .collect();
        assert_eq!(
            listed,
            [("a", infra("a2")), ("b", infra("b3")), ("c", infra("c1"))]
                .map(|(case, grade)| (case.to_string(), grade))
        );
        assert!(!grades.contains_key(&key("d")));
    }

    #[test]
    fn grades_json_is_a_list_of_keys_and_grades_and_reads_back() {
        let grades: Grades = [(key("a"), infra("gone"))].into_iter().collect();
        let json = serde_json::to_value(&grades).unwrap();
        assert_eq!(
            json,
            serde_json::json!([{
                "key": {"variant": "v", "case": "a", "trial": 0},
                "grade": {"outcome": "infra", "reason": "gone"}
            }])
        );
        let back: Grades = serde_json::from_value(json).unwrap();
        assert_eq!(back, grades);
    }

    #[test]
    fn a_grade_the_file_cannot_give_back_is_not_graded_and_says_why() {
        use std::io::Write;
        let mut file = tempfile::tempfile().unwrap();
        let good = br#"{"grade":{"outcome":"infra","reason":"kept"},"usage":{"calls":1}}"#;
        file.write_all(good).unwrap();
        file.write_all(b"{\"grade\": damaged").unwrap();
        let end = file.metadata().unwrap().len();
        let plan = Plan::from_keys(["a", "b", "c", "d"].map(key)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut slots = Slots::new_in(dir.path(), plan.len()).unwrap();
        slots.set(0, Slot::new(0, good.len()).unwrap()).unwrap();
        let damaged = (end - good.len() as u64) as usize;
        slots
            .set(1, Slot::new(good.len() as u64, damaged).unwrap())
            .unwrap();
        // Past the file's end.
        slots.set(2, Slot::new(end, 10).unwrap()).unwrap();
        let grades = Grades::in_file(file, slots, plan, end);
        assert_eq!(grades.get(&key("a")).as_deref(), Some(&infra("kept")));
        for case in ["b", "c"] {
            match grades.get(&key(case)).map(Cow::into_owned) {
                Some(TrialGrade::NotGraded { judge, error }) => {
                    assert_eq!(judge, "mst");
                    assert!(error.contains("could not be read back"), "{error}");
                }
                other => panic!("{case}: {other:?}"),
            }
        }
        assert!(grades.get(&key("d")).is_none());
    }

    #[test]
    fn grades_in_a_file_come_in_the_order_of_their_keys_as_held_ones_do() {
        // Variants and cases out of their keys' order in the plan, cases' own repetitions.
        let plan = Plan::new(vec!["w".into(), "v".into()], [("y", 2), ("x", 1), ("z", 3)]).unwrap();
        let every: Vec<(TrialKey, TrialGrade)> = (plan.keys())
            .filter(|key| key.trial != 1)
            .map(|key| {
                let reason = key.to_string();
                (key, infra(&reason))
            })
            .collect();
        let held: Grades = every.iter().cloned().collect();
        let dir = tempfile::tempdir().unwrap();
        let slots = Slots::new_in(dir.path(), plan.len()).unwrap();
        let mut in_file = Grades::in_file(tempfile::tempfile().unwrap(), slots, plan, 0);
        in_file.extend(every.iter().rev().cloned());
        assert!(matches!(in_file.0, Store::InFile(_)));
        let order = |grades: &Grades| -> Vec<String> {
            grades.iter().map(|(key, _)| key.to_string()).collect()
        };
        assert_eq!(
            order(&in_file),
            ["v/x/0", "v/y/0", "v/z/0", "v/z/2", "w/x/0", "w/y/0", "w/z/0", "w/z/2"]
        );
        assert_eq!(order(&in_file), order(&held));
        assert!(in_file == held, "the same grades, in the same order");
        let owned: Vec<(TrialKey, TrialGrade)> = in_file.into_iter().collect();
        assert_eq!(owned, held.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn grades_in_a_file_take_more_there_and_a_stranger_brings_them_all_into_memory() {
        let plan = Plan::from_keys(["b", "a", "c"].map(key)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let slots = Slots::new_in(dir.path(), plan.len()).unwrap();
        let mut in_file = Grades::in_file(tempfile::tempfile().unwrap(), slots, plan, 0);
        in_file.extend([(key("c"), infra("c1")), (key("a"), infra("a1"))]);
        in_file.extend([(key("c"), infra("c2"))]);
        assert!(
            matches!(in_file.0, Store::InFile(_)),
            "planned trials stay in the file"
        );
        let listed: Vec<(String, TrialGrade)> = (in_file.iter())
            .map(|(k, g)| (k.case.to_string(), g.into_owned()))
            .collect();
        let expected = [
            ("a".to_string(), infra("a1")),
            ("c".to_string(), infra("c2")),
        ];
        assert_eq!(listed, expected, "by key, each trial's last");
        assert!(!in_file.contains_key(&key("b")));
        // A trial the plan does not hold has no place in the file: kept in memory, with the
        // rest read back beside it.
        in_file.extend([(key("z"), infra("z1"))]);
        assert!(matches!(in_file.0, Store::Held(_)));
        assert_eq!(in_file.len(), 3);
        assert_eq!(in_file.get(&key("c")).as_deref(), Some(&infra("c2")));
        assert_eq!(in_file.get(&key("z")).as_deref(), Some(&infra("z1")));
    }
}
