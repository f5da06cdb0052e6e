//! `cargo xtask bench docker`: what the Docker runner costs, against the real engines the
//! tests use. Prints:
//!
//! - a bare `docker run --rm IMAGE true` (median of 10), the floor for any container;
//! - shard start: from asking for a container to the worker's `hello` (`readyMs` in run.json),
//!   median over 10 shards started one at a time;
//! - start to first trial: from starting `mst run` to its first trial's line, with 1, 4 and 8
//!   shards started at once over both hosts (median of 3), over one bare container and over as
//!   many bare containers started at once (issue 16's goal: ≤ 1.5×);
//! - trials per second at 8 shards over both hosts (4,000 trials of `cat`);
//! - a 1,000-trial eval on 4 shards over 2 hosts against the same eval on the local runner.
//!
//! It uses the static debug build `cargo xtask test` uses (dependencies optimised, mst's own
//! code not).

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

/// What one timed `mst run` measured.
struct Timed {
    /// From starting `mst run` to its end, in seconds.
    wall: f64,
    /// From starting `mst run` to its first trial's line (`[1/N] … collected`), in ms.
    first_trial_ms: f64,
    /// The run's `run.json`.
    record: serde_json::Value,
}

/// Runs `mst run` on the eval in `dir`, timing it from the start to its first trial's line on
/// stderr and to its end.
fn timed_run(mst: &Path, dir: &Path, args: &[String]) -> Result<Timed> {
    use std::io::BufRead;
    let results = dir.join("results");
    let _ = std::fs::remove_dir_all(&results);
    let started = Instant::now();
    let mut child = Command::new(mst)
        .args(["run", "--config"])
        .arg(dir.join("eval.json"))
        .arg("--results-dir")
        .arg(&results)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    // Not a terminal: one line per trial as it finishes.
    let mut first_trial = None;
    let mut said = Vec::new();
    for line in std::io::BufReader::new(child.stderr.take().context("stderr")?).lines() {
        let line = line?;
        if first_trial.is_none() && line.starts_with("[1/") {
            first_trial = Some(started.elapsed().as_secs_f64() * 1e3);
        }
        if said.len() < 50 && !line.starts_with('[') {
            said.push(line);
        }
    }
    let status = child.wait()?;
    let wall = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!("mst run {args:?} failed: {}", said.join("\n"));
    }
    let runs = results.join("bench/runs");
    let run_dir = std::fs::read_dir(&runs)?
        .next()
        .context("no run directory")??
        .path();
    let record = std::fs::read(run_dir.join("run.json"))?;
    let record = serde_json::from_slice(&record).context("run.json is not JSON")?;
    Ok(Timed {
        wall,
        first_trial_ms: first_trial.context("mst run printed no trial line")?,
        record,
    })
}

/// Wall ms for `n` bare `docker run --rm IMAGE true` started at once, spread over `hosts`.
fn bare_runs_at_once(hosts: &[&String], image: &str, n: usize) -> Result<f64> {
    let started = Instant::now();
    let children = (0..n)
        .map(|i| {
            Command::new("docker")
                .args([
                    "--host",
                    hosts[i % hosts.len()],
                    "run",
                    "--rm",
                    image,
                    "true",
                ])
                .stdout(std::process::Stdio::null())
                .spawn()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    for mut child in children {
        if !child.wait()?.success() {
            bail!("docker run failed");
        }
    }
    Ok(started.elapsed().as_secs_f64() * 1e3)
}

/// `--runner docker` on `contexts` with `shards` shards, plus `more` runner options.
fn docker_args(contexts: &str, shards: usize, more: &[&str]) -> Vec<String> {
    let mut args = vec![
        "--runner".to_string(),
        "docker".to_string(),
        "--runner-option".to_string(),
        format!("contexts={contexts}"),
        "--runner-option".to_string(),
        format!("shards={shards}"),
    ];
    for option in more {
        args.extend(["--runner-option".to_string(), option.to_string()]);
    }
    args
}

/// The debug `mst` `cargo xtask test` uses built (static: its own worker), the two test
/// engines started, and the worker image set up on both: what every Docker benchmark starts
/// from.
pub(crate) fn ready() -> Result<(std::path::PathBuf, engines::Engines)> {
    let mst = crate::build_for_tests()?;
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

    let bare_median = median(bare);
    println!("bare `docker run --rm IMAGE true`: {bare_median:.0} ms (median of 10)");

    // Ten shards, one at a time (exclusive: one container per host).
    let dir = tempfile_dir("mst-bench-docker")?;
    write_eval(&dir, 40, 1)?;
    let timed = timed_run(&mst, &dir, &docker_args(a, 10, &["mode=exclusive"]))?;
    let ready: Vec<f64> = timed.record["machines"]
        .as_array()
        .context("no machines")?
        .iter()
        .filter_map(|m| m["readyMs"].as_f64())
        .collect();
    if ready.len() < 5 {
        bail!("too few shards reported readyMs: {ready:?}");
    }
    let ready_median = median(ready.clone());
    println!(
        "shard start (create container → worker hello), median of {}: {ready_median:.0} ms; \
         ratio to bare {:.2}×",
        ready.len(),
        ready_median / bare_median
    );

    // From `mst run` starting to its first trial, with N shards started at once over both
    // hosts: everything a user waits for (config, image check, containers, worker placed,
    // hello, one trial), against the bare container.
    // The same number of bare containers started at once over both hosts is the fair floor
    // when containers are started in parallel: on 2 cores the engines' own work is serial.
    for shards in [1, 4, 8] {
        write_eval(&dir, shards * 4, 1)?;
        let (mut first, mut bare_at_once) = (Vec::new(), Vec::new());
        for _ in 0..3 {
            let args = docker_args(&format!("{a},{b}"), shards, &[]);
            first.push(timed_run(&mst, &dir, &args)?.first_trial_ms);
            bare_at_once.push(bare_runs_at_once(&[a, b], &image, shards)?);
        }
        let (first, at_once) = (median(first), median(bare_at_once));
        println!(
            "start to first trial, {shards} shard(s) over 2 hosts (median of 3): {first:.0} ms; \
             ratio to one bare container {:.2}×, to {shards} bare containers started at once \
             ({at_once:.0} ms) {:.2}× (target ≤ 1.5×)",
            first / bare_median,
            first / at_once
        );
    }

    // Throughput at 8 shards over 2 hosts, 2 trials in flight per shard.
    let n = 4000;
    write_eval(&dir, n, 2)?;
    let timed = timed_run(&mst, &dir, &docker_args(&format!("{a},{b}"), 8, &[]))?;
    let collect_s = timed.record["timings"]["collectMs"]
        .as_f64()
        .context("run.json has no timings.collectMs")?
        / 1e3;
    println!(
        "{n} trials (`cat`) on 8 shards over 2 hosts: {:.0} trials/s while collecting \
         ({collect_s:.2} s), {:.0} trials/s start to end ({:.2} s)",
        n as f64 / collect_s,
        n as f64 / timed.wall,
        timed.wall
    );

    // 1,000 trials: 4 shards over 2 hosts against the local runner.
    write_eval(&dir, 1000, 4)?;
    let local = timed_run(&mst, &dir, &[])?.wall;
    let timed = timed_run(
        &mst,
        &dir,
        &docker_args(&format!("{a},{b}"), 4, &["memory=512m"]),
    )?;
    let machines = timed.record["machines"].as_array().map_or(0, |m| m.len());
    println!(
        "1,000 trials (`cat`, concurrency 4): local runner {local:.2} s; docker, {machines} shards \
         over 2 hosts {:.2} s; ratio {:.2}× (target ≤ 2×)",
        timed.wall,
        timed.wall / local
    );
    std::fs::remove_dir_all(&dir)?;
    drop(engines);
    Ok(())
}
