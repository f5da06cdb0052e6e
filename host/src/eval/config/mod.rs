//! The eval config (`eval.json`), parsed strictly: an unknown key is an error that names the
//! key, the file and position, and the closest known key. One file per section: `servers`,
//! `clients` (and variants), `judges` (and pairwise, casePass), `checks`, `limits` (and
//! artifacts); `validate` checks what serde cannot, `suggest` makes the errors helpful, and
//! `mst_format` recognises MST's files.

mod checks;
mod clients;
mod judges;
mod limits;
mod mst_format;
mod servers;
mod suggest;
mod tools;
mod validate;
mod workspace;

pub use checks::{validate_checks, CheckSpec};
pub use clients::{Resume, VariantConfig, VariantSpec, AGENT_CLIS, CLIENTS, RESUME_PLACEHOLDER};
pub use judges::{CasePassConfig, CaseRule, JudgeConfig, PairwiseConfig};
pub use limits::{ArtifactsConfig, RateLimits};
pub use mst_format::mst_format_error;
pub use servers::{HttpServer, ServerConfig, StdioServer};
pub use suggest::{located, suggest, suggesting};
pub use tools::{DryRun, ToolOverride, ToolPolicy, TOOL_KEY_SEPARATOR};
pub use validate::{seconds, MAX_SECONDS};
pub use workspace::WorkspaceSpec;

use anyhow::{Context, Result};
use mst_format::mst_config_sign;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// A dataset entry: a path (JSON or JSONL file, or a directory), or `{type, …}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DatasetRef {
    /// A file (`.json` array or `.jsonl`) or a directory of `.json` case files.
    Path(String),
    /// `{"type": "file"|"dir"|<plugin name>, "path"?: …, …}`; other keys go to the plugin.
    Typed(BTreeMap<String, Value>),
}

/// A plugin the eval loads: a path or installed name, with capability grants.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PluginRef {
    Name(String),
    Detailed(PluginConfig),
}

/// `{"path": "./judge.wasm", "allowExec": ["git"], …}`, or
/// `{"plugin": "oci://…", "sha256": "…"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PluginConfig {
    /// A `.wasm` path (relative to the config), an installed name, or the `oci://…`
    /// reference a plugin was installed from; also written `plugin`.
    #[serde(alias = "plugin")]
    pub path: String,
    /// The component's sha256 (hex, `sha256:` allowed): any other build is refused before
    /// anything runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    #[serde(default)]
    pub allow_exec: Vec<String>,
    #[serde(default)]
    pub allow_read: Vec<String>,
    #[serde(default)]
    pub allow_http: Vec<String>,
    #[serde(default)]
    pub allow_model: Vec<String>,
    #[serde(default)]
    pub allow_secret: Vec<String>,
    #[serde(default)]
    pub allow_env: Vec<String>,
}

/// A whole eval config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EvalConfig {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub datasets: Vec<DatasetRef>,
    #[serde(default, deserialize_with = "servers::servers_by_label")]
    pub servers: BTreeMap<String, ServerConfig>,
    /// The client that runs a trial: `command` or `mcp`.
    pub client: String,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub client_options: Option<Value>,
    /// Variants by name; one variant `default` when absent.
    #[serde(default)]
    pub variants: BTreeMap<String, VariantConfig>,
    #[serde(default)]
    pub judges: Vec<JudgeConfig>,
    /// The variant the others are compared with: marked in the summary, and the `a` of a
    /// pairwise entry that names no `variants`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub baseline: Option<String>,
    /// Pairwise judges, each comparing two variants case by case.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pairwise: Vec<PairwiseConfig>,
    /// Repetitions of each case per variant (default 1).
    #[serde(default = "one")]
    pub trials: u32,
    /// Score at or above which a trial passes (default 1.0).
    #[serde(default = "full")]
    pub pass_threshold: f64,
    /// How a case's trials make its verdict (default: a majority must pass).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub case_pass: Option<CasePassConfig>,
    /// Most trials at once within a shard (default 4).
    #[serde(default = "four")]
    pub concurrency: u32,
    /// Per-trial deadline in seconds (default 60).
    #[serde(default = "sixty")]
    pub timeout: f64,
    #[serde(default)]
    pub limits: RateLimits,
    /// Model providers the `api` client may call, by name (`mock` is built in).
    #[serde(default)]
    pub providers: BTreeMap<String, crate::llm::http::ProviderConfig>,
    #[serde(default)]
    pub plugins: Vec<PluginRef>,
    /// What trials may leave as artefacts, and their caps (docs/results.md, "Artefacts").
    #[serde(default)]
    pub artifacts: ArtifactsConfig,
    /// Checks run inside the machine after each trial (a variant's own replace them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckSpec>,
    /// What the tool proxy shows the clients of the servers' tools, by `SERVER__TOOL` (a
    /// variant's own replace them).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolOverride>,
    /// Servers whose tools run only when read-only (`true`: all of them; a variant's own
    /// replaces it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRun>,
    /// The files laid fresh into every trial's work directory before its client starts (a
    /// variant's or a case's own replace them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workspace: Option<WorkspaceSpec>,
    /// Each trial on a machine of its own, made for it: for tasks whose environment is the
    /// machine itself (a Harbor task's container), which one trial's agent changes.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub fresh_machine: bool,
    /// Reference variants and what each must do on every case (`oracle` passes, `nop`
    /// fails): a case where one does otherwise is a broken task, which the summary lists.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub references: BTreeMap<String, Expected>,
}

/// What a reference variant must do on every case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Expected {
    /// Pass it (a reference solution).
    Pass,
    /// Fail it (doing nothing).
    Fail,
}

fn yes() -> bool {
    true
}
fn sixteen() -> u64 {
    16
}
fn gibibyte() -> u64 {
    1024
}

fn one() -> u32 {
    1
}
fn four() -> u32 {
    4
}
fn full() -> f64 {
    1.0
}
fn sixty() -> f64 {
    60.0
}

/// Parses config `text` from `file`: an MST config is refused with how to convert it, and a
/// serde error names the position and the closest key of its level.
fn from_text(text: &[u8], file: &Path) -> Result<EvalConfig> {
    if let Ok(value) = serde_json::from_slice::<Value>(text) {
        if let Some(sign) = mst_config_sign(&value) {
            return Err(mst_format_error(file, "eval config", &sign));
        }
    }
    serde_json::from_slice(text).map_err(|e| anyhow::anyhow!(located(file, 1, &e)))
}

impl EvalConfig {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<(Self, Vec<u8>)> {
        let bytes = std::fs::read(path)
            .with_context(|| format!("cannot read eval config {}", path.display()))?;
        let mut config = from_text(&bytes, path)?;
        config
            .expand_pairwise()
            .and_then(|()| config.validate())
            .with_context(|| format!("{} is not a valid eval config", path.display()))?;
        Ok((config, bytes))
    }

    /// Adds the providers of `$MST_HOME/providers.json` (`path`; a JSON object of providers,
    /// as in the config's `providers`) that the config does not configure itself: the config's
    /// own entry wins. A missing file adds nothing.
    pub fn add_providers_from(&mut self, path: &Path) -> Result<()> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", path.display())),
        };
        let providers: BTreeMap<String, crate::llm::http::ProviderConfig> =
            serde_json::from_slice(&bytes).map_err(|e| anyhow::anyhow!(located(path, 1, &e)))?;
        for (name, provider) in providers {
            provider
                .validate(&name, "")
                .with_context(|| format!("{} is not a valid providers file", path.display()))?;
            self.providers.entry(name).or_insert(provider);
        }
        Ok(())
    }

    /// Gives each provider with a default `limit` that `limits.providers` does not name its
    /// default there, where the limiter reads it.
    pub fn apply_provider_limits(&mut self) {
        for (name, provider) in &self.providers {
            if let Some(limit) = provider.limit {
                self.limits.providers.entry(name.clone()).or_insert(limit);
            }
        }
    }

    /// Parses config text (for tests and embedded defaults).
    pub fn parse(text: &str, label: &Path) -> Result<Self> {
        let mut config = from_text(text.as_bytes(), label)?;
        config.expand_pairwise()?;
        config.validate()?;
        Ok(config)
    }

    /// Variant `name` as its trials run: the config's defaults with the variant's overrides
    /// (`client`, `model`, `clientOptions`, and the subset of `servers` it names).
    pub fn variant(&self, name: &str) -> VariantSpec {
        let overrides = self.variants.get(name).cloned().unwrap_or_default();
        let servers = match &overrides.servers {
            Some(labels) => labels
                .iter()
                .filter_map(|l| self.servers.get(l).map(|s| (l.clone(), s.clone())))
                .collect(),
            None => self.servers.clone(),
        };
        let client = overrides.client.unwrap_or_else(|| self.client.clone());
        let model = overrides.model.or_else(|| self.model.clone());
        let provider = model
            .as_deref()
            .filter(|_| client == "api")
            .and_then(|m| crate::llm::ModelRef::parse(m).ok())
            .and_then(|m| self.providers.get(&m.provider).cloned());
        VariantSpec {
            client,
            model,
            client_options: overrides
                .client_options
                .or_else(|| self.client_options.clone()),
            servers,
            provider,
            checks: overrides.checks.unwrap_or_else(|| self.checks.clone()),
            tool_policy: ToolPolicy {
                tools: overrides.tools.unwrap_or_else(|| self.tools.clone()),
                dry_run: overrides.dry_run.or_else(|| self.dry_run.clone()),
            },
        }
    }

    /// The judges of variant `name`: its own list, or the config's.
    pub fn variant_judges(&self, name: &str) -> &[JudgeConfig] {
        self.variants
            .get(name)
            .and_then(|v| v.judges.as_deref())
            .unwrap_or(&self.judges)
    }

    /// Every judge the config names: the config's, then each variant's own.
    pub fn all_judges(&self) -> impl Iterator<Item = &JudgeConfig> {
        self.judges.iter().chain(
            self.variants
                .values()
                .flat_map(|v| v.judges.iter().flatten()),
        )
    }

    /// How a case's trials make its verdict (`casePass`; checked by [`Self::validate`]).
    pub fn case_rule(&self) -> CaseRule {
        self.case_pass
            .as_ref()
            .and_then(|c| c.rule().ok())
            .unwrap_or_default()
    }

    /// The variants to run: the configured ones, or `default`.
    pub fn variant_names(&self) -> Vec<String> {
        if self.variants.is_empty() {
            vec![crate::eval::trial::DEFAULT_VARIANT.to_string()]
        } else {
            self.variants.keys().cloned().collect()
        }
    }
}

/// The smallest valid config, for tests.
#[cfg(test)]
const MINIMAL: &str = r#"{"name": "t", "datasets": ["cases.jsonl"], "client": "command"}"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn providers_from_mst_home_fill_in_and_the_config_wins() {
        let mut config = EvalConfig::parse(
            r#"{"name": "e", "datasets": ["d"], "client": "command", "providers": {"acme": {"format": "openai",
                "baseUrl": "http://config.example", "key": "K"}}}"#,
            Path::new("t.json"),
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("providers.json");
        config.add_providers_from(&file).unwrap();
        assert_eq!(config.providers.len(), 1, "no file, nothing added");
        std::fs::write(
            &file,
            r#"{"acme": {"format": "anthropic", "baseUrl": "http://home.example", "key": "H"},
                "other": {"format": "openai", "baseUrl": "http://other.example", "key": "env:OTHER_KEY"}}"#,
        )
        .unwrap();
        config.add_providers_from(&file).unwrap();
        assert_eq!(config.providers["acme"].base_url, "http://config.example");
        assert_eq!(config.providers["other"].key, "env:OTHER_KEY");
        std::fs::write(
            &file,
            r#"{"bad": {"format": "openai", "baseUrl": "http://x", "key": "env:1BAD"}}"#,
        )
        .unwrap();
        let err = format!("{:#}", config.add_providers_from(&file).unwrap_err());
        assert!(err.contains("bad.key is `env:1BAD`"), "{err}");
        assert!(err.contains("providers.json"), "{err}");
        std::fs::write(
            &file,
            r#"{"bad": {"format": "openai", "baseUrl": "http://x", "key": "K", "limit": 0}}"#,
        )
        .unwrap();
        let err = format!("{:#}", config.add_providers_from(&file).unwrap_err());
        assert!(err.contains("bad.limit must be at least 1"), "{err}");
    }

    #[test]
    fn a_providers_default_limit_applies_unless_limits_names_it() {
        let mut config = EvalConfig::parse(
            r#"{"name": "e", "datasets": ["d"], "client": "command",
                "limits": {"providers": {"acme": 2}},
                "providers": {
                  "acme": {"format": "openai", "baseUrl": "http://a", "key": "K", "limit": 8},
                  "beta": {"format": "openai", "baseUrl": "http://b", "key": "K", "limit": 3},
                  "free": {"format": "openai", "baseUrl": "http://c", "key": "K"}}}"#,
            Path::new("t.json"),
        )
        .unwrap();
        config.apply_provider_limits();
        assert_eq!(
            config.limits.providers,
            BTreeMap::from([("acme".to_string(), 2), ("beta".to_string(), 3)])
        );
    }

    #[test]
    fn defaults() {
        let config = EvalConfig::parse(MINIMAL, Path::new("eval.json")).unwrap();
        assert_eq!(
            (config.trials, config.pass_threshold, config.concurrency),
            (1, 1.0, 4)
        );
        assert_eq!(config.variant_names(), ["default"]);
    }

    #[test]
    fn unknown_keys_name_the_file_position_and_suggestion() {
        let text = r#"{"name": "t", "datasets": ["c.jsonl"], "client": "command", "trails": 3}"#;
        let err = EvalConfig::parse(text, Path::new("evals/eval.json"))
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("evals/eval.json:1:"), "{err}");
        assert!(
            err.contains("unknown field `trails`") && err.contains("did you mean `trials`?"),
            "{err}"
        );
        let nested = r#"{"name": "t", "datasets": ["c"], "client": "mcp", "variants": {"a": {"clientOption": {}}}}"#;
        let err = EvalConfig::parse(nested, Path::new("e.json"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("clientOption") && err.contains("`clientOptions`"),
            "{err}"
        );
    }

    #[test]
    fn cross_references_are_checked() {
        let text = r#"{"name": "t", "datasets": ["c"], "client": "mcp", "variants": {"a": {"servers": ["nope"]}}}"#;
        let err = format!(
            "{:#}",
            EvalConfig::parse(text, Path::new("e.json")).unwrap_err()
        );
        assert!(err.contains("variants.a.servers names `nope`"), "{err}");
        let text = r#"{"name": "t", "datasets": ["c"], "client": "llm"}"#;
        assert!(EvalConfig::parse(text, Path::new("e.json")).is_err());
    }

    #[test]
    fn suggestions_are_for_typos_only() {
        let known = ["concurrency", "trials"];
        assert_eq!(suggest("concurency", &known), Some("concurrency"));
        assert_eq!(suggest("zzzzzz", &known), None);
    }

    /// The error for `text`, which must fail.
    fn error_of(text: &str) -> String {
        format!(
            "{:#}",
            EvalConfig::parse(text, Path::new("e.json")).unwrap_err()
        )
    }

    #[test]
    fn suggestions_come_from_the_keys_of_the_mistyped_level() {
        let top = |extra: &str| {
            error_of(&format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command", {extra}}}"#
            ))
        };
        // `mode` is `model` at the top and in a variant, but nothing in a judge.
        assert!(top(r#""mode": "x""#).contains("(did you mean `model`?)"));
        let variant = top(r#""variants": {"a": {"mode": "x"}}"#);
        assert!(variant.contains("(did you mean `model`?)"), "{variant}");
        let judge = top(r#""judges": [{"assert": "contains", "mode": "x"}]"#);
        assert!(
            judge.contains("unknown field `mode`") && !judge.contains("did you mean"),
            "{judge}"
        );
        let judge = top(r#""judges": [{"assert": "contains", "valeu": "x"}]"#);
        assert!(judge.contains("(did you mean `value`?)"), "{judge}");
        // `args` belongs to server entries, never to the top level.
        let arms = top(r#""arms": []"#);
        assert!(
            arms.contains("unknown field `arms`") && !arms.contains("did you mean"),
            "{arms}"
        );
        let limits = top(r#""limits": {"server": {}}"#);
        assert!(limits.contains("(did you mean `servers`?)"), "{limits}");
    }

    #[test]
    fn an_mst_config_is_refused_with_how_to_convert_it() {
        for (text, sign) in [
            (
                r#"{"$schema": "https://example.com/eval-config.schema.json", "name": "t", "datasets": ["c"]}"#,
                "it has a `$schema`",
            ),
            (
                r#"{"name": "t", "datasets": ["c"], "variants": [{"name": "a"}]}"#,
                "its `variants` is an array",
            ),
            (
                r#"{"name": "t", "datasets": ["c"], "servers": {"acme": {"transport": "http", "serverUrl": "http://x"}}}"#,
                "server `acme` has MST's `transport`",
            ),
            (
                r#"{"name": "t", "datasets": ["c"], "client": "command", "inputTemplate": "{{input}}"}"#,
                "MST's top-level key `inputTemplate`",
            ),
        ] {
            let err = error_of(text);
            assert!(
                err.starts_with("e.json is an MST (mcp-server-tester) eval config")
                    && err.contains(sign)
                    && err.contains("convert it with `mst import mst e.json`"),
                "{err}"
            );
        }
        // A near-typo of one of our keys is a typo, not MST.
        let err =
            error_of(r#"{"name": "t", "datasets": ["c"], "client": "command", "provider": {}}"#);
        assert!(err.contains("did you mean `providers`?"), "{err}");
    }
}
