//! `cargo xtask bench report`: what `mst report` costs on real runs of 1,000 and 10,000 trials,
//! and how fast its page opens in a real headless Chromium (`mst_tests::browser`; Debian's
//! `chromium` and `chromium-driver`). Prints, for each size:
//!
//! - how long making the run took (`mst run` on the local runner, which also writes the run's
//!   report beside it);
//! - `mst report RUN --out FILE`: wall clock, median of 5, and the file's size;
//! - at 10,000 trials, the page's load time: `performance.now()` when the report marks itself
//!   rendered (`document.body.dataset.ready = "1"`), median of 5 fresh loads of `file://FILE`,
//!   and the console errors it logged. A screenshot of it goes to
//!   `target/test-output/bench-report/`.
//!
//! The runs are real: the `command` client runs a small shell "agent" that makes a tool call
//! (a trace event) and answers, graded by the built-in `contains` and `tools-called`
//! assertions, in two variants of which one fails every tenth case. It uses the debug build
//! `cargo xtask test` uses (dependencies optimised, mst's own code not); `MST_BENCH_MST=PATH`
//! measures another build.

use crate::{cargo, median, root, run, tempfile_dir};
use anyhow::{bail, Context, Result};
use mst_tests::browser::Browser;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Trials of each case.
const TRIALS: usize = 10;

/// The agent: a tool call, then the answer; the `terse` variant answers nothing useful to
/// questions whose number ends in 7.
const AGENT: &str = r#"read q; echo '{"type":"tool-call","id":"1","tool":"lookup","arguments":{"q":"'"$q"'"}}'; echo '{"type":"tool-result","id":"1","output":"found"}'; case "$MODE$q" in terse*7) echo 'no idea';; *) echo "the answer to $q";; esac"#;

/// Writes an eval of `cases` cases × [`TRIALS`] trials × 2 variants into `dir`.
fn write_eval(dir: &Path, cases: usize) -> Result<()> {
    let lines: String = (0..cases)
        .map(|i| format!("{{\"id\":\"case-{i:05}\",\"input\":\"question {i}\"}}\n"))
        .collect();
    std::fs::write(dir.join("cases.jsonl"), lines)?;
    let variant = |mode: &str| {
        serde_json::json!({"clientOptions": {"command": ["sh", "-c", AGENT], "events": true,
                                             "env": {"MODE": mode}}})
    };
    let config = serde_json::json!({
        "name": "bench-report", "datasets": ["cases.jsonl"], "client": "command",
        "variants": {"full": variant("full"), "terse": variant("terse")},
        "judges": [{"assert": "contains", "value": "the answer"},
                   {"assert": "tools-called", "value": {"tools": [{"name": "lookup"}]}}],
        "trials": TRIALS, "concurrency": 8, "timeout": 30
    });
    std::fs::write(dir.join("eval.json"), serde_json::to_vec_pretty(&config)?)?;
    Ok(())
}

/// `mst ARGS` with the bench's home, from `dir`.
fn mst(mst: &Path, dir: &Path, args: &[&str]) -> Command {
    let mut command = Command::new(mst);
    command
        .current_dir(dir)
        .env("MST_HOME", dir.join("home"))
        .env_remove("MST_LOG")
        .args(args);
    command
}

/// Makes the run; its id and how long it took.
fn make_run(bin: &Path, dir: &Path) -> Result<(String, Duration)> {
    let started = Instant::now();
    let out = mst(
        bin,
        dir,
        &["run", "--config", "eval.json", "--quiet", "--json"],
    )
    .output()?;
    let took = started.elapsed();
    // Exit 1 is the verdict (the terse variant fails some cases), not a failure to run.
    if !matches!(out.status.code(), Some(0 | 1)) {
        bail!(
            "the bench run failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("mst run --json: {}", String::from_utf8_lossy(&out.stdout)))?;
    let id = summary["runId"]
        .as_str()
        .with_context(|| format!("no runId in {summary}"))?
        .to_string();
    Ok((id, took))
}

/// `mst report RUN --out FILE` timed; (seconds, bytes, trials).
fn report(bin: &Path, dir: &Path, run_id: &str, out: &Path) -> Result<(f64, u64, u64)> {
    let started = Instant::now();
    let output = mst(bin, dir, &["report", run_id, "--json", "--out"])
        .arg(out)
        .output()?;
    let took = started.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "mst report failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let written: serde_json::Value = serde_json::from_slice(&output.stdout)?;
    let field = |name: &str| {
        written[name]
            .as_u64()
            .with_context(|| format!("no {name} in {written}"))
    };
    Ok((took, field("bytes")?, field("trials")?))
}

/// Runs `command` to success; milliseconds it took.
fn timed(mut command: Command) -> Result<f64> {
    let started = Instant::now();
    let output = command.output()?;
    let took = started.elapsed().as_secs_f64() * 1e3;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(took)
}

/// Records when the report marks itself rendered, as soon as it does: a mutation observer
/// installed before the page's own scripts run.
const READY_PROBE: &str = "new MutationObserver(function (_, observer) {
  if (document.body && document.body.dataset.ready === '1') {
    window.__mstReadyAt = performance.now();
    observer.disconnect();
  }
}).observe(document, {subtree: true, attributes: true, attributeFilter: ['data-ready']});";

/// Opens `page` in a fresh tab state and waits for the report to be rendered; milliseconds
/// from navigation start.
fn load(browser: &Browser, page: &Path) -> Result<f64> {
    browser.goto("about:blank");
    browser.goto(&format!("file://{}", page.display()));
    let started = Instant::now();
    loop {
        if let Some(at) = browser.eval("return window.__mstReadyAt || null").as_f64() {
            return Ok(at);
        }
        if started.elapsed() > Duration::from_secs(60) {
            bail!(
                "the report was not rendered in 60 s; the page says:\n{}",
                browser.page_text(1000)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs the benchmark and prints its figures.
pub fn bench() -> Result<()> {
    let bin = match std::env::var_os("MST_BENCH_MST") {
        Some(path) => PathBuf::from(path),
        None => {
            run(cargo().current_dir(root()).args(["build", "-p", "mst"]))?;
            root().join("target/debug/mst")
        }
    };
    let dir = tempfile_dir("mst-bench-report")?;
    let shots = mst_tests::output_dir("bench-report");
    for cases in [50, 500] {
        let trials = cases * TRIALS * 2;
        let eval = dir.join(format!("{trials}"));
        std::fs::create_dir_all(&eval)?;
        write_eval(&eval, cases)?;
        let (run_id, took) = make_run(&bin, &eval)?;
        println!(
            "{trials:>6} trials: made in {:.1} s by `mst run` (local runner, one shard, concurrency 8, report included)",
            took.as_secs_f64()
        );
        let page = eval.join("report.html");
        let mut times = Vec::new();
        let (mut bytes, mut counted) = (0, 0);
        for _ in 0..5 {
            let (took, b, t) = report(&bin, &eval, &run_id, &page)?;
            times.push(took * 1e3);
            (bytes, counted) = (b, t);
        }
        if counted != trials as u64 {
            bail!("the report counts {counted} trials, not {trials}");
        }
        println!(
            "{trials:>6} trials: `mst report` {:.0} ms (median of 5; {:.0}–{:.0}), file {:.1} KiB ({:.0} bytes/trial)",
            median(times.clone()),
            times.iter().copied().fold(f64::INFINITY, f64::min),
            times.iter().copied().fold(0.0, f64::max),
            bytes as f64 / 1024.0,
            bytes as f64 / trials as f64
        );
        // The comparison of the run with itself: every case compared, none changed.
        let mut diffs = Vec::new();
        for _ in 0..3 {
            diffs.push(timed(mst(
                &bin,
                &eval,
                &["runs", "diff", &run_id, &run_id, "--json"],
            ))?);
        }
        let baseline = timed({
            let mut command = mst(&bin, &eval, &["report", &run_id, "--baseline", &run_id]);
            command.arg("--out").arg(eval.join("compared.html"));
            command
        })?;
        println!(
            "{trials:>6} trials: `mst runs diff` {:.0} ms (median of 3), `mst report --baseline` {:.0} ms",
            median(diffs),
            baseline
        );
        if trials < 10_000 {
            continue;
        }
        let browser = Browser::start_with_output(shots.clone());
        browser.on_new_document(READY_PROBE);
        let mut loads = Vec::new();
        for _ in 0..5 {
            loads.push(load(&browser, &page)?);
        }
        let errors = browser.console_errors();
        let shot = browser.screenshot(&format!("report-{trials}"));
        println!(
            "{trials:>6} trials: rendered {:.0} ms after navigation start in headless Chromium \
             (median of 5 loads of file://; {:.0}–{:.0}); {} console errors{}; screenshot {}",
            median(loads.clone()),
            loads.iter().copied().fold(f64::INFINITY, f64::min),
            loads.iter().copied().fold(0.0, f64::max),
            errors.len(),
            errors
                .first()
                .map(|e| format!(" (first: {e})"))
                .unwrap_or_default(),
            shot.display()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
