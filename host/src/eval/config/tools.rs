//! `tools` and `dryRun`: what the tool proxy shows a variant's client of its MCP servers'
//! tools, and which calls it lets through (`crate::client::tool_proxy`). Both sit on the eval
//! and on a variant; a variant's replaces the eval's.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::BTreeMap;

/// What the client is shown of one tool, keyed `SERVER__TOOL` in `tools` (the server's label,
/// two underscores, the tool's own name).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolOverride {
    /// Replaces the server's description of the tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Replaces the tool's input schema (a JSON Schema object).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input_schema: Option<Value>,
    /// Leaves the tool out of the list; a call to it is refused as an unknown tool.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub hidden: bool,
    /// The name the client sees and calls it by.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Under `dryRun`, lets this tool through though it is not annotated read-only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow: bool,
}

/// `dryRun`: `true` for every server, or the labels of the servers whose tools run only when
/// annotated `readOnlyHint: true` (or allowed by name); every other call is refused by the
/// proxy and never reaches the server.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DryRun {
    All(bool),
    Servers(Vec<String>),
}

impl DryRun {
    /// Whether calls to server `label` are dry.
    pub fn covers(&self, label: &str) -> bool {
        match self {
            DryRun::All(all) => *all,
            DryRun::Servers(labels) => labels.iter().any(|l| l == label),
        }
    }
}

/// The separator between a server's label and a tool's name in a `tools` key, as the api
/// client names its tools for the model.
pub const TOOL_KEY_SEPARATOR: &str = "__";

/// A variant's tool policy: its `tools` and `dryRun`, as the proxy applies them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ToolPolicy {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tools: BTreeMap<String, ToolOverride>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dry_run: Option<DryRun>,
}

impl ToolPolicy {
    /// Whether the policy changes nothing.
    pub fn is_empty(&self) -> bool {
        self.tools.is_empty()
            && !self
                .dry_run
                .as_ref()
                .is_some_and(|d| d != &DryRun::All(false))
    }

    /// The override of tool `tool` of server `label`, if any.
    pub fn of(&self, label: &str, tool: &str) -> Option<&ToolOverride> {
        self.tools
            .get(&format!("{label}{TOOL_KEY_SEPARATOR}{tool}"))
    }

    /// Whether calls to server `label` are dry.
    pub fn dry(&self, label: &str) -> bool {
        self.dry_run.as_ref().is_some_and(|d| d.covers(label))
    }

    /// Checks the policy against the variant's server labels; `place` names where it was
    /// written (`tools`, `variants.V.tools`).
    pub fn check(&self, labels: &[&str], place: &str) -> Result<()> {
        for (key, tool) in &self.tools {
            let Some((label, name)) = key.split_once(TOOL_KEY_SEPARATOR) else {
                bail!(
                    "{place}.{key}: a key is `SERVER{TOOL_KEY_SEPARATOR}TOOL` (the server's label, \
                     two underscores, the tool's name)"
                );
            };
            if name.is_empty() || !labels.contains(&label) {
                bail!(
                    "{place}.{key}: `{label}` is not a server of this variant (its servers: {})",
                    if labels.is_empty() {
                        "none".to_string()
                    } else {
                        labels.join(", ")
                    }
                );
            }
            if tool.input_schema.as_ref().is_some_and(|s| !s.is_object()) {
                bail!("{place}.{key}.inputSchema must be a JSON Schema object");
            }
            if tool.name.as_deref().is_some_and(|n| n.trim().is_empty()) {
                bail!("{place}.{key}.name is empty");
            }
        }
        if let Some(DryRun::Servers(dry)) = &self.dry_run {
            if let Some(unknown) = dry.iter().find(|l| !labels.contains(&l.as_str())) {
                bail!("{place}: dryRun names `{unknown}`, which is not a server of this variant");
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(json: &str) -> ToolPolicy {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn keys_name_a_server_of_the_variant_and_a_tool() {
        let fine = policy(
            r#"{"tools": {"fs__write_file": {"allow": true}, "time__get_current_time": {"description": "Now"}}, "dryRun": ["fs"]}"#,
        );
        fine.check(&["fs", "time"], "tools").unwrap();
        assert!(fine.dry("fs") && !fine.dry("time"));
        assert_eq!(
            fine.of("time", "get_current_time")
                .unwrap()
                .description
                .as_deref(),
            Some("Now")
        );
        for (json, says) in [
            (
                r#"{"tools": {"write_file": {}}}"#,
                "a key is `SERVER__TOOL`",
            ),
            (
                r#"{"tools": {"web__x": {}}}"#,
                "`web` is not a server of this variant",
            ),
            (
                r#"{"tools": {"fs__x": {"inputSchema": []}}}"#,
                "must be a JSON Schema object",
            ),
            (r#"{"tools": {"fs__x": {"name": " "}}}"#, "name is empty"),
            (r#"{"dryRun": ["web"]}"#, "dryRun names `web`"),
        ] {
            let err = policy(json)
                .check(&["fs", "time"], "tools")
                .unwrap_err()
                .to_string();
            assert!(err.contains(says), "{json}: {err}");
        }
        assert!(
            serde_json::from_str::<ToolPolicy>(r#"{"tools": {"fs__x": {"hiden": true}}}"#).is_err()
        );
        assert!(policy(r#"{"dryRun": true}"#).dry("anything"));
        assert!(policy(r#"{"dryRun": false}"#).is_empty());
    }
}
