//! Runner plugins: a WebAssembly component describes each shard's machine and the host makes
//! it. A container spec is created and hardened by the Docker runner's own code (the spec has
//! nowhere to ask for privileges, host mounts or capabilities, its network and limits go
//! through the same checks as `--runner docker` options, a network besides `none` must be the
//! operator's, and its context must be one local engine). A command channel is run by
//! [`CommandMachine`] with the programs the plugin declared and the operator granted. Either
//! way the host keeps the protocol, tokens, limits, copy-back and clean-up, and a [`Ledger`] of
//! the plugin's machines, so that a run releases those an mst that died left behind.

use super::channel::{Channel, KeptMachine, Process};
use super::command_channel::CommandMachine;
use super::docker::context::spec_endpoint;
use super::docker::options::DockerOptions;
use super::docker::DockerRunner;
use super::ledger::Ledger;
use super::{MachineRequest, Runner};
use crate::plugin::bindings::{Machine, MachineSpec, Shard};
use crate::plugin::capabilities::broad_grant_warning;
use crate::plugin::LoadedPlugin;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// A runner provided by a plugin.
pub struct PluginRunner {
    plugin: Arc<LoadedPlugin>,
    /// The runner options as the JSON object the plugin receives.
    options: String,
    max_shards: u32,
    /// The network the operator passed (`--runner-option network=…`): the only one besides
    /// `none` a container spec may ask for, since egress is the operator's choice.
    network: Option<String>,
    /// The values of the operator's runner options: a raw `unix://` socket a container spec
    /// names must be one of them (or the current context's), never one the plugin chose.
    operator_values: Vec<String>,
    /// Docker runners by the container settings they serve, made on first use.
    docker: Mutex<BTreeMap<String, Arc<DockerRunner>>>,
    /// This process's record of the plugin's machines (none without an mst home).
    ledger: Option<Arc<Ledger>>,
    /// What releasing the machines of a dead mst did, for the plan.
    released: Vec<String>,
    /// The static mst to place on a machine without one (`--runner-option worker=PATH`, the
    /// host's option for every runner, never passed to the plugin); `None`: found as the
    /// Docker runner finds it.
    worker: Option<PathBuf>,
}

/// `key=value` options as a JSON object: values that parse as JSON numbers or booleans become
/// those, everything else stays a string.
pub fn options_json(options: &BTreeMap<String, String>) -> serde_json::Value {
    options
        .iter()
        .map(|(key, value)| {
            let parsed = match serde_json::from_str::<serde_json::Value>(value) {
                Ok(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v,
                _ => serde_json::Value::String(value.clone()),
            };
            (key.clone(), parsed)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

impl PluginRunner {
    /// Checks the options against the plugin's schema, then with the plugin itself.
    pub fn new(plugin: Arc<LoadedPlugin>, options: &BTreeMap<String, String>) -> Result<Self> {
        let name = plugin.info().name.clone();
        // `worker` is the host's: the plugin's schema never sees it.
        let mut options = options.clone();
        let worker = options.remove("worker").map(PathBuf::from);
        if let Some(path) = &worker {
            super::worker_binary::find(Some(path))
                .with_context(|| format!("--runner-option worker={}", path.display()))?;
        }
        let json = options_json(&options);
        if let Some(schema) = &plugin.info().options_schema {
            let validator = jsonschema::validator_for(schema).map_err(|e| {
                anyhow::anyhow!("runner plugin `{name}` has a bad options schema: {e}")
            })?;
            let errors: Vec<String> = validator
                .iter_errors(&json)
                .map(|e| format!("{e} at `{}`", e.instance_path()))
                .collect();
            if !errors.is_empty() {
                bail!(
                    "--runner-option for `{name}`: {} (the plugin's options schema: `mst plugin info {name}`)",
                    errors.join("; ")
                );
            }
        }
        // Its declared patterns may name the operator's options (`{option:context}`): pinned
        // before its first call, `check-options` included, which may run programs too.
        let plugin = Arc::new(
            plugin
                .pinned_to(&options)
                .map_err(|e| anyhow::anyhow!("runner plugin `{name}`: {e}"))?,
        );
        let text = json.to_string();
        plugin
            .check_runner_options(&text)
            .with_context(|| format!("--runner-option for `{name}`"))?;
        let max_shards = plugin
            .runner_info()
            .with_context(|| format!("runner plugin `{name}`"))?
            .max_shards
            .unwrap_or(u32::MAX);
        let ledger = crate::home::Home::from_env()
            .ok()
            .map(|home| Arc::new(Ledger::open(home.root(), &name)));
        let released = ledger
            .as_ref()
            .map(|ledger| release_orphans(&plugin, ledger))
            .unwrap_or_default();
        Ok(PluginRunner {
            plugin,
            options: text,
            max_shards,
            network: options.get("network").cloned(),
            operator_values: options.values().cloned().collect(),
            docker: Mutex::new(BTreeMap::new()),
            ledger,
            released,
            worker,
        })
    }

    /// Refuses a raw `unix://` socket path the operator did not give: a plugin could otherwise
    /// point mst at any local socket (one forwarded to a remote engine, another daemon's). A
    /// context *name* is the operator's own configuration, checked by [`spec_endpoint`].
    fn refuse_unlisted_socket(&self, context: &str) -> Result<()> {
        let current = || {
            crate::runner::docker::context::resolve_endpoint(
                &crate::runner::docker::context::current_context(),
            )
            .ok()
        };
        refuse_unlisted_socket(context, &self.operator_values, current)
    }

    /// The Docker runner for a container spec's settings, validated like `--runner docker`
    /// options.
    fn docker_for(
        &self,
        spec: &crate::plugin::bindings::ContainerSpec,
    ) -> Result<Arc<DockerRunner>> {
        let grants = self.plugin.effective_grants();
        let mut env = Vec::new();
        for name in &spec.env_names {
            let Some(value) = grants.env(name) else {
                bail!(
                    "its container spec asks for the environment variable {name}, which you did \
                     not pass (--allow-env {name}, or `allowEnv` in the config; Docker shows the \
                     value to anyone who can inspect the container, so never a secret: secrets \
                     travel over the worker's stdin)"
                );
            };
            env.push(format!("{name}={value}"));
        }
        if !env.is_empty() {
            // The worker passes these on to its agents, and nothing else of the container's.
            env.push(format!(
                "{}={}",
                crate::process::PASS_ENV,
                spec.env_names.join(",")
            ));
        }
        let mut options = BTreeMap::from([("image".to_string(), spec.image.clone())]);
        if let Some(bytes) = spec.memory_bytes {
            options.insert("memory".into(), bytes.to_string());
        }
        if let Some(cpus) = spec.cpus {
            options.insert("cpus".into(), cpus.to_string());
        }
        if let Some(network) = &spec.network {
            options.insert("network".into(), network.clone());
        }
        let mut options = DockerOptions::parse(&options, false)?;
        options.worker = self.worker.clone();
        let network = &options.network;
        if network != "none" && self.network.as_ref() != Some(network) {
            bail!(
                "its container spec asks for the network {network:?}; a container's egress is \
                 yours to choose (--runner-option network={network} allows it; the default is \
                 none)"
            );
        }
        if let Some(context) = &spec.context {
            // Exactly one value, never the comma-separated `contexts` syntax, and checked as
            // the endpoint it resolves to: the bundle and tokens go wherever it points.
            let endpoint = spec_endpoint(context)?;
            self.refuse_unlisted_socket(context)?;
            options.contexts = vec![endpoint];
        }
        let key = format!("{options:?}{:?}{:?}", spec.labels, spec.env_names);
        let mut docker = self.docker.lock().expect("docker runners");
        if let Some(runner) = docker.get(&key) {
            return Ok(runner.clone());
        }
        let runner = Arc::new(
            DockerRunner::with_options(options)?
                .with_labels(spec.labels.clone())
                .with_env(env),
        );
        docker.insert(key, runner.clone());
        Ok(runner)
    }
}

/// Disposes of the machines an mst that is gone left in `ledger`, through the plugin (the
/// Docker runner does the same for containers); what happened, as plan lines.
fn release_orphans(plugin: &LoadedPlugin, ledger: &Ledger) -> Vec<String> {
    let name = &plugin.info().name;
    let orphans = ledger.take_orphans();
    if orphans.is_empty() {
        return Vec::new();
    }
    let failed: Vec<String> = orphans
        .iter()
        .filter_map(|id| plugin.dispose_machine(id, false).err())
        .map(|e| {
            format!("warning: runner plugin `{name}`: a machine left by an mst that is gone: {e}")
        })
        .collect();
    let mut lines = vec![format!(
        "runner plugin `{name}`: released {} of {} machine(s) left by an mst that is gone",
        orphans.len() - failed.len(),
        orphans.len()
    )];
    lines.extend(failed);
    lines
}

impl Runner for PluginRunner {
    fn name(&self) -> &str {
        &self.plugin.info().name
    }

    fn max_shards(&self) -> u32 {
        self.max_shards
    }

    fn plan(&self) -> Vec<String> {
        let info = self.plugin.info();
        let mut plan = vec![format!(
            "runner plugin {} {} (sha256 {})",
            info.name,
            info.version,
            &self.plugin.digest()[..12]
        )];
        // What the operator's grants let it run, spelled out, and loudly when that is anything.
        for grant in &self.plugin.effective_grants().exec {
            plan.push(format!(
                "  it may run: {} {}",
                grant.program,
                grant.describe()
            ));
            if let Some(warning) = broad_grant_warning(grant) {
                let warning = format!("  warning: {warning}");
                // Said once, however many templates share it.
                if !plan.contains(&warning) {
                    plan.push(warning);
                }
            }
        }
        plan.extend(self.released.iter().cloned());
        plan
    }

    fn create_machine(&self, request: &MachineRequest<'_>) -> Result<Box<dyn Channel>> {
        let name = self.name().to_string();
        let shard = Shard {
            index: request.shard,
            count: request.shards,
            run_id: request.run_id.to_string(),
        };
        // A command channel's times count from here: the plugin's own work (ssh, kubectl) is
        // part of making the machine.
        let started = std::time::Instant::now();
        let Machine {
            id,
            spec,
            description,
        } = self
            .plugin
            .create_machine(&shard, &self.options)
            .with_context(|| format!("runner plugin `{name}`: create-machine"))?;
        // Written down before anything else can fail or hang: if this mst dies from here on,
        // the next run releases the machine.
        if let Some(ledger) = &self.ledger {
            ledger.add(&id);
        }
        let inner = match &spec {
            MachineSpec::Container(spec) => self
                .docker_for(spec)
                .and_then(|docker| docker.create_machine(request))
                .with_context(|| format!("runner plugin `{name}` ({description})")),
            MachineSpec::Command(channel) => CommandMachine::new(
                channel,
                self.plugin.effective_grants(),
                self.worker.as_deref(),
                started,
            )
            .map(|machine| Box::new(machine) as Box<dyn Channel>)
            .with_context(|| format!("runner plugin `{name}` ({description})")),
        };
        let inner = match inner {
            Ok(inner) => inner,
            Err(e) => {
                // The plugin may have reserved something: give it back.
                let _ = self.plugin.dispose_machine(&id, false);
                if let Some(ledger) = &self.ledger {
                    ledger.remove(&id);
                }
                return Err(e);
            }
        };
        Ok(Box::new(PluginMachine {
            inner,
            plugin: self.plugin.clone(),
            id,
            description,
            ledger: self.ledger.clone(),
        }))
    }
}

/// A machine a plugin described: the host's channel, plus the plugin's handle to release.
struct PluginMachine {
    inner: Box<dyn Channel>,
    plugin: Arc<LoadedPlugin>,
    id: String,
    description: String,
    ledger: Option<Arc<Ledger>>,
}

impl Channel for PluginMachine {
    fn describe(&self) -> String {
        format!("{} via {}", self.inner.describe(), self.description)
    }
    fn put(&mut self, src: &Path, dest: &str) -> Result<()> {
        self.inner.put(src, dest)
    }
    fn exec(&mut self, argv: &[String]) -> Result<Process> {
        self.inner.exec(argv)
    }
    fn get(&mut self, src: &str, dest: &Path, cap: u64) -> Result<()> {
        self.inner.get(src, dest, cap)
    }
    fn get_many(&mut self, files: &[(String, std::path::PathBuf)], cap: u64) -> Vec<Result<()>> {
        self.inner.get_many(files, cap)
    }
    fn batch_copies(&self) -> bool {
        self.inner.batch_copies()
    }
    fn dispose(&mut self, keep: bool) -> Result<Option<KeptMachine>> {
        // The plugin releases its side even when the host's side failed.
        let inner = self.inner.dispose(keep);
        let released = self.plugin.dispose_machine(&self.id, keep);
        // Released, kept on purpose, or failed and reported below: no later run's to release.
        if let Some(ledger) = &self.ledger {
            ledger.remove(&self.id);
        }
        let kept = inner?;
        if let Err(e) = released {
            // Still say where a kept machine is.
            let kept = kept
                .map(|k| format!(" (kept: {})", k.at))
                .unwrap_or_default();
            return Err(anyhow::Error::new(e).context(format!(
                "runner plugin `{}`: dispose-machine{kept}",
                self.plugin.info().name
            )));
        }
        Ok(kept)
    }
    fn diagnose(&mut self) -> Option<String> {
        self.inner.diagnose()
    }
    fn started_at(&self) -> Option<std::time::Instant> {
        self.inner.started_at()
    }
    fn provenance(&self) -> serde_json::Value {
        let mut value = self.inner.provenance();
        if let Some(map) = value.as_object_mut() {
            map.insert(
                "plugin".into(),
                serde_json::json!({
                    "name": self.plugin.info().name,
                    "version": self.plugin.info().version,
                    "digest": self.plugin.digest(),
                    "machine": self.id,
                }),
            );
        }
        value
    }
}

/// [`PluginRunner::refuse_unlisted_socket`]: `context` passes unless it is a raw `unix://`
/// socket that is neither one of the operator's option values nor `current()`, the current
/// context's endpoint.
fn refuse_unlisted_socket(
    context: &str,
    operator_values: &[String],
    current: impl FnOnce() -> Option<String>,
) -> Result<()> {
    let listed = operator_values.iter().any(|value| value == context);
    if !context.starts_with("unix://") || listed || current().as_deref() == Some(context) {
        return Ok(());
    }
    bail!(
        "its container spec names the socket {context:?}, which you did not give it: a runner \
         plugin may use your current Docker context, one you configured by name, or a unix:// \
         socket you pass in its runner options"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_names_only_a_socket_the_operator_gave() {
        let given = vec!["unix:///run/engine-a.sock".to_string(), "2".to_string()];
        let none = || None;
        assert!(refuse_unlisted_socket("unix:///run/engine-a.sock", &given, none).is_ok());
        assert!(
            refuse_unlisted_socket("my-context", &given, none).is_ok(),
            "a name"
        );
        let current = || Some("unix:///var/run/docker.sock".to_string());
        assert!(refuse_unlisted_socket("unix:///var/run/docker.sock", &given, current).is_ok());
        let err = refuse_unlisted_socket("unix:///run/forwarded.sock", &given, current)
            .unwrap_err()
            .to_string();
        assert!(err.contains("which you did not give it"), "{err}");
    }

    #[test]
    fn option_values_keep_their_json_types() {
        let options = BTreeMap::from([
            ("image".to_string(), "acme/agents:7".to_string()),
            ("memoryMb".to_string(), "512".to_string()),
            ("spot".to_string(), "true".to_string()),
            ("tag".to_string(), "[1]".to_string()),
        ]);
        assert_eq!(
            options_json(&options),
            serde_json::json!({"image": "acme/agents:7", "memoryMb": 512, "spot": true, "tag": "[1]"})
        );
    }
}
