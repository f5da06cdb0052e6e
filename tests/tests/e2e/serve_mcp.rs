//! `mst serve --mcp`, the playground's MCP tool twins, end to end: the real `mst serve --mcp`
//! as a child process on stdio, driven by real MCP clients (rmcp's, and the raw protocol),
//! booting machines on the local runner and running a command agent that streams trace events.

use mst_tests::serve::{agent_eval, gated_agent, mcp_call as call, steps};
use mst_tests::{read_json, s, Eval, Mst};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The arguments of `mst serve --mcp` on `eval`, then `extra`.
fn serve_args(eval: &Eval, extra: &[&str]) -> Vec<String> {
    let (config, results) = (eval.config(), eval.results());
    let fixed = [
        "serve",
        "--mcp",
        "--config",
        s(&config),
        "--results-dir",
        s(&results),
    ];
    fixed.iter().chain(extra).map(|a| a.to_string()).collect()
}

/// A session's record, as `mst serve` wrote it under the results directory.
fn record(eval: &Eval, session: &str) -> Value {
    read_json(
        &eval
            .results()
            .join("play/sessions")
            .join(session)
            .join("session.json"),
    )
}

/// An rmcp client of `mst serve --mcp`.
type Client = RunningService<RoleClient, ()>;

/// The six tools the client lists, by name.
async fn assert_lists_the_six_tools(client: &Client) {
    let mut names: Vec<String> = client
        .list_all_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name.into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "close_session",
            "create_session",
            "get_session",
            "list_sessions",
            "read_task_trace",
            "submit_task"
        ]
    );
}

/// Errors are tool results an agent reads, naming the fix; not protocol errors.
async fn assert_errors_are_tool_results_naming_the_fix(client: &Client) {
    let (error, is_error) = call(client, "create_session", json!({"variant": "nope"})).await;
    assert!(is_error, "{error}");
    assert_eq!(error["status"], 400);
    assert!(
        error["error"].as_str().unwrap().contains("agent"),
        "{error}"
    );
    let (error, is_error) = call(client, "get_session", json!({"session": "x", "extra": 1})).await;
    assert!(is_error, "{error}");
    assert!(
        error["error"].as_str().unwrap().contains("extra"),
        "{error}"
    );
}

/// Creates a session of variant `agent`, ready, and submits `hello` to it, which runs as
/// task 1: the session's id and the task's.
async fn session_running_hello(client: &Client) -> (String, String) {
    let (view, is_error) = call(client, "create_session", json!({})).await;
    assert!(!is_error, "{view}");
    assert_eq!(
        (view["variant"].as_str(), view["status"].as_str()),
        (Some("agent"), Some("ready"))
    );
    let session = view["id"].as_str().unwrap().to_string();
    let (task, is_error) = call(
        client,
        "submit_task",
        json!({"session": session, "input": "hello"}),
    )
    .await;
    assert!(!is_error, "{task}");
    assert_eq!(
        (task["n"].as_u64(), task["status"].as_str()),
        (Some(1), Some("running"))
    );
    let id = task["id"].as_str().unwrap().to_string();
    (session, id)
}

/// One task at a time: while task `id` runs, a second submit to `session` is an error result
/// naming it, and the session is busy with it.
async fn assert_a_second_task_is_refused_while_one_runs(client: &Client, session: &str, id: &str) {
    let (refused, is_error) = call(
        client,
        "submit_task",
        json!({"session": session, "input": "again"}),
    )
    .await;
    assert!(is_error, "{refused}");
    assert_eq!(refused["status"], 409);
    assert!(refused["error"].as_str().unwrap().contains(id), "{refused}");
    let (view, _) = call(client, "get_session", json!({"session": session})).await;
    assert_eq!(
        (view["status"].as_str(), view["running"].as_str()),
        (Some("busy"), Some(id))
    );
}

/// Follows task `id` of `session` with the cursor until it settles: the first four events
/// come while the task waits for `gate`, which is opened once they are in (and a second task
/// refused). Every event that streamed, which must be 8, without gaps or duplicates.
async fn follow_opening_the_gate(
    client: &Client,
    session: &str,
    id: &str,
    gate: &Path,
) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut events: Vec<Value> = Vec::new();
    let mut next = 0;
    let mut gated = false;
    let last = loop {
        let (page, is_error) = call(
            client,
            "read_task_trace",
            json!({"session": session, "task": id, "since": next}),
        )
        .await;
        assert!(!is_error, "{page}");
        events.extend(page["events"].as_array().unwrap().iter().cloned());
        next = page["next"].as_u64().unwrap();
        if page["done"].as_bool().unwrap() {
            break page;
        }
        if !gated && events.len() >= 4 {
            assert_a_second_task_is_refused_while_one_runs(client, session, id).await;
            std::fs::write(gate, "").unwrap();
            gated = true;
        }
        assert!(Instant::now() < deadline, "the task did not settle: {page}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(gated, "the task settled before its gate opened: {last}");
    assert_eq!(last["status"], "completed", "{last}");
    let seqs: Vec<u64> = events.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, (0..8).collect::<Vec<u64>>(), "no gaps, no duplicates");
    events
}

/// `session` is listed, closes (its record says so) and then takes no task.
async fn assert_listed_then_closed_for_good(client: &Client, eval: &Eval, session: &str) {
    let (list, _) = call(client, "list_sessions", json!({})).await;
    assert_eq!(list["sessions"][0]["id"], session);
    let (closed, is_error) = call(client, "close_session", json!({"session": session})).await;
    assert!(!is_error, "{closed}");
    assert_eq!(closed["status"], "closed");
    assert_eq!(record(eval, session)["status"], "closed");
    let (again, is_error) = call(
        client,
        "submit_task",
        json!({"session": session, "input": "late"}),
    )
    .await;
    assert!(is_error, "{again}");
    assert_eq!(again["status"], 409);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_mcp_client_drives_sessions_tasks_and_live_traces_through_the_tools() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let script = gated_agent(&gate, 0..4, 4..8);
    let eval = agent_eval(&script, json!({}));
    let mst = Mst::exposing(&[dir.path()]);
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let command = tokio::process::Command::from(mst.command(&serve_args(&eval, &[])));
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .expect("start mst serve --mcp");
    let client = ().serve(transport).await.unwrap_or_else(|e| {
        panic!(
            "mst serve --mcp did not initialize: {e}\n{}",
            std::fs::read_to_string(stderr.path()).unwrap_or_default()
        )
    });

    assert_lists_the_six_tools(&client).await;
    assert_errors_are_tool_results_naming_the_fix(&client).await;
    let (session, id) = session_running_hello(&client).await;
    let events = follow_opening_the_gate(&client, &session, &id, &gate).await;
    // Without a cursor, the whole (stored) trace: what streamed.
    let (replay, _) = call(
        &client,
        "read_task_trace",
        json!({"session": session, "task": id}),
    )
    .await;
    assert_eq!(replay["events"], Value::Array(events));
    assert_listed_then_closed_for_good(&client, &eval, &session).await;
    client.cancel().await.unwrap();
}

/// How a raw session ends.
enum End {
    /// The client closes mst's stdin.
    CloseStdin,
    /// mst gets SIGTERM, its stdin still open.
    Sigterm,
}

/// Waits until process `pid` catches SIGTERM (its handler is set), so a signal sent then tests
/// mst and not the default action.
fn wait_for_sigterm_handler(pid: u32) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        let caught = status
            .lines()
            .find_map(|l| l.strip_prefix("SigCgt:"))
            .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
            .unwrap_or(0);
        if caught & (1 << (libc::SIGTERM - 1)) != 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "mst never set its SIGTERM handler"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Writes JSON-RPC `messages` to `mst serve --mcp EXTRA…` (reading the answer to each
/// request), then ends it as `end` says: every line it wrote to stdout (each parsed), whether
/// it exited with 0, and its stderr.
fn raw_session(
    mst: &Mst,
    eval: &Eval,
    extra: &[&str],
    messages: &[Value],
    end: End,
) -> (Vec<Value>, bool, String) {
    let stderr = tempfile::NamedTempFile::new().unwrap();
    let mut child = mst
        .command(&serve_args(eval, extra))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(stderr.reopen().unwrap())
        .spawn()
        .expect("start mst serve --mcp");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = std::io::BufReader::new(child.stdout.take().unwrap());
    let mut lines = Vec::new();
    for message in messages {
        writeln!(stdin, "{message}").unwrap();
        stdin.flush().unwrap();
        // A request waits for its answer, so the next message comes after it.
        if message.get("id").is_some() {
            let mut line = String::new();
            stdout.read_line(&mut line).unwrap();
            lines.push(line);
        }
    }
    // With SIGTERM, stdin stays open until mst exited, so only the signal can have ended it.
    let mut stdin = Some(stdin);
    match end {
        End::CloseStdin => stdin = None,
        End::Sigterm => {
            wait_for_sigterm_handler(child.id());
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("mst serve --mcp did not stop at its end");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(stdin);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
    lines.extend(rest.lines().map(String::from));
    let parsed = lines
        .iter()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("stdout is the protocol's only, yet: {l:?} ({e})"))
        })
        .collect();
    (
        parsed,
        status.success(),
        std::fs::read_to_string(stderr.path()).unwrap_or_default(),
    )
}

#[test]
fn stdout_carries_only_the_protocol_and_closing_stdin_closes_every_session() {
    const CANARY: &str = "mst-canary-serve-mcp-secret-7f3a";
    let eval = agent_eval(&steps(0..2), json!({"TOKEN": "PLAY_TOKEN"}));
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("PLAY_TOKEN={CANARY}\n")).unwrap();
    let mst = Mst::new();
    let tool = |id: u32, name: &str, arguments: Value| {
        json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
               "params": {"name": name, "arguments": arguments}})
    };
    let messages = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        tool(1, "create_session", json!({})),
        tool(2, "no_such_tool", json!({})),
        // Answers that would echo the secret (a variant, a session named by it) do not.
        tool(3, "create_session", json!({"variant": CANARY})),
        tool(4, "submit_task", json!({"session": CANARY, "input": "x"})),
    ];
    let extra = ["--secrets-file", s(&secrets)];
    let (answers, exited_ok, stderr) = raw_session(&mst, &eval, &extra, &messages, End::CloseStdin);
    assert_eq!(answers.len(), 5);
    assert!(exited_ok, "{stderr}");
    for answer in &answers {
        assert_eq!(answer["jsonrpc"], "2.0", "{answer}");
    }
    assert_eq!(answers[0]["result"]["serverInfo"]["name"], "mst serve");
    let created = &answers[1]["result"]["structuredContent"];
    let session = created["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{}", answers[1]));
    let unknown = &answers[2]["result"];
    assert_eq!(unknown["isError"], true, "{unknown}");
    assert!(
        unknown["structuredContent"]["error"]
            .as_str()
            .unwrap()
            .contains("create_session"),
        "{unknown}"
    );
    for (answer, status) in [(&answers[3], 400), (&answers[4], 404)] {
        let text = answer["result"]["content"][0]["text"].as_str().unwrap();
        assert!(
            text.contains("[redacted:PLAY_TOKEN]") && !text.contains(CANARY),
            "{text}"
        );
        assert_eq!(
            answer["result"]["structuredContent"]["status"], status,
            "{answer}"
        );
    }
    assert!(!stderr.contains(CANARY), "{stderr}");
    // Stdin closed: the session was closed and its machine disposed of before mst exited.
    let record = record(&eval, session);
    assert_eq!(record["status"], "closed", "{record}");
    assert_eq!(record["ended"], "mst serve stopped", "{record}");
    let machine = record["machine"].as_str().unwrap();
    let dir = machine
        .strip_prefix("local (")
        .and_then(|m| m.strip_suffix(')'))
        .unwrap();
    assert!(!Path::new(dir).exists(), "the machine {dir} is left behind");
}

/// `mcp-inspector --cli` (the published `@modelcontextprotocol/inspector`, installed by
/// .ci/run and `cargo xtask test`) against `mst serve --mcp` on `eval`, with `method` and
/// `extra` arguments: its JSON answer.
fn inspector(mst: &Mst, eval: &Eval, extra: &[&str]) -> Value {
    let (bin, home, results) = (mst_tests::mst_bin(), mst.home.path(), eval.results());
    let env = format!("MST_HOME={}", s(home));
    // The inspector takes `--config` as its own option, so mst finds eval.json in its cwd.
    let mut args = vec![
        "--cli",
        "-e",
        &env,
        s(&bin),
        "serve",
        "--mcp",
        "--results-dir",
        s(&results),
    ];
    args.extend(extra);
    let out = std::process::Command::new("mcp-inspector")
        .args(&args)
        .current_dir(eval.dir.path())
        .output()
        .expect("mcp-inspector (npm @modelcontextprotocol/inspector, installed by .ci/run)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "mcp-inspector {args:?}: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

#[test]
fn the_published_mcp_inspector_lists_the_six_tools_and_calls_one() {
    let eval = agent_eval(&steps(0..1), json!({}));
    let mst = Mst::new();
    let listed = inspector(&mst, &eval, &["--method", "tools/list"]);
    let mut names: Vec<&str> = listed["tools"]
        .as_array()
        .unwrap_or_else(|| panic!("{listed}"))
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "close_session",
            "create_session",
            "get_session",
            "list_sessions",
            "read_task_trace",
            "submit_task"
        ]
    );
    for tool in listed["tools"].as_array().unwrap() {
        assert!(
            tool["description"].as_str().is_some_and(|d| d.len() > 40),
            "{tool}"
        );
        assert_eq!(tool["inputSchema"]["type"], "object", "{tool}");
    }
    let called = inspector(
        &mst,
        &eval,
        &["--method", "tools/call", "--tool-name", "list_sessions"],
    );
    assert_eq!(called["isError"], false, "{called}");
    assert_eq!(
        called["structuredContent"],
        json!({"sessions": []}),
        "{called}"
    );
    let refused = inspector(
        &mst,
        &eval,
        &[
            "--method",
            "tools/call",
            "--tool-name",
            "get_session",
            "--tool-arg",
            "session=nope",
        ],
    );
    assert_eq!(refused["isError"], true, "{refused}");
    assert_eq!(refused["structuredContent"]["status"], 404, "{refused}");
}

#[test]
fn sigterm_stops_it_at_any_point_and_closes_every_session() {
    let eval = agent_eval("sleep 600", json!({}));
    let mst = Mst::new();
    // Before the client said anything: still in the MCP handshake.
    let (answers, exited_ok, stderr) = raw_session(&mst, &eval, &[], &[], End::Sigterm);
    assert!(answers.is_empty() && exited_ok, "{answers:?} {stderr}");

    let messages = [
        json!({"jsonrpc": "2.0", "id": 0, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "raw", "version": "0"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call",
               "params": {"name": "create_session", "arguments": {}}}),
    ];
    let (answers, exited_ok, stderr) = raw_session(&mst, &eval, &[], &messages, End::Sigterm);
    assert!(exited_ok, "{stderr}");
    let session = answers[1]["result"]["structuredContent"]["id"]
        .as_str()
        .unwrap_or_else(|| panic!("{answers:?}"));
    let record = record(&eval, session);
    assert_eq!(
        (record["status"].as_str(), record["ended"].as_str()),
        (Some("closed"), Some("mst serve stopped")),
        "{record}"
    );
}
