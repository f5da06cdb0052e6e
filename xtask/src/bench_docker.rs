//! `cargo xtask bench docker`: what the Docker runner costs, against the real engines the
//! tests use. Prints:
//!
//! - shard start: from asking for a container to the worker's `hello` (`readyMs` in run.json),
//!   median over 10 shards started one at a time, next to a bare `docker run --rm IMAGE true`;
//! - a 1,000-trial eval on 4 shards over 2 hosts against the same eval on the local runner.
//!
//! It uses the debug build `cargo xtask test` uses (dependencies optimised, mst's own code not).

use crate::{engines, median, root, run, tempfile_dir};
use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Writes an eval of `n` cases whose client is `cat` into `dir`.
fn write_eval(dir: &Path, n: usize, concurrency: u32) -> Result<()> {
    let cases: String = (0..n)
        .map(|i| format!("{{\"id\":\"c{i}\",\"input\":\"answer {i}\"}}\n"))
        .collect();
    std::fs::write(dir.join("cases.jsonl"), cases)?;
    std::fs::write(
        dir.join("eval.json"),
        format!(
            r#"{{"name":"bench","datasets":["cases.jsonl"],"client":"command","clientOptions":{{"command":["cat"]}},
                "judges":[{{"assert":"exit-code","value":0}}],"concurrency":{concurrency},"timeout":60}}"#
        ),
    )?;
    Ok(())
}

/// Runs `mst run` on the eval in `dir`; wall seconds and the run's run.json.
fn timed_run(mst: &Path, dir: &Path, args: &[String]) -> Result<(f64, serde_json::Value)> {
    let results = dir.join("results");
    let _ = std::fs::remove_dir_all(&results);
    let started = Instant::now();
    let output = Command::new(mst)
        .args(["run", "--quiet", "--config"])
        .arg(dir.join("eval.json"))
        .arg("--results-dir")
        .arg(&results)
        .args(args)
        .output()?;
    let wall = started.elapsed().as_secs_f64();
    if !output.status.success() {
        bail!(
            "mst run {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let runs = results.join("bench/runs");
    let run_dir = std::fs::read_dir(&runs)?
        .next()
        .context("no run directory")??
        .path();
    let record = std::fs::read(run_dir.join("run.json"))?;
    let record = serde_json::from_slice(&record).context("run.json is not JSON")?;
    Ok((wall, record))
}

/// The debug `mst` (and its static worker) built, the two test engines started, and the worker
/// image set up on both: what every Docker benchmark starts from.
pub(crate) fn ready() -> Result<(std::path::PathBuf, engines::Engines)> {
    run(crate::cargo()
        .current_dir(root())
        .args(["build", "-p", "mst"]))?;
    crate::build_static_worker()?;
    let mst = root().join("target/debug/mst");
    let engines = engines::start(&root())?;
    let (a, b) = (&engines.endpoints[0], &engines.endpoints[1]);
    run(Command::new(&mst).args([
        "runner",
        "setup",
        "docker",
        "--runner-option",
        &format!("contexts={a},{b}"),
        "--runner-option",
        &format!("base={}", engines::TEST_IMAGE),
    ]))?;
    Ok((mst, engines))
}

/// Runs the benchmark and prints its figures.
pub fn bench() -> Result<()> {
    let (mst, engines) = ready()?;
    let (a, b) = (&engines.endpoints[0], &engines.endpoints[1]);
    let image = format!("mst-worker:{}", env!("CARGO_PKG_VERSION"));

    // Bare `docker run --rm IMAGE true`, the floor for any container.
    let mut bare = Vec::new();
    for _ in 0..10 {
        let started = Instant::now();
        let status = Command::new("docker")
            .args(["--host", a, "run", "--rm", &image, "true"])
            .status()?;
        if !status.success() {
            bail!("docker run failed");
        }
        bare.push(started.elapsed().as_secs_f64() * 1e3);
    }

    // Ten shards, one at a time (exclusive: one container per host).
    let dir = tempfile_dir("mst-bench-docker")?;
    write_eval(&dir, 40, 1)?;
    let (_, record) = timed_run(
        &mst,
        &dir,
        &[
            "--runner".into(),
            "docker".into(),
            "--runner-option".into(),
            format!("contexts={a}"),
            "--runner-option".into(),
            "shards=10".into(),
            "--runner-option".into(),
            "mode=exclusive".into(),
        ],
    )?;
    let ready: Vec<f64> = record["machines"]
        .as_array()
        .context("no machines")?
        .iter()
        .filter_map(|m| m["readyMs"].as_f64())
        .collect();
    if ready.len() < 5 {
        bail!("too few shards reported readyMs: {ready:?}");
    }
    let (ready_median, bare_median) = (median(ready.clone()), median(bare));
    println!(
        "shard start (create container → worker hello), median of {}: {ready_median:.0} ms; \
         bare `docker run --rm IMAGE true`: {bare_median:.0} ms; ratio {:.2}× (target ≤ 1.5×)",
        ready.len(),
        ready_median / bare_median
    );

    // 1,000 trials: 4 shards over 2 hosts against the local runner.
    write_eval(&dir, 1000, 4)?;
    let (local, _) = timed_run(&mst, &dir, &[])?;
    let (docker, record) = timed_run(
        &mst,
        &dir,
        &[
            "--runner".into(),
            "docker".into(),
            "--runner-option".into(),
            format!("contexts={a},{b}"),
            "--runner-option".into(),
            "shards=4".into(),
            "--runner-option".into(),
            "memory=512m".into(),
        ],
    )?;
    let machines = record["machines"].as_array().map_or(0, |m| m.len());
    println!(
        "1,000 trials (`cat`, concurrency 4): local runner {local:.2} s; docker, {machines} shards \
         over 2 hosts {docker:.2} s; ratio {:.2}× (target ≤ 2×)",
        docker / local
    );
    std::fs::remove_dir_all(&dir)?;
    drop(engines);
    Ok(())
}
