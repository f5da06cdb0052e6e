//! Finding and loading plugins by reference, and the set of plugins one run uses.
//!
//! A reference is what a config or the command line writes: a `.wasm` path or an installed
//! plugin's name. [`PluginLoader`] is the one place that turns a reference into a
//! [`LoadedPlugin`]; [`PluginSet`] holds a run's plugins and answers lookups typed by kind, so
//! that a judge naming a dataset plugin (or a plugin nobody loaded) is refused while the config
//! is checked, before any machine starts.

use super::installed::{InstallStore, PluginSource};
use super::{Grants, Kind, Limits, LoadedPlugin, PluginHost};
use crate::home::Home;
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Turns plugin references into loaded plugins: one engine (with its artifact cache), the
/// install store, and the per-call limits every plugin it loads gets.
pub struct PluginLoader {
    host: PluginHost,
    store: InstallStore,
    limits: Limits,
}

impl PluginLoader {
    /// The loader for `home`'s cache and install store; plugins get `limits`.
    pub fn new(home: &Home, limits: Limits) -> Result<Self> {
        Ok(PluginLoader {
            host: PluginHost::new(home.cache_dir())?,
            store: InstallStore::new(home.plugins_dir()),
            limits,
        })
    }

    /// The engine plugins are compiled by.
    pub fn host(&self) -> &PluginHost {
        &self.host
    }

    /// The install store plugins are found in.
    pub fn store(&self) -> &InstallStore {
        &self.store
    }

    /// Where `reference` comes from: a file (relative to `base`) or an installed plugin.
    pub fn source(&self, base: &Path, reference: &str) -> Result<PluginSource> {
        PluginSource::find(&self.store, base, reference)
    }

    /// Reads and loads `reference` with `grants`. A plugin that cannot be loaded is an error
    /// carrying its [`LoadError`](super::loaded::LoadError), which callers may downcast for the
    /// step that failed.
    pub fn load(&self, base: &Path, reference: &str, grants: &Grants) -> Result<LoadedPlugin> {
        self.load_pinned(base, reference, None, grants)
    }

    /// [`load`](Self::load), refusing a component whose sha256 is not `pin` (hex, with or
    /// without `sha256:`) before any of it runs.
    pub fn load_pinned(
        &self,
        base: &Path,
        reference: &str,
        pin: Option<&str>,
        grants: &Grants,
    ) -> Result<LoadedPlugin> {
        self.load_from(&self.source(base, reference)?, pin, grants)
    }

    /// [`load_pinned`](Self::load_pinned) from a source already found.
    fn load_from(
        &self,
        source: &PluginSource,
        pin: Option<&str>,
        grants: &Grants,
    ) -> Result<LoadedPlugin> {
        let (bytes, label) = source.read()?;
        if let Some(pin) = pin {
            let pin = pin.strip_prefix("sha256:").unwrap_or(pin);
            let actual = super::loaded::digest(&bytes);
            if !actual.eq_ignore_ascii_case(pin) {
                bail!(
                    "{label} has sha256 {actual}, but the config pins sha256 {pin}: refusing to \
                     run a plugin other than the pinned one (install the pinned build, or update \
                     the pin if the change is wanted)"
                );
            }
        }
        LoadedPlugin::load(&self.host, &bytes, &label, grants, self.limits)
            .map_err(|failure| anyhow::Error::new(*failure))
    }
}

/// A plugin as a config or a command line asks for it: a reference (a `.wasm` file or an
/// installed plugin's name) and the sha256 its component must have, when the config pins one.
#[derive(Debug, Clone, Copy)]
pub struct PinnedRef<'a> {
    /// A `.wasm` file (relative to the config) or an installed plugin's name.
    pub reference: &'a str,
    /// The sha256 (hex, with or without `sha256:`) the component must have; `None` takes any.
    pub pin: Option<&'a str>,
}

impl<'a> PinnedRef<'a> {
    /// `reference`, whatever its sha256.
    pub fn unpinned(reference: &'a str) -> Self {
        Self {
            reference,
            pin: None,
        }
    }
}

/// The plugins one run loaded, by the name each declares and by every reference used for it.
#[derive(Default)]
pub struct PluginSet {
    by_ref: BTreeMap<String, Arc<LoadedPlugin>>,
    /// How each plugin (by declared name) was asked for: its config entry or `--plugin`.
    sources: BTreeMap<String, serde_json::Value>,
    /// Where each plugin (by digest) was read from, to read it again
    /// ([`PluginSet::component`]).
    origins: BTreeMap<String, PluginSource>,
}

impl PluginSet {
    /// Loads `plugin.reference` into the set, refused unless its sha256 is `plugin.pin` when
    /// one is given; `source` records how it was asked for (for `run.json`).
    pub fn load(
        &mut self,
        loader: &PluginLoader,
        base: &Path,
        plugin: PinnedRef<'_>,
        grants: &Grants,
        source: serde_json::Value,
    ) -> Result<Arc<LoadedPlugin>> {
        let PinnedRef { reference, pin } = plugin;
        let origin = loader.source(base, reference)?;
        let plugin = Arc::new(loader.load_from(&origin, pin, grants)?);
        self.origins.insert(plugin.digest().to_string(), origin);
        // A runner's plan says this with everything else it may run (see `runner::plugin`).
        if plugin.kind() != Kind::Runner {
            for grant in &plugin.effective_grants().exec {
                if let Some(warning) = super::capabilities::broad_grant_warning(grant) {
                    tracing::warn!("plugin {}: {warning}", plugin.info().name);
                }
            }
        }
        self.sources.insert(plugin.info().name.clone(), source);
        self.by_ref.insert(reference.to_string(), plugin.clone());
        self.by_ref
            .insert(plugin.info().name.clone(), plugin.clone());
        Ok(plugin)
    }

    /// Loads `reference` from the install store (or a file next to `base`) unless the set
    /// already holds it: how judges and `--runner` find installed plugins nobody listed.
    pub fn load_if_missing(
        &mut self,
        loader: &PluginLoader,
        base: &Path,
        reference: &str,
        grants: &Grants,
    ) -> Result<()> {
        if !self.by_ref.contains_key(reference) {
            let source = serde_json::json!("installed");
            self.load(loader, base, PinnedRef::unpinned(reference), grants, source)?;
        }
        Ok(())
    }

    /// Makes `alias` (a runner's short name) name the plugin `reference` already names.
    pub fn alias(&mut self, alias: &str, reference: &str) {
        if let Some(plugin) = self.by_ref.get(reference).cloned() {
            self.by_ref.insert(alias.to_string(), plugin);
        }
    }

    /// The plugin `reference` names, whatever its kind.
    pub fn find(&self, reference: &str) -> Option<&Arc<LoadedPlugin>> {
        self.by_ref.get(reference)
    }

    /// The plugin `reference` names, which must be of `kind`: otherwise an error that says
    /// what it is instead, or that nothing by that name is loaded.
    pub fn get(&self, reference: &str, kind: Kind) -> Result<Arc<LoadedPlugin>> {
        match self.by_ref.get(reference) {
            Some(plugin) if plugin.kind() == kind => Ok(plugin.clone()),
            Some(plugin) => bail!(
                "plugin `{reference}` ({}) is a {} plugin, not a {kind} plugin",
                plugin.label(),
                plugin.kind()
            ),
            None => bail!(
                "plugin `{reference}` is not loaded: list it in the config's `plugins`, pass \
                 --plugin, or install it with `mst plugin install`"
            ),
        }
    }

    /// The component `plugin` (of this set) was loaded from, read again and checked to be the
    /// same: to ship it to a machine (a grade shard's bundle).
    pub fn component(&self, plugin: &LoadedPlugin) -> Result<Vec<u8>> {
        let origin = self.origins.get(plugin.digest()).with_context(|| {
            format!(
                "plugin {} was not loaded from a file or the install store, so it cannot be \
                 shipped to a machine",
                plugin.label()
            )
        })?;
        let (bytes, label) = origin.read()?;
        let digest = super::loaded::digest(&bytes);
        if digest != plugin.digest() {
            bail!(
                "{label} changed since mst loaded it (sha256 {} then, {digest} now): run again \
                 once it stops changing",
                plugin.digest()
            );
        }
        Ok(bytes)
    }

    /// Every reference the set knows `plugin` by (its declared name among them).
    pub fn references(&self, plugin: &LoadedPlugin) -> Vec<String> {
        self.by_ref
            .iter()
            .filter(|(_, p)| p.digest() == plugin.digest())
            .map(|(reference, _)| reference.clone())
            .collect()
    }

    /// Adds `plugin`, already loaded, under each of `references` (a grade shard's worker
    /// loads the plugins its bundle carries this way).
    pub fn insert(&mut self, plugin: Arc<LoadedPlugin>, references: &[String]) {
        for reference in references {
            self.by_ref.insert(reference.clone(), plugin.clone());
        }
        self.by_ref.insert(plugin.info().name.clone(), plugin);
    }

    /// Each loaded plugin once, with how it was asked for.
    pub fn plugins(&self) -> Vec<(&Arc<LoadedPlugin>, serde_json::Value)> {
        let mut seen = std::collections::BTreeSet::new();
        self.by_ref
            .values()
            .filter(|p| seen.insert(p.digest().to_string()))
            .map(|p| {
                let source = self.sources.get(&p.info().name).cloned();
                (p, source.unwrap_or_default())
            })
            .collect()
    }
}
