//! Errors that help: a serde error located in its file, with the closest known key of the
//! mistyped level suggested.

use std::path::Path;

/// Levenshtein distance, for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut previous = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let current = row[j + 1];
            row[j + 1] = (previous + usize::from(ca != *cb))
                .min(row[j] + 1)
                .min(row[j + 1] + 1);
            previous = current;
        }
    }
    row[b.len()]
}

/// The key of `known` closest to `unknown`, if it is close enough to be a typo.
pub fn suggest<'k>(unknown: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (distance(&unknown.to_lowercase(), &k.to_lowercase()), *k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 4))
        .min()
        .map(|(_, k)| k)
}

/// The "did you mean" for serde's unknown-field `message`, chosen among the keys serde lists
/// as expected there: the keys of that level only, so `mode` inside a server entry is never
/// taken for the top level's `model`.
fn did_you_mean(message: &str) -> Option<String> {
    let rest = message.strip_prefix("unknown field `")?;
    let (key, expected) = rest.split_once('`')?;
    let known: Vec<&str> = expected.split('`').skip(1).step_by(2).collect();
    suggest(key, &known).map(|k| format!(" (did you mean `{k}`?)"))
}

/// A serde error on a value (no position) with the closest key of its level suggested, for
/// objects read from within the config such as `clientOptions` and case inputs.
pub fn suggesting(error: serde_json::Error) -> anyhow::Error {
    let text = error.to_string();
    anyhow::anyhow!("{text}{}", did_you_mean(&text).unwrap_or_default())
}

/// `file:line:column: message (did you mean …?)` for a serde error; `first_line` is the line
/// the parsed text starts on in `file` (1 for a whole file, the line of a JSONL record).
pub fn located(file: &Path, first_line: usize, error: &serde_json::Error) -> String {
    let text = error.to_string();
    let message = text.split(" at line").next().unwrap_or(&text);
    format!(
        "{}:{}:{}: {message}{}",
        file.display(),
        first_line + error.line().max(1) - 1,
        error.column(),
        did_you_mean(message).unwrap_or_default()
    )
}
