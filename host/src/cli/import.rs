//! `mst import …`: converting evals written for other harnesses into mst's files.

use super::Exit;
use anyhow::Result;
use clap::Subcommand;
use std::path::PathBuf;

/// `mst import …`
#[derive(Subcommand, Debug)]
pub enum ImportCommand {
    /// Convert an MST (gleanwork/mcp-server-tester) eval config with its datasets, or a dataset
    /// alone (2.0, and 1.x with direct-mode cases), into mst's eval.json and .jsonl files, with
    /// import-report.md listing every rewrite, approximation and dropped feature. Exits 2 when a
    /// case would lose all its checks.
    Mst {
        /// The MST eval config or dataset (JSON).
        file: PathBuf,
        #[command(flatten)]
        output: Output,
    },
    /// Convert a Harbor task directory (task.toml, instruction.md, environment/, tests/,
    /// solution/), or a directory of them, into an eval for the Docker runner: each task a case
    /// in its own image with its tests hidden until the agent is done, and Harbor's reference
    /// agents `oracle` and `nop` as variants; with import-report.md.
    Harbor {
        /// A task directory, or a directory of task directories.
        dir: PathBuf,
        #[command(flatten)]
        output: Output,
    },
}

/// Where and how an import writes what it converted.
#[derive(clap::Args, Debug)]
pub struct Output {
    /// Where to write the converted files [default: the current directory].
    #[arg(long, value_name = "DIR", default_value = ".")]
    out: PathBuf,
    /// Overwrite files already in --out.
    #[arg(long)]
    force: bool,
    /// Print the report as JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// Runs a `mst import` command.
pub fn run(command: ImportCommand) -> Result<u8> {
    let (imported, Output { out, force, json }) = match command {
        ImportCommand::Mst { file, output } => (crate::import::mst::import(&file)?, output),
        ImportCommand::Harbor { dir, output } => (crate::import::harbor::import(&dir)?, output),
    };
    let written = imported.write(&out, force)?;
    let report = &imported.report;
    if json {
        let value = serde_json::json!({
            "files": written,
            "report": out.join(crate::import::REPORT_FILE),
            "notes": report.notes,
            "todo": report.todo,
            "casesWithoutChecks": report.cases_without_checks,
        });
        outln!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        out!("{}", report.to_markdown(&written));
    }
    if report.cases_without_checks.is_empty() {
        return Ok(super::Code::Success.into());
    }
    // The files are written, but a case that lost every check would pass whatever the client
    // does: refused, so a script does not run it unawares.
    Err(Exit::refused(anyhow::anyhow!(
        "{} case(s) lost every check in conversion and would pass whatever the client does: {} \
             (add judges to them by hand; see {})",
        report.cases_without_checks.len(),
        report.cases_without_checks.join(", "),
        out.join(crate::import::REPORT_FILE).display()
    )))
}
