//! Pairwise grading: a pairwise-grader plugin compares two variants' traces of each case, in
//! both orders and with the variant names blinded, and a variant wins a case only when both
//! orders agree on it; otherwise the case is a tie, with both reasons kept.
//!
//! One comparison per case and pair: the lowest trial index that both variants collected
//! without an infrastructure failure. Comparing every repetition would multiply the judge's
//! calls by `trials` for one verdict per case; the first usable pair is what a reader of the
//! traces would look at too.

use crate::eval::config::EvalConfig;
use crate::eval::trial::{CaseRecord, TrialRecord, TrialStatus};
use crate::plugin::bindings::{self as wit, Winner};
use crate::plugin::set::PluginSet;
use crate::plugin::{Kind, LoadedPlugin};
use anyhow::{Context, Result};
use regex::Regex;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// What every whole-word occurrence of a variant's name becomes in what a pairwise grader
/// sees. One label for both variants, rather than "A"/"B": a trace that names the other
/// variant then tells the grader nothing about which answer that is.
pub const BLIND_LABEL: &str = "[variant]";

/// One configured pairwise judge, its plugin loaded and checked.
pub struct PairJudge {
    /// The name reports use.
    pub name: String,
    /// The plugin's name as the config gives it.
    pub plugin_name: String,
    /// The variant wins are counted for.
    pub a: String,
    /// The variant it is compared with.
    pub b: String,
    plugin: Arc<LoadedPlugin>,
    options: String,
    blind: Blind,
}

impl PairJudge {
    /// The config's pairwise judges, built against `plugins`; an error names
    /// `pairwise[i].plugin` and what to do.
    pub fn build_all(config: &EvalConfig, plugins: &PluginSet) -> Result<Vec<Self>> {
        config
            .pairwise
            .iter()
            .enumerate()
            .map(|(index, pair)| {
                let plugin = plugins
                    .get(&pair.plugin, Kind::PairwiseGrader)
                    .with_context(|| format!("pairwise[{index}].plugin"))?;
                let (a, b) = (pair.variants[0].clone(), pair.variants[1].clone());
                Ok(PairJudge {
                    name: pair.display_name(),
                    plugin_name: pair.plugin.clone(),
                    blind: Blind::new(&[&a, &b]),
                    a,
                    b,
                    plugin,
                    options: pair
                        .options
                        .clone()
                        .unwrap_or(serde_json::json!({}))
                        .to_string(),
                })
            })
            .collect()
    }

    /// Compares `a`'s and `b`'s traces of `case` in both orders, blinded.
    pub fn compare(&self, case: &CaseRecord, a: &TrialRecord, b: &TrialRecord) -> CaseComparison {
        let mut wit_case = case.to_wit();
        self.blind.case(&mut wit_case);
        let trace = |record: &TrialRecord| {
            let mut trace = record.to_wit().trace;
            self.blind.trace(&mut trace);
            trace
        };
        let (trace_a, trace_b) = (trace(a), trace(b));
        let ask = |first: &wit::Trace, second: &wit::Trace| {
            self.plugin
                .compare(&self.options, &wit_case, first, second)
                .map_err(|e| e.to_string())
        };
        let ab = ask(&trace_a, &trace_b);
        let ba = ask(&trace_b, &trace_a);
        let outcome = agree(&ab, &ba);
        CaseComparison {
            case: case.id.to_string(),
            trial: Some(a.trial),
            outcome,
            reason: None,
            orders: vec![
                OrderVerdict::new(&self.a, &self.b, ab),
                OrderVerdict::new(&self.b, &self.a, ba),
            ],
        }
    }
}

/// Which of the pair a verdict picks, whatever the order it was asked in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pick {
    A,
    B,
    Tie,
}

/// Turns a verdict in one order into a pick: in the order (a, b) `first` is a; in (b, a)
/// it is b.
fn pick(winner: Winner, a_first: bool) -> Pick {
    match (winner, a_first) {
        (Winner::Tie, _) => Pick::Tie,
        (Winner::First, true) | (Winner::Second, false) => Pick::A,
        (Winner::First, false) | (Winner::Second, true) => Pick::B,
    }
}

/// The case's outcome from the verdicts in order (a, b) and (b, a): a winner only when both
/// pick it; a grader error in either order leaves the case not graded.
fn agree<E>(ab: &Result<wit::Preference, E>, ba: &Result<wit::Preference, E>) -> PairOutcome {
    match (ab, ba) {
        (Ok(ab), Ok(ba)) => match (pick(ab.winner, true), pick(ba.winner, false)) {
            (Pick::A, Pick::A) => PairOutcome::AWins,
            (Pick::B, Pick::B) => PairOutcome::BWins,
            _ => PairOutcome::Tie,
        },
        _ => PairOutcome::NotGraded,
    }
}

/// How one case of a pair ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PairOutcome {
    /// Both orders preferred `a`.
    AWins,
    /// Both orders preferred `b`.
    BWins,
    /// Both orders said tie, or the orders disagreed.
    Tie,
    /// The grader failed in either order.
    NotGraded,
    /// No trial of both variants to compare: missing, or an infrastructure failure.
    NotCompared,
}

/// What the grader said, as the host records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Said {
    First,
    Second,
    Tie,
}

/// The verdict in one order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OrderVerdict {
    /// The variant shown first.
    pub first: String,
    /// The variant shown second.
    pub second: String,
    /// Which the grader preferred; absent when it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub winner: Option<Said>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub confidence: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Why the grader could not compare.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl OrderVerdict {
    fn new(first: &str, second: &str, result: Result<wit::Preference, String>) -> Self {
        let mut verdict = OrderVerdict {
            first: first.to_string(),
            second: second.to_string(),
            winner: None,
            confidence: None,
            reason: None,
            error: None,
        };
        match result {
            Ok(preference) => {
                verdict.winner = Some(match preference.winner {
                    Winner::First => Said::First,
                    Winner::Second => Said::Second,
                    Winner::Tie => Said::Tie,
                });
                verdict.confidence = Some(preference.confidence);
                verdict.reason = Some(preference.reason);
            }
            Err(error) => verdict.error = Some(error),
        }
        verdict
    }
}

/// One case of one pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseComparison {
    pub case: String,
    /// The trial index compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trial: Option<u32>,
    pub outcome: PairOutcome,
    /// Why the case was not compared.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// The verdict in order (a, b), then in (b, a).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub orders: Vec<OrderVerdict>,
}

impl CaseComparison {
    /// A case with no trial to compare, and why.
    pub fn not_compared(case: &str, reason: String) -> Self {
        CaseComparison {
            case: case.to_string(),
            trial: None,
            outcome: PairOutcome::NotCompared,
            reason: Some(reason),
            orders: Vec::new(),
        }
    }
}

/// Every compared case of one pairwise judge: an entry of `pairwise.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PairResult {
    pub name: String,
    pub plugin: String,
    pub a: String,
    pub b: String,
    pub cases: Vec<CaseComparison>,
}

/// Whether `record` can be compared: collected, and not an infrastructure failure.
pub fn comparable(record: &TrialRecord) -> bool {
    record.trace.status != TrialStatus::Infra
}

/// Replaces whole-word occurrences of the variant names with [`BLIND_LABEL`].
pub struct Blind {
    pattern: Option<Regex>,
}

impl Blind {
    /// Blinds `names`. A name's edge that is a word character must sit at a word boundary
    /// (`gpt` is not replaced inside `gpt4o`); an edge that is not one needs no boundary.
    pub fn new(names: &[&str]) -> Self {
        let mut names: Vec<&str> = names.iter().copied().filter(|n| !n.is_empty()).collect();
        // The longer name first, so one that contains the other as a word wins.
        names.sort_by_key(|n| std::cmp::Reverse(n.len()));
        let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
        let alternatives: Vec<String> = names
            .iter()
            .map(|name| {
                let start = if word(name.chars().next()) { r"\b" } else { "" };
                let end = if word(name.chars().last()) { r"\b" } else { "" };
                format!("{start}{}{end}", regex::escape(name))
            })
            .collect();
        let pattern = (!alternatives.is_empty()).then(|| {
            Regex::new(&alternatives.join("|")).expect("escaped names make a valid regex")
        });
        Blind { pattern }
    }

    /// `text`, blinded.
    pub fn text(&self, text: &mut String) {
        if let Some(pattern) = &self.pattern {
            if let std::borrow::Cow::Owned(blinded) = pattern.replace_all(text, BLIND_LABEL) {
                *text = blinded;
            }
        }
    }

    /// Blinds every text of `case` but its id and tags (the same for both variants).
    pub fn case(&self, case: &mut wit::Case) {
        self.text(&mut case.input);
        for text in case.expected.iter_mut().chain(case.metadata.iter_mut()) {
            self.text(text);
        }
    }

    /// Blinds every text of `trace`: the final answer and each event's texts (message roles,
    /// a fixed vocabulary, stay).
    pub fn trace(&self, trace: &mut wit::Trace) {
        if let Some(text) = &mut trace.final_text {
            self.text(text);
        }
        for event in &mut trace.events {
            match &mut event.kind {
                wit::EventKind::Message(message) => self.text(&mut message.text),
                wit::EventKind::ToolCall(call) => {
                    for text in [&mut call.id, &mut call.tool, &mut call.arguments]
                        .into_iter()
                        .chain(call.server.as_mut())
                    {
                        self.text(text);
                    }
                }
                wit::EventKind::ToolResult(result) => {
                    self.text(&mut result.id);
                    self.text(&mut result.output);
                }
                wit::EventKind::Log(text) => self.text(text),
                wit::EventKind::Custom(custom) => {
                    self.text(&mut custom.name);
                    self.text(&mut custom.data);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn blinded(names: &[&str], text: &str) -> String {
        let mut text = text.to_string();
        Blind::new(names).text(&mut text);
        text
    }

    #[test]
    fn blinding_replaces_whole_words_only() {
        assert_eq!(
            blinded(
                &["gpt", "claude"],
                "gpt and Claude, not gpt4o nor claude-x: claude."
            ),
            "[variant] and Claude, not gpt4o nor [variant]-x: [variant]."
        );
        assert_eq!(
            blinded(&["gpt", "gpt-4o"], "gpt-4o beats gpt"),
            "[variant] beats [variant]",
            "the longer name wins"
        );
        assert_eq!(
            blinded(&["a.b", "c+"], "a.b axb c+ c++"),
            "[variant] axb [variant] [variant]+",
            "names are text, not patterns; a non-word edge needs no boundary"
        );
        assert_eq!(blinded(&["ça"], "ça çava"), "[variant] çava");
    }

    #[test]
    fn blinding_reaches_every_text_of_a_trace() {
        let mut record = TrialRecord::answered(CaseRecord::new("c", serde_json::json!(1)), "");
        record.trace.final_text = Some("I am alpha".into());
        let mut trace = record.to_wit().trace;
        trace.events = vec![
            wit::EventKind::Message(wit::Message {
                role: "alpha".into(),
                text: "alpha says".into(),
            }),
            wit::EventKind::ToolCall(wit::ToolCall {
                id: "alpha-1".into(),
                server: Some("alpha".into()),
                tool: "alpha".into(),
                arguments: r#"{"who": "alpha"}"#.into(),
            }),
            wit::EventKind::ToolResult(wit::ToolResult {
                id: "alpha-1".into(),
                output: "alpha".into(),
                is_error: false,
                duration_ms: 0,
            }),
            wit::EventKind::Log("alpha".into()),
            wit::EventKind::Custom(wit::CustomEvent {
                name: "alpha".into(),
                data: r#""beta""#.into(),
            }),
        ]
        .into_iter()
        .enumerate()
        .map(|(seq, kind)| wit::TraceEvent {
            seq: seq as u64,
            at_ms: 0,
            kind,
        })
        .collect();
        Blind::new(&["alpha", "beta"]).trace(&mut trace);
        let text = format!("{trace:?}");
        assert_eq!(
            text.matches("alpha").count(),
            1,
            "only the message role stays: {text}"
        );
        assert!(!text.contains("beta"), "{text}");
    }

    fn said(winner: Winner) -> Result<wit::Preference, ()> {
        Ok(wit::Preference {
            winner,
            confidence: 1.0,
            reason: String::new(),
        })
    }

    #[test]
    fn a_winner_needs_both_orders() {
        use Winner::*;
        // In (a, b) `first` is a; in (b, a) `second` is a.
        assert_eq!(agree(&said(First), &said(Second)), PairOutcome::AWins);
        assert_eq!(agree(&said(Second), &said(First)), PairOutcome::BWins);
        assert_eq!(
            agree(&said(First), &said(First)),
            PairOutcome::Tie,
            "the first position won twice: the orders disagree"
        );
        assert_eq!(agree(&said(Tie), &said(Second)), PairOutcome::Tie);
        assert_eq!(agree(&said(Tie), &said(Tie)), PairOutcome::Tie);
        assert_eq!(agree(&Err(()), &said(Second)), PairOutcome::NotGraded);
        assert_eq!(agree(&said(First), &Err(())), PairOutcome::NotGraded);
    }
}
