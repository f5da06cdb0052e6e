//! `$MST_HOME`: the directory where mst keeps installed plugins and compiled artifacts.
//!
//! Defaults to `~/.mst`. Everything below it is created with owner-only permissions, because
//! the artifact cache holds native code that mst maps and executes.

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};

/// The resolved `$MST_HOME` and the paths below it.
#[derive(Debug, Clone)]
pub struct Home {
    root: PathBuf,
}

impl Home {
    /// `$MST_HOME` if set, else `~/.mst`.
    pub fn from_env() -> Result<Self> {
        if let Some(dir) = std::env::var_os("MST_HOME").filter(|v| !v.is_empty()) {
            return Ok(Self::at(PathBuf::from(dir)));
        }
        let home = std::env::var_os("HOME")
            .filter(|v| !v.is_empty())
            .context("neither MST_HOME nor HOME is set: set MST_HOME to a directory mst may use")?;
        Ok(Self::at(PathBuf::from(home).join(".mst")))
    }

    /// A home rooted at `root` (created lazily).
    pub fn at(root: PathBuf) -> Self {
        Self { root }
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where precompiled plugin artifacts are cached.
    pub fn cache_dir(&self) -> PathBuf {
        self.root.join("cache")
    }

    /// Model providers configured once for every eval (`providers.json`, merged under each
    /// config's own `providers`).
    pub fn providers_file(&self) -> PathBuf {
        self.root.join("providers.json")
    }

    /// The operator's default options per runner (`runners.json`), under each run's own
    /// `--runner-option`s.
    pub fn runner_defaults_file(&self) -> PathBuf {
        self.root.join("runners.json")
    }

    /// Where packed workspaces are kept, each `<digest>.tar` once for every run that uses it.
    pub fn workspaces_dir(&self) -> PathBuf {
        self.root.join("workspaces")
    }

    /// Where installed plugins live: `plugins/<name>/<version>/`.
    pub fn plugins_dir(&self) -> PathBuf {
        self.root.join("plugins")
    }
}

/// Creates `dir` and its parents, owner-only (0700) on Unix.
pub fn create_private_dir(dir: &Path) -> Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder
        .create(dir)
        .with_context(|| format!("cannot create directory {}", dir.display()))
}
