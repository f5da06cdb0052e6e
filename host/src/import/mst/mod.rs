//! `mst import mst FILE`: converts MST's (gleanwork/mcp-server-tester) eval configs (2.0) and
//! datasets (2.0, and 1.x with direct-mode `toolName`/`args` cases) into mst's `eval.json` and
//! `.jsonl` case files. The mapping is documented in `docs/migrating-from-mst.md`; every
//! change lands in the [`Report`].

mod cases;
mod config;

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

/// Reads a JSON file, naming the line and column of a syntax error.
fn read_json(path: &Path) -> Result<Value> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| anyhow::anyhow!(crate::eval::config::located(path, 1, &e)))
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
            config::convert(&mut src, object, &mut imported)?
        }
        Some(object) if object.contains_key("cases") => {
            config::dataset_alone(&mut src, object, &mut imported)?
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

/// Renders `object` as one line with its keys in `order` first (serde_json's maps are sorted;
/// a case reads best id first).
fn ordered_line(object: &Value, order: &[&str]) -> String {
    render(object, order, None)
}

/// Renders `object` as indented JSON with its keys in `order` first.
fn ordered_pretty(object: &Value, order: &[&str]) -> String {
    render(object, order, Some("  "))
}

fn render(object: &Value, order: &[&str], indent: Option<&str>) -> String {
    let Some(map) = object.as_object() else {
        return object.to_string();
    };
    let mut keys: Vec<&String> = order
        .iter()
        .filter_map(|k| map.get_key_value(*k).map(|(k, _)| k))
        .collect();
    keys.extend(map.keys().filter(|k| !order.contains(&k.as_str())));
    let fields: Vec<String> = keys
        .into_iter()
        .map(|key| {
            let value = match indent {
                Some(pad) => serde_json::to_string_pretty(&map[key])
                    .unwrap_or_default()
                    .replace('\n', &format!("\n{pad}")),
                None => map[key].to_string(),
            };
            format!("{}: {value}", Value::String(key.clone()))
        })
        .collect();
    match indent {
        Some(pad) => format!("{{\n{pad}{}\n}}\n", fields.join(&format!(",\n{pad}"))),
        None => format!("{{{}}}", fields.join(", ")),
    }
}
