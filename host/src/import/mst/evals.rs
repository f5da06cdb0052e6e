//! The files an import writes: case files (one case per line, id first), the evals that run
//! them (`eval.json` for the cases a client answers; the 1.x direct-mode cases on the `mcp`
//! client in `eval-direct.json` beside it, or in `eval.json` when a dataset alone has no
//! other), the starter evals of a dataset converted alone, and the check that every written
//! eval loads as `mst run` would load it.

use super::assertions::RUBRIC_PLUGIN;
use super::cases::{self, CaseDefaults, Dataset};
use super::client::provider_entries;
use super::config::name_of;
use super::Source;
use crate::eval::config::EvalConfig;
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
/// on the `mcp` client (without the model and variants) for `files.direct`.
pub(super) fn config_evals(
    src: &mut Source,
    imported: &mut Imported,
    mut eval: Map<String, Value>,
    files: &CaseFiles,
) {
    imported.add_file(EVAL_FILE, pretty(&eval));
    if files.direct.is_empty() {
        return;
    }
    let name = (eval.get("name").and_then(Value::as_str))
        .unwrap_or_default()
        .to_string();
    eval.insert("name".into(), json!(direct_name(&name, false)));
    eval.insert("datasets".into(), json!(files.direct));
    eval.insert("client".into(), json!("mcp"));
    for key in ["model", "clientOptions", "variants", "baseline"] {
        eval.remove(key);
    }
    src.note(
        "datasets",
        Change::Rewritten,
        "1.x direct-mode cases → a second eval, eval-direct.json, on the `mcp` client",
    );
    imported.add_file(direct_file(false), pretty(&eval));
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

/// Loads every written eval and case the way `mst run` would; a failure becomes a step to do
/// (the files are still written: the report says what to fix).
pub(super) fn validate(src: &mut Source, imported: &Imported) {
    let mut problems = Vec::new();
    for (name, text) in &imported.files {
        if name.ends_with(".json") {
            if let Err(e) = EvalConfig::parse(text, Path::new(name)) {
                problems.push(format!("{name}: {e:#}"));
            }
        } else {
            for (n, line) in text.lines().enumerate() {
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
