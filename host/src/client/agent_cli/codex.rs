//! Codex's `codex exec --json` output, read as [`CliEvent`]s.
//!
//! The lines it prints (codex 0.169.0): `thread.started` (the thread id, the same on a
//! resumed run), `turn.started`, `item.started` / `item.updated` / `item.completed` (an item:
//! `agent_message`, `reasoning`, `mcp_tool_call`, `command_execution`, `file_change`,
//! `web_search`, `collab_tool_call`, `todo_list`, `error`), `turn.completed` (the usage: the
//! thread's running total, not the turn's), `turn.failed` and `error` (a failed model call;
//! `Reconnecting... n/m` when it is retried). Its version is not in it.
//!
//! An `mcp_tool_call` names its server (the label in `config.toml`) and the MCP tool's own
//! name (`get-sum`, where the model saw `get_sum` in the `mcp__everything` namespace). Codex's
//! own tools are recorded under [`BUILTIN_SERVER`], named by their item's type
//! (`command_execution`, `file_change`, `web_search`) or, for sub-agents, by the collab tool
//! (`spawn_agent`, …). The output does not show every call: a shell command its sandbox stopped,
//! a call it refused (an escalation under the `never` approval policy) or a tool name it does
//! not know leave no item at all; only the model's next request (the gateway) shows them.

use super::{
    content_text, usage_event, AgentStream, CliErrorKind, CliEvent, StreamState, ToolCall,
};
use serde_json::{json, Value};
use std::time::Duration;

/// The server Codex's own tools are recorded under: `codex__command_execution`.
pub const BUILTIN_SERVER: &str = "codex";
/// How Codex starts the `error` event of a model call it retries.
const RECONNECTING: &str = "Reconnecting...";

/// Reads Codex's stream.
#[derive(Debug)]
pub struct CodexStream {
    state: StreamState,
    /// The turn's last agent message: its answer once the turn completes.
    last_message: Option<String>,
}

impl Default for CodexStream {
    fn default() -> Self {
        Self::new()
    }
}

impl CodexStream {
    /// A stream read from its first line.
    pub fn new() -> Self {
        CodexStream {
            state: StreamState::new("codex"),
            last_message: None,
        }
    }

    /// An item that started (or changed): a tool call, recorded once.
    fn item_started(&mut self, item: &Value, at: Duration, out: &mut Vec<CliEvent>) {
        let id = item["id"].as_str().unwrap_or_default();
        if self.state.is_open(id) {
            return;
        }
        if let Some(call) = tool_call(item) {
            out.push(self.state.call(call.as_call(id), at));
        }
    }

    /// An item that completed: a message, a tool call's result (and the call, when it was
    /// not seen starting), or an error Codex went on after.
    fn item_completed(&mut self, item: &Value, at: Duration, out: &mut Vec<CliEvent>) {
        let kind = item["type"].as_str().unwrap_or_default();
        match kind {
            "agent_message" => {
                let text = item["text"].as_str().unwrap_or_default();
                out.push(CliEvent::assistant(text));
                self.last_message = Some(text.to_string());
            }
            "error" => {
                let text = item["message"].as_str().unwrap_or("an error item");
                out.push(CliEvent::error(CliErrorKind::Warning, text));
            }
            // Neither the model's reasoning nor its to-do list is an event the trace keeps.
            "reasoning" | "todo_list" | "plan" => {}
            _ => match tool_call(item) {
                Some(_) => self.tool_done(item, at, out),
                None => out.extend(self.state.unknown(&format!("item/{kind}"))),
            },
        }
    }

    /// A tool item's result, after its call (recorded here if it was not seen starting).
    fn tool_done(&mut self, item: &Value, at: Duration, out: &mut Vec<CliEvent>) {
        let id = item["id"].as_str().unwrap_or_default();
        if !self.state.is_open(id) {
            self.item_started(item, at, out);
        }
        if item["status"] == "declined" {
            let text = format!("Codex declined to run {}", item["command"]);
            out.push(CliEvent::error(CliErrorKind::Denied, &text));
        }
        let (output, is_error) = tool_result(item);
        out.push(self.state.result(id, &output, is_error, at));
    }

    /// The end of a turn: its usage, and its last message as the answer.
    fn turn_completed(&mut self, line: &Value, out: &mut Vec<CliEvent>) {
        if line["usage"].is_object() {
            let usage = &line["usage"];
            out.push(usage_event(
                usage,
                "input_tokens",
                "output_tokens",
                "thread",
                None,
            ));
        }
        if let Some(text) = self.last_message.take() {
            out.push(self.state.answer(&text));
        }
    }
}

/// A tool item's call: server, tool and arguments (the id is the item's).
struct ItemCall<'a> {
    server: &'a str,
    tool: &'a str,
    arguments: Value,
}

impl ItemCall<'_> {
    fn as_call<'a>(&'a self, id: &'a str) -> ToolCall<'a> {
        ToolCall {
            id,
            server: self.server,
            tool: self.tool,
            arguments: &self.arguments,
        }
    }
}

/// The call a tool item stands for; `None` for an item that is not a tool call.
fn tool_call(item: &Value) -> Option<ItemCall<'_>> {
    let builtin = |tool, arguments| {
        Some(ItemCall {
            server: BUILTIN_SERVER,
            tool,
            arguments,
        })
    };
    match item["type"].as_str()? {
        "mcp_tool_call" => Some(ItemCall {
            server: item["server"].as_str().unwrap_or_default(),
            tool: item["tool"].as_str().unwrap_or_default(),
            arguments: item["arguments"].clone(),
        }),
        "command_execution" => builtin("command_execution", json!({"command": item["command"]})),
        "file_change" => builtin("file_change", json!({"changes": item["changes"]})),
        "web_search" => builtin(
            "web_search",
            json!({"query": item["query"], "action": item["action"]}),
        ),
        "collab_tool_call" => builtin(
            item["tool"].as_str().unwrap_or("collab_tool_call"),
            json!({"prompt": item["prompt"], "receivers": item["receiver_thread_ids"]}),
        ),
        _ => None,
    }
}

/// A completed tool item's output and whether it is an error.
fn tool_result(item: &Value) -> (String, bool) {
    let failed = matches!(item["status"].as_str(), Some("failed" | "declined"));
    match item["type"].as_str().unwrap_or_default() {
        "mcp_tool_call" => {
            let result = &item["result"];
            let output = match item["error"]["message"].as_str() {
                Some(message) => message.to_string(),
                None if result["content"].as_array().is_some_and(|c| !c.is_empty()) => {
                    content_text(&result["content"])
                }
                None => content_text(&result["structured_content"]),
            };
            (output, failed || !item["error"].is_null())
        }
        "command_execution" => {
            let exit = item["exit_code"].as_i64();
            let output = item["aggregated_output"].as_str().unwrap_or_default();
            (
                output.to_string(),
                failed || exit.is_some_and(|code| code != 0),
            )
        }
        "file_change" => {
            let changes = item["changes"].as_array().into_iter().flatten();
            let lines: Vec<String> = changes
                .map(|c| format!("{} {}", c["kind"].as_str().unwrap_or("?"), c["path"]))
                .collect();
            (lines.join("\n"), failed)
        }
        _ => (
            item["status"].as_str().unwrap_or_default().to_string(),
            failed,
        ),
    }
}

impl AgentStream for CodexStream {
    fn parse_line(&mut self, line: &str, at: Duration) -> Vec<CliEvent> {
        let line = match self.state.read(line) {
            Ok(line) => line,
            Err(notes) => return notes,
        };
        let mut out = Vec::new();
        let message = |value: &Value| value["message"].as_str().unwrap_or_default().to_string();
        match line["type"].as_str().unwrap_or_default() {
            "thread.started" => {
                let id = line["thread_id"].as_str().unwrap_or_default();
                out.extend(self.state.session(id));
            }
            "turn.started" => self.last_message = None,
            "item.started" | "item.updated" => self.item_started(&line["item"], at, &mut out),
            "item.completed" => self.item_completed(&line["item"], at, &mut out),
            "turn.completed" => self.turn_completed(&line, &mut out),
            "turn.failed" => {
                let text = message(&line["error"]);
                out.push(CliEvent::error(CliErrorKind::Failed, &text));
            }
            "error" => {
                let text = message(&line);
                let kind = match text.starts_with(RECONNECTING) {
                    true => CliErrorKind::Retry,
                    false => CliErrorKind::Model,
                };
                out.push(CliEvent::error(kind, &text));
            }
            "request_user_input" => {
                let text = "the agent asked the user a question, which nobody answers in a trial";
                out.push(CliEvent::error(CliErrorKind::Warning, text));
            }
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
    use super::super::TOOL_TEXT;
    use super::*;
    use crate::eval::trial::EventKind;

    fn read(fixture: &str) -> (Vec<CliEvent>, CodexStream) {
        super::super::tests::read(CodexStream::new(), fixture)
    }

    const METADATA_WARNING: &str = "Model metadata for `gpt-5.1-codex` not found. Defaulting to \
                                    fallback metadata; this can degrade performance and cause \
                                    issues.";

    #[test]
    fn a_text_answer() {
        let (events, stream) = read(include_str!("fixtures/codex-text.jsonl"));
        assert_eq!(
            kinds(&events),
            ["session", "error", "message", "usage", "answer"]
        );
        assert_eq!(
            events[0],
            CliEvent::Session("01a24956-ade1-7452-a911-b21ec417ab9c".into())
        );
        assert_eq!(
            events[1],
            CliEvent::error(CliErrorKind::Warning, METADATA_WARNING)
        );
        let CliEvent::Trace(EventKind::Custom { name, data }) = &events[3] else {
            panic!("{:?}", events[3]);
        };
        assert_eq!(name, "agent-usage");
        assert_eq!(data["usage"], json!({"inputTokens": 13, "outputTokens": 5}));
        assert_eq!(data["scope"], "thread");
        assert_eq!(data["reported"]["cached_input_tokens"], 0);
        assert_eq!(stream.final_answer(), Some("hello from probe"));
    }

    #[test]
    fn an_mcp_tool_call_and_its_result() {
        let (events, stream) = read(include_str!("fixtures/codex-tool.jsonl"));
        assert_eq!(
            kinds(&events),
            [
                "session",
                "error",
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
                "everything".into(),
                "echo".into(),
                json!({"message": "hi from codex"})
            )]
        );
        assert_eq!(
            results(&events),
            [("item_1".into(), "Echo: hi from codex".into(), false)]
        );
        assert!(matches!(
            &events[3],
            CliEvent::Trace(EventKind::ToolResult {
                duration_ms: 10,
                ..
            })
        ));
        assert!(stream
            .final_answer()
            .unwrap()
            .starts_with("The tool said: "));
    }

    #[test]
    fn a_tool_that_fails_is_an_error_result_under_its_own_name() {
        let (events, stream) = read(include_str!("fixtures/codex-tool-error.jsonl"));
        assert_eq!(
            calls(&events),
            [(
                "everything".into(),
                "get-sum".into(),
                json!({"a": "not a number"})
            )]
        );
        let results = results(&events);
        assert!(results[0]
            .1
            .starts_with("MCP error -32602: Input validation error"));
        assert!(results[0].2, "is_error");
        assert!(stream.final_answer().is_some());
    }

    #[test]
    fn a_model_error_fails_the_turn_without_an_answer() {
        let (events, stream) = read(include_str!("fixtures/codex-model-error.jsonl"));
        let found = errors(&events);
        use CliErrorKind::*;
        assert_eq!(error_kinds(&events), [Warning, Model, Failed]);
        assert_eq!(found[2].message, "stand-in refuses this request");
        assert_eq!(stream.final_answer(), None);
        let (events, _) = read(include_str!("fixtures/codex-retry.jsonl"));
        assert_eq!(error_kinds(&events), [Warning, Retry, Model, Failed]);
    }

    #[test]
    fn a_shell_command_is_the_codex_server() {
        let (events, _) = read(include_str!("fixtures/codex-shell.jsonl"));
        let command = "/bin/bash -lc 'echo hi > made-by-shell.txt'";
        assert_eq!(
            calls(&events),
            [(
                "codex".into(),
                "command_execution".into(),
                json!({"command": command})
            )]
        );
        assert_eq!(results(&events), [("item_1".into(), String::new(), false)]);
        // What the stream cannot tell: the sandbox stopped the same command, and Codex printed
        // no item for it, only the model's answer quoting the tool's output.
        let (events, _) = read(include_str!("fixtures/codex-shell-sandboxed.jsonl"));
        assert_eq!(calls(&events), []);
    }

    #[test]
    fn tool_items_seen_only_completed_and_declined_commands() {
        let mut stream = CodexStream::new();
        let at = Duration::from_millis(7);
        let line = json!({"type": "item.completed", "item": {
            "id": "item_3", "type": "command_execution", "command": "rm -rf /",
            "aggregated_output": "", "exit_code": null, "status": "declined"}});
        let events = stream.parse_line(&line.to_string(), at);
        assert_eq!(kinds(&events), ["tool-call", "error", "tool-result"]);
        assert_eq!(errors(&events)[0].kind, CliErrorKind::Denied);
        assert!(results(&events)[0].2);
        let line = json!({"type": "item.completed", "item": {
            "id": "item_4", "type": "file_change", "status": "completed",
            "changes": [{"path": "a.txt", "kind": "add"}]}});
        let events = stream.parse_line(&line.to_string(), at);
        assert_eq!(calls(&events)[0].1, "file_change");
        assert_eq!(results(&events)[0].1, r#"add "a.txt""#);
    }

    #[test]
    fn a_huge_tool_result_is_kept_within_the_cap() {
        let mut stream = CodexStream::new();
        let huge = "y".repeat(10 * 1024 * 1024);
        let line = json!({"type": "item.completed", "item": {
            "id": "item_1", "type": "mcp_tool_call", "server": "everything", "tool": "echo",
            "arguments": {"message": "z".repeat(TOOL_TEXT)}, "status": "completed", "error": null,
            "result": {"content": [{"type": "text", "text": huge}], "structured_content": null}}});
        let events = stream.parse_line(&line.to_string(), Duration::ZERO);
        let kept: usize = events.iter().map(|e| format!("{e:?}").len()).sum();
        assert!(kept < 3 * TOOL_TEXT, "{kept}");
        let (_, output, _) = &results(&events)[0];
        assert!(output.ends_with(&format!(
            "[cut by mst: kept {TOOL_TEXT} of {} bytes]",
            huge.len()
        )));
        assert!(
            calls(&events)[0].2.is_string(),
            "the arguments, as capped JSON text"
        );
    }
}
