//! `mst import mst FILE`: converts MST's (gleanwork/mcp-server-tester) eval configs (2.0) and
//! datasets (2.0, and 1.x with direct-mode `toolName`/`args` cases) into mst's `eval.json` and
//! `.jsonl` case files. The mapping is documented in `docs/migrating-from-mst.md`; every
//! change lands in the [`Report`].
//!
//! [`format`] reads MST's files into typed structs, one module per generation; one converter
//! per section then writes mst's: [`config`] (the eval config: name, datasets, variants, run
//! controls), [`servers`], [`client`] (the client, its model and providers), [`cases`] (the
//! datasets' cases), [`assertions`] (assertions and judges) and [`evals`] (the written evals,
//! checked as `mst run` would load them).

mod assertions;
mod cases;
mod client;
mod config;
mod evals;
mod format;
mod servers;

use super::{Change, Imported, Report};
use anyhow::{bail, Context, Result};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The import's state as it reads one file after another.
pub(super) struct Source {
    /// The file being read.
    path: PathBuf,
    /// Its name as reported.
    file: String,
    report: Report,
    /// Providers LLM judges use: each needs a `providers` entry and a grant to the plugin.
    judge_providers: BTreeSet<String>,
    /// Environment variables that hold a provider's key (MST's `apiKeyEnvVar`), by provider.
    key_vars: BTreeMap<String, String>,
}

impl Source {
    fn new(path: &Path) -> Self {
        Source {
            path: path.to_path_buf(),
            file: path.display().to_string(),
            report: Report::default(),
            judge_providers: BTreeSet::new(),
            key_vars: BTreeMap::new(),
        }
    }

    /// Moves on to `path`; returns the file read before, to come back with [`Source::open`].
    fn open(&mut self, path: &Path) -> PathBuf {
        self.file = path.display().to_string();
        std::mem::replace(&mut self.path, path.to_path_buf())
    }

    fn note(&mut self, at: &str, change: Change, text: impl Into<String>) {
        self.report.note(&self.file, at, change, text);
    }

    fn lost_all_checks(&mut self, id: &str) {
        let case = format!("{}: {id}", self.file);
        self.report.cases_without_checks.push(case);
    }

    /// The file's name without its extension.
    fn stem(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "cases".into())
    }
}

/// Reads a JSON file, naming the line and column of a syntax error. A file of JSON Lines is
/// refused as what it is: most likely an mst dataset already.
fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&bytes).map_err(|e| {
        if is_json_lines(&bytes) {
            json_lines_error(path)
        } else {
            anyhow::anyhow!(crate::eval::config::located(path, 1, &e))
        }
    })
}

/// Whether `bytes` (which do not parse as one JSON value) are JSON Lines: the first
/// non-blank line is a JSON value of its own, and more lines follow it.
fn is_json_lines(bytes: &[u8]) -> bool {
    let mut lines = bytes
        .split(|b| *b == b'\n')
        .filter(|line| !line.trim_ascii().is_empty());
    lines
        .next()
        .is_some_and(|first| serde_json::from_slice::<Value>(first).is_ok())
        && lines.next().is_some()
}

/// The error for a JSON Lines file, which MST never writes: it names the file and how mst
/// uses such a file as it is.
fn json_lines_error(path: &Path) -> anyhow::Error {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    anyhow::anyhow!(
        "{} holds a JSON value on each line (JSON Lines), but MST's eval configs and datasets \
         are JSON, one object: this looks like an mst dataset already, which needs no import. \
         Name it in an mst eval's `datasets` (\"datasets\": [{}]) and run that eval with `mst \
         run`",
        path.display(),
        Value::String(name)
    )
}

/// Converts MST file `path`: an eval config (an object with `datasets`) with the datasets it
/// names, or a dataset alone (an object with `cases`).
pub fn import(path: &Path) -> Result<Imported> {
    let value = read_json(path)?;
    let object = value.as_object();
    let mut src = Source::new(path);
    let mut imported = Imported::default();
    match object {
        Some(object) if object.contains_key("datasets") => {
            config::convert(&mut src, &value, &mut imported)?
        }
        Some(object) if object.contains_key("cases") => {
            evals::dataset_alone(&mut src, &value, &mut imported)?
        }
        _ => bail!(
            "{} is neither an MST eval config (an object with `datasets`) nor an MST dataset \
             (an object with `cases`)",
            path.display()
        ),
    }
    imported.report = src.report;
    Ok(imported)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_lines_are_told_from_broken_json_by_their_first_line() {
        let lines = b"{\"id\": \"a\", \"input\": \"x\"}\n\n{\"id\": \"b\", \"input\": \"y\"}\n";
        assert!(is_json_lines(lines));
        assert!(is_json_lines(b"\n  \"a\"\n1\n"), "any JSON value a line");
        // One value on one line parses whole; a broken config's first line is not a value.
        assert!(!is_json_lines(b"{\"id\": \"a\"}\n"));
        assert!(!is_json_lines(
            b"{\n  \"name\": \"x\",\n  \"cases\": [,]\n}"
        ));
        assert!(!is_json_lines(b"{\"id\": \"a\", \"input\": \"x\"}}\n"));
    }

    #[test]
    fn a_json_lines_file_is_refused_as_an_mst_dataset_already_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cases.data");
        std::fs::write(
            &file,
            "{\"id\": \"a\", \"input\": \"x\"}\n{\"id\": \"b\", \"input\": \"y\"}\n",
        )
        .unwrap();
        let error = format!("{:#}", import(&file).unwrap_err());
        for expected in [
            file.display().to_string().as_str(),
            "JSON Lines",
            "MST's eval configs and datasets are JSON",
            "an mst dataset already",
            "\"datasets\": [\"cases.data\"]",
        ] {
            assert!(error.contains(expected), "{expected:?} in {error}");
        }
        assert!(!error.contains("trailing characters"), "{error}");
    }
}
