//! `mst/grader/regex`: does the final answer match a regular expression?
//!
//! Options: `pattern` (required; Rust `regex` syntax), `caseInsensitive`, `multiLine`,
//! `negate` (pass when there is no match).

use mst_sdk::grader::{self, ErrorCode, Grader, PluginError, PluginInfo, Score, Trial};
use serde::Deserialize;

/// The `regex` grader.
pub struct RegexGrader;

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    pattern: String,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    multi_line: bool,
    #[serde(default)]
    negate: bool,
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "required": ["pattern"],
  "properties": {
    "pattern": {"type": "string"},
    "caseInsensitive": {"type": "boolean"},
    "multiLine": {"type": "boolean"},
    "negate": {"type": "boolean"}
  }
}"#;

impl Grader for RegexGrader {
    fn info() -> PluginInfo {
        PluginInfo {
            options_schema: Some(SCHEMA.to_string()),
            ..grader::info(
                "mst/grader/regex",
                env!("CARGO_PKG_VERSION"),
                "Passes when the final answer matches (or, negated, does not match) a regex",
            )
        }
    }

    fn grade(options: &str, trial: Trial) -> Result<Score, PluginError> {
        let options: Options = grader::options(options)?;
        let regex = regex::RegexBuilder::new(&options.pattern)
            .case_insensitive(options.case_insensitive)
            .multi_line(options.multi_line)
            // Bound the compiled program so a hostile pattern cannot exhaust memory.
            .size_limit(1 << 20)
            .build()
            .map_err(|e| {
                grader::error(
                    ErrorCode::InvalidOptions,
                    format!("option `pattern` is not a valid regex: {e}"),
                )
            })?;
        let found = regex.find(grader::final_text(&trial));
        let pass = found.is_some() != options.negate;
        let reason = match (found, options.negate) {
            (Some(m), false) => format!("matched {:?} at byte {}", m.as_str(), m.start()),
            (None, false) => format!("no match for /{}/", options.pattern),
            (Some(m), true) => format!("forbidden match {:?} at byte {}", m.as_str(), m.start()),
            (None, true) => format!("no match for /{}/, as required", options.pattern),
        };
        Ok(Score {
            pass: Some(pass),
            ..grader::score(if pass { 1.0 } else { 0.0 }, reason)
        })
    }
}

mst_sdk::export_grader!(RegexGrader);

#[cfg(test)]
mod tests {
    use super::*;
    use mst_sdk::grader::testing::trial;

    #[test]
    fn matches_and_reports_where() {
        let s = RegexGrader::grade(
            r#"{"pattern": "\\d{2}:\\d{2}"}"#,
            trial("c", "it is 10:42 now"),
        )
        .unwrap();
        assert_eq!(s.pass, Some(true));
        assert!(s.reason.contains("10:42"), "{}", s.reason);
    }

    #[test]
    fn negate_and_case_options() {
        let t = || trial("c", "ERROR: disk full");
        let s = RegexGrader::grade(r#"{"pattern": "error", "negate": true}"#, t()).unwrap();
        assert_eq!(s.pass, Some(true));
        let s = RegexGrader::grade(
            r#"{"pattern": "error", "negate": true, "caseInsensitive": true}"#,
            t(),
        )
        .unwrap();
        assert_eq!((s.pass, s.value), (Some(false), 0.0));
    }

    #[test]
    fn bad_pattern_names_the_option() {
        let err = RegexGrader::grade(r#"{"pattern": "(unclosed"}"#, trial("c", "")).unwrap_err();
        assert!(matches!(err.code, ErrorCode::InvalidOptions));
        assert!(err.message.contains("pattern"), "{}", err.message);
    }

    #[test]
    fn pattern_is_required() {
        let err = RegexGrader::grade("{}", trial("c", "")).unwrap_err();
        assert!(err.message.contains("pattern"), "{}", err.message);
    }
}
