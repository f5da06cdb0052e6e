//! The playground's MCP tool twins (`mst serve --mcp`): the operations of the HTTP API as MCP
//! tools over stdio, so an agent can drive the playground. Each tool answers with the JSON the
//! HTTP API returns (as text, and as structured content); a [`ServeError`] is a tool result
//! with `isError: true` and its message, never a protocol error, so the agent reads the fix.

use super::{CreateSession, Playground, ServeError, SubmitTask};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    JsonObject, ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::Semaphore;

/// The most tool calls that run at once; more wait for one to end.
pub const MAX_CALLS: u32 = 256;

/// How long the end of `mst serve --mcp` waits for tool calls still running (a machine still
/// booting) before it closes the sessions without them. rmcp itself waits only 5 s after stdin
/// closes (2 s after a signal), less than a machine may take to boot.
const DRAIN: Duration = Duration::from_secs(120);

/// The MCP server over one [`Playground`].
pub struct Tools {
    playground: Arc<Playground>,
    /// One permit per running call, held by its blocking work: the end waits for them all,
    /// so a session that finishes booting after the client left is still closed.
    calls: Arc<Semaphore>,
}

/// `submit_task`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitArgs {
    session: String,
    input: Value,
    #[serde(default)]
    fresh: bool,
}

/// `read_task_trace`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TraceArgs {
    session: String,
    task: String,
    #[serde(default)]
    since: Option<u64>,
}

/// The arguments of the tools that name one session.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SessionArgs {
    session: String,
}

/// `list_sessions` takes nothing.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NoArgs {}

/// A JSON schema for an object with `properties` of which `required` must be given.
fn schema(properties: Value, required: &[&str]) -> JsonObject {
    let value = json!({
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": false,
    });
    match value {
        Value::Object(map) => map,
        _ => unreachable!("a JSON object literal"),
    }
}

/// The six tools, named and described for an agent.
pub fn tools() -> Vec<Tool> {
    let session = json!({"type": "string", "description": "The session id (from create_session or list_sessions)."});
    let read_only = |tool: Tool| tool.with_annotations(ToolAnnotations::new().read_only(true));
    vec![
        Tool::new(
            "create_session",
            "Boot a machine for one variant of the eval and keep it for tasks. Returns the \
             session (its `id` is what the other tools take). Many sessions may run at once.",
            schema(
                json!({"variant": {"type": "string", "description": "The variant whose client and servers the session runs (default: the eval's baseline, or its only variant)."},
                       "sharedWorkdir": {"type": "boolean", "description": "Run every task in one work directory on the machine, kept between tasks (default: each task in a fresh one)."},
                       "conversation": {"type": "boolean", "description": "Make the session a conversation: each task is a turn that continues the last (the variant's client must be able to continue one: a `command` client with `clientOptions.resume`, or an `api` client). Chosen here, never changed."},
                       "budget": {"type": "object", "description": "What the session's tasks may spend on models, reserved out of the server's budget: `tokens`, `costUsd` (US dollars), either or both.",
                                  "properties": {"tokens": {"type": "integer", "minimum": 0}, "costUsd": {"type": "number", "minimum": 0}}, "additionalProperties": false},
                       "turnTokens": {"type": "integer", "minimum": 1, "description": "The most tokens one task (a turn) may use: a task past it is stopped, ends `over-budget`, and the session goes on."}}),
                &[],
            ),
        ),
        Tool::new(
            "submit_task",
            "Start a task on a session: one trial of the session's client on `input`. Returns \
             the task (its `id` is what read_task_trace takes) while it runs. One task at a \
             time per session: submitting while one runs is an error naming it.",
            schema(
                json!({"session": session,
                       "input": {"description": "What the client receives, as a dataset case's `input` (a string or JSON)."},
                       "fresh": {"type": "boolean", "description": "In a conversation session: start a new thread (the work directory and its files are kept)."}}),
                &["session", "input"],
            ),
        ),
        read_only(Tool::new(
            "read_task_trace",
            "Read a task's trace events with `seq >= since` (all without `since`). Call again \
             with `since` set to the returned `next` to follow the task; `done: true` means it \
             settled and nothing more will come.",
            schema(
                json!({"session": session,
                       "task": {"type": "string", "description": "The task id (from submit_task or get_session)."},
                       "since": {"type": "integer", "minimum": 0, "description": "The cursor: the `next` of the previous call (0 to start)."}}),
                &["session", "task"],
            ),
        )),
        read_only(Tool::new(
            "list_sessions",
            "List this playground's sessions, oldest first, each with its state and its tasks.",
            schema(json!({}), &[]),
        )),
        read_only(Tool::new(
            "get_session",
            "Get one session: its record, its state (ready, busy, closed), the running task \
             and a summary of every task.",
            schema(json!({"session": session}), &["session"]),
        )),
        Tool::new(
            "close_session",
            "Close a session: abort its running task (its partial trace is kept), dispose of \
             its machine and record how it ended. Returns the closed session.",
            schema(json!({"session": session}), &["session"]),
        ),
    ]
}

/// A tool's answer: `value` as redacted JSON text, and as structured content.
fn answer(value: &impl serde::Serialize, is_error: bool) -> CallToolResult {
    let text = super::redacted_json(value);
    let mut result = if is_error {
        CallToolResult::error(vec![ContentBlock::text(text.clone())])
    } else {
        CallToolResult::success(vec![ContentBlock::text(text.clone())])
    };
    result.structured_content = serde_json::from_str(&text).ok();
    result
}

/// A [`ServeError`] as the tool result an agent reads: `{"error": MESSAGE, "status": N}`.
fn failure(error: ServeError) -> CallToolResult {
    answer(
        &json!({"error": error.message, "status": error.status}),
        true,
    )
}

/// Parses a tool's arguments strictly: an unknown or missing field is an error naming it.
fn args<T: DeserializeOwned>(tool: &str, arguments: Option<JsonObject>) -> Result<T, ServeError> {
    serde_json::from_value(Value::Object(arguments.unwrap_or_default()))
        .map_err(|e| ServeError::bad_request(format!("`{tool}`'s arguments are not valid: {e}")))
}

impl Tools {
    /// The tools over `playground`; each call holds a permit of `calls` while it runs.
    pub fn new(playground: Arc<Playground>, calls: Arc<Semaphore>) -> Self {
        Tools { playground, calls }
    }

    /// Runs tool `name` on a blocking thread: booting and closing machines takes seconds, and
    /// every playground call may wait on a session's lock.
    async fn call(&self, name: String, arguments: Option<JsonObject>) -> CallToolResult {
        let playground = self.playground.clone();
        let Ok(permit) = self.calls.clone().acquire_owned().await else {
            return failure(ServeError {
                status: 503,
                message: "mst serve is stopping: start it again for more calls".into(),
            });
        };
        let work = move || -> Result<Value, ServeError> {
            let _running = permit;
            let value = match name.as_str() {
                "create_session" => {
                    let request: CreateSession = args(&name, arguments)?;
                    serde_json::to_value(playground.create_session(request)?)
                }
                "submit_task" => {
                    let a: SubmitArgs = args(&name, arguments)?;
                    serde_json::to_value(playground.submit(
                        &a.session,
                        SubmitTask {
                            input: a.input,
                            fresh: a.fresh,
                        },
                    )?)
                }
                "read_task_trace" => {
                    let a: TraceArgs = args(&name, arguments)?;
                    serde_json::to_value(playground.trace(&a.session, &a.task, a.since)?)
                }
                "list_sessions" => {
                    let NoArgs {} = args(&name, arguments)?;
                    Ok(json!({"sessions": playground.list()}))
                }
                "get_session" => {
                    let a: SessionArgs = args(&name, arguments)?;
                    serde_json::to_value(playground.get(&a.session)?)
                }
                "close_session" => {
                    let a: SessionArgs = args(&name, arguments)?;
                    serde_json::to_value(playground.close(&a.session)?)
                }
                _ => {
                    return Err(ServeError::not_found(format!(
                        "no tool `{name}`: the tools are {}",
                        tools()
                            .iter()
                            .map(|t| t.name.as_ref())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )))
                }
            };
            value.map_err(|e| ServeError {
                status: 500,
                message: format!("cannot encode the answer: {e}"),
            })
        };
        match tokio::task::spawn_blocking(work).await {
            Ok(Ok(value)) => answer(&value, false),
            Ok(Err(error)) => failure(error),
            Err(e) => failure(ServeError {
                status: 500,
                message: format!("the tool failed: {e}"),
            }),
        }
    }
}

impl ServerHandler for Tools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mst serve", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "The mst playground: create_session boots a machine for a variant of the eval; \
                 submit_task runs the variant's client on an input there, one task at a time; \
                 read_task_trace follows the task's events with a cursor until `done`; \
                 close_session disposes of the machine.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        Ok(self
            .call(request.name.into_owned(), request.arguments)
            .await
            .into())
    }
}

/// Serves the tools over `input`/`output` until the client closes `input` or `stop` fires,
/// then waits (up to two minutes) for the tool calls still running, so that the caller's
/// closing of every session finds the sessions they create.
pub async fn serve<R, W>(
    playground: Arc<Playground>,
    input: R,
    output: W,
    stop: Arc<tokio::sync::Notify>,
) -> anyhow::Result<()>
where
    R: AsyncRead + Send + Unpin + 'static,
    W: AsyncWrite + Send + Unpin + 'static,
{
    let calls = Arc::new(Semaphore::new(MAX_CALLS as usize));
    let served = async {
        let service = Tools::new(playground, calls.clone())
            .serve((input, output))
            .await
            .map_err(|e| anyhow::anyhow!("the MCP client did not initialize: {e}"))?;
        service
            .waiting()
            .await
            .map_err(|e| anyhow::anyhow!("the MCP server failed: {e}"))?;
        Ok(())
    };
    // A signal ends it at any point, the handshake included (dropping the service stops it).
    let served = tokio::select! {
        served = served => served,
        _ = stop.notified() => Ok(()),
    };
    if tokio::time::timeout(DRAIN, calls.acquire_many(MAX_CALLS))
        .await
        .is_err()
    {
        tracing::warn!(
            "a tool call still runs {}s after the MCP client left: closing the sessions without it",
            DRAIN.as_secs()
        );
    }
    served
}

/// The protocol's own copies of stdin and stdout for `--mcp`; fd 0 then reads /dev/null and
/// fd 1 writes to stderr, so a stray print or a child that inherits them cannot corrupt or
/// steal the protocol's bytes.
pub fn take_stdio() -> anyhow::Result<(std::fs::File, std::fs::File)> {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    let take = |fd: i32| -> anyhow::Result<std::fs::File> {
        // SAFETY: dup of a descriptor this process holds; the copy is owned by the File.
        let copy = unsafe { libc::dup(fd) };
        if copy < 0 {
            anyhow::bail!(
                "--mcp: cannot take fd {fd}: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: `copy` is a fresh descriptor nothing else owns.
        Ok(std::fs::File::from(unsafe { OwnedFd::from_raw_fd(copy) }))
    };
    let input = take(0)?;
    let output = take(1)?;
    let null = std::fs::File::open("/dev/null")
        .map_err(|e| anyhow::anyhow!("--mcp: cannot open /dev/null: {e}"))?;
    // SAFETY: dup2 onto the standard descriptors, which stay open (as /dev/null and stderr).
    let moved = unsafe { libc::dup2(null.as_raw_fd(), 0) >= 0 && libc::dup2(2, 1) >= 0 };
    if !moved {
        anyhow::bail!(
            "--mcp: cannot set stdin and stdout aside: {}",
            std::io::Error::last_os_error()
        );
    }
    Ok((input, output))
}
