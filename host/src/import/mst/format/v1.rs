//! MST 1.x: the case keys 2.0 dropped or renamed. A 1.x dataset has 2.0's `{"name",
//! "cases"}` shape, and its cases are read as 2.0 [`Case`](super::v2::Case)s with these keys
//! beside.

use super::lenient;
use serde::Deserialize;
use serde_json::Value;

/// The keys of a 1.x case: direct mode (a tool call), and 1.x's names for 2.0's keys.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CaseKeys {
    /// 2.0's `passThreshold`.
    #[serde(default, deserialize_with = "lenient")]
    pub accuracy_threshold: Option<Value>,
    /// A direct-mode call's arguments.
    #[serde(default, deserialize_with = "lenient")]
    pub args: Option<Value>,
    /// 2.0's `expected`.
    #[serde(default, deserialize_with = "lenient")]
    pub canonical_answer: Option<Value>,
    /// 2.0's `assertions`.
    #[serde(default, deserialize_with = "lenient")]
    pub expect: Option<Value>,
    /// The text the tool response equals.
    #[serde(default, deserialize_with = "lenient")]
    pub expected_exact: Option<Value>,
    /// Patterns the tool response matches.
    #[serde(default, deserialize_with = "lenient")]
    pub expected_regex: Option<Value>,
    /// A named schema the tool response matches.
    #[serde(default, deserialize_with = "lenient")]
    pub expected_schema_name: Option<Value>,
    /// Texts the tool response contains.
    #[serde(default, deserialize_with = "lenient")]
    pub expected_text_contains: Option<Value>,
    /// 2.0's `trials`.
    #[serde(default, deserialize_with = "lenient")]
    pub iterations: Option<Value>,
    /// The host's client and model, for this case.
    #[serde(default, deserialize_with = "lenient")]
    pub mcp_host_config: Option<Value>,
    /// `direct` (a tool call), `mcp_host` or `llm_host` (a prompt).
    #[serde(default, deserialize_with = "lenient")]
    pub mode: Option<Value>,
    /// A raw MCP request.
    #[serde(default, deserialize_with = "lenient")]
    pub request: Option<Value>,
    /// 2.0's `input`.
    #[serde(default, deserialize_with = "lenient")]
    pub scenario: Option<Value>,
    /// A direct-mode call's tool, or `LABEL.tool`.
    #[serde(default, deserialize_with = "lenient")]
    pub tool_name: Option<Value>,
}
