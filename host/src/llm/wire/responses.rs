//! OpenAI's Responses API (`POST /v1/responses`), as Codex speaks it: `instructions`, and
//! `input` (a string, or items: `message` with role `user`, `assistant`, `system` or
//! `developer` and `input_text`/`output_text` parts, `function_call`, `function_call_output`;
//! `reasoning` and other items dropped). Tools are `function`s and `namespace`s of functions:
//! Codex offers each MCP server's tools in a namespace (`mcp__everything` holding `echo`).
//! The model sees a namespaced function under one flat name, `{namespace}__{function}` as
//! Codex itself flattens them (`mcp__everything__echo`); a call to it goes back as a
//! `function_call` item whose `name` is the function's own and whose `namespace` is the
//! namespace's, since Codex looks a call up by both fields (`ToolName::new(namespace, name)`
//! in codex-rs' tool router) and refuses a namespaced tool called by a joined name. Other tool
//! types (`web_search`, `custom`, …) are the API's or Codex's own and are dropped.

use super::fields::At;
use super::sse::Events;
use super::{
    arguments_of, openai_mode, text_of, tool_spec, Conversation, GatewayRequest, NamespacedTool,
    Outgoing, Read, RenderHints, Rendered, WireError, NOT_TEXT,
};
use crate::llm::{ToolCall, ToolChoice, ToolOutput, ToolSpec};
use serde_json::{json, Value};

pub(super) fn parse(body: &At<'_>) -> Result<GatewayRequest, WireError> {
    let mut conversation = Conversation::default();
    if let Some(instructions) = body.get("instructions") {
        conversation.system(instructions.str()?.to_string());
    }
    let input = body.req("input")?;
    match input.value().as_str() {
        Some(text) => conversation.user(text.to_string()),
        None => {
            for item in input.items()? {
                read_item(&item, &mut conversation)?;
            }
        }
    }
    let (tools, namespaced) = tools(body)?;
    Read {
        conversation,
        tools,
        tool_choice: tool_choice(body)?,
        max_tokens: body.opt_tokens("max_output_tokens")?,
        hints: RenderHints {
            namespaced,
            include_usage: false,
        },
    }
    .into_request(body)
}

fn read_item(item: &At<'_>, conversation: &mut Conversation) -> Result<(), WireError> {
    // An item without a `type` is a message (the API's "easy input message").
    match item.opt_str("type")?.unwrap_or("message") {
        "message" => {
            let role = item.req("role")?;
            let text = text_of(&item.req("content")?, part_text)?;
            match role.str()? {
                "user" => conversation.user(text),
                "assistant" => conversation.assistant_text(text),
                "system" | "developer" => conversation.system(text),
                _ => return Err(role.wrong("`user`, `assistant`, `system` or `developer`")),
            }
        }
        "function_call" => {
            let name = item.req("name")?.str()?;
            conversation.call(ToolCall {
                id: item.req("call_id")?.str()?.to_string(),
                name: match item.opt_str("namespace")? {
                    Some(namespace) => flat_name(namespace, name),
                    None => name.to_string(),
                },
                arguments: arguments_of(item.opt_str("arguments")?.unwrap_or_default()),
            });
        }
        "function_call_output" => conversation.output(ToolOutput {
            id: item.req("call_id")?.str()?.to_string(),
            output: text_of(&item.req("output")?, part_text)?,
            is_error: false,
        }),
        _ => {}
    }
    Ok(())
}

/// The text of a content part: input or output text, a placeholder for an image or a file,
/// `None` for the rest (a refusal, reasoning).
fn part_text(part: &At<'_>) -> Result<Option<String>, WireError> {
    match part.req("type")?.str()? {
        "input_text" | "output_text" | "text" => Ok(Some(part.req("text")?.str()?.to_string())),
        "input_image" | "input_file" | "input_audio" => Ok(Some(NOT_TEXT.to_string())),
        _ => Ok(None),
    }
}

/// The name the model sees for `function` of `namespace`, as Codex flattens one
/// (`ToolName::canonical_flat_name`): joined by `__`, without doubling the underscores.
fn flat_name(namespace: &str, function: &str) -> String {
    format!(
        "{}__{}",
        namespace.trim_end_matches('_'),
        function.trim_start_matches('_')
    )
}

/// The offered tools, and which of them are namespaced.
fn tools(body: &At<'_>) -> Result<(Vec<ToolSpec>, Vec<NamespacedTool>), WireError> {
    let (mut specs, mut namespaced) = (Vec::new(), Vec::new());
    for tool in body.opt_items("tools")? {
        match tool.req("type")?.str()? {
            "function" => specs.push(function(&tool, None)?),
            "namespace" => {
                let namespace = tool.req("name")?.str()?;
                for inner in tool.req("tools")?.items()? {
                    if inner.opt_str("type")? != Some("function") {
                        continue;
                    }
                    let spec = function(&inner, Some(namespace))?;
                    namespaced.push(NamespacedTool {
                        flat: spec.name.clone(),
                        namespace: namespace.to_string(),
                        function: inner.req("name")?.str()?.to_string(),
                    });
                    specs.push(spec);
                }
            }
            _ => {}
        }
    }
    Ok((specs, namespaced))
}

/// A `function` tool, named flat when it is in `namespace`.
fn function(tool: &At<'_>, namespace: Option<&str>) -> Result<ToolSpec, WireError> {
    let name = tool.req("name")?.str()?;
    let name = namespace.map_or_else(|| name.to_string(), |ns| flat_name(ns, name));
    tool_spec(tool, name, "parameters")
}

/// `tool_choice`: a mode, or an object naming a tool (forced as any tool: mst's requests name
/// none) or listing allowed tools with a mode.
fn tool_choice(body: &At<'_>) -> Result<ToolChoice, WireError> {
    match body.get("tool_choice") {
        Some(choice) if choice.value().is_object() => match choice.get("mode") {
            Some(mode) => openai_mode(&mode),
            None => Ok(ToolChoice::Required),
        },
        Some(mode) => openai_mode(&mode),
        None => Ok(ToolChoice::Auto),
    }
}

/// The reply's output items, complete: its message, then its function calls.
fn items(reply: &Outgoing<'_>) -> Vec<Value> {
    let message = reply.text.map(|text| {
        json!({
            "id": format!("msg_{}", reply.id),
            "type": "message",
            "status": "completed",
            "role": "assistant",
            "content": [output_text(text)],
        })
    });
    let calls = reply.calls.iter().enumerate().map(|(n, call)| {
        let mut item = json!({
            "id": format!("fc_{}_{n}", reply.id),
            "type": "function_call",
            "status": "completed",
            "arguments": call.arguments.to_string(),
            "call_id": call.id,
            "name": call.name,
        });
        if let Some(tool) = reply.hints.namespaced.iter().find(|t| t.flat == call.name) {
            item["name"] = json!(tool.function);
            item["namespace"] = json!(tool.namespace);
        }
        item
    });
    message.into_iter().chain(calls).collect()
}

fn output_text(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The response object, `status` and with `output` (and its usage once completed).
fn response(reply: &Outgoing<'_>, status: &str, output: Vec<Value>) -> Value {
    let usage = (status == "completed").then(|| {
        let usage = reply.usage;
        json!({
            "input_tokens": usage.input_tokens,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": usage.output_tokens,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": usage.input_tokens + usage.output_tokens,
        })
    });
    json!({
        "id": format!("resp_{}", reply.id),
        "object": "response",
        "created_at": 0,
        "status": status,
        "error": null,
        "incomplete_details": null,
        "model": reply.model,
        "output": output,
        "parallel_tool_calls": true,
        "tool_choice": "auto",
        "tools": [],
        "usage": usage,
    })
}

pub(super) fn render(reply: &Outgoing<'_>) -> Rendered {
    let items = items(reply);
    if !reply.stream {
        return Rendered::json(&response(reply, "completed", items));
    }
    let mut stream = Stream::default();
    stream.emit(
        json!({"type": "response.created", "response": response(reply, "in_progress", vec![])}),
    );
    stream.emit(
        json!({"type": "response.in_progress", "response": response(reply, "in_progress", vec![])}),
    );
    for (index, item) in items.iter().enumerate() {
        let mut added = item.clone();
        added["status"] = json!("in_progress");
        if item["type"] == "message" {
            added["content"] = json!([]);
        } else {
            added["arguments"] = json!("");
        }
        stream.emit(
            json!({"type": "response.output_item.added", "output_index": index, "item": added}),
        );
        if item["type"] == "message" {
            stream.text(index, item);
        } else {
            stream.arguments(index, item);
        }
        stream.emit(
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        );
    }
    stream.emit(
        json!({"type": "response.completed", "response": response(reply, "completed", items)}),
    );
    stream.events.finish()
}

/// A Responses event stream: every event numbered in order.
#[derive(Default)]
struct Stream {
    events: Events,
    sequence: u64,
}

impl Stream {
    fn emit(&mut self, mut event: Value) {
        event["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.events.typed(event);
    }

    /// The events of a message item's one text part.
    fn text(&mut self, index: usize, item: &Value) {
        let (id, text) = (&item["id"], &item["content"][0]["text"]);
        let event = |kind: &str, mut fields: Value| {
            fields["type"] = json!(kind);
            fields["item_id"] = id.clone();
            fields["output_index"] = json!(index);
            fields["content_index"] = json!(0);
            fields
        };
        let part = output_text(text.as_str().unwrap_or_default());
        self.emit(event(
            "response.content_part.added",
            json!({"part": output_text("")}),
        ));
        self.emit(event(
            "response.output_text.delta",
            json!({"delta": text, "logprobs": []}),
        ));
        self.emit(event(
            "response.output_text.done",
            json!({"text": text, "logprobs": []}),
        ));
        self.emit(event("response.content_part.done", json!({"part": part})));
    }

    /// The events of a function call item's arguments.
    fn arguments(&mut self, index: usize, item: &Value) {
        let (id, arguments) = (&item["id"], &item["arguments"]);
        self.emit(json!({"type": "response.function_call_arguments.delta",
            "item_id": id, "output_index": index, "delta": arguments}));
        self.emit(json!({"type": "response.function_call_arguments.done",
            "item_id": id, "output_index": index, "arguments": arguments}));
    }
}

#[cfg(test)]
mod tests {
    use super::super::sse;
    use super::super::tests::tool_conversation;
    use super::super::tests::{call, fixture, json_of, parse, refusal, reply, reply_of};
    use super::super::{GatewayRequest, NamespacedTool, Wire, DEFAULT_MAX_TOKENS, NOT_TEXT};
    use crate::llm::{ToolChoice, Turn};
    use serde_json::{json, Value};

    #[test]
    fn reads_what_codex_sends() {
        let request = Wire::Responses
            .parse_request(&fixture("codex-say-hi.json"))
            .unwrap();
        assert_eq!(request.model, "gpt-5.1-codex");
        assert!(request.stream);
        assert_eq!(request.max_tokens, DEFAULT_MAX_TOKENS);
        assert_eq!(request.tool_choice, ToolChoice::Auto);
        // The developer messages are the system prompt.
        let system = request.system.as_deref().unwrap();
        assert!(
            system.starts_with("You are a coding agent running in the Codex CLI"),
            "{system}"
        );
        assert!(system.contains("\n\n<skills_instructions>"), "{system}");
        assert!(
            system.contains("\n\n<permissions instructions>"),
            "{system}"
        );
        let [Turn::User(context), Turn::User(text)] = request.turns.as_slice() else {
            panic!("{:?}", request.turns);
        };
        assert!(context.starts_with("<environment_context>"), "{context}");
        assert_eq!(text, "say hi");
        // Functions, and the functions of a namespace under flat names; `web_search` dropped.
        let names: Vec<_> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["exec_command", "multi_agent_v1__close_agent"]);
        assert_eq!(request.tools[0].input_schema["required"], json!(["cmd"]));
        let namespaced = NamespacedTool {
            flat: "multi_agent_v1__close_agent".into(),
            namespace: "multi_agent_v1".into(),
            function: "close_agent".into(),
        };
        assert_eq!(request.hints.namespaced, [namespaced]);
    }

    #[test]
    fn reads_codex_s_request_after_a_namespaced_call() {
        // Codex's request after the gateway streamed it a call of an MCP server's tool.
        let request = Wire::Responses
            .parse_request(&fixture("codex-mcp-tool-output.json"))
            .unwrap();
        let names: Vec<_> = request.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["view_image", "mcp__everything__echo"]);
        let turns = serde_json::to_value(&request.turns[2..]).unwrap();
        let expected = json!([
            {"assistant": {"text": "Let me echo.", "calls": [{"id": "call-1-1",
                "name": "mcp__everything__echo", "arguments": {"message": "hello"}}]}},
            {"toolResults": [{"id": "call-1-1", "isError": false,
                "output": "Wall time: 0.0090 seconds\nOutput:\n\nEcho: hello"}]}]);
        assert_eq!(turns, expected);
        // The script's next turn goes back to the same tool the same way.
        let request = GatewayRequest {
            stream: false,
            ..request
        };
        let calls = vec![call(
            "call-2-1",
            "everything__echo",
            json!({"message": "again"}),
        )];
        let response = json_of(&Wire::Responses.render(&reply(None, calls), &request));
        let item = &response["output"][0];
        assert_eq!(
            (&item["name"], &item["namespace"]),
            (&json!("echo"), &json!("mcp__everything"))
        );
    }

    /// A request offering an MCP server's tool the way Codex does.
    fn everything(stream: bool, input: Value) -> Value {
        json!({"model": "gpt-x", "stream": stream, "instructions": "Be brief.", "input": input,
            "tools": [{"type": "namespace", "name": "mcp__everything", "description": "MCP",
                       "tools": [{"type": "function", "name": "echo", "strict": false,
                                  "parameters": {"type": "object"}}]},
                      {"type": "web_search", "external_web_access": false},
                      {"type": "custom", "name": "apply_patch"}]})
    }

    #[test]
    fn a_call_to_a_namespaced_function_goes_back_by_name_and_namespace() {
        let request = parse(Wire::Responses, &everything(false, json!("echo hi")));
        assert_eq!(request.tools.len(), 1);
        assert_eq!(request.tools[0].name, "mcp__everything__echo");
        let calls = vec![call("c1", "everything__echo", json!({"message": "hi"}))];
        let response = json_of(&Wire::Responses.render(&reply(None, calls), &request));
        let item = &response["output"][0];
        assert_eq!(item["type"], "function_call");
        assert_eq!(item["name"], "echo");
        assert_eq!(item["namespace"], "mcp__everything");
        assert_eq!(item["call_id"], "c1");
        assert_eq!(item["arguments"], r#"{"message":"hi"}"#);
        // Codex sends the call back as it got it; the model sees it by its flat name.
        let mut item = item.clone();
        item.as_object_mut().unwrap().remove("id");
        let input = json!([{"role": "user", "content": "echo hi"}, item,
                           {"type": "function_call_output", "call_id": "c1", "output": "hi"}]);
        let request = parse(Wire::Responses, &everything(false, input));
        let Turn::Assistant { calls, .. } = &request.turns[1] else {
            panic!("{:?}", request.turns);
        };
        assert_eq!(calls[0].name, "mcp__everything__echo");
        assert_eq!(calls[0].arguments, json!({"message": "hi"}));
    }

    #[test]
    fn a_tool_calling_conversation_round_trips() {
        let first = json!([{"type": "message", "role": "user",
                            "content": [{"type": "input_text", "text": "What time is it in Paris?"}]}]);
        let tools = json!([{"type": "function", "name": "mcp__time__get_current_time",
                            "parameters": {"type": "object"}}]);
        let body = |input: &Value| json!({"model": "gpt-x", "input": input, "tools": tools});
        let mut input = first.clone();
        for turn in [1, 3] {
            let request = parse(Wire::Responses, &body(&input));
            let response = json_of(&Wire::Responses.render(&reply_of(turn), &request));
            assert_eq!(response["status"], "completed");
            // Codex keeps the output items as they came, and adds the calls' outputs.
            input
                .as_array_mut()
                .unwrap()
                .extend(response["output"].as_array().unwrap().clone());
            if turn == 1 {
                let output = json!({"type": "function_call_output", "call_id": "call-1-1",
                                    "output": "12:00"});
                input.as_array_mut().unwrap().push(output);
            }
        }
        let request = parse(Wire::Responses, &body(&input));
        assert_eq!(request.turns, tool_conversation());
    }

    #[test]
    fn reads_every_kind_of_item_it_needs_and_drops_the_rest() {
        let input = json!([
            {"type": "message", "role": "system", "content": "Rules."},
            {"role": "user", "content": [{"type": "input_text", "text": "see"},
                                         {"type": "input_image", "image_url": "data:"}]},
            {"type": "reasoning", "summary": [], "encrypted_content": "xyz"},
            {"type": "function_call", "call_id": "a", "name": "exec_command", "arguments": "{\"cmd\":\"ls\"}"},
            {"type": "function_call", "call_id": "b", "name": "exec_command", "arguments": "not json"},
            {"type": "function_call_output", "call_id": "a",
             "output": [{"type": "input_text", "text": "file"}]},
            {"type": "function_call_output", "call_id": "b", "output": "error"},
            {"type": "web_search_call", "status": "completed", "action": {"type": "search"}}]);
        let body = json!({"model": "m", "instructions": "Be brief.", "input": input});
        let request = parse(Wire::Responses, &body);
        assert_eq!(request.system.as_deref(), Some("Be brief.\n\nRules."));
        let turns = serde_json::to_value(&request.turns).unwrap();
        let expected = json!([
            {"user": format!("see\n\n{NOT_TEXT}")},
            {"assistant": {"text": null, "calls": [
                {"id": "a", "name": "exec_command", "arguments": {"cmd": "ls"}},
                {"id": "b", "name": "exec_command", "arguments": "not json"}]}},
            {"toolResults": [{"id": "a", "output": "file", "isError": false},
                             {"id": "b", "output": "error", "isError": false}]}]);
        assert_eq!(turns, expected);
    }

    #[test]
    fn a_missing_or_mistyped_field_is_named() {
        let with = |input: Value| json!({"model": "m", "input": input});
        let tools = |tools: Value| json!({"model": "m", "input": "x", "tools": tools});
        for (body, wanted) in [
            (json!({"input": "x"}), "`model` is missing"),
            (json!({"model": "m"}), "`input` is missing"),
            (with(json!(3)), "`input` must be a list, not a number"),
            (
                with(json!([{"type": "message", "content": "x"}])),
                "`input[0].role` is missing",
            ),
            (
                with(json!([{"role": "critic", "content": "x"}])),
                "`input[0].role` must be `user`",
            ),
            (
                with(json!([{"type": "function_call", "name": "f", "arguments": "{}"}])),
                "`input[0].call_id` is missing",
            ),
            (
                with(json!([{"type": "function_call_output", "call_id": "c"}])),
                "`input[0].output` is missing",
            ),
            (
                with(json!([{"role": "user", "content": [{"type": "input_text"}]}])),
                "`input[0].content[0].text` is missing",
            ),
            (tools(json!([{"name": "f"}])), "`tools[0].type` is missing"),
            (
                tools(json!([{"type": "namespace", "name": "n"}])),
                "`tools[0].tools` is missing",
            ),
            (
                tools(json!([{"type": "function", "name": "f", "parameters": []}])),
                "`tools[0].parameters` must be an object, not a list",
            ),
            (
                json!({"model": "m", "input": "x", "tool_choice": "always"}),
                "`tool_choice` must be `auto`, `required`, `none` or an object",
            ),
        ] {
            let err = refusal(Wire::Responses, &body);
            assert!(err.contains(wanted), "{err} lacks {wanted}");
        }
        let choice = |choice: Value| {
            let body = json!({"model": "m", "input": "x", "tool_choice": choice});
            parse(Wire::Responses, &body).tool_choice
        };
        assert_eq!(choice(json!("none")), ToolChoice::None);
        assert_eq!(choice(json!("required")), ToolChoice::Required);
        assert_eq!(
            choice(json!({"type": "function", "name": "f"})),
            ToolChoice::Required
        );
        let allowed = json!({"type": "allowed_tools", "mode": "auto", "tools": []});
        assert_eq!(choice(allowed), ToolChoice::Auto);
        let body = json!({"model": "m", "input": "x", "max_output_tokens": 77});
        assert_eq!(parse(Wire::Responses, &body).max_tokens, 77);
    }

    fn text_and_call(stream: bool) -> (GatewayRequest, crate::llm::Reply) {
        let request = parse(Wire::Responses, &everything(stream, json!("echo hi")));
        let calls = vec![call("c1", "everything__echo", json!({"message": "hi"}))];
        (request, reply(Some("Echoing."), calls))
    }

    #[test]
    fn renders_a_response_as_the_api_does() {
        let (request, reply) = text_and_call(false);
        let response = json_of(&Wire::Responses.render(&reply, &request));
        assert!(response["id"].as_str().unwrap().starts_with("resp_"));
        assert_eq!(response["object"], "response");
        assert_eq!(response["status"], "completed");
        assert_eq!(response["model"], "gpt-x");
        let message = &response["output"][0];
        assert!(message["id"].as_str().unwrap().starts_with("msg_"));
        assert_eq!(message["type"], "message");
        assert_eq!(message["role"], "assistant");
        assert_eq!(message["status"], "completed");
        assert_eq!(message["content"][0]["type"], "output_text");
        assert_eq!(message["content"][0]["text"], "Echoing.");
        assert_eq!(response["output"][1]["type"], "function_call");
        assert_eq!(response["output"][1]["status"], "completed");
        let usage = json!({"input_tokens": 12, "input_tokens_details": {"cached_tokens": 0},
                           "output_tokens": 5, "output_tokens_details": {"reasoning_tokens": 0},
                           "total_tokens": 17});
        assert_eq!(response["usage"], usage);
    }

    #[test]
    fn streams_a_response_as_the_api_does() {
        let (request, reply) = text_and_call(true);
        let rendered = Wire::Responses.render(&reply, &request);
        assert_eq!(rendered.content_type, "text/event-stream");
        let events = sse::read_typed(&rendered.body);
        let kinds: Vec<_> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
                "response.completed"
            ]
        );
        for (n, event) in events.iter().enumerate() {
            assert_eq!(event["sequence_number"], n, "{event}");
        }
        assert_eq!(events[0]["response"]["status"], "in_progress");
        assert!(events[0]["response"]["usage"].is_null());
        let added = &events[2]["item"];
        assert_eq!(
            (added["type"].as_str(), added["status"].as_str()),
            (Some("message"), Some("in_progress"))
        );
        assert_eq!(added["content"], json!([]));
        let message_id = &events[7]["item"]["id"];
        for event in &events[3..7] {
            assert_eq!(
                (&event["item_id"], &event["output_index"]),
                (message_id, &json!(0))
            );
        }
        assert_eq!(events[4]["delta"], "Echoing.");
        assert_eq!(events[5]["text"], "Echoing.");
        assert_eq!(events[6]["part"]["text"], "Echoing.");
        let call = &events[8]["item"];
        assert_eq!(
            (call["name"].as_str(), call["namespace"].as_str()),
            (Some("echo"), Some("mcp__everything"))
        );
        assert_eq!(
            (call["call_id"].as_str(), call["arguments"].as_str()),
            (Some("c1"), Some(""))
        );
        assert_eq!(events[9]["delta"], r#"{"message":"hi"}"#);
        assert_eq!(events[10]["arguments"], r#"{"message":"hi"}"#);
        assert_eq!(events[11]["output_index"], 1);
        assert_eq!(events[11]["item"]["arguments"], r#"{"message":"hi"}"#);
        let completed = &events[12]["response"];
        assert_eq!(completed["status"], "completed");
        assert_eq!(completed["output"].as_array().unwrap().len(), 2);
        assert_eq!(completed["usage"]["total_tokens"], 17);
        // The non-streaming response is the completed one.
        let whole = json_of(&Wire::Responses.render(&reply, &text_and_call(false).0));
        assert_eq!(&whole, completed);
    }
}
