//! Runs that go on without the terminal, end to end on the local runner with the real binary:
//! `mst run --detach` returns while the run goes on, `mst runs attach` follows it to its
//! summary, `mst runs stop` cancels it with the usual grace, and a run whose supervisor was
//! killed is listed as interrupted and resumed.

use mst_tests::{command_eval, read_json, s, Eval, Mst, Run};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An eval of `n` cases whose client holds until its gate (a file) exists, then answers.
struct Gated {
    eval: Eval,
    gate: PathBuf,
    _scratch: tempfile::TempDir,
}

impl Gated {
    fn new(n: usize) -> Self {
        let scratch = tempfile::tempdir().unwrap();
        let gate = scratch.path().join("gate");
        let agent = format!(
            "read q; while [ ! -e {} ]; do sleep 0.05; done; echo \"$q\"",
            s(&gate)
        );
        Gated {
            eval: command_eval(json!(["sh", "-c", agent]), n, 120),
            gate,
            _scratch: scratch,
        }
    }

    /// How many trials wait at the gate (processes whose command line names it).
    fn waiting(&self) -> usize {
        let out = std::process::Command::new("pgrep")
            .args(["-f", s(&self.gate)])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).lines().count()
    }

    /// Waits until both trials the eval runs at a time hold at the gate.
    fn wait_until_held(&self) {
        until("the trials to start", Duration::from_secs(30), || {
            self.waiting() >= 2
        });
    }

    /// An mst whose sandboxes are shown the gate's directory.
    fn mst(&self) -> Mst {
        Mst::exposing(&[self.gate.parent().unwrap()])
    }

    fn open(&self) {
        std::fs::write(&self.gate, "").unwrap();
    }
}

/// `mst runs ARGS --results-dir` of `eval`.
fn runs(mst: &Mst, eval: &Eval, args: &[&str]) -> Run {
    let results = eval.results();
    let mut all = vec!["runs"];
    all.extend(args);
    all.extend(["--results-dir", s(&results)]);
    mst.run(&all)
}

/// Run `id`'s entry in `mst runs list --json`.
fn listed(mst: &Mst, eval: &Eval, id: &str) -> Value {
    let list = runs(mst, eval, &["list", "--json"]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    list.json()
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("run {id} is not listed: {}", list.stdout))
}

/// Waits until `check` holds, failing after `limit` with `what`.
fn until(what: &str, limit: Duration, mut check: impl FnMut() -> bool) {
    let started = Instant::now();
    while !check() {
        assert!(started.elapsed() < limit, "{what} within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn alive(pid: u64) -> bool {
    // A zombie (an exited process not yet reaped) is not alive.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z'))
    })
}

/// The session `pid` belongs to (field 6 of /proc/PID/stat).
fn session_of(pid: u64) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let (_, rest) = stat.rsplit_once(')').unwrap();
    rest.split_whitespace().nth(3).unwrap().parse().unwrap()
}

/// `mst run --detach --json` of `eval`: its run id and supervisor pid.
fn detach(mst: &Mst, eval: &Eval, extra: &[&str]) -> (String, u64) {
    let mut args = vec!["--detach", "--json"];
    args.extend(extra);
    let started = Instant::now();
    let detached = eval.run(mst, &args);
    assert_eq!(detached.code, 0, "{}\n{}", detached.stdout, detached.stderr);
    // It returned while every trial still holds at the gate.
    assert!(started.elapsed() < Duration::from_secs(30));
    let said = detached.json();
    assert_eq!(said["state"], "running", "{said}");
    assert!(Path::new(said["log"].as_str().unwrap()).is_file(), "{said}");
    (
        said["runId"].as_str().unwrap().to_string(),
        said["pid"].as_u64().unwrap(),
    )
}

#[test]
fn a_detached_run_goes_on_without_the_terminal_and_attach_follows_it_to_its_summary() {
    let gated = Gated::new(3);
    let eval = &gated.eval;
    let mst = gated.mst();
    let (id, pid) = detach(&mst, eval, &[]);
    // The trials run under the supervisor, with nobody attached.
    gated.wait_until_held();
    assert!(alive(pid));
    // It left the terminal's session: it leads one of its own.
    assert_eq!(session_of(pid), pid);
    assert_ne!(session_of(pid), session_of(std::process::id() as u64));
    assert_eq!(listed(&mst, eval, &id)["state"], "running");
    // A run still being collected is not resumed by a second process.
    let second = eval.run(&mst, &["--resume", &id]);
    assert_eq!(second.code, 2, "{}", second.stderr);
    assert!(
        second.stderr.contains("still being collected"),
        "{}",
        second.stderr
    );
    let text = runs(&mst, eval, &["list"]);
    let line = text.stdout.lines().find(|l| l.contains(&id)).unwrap();
    assert!(line.contains("running"), "{}", text.stdout);

    let results = eval.results();
    let follower = mst.spawn(&["runs", "attach", &id, "--results-dir", s(&results)]);
    gated.open();
    let attached = Run::from(follower.wait_with_output().unwrap());
    assert_eq!(attached.code, 0, "{}\n{}", attached.stdout, attached.stderr);
    // A line per trial (not a terminal), then the summary `mst run` would have printed.
    assert_eq!(
        attached.stderr.matches(" collected").count(),
        3,
        "{}",
        attached.stderr
    );
    // It was started with --json: the summary is the JSON `mst run --json` prints.
    let printed: Value = serde_json::from_str(&attached.stdout).unwrap();
    assert_eq!(printed["variants"]["default"]["passed"], 3, "{printed}");
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["variants"]["default"]["passed"], 3, "{summary}");

    // The supervisor ended the run, recorded how (just after its last progress line), and
    // exited.
    until(
        "the run's end to be recorded",
        Duration::from_secs(10),
        || read_json(&dir.join("process.json"))["exitCode"].is_number(),
    );
    let process = read_json(&dir.join("process.json"));
    assert_eq!(process["collector"], "supervisor", "{process}");
    assert_eq!(process["exitCode"], 0, "{process}");
    assert_eq!(process["owner"]["pid"], pid, "{process}");
    until("the supervisor to exit", Duration::from_secs(10), || {
        !alive(pid)
    });
    assert_eq!(listed(&mst, eval, &id)["state"], "ended");
    // Its progress went to its own log, not to a terminal that is gone.
    let log = std::fs::read_to_string(dir.join("supervisor.log")).unwrap();
    assert_eq!(log.matches(" collected").count(), 3, "{log}");

    // Attaching to a run that ended prints its summary and exit code at once.
    let again = runs(&mst, eval, &["attach", &id]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.stdout, attached.stdout);

    // A damaged progress log is said to be, by its path, not followed nor trusted.
    std::fs::write(dir.join("progress.jsonl"), "{\"event\": \"finished\"\n").unwrap();
    let damaged = runs(&mst, eval, &["attach", &id]);
    assert_eq!(damaged.code, 2, "{}", damaged.stderr);
    assert!(
        damaged.stderr.contains("progress.jsonl is damaged"),
        "{}",
        damaged.stderr
    );
}

#[test]
fn runs_stop_cancels_a_detached_run_with_the_grace_and_resume_collects_the_rest() {
    let gated = Gated::new(3);
    let eval = &gated.eval;
    let mst = gated.mst();
    // Without --json: the lines for people, the first naming the run and its supervisor.
    let detached = eval.run(&mst, &["--detach", "--cancel-grace", "2"]);
    assert_eq!(detached.code, 0, "{}\n{}", detached.stdout, detached.stderr);
    let first = detached.stdout.lines().next().unwrap();
    let words: Vec<&str> = first.split_whitespace().collect();
    assert_eq!(words[..2], ["run", words[1]]);
    assert!(
        first.contains("goes on in the background (supervisor pid "),
        "{first}"
    );
    let id = words[1].to_string();
    let pid: u64 = words.last().unwrap().trim_end_matches(')').parse().unwrap();
    assert!(
        detached
            .stdout
            .contains(&format!("mst runs attach {id} --results-dir ")),
        "{}",
        detached.stdout
    );
    gated.wait_until_held();
    let stopped = runs(&mst, eval, &["stop", &id]);
    assert_eq!(stopped.code, 0, "{}\n{}", stopped.stdout, stopped.stderr);
    assert!(
        stopped.stdout.contains(&format!("stopped run {id}")),
        "{}",
        stopped.stdout
    );
    // As Ctrl-C on an attached run: the trials were stopped and are missing, not failed.
    let dir = eval.run_dir("e2e");
    let process = read_json(&dir.join("process.json"));
    assert_eq!(process["exitCode"], 2, "{process}");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["missing"].as_array().unwrap().len(), 3, "{summary}");
    until(
        "the trials' processes to be gone",
        Duration::from_secs(10),
        || gated.waiting() == 0,
    );
    until("the supervisor to exit", Duration::from_secs(10), || {
        !alive(pid)
    });
    // A run that ended cannot be stopped again; attaching to it tells how it ended.
    let again = runs(&mst, eval, &["stop", &id]);
    assert_eq!(again.code, 2, "{}", again.stderr);
    assert!(again.stderr.contains("not running"), "{}", again.stderr);
    assert_eq!(runs(&mst, eval, &["attach", &id]).code, 2);

    // Resumed detached, its progress log tells of the resume only: attach follows it to the
    // new end, not the stopped collection's.
    gated.open();
    let (resumed, _) = detach(&mst, eval, &["--resume", &id]);
    assert_eq!(resumed, id);
    let attached = runs(&mst, eval, &["attach", &id]);
    assert_eq!(attached.code, 0, "{}\n{}", attached.stdout, attached.stderr);
    let printed: Value = serde_json::from_str(&attached.stdout).unwrap();
    assert_eq!(printed["variants"]["default"]["passed"], 3, "{printed}");
}

#[test]
fn a_run_whose_supervisor_was_killed_is_listed_interrupted_and_resumes() {
    let gated = Gated::new(2);
    let eval = &gated.eval;
    let mst = gated.mst();
    let (id, pid) = detach(&mst, eval, &[]);
    gated.wait_until_held();
    // SAFETY: SIGKILL to the supervisor this test started.
    unsafe { libc::kill(pid as i32, libc::SIGKILL) };
    until("the supervisor to die", Duration::from_secs(10), || {
        !alive(pid)
    });
    assert_eq!(listed(&mst, eval, &id)["state"], "interrupted");
    // Neither attach nor stop waits on a process that is gone: both say how to go on.
    for verb in ["attach", "stop"] {
        let refused = runs(&mst, eval, &[verb, &id]);
        assert_eq!(refused.code, 2, "{verb}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("interrupted")
                && refused.stderr.contains(&format!("--resume {id}")),
            "{verb}: {}",
            refused.stderr
        );
    }
    // The workers a killed supervisor leaves end when their coordinator's pipe closes.
    until(
        "the orphaned trials to end",
        Duration::from_secs(30),
        || gated.waiting() == 0,
    );
    gated.open();
    let resumed = eval.run(&mst, &["--resume", &id]);
    assert_eq!(resumed.code, 0, "{}\n{}", resumed.stdout, resumed.stderr);
    assert_eq!(listed(&mst, eval, &id)["state"], "ended");
    let summary = read_json(&eval.run_dir("e2e").join("summary.json"));
    assert_eq!(summary["variants"]["default"]["passed"], 2, "{summary}");
}

#[test]
fn a_detached_run_that_cannot_start_says_why_and_exits_as_mst_run_would() {
    let eval = command_eval(json!(["true"]), 1, 10);
    std::fs::remove_file(eval.dir.path().join("cases.jsonl")).unwrap();
    let refused = eval.run(&Mst::new(), &["--detach"]);
    assert_eq!(refused.code, 2, "{}\n{}", refused.stdout, refused.stderr);
    assert!(refused.stderr.contains("cases.jsonl"), "{}", refused.stderr);
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);
    assert!(!eval.results().join("e2e/runs").exists());
}
