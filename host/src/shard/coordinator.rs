//! The coordinator's side of one shard: stage the bundle on the machine, start the worker,
//! check its version at `hello`, grant trials within the limits, copy each trace back as soon
//! as its `trial` message arrives, and decide how the shard ended. Everything the worker says
//! is treated as hostile: paths are recomputed here, traces are copied with the safe reader and
//! validated before they count.

use super::bundle::{trace_path, Bundle, BUNDLE_FILE};
use super::limits::Limiter;
use super::protocol::{
    self, Cleanup, ClientIdentity, Collected, CoordinatorMessage, Token, TrialKey, WorkerMessage,
    PROTOCOL,
};
use crate::eval::trial::TrialRecord;
use crate::plugin::Secret;
use crate::runner::channel::Channel;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
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
}

impl Default for ShardSettings {
    fn default() -> Self {
        ShardSettings {
            silence: Duration::from_secs(30),
            cancel_grace: Duration::from_secs(5),
            max_trace_bytes: 64 * 1024 * 1024,
            max_log_bytes: 1024 * 1024,
        }
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
    /// Trials whose trace was copied back and validated.
    #[serde(skip)]
    pub collected: Vec<TrialKey>,
    /// Trials the worker reported as infrastructure failures, with reasons.
    #[serde(skip)]
    pub infra: Vec<(TrialKey, String)>,
    /// Where a kept machine is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept: Option<String>,
    /// What the runner says about the machine (host, image, …).
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub placement: serde_json::Value,
    /// When the worker's `hello` arrived.
    #[serde(skip)]
    pub hello_at: Option<Instant>,
    /// Milliseconds from asking the runner for the machine to the worker's `hello`.
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
}

impl ShardReport {
    /// A report for shard `shard` on `machine` that has not run anything yet.
    pub fn new(shard: u32, machine: String) -> Self {
        ShardReport {
            shard,
            machine,
            ended: ShardEnd::Done,
            worker: None,
            collected: Vec::new(),
            infra: Vec::new(),
            kept: None,
            placement: serde_json::Value::Null,
            hello_at: None,
            ready_ms: None,
            create_ms: None,
            dispose_ms: None,
            dispose_error: None,
        }
    }
}

/// Hears about every finished trial, for progress output.
pub trait Progress: Sync {
    /// The run will collect `total` trials.
    fn start(&self, total: u64);
    /// A trial's trace is in (collected or infra).
    fn trial(&self, key: &TrialKey, collected: bool);
    /// Something worth telling the user.
    fn note(&self, message: &str);
}

enum Input {
    Message(WorkerMessage),
    Bad(String),
    Eof,
}

/// Runs one shard on `channel`. `bundle_dir` holds the bundle locally; traces land in `run_dir`;
/// `tokens` are the MCP access tokens by server label, sent only when the worker asks.
#[allow(clippy::too_many_arguments)]
pub fn run_shard(
    channel: &mut dyn Channel,
    bundle: &Bundle,
    bundle_dir: &Path,
    run_dir: &Path,
    limiter: &Limiter,
    tokens: &BTreeMap<String, Secret>,
    progress: &dyn Progress,
    cancel: &AtomicBool,
    settings: ShardSettings,
) -> ShardReport {
    let mut report = ShardReport {
        placement: channel.provenance(),
        ..ShardReport::new(bundle.shard, channel.describe())
    };
    debug_assert!(bundle_dir.join(BUNDLE_FILE).is_file());
    if let Err(e) = channel.put(bundle_dir, "bundle") {
        report.ended = ShardEnd::Lost(format!(
            "cannot copy the bundle to {}: {e:#}",
            report.machine
        ));
        return report;
    }
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
    let mut process = match channel.exec(&argv) {
        Ok(process) => process,
        Err(e) => {
            report.ended = ShardEnd::Lost(format!(
                "cannot start the worker on {}: {e:#}",
                report.machine
            ));
            return report;
        }
    };

    // The worker's stderr goes to a capped log next to the run's results.
    let log_path = run_dir
        .join("shards")
        .join(format!("{}.worker.log", bundle.shard));
    let max_log = settings.max_log_bytes;
    let stderr = std::mem::replace(&mut process.stderr, Box::new(std::io::empty()));
    let log_thread = std::thread::spawn(move || {
        let mut kept = Vec::new();
        let _ = stderr.take(max_log).read_to_end(&mut kept);
        let _ = crate::files::write_atomic(&log_path, &kept);
    });
    let (tx, rx) = mpsc::channel();
    let stdout = std::mem::replace(&mut process.stdout, Box::new(std::io::empty()));
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = String::new();
        loop {
            line.clear();
            // Bound what one line may cost: a worker writing a 1 GiB line is cut off.
            match (&mut reader)
                .take(protocol::MAX_LINE_BYTES as u64 + 1)
                .read_line(&mut line)
            {
                Ok(0) => break,
                Ok(_) if !line.ends_with('\n') && line.len() > protocol::MAX_LINE_BYTES => {
                    let _ = tx.send(Input::Bad(format!(
                        "a line longer than {} bytes",
                        protocol::MAX_LINE_BYTES
                    )));
                    return;
                }
                Ok(_) if line.trim().is_empty() => continue,
                Ok(_) => {
                    let input = match protocol::decode::<WorkerMessage>(&line) {
                        Ok(message) => Input::Message(message),
                        Err(e) => Input::Bad(e.to_string()),
                    };
                    if tx.send(input).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.send(Input::Bad(format!("unreadable output: {e}")));
                    return;
                }
            }
        }
        let _ = tx.send(Input::Eof);
    });

    let mut stdin = process.stdin;
    let mut send = |message: &CoordinatorMessage| -> bool {
        stdin
            .write_all(protocol::encode(message).as_bytes())
            .and_then(|_| stdin.flush())
            .is_ok()
    };
    let planned: BTreeSet<&TrialKey> = bundle.trials.iter().collect();
    let mut reported: BTreeSet<TrialKey> = BTreeSet::new();
    let mut pending: Vec<(TrialKey, Vec<String>, Vec<String>)> = Vec::new();
    let mut hello_seen = false;
    let mut last_heard = Instant::now();
    let mut cancel_sent: Option<Instant> = None;
    let mut done: Option<Cleanup> = None;
    // Traces waiting to be copied back; runners whose copies are costly take them in batches.
    let batched = channel.batch_copies();
    let mut copies: Vec<PendingCopy> = Vec::new();

    let ended = loop {
        if cancel.load(Ordering::Relaxed) && cancel_sent.is_none() {
            send(&CoordinatorMessage::Cancel {
                reason: "interrupted by the user".into(),
            });
            cancel_sent = Some(Instant::now());
        }
        if let Some(at) = cancel_sent {
            if at.elapsed() > settings.cancel_grace {
                break ShardEnd::Cancelled;
            }
        }
        if last_heard.elapsed() > settings.silence {
            break ShardEnd::Lost(format!(
                "the worker on {} sent nothing for {}s; the channel is gone",
                report.machine,
                settings.silence.as_secs()
            ));
        }
        // Copy back what is due: everything at once, or a batch when full or old enough.
        if copies.first().is_some_and(|c| {
            !batched || copies.len() >= COPY_BATCH || c.since.elapsed() > COPY_DELAY
        }) {
            copy_back(
                channel,
                &mut copies,
                run_dir,
                settings,
                &mut report,
                progress,
            );
        }
        // Retry acquisitions that were waiting for room.
        pending.retain(|(key, providers, servers)| {
            if limiter.try_acquire(bundle.shard, key, providers, servers) {
                send(&CoordinatorMessage::Granted { key: key.clone() });
                false
            } else {
                true
            }
        });
        let input = match rx.recv_timeout(Duration::from_millis(25)) {
            Ok(input) => input,
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            Err(mpsc::RecvTimeoutError::Disconnected) => Input::Eof,
        };
        last_heard = Instant::now();
        let message = match input {
            Input::Message(message) => message,
            Input::Bad(why) => break ShardEnd::Lost(format!("the worker broke {PROTOCOL}: {why}")),
            Input::Eof => {
                break match (done, cancel_sent) {
                    (Some(Cleanup::Ok), None) => ShardEnd::Done,
                    (Some(Cleanup::Failed), None) => ShardEnd::DoneCleanupFailed,
                    (_, Some(_)) => ShardEnd::Cancelled,
                    (None, None) => ShardEnd::Lost(format!(
                        "the worker on {} exited without `done`",
                        report.machine
                    )),
                };
            }
        };
        match message {
            WorkerMessage::Hello {
                protocol,
                mst,
                image,
                client,
                shard,
            } => {
                let ours = env!("CARGO_PKG_VERSION");
                if protocol != PROTOCOL || mst != ours {
                    break ShardEnd::VersionMismatch(format!(
                        "the worker runs mst {mst} speaking {protocol}; this coordinator is mst {ours} speaking \
                         {PROTOCOL}, and a worker must run the coordinator's exact version"
                    ));
                }
                if shard != bundle.shard {
                    break ShardEnd::Lost(format!(
                        "the worker says it runs shard {shard}, not {}",
                        bundle.shard
                    ));
                }
                hello_seen = true;
                report.hello_at = Some(Instant::now());
                report.worker = Some(WorkerIdentity { mst, client, image });
            }
            _ if !hello_seen => {
                break ShardEnd::Lost(format!(
                    "the worker spoke before `hello` ({PROTOCOL} requires it first)"
                ))
            }
            WorkerMessage::Heartbeat { .. } => {}
            WorkerMessage::NeedTokens { servers, .. } => {
                // Only tokens for servers of this bundle, and only over stdin.
                let granted: BTreeMap<String, Token> = servers
                    .iter()
                    .filter_map(|server| {
                        tokens.get(server).map(|t| {
                            (
                                server.clone(),
                                Token {
                                    value: t.clone(),
                                    expires_at: None,
                                },
                            )
                        })
                    })
                    .collect();
                if let Some(missing) = servers.iter().find(|s| !granted.contains_key(*s)) {
                    progress.note(&format!(
                        "shard {}: no token for server `{missing}`",
                        bundle.shard
                    ));
                }
                send(&CoordinatorMessage::Tokens { tokens: granted });
            }
            WorkerMessage::Acquire {
                key,
                providers,
                servers,
            } => {
                if !planned.contains(&key) || reported.contains(&key) {
                    break ShardEnd::Lost(format!(
                        "the worker asked for trial {key}, which this shard does not run"
                    ));
                }
                if cancel_sent.is_none() {
                    pending.push((key, providers, servers));
                }
            }
            WorkerMessage::Trial {
                key,
                status,
                path: _,
                error,
            } => {
                limiter.release(bundle.shard, &key);
                if !planned.contains(&key) || !reported.insert(key.clone()) {
                    break ShardEnd::Lost(format!(
                        "the worker reported trial {key} twice or out of plan"
                    ));
                }
                copies.push(PendingCopy {
                    key,
                    status,
                    error,
                    since: Instant::now(),
                });
            }
            WorkerMessage::Done { cleanup, .. } => {
                done = Some(cleanup);
            }
            WorkerMessage::Fatal { message } => {
                break ShardEnd::Lost(format!("the worker failed: {message}"))
            }
        }
    };
    // What is still waiting is copied now.
    let finished = matches!(ended, ShardEnd::Done | ShardEnd::DoneCleanupFailed);
    copy_back(
        channel,
        &mut copies,
        run_dir,
        settings,
        &mut report,
        progress,
    );
    // A finished worker's process ends by itself; one that lingers (a command channel's
    // program that does not exit with it) is stopped after the grace period.
    if !finished || process.handle.wait_timeout(settings.cancel_grace).is_none() {
        process.handle.kill();
    }
    process.handle.wait();
    let _ = log_thread.join();
    limiter.release_shard(bundle.shard);
    report.ended = ended;
    report
}

/// At most this many traces wait to be copied back in one batch.
const COPY_BATCH: usize = 64;
/// And none waits longer than this.
const COPY_DELAY: Duration = Duration::from_millis(500);

/// A trial whose trace is still on the machine.
struct PendingCopy {
    key: TrialKey,
    status: Collected,
    error: Option<String>,
    since: Instant,
}

/// Copies the traces of `copies` back (the path is ours to decide, never the worker's),
/// validates them and records each trial's outcome. When copies fail because the machine itself
/// is gone (its runner says so), those trials stay missing, for a resume, instead of failed.
fn copy_back(
    channel: &mut dyn Channel,
    copies: &mut Vec<PendingCopy>,
    run_dir: &Path,
    settings: ShardSettings,
    report: &mut ShardReport,
    progress: &dyn Progress,
) {
    if copies.is_empty() {
        return;
    }
    let files: Vec<(String, std::path::PathBuf)> = copies
        .iter()
        .map(|c| {
            let path = trace_path(&c.key);
            (format!("results/{path}"), run_dir.join(&path))
        })
        .collect();
    let fetched = channel.get_many(&files, settings.max_trace_bytes);
    let machine_lost = fetched.iter().any(|f| f.is_err()) && channel.diagnose().is_some();
    for ((copy, (_, dest)), fetched) in copies.drain(..).zip(&files).zip(fetched) {
        let PendingCopy {
            key, status, error, ..
        } = copy;
        let fetched = fetched
            .map_err(|e| format!("{e:#}"))
            .and_then(|()| validate_trace(dest, &key));
        match (status, fetched) {
            (Collected::Collected, Ok(())) => {
                report.collected.push(key.clone());
                progress.trial(&key, true);
            }
            (_, Err(_)) if machine_lost => {
                let _ = std::fs::remove_file(dest);
            }
            (Collected::Infra, fetched) => {
                let reason = error.unwrap_or_else(|| "the client could not run".into());
                if fetched.is_err() {
                    let _ = std::fs::remove_file(dest);
                }
                report.infra.push((key.clone(), reason));
                progress.trial(&key, false);
            }
            (Collected::Collected, Err(why)) => {
                let _ = std::fs::remove_file(dest);
                progress.note(&format!(
                    "trial {key}: its trace could not be copied back: {why}"
                ));
                report
                    .infra
                    .push((key.clone(), format!("trace not copied back: {why}")));
                progress.trial(&key, false);
            }
        }
    }
}

/// A copied-back trace must parse as a trial record for the trial it claims to be.
fn validate_trace(path: &Path, key: &TrialKey) -> Result<(), String> {
    let bytes = std::fs::read(path).map_err(|e| e.to_string())?;
    let record: TrialRecord =
        serde_json::from_slice(&bytes).map_err(|e| format!("not a trace: {e}"))?;
    if record.variant != key.variant || record.case.id != key.case || record.trial != key.trial {
        return Err(format!(
            "the trace is for {}/{}/{}, not {key}",
            record.variant, record.case.id, record.trial
        ));
    }
    Ok(())
}
