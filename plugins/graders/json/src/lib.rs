//! `mst/grader/json`: is the final answer JSON with the right content or shape?
//!
//! Options: `path` (a JSONPath, RFC 9535, selecting exactly one value), `equals` (the value the
//! selection, or the whole document, must equal), `schema` (a JSON Schema the selection must
//! satisfy). With neither `equals` nor `schema`, the answer passes when it parses as JSON and
//! the path (if any) selects exactly one value. The score is the fraction of checks passed.

use mst_sdk::grader::{self, ErrorCode, Grader, PluginError, PluginInfo, Score, Trial};
use serde::Deserialize;
use serde_json::Value;

/// The `json` grader.
pub struct JsonGrader;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Options {
    path: Option<String>,
    equals: Option<Value>,
    schema: Option<Value>,
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "path": {"type": "string"},
    "equals": {},
    "schema": {"type": ["object", "boolean"]}
  }
}"#;

/// One named check and whether it passed, with a reason when it did not.
struct Check {
    name: &'static str,
    failure: Option<String>,
}

fn invalid_options(message: String) -> PluginError {
    grader::error(ErrorCode::InvalidOptions, message)
}

/// The answer as JSON; tolerates a Markdown code fence around it.
fn parse_answer(text: &str) -> Result<Value, String> {
    let trimmed = text.trim();
    let unfenced = trimmed
        .strip_prefix("```json")
        .or_else(|| trimmed.strip_prefix("```"))
        .and_then(|rest| rest.strip_suffix("```"))
        .unwrap_or(trimmed);
    serde_json::from_str(unfenced).map_err(|e| format!("the answer is not JSON: {e}"))
}

fn checks(options: &Options, answer: &str) -> Result<Vec<Check>, PluginError> {
    // Compile everything from the options first: a bad option is the eval's fault, not the
    // answer's, and must not turn into a failed trial.
    let path =
        match &options.path {
            Some(p) => Some(serde_json_path::JsonPath::parse(p).map_err(|e| {
                invalid_options(format!("option `path` is not a valid JSONPath: {e}"))
            })?),
            None => None,
        };
    let validator = match &options.schema {
        Some(schema) => Some(jsonschema::validator_for(schema).map_err(|e| {
            invalid_options(format!("option `schema` is not a valid JSON Schema: {e}"))
        })?),
        None => None,
    };

    let document = match parse_answer(answer) {
        Ok(doc) => doc,
        Err(why) => {
            return Ok(vec![Check {
                name: "parse",
                failure: Some(why),
            }])
        }
    };
    let mut checks = vec![Check {
        name: "parse",
        failure: None,
    }];
    let selected = match (&path, &options.path) {
        (Some(path), Some(text)) => {
            let found = path.query(&document).all();
            if found.len() == 1 {
                checks.push(Check {
                    name: "path",
                    failure: None,
                });
                found[0].clone()
            } else {
                checks.push(Check {
                    name: "path",
                    failure: Some(format!(
                        "path {text} selects {} values, expected exactly one",
                        found.len()
                    )),
                });
                return Ok(checks);
            }
        }
        _ => document,
    };
    if let Some(expected) = &options.equals {
        checks.push(Check {
            name: "equals",
            failure: (&selected != expected)
                .then(|| format!("got {selected}, expected {expected}")),
        });
    }
    if let Some(validator) = &validator {
        let errors: Vec<String> = validator
            .iter_errors(&selected)
            .take(3)
            .map(|e| format!("{} at `{}`", e, e.instance_path()))
            .collect();
        checks.push(Check {
            name: "schema",
            failure: (!errors.is_empty()).then(|| errors.join("; ")),
        });
    }
    Ok(checks)
}

impl Grader for JsonGrader {
    fn info() -> PluginInfo {
        PluginInfo {
            options_schema: Some(SCHEMA.to_string()),
            ..grader::info(
                "mst/grader/json",
                env!("CARGO_PKG_VERSION"),
                "Checks that the final answer is JSON, equals a value at a path, or fits a schema",
            )
        }
    }

    fn grade(options: &str, trial: Trial) -> Result<Score, PluginError> {
        let options: Options = grader::options(options)?;
        let checks = checks(&options, grader::final_text(&trial))?;
        let passed = checks.iter().filter(|c| c.failure.is_none()).count();
        // A parse or path failure skips the remaining checks; count them as failed.
        let planned = 1
            + usize::from(options.path.is_some())
            + usize::from(options.equals.is_some())
            + usize::from(options.schema.is_some());
        let failures: Vec<String> = checks
            .iter()
            .filter_map(|c| c.failure.as_ref().map(|f| format!("{}: {f}", c.name)))
            .collect();
        let reason = if failures.is_empty() {
            format!("all {planned} checks passed")
        } else {
            failures.join("; ")
        };
        Ok(Score {
            pass: Some(passed == planned),
            ..grader::score(passed as f64 / planned as f64, reason)
        })
    }
}

mst_sdk::export_grader!(JsonGrader);

#[cfg(test)]
mod tests {
    use super::*;
    use mst_sdk::grader::testing::trial;

    fn grade(options: &str, answer: &str) -> Score {
        JsonGrader::grade(options, trial("c", answer)).unwrap()
    }

    #[test]
    fn path_equals() {
        let s = grade(
            r#"{"path": "$.user.age", "equals": 42}"#,
            r#"{"user": {"age": 42}}"#,
        );
        assert_eq!((s.pass, s.value), (Some(true), 1.0));
        let s = grade(
            r#"{"path": "$.user.age", "equals": 41}"#,
            r#"{"user": {"age": 42}}"#,
        );
        assert_eq!(s.pass, Some(false));
        assert!(s.reason.contains("got 42, expected 41"), "{}", s.reason);
    }

    #[test]
    fn schema_validation() {
        let opts = r#"{"schema": {"type": "object", "required": ["name"]}}"#;
        assert_eq!(grade(opts, r#"{"name": "x"}"#).pass, Some(true));
        let s = grade(opts, r#"{"nom": "x"}"#);
        assert_eq!(s.pass, Some(false));
        assert!(s.reason.contains("name"), "{}", s.reason);
    }

    #[test]
    fn not_json_fails_every_check() {
        let s = grade(r#"{"path": "$.a", "equals": 1}"#, "sorry, I can't");
        assert_eq!((s.pass, s.value), (Some(false), 0.0));
        assert!(s.reason.starts_with("parse:"), "{}", s.reason);
    }

    #[test]
    fn code_fences_are_tolerated() {
        assert_eq!(grade("{}", "```json\n[1, 2]\n```").pass, Some(true));
    }

    #[test]
    fn bad_path_is_an_options_error() {
        let err = JsonGrader::grade(r#"{"path": "$[[["}"#, trial("c", "{}")).unwrap_err();
        assert!(matches!(err.code, ErrorCode::InvalidOptions));
        assert!(err.message.contains("`path`"), "{}", err.message);
    }
}
