//! The `api` client: an agent loop on the worker, with the built-in `mock` provider (no model
//! provider is reachable from here) and a real MCP server (`mcp-server-time`, PyPI, installed by
//! `.ci/run`) for its tools.

use mst_tests::{read_json, Eval, Mst};
use serde_json::{json, Value};

/// An `api` eval on `model` with `options`, the real time server as `time`, and `cases`.
fn api_eval(model: &str, options: Value, cases: &[Value]) -> Eval {
    Eval::new(
        json!({"name": "agent", "datasets": ["cases.jsonl"],
               "servers": {"time": {"command": "python3",
                                    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}},
               "client": "api", "model": model, "clientOptions": options,
               "judges": [{"assert": "contains", "value": "Tokyo"}],
               "limits": {"providers": {"mock": 1}},
               "timeout": 30}),
        cases,
    )
}

fn events(trace: &Value) -> Vec<Value> {
    trace["trace"]["events"].as_array().unwrap().clone()
}

#[test]
fn an_api_agent_calls_the_real_time_server_through_a_scripted_model() {
    let script = json!([
        {"toolCalls": [{"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}]},
        {"text": "It is morning in Tokyo."}
    ]);
    let eval = api_eval(
        "mock/script",
        json!({"system": "You tell the time.", "mockScript": script}),
        &[json!({"id": "tokyo", "input": "What time is it in Tokyo?"})],
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_json(&eval.run_dir("agent").join("default/tokyo/0.json"));
    assert_eq!(
        trace["trace"]["finalText"], "It is morning in Tokyo.",
        "{trace}"
    );
    let events = events(&trace);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "message",
            "custom",
            "tool-call",
            "tool-result",
            "custom",
            "message"
        ],
        "{trace}"
    );
    assert_eq!(events[0]["role"], "user");
    assert_eq!(events[0]["text"], "What time is it in Tokyo?");
    assert_eq!(events[1]["name"], "usage");
    assert!(events[1]["data"]["usage"]["inputTokens"].as_u64().unwrap() > 0);
    assert_eq!(events[2]["server"], "time");
    assert_eq!(events[2]["tool"], "get_current_time");
    assert_eq!(events[2]["arguments"]["timezone"], "Asia/Tokyo");
    // The real server answered the model's call.
    let output: Value = serde_json::from_str(events[3]["output"].as_str().unwrap()).unwrap();
    assert_eq!(output["timezone"], "Asia/Tokyo", "{output}");
    assert_eq!(events[3]["id"], events[2]["id"]);
    assert_eq!(events[5]["role"], "assistant");
}

#[test]
fn tool_errors_go_back_to_the_model_and_max_turns_ends_the_loop() {
    let script = json!({
        // A tool no server has, a bad argument for a real one, then the answer.
        "errors": [
            {"toolCalls": [{"name": "time__no_such_tool"}, {"name": "nowhere"}]},
            {"toolCalls": [{"name": "time__get_current_time", "arguments": {"timezone": "Mars/Olympus"}}]},
            {"text": "Tokyo is unreachable."}
        ],
        // Calls a tool on every turn: maxTurns stops it.
        "looping": [
            {"toolCalls": [{"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}]},
            {"toolCalls": [{"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}]}
        ]
    });
    let eval = api_eval(
        "mock/script",
        json!({"mockScript": script, "maxTurns": 2}),
        &[
            json!({"id": "errors", "input": "Tokyo?"}),
            json!({"id": "looping", "input": "Tokyo?"}),
        ],
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    // `looping` has no answer: it fails its judge (the loop ran; nothing broke).
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("agent");
    let errors = read_json(&dir.join("default/errors/0.json"));
    assert_eq!(errors["trace"]["status"], "completed", "{errors}");
    let results: Vec<Value> = events(&errors)
        .into_iter()
        .filter(|e| e["type"] == "tool-result")
        .collect();
    assert_eq!(results.len(), 3, "{errors}");
    assert!(results.iter().all(|r| r["isError"] == true), "{errors}");
    assert!(results[1]["output"]
        .as_str()
        .unwrap()
        .contains("no tool `nowhere`"));
    // maxTurns is 2, so the third turn of `errors` is never asked for.
    assert_eq!(errors["trace"]["finalText"], Value::Null, "{errors}");
    let looping = read_json(&dir.join("default/looping/0.json"));
    let last = events(&looping).pop().unwrap();
    assert!(
        last["text"]
            .as_str()
            .unwrap()
            .contains("stopped after maxTurns (2)"),
        "{looping}"
    );
}

#[test]
fn mock_echo_answers_with_the_input() {
    let eval = api_eval(
        "mock/echo",
        json!({}),
        &[json!({"id": "echo", "input": "Tokyo, please"})],
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_json(&eval.run_dir("agent").join("default/echo/0.json"));
    assert_eq!(trace["trace"]["finalText"], "Tokyo, please");
}

#[test]
fn a_model_the_build_cannot_call_is_a_config_error_before_any_machine() {
    for (model, options, says) in [
        (
            "anthropic/claude-sonnet-4-5",
            json!({}),
            "not implemented yet",
        ),
        ("claude", json!({}), "not `provider/model`"),
        ("mock/script", json!({}), "needs `clientOptions.mockScript`"),
        (
            "mock/echo",
            json!({"maxTurns": 0}),
            "maxTurns must be at least 1",
        ),
        ("mock/echo", json!({"turns": 3}), "unknown field `turns`"),
    ] {
        let eval = api_eval(model, options, &[json!({"id": "c", "input": "x"})]);
        let run = eval.run(&Mst::new(), &["-q"]);
        assert_eq!(run.code, 2, "{model}: {}\n{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains(says) && run.stderr.contains("variant `default`"),
            "{model}: {}",
            run.stderr
        );
        assert!(!eval.results().exists(), "{model}: no run was started");
    }
}
