//! Built-in assertions on what a trial did with its tools, read from the trace's `tool-call`
//! and `tool-result` events, so they hold for every client that records them (`mcp`, `api`,
//! and a `command` client that emits events).
//!
//! A call's name matches an expected name when the name is the call's `tool`, or
//! `SERVER__TOOL` when the call names its server (the `api` client records the two apart).
//! Expected arguments match partially: see [`partial_match`].

use crate::eval::trial::{EventKind, TraceRecord, TOOL_BLOCKED_EVENT};
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::Value;

/// One expected call: a tool name and, optionally, arguments the call's must partially match.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExpectedCall {
    pub name: String,
    #[serde(default)]
    pub arguments: Option<Value>,
}

/// The value of `tools-called`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolsCalled {
    /// The calls that must be made.
    pub tools: Vec<ExpectedCall>,
    /// The calls must come in this order (other calls may come between, unless `exclusive`).
    #[serde(default)]
    pub ordered: bool,
    /// No call other than the expected ones may be made.
    #[serde(default)]
    pub exclusive: bool,
}

/// The value of `tool-call-count`: bounds on the number of calls (to `tool`, or to any tool).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCallCount {
    #[serde(default)]
    pub min: Option<u64>,
    #[serde(default)]
    pub max: Option<u64>,
    /// Shorthand for `min` = `max`.
    #[serde(default)]
    pub exact: Option<u64>,
    #[serde(default)]
    pub tool: Option<String>,
}

/// A built-in assertion on tool calls.
#[derive(Debug, Clone)]
pub enum ToolAssertion {
    /// `tools-called`.
    Called(ToolsCalled),
    /// `tool-call-count`, as inclusive bounds.
    Count {
        min: u64,
        max: Option<u64>,
        tool: Option<String>,
    },
    /// `no-tool-errors`.
    NoErrors,
    /// `tool-not-called`: none of these names is called.
    NotCalled(Vec<String>),
    /// `no-blocked-calls`: the tool proxy refused no call (a dry run's write, a hidden tool).
    NoBlocked,
}

/// One recorded call, as the assertions read it.
struct Call<'a> {
    id: &'a str,
    server: Option<&'a str>,
    tool: &'a str,
    arguments: &'a Value,
}

impl Call<'_> {
    fn is_named(&self, name: &str) -> bool {
        self.tool == name
            || self.server.is_some_and(|s| {
                name.strip_prefix(s).and_then(|r| r.strip_prefix("__")) == Some(self.tool)
            })
    }

    fn matches(&self, expected: &ExpectedCall) -> bool {
        self.is_named(&expected.name)
            && expected
                .arguments
                .as_ref()
                .is_none_or(|want| partial_match(want, self.arguments))
    }

    fn describe(&self, with_arguments: bool) -> String {
        if with_arguments {
            format!("{} {}", self.tool, self.arguments)
        } else {
            self.tool.to_string()
        }
    }
}

fn calls(trace: &TraceRecord) -> Vec<Call<'_>> {
    trace
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::ToolCall {
                id,
                server,
                tool,
                arguments,
            } => Some(Call {
                id,
                server: server.as_deref(),
                tool,
                arguments,
            }),
            _ => None,
        })
        .collect()
}

/// `no-blocked-calls`: passes when no `tool-blocked` event is in `trace`; the reason names the
/// tools refused and why.
fn no_blocked(trace: &TraceRecord) -> (bool, String) {
    let blocked: Vec<String> = trace
        .events
        .iter()
        .filter_map(|e| match &e.kind {
            EventKind::Custom { name, data } if name == TOOL_BLOCKED_EVENT => Some(format!(
                "{} ({})",
                data["tool"].as_str().unwrap_or("?"),
                data["reason"].as_str().unwrap_or("refused")
            )),
            _ => None,
        })
        .collect();
    match blocked.is_empty() {
        true => (true, "no call was blocked".to_string()),
        false => (false, format!("calls were blocked: {}", list(blocked))),
    }
}

/// Whether `actual` holds what `expected` asks for: an object matches an object having each of
/// its keys with a matching value (other keys are ignored), at every depth; an array matches an
/// array of the same length whose elements match in order; numbers match by value (`1` matches
/// `1.0`); anything else (strings, booleans, `null`) must be equal, so `{"key": null}` asks
/// for the key to be present and `null`.
pub fn partial_match(expected: &Value, actual: &Value) -> bool {
    match (expected, actual) {
        (Value::Object(want), Value::Object(have)) => want
            .iter()
            .all(|(key, value)| have.get(key).is_some_and(|h| partial_match(value, h))),
        (Value::Array(want), Value::Array(have)) => {
            want.len() == have.len() && want.iter().zip(have).all(|(w, h)| partial_match(w, h))
        }
        (Value::Number(want), Value::Number(have)) => want.as_f64() == have.as_f64(),
        _ => expected == actual,
    }
}

fn list(items: impl IntoIterator<Item = String>) -> String {
    let items: Vec<String> = items.into_iter().collect();
    if items.is_empty() {
        "nothing".into()
    } else {
        items.join(", ")
    }
}

impl ToolAssertion {
    /// Parses the `value` of assertion `assert` (one of [`NAMES`]); errors name the field.
    pub fn parse(assert: &str, value: Option<&Value>) -> Result<Self> {
        let value = value.filter(|v| !v.is_null());
        let needs = |what: &str| format!("the `{assert}` assertion needs a `value`: {what}");
        let typed = |what: &str| format!("the `{assert}` assertion's `value` is not {what}");
        match assert {
            "tools-called" => {
                let what = r#"{"tools": [{"name", "arguments"?}], "ordered"?, "exclusive"?}"#;
                let value = value.with_context(|| needs(what))?;
                let called: ToolsCalled =
                    serde_json::from_value(value.clone()).with_context(|| typed(what))?;
                if called.tools.is_empty() {
                    bail!("the `tools-called` assertion's `value.tools` is empty: name at least one tool (`tool-not-called` and `tool-call-count` check for none)");
                }
                for (index, call) in called.tools.iter().enumerate() {
                    if call.name.is_empty() {
                        bail!(
                            "the `tools-called` assertion's `value.tools[{index}].name` is empty"
                        );
                    }
                    if call.arguments.as_ref().is_some_and(|a| !a.is_object()) {
                        bail!("the `tools-called` assertion's `value.tools[{index}].arguments` must be an object (its keys are matched partially)");
                    }
                }
                Ok(ToolAssertion::Called(called))
            }
            "tool-call-count" => {
                let what = r#"{"min"?, "max"?, "exact"?, "tool"?}"#;
                let value = value.with_context(|| needs(what))?;
                let count: ToolCallCount =
                    serde_json::from_value(value.clone()).with_context(|| typed(what))?;
                let (min, max) = match (count.exact, count.min, count.max) {
                    (Some(exact), None, None) => (exact, Some(exact)),
                    (Some(_), _, _) => bail!("the `tool-call-count` assertion's `value.exact` cannot go with `min` or `max`"),
                    (None, None, None) => bail!("the `tool-call-count` assertion's `value` needs `min`, `max` or `exact`"),
                    (None, min, max) => (min.unwrap_or(0), max),
                };
                if max.is_some_and(|max| max < min) {
                    bail!("the `tool-call-count` assertion's `value.max` ({}) is below `value.min` ({min})", max.unwrap_or_default());
                }
                if count.tool.as_deref() == Some("") {
                    bail!("the `tool-call-count` assertion's `value.tool` is empty");
                }
                Ok(ToolAssertion::Count {
                    min,
                    max,
                    tool: count.tool,
                })
            }
            "no-tool-errors" => match value {
                None => Ok(ToolAssertion::NoErrors),
                Some(_) => bail!("the `no-tool-errors` assertion takes no `value`"),
            },
            "no-blocked-calls" => match value {
                None => Ok(ToolAssertion::NoBlocked),
                Some(_) => bail!("the `no-blocked-calls` assertion takes no `value`"),
            },
            "tool-not-called" => {
                let what = "a tool name or a list of tool names";
                let names: Vec<String> = match value.with_context(|| needs(what))? {
                    Value::String(name) => vec![name.clone()],
                    other => serde_json::from_value(other.clone()).with_context(|| typed(what))?,
                };
                if names.is_empty() || names.iter().any(String::is_empty) {
                    bail!("the `tool-not-called` assertion's `value` needs non-empty tool names");
                }
                Ok(ToolAssertion::NotCalled(names))
            }
            other => bail!("`{other}` is not a tool assertion"),
        }
    }

    /// Checks `trace`: whether it passes, and a reason saying what was expected and what
    /// happened.
    pub fn check(&self, trace: &TraceRecord) -> (bool, String) {
        let calls = calls(trace);
        match self {
            ToolAssertion::Called(expected) => check_called(expected, &calls),
            ToolAssertion::Count { min, max, tool } => {
                let n = calls
                    .iter()
                    .filter(|c| tool.as_deref().is_none_or(|t| c.is_named(t)))
                    .count() as u64;
                let bounds = match max {
                    Some(max) if max == min => format!("exactly {min}"),
                    Some(max) => format!("{min} to {max}"),
                    None => format!("at least {min}"),
                };
                let of = tool
                    .as_deref()
                    .map_or("tool calls".to_string(), |t| format!("calls to {t}"));
                let ok = n >= *min && max.is_none_or(|max| n <= max);
                let reason = if ok {
                    format!("{n} {of}")
                } else {
                    format!("expected {bounds} {of}; made {n}")
                };
                (ok, reason)
            }
            ToolAssertion::NoErrors => {
                let failed: Vec<String> = trace
                    .events
                    .iter()
                    .filter_map(|e| match &e.kind {
                        EventKind::ToolResult {
                            id, is_error: true, ..
                        } => Some(
                            calls
                                .iter()
                                .find(|c| c.id == id)
                                .map_or(format!("call {id}"), |c| c.tool.to_string()),
                        ),
                        _ => None,
                    })
                    .collect();
                if failed.is_empty() {
                    (true, format!("no tool errors in {} calls", calls.len()))
                } else {
                    (
                        false,
                        format!("expected no tool errors; errors from: {}", list(failed)),
                    )
                }
            }
            ToolAssertion::NoBlocked => no_blocked(trace),
            ToolAssertion::NotCalled(names) => {
                let hit: Vec<String> = calls
                    .iter()
                    .filter(|c| names.iter().any(|n| c.is_named(n)))
                    .map(|c| c.describe(false))
                    .collect();
                if hit.is_empty() {
                    (true, format!("did not call {}", names.join(", ")))
                } else {
                    (
                        false,
                        format!(
                            "expected no call to {}; called: {}",
                            names.join(", "),
                            list(hit)
                        ),
                    )
                }
            }
        }
    }
}

/// The assertion names this module serves.
pub const NAMES: [&str; 5] = [
    "tools-called",
    "tool-call-count",
    "no-tool-errors",
    "tool-not-called",
    "no-blocked-calls",
];

fn check_called(expected: &ToolsCalled, calls: &[Call<'_>]) -> (bool, String) {
    let with_arguments = expected.tools.iter().any(|t| t.arguments.is_some());
    let wanted = list(expected.tools.iter().map(|t| match &t.arguments {
        Some(args) => format!("{} {args}", t.name),
        None => t.name.clone(),
    }));
    let wanted = match (expected.ordered, expected.exclusive) {
        (true, true) => format!(
            "{} in order and nothing else",
            wanted.replace(", ", " then ")
        ),
        (true, false) => format!("{} in order", wanted.replace(", ", " then ")),
        (false, true) => format!("{wanted} and nothing else"),
        (false, false) => wanted,
    };
    let called = list(calls.iter().map(|c| c.describe(with_arguments)));
    // Which call each expected entry took, if any.
    let taken = if expected.ordered {
        in_order(&expected.tools, calls)
    } else {
        any_order(&expected.tools, calls)
    };
    let all_found = taken.iter().all(Option::is_some);
    let extra = calls.len() > expected.tools.len();
    let ok = all_found && !(expected.exclusive && extra);
    if ok {
        (true, format!("called {wanted}"))
    } else {
        (false, format!("expected {wanted}; called: {called}"))
    }
}

/// The earliest calls matching `tools` in order (a subsequence): greedy is optimal here.
fn in_order(tools: &[ExpectedCall], calls: &[Call<'_>]) -> Vec<Option<usize>> {
    let mut next = 0;
    tools
        .iter()
        .map(|tool| {
            let found = (next..calls.len()).find(|&i| calls[i].matches(tool));
            if let Some(i) = found {
                next = i + 1;
            }
            found
        })
        .collect()
}

/// A distinct call for each of `tools` where one exists (bipartite matching by augmenting
/// paths, so an entry with loose arguments never steals the only call a stricter entry fits).
fn any_order(tools: &[ExpectedCall], calls: &[Call<'_>]) -> Vec<Option<usize>> {
    fn augment(
        tool: usize,
        tools: &[ExpectedCall],
        calls: &[Call<'_>],
        owner: &mut [Option<usize>],
        seen: &mut [bool],
    ) -> bool {
        for call in 0..calls.len() {
            if seen[call] || !calls[call].matches(&tools[tool]) {
                continue;
            }
            seen[call] = true;
            let free = match owner[call] {
                None => true,
                Some(other) => augment(other, tools, calls, owner, seen),
            };
            if free {
                owner[call] = Some(tool);
                return true;
            }
        }
        false
    }
    let mut owner = vec![None; calls.len()];
    for tool in 0..tools.len() {
        augment(
            tool,
            tools,
            calls,
            &mut owner,
            &mut vec![false; calls.len()],
        );
    }
    let mut taken = vec![None; tools.len()];
    for (call, tool) in owner.iter().enumerate() {
        if let Some(tool) = tool {
            taken[*tool] = Some(call);
        }
    }
    taken
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::TraceEvent;
    use serde_json::json;

    /// A trace of `calls` (server, tool, arguments, is_error), each followed by its result.
    fn trace_of(calls: &[(Option<&str>, &str, Value, bool)]) -> TraceRecord {
        let mut events = Vec::new();
        for (index, (server, tool, arguments, is_error)) in calls.iter().enumerate() {
            let id = index.to_string();
            for kind in [
                EventKind::ToolCall {
                    id: id.clone(),
                    server: server.map(str::to_string),
                    tool: tool.to_string(),
                    arguments: arguments.clone(),
                },
                EventKind::ToolResult {
                    id: id.clone(),
                    output: "out".into(),
                    is_error: *is_error,
                    duration_ms: 0,
                },
            ] {
                events.push(TraceEvent {
                    seq: events.len() as u64,
                    at_ms: 0,
                    kind,
                });
            }
        }
        TraceRecord {
            events,
            ..TraceRecord::default()
        }
    }

    fn check(assert: &str, value: Value, trace: &TraceRecord) -> (bool, String) {
        ToolAssertion::parse(assert, Some(&value))
            .unwrap()
            .check(trace)
    }

    fn convert_then_get() -> TraceRecord {
        trace_of(&[
            (
                Some("time"),
                "convert_time",
                json!({"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}),
                false,
            ),
            (Some("time"), "get_time", json!({"timezone": "UTC"}), true),
        ])
    }

    #[test]
    fn partial_match_semantics() {
        let actual = json!({"a": 1, "b": {"c": [1, {"d": "x", "e": 2}]}, "n": null});
        assert!(partial_match(&json!({}), &actual));
        assert!(
            partial_match(&json!({"a": 1.0}), &actual),
            "numbers by value"
        );
        assert!(partial_match(
            &json!({"b": {"c": [1, {"d": "x"}]}}),
            &actual
        ));
        assert!(
            !partial_match(&json!({"b": {"c": [1]}}), &actual),
            "arrays keep their length"
        );
        assert!(
            !partial_match(&json!({"b": {"c": [{"d": "x"}, 1]}}), &actual),
            "and order"
        );
        assert!(partial_match(&json!({"n": null}), &actual));
        assert!(
            !partial_match(&json!({"missing": null}), &actual),
            "null asks for the key"
        );
        assert!(!partial_match(&json!({"a": "1"}), &actual), "types count");
    }

    #[test]
    fn tools_called_in_order_any_order_and_exclusive() {
        let trace = convert_then_get();
        let both = json!([{"name": "get_time"}, {"name": "convert_time"}]);
        assert_eq!(
            check("tools-called", json!({"tools": both}), &trace),
            (true, "called get_time, convert_time".into())
        );
        assert_eq!(
            check(
                "tools-called",
                json!({"tools": both, "ordered": true}),
                &trace
            ),
            (
                false,
                "expected get_time then convert_time in order; called: convert_time, get_time"
                    .into()
            )
        );
        let one = json!({"tools": [{"name": "time__convert_time"}], "exclusive": true});
        assert_eq!(
            check("tools-called", one, &trace),
            (
                false,
                "expected time__convert_time and nothing else; called: convert_time, get_time"
                    .into()
            ),
            "SERVER__TOOL names a call of a server's tool"
        );
        let args = json!({"tools": [{"name": "convert_time", "arguments": {"target_timezone": "Asia/Tokyo"}}]});
        assert!(check("tools-called", args, &trace).0);
        let (ok, reason) = check(
            "tools-called",
            json!({"tools": [{"name": "get_time", "arguments": {"timezone": "Asia/Tokyo"}}]}),
            &trace,
        );
        assert!(!ok);
        assert!(
            reason.starts_with(
                r#"expected get_time {"timezone":"Asia/Tokyo"}; called: convert_time {"#
            ) && reason.ends_with(r#"get_time {"timezone":"UTC"}"#),
            "{reason}"
        );
        // A loose entry must not take the only call the strict one fits.
        let twice = trace_of(&[
            (None, "get_time", json!({"timezone": "UTC"}), false),
            (None, "get_time", json!({"timezone": "Asia/Tokyo"}), false),
        ]);
        let loose_first = json!({"tools": [{"name": "get_time"}, {"name": "get_time", "arguments": {"timezone": "UTC"}}], "exclusive": true});
        assert!(check("tools-called", loose_first, &twice).0);
        let (ok, reason) = check(
            "tools-called",
            json!({"tools": [{"name": "get_time"}]}),
            &TraceRecord::default(),
        );
        assert!(!ok && reason.ends_with("called: nothing"), "{reason}");
    }

    #[test]
    fn a_call_the_proxy_blocked_fails_no_blocked_calls_naming_it() {
        let clean = ToolAssertion::parse("no-blocked-calls", None).unwrap();
        assert_eq!(
            clean.check(&convert_then_get()),
            (true, "no call was blocked".into())
        );
        let mut trace = convert_then_get();
        trace.events.push(crate::eval::trial::TraceEvent {
            seq: 9,
            at_ms: 0,
            kind: EventKind::Custom {
                name: TOOL_BLOCKED_EVENT.into(),
                data: json!({"server": "fs", "tool": "write_file", "reason": "blocked: dry run"}),
            },
        });
        assert_eq!(
            clean.check(&trace),
            (
                false,
                "calls were blocked: write_file (blocked: dry run)".into()
            )
        );
        assert!(ToolAssertion::parse("no-blocked-calls", Some(&json!(1))).is_err());
    }

    #[test]
    fn counts_errors_and_tools_never_called() {
        let trace = convert_then_get();
        assert_eq!(
            check("tool-call-count", json!({"min": 1, "max": 2}), &trace),
            (true, "2 tool calls".into())
        );
        assert_eq!(
            check("tool-call-count", json!({"max": 1}), &trace),
            (false, "expected 0 to 1 tool calls; made 2".into())
        );
        assert_eq!(
            check(
                "tool-call-count",
                json!({"exact": 2, "tool": "get_time"}),
                &trace
            ),
            (false, "expected exactly 2 calls to get_time; made 1".into())
        );
        assert_eq!(
            ToolAssertion::parse("no-tool-errors", None)
                .unwrap()
                .check(&trace),
            (
                false,
                "expected no tool errors; errors from: get_time".into()
            )
        );
        assert!(
            ToolAssertion::parse("no-tool-errors", None)
                .unwrap()
                .check(&TraceRecord::default())
                .0
        );
        assert_eq!(
            check(
                "tool-not-called",
                json!(["delete", "time__get_time"]),
                &trace
            ),
            (
                false,
                "expected no call to delete, time__get_time; called: get_time".into()
            )
        );
        assert_eq!(
            check("tool-not-called", json!("delete"), &trace),
            (true, "did not call delete".into())
        );
    }

    #[test]
    fn malformed_values_name_the_field() {
        let error = |assert: &str, value: Option<Value>| {
            format!(
                "{:#}",
                ToolAssertion::parse(assert, value.as_ref()).unwrap_err()
            )
        };
        for (assert, value, says) in [
            ("tools-called", None, "needs a `value`"),
            (
                "tools-called",
                Some(json!({"tools": []})),
                "`value.tools` is empty",
            ),
            (
                "tools-called",
                Some(json!({"tools": [{"name": "a"}], "order": true})),
                "unknown field `order`",
            ),
            (
                "tools-called",
                Some(json!({"tools": [{"tool": "a"}]})),
                "unknown field `tool`",
            ),
            (
                "tools-called",
                Some(json!({"tools": [{"name": ""}]})),
                "`value.tools[0].name` is empty",
            ),
            (
                "tools-called",
                Some(json!({"tools": [{"name": "a", "arguments": [1]}]})),
                "`value.tools[0].arguments` must be an object",
            ),
            (
                "tool-call-count",
                Some(json!({})),
                "needs `min`, `max` or `exact`",
            ),
            (
                "tool-call-count",
                Some(json!({"min": 3, "max": 1})),
                "`value.max` (1) is below `value.min` (3)",
            ),
            (
                "tool-call-count",
                Some(json!({"exact": 1, "max": 1})),
                "`value.exact` cannot go with",
            ),
            (
                "tool-call-count",
                Some(json!({"min": -1})),
                "`value` is not",
            ),
            ("no-tool-errors", Some(json!(true)), "takes no `value`"),
            (
                "tool-not-called",
                Some(json!([])),
                "needs non-empty tool names",
            ),
            (
                "tool-not-called",
                Some(json!(3)),
                "not a tool name or a list of tool names",
            ),
        ] {
            let got = error(assert, value.clone());
            assert!(got.contains(says), "{assert} {value:?}: {got}");
        }
    }
}
