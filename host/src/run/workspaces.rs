//! A run's workspaces: each distinct `workspace` its eval, variants and cases name, packed once
//! before any machine starts (a source that is missing or hostile fails the run there, naming
//! who named it), kept by digest in `$MST_HOME/workspaces/`, and recorded in `run.json`.

use crate::eval::config::{EvalConfig, WorkspaceSpec};
use crate::eval::dataset::Cases;
use crate::workspace::{Source, WorkspaceRecord};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A run's packed workspaces and which trials get which.
#[derive(Debug, Default)]
pub struct RunWorkspaces {
    /// Where the archives lie ([`crate::workspace::archive_name`]).
    pub dir: PathBuf,
    /// By variant: the digest of the workspace its trials get when their case has none.
    pub variants: BTreeMap<String, String>,
    /// By case id: the digest of the case's own.
    pub cases: BTreeMap<String, String>,
    /// Each workspace once, for `run.json`.
    pub records: Vec<WorkspaceRecord>,
}

impl RunWorkspaces {
    /// Packs every workspace of `config` (relative to `base`, its directory) and of `cases`
    /// into `dir`, each distinct source once.
    pub fn pack(config: &EvalConfig, base: &Path, cases: &Cases, dir: &Path) -> Result<Self> {
        let mut packing = Packing {
            dir: dir.to_path_buf(),
            done: BTreeMap::new(),
            records: Vec::new(),
        };
        let mut variants = BTreeMap::new();
        for name in config.variant_names() {
            let own = config
                .variants
                .get(&name)
                .and_then(|v| v.workspace.as_ref());
            let (spec, place) = match (own, &config.workspace) {
                (Some(spec), _) => (spec, format!("variants.{name}.workspace")),
                (None, Some(spec)) => (spec, "workspace".to_string()),
                (None, None) => continue,
            };
            let digest = packing.digest(&spec.anchored(base), &place)?;
            variants.insert(name, digest);
        }
        let mut own = BTreeMap::new();
        for (index, case) in cases.iter().enumerate() {
            let case = case?;
            if let Some(spec) = &case.more().workspace {
                let place = format!("case `{}` ({}): `workspace`", case.id, cases.origin(index));
                spec.validate(&place)?;
                own.insert(case.id.to_string(), packing.digest(spec, &place)?);
            }
        }
        Ok(RunWorkspaces {
            dir: packing.dir,
            variants,
            cases: own,
            records: packing.records,
        })
    }

    /// Whether no trial gets a workspace.
    pub fn is_empty(&self) -> bool {
        self.variants.is_empty() && self.cases.is_empty()
    }
}

/// The sources packed so far.
struct Packing {
    dir: PathBuf,
    done: BTreeMap<WorkspaceSpec, String>,
    records: Vec<WorkspaceRecord>,
}

impl Packing {
    /// The digest of `spec` (named at `place` in errors), packed if it was not yet.
    fn digest(&mut self, spec: &WorkspaceSpec, place: &str) -> Result<String> {
        if let Some(digest) = self.done.get(spec) {
            return Ok(digest.clone());
        }
        let source = match spec {
            WorkspaceSpec::Git { git, rev } => Source::Git { repo: git, rev },
            WorkspaceSpec::Path(path) if Path::new(path).is_dir() => Source::Dir(Path::new(path)),
            WorkspaceSpec::Path(path) if Path::new(path).is_file() => Source::Tar(Path::new(path)),
            WorkspaceSpec::Path(path) => anyhow::bail!(
                "{place}: {path} is neither a directory nor a tar archive (does it exist?)"
            ),
        };
        let packed = crate::workspace::pack(source, &self.dir)
            .with_context(|| format!("{place}: cannot use {spec} as a workspace"))?;
        self.done.insert(spec.clone(), packed.digest.clone());
        let digest = packed.digest.clone();
        if !self.records.iter().any(|r| r.packed.digest == digest) {
            self.records.push(WorkspaceRecord {
                source: spec.to_string(),
                packed,
            });
        }
        Ok(digest)
    }
}
