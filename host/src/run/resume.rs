//! A run's directory and record: a new run, or the run `--resume` continues.

use super::events::{Reporter, RunEvent};
use super::prepare::{self, Prepared};
use super::RunRequest;
use crate::eval::plan;
use crate::results::{self, ResultsRoot, RunDir, RunRecord};
use crate::runner::RunnerOptions;
use anyhow::{bail, Context, Result};

/// The run directory and record to collect into: the run `--resume` names (checked to be of
/// this eval), or a new run with its trials planned. The directory exists and holds the record
/// when this returns.
pub fn open(
    root: &ResultsRoot,
    request: &RunRequest,
    prepared: &Prepared,
    runner_options: &RunnerOptions,
    reporter: &dyn Reporter,
) -> Result<(RunDir, RunRecord)> {
    let config = &prepared.config;
    let (dir, record) = match &request.resume {
        Some(run_id) => {
            let dir = root.run(&config.name, run_id);
            let mut record = dir
                .read_record()
                .with_context(|| format!("--resume {run_id}"))?;
            if record.eval != config.name {
                bail!(
                    "--resume {run_id}: that run is of eval `{}`, not `{}`",
                    record.eval,
                    config.name
                );
            }
            let changed = changes_since(&record, request, prepared, runner_options);
            if !changed.is_empty() && !request.force {
                bail!(
                    "--resume {run_id}: {} since the run's first collection, so its traces would \
                     not be comparable; start a new run, or add --force to resume anyway",
                    changed.join("; ")
                );
            }
            if record.config_hash != prepared.config_hash {
                reporter.event(&RunEvent::ConfigChanged);
            }
            // New traces go to the trace log: a run of format 1 resumed is of format 2 now
            // (its earlier traces stay in their files, which this build still reads).
            record.format = results::RUN_FORMAT;
            record.workspaces = prepared.workspaces.records.clone();
            record.trials = std::mem::take(&mut record.trials).sharing_ids(prepared.cases.ids());
            (dir, record)
        }
        None => {
            let trials = plan::plan(config, &prepared.cases, &request.filters)?;
            let run_id = results::layout::new_run_id();
            let record = RunRecord {
                git: prepare::git_state(&prepared.base),
                filters: request.filters.clone(),
                trials,
                ..prepared.run_record(
                    &run_id,
                    &request.setup.config_path,
                    &request.setup.runner,
                    runner_options,
                )
            };
            (root.run(&config.name, &run_id), record)
        }
    };
    crate::home::create_private_dir(&dir.root)?;
    dir.write_record(&record)?;
    Ok((dir, record))
}

/// The runner options that change what a trial finds on its machine (its image, network,
/// limits, sandbox); the others say where machines run or how long they are kept, which a
/// resume may change (a host that died is replaced by another).
const TRIAL_OPTIONS: &[&str] = &[
    "image",
    "network",
    "memory",
    "cpus",
    "pids",
    "nofile",
    "rootfs",
    "isolation",
    "expose",
];

/// What differs between a stored run and the one about to resume it, that would make its
/// traces incomparable: the shard count, the runner, the datasets' content, a plugin's code.
fn changes_since(
    record: &RunRecord,
    request: &RunRequest,
    prepared: &Prepared,
    runner_options: &RunnerOptions,
) -> Vec<String> {
    let mut changed = Vec::new();
    if record.shards != runner_options.shards {
        changed.push(format!(
            "the shard count changed ({} then, {} now)",
            record.shards, runner_options.shards
        ));
    }
    if record.runner != request.setup.runner {
        changed.push(format!(
            "the runner changed (`{}` then, `{}` now)",
            record.runner, request.setup.runner
        ));
    }
    for option in TRIAL_OPTIONS {
        let (then, now) = (
            record.runner_options.get(*option),
            runner_options.rest.get(*option),
        );
        if then != now {
            let shown =
                |value: Option<&String>| value.map_or("unset".to_string(), |v| format!("`{v}`"));
            changed.push(format!(
                "the runner option `{option}` changed ({} then, {} now)",
                shown(then),
                shown(now)
            ));
        }
    }
    if record.dataset_hash != prepared.cases.content_hash {
        changed.push("the datasets' content changed".to_string());
    }
    let digests = |records: &[crate::workspace::WorkspaceRecord]| -> Vec<String> {
        records.iter().map(|r| r.packed.digest.clone()).collect()
    };
    if digests(&record.workspaces) != digests(&prepared.workspaces.records) {
        changed.push("a workspace's files changed".to_string());
    }
    let now = prepared.plugin_records();
    for before in &record.plugins {
        match now
            .iter()
            .find(|p| p.name == before.name && p.kind == before.kind)
        {
            Some(after) if after.digest != before.digest => changed.push(format!(
                "plugin `{}` changed (digest {} then, {} now)",
                before.name, before.digest, after.digest
            )),
            Some(_) => {}
            None => changed.push(format!("plugin `{}` is no longer loaded", before.name)),
        }
    }
    changed
}
