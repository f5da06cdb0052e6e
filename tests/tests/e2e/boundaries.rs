//! The boundary between the coordinator and its machines (issue 11): what a machine and the
//! agent on it get to see, what they can send back, and what they cannot make the coordinator
//! do. Each test drives the built `mst` on the real local runner; where the machine is hostile,
//! a stand-in worker script plays it.

use mst_tests::{command_eval, find_trace, read_json, read_trace, stand_in_worker, Eval, Mst};
use serde_json::json;
use std::os::unix::fs::PermissionsExt;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// One case whose answer and metadata the agent must never see.
fn secret_answer_eval(command: serde_json::Value) -> Eval {
    Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": command},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &[json!({"id": "c1", "input": "what is six times seven?",
                 "expected": "answer-canary-42", "metadata": {"hint": "meta-canary"}})],
    )
}

#[test]
fn the_agent_sees_neither_the_answers_nor_the_bundle_directory() {
    let mst = Mst::new();
    // The agent says where it runs and what is there, then finds the bundle through its
    // worker's command line and prints it whole. Unsandboxed, where it can (the sandbox hides
    // the worker, local_isolation.rs): what a machine holds must lack the answers anyway.
    let agent = r#"echo "cwd=$(pwd)"; echo "entries=$(ls -A | wc -l)"
b=$(tr '\0' '\n' < /proc/$PPID/cmdline | sed -n '/^--bundle$/{n;p}')
cat "$b/bundle.json" "$b/work.jsonl""#;
    let eval = secret_answer_eval(json!(["sh", "-c", agent]));
    let run = eval.run(&mst, &["--json", "-q", "--runner-option", "isolation=none"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    let answer = trace["trace"]["finalText"].as_str().unwrap();
    assert!(
        answer.contains("what is six times seven?"),
        "the agent read its bundle: {answer}"
    );
    for hidden in ["answer-canary-42", "meta-canary"] {
        assert!(
            !answer.contains(hidden),
            "the machine held {hidden}: {answer}"
        );
    }
    assert!(answer.contains("entries=0"), "a fresh directory: {answer}");
    let cwd = answer.lines().next().unwrap();
    assert!(
        cwd.contains("mst-trial-") && !cwd.contains("bundle"),
        "{cwd}"
    );
    // The stored trace holds the coordinator's own case, answers included.
    assert_eq!(trace["case"]["expected"], "answer-canary-42", "{trace}");
    assert_eq!(trace["collectedBy"]["shard"], 0, "{trace}");
    assert_eq!(trace["collectedBy"]["client"], "command", "{trace}");
}

#[test]
fn no_token_rests_in_a_file_another_variants_agent_could_read() {
    // Variant `victim` has a secret in its agent's environment; variant `attacker`, in the
    // same shard and running as the same user, searches every file it can reach where a
    // worker could keep tokens (memory-backed file systems, its temporary directory, the
    // machine's directory, the top of /tmp: a whole /tmp of other tests' trees took longer
    // than the trial's deadline on a loaded machine; files small enough to be one) and
    // prints, base64-encoded past the redactor, any file holding the secret's prefix.
    // Unsandboxed, where the agent can read the operator's files (the
    // eval's directory, holding the secrets file, is left out of the search): the worker
    // must keep tokens out of files even there; the sandboxed search is local_isolation.rs's.
    let nonce = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let canary = format!("vict1m-c4n4ry-{nonce:x}");
    let eval = Eval::new(json!({}), &[json!({"id": "c1", "input": "x"})]);
    let search = eval.dir.path().join("search.sh");
    std::fs::write(
        &search,
        format!(
            r#"for f in $( (find /dev/shm /run "${{TMPDIR:-/tmp}}" "$(dirname "$PWD")" -xdev \
      -path '{eval}' -prune -o -type f -size -64k -print; \
    find /tmp -xdev -maxdepth 3 -path '{eval}' -prune -o -type f -size -64k -print) 2>/dev/null); do
  if grep -qa vict1m-c4n4ry "$f" 2>/dev/null; then echo "$f $(base64 -w0 < "$f")"; fi
done
echo searched
"#,
            eval = eval.dir.path().display()
        ),
    )
    .unwrap();
    let config = json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "concurrency": 1,
               "variants": {
                   "victim": {"clientOptions": {"command": ["sh", "-c", "printf %s \"$API_KEY\" | base64 -w0"],
                                                "input": "none", "secretEnv": {"API_KEY": "VICTIM_SECRET"}}},
                   "attacker": {"clientOptions": {"command": ["sh", mst_tests::s(&search)], "input": "none"}}},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 120});
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("VICTIM_SECRET={canary}\n")).unwrap();
    let run = eval.run(
        &Mst::new(),
        &[
            "--json",
            "-q",
            "--secrets-file",
            mst_tests::s(&secrets),
            "--runner-option",
            "isolation=none",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    // The control: the victim's own agent has its secret, and base64 passes the redactor.
    let victim = read_trace(&dir, "victim/c1/0");
    let encoded = victim["trace"]["finalText"].as_str().unwrap();
    assert!(
        encoded.len() > canary.len() && !encoded.contains("redacted"),
        "{victim}"
    );
    let attacker = read_trace(&dir, "attacker/c1/0");
    let found = attacker["trace"]["finalText"].as_str().unwrap();
    assert!(
        found.ends_with("searched"),
        "the search ran to its end: {found}"
    );
    assert!(
        !found.contains(encoded) && !found.contains(&canary),
        "another variant's agent read the secret: {found}"
    );
}

#[test]
fn each_trace_names_the_client_of_its_own_variant() {
    // Two variants on two clients in one shard: the worker's `hello` names one client, but
    // each trace's `collectedBy` names the one that ran it.
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "variants": {"a-api": {"client": "api", "model": "mock/echo"},
                            "b-command": {"clientOptions": {"command": ["cat"]}}},
               "judges": [{"assert": "contains", "value": "q"}]}),
        &[json!({"id": "c1", "input": "q"})],
    );
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    for (variant, client) in [("a-api", "api"), ("b-command", "command")] {
        let trace = read_trace(&eval.run_dir("e2e"), &format!("{variant}/c1/0"));
        assert_eq!(trace["collectedBy"]["client"], client, "{trace}");
        assert_eq!(
            trace["collectedBy"]["clientVersion"],
            env!("CARGO_PKG_VERSION"),
            "{trace}"
        );
    }
}

#[test]
fn a_work_file_the_agent_cuts_short_ends_the_shard_instead_of_hanging_it() {
    let mst = Mst::new();
    // The first trial's agent empties its worker's work file (as the test above, it finds the
    // bundle through the worker's command line, unsandboxed). Each case's line is longer than
    // a read buffer, so the worker has not yet read the cases after the first.
    let agent = r#"b=$(tr '\0' '\n' < /proc/$PPID/cmdline | sed -n '/^--bundle$/{n;p}')
: > "$b/work.jsonl"; echo emptied"#;
    let input = "y".repeat(20_000);
    let cases: Vec<_> = (1..=3)
        .map(|i| json!({"id": format!("c{i}"), "input": input}))
        .collect();
    let eval = Eval::new(
        json!({"name": "cut", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent]}, "concurrency": 1,
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &cases,
    );
    let mut child = eval.spawn(&mst, &["--json", "-q", "--runner-option", "isolation=none"]);
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(60) {
            child.kill().unwrap();
            panic!("the run hung on a work file cut short");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let record = read_json(&eval.run_dir("cut").join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(reason.contains("changed while it was read"), "{reason}");
    assert_eq!(record["collect"], "partial", "{record}");
    let trace = read_trace(&eval.run_dir("cut"), "default/c1/0");
    assert_eq!(trace["trace"]["finalText"], "emptied", "{}", trace["trace"]);
}

/// How a stand-in worker hands its trace back: as a file the coordinator copies, or inside
/// its `trial` message (as mst's own worker sends a trace that fits one line).
#[derive(Debug, Clone, Copy)]
enum Delivery {
    File,
    Inline,
}

/// A stand-in worker that hands back `trace` for trial c1 by `delivery` and reports it with
/// `report` (its status, and error), then finishes.
fn one_trial_worker(
    eval: &Eval,
    trace: &serde_json::Value,
    report: &str,
    delivery: Delivery,
) -> String {
    let (file, inline) = match delivery {
        Delivery::File => (
            format!("mkdir -p \"$r/default/c1\"\ncat > \"$r/default/c1/0.json\" <<'TRACE'\n{trace}\nTRACE"),
            String::new(),
        ),
        Delivery::Inline => (String::new(), format!(",\"trace\":{trace}")),
    };
    let script = format!(
        r#"while [ $# -gt 0 ]; do [ "$1" = --results ] && r=$2; shift; done
{file}
echo "$HELLO"
k='{{"variant":"default","case":"c1","trial":0}}'
echo '{{"type":"acquire","key":'"$k"',"servers":[]}}'
read granted
cat <<'LINE'
{{"type":"trial","key":{{"variant":"default","case":"c1","trial":0}},{report},"path":"x"{inline}}}
LINE
echo '{{"type":"done","counts":{{"collected":1,"infra":0,"skipped":0}},"cleanup":"ok"}}'
"#
    );
    stand_in_worker(eval.dir.path(), "one-trial.sh", &script)
}

#[test]
fn a_trace_with_a_forged_case_counts_as_infra() {
    for delivery in [Delivery::File, Delivery::Inline] {
        let mst = Mst::new();
        let eval = Eval::new(
            json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
                   "clientOptions": {"command": ["cat"]},
                   "judges": [{"assert": "contains", "value": "forged"}], "timeout": 30}),
            &[json!({"id": "c1", "input": "x", "expected": "real"})],
        );
        // The machine answers `forged` and rewrites the case to match its answer.
        let trace = json!({"case": {"id": "c1", "input": "x", "expected": "forged"},
                           "variant": "default", "trial": 0,
                           "trace": {"finalText": "forged", "exitCode": 0}});
        let worker = one_trial_worker(&eval, &trace, r#""status":"collected""#, delivery);
        let run = eval.run(&mst, &["--json", "-q", "--runner-option", &worker]);
        assert_eq!(run.code, 1, "{delivery:?}: {}\n{}", run.stdout, run.stderr);
        assert_eq!(
            run.json()["variants"]["default"]["infra"],
            1,
            "{delivery:?}: {}",
            run.stdout
        );
        let stored = read_trace(&eval.run_dir("e2e"), "default/c1/0");
        assert_eq!(stored["case"]["expected"], "real", "{delivery:?}: {stored}");
        let reason = stored["trace"]["events"][0]["text"].as_str().unwrap();
        assert!(
            reason.contains("not the one the coordinator sent"),
            "{delivery:?}: {reason}"
        );
        // Nothing the machine wrote is kept beside the log: no landed copy, no landing place.
        let names: Vec<String> = std::fs::read_dir(eval.run_dir("e2e"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(
            names.iter().all(|n| n != "default" && !n.starts_with('.'))
                && names.iter().any(|n| n == "traces.jsonl"),
            "{delivery:?}: {names:?}"
        );
    }
}

#[test]
fn a_machine_cannot_excuse_a_failed_trial_as_infra_unseen() {
    for delivery in [Delivery::File, Delivery::Inline] {
        let mst = Mst::new();
        let eval = Eval::new(
            json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
                   "clientOptions": {"command": ["cat"]},
                   "judges": [{"assert": "contains", "value": "right"}], "timeout": 30}),
            &[json!({"id": "c1", "input": "x"})],
        );
        // The client ran and answered wrongly; the worker calls the trial infra.
        let trace = json!({"case": {"id": "c1", "input": "x"}, "variant": "default",
                           "trial": 0, "trace": {"finalText": "wrong", "exitCode": 0}});
        let report = r#""status":"infra","error":"the network blinked""#;
        let worker = one_trial_worker(&eval, &trace, report, delivery);
        let run = eval.run(&mst, &["--json", "--runner-option", &worker]);
        assert_eq!(run.code, 1, "{delivery:?}: {}\n{}", run.stdout, run.stderr);
        let summary = run.json();
        let default = &summary["variants"]["default"];
        assert_eq!(
            default["failed"], 1,
            "{delivery:?}: the trace counts: {summary}"
        );
        assert_eq!(default["infra"], 0, "{delivery:?}: {summary}");
        assert!(
            run.stderr
                .contains("called it an infrastructure failure (the network blinked)"),
            "{delivery:?}: {}",
            run.stderr
        );
    }
}

#[test]
fn a_client_holding_its_pipes_through_setsid_ends_at_the_trial_timeout() {
    let mst = Mst::new();
    // The agent leaves a process outside its group holding stdout for 60 s (given time to
    // leave, so that the group's kill does not catch it first), then answers. Unsandboxed:
    // a sandboxed agent's PID namespace ends with it, taking such a process along.
    let eval = command_eval(
        json!(["sh", "-c", "setsid sleep 60 & sleep 0.5; echo done"]),
        1,
        3,
    );
    let started = Instant::now();
    let run = eval.run(&mst, &["--json", "-q", "--runner-option", "isolation=none"]);
    let took = started.elapsed();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        took < Duration::from_secs(30),
        "the run waited for the setsid child: {took:?}"
    );
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    assert_eq!(trace["trace"]["finalText"], "done", "{trace}");
    let logged = trace["trace"]["events"].to_string();
    assert!(logged.contains("stopped reading"), "{logged}");
}

#[test]
fn a_worker_that_never_reads_cannot_block_the_coordinator() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    // 2,000 trials of one case: far more `granted` lines than a pipe holds. The worker asks
    // for them all, never reads, and falls silent.
    let worker = deaf_worker(&eval, 2000, "exec sleep 600");
    let started = Instant::now();
    let run = eval.run(
        &mst,
        &["-q", "--silence-limit", "2", "--runner-option", &worker],
    );
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(reason.contains("sent nothing for 2s"), "{reason}");
}

/// A stand-in worker that asks for all `trials` of case c1 without ever reading its stdin (so
/// the coordinator's replies fill the pipe), then `then`.
fn deaf_worker(eval: &Eval, trials: u32, then: &str) -> String {
    let config = eval.config();
    let mut value = read_json(&config);
    value["trials"] = json!(trials);
    value["concurrency"] = json!(trials);
    std::fs::write(&config, value.to_string()).unwrap();
    let script = format!(
        r#"echo "$HELLO"
i=0
while [ $i -lt {trials} ]; do
  echo '{{"type":"acquire","key":{{"variant":"default","case":"c1","trial":'$i'}},"servers":[]}}'
  i=$((i+1))
done
{then}
"#
    );
    stand_in_worker(eval.dir.path(), "deaf.sh", &script)
}

#[test]
fn ctrl_c_ends_the_run_within_the_grace_whatever_the_worker_does() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    // Deaf to `cancel` (its stdin is full and unread), and alive: it keeps heartbeating.
    let heartbeats = r#"while :; do echo '{"type":"heartbeat","at":0}'; sleep 0.2; done"#;
    let worker = deaf_worker(&eval, 2000, heartbeats);
    let mut child = eval.spawn(
        &mst,
        &["-q", "--cancel-grace", "1", "--runner-option", &worker],
    );
    // Once the shard is under way, Ctrl-C.
    std::thread::sleep(Duration::from_secs(2));
    // SAFETY: kill(2) on a child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let interrupted = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if interrupted.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("mst still runs 30 s after Ctrl-C with a 1 s grace");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(!status.success(), "{status:?}");
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    assert_eq!(
        record["machines"][0]["ended"]["status"], "cancelled",
        "{record}"
    );
}

#[test]
fn a_process_holding_the_workers_stderr_after_done_does_not_hold_the_run() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    // The worker finishes (no trials run: c1 is left missing) but leaves a process outside
    // its group holding its stderr for a minute.
    let script = r#"echo "$HELLO"
setsid sleep 60 &
echo '{"type":"done","counts":{"collected":0,"infra":0,"skipped":0},"cleanup":"ok"}'
"#;
    let worker = stand_in_worker(eval.dir.path(), "lingering.sh", script);
    let started = Instant::now();
    let run = eval.run(
        &mst,
        &["-q", "--cancel-grace", "1", "--runner-option", &worker],
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(run.code, 2, "partial: {}\n{}", run.stdout, run.stderr);
}

#[test]
fn asking_twice_for_one_trial_loses_the_shard() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    let script = r#"echo "$HELLO"
k='{"variant":"default","case":"c1","trial":0}'
echo '{"type":"acquire","key":'"$k"',"servers":[]}'
echo '{"type":"acquire","key":'"$k"',"servers":[]}'
sleep 5
"#;
    let worker = stand_in_worker(eval.dir.path(), "twice.sh", script);
    let run = eval.run(&mst, &["-q", "--runner-option", &worker]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("asked twice for trial default/c1/0"),
        "{reason}"
    );
}

#[test]
fn a_shard_past_its_copy_cap_stops_and_the_disk_stays_bounded() {
    let mst = Mst::new();
    // Each trial answers 700 KiB; the shard may copy back 1 MiB.
    let eval = command_eval(
        json!(["sh", "-c", "head -c 700000 /dev/zero | tr '\\0' x"]),
        4,
        30,
    );
    let run = eval.run(&mst, &["--json", "-q", "--max-shard-copy", "1"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let record = read_json(&dir.join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("past its cap of 1048576 (--max-shard-copy)"),
        "{reason}"
    );
    let stored: u64 = mst_tests::walk(&dir)
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "json" || e == "jsonl"))
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    assert!(stored < 3 << 20, "{stored} bytes stored");
    let missing = run.json()["missing"].as_array().unwrap().len();
    assert!(missing >= 2, "{}", run.stdout);
}

#[test]
fn resume_refuses_a_changed_setup_unless_forced() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "exit 0"]), 2, 30);
    let first = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(first.code, 0, "{}\n{}", first.stdout, first.stderr);
    let dir = eval.run_dir("e2e");
    let record = read_json(&dir.join("run.json"));
    assert_eq!(record["format"], 2, "{record}");
    let id = record["runId"].as_str().unwrap().to_string();
    // c1's trace is lost, and meanwhile the dataset gains a case.
    mst_tests::remove_trace(&dir, "default/c1/0");
    let dataset = eval.dir.path().join("cases.jsonl");
    let mut cases = std::fs::read_to_string(&dataset).unwrap();
    cases.push_str("\n{\"id\": \"c9\", \"input\": \"new\"}\n");
    std::fs::write(&dataset, cases).unwrap();

    // And a runner option that changes what a trial's machine allows.
    let changed = eval.run(&mst, &["-q", "--resume", &id, "--runner-option", "pids=64"]);
    assert_eq!(changed.code, 2, "{}\n{}", changed.stdout, changed.stderr);
    assert!(
        changed.stderr.contains("the datasets' content changed")
            && changed
                .stderr
                .contains("the runner option `pids` changed (unset then, `64` now)")
            && changed.stderr.contains("--force"),
        "{}",
        changed.stderr
    );
    assert!(find_trace(&dir, "default/c1/0").is_none(), "nothing ran");

    let forced = eval.run(&mst, &["-q", "--resume", &id, "--force"]);
    assert_eq!(forced.code, 0, "{}\n{}", forced.stdout, forced.stderr);
    assert!(find_trace(&dir, "default/c1/0").is_some());
}

#[test]
fn a_token_that_expires_mid_run_is_renewed_from_the_secrets_file() {
    const FIRST: &str = "mst-canary-first-5c1e";
    const RENEWED: &str = "mst-canary-renewed-77a0";
    // A server that notes each request's bearer token, takes a second, and refuses it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (seen_tx, seen) = std::sync::mpsc::channel::<(Instant, String)>();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).to_lowercase();
            let token = head
                .lines()
                .find_map(|l| l.strip_prefix("authorization: bearer "))
                .unwrap_or("")
                .to_string();
            let _ = seen_tx.send((Instant::now(), token));
            std::thread::sleep(Duration::from_secs(1));
            let _ = stream.write_all(
                b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            );
        }
    });
    let cases: Vec<serde_json::Value> = (1..=6)
        .map(|i| json!({"id": format!("c{i}"), "input": {"tool": "echo", "arguments": {}}}))
        .collect();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "mcp", "concurrency": 1,
               "servers": {"api": {"url": format!("http://127.0.0.1:{port}/mcp"),
                                   "token": "API_TOKEN"}},
               "timeout": 20}),
        &cases,
    );
    let secrets = eval.dir.path().join("secrets.json");
    let write_secret = |value: &str, seconds: u64| {
        let expires = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs()
            + seconds;
        let text = json!({"API_TOKEN": {"value": value, "expiresAt": expires}}).to_string();
        std::fs::write(&secrets, text).unwrap();
        std::fs::set_permissions(&secrets, std::fs::Permissions::from_mode(0o600)).unwrap();
    };
    // The first token lives four seconds; the operator renews it once the run has it.
    write_secret(FIRST, 4);
    let expires = Instant::now() + Duration::from_secs(4);
    let mst = Mst::new();
    // The server is on the host's loopback: the machine shares the host's network.
    let child = eval.spawn(
        &mst,
        &[
            "-q",
            "--secrets-file",
            mst_tests::s(&secrets),
            "--runner-option",
            "network=host",
        ],
    );
    let (_, first) = seen.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(first, FIRST.to_lowercase());
    write_secret(RENEWED, 3600);
    let output = child.wait_with_output().unwrap();
    let run = mst_tests::Run::from(output);
    assert_eq!(
        run.code, 1,
        "every trial refused: {}\n{}",
        run.stdout, run.stderr
    );
    let later: Vec<(Instant, String)> = seen.try_iter().collect();
    assert!(
        later
            .iter()
            .any(|(_, token)| token == &RENEWED.to_lowercase()),
        "{later:?}"
    );
    for (at, token) in &later {
        assert!(
            token != &FIRST.to_lowercase() || *at < expires,
            "the expired token was used after its expiry"
        );
    }
    for canary in [FIRST, RENEWED] {
        assert!(mst_tests::files_containing(&eval.results(), canary).is_empty());
        assert!(!run.stderr.contains(canary) && !run.stdout.contains(canary));
    }
}

#[test]
fn a_resume_token_outside_a_conversation_loses_the_shard_without_echoing_it() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    // A batch run's trial is no conversation turn: a worker may not hand its coordinator a
    // token to carry (into the next bundle's agent argv) from there.
    let script = r#"echo "$HELLO"
k='{"variant":"default","case":"c1","trial":0}'
echo '{"type":"acquire","key":'"$k"',"servers":[]}'
read granted
echo '{"type":"resume-token","key":'"$k"',"token":"canary-resume-batch"}'
sleep 5
"#;
    let worker = stand_in_worker(eval.dir.path(), "resume.sh", script);
    let run = eval.run(&mst, &["-q", "--runner-option", &worker]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(
        reason.contains("it sent a resume token outside a conversation turn"),
        "{reason}"
    );
    assert!(!record.to_string().contains("canary-resume-batch"));
    assert!(
        !run.stderr.contains("canary-resume-batch"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_worker_asking_for_hidden_files_or_egress_it_was_not_given_loses_its_shard() {
    // Each stand-in worker says hello, then one line its bundle does not allow, then waits.
    let key = r#"{"variant":"default","case":"c1","trial":0}"#;
    let attempts = [
        (
            r#"{"type":"egress-open","conn":0}"#,
            "which its bundle does not allow",
        ),
        (
            r#"{"type":"egress-data","conn":0,"data":"aGk="}"#,
            "a connection it never opened",
        ),
        (
            &*format!(r#"{{"type":"check-files","key":{key},"check":"tests"}}"#),
            "which is not running",
        ),
    ];
    for (line, why) in attempts {
        let eval = Eval::new(
            json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
                   "clientOptions": {"command": ["cat"]},
                   "checks": [{"name": "tests", "run": ["true"], "files": "hidden"}],
                   "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 30}),
            &[json!({"id": "c1", "input": "x"})],
        );
        std::fs::create_dir_all(eval.dir.path().join("hidden")).unwrap();
        std::fs::write(eval.dir.path().join("hidden/secret.txt"), "hidden\n").unwrap();
        let script = format!("echo \"$HELLO\"\ncat <<'LINE'\n{line}\nLINE\nsleep 30\n");
        let worker = stand_in_worker(eval.dir.path(), "hostile.sh", &script);
        let run = eval.run(&Mst::new(), &["-q", "--runner-option", &worker]);
        assert_eq!(run.code, 2, "{line}: {}\n{}", run.stdout, run.stderr);
        let record = read_json(&eval.run_dir("e2e").join("run.json"));
        let machines = record["machines"].to_string();
        assert!(
            machines.contains("the worker broke mst.shard/v1") && machines.contains(why),
            "{line}: {machines}"
        );
        assert!(!machines.contains("hidden\\n"), "{machines}");
    }
}
