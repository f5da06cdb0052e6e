//! MST datasets and cases → mst cases: `{"name", "cases"}` files of 2.0 and 1.x, each case's
//! `assertions` (1.x `expect` and flat `expected*` keys) and judges → mst judges.

use super::Source;
use crate::import::Change;
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};

/// The installed name (and `plugin` of a judge entry) of mst's LLM rubric grader.
pub(super) const RUBRIC_PLUGIN: &str = "mst/grader/rubric";

/// MST's default pass mark for an LLM judge; mst's rubric plugin defaults to 0.5, so the
/// import always writes the threshold out.
const MST_JUDGE_THRESHOLD: f64 = 0.7;

/// Texts for MST's named rubrics, which mst does not have: a one-line statement of each
/// name's meaning, so the converted judge still checks what the name asked for.
const NAMED_RUBRICS: [(&str, &str); 5] = [
    (
        "correctness",
        "The answer is factually correct and agrees with the expected answer, when one is given.",
    ),
    (
        "completeness",
        "The answer covers every part of the request; nothing asked for is left out.",
    ),
    (
        "groundedness",
        "Every claim in the answer is supported by what the tools returned; nothing is made up.",
    ),
    (
        "instruction-following",
        "The answer does what the request asks, in the form the request asks for.",
    ),
    (
        "conciseness",
        "The answer is brief and to the point, without padding or repetition.",
    ),
];

/// What every case of an eval shares: the config's judges and template, the server labels.
#[derive(Default)]
pub(super) struct CaseDefaults {
    /// Converted judges of the config's `judges`: MST adds them to each case's own.
    pub extra_judges: Vec<Value>,
    /// The config's `inputTemplate` (`{{input}}` replaced by each case's input).
    pub input_template: Option<String>,
    /// Server labels, to read `LABEL.tool` names.
    pub servers: Vec<String>,
    /// The provider and model of LLM judges that name none: the eval's own.
    pub judge_model: Option<(String, String)>,
}

/// A converted dataset.
pub(super) struct Dataset {
    /// The dataset's `name` (or the file's stem).
    pub name: String,
    /// Cases for a client (an `input` text).
    pub client_cases: Vec<Value>,
    /// 1.x direct-mode cases (a tool call), for the `mcp` client.
    pub direct_cases: Vec<Value>,
}

/// Reads and converts MST dataset `file` (relative paths from the current directory).
pub(super) fn read(src: &mut Source, defaults: &CaseDefaults) -> Result<Dataset> {
    let value = super::read_json(&src.path)?;
    let Some(object) = value.as_object() else {
        bail!(
            "{} is not an MST dataset: expected an object with `name` and `cases`",
            src.file
        );
    };
    convert(src, object, defaults)
}

/// Converts a dataset object already read.
pub(super) fn convert(
    src: &mut Source,
    object: &Map<String, Value>,
    defaults: &CaseDefaults,
) -> Result<Dataset> {
    let Some(cases) = object.get("cases").and_then(Value::as_array) else {
        bail!(
            "{} is not an MST dataset: `cases` must be an array of cases",
            src.file
        );
    };
    let name = object
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| src.stem());
    for (key, value) in object {
        match key.as_str() {
            "name" | "cases" => {}
            "$schema" => src.note("$schema", Change::Rewritten, "removed: mst reads no schema pointer"),
            "description" | "metadata" => src.note(
                key,
                Change::Dropped,
                format!("the dataset's {key} has no place in mst's case files (one case per line): {value}"),
            ),
            other => src.note(other, Change::Dropped, "not a key of MST's dataset schema"),
        }
    }
    let mut dataset = Dataset {
        name,
        client_cases: Vec::new(),
        direct_cases: Vec::new(),
    };
    for (index, case) in cases.iter().enumerate() {
        let Some(case) = case.as_object() else {
            bail!("{}: case #{} is not an object", src.file, index + 1);
        };
        let converted = convert_case(src, case, index, defaults)?;
        match converted {
            Some((case, true)) => dataset.direct_cases.push(case),
            Some((case, false)) => dataset.client_cases.push(case),
            None => {}
        }
    }
    Ok(dataset)
}

/// Converts one case; `None` when it cannot run in mst at all (reported). The flag is true
/// for a direct-mode (tool call) case.
fn convert_case(
    src: &mut Source,
    case: &Map<String, Value>,
    index: usize,
    defaults: &CaseDefaults,
) -> Result<Option<(Value, bool)>> {
    let id = match case.get("id").and_then(Value::as_str) {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => {
            let id = format!("case-{}", index + 1);
            src.note(
                &format!("cases[{}]", index),
                Change::Rewritten,
                format!("no `id`: named `{id}`"),
            );
            id
        }
    };
    let at = format!("cases[{id}]");
    let mut out = Map::new();
    out.insert("id".into(), json!(id));
    let mut metadata = case
        .get("metadata")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let mut judges: Vec<Value> = Vec::new();
    let mut source_checks = defaults.extra_judges.len();
    let mut direct = matches!(case.get("mode").and_then(Value::as_str), Some("direct"));
    let mut tool_call: Option<(String, Value)> = None;
    let mut input: Option<String> = None;
    for (key, value) in case {
        let here = format!("{at}.{key}");
        match key.as_str() {
            "id" | "metadata" => {}
            "input" | "scenario" => {
                input = value.as_str().map(str::to_string);
                if input.is_none() {
                    bail!("{}: `{here}` must be a string (the client's prompt)", src.file);
                }
                if key == "scenario" {
                    src.note(&here, Change::Rewritten, "1.x `scenario` → `input`");
                }
            }
            "description" => {
                metadata.insert("description".into(), value.clone());
                src.note(&here, Change::Rewritten, "→ `metadata.description`");
            }
            "tags" => {
                out.insert("tags".into(), value.clone());
            }
            "trials" | "iterations" => {
                out.insert("trials".into(), value.clone());
                if key == "iterations" {
                    src.note(&here, Change::Rewritten, "1.x `iterations` → `trials`");
                }
            }
            "passThreshold" | "accuracyThreshold" => {
                let share = value.as_f64().with_context(|| {
                    format!("{}: `{here}` must be a number from 0 to 1", src.file)
                })?;
                out.insert("casePass".into(), json!({"share": share}));
                src.note(
                    &here,
                    Change::Rewritten,
                    format!("the share of trials that must pass → `casePass: {{\"share\": {share}}}`"),
                );
            }
            "expected" => {
                out.insert("expected".into(), expected_of(src, &here, value));
            }
            "canonicalAnswer" => {
                out.insert("expected".into(), value.clone());
                src.note(&here, Change::Rewritten, "1.x `canonicalAnswer` → `expected`");
            }
            "assertions" | "expect" => {
                let Some(block) = value.as_object() else {
                    bail!("{}: `{here}` must be an object of assertions", src.file);
                };
                if key == "expect" {
                    src.note(&here, Change::Rewritten, "1.x `expect` → the case's judges");
                }
                source_checks += block.len();
                judges.extend(assertions(src, &here, block, defaults));
            }
            "judges" => {
                let list = value.as_array().cloned().unwrap_or_default();
                source_checks += list.len();
                for (n, judge) in list.iter().enumerate() {
                    let at = format!("{here}[{n}]");
                    judges.extend(judge_of(src, &at, judge, defaults));
                }
            }
            "expectedTextContains" | "expectedRegex" | "expectedExact" | "expectedSchemaName" => {
                source_checks += 1;
                judges.extend(flat_check(src, &here, key, value));
            }
            "mode" => match value.as_str() {
                Some("direct") => src.note(&here, Change::Rewritten, "direct mode → the `mcp` client's tool-call input"),
                Some("mcp_host" | "llm_host") => src.note(&here, Change::Rewritten, "removed: a case with a text input runs on the eval's client"),
                _ => src.note(&here, Change::Dropped, format!("mode {value} has no mst equivalent; the case runs on the eval's client")),
            },
            "toolName" => {
                direct = true;
                let name = value.as_str().unwrap_or_default().to_string();
                let args = case.get("args").cloned().unwrap_or_else(|| json!({}));
                tool_call = Some((name, args));
            }
            "args" => {}
            "request" => src.note(
                &here,
                Change::Dropped,
                "a raw MCP request has no mst case form; only tool calls (`toolName`, `args`) convert",
            ),
            "client" | "model" | "clientOptions" | "mcpHostConfig" => src.note(
                &here,
                Change::Dropped,
                "mst has no per-case client or model: put such cases in their own eval or variant",
            ),
            "judgeReps" => src.note(
                &here,
                Change::Dropped,
                "mst runs each judge once per trial (no averaged repeats)",
            ),
            other => src.note(&here, Change::Dropped, format!("`{other}` is not a key of MST's case schema")),
        }
    }
    if direct {
        let Some((tool, arguments)) = tool_call else {
            src.note(
                &at,
                Change::Dropped,
                "a direct-mode case without `toolName` cannot run in mst: case dropped",
            );
            src.lost_all_checks(&id);
            return Ok(None);
        };
        let (server, tool) = split_label(&tool, &defaults.servers);
        let mut call = json!({"tool": tool, "arguments": arguments});
        if let Some(server) = server {
            call["server"] = json!(server);
        }
        out.insert("input".into(), call);
    } else {
        let Some(text) = input else {
            src.note(
                &at,
                Change::Dropped,
                "a case without `input` (or 1.x `scenario`/`toolName`) cannot run: case dropped",
            );
            src.lost_all_checks(&id);
            return Ok(None);
        };
        let text = match &defaults.input_template {
            Some(template) => template.replace("{{input}}", &text),
            None => text,
        };
        out.insert("input".into(), json!(text));
    }
    if !metadata.is_empty() {
        out.insert("metadata".into(), Value::Object(metadata));
    }
    if !judges.is_empty() {
        // A case's judges replace the eval's in mst; MST adds the config's on top.
        judges.extend(defaults.extra_judges.iter().cloned());
        out.insert("judges".into(), Value::Array(judges));
    } else if source_checks > 0 && defaults.extra_judges.is_empty() {
        src.lost_all_checks(&id);
    }
    Ok(Some((Value::Object(out), direct)))
}

/// `expected`: `{"answer": A}` alone becomes `A`; anything richer is kept whole (the rubric
/// judge sees it as it is).
fn expected_of(src: &mut Source, at: &str, value: &Value) -> Value {
    match value.as_object() {
        Some(object) if object.len() == 1 && object.contains_key("answer") => {
            src.note(at, Change::Rewritten, "`expected.answer` → `expected`");
            object["answer"].clone()
        }
        _ => value.clone(),
    }
}

/// A case's `assertions` (or 1.x `expect`) → mst judges.
fn assertions(
    src: &mut Source,
    at: &str,
    block: &Map<String, Value>,
    defaults: &CaseDefaults,
) -> Vec<Value> {
    let mut judges = Vec::new();
    for (key, value) in block {
        let here = format!("{at}.{key}");
        match key.as_str() {
            "containsText" => {
                for text in strings(value) {
                    judges.push(json!({"assert": "contains", "value": text}));
                }
                src.note(&here, Change::Rewritten, "one `contains` judge per string");
            }
            "matchesPattern" => judges.extend(patterns(src, &here, value)),
            "toolsTriggered" => judges.extend(tools_triggered(src, &here, value, &defaults.servers)),
            "toolCallCount" => {
                let mut count = Map::new();
                for bound in ["min", "max", "exact"] {
                    if let Some(n) = value.get(bound) {
                        count.insert(bound.into(), n.clone());
                    }
                }
                judges.push(json!({"assert": "tool-call-count", "value": count}));
                src.note(&here, Change::Rewritten, "→ `tool-call-count`");
            }
            "passesJudge" => judges.extend(rubric(src, &here, value, defaults)),
            "isError" if value == &json!(false) => {
                judges.push(json!({"assert": "no-tool-errors"}));
                src.note(&here, Change::Rewritten, "`isError: false` → `no-tool-errors`");
            }
            "isError" | "response" | "schema" | "snapshot" | "responseSize" => src.note(
                &here,
                Change::Dropped,
                "mst has no check of a raw tool response's error flag, exact shape, schema, snapshot or size",
            ),
            other => src.note(&here, Change::Dropped, format!("`{other}` is not an MST assertion")),
        }
    }
    judges
}

/// 1.x flat checks (`expectedTextContains`, `expectedRegex`, `expectedExact`,
/// `expectedSchemaName`) → judges.
fn flat_check(src: &mut Source, at: &str, key: &str, value: &Value) -> Vec<Value> {
    match key {
        "expectedTextContains" => {
            src.note(at, Change::Rewritten, "one `contains` judge per string");
            strings(value)
                .into_iter()
                .map(|t| json!({"assert": "contains", "value": t}))
                .collect()
        }
        "expectedRegex" => patterns(src, at, value),
        "expectedExact" => match value.as_str() {
            Some(text) => {
                src.note(at, Change::Rewritten, "→ `equals`");
                vec![json!({"assert": "equals", "value": text})]
            }
            None => {
                src.note(
                    at,
                    Change::Dropped,
                    "mst's `equals` compares text; a structured response cannot be compared",
                );
                Vec::new()
            }
        },
        _ => {
            src.note(at, Change::Dropped, "mst has no named response schemas");
            Vec::new()
        }
    }
}

/// A string or a list of strings.
fn strings(value: &Value) -> Vec<String> {
    match value {
        Value::String(s) => vec![s.clone()],
        Value::Array(items) => items
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// Patterns → `regex` judges; one mst's regex engine cannot compile (JavaScript's
/// look-around, back-references) is dropped with the reason.
fn patterns(src: &mut Source, at: &str, value: &Value) -> Vec<Value> {
    let mut judges = Vec::new();
    for pattern in strings(value) {
        match regex::Regex::new(&pattern) {
            Ok(_) => judges.push(json!({"assert": "regex", "value": pattern})),
            Err(e) => src.note(
                at,
                Change::Dropped,
                format!("pattern {pattern:?} is not valid in mst's regex syntax (no look-around or back-references): {e}"),
            ),
        }
    }
    if !judges.is_empty() {
        src.note(at, Change::Rewritten, "one `regex` judge per pattern");
    }
    judges
}

/// Splits `LABEL.tool` when `LABEL` is a server label.
fn split_label<'a>(name: &'a str, servers: &[String]) -> (Option<&'a str>, &'a str) {
    match name.split_once('.') {
        Some((label, tool)) if servers.iter().any(|s| s == label) => (Some(label), tool),
        _ => (None, name),
    }
}

/// `toolsTriggered` → `tools-called`.
fn tools_triggered(src: &mut Source, at: &str, value: &Value, servers: &[String]) -> Vec<Value> {
    let calls = value
        .get("calls")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut tools = Vec::new();
    let mut optional = false;
    for (n, call) in calls.iter().enumerate() {
        let here = format!("{at}.calls[{n}]");
        let Some(name) = call.get("name").and_then(Value::as_str) else {
            src.note(&here, Change::Dropped, "a call without `name`");
            continue;
        };
        if let Some(kind) = call
            .get("kind")
            .and_then(Value::as_str)
            .filter(|k| *k != "tool_call")
        {
            src.note(
                &here,
                Change::Dropped,
                format!("mst's traces record tool calls only, not `{kind}` events"),
            );
            continue;
        }
        if call.get("required") == Some(&json!(false)) {
            optional = true;
            src.note(&here, Change::Dropped, format!("optional call `{name}` (`required: false`): mst lists only calls that must happen"));
            continue;
        }
        let name = match (
            call.get("server").and_then(Value::as_str),
            split_label(name, servers),
        ) {
            (Some(server), _) => format!("{server}__{name}"),
            (None, (Some(server), tool)) => format!("{server}__{tool}"),
            (None, (None, tool)) => tool.to_string(),
        };
        let mut entry = json!({"name": name});
        if let Some(arguments) = call.get("arguments").and_then(Value::as_object) {
            let mut kept = Map::new();
            for (arg, expected) in arguments {
                if expected.get("$pattern").is_some() {
                    src.note(
                        &format!("{here}.arguments.{arg}"),
                        Change::Approximated,
                        format!("a pattern argument ({expected}) is not checked: mst matches argument values exactly"),
                    );
                } else {
                    kept.insert(arg.clone(), expected.clone());
                }
            }
            if !kept.is_empty() {
                entry["arguments"] = Value::Object(kept);
            }
        }
        tools.push(entry);
    }
    if tools.is_empty() {
        return Vec::new();
    }
    let mut check = json!({"tools": tools});
    if value.get("order").and_then(Value::as_str) == Some("strict") {
        check["ordered"] = json!(true);
    }
    if value.get("exclusive") == Some(&json!(true)) {
        if optional {
            src.note(
                at,
                Change::Approximated,
                "`exclusive` dropped: it would reject the optional calls MST allowed",
            );
        } else {
            check["exclusive"] = json!(true);
        }
    }
    src.note(
        at,
        Change::Rewritten,
        "→ `tools-called` (arguments match partially, as in MST)",
    );
    vec![json!({"assert": "tools-called", "value": check})]
}

/// A case's `judges` entry: the built-in `rubric` converts; plugin judges do not.
fn judge_of(src: &mut Source, at: &str, judge: &Value, defaults: &CaseDefaults) -> Vec<Value> {
    match judge.get("type").and_then(Value::as_str) {
        Some("rubric") => rubric(src, at, judge, defaults),
        _ => {
            let name = judge
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| judge.to_string());
            src.note(at, Change::Dropped, format!("judge {name} is an MST plugin's (npm), which mst cannot load; write it as an mst grader plugin"));
            Vec::new()
        }
    }
}

/// An MST LLM judge (`passesJudge`, or a `rubric` judge entry) → mst's rubric plugin.
pub(super) fn rubric(
    src: &mut Source,
    at: &str,
    judge: &Value,
    defaults: &CaseDefaults,
) -> Vec<Value> {
    let text = match judge.get("rubric") {
        Some(Value::String(name)) => match NAMED_RUBRICS.iter().find(|(n, _)| n == name) {
            Some((_, text)) => {
                src.note(
                    at,
                    Change::Approximated,
                    format!("MST's named rubric `{name}` → mst's own text for it: {text:?}"),
                );
                text.to_string()
            }
            None => {
                src.note(at, Change::Dropped, format!("unknown rubric name {name:?}"));
                return Vec::new();
            }
        },
        Some(rubric) => match rubric.get("text").and_then(Value::as_str) {
            Some(text) => text.to_string(),
            None => {
                src.note(at, Change::Dropped, "a rubric without `text`");
                return Vec::new();
            }
        },
        None if judge.get("judge").is_some() => {
            src.note(at, Change::Dropped, "a custom judge from an MST plugin cannot run in mst; write it as an mst grader plugin");
            return Vec::new();
        }
        None => {
            src.note(at, Change::Dropped, "an LLM judge without a `rubric`");
            return Vec::new();
        }
    };
    let provider = match judge.get("provider").and_then(Value::as_str) {
        Some(named) => super::config::provider_name(src, &format!("{at}.provider"), named),
        None => defaults
            .judge_model
            .as_ref()
            .map(|(p, _)| p.clone())
            .unwrap_or_else(|| "anthropic".into()),
    };
    let model = judge
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| {
            defaults
                .judge_model
                .as_ref()
                .filter(|(p, _)| *p == provider)
                .map(|(_, m)| m.clone())
        });
    let Some(model) = model else {
        src.note(at, Change::Dropped, format!("an LLM judge on `{provider}` with no `model`, and the eval names none on that provider: add the judge by hand"));
        return Vec::new();
    };
    let threshold = judge
        .get("threshold")
        .and_then(Value::as_f64)
        .unwrap_or(MST_JUDGE_THRESHOLD);
    let mut options =
        json!({"provider": provider, "model": model, "rubric": text, "threshold": threshold});
    if let Some(max) = judge.get("maxTokens") {
        options["maxTokens"] = max.clone();
    }
    if let Some(var) = judge.get("apiKeyEnvVar").and_then(Value::as_str) {
        src.key_vars.insert(provider.clone(), var.to_string());
    }
    for key in ["reps", "temperature", "maxBudgetUsd", "maxToolOutputSize"] {
        if judge.get(key).is_some() {
            src.note(
                &format!("{at}.{key}"),
                Change::Dropped,
                "mst's rubric judge has no such option",
            );
        }
    }
    if let Some(reference) = judge.get("reference") {
        src.note(&format!("{at}.reference"), Change::Approximated, format!("the rubric judge sees the case's `expected`, not a reference of its own; put it there: {reference}"));
    }
    src.note(at, Change::Rewritten, format!("→ the `{RUBRIC_PLUGIN}` plugin (threshold {threshold} written out: the plugin's own default is 0.5)"));
    src.judge_providers.insert(provider);
    vec![json!({"plugin": RUBRIC_PLUGIN, "options": options})]
}
