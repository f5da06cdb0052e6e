//! `mst report`: a run as one self-contained HTML file.

use crate::results::ResultsRoot;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;

/// `mst report RUN_ID`.
#[derive(Args, Debug)]
pub(crate) struct ReportArgs {
    /// The run (or playground session) to report on.
    run_id: String,
    /// Compare with this earlier run of the same eval: what was fixed, what broke (as
    /// `mst runs diff BASELINE RUN_ID`).
    #[arg(long, value_name = "RUN_ID")]
    baseline: Option<String>,
    /// Where to write the report [default: the run directory's report.html].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// Where runs are stored.
    #[arg(long, default_value = ".mst/results", value_name = "DIR")]
    results_dir: PathBuf,
    /// Print what was written as JSON.
    #[arg(long)]
    json: bool,
}

/// Writes the report of a stored run.
pub(crate) fn report(args: ReportArgs) -> Result<u8> {
    let root = ResultsRoot::new(&args.results_dir);
    let refused = super::Exit::refused;
    let dir = root.find(&args.run_id).map_err(refused)?;
    let baseline = args
        .baseline
        .as_deref()
        .map(|id| root.find(id))
        .transpose()
        .map_err(refused)?;
    let written =
        crate::view::html::write(&dir, args.out.as_deref(), baseline.as_ref()).map_err(refused)?;
    if args.json {
        outln!("{}", serde_json::to_string_pretty(&written)?);
    } else {
        outln!(
            "wrote the report of run {} ({} trials, {} KiB) to {}",
            written.run_id,
            written.trials,
            written.bytes.div_ceil(1024),
            written.path.display()
        );
    }
    Ok(super::Code::Success.into())
}
