//! `mst runs …`: the stored runs listed, followed, stopped, shown, read as cases, compared
//! and exported, one function per subcommand.

use super::progress::{print_summary, summary_text, Reporter};
use super::run::CANCEL;
use crate::results::{self, ResultsRoot};
use anyhow::Result;
use clap::Subcommand;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

/// `mst runs …`.
#[derive(Subcommand, Debug)]
pub(crate) enum RunsCommand {
    /// List stored runs, newest last.
    List {
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Follow a detached run until it ends, then print its summary and exit with its code;
    /// Ctrl-C leaves it going.
    Attach {
        run_id: String,
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
    },
    /// Stop a running run (detached or not) as Ctrl-C would: its shards get `cancel`, the
    /// grace, then a kill; waits for it to end and prints its summary.
    Stop {
        run_id: String,
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
        /// How long to wait for the run to end.
        #[arg(long, default_value_t = 120.0, value_name = "SECONDS")]
        wait: f64,
        #[arg(long)]
        json: bool,
    },
    /// Show one run's summary and what did not pass.
    Show {
        run_id: String,
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Print the cases of a run's (or a playground session's) trials as JSONL, one case per
    /// line, ready for a dataset file.
    Cases {
        run_id: String,
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
    },
    /// What changed from RUN_A to RUN_B (two runs of one eval), per variant and case: broke,
    /// fixed, flaky, still failing, added, removed. Exit 1 when a case broke, 2 when the runs
    /// cannot be compared.
    Diff {
        /// The earlier run (before).
        run_a: String,
        /// The later run (after).
        run_b: String,
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
        /// Print the comparison as JSON (`docs/results.md`).
        #[arg(long)]
        json: bool,
    },
    /// Write one run in another tool's run layout: `mst.run/v1` (MST's) into an empty DIR.
    Export {
        run_id: String,
        /// The layout to write; `mst.run/v1` is the only one today.
        #[arg(long)]
        format: String,
        /// Where to write it: a new or empty directory (MST's eval directory: `latest.json`
        /// and `runs/<id>/`).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        #[arg(long, default_value = ".mst/results", value_name = "DIR")]
        results_dir: PathBuf,
        /// Print what was written (run ids, files) as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs one `mst runs` subcommand; its exit code.
pub(crate) fn run(command: RunsCommand) -> Result<u8> {
    match command {
        RunsCommand::List { results_dir, json } => list(&results_dir, json),
        RunsCommand::Attach {
            run_id,
            results_dir,
        } => attach(&run_id, &results_dir),
        RunsCommand::Stop {
            run_id,
            results_dir,
            wait,
            json,
        } => stop(&run_id, &results_dir, wait, json),
        RunsCommand::Show {
            run_id,
            results_dir,
            json,
        } => show(&run_id, &results_dir, json),
        RunsCommand::Cases {
            run_id,
            results_dir,
        } => cases(&run_id, &results_dir),
        RunsCommand::Diff {
            run_a,
            run_b,
            results_dir,
            json,
        } => diff(&run_a, &run_b, &results_dir, json),
        RunsCommand::Export {
            run_id,
            format,
            out,
            results_dir,
            json,
        } => export(&run_id, &format, &out, &results_dir, json),
    }
}

/// `mst runs list`.
fn list(results_dir: &Path, json: bool) -> Result<u8> {
    let runs = ResultsRoot::new(results_dir).list();
    if json {
        outln!("{}", serde_json::to_string_pretty(&runs)?);
        return Ok(super::Code::Success.into());
    }
    outln!(
        "{:<24} {:<24} {:>7} {:<11} {:<9} {:<8} PASS RATES",
        "RUN",
        "EVAL",
        "TRIALS",
        "STATE",
        "COLLECT",
        "GRADE"
    );
    for r in &runs {
        let rates: Vec<String> = (r.pass_rates.iter())
            .map(|(variant, rate)| match rate {
                Some(rate) => format!("{variant} {:.1}%", rate * 100.0),
                None => format!("{variant} -"),
            })
            .collect();
        outln!(
            "{:<24} {:<24} {:>7} {:<11} {:<9} {:<8} {}",
            r.run_id,
            r.eval,
            r.trials,
            r.state.map_or("-".to_string(), |s| s.to_string()),
            r.collect,
            r.grade.to_string(),
            rates.join(", ")
        );
    }
    Ok(super::Code::Success.into())
}

/// `mst runs attach`: Ctrl-C stops the following, not the run.
fn attach(run_id: &str, results_dir: &Path) -> Result<u8> {
    let dir = ResultsRoot::new(results_dir).find(run_id)?;
    let _ = ctrlc::set_handler(|| CANCEL.store(true, Ordering::SeqCst));
    super::detach::attach(&dir, &Reporter::following(), &CANCEL).map_err(super::Exit::refused)
}

/// `mst runs stop`, waiting at most `wait` seconds for the run to end.
fn stop(run_id: &str, results_dir: &Path, wait: f64, json: bool) -> Result<u8> {
    let dir = ResultsRoot::new(results_dir).find(run_id)?;
    let wait = crate::eval::config::seconds("--wait", wait)?;
    let ended = super::detach::stop(&dir, wait).map_err(super::Exit::refused)?;
    let code = ended.exit_code.unwrap_or(0);
    if json {
        outln!(
            "{}",
            serde_json::json!({"runId": run_id, "state": ended.state(), "exitCode": code})
        );
    } else {
        if let Ok(stored) = results::stored::StoredRun::read(&dir) {
            out!(
                "{}",
                summary_text(&stored.summary, &stored.grades, false, &dir)
            );
        }
        outln!("stopped run {run_id} (exit code {code})");
    }
    Ok(super::Code::Success.into())
}

/// `mst runs show`.
fn show(run_id: &str, results_dir: &Path, json: bool) -> Result<u8> {
    let dir = ResultsRoot::new(results_dir).find(run_id)?;
    let stored = results::stored::StoredRun::read(&dir)?;
    print_summary(&stored.summary, &stored.grades, json, &dir);
    Ok(super::Code::Success.into())
}

/// `mst runs cases`: one JSON case per line.
fn cases(run_id: &str, results_dir: &Path) -> Result<u8> {
    let dir = ResultsRoot::new(results_dir).find(run_id)?;
    let record = dir.read_record()?;
    record
        .refuse_conversation("read as cases")
        .map_err(super::Exit::refused)?;
    for case in dir.cases(&record) {
        outln!("{}", serde_json::to_string(&case)?);
    }
    Ok(super::Code::Success.into())
}

/// `mst runs diff`: 1 when a case broke, 2 when the runs cannot be compared.
fn diff(run_a: &str, run_b: &str, results_dir: &Path, json: bool) -> Result<u8> {
    let compared = (|| {
        let root = ResultsRoot::new(results_dir);
        let a = results::stored::StoredRun::read(&root.find(run_a)?)?;
        let b = results::stored::StoredRun::read(&root.find(run_b)?)?;
        results::diff::RunDiff::between(&a, &b)
    })();
    let diff = compared.map_err(super::Exit::refused)?;
    match json {
        true => outln!("{}", serde_json::to_string_pretty(&diff)?),
        false => out!("{}", diff.text()),
    }
    Ok(u8::from(diff.broke()))
}

/// `mst runs export`.
fn export(run_id: &str, format: &str, out: &Path, results_dir: &Path, json: bool) -> Result<u8> {
    let root = ResultsRoot::new(results_dir);
    let exported = results::export::export(&root, run_id, format, out)?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&exported)?);
    } else {
        outln!(
            "exported run {} as {} run {} into {} ({} files)",
            exported.run_id,
            exported.format,
            exported.exported_run_id,
            exported.out.display(),
            exported.files.len()
        );
    }
    Ok(super::Code::Success.into())
}
