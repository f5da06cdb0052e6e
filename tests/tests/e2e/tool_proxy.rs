//! The tool proxy: an agent that is an ordinary MCP client (the Python MCP SDK) reaches the
//! variant's real servers (`mcp-server-time` over stdio, `server-filesystem` over stdio)
//! through `MST_MCP_CONFIG`, and mst sees, rewrites and refuses its calls though it drives
//! none of them.

use mst_tests::{events, read_json, read_trace, root, s, Eval, Mst};
use serde_json::{json, Value};

/// The case: the time now, a conversion (hidden in one variant), a write and a read back.
const CASE: &str = r#"{"id": "c", "input": {"calls": [
    {"server": "time", "tool": "get_current_time", "arguments": {"timezone": "UTC"}},
    {"server": "time", "tool": "convert_time", "arguments": {"source_timezone": "UTC", "time": "12:00", "target_timezone": "Asia/Tokyo"}},
    {"server": "fs", "tool": "write_file", "arguments": {"path": "planted.txt", "content": "landed"}},
    {"server": "fs", "tool": "read_text_file", "arguments": {"path": "planted.txt"}}
]}}"#;

/// What the agent printed: the tools it was shown and each call's result.
fn agent_saw(trace: &Value) -> Value {
    let text = trace["trace"]["finalText"].as_str().unwrap_or_default();
    serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("the agent printed no result ({e}): {trace}"))
}

/// What the agent got back from its call to `tool`.
fn result_of<'s>(saw: &'s Value, tool: &str) -> &'s Value {
    let results = saw["results"].as_array().unwrap();
    results
        .iter()
        .find(|r| r["tool"] == tool)
        .unwrap_or_else(|| panic!("no {tool}: {saw}"))
}

#[test]
fn an_mcp_client_agent_sees_the_variants_tools_and_its_dry_run_write_never_lands() {
    mst_tests::require_program("mcp-server-filesystem", ".ci/run installs it from npm");
    let standins = root().join("tests/standins");
    let mst = Mst::exposing(&[&standins]);
    let config = json!({
        "name": "tool-proxy",
        "datasets": ["cases.jsonl"],
        "servers": {
            "time": {"command": "python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
            "fs": {"command": "mcp-server-filesystem", "args": ["."]}
        },
        "client": "command",
        "clientOptions": {"command": ["python3", s(&standins.join("mcp_agent.py"))]},
        "variants": {
            "plain": {},
            "rewritten": {
                "tools": {
                    "time__get_current_time": {"description": "REWRITTEN: the time now"},
                    "time__convert_time": {"hidden": true}
                },
                "dryRun": ["fs"]
            }
        },
        "judges": [
            {"assert": "tools-called", "value": {"tools": [{"name": "get_current_time"}]}},
            {"assert": "no-blocked-calls"}
        ],
        "timeout": 60
    });
    let case: Value = serde_json::from_str(CASE).unwrap();
    let eval = Eval::new(config, &[case]);
    let run = eval.run(&mst, &[]);
    assert_eq!(
        run.code, 1,
        "a blocked call fails its case\n{}\n{}",
        run.stdout, run.stderr
    );
    let run_dir = eval.run_dir("tool-proxy");

    assert_the_plain_variant_sees_the_servers_as_they_are(&read_trace(&run_dir, "plain/c/0"));
    assert_the_variants_view_is_rewritten_and_its_write_refused(&read_trace(
        &run_dir,
        "rewritten/c/0",
    ));
    // Both variants' calls satisfy `tools-called`, though mst drove none of them; the dry
    // run's blocked write fails `no-blocked-calls`, naming it.
    let summary = read_json(&run_dir.join("summary.json"));
    assert_eq!(summary["variants"]["plain"]["passed"], 1, "{summary}");
    assert_eq!(summary["variants"]["rewritten"]["failed"], 1, "{summary}");
    // Each server's health, from what the proxy recorded: calls, errors, the refused write,
    // latencies, and the tools it listed that no trial called.
    let servers = &summary["servers"];
    assert_eq!(servers["time"]["calls"], 4, "{servers}");
    assert_eq!(
        servers["time"]["errors"], 1,
        "the hidden tool refused: {servers}"
    );
    assert_eq!(servers["fs"]["blocked"], 1, "{servers}");
    assert!(servers["fs"]["p95Ms"].as_u64().is_some(), "{servers}");
    let never = servers["fs"]["neverCalled"].as_array().unwrap();
    assert!(never.contains(&json!("list_directory")), "{servers}");
    assert!(!never.contains(&json!("write_file")), "{servers}");
    assert!(
        run.stdout
            .contains("server fs: 4 calls, 2 errors, 1 blocked, p50 "),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout
            .contains("calls were blocked: write_file (blocked: dry run)")
            && !run.stdout.contains("tools-called: expected"),
        "{}",
        run.stdout
    );
    assert_run_json_keeps_each_variants_tool_list(&read_json(&run_dir.join("run.json")));
    assert_the_report_shows_server_health_and_tool_lists(&run_dir, servers);
}

/// `run.json`'s `toolLists`: each variant's tools as its client was shown them.
fn assert_run_json_keeps_each_variants_tool_list(record: &Value) {
    let lists = &record["toolLists"];
    let tool = |variant: &str, server: &str, name: &str| -> Option<Value> {
        let tools = lists[variant][server]
            .as_array()
            .unwrap_or_else(|| panic!("{lists}"));
        tools.iter().find(|t| t["name"] == name).cloned()
    };
    assert!(tool("plain", "time", "convert_time").is_some(), "{lists}");
    assert!(
        tool("rewritten", "time", "convert_time").is_none(),
        "hidden: {lists}"
    );
    let now = tool("rewritten", "time", "get_current_time").unwrap();
    assert_eq!(now["description"], "REWRITTEN: the time now");
    let write = tool("rewritten", "fs", "write_file").unwrap();
    assert_eq!(write["blocked"], "blocked: dry run");
    // A read-only tool passes a dry run; without one, nothing is blocked.
    assert!(tool("rewritten", "fs", "read_text_file").unwrap()["blocked"].is_null());
    assert!(tool("plain", "fs", "write_file").unwrap()["blocked"].is_null());
}

/// The run's report (in a real Chromium) shows each server's health as `summary.json` has it,
/// and each variant's tool list.
fn assert_the_report_shows_server_health_and_tool_lists(
    run_dir: &std::path::Path,
    servers: &Value,
) {
    let browser = mst_tests::browser::Browser::start();
    browser.goto(&format!("file://{}", s(&run_dir.join("report.html"))));
    browser.wait_for("body[data-ready='1'] #servers");
    for server in ["time", "fs"] {
        for (field, key) in [
            ("calls", "calls"),
            ("errors", "errors"),
            ("blocked", "blocked"),
        ] {
            assert_eq!(
                browser.text(&format!(
                    "#servers tr[data-server='{server}'] td[data-count='{key}']"
                )),
                servers[server][field].to_string(),
                "{server} {field}"
            );
        }
    }
    browser.click("#tool-lists details[data-variant='rewritten'] summary");
    let row = "#tool-lists details[data-variant='rewritten']";
    assert!(browser
        .text(&format!("{row} tr[data-tool='time__get_current_time']"))
        .contains("REWRITTEN: the time now"));
    assert!(browser
        .text(&format!(
            "{row} tr[data-tool='fs__write_file'] td[data-count='notes']"
        ))
        .contains("blocked: dry run"));
    assert!(browser
        .texts(&format!("{row} tr[data-tool='time__convert_time']"))
        .is_empty());
    browser.screenshot("report-servers");
    assert_eq!(browser.console_errors(), Vec::<String>::new());
}

/// As the servers are: every tool, the write lands and reads back; every call recorded by the
/// proxy with its server, though the agent drove them.
fn assert_the_plain_variant_sees_the_servers_as_they_are(plain: &Value) {
    let saw = agent_saw(plain);
    let time_tools = saw["tools"]["time"].as_array().unwrap();
    assert!(
        time_tools.iter().any(|t| t["name"] == "convert_time"),
        "{saw}"
    );
    assert_eq!(result_of(&saw, "read_text_file")["text"], "landed", "{saw}");
    // Every call recorded by the proxy, with its server, though the agent drove them.
    let calls = events(plain, "tool-call");
    let called: Vec<&str> = calls.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(
        called,
        [
            "write_file",
            "read_text_file",
            "get_current_time",
            "convert_time"
        ]
    );
    assert!(calls.iter().all(|c| c["server"].is_string()), "{calls:?}");
    assert_eq!(events(plain, "tool-result").len(), 4);
    // Without the trial's token, neither endpoint answers.
    assert_eq!(
        saw["withoutToken"],
        json!({"fs": 401, "time": 401}),
        "{saw}"
    );
}

/// The variant's view: the rewritten description, no hidden tool; the write refused, never
/// reaching the server (the read finds no file), and recorded as blocked.
fn assert_the_variants_view_is_rewritten_and_its_write_refused(rewritten: &Value) {
    let saw = agent_saw(rewritten);
    let time_tools = saw["tools"]["time"].as_array().unwrap();
    let now = time_tools
        .iter()
        .find(|t| t["name"] == "get_current_time")
        .unwrap();
    assert_eq!(now["description"], "REWRITTEN: the time now");
    assert!(
        !time_tools.iter().any(|t| t["name"] == "convert_time"),
        "{saw}"
    );
    assert_eq!(
        result_of(&saw, "write_file")["text"],
        "blocked: dry run",
        "{saw}"
    );
    assert_eq!(result_of(&saw, "write_file")["isError"], true);
    let read_back = result_of(&saw, "read_text_file");
    assert!(
        read_back["text"] != "landed" && read_back["isError"] == true,
        "{saw}"
    );
    assert!(
        result_of(&saw, "convert_time")["error"].is_string(),
        "{saw}"
    );
    let blocked = events(rewritten, "custom");
    let blocked: Vec<&&Value> = blocked
        .iter()
        .filter(|e| e["name"] == "tool-blocked")
        .collect();
    assert_eq!(blocked.len(), 1, "{rewritten}");
    assert_eq!(blocked[0]["data"]["tool"], "write_file");
}

#[test]
fn a_huge_result_is_cut_in_the_trace_and_a_server_that_never_answers_ends_with_its_trial() {
    mst_tests::require_program("mcp-server-everything", ".ci/run installs it from npm");
    let standins = root().join("tests/standins");
    let mst = Mst::exposing(&[&standins]);
    let config = json!({
        "name": "hostile-tools",
        "datasets": ["cases.jsonl"],
        "servers": {
            "everything": {"command": "mcp-server-everything", "args": ["stdio"]},
            "slow": {"command": "python3", "args": [s(&standins.join("slow_mcp.py")), "hostile-tools"],
                     "env": {"NAP_SECONDS": "300"}}
        },
        "client": "command",
        "clientOptions": {"command": ["python3", s(&standins.join("mcp_agent.py"))]},
        // Long enough for the megabyte on a loaded machine; the hung call costs all of it.
        "timeout": 20
    });
    let cases = [
        json!({"id": "big", "input": {"calls": [{"server": "everything", "tool": "echo",
            "bigArgument": ["message", 1_000_000], "lengthOnly": true}]}}),
        json!({"id": "hang", "input": {"calls": [{"server": "slow", "tool": "nap"}]}}),
    ];
    let eval = Eval::new(config, &cases);
    let started = std::time::Instant::now();
    let run = eval.run(&mst, &[]);
    let took = started.elapsed();
    let run_dir = eval.run_dir("hostile-tools");

    // The agent got the whole megabyte; the trace keeps its first 64 KiB and says so.
    let big = read_trace(&run_dir, "default/big/0");
    assert_eq!(
        agent_saw(&big)["results"][0]["text"],
        1_000_006,
        "{}",
        run.stderr
    );
    let output = events(&big, "tool-result")[0]["output"].as_str().unwrap();
    assert!(output.len() < 70_000, "{}", output.len());
    assert!(
        output.ends_with("[cut: 1000006 bytes in all]"),
        "{}",
        &output[output.len() - 60..]
    );

    // A server that never answers holds its call until the trial's deadline, no longer: the
    // trial times out with the call recorded, and nothing of it outlives the run.
    let hang = read_trace(&run_dir, "default/hang/0");
    assert_eq!(hang["trace"]["status"], "timed-out", "{hang}");
    assert_eq!(events(&hang, "tool-call")[0]["tool"], "nap");
    assert!(events(&hang, "tool-result").is_empty(), "{hang}");
    assert!(took < std::time::Duration::from_secs(60), "{took:?}");
    let left = std::process::Command::new("pgrep")
        .args(["-f", "slow_mcp.py hostile-tools"])
        .output()
        .unwrap();
    assert!(!left.status.success(), "the slow server outlived its trial");
}

#[test]
fn a_client_flooding_the_proxy_is_refused_past_the_cap_and_its_trace_stays_bounded() {
    mst_tests::require_program("mcp-server-everything", ".ci/run installs it from npm");
    let standins = root().join("tests/standins");
    let mst = Mst::exposing(&[&standins]);
    let config = json!({
        "name": "flood",
        "datasets": ["cases.jsonl"],
        "servers": {"everything": {"command": "mcp-server-everything", "args": ["stdio"]}},
        "client": "command",
        "clientOptions": {"command": ["python3", s(&standins.join("mcp_agent.py"))]},
        "timeout": 300
    });
    // Five calls past the cap of 10,000, 50 at once.
    let case = json!({"id": "flood", "input": {"calls": [{"server": "everything",
        "tool": "echo", "arguments": {"message": "x"}, "repeat": 10_005}]}});
    let eval = Eval::new(config, &[case]);
    let run = eval.run(&mst, &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run_dir = eval.run_dir("flood");
    let flood = read_trace(&run_dir, "default/flood/0");
    assert_eq!(flood["trace"]["status"], "completed");

    // The agent was answered 10,000 times, then told why it was refused.
    let tally = &agent_saw(&flood)["results"][0];
    assert_eq!(
        (&tally["answered"], &tally["isError"]),
        (&json!(10_000), &json!(5)),
        "{tally}"
    );
    assert!(
        tally["lastError"]
            .as_str()
            .unwrap()
            .contains("too many tool calls in one trial (more than 10000)"),
        "{tally}"
    );
    // The trace holds the 10,000 calls served and says once why the rest were not.
    assert_eq!(events(&flood, "tool-call").len(), 10_000);
    assert_eq!(events(&flood, "tool-result").len(), 10_000);
    let logs = events(&flood, "log");
    let refused: Vec<_> = logs
        .iter()
        .filter(|l| l["text"].as_str().unwrap().contains("too many tool calls"))
        .collect();
    assert_eq!(refused.len(), 1, "{logs:?}");
    let summary = read_json(&run_dir.join("summary.json"));
    assert_eq!(
        summary["servers"]["everything"]["calls"], 10_000,
        "{summary}"
    );
}

#[test]
fn the_api_client_sees_the_same_rewritten_tools_and_its_dry_run_write_is_blocked() {
    mst_tests::require_program("mcp-server-filesystem", ".ci/run installs it from npm");
    // The model renames nothing itself: it calls the renamed tool by the name it was shown, a
    // hidden one, and a write under a dry run.
    let script = json!([
        {"toolCalls": [
            {"name": "time__now", "arguments": {"timezone": "UTC"}},
            {"name": "time__convert_time", "arguments": {}},
            {"name": "fs__write_file", "arguments": {"path": "planted.txt", "content": "landed"}}
        ]},
        {"text": "done"}
    ]);
    let eval = Eval::new(
        json!({"name": "api-tools", "datasets": ["cases.jsonl"],
               "servers": {
                   "time": {"command": "python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]},
                   "fs": {"command": "mcp-server-filesystem", "args": ["."]}
               },
               "client": "api", "model": "mock/script", "clientOptions": {"mockScript": script},
               "tools": {"time__get_current_time": {"name": "now"}, "time__convert_time": {"hidden": true}},
               "dryRun": true,
               "judges": [{"assert": "no-blocked-calls"}],
               "timeout": 30}),
        &[json!({"id": "c", "input": "What time is it?"})],
    );
    let run = eval.run(&Mst::new(), &["-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("api-tools"), "default/c/0");
    let calls = events(&trace, "tool-call");
    // Recorded by the server's own names.
    let tools: Vec<&str> = calls.iter().map(|c| c["tool"].as_str().unwrap()).collect();
    assert_eq!(
        tools,
        ["get_current_time", "convert_time", "write_file"],
        "{trace}"
    );
    let results = events(&trace, "tool-result");
    assert_eq!(
        results[0]["isError"], false,
        "the renamed tool answered: {trace}"
    );
    assert_eq!(
        results[1]["isError"], true,
        "the hidden one is no tool: {trace}"
    );
    assert_eq!(results[2]["output"], "blocked: dry run", "{trace}");
    let blocked: Vec<_> = events(&trace, "custom")
        .into_iter()
        .filter(|e| e["name"] == "tool-blocked")
        .collect();
    assert_eq!(blocked.len(), 1, "{trace}");
    assert!(
        run.stdout
            .contains("calls were blocked: write_file (blocked: dry run)"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_streamable_http_server_behind_the_proxy_answers_with_its_token_kept_from_the_agent() {
    mst_tests::require_program("mcp-server-everything", ".ci/run installs it from npm");
    let (mut server, port) = mst_tests::everything_over_http();
    let standins = root().join("tests/standins");
    let mst = Mst::exposing(&[&standins]);
    const HEADER: &str = "mst-canary-proxy-header-5e21";
    let config = json!({
        "name": "http-upstream",
        "datasets": ["cases.jsonl"],
        "servers": {"everything": {"url": format!("http://127.0.0.1:{port}/mcp"),
                                   "headers": {"X-Team": HEADER}}},
        "client": "command",
        "clientOptions": {"command": ["sh", "-c",
            "cat $MST_MCP_CONFIG >&2; exec python3 \"$0\"", s(&standins.join("mcp_agent.py"))]},
        "timeout": 30
    });
    let case = json!({"id": "sum", "input": {"calls": [
        {"server": "everything", "tool": "get-sum", "arguments": {"a": 20, "b": 22}}]}});
    let eval = Eval::new(config, &[case]);
    let run = eval.run(
        &mst,
        &[
            // The server is on the host's loopback: the machine shares the host's network.
            "--runner-option",
            "network=host",
        ],
    );
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("http-upstream"), "default/sum/0");
    let saw = agent_saw(&trace);
    assert!(
        result_of(&saw, "get-sum")["text"]
            .as_str()
            .unwrap()
            .contains("42"),
        "{saw}"
    );
    assert_eq!(events(&trace, "tool-call")[0]["server"], "everything");
    // The agent's configuration (printed to its stderr, kept as log events) names the proxy,
    // never the server's address or its headers.
    let logged: String = events(&trace, "log")
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(logged.contains("mcpServers"), "{trace}");
    assert!(!logged.contains(HEADER), "{logged}");
    assert!(!logged.contains(&format!(":{port}/")), "{logged}");
}
