//! Claude Code's `--output-format stream-json --verbose` output, read as [`CliEvent`]s.
//!
//! The lines it prints (claude-code 2.1.328): `system` (`init` with the session id, the
//! version and the MCP servers' status; `api_retry`; `permission_denied`), `assistant` (one
//! line per content block: `text`, `tool_use`; a failed model call as a synthetic message
//! marked `is_api_error_message`), `user` (the `tool_result` blocks, with `tool_result_meta`
//! saying when a call did not run) and a last `result` (the answer, `is_error`, the usage and
//! cost of the whole run, the permission denials). Every line carries the `session_id`.
//!
//! An MCP tool is named `mcp__{server}__{tool}`, the server's label and the tool's name as
//! Claude Code normalises them (characters other than letters, digits, `_` and `-` become `_`:
//! label `my.time` gives `mcp__my_time__…`). The call is recorded with the label as the `init`
//! line names the server (as configured) and the tool's own name when the line's
//! `tool_use_meta` gives it. Claude Code's own tools (`Bash`, `Read`, `Edit`, `Task`, …) are
//! recorded under the server [`BUILTIN_SERVER`].

use super::{
    content_text, usage_event, AgentStream, CliErrorKind, CliEvent, StreamState, ToolCall,
};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The server Claude Code's own tools are recorded under: `claude-code__Bash`.
pub const BUILTIN_SERVER: &str = "claude-code";
/// How Claude Code names an MCP tool: `mcp__{server}__{tool}`.
const MCP_PREFIX: &str = "mcp__";
/// Between the server and the tool in an MCP tool's name.
const SEPARATOR: &str = "__";

/// Reads Claude Code's stream.
#[derive(Debug)]
pub struct ClaudeStream {
    state: StreamState,
    /// The calls whose denial was already told, so the result line does not tell it again.
    denied: HashSet<String>,
    /// The MCP servers' labels by their names in tool names ([`normalised`]).
    labels: HashMap<String, String>,
}

impl Default for ClaudeStream {
    fn default() -> Self {
        Self::new()
    }
}

impl ClaudeStream {
    /// A stream read from its first line.
    pub fn new() -> Self {
        ClaudeStream {
            state: StreamState::new("claude-code"),
            denied: HashSet::new(),
            labels: HashMap::new(),
        }
    }

    /// `system` lines: the run's start, retried model calls, denied tool calls.
    fn system(&mut self, line: &Value, out: &mut Vec<CliEvent>) {
        match line["subtype"].as_str().unwrap_or_default() {
            "init" => {
                if let Some(version) = line["claude_code_version"].as_str() {
                    out.push(CliEvent::Version(version.to_string()));
                }
                let servers = line["mcp_servers"].as_array().into_iter().flatten();
                for server in servers {
                    let name = server["name"].as_str().unwrap_or("?");
                    self.labels.insert(normalised(name), name.to_string());
                    let status = server["status"].as_str().unwrap_or("?");
                    if status != "connected" {
                        let text =
                            format!("MCP server `{name}` is {status}: its tools are missing");
                        out.push(CliEvent::error(CliErrorKind::Warning, &text));
                    }
                }
            }
            "api_retry" => {
                let text = format!(
                    "attempt {} of {}: {} {}; retrying in {} ms",
                    line["attempt"],
                    line["max_retries"],
                    line["error_status"],
                    line["error"].as_str().unwrap_or_default(),
                    line["retry_delay_ms"]
                );
                out.push(CliEvent::error(CliErrorKind::Retry, &text));
            }
            "permission_denied" => {
                let id = line["tool_use_id"].as_str().unwrap_or_default();
                self.denied.insert(id.to_string());
                let text = line["message"].as_str().unwrap_or("a tool call was denied");
                out.push(CliEvent::error(CliErrorKind::Denied, text));
            }
            other => out.extend(self.state.unknown(&format!("system/{other}"))),
        }
    }

    /// `assistant` lines: the model's text and tool calls, or a failed model call.
    fn assistant(&mut self, line: &Value, at: Duration, out: &mut Vec<CliEvent>) {
        if line["is_api_error_message"] == true {
            let text = format!(
                "{} {}: {}",
                line["api_error_status"],
                line["api_error_type"].as_str().unwrap_or("error"),
                content_text(&line["message"]["content"])
            );
            out.push(CliEvent::error(CliErrorKind::Model, &text));
            return;
        }
        let content = line["message"]["content"].as_array().into_iter().flatten();
        for block in content {
            match block["type"].as_str().unwrap_or_default() {
                "text" => match block["text"].as_str() {
                    Some(text) if !text.is_empty() => out.push(CliEvent::assistant(text)),
                    _ => {}
                },
                "tool_use" => out.push(self.tool_use(line, block, at)),
                // The model's reasoning is not an event the trace keeps.
                "thinking" | "redacted_thinking" => {}
                other => out.extend(self.state.unknown(&format!("assistant/{other}"))),
            }
        }
    }

    /// A `tool_use` block as a tool call: an MCP tool's server and name split apart.
    fn tool_use(&mut self, line: &Value, block: &Value, at: Duration) -> CliEvent {
        let id = block["id"].as_str().unwrap_or_default();
        let name = block["name"].as_str().unwrap_or_default();
        let meta = line["tool_use_meta"].as_array().into_iter().flatten();
        let own_name = meta
            .filter(|meta| meta["id"] == id)
            .find_map(|meta| meta["tool_name"].as_str());
        let (server, tool) = route(&self.labels, name, own_name);
        let call = ToolCall {
            id,
            server: &server,
            tool: &tool,
            arguments: &block["input"],
        };
        self.state.call(call, at)
    }

    /// `user` lines: tool results, and the calls that did not run.
    fn user(&mut self, line: &Value, at: Duration, out: &mut Vec<CliEvent>) {
        let content = line["message"]["content"].as_array().into_iter().flatten();
        for block in content.filter(|block| block["type"] == "tool_result") {
            let id = block["tool_use_id"].as_str().unwrap_or_default();
            let meta = line["tool_result_meta"].as_array().into_iter().flatten();
            let not_run = meta
                .filter(|meta| meta["id"] == id)
                .find_map(|meta| meta["non_execution_kind"].as_str());
            if let Some(why) = not_run.filter(|_| self.denied.insert(id.to_string())) {
                let text = format!("tool call {id} did not run: {why}");
                out.push(CliEvent::error(CliErrorKind::Denied, &text));
            }
            let output = content_text(&block["content"]);
            let is_error = block["is_error"] == true;
            out.push(self.state.result(id, &output, is_error, at));
        }
    }

    /// The `result` line: the usage, denials not told yet, and the answer or the failure.
    fn result(&mut self, line: &Value, out: &mut Vec<CliEvent>) {
        if line["usage"].is_object() {
            let cost = line["total_cost_usd"].as_f64();
            let usage = &line["usage"];
            out.push(usage_event(
                usage,
                "input_tokens",
                "output_tokens",
                "run",
                cost,
            ));
        }
        let denials = line["permission_denials"].as_array().into_iter().flatten();
        for denial in denials {
            let id = denial["tool_use_id"].as_str().unwrap_or_default();
            if self.denied.insert(id.to_string()) {
                let tool = denial["tool_name"].as_str().unwrap_or("a tool");
                let text = format!("{tool} (call {id}) was denied");
                out.push(CliEvent::error(CliErrorKind::Denied, &text));
            }
        }
        let text = line["result"].as_str();
        let failed = line["is_error"] == true
            || line["subtype"]
                .as_str()
                .is_some_and(|s| s.starts_with("error"));
        match text {
            Some(text) if !failed => out.push(self.state.answer(text)),
            _ => {
                let why = text
                    .or(line["terminal_reason"].as_str())
                    .or(line["subtype"].as_str())
                    .unwrap_or("no reason given");
                out.push(CliEvent::error(CliErrorKind::Failed, why));
            }
        }
    }
}

/// A name as Claude Code puts it in a tool's name: characters other than letters, digits, `_`
/// and `-` become `_`.
fn normalised(name: &str) -> String {
    let keep = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    name.chars()
        .map(|c| if keep(c) { c } else { '_' })
        .collect()
}

/// The server label and the tool's name in `mcp__{server}__{tool}`, by the first that applies:
/// a server of `labels` (label by normalised label, from the `init` line), `own_name` (the
/// tool's own name, from the line's metadata), the first `__`. Any other name is one of Claude
/// Code's own tools.
fn route(labels: &HashMap<String, String>, name: &str, own_name: Option<&str>) -> (String, String) {
    let Some(rest) = name.strip_prefix(MCP_PREFIX) else {
        return (BUILTIN_SERVER.to_string(), name.to_string());
    };
    let tool_after = |server: &str| rest.strip_prefix(server)?.strip_prefix(SEPARATOR);
    let known = labels
        .iter()
        .filter_map(|(normal, label)| Some((normal.len(), label, tool_after(normal)?)))
        .max_by_key(|(length, ..)| *length)
        .map(|(_, label, tool)| (label.clone(), own_name.unwrap_or(tool).to_string()));
    let by_meta = || {
        let tool = own_name?;
        let server = rest
            .strip_suffix(&normalised(tool))?
            .strip_suffix(SEPARATOR)?;
        (!server.is_empty()).then(|| (server.to_string(), tool.to_string()))
    };
    let by_separator = || {
        let (server, tool) = rest.split_once(SEPARATOR)?;
        Some((server.to_string(), tool.to_string()))
    };
    known
        .or_else(by_meta)
        .or_else(by_separator)
        .unwrap_or((BUILTIN_SERVER.to_string(), name.to_string()))
}

impl AgentStream for ClaudeStream {
    fn parse_line(&mut self, line: &str, at: Duration) -> Vec<CliEvent> {
        let line = match self.state.read(line) {
            Ok(line) => line,
            Err(notes) => return notes,
        };
        // The session first: the client holds it as a secret before it records anything.
        let mut out: Vec<CliEvent> = line["session_id"]
            .as_str()
            .and_then(|id| self.state.session(id))
            .into_iter()
            .collect();
        match line["type"].as_str().unwrap_or_default() {
            "system" => self.system(&line, &mut out),
            "assistant" => self.assistant(&line, at, &mut out),
            "user" => self.user(&line, at, &mut out),
            "result" => self.result(&line, &mut out),
            other => out.extend(self.state.unknown(other)),
        }
        out
    }

    fn final_answer(&self) -> Option<&str> {
        self.state.answer.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{calls, error_kinds, errors, kinds, results};
    use super::super::{CliError, TOOL_TEXT};
    use super::*;
    use crate::eval::trial::EventKind;
    use serde_json::json;

    fn read(fixture: &str) -> (Vec<CliEvent>, ClaudeStream) {
        super::super::tests::read(ClaudeStream::new(), fixture)
    }

    fn session(events: &[CliEvent]) -> Vec<&str> {
        events
            .iter()
            .filter_map(|e| match e {
                CliEvent::Session(id) => Some(id.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_text_answer() {
        let (events, stream) = read(include_str!("fixtures/claude-text.jsonl"));
        assert_eq!(events.len(), 5, "{events:#?}");
        assert_eq!(
            events[0],
            CliEvent::Session("41f2f31f-96cd-41ad-8468-5f53bcd5c8cb".into())
        );
        assert_eq!(events[1], CliEvent::Version("2.1.328".into()));
        assert_eq!(events[2], CliEvent::assistant("hello from probe"));
        let CliEvent::Trace(EventKind::Custom { name, data }) = &events[3] else {
            panic!("{:?}", events[3]);
        };
        assert_eq!(name, "agent-usage");
        assert_eq!(data["usage"], json!({"inputTokens": 11, "outputTokens": 3}));
        assert_eq!(data["scope"], "run");
        assert!(data["costUsd"].as_f64().is_some());
        assert_eq!(events[4], CliEvent::Answer("hello from probe".into()));
        assert_eq!(stream.final_answer(), Some("hello from probe"));
    }

    #[test]
    fn an_mcp_tool_call_and_its_result() {
        let (events, stream) = read(include_str!("fixtures/claude-tool.jsonl"));
        assert_eq!(session(&events).len(), 1, "told once");
        assert_eq!(
            kinds(&events),
            [
                "session",
                "version",
                "message",
                "tool-call",
                "tool-result",
                "message",
                "usage",
                "answer"
            ]
        );
        assert_eq!(
            calls(&events),
            [(
                "time".into(),
                "get_current_time".into(),
                json!({"timezone": "Asia/Tokyo"})
            )]
        );
        let results = results(&events);
        assert_eq!(results.len(), 1);
        assert_eq!(results[0].0, "toolu_01");
        assert!(results[0].1.contains(r#""timezone":"Asia/Tokyo""#));
        assert!(!results[0].2);
        // Timed from the call's line to the result's (10 ms a line in these tests).
        assert!(matches!(
            &events[4],
            CliEvent::Trace(EventKind::ToolResult {
                duration_ms: 10,
                ..
            })
        ));
        assert!(stream
            .final_answer()
            .unwrap()
            .starts_with("The tool said: "));
        assert_eq!(errors(&events), []);
    }

    #[test]
    fn a_tool_that_fails_is_an_error_result() {
        let (events, stream) = read(include_str!("fixtures/claude-tool-error.jsonl"));
        let results = results(&events);
        assert_eq!(results.len(), 1);
        assert!(results[0].1.contains("Invalid timezone"), "{results:?}");
        assert!(results[0].2, "is_error");
        assert_eq!(errors(&events), []);
        assert!(stream.final_answer().is_some());
    }

    #[test]
    fn a_model_error_fails_the_run_without_an_answer() {
        let (events, stream) = read(include_str!("fixtures/claude-model-error.jsonl"));
        let errors = errors(&events);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].kind, CliErrorKind::Model);
        assert_eq!(
            errors[0].message,
            "400 invalid_request_error: API Error: 400 stand-in refuses this request"
        );
        assert_eq!(errors[1].kind, CliErrorKind::Failed);
        assert!(!events.iter().any(|e| matches!(
            e,
            CliEvent::Trace(EventKind::Message { .. }) | CliEvent::Answer(_)
        )));
        assert_eq!(stream.final_answer(), None);
    }

    #[test]
    fn retried_model_calls_are_told() {
        let (events, _) = read(include_str!("fixtures/claude-retry.jsonl"));
        use CliErrorKind::*;
        assert_eq!(error_kinds(&events), [Retry, Retry, Model, Failed]);
        assert_eq!(
            errors(&events)[0].message,
            "attempt 1 of 2: 529 overloaded; retrying in 610 ms"
        );
    }

    #[test]
    fn a_denied_mcp_call_is_a_call_an_error_result_and_one_denial() {
        let (events, stream) = read(include_str!("fixtures/claude-denied.jsonl"));
        assert_eq!(calls(&events).len(), 1);
        let results = results(&events);
        assert!(results[0].2 && results[0].1.contains("haven't granted it yet"));
        assert_eq!(
            errors(&events),
            [CliError {
                kind: CliErrorKind::Denied,
                message: "Claude requested permissions to use mcp__time__get_current_time, but you haven't granted it yet.".into()
            }]
        );
        assert!(stream.final_answer().is_some(), "the run itself succeeded");
    }

    #[test]
    fn built_in_tools_are_the_claude_code_server() {
        let (events, _) = read(include_str!("fixtures/claude-bash.jsonl"));
        let arguments =
            json!({"command": "echo hi > made-by-bash.txt", "description": "Write a file"});
        assert_eq!(
            calls(&events),
            [("claude-code".into(), "Bash".into(), arguments)]
        );
        assert_eq!(
            results(&events),
            [(
                "toolu_01".into(),
                "(Bash completed with no output)".into(),
                false
            )]
        );
        let (events, _) = read(include_str!("fixtures/claude-bash-denied.jsonl"));
        assert_eq!(calls(&events)[0].1, "Bash");
        let errors = errors(&events);
        assert_eq!(errors.len(), 1);
        assert!(errors[0].message.starts_with("Output redirection to"));
        assert!(results(&events)[0].2);
    }

    #[test]
    fn mcp_names_split_into_the_configured_label_and_the_tool() {
        let route = |name: &str, own_name: Option<&str>| {
            let labels = HashMap::from([
                (normalised("my.time srv"), "my.time srv".to_string()),
                (normalised("my"), "my".to_string()),
            ]);
            let (server, tool) = super::route(&labels, name, own_name);
            format!("{server} / {tool}")
        };
        // A label the init line named, as configured, the longest first.
        assert_eq!(
            route("mcp__my_time_srv__get_current_time", None),
            "my.time srv / get_current_time"
        );
        assert_eq!(route("mcp__my__get__sum", None), "my / get__sum");
        // A server it did not name: by the tool's own name, or at the first `__`.
        let tool = Some("get.sum");
        assert_eq!(
            route("mcp__other__srv__get_sum", tool),
            "other__srv / get.sum"
        );
        assert_eq!(
            route("mcp__time__get_current_time", None),
            "time / get_current_time"
        );
        assert_eq!(route("Bash", None), "claude-code / Bash");
        assert_eq!(route("mcp__odd", None), "claude-code / mcp__odd");
    }

    #[test]
    fn a_huge_tool_result_is_kept_within_the_cap() {
        let mut stream = ClaudeStream::new();
        let at = Duration::from_millis(5);
        for line in include_str!("fixtures/claude-tool.jsonl").lines().take(3) {
            stream.parse_line(line, at);
        }
        let huge = "x".repeat(10 * 1024 * 1024);
        let line = json!({
            "type": "user",
            "message": {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_01", "content": huge}
            ]},
        })
        .to_string();
        assert!(line.len() > 10 * 1024 * 1024);
        let got = stream.parse_line(&line, Duration::from_millis(25));
        let [CliEvent::Trace(EventKind::ToolResult {
            id,
            output,
            is_error,
            duration_ms,
        })] = &got[..]
        else {
            panic!("{got:?}");
        };
        assert_eq!(
            (id.as_str(), *is_error, *duration_ms),
            ("toolu_01", false, 20)
        );
        assert!(output.len() < TOOL_TEXT + 100, "{}", output.len());
        let note = format!("[cut by mst: kept {TOOL_TEXT} of {} bytes]", huge.len());
        assert!(output.ends_with(&note));
    }
}
