//! The worker: `mst collect --bundle DIR --results DIR`. Runs on the machine, drives the
//! client for each trial of its shard, writes each trace as soon as the trial ends, and speaks
//! `mst.shard/v1` with the coordinator over stdin/stdout.

use super::bundle::{trace_path, Bundle, BUNDLE_FILE, MAX_BUNDLE_BYTES};
use super::protocol::{
    self, Cleanup, ClientIdentity, Collected, CoordinatorMessage, DoneCounts, TokenReason,
    TrialKey, WorkerMessage, PROTOCOL,
};
use crate::eval::client::{self, Client, TrialInput};
use crate::eval::config::ServerConfig;
use crate::eval::trial::{CaseRecord, TrialRecord, TrialStatus};
use crate::plugin::Secret;
use crate::secrets::TokenDir;
use anyhow::{Context, Result};
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Writes protocol lines to stdout; shared by the main loop and the heartbeat thread.
#[derive(Clone)]
struct Wire(Arc<Mutex<std::io::Stdout>>);

impl Wire {
    fn send(&self, message: &WorkerMessage) {
        let mut out = self.0.lock().expect("stdout lock");
        // A closed stdout means the coordinator is gone; the main loop notices on stdin.
        let _ = out.write_all(protocol::encode(message).as_bytes());
        let _ = out.flush();
    }
}

enum Event {
    FromCoordinator(CoordinatorMessage),
    CoordinatorGone,
    Finished(TrialKey, Result<Option<TrialStatus>, String>),
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Runs one trial and writes its trace; returns the trace's status.
/// `Ok(None)` when the trial was stopped by `cancel`: it is left missing, to be resumed.
fn run_trial(
    client: &dyn Client,
    case: &CaseRecord,
    key: &TrialKey,
    timeout: Duration,
    results: &Path,
    cancel: &AtomicBool,
) -> Result<Option<TrialStatus>, String> {
    let trace = client.run(&TrialInput {
        case,
        variant: &key.variant,
        trial: key.trial,
        timeout,
        cancel,
    });
    let status = trace.status;
    if cancel.load(Ordering::Relaxed) && status != TrialStatus::Completed {
        return Ok(None);
    }
    let record = TrialRecord {
        case: case.clone(),
        variant: key.variant.clone(),
        trial: key.trial,
        trace,
    };
    let bytes = serde_json::to_vec_pretty(&record).map_err(|e| e.to_string())?;
    crate::files::write_atomic(&results.join(trace_path(key)), &bytes)
        .map_err(|e| format!("{e:#}"))?;
    Ok(Some(status))
}

/// `mst collect`: returns the process exit code (0 when the shard ran to the end).
pub fn collect(bundle_dir: &Path, results: &Path) -> u8 {
    let wire = Wire(Arc::new(Mutex::new(std::io::stdout())));
    match collect_inner(bundle_dir, results, &wire) {
        Ok(code) => code,
        Err(e) => {
            wire.send(&WorkerMessage::Fatal {
                message: format!("{e:#}"),
            });
            1
        }
    }
}

fn collect_inner(bundle_dir: &Path, results: &Path, wire: &Wire) -> Result<u8> {
    let path = bundle_dir.join(BUNDLE_FILE);
    let bytes = crate::files::read_regular(&path, MAX_BUNDLE_BYTES, true)?;
    let bundle: Bundle = serde_json::from_slice(&bytes)
        .with_context(|| format!("{} is not a bundle", path.display()))?;
    let build_clients =
        |tokens: &BTreeMap<String, Secret>| -> Result<BTreeMap<String, Arc<dyn Client>>> {
            bundle
                .variants
                .iter()
                .map(|(name, spec)| {
                    let client = client::client(
                        &spec.client,
                        spec.client_options.as_ref(),
                        &spec.servers,
                        tokens,
                    )
                    .with_context(|| format!("variant `{name}`"))?;
                    Ok((name.clone(), Arc::from(client)))
                })
                .collect()
        };
    let mut clients = build_clients(&BTreeMap::new())?;
    // Servers whose config names a token: the worker asks for them before any trial.
    let token_servers: Vec<String> = bundle
        .variants
        .values()
        .flat_map(|v| v.servers.iter())
        .filter(|(_, config)| matches!(config, ServerConfig::Http(http) if http.token.is_some()))
        .map(|(label, _)| label.clone())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    let mut token_dir: Option<TokenDir> = None;
    let cases: BTreeMap<String, CaseRecord> = bundle
        .cases
        .iter()
        .map(|c| (c.id.clone(), c.clone()))
        .collect();
    std::fs::create_dir_all(results)
        .with_context(|| format!("cannot create {}", results.display()))?;

    let client_name = bundle
        .variants
        .values()
        .next()
        .map(|v| v.client.clone())
        .unwrap_or_default();
    wire.send(&WorkerMessage::Hello {
        protocol: PROTOCOL.to_string(),
        mst: env!("CARGO_PKG_VERSION").to_string(),
        image: std::env::var("MST_IMAGE_DIGEST").ok(),
        client: ClientIdentity {
            name: client_name,
            version: env!("CARGO_PKG_VERSION").to_string(),
        },
        shard: bundle.shard,
    });

    let mut tokens_ready = token_servers.is_empty();
    if !tokens_ready {
        wire.send(&WorkerMessage::NeedTokens {
            servers: token_servers.clone(),
            reason: TokenReason::Start,
        });
    }

    let (tx, rx) = mpsc::channel::<Event>();
    let stdin_tx = tx.clone();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        for line in stdin.lock().lines() {
            let Ok(line) = line else { break };
            if line.trim().is_empty() {
                continue;
            }
            match protocol::decode::<CoordinatorMessage>(&line) {
                Ok(message) => {
                    if stdin_tx.send(Event::FromCoordinator(message)).is_err() {
                        return;
                    }
                }
                Err(e) => eprintln!("mst collect: ignoring a bad coordinator line: {e}"),
            }
        }
        let _ = stdin_tx.send(Event::CoordinatorGone);
    });
    let heartbeat = wire.clone();
    let interval = Duration::from_millis(bundle.heartbeat_ms.max(50));
    let stop_heartbeat = Arc::new(AtomicBool::new(false));
    let stop = stop_heartbeat.clone();
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            heartbeat.send(&WorkerMessage::Heartbeat { at: now_ms() });
            std::thread::sleep(interval);
        }
    });

    let timeout = Duration::from_millis(bundle.timeout_ms);
    let concurrency = bundle.concurrency.max(1) as usize;
    let mut queue: VecDeque<TrialKey> = bundle.trials.iter().cloned().collect();
    let mut awaiting: Vec<TrialKey> = Vec::new();
    let mut running = 0usize;
    let mut counts = DoneCounts::default();
    let mut cancelled = false;
    let cancel_trials = Arc::new(AtomicBool::new(false));
    let servers_of = |key: &TrialKey| -> Vec<String> {
        bundle
            .variants
            .get(&key.variant)
            .map(|v| v.servers.keys().cloned().collect())
            .unwrap_or_default()
    };

    loop {
        while tokens_ready && !cancelled && running + awaiting.len() < concurrency {
            let Some(key) = queue.pop_front() else { break };
            wire.send(&WorkerMessage::Acquire {
                key: key.clone(),
                providers: Vec::new(),
                servers: servers_of(&key),
            });
            awaiting.push(key);
        }
        if running == 0
            && (awaiting.is_empty() || cancelled)
            && (queue.is_empty() || cancelled)
            && (tokens_ready || cancelled)
        {
            break;
        }
        match rx.recv().expect("the worker holds a sender") {
            Event::FromCoordinator(CoordinatorMessage::Granted { key }) => {
                let Some(index) = awaiting.iter().position(|k| k == &key) else {
                    continue;
                };
                awaiting.remove(index);
                if cancelled {
                    continue;
                }
                let (Some(case), Some(client)) = (
                    cases.get(&key.case).cloned(),
                    clients.get(&key.variant).cloned(),
                ) else {
                    let error = format!(
                        "the bundle has no case `{}` or variant `{}`",
                        key.case, key.variant
                    );
                    let _ = tx.send(Event::Finished(key, Err(error)));
                    running += 1;
                    continue;
                };
                running += 1;
                let tx = tx.clone();
                let results = results.to_path_buf();
                let cancel = cancel_trials.clone();
                std::thread::spawn(move || {
                    let outcome =
                        run_trial(client.as_ref(), &case, &key, timeout, &results, &cancel);
                    let _ = tx.send(Event::Finished(key, outcome));
                });
            }
            Event::FromCoordinator(CoordinatorMessage::Cancel { reason }) => {
                eprintln!("mst collect: cancelled: {reason}");
                cancelled = true;
                cancel_trials.store(true, Ordering::Relaxed);
            }
            Event::FromCoordinator(CoordinatorMessage::Tokens { tokens }) => {
                // Tokens live in memory and in the private token directory, nowhere else.
                let dir = match token_dir.take() {
                    Some(dir) => dir,
                    None => TokenDir::create()?,
                };
                let mut values = BTreeMap::new();
                for (server, token) in tokens {
                    dir.write(&server, &token.value)?;
                    values.insert(server, token.value);
                }
                token_dir = Some(dir);
                clients = build_clients(&values)?;
                tokens_ready = true;
            }
            Event::CoordinatorGone => {
                cancelled = true;
                cancel_trials.store(true, Ordering::Relaxed);
            }
            Event::Finished(key, outcome) => {
                running -= 1;
                let path = trace_path(&key);
                match outcome {
                    Ok(None) => counts.skipped += 1,
                    Ok(Some(TrialStatus::Infra)) => {
                        counts.infra += 1;
                        wire.send(&WorkerMessage::Trial {
                            key,
                            status: Collected::Infra,
                            path,
                            error: None,
                        });
                    }
                    Ok(Some(_)) => {
                        counts.collected += 1;
                        wire.send(&WorkerMessage::Trial {
                            key,
                            status: Collected::Collected,
                            path,
                            error: None,
                        });
                    }
                    Err(error) => {
                        counts.infra += 1;
                        wire.send(&WorkerMessage::Trial {
                            key,
                            status: Collected::Infra,
                            path,
                            error: Some(error),
                        });
                    }
                }
            }
        }
    }
    counts.skipped += (queue.len() + awaiting.len()) as u32;
    stop_heartbeat.store(true, Ordering::Relaxed);
    wire.send(&WorkerMessage::Done {
        counts,
        cleanup: Cleanup::Ok,
    });
    Ok(0)
}
