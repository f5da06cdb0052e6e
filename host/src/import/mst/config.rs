//! MST eval configs → `eval.json`: servers, the client and its model, variants, run controls;
//! and the starter eval written beside a dataset converted alone.

use super::cases::{self, CaseDefaults, RUBRIC_PLUGIN};
use super::{ordered_line, ordered_pretty, Source};
use crate::import::{Change, Imported};
use anyhow::{bail, Result};
use serde_json::{json, Map, Value};
use std::path::Path;

/// Key order of a written case line and of `eval.json`.
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

/// Why MST's config keys that do not convert are dropped.
const DROPPED_KEYS: [(&str, &str); 11] = [
    (
        "metrics",
        "mst records outcomes, pass rates, tokens and cost itself (docs/results.md)",
    ),
    (
        "results",
        "runs are files under `mst run --results-dir`; there are no result-store plugins",
    ),
    (
        "plugins",
        "MST's plugins are npm packages; mst's are WebAssembly components",
    ),
    (
        "extends",
        "no shared configs; share providers in $MST_HOME/providers.json",
    ),
    ("coworkSetup", "mst has no Cowork client"),
    ("requireEvalEndpoint", "no equivalent"),
    (
        "redactStoredResponses",
        "mst stores full traces and always redacts the secret values it holds",
    ),
    (
        "tools",
        "the model sees the servers' own tools (no metadata overrides)",
    ),
    (
        "toolMap",
        "the model sees the servers' own tools (no metadata overrides)",
    ),
    ("maxCases", "select cases with `mst run --case ID`"),
    (
        "filterTags",
        "select cases with `mst run --case ID` (no tag filter)",
    ),
];

/// The client, model and options a config (or variant) converts to.
#[derive(Clone, Default)]
struct ClientChoice {
    client: Option<String>,
    /// `PROVIDER/MODEL`.
    model: Option<String>,
    provider: Option<String>,
    options: Map<String, Value>,
}

/// Converts config `object` and the datasets it names.
pub(super) fn convert(
    src: &mut Source,
    object: &Map<String, Value>,
    imported: &mut Imported,
) -> Result<()> {
    let mut eval = Map::new();
    let name = name_of(
        src,
        object
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or("imported"),
    );
    eval.insert("name".into(), json!(name));

    let mut servers = Map::new();
    if let Some(entries) = object.get("servers").and_then(Value::as_object) {
        for (label, entry) in entries {
            if let Some(server) = server_of(src, label, entry) {
                servers.insert(label.clone(), server);
            }
        }
    }
    let labels: Vec<String> = servers.keys().cloned().collect();

    let choice = client_of(src, "", object, true);
    let mut defaults = CaseDefaults {
        servers: labels.clone(),
        input_template: object
            .get("inputTemplate")
            .and_then(Value::as_str)
            .map(str::to_string),
        judge_model: choice
            .provider
            .clone()
            .zip(choice.model.as_ref().map(|m| bare_model(m))),
        ..CaseDefaults::default()
    };
    if defaults.input_template.is_some() {
        src.note(
            "inputTemplate",
            Change::Rewritten,
            "applied to each case's input (`{{input}}` replaced)",
        );
    }
    if let Some(judges) = object.get("judges").and_then(Value::as_array) {
        for (n, judge) in judges.iter().enumerate() {
            let at = format!("judges[{n}]");
            defaults
                .extra_judges
                .extend(judge_entry(src, &at, judge, &defaults));
        }
    }

    // Datasets, each into its own case file.
    let mut datasets = Vec::new();
    let mut direct = Vec::new();
    let base = src.path.parent().map(Path::to_path_buf).unwrap_or_default();
    for (n, entry) in object
        .get("datasets")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let at = format!("datasets[{n}]");
        let path = match entry {
            Value::String(path) => path.clone(),
            Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("file") => {
                match o.get("path").and_then(Value::as_str) {
                    Some(path) => path.to_string(),
                    None => bail!("{}: `{at}` is a file dataset without `path`", src.file),
                }
            }
            other => {
                src.note(&at, Change::Dropped, format!("dataset {other} is not a file: MST's dataset sources are npm plugins; convert its cases to a file"));
                continue;
            }
        };
        let previous = src.open(&base.join(&path));
        let dataset = cases::read(src, &defaults);
        src.open(&previous);
        let dataset = dataset?;
        let stem = Path::new(&path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| dataset.name.clone());
        if !dataset.client_cases.is_empty() {
            datasets.push(json!(imported.add_file(
                &format!("{stem}.jsonl"),
                case_lines(&dataset.client_cases)
            )));
        }
        if !dataset.direct_cases.is_empty() {
            direct.push(json!(imported.add_file(
                &format!("{stem}-direct.jsonl"),
                case_lines(&dataset.direct_cases)
            )));
        }
        src.note(
            &at,
            Change::Rewritten,
            format!("{path} → one case per line (`.jsonl`)"),
        );
    }
    eval.insert("datasets".into(), Value::Array(datasets.clone()));
    eval.insert("servers".into(), Value::Object(servers.clone()));
    apply_choice(&mut eval, &choice);

    // Variants: an array with a baseline → a map and `baseline`.
    let mut providers: Vec<String> = choice.provider.iter().cloned().collect();
    if let Some(list) = object.get("variants").and_then(Value::as_array) {
        let mut variants = Map::new();
        // serde_json's maps are sorted: the first in MST's list is kept here.
        let mut first = None;
        for (n, variant) in list.iter().enumerate() {
            let Some(variant) = variant.as_object() else {
                continue;
            };
            let vname = name_of(
                src,
                variant
                    .get("name")
                    .and_then(Value::as_str)
                    .unwrap_or(&format!("variant-{}", n + 1)),
            );
            let at = format!("variants[{vname}]");
            let mut out = Map::new();
            for (key, value) in variant {
                let here = format!("{at}.{key}");
                match key.as_str() {
                    "name" | "client" | "model" | "clientOptions" => {}
                    "servers" => {
                        out.insert("servers".into(), value.clone());
                    }
                    "judges" => {
                        let judges: Vec<Value> = value
                            .as_array()
                            .into_iter()
                            .flatten()
                            .enumerate()
                            .flat_map(|(i, j)| {
                                judge_entry(src, &format!("{here}[{i}]"), j, &defaults)
                            })
                            .collect();
                        if !judges.is_empty() {
                            src.note(&here, Change::Approximated, "mst applies a variant's judges only to cases without judges of their own (MST adds them to every case)");
                            out.insert("judges".into(), Value::Array(judges));
                        }
                    }
                    "description" => src.note(
                        &here,
                        Change::Dropped,
                        "a variant has no description in mst",
                    ),
                    "tools" | "toolMap" | "inputTemplate" | "metrics" => src.note(
                        &here,
                        Change::Dropped,
                        format!("a variant's `{key}` has no mst equivalent"),
                    ),
                    other => src.note(
                        &here,
                        Change::Dropped,
                        format!("`{other}` is not a key of MST's variant schema"),
                    ),
                }
            }
            if ["client", "model", "clientOptions"]
                .iter()
                .any(|k| variant.contains_key(*k))
            {
                let own = client_of(src, &format!("{at}."), variant, false);
                providers.extend(own.provider.clone());
                apply_choice(&mut out, &own);
            }
            first.get_or_insert_with(|| vname.clone());
            variants.insert(vname, Value::Object(out));
        }
        let baseline = match object.get("baseline").and_then(Value::as_str) {
            Some(baseline) => Some(baseline.to_string()),
            None => {
                if let Some(first) = &first {
                    src.note("variants", Change::Rewritten, format!("an array → a map by name; `baseline` names `{first}`, the first (MST's default)"));
                }
                first
            }
        };
        eval.insert("variants".into(), Value::Object(variants));
        if let Some(baseline) = baseline {
            eval.insert("baseline".into(), json!(baseline));
        }
    }
    if !defaults.extra_judges.is_empty() {
        src.note("judges", Change::Rewritten, "the config's judges apply to every case, and are added to each case's own (as MST does)");
        eval.insert("judges".into(), Value::Array(defaults.extra_judges.clone()));
    }
    run_controls(src, object, &mut eval);
    for (key, why) in DROPPED_KEYS {
        if object.contains_key(key) {
            src.note(key, Change::Dropped, why);
        }
    }
    for key in object.keys() {
        let known = [
            "name",
            "datasets",
            "servers",
            "client",
            "model",
            "provider",
            "clientOptions",
            "temperature",
            "maxTokens",
            "maxToolCalls",
            "pricing",
            "variants",
            "baseline",
            "judges",
            "inputTemplate",
            "trials",
            "concurrency",
            "passThreshold",
            "timeout",
            "run",
            "$schema",
        ];
        if key == "$schema" {
            src.note(
                "$schema",
                Change::Rewritten,
                "removed: mst reads no schema pointer",
            );
        } else if !known.contains(&key.as_str()) && !DROPPED_KEYS.iter().any(|(k, _)| k == key) {
            src.note(
                key,
                Change::Dropped,
                "not a key of MST's eval config schema",
            );
        }
    }
    providers.extend(src.judge_providers.iter().cloned());
    finish(src, &mut eval, providers, object.get("pricing"));
    imported.add_file(
        "eval.json",
        ordered_pretty(&Value::Object(eval.clone()), EVAL_ORDER),
    );
    if !direct.is_empty() {
        eval.insert("name".into(), json!(format!("{name}-direct")));
        eval.insert("datasets".into(), Value::Array(direct));
        eval.insert("client".into(), json!("mcp"));
        for key in ["model", "clientOptions", "variants", "baseline"] {
            eval.remove(key);
        }
        src.note(
            "datasets",
            Change::Rewritten,
            "1.x direct-mode cases → a second eval, eval-direct.json, on the `mcp` client",
        );
        imported.add_file(
            "eval-direct.json",
            ordered_pretty(&Value::Object(eval), EVAL_ORDER),
        );
    }
    validate(src, imported);
    Ok(())
}

/// Converts a dataset given alone: its case files, and a starter eval for them (1.x kept
/// servers and the model in Playwright's config, which the import cannot read).
pub(super) fn dataset_alone(
    src: &mut Source,
    object: &Map<String, Value>,
    imported: &mut Imported,
) -> Result<()> {
    let dataset = cases::convert(src, object, &CaseDefaults::default())?;
    let name = name_of(src, &dataset.name);
    let stem = src.stem();
    let mut evals = Vec::new();
    if !dataset.client_cases.is_empty() {
        let file = imported.add_file(&format!("{stem}.jsonl"), case_lines(&dataset.client_cases));
        evals.push((name.clone(), file, "api"));
    }
    if !dataset.direct_cases.is_empty() {
        let file = imported.add_file(
            &format!("{stem}-direct.jsonl"),
            case_lines(&dataset.direct_cases),
        );
        let eval_name = if evals.is_empty() {
            name.clone()
        } else {
            format!("{name}-direct")
        };
        evals.push((eval_name, file, "mcp"));
    }
    for (n, (eval_name, file, client)) in evals.into_iter().enumerate() {
        let mut eval = Map::new();
        eval.insert("name".into(), json!(eval_name));
        eval.insert("datasets".into(), json!([file]));
        eval.insert("servers".into(), json!({}));
        eval.insert("client".into(), json!(client));
        let mut providers = Vec::new();
        if client == "api" {
            src.report.todo("set `model` (PROVIDER/MODEL) and its `providers` entry in eval.json: a 1.x dataset names no model");
        }
        providers.extend(src.judge_providers.iter().cloned());
        eval.insert("casePass".into(), json!({"share": 1}));
        finish(src, &mut eval, providers, None);
        let eval_file = if n == 0 {
            "eval.json"
        } else {
            "eval-direct.json"
        };
        src.report.todo(format!("name your MCP server(s) under `servers` in {eval_file}: 1.x kept them in Playwright's config"));
        imported.add_file(eval_file, ordered_pretty(&Value::Object(eval), EVAL_ORDER));
    }
    validate(src, imported);
    src.note("dataset", Change::Rewritten, "a dataset alone → its cases and a starter eval (MST's default verdict kept: `casePass: {\"share\": 1}`, every trial must pass)");
    Ok(())
}

/// The parts every converted eval ends with: provider entries, the rubric plugin and its
/// grants, MST's all-judges-pass trial rule, and steps left to do.
fn finish(
    src: &mut Source,
    eval: &mut Map<String, Value>,
    mut providers: Vec<String>,
    pricing: Option<&Value>,
) {
    providers.sort();
    providers.dedup();
    let mut entries = Map::new();
    for provider in &providers {
        let var = src
            .key_vars
            .get(provider)
            .cloned()
            .unwrap_or_else(|| default_key_var(provider).to_string());
        let (format, base_url) = match provider.as_str() {
            "openai" => ("openai", "https://api.openai.com/v1"),
            "google" => (
                "openai",
                "https://generativelanguage.googleapis.com/v1beta/openai",
            ),
            _ => ("anthropic", "https://api.anthropic.com"),
        };
        let mut entry = json!({"format": format, "baseUrl": base_url, "key": format!("env:{var}")});
        if let Some(prices) = prices_for(src, provider, pricing) {
            entry["prices"] = prices;
        }
        entries.insert(provider.clone(), entry);
        src.report.todo(format!(
            "export {var} (the key of provider `{provider}`, read on the host only)"
        ));
    }
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

/// MST's `pricing` (USD per million tokens, by model) → a provider's `prices` for its models.
fn prices_for(src: &mut Source, provider: &str, pricing: Option<&Value>) -> Option<Value> {
    let mut prices = Map::new();
    for (model, price) in pricing?.as_object()? {
        if infer_provider(model).unwrap_or("anthropic") != provider {
            continue;
        }
        let (Some(input), Some(output)) = (price.get("input"), price.get("output")) else {
            continue;
        };
        prices.insert(model.clone(), json!({"input": input, "output": output}));
        if price.get("cacheRead").is_some() || price.get("cacheWrite").is_some() {
            src.note(
                &format!("pricing.{model}"),
                Change::Approximated,
                "cache read and write prices dropped: mst prices input and output tokens",
            );
        } else {
            src.note(
                &format!("pricing.{model}"),
                Change::Rewritten,
                format!("→ `providers.{provider}.prices`"),
            );
        }
    }
    (!prices.is_empty()).then_some(Value::Object(prices))
}

fn default_key_var(provider: &str) -> &'static str {
    match provider {
        "openai" => "OPENAI_API_KEY",
        "google" => "GEMINI_API_KEY",
        _ => "ANTHROPIC_API_KEY",
    }
}

/// `trials`, `concurrency`, `passThreshold` and `timeout`, at the top or under `run`.
fn run_controls(src: &mut Source, object: &Map<String, Value>, eval: &mut Map<String, Value>) {
    let run = object
        .get("run")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    if !run.is_empty() {
        src.note(
            "run",
            Change::Rewritten,
            "the `run` group's controls → top-level keys",
        );
    }
    let get = |key: &str| run.get(key).or_else(|| object.get(key)).cloned();
    if let Some(trials) = get("trials") {
        eval.insert("trials".into(), trials);
    }
    if let Some(concurrency) = get("concurrency") {
        eval.insert("concurrency".into(), concurrency);
        src.note(
            "concurrency",
            Change::Approximated,
            "mst's `concurrency` is per shard (trials at once on one machine)",
        );
    }
    match get("passThreshold").and_then(|v| v.as_f64()) {
        Some(share) => {
            eval.insert("casePass".into(), json!({"share": share}));
            src.note("passThreshold", Change::Rewritten, format!("the share of a case's trials that must pass → `casePass: {{\"share\": {share}}}` (mst's `passThreshold` is a per-trial score)"));
        }
        None => {
            eval.insert("casePass".into(), json!({"share": 1}));
            src.note("passThreshold", Change::Rewritten, "MST's default, every trial of a case must pass, written out as `casePass: {\"share\": 1}` (mst's default is a majority)");
        }
    }
    if let Some(ms) = object.get("timeout").and_then(Value::as_f64) {
        let seconds = (ms / 1000.0).ceil().max(1.0);
        eval.insert("timeout".into(), json!(seconds as u64));
        src.note(
            "timeout",
            Change::Rewritten,
            format!("{ms} ms → {seconds} s (mst's `timeout` is in seconds, per trial)"),
        );
    }
    for key in ["maxCases", "filterTags"] {
        if run.contains_key(key) {
            src.note(
                &format!("run.{key}"),
                Change::Dropped,
                "select cases with `mst run --case ID`",
            );
        }
    }
}

/// A config's `judges` entry: a `rubric` object converts, a plugin's name does not.
fn judge_entry(src: &mut Source, at: &str, judge: &Value, defaults: &CaseDefaults) -> Vec<Value> {
    if judge.get("type").and_then(Value::as_str) == Some("rubric") {
        return cases::rubric(src, at, judge, defaults);
    }
    let name = judge
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| judge.to_string());
    src.note(at, Change::Dropped, format!("judge {name} comes from an MST plugin (npm), which mst cannot load; write it as an mst grader plugin"));
    Vec::new()
}

/// Writes a client choice into an eval or variant object.
fn apply_choice(target: &mut Map<String, Value>, choice: &ClientChoice) {
    if let Some(client) = &choice.client {
        target.insert("client".into(), json!(client));
    }
    if let Some(model) = &choice.model {
        target.insert("model".into(), json!(model));
    }
    if !choice.options.is_empty() {
        target.insert(
            "clientOptions".into(),
            Value::Object(choice.options.clone()),
        );
    }
}

/// The client of a config (`top`) or a variant: MST's `mst` client, and the agent clients
/// mst does not have, become the `api` client driving the same model.
fn client_of(
    src: &mut Source,
    prefix: &str,
    object: &Map<String, Value>,
    top: bool,
) -> ClientChoice {
    let mut choice = ClientChoice::default();
    let client = object.get("client").and_then(Value::as_str);
    let at = format!("{prefix}client");
    match client {
        Some("mst" | "vercel-sdk" | "anthropic-api") => src.note(&at, Change::Rewritten, "MST's own agent client → the `api` client"),
        Some(other) => src.note(&at, Change::Approximated, format!("mst has no `{other}` client: the `api` client drives the same model with mst's agent loop (to test `{other}` itself, run it as a `command` client)")),
        None if top => src.note(&at, Change::Approximated, "MST's default client, claude-code, → the `api` client driving the model"),
        None => {}
    }
    if client.is_some() || top {
        choice.client = Some("api".into());
    }
    let options = object
        .get("clientOptions")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let named = object
        .get("provider")
        .or_else(|| options.get("provider"))
        .and_then(Value::as_str)
        .map(str::to_string);
    if let Some(model) = object.get("model").and_then(Value::as_str) {
        let provider = match &named {
            Some(named) => Some(provider_name(src, &format!("{prefix}provider"), named)),
            None => infer_provider(model).map(str::to_string),
        };
        match provider {
            Some(provider) => {
                choice.model = Some(format!("{provider}/{model}"));
                src.note(
                    &format!("{prefix}model"),
                    Change::Rewritten,
                    format!("→ `{provider}/{model}` with a `providers.{provider}` entry"),
                );
                choice.provider = Some(provider);
            }
            None => {
                src.note(
                    &format!("{prefix}model"),
                    Change::Dropped,
                    format!("cannot tell the provider of model {model:?}"),
                );
                src.report.todo(format!(
                    "set `{prefix}model` as PROVIDER/MODEL for {model:?}, with a `providers` entry"
                ));
            }
        }
    } else if top {
        src.report
            .todo("set `model` (PROVIDER/MODEL) in eval.json: the MST config names none");
    }
    let mut levels = vec![("clientOptions", options.clone())];
    if top {
        let generation: Map<String, Value> = ["temperature", "maxTokens", "maxToolCalls"]
            .iter()
            .filter_map(|k| object.get(*k).map(|v| (k.to_string(), v.clone())))
            .collect();
        levels.push(("", generation));
    }
    for (level, values) in levels {
        for (key, value) in values {
            let here = if level.is_empty() {
                format!("{prefix}{key}")
            } else {
                format!("{prefix}{level}.{key}")
            };
            match key.as_str() {
                "temperature" | "maxTokens" => {
                    choice.options.insert(key.clone(), value);
                    src.note(&here, Change::Rewritten, format!("→ `clientOptions.{key}`"));
                }
                "systemPrompt" => {
                    choice.options.insert("system".into(), value);
                    src.note(&here, Change::Rewritten, "→ `clientOptions.system`");
                }
                "maxToolCalls" => {
                    let calls = value.as_u64().unwrap_or(5);
                    choice.options.insert("maxTurns".into(), json!(calls + 1));
                    src.note(&here, Change::Approximated, format!("→ `clientOptions.maxTurns: {}`: mst bounds model calls, not tool calls (grade the count with `tool-call-count`)", calls + 1));
                }
                "apiKeyEnvVar" => {
                    if let (Some(provider), Some(var)) = (&choice.provider, value.as_str()) {
                        src.key_vars.insert(provider.clone(), var.to_string());
                        src.note(
                            &here,
                            Change::Rewritten,
                            format!("→ the provider's `key: \"env:{var}\"`"),
                        );
                    }
                }
                "provider" => {}
                "timeout" => src.note(
                    &here,
                    Change::Dropped,
                    "the trial's `timeout` bounds the client",
                ),
                other => src.note(
                    &here,
                    Change::Dropped,
                    format!("the `api` client has no option `{other}`"),
                ),
            }
        }
    }
    choice
}

/// MST's provider names → mst provider entry names.
pub(super) fn provider_name(src: &mut Source, at: &str, named: &str) -> String {
    match named {
        "anthropic" | "openai" | "google" => named.to_string(),
        "claude" => {
            src.note(at, Change::Rewritten, "`claude` → `anthropic`");
            "anthropic".into()
        }
        "vertex" | "vertex-anthropic" | "anthropic-agent-sdk" => {
            src.note(at, Change::Approximated, format!("`{named}` → the Anthropic API (`anthropic`); point its `baseUrl` at your gateway if you use one"));
            "anthropic".into()
        }
        other => {
            src.note(
                at,
                Change::Approximated,
                format!("unknown provider `{other}` → `anthropic`"),
            );
            "anthropic".into()
        }
    }
}

/// The provider MST would infer from a model id.
fn infer_provider(model: &str) -> Option<&'static str> {
    if model.starts_with("claude") {
        Some("anthropic")
    } else if ["gpt", "o1", "o3", "o4", "chatgpt"]
        .iter()
        .any(|p| model.starts_with(p))
    {
        Some("openai")
    } else if model.starts_with("gemini") {
        Some("google")
    } else {
        None
    }
}

/// `PROVIDER/MODEL` → `MODEL`.
fn bare_model(model: &str) -> String {
    model.split_once('/').map_or(model, |(_, m)| m).to_string()
}

/// A name mst accepts for an eval or variant (letters, digits, `-`, `_`, `.`).
fn name_of(src: &mut Source, name: &str) -> String {
    let clean: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.".contains(c) {
                c
            } else {
                '-'
            }
        })
        .collect();
    let clean = if clean.is_empty() {
        "imported".to_string()
    } else {
        clean
    };
    if clean != name {
        src.note(
            "name",
            Change::Rewritten,
            format!("{name:?} → {clean:?} (mst names are letters, digits, `-`, `_`, `.`)"),
        );
    }
    clean
}

/// An MST server entry → mst's; `None` (reported) when mst cannot reach it.
fn server_of(src: &mut Source, label: &str, entry: &Value) -> Option<Value> {
    let at = format!("servers.{label}");
    let Some(entry) = entry.as_object() else {
        src.note(&at, Change::Dropped, "not an object");
        return None;
    };
    if entry.contains_key("connector") {
        src.note(&at, Change::Dropped, "connector servers (signed in with `mst auth`) have no mst equivalent: give the server's URL and a token");
        return None;
    }
    let http = match entry.get("transport").and_then(Value::as_str) {
        Some("stdio") => false,
        Some(_) => true,
        None => !entry.contains_key("command"),
    };
    let mut out = Map::new();
    for (key, value) in entry {
        let here = format!("{at}.{key}");
        match (http, key.as_str()) {
            (_, "transport") => {}
            (_, "label") => src.note(&here, Change::Rewritten, "removed: the map key is the label"),
            (false, "command" | "args" | "env") => {
                out.insert(key.clone(), value.clone());
            }
            (false, "cwd") => src.note(&here, Change::Dropped, format!("{value}: mst starts a stdio server in the trial's scratch directory (`cwd` may only name a directory inside it); use absolute paths in `args`")),
            (false, "inheritEnv") => src.note(&here, Change::Dropped, "a stdio server gets only its `env`, `envSecrets` and PATH, HOME, TMPDIR and the locale: list every variable it needs in `env`"),
            (true, "serverUrl" | "url") => {
                out.insert("url".into(), value.clone());
                if key == "serverUrl" {
                    src.note(&here, Change::Rewritten, "→ `url`");
                }
            }
            (true, "headers") => {
                out.insert("headers".into(), value.clone());
                src.note(&here, Change::Approximated, "written as given: move any secret value into `headerSecrets` (values from `--secrets-file` or `env:VAR`)");
            }
            (true, "auth") => auth_of(src, label, &here, value, &mut out),
            (_, "capabilities" | "protocol" | "protocolProbe" | "connectTimeoutMs" | "requestTimeoutMs" | "callTimeoutMs" | "retryAttempts" | "proxy" | "tls" | "quiet" | "minTools" | "files") => {
                src.note(&here, Change::Dropped, "mst has no such server setting (the trial's `timeout` bounds every call)")
            }
            (_, other) => src.note(&here, Change::Dropped, format!("`{other}` does not apply to a {} server", if http { "HTTP" } else { "stdio" })),
        }
    }
    if !http {
        src.note(
            &at,
            Change::Rewritten,
            "stdio server: `transport` removed (an entry without `url` is stdio)",
        );
    }
    Some(Value::Object(out))
}

/// An HTTP server's `auth` → `token`. A token written in the MST file is never copied into
/// mst's files: the entry names an environment variable to hold it instead.
fn auth_of(src: &mut Source, label: &str, at: &str, auth: &Value, out: &mut Map<String, Value>) {
    if let Some(var) = auth.get("accessTokenEnv").and_then(Value::as_str) {
        out.insert("token".into(), json!(format!("env:{var}")));
        src.note(
            at,
            Change::Rewritten,
            format!("`accessTokenEnv` → `token: \"env:{var}\"`"),
        );
    } else if auth.get("accessToken").is_some() {
        let var = format!(
            "{}_TOKEN",
            label
                .to_ascii_uppercase()
                .chars()
                .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
                .collect::<String>()
        );
        out.insert("token".into(), json!(format!("env:{var}")));
        src.note(
            at,
            Change::Rewritten,
            format!("the token written in the config (not copied) → `token: \"env:{var}\"`"),
        );
        src.report.todo(format!("export {var} with server `{label}`'s token (MST's config held it in `auth.accessToken`)"));
    }
    for key in ["oauth", "clientCredentials"] {
        if auth.get(key).is_some() {
            src.note(
                &format!("{at}.{key}"),
                Change::Dropped,
                "mst does not sign in: get a token yourself and give it as `token`",
            );
            src.report.todo(format!(
                "give server `{label}` a `token` (MST signed in with `auth.{key}`)"
            ));
        }
    }
}

/// The cases as JSONL, id first.
fn case_lines(cases: &[Value]) -> String {
    cases
        .iter()
        .map(|c| ordered_line(c, CASE_ORDER) + "\n")
        .collect()
}

/// Loads every written eval and case the way `mst run` would; a failure becomes a step to do
/// (the files are still written: the report says what to fix).
fn validate(src: &mut Source, imported: &Imported) {
    let mut problems = Vec::new();
    for (name, text) in &imported.files {
        if name.ends_with(".json") {
            if let Err(e) = crate::eval::config::EvalConfig::parse(text, Path::new(name)) {
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
