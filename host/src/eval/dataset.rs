//! Datasets: turn the config's `datasets` entries into one list of cases with unique ids.
//!
//! Built in: a `.jsonl` file (one case per line), a `.json` file (an array of cases), and a
//! directory (every `*.json` file in it, each one case or an array, in name order). Any other
//! `type` names a dataset plugin, which receives the entry as its options and the named file's
//! bytes as content.

use super::config::{located, mst_format_error, DatasetRef};
use super::trial::CaseRecord;
use crate::plugin::set::PluginSet;
use crate::plugin::Kind;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The resolved cases and a hash of their content, recorded in `run.json`.
#[derive(Debug, Clone, Default)]
pub struct Cases {
    pub cases: Vec<CaseRecord>,
    /// Where each case comes from, in the order of `cases`: eight bytes a case, not a
    /// string ([`Cases::origin`] spells it out).
    origins: Vec<Origin>,
    /// The sources the origins name: dataset files, and dataset plugins with their path.
    sources: Vec<String>,
    /// sha256 over the canonical JSON of every case, in order.
    pub content_hash: String,
}

/// Where one case comes from: one of [`Cases`]'s sources and, for a file, the line the case
/// starts on (0 for a dataset plugin's cases).
#[derive(Debug, Clone, Copy)]
struct Origin {
    source: u32,
    line: u32,
}

impl Cases {
    /// Where the case at `index` in `cases` comes from: `file:line` for files, the plugin and
    /// path for a dataset plugin's cases.
    pub fn origin(&self, index: usize) -> String {
        let Some(origin) = self.origins.get(index) else {
            return String::new();
        };
        let source = &self.sources[origin.source as usize];
        match origin.line {
            0 => source.clone(),
            line => format!("{source}:{line}"),
        }
    }
}

/// The cases read so far, with their origins and the sources those name: what [`Cases`] will
/// hold. Every dataset is read straight into it, so no second list of cases is ever made.
#[derive(Default)]
struct Loading {
    cases: Vec<CaseRecord>,
    origins: Vec<Origin>,
    sources: Vec<String>,
}

impl Loading {
    /// Starts a source (a file, or a dataset plugin with its path) with room for `cases`
    /// more; the index its cases' origins name.
    fn source(&mut self, label: String, cases: usize) -> u32 {
        self.sources.push(label);
        self.cases.reserve_exact(cases);
        self.origins.reserve_exact(cases);
        (self.sources.len() - 1) as u32
    }

    /// Adds `case`, from `source`, starting on `line` (0 when it has none).
    fn push(&mut self, case: CaseRecord, source: u32, line: usize) {
        let line = u32::try_from(line).unwrap_or(u32::MAX);
        self.cases.push(case);
        self.origins.push(Origin { source, line });
    }
}

/// The cases in one file, each with where it starts (`file:line`). Every error names the file
/// and line; an MST dataset (`{"name", "cases": […]}`) is refused with how to convert it.
fn parse_cases(text: &str, file: &Path, loading: &mut Loading) -> Result<()> {
    let at = |line: usize| format!("{}:{line}", file.display());
    let not_a_case =
        |first_line: usize, e: serde_json::Error| anyhow::anyhow!(located(file, first_line, &e));
    let label = file.display().to_string();
    if file.extension().is_some_and(|e| e == "jsonl") {
        let lines = text.lines().filter(|line| !line.trim().is_empty()).count();
        let source = loading.source(label, lines);
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let case = serde_json::from_str(line).map_err(|e| not_a_case(index + 1, e))?;
            loading.push(case, source, index + 1);
        }
        return Ok(());
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
    if let Some(object) = value.as_object() {
        if object.contains_key("cases") || object.contains_key("$schema") {
            let sign = "a `{\"name\", \"cases\": […]}` object, not a case or an array of cases";
            return Err(mst_format_error(file, "dataset", sign));
        }
    }
    // Parsed again from the text (not the value) so that errors carry their line.
    match value {
        serde_json::Value::Array(_) => {
            let cases: Vec<CaseRecord> =
                serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
            let source = loading.source(label, cases.len());
            for (case, line) in cases.into_iter().zip(element_lines(text)) {
                loading.push(case, source, line);
            }
            Ok(())
        }
        serde_json::Value::Object(_) => {
            let case = serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
            let source = loading.source(label, 1);
            loading.push(case, source, first_line(text));
            Ok(())
        }
        _ => bail!(
            "{}: must hold a case object or an array of cases",
            at(first_line(text))
        ),
    }
}

/// The line the JSON value in `text` starts on.
fn first_line(text: &str) -> usize {
    let blank = text.len() - text.trim_start().len();
    1 + text[..blank].matches('\n').count()
}

/// The line each element of the top-level array in `text` (valid JSON) starts on.
fn element_lines(text: &str) -> Vec<usize> {
    let (mut depth, mut line, mut in_string, mut escaped, mut next) =
        (0usize, 1, false, false, false);
    let mut lines = Vec::new();
    for c in text.chars() {
        if c == '\n' {
            line += 1;
        }
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        // The first character after `[` or a top-level `,` starts an element.
        if next && !c.is_whitespace() && c != ']' {
            lines.push(line);
            next = false;
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => {
                depth += 1;
                next = depth == 1;
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 1 => next = true,
            _ => {}
        }
    }
    lines
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::files::read_input(path)?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
}

fn load_dir(dir: &Path, loading: &mut Loading) -> Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read dataset directory {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    files.sort();
    for file in files {
        parse_cases(&read_text(&file)?, &file, loading)?;
    }
    Ok(())
}

fn load_path(path: &Path, loading: &mut Loading) -> Result<()> {
    if path.is_dir() {
        load_dir(path, loading)
    } else {
        parse_cases(&read_text(path)?, path, loading)
    }
}

/// Resolves `path` from a dataset entry inside `base`, refusing to leave it.
fn inside(base: &Path, relative: &str) -> Result<PathBuf> {
    let joined = base.join(relative);
    let canonical = joined
        .canonicalize()
        .with_context(|| format!("dataset {} does not exist", joined.display()))?;
    let base = base
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", base.display()))?;
    if !canonical.starts_with(&base) {
        bail!(
            "dataset path `{relative}` lies outside the eval's directory {}",
            base.display()
        );
    }
    Ok(canonical)
}

/// Resolves every entry (paths relative to `base`, the config's directory) into cases.
pub fn resolve(entries: &[DatasetRef], base: &Path, plugins: &PluginSet) -> Result<Cases> {
    let mut loading = Loading::default();
    for (index, entry) in entries.iter().enumerate() {
        match entry {
            DatasetRef::Path(path) => load_path(&inside(base, path)?, &mut loading)?,
            DatasetRef::Typed(fields) => {
                let kind = fields.get("type").and_then(|t| t.as_str()).with_context(|| {
                    format!("datasets[{index}] needs a `type` (`file`, `dir` or a dataset plugin's name)")
                })?;
                let path = match fields.get("path") {
                    Some(serde_json::Value::String(p)) => Some(p.clone()),
                    Some(_) => bail!("datasets[{index}].path must be a string"),
                    None => None,
                };
                match kind {
                    "file" | "dir" => {
                        let path = path.with_context(|| {
                            format!("datasets[{index}] of type `{kind}` needs a `path`")
                        })?;
                        if let Some(extra) = fields
                            .keys()
                            .find(|k| !["type", "path"].contains(&k.as_str()))
                        {
                            bail!(
                                "datasets[{index}]: unknown key `{extra}` for a `{kind}` dataset"
                            );
                        }
                        load_path(&inside(base, &path)?, &mut loading)?
                    }
                    plugin_name => {
                        if plugins.find(plugin_name).is_none() {
                            bail!(
                                "datasets[{index}] has type `{plugin_name}`, which is neither `file`, `dir`, nor a \
                                 configured or installed dataset plugin"
                            );
                        }
                        let plugin = plugins
                            .get(plugin_name, Kind::Dataset)
                            .with_context(|| format!("datasets[{index}]"))?;
                        let content = match &path {
                            Some(p) => Some(crate::files::read_input(&inside(base, p)?)?),
                            None => None,
                        };
                        let options = serde_json::to_string(fields)?;
                        let raw = plugin.resolve(&options, content.as_deref())?;
                        let label = format!("{plugin_name}({})", path.unwrap_or_default());
                        let source = loading.source(label, raw.len());
                        for case in raw {
                            loading.push(CaseRecord::from_wit(case)?, source, 0);
                        }
                    }
                }
            }
        }
    }
    let cases = Cases {
        cases: loading.cases,
        origins: loading.origins,
        sources: loading.sources,
        content_hash: String::new(),
    };
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(cases.cases.len());
    for (index, case) in cases.cases.iter().enumerate() {
        if case.id.is_empty() {
            bail!("{}: a case has an empty `id`", cases.origin(index));
        }
        if let Some(first) = seen.insert(&case.id, index) {
            bail!(
                "case id `{}` appears twice (in {} and {}); ids must be unique",
                case.id,
                cases.origin(first),
                cases.origin(index)
            );
        }
    }
    drop(seen);
    if cases.cases.is_empty() {
        bail!("the datasets hold no cases");
    }
    let mut hasher = Sha256::new();
    for case in &cases.cases {
        serde_json::to_writer(&mut hasher, case)?;
        hasher.update(b"\n");
    }
    Ok(Cases {
        content_hash: hex::encode(hasher.finalize()),
        ..cases
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_dirs_and_unique_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.jsonl"),
            "{\"id\":\"a\",\"input\":1}\n\n{\"id\":\"b\",\"input\":2}\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("more")).unwrap();
        std::fs::write(
            dir.path().join("more/c.json"),
            r#"[{"id":"c","input":3,"trials":2}]"#,
        )
        .unwrap();
        let entries = vec![
            DatasetRef::Path("a.jsonl".into()),
            DatasetRef::Typed(
                [
                    ("type".to_string(), "dir".into()),
                    ("path".to_string(), "more".into()),
                ]
                .into(),
            ),
        ];
        let cases = resolve(&entries, dir.path(), &PluginSet::default()).unwrap();
        let ids: Vec<&str> = cases.cases.iter().map(|c| &*c.id).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(cases.cases[2].more().trials, Some(2));
        assert_eq!(cases.content_hash.len(), 64);

        let twice = vec![
            DatasetRef::Path("a.jsonl".into()),
            DatasetRef::Path("a.jsonl".into()),
        ];
        let err = resolve(&twice, dir.path(), &PluginSet::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("`a` appears twice"), "{err}");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bad.jsonl"),
            "{\"id\":\"a\",\"input\":1}\n{\"id\":\"b\",\"inptu\":2}\n",
        )
        .unwrap();
        let err = format!(
            "{:#}",
            resolve(
                &[DatasetRef::Path("bad.jsonl".into())],
                dir.path(),
                &PluginSet::default()
            )
            .unwrap_err()
        );
        assert!(
            err.contains("bad.jsonl:2") && err.contains("inptu"),
            "{err}"
        );
        let err = resolve(
            &[DatasetRef::Path("../outside.jsonl".into())],
            dir.path(),
            &PluginSet::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("does not exist") || err.to_string().contains("outside"),
            "{err}"
        );
        let typed = DatasetRef::Typed([("type".to_string(), "acme/dataset/x".into())].into());
        let err = resolve(&[typed], dir.path(), &PluginSet::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("acme/dataset/x"), "{err}");
    }

    /// The error resolving the single file `name` holding `text`.
    fn error_for(name: &str, text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name), text).unwrap();
        let entry = DatasetRef::Path(name.into());
        let err = resolve(&[entry], dir.path(), &PluginSet::default()).unwrap_err();
        format!("{err:#}")
    }

    #[test]
    fn every_format_names_the_line() {
        let array = "[\n  {\"id\": \"a\", \"input\": 1},\n  {\"id\": \"b\",\n   \"inptu\": 2}\n]\n";
        let err = error_for("cases.json", array);
        assert!(
            err.contains("cases.json:4:") && err.contains("(did you mean `input`?)"),
            "{err}"
        );
        let object = "\n{\"id\": \"a\",\n \"input\": 1,\n \"tag\": []}";
        let err = error_for("one.json", object);
        assert!(
            err.contains("one.json:4:") && err.contains("(did you mean `tags`?)"),
            "{err}"
        );
        let err = error_for("broken.json", "[\n{\"id\": \"a\",\n");
        assert!(err.contains("broken.json:3:"), "{err}");
        let err = error_for("scalar.json", "\n\n42");
        assert!(
            err.contains("scalar.json:3: must hold a case object"),
            "{err}"
        );
    }

    #[test]
    fn an_mst_dataset_is_refused_with_how_to_convert_it() {
        let mst = r#"{"name": "time", "cases": [{"id": "a", "input": "What time is it?"}]}"#;
        let err = error_for("time.json", mst);
        assert!(
            err.contains("time.json is an MST (mcp-server-tester) dataset")
                && err.contains("convert it with `mst import mst"),
            "{err}"
        );
    }

    #[test]
    fn each_case_knows_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[{\"id\": \"a\", \"input\": \"[, {\\\"\"},\n\n {\"id\": \"b\", \"input\": [[1], {\"x\": [2, 3]}]},\n {\"id\": \"c\", \"input\": 3}]";
        std::fs::write(dir.path().join("cases.json"), text).unwrap();
        std::fs::write(
            dir.path().join("more.jsonl"),
            "\n{\"id\": \"d\", \"input\": 4}\n",
        )
        .unwrap();
        let entries = [
            DatasetRef::Path("cases.json".into()),
            DatasetRef::Path("more.jsonl".into()),
        ];
        let cases = resolve(&entries, dir.path(), &PluginSet::default()).unwrap();
        let lines: Vec<String> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| {
                let index = cases.cases.iter().position(|c| &*c.id == *id).unwrap();
                let origin = cases.origin(index);
                origin.rsplit_once('/').unwrap().1.to_string()
            })
            .collect();
        assert_eq!(
            lines,
            [
                "cases.json:1",
                "cases.json:3",
                "cases.json:4",
                "more.jsonl:2"
            ]
        );
    }
}
