//! The report of `mst plugin check`: compatibility, identity, ABI surface and problems, for a
//! person (`render`) or for CI (`--json`, the stable `mst.plugin-check/v1` schema documented in
//! docs/plugins.md, "Checking").

use super::cache::CacheOutcome;
use super::capabilities::Capability;
use super::inspect::{HostRelease, Item, Kind, Problem, Severity, Surface, CURRENT};
use super::loaded::{FailedStep, LoadError, LoadedPlugin};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;

/// The `schema` of the JSON report. A field is only ever added within v1; renaming, removing
/// or changing the meaning of one makes v2.
pub const SCHEMA: &str = "mst.plugin-check/v1";

fn schema() -> String {
    SCHEMA.to_string()
}

/// What the host checked against supports, printed with every report so a failure says what
/// would fit.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct HostAbi {
    /// The newest `mst:plugin` WIT package version it loads.
    pub mst_plugin: String,
    /// The `mst:plugin` versions it loads, one semver range per track (`>=0.1.0, <=0.1.0`).
    #[serde(default)]
    pub mst_plugin_ranges: Vec<String>,
    /// The newest WASI 0.2 release provided.
    pub wasi: String,
    /// The mst release.
    pub mst: String,
}

impl HostAbi {
    /// This build's values.
    pub fn current() -> Self {
        HostAbi::of(&CURRENT)
    }

    /// The values of mst `release`.
    pub fn of(release: &HostRelease) -> Self {
        HostAbi {
            mst_plugin: release.newest_abi().to_string(),
            mst_plugin_ranges: release.mst_plugin_ranges(),
            wasi: release.wasi.to_string(),
            mst: release.mst.to_string(),
        }
    }
}

/// The result of checking one component.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CheckReport {
    /// [`SCHEMA`]; reports stored before it existed read as v1.
    #[serde(default = "schema")]
    pub schema: String,
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
                schema: schema(),
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
                schema: schema(),
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

    /// The report re-decided for mst `release` (`--host-version`): the static ABI check
    /// against that release's range. The findings of this host's own load that are not about
    /// the ABI (its `info`, its name) carry over when this host speaks the same ABI; otherwise
    /// only the static check is known, and a warning says so.
    pub fn for_release(mut self, release: &HostRelease) -> Self {
        self.host = HostAbi::of(release);
        if *release == CURRENT || !self.readable {
            return self;
        }
        let surface = Surface {
            imports: self.imports.clone(),
            exports: self.exports.clone(),
        };
        let there = surface.assess_for(release);
        let here = surface.assess();
        let mut problems = there.problems;
        if here.compatible() {
            problems.extend(
                self.problems
                    .into_iter()
                    .filter(|p| !here.problems.contains(p)),
            );
        } else {
            problems.push(Problem::warning(format!(
                "checked against mst {}'s ABI statically: this mst cannot load the plugin to \
                 call its `info`",
                release.mst
            )));
        }
        self.compatible =
            there.kind.is_some() && problems.iter().all(|p| p.severity != Severity::Error);
        self.kind = self.kind.or(there.kind);
        self.problems = problems;
        self
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
        let target = if self.host.mst == CURRENT.mst {
            "this mst".to_string()
        } else {
            format!("mst {}", self.host.mst)
        };
        let verdict = match self.exit_code() {
            0 => format!("compatible: {} fits {target} ({host})", self.file),
            1 => format!("incompatible: {} does not fit {target} ({host})", self.file),
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

#[cfg(test)]
mod tests {
    use super::*;

    /// A report as this host makes it for a grader built against `mst:plugin@{version}`.
    fn report(version: &str, compatible: bool, problems: serde_json::Value) -> CheckReport {
        let item =
            |iface: &str| serde_json::json!({"name": format!("mst:plugin/{iface}@{version}")});
        serde_json::from_value(serde_json::json!({
            "file": "g.wasm", "compatible": compatible, "readable": true, "digest": "00",
            "size": 1, "imports": [], "exports": [item("plugin"), item("grading")],
            "capabilities": [], "problems": problems, "host": HostAbi::current(),
        }))
        .map(|mut r: CheckReport| {
            // Items parsed as the inspector does, with their package and version.
            for i in r.exports.iter_mut() {
                *i = Item::parse(&i.name);
            }
            r
        })
        .unwrap()
    }

    #[test]
    fn another_release_decides_by_its_own_range() {
        let newer = HostRelease {
            mst: "9.0.0",
            mst_plugin: &["0.1.0", "2.0.0"],
            wasi: "0.2.12",
        };
        let future = report(
            "2.0.0",
            false,
            serde_json::json!([{"severity": "error", "message": "not on this host"}]),
        )
        .for_release(&newer);
        assert!(future.compatible, "{:?}", future.problems);
        assert_eq!(future.host.mst, "9.0.0");
        assert!(
            future
                .problems
                .iter()
                .all(|p| p.severity == Severity::Warning && p.message.contains("statically")),
            "this host's ABI errors are dropped, and the limit of the check is said: {:?}",
            future.problems
        );
        assert!(future
            .render()
            .starts_with("compatible: g.wasm fits mst 9.0.0"));

        // Same ABI as this host: a failure of this host's load (its `info`) still counts.
        let broken_info = report(
            "0.1.0",
            false,
            serde_json::json!([{"severity": "error", "message": "its `info` export failed"}]),
        )
        .for_release(&newer);
        assert!(!broken_info.compatible);
        assert_eq!(broken_info.problems.len(), 1, "{:?}", broken_info.problems);
    }
}
