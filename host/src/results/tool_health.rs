//! How each MCP server fared in a run, for `summary.json`'s `servers`, the summary table and
//! the report: its calls, errors and refused calls, latency percentiles, and the tools it
//! listed that no trial called. Summed from the traces' `tool-call` and `tool-result` events
//! (every client records the server's label) and the tool proxy's `tools-listed` and
//! `tool-blocked` events; and the tools each variant's clients were shown (`run.json`'s
//! `toolLists`), from the same `tools-listed` events.

use crate::eval::trial::{
    EventKind, ShownTool, TraceRecord, TOOLS_LISTED_EVENT, TOOL_BLOCKED_EVENT,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One trace's calls to one server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TraceTally {
    pub calls: u64,
    #[serde(default)]
    pub errors: u64,
    #[serde(default)]
    pub blocked: u64,
    /// Each answered call's duration, in milliseconds.
    #[serde(default)]
    pub latencies_ms: Vec<u64>,
    #[serde(default)]
    pub called: BTreeSet<String>,
    /// The tools the server listed to the client, when the proxy saw the list.
    #[serde(default)]
    pub listed: BTreeSet<String>,
    /// The tools as the client was shown them, when the trace recorded the list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shown: Option<Vec<ShownTool>>,
}

/// The tools each variant's clients were shown, by variant and server label (`run.json`'s
/// `toolLists`).
pub type ToolLists = BTreeMap<String, BTreeMap<String, Vec<ShownTool>>>;

/// A trace's tallies by server label.
pub type TraceTools = BTreeMap<String, TraceTally>;

/// Tallies `trace`'s tool calls by server; calls recorded without a server are left out.
pub fn trace_tools(trace: &TraceRecord) -> TraceTools {
    let mut tools = TraceTools::new();
    let mut server_of: BTreeMap<&str, &str> = BTreeMap::new();
    for event in &trace.events {
        match &event.kind {
            EventKind::ToolCall {
                id,
                server: Some(server),
                tool,
                ..
            } => {
                server_of.insert(id, server);
                let tally = tools.entry(server.clone()).or_default();
                tally.calls += 1;
                tally.called.insert(tool.clone());
            }
            EventKind::ToolResult {
                id,
                is_error,
                duration_ms,
                ..
            } => {
                if let Some(tally) = server_of.get(id.as_str()).and_then(|s| tools.get_mut(*s)) {
                    tally.errors += u64::from(*is_error);
                    tally.latencies_ms.push(*duration_ms);
                }
            }
            EventKind::Custom { name, data } if name == TOOL_BLOCKED_EVENT => {
                if let Some(server) = data["server"].as_str() {
                    tools.entry(server.to_string()).or_default().blocked += 1;
                }
            }
            EventKind::Custom { name, data } if name == TOOLS_LISTED_EVENT => {
                if let (Some(server), Some(listed)) =
                    (data["server"].as_str(), data["tools"].as_array())
                {
                    let names = listed.iter().filter_map(|t| t.as_str()).map(str::to_string);
                    let tally = tools.entry(server.to_string()).or_default();
                    tally.listed.extend(names);
                    // Traces from before the shown list was recorded have none.
                    if let Ok(shown) = serde_json::from_value(data["shown"].clone()) {
                        tally.shown = Some(shown);
                    }
                }
            }
            _ => {}
        }
    }
    tools
}

/// A run's calls to one server, summed over its traces.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ServerTotals {
    calls: u64,
    errors: u64,
    blocked: u64,
    /// The answered calls' latencies.
    latencies: super::durations::Durations,
    called: BTreeSet<String>,
    listed: BTreeSet<String>,
}

impl ServerTotals {
    fn add(&mut self, tally: &TraceTally) {
        self.calls += tally.calls;
        self.errors += tally.errors;
        self.blocked += tally.blocked;
        for ms in &tally.latencies_ms {
            self.latencies.add(*ms);
        }
        self.called.extend(tally.called.iter().cloned());
        self.listed.extend(tally.listed.iter().cloned());
    }

    /// The latency at or below which `share` of the answered calls came, to within 10%.
    fn percentile(&self, share: f64) -> Option<u64> {
        self.latencies.percentile(share)
    }
}

/// The run's tool calls by server, and the tools shown by variant, as traces are tallied.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolTotals {
    servers: BTreeMap<String, ServerTotals>,
    lists: ToolLists,
}

impl ToolTotals {
    /// `counted` (summed from the traces graded as they arrived) and the tool calls in the
    /// traces of the other `trials` in `dir`, read from them (missing ones are left out).
    pub fn of_traces(
        dir: &super::RunDir,
        trials: &crate::eval::plan::Plan,
        mut counted: ToolTotals,
        is_counted: impl Fn(&crate::eval::trial::TrialKey) -> bool,
    ) -> Self {
        for key in trials.keys().filter(|key| !is_counted(key)) {
            if let Some(record) = dir.read_trace(&key) {
                counted.add(&key.variant, &trace_tools(&record.trace));
            }
        }
        counted
    }

    /// Adds the tallies of one trace of `variant`.
    pub fn add(&mut self, variant: &str, tools: &TraceTools) {
        for (server, tally) in tools {
            self.servers.entry(server.clone()).or_default().add(tally);
            if let Some(shown) = &tally.shown {
                let servers = self.lists.entry(variant.to_string()).or_default();
                add_shown(servers.entry(server.clone()).or_default(), shown);
            }
        }
    }

    /// The tools each variant's clients were shown (`run.json`'s `toolLists`).
    pub fn tool_lists(&self) -> &ToolLists {
        &self.lists
    }

    /// Adds another run part's totals.
    pub fn merge(&mut self, other: ToolTotals) {
        for (server, totals) in other.servers {
            let mine = self.servers.entry(server).or_default();
            mine.calls += totals.calls;
            mine.errors += totals.errors;
            mine.blocked += totals.blocked;
            mine.latencies.merge(&totals.latencies);
            mine.called.extend(totals.called);
            mine.listed.extend(totals.listed);
        }
        for (variant, servers) in other.lists {
            let mine = self.lists.entry(variant).or_default();
            for (server, shown) in servers {
                add_shown(mine.entry(server).or_default(), &shown);
            }
        }
    }

    /// `summary.json`'s `servers`.
    pub fn health(&self) -> BTreeMap<String, ServerHealth> {
        self.servers
            .iter()
            .map(|(server, t)| {
                let health = ServerHealth {
                    calls: t.calls,
                    errors: t.errors,
                    blocked: t.blocked,
                    p50_ms: t.percentile(0.5),
                    p95_ms: t.percentile(0.95),
                    never_called: t.listed.difference(&t.called).cloned().collect(),
                };
                (server.clone(), health)
            })
            .collect()
    }
}

/// Adds to `list` the tools of `shown` it does not name yet, keeping it sorted by name: the
/// same list whatever order the traces came in (a server listing differently in two trials of
/// a variant gives the union).
fn add_shown(list: &mut Vec<ShownTool>, shown: &[ShownTool]) {
    for tool in shown {
        if let Err(at) = list.binary_search_by(|t| t.name.cmp(&tool.name)) {
            list.insert(at, tool.clone());
        }
    }
}

/// One server's health in a run (`summary.json`'s `servers.LABEL`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServerHealth {
    pub calls: u64,
    pub errors: u64,
    /// Calls the tool proxy refused (a dry run's writes).
    #[serde(default)]
    pub blocked: u64,
    /// The median latency of the answered calls, in ms (to within 10%).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub p95_ms: Option<u64>,
    /// Tools the server listed (through the proxy) that no trial called.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub never_called: Vec<String>,
}

impl ServerHealth {
    /// One line for the summary table: `server time: 12 calls, 1 error, p50 3 ms, p95 9 ms`.
    pub fn line(&self, server: &str) -> String {
        let mut line = format!(
            "server {server}: {} calls, {} errors",
            self.calls, self.errors
        );
        if self.blocked > 0 {
            line.push_str(&format!(", {} blocked", self.blocked));
        }
        if let (Some(p50), Some(p95)) = (self.p50_ms, self.p95_ms) {
            line.push_str(&format!(", p50 {p50} ms, p95 {p95} ms"));
        }
        if !self.never_called.is_empty() {
            line.push_str(&format!("; never called: {}", self.never_called.join(", ")));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::TraceEvent;
    use serde_json::json;

    fn event(kind: EventKind) -> TraceEvent {
        TraceEvent {
            seq: 0,
            at_ms: 0,
            kind,
        }
    }

    fn call(id: &str, server: &str, tool: &str, ms: u64, error: bool) -> Vec<TraceEvent> {
        vec![
            event(EventKind::ToolCall {
                id: id.into(),
                server: Some(server.into()),
                tool: tool.into(),
                arguments: json!({}),
            }),
            event(EventKind::ToolResult {
                id: id.into(),
                output: String::new(),
                is_error: error,
                duration_ms: ms,
            }),
        ]
    }

    #[test]
    fn calls_errors_percentiles_and_tools_never_called_by_server() {
        let mut events = vec![event(EventKind::Custom {
            name: TOOLS_LISTED_EVENT.into(),
            data: json!({"server": "time", "tools": ["now", "convert", "zones"], "shown": [
                {"name": "when", "description": "Converts.", "renamedFrom": "convert"},
                {"name": "now", "description": "The time.", "blocked": "blocked: dry run"},
            ]}),
        })];
        for (i, ms) in [1u64, 2, 3, 4, 5, 6, 7, 8, 9, 100].iter().enumerate() {
            events.extend(call(&i.to_string(), "time", "now", *ms, i == 9));
        }
        events.extend(call("x", "fs", "write", 40, true));
        events.push(event(EventKind::Custom {
            name: TOOL_BLOCKED_EVENT.into(),
            data: json!({"server": "fs", "tool": "write", "reason": "blocked: dry run"}),
        }));
        // A call the client recorded without a server is no server's.
        events.push(event(EventKind::ToolCall {
            id: "y".into(),
            server: None,
            tool: "bash".into(),
            arguments: json!({}),
        }));
        let trace = TraceRecord {
            events,
            ..TraceRecord::default()
        };
        let mut totals = ToolTotals::default();
        totals.add("v", &trace_tools(&trace));
        totals.add("v", &trace_tools(&trace));
        let health = totals.health();
        let time = &health["time"];
        assert_eq!((time.calls, time.errors, time.blocked), (20, 2, 0));
        // The true median is 5 ms and the 95th percentile 100 ms: within 10% above.
        assert!((5..=6).contains(&time.p50_ms.unwrap()), "{time:?}");
        assert!((100..=110).contains(&time.p95_ms.unwrap()), "{time:?}");
        assert_eq!(time.never_called, ["convert", "zones"]);
        assert_eq!((health["fs"].calls, health["fs"].blocked), (2, 2));
        assert_eq!(health.len(), 2);
        assert_eq!(
            time.line("time"),
            format!("server time: 20 calls, 2 errors, p50 {} ms, p95 {} ms; never called: convert, zones", time.p50_ms.unwrap(), time.p95_ms.unwrap())
        );
        // Merging two halves gives the whole.
        let mut half = ToolTotals::default();
        half.add("v", &trace_tools(&trace));
        let mut other = ToolTotals::default();
        other.add("v", &trace_tools(&trace));
        half.merge(other);
        assert_eq!(half, totals);
        // The variant's shown list: sorted by name, once however many traces listed it; the
        // server that recorded no list has none.
        let lists = totals.tool_lists();
        let time = &lists["v"]["time"];
        let names: Vec<&str> = time.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["now", "when"]);
        assert_eq!(time[1].renamed_from.as_deref(), Some("convert"));
        assert_eq!(time[0].blocked.as_deref(), Some("blocked: dry run"));
        assert_eq!((lists.len(), lists["v"].len()), (1, 1));
    }
}
