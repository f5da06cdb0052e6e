//! The coordinator's side of one shard, as a state machine ([`ShardSession`]): stage the
//! bundle on the machine, start the worker, check its version at `hello`, grant trials within
//! the limits, copy each trace back as soon as its `trial` message arrives, and decide how the
//! shard ended. One typed stream of inputs (worker messages, bad lines, end of output) drives
//! small methods, one per protocol event; what happens is told as [`ShardEvent`]s.
//!
//! Everything the worker says is treated as hostile: paths are recomputed here, traces are
//! copied with the safe reader and validated before they count, and a trace that fails the
//! checks is replaced by the coordinator's own infra record.

use super::artifacts::{ArtifactCopier, ArtifactFile, ArtifactTally};
use super::bundle::{Bundle, FoundTrials, ShardTrials, BUNDLE_FILE};
use super::limits::{Holder, Limiter};
use super::model_calls::{Answered, CallJob, Caller, ModelCalls, OnPart};
use super::protocol::{
    self, Cleanup, ClientIdentity, Collected, CoordinatorMessage, ModelAnswer, ModelPart, Token,
    WorkerMessage, PROTOCOL,
};
use super::tokens::{renewal_due, ServerTokens};
use crate::eval::config::VariantSpec;
use crate::eval::trial::{CaseIndex, CollectedBy, TraceEvent, TrialKey, TrialRecord, TrialStatus};
use crate::results::{trace_path, RunDir};
use crate::runner::channel::{Channel, KeptMachine, Refused};
use fixedbitset::FixedBitSet;
use serde::Serialize;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// Timing and size rules for a shard.
#[derive(Debug, Clone, Copy)]
pub struct ShardSettings {
    /// No message for this long means the channel is gone.
    pub silence: Duration,
    /// After `cancel`, how long the worker has to finish before it is killed.
    pub cancel_grace: Duration,
    /// The largest trace copied back.
    pub max_trace_bytes: u64,
    /// The largest worker log kept.
    pub max_log_bytes: u64,
    /// The most one shard copies back; the trace that crosses it is dropped and the shard
    /// stops (a batch of copies may overshoot by at most that batch).
    pub max_shard_copy_bytes: u64,
    /// The most all shards of a run copy back together.
    pub max_run_copy_bytes: u64,
}

impl Default for ShardSettings {
    fn default() -> Self {
        ShardSettings {
            silence: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
            max_trace_bytes: 64 * 1024 * 1024,
            max_log_bytes: 1024 * 1024,
            max_shard_copy_bytes: 4 << 30,
            max_run_copy_bytes: 16 << 30,
        }
    }
}

impl ShardSettings {
    /// How often workers send `heartbeat`: often enough that four fit in the silence limit.
    pub fn heartbeat_ms(&self) -> u64 {
        (self.silence.as_millis() as u64 / 4).clamp(50, 5_000)
    }
}

/// How a shard ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "kebab-case")]
pub enum ShardEnd {
    /// The worker sent `done`.
    Done,
    /// The worker sent `done` but its clean-up failed.
    DoneCleanupFailed,
    /// Refused at `hello`.
    VersionMismatch(String),
    /// The machine or channel failed, or the worker broke the protocol.
    Lost(String),
    /// Stopped by the user.
    Cancelled,
}

impl std::fmt::Display for ShardEnd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardEnd::Done => f.write_str("done"),
            ShardEnd::DoneCleanupFailed => f.write_str("done, but its clean-up failed"),
            ShardEnd::VersionMismatch(why) => write!(f, "refused at hello: {why}"),
            ShardEnd::Lost(why) => write!(f, "lost: {why}"),
            ShardEnd::Cancelled => f.write_str("cancelled"),
        }
    }
}

/// What the worker said about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct WorkerIdentity {
    pub mst: String,
    pub client: ClientIdentity,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
}

/// The result of one shard.
#[derive(Debug, Clone, Serialize)]
pub struct ShardReport {
    pub shard: u32,
    pub machine: String,
    pub ended: ShardEnd,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker: Option<WorkerIdentity>,
    /// Trials whose trace was copied back and validated, by position in the bundle's
    /// `trials`: one bit a trial, for as long as the run keeps the report.
    #[serde(skip)]
    pub collected: FixedBitSet,
    /// Where a kept machine is, and how to get into it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<KeptMachine>,
    /// Trials that failed on the machine ([`TraceRecord::failure`]: timed out, infra, a
    /// non-zero exit): `keep=failed` keeps a machine with any.
    #[serde(rename = "failedTrials", skip_serializing_if = "is_zero")]
    pub failed_trials: u32,
    /// What came back of the trials' artefacts.
    #[serde(skip_serializing_if = "ArtifactTally::is_empty")]
    pub artifacts: ArtifactTally,
    /// What the runner says about the machine (host, image, …).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub placement: serde_json::Value,
    /// When the worker's `hello` arrived.
    #[serde(skip)]
    pub hello_at: Option<Instant>,
    /// Milliseconds the shard waited for room on the runner's hosts before its machine was
    /// started (0 for runners that never wait).
    #[serde(rename = "waitMs", skip_serializing_if = "Option::is_none")]
    pub wait_ms: Option<u64>,
    /// Milliseconds from the runner starting the machine (after any wait for room) to the
    /// worker's `hello`.
    #[serde(rename = "readyMs", skip_serializing_if = "Option::is_none")]
    pub ready_ms: Option<u64>,
    /// Milliseconds the runner took to make the machine (after any wait for room).
    #[serde(rename = "createMs", skip_serializing_if = "Option::is_none")]
    pub create_ms: Option<u64>,
    /// Milliseconds disposing of the machine took.
    #[serde(rename = "disposeMs", skip_serializing_if = "Option::is_none")]
    pub dispose_ms: Option<u64>,
    /// Why disposing of the machine failed, if it did.
    #[serde(rename = "disposeError", skip_serializing_if = "Option::is_none")]
    pub dispose_error: Option<String>,
    /// The worker's peak resident memory in bytes, as its `done` said (the machine's word).
    #[serde(rename = "workerPeakRssBytes", skip_serializing_if = "Option::is_none")]
    pub worker_peak_rss_bytes: Option<u64>,
}

impl ShardReport {
    /// A report for shard `shard` on `machine` that has not run anything yet.
    pub fn new(shard: u32, machine: String) -> Self {
        ShardReport {
            shard,
            machine,
            ended: ShardEnd::Done,
            worker: None,
            collected: FixedBitSet::new(),
            kept: None,
            failed_trials: 0,
            artifacts: ArtifactTally::default(),
            placement: serde_json::Value::Null,
            hello_at: None,
            wait_ms: None,
            ready_ms: None,
            create_ms: None,
            dispose_ms: None,
            dispose_error: None,
            worker_peak_rss_bytes: None,
        }
    }
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// What happens in a shard, for progress output and the run's reporters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardEvent {
    /// A running trial's trace event `seq`, as the worker streamed it (checked: the trial
    /// runs, `seq` is its next, within the caps; redacted like the trace file). `event` is
    /// `None` for an event too large to stream: the trace, once copied back, holds it. The
    /// events of a trial come in order, from 0 without gaps, and are the trace's events (a
    /// prefix of them when the trial passed its stream cap).
    TraceEvent {
        shard: u32,
        key: TrialKey,
        seq: u64,
        event: Option<TraceEvent>,
    },
    /// A trial's trace was copied back and validated.
    TrialCollected { shard: u32, key: TrialKey },
    /// A trial ended as an infrastructure failure (the worker said so, or its trace was
    /// refused), with the reason.
    TrialInfra {
        shard: u32,
        key: TrialKey,
        reason: String,
    },
    /// A trial's trace failed the coordinator's checks; it counts as infra.
    TraceRefused {
        shard: u32,
        key: TrialKey,
        why: String,
    },
    /// A trial's trace could not be copied back (the channel failed on the way); the trial
    /// stays missing, for `--resume`.
    TraceNotCopied {
        shard: u32,
        key: TrialKey,
        why: String,
    },
    /// The worker asked for a token no secret provides.
    NoToken { shard: u32, server: String },
    /// A file a trial left as an artefact did not come back (refused, over a cap, lost on
    /// the way); the trial's outcome does not change.
    ArtifactSkipped {
        shard: u32,
        key: TrialKey,
        why: String,
    },
    /// A conversation turn's client captured a resume token (checked: a conversation bundle,
    /// the trial runs, the size cap). The value is held for redaction; keep it in memory only.
    ResumeToken {
        shard: u32,
        key: TrialKey,
        token: crate::secrets::Secret,
    },
    /// The worker called a trial infra (`claim`), but the trace it wrote says the client ran:
    /// the trace counts, and the claim is told.
    InfraClaimOverruled {
        shard: u32,
        key: TrialKey,
        claim: String,
    },
}

/// What every shard of a run shares: limits, tokens, timing rules, where events go, and the
/// run's cancel flag.
pub struct ShardContext<'a> {
    pub limiter: &'a Limiter,
    /// The run's cases as the coordinator holds them: a trace's case is checked against its
    /// input and replaced by it, so graders never see the machine's copy.
    pub cases: &'a CaseIndex<'a>,
    /// MCP access tokens by server label: sent when a worker asks, renewed unasked.
    pub tokens: &'a ServerTokens,
    pub settings: ShardSettings,
    pub events: &'a (dyn Fn(ShardEvent) + Sync),
    pub cancel: &'a AtomicBool,
    /// A conversation's held resume token, handed to a worker whose bundle says
    /// `conversation.resume` when it asks for [`crate::client::RESUME_TOKEN`].
    pub resume: Option<&'a crate::secrets::Secret>,
    /// Bytes copied back by all shards so far, against `settings.max_run_copy_bytes`.
    pub copied: &'a AtomicU64,
    /// Where the trials' artefacts go and their caps; `None` when the bundle keeps none (a
    /// worker that lists some anyway breaks the protocol).
    pub artifacts: Option<&'a ArtifactCopier<'a>>,
    /// Hears each trace the moment it is stored, as stored (e.g. to grade it while collection
    /// goes on).
    pub stored: Option<&'a StoredTrace<'a>>,
    /// The run's model providers and their keys, for the model calls agents make through the
    /// machines' gateways; `None` answers every such call with an error.
    pub models: Option<&'a Arc<crate::llm::ModelAccess>>,
    /// The checks' hidden files, handed out when a worker asks for a running trial's; `None`
    /// answers every such ask with an error.
    pub check_files: Option<&'a super::check_files::CheckFiles>,
    /// The hosts trials may reach, when the runner allows egress by name over the protocol
    /// (the bundle's `egress`); each session decides its connections with a gate of its own.
    pub egress: Option<&'a crate::egress::Allowed>,
}

/// Hears a trial's trace as the run directory holds it; called from the shards' threads.
pub type StoredTrace<'a> = dyn Fn(&TrialKey, TrialRecord) + Sync + 'a;

/// One input to the session: the worker's output, framed and decoded by
/// [`protocol::read_messages`] on a reader thread.
enum Input {
    /// A message, and the length of its line.
    Message(WorkerMessage, usize),
    Bad(String),
    Eof,
    /// A model call made for the worker's gateway came back.
    Answered(Box<Answered>),
}

/// A trial the worker wants to start, waiting for room for its MCP servers.
struct WaitingAcquire {
    key: TrialKey,
    servers: Vec<String>,
}

/// Why a trace did not count as it came back.
enum CopyFailure {
    /// What arrived is not an acceptable trace (a link, a FIFO, oversize, not a trace, another
    /// trial's): the machine's doing, so the trial is infra.
    Refused(String),
    /// Nothing usable arrived (the channel failed on the way): the trial stays missing.
    NotCopied(String),
}

/// A trial whose trace is still on the machine.
struct PendingCopy {
    key: TrialKey,
    status: Collected,
    error: Option<String>,
    since: Instant,
}

/// At most this many traces wait to be copied back in one batch.
const COPY_BATCH: usize = 64;
/// And none waits longer than this.
const COPY_DELAY: Duration = Duration::from_millis(500);

/// How often the session looks at its clocks (silence, cancel grace, copy batches) when the
/// worker is quiet.
const TICK: Duration = Duration::from_millis(25);

/// How far one of a shard's trials got.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// The worker asked room for it (each trial once).
    acquired: bool,
    /// The worker reported it ended (each trial once).
    reported: bool,
}

/// The coordinator's side of one shard. A session runs one bundle on one channel; a long-lived
/// machine runs bundle after bundle by starting a new session on the same channel.
pub struct ShardSession<'a> {
    context: &'a ShardContext<'a>,
    bundle: &'a Bundle,
    /// The bundle's trials (its own list, or positions in the run's plan), found by key.
    trials: FoundTrials<'a>,
    run_dir: &'a RunDir,
    report: ShardReport,
    /// How far each of the bundle's trials got, by its position in the bundle: two flags a
    /// trial rather than two sets of keys.
    progress: Vec<Progress>,
    waiting: Vec<WaitingAcquire>,
    /// What each trial has streamed so far.
    streams: Streams,
    hello_seen: bool,
    last_heard: Instant,
    cancel_sent: Option<Instant>,
    /// The worker's `done`, and when it came.
    done: Option<(Cleanup, Instant)>,
    /// Traces waiting to be copied back; runners whose copies are costly take them in batches.
    copies: Vec<PendingCopy>,
    /// Trials whose artefacts wait to be copied back, with what the worker listed.
    artifact_copies: Vec<(TrialKey, Vec<ArtifactFile>)>,
    /// Trials that failed on the machine, counted as their traces are accepted.
    failed_trials: std::cell::Cell<u32>,
    batched: bool,
    /// The tokens the worker holds, with when each was sent (for renewal).
    sent_tokens: BTreeMap<String, (Token, u64)>,
    /// When the tokens were last looked at for renewal.
    tokens_checked: Instant,
    /// Bytes this shard copied back.
    copied: u64,
    /// Set when a copy cap was crossed: why the shard stops.
    over_cap: Option<String>,
    /// Lines for the worker's stdin, written by a thread of their own: a worker that stops
    /// reading blocks that thread, never the loop that enforces silence, cancel and grace.
    stdin: Option<mpsc::Sender<String>>,
    /// The model calls agents make through the worker's gateway.
    model_calls: ModelCalls,
    /// Where a model call's thread answers: the session's own inputs.
    inputs: Option<mpsc::Sender<Input>>,
    /// The egress connections its worker opened over the protocol, once it opened one, and
    /// the gate that decides them.
    egress: Option<(Arc<crate::egress::Tunnel>, crate::egress::EgressGate)>,
}

impl<'a> ShardSession<'a> {
    /// A session for `bundle`, collecting `trials`, whose traces land in `run_dir`.
    pub fn new(
        context: &'a ShardContext<'a>,
        bundle: &'a Bundle,
        trials: ShardTrials<'a>,
        run_dir: &'a RunDir,
    ) -> Self {
        ShardSession {
            context,
            bundle,
            trials: FoundTrials::new(trials),
            run_dir,
            report: ShardReport {
                collected: FixedBitSet::with_capacity(trials.len()),
                ..ShardReport::new(bundle.shard, String::new())
            },
            progress: vec![Progress::default(); trials.len()],
            waiting: Vec::new(),
            streams: Streams::default(),
            hello_seen: false,
            last_heard: Instant::now(),
            cancel_sent: None,
            done: None,
            copies: Vec::new(),
            artifact_copies: Vec::new(),
            failed_trials: std::cell::Cell::new(0),
            batched: false,
            sent_tokens: BTreeMap::new(),
            tokens_checked: Instant::now(),
            copied: 0,
            over_cap: None,
            stdin: None,
            model_calls: ModelCalls::default(),
            inputs: None,
            egress: None,
        }
    }

    /// Runs the shard on `channel`: copies the bundle (staged locally in `bundle_dir`), starts
    /// the worker, speaks the protocol until the shard ends, and says how it went.
    pub fn run(mut self, channel: &mut dyn Channel, bundle_dir: &Path) -> ShardReport {
        self.report.machine = channel.describe();
        self.report.placement = channel.provenance();
        self.batched = channel.batch_copies();
        let mut process = match self.start_worker(channel, bundle_dir) {
            Ok(process) => process,
            Err(ended) => {
                self.report.ended = ended;
                return self.report;
            }
        };
        // The worker's stderr goes to a capped log next to the run's results.
        let log = crate::process::CappedReader::spawn(
            std::mem::replace(&mut process.stderr, Box::new(std::io::empty())),
            self.context.settings.max_log_bytes,
        );
        let (to_inputs, inputs) = mpsc::channel();
        spawn_reader(
            std::mem::replace(&mut process.stdout, Box::new(std::io::empty())),
            to_inputs.clone(),
        );
        self.inputs = Some(to_inputs);
        self.stdin = Some(spawn_writer(std::mem::replace(
            &mut process.stdin,
            Box::new(std::io::sink()),
        )));
        let ended = self.drive(channel, &inputs);
        self.inputs = None;
        // The writer ends when its queue closes (or, blocked on a worker that stopped reading,
        // when the worker is killed below and the pipe breaks).
        self.stdin = None;
        // What is still waiting is copied now.
        self.copy_back(channel);
        self.copy_artifacts(channel);
        self.report.failed_trials = self.failed_trials.get();
        // A finished worker's process ends by itself; one that lingers (a command channel's
        // program that does not exit with it) is stopped after the grace period.
        let finished = matches!(ended, ShardEnd::Done | ShardEnd::DoneCleanupFailed);
        let grace = self.context.settings.cancel_grace;
        if !finished || process.handle.wait_timeout(grace).is_none() {
            process.handle.kill();
        }
        process.handle.wait();
        // Bounded: a process that left the worker's group may hold its stderr open.
        let log = log.finish_within(grace);
        let _ = self.run_dir.write_worker_log(self.bundle.shard, &log);
        self.context.limiter.release_shard(self.bundle.shard);
        self.report.ended = ended;
        self.report
    }

    /// Copies the bundle to the machine and starts `mst collect` there.
    fn start_worker(
        &self,
        channel: &mut dyn Channel,
        bundle_dir: &Path,
    ) -> Result<crate::runner::channel::Process, ShardEnd> {
        debug_assert!(bundle_dir.join(BUNDLE_FILE).is_file());
        let machine = &self.report.machine;
        channel
            .put(bundle_dir, "bundle")
            .map_err(|e| ShardEnd::Lost(format!("cannot copy the bundle to {machine}: {e:#}")))?;
        let argv: Vec<String> = [
            "mst",
            "collect",
            "--bundle",
            "{workdir}/bundle",
            "--results",
            "{workdir}/results",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        channel
            .exec(&argv)
            .map_err(|e| ShardEnd::Lost(format!("cannot start the worker on {machine}: {e:#}")))
    }

    /// The session's loop: clocks first, then the next input, until the shard ends.
    fn drive(&mut self, channel: &mut dyn Channel, inputs: &mpsc::Receiver<Input>) -> ShardEnd {
        loop {
            if let Some(ended) = self.on_tick(channel) {
                return ended;
            }
            let input = match inputs.recv_timeout(TICK) {
                Ok(input) => input,
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => Input::Eof,
            };
            self.last_heard = Instant::now();
            let ended = match input {
                Input::Message(message, line_bytes) => self.on_message(message, line_bytes),
                Input::Bad(why) => Some(ShardEnd::Lost(format!(
                    "the worker broke {PROTOCOL}: {why}"
                ))),
                Input::Eof => Some(self.on_eof()),
                Input::Answered(answered) => {
                    self.on_answered(*answered);
                    None
                }
            };
            if let Some(ended) = ended {
                return ended;
            }
        }
    }

    /// Queues `message` for the worker's stdin; never blocks.
    fn send(&mut self, message: &CoordinatorMessage) {
        if let Some(stdin) = &self.stdin {
            let _ = stdin.send(protocol::encode(message));
        }
    }

    /// What the clocks say: cancel, the cancel grace, silence, copies due, acquisitions that
    /// now fit the limits.
    fn on_tick(&mut self, channel: &mut dyn Channel) -> Option<ShardEnd> {
        if self.context.cancel.load(Ordering::Relaxed) && self.cancel_sent.is_none() {
            self.send(&CoordinatorMessage::Cancel {
                reason: "interrupted by the user".into(),
            });
            self.cancel_sent = Some(Instant::now());
        }
        if let Some(why) = &self.over_cap {
            return Some(ShardEnd::Lost(why.clone()));
        }
        let settings = self.context.settings;
        if self
            .cancel_sent
            .is_some_and(|at| at.elapsed() > settings.cancel_grace)
        {
            return Some(ShardEnd::Cancelled);
        }
        // After `done`, output ends with the worker; a process it left behind (outside its
        // group) may hold the pipe open, so the end is not waited for past the grace.
        if self
            .done
            .is_some_and(|(_, at)| at.elapsed() > settings.cancel_grace)
        {
            return Some(self.on_eof());
        }
        if self.last_heard.elapsed() > settings.silence {
            return Some(ShardEnd::Lost(format!(
                "the worker on {} sent nothing for {}s; the channel is gone",
                self.report.machine,
                settings.silence.as_secs()
            )));
        }
        // Copy back what is due: everything at once, or a batch when full or old enough.
        let batched = self.batched;
        if self.copies.first().is_some_and(|c| {
            !batched || self.copies.len() >= COPY_BATCH || c.since.elapsed() > COPY_DELAY
        }) {
            self.copy_back(channel);
        }
        self.copy_artifacts(channel);
        self.grant_waiting();
        self.renew_tokens();
        None
    }

    /// Grants the waiting acquisitions that fit the limits now, in the order they came.
    fn grant_waiting(&mut self) {
        let waiting = std::mem::take(&mut self.waiting);
        for acquire in waiting {
            let holder = Holder::Trial {
                shard: self.bundle.shard,
                key: acquire.key.clone(),
            };
            if !self
                .context
                .limiter
                .try_acquire(&holder, &[], &acquire.servers)
            {
                self.waiting.push(acquire);
                continue;
            }
            let key = acquire.key;
            // A grade shard's judges call models through the gateway when they may.
            let uses_gateway = match &self.bundle.grading {
                Some(work) => work.calls_models(),
                None => {
                    (self.bundle.variants.get(&*key.variant)).is_some_and(VariantSpec::uses_gateway)
                }
            };
            let gateway = uses_gateway.then(|| self.model_calls.mint(&key));
            self.send(&CoordinatorMessage::Granted { key, gateway })
        }
    }

    fn on_message(&mut self, message: WorkerMessage, line_bytes: usize) -> Option<ShardEnd> {
        match message {
            WorkerMessage::Hello {
                protocol,
                mst,
                image,
                client,
                shard,
            } => self.on_hello(protocol, mst, image, client, shard),
            _ if !self.hello_seen => Some(ShardEnd::Lost(format!(
                "the worker spoke before `hello` ({PROTOCOL} requires it first)"
            ))),
            WorkerMessage::Heartbeat { .. } => None,
            WorkerMessage::NeedTokens { servers, .. } => self.on_need_tokens(&servers),
            WorkerMessage::Acquire { key, .. } => self.on_acquire(self.planned_key(key)),
            WorkerMessage::ModelCall {
                key,
                call,
                token,
                part,
            } => self.on_model_call(key, call, &token, part),
            WorkerMessage::Trial {
                key,
                status,
                error,
                trace,
                artifacts,
                ..
            } => self.on_artifacts(&key, artifacts).or_else(|| {
                self.on_trial(
                    self.planned_key(key),
                    status,
                    error,
                    trace.map(|t| (t, line_bytes as u64)),
                )
            }),
            WorkerMessage::Event { .. } => self.on_event(message, line_bytes as u64),
            WorkerMessage::ResumeToken { key, token } => self.on_resume_token(key, token),
            WorkerMessage::CheckFiles { key, check } => {
                self.on_check_files(self.planned_key(key), check)
            }
            WorkerMessage::EgressOpen { conn } => self.on_egress_open(conn),
            WorkerMessage::EgressData { conn, data } => self.on_egress_data(conn, Some(data)),
            WorkerMessage::EgressClose { conn } => self.on_egress_data(conn, None),
            WorkerMessage::Done {
                cleanup,
                peak_rss_bytes,
                ..
            } => {
                self.report.worker_peak_rss_bytes = peak_rss_bytes;
                self.done = Some((cleanup, Instant::now()));
                None
            }
            WorkerMessage::Fatal { message } => {
                Some(ShardEnd::Lost(format!("the worker failed: {message}")))
            }
        }
    }

    /// `key`'s position in the bundle, when the bundle has it.
    fn position(&self, key: &TrialKey) -> Option<usize> {
        self.trials.find(key)
    }

    /// `key` as the bundle holds it when the bundle planned it ([`ShardTrials::planned`]): a
    /// key kept past its message (queued for grading, counted) then shares the bundle's names
    /// instead of holding the worker's copies of them.
    fn planned_key(&self, key: TrialKey) -> TrialKey {
        match self.position(&key) {
            Some(at) => self.trials.trials().planned(at, key),
            None => key,
        }
    }

    fn on_hello(
        &mut self,
        protocol: String,
        mst: String,
        image: Option<String>,
        client: ClientIdentity,
        shard: u32,
    ) -> Option<ShardEnd> {
        let ours = env!("CARGO_PKG_VERSION");
        if protocol != PROTOCOL || mst != ours {
            return Some(ShardEnd::VersionMismatch(format!(
                "the worker runs mst {mst} speaking {protocol}; this coordinator is mst {ours} \
                 speaking {PROTOCOL}, and a worker must run the coordinator's exact version"
            )));
        }
        if shard != self.bundle.shard {
            return Some(ShardEnd::Lost(format!(
                "the worker says it runs shard {shard}, not {}",
                self.bundle.shard
            )));
        }
        self.hello_seen = true;
        self.report.hello_at = Some(Instant::now());
        self.report.worker = Some(WorkerIdentity { mst, client, image });
        None
    }

    /// Answers `need-tokens` with the tokens this run holds, only over stdin, and only for
    /// servers of this shard's bundle: asking for any other is a protocol violation.
    fn on_need_tokens(&mut self, servers: &[String]) -> Option<ShardEnd> {
        let resumes = self
            .bundle
            .conversation
            .as_ref()
            .is_some_and(|turn| turn.resume);
        let bundled = |server: &String| {
            (resumes && server == crate::client::RESUME_TOKEN)
                || self
                    .bundle
                    .variants
                    .values()
                    .any(|v| v.servers.contains_key(server) || v.token_names().contains(server))
        };
        if let Some(stranger) = servers.iter().find(|s| !bundled(s)) {
            return Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: it asked for a token of server `{stranger}`, which \
                 its bundle does not use"
            )));
        }
        let mut granted = BTreeMap::new();
        for server in servers {
            let token = match server == crate::client::RESUME_TOKEN {
                true => self.context.resume.map(|value| Token {
                    value: value.clone(),
                    expires_at: None,
                }),
                false => self.context.tokens.token(server),
            };
            match token {
                Some(token) => {
                    granted.insert(server.clone(), token);
                }
                None => (self.context.events)(ShardEvent::NoToken {
                    shard: self.bundle.shard,
                    server: server.clone(),
                }),
            }
        }
        self.send_tokens(granted);
        None
    }

    /// Sends `tokens` and remembers what the worker holds.
    fn send_tokens(&mut self, tokens: BTreeMap<String, Token>) {
        let now = crate::clock::unix_millis();
        for (server, token) in &tokens {
            self.sent_tokens
                .insert(server.clone(), (token.clone(), now));
        }
        self.send(&CoordinatorMessage::Tokens { tokens });
    }

    /// Renews, unasked, the tokens the worker holds that are about to expire, once the run
    /// has a newer value (the operator rewrote the secrets file). Looked at once a second.
    fn renew_tokens(&mut self) {
        if self.tokens_checked.elapsed() < Duration::from_secs(1) {
            return;
        }
        self.tokens_checked = Instant::now();
        let now = crate::clock::unix_millis();
        let mut renewed = BTreeMap::new();
        for (server, (held, since)) in &self.sent_tokens {
            let Some(expires) = held.expires_at else {
                continue;
            };
            if !renewal_due(expires, *since, now) {
                continue;
            }
            if let Some(current) = self.context.tokens.token(server) {
                if current.value != held.value || current.expires_at != held.expires_at {
                    renewed.insert(server.clone(), current);
                }
            }
        }
        if !renewed.is_empty() {
            self.send_tokens(renewed);
        }
    }

    /// Queues a trial for room under the limits. The servers it takes are the bundle's (its
    /// variant's), not what the worker says, so a worker cannot slip past a limit by naming
    /// none; asking twice for one trial is a protocol violation.
    fn on_acquire(&mut self, key: TrialKey) -> Option<ShardEnd> {
        let at = match self.position(&key) {
            Some(at) if !self.progress[at].reported => at,
            _ => {
                return Some(ShardEnd::Lost(format!(
                    "the worker asked for trial {key}, which this shard does not run"
                )))
            }
        };
        if std::mem::replace(&mut self.progress[at].acquired, true) {
            return Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: it asked twice for trial {key}"
            )));
        }
        let variant = self.bundle.variants.get(&*key.variant);
        let servers = variant.map(VariantSpec::server_labels).unwrap_or_default();
        if self.cancel_sent.is_none() {
            self.waiting.push(WaitingAcquire { key, servers });
        }
        None
    }

    /// Whether `key` runs now: granted (asked for and no longer waiting for room) and not yet
    /// reported.
    fn running(&self, key: &TrialKey) -> bool {
        self.position(key)
            .is_some_and(|at| self.progress[at].acquired && !self.progress[at].reported)
            && !self.waiting.iter().any(|w| w.key == *key)
    }

    /// Checks one streamed trace event (an `event` message) and passes it on, redacted as
    /// the trace file will be. An event for a trial that is not running, out of order, or
    /// past the caps breaks the protocol, like any other lie about a trial: the shard is lost.
    fn on_event(&mut self, message: WorkerMessage, line_bytes: u64) -> Option<ShardEnd> {
        let WorkerMessage::Event {
            key,
            seq,
            event,
            omitted,
        } = message
        else {
            unreachable!("on_event takes `event` messages")
        };
        let checked = if self.running(&key) {
            self.streams
                .check(&key, seq, event.as_ref(), omitted, line_bytes)
        } else {
            Err(format!(
                "it streamed event {seq} of trial {key}, which is not running"
            ))
        };
        if let Err(why) = checked {
            return Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: {why}"
            )));
        }
        let shard = self.bundle.shard;
        let event = event.map(|e| e.redacted());
        (self.context.events)(ShardEvent::TraceEvent {
            shard,
            key,
            seq,
            event,
        });
        None
    }

    /// Checks a `resume-token` and passes it on: only a conversation turn's running trial may
    /// send one, within the size cap; anything else breaks the protocol and loses the shard.
    fn on_resume_token(
        &mut self,
        key: TrialKey,
        token: crate::secrets::Secret,
    ) -> Option<ShardEnd> {
        let refused = if self.bundle.conversation.is_none() {
            Some("it sent a resume token outside a conversation turn".to_string())
        } else if !self.running(&key) {
            Some(format!(
                "it sent a resume token for trial {key}, which is not running"
            ))
        } else {
            protocol::check_resume_token(token.expose())
                .err()
                .map(|why| format!("it sent {why}"))
        };
        if let Some(why) = refused {
            return Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: {why}"
            )));
        }
        // From now on nothing this process writes or answers holds it.
        crate::secrets::hold("resume token", &token);
        (self.context.events)(ShardEvent::ResumeToken {
            shard: self.bundle.shard,
            key,
            token,
        });
        None
    }

    /// A part of a model call an agent made through the worker's gateway: refused at once
    /// (a token not the trial's, a trial not running, too many calls), waited on, or, once
    /// whole, made on a thread of its own whose answer comes back as an input.
    fn on_model_call(
        &mut self,
        key: TrialKey,
        call: u32,
        token: &crate::secrets::Secret,
        part: super::protocol::ModelPart,
    ) -> Option<ShardEnd> {
        let request = match self.model_calls.on_part(&key, call, token, part) {
            Err(why) => {
                return Some(ShardEnd::Lost(format!(
                    "the worker broke {PROTOCOL}: {why}"
                )))
            }
            Ok(OnPart::Wait) => return None,
            Ok(OnPart::Answer(answer)) => {
                self.send_answer(&key, call, &answer);
                return None;
            }
            Ok(OnPart::Call(request)) => request,
        };
        let (Some(spec), Some(inputs)) = (self.bundle.variants.get(&*key.variant), &self.inputs)
        else {
            return None;
        };
        let inputs = inputs.clone();
        let caller = match &self.bundle.grading {
            Some(work) => Caller::Judges(work.plugins.clone()),
            None => Caller::Agent(Box::new(spec.clone())),
        };
        CallJob {
            key,
            call,
            request,
            caller,
            access: self.context.models.cloned(),
            answers: Box::new(move |answered| {
                let _ = inputs.send(Input::Answered(Box::new(answered)));
            }),
        }
        .spawn();
        None
    }

    /// The worker asks for the hidden files of check `check` of trial `key`: sent in parts
    /// (or why mst has none) when the trial runs and its check has files; anything else
    /// breaks the protocol.
    fn on_check_files(&mut self, key: TrialKey, check: String) -> Option<ShardEnd> {
        let broke = |why: String| {
            Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: {why}"
            )))
        };
        if !self.running(&key) {
            return broke(format!(
                "it asked for check files of trial {key}, which is not running"
            ));
        }
        let checks = match self.bundle.case_checks.get(&*key.case) {
            Some(checks) => checks,
            None => &self.bundle.variants.get(&*key.variant)?.checks,
        };
        let Some(files) = (checks.iter())
            .find(|c| c.name == check)
            .and_then(|c| c.files.clone())
        else {
            return broke(format!(
                "it asked for files of check `{check}`, which has none"
            ));
        };
        let parts = match self.context.check_files {
            Some(store) => store.parts(&files),
            None => Err("this run hands out no check files".to_string()),
        };
        let answers: Vec<_> = match parts {
            Ok(parts) => parts.into_iter().map(|part| (Some(part), None)).collect(),
            Err(error) => vec![(None, Some(error))],
        };
        for (part, error) in answers {
            self.send(&CoordinatorMessage::CheckFiles {
                key: key.clone(),
                check: check.clone(),
                part,
                error,
            });
        }
        None
    }

    /// The worker opened egress connection `conn`: the gate decides it, its bytes travel
    /// through the tunnel. A worker whose bundle has no `egress` breaks the protocol.
    fn on_egress_open(&mut self, conn: u32) -> Option<ShardEnd> {
        let lost = |why: &str| {
            Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: {why}"
            )))
        };
        let (Some(allowed), true) = (self.context.egress, self.bundle.egress) else {
            return lost("it opened an egress connection, which its bundle does not allow");
        };
        if self.egress.is_none() {
            let stdin = self.stdin.clone()?;
            let tunnel = crate::egress::Tunnel::new(Box::new(move |conn, bytes| {
                use base64::Engine as _;
                let message = match bytes {
                    Some(bytes) => CoordinatorMessage::EgressData {
                        conn,
                        data: base64::engine::general_purpose::STANDARD.encode(bytes),
                    },
                    None => CoordinatorMessage::EgressClose { conn },
                };
                let _ = stdin.send(super::protocol::encode(&message));
            }));
            self.egress = Some((tunnel, crate::egress::EgressGate::new(allowed.clone())));
        }
        let (tunnel, gate) = self.egress.as_ref()?;
        let Ok((ours, theirs)) = std::os::unix::net::UnixStream::pair() else {
            return None;
        };
        if tunnel.attach(conn, ours).is_ok() {
            gate.accept(theirs);
        }
        None
    }

    /// Bytes of egress connection `conn` from the worker (`None`: it closed); bytes that do
    /// not decode break the protocol.
    fn on_egress_data(&mut self, conn: u32, data: Option<String>) -> Option<ShardEnd> {
        use base64::Engine as _;
        let Some((tunnel, _)) = &self.egress else {
            return Some(ShardEnd::Lost(format!(
                "the worker broke {PROTOCOL}: egress bytes on a connection it never opened"
            )));
        };
        let bytes = match data.map(|data| base64::engine::general_purpose::STANDARD.decode(data)) {
            None => None,
            Some(Ok(bytes)) => Some(bytes),
            Some(Err(_)) => {
                return Some(ShardEnd::Lost(format!(
                    "the worker broke {PROTOCOL}: egress bytes that are not base64"
                )))
            }
        };
        tunnel.deliver(conn, bytes);
        None
    }

    /// A model call came back: its answer goes to the worker, if its trial still runs.
    fn on_answered(&mut self, answered: Answered) {
        let (key, call) = (answered.key.clone(), answered.call);
        if let Some(answer) = self.model_calls.on_answered(answered) {
            self.send_answer(&key, call, &answer);
        }
    }

    /// Sends `answer` to call `call` of `key`'s trial, in parts.
    fn send_answer(&mut self, key: &TrialKey, call: u32, answer: &ModelAnswer) {
        let json = serde_json::to_string(answer).unwrap_or_else(|e| {
            serde_json::to_string(&ModelAnswer::refused(500, e.to_string())).unwrap_or_default()
        });
        for part in ModelPart::split(&json) {
            self.send(&CoordinatorMessage::ModelReply {
                key: key.clone(),
                call,
                part,
            });
        }
    }

    /// A trial ended: its trace came in the message (`inline`, with the line's length), and
    /// is settled now, or waits on the machine to be copied back.
    fn on_trial(
        &mut self,
        key: TrialKey,
        status: Collected,
        error: Option<String>,
        inline: Option<(Box<TrialRecord>, u64)>,
    ) -> Option<ShardEnd> {
        // The trial's room comes back, and its gateway token is refused from now on.
        self.context.limiter.release_trial(self.bundle.shard, &key);
        self.model_calls.end(&key);
        let Some(at) = self.position(&key) else {
            return Some(ShardEnd::Lost(format!(
                "the worker reported trial {key}, which this shard does not run"
            )));
        };
        if std::mem::replace(&mut self.progress[at].reported, true) {
            return Some(ShardEnd::Lost(format!(
                "the worker reported trial {key} twice"
            )));
        }
        self.streams.end(&key);
        let copy = PendingCopy {
            key,
            status,
            error,
            since: Instant::now(),
        };
        match inline {
            Some((record, bytes)) => {
                let checked = self.accept_inline(*record, bytes, &copy.key);
                self.settle(copy, checked, false);
            }
            None => self.copies.push(copy),
        }
        None
    }

    /// What a `trial` message lists of the trial's artefacts: queued for copying back when
    /// the bundle keeps artefacts and the trial is one this shard runs (its other checks are
    /// [`Self::on_trial`]'s), a broken protocol otherwise.
    fn on_artifacts(&mut self, key: &TrialKey, listed: Vec<ArtifactFile>) -> Option<ShardEnd> {
        if listed.is_empty() {
            return None;
        }
        if self.context.artifacts.is_none() || self.bundle.artifacts.is_none() {
            return Some(ShardEnd::Lost(format!(
                "the worker listed artefacts for trial {key}, but this bundle keeps none"
            )));
        }
        if self.position(key).is_some() {
            self.artifact_copies
                .push((self.planned_key(key.clone()), listed));
        }
        None
    }

    /// Copies back the artefacts that wait, a trial at a time (one request each for
    /// runners whose copies are costly: a trial's files share its directory).
    fn copy_artifacts(&mut self, channel: &mut dyn Channel) {
        let Some(copier) = self.context.artifacts else {
            return;
        };
        let shard = self.bundle.shard;
        for (key, listed) in std::mem::take(&mut self.artifact_copies) {
            let events = self.context.events;
            let mut skipped = |why: String| {
                let key = key.clone();
                events(ShardEvent::ArtifactSkipped { shard, key, why });
            };
            copier.copy(
                channel,
                &key,
                &listed,
                &mut self.report.artifacts,
                &mut skipped,
            );
        }
    }

    /// The worker's output ended: how the shard ended follows from what it said before.
    fn on_eof(&self) -> ShardEnd {
        match (self.done.map(|(cleanup, _)| cleanup), self.cancel_sent) {
            (Some(Cleanup::Ok), None) => ShardEnd::Done,
            (Some(Cleanup::Failed), None) => ShardEnd::DoneCleanupFailed,
            (_, Some(_)) => ShardEnd::Cancelled,
            (None, None) => ShardEnd::Lost(format!(
                "the worker on {} exited without `done`",
                self.report.machine
            )),
        }
    }

    /// Copies the waiting traces back (the path is ours to decide, never the worker's),
    /// validates them and records each trial's outcome. When copies fail because the machine
    /// itself is gone (its runner says so), those trials stay missing, for a resume, instead
    /// of failed. A channel that copies files lands them in a directory of the batch's own
    /// beside the run's, removed once each trace is checked and stored in the trace log.
    fn copy_back(&mut self, channel: &mut dyn Channel) {
        if self.copies.is_empty() {
            return;
        }
        let landing = crate::home::create_private_dir(&self.run_dir.root).and_then(|()| {
            Ok(tempfile::Builder::new()
                .prefix(".landing-")
                .tempdir_in(&self.run_dir.root)?)
        });
        let landing = match landing {
            Ok(landing) => landing,
            Err(e) => {
                // Nowhere to land them: the trials stay missing, for a resume.
                let why = format!("cannot make a landing directory: {e:#}");
                for copy in std::mem::take(&mut self.copies) {
                    let checked = Err(CopyFailure::NotCopied(why.clone()));
                    self.settle(copy, checked, false);
                }
                return;
            }
        };
        let files: Vec<(String, PathBuf)> = self
            .copies
            .iter()
            .map(|c| {
                let path = trace_path(&c.key);
                (format!("results/{path}"), landing.path().join(&path))
            })
            .collect();
        let fetched = channel.read_many(&files, self.context.settings.max_trace_bytes);
        let machine_lost = fetched.iter().any(|f| f.is_err()) && channel.diagnose().is_some();
        let copies = std::mem::take(&mut self.copies);
        for (copy, fetched) in copies.into_iter().zip(fetched) {
            let fetched = fetched.and_then(|bytes| {
                self.count_copied(bytes.len() as u64)?;
                Ok(bytes)
            });
            let checked = match fetched {
                Ok(bytes) => self
                    .accept_trace(&bytes, &copy.key)
                    .map_err(CopyFailure::Refused),
                Err(e) if Refused::is(&e) => Err(CopyFailure::Refused(format!("{e:#}"))),
                Err(e) => Err(CopyFailure::NotCopied(format!("{e:#}"))),
            };
            self.settle(copy, checked, machine_lost);
        }
    }

    /// A trace that came in its `trial` message (`bytes` long, the line): counted against
    /// the copy caps as a copied file is, then checked. (The line is at most
    /// [`protocol::MAX_LINE_BYTES`], far below the trace size limit.)
    fn accept_inline(
        &mut self,
        record: TrialRecord,
        bytes: u64,
        key: &TrialKey,
    ) -> Result<TrialStatus, CopyFailure> {
        // Past a cap it is dropped, as a copied file would be: the trial stays missing.
        if let Err(e) = self.count_copied(bytes) {
            return Err(CopyFailure::NotCopied(format!("{e:#}")));
        }
        self.accept_record(record, key)
            .map_err(CopyFailure::Refused)
    }

    /// Records the outcome of one trial from what came back for it (`checked`).
    /// `machine_lost`: the copies failed because the machine itself is gone.
    fn settle(
        &mut self,
        copy: PendingCopy,
        checked: Result<TrialStatus, CopyFailure>,
        machine_lost: bool,
    ) {
        let shard = self.bundle.shard;
        match (copy.status, checked) {
            // The trace decides: an infra trace is infra whatever the worker said.
            (_, Ok(TrialStatus::Infra)) => {
                let reason = copy
                    .error
                    .unwrap_or_else(|| "the client could not run".into());
                self.infra(copy.key, reason);
            }
            (Collected::Collected, Ok(_)) => self.collected(copy.key),
            // A trace that says the client ran outweighs the worker's word that it could
            // not: the machine cannot turn a failed answer into an excused one unseen.
            (Collected::Infra, Ok(_)) => {
                let key = copy.key.clone();
                let claim = copy.error.unwrap_or_else(|| "no reason given".into());
                (self.context.events)(ShardEvent::InfraClaimOverruled { shard, key, claim });
                self.collected(copy.key);
            }
            // The machine vanished under it: the trial stays missing, for a resume.
            (_, Err(CopyFailure::NotCopied(_))) if machine_lost => {}
            // Nothing usable arrived: the trial stays missing, for a resume.
            (Collected::Collected, Err(CopyFailure::NotCopied(why))) => {
                let key = copy.key;
                (self.context.events)(ShardEvent::TraceNotCopied { shard, key, why });
            }
            // The worker says the client could not run (with its reason, which a missing
            // trace does not make less true).
            (Collected::Infra, Err(_)) => {
                let reason = copy
                    .error
                    .unwrap_or_else(|| "the client could not run".into());
                self.write_infra(&copy.key, &reason);
                self.infra(copy.key, reason);
            }
            (Collected::Collected, Err(CopyFailure::Refused(why))) => {
                let key = copy.key.clone();
                let reason = format!("its trace was refused: {why}");
                (self.context.events)(ShardEvent::TraceRefused { shard, key, why });
                self.write_infra(&copy.key, &reason);
                self.infra(copy.key, reason);
            }
        }
    }

    /// Counts a copied trace (`size` bytes) against the shard's and the run's caps; the one
    /// that crosses a cap is dropped (the trial stays missing) and the shard stops.
    fn count_copied(&mut self, size: u64) -> anyhow::Result<()> {
        self.copied += size;
        let run_total = self.context.copied.fetch_add(size, Ordering::SeqCst) + size;
        let settings = self.context.settings;
        let crossed = if self.copied > settings.max_shard_copy_bytes {
            Some(format!(
                "shard {} copied back {} bytes, past its cap of {} (--max-shard-copy)",
                self.bundle.shard, self.copied, settings.max_shard_copy_bytes
            ))
        } else if run_total > settings.max_run_copy_bytes {
            Some(format!(
                "the run copied back {run_total} bytes, past its cap of {} (--max-run-copy)",
                settings.max_run_copy_bytes
            ))
        } else {
            None
        };
        let Some(why) = crossed else {
            return Ok(());
        };
        self.over_cap.get_or_insert(why.clone());
        anyhow::bail!("{why}; the trace was dropped")
    }

    /// Checks a copied-back trace and makes it the coordinator's: it must parse as a trial
    /// record for `key` whose case has the id and input the coordinator sent; its case is then
    /// replaced by the coordinator's own (with `expected` and metadata, which the machine never
    /// had) and its provenance recorded. Returns the trace's status.
    fn accept_trace(&self, bytes: &[u8], key: &TrialKey) -> Result<TrialStatus, String> {
        let record: TrialRecord =
            serde_json::from_slice(bytes).map_err(|e| format!("not a trace: {e}"))?;
        self.accept_record(record, key)
    }

    /// [`Self::accept_trace`] for a trace already parsed.
    fn accept_record(
        &self,
        mut record: TrialRecord,
        key: &TrialKey,
    ) -> Result<TrialStatus, String> {
        if *record.variant != *key.variant
            || *record.case.id != *key.case
            || record.trial != key.trial
        {
            return Err(format!(
                "the trace is for {}/{}/{}, not {key}",
                record.variant, record.case.id, record.trial
            ));
        }
        let case = self
            .context
            .cases
            .get(&key.case)
            .map_err(|e| format!("{e:#}"))?;
        let Some(case) = case else {
            return Err(format!("case `{}` is not one this run sent", key.case));
        };
        if !record.case.is_client_view_of(&case) {
            return Err(format!(
                "its case `{}` is not the one the coordinator sent (input, or fields the \
                 machine never had)",
                key.case
            ));
        }
        record.case = case.into_owned();
        // What its model calls used, as the host measured them at the gateway.
        self.model_calls.append_to(key, &mut record.trace.events);
        // The client is the trial's variant's (the worker's `hello` names only one of the
        // bundle's); its version is the agent CLI's the trace names, or the worker's mst,
        // which every other client is part of.
        let client = self
            .bundle
            .variants
            .get(&*key.variant)
            .map(|v| v.client.clone());
        let version = agent_cli_version(&record.trace.events).or_else(|| {
            self.report
                .worker
                .as_ref()
                .map(|w| w.client.version.clone())
        });
        record.collected_by = Some(CollectedBy {
            shard: self.bundle.shard,
            machine: self.report.machine.clone(),
            client: client.unwrap_or_default(),
            client_version: version.unwrap_or_default(),
        });
        // Written back redacted: an agent may have printed a secret mst holds.
        let record = self
            .run_dir
            .store_trace(key, record)
            .map_err(|e| format!("{e:#}"))?;
        let status = record.trace.status;
        // Infra trials are counted where they are settled ([`Self::infra`]).
        if status != TrialStatus::Infra && record.trace.failure().is_some() {
            self.failed_trials.set(self.failed_trials.get() + 1);
        }
        if let Some(stored) = self.context.stored {
            stored(key, record);
        }
        Ok(status)
    }

    fn collected(&mut self, key: TrialKey) {
        let shard = self.bundle.shard;
        if let Some(at) = self.position(&key) {
            self.report.collected.grow_and_insert(at);
        }
        (self.context.events)(ShardEvent::TrialCollected { shard, key });
    }

    fn infra(&mut self, key: TrialKey, reason: String) {
        let shard = self.bundle.shard;
        self.failed_trials.set(self.failed_trials.get() + 1);
        (self.context.events)(ShardEvent::TrialInfra { shard, key, reason });
    }

    /// Records the coordinator's own infra record as `key`'s trace, in place of whatever came
    /// back for it, so the trial counts as infra (not missing) and nothing the worker wrote
    /// is kept.
    fn write_infra(&self, key: &TrialKey, reason: &str) {
        let case = match self.context.cases.get(&key.case) {
            Ok(Some(case)) => case.into_owned(),
            Ok(None) => return,
            // The infra failure is recorded all the same, with the case as its key names it.
            Err(e) => {
                tracing::warn!("{key}: {e:#}");
                crate::eval::trial::CaseRecord::new(key.case.clone(), serde_json::Value::Null)
            }
        };
        let record = TrialRecord::infra(case, key, reason);
        if let (Ok(record), Some(stored)) =
            (self.run_dir.store_trace(key, record), self.context.stored)
        {
            stored(key, record);
        }
    }
}

/// What each trial of a shard has streamed: the next `seq` it must send, and the bytes of its
/// `event` lines so far.
#[derive(Default)]
struct Streams(BTreeMap<TrialKey, (u64, u64)>);

impl Streams {
    /// Checks the trial's next event message (`line_bytes` long, as [`protocol::encode`]
    /// writes it) against the order and the caps, and counts it; says what is wrong otherwise.
    fn check(
        &mut self,
        key: &TrialKey,
        seq: u64,
        event: Option<&TraceEvent>,
        omitted: Option<u64>,
        line_bytes: u64,
    ) -> Result<(), String> {
        let (next, bytes) = self.0.get(key).copied().unwrap_or((0, 0));
        if seq != next {
            return Err(format!(
                "it streamed event {seq} of trial {key}, whose next event is {next}"
            ));
        }
        match (event, omitted) {
            (Some(event), None) if event.seq != seq => {
                return Err(format!(
                    "its event {seq} of trial {key} says it is event {}",
                    event.seq
                ))
            }
            (Some(event), None) if protocol::event_bytes(event) > protocol::MAX_EVENT_BYTES => {
                return Err(format!(
                    "its event {seq} of trial {key} is {} bytes, over the {}-byte cap for an \
                     event streamed in full",
                    protocol::event_bytes(event),
                    protocol::MAX_EVENT_BYTES
                ))
            }
            (Some(_), None) | (None, Some(_)) => {}
            _ => {
                return Err(format!(
                    "its event {seq} of trial {key} must carry either `event` or `omitted`"
                ))
            }
        }
        let bytes = bytes + line_bytes;
        if bytes > protocol::MAX_TRIAL_STREAM_BYTES {
            return Err(format!(
                "trial {key} streamed {bytes} bytes of events, over the {}-byte cap per trial",
                protocol::MAX_TRIAL_STREAM_BYTES
            ));
        }
        self.0.insert(key.clone(), (next + 1, bytes));
        Ok(())
    }

    /// Forgets a reported trial's count: no event of it is accepted any more, and a long
    /// shard does not hold one entry per trial it ran.
    fn end(&mut self, key: &TrialKey) {
        self.0.remove(key);
    }
}

/// Writes queued lines to the worker's stdin on a thread of its own, until the queue closes or
/// the pipe breaks.
fn spawn_writer(mut stdin: Box<dyn Write + Send>) -> mpsc::Sender<String> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in rx {
            if stdin
                .write_all(line.as_bytes())
                .and_then(|_| stdin.flush())
                .is_err()
            {
                break;
            }
        }
    });
    tx
}

/// Reads the worker's stdout on a thread of its own, framed by [`protocol::read_messages`].
/// The version an agent CLI's trace names ([`crate::client::command::AGENT_CLI_EVENT`]),
/// when it is a plain version (a machine's claim: capped, letters, digits, `.-+` only).
fn agent_cli_version(events: &[TraceEvent]) -> Option<String> {
    events.iter().find_map(|event| match &event.kind {
        crate::eval::trial::EventKind::Custom { name, data }
            if name == crate::client::command::AGENT_CLI_EVENT =>
        {
            let version = data["version"].as_str()?;
            let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+');
            (version.len() <= 64 && version.chars().all(plain)).then(|| version.to_string())
        }
        _ => None,
    })
}

fn spawn_reader(stdout: Box<dyn std::io::Read + Send>, tx: mpsc::Sender<Input>) {
    std::thread::spawn(move || {
        protocol::read_messages::<WorkerMessage>(stdout, |message, line_bytes| {
            let input = match message {
                Ok(message) => Input::Message(message, line_bytes),
                Err(e) => Input::Bad(e.0),
            };
            let bad = matches!(input, Input::Bad(_));
            tx.send(input).is_ok() && !bad
        });
        let _ = tx.send(Input::Eof);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::EventKind;

    fn key(trial: u32) -> TrialKey {
        TrialKey {
            variant: "v".into(),
            case: "c".into(),
            trial,
        }
    }

    fn log(seq: u64, text: &str) -> TraceEvent {
        TraceEvent {
            seq,
            at_ms: 1,
            kind: EventKind::Log { text: text.into() },
        }
    }

    #[test]
    fn streamed_events_come_in_order_per_trial() {
        let mut streams = Streams::default();
        assert!(streams
            .check(&key(0), 0, Some(&log(0, "a")), None, 10)
            .is_ok());
        assert!(streams
            .check(&key(1), 0, Some(&log(0, "b")), None, 10)
            .is_ok());
        assert!(streams.check(&key(0), 1, None, Some(99_999), 10).is_ok());
        let err = streams
            .check(&key(0), 3, Some(&log(3, "gap")), None, 10)
            .unwrap_err();
        assert!(err.contains("whose next event is 2"), "{err}");
        let err = streams
            .check(&key(0), 1, Some(&log(1, "again")), None, 10)
            .unwrap_err();
        assert!(err.contains("next event is 2"), "{err}");
        let err = streams
            .check(&key(0), 2, Some(&log(5, "lie")), None, 10)
            .unwrap_err();
        assert!(err.contains("says it is event 5"), "{err}");
        let err = streams.check(&key(0), 2, None, None, 10).unwrap_err();
        assert!(err.contains("either `event` or `omitted`"), "{err}");
    }

    #[test]
    fn streamed_events_are_capped_per_event_and_per_trial() {
        let mut streams = Streams::default();
        let big = log(0, &"x".repeat(protocol::MAX_EVENT_BYTES));
        let err = streams.check(&key(0), 0, Some(&big), None, 10).unwrap_err();
        assert!(err.contains("cap for an event"), "{err}");
        let half = protocol::MAX_TRIAL_STREAM_BYTES / 2;
        assert!(streams.check(&key(0), 0, None, Some(1), half).is_ok());
        assert!(streams.check(&key(0), 1, None, Some(1), half).is_ok());
        let err = streams.check(&key(0), 2, None, Some(1), 1).unwrap_err();
        assert!(err.contains("cap per trial"), "{err}");
    }
}
