//! `mst run`, `mst grade` and `mst runs …`; detached runs are [`super::detach`]'s.

use super::plugin::SandboxArgs;
use crate::eval::trial::TrialKey;
use crate::grade::Grades;
use crate::home::Home;
use crate::results::live::{Collector, Progress};
use crate::results::{self, report, ResultsRoot};
use crate::run::events::{self, RunEvent};
use crate::run::{self, RunRequest};
use crate::shard::coordinator::{ShardEvent, ShardSettings};
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Set by Ctrl-C: shards send `cancel`, wait a grace period, then kill.
static CANCEL: AtomicBool = AtomicBool::new(false);

/// Set once the run is over and `--serve` only serves its report: Ctrl-C then just stops that.
static SERVING_ONLY: AtomicBool = AtomicBool::new(false);

/// What `mst run` and `mst serve` share: the eval, its plugins and secrets, the runner and
/// where results go.
#[derive(Args, Debug)]
pub(crate) struct SetupArgs {
    /// The eval config.
    #[arg(long, short = 'c', default_value = "eval.json")]
    pub(crate) config: PathBuf,
    /// Load a plugin (.wasm file or installed name). Repeatable.
    #[arg(long = "plugin", value_name = "PLUGIN")]
    plugins: Vec<String>,
    /// Where machines come from: `local`, `docker`, or a runner plugin's name (loaded with
    /// --plugin or installed).
    #[arg(long, default_value = "local")]
    runner: String,
    /// A runner option, key=value (`shards`, `keep`, and the runner's own). Repeatable.
    #[arg(long = "runner-option", value_name = "KEY=VALUE")]
    runner_options: Vec<String>,
    /// Where runs (and playground sessions) are stored.
    #[arg(long, default_value = ".mst/results", value_name = "DIR")]
    pub(crate) results_dir: PathBuf,
    /// Secrets (JSON object or dotenv): servers' `token`, `envSecrets` and `headerSecrets`, model
    /// providers' keys, `secretEnv` (a name written `env:VAR` is read from the environment instead).
    #[arg(long, value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Grants and caps for plugins loaded with --plugin.
    #[command(flatten)]
    sandbox: SandboxArgs,
}

impl SetupArgs {
    /// The setup these flags describe, its secrets file read.
    pub(crate) fn setup(&self) -> Result<run::Setup> {
        Ok(run::Setup {
            config_path: self.config.clone(),
            results_base: self.results_dir.clone(),
            plugins: self.plugins.clone(),
            plugin_grants: self.sandbox.grants()?,
            plugin_limits: self.sandbox.limits()?,
            runner: self.runner.clone(),
            runner_options: self.runner_options.clone(),
            secrets: load_secrets(self.secrets_file.as_deref())?,
        })
    }
}

/// `mst run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    setup: SetupArgs,
    /// Run only this variant. Repeatable.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Run only this case id. Repeatable.
    #[arg(long = "case")]
    cases: Vec<String>,
    /// Repetitions of each case, overriding the config.
    #[arg(long)]
    trials: Option<u32>,
    /// Collect only the trials RUN_ID is missing, into the same run.
    #[arg(long, value_name = "RUN_ID")]
    resume: Option<String>,
    /// With --resume: go on even though the shard count, runner, datasets or a plugin changed
    /// since the run's first collection.
    #[arg(long, requires = "resume")]
    force: bool,
    /// Also write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Follow the run in the web UI at ADDR:PORT (loopback): progress and trials as they
    /// finish, then the report, served until Ctrl-C.
    #[arg(long, value_name = "ADDR:PORT")]
    serve: Option<std::net::SocketAddr>,
    /// A shard whose worker sends nothing (not even a heartbeat) for this long is lost.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    silence_limit: f64,
    /// After Ctrl-C, how long workers have to stop before they are killed.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    cancel_grace: f64,
    /// The most one shard may copy back (traces), in MiB; past it the shard stops.
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    max_shard_copy: u64,
    /// The most the whole run may copy back, in MiB; past it every shard stops.
    #[arg(long, default_value_t = 16384, value_name = "MIB")]
    max_run_copy: u64,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
    /// Return as soon as the run exists: it goes on in the background, supervised by an mst
    /// of its own that logs its progress into the run directory (`mst runs attach RUN_ID`
    /// follows it, `mst runs stop RUN_ID` stops it).
    #[arg(long, conflicts_with = "serve")]
    detach: bool,
    /// The supervisor of a detached run (`--detach` starts it).
    #[arg(long, hide = true)]
    supervise: bool,
}

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

/// What the reporter follows, and so what it calls a trial that came back and how the summary
/// says to go on with the trials that did not.
enum ReportKind {
    /// A run of the config: `mst run --config CONFIG --resume RUN`.
    Run(PathBuf),
    /// A regrade on machines: its command line, to which `--resume RUN.gN` is added.
    Grade(String),
}

/// Progress for people: a bar on a terminal, a line per trial otherwise, nothing with --quiet;
/// then the summary (table or JSON) and the JUnit file. Everything it shows comes from the
/// run's typed events.
pub(super) struct Reporter {
    bar: Option<indicatif::ProgressBar>,
    plain: bool,
    done: AtomicU64,
    total: AtomicU64,
    failures: AtomicU64,
    lock: Mutex<()>,
    /// `--json`: the summary as JSON instead of the table.
    json: bool,
    /// `--junit FILE`.
    junit: Option<PathBuf>,
    /// What to tell when trials are missing.
    resume: ReportKind,
    /// A JUnit file that could not be written.
    failure: Mutex<Option<anyhow::Error>>,
    /// What goes to stdout once the run has cleaned up (a closed stdout ends mst at once).
    summary: Mutex<String>,
}

impl Reporter {
    fn new(args: &RunArgs) -> Self {
        Self::with(
            args.quiet,
            args.json,
            args.junit.clone(),
            ReportKind::Run(args.setup.config.clone()),
        )
    }

    /// The reporter of `mst runs attach`: progress only, from a detached run's log.
    fn following() -> Self {
        Self::with(false, false, None, ReportKind::Run(PathBuf::new()))
    }

    fn with(quiet: bool, json: bool, junit: Option<PathBuf>, resume: ReportKind) -> Self {
        let tty = std::io::stderr().is_terminal();
        let bar = (tty && !quiet).then(|| {
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{spinner} {pos}/{len} trials [{elapsed_precise}<{eta_precise}] {msg}",
                )
                .expect("a valid template"),
            );
            bar
        });
        Reporter {
            bar,
            plain: !quiet && !tty,
            done: AtomicU64::new(0),
            total: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            lock: Mutex::new(()),
            json,
            junit,
            resume,
            failure: Mutex::new(None),
            summary: Mutex::new(String::new()),
        }
    }

    /// The end of the run: the JUnit file, then the summary on stdout.
    fn finished(&self, outcome: &run::RunOutcome) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if let Some(path) = &self.junit {
            let junit = report::junit(&outcome.summary);
            let junit = crate::secrets::redactor().redact(&junit).into_owned();
            let written = crate::files::write_durable(path, junit.as_bytes())
                .with_context(|| format!("cannot write --junit {}", path.display()));
            if let Err(e) = written {
                *self.failure.lock().expect("failure") = Some(e);
            }
        }
        // `--json` is streamed to stdout from the summary itself (`print`): a run of 100,000
        // cases has megabytes of it.
        let mut text = match self.json {
            true => String::new(),
            false => summary_text(&outcome.summary, &outcome.grades, false, &outcome.dir),
        };
        if !self.json {
            text.push_str(&kept_and_artifacts(outcome));
        }
        if let (false, Some(timings)) = (self.json, &outcome.record.timings) {
            text.push_str(&timing_line(timings));
        }
        let resume = match &self.resume {
            _ if self.json || outcome.summary.missing.is_empty() => None,
            ReportKind::Run(config) => {
                Some(format!("mst run --config {} --resume", config.display()))
            }
            // Missing trials the grade shards left (a trial the run never collected is not theirs).
            ReportKind::Grade(command) => {
                (outcome.record.grade == results::Phase::Partial).then(|| command.clone())
            }
        };
        if let Some(command) = resume {
            text.push_str(&format!("resume:  {command} {}\n", outcome.record.run_id));
        }
        *self.summary.lock().expect("summary") = text;
    }

    /// Prints the summary of the run that finished with `summary`, once it has cleaned up.
    fn print(&self, summary: &results::Summary) {
        print_summary_as(summary, self.json, || {
            self.summary.lock().expect("summary").clone()
        });
    }

    /// What a detached run's progress log keeps of the summary: the text `mst run` prints.
    fn printed(&self, outcome: &run::RunOutcome) -> String {
        match self.json {
            true => summary_text(&outcome.summary, &outcome.grades, true, &outcome.dir),
            false => self.summary.lock().expect("summary").clone(),
        }
    }

    fn trial(&self, key: &dyn std::fmt::Display, collected: bool) {
        let done = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if !collected {
            self.failures.fetch_add(1, Ordering::Relaxed);
        }
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            bar.set_message(format!("{} infra", self.failures.load(Ordering::Relaxed)));
        } else if self.plain {
            let _guard = self.lock.lock();
            errln!(
                "[{done}/{}] {key} {}",
                self.total.load(Ordering::Relaxed),
                match (collected, &self.resume) {
                    (true, ReportKind::Grade(_)) => "graded",
                    (true, ReportKind::Run(_)) => "collected",
                    (false, _) => "infra",
                }
            );
        }
    }

    fn note(&self, message: &str) {
        match &self.bar {
            Some(bar) => bar.println(crate::secrets::clean_text(&format!("note: {message}"))),
            None => errln!("note: {message}"),
        }
    }

    /// One line of a detached run's progress log, shown as the run itself would have; the
    /// run's exit code once it ended.
    pub(super) fn progress(&self, line: &Progress) -> Option<u8> {
        match line {
            Progress::Started { total, .. } => {
                self.total.store(*total, Ordering::Relaxed);
                if let Some(bar) = &self.bar {
                    bar.set_length(*total);
                }
            }
            Progress::Trial { trial, collected } => self.trial(trial, *collected),
            Progress::Note { message } => self.note(message),
            Progress::Finished { exit_code, summary } => {
                if let Some(bar) = &self.bar {
                    bar.finish_and_clear();
                }
                super::write_stdout_str(summary);
                return Some(*exit_code);
            }
            Progress::Failed { exit_code, error } => {
                if let Some(bar) = &self.bar {
                    bar.finish_and_clear();
                }
                errln!("error: {error}");
                return Some(*exit_code);
            }
        }
        None
    }
}

impl events::Reporter for Reporter {
    /// 1 when the `--junit` file could not be written (the process exits 1 then).
    fn exit_code(&self, run_code: u8) -> u8 {
        match self.failure.lock().expect("failure").is_some() {
            true => 1,
            false => run_code,
        }
    }

    fn event(&self, event: &RunEvent<'_>) {
        match event {
            RunEvent::Started { total, .. } => {
                self.total.store(*total, Ordering::Relaxed);
                if let Some(bar) = &self.bar {
                    bar.set_length(*total);
                }
            }
            RunEvent::Shard(ShardEvent::TraceEvent {
                key, seq, event, ..
            }) => trace_event(key, *seq, event.as_ref()),
            RunEvent::Shard(ShardEvent::TrialCollected { key, .. }) => self.trial(key, true),
            RunEvent::Shard(ShardEvent::TrialInfra { key, .. }) => self.trial(key, false),
            RunEvent::Finished(outcome) => self.finished(outcome),
            other => {
                if let Some(note) = other.note() {
                    self.note(&note);
                }
            }
        }
    }
}

/// Longest a trace event's line at `-v` gets, in characters.
const EVENT_LINE_CHARS: usize = 200;

/// A running trial's progress, one log line per trace event at `-v` (info), none by default:
/// through the logger, which redacts and escapes like every other line.
fn trace_event(key: &TrialKey, seq: u64, event: Option<&crate::eval::trial::TraceEvent>) {
    match event {
        Some(event) => tracing::info!(
            "trial {key} event {seq} at {} ms: {}",
            event.at_ms,
            event.summary(EVENT_LINE_CHARS)
        ),
        None => tracing::info!("trial {key} event {seq}: too large to stream (see its trace)"),
    }
}

pub(crate) fn run(home: &Home, args: RunArgs) -> Result<u8> {
    if let Some(run_id) = &args.resume {
        super::detach::refuse_running(&args.setup.results_dir, run_id)
            .map_err(|error| super::Exit { code: 2, error })?;
    }
    if args.detach {
        return super::detach::start(&args.setup.results_dir, args.json);
    }
    let _ = ctrlc::set_handler(|| {
        if CANCEL.swap(true, Ordering::SeqCst) {
            std::process::exit(130);
        }
        if !SERVING_ONLY.load(Ordering::SeqCst) {
            eprintln!("\ninterrupted: stopping the shards (Ctrl-C again to quit at once)");
        }
    });
    let request = RunRequest {
        setup: args.setup.setup()?,
        filters: crate::eval::plan::Filters {
            variants: args.variants.clone(),
            cases: args.cases.clone(),
            trials: args.trials,
        },
        resume: args.resume.clone(),
        force: args.force,
        shard_settings: Some(ShardSettings {
            silence: crate::eval::config::seconds("--silence-limit", args.silence_limit)?,
            cancel_grace: crate::eval::config::seconds("--cancel-grace", args.cancel_grace)?,
            max_shard_copy_bytes: args.max_shard_copy.saturating_mul(1 << 20),
            max_run_copy_bytes: args.max_run_copy.saturating_mul(1 << 20),
            ..ShardSettings::default()
        }),
        collector: match args.supervise {
            true => Collector::Supervisor,
            false => Collector::Terminal,
        },
    };
    let following = args
        .serve
        .map(|listen| {
            super::serve::Following::start(listen, ResultsRoot::new(&request.setup.results_base))
        })
        .transpose()
        .map_err(|error| super::Exit { code: 2, error })?;
    let reporter = Reporter::new(&args);
    let supervision = args
        .supervise
        .then(|| super::detach::Supervision::new(&args.setup.results_dir));
    let tee = Tee {
        supervision: supervision.as_ref(),
        terminal: &reporter,
        following: following.as_ref(),
    };
    let outcome = match run::run(home, &request, &tee, &CANCEL) {
        Ok(outcome) => outcome,
        Err(error) => return Err(super::Exit { code: 2, error }.into()),
    };
    reporter.print(&outcome.summary);
    let failure = reporter.failure.lock().expect("failure").take();
    if let Some(following) = &following {
        SERVING_ONLY.store(true, Ordering::SeqCst);
        following.run.end(None);
        errln!(
            "mst run: the report stays at http://{}/#/runs/{} until Ctrl-C",
            following.address,
            outcome.record.run_id
        );
        while !CANCEL.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(outcome.summary.exit_code()),
    }
}

/// The run's process record (and a detached run's progress log), the terminal's reporter and,
/// with `--serve`, the web UI's.
struct Tee<'a> {
    /// A detached run's progress log.
    supervision: Option<&'a super::detach::Supervision>,
    terminal: &'a Reporter,
    following: Option<&'a super::serve::Following>,
}

impl events::Reporter for Tee<'_> {
    fn exit_code(&self, run_code: u8) -> u8 {
        self.terminal.exit_code(run_code)
    }

    fn event(&self, event: &RunEvent<'_>) {
        if let (Some(following), RunEvent::Started { run_id, .. }) = (self.following, event) {
            errln!(
                "mst run: follow the run at http://{}/#/runs/{run_id}",
                following.address
            );
        }
        // First: a detached run's supervisor hands the terminal back when the run starts.
        if let Some(supervision) = self.supervision {
            supervision.event(event);
        }
        self.terminal.event(event);
        // The summary is the terminal reporter's to make; the progress log's last line
        // carries it.
        if let (Some(supervision), RunEvent::Finished(outcome)) = (self.supervision, event) {
            match self.terminal.failure.lock().expect("failure").as_ref() {
                Some(error) => supervision.failed(1, error),
                None => supervision
                    .finished(outcome.summary.exit_code(), &self.terminal.printed(outcome)),
            }
        }
        if let Some(following) = self.following {
            following.run.event(event);
        }
    }
}

/// The summary for stdout: JSON, or the table, what did not pass (from `grades`), the HTML
/// report when the run has one, and where the run directory is.
fn summary_text(
    summary: &results::Summary,
    grades: &Grades,
    json: bool,
    dir: &results::RunDir,
) -> String {
    if json {
        let mut text = serde_json::to_string_pretty(summary).expect("summaries serialize");
        text.push('\n');
        return text;
    }
    let mut text = report::table(summary);
    text.push_str(&report::FailureList::collect(summary, grades).render(report::FAILURE_LINES));
    let html = dir.root.join("report.html");
    if html.is_file() {
        text.push_str(&format!("report: {}\n", html.display()));
    }
    text.push_str(&format!("results: {}\n", dir.root.display()));
    text
}

/// Prints the summary: as JSON, streamed ([`super::write_stdout_json`]), or as the table.
fn print_summary(summary: &results::Summary, grades: &Grades, json: bool, dir: &results::RunDir) {
    print_summary_as(summary, json, || summary_text(summary, grades, false, dir));
}

/// Prints `summary` as JSON, streamed, or as `text` (made only when it is printed).
fn print_summary_as(summary: &results::Summary, json: bool, text: impl FnOnce() -> String) {
    match json {
        true => super::write_stdout_json(summary),
        false => super::write_stdout_str(&text()),
    }
}

/// Where the run's time went, one line: collection, and the grading left once it ended.
fn timing_line(timings: &results::Timings) -> String {
    format!(
        "time:    collected in {:.2} s, {} trials graded as they arrived; grading after: {:.2} s\n",
        timings.collect_ms as f64 / 1e3,
        timings.graded_while_collecting,
        timings.grade_after_ms as f64 / 1e3
    )
}

/// The secrets `--secrets-file` names, or none.
fn load_secrets(path: Option<&std::path::Path>) -> Result<crate::secrets::Secrets> {
    path.map_or_else(
        || Ok(crate::secrets::Secrets::default()),
        crate::secrets::Secrets::load,
    )
}

/// `mst grade`.
#[derive(Args, Debug)]
pub(crate) struct GradeArgs {
    /// The run whose traces to regrade.
    run_id: String,
    /// The eval config whose judges to use [default: the one the run recorded].
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Load a plugin (.wasm file or installed name). Repeatable.
    #[arg(long = "plugin", value_name = "PLUGIN")]
    plugins: Vec<String>,
    #[arg(long, default_value = ".mst/results", value_name = "DIR")]
    results_dir: PathBuf,
    #[arg(long)]
    json: bool,
    /// Secrets (JSON object or dotenv): the keys of the model providers judges may call.
    #[arg(long, value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Run the judges in grade shards on this runner's machines (`local`, `docker`, or a
    /// runner plugin's name) instead of in this process.
    #[arg(long)]
    runner: Option<String>,
    /// A runner option, key=value (`shards`, `keep`, and the runner's own). Repeatable.
    #[arg(long = "runner-option", value_name = "KEY=VALUE", requires = "runner")]
    runner_options: Vec<String>,
    /// Go on with the regrade RUN_ID.gN (on machines): grade only the trials it lacks.
    #[arg(long, value_name = "RUN_ID.gN", requires = "runner")]
    resume: Option<String>,
    /// With --resume: go on even though the runner, its options, the shard count, the config,
    /// the datasets or a plugin changed since the regrade began.
    #[arg(long, requires = "resume")]
    force: bool,
    /// No progress output (with --runner).
    #[arg(long, short, requires = "runner")]
    quiet: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub(crate) fn grade(home: &Home, args: GradeArgs) -> Result<u8> {
    let dir = ResultsRoot::new(&args.results_dir).find(&args.run_id)?;
    // This command line, without any --resume of its own, continues what it leaves.
    let mut words = Vec::new();
    let mut given = std::env::args_os()
        .skip(1)
        .map(|word| word.to_string_lossy().into_owned());
    while let Some(word) = given.next() {
        match word.as_str() {
            "--resume" => drop(given.next()),
            _ if word.starts_with("--resume=") => {}
            _ => words.push(word),
        }
    }
    words.push("--resume".into());
    let resume_hint = crate::runner::shell_words("mst", &words);
    let reporter = Reporter::with(args.quiet, args.json, None, ReportKind::Grade(resume_hint));
    if args.runner.is_some() {
        let _ = ctrlc::set_handler(|| {
            if CANCEL.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
            eprintln!("\ninterrupted: stopping the grade shards (Ctrl-C again to quit at once)");
        });
    }
    let on = args.runner.as_deref().map(|runner| run::regrade::GradeOn {
        runner,
        runner_options: &args.runner_options,
        resume: args.resume.as_deref(),
        force: args.force,
        settings: ShardSettings::default(),
        reporter: &reporter,
        cancel: &CANCEL,
    });
    let outcome = run::regrade::regrade(
        home,
        &dir,
        &run::regrade::RegradeRequest {
            config_path: args.config.as_deref(),
            extra_plugins: &args.plugins,
            grants: &args.sandbox.grants()?,
            limits: args.sandbox.limits()?,
            secrets: &load_secrets(args.secrets_file.as_deref())?,
            on,
        },
    )
    .map_err(|error| super::Exit { code: 2, error })?;
    if args.runner.is_some() {
        reporter.print(&outcome.summary);
    } else {
        print_summary(&outcome.summary, &outcome.grades, args.json, &outcome.dir);
    }
    if !args.json {
        outln!("regraded into {}", outcome.record.run_id);
    }
    Ok(outcome.summary.exit_code())
}

pub(crate) fn runs(command: RunsCommand) -> Result<u8> {
    match command {
        RunsCommand::List { results_dir, json } => {
            let runs = ResultsRoot::new(&results_dir).list();
            if json {
                outln!("{}", serde_json::to_string_pretty(&runs)?);
            } else {
                outln!(
                    "{:<24} {:<24} {:>7} {:<11} {:<9} GRADE",
                    "RUN",
                    "EVAL",
                    "TRIALS",
                    "STATE",
                    "COLLECT"
                );
                for r in &runs {
                    outln!(
                        "{:<24} {:<24} {:>7} {:<11} {:<9} {}",
                        r.run_id,
                        r.eval,
                        r.trials,
                        r.state.map_or("-".to_string(), |s| s.to_string()),
                        r.collect,
                        r.grade
                    );
                }
            }
            Ok(0)
        }
        RunsCommand::Attach {
            run_id,
            results_dir,
        } => {
            let dir = ResultsRoot::new(&results_dir).find(&run_id)?;
            let _ = ctrlc::set_handler(|| CANCEL.store(true, Ordering::SeqCst));
            super::detach::attach(&dir, &Reporter::following(), &CANCEL)
                .map_err(|error| super::Exit { code: 2, error }.into())
        }
        RunsCommand::Stop {
            run_id,
            results_dir,
            wait,
            json,
        } => {
            let dir = ResultsRoot::new(&results_dir).find(&run_id)?;
            let wait = crate::eval::config::seconds("--wait", wait)?;
            let ended =
                super::detach::stop(&dir, wait).map_err(|error| super::Exit { code: 2, error })?;
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
            Ok(0)
        }
        RunsCommand::Show {
            run_id,
            results_dir,
            json,
        } => {
            let dir = ResultsRoot::new(&results_dir).find(&run_id)?;
            let stored = results::stored::StoredRun::read(&dir)?;
            print_summary(&stored.summary, &stored.grades, json, &dir);
            Ok(0)
        }
        RunsCommand::Cases {
            run_id,
            results_dir,
        } => {
            let dir = ResultsRoot::new(&results_dir).find(&run_id)?;
            let record = dir.read_record()?;
            record
                .refuse_conversation("read as cases")
                .map_err(|error| super::Exit { code: 2, error })?;
            for case in dir.cases(&record) {
                outln!("{}", serde_json::to_string(&case)?);
            }
            Ok(0)
        }
        RunsCommand::Diff {
            run_a,
            run_b,
            results_dir,
            json,
        } => {
            let compared = (|| {
                let root = ResultsRoot::new(&results_dir);
                let a = results::stored::StoredRun::read(&root.find(&run_a)?)?;
                let b = results::stored::StoredRun::read(&root.find(&run_b)?)?;
                results::diff::RunDiff::between(&a, &b)
            })();
            let diff = compared.map_err(|error| super::Exit { code: 2, error })?;
            match json {
                true => outln!("{}", serde_json::to_string_pretty(&diff)?),
                false => out!("{}", diff.text()),
            }
            Ok(u8::from(diff.broke()))
        }
        RunsCommand::Export {
            run_id,
            format,
            out,
            results_dir,
            json,
        } => {
            let root = ResultsRoot::new(&results_dir);
            let exported = results::export::export(&root, &run_id, &format, &out)?;
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
            Ok(0)
        }
    }
}

/// The end-of-run lines for machines left for inspection (where each is and how to get in)
/// and for the artefacts that came back; empty when there are neither.
fn kept_and_artifacts(outcome: &run::RunOutcome) -> String {
    let mut text = String::new();
    for shard in &outcome.shards {
        if let Some(kept) = &shard.kept {
            text.push_str(&format!("kept:    shard {}: {}\n", shard.shard, kept.at));
            if let Some(enter) = &kept.enter {
                text.push_str(&format!("         get in: {enter}\n"));
            }
        }
    }
    let (trials, files) = outcome.shards.iter().fold((0, 0), |(t, f), shard| {
        (t + shard.artifacts.trials, f + shard.artifacts.files)
    });
    if files > 0 {
        text.push_str(&format!(
            "artifacts: {files} file(s) from {trials} trial(s) in {}\n",
            outcome.dir.artifacts_dir().display()
        ));
    }
    crate::secrets::clean(&text).into_owned()
}
