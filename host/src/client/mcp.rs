//! The `mcp` client: direct tool calls against the variant's MCP servers (stdio or streamable
//! HTTP), through the rmcp crate. No model is involved: the case names the calls.
//!
//! A case's `input` is one call, `{"tool": "get_current_time", "arguments": {…}, "server": "time"}`,
//! or several, `{"calls": [ … ]}`. `server` may be left out when the variant has one server.
//! Each call becomes a `tool-call` and a `tool-result` event; the last call's text output is the
//! final answer. A tool error is an answer (recorded with `isError`), not an infrastructure
//! failure; a server that cannot be started or reached is. Each trial starts its servers afresh,
//! so no state leaks from one trial to the next.

use super::{Client, Recorder, TrialInput, TrialPlace};
use crate::eval::config::ServerConfig;
use crate::eval::trial::{EventKind, TraceRecord, TrialStatus};
use crate::process::AsyncGroupChild;
use crate::secrets::Secret;
use anyhow::{bail, Context, Result};
use reqwest::header::{HeaderName, HeaderValue};
use rmcp::model::CallToolRequestParams;
use rmcp::service::RunningService;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{RoleClient, ServiceExt};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// One tool call a case asks for.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Call {
    tool: String,
    #[serde(default)]
    arguments: serde_json::Map<String, serde_json::Value>,
    server: Option<String>,
}

/// `{"calls": [ … ]}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Many {
    calls: Vec<Call>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum CaseInput {
    Many(Many),
    One(Call),
}

/// The calls a case's `input` asks for, each with the label of the server it goes to (its
/// `server`, or the variant's only one). `prepare` checks every case with this before any
/// machine starts; the trial uses it again to run them.
fn calls_of(
    input: &serde_json::Value,
    servers: &BTreeMap<String, ServerConfig>,
) -> Result<Vec<(String, Call)>> {
    let calls = match serde_json::from_value::<CaseInput>(input.clone()) {
        Ok(CaseInput::Many(Many { calls })) => calls,
        Ok(CaseInput::One(call)) => vec![call],
        // The untagged enum's own error says nothing; each shape's says what is wrong.
        Err(_) => {
            let why = match input.get("calls") {
                Some(_) => serde_json::from_value::<Many>(input.clone()).err(),
                None => serde_json::from_value::<Call>(input.clone()).err(),
            }
            .map(crate::eval::config::suggesting);
            bail!(
                "the mcp client needs an input `{{\"tool\", \"arguments\"?, \"server\"?}}` or \
                 `{{\"calls\": [ … ]}}`, not {input}{}",
                why.map(|e| format!(": {e}")).unwrap_or_default()
            )
        }
    };
    if calls.is_empty() {
        bail!("the mcp client's input `calls` is empty: name at least one tool call");
    }
    calls
        .into_iter()
        .enumerate()
        .map(|(index, call)| {
            let label = match &call.server {
                Some(label) if servers.contains_key(label) => label.clone(),
                Some(label) => bail!(
                    "call {} names server `{label}`, which the variant does not have; it has {}",
                    index + 1,
                    labels(servers)
                ),
                None if servers.len() == 1 => servers.keys().next().expect("one server").clone(),
                None if servers.is_empty() => bail!("the variant has no MCP servers"),
                None => bail!(
                    "call {} names no `server`, and the variant has several: {}",
                    index + 1,
                    labels(servers)
                ),
            };
            Ok((label, call))
        })
        .collect()
}

/// The servers' labels, for messages.
fn labels(servers: &BTreeMap<String, ServerConfig>) -> String {
    let labels: Vec<String> = servers.keys().map(|l| format!("`{l}`")).collect();
    labels.join(", ")
}

/// Checks a case's `input` for the `mcp` client with `servers` (the variant's), as the trial
/// would read it.
pub fn check_input(
    input: &serde_json::Value,
    servers: &BTreeMap<String, ServerConfig>,
) -> Result<()> {
    calls_of(input, servers).map(drop)
}

/// Calls tools on MCP servers.
pub struct McpClient {
    servers: BTreeMap<String, ServerConfig>,
    tokens: BTreeMap<String, Secret>,
}

impl McpClient {
    /// A client for `servers` (the variant's); `clientOptions` must be empty.
    pub fn new(
        servers: &BTreeMap<String, ServerConfig>,
        options: Option<&serde_json::Value>,
        tokens: &BTreeMap<String, Secret>,
    ) -> Result<Self> {
        if let Some(options) = options.filter(|o| !o.as_object().is_some_and(|m| m.is_empty())) {
            bail!("the `mcp` client takes no clientOptions (got {options}); the case input names the calls");
        }
        if servers.is_empty() {
            bail!("the `mcp` client needs at least one MCP server in `servers`");
        }
        Ok(Self {
            servers: servers.clone(),
            tokens: tokens.clone(),
        })
    }
}

/// How long a stdio server has to exit once its session is closed (it sees the end of its
/// input), before its process group is killed.
const SERVER_EXIT: Duration = Duration::from_secs(3);

/// A connected MCP server; a stdio server's whole process group goes when it is dropped.
pub(super) struct Session {
    pub(super) service: RunningService<RoleClient, ()>,
    /// A stdio server's process, speaking MCP on its stdin and stdout.
    server: Option<AsyncGroupChild>,
}

impl Session {
    /// Ends the session politely: a stdio server sees the end of its input and has
    /// [`SERVER_EXIT`] to exit; then its process group goes anyway, with any helper it left
    /// (launchers such as npx leave one, which would outlive the trial and hold the worker's
    /// stderr).
    pub(super) async fn close(self) {
        let _ = self.service.cancel().await;
        if let Some(mut server) = self.server {
            let _ = tokio::time::timeout(SERVER_EXIT, server.wait()).await;
        }
    }
}

/// The last [`STDERR_TAIL`] bytes a stdio server wrote on its stderr, which is passed on to the
/// worker's own stderr as it comes: what an error says when the server did not start (a
/// Python without the server's module, a missing file), instead of only "connection closed".
#[derive(Clone, Default)]
struct StderrTail(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

/// Bytes of a server's stderr an error quotes.
const STDERR_TAIL: usize = 2048;

impl StderrTail {
    fn follow(mut stderr: tokio::process::ChildStderr) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let tail = StderrTail::default();
        let kept = tail.0.clone();
        tokio::spawn(async move {
            let (mut out, mut buf) = (tokio::io::stderr(), [0u8; 4096]);
            while let Ok(n @ 1..) = stderr.read(&mut buf).await {
                let _ = out.write_all(&buf[..n]).await;
                let mut kept = kept.lock().expect("stderr tail");
                kept.extend_from_slice(&buf[..n]);
                let excess = kept.len().saturating_sub(STDERR_TAIL);
                kept.drain(..excess);
            }
        });
        tail
    }

    /// "MCP initialization failed", with what `program` last said on its stderr.
    fn explain(&self, program: &str) -> String {
        let kept = self.0.lock().expect("stderr tail");
        let said = String::from_utf8_lossy(&kept);
        let said = said.trim();
        match said.is_empty() {
            true => format!("MCP initialization failed (`{program}` wrote nothing on stderr)"),
            false => format!("MCP initialization failed; `{program}`'s stderr ended: {said}"),
        }
    }
}

/// Starts (stdio) or reaches (streamable HTTP) server `label`, with the secrets its entry
/// names: its token (under `label`) and its `envSecrets`/`headerSecrets` (`secret:NAME`).
pub(super) async fn connect(
    config: &ServerConfig,
    label: &str,
    tokens: &BTreeMap<String, Secret>,
    place: &TrialPlace<'_>,
) -> Result<Session> {
    prepare(config, label, tokens, place)?.open().await
}

/// A server ready to be started or reached: everything taken from the config, the tokens and
/// the trial's place, so that it can be opened later, on first use (the tool proxy's).
pub(super) enum Pending {
    /// The server's program, set up to run in the trial's place.
    Stdio {
        command: crate::process::GroupCommand,
        program: String,
    },
    /// The transport to a streamable-HTTP server, with its headers.
    Http {
        transport: rmcp::transport::StreamableHttpClientTransport<reqwest::Client>,
        url: String,
    },
}

/// [`connect`]'s first half: the server's command or transport, with its secrets.
pub(super) fn prepare(
    config: &ServerConfig,
    label: &str,
    tokens: &BTreeMap<String, Secret>,
    place: &TrialPlace<'_>,
) -> Result<Pending> {
    let secret = |name: &str| {
        tokens
            .get(&crate::secrets::secret_token(name))
            .with_context(|| format!("no value for secret `{name}` reached this worker"))
    };
    match config {
        ServerConfig::Stdio(server) => {
            let mut argv = vec![server.command.clone()];
            argv.extend(server.args.iter().cloned());
            // A sandbox of its own on a sandboxed machine, like each of the trial's programs.
            let mut command = place
                .program(&argv, &server.env)
                .map_err(|why| anyhow::anyhow!("cannot start `{}`: {why}", server.command))?;
            // In the trial's own directory, like the agent: a server that works on files (a
            // filesystem server given `.`) sees the trial's files only. `cwd` is checked to be
            // inside it when the config is read.
            let dir = match &server.cwd {
                Some(cwd) => {
                    let dir = place.work.join(cwd);
                    std::fs::create_dir_all(&dir)
                        .with_context(|| format!("cannot create its cwd `{cwd}`"))?;
                    dir
                }
                None => place.work.to_path_buf(),
            };
            // MCP on its stdin and stdout; its stderr goes on to the worker's, as a log, and
            // its end is kept to say why the server did not start, if it does not.
            command
                .command_mut()
                .current_dir(dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (var, name) in &server.env_secrets {
                command.command_mut().env(var, secret(name)?.expose());
            }
            Ok(Pending::Stdio {
                command,
                program: server.command.clone(),
            })
        }
        ServerConfig::Http(server) => {
            let mut transport_config =
                StreamableHttpClientTransportConfig::with_uri(server.url.as_str());
            if let Some(token) = tokens.get(label) {
                transport_config = transport_config.auth_header(token.expose());
            } else if let Some(name) = &server.token {
                bail!("no token for secret `{name}` reached this worker");
            }
            let mut headers = std::collections::HashMap::new();
            for (name, value) in &server.headers {
                headers.insert(
                    header_name(name)?,
                    HeaderValue::from_str(value).with_context(|| {
                        format!("header `{name}` has a value that cannot be sent")
                    })?,
                );
            }
            for (name, secret_name) in &server.header_secrets {
                // Not shown in a value's Debug output, so never in an error or log line.
                let mut value =
                    HeaderValue::from_str(secret(secret_name)?.expose()).with_context(|| {
                        format!("secret `{secret_name}` cannot be sent as header `{name}`")
                    })?;
                value.set_sensitive(true);
                headers.insert(header_name(name)?, value);
            }
            transport_config = transport_config.custom_headers(headers);
            // rmcp's own client would panic on a machine without a CA store.
            let client = crate::net::client(|builder| {
                builder
                    .pool_max_idle_per_host(0)
                    .redirect(crate::net::same_origin_redirects())
            })
            .map_err(anyhow::Error::msg)?;
            let transport = rmcp::transport::StreamableHttpClientTransport::with_client(
                client,
                transport_config,
            );
            Ok(Pending::Http {
                transport,
                url: server.url.clone(),
            })
        }
    }
}

impl Pending {
    /// [`connect`]'s second half: starts the program, or reaches the URL, and speaks MCP.
    pub(super) async fn open(self) -> Result<Session> {
        match self {
            Pending::Stdio { command, program } => {
                let mut child = AsyncGroupChild::spawn(command)
                    .with_context(|| format!("cannot start `{program}`"))?;
                let (stdin, stdout, stderr) = child.take_pipes();
                let tail = StderrTail::follow(stderr.expect("piped"));
                let pipes = (stdout.expect("piped"), stdin.expect("piped"));
                let service = match ().serve(pipes).await {
                    Ok(service) => service,
                    Err(e) => {
                        // The server has usually exited: give its last words a moment.
                        let _ = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        return Err(anyhow::Error::new(e).context(tail.explain(&program)));
                    }
                };
                Ok(Session {
                    service,
                    server: Some(child),
                })
            }
            Pending::Http { transport, url } => {
                let service =
                    ().serve(transport)
                        .await
                        .with_context(|| format!("cannot connect to {url}"))?;
                Ok(Session {
                    service,
                    server: None,
                })
            }
        }
    }
}

/// A configured header's name (checked when the config was read).
fn header_name(name: &str) -> Result<HeaderName> {
    HeaderName::from_bytes(name.as_bytes())
        .with_context(|| format!("{name:?} is not a header name"))
}

/// The text of a tool's result: its text blocks, or its structured content without any.
pub(super) fn text_of(result: &rmcp::model::CallToolResult) -> String {
    let texts: Vec<&str> = result
        .content
        .iter()
        .filter_map(|c| c.as_text().map(|t| t.text.as_str()))
        .collect();
    if texts.is_empty() {
        result
            .structured_content
            .as_ref()
            .map(|v| v.to_string())
            .unwrap_or_default()
    } else {
        texts.join("\n")
    }
}

/// Calls `tool` on `session` (server `label`): its text output and whether it is an error. A
/// tool error or a JSON-RPC error (unknown tool, bad arguments) is the server's answer; only a
/// server that fails is an error here.
pub(super) async fn call_tool(
    session: &Session,
    label: &str,
    tool: &str,
    arguments: serde_json::Map<String, serde_json::Value>,
) -> Result<(String, bool)> {
    let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
    match session.service.call_tool(params).await {
        Ok(result) => Ok((text_of(&result), result.is_error.unwrap_or(false))),
        Err(rmcp::ServiceError::McpError(error)) => Ok((error.message.to_string(), true)),
        Err(other) => {
            Err(anyhow::Error::new(other).context(format!("MCP server `{label}` failed")))
        }
    }
}

/// Runs the calls; returns the events and the last output, or why the trial is infra.
async fn run_calls(
    servers: &BTreeMap<String, ServerConfig>,
    tokens: &BTreeMap<String, Secret>,
    calls: &[(String, Call)],
    place: &TrialPlace<'_>,
    trace: &mut Recorder<'_>,
) -> Result<Option<String>> {
    let mut sessions: BTreeMap<String, Session> = BTreeMap::new();
    let mut last = None;
    for (index, (label, call)) in calls.iter().enumerate() {
        let label = label.clone();
        let config = &servers[&label];
        if !sessions.contains_key(&label) {
            let session = connect(config, &label, tokens, place)
                .await
                .with_context(|| format!("MCP server `{label}`"))?;
            sessions.insert(label.clone(), session);
        }
        let session = &sessions[&label];
        let id = (index + 1).to_string();
        trace.push(EventKind::ToolCall {
            id: id.clone(),
            server: Some(label.clone()),
            tool: call.tool.clone(),
            arguments: serde_json::Value::Object(call.arguments.clone()),
        });
        let call_started = Instant::now();
        let (output, is_error) =
            call_tool(session, &label, &call.tool, call.arguments.clone()).await?;
        trace.push(EventKind::ToolResult {
            id,
            output: output.clone(),
            is_error,
            duration_ms: call_started.elapsed().as_millis() as u64,
        });
        last = Some(output);
    }
    close(sessions).await;
    Ok(last)
}

/// Ends the sessions politely ([`Session::close`]).
pub(super) async fn close(sessions: BTreeMap<String, Session>) {
    for (_, session) in sessions {
        session.close().await;
    }
}

impl Client for McpClient {
    fn name(&self) -> &'static str {
        "mcp"
    }

    fn run(&self, input: &TrialInput<'_>) -> TraceRecord {
        let mut trace = Recorder::new(input, Instant::now());
        let calls = match calls_of(&input.case.input, &self.servers) {
            Ok(calls) => calls,
            Err(e) => {
                let why = e.context(format!("case `{}`", input.case.id));
                return trace_of(Outcome::Failed(why), trace);
            }
        };
        let outcome = drive(
            input,
            run_calls(
                &self.servers,
                &self.tokens,
                &calls,
                &input.place,
                &mut trace,
            ),
        );
        trace_of(outcome, trace)
    }
}

/// How an async trial body ended.
pub(super) enum Outcome {
    Answered(Option<String>),
    TimedOut,
    Cancelled,
    /// The trial could not run (a server failed, the model failed): infra.
    Failed(anyhow::Error),
}

thread_local! {
    /// The trial thread's async runtime, kept between trials while no task outlives one.
    static TRIAL_RUNTIME: std::cell::RefCell<Option<tokio::runtime::Runtime>> =
        const { std::cell::RefCell::new(None) };
}

/// Runs `body` to its end on this thread's trial runtime. A body that leaves tasks behind (an
/// MCP session's transport, say) has its runtime dropped with them, which kills stdio servers
/// with their process groups ([`AsyncGroupChild`]); a clean one's runtime serves the next
/// trial, so a trial does not pay for a new runtime (an epoll set, timers) each time.
pub(super) fn on_trial_runtime<F: std::future::Future>(body: F) -> Result<F::Output> {
    let kept = TRIAL_RUNTIME.with(|kept| kept.borrow_mut().take());
    let runtime = match kept {
        Some(runtime) => runtime,
        None => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .context("cannot start an async runtime")?,
    };
    let output = runtime.block_on(body);
    if runtime.metrics().num_alive_tasks() == 0 {
        TRIAL_RUNTIME.with(|kept| *kept.borrow_mut() = Some(runtime));
    }
    Ok(output)
}

/// Runs an async trial body on this thread's trial runtime ([`on_trial_runtime`]), until it
/// ends, the trial's deadline passes, or the shard is cancelled.
pub(super) fn drive(
    input: &TrialInput<'_>,
    body: impl std::future::Future<Output = Result<Option<String>>>,
) -> Outcome {
    let cancel = input.cancel;
    let outcome = on_trial_runtime(async {
        let cancelled = async {
            while !cancel.load(Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::select! {
            result = tokio::time::timeout(input.timeout, body) => match result {
                Ok(Ok(answer)) => Outcome::Answered(answer),
                Ok(Err(e)) => Outcome::Failed(e),
                Err(_elapsed) => Outcome::TimedOut,
            },
            () = cancelled => Outcome::Cancelled,
        }
    });
    outcome.unwrap_or_else(Outcome::Failed)
}

/// The trace of a trial that ended with `outcome` after recording `trace`.
pub(super) fn trace_of(outcome: Outcome, mut trace: Recorder<'_>) -> TraceRecord {
    let (status, final_text) = match outcome {
        Outcome::Answered(text) => (TrialStatus::Completed, text),
        Outcome::TimedOut => (TrialStatus::TimedOut, None),
        Outcome::Cancelled | Outcome::Failed(_) => {
            let text = match outcome {
                Outcome::Failed(e) => format!("{e:#}"),
                _ => "cancelled".to_string(),
            };
            trace.push(EventKind::Log { text });
            (TrialStatus::Infra, None)
        }
    };
    trace.finish(status, final_text, None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn servers(labels: &[&str]) -> BTreeMap<String, ServerConfig> {
        let server = |label: &str| {
            let entry = json!({"url": format!("http://127.0.0.1:1/{label}")});
            (label.to_string(), serde_json::from_value(entry).unwrap())
        };
        labels.iter().map(|l| server(l)).collect()
    }

    #[test]
    fn case_inputs_are_checked_as_the_trial_reads_them() {
        let one = servers(&["time"]);
        let two = servers(&["time", "web"]);
        let ok = json!({"tool": "now", "arguments": {"tz": "UTC"}});
        assert!(check_input(&ok, &one).is_ok());
        let many =
            json!({"calls": [{"tool": "a", "server": "web"}, {"tool": "b", "server": "time"}]});
        let resolved = calls_of(&many, &two).unwrap();
        let labels: Vec<&str> = resolved.iter().map(|(l, _)| l.as_str()).collect();
        assert_eq!(labels, ["web", "time"]);
        for (input, servers, says) in [
            (json!("What time is it?"), &one, "needs an input `{\"tool\""),
            (
                json!({"tool": "now", "argument": {}}),
                &one,
                "unknown field `argument`, expected one of `tool`, `arguments`, `server` (did you mean `arguments`?)",
            ),
            (
                json!({"calls": [{"tool": "a", "server": "web", "args": {}}]}),
                &two,
                "unknown field `args`",
            ),
            (json!({"calls": []}), &one, "`calls` is empty"),
            (json!({"tool": "now"}), &two, "call 1 names no `server`"),
            (
                json!({"tool": "now", "server": "clock"}),
                &two,
                "names server `clock`, which the variant does not have; it has `time`, `web`",
            ),
        ] {
            let err = format!("{:#}", check_input(&input, servers).unwrap_err());
            assert!(err.contains(says), "{input}: {err}");
        }
    }
}
