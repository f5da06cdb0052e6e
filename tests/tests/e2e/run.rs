//! `mst run` end to end on the local runner: the real binary, real subprocess workers speaking
//! mst.shard/v1, the command client, and the wasm `contains` grader.

use mst_tests::{cases, only_run, plugin, read_json, read_trace, root, s, Eval, Mst, Run};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn config(command: Value) -> Value {
    json!({
        "name": "e2e",
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": command},
        "judges": [{"plugin": s(&plugin("contains.wasm"))}],
        "plugins": [s(&plugin("contains.wasm"))],
        "concurrency": 1,
        "timeout": 20
    })
}

#[test]
fn the_quickstart_runs_and_records_everything() {
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let junit = results.path().join("junit.xml");
    let config = root().join("examples/quickstart/eval.json");
    let run = mst.run(&[
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(results.path()),
        "--junit",
        s(&junit),
    ]);
    // The echo-only variant fails two cases on purpose: exit 1 means "ran, some failed".
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout.contains("echo-only") && run.stdout.contains("33.3%"),
        "{}",
        run.stdout
    );

    let dir = &only_run(results.path(), "quickstart");
    let record = read_json(&dir.join("run.json"));
    assert_eq!(record["mst"], env!("CARGO_PKG_VERSION"));
    assert_eq!(record["runner"], "local");
    assert_eq!(record["shards"], 1);
    assert_eq!(record["collect"], "complete");
    assert_eq!(record["grade"], "complete");
    assert_eq!(record["trials"].as_array().unwrap().len(), 12);
    assert_eq!(record["configHash"].as_str().unwrap().len(), 64);
    assert_eq!(record["datasetHash"].as_str().unwrap().len(), 64);
    assert!(
        record["git"]["commit"].is_string(),
        "the repo's commit is recorded: {}",
        record["git"]
    );
    let plugins = record["plugins"].as_array().unwrap();
    assert_eq!(plugins[0]["name"], "mst/grader/contains");
    assert_eq!(plugins[0]["digest"].as_str().unwrap().len(), 64);
    let machine = &record["machines"][0];
    assert_eq!(machine["ended"]["status"], "done");
    assert_eq!(machine["worker"]["mst"], env!("CARGO_PKG_VERSION"));
    // The worker's own peak memory, as its `done` said: a real process's, in bytes.
    let peak = machine["workerPeakRssBytes"].as_u64().unwrap();
    assert!((1 << 20..1 << 30).contains(&peak), "{machine}");

    let trace = read_trace(dir, "baseline/tokyo-time/0");
    assert_eq!(trace["case"]["id"], "tokyo-time");
    assert_eq!(trace["trace"]["finalText"], "It is 09:00 in Asia/Tokyo");
    assert_eq!(trace["trace"]["exitCode"], 0);
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["variants"]["baseline"]["passed"], 3);
    assert_eq!(summary["variants"]["echo-only"]["failed"], 2);
    assert_eq!(summary["cases"]["echo-only"]["tokyo-time"], "failed");
    assert_eq!(
        read_json(&dir.join("scores/mentions-expected.json"))
            .as_array()
            .unwrap()
            .len(),
        12
    );
    let xml = std::fs::read_to_string(&junit).unwrap();
    assert!(
        xml.contains("<testsuite name=\"echo-only\" tests=\"3\" failures=\"2\""),
        "{xml}"
    );

    let only = mst.run(&[
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(results.path()),
        "--variant",
        "baseline",
        "--json",
        "-q",
    ]);
    assert_eq!(only.code, 0, "{}", only.stderr);
    assert_eq!(only.json()["variants"]["baseline"]["passRate"], 1.0);
    let list = mst
        .run(&["runs", "list", "--results-dir", s(results.path()), "--json"])
        .json();
    assert_eq!(list.as_array().unwrap().len(), 2);
    let id = list[1]["runId"].as_str().unwrap();
    let show = mst.run(&["runs", "show", id, "--results-dir", s(results.path())]);
    assert!(
        show.code == 0 && show.stdout.contains("baseline"),
        "{}",
        show.stderr
    );
}

#[test]
fn a_worker_killed_mid_run_leaves_missing_trials_that_resume_collects() {
    let mst = Mst::new();
    let marker = tempfile::tempdir().unwrap();
    let mark = marker.path().join("killed");
    // The third case's first attempt kills the worker (its parent) with SIGKILL: unsandboxed,
    // where an agent can reach its worker and leave a mark outside its trial.
    let script = format!(
        "read q; case \"$q\" in *3*) [ -e {m} ] || {{ touch {m}; kill -9 $PPID; sleep 5; }};; esac; echo \"$q\"",
        m = mark.display()
    );
    let eval = Eval::new(config(json!(["sh", "-c", script])), &cases(5));
    let first = eval.run(&mst, &["--runner-option", "isolation=none"]);
    assert_eq!(
        first.code, 2,
        "a partial collection exits 2\n{}\n{}",
        first.stdout, first.stderr
    );
    assert!(
        first.stdout.contains("partial") && first.stdout.contains("--resume"),
        "{}",
        first.stdout
    );
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    let missing = summary["missing"].as_array().unwrap().len();
    assert!(missing >= 1, "{summary}");
    assert_eq!(summary["collect"], "partial");
    assert!(
        summary["variants"]["default"]["incomplete"]
            .as_u64()
            .unwrap()
            >= 1
    );
    let record = read_json(&dir.join("run.json"));
    assert_eq!(
        record["machines"][0]["ended"]["status"], "lost",
        "{}",
        record["machines"]
    );

    let run_id = dir.file_name().unwrap().to_str().unwrap().to_string();
    let resumed = eval.run(
        &mst,
        &["--resume", &run_id, "--runner-option", "isolation=none"],
    );
    assert_eq!(resumed.code, 0, "{}\n{}", resumed.stdout, resumed.stderr);
    assert!(
        resumed.stderr.contains(&format!("[{missing}/{missing}]")),
        "only the missing trials ran: {}",
        resumed.stderr
    );
    assert_eq!(eval.run_dir("e2e"), dir, "the same run");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["collect"], "complete");
    assert_eq!(summary["variants"]["default"]["passed"], 5);
    assert_eq!(
        read_json(&dir.join("run.json"))["machines"]
            .as_array()
            .unwrap()
            .len(),
        2
    );
}

fn fake_worker(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("worker.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn a_worker_of_another_version_is_refused_at_hello() {
    let mst = Mst::new();
    let eval = Eval::new(config(json!(["cat"])), &cases(2));
    let hello = r#"{"type":"hello","protocol":"mst.shard/v1","mst":"9.9.9","client":{"name":"command","version":"9.9.9"},"shard":0}"#;
    let worker = fake_worker(eval.dir.path(), &format!("echo '{hello}'\nsleep 30"));
    let started = Instant::now();
    let run = eval.run(
        &mst,
        &["--runner-option", &format!("worker={}", worker.display())],
    );
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(started.elapsed() < Duration::from_secs(20));
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let ended = &record["machines"][0]["ended"];
    assert_eq!(ended["status"], "version-mismatch", "{ended}");
    assert!(
        ended["reason"].as_str().unwrap().contains("mst 9.9.9"),
        "{ended}"
    );
    assert!(run.stderr.contains("exact version"), "{}", run.stderr);
}

#[test]
fn a_silent_worker_is_declared_lost() {
    let mst = Mst::new();
    let eval = Eval::new(config(json!(["cat"])), &cases(2));
    let worker = fake_worker(eval.dir.path(), "sleep 60");
    let started = Instant::now();
    let run = eval.run(
        &mst,
        &[
            "--runner-option",
            &format!("worker={}", worker.display()),
            "--silence-limit",
            "1",
        ],
    );
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    assert!(record["machines"][0]["ended"]["reason"]
        .as_str()
        .unwrap()
        .contains("sent nothing for 1s"));
}

#[test]
fn ctrl_c_cancels_the_shard_and_leaves_the_rest_missing() {
    let mst = Mst::new();
    let eval = Eval::new(config(json!(["sh", "-c", "sleep 31.25"])), &cases(3));
    let config = eval.config();
    let results = eval.results();
    let child = mst
        .command(&[
            "run",
            "--config",
            s(&config),
            "--results-dir",
            s(&results),
            "--cancel-grace",
            "3",
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the first trial is running.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !process_running("sleep 31.25") {
        assert!(Instant::now() < deadline, "the trial never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    let started = Instant::now();
    std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let run = Run::from(output);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "{:?}",
        started.elapsed()
    );
    assert!(run.stderr.contains("interrupted"), "{}", run.stderr);
    let summary = read_json(&eval.run_dir("e2e").join("summary.json"));
    assert_eq!(
        summary["missing"].as_array().unwrap().len(),
        3,
        "a cancelled trial is missing, not failed"
    );
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        !process_running("sleep 31.25"),
        "the trial's processes were stopped"
    );
}

fn process_running(pattern: &str) -> bool {
    std::process::Command::new("pgrep")
        .args(["-f", pattern])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

/// The most trials that overlapped, from `start`/`end` lines with nanosecond timestamps.
fn max_overlap(log: &Path) -> usize {
    let text = std::fs::read_to_string(log).unwrap();
    let mut events: Vec<(u128, i32)> = text
        .lines()
        .map(|line| {
            let (kind, at) = line.split_once(' ').unwrap();
            (
                at.trim().parse::<u128>().unwrap(),
                if kind == "start" { 1 } else { -1 },
            )
        })
        .collect();
    events.sort();
    let (mut now, mut peak) = (0i32, 0i32);
    for (_, delta) in events {
        now += delta;
        peak = peak.max(now);
    }
    peak as usize
}

#[test]
fn limits_hold_across_concurrent_trials() {
    let mst = Mst::new();
    let scratch = tempfile::tempdir().unwrap();
    let limited_log = scratch.path().join("limited.log");
    let free_log = scratch.path().join("free.log");
    // The trials log to the test's files: unsandboxed, so they can write there.
    let with_log = |log: &Path, limited: bool| {
        let script = format!(
            "echo start $(date +%s%N) >> {l}; sleep 0.3; echo end $(date +%s%N) >> {l}; cat",
            l = log.display()
        );
        let mut config = config(json!(["sh", "-c", script]));
        config["concurrency"] = json!(4);
        config["servers"] = json!({"slot": {"command": "true"}});
        if limited {
            config["limits"] = json!({"servers": {"slot": 1}});
        }
        Eval::new(config, &cases(6))
    };
    let limited = with_log(&limited_log, true);
    let unsandboxed = ["-q", "--runner-option", "isolation=none"];
    assert_eq!(limited.run(&mst, &unsandboxed).code, 0);
    assert_eq!(max_overlap(&limited_log), 1, "the server limit of 1 held");
    // The same eval without the limit overlaps, so the check above can fail.
    let free = with_log(&free_log, false);
    assert_eq!(free.run(&mst, &unsandboxed).code, 0);
    assert!(max_overlap(&free_log) > 1);
}

#[test]
fn a_run_leaves_nothing_in_the_temporary_directory() {
    // The run's own temporary directory: the local machine, the bundles staged and the
    // trials' scratch directories are made there, and all must be gone when mst exits.
    let mst = Mst::new();
    let tmp = tempfile::tempdir().unwrap();
    let mut config = config(json!(["sh", "-c", "echo hi > note.txt; cat"]));
    config["concurrency"] = json!(3);
    let eval = Eval::new(config, &cases(9));
    let run: Run = mst
        .command(&eval.args(&["-q"]))
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&only_run(&eval.results(), "e2e").join("run.json"));
    let machine = record["machines"][0]["placement"]["dir"].as_str().unwrap();
    assert!(
        machine.starts_with(&*tmp.path().to_string_lossy()),
        "the local machine was made in the run's TMPDIR: {machine}"
    );
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in TMPDIR: {left:?}");
}

#[test]
fn a_bad_config_exits_2_and_names_the_key() {
    let mst = Mst::new();
    let mut bad = config(json!(["cat"]));
    bad["trails"] = json!(2);
    let eval = Eval::new(bad, &cases(1));
    let run = eval.run(&mst, &[]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("eval.json")
            && run.stderr.contains("`trails`")
            && run.stderr.contains("`trials`"),
        "{}",
        run.stderr
    );
    assert!(!eval.results().exists(), "nothing was written");
}

#[test]
fn grade_regrades_stored_traces_into_a_new_run() {
    let mst = Mst::new();
    let eval = Eval::new(config(json!(["cat"])), &cases(3));
    assert_eq!(eval.run(&mst, &["-q"]).code, 0);
    let dir = eval.run_dir("e2e");
    let run_id = dir.file_name().unwrap().to_str().unwrap().to_string();

    // Stricter judges, same traces: nothing is collected again.
    let mut stricter = config(json!(["cat"]));
    stricter["judges"] = json!([{"assert": "contains", "value": "no such text"}]);
    std::fs::write(eval.config(), stricter.to_string()).unwrap();
    let results = eval.results();
    let regraded = mst.run(&[
        "grade",
        &run_id,
        "--config",
        s(&eval.config()),
        "--results-dir",
        s(&results),
        "--json",
    ]);
    assert_eq!(regraded.code, 1, "{}\n{}", regraded.stdout, regraded.stderr);
    assert_eq!(regraded.json()["variants"]["default"]["failed"], 3);
    let g1 = dir.with_file_name(format!("{run_id}.g1"));
    assert_eq!(
        read_json(&g1.join("summary.json"))["variants"]["default"]["failed"],
        3
    );
    assert_eq!(
        read_json(&dir.join("summary.json"))["variants"]["default"]["passed"],
        3,
        "the original run is untouched"
    );
    let again = mst.run(&[
        "grade",
        &run_id,
        "--config",
        s(&eval.config()),
        "--results-dir",
        s(&results),
    ]);
    assert!(
        again.stdout.contains(&format!("{run_id}.g2")),
        "{}",
        again.stdout
    );
    // The regrade lists what did not pass, with the stricter judge's reason.
    assert!(
        again
            .stdout
            .contains("failed (3 cases):\n  default  c1  1/1 trials failed: contains: "),
        "{}",
        again.stdout
    );
}

#[test]
fn a_dataset_plugin_resolves_the_cases() {
    let mst = Mst::new();
    let mut with_plugin = config(json!(["cat"]));
    with_plugin["datasets"] =
        json!([{"type": "mst/dataset/jsonl", "path": "cases.jsonl", "limit": 2}]);
    with_plugin["plugins"] = json!([s(&plugin("contains.wasm")), s(&plugin("jsonl.wasm"))]);
    let eval = Eval::new(with_plugin, &cases(3));
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.json()["variants"]["default"]["passed"],
        2,
        "the plugin's `limit` option applied"
    );
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let names: Vec<&str> = record["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&"mst/dataset/jsonl"), "{names:?}");
}

#[test]
fn a_broken_judge_makes_trials_not_graded_and_the_run_exit_2() {
    let mst = Mst::new();
    // `contains` with no `value` and cases without `expected`: the grader returns an error.
    let cases: Vec<Value> = (1..=2)
        .map(|i| json!({"id": format!("c{i}"), "input": "x"}))
        .collect();
    let eval = Eval::new(config(json!(["cat"])), &cases);
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    assert_eq!(summary["grade"], "partial");
    assert_eq!(summary["variants"]["default"]["notGraded"], 2);
    assert_eq!(
        summary["variants"]["default"]["failed"], 0,
        "not graded is not failed"
    );
    assert!(summary["variants"]["default"]["passRate"].is_null());
    let grades = read_json(&eval.run_dir("e2e").join("grades.json"));
    assert_eq!(grades[0]["grade"]["outcome"], "not-graded");
    assert!(
        grades[0]["grade"]["error"]
            .as_str()
            .unwrap()
            .contains("invalid options"),
        "{grades}"
    );
}

#[test]
fn the_summary_lists_what_did_not_pass_grouped_with_reasons_and_capped() {
    let mst = Mst::new();
    // 30 cases answered wrongly (failed), one with nothing to compare with (not graded: the
    // judge errs), one right; variant `broken` cannot start its agent (infra, every case).
    let mut cases: Vec<Value> = (1..=30)
        .map(|i| json!({"id": format!("c{i:02}"), "input": "an answer", "expected": "Tokyo"}))
        .collect();
    cases.push(json!({"id": "unjudged", "input": "x"}));
    cases.push(json!({"id": "right", "input": "Tokyo", "expected": "Tokyo"}));
    let mut with_broken = config(json!(["cat"]));
    with_broken["judges"] = json!([{"name": "mentions", "plugin": s(&plugin("contains.wasm"))}]);
    with_broken["variants"] = json!({
        "default": {},
        "broken": {"clientOptions": {"command": ["/nonexistent/agent"]}}
    });
    with_broken["concurrency"] = json!(4);
    let eval = Eval::new(with_broken, &cases);
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let id = dir.file_name().unwrap().to_str().unwrap().to_string();
    let listed = |stdout: &str| -> Vec<String> {
        let start = stdout.find("\nfailed (").expect("a failure list");
        stdout[start..].lines().map(str::to_string).collect()
    };
    let lines = listed(&run.stdout);
    let reason = "mentions: found 0 of 1; missing \"Tokyo\"";
    let mut expected = vec![String::new(), "failed (30 cases):".to_string()];
    for i in 1..=18 {
        expected.push(format!("  default  c{i:02}  1/1 trials failed: {reason}"));
    }
    expected.extend([String::new(), "not graded (1 case):".into()]);
    assert_eq!(lines[..expected.len()], expected[..], "{}", run.stdout);
    let broken_judge = &lines[expected.len()];
    assert!(
        broken_judge.starts_with(
            "  default  unjudged  1/1 trials not graded: judge `mentions`: plugin mst/grader/contains"
        ) && broken_judge.contains("(invalid options): no text to look for"),
        "{}",
        run.stdout
    );
    expected.push(broken_judge.clone());
    let rest = lines[expected.len()..].join("\n");
    assert!(
        rest.starts_with(
            "\ninfra (32 trials):\n  32 trials: the machine says: cannot start `/nonexistent/agent`: "
        )
            && rest.contains("(broken/c01 and 31 other cases)"),
        "{}",
        run.stdout
    );
    // The last line says where the time went (collection, then the grading left after it).
    let (rest, time) = rest.rsplit_once('\n').expect("a time line");
    assert!(
        time.starts_with("time:    collected in ") && time.contains("graded as they arrived"),
        "{}",
        run.stdout
    );
    // Each infra trial left its diagnosis: the machine's state and its processes.
    assert!(
        rest.ends_with(&format!(
            "... and 12 more: `mst report {id}` shows them all\nreport: {}\nresults: {}\n\
             artifacts: 64 file(s) from 32 trial(s) in {}",
            dir.join("report.html").display(),
            dir.display(),
            dir.join("artifacts").display()
        )),
        "{}",
        run.stdout
    );

    // `runs show` lists the same, and the HTML report the run left.
    assert!(std::fs::read_to_string(dir.join("report.html"))
        .unwrap()
        .starts_with("<!doctype html>"));
    let results = eval.results();
    let show = mst.run(&["runs", "show", &id, "--results-dir", s(&results)]);
    assert_eq!(show.code, 0, "{}", show.stderr);
    assert_eq!(listed(&show.stdout)[..expected.len()], expected[..]);
    assert!(
        show.stdout.contains(&format!(
            "shows them all\nreport: {}\nresults: ",
            dir.join("report.html").display()
        )),
        "{}",
        show.stdout
    );
    // The JSON stays summary.json's shape.
    let json = mst.run(&["runs", "show", &id, "--results-dir", s(&results), "--json"]);
    assert_eq!(json.json(), read_json(&dir.join("summary.json")));
}

#[test]
fn a_junit_file_that_cannot_be_written_fails_the_process_and_its_record_says_so() {
    let mst = Mst::new();
    let eval = mst_tests::command_eval(json!(["cat"]), 1, 30);
    // Below a file: no directory can be made there.
    let junit = eval.config().join("junit.xml");
    let run = eval.run(&mst, &["-q", "--junit", s(&junit)]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("cannot write --junit"),
        "{}",
        run.stderr
    );
    // The run passed; its process did not, and its record says what the process said.
    let dir = eval.run_dir("e2e");
    assert_eq!(
        read_json(&dir.join("summary.json"))["variants"]["default"]["passed"],
        1
    );
    assert_eq!(read_json(&dir.join("process.json"))["exitCode"], 1);
}

#[test]
fn sim_machines_lost_mid_run_cost_only_their_trials_and_resume_collects_exactly_those() {
    let mst = Mst::new();
    let cases: Vec<Value> = (0..40)
        .map(|i| json!({"id": format!("c{i:02}"), "input": format!("answer {i}")}))
        .collect();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "api", "model": "mock/echo",
               "judges": [{"assert": "contains", "value": "answer"}], "timeout": 30}),
        &cases,
    );
    // Four machines 5 ms away; one is lost after its worker's third line, and one other is
    // never made.
    let sim = |kill: &str, fail: &str| -> Vec<String> {
        let options = ["shards=4", "latency-ms=5", "kill-after-lines=3", "seed=3"];
        let mut args = vec!["--runner".to_string(), "sim".to_string()];
        for option in options
            .iter()
            .map(|o| o.to_string())
            .chain([format!("kill={kill}"), format!("create-fail={fail}")])
        {
            args.extend(["--runner-option".to_string(), option]);
        }
        args
    };
    let args = sim("0.25", "0.25");
    let first = eval.run(&mst, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(first.code, 2, "{}\n{}", first.stdout, first.stderr);
    assert!(
        first.stderr.contains("simulated machines: latency 5 ms"),
        "{}",
        first.stderr
    );
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    let missing: Vec<String> = (summary["missing"].as_array().unwrap().iter())
        .map(|k| k.to_string())
        .collect();
    // The machine never made took its share; the lost one what it had not reported.
    assert!(!missing.is_empty() && missing.len() < 40, "{summary}");
    let record = read_json(&dir.join("run.json"));
    let ended: Vec<String> = (record["machines"].as_array().unwrap().iter())
        .map(|m| m["ended"].to_string())
        .collect();
    assert!(
        ended.iter().any(|e| e.contains("cannot create a machine")),
        "{ended:?}"
    );
    assert!(ended.iter().any(|e| e.contains("lost")), "{ended:?}");

    // Resumed on machines that are not lost: exactly the missing trials run, once each.
    let run_id = dir.file_name().unwrap().to_str().unwrap().to_string();
    let mut args = sim("0", "0");
    args.extend(["--resume".to_string(), run_id]);
    let resumed = eval.run(&mst, &args.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(resumed.code, 0, "{}\n{}", resumed.stdout, resumed.stderr);
    let n = missing.len();
    assert!(
        resumed.stderr.contains(&format!("[{n}/{n}]")),
        "{}",
        resumed.stderr
    );
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["variants"]["default"]["passed"], 40, "{summary}");
    let lines = std::fs::read_to_string(dir.join("traces.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 40, "each trial stored once");
}
