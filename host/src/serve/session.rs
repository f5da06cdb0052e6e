//! One playground session: its machine, its tasks run one at a time as one-trial shards on
//! that machine, each task's live event buffer and sealed trace, and the session's record.
//!
//! ```text
//! <results>/<eval>/sessions/<session-id>/session.json                 the record
//!                                         traces.jsonl                 every task's trace, a line each
//!                                         shards/0.worker.log          the last task's worker log
//! ```
//!
//! A conversation session (chosen at boot) runs each task as a turn, `turn-<n>`, continuing
//! one conversation of the client: the worker reports the resume token the client captured,
//! the session keeps it in memory only, and hands it to the next turn's worker over its stdin.
//! An `api` client's conversation is continued by its history instead: the session keeps each
//! completed turn's message and answer in memory and sends them in the next turn's bundle.

use super::{ServeError, Shared};
use crate::client::{text_of, Exchange};
use crate::eval::trial::{CaseIndex, CaseRecord, TraceEvent, TrialKey, TrialRecord, TrialStatus};
use crate::results::run_process::{Collector, RunProcess};
use crate::results::RunDir;
use crate::run::collect;
use crate::runner::channel::Channel;
use crate::runner::MachineRequest;
use crate::secrets::Secret;
use crate::shard::bundle::{Bundle, ShardIndex, Turn};
use crate::shard::coordinator::{ShardContext, ShardEnd, ShardEvent, ShardSession};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The name of a session's shared work directory on the machine, beside the worker's results.
const SHARED_WORKDIR: &str = "workdir";

/// The most an `api` conversation's history and the new turn's message may hold together
/// (bytes of text): past it the turn is refused (413), and `fresh` starts a new thread. Turns
/// are never dropped silently: a model that lost the start of the thread would answer as if it
/// had it.
pub const MAX_HISTORY_BYTES: usize = 512 * 1024;

/// The record's name in a session directory.
const RECORD_FILE: &str = "session.json";

/// How a task ended, or that it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TaskStatus {
    Running,
    Completed,
    TimedOut,
    /// Stopped past its token budget (the session's `turnTokens`).
    OverBudget,
    /// Stopped by a close (or the reaper) before it ended.
    Aborted,
    /// The machine, the channel or the client failed.
    Infra,
}

/// A task as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TaskView {
    pub id: String,
    /// 1 for the session's first task.
    pub n: u32,
    pub status: TaskStatus,
    /// Why it ended as it did, when not completed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What was asked: the case input, kept so the task can be graded or exported later.
    pub input: serde_json::Value,
    /// A conversation turn that started a new thread (`fresh`): it did not resume.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh: bool,
    /// Unix seconds.
    pub started_at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// Events recorded so far.
    pub events: u64,
    /// The key of the task's stored trace in the session's `traces.jsonl`
    /// (`<variant>/<task-id>/0`), once the task settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trace: Option<String>,
}

/// Whether a session takes tasks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SessionStatus {
    /// Ready for a task.
    Ready,
    /// A task runs.
    Busy,
    /// Closed: the machine is gone.
    Closed,
}

/// A session as the API shows it, and as `session.json` records it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionView {
    pub id: String,
    pub eval: String,
    pub variant: String,
    pub runner: String,
    /// The machine, as the runner describes it.
    pub machine: String,
    /// What the runner records about the machine (its image, host or directory).
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub placement: serde_json::Value,
    /// Unix seconds.
    pub created_at: u64,
    pub status: SessionStatus,
    /// Whether tasks share one work directory on the machine.
    #[serde(default)]
    pub shared_workdir: bool,
    /// Whether the session is a conversation: each task a turn continuing the last.
    #[serde(default)]
    pub conversation: bool,
    /// The most tokens one task (a turn) may use, when the session set `turnTokens`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_tokens: Option<u64>,
    /// Why the session closed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
    /// The machine could not be disposed of: why.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dispose_error: Option<String>,
    /// The task that runs, if one does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// The process that serves the session (a record left open by another process is closed
    /// at the next start).
    pub pid: u32,
    pub tasks: Vec<TaskView>,
    /// What the session may spend on models and has spent (the playground fills it in).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<super::budget::BudgetView>,
}

/// Task `id`'s events from a cursor.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TracePage {
    pub task: String,
    pub status: TaskStatus,
    /// Events with `seq >= since`, in order.
    pub events: Vec<TraceEvent>,
    /// The cursor for the next call: one past the last event returned (or `since`).
    pub next: u64,
    /// The task settled: nothing more will come, and the events are the stored trace's.
    pub done: bool,
    /// The client's answer, once the task settled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub final_text: Option<String>,
}

/// A task: one trial of the session's client on one input.
struct Task {
    id: String,
    n: u32,
    key: TrialKey,
    input: serde_json::Value,
    started_at: u64,
    /// A conversation turn: what it continues.
    turn: Option<TurnStart>,
    /// The resume token the turn's client captured, once the coordinator has it.
    captured: Mutex<Option<Secret>>,
    cancel: AtomicBool,
    /// Why `cancel` was set (an abort, the session's close).
    cancelled_because: Mutex<String>,
    live: Mutex<Live>,
}

/// What a conversation turn continues, taken when it is submitted.
struct TurnStart {
    /// It starts a new thread (`fresh`).
    fresh: bool,
    /// The resume token it continues (a `command` client's; none on a first or fresh turn).
    token: Option<Secret>,
    /// The earlier completed turns (an `api` client's; empty on a first or fresh turn).
    history: Vec<Exchange>,
}

/// A conversation's thread, in memory only: what its next turn continues.
#[derive(Default)]
struct Thread {
    /// The last resume token a `command` client captured (never recorded).
    token: Option<Secret>,
    /// The completed turns so far, kept only for a client handed its history (`api`).
    history: Vec<Exchange>,
}

impl Task {
    /// Tells the task's worker to stop, and why (for its record).
    fn cancel(&self, why: &str) {
        *self.cancelled_because.lock().expect("task") = why.to_string();
        self.cancel.store(true, Ordering::SeqCst);
    }
}

/// What a task has recorded: its events (live, then the sealed trace's) and how it ended.
#[derive(Default)]
struct Live {
    events: Vec<TraceEvent>,
    /// Why the coordinator counted the trial as infra, when it did.
    infra: Option<String>,
    /// The stored trace's answer.
    final_text: Option<String>,
    settled: Option<Settled>,
}

/// A settled task's status, why (when it did not simply complete) and when (Unix seconds).
type Settled = (TaskStatus, Option<String>, u64);

/// How a task settled, not yet shown: its status, and its stored trace's events and answer
/// (none when no trace came back, and the streamed events stay as its trace).
struct Settlement {
    settled: Settled,
    stored: Option<(Vec<TraceEvent>, Option<String>)>,
}

impl Settlement {
    /// The stored trace's answer.
    fn final_text(&self) -> Option<&str> {
        self.stored.as_ref()?.1.as_deref()
    }

    /// Shows the task settled, with its stored trace, in one step.
    fn publish(self, live: &mut Live) {
        if let Some((events, final_text)) = self.stored {
            live.events = events;
            live.final_text = final_text;
        }
        live.settled = Some(self.settled);
    }
}

impl Task {
    fn view(&self) -> TaskView {
        let live = self.live.lock().expect("task");
        let (status, reason, ended_at) = match &live.settled {
            Some((status, reason, at)) => (*status, reason.clone(), Some(*at)),
            None => (TaskStatus::Running, None, None),
        };
        TaskView {
            id: self.id.clone(),
            n: self.n,
            status,
            reason,
            input: self.input.clone(),
            fresh: self.turn.as_ref().is_some_and(|turn| turn.fresh),
            started_at: self.started_at,
            ended_at,
            events: live.events.len() as u64,
            trace: live.settled.as_ref().map(|_| self.key.to_string()),
        }
    }
}

/// Mutable state of a session.
struct State {
    tasks: Vec<Arc<Task>>,
    running: Option<(Arc<Task>, std::thread::JoinHandle<()>)>,
    last_active: Instant,
    closed: Option<String>,
    dispose_error: Option<String>,
    /// A close that could not wait for the running task: the task disposes of the machine
    /// when it ends.
    dispose_when_idle: bool,
}

/// One session: a machine kept for tasks, run one at a time.
pub struct Session {
    pub id: String,
    pub variant: String,
    shared: Arc<Shared>,
    dir: RunDir,
    machine_name: String,
    placement: serde_json::Value,
    /// The work directory every task shares on the machine, if the session asked for one (a
    /// conversation always has one).
    workdir: Option<String>,
    /// A conversation session: its thread (memory only, never recorded), which the next turn
    /// continues.
    conversation: Option<Mutex<Thread>>,
    /// The variant's client is handed the conversation's history (`api`): the thread keeps
    /// each completed turn.
    keeps_history: bool,
    /// The most tokens one task may use (`turnTokens`).
    turn_tokens: Option<u64>,
    created_at: u64,
    /// When it was made, finer than `created_at`: which of two sessions is older.
    made: Instant,
    /// The `mst serve` holding it, as its `process.json` records it (`mst runs list`'s state).
    process: RunProcess,
    machine: Mutex<Option<Box<dyn Channel>>>,
    state: Mutex<State>,
    /// Bytes its tasks copied back so far, against the run copy cap: a session is bounded as
    /// a run is, not each task on its own.
    copied: AtomicU64,
}

/// A new unguessable id: 128 random bits in hex.
fn new_id() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the OS has randomness");
    hex::encode(bytes)
}

impl Session {
    /// Makes the machine, checks a worker starts on it (an empty shard: `hello`, then
    /// `done`), and records the session. A failure disposes of the machine.
    pub(super) fn boot(
        shared: Arc<Shared>,
        variant: &str,
        request: &super::CreateSession,
    ) -> Result<Session, ServeError> {
        let (shared_workdir, conversation) = (request.shared_workdir, request.conversation);
        let id = new_id();
        let eval = shared.prepared.config.name.clone();
        let dir = shared.root.session(&eval, &id);
        let never = AtomicBool::new(false);
        let machine_request = MachineRequest {
            run_id: &id,
            shard: 0,
            shards: 1,
            note: &|_: &str| {},
            cancel: &never,
            image: None,
        };
        let mut machine = shared
            .runner
            .create_machine(&machine_request)
            .map_err(|e| {
                ServeError::machine(format!(
                    "runner `{}` could not make a machine: {e:#}",
                    shared.runner.name()
                ))
            })?;
        let machine_name = machine.describe();
        let placement = machine.provenance();
        let boot = SessionShard::boot(&shared, &id, &dir, &AtomicU64::new(0)).run(
            machine.as_mut(),
            &CaseIndex::new(&[]),
            Vec::new(),
            &never,
            &|_| {},
        );
        if let Err(why) = boot {
            let _ = machine.dispose(false);
            let _ = std::fs::remove_dir_all(&dir.root);
            return Err(ServeError::machine(format!(
                "the machine from runner `{}` ({machine_name}) did not start a worker: {why}",
                shared.runner.name()
            )));
        }
        let keeps_history = shared.prepared.config.variant(variant).client == "api";
        let session = Session {
            id,
            variant: variant.to_string(),
            shared,
            dir,
            machine_name,
            placement,
            // A conversation's agent keys its own state off its working directory.
            workdir: (shared_workdir || conversation).then(|| SHARED_WORKDIR.to_string()),
            conversation: conversation.then(|| Mutex::new(Thread::default())),
            keeps_history,
            turn_tokens: request.turn_tokens,
            created_at: crate::clock::unix_secs(),
            made: Instant::now(),
            process: RunProcess::current(Collector::Server),
            machine: Mutex::new(Some(machine)),
            copied: AtomicU64::new(0),
            state: Mutex::new(State {
                tasks: Vec::new(),
                running: None,
                last_active: Instant::now(),
                closed: None,
                dispose_error: None,
                dispose_when_idle: false,
            }),
        };
        session.write_record();
        session.record_process(false);
        Ok(session)
    }

    /// Writes `process.json`: the `mst serve` holding the session, and once it is closed, when
    /// (with exit code 0). A session whose server died without closing it is `interrupted`.
    fn record_process(&self, closed: bool) {
        let process = RunProcess {
            ended_at: closed.then(crate::clock::unix_secs),
            exit_code: closed.then_some(0),
            ..self.process.clone()
        };
        if let Err(e) = self.dir.write_process(&process) {
            tracing::warn!("session {}: cannot record its process: {e:#}", self.id);
        }
    }

    /// When it was made, to order sessions by age.
    pub fn made(&self) -> Instant {
        self.made
    }

    /// Whether it still holds its machine: not closed yet, or closed but with a task that has
    /// not stopped, whose machine is disposed of once it does. A task running holds the
    /// machine's lock: that counts as held.
    pub fn holds_machine(&self) -> bool {
        let open = self.state.lock().expect("session").closed.is_none();
        open || self
            .machine
            .try_lock()
            .map_or(true, |machine| machine.is_some())
    }

    /// The session's record, state and tasks.
    pub fn view(&self) -> SessionView {
        let state = self.state.lock().expect("session");
        self.view_of(&state)
    }

    fn view_of(&self, state: &State) -> SessionView {
        let running = state.running.as_ref().map(|(task, _)| task.id.clone());
        SessionView {
            id: self.id.clone(),
            eval: self.shared.prepared.config.name.clone(),
            variant: self.variant.clone(),
            runner: self.shared.runner.name().to_string(),
            machine: self.machine_name.clone(),
            placement: self.placement.clone(),
            created_at: self.created_at,
            shared_workdir: self.workdir.is_some(),
            conversation: self.conversation.is_some(),
            turn_tokens: self.turn_tokens,
            status: match (&state.closed, &running) {
                (Some(_), _) => SessionStatus::Closed,
                (None, Some(_)) => SessionStatus::Busy,
                (None, None) => SessionStatus::Ready,
            },
            ended: state.closed.clone(),
            dispose_error: state.dispose_error.clone(),
            running,
            pid: std::process::id(),
            tasks: state.tasks.iter().map(|t| t.view()).collect(),
            budget: None,
        }
    }

    /// Writes `session.json`, and `run.json` (the settled tasks as the run's trials), which
    /// makes the session a run to `mst grade`, `mst runs` and `mst runs export`.
    fn write_record(&self) {
        self.write_record_settling(None);
    }

    /// [`Session::write_record`], counting task `settling` as settled already: a task's
    /// settled status is made visible only after `run.json` lists it, so a client that saw
    /// the task finish can grade it at once.
    fn write_record_settling(&self, settling: Option<&str>) {
        let view = self.view();
        let path = self.dir.root.join(RECORD_FILE);
        // Through the run directory's writer: a held secret in a task's input or reason is
        // redacted, as in `run.json`.
        let written = self
            .dir
            .write_json(RECORD_FILE, &view)
            .and_then(|()| self.dir.write_record(&self.run_record(&view, settling)));
        if let Err(e) = written {
            tracing::warn!("cannot write {}: {e:#}", path.display());
        }
    }

    /// The session as a run: its settled tasks are the trials. A conversation's turns are
    /// dependent evidence, not cases: its run lists no trials, and says it is a conversation.
    fn run_record(&self, view: &SessionView, settling: Option<&str>) -> crate::results::RunRecord {
        let shared = &self.shared;
        crate::results::RunRecord {
            created_at: self.created_at,
            shards: 1,
            conversation: view.conversation,
            // Each settled task a case of one trial.
            trials: crate::eval::plan::Plan::new(
                vec![self.variant.as_str().into()],
                (view.tasks.iter())
                    .filter(|t| {
                        (t.status != TaskStatus::Running || Some(t.id.as_str()) == settling)
                            && !view.conversation
                    })
                    .map(|t| (t.id.as_str(), 1)),
            )
            .expect("a session's task ids are unique: each has its number"),
            baseline: None,
            collect: crate::results::Phase::Complete,
            ..shared.prepared.run_record(
                &self.id,
                &shared.config_path,
                shared.runner.name(),
                &shared.runner_options,
            )
        }
    }

    /// How long the session has been idle; `None` while a task runs or once closed.
    pub(super) fn idle_for(&self) -> Option<Duration> {
        let state = self.state.lock().expect("session");
        (state.closed.is_none() && state.running.is_none()).then(|| state.last_active.elapsed())
    }

    /// Whether the session is a conversation.
    pub(super) fn is_conversation(&self) -> bool {
        self.conversation.is_some()
    }

    /// Starts a task on `input` (checked by the caller against the client); in a
    /// conversation, a turn that continues the held resume token, or (`fresh`) drops it and
    /// starts a new thread in the same work directory.
    pub(super) fn submit(
        self: &Arc<Self>,
        input: serde_json::Value,
        fresh: bool,
    ) -> Result<TaskView, ServeError> {
        let mut state = self.state.lock().expect("session");
        if let Some(why) = &state.closed {
            return Err(ServeError::conflict(format!(
                "session `{}` is closed ({why}): create a new session",
                self.id
            )));
        }
        if let Some((task, _)) = &state.running {
            return Err(ServeError::conflict(format!(
                "task `{}` is still running on session `{}`: one task at a time per session \
                 (wait for it, or create another session for parallel tasks)",
                task.id, self.id
            )));
        }
        let n = state.tasks.len() as u32 + 1;
        // Taken under the state lock: no turn runs, so none can change the thread meanwhile.
        let turn = match &self.conversation {
            Some(thread) => {
                Some(self.start_turn(&mut thread.lock().expect("thread"), n, &input, fresh)?)
            }
            None => None,
        };
        let id = match turn {
            Some(_) => format!("turn-{n}"),
            None => format!("t{n}-{}", &new_id()[..12]),
        };
        let task = Arc::new(Task {
            key: TrialKey {
                variant: self.variant.as_str().into(),
                case: id.as_str().into(),
                trial: 0,
            },
            id,
            n,
            input,
            started_at: crate::clock::unix_secs(),
            turn,
            captured: Mutex::new(None),
            cancel: AtomicBool::new(false),
            cancelled_because: Mutex::new(String::new()),
            live: Mutex::new(Live::default()),
        });
        let view = task.view();
        let session = Arc::clone(self);
        let running = Arc::clone(&task);
        let handle = std::thread::spawn(move || session.run_task(&running));
        state.tasks.push(task);
        state.running = Some((Arc::clone(&state.tasks[n as usize - 1]), handle));
        state.last_active = Instant::now();
        drop(state);
        self.write_record();
        Ok(view)
    }

    /// Starts turn `n` on `input` from `thread` (a new thread when `fresh`); refuses (413) an
    /// `api` turn whose history and message would be over [`MAX_HISTORY_BYTES`].
    fn start_turn(
        &self,
        thread: &mut Thread,
        n: u32,
        input: &serde_json::Value,
        fresh: bool,
    ) -> Result<TurnStart, ServeError> {
        let kept: &[Exchange] = if fresh { &[] } else { &thread.history };
        if self.keeps_history {
            let history: usize = kept.iter().map(Exchange::bytes).sum();
            let message = text_of(input).len();
            if history + message > MAX_HISTORY_BYTES {
                return Err(ServeError::too_large(format!(
                    "turn {n} of conversation `{}` would send the model {history} bytes of \
                     earlier turns and a {message}-byte message, over the {MAX_HISTORY_BYTES} \
                     bytes a conversation's history may hold: start a new thread with \
                     `\"fresh\": true` (the work directory stays), or send a shorter message",
                    self.id
                )));
            }
        }
        // Only a turn that starts drops the thread.
        if fresh {
            *thread = Thread::default();
        }
        Ok(TurnStart {
            fresh,
            token: thread.token.clone(),
            history: thread.history.clone(),
        })
    }

    /// Runs `task` as a one-trial shard on the machine, then settles it.
    fn run_task(&self, task: &Task) {
        let case = CaseRecord::new(task.key.case.clone(), task.input.clone());
        let cases = CaseIndex::new(std::slice::from_ref(&case));
        let on_event = |event: ShardEvent| match event {
            // An event too large to stream (`None`) shows once the task settles.
            ShardEvent::TraceEvent {
                event: Some(event), ..
            } => task.live.lock().expect("task").events.push(event),
            ShardEvent::TrialInfra { reason, .. }
            | ShardEvent::TraceRefused { why: reason, .. } => {
                task.live.lock().expect("task").infra = Some(reason);
            }
            // The last one wins: a resumed agent mints a new id for the thread.
            ShardEvent::ResumeToken { token, .. } => {
                *task.captured.lock().expect("task") = Some(token);
            }
            _ => {}
        };
        let outcome = {
            let mut machine = self.machine.lock().expect("machine");
            match machine.as_mut() {
                Some(channel) => SessionShard {
                    shared: &self.shared,
                    session: &self.id,
                    dir: &self.dir,
                    workdir: self.workdir.as_deref(),
                    turn: task
                        .turn
                        .as_ref()
                        .map(|turn| (turn.token.as_ref(), turn.history.as_slice())),
                    token_budget: self.turn_tokens,
                    copied: &self.copied,
                }
                .run(
                    channel.as_mut(),
                    &cases,
                    vec![task.key.clone()],
                    &task.cancel,
                    &on_event,
                ),
                None => Err("the session's machine is gone".to_string()),
            }
        };
        let settlement = self.settle(task, outcome.err());
        self.write_record_settling(Some(&task.id));
        if let Some(thread) = &self.conversation {
            let mut thread = thread.lock().expect("thread");
            // A turn that captured no token (it failed, or the agent printed none) leaves the
            // held one: the next turn continues the same thread.
            if let Some(token) = task.captured.lock().expect("task").take() {
                thread.token = Some(token);
            }
            // Only a completed turn with an answer is part of the thread: an aborted, failed
            // or timed-out one never reached the user as a reply.
            if let (true, (TaskStatus::Completed, ..), Some(answer)) = (
                self.keeps_history,
                &settlement.settled,
                settlement.final_text(),
            ) {
                thread.history.push(Exchange {
                    user: text_of(&task.input),
                    assistant: answer.to_string(),
                });
            }
        }
        let dispose = {
            let mut state = self.state.lock().expect("session");
            state.running = None;
            state.last_active = Instant::now();
            state.dispose_when_idle
        };
        // Published last, and at once: whoever sees the task done finds its whole stored trace
        // on that page, and may submit the next turn straight away (it continues this one).
        settlement.publish(&mut task.live.lock().expect("task"));
        if dispose {
            self.dispose();
        }
        self.write_record();
    }

    /// Settles `task` from its stored trace; without one (aborted, lost), seals what was
    /// streamed as its trace. Returns the settlement for the caller to publish.
    fn settle(&self, task: &Task, failure: Option<String>) -> Settlement {
        let now = crate::clock::unix_secs();
        let stored = self.dir.read_trace(&task.key);
        let mut live = task.live.lock().expect("task");
        match stored {
            Some(record) => {
                let status = match record.trace.status {
                    TrialStatus::Completed => TaskStatus::Completed,
                    TrialStatus::TimedOut => TaskStatus::TimedOut,
                    TrialStatus::Infra => TaskStatus::Infra,
                };
                let reason = live.infra.take().or_else(|| {
                    (status == TaskStatus::TimedOut).then(|| {
                        format!(
                            "past its time budget: the eval's `timeout` of {} s",
                            self.shared.prepared.config.timeout
                        )
                    })
                });
                // A limit other than the deadline says which.
                let (status, reason) = match record.trace.stopped {
                    Some(why) => (TaskStatus::OverBudget, Some(why)),
                    None => (status, reason),
                };
                Settlement {
                    settled: (status, reason, now),
                    stored: Some((record.trace.events, record.trace.final_text)),
                }
            }
            None => {
                let (status, reason) = match (task.cancel.load(Ordering::SeqCst), failure) {
                    (true, _) => (
                        TaskStatus::Aborted,
                        Some(format!(
                            "aborted: {}",
                            task.cancelled_because.lock().expect("task")
                        )),
                    ),
                    (false, why) => (
                        TaskStatus::Infra,
                        why.or_else(|| live.infra.take())
                            .or(Some("no trace came back".into())),
                    ),
                };
                // The partial trace is sealed as the task's trace: what was seen stays.
                let record = TrialRecord {
                    case: CaseRecord::new(task.key.case.clone(), task.input.clone()),
                    variant: task.key.variant.to_string(),
                    trial: 0,
                    trace: crate::eval::trial::TraceRecord {
                        status: TrialStatus::Infra,
                        events: live.events.clone(),
                        ..Default::default()
                    },
                    collected_by: None,
                };
                let _ = self.dir.write_trace(&task.key, &record);
                Settlement {
                    settled: (status, reason, now),
                    stored: None,
                }
            }
        }
    }

    /// Aborts task `id` while it runs: its worker gets `cancel` (then the grace, then a kill),
    /// its partial trace is sealed as `aborted`, and the session stays open for the next task.
    pub(super) fn abort(&self, id: &str) -> Result<TaskView, ServeError> {
        let state = self.state.lock().expect("session");
        match &state.running {
            Some((task, _)) if task.id == id => {
                task.cancel("aborted by request");
                Ok(task.view())
            }
            _ => match state.tasks.iter().find(|t| t.id == id) {
                Some(task) => Err(ServeError::conflict(format!(
                    "task `{id}` is not running (it ended {}); nothing to abort",
                    serde_json::to_value(task.view().status).unwrap_or_default()
                ))),
                None => Err(ServeError::not_found(format!(
                    "session `{}` has no task `{id}`",
                    self.id
                ))),
            },
        }
    }

    /// Task `id`'s events with `seq >= since`.
    pub(super) fn trace(&self, id: &str, since: Option<u64>) -> Result<TracePage, ServeError> {
        let task = {
            let state = self.state.lock().expect("session");
            state.tasks.iter().find(|t| t.id == id).cloned()
        };
        let task = task.ok_or_else(|| {
            ServeError::not_found(format!("session `{}` has no task `{id}`", self.id))
        })?;
        let since = since.unwrap_or(0);
        let live = task.live.lock().expect("task");
        let events: Vec<TraceEvent> = live
            .events
            .iter()
            .filter(|e| e.seq >= since)
            .cloned()
            .collect();
        let next = events.last().map_or(since, |e| e.seq + 1);
        Ok(TracePage {
            task: task.id.clone(),
            status: live
                .settled
                .as_ref()
                .map_or(TaskStatus::Running, |(s, _, _)| *s),
            events,
            next,
            done: live.settled.is_some(),
            final_text: live.final_text.clone(),
        })
    }

    /// Closes the session: aborts the running task (its worker gets `cancel`, then the grace,
    /// then a kill), seals its trace, disposes of the machine and records why. Bounded: a
    /// task that does not stop in time leaves the disposal to the task's own end.
    pub(super) fn close(&self, why: &str) {
        let running = {
            let mut state = self.state.lock().expect("session");
            if state.closed.is_some() {
                return;
            }
            state.closed = Some(why.to_string());
            state.running.take()
        };
        // Closed to new tasks from now on, whatever the running one takes to stop.
        self.record_process(true);
        if let Some((task, handle)) = running {
            task.cancel("the session was closed");
            let limit =
                Instant::now() + self.shared.settings.cancel_grace + Duration::from_secs(10);
            while !handle.is_finished() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(20));
            }
            if !handle.is_finished() {
                let mut state = self.state.lock().expect("session");
                state.dispose_when_idle = true;
                state.running = Some((task, handle));
                drop(state);
                self.write_record();
                return;
            }
            let _ = handle.join();
        }
        self.dispose();
        self.write_record();
    }

    /// Disposes of the machine, once.
    fn dispose(&self) {
        let machine = self.machine.lock().expect("machine").take();
        if let Some(mut machine) = machine {
            if let Err(e) = machine.dispose(false) {
                self.state.lock().expect("session").dispose_error = Some(format!("{e:#}"));
            }
        }
    }
}

/// A conversation turn as a shard sends it: the resume token it continues, and the history.
type TurnOf<'a> = (Option<&'a Secret>, &'a [Exchange]);

/// One shard of a session: whose it is and what its bundle carries ([`SessionShard::run`]).
struct SessionShard<'a> {
    shared: &'a Shared,
    /// The session's id: the bundle's run id.
    session: &'a str,
    /// Where its traces go.
    dir: &'a RunDir,
    /// The session's shared work directory, when its clients share one.
    workdir: Option<&'a str>,
    /// The conversation turn it runs, if any.
    turn: Option<TurnOf<'a>>,
    /// Its tasks' token budget.
    token_budget: Option<u64>,
    /// What the session copied back so far (the run copy cap's count).
    copied: &'a AtomicU64,
}

impl SessionShard<'_> {
    /// A shard of session `session` that only starts its worker (no task, no turn), counting
    /// what it copies back in `copied`.
    fn boot<'a>(
        shared: &'a Shared,
        session: &'a str,
        dir: &'a RunDir,
        copied: &'a AtomicU64,
    ) -> SessionShard<'a> {
        SessionShard {
            shared,
            session,
            dir,
            copied,
            workdir: None,
            turn: None,
            token_budget: None,
        }
    }

    /// Runs `trials` on `machine`, staged in a temporary directory; a conversation turn
    /// hands its worker the resume token it continues, if any, and its bundle carries the
    /// history. `Err` says why the shard did not end as done.
    fn run(
        &self,
        machine: &mut dyn Channel,
        cases: &CaseIndex<'_>,
        trials: Vec<TrialKey>,
        cancel: &AtomicBool,
        events: &(dyn Fn(ShardEvent) + Sync),
    ) -> Result<(), String> {
        let SessionShard {
            shared,
            session,
            dir,
            workdir,
            turn,
            token_budget,
            copied,
        } = *self;
        let mut bundle = Bundle {
            token_budget,
            // A playground task's evidence is its live trace; artefacts are a batch run's.
            artifacts: None,
            workdir: workdir.map(str::to_string),
            conversation: turn.map(|(token, history)| Turn {
                resume: token.is_some(),
                history: history.to_vec(),
            }),
            ..Bundle::for_eval(
                &shared.prepared.config,
                session,
                trials,
                ShardIndex { index: 0, of: 1 },
                shared.settings.heartbeat_ms(),
            )
        };
        let staging = tempfile::tempdir().map_err(|e| format!("cannot stage the bundle: {e}"))?;
        let workspaces = &shared.prepared.workspaces;
        bundle.workspaces = collect::bundle_workspaces(workspaces, &bundle, bundle.own_trials());
        collect::ship_workspaces(workspaces, &bundle.workspaces, staging.path())
            .and_then(|()| collect::write_bundle(staging.path(), &mut bundle, None, cases))
            .map_err(|e| format!("cannot stage the bundle: {e:#}"))?;
        std::fs::create_dir_all(&dir.root)
            .map_err(|e| format!("cannot create {}: {e}", dir.root.display()))?;
        let context = ShardContext {
            limiter: &shared.prepared.limiter,
            cases,
            tokens: &shared.tokens,
            settings: shared.settings,
            events,
            cancel,
            resume: turn.and_then(|(token, _)| token),
            copied,
            artifacts: None,
            stored: None,
            models: Some(&shared.prepared.model_access),
            check_files: Some(&shared.prepared.workspaces.check_files),
            egress: None,
        };
        let report = ShardSession::new(&context, &bundle, bundle.own_trials(), dir)
            .run(machine, staging.path());
        match report.ended {
            ShardEnd::Done | ShardEnd::DoneCleanupFailed => Ok(()),
            other => Err(other.to_string()),
        }
    }
}

/// Closes the records a previous `mst serve` left open under `sessions_dir`: their process is
/// gone, and with it the channels to their machines. The Docker runner removes the containers
/// of gone processes when it starts; a local machine's directory is removed here.
pub(super) fn recover(sessions_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(sessions_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path().join(RECORD_FILE);
        let Some(mut view) = std::fs::read(&path)
            .ok()
            .and_then(|bytes| serde_json::from_slice::<SessionView>(&bytes).ok())
        else {
            continue;
        };
        // Its process record, when it has one, tells a reused pid from the server itself.
        let recorded = RunDir { root: entry.path() }.read_process();
        let alive = match recorded {
            Ok(Some(process)) => !process.owner.is_gone(&crate::owner::Owner::current()),
            _ => process_alive(view.pid),
        };
        if view.status == SessionStatus::Closed || alive {
            continue;
        }
        view.status = SessionStatus::Closed;
        let mut ended = format!(
            "interrupted: the mst serve that held it (pid {}) stopped without closing it",
            view.pid
        );
        if let Some(dir) = local_machine_dir(&view) {
            match std::fs::remove_dir_all(&dir) {
                Ok(()) => ended.push_str("; its machine directory was removed"),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    view.dispose_error = Some(format!("cannot remove {}: {e}", dir.display()))
                }
            }
        }
        view.ended = Some(ended);
        for task in &mut view.tasks {
            if task.status == TaskStatus::Running {
                task.status = TaskStatus::Aborted;
                task.reason = Some("interrupted: mst serve stopped".into());
            }
        }
        view.running = None;
        let _ = RunDir { root: entry.path() }.write_json(RECORD_FILE, &view);
    }
}

/// A local session's machine directory, when the record names one mst could have made: a
/// `mst-local-*` directory right under the temporary directory. A record is a file on disk:
/// it must not be able to name any other directory for removal.
fn local_machine_dir(view: &SessionView) -> Option<std::path::PathBuf> {
    if view.runner != "local" {
        return None;
    }
    let dir = std::path::PathBuf::from(view.placement.get("dir")?.as_str()?);
    let name = dir.file_name()?.to_str()?;
    let made_by_mst = dir.parent() == Some(std::env::temp_dir().as_path())
        && name.starts_with("mst-local-")
        && !name.contains("..");
    (made_by_mst && dir.symlink_metadata().ok()?.is_dir()).then_some(dir)
}

/// Whether process `pid` runs (another `mst serve` on the same results directory keeps its
/// sessions).
fn process_alive(pid: u32) -> bool {
    // SAFETY: signal 0 checks the process exists and sends nothing.
    pid == std::process::id() || unsafe { libc::kill(pid as i32, 0) == 0 }
}
