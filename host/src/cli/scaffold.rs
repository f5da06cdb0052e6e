//! `mst plugin new`: a plugin project that builds on its own, with the WIT package of this mst
//! release (and for Rust, the SDK) vendored into it: the SDK is not on crates.io, and vendoring
//! pins the ABI the plugin was written against. Rust templates are below; the Python and
//! JavaScript ones are files in `scaffold/`, which `cargo xtask plugins` also reads for the
//! toolchain versions it installs (one pin for templates, examples and tests).

use anyhow::{bail, Context, Result};
use std::path::Path;

/// The SDK sources and WIT package, as compiled into this mst.
const SDK_FILES: &[(&str, &str)] = &[
    (
        "src/lib.rs",
        include_str!("../../../plugins/sdk/src/lib.rs"),
    ),
    (
        "src/options.rs",
        include_str!("../../../plugins/sdk/src/options.rs"),
    ),
    (
        "src/verdict.rs",
        include_str!("../../../plugins/sdk/src/verdict.rs"),
    ),
    (
        "src/grader.rs",
        include_str!("../../../plugins/sdk/src/grader.rs"),
    ),
    (
        "src/pairwise.rs",
        include_str!("../../../plugins/sdk/src/pairwise.rs"),
    ),
    (
        "src/dataset.rs",
        include_str!("../../../plugins/sdk/src/dataset.rs"),
    ),
    (
        "src/runner.rs",
        include_str!("../../../plugins/sdk/src/runner.rs"),
    ),
    ("wit/types.wit", include_str!("../../../wit/types.wit")),
    ("wit/host.wit", include_str!("../../../wit/host.wit")),
    ("wit/grader.wit", include_str!("../../../wit/grader.wit")),
    ("wit/dataset.wit", include_str!("../../../wit/dataset.wit")),
    ("wit/runner.wit", include_str!("../../../wit/runner.wit")),
];

/// The SDK's manifest outside the mst repository (no workspace inheritance).
const SDK_MANIFEST: &str = r#"[package]
name = "mst-sdk"
version = "0.1.0"
edition = "2021"
license = "Apache-2.0"
publish = false

[features]
grader = []
pairwise = []
dataset = []
runner = []

[dependencies]
mst-argv-patterns = { path = "argv" }
wit-bindgen = { version = "0.61", default-features = false, features = ["macros", "realloc", "std"] }
serde = { version = "1", features = ["derive"] }
serde_json = "1"
"#;

/// The host's argv matcher, which the SDK re-exports (`mst_sdk::argv`), vendored beside it:
/// its manifest and its one source file.
const ARGV_MANIFEST: &str = r#"[package]
name = "mst-argv-patterns"
version = "0.1.0"
edition = "2021"
license = "Apache-2.0"
publish = false
"#;
const ARGV_LIB: &str = include_str!("../../../argv-patterns/src/lib.rs");

const GRADER_MANIFEST: &str = r#"[package]
name = "{name}"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
crate-type = ["cdylib", "rlib"]

[dependencies]
mst-sdk = { path = "mst-sdk", features = ["grader"] }
serde = { version = "1", features = ["derive"] }
serde_json = "1"

# A standalone project, not part of any enclosing workspace.
[workspace]

[profile.release]
opt-level = "s"
lto = true
codegen-units = 1
strip = true
"#;

const GRADER_LIB: &str = r##"//! `{plugin}`: passes when the final answer equals the expected text, ignoring surrounding
//! white space. Replace `grade` with your own logic.

use mst_sdk::grader::{self, ErrorCode, Grader, PluginError, PluginInfo, Score, Trial};
use serde::Deserialize;

pub struct Plugin;

/// Options from the eval config; unknown keys are errors.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    /// The expected answer; defaults to the case's `expected` string.
    expected: Option<String>,
}

impl Grader for Plugin {
    fn info() -> PluginInfo {
        grader::info("{plugin}", env!("CARGO_PKG_VERSION"), "Exact match on the final answer")
    }

    fn grade(options: &str, trial: Trial) -> Result<Score, PluginError> {
        let options: Options = grader::options(options)?;
        let expected = match options.expected {
            Some(text) => text,
            None => trial
                .case
                .expected
                .as_deref()
                .and_then(|e| serde_json::from_str::<String>(e).ok())
                .ok_or_else(|| grader::error(ErrorCode::InvalidOptions, "set `expected`, or give the case an expected string"))?,
        };
        let answer = grader::final_text(&trial).trim();
        if answer == expected.trim() {
            Ok(grader::score(1.0, "exact match"))
        } else {
            Ok(grader::score(0.0, format!("expected {expected:?}, got {answer:?}")))
        }
    }
}

mst_sdk::export_grader!(Plugin);

#[cfg(test)]
mod tests {
    use super::*;
    use mst_sdk::grader::testing::trial;

    #[test]
    fn exact_match_passes() {
        let score = Plugin::grade(r#"{"expected": "42"}"#, trial("c1", " 42\n")).unwrap();
        assert_eq!(score.value, 1.0);
    }

    #[test]
    fn other_answers_fail() {
        let score = Plugin::grade(r#"{"expected": "42"}"#, trial("c1", "41")).unwrap();
        assert_eq!(score.value, 0.0);
    }
}
"##;

const README: &str = r#"# {plugin}

An mst grader. Build it as a WebAssembly component and check it fits your mst:

```
rustup target add wasm32-wasip2
cargo build --release --target wasm32-wasip2
mst plugin check target/wasm32-wasip2/release/{crate}.wasm
mst plugin grade target/wasm32-wasip2/release/{crate}.wasm --answer 42 --expected '"42"'
mst plugin install target/wasm32-wasip2/release/{crate}.wasm
```

Unit tests run natively: `cargo test`. `mst-sdk/` is the SDK and WIT package of the mst
release that created this project.
"#;

/// The Python template (componentize-py): its files, with `{…}` placeholders.
const PYTHON_FILES: &[(&str, &str)] = &[
    ("app.py", include_str!("scaffold/python/app.py")),
    ("build.sh", include_str!("scaffold/python/build.sh")),
    (
        "requirements.txt",
        include_str!("scaffold/python/requirements.txt"),
    ),
    ("README.md", include_str!("scaffold/python/README.md")),
    (".gitignore", "/.venv\n/wit_world\n/*.wasm\n__pycache__/\n"),
];

/// The JavaScript template (ComponentizeJS): its files, with `{…}` placeholders.
const JS_FILES: &[(&str, &str)] = &[
    ("grader.js", include_str!("scaffold/js/grader.js")),
    ("package.json", include_str!("scaffold/js/package.json")),
    ("README.md", include_str!("scaffold/js/README.md")),
    (".gitignore", "/node_modules\n/*.wasm\n"),
];

/// The language of a new plugin project.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Lang {
    /// Rust, with the mst SDK (`cargo build --target wasm32-wasip2`).
    #[default]
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with ComponentizeJS.
    Js,
}

/// What `mst plugin new` made: how to build it and where the component lands.
#[derive(Debug)]
pub(crate) struct Project {
    /// The command that builds the component, run in the project's directory.
    pub build: &'static str,
    /// The built component, relative to the project's directory.
    pub artifact: String,
}

fn valid_project_name(name: &str) -> bool {
    name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.ends_with('-')
        && name.len() <= 64
}

/// Writes a new grader project for `namespace/grader/name` in `lang` into `dir`, which must
/// not exist.
pub(crate) fn new_grader(dir: &Path, namespace: &str, name: &str, lang: Lang) -> Result<Project> {
    if !valid_project_name(name) {
        bail!("`{name}` is not a plugin name: use lowercase letters, digits and dashes, starting with a letter");
    }
    if !valid_project_name(namespace) {
        bail!("--namespace `{namespace}`: use lowercase letters, digits and dashes, starting with a letter");
    }
    if dir.exists() {
        bail!(
            "{} already exists; choose another --dir or remove it",
            dir.display()
        );
    }
    let plugin = format!("{namespace}/grader/{name}");
    let fill = |template: &str| {
        template
            .replace("{name}", name)
            .replace("{plugin}", &plugin)
            .replace("{crate}", &name.replace('-', "_"))
    };
    let template = |files: &[(&str, &str)]| -> Vec<(String, String)> {
        files
            .iter()
            .map(|(path, text)| (path.to_string(), fill(text)))
            .collect()
    };
    // The WIT package alone, as the SDK vendors it, for the toolchains that read WIT.
    let wit = || {
        SDK_FILES
            .iter()
            .filter(|(path, _)| path.starts_with("wit/"))
            .map(|(path, text)| (path.to_string(), text.to_string()))
    };
    let (files, project) = match lang {
        Lang::Rust => {
            let mut files: Vec<(String, String)> = vec![
                ("Cargo.toml".into(), fill(GRADER_MANIFEST)),
                ("src/lib.rs".into(), fill(GRADER_LIB)),
                ("README.md".into(), fill(README)),
                (".gitignore".into(), "/target\n".into()),
                ("mst-sdk/Cargo.toml".into(), SDK_MANIFEST.into()),
                ("mst-sdk/argv/Cargo.toml".into(), ARGV_MANIFEST.into()),
                ("mst-sdk/argv/src/lib.rs".into(), ARGV_LIB.into()),
            ];
            files.extend(
                SDK_FILES
                    .iter()
                    .map(|(path, text)| (format!("mst-sdk/{path}"), text.to_string())),
            );
            let project = Project {
                build: "cargo build --release --target wasm32-wasip2",
                artifact: format!(
                    "target/wasm32-wasip2/release/{}.wasm",
                    name.replace('-', "_")
                ),
            };
            (files, project)
        }
        Lang::Python => {
            let mut files = template(PYTHON_FILES);
            files.extend(wit());
            let project = Project {
                build: "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && PATH=\"$PWD/.venv/bin:$PATH\" sh build.sh",
                artifact: format!("{name}.wasm"),
            };
            (files, project)
        }
        Lang::Js => {
            let mut files = template(JS_FILES);
            files.extend(wit());
            let project = Project {
                build: "npm install && npm run build",
                artifact: format!("{name}.wasm"),
            };
            (files, project)
        }
    };
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("files have a parent"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(project)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sdk_source_is_vendored() {
        let sdk = Path::new(env!("CARGO_MANIFEST_DIR")).join("../plugins/sdk/src");
        for entry in std::fs::read_dir(sdk).unwrap() {
            let name = format!("src/{}", entry.unwrap().file_name().to_string_lossy());
            assert!(
                SDK_FILES.iter().any(|(path, _)| *path == name),
                "{name} is not in SDK_FILES"
            );
        }
    }

    #[test]
    fn refuses_bad_names_and_existing_dirs() {
        let tmp = tempfile::tempdir().unwrap();
        assert!(new_grader(&tmp.path().join("x"), "local", "Bad_Name", Lang::Rust).is_err());
        assert!(new_grader(tmp.path(), "local", "ok", Lang::Python)
            .unwrap_err()
            .to_string()
            .contains("already exists"));
    }

    #[test]
    fn writes_a_complete_project() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("exact");
        new_grader(&dir, "acme", "exact", Lang::Rust).unwrap();
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("\"acme/grader/exact\""));
        for file in [
            "Cargo.toml",
            "mst-sdk/Cargo.toml",
            "mst-sdk/src/grader.rs",
            "mst-sdk/wit/types.wit",
            "mst-sdk/argv/src/lib.rs",
        ] {
            assert!(dir.join(file).is_file(), "{file}");
        }
    }

    #[test]
    fn python_and_js_projects_get_the_wit_package_and_their_names() {
        let tmp = tempfile::tempdir().unwrap();
        for (lang, source) in [(Lang::Python, "app.py"), (Lang::Js, "grader.js")] {
            let dir = tmp.path().join(format!("{lang:?}"));
            let project = new_grader(&dir, "acme", "exact-answer", lang).unwrap();
            assert_eq!(project.artifact, "exact-answer.wasm");
            let text = std::fs::read_to_string(dir.join(source)).unwrap();
            assert!(text.contains("\"acme/grader/exact-answer\""), "{source}");
            for file in [
                "README.md",
                "wit/types.wit",
                "wit/grader.wit",
                "wit/host.wit",
            ] {
                assert!(dir.join(file).is_file(), "{lang:?}: {file}");
            }
            // No placeholder is left unfilled.
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                if entry.path().is_file() {
                    let text = std::fs::read_to_string(entry.path()).unwrap();
                    for token in ["{name}", "{plugin}", "{crate}"] {
                        assert!(!text.contains(token), "{:?}: {token}", entry.path());
                    }
                }
            }
        }
    }
}
