//! Agent CLIs' JSON output read as trace events. Claude Code (`claude -p PROMPT
//! --output-format stream-json --verbose`, [`claude`]) and Codex (`codex exec --json PROMPT`,
//! [`codex`]) print one JSON object a line; a parser turns each line into [`CliEvent`]s: the
//! same `message`, `tool-call` and `tool-result` events the `api` client records, so the
//! built-in tool assertions grade an agent CLI's calls as they grade the `api` client's.
//!
//! A parser is pure: the client that runs the CLI hands it each stdout line with the moment it
//! was read, records what [`CliEvent::into_trace_event`] gives, holds the session id for
//! redaction and keeps the final answer. Nothing a CLI prints ends a trial here: a line that
//! is not a JSON object becomes a `log` note, an unknown type too (once), an unknown field is
//! passed over, and what is kept of any one line is capped ([`TOOL_TEXT`], [`MESSAGE_TEXT`],
//! [`MAX_LINE`]).
//!
//! Tool calls name their server as the `api` client does: an MCP tool by the label of its
//! server (Claude's `mcp__{server}__{tool}` split in two, Codex's `mcp_tool_call` items as they
//! are), and the CLI's own tools by [`claude::BUILTIN_SERVER`] (`claude-code__Bash`, …) or
//! [`codex::BUILTIN_SERVER`] (`codex__command_execution`, …), so an eval can assert that an
//! agent did not run a shell. Usage is the agent's claim, recorded as a `custom` event named
//! [`AGENT_USAGE`] (not `usage`: mst measures usage at its gateway and counts only that).
//!
//! How the CLIs ran without a prompt, offline, with MCP servers (claude-code 2.1.328, codex
//! 0.169.0; `fixtures/README.md` has the full lines):
//! - Claude: `--mcp-config FILE --strict-mcp-config`, and either `--allowedTools mcp__time Bash`
//!   (anything else is denied, never asked) or `--permission-mode bypassPermissions` (as root
//!   only with `IS_SANDBOX=1`; `--dangerously-skip-permissions` is refused as root).
//! - Codex: `exec` never asks (its approval policy is always `never`); `--sandbox
//!   workspace-write` or `danger-full-access` lets its shell write, the default `read-only`
//!   does not.

pub mod claude;
pub mod codex;
pub mod launch;

use crate::eval::trial::EventKind;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

/// Bytes kept of a tool's result, of its arguments (as JSON text) and of an error or a note.
pub const TOOL_TEXT: usize = 64 * 1024;
/// Bytes kept of a message's text and of the final answer.
pub const MESSAGE_TEXT: usize = 1024 * 1024;
/// Lines longer than this are not read at all, only noted: reading one as JSON costs several
/// times its size in memory.
pub const MAX_LINE: usize = 16 * 1024 * 1024;
/// The name of the `custom` event holding the usage an agent CLI reports.
pub const AGENT_USAGE: &str = "agent-usage";
/// Unknown types noted per stream: past this many a new one goes unsaid.
const MAX_NOTED: usize = 64;

/// An agent CLI's stdout, read a line at a time.
pub trait AgentStream {
    /// What one line says, in order; `at` is when it was read (from the trial's start), which
    /// times a tool call's result from its call.
    fn parse_line(&mut self, line: &str, at: Duration) -> Vec<CliEvent>;
    /// The final answer, once the CLI has given one (never for a run that failed).
    fn final_answer(&self) -> Option<&str>;
}

/// What a line of an agent CLI's output says, in mst's terms.
#[derive(Debug, Clone, PartialEq)]
pub enum CliEvent {
    /// A trace event as it is recorded: a message, a tool call or result, the agent's
    /// [`AGENT_USAGE`], a note.
    Trace(EventKind),
    /// Something went wrong, and which kind of thing.
    Error(CliError),
    /// The CLI's final answer.
    Answer(String),
    /// The id that continues the conversation (Claude's session, Codex's thread): a resume
    /// token, so never recorded in the trace. Told again only when it changes.
    Session(String),
    /// The CLI's version, when its output says it (Claude's does, Codex's does not).
    Version(String),
}

/// An error an agent CLI reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliError {
    pub kind: CliErrorKind,
    pub message: String,
}

/// What kind of error a CLI reported: what it means for the trial.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CliErrorKind {
    /// A model call failed and the CLI tries it again: nothing lost yet.
    Retry,
    /// A model call failed for good (the model server's error).
    Model,
    /// The run ended in failure (Claude's `is_error` result, Codex's `turn.failed`).
    Failed,
    /// A tool call was refused permission and did not run (its result says so too).
    Denied,
    /// The CLI reported an error it went on after (Codex's `error` items, an MCP server that
    /// did not connect).
    Warning,
}

impl CliErrorKind {
    /// How the trace's note names it.
    fn label(self) -> &'static str {
        match self {
            CliErrorKind::Retry => "model call retried",
            CliErrorKind::Model => "model error",
            CliErrorKind::Failed => "run failed",
            CliErrorKind::Denied => "permission denied",
            CliErrorKind::Warning => "warning",
        }
    }
}

impl CliEvent {
    /// The event the trace records for this, if any: an error or a version as a `log` note;
    /// nothing for the answer (the trace's final text) or the session (a secret).
    pub fn into_trace_event(self) -> Option<EventKind> {
        match self {
            CliEvent::Trace(kind) => Some(kind),
            CliEvent::Error(error) => Some(EventKind::Log {
                text: format!("{}: {}", error.kind.label(), error.message),
            }),
            CliEvent::Version(version) => Some(EventKind::Log {
                text: format!("agent CLI version {version}"),
            }),
            CliEvent::Answer(_) | CliEvent::Session(_) => None,
        }
    }

    /// An error of `kind`, its message capped.
    fn error(kind: CliErrorKind, message: &str) -> Self {
        CliEvent::Error(CliError {
            kind,
            message: capped(message, TOOL_TEXT),
        })
    }

    /// A note in the trace.
    fn note(text: String) -> Self {
        CliEvent::Trace(EventKind::Log { text })
    }

    /// An assistant message, its text capped.
    fn assistant(text: &str) -> Self {
        CliEvent::Trace(EventKind::Message {
            role: "assistant".into(),
            text: capped(text, MESSAGE_TEXT),
        })
    }
}

/// `text`, or its first `max` bytes (cut at a character) and a note saying it was cut.
pub fn capped(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[cut by mst: kept {end} of {} bytes]",
        &text[..end],
        text.len()
    )
}

/// Tool arguments as kept: as they are, or past [`TOOL_TEXT`] as their capped JSON text.
fn capped_value(value: &Value) -> Value {
    let text = value.to_string();
    if text.len() <= TOOL_TEXT {
        value.clone()
    } else {
        Value::String(capped(&text, TOOL_TEXT))
    }
}

/// One tool call as a CLI reports it.
struct ToolCall<'a> {
    id: &'a str,
    server: &'a str,
    tool: &'a str,
    arguments: &'a Value,
}

/// What a parser keeps between lines, whatever the CLI: the open tool calls, the answer, the
/// session told last and the unknown types already noted.
#[derive(Debug, Default)]
struct StreamState {
    /// The CLI's name in notes.
    cli: &'static str,
    /// Tool calls recorded and not yet answered: when each was read, by id.
    open_calls: HashMap<String, Duration>,
    answer: Option<String>,
    session: Option<String>,
    noted: BTreeSet<String>,
}

impl StreamState {
    fn new(cli: &'static str) -> Self {
        StreamState {
            cli,
            ..Default::default()
        }
    }

    /// Reads a line as a JSON object; a line that is not one is a note (a blank one nothing).
    fn read(&self, line: &str) -> Result<Value, Vec<CliEvent>> {
        let line = line.trim();
        if line.is_empty() {
            return Err(Vec::new());
        }
        if line.len() > MAX_LINE {
            let text = format!(
                "{} printed a line of {} bytes, over the {MAX_LINE} read: skipped",
                self.cli,
                line.len()
            );
            return Err(vec![CliEvent::note(text)]);
        }
        match serde_json::from_str::<Value>(line) {
            Ok(value) if value.is_object() => Ok(value),
            _ => {
                let text = format!(
                    "{} printed a line that is not a JSON object: {}",
                    self.cli,
                    capped(line, 1024)
                );
                Err(vec![CliEvent::note(text)])
            }
        }
    }

    /// A note that the CLI printed something of a type this parser does not know, the first
    /// time only.
    fn unknown(&mut self, what: &str) -> Option<CliEvent> {
        if self.noted.len() >= MAX_NOTED || self.noted.contains(what) {
            return None;
        }
        let what = capped(what, 200);
        self.noted.insert(what.clone());
        Some(CliEvent::note(format!(
            "{} printed `{what}`, which mst does not read (noted once)",
            self.cli
        )))
    }

    /// The session event, when `id` is new.
    fn session(&mut self, id: &str) -> Option<CliEvent> {
        if self.session.as_deref() == Some(id) {
            return None;
        }
        self.session = Some(id.to_string());
        Some(CliEvent::Session(id.to_string()))
    }

    /// The answer event, kept as the final answer.
    fn answer(&mut self, text: &str) -> CliEvent {
        let text = capped(text, MESSAGE_TEXT);
        self.answer = Some(text.clone());
        CliEvent::Answer(text)
    }

    /// Whether call `id` was recorded and has no result yet.
    fn is_open(&self, id: &str) -> bool {
        self.open_calls.contains_key(id)
    }

    /// A tool call read at `at`, open until its result.
    fn call(&mut self, call: ToolCall<'_>, at: Duration) -> CliEvent {
        self.open_calls.insert(call.id.to_string(), at);
        CliEvent::Trace(EventKind::ToolCall {
            id: call.id.to_string(),
            server: Some(call.server.to_string()),
            tool: call.tool.to_string(),
            arguments: capped_value(call.arguments),
        })
    }

    /// Call `id`'s result, read at `at`: its duration is from its call's line to this one.
    fn result(&mut self, id: &str, output: &str, is_error: bool, at: Duration) -> CliEvent {
        let called = self.open_calls.remove(id).unwrap_or(at);
        CliEvent::Trace(EventKind::ToolResult {
            id: id.to_string(),
            output: capped(output, TOOL_TEXT),
            is_error,
            duration_ms: at.saturating_sub(called).as_millis() as u64,
        })
    }
}

/// The usage event of a CLI's report: its `input` and `output` fields' tokens as mst counts
/// them, the cost it claims, and its report as it is (`scope` says what it covers: `run` or
/// `thread`).
fn usage_event(
    usage: &Value,
    input: &str,
    output: &str,
    scope: &str,
    cost: Option<f64>,
) -> CliEvent {
    let tokens = |field: &str| usage[field].as_u64().unwrap_or(0);
    let mut data = serde_json::json!({
        "usage": {"inputTokens": tokens(input), "outputTokens": tokens(output)},
        "scope": scope,
        "reported": capped_value(usage),
    });
    if let Some(cost) = cost.filter(|cost| cost.is_finite()) {
        data["costUsd"] = serde_json::json!(cost);
    }
    CliEvent::Trace(EventKind::Custom {
        name: AGENT_USAGE.into(),
        data,
    })
}

/// The text of a tool result's content: a string as it is, the text blocks of a list joined
/// by lines (other blocks named by their type), anything else as JSON.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(blocks) => {
            let texts: Vec<String> = blocks
                .iter()
                .map(|block| match block["text"].as_str() {
                    Some(text) => text.to_string(),
                    None => format!("[{}]", block["type"].as_str().unwrap_or("content")),
                })
                .collect();
            texts.join("\n")
        }
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every event of `fixture` read by `stream`, a line each 10 ms, and the stream after.
    pub(super) fn read<S: AgentStream>(mut stream: S, fixture: &str) -> (Vec<CliEvent>, S) {
        let events = fixture
            .lines()
            .enumerate()
            .flat_map(|(n, line)| stream.parse_line(line, Duration::from_millis(10 * n as u64)))
            .collect();
        (events, stream)
    }

    /// The tool calls among `events`: server, tool and arguments.
    pub(super) fn calls(events: &[CliEvent]) -> Vec<(String, String, Value)> {
        events
            .iter()
            .filter_map(|event| match event {
                CliEvent::Trace(EventKind::ToolCall {
                    server,
                    tool,
                    arguments,
                    ..
                }) => Some((server.clone()?, tool.clone(), arguments.clone())),
                _ => None,
            })
            .collect()
    }

    /// The tool results among `events`: id, output and whether it is an error.
    pub(super) fn results(events: &[CliEvent]) -> Vec<(String, String, bool)> {
        events
            .iter()
            .filter_map(|event| match event {
                CliEvent::Trace(EventKind::ToolResult {
                    id,
                    output,
                    is_error,
                    ..
                }) => Some((id.clone(), output.clone(), *is_error)),
                _ => None,
            })
            .collect()
    }

    /// The errors among `events`.
    pub(super) fn errors(events: &[CliEvent]) -> Vec<CliError> {
        events
            .iter()
            .filter_map(|event| match event {
                CliEvent::Error(error) => Some(error.clone()),
                _ => None,
            })
            .collect()
    }

    /// The kinds of `events` by short names, to compare orders.
    pub(super) fn kinds(events: &[CliEvent]) -> Vec<&'static str> {
        events.iter().map(kind_of).collect()
    }

    /// The kinds of the errors among `events`.
    pub(super) fn error_kinds(events: &[CliEvent]) -> Vec<CliErrorKind> {
        errors(events).iter().map(|error| error.kind).collect()
    }

    fn kind_of(event: &CliEvent) -> &'static str {
        match event {
            CliEvent::Trace(EventKind::Message { .. }) => "message",
            CliEvent::Trace(EventKind::ToolCall { .. }) => "tool-call",
            CliEvent::Trace(EventKind::ToolResult { .. }) => "tool-result",
            CliEvent::Trace(EventKind::Custom { .. }) => "usage",
            CliEvent::Trace(EventKind::Log { .. }) => "log",
            CliEvent::Error(_) => "error",
            CliEvent::Answer(_) => "answer",
            CliEvent::Session(_) => "session",
            CliEvent::Version(_) => "version",
        }
    }

    fn streams() -> Vec<Box<dyn AgentStream>> {
        vec![
            Box::new(claude::ClaudeStream::new()),
            Box::new(codex::CodexStream::new()),
        ]
    }

    /// The trace a client records from `fixture`'s events.
    fn trace_of<S: AgentStream>(stream: S, fixture: &str) -> crate::eval::trial::TraceRecord {
        let (events, stream) = read(stream, fixture);
        let events = events
            .into_iter()
            .filter_map(CliEvent::into_trace_event)
            .enumerate()
            .map(|(seq, kind)| crate::eval::trial::TraceEvent {
                seq: seq as u64,
                at_ms: 0,
                kind,
            })
            .collect();
        crate::eval::trial::TraceRecord {
            events,
            final_text: stream.final_answer().map(str::to_string),
            ..Default::default()
        }
    }

    /// Whether assertion `assert` with `value` passes on `trace`.
    fn passes(assert: &str, value: Value, trace: &crate::eval::trial::TraceRecord) -> bool {
        let value = (!value.is_null()).then_some(value);
        let assertion = crate::grade::tools::ToolAssertion::parse(assert, value.as_ref());
        assertion.unwrap().check(trace).0
    }

    #[test]
    fn the_tool_assertions_grade_agent_cli_traces() {
        use serde_json::json;
        let called = |name: &str, arguments: Value| json!({"tools": [{"name": name, "arguments": arguments}], "exclusive": true});
        let fixture = include_str!("fixtures/claude-tool.jsonl");
        let trace = trace_of(claude::ClaudeStream::new(), fixture);
        let tokyo = json!({"timezone": "Asia/Tokyo"});
        assert!(passes(
            "tools-called",
            called("time__get_current_time", tokyo.clone()),
            &trace
        ));
        assert!(passes(
            "tools-called",
            called("get_current_time", tokyo),
            &trace
        ));
        assert!(passes("tool-call-count", json!({"exact": 1}), &trace));
        assert!(passes("no-tool-errors", Value::Null, &trace));
        assert!(passes(
            "tool-not-called",
            json!(["claude-code__Bash"]),
            &trace
        ));
        let fixture = include_str!("fixtures/claude-bash.jsonl");
        let trace = trace_of(claude::ClaudeStream::new(), fixture);
        assert!(!passes(
            "tool-not-called",
            json!(["claude-code__Bash"]),
            &trace
        ));
        let fixture = include_str!("fixtures/claude-tool-error.jsonl");
        let trace = trace_of(claude::ClaudeStream::new(), fixture);
        assert!(!passes("no-tool-errors", Value::Null, &trace));

        let fixture = include_str!("fixtures/codex-tool.jsonl");
        let trace = trace_of(codex::CodexStream::new(), fixture);
        let hi = json!({"message": "hi from codex"});
        assert!(passes(
            "tools-called",
            called("everything__echo", hi),
            &trace
        ));
        assert!(passes("no-tool-errors", Value::Null, &trace));
        assert!(trace.final_text.is_some());
        let fixture = include_str!("fixtures/codex-shell.jsonl");
        let trace = trace_of(codex::CodexStream::new(), fixture);
        let shell = json!(["codex__command_execution"]);
        assert!(!passes("tool-not-called", shell, &trace));
        let fixture = include_str!("fixtures/codex-tool-error.jsonl");
        let trace = trace_of(codex::CodexStream::new(), fixture);
        assert!(!passes("no-tool-errors", Value::Null, &trace));
    }

    #[test]
    fn garbage_is_a_note_and_blank_lines_are_nothing() {
        for mut stream in streams() {
            let at = Duration::ZERO;
            let events = stream.parse_line("Reading additional input from stdin...", at);
            assert!(
                matches!(&events[..], [CliEvent::Trace(EventKind::Log { text })] if text.contains("not a JSON object: Reading additional")),
                "{events:?}"
            );
            assert_eq!(stream.parse_line("   ", at), []);
            let events = stream.parse_line("[1, 2]", at);
            assert!(matches!(
                &events[..],
                [CliEvent::Trace(EventKind::Log { .. })]
            ));
            // An unknown type is noted once, then goes unsaid.
            let unknown = r#"{"type": "brand-new", "x": 1}"#;
            assert_eq!(stream.parse_line(unknown, at).len(), 1);
            assert_eq!(stream.parse_line(unknown, at), []);
            assert_eq!(stream.final_answer(), None);
        }
    }

    #[test]
    fn a_flood_of_unknown_types_stops_being_noted() {
        let mut stream = claude::ClaudeStream::new();
        let notes: usize = (0..1000)
            .map(|n| {
                let line = format!(r#"{{"type": "t{n}"}}"#);
                stream.parse_line(&line, Duration::ZERO).len()
            })
            .sum();
        assert_eq!(notes, MAX_NOTED);
    }

    #[test]
    fn an_overlong_line_is_skipped_with_a_note() {
        let line = format!(r#"{{"type": "x", "pad": "{}"}}"#, "a".repeat(MAX_LINE));
        for mut stream in streams() {
            let events = stream.parse_line(&line, Duration::ZERO);
            assert!(
                matches!(&events[..], [CliEvent::Trace(EventKind::Log { text })] if text.contains("skipped")),
                "{events:?}"
            );
        }
    }

    #[test]
    fn capping_cuts_at_a_character_and_says_so() {
        assert_eq!(capped("short", 10), "short");
        let cut = capped("ééééé", 5);
        assert!(
            cut.starts_with("éé\n[cut by mst: kept 4 of 10 bytes]"),
            "{cut}"
        );
        let big = serde_json::json!({"message": "x".repeat(TOOL_TEXT * 2)});
        let kept = capped_value(&big);
        assert!(kept.as_str().is_some_and(|t| t.len() < TOOL_TEXT + 100));
        let small = serde_json::json!({"message": "hi"});
        assert_eq!(capped_value(&small), small);
    }

    #[test]
    fn trace_events_keep_the_session_and_answer_out() {
        let error = CliEvent::error(CliErrorKind::Denied, "Bash was not allowed");
        assert_eq!(
            error.into_trace_event(),
            Some(EventKind::Log {
                text: "permission denied: Bash was not allowed".into()
            })
        );
        assert_eq!(CliEvent::Session("s".into()).into_trace_event(), None);
        assert_eq!(CliEvent::Answer("a".into()).into_trace_event(), None);
        assert!(matches!(
            CliEvent::Version("2.1.328".into()).into_trace_event(),
            Some(EventKind::Log { text }) if text == "agent CLI version 2.1.328"
        ));
    }
}
