//! MST eval configs (2.0) → `eval.json`: one converter per section of the config (name,
//! servers, client, judges, datasets, variants, run controls), then the keys mst has no
//! equivalent for.

use super::assertions::judge_entry;
use super::cases::{self, CaseDefaults};
use super::client::{self, bare_model, ClientChoice};
use super::evals::{self, CaseFiles};
use super::format::shape;
use super::format::v2::{Config, RunGroup, Variant};
use super::servers;
use super::Source;
use crate::import::{Change, Imported};
use anyhow::{bail, Context, Result};
use serde_json::{json, Map, Value};
use std::path::Path;

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
        "not converted: write mst's `tools` (`SERVER__TOOL`: description, inputSchema, hidden, name) and `dryRun` by hand",
    ),
    (
        "toolMap",
        "not converted: write mst's `tools` (`SERVER__TOOL`: description, inputSchema, hidden, name) by hand",
    ),
    ("maxCases", "select cases with `mst run --case ID`"),
    (
        "filterTags",
        "select cases with `mst run --case ID` (no tag filter)",
    ),
];

/// Converts config `value` (an object) and the datasets it names.
pub(super) fn convert(src: &mut Source, value: &Value, imported: &mut Imported) -> Result<()> {
    let config: Config = shape(value);
    let name = name_of(src, config.name.as_deref().unwrap_or("imported"));
    let servers = servers::convert(src, config.servers.as_ref());
    let choice = client::choose(src, "", &config.client, Some(&config.generation));
    let defaults = case_defaults(src, &config, &servers, &choice);
    let files = datasets(src, &config, &defaults, imported)?;
    let mut eval = Map::new();
    eval.insert("name".into(), json!(name));
    eval.insert("datasets".into(), json!(files.client));
    eval.insert("servers".into(), Value::Object(servers));
    choice.apply(&mut eval);
    let mut providers: Vec<String> = choice.provider.iter().cloned().collect();
    if let Some(list) = &config.variants {
        variants(
            src,
            list,
            config.baseline.as_deref(),
            &defaults,
            &mut eval,
            &mut providers,
        );
    }
    if !defaults.extra_judges.is_empty() {
        src.note("judges", Change::Rewritten, "the config's judges apply to every case, and are added to each case's own (as MST does)");
        eval.insert("judges".into(), Value::Array(defaults.extra_judges.clone()));
    }
    run_controls(src, &config, &mut eval);
    leftover_keys(src, &config.rest);
    if files.client.is_empty() {
        // No eval drives the model: the `mcp` client's eval needs only its judges' providers.
        providers.clear();
    }
    providers.extend(src.judge_providers.iter().cloned());
    evals::finish(src, &mut eval, providers, config.pricing.as_ref());
    evals::config_evals(src, imported, eval, &files);
    evals::validate(src, imported);
    Ok(())
}

/// What every case shares: the servers' labels, the config's `inputTemplate`, its judges,
/// and its model for LLM judges that name none.
fn case_defaults(
    src: &mut Source,
    config: &Config,
    servers: &Map<String, Value>,
    choice: &ClientChoice,
) -> CaseDefaults {
    let mut defaults = CaseDefaults {
        servers: servers.keys().cloned().collect(),
        input_template: config.input_template.clone(),
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
    for (n, judge) in config.judges.iter().flatten().enumerate() {
        let judges = judge_entry(src, &format!("judges[{n}]"), judge, &defaults);
        defaults.extra_judges.extend(judges);
    }
    defaults
}

/// The config's `datasets`, each read (paths from the config's directory) and written into
/// its own case files.
fn datasets(
    src: &mut Source,
    config: &Config,
    defaults: &CaseDefaults,
    imported: &mut Imported,
) -> Result<CaseFiles> {
    let mut files = CaseFiles::default();
    let base = src.path.parent().map(Path::to_path_buf).unwrap_or_default();
    for (n, entry) in config.datasets.iter().flatten().enumerate() {
        let at = format!("datasets[{n}]");
        let Some(path) = dataset_path(src, &at, entry)? else {
            continue;
        };
        // As `mst run` reads datasets: inside the config's directory, through no link out.
        let inside = crate::eval::dataset::inside(&base, &path)
            .with_context(|| format!("{}: `{at}`", src.file))?;
        let previous = src.open(&inside);
        let dataset = cases::read(src, defaults);
        src.open(&previous);
        let dataset = dataset?;
        let stem = Path::new(&path)
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| dataset.name.clone());
        files.add(imported, &stem, &dataset);
        src.note(
            &at,
            Change::Rewritten,
            format!("{path} → one case per line (`.jsonl`)"),
        );
    }
    Ok(files)
}

/// A `datasets` entry's file: a path, or a `{"type": "file", "path"}` source; `None`
/// (reported) for any other source.
fn dataset_path(src: &mut Source, at: &str, entry: &Value) -> Result<Option<String>> {
    match entry {
        Value::String(path) => Ok(Some(path.clone())),
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("file") => {
            match o.get("path").and_then(Value::as_str) {
                Some(path) => Ok(Some(path.to_string())),
                None => bail!("{}: `{at}` is a file dataset without `path`", src.file),
            }
        }
        other => {
            src.note(at, Change::Dropped, format!("dataset {other} is not a file: MST's dataset sources are npm plugins; convert its cases to a file"));
            Ok(None)
        }
    }
}

/// `variants`: an array with a baseline (MST's default: the first) → a map by name and
/// `baseline`. Each variant's provider joins `providers`.
fn variants(
    src: &mut Source,
    list: &[Value],
    baseline: Option<&str>,
    defaults: &CaseDefaults,
    eval: &mut Map<String, Value>,
    providers: &mut Vec<String>,
) {
    let mut variants = Map::new();
    // serde_json's maps are sorted: the first in MST's list is kept here.
    let mut first = None;
    for (n, variant) in list.iter().enumerate() {
        if !variant.is_object() {
            continue;
        }
        let variant: Variant = shape(variant);
        let fallback = format!("variant-{}", n + 1);
        let name = name_of(src, variant.name.as_deref().unwrap_or(&fallback));
        let (out, provider) = variant_of(src, &format!("variants[{name}]"), &variant, defaults);
        providers.extend(provider);
        first.get_or_insert_with(|| name.clone());
        variants.insert(name, Value::Object(out));
    }
    let baseline = match baseline {
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

/// One variant at `at` → mst's, with its model's provider: its keys in their alphabetical
/// order, the keys that are not MST's, then its client.
fn variant_of(
    src: &mut Source,
    at: &str,
    variant: &Variant,
    defaults: &CaseDefaults,
) -> (Map<String, Value>, Option<String>) {
    let here = |key: &str| format!("{at}.{key}");
    let mut out = Map::new();
    let no_equivalent = |src: &mut Source, key: &str, given: &Option<Value>| {
        if given.is_some() {
            let text = format!("a variant's `{key}` has no mst equivalent");
            src.note(&here(key), Change::Dropped, text);
        }
    };
    if variant.description.is_some() {
        let text = "a variant has no description in mst";
        src.note(&here("description"), Change::Dropped, text);
    }
    no_equivalent(src, "inputTemplate", &variant.input_template);
    let entries = variant.judges.as_ref().and_then(Value::as_array);
    let judges: Vec<Value> = (entries.into_iter().flatten().enumerate())
        .flat_map(|(i, j)| judge_entry(src, &format!("{}[{i}]", here("judges")), j, defaults))
        .collect();
    if !judges.is_empty() {
        src.note(&here("judges"), Change::Approximated, "mst applies a variant's judges only to cases without judges of their own (MST adds them to every case)");
        out.insert("judges".into(), Value::Array(judges));
    }
    no_equivalent(src, "metrics", &variant.metrics);
    if variant.client.provider.is_some() {
        let text = "`provider` is not a key of MST's variant schema";
        src.note(&here("provider"), Change::Dropped, text);
    }
    if let Some(servers) = &variant.servers {
        out.insert("servers".into(), servers.clone());
    }
    no_equivalent(src, "toolMap", &variant.tool_map);
    no_equivalent(src, "tools", &variant.tools);
    for key in variant.rest.keys() {
        let text = format!("`{key}` is not a key of MST's variant schema");
        src.note(&here(key), Change::Dropped, text);
    }
    let own = client::choose(src, &format!("{at}."), &variant.client, None);
    own.apply(&mut out);
    (out, own.provider)
}

/// `trials`, `concurrency`, `passThreshold` and `timeout`, at the top or under `run` (whose
/// values win).
fn run_controls(src: &mut Source, config: &Config, eval: &mut Map<String, Value>) {
    let empty = RunGroup::default();
    let run = config.run.as_ref().unwrap_or(&empty);
    if !run.is_empty() {
        let text = "the `run` group's controls → top-level keys";
        src.note("run", Change::Rewritten, text);
    }
    let (group, top) = (&run.controls, &config.controls);
    if let Some(trials) = group.trials.as_ref().or(top.trials.as_ref()) {
        eval.insert("trials".into(), trials.clone());
    }
    if let Some(concurrency) = group.concurrency.as_ref().or(top.concurrency.as_ref()) {
        eval.insert("concurrency".into(), concurrency.clone());
        src.note(
            "concurrency",
            Change::Approximated,
            "mst's `concurrency` is per shard (trials at once on one machine)",
        );
    }
    let share = (group.pass_threshold.as_ref())
        .or(top.pass_threshold.as_ref())
        .and_then(Value::as_f64);
    match share {
        Some(share) => {
            eval.insert("casePass".into(), json!({"share": share}));
            src.note("passThreshold", Change::Rewritten, format!("the share of a case's trials that must pass → `casePass: {{\"share\": {share}}}` (mst's `passThreshold` is a per-trial score)"));
        }
        None => {
            eval.insert("casePass".into(), json!({"share": 1}));
            src.note("passThreshold", Change::Rewritten, "MST's default, every trial of a case must pass, written out as `casePass: {\"share\": 1}` (mst's default is a majority)");
        }
    }
    if let Some(ms) = config.timeout {
        let seconds = (ms / 1000.0).ceil().max(1.0);
        eval.insert("timeout".into(), json!(seconds as u64));
        src.note(
            "timeout",
            Change::Rewritten,
            format!("{ms} ms → {seconds} s (mst's `timeout` is in seconds, per trial)"),
        );
    }
    for (key, given) in [
        ("maxCases", &run.max_cases),
        ("filterTags", &run.filter_tags),
    ] {
        if given.is_some() {
            let text = "select cases with `mst run --case ID`";
            src.note(&format!("run.{key}"), Change::Dropped, text);
        }
    }
}

/// The config's keys that are not converted: MST's own (dropped, with why), `$schema`, and
/// keys of no MST schema.
fn leftover_keys(src: &mut Source, rest: &Map<String, Value>) {
    for (key, why) in DROPPED_KEYS {
        if rest.contains_key(key) {
            src.note(key, Change::Dropped, why);
        }
    }
    for key in rest.keys() {
        if key == "$schema" {
            src.note(
                "$schema",
                Change::Rewritten,
                "removed: mst reads no schema pointer",
            );
        } else if !DROPPED_KEYS.iter().any(|(k, _)| k == key) {
            src.note(
                key,
                Change::Dropped,
                "not a key of MST's eval config schema",
            );
        }
    }
}

/// A name mst accepts for an eval or variant (letters, digits, `-`, `_`, `.`).
pub(super) fn name_of(src: &mut Source, name: &str) -> String {
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
