//! Live trace events (issue 13, item 3): a running trial's events travel from the worker to
//! the coordinator as `event` messages the moment the client records them, `mst run -v` shows
//! them as they come, and what streamed is what the sealed trace holds. Each test drives the
//! built `mst` on the real local runner; where the worker is hostile, a stand-in script plays it.

use mst_tests::{command_eval, read_json, read_trace, s, stand_in_worker, Eval, Mst};
use serde_json::json;
use std::io::BufRead;
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// The stderr lines of a running `mst`, as they come.
fn lines_of(child: &mut std::process::Child) -> mpsc::Receiver<String> {
    let stderr = child.stderr.take().expect("piped stderr");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// Reads `lines` until one contains `needle` (at most `limit`); returns every line read.
fn wait_for_line(lines: &mpsc::Receiver<String>, needle: &str, limit: Duration) -> Vec<String> {
    let deadline = Instant::now() + limit;
    let mut seen = Vec::new();
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) => {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
            Err(_) => break,
        }
    }
    panic!(
        "no line with {needle:?} within {limit:?}; saw:\n{}",
        seen.join("\n")
    )
}

/// Checks that the `-v` lines of trial `key` in `lines` are one per event of its sealed
/// `trace`, in order, each naming the event's seq, time and summary (or saying an event too
/// large to stream is in the trace): what streamed is what the trace holds, all of it unless
/// the stream was cut at its cap (`whole` false: a prefix of it). Returns how many streamed.
fn assert_streamed_is_the_trace(
    lines: &[String],
    key: &str,
    trace: &serde_json::Value,
    whole: bool,
) -> usize {
    use mst::eval::trial::TraceEvent;
    let events: Vec<TraceEvent> =
        serde_json::from_value(trace["trace"]["events"].clone()).expect("trace events");
    let head = format!("trial {key} event ");
    let streamed: Vec<&String> = lines.iter().filter(|l| l.contains(&head)).collect();
    let all = lines.join("\n");
    match whole {
        true => assert_eq!(streamed.len(), events.len(), "{all}"),
        false => assert!(streamed.len() <= events.len(), "{all}"),
    }
    for (line, event) in streamed.iter().zip(&events) {
        let too_large =
            mst::shard::protocol::event_bytes(event) > mst::shard::protocol::MAX_EVENT_BYTES;
        let expected = match too_large {
            true => format!("{head}{}: too large to stream (see its trace)", event.seq),
            false => format!(
                "{head}{} at {} ms: {}",
                event.seq,
                event.at_ms,
                event.summary(200)
            ),
        };
        assert!(line.ends_with(&expected), "{line}\nis not\n{expected}");
    }
    streamed.len()
}

#[test]
fn a_running_trials_events_are_shown_before_it_ends_and_equal_its_trace() {
    let dir = tempfile::tempdir().unwrap();
    let mst = Mst::exposing(&[dir.path()]);
    let marker = dir.path().join("seen");
    // The agent records a step, then waits until the test has seen that step on `mst run -v`
    // (it makes the marker): without live events this trial could only time out. Then a tool
    // call carrying a secret, a log line, an event too large to stream, and the answer.
    let agent = format!(
        r#"echo '{{"type":"message","role":"assistant","text":"step one"}}'
while [ ! -f {marker} ]; do sleep 0.05; done
echo '{{"type":"tool-call","id":"1","server":"time","tool":"now","arguments":{{"key":"'"$TOKEN"'"}}}}'
echo "warming up" >&2
sleep 0.3
big=$(head -c 20000 /dev/zero | tr '\0' x)
echo '{{"type":"tool-result","id":"1","output":"'"$big"'"}}'
echo "the answer""#,
        marker = s(&marker)
    );
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "events": true,
                                 "secretEnv": {"TOKEN": "STREAM_TOKEN"}},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &[json!({"id": "c1", "input": "go"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "STREAM_TOKEN=mst-canary-stream-7f3a\n").unwrap();
    let mut child = eval.spawn(&mst, &["-v", "--secrets-file", s(&secrets)]);
    let lines = lines_of(&mut child);
    let mut seen = wait_for_line(
        &lines,
        "trial default/c1/0 event 0",
        Duration::from_secs(20),
    );
    // The trial is still running: it cannot end before the marker exists.
    assert!(child.try_wait().unwrap().is_none(), "mst ended early");
    assert!(
        !eval.results().join("e2e").exists()
            || mst_tests::find_trace(&eval.run_dir("e2e"), "default/c1/0").is_none(),
        "the trace was not there yet"
    );
    std::fs::write(&marker, "").unwrap();
    let status = child.wait().unwrap();
    seen.extend(lines.iter());
    let stderr = seen.join("\n");
    assert!(status.success(), "{stderr}");

    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    let events = trace["trace"]["events"].as_array().unwrap();
    assert_eq!(events.len(), 4, "{trace}");
    // One `-v` line per event of the sealed trace, in its order; the large one is named.
    assert_streamed_is_the_trace(&seen, "default/c1/0", &trace, true);
    let streamed: Vec<&String> = seen
        .iter()
        .filter(|l| l.contains("trial default/c1/0 event "))
        .collect();
    assert!(streamed[3].ends_with("event 3: too large to stream (see its trace)"));
    assert!(streamed[0].ends_with("assistant: step one"), "{stderr}");
    // The tool call (stdout) and the log line (stderr) come on two pipes: their order is the
    // order the client read them in, which the sealed trace shares (checked above).
    let call = streamed[1..3]
        .iter()
        .find(|l| l.contains("tool-call time/now"))
        .unwrap_or_else(|| panic!("no tool-call line: {stderr}"));
    assert!(
        streamed[1..3]
            .iter()
            .any(|l| l.ends_with("log: warming up")),
        "{stderr}"
    );
    assert_eq!(events[3]["output"].as_str().unwrap().len(), 20000);
    // The secret the agent put in its tool call is redacted in the line as in the trace.
    assert!(!stderr.contains("mst-canary-stream-7f3a"), "{stderr}");
    assert!(!trace.to_string().contains("mst-canary-stream-7f3a"));
    assert!(call.contains("STREAM_TOKEN"), "{stderr}");
}

#[test]
fn events_are_shown_at_verbose_only() {
    let mst = Mst::new();
    let eval = command_eval(
        json!([
            "sh",
            "-c",
            r#"echo '{"type":"log","text":"quiet step"}'; echo done"#
        ]),
        1,
        30,
    );
    let mut config = read_json(&eval.config());
    config["clientOptions"]["events"] = json!(true);
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let run = eval.run(&mst, &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!run.stderr.contains("quiet step"), "{}", run.stderr);
    let run = eval.run(&mst, &["-v"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("trial default/c1/0 event 0 at ")
            && run.stderr.contains("log: quiet step"),
        "{}",
        run.stderr
    );
}

/// Runs `script` as the worker of a one-case eval at `-v`; returns why its shard was lost and
/// the run's stderr.
fn hostile(name: &str, script: &str) -> (String, String) {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    let worker = stand_in_worker(eval.dir.path(), name, script);
    let started = Instant::now();
    let run = eval.run(&mst, &["-v", "--runner-option", &worker]);
    assert!(started.elapsed() < Duration::from_secs(20), "lost at once");
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    (reason.to_string(), run.stderr)
}

const KEY: &str = r#"k='{"variant":"default","case":"c1","trial":0}'"#;

#[test]
fn an_event_for_a_trial_that_is_not_running_loses_the_shard() {
    let script = format!(
        r#"echo "$HELLO"
{KEY}
echo '{{"type":"event","key":'"$k"',"seq":0,"event":{{"seq":0,"atMs":1,"type":"log","text":"forged"}}}}'
sleep 10
"#
    );
    let (reason, stderr) = hostile("unasked.sh", &script);
    assert!(
        reason.contains("streamed event 0 of trial default/c1/0, which is not running"),
        "{reason}"
    );
    assert!(!stderr.contains("forged"), "{stderr}");
}

#[test]
fn an_event_out_of_order_loses_the_shard_after_the_good_ones_are_shown() {
    let script = format!(
        r#"echo "$HELLO"
{KEY}
echo '{{"type":"acquire","key":'"$k"',"servers":[]}}'
read granted
echo '{{"type":"event","key":'"$k"',"seq":0,"event":{{"seq":0,"atMs":1,"type":"log","text":"first"}}}}'
echo '{{"type":"event","key":'"$k"',"seq":2,"event":{{"seq":2,"atMs":2,"type":"log","text":"skipped one"}}}}'
sleep 10
"#
    );
    let (reason, stderr) = hostile("gap.sh", &script);
    assert!(
        reason.contains("streamed event 2 of trial default/c1/0, whose next event is 1"),
        "{reason}"
    );
    assert!(
        stderr.contains("trial default/c1/0 event 0 at 1 ms: log: first"),
        "{stderr}"
    );
    assert!(!stderr.contains("skipped one"), "{stderr}");
}

#[test]
fn an_oversized_event_loses_the_shard() {
    let script = format!(
        r#"echo "$HELLO"
{KEY}
echo '{{"type":"acquire","key":'"$k"',"servers":[]}}'
read granted
big=$(head -c 17000 /dev/zero | tr '\0' x)
echo '{{"type":"event","key":'"$k"',"seq":0,"event":{{"seq":0,"atMs":1,"type":"log","text":"'"$big"'"}}}}'
sleep 10
"#
    );
    let (reason, stderr) = hostile("big.sh", &script);
    assert!(
        reason.contains("over the 16384-byte cap for an event streamed in full"),
        "{reason}"
    );
    assert!(!stderr.contains("xxxxxxxxxx"), "{stderr}");
}

#[test]
fn an_api_agents_messages_and_usage_stream_as_its_trace_records_them() {
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "agent", "datasets": ["cases.jsonl"], "client": "api",
               "model": "mock/echo", "timeout": 30,
               "judges": [{"assert": "exit-code", "value": 0}]}),
        &[json!({"id": "echo", "input": "Tokyo, please"})],
    );
    let run = eval.run(&mst, &["-v"]);
    let trace = read_trace(&eval.run_dir("agent"), "default/echo/0");
    let lines: Vec<String> = run.stderr.lines().map(str::to_string).collect();
    // The user's message, the call's usage and the answer.
    assert_eq!(
        trace["trace"]["events"].as_array().unwrap().len(),
        3,
        "{trace}"
    );
    assert_streamed_is_the_trace(&lines, "default/echo/0", &trace, true);
}

#[test]
fn a_trial_streams_up_to_its_cap_and_its_trace_keeps_every_event() {
    let mst = Mst::new();
    // 5000 events of about 1 KiB: past the 4 MiB a trial may stream.
    let agent = r#"x=$(head -c 1000 /dev/zero | tr '\0' y); i=0
while [ $i -lt 5000 ]; do
  echo '{"type":"custom","name":"step","data":{"i":'$i',"pad":"'$x'"}}'; i=$((i+1))
done; echo ok"#;
    let eval = command_eval(json!(["sh", "-c", agent]), 1, 60);
    let mut config = read_json(&eval.config());
    config["clientOptions"]["events"] = json!(true);
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let run = eval.run(&mst, &["-v"]);
    assert_eq!(run.code, 0, "{}", run.stdout);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    assert_eq!(record["machines"][0]["ended"]["status"], "done", "{record}");
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    assert_eq!(trace["trace"]["events"].as_array().unwrap().len(), 5000);
    let lines: Vec<String> = run.stderr.lines().map(str::to_string).collect();
    let streamed = assert_streamed_is_the_trace(&lines, "default/c1/0", &trace, false);
    // The honest worker stopped before the cap (about 1.1 KiB a line), not at the first event.
    assert!((3000..5000).contains(&streamed), "{streamed} streamed");
}
