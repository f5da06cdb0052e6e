//! Datasets: turn the config's `datasets` entries into one list of cases with unique ids.
//!
//! Built in: a `.jsonl` file (one case per line), a `.json` file (an array of cases), and a
//! directory (every `*.json` file in it, each one case or an array, in name order). Any other
//! `type` names a dataset plugin, which receives the entry as its options and the named file's
//! bytes as content.

use super::config::DatasetRef;
use super::trial::CaseRecord;
use crate::plugin::set::PluginSet;
use crate::plugin::Kind;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The resolved cases and a hash of their content, recorded in `run.json`.
#[derive(Debug, Clone)]
pub struct Cases {
    pub cases: Vec<CaseRecord>,
    /// sha256 over the canonical JSON of every case, in order.
    pub content_hash: String,
}

fn parse_cases(text: &str, file: &Path) -> Result<Vec<CaseRecord>> {
    let is_jsonl = file.extension().is_some_and(|e| e == "jsonl");
    if is_jsonl {
        let mut cases = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let case: CaseRecord = serde_json::from_str(line)
                .with_context(|| format!("{}:{}: not a case", file.display(), index + 1))?;
            cases.push(case);
        }
        return Ok(cases);
    }
    let value: serde_json::Value =
        serde_json::from_str(text).with_context(|| format!("{} is not JSON", file.display()))?;
    let items = match value {
        serde_json::Value::Array(items) => items,
        object @ serde_json::Value::Object(_) => vec![object],
        _ => bail!(
            "{} must hold a case object or an array of cases",
            file.display()
        ),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_value(item)
                .with_context(|| format!("{}: case #{} is not a case", file.display(), i + 1))
        })
        .collect()
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::files::read_input(path)?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
}

fn load_dir(dir: &Path) -> Result<Vec<CaseRecord>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read dataset directory {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    files.sort();
    let mut cases = Vec::new();
    for file in files {
        cases.extend(parse_cases(&read_text(&file)?, &file)?);
    }
    Ok(cases)
}

fn load_path(path: &Path) -> Result<Vec<CaseRecord>> {
    if path.is_dir() {
        load_dir(path)
    } else {
        parse_cases(&read_text(path)?, path)
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
    let mut cases = Vec::new();
    let mut origin: BTreeMap<String, String> = BTreeMap::new();
    for (index, entry) in entries.iter().enumerate() {
        let (label, found) = match entry {
            DatasetRef::Path(path) => (path.clone(), load_path(&inside(base, path)?)?),
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
                        (path.clone(), load_path(&inside(base, &path)?)?)
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
                        let resolved = raw
                            .into_iter()
                            .map(CaseRecord::from_wit)
                            .collect::<Result<Vec<_>>>()?;
                        (
                            format!("{plugin_name}({})", path.unwrap_or_default()),
                            resolved,
                        )
                    }
                }
            }
        };
        for case in found {
            if case.id.is_empty() {
                bail!("{label}: a case has an empty `id`");
            }
            if let Some(first) = origin.insert(case.id.clone(), label.clone()) {
                bail!(
                    "case id `{}` appears twice (in {first} and {label}); ids must be unique",
                    case.id
                );
            }
            cases.push(case);
        }
    }
    if cases.is_empty() {
        bail!("the datasets hold no cases");
    }
    let mut hasher = Sha256::new();
    for case in &cases {
        hasher.update(serde_json::to_vec(case)?);
        hasher.update(b"\n");
    }
    Ok(Cases {
        cases,
        content_hash: hex::encode(hasher.finalize()),
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
        let ids: Vec<&str> = cases.cases.iter().map(|c| c.id.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        assert_eq!(cases.cases[2].trials, Some(2));
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
}
