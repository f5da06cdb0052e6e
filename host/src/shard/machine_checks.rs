//! Checks inside the machine: after a trial's client finished, the worker runs the variant's
//! `checks` in the trial's work directory, before anything there is cleaned up, and adds each
//! one's outcome to the trace as a `check` event (docs/config.md, "Checks"). The verdict stays
//! the coordinator's: judges read the events (`check-passed`, `check-score`, grader plugins).
//!
//! A check that fails is evidence about the agent's work; a check that cannot run at all (its
//! program is missing) says nothing about it, so the trial becomes an infrastructure failure —
//! unless its program lies in the work directory (`./run_tests.sh`), which the agent could
//! remove or break: then it is a failed check, or an agent could excuse its failure as infra.

use crate::client::{EventSink, TrialPlace};
use crate::eval::config::CheckSpec;
use crate::eval::trial::{EventKind, TraceEvent, TraceRecord, TrialStatus, CHECK_EVENT};
use crate::process::NotFinished;
use std::time::{Duration, Instant};

/// Bytes kept of the end of a check's stdout and of its stderr in its event.
pub const MAX_CHECK_OUTPUT: usize = 16 * 1024;
/// Bytes read of a check's stdout or stderr at most (the rest is drained unread).
const READ_CAP: u64 = 4 * 1024 * 1024;

/// The variable naming the file where a check may leave its reward, a number in [0, 1] that
/// `check-score` grades by (partial credit).
pub const REWARD_ENV: &str = "MST_CHECK_REWARD";

/// The reward file, in the trial's home (which its checks may write and its agent, gone by
/// then, no longer can).
const REWARD_FILE: &str = ".mst-check-reward";

/// Where a check's hidden files come from: the coordinator, asked by the check's name once
/// the agent is gone ([`super::check_files`]); an error is mst's own failure.
pub type FetchFiles<'a> = dyn Fn(&str) -> Result<Vec<u8>, String> + 'a;

/// Runs `checks` one after the other in the trial's work directory, each in the trial's
/// sandbox when it has one (a check is hostile-input-driven code too: it runs what the agent
/// left), on a trace whose client ran (not an `infra`
/// one), appending a `check` event for each to `trace` and telling `sink`. A check with hidden
/// `files` gets them from `fetch` and laid over the work directory just before it runs. A
/// check that cannot start, or whose files mst cannot give, ends the list: the trace becomes
/// `infra`, with why as its last `log` event.
pub fn run_checks(
    checks: &[CheckSpec],
    place: &TrialPlace<'_>,
    trace: &mut TraceRecord,
    sink: &dyn EventSink,
    fetch: &FetchFiles<'_>,
) {
    if trace.status == TrialStatus::Infra {
        return;
    }
    let began = Instant::now();
    for check in checks {
        let ran = with_files(check, place, fetch).and_then(|laid| match laid {
            Ok(laid) => {
                let ran = run_one(check, place);
                // Hidden files leave with their check: a shared directory's next turn, and the
                // checks after it, never see them.
                crate::workspace::remove_laid(place.work, &laid);
                ran
            }
            Err(why) => Ok(failed(check, Instant::now(), why)),
        });
        let at_ms = trace.duration_ms + began.elapsed().as_millis() as u64;
        let kind = match ran {
            Ok(data) => EventKind::Custom {
                name: CHECK_EVENT.to_string(),
                data,
            },
            Err(why) => {
                push(
                    trace,
                    sink,
                    at_ms,
                    EventKind::Log {
                        text: format!("check `{}` could not run: {why}", check.name),
                    },
                );
                trace.status = TrialStatus::Infra;
                return;
            }
        };
        push(trace, sink, at_ms, kind);
    }
}

/// Appends one event to `trace`, numbered after the client's, and tells `sink`.
pub(super) fn push(trace: &mut TraceRecord, sink: &dyn EventSink, at_ms: u64, kind: EventKind) {
    let event = TraceEvent {
        seq: trace.events.len() as u64,
        at_ms,
        kind,
    };
    sink.emit(&event);
    trace.events.push(event);
}

/// Runs one check: its event's data, or why it could not start.
fn run_one(check: &CheckSpec, place: &TrialPlace<'_>) -> Result<serde_json::Value, String> {
    let limit = Duration::from_secs_f64(check.timeout);
    let started = Instant::now();
    // A file the agent left there says nothing: only what this check writes counts.
    let reward_file = place.home.join(REWARD_FILE);
    let _ = std::fs::remove_file(&reward_file);
    let env = [
        (REWARD_ENV.to_string(), reward_file.display().to_string()),
        // Python puts no directory of the agent's first on `sys.path` (3.11+), so a module
        // it planted in the work directory (a `unittest/`) cannot stand in for the real one.
        ("PYTHONSAFEPATH".to_string(), "1".to_string()),
    ]
    .into();
    let run = place
        .command(&check.run, &env)
        .map_err(NotFinished::NotStarted)
        .and_then(|mut command| {
            command.current_dir(place.work);
            crate::process::run_to_end(&mut command, Vec::new(), limit, READ_CAP)
        });
    let (exit_code, timed_out, stdout, stderr) = match run {
        Ok(finished) => (
            finished.status.and_then(|s| s.code()),
            false,
            finished.stdout,
            finished.stderr,
        ),
        Err(NotFinished::TimedOut(_)) => (None, true, Vec::new(), Vec::new()),
        Err(NotFinished::NotStarted(why)) if in_work_dir(&check.run[0]) => {
            let why = format!(
                "cannot start `{}`, which is in the work directory the agent could change: {why}",
                check.run[0]
            );
            return Ok(failed(check, started, why));
        }
        Err(NotFinished::NotStarted(why)) => {
            return Err(format!("cannot start `{}`: {why}", check.run[0]))
        }
    };
    let mut outcome = serde_json::json!({
        "check": check.name,
        "passed": exit_code == Some(0),
        "exitCode": exit_code,
        "timedOut": timed_out,
        "durationMs": started.elapsed().as_millis() as u64,
        "stdout": tail(&stdout),
        "stderr": tail(&stderr),
    });
    match read_reward(&reward_file) {
        Some(Ok(reward)) => outcome["reward"] = reward.into(),
        Some(Err(why)) => outcome["rewardError"] = why.into(),
        None => {}
    }
    let _ = std::fs::remove_file(&reward_file);
    Ok(outcome)
}

/// Lays `check`'s hidden files, if it has any, over the work directory (the names laid):
/// `Err` when mst could not give them (infra), `Ok(Err)` when they could not be laid there
/// (what the agent left in the way: the check fails).
fn with_files(
    check: &CheckSpec,
    place: &TrialPlace<'_>,
    fetch: &FetchFiles<'_>,
) -> Result<Result<Vec<std::path::PathBuf>, String>, String> {
    if check.files.is_none() {
        return Ok(Ok(Vec::new()));
    }
    let archive = fetch(&check.name).map_err(|why| format!("its hidden files: {why}"))?;
    Ok(crate::workspace::lay_over(&archive[..], place.work)
        .map_err(|e| format!("cannot lay the check's hidden files in the work directory: {e:#}")))
}

/// The event of `check`, failed before it ran for `why`.
fn failed(check: &CheckSpec, started: Instant, why: String) -> serde_json::Value {
    serde_json::json!({
        "check": check.name,
        "passed": false,
        "exitCode": null,
        "timedOut": false,
        "durationMs": started.elapsed().as_millis() as u64,
        "stdout": "",
        "stderr": why,
    })
}

/// The reward a check left in `file`: none when it wrote none, an error when it is not one
/// number in [0, 1].
fn read_reward(file: &std::path::Path) -> Option<Result<f64, String>> {
    use std::io::Read;
    let mut text = String::new();
    // A number is short: the first 64 bytes say whether it is one.
    let read = std::fs::File::open(file)
        .ok()?
        .take(64)
        .read_to_string(&mut text);
    let value = read.ok().and_then(|_| text.trim().parse::<f64>().ok());
    Some(match value {
        Some(value) if (0.0..=1.0).contains(&value) => Ok(value),
        _ => Err(format!(
            "${REWARD_ENV} holds {:?}, not a number in [0, 1]",
            text.trim().chars().take(40).collect::<String>()
        )),
    })
}

/// Whether `program` is found relative to the work directory (a relative path with a `/`), not
/// on the `PATH` or at an absolute path.
fn in_work_dir(program: &str) -> bool {
    program.contains('/') && !program.starts_with('/')
}

/// The last [`MAX_CHECK_OUTPUT`] bytes of `bytes` as text (invalid UTF-8 replaced).
fn tail(bytes: &[u8]) -> String {
    let mut from = bytes.len().saturating_sub(MAX_CHECK_OUTPUT);
    // Start on a character, not inside one.
    while from < bytes.len() && from > 0 && (bytes[from] & 0xC0) == 0x80 {
        from += 1;
    }
    String::from_utf8_lossy(&bytes[from..]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::NoEvents;
    use std::path::Path;

    /// An unsandboxed trial working (and at home) in `dir`.
    fn place(dir: &Path) -> TrialPlace<'_> {
        TrialPlace {
            work: dir,
            home: dir,
            sandbox: None,
            proxy: None,
        }
    }

    /// What checks without hidden files never ask for.
    fn no_files(check: &str) -> Result<Vec<u8>, String> {
        Err(format!("check `{check}` has no hidden files"))
    }

    fn check(name: &str, run: &[&str], timeout: f64) -> CheckSpec {
        CheckSpec {
            name: name.into(),
            run: run.iter().map(|s| s.to_string()).collect(),
            timeout,
            files: None,
        }
    }

    #[test]
    fn a_check_may_leave_a_reward_and_one_the_agent_planted_is_not_its() {
        let dir = tempfile::tempdir().unwrap();
        // Planted before the checks run: it must not count for a check that writes none.
        std::fs::write(dir.path().join(REWARD_FILE), "1").unwrap();
        let checks = [
            check("silent", &["true"], 10.0),
            check(
                "partial",
                &["sh", "-c", "echo 0.75 > \"$MST_CHECK_REWARD\""],
                10.0,
            ),
            check(
                "bad",
                &["sh", "-c", "echo lots > \"$MST_CHECK_REWARD\""],
                10.0,
            ),
            check(
                "over",
                &["sh", "-c", "echo 1.5 > \"$MST_CHECK_REWARD\""],
                10.0,
            ),
        ];
        let mut trace = TraceRecord::default();
        run_checks(
            &checks,
            &place(dir.path()),
            &mut trace,
            &NoEvents,
            &no_files,
        );
        let silent = trace.check_outcome("silent").unwrap();
        assert!(silent.get("reward").is_none(), "{silent}");
        assert_eq!(trace.check_outcome("partial").unwrap()["reward"], 0.75);
        for name in ["bad", "over"] {
            let outcome = trace.check_outcome(name).unwrap();
            assert!(outcome.get("reward").is_none(), "{outcome}");
            let why = outcome["rewardError"].as_str().unwrap();
            assert!(why.contains("not a number in [0, 1]"), "{why}");
        }
        assert!(!dir.path().join(REWARD_FILE).exists(), "removed after");
    }

    #[test]
    fn each_check_becomes_an_event_in_the_trials_directory_and_a_missing_program_is_infra() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("made.txt"), "by the agent").unwrap();
        let mut trace = TraceRecord {
            duration_ms: 100,
            ..TraceRecord::default()
        };
        let checks = [
            check("file", &["test", "-f", "made.txt"], 10.0),
            check(
                "says",
                &["sh", "-c", "echo out; echo err >&2; exit 3"],
                10.0,
            ),
            check("slow", &["sleep", "5"], 0.2),
        ];
        run_checks(
            &checks,
            &place(dir.path()),
            &mut trace,
            &NoEvents,
            &no_files,
        );
        assert_eq!(trace.status, TrialStatus::Completed);
        assert_eq!(trace.events.len(), 3);
        let file = trace.check_outcome("file").unwrap();
        assert_eq!(
            (file["passed"].clone(), file["exitCode"].clone()),
            (true.into(), 0.into())
        );
        let says = trace.check_outcome("says").unwrap();
        assert_eq!(says["exitCode"], 3);
        assert_eq!(
            (says["stdout"].as_str(), says["stderr"].as_str()),
            (Some("out\n"), Some("err\n"))
        );
        let slow = trace.check_outcome("slow").unwrap();
        assert_eq!(
            (slow["timedOut"].clone(), slow["passed"].clone()),
            (true.into(), false.into())
        );
        assert_eq!(trace.failed_checks(), ["says", "slow"]);
        assert_eq!(trace.failure().unwrap(), "its checks failed: says, slow");
        assert!(trace.events.iter().all(|e| e.at_ms >= 100));

        let mut trace = TraceRecord::default();
        let checks = [
            check("gone", &["/nonexistent/prog"], 10.0),
            check("never", &["true"], 10.0),
        ];
        run_checks(
            &checks,
            &place(dir.path()),
            &mut trace,
            &NoEvents,
            &no_files,
        );
        assert_eq!(trace.status, TrialStatus::Infra);
        assert_eq!(
            trace.events.len(),
            1,
            "the list stops at the check that cannot run"
        );
        assert!(trace
            .failure()
            .unwrap()
            .contains("check `gone` could not run"));

        // A program the agent could have removed from its own directory fails its check: the
        // agent cannot excuse its failure as infra (security review M2).
        let mut trace = TraceRecord::default();
        let checks = [
            check("removed", &["./run_tests.sh"], 10.0),
            check("next", &["true"], 10.0),
        ];
        run_checks(
            &checks,
            &place(dir.path()),
            &mut trace,
            &NoEvents,
            &no_files,
        );
        assert_eq!(trace.status, TrialStatus::Completed);
        let removed = trace.check_outcome("removed").unwrap();
        assert_eq!(removed["passed"], false);
        assert!(
            removed["stderr"]
                .as_str()
                .unwrap()
                .contains("work directory"),
            "{removed}"
        );
        assert_eq!(trace.failed_checks(), ["removed"]);
        assert!(trace.check_outcome("next").is_some(), "the list goes on");
    }

    #[test]
    fn a_long_output_keeps_its_end_on_a_character_boundary() {
        let text = format!("{}é{}", "a".repeat(10), "b".repeat(MAX_CHECK_OUTPUT - 1));
        let kept = tail(text.as_bytes());
        assert!(kept.len() <= MAX_CHECK_OUTPUT && kept.ends_with('b'));
        assert!(!kept.contains('\u{FFFD}'));
    }
}
