//! Whether a run is still being collected. The mst process collecting into a run records itself
//! in the run's directory (`process.json`) and, when it ends, how; so `mst runs list` tells a
//! run that goes on from one whose process died (`interrupted`, for `--resume`). A detached
//! run's supervisor also logs its progress there (`progress.jsonl`), which `mst runs attach`
//! follows.

use crate::owner::Owner;
use serde::{Deserialize, Serialize};

/// `process.json`: the process collecting into a run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunProcess {
    pub owner: Owner,
    /// Which kind of mst process it is.
    pub collector: Collector,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    /// When it ended (absent while it runs, and when it died without saying).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<u64>,
    /// `mst run`'s exit code, once it ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u8>,
}

/// Which kind of mst process collects a run: what `mst runs attach` and `mst runs stop` may
/// do with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Collector {
    /// `mst run` on a terminal.
    #[default]
    Terminal,
    /// The supervisor of `mst run --detach`: no terminal, its progress logged.
    Supervisor,
    /// `mst serve` (a run started from the web UI): stopping the process would stop the
    /// server.
    Server,
}

/// Where a run stands, as `mst runs list` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum RunState {
    /// Its process is collecting (or one on another machine may be: this one cannot tell).
    Running,
    /// Its process is gone without ending the run: `mst run --resume` collects what it lacks.
    Interrupted,
    /// Its process ended the run.
    Ended,
}

impl std::fmt::Display for RunState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            RunState::Running => "running",
            RunState::Interrupted => "interrupted",
            RunState::Ended => "ended",
        })
    }
}

impl RunProcess {
    /// This process, starting now.
    pub fn current(collector: Collector) -> Self {
        RunProcess {
            owner: Owner::current(),
            collector,
            started_at: crate::clock::unix_secs(),
            ended_at: None,
            exit_code: None,
        }
    }

    /// Where the run stands, as seen from this process.
    pub fn state(&self) -> RunState {
        match self.ended_at {
            Some(_) => RunState::Ended,
            None if self.owner.is_gone(&Owner::current()) => RunState::Interrupted,
            None => RunState::Running,
        }
    }
}

/// One stored run as `mst runs list --json` and the web UI's `GET /api/v1/runs` list it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunListing {
    pub run_id: String,
    pub eval: String,
    pub created_at: u64,
    pub trials: usize,
    pub runner: String,
    /// Where it stands; `None` without a process record (a run or playground session of an
    /// older mst).
    pub state: Option<RunState>,
    pub collect: crate::results::Phase,
    pub grade: crate::results::Phase,
    /// Each variant's pass rate, from `summary.json` (empty before the run is graded).
    pub pass_rates: std::collections::BTreeMap<String, Option<f64>>,
    /// The commit of the repository holding the config, when it is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub commit: Option<String>,
}

/// The part of `summary.json` a listing reads.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedSummary {
    variants: std::collections::BTreeMap<String, ListedVariant>,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListedVariant {
    pass_rate: Option<f64>,
}

impl RunListing {
    /// Run `record`, stored in `dir`.
    pub fn of(dir: &crate::results::RunDir, record: &crate::results::RunRecord) -> Self {
        RunListing {
            run_id: record.run_id.clone(),
            eval: record.eval.clone(),
            created_at: record.created_at,
            trials: record.trials.len(),
            runner: record.runner.clone(),
            state: dir.read_process().ok().flatten().map(|p| p.state()),
            collect: record.collect,
            grade: record.grade,
            pass_rates: crate::files::read_json_file::<ListedSummary>(
                &dir.root.join("summary.json"),
            )
            .map(|s| {
                (s.variants.into_iter())
                    .map(|(v, x)| (v, x.pass_rate))
                    .collect()
            })
            .unwrap_or_default(),
            commit: record.git.as_ref().map(|git| git.commit.clone()),
        }
    }
}

/// One line of a detached run's `progress.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "event")]
pub enum Progress {
    /// The run will collect `total` trials.
    #[serde(rename_all = "camelCase")]
    Started { total: u64, resumed: bool },
    /// A trial's trace came back (`collected`) or it was an infrastructure failure.
    Trial { trial: String, collected: bool },
    /// A line worth a person's attention (the runner's plan, a shard that ended early).
    Note { message: String },
    /// The run ended: `mst run`'s exit code and the summary it printed.
    #[serde(rename_all = "camelCase")]
    Finished { exit_code: u8, summary: String },
    /// The run stopped on an error after it started.
    #[serde(rename_all = "camelCase")]
    Failed { exit_code: u8, error: String },
}
