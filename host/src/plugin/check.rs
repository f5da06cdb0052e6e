//! The report of `mst plugin check`: compatibility, identity, ABI surface and problems, for a
//! person (`render`) or for CI (`--json`).

use super::cache::CacheOutcome;
use super::capabilities::Capability;
use super::inspect::{Item, Kind, Problem, Severity};
use super::loaded::{FailedStep, LoadError, LoadedPlugin};
use super::{ABI_VERSION, WASI_VERSION};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// What this host supports, printed with every report so a failure says what would fit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostAbi {
    /// The `mst:plugin` WIT package version.
    pub mst_plugin: String,
    /// The newest WASI 0.2 release provided.
    pub wasi: String,
    /// The mst release.
    pub mst: String,
}

impl HostAbi {
    /// This build's values.
    pub fn current() -> Self {
        HostAbi {
            mst_plugin: ABI_VERSION.to_string(),
            wasi: WASI_VERSION.to_string(),
            mst: env!("CARGO_PKG_VERSION").to_string(),
        }
    }
}

/// The result of checking one component.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    /// The file checked.
    pub file: String,
    /// Whether this host can load and use it.
    pub compatible: bool,
    /// Whether it could be read as a component at all.
    pub readable: bool,
    pub kind: Option<Kind>,
    pub name: Option<String>,
    pub version: Option<String>,
    pub description: Option<String>,
    /// sha256 of the file, lowercase hex.
    pub digest: String,
    pub size: u64,
    pub imports: Vec<Item>,
    pub exports: Vec<Item>,
    pub capabilities: Vec<Capability>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options_schema: Option<serde_json::Value>,
    pub problems: Vec<Problem>,
    pub host: HostAbi,
    /// Whether the compiled artifact came from the cache (absent when nothing was compiled).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheOutcome>,
}

impl CheckReport {
    /// The report for a load that succeeded or failed.
    pub fn new(file: &str, size: u64, loaded: &Result<LoadedPlugin, Box<LoadError>>) -> Self {
        match loaded {
            Ok(plugin) => CheckReport {
                file: file.to_string(),
                compatible: true,
                readable: true,
                kind: Some(plugin.kind()),
                name: Some(plugin.info().name.clone()),
                version: Some(plugin.info().version.clone()),
                description: Some(plugin.info().description.clone()),
                digest: plugin.digest().to_string(),
                size,
                imports: plugin.surface().imports.clone(),
                exports: plugin.surface().exports.clone(),
                capabilities: plugin.info().capabilities.clone(),
                options_schema: plugin.info().options_schema.clone(),
                problems: plugin.warnings().to_vec(),
                host: HostAbi::current(),
                cache: Some(plugin.cache_outcome()),
            },
            Err(failure) => CheckReport {
                file: file.to_string(),
                compatible: false,
                readable: failure.step != FailedStep::Read,
                kind: failure.kind,
                name: failure.info.as_ref().map(|i| i.name.clone()),
                version: failure.info.as_ref().map(|i| i.version.clone()),
                description: failure.info.as_ref().map(|i| i.description.clone()),
                digest: failure.digest.clone(),
                size,
                imports: failure
                    .surface
                    .as_ref()
                    .map(|s| s.imports.clone())
                    .unwrap_or_default(),
                exports: failure
                    .surface
                    .as_ref()
                    .map(|s| s.exports.clone())
                    .unwrap_or_default(),
                capabilities: failure
                    .info
                    .as_ref()
                    .map(|i| i.capabilities.clone())
                    .unwrap_or_default(),
                options_schema: None,
                problems: failure.problems.clone(),
                host: HostAbi::current(),
                cache: None,
            },
        }
    }

    /// 0 compatible, 1 incompatible, 2 not a readable component.
    pub fn exit_code(&self) -> u8 {
        match (self.readable, self.compatible) {
            (false, _) => 2,
            (true, false) => 1,
            (true, true) => 0,
        }
    }

    /// The report for a person.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let host = format!(
            "mst:plugin@{}, WASI {}",
            self.host.mst_plugin, self.host.wasi
        );
        let verdict = match self.exit_code() {
            0 => format!("compatible: {} fits this mst ({host})", self.file),
            1 => format!("incompatible: {} does not fit this mst ({host})", self.file),
            _ => format!("unreadable: {} is not a WebAssembly component", self.file),
        };
        let _ = writeln!(out, "{verdict}");
        let mut field = |label: &str, value: &str| {
            let _ = writeln!(out, "  {label:<13}{value}");
        };
        if let Some(name) = &self.name {
            field("name", name);
        }
        if let Some(version) = &self.version {
            field("version", version);
        }
        if let Some(kind) = self.kind {
            field("kind", kind.as_str());
        }
        if let Some(description) = &self.description {
            field("description", description);
        }
        field("digest", &format!("sha256:{}", self.digest));
        field("size", &format!("{} bytes", self.size));
        if self.readable {
            let caps: Vec<String> = self.capabilities.iter().map(|c| c.to_string()).collect();
            field(
                "capabilities",
                &if caps.is_empty() {
                    "none".to_string()
                } else {
                    caps.join(", ")
                },
            );
            let names = |items: &[Item]| {
                items
                    .iter()
                    .map(|i| i.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            field("imports", &names(&self.imports));
            field("exports", &names(&self.exports));
        }
        for problem in &self.problems {
            let tag = match problem.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
            };
            let _ = writeln!(out, "  {tag}: {}", problem.message);
        }
        out
    }
}
