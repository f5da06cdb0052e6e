//! A run's workspaces: each distinct `workspace` its eval, variants and cases name, and each
//! check's hidden `files`, packed once before any machine starts (a source that is missing or hostile fails the run there, naming
//! who named it), kept by digest in `$MST_HOME/workspaces/`, and recorded in `run.json`.

use crate::eval::config::{EvalConfig, WorkspaceSpec};
use crate::eval::dataset::Cases;
use crate::eval::per_trial::CaseOrVariant;
use crate::shard::check_files::{CheckFiles, MAX_CHECK_FILES_BYTES};
use crate::workspace::{Source, WorkspaceRecord};
use anyhow::{Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A run's packed workspaces and which trials get which.
#[derive(Debug, Default)]
pub struct RunWorkspaces {
    /// Where the archives lie ([`crate::workspace::archive_name`]).
    pub dir: PathBuf,
    /// The digest of the workspace each trial gets: its case's own, else its variant's.
    pub trials: CaseOrVariant<String>,
    /// Each workspace once, for `run.json`.
    pub records: Vec<WorkspaceRecord>,
    /// The checks' hidden files, packed likewise, which the coordinators hand out.
    pub check_files: CheckFiles,
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
        let mut check_files = BTreeMap::new();
        let variant_checks = config.variants.iter().filter_map(|(name, variant)| {
            let checks = variant.checks.as_deref()?;
            Some((format!("variants.{name}.checks"), checks))
        });
        for (place, checks) in [("checks".to_string(), &config.checks[..])]
            .into_iter()
            .chain(variant_checks)
        {
            packing.check_files(checks, Some(base), &place, &mut check_files)?;
        }
        let mut own = BTreeMap::new();
        for (index, case) in cases.iter().enumerate() {
            let case = case?;
            let place = format!("case `{}` ({})", case.id, cases.origin(index));
            if let Some(spec) = &case.more().workspace {
                let place = format!("{place}: `workspace`");
                spec.validate(&place)?;
                own.insert(case.id.to_string(), packing.digest(spec, &place)?);
            }
            if let Some(checks) = &case.more().checks {
                // Anchored to its dataset file as it was read.
                packing.check_files(
                    checks,
                    None,
                    &format!("{place}: `checks`"),
                    &mut check_files,
                )?;
            }
        }
        Ok(RunWorkspaces {
            check_files: CheckFiles {
                dir: packing.dir.clone(),
                digests: check_files,
            },
            dir: packing.dir,
            trials: CaseOrVariant {
                variants,
                cases: own,
            },
            records: packing.records,
        })
    }
}

/// The sources packed so far.
struct Packing {
    dir: PathBuf,
    done: BTreeMap<WorkspaceSpec, String>,
    records: Vec<WorkspaceRecord>,
}

impl Packing {
    /// Packs the hidden files of each of `checks` (named at `place`; relative to `base` when
    /// given, else already anchored) into `digests`, by `files` as written.
    fn check_files(
        &mut self,
        checks: &[crate::eval::config::CheckSpec],
        base: Option<&Path>,
        place: &str,
        digests: &mut BTreeMap<String, String>,
    ) -> Result<()> {
        for (index, check) in checks.iter().enumerate() {
            let Some(files) = &check.files else { continue };
            if digests.contains_key(files) {
                continue;
            }
            let at = format!("{place}[{index}].files");
            let dir = base.map_or_else(|| PathBuf::from(files), |base| base.join(files));
            if !dir.is_dir() {
                anyhow::bail!("`{at}`: {} is not a directory", dir.display());
            }
            let packed = crate::workspace::pack(Source::Dir(&dir), &self.dir)
                .with_context(|| format!("`{at}`: cannot pack {}", dir.display()))?;
            let archive = self
                .dir
                .join(crate::workspace::archive_name(&packed.digest));
            let size = std::fs::metadata(&archive)?.len();
            if size > MAX_CHECK_FILES_BYTES {
                anyhow::bail!(
                    "`{at}`: {} packs to {size} bytes; a check's hidden files may take {} at                      most (keep large fixtures in the workspace)",
                    dir.display(),
                    MAX_CHECK_FILES_BYTES
                );
            }
            digests.insert(files.clone(), packed.digest);
        }
        Ok(())
    }

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
