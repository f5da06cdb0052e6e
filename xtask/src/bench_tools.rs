//! `cargo xtask bench tools`: what the tool proxy costs a call. An agent written with the Python
//! MCP SDK makes 1,000 calls of `@modelcontextprotocol/server-everything`'s `echo`: straight to
//! the server over stdio (`direct`, as it would without mst), straight to the server run as a
//! streamable-HTTP server (`http`: the transport the proxy speaks, without the proxy), and
//! through the worker's tool proxy (`proxied`: streamable HTTP on loopback, the proxy
//! forwarding over stdio and recording each call as two trace events). Prints calls per second
//! and the per-call median and 95th percentile the agent measured, for each, and the proxied
//! median less the direct one. Unsandboxed
//! (`isolation=none`): the sandbox adds nothing to a loopback hop, and the agent starts the
//! direct server itself.
//!
//! It uses the debug build `cargo xtask test` uses (dependencies optimised, mst's own code not).

use crate::{root, tempfile_dir};
use anyhow::{bail, Context, Result};
use std::process::Command;

/// Calls per variant.
const CALLS: u32 = 1_000;

/// Runs the benchmark and prints its figures.
pub fn bench() -> Result<()> {
    let mst = crate::build_for_tests()?;
    let dir = tempfile_dir("mst-bench-tools")?;
    let agent = root().join("tests/bench/tools_agent.py");
    let agent = agent.to_str().context("a UTF-8 path")?;
    let eval = serde_json::json!({
        "name": "bench-tools",
        "datasets": ["cases.jsonl"],
        "servers": {"everything": {"command": "mcp-server-everything", "args": ["stdio"]}},
        "client": "command",
        "variants": {
            "direct": {"servers": [], "clientOptions": {"command": ["python3", agent, "direct", CALLS.to_string()]}},
            "http": {"servers": [], "clientOptions": {"command": ["python3", agent, "http", CALLS.to_string()]}},
            "proxied": {"clientOptions": {"command": ["python3", agent, "proxied", CALLS.to_string()]}}
        },
        "concurrency": 1,
        "timeout": 600
    });
    std::fs::write(dir.join("eval.json"), eval.to_string())?;
    std::fs::write(
        dir.join("cases.jsonl"),
        "{\"id\": \"echo\", \"input\": \"\"}\n",
    )?;
    let out = Command::new(&mst)
        .env("MST_HOME", dir.join("home"))
        .args(["run", "-q", "--config"])
        .arg(dir.join("eval.json"))
        .arg("--results-dir")
        .arg(dir.join("results"))
        .args(["--runner-option", "isolation=none"])
        .output()?;
    if !out.status.success() {
        bail!(
            "the benchmark's run failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let runs = dir.join("results/bench-tools/runs");
    let run = std::fs::read_dir(&runs)?.next().context("no run")??.path();
    let traces = std::fs::read_to_string(run.join("traces.jsonl"))?;
    let mut figures = std::collections::BTreeMap::new();
    for line in traces.lines() {
        let record: serde_json::Value = serde_json::from_str(line)?;
        let answer = record["trace"]["finalText"].as_str().unwrap_or_default();
        let figure: serde_json::Value = serde_json::from_str(answer)
            .with_context(|| format!("variant {}: {answer}", record["variant"]))?;
        figures.insert(
            record["variant"].as_str().unwrap_or("?").to_string(),
            figure,
        );
    }
    println!("tool proxy: {CALLS} calls of server-everything's echo by a Python MCP SDK agent");
    println!(
        "{:<10} {:>10} {:>9} {:>9}",
        "path", "calls/s", "p50 ms", "p95 ms"
    );
    for (variant, f) in &figures {
        let rate = f["calls"].as_f64().unwrap_or(0.0) / f["seconds"].as_f64().unwrap_or(1.0);
        println!(
            "{variant:<10} {rate:>10.0} {:>9.2} {:>9.2}",
            f["p50Ms"].as_f64().unwrap_or(0.0),
            f["p95Ms"].as_f64().unwrap_or(0.0)
        );
    }
    let p50 = |v: &str| {
        figures
            .get(v)
            .and_then(|f| f["p50Ms"].as_f64())
            .unwrap_or(0.0)
    };
    println!(
        "the proxy's cost per call (median): {:.2} ms",
        p50("proxied") - p50("direct")
    );
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
