//! The client that runs a variant's trials: the names a config may give, a variant's
//! overrides (`variants`), the variant as it runs (`VariantSpec`, what a bundle carries), and a
//! `command` client's `resume`.

use super::checks::CheckSpec;
use super::judges::JudgeConfig;
use super::servers::ServerConfig;
use super::suggest::suggesting;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// Per-variant overrides of the client fields, servers and judges.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VariantConfig {
    #[serde(default)]
    pub client: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub client_options: Option<Value>,
    /// Labels of `servers` this variant uses (default: all).
    #[serde(default)]
    pub servers: Option<Vec<String>>,
    #[serde(default)]
    pub judges: Option<Vec<JudgeConfig>>,
    /// Checks run in the machine after each trial, replacing the eval's `checks`.
    #[serde(default)]
    pub checks: Option<Vec<CheckSpec>>,
    /// The files laid into each trial's work directory, replacing the eval's `workspace`.
    #[serde(default)]
    pub workspace: Option<super::WorkspaceSpec>,
    /// The Docker image this variant's trials run in, in place of the runner's `image`.
    #[serde(default)]
    pub image: Option<String>,
    /// What the tool proxy shows this variant's client, replacing the eval's `tools`.
    #[serde(default)]
    pub tools: Option<BTreeMap<String, super::ToolOverride>>,
    /// Replaces the eval's `dryRun`.
    #[serde(default)]
    pub dry_run: Option<super::DryRun>,
}

/// The placeholder in `clientOptions.resume.arg` that the held resume token replaces.
pub const RESUME_PLACEHOLDER: &str = "{token}";

/// A `command` client's `clientOptions.resume`, as written: how an agent CLI continues a
/// conversation. `capture` is matched against each stdout line of the client (its first
/// capture group, or the whole match without one, is the token; the last one of a turn wins);
/// `arg` is appended to the command on the next turn, `{token}` replaced by the token.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct ResumeConfig {
    capture: String,
    arg: Vec<String>,
}

/// A checked `clientOptions.resume`: the compiled pattern and the arguments.
#[derive(Debug, Clone)]
pub struct Resume {
    pub capture: regex::Regex,
    pub arg: Vec<String>,
}

/// The largest compiled `resume.capture` pattern, in bytes (the regex crate's own measure).
const MAX_RESUME_REGEX_BYTES: usize = 1 << 20;

impl Resume {
    /// Reads and checks `value`, the `resume` of some `clientOptions`; errors name `place`
    /// (e.g. `clientOptions.resume`) and its field.
    pub fn parse(value: &Value, place: &str) -> Result<Self> {
        let config: ResumeConfig = serde_json::from_value(value.clone())
            .map_err(suggesting)
            .with_context(|| {
                format!(
                    "{place} must be {{\"capture\": REGEX, \"arg\": [\"--resume\", \"{RESUME_PLACEHOLDER}\"]}}"
                )
            })?;
        let capture = regex::RegexBuilder::new(&config.capture)
            .size_limit(MAX_RESUME_REGEX_BYTES)
            .build()
            .with_context(|| format!("{place}.capture is not a valid regular expression"))?;
        if config.arg.is_empty() {
            bail!(
                "{place}.arg is empty: give the arguments that continue a conversation, with \
                 `{RESUME_PLACEHOLDER}` where the token goes (e.g. [\"--resume\", \"{RESUME_PLACEHOLDER}\"])"
            );
        }
        if !config.arg.iter().any(|a| a.contains(RESUME_PLACEHOLDER)) {
            bail!(
                "{place}.arg {:?} does not hold `{RESUME_PLACEHOLDER}`: without it the next turn \
                 cannot name the conversation to continue",
                config.arg
            );
        }
        Ok(Resume {
            capture,
            arg: config.arg,
        })
    }

    /// The arguments that continue the conversation `token` names.
    pub fn args(&self, token: &str) -> Vec<String> {
        self.arg
            .iter()
            .map(|a| a.replace(RESUME_PLACEHOLDER, token))
            .collect()
    }

    /// The token `line` holds, if the pattern matches it: its first capture group, or the
    /// whole match without one.
    pub fn capture(&self, line: &str) -> Option<String> {
        let found = self.capture.captures(line)?;
        let token = found.get(1).or_else(|| found.get(0))?.as_str();
        (!token.is_empty()).then(|| token.to_string())
    }
}

/// The clients a config may name (see `crate::client`).
pub const CLIENTS: [&str; 5] = ["command", "mcp", "api", "claude-code", "codex"];

/// The clients that are agent CLIs, calling their models through the machine's model gateway.
pub const AGENT_CLIS: [&str; 2] = ["claude-code", "codex"];

/// How one variant's trials are run: what [`EvalConfig::variant`] resolves and a worker's
/// bundle carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VariantSpec {
    pub client: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_options: Option<serde_json::Value>,
    /// The MCP servers this variant uses, by label.
    #[serde(default)]
    pub servers: BTreeMap<String, ServerConfig>,
    /// The configured provider of the `api` client's model (never its key).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<crate::llm::http::ProviderConfig>,
    /// The checks the worker runs after each of this variant's trials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckSpec>,
    /// What the tool proxy shows the client of its servers' tools, and lets through.
    #[serde(default, skip_serializing_if = "super::ToolPolicy::is_empty")]
    pub tool_policy: super::ToolPolicy,
}

impl VariantSpec {
    /// The tokens a worker needs for this variant: its MCP servers' (by label), and its
    /// `secretEnv` secrets and its servers' `envSecrets`/`headerSecrets` (`secret:NAME`). A
    /// model provider's key is never one: the host calls providers (the model gateway).
    pub fn token_names(&self) -> Vec<String> {
        let servers = self
            .servers
            .iter()
            .filter_map(|(label, config)| match config {
                ServerConfig::Http(http) if http.token.is_some() => Some(label.clone()),
                _ => None,
            });
        let secrets = self
            .secret_env()
            .into_iter()
            .chain(self.servers.values().flat_map(ServerConfig::secrets))
            .map(|(_, name)| crate::secrets::secret_token(&name));
        servers.chain(secrets).collect()
    }

    /// The `command` client's `clientOptions.resume`, checked; `None` for other clients and
    /// when it is not set.
    pub fn resume(&self) -> Result<Option<Resume>> {
        self.client_options
            .as_ref()
            .filter(|_| self.client == "command")
            .and_then(|o| o.get("resume"))
            .map(|value| Resume::parse(value, "clientOptions.resume"))
            .transpose()
    }

    /// The `command` client's `secretEnv`: (variable, secret name) pairs.
    pub fn secret_env(&self) -> Vec<(String, String)> {
        let options = self
            .client_options
            .as_ref()
            .filter(|_| self.client == "command");
        options
            .and_then(|o| o.get("secretEnv"))
            .and_then(|v| v.as_object())
            .into_iter()
            .flatten()
            .filter_map(|(var, name)| Some((var.clone(), name.as_str()?.to_string())))
            .collect()
    }

    /// Whether this variant's trials call models through the machine's model gateway: an agent
    /// CLI's, the `api` client's on a configured provider (the built-in `mock` answers on the
    /// machine, with no key and no provider to reach), or a `command` client's with
    /// `clientOptions.modelGateway`.
    pub fn uses_gateway(&self) -> bool {
        let option = self
            .client_options
            .as_ref()
            .and_then(|o| o.get("modelGateway"))
            .and_then(serde_json::Value::as_bool);
        let on_a_provider = self
            .model
            .as_deref()
            .and_then(|m| crate::llm::ModelRef::parse(m).ok())
            .is_some_and(|m| m.provider != "mock");
        AGENT_CLIS.contains(&self.client.as_str())
            || (self.client == "api" && on_a_provider)
            || (self.client == "command" && option == Some(true))
    }

    /// The MCP servers a trial of this variant calls, for `limits.servers`.
    pub fn server_labels(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::config::EvalConfig;

    #[test]
    fn an_api_variant_on_a_provider_goes_through_the_gateway_and_gets_no_key() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eval.json");
        let text = r#"{"name": "t", "datasets": ["c"], "client": "api", "model": "mock/echo",
            "providers": {"acme": {"format": "anthropic", "baseUrl": "http://127.0.0.1:9",
                                   "key": "ACME_KEY"}},
            "variants": {"provider": {"model": "acme/m"}, "mock": {}}}"#;
        std::fs::write(&file, text).unwrap();
        let (config, _) = EvalConfig::load(&file).unwrap();
        let on_provider = config.variant("provider");
        assert!(on_provider.uses_gateway());
        assert!(on_provider.token_names().is_empty(), "no key travels");
        assert!(
            !config.variant("mock").uses_gateway(),
            "mock answers on the machine"
        );
    }

    #[test]
    fn a_bad_resume_is_refused_naming_its_field() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("eval.json");
        let load = |options: &str, variants: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command",
                    "clientOptions": {options}{variants}}}"#
            );
            std::fs::write(&file, text).unwrap();
            EvalConfig::load(&file).map_err(|e| format!("{e:#}"))
        };
        let good = r#"{"command": ["cli"], "resume": {"capture": "^session: (\\S+)$", "arg": ["--resume", "{token}"]}}"#;
        let (config, _) = load(good, "").unwrap();
        let resume = config.variant("default").resume().unwrap().unwrap();
        assert_eq!(resume.capture("session: abc-1").as_deref(), Some("abc-1"));
        assert_eq!(resume.capture("no session here"), None);
        assert_eq!(resume.args("abc-1"), ["--resume", "abc-1"]);
        let whole = Resume::parse(
            &serde_json::json!({"capture": "id-[0-9]+", "arg": ["-r={token}"]}),
            "x",
        )
        .unwrap();
        assert_eq!(whole.capture("got id-42 ok").as_deref(), Some("id-42"));
        for (options, says) in [
            (
                r#"{"command": ["cli"], "resume": {"capture": "(", "arg": ["{token}"]}}"#,
                "clientOptions.resume.capture is not a valid regular expression",
            ),
            (
                r#"{"command": ["cli"], "resume": {"capture": "x", "arg": []}}"#,
                "clientOptions.resume.arg is empty",
            ),
            (
                r#"{"command": ["cli"], "resume": {"capture": "x", "arg": ["--resume"]}}"#,
                "clientOptions.resume.arg [\"--resume\"] does not hold `{token}`",
            ),
            (
                r#"{"command": ["cli"], "resume": {"capture": "x", "arg": ["{token}"], "args": 1}}"#,
                "unknown field `args`",
            ),
            (
                r#"{"command": ["cli"], "resume": {"arg": ["{token}"]}}"#,
                "missing field `capture`",
            ),
        ] {
            let err = load(options, "").unwrap_err();
            assert!(err.contains(says), "{options}: {err}");
            assert!(
                err.contains(&file.display().to_string()),
                "names the file: {err}"
            );
        }
        let err = load(
            r#"{"command": ["cli"]}"#,
            r#", "variants": {"plain": {}, "chat": {"clientOptions": {"command": ["c"], "resume": {"capture": "x", "arg": []}}}}"#,
        )
        .unwrap_err();
        assert!(
            err.contains("variants.chat.clientOptions.resume.arg is empty"),
            "{err}"
        );
        let err = load(
            r#"{"resume": {"capture": "x", "arg": ["{token}"]}}"#,
            r#", "variants": {"m": {"client": "mcp"}}"#,
        )
        .unwrap_err();
        assert!(
            err.contains("clientOptions.resume is set, but variant `m` uses the `mcp` client"),
            "{err}"
        );
    }
}
