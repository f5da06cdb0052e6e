//! The worker: `mst collect --bundle DIR --results DIR`. Runs on the machine, drives the
//! client for each trial of its shard, sends each trace as soon as the trial ends (in its
//! `trial` message, or as a file when it is too large for one line), and speaks
//! `mst.shard/v1` with the coordinator over stdin/stdout. Its state is one `Worker`, fed by
//! one stream of `Event`s (coordinator messages, finished trials) with a method per event.

use super::artifacts::{self, ArtifactFile, ArtifactSlots};
use super::bundle::{Bundle, WorkReader, BUNDLE_FILE, MAX_BUNDLE_BYTES};
use super::protocol::{
    self, Cleanup, ClientIdentity, Collected, CoordinatorMessage, DoneCounts, Token, TokenReason,
    WorkerMessage, PROTOCOL,
};
use crate::client::{self, Client, EventSink, Recorder, TrialInput};
use crate::eval::config::{ServerConfig, VariantSpec};
use crate::eval::trial::{
    CaseRecord, EventKind, TraceEvent, TraceRecord, TrialKey, TrialRecord, TrialStatus,
};
use crate::grade::remote::RemoteGrader;
use crate::results::trace_path;
use crate::sandbox::{Bwrap, TrialSandbox, TrialSandboxRequest, TRIAL_SANDBOX_ENV};
use crate::secrets::Secret;
use anyhow::{Context, Result};
use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How often the worker looks at its tokens' expiry while it waits.
const TOKEN_CHECK: Duration = Duration::from_millis(500);

/// Writes protocol lines to stdout; shared by the main loop and the heartbeat thread.
#[derive(Clone)]
struct Wire(Arc<Mutex<std::io::Stdout>>);

impl Wire {
    fn send(&self, message: &WorkerMessage) {
        self.send_line(&protocol::encode(message));
    }

    /// Writes a line [`protocol::encode`] made.
    fn send_line(&self, line: &str) {
        let mut out = self.0.lock().expect("stdout lock");
        // A closed stdout means the coordinator is gone; the main loop notices on stdin.
        let _ = out.write_all(line.as_bytes());
        let _ = out.flush();
    }
}

/// One input to the worker's state machine.
enum Event {
    FromCoordinator(CoordinatorMessage),
    /// The coordinator sent a line this worker cannot read.
    CoordinatorBroke(String),
    CoordinatorGone,
    Finished(TrialKey, Result<Option<Finished>, String>),
}

/// A trial that ran to its end: its trace's status, and the `trial` line that reports it
/// (made, and redacted, on the trial's own thread).
struct Finished {
    status: TrialStatus,
    line: String,
}

/// What one running trial says to the coordinator: its trace events as they are recorded
/// (an [`EventSink`]) and, in a conversation turn, its resume token.
struct TrialLink {
    key: TrialKey,
    wire: Wire,
    /// Bytes of events streamed so far, or `None` once the stream stopped at its cap.
    sent: Mutex<Option<u64>>,
    /// In a conversation turn, the last resume token the client captured.
    resume: Mutex<Option<Secret>>,
    /// Where the coordinator's answers to its asks for check files arrive.
    check_files: super::check_files::Requests,
}

/// How long a trial waits for its check's hidden files; past it the trial is infra.
const CHECK_FILES_WAIT: Duration = Duration::from_secs(300);

impl TrialLink {
    /// Asks the coordinator for the hidden files of check `check` and waits for them.
    fn check_files(&self, check: &str) -> Result<Vec<u8>, String> {
        let heard = self.check_files.wait_for(&self.key, check);
        self.wire.send(&WorkerMessage::CheckFiles {
            key: self.key.clone(),
            check: check.to_string(),
        });
        match heard.recv_timeout(CHECK_FILES_WAIT) {
            Ok(delivery) => delivery,
            Err(_) => Err(format!(
                "the coordinator sent none within {} s",
                CHECK_FILES_WAIT.as_secs()
            )),
        }
    }
}

/// A conversation turn's resume tokens: each valid one is held for redaction at once (the
/// trace and the streamed events never hold it) and the last one is kept, for `resume-token`.
impl client::ResumeSink for TrialLink {
    fn token(&self, token: Secret) {
        // A token the coordinator would refuse is not kept: the next turn starts fresh.
        if protocol::check_resume_token(token.expose()).is_err() {
            return;
        }
        crate::secrets::hold("resume token", &token);
        *self.resume.lock().expect("resume lock") = Some(token);
    }
}

/// One trial's [`EventSink`]: each event the client records goes to the coordinator at once
/// as an `event` line, redacted as the trace file will be. An event over the per-event cap
/// goes as a stub; once the trial's stream would pass its cap, the stream stops (the trace
/// file has every event).
impl EventSink for TrialLink {
    fn emit(&self, event: &TraceEvent) {
        let mut sent = self.sent.lock().expect("stream lock");
        let Some(so_far) = *sent else {
            return;
        };
        let (seq, event) = (event.seq, event.redacted());
        let size = protocol::event_bytes(&event);
        let (event, omitted) = match size > protocol::MAX_EVENT_BYTES {
            true => (None, Some(size as u64)),
            false => (Some(event), None),
        };
        let line = protocol::encode(&WorkerMessage::Event {
            key: self.key.clone(),
            seq,
            event,
            omitted,
        });
        let total = so_far + line.len() as u64;
        if total > protocol::MAX_TRIAL_STREAM_BYTES {
            *sent = None;
            return;
        }
        *sent = Some(total);
        self.wire.send_line(&line);
    }
}

/// What the bundle says of every trial besides its key and case.
struct TrialSetting<'a> {
    /// Where traces are written.
    results: &'a Path,
    /// The bundle's shared work directory, if it has one.
    workdir: Option<&'a str>,
    /// A conversation turn: the client reports the resume tokens it captures.
    conversation: bool,
    /// An `api` conversation's earlier turns.
    history: &'a [client::Exchange],
    /// The bundle's `tokenBudget`.
    token_budget: Option<u64>,
    /// Where fresh work directories and homes come from, and the sandbox of the programs.
    rooms: &'a TrialRooms,
    /// Where the trials' artefact directories come from, when the bundle keeps artefacts.
    artifacts: Option<&'a ArtifactSlots>,
    /// The checks the trial's variant runs after its client.
    checks: &'a [crate::eval::config::CheckSpec],
    /// The archive of the workspace laid into its work directory before its client starts.
    workspace: Option<&'a Path>,
    /// The model gateway, when the trial's client calls models through it.
    gateway: Option<client::GatewayAccess>,
}

/// Runs one trial and makes its `trial` line, with the trace in it when the line fits
/// [`protocol::MAX_LINE_BYTES`] and in a file otherwise. `Ok(None)` when the trial was
/// stopped by `cancel`: it is left missing, to be resumed.
fn run_trial(
    client: &dyn Client,
    case: &CaseRecord,
    key: &TrialKey,
    timeout: Duration,
    setting: &TrialSetting<'_>,
    cancel: &AtomicBool,
    link: &TrialLink,
) -> Result<Option<Finished>, String> {
    let results = setting.results;
    let rooms = setting.rooms;
    let scratch = Scratch::new(results, setting.workdir, &rooms.work)?;
    // Into an empty directory only: a conversation's shared one gets it on its first turn, and
    // keeps what the agent made of it on the next.
    let empty = |dir: &Path| std::fs::read_dir(dir).is_ok_and(|mut d| d.next().is_none());
    if let Some(archive) = setting.workspace.filter(|_| empty(scratch.path())) {
        crate::workspace::unpack(archive, scratch.path())
            .map_err(|e| format!("cannot lay the trial's workspace: {e:#}"))?;
    }
    let home = Scratch::home(&scratch, results, &rooms.homes)?;
    let evidence = setting.artifacts.map(ArtifactSlots::take).transpose()?;
    // Its programs write its directories and its artefact directory (`$MST_ARTIFACTS`).
    let sandbox = (rooms.sandbox.as_ref()).map(|bwrap| {
        let artifacts = evidence.as_ref().map(|e| e.dir().to_path_buf());
        let writable = [scratch.path().into(), home.path().into()];
        TrialSandbox::new(bwrap, writable.into_iter().chain(artifacts).collect())
    });
    // Its one way out, with egress by name: a proxy port of its own, whose requests go into
    // its trace.
    let forwarder = (rooms.egress.as_ref())
        .map(crate::egress::TrialForwarder::start)
        .transpose()
        .map_err(|e| format!("cannot start the trial's egress proxy: {e}"))?;
    let place = client::TrialPlace {
        work: scratch.path(),
        home: home.path(),
        sandbox: sandbox.as_ref(),
        proxy: forwarder.as_ref().map(crate::egress::TrialForwarder::port),
    };
    let trace = client.run(&TrialInput {
        case,
        variant: &key.variant,
        trial: key.trial,
        timeout,
        cancel,
        place,
        events: link,
        resume: setting
            .conversation
            .then_some(link as &dyn client::ResumeSink),
        history: setting.history,
        token_budget: setting.token_budget,
        evidence: evidence.as_ref(),
        gateway: setting.gateway.as_ref(),
    });
    let mut trace = trace;
    let cancelled = cancel.load(Ordering::Relaxed) && trace.status != TrialStatus::Completed;
    // In the trial's own directory, before it is emptied: what the agent left there.
    if !cancelled && !setting.checks.is_empty() {
        let fetch = |check: &str| link.check_files(check);
        super::machine_checks::run_checks(setting.checks, &place, &mut trace, link, &fetch);
    }
    if let Some(forwarder) = forwarder {
        record_egress(forwarder, &mut trace, link);
    }
    let status = trace.status;
    // Its diagnosis and the list of what it left (nothing of a cancelled trial).
    let artifacts = match (setting.artifacts, evidence) {
        (Some(slots), Some(evidence)) => {
            slots.finish(evidence, key, (!cancelled).then_some(&trace))
        }
        _ => Vec::new(),
    };
    if cancelled {
        return Ok(None);
    }
    let record = TrialRecord {
        case: case.clone(),
        variant: key.variant.to_string(),
        trial: key.trial,
        trace,
        collected_by: None,
    };
    let reported = match status {
        TrialStatus::Infra => Collected::Infra,
        _ => Collected::Collected,
    };
    // Most traces are small: sent in the message, they cost no file on either side.
    let message = trial_message(key, reported, None, Some(Box::new(record)), artifacts);
    let line = redacted_line(&message);
    if line.len() <= protocol::MAX_LINE_BYTES {
        return Ok(Some(Finished { status, line }));
    }
    let WorkerMessage::Trial {
        trace: Some(record),
        artifacts,
        ..
    } = message
    else {
        unreachable!("trial_message made a `trial` with its trace");
    };
    let bytes = serde_json::to_vec_pretty(&record).map_err(|e| e.to_string())?;
    // Even on the machine (a kept one is read later), no token this worker holds is written.
    let bytes = crate::secrets::redactor().redact_json(&bytes).into_owned();
    crate::files::write_atomic(&results.join(trace_path(key)), &bytes)
        .map_err(|e| format!("{e:#}"))?;
    let line = redacted_line(&trial_message(key, reported, None, None, artifacts));
    Ok(Some(Finished { status, line }))
}

/// The `trial` message for `key`: with the trace in it, or naming its file; and the
/// artefacts the trial left.
fn trial_message(
    key: &TrialKey,
    status: Collected,
    error: Option<String>,
    trace: Option<Box<TrialRecord>>,
    artifacts: Vec<ArtifactFile>,
) -> WorkerMessage {
    WorkerMessage::Trial {
        key: key.clone(),
        status,
        path: trace_path(key),
        error,
        trace,
        artifacts,
    }
}

/// `message` as a line, with no token this worker holds in it.
fn redacted_line(message: &WorkerMessage) -> String {
    let line = protocol::encode(message);
    match crate::secrets::redactor().redact_json(line.as_bytes()) {
        std::borrow::Cow::Borrowed(_) => line,
        // Redaction puts plain text in place of text: the line stays UTF-8.
        std::borrow::Cow::Owned(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// Where a trial's client runs: a fresh, empty directory of its own (emptied after the trial
/// and given back to [`ScratchDirs`]), or the bundle's shared work directory (kept).
enum Scratch<'a> {
    Fresh(Option<tempfile::TempDir>, &'a ScratchDirs),
    Shared(std::path::PathBuf),
}

impl<'a> Scratch<'a> {
    fn new(results: &Path, workdir: Option<&str>, dirs: &'a ScratchDirs) -> Result<Self, String> {
        let Some(name) = workdir else {
            return Ok(Scratch::Fresh(Some(dirs.take(results)?), dirs));
        };
        // The bundle comes from the coordinator, but a name is all it may give.
        if !crate::files::is_plain_relative(name) || name.contains('/') {
            return Err(format!(
                "the bundle's workdir {name:?} is not a plain directory name"
            ));
        }
        let dir = results.with_file_name(name);
        std::fs::create_dir_all(&dir).map_err(|e| {
            format!(
                "cannot make the shared work directory {}: {e}",
                dir.display()
            )
        })?;
        Ok(Scratch::Shared(dir))
    }

    /// The home of a trial working in `work`: a fresh one beside a fresh work directory;
    /// in a shared one (a conversation's turns), one kept in it, so that the next turn finds
    /// what an agent CLI stored of its session.
    fn home(work: &Scratch<'_>, results: &Path, dirs: &'a ScratchDirs) -> Result<Self, String> {
        match work {
            Scratch::Fresh(..) => Ok(Scratch::Fresh(Some(dirs.take(results)?), dirs)),
            Scratch::Shared(dir) => {
                let home = dir.join(SHARED_HOME);
                std::fs::create_dir_all(&home)
                    .map_err(|e| format!("cannot make {}: {e}", home.display()))?;
                Ok(Scratch::Shared(home))
            }
        }
    }

    fn path(&self) -> &Path {
        match self {
            Scratch::Fresh(dir, _) => dir.as_ref().expect("held until dropped").path(),
            Scratch::Shared(dir) => dir,
        }
    }
}

impl Drop for Scratch<'_> {
    fn drop(&mut self) {
        if let Scratch::Fresh(dir, dirs) = self {
            dirs.give_back(dir.take().expect("held until dropped"));
        }
    }
}

/// The home of the trials of a shared work directory, inside it.
/// Appends what went through the trial's egress proxy to `trace`: one `egress` event per
/// request, with its request line and the proxy's status (200 through, 403 refused).
fn record_egress(
    forwarder: crate::egress::TrialForwarder,
    trace: &mut TraceRecord,
    link: &TrialLink,
) {
    let at_ms = trace.duration_ms;
    for record in forwarder.finish() {
        let data = serde_json::json!({"request": record.request, "status": record.status});
        let kind = EventKind::Custom {
            name: "egress".into(),
            data,
        };
        super::machine_checks::push(trace, link, at_ms, kind);
    }
}

const SHARED_HOME: &str = ".mst-agent-home";

/// Where the trials' programs run: their work directories and their homes, each reused
/// (emptied) by a later trial, and, on a sandboxed machine, the sandbox each program gets.
struct TrialRooms {
    work: ScratchDirs,
    homes: ScratchDirs,
    sandbox: Option<Bwrap>,
    /// How each trial's proxy port reaches the egress proxy, when the runner allows egress
    /// by name: the machine's socket, or the tunnel over the protocol.
    egress: Option<crate::egress::Connector>,
}

impl TrialRooms {
    /// The rooms of this worker's trials, sandboxed when its runner says so through
    /// [`TRIAL_SANDBOX_ENV`]; their egress through `tunnel` when the bundle says so.
    fn new(tunnel: Option<crate::egress::Connector>) -> Result<Self> {
        let (sandbox, egress) = match std::env::var(TRIAL_SANDBOX_ENV) {
            Ok(json) => {
                let request: TrialSandboxRequest =
                    serde_json::from_str(&json).with_context(|| {
                        format!("${TRIAL_SANDBOX_ENV} does not describe a sandbox: {json}")
                    })?;
                // On this machine: a runner asking for sandboxes where bubblewrap is missing
                // gets the shard refused, saying what to install.
                (Some(Bwrap::find(request.expose)?), request.egress)
            }
            Err(_) => (None, None),
        };
        Ok(TrialRooms {
            work: ScratchDirs::new("mst-trial-"),
            homes: ScratchDirs::new("mst-home-"),
            sandbox,
            egress: (egress.as_deref().map(crate::egress::socket_connector)).or(tunnel),
        })
    }

    /// Removes the idle directories now, as the worker ends ([`ScratchDirs::remove_idle`]).
    fn remove_idle(&self) -> Cleanup {
        match (self.work.remove_idle(), self.homes.remove_idle()) {
            (Cleanup::Ok, Cleanup::Ok) => Cleanup::Ok,
            _ => Cleanup::Failed,
        }
    }
}

/// How long an ending worker waits for its trial threads to finish jobs that have all
/// reported: they have only their captures left to drop.
const JOBS_END: Duration = Duration::from_secs(2);

/// The worker's scratch directories: one per trial running at once, each emptied when its
/// trial ends and handed to the next, and all removed with the worker. Making and removing a
/// directory per trial cost more than the trial itself on ext4, whose inode allocator scans
/// past every recently freed inode (docs/performance.md).
struct ScratchDirs {
    /// The start of their names.
    prefix: &'static str,
    idle: Mutex<Vec<tempfile::TempDir>>,
}

impl ScratchDirs {
    /// No directories yet; those made will be named `prefix…`.
    fn new(prefix: &'static str) -> Self {
        ScratchDirs {
            prefix,
            idle: Mutex::default(),
        }
    }

    /// An empty scratch directory: an idle one, or a new one.
    fn take(&self, results: &Path) -> Result<tempfile::TempDir, String> {
        let idle = self.idle.lock().expect("scratch dirs").pop();
        match idle {
            Some(dir) => Ok(dir),
            None => scratch_dir(results, self.prefix),
        }
    }

    /// Takes `dir` back once its trial ended: emptied, it serves the next trial; one that
    /// cannot be emptied, or is no longer a plain directory, is dropped (removed) instead.
    fn give_back(&self, dir: tempfile::TempDir) {
        if empty_dir(dir.path()).is_ok() {
            self.idle.lock().expect("scratch dirs").push(dir);
        }
    }

    /// Removes the idle directories now, as the worker ends, before it says `done`. (Left to
    /// the pool's drop, whose last owner was at times a trial thread racing the process's
    /// exit, every run left a directory per trial slot in the machine's temporary directory.)
    fn remove_idle(&self) -> Cleanup {
        let idle = std::mem::take(&mut *self.idle.lock().expect("scratch dirs"));
        let mut cleanup = Cleanup::Ok;
        for dir in idle {
            let path = dir.path().to_path_buf();
            if let Err(e) = dir.close() {
                eprintln!("mst collect: clean-up failed: {}: {e}", path.display());
                cleanup = Cleanup::Failed;
            }
        }
        cleanup
    }
}

/// Removes everything in `dir`, following no link; fails if `dir` is not a plain directory
/// (a client may have replaced it) or something in it stays.
pub(super) fn empty_dir(dir: &Path) -> std::io::Result<()> {
    if !std::fs::symlink_metadata(dir)?.file_type().is_dir() {
        return Err(std::io::Error::other("no longer a directory"));
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        match entry.file_type()?.is_dir() {
            // `remove_dir_all` does not follow links inside (std's own guarantee).
            true => std::fs::remove_dir_all(entry.path())?,
            false => std::fs::remove_file(entry.path())?,
        }
    }
    match std::fs::read_dir(dir)?.next() {
        None => Ok(()),
        Some(_) => Err(std::io::Error::other("not empty")),
    }
}

/// A fresh, empty directory for one trial's client: in the temporary directory, or, on a
/// machine whose temporary directory this user cannot write, beside the results directory.
fn scratch_dir(results: &Path, prefix: &str) -> Result<tempfile::TempDir, String> {
    let builder = || {
        let mut builder = tempfile::Builder::new();
        builder.prefix(prefix);
        builder
    };
    builder().tempdir().or_else(|first| {
        let beside = results.with_file_name("scratch");
        std::fs::create_dir_all(&beside)
            .and_then(|()| builder().tempdir_in(&beside))
            .map_err(|e| {
                format!(
                    "cannot make the trial's scratch directory in {} ({first}) or {} ({e})",
                    std::env::temp_dir().display(),
                    beside.display()
                )
            })
    })
}

/// `mst collect`: returns the process exit code (0 when the shard ran to the end).
pub fn collect(bundle_dir: &Path, results: &Path) -> u8 {
    // The tokens live in this process's memory, and its agents run as its user: a process
    // that is not dumpable keeps its `/proc/PID/mem` and `environ` from them (unless they hold
    // CAP_SYS_PTRACE, which a sandbox drops). Its children are dumpable again once they exec.
    // SAFETY: prctl(2) with PR_SET_DUMPABLE takes plain integers and changes no memory.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    let wire = Wire(Arc::new(Mutex::new(std::io::stdout())));
    let started = Worker::start(bundle_dir, results, wire.clone());
    match started.and_then(Worker::run) {
        Ok(code) => code,
        Err(e) => {
            wire.send(&WorkerMessage::Fatal {
                message: format!("{e:#}"),
            });
            1
        }
    }
}

/// Clients by variant name.
type Clients = BTreeMap<String, Arc<dyn Client>>;

/// The worker's state: what is queued, waiting for `granted`, running and finished.
struct Worker {
    /// The bundle's settings; its trials are read from its work file as they start (`queue`).
    bundle: Bundle,
    results: PathBuf,
    wire: Wire,
    clients: Clients,
    tokens_ready: bool,
    /// The tokens held, by server.
    token_values: BTreeMap<String, Secret>,
    /// Expiring tokens held: server → (expires at, received at), in Unix milliseconds.
    expiring: BTreeMap<String, (u64, u64)>,
    /// Servers whose renewal was asked for since their token last arrived.
    renewal_asked: BTreeSet<String>,
    /// The trials not asked for yet, read from the bundle's work file a case at a time.
    queue: WorkReader,
    /// The trials asked for (`acquire`) and not granted yet, with their cases.
    awaiting: Vec<(TrialKey, Arc<CaseRecord>)>,
    /// The machine's model gateway, started for the first trial that calls models through it.
    gateway: Option<super::gateway::Gateway>,
    running: usize,
    counts: DoneCounts,
    cancelled: bool,
    /// Why the work file could not be read on, once it could not: the worker ends `fatal`.
    broken: Option<anyhow::Error>,
    cancel_trials: Arc<AtomicBool>,
    events: mpsc::Sender<Event>,
    inbox: mpsc::Receiver<Event>,
    stop_heartbeat: Arc<AtomicBool>,
    /// Where granted trials run: one thread per trial running at once, reused.
    threads: super::threads::TrialThreads,
    /// The trials' work directories and homes, reused likewise, and their sandbox.
    rooms: Arc<TrialRooms>,
    /// The trials' artefact directories, when the bundle keeps artefacts.
    artifacts: Option<Arc<ArtifactSlots>>,
    /// The bundle's workspace archives ([`super::bundle::WORKSPACES_DIR`]).
    workspaces: PathBuf,
    /// The trials waiting for their checks' hidden files.
    check_files: super::check_files::Requests,
    /// The egress connections carried over the protocol, when the bundle says so.
    tunnel: Option<Arc<crate::egress::Tunnel>>,
}

/// The worker's end of the egress tunnel (the bundle's `egress`), and the connector each
/// trial's forwarder opens connections through.
fn egress_tunnel(wire: &Wire) -> (Arc<crate::egress::Tunnel>, crate::egress::Connector) {
    use base64::Engine as _;
    let sending = wire.clone();
    let tunnel = crate::egress::Tunnel::new(Box::new(move |conn, bytes| {
        sending.send(&match bytes {
            Some(bytes) => WorkerMessage::EgressData {
                conn,
                data: base64::engine::general_purpose::STANDARD.encode(bytes),
            },
            None => WorkerMessage::EgressClose { conn },
        })
    }));
    let (opening, wire) = (tunnel.clone(), wire.clone());
    let connect: crate::egress::Connector = Arc::new(move || {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair()?;
        let conn = opening.next_conn();
        // Opened before its first bytes can go.
        wire.send(&WorkerMessage::EgressOpen { conn });
        opening.attach(conn, ours)?;
        Ok(theirs)
    });
    (tunnel, connect)
}

impl Worker {
    /// Reads the bundle, builds the clients, says `hello` (and `need-tokens` when a server
    /// needs one), and starts the stdin reader and the heartbeat.
    fn start(bundle_dir: &Path, results: &Path, wire: Wire) -> Result<Self> {
        let path = bundle_dir.join(BUNDLE_FILE);
        let bytes = crate::files::read_regular(&path, MAX_BUNDLE_BYTES, true)?;
        // Another version's bundle may be laid out otherwise: say so rather than how it differs.
        #[derive(serde::Deserialize)]
        struct MadeBy {
            mst: String,
        }
        let made_by = serde_json::from_slice::<MadeBy>(&bytes)
            .ok()
            .map(|made| made.mst);
        let ours = env!("CARGO_PKG_VERSION");
        if let Some(theirs) = made_by.filter(|theirs| theirs.as_str() != ours) {
            anyhow::bail!(
                "{} was made by mst {theirs}, and this worker is mst {ours}: a coordinator's \
                 bundles run on a worker of its own version",
                path.display()
            );
        }
        let bundle: Bundle = serde_json::from_slice(&bytes)
            .with_context(|| format!("{} is not a bundle", path.display()))?;
        drop(bytes);
        let queue = WorkReader::open(bundle_dir)?;
        let clients = match &bundle.grading {
            // A grade shard's judges are loaded once the worker said hello (below).
            Some(_) => Clients::new(),
            None => build_clients(&bundle, &BTreeMap::new())?,
        };
        std::fs::create_dir_all(results)
            .with_context(|| format!("cannot create {}", results.display()))?;
        // Beside `results/`, as the coordinator expects them (docs/protocol.md).
        let artifacts = bundle.artifacts.map(|limits| {
            ArtifactSlots::new(results.with_file_name(artifacts::MACHINE_DIR), limits)
        });
        let (events, inbox) = mpsc::channel::<Event>();
        let threads = super::threads::TrialThreads::new(bundle.concurrency.max(1) as usize);
        let tunnel = bundle.egress.then(|| egress_tunnel(&wire));
        let mut worker = Worker {
            queue,
            bundle,
            results: results.to_path_buf(),
            wire,
            clients,
            tokens_ready: true,
            token_values: BTreeMap::new(),
            expiring: BTreeMap::new(),
            renewal_asked: BTreeSet::new(),
            awaiting: Vec::new(),
            gateway: None,
            running: 0,
            counts: DoneCounts::default(),
            cancelled: false,
            broken: None,
            cancel_trials: Arc::new(AtomicBool::new(false)),
            events,
            inbox,
            stop_heartbeat: Arc::new(AtomicBool::new(false)),
            threads,
            rooms: Arc::new(TrialRooms::new(
                tunnel.as_ref().map(|(_, connect)| connect.clone()),
            )?),
            tunnel: tunnel.map(|(tunnel, _)| tunnel),
            artifacts: artifacts.map(Arc::new),
            workspaces: bundle_dir.join(super::bundle::WORKSPACES_DIR),
            check_files: Default::default(),
        };
        worker.hello();
        worker.listen();
        worker.heartbeat();
        // Compiling a grade shard's plugins takes a while: the heartbeat goes on meanwhile.
        if let Some(work) = &worker.bundle.grading {
            let grader = RemoteGrader::load(work, bundle_dir, MAX_BUNDLE_BYTES)?;
            let grade: Arc<dyn Client> = Arc::new(GradeClient(grader));
            let variants = worker.bundle.variants.keys();
            worker.clients = variants.map(|name| (name.clone(), grade.clone())).collect();
        }
        Ok(worker)
    }

    fn hello(&mut self) {
        let client_name = self
            .bundle
            .variants
            .values()
            .next()
            .map(|v| v.client.clone())
            .unwrap_or_default();
        self.wire.send(&WorkerMessage::Hello {
            protocol: PROTOCOL.to_string(),
            mst: env!("CARGO_PKG_VERSION").to_string(),
            image: std::env::var("MST_IMAGE_DIGEST").ok(),
            client: ClientIdentity {
                name: client_name,
                version: env!("CARGO_PKG_VERSION").to_string(),
            },
            shard: self.bundle.shard,
        });
        // Servers whose config names a token, and model providers' keys: the worker asks for
        // them before any trial; and a conversation's resume token, when one is held.
        let mut token_servers: BTreeSet<String> = self
            .bundle
            .variants
            .values()
            .flat_map(VariantSpec::token_names)
            .collect();
        if self
            .bundle
            .conversation
            .as_ref()
            .is_some_and(|turn| turn.resume)
        {
            token_servers.insert(client::RESUME_TOKEN.to_string());
        }
        if !token_servers.is_empty() {
            self.tokens_ready = false;
            self.wire.send(&WorkerMessage::NeedTokens {
                servers: token_servers.into_iter().collect(),
                reason: TokenReason::Start,
            });
        }
    }

    /// Reads the coordinator's messages from stdin, framed by [`protocol::read_messages`].
    fn listen(&self) {
        let events = self.events.clone();
        std::thread::spawn(move || {
            protocol::read_messages::<CoordinatorMessage>(std::io::stdin(), |message, _| {
                let event = match message {
                    Ok(message) => Event::FromCoordinator(message),
                    // The coordinator speaks this exact version: a bad line is a broken
                    // channel, said loudly (as `fatal`), not a silent cancel.
                    Err(e) => Event::CoordinatorBroke(e.to_string()),
                };
                let go_on = matches!(event, Event::FromCoordinator(_));
                events.send(event).is_ok() && go_on
            });
            let _ = events.send(Event::CoordinatorGone);
        });
    }

    fn heartbeat(&self) {
        let wire = self.wire.clone();
        let interval = Duration::from_millis(self.bundle.heartbeat_ms.max(50));
        let stop = self.stop_heartbeat.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                wire.send(&WorkerMessage::Heartbeat {
                    at: crate::clock::unix_millis(),
                });
                std::thread::sleep(interval);
            }
        });
    }

    /// Runs until every trial is done (or cancelled), then says `done`.
    fn run(mut self) -> Result<u8> {
        loop {
            self.ask_for_trials();
            if self.finished() {
                break;
            }
            self.ask_for_renewal();
            let event = match self.inbox.recv_timeout(TOKEN_CHECK) {
                Ok(event) => event,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    unreachable!("the worker holds a sender")
                }
            };
            match event {
                Event::FromCoordinator(CoordinatorMessage::Granted { key, gateway }) => {
                    self.on_granted(key, gateway)
                }
                Event::FromCoordinator(CoordinatorMessage::ModelReply { key, call, part }) => {
                    if let Some(gateway) = &self.gateway {
                        if let Err(why) = gateway.on_reply(key, call, part) {
                            self.cancel();
                            anyhow::bail!("the coordinator's model answer is unreadable: {why}");
                        }
                    }
                }
                Event::FromCoordinator(CoordinatorMessage::CheckFiles {
                    key,
                    check,
                    part,
                    error,
                }) => {
                    if let Err(why) = self.check_files.on_answer(key, check, part, error) {
                        self.cancel();
                        anyhow::bail!("the coordinator's check files are unreadable: {why}");
                    }
                }
                Event::FromCoordinator(CoordinatorMessage::EgressData { conn, data }) => {
                    use base64::Engine as _;
                    let engine = base64::engine::general_purpose::STANDARD;
                    let (Some(tunnel), Ok(bytes)) = (&self.tunnel, engine.decode(data)) else {
                        self.cancel();
                        anyhow::bail!("the coordinator sent egress bytes this worker cannot take");
                    };
                    tunnel.deliver(conn, Some(bytes));
                }
                Event::FromCoordinator(CoordinatorMessage::EgressClose { conn }) => {
                    if let Some(tunnel) = &self.tunnel {
                        tunnel.deliver(conn, None);
                    }
                }
                Event::FromCoordinator(CoordinatorMessage::Cancel { reason }) => {
                    eprintln!("mst collect: cancelled: {reason}");
                    self.cancel();
                }
                Event::FromCoordinator(CoordinatorMessage::Tokens { tokens }) => {
                    self.on_tokens(tokens)?
                }
                Event::CoordinatorGone => self.cancel(),
                Event::CoordinatorBroke(why) => {
                    self.cancel();
                    anyhow::bail!("the coordinator's input is unreadable: {why}");
                }
                Event::Finished(key, outcome) => self.on_finished(key, outcome),
            }
        }
        self.counts.skipped += (self.queue.left() + self.awaiting.len() as u64) as u32;
        self.stop_heartbeat.store(true, Ordering::Relaxed);
        // Every trial has reported; their jobs are ending. What they shared with the worker
        // is then the worker's alone to drop (see `TrialThreads::wait_idle`).
        self.threads.wait_idle(JOBS_END);
        let cleanup = self.clean_up();
        if let Some(error) = self.broken.take() {
            return Err(error);
        }
        self.wire.send(&WorkerMessage::Done {
            counts: self.counts,
            cleanup,
            peak_rss_bytes: peak_rss_bytes(),
        });
        Ok(0)
    }

    fn clean_up(&mut self) -> Cleanup {
        // Every trial has reported, and each gave its scratch directory back before it did.
        self.rooms.remove_idle()
    }

    /// Asks for new tokens (`need-tokens`, reason `expiring`) for those about to expire, once
    /// per token received.
    fn ask_for_renewal(&mut self) {
        let now = crate::clock::unix_millis();
        let due: Vec<String> = self
            .expiring
            .iter()
            .filter(|(server, (expires, since))| {
                !self.renewal_asked.contains(*server)
                    && super::tokens::renewal_due(*expires, *since, now)
            })
            .map(|(server, _)| server.clone())
            .collect();
        if due.is_empty() || self.cancelled {
            return;
        }
        self.renewal_asked.extend(due.iter().cloned());
        self.wire.send(&WorkerMessage::NeedTokens {
            servers: due,
            reason: TokenReason::Expiring,
        });
    }

    /// Sends `acquire` for queued trials while there is room under the concurrency. A work
    /// file that cannot be read on stops the shard: the trials running are cancelled and
    /// report, and the worker then ends `fatal` ([`Self::run`]).
    fn ask_for_trials(&mut self) {
        let concurrency = self.bundle.concurrency.max(1) as usize;
        while self.tokens_ready
            && !self.cancelled
            && self.running + self.awaiting.len() < concurrency
        {
            let next = match self.queue.next_trial() {
                Ok(next) => next,
                Err(error) => {
                    self.broken = Some(error);
                    self.cancel();
                    break;
                }
            };
            let Some((key, case)) = next else {
                break;
            };
            let variant = self.bundle.variants.get(&*key.variant);
            self.wire.send(&WorkerMessage::Acquire {
                key: key.clone(),
                servers: variant.map(VariantSpec::server_labels).unwrap_or_default(),
            });
            self.awaiting.push((key, case));
        }
    }

    /// Nothing runs and nothing more will: every trial ended, or the shard was cancelled.
    fn finished(&self) -> bool {
        let stopping = self.cancelled;
        self.running == 0
            && (self.awaiting.is_empty() || stopping)
            && (self.queue.left() == 0 || stopping)
            && (self.tokens_ready || stopping)
    }

    fn cancel(&mut self) {
        self.cancelled = true;
        self.cancel_trials.store(true, Ordering::Relaxed);
    }

    /// Starts a granted trial on a trial thread.
    fn on_granted(&mut self, key: TrialKey, gateway_token: Option<Secret>) {
        let Some(index) = self.awaiting.iter().position(|(k, _)| k == &key) else {
            return;
        };
        let gateway = match gateway_token
            .map(|token| self.admit(&key, token))
            .transpose()
        {
            Ok(gateway) => gateway,
            Err(e) => {
                let error = format!("cannot start the model gateway: {e:#}");
                self.awaiting.remove(index);
                self.running += 1;
                let _ = self.events.send(Event::Finished(key, Err(error)));
                return;
            }
        };
        let (_, case) = self.awaiting.remove(index);
        if self.cancelled {
            return;
        }
        self.running += 1;
        let events = self.events.clone();
        let Some(client) = self.clients.get(&*key.variant).cloned() else {
            let error = format!("the bundle has no variant `{}`", key.variant);
            let _ = events.send(Event::Finished(key, Err(error)));
            return;
        };
        let timeout = Duration::from_millis(self.bundle.timeout_ms);
        let results = self.results.clone();
        let workdir = self.bundle.workdir.clone();
        let cancel = self.cancel_trials.clone();
        let link = TrialLink {
            key: key.clone(),
            wire: self.wire.clone(),
            sent: Mutex::new(Some(0)),
            resume: Mutex::new(None),
            check_files: self.check_files.clone(),
        };
        let conversation = self.bundle.conversation.is_some();
        let history = self
            .bundle
            .conversation
            .as_ref()
            .map(|turn| turn.history.clone())
            .unwrap_or_default();
        let token_budget = self.bundle.token_budget;
        let rooms = self.rooms.clone();
        let artifacts = self.artifacts.clone();
        // The case's own, or its variant's; most evals have none, and an empty list costs
        // no allocation.
        let checks = match self.bundle.case_checks.get(&*key.case) {
            Some(checks) => checks.clone(),
            None => (self.bundle.variants.get(&*key.variant))
                .map(|variant| variant.checks.clone())
                .unwrap_or_default(),
        };
        let workspace = (self.bundle.workspaces.of(&key.variant, &key.case))
            .map(|digest| self.workspaces.join(crate::workspace::archive_name(digest)));
        self.threads.run(move || {
            let setting = TrialSetting {
                workspace: workspace.as_deref(),
                results: &results,
                workdir: workdir.as_deref(),
                conversation,
                history: &history,
                token_budget,
                rooms: &rooms,
                artifacts: artifacts.as_deref(),
                checks: &checks,
                gateway,
            };
            let outcome = run_trial(
                client.as_ref(),
                &case,
                &key,
                timeout,
                &setting,
                &cancel,
                &link,
            );
            // Before the trial's `trial`, while the coordinator still counts it running.
            if let Some(token) = link.resume.lock().expect("resume lock").take() {
                link.wire.send(&WorkerMessage::ResumeToken {
                    key: key.clone(),
                    token,
                });
            }
            let _ = events.send(Event::Finished(key, outcome));
        });
    }

    /// Lets `key`'s trial call models with `token` through the gateway, started on first use.
    fn admit(&mut self, key: &TrialKey, token: Secret) -> Result<client::GatewayAccess> {
        crate::secrets::hold("gateway token", &token);
        if self.gateway.is_none() {
            let wire = self.wire.clone();
            let send: super::gateway::Send = Arc::new(move |message| wire.send(message));
            self.gateway = Some(super::gateway::Gateway::start(send)?);
        }
        let budget = self.bundle.token_budget;
        Ok(self
            .gateway
            .as_ref()
            .expect("started")
            .admit(key, token, budget))
    }

    /// Tokens live in the worker's memory only: each client is built with its own variant's,
    /// and hands each process it starts only what that process is given (its environment,
    /// its headers). No token ever rests in a file an agent could read.
    fn on_tokens(&mut self, tokens: BTreeMap<String, Token>) -> Result<()> {
        // Renewed tokens join the ones held; clients are rebuilt with them all.
        let mut values = self.token_values.clone();
        let now = crate::clock::unix_millis();
        for (server, token) in tokens {
            crate::secrets::hold(&self.token_name(&server), &token.value);
            self.renewal_asked.remove(&server);
            match token.expires_at {
                Some(expires) => self.expiring.insert(server.clone(), (expires, now)),
                None => self.expiring.remove(&server),
            };
            values.insert(server, token.value);
        }
        self.token_values = values.clone();
        // A grade shard's judges take no tokens: its client stays.
        if self.bundle.grading.is_none() {
            self.clients = build_clients(&self.bundle, &values)?;
        }
        self.tokens_ready = true;
        Ok(())
    }

    /// The name of the secret behind `server`'s token, as the config gives it (what a
    /// redaction says in its place).
    fn token_name(&self, server: &str) -> String {
        self.bundle
            .variants
            .values()
            .find_map(|v| match v.servers.get(server) {
                Some(ServerConfig::Http(http)) => http.token.clone(),
                _ => v
                    .provider
                    .as_ref()
                    .filter(|_| v.token_names().iter().any(|t| t == server))
                    .map(|p| p.key.clone()),
            })
            .or_else(|| crate::secrets::secret_of_token(server).map(str::to_string))
            .or_else(|| (server == client::RESUME_TOKEN).then(|| "resume token".to_string()))
            .unwrap_or_else(|| format!("token of {server}"))
    }

    /// Reports a finished trial to the coordinator.
    fn on_finished(&mut self, key: TrialKey, outcome: Result<Option<Finished>, String>) {
        self.running -= 1;
        if let Some(gateway) = &self.gateway {
            gateway.dismiss(&key);
        }
        let line = match outcome {
            Ok(None) => {
                self.counts.skipped += 1;
                return;
            }
            Ok(Some(Finished {
                status: TrialStatus::Infra,
                line,
            })) => {
                self.counts.infra += 1;
                line
            }
            Ok(Some(Finished { line, .. })) => {
                self.counts.collected += 1;
                line
            }
            Err(error) => {
                self.counts.infra += 1;
                redacted_line(&trial_message(
                    &key,
                    Collected::Infra,
                    Some(error),
                    None,
                    Vec::new(),
                ))
            }
        };
        self.wire.send_line(&line);
    }
}

/// This process's peak resident memory so far, in bytes: `VmHWM` of `/proc/self/status`
/// (Linux); `None` where that is not known. Not `getrusage`, whose peak carries over `execve`
/// from the memory the process was started from: a worker spawned by a coordinator would
/// report the coordinator's peak.
fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))?;
    let kilobytes: u64 = line.trim().strip_suffix("kB")?.trim().parse().ok()?;
    Some(kilobytes.saturating_mul(1024))
}

/// One client per variant of `bundle`, with `tokens` for the servers that need them.
fn build_clients(bundle: &Bundle, tokens: &BTreeMap<String, Secret>) -> Result<Clients> {
    bundle
        .variants
        .iter()
        .map(|(name, spec)| {
            let client =
                client::client(spec, tokens).with_context(|| format!("variant `{name}`"))?;
            Ok((name.clone(), Arc::from(client)))
        })
        .collect()
}

/// A grade shard's client (`grade`, what its bundle's variants name): each trial is a stored
/// trial whose judges run here, its answer their calls ([`RemoteGrader::answer`]) as the trace's
/// final text, their model calls made through the machine's gateway; one that cannot be graded
/// here is `infra`, with why in its log. The trace is
/// recorded here, where clients and grading meet: grading is the lower layer.
struct GradeClient(RemoteGrader);

impl Client for GradeClient {
    fn name(&self) -> &'static str {
        "grade"
    }

    fn run(&self, input: &TrialInput<'_>) -> TraceRecord {
        let mut recorder = Recorder::new(input, std::time::Instant::now());
        let key = TrialKey::new(input.variant, input.case.id.clone(), input.trial);
        // Judges granted a model provider call it through the gateway, with the trial's token.
        let models = input.gateway.map(|gateway| {
            Arc::new(crate::llm::ModelAccess::through_gateway(
                &gateway.url,
                &gateway.token,
            ))
        });
        match self.0.answer(&key, models.as_ref()) {
            Ok(answer) => recorder.finish(TrialStatus::Completed, Some(answer), Some(0)),
            Err(text) => {
                recorder.push(EventKind::Log { text });
                recorder.finish(TrialStatus::Infra, None, None)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_peak_memory_reported_is_this_process_own() {
        let before = peak_rss_bytes().unwrap();
        // 64 MiB touched: the peak grows by about that much, and no more than the process has.
        let touched = vec![1u8; 64 << 20];
        let after = peak_rss_bytes().unwrap();
        assert!(after >= before && after >= 64 << 20, "{before} → {after}");
        assert!(touched.iter().all(|&b| b == 1));
    }

    #[test]
    fn a_scratch_directory_is_handed_on_empty_and_never_through_a_link() {
        let results = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keep"), "not the trial's").unwrap();
        let dirs = ScratchDirs::new("mst-trial-");
        let first = dirs.take(results.path()).unwrap();
        let path = first.path().to_path_buf();
        // What a client leaves: files, a tree, and a link out of the directory.
        std::fs::write(path.join("answer.txt"), "42").unwrap();
        std::fs::create_dir_all(path.join("a/b")).unwrap();
        std::fs::write(path.join("a/b/c"), "deep").unwrap();
        std::os::unix::fs::symlink(outside.path(), path.join("a/out")).unwrap();
        std::os::unix::fs::symlink(outside.path(), path.join("out")).unwrap();
        dirs.give_back(first);
        let again = dirs.take(results.path()).unwrap();
        assert_eq!(
            again.path(),
            path,
            "the emptied directory serves the next trial"
        );
        assert_eq!(std::fs::read_dir(&path).unwrap().count(), 0);
        assert!(outside.path().join("keep").is_file(), "a link was followed");
        // A directory the client swapped for a link is not handed on; a new one is made.
        drop(std::fs::remove_dir(&path));
        std::os::unix::fs::symlink(outside.path(), &path).unwrap();
        dirs.give_back(again);
        let fresh = dirs.take(results.path()).unwrap();
        assert_ne!(fresh.path(), path);
        assert!(outside.path().join("keep").is_file());
        let _ = std::fs::remove_file(&path);
        // As the worker ends, the idle directories go, while the pool itself may still have
        // another owner (a trial thread finishing its job).
        let fresh_path = fresh.path().to_path_buf();
        dirs.give_back(fresh);
        assert_eq!(dirs.remove_idle(), Cleanup::Ok);
        assert!(!fresh_path.exists(), "{}", fresh_path.display());
    }

    #[test]
    fn a_failed_clean_up_is_reported_as_failed() {
        let results = tempfile::tempdir().unwrap();
        let dirs = ScratchDirs::new("mst-trial-");
        let used = dirs.take(results.path()).unwrap();
        std::fs::write(used.path().join("left"), "by the trial").unwrap();
        dirs.give_back(used);
        assert_eq!(dirs.remove_idle(), Cleanup::Ok);
        // Something on the machine swapped an idle directory for a file: removing it fails.
        let dir = dirs.take(results.path()).unwrap();
        let path = dir.path().to_path_buf();
        dirs.give_back(dir);
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "not a directory").unwrap();
        assert_eq!(dirs.remove_idle(), Cleanup::Failed);
        let _ = std::fs::remove_file(&path);
    }
}
