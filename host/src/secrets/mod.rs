//! Secrets: read only from a secrets file (`--secrets-file`, JSON or dotenv) or, for a name
//! written `env:VAR`, from the environment variable `VAR` of the mst process; held as
//! [`Secret`]s, whose `Debug` never shows the value. The coordinator hands MCP tokens to workers
//! only over the worker's stdin; the worker keeps them in memory only. Every value read is registered
//! with [`redact`], so nothing mst writes holds it.

pub mod redact;

pub use redact::{
    clean, clean_bytes, clean_json_writer, clean_text, hold, redact_file, redactor, Redactor,
};

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

/// The token name under which secret `name` travels to workers for a client's environment
/// (the `command` client's `secretEnv`).
pub fn secret_token(name: &str) -> String {
    format!("{SECRET_TOKEN}{name}")
}

/// The secret a [`secret_token`] name stands for.
pub fn secret_of_token(token: &str) -> Option<&str> {
    token.strip_prefix(SECRET_TOKEN)
}

const SECRET_TOKEN: &str = "secret:";

/// The prefix of a secret name that stands for an environment variable.
const ENV_SECRET: &str = "env:";

/// A secret value. Its `Debug` and `Display` never show the value, so it cannot leak through
/// a log line or an error message by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The value, for the one place that must hand it over.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

/// Secrets by name, with the expiry of those that carry one, and the file they came from (so
/// a secret about to expire can be read again).
#[derive(Debug, Clone, Default)]
pub struct Secrets {
    values: BTreeMap<String, Secret>,
    /// Milliseconds since the Unix epoch after which the secret is no longer valid.
    expires_at: BTreeMap<String, u64>,
    source: Option<PathBuf>,
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.')
}

impl Secrets {
    /// Reads a secrets file: a JSON object of strings, or dotenv lines (`NAME=value`, `#`
    /// comments, optional `export `, optional quotes). Errors name the line, never the value.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = crate::files::read_input(path)
            .with_context(|| format!("--secrets-file {}", path.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(
                        "{} is readable by other users; `chmod 600` it",
                        path.display()
                    );
                }
            }
        }
        let text =
            String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))?;
        let mut secrets =
            Self::parse(&text).with_context(|| format!("--secrets-file {}", path.display()))?;
        for (name, value) in &secrets.values {
            hold(name, value);
        }
        secrets.source = Some(path.to_path_buf());
        Ok(secrets)
    }

    /// The secrets file read again (after its owner renewed a secret in it); `None` for
    /// secrets that came from no file.
    pub fn reload(&self) -> Option<Result<Self>> {
        self.source.as_deref().map(Self::load)
    }

    /// Parses secrets text (see [`Secrets::load`]).
    pub fn parse(text: &str) -> Result<Self> {
        let mut secrets = BTreeMap::new();
        if text.trim_start().starts_with('{') {
            let object: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
                .map_err(|e| anyhow::anyhow!("not a JSON object of strings (line {})", e.line()))?;
            let mut expires_at = BTreeMap::new();
            for (name, value) in object {
                if !valid_name(&name) {
                    bail!("`{name}` is not a secret name (letters, digits, `_`, `-`, `.`)");
                }
                let (value, expiry) = json_secret(&name, value)?;
                if let Some(expiry) = expiry {
                    expires_at.insert(name.clone(), expiry);
                }
                secrets.insert(name, Secret::new(value));
            }
            return Ok(Secrets {
                values: secrets,
                expires_at,
                source: None,
            });
        }
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let line = line.strip_prefix("export ").unwrap_or(line);
            let Some((name, value)) = line.split_once('=') else {
                bail!("line {}: expected NAME=value", index + 1);
            };
            let name = name.trim();
            if !valid_name(name) {
                bail!("line {}: `{name}` is not a secret name", index + 1);
            }
            let value = value.trim();
            let value = ['"', '\'']
                .iter()
                .find_map(|q| value.strip_prefix(*q).and_then(|v| v.strip_suffix(*q)))
                .unwrap_or(value);
            secrets.insert(name.to_string(), Secret::new(value));
        }
        Ok(Secrets {
            values: secrets,
            ..Secrets::default()
        })
    }

    /// The secret `name`: from the secrets file, or for `env:VAR` from the environment
    /// variable `VAR` (read when asked, so a renewed variable is seen, and held for redaction).
    pub fn get(&self, name: &str) -> Option<Secret> {
        match name.strip_prefix(ENV_SECRET) {
            Some(var) => {
                let value = std::env::var(var).ok().filter(|v| !v.is_empty())?;
                let secret = Secret::new(value);
                hold(name, &secret);
                Some(secret)
            }
            None => self.values.get(name).cloned(),
        }
    }

    /// Where the missing secret `name` was looked for, for an error that names a field:
    /// "secret `X`, which --secrets-file does not hold" or "environment variable `X`, which is
    /// not set".
    pub fn missing(name: &str) -> String {
        match name.strip_prefix(ENV_SECRET) {
            Some(var) => format!("environment variable `{var}`, which is not set (or empty)"),
            None => format!("secret `{name}`, which --secrets-file does not hold"),
        }
    }

    /// When the secret `name` expires, in milliseconds since the Unix epoch, if it does.
    pub fn expires_at(&self, name: &str) -> Option<u64> {
        self.expires_at.get(name).copied()
    }
}

/// A JSON secrets file's value: a string, or `{"value": "…", "expiresAt": UNIX_SECONDS}` for a
/// secret that expires. Errors name the secret, never its value.
fn json_secret(name: &str, value: serde_json::Value) -> Result<(String, Option<u64>)> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields, rename_all = "camelCase")]
    struct Expiring {
        value: String,
        expires_at: u64,
    }
    match value {
        serde_json::Value::String(value) => Ok((value, None)),
        object @ serde_json::Value::Object(_) => match serde_json::from_value::<Expiring>(object) {
            Ok(e) => Ok((e.value, Some(e.expires_at.saturating_mul(1000)))),
            Err(_) => bail!(
                "secret `{name}` is neither a string nor {{\"value\": \"…\", \"expiresAt\": \
                 UNIX_SECONDS}}"
            ),
        },
        _ => bail!("secret `{name}` is not a string"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_and_dotenv() {
        let json = Secrets::parse(r#"{"TIME_TOKEN": "abc"}"#).unwrap();
        assert_eq!(json.get("TIME_TOKEN").unwrap().expose(), "abc");
        let dotenv = Secrets::parse("# comment\nexport A=1\nB = \"two words\"\nC='x=y'\n").unwrap();
        assert_eq!(dotenv.get("A").unwrap().expose(), "1");
        assert_eq!(dotenv.get("B").unwrap().expose(), "two words");
        assert_eq!(dotenv.get("C").unwrap().expose(), "x=y");
    }

    #[test]
    fn env_names_read_the_variable_and_a_file_cannot_define_them() {
        // A variable no other test touches.
        std::env::set_var("MST_UNIT_SECRET_VAR", "from-env");
        let secrets = Secrets::default();
        assert_eq!(
            secrets.get("env:MST_UNIT_SECRET_VAR").unwrap().expose(),
            "from-env"
        );
        assert!(secrets.get("env:MST_UNIT_UNSET_VAR").is_none());
        assert!(Secrets::missing("env:X").contains("environment variable `X`"));
        assert!(Secrets::missing("X").contains("--secrets-file does not hold"));
        assert!(Secrets::parse("env:X=1\n").is_err());
    }

    #[test]
    fn errors_never_show_values() {
        let err = format!(
            "{:#}",
            Secrets::parse("GOOD=1\nthis line has hunter2 but no equals sign\n").unwrap_err()
        );
        assert!(err.contains("line 2") && !err.contains("hunter2"), "{err}");
        let err = format!(
            "{:#}",
            Secrets::parse(r#"{"A": "hunter2", "B": 3}"#).unwrap_err()
        );
        assert!(!err.contains("hunter2"), "{err}");
        assert!(!format!("{:?}", Secrets::parse("A=hunter2").unwrap()).contains("hunter2"));
    }

    #[test]
    fn expiring_secrets_in_json() {
        let secrets =
            Secrets::parse(r#"{"A": {"value": "v1", "expiresAt": 1800000000}, "B": "b"}"#).unwrap();
        assert_eq!(secrets.get("A").unwrap().expose(), "v1");
        assert_eq!(secrets.expires_at("A"), Some(1_800_000_000_000));
        assert_eq!(secrets.expires_at("B"), None);
        let err = format!(
            "{:#}",
            Secrets::parse(r#"{"A": {"value": "hunter2", "expires": 1}}"#).unwrap_err()
        );
        assert!(
            err.contains("secret `A`") && !err.contains("hunter2"),
            "{err}"
        );
    }
}
