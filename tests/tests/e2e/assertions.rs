//! The built-in tool-call assertions on real traces: the `mcp` client calling the real
//! `mcp-server-time` (PyPI, installed by `.ci/run`), and the `api` client driven by a scripted
//! model calling the same server; and the `casePass` rule deciding a case from its trials.

use mst_tests::{read_json, s, Eval, Mst};
use serde_json::{json, Value};

/// The real time server, as server `time`.
fn time_server() -> Value {
    json!({"time": {"command": "python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}})
}

/// Judge `index`'s (pass, reason) for trial 0 of `case` in the run's grades.json.
fn verdict(run_dir: &std::path::Path, case: &str, index: usize) -> (bool, String) {
    let grades = read_json(&run_dir.join("grades.json"));
    let entry = grades
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["key"]["case"] == case && g["key"]["trial"] == 0)
        .unwrap_or_else(|| panic!("no grade for {case}: {grades}"));
    let judge = &entry["grade"]["judges"][index];
    (
        judge["pass"].as_bool().unwrap(),
        judge["reason"].as_str().unwrap().to_string(),
    )
}

#[test]
fn tool_assertions_grade_real_mcp_calls() {
    let convert = json!({"tool": "convert_time", "arguments":
        {"source_timezone": "Europe/London", "time": "12:00", "target_timezone": "Asia/Tokyo"}});
    let tokyo = json!({"tool": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}});
    let both = json!({"calls": [convert, tokyo]});
    let eval = Eval::new(
        json!({"name": "asserted", "datasets": ["cases.jsonl"], "servers": time_server(),
               "client": "mcp", "timeout": 30,
               "judges": [
                 {"assert": "tools-called", "value": {"tools": [
                   {"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}},
                   {"name": "convert_time", "arguments": {"target_timezone": "Asia/Tokyo"}}]}},
                 {"assert": "tool-call-count", "value": {"max": 2}},
                 {"assert": "no-tool-errors"},
                 {"assert": "tool-not-called", "value": ["delete_time"]}]}),
        &[
            json!({"id": "both", "input": both}),
            json!({"id": "mars", "input": {"calls": [convert,
                {"tool": "get_current_time", "arguments": {"timezone": "Mars/Olympus"}}]}}),
            json!({"id": "ordered", "input": both, "judges": [
                {"assert": "tools-called", "value": {"tools": [
                  {"name": "get_current_time"}, {"name": "convert_time"}], "ordered": true}}]}),
        ],
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let cases = &run.json()["cases"]["default"];
    assert_eq!(
        (&cases["both"], &cases["mars"], &cases["ordered"]),
        (&json!("passed"), &json!("failed"), &json!("failed")),
        "{}",
        run.stdout
    );
    let dir = eval.run_dir("asserted");
    assert_eq!(
        verdict(&dir, "both", 0),
        (true, r#"called time__get_current_time {"timezone":"Asia/Tokyo"}, convert_time {"target_timezone":"Asia/Tokyo"}"#.into())
    );
    assert_eq!(
        verdict(&dir, "both", 3),
        (true, "did not call delete_time".into())
    );
    // The real server refused the zone: the call was made, its result is an error.
    let (ok, reason) = verdict(&dir, "mars", 0);
    assert!(
        !ok && reason.contains(r#"get_current_time {"timezone":"Mars/Olympus"}"#),
        "{reason}"
    );
    assert_eq!(
        verdict(&dir, "mars", 2),
        (
            false,
            "expected no tool errors; errors from: get_current_time".into()
        )
    );
    assert_eq!(
        verdict(&dir, "ordered", 0),
        (
            false,
            "expected get_current_time then convert_time in order; called: convert_time, get_current_time"
                .into()
        )
    );
}

#[test]
fn an_api_agents_calls_are_checked_in_order_and_exclusively() {
    let tokyo = json!({"name": "time__get_current_time", "arguments": {"timezone": "Asia/Tokyo"}});
    let convert = json!({"name": "time__convert_time", "arguments":
        {"source_timezone": "Asia/Tokyo", "time": "09:00", "target_timezone": "UTC"}});
    let script = json!({
        "exact": [{"toolCalls": [tokyo]}, {"toolCalls": [convert]}, {"text": "done"}],
        "extra": [{"toolCalls": [tokyo, {"name": "time__get_current_time", "arguments": {"timezone": "UTC"}}]},
                  {"toolCalls": [convert]}, {"text": "done"}]
    });
    let eval = Eval::new(
        json!({"name": "agent", "datasets": ["cases.jsonl"], "servers": time_server(),
               "client": "api", "model": "mock/script", "clientOptions": {"mockScript": script},
               "timeout": 30,
               "judges": [{"assert": "tools-called", "value": {"ordered": true, "exclusive": true,
                 "tools": [{"name": "time__get_current_time"}, {"name": "time__convert_time"}]}}]}),
        &[
            json!({"id": "exact", "input": "Tokyo time in UTC?"}),
            json!({"id": "extra", "input": "Tokyo time in UTC?"}),
        ],
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("agent");
    assert_eq!(
        verdict(&dir, "exact", 0),
        (
            true,
            "called time__get_current_time then time__convert_time in order and nothing else"
                .into()
        )
    );
    assert_eq!(
        verdict(&dir, "extra", 0),
        (
            false,
            "expected time__get_current_time then time__convert_time in order and nothing else; \
             called: get_current_time, get_current_time, convert_time"
                .into()
        )
    );
}

#[test]
fn a_malformed_tool_assertion_stops_the_run_before_anything_starts() {
    let eval = Eval::new(
        json!({"name": "bad", "datasets": ["cases.jsonl"], "servers": time_server(),
               "client": "mcp",
               "judges": [{"assert": "no-tool-errors"},
                          {"assert": "tools-called", "value": {"tools": [{"name": "get_current_time", "arguments": "UTC"}]}}]}),
        &[
            json!({"id": "c", "input": {"tool": "get_current_time", "arguments": {"timezone": "UTC"}},
                 "judges": [{"assert": "tool-call-count", "value": {"min": 2, "max": 1}}]}),
        ],
    );
    let run = eval.run(&Mst::new(), &[]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("judges[1] (`tools-called`)")
            && run
                .stderr
                .contains("`value.tools[0].arguments` must be an object"),
        "{}",
        run.stderr
    );
    assert!(!eval.results().exists(), "no run was started");
    // Fixed at the eval level, the case's own judge is the next error.
    let mut config = read_json(&eval.config());
    config["judges"][1]["value"]["tools"][0]["arguments"] = json!({"timezone": "UTC"});
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let run = eval.run(&Mst::new(), &[]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("case `c`: judges[0] (`tool-call-count`)")
            && run
                .stderr
                .contains("`value.max` (1) is below `value.min` (2)"),
        "{}",
        run.stderr
    );
    assert!(!eval.results().exists(), "no run was started");
}

#[test]
fn a_share_rule_passes_the_case_a_majority_fails() {
    // Four trials; the even ones pass: 2 of 4, a tie, which is no majority.
    let eval = Eval::new(
        json!({"name": "shares", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "test $(({trial} % 2)) -eq 0"]},
               "judges": [{"assert": "exit-code", "value": 0}], "trials": 4}),
        &[
            json!({"id": "flaky", "input": "x"}),
            // Its own rule wins over the eval's.
            json!({"id": "own-rule", "input": "x", "casePass": {"rule": "majority"}}),
        ],
    );
    let mst = Mst::new();
    let majority = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(majority.code, 1, "{}\n{}", majority.stdout, majority.stderr);
    let summary = majority.json();
    assert_eq!(summary["cases"]["default"]["flaky"], "failed", "{summary}");
    let grades = read_json(&eval.run_dir("shares").join("grades.json"));
    let passes: Vec<bool> = grades
        .as_array()
        .unwrap()
        .iter()
        .filter(|g| g["key"]["case"] == "flaky")
        .map(|g| g["grade"]["pass"].as_bool().unwrap())
        .collect();
    assert_eq!(passes, [true, false, true, false]);
    // The same traces, regraded under `casePass: {"share": 0.5}`, pass.
    let mut config = read_json(&eval.config());
    config["casePass"] = json!({"share": 0.5});
    let share_config = eval.dir.path().join("share.json");
    std::fs::write(&share_config, config.to_string()).unwrap();
    let run_id = summary["runId"].as_str().unwrap();
    let results = eval.results();
    let regrade = mst.run(&[
        "grade",
        run_id,
        "--config",
        s(&share_config),
        "--results-dir",
        s(&results),
        "--json",
    ]);
    assert_eq!(regrade.code, 1, "{}\n{}", regrade.stdout, regrade.stderr);
    let regraded = regrade.json();
    assert_eq!(
        regraded["cases"]["default"]["flaky"], "passed",
        "{regraded}"
    );
    assert_eq!(
        regraded["cases"]["default"]["own-rule"], "failed",
        "{regraded}"
    );
    assert_eq!(regraded["variants"]["default"]["passRate"], 0.5);
    assert_eq!(
        regraded["casePass"],
        json!({"default": {"share": 0.5}, "cases": {"own-rule": {"rule": "majority"}}}),
        "the summary records the rules that made the verdicts"
    );
    // A share above what passed fails it again.
    config["casePass"] = json!({"share": 0.75});
    std::fs::write(&share_config, config.to_string()).unwrap();
    let strict = mst.run(&[
        "grade",
        run_id,
        "--config",
        s(&share_config),
        "--results-dir",
        s(&results),
        "--json",
    ]);
    assert_eq!(strict.code, 1, "{}\n{}", strict.stdout, strict.stderr);
    assert_eq!(strict.json()["cases"]["default"]["flaky"], "failed");
    // A case's malformed rule stops the run before anything starts, naming the case.
    std::fs::write(
        eval.dir.path().join("cases.jsonl"),
        json!({"id": "bad", "input": "x", "casePass": {"share": 75}}).to_string(),
    )
    .unwrap();
    let bad = eval.run(&mst, &[]);
    assert_eq!(bad.code, 2, "{}\n{}", bad.stdout, bad.stderr);
    assert!(
        bad.stderr
            .contains("case `bad`: `casePass.share` must be between 0 and 1")
            && bad.stderr.contains("(for 75% write 0.75)"),
        "{}",
        bad.stderr
    );
}
