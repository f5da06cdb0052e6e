//! The tool proxy: the worker stands between a trial's client and each of its variant's MCP
//! servers, so every call is seen whoever makes it. Each server is served to the client as
//! streamable HTTP on the machine's loopback (where trial sandboxes share the network, like
//! the model gateway), one path per server, behind a bearer token minted for the trial; the
//! proxy forwards to the real server (stdio or HTTP, started or reached with the tokens only
//! the worker holds) and records each call and its result as trace events. On the way it
//! applies the variant's tool policy (`tools`, `dryRun`): descriptions and schemas rewritten,
//! tools hidden or renamed, and under a dry run every call to a tool not annotated read-only
//! refused (`blocked: dry run`) before it reaches the server.
//!
//! A `command` client's program finds the proxy through `MST_MCP_CONFIG`, a file in the
//! `mcpServers` format Claude Code, Claude Desktop and Cursor read.

use super::mcp::{self, Pending, Session};
use super::TrialPlace;
use crate::eval::config::{ServerConfig, ToolPolicy};
use crate::eval::trial::{EventKind, ShownTool};
use crate::secrets::Secret;
use anyhow::{Context, Result};
use axum::response::IntoResponse;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc::UnboundedSender;

/// The variable naming the `mcpServers` file a `command` client's program reads.
pub const MCP_CONFIG_ENV: &str = "MST_MCP_CONFIG";

/// What a dry run answers a refused call with, and records.
pub const DRY_RUN_REFUSAL: &str = "blocked: dry run";

/// The most calls the proxy serves in one trial; past it a call is refused (an agent caught in
/// a loop must not grow the worker's memory and the trace without bound).
const MAX_CALLS_PER_TRIAL: u64 = 10_000;

/// The most bytes of one result the trace keeps; the client gets the whole result.
const MAX_RECORDED_OUTPUT: usize = 64 * 1024;

/// A trace event the proxy recorded, timed from the trial's start.
pub type ProxyEvent = (EventKind, Duration);

/// Where a client reaches one server through the proxy: its URL and the headers to send (the
/// trial's bearer token).
#[derive(Debug, Clone)]
pub struct Endpoint {
    pub url: String,
    pub headers: BTreeMap<String, String>,
}

/// One trial's proxy: its servers, served until [`ToolProxy::close`].
pub struct ToolProxy {
    /// Each server's label and the URL the client reaches it at.
    urls: BTreeMap<String, String>,
    /// The bearer token the client presents; any other request is refused.
    token: Secret,
    upstreams: Vec<Arc<Upstream>>,
    stop: tokio_util::sync::CancellationToken,
    served: tokio::task::JoinHandle<()>,
}

/// One real server, as the proxy reaches it: started (or reached) when the client first asks
/// for it, so a variant whose program never speaks MCP starts no server.
struct Upstream {
    label: String,
    /// The server ready to open, until it is.
    pending: std::sync::Mutex<Option<Pending>>,
    session: tokio::sync::OnceCell<Session>,
    /// The server's tools, listed once (what the policy rewrites, and their annotations).
    tools: tokio::sync::OnceCell<Vec<Tool>>,
}

impl Upstream {
    /// The session, opened on first use; an error says why the server is not there.
    async fn session(&self) -> Result<&Session, String> {
        self.session
            .get_or_try_init(|| async {
                let pending = self.pending.lock().expect("pending server").take();
                let pending = pending.ok_or("it failed to start earlier in this trial")?;
                pending.open().await.map_err(|e| format!("{e:#}"))
            })
            .await
            .map_err(|why| format!("MCP server `{}` is not available: {why}", self.label))
    }
}

impl ToolProxy {
    /// Prepares every server of `servers` for the trial at `place` (each started, or reached,
    /// when the client first asks for it), then serves them on a free loopback port; each call
    /// is sent to `events` as it is answered. Fails when a server's secrets are missing.
    pub async fn start(
        servers: &BTreeMap<String, ServerConfig>,
        policy: &ToolPolicy,
        tokens: &BTreeMap<String, Secret>,
        place: &TrialPlace<'_>,
        events: UnboundedSender<ProxyEvent>,
        started: Instant,
    ) -> Result<ToolProxy> {
        let mut upstreams = Vec::new();
        for (label, config) in servers {
            let pending = mcp::prepare(config, label, tokens, place)
                .with_context(|| format!("MCP server `{label}`"))?;
            upstreams.push(Arc::new(Upstream {
                label: label.clone(),
                pending: std::sync::Mutex::new(Some(pending)),
                session: tokio::sync::OnceCell::new(),
                tools: tokio::sync::OnceCell::new(),
            }));
        }
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("cannot listen on 127.0.0.1 for the tool proxy")?;
        let address = listener.local_addr()?;
        let token = mint();
        let stop = tokio_util::sync::CancellationToken::new();
        let calls = Arc::new(AtomicU64::new(0));
        let mut router = axum::Router::new();
        let mut urls = BTreeMap::new();
        for (index, upstream) in upstreams.iter().enumerate() {
            let handler = Proxied {
                upstream: upstream.clone(),
                policy: Arc::new(policy.clone()),
                events: events.clone(),
                started,
                calls: calls.clone(),
            };
            let mut config = StreamableHttpServerConfig::default();
            config.cancellation_token = stop.child_token();
            // A call's answer as one JSON body rather than an event stream: a third of the
            // proxy's cost per call (`cargo xtask bench tools`).
            config.legacy_session_mode = false;
            config.json_response = true;
            let service = StreamableHttpService::new(
                move || Ok(handler.clone()),
                Arc::new(LocalSessionManager::default()),
                config,
            );
            let path = format!("/mcp/{index}");
            urls.insert(upstream.label.clone(), format!("http://{address}{path}"));
            router = router.nest_service(&path, service);
        }
        let expected = format!("Bearer {}", token.expose());
        let router = router.layer(axum::middleware::from_fn(
            move |request: axum::extract::Request, next: axum::middleware::Next| {
                let presented = request
                    .headers()
                    .get(axum::http::header::AUTHORIZATION)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v == expected);
                async move {
                    match presented {
                        true => next.run(request).await,
                        false => axum::http::StatusCode::UNAUTHORIZED.into_response(),
                    }
                }
            },
        ));
        let shutdown = stop.clone();
        let served = tokio::spawn(async move {
            let _ = axum::serve(listener, router)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
        });
        Ok(ToolProxy {
            urls,
            token,
            upstreams,
            stop,
            served,
        })
    }

    /// The `mcpServers` file's contents: each server by its label, as streamable HTTP at the
    /// proxy with the trial's bearer token.
    pub fn mcp_config(&self) -> serde_json::Value {
        let servers: serde_json::Map<String, serde_json::Value> = self
            .endpoints()
            .into_iter()
            .map(|(label, e)| {
                let entry = serde_json::json!({"type": "http", "url": e.url, "headers": e.headers});
                (label, entry)
            })
            .collect();
        serde_json::json!({ "mcpServers": servers })
    }

    /// The proxy's endpoints by server label: what an agent CLI's own MCP configuration
    /// names in place of the real servers.
    pub fn endpoints(&self) -> BTreeMap<String, Endpoint> {
        self.urls
            .iter()
            .map(|(label, url)| {
                let authorization = format!("Bearer {}", self.token.expose());
                let endpoint = Endpoint {
                    url: url.clone(),
                    headers: BTreeMap::from([("Authorization".to_string(), authorization)]),
                };
                (label.clone(), endpoint)
            })
            .collect()
    }

    /// Stops serving and ends every server's session ([`Session::close`]).
    pub async fn close(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.served).await;
        for upstream in self.upstreams {
            if let Some(session) = Arc::try_unwrap(upstream)
                .ok()
                .and_then(|u| u.session.into_inner())
            {
                session.close().await;
            }
        }
    }
}

/// A fresh bearer token for one trial's proxy.
fn mint() -> Secret {
    let mut bytes = [0u8; 24];
    getrandom::fill(&mut bytes).expect("the system's random source");
    Secret::new(format!("mst-tools-{}", hex::encode(bytes)))
}

/// A variant's tool policy as it applies to one server's tools: what a client is shown, what
/// its names stand for, and which calls are refused. The proxy applies it to the clients
/// behind it, and the `api` client to its own calls.
pub struct ToolView<'p> {
    pub label: &'p str,
    pub policy: &'p ToolPolicy,
}

impl ToolView<'_> {
    /// The tools as the client sees them: hidden ones left out, the rest rewritten.
    pub fn shown(&self, tools: &[Tool]) -> Vec<Tool> {
        tools
            .iter()
            .filter_map(|tool| {
                let Some(rewrite) = self.policy.of(self.label, &tool.name) else {
                    return Some(tool.clone());
                };
                if rewrite.hidden {
                    return None;
                }
                let mut tool = tool.clone();
                if let Some(name) = &rewrite.name {
                    tool.name = name.clone().into();
                }
                if let Some(description) = &rewrite.description {
                    tool.description = Some(description.clone().into());
                }
                if let Some(serde_json::Value::Object(schema)) = &rewrite.input_schema {
                    tool.input_schema = Arc::new(schema.clone());
                }
                Some(tool)
            })
            .collect()
    }

    /// The `tools-listed` event of the server's `tools`: their names, and the list as the
    /// client sees it ([`ShownTool`]), which `run.json` keeps per variant.
    pub fn listed_event(&self, tools: &[Tool]) -> EventKind {
        let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
        let shown: Vec<ShownTool> = tools
            .iter()
            .filter_map(|tool| {
                let rewrite = self.policy.of(self.label, &tool.name);
                if rewrite.is_some_and(|r| r.hidden) {
                    return None;
                }
                let renamed = rewrite.and_then(|r| r.name.clone());
                Some(ShownTool {
                    name: renamed.clone().unwrap_or_else(|| tool.name.to_string()),
                    description: (rewrite.and_then(|r| r.description.clone()))
                        .or_else(|| tool.description.as_deref().map(str::to_string))
                        .unwrap_or_default(),
                    renamed_from: renamed.map(|_| tool.name.to_string()),
                    schema_rewritten: rewrite.is_some_and(|r| r.input_schema.is_some()),
                    blocked: self.refusal(tool).map(str::to_string),
                })
            })
            .collect();
        EventKind::Custom {
            name: crate::eval::trial::TOOLS_LISTED_EVENT.into(),
            data: serde_json::json!({"server": self.label, "tools": names, "shown": shown}),
        }
    }

    /// The server's own tool the client's `name` stands for, if the client may call it.
    pub fn resolve<'t>(&self, tools: &'t [Tool], name: &str) -> Option<&'t Tool> {
        tools.iter().find(|tool| {
            let rewrite = self.policy.of(self.label, &tool.name);
            let shown = rewrite
                .and_then(|r| r.name.as_deref())
                .unwrap_or(&tool.name);
            shown == name && !rewrite.is_some_and(|r| r.hidden)
        })
    }

    /// Why the policy refuses a call to `tool`, if it does.
    pub fn refusal(&self, tool: &Tool) -> Option<&'static str> {
        let read_only = tool
            .annotations
            .as_ref()
            .and_then(|a| a.read_only_hint)
            .unwrap_or(false);
        let allowed = self
            .policy
            .of(self.label, &tool.name)
            .is_some_and(|r| r.allow);
        (self.policy.dry(self.label) && !read_only && !allowed).then_some(DRY_RUN_REFUSAL)
    }

    /// The events that record a refused call: the call, why (`tool-blocked`), its error
    /// result.
    pub fn blocked_events(&self, id: &str, tool: &Tool, reason: &str) -> [EventKind; 2] {
        [
            EventKind::Custom {
                name: crate::eval::trial::TOOL_BLOCKED_EVENT.into(),
                data: serde_json::json!({"server": self.label, "tool": tool.name, "reason": reason}),
            },
            EventKind::ToolResult {
                id: id.to_string(),
                output: reason.to_string(),
                is_error: true,
                duration_ms: 0,
            },
        ]
    }
}

/// The MCP server the client talks to for one upstream server.
#[derive(Clone)]
struct Proxied {
    upstream: Arc<Upstream>,
    policy: Arc<ToolPolicy>,
    events: UnboundedSender<ProxyEvent>,
    started: Instant,
    /// Calls so far in the trial, across servers: each call's event id.
    calls: Arc<AtomicU64>,
}

impl Proxied {
    /// The server's session, opened on first use; a server that cannot start is recorded in
    /// the trace (a `log` event) and answered as an internal error.
    async fn session(&self) -> Result<&Session, ErrorData> {
        self.upstream.session().await.map_err(|why| {
            self.record(EventKind::Log { text: why.clone() });
            ErrorData::internal_error(why, None)
        })
    }

    /// The server's tools, listed once (and recorded as a `tools-listed` event).
    async fn upstream_tools(&self) -> Result<&Vec<Tool>, ErrorData> {
        let session = self.session().await?;
        self.upstream
            .tools
            .get_or_try_init(|| async {
                let tools = session.service.list_all_tools().await.map_err(|e| {
                    ErrorData::internal_error(
                        format!("MCP server `{}` failed: {e}", self.upstream.label),
                        None,
                    )
                })?;
                self.record(self.view().listed_event(&tools));
                Ok(tools)
            })
            .await
    }

    /// The policy as it applies to this server.
    fn view(&self) -> ToolView<'_> {
        ToolView {
            label: &self.upstream.label,
            policy: &self.policy,
        }
    }

    fn record(&self, kind: EventKind) {
        let _ = self.events.send((kind, self.started.elapsed()));
    }
}

/// Text of a result for the trace (as the `mcp` client records it), cut at
/// [`MAX_RECORDED_OUTPUT`] bytes.
fn output_of(result: &CallToolResult) -> String {
    cut(mcp::text_of(result), MAX_RECORDED_OUTPUT)
}

/// `text` within `cap` bytes (on a character boundary), saying how long it was when cut.
fn cut(mut text: String, cap: usize) -> String {
    if text.len() <= cap {
        return text;
    }
    let whole = text.len();
    let end = (0..=cap)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    text.truncate(end);
    text.push_str(&format!("… [cut: {whole} bytes in all]"));
    text
}

impl ServerHandler for Proxied {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let tools = self.upstream_tools().await?;
        Ok(ListToolsResult::with_all_items(self.view().shown(tools)))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let call = self.calls.fetch_add(1, Ordering::Relaxed) + 1;
        if call > MAX_CALLS_PER_TRIAL {
            let why = format!(
                "too many tool calls in one trial (more than {MAX_CALLS_PER_TRIAL}): refused"
            );
            if call == MAX_CALLS_PER_TRIAL + 1 {
                self.record(EventKind::Log { text: why.clone() });
            }
            return Ok(CallToolResponse::Complete(CallToolResult::error(vec![
                ContentBlock::text(why),
            ])));
        }
        let id = format!("proxy-{call}");
        let label = self.upstream.label.clone();
        let arguments = request.arguments.clone().unwrap_or_default();
        let tools = self.upstream_tools().await?;
        let tool = self.view().resolve(tools, &request.name);
        self.record(EventKind::ToolCall {
            id: id.clone(),
            server: Some(label.clone()),
            tool: tool.map_or(request.name.to_string(), |t| t.name.to_string()),
            arguments: serde_json::Value::Object(arguments.clone()),
        });
        let called = Instant::now();
        let result = |output: String, is_error: bool| EventKind::ToolResult {
            id: id.clone(),
            output,
            is_error,
            duration_ms: called.elapsed().as_millis() as u64,
        };
        let Some(tool) = tool else {
            let why = format!("unknown tool: {}", request.name);
            self.record(result(why.clone(), true));
            return Err(ErrorData::invalid_params(why, None));
        };
        if let Some(reason) = self.view().refusal(tool) {
            for event in self.view().blocked_events(&id, tool, reason) {
                self.record(event);
            }
            let refused = CallToolResult::error(vec![ContentBlock::text(reason)]);
            return Ok(CallToolResponse::Complete(refused));
        }
        let params = CallToolRequestParams::new(tool.name.to_string()).with_arguments(arguments);
        match self.session().await?.service.call_tool(params).await {
            Ok(answer) => {
                let is_error = answer.is_error.unwrap_or(false);
                self.record(result(output_of(&answer), is_error));
                Ok(CallToolResponse::Complete(answer))
            }
            Err(rmcp::ServiceError::McpError(error)) => {
                self.record(result(error.message.to_string(), true));
                Err(error)
            }
            Err(other) => {
                let why = format!("MCP server `{label}` failed: {other}");
                self.record(result(why.clone(), true));
                Err(ErrorData::internal_error(why, None))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_huge_result_is_cut_in_the_trace_on_a_character_boundary() {
        assert_eq!(cut("short".into(), 10), "short");
        let long = "é".repeat(100);
        let kept = cut(long, 11);
        assert_eq!(kept, format!("{}… [cut: 200 bytes in all]", "é".repeat(5)));
    }
}
