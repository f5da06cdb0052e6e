//! Batch runs followed in the web UI as they run: started from the UI (`POST /api/v1/runs`, on the eval
//! `mst serve` was given) or by `mst run --serve`. A [`BatchRun`] is the run's reporter: it hears
//! the run's typed events (trials collected, infra, the trace-event stream) and keeps what the
//! page polls. Once the run has finished the page shows its report, read from the run directory.

use super::ServeError;
use crate::eval::trial::TrialKey;
use crate::home::Home;
use crate::run::events::{Reporter, RunEvent};
use crate::run::{RunRequest, Setup};
use crate::shard::coordinator::ShardEvent;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// The longest line kept of a running trial's last event.
const LAST_EVENT_CHARS: usize = 160;

/// How long `POST /api/v1/runs` waits for the run to be prepared and named.
const START_WAIT: Duration = Duration::from_secs(120);

/// A trial that finished, as the page lists it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FinishedTrial {
    #[serde(flatten)]
    pub key: TrialKey,
    /// `collected` (its trace came back; grading comes at the end) or `infra`.
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// A trial still running: how many events it has streamed and the last one, in a line.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunningTrial {
    #[serde(flatten)]
    pub key: TrialKey,
    pub events: u64,
    pub last: String,
}

/// What the page polls: `GET /api/v1/runs/{id}/live?since=N`.
#[derive(Debug, Clone, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchRunState {
    /// Known once the run is prepared.
    pub run_id: Option<String>,
    pub eval: Option<String>,
    /// Trials this collection runs.
    pub total: u64,
    pub collected: u64,
    pub infra: u64,
    /// Finished trials in the order they finished (a poll gets those from `since` on).
    pub finished: Vec<FinishedTrial>,
    /// `finished`'s length: the next poll's `since`.
    pub next: usize,
    pub running: Vec<RunningTrial>,
    /// Collection, grading and the result files are done (or the run failed).
    pub done: bool,
    /// The run's exit code (0 all passed, 1 some case did not, 2 the run could not complete).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u8>,
    /// Why the run failed, when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One batch run, heard as its reporter.
#[derive(Default)]
pub struct BatchRun {
    state: Mutex<Inner>,
    changed: Condvar,
}

#[derive(Default)]
struct Inner {
    state: BatchRunState,
    running: BTreeMap<TrialKey, RunningTrial>,
}

impl BatchRun {
    /// The run's state, with the finished trials from `since` on.
    pub fn snapshot(&self, since: usize) -> BatchRunState {
        let inner = self.state.lock().expect("live run");
        let mut state = BatchRunState {
            finished: inner
                .state
                .finished
                .get(since..)
                .map(<[_]>::to_vec)
                .unwrap_or_default(),
            running: inner.running.values().cloned().collect(),
            ..BatchRunState::default()
        };
        let all = &inner.state;
        state.run_id.clone_from(&all.run_id);
        state.eval.clone_from(&all.eval);
        state.total = all.total;
        state.collected = all.collected;
        state.infra = all.infra;
        state.next = all.finished.len();
        state.done = all.done;
        state.exit_code = all.exit_code;
        state.error.clone_from(&all.error);
        state
    }

    /// Whether collection, grading and the result files are done (or the run failed).
    pub fn is_done(&self) -> bool {
        self.state.lock().expect("live run").state.done
    }

    /// The run's id, once it has one.
    pub fn run_id(&self) -> Option<String> {
        self.state.lock().expect("live run").state.run_id.clone()
    }

    /// Marks the run over: `error` when it failed before finishing.
    pub fn end(&self, error: Option<String>) {
        let mut inner = self.state.lock().expect("live run");
        inner.state.done = true;
        if error.is_some() {
            inner.state.error = error;
            inner.state.exit_code = Some(2);
        }
        inner.running.clear();
        self.changed.notify_all();
    }

    /// Waits until the run has an id or is over, at most `limit`.
    fn wait_named(&self, limit: Duration) -> BatchRunState {
        let inner = self.state.lock().expect("live run");
        let (inner, _) = self
            .changed
            .wait_timeout_while(inner, limit, |i| i.state.run_id.is_none() && !i.state.done)
            .expect("live run");
        drop(inner);
        self.snapshot(usize::MAX)
    }

    fn finish_trial(&self, key: &TrialKey, status: &'static str, reason: Option<String>) {
        let mut inner = self.state.lock().expect("live run");
        inner.running.remove(key);
        match status {
            "infra" => inner.state.infra += 1,
            _ => inner.state.collected += 1,
        }
        inner.state.finished.push(FinishedTrial {
            key: key.clone(),
            status,
            reason,
        });
    }
}

impl Reporter for BatchRun {
    fn event(&self, event: &RunEvent<'_>) {
        match event {
            RunEvent::Started { run_id, total, .. } => {
                let mut inner = self.state.lock().expect("live run");
                inner.state.run_id = Some(run_id.to_string());
                inner.state.total = *total;
                self.changed.notify_all();
            }
            RunEvent::Shard(ShardEvent::TraceEvent {
                key, seq, event, ..
            }) => {
                let last = event.as_ref().map_or_else(
                    || "an event too large to stream (see the trace)".to_string(),
                    |e| e.summary(LAST_EVENT_CHARS),
                );
                let mut inner = self.state.lock().expect("live run");
                inner.running.insert(
                    key.clone(),
                    RunningTrial {
                        key: key.clone(),
                        events: seq + 1,
                        last: crate::secrets::clean_text(&last),
                    },
                );
            }
            RunEvent::Shard(ShardEvent::TrialCollected { key, .. }) => {
                self.finish_trial(key, "collected", None)
            }
            RunEvent::Shard(ShardEvent::TrialInfra { key, reason, .. }) => {
                self.finish_trial(key, "infra", Some(crate::secrets::clean_text(reason)))
            }
            RunEvent::Finished(outcome) => {
                let mut inner = self.state.lock().expect("live run");
                inner.state.eval = Some(outcome.record.eval.clone());
                inner.state.exit_code = Some(outcome.summary.exit_code());
            }
            _ => {}
        }
    }
}

/// `POST /api/v1/runs`: which trials to run (all of the eval's by default).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRun {
    /// Only these variants.
    #[serde(default)]
    pub variants: Vec<String>,
    /// Only these case ids.
    #[serde(default)]
    pub cases: Vec<String>,
    /// Repetitions of each case, overriding the config.
    #[serde(default)]
    pub trials: Option<u32>,
}

/// What starts runs from the UI: the eval and the set-up `mst serve` was given, and how many
/// may run at once.
struct Starter {
    home: Home,
    setup: Setup,
    /// `--max-runs`.
    max_runs: usize,
    /// Why runs cannot start here at all, when they cannot (a model budget they would not be
    /// charged to).
    refused: Option<String>,
    /// Held while a run is checked against `max_runs` and added to the live ones.
    admitting: Mutex<()>,
}

/// How many finished runs this process keeps following before it lets go of the oldest (their
/// results stay on disk, where `GET /api/v1/runs/{id}` reads them), so a long-lived server's
/// memory does not grow with every run it has seen.
pub const FINISHED_RUNS_KEPT: usize = 16;

/// The most repetitions of each case a run started from the API may ask for.
pub const MAX_API_TRIALS: u32 = 1000;

/// The live runs of this process.
#[derive(Default)]
pub struct BatchRuns {
    runs: Mutex<Vec<Arc<BatchRun>>>,
    starter: Option<Starter>,
    /// Set on shutdown: every run started here stops its shards.
    cancel: Arc<AtomicBool>,
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl BatchRuns {
    /// Live runs that `POST /api/v1/runs` can start, of `setup`'s eval, at most `max_runs` at
    /// once; none when the server has a model budget (`budgeted`), which batch runs are not
    /// charged to.
    pub fn starting(home: &Home, setup: &Setup, max_runs: usize, budgeted: bool) -> Self {
        let refused = budgeted.then(|| {
            "this server has a model budget (--budget-tokens, --budget-cost), and runs started \
             here are not charged to it: start the run with `mst run`, or serve without a budget"
                .to_string()
        });
        BatchRuns {
            starter: Some(Starter {
                home: home.clone(),
                setup: setup.clone(),
                max_runs,
                refused,
                admitting: Mutex::new(()),
            }),
            ..BatchRuns::default()
        }
    }

    /// Whether runs can be started here (`mst serve`; not `mst run --serve`).
    pub fn can_start(&self) -> bool {
        self.starter.is_some()
    }

    /// Follows `run` (started here, or elsewhere in this process: `mst run --serve`), letting
    /// go of the oldest finished runs past [`FINISHED_RUNS_KEPT`].
    pub fn track(&self, run: Arc<BatchRun>) {
        let mut runs = self.runs.lock().expect("live runs");
        runs.push(run);
        let finished = runs.iter().filter(|r| r.is_done()).count();
        let mut excess = finished.saturating_sub(FINISHED_RUNS_KEPT);
        // Oldest first: they were pushed in the order they started.
        runs.retain(|run| match excess > 0 && run.is_done() {
            true => {
                excess -= 1;
                false
            }
            false => true,
        });
    }

    /// The live run named `run_id`.
    pub fn get(&self, run_id: &str) -> Option<Arc<BatchRun>> {
        self.runs
            .lock()
            .expect("live runs")
            .iter()
            .find(|r| r.run_id().as_deref() == Some(run_id))
            .cloned()
    }

    /// Every live run's state (without its finished trials), newest first.
    pub fn list(&self) -> Vec<BatchRunState> {
        let runs = self.runs.lock().expect("live runs");
        runs.iter().rev().map(|r| r.snapshot(usize::MAX)).collect()
    }

    /// Starts a batch run of the served eval in the background, and waits until it is
    /// prepared: its state (with its id), or why it could not start.
    pub fn start(&self, request: StartRun) -> Result<BatchRunState, ServeError> {
        let starter = self.starter.as_ref().ok_or_else(|| {
            ServeError::not_found(
                "this server follows one run (`mst run --serve`); start runs from `mst serve`",
            )
        })?;
        if let Some(why) = &starter.refused {
            return Err(ServeError::payment_required(why.clone()));
        }
        if request.trials.is_some_and(|n| n > MAX_API_TRIALS) {
            return Err(ServeError::too_large(format!(
                "`trials` is at most {MAX_API_TRIALS} for a run started here; start a larger \
                 one with `mst run --trials`"
            )));
        }
        let admitting = starter.admitting.lock().expect("admitting runs");
        let running = (self.runs.lock().expect("live runs").iter())
            .filter(|run| !run.is_done())
            .count();
        if running >= starter.max_runs {
            return Err(ServeError::too_many(format!(
                "{running} runs started here are still running, the most this server allows at \
                 once (--max-runs {}): wait for one to end",
                starter.max_runs
            )));
        }
        let live = Arc::new(BatchRun::default());
        let run_request = RunRequest {
            setup: starter.setup.clone(),
            filters: crate::eval::plan::Filters {
                variants: request.variants,
                cases: request.cases,
                trials: request.trials,
            },
            collector: crate::results::run_process::Collector::Server,
            ..RunRequest::default()
        };
        let (home, reporter, cancel) = (starter.home.clone(), live.clone(), self.cancel.clone());
        let thread = std::thread::spawn(move || {
            // A panic still ends the run, so it stops counting against `--max-runs`.
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                crate::run::run(&home, &run_request, reporter.as_ref(), &cancel)
            }));
            reporter.end(match outcome {
                Ok(Ok(_)) => None,
                Ok(Err(e)) => Some(format!("{e:#}")),
                Err(_) => Some("the run stopped on an internal error (a panic)".into()),
            });
        });
        let mut threads = self.threads.lock().expect("live runs");
        // Runs that ended need no joining at shutdown.
        threads.retain(|t| !t.is_finished());
        threads.push(thread);
        drop(threads);
        self.track(live.clone());
        drop(admitting);
        let state = live.wait_named(START_WAIT);
        match (&state.run_id, &state.error) {
            (Some(_), _) => Ok(state),
            (None, Some(error)) => Err(ServeError::bad_request(format!(
                "the run could not start: {error}"
            ))),
            (None, None) => Err(ServeError::machine(
                "the run was not ready within 120 s; it goes on, and `GET /api/v1/runs` lists it \
                 once it has started",
            )),
        }
    }

    /// Stops every run started here (on shutdown) and waits for them to write what they have.
    pub fn stop_all(&self) {
        self.cancel.store(true, Ordering::SeqCst);
        for thread in self.threads.lock().expect("live runs").drain(..) {
            let _ = thread.join();
        }
    }
}
