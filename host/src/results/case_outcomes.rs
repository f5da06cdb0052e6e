//! [`CaseOutcomes`]: one variant's case verdicts, as `summary.json`'s `cases[variant]` lists
//! them.

use crate::eval::plan::Plan;
use crate::grade::CaseOutcome;
use arcstr::ArcStr;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// One variant's case verdicts, by case id, in the order of the ids. Made at the end of a
/// run, it holds a byte a case beside the run's plan (a map of ids held some twenty); read
/// back from a `summary.json`, the ids it names.
#[derive(Debug, Clone)]
pub struct CaseOutcomes(By);

#[derive(Debug, Clone)]
enum By {
    /// Each of the plan's cases' verdict, in the order of [`Plan::cases`].
    Plan {
        plan: Plan,
        outcomes: Vec<CaseOutcome>,
    },
    /// As a `summary.json` names them: sorted by id, each once.
    Ids(Vec<(ArcStr, CaseOutcome)>),
}

impl CaseOutcomes {
    /// The verdicts `outcomes` of `plan`'s cases, one each in the plan's order.
    pub fn of_plan(plan: Plan, outcomes: Vec<CaseOutcome>) -> Self {
        assert_eq!(
            outcomes.len(),
            plan.cases().len(),
            "a verdict for each planned case"
        );
        CaseOutcomes(By::Plan { plan, outcomes })
    }

    /// The verdict of `case`, if it has one.
    pub fn get(&self, case: &str) -> Option<CaseOutcome> {
        self.get_key_value(case).map(|(_, outcome)| outcome)
    }

    /// `case`'s id as held here, and its verdict, if it has one.
    pub fn get_key_value(&self, case: &str) -> Option<(&str, CaseOutcome)> {
        match &self.0 {
            By::Plan { plan, outcomes } => {
                let at = plan.case_index(case)?;
                Some((plan.case(at), outcomes[at]))
            }
            By::Ids(ids) => {
                let at = ids.binary_search_by(|(id, _)| id.as_str().cmp(case)).ok()?;
                Some((&ids[at].0, ids[at].1))
            }
        }
    }

    /// Every case and its verdict, by id.
    pub fn iter(&self) -> Box<dyn Iterator<Item = (&str, CaseOutcome)> + '_> {
        match &self.0 {
            By::Plan { plan, outcomes } => {
                Box::new((plan.cases_by_id()).map(|(at, id)| (id, outcomes[at])))
            }
            By::Ids(ids) => Box::new(ids.iter().map(|(id, outcome)| (id.as_str(), *outcome))),
        }
    }

    /// How many cases have a verdict.
    pub fn len(&self) -> usize {
        match &self.0 {
            By::Plan { outcomes, .. } => outcomes.len(),
            By::Ids(ids) => ids.len(),
        }
    }

    /// Whether none has.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many cases ended as `wanted`.
    pub fn count(&self, wanted: impl Fn(CaseOutcome) -> bool) -> usize {
        self.iter().filter(|(_, outcome)| wanted(*outcome)).count()
    }
}

/// Equal when they give the same cases the same verdicts, however each is held.
impl PartialEq for CaseOutcomes {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

/// As `summary.json` has it: an object of case id → verdict, by id.
impl Serialize for CaseOutcomes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for CaseOutcomes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // A map sorts the ids and keeps a repeated id's last verdict, as a map read always has.
        let read = BTreeMap::<ArcStr, CaseOutcome>::deserialize(deserializer)?;
        Ok(CaseOutcomes(By::Ids(read.into_iter().collect())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verdicts_by_a_plan_and_as_read_back_are_found_listed_and_written_alike() {
        let plan = Plan::new(vec!["v".into()], [("c2", 1), ("c1", 2), ("c3", 1)]).unwrap();
        let made = CaseOutcomes::of_plan(
            plan,
            vec![
                CaseOutcome::Failed,
                CaseOutcome::Passed,
                CaseOutcome::Incomplete,
            ],
        );
        let text = serde_json::to_string(&made).unwrap();
        assert_eq!(
            text, r#"{"c1":"passed","c2":"failed","c3":"incomplete"}"#,
            "by id"
        );
        let read: CaseOutcomes = serde_json::from_str(&text).unwrap();
        // Out of order and repeated in a hand-edited file: sorted, the last kept.
        let edited: CaseOutcomes = serde_json::from_str(
            r#"{"c3":"incomplete","c2":"passed","c1":"passed","c2":"failed"}"#,
        )
        .unwrap();
        for outcomes in [&made, &read, &edited] {
            assert_eq!(outcomes, &made);
            assert_eq!(outcomes.len(), 3);
            assert_eq!(outcomes.get("c2"), Some(CaseOutcome::Failed));
            assert_eq!(
                outcomes.get_key_value("c3"),
                Some(("c3", CaseOutcome::Incomplete))
            );
            assert_eq!(outcomes.get("c0"), None);
            assert_eq!(outcomes.count(|o| o == CaseOutcome::Passed), 1);
            assert_eq!(
                outcomes.iter().map(|(id, _)| id).collect::<Vec<_>>(),
                ["c1", "c2", "c3"]
            );
            assert_eq!(serde_json::to_string(outcomes).unwrap(), text);
        }
        let other: CaseOutcomes = serde_json::from_str(r#"{"c1":"passed"}"#).unwrap();
        assert_ne!(other, made);
        assert!(serde_json::from_str::<CaseOutcomes>(r#"{"c1":"great"}"#).is_err());
    }
}
