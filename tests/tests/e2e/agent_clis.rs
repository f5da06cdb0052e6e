//! The real agent CLIs from npm (`@anthropic-ai/claude-code`, `@openai/codex`, pinned in
//! xtask) as trial clients, offline: their model is the built-in `mock/script`, served by the
//! coordinator through the machine's model gateway in the wire format each CLI speaks; their
//! MCP servers are real. The tool assertions grade the calls each CLI's stream reports.

use mst_tests::{read_trace, Eval, Mst};
use serde_json::{json, Value};

/// Fails the test, naming the package, when `program` is not on the `PATH` (`cargo xtask
/// test` installs the CLIs).
fn require(program: &str, package: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{program} is missing: npm install -g {package}");
}

/// An eval of one case on `client`, its model `mock/script` calling `tool` with `arguments`
/// then answering `answer`, its servers `servers`, graded by `tools-called` on `tool` and
/// `contains` on the answer.
fn cli_eval(client: &str, servers: Value, tool: &str, arguments: Value, answer: &str) -> Eval {
    Eval::new(
        json!({"name": "cli", "datasets": ["cases.jsonl"], "client": client,
               "model": "mock/script", "servers": servers,
               "clientOptions": {"mockScript": [
                   {"toolCalls": [{"name": tool, "arguments": arguments}]},
                   {"text": answer}]},
               "judges": [{"assert": "tools-called", "value": {"tools": [{"name": tool}]}},
                          {"assert": "contains", "value": answer}],
               "timeout": 120}),
        &[json!({"id": "c1", "input": "Use the tool, then answer."})],
    )
}

/// The trace's events of `kind`.
fn events<'a>(trace: &'a Value, kind: &str) -> Vec<&'a Value> {
    trace["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == kind)
        .collect()
}

/// Checks `eval`'s one trial: its tool call seen with server and tool, its result, the answer,
/// the gateway's measured model calls (one a turn of the script, at least), and the record
/// naming the client and the CLI's version.
fn assert_seen_and_graded(eval: &Eval, run: &mst_tests::Run, server: &str, tool: &str) {
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("cli"), "default/c1/0");
    let by = &trace["collectedBy"];
    let pinned = match by["client"].as_str() {
        Some("claude-code") => "2.1.328",
        Some("codex") => "0.169.0",
        other => panic!("collectedBy.client is {other:?}"),
    };
    assert_eq!(by["clientVersion"], pinned, "{by}");
    let calls = events(&trace, "tool-call");
    assert!(
        calls
            .iter()
            .any(|c| c["server"] == server && c["tool"] == tool),
        "{trace}"
    );
    assert!(!events(&trace, "tool-result").is_empty(), "{trace}");
    let measured: Vec<_> = events(&trace, "custom")
        .into_iter()
        .filter(|e| e["name"] == "usage" && e["data"]["measuredBy"] == "gateway")
        .collect();
    assert!(
        measured.len() >= 2,
        "the gateway measured each model call: {trace}"
    );
    assert!(measured.iter().all(|e| e["data"]["model"] == "mock/script"));
}

#[test]
fn claude_code_calls_a_real_mcp_server_through_the_gateway_and_is_graded_on_it() {
    require("claude", "@anthropic-ai/claude-code");
    let servers = json!({"time": {"command": "python3",
                                  "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}});
    let eval = cli_eval(
        "claude-code",
        servers,
        "time__get_current_time",
        json!({"timezone": "Asia/Tokyo"}),
        "It is morning in Tokyo.",
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_seen_and_graded(&eval, &run, "time", "get_current_time");
}

#[test]
fn codex_calls_a_real_mcp_server_through_the_gateway_and_is_graded_on_it() {
    require("codex", "@openai/codex");
    require(
        "mcp-server-everything",
        "@modelcontextprotocol/server-everything",
    );
    let servers = json!({"everything": {"command": "mcp-server-everything"}});
    let eval = cli_eval(
        "codex",
        servers,
        "everything__echo",
        json!({"message": "hi from codex"}),
        "The server echoed.",
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_seen_and_graded(&eval, &run, "everything", "echo");
}

#[test]
fn the_agent_clis_example_passes_on_all_three_agents() {
    require("claude", "@anthropic-ai/claude-code");
    require("codex", "@openai/codex");
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let config = mst_tests::root().join("examples/agent-clis/eval.json");
    let run = mst.run(&[
        "run",
        "--config",
        mst_tests::s(&config),
        "--results-dir",
        mst_tests::s(results.path()),
        "--json",
        "-q",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    for variant in ["api", "claude-code", "codex"] {
        assert_eq!(
            summary["variants"][variant]["passRate"], 1.0,
            "{variant}: {summary}"
        );
    }
}
