//! Strict parsing of plugin options.

use serde::de::DeserializeOwned;
use std::fmt;

/// Options that could not be parsed; the message names the field and what was expected.
#[derive(Debug)]
pub struct OptionsError(String);

impl fmt::Display for OptionsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid options: {}", self.0)
    }
}

impl std::error::Error for OptionsError {}

/// Parses JSON options into `T`. An empty string counts as `{}`. Use
/// `#[serde(deny_unknown_fields)]` on `T` so that a misspelt option is an error, not a silent
/// default.
pub fn parse_options<T: DeserializeOwned>(options: &str) -> Result<T, OptionsError> {
    let text = if options.trim().is_empty() {
        "{}"
    } else {
        options
    };
    serde_json::from_str(text).map_err(|e| OptionsError(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    struct Opts {
        #[serde(default)]
        value: String,
    }

    #[test]
    fn empty_options_are_an_empty_object() {
        let opts: Opts = parse_options("").unwrap();
        assert_eq!(opts.value, "");
    }

    #[test]
    fn unknown_field_is_named() {
        let err = parse_options::<Opts>(r#"{"valeu": "x"}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("valeu"), "{err}");
    }
}
