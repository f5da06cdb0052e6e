//! Datasets: turn the config's `datasets` entries into one list of cases with unique ids.
//!
//! Built in: a `.jsonl` file (one case per line), a `.json` file (an array of cases), and a
//! directory (every `*.json` file in it, each one case or an array, in name order). Any other
//! `type` names a dataset plugin, which receives the entry as its options and the named file's
//! bytes as content.

use super::config::{located, mst_format_error, DatasetRef};
use super::trial::CaseRecord;
use crate::plugin::set::PluginSet;
use crate::plugin::Kind;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The resolved cases and a hash of their content, recorded in `run.json`.
///
/// The cases themselves are kept in an unnamed file (gone when this is dropped), each one's
/// JSON on a line of its own, exactly the lines the content hash reads: memory holds each
/// case's id (shared with its trials' keys), where its line is and where it came from, 40
/// bytes a case. A run of 100,000 cases would otherwise hold every case's input and answer
/// as parsed JSON from the start of the run to its end. A case is read back when it is used:
/// in order ([`Cases::iter`]), or by id ([`Cases::get`]).
#[derive(Debug, Default)]
pub struct Cases {
    /// `None` only for no cases.
    file: Option<std::fs::File>,
    /// In the datasets' order.
    spots: Vec<CaseSpot>,
    /// Positions in `spots` sorted by id.
    by_id: Vec<u32>,
    /// Where each case comes from, in the order of `spots`: eight bytes a case, not a
    /// string ([`Cases::origin`] spells it out).
    origins: Vec<Origin>,
    /// The sources the origins name: dataset files, and dataset plugins with their path.
    sources: Vec<String>,
    /// sha256 over the canonical JSON of every case, in order.
    pub content_hash: String,
}

/// One case in [`Cases`]' file: its id, its line (`len` bytes at `at`, without the newline)
/// and its own trial count (`trials`, [`NO_TRIALS`] when it has none), which planning needs of
/// every case and so reads without parsing any.
#[derive(Debug)]
struct CaseSpot {
    id: Arc<str>,
    at: u64,
    len: u32,
    trials: u32,
}

/// [`CaseSpot::trials`] of a case without a trial count of its own.
const NO_TRIALS: u32 = u32::MAX;

/// Where one case comes from: one of [`Cases`]'s sources and, for a file, the line the case
/// starts on (0 for a dataset plugin's cases).
#[derive(Debug, Clone, Copy)]
struct Origin {
    source: u32,
    line: u32,
}

impl Origin {
    /// `file:line` for a file's case, the plugin and path for a dataset plugin's; `sources`
    /// are the ones it names.
    fn describe(self, sources: &[String]) -> String {
        let source = &sources[self.source as usize];
        match self.line {
            0 => source.clone(),
            line => format!("{source}:{line}"),
        }
    }
}

impl Cases {
    /// `cases`, in this order, from nowhere in particular (a test's list); ids must be
    /// unique.
    #[cfg(test)]
    pub fn from_records(cases: impl IntoIterator<Item = CaseRecord>) -> Result<Self> {
        let mut loading = Loading::new()?;
        let source = loading.source("(given)".to_string(), 0);
        for case in cases {
            loading.push(case, source, 0)?;
        }
        loading.finish()
    }

    /// Where the case at `index` in the datasets' order comes from: `file:line` for files, the
    /// plugin and path for a dataset plugin's cases.
    pub fn origin(&self, index: usize) -> String {
        (self.origins.get(index)).map_or_else(String::new, |o| o.describe(&self.sources))
    }

    /// How many cases there are.
    pub fn len(&self) -> usize {
        self.spots.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.spots.is_empty()
    }

    /// Every case's id, in the datasets' order.
    pub fn ids(&self) -> impl Iterator<Item = &Arc<str>> {
        self.spots.iter().map(|spot| &spot.id)
    }

    /// Every case's id with its own trial count, if it has one, in the datasets' order.
    pub fn trial_counts(&self) -> impl Iterator<Item = (&Arc<str>, Option<u32>)> {
        (self.spots.iter())
            .map(|spot| (&spot.id, (spot.trials != NO_TRIALS).then_some(spot.trials)))
    }

    /// Whether a case's id is `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.position(id).is_some()
    }

    /// The position in the datasets' order of the case whose id is `id`.
    fn position(&self, id: &str) -> Option<usize> {
        super::trial::find_position(&self.spots, &self.by_id, |spot| &*spot.id, id)
    }

    /// The case whose id is `id`, read from the cases' file.
    pub fn get(&self, id: &str) -> Result<Option<CaseRecord>> {
        self.position(id).map(|at| self.read(at)).transpose()
    }

    /// The case at `index` in the datasets' order.
    fn read(&self, index: usize) -> Result<CaseRecord> {
        let spot = &self.spots[index];
        let file = self.file.as_ref().context("no cases were kept")?;
        crate::files::read_json_at(file, spot.at, spot.len as usize)
            .with_context(|| format!("cannot read case `{}` back from the cases' file", spot.id))
    }

    /// Every case, in the datasets' order, read from the cases' file as it is reached.
    pub fn iter(&self) -> impl Iterator<Item = Result<CaseRecord>> + '_ {
        let mut reader =
            (self.file.as_ref()).map(|file| std::io::BufReader::new(ReadAt { file, at: 0 }));
        let mut line = Vec::new();
        self.spots.iter().map(move |spot| {
            let reader = reader.as_mut().context("no cases were kept")?;
            line.resize(spot.len as usize + 1, 0);
            std::io::Read::read_exact(reader, &mut line).with_context(|| {
                format!("cannot read case `{}` back from the cases' file", spot.id)
            })?;
            serde_json::from_slice(&line[..spot.len as usize])
                .with_context(|| format!("case `{}` is damaged in the cases' file", spot.id))
        })
    }
}

/// Reads `file` from `at` on, with positioned reads: any number of readers and lookups share
/// the file without moving each other's place.
struct ReadAt<'a> {
    file: &'a std::fs::File,
    at: u64,
}

impl std::io::Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let read = std::os::unix::fs::FileExt::read_at(self.file, buf, self.at)?;
        self.at += read as u64;
        Ok(read)
    }
}

/// The cases read so far, written to the cases' file as they are read, with their origins
/// and the sources those name: what [`Cases`] will hold.
struct Loading {
    file: std::io::BufWriter<std::fs::File>,
    written: u64,
    line: Vec<u8>,
    hasher: Sha256,
    spots: Vec<CaseSpot>,
    origins: Vec<Origin>,
    sources: Vec<String>,
}

impl Loading {
    fn new() -> Result<Self> {
        let file = tempfile::tempfile().context("cannot make a file to keep the cases in")?;
        Ok(Loading {
            file: std::io::BufWriter::new(file),
            written: 0,
            line: Vec::new(),
            hasher: Sha256::new(),
            spots: Vec::new(),
            origins: Vec::new(),
            sources: Vec::new(),
        })
    }

    /// Starts a source (a file, or a dataset plugin with its path) with room for `cases`
    /// more; the index its cases' origins name.
    fn source(&mut self, label: String, cases: usize) -> u32 {
        self.sources.push(label);
        self.spots.reserve_exact(cases);
        self.origins.reserve_exact(cases);
        (self.sources.len() - 1) as u32
    }

    /// Adds `case`, from `source`, starting on `line` (0 when it has none).
    fn push(&mut self, case: CaseRecord, source: u32, line: usize) -> Result<()> {
        let origin = Origin {
            source,
            line: u32::try_from(line).unwrap_or(u32::MAX),
        };
        if case.id.is_empty() {
            bail!("{}: a case has an empty `id`", self.origin_of(origin));
        }
        self.line.clear();
        serde_json::to_writer(&mut self.line, &case)?;
        self.hasher.update(&self.line);
        self.hasher.update(b"\n");
        let len = u32::try_from(self.line.len())
            .ok()
            .with_context(|| format!("{}: the case is over 4 GiB", self.origin_of(origin)))?;
        self.line.push(b'\n');
        std::io::Write::write_all(&mut self.file, &self.line)
            .context("cannot write to the file the cases are kept in")?;
        self.spots.push(CaseSpot {
            trials: case
                .more()
                .trials
                .map_or(NO_TRIALS, |n| n.min(NO_TRIALS - 1)),
            id: case.id,
            at: self.written,
            len,
        });
        self.written += self.line.len() as u64;
        self.origins.push(origin);
        Ok(())
    }

    fn origin_of(&self, origin: Origin) -> String {
        origin.describe(&self.sources)
    }

    /// The cases, their ids checked unique.
    fn finish(self) -> Result<Cases> {
        let file = self
            .file
            .into_inner()
            .map_err(|e| e.into_error())
            .context("cannot write to the file the cases are kept in")?;
        let mut cases = Cases {
            file: Some(file),
            by_id: Vec::new(),
            spots: self.spots,
            origins: self.origins,
            sources: self.sources,
            content_hash: hex::encode(self.hasher.finalize()),
        };
        // By id, then by position: the cases sharing an id lie together, first to last.
        let spots = &cases.spots;
        let mut by_id: Vec<u32> = (0..spots.len() as u32).collect();
        by_id.sort_unstable_by(|a, b| {
            (spots[*a as usize].id.cmp(&spots[*b as usize].id)).then(a.cmp(b))
        });
        // The earliest second use of an id is the one reported, with the id's first use.
        let twice = by_id
            .chunk_by(|a, b| spots[*a as usize].id == spots[*b as usize].id)
            .filter(|same| same.len() > 1)
            .map(|same| (same[0] as usize, same[1] as usize))
            .min_by_key(|(_, second)| *second);
        if let Some((first, second)) = twice {
            bail!(
                "case id `{}` appears twice (in {} and {}); ids must be unique",
                spots[second].id,
                cases.origin(first),
                cases.origin(second)
            );
        }
        cases.by_id = by_id;
        Ok(cases)
    }
}

/// The cases in one file, each with where it starts (`file:line`). Every error names the file
/// and line; an MST dataset (`{"name", "cases": […]}`) is refused with how to convert it.
fn parse_cases(text: &str, file: &Path, loading: &mut Loading) -> Result<()> {
    let at = |line: usize| format!("{}:{line}", file.display());
    let not_a_case =
        |first_line: usize, e: serde_json::Error| anyhow::anyhow!(located(file, first_line, &e));
    let label = file.display().to_string();
    if file.extension().is_some_and(|e| e == "jsonl") {
        let lines = text.lines().filter(|line| !line.trim().is_empty()).count();
        let source = loading.source(label, lines);
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let case = serde_json::from_str(line).map_err(|e| not_a_case(index + 1, e))?;
            loading.push(case, source, index + 1)?;
        }
        return Ok(());
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
    if let Some(object) = value.as_object() {
        if object.contains_key("cases") || object.contains_key("$schema") {
            let sign = "a `{\"name\", \"cases\": […]}` object, not a case or an array of cases";
            return Err(mst_format_error(file, "dataset", sign));
        }
    }
    // Parsed again from the text (not the value) so that errors carry their line.
    match value {
        serde_json::Value::Array(_) => {
            let cases: Vec<CaseRecord> =
                serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
            let source = loading.source(label, cases.len());
            for (case, line) in cases.into_iter().zip(element_lines(text)) {
                loading.push(case, source, line)?;
            }
            Ok(())
        }
        serde_json::Value::Object(_) => {
            let case = serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
            let source = loading.source(label, 1);
            loading.push(case, source, first_line(text))
        }
        _ => bail!(
            "{}: must hold a case object or an array of cases",
            at(first_line(text))
        ),
    }
}

/// The line the JSON value in `text` starts on.
fn first_line(text: &str) -> usize {
    let blank = text.len() - text.trim_start().len();
    1 + text[..blank].matches('\n').count()
}

/// The line each element of the top-level array in `text` (valid JSON) starts on.
fn element_lines(text: &str) -> Vec<usize> {
    let (mut depth, mut line, mut in_string, mut escaped, mut next) =
        (0usize, 1, false, false, false);
    let mut lines = Vec::new();
    for c in text.chars() {
        if c == '\n' {
            line += 1;
        }
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        // The first character after `[` or a top-level `,` starts an element.
        if next && !c.is_whitespace() && c != ']' {
            lines.push(line);
            next = false;
        }
        match c {
            '"' => in_string = true,
            '[' | '{' => {
                depth += 1;
                next = depth == 1;
            }
            ']' | '}' => depth = depth.saturating_sub(1),
            ',' if depth == 1 => next = true,
            _ => {}
        }
    }
    lines
}

fn read_text(path: &Path) -> Result<String> {
    let bytes = crate::files::read_input(path)?;
    String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", path.display()))
}

fn load_dir(dir: &Path, loading: &mut Loading) -> Result<()> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("cannot read dataset directory {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json") && p.is_file())
        .collect();
    files.sort();
    for file in files {
        parse_cases(&read_text(&file)?, &file, loading)?;
    }
    Ok(())
}

fn load_path(path: &Path, loading: &mut Loading) -> Result<()> {
    if path.is_dir() {
        load_dir(path, loading)
    } else {
        parse_cases(&read_text(path)?, path, loading)
    }
}

/// Resolves `path` from a dataset entry inside `base`, refusing to leave it.
fn inside(base: &Path, relative: &str) -> Result<PathBuf> {
    let joined = base.join(relative);
    let canonical = joined
        .canonicalize()
        .with_context(|| format!("dataset {} does not exist", joined.display()))?;
    let base = base
        .canonicalize()
        .with_context(|| format!("cannot resolve {}", base.display()))?;
    if !canonical.starts_with(&base) {
        bail!(
            "dataset path `{relative}` lies outside the eval's directory {}",
            base.display()
        );
    }
    Ok(canonical)
}

/// Resolves every entry (paths relative to `base`, the config's directory) into cases.
pub fn resolve(entries: &[DatasetRef], base: &Path, plugins: &PluginSet) -> Result<Cases> {
    let mut loading = Loading::new()?;
    for (index, entry) in entries.iter().enumerate() {
        match entry {
            DatasetRef::Path(path) => load_path(&inside(base, path)?, &mut loading)?,
            DatasetRef::Typed(fields) => {
                let kind = fields.get("type").and_then(|t| t.as_str()).with_context(|| {
                    format!("datasets[{index}] needs a `type` (`file`, `dir` or a dataset plugin's name)")
                })?;
                let path = match fields.get("path") {
                    Some(serde_json::Value::String(p)) => Some(p.clone()),
                    Some(_) => bail!("datasets[{index}].path must be a string"),
                    None => None,
                };
                match kind {
                    "file" | "dir" => {
                        let path = path.with_context(|| {
                            format!("datasets[{index}] of type `{kind}` needs a `path`")
                        })?;
                        if let Some(extra) = fields
                            .keys()
                            .find(|k| !["type", "path"].contains(&k.as_str()))
                        {
                            bail!(
                                "datasets[{index}]: unknown key `{extra}` for a `{kind}` dataset"
                            );
                        }
                        load_path(&inside(base, &path)?, &mut loading)?
                    }
                    plugin_name => {
                        if plugins.find(plugin_name).is_none() {
                            bail!(
                                "datasets[{index}] has type `{plugin_name}`, which is neither `file`, `dir`, nor a \
                                 configured or installed dataset plugin"
                            );
                        }
                        let plugin = plugins
                            .get(plugin_name, Kind::Dataset)
                            .with_context(|| format!("datasets[{index}]"))?;
                        let content = match &path {
                            Some(p) => Some(crate::files::read_input(&inside(base, p)?)?),
                            None => None,
                        };
                        let options = serde_json::to_string(fields)?;
                        let raw = plugin.resolve(&options, content.as_deref())?;
                        let label = format!("{plugin_name}({})", path.unwrap_or_default());
                        let source = loading.source(label, raw.len());
                        for case in raw {
                            loading.push(CaseRecord::from_wit(case)?, source, 0)?;
                        }
                    }
                }
            }
        }
    }
    let cases = loading.finish()?;
    if cases.is_empty() {
        bail!("the datasets hold no cases");
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_damaged_or_shortened_cases_file_is_an_error_naming_the_case_never_a_missing_case() {
        use std::os::unix::fs::FileExt;
        let cases = Cases::from_records(
            ["c1", "c2", "c3"]
                .map(|id| CaseRecord::new(id, serde_json::json!({"prompt": "hello"}))),
        )
        .unwrap();
        let file = cases.file.as_ref().unwrap();
        // The second case's line, overwritten in place.
        let spot = &cases.spots[1];
        file.write_all_at(&vec![b'#'; spot.len as usize], spot.at)
            .unwrap();
        let error = format!("{:#}", cases.get("c2").unwrap_err());
        assert!(error.contains("cannot read case `c2` back"), "{error}");
        assert!(cases.get("c1").unwrap().is_some() && cases.get("c4").unwrap().is_none());
        let read: Vec<_> = cases.iter().collect();
        assert!(read[0].is_ok() && read[2].is_ok());
        let error = format!("{:#}", read[1].as_ref().unwrap_err());
        assert!(error.contains("case `c2` is damaged"), "{error}");
        // Cut short: the last case cannot be read at all.
        file.set_len(cases.spots[2].at + 3).unwrap();
        let error = format!("{:#}", cases.get("c3").unwrap_err());
        assert!(error.contains("cannot read case `c3` back"), "{error}");
        let error = format!("{:#}", cases.iter().last().unwrap().unwrap_err());
        assert!(error.contains("cannot read case `c3` back"), "{error}");
    }

    #[test]
    fn files_dirs_and_unique_ids() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("a.jsonl"),
            "{\"id\":\"a\",\"input\":1}\n\n{\"id\":\"b\",\"input\":2}\n",
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("more")).unwrap();
        std::fs::write(
            dir.path().join("more/c.json"),
            r#"[{"id":"c","input":3,"trials":2}]"#,
        )
        .unwrap();
        let entries = vec![
            DatasetRef::Path("a.jsonl".into()),
            DatasetRef::Typed(
                [
                    ("type".to_string(), "dir".into()),
                    ("path".to_string(), "more".into()),
                ]
                .into(),
            ),
        ];
        let cases = resolve(&entries, dir.path(), &PluginSet::default()).unwrap();
        let ids: Vec<&str> = cases.ids().map(|id| &**id).collect();
        assert_eq!(ids, ["a", "b", "c"]);
        let read: Vec<CaseRecord> = cases.iter().map(Result::unwrap).collect();
        assert_eq!(read[2].more().trials, Some(2));
        assert_eq!(read[1].input, serde_json::json!(2));
        assert_eq!(cases.get("b").unwrap().unwrap(), read[1]);
        assert!(cases.get("z").unwrap().is_none());
        let counts: Vec<Option<u32>> = cases.trial_counts().map(|(_, n)| n).collect();
        assert_eq!(counts, [None, None, Some(2)]);
        assert_eq!(cases.content_hash.len(), 64);

        let twice = vec![
            DatasetRef::Path("a.jsonl".into()),
            DatasetRef::Path("a.jsonl".into()),
        ];
        let err = resolve(&twice, dir.path(), &PluginSet::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("`a` appears twice"), "{err}");
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("bad.jsonl"),
            "{\"id\":\"a\",\"input\":1}\n{\"id\":\"b\",\"inptu\":2}\n",
        )
        .unwrap();
        let err = format!(
            "{:#}",
            resolve(
                &[DatasetRef::Path("bad.jsonl".into())],
                dir.path(),
                &PluginSet::default()
            )
            .unwrap_err()
        );
        assert!(
            err.contains("bad.jsonl:2") && err.contains("inptu"),
            "{err}"
        );
        let err = resolve(
            &[DatasetRef::Path("../outside.jsonl".into())],
            dir.path(),
            &PluginSet::default(),
        )
        .unwrap_err();
        assert!(
            err.to_string().contains("does not exist") || err.to_string().contains("outside"),
            "{err}"
        );
        let typed = DatasetRef::Typed([("type".to_string(), "acme/dataset/x".into())].into());
        let err = resolve(&[typed], dir.path(), &PluginSet::default())
            .unwrap_err()
            .to_string();
        assert!(err.contains("acme/dataset/x"), "{err}");
    }

    /// The error resolving the single file `name` holding `text`.
    fn error_for(name: &str, text: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(name), text).unwrap();
        let entry = DatasetRef::Path(name.into());
        let err = resolve(&[entry], dir.path(), &PluginSet::default()).unwrap_err();
        format!("{err:#}")
    }

    #[test]
    fn every_format_names_the_line() {
        let array = "[\n  {\"id\": \"a\", \"input\": 1},\n  {\"id\": \"b\",\n   \"inptu\": 2}\n]\n";
        let err = error_for("cases.json", array);
        assert!(
            err.contains("cases.json:4:") && err.contains("(did you mean `input`?)"),
            "{err}"
        );
        let object = "\n{\"id\": \"a\",\n \"input\": 1,\n \"tag\": []}";
        let err = error_for("one.json", object);
        assert!(
            err.contains("one.json:4:") && err.contains("(did you mean `tags`?)"),
            "{err}"
        );
        let err = error_for("broken.json", "[\n{\"id\": \"a\",\n");
        assert!(err.contains("broken.json:3:"), "{err}");
        let err = error_for("scalar.json", "\n\n42");
        assert!(
            err.contains("scalar.json:3: must hold a case object"),
            "{err}"
        );
    }

    #[test]
    fn an_mst_dataset_is_refused_with_how_to_convert_it() {
        let mst = r#"{"name": "time", "cases": [{"id": "a", "input": "What time is it?"}]}"#;
        let err = error_for("time.json", mst);
        assert!(
            err.contains("time.json is an MST (mcp-server-tester) dataset")
                && err.contains("convert it with `mst import mst"),
            "{err}"
        );
    }

    #[test]
    fn each_case_knows_its_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let text = "[{\"id\": \"a\", \"input\": \"[, {\\\"\"},\n\n {\"id\": \"b\", \"input\": [[1], {\"x\": [2, 3]}]},\n {\"id\": \"c\", \"input\": 3}]";
        std::fs::write(dir.path().join("cases.json"), text).unwrap();
        std::fs::write(
            dir.path().join("more.jsonl"),
            "\n{\"id\": \"d\", \"input\": 4}\n",
        )
        .unwrap();
        let entries = [
            DatasetRef::Path("cases.json".into()),
            DatasetRef::Path("more.jsonl".into()),
        ];
        let cases = resolve(&entries, dir.path(), &PluginSet::default()).unwrap();
        let lines: Vec<String> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| {
                let index = cases.ids().position(|c| &**c == *id).unwrap();
                let origin = cases.origin(index);
                origin.rsplit_once('/').unwrap().1.to_string()
            })
            .collect();
        assert_eq!(
            lines,
            [
                "cases.json:1",
                "cases.json:3",
                "cases.json:4",
                "more.jsonl:2"
            ]
        );
    }
}
