//! The numbers a run reports about itself: Wilson intervals, the paired comparison of two
//! variants over the same cases (McNemar's exact test), `mst runs diff` saying whether a change
//! is beyond noise, `mst power`, and the charts mst draws as inline SVG in the report and the
//! web UI (checked in a real Chromium, photographed under `target/test-output/`).

use mst_tests::browser::Browser;
use mst_tests::serve::Serve;
use mst_tests::{s, Eval, Mst};
use serde_json::{json, Value};

/// The pass rate's 95% Wilson interval, written out here apart from mst's own.
fn wilson(k: f64, n: f64) -> (f64, f64) {
    let z: f64 = 1.96;
    let p = k / n;
    let centre = (p + z * z / (2.0 * n)) / (1.0 + z * z / n);
    let half = z / (1.0 + z * z / n) * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt();
    (centre - half, centre + half)
}

/// An agent answering the `better:` or `base:` word of its input (`yes` passes).
fn answering(which: &str) -> Value {
    json!({"command": ["sh", "-c", format!("sed -n 's/.*{which}:\\([a-z]*\\).*/\\1/p'")]})
}

/// The eval of the bar: 60 cases, `better` passing 45 and `base` 30, the 15 they disagree on
/// all won by `better`.
fn paired_eval() -> Eval {
    let mut cases = Vec::new();
    for (count, base, better) in [(30, "yes", "yes"), (15, "no", "yes"), (15, "no", "no")] {
        for _ in 0..count {
            let id = format!("c{:02}", cases.len());
            cases.push(json!({"id": id, "input": format!("base:{base} better:{better}")}));
        }
    }
    Eval::new(
        json!({"name": "paired", "datasets": ["cases.jsonl"], "client": "command",
               "baseline": "base",
               "variants": {"base": {"clientOptions": answering("base")},
                            "better": {"clientOptions": answering("better")}},
               "judges": [{"assert": "contains", "value": "yes"}], "concurrency": 8}),
        &cases,
    )
}

#[test]
fn sixty_paired_cases_give_wilson_intervals_a_mcnemar_p_and_charts() {
    let eval = paired_eval();
    let mst = Mst::new();
    let run = eval.run(&mst, &["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    let summary = run.json();
    let first = summary["runId"].as_str().unwrap().to_string();

    // Wilson intervals within 0.01 of the formula.
    for (variant, passed) in [("base", 30.0), ("better", 45.0)] {
        let v = &summary["variants"][variant];
        assert_eq!(v["passed"], passed as u64, "{v}");
        let (lo, hi) = wilson(passed, 60.0);
        let ci = &v["passRateCi"];
        assert!(
            (ci[0].as_f64().unwrap() - lo).abs() < 0.01
                && (ci[1].as_f64().unwrap() - hi).abs() < 0.01,
            "{variant}: {ci} against [{lo}, {hi}]"
        );
    }
    // The paired comparison: +25 points, an interval above 0, McNemar's exact p of 15 to 0.
    let better = &summary["comparisons"]["better"];
    assert_eq!(better["baseline"], "base");
    assert_eq!(
        (&better["won"], &better["lost"], &better["cases"]),
        (&json!(15), &json!(0), &json!(60))
    );
    assert!(
        (better["delta"].as_f64().unwrap() - 0.25).abs() < 1e-12,
        "{better}"
    );
    assert!(better["deltaCi"][0].as_f64().unwrap() > 0.0, "{better}");
    let p = better["pValue"].as_f64().unwrap();
    let exact = 2.0 * 0.5f64.powi(15);
    assert!((p - exact).abs() / exact < 1e-9, "{p} against {exact}");
    assert_eq!(better["test"], "mcnemar-exact");
    assert_eq!(better["significant"], true);
    assert!(summary["comparisons"].get("base").is_none(), "{summary}");

    let table = mst.run(&["runs", "show", &first, "--results-dir", s(&eval.results())]);
    let row = table
        .stdout
        .lines()
        .find(|l| l.starts_with("better "))
        .unwrap();
    assert!(
        row.contains("+25.0 pp [") && row.ends_with("p < 0.001"),
        "{}",
        table.stdout
    );

    assert_the_report_carries_static_charts(&eval, &first);
    assert_runs_list_carries_pass_rates(&mst, &eval, &first);
    let after = run_with_base_answering_better(&mst, &eval);
    assert_runs_diff_says_the_change_is_beyond_noise(&mst, &eval, &first, &after);
    assert_the_web_ui_draws_the_trend_and_the_run_charts(&mst, &eval, &after);
}

/// The report file holds the charts as SVG markup outside any script, and the page shows them
/// under the variants table.
fn assert_the_report_carries_static_charts(eval: &Eval, run_id: &str) {
    let report = eval
        .results()
        .join("paired/runs")
        .join(run_id)
        .join("report.html");
    let html = std::fs::read_to_string(&report).unwrap();
    let at = html
        .find("<section id=\"mst-charts\"")
        .expect("a charts section");
    let before = &html[..at];
    assert_eq!(
        before.matches("<script").count(),
        before.matches("</script>").count(),
        "the charts are markup, not inside a script"
    );
    for chart in ["pass-rates", "wins-losses", "scores", "durations"] {
        assert!(
            html.contains(&format!("data-chart=\"{chart}\"><svg")),
            "{chart}"
        );
    }
    let browser = Browser::start();
    browser.goto(&format!("file://{}", s(&report)));
    browser.wait_for(
        "body[data-ready='1'] #variants + #mst-charts figure[data-chart='pass-rates'] svg",
    );
    let tips = titles(
        &browser,
        "#mst-charts figure[data-chart='wins-losses'] rect title",
    );
    assert!(
        tips.iter()
            .any(|t| t.contains("better against base: 15 won, 0 lost")),
        "{tips:?}"
    );
    // The page's figures are the summary's.
    let summary: Value = mst_tests::read_json(&report.with_file_name("summary.json"));
    for variant in ["base", "better"] {
        let ci = &summary["variants"][variant]["passRateCi"];
        let pp = |i: usize| ci[i].as_f64().unwrap() * 100.0;
        assert_eq!(
            browser.text(&format!(
                "#variants tr[data-variant='{variant}'] td[data-count='pass-rate-ci']"
            )),
            format!("[{:.1}, {:.1}]", pp(0), pp(1))
        );
    }
    let better = &summary["comparisons"]["better"];
    let pp = |x: &Value| x.as_f64().unwrap() * 100.0;
    assert_eq!(
        browser.text("#variants tr[data-variant='better'] td[data-count='compared']"),
        format!(
            "+25.0 pp [{:.1}, {:.1}], p < 0.001",
            pp(&better["deltaCi"][0]),
            pp(&better["deltaCi"][1])
        )
    );
    browser.screenshot("report-charts");
    assert_eq!(browser.console_errors(), Vec::<String>::new());
}

/// The text of the SVG `<title>`s (tooltips) `css` finds, which are never rendered as text.
fn titles(browser: &Browser, css: &str) -> Vec<String> {
    let script = format!(
        "return Array.from(document.querySelectorAll({})).map(function (e) {{ return e.textContent; }})",
        serde_json::to_string(css).unwrap()
    );
    serde_json::from_value(browser.eval(&script)).unwrap()
}

fn assert_runs_list_carries_pass_rates(mst: &Mst, eval: &Eval, run_id: &str) {
    let listed = mst.run(&[
        "runs",
        "list",
        "--json",
        "--results-dir",
        s(&eval.results()),
    ]);
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let runs = listed.json();
    let run = runs
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["runId"] == run_id)
        .unwrap();
    assert_eq!(
        run["passRates"],
        json!({"base": 0.5, "better": 0.75}),
        "{run}"
    );
    let text = mst.run(&["runs", "list", "--results-dir", s(&eval.results())]);
    assert!(
        text.stdout.contains("base 50.0%, better 75.0%"),
        "{}",
        text.stdout
    );
}

/// A second run in which `base` answers as `better` does: its id.
fn run_with_base_answering_better(mst: &Mst, eval: &Eval) -> String {
    let mut config: Value = serde_json::from_slice(&std::fs::read(eval.config()).unwrap()).unwrap();
    config["variants"]["base"]["clientOptions"] = answering("better");
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let run = eval.run(mst, &["--json"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    run.json()["runId"].as_str().unwrap().to_string()
}

fn assert_runs_diff_says_the_change_is_beyond_noise(
    mst: &Mst,
    eval: &Eval,
    before: &str,
    after: &str,
) {
    let results = eval.results();
    let diff = mst.run(&[
        "runs",
        "diff",
        before,
        after,
        "--results-dir",
        s(&results),
        "--json",
    ]);
    let diff = diff.json();
    let base = (diff["variants"].as_array().unwrap().iter())
        .find(|v| v["variant"] == "base")
        .unwrap();
    assert_eq!(
        (&base["comparison"]["won"], &base["comparison"]["lost"]),
        (&json!(15), &json!(0))
    );
    assert_eq!(base["comparison"]["significant"], true, "{base}");
    let better = (diff["variants"].as_array().unwrap().iter())
        .find(|v| v["variant"] == "better")
        .unwrap();
    assert_eq!(better["comparison"]["significant"], false, "{better}");
    let text = mst.run(&["runs", "diff", before, after, "--results-dir", s(&results)]);
    assert!(
        text.stdout
            .contains("base: 50.0% -> 75.0% (+25.0 points); over 60 cases in both: +25.0 pp"),
        "{}",
        text.stdout
    );
    assert!(
        text.stdout.contains("beyond noise") && text.stdout.contains("within noise"),
        "{}",
        text.stdout
    );
}

/// The runs page draws the eval's pass rate over its two runs; the run page its charts.
fn assert_the_web_ui_draws_the_trend_and_the_run_charts(mst: &Mst, eval: &Eval, run_id: &str) {
    let serve = Serve::start(mst, &eval.config(), &eval.results(), &[]);
    let (status, listed) = serve.call("GET", "/api/v1/runs", None);
    assert_eq!(status, 200);
    let trend = &listed["trends"][0];
    assert_eq!(trend["eval"], "paired");
    assert_eq!(
        trend["svg"].as_str().unwrap().matches("<circle").count(),
        4,
        "two runs, two variants"
    );
    let browser = Browser::start();
    browser.goto(&serve.page("/runs"));
    browser.wait_for("#trends figure[data-chart='trend-paired'] svg polyline");
    let points = titles(&browser, "#trends circle title");
    assert!(
        points
            .iter()
            .any(|t| t.contains("base in run") && t.ends_with("75.0%")),
        "{points:?}"
    );
    browser.screenshot("runs-trend");
    browser.goto(&serve.page(&format!("/runs/{run_id}")));
    browser.wait_for("body[data-ready='1'] #mst-charts figure[data-chart='pass-rates'] svg");
    browser.screenshot("run-charts");
    // Opened by its address, the run page first asks whether the run is live here: a stored
    // run's 404 is that answer, not an error of the page.
    let errors: Vec<String> = (browser.console_errors().into_iter())
        .filter(|e| !(e.contains("/live?since=0") && e.contains("404")))
        .collect();
    assert_eq!(errors, Vec::<String>::new());
    serve.stop();
}

#[test]
fn mst_power_says_how_many_paired_cases_a_difference_needs() {
    let mst = Mst::new();
    let answer = mst.run(&[
        "power",
        "--baseline-rate",
        "0.5",
        "--difference",
        "0.1",
        "--json",
    ]);
    assert_eq!(answer.code, 0, "{}", answer.stderr);
    // Connor's formula, as scipy computes it: 391 (docs/results.md).
    assert_eq!(answer.json()["cases"], 391);
    let text = mst.run(&[
        "power",
        "--baseline-rate",
        "0.5",
        "--difference",
        "-0.1",
        "--discordant",
        "0.2",
    ]);
    assert!(
        text.stdout.starts_with("155 paired cases"),
        "{}",
        text.stdout
    );
    let refused = mst.run(&["power", "--baseline-rate", "0.95", "--difference", "0.1"]);
    assert_eq!(refused.code, 2);
    assert!(
        refused.stderr.contains("between 0 and 1"),
        "{}",
        refused.stderr
    );
}
