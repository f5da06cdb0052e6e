//! OpenAI Chat Completions (`POST /v1/chat/completions`), which most other programs and
//! OpenAI-compatible clients speak: messages of role `system` or `developer`, `user`,
//! `assistant` (with `tool_calls`) and `tool`, whose content is a string or parts (`text`;
//! images, audio and files as a placeholder); tools of type `function` (others dropped).
//! Streaming ends with a usage chunk when `stream_options.include_usage` asks for one.

use super::fields::At;
use super::sse::Events;
use super::{
    arguments_of, openai_mode, text_of, tool_spec, Conversation, GatewayRequest, Outgoing, Read,
    RenderHints, Rendered, WireError, NOT_TEXT,
};
use crate::llm::{ToolCall, ToolChoice, ToolOutput, ToolSpec};
use serde_json::{json, Value};

pub(super) fn parse(body: &At<'_>) -> Result<GatewayRequest, WireError> {
    let mut conversation = Conversation::default();
    for message in body.req("messages")?.items()? {
        read_message(&message, &mut conversation)?;
    }
    let max_tokens = match body.opt_tokens("max_completion_tokens")? {
        Some(tokens) => Some(tokens),
        None => body.opt_tokens("max_tokens")?,
    };
    let include_usage = match body.get("stream_options") {
        Some(options) => options.opt_bool("include_usage")?.unwrap_or(false),
        None => false,
    };
    Read {
        conversation,
        tools: tools(body)?,
        tool_choice: tool_choice(body)?,
        max_tokens,
        hints: RenderHints {
            namespaced: Vec::new(),
            include_usage,
        },
    }
    .into_request(body)
}

fn read_message(message: &At<'_>, conversation: &mut Conversation) -> Result<(), WireError> {
    let role = message.req("role")?;
    // Only an assistant message may go without content (when it calls tools).
    let content = || text_of(&message.req("content")?, part_text);
    match role.str()? {
        "system" | "developer" => conversation.system(content()?),
        "user" => conversation.user(content()?),
        "assistant" => {
            if let Some(content) = message.get("content") {
                conversation.assistant_text(text_of(&content, part_text)?);
            }
            conversation.assistant();
            for call in message.opt_items("tool_calls")? {
                let function = call.req("function")?;
                conversation.call(ToolCall {
                    id: call.req("id")?.str()?.to_string(),
                    name: function.req("name")?.str()?.to_string(),
                    arguments: arguments_of(function.opt_str("arguments")?.unwrap_or_default()),
                });
            }
        }
        "tool" => conversation.output(ToolOutput {
            id: message.req("tool_call_id")?.str()?.to_string(),
            output: content()?,
            is_error: false,
        }),
        _ => return Err(role.wrong("`system`, `developer`, `user`, `assistant` or `tool`")),
    }
    Ok(())
}

/// The text of a content part: text, a placeholder for an image, audio or a file, `None` for
/// a refusal.
fn part_text(part: &At<'_>) -> Result<Option<String>, WireError> {
    match part.req("type")?.str()? {
        "text" => Ok(Some(part.req("text")?.str()?.to_string())),
        "image_url" | "input_audio" | "file" => Ok(Some(NOT_TEXT.to_string())),
        _ => Ok(None),
    }
}

fn tools(body: &At<'_>) -> Result<Vec<ToolSpec>, WireError> {
    let mut specs = Vec::new();
    for tool in body.opt_items("tools")? {
        if tool.opt_str("type")?.is_none_or(|kind| kind == "function") {
            let function = tool.req("function")?;
            let name = function.req("name")?.str()?.to_string();
            specs.push(tool_spec(&function, name, "parameters")?);
        }
    }
    Ok(specs)
}

/// `tool_choice`: a mode, or an object naming a tool (forced as any tool: mst's requests name
/// none).
fn tool_choice(body: &At<'_>) -> Result<ToolChoice, WireError> {
    match body.get("tool_choice") {
        Some(choice) if choice.value().is_object() => Ok(ToolChoice::Required),
        Some(mode) => openai_mode(&mode),
        None => Ok(ToolChoice::Auto),
    }
}

fn finish_reason(reply: &Outgoing<'_>) -> &'static str {
    if reply.calls_tools() {
        "tool_calls"
    } else {
        "stop"
    }
}

fn usage(reply: &Outgoing<'_>) -> Value {
    let usage = reply.usage;
    json!({
        "prompt_tokens": usage.input_tokens,
        "completion_tokens": usage.output_tokens,
        "total_tokens": usage.input_tokens + usage.output_tokens,
    })
}

/// A completion object of `kind` (`chat.completion` or `…chunk`) with these `choices`.
fn completion(reply: &Outgoing<'_>, kind: &str, choices: Value) -> Value {
    json!({
        "id": format!("chatcmpl-{}", reply.id),
        "object": kind,
        "created": 0,
        "model": reply.model,
        "choices": choices,
    })
}

/// A call as a message carries it, with its `arguments` (empty in the first stream chunk).
fn tool_call(call: &ToolCall, arguments: String) -> Value {
    json!({"id": call.id, "type": "function",
           "function": {"name": call.name, "arguments": arguments}})
}

pub(super) fn render(reply: &Outgoing<'_>) -> Rendered {
    if !reply.stream {
        let mut message = json!({"role": "assistant", "content": reply.text, "refusal": null});
        if reply.calls_tools() {
            message["tool_calls"] = reply
                .calls
                .iter()
                .map(|call| tool_call(call, call.arguments.to_string()))
                .collect();
        }
        let choice = json!({"index": 0, "message": message, "logprobs": null,
                            "finish_reason": finish_reason(reply)});
        let mut body = completion(reply, "chat.completion", json!([choice]));
        body["usage"] = usage(reply);
        return Rendered::json(&body);
    }
    let mut events = Events::default();
    let chunk = |delta: Value, finish: Option<&str>| {
        let choice = json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish});
        let mut chunk = completion(reply, "chat.completion.chunk", json!([choice]));
        if reply.hints.include_usage {
            chunk["usage"] = Value::Null;
        }
        chunk.to_string()
    };
    events.data(&chunk(json!({"role": "assistant", "content": ""}), None));
    if let Some(text) = reply.text {
        events.data(&chunk(json!({"content": text}), None));
    }
    for (n, call) in reply.calls.iter().enumerate() {
        let mut first = tool_call(call, String::new());
        first["index"] = json!(n);
        events.data(&chunk(json!({"tool_calls": [first]}), None));
        let arguments = json!({"index": n, "function": {"arguments": call.arguments.to_string()}});
        events.data(&chunk(json!({"tool_calls": [arguments]}), None));
    }
    events.data(&chunk(json!({}), Some(finish_reason(reply))));
    if reply.hints.include_usage {
        let mut last = completion(reply, "chat.completion.chunk", json!([]));
        last["usage"] = usage(reply);
        events.data(&last.to_string());
    }
    events.data("[DONE]");
    events.finish()
}

#[cfg(test)]
mod tests {
    use super::super::sse;
    use super::super::tests::tool_conversation;
    use super::super::tests::{call, json_of, parse, refusal, reply, reply_of};
    use super::super::{GatewayRequest, Wire, DEFAULT_MAX_TOKENS, NOT_TEXT};
    use crate::llm::{ToolChoice, Turn};
    use serde_json::{json, Value};

    /// A request as OpenAI's SDKs send one.
    fn request(stream: bool, include_usage: bool, messages: Value) -> Value {
        json!({"model": "gpt-x", "stream": stream, "messages": messages,
            "stream_options": {"include_usage": include_usage},
            "tools": [{"type": "function", "function": {"name": "mcp__time__get_current_time",
                       "description": "The time.", "parameters": {"type": "object"}}},
                      {"type": "custom", "custom": {"name": "grammar"}}],
            "tool_choice": "auto", "max_completion_tokens": 300, "temperature": 0.2})
    }

    #[test]
    fn reads_a_request_of_the_sdks() {
        let messages = json!([
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [{"type": "text", "text": "see"},
                                         {"type": "image_url", "image_url": {"url": "data:"}}]}]);
        let request = parse(Wire::Chat, &request(false, true, messages));
        assert_eq!(request.model, "gpt-x");
        assert_eq!(request.system.as_deref(), Some("Be brief.\n\nUse tools."));
        assert_eq!(request.turns, [Turn::User(format!("see\n\n{NOT_TEXT}"))]);
        assert_eq!(request.tools.len(), 1, "only functions are offered");
        assert_eq!(request.tools[0].description, "The time.");
        assert_eq!(request.max_tokens, 300);
        assert_eq!(request.temperature, Some(0.2));
        assert!(request.hints.include_usage);
        let body = json!({"model": "m", "max_tokens": 9, "messages": []});
        assert_eq!(parse(Wire::Chat, &body).max_tokens, 9);
        let body = json!({"model": "m", "messages": []});
        assert_eq!(parse(Wire::Chat, &body).max_tokens, DEFAULT_MAX_TOKENS);
    }

    #[test]
    fn a_tool_calling_conversation_round_trips() {
        let mut messages = json!([{"role": "user", "content": "What time is it in Paris?"}]);
        for turn in [1, 3] {
            let request = parse(Wire::Chat, &request(false, false, messages.clone()));
            let completion = json_of(&Wire::Chat.render(&reply_of(turn), &request));
            // The SDKs send the message back as they got it, and the calls' results.
            let message = completion["choices"][0]["message"].clone();
            messages.as_array_mut().unwrap().push(message);
            if turn == 1 {
                let result =
                    json!({"role": "tool", "tool_call_id": "call-1-1", "content": "12:00"});
                messages.as_array_mut().unwrap().push(result);
            }
        }
        let request = parse(Wire::Chat, &request(false, false, messages));
        assert_eq!(request.turns, tool_conversation());
    }

    #[test]
    fn a_missing_or_mistyped_field_is_named() {
        let with = |messages: Value| json!({"model": "m", "messages": messages});
        let tools = |tools: Value| json!({"model": "m", "messages": [], "tools": tools});
        let assistant = |calls: Value| with(json!([{"role": "assistant", "tool_calls": calls}]));
        for (body, wanted) in [
            (json!({"messages": []}), "`model` is missing"),
            (json!({"model": "m"}), "`messages` is missing"),
            (
                with(json!([{"content": "x"}])),
                "`messages[0].role` is missing",
            ),
            (
                with(json!([{"role": "function", "content": "x"}])),
                "`messages[0].role` must be",
            ),
            (
                with(json!([{"role": "tool", "content": "x"}])),
                "`messages[0].tool_call_id` is missing",
            ),
            (
                with(json!([{"role": "user"}])),
                "`messages[0].content` is missing",
            ),
            (
                with(json!([{"role": "user", "content": 5}])),
                "`messages[0].content` must be a list, not a number",
            ),
            (
                assistant(json!([{"id": "c", "type": "function"}])),
                "`messages[0].tool_calls[0].function` is missing",
            ),
            (
                assistant(json!([{"id": "c", "function": {"arguments": "{}"}}])),
                "`messages[0].tool_calls[0].function.name` is missing",
            ),
            (
                tools(json!([{"type": "function"}])),
                "`tools[0].function` is missing",
            ),
            (
                json!({"model": "m", "messages": [], "tool_choice": "sometimes"}),
                "`tool_choice` must be `auto`, `required`, `none` or an object",
            ),
        ] {
            let err = refusal(Wire::Chat, &body);
            assert!(err.contains(wanted), "{err} lacks {wanted}");
        }
        let choice = |choice: Value| {
            let body = json!({"model": "m", "messages": [], "tool_choice": choice});
            parse(Wire::Chat, &body).tool_choice
        };
        assert_eq!(choice(json!("none")), ToolChoice::None);
        let named = json!({"type": "function", "function": {"name": "f"}});
        assert_eq!(choice(named), ToolChoice::Required);
    }

    fn text_and_calls(stream: bool, include_usage: bool) -> (GatewayRequest, crate::llm::Reply) {
        let messages = json!([{"role": "user", "content": "time?"}]);
        let request = parse(Wire::Chat, &request(stream, include_usage, messages));
        let calls = vec![
            call("c1", "time__get_current_time", json!({"timezone": "UTC"})),
            call(
                "c2",
                "time__get_current_time",
                json!({"timezone": "Asia/Tokyo"}),
            ),
        ];
        (request, reply(Some("Looking."), calls))
    }

    #[test]
    fn renders_a_completion_as_the_api_does() {
        let (request, reply) = text_and_calls(false, false);
        let completion = json_of(&Wire::Chat.render(&reply, &request));
        assert!(completion["id"].as_str().unwrap().starts_with("chatcmpl-"));
        assert_eq!(completion["object"], "chat.completion");
        assert_eq!(completion["model"], "gpt-x");
        let choice = &completion["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["role"], "assistant");
        assert_eq!(choice["message"]["content"], "Looking.");
        let first = &choice["message"]["tool_calls"][0];
        assert_eq!(first["id"], "c1");
        assert_eq!(first["type"], "function");
        assert_eq!(first["function"]["name"], "mcp__time__get_current_time");
        assert_eq!(first["function"]["arguments"], r#"{"timezone":"UTC"}"#);
        let usage = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17});
        assert_eq!(completion["usage"], usage);
        let text =
            json_of(&Wire::Chat.render(&super::super::tests::reply(Some("Hi."), vec![]), &request));
        assert_eq!(text["choices"][0]["finish_reason"], "stop");
        assert!(text["choices"][0]["message"].get("tool_calls").is_none());
    }

    #[test]
    fn streams_a_completion_as_the_api_does() {
        let (request, reply) = text_and_calls(true, true);
        let rendered = Wire::Chat.render(&reply, &request);
        assert_eq!(rendered.content_type, "text/event-stream");
        let events = sse::read(&rendered.body);
        assert!(
            events.iter().all(|(name, _)| name.is_none()),
            "Chat names no events"
        );
        let (last, chunks) = events.split_last().unwrap();
        assert_eq!(last.1, "[DONE]");
        let chunks: Vec<Value> = chunks
            .iter()
            .map(|(_, data)| serde_json::from_str(data).unwrap())
            .collect();
        let id = &chunks[0]["id"];
        assert!(chunks
            .iter()
            .all(|c| &c["id"] == id && c["object"] == "chat.completion.chunk"));
        let delta = |n: usize| &chunks[n]["choices"][0]["delta"];
        assert_eq!(delta(0), &json!({"role": "assistant", "content": ""}));
        assert_eq!(delta(1), &json!({"content": "Looking."}));
        // Each call: its id and name, then its arguments, by index.
        let mut calls: Vec<(String, String, String)> = Vec::new();
        for chunk in &chunks[2..6] {
            let part = &chunk["choices"][0]["delta"]["tool_calls"][0];
            let index = part["index"].as_u64().unwrap() as usize;
            if let Some(id) = part["id"].as_str() {
                assert_eq!(index, calls.len());
                calls.push((
                    id.into(),
                    part["function"]["name"].as_str().unwrap().into(),
                    String::new(),
                ));
            }
            calls[index]
                .2
                .push_str(part["function"]["arguments"].as_str().unwrap());
        }
        let name = "mcp__time__get_current_time".to_string();
        assert_eq!(
            calls,
            [
                ("c1".into(), name.clone(), r#"{"timezone":"UTC"}"#.into()),
                ("c2".into(), name, r#"{"timezone":"Asia/Tokyo"}"#.into())
            ]
        );
        assert_eq!(chunks[6]["choices"][0]["finish_reason"], "tool_calls");
        assert!(chunks[..7].iter().all(|c| c["usage"].is_null()));
        assert_eq!(chunks[7]["choices"], json!([]));
        assert_eq!(chunks[7]["usage"]["total_tokens"], 17);
        assert_eq!(chunks.len(), 8);

        // Without `include_usage`, no usage chunk.
        let (request, reply) = text_and_calls(true, false);
        let events = sse::read(&Wire::Chat.render(&reply, &request).body);
        assert_eq!(events.len(), 8);
        assert!(!events[6].1.contains("usage"));
    }
}
