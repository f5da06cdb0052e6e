//! What a run's model calls used, for `summary.json` and the summary table: the agents' per
//! variant, summed from their traces' `usage` events (as the workers recorded them), and the
//! plugins' (their `model` calls, counted by the host while it graded).

use super::{PluginRecord, RunDir};
use crate::eval::trial::{EventKind, TraceRecord, TrialKey};
use crate::model::{Usage, UsageTotals};
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
    pub fn of_run(dir: &RunDir, trials: &[TrialKey], plugins: &[PluginRecord]) -> Self {
        let mut variants: BTreeMap<String, UsageTotals> = BTreeMap::new();
        for key in trials {
            let Some(record) = dir.read_trace(key) else {
                continue;
            };
            let totals = trace_usage(&record.trace);
            if !totals.is_empty() {
                variants
                    .entry(key.variant.clone())
                    .or_default()
                    .merge(&totals);
            }
        }
        let plugins = plugins
            .iter()
            .filter_map(|p| Some((format!("{} {}", p.name, p.version), p.usage?)))
            .collect();
        UsageSummary { variants, plugins }
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
    for event in &trace.events {
        let EventKind::Custom { name, data } = &event.kind else {
            continue;
        };
        if name != "usage" {
            continue;
        }
        let tokens = |field: &str| data["usage"][field].as_u64();
        let (Some(input_tokens), Some(output_tokens)) =
            (tokens("inputTokens"), tokens("outputTokens"))
        else {
            continue;
        };
        let usage = Usage {
            input_tokens,
            output_tokens,
        };
        totals.add(&usage, data["costUsd"].as_f64().filter(|c| c.is_finite()));
    }
    totals
}
