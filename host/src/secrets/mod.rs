//! Secrets: read only from a secrets file (`--secrets-file`, JSON or dotenv) and held as
//! [`Secret`]s, whose `Debug` never shows the value. The coordinator hands MCP tokens to workers
//! only over the worker's stdin; the worker keeps them in memory and in a private token
//! directory ([`TokenDir`]) that it removes when it ends. Every value read is registered
//! with [`redact`], so nothing mst writes holds it.

pub mod redact;

pub use redact::{clean_bytes, clean_text, hold, redact_file, redactor, Redactor};

use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

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

/// Secrets by name.
#[derive(Debug, Clone, Default)]
pub struct Secrets(BTreeMap<String, Secret>);

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
        let secrets =
            Self::parse(&text).with_context(|| format!("--secrets-file {}", path.display()))?;
        for (name, value) in &secrets.0 {
            hold(name, value);
        }
        Ok(secrets)
    }

    /// Parses secrets text (see [`Secrets::load`]).
    pub fn parse(text: &str) -> Result<Self> {
        let mut secrets = BTreeMap::new();
        if text.trim_start().starts_with('{') {
            let object: BTreeMap<String, serde_json::Value> = serde_json::from_str(text)
                .map_err(|e| anyhow::anyhow!("not a JSON object of strings (line {})", e.line()))?;
            for (name, value) in object {
                let serde_json::Value::String(value) = value else {
                    bail!("secret `{name}` is not a string")
                };
                if !valid_name(&name) {
                    bail!("`{name}` is not a secret name (letters, digits, `_`, `-`, `.`)");
                }
                secrets.insert(name, Secret::new(value));
            }
            return Ok(Secrets(secrets));
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
        Ok(Secrets(secrets))
    }

    /// The secret `name`.
    pub fn get(&self, name: &str) -> Option<&Secret> {
        self.0.get(name)
    }
}

/// A worker's private token directory: owner-only, on tmpfs when the machine has one, removed
/// when dropped. One file per server, holding the token and nothing else.
pub struct TokenDir {
    dir: PathBuf,
}

impl TokenDir {
    /// Creates the directory (under `/run/mst`, `/dev/shm` or `$XDG_RUNTIME_DIR` when writable,
    /// else the temporary directory).
    pub fn create() -> Result<Self> {
        let name = format!("mst-tokens-{}", std::process::id());
        let bases = ["/run/mst", "/dev/shm"]
            .iter()
            .map(PathBuf::from)
            .chain(std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from))
            .chain(std::iter::once(std::env::temp_dir()));
        for base in bases {
            let dir = base.join(&name);
            if base.is_dir() && crate::home::create_private_dir(&dir).is_ok() {
                return Ok(TokenDir { dir });
            }
        }
        bail!("cannot create a private token directory")
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.dir
    }

    /// Writes (or replaces) the token for `server`.
    pub fn write(&self, server: &str, token: &Secret) -> Result<()> {
        let path = self.dir.join(crate::files::path_component(server));
        crate::files::write_atomic(&path, token.expose().as_bytes())
    }

    /// Removes the directory and every token in it.
    pub fn remove(self) -> Result<()> {
        let dir = self.dir.clone();
        std::mem::forget(self);
        std::fs::remove_dir_all(&dir).with_context(|| format!("cannot remove {}", dir.display()))
    }
}

impl Drop for TokenDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
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
    fn token_dirs_are_private_and_removed() {
        let dir = TokenDir::create().unwrap();
        let path = dir.path().to_path_buf();
        dir.write("time", &Secret::new("t0k")).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o700
        );
        assert_eq!(std::fs::read_to_string(path.join("time")).unwrap(), "t0k");
        dir.remove().unwrap();
        assert!(!path.exists());
    }
}
