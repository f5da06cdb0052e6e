//! `mst/dataset/jsonl`: cases from a JSON Lines file, one case object per line.
//!
//! Each non-empty line is an object with `id` (string, unique), `input` (any JSON), and
//! optionally `expected`, `tags` (strings) and `metadata` (object). Unknown keys are errors
//! that name the line. Options: `path` (read by the host and passed as content), `type`, and
//! `limit` (keep the first N cases).

use mst_sdk::dataset::{self, Case, Dataset, ErrorCode, PluginError, PluginInfo};
use serde::Deserialize;
use serde_json::Value;
use std::collections::HashSet;

/// The `jsonl` dataset resolver.
pub struct Jsonl;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Options {
    #[serde(rename = "type")]
    _type: Option<String>,
    #[serde(rename = "path")]
    _path: Option<String>,
    limit: Option<usize>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Line {
    id: String,
    input: Value,
    expected: Option<Value>,
    #[serde(default)]
    tags: Vec<String>,
    metadata: Option<serde_json::Map<String, Value>>,
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "type": {"type": "string"},
    "path": {"type": "string"},
    "limit": {"type": "integer", "minimum": 0}
  }
}"#;

fn invalid(message: String) -> PluginError {
    dataset::error(ErrorCode::InvalidInput, message)
}

/// Parses JSON Lines text into cases; errors name the 1-based line.
pub fn parse(text: &str) -> Result<Vec<Case>, PluginError> {
    let mut seen = HashSet::new();
    let mut cases = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        let number = index + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let line: Line =
            serde_json::from_str(raw).map_err(|e| invalid(format!("line {number}: {e}")))?;
        if line.id.is_empty() {
            return Err(invalid(format!("line {number}: `id` is empty")));
        }
        if !seen.insert(line.id.clone()) {
            return Err(invalid(format!(
                "line {number}: case id `{}` appears twice; ids must be unique",
                line.id
            )));
        }
        cases.push(Case {
            id: line.id,
            input: line.input.to_string(),
            expected: line.expected.map(|v| v.to_string()),
            tags: line.tags,
            metadata: line.metadata.map(|m| Value::Object(m).to_string()),
        });
    }
    Ok(cases)
}

impl Dataset for Jsonl {
    fn info() -> PluginInfo {
        PluginInfo {
            options_schema: Some(SCHEMA.to_string()),
            ..dataset::info(
                "mst/dataset/jsonl",
                env!("CARGO_PKG_VERSION"),
                "Cases from a JSON Lines file: one {id, input, expected, tags, metadata} per line",
            )
        }
    }

    fn resolve(options: &str, content: Option<Vec<u8>>) -> Result<Vec<Case>, PluginError> {
        let options: Options = dataset::options(options)?;
        let content = content.ok_or_else(|| {
            dataset::error(
                ErrorCode::InvalidOptions,
                "no file content: give the dataset entry a `path` to a .jsonl file",
            )
        })?;
        let text = String::from_utf8(content)
            .map_err(|e| invalid(format!("the file is not UTF-8: {e}")))?;
        let mut cases = parse(&text)?;
        if let Some(limit) = options.limit {
            cases.truncate(limit);
        }
        Ok(cases)
    }
}

mst_sdk::export_dataset!(Jsonl);

#[cfg(test)]
mod tests {
    use super::*;

    fn resolve(options: &str, text: &str) -> Result<Vec<Case>, PluginError> {
        Jsonl::resolve(options, Some(text.as_bytes().to_vec()))
    }

    #[test]
    fn parses_cases_and_skips_blank_lines() {
        let cases = resolve(
            r#"{"path": "x.jsonl"}"#,
            "{\"id\":\"a\",\"input\":{\"q\":1},\"expected\":\"2\",\"tags\":[\"t\"]}\n\n{\"id\":\"b\",\"input\":\"hi\"}\n",
        )
        .unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(cases[0].input, r#"{"q":1}"#);
        assert_eq!(cases[0].expected.as_deref(), Some("\"2\""));
        assert_eq!(cases[1].tags.len(), 0);
    }

    #[test]
    fn duplicate_ids_name_the_line() {
        let err = resolve(
            "{}",
            "{\"id\":\"a\",\"input\":1}\n{\"id\":\"a\",\"input\":2}",
        )
        .unwrap_err();
        assert!(
            err.message.contains("line 2") && err.message.contains("`a`"),
            "{}",
            err.message
        );
    }

    #[test]
    fn unknown_keys_are_errors() {
        let err = resolve("{}", "{\"id\":\"a\",\"input\":1,\"expectd\":2}").unwrap_err();
        assert!(
            err.message.contains("line 1") && err.message.contains("expectd"),
            "{}",
            err.message
        );
    }

    #[test]
    fn limit_keeps_the_first_cases() {
        let cases = resolve(
            r#"{"limit": 1}"#,
            "{\"id\":\"a\",\"input\":1}\n{\"id\":\"b\",\"input\":2}",
        )
        .unwrap();
        assert_eq!(cases.len(), 1);
    }

    #[test]
    fn missing_content_is_an_options_error() {
        let err = Jsonl::resolve("{}", None).unwrap_err();
        assert!(matches!(err.code, ErrorCode::InvalidOptions));
    }
}
