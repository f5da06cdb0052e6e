//! Grading in the coordinator: plugin graders and built-in assertions score each collected
//! trace; a trial passes by threshold, a case by its `casePass` rule (a majority, or a share)
//! over its repetitions. A grade shard's machine runs the plugin judges of stored trials for
//! the coordinator ([`remote`]).
//!
//! Four outcomes stay apart everywhere: a trial that failed its judges (`failed`), one whose
//! judge broke (`not-graded`), one whose machine or client broke (`infra`), and one that never
//! came back (`missing`).

mod grades;
pub mod pairwise;
pub mod remote;
pub(crate) mod slots;
pub mod tools;

pub use crate::eval::config::CaseRule;
use crate::eval::config::EvalConfig;
use crate::eval::config::JudgeConfig;
use crate::eval::trial::{CaseRecord, TrialKey};
use crate::eval::trial::{TrialRecord, TrialStatus};
use crate::llm::ModelAccess;
use crate::plugin::set::PluginSet;
use crate::plugin::{Kind, LoadedPlugin};
use anyhow::{bail, Context, Result};
pub use grades::Grades;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;

/// A built-in assertion.
#[derive(Debug, Clone)]
pub enum Assertion {
    /// The final answer contains the text.
    Contains(String),
    /// The final answer does not contain the text.
    NotContains(String),
    /// The final answer, trimmed, equals the text.
    Equals(String),
    /// The final answer matches the regex.
    Regex(regex::Regex),
    /// The program exited with this code.
    ExitCode(i32),
    /// An assertion on the trace's tool calls.
    Tools(tools::ToolAssertion),
    /// The check inside the machine of this name ran and passed (exit code 0).
    CheckPassed(String),
    /// The reward the check of this name left (`$MST_CHECK_REWARD`), as the score; the pass
    /// threshold decides.
    CheckScore(String),
}

impl Assertion {
    /// Checks `record`: whether it passes, and why.
    fn check(&self, record: &TrialRecord) -> (bool, String) {
        let answer = record.trace.final_text.as_deref().unwrap_or("");
        let (ok, reason) = match self {
            Assertion::Contains(text) => {
                (answer.contains(text.as_str()), format!("contains {text:?}"))
            }
            Assertion::NotContains(text) => (
                !answer.contains(text.as_str()),
                format!("does not contain {text:?}"),
            ),
            Assertion::Equals(text) => (answer.trim() == text.trim(), format!("equals {text:?}")),
            Assertion::Regex(re) => (re.is_match(answer), format!("matches /{re}/")),
            Assertion::ExitCode(code) => (
                record.trace.exit_code == Some(*code),
                format!("exit code {code}"),
            ),
            // Its reasons say both what was expected and what happened.
            Assertion::Tools(assertion) => return assertion.check(&record.trace),
            Assertion::CheckPassed(name) => return check_passed(record, name),
            Assertion::CheckScore(name) => {
                let (value, reason) = check_score(record, name);
                return (value >= 1.0, reason);
            }
        };
        if ok {
            (ok, reason)
        } else {
            (ok, format!("expected: {reason}"))
        }
    }
}

/// `check-passed`: whether check `name` ran in the machine and passed, and what it did.
fn check_passed(record: &TrialRecord, name: &str) -> (bool, String) {
    let Some(outcome) = record.trace.check_outcome(name) else {
        return (
            false,
            format!("expected: check `{name}` passed; no check `{name}` ran on this trial"),
        );
    };
    if outcome["passed"] == true {
        return (true, format!("check `{name}` passed"));
    }
    let how = match (outcome["timedOut"] == true, outcome["exitCode"].as_i64()) {
        (true, _) => "timed out".to_string(),
        (false, Some(code)) => format!("exited with {code}"),
        (false, None) => "was ended by a signal".to_string(),
    };
    // The last line it printed, usually the test runner's summary.
    let last = [&outcome["stdout"], &outcome["stderr"]]
        .into_iter()
        .filter_map(|text| text.as_str())
        .flat_map(|text| text.lines().rev().find(|l| !l.trim().is_empty()))
        .next()
        .map(|line| format!(": {}", line.trim()))
        .unwrap_or_default();
    (
        false,
        format!("expected: check `{name}` passed; it {how}{last}"),
    )
}

/// `check-score`: the reward check `name` left, or, when it left none, 1 if it passed and 0 if
/// not; 0 when it did not run or its reward was no number in [0, 1]. With why.
fn check_score(record: &TrialRecord, name: &str) -> (f64, String) {
    let Some(outcome) = record.trace.check_outcome(name) else {
        return (0.0, format!("no check `{name}` ran on this trial"));
    };
    if let Some(reward) = outcome["reward"].as_f64() {
        return (reward, format!("check `{name}` left reward {reward}"));
    }
    if let Some(why) = outcome["rewardError"].as_str() {
        return (0.0, format!("check `{name}`: {why}"));
    }
    let passed = outcome["passed"] == true;
    let said = if passed { "passed" } else { "failed" };
    (
        f64::from(u8::from(passed)),
        format!("check `{name}` left no reward and {said}"),
    )
}

/// How a judge scores.
#[derive(Clone)]
pub enum JudgeKind {
    Plugin {
        plugin: Arc<LoadedPlugin>,
        options: String,
    },
    Assert(Assertion),
}

/// One configured judge.
#[derive(Clone)]
pub struct Judge {
    /// Shared with every score the judge gives.
    pub name: Arc<str>,
    pub weight: f64,
    pub kind: JudgeKind,
}

/// One judge's verdict on one trial.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeScore {
    /// The judge's name, shared by all its scores (a run of 100,000 trials holds it once).
    pub judge: Arc<str>,
    pub value: f64,
    pub pass: bool,
    pub reason: String,
}

/// Each judge's score of one trial. Most evals have one judge: its score is held in place,
/// not in an allocation of its own (a run of 100,000 trials holds 100,000 of these).
pub type JudgeScores = smallvec::SmallVec<[JudgeScore; 1]>;

/// A trial's grade.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "kebab-case", try_from = "GradeFields")]
pub enum TrialGrade {
    /// Every judge scored it.
    Graded {
        score: f64,
        pass: bool,
        judges: JudgeScores,
    },
    /// A judge could not score it; neither a pass nor a fail.
    NotGraded { judge: String, error: String },
    /// The client or machine failed; nothing to grade.
    Infra { reason: String },
}

/// A grade as read: every variant's fields, the `outcome` saying which apply. An internally
/// tagged enum is read by buffering each grade into a tree first, whatever the order of its
/// fields; this reads them straight, which halves what reading a grade costs (every grade of
/// a run is read back several times as its results are written).
#[derive(Deserialize)]
struct GradeFields {
    outcome: GradeOutcome,
    score: Option<f64>,
    pass: Option<bool>,
    judges: Option<JudgeScores>,
    judge: Option<String>,
    error: Option<String>,
    reason: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "kebab-case")]
enum GradeOutcome {
    Graded,
    NotGraded,
    Infra,
}

impl TryFrom<GradeFields> for TrialGrade {
    type Error = String;

    fn try_from(fields: GradeFields) -> std::result::Result<Self, String> {
        fn field<T>(value: Option<T>, name: &str, outcome: &str) -> std::result::Result<T, String> {
            value.ok_or_else(|| format!("missing field `{name}` of a `{outcome}` grade"))
        }
        Ok(match fields.outcome {
            GradeOutcome::Graded => TrialGrade::Graded {
                score: field(fields.score, "score", "graded")?,
                pass: field(fields.pass, "pass", "graded")?,
                judges: field(fields.judges, "judges", "graded")?,
            },
            GradeOutcome::NotGraded => TrialGrade::NotGraded {
                judge: field(fields.judge, "judge", "not-graded")?,
                error: field(fields.error, "error", "not-graded")?,
            },
            GradeOutcome::Infra => TrialGrade::Infra {
                reason: field(fields.reason, "reason", "infra")?,
            },
        })
    }
}

impl TrialGrade {
    /// Each judge's score, when every judge scored the trial (none otherwise).
    pub fn scores(&self) -> &[JudgeScore] {
        match self {
            TrialGrade::Graded { judges, .. } => judges,
            _ => &[],
        }
    }
}

fn text_value(judge: &JudgeConfig, what: &str) -> Result<String> {
    match &judge.value {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(other) => Ok(other.to_string()),
        None => bail!("the `{what}` assertion needs a `value`"),
    }
}

impl Judge {
    /// Builds a judge from its config.
    pub fn from_config(config: &JudgeConfig, plugins: &PluginSet) -> Result<Self> {
        let weight = config.weight.unwrap_or(1.0);
        if !(weight.is_finite() && weight >= 0.0) {
            bail!("a judge's `weight` must be a number ≥ 0");
        }
        if let Some(name) = &config.plugin {
            let plugin = plugins.get(name, Kind::Grader)?;
            let options = config
                .options
                .clone()
                .unwrap_or(serde_json::json!({}))
                .to_string();
            return Ok(Judge {
                name: config.name.as_deref().unwrap_or(name).into(),
                weight,
                kind: JudgeKind::Plugin { plugin, options },
            });
        }
        let assert = config
            .assert
            .as_deref()
            .context("a judge needs `plugin` or `assert`")?;
        let assertion = match assert {
            "contains" => Assertion::Contains(text_value(config, assert)?),
            "not-contains" => Assertion::NotContains(text_value(config, assert)?),
            "equals" => Assertion::Equals(text_value(config, assert)?),
            "regex" => Assertion::Regex(
                regex::Regex::new(&text_value(config, assert)?).context("the `regex` assertion's `value` is not a valid regex")?,
            ),
            "exit-code" => Assertion::ExitCode(
                config.value.as_ref().and_then(|v| v.as_i64()).context("the `exit-code` assertion needs an integer `value`")? as i32,
            ),
            "check-passed" => Assertion::CheckPassed(text_value(config, assert)?),
            "check-score" => Assertion::CheckScore(text_value(config, assert)?),
            name if tools::NAMES.contains(&name) => {
                Assertion::Tools(tools::ToolAssertion::parse(name, config.value.as_ref())?)
            }
            other => bail!(
                "unknown assertion `{other}`; the assertions are contains, not-contains, equals, regex, exit-code, check-passed, check-score, {}",
                tools::NAMES.join(", ")
            ),
        };
        Ok(Judge {
            name: config.name.as_deref().unwrap_or(assert).into(),
            weight,
            kind: JudgeKind::Assert(assertion),
        })
    }

    /// The judge's call on `record`: its value, its own pass or fail when it gives one (an
    /// assertion always does; a plugin may leave it to the threshold), and why; or why it
    /// could not score the trial. A plugin's model calls go through `models` when given (a
    /// grade machine's gateway), else as its grants say.
    pub fn call(
        &self,
        record: &TrialRecord,
        models: Option<&Arc<ModelAccess>>,
    ) -> Result<JudgeCall, String> {
        let (value, pass, reason) = match &self.kind {
            JudgeKind::Plugin { plugin, options } => {
                let score = plugin
                    .grade_with(options, &record.to_wit(), models)
                    .map_err(|e| e.to_string())?;
                (score.value, score.pass, score.reason)
            }
            JudgeKind::Assert(assertion) => return Ok(self.assertion_call(assertion, record)),
        };
        Ok(JudgeCall {
            judge: self.name.to_string(),
            value,
            pass,
            reason,
        })
    }

    /// This judge's call as `assertion` on `record`: it always scores, 1 or 0 (a pass or a
    /// fail), or the reward of a check (`check-score`, left to the pass threshold).
    fn assertion_call(&self, assertion: &Assertion, record: &TrialRecord) -> JudgeCall {
        if let Assertion::CheckScore(name) = assertion {
            let (value, reason) = check_score(record, name);
            return JudgeCall {
                judge: self.name.to_string(),
                value,
                pass: None,
                reason,
            };
        }
        let (ok, reason) = assertion.check(record);
        JudgeCall {
            judge: self.name.to_string(),
            value: if ok { 1.0 } else { 0.0 },
            pass: Some(ok),
            reason,
        }
    }

    /// The plugin this judge calls, if it is a plugin judge.
    pub fn plugin(&self) -> Option<&Arc<LoadedPlugin>> {
        match &self.kind {
            JudgeKind::Plugin { plugin, .. } => Some(plugin),
            JudgeKind::Assert(_) => None,
        }
    }
}

/// One judge's call on one trial, before the verdict: what the judges say wherever they run
/// (in the coordinator, or on a machine by `mst grade --runner`, whose answer this is).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeCall {
    /// The judge's name.
    pub judge: String,
    /// 0..1.
    pub value: f64,
    /// The judge's own pass or fail; `None` leaves it to the pass threshold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pass: Option<bool>,
    /// Why, in the judge's words.
    pub reason: String,
}

/// What a trial's judges said: each one's call in order, or the first that could not score it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub enum JudgeCalls {
    /// Every judge's call, in the judges' order.
    Scores(Vec<JudgeCall>),
    /// The first judge that could not score the trial, and why.
    NotGraded {
        /// Its name.
        judge: String,
        /// Its error.
        error: String,
    },
}

/// Calls each of `judges` on `record`, in order, stopping at the first that cannot score it;
/// plugins call models through `models` when given ([`Judge::call`]).
pub fn call_judges(
    judges: &[Judge],
    record: &TrialRecord,
    models: Option<&Arc<ModelAccess>>,
) -> JudgeCalls {
    let mut calls = Vec::with_capacity(judges.len());
    for judge in judges {
        match judge.call(record, models) {
            Ok(call) => calls.push(call),
            Err(error) => {
                return JudgeCalls::NotGraded {
                    judge: judge.name.to_string(),
                    error,
                }
            }
        }
    }
    JudgeCalls::Scores(calls)
}

/// The verdict on a trial from its `judges`' `calls` (one per judge, in order): each judge's
/// pass (its own, or its value against `threshold`), the weighted score, and the trial's pass.
/// Only the coordinator decides it, wherever the judges ran.
pub fn verdict(judges: &[Judge], calls: JudgeCalls, threshold: f64) -> TrialGrade {
    let calls = match calls {
        JudgeCalls::Scores(calls) => calls,
        JudgeCalls::NotGraded { judge, error } => return TrialGrade::NotGraded { judge, error },
    };
    let scores: JudgeScores = judges
        .iter()
        .zip(calls)
        .map(|(judge, call)| JudgeScore {
            judge: judge.name.clone(),
            value: call.value,
            pass: call.pass.unwrap_or(call.value >= threshold),
            reason: call.reason,
        })
        .collect();
    let total_weight: f64 = judges.iter().map(|j| j.weight).sum();
    let score = if total_weight > 0.0 {
        judges
            .iter()
            .zip(&scores)
            .map(|(j, s)| j.weight * s.value)
            .sum::<f64>()
            / total_weight
    } else {
        1.0
    };
    let pass = scores.iter().all(|s| s.pass) && score >= threshold - 1e-9;
    TrialGrade::Graded {
        score,
        pass,
        judges: scores,
    }
}

/// Room for the note [`crate::plugin::bounds::cut`] adds to a text it cuts.
const CUT_NOTE: usize = 64;

/// The most of a machine's text an error about it quotes.
const QUOTED: usize = 200;

/// Checks the `calls` a machine returned for a trial's plugin judges `judges`: one call per
/// judge, in order and by name, each value in 0..1 and each reason within the cap a plugin's
/// is held to; or a `not-graded` answer naming one of them, its error within its cap. The
/// machine is trusted for the scores only: anything else is refused, with why.
pub fn check_calls(judges: &[&Judge], calls: &JudgeCalls) -> Result<(), String> {
    use crate::plugin::bounds::{cut, MAX_ERROR, MAX_REASON};
    let quoted = |name: &str| format!("{:?}", cut(name.to_string(), QUOTED));
    match calls {
        JudgeCalls::NotGraded { judge, error } => {
            if !judges.iter().any(|j| *j.name == **judge) {
                return Err(format!(
                    "it names judge {}, which this trial does not have on a machine",
                    quoted(judge)
                ));
            }
            if error.len() > MAX_ERROR + CUT_NOTE {
                return Err(format!(
                    "judge `{judge}`'s error is {} bytes, over the {MAX_ERROR}-byte cap",
                    error.len()
                ));
            }
        }
        JudgeCalls::Scores(calls) => {
            if calls.len() != judges.len() {
                return Err(format!(
                    "it holds {} score(s) for the trial's {} judge(s)",
                    calls.len(),
                    judges.len()
                ));
            }
            for (judge, call) in judges.iter().zip(calls) {
                if *judge.name != *call.judge {
                    return Err(format!(
                        "it holds a score of judge {} where judge `{}` was expected",
                        quoted(&call.judge),
                        judge.name
                    ));
                }
                if !(0.0..=1.0).contains(&call.value) {
                    return Err(format!(
                        "judge `{}`'s score {} is outside 0..1",
                        judge.name, call.value
                    ));
                }
                if call.reason.len() > MAX_REASON + CUT_NOTE {
                    return Err(format!(
                        "judge `{}`'s reason is {} bytes, over the {MAX_REASON}-byte cap",
                        judge.name,
                        call.reason.len()
                    ));
                }
            }
        }
    }
    Ok(())
}

/// The judges `configs` make with `plugins`; an error names the judge and `place`, where
/// they are configured (`variants.NAME.`, `case `ID`: `).
pub fn judges_of(configs: &[JudgeConfig], place: &str, plugins: &PluginSet) -> Result<Vec<Judge>> {
    configs
        .iter()
        .enumerate()
        .map(|(index, judge)| {
            Judge::from_config(judge, plugins).with_context(|| {
                let name = judge
                    .name
                    .as_deref()
                    .or(judge.plugin.as_deref())
                    .or(judge.assert.as_deref())
                    .unwrap_or("?");
                format!("{place}judges[{index}] (`{name}`)")
            })
        })
        .collect()
}

/// Which judges apply to which trial, at what pass threshold, and by which rule a case's trials
/// make its verdict: a case's own `judges`, `passThreshold` and `casePass` win over its
/// variant's judges and the config's threshold and rule. Built while the
/// config is checked, so a judge that names a missing plugin, or one of another kind, stops the
/// run before any machine starts.
pub struct JudgeSet {
    by_variant: BTreeMap<String, Vec<Judge>>,
    by_case: BTreeMap<String, Vec<Judge>>,
    thresholds: BTreeMap<String, f64>,
    threshold: f64,
    case_pass: CaseRules,
}

/// How each case's trials make its verdict: the eval's `casePass` rule, and the cases that
/// set their own. Recorded in `summary.json` as `casePass`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CaseRules {
    /// The eval's rule.
    pub default: CaseRule,
    /// Cases with a rule of their own, by id.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub cases: BTreeMap<String, CaseRule>,
}

impl CaseRules {
    /// The rule of case `case`.
    pub fn of(&self, case: &str) -> CaseRule {
        self.cases.get(case).copied().unwrap_or(self.default)
    }
}

impl JudgeSet {
    /// The judges of `config` and of `cases`, built against `plugins`. Errors name the judge
    /// and where it is configured.
    pub fn build(
        config: &EvalConfig,
        cases: impl IntoIterator<Item = Result<CaseRecord>>,
        plugins: &PluginSet,
    ) -> Result<Self> {
        let build = |configs: &[JudgeConfig], place: &str| judges_of(configs, place, plugins);
        let mut by_variant = BTreeMap::new();
        for name in config.variant_names() {
            let place = match config.variants.get(&name).and_then(|v| v.judges.as_ref()) {
                Some(_) => format!("variants.{name}."),
                None => String::new(),
            };
            let judges = build(config.variant_judges(&name), &place)?;
            by_variant.insert(name, judges);
        }
        let mut by_case = BTreeMap::new();
        let mut thresholds = BTreeMap::new();
        let mut rules = BTreeMap::new();
        for case in cases {
            let case = case?;
            if let Some(configs) = &case.more().judges {
                by_case.insert(
                    case.id.to_string(),
                    build(configs, &format!("case `{}`: ", case.id))?,
                );
            }
            if let Some(threshold) = case.more().pass_threshold {
                thresholds.insert(case.id.to_string(), threshold);
            }
            if let Some(case_pass) = &case.more().case_pass {
                let rule = case_pass
                    .rule()
                    .with_context(|| format!("case `{}`", case.id))?;
                rules.insert(case.id.to_string(), rule);
            }
        }
        Ok(JudgeSet {
            by_variant,
            by_case,
            thresholds,
            threshold: config.pass_threshold,
            case_pass: CaseRules {
                default: config.case_rule(),
                cases: rules,
            },
        })
    }

    /// The rules by which cases' trials make their verdicts.
    pub fn case_rules(&self) -> &CaseRules {
        &self.case_pass
    }

    /// The judges that grade trial `key`.
    pub fn judges_for(&self, key: &TrialKey) -> &[Judge] {
        self.by_case
            .get(&*key.case)
            .or_else(|| self.by_variant.get(&*key.variant))
            .map(Vec::as_slice)
            .unwrap_or(&[])
    }

    /// The pass threshold of trial `key`.
    pub fn threshold(&self, key: &TrialKey) -> f64 {
        self.thresholds
            .get(&*key.case)
            .copied()
            .unwrap_or(self.threshold)
    }

    /// Grades trial `key` from its stored trace.
    pub fn grade(&self, key: &TrialKey, record: &TrialRecord) -> TrialGrade {
        grade_trial(self.judges_for(key), record, self.threshold(key))
    }

    /// The plugin judges of trial `key`, in order: what a grade shard runs for it.
    pub fn plugin_judges(&self, key: &TrialKey) -> Vec<&Judge> {
        let judges = self.judges_for(key).iter();
        judges.filter(|judge| judge.plugin().is_some()).collect()
    }

    /// Whether grading trial `key` (stored as `record`) on a machine calls any judge there:
    /// not for an infra trial, nor for one without plugin judges (its assertions are graded
    /// where its trace is, and a trial without judges by its trace alone).
    pub fn needs_machine(&self, key: &TrialKey, record: &TrialRecord) -> bool {
        record.trace.status != TrialStatus::Infra && !self.plugin_judges(key).is_empty()
    }

    /// The calls of trial `key`'s assertion judges on `record`, in order: what the
    /// coordinator adds to a machine's calls of the trial's plugin judges
    /// ([`JudgeSet::grade_calls`]), made while it reads the trial anyway.
    pub fn assertion_calls(&self, key: &TrialKey, record: &TrialRecord) -> Vec<JudgeCall> {
        let judges = self.judges_for(key).iter();
        let assertions = judges.filter_map(|judge| match &judge.kind {
            JudgeKind::Assert(assertion) => Some(judge.assertion_call(assertion, record)),
            JudgeKind::Plugin { .. } => None,
        });
        assertions.collect()
    }

    /// Trial `key`'s grade from its plugin judges' `calls` made on a machine, checked by
    /// [`check_calls`], and its assertion judges' own calls (`assertions`, from
    /// [`JudgeSet::assertion_calls`]); the verdict is decided here.
    pub fn grade_calls(
        &self,
        key: &TrialKey,
        assertions: &[JudgeCall],
        calls: JudgeCalls,
    ) -> Result<TrialGrade, String> {
        let judges = self.judges_for(key);
        check_calls(&self.plugin_judges(key), &calls)?;
        let threshold = self.threshold(key);
        let JudgeCalls::Scores(machine) = calls else {
            return Ok(verdict(judges, calls, threshold));
        };
        let (mut machine, mut own) = (machine.into_iter(), assertions.iter().cloned());
        let merged = judges
            .iter()
            .map(|judge| match judge.plugin() {
                Some(_) => machine.next(),
                None => own.next(),
            })
            .collect::<Option<Vec<JudgeCall>>>()
            .ok_or("fewer calls than judges")?;
        Ok(verdict(judges, JudgeCalls::Scores(merged), threshold))
    }

    /// The set of a grade shard's machine: the judges its bundle carries by variant and by
    /// case, built with `plugins`; thresholds and case rules stay with the coordinator.
    pub fn from_configs(
        by_variant: &BTreeMap<String, Vec<JudgeConfig>>,
        by_case: &BTreeMap<String, Vec<JudgeConfig>>,
        plugins: &PluginSet,
    ) -> Result<Self> {
        let build = |configs: &BTreeMap<String, Vec<JudgeConfig>>, place: &str| {
            configs
                .iter()
                .map(|(name, configs)| {
                    let judges = judges_of(configs, &format!("{place} `{name}`: "), plugins)?;
                    Ok((name.clone(), judges))
                })
                .collect::<Result<BTreeMap<_, _>>>()
        };
        Ok(JudgeSet {
            by_variant: build(by_variant, "variant")?,
            by_case: build(by_case, "case")?,
            thresholds: BTreeMap::new(),
            threshold: 1.0,
            case_pass: CaseRules::default(),
        })
    }

    /// Every judge of the set, once per place it is configured.
    pub fn all(&self) -> impl Iterator<Item = &Judge> {
        self.by_variant
            .values()
            .chain(self.by_case.values())
            .flatten()
    }
}

/// How an infra reason that only a machine's trace gives begins: the summary, the report and
/// the exports list it as the machine's claim, not as what mst saw.
pub const MACHINE_CLAIM: &str = "the machine says: ";

/// Grades one trial with `judges` (none: a completed trial with exit code 0, if any, passes).
pub fn grade_trial(judges: &[Judge], record: &TrialRecord, threshold: f64) -> TrialGrade {
    if record.trace.status == TrialStatus::Infra {
        let reason = record
            .trace
            .events
            .iter()
            .rev()
            .find_map(|e| match &e.kind {
                crate::eval::trial::EventKind::Log { text } => Some(text.clone()),
                _ => None,
            })
            .unwrap_or_else(|| "the client could not run".into());
        // A trace from a machine is the machine's word (a hostile one could say it of every
        // failure); one mst wrote itself (a refused trace, a lost machine) has no provenance.
        let reason = match record.collected_by {
            Some(_) => format!("{MACHINE_CLAIM}{reason}"),
            None => reason,
        };
        return TrialGrade::Infra { reason };
    }
    if judges.is_empty() {
        let ok = record.trace.status == TrialStatus::Completed
            && record.trace.exit_code.unwrap_or(0) == 0;
        let reason = if ok {
            "completed".to_string()
        } else {
            format!(
                "{:?}, exit code {:?}",
                record.trace.status, record.trace.exit_code
            )
        };
        return TrialGrade::Graded {
            score: if ok { 1.0 } else { 0.0 },
            pass: ok,
            judges: smallvec::smallvec![JudgeScore {
                judge: "completed".into(),
                value: if ok { 1.0 } else { 0.0 },
                pass: ok,
                reason,
            }],
        };
    }
    verdict(judges, call_judges(judges, record, None), threshold)
}

/// A case's outcome under one variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CaseOutcome {
    Passed,
    Failed,
    /// Some trial is missing: left out of pass rates.
    Incomplete,
    /// Some trial's judge broke.
    NotGraded,
    /// Some trial failed for infrastructure reasons.
    Infra,
}

impl CaseOutcome {
    /// Whether the case passed, when it was decided (passed or failed); `None` for the
    /// outcomes pass rates leave out.
    pub fn verdict(self) -> Option<bool> {
        match self {
            CaseOutcome::Passed => Some(true),
            CaseOutcome::Failed => Some(false),
            _ => None,
        }
    }
}

/// Combines a case's trial grades (`None` = missing) by `rule` over its repetitions.
pub fn case_outcome(trials: &[Option<&TrialGrade>], rule: CaseRule) -> CaseOutcome {
    if trials.iter().any(|t| t.is_none()) {
        return CaseOutcome::Incomplete;
    }
    let grades: Vec<&TrialGrade> = trials.iter().flatten().copied().collect();
    if grades.iter().any(|g| matches!(g, TrialGrade::Infra { .. })) {
        return CaseOutcome::Infra;
    }
    if grades
        .iter()
        .any(|g| matches!(g, TrialGrade::NotGraded { .. }))
    {
        return CaseOutcome::NotGraded;
    }
    let passed = grades
        .iter()
        .filter(|g| matches!(g, TrialGrade::Graded { pass: true, .. }))
        .count();
    let ok = match rule {
        CaseRule::Majority => passed * 2 > grades.len(),
        // The tolerance only absorbs float error at exact shares (3 of 4 at 0.75).
        CaseRule::Share(share) => passed as f64 >= share * grades.len() as f64 - 1e-9,
    };
    if ok {
        CaseOutcome::Passed
    } else {
        CaseOutcome::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::CaseRecord;

    fn judge(json: &str) -> Judge {
        Judge::from_config(&serde_json::from_str(json).unwrap(), &PluginSet::default()).unwrap()
    }

    fn record(answer: &str, status: TrialStatus) -> TrialRecord {
        let mut record = TrialRecord::answered(CaseRecord::new("c", serde_json::json!(1)), answer);
        record.trace.status = status;
        record.trace.exit_code = Some(0);
        record
    }

    #[test]
    fn a_grade_reads_back_as_written_in_any_field_order_and_names_what_it_lacks() {
        let grades = [
            TrialGrade::Graded {
                score: 0.5,
                pass: false,
                judges: [JudgeScore {
                    judge: "contains".into(),
                    value: 0.5,
                    pass: false,
                    reason: "half".into(),
                }]
                .into_iter()
                .collect(),
            },
            TrialGrade::NotGraded {
                judge: "j".into(),
                error: "broke".into(),
            },
            TrialGrade::Infra {
                reason: "gone".into(),
            },
        ];
        for grade in grades {
            let json = serde_json::to_string(&grade).unwrap();
            assert!(json.starts_with(r#"{"outcome":"#), "{json}");
            assert_eq!(serde_json::from_str::<TrialGrade>(&json).unwrap(), grade);
        }
        // Written by hand, the tag last and a field mst does not know.
        let read: TrialGrade =
            serde_json::from_str(r#"{"reason": "gone", "note": 1, "outcome": "infra"}"#).unwrap();
        assert_eq!(
            read,
            TrialGrade::Infra {
                reason: "gone".into()
            }
        );
        let error = serde_json::from_str::<TrialGrade>(r#"{"outcome": "graded", "score": 1}"#)
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("missing field `pass` of a `graded` grade"),
            "{error}"
        );
        let error = serde_json::from_str::<TrialGrade>(r#"{"outcome": "lost"}"#)
            .unwrap_err()
            .to_string();
        assert!(error.contains("unknown variant `lost`"), "{error}");
    }

    #[test]
    fn assertions_and_weights() {
        let judges = vec![
            judge(r#"{"assert": "contains", "value": "Tokyo"}"#),
            judge(r#"{"assert": "regex", "value": "\\d+:\\d+", "weight": 3}"#),
        ];
        match grade_trial(&judges, &record("Tokyo 09:00", TrialStatus::Completed), 1.0) {
            TrialGrade::Graded { score, pass, .. } => assert_eq!((score, pass), (1.0, true)),
            other => panic!("{other:?}"),
        }
        match grade_trial(&judges, &record("Tokyo", TrialStatus::Completed), 0.2) {
            TrialGrade::Graded { score, pass, .. } => assert_eq!(
                (score, pass),
                (0.25, false),
                "a failing judge fails the trial"
            ),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_infra_trace_from_a_machine_is_graded_as_its_claim() {
        let reason = |record: &TrialRecord| match grade_trial(&[], record, 1.0) {
            TrialGrade::Infra { reason } => reason,
            other => panic!("{other:?}"),
        };
        let mut claimed = record("", TrialStatus::Infra);
        assert!(
            !reason(&claimed).starts_with(MACHINE_CLAIM),
            "mst's own record"
        );
        claimed.collected_by = Some(crate::eval::trial::CollectedBy {
            shard: 0,
            machine: "m".into(),
            client: "command".into(),
            client_version: "1".into(),
        });
        assert_eq!(
            reason(&claimed),
            format!("{MACHINE_CLAIM}the client could not run")
        );
    }

    #[test]
    fn infra_and_no_judges() {
        assert!(matches!(
            grade_trial(&[], &record("", TrialStatus::Infra), 1.0),
            TrialGrade::Infra { .. }
        ));
        assert!(matches!(
            grade_trial(&[], &record("x", TrialStatus::Completed), 1.0),
            TrialGrade::Graded { pass: true, .. }
        ));
        assert!(matches!(
            grade_trial(&[], &record("x", TrialStatus::TimedOut), 1.0),
            TrialGrade::Graded { pass: false, .. }
        ));
    }

    #[test]
    fn bad_judges_are_config_errors() {
        let bad = |json: &str| {
            Judge::from_config(&serde_json::from_str(json).unwrap(), &PluginSet::default()).is_err()
        };
        assert!(bad(r#"{"assert": "contains"}"#));
        assert!(bad(r#"{"assert": "regex", "value": "("}"#));
        assert!(bad(r#"{"assert": "sounds-right", "value": 1}"#));
        assert!(bad(r#"{"plugin": "acme/grader/none"}"#));
    }

    #[test]
    fn case_outcomes_keep_the_four_kinds_apart() {
        let pass = TrialGrade::Graded {
            score: 1.0,
            pass: true,
            judges: Default::default(),
        };
        let fail = TrialGrade::Graded {
            score: 0.0,
            pass: false,
            judges: Default::default(),
        };
        let broken = TrialGrade::NotGraded {
            judge: "j".into(),
            error: "e".into(),
        };
        let infra = TrialGrade::Infra { reason: "r".into() };
        assert_eq!(
            case_outcome(&[Some(&pass), Some(&pass), Some(&fail)], CaseRule::Majority),
            CaseOutcome::Passed
        );
        assert_eq!(
            case_outcome(&[Some(&pass), Some(&fail)], CaseRule::Majority),
            CaseOutcome::Failed,
            "a tie is not a majority"
        );
        assert_eq!(
            case_outcome(&[Some(&pass), None], CaseRule::Share(0.5)),
            CaseOutcome::Incomplete
        );
        assert_eq!(
            case_outcome(&[Some(&pass), Some(&broken)], CaseRule::Share(0.5)),
            CaseOutcome::NotGraded
        );
        assert_eq!(
            case_outcome(&[Some(&infra), Some(&broken)], CaseRule::Majority),
            CaseOutcome::Infra
        );
    }

    #[test]
    fn the_share_rule_passes_a_case_on_a_share_of_its_trials() {
        let grade = |pass| TrialGrade::Graded {
            score: f64::from(u8::from(pass)),
            pass,
            judges: Default::default(),
        };
        let (pass, fail) = (grade(true), grade(false));
        // The worked example of docs/results.md: 4 trials, 3 pass.
        let three_of_four = [Some(&pass), Some(&pass), Some(&pass), Some(&fail)];
        assert_eq!(
            case_outcome(&three_of_four, CaseRule::Majority),
            CaseOutcome::Passed
        );
        assert_eq!(
            case_outcome(&three_of_four, CaseRule::Share(0.75)),
            CaseOutcome::Passed,
            "at least the share"
        );
        assert_eq!(
            case_outcome(&three_of_four, CaseRule::Share(0.8)),
            CaseOutcome::Failed
        );
        let two_of_four = [Some(&pass), Some(&fail), Some(&pass), Some(&fail)];
        assert_eq!(
            case_outcome(&two_of_four, CaseRule::Majority),
            CaseOutcome::Failed
        );
        assert_eq!(
            case_outcome(&two_of_four, CaseRule::Share(0.5)),
            CaseOutcome::Passed
        );
        let two_of_three = [Some(&pass), Some(&pass), Some(&fail)];
        assert_eq!(
            case_outcome(&two_of_three, CaseRule::Share(0.67)),
            CaseOutcome::Failed,
            "2/3 is below 0.67"
        );
        assert_eq!(
            case_outcome(&two_of_three, CaseRule::Share(0.66)),
            CaseOutcome::Passed
        );
    }

    #[test]
    fn tool_assertions_are_judges_and_bad_values_are_config_errors() {
        let mut record = record("It is 9:00 in Tokyo", TrialStatus::Completed);
        record.trace.events.push(crate::eval::trial::TraceEvent {
            seq: 0,
            at_ms: 0,
            kind: crate::eval::trial::EventKind::ToolCall {
                id: "1".into(),
                server: Some("time".into()),
                tool: "get_current_time".into(),
                arguments: serde_json::json!({"timezone": "Asia/Tokyo"}),
            },
        });
        let judges = vec![
            judge(
                r#"{"assert": "tools-called", "value": {"tools": [{"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}]}}"#,
            ),
            judge(r#"{"assert": "tool-not-called", "value": "convert_time"}"#),
        ];
        match grade_trial(&judges, &record, 1.0) {
            TrialGrade::Graded { pass, judges, .. } => {
                assert!(pass, "{judges:?}");
                assert_eq!(&*judges[0].judge, "tools-called");
            }
            other => panic!("{other:?}"),
        }
        let judges = vec![judge(
            r#"{"assert": "tool-call-count", "value": {"min": 2}}"#,
        )];
        match grade_trial(&judges, &record, 1.0) {
            TrialGrade::Graded { pass, judges, .. } => {
                assert!(!pass);
                assert_eq!(judges[0].reason, "expected at least 2 tool calls; made 1");
            }
            other => panic!("{other:?}"),
        }
        let config: JudgeConfig = serde_json::from_str(
            r#"{"assert": "tools-called", "value": {"tools": [{"name": 3}]}}"#,
        )
        .unwrap();
        let error = format!(
            "{:#}",
            Judge::from_config(&config, &PluginSet::default())
                .err()
                .unwrap()
        );
        assert!(
            error.contains("`tools-called` assertion's `value` is not"),
            "{error}"
        );
    }

    #[test]
    fn judges_calls_made_elsewhere_are_checked_and_the_verdict_is_decided_here() {
        let judges = vec![
            judge(r#"{"assert": "contains", "value": "Tokyo", "weight": 3}"#),
            judge(r#"{"assert": "regex", "value": "\\d", "name": "digits"}"#),
        ];
        let call = |judge: &str, value: f64, pass: Option<bool>| JudgeCall {
            judge: judge.into(),
            value,
            pass,
            reason: "r".into(),
        };
        // A value without its own pass is held to the threshold, and the weights hold.
        let calls =
            JudgeCalls::Scores(vec![call("contains", 1.0, None), call("digits", 0.4, None)]);
        let all: Vec<&Judge> = judges.iter().collect();
        assert_eq!(check_calls(&all, &calls), Ok(()));
        match verdict(&judges, calls, 0.5) {
            TrialGrade::Graded {
                score,
                pass,
                judges,
            } => {
                assert!((score - 0.85).abs() < 1e-9, "{score}");
                assert!(!pass, "the second judge is below the threshold");
                assert_eq!((judges[0].pass, judges[1].pass), (true, false));
            }
            other => panic!("{other:?}"),
        }
        // What a machine may not say.
        let refused = |calls: JudgeCalls| check_calls(&all, &calls).unwrap_err();
        let one = JudgeCalls::Scores(vec![call("contains", 1.0, None)]);
        assert!(refused(one).contains("1 score(s) for the trial's 2 judge(s)"));
        let swapped =
            JudgeCalls::Scores(vec![call("digits", 1.0, None), call("contains", 1.0, None)]);
        assert!(refused(swapped).contains("where judge `contains` was expected"));
        let nan = JudgeCalls::Scores(vec![
            call("contains", f64::NAN, None),
            call("digits", 1.0, None),
        ]);
        assert!(refused(nan).contains("outside 0..1"));
        let long = JudgeCalls::Scores(vec![
            JudgeCall {
                reason: "x".repeat(crate::plugin::bounds::MAX_REASON + CUT_NOTE + 1),
                ..call("contains", 1.0, None)
            },
            call("digits", 1.0, None),
        ]);
        assert!(refused(long).contains("reason is"));
        let stranger = JudgeCalls::NotGraded {
            judge: "other".into(),
            error: "e".into(),
        };
        assert!(refused(stranger).contains("does not have"));
        // And what the coordinator's own judges say is the same through the split.
        let record = record("Tokyo 9", TrialStatus::Completed);
        assert_eq!(
            grade_trial(&judges, &record, 1.0),
            verdict(&judges, call_judges(&judges, &record, None), 1.0)
        );
    }
}
