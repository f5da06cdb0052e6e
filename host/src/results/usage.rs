//! What a run's model calls used, for `summary.json` and the summary table: the agents' per
//! variant, summed from their traces' `usage` events (as the workers recorded them), and the
//! plugins' (their `model` calls, counted by the host while it graded).

use super::{PluginRecord, RunDir};
use crate::eval::plan::Plan;
use crate::eval::trial::{TraceRecord, TrialKey};
use crate::llm::UsageTotals;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `summary.json`'s `usage`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UsageSummary {
    /// The agents' model calls, by variant.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, UsageTotals>,
    /// The plugins' model calls, by plugin (`name version`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub plugins: BTreeMap<String, UsageTotals>,
}

impl UsageSummary {
    /// The usage in the traces of `trials` in `dir` (missing ones are left out) and that of
    /// `plugins`, as their records say.
    pub fn of_run(dir: &RunDir, trials: &Plan, plugins: &[PluginRecord]) -> Self {
        Self::of_agents(dir, trials, BTreeMap::new(), |_| false).with_plugins(plugins)
    }

    /// The agents' usage: `counted` (by variant, summed from the traces graded as they
    /// arrived), and the usage in the traces of the other `trials` in `dir`, read from them.
    pub fn of_agents(
        dir: &RunDir,
        trials: &Plan,
        counted: BTreeMap<String, UsageTotals>,
        is_counted: impl Fn(&TrialKey) -> bool,
    ) -> Self {
        let mut variants = counted;
        for key in trials.keys().filter(|key| !is_counted(key)) {
            let Some(record) = dir.read_trace(&key) else {
                continue;
            };
            let totals = trace_usage(&record.trace);
            if !totals.is_empty() {
                variants
                    .entry(key.variant.to_string())
                    .or_default()
                    .merge(&totals);
            }
        }
        variants.retain(|_, totals| !totals.is_empty());
        UsageSummary {
            variants,
            plugins: BTreeMap::new(),
        }
    }

    /// This summary with the usage of `plugins`, as their records say.
    pub fn with_plugins(self, plugins: &[PluginRecord]) -> Self {
        let plugins = plugins
            .iter()
            .filter_map(|p| Some((format!("{} {}", p.name, p.version), p.usage?)))
            .collect();
        UsageSummary { plugins, ..self }
    }

    /// Whether no model call was counted.
    pub fn is_empty(&self) -> bool {
        self.variants.is_empty() && self.plugins.is_empty()
    }

    /// One line per variant and plugin that called a model, for the summary table.
    pub fn lines(&self) -> Vec<String> {
        let line = |who: String, u: &UsageTotals| {
            let cost = u.cost_usd.map_or(String::new(), |c| format!(", ${c:.4}"));
            format!(
                "usage: {who}: {} model calls, {} tokens in, {} out{cost}",
                u.calls, u.input_tokens, u.output_tokens
            )
        };
        let variants = self.variants.iter().map(|(v, u)| line(v.clone(), u));
        let plugins = self
            .plugins
            .iter()
            .map(|(p, u)| line(format!("plugin {p}"), u));
        variants.chain(plugins).collect()
    }
}

/// The sum of a trace's `usage` events; one that does not read as usage is left out.
pub fn trace_usage(trace: &TraceRecord) -> UsageTotals {
    let mut totals = UsageTotals::default();
    for (usage, cost) in trace.events.iter().filter_map(|e| e.kind.usage()) {
        totals.add(&usage, cost);
    }
    totals
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::{EventKind, TraceEvent};
    use serde_json::json;

    fn custom(name: &str, data: serde_json::Value) -> TraceEvent {
        TraceEvent {
            seq: 0,
            at_ms: 0,
            kind: EventKind::Custom {
                name: name.into(),
                data,
            },
        }
    }

    #[test]
    fn a_traces_usage_events_are_summed_and_others_left_out() {
        let trace = TraceRecord {
            events: vec![
                custom(
                    "usage",
                    json!({"usage": {"inputTokens": 10, "outputTokens": 2}, "costUsd": 0.25}),
                ),
                custom(
                    "usage",
                    json!({"usage": {"inputTokens": 5, "outputTokens": 1}}),
                ),
                // Not usage: another custom event, a count that is not a number.
                custom(
                    "usage-ish",
                    json!({"usage": {"inputTokens": 99, "outputTokens": 9}}),
                ),
                custom(
                    "usage",
                    json!({"usage": {"inputTokens": "x", "outputTokens": 1}}),
                ),
            ],
            ..TraceRecord::default()
        };
        let totals = trace_usage(&trace);
        assert_eq!(
            totals,
            UsageTotals {
                calls: 2,
                input_tokens: 15,
                output_tokens: 3,
                cost_usd: Some(0.25),
            }
        );
        let mut sum = UsageTotals::default();
        sum.merge(&totals);
        sum.merge(&trace_usage(&TraceRecord::default()));
        assert_eq!(sum, totals, "an unpriced, empty trace adds nothing");
        let summary = UsageSummary {
            variants: [("v".to_string(), totals)].into(),
            plugins: BTreeMap::new(),
        };
        assert_eq!(
            summary.lines(),
            ["usage: v: 2 model calls, 15 tokens in, 3 out, $0.2500"]
        );
        assert!(UsageSummary::default().lines().is_empty());
    }
}
