//! The lints that hold the house rules cannot be allowed away: an `allow` or `expect` of
//! `clippy::too_many_lines` or `clippy::too_many_arguments` anywhere in the repository's Rust
//! is a violation (CONTRIBUTING.md, "Rules the checks hold"). Reads files only.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The lints whose `allow` is refused.
const HELD: [&str; 2] = ["clippy::too_many_lines", "clippy::too_many_arguments"];

/// The folders searched, below the repository's root.
const FOLDERS: [&str; 4] = ["host", "tests", "xtask", "plugins"];

/// Each `file:line` (relative to `root`) that allows a held lint, with the line.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for folder in FOLDERS {
        for file in rust_files(&root.join(folder))? {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            for (number, line) in text.lines().enumerate() {
                if allows_held_lint(line) {
                    let shown = file.strip_prefix(root).unwrap_or(&file);
                    found.push(format!(
                        "{}:{}: {}",
                        shown.display(),
                        number + 1,
                        line.trim()
                    ));
                }
            }
        }
    }
    Ok(found)
}

/// Whether `line` is an attribute allowing (or expecting) one of [`HELD`].
fn allows_held_lint(line: &str) -> bool {
    let line = line.trim_start();
    let attribute = line.starts_with("#[") || line.starts_with("#![");
    let allows = line.contains("allow(") || line.contains("expect(");
    attribute && allows && HELD.iter().any(|lint| line.contains(lint))
}

/// The `.rs` files below `dir`, skipping build output (`target/`).
fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
        };
        for entry in entries {
            let path = entry?.path();
            if path.is_dir() && !path.ends_with("target") && !path.ends_with("node_modules") {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_of_a_held_lint_is_found_anywhere_else_is_not() {
        assert!(allows_held_lint("    #[allow(clippy::too_many_arguments)]"));
        assert!(allows_held_lint(
            "#![allow(dead_code, clippy::too_many_lines)]"
        ));
        assert!(allows_held_lint("#[expect(clippy::too_many_lines)]"));
        assert!(!allows_held_lint("#[allow(clippy::large_enum_variant)]"));
        assert!(!allows_held_lint(
            "// never #[allow(clippy::too_many_lines)]"
        ));
        assert!(!allows_held_lint("#![warn(clippy::too_many_lines)]"));
    }

    #[test]
    fn files_are_named_with_their_line() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("host/src");
        std::fs::create_dir_all(&src).unwrap();
        std::fs::create_dir_all(dir.path().join("plugins/target")).unwrap();
        std::fs::write(
            src.join("a.rs"),
            "fn a() {}\n#[allow(clippy::too_many_arguments)]\nfn b() {}\n",
        )
        .unwrap();
        std::fs::write(
            dir.path().join("plugins/target/gen.rs"),
            "#[allow(clippy::too_many_lines)]\n",
        )
        .unwrap();
        assert_eq!(
            check(dir.path()).unwrap(),
            ["host/src/a.rs:2: #[allow(clippy::too_many_arguments)]"]
        );
    }
}
