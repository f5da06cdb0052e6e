//! `checks`: programs the worker runs inside the machine after a trial's client ended.

use super::validate::seconds;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// A check the worker runs inside the machine after a trial's client finished, in the
/// trial's work directory, before anything is cleaned up: the repository's tests after an
/// agent edited code, a look at a file it should have made. Its exit code and the end of its
/// output become the trace's `check` event, which `check-passed` and grader plugins read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// Names its event and what `check-passed` asks for: letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The program and its arguments (no shell: write `["sh", "-c", "…"]` for one).
    pub run: Vec<String>,
    /// Seconds it may take (default 60, at most a day); past it, it is killed and fails.
    #[serde(default = "super::sixty")]
    pub timeout: f64,
    /// A directory of hidden files laid over the work directory just before the check runs,
    /// after the agent is gone: relative to the file that names the check (a case's are
    /// anchored to its dataset file as it is read).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub files: Option<String>,
}

impl CheckSpec {
    /// This check with a relative `files` made relative to `base`.
    pub fn anchored(&self, base: &std::path::Path) -> CheckSpec {
        let files = (self.files.as_deref()).map(|files| base.join(files).display().to_string());
        CheckSpec {
            files,
            ..self.clone()
        }
    }
}

/// Checks a `checks` list at `place` (`checks`, `variants.V.checks`, a case's `checks`): each
/// named plainly and once, with a program, within a day.
pub fn validate_checks(checks: &[CheckSpec], place: &str) -> Result<()> {
    let mut names = std::collections::BTreeSet::new();
    for (index, check) in checks.iter().enumerate() {
        let at = format!("{place}[{index}]");
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if check.name.is_empty() || !check.name.chars().all(plain) {
            bail!(
                "`{at}.name` is {:?}: name a check with letters, digits, `-`, `_` or `.`",
                check.name
            );
        }
        if !names.insert(check.name.as_str()) {
            bail!(
                "`{at}.name`: another check of `{place}` is called `{}`",
                check.name
            );
        }
        if check.run.first().is_none_or(|program| program.is_empty()) {
            bail!("`{at}.run` is empty: give the program and its arguments, e.g. [\"pytest\", \"-q\"]");
        }
        seconds(&format!("`{at}.timeout`"), check.timeout)?;
        if check.files.as_deref() == Some("") {
            bail!("`{at}.files` is empty: name the directory of the check's hidden files");
        }
    }
    Ok(())
}
