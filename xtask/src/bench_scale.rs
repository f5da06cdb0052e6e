//! `cargo xtask bench scale [--trials N] [--shards S] [--kill RATE] [--latency-ms L] [--json]`:
//! the coordinator at many machines. One eval of N trials of the in-process `api` client on
//! `mock/echo` runs over S machines of the `sim` runner (a local worker each, behind a channel
//! with L ms of latency each way), which loses the share RATE of them mid-run; then `--resume`
//! collects what they took with them, on machines that are not lost. Prints (with `--json`, as
//! one object) what came back each time, the wall times, and the coordinator's own CPU time and
//! peak resident memory (its process alone, never its workers': read from `/proc`, the CPU time
//! once it has exited and before it is reaped).
//!
//! It uses the debug build `cargo xtask test` uses (dependencies optimised, mst's own code
//! not), or `MST_BENCH_MST=PATH` (a release build, say).

use crate::tempfile_dir;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// What the bench is asked to run.
#[derive(Debug, Clone, PartialEq)]
pub struct ScaleArgs {
    pub trials: u64,
    pub shards: u32,
    pub kill: f64,
    pub latency_ms: u64,
    pub json: bool,
}

impl Default for ScaleArgs {
    /// A million trials over a hundred machines, 20 ms apart, 5% of them lost.
    fn default() -> Self {
        ScaleArgs {
            trials: 1_000_000,
            shards: 100,
            kill: 0.05,
            latency_ms: 20,
            json: false,
        }
    }
}

impl ScaleArgs {
    /// Parses `--trials N --shards S --kill RATE --latency-ms L --json`, each optional.
    pub fn parse(words: &[&str]) -> Result<Self> {
        let mut args = ScaleArgs::default();
        let mut words = words.iter();
        while let Some(word) = words.next() {
            if *word == "--json" {
                args.json = true;
                continue;
            }
            let value = words
                .next()
                .with_context(|| format!("`bench scale {word}` needs a value"))?;
            let bad = || format!("`bench scale {word} {value}`: not a valid value");
            match *word {
                "--trials" => {
                    args.trials = value.parse().ok().filter(|n| *n > 0).with_context(bad)?
                }
                "--shards" => {
                    args.shards = value.parse().ok().filter(|n| *n > 0).with_context(bad)?
                }
                "--kill" => {
                    args.kill = value
                        .parse()
                        .ok()
                        .filter(|r: &f64| (0.0..1.0).contains(r))
                        .with_context(bad)?
                }
                "--latency-ms" => args.latency_ms = value.parse().with_context(bad)?,
                other => bail!(
                    "`bench scale` takes --trials N, --shards S, --kill RATE, --latency-ms L and \
                     --json, not {other:?}"
                ),
            }
        }
        Ok(args)
    }
}

/// One `mst run` measured: its exit code, wall time, and the coordinator's CPU seconds and
/// peak RSS.
struct Measured {
    code: i32,
    wall_s: f64,
    cpu_s: f64,
    peak_rss_kib: u64,
}

/// Runs the benchmark and prints its figures.
pub fn bench(args: &ScaleArgs) -> Result<()> {
    let mst = match std::env::var_os("MST_BENCH_MST") {
        Some(path) => PathBuf::from(path),
        None => crate::build_for_tests()?,
    };
    let dir = tempfile_dir("mst-bench-scale")?;
    write_eval(&dir, args.trials)?;
    let sim = |kill: f64| -> Vec<String> {
        [
            format!("shards={}", args.shards),
            format!("latency-ms={}", args.latency_ms),
            format!("kill={kill}"),
            // A lost machine goes somewhere in its share of the trials (about a line each).
            format!(
                "kill-after-lines={}",
                (args.trials / u64::from(args.shards)).max(1)
            ),
        ]
        .into_iter()
        .flat_map(|option| ["--runner-option".to_string(), option])
        .collect()
    };
    let first = measure(&mst, &dir, &sim(args.kill), None)?;
    let run_id = only_run(&dir)?;
    let collected_first = args.trials - missing(&dir, &run_id)?;
    let resumed = measure(&mst, &dir, &sim(0.0), Some(&run_id))?;
    let missing_after = missing(&dir, &run_id)?;
    if resumed.code != 0 && missing_after == 0 {
        bail!(
            "the resume collected everything but exited {}",
            resumed.code
        );
    }
    let killed = (args.kill * f64::from(args.shards)).round() as u64;
    let figures = serde_json::json!({
        "trials": args.trials,
        "shards": args.shards,
        "latencyMs": args.latency_ms,
        "killed": killed,
        "collectedFirst": collected_first,
        "collectedAfterResume": args.trials - missing_after - collected_first,
        "missing": missing_after,
        "wallS": round(first.wall_s),
        "resumeWallS": round(resumed.wall_s),
        "coordinatorCpuS": round(first.cpu_s),
        "resumeCoordinatorCpuS": round(resumed.cpu_s),
        "coordinatorPeakRssMiB": round(first.peak_rss_kib.max(resumed.peak_rss_kib) as f64 / 1024.0),
        "coordinatorCpuUsPerTrial": round(first.cpu_s * 1e6 / args.trials as f64),
        "firstExitCode": first.code,
        "mst": mst,
    });
    if args.json {
        println!("{figures}");
    } else {
        println!(
            "{} trials over {} sim machines ({} ms latency), {killed} lost: {collected_first} \
             collected in {:.1} s, then {} by --resume in {:.1} s; {missing_after} missing",
            args.trials,
            args.shards,
            args.latency_ms,
            first.wall_s,
            figures["collectedAfterResume"],
            resumed.wall_s
        );
        println!(
            "coordinator: {:.2} s CPU ({:.1} µs a trial), peak RSS {} MiB; the resume {:.2} s CPU",
            first.cpu_s,
            figures["coordinatorCpuUsPerTrial"],
            figures["coordinatorPeakRssMiB"],
            resumed.cpu_s
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

fn round(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The eval: `trials` cases answered by the `api` client on `mock/echo`, judged by a built-in
/// assertion (no plugin, so nothing but the coordinator and its workers is measured).
fn write_eval(dir: &Path, trials: u64) -> Result<()> {
    use std::io::Write;
    let mut cases = std::io::BufWriter::new(std::fs::File::create(dir.join("cases.jsonl"))?);
    for i in 0..trials {
        writeln!(cases, "{{\"id\":\"c{i}\",\"input\":\"answer {i}\"}}")?;
    }
    cases.flush()?;
    let eval = serde_json::json!({
        "name": "scale", "datasets": ["cases.jsonl"], "client": "api", "model": "mock/echo",
        "judges": [{"assert": "contains", "value": "answer"}], "concurrency": 4, "timeout": 60
    });
    std::fs::write(dir.join("eval.json"), eval.to_string())?;
    Ok(())
}

/// Runs `mst run` on the eval in `dir` (resuming `resume`), watching the coordinator.
fn measure(mst: &Path, dir: &Path, options: &[String], resume: Option<&str>) -> Result<Measured> {
    let mut command = Command::new(mst);
    command
        .current_dir(dir)
        .env("MST_HOME", dir.join("home"))
        .args([
            "run",
            "--config",
            "eval.json",
            "--results-dir",
            "results",
            "-q",
        ])
        .args(["--runner", "sim"])
        .args(options)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    if let Some(run_id) = resume {
        command.args(["--resume", run_id]);
    }
    let started = Instant::now();
    let child = command.spawn().context("cannot start mst")?;
    let pid = child.id() as i32;
    let mut peak_rss_kib = 0;
    // Until it exits (and before it is reaped, so that its /proc entry still holds its times).
    while !exited_unreaped(pid)? {
        peak_rss_kib = peak_rss_kib.max(high_water_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(20));
    }
    let wall_s = started.elapsed().as_secs_f64();
    let cpu_s = own_cpu_seconds(pid)?;
    let mut child = child;
    let status = child.wait()?;
    Ok(Measured {
        code: status.code().unwrap_or(-1),
        wall_s,
        cpu_s,
        peak_rss_kib,
    })
}

/// Whether `pid` has exited, leaving it unreaped (`waitid` with `WNOWAIT`).
fn exited_unreaped(pid: i32) -> Result<bool> {
    // SAFETY: waitid fills the siginfo it is given; WNOHANG returns at once.
    unsafe {
        let mut info: libc::siginfo_t = std::mem::zeroed();
        let r = libc::waitid(
            libc::P_PID,
            pid as libc::id_t,
            &mut info,
            libc::WEXITED | libc::WNOWAIT | libc::WNOHANG,
        );
        if r != 0 {
            bail!("waitid: {}", std::io::Error::last_os_error());
        }
        Ok(info.si_pid() == pid)
    }
}

/// The process's peak resident set so far (`VmHWM`), in KiB.
fn high_water_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("VmHWM:"))?;
    line.trim().trim_end_matches("kB").trim().parse().ok()
}

/// The process's own user and system CPU time (not its children's), in seconds.
fn own_cpu_seconds(pid: i32) -> Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let (_, rest) = stat.rsplit_once(')').context("a /proc stat line")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After the command: state is field 3, utime 14 and stime 15 (1-based, of the whole line).
    let ticks = |i: usize| -> Result<f64> { Ok(fields[i - 3].parse::<f64>()?) };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Ok((ticks(14)? + ticks(15)?) / hz)
}

/// The one run of the bench's eval.
fn only_run(dir: &Path) -> Result<String> {
    let runs = dir.join("results/scale/runs");
    let mut ids: Vec<String> = std::fs::read_dir(&runs)
        .with_context(|| format!("no runs under {}", runs.display()))?
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    ids.sort();
    ids.pop().context("the first run left no run directory")
}

/// How many trials of `run_id` have no trace, from its `summary.json`.
fn missing(dir: &Path, run_id: &str) -> Result<u64> {
    let path = dir
        .join("results/scale/runs")
        .join(run_id)
        .join("summary.json");
    let file = std::fs::File::open(&path).with_context(|| format!("{}", path.display()))?;
    let summary: serde_json::Value = serde_json::from_reader(std::io::BufReader::new(file))?;
    let missing = summary["missing"]
        .as_array()
        .context("a summary lists `missing`")?;
    Ok(missing.len() as u64)
}
