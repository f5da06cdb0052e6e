//! `cargo xtask`: the project's build and test entry points, so that a fresh machine needs only
//! cargo and rustup.
//!
//! - `cargo xtask plugins`: build the guest SDK's plugins and test fixtures to `plugins/dist/`,
//!   and the Python and JavaScript examples (installing their toolchains into
//!   `target/toolchains/` when missing).
//! - `cargo xtask test`: plugins, the real MCP servers and two real Docker engines the tests
//!   use (installed when missing), then every test: plugin unit tests natively, host and end
//!   to end on one static (musl) build, whose mst is also the worker the runners place.
//! - `cargo xtask bench`: plugins, then the plugin host benchmarks, which print their figures.
//! - `cargo xtask bench run`: end-to-end eval throughput, overhead and peak RSS (release build).
//! - `cargo xtask bench docker`: Docker shard start-up and a 1,000-trial eval, docker vs local.
//! - `cargo xtask bench serve`: the playground: POST /sessions to first event (local, Docker), and
//!   the trace endpoint under load while 10 sessions stream.
//! - `cargo xtask bench report`: `mst report` at 1,000 and 10,000 trials (time, size) and its
//!   page's load time in headless Chromium.
//! - `cargo xtask bench tools`: the tool proxy's cost per MCP call, against calling the server
//!   directly.
//! - `cargo xtask bench scale`: the coordinator over many `sim` machines, some lost mid-run,
//!   then resumed (its CPU per trial and peak RSS; `docs/scale.md`).
//! - `cargo xtask bench peers`: mst against promptfoo, Inspect AI and a process-spawning floor
//!   on the same eval (wall, CPU, peak RSS, per-trial cost); the table to `target/peers/results.md`.
//! - `cargo xtask lint`: the layering of `host/src` (`layers`), the WIT versioning policy (`wit_semver`), then rustfmt and clippy
//!   (warnings are errors) over both workspaces; `--no-clippy` leaves clippy to `cargo xtask
//!   test`, whose builds of both workspaces run it (CI).
//! - `cargo xtask layers`: the layering of `host/src` alone (part of `lint`; see `layers.rs`).
//! - `cargo xtask wit [DIR]`: the WIT versioning policy alone, on `wit/` or a copy in DIR.
//! - `cargo xtask worker`: the static (musl) mst that runners place into images without mst.
//! - `cargo xtask engines`: start the test Docker engines and wait for Enter (for working by hand).
//! - `cargo xtask seccomp`: regenerate `docker/seccomp.json` from the kernel's syscall table.
//! - `cargo xtask quickstart`: the quick-start eval on the local runner, building only what it
//!   runs (its one plugin; mst in the fast-building `quickstart` profile).
//!
//! Tasks that need a heavy dependency (`lint` and `wit` the component tooling, `bench report`
//! the tests' browser) run xtask again with the feature that brings it (`task.rs`), so the
//! quick start's first build compiles none of them.

mod allowances;
mod bench_docker;
mod bench_peers;
#[cfg(feature = "browser")]
mod bench_report;
mod bench_scale;
mod bench_serve;
mod bench_tools;
mod engines;
mod foreign;
mod layers;
mod seccomp;
mod task;
#[cfg(feature = "wit")]
mod wit_semver;

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const WASM_TARGET: &str = "wasm32-wasip2";

/// Plugin packages and where their component goes below `plugins/dist/`. Each is built by its
/// own cargo invocation: a plugin must get only its own world's SDK feature, and cargo unifies
/// features across packages built together.
const PLUGINS: &[(&str, &str)] = &[
    ("grader-contains", "contains.wasm"),
    ("grader-regex", "regex.wasm"),
    ("grader-json", "json.wasm"),
    ("grader-rubric", "rubric.wasm"),
    ("grader-pairwise-rubric", "pairwise-rubric.wasm"),
    ("dataset-jsonl", "jsonl.wasm"),
    ("runner-image", "image-runner.wasm"),
    ("runner-ssh", "ssh-runner.wasm"),
    ("runner-kubernetes", "kubernetes-runner.wasm"),
    // Shards in Slurm jobs (issue 19).
    ("runner-slurm", "slurm-runner.wasm"),
    ("fixture-hostile", "fixtures/hostile.wasm"),
    ("fixture-hostile-runner", "fixtures/hostile-runner.wasm"),
    ("fixture-hostile-dataset", "fixtures/hostile-dataset.wasm"),
    ("fixture-slow-info", "fixtures/slow-info.wasm"),
    ("fixture-core-module", "fixtures/core-module.wasm"),
    ("fixture-future-major", "fixtures/future-major.wasm"),
    ("fixture-unknown-world", "fixtures/unknown-world.wasm"),
    ("fixture-canary-grader", "fixtures/canary-grader.wasm"),
    ("fixture-hostile-pairwise", "fixtures/hostile-pairwise.wasm"),
    ("fixture-exec-grader", "fixtures/exec-grader.wasm"),
    ("fixture-http-grader", "fixtures/http-grader.wasm"),
    // Built against the frozen wit/released/0.1.0 (the WIT semver policy's proof).
    ("fixture-released-0-1-0", "fixtures/released-0-1-0.wasm"),
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask is in the workspace")
        .to_path_buf()
}

fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
}

/// Runs `command` to its end, saying what it runs and how long it took (CI's log then shows
/// where its time goes).
fn run(command: &mut Command) -> Result<()> {
    eprintln!("xtask: {command:?}");
    let started = std::time::Instant::now();
    let status = command
        .status()
        .with_context(|| format!("cannot start {command:?}"))?;
    eprintln!(
        "xtask: {:.1} s: {:?} {}",
        started.elapsed().as_secs_f64(),
        command.get_program(),
        command
            .get_args()
            .take(4)
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    if !status.success() {
        bail!("{command:?} failed with {status}");
    }
    Ok(())
}

/// Installs the wasm32-wasip2 target when rustup does not list it yet.
fn ensure_wasm_target() -> Result<()> {
    let output = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output();
    match output {
        Ok(out)
            if String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|l| l.trim() == WASM_TARGET) =>
        {
            Ok(())
        }
        Ok(_) => run(Command::new("rustup").args(["target", "add", WASM_TARGET])),
        Err(_) => {
            eprintln!("xtask: rustup not found; assuming the {WASM_TARGET} target is installed");
            Ok(())
        }
    }
}

fn build_plugins() -> Result<()> {
    build_plugins_checked(false)
}

/// [`build_plugins`]; with `lint`, each plugin's build is also its clippy (see [`linted`]),
/// as `cargo xtask test` builds them.
fn build_plugins_checked(lint: bool) -> Result<()> {
    for (package, out) in PLUGINS {
        build_plugin(package, out, lint)?;
    }
    // The Python and JavaScript examples, with their toolchains (issue 15).
    foreign::build_examples(&root())?;
    eprintln!(
        "xtask: plugins are in {}",
        root().join("plugins/dist").display()
    );
    Ok(())
}

/// Builds plugin `package` (release, wasm32-wasip2) and copies it to `plugins/dist/out`;
/// with `lint`, clippy-driver compiles it (see [`linted`]).
fn build_plugin(package: &str, out: &str, lint: bool) -> Result<()> {
    ensure_wasm_target()?;
    let plugins = root().join("plugins");
    let dist = plugins.join("dist");
    std::fs::create_dir_all(dist.join("fixtures"))?;
    let mut command = cargo();
    if lint {
        linted(&mut command);
    }
    run(command.current_dir(&plugins).args([
        "build",
        "--quiet",
        "--release",
        "--target",
        WASM_TARGET,
        "-p",
        package,
    ]))?;
    let built = plugins
        .join("target")
        .join(WASM_TARGET)
        .join("release")
        .join(format!("{}.wasm", package.replace('-', "_")));
    std::fs::copy(&built, dist.join(out))
        .with_context(|| format!("cannot copy {}", built.display()))?;
    Ok(())
}

/// The real MCP servers (and the published MCP client) the end-to-end tests use, installed from
/// their registries when missing: npm packages by the program they install.
const NPM_SERVERS: &[(&str, &str)] = &[
    (
        "mcp-server-everything",
        "@modelcontextprotocol/server-everything@2026.8.31",
    ),
    (
        "mcp-server-filesystem",
        "@modelcontextprotocol/server-filesystem@2026.8.31",
    ),
    // It declares Node >= 22.7.5 but its CLI runs on Node 20 (npm warns); 2.x needs 22.19.
    ("mcp-inspector", "@modelcontextprotocol/inspector@0.21.2"),
    // The agent CLIs the `claude-code` and `codex` clients drive (tests/tests/e2e/agent_clis.rs):
    // native binaries in their npm packages, run offline against the model gateway.
    ("claude", "@anthropic-ai/claude-code@2.1.328"),
    ("codex", "@openai/codex@0.169.0"),
];
const PYPI_SERVER: &str = "mcp-server-time==2026.10.19";

fn ensure_test_servers() -> Result<()> {
    let ok = |program: &str, args: &[&str]| {
        Command::new(program)
            .args(args)
            .output()
            .map(|o| o.status.success())
            .unwrap_or(false)
    };
    if !ok("python3", &["-c", "import mcp_server_time"]) {
        run(Command::new("python3").args(["-m", "pip", "install", "--quiet", PYPI_SERVER]))?;
    }
    for (program, package) in NPM_SERVERS {
        if !ok("sh", &["-c", &format!("command -v {program}")]) {
            run(Command::new("npm").args([
                "install",
                "--global",
                "--no-fund",
                "--no-audit",
                package,
            ]))?;
        }
    }
    Ok(())
}

/// The target of the static worker that runners place into machines without mst.
const STATIC_TARGET: &str = "x86_64-unknown-linux-musl";

/// What `cargo xtask test` builds and tests: the workspace, static (see [`build_for_tests`]),
/// with every feature, so that xtask's optional tasks are built, linted and tested too.
const TEST_BUILD: [&str; 4] = ["--workspace", "--all-features", "--target", STATIC_TARGET];

/// Builds everything the tests run, once, and returns the `mst` they drive. Built for musl:
/// that mst is static, so it is also the worker the Docker, ssh and Slurm runners place on
/// their machines (`worker_binary::find`), and wasmtime and the rest are compiled for one
/// target, not for the host's and again for musl. Built with the workspace's features, as
/// `cargo test` builds it, so the test step compiles nothing more (`--all-targets` also
/// proves the benchmarks still build). The Docker benchmarks reuse it.
pub(crate) fn build_for_tests() -> Result<PathBuf> {
    ensure_static_target()?;
    run(linted(&mut cargo())
        .current_dir(root())
        .args(["build", "--all-targets"])
        .args(TEST_BUILD))?;
    Ok(root().join("target").join(STATIC_TARGET).join("debug/mst"))
}

/// `command` (a cargo build or test of the workspace) with the workspace's own crates
/// compiled by clippy-driver, as `cargo clippy` runs it (`RUSTC_WORKSPACE_WRAPPER`), clippy's
/// warnings and rustc's as errors (`-D warnings`, passed as `cargo clippy -- -D warnings`
/// passes it). The test build is then also the host workspace's lint, and CI does not check
/// every dependency a second time for a separate `cargo clippy`. The plugins' builds are
/// linted the same way. Without clippy-driver beside
/// cargo the build goes on unlinted, and says so.
fn linted(command: &mut Command) -> &mut Command {
    let cargo = PathBuf::from(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    let driver = cargo.with_file_name("clippy-driver");
    if driver.is_file() {
        command.env("RUSTC_WORKSPACE_WRAPPER", driver).env(
            "CLIPPY_ARGS",
            "-D__CLIPPY_HACKERY__warnings__CLIPPY_HACKERY__",
        );
    } else {
        eprintln!(
            "xtask: no {} (rustup component add clippy): the test build is not linted",
            driver.display()
        );
    }
    command
}

/// Installs the musl target when missing, and musl-gcc: C dependencies (aws-lc) are compiled
/// for musl with Debian's musl-gcc.
fn ensure_static_target() -> Result<()> {
    let installed = Command::new("rustup")
        .args(["target", "list", "--installed"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(STATIC_TARGET))
        .unwrap_or(false);
    if !installed {
        run(Command::new("rustup").args(["target", "add", STATIC_TARGET]))?;
    }
    engines::ensure_packages(&[("musl-gcc", "musl-tools")])
}

/// Builds mst for musl (statically linked, so it runs in any Linux image) and puts it, without
/// debug info, at `target/debug/mst-static`, where a dynamically linked mst looks for it.
fn build_static_worker() -> Result<()> {
    ensure_static_target()?;
    run(cargo().current_dir(root()).args([
        "build",
        "-p",
        "mst",
        "--bin",
        "mst",
        "--target",
        STATIC_TARGET,
    ]))?;
    let built = root().join("target").join(STATIC_TARGET).join("debug/mst");
    let dest = root().join("target/debug/mst-static");
    std::fs::create_dir_all(dest.parent().expect("parent"))?;
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&dest)
        .arg(&built))
}

fn test() -> Result<()> {
    ensure_test_servers()?;
    build_plugins_checked(true)?;
    // The SDK and plugins' unit tests run natively, one package at a time for the same reason
    // they are built one at a time: each world feature of the SDK must stand alone.
    for package in std::iter::once("mst-sdk").chain(
        PLUGINS
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| !p.starts_with("fixture-")),
    ) {
        run(cargo()
            .current_dir(root().join("plugins"))
            .args(["test", "--quiet", "-p", package]))?;
    }
    // The end-to-end tests drive the built binary, and the Docker, ssh and Slurm tests place a
    // static one on their machines: one static build serves both.
    build_for_tests()?;
    // The local runner sandboxes its trials in bubblewrap by default.
    engines::ensure_packages(&[("bwrap", "bubblewrap")])?;
    // The ssh runner's tests start their own sshd servers on loopback.
    engines::ensure_packages(&[
        ("/usr/sbin/sshd", "openssh-server"),
        ("ssh", "openssh-client"),
    ])?;
    ensure_ssh_test_user();
    // The browser tests drive a real headless Chromium through chromedriver.
    engines::ensure_packages(&[
        ("/usr/bin/chromium", "chromium"),
        ("/usr/bin/chromedriver", "chromium-driver"),
    ])?;
    // The OCI tests (tests/tests/e2e/oci.rs) push to and pull from a real registry on loopback.
    engines::ensure_packages(&[
        ("/usr/bin/docker-registry", "docker-registry"),
        ("/usr/bin/htpasswd", "apache2-utils"),
    ])?;
    // The Slurm runner's tests start their own single-node cluster (tests/src/slurm.rs).
    engines::ensure_packages(&[
        ("/usr/sbin/slurmctld", "slurm-wlm"),
        ("/usr/sbin/munged", "munge"),
    ])?;
    let engines = engines::start(&root())?;
    let result = run(linted(&mut cargo())
        .current_dir(root())
        // Every failing suite is reported, not only the first.
        .args(["test", "--no-fail-fast"])
        .args(TEST_BUILD)
        .env("MST_TEST_DOCKER_A", &engines.endpoints[0])
        .env("MST_TEST_DOCKER_B", &engines.endpoints[1])
        .env("MST_TEST_IMAGE", engines::TEST_IMAGE)
        .env("MST_REQUIRE_DOCKER", "1")
        .env("MST_REQUIRE_SSHD", "1")
        .env("MST_REQUIRE_BROWSER", "1")
        .env("MST_REQUIRE_REGISTRY", "1")
        .env("MST_REQUIRE_SLURM", "1"));
    drop(engines);
    result
}

/// The account the ssh tests log in as (`tests/src/sshd.rs`): `/bin/sh` as its shell, so no
/// start-up file of the machine's own runs in their sessions. Made when running as root;
/// elsewhere the tests log in as the current user.
fn ensure_ssh_test_user() {
    const USER: &str = "mst-ssh-test";
    let exists = Command::new("id")
        .args(["-u", USER])
        .output()
        .is_ok_and(|o| o.status.success());
    if !exists {
        // `*`: no password, but not locked (sshd refuses locked accounts without PAM).
        let made = Command::new("useradd")
            .args(["--system", "--shell", "/bin/sh", "--password", "*"])
            .args(["--home-dir", "/nonexistent", "--no-create-home", USER])
            .status();
        if !made.is_ok_and(|s| s.success()) {
            eprintln!("xtask: cannot create {USER}; the ssh tests log in as the current user");
        }
    }
    // The docker tests reach engine A through sshd as this account, like a remote host's
    // `docker system dial-stdio`: the engines' sockets belong to group `docker`.
    let joined = Command::new("usermod")
        .args(["--append", "--groups", "docker", USER])
        .status();
    if !joined.is_ok_and(|s| s.success()) {
        eprintln!("xtask: cannot add {USER} to group docker; docker over ssh tests fail");
    }
}

/// Formatting and clippy (warnings are errors) for both workspaces.
/// The WIT versioning policy on `wit` (the live WIT and its `released/` copies).
#[cfg(feature = "wit")]
fn wit_policy(wit: &Path) -> Result<()> {
    for line in wit_semver::check(wit)? {
        eprintln!("xtask: WIT {line}");
    }
    Ok(())
}

/// Never called: `Task::feature` runs xtask again with `wit` first.
#[cfg(not(feature = "wit"))]
fn wit_policy(_: &Path) -> Result<()> {
    bail!("xtask was built without its `wit` feature")
}

/// The layering of `host/src` (see [`layers`]): the order in `docs/architecture.md`, every
/// path in `host/src` against it, and `lib.rs`'s module list; then no allowance of the lints
/// that hold the size rules ([`allowances`]). Reads files only: milliseconds.
fn check_layers() -> Result<()> {
    let root = root();
    let layers = layers::Layers::from_doc(&root.join("docs/architecture.md"))?;
    let violations = layers::check(&root.join("host/src"), &layers)?;
    for violation in &violations {
        eprintln!(
            "{}:{}: {}",
            violation.file.display(),
            violation.line,
            violation.message
        );
    }
    if !violations.is_empty() {
        bail!(
            "{} path(s) use a part that is not below their own; the layers, top first: {} \
             (docs/architecture.md). Move the code to the layer it belongs to.",
            violations.len(),
            layers.describe()
        );
    }
    layers::check_lib_doc(&root.join("host/src/lib.rs"), &layers)?;
    eprintln!("xtask: layers hold: {}", layers.describe());
    let allowed = allowances::check(&root)?;
    for line in &allowed {
        eprintln!("{line}");
    }
    if !allowed.is_empty() {
        bail!(
            "{} allowance(s) of a lint that holds a house rule (no function over 100 lines, \
             none over 7 arguments): split the function, or make its arguments a struct",
            allowed.len()
        );
    }
    Ok(())
}

/// The layering, the WIT policy, rustfmt, and clippy over both workspaces; with `clippy`
/// false, no clippy (CI: `cargo xtask test`'s builds of both workspaces run it, see
/// [`linted`]).
fn lint(clippy: bool) -> Result<()> {
    check_layers()?;
    // The live WIT against each released version: cheap, and the most important to see first.
    wit_policy(&root().join("wit"))?;
    ensure_wasm_target()?;
    run(cargo()
        .current_dir(root())
        .args(["fmt", "--all", "--", "--check"]))?;
    run(cargo()
        .current_dir(root().join("plugins"))
        .args(["fmt", "--all", "--", "--check"]))?;
    if !clippy {
        return Ok(());
    }
    run(cargo().current_dir(root()).args([
        "clippy",
        "--workspace",
        "--all-targets",
        "--all-features",
        "--",
        "-D",
        "warnings",
    ]))?;
    for (package, _) in PLUGINS {
        run(cargo().current_dir(root().join("plugins")).args([
            "clippy",
            "--quiet",
            "--release",
            "--target",
            WASM_TARGET,
            "-p",
            package,
            "--",
            "-D",
            "warnings",
        ]))?;
    }
    Ok(())
}

fn bench() -> Result<()> {
    build_plugins()?;
    run(cargo()
        .current_dir(root())
        .args(["bench", "-p", "mst", "--bench", "plugin_host"]))
}

/// The plugin the quick-start eval loads (`examples/quickstart/eval.json`'s `plugins`).
const QUICKSTART_PLUGIN: (&str, &str) = ("grader-contains", "contains.wasm");

/// `cargo xtask quickstart`: builds only what the quick-start eval runs (its one plugin, and
/// mst in the `quickstart` profile: dependencies unoptimised, no debug info, the fastest
/// first build), runs it on the local runner and lists the run.
fn quickstart() -> Result<()> {
    // The local runner sandboxes each trial in bubblewrap by default.
    engines::ensure_packages(&[("bwrap", "bubblewrap")])?;
    let (package, out) = QUICKSTART_PLUGIN;
    build_plugin(package, out, false)?;
    run(cargo()
        .current_dir(root())
        .args(["build", "--profile", "quickstart", "-p", "mst"]))?;
    let root = root();
    let mst = |args: &[&str]| {
        let mut command = Command::new(root.join("target/quickstart/mst"));
        command
            .current_dir(&root)
            .env("MST_HOME", root.join("target/quickstart-home"))
            .args(args);
        command
    };
    // Exit 1 is the expected verdict: the `echo-only` variant fails two cases on purpose.
    let status = mst(&["run", "--config", "examples/quickstart/eval.json"]).status()?;
    match status.code() {
        Some(0) | Some(1) => {}
        _ => bail!("the quick-start eval did not complete ({status})"),
    }
    run(&mut mst(&["runs", "list"]))?;
    eprintln!(
        "xtask: quick start done: the baseline passes every case, echo-only fails two (exit 1 \
         is its verdict). mst is at target/quickstart/mst; `cargo xtask plugins` builds every \
         other plugin"
    );
    Ok(())
}

/// Peak resident set of the largest child process waited for so far, in KiB.
fn children_peak_rss_kib() -> i64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage);
        usage.ru_maxrss
    }
}

/// `cargo xtask bench run`: end-to-end eval throughput with the `command` client running `cat`
/// and with the `api` client on `mock/echo`.
fn bench_run() -> Result<()> {
    build_plugins()?;
    // `MST_BENCH_MST=PATH` measures another build (an older commit's, for a before/after
    // comparison) against the same plugins and inputs.
    let mst = match std::env::var_os("MST_BENCH_MST") {
        Some(path) => PathBuf::from(path),
        None => {
            run(cargo()
                .current_dir(root())
                .args(["build", "--release", "-p", "mst"]))?;
            root().join("target/release/mst")
        }
    };
    let contains = root().join("plugins/dist/contains.wasm");

    // What the client's own process costs: spawning `cat` and feeding it a line.
    let spawns = 500;
    let started = std::time::Instant::now();
    for _ in 0..spawns {
        let mut child = Command::new("cat")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()?;
        std::io::Write::write_all(child.stdin.as_mut().expect("piped"), b"question\n")?;
        drop(child.stdin.take());
        child.wait_with_output()?;
    }
    let per_spawn = started.elapsed().as_secs_f64() / f64::from(spawns);
    println!(
        "client baseline: spawning `cat` with one line of input takes {:.3} ms",
        per_spawn * 1e3
    );

    // The same eval with each client: `command` running `cat`, and the `api` client's agent
    // loop on the built-in `mock/echo` model (no process, no network).
    let clients = [
        (
            "command `cat`",
            r#""client":"command","clientOptions":{"command":["cat"]}"#,
            per_spawn,
        ),
        (
            "api on mock/echo",
            r#""client":"api","model":"mock/echo""#,
            0.0,
        ),
    ];
    for (label, client, baseline) in clients {
        for n in [1_000usize, 10_000] {
            bench_eval(&mst, &contains, label, client, n, baseline)?;
        }
    }
    Ok(())
}

/// Runs an `n`-case eval with `client` (config fields) and prints its throughput, its
/// overhead per trial beyond `baseline` seconds (what the client itself costs), and peak RSS.
fn bench_eval(
    mst: &Path,
    contains: &Path,
    label: &str,
    client: &str,
    n: usize,
    baseline: f64,
) -> Result<()> {
    let dir = tempfile_dir("mst-bench")?;
    let cases: String = (0..n)
        .map(|i| {
            format!("{{\"id\":\"c{i}\",\"input\":\"answer {i}\",\"expected\":\"answer {i}\"}}\n")
        })
        .collect();
    std::fs::write(dir.join("cases.jsonl"), cases)?;
    let config = format!(
        r#"{{"name":"bench","datasets":["cases.jsonl"],{client},
            "judges":[{{"plugin":"mst/grader/contains"}}],"plugins":["{}"],"concurrency":1,"timeout":30}}"#,
        contains.display()
    );
    std::fs::write(dir.join("eval.json"), config)?;
    // Measured in a fresh xtask process, so that the peak RSS covers mst's processes only
    // (not the cargo and rustc processes this one ran).
    let output = Command::new(std::env::current_exe()?)
        .args([
            "__measure",
            mst.to_str().context("non-UTF-8 path")?,
            dir.to_str().context("non-UTF-8 path")?,
        ])
        .output()?;
    if !output.status.success() {
        bail!(
            "the {n}-trial bench run ({label}) failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let measured = String::from_utf8_lossy(&output.stdout);
    let mut fields = measured.split_whitespace();
    let elapsed: f64 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .context("no elapsed time")?;
    let peak_kib: f64 = fields
        .next()
        .and_then(|f| f.parse().ok())
        .context("no peak RSS")?;
    let overhead = elapsed / n as f64 - baseline;
    println!(
        "{label:>17}, {n:>6} trials: {elapsed:>7.2} s, {:>7.1} trials/s, overhead {:.3} ms/trial \
         beyond the client, peak RSS of the largest mst process {:.1} MiB",
        n as f64 / elapsed,
        overhead * 1e3,
        peak_kib / 1024.0
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// `xtask __measure MST DIR`: runs the eval in DIR, prints "seconds peak-RSS-KiB".
fn measure(mst: &str, dir: &str) -> Result<()> {
    let started = std::time::Instant::now();
    let status = Command::new(mst)
        .current_dir(dir)
        .env("MST_HOME", Path::new(dir).join("home"))
        .args(["run", "--config", "eval.json", "--quiet"])
        .stdout(std::process::Stdio::null())
        .status()?;
    let elapsed = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!("mst run failed ({status})");
    }
    println!("{elapsed} {}", children_peak_rss_kib());
    Ok(())
}

/// The median of `values` (the upper one of an even count); `values` must not be empty.
fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values[values.len() / 2]
}

/// A fresh scratch directory named after `prefix` and this process.
fn tempfile_dir(prefix: &str) -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("{prefix}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// `cargo xtask bench report`'s entry, which needs the `browser` feature (see [`task::Task::feature`]).
#[cfg(feature = "browser")]
fn bench_report() -> Result<()> {
    bench_report::bench()
}

/// Never called: `Task::feature` runs xtask again with `browser` first.
#[cfg(not(feature = "browser"))]
fn bench_report() -> Result<()> {
    bail!("xtask was built without its `browser` feature")
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let task = match task::Task::parse(&args, &root()) {
        Ok(task) => task,
        Err(error) => {
            eprintln!("cargo xtask: {error}\n{}", task::usage());
            std::process::exit(2)
        }
    };
    if let Some(feature) = task.feature().filter(|f| !task::compiled_in(f)) {
        // Built lean (the quick start's xtask): run again with what this task needs.
        let status = cargo()
            .current_dir(root())
            .args(["run", "--quiet", "-p", "xtask", "--features", feature, "--"])
            .args(&args)
            .status()
            .context("cannot run cargo")?;
        std::process::exit(status.code().unwrap_or(1));
    }
    run_task(task)
}

/// Does `task`.
fn run_task(task: task::Task) -> Result<()> {
    use task::{Bench, Task};
    match task {
        Task::Quickstart => quickstart(),
        Task::Plugins => build_plugins(),
        Task::Test => test(),
        Task::Lint { clippy } => lint(clippy),
        Task::Layers => check_layers(),
        Task::Wit(dir) => wit_policy(&dir),
        Task::Bench(Bench::PluginHost) => bench(),
        Task::Bench(Bench::Run) => bench_run(),
        Task::Bench(Bench::Docker) => bench_docker::bench(),
        Task::Bench(Bench::Serve) => bench_serve::bench(),
        Task::Bench(Bench::Report) => bench_report(),
        Task::Bench(Bench::Peers) => bench_peers::bench(),
        Task::Bench(Bench::Tools) => bench_tools::bench(),
        Task::BenchScale(args) => bench_scale::bench(&args),
        Task::Worker => build_static_worker(),
        Task::Engines => {
            // For working on the Docker tests by hand: the engines `cargo xtask test` uses,
            // until Enter is pressed.
            let engines = engines::start(&root())?;
            println!("export MST_TEST_DOCKER_A={}", engines.endpoints[0]);
            println!("export MST_TEST_DOCKER_B={}", engines.endpoints[1]);
            println!("export MST_TEST_IMAGE={}", engines::TEST_IMAGE);
            let _ = std::io::stdin().read_line(&mut String::new());
            Ok(())
        }
        Task::Seccomp => seccomp::generate(
            Path::new("/usr/include/x86_64-linux-gnu/asm/unistd_64.h"),
            &root().join("docker/seccomp.json"),
        ),
        Task::Measure { mst, dir } => measure(&mst, &dir),
    }
}
