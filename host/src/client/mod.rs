//! Clients: what runs one trial and records its trace. Chosen by name (`client` in the eval
//! config): `command` (a program per trial), `mcp` (direct tool calls), `api` (a model with
//! the variant's MCP tools). A grade shard's worker grades stored trials instead
//! ([`crate::grade::remote`]).

pub mod agent_cli;
pub mod api;
pub mod command;
pub mod mcp;
pub mod tool_proxy;

use crate::eval::config::VariantSpec;
use crate::eval::trial::{CaseRecord, EventKind, TraceEvent, TraceRecord, TrialStatus};
use crate::process::GroupCommand;
use crate::secrets::Secret;
use anyhow::{bail, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// Everything a client needs to run one trial.
#[derive(Clone)]
pub struct TrialInput<'a> {
    pub case: &'a CaseRecord,
    pub variant: &'a str,
    pub trial: u32,
    /// The trial's own deadline, from its start.
    pub timeout: Duration,
    /// Set when the shard is cancelled: the client stops the trial as soon as it can.
    pub cancel: &'a AtomicBool,
    /// Where the trial's programs run: its own empty work directory, its home and, on a
    /// sandboxed machine, their sandbox.
    pub place: TrialPlace<'a>,
    /// Hears each trace event the moment the client records it (the worker streams them to
    /// the coordinator); [`NoEvents`] for callers that only read the finished trace.
    pub events: &'a dyn EventSink,
    /// In a conversation turn, hears the resume tokens the client captures; `None` elsewhere.
    pub resume: Option<&'a dyn ResumeSink>,
    /// In a conversation turn of a client that is handed its history (the `api` client),
    /// the earlier completed turns, oldest first; empty elsewhere.
    pub history: &'a [Exchange],
    /// The most tokens the trial's model calls may use, as the model gateway counts them (or,
    /// for a trial without one, its `usage` events; a playground turn's `turnTokens`): past
    /// it the client stops the trial, which ends `timed-out` with the cause in the trace's
    /// `stopped`, and the gateway refuses its calls. `None`: no limit.
    pub token_budget: Option<u64>,
    /// When trials keep artefacts: the trial's artefact directory (a `command` client's
    /// program gets it as `$MST_ARTIFACTS`), the tails of its output and the moment it
    /// failed; the worker writes the diagnosis from them. `None`: artefacts are off.
    pub evidence: Option<&'a crate::diagnosis::TrialEvidence>,
    /// Where the trial's agent calls models, when its variant's client goes through the
    /// machine's model gateway (`claude-code`, `codex`, the `api` client on a configured
    /// provider, a `command` client with `modelGateway`); `None` otherwise.
    pub gateway: Option<&'a GatewayAccess>,
}

/// Where a trial's programs run, and how they are started.
#[derive(Clone, Copy)]
pub struct TrialPlace<'a> {
    /// The trial's own empty work directory, emptied when it ends: the agent starts here, away
    /// from the bundle and the other trials' traces.
    pub work: &'a Path,
    /// The trial's own empty home directory (`HOME`), likewise: nothing of the machine's user
    /// or of another trial is in it.
    pub home: &'a Path,
    /// On a sandboxed machine, the sandbox each of the trial's programs runs in, which lets
    /// it write the two directories above and nothing else of the machine.
    pub sandbox: Option<&'a crate::sandbox::TrialSandbox<'a>>,
    /// With egress by name, the loopback port of the trial's proxy (`HTTPS_PROXY`), its one
    /// way out.
    pub proxy: Option<u16>,
}

impl TrialPlace<'_> {
    /// A program of the trial: `argv` with the minimal environment, `HOME` the trial's home,
    /// and `env` over both ([`crate::process::clean_command`]), in the trial's sandbox if it
    /// has one (refused if its program is missing). Its working directory and stdio are the
    /// caller's to set, after.
    pub fn command(
        &self,
        argv: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<Command, String> {
        let mut env = env.clone();
        env.entry("HOME".into())
            .or_insert_with(|| self.home.display().to_string());
        if let Some(port) = self.proxy {
            let proxy = format!("http://127.0.0.1:{port}");
            for name in ["HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"] {
                env.insert(name.into(), proxy.clone());
            }
            // The model gateway and the machine's other loopback services stay direct.
            for name in ["NO_PROXY", "no_proxy"] {
                env.insert(name.into(), "localhost,127.0.0.1,::1".into());
            }
        }
        let command = crate::process::clean_command(argv, &env);
        match self.sandbox {
            Some(sandbox) => sandbox.confine(command),
            None => Ok(command),
        }
    }

    /// [`Self::command`] for the trial's async runtime.
    pub fn program(
        &self,
        argv: &[String],
        env: &BTreeMap<String, String>,
    ) -> Result<GroupCommand, String> {
        self.command(argv, env).map(GroupCommand::from_clean)
    }
}

/// How a trial's agent reaches the machine's model gateway: its base URL on the loopback, and
/// the token minted for the trial (refused once the trial ended).
#[derive(Debug, Clone)]
pub struct GatewayAccess {
    pub url: String,
    pub token: Secret,
    /// The tokens (in and out) of the trial's calls so far, as the gateway passed their
    /// answers on: what its token budget counts, whatever the agent reports.
    pub used: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl GatewayAccess {
    /// The variables that point the usual model SDKs and agent CLIs at the gateway: the
    /// Anthropic and OpenAI base URLs and keys (the token, never a provider's key), and
    /// `MST_MODEL`, the variant's model.
    pub fn env(&self, model: Option<&str>) -> Vec<(String, String)> {
        let token = self.token.expose().to_string();
        let mut env = vec![
            ("ANTHROPIC_BASE_URL".to_string(), self.url.clone()),
            ("ANTHROPIC_API_KEY".to_string(), token.clone()),
            ("OPENAI_BASE_URL".to_string(), format!("{}/v1", self.url)),
            ("OPENAI_API_KEY".to_string(), token.clone()),
            ("MST_GATEWAY_URL".to_string(), self.url.clone()),
            ("MST_GATEWAY_TOKEN".to_string(), token),
        ];
        if let Some(model) = model {
            env.push(("MST_MODEL".to_string(), model.to_string()));
        }
        env
    }
}

/// The variable naming a trial's artefact directory in a `command` client's environment.
pub const ARTIFACTS_ENV: &str = "MST_ARTIFACTS";

/// One completed turn of a conversation, as a chat client keeps it: the user's message (the
/// turn's input as the client renders it, [`input_text`]) and the assistant's final answer.
/// The turn's tool calls and results are left out: a chat client shows the model its earlier
/// turns as the thread the user saw, and the tool traffic (often the bulk) is in the turn's
/// trace.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Exchange {
    pub user: String,
    pub assistant: String,
}

impl Exchange {
    /// Its size as the cap on a conversation's history counts it: the two texts' bytes.
    pub fn bytes(&self) -> usize {
        self.user.len() + self.assistant.len()
    }
}

/// Hears a trial's trace events as they are recorded, in order: exactly the events of the
/// trace the client returns, each once (a client records through a [`Recorder`], which
/// guarantees it).
pub trait EventSink: Sync {
    /// One event, just appended to the trace.
    fn emit(&self, event: &TraceEvent);
}

/// The token under which a conversation's held resume token reaches a worker, among its
/// tokens (over its stdin, never in the bundle): the `command` client with
/// `clientOptions.resume` continues that conversation.
pub const RESUME_TOKEN: &str = "conversation:resume";

/// Hears the resume tokens a client sees during a conversation turn, in order (the last one
/// wins: agent CLIs mint a new id on each resumed run).
pub trait ResumeSink: Sync {
    /// One token, just seen in the client's output.
    fn token(&self, token: Secret);
}

/// A sink that hears nothing.
pub struct NoEvents;

impl EventSink for NoEvents {
    fn emit(&self, _event: &TraceEvent) {}
}

/// A trial's trace events as a client records them: the one place that numbers an event,
/// times it from the trial's start, keeps it and tells the trial's [`EventSink`], so what was
/// streamed is always what the trace holds. It also counts the trial's tokens against its
/// budget (the gateway's count, or the `usage` events'), so every client enforces it the same
/// way: the client asks [`Recorder::past_budget`] as it goes and stops, and
/// [`Recorder::finish`] records why.
pub struct Recorder<'a> {
    started: Instant,
    events: Vec<TraceEvent>,
    sink: &'a dyn EventSink,
    token_budget: Option<u64>,
    /// Tokens (in and out) the `usage` events recorded so far count.
    tokens: u64,
    /// The tokens the trial's calls through the model gateway used, when it has one.
    through_gateway: Option<std::sync::Arc<std::sync::atomic::AtomicU64>>,
}

impl<'a> Recorder<'a> {
    /// An empty trace for a trial that started at `started`, told to `input.events`.
    pub fn new(input: &TrialInput<'a>, started: Instant) -> Self {
        Recorder {
            started,
            events: Vec::new(),
            sink: input.events,
            token_budget: input.token_budget,
            tokens: 0,
            through_gateway: input.gateway.map(|gateway| gateway.used.clone()),
        }
    }

    /// The tokens the trial's model calls used so far: with a gateway, what it passed on
    /// (the agent's own `usage` events are its claim); otherwise what the `usage` events say.
    fn tokens(&self) -> u64 {
        match &self.through_gateway {
            Some(used) => used.load(std::sync::atomic::Ordering::Relaxed),
            None => self.tokens,
        }
    }

    /// Why the trial must stop, once its `usage` events count more tokens than its budget.
    pub fn past_budget(&self) -> Option<String> {
        let tokens = self.tokens();
        let budget = self.token_budget.filter(|budget| tokens > *budget)?;
        Some(format!(
            "past its token budget: its model calls used {tokens} tokens, over the {budget} it \
             may use"
        ))
    }

    /// The trace, ended with `status`: a trial past its token budget is `timed-out`, whatever
    /// its client made of being stopped, with the cause logged and in `stopped`.
    pub fn finish(
        mut self,
        status: TrialStatus,
        final_text: Option<String>,
        exit_code: Option<i32>,
    ) -> TraceRecord {
        let stopped = self.past_budget();
        let status = match &stopped {
            Some(why) => {
                self.push(EventKind::Log {
                    text: format!("stopped: {why}"),
                });
                TrialStatus::TimedOut
            }
            None => status,
        };
        TraceRecord {
            status,
            final_text,
            exit_code,
            duration_ms: self.started.elapsed().as_millis() as u64,
            events: self.events,
            stopped,
        }
    }

    /// Appends an event that happened now.
    pub fn push(&mut self, kind: EventKind) {
        self.push_at(self.started.elapsed(), kind);
    }

    /// Appends an event that happened `at` after the trial started (output read on another
    /// thread carries its own time).
    pub fn push_at(&mut self, at: Duration, kind: EventKind) {
        if let Some((usage, _)) = kind.usage() {
            self.tokens = self
                .tokens
                .saturating_add(usage.input_tokens)
                .saturating_add(usage.output_tokens);
        }
        let event = TraceEvent {
            seq: self.events.len() as u64,
            at_ms: at.as_millis() as u64,
            kind,
        };
        self.sink.emit(&event);
        self.events.push(event);
    }

    /// When the trial started.
    pub fn started(&self) -> Instant {
        self.started
    }
}

/// Runs trials. A client never fails: whatever happens becomes the trace's status and events.
pub trait Client: Send + Sync {
    /// The client's name, e.g. `command`.
    fn name(&self) -> &'static str;
    /// Runs one trial to completion, timeout or infrastructure failure.
    fn run(&self, input: &TrialInput<'_>) -> TraceRecord;
}

/// Why a variant's `command` client would run case text as shell code, if it would
/// ([`command::script_placeholder`]); a warning, since a script may quote it with care.
pub fn shell_warning(spec: &VariantSpec) -> Option<String> {
    let options = spec
        .client_options
        .as_ref()
        .filter(|_| spec.client == "command")?;
    let command: Vec<String> = serde_json::from_value(options.get("command")?.clone()).ok()?;
    command::script_placeholder(&command)
}

/// The client a variant names, configured with its `clientOptions`, model and MCP servers.
/// `tokens` holds the access tokens the worker received, by server label.
pub fn client(spec: &VariantSpec, tokens: &BTreeMap<String, Secret>) -> Result<Box<dyn Client>> {
    let options = spec.client_options.as_ref();
    match spec.client.as_str() {
        "command" => Ok(Box::new(
            command::CommandClient::new(options, tokens)?
                .with_model(spec.model.as_deref())
                .with_tools(spec, tokens),
        )),
        "mcp" => Ok(Box::new(mcp::McpClient::new(
            &spec.servers,
            options,
            tokens,
        )?)),
        "api" => Ok(Box::new(api::ApiClient::new(spec, tokens)?)),
        "claude-code" | "codex" => {
            let cli = match spec.client.as_str() {
                "codex" => agent_cli::launch::Cli::Codex,
                _ => agent_cli::launch::Cli::ClaudeCode,
            };
            let driver = agent_cli::launch::AgentCli::new(cli, spec)?;
            Ok(Box::new(
                command::CommandClient::for_agent(std::sync::Arc::new(driver), tokens)
                    .with_tools(spec, tokens),
            ))
        }
        other => bail!(
            "unknown client `{other}`; the clients are {}",
            crate::eval::config::CLIENTS.join(", ")
        ),
    }
}

/// Checks a case's `input` as `spec`'s client will read it, so that a malformed one is a
/// dataset error before any machine starts rather than an `infra` trial after the run.
/// `mcp` parses the tool calls and resolves their servers; `api` refuses an empty prompt;
/// `command` takes any input (text as itself, other JSON as JSON text, or none at all).
pub fn check_input(spec: &VariantSpec, input: &serde_json::Value) -> Result<()> {
    let empty = input.is_null() || input.as_str().is_some_and(|t| t.trim().is_empty());
    match spec.client.as_str() {
        "mcp" => mcp::check_input(input, &spec.servers),
        "api" if empty => bail!(
            "the `api` client sends the input to the model as the user's message, and it is empty"
        ),
        _ => Ok(()),
    }
}

/// The text a case's input gives a client: a JSON string as itself, anything else as JSON.
pub fn input_text(case: &CaseRecord) -> String {
    text_of(&case.input)
}

/// The turns of a conversation case, `{"turns": [...]}` (what the playground exports, and a
/// batch trial replays in order, continuing the thread): each turn's input as a case input.
/// `None` for any other input.
pub fn conversation_turns(input: &serde_json::Value) -> Option<&[serde_json::Value]> {
    let object = input.as_object()?;
    let turns = object.get("turns")?.as_array()?;
    (object.len() == 1 && !turns.is_empty()).then_some(turns.as_slice())
}

/// An input as a client renders it to text: a string as it is, anything else as JSON.
pub fn text_of(input: &serde_json::Value) -> String {
    match input {
        serde_json::Value::String(text) => text.clone(),
        other => other.to_string(),
    }
}
