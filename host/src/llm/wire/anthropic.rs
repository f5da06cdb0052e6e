//! The Anthropic Messages API (`POST /v1/messages`), as Claude Code speaks it: a `system`
//! string or list of text blocks; messages whose content is a string or blocks (`text`,
//! `tool_use`, `tool_result` with a string or blocks, `image` and `document` as a placeholder;
//! `thinking` and `redacted_thinking` dropped); a `system` role among the messages (Claude
//! Code sends one) joins the system prompt. Tools with a `type` other than `custom` are the
//! API's server tools and are dropped; `metadata`, `thinking`, `context_management` and the
//! like are ignored.

use super::fields::At;
use super::sse::Events;
use super::{
    text_of, tool_spec, Conversation, GatewayRequest, Outgoing, Read, RenderHints, Rendered,
    WireError, NOT_TEXT,
};
use crate::llm::{ToolCall, ToolChoice, ToolOutput, ToolSpec};
use serde_json::{json, Value};

pub(super) fn parse(body: &At<'_>) -> Result<GatewayRequest, WireError> {
    let mut conversation = Conversation::default();
    if let Some(system) = body.get("system") {
        conversation.system(text_of(&system, block_text)?);
    }
    for message in body.req("messages")?.items()? {
        read_message(&message, &mut conversation)?;
    }
    Read {
        conversation,
        tools: tools(body)?,
        tool_choice: tool_choice(body)?,
        max_tokens: body.opt_tokens("max_tokens")?,
        hints: RenderHints::default(),
    }
    .into_request(body)
}

fn read_message(message: &At<'_>, conversation: &mut Conversation) -> Result<(), WireError> {
    let role = message.req("role")?;
    let content = message.req("content")?;
    match role.str()? {
        "user" => {
            if content.value().is_array() {
                for block in content.items()? {
                    if block.opt_str("type")? == Some("tool_result") {
                        conversation.output(tool_result(&block)?);
                    }
                }
            }
            conversation.user(text_of(&content, block_text)?);
        }
        "assistant" => read_assistant(&content, conversation)?,
        "system" => conversation.system(text_of(&content, block_text)?),
        _ => return Err(role.wrong("`user`, `assistant` or `system`")),
    }
    Ok(())
}

fn read_assistant(content: &At<'_>, conversation: &mut Conversation) -> Result<(), WireError> {
    if !content.value().is_array() {
        conversation.assistant_text(text_of(content, block_text)?);
        return Ok(());
    }
    conversation.assistant();
    for block in content.items()? {
        if block.opt_str("type")? == Some("tool_use") {
            conversation.call(ToolCall {
                id: block.req("id")?.str()?.to_string(),
                name: block.req("name")?.str()?.to_string(),
                arguments: block
                    .get("input")
                    .map_or_else(|| json!({}), |v| v.value().clone()),
            });
        } else if let Some(text) = block_text(&block)? {
            conversation.assistant_text(text);
        }
    }
    Ok(())
}

/// The text of a content block: `text`'s, a placeholder for an image or a document, `None`
/// for the rest (tool use and results are read apart; thinking is dropped).
fn block_text(block: &At<'_>) -> Result<Option<String>, WireError> {
    match block.req("type")?.str()? {
        "text" => Ok(Some(block.req("text")?.str()?.to_string())),
        "image" | "document" => Ok(Some(NOT_TEXT.to_string())),
        _ => Ok(None),
    }
}

fn tool_result(block: &At<'_>) -> Result<ToolOutput, WireError> {
    Ok(ToolOutput {
        id: block.req("tool_use_id")?.str()?.to_string(),
        output: match block.get("content") {
            Some(content) => text_of(&content, block_text)?,
            None => String::new(),
        },
        is_error: block.opt_bool("is_error")?.unwrap_or(false),
    })
}

fn tools(body: &At<'_>) -> Result<Vec<ToolSpec>, WireError> {
    let mut specs = Vec::new();
    for tool in body.opt_items("tools")? {
        if tool.opt_str("type")?.is_none_or(|kind| kind == "custom") {
            let name = tool.req("name")?.str()?.to_string();
            specs.push(tool_spec(&tool, name, "input_schema")?);
        }
    }
    Ok(specs)
}

fn tool_choice(body: &At<'_>) -> Result<ToolChoice, WireError> {
    let Some(choice) = body.get("tool_choice") else {
        return Ok(ToolChoice::Auto);
    };
    let kind = choice.req("type")?;
    match kind.str()? {
        "auto" => Ok(ToolChoice::Auto),
        // A named tool is forced as any tool: mst's requests name none.
        "any" | "tool" => Ok(ToolChoice::Required),
        "none" => Ok(ToolChoice::None),
        _ => Err(kind.wrong("`auto`, `any`, `tool` or `none`")),
    }
}

/// The reply's content blocks: its text, then its tool calls.
fn blocks(reply: &Outgoing<'_>) -> Vec<Value> {
    let text = reply.text.map(|text| json!({"type": "text", "text": text}));
    text.into_iter()
        .chain(reply.calls.iter().map(|call| {
            json!({"type": "tool_use", "id": call.id, "name": call.name, "input": call.arguments})
        }))
        .collect()
}

/// The message, with `content` and the usage so far (`output_tokens`).
fn message(reply: &Outgoing<'_>, content: Vec<Value>, stop: Value, output_tokens: u64) -> Value {
    json!({
        "id": format!("msg_{}", reply.id),
        "type": "message",
        "role": "assistant",
        "model": reply.model,
        "content": content,
        "stop_reason": stop,
        "stop_sequence": null,
        "usage": {
            "input_tokens": reply.usage.input_tokens,
            "output_tokens": output_tokens,
            "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
        },
    })
}

pub(super) fn render(reply: &Outgoing<'_>) -> Rendered {
    let stop = if reply.calls_tools() {
        "tool_use"
    } else {
        "end_turn"
    };
    if !reply.stream {
        let output_tokens = reply.usage.output_tokens;
        return Rendered::json(&message(reply, blocks(reply), json!(stop), output_tokens));
    }
    let mut events = Events::default();
    events
        .typed(json!({"type": "message_start", "message": message(reply, vec![], Value::Null, 1)}));
    events.typed(json!({"type": "ping"}));
    for (index, block) in blocks(reply).into_iter().enumerate() {
        let delta = match block["type"].as_str() {
            Some("text") => json!({"type": "text_delta", "text": block["text"]}),
            _ => json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
        };
        let mut start = block;
        match start["type"].as_str() {
            Some("text") => start["text"] = json!(""),
            _ => start["input"] = json!({}),
        }
        events
            .typed(json!({"type": "content_block_start", "index": index, "content_block": start}));
        events.typed(json!({"type": "content_block_delta", "index": index, "delta": delta}));
        events.typed(json!({"type": "content_block_stop", "index": index}));
    }
    events.typed(json!({
        "type": "message_delta",
        "delta": {"stop_reason": stop, "stop_sequence": null},
        "usage": {"output_tokens": reply.usage.output_tokens},
    }));
    events.typed(json!({"type": "message_stop"}));
    events.finish()
}

pub(super) fn render_error(status: u16, message: &str) -> Rendered {
    let kind = match status {
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        529 => "overloaded_error",
        500.. => "api_error",
        _ => "invalid_request_error",
    };
    Rendered::json(&json!({"type": "error", "error": {"type": kind, "message": message}}))
}

#[cfg(test)]
mod tests {
    use super::super::sse;
    use super::super::tests::tool_conversation;
    use super::super::tests::{call, fixture, json_of, parse, refusal, reply, reply_of};
    use super::super::{GatewayRequest, Wire, DEFAULT_MAX_TOKENS, NOT_TEXT};
    use crate::llm::{ToolChoice, Turn};
    use serde_json::{json, Value};

    #[test]
    fn reads_what_claude_code_sends() {
        let request = Wire::Anthropic
            .parse_request(&fixture("claude-code-say-hi.json"))
            .unwrap();
        assert_eq!(request.model, "claude-opus-5-5");
        assert!(request.stream);
        assert_eq!(request.max_tokens, 128000);
        assert_eq!(request.tool_choice, ToolChoice::Auto);
        let system = request.system.as_deref().unwrap();
        assert!(system.contains("\n\nYou are a Claude agent"), "{system}");
        // The system message among the messages joins the system prompt.
        assert!(
            system.contains("\n\n# Environment\nYou have been invoked"),
            "{system}"
        );
        let [Turn::User(text)] = request.turns.as_slice() else {
            panic!("{:?}", request.turns);
        };
        assert!(text.starts_with("<system-reminder>"), "{text}");
        assert!(text.ends_with("\n\nsay hi"), "{text}");
        let names: Vec<_> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["Bash", "mcp__time__get_current_time"]);
        assert_eq!(
            request.tools[1].input_schema["required"],
            json!(["timezone"])
        );
    }

    #[test]
    fn reads_claude_code_s_request_after_a_tool_call() {
        // Claude Code's request after the gateway streamed it a call of an MCP tool.
        let request = Wire::Anthropic
            .parse_request(&fixture("claude-code-tool-result.json"))
            .unwrap();
        let system = request.system.as_deref().unwrap();
        assert!(system.contains("\n\n# Environment\n"), "{system}");
        let turns = serde_json::to_value(&request.turns[1..]).unwrap();
        let expected = json!([
            {"assistant": {"text": "Let me check.", "calls": [{"id": "call-1-1",
                "name": "mcp__time__get_current_time", "arguments": {"timezone": "UTC"}}]}},
            {"toolResults": [{"id": "call-1-1", "isError": false,
                "output": "{\"timezone\":\"UTC\",\"datetime\":\"2026-12-06T03:24:28+00:00\",\"day_of_week\":\"Sunday\",\"is_dst\":false}"}]}]);
        assert_eq!(turns, expected);
    }

    /// The next request of a Claude Code conversation: `previous` plus the rendered `answer`
    /// as the assistant's message and `then` as the user's.
    fn next(previous: &Value, answer: &Value, then: Value) -> Value {
        let mut body = previous.clone();
        let messages = body["messages"].as_array_mut().unwrap();
        messages.push(json!({"role": "assistant", "content": answer["content"]}));
        messages.push(json!({"role": "user", "content": then}));
        body
    }

    #[test]
    fn a_tool_calling_conversation_round_trips() {
        let body = json!({"model": "claude-x", "max_tokens": 1000, "system": "Be brief.",
            "tools": [{"name": "mcp__time__get_current_time", "input_schema": {"type": "object"}},
                      {"type": "web_search_20250305", "name": "web_search"}],
            "messages": [{"role": "user", "content": "What time is it in Paris?"}]});
        let request = parse(Wire::Anthropic, &body);
        assert_eq!(request.tools.len(), 1, "server tools are dropped");
        let answer = json_of(&Wire::Anthropic.render(&reply_of(1), &request));
        assert_eq!(answer["stop_reason"], "tool_use");
        let result = json!([{"type": "tool_result", "tool_use_id": "call-1-1",
                             "content": [{"type": "text", "text": "12:00"}]}]);
        let body = next(&body, &answer, result);
        let request = parse(Wire::Anthropic, &body);
        let answer = json_of(&Wire::Anthropic.render(&reply_of(3), &request));
        assert_eq!(answer["stop_reason"], "end_turn");
        let request = parse(Wire::Anthropic, &next(&body, &answer, json!("Thanks.")));
        let mut expected = tool_conversation();
        expected.push(Turn::User("Thanks.".into()));
        assert_eq!(request.turns, expected);
        assert_eq!(request.system.as_deref(), Some("Be brief."));
    }

    #[test]
    fn keeps_text_and_results_and_drops_thinking() {
        let body = json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "text", "text": "look"},
                                         {"type": "image", "source": {"type": "base64"}}]},
            {"role": "assistant", "content": [
                {"type": "thinking", "thinking": "hm", "signature": "s"},
                {"type": "redacted_thinking", "data": "x"},
                {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}},
                {"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "pwd"}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "a\nb"},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": true},
                {"type": "text", "text": "<system-reminder>go on</system-reminder>"}]},
            {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"}]}]});
        let request = parse(Wire::Anthropic, &body);
        let turns = serde_json::to_value(&request.turns).unwrap();
        let expected = json!([
            {"user": format!("look\n\n{NOT_TEXT}")},
            {"assistant": {"text": null, "calls": [
                {"id": "t1", "name": "Bash", "arguments": {"command": "ls"}},
                {"id": "t2", "name": "Bash", "arguments": {"command": "pwd"}}]}},
            {"toolResults": [{"id": "t1", "output": "a\nb", "isError": false},
                             {"id": "t2", "output": "", "isError": true}]},
            {"user": "<system-reminder>go on</system-reminder>"},
            // A turn of thinking alone is still the model's turn.
            {"assistant": {"text": null, "calls": []}}]);
        assert_eq!(turns, expected);
        assert_eq!(request.max_tokens, DEFAULT_MAX_TOKENS);
        assert!(!request.stream);
    }

    #[test]
    fn a_missing_or_mistyped_field_is_named() {
        let user = |content: Value| json!({"model": "m", "messages": [{"role": "user", "content": content}]});
        let assistant = |content: Value| json!({"model": "m", "messages": [{"role": "assistant", "content": content}]});
        let with = |field: &str, value: Value| {
            let mut body = json!({"model": "m", "messages": []});
            body[field] = value;
            body
        };
        for (body, wanted) in [
            (json!({"messages": []}), "`model` is missing"),
            (json!({"model": "m"}), "`messages` is missing"),
            (
                with("messages", json!({})),
                "`messages` must be a list, not an object",
            ),
            (
                with("messages", json!([{"role": "tool", "content": "x"}])),
                "`messages[0].role` must be `user`, `assistant` or `system`",
            ),
            (
                assistant(json!([{"type": "tool_use", "name": "Bash"}])),
                "`messages[0].content[0].id` is missing",
            ),
            (
                user(json!([{"type": "tool_result", "tool_use_id": 7}])),
                "`messages[0].content[0].tool_use_id` must be a string, not a number",
            ),
            (
                user(json!([{"text": "no type"}])),
                "`messages[0].content[0].type` is missing",
            ),
            (
                with("tools", json!([{"name": "x", "input_schema": "y"}])),
                "`tools[0].input_schema` must be an object",
            ),
            (
                with("tool_choice", json!({"type": "some"})),
                "`tool_choice.type` must be",
            ),
            (
                with("max_tokens", json!(-1)),
                "`max_tokens` must be a whole number",
            ),
            (
                with("stream", json!("yes")),
                "`stream` must be true or false",
            ),
        ] {
            let err = refusal(Wire::Anthropic, &body);
            assert!(err.contains(wanted), "{err} lacks {wanted}");
        }
        let choice =
            |choice: Value| parse(Wire::Anthropic, &with("tool_choice", choice)).tool_choice;
        assert_eq!(choice(json!({"type": "auto"})), ToolChoice::Auto);
        assert_eq!(choice(json!({"type": "any"})), ToolChoice::Required);
        assert_eq!(
            choice(json!({"type": "tool", "name": "Bash"})),
            ToolChoice::Required
        );
        assert_eq!(choice(json!({"type": "none"})), ToolChoice::None);
    }

    fn request(stream: bool) -> GatewayRequest {
        let body = json!({"model": "claude-x", "stream": stream, "max_tokens": 10,
            "tools": [{"name": "mcp__time__get_current_time", "input_schema": {"type": "object"}}],
            "messages": [{"role": "user", "content": "time?"}]});
        parse(Wire::Anthropic, &body)
    }

    /// A reply of text and a call scripted as `time__get_current_time`.
    fn text_and_call() -> crate::llm::Reply {
        let calls = vec![call(
            "c1",
            "time__get_current_time",
            json!({"timezone": "UTC"}),
        )];
        reply(Some("Looking."), calls)
    }

    #[test]
    fn renders_a_message_as_the_api_does() {
        let message = json_of(&Wire::Anthropic.render(&text_and_call(), &request(false)));
        assert!(message["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(message["type"], "message");
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["model"], "claude-x");
        let content = json!([
            {"type": "text", "text": "Looking."},
            {"type": "tool_use", "id": "c1", "name": "mcp__time__get_current_time",
             "input": {"timezone": "UTC"}}]);
        assert_eq!(message["content"], content);
        assert_eq!(message["stop_reason"], "tool_use");
        assert!(message["stop_sequence"].is_null());
        assert_eq!(message["usage"]["input_tokens"], 12);
        assert_eq!(message["usage"]["output_tokens"], 5);
    }

    #[test]
    fn streams_a_message_as_the_api_does() {
        let rendered = Wire::Anthropic.render(&text_and_call(), &request(true));
        assert_eq!(rendered.content_type, "text/event-stream");
        let events = sse::read_typed(&rendered.body);
        let kinds: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        let block = [
            "content_block_start",
            "content_block_delta",
            "content_block_stop",
        ];
        let expected = [
            &["message_start", "ping"][..],
            &block,
            &block,
            &["message_delta", "message_stop"],
        ];
        assert_eq!(kinds, expected.concat());
        let start = &events[0]["message"];
        assert_eq!(start["role"], "assistant");
        assert_eq!(start["model"], "claude-x");
        assert_eq!(start["content"], json!([]));
        assert!(start["stop_reason"].is_null());
        assert_eq!(start["usage"]["input_tokens"], 12);
        let text = json!({"type": "content_block_start", "index": 0,
                          "content_block": {"type": "text", "text": ""}});
        assert_eq!(events[2], text);
        assert_eq!(
            events[3]["delta"],
            json!({"type": "text_delta", "text": "Looking."})
        );
        let tool_use = json!({"type": "tool_use", "id": "c1",
                              "name": "mcp__time__get_current_time", "input": {}});
        assert_eq!(events[5]["content_block"], tool_use);
        assert_eq!(events[6]["index"], 1);
        assert_eq!(events[6]["delta"]["type"], "input_json_delta");
        let input = events[6]["delta"]["partial_json"].as_str().unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(input).unwrap(),
            json!({"timezone": "UTC"})
        );
        assert_eq!(events[7], json!({"type": "content_block_stop", "index": 1}));
        let stop = json!({"stop_reason": "tool_use", "stop_sequence": null});
        assert_eq!(events[8]["delta"], stop);
        assert_eq!(events[8]["usage"], json!({"output_tokens": 5}));

        let text_only = Wire::Anthropic.render(&reply(Some("Noon."), vec![]), &request(true));
        let events = sse::read_typed(&text_only.body);
        assert_eq!(events.len(), 7);
        assert_eq!(events[5]["delta"]["stop_reason"], "end_turn");
    }

    #[test]
    fn errors_take_the_api_s_shape() {
        let error = json_of(&Wire::Anthropic.render_error(400, "`model` is missing"));
        let expected = json!({"type": "error",
            "error": {"type": "invalid_request_error", "message": "`model` is missing"}});
        assert_eq!(error, expected);
        for (status, kind) in [
            (401, "authentication_error"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (529, "overloaded_error"),
        ] {
            let error = json_of(&Wire::Anthropic.render_error(status, "x"));
            assert_eq!(error["error"]["type"], kind);
        }
    }
}
