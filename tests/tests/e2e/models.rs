//! The `api` client: an agent loop on the worker, with a real MCP server (`mcp-server-time`,
//! PyPI, installed by `.ci/run`) for its tools, and as its model the built-in `mock` provider or
//! a scripted model server on loopback speaking the `anthropic` and `openai` wire formats (no
//! model provider is reachable from here).

use mst_tests::model_server::{ModelServer, Reply};
use mst_tests::{read_json, read_trace, Eval, Mst};
use serde_json::{json, Value};
use std::time::Duration;

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

/// The text of the trace's last event that has one: why an infra trial failed (the host's
/// `model-error` events come after it).
fn last_text(trace: &Value) -> String {
    let events = events(trace);
    let text = events.iter().rev().find_map(|e| e["text"].as_str());
    text.unwrap_or_else(|| panic!("no event with text: {trace}"))
        .to_string()
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
    let trace = read_trace(&eval.run_dir("agent"), "default/tokyo/0");
    assert_eq!(
        trace["trace"]["finalText"], "It is morning in Tokyo.",
        "{trace}"
    );
    let events = events(&trace);
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "custom",
            "message",
            "custom",
            "tool-call",
            "tool-result",
            "custom",
            "message"
        ],
        "{trace}"
    );
    // First, the server's tools as it listed them (the run's `neverCalled` reads them).
    assert_eq!(events[0]["name"], "tools-listed");
    assert_eq!(events[0]["data"]["server"], "time");
    let events = &events[1..];
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
    let errors = read_trace(&dir, "default/errors/0");
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
    let looping = read_trace(&dir, "default/looping/0");
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
    let trace = read_trace(&eval.run_dir("agent"), "default/echo/0");
    assert_eq!(trace["trace"]["finalText"], "Tokyo, please");
}

#[test]
fn a_model_the_build_cannot_call_is_a_config_error_before_any_machine() {
    for (model, options, says) in [
        (
            "anthropic/claude-sonnet-4-5",
            json!({}),
            "add `providers.anthropic`",
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

/// An `api` eval on `provider/test-model`, a provider of `format` at `server`, keyed by
/// the secret `MODEL_KEY` (written to a secrets file holding `key`), with the real time server.
fn http_eval(format: &str, server: &ModelServer, key: &str) -> (Eval, std::path::PathBuf) {
    let eval = Eval::new(
        json!({"name": "agent", "datasets": ["cases.jsonl"],
               "servers": {"time": {"command": "python3",
                                    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}},
               "providers": {"acme": {"format": format, "baseUrl": server.url(), "key": "MODEL_KEY",
                                      "prices": {"test-model": {"input": 3.0, "output": 15.0}}}},
               "client": "api", "model": "acme/test-model",
               "clientOptions": {"system": "You tell the time.", "maxTokens": 200},
               "judges": [{"assert": "contains", "value": "Tokyo"}],
               "timeout": 30}),
        &[json!({"id": "tokyo", "input": "What time is it in Tokyo?"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("MODEL_KEY={key}\n")).unwrap();
    (eval, secrets)
}

/// Asserts that `run` stopped as a config error (exit 2) that says `says`.
fn assert_config_error(run: &mst_tests::Run, says: &str) {
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains(says), "{}", run.stderr);
}

/// `mst run --json -q` on `eval` with `secrets` as its secrets file.
fn run_with_secrets(eval: &Eval, secrets: &std::path::Path) -> mst_tests::Run {
    eval.run(
        &Mst::new(),
        &["--json", "-q", "--secrets-file", mst_tests::s(secrets)],
    )
}

/// Checks that `key` is in no result file, nor mst's output.
fn key_stays_secret(eval: &Eval, run: &mst_tests::Run, key: &str) {
    assert!(mst_tests::files_containing(&eval.results(), key).is_empty());
    assert!(!run.stdout.contains(key) && !run.stderr.contains(key));
}

#[test]
fn an_anthropic_format_model_calls_the_time_server_and_429_is_retried() {
    const KEY: &str = "mst-canary-model-key-3b9e";
    let server = ModelServer::start(vec![
        Reply::status(429, &[("retry-after", "1")]),
        Reply::ok(json!({"content": [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "time__get_current_time",
             "input": {"timezone": "Asia/Tokyo"}}],
            "usage": {"input_tokens": 120, "output_tokens": 30}})),
        Reply::ok(
            json!({"content": [{"type": "text", "text": "It is morning in Tokyo."}],
                         "usage": {"input_tokens": 200, "output_tokens": 9}}),
        ),
    ]);
    let (eval, secrets) = http_eval("anthropic", &server, KEY);
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 3, "one 429, then two turns");
    assert!(
        requests[1].at.duration_since(requests[0].at) >= std::time::Duration::from_millis(900),
        "Retry-After was honoured"
    );
    for request in &requests {
        assert_eq!(request.path, "/v1/messages");
        assert_eq!(request.header("x-api-key"), Some(KEY));
        assert_eq!(request.header("anthropic-version"), Some("2023-06-01"));
        assert_eq!(request.body["model"], "test-model");
        assert_eq!(request.body["system"], "You tell the time.");
    }
    let tools = requests[1].body["tools"].as_array().unwrap();
    assert!(
        tools.iter().any(|t| t["name"] == "time__get_current_time"),
        "{tools:?}"
    );
    // The tool's real result went back to the model.
    let last = requests[2].body["messages"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(last["content"][0]["type"], "tool_result", "{last}");
    assert_eq!(last["content"][0]["tool_use_id"], "toolu_1");
    assert!(last["content"][0]["content"]
        .as_str()
        .unwrap()
        .contains("Asia/Tokyo"));
    let trace = read_trace(&eval.run_dir("agent"), "default/tokyo/0");
    assert_eq!(trace["trace"]["finalText"], "It is morning in Tokyo.");
    let usage: Vec<u64> = events(&trace)
        .iter()
        .filter(|e| e["name"] == "usage")
        .map(|e| e["data"]["usage"]["inputTokens"].as_u64().unwrap())
        .collect();
    assert_eq!(usage, [120, 200]);
    // 120 tokens in at $3 and 30 out at $15 per million.
    let cost = events(&trace)
        .iter()
        .find(|e| e["name"] == "usage")
        .map(|e| e["data"]["costUsd"].as_f64().unwrap())
        .unwrap();
    assert!((cost - 0.00081).abs() < 1e-12, "{cost}");
    // The summary's totals for the variant are the sums of its calls' usage and costs.
    let costs: f64 = events(&trace)
        .iter()
        .filter(|e| e["name"] == "usage")
        .map(|e| e["data"]["costUsd"].as_f64().unwrap())
        .sum();
    let summary = read_json(&eval.run_dir("agent").join("summary.json"));
    let total = &summary["usage"]["variants"]["default"];
    assert_eq!(
        (
            &total["calls"],
            &total["inputTokens"],
            &total["outputTokens"]
        ),
        (&json!(2), &json!(320), &json!(39)),
        "{summary}"
    );
    let total_cost = total["costUsd"].as_f64().unwrap();
    assert!((total_cost - costs).abs() < 1e-12, "{summary}");
    assert!(
        (costs - (320.0 * 3.0 + 39.0 * 15.0) / 1e6).abs() < 1e-12,
        "{costs}"
    );
    assert_eq!(
        run.json()["usage"],
        summary["usage"],
        "--json prints it too"
    );
    key_stays_secret(&eval, &run, KEY);
}

#[test]
fn an_openai_format_model_gets_tool_results_as_tool_messages() {
    const KEY: &str = "mst-canary-openai-key-51c0";
    let server = ModelServer::start(vec![
        Reply::ok(
            json!({"choices": [{"message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function":
                {"name": "time__get_current_time", "arguments": "{\"timezone\": \"Asia/Tokyo\"}"}}]}}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 12}}),
        ),
        Reply::ok(json!({"choices": [{"message": {"role": "assistant",
            "content": "It is morning in Tokyo."}}],
            "usage": {"prompt_tokens": 90, "completion_tokens": 7}})),
    ]);
    let (eval, secrets) = http_eval("openai", &server, KEY);
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/chat/completions");
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    assert_eq!(requests[0].body["messages"][0]["role"], "system");
    let messages = requests[1].body["messages"].as_array().unwrap();
    let tool = messages.last().unwrap();
    assert_eq!(tool["role"], "tool", "{tool}");
    assert_eq!(tool["tool_call_id"], "call_1");
    assert!(tool["content"].as_str().unwrap().contains("Asia/Tokyo"));
    assert_eq!(
        messages[messages.len() - 2]["tool_calls"][0]["function"]["name"],
        "time__get_current_time"
    );
    key_stays_secret(&eval, &run, KEY);
}

#[test]
fn a_provider_failing_past_its_retries_makes_the_trial_infra() {
    let server = ModelServer::start(vec![Reply::status(500, &[])]);
    let (eval, secrets) = http_eval("anthropic", &server, "mst-canary-key-failing");
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        server.requests().len(),
        4,
        "the first try and three retries"
    );
    let trace = read_trace(&eval.run_dir("agent"), "default/tokyo/0");
    assert_eq!(trace["trace"]["status"], "infra", "{trace}");
    let reason = last_text(&trace);
    assert!(
        reason.contains("500") && reason.contains("after 4 attempt(s)"),
        "{reason}"
    );
    // The host made the call (through the trial's model gateway) and says so.
    let events = events(&trace);
    let failed = events.iter().find(|e| e["name"] == "model-error").unwrap();
    assert_eq!(failed["data"]["measuredBy"], "gateway", "{failed}");
    assert_eq!(failed["data"]["model"], "acme/test-model", "{failed}");
}

#[test]
fn a_provider_without_its_key_or_with_a_bad_url_is_a_config_error() {
    let server = ModelServer::start(vec![Reply::status(500, &[])]);
    let (eval, _) = http_eval("openai", &server, "unused");
    let empty = eval.dir.path().join("empty.env");
    std::fs::write(&empty, "OTHER=1\n").unwrap();
    let run = eval.run(&Mst::new(), &["-q", "--secrets-file", mst_tests::s(&empty)]);
    assert_config_error(
        &run,
        "providers.acme.key names secret `MODEL_KEY`, which --secrets-file does not hold",
    );
    let config = eval.config();
    let mut value = read_json(&config);
    value["providers"]["acme"]["baseUrl"] = json!("ftp://models.example");
    std::fs::write(&config, value.to_string()).unwrap();
    let run = eval.run(&Mst::new(), &["-q"]);
    assert_config_error(&run, "providers.acme.baseUrl must be an http(s) URL");
    value["providers"]["acme"]["baseUrl"] = json!(server.url());
    value["providers"]["acme"]["prices"]["test-model"]["input"] = json!(-1.0);
    std::fs::write(&config, value.to_string()).unwrap();
    let run = eval.run(&Mst::new(), &["-q"]);
    assert_config_error(&run, "providers.acme.prices.test-model");
    assert!(server.requests().is_empty(), "nothing was called");
}

#[test]
fn secret_env_naming_a_secret_the_file_lacks_is_a_config_error() {
    let eval = Eval::new(
        json!({"name": "agent", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["true"], "secretEnv": {"API_KEY": "MISSING"}}}),
        &[json!({"id": "c", "input": "x"})],
    );
    let run = eval.run(&Mst::new(), &["-q"]);
    assert_config_error(&run, "clientOptions.secretEnv.API_KEY names secret `MISSING`, which --secrets-file does not hold");
}

#[test]
fn the_agent_tools_example_runs_offline_and_its_provider_configs_ask_for_their_keys() {
    let _ = mst_tests::plugin("contains.wasm");
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let example = mst_tests::root().join("examples/agent-tools");
    let run_example = |config: &str| {
        mst.run(&[
            "run",
            "--config",
            mst_tests::s(&example.join(config)),
            "--results-dir",
            mst_tests::s(results.path()),
            "-q",
        ])
    };
    let run = run_example("eval.json");
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = mst_tests::only_run(results.path(), "agent-tools");
    let trace = read_trace(&dir, "default/london-noon-in-tokyo/0");
    let call = events(&trace)
        .into_iter()
        .find(|e| e["type"] == "tool-result")
        .unwrap();
    let output: Value = serde_json::from_str(call["output"].as_str().unwrap()).unwrap();
    assert_eq!(
        output["target"]["timezone"], "Asia/Tokyo",
        "the real server converted"
    );
    // The real filesystem server wrote the note into the trial's own directory and read it
    // back.
    let trace = read_trace(&dir, "default/tokyo-note/0");
    let results: Vec<String> = events(&trace)
        .into_iter()
        .filter(|e| e["type"] == "tool-result")
        .map(|e| e["output"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(results.len(), 3, "{trace}");
    assert!(results[1].contains("Successfully wrote"), "{results:?}");
    assert!(
        results[2].contains("17:00 Asia/Tokyo") && !results[2].contains("rror"),
        "{results:?}"
    );
    assert!(
        !example.join("note.txt").exists(),
        "the note stayed in the trial's directory"
    );
    for (config, key) in [
        ("eval.anthropic.json", "ANTHROPIC_API_KEY"),
        ("eval.openai.json", "OPENAI_API_KEY"),
    ] {
        let run = run_example(config);
        assert_eq!(run.code, 2, "{config}: {}", run.stderr);
        assert!(
            run.stderr.contains(&format!("names secret `{key}`")),
            "{config}: {}",
            run.stderr
        );
    }
}

/// An eval whose `command` agent answers `answer`, judged by the rubric plugin on model
/// `acme/judge-1` at `server` (granted `acme` when `grant`), keyed by `key`.
fn rubric_eval(
    server: &ModelServer,
    answer: &str,
    grant: bool,
    key: &str,
) -> (Eval, std::path::PathBuf) {
    let rubric = mst_tests::plugin("rubric.wasm");
    let allow: Vec<&str> = if grant { vec!["acme"] } else { vec![] };
    let eval = Eval::new(
        json!({"name": "judged", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["echo", answer], "input": "none"},
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(), "key": "JUDGE_KEY"}},
               "plugins": [{"path": mst_tests::s(&rubric), "allowModel": allow}],
               "judges": [{"plugin": "mst/grader/rubric",
                           "options": {"provider": "acme", "model": "judge-1",
                                       "rubric": "The answer names the time zone."}}],
               "passThreshold": 0.8, "timeout": 30}),
        &[json!({"id": "tokyo", "input": "What time is it in Tokyo?", "expected": "Asia/Tokyo"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("JUDGE_KEY={key}\n")).unwrap();
    (eval, secrets)
}

#[test]
fn the_rubric_grader_asks_a_model_through_the_host_which_holds_the_key() {
    const KEY: &str = "mst-canary-judge-key-0c7d";
    let server = ModelServer::start(vec![Reply::anthropic_text(
        "Verdict:\n```json\n{\"score\": 0.9, \"reason\": \"it names Asia/Tokyo\"}\n```",
    )]);
    let (eval, secrets) = rubric_eval(&server, "It is 09:00 in Asia/Tokyo.", true, KEY);
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].header("x-api-key"),
        Some(KEY),
        "the host added the key"
    );
    assert_eq!(requests[0].body["model"], "judge-1");
    let asked = requests[0].body["messages"][0]["content"].as_str().unwrap();
    assert!(
        asked.contains("The answer names the time zone.")
            && asked.contains("It is 09:00 in Asia/Tokyo."),
        "{asked}"
    );
    let grades = read_json(&eval.run_dir("judged").join("grades.json"));
    let text = grades.to_string();
    assert!(
        text.contains("it names Asia/Tokyo") && text.contains("0.9"),
        "{text}"
    );
    key_stays_secret(&eval, &run, KEY);
}

#[test]
fn judge_calls_take_provider_slots_and_the_judges_usage_is_counted() {
    // Six trials graded by the rubric judge on a provider limited to one call at a time, each
    // reply taking 300 ms: grading runs on a thread per core, so without the limit the calls
    // would overlap.
    let server = ModelServer::start_slow(
        vec![Reply::anthropic_text(
            "{\"score\": 1, \"reason\": \"fine\"}",
        )],
        Duration::from_millis(300),
    );
    let rubric = mst_tests::plugin("rubric.wasm");
    let cases: Vec<Value> = (1..=6)
        .map(|i| json!({"id": format!("c{i}"), "input": "What time is it?"}))
        .collect();
    let eval = Eval::new(
        json!({"name": "judged", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["echo", "noon"], "input": "none"},
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(), "key": "JUDGE_KEY",
                                      "prices": {"judge-1": {"input": 1.0, "output": 2.0}}}},
               "limits": {"providers": {"acme": 1}},
               "plugins": [{"path": mst_tests::s(&rubric), "allowModel": ["acme"]}],
               "judges": [{"plugin": "mst/grader/rubric",
                           "options": {"provider": "acme", "model": "judge-1", "rubric": "Any time."}}],
               "timeout": 30}),
        &cases,
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "JUDGE_KEY=mst-canary-judge-limit\n").unwrap();
    let secrets = mst_tests::s(&secrets);
    let run = eval.run(&Mst::new(), &["--secrets-file", secrets]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(server.requests().len(), 6);
    assert_eq!(server.most_in_flight(), 1, "one judge call at a time");

    // 80 tokens in at $1 and 20 out at $2 per million, six times.
    let expected = |usage: &Value| {
        assert_eq!(
            (
                &usage["calls"],
                &usage["inputTokens"],
                &usage["outputTokens"]
            ),
            (&json!(6), &json!(480), &json!(120)),
            "{usage}"
        );
        let cost = usage["costUsd"].as_f64().unwrap();
        assert!((cost - 6.0 * 0.00012).abs() < 1e-12, "{usage}");
    };
    let dir = eval.run_dir("judged");
    let record = read_json(&dir.join("run.json"));
    let judge = record["plugins"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "mst/grader/rubric")
        .unwrap();
    expected(&judge["usage"]);
    let summary = read_json(&dir.join("summary.json"));
    let label = format!("mst/grader/rubric {}", judge["version"].as_str().unwrap());
    expected(&summary["usage"]["plugins"][&label]);
    assert!(
        summary["usage"].get("variants").is_none(),
        "the command agent called no model: {summary}"
    );
    assert!(
        run.stdout.contains(&format!(
            "usage: plugin {label}: 6 model calls, 480 tokens in, 120 out, $0.0007"
        )),
        "{}",
        run.stdout
    );

    // `mst grade` counts its own judge calls.
    let run_id = dir.file_name().unwrap().to_str().unwrap();
    let regrade = Mst::new().run(&[
        "grade",
        run_id,
        "--results-dir",
        mst_tests::s(&eval.results()),
        "--secrets-file",
        secrets,
        "--json",
    ]);
    assert_eq!(regrade.code, 0, "{}\n{}", regrade.stdout, regrade.stderr);
    assert_eq!(server.requests().len(), 12);
    expected(&regrade.json()["usage"]["plugins"][&label]);
}

#[test]
fn a_judge_on_a_grade_shard_asks_its_model_through_the_coordinator_which_holds_the_key() {
    const KEY: &str = "mst-canary-grade-shard-key-5e1b";
    let server = ModelServer::start(vec![Reply::anthropic_text(
        "{\"score\": 0.9, \"reason\": \"it names Asia/Tokyo\"}",
    )]);
    let (eval, secrets) = rubric_eval(&server, "It is 09:00 in Asia/Tokyo.", true, KEY);
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(server.requests().len(), 1, "graded as it was collected");

    // Regraded in a grade shard on the local runner's machine: the plugin runs there, with no
    // key, and its model call goes through the machine's gateway to the coordinator.
    let dir = eval.run_dir("judged");
    let run_id = dir.file_name().unwrap().to_str().unwrap();
    let regrade = Mst::new().run(&[
        "grade",
        run_id,
        "--runner",
        "local",
        "--results-dir",
        mst_tests::s(&eval.results()),
        "--secrets-file",
        mst_tests::s(&secrets),
        "--json",
    ]);
    assert_eq!(regrade.code, 0, "{}\n{}", regrade.stdout, regrade.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one more call, the grade shard's");
    assert_eq!(
        requests[1].header("x-api-key"),
        Some(KEY),
        "the host added the key"
    );
    assert_eq!(requests[1].body["model"], "judge-1");
    let asked = requests[1].body["messages"][0]["content"].as_str().unwrap();
    assert!(asked.contains("It is 09:00 in Asia/Tokyo."), "{asked}");

    let regraded = dir.with_file_name(format!("{run_id}.g1"));
    let grades = read_json(&regraded.join("grades.json")).to_string();
    assert!(
        grades.contains("it names Asia/Tokyo") && grades.contains("0.9"),
        "{grades}"
    );
    // The call counts to the judge's plugin, as the coordinator measured it.
    let record = read_json(&regraded.join("run.json"));
    let judge = (record["plugins"].as_array().unwrap().iter())
        .find(|p| p["name"] == "mst/grader/rubric")
        .unwrap();
    assert_eq!(judge["usage"]["calls"], 1, "{judge}");
    assert!(record["grading"]["runner"] == "local", "{record}");
    // The machine's answer carries the call as the gateway measured it.
    let measured = mst_tests::files_containing(&regraded.join("grading"), "measuredBy");
    assert_eq!(measured.len(), 1, "{measured:?}");
    let answer = std::fs::read_to_string(&measured[0]).unwrap();
    assert!(
        answer.contains("\"model\":\"acme/judge-1\"")
            && answer.contains("\"measuredBy\":\"gateway\""),
        "{answer}"
    );
    key_stays_secret(&eval, &regrade, KEY);
}

#[test]
fn a_judge_without_a_verdict_or_without_its_grant_leaves_the_trial_not_graded() {
    let server = ModelServer::start(vec![Reply::anthropic_text("I think it is fine.")]);
    let (eval, secrets) = rubric_eval(&server, "Tokyo time.", true, "mst-canary-judge-key-1");
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 2, "not graded: {}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.json()["cases"]["default"]["tokyo"],
        "not-graded",
        "{}",
        run.stdout
    );
    let grades = read_json(&eval.run_dir("judged").join("grades.json")).to_string();
    assert!(grades.contains("did not reply with"), "{grades}");

    let server = ModelServer::start(vec![Reply::anthropic_text(
        "{\"score\": 1, \"reason\": \"x\"}",
    )]);
    let (eval, secrets) = rubric_eval(&server, "Tokyo time.", false, "mst-canary-judge-key-2");
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let grades = read_json(&eval.run_dir("judged").join("grades.json")).to_string();
    assert!(grades.contains("is not granted"), "{grades}");
    assert!(
        server.requests().is_empty(),
        "an ungranted plugin reaches no model"
    );
}

#[test]
fn a_malformed_model_reply_makes_the_trial_infra_naming_what_was_wrong() {
    for (format, reply, says) in [
        (
            "anthropic",
            json!({"content": "not a list"}),
            "no `content` list",
        ),
        (
            "openai",
            json!({"choices": [{"message": {"tool_calls": [{"id": "c1", "type": "function",
                   "function": {"name": "time__get_current_time", "arguments": "{not json"}}]}}]}),
            "`arguments` is not JSON",
        ),
        ("openai", json!({"choices": []}), "no `choices[0].message`"),
    ] {
        let server = ModelServer::start(vec![Reply::ok(reply)]);
        let (eval, secrets) = http_eval(format, &server, "mst-canary-malformed-key");
        let run = run_with_secrets(&eval, &secrets);
        assert_eq!(run.code, 1, "{format}: {}\n{}", run.stdout, run.stderr);
        let trace = read_trace(&eval.run_dir("agent"), "default/tokyo/0");
        assert_eq!(trace["trace"]["status"], "infra", "{trace}");
        let reason = last_text(&trace);
        assert!(reason.contains(says), "{format}: {reason}");
    }
}

#[test]
fn a_model_slower_than_the_trial_deadline_times_the_trial_out() {
    let slow = std::time::Duration::from_secs(20);
    let server = ModelServer::start_slow(
        vec![Reply::ok(
            json!({"choices": [{"message": {"role": "assistant", "content": "Tokyo"}}]}),
        )],
        slow,
    );
    let (eval, secrets) = http_eval("openai", &server, "mst-canary-slow-key");
    let config = eval.config();
    let mut value = read_json(&config);
    value["timeout"] = json!(2);
    std::fs::write(&config, value.to_string()).unwrap();
    let started = std::time::Instant::now();
    let run = run_with_secrets(&eval, &secrets);
    let took = started.elapsed();
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        took < slow,
        "the deadline ended the wait for the model: {took:?}"
    );
    assert_eq!(server.requests().len(), 0, "the reply never completed");
    let trace = read_trace(&eval.run_dir("agent"), "default/tokyo/0");
    assert_eq!(trace["trace"]["status"], "timed-out", "{trace}");
}

#[test]
fn a_provider_from_mst_home_takes_its_key_from_an_environment_variable() {
    const KEY: &str = "mst-canary-env-key-5d1c";
    let server = ModelServer::start(vec![Reply::ok(json!({"choices": [{"message":
        {"role": "assistant", "content": "It is night in Tokyo."}}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5}}))]);
    let (eval, _) = http_eval("openai", &server, "unused");
    let config = eval.config();
    let mut value = read_json(&config);
    let provider = value["providers"]["acme"].take();
    value.as_object_mut().unwrap().remove("providers");
    std::fs::write(&config, value.to_string()).unwrap();
    let mst = Mst::new();
    let mut provider = provider;
    provider["key"] = json!("env:MST_TEST_MODEL_KEY");
    let providers_file = mst.home.path().join("providers.json");
    std::fs::write(&providers_file, json!({"acme": provider}).to_string()).unwrap();

    let run: mst_tests::Run = mst
        .command(&eval.args(&["--json", "-q"]))
        .env("MST_TEST_MODEL_KEY", KEY)
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(
        requests[0].header("authorization"),
        Some(format!("Bearer {KEY}").as_str())
    );
    key_stays_secret(&eval, &run, KEY);

    // Unset, the variable is a config error naming the field and the variable.
    let run = eval.run(&mst, &["-q"]);
    assert_config_error(
        &run,
        "providers.acme.key names environment variable `MST_TEST_MODEL_KEY`, which is not set",
    );
    // A broken providers file is named, with the field.
    provider["baseUrl"] = json!("ftp://models.example");
    std::fs::write(&providers_file, json!({"acme": provider}).to_string()).unwrap();
    let run = eval.run(&mst, &["-q"]);
    assert_config_error(&run, "acme.baseUrl must be an http(s) URL");
    assert!(run.stderr.contains("providers.json"), "{}", run.stderr);
    assert_eq!(server.requests().len(), 1, "nothing more was called");
}

#[test]
fn an_api_agent_using_the_time_server_is_judged_by_the_rubric_grader_through_the_same_server() {
    const KEY: &str = "mst-canary-shared-key-a41b";
    let server = ModelServer::start(vec![
        Reply::ok(json!({"content": [
            {"type": "tool_use", "id": "toolu_1", "name": "time__get_current_time",
             "input": {"timezone": "Asia/Tokyo"}}],
            "usage": {"input_tokens": 50, "output_tokens": 10}})),
        Reply::ok(
            json!({"content": [{"type": "text", "text": "It is evening in Asia/Tokyo."}],
                         "usage": {"input_tokens": 90, "output_tokens": 8}}),
        ),
        Reply::anthropic_text("{\"score\": 1.0, \"reason\": \"names the zone\"}"),
    ]);
    let (eval, secrets) = http_eval("anthropic", &server, KEY);
    let config = eval.config();
    let mut value = read_json(&config);
    value["plugins"] = json!([{"path": mst_tests::s(&mst_tests::plugin("rubric.wasm")),
                               "allowModel": ["acme"]}]);
    value["judges"] = json!([{"plugin": "mst/grader/rubric",
                              "options": {"provider": "acme", "model": "judge-1",
                                          "rubric": "The answer names the time zone."}}]);
    std::fs::write(&config, value.to_string()).unwrap();
    let run = run_with_secrets(&eval, &secrets);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    let models: Vec<&str> = requests
        .iter()
        .map(|r| r.body["model"].as_str().unwrap())
        .collect();
    assert_eq!(models, ["test-model", "test-model", "judge-1"]);
    assert!(requests.iter().all(|r| r.header("x-api-key") == Some(KEY)));
    // The real server's answer went to the agent's model; the agent's answer to the judge.
    assert!(requests[1].body.to_string().contains("Asia/Tokyo"));
    let asked = requests[2].body["messages"][0]["content"].as_str().unwrap();
    assert!(asked.contains("It is evening in Asia/Tokyo."), "{asked}");
    let grades = read_json(&eval.run_dir("agent").join("grades.json")).to_string();
    assert!(grades.contains("names the zone"), "{grades}");
    key_stays_secret(&eval, &run, KEY);
}

#[test]
fn a_plugins_model_call_is_checked_by_the_host_its_role_and_its_token_budget() {
    const KEY: &str = "mst-canary-hostile-model-key";
    let server = ModelServer::start(vec![Reply::anthropic_text("hello back")]);
    let (eval, secrets) = rubric_eval(&server, "Tokyo time.", true, KEY);
    let hostile = |role: &str| {
        let config = eval.config();
        let mut value = read_json(&config);
        value["plugins"] = json!([{"path": mst_tests::s(&mst_tests::fixture("hostile.wasm")),
                                   "allowModel": ["acme"]}]);
        value["judges"] = json!([{"plugin": "mst/fixture/hostile",
            "options": {"behaviour": "model", "name": "acme", "path": role,
                        "message": "hi", "count": 4_000_000}}]);
        std::fs::write(&config, value.to_string()).unwrap();
        run_with_secrets(&eval, &secrets)
    };
    // A role the host does not know never reaches the model.
    let run = hostile("tool");
    assert_eq!(run.code, 2, "not graded: {}\n{}", run.stdout, run.stderr);
    let grades = read_json(&mst_tests::only_run(&eval.results(), "judged").join("grades.json"));
    assert!(
        grades.to_string().contains("a message's role is `tool`"),
        "{grades}"
    );
    assert!(server.requests().is_empty());
    // A huge token budget is cut to the host's cap; the key is the host's to add.
    std::fs::remove_dir_all(eval.results()).unwrap();
    let run = hostile("user");
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].body["max_tokens"], 16_384);
    assert_eq!(requests[0].header("x-api-key"), Some(KEY));
    let grades = read_json(&eval.run_dir("judged").join("grades.json")).to_string();
    assert!(grades.contains("model: hello back"), "{grades}");
    key_stays_secret(&eval, &run, KEY);
}
