//! `cargo xtask`: the project's build and test entry points, so that a fresh machine needs only
//! cargo and rustup.
//!
//! - `cargo xtask plugins`: build the guest SDK's plugins and test fixtures to `plugins/dist/`.
//! - `cargo xtask test`: plugins, then every test (plugin unit tests natively, host, end to end).
//! - `cargo xtask bench`: plugins, then the benchmarks, which print their figures.
//! - `cargo xtask lint`: rustfmt and clippy (warnings are errors) over both workspaces.
//! - `cargo xtask quickstart`: plugins, then a tour of the plugin commands on the first-party
//!   `contains` grader.

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
    ("dataset-jsonl", "jsonl.wasm"),
    ("fixture-hostile", "fixtures/hostile.wasm"),
    ("fixture-core-module", "fixtures/core-module.wasm"),
    ("fixture-future-major", "fixtures/future-major.wasm"),
    ("fixture-unknown-world", "fixtures/unknown-world.wasm"),
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

fn run(command: &mut Command) -> Result<()> {
    eprintln!("xtask: {command:?}");
    let status = command
        .status()
        .with_context(|| format!("cannot start {command:?}"))?;
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
    ensure_wasm_target()?;
    let plugins = root().join("plugins");
    let dist = plugins.join("dist");
    std::fs::create_dir_all(dist.join("fixtures"))?;
    for (package, out) in PLUGINS {
        run(cargo().current_dir(&plugins).args([
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
    }
    eprintln!("xtask: plugins are in {}", dist.display());
    Ok(())
}

fn test() -> Result<()> {
    build_plugins()?;
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
    // The end-to-end tests drive the built binary.
    run(cargo().current_dir(root()).args(["build", "-p", "mst"]))?;
    run(cargo().current_dir(root()).args(["test", "--workspace"]))
}

/// Formatting and clippy (warnings are errors) for both workspaces.
fn lint() -> Result<()> {
    ensure_wasm_target()?;
    run(cargo()
        .current_dir(root())
        .args(["fmt", "--all", "--", "--check"]))?;
    run(cargo()
        .current_dir(root().join("plugins"))
        .args(["fmt", "--all", "--", "--check"]))?;
    run(cargo().current_dir(root()).args([
        "clippy",
        "--workspace",
        "--all-targets",
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

fn quickstart() -> Result<()> {
    build_plugins()?;
    run(cargo().current_dir(root()).args(["build", "-p", "mst"]))?;
    let root = root();
    let home = root.join("target/quickstart-home");
    let mst = |args: &[&str]| {
        let mut command = Command::new(root.join("target/debug/mst"));
        command.current_dir(&root).env("MST_HOME", &home).args(args);
        command
    };
    run(&mut mst(&["plugin", "check", "plugins/dist/contains.wasm"]))?;
    for plugin in ["contains", "json", "jsonl"] {
        run(&mut mst(&[
            "plugin",
            "install",
            &format!("plugins/dist/{plugin}.wasm"),
        ]))?;
    }
    run(&mut mst(&["plugin", "list"]))?;
    run(&mut mst(&[
        "plugin",
        "resolve",
        "mst/dataset/jsonl",
        "--file",
        "examples/quickstart/cases.jsonl",
    ]))?;
    let trial = "examples/quickstart/trial.json";
    run(&mut mst(&[
        "plugin",
        "grade",
        "mst/grader/contains",
        "--trial",
        trial,
    ]))?;
    run(&mut mst(&[
        "plugin",
        "grade",
        "mst/grader/json",
        "--trial",
        trial,
        "--options",
        r#"{"path": "$.timezone", "equals": "Asia/Tokyo"}"#,
    ]))?;
    eprintln!(
        "xtask: quick start done; its MST_HOME is {}",
        home.display()
    );
    Ok(())
}

fn main() -> Result<()> {
    let task = std::env::args().nth(1).unwrap_or_default();
    match task.as_str() {
        "plugins" => build_plugins(),
        "test" => test(),
        "bench" => bench(),
        "quickstart" => quickstart(),
        "lint" => lint(),
        _ => {
            eprintln!("usage: cargo xtask <plugins|test|bench|quickstart|lint>");
            std::process::exit(2)
        }
    }
}
