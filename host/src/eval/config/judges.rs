//! `judges`, `pairwise` and `casePass`: how trials are graded, how two variants are compared
//! case by case, and how a case's trials make their verdict.

use super::EvalConfig;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A judge: a plugin grader or a built-in assertion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// A name for reports; defaults to the plugin or assertion name.
    #[serde(default)]
    pub name: Option<String>,
    /// An installed grader name, or a key of `plugins`.
    #[serde(default)]
    pub plugin: Option<String>,
    /// A built-in assertion: `contains`, `not-contains`, `equals`, `regex`, `exit-code`, or one on
    /// tool calls (`tools-called`, `tool-call-count`, `no-tool-errors`, `tool-not-called`).
    #[serde(default)]
    pub assert: Option<String>,
    /// The assertion's value, or the plugin's options.
    #[serde(default)]
    pub value: Option<Value>,
    #[serde(default)]
    pub options: Option<Value>,
    /// Weight in the trial's score (default 1).
    #[serde(default)]
    pub weight: Option<f64>,
}

/// A pairwise judge: a pairwise-grader plugin comparing two variants' traces of each case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairwiseConfig {
    /// A name for reports; defaults to `<a>-vs-<b>`.
    #[serde(default)]
    pub name: Option<String>,
    /// An installed pairwise grader's name, or a key of `plugins`.
    pub plugin: String,
    /// The two variants compared, `[a, b]`; wins are counted for `a`. Left out, the entry
    /// compares `baseline` with each other variant.
    #[serde(default)]
    pub variants: Vec<String>,
    /// The plugin's options.
    #[serde(default)]
    pub options: Option<Value>,
}

impl PairwiseConfig {
    /// The name reports use: `name`, or `<a>-vs-<b>`.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.variants.join("-vs-"))
    }
}

/// `casePass`: `{"rule": "majority"}` or `{"share": S}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CasePassConfig {
    /// `majority` (the only named rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The share of a case's trials, from 0 to 1, that must pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
}

/// How a case's trials make its verdict, once each trial is graded. Written as its
/// `casePass` entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "CasePassConfig", try_from = "CasePassConfig")]
pub enum CaseRule {
    /// More than half of the trials pass (a tie fails).
    #[default]
    Majority,
    /// At least this share of the trials pass.
    Share(f64),
}

impl From<CaseRule> for CasePassConfig {
    fn from(rule: CaseRule) -> Self {
        match rule {
            CaseRule::Majority => CasePassConfig {
                rule: Some("majority".into()),
                share: None,
            },
            CaseRule::Share(share) => CasePassConfig {
                rule: None,
                share: Some(share),
            },
        }
    }
}

impl TryFrom<CasePassConfig> for CaseRule {
    type Error = anyhow::Error;
    fn try_from(entry: CasePassConfig) -> Result<Self> {
        entry.rule()
    }
}

impl CasePassConfig {
    /// The rule this entry names; errors name the `casePass` field at fault.
    pub fn rule(&self) -> Result<CaseRule> {
        match (self.rule.as_deref(), self.share) {
            (Some("majority"), None) => Ok(CaseRule::Majority),
            (None | Some("share"), Some(share)) if (0.0..=1.0).contains(&share) => {
                Ok(CaseRule::Share(share))
            }
            (None | Some("share"), Some(share)) => {
                let hint = if (2.0..=100.0).contains(&share) {
                    format!(" (for {share}% write {})", share / 100.0)
                } else {
                    String::new()
                };
                bail!(
                    "`casePass.share` must be between 0 and 1 (the share of a case's trials that must pass), not {share}{hint}"
                )
            }
            (Some(other), None) => bail!(
                "`casePass.rule` is {other:?}; write `{{\"rule\": \"majority\"}}` or `{{\"share\": S}}`"
            ),
            (Some(other), Some(_)) => bail!(
                "`casePass` has both `rule` ({other:?}) and `share`; write `{{\"rule\": \"majority\"}}` or `{{\"share\": S}}`"
            ),
            (None, None) => bail!(
                "`casePass` is empty; write `{{\"rule\": \"majority\"}}` or `{{\"share\": S}}`"
            ),
        }
    }
}

impl EvalConfig {
    /// Checks `baseline` and turns each pairwise entry without `variants` into one judge per
    /// other variant, `[baseline, other]`, named `name-other` when `name` is given and there
    /// are several.
    pub(super) fn expand_pairwise(&mut self) -> Result<()> {
        let variants = self.variant_names();
        if let Some(baseline) = &self.baseline {
            if !variants.contains(baseline) {
                bail!(
                    "`baseline` names `{baseline}`, which is not a variant; the variants are {}",
                    variants.join(", ")
                );
            }
        }
        let mut expanded = Vec::new();
        for (index, pair) in std::mem::take(&mut self.pairwise).into_iter().enumerate() {
            if !pair.variants.is_empty() {
                expanded.push(pair);
                continue;
            }
            let Some(baseline) = &self.baseline else {
                bail!(
                    "pairwise[{index}] names no `variants`: give two, `[a, b]`, or set `baseline` \
                     to compare it with each other variant"
                );
            };
            let others: Vec<&String> = variants.iter().filter(|v| *v != baseline).collect();
            if others.is_empty() {
                bail!("pairwise[{index}]: `baseline` `{baseline}` is the only variant; there is nothing to compare it with");
            }
            let several = others.len() > 1;
            for other in others {
                expanded.push(PairwiseConfig {
                    name: pair.name.as_ref().map(|n| {
                        if several {
                            format!("{n}-{other}")
                        } else {
                            n.clone()
                        }
                    }),
                    variants: vec![baseline.clone(), other.clone()],
                    ..pair.clone()
                });
            }
        }
        self.pairwise = expanded;
        Ok(())
    }

    /// Each pairwise judge names two different configured variants, under a name no other
    /// pairwise judge has.
    pub(super) fn validate_pairwise(&self) -> Result<()> {
        let variants = self.variant_names();
        let mut names = std::collections::BTreeSet::new();
        for (index, pair) in self.pairwise.iter().enumerate() {
            let place = format!("pairwise[{index}]");
            let [a, b] = pair.variants.as_slice() else {
                bail!(
                    "{place}.variants must name exactly two variants, `[a, b]`, not {}",
                    pair.variants.len()
                );
            };
            if let Some(unknown) = [a, b].into_iter().find(|v| !variants.contains(v)) {
                bail!(
                    "{place}.variants names `{unknown}`, which is not a variant; the variants are \
                     {}",
                    variants.join(", ")
                );
            }
            if a == b {
                bail!("{place}.variants names `{a}` twice; compare two different variants");
            }
            let name = pair.display_name();
            if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                bail!("{place}.name {name:?} cannot be used in a file name");
            }
            if !names.insert(name.clone()) {
                bail!(
                    "{place}: another pairwise judge is already called `{name}`; give it a `name`"
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::MINIMAL;
    use super::*;
    use std::path::Path;

    #[test]
    fn pairwise_judges_name_two_different_variants() {
        let error = |pairwise: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command",
                    "variants": {{"a": {{}}, "b": {{}}}}, "pairwise": [{pairwise}]}}"#
            );
            EvalConfig::parse(&text, Path::new("e.json"))
                .err()
                .map(|e| format!("{e:#}"))
        };
        let ok = r#"{"plugin": "p", "variants": ["a", "b"]}"#;
        assert_eq!(error(ok), None);
        for (pairwise, says) in [
            (
                r#"{"plugin": "p", "variants": ["a", "c"]}"#,
                "pairwise[0].variants names `c`, which is not a variant; the variants are a, b",
            ),
            (
                r#"{"plugin": "p", "variants": ["a", "a"]}"#,
                "pairwise[0].variants names `a` twice",
            ),
            (
                r#"{"plugin": "p", "variants": ["a"]}"#,
                "pairwise[0].variants must name exactly two variants",
            ),
            (
                &format!("{ok}, {ok}"),
                "pairwise[1]: another pairwise judge is already called `a-vs-b`",
            ),
            (r#"{"variants": ["a", "b"]}"#, "missing field `plugin`"),
            (
                r#"{"plugin": "p"}"#,
                "pairwise[0] names no `variants`: give two, `[a, b]`, or set `baseline`",
            ),
        ] {
            let got = error(pairwise).unwrap_or_default();
            assert!(got.contains(says), "{pairwise}: {got}");
        }
    }

    #[test]
    fn a_baseline_names_a_variant_and_pairs_it_with_each_other_one() {
        let parse = |extra: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command",
                    "variants": {{"base": {{}}, "b": {{}}, "c": {{}}}}{extra}}}"#
            );
            EvalConfig::parse(&text, Path::new("e.json")).map_err(|e| format!("{e:#}"))
        };
        let err = parse(r#", "baseline": "nope""#).unwrap_err();
        assert!(
            err.contains(
                "`baseline` names `nope`, which is not a variant; the variants are b, base, c"
            ),
            "{err}"
        );
        let config = parse(
            r#", "baseline": "base", "pairwise": [{"plugin": "p", "name": "judge"},
                {"plugin": "q", "variants": ["c", "b"]}]"#,
        )
        .unwrap();
        let pairs: Vec<(String, Vec<String>)> = config
            .pairwise
            .iter()
            .map(|p| (p.display_name(), p.variants.clone()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "judge-b".to_string(),
                    vec!["base".to_string(), "b".to_string()]
                ),
                (
                    "judge-c".to_string(),
                    vec!["base".to_string(), "c".to_string()]
                ),
                ("c-vs-b".to_string(), vec!["c".to_string(), "b".to_string()]),
            ]
        );
        let config = parse(r#", "baseline": "c", "pairwise": [{"plugin": "p"}]"#).unwrap();
        let names: Vec<String> = config.pairwise.iter().map(|p| p.display_name()).collect();
        assert_eq!(names, ["c-vs-b", "c-vs-base"]);
    }

    #[test]
    fn case_pass_is_majority_or_a_share() {
        let parse = |case_pass: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command", "casePass": {case_pass}}}"#
            );
            EvalConfig::parse(&text, Path::new("e.json")).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(
            EvalConfig::parse(MINIMAL, Path::new("e.json"))
                .unwrap()
                .case_rule(),
            CaseRule::Majority
        );
        assert_eq!(
            parse(r#"{"rule": "majority"}"#).unwrap().case_rule(),
            CaseRule::Majority
        );
        assert_eq!(
            parse(r#"{"share": 0.67}"#).unwrap().case_rule(),
            CaseRule::Share(0.67)
        );
        for (case_pass, says) in [
            (
                r#"{"share": -0.5}"#,
                "`casePass.share` must be between 0 and 1",
            ),
            (r#"{"share": 1.5}"#, "must pass), not 1.5"),
            (r#"{"share": 67}"#, "not 67 (for 67% write 0.67)"),
            (r#"{"rule": "all"}"#, "`casePass.rule` is \"all\""),
            (r#"{"rule": "majority", "share": 0.5}"#, "has both `rule`"),
            ("{}", "`casePass` is empty"),
            (r#"{"shares": 0.5}"#, "unknown field `shares`"),
        ] {
            let got = parse(case_pass).unwrap_err();
            assert!(got.contains(says), "{case_pass}: {got}");
        }
    }
}
