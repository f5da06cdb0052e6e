//! The lints that hold the house rules cannot be allowed away: an `allow` or `expect` of
//! `clippy::too_many_lines` or `clippy::too_many_arguments`, or of a group holding one
//! (`clippy::pedantic`, `clippy::complexity`, `clippy::all`), anywhere in the repository's
//! Rust is a violation (CONTRIBUTING.md, "Rules the checks hold"). Reads files only.

use super::layers::{code_only, rust_files};
use anyhow::{Context, Result};
use std::path::Path;

/// The lints, and the groups holding them, whose `allow` is refused.
const HELD: [&str; 5] = [
    "clippy::too_many_lines",
    "clippy::too_many_arguments",
    "clippy::pedantic",
    "clippy::complexity",
    "clippy::all",
];

/// The folders searched, below the repository's root.
const FOLDERS: [&str; 4] = ["host", "tests", "xtask", "plugins"];

/// Each `file:line` (relative to `root`) of an attribute that allows a held lint, with the
/// attribute.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let mut found = Vec::new();
    for folder in FOLDERS {
        for file in rust_files(&root.join(folder))? {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("cannot read {}", file.display()))?;
            let shown = file.strip_prefix(root).unwrap_or(&file);
            for (line, attribute) in held_allowances(&text) {
                found.push(format!("{}:{line}: {attribute}", shown.display()));
            }
        }
    }
    Ok(found)
}

/// The attributes of `text` (`#[…]`, `#![…]`, over as many lines as they take) that allow or
/// expect a [`HELD`] lint, each with its first line and its text on one line. Comments and
/// literals are not code ([`code_only`]).
fn held_allowances(text: &str) -> Vec<(usize, String)> {
    let joined = code_only(text);
    let mut found = Vec::new();
    let mut rest = joined.as_str();
    while let Some(at) = rest.find('#') {
        let start = joined.len() - rest.len() + at;
        rest = &rest[at + 1..];
        let body = rest.strip_prefix('!').unwrap_or(rest);
        let Some(inner) = body.strip_prefix('[') else {
            continue;
        };
        let mut depth = 1;
        let end = inner.char_indices().find_map(|(i, c)| {
            depth += match c {
                '[' => 1,
                ']' => -1,
                _ => 0,
            };
            (depth == 0).then_some(i)
        });
        let Some(end) = end else { break };
        let attribute: String = inner[..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        let allows = attribute.starts_with("allow") || attribute.starts_with("expect");
        if allows && HELD.iter().any(|lint| attribute.contains(lint)) {
            let line = joined[..start].matches('\n').count() + 1;
            found.push((line, format!("#[{attribute}]")));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_of_a_held_lint_or_its_group_is_found_on_any_number_of_lines() {
        let found = |text: &str| -> Vec<usize> {
            held_allowances(text)
                .into_iter()
                .map(|(line, _)| line)
                .collect()
        };
        assert_eq!(found("    #[allow(clippy::too_many_arguments)]"), [1]);
        assert_eq!(found("#![allow(dead_code, clippy::too_many_lines)]"), [1]);
        assert_eq!(found("#[expect(clippy::too_many_lines)]"), [1]);
        assert_eq!(
            found("#[allow(clippy::pedantic)]\n#[allow(clippy::all)]"),
            [1, 2]
        );
        assert_eq!(
            found("fn f() {}\n#[allow(\n    dead_code,\n    clippy::complexity\n)]"),
            [2]
        );
        assert!(found("#[allow(clippy::large_enum_variant)]").is_empty());
        assert!(found("// never #[allow(clippy::too_many_lines)]").is_empty());
        assert!(found("let s = \"#[allow(clippy::too_many_lines)]\";").is_empty());
        assert!(found("#![warn(clippy::too_many_lines)]").is_empty());
        assert!(found("#[cfg_attr(test, derive(Debug))]\nlet v = a[b[0]];").is_empty());
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
