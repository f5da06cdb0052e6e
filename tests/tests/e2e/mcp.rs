//! The `mcp` client against real MCP servers published by others, installed by `.ci/run`:
//! `mcp-server-time` (PyPI) over stdio, and `@modelcontextprotocol/server-everything` (npm) over
//! stdio and streamable HTTP.

use mst_tests::{files_containing, only_run, plugin, read_json, read_trace, root, s, Mst};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn require(program: &str, args: &[&str]) {
    let ok = std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    assert!(ok, "`{program}` is not installed: `.ci/run` installs it (npm @modelcontextprotocol/server-everything, PyPI mcp-server-time)");
}

#[test]
fn the_time_server_example_passes_with_wasm_graders() {
    require("python3", &["-c", "import mcp_server_time"]);
    let _ = plugin("contains.wasm");
    let _ = plugin("json.wasm");
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let config = root().join("examples/mcp-time/eval.json");
    let run = mst.run(&[
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(results.path()),
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = only_run(results.path(), "mcp-time");
    let trace = read_trace(&dir, "default/tokyo-now/0");
    let events = trace["trace"]["events"].as_array().unwrap();
    assert_eq!(events[0]["type"], "tool-call");
    assert_eq!(events[0]["server"], "time");
    assert_eq!(events[0]["arguments"]["timezone"], "Asia/Tokyo");
    assert_eq!(events[1]["type"], "tool-result");
    let answer: Value =
        serde_json::from_str(trace["trace"]["finalText"].as_str().unwrap()).unwrap();
    assert_eq!(answer["timezone"], "Asia/Tokyo", "the real server answered");
    let bad = read_trace(&dir, "default/bad-zone/0");
    assert_eq!(
        bad["trace"]["status"], "completed",
        "a tool error is an answer, not infra"
    );
    assert_eq!(bad["trace"]["events"][1]["isError"], true);
    let json_scores = read_json(&dir.join("scores/mst%2Fgrader%2Fjson.json"));
    assert_eq!(json_scores[0]["pass"], true, "{json_scores}");
}

#[test]
fn the_everything_server_over_stdio() {
    require("sh", &["-c", "command -v mcp-server-everything"]);
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let config = root().join("examples/mcp-everything/eval.json");
    let run = mst.run(&[
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(results.path()),
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["variants"]["default"]["passed"], 3);
    let dir = only_run(results.path(), "mcp-everything");
    let two = read_trace(&dir, "default/two-calls/0");
    assert_eq!(
        two["trace"]["events"].as_array().unwrap().len(),
        4,
        "two calls, two results"
    );
}

#[test]
fn the_everything_server_over_streamable_http_and_a_dead_server_is_infra() {
    require("sh", &["-c", "command -v mcp-server-everything"]);
    let (mut server, port) = mst_tests::everything_over_http();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("cases.jsonl"),
        "{\"id\":\"sum\",\"input\":{\"tool\":\"get-sum\",\"arguments\":{\"a\":20,\"b\":22}},\"expected\":\"42\"}\n",
    )
    .unwrap();
    let config = |url: String| {
        json!({
            "name": "http",
            "datasets": ["cases.jsonl"],
            "servers": {"everything": {"url": url}},
            "client": "mcp",
            "judges": [{"plugin": s(&plugin("contains.wasm"))}],
            "plugins": [s(&plugin("contains.wasm"))],
            "timeout": 20
        })
    };
    let mst = Mst::new();
    let path = dir.path().join("eval.json");
    std::fs::write(
        &path,
        config(format!("http://127.0.0.1:{port}/mcp")).to_string(),
    )
    .unwrap();
    let run = mst.run(&[
        "run",
        "--config",
        s(&path),
        "--results-dir",
        s(&dir.path().join("ok")),
        "--json",
        // The server is on the host's loopback: the machine shares the host's network.
        "--runner-option",
        "network=host",
    ]);
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["variants"]["default"]["passed"], 1);

    // Nothing listens there now: the trial is an infrastructure failure, not a failed answer.
    let run = mst.run(&[
        "run",
        "--config",
        s(&path),
        "--results-dir",
        s(&dir.path().join("dead")),
        "--json",
    ]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    assert_eq!(summary["variants"]["default"]["infra"], 1, "{summary}");
    assert_eq!(summary["variants"]["default"]["failed"], 0);
}

#[test]
fn a_token_from_the_secrets_file_reaches_the_server_and_nothing_else() {
    const CANARY: &str = "mst-canary-token-8d2f61";
    let (port, server) = recording_server();
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "name": "tokens",
        "datasets": ["cases.jsonl"],
        "servers": {"api": {"url": format!("http://127.0.0.1:{port}/mcp"), "token": "API_TOKEN"}},
        "client": "mcp",
        "timeout": 20
    });
    let (run, results, mst) = run_with_secrets(
        dir.path(),
        &config,
        ECHO_CASE,
        &format!("API_TOKEN={CANARY}\n"),
    );
    let head = server.join().unwrap();
    assert!(
        head.contains(&format!("authorization: bearer {}", CANARY.to_lowercase())),
        "the server got the token: {head}"
    );
    assert_eq!(
        run.code, 1,
        "the refused trial is an infrastructure failure\n{}\n{}",
        run.stdout, run.stderr
    );
    assert_nowhere(CANARY, &run, &results, &mst);
    assert!(results.join("tokens").is_dir(), "the run wrote its results");

    // A token the secrets file lacks is a config error before anything runs.
    let (missing, _, _) = run_with_secrets(dir.path(), &config, ECHO_CASE, "OTHER=1\n");
    assert_eq!(missing.code, 2);
    assert!(
        missing
            .stderr
            .contains("servers.api.token names secret `API_TOKEN`"),
        "{}",
        missing.stderr
    );
}

/// A case calling `echo` on the variant's one server.
const ECHO_CASE: &str = "{\"id\":\"c\",\"input\":{\"tool\":\"echo\",\"arguments\":{}}}\n";

/// A loopback HTTP server that records the first request's head (lowercased) and refuses it;
/// it gives up (recording nothing) when no request came within 60 s.
fn recording_server() -> (u16, std::thread::JoinHandle<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let server = std::thread::spawn(move || {
        use std::io::{Read, Write};
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut stream = loop {
            match listener.accept() {
                Ok((stream, _)) => break stream,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Err(e) => return format!("no request came: {e}"),
            }
        };
        stream.set_nonblocking(false).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let _ = stream.write_all(
            b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        );
        String::from_utf8_lossy(&head).to_lowercase()
    });
    (port, server)
}

/// `canary` is in none of mst's output, result files or home.
fn assert_nowhere(canary: &str, run: &mst_tests::Run, results: &std::path::Path, mst: &Mst) {
    assert!(
        !run.stdout.contains(canary) && !run.stderr.contains(canary),
        "the secret leaked into mst's output"
    );
    assert_eq!(
        files_containing(results, canary),
        Vec::<std::path::PathBuf>::new(),
        "no result file, trace or worker log holds it"
    );
    assert_eq!(
        files_containing(mst.home.path(), canary),
        Vec::<std::path::PathBuf>::new()
    );
}

/// Runs `config` (with `cases`) with `secrets` as the secrets file and `MST_LOG=trace`, its
/// machine on the host's network (its HTTP servers are on the host's loopback); returns the
/// run, its results directory and the `mst` used.
fn run_with_secrets(
    dir: &std::path::Path,
    config: &Value,
    cases: &str,
    secrets: &str,
) -> (mst_tests::Run, std::path::PathBuf, Mst) {
    std::fs::write(dir.join("cases.jsonl"), cases).unwrap();
    std::fs::write(dir.join("eval.json"), config.to_string()).unwrap();
    std::fs::write(dir.join("secrets.env"), secrets).unwrap();
    let results = dir.join("results");
    let mst = Mst::new();
    let run = mst
        .command(&[
            "run",
            "--config",
            s(&dir.join("eval.json")),
            "--results-dir",
            s(&results),
            "--secrets-file",
            s(&dir.join("secrets.env")),
            "--runner-option",
            "network=host",
        ])
        .env("MST_LOG", "trace")
        .output()
        .unwrap();
    (mst_tests::Run::from(run), results, mst)
}

#[test]
fn headers_from_secrets_reach_the_http_server_and_nothing_else() {
    const CANARY: &str = "mst-canary-header-5c0e97";
    let (port, server) = recording_server();
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "name": "headers",
        "datasets": ["cases.jsonl"],
        "servers": {"api": {
            "url": format!("http://127.0.0.1:{port}/mcp"),
            "headers": {"X-Team": "evals"},
            "headerSecrets": {"X-Api-Key": "API_KEY"}
        }},
        "client": "mcp",
        "timeout": 20
    });
    let (run, results, mst) = run_with_secrets(
        dir.path(),
        &config,
        ECHO_CASE,
        &format!("API_KEY={CANARY}\n"),
    );
    let head = server.join().unwrap();
    assert!(
        head.contains(&format!("x-api-key: {CANARY}")) && head.contains("x-team: evals"),
        "the server got both headers: {head}"
    );
    assert_eq!(run.code, 1, "the refused trial is infra\n{}", run.stderr);
    assert_nowhere(CANARY, &run, &results, &mst);

    // A header secret the secrets file lacks is a config error before anything runs.
    let (missing, _, _) = run_with_secrets(dir.path(), &config, ECHO_CASE, "OTHER=1\n");
    assert_eq!(missing.code, 2);
    assert!(
        missing
            .stderr
            .contains("servers.api.headerSecrets.X-Api-Key names secret `API_KEY`"),
        "{}",
        missing.stderr
    );
}

#[test]
fn a_stdio_server_gets_env_secrets_and_starts_in_its_cwd() {
    const CANARY: &str = "mst-canary-env-3b71d4";
    require("sh", &["-c", "command -v mcp-server-everything"]);
    require("sh", &["-c", "command -v mcp-server-filesystem"]);
    let dir = tempfile::tempdir().unwrap();
    let config = json!({
        "name": "stdio-entries",
        "datasets": ["cases.jsonl"],
        "servers": {
            "everything": {"command": "mcp-server-everything", "args": ["stdio"],
                           "env": {"MST_PLAIN": "plain-value"},
                           "envSecrets": {"MST_SERVER_KEY": "SERVER_KEY"}},
            "fs": {"command": "mcp-server-filesystem", "args": ["."], "cwd": "sub"}
        },
        "client": "mcp",
        "timeout": 30
    });
    let cases = "{\"id\":\"c\",\"input\":{\"calls\":[\
        {\"server\":\"everything\",\"tool\":\"get-env\"},\
        {\"server\":\"fs\",\"tool\":\"list_allowed_directories\"}]}}\n";
    let (run, results, mst) = run_with_secrets(
        dir.path(),
        &config,
        cases,
        &format!("SERVER_KEY={CANARY}\n"),
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&only_run(&results, "stdio-entries"), "default/c/0");
    let outputs: Vec<&str> = trace["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["output"].as_str())
        .collect();
    assert_eq!(outputs.len(), 2, "{trace}");
    let env: Value = serde_json::from_str(outputs[0]).unwrap();
    assert_eq!(env["MST_PLAIN"], "plain-value");
    // The server had the value; what it echoed is redacted before anything is written.
    assert_eq!(env["MST_SERVER_KEY"], "[redacted:SERVER_KEY]", "{env}");
    assert!(
        outputs[1].trim_end().ends_with("/sub"),
        "the filesystem server's `.` is the trial's `sub`: {}",
        outputs[1]
    );
    assert_nowhere(CANARY, &run, &results, &mst);
}

#[test]
fn a_stdio_server_leaves_nothing_running_after_its_trial() {
    require("python3", &["-c", "import mcp_server_time"]);
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("helper.pid");
    // The real time server, started by a wrapper that leaves a helper process behind in the
    // server's process group (as launchers such as npx do). Unsandboxed, where nothing but the
    // group's kill ends the helper (a sandbox's PID namespace ends with its server), and the
    // wrapper can note the helper's pid here.
    let wrapper = format!(
        "sleep 300 & echo $! > {}; exec python3 -m mcp_server_time --local-timezone UTC",
        s(&pid_file)
    );
    let eval = mst_tests::Eval::new(
        json!({
            "name": "mcp-group",
            "datasets": ["cases.jsonl"],
            "servers": {"time": {"command": "sh", "args": ["-c", wrapper]}},
            "client": "mcp",
            "timeout": 30
        }),
        &[
            json!({"id": "utc", "input": {"tool": "get_current_time", "arguments": {"timezone": "UTC"}}}),
        ],
    );
    let started = Instant::now();
    let run = eval.run(&mst, &["-q", "--runner-option", "isolation=none"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    // Left running, the helper would also hold the worker's stderr and the run's end with it.
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "the run waited for the helper: {:?}",
        started.elapsed()
    );
    let pid = std::fs::read_to_string(&pid_file).unwrap();
    // Gone, or killed and only waiting for init to reap it (a zombie).
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", pid.trim())).unwrap_or_default();
    let state = stat.rsplit(')').next().unwrap_or_default().trim_start();
    assert!(
        stat.is_empty() || state.starts_with('Z'),
        "the server's helper {} outlived its trial: {stat}",
        pid.trim()
    );
}

#[test]
fn a_stdio_server_that_does_not_start_is_infra_saying_what_it_wrote_on_stderr() {
    // As a Python without the server's module would (a pyenv Python the sandbox does not show
    // leaves the system's).
    let eval = mst_tests::Eval::new(
        json!({"name": "dead", "datasets": ["cases.jsonl"], "client": "mcp", "timeout": 30,
               "servers": {"time": {"command": "sh",
                                    "args": ["-c", "echo 'No module named mcp_server_nowhere' >&2; exit 1"]}}}),
        &[json!({"id": "utc", "input": {"tool": "get_current_time", "arguments": {}}})],
    );
    let run = eval.run(&Mst::new(), &["-q", "--json"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.json()["variants"]["default"]["infra"],
        1,
        "{}",
        run.stdout
    );
    let trace = mst_tests::read_trace(&eval.run_dir("dead"), "default/utc/0");
    let said = trace["trace"]["events"].to_string();
    assert!(
        said.contains("`sh`'s stderr ended: No module named mcp_server_nowhere"),
        "{said}"
    );
}
