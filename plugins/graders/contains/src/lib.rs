//! `mst/grader/contains`: does the final answer contain (or not contain) given text?
//!
//! Options (all optional): `value` or `values` (the needles; default: the case's `expected`
//! when it is a string or a list of strings), `mode` (`all` | `any`, default `all`), `negate`
//! (pass when the needles are absent), `caseSensitive` (default `true`).

use mst_sdk::grader::{self, ErrorCode, Grader, PluginError, PluginInfo, Score, Trial};
use serde::Deserialize;

/// The `contains` grader.
pub struct Contains;

#[derive(Deserialize, Default, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "lowercase")]
enum Mode {
    #[default]
    All,
    Any,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    value: Option<String>,
    #[serde(default)]
    values: Vec<String>,
    #[serde(default)]
    mode: Mode,
    #[serde(default)]
    negate: bool,
    #[serde(default = "yes")]
    case_sensitive: bool,
}

fn yes() -> bool {
    true
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "value": {"type": "string"},
    "values": {"type": "array", "items": {"type": "string"}},
    "mode": {"enum": ["all", "any"]},
    "negate": {"type": "boolean"},
    "caseSensitive": {"type": "boolean"}
  }
}"#;

/// The needles from the options, else from the case's `expected` value.
fn needles(options: &Options, trial: &Trial) -> Result<Vec<String>, PluginError> {
    let mut needles: Vec<String> = options.value.iter().cloned().collect();
    needles.extend(options.values.iter().cloned());
    if !needles.is_empty() {
        return Ok(needles);
    }
    let expected = trial.case.expected.as_deref().unwrap_or("null");
    match serde_json::from_str::<serde_json::Value>(expected) {
        Ok(serde_json::Value::String(s)) => Ok(vec![s]),
        Ok(serde_json::Value::Array(items)) if items.iter().all(|i| i.is_string()) => Ok(items
            .into_iter()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect()),
        _ => Err(grader::error(
            ErrorCode::InvalidOptions,
            format!(
                "no text to look for in case `{}`: set the grader option `value` or `values`, \
                 or give the case an `expected` string or list of strings",
                trial.case.id
            ),
        )),
    }
}

impl Grader for Contains {
    fn info() -> PluginInfo {
        PluginInfo {
            options_schema: Some(SCHEMA.to_string()),
            ..grader::info(
                "mst/grader/contains",
                env!("CARGO_PKG_VERSION"),
                "Passes when the final answer contains (or, negated, lacks) the given text",
            )
        }
    }

    fn grade(options: &str, trial: Trial) -> Result<Score, PluginError> {
        let options: Options = grader::options(options)?;
        let needles = needles(&options, &trial)?;
        let fold = |s: &str| {
            if options.case_sensitive {
                s.to_string()
            } else {
                s.to_lowercase()
            }
        };
        let haystack = fold(grader::final_text(&trial));
        let (found, missing): (Vec<&String>, Vec<&String>) =
            needles.iter().partition(|n| haystack.contains(&fold(n)));
        let total = needles.len() as f64;
        let (value, pass) = match (options.mode, options.negate) {
            (Mode::All, false) => (found.len() as f64 / total, missing.is_empty()),
            (Mode::Any, false) => (f64::from(!found.is_empty() as u8), !found.is_empty()),
            (Mode::All, true) => (missing.len() as f64 / total, found.is_empty()),
            (Mode::Any, true) => (f64::from(!missing.is_empty() as u8), !missing.is_empty()),
        };
        let reason = if options.negate {
            match found.as_slice() {
                [] => "none of the forbidden text appears".to_string(),
                found => format!("forbidden text appears: {}", quote_all(found)),
            }
        } else {
            match missing.as_slice() {
                [] => format!("found all of {}", quote_all(&found)),
                missing => format!(
                    "found {} of {}; missing {}",
                    found.len(),
                    needles.len(),
                    quote_all(missing)
                ),
            }
        };
        Ok(Score {
            pass: Some(pass),
            ..grader::score(value, reason)
        })
    }
}

fn quote_all(items: &[&String]) -> String {
    items
        .iter()
        .map(|s| format!("{s:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

mst_sdk::export_grader!(Contains);

#[cfg(test)]
mod tests {
    use super::*;
    use mst_sdk::grader::testing::trial;

    fn grade(options: &str, text: &str) -> Score {
        Contains::grade(options, trial("c1", text)).unwrap()
    }

    #[test]
    fn all_mode_scores_the_fraction_found() {
        let s = grade(r#"{"values": ["alpha", "beta"]}"#, "alpha only");
        assert_eq!(s.value, 0.5);
        assert_eq!(s.pass, Some(false));
        assert!(s.reason.contains("missing \"beta\""), "{}", s.reason);
        let s = grade(r#"{"values": ["alpha", "beta"]}"#, "beta, alpha");
        assert_eq!((s.value, s.pass), (1.0, Some(true)));
    }

    #[test]
    fn any_mode_passes_on_one_match() {
        let s = grade(r#"{"values": ["x", "only"], "mode": "any"}"#, "alpha only");
        assert_eq!((s.value, s.pass), (1.0, Some(true)));
    }

    #[test]
    fn negate_fails_when_text_appears() {
        let s = grade(
            r#"{"value": "secret", "negate": true}"#,
            "the secret is out",
        );
        assert_eq!((s.value, s.pass), (0.0, Some(false)));
        let s = grade(r#"{"value": "secret", "negate": true}"#, "nothing here");
        assert_eq!((s.value, s.pass), (1.0, Some(true)));
    }

    #[test]
    fn case_folding_is_optional() {
        assert_eq!(grade(r#"{"value": "HELLO"}"#, "hello").pass, Some(false));
        let s = grade(r#"{"value": "HELLO", "caseSensitive": false}"#, "hello");
        assert_eq!(s.pass, Some(true));
    }

    #[test]
    fn falls_back_to_expected() {
        let mut t = trial("c1", "the answer is 42");
        t.case.expected = Some("\"42\"".into());
        assert_eq!(Contains::grade("{}", t).unwrap().pass, Some(true));
    }

    #[test]
    fn no_needles_is_a_clear_error() {
        let err = Contains::grade("{}", trial("c9", "x")).unwrap_err();
        assert!(matches!(err.code, ErrorCode::InvalidOptions));
        assert!(err.message.contains("c9") && err.message.contains("value"));
    }

    #[test]
    fn unknown_option_is_named() {
        let err = Contains::grade(r#"{"vaule": "x"}"#, trial("c1", "x")).unwrap_err();
        assert!(err.message.contains("vaule"), "{}", err.message);
    }
}
