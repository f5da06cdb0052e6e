//! Planning: which trials a run needs, and which shard runs each case.

use super::case_ids::{CaseIds, CaseIdsBuilder};
use super::config::EvalConfig;
use super::dataset::Cases;
use crate::eval::trial::TrialKey;
use arcstr::ArcStr;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

/// The shard a case belongs to: the first four bytes of sha256(case id), big-endian, mod `shards`.
/// All of a case's variants and trials go to one shard, so paired comparisons run on one machine.
pub fn shard_of(case_id: &str, shards: u32) -> u32 {
    let digest = Sha256::digest(case_id.as_bytes());
    u32::from_be_bytes([digest[0], digest[1], digest[2], digest[3]]) % shards.max(1)
}

/// What to run, after filters from the command line; `run.json` keeps them so that `--resume`
/// plans the same trials.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Filters {
    /// Only these variants (all when empty).
    pub variants: Vec<String>,
    /// Only these case ids (all when empty).
    pub cases: Vec<String>,
    /// Override every case's trial count.
    pub trials: Option<u32>,
}

/// The most trials one run may plan. Far beyond any eval seen so far (a coordinator holds
/// tens of bytes a trial: hundreds of megabytes here), and well inside the 32-bit positions a plan is indexed by.
pub const MAX_PLANNED_TRIALS: u64 = 10_000_000;

/// The run's [`Plan`]: every trial it needs, in a stable order (case, variant, repetition).
pub fn plan(config: &EvalConfig, cases: &Cases, filters: &Filters) -> anyhow::Result<Plan> {
    let variants: Vec<String> = config.variant_names();
    for wanted in &filters.variants {
        if !variants.contains(wanted) {
            anyhow::bail!(
                "--variant {wanted}: the eval has variants {}",
                variants.join(", ")
            );
        }
    }
    for wanted in &filters.cases {
        if !cases.contains(wanted) {
            anyhow::bail!("--case {wanted}: no case has that id");
        }
    }
    let chosen = |id: &str| filters.cases.is_empty() || filters.cases.iter().any(|w| w == id);
    let variants: Vec<arcstr::ArcStr> = variants
        .iter()
        .filter(|v| filters.variants.is_empty() || filters.variants.contains(v))
        .map(|v| v.as_str().into())
        .collect();
    let repetitions = |trials: Option<u32>| filters.trials.or(trials).unwrap_or(config.trials);
    // Counted before anything is made: a `trials` of four billion is refused by name, not
    // met by the machine running out of memory.
    let mut planned: u64 = 0;
    let mut largest: Option<(&str, Option<u32>)> = None;
    for (id, trials) in cases.trial_counts().filter(|(id, _)| chosen(id)) {
        planned += u64::from(repetitions(trials)) * variants.len() as u64;
        if largest.is_none_or(|(_, most)| repetitions(trials) > repetitions(most)) {
            largest = Some((id, trials));
        }
    }
    if planned > MAX_PLANNED_TRIALS {
        let (id, trials) = largest.expect("a plan of trials has a case");
        let count = repetitions(trials);
        let from = match (filters.trials, trials) {
            (Some(_), _) => "`--trials`".to_string(),
            (None, Some(_)) => format!("case {id:?}'s own `trials`"),
            (None, None) => "the eval's `trials`".to_string(),
        };
        anyhow::bail!(
            "the run would plan {planned} trials, more than the {MAX_PLANNED_TRIALS} one run \
             may hold; the most come from case {id:?}, {count} trials a variant from {from}: \
             lower it, or split the cases across runs (`--case`)"
        );
    }
    let planned = match filters.cases.is_empty() {
        true => {
            let counts = (cases.trial_counts()).map(|(_, trials)| repetitions(trials));
            Plan::of_every_case(variants, cases.ids(), counts.collect())
        }
        false => {
            let chosen = (cases.trial_counts()).filter(|(id, _)| chosen(id));
            Plan::new(
                variants,
                chosen.map(|(id, trials)| (id, repetitions(trials))),
            )
        }
    };
    planned.map_err(|e| anyhow::anyhow!("cannot plan the run: {e}"))
}

/// Every trial a run plans, in the order [`plan`] makes them: case by case (in the datasets'
/// order), each variant, each repetition from 0. Held as its names, each once, and how many
/// repetitions each case has: a trial's [`TrialKey`] is made when it is asked for. A plan of
/// every case of a run shares the cases' ids ([`CaseIds`]) and holds nothing a case (where
/// a list of keys held 24 bytes a trial); one of some of them holds their ids and 8 bytes
/// more. Cases that repeat their variants unequally add 4 bytes a case. `run.json` lists
/// every key ([`Plan`]'s serde form). Clones share one plan.
#[derive(Clone, Default, PartialEq)]
pub struct Plan(Arc<Grid>);

/// A plan's parts: every case has every variant, each repeated as often as its case says.
#[derive(Default, PartialEq)]
struct Grid {
    /// Each case's variants, in order.
    variants: Vec<ArcStr>,
    /// The planned cases' ids, in the plan's order: the run's cases' own when it plans
    /// every one.
    cases: Arc<CaseIds>,
    /// How many times each case repeats each variant.
    repetitions: Repetitions,
    /// Trials in all.
    len: u32,
}

/// How many times each case of a plan repeats each variant.
#[derive(Clone, PartialEq)]
enum Repetitions {
    /// Every case the same count, as a plan without cases' own `trials` has: nothing held
    /// per case.
    Same(u32),
    /// Where each case's trials start, and the plan's length last: four bytes a case.
    Starts(Vec<u32>),
}

impl Default for Repetitions {
    fn default() -> Self {
        Repetitions::Same(0)
    }
}

impl Plan {
    /// The plan of each of `variants` (none named twice) under each of `cases` in turn (with
    /// how many times the case repeats each variant; one with none has no trials and is left
    /// out). Fails when a case or a variant is named twice, or the plan has more trials than
    /// its 32-bit positions can count.
    pub fn new<Id: AsRef<str>>(
        variants: Vec<ArcStr>,
        cases: impl IntoIterator<Item = (Id, u32)>,
    ) -> Result<Self, String> {
        let mut made = GridBuilder::new(variants)?;
        for (case, repetitions) in cases {
            made.case(case.as_ref(), repetitions)?;
        }
        made.finish()
    }

    /// The plan of each of `variants` under every one of `cases` in turn, each case repeating
    /// each variant as often as `repetitions` says (one count a case, in order): the plan
    /// shares the cases' ids. Fails as [`Self::new`] does.
    pub fn of_every_case(
        variants: Vec<ArcStr>,
        cases: &Arc<CaseIds>,
        repetitions: Vec<u32>,
    ) -> Result<Self, String> {
        assert_eq!(cases.len(), repetitions.len(), "a count for each case");
        let variants = GridBuilder::new(variants)?.variants;
        if variants.is_empty() || repetitions.contains(&0) {
            // Cases without trials are left out: not every case is planned.
            return Plan::new(variants, cases.iter().zip(repetitions));
        }
        let each: u64 = repetitions.iter().map(|&count| u64::from(count)).sum();
        let len = each * variants.len() as u64;
        if len > u64::from(u32::MAX) {
            return Err(format!("more than {} trials", u32::MAX));
        }
        if let Some((first, _)) = cases.repeated() {
            return Err(format!("case `{}` is planned twice", cases.get(first)));
        }
        Ok(Grid::plan(variants, cases.clone(), repetitions, len))
    }

    /// This plan, its cases' ids `ids` when they are the same ids in the same order (a
    /// resumed run's plan, read back from `run.json`, and the datasets' cases): one copy of
    /// them held, not two.
    pub fn sharing_ids(self, ids: &Arc<CaseIds>) -> Plan {
        let grid = &*self.0;
        if Arc::ptr_eq(&grid.cases, ids) || *grid.cases != **ids {
            return self;
        }
        Plan(Arc::new(Grid {
            variants: grid.variants.clone(),
            cases: ids.clone(),
            repetitions: grid.repetitions.clone(),
            len: grid.len,
        }))
    }

    /// The plan whose trials are `keys`, which must be in a plan's order (see [`Plan`]):
    /// what a stored list of keys is read back as.
    pub fn from_keys(keys: impl IntoIterator<Item = TrialKey>) -> Result<Self, String> {
        let mut made = KeysReader::default();
        for key in keys {
            made.key(&key.variant, &key.case, key.trial)?;
        }
        made.finish()
    }

    /// How many trials the plan has.
    pub fn len(&self) -> usize {
        self.0.len as usize
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The trial at position `at` (below [`Self::len`]): its variant, case and repetition,
    /// borrowed from the plan.
    pub fn parts(&self, at: usize) -> (&ArcStr, &str, u32) {
        let grid = &*self.0;
        assert!(at < self.len(), "position {at} of a plan of {}", self.len());
        let at = at as u32;
        let case = grid.case_at(at);
        let repetitions = grid.repetitions_of(case);
        let within = at - grid.start_of(case);
        let variant = &grid.variants[(within / repetitions) as usize];
        (variant, grid.cases.get(case), within % repetitions)
    }

    /// The key of the trial at position `at` (below [`Self::len`]), sharing the plan's
    /// variant name (its case id is copied).
    pub fn key(&self, at: usize) -> TrialKey {
        let (variant, case, trial) = self.parts(at);
        TrialKey::new(variant.clone(), case, trial)
    }

    /// The key of the trial at position `at`, if the plan has one there.
    pub fn get(&self, at: usize) -> Option<TrialKey> {
        (at < self.len()).then(|| self.key(at))
    }

    /// The id of the case of the trial at position `at` (below [`Self::len`]).
    pub fn case_of(&self, at: usize) -> &str {
        self.parts(at).1
    }

    /// The keys of the trials at `positions`, which are a case's trials of one variant (a
    /// range [`Self::groups`] or [`Self::trials_of`] gives): they share one copy of its id.
    pub fn keys_in(&self, positions: std::ops::Range<u32>) -> impl Iterator<Item = TrialKey> {
        let first = positions.clone().next().map(|at| self.key(at as usize));
        debug_assert!(first.as_ref().is_none_or(|first| {
            let (variant, case, _) = self.parts(positions.end as usize - 1);
            (variant, case) == (&first.variant, &*first.case)
        }));
        (0..positions.len() as u32).filter_map(move |nth| {
            let first = first.as_ref()?;
            Some(TrialKey::new(
                first.variant.clone(),
                first.case.clone(),
                first.trial + nth,
            ))
        })
    }

    /// Every trial's key, in order: the keys of a case share its id.
    pub fn keys(&self) -> impl Iterator<Item = TrialKey> + '_ {
        let grid = &*self.0;
        (0..grid.cases.len()).flat_map(move |case| {
            let (start, repetitions) = (grid.start_of(case), grid.repetitions_of(case));
            let id = ArcStr::from(grid.cases.get(case));
            (start..start + repetitions * grid.variants.len() as u32).map(move |at| {
                let within = at - start;
                let variant = &grid.variants[(within / repetitions) as usize];
                TrialKey::new(variant.clone(), id.clone(), within % repetitions)
            })
        })
    }

    /// Each case's trials of each variant, in order: the variant, the case, and their
    /// positions (repetitions 0, 1, … in turn).
    pub fn groups(&self) -> impl Iterator<Item = (&ArcStr, &str, std::ops::Range<u32>)> + '_ {
        let grid = &*self.0;
        (0..grid.cases.len()).flat_map(move |case| {
            let id = grid.cases.get(case);
            let (start, repetitions) = (grid.start_of(case), grid.repetitions_of(case));
            grid.variants
                .iter()
                .enumerate()
                .map(move |(variant, name)| {
                    let first = start + variant as u32 * repetitions;
                    (name, id, first..first + repetitions)
                })
        })
    }

    /// Every position, in the order of their trials' keys (variant, case, repetition): the
    /// variants sorted, the cases by id, with nothing held to sort them. The iterator owns
    /// a clone of the plan.
    pub fn positions_by_key(&self) -> PositionsByKey {
        let grid = &*self.0;
        let mut variants: Vec<u32> = (0..grid.variants.len() as u32).collect();
        variants.sort_by_key(|&variant| &grid.variants[variant as usize]);
        PositionsByKey {
            plan: self.clone(),
            variants,
            variant: 0,
            case: 0,
            trial: 0,
        }
    }

    /// The variants every case has, in order.
    pub fn variants(&self) -> &[ArcStr] {
        &self.0.variants
    }

    /// The planned cases' ids, in order.
    pub fn cases(&self) -> impl ExactSizeIterator<Item = &str> + '_ {
        self.0.cases.iter()
    }

    /// The id of the planned case at `case` in [`Self::cases`] (below their count).
    pub fn case(&self, case: usize) -> &str {
        self.0.cases.get(case)
    }

    /// The planned cases, sorted by id: each one's place in [`Self::cases`], and its id.
    pub fn cases_by_id(&self) -> impl ExactSizeIterator<Item = (usize, &str)> + '_ {
        self.0.cases.by_id()
    }

    /// The place in [`Self::cases`] of the case `case`, if the plan has it.
    pub fn case_index(&self, case: &str) -> Option<usize> {
        self.0.cases.find(case)
    }

    /// The position of the trial `key`, if the plan has it.
    pub fn position(&self, key: &TrialKey) -> Option<usize> {
        let trials = self.trials_of(&key.variant, &key.case)?;
        (key.trial < trials.len() as u32).then(|| (trials.start + key.trial) as usize)
    }

    /// The positions of `case`'s trials under `variant` (repetitions 0, 1, … in turn), if
    /// the plan has them.
    pub fn trials_of(&self, variant: &str, case: &str) -> Option<std::ops::Range<u32>> {
        let grid = &*self.0;
        let case = self.case_index(case)?;
        let variant = grid.variants.iter().position(|v| v == variant)? as u32;
        let repetitions = grid.repetitions_of(case);
        let first = grid.start_of(case) + variant * repetitions;
        Some(first..first + repetitions)
    }
}

/// A plan's positions in the order of their trials' keys ([`Plan::positions_by_key`]).
pub struct PositionsByKey {
    plan: Plan,
    /// The plan's variants, sorted by name.
    variants: Vec<u32>,
    /// Where it is: the variant in `variants`, the case among the cases by id, and the
    /// repetition.
    variant: usize,
    case: usize,
    trial: u32,
}

impl Iterator for PositionsByKey {
    type Item = usize;

    fn next(&mut self) -> Option<usize> {
        let grid = &*self.plan.0;
        let variant = *self.variants.get(self.variant)?;
        if self.case >= grid.cases.len() {
            return None;
        }
        let case = grid.cases.by_id_at(self.case);
        let repetitions = grid.repetitions_of(case);
        let at = grid.start_of(case) + variant * repetitions + self.trial;
        // On to the next repetition, case, or variant.
        self.trial += 1;
        if self.trial == repetitions {
            self.trial = 0;
            self.case += 1;
            if self.case == grid.cases.len() {
                self.case = 0;
                self.variant += 1;
            }
        }
        Some(at as usize)
    }
}

impl Grid {
    /// The case (its position in `cases`) of the trial at `at`.
    fn case_at(&self, at: u32) -> usize {
        match &self.repetitions {
            Repetitions::Same(repetitions) => {
                (at / (repetitions * self.variants.len() as u32)) as usize
            }
            Repetitions::Starts(starts) => starts.partition_point(|&start| start <= at) - 1,
        }
    }

    /// Where case `case`'s trials start.
    fn start_of(&self, case: usize) -> u32 {
        match &self.repetitions {
            Repetitions::Same(repetitions) => {
                case as u32 * repetitions * self.variants.len() as u32
            }
            Repetitions::Starts(starts) => starts[case],
        }
    }

    /// How many times case `case` repeats each variant.
    fn repetitions_of(&self, case: usize) -> u32 {
        match &self.repetitions {
            Repetitions::Same(repetitions) => *repetitions,
            Repetitions::Starts(starts) => {
                (starts[case + 1] - starts[case]) / self.variants.len() as u32
            }
        }
    }
}

/// A plan made a case at a time.
struct GridBuilder {
    variants: Vec<ArcStr>,
    cases: CaseIdsBuilder,
    /// Each case's repetitions of each variant.
    repetitions: Vec<u32>,
    len: u64,
}

impl GridBuilder {
    fn new(variants: Vec<ArcStr>) -> Result<Self, String> {
        if let Some(twice) =
            (variants.iter().enumerate()).find(|(at, v)| variants[..*at].contains(v))
        {
            return Err(format!("variant `{}` is planned twice", twice.1));
        }
        Ok(GridBuilder {
            variants,
            cases: CaseIdsBuilder::default(),
            repetitions: Vec::new(),
            len: 0,
        })
    }

    fn case(&mut self, case: &str, repetitions: u32) -> Result<(), String> {
        if repetitions == 0 || self.variants.is_empty() {
            return Ok(());
        }
        self.len += u64::from(repetitions) * self.variants.len() as u64;
        if self.len > u64::from(u32::MAX) {
            return Err(format!("more than {} trials", u32::MAX));
        }
        self.cases.push(case)?;
        self.repetitions.push(repetitions);
        Ok(())
    }

    fn finish(self) -> Result<Plan, String> {
        let cases = self.cases.finish();
        if let Some((first, _)) = cases.repeated() {
            return Err(format!("case `{}` is planned twice", cases.get(first)));
        }
        Ok(Grid::plan(
            self.variants,
            Arc::new(cases),
            self.repetitions,
            self.len,
        ))
    }
}

impl Grid {
    /// The plan of `variants` under each of `cases`, repeated as `repetitions` (one each, none
    /// 0) says: `len` trials in all.
    fn plan(variants: Vec<ArcStr>, cases: Arc<CaseIds>, repetitions: Vec<u32>, len: u64) -> Plan {
        debug_assert_eq!(cases.len(), repetitions.len());
        let repetitions = match repetitions.first() {
            Some(&first) if repetitions.iter().any(|&r| r != first) => {
                let mut starts = Vec::with_capacity(repetitions.len() + 1);
                let mut start = 0;
                for count in repetitions {
                    starts.push(start);
                    start += count * variants.len() as u32;
                }
                starts.push(start);
                Repetitions::Starts(starts)
            }
            first => Repetitions::Same(first.copied().unwrap_or(0)),
        };
        Plan(Arc::new(Grid {
            variants,
            cases,
            repetitions,
            len: len as u32,
        }))
    }
}

/// Reads a plan back from its keys, one at a time, checking they come in a plan's order.
#[derive(Default)]
struct KeysReader {
    /// The first case's variants, as they come; every later case must list the same.
    variants: Vec<ArcStr>,
    /// The cases read, once the first has ended.
    grid: Option<GridBuilder>,
    /// The case being read: its id, the variant it is at, the repetitions seen of that
    /// variant, and of each variant before it.
    current: Option<(String, usize, u32, Option<u32>)>,
}

impl KeysReader {
    fn key(&mut self, variant: &str, case: &str, trial: u32) -> Result<(), String> {
        let out_of_order = || {
            format!(
                "trial {variant}/{case}/{trial} is out of a plan's order (case by case, each \
                 variant in turn, each repetition from 0)"
            )
        };
        let first_case = self.grid.is_none();
        match &mut self.current {
            Some((id, at, seen, each)) if id == case && *self.variants[*at] == *variant => {
                // In turn, and no more of them than the case's earlier variants had.
                if trial != *seen || each.is_some_and(|each| *seen >= each) {
                    return Err(out_of_order());
                }
                *seen = seen.checked_add(1).ok_or_else(out_of_order)?;
            }
            Some((id, at, seen, each)) if id == case => {
                // The next variant of the same case.
                if trial != 0 || each.is_some_and(|each| each != *seen) {
                    return Err(out_of_order());
                }
                *each = Some(*seen);
                *at += 1;
                *seen = 1;
                if first_case
                    && *at == self.variants.len()
                    && !self.variants.iter().any(|v| v == variant)
                {
                    self.variants.push(variant.into());
                } else if self.variants.get(*at).is_none_or(|v| v != variant) {
                    return Err(out_of_order());
                }
            }
            _ => {
                self.close()
                    .map_err(|e| format!("{e} (trial {variant}/{case}/{trial} comes next)"))?;
                if trial != 0 {
                    return Err(out_of_order());
                }
                if self.grid.is_none() {
                    self.variants.push(variant.into());
                } else if *self.variants[0] != *variant {
                    return Err(out_of_order());
                }
                self.current = Some((case.into(), 0, 1, None));
            }
        }
        Ok(())
    }

    /// Ends the case being read, which must have had every variant, each as often.
    fn close(&mut self) -> Result<(), String> {
        let Some((id, at, seen, each)) = self.current.take() else {
            return Ok(());
        };
        if at + 1 != self.variants.len() || each.is_some_and(|each| each != seen) {
            return Err(format!(
                "case `{id}` lacks trials of a plan (every case has every variant, each as \
                 often)"
            ));
        }
        let grid = match &mut self.grid {
            Some(grid) => grid,
            None => self.grid.insert(GridBuilder::new(self.variants.clone())?),
        };
        grid.case(&id, seen)
    }

    fn finish(mut self) -> Result<Plan, String> {
        self.close().map_err(|e| format!("{e} (the list ends)"))?;
        match self.grid {
            Some(grid) => grid.finish(),
            None => GridBuilder::new(self.variants)?.finish(),
        }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let grid = &*self.0;
        write!(
            f,
            "Plan({} trials: {} cases × {:?})",
            grid.len,
            grid.cases.len(),
            grid.variants
        )
    }
}

/// As `run.json` lists a plan: every trial's key, in order.
impl Serialize for Plan {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// A key as [`TrialKey`] serialises, borrowed from the plan.
        #[derive(Serialize)]
        struct Key<'a> {
            variant: &'a str,
            case: &'a str,
            trial: u32,
        }
        use serde::ser::SerializeSeq;
        let mut keys = serializer.serialize_seq(Some(self.len()))?;
        for (variant, case, trials) in self.groups() {
            for trial in 0..trials.len() as u32 {
                keys.serialize_element(&Key {
                    variant,
                    case,
                    trial,
                })?;
            }
        }
        keys.end()
    }
}

/// Reads the list [`Plan`]'s `Serialize` writes, one key at a time: each name is held once,
/// however many keys name it, and a list out of a plan's order is refused by the trial
/// where it goes wrong.
impl<'de> Deserialize<'de> for Plan {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        /// A key's fields as they are read.
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct KeyFields<'a> {
            #[serde(borrow)]
            variant: Cow<'a, str>,
            #[serde(borrow)]
            case: Cow<'a, str>,
            trial: u32,
        }
        struct Keys;
        impl<'de> serde::de::Visitor<'de> for Keys {
            type Value = Plan;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list of trial keys")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Plan, A::Error> {
                let mut plan = KeysReader::default();
                while let Some(key) = seq.next_element::<KeyFields<'_>>()? {
                    plan.key(&key.variant, &key.case, key.trial)
                        .map_err(serde::de::Error::custom)?;
                }
                plan.finish().map_err(serde::de::Error::custom)
            }
        }
        deserializer.deserialize_seq(Keys)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::CaseRecord;

    #[test]
    fn shard_is_the_big_endian_prefix_of_sha256() {
        // sha256("abc") = ba7816bf…: 0xba7816bf = 3128432319.
        assert_eq!(shard_of("abc", u32::MAX), 3_128_432_319);
        assert_eq!(shard_of("abc", 4), 3_128_432_319 % 4);
        assert_eq!(shard_of("anything", 1), 0);
    }

    /// An eval of the `command` client with `more` fields.
    fn eval_config(more: &str) -> EvalConfig {
        let mut json: serde_json::Value =
            serde_json::json!({"name": "t", "datasets": ["x"], "client": "command"});
        let more: serde_json::Value = serde_json::from_str(more).unwrap();
        json.as_object_mut()
            .unwrap()
            .extend(more.as_object().unwrap().clone());
        EvalConfig::parse(&json.to_string(), std::path::Path::new("e.json")).unwrap()
    }

    /// A case with a trial count of its own.
    fn with_trials(id: &str, trials: u32) -> CaseRecord {
        let mut case = CaseRecord::new(id, 1.into());
        case.more_mut().trials = Some(trials);
        case
    }

    fn two_variants_two_trials() -> EvalConfig {
        eval_config(r#"{"trials": 2, "variants": {"a": {}, "b": {}}}"#)
    }

    #[test]
    fn plans_every_variant_and_repetition_with_filters() {
        let config = two_variants_two_trials();
        let cases =
            Cases::from_records([CaseRecord::new("c1", 1.into()), with_trials("c2", 1)]).unwrap();
        assert_eq!(
            plan(&config, &cases, &Filters::default()).unwrap().len(),
            2 * 2 + 2
        );
        let only = Filters {
            variants: vec!["b".into()],
            cases: vec!["c1".into()],
            trials: Some(3),
        };
        let keys = plan(&config, &cases, &only).unwrap();
        assert_eq!(keys.len(), 3);
        assert!(keys.keys().all(|k| &*k.variant == "b" && &*k.case == "c1"));
        assert!(plan(
            &config,
            &cases,
            &Filters {
                variants: vec!["z".into()],
                ..Filters::default()
            }
        )
        .is_err());
    }

    #[test]
    fn a_plan_of_every_case_shares_the_cases_ids_and_equals_one_made_case_by_case() {
        let config = two_variants_two_trials();
        let cases =
            Cases::from_records([CaseRecord::new("c2", 1.into()), with_trials("c1", 3)]).unwrap();
        let every = plan(&config, &cases, &Filters::default()).unwrap();
        assert!(Arc::ptr_eq(&every.0.cases, cases.ids()));
        let variants = vec![ArcStr::from("a"), ArcStr::from("b")];
        let made = Plan::new(variants.clone(), [("c2", 2), ("c1", 3)]).unwrap();
        assert_eq!(every, made);
        assert_eq!(
            every.keys().collect::<Vec<_>>(),
            made.keys().collect::<Vec<_>>()
        );
        // A case with no trials is left out, as case by case.
        let none = Plan::of_every_case(variants.clone(), cases.ids(), vec![0, 1]).unwrap();
        assert_eq!(none, Plan::new(variants.clone(), [("c1", 1)]).unwrap());
        // Named cases: a plan of its own, equal all the same; as one read back from
        // `run.json`, it takes the cases' ids when they are the same.
        let named = Filters {
            cases: vec!["c1".into(), "c2".into()],
            ..Filters::default()
        };
        let chosen = plan(&config, &cases, &named).unwrap();
        assert!(!Arc::ptr_eq(&chosen.0.cases, cases.ids()));
        assert_eq!(chosen, made);
        let shared = chosen.sharing_ids(cases.ids());
        assert!(Arc::ptr_eq(&shared.0.cases, cases.ids()));
        assert_eq!(shared, made);
        let some = Plan::new(variants.clone(), [("c2", 2)]).unwrap();
        let kept = some.clone().sharing_ids(cases.ids());
        assert!(
            Arc::ptr_eq(&kept.0, &some.0),
            "other ids: the plan as it was"
        );
        // A group's keys share one copy of the case's id.
        let (_, case, trials) = made.groups().nth(2).unwrap();
        let keys: Vec<TrialKey> = made.keys_in(trials.clone()).collect();
        assert_eq!(case, "c1");
        assert_eq!(
            keys,
            trials.map(|at| made.key(at as usize)).collect::<Vec<_>>()
        );
        assert!(ArcStr::ptr_eq(&keys[0].case, &keys[2].case));
        assert_eq!(made.keys_in(0..0).count(), 0);
    }

    #[test]
    fn a_plan_too_big_to_hold_is_refused_naming_where_its_trials_come_from() {
        let config = two_variants_two_trials();
        let cases = Cases::from_records([
            with_trials("small", 3),
            with_trials("huge", 4_000_000_000),
            { CaseRecord::new("c", 1.into()) },
        ])
        .unwrap();
        let error = plan(&config, &cases, &Filters::default())
            .unwrap_err()
            .to_string();
        // 2 variants × (3 + 4,000,000,000 + the eval's 2).
        assert!(error.contains("would plan 8000000010 trials"), "{error}");
        assert!(
            error.contains(
                r#"case "huge", 4000000000 trials a variant from case "huge"'s own `trials`"#
            ),
            "{error}"
        );
        // `--trials` for every case: named as the source.
        let cases = Cases::from_records([CaseRecord::new("c1", 1.into())]).unwrap();
        let error = plan(
            &config,
            &cases,
            &Filters {
                trials: Some(6_000_000),
                ..Filters::default()
            },
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("would plan 12000000 trials"), "{error}");
        assert!(error.contains("from `--trials`"), "{error}");
        // The eval's own count, one over the limit.
        let config = eval_config(r#"{"trials": 10000001}"#);
        let error = plan(&config, &cases, &Filters::default())
            .unwrap_err()
            .to_string();
        assert!(error.contains("from the eval's `trials`"), "{error}");
    }
    /// Keys of `(variant, case, trial)`.
    fn keys(list: &[(&str, &str, u32)]) -> Vec<TrialKey> {
        list.iter()
            .map(|&(v, c, t)| TrialKey::new(v, c, t))
            .collect()
    }

    #[test]
    fn a_plan_makes_its_keys_in_order_finds_their_positions_and_lists_them_as_it_reads_them() {
        let variants = vec![ArcStr::from("b"), ArcStr::from("a")];
        // Cases' own counts (the case with none is left out), then one count for every case.
        let each = Plan::new(
            variants.clone(),
            [("c2", 2), ("none", 0), ("c1", 1), ("c3", 2)],
        )
        .unwrap();
        let same = Plan::new(variants, ["c2", "c1"].map(|c| (c, 2))).unwrap();
        let expected_each = keys(&[
            ("b", "c2", 0),
            ("b", "c2", 1),
            ("a", "c2", 0),
            ("a", "c2", 1),
            ("b", "c1", 0),
            ("a", "c1", 0),
            ("b", "c3", 0),
            ("b", "c3", 1),
            ("a", "c3", 0),
            ("a", "c3", 1),
        ]);
        let expected_same = keys(&[
            ("b", "c2", 0),
            ("b", "c2", 1),
            ("a", "c2", 0),
            ("a", "c2", 1),
            ("b", "c1", 0),
            ("b", "c1", 1),
            ("a", "c1", 0),
            ("a", "c1", 1),
        ]);
        for (plan, expected) in [(&each, &expected_each), (&same, &expected_same)] {
            assert_eq!(plan.len(), expected.len());
            assert_eq!(plan.keys().collect::<Vec<_>>(), *expected);
            for (at, key) in expected.iter().enumerate() {
                assert_eq!(plan.key(at), *key);
                assert_eq!(plan.position(key), Some(at), "{key}");
                assert_eq!(plan.case_of(at), &*key.case);
            }
            assert_eq!(plan.get(plan.len()), None);
            for absent in keys(&[
                ("a", "c1", 2),
                ("z", "c1", 0),
                ("a", "none", 0),
                ("a", "c0", 0),
            ]) {
                assert_eq!(plan.position(&absent), None, "{absent}");
            }
            // Positions sorted as their keys sort.
            let mut by_position: Vec<usize> = (0..plan.len()).collect();
            by_position.sort_by_key(|&at| plan.key(at));
            let mut sorted = expected.clone();
            sorted.sort();
            let made: Vec<TrialKey> = by_position.iter().map(|&at| plan.key(at)).collect();
            assert_eq!(made, sorted);
            assert_eq!(plan.positions_by_key().collect::<Vec<_>>(), by_position);
            // Listed as keys are, read back the same from text and from a reader; the keys
            // of a case it makes share its id, and every key its variant's name.
            let text = serde_json::to_string(plan).unwrap();
            assert_eq!(text, serde_json::to_string(expected).unwrap());
            let from_text: Plan = serde_json::from_str(&text).unwrap();
            let from_reader: Plan = serde_json::from_reader(text.as_bytes()).unwrap();
            for read in [from_text, from_reader] {
                assert_eq!(read, *plan);
                let made: Vec<TrialKey> = read.keys().collect();
                assert!(ArcStr::ptr_eq(&made[0].case, &made[3].case));
                assert!(ArcStr::ptr_eq(&read.key(0).variant, &read.key(4).variant));
            }
            assert_eq!(Plan::from_keys(expected.iter().cloned()).unwrap(), *plan);
        }
        let groups: Vec<(String, String, std::ops::Range<u32>)> = (each.groups())
            .map(|(v, c, at)| (v.to_string(), c.to_string(), at))
            .collect();
        assert_eq!(groups[1], ("a".into(), "c2".into(), 2..4));
        assert_eq!(groups[3], ("a".into(), "c1".into(), 5..6));
        assert_eq!(groups.len(), 6);
        // Cases by id, and found by id.
        let by_id: Vec<(usize, &str)> = each.cases_by_id().collect();
        assert_eq!(by_id, [(1, "c1"), (0, "c2"), (2, "c3")]);
        assert_eq!(each.cases().collect::<Vec<_>>(), ["c2", "c1", "c3"]);
        assert_eq!(each.case_index("c3"), Some(2));
        assert_eq!(each.case_index("none"), None);
        let empty: Plan = serde_json::from_str("[]").unwrap();
        assert!(empty.is_empty() && empty.keys().next().is_none());
    }

    #[test]
    fn a_list_of_keys_out_of_a_plans_order_is_refused_naming_where() {
        let key =
            |v: &str, c: &str, t: u32| serde_json::json!({"variant": v, "case": c, "trial": t});
        for (bad, names) in [
            (serde_json::json!([key("a", "c1", 1)]), "a/c1/1"),
            // Repetitions of a variant together.
            (
                serde_json::json!([key("a", "c1", 0), key("b", "c1", 0), key("a", "c1", 1)]),
                "a/c1/1",
            ),
            // Every case has every variant, each as often.
            (
                serde_json::json!([key("a", "c1", 0), key("b", "c1", 0), key("a", "c2", 0)]),
                "case `c2` lacks trials of a plan (every case has every variant, each as often) \
                 (the list ends)",
            ),
            (
                serde_json::json!([
                    key("a", "c1", 0),
                    key("b", "c1", 0),
                    key("a", "c2", 0),
                    key("a", "c3", 0)
                ]),
                "`c2` lacks trials of a plan (every case has every variant, each as often) \
                 (trial a/c3/0 comes next)",
            ),
            (
                serde_json::json!([key("a", "c1", 0), key("b", "c1", 0), key("b", "c1", 1)]),
                "trial b/c1/1 is out of a plan's order",
            ),
            (
                serde_json::json!([key("a", "c1", 0), key("a", "c1", 1), key("b", "c1", 0)]),
                "`c1`",
            ),
            (
                serde_json::json!([key("a", "c1", 0), key("b", "c2", 0)]),
                "b/c2/0",
            ),
            // A case's trials together.
            (
                serde_json::json!([key("a", "c1", 0), key("a", "c2", 0), key("a", "c1", 0)]),
                "`c1` is planned twice",
            ),
            (
                serde_json::json!([key("a", "c1", 0), key("b", "c1", 0), key("a", "c1", 0)]),
                "a/c1/0",
            ),
            (
                serde_json::json!([{"variant": "a", "case": "c1", "trial": 0, "extra": 1}]),
                "extra",
            ),
            (serde_json::json!([{"variant": "a", "trial": 0}]), "case"),
            (serde_json::json!({"variant": "a"}), "a list of trial keys"),
        ] {
            let error = serde_json::from_value::<Plan>(bad.clone())
                .unwrap_err()
                .to_string();
            assert!(error.contains(names), "{bad}: {error}");
        }
        let twice = Plan::new(vec!["a".into(), "a".into()], [("c", 1)]);
        assert!(twice.unwrap_err().contains("variant `a` is planned twice"));
    }
}
