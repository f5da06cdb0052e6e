//! [`Grades`]: every trial's grade, as a run holds it in memory and as `grades.json` stores it.

use super::TrialGrade;
use crate::eval::trial::TrialKey;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Every graded trial's grade, sorted by trial, each trial once.
///
/// A flat sorted list rather than a tree: a run of 100,000 trials holds one, and a list costs
/// each grade its own size and no more (no nodes, no second copy while it is built from the
/// grading threads' list). Lookups are binary searches.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Grades(Vec<(TrialKey, TrialGrade)>);

impl Grades {
    /// The grade of `key`, if it was graded.
    pub fn get(&self, key: &TrialKey) -> Option<&TrialGrade> {
        let at = self.0.binary_search_by(|(k, _)| k.cmp(key)).ok()?;
        Some(&self.0[at].1)
    }

    /// Whether `key` was graded.
    pub fn contains_key(&self, key: &TrialKey) -> bool {
        self.get(key).is_some()
    }

    /// How many trials were graded.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether none was.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The grades, by trial.
    pub fn iter(&self) -> impl Iterator<Item = (&TrialKey, &TrialGrade)> {
        self.0.iter().map(|(key, grade)| (key, grade))
    }

    /// The grades alone, by trial.
    pub fn values(&self) -> impl Iterator<Item = &TrialGrade> {
        self.0.iter().map(|(_, grade)| grade)
    }

    /// `grades`, already sorted by trial with each trial once.
    pub(crate) fn from_sorted(grades: Vec<(TrialKey, TrialGrade)>) -> Self {
        debug_assert!(grades.windows(2).all(|pair| pair[0].0 < pair[1].0));
        Grades(grades)
    }

    /// Adds `more`; a trial already here keeps the grade that came last.
    pub fn extend(&mut self, more: impl IntoIterator<Item = (TrialKey, TrialGrade)>) {
        let len = self.0.len();
        self.0.extend(more);
        if self.0.len() > len {
            Self::settle(&mut self.0);
        }
    }

    /// Sorts `grades` by trial (stably, so that a trial's grades stay in the order they came)
    /// and keeps each trial's last.
    fn settle(grades: &mut Vec<(TrialKey, TrialGrade)>) {
        grades.sort_by(|(a, _), (b, _)| a.cmp(b));
        // `dedup_by` keeps the first of a run of equals: move each run's last to its front.
        let mut start = 0;
        while start < grades.len() {
            let end = start + grades[start..].partition_point(|(k, _)| *k == grades[start].0);
            grades.swap(start, end - 1);
            start = end;
        }
        grades.dedup_by(|later, first| later.0 == first.0);
        grades.shrink_to_fit();
    }
}

impl FromIterator<(TrialKey, TrialGrade)> for Grades {
    fn from_iter<I: IntoIterator<Item = (TrialKey, TrialGrade)>>(grades: I) -> Self {
        let mut grades: Vec<_> = grades.into_iter().collect();
        Self::settle(&mut grades);
        Grades(grades)
    }
}

impl IntoIterator for Grades {
    type Item = (TrialKey, TrialGrade);
    type IntoIter = std::vec::IntoIter<(TrialKey, TrialGrade)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl<'a> IntoIterator for &'a Grades {
    type Item = (&'a TrialKey, &'a TrialGrade);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (TrialKey, TrialGrade)>,
        fn(&'a (TrialKey, TrialGrade)) -> (&'a TrialKey, &'a TrialGrade),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(key, grade)| (key, grade))
    }
}

/// One entry of `grades.json`.
#[derive(Serialize)]
struct GradeEntry<'a> {
    key: &'a TrialKey,
    grade: &'a TrialGrade,
}

#[derive(Deserialize)]
struct OwnedGradeEntry {
    key: TrialKey,
    grade: TrialGrade,
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

    fn infra(reason: &str) -> TrialGrade {
        TrialGrade::Infra {
            reason: reason.into(),
        }
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
        assert_eq!(grades.get(&key("b")), Some(&infra("b3")));
        grades.extend([(key("a"), infra("a2")), (key("c"), infra("c1"))]);
        let listed: Vec<(&str, &TrialGrade)> = grades.iter().map(|(k, g)| (&*k.case, g)).collect();
        assert_eq!(
            listed,
            [
                ("a", &infra("a2")),
                ("b", &infra("b3")),
                ("c", &infra("c1"))
            ]
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
}
