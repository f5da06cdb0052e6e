//! Capabilities: what a plugin declares, what the operator grants, and the intersection the
//! plugin actually receives. Nothing outside the intersection is reachable from the sandbox.

use crate::secrets::Secret;
use mst_argv_patterns::{Declaration, TEMPLATE};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

/// A capability as the host records it (the WIT `capability` variant, in serde form).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum Capability {
    /// Run `program` with arguments matching `args` (`*` wildcards; empty = any).
    Exec { program: String, args: Vec<String> },
    /// Read files below `path`.
    ReadDir { path: String },
    /// Send HTTP requests to `host`.
    Http { host: String },
    /// Call model `provider`.
    Model { provider: String },
    /// Read secret `name`.
    Secret { name: String },
}

impl fmt::Display for Capability {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Capability::Exec { program, args } if args.is_empty() => {
                write!(f, "exec {program} (any arguments)")
            }
            Capability::Exec { program, args } => write!(f, "exec {program} {}", args.join(" ")),
            Capability::ReadDir { path } => write!(f, "read-dir {path}"),
            Capability::Http { host } => write!(f, "http {host}"),
            Capability::Model { provider } => write!(f, "model {provider}"),
            Capability::Secret { name } => write!(f, "secret {name}"),
        }
    }
}

impl Capability {
    /// The command-line flag an operator uses to grant this capability.
    pub fn grant_flag(&self) -> String {
        match self {
            Capability::Exec { program, .. } => format!("--allow-exec {program}"),
            Capability::ReadDir { path } => format!("--allow-read {path}"),
            Capability::Http { host } => format!("--allow-http {host}"),
            Capability::Model { provider } => format!("--allow-model {provider}"),
            Capability::Secret { name } => format!("--allow-secret {name}"),
        }
    }
}

/// What the operator grants, from flags or the eval config.
#[derive(Debug, Clone, Default)]
pub struct Grants {
    /// Programs that may be run (by name or absolute path).
    pub exec: BTreeSet<String>,
    /// Host directories that may be read.
    pub read_dirs: Vec<PathBuf>,
    /// HTTP hosts that may be called.
    pub http: BTreeSet<String>,
    /// Model providers that may be called.
    pub models: BTreeSet<String>,
    /// Secrets by name, with their values.
    pub secrets: BTreeMap<String, Secret>,
    /// Environment variables a runner plugin's containers may receive, by name, with their
    /// values: configuration, never secrets (Docker shows them to anyone who can inspect).
    pub env: BTreeMap<String, String>,
    /// How to reach the run's model providers, for the `model` import.
    pub model_access: Option<Arc<crate::llm::ModelAccess>>,
}

/// The operator's grant lists as given, before they are checked.
#[derive(Debug, Clone, Copy)]
pub struct GrantLists<'a> {
    pub exec: &'a [String],
    pub http: &'a [String],
    pub models: &'a [String],
    /// Directories, already resolved against where they were written.
    pub read_dirs: &'a [PathBuf],
    /// Names of environment variables whose values are granted as secrets.
    pub secrets: &'a [String],
    /// Names of environment variables a runner plugin's containers may receive.
    pub env: &'a [String],
}

impl Grants {
    /// Checks the lists and builds the grants: every directory must exist, every secret must be
    /// set. `spell(list)` names a list in errors as the operator wrote it (`--allow-read` on
    /// the command line, `allowRead` in a config) for the lists `read` and `secret`.
    pub fn from_lists(
        lists: GrantLists<'_>,
        spell: impl Fn(&str) -> String,
    ) -> anyhow::Result<Self> {
        use anyhow::Context as _;
        let mut grants = Grants {
            exec: lists.exec.iter().cloned().collect(),
            http: lists.http.iter().cloned().collect(),
            models: lists.models.iter().cloned().collect(),
            ..Grants::default()
        };
        for dir in lists.read_dirs {
            let canonical = dir.canonicalize().with_context(|| {
                format!("{} {}: no such directory", spell("read"), dir.display())
            })?;
            if !canonical.is_dir() {
                anyhow::bail!("{} {}: not a directory", spell("read"), dir.display());
            }
            grants.read_dirs.push(canonical);
        }
        for name in lists.secrets {
            let value = std::env::var(name).with_context(|| {
                format!(
                    "{} {name}: the environment variable {name} is not set",
                    spell("secret")
                )
            })?;
            crate::secrets::hold(name, &Secret::new(value.clone()));
            grants.secrets.insert(name.clone(), Secret::new(value));
        }
        for name in lists.env {
            let value = std::env::var(name).with_context(|| {
                format!(
                    "{} {name}: the environment variable {name} is not set",
                    spell("env")
                )
            })?;
            grants.env.insert(name.clone(), value);
        }
        Ok(grants)
    }
}

/// One program a plugin may run, with the argument patterns it declared.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecGrant {
    pub program: String,
    /// The argument patterns as declared: an argv template (`{argv}` first), a bag, or none.
    pub args: Vec<String>,
}

impl ExecGrant {
    /// The arguments as a reviewer reads them: a template's words, a bag's patterns, or
    /// `(any arguments)`.
    pub fn describe(&self) -> String {
        match self.args.split_first() {
            None => "(any arguments)".to_string(),
            Some((first, words)) if first == TEMPLATE => words.join(" "),
            Some(_) => format!(
                "{} (each argument one of these, in any order)",
                self.args.join(" ")
            ),
        }
    }
}

/// A `model` capability naming this admits whichever providers the operator grants (a judge
/// that works with any model, whose provider the eval chooses).
pub const ANY_PROVIDER: &str = "*";

/// The intersection of a plugin's declaration and the operator's grants: exactly what the
/// sandbox lets through.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Effective {
    pub exec: Vec<ExecGrant>,
    pub read_dirs: Vec<PathBuf>,
    pub http: BTreeSet<String>,
    pub models: BTreeSet<String>,
    /// Granted secret names; values are held apart and never serialized.
    pub secret_names: BTreeSet<String>,
    #[serde(skip)]
    pub(crate) secrets: BTreeMap<String, Secret>,
    /// Environment variables passed to a runner plugin's containers when its spec names them
    /// (there is nothing to declare: the spec's `env-names` is the request). Names are
    /// recorded; values are held apart.
    pub env_names: BTreeSet<String>,
    #[serde(skip)]
    pub(crate) env: BTreeMap<String, String>,
    /// How to reach the granted model providers.
    #[serde(skip)]
    pub(crate) model_access: Option<Arc<crate::llm::ModelAccess>>,
}

impl Effective {
    /// Nothing at all: used while reading a plugin's own description.
    pub fn none() -> Self {
        Self::default()
    }

    /// Intersects `declared` with `grants`.
    pub fn intersect(declared: &[Capability], grants: &Grants) -> Self {
        let mut effective = Effective {
            env_names: grants.env.keys().cloned().collect(),
            env: grants.env.clone(),
            model_access: grants.model_access.clone(),
            ..Effective::default()
        };
        for capability in declared {
            match capability {
                Capability::Exec { program, args } if grants.exec.contains(program) => {
                    effective.exec.push(ExecGrant {
                        program: program.clone(),
                        args: args.clone(),
                    })
                }
                Capability::ReadDir { path } => {
                    let declared = normalize(Path::new(path));
                    for granted in &grants.read_dirs {
                        let granted = normalize(granted);
                        if granted.starts_with(&declared) && !effective.read_dirs.contains(&granted)
                        {
                            effective.read_dirs.push(granted);
                        }
                    }
                }
                Capability::Http { host } if grants.http.contains(host) => {
                    effective.http.insert(host.clone());
                }
                // `model *`: whichever providers the operator grants.
                Capability::Model { provider } if provider == ANY_PROVIDER => {
                    effective.models.extend(grants.models.iter().cloned());
                }
                Capability::Model { provider } if grants.models.contains(provider) => {
                    effective.models.insert(provider.clone());
                }
                Capability::Secret { name } => {
                    if let Some(value) = grants.secrets.get(name) {
                        effective.secret_names.insert(name.clone());
                        effective.secrets.insert(name.clone(), value.clone());
                    }
                }
                _ => {}
            }
        }
        effective
    }

    /// These grants with each `{option:NAME}` in an `exec` argument pattern replaced by the
    /// runner option `NAME` the operator gave (`{option:NAME=DEFAULT}`: `DEFAULT` when they gave
    /// none), so that a runner plugin's declaration pins it to what the operator chose:
    /// `kubectl --context={option:context}` runs on no other cluster. A pattern whose option is
    /// unset and has no default stays as written, matching only itself. A value holding `*`
    /// is refused: it would widen the pattern.
    pub fn pinned_to(&self, options: &BTreeMap<String, String>) -> Result<Self, String> {
        let mut pinned = self.clone();
        for grant in &mut pinned.exec {
            grant.args = mst_argv_patterns::pin(&grant.args, options)?;
        }
        Ok(pinned)
    }

    /// Whether `program args…` may run: the program is granted and one of its declarations
    /// admits the arguments (see [`mst_argv_patterns`]: a template word for word, a bag
    /// pattern by pattern, no patterns any arguments).
    pub fn allows_exec(&self, program: &str, args: &[String]) -> Result<(), String> {
        let grants: Vec<&ExecGrant> = self.exec.iter().filter(|g| g.program == program).collect();
        if grants.is_empty() {
            let allowed: BTreeSet<&str> = self.exec.iter().map(|g| g.program.as_str()).collect();
            return Err(format!(
                "running `{program}` is not allowed: a plugin runs only programs it declares and \
                 the operator grants (--allow-exec {program}); this plugin may run: {}",
                if allowed.is_empty() {
                    "nothing".to_string()
                } else {
                    allowed.into_iter().collect::<Vec<_>>().join(", ")
                }
            ));
        }
        // Of the declarations that refuse, the one that came furthest is named: with a
        // template per step, that is the step the plugin was taking.
        let mut closest: Option<(usize, String)> = None;
        for grant in &grants {
            let refusal = match Declaration::parse(&grant.args) {
                Ok(declaration) => match declaration.admits(args) {
                    Ok(()) => return Ok(()),
                    Err(refusal) => refusal,
                },
                Err(why) => mst_argv_patterns::Refusal {
                    at: 0,
                    message: why,
                },
            };
            if closest.as_ref().is_none_or(|(at, _)| refusal.at > *at) {
                let why = format!("`{program} {}`: {refusal}", grant.describe());
                closest = Some((refusal.at, why));
            }
        }
        let (_, why) = closest.expect("one declaration at least");
        let others = match grants.len() {
            1 => String::new(),
            n => format!(" (nor any of its {} other declarations)", n - 1),
        };
        Err(format!(
            "`{program} {}` matches no declaration of `{program}`: the closest is {why}{others}",
            args.join(" ")
        ))
    }

    /// A secret's value, if granted.
    pub fn secret(&self, name: &str) -> Option<&Secret> {
        self.secrets.get(name)
    }

    /// An environment variable's value for a runner plugin's containers, if passed.
    pub fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(String::as_str)
    }
}

/// Programs that run whatever program or script they are given: granting one with any
/// argument (a script, `-c`, `-e`, `-`, a file) or any stdin is granting every command.
const RUNS_ANYTHING: &[&str] = &[
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "mksh",
    "ash",
    "fish",
    "csh",
    "tcsh",
    "busybox",
    "env",
    "xargs",
    "nohup",
    "nice",
    "timeout",
    "setsid",
    "sudo",
    "doas",
    "su",
    "node",
    "nodejs",
    "deno",
    "bun",
    "perl",
    "ruby",
    "php",
    "lua",
    "tclsh",
    "pwsh",
    "osascript",
    "awk",
    "gawk",
];

/// Whether `program` (by its file name) is an interpreter or a launcher (see [`RUNS_ANYTHING`];
/// also `python`, `python3`, `python3.12`, …).
fn runs_anything(program: &str) -> bool {
    let name = program.rsplit('/').next().unwrap_or(program);
    RUNS_ANYTHING.contains(&name)
        || name
            .strip_prefix("python")
            .is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit() || c == '.'))
}

/// Whether argument pattern `pattern` names the program's stdin as a file to read (`-`,
/// `--filename=-`), so that the plugin's `stdin` becomes the program's input file.
fn reads_stdin_file(pattern: &str) -> bool {
    pattern == "-" || pattern.ends_with("=-")
}

/// Whether `program` with the patterns `args` may read its input from stdin without saying so:
/// `cpio` and `dd` always can, and `tar` does when no `-f`/`--file` pattern names an archive
/// (GNU tar's default archive is stdin, so a granted `tar -x` extracts what the plugin writes),
/// unless all it may do is create one (`-c`), which it writes to stdout.
fn reads_stdin_by_default(program: &str, args: &[String]) -> bool {
    match program.rsplit('/').next().unwrap_or(program) {
        "cpio" | "dd" => true,
        "tar" => {
            let names_file = args
                .iter()
                .any(|a| a.starts_with("-f") || a == "--file" || a.starts_with("--file="));
            let only_creates = args.iter().any(|a| a == "-c" || a == "--create")
                && args.iter().all(|a| {
                    !a.starts_with('-')
                        || a.starts_with("--")
                        || !a[1..].contains(['x', 't', 'd', 'r', 'u', 'A', 'T'])
                })
                && !args.iter().any(|a| {
                    [
                        "--extract",
                        "--get",
                        "--list",
                        "--diff",
                        "--compare",
                        "--append",
                        "--update",
                        "--files-from",
                        "--concatenate",
                    ]
                    .iter()
                    .any(|o| a.starts_with(o))
                });
            !names_file && !only_creates
        }
        _ => false,
    }
}

/// Whether `program` is `kubectl`, whose manifests read from stdin the host checks before it
/// runs (see [`super::manifest`]).
pub(crate) fn is_kubectl(program: &str) -> bool {
    program.rsplit('/').next().unwrap_or(program) == "kubectl"
}

/// Why an `exec` declaration admits any command, or options the operator cannot see in
/// advance, if it does: no patterns at all; an interpreter or launcher (`sh -c *`, `python`,
/// `node`: whatever it is given, it runs); a file read from the plugin's stdin (`tar -f -`:
/// the plugin writes the input, so the program does whatever that input says; `kubectl`'s
/// manifests are the exception, being checked by the host); or an option pattern like `-*` or
/// `-o*` (options are where programs hide ways to run other programs, `ssh -oProxyCommand=…`,
/// or read files, `kubectl --kubeconfig=…`).
pub fn broad_exec(program: &str, declared: &[String]) -> Option<String> {
    let Some(args) = &patterns(declared) else {
        return Some(format!("`{program}` with any arguments"));
    };
    if runs_anything(program) {
        return Some(format!(
            "`{program} {}`, and `{program}` runs whatever script or program it is given",
            args.join(" ")
        ));
    }
    if reads_stdin_by_default(program, args) {
        return Some(format!(
            "`{program} {}`, which reads its input from the plugin's stdin when it names no \
             file, and does what that input says",
            args.join(" ")
        ));
    }
    if !is_kubectl(program) {
        if let Some(p) = args.iter().find(|p| reads_stdin_file(p)) {
            return Some(format!(
                "`{program}` with `{p}`, which reads input the plugin writes (its stdin) and \
                 does what that input says"
            ));
        }
    }
    args.iter()
        .find(|p| {
            // `-oPort=*` pins the option and leaves the value open; `-o*` leaves the option open.
            let before_wildcard = p.split('*').next().unwrap_or_default();
            p.starts_with('-') && p.contains('*') && !before_wildcard.contains('=')
        })
        .map(|p| format!("`{program}` with any option matching `{p}`"))
}

/// A declaration's patterns as a reviewer reads them (a template's words without their
/// brackets), or `None` for a declaration of no patterns, which admits any arguments. A
/// template that does not parse is judged as written (loading reports it as an error).
fn patterns(declared: &[String]) -> Option<Vec<String>> {
    match Declaration::parse(declared) {
        Ok(Declaration::AnyArguments) => None,
        Ok(declaration) => Some(
            declaration
                .patterns()
                .into_iter()
                .map(String::from)
                .collect(),
        ),
        Err(_) => Some(declared.to_vec()),
    }
}

/// Why an `exec` declaration of patterns is matched as a bag of words, if it is: each
/// argument against any pattern, in any order and number, which admits combinations its
/// author never wrote (`rm -rf` with another step's paths). An argv template (`{argv}` first)
/// is matched word by word.
pub fn bag_of_words(program: &str, declared: &[String]) -> Option<String> {
    matches!(Declaration::parse(declared), Ok(Declaration::Bag(_))).then(|| {
        format!(
            "`{program}` argument patterns as a bag of words (any argument may be any of them, in \
             any order and number): declare argv templates, `{TEMPLATE}` first, matched word by word"
        )
    })
}

/// Where an `exec` declaration lets a program that runs commands elsewhere choose the place, if
/// it does: an `ssh` destination pattern with a wildcard (any host the operator's keys reach),
/// `kubectl --context=*` or `--namespace=*` (any cluster or namespace their kubeconfig
/// reaches: pin it with `{option:NAME}`), `--jobid=*` (any of the user's Slurm jobs).
pub fn remote_wildcard(program: &str, declared: &[String]) -> Option<String> {
    let args = &patterns(declared).unwrap_or_default();
    let name = program.rsplit('/').next().unwrap_or(program);
    let open = |p: &&String| p.contains('*');
    let found = match name {
        // The destination: the first word that is no option.
        "ssh" => args.iter().find(|p| !p.starts_with('-')).filter(open),
        "kubectl" => args.iter().filter(open).find(|p| {
            ["--context=", "--namespace=", "--cluster=", "--server="]
                .iter()
                .any(|o| p.starts_with(o))
        }),
        "srun" | "sattach" | "scancel" | "salloc" => args
            .iter()
            .filter(open)
            .find(|p| p.starts_with("--jobid=") || (name == "scancel" && !p.starts_with('-'))),
        _ => None,
    }?;
    let reach = match name {
        "ssh" => "runs commands on any host the operator's ssh keys and configuration reach",
        "kubectl" => "runs commands on any cluster or namespace the operator's kubeconfig reaches",
        "scancel" => "cancels any Slurm job of the operator's user",
        _ => "runs commands in any Slurm job of the operator's user",
    };
    Some(format!("`{name}` with `{found}`, which {reach}"))
}

/// The warning for a granted `exec` declaration that admits any command (see [`broad_exec`]),
/// or lets the plugin choose where remote commands run ([`remote_wildcard`]), shown before a
/// run and by `mst plugin check`.
pub fn broad_grant_warning(grant: &ExecGrant) -> Option<String> {
    if let Some(broad) = broad_exec(&grant.program, &grant.args) {
        return Some(format!(
            "it declared {broad}, which you granted: that admits any command, or options that \
             run other programs or read files"
        ));
    }
    remote_wildcard(&grant.program, &grant.args).map(|remote| {
        format!(
            "it declared {remote}, which you granted: the plugin, not you, chooses where they run"
        )
    })
}

/// Declared capabilities that the grants leave out, for warnings.
pub fn not_granted(declared: &[Capability], effective: &Effective) -> Vec<Capability> {
    declared
        .iter()
        .filter(|c| match c {
            Capability::Exec { program, .. } => {
                !effective.exec.iter().any(|g| &g.program == program)
            }
            Capability::ReadDir { path } => {
                let d = normalize(Path::new(path));
                !effective.read_dirs.iter().any(|g| g.starts_with(&d))
            }
            Capability::Http { host } => !effective.http.contains(host),
            Capability::Model { provider } if provider == ANY_PROVIDER => {
                effective.models.is_empty()
            }
            Capability::Model { provider } => !effective.models.contains(provider),
            Capability::Secret { name } => !effective.secret_names.contains(name),
        })
        .cloned()
        .collect()
}

/// Lexically normalizes a path (no file system access): drops `.` and resolves `..` so that
/// `starts_with` cannot be fooled by `/tmp/../etc`.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(program: &str, args: &[&str]) -> Capability {
        Capability::Exec {
            program: program.into(),
            args: args.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn a_model_capability_for_any_provider_takes_exactly_the_granted_ones() {
        let declared = [Capability::Model {
            provider: ANY_PROVIDER.to_string(),
        }];
        let none = Effective::intersect(&declared, &Grants::default());
        assert!(none.models.is_empty());
        assert_eq!(not_granted(&declared, &none), declared.to_vec());
        let grants = Grants {
            models: ["acme".to_string(), "mock".to_string()].into(),
            ..Grants::default()
        };
        let effective = Effective::intersect(&declared, &grants);
        assert_eq!(effective.models, grants.models);
        assert!(not_granted(&declared, &effective).is_empty());
    }

    #[test]
    fn interpreters_and_stdin_inputs_are_broad() {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for program in [
            "sh",
            "/bin/bash",
            "python3",
            "python3.12",
            "python",
            "node",
            "env",
        ] {
            assert!(
                broad_exec(program, &words(&["-c", "*"])).is_some(),
                "{program}"
            );
            assert!(
                broad_exec(program, &words(&["exact"])).is_some(),
                "{program}"
            );
        }
        assert_eq!(broad_exec("pythonista", &words(&["x"])), None);
        assert!(broad_exec("tar", &words(&["-x", "-f", "-"])).is_some());
        assert!(broad_exec("psql", &words(&["--file=-"])).is_some());
        // Programs whose input is stdin unless they are told a file (security review H2).
        let bare_tar = broad_exec("/usr/bin/tar", &words(&["-x", "-C", "{workdir}"]));
        assert!(bare_tar.is_some_and(|why| why.contains("stdin")));
        assert!(broad_exec("cpio", &words(&["-i"])).is_some());
        assert!(broad_exec("dd", &words(&["of=/tmp/x"])).is_some());
        assert_eq!(broad_exec("tar", &words(&["-x", "-f", "/srv/a.tar"])), None);
        // Creating only, tar writes its archive to stdout and reads no stdin.
        assert_eq!(
            broad_exec("tar", &words(&["-c", "-C", "{workdir}", "{src}"])),
            None
        );
        for reads in [
            &["-c", "-T", "-"][..],
            &["-c", "-x"],
            &["-c", "--files-from=x"],
        ] {
            assert!(broad_exec("tar", &words(reads)).is_some(), "{reads:?}");
        }
        // kubectl's stdin manifests are checked by the host before kubectl sees them.
        assert_eq!(
            broad_exec("kubectl", &words(&["apply", "--filename=-"])),
            None
        );
    }

    #[test]
    fn broad_option_patterns_are_named() {
        assert!(broad_exec("ssh", &[]).is_some());
        for broad in ["-*", "--*", "-o*"] {
            assert!(broad_exec("ssh", &[broad.to_string()]).is_some(), "{broad}");
        }
        let narrow = ["-oPort=*", "--namespace=*", "*", "-T"].map(String::from);
        assert_eq!(broad_exec("ssh", &narrow), None);
    }

    #[test]
    fn option_placeholders_pin_a_runner_to_the_operators_choice() {
        let declared = [exec(
            "kubectl",
            &[
                "--context={option:context}",
                "--namespace={option:namespace=default}",
                "get",
            ],
        )];
        let grants = Grants {
            exec: ["kubectl".to_string()].into(),
            ..Grants::default()
        };
        let effective = Effective::intersect(&declared, &grants);
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let options: BTreeMap<String, String> =
            [("context".to_string(), "prod".to_string())].into();
        let pinned = effective.pinned_to(&options).unwrap();
        assert!(pinned
            .allows_exec(
                "kubectl",
                &args(&["--context=prod", "--namespace=default", "get"])
            )
            .is_ok());
        for other in ["--context=staging", "--namespace=kube-system"] {
            assert!(
                pinned.allows_exec("kubectl", &args(&[other])).is_err(),
                "{other}"
            );
        }
        // Unset, without a default: the pattern admits only its own text, no context at all.
        let unset = effective.pinned_to(&BTreeMap::new()).unwrap();
        assert!(unset
            .allows_exec("kubectl", &args(&["--context=prod"]))
            .is_err());
        assert!(unset.allows_exec("kubectl", &args(&["get"])).is_ok());
        // A value that would widen the pattern is refused, naming the option.
        let wide: BTreeMap<String, String> = [("context".to_string(), "*".to_string())].into();
        assert!(effective
            .pinned_to(&wide)
            .unwrap_err()
            .contains("--runner-option context=*"));
    }

    #[test]
    fn remote_wildcards_are_named_and_pinned_patterns_are_not() {
        let words = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for (program, args, named) in [
            ("ssh", &["-T", "--", "**"][..], "`**`"),
            ("kubectl", &["--context=**", "get"], "--context=**"),
            ("kubectl", &["--namespace=*"], "--namespace=*"),
            ("srun", &["--jobid=*", "--"], "--jobid=*"),
            ("scancel", &["--quiet", "*"], "`*`"),
        ] {
            let found = remote_wildcard(program, &words(args)).unwrap_or_default();
            assert!(found.contains(named), "{program}: {found}");
        }
        for (program, args) in [
            ("kubectl", &["--context={option:context}", "pod/mst-*"][..]),
            ("ssh", &["-T", "-oPort=*", "host-1"]),
            ("tar", &["-c", "*"]),
        ] {
            assert_eq!(remote_wildcard(program, &words(args)), None, "{program}");
        }
    }

    #[test]
    fn exec_needs_declaration_and_grant() {
        let declared = [exec("ssh", &["-p", "2222", "ci-*"])];
        let mut grants = Grants::default();
        let none = Effective::intersect(&declared, &grants);
        assert!(none
            .allows_exec("ssh", &[])
            .unwrap_err()
            .contains("--allow-exec ssh"));

        grants.exec.insert("ssh".into());
        grants.exec.insert("sh".into());
        let some = Effective::intersect(&declared, &grants);
        assert!(some
            .allows_exec("ssh", &["-p".into(), "2222".into(), "ci-1".into()])
            .is_ok());
        assert!(some
            .allows_exec("ssh", &["-oProxyCommand=x".into()])
            .is_err());
        assert!(
            some.allows_exec("sh", &[]).is_err(),
            "granted but not declared"
        );
    }

    #[test]
    fn any_template_of_the_program_admits_and_none_admits_a_mix() {
        let declared = [
            exec(
                "srun",
                &["{argv}", "--jobid=*", "--", "mkdir", "-m0700", "/**/mst-*"],
            ),
            exec(
                "srun",
                &["{argv}", "--jobid=*", "--", "tar", "-x", "-C", "{workdir}"],
            ),
            exec("scancel", &["--quiet", "*"]),
        ];
        let grants = Grants {
            exec: ["srun".to_string(), "scancel".to_string()].into(),
            ..Grants::default()
        };
        let effective = Effective::intersect(&declared, &grants);
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        for fine in [
            &["--jobid=7", "--", "mkdir", "-m0700", "/tmp/mst-a"][..],
            &["--jobid=7", "--", "tar", "-x", "-C", "{workdir}"],
        ] {
            assert!(
                effective.allows_exec("srun", &args(fine)).is_ok(),
                "{fine:?}"
            );
        }
        // Words of one template with another's (a bag of the same words admits it).
        let mixed = effective
            .allows_exec(
                "srun",
                &args(&["--jobid=7", "--", "tar", "-x", "-C", "/tmp/mst-a"]),
            )
            .unwrap_err();
        assert!(
            mixed.contains("matches no declaration of `srun`") && mixed.contains("argument 6"),
            "{mixed}"
        );
        // A bag keeps working as it did.
        assert!(effective
            .allows_exec("scancel", &args(&["42", "--quiet", "43"]))
            .is_ok());
        assert!(bag_of_words("scancel", &args(&["--quiet", "*"])).is_some());
        assert_eq!(bag_of_words("srun", &args(&["{argv}", "--quiet"])), None);
        assert_eq!(bag_of_words("srun", &[]), None);
    }

    #[test]
    fn templates_are_reviewed_like_bags() {
        let words = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // A bare `tar -x` reads the plugin's stdin, written as a template too.
        assert!(broad_exec("tar", &words(&["{argv}", "-x", "-C", "{workdir}"])).is_some());
        assert!(broad_exec("ssh", &words(&["{argv}", "[-o*]", "--", "h"])).is_some());
        // A template of no words admits no arguments: nothing broad about it.
        assert_eq!(broad_exec("true", &words(&["{argv}"])), None);
        let ssh = words(&["{argv}", "-T", "[-oPort=*]", "--", "*", "rm -rf /**/mst-*"]);
        let found = remote_wildcard("ssh", &ssh).unwrap();
        assert!(found.contains("`*`"), "{found}");
        let pinned = words(&["{argv}", "-T", "--", "ci-1", "rm -rf /**/mst-*"]);
        assert_eq!(remote_wildcard("ssh", &pinned), None);
        let grant = ExecGrant {
            program: "ssh".into(),
            args: pinned,
        };
        assert_eq!(grant.describe(), "-T -- ci-1 rm -rf /**/mst-*");
    }

    #[test]
    fn read_dirs_must_lie_inside_a_declared_dir() {
        let declared = [Capability::ReadDir {
            path: "/data".into(),
        }];
        let grants = Grants {
            read_dirs: vec!["/data/evals".into(), "/etc".into(), "/data/../etc".into()],
            ..Grants::default()
        };
        let effective = Effective::intersect(&declared, &grants);
        assert_eq!(effective.read_dirs, vec![PathBuf::from("/data/evals")]);
    }

    #[test]
    fn secrets_never_print() {
        let secret = Secret::new("hunter2");
        assert!(!format!("{secret:?}").contains("hunter2"));
        let declared = [Capability::Secret {
            name: "TOKEN".into(),
        }];
        let mut grants = Grants::default();
        grants.secrets.insert("TOKEN".into(), secret);
        let effective = Effective::intersect(&declared, &grants);
        assert_eq!(effective.secret("TOKEN").unwrap().expose(), "hunter2");
        assert!(!serde_json::to_string(&effective)
            .unwrap()
            .contains("hunter2"));
        assert!(!format!("{effective:?}").contains("hunter2"));
    }

    #[test]
    fn not_granted_lists_the_rest() {
        let declared = [
            exec("echo", &[]),
            Capability::Model {
                provider: "anthropic".into(),
            },
        ];
        let grants = Grants {
            exec: ["echo".to_string()].into(),
            ..Grants::default()
        };
        let effective = Effective::intersect(&declared, &grants);
        assert_eq!(
            not_granted(&declared, &effective),
            vec![declared[1].clone()]
        );
    }
}
