//! Recognising MST's (mcp-server-tester's) files, so that one given to mst is refused with how
//! to convert it (`mst import mst`) rather than with a list of unknown keys.

use serde_json::Value;
use std::path::Path;

/// Top-level keys only MST's eval config has (none is a near-typo of one of ours; `tools` is
/// both MST's and mst's, so it says nothing).
const MST_ONLY_KEYS: &[&str] = &[
    "toolMap",
    "inputTemplate",
    "metrics",
    "results",
    "maxCases",
    "maxToolCalls",
    "requireEvalEndpoint",
    "filterTags",
    "run",
    "temperature",
    "maxTokens",
    "redactStoredResponses",
    "extends",
    "coworkSetup",
    "pricing",
];

/// Why `value` looks like an MST (mcp-server-tester) eval config, if it does: a `$schema`,
/// an MST-only top-level key, `variants` as an array, or a server entry with `transport` or
/// `serverUrl`.
pub(super) fn mst_config_sign(value: &Value) -> Option<String> {
    let object = value.as_object()?;
    if let Some(schema) = object.get("$schema") {
        return Some(format!("it has a `$schema` ({schema})"));
    }
    if let Some(key) = MST_ONLY_KEYS.iter().find(|k| object.contains_key(**k)) {
        return Some(format!("it has MST's top-level key `{key}`"));
    }
    if object.get("variants").is_some_and(Value::is_array) {
        return Some("its `variants` is an array".into());
    }
    let servers = object.get("servers").and_then(Value::as_object)?;
    servers.iter().find_map(|(label, entry)| {
        let key = ["transport", "serverUrl"]
            .into_iter()
            .find(|k| entry.get(k).is_some())?;
        Some(format!("server `{label}` has MST's `{key}`"))
    })
}

/// The error for a file in MST's format: what it is, why it looks so, and how to convert it.
pub fn mst_format_error(file: &Path, what: &str, sign: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is an MST (mcp-server-tester) {what} ({sign}), which mst does not read: convert it \
         with `mst import mst {}`",
        file.display(),
        file.display()
    )
}
