//! `mst plugin new`: a plugin project that builds on its own, with the SDK and the WIT package
//! of this mst release vendored into it (the SDK is not on crates.io, and vendoring pins the
//! ABI the plugin was written against).

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
wit-bindgen = { version = "0.61", default-features = false, features = ["macros", "realloc", "std"] }
serde = { version = "1", features = ["derive"] }
serde_json = "1"
"#;

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

fn valid_project_name(name: &str) -> bool {
    name.bytes().next().is_some_and(|b| b.is_ascii_lowercase())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.ends_with('-')
        && name.len() <= 64
}

/// Writes a new grader project for `namespace/grader/name` into `dir`, which must not exist.
pub(crate) fn new_grader(dir: &Path, namespace: &str, name: &str) -> Result<()> {
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
    let mut files: Vec<(String, String)> = vec![
        ("Cargo.toml".into(), fill(GRADER_MANIFEST)),
        ("src/lib.rs".into(), fill(GRADER_LIB)),
        ("README.md".into(), fill(README)),
        (".gitignore".into(), "/target\n".into()),
        ("mst-sdk/Cargo.toml".into(), SDK_MANIFEST.into()),
    ];
    files.extend(
        SDK_FILES
            .iter()
            .map(|(path, text)| (format!("mst-sdk/{path}"), text.to_string())),
    );
    for (path, text) in files {
        let path = dir.join(path);
        std::fs::create_dir_all(path.parent().expect("files have a parent"))
            .with_context(|| format!("cannot create {}", dir.display()))?;
        std::fs::write(&path, text).with_context(|| format!("cannot write {}", path.display()))?;
    }
    Ok(())
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
        assert!(new_grader(&tmp.path().join("x"), "local", "Bad_Name").is_err());
        assert!(new_grader(tmp.path(), "local", "ok")
            .unwrap_err()
            .to_string()
            .contains("already exists"));
    }

    #[test]
    fn writes_a_complete_project() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("exact");
        new_grader(&dir, "acme", "exact").unwrap();
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).unwrap();
        assert!(lib.contains("\"acme/grader/exact\""));
        for file in [
            "Cargo.toml",
            "mst-sdk/Cargo.toml",
            "mst-sdk/src/grader.rs",
            "mst-sdk/wit/types.wit",
        ] {
            assert!(dir.join(file).is_file(), "{file}");
        }
    }
}
