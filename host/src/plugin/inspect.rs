//! The static ABI check: read a component's imports and exports without compiling or running
//! it, and decide whether this host can load it.
//!
//! Compatibility follows semver on the WIT package version (docs/plugins.md, "Versioning
//! policy"). Each mst release loads `mst:plugin` up to a newest version on each track it keeps
//! bindings for; a plugin built against `V` fits when `V` is on one of those tracks (same major,
//! or same minor while the major is 0) and not newer than the release's newest on it. WASI 0.2
//! interfaces are provided up to the release's WASI version. [`RELEASES`] records this for every
//! shipped mst, so `mst plugin check --host-version` can answer for another release.
use semver::Version;
use serde::Serialize;
use std::borrow::Cow;
use std::fmt;
use wasmparser::{Encoding, Parser, Payload};

/// The role a component plays, derived from its exports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// Exports `mst:plugin/grading`.
    Grader,
    /// Exports `mst:plugin/pairwise`.
    PairwiseGrader,
    /// Exports `mst:plugin/datasets`.
    Dataset,
    /// Exports `mst:plugin/machines`.
    Runner,
}

impl Kind {
    /// The exported interface that makes a component this kind.
    pub fn interface(self) -> &'static str {
        match self {
            Kind::Grader => "grading",
            Kind::PairwiseGrader => "pairwise",
            Kind::Dataset => "datasets",
            Kind::Runner => "machines",
        }
    }

    fn from_interface(interface: &str) -> Option<Self> {
        [
            Kind::Grader,
            Kind::PairwiseGrader,
            Kind::Dataset,
            Kind::Runner,
        ]
        .into_iter()
        .find(|k| k.interface() == interface)
    }

    /// The kind's name as the CLI and JSON output spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Grader => "grader",
            Kind::PairwiseGrader => "pairwise-grader",
            Kind::Dataset => "dataset",
            Kind::Runner => "runner",
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why bytes could not be read as a component at all (`mst plugin check` exit code 2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unreadable {
    /// The bytes do not start with the WebAssembly magic number.
    NotWasm,
    /// A core WebAssembly module, not a component.
    CoreModule,
    /// The binary is malformed.
    Malformed(String),
}

impl fmt::Display for Unreadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unreadable::NotWasm => f.write_str("not a WebAssembly file (no `\\0asm` header)"),
            Unreadable::CoreModule => f.write_str(
                "a core WebAssembly module, not a component: build for the wasm32-wasip2 target \
                 (or wrap the module with `wasm-tools component new`)",
            ),
            Unreadable::Malformed(why) => write!(f, "malformed component: {why}"),
        }
    }
}

impl std::error::Error for Unreadable {}

/// A top-level import or export of a component, with its name taken apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Item {
    /// The name as the component spells it, e.g. `mst:plugin/grading@0.1.0`.
    pub name: String,
    /// `mst:plugin` for `mst:plugin/grading@0.1.0`; absent for a plain name.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub package: Option<String>,
    /// `grading` for `mst:plugin/grading@0.1.0`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub interface: Option<String>,
    /// The package version, when the name has one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<Version>,
}

impl Item {
    /// Parses `namespace:package/interface@version`; anything else is a plain name.
    pub fn parse(name: &str) -> Self {
        let (path, version) = match name.split_once('@') {
            Some((path, v)) => (path, Version::parse(v).ok()),
            None => (name, None),
        };
        let (package, interface) = match path.split_once('/') {
            Some((pkg, iface)) if pkg.contains(':') => {
                (Some(pkg.to_string()), Some(iface.to_string()))
            }
            _ => (None, None),
        };
        Item {
            name: name.to_string(),
            package,
            interface,
            version,
        }
    }
}

/// What a component imports and exports at its top level.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Surface {
    /// Imports, in the order the component declares them.
    pub imports: Vec<Item>,
    /// Exports, in the order the component declares them.
    pub exports: Vec<Item>,
}

/// How serious a finding is: errors make a plugin incompatible.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// The host cannot load or use the plugin.
    Error,
    /// The plugin loads, but something is likely wrong.
    Warning,
}

/// One finding of the check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Problem {
    pub severity: Severity,
    pub message: String,
}

impl Problem {
    pub(crate) fn error(message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Error,
            message: message.into(),
        }
    }
    pub(crate) fn warning(message: impl Into<String>) -> Self {
        Problem {
            severity: Severity::Warning,
            message: message.into(),
        }
    }
}

/// The verdict of the static check.
#[derive(Debug, Clone, Serialize)]
pub struct Assessment {
    /// The kind the exports name, even when their version is incompatible.
    pub kind: Option<Kind>,
    pub problems: Vec<Problem>,
}

impl Assessment {
    /// No error-level problem.
    pub fn compatible(&self) -> bool {
        self.problems.iter().all(|p| p.severity != Severity::Error)
    }
}

/// One shipped mst release and the plugin ABI it loads: a row of [`RELEASES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostRelease {
    /// The mst version.
    pub mst: &'static str,
    /// The newest `mst:plugin` version on each track the release has bindings for, oldest
    /// track first. It loads a plugin built against any version on one of these tracks that
    /// is not newer than the one listed.
    pub mst_plugin: &'static [&'static str],
    /// The newest WASI 0.2 release it provides.
    pub wasi: &'static str,
}

/// Every shipped mst release, oldest first; the last row is this build. The single source of
/// the host's ABI range: [`super::ABI_VERSION`] and [`super::WASI_VERSION`] are read from it.
/// A release that moves `mst:plugin` to a new version adds a row (and, for a new track, keeps
/// the old track listed while its bindings stay: see `bindings`).
pub const RELEASES: &[HostRelease] = &[HostRelease {
    mst: "0.1.0",
    mst_plugin: &["0.1.0"],
    wasi: "0.2.12",
}];

/// This build's row of [`RELEASES`].
pub const CURRENT: HostRelease = RELEASES[RELEASES.len() - 1];

impl HostRelease {
    /// The newest `mst:plugin` version this release loads.
    pub const fn newest_abi(&self) -> &'static str {
        self.mst_plugin[self.mst_plugin.len() - 1]
    }

    /// The row for mst `version`, or an error listing the releases this binary knows.
    pub fn find(version: &str) -> Result<&'static HostRelease, String> {
        let wanted = version.strip_prefix('v').unwrap_or(version);
        RELEASES.iter().find(|r| r.mst == wanted).ok_or_else(|| {
            let known: Vec<&str> = RELEASES.iter().map(|r| r.mst).collect();
            format!(
                "--host-version {version}: this mst ({}) knows the plugin ABI of mst {} only; \
                 check with that mst's own binary, or use a newer mst",
                CURRENT.mst,
                known.join(", ")
            )
        })
    }

    /// The `mst:plugin` versions it accepts, one semver range per track, e.g.
    /// `>=0.1.0, <=0.1.3`.
    pub fn mst_plugin_ranges(&self) -> Vec<String> {
        self.mst_plugin
            .iter()
            .map(|newest| {
                let v = Version::parse(newest).expect("RELEASES holds semver");
                let first = match v.major {
                    0 => Version::new(0, v.minor, 0),
                    major => Version::new(major, 0, 0),
                };
                format!(">={first}, <={v}")
            })
            .collect()
    }

    fn abi_versions(&self) -> Vec<Version> {
        self.mst_plugin
            .iter()
            .map(|v| Version::parse(v).expect("RELEASES holds semver"))
            .collect()
    }

    /// How messages name the host: this build, or another release asked about.
    fn who(&self) -> Cow<'static, str> {
        if *self == CURRENT {
            Cow::Borrowed("this host")
        } else {
            Cow::Owned(format!("mst {}", self.mst))
        }
    }
}

/// Interfaces of `mst:plugin` that the host provides to plugins.
const HOST_INTERFACES: &[&str] = &["types", "log", "exec", "secrets", "http", "model"];
/// Interfaces of `mst:plugin` that the host knows how to call.
const PLUGIN_INTERFACES: &[&str] = &[
    "types", "plugin", "grading", "pairwise", "datasets", "machines",
];
/// WASI packages the host provides (through wasmtime-wasi, deny-by-default).
const WASI_PACKAGES: &[&str] = &[
    "wasi:cli",
    "wasi:clocks",
    "wasi:filesystem",
    "wasi:io",
    "wasi:random",
    "wasi:sockets",
];

/// Reads the top-level imports and exports of `bytes` without compiling it.
pub fn inspect(bytes: &[u8]) -> Result<Surface, Unreadable> {
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err(Unreadable::NotWasm);
    }
    let mut surface = Surface::default();
    let mut depth = 0usize;
    for payload in Parser::new(0).parse_all(bytes) {
        let payload = payload.map_err(|e| Unreadable::Malformed(e.to_string()))?;
        match payload {
            Payload::Version { encoding, .. } => {
                if depth == 0 && encoding == Encoding::Module {
                    return Err(Unreadable::CoreModule);
                }
                depth += 1;
            }
            Payload::End(_) => depth = depth.saturating_sub(1),
            Payload::ComponentImportSection(reader) if depth == 1 => {
                for import in reader {
                    let import = import.map_err(|e| Unreadable::Malformed(e.to_string()))?;
                    surface.imports.push(Item::parse(import.name.0));
                }
            }
            Payload::ComponentExportSection(reader) if depth == 1 => {
                for export in reader {
                    let export = export.map_err(|e| Unreadable::Malformed(e.to_string()))?;
                    surface.exports.push(Item::parse(export.name.0));
                }
            }
            _ => {}
        }
    }
    Ok(surface)
}

/// Whether a plugin built against `plugin` fits a host implementing `host`.
pub fn version_fits(plugin: &Version, host: &Version) -> bool {
    let same_track = if host.major == 0 {
        plugin.major == 0 && plugin.minor == host.minor
    } else {
        plugin.major == host.major
    };
    same_track && plugin <= host
}

fn track(version: &Version) -> String {
    if version.major == 0 {
        format!("0.{}.x", version.minor)
    } else {
        format!("{}.x", version.major)
    }
}

/// `0.1.x up to 0.1.3, 0.2.x up to 0.2.0`.
fn supported(hosts: &[Version]) -> String {
    hosts
        .iter()
        .map(|h| format!("{} up to {h}", track(h)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks one versioned item against the versions `who` has for its package (newest per
/// track).
fn check_version(
    item: &Item,
    hosts: &[Version],
    who: &str,
    what: &str,
    problems: &mut Vec<Problem>,
) {
    let package = item.package.as_deref().unwrap_or_default();
    let newest = hosts.last().expect("a release supports some version");
    match &item.version {
        None => problems.push(Problem::error(format!(
            "{what} `{}` without a package version; {who} needs {package}@{} (build with the WIT \
             package from that mst release)",
            item.name,
            track(newest)
        ))),
        Some(v) if !hosts.iter().any(|h| version_fits(v, h)) => {
            problems.push(Problem::error(format!(
                "{what} `{}`, but {who} supports {package}@{}; rebuild the plugin against \
                 {package}@{newest}{}",
                item.name,
                supported(hosts),
                if v > newest { " or upgrade mst" } else { "" }
            )))
        }
        Some(_) => {}
    }
}

impl Surface {
    /// Decides whether this host can load this component, and what kind it is.
    pub fn assess(&self) -> Assessment {
        self.assess_for(&CURRENT)
    }

    /// Decides whether mst `release` can load this component, and what kind it is.
    pub fn assess_for(&self, release: &HostRelease) -> Assessment {
        let abis = release.abi_versions();
        let abi = abis
            .last()
            .expect("a release supports some version")
            .clone();
        let wasi = [Version::parse(release.wasi).expect("RELEASES holds semver")];
        let who = release.who();
        let mut problems = Vec::new();

        for item in &self.imports {
            match (item.package.as_deref(), item.interface.as_deref()) {
                (Some("mst:plugin"), Some(iface)) if HOST_INTERFACES.contains(&iface) => {
                    check_version(item, &abis, &who, "imports", &mut problems)
                }
                (Some(pkg), Some(_)) if WASI_PACKAGES.contains(&pkg) => {
                    check_version(item, &wasi, &who, "imports", &mut problems)
                }
                _ => problems.push(Problem::error(format!(
                    "imports `{}`, which {who} does not provide (it provides mst:plugin/{{{}}}@{} \
                     and WASI {})",
                    item.name,
                    HOST_INTERFACES.join(","),
                    track(&abi),
                    track(&wasi[0])
                ))),
            }
        }

        let mut kinds = Vec::new();
        let mut has_plugin_export = false;
        for item in &self.exports {
            match (item.package.as_deref(), item.interface.as_deref()) {
                (Some("mst:plugin"), Some(iface)) if PLUGIN_INTERFACES.contains(&iface) => {
                    check_version(item, &abis, &who, "exports", &mut problems);
                    has_plugin_export |= iface == "plugin";
                    kinds.extend(Kind::from_interface(iface));
                }
                _ => problems.push(Problem::warning(format!(
                    "exports `{}`, which the host ignores",
                    item.name
                ))),
            }
        }

        let kind = match kinds.as_slice() {
            [] => {
                problems.push(Problem::error(format!(
                    "exports none of the plugin worlds (grader, pairwise-grader, dataset, runner): \
                     it must export one of mst:plugin/{{grading,pairwise,datasets,machines}}@{}",
                    track(&abi)
                )));
                None
            }
            [kind] => Some(*kind),
            many => {
                let names: Vec<&str> = many.iter().map(|k| k.as_str()).collect();
                problems.push(Problem::error(format!(
                    "exports several plugin worlds ({}); a component implements exactly one",
                    names.join(", ")
                )));
                None
            }
        };
        if kind.is_some() && !has_plugin_export {
            problems.push(Problem::error(format!(
                "does not export mst:plugin/plugin@{}, so the host cannot read its name and version",
                track(&abi)
            )));
        }
        Assessment { kind, problems }
    }

    /// Whether the component imports `mst:plugin/<interface>`.
    pub fn imports_host_interface(&self, interface: &str) -> bool {
        self.imports.iter().any(|i| {
            i.package.as_deref() == Some("mst:plugin") && i.interface.as_deref() == Some(interface)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn surface(imports: &[&str], exports: &[&str]) -> Surface {
        Surface {
            imports: imports.iter().map(|n| Item::parse(n)).collect(),
            exports: exports.iter().map(|n| Item::parse(n)).collect(),
        }
    }

    #[test]
    fn parses_interface_names() {
        let item = Item::parse("mst:plugin/grading@0.1.0");
        assert_eq!(item.package.as_deref(), Some("mst:plugin"));
        assert_eq!(item.interface.as_deref(), Some("grading"));
        assert_eq!(item.version, Some(Version::new(0, 1, 0)));
        let plain = Item::parse("run");
        assert_eq!(
            (plain.package, plain.interface, plain.version),
            (None, None, None)
        );
    }

    #[test]
    fn semver_tracks() {
        let host = Version::new(0, 1, 3);
        assert!(version_fits(&Version::new(0, 1, 0), &host));
        assert!(version_fits(&Version::new(0, 1, 3), &host));
        assert!(
            !version_fits(&Version::new(0, 1, 4), &host),
            "newer patch than host"
        );
        assert!(
            !version_fits(&Version::new(0, 2, 0), &host),
            "0.x minor is a major"
        );
        let host = Version::new(1, 4, 0);
        assert!(version_fits(&Version::new(1, 0, 0), &host));
        assert!(!version_fits(&Version::new(1, 5, 0), &host));
        assert!(!version_fits(&Version::new(2, 0, 0), &host));
    }

    #[test]
    fn a_grader_is_compatible() {
        let a = surface(
            &[
                "wasi:cli/environment@0.2.3",
                "mst:plugin/types@0.1.0",
                "mst:plugin/log@0.1.0",
            ],
            &["mst:plugin/plugin@0.1.0", "mst:plugin/grading@0.1.0"],
        );
        let verdict = a.assess();
        assert_eq!(verdict.kind, Some(Kind::Grader));
        assert!(verdict.compatible(), "{:?}", verdict.problems);
    }

    #[test]
    fn future_major_is_refused_with_versions() {
        let verdict = surface(
            &[],
            &["mst:plugin/plugin@2.0.0", "mst:plugin/grading@2.0.0"],
        )
        .assess();
        assert_eq!(verdict.kind, Some(Kind::Grader));
        assert!(!verdict.compatible());
        assert!(
            verdict
                .problems
                .iter()
                .any(|p| p.message.contains("mst:plugin/grading@2.0.0")
                    && p.message.contains("0.1.x")),
            "{:?}",
            verdict.problems
        );
    }

    #[test]
    fn unknown_imports_and_worlds_are_refused() {
        let verdict = surface(&["acme:net/raw@1.0.0"], &["acme:widgets/frob@1.0.0"]).assess();
        assert_eq!(verdict.kind, None);
        let text: Vec<&str> = verdict
            .problems
            .iter()
            .map(|p| p.message.as_str())
            .collect();
        assert!(text
            .iter()
            .any(|m| m.contains("acme:net/raw") && m.contains("does not provide")));
        assert!(text.iter().any(|m| m.contains("none of the plugin worlds")));
    }

    #[test]
    fn newer_wasi_than_host_is_refused() {
        let verdict = surface(
            &["wasi:cli/environment@0.2.99"],
            &["mst:plugin/plugin@0.1.0", "mst:plugin/grading@0.1.0"],
        )
        .assess();
        assert!(!verdict.compatible());
    }

    #[test]
    fn two_worlds_are_refused() {
        let verdict = surface(
            &[],
            &[
                "mst:plugin/plugin@0.1.0",
                "mst:plugin/grading@0.1.0",
                "mst:plugin/datasets@0.1.0",
            ],
        )
        .assess();
        assert_eq!(verdict.kind, None);
        assert!(!verdict.compatible());
    }

    #[test]
    fn not_wasm_and_core_modules_are_unreadable() {
        assert_eq!(inspect(b"hello, world").unwrap_err(), Unreadable::NotWasm);
        // The smallest valid core module: magic and version 1.
        assert_eq!(
            inspect(b"\0asm\x01\0\0\0").unwrap_err(),
            Unreadable::CoreModule
        );
        assert!(matches!(
            inspect(b"\0asm\x0d\0\x01\0\xff").unwrap_err(),
            Unreadable::Malformed(_)
        ));
    }

    #[test]
    fn the_release_table_is_this_build_and_the_live_wit() {
        assert_eq!(CURRENT.mst, env!("CARGO_PKG_VERSION"), "add a RELEASES row");
        let wit = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/types.wit"))
            .unwrap();
        assert!(
            wit.contains(&format!(
                "package mst:plugin@{};",
                super::super::ABI_VERSION
            )),
            "the bindings are generated from wit/, so its version is the host's newest ABI"
        );
        assert_eq!(CURRENT.mst_plugin_ranges(), [">=0.1.0, <=0.1.0"]);
        // What shipped is frozen, so `cargo xtask lint` keeps the live WIT compatible with it.
        // (This build's own newest version may still be in the making.)
        let released = concat!(env!("CARGO_MANIFEST_DIR"), "/../wit/released");
        for release in &RELEASES[..RELEASES.len() - 1] {
            for abi in release.mst_plugin {
                let frozen = std::path::Path::new(released).join(abi);
                assert!(
                    frozen.is_dir(),
                    "mst {} shipped {abi}: freeze it",
                    release.mst
                );
            }
        }
        for abi in &CURRENT.mst_plugin[..CURRENT.mst_plugin.len() - 1] {
            assert!(std::path::Path::new(released).join(abi).is_dir(), "{abi}");
        }
        assert!(std::path::Path::new(released).join("0.1.0").is_dir());
    }

    /// A release that kept the 0.1 bindings when it moved to 0.2 loads both tracks.
    #[test]
    fn a_release_with_two_tracks_loads_both_and_says_so() {
        let release = HostRelease {
            mst: "9.0.0",
            mst_plugin: &["0.1.3", "0.2.0"],
            wasi: "0.2.12",
        };
        assert_eq!(
            release.mst_plugin_ranges(),
            [">=0.1.0, <=0.1.3", ">=0.2.0, <=0.2.0"]
        );
        for fits in ["0.1.0", "0.1.3", "0.2.0"] {
            let grader = surface(
                &[],
                &[
                    &format!("mst:plugin/plugin@{fits}"),
                    &format!("mst:plugin/grading@{fits}"),
                ],
            );
            assert!(grader.assess_for(&release).compatible(), "{fits}");
        }
        let verdict = surface(
            &[],
            &["mst:plugin/plugin@0.3.0", "mst:plugin/grading@0.3.0"],
        )
        .assess_for(&release);
        assert!(!verdict.compatible());
        assert!(
            verdict.problems.iter().any(|p| p
                .message
                .contains("mst 9.0.0 supports mst:plugin@0.1.x up to 0.1.3, 0.2.x up to 0.2.0")),
            "{:?}",
            verdict.problems
        );
    }

    #[test]
    fn an_unknown_release_lists_the_known_ones() {
        assert_eq!(HostRelease::find("v0.1.0"), Ok(&RELEASES[0]));
        let err = HostRelease::find("0.0.9").unwrap_err();
        assert!(err.contains("0.0.9") && err.contains("mst 0.1.0"), "{err}");
    }
}
