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
    // One shared name per variant and per case, however many trials name it.
    let variants: Vec<(&String, std::sync::Arc<str>)> =
        variants.iter().map(|v| (v, v.as_str().into())).collect();
    let mut keys = Vec::new();
    for (id, trials) in cases
        .trial_counts()
        .filter(|(id, _)| filters.cases.is_empty() || filters.cases.iter().any(|w| **w == ***id))
    {
        let repetitions = filters.trials.or(trials).unwrap_or(config.trials);
        let case_id = id.clone();
        for (_, variant) in variants
            .iter()
            .filter(|(v, _)| filters.variants.is_empty() || filters.variants.contains(v))
        {
            for trial in 0..repetitions {
                keys.push(TrialKey {
                    variant: variant.clone(),
                    case: case_id.clone(),
                    trial,
                });
            }
        }
    }
    // Held for the whole run, once per trial: no room to spare.
    keys.shrink_to_fit();
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

    #[test]
    fn plans_every_variant_and_repetition_with_filters() {
        let config = EvalConfig::parse(
            r#"{"name": "t", "datasets": ["x"], "client": "command", "trials": 2, "variants": {"a": {}, "b": {}}}"#,
            std::path::Path::new("e.json"),
        )
        .unwrap();
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
}
