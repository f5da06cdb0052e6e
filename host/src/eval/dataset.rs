//! Datasets: turn the config's `datasets` entries into one list of cases with unique ids.
//!
//! Built in: a `.jsonl` file (one case per line), a `.json` file (an array of cases), and a
//! directory (every `*.json` file in it, each one case or an array, in name order). Any other
//! `type` names a dataset plugin, which receives the entry as its options and the named file's
//! bytes as content.

use super::case_ids::{CaseIds, CaseIdsBuilder};
use super::config::{located, mst_format_error, DatasetRef};
use super::trial::CaseRecord;
use crate::files::{Appender, Pack, ReadAt, Records, Unpack};
use crate::plugin::set::PluginSet;
use crate::plugin::Kind;
use anyhow::{bail, Context, Result};
use sha2::{Digest, Sha256};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The resolved cases and a hash of their content, recorded in `run.json`.
///
/// The cases themselves are kept in an unnamed file (gone when this is dropped), each one's
/// JSON on a line of its own, exactly the lines the content hash reads, and where each line is
/// and where each case came from in a second one, a fixed-size [`Place`] a case. Memory holds
/// the cases' ids ([`CaseIds`], shared with a plan of them all), 8 bytes a case beside the
/// id's own: a run of 100,000 cases would otherwise hold every case's input and answer as
/// parsed JSON from the start of the run to its end. A case is read back when it
/// is used: in order ([`Cases::iter`]), or by id ([`Cases::get`]).
#[derive(Debug, Default)]
pub struct Cases {
    /// `None` only for no cases.
    file: Option<File>,
    /// Each case's [`Place`], in the datasets' order. `None` only for no cases.
    places: Option<Records<PLACE>>,
    /// Every case's id, in the datasets' order.
    ids: Arc<CaseIds>,
    /// The cases with a trial count of their own, as (position, count), by position: few
    /// evals give any case one, so this is most often empty.
    own_trials: Vec<(u32, u32)>,
    /// The sources the places' origins name: dataset files, and dataset plugins with their
    /// path.
    sources: Vec<String>,
    /// sha256 over the canonical JSON of every case, in order.
    pub content_hash: String,
}

/// Where one case is: its line in the cases' file (`len` bytes at `at`, without the newline)
/// and where it came from.
#[derive(Debug, Clone, Copy)]
struct Place {
    at: u64,
    len: u32,
    origin: Origin,
}

/// A [`Place`]'s size in the places' file: `at`, `len`, the origin's `source` and `line`;
/// little-endian.
const PLACE: usize = 20;

impl Place {
    fn encode(self) -> [u8; PLACE] {
        let Origin { source, line } = self.origin;
        (Pack::new().u64(self.at).u32(self.len).u32(source).u32(line)).done()
    }

    fn decode(bytes: &[u8; PLACE]) -> Self {
        let mut fields = Unpack::new(bytes);
        let (at, len) = (fields.u64(), fields.u32());
        let origin = Origin {
            source: fields.u32(),
            line: fields.u32(),
        };
        Place { at, len, origin }
    }
}

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
        let source = (sources.get(self.source as usize)).map_or("(an unknown source)", |s| s);
        match self.line {
            0 => source.to_string(),
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
        match self.place(index) {
            Ok(place) => place.origin.describe(&self.sources),
            Err(e) => format!("where it came from cannot be read back: {e}"),
        }
    }

    /// The place of the case at `index`, read from the places' file.
    fn place(&self, index: usize) -> std::io::Result<Place> {
        let places = (self.places.as_ref()).ok_or_else(|| std::io::Error::other("no cases"))?;
        Ok(Place::decode(&places.get(index)?))
    }

    /// How many cases there are.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Every case's id, in the datasets' order.
    pub fn ids(&self) -> &Arc<CaseIds> {
        &self.ids
    }

    /// Every case's id with its own trial count, if it has one, in the datasets' order.
    pub fn trial_counts(&self) -> impl Iterator<Item = (&str, Option<u32>)> {
        let mut own = self.own_trials.iter().peekable();
        (self.ids.iter().enumerate()).map(move |(at, id)| {
            let count = own.next_if(|(of, _)| *of as usize == at).map(|(_, n)| *n);
            (id, count)
        })
    }

    /// Whether a case's id is `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.position(id).is_some()
    }

    /// The position in the datasets' order of the case whose id is `id`.
    fn position(&self, id: &str) -> Option<usize> {
        self.ids.find(id)
    }

    /// The case whose id is `id`, read from the cases' file.
    pub fn get(&self, id: &str) -> Result<Option<CaseRecord>> {
        self.position(id).map(|at| self.read(at)).transpose()
    }

    /// The case at `index` in the datasets' order.
    fn read(&self, index: usize) -> Result<CaseRecord> {
        let id = self.ids.get(index);
        let read_back = || format!("cannot read case `{id}` back from the cases' file");
        let place = self.place(index).with_context(read_back)?;
        let file = self.file.as_ref().context("no cases were kept")?;
        crate::files::read_json_at(file, place.at, place.len as usize).with_context(read_back)
    }

    /// Every case, in the datasets' order, read from the cases' file as it is reached, each
    /// line exactly as long as its place says (a damaged file spoils one case, not the rest).
    pub fn iter(&self) -> impl Iterator<Item = Result<CaseRecord>> + '_ {
        let mut lines = (self.file.as_ref()).map(|file| BufReader::new(ReadAt::new(file, 0)));
        let mut places = self.places.as_ref().map(Records::iter);
        let mut line = Vec::new();
        self.ids.iter().map(move |id| {
            let read_back = || format!("cannot read case `{id}` back from the cases' file");
            let (lines, places) = (lines.as_mut(), places.as_mut());
            let (lines, places) = lines.zip(places).context("no cases were kept")?;
            // As many places as ids were kept: one was pushed with each.
            let place =
                (places.next()).unwrap_or_else(|| Err(std::io::Error::other("no place was kept")));
            let place = Place::decode(&place.with_context(read_back)?);
            // The lines lie one after another, each with its newline.
            line.resize(place.len as usize + 1, 0);
            lines.read_exact(&mut line).with_context(read_back)?;
            serde_json::from_slice(&line[..place.len as usize])
                .with_context(|| format!("case `{id}` is damaged in the cases' file"))
        })
    }
}

/// The cases read so far, written to the cases' file as they are read, with their places
/// written to theirs: what [`Cases`] will hold.
struct Loading {
    file: BufWriter<File>,
    places: Appender<PLACE>,
    written: u64,
    line: Vec<u8>,
    hasher: Sha256,
    ids: CaseIdsBuilder,
    own_trials: Vec<(u32, u32)>,
    sources: Vec<String>,
}

impl Loading {
    fn new() -> Result<Self> {
        let context = "cannot make a file to keep the cases in";
        let file = tempfile::tempfile().context(context)?;
        let places = Records::temp("the cases' places file").context(context)?;
        Ok(Loading {
            file: BufWriter::new(file),
            places: places.appending(),
            written: 0,
            line: Vec::new(),
            hasher: Sha256::new(),
            ids: CaseIdsBuilder::default(),
            own_trials: Vec::new(),
            sources: Vec::new(),
        })
    }

    /// Starts a source (a file, or a dataset plugin with its path) with room for `cases`
    /// more; the index its cases' origins name.
    fn source(&mut self, label: String, cases: usize) -> u32 {
        self.sources.push(label);
        self.ids.reserve(cases);
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
        // Refused before the case is written, not after.
        let position = u32::try_from(self.ids.len())
            .ok()
            .filter(|&position| position < u32::MAX)
            .with_context(|| format!("{}: more than 4 billion cases", self.origin_of(origin)))?;
        self.line.clear();
        serde_json::to_writer(&mut self.line, &case)?;
        self.hasher.update(&self.line);
        self.hasher.update(b"\n");
        let len = u32::try_from(self.line.len())
            .ok()
            .with_context(|| format!("{}: the case is over 4 GiB", self.origin_of(origin)))?;
        self.line.push(b'\n');
        let place = Place {
            at: self.written,
            len,
            origin,
        };
        (self.file.write_all(&self.line))
            .and_then(|()| self.places.push(&place.encode()))
            .context("cannot write to the file the cases are kept in")?;
        self.written += self.line.len() as u64;
        if let Some(trials) = case.more().trials {
            self.own_trials.push((position, trials));
        }
        (self.ids.push(&case.id)).map_err(|e| anyhow::anyhow!("{}: {e}", self.origin_of(origin)))
    }

    fn origin_of(&self, origin: Origin) -> String {
        origin.describe(&self.sources)
    }

    /// The cases, their ids checked unique.
    fn finish(self) -> Result<Cases> {
        let context = "cannot write to the file the cases are kept in";
        let file = (self.file.into_inner().map_err(|e| e.into_error())).context(context)?;
        let cases = Cases {
            file: Some(file),
            places: Some(self.places.finish().context(context)?),
            ids: Arc::new(self.ids.finish()),
            own_trials: self.own_trials,
            sources: self.sources,
            content_hash: hex::encode(self.hasher.finalize()),
        };
        // The earliest second use of an id is the one reported, with the id's first use.
        if let Some((first, second)) = cases.ids.repeated() {
            bail!(
                "case id `{}` appears twice (in {} and {}); ids must be unique",
                cases.ids.get(second),
                cases.origin(first),
                cases.origin(second)
            );
        }
        Ok(cases)
    }
}

/// The cases of a `.jsonl` file, one a line, read a line at a time: a dataset of any size
/// costs the memory of its longest line, where reading it whole cost its size (8 MB for
/// 100,000 small cases, the peak of such a run). Every error names the file and line.
fn parse_jsonl(file: &Path, loading: &mut Loading) -> Result<()> {
    use crate::files::{LineReader, MAX_INPUT_BYTES};
    // Blank as `str::trim` sees it; a line that is not UTF-8 is not blank, so its error names it.
    let blank = |line: &[u8]| std::str::from_utf8(line).is_ok_and(|line| line.trim().is_empty());
    let mut lines = LineReader::open(file, MAX_INPUT_BYTES, MAX_INPUT_BYTES as usize)?;
    // Read once: the ids' list grows as it goes, and is made to its size at the end.
    let source = loading.source(file.display().to_string(), 0);
    let mut number = 0;
    while let Some(line) = lines.next_line()? {
        number += 1;
        if blank(line) {
            continue;
        }
        // Without its line ending, so that an error's position is on this line.
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let line = std::str::from_utf8(line)
            .with_context(|| format!("{}:{number} is not UTF-8", file.display()))?;
        let case =
            serde_json::from_str(line).map_err(|e| anyhow::anyhow!(located(file, number, &e)))?;
        loading.push(anchored(case, file), source, number)?;
    }
    Ok(())
}

/// `case` with its `workspace` and its checks' `files`, if it has them, anchored to the
/// directory of `file`, the dataset file that names it.
fn anchored(mut case: CaseRecord, file: &Path) -> CaseRecord {
    let base = file.parent().unwrap_or(Path::new("."));
    if let Some(more) = case.more.as_deref_mut() {
        more.workspace = more.workspace.as_ref().map(|spec| spec.anchored(base));
        if let Some(checks) = &mut more.checks {
            for check in checks.iter_mut() {
                *check = check.anchored(base);
            }
        }
    }
    case
}

/// The cases in one `.json` file, each with where it starts (`file:line`). Every error names
/// the file and line; an MST dataset (`{"name", "cases": […]}`) is refused with how to convert it.
fn parse_cases(text: &str, file: &Path, loading: &mut Loading) -> Result<()> {
    let at = |line: usize| format!("{}:{line}", file.display());
    let not_a_case =
        |first_line: usize, e: serde_json::Error| anyhow::anyhow!(located(file, first_line, &e));
    let label = file.display().to_string();
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
                loading.push(anchored(case, file), source, line)?;
            }
            Ok(())
        }
        serde_json::Value::Object(_) => {
            let case = serde_json::from_str(text).map_err(|e| not_a_case(1, e))?;
            let source = loading.source(label, 1);
            loading.push(anchored(case, file), source, first_line(text))
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
    } else if path.extension().is_some_and(|e| e == "jsonl") {
        parse_jsonl(path, loading)
    } else {
        parse_cases(&read_text(path)?, path, loading)
    }
}

/// Resolves `path` from a dataset entry inside `base`, refusing to leave it.
pub(crate) fn inside(base: &Path, relative: &str) -> Result<PathBuf> {
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
        let place = cases.place(1).unwrap();
        file.write_all_at(&vec![b'#'; place.len as usize], place.at)
            .unwrap();
        let error = format!("{:#}", cases.get("c2").unwrap_err());
        assert!(error.contains("cannot read case `c2` back"), "{error}");
        assert!(cases.get("c1").unwrap().is_some() && cases.get("c4").unwrap().is_none());
        let read: Vec<_> = cases.iter().collect();
        assert!(read[0].is_ok() && read[2].is_ok());
        let error = format!("{:#}", read[1].as_ref().unwrap_err());
        assert!(error.contains("case `c2` is damaged"), "{error}");
        // Cut short: the last case cannot be read at all.
        file.set_len(cases.place(2).unwrap().at + 3).unwrap();
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
        let ids: Vec<&str> = cases.ids().iter().collect();
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
    fn a_jsonl_file_read_a_line_at_a_time_keeps_its_line_numbers_and_names_a_bad_line() {
        let dir = tempfile::tempdir().unwrap();
        let resolved = |text: &[u8]| {
            std::fs::write(dir.path().join("d.jsonl"), text).unwrap();
            let entries = [DatasetRef::Path("d.jsonl".into())];
            resolve(&entries, dir.path(), &PluginSet::default()).map_err(|e| format!("{e:#}"))
        };
        // Blank lines (one of them a no-break space, one a vertical tab), a line ending in
        // CRLF, and a last line without a newline.
        let cases = resolved(
            b"\n{\"id\":\"a\",\"input\":1}\r\n \xc2\xa0\n\x0b\n{\"id\":\"b\",\"input\":\"\xc3\xa9\"}",
        )
        .unwrap();
        assert_eq!(cases.len(), 2);
        assert_eq!(
            cases.origin(0),
            format!("{}:2", dir.path().join("d.jsonl").display())
        );
        assert!(
            cases.origin(1).ends_with("d.jsonl:5"),
            "{}",
            cases.origin(1)
        );
        assert_eq!(
            cases.get("b").unwrap().unwrap().input,
            serde_json::json!("\u{e9}")
        );
        let error = resolved(b"{\"id\":\"a\",\"input\":1}\n\n{\"id\":\"b\",\"input\":\"\xff\"}\n")
            .unwrap_err();
        assert!(error.contains("d.jsonl:3 is not UTF-8"), "{error}");
        let error = resolved(b"{\"id\":\"a\",\"input\":1}\n{\"id\":\"b\",\n").unwrap_err();
        assert!(error.contains("d.jsonl:2:"), "{error}");
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
                let index = cases.ids().find(id).unwrap();
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
