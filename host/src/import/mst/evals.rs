//! The files an import writes: case files (one case per line, id first), the evals that run
//! them (`eval.json` for the cases a client answers; the 1.x direct-mode cases on the `mcp`
//! client in `eval-direct.json` beside it, or in `eval.json` when they are all there is),
//! the starter evals of a dataset converted alone, and the check that every written eval
//! loads as `mst run` would load it.

use super::assertions::RUBRIC_PLUGIN;
use super::cases::{self, CaseDefaults, Dataset};
use super::client::provider_entries;
use super::config::name_of;
use super::Source;
use crate::eval::config::{DatasetRef, EvalConfig};
use crate::import::{Change, Imported};
use anyhow::Result;
use serde_json::{json, Map, Value};
use std::path::Path;

/// Key order of a written case line.
const CASE_ORDER: &[&str] = &[
    "id",
    "input",
    "expected",
    "tags",
    "metadata",
    "trials",
    "casePass",
    "passThreshold",
    "judges",
];

/// Key order of a written eval.
const EVAL_ORDER: &[&str] = &[
    "name",
    "description",
    "datasets",
    "servers",
    "client",
    "model",
    "clientOptions",
    "providers",
    "variants",
    "baseline",
    "judges",
    "plugins",
    "trials",
    "passThreshold",
    "casePass",
    "concurrency",
    "timeout",
];

/// The eval for the cases a client answers.
const EVAL_FILE: &str = "eval.json";

/// The case files written, by the eval that runs them.
#[derive(Default)]
pub(super) struct CaseFiles {
    /// Cases a client answers (a text input): `NAME.jsonl`.
    pub client: Vec<String>,
    /// 1.x direct-mode cases, for the `mcp` client: `NAME-direct.jsonl`.
    pub direct: Vec<String>,
}

impl CaseFiles {
    /// Writes `dataset`'s cases into `STEM.jsonl` and `STEM-direct.jsonl` (each only when it
    /// has cases).
    pub fn add(&mut self, imported: &mut Imported, stem: &str, dataset: &Dataset) {
        if !dataset.client_cases.is_empty() {
            let lines = case_lines(&dataset.client_cases);
            self.client
                .push(imported.add_file(&format!("{stem}.jsonl"), lines));
        }
        if !dataset.direct_cases.is_empty() {
            let lines = case_lines(&dataset.direct_cases);
            let file = imported.add_file(&format!("{stem}-direct.jsonl"), lines);
            self.direct.push(file);
        }
    }
}

/// The file of the eval for direct-mode cases: `eval-direct.json` beside the client's eval,
/// `eval.json` when it is `alone`.
fn direct_file(alone: bool) -> &'static str {
    if alone {
        EVAL_FILE
    } else {
        "eval-direct.json"
    }
}

/// The name of the eval for direct-mode cases: the eval's own when it is `alone`.
fn direct_name(name: &str, alone: bool) -> String {
    if alone {
        name.to_string()
    } else {
        format!("{name}-direct")
    }
}

/// Writes a converted config's evals: `eval`, which runs `files.client`, and the same eval
/// on the `mcp` client (without the model, its provider and the variants) for
/// `files.direct`. An eval with
/// no case to run is not written: mst would refuse it.
pub(super) fn config_evals(
    src: &mut Source,
    imported: &mut Imported,
    mut eval: Map<String, Value>,
    files: &CaseFiles,
) {
    let alone = files.client.is_empty();
    if !alone {
        imported.add_file(EVAL_FILE, pretty(&eval));
    }
    if files.direct.is_empty() {
        if alone {
            no_cases(src);
        }
        return;
    }
    let name = (eval.get("name").and_then(Value::as_str))
        .unwrap_or_default()
        .to_string();
    eval.insert("name".into(), json!(direct_name(&name, alone)));
    eval.insert("datasets".into(), json!(files.direct));
    eval.insert("client".into(), json!("mcp"));
    for key in ["model", "clientOptions", "variants", "baseline"] {
        eval.remove(key);
    }
    // The `mcp` client drives no model: a provider only judges use is kept (mst refuses to
    // run an eval whose provider's key is not set).
    if let Some(Value::Object(entries)) = eval.get_mut("providers") {
        entries.retain(|provider, _| src.judge_providers.contains(provider));
        if entries.is_empty() {
            eval.remove("providers");
        }
    }
    let text = if alone {
        "1.x direct-mode cases → eval.json, on the `mcp` client: every case is one, so there \
         is no eval for the model's client"
    } else {
        "1.x direct-mode cases → a second eval, eval-direct.json, on the `mcp` client"
    };
    src.note("datasets", Change::Rewritten, text);
    imported.add_file(direct_file(alone), pretty(&eval));
}

/// Says that no eval was written: no case converted.
fn no_cases(src: &mut Source) {
    src.report.todo("write an eval by hand: no case converted, so none was written (mst refuses an eval without cases)");
}

/// One starter eval of a dataset converted alone.
struct Starter {
    name: String,
    /// Its case file.
    cases: String,
    /// `api` or `mcp`.
    client: &'static str,
    /// Its own file.
    file: &'static str,
}

/// Converts a dataset given alone (`value`, an object): its case files, and a starter eval
/// for them (1.x kept servers and the model in Playwright's config, which the import cannot
/// read).
pub(super) fn dataset_alone(
    src: &mut Source,
    value: &Value,
    imported: &mut Imported,
) -> Result<()> {
    let dataset = cases::convert(src, value, &CaseDefaults::default())?;
    let name = name_of(src, &dataset.name);
    let mut files = CaseFiles::default();
    files.add(imported, &src.stem(), &dataset);
    let mut starters = Vec::new();
    if let Some(cases) = files.client.pop() {
        let (name, file) = (name.clone(), EVAL_FILE);
        starters.push(Starter {
            name,
            cases,
            client: "api",
            file,
        });
    }
    if let Some(cases) = files.direct.pop() {
        let alone = starters.is_empty();
        let (name, file) = (direct_name(&name, alone), direct_file(alone));
        starters.push(Starter {
            name,
            cases,
            client: "mcp",
            file,
        });
    }
    if starters.is_empty() {
        no_cases(src);
    }
    for starter in starters {
        starter_eval(src, imported, starter);
    }
    validate(src, imported);
    src.note("dataset", Change::Rewritten, "a dataset alone → its cases and a starter eval (MST's default verdict kept: `casePass: {\"share\": 1}`, every trial must pass)");
    Ok(())
}

/// Writes a starter eval: no servers and, on the `api` client, no model yet (steps to do).
fn starter_eval(src: &mut Source, imported: &mut Imported, starter: Starter) {
    let mut eval = Map::new();
    eval.insert("name".into(), json!(starter.name));
    eval.insert("datasets".into(), json!([starter.cases]));
    eval.insert("servers".into(), json!({}));
    eval.insert("client".into(), json!(starter.client));
    if starter.client == "api" {
        src.report.todo("set `model` (PROVIDER/MODEL) and its `providers` entry in eval.json: a 1.x dataset names no model");
    }
    let providers = src.judge_providers.iter().cloned().collect();
    eval.insert("casePass".into(), json!({"share": 1}));
    finish(src, &mut eval, providers, None);
    let file = starter.file;
    src.report.todo(format!(
        "name your MCP server(s) under `servers` in {file}: 1.x kept them in Playwright's config"
    ));
    imported.add_file(file, pretty(&eval));
}

/// The parts every converted eval ends with: provider entries, the rubric plugin and its
/// grants, MST's all-judges-pass trial rule, and steps left to do.
pub(super) fn finish(
    src: &mut Source,
    eval: &mut Map<String, Value>,
    mut providers: Vec<String>,
    pricing: Option<&Map<String, Value>>,
) {
    providers.sort();
    providers.dedup();
    let entries = provider_entries(src, &providers, pricing);
    if !entries.is_empty() {
        eval.insert("providers".into(), Value::Object(entries));
    }
    if !src.judge_providers.is_empty() {
        let grants: Vec<&String> = src.judge_providers.iter().collect();
        eval.insert(
            "plugins".into(),
            json!([{"path": RUBRIC_PLUGIN, "allowModel": grants}]),
        );
        // MST passes a trial when every assertion and judge passes; mst also asks the
        // weighted score to reach `passThreshold`, which a judge scoring 0.8 would miss.
        eval.insert("passThreshold".into(), json!(0));
        src.note("passThreshold", Change::Rewritten, "`passThreshold: 0`: a trial passes when every judge passes, MST's rule (an LLM judge's score below 1 would otherwise fail it)");
        src.report.todo(format!("install mst's rubric grader as `{RUBRIC_PLUGIN}`: `cargo xtask plugins`, then `mst plugin install plugins/dist/rubric.wasm`"));
    }
}

/// Loads every written eval and case the way `mst run` would: each eval parses and
/// validates, and its datasets are written case files that hold cases. A failure becomes a
/// step to do (the files are still written: the report says what to fix).
pub(super) fn validate(src: &mut Source, imported: &Imported) {
    let mut problems = Vec::new();
    for (name, text) in &imported.files {
        if name.ends_with(".json") {
            match EvalConfig::parse(text, Path::new(name)) {
                Ok(config) => problems.extend(dataset_problem(imported, name, &config)),
                Err(e) => problems.push(format!("{name}: {e:#}")),
            }
        } else {
            // Blank lines are skipped, as `mst run` skips them.
            for (n, line) in text.lines().enumerate() {
                if line.trim().is_empty() {
                    continue;
                }
                let parsed = serde_json::from_str::<crate::eval::trial::CaseRecord>(line);
                if let Err(e) = parsed {
                    problems.push(format!("{name}:{}: {e}", n + 1));
                }
            }
        }
    }
    for problem in problems {
        src.report.todo(format!("fix before running: {problem}"));
    }
}

/// What `mst run` would refuse in eval `name`'s datasets: a file the import did not write,
/// or no case at all.
fn dataset_problem(imported: &Imported, name: &str, config: &EvalConfig) -> Option<String> {
    let mut cases = 0;
    for dataset in &config.datasets {
        // The import writes only paths; another source is the user's to check.
        let DatasetRef::Path(path) = dataset else {
            return None;
        };
        let Some((_, text)) = imported.files.iter().find(|(file, _)| file == path) else {
            return Some(format!("{name}: dataset `{path}` was not written"));
        };
        cases += text.lines().filter(|line| !line.trim().is_empty()).count();
    }
    (cases == 0).then(|| format!("{name}: the datasets hold no cases"))
}

/// The cases as JSONL, id first.
fn case_lines(cases: &[Value]) -> String {
    cases
        .iter()
        .map(|case| render(case, CASE_ORDER, None) + "\n")
        .collect()
}

/// An eval as indented JSON, its keys in [`EVAL_ORDER`] (serde_json's maps are sorted).
fn pretty(eval: &Map<String, Value>) -> String {
    render(&Value::Object(eval.clone()), EVAL_ORDER, Some("  "))
}

/// Renders `object` with its keys in `order` first: on one line, or indented by `indent`.
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The steps `validate` leaves for `files`.
    fn problems(files: &[(&str, &str)]) -> Vec<String> {
        let imported = Imported {
            files: (files.iter())
                .map(|(name, text)| (name.to_string(), text.to_string()))
                .collect(),
            ..Imported::default()
        };
        let mut src = Source::new(Path::new("mst.json"));
        validate(&mut src, &imported);
        src.report.todo
    }

    #[test]
    fn an_eval_mst_would_refuse_for_its_datasets_is_a_step_to_fix() {
        let eval = |datasets: &str| {
            format!(
                r#"{{"name": "e", "datasets": {datasets}, "client": "mcp", "servers": {{"t": {{"command": "t"}}}}}}"#
            )
        };
        let case = "{\"id\": \"a\", \"input\": {\"tool\": \"t\"}}\n";
        assert_eq!(
            problems(&[("eval.json", &eval(r#"["a.jsonl"]"#)), ("a.jsonl", case)]),
            Vec::<String>::new()
        );
        let cases = [
            (eval("[]"), "`datasets` is empty"),
            (
                eval(r#"["b.jsonl"]"#),
                "eval.json: dataset `b.jsonl` was not written",
            ),
            (
                eval(r#"["blank.jsonl"]"#),
                "eval.json: the datasets hold no cases",
            ),
        ];
        for (text, expected) in cases {
            let found = problems(&[("eval.json", &text), ("blank.jsonl", "\n")]);
            assert!(
                found.len() == 1
                    && found[0].starts_with("fix before running: eval.json")
                    && found[0].contains(expected),
                "{expected}: {found:?}"
            );
        }
    }

    #[test]
    fn a_config_whose_cases_are_all_direct_mode_writes_one_eval_that_loads() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.json");
        std::fs::write(
            &config,
            r#"{"name": "direct", "datasets": ["direct.json"], "model": "claude-haiku-4-5",
                "servers": {"time": {"transport": "stdio", "command": "python3"}}}"#,
        )
        .unwrap();
        std::fs::write(
            dir.path().join("direct.json"),
            r#"{"name": "direct", "cases": [
                 {"id": "tokyo", "mode": "direct", "toolName": "get_current_time",
                  "args": {"timezone": "Asia/Tokyo"}, "expectedTextContains": "Tokyo"}]}"#,
        )
        .unwrap();
        let imported = super::super::import(&config).unwrap();
        let names: Vec<&str> = imported.files.iter().map(|(f, _)| f.as_str()).collect();
        assert_eq!(
            names,
            ["direct-direct.jsonl", "eval.json"],
            "no eval without cases"
        );
        // Every written eval loads, and its datasets hold cases, as `mst run` needs.
        for (name, text) in imported.files.iter().filter(|(f, _)| f.ends_with(".json")) {
            let eval = EvalConfig::parse(text, Path::new(name)).unwrap();
            assert_eq!(
                (eval.name.as_str(), eval.client.as_str()),
                ("direct", "mcp")
            );
            assert!(
                eval.providers.is_empty(),
                "the `mcp` client needs no model's key"
            );
            assert!(dataset_problem(&imported, name, &eval).is_none(), "{name}");
        }
        let report = &imported.report;
        assert!(
            !report
                .todo
                .iter()
                .any(|t| t.starts_with("fix before running") || t.starts_with("export")),
            "{:?}",
            report.todo
        );
        assert!(report.notes.iter().any(|n| n.at == "datasets"
            && n.text
                .contains("→ eval.json, on the `mcp` client: every case is one")));
    }
}
