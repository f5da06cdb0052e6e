//! The real agent CLIs from npm (`@anthropic-ai/claude-code`, `@openai/codex`, pinned in
//! xtask) as trial clients, offline: their model is the built-in `mock/script`, served by the
//! coordinator through the machine's model gateway in the wire format each CLI speaks; their
//! MCP servers are real. The tool assertions grade the calls each CLI's stream reports.

use mst_tests::{events, read_trace, require_program, Eval, Mst};
use serde_json::{json, Value};

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
    // Seen by the tool proxy the CLI reached the server through (its ids are the proxy's),
    // once: the CLI's own report of the same call is left out.
    let to_server: Vec<_> = calls.iter().filter(|c| c["server"] == server).collect();
    assert_eq!(to_server.len(), 1, "{trace}");
    assert_eq!(to_server[0]["tool"], tool, "{trace}");
    assert!(
        to_server[0]["id"].as_str().unwrap().starts_with("proxy-"),
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
    require_program("claude", "npm install -g @anthropic-ai/claude-code");
    let servers = json!({"time": {"command": "python3",
                                  "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}});
    let eval = cli_eval(
        "claude-code",
        servers,
        "time__get_current_time",
        json!({"timezone": "Asia/Tokyo"}),
        "It is morning in Tokyo.",
    );
    // Sandboxed: the Python the time server runs on is shown to it (pyenv's, under a home).
    let expose = format!("expose={}", mst_tests::python_root().display());
    let sandboxed = ["isolation=bwrap", &expose].map(|o| ["--runner-option", o]);
    let run = eval.run(
        &Mst::new(),
        &[&["--json", "-q"][..], &sandboxed.concat()].concat(),
    );
    assert_seen_and_graded(&eval, &run, "time", "get_current_time");
}

#[test]
fn codex_calls_a_real_mcp_server_through_the_gateway_and_is_graded_on_it() {
    require_program("codex", "npm install -g @openai/codex");
    require_program(
        "mcp-server-everything",
        "npm install -g @modelcontextprotocol/server-everything",
    );
    let servers = json!({"everything": {"command": "mcp-server-everything"}});
    let eval = cli_eval(
        "codex",
        servers,
        "everything__echo",
        json!({"message": "hi from codex"}),
        "The server echoed.",
    );
    // Sandboxed, as each trial program is with isolation=bwrap: Codex runs in it.
    let sandboxed = ["--json", "-q", "--runner-option", "isolation=bwrap"];
    let run = eval.run(&Mst::new(), &sandboxed);
    assert_seen_and_graded(&eval, &run, "everything", "echo");
}

#[test]
fn the_agent_clis_example_passes_on_all_three_agents() {
    require_program("claude", "npm install -g @anthropic-ai/claude-code");
    require_program("codex", "npm install -g @openai/codex");
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

#[test]
fn a_cli_that_floods_then_hangs_ends_at_its_deadline_with_its_output_capped() {
    // A stand-in for the CLI (clientOptions.command): 40 MB of stream lines, then silence.
    let flood = r#"i=0; while [ $i -lt 200000 ]; do
printf '{"type":"assistant","message":{"content":[{"type":"text","text":"%0200d"}]}}\n' $i; i=$((i+1)); done
sleep 600"#;
    let eval = Eval::new(
        json!({"name": "cli", "datasets": ["cases.jsonl"], "client": "claude-code",
               "model": "mock/echo",
               "clientOptions": {"command": ["sh", "-c", flood, "claude"]},
               "judges": [{"assert": "exit-code", "value": 0}],
               "timeout": 20}),
        &[json!({"id": "c1", "input": "go"})],
    );
    let started = std::time::Instant::now();
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert!(started.elapsed().as_secs() < 60, "the deadline held");
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("cli"), "default/c1/0");
    assert_eq!(
        trace["trace"]["status"], "timed-out",
        "{}",
        trace["trace"]["status"]
    );
    let stored = serde_json::to_vec(&trace).unwrap().len();
    assert!(
        stored < 64 * 1024 * 1024,
        "the trace is capped: {stored} bytes"
    );
}

#[test]
fn claude_code_continues_its_own_session_in_a_playground_conversation() {
    require_program("claude", "npm install -g @anthropic-ai/claude-code");
    assert_a_conversation_resumes("claude-code");
}

#[test]
fn codex_continues_its_own_thread_in_a_playground_conversation() {
    require_program("codex", "npm install -g @openai/codex");
    assert_a_conversation_resumes("codex");
}

/// Two turns of a playground conversation on `client`: the second turn's model call carries
/// the first (the CLI resumed its session or thread by the id it printed).
fn assert_a_conversation_resumes(client: &str) {
    let eval = Eval::new(
        json!({"name": "play", "datasets": ["cases.jsonl"], "client": client,
               "model": "mock/echo", "judges": [{"assert": "exit-code", "value": 0}],
               "timeout": 120}),
        &[json!({"id": "unused", "input": "x"})],
    );
    let serve = mst_tests::serve::Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let session = serve.session(r#"{"conversation": true}"#);
    let mut asked = Vec::new();
    for input in ["first alpha", "second beta"] {
        let path = format!("/api/v1/sessions/{session}/tasks");
        let (status, task) = serve.call("POST", &path, Some(&json!({"input": input}).to_string()));
        assert_eq!(status, 202, "{task}");
        let id = task["id"].as_str().unwrap().to_string();
        let (events, page) = serve.follow(
            (&session, &id),
            0,
            None,
            std::time::Duration::from_secs(120),
        );
        assert_eq!(page["status"], "completed", "{page}");
        let answer = page["finalText"].as_str().unwrap_or_default();
        assert!(
            answer.ends_with(input),
            "mock/echo answers the turn: {page}"
        );
        asked.push(turns_asked(&events));
    }
    // The second turn's model call carried the first turn: the CLI resumed its session.
    assert!(asked[1] > asked[0], "turns asked: {asked:?}");
    serve.stop();
}

/// The most turns a model call of a turn carried, as the gateway measured them (its trace's
/// `events`, followed to the end).
fn turns_asked(events: &[Value]) -> u64 {
    let asked = events
        .iter()
        .filter(|e| e["type"] == "custom" && e["name"] == "usage")
        .filter_map(|e| e["data"]["asked"]["turns"].as_u64());
    asked.max().unwrap_or(0)
}

#[test]
fn claude_code_on_a_provider_never_holds_its_key() {
    require_program("claude", "npm install -g @anthropic-ai/claude-code");
    const KEY: &str = "mst-canary-cli-provider-key-51c2";
    let server = mst_tests::model_server::ModelServer::start(vec![
        mst_tests::model_server::Reply::ok(json!({"content": [
            {"type": "tool_use", "id": "toolu_1", "name": "mcp__time__get_current_time",
             "input": {"timezone": "Asia/Tokyo"}}],
            "stop_reason": "tool_use", "usage": {"input_tokens": 120, "output_tokens": 30}})),
        mst_tests::model_server::Reply::anthropic_text("It is morning in Tokyo."),
    ]);
    let eval = Eval::new(
        json!({"name": "cli", "datasets": ["cases.jsonl"], "client": "claude-code",
               "model": "acme/test-model",
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(), "key": "MODEL_KEY",
                                      "prices": {"test-model": {"input": 3.0, "output": 15.0}}}},
               "servers": {"time": {"command": "python3",
                                    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}},
               "judges": [{"assert": "tools-called",
                           "value": {"tools": [{"name": "time__get_current_time"}]}}],
               "timeout": 120}),
        &[json!({"id": "c1", "input": "What time is it in Tokyo?"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("MODEL_KEY={KEY}\n")).unwrap();
    let run = eval.run(
        &Mst::new(),
        &["--json", "-q", "--secrets-file", mst_tests::s(&secrets)],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    assert!(requests.len() >= 2, "{}", requests.len());
    assert!(requests.iter().all(|r| r.header("x-api-key") == Some(KEY)));
    assert!(mst_tests::files_containing(&eval.results(), KEY).is_empty());
    assert!(!run.stdout.contains(KEY) && !run.stderr.contains(KEY));
    let summary = run.json();
    assert!(
        summary["usage"]["variants"]["default"]["costUsd"].as_f64() > Some(0.0),
        "the host priced the calls: {summary}"
    );
}

#[test]
fn an_agent_cli_past_its_turns_token_budget_is_stopped_on_what_the_gateway_counted() {
    require_program("claude", "npm install -g @anthropic-ai/claude-code");
    // Claude Code reports no usage mst counts: the budget holds on what its gateway passed on.
    let eval = cli_eval(
        "claude-code",
        json!({}),
        "time__get_current_time",
        json!({"timezone": "Asia/Tokyo"}),
        "It is morning in Tokyo.",
    );
    let serve = mst_tests::serve::Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    // Claude Code's first request alone (its system prompt and tools) is over 1,000 tokens.
    let session = serve.session(r#"{"turnTokens": 1000}"#);
    let path = format!("/api/v1/sessions/{session}/tasks");
    let body = json!({"input": "What time is it in Tokyo?"}).to_string();
    let (status, task) = serve.call("POST", &path, Some(&body));
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap();
    let limit = std::time::Duration::from_secs(120);
    let (_, page) = serve.follow((&session, id), 0, None, limit);
    assert_eq!(page["status"], "over-budget", "{page}");
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    let reason = view["tasks"][0]["reason"].as_str().unwrap_or_default();
    assert!(
        reason.starts_with("past its token budget: its model calls used")
            && reason.ends_with("over the 1000 it may use"),
        "{view}"
    );
    serve.stop();
}
