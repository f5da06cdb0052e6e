//! The WIT semver policy check `cargo xtask lint` runs (docs/plugins.md, "Versioning policy").
//!
//! Every released version of the `mst:plugin` package is kept frozen in `wit/released/<version>/`.
//! The live package in `wit/` must stay loadable by plugins built against each released version
//! on its compatibility track (0.1.x, or 1.x from 1.0): the component tooling's own
//! `wit_component::semver_check` decides, world by world, whether a component of the released
//! world's shape still fits the live world. A released version that is also the live version
//! must not change at all: an addition needs a new version, so that a plugin which uses it says
//! so and an older host refuses it cleanly instead of failing to link.

use anyhow::{bail, Context, Result};
use semver::Version;
use std::path::{Path, PathBuf};
use wit_parser::{PackageId, Resolve, UnresolvedPackageGroup, WorldId};

/// The directory below the live WIT that holds one frozen copy per released version.
pub const RELEASED_DIR: &str = "released";

/// The compatibility track of `version`: `0.1.x` for 0.1.*, `1.x` for 1.*.
fn track(version: &Version) -> (u64, u64) {
    if version.major == 0 {
        (0, version.minor)
    } else {
        (version.major, 0)
    }
}

fn track_name(version: &Version) -> String {
    match track(version) {
        (0, minor) => format!("0.{minor}.x"),
        (major, _) => format!("{major}.x"),
    }
}

/// Parses the WIT package in `dir`.
fn parse(dir: &Path) -> Result<UnresolvedPackageGroup> {
    UnresolvedPackageGroup::parse_dir(dir)
        .with_context(|| format!("cannot parse the WIT package in {}", dir.display()))
}

/// The package's version, which the policy needs.
fn version_of(group: &UnresolvedPackageGroup, dir: &Path) -> Result<Version> {
    group.main.name.version.clone().with_context(|| {
        format!(
            "the WIT package {} in {} has no version: write `package {}@X.Y.Z;`",
            group.main.name,
            dir.display(),
            group.main.name
        )
    })
}

/// The version an addition to `version` needs: the next one on its track.
fn next_on_track(version: &Version) -> Version {
    match version.major {
        0 => Version::new(0, version.minor, version.patch + 1),
        major => Version::new(major, version.minor + 1, 0),
    }
}

/// The first version of the track after `version`'s.
fn next_track(version: &Version) -> Version {
    match version.major {
        0 => Version::new(0, version.minor + 1, 0),
        major => Version::new(major + 1, 0, 0),
    }
}

/// Whether a component shaped like world `prev` (called `world`) still fits where world `new`
/// is expected; the error is the validator's finding, which names the interface and the item.
fn fits(resolve: &Resolve, world: &str, prev: WorldId, new: WorldId) -> Result<(), String> {
    // `semver_check` takes the resolve by value because it erases versions in it.
    wit_component::semver_check(resolve.clone(), prev, new).map_err(|e| {
        let text = format!("{:#}", e).replace('\n', " ");
        // Drop what is the same for every finding: the check's own preamble, the synthetic
        // import of the whole world, and the offset into a component that exists only here.
        let text = text
            .replace(
                "new world is not semver-compatible with the previous world: ",
                "",
            )
            .replace(&format!("type mismatch for import `{world}` "), "");
        match text.rfind(" (at offset 0x") {
            Some(at) if text.ends_with(')') => text[..at].to_string(),
            _ => text,
        }
    })
}

/// Adds `finding` for `world`, or the world to an identical finding already made.
fn note(found: &mut Vec<(Vec<String>, String)>, world: &str, finding: String) {
    match found.iter_mut().find(|(_, f)| *f == finding) {
        Some((worlds, _)) => worlds.push(world.to_string()),
        None => found.push((vec![world.to_string()], finding)),
    }
}

/// One released version and the live one, loaded side by side.
struct Pair {
    resolve: Resolve,
    released: PackageId,
    live: PackageId,
}

impl Pair {
    fn load(released_dir: &Path, live_dir: &Path) -> Result<Self> {
        let mut released = parse(released_dir)?;
        let live = parse(live_dir)?;
        // One `Resolve` refuses two packages of the same name and version, which the live and
        // the released package are until the live one moves on. `semver_check` ignores versions,
        // so tagging the frozen copy changes nothing it compares.
        if let Some(version) = released.main.name.version.as_mut() {
            version.pre = semver::Prerelease::new("released").expect("a valid pre-release tag");
        }
        let mut resolve = Resolve::default();
        let released = resolve
            .push_group(released)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("cannot resolve {}", released_dir.display()))?;
        let live = resolve
            .push_group(live)
            .map_err(|e| anyhow::anyhow!("{e}"))
            .with_context(|| format!("cannot resolve {}", live_dir.display()))?;
        Ok(Pair {
            resolve,
            released,
            live,
        })
    }

    /// The problems found comparing the two, each naming the worlds and what broke.
    fn problems(&self, released: &Version, live: &Version) -> Vec<String> {
        let old = &self.resolve.packages[self.released];
        let new = &self.resolve.packages[self.live];
        let same_version = released == live;
        let mut found = Vec::new();
        for (name, &prev) in &old.worlds {
            let Some(&next) = new.worlds.get(name) else {
                note(
                    &mut found,
                    name,
                    format!(
                        "gone from the live WIT: plugins built for mst:plugin@{released} would \
                         no longer load (a removal needs a new track, {})",
                        next_track(released)
                    ),
                );
                continue;
            };
            if let Err(why) = fits(&self.resolve, name, prev, next) {
                note(
                    &mut found,
                    name,
                    format!(
                        "the live WIT (@{live}) breaks plugins built against the released \
                         @{released}: {why}; restore the item, or move to a new track ({}) and \
                         keep bindings for @{released} (docs/plugins.md, \"Versioning policy\")",
                        next_track(released)
                    ),
                );
            } else if same_version && fits(&self.resolve, name, next, prev).is_err() {
                note(
                    &mut found,
                    name,
                    format!(
                        "the live WIT adds to mst:plugin@{released}, which is released and \
                         frozen: bump the package version in wit/*.wit to {} (and add it to the \
                         host's RELEASES table) so plugins using the addition say they need it",
                        next_on_track(released)
                    ),
                );
            }
        }
        if same_version {
            for name in new.worlds.keys().filter(|n| !old.worlds.contains_key(*n)) {
                note(
                    &mut found,
                    name,
                    format!(
                        "new in mst:plugin@{released}, which is released and frozen: bump the \
                         package version in wit/*.wit to {}",
                        next_on_track(released)
                    ),
                );
            }
        }
        found
            .into_iter()
            .map(|(worlds, finding)| {
                let worlds: Vec<String> = worlds.iter().map(|w| format!("`{w}`")).collect();
                let label = if worlds.len() == 1 { "world" } else { "worlds" };
                format!("{label} {}: {finding}", worlds.join(", "))
            })
            .collect()
    }
}

/// The released versions kept below `wit/released/`, oldest first.
fn released_dirs(wit: &Path) -> Result<Vec<(Version, PathBuf)>> {
    let dir = wit.join(RELEASED_DIR);
    let mut versions = Vec::new();
    for entry in
        std::fs::read_dir(&dir).with_context(|| format!("cannot list {}", dir.display()))?
    {
        let path = entry?.path();
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let version = Version::parse(&name).with_context(|| {
            format!(
                "{} is not named after a released version (e.g. 0.1.0)",
                path.display()
            )
        })?;
        versions.push((version, path));
    }
    versions.sort();
    if versions.is_empty() {
        bail!(
            "{} holds no released WIT: keep a copy of each released version there",
            dir.display()
        );
    }
    Ok(versions)
}

/// Checks the live WIT package in `wit` against every released version below
/// `wit/released/`, and returns one line per comparison made; fails naming every problem.
pub fn check(wit: &Path) -> Result<Vec<String>> {
    let live_group = parse(wit)?;
    let live = version_of(&live_group, wit)?;
    let live_name = live_group.main.name.clone();
    let mut done = Vec::new();
    let mut problems = Vec::new();
    for (released, dir) in released_dirs(wit)? {
        let group = parse(&dir)?;
        let stated = version_of(&group, &dir)?;
        if stated != released || group.main.name.namespace != live_name.namespace {
            problems.push(format!(
                "{} holds {}, not {}:{}@{released}",
                dir.display(),
                group.main.name,
                live_name.namespace,
                live_name.name
            ));
            continue;
        }
        if track(&released) != track(&live) {
            if track(&released) > track(&live) {
                problems.push(format!(
                    "the live WIT is @{live}, older than the released @{released}"
                ));
            } else {
                // A new major may change anything; the host keeps the old one's bindings.
                done.push(format!(
                    "@{released}: another track than the live @{live}, not compared"
                ));
            }
            continue;
        }
        if live < released {
            problems.push(format!(
                "the live WIT is @{live}, older than the released @{released} on the same \
                 track {}",
                track_name(&live)
            ));
            continue;
        }
        let found = Pair::load(&dir, wit)?.problems(&released, &live);
        if found.is_empty() {
            done.push(format!(
                "@{released} -> live @{live}: compatible ({})",
                track_name(&live)
            ));
        }
        problems.extend(found);
    }
    if !problems.is_empty() {
        bail!(
            "the WIT in {} breaks the versioning policy:\n  - {}",
            wit.display(),
            problems.join("\n  - ")
        );
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The repository's WIT, copied to a temporary directory with only the live files editable.
    fn copy_of_repo_wit() -> tempfile::TempDir {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
        let tmp = tempfile::tempdir().unwrap();
        copy_dir(&repo, tmp.path());
        tmp
    }

    fn copy_dir(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            let dest = to.join(path.file_name().unwrap());
            if path.is_dir() {
                copy_dir(&path, &dest);
            } else {
                std::fs::copy(&path, &dest).unwrap();
            }
        }
    }

    /// Replaces `from` with `to` in the live `file`, which must contain it.
    fn edit(wit: &Path, file: &str, from: &str, to: &str) {
        let path = wit.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{file} has no `{from}`");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    }

    /// Sets the live package version in every live file.
    fn bump(wit: &Path, to: &str) {
        for entry in std::fs::read_dir(wit).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "wit") {
                let text = std::fs::read_to_string(&path).unwrap();
                std::fs::write(
                    &path,
                    text.replace("mst:plugin@0.1.0", &format!("mst:plugin@{to}")),
                )
                .unwrap();
            }
        }
    }

    fn error(wit: &Path) -> String {
        format!("{:#}", check(wit).expect_err("the check must fail"))
    }

    #[test]
    fn the_repository_wit_keeps_the_policy() {
        let wit = Path::new(env!("CARGO_MANIFEST_DIR")).join("../wit");
        let done = check(&wit).unwrap();
        assert!(done.iter().any(|l| l.starts_with("@0.1.0")), "{done:?}");
    }

    #[test]
    fn an_addition_passes_with_a_version_bump() {
        let tmp = copy_of_repo_wit();
        edit(
            tmp.path(),
            "host.wit",
            "    log: func(level: level, message: string);",
            "    log: func(level: level, message: string);\n    flush: func();",
        );
        let unbumped = error(tmp.path());
        assert!(
            unbumped.contains("adds to mst:plugin@0.1.0") && unbumped.contains("to 0.1.1"),
            "{unbumped}"
        );
        bump(tmp.path(), "0.1.1");
        check(tmp.path()).unwrap();
    }

    #[test]
    fn a_removed_function_fails_naming_it() {
        let tmp = copy_of_repo_wit();
        edit(
            tmp.path(),
            "host.wit",
            "    log: func(level: level, message: string);",
            "",
        );
        bump(tmp.path(), "0.1.1");
        let err = error(tmp.path());
        assert!(err.contains("breaks plugins built against"), "{err}");
        assert!(
            err.contains("missing expected export `log`"),
            "names the removed function: {err}"
        );
        assert!(
            err.contains("worlds `dataset`, `grader`, `pairwise-grader`, `runner`: "),
            "one finding for every world it breaks: {err}"
        );
        assert!(err.contains("new track (0.2.0)"), "{err}");
    }

    #[test]
    fn a_new_enum_case_fails_naming_it() {
        let tmp = copy_of_repo_wit();
        edit(
            tmp.path(),
            "host.wit",
            "enum level { trace, debug, info, warn, error }",
            "enum level { trace, debug, info, warn, error, fatal }",
        );
        bump(tmp.path(), "0.1.1");
        let err = error(tmp.path());
        assert!(err.contains("breaks plugins built against"), "{err}");
        assert!(err.contains("level"), "names the enum: {err}");
    }

    #[test]
    fn a_changed_record_fails_naming_it() {
        let tmp = copy_of_repo_wit();
        edit(
            tmp.path(),
            "host.wit",
            "        status: s32,",
            "        status: s32,\n        signal: option<u8>,",
        );
        bump(tmp.path(), "0.1.1");
        let err = error(tmp.path());
        assert!(err.contains("breaks plugins built against"), "{err}");
        assert!(
            err.contains("mst:plugin/exec") && err.contains("exec-output"),
            "names the interface and the record: {err}"
        );
    }

    #[test]
    fn a_removed_world_fails_naming_it() {
        let tmp = copy_of_repo_wit();
        let path = tmp.path().join("dataset.wit");
        let text = std::fs::read_to_string(&path).unwrap();
        let world = text
            .find("world dataset {")
            .expect("dataset.wit has its world");
        std::fs::write(&path, &text[..world]).unwrap();
        bump(tmp.path(), "0.1.1");
        let err = error(tmp.path());
        assert!(
            err.contains("world `dataset`: gone from the live WIT"),
            "{err}"
        );
    }

    #[test]
    fn a_new_major_track_is_not_compared() {
        let tmp = copy_of_repo_wit();
        edit(
            tmp.path(),
            "host.wit",
            "    log: func(level: level, message: string);",
            "",
        );
        bump(tmp.path(), "0.2.0");
        let done = check(tmp.path()).unwrap();
        assert!(done[0].contains("not compared"), "{done:?}");
    }
}
