//! `mst serve`: the playground. A session boots one machine from the eval's runner for one
//! variant and keeps it; tasks (one trial of the variant's client on an input) run on it one
//! at a time, each as a one-trial shard over the same channel; each task's trace is followed
//! live with a `since` cursor and stored like a run's. The HTTP API is in [`http`]; the same
//! operations as MCP tools (`mst serve --mcp`) in [`mcp`].
//!
//! [`Playground`] owns the sessions; a [`session::Session`] owns its machine, its tasks and
//! its record under `<results>/<eval>/sessions/<id>/`.

pub mod batch_runs;
pub mod budget;
pub mod http;
pub mod mcp;
pub mod session;
pub mod ui;

use crate::eval::trial::CaseRecord;
use crate::home::Home;
use crate::results::ResultsRoot;
use crate::run::prepare::Prepared;
use crate::run::{Ready, Setup};
use crate::runner::{Runner, RunnerOptions};
use crate::shard::coordinator::ShardSettings;
use crate::shard::tokens::ServerTokens;
use anyhow::Result;
use serde::Deserialize;
use session::{Session, SessionView, TaskView, TracePage};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How many closed sessions stay in memory (for a `GET` after the close, and the list) before
/// the oldest are let go, so a long-lived server's memory does not grow with every session.
pub const CLOSED_SESSIONS_KEPT: usize = 32;

/// What `mst serve` was started with.
pub struct ServeRequest {
    /// What it shares with `mst run`.
    pub setup: Setup,
    pub settings: ShardSettings,
    /// A session with no task running for this long is closed by the reaper.
    pub idle_ttl: Duration,
    /// What all sessions together may spend on models (`--budget-tokens`, `--budget-cost`).
    pub budget: budget::Limit,
    /// The most sessions open at once (`--max-sessions`): each holds a machine.
    pub max_sessions: usize,
}

/// An error of the playground's API: an HTTP status and a message that names the fix.
#[derive(Debug)]
pub struct ServeError {
    pub status: u16,
    pub message: String,
}

impl ServeError {
    /// An error with any `status`.
    pub fn new(status: u16, message: impl Into<String>) -> Self {
        ServeError {
            status,
            message: message.into(),
        }
    }

    /// 400: the request is wrong.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, message)
    }

    /// 402: a budget is spent, or cannot cover what is asked.
    pub fn payment_required(message: impl Into<String>) -> Self {
        Self::new(402, message)
    }

    /// 404: no such session or task.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, message)
    }

    /// 409: the session is busy or closed.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(409, message)
    }

    /// 413: what the request asks for is over a cap.
    pub fn too_large(message: impl Into<String>) -> Self {
        Self::new(413, message)
    }

    /// 429: the server runs as much as it may at once.
    pub fn too_many(message: impl Into<String>) -> Self {
        Self::new(429, message)
    }

    /// 502: the runner or the machine failed.
    pub fn machine(message: impl Into<String>) -> Self {
        Self::new(502, message)
    }
}

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.message)
    }
}

/// `value` as JSON text, through the secret redactor like everything mst prints: the body of
/// every answer, over HTTP and over MCP.
pub fn redacted_json(value: &impl serde::Serialize) -> String {
    let text = serde_json::to_string(value).unwrap_or_else(|_| "null".into());
    crate::secrets::clean_text(&text)
}

/// `POST /sessions`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSession {
    /// The variant whose client and servers the session runs (default: the eval's baseline,
    /// or its only variant).
    #[serde(default)]
    pub variant: Option<String>,
    /// Every task runs in one work directory on the machine, kept between tasks (default:
    /// each task in a fresh one of its own).
    #[serde(default, rename = "sharedWorkdir")]
    pub shared_workdir: bool,
    /// Each task is a turn continuing one conversation of the client (which must be able to
    /// resume); chosen at boot, never changed. Implies a shared work directory.
    #[serde(default)]
    pub conversation: bool,
    /// What the session's tasks may spend on models, reserved out of the server's budget.
    #[serde(default)]
    pub budget: Option<budget::Limit>,
    /// The most tokens one task (a conversation's turn) may use, as its `usage` events count
    /// them: the worker stops a task past it, which ends `over-budget`, and the session goes
    /// on.
    #[serde(default, rename = "turnTokens")]
    pub turn_tokens: Option<u64>,
}

/// `POST /sessions/{id}/tasks`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubmitTask {
    /// What the client receives, as a case's `input`.
    pub input: serde_json::Value,
    /// In a conversation session, start a new thread: drop the held resume token, keep the
    /// work directory. A 400 on other sessions.
    #[serde(default)]
    pub fresh: bool,
}

/// `POST /sessions/{id}/export`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportCase {
    /// The dataset file to append the case to: a `.jsonl` file name in the eval config's
    /// directory (created when missing).
    pub dataset: String,
    /// The case's id (default: the session's id, shortened, and the task's).
    #[serde(default)]
    pub case: Option<String>,
    /// The task (a conversation's turn) to export (default: the last completed one). A
    /// conversation exports the thread up to that turn.
    #[serde(default)]
    pub task: Option<String>,
}

/// Checks, before any machine is made, that variant `variant`'s client can continue a
/// conversation: a turn that silently started afresh would be a lie.
fn can_converse(variant: &str, spec: &crate::eval::config::VariantSpec) -> Result<(), ServeError> {
    let refuse = |why: String| {
        ServeError::bad_request(format!(
            "variant `{variant}` cannot hold a conversation: {why}"
        ))
    };
    match spec.client.as_str() {
        "command" => match spec.resume() {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(refuse(
                "its `command` client has no `clientOptions.resume`, which a conversation needs \
                 to continue the agent's thread: add `\"resume\": {\"capture\": REGEX, \
                 \"arg\": [\"--resume\", \"{token}\"]}` (see docs/config.md)"
                    .into(),
            )),
            Err(e) => Err(refuse(format!("{e:#}"))),
        },
        // The history of its completed turns goes to each turn's model; an agent CLI resumes
        // its own session or thread by the id it printed.
        "api" | "claude-code" | "codex" => Ok(()),
        other => Err(refuse(format!(
            "its `{other}` client cannot continue a conversation (a `command` client with \
             `clientOptions.resume`, an `api`, `claude-code` or `codex` client can); use another \
             variant, or a session without `conversation`"
        ))),
    }
}

/// What every session shares: the prepared eval, the runner, the tokens and the results root.
pub struct Shared {
    pub prepared: Prepared,
    /// The eval config's path, as given (recorded in each session's `run.json`).
    pub config_path: PathBuf,
    pub runner: Box<dyn Runner>,
    pub runner_options: RunnerOptions,
    pub tokens: ServerTokens,
    pub settings: ShardSettings,
    pub root: ResultsRoot,
}

/// The playground: every session of this `mst serve`.
pub struct Playground {
    shared: Arc<Shared>,
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    /// Sessions whose machines are being made, counted against `max_sessions` with the open
    /// ones.
    booting: Mutex<usize>,
    max_sessions: usize,
    idle_ttl: Duration,
    budgets: budget::Budgets,
}

impl Playground {
    /// Loads the eval, its plugins and the runner; closes what a previous `mst serve` left
    /// open under the results directory.
    pub fn start(home: &Home, request: ServeRequest) -> Result<Self> {
        let Ready {
            mut prepared,
            tokens,
            runner_options,
            runner,
        } = crate::run::ready(home, &request.setup, |_| Ok(()))?;
        // Each task's trial gets the eval's workspace and its checks' hidden files.
        prepared.pack_workspaces(home)?;
        let root = ResultsRoot::new(&request.setup.results_base);
        session::recover(&root.sessions_dir(&prepared.config.name));
        Ok(Playground {
            shared: Arc::new(Shared {
                prepared,
                config_path: request.setup.config_path.clone(),
                runner,
                runner_options,
                tokens,
                settings: request.settings,
                root,
            }),
            sessions: Mutex::new(BTreeMap::new()),
            booting: Mutex::new(0),
            max_sessions: request.max_sessions,
            idle_ttl: request.idle_ttl,
            budgets: budget::Budgets::new(request.budget),
        })
    }

    /// Boots a session's machine and records it. Nothing is left behind when it fails.
    pub fn create_session(&self, request: CreateSession) -> Result<SessionView, ServeError> {
        let config = &self.shared.prepared.config;
        let names = config.variant_names();
        let variant = match request.variant.clone() {
            Some(name) if names.contains(&name) => name,
            Some(name) => {
                return Err(ServeError::bad_request(format!(
                    "`variant` {name:?} is not a variant of eval `{}`; its variants are {}",
                    config.name,
                    names.join(", ")
                )))
            }
            None => config.baseline.clone().unwrap_or_else(|| names[0].clone()),
        };
        let spec = config.variant(&variant);
        crate::client::client(&spec, &BTreeMap::new())
            .map_err(|e| ServeError::bad_request(format!("variant `{variant}`: {e:#}")))?;
        if request.conversation {
            can_converse(&variant, &spec)?;
        }
        let limit = request.budget.unwrap_or_default();
        limit.check("`budget`").map_err(ServeError::bad_request)?;
        if request.turn_tokens == Some(0) {
            return Err(ServeError::bad_request(
                "`turnTokens` must be at least 1 (leave it out for no limit on a turn)",
            ));
        }
        // Counted as booting until it is open (or failed, or panicked: the guard's drop).
        let _room = self.take_session_room()?;
        // Reserved before the machine is made; given back if making it fails.
        let reservation = self.budgets.reserve(limit)?;
        let session = match Session::boot(self.shared.clone(), &variant, &request) {
            Ok(session) => session,
            Err(e) => {
                self.budgets.release(reservation);
                return Err(e);
            }
        };
        self.budgets.open(&session.id, reservation);
        let session = Arc::new(session);
        let view = self.view(&session);
        self.sessions
            .lock()
            .expect("sessions")
            .insert(session.id.clone(), session);
        Ok(view)
    }

    /// Room for one more session, counted as booting while the returned guard lives (then it
    /// is open, or it failed): 429 when `--max-sessions` hold machines or are booting.
    fn take_session_room(&self) -> Result<Booting<'_>, ServeError> {
        let mut booting = self.booting.lock().expect("booting");
        let open = (self.sessions.lock().expect("sessions").values())
            .filter(|s| s.holds_machine())
            .count();
        if open + *booting >= self.max_sessions {
            return Err(ServeError::too_many(format!(
                "{} sessions are open or starting, the most this server allows \
                 (--max-sessions {}): close one first",
                open + *booting,
                self.max_sessions
            )));
        }
        *booting += 1;
        Ok(Booting(&self.booting))
    }

    /// Every session of this process, oldest first.
    pub fn list(&self) -> Vec<SessionView> {
        let mut views: Vec<SessionView> = self
            .sessions
            .lock()
            .expect("sessions")
            .values()
            .map(|s| s.view())
            .collect();
        views.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        views
    }

    fn session(&self, id: &str) -> Result<Arc<Session>, ServeError> {
        self.sessions
            .lock()
            .expect("sessions")
            .get(id)
            .cloned()
            .ok_or_else(|| {
                ServeError::not_found(format!(
                    "no session `{id}`: `GET /api/v1/sessions` (the `list_sessions` tool over MCP) \
                     lists them; past the latest {CLOSED_SESSIONS_KEPT} closed ones this server \
                     lets go (their records stay in the results directory)"
                ))
            })
    }

    /// One session's record, state and tasks.
    pub fn get(&self, id: &str) -> Result<SessionView, ServeError> {
        Ok(self.view(self.session(id)?.as_ref()))
    }

    /// `session` as the API shows it, with its budget and spend.
    fn view(&self, session: &Session) -> SessionView {
        self.count_spend(session);
        let mut view = session.view();
        view.budget = self.budgets.view(&session.id);
        view
    }

    /// Counts what `session`'s settled tasks used that is not counted yet: their traces'
    /// `usage` events, as the stored traces hold them.
    fn count_spend(&self, session: &Session) {
        let dir = self
            .shared
            .root
            .session(&self.shared.prepared.config.name, &session.id);
        for task in session.view().tasks {
            if task.status == session::TaskStatus::Running
                || self.budgets.charged(&session.id, &task.id)
            {
                continue;
            }
            let key = crate::eval::trial::TrialKey {
                variant: session.variant.as_str().into(),
                case: task.id.as_str().into(),
                trial: 0,
            };
            let usage = dir
                .read_trace(&key)
                .map(|record| crate::results::usage::trace_usage(&record.trace))
                .unwrap_or_default();
            self.budgets.charge(&session.id, &task.id, &usage);
        }
    }

    /// Closes `session`'s account once it is closed: what it reserved and did not spend
    /// returns to the server.
    fn settle_account(&self, session: &Session) {
        self.count_spend(session);
        self.budgets.close(&session.id);
    }

    /// Starts a task on session `id`: 409 while another runs or once the session is closed.
    pub fn submit(&self, id: &str, request: SubmitTask) -> Result<TaskView, ServeError> {
        let session = self.session(id)?;
        if request.fresh && !session.is_conversation() {
            return Err(ServeError::bad_request(format!(
                "`fresh` starts a new thread of a conversation, and session `{id}` is not one \
                 (create it with `\"conversation\": true`)"
            )));
        }
        self.count_spend(&session);
        self.budgets.admit(id)?;
        let case = CaseRecord::new(String::new(), request.input);
        let spec = self.shared.prepared.config.variant(&session.variant);
        crate::client::check_input(&spec, &case.input).map_err(|e| {
            ServeError::bad_request(format!(
                "`input` does not suit variant `{}`'s `{}` client: {e:#}",
                session.variant, spec.client
            ))
        })?;
        session.submit(case.input, request.fresh)
    }

    /// Task `task`'s events from `since` on (all without it), and whether it has settled.
    pub fn trace(&self, id: &str, task: &str, since: Option<u64>) -> Result<TracePage, ServeError> {
        self.session(id)?.trace(task, since)
    }

    /// Writes session `id`'s task, or a conversation's thread up to a turn, as a case of a
    /// dataset file beside the eval config, so what was found in the playground becomes a
    /// regression case: a task's input as the case's input; a conversation's completed turns
    /// since its last `fresh` as `{"turns": [...]}`, which a batch run replays as one trial.
    pub fn export(&self, id: &str, request: ExportCase) -> Result<serde_json::Value, ServeError> {
        let name = &request.dataset;
        let plain = name.ends_with(".jsonl")
            && !name.starts_with('.')
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !plain {
            return Err(ServeError::bad_request(format!(
                "`dataset` {name:?} must be a plain `.jsonl` file name (letters, digits, `.`, \
                 `_`, `-`): the case goes into that file beside the eval config"
            )));
        }
        let session = self.session(id)?;
        let view = session.view();
        let completed = |t: &&TaskView| t.status == session::TaskStatus::Completed;
        let target = match &request.task {
            Some(task) => view.tasks.iter().find(|t| &t.id == task).ok_or_else(|| {
                ServeError::not_found(format!("session `{id}` has no task `{task}`"))
            })?,
            None => view.tasks.iter().rev().find(completed).ok_or_else(|| {
                ServeError::conflict(format!(
                    "session `{id}` has no completed task to export yet"
                ))
            })?,
        };
        if !completed(&target) {
            return Err(ServeError::conflict(format!(
                "task `{}` did not complete ({}): only a completed task is exported",
                target.id,
                serde_json::to_value(target.status).unwrap_or_default()
            )));
        }
        let (input, tasks) = if view.conversation {
            // The thread the turn belongs to: back to turn 1 or the last `fresh` turn.
            let upto = view
                .tasks
                .iter()
                .position(|t| t.id == target.id)
                .unwrap_or(0);
            let start = view.tasks[..=upto]
                .iter()
                .rposition(|t| t.fresh)
                .unwrap_or(0);
            let thread: Vec<&TaskView> =
                view.tasks[start..=upto].iter().filter(completed).collect();
            (
                serde_json::json!({"turns": thread.iter().map(|t| &t.input).collect::<Vec<_>>()}),
                thread.iter().map(|t| t.id.clone()).collect::<Vec<_>>(),
            )
        } else {
            (target.input.clone(), vec![target.id.clone()])
        };
        let case_id = request
            .case
            .clone()
            .unwrap_or_else(|| format!("{}-{}", &id[..id.len().min(8)], target.id));
        if case_id.trim().is_empty() || case_id.chars().any(char::is_control) {
            return Err(ServeError::bad_request(format!(
                "`case` {case_id:?} is no case id: give a non-empty one without control \
                 characters (a dataset refuses the others)"
            )));
        }
        let mut case = CaseRecord::new(case_id.clone(), input);
        case.more_mut().metadata =
            Some(serde_json::json!({"exportedFrom": {"session": id, "tasks": tasks}}));
        let dir = self
            .shared
            .config_path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let path = dir.join(name);
        let line = serde_json::to_string(&case).map_err(|e| ServeError::machine(e.to_string()))?;
        append_case(&path, &crate::secrets::redactor().redact(&line))?;
        Ok(serde_json::json!({"dataset": path, "case": case}))
    }

    /// Aborts task `task` of session `id` while it runs; the session stays open.
    pub fn abort(&self, id: &str, task: &str) -> Result<TaskView, ServeError> {
        self.session(id)?.abort(task)
    }

    /// What the web UI needs to offer sessions: the eval, its variants and the runner.
    pub fn info(&self) -> serde_json::Value {
        let config = &self.shared.prepared.config;
        serde_json::json!({
            "eval": config.name,
            "variants": config.variant_names(),
            "baseline": config.baseline,
            "runner": self.shared.runner.name(),
            "budget": self.budgets.server_view(),
        })
    }

    /// Closes session `id`: aborts its task, seals the trace, disposes of the machine.
    pub fn close(&self, id: &str) -> Result<SessionView, ServeError> {
        let session = self.session(id)?;
        session.close("closed by request");
        self.settle_account(&session);
        let view = self.view(&session);
        self.release_closed();
        Ok(view)
    }

    /// Lets go of the oldest closed sessions past [`CLOSED_SESSIONS_KEPT`] whose machines are
    /// gone: their tasks' traces leave memory, their records stay in the results directory.
    fn release_closed(&self) {
        let mut sessions = self.sessions.lock().expect("sessions");
        let mut over: Vec<(std::time::Instant, String)> = (sessions.values())
            .filter(|s| !s.holds_machine())
            .map(|s| (s.made(), s.id.clone()))
            .collect();
        over.sort();
        let excess = over.len().saturating_sub(CLOSED_SESSIONS_KEPT);
        for (_, id) in &over[..excess] {
            sessions.remove(id);
        }
    }

    /// Closes sessions idle past the TTL; called by the reaper thread.
    pub fn reap(&self) {
        let idle: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .expect("sessions")
            .values()
            .filter(|s| s.idle_for().is_some_and(|d| d >= self.idle_ttl))
            .cloned()
            .collect();
        for session in idle {
            session.close("idle past the session TTL");
            self.settle_account(&session);
        }
        self.release_closed();
    }

    /// Closes every open session (on shutdown).
    pub fn close_all(&self, why: &str) {
        let all: Vec<Arc<Session>> = self
            .sessions
            .lock()
            .expect("sessions")
            .values()
            .cloned()
            .collect();
        for session in all {
            session.close(why);
            self.settle_account(&session);
        }
    }
}

/// A session counted as booting ([`Playground::take_session_room`]) until dropped.
struct Booting<'a>(&'a Mutex<usize>);

impl Drop for Booting<'_> {
    fn drop(&mut self) {
        *self.0.lock().expect("booting") -= 1;
    }
}

/// Appends the case `line` (as written, redacted) to the dataset file `path`, made if missing,
/// under an exclusive lock on the file, so that exports at once (from this server or another)
/// each keep their case; 409 when the file holds the line's id already. The file must be a
/// regular file, reached through no link.
fn append_case(path: &std::path::Path, line: &str) -> Result<(), ServeError> {
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let failed =
        |e: std::io::Error| ServeError::machine(format!("cannot write {}: {e}", path.display()));
    let not_a_file = || {
        ServeError::conflict(format!(
            "{} is not a regular file: export into another `dataset`",
            path.display()
        ))
    };
    let opened = std::fs::OpenOptions::new()
        .read(true)
        .append(true)
        .create(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path);
    let mut file = match opened {
        Ok(file) => file,
        Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::EISDIR)) => {
            return Err(not_a_file())
        }
        Err(e) => return Err(failed(e)),
    };
    if !file.metadata().map_err(failed)?.is_file() {
        return Err(not_a_file());
    }
    // Held until the file is closed, at the end of this function.
    file.lock().map_err(failed)?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(failed)?;
    let existing = String::from_utf8_lossy(&bytes);
    // Ids as the file holds them: redacted, like the line.
    let id_of = |line: &str| {
        serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|case| case["id"].as_str().map(str::to_string))
    };
    let case_id = id_of(line).unwrap_or_default();
    if existing
        .lines()
        .any(|held| id_of(held).as_deref() == Some(&case_id))
    {
        return Err(ServeError::conflict(format!(
            "{} already holds a case `{case_id}`: give the export another `case` id",
            path.display()
        )));
    }
    let mut text = String::new();
    if !existing.is_empty() && !existing.ends_with('\n') {
        text.push('\n');
    }
    text.push_str(line);
    text.push('\n');
    file.write_all(text.as_bytes()).map_err(failed)?;
    file.sync_all().map_err(failed)
}
