//! What a run tells as it goes: one typed stream of [`RunEvent`]s that progress output, the
//! dry run and the final summary read (as cargo-nextest's reporter reads its test events), so
//! no reader has to parse free text.

use super::RunOutcome;
use crate::shard::coordinator::{ShardEnd, ShardEvent};

/// One thing that happened in a run.
pub enum RunEvent<'a> {
    /// The run will collect `total` trials (fewer than planned when resuming).
    Started {
        run_id: &'a str,
        total: u64,
        resumed: bool,
    },
    /// The config changed since the run being resumed started; the new one is used.
    ConfigChanged,
    /// What the runner decided before any machine exists (hosts, capacity), one line.
    RunnerPlan(&'a str),
    /// What the runner says while it makes a machine (waiting for room, placing the worker).
    RunnerNote { shard: u32, message: &'a str },
    /// Something happened inside a shard.
    Shard(ShardEvent),
    /// A shard ended any way but `done`.
    ShardEnded {
        shard: u32,
        machine: &'a str,
        ended: &'a ShardEnd,
    },
    /// Disposing of a shard's machine failed.
    DisposeFailed { shard: u32, why: &'a str },
    /// Collection, grading and the result files are done.
    Finished(&'a RunOutcome),
    /// The run stopped on an error after it started (the run then returns it).
    Failed(&'a anyhow::Error),
}

/// Hears a run's events. Called from the shards' threads, so it must be `Sync`.
pub trait Reporter: Sync {
    /// One event, in the order it happened within its shard.
    fn event(&self, event: &RunEvent<'_>);

    /// The exit code the run's process gives for a run whose summary says `run_code`, once
    /// it heard `Finished`: the same, unless what the reporter did at the end failed (a
    /// `--junit` file it could not write). The run records it as its process's exit code.
    fn exit_code(&self, run_code: u8) -> u8 {
        run_code
    }
}

/// A reporter that hears nothing.
pub struct Silent;

impl Reporter for Silent {
    fn event(&self, _event: &RunEvent<'_>) {}
}

impl RunEvent<'_> {
    /// The line a person reads for this event, for those that are worth a line of their own
    /// (not a trial's progress, nor the end of the run).
    pub fn note(&self) -> Option<String> {
        match self {
            RunEvent::ConfigChanged => {
                Some("the config changed since this run started; resuming with the new one".into())
            }
            RunEvent::RunnerPlan(line) => Some(line.to_string()),
            RunEvent::RunnerNote { message, .. } => Some(message.to_string()),
            RunEvent::Shard(ShardEvent::TraceRefused { key, why, .. }) => Some(format!(
                "trial {key}: its trace could not be copied back: {why}; it counts as an \
                 infrastructure failure"
            )),
            RunEvent::Shard(ShardEvent::TraceNotCopied { key, why, .. }) => Some(format!(
                "trial {key}: its trace did not arrive: {why}; it stays missing (--resume \
                 collects it)"
            )),
            RunEvent::Shard(ShardEvent::InfraClaimOverruled { key, claim, .. }) => Some(format!(
                "trial {key}: the worker called it an infrastructure failure ({claim}), but \
                 its trace says the client ran; the trace counts"
            )),
            RunEvent::Shard(ShardEvent::ArtifactSkipped { key, why, .. }) => Some(format!(
                "trial {key}: an artefact did not come back: {why}"
            )),
            RunEvent::Shard(ShardEvent::NoToken { shard, server }) => {
                Some(format!("shard {shard}: no token for server `{server}`"))
            }
            RunEvent::ShardEnded {
                shard,
                machine,
                ended,
            } => Some(format!("shard {shard} ({machine}): {ended}")),
            RunEvent::DisposeFailed { shard, why } => Some(format!(
                "shard {shard}: cannot dispose of its machine: {why}"
            )),
            RunEvent::Started { .. }
            | RunEvent::Shard(ShardEvent::TraceEvent { .. })
            | RunEvent::Shard(ShardEvent::TrialCollected { .. })
            | RunEvent::Shard(ShardEvent::TrialInfra { .. })
            // Only conversation turns send one (a batch run's bundle refuses it); never shown.
            | RunEvent::Shard(ShardEvent::ResumeToken { .. })
            | RunEvent::Finished(_)
            | RunEvent::Failed(_) => None,
        }
    }
}
