//! The `mst` command line: argument parsing, logging set-up, and turning errors into messages
//! and exit codes. Each command group lives in its own module.

/// `println!` to stdout that exits quietly when the reader has gone away (see [`write_stdout`]).
macro_rules! outln {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` to stdout that exits quietly when the reader has gone away (see [`write_stdout`]).
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::cli::write_stdout(format_args!($($arg)*))
    };
}

/// `eprintln!` through [`write_stderr`]: held secrets redacted, control characters escaped.
macro_rules! errln {
    ($($arg:tt)*) => {
        $crate::cli::write_stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

mod detach;
mod import;
mod plugin;
mod power;
mod progress;
mod report;
mod run;
mod runner;
mod runs;
mod scaffold;
mod serve;

use crate::home::Home;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

/// Run evaluations of agents, tools and MCP servers with sandboxed WebAssembly plugins.
#[derive(Parser, Debug)]
#[command(name = "mst", version, about, propagate_version = true)]
struct Cli {
    /// Where mst keeps installed plugins and its compile cache [default: ~/.mst].
    #[arg(long, global = true, env = "MST_HOME", value_name = "DIR")]
    home: Option<PathBuf>,

    /// More log output (-v info, -vv debug); `MST_LOG` takes a full filter instead.
    #[arg(short, long, global = true, action = clap::ArgAction::Count)]
    verbose: u8,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run an eval: collect trials on a runner's machines, grade them, report.
    Run(Box<run::RunArgs>),
    /// Regrade a stored run's traces into RUN_ID.g1 (then .g2, …).
    Grade(Box<run::GradeArgs>),
    /// The playground: an HTTP API for sessions on a runner's machines, tasks one at a time,
    /// live traces.
    Serve(Box<serve::ServeArgs>),
    /// Write a run's report: one self-contained HTML file to open anywhere, offline.
    Report(report::ReportArgs),
    /// How many paired cases a comparison of two variants needs to detect a difference.
    Power(power::PowerArgs),
    /// List, show, compare and export stored runs.
    #[command(subcommand)]
    Runs(runs::RunsCommand),
    /// Convert evals written for another harness (`mst import mst FILE`).
    #[command(subcommand)]
    Import(import::ImportCommand),
    /// Check, install, inspect and try plugins.
    #[command(subcommand)]
    Plugin(Box<plugin::PluginCommand>),
    /// Prepare the hosts a runner uses (`mst runner setup docker`).
    #[command(subcommand)]
    Runner(runner::RunnerCommand),
    /// The worker: collect one shard's trials (started by a runner, speaks mst.shard/v1).
    #[command(hide = true)]
    Collect {
        #[arg(long)]
        bundle: PathBuf,
        #[arg(long)]
        results: PathBuf,
    },
    /// A container's first process: waits, doing nothing, until it is stopped.
    #[command(hide = true)]
    Idle,
    /// The `sim` runner's channel: runs ARGV (`mst` is this program), each byte to it and
    /// from it arriving `latency-ms` later, at `bandwidth` bytes a second.
    #[command(hide = true)]
    SimLink {
        #[arg(long)]
        latency_ms: u64,
        #[arg(long)]
        bandwidth: Option<u64>,
        #[arg(last = true, required = true)]
        argv: Vec<String>,
    },
}

/// Writes to stdout, cleaned ([`crate::secrets::clean_text`]): what mst prints holds text from
/// plugins, workers and datasets, which must not act on the terminal nor show a secret. When
/// the reader has gone away (`mst runs list | head`) the command is over: mst exits at once,
/// quietly, with the status a pipeline expects of a program its reader stopped (128 +
/// SIGPIPE), instead of panicking on the broken pipe.
pub(crate) fn write_stdout(text: std::fmt::Arguments<'_>) {
    match text.as_str() {
        Some(text) => write_stdout_str(text),
        None => write_stdout_str(&text.to_string()),
    }
}

/// [`write_stdout`] for text already made: cleaned in place, not copied, when it is clean.
pub(crate) fn write_stdout_str(text: &str) {
    use std::io::Write;
    let text = crate::secrets::clean(text);
    let mut stdout = std::io::stdout().lock();
    let written = stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush());
    written.unwrap_or_else(|e| stdout_failed(e));
}

/// `value` on stdout as pretty JSON and a newline, cleaned as [`write_stdout`] cleans text,
/// and streamed: a run's summary of 100,000 cases is megabytes of JSON, never held as a string.
pub(crate) fn write_stdout_json(value: &impl serde::Serialize) {
    use std::io::Write;
    // The writer holds what it is given and passes it on in large chunks: no buffer beside it.
    let mut out = crate::secrets::clean_json_writer(std::io::stdout().lock());
    let written = serde_json::to_writer_pretty(&mut out, value)
        .map_err(std::io::Error::from)
        .and_then(|()| out.write_all(b"\n"))
        .and_then(|()| out.flush());
    written.unwrap_or_else(|e| stdout_failed(e));
}

/// Ends mst on a failed write to stdout: quietly with 141 when its reader has gone.
fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        Code::BrokenPipe.exit();
    }
    eprintln!("error: cannot write to stdout: {e}");
    Code::Failure.exit();
}

/// mst's exit codes (docs/cli.md, "Exit codes"). A command's own verdict (a run's, a plugin
/// check's) is one of `Success`, `Failure` and `Refused`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Code {
    /// Done, and nothing failed.
    Success = 0,
    /// Done with a verdict against (a failed case, an incompatible plugin), or an error.
    Failure = 1,
    /// Refused: a usage error, input mst cannot take, or a state that forbids the command
    /// (an unknown run, a run still collecting). Nothing was changed, but for `mst import`,
    /// which writes its files and then refuses when a case lost every check.
    Refused = 2,
    /// Stopped by Ctrl-C (128 + SIGINT).
    Interrupted = 130,
    /// stdout's reader went away (128 + SIGPIPE); mst ends quietly.
    BrokenPipe = 141,
}

impl Code {
    /// Ends the process now with this code.
    pub(crate) fn exit(self) -> ! {
        std::process::exit(i32::from(self as u8))
    }
}

impl From<Code> for u8 {
    fn from(code: Code) -> u8 {
        code as u8
    }
}

/// An error that carries the exit code it ends mst with (any other error ends it with
/// [`Code::Failure`]).
#[derive(Debug)]
pub(crate) struct Exit {
    code: u8,
    error: anyhow::Error,
}

impl Exit {
    /// `error` as a refusal ([`Code::Refused`]).
    pub(crate) fn refused(error: anyhow::Error) -> anyhow::Error {
        Exit::with(Code::Refused.into(), error)
    }

    /// `error`, ending mst with `code` (a verdict's code, such as a check report's).
    pub(crate) fn with(code: u8, error: anyhow::Error) -> anyhow::Error {
        anyhow::Error::new(Exit { code, error })
    }
}

impl std::fmt::Display for Exit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#}", self.error)
    }
}

impl std::error::Error for Exit {}

/// Writes to stderr, cleaned like [`write_stdout`].
pub(crate) fn write_stderr(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let text = crate::secrets::clean_text(&text.to_string());
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

/// Where log lines go: stderr, each line cleaned like [`write_stdout`] (a plugin's log line, a
/// worker's error).
struct CleanStderr;

impl std::io::Write for CleanStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        // The formatter hands over one whole event per write.
        std::io::stderr().write_all(&crate::secrets::clean_bytes(buf))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

fn init_logging(verbose: u8) {
    let default = match verbose {
        0 => "warn,mst::plugin::imports=info",
        1 => "info",
        _ => "debug",
    };
    let filter = std::env::var("MST_LOG").unwrap_or_else(|_| default.to_string());
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
        .with_writer(|| CleanStderr)
        // Colour codes would be escaped with everything else that could act on a terminal.
        .with_ansi(false)
        .with_target(false)
        .try_init();
}

/// Parses the command line, runs the command, and returns the process exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.verbose);
    let home = match cli.home.clone() {
        Some(dir) => Ok(Home::at(dir)),
        None => Home::from_env(),
    };
    let result = home.and_then(|home| match cli.command {
        Command::Run(args) => run::run(&home, *args),
        Command::Grade(args) => run::grade(&home, *args),
        Command::Report(args) => report::report(args),
        Command::Power(args) => power::power(args),
        Command::Runs(command) => runs::run(command),
        Command::Serve(args) => serve::run(&home, *args),
        Command::Import(command) => import::run(command),
        Command::Plugin(command) => plugin::run(&home, *command),
        Command::Runner(command) => runner::run(&home, command),
        Command::Idle => loop {
            std::thread::park();
        },
        Command::Collect { bundle, results } => {
            Ok(crate::shard::worker::collect(&bundle, &results))
        }
        Command::SimLink {
            latency_ms,
            bandwidth,
            argv,
        } => crate::runner::sim::link(Duration::from_millis(latency_ms), bandwidth, &argv),
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let code = error
                .downcast_ref::<Exit>()
                .map_or(Code::Failure.into(), |e| e.code);
            errln!("error: {error:#}");
            ExitCode::from(code)
        }
    }
}
