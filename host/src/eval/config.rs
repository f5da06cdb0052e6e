//! The eval config (`eval.json`), parsed strictly: an unknown key is an error that names the
//! key, the file and position, and the closest known key.

use anyhow::{bail, Context, Result};
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

/// An MCP server, by label: an entry with `url` is a streamable-HTTP server, any other a stdio
/// one. Read through [`ServerConfig::from_entry`], so an unknown key is an error that names it
/// with a suggestion from that kind of entry's keys.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ServerConfig {
    /// A server started as a subprocess speaking MCP over stdio.
    Stdio(StdioServer),
    /// A streamable-HTTP server.
    Http(HttpServer),
}

/// `{"command": "uvx", "args": ["mcp-server-time"], "env": {"TZ": "UTC"}, "cwd": "sub"}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct StdioServer {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    /// Environment for the server (values are config, not secrets).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Environment variables whose values are secrets, by the secret's name: delivered to the
    /// worker as tokens (`secret:NAME`), set for the server process only.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env_secrets: BTreeMap<String, String>,
    /// The server's working directory, relative to the trial's scratch directory (created when
    /// missing); the server starts in the scratch directory itself without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `{"url": "http://127.0.0.1:3001/mcp", "token": "TIME_TOKEN", "headers": {"X-Team": "evals"},
/// "headerSecrets": {"X-Api-Key": "TIME_KEY"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct HttpServer {
    pub url: String,
    /// The name of a secret (from `--secrets-file`) sent as the bearer token. Only the name is
    /// in the config and the bundle; the value travels to workers on stdin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// Headers sent with every request (values are config, not secrets).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Headers whose values are secrets, by the secret's name: delivered to the worker as
    /// tokens (`secret:NAME`) like `token`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub header_secrets: BTreeMap<String, String>,
}

/// The keys of a stdio server entry, for suggestions.
const STDIO_KEYS: &[&str] = &["command", "args", "env", "envSecrets", "cwd"];
/// The keys of an HTTP server entry, for suggestions.
const HTTP_KEYS: &[&str] = &["url", "token", "headers", "headerSecrets"];
/// Headers the MCP transport sets itself (rmcp refuses them as custom headers).
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "content-type",
    "mcp-session-id",
    "mcp-protocol-version",
    "last-event-id",
];

impl ServerConfig {
    /// Reads the entry of server `label`: with `url` an HTTP server, else a stdio one. An
    /// unknown key is named, with the closest key of that kind of entry. (An MST entry, with
    /// `transport` or `serverUrl`, is recognised before this, with the whole config.)
    pub fn from_entry(label: &str, entry: Value) -> std::result::Result<Self, String> {
        let place = format!("servers.{label}");
        let Value::Object(map) = &entry else {
            return Err(format!(
                "{place} must be an object: `{{\"command\": …}}` (stdio) or `{{\"url\": …}}` (HTTP)"
            ));
        };
        let (parsed, keys) = if map.contains_key("url") {
            (
                serde_json::from_value(entry.clone()).map(ServerConfig::Http),
                HTTP_KEYS,
            )
        } else if map.contains_key("command") {
            (
                serde_json::from_value(entry.clone()).map(ServerConfig::Stdio),
                STDIO_KEYS,
            )
        } else {
            let unknown = map
                .keys()
                .find(|k| !STDIO_KEYS.contains(&k.as_str()) && !HTTP_KEYS.contains(&k.as_str()));
            let hint = unknown
                .and_then(|k| suggest(k, STDIO_KEYS).or_else(|| suggest(k, HTTP_KEYS)))
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            return Err(format!(
                "{place} has neither `command` (a stdio server) nor `url` (an HTTP server){hint}"
            ));
        };
        let server = parsed.map_err(|e| {
            let text = e.to_string();
            let suggestion = text
                .strip_prefix("unknown field `")
                .and_then(|rest| rest.split('`').next())
                .and_then(|key| suggest(key, keys))
                .map(|k| format!(" (did you mean `{k}`?)"))
                .unwrap_or_default();
            format!("{place}: {text}{suggestion}")
        })?;
        server.validate(&place)?;
        Ok(server)
    }

    /// What serde cannot check: a `cwd` inside the scratch directory, header names.
    fn validate(&self, place: &str) -> std::result::Result<(), String> {
        match self {
            ServerConfig::Stdio(server) => {
                let Some(cwd) = &server.cwd else {
                    return Ok(());
                };
                // The server runs on the worker's machine, not the host: a path there is only
                // meaningful inside the trial's own directory.
                let path = Path::new(cwd);
                let inside = path.components().all(|c| {
                    matches!(
                        c,
                        std::path::Component::Normal(_) | std::path::Component::CurDir
                    )
                });
                if cwd.is_empty() || !inside {
                    return Err(format!(
                        "{place}.cwd is {cwd:?}: give a relative path inside the trial's scratch \
                         directory (no `/` at the start, no `..`)"
                    ));
                }
                Ok(())
            }
            ServerConfig::Http(server) => {
                for (field, name) in server
                    .headers
                    .keys()
                    .map(|n| ("headers", n))
                    .chain(server.header_secrets.keys().map(|n| ("headerSecrets", n)))
                {
                    let lower = name.to_ascii_lowercase();
                    if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
                        return Err(format!("{place}.{field}: {name:?} is not a header name"));
                    }
                    if RESERVED_HEADERS.contains(&lower.as_str()) {
                        return Err(format!(
                            "{place}.{field}.{name}: the MCP transport sets this header itself"
                        ));
                    }
                    if lower == "authorization" && server.token.is_some() {
                        return Err(format!(
                            "{place}.{field}.{name}: `token` already sends `Authorization`; \
                             use one of them"
                        ));
                    }
                }
                if let Some(name) = server.headers.keys().find(|n| {
                    server
                        .header_secrets
                        .keys()
                        .any(|s| s.eq_ignore_ascii_case(n))
                }) {
                    return Err(format!(
                        "{place}: header `{name}` is in both `headers` and `headerSecrets`"
                    ));
                }
                Ok(())
            }
        }
    }

    /// The secrets this server's entry names besides `token`: (where, secret name) pairs,
    /// delivered as `secret:NAME` tokens.
    pub fn secrets(&self) -> Vec<(String, String)> {
        let (field, map) = match self {
            ServerConfig::Stdio(server) => ("envSecrets", &server.env_secrets),
            ServerConfig::Http(server) => ("headerSecrets", &server.header_secrets),
        };
        map.iter()
            .map(|(key, name)| (format!("{field}.{key}"), name.clone()))
            .collect()
    }
}

impl<'de> Deserialize<'de> for ServerConfig {
    fn deserialize<D: serde::Deserializer<'de>>(
        deserializer: D,
    ) -> std::result::Result<Self, D::Error> {
        // Unlabelled (a bundle's entry); the config's `servers` is read by `servers_by_label`.
        ServerConfig::from_entry("?", Value::deserialize(deserializer)?)
            .map_err(serde::de::Error::custom)
    }
}

/// Reads `servers` entry by entry, so an error names the server's label.
fn servers_by_label<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> std::result::Result<BTreeMap<String, ServerConfig>, D::Error> {
    BTreeMap::<String, Value>::deserialize(deserializer)?
        .into_iter()
        .map(|(label, entry)| {
            let server =
                ServerConfig::from_entry(&label, entry).map_err(serde::de::Error::custom)?;
            Ok((label, server))
        })
        .collect()
}

/// A judge: a plugin grader or a built-in assertion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JudgeConfig {
    /// A name for reports; defaults to the plugin or assertion name.
    #[serde(default)]
    pub name: Option<String>,
    /// An installed grader name, or a key of `plugins`.
    #[serde(default)]
    pub plugin: Option<String>,
    /// A built-in assertion: `contains`, `not-contains`, `equals`, `regex`, `exit-code`, or one on
    /// tool calls (`tools-called`, `tool-call-count`, `no-tool-errors`, `tool-not-called`).
    #[serde(default)]
    pub assert: Option<String>,
    /// The assertion's value, or the plugin's options.
    #[serde(default)]
    pub value: Option<Value>,
    #[serde(default)]
    pub options: Option<Value>,
    /// Weight in the trial's score (default 1).
    #[serde(default)]
    pub weight: Option<f64>,
}

/// A pairwise judge: a pairwise-grader plugin comparing two variants' traces of each case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairwiseConfig {
    /// A name for reports; defaults to `<a>-vs-<b>`.
    #[serde(default)]
    pub name: Option<String>,
    /// An installed pairwise grader's name, or a key of `plugins`.
    pub plugin: String,
    /// The two variants compared, `[a, b]`; wins are counted for `a`. Left out, the entry
    /// compares `baseline` with each other variant.
    #[serde(default)]
    pub variants: Vec<String>,
    /// The plugin's options.
    #[serde(default)]
    pub options: Option<Value>,
}

impl PairwiseConfig {
    /// The name reports use: `name`, or `<a>-vs-<b>`.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| self.variants.join("-vs-"))
    }
}

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
}

/// A check the worker runs inside the machine after a trial's client finished, in the
/// trial's work directory, before anything is cleaned up: the repository's tests after an
/// agent edited code, a look at a file it should have made. Its exit code and the end of its
/// output become the trace's `check` event, which `check-passed` and grader plugins read.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSpec {
    /// Names its event and what `check-passed` asks for: letters, digits, `-`, `_`, `.`.
    pub name: String,
    /// The program and its arguments (no shell: write `["sh", "-c", "…"]` for one).
    pub run: Vec<String>,
    /// Seconds it may take (default 60, at most a day); past it, it is killed and fails.
    #[serde(default = "sixty")]
    pub timeout: f64,
}

/// Checks a `checks` list at `place` (`checks`, `variants.V.checks`, a case's `checks`): each
/// named plainly and once, with a program, within a day.
pub fn validate_checks(checks: &[CheckSpec], place: &str) -> Result<()> {
    let mut names = std::collections::BTreeSet::new();
    for (index, check) in checks.iter().enumerate() {
        let at = format!("{place}[{index}]");
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if check.name.is_empty() || !check.name.chars().all(plain) {
            bail!(
                "`{at}.name` is {:?}: name a check with letters, digits, `-`, `_` or `.`",
                check.name
            );
        }
        if !names.insert(check.name.as_str()) {
            bail!(
                "`{at}.name`: another check of `{place}` is called `{}`",
                check.name
            );
        }
        if check.run.first().is_none_or(|program| program.is_empty()) {
            bail!("`{at}.run` is empty: give the program and its arguments, e.g. [\"pytest\", \"-q\"]");
        }
        seconds(&format!("`{at}.timeout`"), check.timeout)?;
    }
    Ok(())
}

/// Most trials at once, per model provider and per MCP server, across all shards.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimits {
    #[serde(default)]
    pub providers: BTreeMap<String, u32>,
    #[serde(default)]
    pub servers: BTreeMap<String, u32>,
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
pub const CLIENTS: [&str; 3] = ["command", "mcp", "api"];

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
    pub provider: Option<crate::model::http::ProviderConfig>,
    /// The checks the worker runs after each of this variant's trials.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckSpec>,
}

impl VariantSpec {
    /// The tokens a worker needs for this variant: its MCP servers' (by label), its model
    /// provider's key (`provider:NAME`), and its `secretEnv` secrets and its servers'
    /// `envSecrets`/`headerSecrets` (`secret:NAME`).
    pub fn token_names(&self) -> Vec<String> {
        let servers = self
            .servers
            .iter()
            .filter_map(|(label, config)| match config {
                ServerConfig::Http(http) if http.token.is_some() => Some(label.clone()),
                _ => None,
            });
        let provider = self
            .provider
            .as_ref()
            .and_then(|_| self.providers().into_iter().next())
            .map(|name| crate::model::key_token(&name));
        let secrets = self
            .secret_env()
            .into_iter()
            .chain(self.servers.values().flat_map(ServerConfig::secrets))
            .map(|(_, name)| crate::secrets::secret_token(&name));
        servers.chain(provider).chain(secrets).collect()
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

    /// The model providers a trial of this variant calls (the `api` client's model's
    /// provider), for `limits.providers`.
    pub fn providers(&self) -> Vec<String> {
        let model = self.model.as_deref().filter(|_| self.client == "api");
        model
            .and_then(|m| crate::model::ModelRef::parse(m).ok())
            .map(|m| vec![m.provider])
            .unwrap_or_default()
    }

    /// The MCP servers a trial of this variant calls, for `limits.servers`.
    pub fn server_labels(&self) -> Vec<String> {
        self.servers.keys().cloned().collect()
    }
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

/// `casePass`: `{"rule": "majority"}` or `{"share": S}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CasePassConfig {
    /// `majority` (the only named rule).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rule: Option<String>,
    /// The share of a case's trials, from 0 to 1, that must pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share: Option<f64>,
}

/// How a case's trials make its verdict, once each trial is graded. Written as its
/// `casePass` entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(into = "CasePassConfig", try_from = "CasePassConfig")]
pub enum CaseRule {
    /// More than half of the trials pass (a tie fails).
    #[default]
    Majority,
    /// At least this share of the trials pass.
    Share(f64),
}

impl From<CaseRule> for CasePassConfig {
    fn from(rule: CaseRule) -> Self {
        match rule {
            CaseRule::Majority => CasePassConfig {
                rule: Some("majority".into()),
                share: None,
            },
            CaseRule::Share(share) => CasePassConfig {
                rule: None,
                share: Some(share),
            },
        }
    }
}

impl TryFrom<CasePassConfig> for CaseRule {
    type Error = anyhow::Error;
    fn try_from(entry: CasePassConfig) -> Result<Self> {
        entry.rule()
    }
}

impl CasePassConfig {
    /// The rule this entry names; errors name the `casePass` field at fault.
    pub fn rule(&self) -> Result<CaseRule> {
        match (self.rule.as_deref(), self.share) {
            (Some("majority"), None) => Ok(CaseRule::Majority),
            (None | Some("share"), Some(share)) if (0.0..=1.0).contains(&share) => {
                Ok(CaseRule::Share(share))
            }
            (None | Some("share"), Some(share)) => {
                let hint = if (2.0..=100.0).contains(&share) {
                    format!(" (for {share}% write {})", share / 100.0)
                } else {
                    String::new()
                };
                bail!(
                    "`casePass.share` must be between 0 and 1 (the share of a case's trials that must pass), not {share}{hint}"
                )
            }
            (Some(other), None) => bail!(
                "`casePass.rule` is {other:?}; write `{{\"rule\": \"majority\"}}` or `{{\"share\": S}}`"
            ),
            (Some(other), Some(_)) => bail!(
                "`casePass` has both `rule` ({other:?}) and `share`; write `{{\"rule\": \"majority\"}}` or `{{\"share\": S}}`"
            ),
            (None, None) => bail!(
                "`casePass` is empty; write `{{\"rule\": \"majority\"}}` or `{{\"share\": S}}`"
            ),
        }
    }
}

/// A whole eval config.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct EvalConfig {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    pub datasets: Vec<DatasetRef>,
    #[serde(default, deserialize_with = "servers_by_label")]
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
    pub providers: BTreeMap<String, crate::model::http::ProviderConfig>,
    #[serde(default)]
    pub plugins: Vec<PluginRef>,
    /// What trials may leave as artefacts, and their caps (docs/results.md, "Artefacts").
    #[serde(default)]
    pub artifacts: ArtifactsConfig,
    /// Checks run inside the machine after each trial (a variant's own replace them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckSpec>,
}

/// The eval's `artifacts`: whether trials keep artefacts (the files a client writes into
/// `$MST_ARTIFACTS`, and the worker's diagnosis of a failed trial), and how much of them comes
/// back. Off for evals whose transcripts must not be stored: a diagnosis holds the end of the
/// client's output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ArtifactsConfig {
    /// Whether trials keep artefacts (default true).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// The most MiB one trial's artefacts bring back (default 16).
    #[serde(default = "sixteen", rename = "maxTrialMiB")]
    pub max_trial_mib: u64,
    /// The most MiB all of a run's artefacts bring back (default 1024).
    #[serde(default = "gibibyte", rename = "maxRunMiB")]
    pub max_run_mib: u64,
}

impl Default for ArtifactsConfig {
    fn default() -> Self {
        ArtifactsConfig {
            enabled: true,
            max_trial_mib: sixteen(),
            max_run_mib: gibibyte(),
        }
    }
}

impl ArtifactsConfig {
    /// The per-trial cap in bytes.
    pub fn max_trial_bytes(&self) -> u64 {
        self.max_trial_mib.saturating_mul(1 << 20)
    }
    /// The per-run cap in bytes.
    pub fn max_run_bytes(&self) -> u64 {
        self.max_run_mib.saturating_mul(1 << 20)
    }
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

/// The longest duration a config may set, in seconds: one day. Anything longer is almost
/// always milliseconds written where seconds belong (MST's configs use milliseconds).
pub const MAX_SECONDS: f64 = 86_400.0;

/// Checks a duration in seconds named `field`: positive, finite and at most a day.
pub fn seconds(field: &str, value: f64) -> Result<std::time::Duration> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{field} must be a positive number of seconds, not {value}");
    }
    if value > MAX_SECONDS {
        bail!(
            "{field} is {value} seconds, more than a day; MST wrote milliseconds: did you mean {}?",
            value / 1000.0
        );
    }
    Ok(std::time::Duration::from_secs_f64(value))
}

/// Top-level keys only MST's eval config has (none is a near-typo of one of ours).
const MST_ONLY_KEYS: &[&str] = &[
    "toolMap",
    "tools",
    "inputTemplate",
    "metrics",
    "results",
    "maxCases",
    "maxToolCalls",
    "requireEvalEndpoint",
    "filterTags",
    "run",
    "temperature",
    "maxTokens",
    "redactStoredResponses",
    "extends",
    "coworkSetup",
    "pricing",
];

/// Why `value` looks like an MST (mcp-server-tester) eval config, if it does: a `$schema`,
/// an MST-only top-level key, `variants` as an array, or a server entry with `transport` or
/// `serverUrl`.
fn mst_config_sign(value: &Value) -> Option<String> {
    let object = value.as_object()?;
    if let Some(schema) = object.get("$schema") {
        return Some(format!("it has a `$schema` ({schema})"));
    }
    if let Some(key) = MST_ONLY_KEYS.iter().find(|k| object.contains_key(**k)) {
        return Some(format!("it has MST's top-level key `{key}`"));
    }
    if object.get("variants").is_some_and(Value::is_array) {
        return Some("its `variants` is an array".into());
    }
    let servers = object.get("servers").and_then(Value::as_object)?;
    servers.iter().find_map(|(label, entry)| {
        let key = ["transport", "serverUrl"]
            .into_iter()
            .find(|k| entry.get(k).is_some())?;
        Some(format!("server `{label}` has MST's `{key}`"))
    })
}

/// The error for a file in MST's format: what it is, why it looks so, and how to convert it.
pub fn mst_format_error(file: &Path, what: &str, sign: &str) -> anyhow::Error {
    anyhow::anyhow!(
        "{} is an MST (mcp-server-tester) {what} ({sign}), which mst does not read: convert it \
         with `mst import mst {}`",
        file.display(),
        file.display()
    )
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
        let providers: BTreeMap<String, crate::model::http::ProviderConfig> =
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

    /// Checks what serde cannot: ranges, names, references between sections.
    pub fn validate(&self) -> Result<()> {
        if self.name.is_empty()
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.')
        {
            bail!("`name` must be letters, digits, `-`, `_` or `.` (it names the results directory), not {:?}", self.name);
        }
        if self.datasets.is_empty() {
            bail!("`datasets` is empty: name at least one dataset file, directory or plugin");
        }
        if !CLIENTS.contains(&self.client.as_str()) {
            bail!(
                "`client` is {:?}; the clients are {}",
                self.client,
                CLIENTS.join(", ")
            );
        }
        for (name, provider) in &self.providers {
            provider.validate(name, "providers.")?;
        }
        for (index, plugin) in self.plugins.iter().enumerate() {
            if let PluginRef::Detailed(PluginConfig {
                sha256: Some(pin), ..
            }) = plugin
            {
                let hex = pin.strip_prefix("sha256:").unwrap_or(pin);
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    bail!(
                        "`plugins[{index}].sha256` is {pin:?}: write the component's sha256 as 64 \
                         hex digits (`mst plugin list` shows it)"
                    );
                }
            }
        }
        if self.trials == 0 {
            bail!("`trials` must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.pass_threshold) {
            bail!(
                "`passThreshold` must be between 0 and 1, not {}",
                self.pass_threshold
            );
        }
        if let Some(case_pass) = &self.case_pass {
            case_pass.rule()?;
        }
        if self.concurrency == 0 {
            bail!("`concurrency` must be at least 1");
        }
        seconds("`timeout`", self.timeout)?;
        validate_checks(&self.checks, "checks")?;
        for (name, variant) in &self.variants {
            if let Some(checks) = &variant.checks {
                validate_checks(checks, &format!("variants.{name}.checks"))?;
            }
            if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                bail!("variant name {name:?} cannot be used as a directory name");
            }
            if let Some(client) = &variant.client {
                if !CLIENTS.contains(&client.as_str()) {
                    bail!(
                        "variants.{name}.client is {client:?}; the clients are {}",
                        CLIENTS.join(", ")
                    );
                }
            }
            for server in variant.servers.iter().flatten() {
                if !self.servers.contains_key(server) {
                    bail!("variants.{name}.servers names `{server}`, which is not in `servers`");
                }
            }
        }
        for name in self.variant_names() {
            let own = self
                .variants
                .get(&name)
                .is_some_and(|v| v.client_options.is_some());
            let place = match own {
                true => format!("variants.{name}.clientOptions.resume"),
                false => "clientOptions.resume".to_string(),
            };
            let spec = self.variant(&name);
            if let Some(value) = spec.client_options.as_ref().and_then(|o| o.get("resume")) {
                if spec.client != "command" {
                    bail!(
                        "{place} is set, but variant `{name}` uses the `{}` client: only the \
                         `command` client resumes conversations this way",
                        spec.client
                    );
                }
                Resume::parse(value, &place)?;
            }
        }
        for server in self.limits.servers.keys() {
            if !self.servers.contains_key(server) {
                bail!("limits.servers names `{server}`, which is not in `servers`");
            }
        }
        for judge in self.judges.iter().chain(
            self.variants
                .values()
                .flat_map(|v| v.judges.iter().flatten()),
        ) {
            match (&judge.plugin, &judge.assert) {
                (Some(_), None) | (None, Some(_)) => {}
                _ => bail!("each judge needs exactly one of `plugin` and `assert`"),
            }
        }
        self.validate_pairwise()
    }

    /// Checks `baseline` and turns each pairwise entry without `variants` into one judge per
    /// other variant, `[baseline, other]`, named `name-other` when `name` is given and there
    /// are several.
    fn expand_pairwise(&mut self) -> Result<()> {
        let variants = self.variant_names();
        if let Some(baseline) = &self.baseline {
            if !variants.contains(baseline) {
                bail!(
                    "`baseline` names `{baseline}`, which is not a variant; the variants are {}",
                    variants.join(", ")
                );
            }
        }
        let mut expanded = Vec::new();
        for (index, pair) in std::mem::take(&mut self.pairwise).into_iter().enumerate() {
            if !pair.variants.is_empty() {
                expanded.push(pair);
                continue;
            }
            let Some(baseline) = &self.baseline else {
                bail!(
                    "pairwise[{index}] names no `variants`: give two, `[a, b]`, or set `baseline` \
                     to compare it with each other variant"
                );
            };
            let others: Vec<&String> = variants.iter().filter(|v| *v != baseline).collect();
            if others.is_empty() {
                bail!("pairwise[{index}]: `baseline` `{baseline}` is the only variant; there is nothing to compare it with");
            }
            let several = others.len() > 1;
            for other in others {
                expanded.push(PairwiseConfig {
                    name: pair.name.as_ref().map(|n| {
                        if several {
                            format!("{n}-{other}")
                        } else {
                            n.clone()
                        }
                    }),
                    variants: vec![baseline.clone(), other.clone()],
                    ..pair.clone()
                });
            }
        }
        self.pairwise = expanded;
        Ok(())
    }

    /// Each pairwise judge names two different configured variants, under a name no other
    /// pairwise judge has.
    fn validate_pairwise(&self) -> Result<()> {
        let variants = self.variant_names();
        let mut names = std::collections::BTreeSet::new();
        for (index, pair) in self.pairwise.iter().enumerate() {
            let place = format!("pairwise[{index}]");
            let [a, b] = pair.variants.as_slice() else {
                bail!(
                    "{place}.variants must name exactly two variants, `[a, b]`, not {}",
                    pair.variants.len()
                );
            };
            if let Some(unknown) = [a, b].into_iter().find(|v| !variants.contains(v)) {
                bail!(
                    "{place}.variants names `{unknown}`, which is not a variant; the variants are \
                     {}",
                    variants.join(", ")
                );
            }
            if a == b {
                bail!("{place}.variants names `{a}` twice; compare two different variants");
            }
            let name = pair.display_name();
            if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                bail!("{place}.name {name:?} cannot be used in a file name");
            }
            if !names.insert(name.clone()) {
                bail!(
                    "{place}: another pairwise judge is already called `{name}`; give it a `name`"
                );
            }
        }
        Ok(())
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
            .and_then(|m| crate::model::ModelRef::parse(m).ok())
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

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"{"name": "t", "datasets": ["cases.jsonl"], "client": "command"}"#;

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
    fn pairwise_judges_name_two_different_variants() {
        let error = |pairwise: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command",
                    "variants": {{"a": {{}}, "b": {{}}}}, "pairwise": [{pairwise}]}}"#
            );
            EvalConfig::parse(&text, Path::new("e.json"))
                .err()
                .map(|e| format!("{e:#}"))
        };
        let ok = r#"{"plugin": "p", "variants": ["a", "b"]}"#;
        assert_eq!(error(ok), None);
        for (pairwise, says) in [
            (
                r#"{"plugin": "p", "variants": ["a", "c"]}"#,
                "pairwise[0].variants names `c`, which is not a variant; the variants are a, b",
            ),
            (
                r#"{"plugin": "p", "variants": ["a", "a"]}"#,
                "pairwise[0].variants names `a` twice",
            ),
            (
                r#"{"plugin": "p", "variants": ["a"]}"#,
                "pairwise[0].variants must name exactly two variants",
            ),
            (
                &format!("{ok}, {ok}"),
                "pairwise[1]: another pairwise judge is already called `a-vs-b`",
            ),
            (r#"{"variants": ["a", "b"]}"#, "missing field `plugin`"),
            (
                r#"{"plugin": "p"}"#,
                "pairwise[0] names no `variants`: give two, `[a, b]`, or set `baseline`",
            ),
        ] {
            let got = error(pairwise).unwrap_or_default();
            assert!(got.contains(says), "{pairwise}: {got}");
        }
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

    #[test]
    fn a_baseline_names_a_variant_and_pairs_it_with_each_other_one() {
        let parse = |extra: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command",
                    "variants": {{"base": {{}}, "b": {{}}, "c": {{}}}}{extra}}}"#
            );
            EvalConfig::parse(&text, Path::new("e.json")).map_err(|e| format!("{e:#}"))
        };
        let err = parse(r#", "baseline": "nope""#).unwrap_err();
        assert!(
            err.contains(
                "`baseline` names `nope`, which is not a variant; the variants are b, base, c"
            ),
            "{err}"
        );
        let config = parse(
            r#", "baseline": "base", "pairwise": [{"plugin": "p", "name": "judge"},
                {"plugin": "q", "variants": ["c", "b"]}]"#,
        )
        .unwrap();
        let pairs: Vec<(String, Vec<String>)> = config
            .pairwise
            .iter()
            .map(|p| (p.display_name(), p.variants.clone()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "judge-b".to_string(),
                    vec!["base".to_string(), "b".to_string()]
                ),
                (
                    "judge-c".to_string(),
                    vec!["base".to_string(), "c".to_string()]
                ),
                ("c-vs-b".to_string(), vec!["c".to_string(), "b".to_string()]),
            ]
        );
        let config = parse(r#", "baseline": "c", "pairwise": [{"plugin": "p"}]"#).unwrap();
        let names: Vec<String> = config.pairwise.iter().map(|p| p.display_name()).collect();
        assert_eq!(names, ["c-vs-b", "c-vs-base"]);
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
    fn servers_are_stdio_or_http() {
        let text = r#"{"name": "t", "datasets": ["c"], "client": "mcp", "servers": {
            "time": {"command": "uvx", "args": ["mcp-server-time"]},
            "web": {"url": "http://127.0.0.1:3001/mcp"}}}"#;
        let config = EvalConfig::parse(text, Path::new("e.json")).unwrap();
        assert!(matches!(config.servers["time"], ServerConfig::Stdio(_)));
        assert!(matches!(config.servers["web"], ServerConfig::Http(_)));
    }

    #[test]
    fn a_wrong_server_entry_names_the_server_and_the_key() {
        let error = |entry: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "mcp", "servers": {{"fs": {entry}}}}}"#
            );
            format!(
                "{:#}",
                EvalConfig::parse(&text, Path::new("e.json")).unwrap_err()
            )
        };
        for (entry, says) in [
            (
                r#"{"command": "x", "envSecret": {"A": "B"}}"#,
                "servers.fs: unknown field `envSecret`",
            ),
            (
                r#"{"command": "x", "envSecret": {}}"#,
                "did you mean `envSecrets`?",
            ),
            (
                r#"{"url": "http://h", "header": {}}"#,
                "did you mean `headers`?",
            ),
            (
                r#"{"url": "http://h", "cwd": "a"}"#,
                "servers.fs: unknown field `cwd`",
            ),
            (r#"{"comand": "x"}"#, "servers.fs has neither `command`"),
            (r#"{"comand": "x"}"#, "did you mean `command`?"),
            (
                r#"{"transport": "stdio", "command": "x"}"#,
                "(server `fs` has MST's `transport`), which mst does not read: convert it with \
                 `mst import mst e.json`",
            ),
            (
                r#"{"serverUrl": "http://h"}"#,
                "(server `fs` has MST's `serverUrl`)",
            ),
            (
                r#"{"command": "x", "cwd": "/srv"}"#,
                "servers.fs.cwd is \"/srv\"",
            ),
            (r#"{"command": "x", "cwd": "a/../.."}"#, "no `..`"),
            (
                r#"{"url": "http://h", "headers": {"Mcp-Session-Id": "1"}}"#,
                "servers.fs.headers.Mcp-Session-Id: the MCP transport sets this header itself",
            ),
            (
                r#"{"url": "http://h", "token": "T", "headerSecrets": {"authorization": "K"}}"#,
                "`token` already sends `Authorization`",
            ),
            (
                r#"{"url": "http://h", "headers": {"X-A": "1"}, "headerSecrets": {"x-a": "K"}}"#,
                "header `X-A` is in both `headers` and `headerSecrets`",
            ),
            (
                r#"{"url": "http://h", "headers": {"a b": "1"}}"#,
                "is not a header name",
            ),
        ] {
            let got = error(entry);
            assert!(got.contains(says), "{entry}: {got}");
        }
    }

    #[test]
    fn case_pass_is_majority_or_a_share() {
        let parse = |case_pass: &str| {
            let text = format!(
                r#"{{"name": "t", "datasets": ["c"], "client": "command", "casePass": {case_pass}}}"#
            );
            EvalConfig::parse(&text, Path::new("e.json")).map_err(|e| format!("{e:#}"))
        };
        assert_eq!(
            EvalConfig::parse(MINIMAL, Path::new("e.json"))
                .unwrap()
                .case_rule(),
            CaseRule::Majority
        );
        assert_eq!(
            parse(r#"{"rule": "majority"}"#).unwrap().case_rule(),
            CaseRule::Majority
        );
        assert_eq!(
            parse(r#"{"share": 0.67}"#).unwrap().case_rule(),
            CaseRule::Share(0.67)
        );
        for (case_pass, says) in [
            (
                r#"{"share": -0.5}"#,
                "`casePass.share` must be between 0 and 1",
            ),
            (r#"{"share": 1.5}"#, "must pass), not 1.5"),
            (r#"{"share": 67}"#, "not 67 (for 67% write 0.67)"),
            (r#"{"rule": "all"}"#, "`casePass.rule` is \"all\""),
            (r#"{"rule": "majority", "share": 0.5}"#, "has both `rule`"),
            ("{}", "`casePass` is empty"),
            (r#"{"shares": 0.5}"#, "unknown field `shares`"),
        ] {
            let got = parse(case_pass).unwrap_err();
            assert!(got.contains(says), "{case_pass}: {got}");
        }
    }

    #[test]
    fn server_secrets_travel_as_secret_tokens() {
        let text = r#"{"name": "t", "datasets": ["c"], "client": "mcp", "servers": {
            "fs": {"command": "x", "cwd": "sub/dir", "envSecrets": {"API_KEY": "FS_KEY"}},
            "web": {"url": "http://h", "token": "T", "headers": {"X-Team": "evals"},
                    "headerSecrets": {"X-Api-Key": "WEB_KEY"}}}}"#;
        let config = EvalConfig::parse(text, Path::new("e.json")).unwrap();
        let spec = config.variant("default");
        assert_eq!(
            spec.token_names(),
            ["web", "secret:FS_KEY", "secret:WEB_KEY"]
        );
        // What a worker's bundle carries reads back the same, secrets by name only.
        let bundled = serde_json::to_string(&spec.servers).unwrap();
        assert!(
            bundled.contains(r#""envSecrets":{"API_KEY":"FS_KEY"}"#),
            "{bundled}"
        );
        let back: BTreeMap<String, ServerConfig> = serde_json::from_str(&bundled).unwrap();
        assert_eq!(back, spec.servers);
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
    fn durations_above_a_day_are_taken_for_milliseconds() {
        let with = |timeout: &str| {
            EvalConfig::parse(
                &format!(r#"{{"name": "t", "datasets": ["c"], "client": "command", "timeout": {timeout}}}"#),
                Path::new("e.json"),
            )
            .map(|c| c.timeout)
            .map_err(|e| format!("{e:#}"))
        };
        let err = with("120000").unwrap_err();
        assert!(
            err.contains("`timeout` is 120000 seconds")
                && err.contains("MST wrote milliseconds: did you mean 120?"),
            "{err}"
        );
        assert_eq!(with("86400"), Ok(86400.0));
        assert!(with("0")
            .unwrap_err()
            .contains("positive number of seconds"));
        let err = seconds("--silence-limit", 90_000.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("did you mean 90?"), "{err}");
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
