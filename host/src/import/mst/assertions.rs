//! MST's checks → mst judges: a case's `assertions` (1.x `expect`), 1.x's flat `expected*`
//! checks, and judge entries (LLM `rubric` judges → mst's rubric plugin; plugin judges are
//! dropped).

use super::cases::CaseDefaults;
use super::format::shape;
use super::format::v2::{Assertions, ExpectedCall, LlmJudge, ToolCallCount, ToolsTriggered};
use super::Source;
use crate::import::Change;
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

/// A case's `assertions` (or 1.x `expect`) at `at` → mst judges, in the keys' alphabetical
/// order (the order the judges have always been written in), then the keys that are no
/// assertion.
pub(super) fn assertions(
    src: &mut Source,
    at: &str,
    block: &Assertions,
    defaults: &CaseDefaults,
) -> Vec<Value> {
    let here = |key: &str| format!("{at}.{key}");
    let mut judges = Vec::new();
    if let Some(texts) = &block.contains_text {
        judges.extend(contains(src, &here("containsText"), texts));
    }
    if let Some(is_error) = &block.is_error {
        if is_error == &json!(false) {
            judges.push(json!({"assert": "no-tool-errors"}));
            let text = "`isError: false` → `no-tool-errors`";
            src.note(&here("isError"), Change::Rewritten, text);
        } else {
            raw_response_check(src, &here("isError"));
        }
    }
    if let Some(patterns_given) = &block.matches_pattern {
        judges.extend(patterns(src, &here("matchesPattern"), patterns_given));
    }
    if let Some(judge) = &block.passes_judge {
        judges.extend(rubric(src, &here("passesJudge"), &shape(judge), defaults));
    }
    for (key, given) in [
        ("response", &block.response),
        ("responseSize", &block.response_size),
        ("schema", &block.schema),
        ("snapshot", &block.snapshot),
    ] {
        if given.is_some() {
            raw_response_check(src, &here(key));
        }
    }
    if let Some(count) = &block.tool_call_count {
        judges.push(tool_call_count(src, &here("toolCallCount"), &shape(count)));
    }
    if let Some(triggered) = &block.tools_triggered {
        let at = here("toolsTriggered");
        judges.extend(tools_triggered(
            src,
            &at,
            &shape(triggered),
            &defaults.servers,
        ));
    }
    for key in block.rest.keys() {
        let text = format!("`{key}` is not an MST assertion");
        src.note(&here(key), Change::Dropped, text);
    }
    judges
}

/// A check of the raw tool response, which mst's judges do not see.
fn raw_response_check(src: &mut Source, at: &str) {
    src.note(
        at,
        Change::Dropped,
        "mst has no check of a raw tool response's error flag, exact shape, schema, snapshot or size",
    );
}

/// `toolCallCount` → `tool-call-count`.
fn tool_call_count(src: &mut Source, at: &str, count: &ToolCallCount) -> Value {
    let mut bounds = Map::new();
    for (bound, given) in [
        ("min", &count.min),
        ("max", &count.max),
        ("exact", &count.exact),
    ] {
        if let Some(n) = given {
            bounds.insert(bound.into(), n.clone());
        }
    }
    src.note(at, Change::Rewritten, "→ `tool-call-count`");
    json!({"assert": "tool-call-count", "value": bounds})
}

/// Texts that must all be present (`containsText`, 1.x `expectedTextContains`) → one
/// `contains` judge each.
fn contains(src: &mut Source, at: &str, texts: &Value) -> Vec<Value> {
    src.note(at, Change::Rewritten, "one `contains` judge per string");
    strings(texts)
        .into_iter()
        .map(|text| json!({"assert": "contains", "value": text}))
        .collect()
}

/// A 1.x flat check (`expectedTextContains`, `expectedRegex`, `expectedExact`,
/// `expectedSchemaName`) → judges.
pub(super) fn flat_check(src: &mut Source, at: &str, key: &str, value: &Value) -> Vec<Value> {
    match key {
        "expectedTextContains" => contains(src, at, value),
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
pub(super) fn split_label<'a>(name: &'a str, servers: &[String]) -> (Option<&'a str>, &'a str) {
    match name.split_once('.') {
        Some((label, tool)) if servers.iter().any(|s| s == label) => (Some(label), tool),
        _ => (None, name),
    }
}

/// `toolsTriggered` → `tools-called`.
fn tools_triggered(
    src: &mut Source,
    at: &str,
    triggered: &ToolsTriggered,
    servers: &[String],
) -> Vec<Value> {
    let mut tools = Vec::new();
    let mut optional = false;
    for (n, call) in triggered.calls.iter().flatten().enumerate() {
        let here = format!("{at}.calls[{n}]");
        match expected_call(src, &here, &shape(call), servers) {
            Call::Listed(entry) => tools.push(entry),
            Call::Optional => optional = true,
            Call::Skipped => {}
        }
    }
    if tools.is_empty() {
        return Vec::new();
    }
    let mut check = json!({"tools": tools});
    if triggered.order.as_deref() == Some("strict") {
        check["ordered"] = json!(true);
    }
    if triggered.exclusive == Some(json!(true)) {
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

/// What became of one call of `toolsTriggered`.
enum Call {
    /// A `tools-called` entry.
    Listed(Value),
    /// An optional call, left out: mst lists only calls that must happen.
    Optional,
    /// A call mst cannot check (reported).
    Skipped,
}

/// One call of `toolsTriggered` at `here` → a `tools-called` entry (`SERVER__tool`, with
/// the arguments mst can match).
fn expected_call(src: &mut Source, here: &str, call: &ExpectedCall, servers: &[String]) -> Call {
    let Some(name) = call.name.as_deref() else {
        src.note(here, Change::Dropped, "a call without `name`");
        return Call::Skipped;
    };
    if let Some(kind) = call.kind.as_deref().filter(|k| *k != "tool_call") {
        src.note(
            here,
            Change::Dropped,
            format!("mst's traces record tool calls only, not `{kind}` events"),
        );
        return Call::Skipped;
    }
    if call.required == Some(json!(false)) {
        src.note(
            here,
            Change::Dropped,
            format!(
                "optional call `{name}` (`required: false`): mst lists only calls that must happen"
            ),
        );
        return Call::Optional;
    }
    let name = match (call.server.as_deref(), split_label(name, servers)) {
        (Some(server), _) => format!("{server}__{name}"),
        (None, (Some(server), tool)) => format!("{server}__{tool}"),
        (None, (None, tool)) => tool.to_string(),
    };
    let mut entry = json!({"name": name});
    let mut kept = Map::new();
    for (arg, expected) in call.arguments.iter().flatten() {
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
    Call::Listed(entry)
}

/// A `judges` entry (a config's, a variant's or a case's): the built-in `rubric` converts;
/// plugin judges do not.
pub(super) fn judge_entry(
    src: &mut Source,
    at: &str,
    judge: &Value,
    defaults: &CaseDefaults,
) -> Vec<Value> {
    let llm: LlmJudge = shape(judge);
    if llm.kind.as_deref() == Some("rubric") {
        return rubric(src, at, &llm, defaults);
    }
    let name = judge
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| judge.to_string());
    src.note(at, Change::Dropped, format!("judge {name} comes from an MST plugin (npm), which mst cannot load; write it as an mst grader plugin"));
    Vec::new()
}

/// An MST LLM judge (`passesJudge`, or a `rubric` judge entry) → mst's rubric plugin.
fn rubric(src: &mut Source, at: &str, judge: &LlmJudge, defaults: &CaseDefaults) -> Vec<Value> {
    let Some(text) = rubric_text(src, at, judge) else {
        return Vec::new();
    };
    let provider = match judge.provider.as_deref() {
        Some(named) => super::client::provider_name(src, &format!("{at}.provider"), named),
        None => defaults
            .judge_model
            .as_ref()
            .map(|(p, _)| p.clone())
            .unwrap_or_else(|| "anthropic".into()),
    };
    let model = judge.model.clone().or_else(|| {
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
    let threshold = judge.threshold.unwrap_or(MST_JUDGE_THRESHOLD);
    let mut options =
        json!({"provider": provider, "model": model, "rubric": text, "threshold": threshold});
    if let Some(max) = &judge.max_tokens {
        options["maxTokens"] = max.clone();
    }
    if let Some(var) = &judge.api_key_env_var {
        src.key_vars.insert(provider.clone(), var.clone());
    }
    for (key, given) in [
        ("reps", &judge.reps),
        ("temperature", &judge.temperature),
        ("maxBudgetUsd", &judge.max_budget_usd),
        ("maxToolOutputSize", &judge.max_tool_output_size),
    ] {
        if given.is_some() {
            let text = "mst's rubric judge has no such option";
            src.note(&format!("{at}.{key}"), Change::Dropped, text);
        }
    }
    if let Some(reference) = &judge.reference {
        src.note(&format!("{at}.reference"), Change::Approximated, format!("the rubric judge sees the case's `expected`, not a reference of its own; put it there: {reference}"));
    }
    src.note(at, Change::Rewritten, format!("→ the `{RUBRIC_PLUGIN}` plugin (threshold {threshold} written out: the plugin's own default is 0.5)"));
    src.judge_providers.insert(provider);
    vec![json!({"plugin": RUBRIC_PLUGIN, "options": options})]
}

/// The rubric's text: given (`{"text"}`), or mst's own for MST's named rubrics; `None`
/// (reported) when there is none to give.
fn rubric_text(src: &mut Source, at: &str, judge: &LlmJudge) -> Option<String> {
    let dropped = |src: &mut Source, text: String| {
        src.note(at, Change::Dropped, text);
        None
    };
    match &judge.rubric {
        Some(Value::String(name)) => match NAMED_RUBRICS.iter().find(|(n, _)| n == name) {
            Some((_, text)) => {
                src.note(
                    at,
                    Change::Approximated,
                    format!("MST's named rubric `{name}` → mst's own text for it: {text:?}"),
                );
                Some(text.to_string())
            }
            None => dropped(src, format!("unknown rubric name {name:?}")),
        },
        Some(rubric) => match rubric.get("text").and_then(Value::as_str) {
            Some(text) => Some(text.to_string()),
            None => dropped(src, "a rubric without `text`".into()),
        },
        None if judge.judge.is_some() => dropped(
            src,
            "a custom judge from an MST plugin cannot run in mst; write it as an mst grader plugin"
                .into(),
        ),
        None => dropped(src, "an LLM judge without a `rubric`".into()),
    }
}
