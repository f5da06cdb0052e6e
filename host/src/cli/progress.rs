//! What people see of a run: progress as it goes (a bar on a terminal, a line per trial
//! otherwise), then the summary (table or JSON) and the JUnit file; and the [`Tee`] that hands
//! a run's events to the progress, a detached run's log and the web UI. Shared by `mst run`,
//! `mst grade` and `mst runs …`.

use crate::eval::trial::TrialKey;
use crate::grade::Grades;
use crate::results::run_process::Progress;
use crate::results::{self, junit, summary_text};
use crate::run;
use crate::run::events::{self, RunEvent};
use crate::shard::coordinator::ShardEvent;
use anyhow::Context;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// What the reporter follows, and so what it calls a trial that came back and how the summary
/// says to go on with the trials that did not.
pub(super) enum ReportKind {
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
    /// The reporter of `mst runs attach`: progress only, from a detached run's log.
    pub(super) fn following() -> Self {
        Self::with(false, false, None, ReportKind::Run(PathBuf::new()))
    }

    /// A reporter that shows progress unless `quiet`, then the summary (as JSON with `json`)
    /// and the JUnit file `junit`; `resume` says how to go on with missing trials.
    pub(super) fn with(
        quiet: bool,
        json: bool,
        junit: Option<PathBuf>,
        resume: ReportKind,
    ) -> Self {
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
            let junit = junit::junit(&outcome.summary);
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

    /// The error writing the JUnit file met, if any (taken: asked once, at the end).
    pub(super) fn take_failure(&self) -> Option<anyhow::Error> {
        self.failure.lock().expect("failure").take()
    }

    /// Prints the summary of the run that finished with `summary`, once it has cleaned up.
    pub(super) fn print(&self, summary: &results::Summary) {
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
            true => super::Code::Failure.into(),
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

/// The run's process record (and a detached run's progress log), the terminal's reporter and,
/// with `--serve`, the web UI's.
pub(super) struct Tee<'a> {
    /// A detached run's progress log.
    pub(super) supervision: Option<&'a super::detach::Supervision>,
    /// The progress and summary on the terminal.
    pub(super) terminal: &'a Reporter,
    /// With `--serve`: the web UI following the run.
    pub(super) following: Option<&'a super::serve::Following>,
}

impl events::Reporter for Tee<'_> {
    fn exit_code(&self, run_code: u8) -> u8 {
        self.terminal.exit_code(run_code)
    }

    fn event(&self, event: &RunEvent<'_>) {
        if let (Some(following), RunEvent::Started { run_id, .. }) = (self.following, event) {
            let url = following.url(&format!("/runs/{run_id}"));
            errln!("mst run: follow the run at {url}");
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
pub(super) fn summary_text(
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
    let mut text = summary_text::table(summary);
    text.push_str(
        &summary_text::FailureList::collect(summary, grades).render(summary_text::FAILURE_LINES),
    );
    let html = dir.root.join("report.html");
    if html.is_file() {
        text.push_str(&format!("report: {}\n", html.display()));
    }
    text.push_str(&format!("results: {}\n", dir.root.display()));
    text
}

/// Prints the summary: as JSON, streamed ([`super::write_stdout_json`]), or as the table.
pub(super) fn print_summary(
    summary: &results::Summary,
    grades: &Grades,
    json: bool,
    dir: &results::RunDir,
) {
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
