//! Plugins written in Python and JavaScript (`examples/plugins/`): their toolchains, installed
//! into `target/toolchains/` when missing (a venv with componentize-py, an npm prefix with
//! ComponentizeJS), and their builds into `plugins/dist/examples/`.
//!
//! The versions are those of `mst plugin new`'s templates (`host/src/cli/scaffold/`), read from
//! there: the examples, the templates and the tests that build a new project all use one pin.

use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A toolchain a foreign plugin is built with.
#[derive(Clone, Copy)]
enum Toolchain {
    /// componentize-py, from PyPI.
    Python,
    /// ComponentizeJS, from npm.
    Js,
}

/// An example plugin: its directory below `examples/plugins/`, its source, world and output
/// below `plugins/dist/`.
struct Example {
    dir: &'static str,
    toolchain: Toolchain,
    /// The Python module or the JavaScript file.
    source: &'static str,
    world: &'static str,
    out: &'static str,
}

const EXAMPLES: &[Example] = &[
    Example {
        dir: "python-grader",
        toolchain: Toolchain::Python,
        source: "app",
        world: "grader",
        out: "examples/answer-py.wasm",
    },
    Example {
        dir: "python-dataset",
        toolchain: Toolchain::Python,
        source: "app",
        world: "dataset",
        out: "examples/csv-py.wasm",
    },
    Example {
        dir: "js-grader",
        toolchain: Toolchain::Js,
        source: "grader.js",
        world: "grader",
        out: "examples/keywords-js.wasm",
    },
];

/// `target/toolchains/` (below `$CARGO_TARGET_DIR` when set), where the tests look too.
pub fn toolchains_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("toolchains")
}

/// The pinned `componentize-py==X` requirement of the Python template.
fn python_pin(root: &Path) -> Result<String> {
    let path = root.join("host/src/cli/scaffold/python/requirements.txt");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("componentize-py=="))
        .map(str::to_string)
        .with_context(|| format!("{} pins no componentize-py==VERSION", path.display()))
}

/// The pinned `@bytecodealliance/componentize-js@X` of the JavaScript template.
fn js_pin(root: &Path) -> Result<String> {
    let path = root.join("host/src/cli/scaffold/js/package.json");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let json: serde_json::Value =
        serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    const PACKAGE: &str = "@bytecodealliance/componentize-js";
    let version = json["devDependencies"][PACKAGE]
        .as_str()
        .with_context(|| format!("{} pins no {PACKAGE}", path.display()))?;
    Ok(format!("{PACKAGE}@{version}"))
}

/// Output of `program args`, or `None` when it cannot run or fails.
fn output(program: &Path, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The `componentize-py` program, installed at its pinned version when missing or different.
pub fn ensure_componentize_py(root: &Path) -> Result<PathBuf> {
    let pin = python_pin(root)?;
    let version = pin.trim_start_matches("componentize-py==");
    let venv = toolchains_dir(root).join("python");
    let program = venv.join("bin/componentize-py");
    let installed = output(&program, &["--version"]);
    if installed.is_some_and(|v| v.split_whitespace().last() == Some(version)) {
        return Ok(program);
    }
    if !venv.join("bin/pip").is_file() {
        super::run(Command::new("python3").arg("-m").arg("venv").arg(&venv))?;
    }
    super::run(
        Command::new(venv.join("bin/pip"))
            .args(["install", "--quiet", "--disable-pip-version-check"])
            .arg(&pin),
    )?;
    Ok(program)
}

/// The `componentize-js` program, installed at its pinned version when missing or different.
pub fn ensure_componentize_js(root: &Path) -> Result<PathBuf> {
    let pin = js_pin(root)?;
    let version = pin.rsplit('@').next().expect("rsplit yields one item");
    let prefix = toolchains_dir(root).join("node");
    let program = prefix.join("node_modules/.bin/componentize-js");
    if output(&program, &["--version"]).is_some_and(|v| v.trim() == version) {
        return Ok(program);
    }
    // A fresh prefix: npm keeps what an earlier install left beside the new version, and
    // its hoisting then mixes versions of shared dependencies.
    if prefix.exists() {
        std::fs::remove_dir_all(&prefix)
            .with_context(|| format!("cannot remove {}", prefix.display()))?;
    }
    super::run(
        Command::new("npm")
            .args(["install", "--no-fund", "--no-audit", "--prefix"])
            .arg(&prefix)
            .arg(&pin),
    )?;
    Ok(program)
}

/// Builds every example into `plugins/dist/examples/`, installing the toolchains first.
pub fn build_examples(root: &Path) -> Result<()> {
    let python = ensure_componentize_py(root)?;
    let js = ensure_componentize_js(root)?;
    std::fs::create_dir_all(root.join("plugins/dist/examples"))?;
    for example in EXAMPLES {
        let source = root.join("examples/plugins").join(example.dir);
        let out = root.join("plugins/dist").join(example.out);
        let mut command = match example.toolchain {
            Toolchain::Python => {
                // componentize-py finds the module on its working directory's path.
                let mut command = Command::new(&python);
                command
                    .current_dir(&source)
                    .arg("-d")
                    .arg(root.join("wit"))
                    .args(["-w", example.world, "componentize", example.source, "-o"])
                    .arg(&out);
                command
            }
            Toolchain::Js => {
                let mut command = Command::new(&js);
                command
                    .arg(source.join(example.source))
                    .arg("--wit")
                    .arg(root.join("wit"))
                    .args(["--world-name", example.world])
                    .args(["--disable", "http", "fetch-event", "-o"])
                    .arg(&out);
                command
            }
        };
        super::run(&mut command)?;
        if !out.is_file() {
            bail!("{} did not produce {}", example.dir, out.display());
        }
    }
    Ok(())
}
