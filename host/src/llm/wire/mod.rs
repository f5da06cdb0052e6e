//! The model gateway's translation layer: an agent CLI (Claude Code, Codex, or any program)
//! calls models in the wire format it speaks; these pure functions read such a request into
//! mst's one request shape ([`GatewayRequest`], then [`ModelRequest`]) and render mst's
//! [`Reply`] back in that format, as JSON or as the API's server-sent events, so that the
//! agent cannot tell the gateway from the real API.
//!
//! Three formats ([`Wire`]), a file each: the Anthropic Messages API (`anthropic.rs`), OpenAI's
//! Responses API (`responses.rs`) and OpenAI Chat Completions (`chat.rs`). Reading is lenient
//! with what mst does not need (metadata, thinking, cache controls, reasoning items, server-side
//! tools are dropped) and strict with what it does: a needed field that is missing or of the
//! wrong type is a [`WireError`] naming the field. Nothing here caps sizes; the gateway caps
//! the body. A `mock/script` names tools its own way; replies go out under the names the agent
//! offered ([`offered_name`]).

mod anthropic;
mod chat;
mod fields;
mod responses;
mod sse;

use super::{ModelRef, ModelRequest, Reply, ToolCall, ToolChoice, ToolOutput, ToolSpec, Turn};
use fields::At;
use serde::{Deserialize, Serialize};

/// The token cap of a request that names none (the Responses and Chat APIs make it optional;
/// mst's providers need one).
pub const DEFAULT_MAX_TOKENS: u32 = 8192;

/// What stands in for an image, a document or other content that is not text: the gateway
/// carries text only.
const NOT_TEXT: &str = "[non-text content omitted by the mst gateway]";

/// An agent's model call, read from its wire format: owned, so that it can travel (as JSON,
/// camelCase) to the coordinator that makes the call, and kept by the gateway to render the
/// reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRequest {
    /// The model the agent asked for, as it named it (echoed back in the reply).
    pub model: String,
    /// The system prompt: the request's own, and its system (or developer) messages, joined.
    pub system: Option<String>,
    /// The conversation so far, ending with what the model is to answer.
    pub turns: Vec<Turn>,
    /// The tools the agent offers, named as the model sees them.
    pub tools: Vec<ToolSpec>,
    pub tool_choice: ToolChoice,
    /// The request's token cap, or [`DEFAULT_MAX_TOKENS`].
    pub max_tokens: u32,
    pub temperature: Option<f64>,
    /// Whether the agent asked for server-sent events.
    pub stream: bool,
    /// What only rendering the reply needs.
    #[serde(default)]
    pub hints: RenderHints,
    /// On a grade machine, the grader plugin making the call (`name version`, from its
    /// [`crate::llm::http::PLUGIN_HEADER`]): the coordinator checks its grant and counts the
    /// call to it. `None` for an agent's call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plugin: Option<String>,
}

/// What an agent's request says that matters only when rendering the reply back to it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RenderHints {
    /// The functions a Responses request offered inside a `namespace` tool (Codex offers each
    /// MCP server's tools so): the model sees each under one flat name, and a call to it goes
    /// back as the function's own name plus its `namespace`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub namespaced: Vec<NamespacedTool>,
    /// Chat Completions' `stream_options.include_usage`: end the stream with a usage chunk.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub include_usage: bool,
}

/// A function offered inside a Responses `namespace` tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NamespacedTool {
    /// The name the model sees ([`ToolSpec::name`]): `{namespace}__{function}`.
    pub flat: String,
    /// The namespace tool's `name` (`mcp__everything`).
    pub namespace: String,
    /// The function's own `name` in it (`echo`).
    pub function: String,
}

impl GatewayRequest {
    /// The model call this request asks for, made to `model` (the gateway decides which model
    /// serves the agent).
    pub fn as_request<'a>(&'a self, model: &'a ModelRef) -> ModelRequest<'a> {
        ModelRequest {
            model,
            system: self.system.as_deref(),
            turns: &self.turns,
            tools: &self.tools,
            tool_choice: self.tool_choice,
            max_tokens: self.max_tokens,
            temperature: self.temperature,
        }
    }
}

/// An API an agent speaks to the gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wire {
    /// Anthropic's Messages API, `POST /v1/messages` (Claude Code adds `?beta=true`).
    Anthropic,
    /// OpenAI's Responses API, `POST /v1/responses` (Codex).
    Responses,
    /// OpenAI's Chat Completions, `POST /v1/chat/completions`.
    Chat,
}

/// A rendered reply: the `Content-Type` and the body to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendered {
    /// `application/json`, or `text/event-stream` for a stream.
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Rendered {
    fn json(value: &serde_json::Value) -> Self {
        Rendered {
            content_type: "application/json",
            body: value.to_string().into_bytes(),
        }
    }
}

/// A request the gateway cannot read; the message names the field and what it should be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireError(pub String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for WireError {}

impl Wire {
    /// The API served at `path` (a query such as `?beta=true` is ignored): a path ending in
    /// `/v1/messages`, `/v1/responses` or `/v1/chat/completions`, so that the gateway may
    /// serve them under a prefix of its own.
    pub fn for_path(path: &str) -> Option<Wire> {
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        [
            ("/v1/messages", Wire::Anthropic),
            ("/v1/responses", Wire::Responses),
            ("/v1/chat/completions", Wire::Chat),
        ]
        .into_iter()
        .find_map(|(suffix, wire)| path.ends_with(suffix).then_some(wire))
    }

    /// The API's name, for messages.
    pub fn name(&self) -> &'static str {
        match self {
            Wire::Anthropic => "the Anthropic Messages API",
            Wire::Responses => "the OpenAI Responses API",
            Wire::Chat => "OpenAI Chat Completions",
        }
    }

    /// Reads a request body of this API.
    pub fn parse_request(&self, body: &[u8]) -> Result<GatewayRequest, WireError> {
        let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
            WireError(format!(
                "the request body is not JSON ({e}); {} takes a JSON object",
                self.name()
            ))
        })?;
        if !value.is_object() {
            return Err(WireError(format!(
                "the request body is not a JSON object; {} takes one",
                self.name()
            )));
        }
        let body = At::root(&value);
        match self {
            Wire::Anthropic => anthropic::parse(&body),
            Wire::Responses => responses::parse(&body),
            Wire::Chat => chat::parse(&body),
        }
        .map_err(|e| WireError(format!("{} ({})", e.0, self.name())))
    }

    /// `reply` to `request`, as this API sends it: JSON, or the API's event stream when the
    /// request asked for one. Tool calls are named as the agent offered the tools
    /// ([`offered_name`]).
    pub fn render(&self, reply: &Reply, request: &GatewayRequest) -> Rendered {
        let outgoing = Outgoing::new(reply, request);
        match self {
            Wire::Anthropic => anthropic::render(&outgoing),
            Wire::Responses => responses::render(&outgoing),
            Wire::Chat => chat::render(&outgoing),
        }
    }

    /// An error answer of HTTP status `status`, in this API's error shape.
    pub fn render_error(&self, status: u16, message: &str) -> Rendered {
        match self {
            Wire::Anthropic => anthropic::render_error(status, message),
            Wire::Responses | Wire::Chat => openai_error(status, message),
        }
    }
}

/// The error shape both OpenAI APIs share.
fn openai_error(status: u16, message: &str) -> Rendered {
    let (kind, code) = match status {
        401 => ("authentication_error", Some("invalid_api_key")),
        403 => ("permission_error", None),
        404 => ("not_found_error", None),
        429 => ("rate_limit_error", Some("rate_limit_exceeded")),
        500.. => ("server_error", None),
        _ => ("invalid_request_error", None),
    };
    Rendered::json(&serde_json::json!({
        "error": {"message": message, "type": kind, "param": null, "code": code}
    }))
}

/// A tool choice mode of both OpenAI APIs.
fn openai_mode(mode: &At<'_>) -> Result<ToolChoice, WireError> {
    match mode.str()? {
        "auto" => Ok(ToolChoice::Auto),
        "required" => Ok(ToolChoice::Required),
        "none" => Ok(ToolChoice::None),
        _ => Err(mode.wrong("`auto`, `required`, `none` or an object naming a tool")),
    }
}

/// The name under which the agent offered the tool that a `mock/script` turn calls.
/// Scripts name tools `server__tool`, as mst's own `api` client offers them; agents offer
/// them their own way. In order, the first that exists among `tools`:
/// 1. a tool named exactly `script_name` (also any tool a script names as the agent does);
/// 2. `mcp__{script_name}`, Claude Code's form of an MCP server's tool (`mcp__server__tool`);
/// 3. the first tool whose name ends with `__{script_name}` (a longer prefix, such as
///    Codex's namespace `mcp__server` flattened to `mcp__server__tool`).
///
/// When none does, the same three again with every character other than an ASCII letter or
/// digit taken as `_`, since agents rewrite server names (Codex offers `mock-mcp` as
/// `mock_mcp`). `None` when nothing matches: the call goes out under the script's name.
pub fn offered_name(script_name: &str, tools: &[ToolSpec]) -> Option<String> {
    let find = |normal: fn(&str) -> String| {
        let wanted = normal(script_name);
        let exact = |prefix: &str| {
            let name = format!("{prefix}{wanted}");
            tools.iter().find(|t| normal(&t.name) == name)
        };
        exact("")
            .or_else(|| exact("mcp__"))
            .or_else(|| {
                let suffix = format!("__{wanted}");
                tools.iter().find(|t| normal(&t.name).ends_with(&suffix))
            })
            .map(|t| t.name.clone())
    };
    find(str::to_string).or_else(|| {
        find(|name| {
            name.chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect()
        })
    })
}

/// A reply as it goes out to one agent: its calls named as the agent offered the tools, and
/// an id of its own.
struct Outgoing<'a> {
    /// Hex digits to build the API's ids from: the same reply to the same conversation gets
    /// the same ids, and successive calls of a conversation different ones.
    id: String,
    model: &'a str,
    text: Option<&'a str>,
    calls: Vec<ToolCall>,
    usage: super::Usage,
    stream: bool,
    hints: &'a RenderHints,
}

impl<'a> Outgoing<'a> {
    fn new(reply: &'a Reply, request: &'a GatewayRequest) -> Self {
        let calls = reply
            .calls
            .iter()
            .map(|call| ToolCall {
                name: offered_name(&call.name, &request.tools).unwrap_or_else(|| call.name.clone()),
                ..call.clone()
            })
            .collect();
        let seed = serde_json::json!([request.turns.len(), request.turns.last(), reply]);
        Outgoing {
            id: format!("{:016x}", fnv1a(seed.to_string().as_bytes())),
            model: &request.model,
            text: reply.text.as_deref().filter(|t| !t.is_empty()),
            calls,
            usage: reply.usage,
            stream: request.stream,
            hints: &request.hints,
        }
    }

    /// Whether the model stopped to have tools called.
    fn calls_tools(&self) -> bool {
        !self.calls.is_empty()
    }
}

/// The 64-bit FNV-1a hash: stable across builds, unlike std's hasher.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// What each format reads its own way; the rest (`model`, `temperature`, `stream`) all read
/// alike ([`Read::into_request`]).
struct Read {
    conversation: Conversation,
    tools: Vec<ToolSpec>,
    tool_choice: ToolChoice,
    max_tokens: Option<u32>,
    hints: RenderHints,
}

impl Read {
    fn into_request(self, body: &At<'_>) -> Result<GatewayRequest, WireError> {
        let (system, turns) = self.conversation.finish();
        Ok(GatewayRequest {
            model: body.req("model")?.str()?.to_string(),
            system,
            turns,
            tools: self.tools,
            tool_choice: self.tool_choice,
            max_tokens: self.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            temperature: body.opt_f64("temperature")?,
            stream: body.opt_bool("stream")?.unwrap_or(false),
            hints: self.hints,
            plugin: None,
        })
    }
}

/// A conversation as it is read, message by message, into [`Turn`]s: consecutive assistant
/// messages and calls make one assistant turn (an API sends a call as its own item, or a
/// thinking block alone), consecutive tool results one results turn, and system text (also
/// from system messages in the middle of the conversation) goes to the system prompt.
#[derive(Default)]
struct Conversation {
    system: Vec<String>,
    turns: Vec<Turn>,
}

impl Conversation {
    fn system(&mut self, text: String) {
        if !text.is_empty() {
            self.system.push(text);
        }
    }

    fn user(&mut self, text: String) {
        if !text.is_empty() {
            self.turns.push(Turn::User(text));
        }
    }

    /// The assistant turn at the end, opened if the last turn is another.
    fn assistant(&mut self) -> (&mut Option<String>, &mut Vec<ToolCall>) {
        if !matches!(self.turns.last(), Some(Turn::Assistant { .. })) {
            self.turns.push(Turn::Assistant {
                text: None,
                calls: Vec::new(),
            });
        }
        match self.turns.last_mut() {
            Some(Turn::Assistant { text, calls }) => (text, calls),
            _ => unreachable!("an assistant turn was just pushed"),
        }
    }

    fn assistant_text(&mut self, more: String) {
        let (text, _) = self.assistant();
        if more.is_empty() {
            return;
        }
        match text {
            Some(text) => {
                text.push_str("\n\n");
                text.push_str(&more);
            }
            None => *text = Some(more),
        }
    }

    fn call(&mut self, call: ToolCall) {
        self.assistant().1.push(call);
    }

    fn output(&mut self, output: ToolOutput) {
        match self.turns.last_mut() {
            Some(Turn::ToolResults(outputs)) => outputs.push(output),
            _ => self.turns.push(Turn::ToolResults(vec![output])),
        }
    }

    fn finish(self) -> (Option<String>, Vec<Turn>) {
        let system = (!self.system.is_empty()).then(|| self.system.join("\n\n"));
        (system, self.turns)
    }
}

/// The text of `content`: a string, or a list of parts whose text `part` gives (`None` for a
/// part that is not text, such as a tool result), joined by blank lines.
fn text_of(
    content: &At<'_>,
    part: fn(&At<'_>) -> Result<Option<String>, WireError>,
) -> Result<String, WireError> {
    if let Some(text) = content.value().as_str() {
        return Ok(text.to_string());
    }
    if content.value().is_null() {
        return Ok(String::new());
    }
    let mut texts = Vec::new();
    for item in content.items()? {
        if let Some(text) = part(&item)? {
            texts.push(text);
        }
    }
    Ok(texts.join("\n\n"))
}

/// A tool call's arguments, sent as a JSON string: the value, or the string itself when it is
/// not JSON (the agent's own history; the model made it).
fn arguments_of(text: &str) -> serde_json::Value {
    if text.trim().is_empty() {
        return serde_json::json!({});
    }
    serde_json::from_str(text).unwrap_or_else(|_| serde_json::Value::String(text.to_string()))
}

/// The JSON Schema of a tool that declares no arguments.
fn no_arguments() -> serde_json::Value {
    serde_json::json!({"type": "object", "properties": {}})
}

/// The tool `tool` describes, offered as `name`: its `description` and its arguments' JSON
/// Schema in the field `schema` (none: no arguments).
fn tool_spec(tool: &At<'_>, name: String, schema: &str) -> Result<ToolSpec, WireError> {
    Ok(ToolSpec {
        name,
        description: tool.opt_str("description")?.unwrap_or_default().to_string(),
        input_schema: match tool.get(schema) {
            Some(schema) => schema.object()?.clone(),
            None => no_arguments(),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::Usage;
    use serde_json::json;

    /// A tool call of the model.
    pub(super) fn call(id: &str, name: &str, arguments: serde_json::Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments,
        }
    }

    /// A reply with `text` and `calls`, of 12 tokens in and 5 out.
    pub(super) fn reply(text: Option<&str>, calls: Vec<ToolCall>) -> Reply {
        Reply {
            text: text.map(str::to_string),
            calls,
            usage: Usage {
                input_tokens: 12,
                output_tokens: 5,
            },
        }
    }

    /// A tool as an agent offers it.
    pub(super) fn tool(name: &str) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: String::new(),
            input_schema: no_arguments(),
        }
    }

    /// The conversation every format's round trip goes through: a question, a tool call,
    /// its result, the answer.
    pub(super) fn tool_conversation() -> Vec<Turn> {
        vec![
            Turn::User("What time is it in Paris?".into()),
            Turn::Assistant {
                text: Some("Let me look.".into()),
                calls: vec![call(
                    "call-1-1",
                    "mcp__time__get_current_time",
                    json!({"timezone": "Europe/Paris"}),
                )],
            },
            Turn::ToolResults(vec![ToolOutput {
                id: "call-1-1".into(),
                output: "12:00".into(),
                is_error: false,
            }]),
            Turn::Assistant {
                text: Some("It is noon.".into()),
                calls: vec![],
            },
        ]
    }

    /// The reply of the conversation's assistant turn `index` (1 or 3).
    pub(super) fn reply_of(index: usize) -> Reply {
        match &tool_conversation()[index] {
            Turn::Assistant { text, calls } => reply(text.as_deref(), calls.clone()),
            other => panic!("turn {index} is {other:?}"),
        }
    }

    /// A request body read from `fixtures/`.
    pub(super) fn fixture(name: &str) -> Vec<u8> {
        let path = format!(
            "{}/src/llm/wire/fixtures/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
    }

    /// A rendered JSON body, parsed.
    pub(super) fn json_of(rendered: &Rendered) -> serde_json::Value {
        assert_eq!(rendered.content_type, "application/json");
        serde_json::from_slice(&rendered.body).expect("a JSON body")
    }

    /// `body` read as `wire`, which must succeed.
    pub(super) fn parse(wire: Wire, body: &serde_json::Value) -> GatewayRequest {
        wire.parse_request(body.to_string().as_bytes())
            .unwrap_or_else(|e| panic!("{e}: {body}"))
    }

    /// Why `body` cannot be read as `wire`.
    pub(super) fn refusal(wire: Wire, body: &serde_json::Value) -> String {
        let err = wire
            .parse_request(body.to_string().as_bytes())
            .unwrap_err()
            .0;
        assert!(err.ends_with(&format!("({})", wire.name())), "{err}");
        err
    }

    #[test]
    fn each_api_is_found_by_its_path() {
        for (path, wire) in [
            ("/v1/messages", Some(Wire::Anthropic)),
            ("/v1/messages?beta=true", Some(Wire::Anthropic)),
            ("/gateway/t0k3n/v1/messages", Some(Wire::Anthropic)),
            ("/v1/responses", Some(Wire::Responses)),
            ("/v1/responses/", Some(Wire::Responses)),
            ("/v1/chat/completions", Some(Wire::Chat)),
            ("/v1/messages/count_tokens", None),
            ("/v1/models", None),
            ("/", None),
        ] {
            assert_eq!(Wire::for_path(path), wire, "{path}");
        }
    }

    #[test]
    fn a_body_that_is_not_a_json_object_is_refused_by_name() {
        for wire in [Wire::Anthropic, Wire::Responses, Wire::Chat] {
            let err = wire.parse_request(b"{\"model\":").unwrap_err().0;
            assert!(err.starts_with("the request body is not JSON"), "{err}");
            assert!(err.contains(wire.name()), "{err}");
            let err = wire.parse_request(b"[]").unwrap_err().0;
            assert!(err.contains("not a JSON object"), "{err}");
            assert!(refusal(wire, &json!({})).contains("is missing"));
        }
    }

    #[test]
    fn scripted_tool_names_map_to_the_names_the_agent_offered() {
        let tools = [
            tool("Bash"),
            tool("mcp__time__get_current_time"),
            tool("mcp__everything__echo"),
            tool("mcp__mock_mcp__fail"),
        ];
        for (script, offered) in [
            ("Bash", Some("Bash")),
            (
                "mcp__time__get_current_time",
                Some("mcp__time__get_current_time"),
            ),
            (
                "time__get_current_time",
                Some("mcp__time__get_current_time"),
            ),
            ("everything__echo", Some("mcp__everything__echo")),
            ("echo", Some("mcp__everything__echo")),
            ("mock-mcp__fail", Some("mcp__mock_mcp__fail")),
            ("time__convert_time", None),
            ("ash", None),
        ] {
            assert_eq!(offered_name(script, &tools).as_deref(), offered, "{script}");
        }
        // An exact name wins over a longer one ending the same.
        let tools = [tool("mcp__a__echo"), tool("echo")];
        assert_eq!(offered_name("echo", &tools).as_deref(), Some("echo"));
    }

    #[test]
    fn requests_and_replies_travel_as_camel_case_json() {
        let request = GatewayRequest {
            model: "gpt-5.1-codex".into(),
            system: Some("Be brief.".into()),
            turns: tool_conversation(),
            tools: vec![tool("mcp__time__get_current_time")],
            tool_choice: ToolChoice::Required,
            max_tokens: 100,
            temperature: Some(0.5),
            stream: true,
            hints: RenderHints {
                namespaced: vec![NamespacedTool {
                    flat: "mcp__time__get_current_time".into(),
                    namespace: "mcp__time".into(),
                    function: "get_current_time".into(),
                }],
                include_usage: false,
            },
            plugin: Some("acme/judge 1.0.0".into()),
        };
        let value = serde_json::to_value(&request).unwrap();
        assert_eq!(value["toolChoice"], "required");
        assert_eq!(value["maxTokens"], 100);
        assert_eq!(
            value["turns"][0],
            json!({"user": "What time is it in Paris?"})
        );
        assert_eq!(value["turns"][1]["assistant"]["calls"][0]["id"], "call-1-1");
        assert_eq!(value["turns"][2]["toolResults"][0]["isError"], false);
        assert_eq!(value["tools"][0]["inputSchema"]["type"], "object");
        assert_eq!(value["hints"]["namespaced"][0]["namespace"], "mcp__time");
        assert!(value["hints"].get("includeUsage").is_none());
        assert_eq!(
            serde_json::from_value::<GatewayRequest>(value).unwrap(),
            request
        );

        let reply = reply(
            Some("hi"),
            vec![call("c1", "Bash", json!({"command": "ls"}))],
        );
        let value = serde_json::to_value(&reply).unwrap();
        assert_eq!(
            value["usage"],
            json!({"inputTokens": 12, "outputTokens": 5})
        );
        assert_eq!(serde_json::from_value::<Reply>(value).unwrap(), reply);

        let model = ModelRef::parse("mock/script").unwrap();
        let call = request.as_request(&model);
        assert_eq!(call.system, Some("Be brief."));
        assert_eq!(
            (call.turns.len(), call.tools.len(), call.max_tokens),
            (4, 1, 100)
        );
        assert_eq!(call.tool_choice, ToolChoice::Required);
    }

    #[test]
    fn ids_differ_between_the_calls_of_a_conversation_and_repeat_for_the_same_one() {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
        let mut request = parse(Wire::Chat, &body);
        let answer = reply(Some("hello"), vec![]);
        let id = |request: &GatewayRequest| Outgoing::new(&answer, request).id;
        let first = id(&request);
        assert_eq!(first, id(&request));
        request.turns.push(Turn::User("again".into()));
        assert_ne!(first, id(&request));
    }

    #[test]
    fn both_openai_apis_answer_errors_in_openai_s_shape() {
        for wire in [Wire::Responses, Wire::Chat] {
            let error = json_of(&wire.render_error(429, "slow down"));
            assert_eq!(error["error"]["message"], "slow down");
            assert_eq!(error["error"]["type"], "rate_limit_error");
            assert_eq!(error["error"]["code"], "rate_limit_exceeded");
            let error = json_of(&wire.render_error(400, "bad"));
            assert_eq!(error["error"]["type"], "invalid_request_error");
            assert!(error["error"]["code"].is_null());
            let error = json_of(&wire.render_error(502, "x"));
            assert_eq!(error["error"]["type"], "server_error");
        }
    }
}
