//! Runners create machines and open a channel to each; the coordinator does everything else.
//!
//! - [`channel`]: the three operations every machine provides (run a command with stdin and
//!   stdout attached, copy a directory in, copy a file back).
//! - [`local`]: the built-in runner that uses a private directory on this host and a
//!   subprocess, through the same channel code as every remote runner.
//! - [`docker`]: the built-in runner that runs each shard in a hardened container on one or
//!   more Docker hosts.
//! - [`plugin`]: runners provided by WebAssembly components (the `runner` world).
//! - [`worker_binary`]: the static mst a runner places on machines that have none.

pub mod archive;
pub mod channel;
pub mod command_channel;
pub mod docker;
pub mod ledger;
pub mod local;
pub mod plugin;
pub mod sim;
pub mod worker_binary;

use crate::home::Home;
use crate::plugin::set::PluginSet;
use crate::plugin::Kind;
use anyhow::{bail, Context, Result};
use channel::Channel;
use std::collections::BTreeMap;

/// `program` and `args` as one line a person pastes into a POSIX shell, each word quoted as
/// needed (a word holding a NUL byte, which no shell passes, is shown escaped).
pub fn shell_words(program: &str, args: &[String]) -> String {
    let words = std::iter::once(program).chain(args.iter().map(String::as_str));
    shlex::try_join(words).unwrap_or_else(|_| {
        let shown: Vec<String> = std::iter::once(program)
            .chain(args.iter().map(String::as_str))
            .map(|w| format!("{w:?}"))
            .collect();
        shown.join(" ")
    })
}

/// Options given with `--runner-option key=value`, with the host's own ones (`shards`, `keep`)
/// taken out.
#[derive(Debug, Clone, Default)]
pub struct RunnerOptions {
    pub shards: u32,
    pub keep: Keep,
    /// Everything else, for the runner to validate.
    pub rest: BTreeMap<String, String>,
}

/// Whether to keep a machine after its shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Keep {
    #[default]
    Never,
    Failed,
    Always,
}

impl RunnerOptions {
    /// `given` (`key=value`, from the command line) over the operator's defaults for `runner`
    /// in `$MST_HOME/runners.json`, parsed: the run records them all, as if typed.
    pub fn with_defaults(home: &Home, runner: &str, given: &[String]) -> Result<Self> {
        let mut all = operator_defaults(home, runner)?;
        all.extend(given.iter().cloned());
        Self::parse(&all)
    }

    /// Parses `key=value` options.
    pub fn parse(options: &[String]) -> Result<Self> {
        let mut parsed = RunnerOptions {
            shards: 1,
            ..RunnerOptions::default()
        };
        for option in options {
            let Some((key, value)) = option.split_once('=') else {
                bail!("--runner-option {option:?}: expected key=value");
            };
            match key {
                "shards" => {
                    parsed.shards = value.parse().ok().filter(|n| *n >= 1).ok_or_else(|| {
                        anyhow::anyhow!(
                            "--runner-option shards={value}: expected a whole number ≥ 1"
                        )
                    })?
                }
                "keep" => {
                    parsed.keep = match value {
                        "never" => Keep::Never,
                        "failed" => Keep::Failed,
                        "always" => Keep::Always,
                        _ => {
                            bail!("--runner-option keep={value}: expected never, failed or always")
                        }
                    }
                }
                _ => {
                    parsed.rest.insert(key.to_string(), value.to_string());
                }
            }
        }
        Ok(parsed)
    }
}

/// The options `$MST_HOME/runners.json` gives `runner`, as `key=value`: an object of runner
/// names, each an object of option names and their string values (`{"local": {"expose":
/// "/opt/python"}}`); none when the file is missing.
fn operator_defaults(home: &Home, runner: &str) -> Result<Vec<String>> {
    let path = home.runner_defaults_file();
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
    };
    let all: BTreeMap<String, BTreeMap<String, String>> = serde_json::from_str(&text)
        .with_context(|| {
            format!(
                "{}: expected runners' default options, each value a string, e.g. \
                 {{\"local\": {{\"expose\": \"/opt/python\"}}}}",
                path.display()
            )
        })?;
    Ok(all
        .get(runner)
        .into_iter()
        .flatten()
        .map(|(key, value)| format!("{key}={value}"))
        .collect())
}

/// What a runner is asked for when a shard needs a machine.
pub struct MachineRequest<'a> {
    /// The run the machine is for (runners label machines with it).
    pub run_id: &'a str,
    /// This shard, of `shards`.
    pub shard: u32,
    pub shards: u32,
    /// Tells the user something worth knowing while the machine is made.
    pub note: &'a (dyn Fn(&str) + Sync),
    /// Set when the user cancels the run: a runner waiting for room gives up.
    pub cancel: &'a std::sync::atomic::AtomicBool,
    /// The image the shard's trials name, in place of the runner's own (the Docker runner's
    /// `image`); only the Docker runner is given one.
    pub image: Option<&'a str>,
}

/// A runner: makes one machine per shard.
pub trait Runner: Send + Sync {
    /// The runner's name as `--runner` spells it.
    fn name(&self) -> &str;
    /// The most shards it supports.
    fn max_shards(&self) -> u32;
    /// What the runner decided before any machine exists (hosts, capacity), one line each.
    fn plan(&self) -> Vec<String> {
        Vec::new()
    }
    /// Creates the machine for one shard; may wait for room on the runner's hosts.
    fn create_machine(&self, request: &MachineRequest<'_>) -> Result<Box<dyn Channel>>;
    /// The hosts its machines may reach through the coordinator's egress proxy, carried over
    /// the shard protocol (`network=allow:…` where no socket reaches into a machine).
    fn egress(&self) -> Option<&crate::egress::Allowed> {
        None
    }
}

/// The built-in runners, by the name `--runner` gives them.
pub const BUILT_IN: [&str; 3] = ["local", "docker", "sim"];

/// The runner called `name`, validated against its options: `local`, `docker`, or a runner
/// plugin of `plugins` (loaded with `--plugin`, or installed).
pub fn runner(name: &str, options: &RunnerOptions, plugins: &PluginSet) -> Result<Box<dyn Runner>> {
    let runner: Box<dyn Runner> = match name {
        "local" => Box::new(local::LocalRunner::new(&options.rest)?),
        "sim" => Box::new(sim::SimRunner::new(&options.rest)?),
        "docker" => Box::new(docker::DockerRunner::new(&options.rest)?),
        other if plugins.find(other).is_none() => bail!(
            "unknown runner `{other}`: the built-in runners are `local`, `docker` and `sim`; a runner \
             plugin must be loaded with --plugin FILE or installed with `mst plugin install`"
        ),
        other => {
            let found = plugins
                .get(other, Kind::Runner)
                .with_context(|| format!("--runner {other}"))?;
            Box::new(plugin::PluginRunner::new(found, &options.rest)?)
        }
    };
    if options.shards > runner.max_shards() {
        bail!(
            "--runner-option shards={}: the `{name}` runner runs at most {} shard(s)",
            options.shards,
            runner.max_shards()
        );
    }
    Ok(runner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_options_are_parsed_and_checked() {
        let options = RunnerOptions::parse(&[
            "shards=1".into(),
            "keep=failed".into(),
            "worker=/bin/x".into(),
        ])
        .unwrap();
        assert_eq!((options.shards, options.keep), (1, Keep::Failed));
        assert_eq!(options.rest["worker"], "/bin/x");
        assert!(RunnerOptions::parse(&["shards=0".into()]).is_err());
        assert!(RunnerOptions::parse(&["keep".into()]).is_err());
        let two = RunnerOptions::parse(&["shards=2".into()]).unwrap();
        let err = runner("local", &two, &PluginSet::default())
            .err()
            .expect("two local shards are refused");
        assert!(err.to_string().contains("at most 1"), "{err}");
        let err = runner("nope", &two, &PluginSet::default())
            .err()
            .expect("unknown");
        assert!(err.to_string().contains("--plugin FILE"), "{err}");
    }
}
