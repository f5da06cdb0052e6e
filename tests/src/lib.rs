//! Helpers for the end-to-end tests: where the built `mst` binary and the plugin components
//! are, a runner that gives each test its own `MST_HOME`, evals and waits shared by the runner
//! tests, ([`sshd`]) real OpenSSH servers on loopback, and ([`model_server`]) a scripted model
//! server on loopback (no model provider is reachable from the test machines), and ([`serve`]) a
//! running `mst serve` called with the real `curl`, and ([`browser`]) a real headless Chromium
//! for tests that look at pages, with screenshots in `target/test-output/<test>/`, and
//! ([`registry`]) a real OCI registry on loopback.
//!
//! Build everything first with `cargo xtask test` (or `cargo xtask plugins` and
//! `cargo build -p mst`); a missing artifact fails the test with that instruction.

pub mod browser;
pub mod model_server;
pub mod registry;
pub mod serve;
pub mod slurm;
pub mod sshd;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The repository root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ is in the repo")
        .to_path_buf()
}

fn must_exist(path: PathBuf) -> PathBuf {
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask test` (it builds the plugins and mst first)",
        path.display()
    );
    path
}

/// The cargo target directory (`$CARGO_TARGET_DIR`, else `target/` in the repository).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join("target"))
}

/// The running test's name, `::` written `.` (`web.the_report_…`): libtest runs each test on a
/// thread named after its path in the test binary.
pub fn current_test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .replace("::", ".")
}

/// `target/test-output/<test name>/`, created: where a test leaves what a person may want to
/// look at afterwards (screenshots; docs take theirs from here).
pub fn test_output_dir() -> PathBuf {
    output_dir(&current_test_name())
}

/// `target/test-output/<name>/`, created.
pub fn output_dir(name: &str) -> PathBuf {
    let dir = target_dir().join("test-output").join(name);
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    dir
}

/// The built `mst` binary: `$MST_BIN`, else the `mst` cargo built beside the running test
/// (`target/[TRIPLE/]debug/`: `cargo xtask test` builds for musl), else `target/debug/mst`.
pub fn mst_bin() -> PathBuf {
    if let Some(bin) = std::env::var_os("MST_BIN") {
        return must_exist(PathBuf::from(bin));
    }
    // A test binary is `<profile dir>/deps/<name>-<hash>`.
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| Some(exe.parent()?.parent()?.join("mst")))
        .filter(|mst| mst.is_file());
    must_exist(beside.unwrap_or_else(|| target_dir().join("debug").join("mst")))
}

/// A first-party plugin from `plugins/dist`, e.g. `plugin("contains.wasm")`.
pub fn plugin(file: &str) -> PathBuf {
    must_exist(root().join("plugins/dist").join(file))
}

/// A hostile or broken fixture from `plugins/dist/fixtures`.
pub fn fixture(file: &str) -> PathBuf {
    must_exist(root().join("plugins/dist/fixtures").join(file))
}

/// An isolated mst installation: its own `MST_HOME` in a temporary directory.
pub struct Mst {
    pub home: tempfile::TempDir,
}

/// What one `mst` invocation did.
#[derive(Debug)]
pub struct Run {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// stdout parsed as JSON.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| {
            panic!(
                "stdout is not JSON ({e}):\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }
}

impl From<Output> for Run {
    fn from(out: Output) -> Self {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Default for Mst {
    fn default() -> Self {
        Self::new()
    }
}

impl Mst {
    /// A fresh home, set up as an operator of this machine would: `runners.json` shows the
    /// local runner's sandbox where the machine's `python3` lives when that is outside the
    /// system directories (pyenv's, here), since the tests' MCP servers are Python programs.
    pub fn new() -> Self {
        Self::exposing(&[])
    }

    /// A fresh home whose `runners.json` makes local machines unsandboxed
    /// (`isolation=none`), for tests whose agents write outside their trials.
    pub fn unsandboxed() -> Self {
        Self::with_local_defaults(serde_json::json!({"isolation": "none"}))
    }

    /// A fresh home whose local sandboxes are also shown `paths` (read-only, at the same
    /// place): for agents that read a test's files, or wait for one to appear.
    pub fn exposing(paths: &[&Path]) -> Self {
        let mut shown: Vec<String> = paths.iter().map(|p| s(p).to_string()).collect();
        let python = python_root();
        if !python.starts_with("/usr") {
            shown.push(s(&python).to_string());
        }
        Self::with_local_defaults(serde_json::json!({"expose": shown.join(",")}))
    }

    /// A fresh home whose `runners.json` gives the local runner `defaults` (none when empty
    /// or when `expose` is empty).
    fn with_local_defaults(defaults: serde_json::Value) -> Self {
        let home = tempfile::tempdir().expect("temp dir");
        if defaults.get("expose") != Some(&serde_json::json!("")) {
            let file = serde_json::json!({ "local": defaults });
            std::fs::write(home.path().join("runners.json"), file.to_string())
                .expect("write runners.json");
        }
        Mst { home }
    }

    /// A command for `mst ARGS` with this home.
    pub fn command<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut command = Command::new(mst_bin());
        command
            .env("MST_HOME", self.home.path())
            .env_remove("MST_LOG")
            .args(args);
        command
    }

    /// Starts `mst ARGS` in the background with stdout and stderr piped, for tests that act
    /// while it runs.
    pub fn spawn<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> std::process::Child {
        self.command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start mst")
    }

    /// Runs `mst ARGS` to completion.
    pub fn run<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Run {
        self.command(args).output().expect("run mst").into()
    }
}

/// A stored trace's events of `kind` (`tool-call`, `custom`, …).
pub fn events<'a>(trace: &'a serde_json::Value, kind: &str) -> Vec<&'a serde_json::Value> {
    trace["trace"]["events"]
        .as_array()
        .expect("a trace has events")
        .iter()
        .filter(|e| e["type"] == kind)
        .collect()
}

/// A JSON file's contents; panics with the path when it is missing or not JSON.
pub fn read_json(path: &Path) -> serde_json::Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

/// The trace log of a run directory (run format 2): every stored trace, a JSON line each.
pub const TRACES_FILE: &str = "traces.jsonl";

/// Every line of `run_dir`'s trace log as JSON, in the order written (empty with no log).
/// A line still being written (no newline yet) is left out: it is no trace yet.
pub fn trace_lines(run_dir: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(run_dir.join(TRACES_FILE)).unwrap_or_default();
    let whole = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
    whole
        .lines()
        .map(|line| {
            serde_json::from_str(line).unwrap_or_else(|e| panic!("a trace line is not JSON: {e}"))
        })
        .collect()
}

/// Whether trace line `record` is the trace of `trial` (`variant/case/trial`).
fn is_trace_of(record: &serde_json::Value, trial: &str) -> bool {
    let (variant, rest) = trial.split_once('/').expect("variant/case/trial");
    let (case, n) = rest.rsplit_once('/').expect("variant/case/trial");
    record["variant"] == variant
        && record["case"]["id"] == case
        && record["trial"].as_u64().map(|t| t.to_string()).as_deref() == Some(n)
}

/// The stored trace of `trial` (`"variant/case/trial"`, e.g. `"default/c1/0"`) in `run_dir`:
/// its last line in the trace log, read as the docs describe the log rather than through
/// mst. Panics, naming the trial, when the run has none.
pub fn read_trace(run_dir: &Path, trial: &str) -> serde_json::Value {
    find_trace(run_dir, trial)
        .unwrap_or_else(|| panic!("no trace of {trial} in {}", run_dir.display()))
}

/// [`read_trace`], or `None` when the run has no trace of `trial`.
pub fn find_trace(run_dir: &Path, trial: &str) -> Option<serde_json::Value> {
    trace_lines(run_dir)
        .into_iter()
        .rev()
        .find(|record| is_trace_of(record, trial))
}

/// Removes every trace of `trial` from `run_dir`'s trace log (to make it missing, as a lost
/// trial is).
pub fn remove_trace(run_dir: &Path, trial: &str) {
    let kept: String = trace_lines(run_dir)
        .into_iter()
        .filter(|record| !is_trace_of(record, trial))
        .map(|record| record.to_string() + "\n")
        .collect();
    std::fs::write(run_dir.join(TRACES_FILE), kept).expect("rewrite the trace log");
}

/// The one run directory of `eval` below a results directory.
pub fn only_run(results: &Path, eval: &str) -> PathBuf {
    let runs: Vec<PathBuf> = std::fs::read_dir(results.join(eval).join("runs"))
        .unwrap_or_else(|e| panic!("no runs of {eval} in {}: {e}", results.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(runs.len(), 1, "{runs:?}");
    runs[0].clone()
}

/// Files below `dir` whose contents include `needle`: for canary searches.
pub fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(path);
            } else if String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default())
                .contains(needle)
            {
                found.push(path);
            }
        }
    }
    found
}

/// `path` as a `&str` for argument lists.
pub fn s(path: &Path) -> &str {
    path.to_str().expect("UTF-8 path")
}

/// A scratch directory with an eval config and its cases.
pub struct Eval {
    pub dir: tempfile::TempDir,
}

impl Eval {
    /// Writes `config` as eval.json and `cases` as cases.jsonl.
    pub fn new(config: serde_json::Value, cases: &[serde_json::Value]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let lines: Vec<String> = cases.iter().map(|c| c.to_string()).collect();
        std::fs::write(dir.path().join("cases.jsonl"), lines.join("\n")).unwrap();
        std::fs::write(
            dir.path().join("eval.json"),
            serde_json::to_vec_pretty(&config).unwrap(),
        )
        .unwrap();
        Eval { dir }
    }
    /// The eval.json path.
    pub fn config(&self) -> PathBuf {
        self.dir.path().join("eval.json")
    }
    /// Where its runs go.
    pub fn results(&self) -> PathBuf {
        self.dir.path().join("results")
    }
    /// `mst run` on it with `extra` arguments, as an argument list.
    pub fn args(&self, extra: &[&str]) -> Vec<String> {
        let (config, results) = (self.config(), self.results());
        let fixed = ["run", "--config", s(&config), "--results-dir", s(&results)];
        fixed.iter().chain(extra).map(|a| a.to_string()).collect()
    }
    /// Runs `mst run` on it with `extra` arguments.
    pub fn run(&self, mst: &Mst, extra: &[&str]) -> Run {
        mst.run(&self.args(extra))
    }
    /// Starts `mst run` on it with `extra` arguments in the background (see [`Mst::spawn`]).
    pub fn spawn(&self, mst: &Mst, extra: &[&str]) -> std::process::Child {
        mst.spawn(&self.args(extra))
    }
    /// The only run directory of eval `name`.
    pub fn run_dir(&self, name: &str) -> PathBuf {
        only_run(&self.results(), name)
    }
}

/// `n` cases whose expected answer is their input.
pub fn cases(n: usize) -> Vec<serde_json::Value> {
    (1..=n).map(|i| serde_json::json!({"id": format!("c{i}"), "input": format!("question {i}"), "expected": format!("question {i}")})).collect()
}

/// An eval named `e2e` whose client runs `command` on `n` cases, two at a time, each
/// trial capped at `timeout` seconds; it passes when the command exits 0.
pub fn command_eval(command: serde_json::Value, n: usize, timeout: u32) -> Eval {
    Eval::new(
        serde_json::json!({
            "name": "e2e",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {"command": command},
            "judges": [{"assert": "exit-code", "value": 0}],
            "concurrency": 2,
            "timeout": timeout
        }),
        &cases(n),
    )
}

/// An eval named `paired` of two `command` variants, `alpha` and `beta`, each echoing its
/// answer, compared on `cases` by the pairwise rubric plugin on model `acme/judge-1` of the
/// anthropic-format provider at `model_url`, keyed by the secret `JUDGE_KEY` (in the returned
/// secrets file).
pub fn pairwise_eval(
    model_url: &str,
    alpha: &str,
    beta: &str,
    cases: &[serde_json::Value],
) -> (Eval, PathBuf) {
    let judge = plugin("pairwise-rubric.wasm");
    let variant = |answer: &str| serde_json::json!({"clientOptions": {"command": ["echo", answer], "input": "none"}});
    let eval = Eval::new(
        serde_json::json!({
            "name": "paired", "datasets": ["cases.jsonl"], "client": "command",
            "variants": {"alpha": variant(alpha), "beta": variant(beta)},
            "providers": {"acme": {"format": "anthropic", "baseUrl": model_url, "key": "JUDGE_KEY"}},
            "plugins": [{"path": s(&judge), "allowModel": ["acme"]}],
            "pairwise": [{"plugin": "mst/grader/pairwise-rubric", "variants": ["alpha", "beta"],
                          "options": {"provider": "acme", "model": "judge-1",
                                      "rubric": "The answer gives Tokyo's UTC offset."}}],
            "timeout": 30
        }),
        cases,
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "JUDGE_KEY=mst-canary-pairwise-key\n").unwrap();
    (eval, secrets)
}

/// Every file below `dir`.
pub fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                stack.push(entry.path());
            } else {
                found.push(entry.path());
            }
        }
    }
    found
}

/// The machines `run.json` (`record`) says were lost.
pub fn lost_machines(record: &serde_json::Value) -> Vec<&serde_json::Value> {
    record["machines"]
        .as_array()
        .expect("run.json lists its machines")
        .iter()
        .filter(|m| m["ended"]["status"] == "lost")
        .collect()
}

/// Asserts that no work directory of run `id` is left in `/tmp`, where the ssh and slurm
/// runners make them on their (here, this) machine: dispose removed them all.
pub fn assert_no_work_dirs_left(id: &str) {
    let leftovers: Vec<_> = std::fs::read_dir("/tmp")
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains(id))
        .collect();
    assert!(
        leftovers.is_empty(),
        "work directories removed: {leftovers:?}"
    );
}

/// Waits until the run directory `dir` holds traces of `n` trials, failing the test after
/// `limit`.
pub fn wait_for_traces(dir: &Path, n: usize, limit: Duration) {
    let started = Instant::now();
    loop {
        let trials: std::collections::BTreeSet<String> = trace_lines(dir)
            .iter()
            .map(|t| format!("{}/{}/{}", t["variant"], t["case"]["id"], t["trial"]))
            .collect();
        if trials.len() >= n {
            return;
        }
        assert!(
            started.elapsed() < limit,
            "no {n} traces in {}",
            dir.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The run directory of the only run of eval `name` below `results`, once it exists.
pub fn wait_for_run(results: &Path, name: &str) -> PathBuf {
    let started = Instant::now();
    loop {
        if let Some(dir) = std::fs::read_dir(results.join(name).join("runs"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| e.ok())
        {
            return dir.path();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no run started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Fails the test unless `program` is on `PATH`, saying how to `install` it (`.ci/run`
/// installs what the tests drive: the agent CLIs from npm, bubblewrap from Debian).
pub fn require_program(program: &str, install: &str) {
    let found = std::process::Command::new("sh")
        .args(["-c", &format!("command -v {program}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{program} is missing: {install}");
}

/// Where the machine's `python3` lives, for a sandbox to be shown it (`expose=`): pyenv's
/// root when pyenv manages it (its shims need the whole tree), else the interpreter's prefix.
pub fn python_root() -> PathBuf {
    static ROOT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    ROOT.get_or_init(find_python_root).clone()
}

fn find_python_root() -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let found = std::env::split_paths(&path).find(|dir| dir.join("python3").is_file());
    if let Some(shims) = found.filter(|dir| dir.ends_with("shims")) {
        return shims.parent().expect("a parent").to_path_buf();
    }
    let out = std::process::Command::new("python3")
        .args(["-c", "import sys; print(sys.prefix)"])
        .output()
        .expect("python3 runs");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

/// The steps of a runner's dry run (`mst plugin check --dry-run`, `mst runner check`), in order.
pub const DRY_RUN_STEPS: [&str; 5] = [
    "options",
    "create machine",
    "worker ready",
    "one trial",
    "dispose",
];

/// `@modelcontextprotocol/server-everything` over its own streamable HTTP on a free loopback
/// port, once it listens: the process (the caller kills it) and the port.
pub fn everything_over_http() -> (std::process::Child, u16) {
    let port = free_port();
    let server = std::process::Command::new("mcp-server-everything")
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("mcp-server-everything starts (.ci/run installs it from npm)");
    wait_for_port(port, "the HTTP server");
    (server, port)
}

/// A loopback TCP port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits up to 30 s for a server (`what`, for the failure) to listen on loopback `port`.
pub fn wait_for_port(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Asserts that a `--resume` run succeeded and collected exactly the `missing` trials.
pub fn assert_resumed(resumed: &Run, missing: usize) {
    assert_eq!(resumed.code, 0, "{}\n{}", resumed.stdout, resumed.stderr);
    assert!(
        resumed.stderr.contains(&format!("[{missing}/{missing}]")),
        "{}",
        resumed.stderr
    );
}

/// The `hello` line a worker of this build sends for shard 0, for hostile stand-in workers.
pub fn hello_line() -> String {
    let version = env!("CARGO_PKG_VERSION");
    format!(
        r#"{{"type":"hello","protocol":"mst.shard/v1","mst":"{version}","client":{{"name":"command","version":"{version}"}},"shard":0}}"#
    )
}

/// Five cases: four answers say hello, c5's does not.
pub fn hello_cases() -> Vec<serde_json::Value> {
    (1..=5)
        .map(|i| {
            let word = if i == 5 { "bye" } else { "hello" };
            serde_json::json!({"id": format!("c{i}"), "input": format!("case-{i} says {word}")})
        })
        .collect()
}

/// An eval whose agent echoes its input, judged by a `contains` assertion and by the exec
/// grader fixture (granted `mst-fixture-judge`), which passes the answers saying hello.
pub fn exec_judged_eval() -> Eval {
    let eval = Eval::new(
        serde_json::json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["cat"]},
               "plugins": [{"path": "exec-grader.wasm", "allowExec": ["mst-fixture-judge"]}],
               "judges": [{"assert": "contains", "value": "case-"},
                          {"plugin": "mst/fixture/exec-grader"}],
               "timeout": 30}),
        &hello_cases(),
    );
    std::fs::copy(
        fixture("exec-grader.wasm"),
        eval.dir.path().join("exec-grader.wasm"),
    )
    .unwrap();
    eval
}

/// [`exec_judged_eval`] collected on the local runner (its judge cannot score yet: the
/// judge's program is nowhere on this PATH): the eval, its run directory and the run's id.
pub fn collected_exec_judged_eval(mst: &Mst) -> (Eval, PathBuf, String) {
    let eval = exec_judged_eval();
    let collected = eval.run(mst, &["--json", "-q"]).json();
    assert_eq!(collected["collect"], "complete", "{collected}");
    let run_dir = eval.run_dir("e2e");
    let run = run_dir.file_name().unwrap().to_str().unwrap().to_string();
    (eval, run_dir, run)
}

/// Writes the `mst-fixture-judge` program (which the exec grader fixture runs) into `dir`, and
/// returns `dir`: it says which process ran it (its parent's command line) and on which host,
/// and passes an answer that says hello.
pub fn judge_program(dir: &Path) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("mst-fixture-judge");
    std::fs::write(
        &path,
        "#!/bin/sh\nanswer=$(cat)\necho \"$1 judged on $(cat /etc/hostname) by [$(tr '\\0' ' ' < /proc/$PPID/cmdline)]\"\n\
         case \"$answer\" in *hello*) exit 0;; *) exit 1;; esac\n",
    )
    .unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    dir.to_path_buf()
}

/// Writes `body` as an executable `/bin/sh` script `name` in `dir`, to stand in for the worker
/// on the local runner; returns its `--runner-option` value (`worker=PATH`). `$HELLO` in the
/// script holds [`hello_line`].
pub fn stand_in_worker(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    let script = format!("#!/bin/sh\nHELLO='{}'\n{body}", hello_line());
    std::fs::write(&path, script).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    format!("worker={}", s(&path))
}
