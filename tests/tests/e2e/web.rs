//! The pages, in a real headless Chromium (`mst_tests::browser`): the report `mst report`
//! writes, opened from a file; the web UI of `mst serve` (the stored runs, a run started from the
//! page and followed live, the playground end to end); and `mst run --serve`. Every number the
//! pages show is checked against `summary.json`, and each page is saved as a screenshot under
//! `target/test-output/<test>/`.

use mst_tests::browser::Browser;
use mst_tests::serve::{agent_eval, gated_agent, Serve};
use mst_tests::{read_json, s, Eval, Mst};
use serde_json::{json, Value};
use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An eval whose `agent` streams a tool call and its result, then echoes its input (judged by
/// `contains "hello"`), and whose `broken` variant cannot start its client (infra). One case's
/// input would end a `<script>` element if a page put it there as markup.
fn web_eval() -> Eval {
    let agent = r#"echo '{"type":"tool-call","id":"c1","tool":"lookup","arguments":{"q":"weather"}}'; echo '{"type":"tool-result","id":"c1","output":"sunny"}'; cat"#;
    Eval::new(
        json!({"name": "web", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "events": true},
               "variants": {"agent": {},
                            "broken": {"clientOptions": {"command": ["/nonexistent/agent"]}}},
               "judges": [{"assert": "contains", "value": "hello"}], "trials": 2}),
        &[
            json!({"id": "greets", "input": "hello world", "tags": ["smoke"]}),
            json!({"id": "waves", "input": "bye"}),
            json!({"id": "markup", "input": "hello </script><script>document.title='owned'</script>"}),
        ],
    )
}

/// An eval of one variant whose agent streams `before` events, holds until `gate` exists,
/// streams `after`, then echoes its input (`hello`, which its judge wants).
fn gated_eval(gate: &Path, before: std::ops::Range<u32>, after: std::ops::Range<u32>) -> Eval {
    Eval::new(
        json!({"name": "play", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", gated_agent(gate, before, after)],
                                 "events": true},
               "judges": [{"assert": "contains", "value": "hello"}], "timeout": 60}),
        &[json!({"id": "greet", "input": "hello"})],
    )
}

/// Waits until `ready` holds on the page, or fails naming `what`.
fn until(browser: &Browser, what: &str, ready: impl Fn(&Browser) -> bool) {
    let start = Instant::now();
    while !ready(browser) {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "timed out waiting for {what}; the page says:\n{}",
            browser.page_text(2000)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn count(browser: &Browser, css: &str) -> usize {
    browser
        .eval(&format!(
            "return document.querySelectorAll({}).length",
            json!(css)
        ))
        .as_u64()
        .unwrap() as usize
}

/// Every number of the variants table, the missing count and each case's outcome per variant
/// are `summary.json`'s.
fn assert_page_matches_summary(browser: &Browser, summary: &Value) {
    for (variant, counts) in summary["variants"].as_object().unwrap() {
        let row = format!("#variants tr[data-variant='{variant}']");
        for (field, key) in [
            ("passed", "passed"),
            ("failed", "failed"),
            ("incomplete", "incomplete"),
            ("notGraded", "not-graded"),
            ("infra", "infra"),
        ] {
            let shown = browser.text(&format!("{row} td[data-count='{key}']"));
            assert_eq!(shown, counts[field].to_string(), "{variant} {field}");
        }
        let rate = browser.text(&format!("{row} td[data-count='pass-rate']"));
        let expected = counts["passRate"]
            .as_f64()
            .map_or("\u{2013}".to_string(), |r| format!("{:.1}%", r * 100.0));
        assert_eq!(rate, expected, "{variant} pass rate");
        let fields = ["passed", "failed", "incomplete", "notGraded", "infra"];
        let planned: u64 = fields.iter().map(|f| counts[f].as_u64().unwrap()).sum();
        assert_eq!(
            browser.text(&format!("{row} td[data-count='of-planned']")),
            format!("{}/{planned}", counts["passed"]),
            "{variant} passed of planned"
        );
    }
    assert_eq!(
        browser.text("#variants [data-count='missing']"),
        summary["missing"].as_array().unwrap().len().to_string()
    );
    for (variant, cases) in summary["cases"].as_object().unwrap() {
        for (case, outcome) in cases.as_object().unwrap() {
            let cell = format!(
                "#cases-table tr[data-case='{case}'] td[data-variant='{variant}'] [data-outcome]"
            );
            assert_eq!(
                browser.attr(&cell, "data-outcome").as_deref(),
                outcome.as_str(),
                "{variant}/{case}"
            );
        }
    }
}

/// The run's summary, from its directory.
fn stored_summary(results: &Path, eval: &str, run_id: &str) -> Value {
    read_json(
        &results
            .join(eval)
            .join("runs")
            .join(run_id)
            .join("summary.json"),
    )
}

/// `mst report RUN_ID --out OUT --json` into `shared/report.html` of `eval`'s directory, which
/// must succeed and say how many trials and bytes it wrote: the file.
fn write_report(mst: &Mst, eval: &Eval, run_id: &str) -> PathBuf {
    let out = eval.dir.path().join("shared/report.html");
    let written = mst.run(&[
        "report",
        run_id,
        "--out",
        s(&out),
        "--results-dir",
        s(&eval.results()),
        "--json",
    ]);
    assert_eq!(written.code, 0, "{}", written.stderr);
    assert_eq!(written.json()["trials"], 12);
    assert_eq!(
        written.json()["bytes"].as_u64().unwrap(),
        std::fs::metadata(&out).unwrap().len()
    );
    out
}

/// The open report of [`web_eval`]'s run fetched nothing to draw itself, and groups the infra
/// failures by their cause: one line for the broken client's six trials.
fn assert_self_contained_with_infra_grouped(browser: &Browser) {
    assert_eq!(
        browser.eval("return performance.getEntriesByType('resource').length"),
        json!(0)
    );
    let infra = browser.texts("#infra li");
    assert_eq!(infra.len(), 1, "{infra:?}");
    assert!(
        infra[0].starts_with("6 trials (broken)") && infra[0].contains("/nonexistent/agent"),
        "{infra:?}"
    );
}

/// Filtering the open report by outcome shows the failed trials (the two of `waves` under
/// `agent`), and Enter on a trial's link opens its whole trace.
fn assert_failed_filter_then_trace_by_keyboard(browser: &Browser) {
    browser.click("#filter-outcome option[value='failed']");
    until(browser, "the failed trials", |b| {
        count(b, "#trials-table tbody tr") == 2
    });
    let rows = browser.texts("#trials-table tbody tr");
    assert!(
        rows.iter()
            .all(|r| r.starts_with("waves") && r.contains("expected: contains \"hello\"")),
        "{rows:?}"
    );
    browser.press_enter("#trials-table tbody tr a.open-trial");
    browser.wait_for("#trace [data-event-kind='tool-result']");
    let call = browser.text("#trace [data-event-kind='tool-call']");
    assert!(
        call.contains("lookup") && call.contains("weather"),
        "{call}"
    );
    assert!(browser
        .text("#trace [data-event-kind='tool-result']")
        .contains("sunny"));
    assert!(browser
        .text("#trace [data-judge='contains']")
        .contains("expected: contains \"hello\""));
    assert_eq!(browser.text("#final-text"), "bye");
}

/// The search box of the open report, and hostile text staying text: the markup case's answer
/// is shown as written, and its script never ran.
fn assert_search_finds_markup_shown_as_text(browser: &Browser) {
    browser.click("#filter-outcome option[value='']");
    browser.fill("#search", "markup");
    until(browser, "the markup case's trials", |b| {
        count(b, "#trials-table tbody tr") == 4
    });
    browser.click("#trials-table tbody tr[data-trial-index] a.open-trial");
    browser.wait_for("#final-text");
    assert_eq!(
        browser.text("#final-text"),
        "hello </script><script>document.title='owned'</script>"
    );
    assert_ne!(browser.eval("return document.title"), json!("owned"));
    browser.screenshot("report");
}

/// In a narrow window the open page reflows (only tables scroll sideways, in their own boxes),
/// and it logged no console error.
fn assert_narrow_window_reflows(browser: &Browser) {
    browser.set_window_size(390, 844);
    assert_eq!(
        browser.eval("return document.documentElement.scrollWidth <= window.innerWidth + 1"),
        json!(true)
    );
    browser.screenshot("report-narrow");
    assert_eq!(browser.console_errors(), Vec::<String>::new());
}

/// Runs [`web_eval`] again with its judge wanting "bye", so two cases broke and one was fixed
/// since run `before`, as `mst runs diff --json` says: the new run's id and the diff's counts.
fn rerun_with_the_judge_wanting_bye(mst: &Mst, eval: &Eval, before: &str) -> (String, Value) {
    let config = std::fs::read_to_string(eval.config()).unwrap();
    std::fs::write(eval.config(), config.replace("\"hello\"", "\"bye\"")).unwrap();
    let second = eval.run(mst, &["--json"]);
    let after = second.json()["runId"].as_str().unwrap().to_string();
    let diff = mst.run(&[
        "runs",
        "diff",
        before,
        &after,
        "--results-dir",
        s(&eval.results()),
        "--json",
    ]);
    assert_eq!(diff.code, 1, "{}", diff.stderr);
    let counts = diff.json()["counts"].clone();
    assert_eq!(
        (counts["broke"].as_u64(), counts["fixed"].as_u64()),
        (Some(2), Some(1))
    );
    (after, counts)
}

/// The report of run `after` against `baseline`, opened in `browser`, shows what `mst runs
/// diff` said (`counts`) and the `agent` variant's change in points.
fn assert_baseline_report_shows_the_diff(
    mst: &Mst,
    browser: &Browser,
    eval: &Eval,
    baseline: &str,
    after: &str,
    counts: &Value,
) {
    let compared = eval.dir.path().join("compared.html");
    let written = mst.run(&[
        "report",
        after,
        "--baseline",
        baseline,
        "--out",
        s(&compared),
        "--results-dir",
        s(&eval.results()),
    ]);
    assert_eq!(written.code, 0, "{}", written.stderr);
    browser.set_window_size(1280, 900);
    browser.goto(&format!("file://{}", s(&compared)));
    browser.wait_for("body[data-ready='1'] #diff");
    for change in ["broke", "fixed", "still-failing"] {
        assert_eq!(
            browser.text(&format!("#diff [data-count='{change}']")),
            counts[change].to_string(),
            "{change}"
        );
    }
    assert_eq!(
        browser.text("#diff tr[data-variant='agent'] td[data-count='delta']"),
        "-33.3 pts"
    );
    browser.screenshot("report-baseline");
}

/// A run of another eval is no baseline for run `after` of [`web_eval`].
fn assert_another_evals_run_is_no_baseline(mst: &Mst, results: &Path, after: &str) {
    let other = Eval::new(
        json!({"name": "other", "datasets": ["cases.jsonl"], "client": "command",
        "clientOptions": {"command": ["cat"]}}),
        &[json!({"id": "greets", "input": "hi"})],
    );
    let other_run = mst.run(&[
        "run",
        "--config",
        s(&other.config()),
        "--results-dir",
        s(results),
        "--json",
    ]);
    let other_id = other_run.json()["runId"].as_str().unwrap().to_string();
    let refused = mst.run(&[
        "report",
        after,
        "--baseline",
        &other_id,
        "--results-dir",
        s(results),
    ]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(refused.stderr.contains("other"), "{}", refused.stderr);
}

#[test]
fn the_report_file_shows_summary_json_s_numbers_and_each_trace_offline_and_in_a_narrow_window() {
    let eval = web_eval();
    let mst = Mst::new();
    let run = eval.run(&mst, &["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let summary = run.json();
    let run_id = summary["runId"].as_str().unwrap();
    let results = eval.results();
    // Every run leaves its report beside its results.
    assert!(results
        .join("web/runs")
        .join(run_id)
        .join("report.html")
        .is_file());
    let out = write_report(&mst, &eval, run_id);

    let browser = Browser::start();
    browser.goto(&format!("file://{}", s(&out)));
    browser.wait_for("body[data-ready='1']");
    browser.screenshot("report-overview");
    assert_page_matches_summary(&browser, &summary);
    assert_self_contained_with_infra_grouped(&browser);
    assert_failed_filter_then_trace_by_keyboard(&browser);
    assert_search_finds_markup_shown_as_text(&browser);
    assert_narrow_window_reflows(&browser);

    // Against a baseline: the page says what `mst runs diff` says.
    let (after, counts) = rerun_with_the_judge_wanting_bye(&mst, &eval, run_id);
    assert_baseline_report_shows_the_diff(&mst, &browser, &eval, run_id, &after, &counts);
    assert_another_evals_run_is_no_baseline(&mst, &results, &after);
}

#[test]
fn case_and_variant_names_like_object_members_are_shown_as_data() {
    // A case id is the dataset's (or a resolver plugin's) choice: names like `constructor`
    // must not reach into the page script's own objects.
    let names = ["constructor", "__proto__", "toString", "hasOwnProperty"];
    let cases: Vec<Value> = names
        .iter()
        .map(|id| json!({"id": id, "input": "hello"}))
        .collect();
    let eval = Eval::new(
        json!({"name": "protos", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["cat"]},
               "variants": {"valueOf": {}, "broken": {"clientOptions": {"command": ["/nonexistent/agent"]}}},
               "judges": [{"assert": "contains", "value": "hello"}]}),
        &cases,
    );
    let mst = Mst::new();
    let run = eval.run(&mst, &["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let run_id = run.json()["runId"].as_str().unwrap().to_string();
    let out = eval.dir.path().join("report.html");
    let written = mst.run(&[
        "report",
        &run_id,
        "--out",
        s(&out),
        "--results-dir",
        s(&eval.results()),
    ]);
    assert_eq!(written.code, 0, "{}", written.stderr);
    let browser = Browser::start();
    browser.goto(&format!("file://{}", s(&out)));
    browser.wait_for("body[data-ready='1']");
    let rows = browser.texts("#cases-table tbody tr");
    assert_eq!(rows.len(), names.len(), "{rows:?}");
    for name in names {
        let row = rows
            .iter()
            .find(|r| r.starts_with(name))
            .unwrap_or_else(|| panic!("{name}: {rows:?}"));
        assert!(row.contains("1/1"), "{name}: {row}");
    }
    assert_eq!(
        browser.texts("#infra li").len(),
        1,
        "one cause, its four trials"
    );
}

#[test]
fn the_web_ui_lists_stored_runs_and_follows_a_run_started_from_the_page_until_its_report() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let eval = gated_eval(&gate, 0..3, 3..5);
    let mst = Mst::exposing(&[dir.path()]);
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let browser = Browser::start();
    browser.goto(&serve.page("/runs"));
    browser.wait_for("#start-run");
    assert_eq!(browser.texts("#runs-table tbody tr").len(), 0);

    // Started from the page: the trial holds at the gate, so the run is seen running, with the
    // events it streamed so far.
    browser.click("#start-run");
    browser.wait_for("#live");
    until(&browser, "the running trial's events", |b| {
        b.texts("#live-running li")
            .iter()
            .any(|l| l.contains("3 events") && l.contains("step 2"))
    });
    assert!(browser.text("#live-h").ends_with("(running)"));
    browser.screenshot("live-run");
    // Its process is the server: `mst runs stop` will not signal it.
    let live_id = browser
        .eval("return location.hash.split('/')[2]")
        .as_str()
        .unwrap()
        .to_string();
    let results = eval.results();
    let refused = mst.run(&["runs", "stop", &live_id, "--results-dir", s(&results)]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("collected by `mst serve`"),
        "{}",
        refused.stderr
    );
    std::fs::write(&gate, "").unwrap();

    // Once graded, the page becomes the run's report, drawn from the API.
    browser.wait_for_within("#variants", Duration::from_secs(90));
    let run_id = browser
        .eval("return location.hash.split('/')[2]")
        .as_str()
        .unwrap()
        .to_string();
    let summary = stored_summary(&eval.results(), "play", &run_id);
    assert_page_matches_summary(&browser, &summary);
    browser.click("#trials-table tbody tr a.open-trial");
    browser.wait_for("#trace [data-event-kind='message']");
    assert_eq!(count(&browser, "#trace [data-event-kind='message']"), 5);

    // The runs page lists it, and opens it.
    browser.goto(&serve.page("/runs"));
    browser.wait_for(&format!("#runs-table tr[data-run='{run_id}'] a"));
    // Its process recorded how it ended, as every run's does.
    assert_eq!(
        browser.text(&format!("#runs-table tr[data-run='{run_id}'] td.state")),
        "ended"
    );
    browser.click(&format!("#runs-table tr[data-run='{run_id}'] a"));
    browser.wait_for("body[data-ready='1'] #variants");
    assert_page_matches_summary(&browser, &summary);
    browser.screenshot("run-report");
    assert_eq!(browser.console_errors(), Vec::<String>::new());
    serve.stop();
}

#[test]
fn the_playground_runs_in_the_page_live_one_task_at_a_time_with_abort_and_close() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let eval = agent_eval(&gated_agent(&gate, 0..4, 4..6), json!({}));
    let mst = Mst::exposing(&[dir.path()]);
    let serve = Serve::start(&mst, &eval.config(), &eval.results(), &[]);
    let browser = Browser::start();
    browser.goto(&serve.page("/playground"));
    browser.wait_for("#boot");
    assert_eq!(browser.text("#boot-runner"), "local");
    browser.click("#boot-variant option[value='agent']");
    browser.click("#boot");
    browser.wait_for("#task-input");
    until(&browser, "the session's state", |b| {
        b.attr("#session-state", "data-status").as_deref() == Some("ready")
    });

    // A task: its events appear while it runs (it holds at the gate).
    browser.fill("#task-input", "hello");
    browser.click("#submit-task");
    until(&browser, "four live events", |b| {
        count(b, "#tasks .card ol.events li") == 4
    });
    assert_eq!(
        browser
            .attr("#tasks .card [data-status]", "data-status")
            .as_deref(),
        Some("running")
    );
    // A second task while the first runs: the 409, said plainly.
    browser.fill("#task-input", "again");
    browser.click("#submit-task");
    browser.wait_for("#task-message .notice");
    let refused = browser.text("#task-message .notice");
    assert!(
        refused.starts_with("Not started:") && refused.contains("one task at a time"),
        "{refused}"
    );
    browser.screenshot("playground");

    std::fs::write(&gate, "").unwrap();
    until(&browser, "the task to complete", |b| {
        b.attr("#tasks .card [data-status]", "data-status")
            .as_deref()
            == Some("completed")
    });
    assert_eq!(
        browser.text("#tasks .card .final-text"),
        "again".replace("again", "hello")
    );
    assert_eq!(count(&browser, "#tasks .card ol.events li"), 6);

    // Abort: a held task stops, and the session stays open.
    std::fs::remove_file(&gate).unwrap();
    browser.fill("#task-input", "held");
    browser.click("#submit-task");
    until(&browser, "a second card", |b| count(b, "#tasks .card") == 2);
    browser.wait_for("#tasks .card .abort");
    browser.click("#tasks .card .abort");
    until(&browser, "the task to be aborted", |b| {
        b.attr("#tasks .card [data-status]", "data-status")
            .as_deref()
            == Some("aborted")
    });
    let session = browser
        .eval("return location.hash.split('/')[2]")
        .as_str()
        .unwrap()
        .to_string();
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(view["status"], "ready", "{view}");
    assert_eq!(view["tasks"][1]["reason"], "aborted: aborted by request");

    browser.click("#close-session");
    until(&browser, "the session to close", |b| {
        b.attr("#session-state", "data-status").as_deref() == Some("closed")
    });
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(view["status"], "closed");
    // Chromium logs the refused submit's 409 itself; nothing else went wrong on the page.
    let errors: Vec<String> = browser
        .console_errors()
        .into_iter()
        .filter(|e| !e.contains("status of 409"))
        .collect();
    assert_eq!(errors, Vec::<String>::new());
    serve.stop();
}

#[test]
fn mst_run_serve_shows_the_run_live_then_its_report_until_ctrl_c() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let eval = gated_eval(&gate, 0..2, 2..3);
    let mst = Mst::exposing(&[dir.path()]);
    let mut child = mst
        .command(&eval.args(&["--serve", "127.0.0.1:0"]))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut url = String::new();
    while url.is_empty() {
        let mut line = String::new();
        assert_ne!(stderr.read_line(&mut line).unwrap(), 0, "mst run ended");
        if let Some(rest) = line.trim().strip_prefix("mst run: follow the run at ") {
            url = rest.to_string();
        }
    }
    // Whatever else it says goes on being read, so its pipe never fills.
    let rest = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        text
    });
    let browser = Browser::start();
    browser.goto(&url);
    until(&browser, "the running trial", |b| {
        b.texts("#live-running li")
            .iter()
            .any(|l| l.contains("step 1"))
    });
    assert_eq!(browser.text("#live [data-count='total']"), "1");
    std::fs::write(&gate, "").unwrap();
    browser.wait_for_within("#variants", Duration::from_secs(60));
    let route = url.split('&').next().unwrap();
    let run_id = route.rsplit('/').next().unwrap();
    assert_page_matches_summary(&browser, &stored_summary(&eval.results(), "play", run_id));

    // It keeps serving the report until Ctrl-C, then exits as the run did (its case passed).
    assert!(child.try_wait().unwrap().is_none());
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let status = child.wait().unwrap();
    let said = rest.join().unwrap();
    assert_eq!(status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("the report stays at {url}")),
        "{said}"
    );
}

#[test]
fn the_report_shows_pairwise_verdicts_with_each_orders_reason() {
    let server = mst_tests::model_server::ModelServer::start_with(
        mst_tests::model_server::judge_preferring("UTC+9"),
    );
    let cases: Vec<Value> = ["c1", "c2"]
        .iter()
        .map(|id| json!({"id": id, "input": format!("What is Tokyo's UTC offset? ({id})")}))
        .collect();
    let (eval, secrets) = mst_tests::pairwise_eval(
        &server.url(),
        "alpha: Tokyo is UTC+9",
        "beta: Tokyo is UTC+8",
        &cases,
    );
    let mst = Mst::new();
    let run = eval.run(&mst, &["-q", "--json", "--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let summary = run.json();
    let dir = eval.run_dir("paired");
    let browser = Browser::start();
    browser.goto(&format!("file://{}", s(&dir.join("report.html"))));
    browser.wait_for("body[data-ready='1'] #pairs");
    let pair = &summary["pairs"][0];
    let row = "#pairs tr[data-pair='alpha-vs-beta']";
    for (field, key) in [
        ("wins", "wins"),
        ("ties", "ties"),
        ("losses", "losses"),
        ("notGraded", "not-graded"),
        ("notCompared", "not-compared"),
    ] {
        assert_eq!(
            browser.text(&format!("{row} td[data-count='{key}']")),
            pair[field].to_string(),
            "{field}"
        );
    }
    assert_eq!(pair["wins"], 2);
    browser.click("#pairs details summary");
    let verdicts = browser.texts("#pairs details tbody tr");
    assert_eq!(verdicts.len(), 2, "{verdicts:?}");
    assert!(
        verdicts.iter().all(|v| v.contains("a-wins")
            && v.contains("alpha then beta: first")
            && v.contains("it says UTC+9")),
        "{verdicts:?}"
    );
    assert_page_matches_summary(&browser, &summary);
    assert_eq!(browser.console_errors(), Vec::<String>::new());
}

/// An agent CLI that resumes: `--resume ID` continues thread `ID` (under a new id, as agent
/// CLIs do), without it a new thread starts; it prints `session: ID` and answers with the
/// thread so far, one message a line.
const RESUMING_AGENT: &str = r#"input=$(cat)
token="t$(od -An -N6 -tx1 /dev/urandom | tr -d ' \n')"
mkdir -p threads
if [ "$1" = "--resume" ]; then cp "threads/$2" "threads/$token"; fi
printf '%s\n' "$input" >> "threads/$token"
echo "session: $token"
cat "threads/$token""#;

#[test]
fn a_conversation_reads_as_a_chat_in_the_page_and_fresh_starts_a_new_thread() {
    let eval = Eval::new(
        json!({"name": "play", "datasets": ["cases.jsonl"], "client": "command",
               // `agent` is the script's $0: the resume arguments follow it.
               "clientOptions": {"command": ["sh", "-c", RESUMING_AGENT, "agent"],
                                 "resume": {"capture": "^session: (\\S+)$", "arg": ["--resume", "{token}"]}},
               "variants": {"chat": {}, "plain": {"clientOptions": {"command": ["cat"]}}},
               "baseline": "chat", "timeout": 60}),
        &[json!({"id": "unused", "input": "x"})],
    );
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let browser = Browser::start();
    browser.goto(&serve.page("/playground"));
    browser.wait_for("#boot-conversation");

    // A client that cannot resume is refused before any machine, and the page says why.
    browser.click("#boot-variant option[value='plain']");
    browser.click("#boot-conversation");
    browser.click("#boot");
    until(&browser, "the refusal", |b| {
        b.text("#boot-status")
            .contains("cannot hold a conversation")
    });
    let (_, list) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(list["sessions"], json!([]));
    // Chromium logs the refused request itself (and reading the log empties it).
    let logged = browser.console_errors();
    assert!(
        logged.len() == 1 && logged[0].contains("status of 400"),
        "{logged:?}"
    );

    browser.click("#boot-variant option[value='chat']");
    browser.click("#boot");
    browser.wait_for("#task-fresh");
    // The heading follows the session's view, which may come a moment after the controls.
    until(&browser, "the conversation's heading", |b| {
        b.text("h1").starts_with("Conversation ")
    });
    let reply = |b: &Browser, n: usize| {
        b.texts("#tasks .turn .bubble.reply.final-text")
            .get(n)
            .cloned()
            .unwrap_or_default()
    };
    let mut said = Vec::new();
    for (n, message) in ["alpha", "beta"].iter().enumerate() {
        browser.fill("#task-input", message);
        browser.click("#submit-task");
        said.push(*message);
        // The answer is the agent's stdout: its session line (the token hidden), then the
        // thread. Newest first: this turn's reply is the first card's.
        let expected = format!("session: [redacted:resume token]\n{}", said.join("\n"));
        until(&browser, "the reply", |b| {
            count(b, "#tasks .turn .final-text") == n + 1 && reply(b, 0) == expected
        });
    }
    // The message and the reply are bubbles; the events are folded beneath.
    assert_eq!(browser.texts("#tasks .turn .bubble.user")[0], "beta");
    assert_eq!(
        browser.attr("#tasks .turn details.turn-events", "open"),
        None
    );
    // A new thread: the reply holds only the new message.
    browser.fill("#task-input", "gamma");
    browser.click("#task-fresh");
    browser.click("#submit-task");
    until(&browser, "the fresh reply", |b| {
        count(b, "#tasks .turn .final-text") == 3
            && reply(b, 0) == "session: [redacted:resume token]\ngamma"
    });
    assert!(browser.text("#tasks .turn h3").contains("(a new thread)"));
    // Kept as a case: the thread since `fresh`, one turn.
    browser.click("#export");
    until(&browser, "the export", |b| {
        b.texts("#task-message .notice")
            .first()
            .is_some_and(|t| t.starts_with("Kept as case "))
    });
    let kept = std::fs::read_to_string(eval.dir.path().join("playground.jsonl")).unwrap();
    let case: Value = serde_json::from_str(kept.trim()).unwrap();
    assert_eq!(case["input"], json!({"turns": ["gamma"]}));
    browser.screenshot("conversation");
    assert_eq!(browser.console_errors(), Vec::<String>::new());
    serve.stop();
}
