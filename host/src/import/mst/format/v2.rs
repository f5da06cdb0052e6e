//! MST 2.0: the eval config (`eval-config.schema.json`), the dataset
//! (`eval-dataset.schema.json`), its cases, their assertions and LLM judges.
//!
//! Values the converters copy as they are, or check themselves, stay [`Value`]s; a key given
//! as `null` is then `Some(Value::Null)`, present, as it was to the converters before.

use super::{lenient, v1};
use serde::Deserialize;
use serde_json::{Map, Value};

/// An eval config. `$schema` and the keys mst has no equivalent for (`metrics`, `extends`,
/// …) are in `rest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Config {
    /// The eval's name.
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    /// Dataset file paths, or `{"type", "path"}` sources.
    #[serde(default, deserialize_with = "lenient")]
    pub datasets: Option<Vec<Value>>,
    /// Server entries by label, each a [`Server`] when it is an object.
    #[serde(default, deserialize_with = "lenient")]
    pub servers: Option<Map<String, Value>>,
    /// The client and its model.
    #[serde(flatten)]
    pub client: ClientFields,
    /// Generation settings given at the top level.
    #[serde(flatten)]
    pub generation: Generation,
    /// USD per million tokens, by model.
    #[serde(default, deserialize_with = "lenient")]
    pub pricing: Option<Map<String, Value>>,
    /// [`Variant`]s, in order: the first is the baseline unless `baseline` names one.
    #[serde(default, deserialize_with = "lenient")]
    pub variants: Option<Vec<Value>>,
    /// The baseline variant's name.
    #[serde(default, deserialize_with = "lenient")]
    pub baseline: Option<String>,
    /// Judges every case gets on top of its own: `rubric` objects ([`LlmJudge`]) or plugins.
    #[serde(default, deserialize_with = "lenient")]
    pub judges: Option<Vec<Value>>,
    /// Wraps each case's input: `{{input}}` is replaced by it.
    #[serde(default, deserialize_with = "lenient")]
    pub input_template: Option<String>,
    /// Run controls at the top level (the `run` group's win).
    #[serde(flatten)]
    pub controls: RunControls,
    /// A trial's time limit, in milliseconds.
    #[serde(default, deserialize_with = "lenient")]
    pub timeout: Option<f64>,
    /// The `run` group.
    #[serde(default, deserialize_with = "lenient")]
    pub run: Option<RunGroup>,
    /// Every other key.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A config's or a variant's client, model and client options.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientFields {
    /// `mst` (MST's own agent client), `claude-code` (the default), or another.
    #[serde(default, deserialize_with = "lenient")]
    pub client: Option<String>,
    /// A model id without its provider.
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<String>,
    /// The model's provider (a string; another value hides `clientOptions.provider`).
    #[serde(default, deserialize_with = "lenient")]
    pub provider: Option<Value>,
    /// [`ClientOptions`], when an object.
    #[serde(default, deserialize_with = "lenient")]
    pub client_options: Option<Value>,
}

/// `clientOptions`: the keys MST's agent clients read.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientOptions {
    /// The variable holding the provider's key.
    #[serde(default, deserialize_with = "lenient")]
    pub api_key_env_var: Option<Value>,
    /// The model's reply limit.
    #[serde(default, deserialize_with = "lenient")]
    pub max_tokens: Option<Value>,
    /// The most tool calls a trial makes.
    #[serde(default, deserialize_with = "lenient")]
    pub max_tool_calls: Option<Value>,
    /// The model's provider, when the config names none.
    #[serde(default, deserialize_with = "lenient")]
    pub provider: Option<Value>,
    /// The system prompt.
    #[serde(default, deserialize_with = "lenient")]
    pub system_prompt: Option<Value>,
    /// The sampling temperature.
    #[serde(default, deserialize_with = "lenient")]
    pub temperature: Option<Value>,
    /// The client's own time limit.
    #[serde(default, deserialize_with = "lenient")]
    pub timeout: Option<Value>,
    /// Every other option.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// Generation settings a config may give at its top level, as in `clientOptions`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Generation {
    /// The most tool calls a trial makes.
    #[serde(default, deserialize_with = "lenient")]
    pub max_tool_calls: Option<Value>,
    /// The model's reply limit.
    #[serde(default, deserialize_with = "lenient")]
    pub max_tokens: Option<Value>,
    /// The sampling temperature.
    #[serde(default, deserialize_with = "lenient")]
    pub temperature: Option<Value>,
}

impl Generation {
    /// The settings given, by key, in the keys' alphabetical order.
    pub fn given(&self) -> Vec<(&'static str, &Value)> {
        [
            ("maxTokens", &self.max_tokens),
            ("maxToolCalls", &self.max_tool_calls),
            ("temperature", &self.temperature),
        ]
        .into_iter()
        .filter_map(|(key, value)| Some((key, value.as_ref()?)))
        .collect()
    }
}

/// Run controls, at a config's top level or in its `run` group.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunControls {
    /// Trials of each case.
    #[serde(default, deserialize_with = "lenient")]
    pub trials: Option<Value>,
    /// Trials at once.
    #[serde(default, deserialize_with = "lenient")]
    pub concurrency: Option<Value>,
    /// The share of a case's trials that must pass.
    #[serde(default, deserialize_with = "lenient")]
    pub pass_threshold: Option<Value>,
}

/// A config's `run` group.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RunGroup {
    /// Its run controls.
    #[serde(flatten)]
    pub controls: RunControls,
    /// Run at most this many cases.
    #[serde(default, deserialize_with = "lenient")]
    pub max_cases: Option<Value>,
    /// Run only cases with these tags.
    #[serde(default, deserialize_with = "lenient")]
    pub filter_tags: Option<Value>,
    /// Every other key: not converted, and not reported (the importer never has).
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

impl RunGroup {
    /// Whether the group holds no key at all.
    pub fn is_empty(&self) -> bool {
        let RunControls {
            trials,
            concurrency,
            pass_threshold,
        } = &self.controls;
        [
            trials,
            concurrency,
            pass_threshold,
            &self.max_cases,
            &self.filter_tags,
        ]
        .iter()
        .all(|v| v.is_none())
            && self.rest.is_empty()
    }
}

/// A server entry: stdio (`command`) or HTTP (`serverUrl`). The settings mst has no
/// equivalent for (`capabilities`, `proxy`, …) are in `rest`.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Server {
    /// `stdio`, `http` or `sse`; without it, an entry with `command` is stdio.
    #[serde(default, deserialize_with = "lenient")]
    pub transport: Option<String>,
    /// A connector signed in with `mst auth`, instead of a server of one's own.
    #[serde(default, deserialize_with = "lenient")]
    pub connector: Option<Value>,
    /// A display name.
    #[serde(default, deserialize_with = "lenient")]
    pub label: Option<Value>,
    /// A stdio server's program.
    #[serde(default, deserialize_with = "lenient")]
    pub command: Option<Value>,
    /// A stdio server's arguments.
    #[serde(default, deserialize_with = "lenient")]
    pub args: Option<Value>,
    /// A stdio server's environment.
    #[serde(default, deserialize_with = "lenient")]
    pub env: Option<Value>,
    /// A stdio server's working directory.
    #[serde(default, deserialize_with = "lenient")]
    pub cwd: Option<Value>,
    /// Whether a stdio server inherits MST's environment.
    #[serde(default, deserialize_with = "lenient")]
    pub inherit_env: Option<Value>,
    /// An HTTP server's address.
    #[serde(default, deserialize_with = "lenient")]
    pub server_url: Option<Value>,
    /// An HTTP server's address (another spelling).
    #[serde(default, deserialize_with = "lenient")]
    pub url: Option<Value>,
    /// An HTTP server's request headers.
    #[serde(default, deserialize_with = "lenient")]
    pub headers: Option<Value>,
    /// An HTTP server's [`Auth`].
    #[serde(default, deserialize_with = "lenient")]
    pub auth: Option<Value>,
    /// Every other key.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// An HTTP server's `auth`. Other keys are not read (the importer never has).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Auth {
    /// The variable holding the token.
    #[serde(default, deserialize_with = "lenient")]
    pub access_token_env: Option<String>,
    /// The token itself, written in the config.
    #[serde(default, deserialize_with = "lenient")]
    pub access_token: Option<Value>,
    /// An OAuth sign-in.
    #[serde(default, deserialize_with = "lenient")]
    pub oauth: Option<Value>,
    /// A client-credentials sign-in.
    #[serde(default, deserialize_with = "lenient")]
    pub client_credentials: Option<Value>,
}

/// A variant: the config with some of its keys replaced. MST's variant schema has no
/// `provider`, yet one given still names the model's provider (as it always has here), and
/// is reported.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Variant {
    /// Its name.
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    /// A description, which mst's variants do not have.
    #[serde(default, deserialize_with = "lenient")]
    pub description: Option<Value>,
    /// The labels of the servers it uses.
    #[serde(default, deserialize_with = "lenient")]
    pub servers: Option<Value>,
    /// Its judges (as the config's `judges`).
    #[serde(default, deserialize_with = "lenient")]
    pub judges: Option<Value>,
    /// Its client and model.
    #[serde(flatten)]
    pub client: ClientFields,
    /// Its own `inputTemplate`.
    #[serde(default, deserialize_with = "lenient")]
    pub input_template: Option<Value>,
    /// Its own `metrics`.
    #[serde(default, deserialize_with = "lenient")]
    pub metrics: Option<Value>,
    /// Its own `toolMap`.
    #[serde(default, deserialize_with = "lenient")]
    pub tool_map: Option<Value>,
    /// Its own `tools`.
    #[serde(default, deserialize_with = "lenient")]
    pub tools: Option<Value>,
    /// Every other key.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A dataset (of either generation): a name and its cases. `$schema`, `description` and
/// `metadata` are in `rest`.
#[derive(Debug, Default, Deserialize)]
pub struct Dataset {
    /// Its name.
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    /// The cases, each a [`Case`] when it is an object.
    #[serde(default, deserialize_with = "lenient")]
    pub cases: Option<Vec<Value>>,
    /// Every other key.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A case, with the keys 1.x cases had beside 2.0's.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Case {
    /// Its id.
    #[serde(default, deserialize_with = "lenient")]
    pub id: Option<String>,
    /// The client's prompt.
    #[serde(default, deserialize_with = "lenient")]
    pub input: Option<Value>,
    /// A description.
    #[serde(default, deserialize_with = "lenient")]
    pub description: Option<Value>,
    /// Tags.
    #[serde(default, deserialize_with = "lenient")]
    pub tags: Option<Value>,
    /// Trials of this case.
    #[serde(default, deserialize_with = "lenient")]
    pub trials: Option<Value>,
    /// The share of its trials that must pass.
    #[serde(default, deserialize_with = "lenient")]
    pub pass_threshold: Option<Value>,
    /// The expected answer (`{"answer", "criteria"}`).
    #[serde(default, deserialize_with = "lenient")]
    pub expected: Option<Value>,
    /// Its [`Assertions`].
    #[serde(default, deserialize_with = "lenient")]
    pub assertions: Option<Value>,
    /// Its judges (as the config's `judges`).
    #[serde(default, deserialize_with = "lenient")]
    pub judges: Option<Value>,
    /// Free-form metadata.
    #[serde(default, deserialize_with = "lenient")]
    pub metadata: Option<Map<String, Value>>,
    /// A client of its own.
    #[serde(default, deserialize_with = "lenient")]
    pub client: Option<Value>,
    /// Client options of its own.
    #[serde(default, deserialize_with = "lenient")]
    pub client_options: Option<Value>,
    /// A model of its own.
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<Value>,
    /// Runs of each judge, averaged.
    #[serde(default, deserialize_with = "lenient")]
    pub judge_reps: Option<Value>,
    /// The keys of a 1.x case.
    #[serde(flatten)]
    pub v1: v1::CaseKeys,
    /// Every other key.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// A case's `assertions` (or 1.x `expect`): every one must pass.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Assertions {
    /// Texts the answer contains: one string or a list.
    #[serde(default, deserialize_with = "lenient")]
    pub contains_text: Option<Value>,
    /// Whether the tool response is an error.
    #[serde(default, deserialize_with = "lenient")]
    pub is_error: Option<Value>,
    /// Patterns the answer matches: one or a list.
    #[serde(default, deserialize_with = "lenient")]
    pub matches_pattern: Option<Value>,
    /// An [`LlmJudge`].
    #[serde(default, deserialize_with = "lenient")]
    pub passes_judge: Option<Value>,
    /// The exact tool response.
    #[serde(default, deserialize_with = "lenient")]
    pub response: Option<Value>,
    /// The tool response's size.
    #[serde(default, deserialize_with = "lenient")]
    pub response_size: Option<Value>,
    /// A schema the tool response matches.
    #[serde(default, deserialize_with = "lenient")]
    pub schema: Option<Value>,
    /// A stored snapshot of the tool response.
    #[serde(default, deserialize_with = "lenient")]
    pub snapshot: Option<Value>,
    /// Bounds on the number of tool calls: a [`ToolCallCount`].
    #[serde(default, deserialize_with = "lenient")]
    pub tool_call_count: Option<Value>,
    /// [`ToolsTriggered`].
    #[serde(default, deserialize_with = "lenient")]
    pub tools_triggered: Option<Value>,
    /// Every other key.
    #[serde(flatten)]
    pub rest: Map<String, Value>,
}

/// `toolCallCount`'s bounds. Other keys are not read (the importer never has).
#[derive(Debug, Default, Deserialize)]
pub struct ToolCallCount {
    /// At least this many calls.
    #[serde(default, deserialize_with = "lenient")]
    pub min: Option<Value>,
    /// At most this many calls.
    #[serde(default, deserialize_with = "lenient")]
    pub max: Option<Value>,
    /// Exactly this many calls.
    #[serde(default, deserialize_with = "lenient")]
    pub exact: Option<Value>,
}

/// `toolsTriggered`: calls that must happen. Other keys are not read (the importer never has).
#[derive(Debug, Default, Deserialize)]
pub struct ToolsTriggered {
    /// The calls, each an [`ExpectedCall`] when it is an object.
    #[serde(default, deserialize_with = "lenient")]
    pub calls: Option<Vec<Value>>,
    /// `strict`: in this order.
    #[serde(default, deserialize_with = "lenient")]
    pub order: Option<String>,
    /// `true`: no other call.
    #[serde(default, deserialize_with = "lenient")]
    pub exclusive: Option<Value>,
}

/// One call of `toolsTriggered`. Other keys are not read (the importer never has).
#[derive(Debug, Default, Deserialize)]
pub struct ExpectedCall {
    /// The tool, or `LABEL.tool`.
    #[serde(default, deserialize_with = "lenient")]
    pub name: Option<String>,
    /// `tool_call` (the default), or a skill, command or subagent event.
    #[serde(default, deserialize_with = "lenient")]
    pub kind: Option<String>,
    /// `false`: the call may happen.
    #[serde(default, deserialize_with = "lenient")]
    pub required: Option<Value>,
    /// The server's label.
    #[serde(default, deserialize_with = "lenient")]
    pub server: Option<String>,
    /// Arguments the call has (others may come too); `{"$pattern"}` values match patterns.
    #[serde(default, deserialize_with = "lenient")]
    pub arguments: Option<Map<String, Value>>,
}

/// An LLM judge: `passesJudge`, or a `{"type": "rubric"}` judge entry. Other keys are not
/// read (the importer never has).
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LlmJudge {
    /// `rubric` in a judge entry.
    #[serde(default, rename = "type", deserialize_with = "lenient")]
    pub kind: Option<String>,
    /// A built-in rubric's name, or `{"text"}`.
    #[serde(default, deserialize_with = "lenient")]
    pub rubric: Option<Value>,
    /// A custom judge from a plugin.
    #[serde(default, deserialize_with = "lenient")]
    pub judge: Option<Value>,
    /// The judge model's provider.
    #[serde(default, deserialize_with = "lenient")]
    pub provider: Option<String>,
    /// The judge model.
    #[serde(default, deserialize_with = "lenient")]
    pub model: Option<String>,
    /// The pass mark (0.7 when not given).
    #[serde(default, deserialize_with = "lenient")]
    pub threshold: Option<f64>,
    /// The judge's reply limit.
    #[serde(default, deserialize_with = "lenient")]
    pub max_tokens: Option<Value>,
    /// The variable holding the provider's key.
    #[serde(default, deserialize_with = "lenient")]
    pub api_key_env_var: Option<String>,
    /// Judge runs, averaged.
    #[serde(default, deserialize_with = "lenient")]
    pub reps: Option<Value>,
    /// The judge's sampling temperature.
    #[serde(default, deserialize_with = "lenient")]
    pub temperature: Option<Value>,
    /// A spending cap.
    #[serde(default, deserialize_with = "lenient")]
    pub max_budget_usd: Option<Value>,
    /// A cap on tool output shown to the judge.
    #[serde(default, deserialize_with = "lenient")]
    pub max_tool_output_size: Option<Value>,
    /// A reference answer.
    #[serde(default, deserialize_with = "lenient")]
    pub reference: Option<Value>,
}
