//! `mst serve`, the playground, end to end: the real `mst serve` on a loopback port, called with
//! the real `curl`, booting machines on the local runner (the Docker runner's session is in
//! docker.rs), running a command agent that streams trace events, and the `mcp` client on the
//! real `mcp-server-time`.

use mst_tests::serve::{agent_eval, gated_agent, steps, Serve};
use mst_tests::{read_json, s, Eval, Mst};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn tasks(session: &str) -> String {
    format!("/api/v1/sessions/{session}/tasks")
}

/// The local machine's directory, from a session's `machine` ("local (DIR)").
fn machine_dir(view: &Value) -> PathBuf {
    let machine = view["machine"].as_str().unwrap();
    let dir = machine
        .strip_prefix("local (")
        .and_then(|m| m.strip_suffix(')'))
        .unwrap();
    PathBuf::from(dir)
}

fn stored_trace(eval: &Eval, session: &str, task: &str) -> Value {
    mst_tests::read_trace(
        &eval.results().join("play/sessions").join(session),
        &format!("agent/{task}/0"),
    )
}

#[test]
fn tasks_run_one_at_a_time_and_the_cursor_pages_a_live_trace_without_gaps() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let script = gated_agent(&gate, 0..6, 6..12);
    let eval = agent_eval(&script, json!({}));
    let mst = Mst::exposing(&[dir.path()]);
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let session = serve.session("{}");
    let (status, task) = serve.call("POST", &tasks(&session), Some(r#"{"input": "hello"}"#));
    assert_eq!(status, 202, "{task}");
    assert_eq!(
        (task["n"].as_u64(), task["status"].as_str()),
        (Some(1), Some("running"))
    );
    let id = task["id"].as_str().unwrap().to_string();

    // Live: the first six events arrive while the task still runs (it waits for the gate).
    let six = |events: &[Value]| events.len() >= 6;
    let (mut events, page) = serve.follow((&session, &id), 0, Some(&six), Duration::from_secs(30));
    assert!(!page["done"].as_bool().unwrap(), "{page}");
    // One task at a time: a second is refused, naming the running one.
    let (status, refused) = serve.call("POST", &tasks(&session), Some(r#"{"input": "again"}"#));
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains(&id),
        "{refused}"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        (view["status"].as_str(), view["running"].as_str()),
        (Some("busy"), Some(id.as_str()))
    );

    std::fs::write(&gate, "").unwrap();
    let (rest, last) = serve.follow(
        (&session, &id),
        events.len() as u64,
        None,
        Duration::from_secs(30),
    );
    events.extend(rest);
    assert_eq!(last["status"], "completed", "{last}");
    assert_eq!(
        last["finalText"], "hello",
        "the answer comes with the last page"
    );
    // No gaps, no duplicates, in order.
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..12).collect::<Vec<u64>>());
    // After it settled, a replay (no cursor) and the stored trace are what streamed.
    let (_, replay) = serve.call("GET", &format!("{}/{id}/trace", tasks(&session)), None);
    assert_eq!(replay["events"], Value::Array(events.clone()));
    assert!(replay["done"].as_bool().unwrap());
    assert_eq!(
        stored_trace(&eval, &session, &id)["trace"]["events"],
        Value::Array(events)
    );

    // The next task runs on the same machine.
    let (status, second) = serve.call("POST", &tasks(&session), Some(r#"{"input": "two"}"#));
    assert_eq!(status, 202, "{second}");
    let second = second["id"].as_str().unwrap().to_string();
    assert_ne!(second, id);
    let (_, done) = serve.follow((&session, &second), 0, None, Duration::from_secs(30));
    assert_eq!(done["status"], "completed");
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(view["status"], "ready");
    let inputs: Vec<&str> = view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["input"].as_str().unwrap())
        .collect();
    assert_eq!(inputs, ["hello", "two"]);
    let (_, list) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(list["sessions"][0]["id"], session.as_str());

    // What was asked is kept: the tasks are graded later with the eval's judges (`contains
    // "hello"`: the agent echoes its input), and become cases for a dataset file.
    let mst = Mst::new();
    let results = eval.results();
    let graded = mst.run(&[
        "grade",
        &session,
        "--config",
        s(&eval.config()),
        "--results-dir",
        s(&results),
        "--json",
    ]);
    assert_eq!(graded.code, 1, "{}\n{}", graded.stdout, graded.stderr);
    assert_eq!(
        graded.json()["cases"]["agent"],
        json!({id.as_str(): "passed", second.as_str(): "failed"})
    );
    let cases = mst.run(&["runs", "cases", &session, "--results-dir", s(&results)]);
    assert_eq!(cases.code, 0, "{}", cases.stderr);
    let lines: Vec<Value> = cases
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        lines,
        [
            json!({"id": id, "input": "hello"}),
            json!({"id": second, "input": "two"})
        ]
    );
}

/// Session `id`'s state as `mst runs list --json` lists it.
fn state_in_runs_list(mst: &Mst, eval: &Eval, id: &str) -> Value {
    let results = eval.results();
    let listed = mst.run(&[
        "runs",
        "list",
        "--json",
        "--results-dir",
        mst_tests::s(&results),
    ]);
    let runs = listed.json();
    let run = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|run| run["runId"] == id);
    run.unwrap_or_else(|| panic!("{id} is not listed: {runs}"))["state"].clone()
}

#[test]
fn closing_aborts_a_running_task_seals_what_it_did_and_disposes_of_the_machine() {
    let eval = agent_eval(&format!("{}; sleep 600", steps(0..1)), json!({}));
    let mst = Mst::new();
    let serve = Serve::start(
        &mst,
        &eval.config(),
        &eval.results(),
        &["--cancel-grace", "1"],
    );
    let busy = serve.session("{}");
    assert_eq!(state_in_runs_list(&mst, &eval, &busy), "running");
    let (_, task) = serve.call("POST", &tasks(&busy), Some(r#"{"input": "stall"}"#));
    let id = task["id"].as_str().unwrap().to_string();
    let one = |events: &[Value]| !events.is_empty();
    serve.follow((&busy, &id), 0, Some(&one), Duration::from_secs(30));
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{busy}"), None);
    let machine = machine_dir(&view);
    assert!(machine.is_dir());

    let asked = Instant::now();
    let (status, closed) = serve.call("DELETE", &format!("/api/v1/sessions/{busy}"), None);
    assert_eq!(status, 200, "{closed}");
    assert!(
        asked.elapsed() < Duration::from_secs(20),
        "close took {:?}",
        asked.elapsed()
    );
    assert_eq!(
        (closed["status"].as_str(), closed["ended"].as_str()),
        (Some("closed"), Some("closed by request"))
    );
    assert_eq!(closed["tasks"][0]["status"], "aborted", "{closed}");
    assert_eq!(state_in_runs_list(&mst, &eval, &busy), "ended");
    assert!(
        !machine.exists(),
        "the machine {} was disposed of",
        machine.display()
    );
    // The partial trace is sealed: what was seen stays.
    let stored = stored_trace(&eval, &busy, &id);
    assert_eq!(stored["trace"]["events"][0]["text"], "step 0", "{stored}");
    let (_, page) = serve.call("GET", &format!("{}/{id}/trace?since=0", tasks(&busy)), None);
    assert_eq!(
        (page["done"].as_bool(), page["status"].as_str()),
        (Some(true), Some("aborted"))
    );
    // Closing again changes nothing; a closed session takes no task.
    let (status, again) = serve.call("DELETE", &format!("/api/v1/sessions/{busy}"), None);
    assert_eq!((status, again["status"].as_str()), (200, Some("closed")));
    let (status, refused) = serve.call("POST", &tasks(&busy), Some(r#"{"input": "x"}"#));
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("is closed"),
        "{refused}"
    );

    // An idle session closes at once, and its record says how it ended.
    let idle = serve.session("{}");
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{idle}"), None);
    let (status, closed) = serve.call("DELETE", &format!("/api/v1/sessions/{idle}"), None);
    assert_eq!((status, closed["status"].as_str()), (200, Some("closed")));
    assert!(!machine_dir(&view).exists());
    let record = read_json(
        &eval
            .results()
            .join("play/sessions")
            .join(&idle)
            .join("session.json"),
    );
    assert_eq!(record["ended"], "closed by request");
}

/// `method path` with `body` gets `status` and an error message containing `needle`.
fn assert_refused(
    serve: &Serve,
    method: &str,
    path: &str,
    body: Option<&str>,
    status: u16,
    needle: &str,
) {
    let (got, answer) = serve.call(method, path, body);
    assert_eq!(got, status, "{method} {path}: {answer}");
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(
        error.contains(needle),
        "{method} {path}: {error:?} lacks {needle:?}"
    );
}

/// A session of a variant the eval lacks, with a misspelt field or from a body that is not
/// JSON, a session that does not exist and a path outside the API are refused, naming the fix.
fn assert_bad_session_requests_refused(serve: &Serve) {
    assert_refused(
        serve,
        "POST",
        "/api/v1/sessions",
        Some(r#"{"variant": "nope"}"#),
        400,
        "its variants are agent, direct",
    );
    assert_refused(
        serve,
        "POST",
        "/api/v1/sessions",
        Some(r#"{"varient": "agent"}"#),
        400,
        "unknown field `varient`",
    );
    assert_refused(
        serve,
        "POST",
        "/api/v1/sessions",
        Some("not json"),
        400,
        "not valid",
    );
    assert_refused(
        serve,
        "GET",
        "/api/v1/sessions/0123",
        None,
        404,
        "no session `0123`",
    );
    assert_refused(
        serve,
        "POST",
        "/api/v1/sessions/0123/tasks",
        Some(r#"{"input": "x"}"#),
        404,
        "no session",
    );
    assert_refused(
        serve,
        "GET",
        "/api/v1/elsewhere",
        None,
        404,
        "/api/v1/sessions",
    );
}

/// What a page on another site could make a browser send is refused, and makes no session: a
/// form post (no JSON content type), or a request to a name that re-resolves to loopback (DNS
/// rebinding), which cannot know the server's token (and, on a server without one, is refused
/// for its name).
fn assert_cross_site_requests_refused(serve: &Serve) {
    let with_token = |header: &str| {
        let mut headers = serve.headers.clone();
        headers.push(header.to_string());
        headers
    };
    let rebinding = match serve.token {
        Some(_) => (401, "access token"),
        None => (403, "not a loopback name"),
    };
    for (headers, (status, needle)) in [
        (
            with_token("content-type: text/plain"),
            (415, "Content-Type: application/json"),
        ),
        (
            vec![
                "content-type: application/json".into(),
                "host: evil.example".into(),
            ],
            rebinding,
        ),
    ] {
        let (got, answer) = serve.call_raw("POST", "/api/v1/sessions", Some("{}"), &headers);
        assert_eq!(got, status, "{answer}");
        assert!(answer.contains(needle), "{answer}");
    }
    let (_, list) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(list["sessions"], json!([]), "neither made a session");
}

/// A task input that does not suit variant `direct` (`session`'s), a task without input or too
/// big, a trace asked with a bad cursor and the trace of a task that is not there are refused,
/// naming the fix.
fn assert_bad_task_requests_refused(serve: &Serve, session: &str) {
    assert_refused(
        serve,
        "POST",
        &tasks(session),
        Some(r#"{"input": "what time is it?"}"#),
        400,
        "does not suit variant `direct`'s `mcp` client",
    );
    assert_refused(
        serve,
        "POST",
        &tasks(session),
        Some(r#"{}"#),
        400,
        "missing field `input`",
    );
    let big = format!(r#"{{"input": "{}"}}"#, "x".repeat(300 * 1024));
    assert_refused(
        serve,
        "POST",
        &tasks(session),
        Some(&big),
        413,
        "over 262144 bytes",
    );
    let trace = format!("{}/t1/trace", tasks(session));
    assert_refused(
        serve,
        "GET",
        &format!("{trace}?since=abc"),
        None,
        400,
        "`since` must be",
    );
    assert_refused(
        serve,
        "GET",
        &format!("{trace}?from=3"),
        None,
        400,
        "only `since=N`",
    );
    assert_refused(serve, "GET", &trace, None, 404, "has no task `t1`");
}

#[test]
fn bad_requests_get_the_status_that_fits_and_a_message_naming_the_fix() {
    let eval = agent_eval("cat", json!({}));
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    assert_bad_session_requests_refused(&serve);
    assert_cross_site_requests_refused(&serve);
    let session = serve.session(r#"{"variant": "direct"}"#);
    assert_bad_task_requests_refused(&serve, &session);
}

#[test]
fn on_loopback_too_the_api_answers_only_requests_with_the_token_it_printed() {
    let eval = agent_eval("cat", json!({}));
    let mst = Mst::new();
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let token = serve.token.clone().expect("a token in the URL it printed");
    assert_eq!(token.len(), 64, "{token}");
    for headers in [
        vec![],
        vec!["authorization: Bearer wrong-token-0000000".to_string()],
    ] {
        let (status, answer) = serve.call_raw("GET", "/api/v1/sessions", None, &headers);
        assert_eq!(status, 401, "{answer}");
        assert!(
            answer.contains("the token in the URL it printed"),
            "{answer}"
        );
    }
    // The page itself holds no data: it is served without the token, which it reads from its
    // URL's fragment.
    let (status, page) = serve.call_raw("GET", "/", None, &[]);
    assert_eq!(status, 200, "{page}");
    let (status, list) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!((status, &list["sessions"]), (200, &json!([])));
    // Each server makes its own.
    let other = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    assert_ne!(other.token, serve.token);
    drop(other);

    // Only when asked for, and only on loopback, does it answer without one.
    let open = Serve::start(&mst, &eval.config(), &eval.results(), &["--no-token"]);
    assert_eq!(open.token, None);
    let (status, _) = open.call("GET", "/api/v1/sessions", None);
    assert_eq!(status, 200);
    assert_cross_site_requests_refused(&open);
    assert_serve_refused(
        &mst,
        &eval,
        &["--listen", "0.0.0.0:0", "--no-token"],
        &["not a loopback address"],
    );
}

#[test]
fn off_loopback_the_server_needs_its_token_on_every_request() {
    let eval = agent_eval("cat", json!({}));
    let mst = Mst::new();
    assert_serve_refused(
        &mst,
        &eval,
        &["--listen", "0.0.0.0:0"],
        &["not a loopback address", "--token-file"],
    );
    let token_file = eval.dir.path().join("token");
    std::fs::write(&token_file, "mst-serve-token-5b7d9e01\n").unwrap();
    // A token others can read guards nothing.
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_serve_refused(
        &mst,
        &eval,
        &["--token-file", s(&token_file)],
        &["chmod 600"],
    );
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut serve = Serve::start(
        &mst,
        &eval.config(),
        &eval.results(),
        &["--listen", "0.0.0.0:0", "--token-file", s(&token_file)],
    );
    for headers in [
        vec![],
        vec!["authorization: Bearer wrong-token-0000000".to_string()],
    ] {
        let (status, answer) = serve.call_raw("GET", "/api/v1/sessions", None, &headers);
        assert_eq!(status, 401, "{answer}");
        assert!(answer.contains("Authorization: Bearer"), "{answer}");
    }
    serve.headers = vec!["authorization: Bearer mst-serve-token-5b7d9e01".into()];
    let (status, _) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(status, 200);
}

#[test]
fn idle_sessions_expire_and_a_restart_closes_what_the_last_server_left_open() {
    let eval = agent_eval("cat", json!({}));
    let mst = Mst::new();
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &["--idle-ttl", "1"]);
    let session = serve.session("{}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let view = loop {
        let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
        if view["status"] == "closed" || Instant::now() > deadline {
            break view;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(view["ended"], "idle past the session TTL", "{view}");
    assert!(!machine_dir(&view).exists());
    drop(serve);

    // A server killed outright leaves its session open on disk; the next start closes it.
    let mut first = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let left = first.session("{}");
    let (_, view) = first.call("GET", &format!("/api/v1/sessions/{left}"), None);
    let machine = machine_dir(&view);
    assert!(machine.is_dir());
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let record = |id: &str| {
        read_json(
            &eval
                .results()
                .join("play/sessions")
                .join(id)
                .join("session.json"),
        )
    };
    assert_eq!(record(&left)["status"], "ready");
    assert_eq!(state_in_runs_list(&mst, &eval, &left), "interrupted");
    let _second = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    assert_eq!(state_in_runs_list(&mst, &eval, &left), "interrupted");
    let closed = record(&left);
    assert_eq!(closed["status"], "closed", "{closed}");
    assert!(
        closed["ended"].as_str().unwrap().starts_with("interrupted"),
        "{closed}"
    );
}

#[test]
fn secrets_reach_the_agent_but_no_response_record_or_trace() {
    const CANARY: &str = "mst-canary-serve-secret-2c8e";
    let script = r#"echo '{"type":"message","role":"assistant","text":"token '"$TOKEN"'"}'; echo "answer $TOKEN""#;
    let eval = agent_eval(script, json!({"TOKEN": "PLAY_TOKEN"}));
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("PLAY_TOKEN={CANARY}\n")).unwrap();
    let serve = Serve::start(
        &Mst::new(),
        &eval.config(),
        &eval.results(),
        &["--secrets-file", s(&secrets)],
    );
    let session = serve.session("{}");
    let (_, task) = serve.call("POST", &tasks(&session), Some(r#"{"input": "go"}"#));
    let id = task["id"].as_str().unwrap().to_string();
    let (events, page) = serve.follow((&session, &id), 0, None, Duration::from_secs(30));
    assert_eq!(page["status"], "completed");
    let shown = Value::Array(events).to_string();
    assert!(
        shown.contains("token ") && !shown.contains(CANARY),
        "{shown}"
    );
    // A task whose input holds the secret: the session's record (session.json) is written
    // redacted, like run.json (the files are searched at the end).
    let input = json!({ "input": format!("please repeat {CANARY}") }).to_string();
    let (_, task) = serve.call("POST", &tasks(&session), Some(&input));
    let echoed = task["id"].as_str().unwrap().to_string();
    serve.follow((&session, &echoed), 0, None, Duration::from_secs(30));
    // An error that would echo it (a variant named by the secret) does not either.
    let (status, answer) = serve.call_raw(
        "POST",
        "/api/v1/sessions",
        Some(&format!(r#"{{"variant": "{CANARY}"}}"#)),
        &serve.headers,
    );
    assert_eq!(status, 400);
    assert!(!answer.contains(CANARY), "{answer}");
    for path in [
        format!("/api/v1/sessions/{session}"),
        "/api/v1/sessions".into(),
        format!("{}/{id}/trace", tasks(&session)),
    ] {
        let (_, text) = serve.call_raw("GET", &path, None, &serve.headers);
        assert!(!text.contains(CANARY), "{path}: {text}");
    }
    let stderr = serve.stop();
    assert!(!stderr.contains(CANARY));
    assert!(mst_tests::files_containing(&eval.results(), CANARY).is_empty());
    assert!(files_under(&eval.results()).len() > 1);
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    mst_tests::walk(dir)
}

/// The stored traces of tasks `inputs`, run one after another in a new session made with
/// `body`, each checked to have completed.
fn session_traces(serve: &Serve, eval: &Eval, body: &str, inputs: &[&str]) -> Vec<Value> {
    let session = serve.session(body);
    (inputs.iter())
        .map(|input| {
            let body = json!({"input": input}).to_string();
            let (_, task) = serve.call("POST", &tasks(&session), Some(&body));
            let id = task["id"].as_str().unwrap().to_string();
            let (_, page) = serve.follow((&session, &id), 0, None, Duration::from_secs(30));
            let trace = stored_trace(eval, &session, &id);
            assert_eq!(page["status"], "completed", "{page} {trace}");
            trace
        })
        .collect()
}

/// A trace's final text, trimmed.
fn final_text(trace: &Value) -> String {
    trace["trace"]["finalText"]
        .as_str()
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn a_shared_work_directory_keeps_what_one_task_left_for_the_next() {
    // The agent keeps a note in its working directory: the first task writes it, a later task
    // finds it only if the tasks share the directory.
    let eval = agent_eval(
        r#"read line; if [ -f note ]; then echo "found $(cat note)"; else echo "$line" > note; echo fresh; fi"#,
        json!({}),
    );
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let answers = |body: &str| -> Vec<String> {
        let traces = session_traces(&serve, &eval, body, &["first", "second"]);
        traces.iter().map(final_text).collect()
    };
    assert_eq!(
        answers(r#"{"sharedWorkdir": true}"#),
        ["fresh", "found first"]
    );
    assert_eq!(
        answers("{}"),
        ["fresh", "fresh"],
        "by default each task starts clean"
    );
}

#[test]
fn a_machine_that_died_fails_its_task_as_infra_and_still_closes() {
    let eval = agent_eval("cat", json!({}));
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let session = serve.session("{}");
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    // The machine goes away under the session (a file where its directory was: nothing can
    // be put there again).
    let machine = machine_dir(&view);
    std::fs::remove_dir_all(&machine).unwrap();
    std::fs::write(&machine, "gone").unwrap();
    let (status, task) = serve.call("POST", &tasks(&session), Some(r#"{"input": "hello"}"#));
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap().to_string();
    let (_, page) = serve.follow((&session, &id), 0, None, Duration::from_secs(60));
    assert_eq!(page["status"], "infra", "{page}");
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    let reason = view["tasks"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("cannot copy the bundle"), "{view}");
    let asked = Instant::now();
    let (status, closed) = serve.call("DELETE", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        (status, closed["status"].as_str()),
        (200, Some("closed")),
        "{closed}"
    );
    assert!(asked.elapsed() < Duration::from_secs(10));
    let _ = std::fs::remove_file(&machine);
}

/// `curl -N` reading the trace of `task` as server-sent events, with `headers`.
fn sse(serve: &Serve, session: &str, task: &str, headers: &[&str]) -> std::process::Child {
    let mut command = std::process::Command::new("curl");
    command.args(["-sN", "-H", "accept: text/event-stream"]);
    for header in serve
        .headers
        .iter()
        .map(String::as_str)
        .chain(headers.iter().copied())
    {
        command.args(["-H", header]);
    }
    command
        .arg(format!("{}{}/{task}/trace", serve.base, tasks(session)))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap()
}

/// The `(event, id)` pairs of a server-sent event stream's text.
fn sse_events(text: &str) -> Vec<(String, String)> {
    text.split("\n\n")
        .filter_map(|block| {
            let field = |name: &str| {
                block
                    .lines()
                    .find_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_string))
            };
            Some((field("event")?, field("id").unwrap_or_default()))
        })
        .collect()
}

#[test]
fn the_trace_streams_as_server_sent_events_and_resumes_from_the_last_id() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let script = gated_agent(&gate, 0..3, 3..6);
    let eval = agent_eval(&script, json!({}));
    let mst = Mst::exposing(&[dir.path()]);
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let session = serve.session("{}");
    let (_, task) = serve.call("POST", &tasks(&session), Some(r#"{"input": "hello"}"#));
    let id = task["id"].as_str().unwrap().to_string();
    let mut stream = sse(&serve, &session, &id, &[]);
    let mut reader = std::io::BufReader::new(stream.stdout.take().unwrap());
    let mut text = String::new();
    while !text.contains("id: 2\n") {
        let mut line = String::new();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "the stream ended early: {text}"
        );
        text.push_str(&line);
    }
    assert!(
        stream.try_wait().unwrap().is_none(),
        "the stream stays open while the task runs"
    );
    std::fs::write(&gate, "").unwrap();
    std::io::Read::read_to_string(&mut reader, &mut text).unwrap();
    stream.wait().unwrap();
    let events = sse_events(&text);
    let ids: Vec<&str> = events
        .iter()
        .filter(|(e, _)| e == "event")
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(ids, ["0", "1", "2", "3", "4", "5"], "{text}");
    assert_eq!(events.last().unwrap().0, "done");
    assert!(text.contains(r#""status":"completed""#), "{text}");
    // A reconnecting client resumes after the last id it saw.
    let resumed = sse(&serve, &session, &id, &["last-event-id: 3"])
        .wait_with_output()
        .unwrap();
    let events = sse_events(&String::from_utf8_lossy(&resumed.stdout));
    let ids: Vec<&str> = events
        .iter()
        .filter(|(e, _)| e == "event")
        .map(|(_, id)| id.as_str())
        .collect();
    assert_eq!(ids, ["4", "5"]);
}

#[test]
fn a_session_on_a_runner_plugin_whose_dispose_fails_closes_in_bounded_time_and_says_why() {
    // The hostile runner fixture makes command-channel machines (granted `sh`) and, with
    // `sleep-dispose`, its `dispose-machine` sleeps two minutes: stopped at the plugin time
    // limit, the dispose fails.
    let eval = agent_eval("cat", json!({}));
    let plugin = mst_tests::fixture("hostile-runner.wasm");
    let machines = format!("dir={}", s(&eval.dir.path().join("machines")));
    let serve = Serve::start(
        &Mst::new(),
        &eval.config(),
        &eval.results(),
        &[
            "--plugin",
            s(&plugin),
            "--runner",
            "mst/fixture/hostile-runner",
            "--runner-option",
            "behaviour=sleep-dispose",
            "--runner-option",
            &machines,
            "--allow-exec",
            "sh",
            "--plugin-timeout",
            "2",
        ],
    );
    let session = serve.session("{}");
    let (_, task) = serve.call("POST", &tasks(&session), Some(r#"{"input": "hello"}"#));
    let id = task["id"].as_str().unwrap().to_string();
    let (_, page) = serve.follow((&session, &id), 0, None, Duration::from_secs(60));
    assert_eq!(
        (page["status"].as_str(), page["finalText"].as_str()),
        (Some("completed"), Some("hello")),
        "{page}"
    );
    let asked = Instant::now();
    let (status, closed) = serve.call("DELETE", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        (status, closed["status"].as_str()),
        (200, Some("closed")),
        "{closed}"
    );
    assert!(
        asked.elapsed() < Duration::from_secs(30),
        "close took {:?}",
        asked.elapsed()
    );
    let why = closed["disposeError"].as_str().unwrap_or_default();
    assert!(why.contains("time limit of 2.0s"), "{closed}");
}

#[test]
fn a_session_calls_a_real_mcp_server_and_streams_the_call() {
    // Variant `direct`: the `mcp` client on the real `mcp-server-time` (PyPI).
    let eval = agent_eval("cat", json!({}));
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let session = serve.session(r#"{"variant": "direct"}"#);
    let input =
        json!({"input": {"tool": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}});
    let (status, task) = serve.call("POST", &tasks(&session), Some(&input.to_string()));
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap().to_string();
    let (events, page) = serve.follow((&session, &id), 0, None, Duration::from_secs(60));
    assert_eq!(page["status"], "completed", "{page}");
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert!(
        kinds.contains(&"tool-call") && kinds.contains(&"tool-result"),
        "{kinds:?}"
    );
    assert!(
        page["finalText"].as_str().unwrap().contains("Asia/Tokyo"),
        "{page}"
    );
}

#[test]
fn the_runs_api_refuses_bad_requests_with_the_status_that_fits() {
    let eval = agent_eval("cat", json!({}));
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let status = |method: &str, path: &str, body: Option<&str>| {
        let (status, text) = serve.call_raw(method, path, body, &serve.headers);
        (status, text)
    };
    // An unknown field of a run request; a run that is not stored or live; a cursor that is
    // not a number; a trial index that is not one; a path for a dataset name.
    let (code, text) = status("POST", "/api/v1/runs", Some(r#"{"variant": "agent"}"#));
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("variant"), "{text}");
    let (code, text) = status("GET", "/api/v1/runs/no-such-run", None);
    assert_eq!(code, 404, "{text}");
    let (code, text) = status("GET", "/api/v1/runs/no-such-run/live?since=x", None);
    assert_eq!(code, 400, "{text}");
    let (code, text) = status("GET", "/api/v1/runs/no-such-run/live", None);
    assert_eq!(code, 404, "{text}");
    let (code, _) = status("GET", "/api/v1/runs/no-such-run/trials/first", None);
    assert_eq!(code, 400);
    let (code, text) = status("GET", "/ui/../../etc/passwd", None);
    assert_eq!(code, 404, "{text}");
    let (code, text) = status("GET", "/ui/secret.js", None);
    assert_eq!(code, 404, "{text}");
    let (code, text) = status("POST", "/api/v1/runs", Some(r#"{"trials": 5000}"#));
    assert_eq!(code, 413, "{text}");
    assert!(text.contains("mst run --trials"), "{text}");
    serve.stop();
}

#[test]
fn sessions_and_runs_are_capped_and_a_budgeted_server_starts_no_uncharged_run() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let eval = agent_eval(&gated_agent(&gate, 0..1, 1..2), json!({}));
    let mst = Mst::exposing(&[dir.path()]);
    let serve = Serve::start(
        &mst,
        &eval.config(),
        &eval.results(),
        &["--max-sessions", "1", "--max-runs", "1"],
    );
    let first = serve.session("{}");
    let (status, refused) = serve.call("POST", "/api/v1/sessions", Some("{}"));
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("--max-sessions 1"),
        "{refused}"
    );
    let (status, _) = serve.call("DELETE", &format!("/api/v1/sessions/{first}"), None);
    assert_eq!(status, 200);
    let _second = serve.session("{}");

    // One run at a time: the first holds at the gate while the second is asked for.
    let (status, run) = serve.call("POST", "/api/v1/runs", Some(r#"{"variants": ["agent"]}"#));
    assert_eq!(status, 202, "{run}");
    let (status, refused) = serve.call("POST", "/api/v1/runs", Some(r#"{"variants": ["agent"]}"#));
    assert_eq!(status, 429, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("--max-runs 1"),
        "{refused}"
    );
    std::fs::write(&gate, "").unwrap();
    drop(serve);

    // A server with a model budget starts no batch run it would not charge.
    let budgeted = Serve::start(
        &mst,
        &eval.config(),
        &eval.results(),
        &["--budget-tokens", "1000"],
    );
    let (status, refused) = budgeted.call("POST", "/api/v1/runs", Some("{}"));
    assert_eq!(status, 402, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("mst run"),
        "{refused}"
    );
    assert_serve_refused(
        &mst,
        &eval,
        &["--max-sessions", "0"],
        &["--max-sessions must be at least 1"],
    );
}

/// `mst serve` on `eval` with `args` refuses to start, saying each of `says`.
fn assert_serve_refused(mst: &Mst, eval: &Eval, args: &[&str], says: &[&str]) {
    let config = eval.config();
    let mut command = vec!["serve", "--config", s(&config)];
    command.extend(args);
    let refused = mst.run(&command);
    assert_ne!(refused.code, 0, "{args:?}");
    for said in says {
        assert!(
            refused.stderr.contains(said),
            "{args:?}: {}",
            refused.stderr
        );
    }
}

#[test]
fn closed_sessions_past_the_latest_kept_are_let_go_and_their_records_stay() {
    // The server keeps the latest 32 closed sessions (`CLOSED_SESSIONS_KEPT`); older ones leave
    // its memory, so a long-lived server does not grow with every session it has seen.
    const KEPT: usize = 32;
    let eval = agent_eval("cat", json!({}));
    let mst = Mst::new();
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let ids: Vec<String> = (0..KEPT + 2)
        .map(|_| {
            let id = serve.session("{}");
            let (status, closed) = serve.call("DELETE", &format!("/api/v1/sessions/{id}"), None);
            assert_eq!(status, 200, "{closed}");
            id
        })
        .collect();
    let (status, listed) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(status, 200);
    let listed: Vec<&str> = (listed["sessions"].as_array().unwrap().iter())
        .map(|s| s["id"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), KEPT, "{listed:?}");
    for (n, id) in ids.iter().enumerate() {
        let (status, view) = serve.call("GET", &format!("/api/v1/sessions/{id}"), None);
        match n < 2 {
            true => {
                assert_eq!(status, 404, "session {n}: {view}");
                let error = view["error"].as_str().unwrap();
                assert!(error.contains("lets go"), "{error}");
            }
            false => assert_eq!(
                (status, view["status"].as_str()),
                (200, Some("closed")),
                "{view}"
            ),
        }
        // Its record stays where the session wrote it.
        let record = eval.results().join("play/sessions").join(id);
        assert!(record.is_dir(), "{}", record.display());
    }
}

#[test]
fn a_session_lays_the_workspace_once_per_directory_and_hands_out_hidden_check_files() {
    // The agent appends its input to the workspace's notes and shows them; a check finds the
    // hidden file that came after it.
    let eval = agent_eval(
        r#"read line; echo "$line" >> notes; [ -e hidden.txt ] && echo leaked >> notes; tr '\n' ' ' < notes"#,
        json!({}),
    );
    let mut config = mst_tests::read_json(&eval.config());
    config["workspace"] = json!("ws");
    config["checks"] =
        json!([{"name": "hidden", "run": ["test", "-f", "hidden.txt"], "files": "hidden"}]);
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let root = eval.dir.path();
    std::fs::create_dir_all(root.join("ws")).unwrap();
    std::fs::write(root.join("ws/notes"), "seed\n").unwrap();
    std::fs::create_dir_all(root.join("hidden")).unwrap();
    std::fs::write(root.join("hidden/hidden.txt"), "after the agent\n").unwrap();
    // Kept while the server runs: its home holds the packed workspaces.
    let mst = Mst::new();
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let answers = |body: &str| -> Vec<String> {
        let traces = session_traces(&serve, &eval, body, &["first", "second"]);
        for trace in &traces {
            let events = trace["trace"]["events"].as_array().unwrap();
            let check = events.iter().find(|e| e["name"] == "check").unwrap();
            assert_eq!(check["data"]["passed"], true, "{check}");
        }
        traces.iter().map(final_text).collect()
    };
    assert_eq!(
        answers("{}"),
        ["seed first", "seed second"],
        "each task's own workspace"
    );
    assert_eq!(
        answers(r#"{"sharedWorkdir": true}"#),
        ["seed first", "seed first second"],
        "a shared directory gets it once and keeps what the agent made of it"
    );
}
