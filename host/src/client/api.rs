//! The `api` client: an agent loop on the worker. The model (the variant's `model`,
//! `provider/model`) sees the tools of the variant's MCP servers, named `server__tool`; each
//! tool call it makes is run on its server and the result goes back to it, until it answers
//! without calling a tool or `maxTurns` model calls have been made. The trial's deadline covers
//! the whole loop.
//!
//! `clientOptions`: `system`, `maxTurns` (default 10), `maxTokens` (default 1024),
//! `temperature`, `toolChoice` (`auto`, `required`, `none`: no tools offered), and for
//! `mock/script`, `mockScript` (a list of turns, or an object of lists by case id).
//!
//! In a playground conversation the model sees the earlier turns first (each user message and
//! final answer, [`super::Exchange`]; the trace says how many in a `log` event), then the new
//! message.
//!
//! A configured provider is called through the machine's model gateway, like any agent's: the
//! worker never holds the provider's key, and the host makes, limits and measures each call.
//! The built-in `mock` answers on the machine.
//!
//! The trace records the user message, every assistant message, tool call and tool result as
//! events, and each model call's token usage as a `custom` event named `usage` (on a provider,
//! the host appends those as it measured them at the gateway). A model that fails, or a server
//! that cannot be reached, makes the trial infra; a tool error is an answer.

use super::mcp::{call_tool, close, connect, drive, trace_of, Session};
use super::tool_proxy::ToolView;
use super::{input_text, Client, Exchange, GatewayAccess, Recorder, TrialInput, TrialPlace};
use crate::eval::config::{ServerConfig, ToolPolicy, VariantSpec};
use crate::eval::trial::{EventKind, TraceRecord};
use crate::llm::http::{Http, ProviderConfig};
use crate::llm::mock::{MockScript, ScriptedTurn};
use crate::llm::{
    ModelRef, ModelRequest, Provider, ToolCall, ToolChoice, ToolOutput, ToolSpec, Turn, Unlimited,
};
use crate::secrets::Secret;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::time::Instant;

/// Separates a server's label from its tool's name in the names the model sees.
const TOOL_SEPARATOR: &str = "__";

fn default_max_turns() -> u32 {
    10
}

fn default_max_tokens() -> u32 {
    1024
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    #[serde(default)]
    system: Option<String>,
    #[serde(default = "default_max_turns")]
    max_turns: u32,
    #[serde(default = "default_max_tokens")]
    max_tokens: u32,
    #[serde(default)]
    temperature: Option<f64>,
    #[serde(default)]
    tool_choice: ToolChoice,
    #[serde(default)]
    mock_script: Option<MockScript>,
}

/// The model an agent loop calls, and whether the host measures its calls (at the gateway)
/// or the loop records their usage itself (`mock`).
#[derive(Clone, Copy)]
struct ModelCalls<'a> {
    provider: &'a Provider,
    through_gateway: bool,
}

/// Runs a model with the variant's MCP tools.
pub struct ApiClient {
    model: ModelRef,
    options: Options,
    /// The configured provider, for models not `mock`.
    provider: Option<ProviderConfig>,
    servers: BTreeMap<String, ServerConfig>,
    tokens: BTreeMap<String, Secret>,
    /// What the model is shown of the servers' tools, and which calls are refused.
    policy: ToolPolicy,
}

/// Each server's own tools, as listed once in a trial, by label.
type Listed = BTreeMap<String, Vec<rmcp::model::Tool>>;

impl ApiClient {
    /// A client for the variant `spec` (its model, `clientOptions`, servers and provider);
    /// every model the options can reach is checked here, so a bad one is a config error
    /// before any machine. `tokens` holds the servers' tokens, once the worker has them.
    pub fn new(spec: &VariantSpec, tokens: &BTreeMap<String, Secret>) -> Result<Self> {
        let model = spec
            .model
            .as_deref()
            .context("the `api` client needs a `model` (`provider/model`, e.g. `mock/echo`)")?;
        let model = ModelRef::parse(model)?;
        let options: Options = match &spec.client_options {
            Some(value) => serde_json::from_value(value.clone())
                .map_err(crate::eval::config::suggesting)
                .context("clientOptions for the `api` client")?,
            None => serde_json::from_value(serde_json::json!({}))?,
        };
        if options.max_turns == 0 {
            bail!("clientOptions.maxTurns must be at least 1");
        }
        let client = ApiClient {
            model,
            options,
            provider: spec.provider.clone(),
            servers: spec.servers.clone(),
            tokens: tokens.clone(),
            policy: spec.tool_policy.clone(),
        };
        match &client.options.mock_script {
            Some(MockScript::ByCase(scripts)) => {
                for (case, script) in scripts {
                    client
                        .configured(Some(script))
                        .with_context(|| format!("clientOptions.mockScript.{case}"))?;
                }
            }
            script => {
                let script = match script {
                    Some(MockScript::All(turns)) => Some(turns.as_slice()),
                    _ => None,
                };
                client.configured(script)?;
            }
        }
        Ok(client)
    }

    /// The model as configured, with `script` for `mock/script`: `mock`, or the configured
    /// provider (an error names what to add when it is not).
    fn configured(&self, script: Option<&[ScriptedTurn]>) -> Result<Provider> {
        Provider::new(&self.model, script, self.provider.as_ref(), None)
    }

    /// The model a trial calls: `mock` on the machine, or the configured provider through
    /// the trial's `gateway` (the host calls the provider with the key only it holds).
    fn provider_for(
        &self,
        script: Option<&[ScriptedTurn]>,
        gateway: Option<&GatewayAccess>,
    ) -> Result<(Provider, bool)> {
        match (self.configured(script)?, gateway) {
            (Provider::Http(_), Some(gateway)) => Ok((
                Provider::Http(Http::gateway(&gateway.url, &gateway.token)),
                true,
            )),
            (Provider::Http(_), None) => bail!(
                "model `{}` is called through mst's model gateway, and this trial has none",
                self.model
            ),
            (mock, _) => Ok((mock, false)),
        }
    }

    /// The scripted turns for case `id`, if the options have any.
    fn script_for(&self, id: &str) -> Option<&[ScriptedTurn]> {
        self.options.mock_script.as_ref()?.for_case(id)
    }

    /// The loop: servers and their tools, then model calls and tool calls until an answer;
    /// the model sees a conversation's `history` before `prompt`.
    async fn agent_loop(
        &self,
        model: ModelCalls<'_>,
        history: &[Exchange],
        prompt: String,
        place: &TrialPlace<'_>,
        trace: &mut Recorder<'_>,
    ) -> Result<Option<String>> {
        let (sessions, listed, tools) = self.open_servers(place, trace).await?;
        let mut turns = Vec::with_capacity(history.len() * 2 + 1);
        if !history.is_empty() {
            // The earlier turns are in their own traces: this one only says they were sent.
            trace.push(EventKind::Log {
                text: format!(
                    "continues a conversation: the model sees its {} earlier turn(s) (each \
                     message and final answer) before this message",
                    history.len()
                ),
            });
        }
        for exchange in history {
            turns.push(Turn::User(exchange.user.clone()));
            turns.push(Turn::Assistant {
                text: Some(exchange.assistant.clone()),
                calls: Vec::new(),
            });
        }
        trace.push(EventKind::Message {
            role: "user".into(),
            text: prompt.clone(),
        });
        turns.push(Turn::User(prompt));
        for _ in 0..self.options.max_turns {
            let request = ModelRequest {
                model: &self.model,
                system: self.options.system.as_deref(),
                turns: &turns,
                tools: &tools,
                tool_choice: self.options.tool_choice,
                max_tokens: self.options.max_tokens,
                temperature: self.options.temperature,
            };
            // No slot is taken here: the host takes the provider's when it makes the call.
            let reply = model
                .provider
                .complete(&Unlimited, &request)
                .await
                .map_err(|e| anyhow::anyhow!("model `{}`: {e}", self.model))?;
            // Through the gateway, the host records the call's usage, and the budget counts
            // what the gateway passed on.
            if !model.through_gateway {
                trace.push(self.usage_event(&reply.usage));
            }
            if let Some(text) = &reply.text {
                trace.push(EventKind::Message {
                    role: "assistant".into(),
                    text: text.clone(),
                });
            }
            // Past the token budget the loop makes no further call: the trial ends stopped
            // (`Recorder::finish`), with what the model said last.
            if reply.calls.is_empty() || trace.past_budget().is_some() {
                close(sessions).await;
                return Ok(reply.text);
            }
            let servers = Servers {
                sessions: &sessions,
                listed: &listed,
                policy: &self.policy,
            };
            let outputs = run_tool_calls(&reply.calls, &servers, trace).await?;
            turns.push(Turn::Assistant {
                text: reply.text,
                calls: reply.calls,
            });
            turns.push(Turn::ToolResults(outputs));
        }
        let text = format!(
            "stopped after maxTurns ({}) model calls without a final answer",
            self.options.max_turns
        );
        trace.push(EventKind::Log { text });
        close(sessions).await;
        Ok(None)
    }

    /// Connects the variant's servers and lists their tools (recorded as `tools-listed`), and
    /// as the model sees them through the variant's tool policy (`server__tool`; none with
    /// `toolChoice: none`).
    async fn open_servers(
        &self,
        place: &TrialPlace<'_>,
        trace: &mut Recorder<'_>,
    ) -> Result<(BTreeMap<String, Session>, Listed, Vec<ToolSpec>)> {
        let mut sessions = BTreeMap::new();
        let mut listed = Listed::new();
        let mut tools = Vec::new();
        for (label, config) in &self.servers {
            let session = connect(config, label, &self.tokens, place)
                .await
                .with_context(|| format!("MCP server `{label}`"))?;
            if self.options.tool_choice != ToolChoice::None {
                let own = session
                    .service
                    .list_all_tools()
                    .await
                    .with_context(|| format!("MCP server `{label}`: cannot list its tools"))?;
                let view = ToolView {
                    label,
                    policy: &self.policy,
                };
                trace.push(view.listed_event(&own));
                tools.extend(view.shown(&own).into_iter().map(|tool| ToolSpec {
                    name: format!("{label}{TOOL_SEPARATOR}{}", tool.name),
                    description: tool.description.unwrap_or_default().into_owned(),
                    input_schema: serde_json::Value::Object((*tool.input_schema).clone()),
                }));
                listed.insert(label.clone(), own);
            }
            sessions.insert(label.clone(), session);
        }
        Ok((sessions, listed, tools))
    }

    /// The `usage` event of one call to `mock` (which has no price; a provider's calls are
    /// recorded by the host, as it measured them).
    fn usage_event(&self, usage: &crate::llm::Usage) -> EventKind {
        EventKind::Custom {
            name: "usage".into(),
            data: serde_json::json!({"model": self.model.to_string(), "usage": usage}),
        }
    }
}

/// A trial's servers as its tool calls reach them: their sessions, their own tools, and the
/// variant's tool policy.
struct Servers<'s> {
    sessions: &'s BTreeMap<String, Session>,
    listed: &'s Listed,
    policy: &'s ToolPolicy,
}

/// Runs the model's tool calls on their servers, in order, recording each call and result; a
/// name no server shows is an error result the model sees, and a call the tool policy refuses
/// (a dry run's write) is recorded as blocked and never reaches its server.
async fn run_tool_calls(
    calls: &[ToolCall],
    servers: &Servers<'_>,
    trace: &mut Recorder<'_>,
) -> Result<Vec<ToolOutput>> {
    let mut outputs = Vec::new();
    for call in calls {
        let route = call.name.split_once(TOOL_SEPARATOR);
        // The server's own tool the shown name stands for.
        let target = route.and_then(|(label, shown)| {
            let view = ToolView {
                label,
                policy: servers.policy,
            };
            let tool = view.resolve(servers.listed.get(label)?, shown)?;
            Some((label, servers.sessions.get(label)?, tool, view))
        });
        trace.push(EventKind::ToolCall {
            id: call.id.clone(),
            server: route.map(|(label, _)| label.to_string()),
            tool: match (&target, route) {
                (Some((_, _, tool, _)), _) => tool.name.to_string(),
                (None, Some((_, shown))) => shown.to_string(),
                (None, None) => call.name.clone(),
            },
            arguments: call.arguments.clone(),
        });
        let call_started = Instant::now();
        let (output, is_error) = match &target {
            Some((_, _, tool, view)) if view.refusal(tool).is_some() => {
                let reason = view.refusal(tool).unwrap_or_default();
                for event in view.blocked_events(&call.id, tool, reason) {
                    trace.push(event);
                }
                outputs.push(ToolOutput {
                    id: call.id.clone(),
                    output: reason.to_string(),
                    is_error: true,
                });
                continue;
            }
            Some((label, session, tool, _)) => {
                let arguments = match &call.arguments {
                    serde_json::Value::Object(map) => map.clone(),
                    _ => Default::default(),
                };
                call_tool(session, label, &tool.name, arguments).await?
            }
            None => (format!("there is no tool `{}`", call.name), true),
        };
        trace.push(EventKind::ToolResult {
            id: call.id.clone(),
            output: output.clone(),
            is_error,
            duration_ms: call_started.elapsed().as_millis() as u64,
        });
        outputs.push(ToolOutput {
            id: call.id.clone(),
            output,
            is_error,
        });
    }
    Ok(outputs)
}

impl Client for ApiClient {
    fn name(&self) -> &'static str {
        "api"
    }

    fn run(&self, input: &TrialInput<'_>) -> TraceRecord {
        let mut trace = Recorder::new(input, Instant::now());
        let script = self.script_for(&input.case.id);
        let (provider, through_gateway) = match self.provider_for(script, input.gateway) {
            Ok(provider) => provider,
            Err(e) => {
                let why = e.context(format!("case `{}`", input.case.id));
                return trace_of(super::mcp::Outcome::Failed(why), trace);
            }
        };
        // A batch trial of a conversation case (exported from the playground) replays its
        // turns, each with the earlier ones as its history; a playground turn is one turn.
        let replayed = match input.resume {
            None => super::conversation_turns(&input.case.input),
            Some(_) => None,
        };
        let calls = ModelCalls {
            provider: &provider,
            through_gateway,
        };
        let outcome = drive(input, async {
            let Some(turns) = replayed else {
                let prompt = input_text(input.case);
                return self
                    .agent_loop(calls, input.history, prompt, &input.place, &mut trace)
                    .await;
            };
            let mut history: Vec<Exchange> = Vec::new();
            let mut answer = None;
            for (n, turn) in turns.iter().enumerate() {
                let text = format!("turn {} of {}", n + 1, turns.len());
                trace.push(EventKind::Log { text });
                let prompt = super::text_of(turn);
                answer = self
                    .agent_loop(calls, &history, prompt.clone(), &input.place, &mut trace)
                    .await?;
                match &answer {
                    _ if trace.past_budget().is_some() => break,
                    Some(reply) => history.push(Exchange {
                        user: prompt,
                        assistant: reply.clone(),
                    }),
                    // A turn without an answer ends the replay: the next has nothing to follow.
                    None => break,
                }
            }
            Ok(answer)
        });
        trace_of(outcome, trace)
    }
}
