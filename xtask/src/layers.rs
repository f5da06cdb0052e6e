//! The layering of `host/src`, checked (`cargo xtask lint`, and `cargo xtask layers` alone).
//!
//! The layers are written once, in `docs/architecture.md`: the fenced block after the marker
//! line [`MARKER`], one layer a line, top first, each line's leading words ending in `/` or
//! `.rs` its parts (the folders and files of `host/src`). A part may use only parts of the
//! layers below its own: not a part of its own layer, not one above. The check reads every
//! `crate::…` and `super::…` path in `host/src`, tests included, without building anything;
//! comments and string literals are skipped. It also holds `host/src/lib.rs` to the same
//! order: its module list names every part, top first.
//!
//! Written by hand rather than with `syn`: a lexer of a hundred lines reads the whole tree in
//! milliseconds and needs no dependency; the paths it must see are simple.

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The line in `docs/architecture.md` right before the fenced block of layers.
pub const MARKER: &str = "<!-- layers: read by `cargo xtask lint` (xtask/src/layers.rs) -->";

/// The layers, top first: each a list of parts (`cli`, `files`, …: a folder or a file of
/// `host/src` without its `.rs`).
#[derive(Debug)]
pub struct Layers {
    layers: Vec<Vec<String>>,
}

impl Layers {
    /// Reads the layers from the fenced block after [`MARKER`] in `doc`.
    pub fn from_doc(doc: &Path) -> Result<Layers> {
        let text = std::fs::read_to_string(doc)
            .with_context(|| format!("cannot read {}", doc.display()))?;
        Layers::parse(&text).with_context(|| format!("{}: the layers", doc.display()))
    }

    fn parse(text: &str) -> Result<Layers> {
        let after = text
            .split_once(MARKER)
            .with_context(|| format!("no line {MARKER}"))?
            .1;
        let mut lines = after.lines().skip_while(|l| l.trim().is_empty());
        if !lines.next().is_some_and(|l| l.starts_with("```")) {
            bail!("a fenced block (```) must follow {MARKER}");
        }
        let mut layers = Vec::new();
        for line in lines.take_while(|l| !l.starts_with("```")) {
            let parts: Vec<String> = line
                .split_whitespace()
                .map_while(|word| {
                    word.strip_suffix('/')
                        .or_else(|| word.strip_suffix(".rs"))
                        .map(str::to_string)
                })
                .collect();
            if parts.is_empty() {
                bail!("the line {line:?} names no part (a folder/ or a file.rs first)");
            }
            layers.push(parts);
        }
        if layers.is_empty() {
            bail!("the block after {MARKER} lists no layer");
        }
        Ok(Layers { layers })
    }

    /// The layer of `part` (0 is the top), if it is in one.
    fn layer_of(&self, part: &str) -> Option<usize> {
        self.layers.iter().position(|l| l.iter().any(|p| p == part))
    }

    /// The order as one line: `cli > serve, import > … > files, process`.
    pub fn describe(&self) -> String {
        let layers: Vec<String> = self.layers.iter().map(|l| l.join(", ")).collect();
        layers.join(" > ")
    }
}

/// One use of a part by another that the layers forbid.
#[derive(Debug, PartialEq)]
pub struct Violation {
    /// The file, relative to the repository.
    pub file: PathBuf,
    /// Its line, from 1.
    pub line: usize,
    /// What is wrong, with the rule.
    pub message: String,
}

/// Checks `src` (`host/src`) against `layers`: every part of `src` is in exactly one layer,
/// every layer's part exists, and no path uses a part that is not below its own. Returns the
/// violations, in file order.
pub fn check(src: &Path, layers: &Layers) -> Result<Vec<Violation>> {
    let mut violations = Vec::new();
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for part in layers.layers.iter().flatten() {
        *seen.entry(part.clone()).or_default() += 1;
        if !src.join(part).is_dir() && !src.join(format!("{part}.rs")).is_file() {
            bail!(
                "the layers name {part}, which is neither {0}/{part}/ nor {0}/{part}.rs",
                src.display()
            );
        }
    }
    if let Some((part, _)) = seen.iter().find(|(_, n)| **n > 1) {
        bail!("the layers name {part} more than once");
    }
    for file in rust_files(src)? {
        let relative = file.strip_prefix(src).expect("below src").to_path_buf();
        let module = module_path(&relative);
        let Some(own) = module.first() else {
            continue; // lib.rs and main.rs: the crate's root sees every part.
        };
        let Some(own_layer) = layers.layer_of(own) else {
            bail!(
                "host/src/{} is in no layer: add {own}{} to a layer of docs/architecture.md",
                relative.display(),
                if src.join(own).is_dir() { "/" } else { ".rs" }
            );
        };
        let text = std::fs::read_to_string(&file)
            .with_context(|| format!("cannot read {}", file.display()))?;
        for (line, used) in parts_used(&text, &module) {
            if &used == own {
                continue;
            }
            let rule = match layers.layer_of(&used) {
                Some(layer) if layer > own_layer => continue,
                Some(layer) if layer == own_layer => "a part does not use its own layer's others",
                Some(_) => "a part uses only the layers below it",
                None => continue, // not a part: a crate, a macro, a primitive type
            };
            violations.push(Violation {
                file: Path::new("host/src").join(&relative),
                line,
                message: format!("{} uses {}: {rule}", shown(src, own), shown(src, &used)),
            });
        }
    }
    Ok(violations)
}

/// A part as the layers write it: `run/` for a folder, `files.rs` for a file.
fn shown(src: &Path, part: &str) -> String {
    if src.join(part).is_dir() {
        format!("{part}/")
    } else {
        format!("{part}.rs")
    }
}

/// Checks that `lib.rs`'s module list (its `//! - [`part`]` lines) names every part, top
/// first: the crate's front page draws the order the check holds.
pub fn check_lib_doc(lib: &Path, layers: &Layers) -> Result<()> {
    let text =
        std::fs::read_to_string(lib).with_context(|| format!("cannot read {}", lib.display()))?;
    let named: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("//! - "))
        .flat_map(|l| l.split("[`").skip(1))
        .filter_map(|s| s.split_once("`]").map(|(name, _)| name))
        .collect();
    let mut last = 0;
    for name in &named {
        let Some(layer) = layers.layer_of(name) else {
            continue;
        };
        if layer < last {
            bail!(
                "{}: its module list names {name} after a part of a lower layer; list the parts top first ({})",
                lib.display(),
                layers.describe()
            );
        }
        last = layer;
    }
    if let Some(missing) = layers
        .layers
        .iter()
        .flatten()
        .find(|p| !named.contains(&p.as_str()))
    {
        bail!("{}: its module list does not name {missing}", lib.display());
    }
    Ok(())
}

/// The `.rs` files below `dir`, sorted; build output (`target/`, `node_modules/`) skipped, and
/// a `dir` that does not exist has none.
pub fn rust_files(dir: &Path) -> Result<Vec<PathBuf>> {
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

/// The module a file below `src` defines: `run/grading/mod.rs` → `[run, grading]`, `files.rs` →
/// `[files]`, `lib.rs` → `[]`.
fn module_path(relative: &Path) -> Vec<String> {
    let mut path: Vec<String> = relative
        .iter()
        .map(|s| s.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        path.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        path.pop();
    }
    path
}

/// A token of Rust source, as far as paths go.
#[derive(Debug, PartialEq)]
enum Token {
    Ident(String),
    PathSep,
    Open,
    Close,
    Other,
}

/// `source` with its comments and literals blanked out (their characters become spaces, their
/// newlines stay), so that what is left is code, on the same lines.
pub fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    let at = |i: usize| chars.get(i).copied().unwrap_or('\0');
    while i < chars.len() {
        let end = match chars[i] {
            '/' if at(i + 1) == '/' => (i..chars.len())
                .find(|&j| chars[j] == '\n')
                .unwrap_or(chars.len()),
            '/' if at(i + 1) == '*' => block_comment_end(&chars, i),
            '"' => string_end(&chars, i + 1, 0),
            '\'' => char_literal_end(&chars, i),
            'r' | 'b' | 'c' if string_prefix(&chars, i).is_some() => {
                let (start, hashes) = string_prefix(&chars, i).expect("checked");
                string_end(&chars, start, hashes)
            }
            c => {
                out.push(c);
                i += 1;
                continue;
            }
        };
        let end = end.max(i + 1).min(chars.len());
        out.extend(
            chars[i..end]
                .iter()
                .map(|&c| if c == '\n' { '\n' } else { ' ' }),
        );
        i = end;
    }
    out
}

/// The tokens of `source` with their lines, comments and literals skipped.
fn tokens(source: &str) -> Vec<(usize, Token)> {
    let chars: Vec<char> = code_only(source).chars().collect();
    let mut out = Vec::new();
    let (mut i, mut line) = (0, 1);
    while i < chars.len() {
        let c = chars[i];
        if c.is_alphabetic() || c == '_' {
            let end = (i..chars.len())
                .find(|&j| !(chars[j].is_alphanumeric() || chars[j] == '_'))
                .unwrap_or(chars.len());
            out.push((line, Token::Ident(chars[i..end].iter().collect())));
            i = end;
            continue;
        }
        match c {
            ':' if chars.get(i + 1) == Some(&':') => {
                out.push((line, Token::PathSep));
                i += 1;
            }
            '{' => out.push((line, Token::Open)),
            '}' => out.push((line, Token::Close)),
            '\n' => line += 1,
            c if c.is_whitespace() => {}
            _ => out.push((line, Token::Other)),
        }
        i += 1;
    }
    out
}

/// Where the contents of a raw, byte or C string starting at `i` begin, and its `#`s: `r"`,
/// `r#"`, `b"`, `br#"`, `c"`, `cr"`; `None` for an identifier such as `r#type` or `bytes`.
fn string_prefix(chars: &[char], i: usize) -> Option<(usize, usize)> {
    if i > 0 && (chars[i - 1].is_alphanumeric() || chars[i - 1] == '_') {
        return None;
    }
    let mut j = i;
    if matches!(chars[j], 'b' | 'c') {
        j += 1;
    }
    let raw = chars.get(j) == Some(&'r');
    if raw {
        j += 1;
    }
    let hashes = chars[j..].iter().take_while(|&&c| c == '#').count();
    let opens = chars.get(j + hashes) == Some(&'"') && (raw || hashes == 0) && j > i;
    opens.then_some((j + hashes + 1, hashes))
}

/// The index after a `/* … */` comment starting at `i` (they nest).
fn block_comment_end(chars: &[char], mut i: usize) -> usize {
    let mut depth = 0;
    while i < chars.len() {
        if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
            depth += 1;
            i += 2;
        } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
            depth -= 1;
            i += 2;
            if depth == 0 {
                return i;
            }
        } else {
            i += 1;
        }
    }
    chars.len()
}

/// The index after a string whose contents start at `i`, closed by `"` and `hashes` `#`s
/// (escapes only count in a plain string).
fn string_end(chars: &[char], mut i: usize, hashes: usize) -> usize {
    while i < chars.len() {
        if hashes == 0 && chars[i] == '\\' {
            i += 2;
            continue;
        }
        if chars[i] == '"'
            && chars[i + 1..]
                .iter()
                .take(hashes)
                .filter(|&&c| c == '#')
                .count()
                == hashes
        {
            return i + 1 + hashes;
        }
        i += 1;
    }
    chars.len()
}

/// The index after a character literal at `i`, or after the `'` of a lifetime or label.
fn char_literal_end(chars: &[char], i: usize) -> usize {
    if chars.get(i + 1) == Some(&'\\') {
        return (i + 2..chars.len())
            .find(|&j| chars[j] == '\'')
            .map_or(chars.len(), |j| j + 1);
    }
    if chars.get(i + 2) == Some(&'\'') {
        return i + 3;
    }
    i + 1
}

/// The top-level parts a file's paths name, with their lines: each `crate::X`, each member of
/// a `crate::{X, Y::…}` group, and each `super::…` that climbs to the crate's root.
/// `module` is the file's own module path; inline `mod name { … }` blocks extend it.
fn parts_used(source: &str, module: &[String]) -> Vec<(usize, String)> {
    let tokens = tokens(source);
    let mut used = Vec::new();
    // The open inline modules: the depth of braces at which each was opened.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0;
    let ident = |i: usize| match tokens.get(i) {
        Some((_, Token::Ident(name))) => Some(name.as_str()),
        _ => None,
    };
    for (i, (line, token)) in tokens.iter().enumerate() {
        match token {
            Token::Open => {
                depth += 1;
                if i >= 2 && ident(i - 2) == Some("mod") && ident(i - 1).is_some() {
                    inline.push(depth);
                }
            }
            Token::Close => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth -= 1;
            }
            Token::Ident(name) if tokens.get(i + 1).map(|t| &t.1) == Some(&Token::PathSep) => {
                let previous_is_sep = i > 0 && tokens[i - 1].1 == Token::PathSep;
                if previous_is_sep {
                    continue;
                }
                let next = match name.as_str() {
                    "crate" => i + 2,
                    "super" => {
                        // Count the chain of `super::`s.
                        let mut n = 0;
                        while ident(i + 2 * n) == Some("super")
                            && tokens.get(i + 2 * n + 1).map(|t| &t.1) == Some(&Token::PathSep)
                        {
                            n += 1;
                        }
                        let here = module.len() + inline.len();
                        if n < here {
                            continue; // stays inside a top-level part
                        }
                        i + 2 * n
                    }
                    _ => continue,
                };
                match tokens.get(next).map(|t| &t.1) {
                    Some(Token::Ident(part)) => used.push((*line, part.clone())),
                    Some(Token::Open) => used.extend(group_heads(&tokens, next)),
                    _ => {}
                }
            }
            _ => {}
        }
    }
    used
}

/// The first segment of each member of the `{ … }` group opening at `open`.
fn group_heads(tokens: &[(usize, Token)], open: usize) -> Vec<(usize, String)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut expect_head = true;
    for (line, token) in &tokens[open..] {
        match token {
            Token::Open => {
                depth += 1;
                expect_head = depth == 1;
            }
            Token::Close => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            Token::Ident(name) if depth == 1 && expect_head => {
                if name != "self" {
                    heads.push((*line, name.clone()));
                }
                expect_head = false;
            }
            Token::Other if depth == 1 => expect_head = true, // a comma
            _ => {}
        }
    }
    heads
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layers() -> Layers {
        Layers::parse(&format!(
            "text\n{MARKER}\n\n```text\ncli/          the top\nrun/  view/   two parts\nfiles.rs      ground\n```\n"
        ))
        .unwrap()
    }

    fn used(source: &str, module: &[&str]) -> Vec<(usize, String)> {
        let module: Vec<String> = module.iter().map(|s| s.to_string()).collect();
        parts_used(source, &module)
    }

    #[test]
    fn the_block_after_the_marker_is_the_layers_top_first() {
        let layers = layers();
        assert_eq!(layers.describe(), "cli > run, view > files");
        assert_eq!(layers.layer_of("view"), Some(1));
        assert_eq!(layers.layer_of("files"), Some(2));
        assert_eq!(layers.layer_of("nothing"), None);
        assert!(Layers::parse("no marker").is_err());
        assert!(Layers::parse(&format!("{MARKER}\nnot a fence\n")).is_err());
        assert!(Layers::parse(&format!("{MARKER}\n```\nwords only\n```\n")).is_err());
    }

    #[test]
    fn paths_groups_and_supers_name_their_parts() {
        let source = "use crate::run::collect;\nuse crate::{view::html, files};\nfn f() { crate::cli::main(); }\n";
        assert_eq!(
            used(source, &["shard", "protocol"]),
            [
                (1, "run".into()),
                (2, "view".into()),
                (2, "files".into()),
                (3, "cli".into())
            ]
        );
        // Nested groups: only the heads count.
        let source = "use crate::{\n    run::{a, b::c},\n    self,\n    files::{x, y},\n};";
        assert_eq!(
            used(source, &["cli"]),
            [(2, "run".into()), (4, "files".into())]
        );
        // `super::super` climbs to the root from run/grading/mod.rs, not from run/grading/spill.rs.
        assert_eq!(
            used("use super::super::x;", &["run", "grading"]),
            [(1, "x".into())]
        );
        assert_eq!(
            used("use super::super::files::x;", &["run", "grading", "spill"]).len(),
            0
        );
        assert_eq!(
            used(
                "use super::super::super::files::x;",
                &["run", "grading", "spill"]
            ),
            [(1, "files".into())]
        );
        // An inline test module is one level deeper.
        assert_eq!(
            used("mod tests {\n use super::super::view::x;\n}", &["run"]),
            [(2, "view".into())]
        );
        assert!(used("mod tests {\n use super::*;\n}", &["run"]).is_empty());
    }

    #[test]
    fn comments_strings_and_lifetimes_are_not_paths() {
        let source = r##"
            // use crate::run;
            /* crate::run /* nested */ crate::run */
            /// See [`crate::run`].
            const S: &str = "crate::run";
            const R: &str = r#"crate::run "quoted""#;
            const B: &[u8] = b"crate::run";
            fn f<'a>(x: &'a str) -> char { '"' }
            use crate::files;
        "##;
        assert_eq!(used(source, &["cli"]), [(9, "files".into())]);
    }

    #[test]
    fn a_part_using_its_own_layer_or_one_above_is_a_violation_naming_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        for folder in ["cli", "run", "view"] {
            std::fs::create_dir(src.join(folder)).unwrap();
        }
        std::fs::write(src.join("files.rs"), "").unwrap();
        std::fs::write(src.join("lib.rs"), "use crate::cli;").unwrap();
        std::fs::write(src.join("cli/mod.rs"), "use crate::run;\nuse crate::files;").unwrap();
        std::fs::write(
            src.join("run/mod.rs"),
            "use crate::files;\n\nuse crate::view::x;",
        )
        .unwrap();
        std::fs::write(src.join("view/mod.rs"), "fn f() {\n    crate::cli::g();\n}").unwrap();
        let found = check(src, &layers()).unwrap();
        let found: Vec<String> = found
            .iter()
            .map(|v| format!("{}:{}: {}", v.file.display(), v.line, v.message))
            .collect();
        assert_eq!(
            found,
            [
                "host/src/run/mod.rs:3: run/ uses view/: a part does not use its own layer's others",
                "host/src/view/mod.rs:2: view/ uses cli/: a part uses only the layers below it",
            ]
        );
        // A folder in no layer is refused by name.
        std::fs::create_dir(src.join("extra")).unwrap();
        std::fs::write(src.join("extra/mod.rs"), "").unwrap();
        let error = check(src, &layers()).unwrap_err().to_string();
        assert!(
            error.contains("host/src/extra/mod.rs is in no layer: add extra/"),
            "{error}"
        );
    }

    #[test]
    fn lib_rs_must_list_every_part_top_first() {
        let dir = tempfile::tempdir().unwrap();
        let lib = dir.path().join("lib.rs");
        std::fs::write(
            &lib,
            "//! - [`cli`]: x\n//! - [`run`], [`view`]: y\n//! - [`files`]\n",
        )
        .unwrap();
        check_lib_doc(&lib, &layers()).unwrap();
        std::fs::write(
            &lib,
            "//! - [`run`]: x\n//! - [`cli`], [`view`]: y\n//! - [`files`]\n",
        )
        .unwrap();
        assert!(check_lib_doc(&lib, &layers())
            .unwrap_err()
            .to_string()
            .contains("names cli after"));
        std::fs::write(&lib, "//! - [`cli`]: x\n//! - [`run`]\n//! - [`files`]\n").unwrap();
        assert!(check_lib_doc(&lib, &layers())
            .unwrap_err()
            .to_string()
            .contains("does not name view"));
    }
}
