//! `mst runner …`: preparing the hosts a runner uses, and trying a built-in runner.

use super::Code;
use crate::home::Home;
use crate::run::dry_run::{self, DryRunRequest};
use crate::runner::docker::{agent_clis, context, image, options::DockerOptions};
use crate::runner::worker_binary;
use anyhow::{bail, Result};
use clap::Subcommand;
use std::collections::BTreeMap;

/// `mst runner …`
#[derive(Subcommand, Debug)]
pub enum RunnerCommand {
    /// Prepare a runner's hosts. For `docker`: build mst-worker:<version> (or `image=NAME`) on
    /// each context, from `--runner-option base=IMAGE` with docker/Dockerfile, or offline from
    /// the static mst alone; `agentClis=claude-code,codex` copies the host's agent CLIs in.
    /// With `--build DIR`: build a task's own image (`image=NAME`) from DIR's Dockerfile.
    Setup {
        /// The runner (`docker`).
        runner: String,
        /// `contexts=…`, `base=IMAGE`, `image=NAME`, `worker=PATH` (a static mst),
        /// `agentClis=claude-code,codex`. Repeatable.
        #[arg(long = "runner-option", value_name = "KEY=VALUE")]
        runner_options: Vec<String>,
        /// Build the image `image=NAME` from the Dockerfile in this directory (a task's
        /// environment), offline from images already on each context; mst places its worker
        /// in it when a run first uses it.
        #[arg(long, value_name = "DIR")]
        build: Option<std::path::PathBuf>,
        /// Print what was built as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Try a built-in runner (`local`, `docker`) with its options: one machine, one trial
    /// (`sh -c cat` on the machine, or --case of --config), dispose, each step timed, as
    /// `mst plugin check --dry-run` does for a runner plugin. Exit 1 if any step fails.
    Check {
        /// The runner (`local` or `docker`).
        runner: String,
        /// An option for the runner (`key=value`). Repeatable.
        #[arg(long = "runner-option", value_name = "KEY=VALUE")]
        runner_options: Vec<String>,
        /// Try one case of this eval config (with --case) instead of the built-in one.
        #[arg(long, short = 'c', requires = "case")]
        config: Option<std::path::PathBuf>,
        /// The case of --config to try (its first variant, one trial).
        #[arg(long, requires = "config")]
        case: Option<String>,
        /// Secrets for the case (as `mst run --secrets-file`).
        #[arg(long = "secrets-file", value_name = "FILE")]
        secrets_file: Option<std::path::PathBuf>,
        /// Print the steps as one JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Runs a `mst runner` command.
pub fn run(home: &Home, command: RunnerCommand) -> Result<u8> {
    match command {
        RunnerCommand::Setup {
            runner,
            runner_options,
            build,
            json,
        } => setup(&runner, &runner_options, build.as_deref(), json),
        RunnerCommand::Check {
            runner,
            runner_options,
            config,
            case,
            secrets_file,
            json,
        } => {
            if !["local", "docker"].contains(&runner.as_str()) {
                bail!(
                    "`mst runner check {runner}`: the built-in runners are `local` and \
                     `docker`; a runner plugin is tried with `mst plugin check PLUGIN --dry-run`"
                );
            }
            let dry = dry_run::dry_run(
                home,
                DryRunRequest {
                    runner: dry_run::DryRunner::BuiltIn(&runner),
                    runner_options: &runner_options,
                    grants: Default::default(),
                    limits: Default::default(),
                    secrets: super::run::load_secrets(secrets_file.as_deref())?,
                    case: config
                        .as_deref()
                        .zip(case.as_deref())
                        .map(|(config, case)| dry_run::EvalCase { config, case }),
                },
            );
            match json {
                true => outln!("{}", serde_json::to_string_pretty(&dry)?),
                false => out!("{}", dry.render()),
            }
            Ok(match dry.ok() {
                true => Code::Success.into(),
                false => Code::Failure.into(),
            })
        }
    }
}

/// `mst runner setup`: the Docker runner's worker image on each context, or with `build` a
/// task's image.
fn setup(
    runner: &str,
    runner_options: &[String],
    build: Option<&std::path::Path>,
    json: bool,
) -> Result<u8> {
    if runner != "docker" {
        bail!("`mst runner setup {runner}`: only the `docker` runner needs setting up");
    }
    let mut pairs = BTreeMap::new();
    for option in runner_options {
        let Some((key, value)) = option.split_once('=') else {
            bail!("--runner-option {option:?}: expected key=value");
        };
        pairs.insert(key.to_string(), value.to_string());
    }
    let options = DockerOptions::parse(&pairs, true)?;
    if let Some(dir) = build {
        return build_task_image(&options, dir, json);
    }
    let worker = worker_binary::find(options.worker.as_deref())?;
    let clis = agent_clis::locate(&options.agent_clis, options.base.as_deref())?;
    let reference = options
        .image
        .clone()
        .unwrap_or_else(image::default_reference);
    let setup = image::SetupImage {
        reference: &reference,
        base: options.base.as_deref(),
        worker: &worker,
        clis: &clis,
    };
    let runtime = crate::runner::docker::runtime()?;
    let mut built = Vec::new();
    for name in context_names(&options) {
        let endpoint = context::resolve_endpoint(&name)?;
        let id = runtime.block_on(async {
            // The tunnel of an ssh:// host stays open while the image is built.
            let (docker, _tunnel) = context::connect(&name, &endpoint, &options.ssh).await?;
            image::setup(&docker, &setup).await
        })?;
        let with_clis: Vec<&str> = clis.iter().map(|cli| cli.client).collect();
        if !json {
            let clis = match with_clis.is_empty() {
                true => String::new(),
                false => format!(", with {}", with_clis.join(" and ")),
            };
            outln!(
                "docker context `{name}`: built {reference} ({id}) {}{clis}",
                match &options.base {
                    Some(base) => format!("from {base} with docker/Dockerfile"),
                    None => "offline from the static mst alone".to_string(),
                }
            );
        }
        built.push(serde_json::json!({
            "context": name, "endpoint": endpoint, "image": reference, "id": id,
            "base": options.base, "worker": worker.display().to_string(),
            "agentClis": clis.iter().map(|cli| serde_json::json!({
                "client": cli.client, "program": cli.path.display().to_string(),
            })).collect::<Vec<_>>(),
        }));
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&built)?);
    }
    Ok(super::Code::Success.into())
}

/// `mst runner setup docker --build DIR`: the image `image=NAME` built from DIR's Dockerfile on
/// each context.
fn build_task_image(options: &DockerOptions, dir: &std::path::Path, json: bool) -> Result<u8> {
    let Some(reference) = options.image.as_deref() else {
        bail!(
            "--build {}: name the image to build, e.g. --runner-option image=mst-task/fix:1",
            dir.display()
        );
    };
    let runtime = crate::runner::docker::runtime()?;
    let mut built = Vec::new();
    for name in context_names(options) {
        let endpoint = context::resolve_endpoint(&name)?;
        let id = runtime.block_on(async {
            let (docker, _tunnel) = context::connect(&name, &endpoint, &options.ssh).await?;
            image::build_dir(&docker, reference, dir).await
        })?;
        if !json {
            outln!(
                "docker context `{name}`: built {reference} ({id}) from {}",
                dir.display()
            );
        }
        built.push(serde_json::json!({
            "context": name, "endpoint": endpoint, "image": reference, "id": id,
            "build": dir.display().to_string(),
        }));
    }
    if json {
        outln!("{}", serde_json::to_string_pretty(&built)?);
    }
    Ok(Code::Success.into())
}

/// The contexts `options` name, or the current one.
fn context_names(options: &DockerOptions) -> Vec<String> {
    match options.contexts.is_empty() {
        true => vec![context::current_context()],
        false => options.contexts.clone(),
    }
}
