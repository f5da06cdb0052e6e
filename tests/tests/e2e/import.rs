//! `mst import mst`: MST-format fixtures (`tests/fixtures/mst-format/`, written from MST's published
//! schemas) converted by the real `mst` binary, then run end to end: the 2.0 eval on the `api`
//! client against the real `mcp-server-time` (PyPI) and `mcp-server-everything` (npm), with a
//! scripted model on loopback standing in for Anthropic and the real rubric plugin installed as
//! the report says; the 1.x direct-mode cases on the `mcp` client against the real time server.

use mst_tests::model_server::{ModelServer, Reply};
use mst_tests::{files_containing, read_json, root, s, walk, Mst, Run};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The canary written as a literal `auth.accessToken` in the 2.0 fixture.
const LITERAL_TOKEN: &str = "mst-canary-literal-token-5e1f";

fn mst_fixture(path: &str) -> PathBuf {
    root().join("tests/fixtures/mst-format").join(path)
}

/// `mst import mst FILE --out OUT --json`.
fn import(mst: &Mst, file: &Path, out: &Path, extra: &[&str]) -> Run {
    let mut args = vec!["import", "mst", s(file), "--out", s(out), "--json"];
    args.extend(extra);
    mst.run(&args)
}

/// The notes of an import's `--json` output at `at` (ending with), as `change: text`.
fn notes_at(report: &Value, at: &str) -> Vec<String> {
    report["notes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["at"].as_str().unwrap().ends_with(at))
        .map(|n| {
            format!(
                "{}: {}",
                n["change"].as_str().unwrap(),
                n["text"].as_str().unwrap()
            )
        })
        .collect()
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn edit(path: &Path, change: impl FnOnce(&mut Value)) {
    let mut value = read_json(path);
    change(&mut value);
    std::fs::write(path, serde_json::to_string_pretty(&value).unwrap()).unwrap();
}

/// The scripted model: an agent turn calls `get_current_time` for Tokyo, then answers from the
/// tool's result; a judge's request (no tools) scores 0.85.
fn scripted_model() -> ModelServer {
    ModelServer::start_with(|body| {
        if body.get("tools").is_none() {
            return Reply::anthropic_text(
                "{\"score\": 0.85, \"reason\": \"gives the Tokyo time\"}",
            );
        }
        let messages = body["messages"].as_array().unwrap();
        let answered = messages
            .iter()
            .any(|m| m["content"].to_string().contains("tool_result"));
        if answered {
            Reply::anthropic_text("It is 09:00 in Tokyo.")
        } else {
            Reply::ok(json!({"content": [
                {"type": "tool_use", "id": "toolu_1", "name": "time__get_current_time",
                 "input": {"timezone": "Asia/Tokyo"}}],
                "usage": {"input_tokens": 50, "output_tokens": 10}}))
        }
    })
}

#[test]
fn a_2_0_config_converts_and_runs_on_real_servers_with_mst_semantics() {
    let mst = Mst::new();
    let out = tempfile::tempdir().unwrap();
    let imported = import(&mst, &mst_fixture("v2/eval-config.json"), out.path(), &[]);
    assert_eq!(imported.code, 0, "{}\n{}", imported.stdout, imported.stderr);
    let report = imported.json();
    converted_config_keeps_mst_semantics(out.path(), &imported, &report);
    converted_cases_keep_their_checks(out.path(), &report);
    converted_eval_runs_as_the_report_says(&mst, out.path());
}

/// The config: MST's shapes rewritten, its semantics kept; the literal token nowhere.
fn converted_config_keeps_mst_semantics(out: &Path, imported: &Run, report: &Value) {
    let eval = read_json(&out.join("eval.json"));
    assert_eq!(eval["name"], "time-agent");
    assert_eq!(eval["client"], "api");
    assert_eq!(eval["model"], "anthropic/claude-haiku-4-5");
    assert_eq!(
        eval["clientOptions"],
        json!({"system": "You tell the time.", "maxTurns": 4})
    );
    assert_eq!(
        eval["providers"]["anthropic"]["key"],
        "env:ANTHROPIC_API_KEY"
    );
    assert_eq!(
        eval["providers"]["anthropic"]["prices"]["claude-haiku-4-5"],
        json!({"input": 1, "output": 5})
    );
    assert_eq!(eval["timeout"], 60, "60000 ms → 60 s");
    assert_eq!(eval["trials"], 2);
    assert_eq!(
        eval["casePass"],
        json!({"share": 0.5}),
        "MST's passThreshold is a share of trials"
    );
    assert_eq!(
        eval["passThreshold"], 0,
        "MST passes a trial when every judge passes"
    );
    assert_eq!(
        eval["baseline"], "time-only",
        "MST's default baseline: the first variant"
    );
    assert_eq!(
        eval["variants"]["time-and-everything"],
        json!({"servers": ["time", "everything"]})
    );
    assert_eq!(eval["servers"]["time"]["command"], "python3");
    assert!(eval["servers"]["time"].get("transport").is_none());
    assert_eq!(
        eval["servers"]["search"],
        json!({"url": "https://search.invalid/mcp", "token": "env:SEARCH_TOKEN"})
    );
    assert_eq!(
        eval["plugins"],
        json!([{"path": "mst/grader/rubric", "allowModel": ["anthropic"]}])
    );
    // The literal token is nowhere in what the import wrote or printed.
    assert!(files_containing(out, LITERAL_TOKEN).is_empty());
    assert!(!imported.stdout.contains(LITERAL_TOKEN) && !imported.stderr.contains(LITERAL_TOKEN));
    let todo = report["todo"].to_string();
    assert!(
        todo.contains("export SEARCH_TOKEN") && todo.contains("export ANTHROPIC_API_KEY"),
        "{todo}"
    );
    for dropped in [
        "metrics",
        "variants[time-and-everything].description",
        "servers.time.quiet",
    ] {
        assert!(
            notes_at(report, dropped)
                .iter()
                .any(|n| n.starts_with("dropped")),
            "{dropped}"
        );
    }
}

/// The cases: assertions as built-in judges, the template applied, what cannot convert said.
fn converted_cases_keep_their_checks(out: &Path, report: &Value) {
    let cases = lines(&out.join("time.jsonl"));
    assert_eq!(cases.len(), 3);
    assert_eq!(
        cases[0]["input"],
        "What time is it in Tokyo right now? Answer briefly."
    );
    assert_eq!(
        cases[0]["metadata"]["description"],
        "one lookup, no detours"
    );
    let judges = cases[0]["judges"].to_string();
    for expected in [
        "\"contains\"",
        "\"tool-call-count\"",
        "\"tools-called\"",
        "\\\\d{2}:\\\\d{2}",
    ] {
        assert!(judges.contains(expected), "{expected} in {judges}");
    }
    assert!(
        !judges.contains("(?="),
        "a look-ahead cannot run in mst's regex: {judges}"
    );
    assert!(
        notes_at(report, "cases[tokyo-now].assertions.matchesPattern")
            .iter()
            .any(|n| n.starts_with("dropped: pattern \"Tokyo(?= time)\""))
    );
    assert_eq!(
        cases[1]["judges"],
        json!([{"assert": "tools-called", "value": {"ordered": true, "tools": [
            {"name": "time__convert_time", "arguments": {"source_timezone": "Europe/London"}}]}}]),
        "`time.convert_time` names the server; the optional call and `exclusive` go"
    );
    assert!(
        notes_at(report, "cases[london-convert].assertions.toolsTriggered")
            .iter()
            .any(|n| n.starts_with("approximated: `exclusive` dropped"))
    );
    assert_eq!(cases[2]["expected"], "The current time in Asia/Tokyo.");
    assert_eq!(cases[2]["judges"][0]["options"]["threshold"], 0.8);
}

/// Runs the converted eval as the report says: install the rubric plugin, point the provider
/// at the stand-in model (as at a gateway), set the variables it names. MST's verdicts hold,
/// and the model gets the converted prompt, options and key (never written anywhere).
fn converted_eval_runs_as_the_report_says(mst: &Mst, out: &Path) {
    const KEY: &str = "mst-canary-anthropic-key-71c2";
    let installed = mst.run(&["plugin", "install", s(&mst_tests::plugin("rubric.wasm"))]);
    assert_eq!(installed.code, 0, "{}", installed.stderr);
    let model = scripted_model();
    edit(&out.join("eval.json"), |eval| {
        eval["providers"]["anthropic"]["baseUrl"] = json!(model.url());
    });
    let results = out.join("results");
    let run: Run = mst
        .command(&[
            "run",
            "--config",
            s(&out.join("eval.json")),
            "--results-dir",
            s(&results),
            "--json",
            "-q",
        ])
        .env("ANTHROPIC_API_KEY", KEY)
        .env("SEARCH_TOKEN", "a-token-for-the-unused-search-server")
        .output()
        .unwrap()
        .into();
    assert_eq!(
        run.code, 1,
        "london-convert fails:\n{}\n{}",
        run.stdout, run.stderr
    );
    let summary = run.json();
    for variant in ["time-only", "time-and-everything"] {
        assert_eq!(
            summary["cases"][variant],
            json!({"tokyo-now": "passed", "london-convert": "failed", "judged": "passed"}),
            "{variant}: {summary}"
        );
    }
    let requests = model.requests();
    let agent = requests
        .iter()
        .find(|r| r.body.get("tools").is_some())
        .unwrap();
    assert_eq!(agent.body["system"], "You tell the time.");
    assert!(agent.body["messages"][0]["content"]
        .to_string()
        .contains("Answer briefly."));
    assert!(requests.iter().all(|r| r.header("x-api-key") == Some(KEY)));
    let judge = requests
        .iter()
        .find(|r| r.body.get("tools").is_none())
        .expect("the rubric judge asked the model");
    assert!(judge
        .body
        .to_string()
        .contains("The answer gives the time in Tokyo."));
    assert!(files_containing(&results, KEY).is_empty() && !run.stdout.contains(KEY));
}

#[test]
fn a_1_x_dataset_converts_its_direct_cases_to_the_mcp_client_and_runs_them() {
    let mst = Mst::new();
    let out = tempfile::tempdir().unwrap();
    let imported = import(&mst, &mst_fixture("v1/time-cases.json"), out.path(), &[]);
    // The raw `request` case cannot convert: every file is still written, and the exit says so.
    assert_eq!(imported.code, 2, "{}\n{}", imported.stdout, imported.stderr);
    assert!(
        imported.stderr.contains("1 case(s) lost every check") && imported.stderr.contains(": raw"),
        "{}",
        imported.stderr
    );
    let report = imported.json();
    assert_eq!(report["casesWithoutChecks"].as_array().unwrap().len(), 1);
    assert!(out.path().join("import-report.md").exists());

    // The `mcp_host` case: 1.x names rewritten.
    let asked = lines(&out.path().join("time-cases.jsonl"));
    assert_eq!(
        asked,
        vec![
            json!({"id": "ask", "input": "What time is it in Tokyo?", "expected": "The time in Asia/Tokyo.",
                    "trials": 3, "casePass": {"share": 0.66},
                    "judges": [{"assert": "tools-called", "value": {"tools": [{"name": "get_current_time"}]}}]})
        ]
    );
    assert_eq!(read_json(&out.path().join("eval.json"))["client"], "api");

    // The direct cases, on the `mcp` client, once the server is named (1.x kept it elsewhere).
    let direct = lines(&out.path().join("time-cases-direct.jsonl"));
    let ids: Vec<&str> = direct.iter().map(|c| c["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["tokyo", "convert", "mars", "paris"]);
    assert_eq!(
        direct[0]["input"],
        json!({"tool": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}})
    );
    let config = out.path().join("eval-direct.json");
    assert_eq!(read_json(&config)["client"], "mcp");
    assert!(report["todo"]
        .to_string()
        .contains("under `servers` in eval-direct.json"));
    edit(&config, |eval| {
        eval["servers"] = json!({"time": {"command": "python3",
                                          "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}});
        eval["timeout"] = json!(30);
    });
    let results = out.path().join("results");
    let run = mst.run(&[
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(&results),
        "--json",
        "-q",
    ]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.json()["cases"]["default"],
        json!({"tokyo": "passed", "convert": "passed", "mars": "failed", "paris": "failed"}),
        "{}",
        run.stdout
    );
}

#[test]
fn the_import_refuses_what_it_cannot_read_and_never_overwrites_silently() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    // Neither a config nor a dataset.
    let other = dir.path().join("other.json");
    std::fs::write(&other, r#"{"hello": 1}"#).unwrap();
    let run = import(&mst, &other, &dir.path().join("out"), &[]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("neither an MST eval config") && run.stderr.contains("other.json"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("out").exists(), "nothing written");
    // Broken JSON names its line.
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, "{\n  \"name\": \"x\",\n  \"cases\": [,]\n}").unwrap();
    let run = import(&mst, &broken, &dir.path().join("out"), &[]);
    assert!(run.stderr.contains("broken.json:3:"), "{}", run.stderr);

    // A second import into the same directory is refused, naming the files; --force replaces.
    let out = dir.path().join("converted");
    let config = mst_fixture("v2/eval-config.json");
    assert_eq!(import(&mst, &config, &out, &[]).code, 0);
    let eval = out.join("eval.json");
    std::fs::write(&eval, "kept").unwrap();
    let again = import(&mst, &config, &out, &[]);
    assert_eq!(again.code, 1);
    assert!(
        again.stderr.contains("already exist")
            && again.stderr.contains("eval.json")
            && again.stderr.contains("--force"),
        "{}",
        again.stderr
    );
    assert_eq!(std::fs::read_to_string(&eval).unwrap(), "kept");
    assert_eq!(import(&mst, &config, &out, &["--force"]).code, 0);
    assert!(read_json(&eval)["name"] == "time-agent");

    // A dataset outside the config's directory is refused, as `mst run` refuses one.
    let nested = dir.path().join("nested");
    std::fs::create_dir(&nested).unwrap();
    std::fs::copy(
        mst_fixture("v2/data/time.json"),
        dir.path().join("outside.json"),
    )
    .unwrap();
    let leaving = nested.join("eval-config.json");
    std::fs::copy(&config, &leaving).unwrap();
    edit(&leaving, |c| {
        c["datasets"] = serde_json::json!(["../outside.json"])
    });
    let run = import(&mst, &leaving, &dir.path().join("out-nested"), &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains("datasets[0]") && run.stderr.contains("outside the eval's directory"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("out-nested").exists(), "nothing written");
    assert_eq!(
        walk(&out).len(),
        3,
        "eval.json, time.jsonl, import-report.md"
    );
}

#[test]
fn a_config_whose_cases_are_all_direct_mode_writes_only_evals_that_load() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("eval-config.json");
    std::fs::write(
        &config,
        json!({"name": "time direct", "datasets": ["direct.json"], "model": "claude-haiku-4-5",
               "servers": {"time": {"transport": "stdio", "command": "python3",
                                    "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}},
               "timeout": 30000})
        .to_string(),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("direct.json"),
        json!({"name": "direct", "cases": [
            {"id": "tokyo", "mode": "direct", "toolName": "get_current_time",
             "args": {"timezone": "Asia/Tokyo"}, "expectedTextContains": ["Asia/Tokyo"]},
            {"id": "convert", "mode": "direct", "toolName": "time.convert_time",
             "args": {"source_timezone": "Europe/London", "time": "12:00",
                      "target_timezone": "Asia/Tokyo"},
             "expect": {"isError": false}}]})
        .to_string(),
    )
    .unwrap();
    let out = dir.path().join("out");
    let imported = import(&mst, &config, &out, &[]);
    assert_eq!(imported.code, 0, "{}\n{}", imported.stdout, imported.stderr);
    let report = imported.json();

    // One eval, on the `mcp` client: none without cases beside it, and the report says so.
    let mut written: Vec<String> = walk(&out)
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    written.sort();
    assert_eq!(
        written,
        ["direct-direct.jsonl", "eval.json", "import-report.md"],
        "{written:?}"
    );
    assert!(
        notes_at(&report, "datasets")
            .iter()
            .any(|n| n.contains("→ eval.json, on the `mcp` client: every case is one")),
        "{report}"
    );
    assert!(
        !report["todo"].to_string().contains("fix before running"),
        "the import's own load of what it wrote found nothing: {report}"
    );

    // Every eval written loads and runs, against the real time server.
    for eval in written.iter().filter(|f| f.ends_with(".json")) {
        let config = out.join(eval);
        assert_eq!(read_json(&config)["client"], "mcp");
        let run = mst.run(&[
            "run",
            "--config",
            s(&config),
            "--results-dir",
            s(&dir.path().join("results")),
            "--json",
            "-q",
        ]);
        assert_eq!(run.code, 0, "{eval}:\n{}\n{}", run.stdout, run.stderr);
        assert_eq!(
            run.json()["cases"]["default"],
            json!({"tokyo": "passed", "convert": "passed"}),
            "{}",
            run.stdout
        );
    }
}

#[test]
fn a_json_lines_file_is_named_an_mst_dataset_already() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let cases = dir.path().join("cases.jsonl");
    std::fs::write(
        &cases,
        "{\"id\": \"a\", \"input\": \"What time is it?\"}\n{\"id\": \"b\", \"input\": \"And now?\"}\n",
    )
    .unwrap();
    let run = import(&mst, &cases, &dir.path().join("out"), &[]);
    assert_eq!(run.code, 1);
    for expected in [
        s(&cases),
        "(JSON Lines)",
        "MST's eval configs and datasets are JSON",
        "an mst dataset already, which needs no import",
        "\"datasets\": [\"cases.jsonl\"]",
    ] {
        assert!(run.stderr.contains(expected), "{expected}: {}", run.stderr);
    }
    assert!(
        !run.stderr.contains("trailing characters"),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("out").exists(), "nothing written");
}

#[test]
fn a_harbor_task_missing_its_tests_or_holding_a_link_out_is_refused_and_nothing_written() {
    let tasks = tempfile::tempdir().unwrap();
    let task = tasks.path().join("t1");
    std::fs::create_dir_all(task.join("environment")).unwrap();
    std::fs::write(task.join("task.toml"), "version = \"1.0\"\n").unwrap();
    std::fs::write(task.join("instruction.md"), "Do it.\n").unwrap();
    std::fs::write(task.join("environment/Dockerfile"), "FROM x\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let import = || Mst::new().run(&["import", "harbor", s(tasks.path()), "--out", s(out.path())]);
    let missing = import();
    assert_ne!(missing.code, 0, "{}", missing.stdout);
    assert!(
        missing.stderr.contains("task `t1`: no tests/test.sh"),
        "{}",
        missing.stderr
    );
    std::fs::create_dir_all(task.join("tests")).unwrap();
    std::fs::write(task.join("tests/test.sh"), "exit 0\n").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", task.join("tests/passwd")).unwrap();
    let linked = import();
    assert_ne!(linked.code, 0, "{}", linked.stdout);
    assert!(
        linked
            .stderr
            .contains("points to the absolute `/etc/passwd`"),
        "{}",
        linked.stderr
    );
    assert_eq!(
        std::fs::read_dir(out.path()).unwrap().count(),
        0,
        "nothing written"
    );
}
