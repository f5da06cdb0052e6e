//! The install store: `$MST_HOME/plugins/<namespace>/<kind>/<name>/<version>/`, holding the
//! component (`plugin.wasm`) and `manifest.json` (identity, digest, capabilities, and the check
//! report it passed). A plugin's digest is verified every time it is read back, so a file
//! changed after install is refused rather than run.

use super::check::CheckReport;
use super::loaded::{digest, valid_name};
use super::Kind;
use crate::plugin::capabilities::Capability;
use anyhow::{bail, Context, Result};
use semver::Version;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const WASM_FILE: &str = "plugin.wasm";
const MANIFEST_FILE: &str = "manifest.json";

/// What the store records about an installed plugin.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub name: String,
    pub version: String,
    pub kind: Kind,
    pub description: String,
    /// sha256 of `plugin.wasm`, lowercase hex.
    pub digest: String,
    pub size: u64,
    pub capabilities: Vec<Capability>,
    /// Seconds since the Unix epoch.
    pub installed_at: u64,
    /// The check report the plugin passed at install time.
    pub check: CheckReport,
    /// Where it was installed from (absent in records written before mst kept it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<Origin>,
}

/// Where an installed plugin came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Origin {
    /// A `.wasm` file, by the absolute path it was installed from.
    File {
        /// The file's path.
        path: PathBuf,
    },
    /// An OCI registry.
    #[serde(rename_all = "camelCase")]
    Oci {
        /// The `oci://…` reference it was installed by.
        reference: String,
        /// The manifest's digest, `sha256:…`: what the reference pointed at when installed.
        manifest_digest: String,
        /// The component's sha256 (the layer digest, verified against the bytes).
        sha256: String,
    },
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::File { path } => write!(f, "{}", path.display()),
            Origin::Oci {
                reference,
                manifest_digest,
                ..
            } => write!(f, "{reference} ({manifest_digest})"),
        }
    }
}

/// One installed plugin.
#[derive(Debug, Clone)]
pub struct InstalledPlugin {
    pub manifest: Manifest,
    dir: PathBuf,
}

impl InstalledPlugin {
    /// The component file.
    pub fn wasm_path(&self) -> PathBuf {
        self.dir.join(WASM_FILE)
    }

    /// The component's bytes, after checking they still have the recorded digest.
    pub fn read_verified(&self) -> Result<Vec<u8>> {
        let path = self.wasm_path();
        let bytes =
            std::fs::read(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let actual = digest(&bytes);
        if actual != self.manifest.digest {
            bail!(
                "installed plugin {} {} was modified after install (digest {actual}, recorded {}); \
                 reinstall it with `mst plugin install --force FILE`",
                self.manifest.name,
                self.manifest.version,
                self.manifest.digest
            );
        }
        Ok(bytes)
    }
}

/// The directory of installed plugins.
pub struct InstallStore {
    dir: PathBuf,
}

/// Splits `name@version` (version optional).
fn split_spec(spec: &str) -> Result<(&str, Option<Version>)> {
    let (name, version) = match spec.split_once('@') {
        Some((name, v)) => (
            name,
            Some(
                Version::parse(v)
                    .with_context(|| format!("`{v}` in `{spec}` is not a version like 1.2.0"))?,
            ),
        ),
        None => (spec, None),
    };
    if !valid_name(name) {
        bail!("`{name}` is not a plugin name: names look like `namespace/kind/name`, e.g. `mst/grader/contains`");
    }
    Ok((name, version))
}

impl InstallStore {
    /// The store in `dir` (usually `$MST_HOME/plugins`).
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// Stores a checked, compatible component that came from `source`. Refuses to replace a
    /// different build of the same name and version unless `force`.
    pub fn install(
        &self,
        bytes: &[u8],
        report: &CheckReport,
        source: Origin,
        force: bool,
    ) -> Result<InstalledPlugin> {
        let (Some(name), Some(version), Some(kind), true) = (
            &report.name,
            &report.version,
            report.kind,
            report.compatible,
        ) else {
            bail!(
                "{} is not compatible with this mst; run `mst plugin check {}` for why",
                report.file,
                report.file
            );
        };
        // The name and version come from the plugin: check them again before they become a path.
        if !valid_name(name) {
            bail!("refusing to install: plugin name {name:?} is not `namespace/kind/name`");
        }
        let version = Version::parse(version)
            .context("refusing to install: the plugin's version is not semver")?;
        let target = self.dir.join(name).join(version.to_string());
        if let Ok(existing) = self.read(&target) {
            // The same build again is a no-op, except that a new source is recorded.
            if existing.manifest.digest == report.digest {
                if existing.manifest.source.as_ref() == Some(&source) {
                    return Ok(existing);
                }
            } else if !force {
                bail!(
                    "{name} {version} is already installed with another digest (sha256:{}); bump \
                     the plugin's version, or pass --force to replace it",
                    existing.manifest.digest
                );
            }
        }
        let parent = target.parent().expect("target has a parent");
        crate::home::create_private_dir(parent)?;
        let staging = tempfile::tempdir_in(parent)
            .with_context(|| format!("cannot stage in {}", parent.display()))?;
        std::fs::write(staging.path().join(WASM_FILE), bytes)?;
        let manifest = Manifest {
            name: name.clone(),
            version: version.to_string(),
            kind,
            description: report.description.clone().unwrap_or_default(),
            digest: report.digest.clone(),
            size: bytes.len() as u64,
            capabilities: report.capabilities.clone(),
            installed_at: crate::clock::unix_secs(),
            check: report.clone(),
            source: Some(source),
        };
        std::fs::write(
            staging.path().join(MANIFEST_FILE),
            serde_json::to_vec_pretty(&manifest)?,
        )?;
        if target.exists() {
            std::fs::remove_dir_all(&target)
                .with_context(|| format!("cannot replace {}", target.display()))?;
        }
        let staged = staging.keep();
        std::fs::rename(&staged, &target)
            .with_context(|| format!("cannot move plugin into {}", target.display()))?;
        self.read(&target)
    }

    fn read(&self, dir: &Path) -> Result<InstalledPlugin> {
        let path = dir.join(MANIFEST_FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        let manifest: Manifest = serde_json::from_str(&text)
            .with_context(|| format!("{} is damaged", path.display()))?;
        Ok(InstalledPlugin {
            manifest,
            dir: dir.to_path_buf(),
        })
    }

    /// Every installed plugin, sorted by name then version.
    pub fn list(&self) -> Result<Vec<InstalledPlugin>> {
        let mut found = Vec::new();
        // namespace / kind / name / version: four levels of real directories (links are skipped).
        let mut level = vec![self.dir.clone()];
        for _ in 0..4 {
            let mut next = Vec::new();
            for dir in level {
                let Ok(entries) = std::fs::read_dir(&dir) else {
                    continue;
                };
                for entry in entries.flatten() {
                    if entry.file_type().is_ok_and(|t| t.is_dir()) {
                        next.push(entry.path());
                    }
                }
            }
            level = next;
        }
        for dir in level {
            match self.read(&dir) {
                Ok(plugin) => found.push(plugin),
                Err(e) => tracing::warn!("skipping {}: {e:#}", dir.display()),
            }
        }
        found.sort_by(|a, b| {
            let version = |p: &InstalledPlugin| Version::parse(&p.manifest.version).ok();
            a.manifest
                .name
                .cmp(&b.manifest.name)
                .then(version(a).cmp(&version(b)))
        });
        Ok(found)
    }

    /// Installed plugins matching `name` (every version) or `name@version`, oldest first.
    fn matching(&self, spec: &str) -> Result<Vec<InstalledPlugin>> {
        let (name, version) = split_spec(spec)?;
        let found: Vec<InstalledPlugin> = self
            .list()?
            .into_iter()
            .filter(|p| p.manifest.name == name)
            .filter(|p| {
                version
                    .as_ref()
                    .is_none_or(|v| p.manifest.version == v.to_string())
            })
            .collect();
        if found.is_empty() {
            bail!("no installed plugin `{spec}`; `mst plugin list` shows what is installed");
        }
        Ok(found)
    }

    /// The plugin `name` (newest version) or `name@version`.
    pub fn find(&self, spec: &str) -> Result<InstalledPlugin> {
        let newest = self.matching(spec)?.pop();
        Ok(newest.expect("matching returns at least one plugin"))
    }

    /// The plugin installed from `reference` (`oci://…`), the latest installed if the tag was
    /// installed more than once.
    pub fn find_oci(&self, reference: &str) -> Result<InstalledPlugin> {
        self.list()?
            .into_iter()
            .filter(|p| {
                matches!(&p.manifest.source, Some(Origin::Oci { reference: r, .. }) if r == reference)
            })
            .max_by_key(|p| p.manifest.installed_at)
            .with_context(|| {
                format!("`{reference}` is not installed: run `mst plugin install {reference}` first")
            })
    }

    /// The installed runner `name` names: its full name (`acme/runner/ssh`, `@version`
    /// allowed) or its last part alone (`ssh`) when one installed runner has it. An unknown or
    /// ambiguous name is an error listing the installed runners.
    pub fn find_runner(&self, name: &str) -> Result<InstalledPlugin> {
        let runners: Vec<InstalledPlugin> = self
            .list()?
            .into_iter()
            .filter(|p| p.manifest.kind == Kind::Runner)
            .collect();
        let (base, version) = name.split_once('@').unwrap_or((name, ""));
        let mut found: Vec<&InstalledPlugin> = runners
            .iter()
            .filter(|p| {
                let m = &p.manifest;
                let short = m.name.rsplit('/').next().unwrap_or_default();
                (m.name == base || short == base) && (version.is_empty() || m.version == version)
            })
            .collect();
        let names: std::collections::BTreeSet<&str> =
            found.iter().map(|p| p.manifest.name.as_str()).collect();
        let installed = || {
            let all: std::collections::BTreeSet<&str> =
                runners.iter().map(|p| p.manifest.name.as_str()).collect();
            if all.is_empty() {
                "no runner plugins are installed".to_string()
            } else {
                let all: Vec<&str> = all.into_iter().collect();
                format!("the installed runners are {}", all.join(", "))
            }
        };
        match names.len() {
            0 => bail!(
                "unknown runner `{name}`: the built-in runners are `local`, `docker` and `sim`, and {}; \
                 load another with --plugin FILE or install it with `mst plugin install`",
                installed()
            ),
            1 => Ok(found.pop().expect("one name was found").clone()),
            _ => bail!(
                "runner `{name}` is ambiguous: it could be {}; give the full name",
                names.into_iter().collect::<Vec<_>>().join(" or ")
            ),
        }
    }

    /// Removes `name` (every version) or `name@version`; returns what was removed.
    pub fn remove(&self, spec: &str) -> Result<Vec<InstalledPlugin>> {
        let doomed = self.matching(spec)?;
        for plugin in &doomed {
            std::fs::remove_dir_all(&plugin.dir)
                .with_context(|| format!("cannot remove {}", plugin.dir.display()))?;
        }
        // Tidy the now-empty name directory; a failure here leaves only an empty folder.
        let _ = std::fs::remove_dir(self.dir.join(&doomed[0].manifest.name));
        Ok(doomed)
    }
}

/// Where a plugin named on the command line or in a config comes from.
pub enum PluginSource {
    /// A `.wasm` file.
    File(PathBuf),
    /// An installed plugin.
    Installed(Box<InstalledPlugin>),
}

impl PluginSource {
    /// Resolves `reference`: `oci://…` is the plugin installed from that reference; an existing
    /// path (relative to `base`) or a name ending in `.wasm` is a file; anything else is an
    /// installed plugin's name.
    pub fn find(store: &InstallStore, base: &Path, reference: &str) -> Result<Self> {
        if reference.starts_with(super::oci::SCHEME) {
            return Ok(PluginSource::Installed(Box::new(
                store.find_oci(reference)?,
            )));
        }
        let path = base.join(reference);
        if path.exists() || reference.ends_with(".wasm") {
            return Ok(PluginSource::File(path));
        }
        store
            .find(reference)
            .map(|p| PluginSource::Installed(Box::new(p)))
            .with_context(|| format!("`{reference}` is neither a file nor an installed plugin"))
    }

    /// The plugin's bytes (an installed plugin's verified against its digest) and a label for
    /// messages: the file's path, or `name@version`.
    pub fn read(&self) -> Result<(Vec<u8>, String)> {
        match self {
            PluginSource::File(path) => {
                Ok((crate::files::read_input(path)?, path.display().to_string()))
            }
            PluginSource::Installed(plugin) => Ok((
                plugin.read_verified()?,
                format!("{}@{}", plugin.manifest.name, plugin.manifest.version),
            )),
        }
    }
}
