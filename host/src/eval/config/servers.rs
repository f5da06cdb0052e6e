//! `servers`: the MCP servers an eval's variants use, stdio or streamable HTTP, each read
//! with errors that name its label and the closest key of its kind of entry.

use super::suggest::suggest;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

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
pub(super) fn servers_by_label<'de, D: serde::Deserializer<'de>>(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::config::EvalConfig;

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
}
