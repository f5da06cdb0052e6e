//! `mst plugin …`: check, install (from a file or an OCI registry), push, list, info, remove,
//! new, and trying a plugin on one input.

use super::{scaffold, Code, Exit};
use crate::eval::trial::{CaseRecord, TrialRecord};
use crate::files::read_input;
use crate::home::Home;
use crate::plugin::capabilities::GrantLists;
use crate::plugin::check::CheckReport;
use crate::plugin::inspect::HostRelease;
use crate::plugin::installed::{InstallStore, InstalledPlugin, Origin, PluginSource};
use crate::plugin::loaded::{FailedStep, LoadError};
use crate::plugin::oci;
use crate::plugin::set::PluginLoader;
use crate::plugin::{Grants, Kind, Limits, LoadedPlugin, PluginHost};
use crate::run::dry_run::{self, DryRunRequest};
use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;
use std::path::{Path, PathBuf};

#[derive(Subcommand, Debug)]
pub(crate) enum PluginCommand {
    /// Is this component compatible with this mst? Exit 0 yes, 1 no, 2 not a component.
    Check(CheckArgs),
    /// Check a component and store it by name, version and digest: a .wasm file, or
    /// oci://REGISTRY/REPOSITORY:TAG pulled and verified.
    Install {
        /// The .wasm file, or an oci:// reference.
        plugin: String,
        /// Replace an installed build of the same name and version.
        #[arg(long)]
        force: bool,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// Check a component and push it to an OCI registry as a wasm artifact.
    Push {
        /// The .wasm file (or an installed plugin's name).
        plugin: String,
        /// Where: oci://REGISTRY/REPOSITORY:TAG.
        reference: String,
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        registry: RegistryArgs,
    },
    /// List installed plugins.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show an installed plugin (NAME or NAME@VERSION) or a .wasm file.
    Info {
        plugin: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove an installed plugin: every version of NAME, or NAME@VERSION.
    Remove {
        plugin: String,
        #[arg(long)]
        json: bool,
    },
    /// Create a new plugin project that builds and passes `mst plugin check`.
    New {
        /// What kind of plugin.
        kind: NewKind,
        /// The project's name: lowercase letters, digits and dashes.
        name: String,
        /// Where to create the project [default: ./NAME].
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The namespace in the plugin's name (`NAMESPACE/grader/NAME`).
        #[arg(long, default_value = "local")]
        namespace: String,
        /// The language: Rust (the SDK), Python (componentize-py) or JavaScript
        /// (ComponentizeJS).
        #[arg(long, value_enum, default_value_t = scaffold::Lang::Rust)]
        lang: scaffold::Lang,
    },
    /// Score one trial with a grader: from a trial JSON file, or a final answer given inline.
    Grade(GradeArgs),
    /// Resolve a dataset with a dataset plugin and print its cases.
    Resolve(ResolveArgs),
}

/// `mst plugin check`.
#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    /// The .wasm file, or an installed plugin's name.
    plugin: String,
    /// Print one JSON object (schema `mst.plugin-check/v1`) instead of a report.
    #[arg(long)]
    json: bool,
    /// Check against the plugin ABI of mst VERSION (a release this binary knows) instead of
    /// this mst's own.
    #[arg(long, value_name = "VERSION", conflicts_with = "dry_run")]
    host_version: Option<String>,
    /// For a runner plugin, then: one machine, one trial (`sh -c cat` on the machine, or
    /// --case of --config), dispose, each step timed. Exit 1 if any step fails.
    #[arg(long)]
    dry_run: bool,
    /// An option for the runner in the dry run (`key=value`). Repeatable.
    #[arg(long = "runner-option", value_name = "KEY=VALUE", requires = "dry_run")]
    runner_options: Vec<String>,
    /// Dry-run one case of this eval config (with --case) instead of the built-in one.
    #[arg(long, short = 'c', requires_all = ["dry_run", "case"])]
    config: Option<PathBuf>,
    /// The case of --config to dry-run (its first variant, one trial).
    #[arg(long, requires = "config")]
    case: Option<String>,
    /// Secrets for the dry run's case (as `mst run --secrets-file`: servers' tokens, model
    /// keys, `secretEnv`), so a case that needs one can be tried.
    #[arg(long = "secrets-file", value_name = "FILE", requires = "dry_run")]
    secrets_file: Option<PathBuf>,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// `mst plugin grade`.
#[derive(Args, Debug)]
pub(crate) struct GradeArgs {
    /// An installed plugin (NAME or NAME@VERSION) or a .wasm file.
    plugin: String,
    /// A trial as mst stores it: {"case": {...}, "trace": {...}}.
    #[arg(long, conflicts_with = "answer", required_unless_present = "answer")]
    trial: Option<PathBuf>,
    /// A final answer to grade, instead of --trial.
    #[arg(long)]
    answer: Option<String>,
    /// The case's expected value (JSON) when using --answer.
    #[arg(long, requires = "answer")]
    expected: Option<String>,
    #[command(flatten)]
    call: CallArgs,
}

/// `mst plugin resolve`.
#[derive(Args, Debug)]
pub(crate) struct ResolveArgs {
    /// An installed plugin (NAME or NAME@VERSION) or a .wasm file.
    plugin: String,
    /// The dataset file, passed to the plugin as content.
    #[arg(long)]
    file: Option<PathBuf>,
    #[command(flatten)]
    call: CallArgs,
}

/// How `mst plugin grade` and `mst plugin resolve` call the plugin.
#[derive(Args, Debug)]
pub(crate) struct CallArgs {
    /// The plugin's options (the judge's or the dataset entry's), as JSON.
    #[arg(long, default_value = "{}")]
    options: String,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

/// How `mst plugin push` and `install oci://…` reach a registry.
#[derive(Args, Debug, Clone)]
pub(crate) struct RegistryArgs {
    /// The registry login: a secrets file (JSON or dotenv) with OCI_USERNAME and OCI_PASSWORD.
    /// Without it, the Docker config's `auths` entry for the registry, else none.
    #[arg(long = "secrets-file", value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Trust the CA certificates in this PEM file for the registry's TLS, besides the system's.
    #[arg(long = "ca", value_name = "FILE")]
    ca: Option<PathBuf>,
}

impl RegistryArgs {
    fn access(&self) -> oci::Access {
        oci::Access {
            secrets_file: self.secrets_file.clone(),
            ca_file: self.ca.clone(),
        }
    }
}

/// Kinds `mst plugin new` can scaffold.
#[derive(ValueEnum, Clone, Copy, Debug)]
pub(crate) enum NewKind {
    /// A grader (`grade-trial`).
    Grader,
}

/// What the operator grants a plugin, and its resource caps.
#[derive(Args, Debug, Clone)]
pub(crate) struct SandboxArgs {
    /// Let the plugin run PROGRAM, if it declares it. Repeatable.
    #[arg(long = "allow-exec", value_name = "PROGRAM")]
    allow_exec: Vec<String>,
    /// Let the plugin read below DIR, if it declares a directory containing it. Repeatable.
    #[arg(long = "allow-read", value_name = "DIR")]
    allow_read: Vec<PathBuf>,
    /// Let the plugin call HOST over HTTP through mst, if it declares it. Repeatable.
    #[arg(long = "allow-http", value_name = "HOST")]
    allow_http: Vec<String>,
    /// Let the plugin call model PROVIDER through mst, if it declares it. Repeatable.
    #[arg(long = "allow-model", value_name = "PROVIDER")]
    allow_model: Vec<String>,
    /// Give the plugin secret NAME, read from the environment variable NAME. Repeatable.
    #[arg(long = "allow-secret", value_name = "NAME")]
    allow_secret: Vec<String>,
    /// Pass the environment variable NAME into a runner plugin's containers when its container
    /// spec asks for it. Docker shows the value to anyone who can inspect the container: never
    /// a secret. Repeatable.
    #[arg(long = "allow-env", value_name = "NAME")]
    allow_env: Vec<String>,
    /// The most memory the plugin may use, in MiB.
    #[arg(long = "plugin-memory", value_name = "MIB", default_value_t = 256)]
    memory_mib: usize,
    /// The most time one call into the plugin may take, in seconds.
    #[arg(
        long = "plugin-timeout",
        value_name = "SECONDS",
        default_value_t = 10.0
    )]
    timeout_secs: f64,
}

impl SandboxArgs {
    pub(crate) fn grants(&self) -> Result<Grants> {
        Grants::from_lists(
            GrantLists {
                exec: &self.allow_exec,
                http: &self.allow_http,
                models: &self.allow_model,
                read_dirs: &self.allow_read,
                secrets: &self.allow_secret,
                env: &self.allow_env,
            },
            |list| format!("--allow-{list}"),
        )
    }

    pub(crate) fn limits(&self) -> Result<Limits> {
        let call_timeout = crate::eval::config::seconds("--plugin-timeout", self.timeout_secs)?;
        if self.memory_mib == 0 {
            bail!("--plugin-memory must be at least 1 MiB");
        }
        Ok(Limits {
            memory_bytes: self.memory_mib.saturating_mul(1024 * 1024),
            call_timeout,
        })
    }
}

fn print_json(value: &impl serde::Serialize) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

fn host(home: &Home) -> Result<PluginHost> {
    PluginHost::new(home.cache_dir())
}

fn store(home: &Home) -> InstallStore {
    InstallStore::new(home.plugins_dir())
}

/// A plugin named on the command line: a file, else an installed plugin.
fn source(home: &Home, spec: &str) -> Result<PluginSource> {
    PluginSource::find(&store(home), Path::new(""), spec)
}

/// Loads a plugin; a failed load becomes an error with check's exit code (2 unreadable, 1
/// incompatible).
fn load(home: &Home, spec: &str, sandbox: &SandboxArgs) -> Result<LoadedPlugin> {
    let (grants, limits) = (sandbox.grants()?, sandbox.limits()?);
    PluginLoader::new(home, limits)?
        .load(Path::new(""), spec, &grants)
        .map_err(|error| {
            // Only a component that cannot be read is exit 2; finding or verifying an
            // installed plugin, or an incompatible one, is 1.
            let unreadable = error
                .downcast_ref::<LoadError>()
                .is_some_and(|failure| failure.step == FailedStep::Read);
            let code = if unreadable {
                Code::Refused
            } else {
                Code::Failure
            };
            Exit::with(code.into(), error)
        })
}

/// Runs a `mst plugin` command and returns its exit code.
pub(crate) fn run(home: &Home, command: PluginCommand) -> Result<u8> {
    match command {
        PluginCommand::Check(args) => check_command(home, args),
        PluginCommand::Install {
            plugin,
            force,
            json,
            registry,
        } => install(home, &plugin, force, json, &registry.access()),
        PluginCommand::Push {
            plugin,
            reference,
            json,
            registry,
        } => push(home, &plugin, &reference, json, &registry.access()),
        PluginCommand::List { json } => list(home, json),
        PluginCommand::Info { plugin, json } => info(home, &plugin, json),
        PluginCommand::Remove { plugin, json } => remove(home, &plugin, json),
        PluginCommand::New {
            kind: NewKind::Grader,
            name,
            dir,
            namespace,
            lang,
        } => new_plugin(&name, dir, &namespace, lang),
        PluginCommand::Grade(args) => grade(home, args),
        PluginCommand::Resolve(args) => resolve(home, args),
    }
}

/// `mst plugin check`, with `--dry-run` for runner plugins.
fn check_command(home: &Home, args: CheckArgs) -> Result<u8> {
    let CheckArgs {
        plugin,
        json,
        host_version,
        dry_run,
        runner_options,
        config,
        case,
        secrets_file,
        sandbox,
    } = args;
    // An unknown release is a usage error, found before the plugin is even read.
    let release = match host_version.as_deref().map(HostRelease::find).transpose() {
        Ok(release) => release,
        Err(message) => return Err(Exit::refused(anyhow::anyhow!(message))),
    };
    let mut report = check(home, &plugin, sandbox.limits()?)?;
    if let Some(release) = release {
        report = report.for_release(release);
    }
    let dry = match dry_run && report.compatible {
        false => None,
        true if report.kind != Some(Kind::Runner) => {
            return Err(Exit::refused(anyhow::anyhow!(
                "--dry-run runs runner plugins; {plugin} is a {} plugin",
                report.kind.map(|k| k.to_string()).unwrap_or_default()
            )))
        }
        true => Some(dry_run::dry_run(
            home,
            DryRunRequest {
                runner: dry_run::DryRunner::Plugin(&plugin),
                runner_options: &runner_options,
                grants: sandbox.grants()?,
                limits: sandbox.limits()?,
                secrets: super::run::load_secrets(secrets_file.as_deref())?,
                case: config
                    .as_deref()
                    .zip(case.as_deref())
                    .map(|(config, case)| dry_run::EvalCase { config, case }),
            },
        )),
    };
    if json {
        let mut value = serde_json::to_value(&report)?;
        if let Some(dry) = &dry {
            value["dryRun"] = serde_json::to_value(dry)?;
        }
        print_json(&value)?;
    } else {
        out!("{}", report.render());
        if let Some(dry) = &dry {
            out!("{}", dry.render());
        }
    }
    Ok(match &dry {
        Some(dry) if !dry.ok() => Code::Failure.into(),
        _ => report.exit_code(),
    })
}

/// `mst plugin install`: a file, or an OCI reference pulled and verified.
fn install(home: &Home, plugin: &str, force: bool, json: bool, access: &oci::Access) -> Result<u8> {
    let (bytes, source) = if plugin.starts_with(oci::SCHEME) {
        let reference = oci::OciRef::parse(plugin)?;
        let pulled = oci::pull(&reference, access)?;
        let sha256 = crate::plugin::loaded::digest(&pulled.bytes);
        let source = Origin::Oci {
            reference: reference.to_string(),
            manifest_digest: pulled.manifest_digest,
            sha256,
        };
        (pulled.bytes, source)
    } else {
        let file = Path::new(plugin);
        let bytes = read_input(file).map_err(super::Exit::refused)?;
        let path = std::path::absolute(file).unwrap_or_else(|_| file.to_path_buf());
        (bytes, Origin::File { path })
    };
    let report = checked(home, &bytes, plugin, "installed")?;
    let installed = store(home).install(&bytes, &report, source, force)?;
    if json {
        print_json(&installed_json(&installed))?;
    } else {
        outln!(
            "installed {} {} ({}, sha256:{})",
            installed.manifest.name,
            installed.manifest.version,
            installed.manifest.kind,
            installed.manifest.digest
        );
    }
    Ok(Code::Success.into())
}

/// The check report of `bytes` (named `label`), which must be compatible: otherwise the report
/// goes to stderr and the error says the plugin was not `what` (installed, pushed).
fn checked(home: &Home, bytes: &[u8], label: &str, what: &str) -> Result<CheckReport> {
    let report = check_bytes(home, bytes, label, Limits::default())?;
    if !report.compatible {
        eprint!("{}", report.render());
        return Err(Exit::with(
            report.exit_code(),
            anyhow::anyhow!("not {what}: {label} is not compatible with this mst"),
        ));
    }
    Ok(report)
}

/// `mst plugin push`: checks the plugin, then pushes it as a wasm OCI artifact.
fn push(
    home: &Home,
    plugin: &str,
    reference: &str,
    json: bool,
    access: &oci::Access,
) -> Result<u8> {
    let reference = oci::OciRef::parse(reference)?;
    let (bytes, label) = source(home, plugin)
        .and_then(|source| source.read())
        .map_err(super::Exit::refused)?;
    let report = checked(home, &bytes, &label, "pushed")?;
    // Standard OCI annotations, so registries and other tools show what the artifact is.
    let annotations = [
        ("org.opencontainers.image.title", report.name.clone()),
        ("org.opencontainers.image.version", report.version.clone()),
        (
            "org.opencontainers.image.description",
            report.description.clone(),
        ),
    ]
    .into_iter()
    .filter_map(|(key, value)| Some((key.to_string(), value?)))
    .collect();
    let manifest_digest = oci::push(&bytes, &reference, annotations, access)?;
    if json {
        print_json(&json!({
            "reference": reference.to_string(),
            "pinned": reference.with_digest(&manifest_digest),
            "manifestDigest": manifest_digest,
            "sha256": report.digest,
            "name": report.name,
            "version": report.version,
        }))?;
    } else {
        outln!(
            "pushed {} {} to {reference} (manifest {manifest_digest}, component sha256:{})",
            report.name.as_deref().unwrap_or_default(),
            report.version.as_deref().unwrap_or_default(),
            report.digest
        );
    }
    Ok(Code::Success.into())
}

/// `mst plugin list`.
fn list(home: &Home, json: bool) -> Result<u8> {
    let plugins = store(home).list()?;
    if json {
        print_json(&plugins.iter().map(installed_json).collect::<Vec<_>>())?;
    } else if plugins.is_empty() {
        outln!("no plugins installed in {}", home.plugins_dir().display());
    } else {
        outln!(
            "{:<32} {:<10} {:<16} {:<20} {:<24} SOURCE",
            "NAME",
            "VERSION",
            "KIND",
            "DIGEST",
            "CAPABILITIES"
        );
        for p in &plugins {
            let m = &p.manifest;
            let caps: Vec<String> = m.capabilities.iter().map(|c| c.to_string()).collect();
            outln!(
                "{:<32} {:<10} {:<16} sha256:{:<13} {:<24} {}",
                m.name,
                m.version,
                m.kind.as_str(),
                &m.digest[..12],
                if caps.is_empty() {
                    "none".into()
                } else {
                    caps.join(", ")
                },
                m.source
                    .as_ref()
                    .map_or_else(|| "unknown".to_string(), |s| s.to_string())
            );
        }
    }
    Ok(Code::Success.into())
}

/// `mst plugin info`: an installed plugin's manifest, or a file's check report.
fn info(home: &Home, plugin: &str, json: bool) -> Result<u8> {
    match source(home, plugin)? {
        PluginSource::File(path) => {
            let report = check(home, &path.to_string_lossy(), Limits::default())?;
            if json {
                print_json(&report)?;
            } else {
                out!("{}", report.render());
            }
            Ok(report.exit_code())
        }
        PluginSource::Installed(installed) => {
            if json {
                let mut value = installed_json(&installed);
                value["check"] = serde_json::to_value(&installed.manifest.check)?;
                print_json(&value)?;
            } else {
                outln!("installed at {}", installed.wasm_path().display());
                if let Some(source) = &installed.manifest.source {
                    outln!("installed from {source}");
                }
                out!("{}", installed.manifest.check.render());
            }
            Ok(Code::Success.into())
        }
    }
}

/// `mst plugin remove`.
fn remove(home: &Home, plugin: &str, json: bool) -> Result<u8> {
    let removed = store(home).remove(plugin)?;
    if json {
        print_json(&removed.iter().map(installed_json).collect::<Vec<_>>())?;
    } else {
        for p in &removed {
            outln!("removed {} {}", p.manifest.name, p.manifest.version);
        }
    }
    Ok(Code::Success.into())
}

/// `mst plugin new`.
fn new_plugin(
    name: &str,
    dir: Option<PathBuf>,
    namespace: &str,
    lang: scaffold::Lang,
) -> Result<u8> {
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    let project = scaffold::new_grader(&dir, namespace, name, lang)?;
    outln!(
        "created grader `{namespace}/grader/{name}` in {}",
        dir.display()
    );
    outln!("build it:  cd {} && {}", dir.display(), project.build);
    outln!(
        "check it:  mst plugin check {}",
        dir.join(&project.artifact).display()
    );
    Ok(Code::Success.into())
}

/// `mst plugin grade`: one trial, from a file or an inline answer.
fn grade(home: &Home, args: GradeArgs) -> Result<u8> {
    let GradeArgs {
        plugin,
        trial,
        answer,
        expected,
        call: CallArgs {
            options,
            json,
            sandbox,
        },
    } = args;
    let trial = match (trial, answer) {
        (Some(path), _) => {
            let bytes = read_input(&path)?;
            serde_json::from_slice::<TrialRecord>(&bytes)
                .with_context(|| format!("{} is not a trial record", path.display()))?
        }
        (None, Some(answer)) => {
            let expected = expected
                .map(|e| {
                    serde_json::from_str(&e)
                        .context("--expected is not JSON (quote strings: '\"42\"')")
                })
                .transpose()?;
            let case = CaseRecord {
                expected,
                ..CaseRecord::new("inline", json!(null))
            };
            TrialRecord::answered(case, &answer)
        }
        (None, None) => bail!("give --trial FILE or --answer TEXT"),
    };
    let options = normalize_options(&options)?;
    let loaded = load(home, &plugin, &sandbox)?;
    let score = loaded.grade(&options, &trial.to_wit())?;
    let pass = score.pass.unwrap_or(score.value >= 1.0);
    if json {
        print_json(&json!({
            "plugin": loaded.info().name,
            "version": loaded.info().version,
            "digest": loaded.digest(),
            "case": trial.case.id,
            "value": score.value,
            "pass": pass,
            "reason": score.reason,
            "details": score.details.as_deref().and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok()),
        }))?;
    } else {
        let verdict = if pass { "pass" } else { "fail" };
        outln!(
            "{verdict} {:.3}  {}",
            score.value,
            crate::plugin::imports::sanitize(&score.reason, 2000)
        );
    }
    Ok(if pass { 0 } else { 1 })
}

/// `mst plugin resolve`.
fn resolve(home: &Home, args: ResolveArgs) -> Result<u8> {
    let ResolveArgs {
        plugin,
        file,
        call: CallArgs {
            options,
            json,
            sandbox,
        },
    } = args;
    let content = file.as_deref().map(read_input).transpose()?;
    let options = normalize_options(&options)?;
    let loaded = load(home, &plugin, &sandbox)?;
    let cases = loaded.resolve(&options, content.as_deref())?;
    let cases: Vec<CaseRecord> = cases
        .into_iter()
        .map(CaseRecord::from_wit)
        .collect::<Result<_>>()
        .with_context(|| format!("plugin {} returned a malformed case", loaded.info().name))?;
    if json {
        print_json(&cases)?;
    } else {
        for case in &cases {
            outln!("{}", serde_json::to_string(case)?);
        }
        eprintln!("{} cases", cases.len());
    }
    Ok(Code::Success.into())
}

/// Checks that options are JSON and passes them on compactly.
fn normalize_options(options: &str) -> Result<String> {
    let value: serde_json::Value =
        serde_json::from_str(options).context("--options is not JSON")?;
    Ok(value.to_string())
}

/// `mst plugin check`: never fails for a bad component (that is the report's job), only for
/// a plugin that cannot be found or read. Its `info` call runs under `limits`.
fn check(home: &Home, spec: &str, limits: Limits) -> Result<CheckReport> {
    let (bytes, label) = source(home, spec)
        .and_then(|source| source.read())
        .map_err(super::Exit::refused)?;
    check_bytes(home, &bytes, &label, limits)
}

/// The check report of a component's `bytes`, named `label` in it.
fn check_bytes(home: &Home, bytes: &[u8], label: &str, limits: Limits) -> Result<CheckReport> {
    let host = host(home)?;
    let loaded = LoadedPlugin::load(&host, bytes, label, &Grants::default(), limits);
    Ok(CheckReport::new(label, bytes.len() as u64, &loaded))
}

fn installed_json(plugin: &InstalledPlugin) -> serde_json::Value {
    let m = &plugin.manifest;
    json!({
        "name": m.name,
        "version": m.version,
        "kind": m.kind,
        "description": m.description,
        "digest": m.digest,
        "size": m.size,
        "capabilities": m.capabilities,
        "installedAt": m.installed_at,
        "path": plugin.wasm_path(),
        "source": m.source,
    })
}
