//! Output hygiene: what mst writes outside its own memory (result files, worker logs, the
//! terminal) never holds a secret value it knows, nor control characters from someone else.
//!
//! Every secret value mst holds (the secrets file, values granted with `--allow-secret` or
//! `allowSecret`, the tokens a worker receives) is registered with [`hold`] where it is read.
//! [`redactor`] is the process-wide [`Redactor`] over all of them; [`clean_text`],
//! [`clean_bytes`] and [`redact_file`] are what the sinks call. A value shorter than
//! [`MIN_REDACTED_LEN`] characters is not redacted (it would blot out ordinary text); mst
//! warns when it holds one.

use super::Secret;
use aho_corasick::{AhoCorasick, MatchKind};
use anyhow::{Context, Result};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, RwLock};

/// Values shorter than this many characters are not redacted.
pub const MIN_REDACTED_LEN: usize = 6;

/// Replaces secret values with `[redacted:NAME]`. Matches are leftmost-longest, so a value
/// that contains another is replaced whole.
#[derive(Default)]
pub struct Redactor {
    /// For text: each value as it is, and JSON-escaped (text may quote JSON).
    text: Needles,
    /// For JSON documents: each value only as it appears inside a JSON string, so a match can
    /// never span the document's own quotes and break it.
    json: Needles,
}

/// Strings to look for, each with its replacement, and their matcher.
#[derive(Default, Clone)]
struct Needles {
    replacements: BTreeMap<String, String>,
    matcher: Option<AhoCorasick>,
    /// The replacements in the matcher's pattern order.
    with: Vec<String>,
    /// The longest needle's length in bytes.
    longest: usize,
}

impl Needles {
    fn add(&mut self, needle: &str, replacement: &str) {
        // The first name to claim a value keeps it.
        self.replacements
            .entry(needle.to_string())
            .or_insert_with(|| replacement.to_string());
    }

    fn build(mut self) -> Self {
        self.matcher = (!self.replacements.is_empty()).then(|| {
            AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(self.replacements.keys())
                .expect("plain string patterns build")
        });
        self.with = self.replacements.values().cloned().collect();
        self.longest = self.replacements.keys().map(String::len).max().unwrap_or(0);
        self
    }

    fn found_in(&self, bytes: &[u8]) -> bool {
        self.matcher.as_ref().is_some_and(|m| m.is_match(bytes))
    }

    fn replace<'t>(&self, bytes: &'t [u8]) -> Cow<'t, [u8]> {
        match &self.matcher {
            Some(matcher) if matcher.is_match(bytes) => {
                Cow::Owned(matcher.replace_all_bytes(bytes, &self.with))
            }
            _ => Cow::Borrowed(bytes),
        }
    }
}

/// Bytes a [`HeldWriter`] gathers before it hands them to its [`Drain`].
const HELD_CHUNK: usize = 64 << 10;

/// What a [`HeldWriter`] makes of the bytes gathered so far: it writes to `out` what no later
/// byte can change (everything when `all`) and removes that from `pending`.
pub trait Drain {
    /// Writes out what it can of `pending`.
    fn drain(&self, pending: &mut Vec<u8>, out: &mut dyn Write, all: bool) -> std::io::Result<()>;
}

/// A writer that gathers what is written through it and passes it on through its [`Drain`]
/// in chunks, holding back what a later write could still change: a document of any size is
/// rewritten without ever being held whole. [`Write::flush`] writes out everything held; what
/// is dropped unflushed is lost, as with a `BufWriter` whose flush failed.
pub struct HeldWriter<W: Write, D: Drain> {
    drain: D,
    out: W,
    pending: Vec<u8>,
}

impl<W: Write, D: Drain> HeldWriter<W, D> {
    fn new(drain: D, out: W) -> Self {
        HeldWriter {
            drain,
            out,
            pending: Vec::new(),
        }
    }
}

impl<W: Write, D: Drain> Write for HeldWriter<W, D> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.pending.extend_from_slice(buf);
        if self.pending.len() >= HELD_CHUNK {
            self.drain.drain(&mut self.pending, &mut self.out, false)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.drain.drain(&mut self.pending, &mut self.out, true)?;
        self.out.flush()
    }
}

/// A writer that redacts a JSON document as it is written, as [`Redactor::redact_json`] does a
/// whole one. It holds back the bytes a value could still begin in (fewer than the longest
/// value's length), so a value split across writes is found all the same.
pub type RedactingWriter<W> = HeldWriter<W, JsonRedaction>;

/// The [`Drain`] of a [`RedactingWriter`].
pub struct JsonRedaction(Arc<Redactor>);

impl Drain for JsonRedaction {
    /// Writes out what no later byte can change: everything when `all`, else all but the last
    /// `longest - 1` bytes, or up to the end of a match that reaches into them.
    fn drain(&self, pending: &mut Vec<u8>, out: &mut dyn Write, all: bool) -> std::io::Result<()> {
        let needles = &self.0.json;
        let Some(matcher) = &needles.matcher else {
            out.write_all(pending)?;
            pending.clear();
            return Ok(());
        };
        // A match that starts before `cut` ends inside `pending` (it is at most `longest`
        // long), so every such match, and the longest at its start, is already in view.
        let cut = match all {
            true => pending.len(),
            false => pending.len().saturating_sub(needles.longest - 1),
        };
        let mut written = 0;
        for found in matcher.find_iter(&pending[..]) {
            if found.start() >= cut {
                break;
            }
            out.write_all(&pending[written..found.start()])?;
            out.write_all(needles.with[found.pattern().as_usize()].as_bytes())?;
            written = found.end();
        }
        let upto = cut.max(written);
        out.write_all(&pending[written..upto])?;
        pending.drain(..upto);
        Ok(())
    }
}

impl Redactor {
    /// A redactor for `secrets`, by name.
    pub fn new<'a>(secrets: impl IntoIterator<Item = (&'a str, &'a Secret)>) -> Self {
        Redactor::default().with(secrets)
    }

    /// This redactor plus `secrets`.
    fn with<'a>(&self, secrets: impl IntoIterator<Item = (&'a str, &'a Secret)>) -> Self {
        let (mut text, mut json) = (self.text.clone(), self.json.clone());
        for (name, secret) in secrets {
            let value = secret.expose();
            if value.chars().count() < MIN_REDACTED_LEN {
                continue;
            }
            let replacement = format!("[redacted:{}]", terminal_safe(name));
            let quoted = serde_json::to_string(value).expect("strings serialize");
            let escaped = &quoted[1..quoted.len() - 1];
            text.add(value, &replacement);
            text.add(escaped, &replacement);
            json.add(escaped, &replacement);
        }
        Redactor {
            text: text.build(),
            json: json.build(),
        }
    }

    /// Whether `text` holds a held value (one [`Redactor::redact`] would replace).
    pub fn finds(&self, text: &str) -> bool {
        self.text.found_in(text.as_bytes())
    }

    /// `text` with every held value replaced by `[redacted:NAME]`.
    pub fn redact<'t>(&self, text: &'t str) -> Cow<'t, str> {
        match self.text.replace(text.as_bytes()) {
            Cow::Borrowed(_) => Cow::Borrowed(text),
            // Whole UTF-8 needles replaced by ASCII leave valid UTF-8.
            Cow::Owned(bytes) => Cow::Owned(String::from_utf8_lossy(&bytes).into_owned()),
        }
    }

    /// Any bytes (a file a client left as an artefact, a tail of its output) with every held
    /// value replaced, as it appears in text or JSON-escaped.
    pub fn redact_bytes<'t>(&self, bytes: &'t [u8]) -> Cow<'t, [u8]> {
        self.text.replace(bytes)
    }

    /// A JSON document (a trace, a grade file) with every held value replaced inside its
    /// strings; it stays the same valid JSON.
    pub fn redact_json<'t>(&self, json: &'t [u8]) -> Cow<'t, [u8]> {
        self.json.replace(json)
    }

    /// A writer into `out` that redacts the JSON document written through it, as
    /// [`Redactor::redact_json`] would the whole (flush it at the end).
    pub fn json_writer<W: Write>(self: &Arc<Self>, out: W) -> RedactingWriter<W> {
        HeldWriter::new(JsonRedaction(self.clone()), out)
    }
}

/// The process-wide redactor: every value registered with [`hold`].
static HELD: RwLock<Option<Arc<Redactor>>> = RwLock::new(None);

/// Registers `name`'s `secret` with the process-wide redactor; from now on no sink writes it.
/// Warns when the value is too short to redact.
pub fn hold(name: &str, secret: &Secret) {
    if secret.expose().chars().count() < MIN_REDACTED_LEN && !secret.expose().is_empty() {
        tracing::warn!(
            "secret `{name}` is shorter than {MIN_REDACTED_LEN} characters: mst cannot redact \
             it from what it writes; use a longer value"
        );
    }
    let mut held = HELD.write().expect("redactor lock");
    let next = match held.as_deref() {
        Some(current) => current.with([(name, secret)]),
        None => Redactor::new([(name, secret)]),
    };
    *held = Some(Arc::new(next));
}

/// The process-wide redactor (empty until something is held).
pub fn redactor() -> Arc<Redactor> {
    HELD.read()
        .expect("redactor lock")
        .clone()
        .unwrap_or_default()
}

/// Text from someone else (a worker, a plugin, a machine, a dataset) made safe for a terminal
/// or a log: control characters other than newline and tab, and the Unicode marks that
/// reorder text on screen, are shown escaped (`\u001b`) instead of acting. The escape is
/// JSON's, so JSON on stdout stays valid JSON (every such character is in the BMP).
pub fn terminal_safe(text: &str) -> Cow<'_, str> {
    let unsafe_char = |c: char| {
        (c.is_control() && c != '\n' && c != '\t')
            || matches!(c, '\u{200e}' | '\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
    };
    if !text.chars().any(unsafe_char) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if unsafe_char(c) {
            out.push_str(&format!("\\u{:04x}", u32::from(c)));
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A writer into `out` that makes what is written through it [`terminal_safe`] as it goes; a
/// character split across writes is held until its last byte arrives, and bytes that are not
/// UTF-8 are written as U+FFFD (as [`clean_bytes`] does). Flush it at the end.
pub type TerminalSafeWriter<W> = HeldWriter<W, TerminalSafe>;

impl<W: Write> TerminalSafeWriter<W> {
    /// A writer into `out`.
    pub fn terminal_safe(out: W) -> Self {
        HeldWriter::new(TerminalSafe, out)
    }
}

/// The [`Drain`] of a [`TerminalSafeWriter`].
pub struct TerminalSafe;

impl Drain for TerminalSafe {
    /// Writes out every whole character held (everything when `all`); each byte that cannot
    /// begin or continue a character is one U+FFFD, as [`String::from_utf8_lossy`] has it.
    fn drain(&self, pending: &mut Vec<u8>, out: &mut dyn Write, all: bool) -> std::io::Result<()> {
        let mut at = 0;
        while at < pending.len() {
            let rest = &pending[at..];
            let (valid, bad) = match std::str::from_utf8(rest) {
                Ok(text) => (text, None),
                Err(e) => (
                    std::str::from_utf8(&rest[..e.valid_up_to()]).expect("valid up to here"),
                    Some(e.error_len()),
                ),
            };
            out.write_all(terminal_safe(valid).as_bytes())?;
            at += valid.len();
            match bad {
                None => {}
                Some(Some(len)) => {
                    out.write_all("\u{fffd}".as_bytes())?;
                    at += len;
                }
                // A character cut short at the end: it waits for its other bytes, unless
                // nothing more will come.
                Some(None) if all => {
                    out.write_all("\u{fffd}".as_bytes())?;
                    at = pending.len();
                }
                Some(None) => break,
            }
        }
        pending.drain(..at);
        Ok(())
    }
}

/// A writer into `out` for a JSON document a terminal shows: held secrets redacted inside its
/// strings ([`Redactor::json_writer`]) and control characters escaped ([`TerminalSafeWriter`]),
/// as [`clean`] does a whole text, with nothing the size of the document held. Flush it at the
/// end.
pub fn clean_json_writer<W: Write>(out: W) -> RedactingWriter<TerminalSafeWriter<W>> {
    redactor().json_writer(TerminalSafeWriter::terminal_safe(out))
}

/// What a terminal or a log gets of `text`: held secrets redacted, control characters escaped.
pub fn clean_text(text: &str) -> String {
    clean(text).into_owned()
}

/// [`clean_text`], borrowing `text` when it needs no change (a run's `--json` summary is
/// megabytes long, and is almost always clean).
pub fn clean(text: &str) -> Cow<'_, str> {
    match redactor().redact(text) {
        Cow::Borrowed(text) => terminal_safe(text),
        Cow::Owned(redacted) => Cow::Owned(terminal_safe(&redacted).into_owned()),
    }
}

/// [`clean_text`] for raw output (a worker's stderr): invalid UTF-8 is replaced, not kept.
pub fn clean_bytes(bytes: &[u8]) -> Vec<u8> {
    clean_text(&String::from_utf8_lossy(bytes)).into_bytes()
}

/// Rewrites the JSON file at `path` (a trace copied back from a machine) with every held
/// secret redacted; leaves it untouched when it holds none.
pub fn redact_file(path: &Path) -> Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    if let Cow::Owned(redacted) = redactor().redact_json(&bytes) {
        crate::files::write_atomic(path, &redacted)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_json_document_is_cleaned_as_the_whole_text_is() {
        let secret = Secret::new("canary-\u{1b}[31m-secret");
        let redactor = Arc::new(Redactor::new([("KEY", &secret)]));
        let document = serde_json::json!({
            "reason": format!("said {} then \u{202e}é\u{9b}", secret.expose()),
            "more": "x".repeat(3 * HELD_CHUNK),
        });
        let mut out = Vec::new();
        {
            let mut writer = redactor.json_writer(TerminalSafeWriter::terminal_safe(&mut out));
            // One byte at a time: every secret and character is split across writes.
            for byte in serde_json::to_vec_pretty(&document).unwrap() {
                writer.write_all(&[byte]).unwrap();
            }
            writer.flush().unwrap();
        }
        let whole = serde_json::to_string_pretty(&document).unwrap();
        let expected = terminal_safe(&redactor.redact(&whole)).into_owned();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out, expected);
        assert!(!out.contains("canary") && out.contains("[redacted:KEY]"));
        assert!(out.contains("\\u202e") && out.contains("é") && !out.contains('\u{9b}'));
        let back: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(back["more"], document["more"], "still the same JSON");

        // Bytes that are not UTF-8 become U+FFFD, once all is written.
        let mut out = Vec::new();
        let mut writer = TerminalSafeWriter::terminal_safe(&mut out);
        writer.write_all(b"ok \xff \xe2\x80").unwrap();
        writer.flush().unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "ok \u{fffd} \u{fffd}");
        // A bad byte within a chunk, and a character the chunk cuts, finished by the next write.
        let mut out = Vec::new();
        let mut writer = TerminalSafeWriter::terminal_safe(&mut out);
        let mut chunk = "x".repeat(HELD_CHUNK).into_bytes();
        chunk.extend_from_slice(b"\xffb\xc3");
        writer.write_all(&chunk).unwrap();
        writer.write_all(b"\xa9").unwrap();
        writer.flush().unwrap();
        let out = String::from_utf8(out).unwrap();
        assert_eq!(&out[HELD_CHUNK..], "\u{fffd}bé");
    }

    #[test]
    fn values_become_names_longest_first_and_short_ones_stay() {
        let (long, short, tiny) = (
            Secret::new("hunter2-and-more"),
            Secret::new("hunter2"),
            Secret::new("abc"),
        );
        let redactor = Redactor::new([("LONG", &long), ("SHORT", &short), ("TINY", &tiny)]);
        assert_eq!(
            redactor.redact("a hunter2-and-more b hunter2 c abc"),
            "a [redacted:LONG] b [redacted:SHORT] c abc"
        );
        assert!(matches!(redactor.redact("nothing here"), Cow::Borrowed(_)));
        assert!(Redactor::default().redact("hunter2").contains("hunter2"));
        // `finds` says what `redact` would replace.
        assert!(redactor.finds("id-hunter2-x") && !redactor.finds("id-abc"));
        assert!(!Redactor::default().finds("hunter2"));
    }

    #[test]
    fn json_escaped_values_are_found_in_json() {
        let secret = Secret::new("pa\"ss\\word\n");
        let redactor = Redactor::new([("PW", &secret)]);
        let json = serde_json::json!({"reason": format!("got {}", secret.expose())}).to_string();
        let redacted = redactor.redact_json(json.as_bytes()).into_owned();
        let back: serde_json::Value = serde_json::from_slice(&redacted).unwrap();
        assert_eq!(back["reason"], "got [redacted:PW]");
        assert_eq!(
            redactor.redact(secret.expose()),
            "[redacted:PW]",
            "as text too"
        );
        // A value that reads like JSON's own punctuation never breaks a document.
        let tricky = Secret::new("b\", \"c");
        let redactor = Redactor::new([("T", &tricky)]);
        let document = br#"{"a": "b", "c": "d"}"#;
        assert_eq!(redactor.redact_json(document).as_ref(), document);
    }

    #[test]
    fn a_document_written_in_pieces_is_redacted_as_the_whole_would_be() {
        let (long, short) = (
            Secret::new("s3cret-value-and-more"),
            Secret::new("s3cret-value"),
        );
        let redactor = Arc::new(Redactor::new([("LONG", &long), ("SHORT", &short)]));
        // Values at every offset, split across writes of every size, and past the chunk at
        // which the writer looks.
        let mut document = String::new();
        for i in 0..9000 {
            document.push_str(&format!(
                "{{\"n\": {i}, \"t\": \"a{}b s3cret-value-and-mor c\"}}\n",
                [long.expose(), short.expose()][i % 2]
            ));
        }
        let whole = redactor.redact_json(document.as_bytes()).into_owned();
        assert!(!String::from_utf8_lossy(&whole).contains("s3cret"));
        for piece in [1, 2, 7, 20, 21, 4096, 70_000] {
            let mut out = Vec::new();
            let mut writer = redactor.json_writer(&mut out);
            for chunk in document.as_bytes().chunks(piece) {
                writer.write_all(chunk).unwrap();
            }
            writer.flush().unwrap();
            assert!(out == whole, "written {piece} bytes at a time");
        }
        // With nothing held, what is written passes through.
        let mut out = Vec::new();
        let mut writer = Arc::new(Redactor::default()).json_writer(&mut out);
        writer.write_all(b"s3cret-value").unwrap();
        writer.flush().unwrap();
        assert_eq!(out, b"s3cret-value");
    }

    #[test]
    fn terminal_text_cannot_act() {
        assert_eq!(
            terminal_safe("a\x1b[2Jb\rc\u{202e}d\n\te"),
            "a\\u001b[2Jb\\u000dc\\u202ed\n\te"
        );
        assert!(matches!(terminal_safe("plain\n"), Cow::Borrowed(_)));
        // Inside a JSON string the escape is JSON's own.
        let json = terminal_safe("{\"id\": \"a\u{202e}b\"}");
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(value["id"], "a\u{202e}b");
    }
}
