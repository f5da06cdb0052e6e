//! `workspace`: the files a task lays in front of its agent, on the eval, a variant or a case
//! (docs/config.md, "Workspaces"). This is where they come from; `crate::workspace` packs and
//! unpacks them.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::Path;

/// Where a workspace comes from, as written: a directory or a `.tar`/`.tar.gz` (relative to
/// the file that names it), or `{"git": REPO, "rev": REV}`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(untagged, try_from = "Value")]
pub enum WorkspaceSpec {
    /// A directory, or a tar archive (`.tar`, `.tar.gz`, `.tgz`).
    Path(String),
    /// Commit, branch or tag `rev` of the git repository `git` (a path or any URL git fetches).
    Git { git: String, rev: String },
}

/// How a `workspace` is written, for errors.
const SHAPES: &str = "a directory, a `.tar`/`.tar.gz` path, or {\"git\": REPO, \"rev\": REV}";

impl TryFrom<Value> for WorkspaceSpec {
    type Error = String;

    fn try_from(value: Value) -> Result<Self, String> {
        let text = |v: Option<&Value>, key: &str| match v {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            _ => Err(format!("`workspace.{key}` must be a non-empty string")),
        };
        match value {
            Value::String(path) if !path.is_empty() => Ok(WorkspaceSpec::Path(path)),
            Value::Object(map) => {
                if let Some(key) = map.keys().find(|k| !matches!(k.as_str(), "git" | "rev")) {
                    return Err(format!(
                        "`workspace` has an unknown key `{key}`: write {SHAPES}"
                    ));
                }
                Ok(WorkspaceSpec::Git {
                    git: text(map.get("git"), "git")?,
                    rev: text(map.get("rev"), "rev")?,
                })
            }
            other => Err(format!("`workspace` is {other}: write {SHAPES}")),
        }
    }
}

impl WorkspaceSpec {
    /// This spec with a relative path (or a git repository given as a relative path) made
    /// relative to `base`, the directory of the file that names it.
    pub fn anchored(&self, base: &Path) -> WorkspaceSpec {
        let join = |path: &str| base.join(path).display().to_string();
        match self {
            WorkspaceSpec::Path(path) if !Path::new(path).is_absolute() => {
                WorkspaceSpec::Path(join(path))
            }
            WorkspaceSpec::Git { git, rev } if is_relative_path(git) => WorkspaceSpec::Git {
                git: join(git),
                rev: rev.clone(),
            },
            other => other.clone(),
        }
    }

    /// A `rev` that git could read as an option is refused (it lands in git's argv).
    pub fn validate(&self, place: &str) -> Result<()> {
        if let WorkspaceSpec::Git { git, rev } = self {
            if rev.starts_with('-') || git.starts_with('-') {
                bail!("`{place}`: a repository or rev starting with `-` is refused");
            }
        }
        Ok(())
    }
}

impl std::fmt::Display for WorkspaceSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WorkspaceSpec::Path(path) => f.write_str(path),
            WorkspaceSpec::Git { git, rev } => write!(f, "{git} at {rev}"),
        }
    }
}

/// Whether git would read `repo` as a local path relative to where it runs: not absolute,
/// not a URL (`scheme://`), not scp-like (`host:path`, a `:` before any `/`).
fn is_relative_path(repo: &str) -> bool {
    let scp_like = repo
        .find(':')
        .is_some_and(|colon| !repo[..colon].contains('/'));
    !repo.starts_with('/') && !repo.contains("://") && !scp_like
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_shape_parses_and_anything_else_names_the_shapes() {
        let spec: WorkspaceSpec = serde_json::from_str(r#""repo""#).unwrap();
        assert_eq!(spec, WorkspaceSpec::Path("repo".into()));
        let spec: WorkspaceSpec = serde_json::from_str(r#"{"git": "r", "rev": "main"}"#).unwrap();
        assert_eq!(spec.to_string(), "r at main");
        for bad in [
            r#"3"#,
            r#""""#,
            r#"{"git": "r"}"#,
            r#"{"git": "r", "rev": "v", "x": 1}"#,
        ] {
            let error = serde_json::from_str::<WorkspaceSpec>(bad)
                .unwrap_err()
                .to_string();
            assert!(error.contains("workspace"), "{bad}: {error}");
        }
    }

    #[test]
    fn relative_paths_and_local_repositories_are_anchored_and_urls_are_not() {
        let base = Path::new("/evals/x");
        let path = |p: &str| WorkspaceSpec::Path(p.into()).anchored(base).to_string();
        assert_eq!(path("repo"), "/evals/x/repo");
        assert_eq!(path("/abs.tar"), "/abs.tar");
        let git = |g: &str| {
            let spec = WorkspaceSpec::Git {
                git: g.into(),
                rev: "v1".into(),
            };
            spec.anchored(base).to_string()
        };
        assert_eq!(git("../repo"), "/evals/x/../repo at v1");
        assert_eq!(
            git("https://example.org/r.git"),
            "https://example.org/r.git at v1"
        );
        assert_eq!(git("git@example.org:r.git"), "git@example.org:r.git at v1");
        let option = WorkspaceSpec::Git {
            git: "r".into(),
            rev: "--upload-pack=x".into(),
        };
        assert!(option.validate("variants.a.workspace").is_err());
    }
}
