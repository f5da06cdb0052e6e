//! Importing evals written for other harnesses (`mst import`): each source format converts into
//! mst's files plus a [`Report`] of every change, so nothing is lost silently.
//!
//! One module per source format: [`mst`] (gleanwork/mcp-server-tester, "MST") and
//! [`harbor`] (Harbor's task directories).

pub mod harbor;
pub mod mst;

use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// What happened to one part of the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Change {
    /// Converted to an equivalent: same meaning, new spelling.
    Rewritten,
    /// Converted to something close, with a difference the text names.
    Approximated,
    /// Not converted: mst has no equivalent.
    Dropped,
}

impl Change {
    fn label(self) -> &'static str {
        match self {
            Change::Rewritten => "rewritten",
            Change::Approximated => "approximated",
            Change::Dropped => "dropped",
        }
    }
}

/// One change to one part of a source file.
#[derive(Debug, Clone, Serialize)]
pub struct Note {
    /// The source file, as given.
    pub file: String,
    /// Where in it: a JSON path such as `servers.search.auth` or `cases[tokyo].assertions`.
    pub at: String,
    pub change: Change,
    /// What became of it, or why nothing did.
    pub text: String,
}

/// Everything an import changed, approximated or dropped, and what is left to do by hand.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    pub notes: Vec<Note>,
    /// Steps before the converted eval runs as the original did (set a variable, install a
    /// plugin, name a server).
    pub todo: Vec<String>,
    /// Cases that had checks in the source and have none after conversion (`FILE: ID`): such
    /// a case would pass whatever the client does, so the import exits non-zero.
    pub cases_without_checks: Vec<String>,
}

impl Report {
    /// Records a change to `at` in `file`.
    pub fn note(&mut self, file: &str, at: &str, change: Change, text: impl Into<String>) {
        self.notes.push(Note {
            file: file.to_string(),
            at: at.to_string(),
            change,
            text: text.into(),
        });
    }

    /// Records a step left to the user, once.
    pub fn todo(&mut self, step: impl Into<String>) {
        let step = step.into();
        if !self.todo.contains(&step) {
            self.todo.push(step);
        }
    }

    /// How many notes of kind `change`.
    pub fn count(&self, change: Change) -> usize {
        self.notes.iter().filter(|n| n.change == change).count()
    }

    /// The report as Markdown, for `import-report.md` and the terminal.
    pub fn to_markdown(&self, written: &[PathBuf]) -> String {
        let mut text = String::from("# Import report\n\n## Files written\n\n");
        for file in written {
            text.push_str(&format!("- `{}`\n", file.display()));
        }
        for change in [Change::Rewritten, Change::Approximated, Change::Dropped] {
            let notes: Vec<&Note> = self.notes.iter().filter(|n| n.change == change).collect();
            if notes.is_empty() {
                continue;
            }
            text.push_str(&format!("\n## {} ({})\n\n", change.label(), notes.len()));
            for note in notes {
                text.push_str(&format!("- {} `{}`: {}\n", note.file, note.at, note.text));
            }
        }
        if !self.todo.is_empty() {
            text.push_str("\n## To do before running\n\n");
            for step in &self.todo {
                text.push_str(&format!("- {step}\n"));
            }
        }
        if !self.cases_without_checks.is_empty() {
            text.push_str("\n## Cases left without checks\n\n");
            for case in &self.cases_without_checks {
                text.push_str(&format!("- {case}\n"));
            }
        }
        text
    }
}

/// The result of converting: files to write (names relative to the output directory, and
/// their text) and the report.
#[derive(Debug, Default)]
pub struct Imported {
    pub files: Vec<(String, String)>,
    /// Directories copied whole (a source directory, and its name in the output directory),
    /// each checked as a workspace is: no link out, no device.
    pub copies: Vec<(PathBuf, String)>,
    pub report: Report,
}

/// The report's own file in the output directory.
pub const REPORT_FILE: &str = "import-report.md";

impl Imported {
    /// Adds a file, renaming it (`name-2.ext`, …) when an earlier one took the name; returns
    /// the name used.
    pub fn add_file(&mut self, name: &str, text: String) -> String {
        let (stem, ext) = match name.rsplit_once('.') {
            Some((stem, ext)) => (stem.to_string(), format!(".{ext}")),
            None => (name.to_string(), String::new()),
        };
        let mut chosen = name.to_string();
        let mut n = 2;
        while chosen == REPORT_FILE || self.files.iter().any(|(f, _)| *f == chosen) {
            chosen = format!("{stem}-{n}{ext}");
            n += 1;
        }
        self.files.push((chosen.clone(), text));
        chosen
    }

    /// Writes every file and the report into `out` (created if missing). Nothing is written
    /// when a file is already there, unless `force`: an import never overwrites silently.
    pub fn write(&self, out: &Path, force: bool) -> Result<Vec<PathBuf>> {
        let mut paths: Vec<PathBuf> = (self.files.iter().map(|(f, _)| f))
            .chain(self.copies.iter().map(|(_, to)| to))
            .map(|f| out.join(f))
            .collect();
        paths.push(out.join(REPORT_FILE));
        let taken: Vec<String> = paths
            .iter()
            .filter(|p| p.exists())
            .map(|p| p.display().to_string())
            .collect();
        if !taken.is_empty() && !force {
            bail!(
                "{} already exist{}: choose another --out directory, or pass --force to overwrite",
                taken.join(", "),
                if taken.len() == 1 { "s" } else { "" }
            );
        }
        // Every copy is packed (and so checked) before anything is written.
        let scratch = tempfile::tempdir()?;
        let mut archives = Vec::new();
        for (from, to) in &self.copies {
            let packed =
                crate::workspace::pack(crate::workspace::Source::Dir(from), scratch.path())
                    .with_context(|| format!("cannot copy {}", from.display()))?;
            let archive = scratch
                .path()
                .join(crate::workspace::archive_name(&packed.digest));
            archives.push((archive, out.join(to)));
        }
        std::fs::create_dir_all(out)
            .with_context(|| format!("cannot create the output directory {}", out.display()))?;
        for ((_, text), path) in self.files.iter().zip(&paths) {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, text)
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
        for (archive, to) in archives {
            std::fs::create_dir_all(&to)?;
            crate::workspace::unpack(&archive, &to)?;
        }
        let report = self.report.to_markdown(&paths);
        let report_path = out.join(REPORT_FILE);
        std::fs::write(&report_path, report)
            .with_context(|| format!("cannot write {}", report_path.display()))?;
        Ok(paths)
    }
}
