//! The built-in `mock` provider: runs in the worker's own process, with no network, for tests,
//! demos and benchmarks. `mock/echo` answers with the last user message; `mock/script` plays
//! scripted turns (tool calls, then a final text), one per model call. Token counts are
//! estimates (a token per four bytes), so usage and cost have something to add up.

use super::{ModelError, ModelRequest, Reply, ToolCall, Turn, Usage};
use anyhow::{bail, Result};
use serde::Deserialize;

/// One scripted model turn: text, tool calls, or both; a turn without calls ends the loop.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ScriptedTurn {
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub tool_calls: Vec<ScriptedCall>,
}

/// A tool call in a script: the tool's name as the model sees it (`server__tool`) and its
/// arguments.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScriptedCall {
    pub name: String,
    #[serde(default = "empty_object")]
    pub arguments: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::Value::Object(Default::default())
}

/// `clientOptions.mockScript`: one script for every case, or one per case id.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum MockScript {
    /// The same turns for every case.
    All(Vec<ScriptedTurn>),
    /// Turns by case id; a case without any has no script.
    ByCase(std::collections::BTreeMap<String, Vec<ScriptedTurn>>),
}

impl MockScript {
    /// The turns for case `id`, if any.
    pub fn for_case(&self, id: &str) -> Option<&[ScriptedTurn]> {
        match self {
            MockScript::All(turns) => Some(turns),
            MockScript::ByCase(scripts) => scripts.get(id).map(Vec::as_slice),
        }
    }

    /// Checks every script it holds as `model`'s (`mock/script` needs a non-empty one); an
    /// error names the case whose script is wrong.
    pub fn check(&self, model: &str) -> Result<()> {
        match self {
            MockScript::All(turns) => Mock::new(model, Some(turns)).map(|_| ()),
            MockScript::ByCase(scripts) => scripts.iter().try_for_each(|(case, turns)| {
                Mock::new(model, Some(turns))
                    .map(|_| ())
                    .map_err(|e| e.context(format!("clientOptions.mockScript.{case}")))
            }),
        }
    }
}

/// A mock model.
#[derive(Debug, Clone)]
pub enum Mock {
    Echo,
    Script(Vec<ScriptedTurn>),
}

impl Mock {
    /// `echo`, or `script` with its turns.
    pub fn new(model: &str, script: Option<&[ScriptedTurn]>) -> Result<Self> {
        match (model, script) {
            ("echo", _) => Ok(Mock::Echo),
            ("script", Some(turns)) if !turns.is_empty() => Ok(Mock::Script(turns.to_vec())),
            ("script", _) => bail!(
                "model `mock/script` needs `clientOptions.mockScript`: a list of turns \
                 (`{{\"toolCalls\": [{{\"name\", \"arguments\"}}]}}`, then `{{\"text\"}}`), or an \
                 object of such lists by case id"
            ),
            (other, _) => bail!("model `mock/{other}`: the mock models are `echo` and `script`"),
        }
    }

    /// The reply to `request`: the script's next turn (one per assistant turn so far).
    pub fn complete(&self, request: &ModelRequest<'_>) -> Result<Reply, ModelError> {
        let (text, calls) = match self {
            Mock::Echo => {
                let last_user = request.turns.iter().rev().find_map(|turn| match turn {
                    Turn::User(text) => Some(text.clone()),
                    _ => None,
                });
                (last_user, Vec::new())
            }
            Mock::Script(turns) => {
                let index = request
                    .turns
                    .iter()
                    .filter(|t| matches!(t, Turn::Assistant { .. }))
                    .count();
                let Some(turn) = turns.get(index) else {
                    return Err(ModelError(format!(
                        "the mock script has {} turn(s), and the model was asked for turn {}",
                        turns.len(),
                        index + 1
                    )));
                };
                let calls = turn
                    .tool_calls
                    .iter()
                    .enumerate()
                    .map(|(n, call)| ToolCall {
                        id: format!("call-{}-{}", index + 1, n + 1),
                        name: call.name.clone(),
                        arguments: call.arguments.clone(),
                    })
                    .collect();
                (turn.text.clone(), calls)
            }
        };
        let usage = Usage {
            input_tokens: estimate(request),
            output_tokens: text.as_deref().map_or(0, |t| t.len() as u64 / 4 + 1),
        };
        Ok(Reply { text, calls, usage })
    }
}

/// About a token per four bytes of what the model was sent.
fn estimate(request: &ModelRequest<'_>) -> u64 {
    let bytes: usize = request
        .turns
        .iter()
        .map(|turn| match turn {
            Turn::User(text) => text.len(),
            Turn::Assistant { text, calls } => {
                text.as_deref().map_or(0, str::len)
                    + calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.to_string().len())
                        .sum::<usize>()
            }
            Turn::ToolResults(outputs) => outputs.iter().map(|o| o.output.len()).sum(),
        })
        .sum::<usize>()
        + request.system.map_or(0, str::len);
    bytes as u64 / 4 + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::{ModelRef, ToolChoice, ToolOutput};

    fn request<'a>(model: &'a ModelRef, turns: &'a [Turn]) -> ModelRequest<'a> {
        ModelRequest {
            model,
            system: None,
            turns,
            tools: &[],
            tool_choice: ToolChoice::Auto,
            max_tokens: 100,
            temperature: None,
        }
    }

    #[test]
    fn echo_answers_the_last_user_message() {
        let model = ModelRef::parse("mock/echo").unwrap();
        let turns = [Turn::User("what time is it?".into())];
        let reply = Mock::new("echo", None)
            .unwrap()
            .complete(&request(&model, &turns))
            .unwrap();
        assert_eq!(reply.text.as_deref(), Some("what time is it?"));
        assert!(reply.calls.is_empty() && reply.usage.input_tokens > 0);
    }

    #[test]
    fn a_script_plays_one_turn_per_call_and_says_when_it_runs_out() {
        let script: Vec<ScriptedTurn> = serde_json::from_str(
            r#"[{"toolCalls": [{"name": "time__now", "arguments": {"tz": "UTC"}}]},
                {"text": "It is noon."}]"#,
        )
        .unwrap();
        let mock = Mock::new("script", Some(&script)).unwrap();
        let model = ModelRef::parse("mock/script").unwrap();
        let mut turns = vec![Turn::User("time?".into())];
        let first = mock.complete(&request(&model, &turns)).unwrap();
        assert_eq!(first.calls[0].name, "time__now");
        assert_eq!(first.calls[0].arguments["tz"], "UTC");
        turns.push(Turn::Assistant {
            text: None,
            calls: first.calls.clone(),
        });
        turns.push(Turn::ToolResults(vec![ToolOutput {
            id: first.calls[0].id.clone(),
            output: "12:00".into(),
            is_error: false,
        }]));
        let second = mock.complete(&request(&model, &turns)).unwrap();
        assert_eq!(second.text.as_deref(), Some("It is noon."));
        turns.push(Turn::Assistant {
            text: second.text,
            calls: vec![],
        });
        let over = mock.complete(&request(&model, &turns)).unwrap_err();
        assert!(over.0.contains("has 2 turn(s)"), "{over}");
        assert!(Mock::new("script", None).is_err());
        assert!(Mock::new("oracle", None).is_err());
    }
}
