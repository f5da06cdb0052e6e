//! `cargo xtask bench serve`: what the playground costs, with the real `mst serve`, `curl` and
//! `wrk` (Debian packages: `apt-get install curl wrk`) on loopback. Prints:
//!
//! - from `POST /sessions` to the first task's first event, on the local runner and on the Docker
//!   runner (the engines the tests use): the create, and task → first event, medians over 5;
//!   next to the cost of one `curl` call (every figure includes such calls);
//! - the trace endpoint's throughput while 10 sessions stream events: a cursor past the end (a
//!   poll that finds nothing new, what a following page does most) and a full replay;
//! - a soak of 1,000 sessions, each opened, given a task and closed: the server's resident
//!   memory every 250 (it keeps the latest closed sessions only).
//!
//! It uses the debug build `cargo xtask test` uses (dependencies optimised, mst's own code not).

use crate::{median, tempfile_dir};
use anyhow::{bail, Context, Result};
use std::io::BufRead;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `mst serve`, its base URL and the access token it printed.
struct Server {
    child: Child,
    base: String,
    token: String,
}

impl Server {
    fn start(mst: &Path, dir: &Path, extra: &[&str]) -> Result<Server> {
        let mut child = Command::new(mst)
            .env("MST_HOME", dir.join("home"))
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(dir.join("eval.json"))
            .arg("--results-dir")
            .arg(dir.join("results"))
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()?;
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        let (base, token) = line
            .trim()
            .strip_prefix("mst serve: listening on ")
            .and_then(|l| l.split_once("/#token="))
            .with_context(|| format!("mst serve did not start: {line}"))?;
        let (base, token) = (base.to_string(), token.to_string());
        Ok(Server { child, base, token })
    }

    /// The header that carries its access token.
    fn authorization(&self) -> String {
        format!("authorization: Bearer {}", self.token)
    }

    /// `curl -X METHOD` on `path`; the answer as JSON.
    fn call(&self, method: &str, path: &str, body: &str) -> Result<serde_json::Value> {
        let out = Command::new("curl")
            .args(["-sS", "-X", method, "--data-binary", body])
            .args(["-H", "content-type: application/json"])
            .args(["-H", &self.authorization()])
            .arg(format!("{}{path}", self.base))
            .output()
            .context("curl (apt-get install curl)")?;
        serde_json::from_slice(&out.stdout)
            .with_context(|| format!("{method} {path}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let _ = self.child.wait();
    }
}

/// Writes an eval whose agent prints one event at once, then `events` more, `pause` seconds
/// apart, then echoes its input.
fn write_eval(dir: &Path, events: u32, pause: &str) -> Result<()> {
    let agent = format!(
        r#"e='{{"type":"message","role":"assistant","text":"step"}}'; echo "$e"; for i in $(seq {events}); do echo "$e"; sleep {pause}; done; cat"#
    );
    let config = serde_json::json!({"name": "bench", "datasets": ["cases.jsonl"], "client": "command",
        "clientOptions": {"command": ["sh", "-c", agent], "events": true}, "timeout": 600});
    std::fs::write(dir.join("eval.json"), config.to_string())?;
    std::fs::write(
        dir.join("cases.jsonl"),
        "{\"id\":\"unused\",\"input\":\"x\"}\n",
    )?;
    Ok(())
}

/// Creates a session and starts a task; (create ms, task → first event ms).
fn first_event(server: &Server) -> Result<(f64, f64)> {
    let started = Instant::now();
    let session = server.call("POST", "/api/v1/sessions", "{}")?;
    let id = session["id"]
        .as_str()
        .with_context(|| format!("no session: {session}"))?
        .to_string();
    let created = started.elapsed().as_secs_f64() * 1e3;
    let asked = Instant::now();
    let task = server.call(
        "POST",
        &format!("/api/v1/sessions/{id}/tasks"),
        r#"{"input":"go"}"#,
    )?;
    let task = task["id"]
        .as_str()
        .with_context(|| format!("no task: {task}"))?
        .to_string();
    loop {
        let page = server.call(
            "GET",
            &format!("/api/v1/sessions/{id}/tasks/{task}/trace?since=0"),
            "",
        )?;
        if !page["events"].as_array().is_some_and(|e| e.is_empty()) {
            break;
        }
        if asked.elapsed() > Duration::from_secs(60) {
            bail!("no event in 60 s: {page}");
        }
    }
    let first = asked.elapsed().as_secs_f64() * 1e3;
    server.call("DELETE", &format!("/api/v1/sessions/{id}"), "")?;
    Ok((created, first))
}

/// `wrk` on `url` for 5 s with 4 connections, sending `header`.
fn wrk(url: &str, header: &str) -> Result<std::process::Child> {
    Command::new("wrk")
        .args(["-t1", "-c4", "-d5s", "-H", header, url])
        .stdout(Stdio::piped())
        .spawn()
        .context("wrk (apt-get install wrk)")
}

fn requests_per_second(child: Child) -> Result<f64> {
    let out = child.wait_with_output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse().ok())
        .with_context(|| format!("no Requests/sec in wrk's output: {text}"))
}

/// Runs the benchmark and prints its figures.
pub fn bench() -> Result<()> {
    let (mst, engines) = crate::bench_docker::ready()?;
    let a = &engines.endpoints[0];
    let dir = tempfile_dir("mst-bench-serve")?;
    write_eval(&dir, 0, "0")?;

    let context = format!("contexts={a}");
    for (label, extra) in [
        ("local", vec![]),
        (
            "docker",
            vec!["--runner", "docker", "--runner-option", context.as_str()],
        ),
    ] {
        let server = Server::start(&mst, &dir, &extra)?;
        let mut curl = Vec::new();
        for _ in 0..10 {
            let started = Instant::now();
            server.call("GET", "/api/v1/sessions", "")?;
            curl.push(started.elapsed().as_secs_f64() * 1e3);
        }
        let (mut create, mut first) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            let (c, f) = first_event(&server)?;
            create.push(c);
            first.push(f);
        }
        println!(
            "{label:>6} runner: POST /sessions {:.0} ms, task → first event {:.0} ms, \
             POST /sessions → first event {:.0} ms (median of 5; one curl call costs {:.1} ms)",
            median(create.clone()),
            median(first.clone()),
            median(create.iter().zip(&first).map(|(c, f)| c + f).collect()),
            median(curl),
        );
    }

    // Ten sessions streaming 2,000 events each while wrk polls their traces.
    write_eval(&dir, 2000, "0.005")?;
    let server = Server::start(&mst, &dir, &[])?;
    let mut traces = Vec::new();
    for _ in 0..10 {
        let session = server.call("POST", "/api/v1/sessions", "{}")?;
        let id = session["id"].as_str().context("session id")?.to_string();
        let task = server.call(
            "POST",
            &format!("/api/v1/sessions/{id}/tasks"),
            r#"{"input":"go"}"#,
        )?;
        let task = task["id"].as_str().context("task id")?.to_string();
        traces.push(format!(
            "{}/api/v1/sessions/{id}/tasks/{task}/trace",
            server.base
        ));
    }
    std::thread::sleep(Duration::from_secs(2));
    for (label, query) in [
        ("a cursor past the end", "?since=1000000"),
        ("a full replay", "?since=0"),
    ] {
        let children: Vec<Child> = traces
            .iter()
            .map(|t| wrk(&format!("{t}{query}"), &server.authorization()))
            .collect::<Result<_>>()?;
        let total: f64 = children
            .into_iter()
            .map(requests_per_second)
            .sum::<Result<f64>>()?;
        let page = server.call(
            "GET",
            &format!("{}{query}", traces[0].trim_start_matches(&server.base)),
            "",
        )?;
        println!(
            "trace endpoint, 10 sessions streaming, {label}: {total:.0} requests/s in all \
             (10 wrk × 4 connections, 5 s; a page then held {} events)",
            page["events"].as_array().map_or(0, Vec::len)
        );
    }
    drop(server);
    write_eval(&dir, 0, "0")?;
    soak(&Server::start(&mst, &dir, &[])?)?;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Opens 1,000 sessions one after another, each running one task and then closed, and prints
/// the server's resident memory every 250.
fn soak(server: &Server) -> Result<()> {
    let started = Instant::now();
    let mut line = vec![format!("0: {} MiB", resident_mib(&server.child)?)];
    for n in 1..=1000 {
        first_event(server)?;
        if n % 250 == 0 {
            line.push(format!("{n}: {} MiB", resident_mib(&server.child)?));
        }
    }
    println!(
        "soak, 1,000 sessions each opened, given a task and closed ({:.0} s): mst serve's \
         resident memory after {}",
        started.elapsed().as_secs_f64(),
        line.join(", ")
    );
    Ok(())
}

/// The resident memory of `child` (`VmRSS`), in MiB.
fn resident_mib(child: &Child) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS in /proc/PID/status")?;
    Ok(kib / 1024)
}
