//! Planning: which trials a run needs, and which shard runs each case.

use super::config::EvalConfig;
use super::dataset::Cases;
use crate::eval::trial::TrialKey;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

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

/// The most trials one run may plan. Far beyond any eval seen so far (a coordinator holds about
/// 200 bytes a trial: 2 GB here), and well inside the 32-bit positions a plan is indexed by.
pub const MAX_PLANNED_TRIALS: u64 = 10_000_000;

/// Every trial the run needs, in a stable order: case, variant, repetition.
pub fn plan(
    config: &EvalConfig,
    cases: &Cases,
    filters: &Filters,
) -> anyhow::Result<Vec<TrialKey>> {
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
    let mut largest: Option<(&arcstr::ArcStr, Option<u32>)> = None;
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
    // One shared name per variant and per case, however many trials name it; held for the
    // whole run, once per trial, so made at its size.
    let mut keys = Vec::with_capacity(planned as usize);
    for (id, trials) in cases.trial_counts().filter(|(id, _)| chosen(id)) {
        for variant in &variants {
            for trial in 0..repetitions(trials) {
                keys.push(TrialKey {
                    variant: variant.clone(),
                    case: id.clone(),
                    trial,
                });
            }
        }
    }
    Ok(keys)
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

    fn two_variants_two_trials() -> EvalConfig {
        eval_config(r#"{"trials": 2, "variants": {"a": {}, "b": {}}}"#)
    }

    #[test]
    fn plans_every_variant_and_repetition_with_filters() {
        let config = two_variants_two_trials();
        let cases = Cases::from_records([CaseRecord::new("c1", 1.into()), {
            let mut case = CaseRecord::new("c2", 2.into());
            case.more_mut().trials = Some(1);
            case
        }])
        .unwrap();
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
        assert!(keys.iter().all(|k| &*k.variant == "b" && &*k.case == "c1"));
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
    fn a_plan_too_big_to_hold_is_refused_naming_where_its_trials_come_from() {
        let config = two_variants_two_trials();
        let many = |id: &str, trials| {
            let mut case = CaseRecord::new(id, 1.into());
            case.more_mut().trials = Some(trials);
            case
        };
        let cases = Cases::from_records([many("small", 3), many("huge", 4_000_000_000), {
            CaseRecord::new("c", 1.into())
        }])
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
}
