//! Models: what an agent loop (the `api` client) calls. One request and reply shape for every
//! provider ([`ModelRequest`], [`Reply`]); [`Provider`] is chosen by the provider part of a
//! model reference (`provider/model`): the built-in `mock` ([`mock`], no network), or a
//! provider the config describes, reached over HTTP in one of two wire formats ([`http`]).

pub mod http;
pub mod mock;
pub mod wire;

use crate::secrets::Secret;
use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `provider/model`, e.g. `mock/echo`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelRef {
    pub provider: String,
    pub model: String,
}

impl ModelRef {
    /// Parses `provider/model`; both parts must be there.
    pub fn parse(text: &str) -> Result<Self> {
        match text.split_once('/') {
            Some((provider, model)) if !provider.is_empty() && !model.is_empty() => Ok(ModelRef {
                provider: provider.to_string(),
                model: model.to_string(),
            }),
            _ => bail!("model `{text}` is not `provider/model` (e.g. `mock/echo`)"),
        }
    }
}

impl std::fmt::Display for ModelRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub input_schema: Value,
}

/// A tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// Unique within the conversation; results refer to it.
    pub id: String,
    pub name: String,
    pub arguments: Value,
}

/// What one tool call returned.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolOutput {
    pub id: String,
    pub output: String,
    pub is_error: bool,
}

/// One entry of a conversation (as JSON: `{"user": "…"}`, `{"assistant": {"text", "calls"}}`,
/// `{"toolResults": […]}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Turn {
    User(String),
    Assistant {
        text: Option<String>,
        calls: Vec<ToolCall>,
    },
    /// The results of the previous assistant turn's calls, in its order.
    ToolResults(Vec<ToolOutput>),
}

/// Whether and how the model may call tools.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolChoice {
    /// The model decides.
    #[default]
    Auto,
    /// The model must call a tool.
    Required,
    /// The model is offered no tools.
    None,
}

/// One model call.
#[derive(Debug, Clone)]
pub struct ModelRequest<'a> {
    pub model: &'a ModelRef,
    pub system: Option<&'a str>,
    pub turns: &'a [Turn],
    pub tools: &'a [ToolSpec],
    pub tool_choice: ToolChoice,
    pub max_tokens: u32,
    pub temperature: Option<f64>,
}

/// Tokens one call used.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
}

/// What the model answered: text, tool calls, or both.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Reply {
    pub text: Option<String>,
    pub calls: Vec<ToolCall>,
    pub usage: Usage,
}

/// A model call that failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelError(pub String);

impl std::fmt::Display for ModelError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A model to call, by provider.
#[derive(Debug, Clone)]
pub enum Provider {
    Mock(mock::Mock),
    Http(http::Http),
}

/// Takes a provider's slot for one model call (`limits.providers`). Every call to a provider
/// is made by the host (an agent's through the model gateway, a plugin's while grading), whose
/// gate is the run's limiter, so a limit holds across all shards.
pub trait CallGate: Send + Sync {
    /// Waits for a slot of `provider`; it is held until the returned [`CallSlot`] is dropped,
    /// also when this future is dropped before it is ready (a trial's deadline).
    fn acquire<'a>(
        &'a self,
        provider: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = CallSlot> + Send + 'a>>;
}

/// A provider slot held for one call; dropping it gives the slot back.
pub struct CallSlot(Option<Box<dyn FnOnce() + Send>>);

impl CallSlot {
    /// A slot that runs `release` when dropped.
    pub fn new(release: impl FnOnce() + Send + 'static) -> Self {
        CallSlot(Some(Box::new(release)))
    }

    /// A slot with nothing to give back.
    pub fn free() -> Self {
        CallSlot(None)
    }
}

impl Drop for CallSlot {
    fn drop(&mut self) {
        if let Some(release) = self.0.take() {
            release();
        }
    }
}

/// The gate of a caller under no limit: a test, a local one-off, or the `api` client on a
/// machine (its provider calls go through the gateway, and the host takes their slots).
pub struct Unlimited;

impl CallGate for Unlimited {
    fn acquire<'a>(
        &'a self,
        _provider: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = CallSlot> + Send + 'a>> {
        Box::pin(async { CallSlot::free() })
    }
}

/// What a caller's model calls used, summed: calls, tokens, and the cost of those whose model
/// has a price.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UsageTotals {
    pub calls: u64,
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// US dollars, for the calls whose model has a price; absent when none had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

impl UsageTotals {
    /// Counts one call's `usage` and its `cost`, if known.
    pub fn add(&mut self, usage: &Usage, cost: Option<f64>) {
        self.calls += 1;
        self.input_tokens += usage.input_tokens;
        self.output_tokens += usage.output_tokens;
        if let Some(cost) = cost {
            *self.cost_usd.get_or_insert(0.0) += cost;
        }
    }

    /// Adds `other`'s counts to these.
    pub fn merge(&mut self, other: &UsageTotals) {
        self.calls += other.calls;
        self.input_tokens += other.input_tokens;
        self.output_tokens += other.output_tokens;
        if let Some(cost) = other.cost_usd {
            *self.cost_usd.get_or_insert(0.0) += cost;
        }
    }

    /// Whether nothing was counted.
    pub fn is_empty(&self) -> bool {
        self.calls == 0
    }
}

/// The model providers a run's plugins may call (the `model` import): the config's providers
/// with their keys from the secrets file, and the built-in `mock`. Which providers a plugin
/// may call is its grant's business; this knows how to reach them, takes each call's provider
/// slot through the run's gate, and counts what each plugin used. On a grade machine there
/// are no keys: every call goes to the machine's model gateway ([`ModelAccess::through_gateway`]).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelAccess {
    providers: std::collections::BTreeMap<String, http::ProviderConfig>,
    keys: std::collections::BTreeMap<String, Secret>,
    metering: Metering,
    /// On a grade machine, the gateway (its URL) and the trial's token: the coordinator
    /// behind it calls every provider, `mock` included, and counts what the calls used.
    gateway: Option<(String, Secret)>,
}

/// The gate plugins' calls go through and the usage they add up to, shared by every copy of
/// one [`ModelAccess`].
#[derive(Clone, Default)]
struct Metering {
    gate: Option<std::sync::Arc<dyn CallGate>>,
    /// By plugin (its `name version`).
    usage: std::sync::Arc<std::sync::Mutex<std::collections::BTreeMap<String, UsageTotals>>>,
}

impl std::fmt::Debug for Metering {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metering")
            .field("gated", &self.gate.is_some())
            .finish()
    }
}

impl PartialEq for Metering {
    fn eq(&self, other: &Self) -> bool {
        std::sync::Arc::ptr_eq(&self.usage, &other.usage)
    }
}

impl ModelAccess {
    /// Access to `providers`, with each key looked up in `secrets` (one missing leaves that
    /// provider unreachable, said when it is called); every call takes its provider's slot from
    /// `gate`.
    pub fn new(
        providers: &std::collections::BTreeMap<String, http::ProviderConfig>,
        secrets: &crate::secrets::Secrets,
        gate: std::sync::Arc<dyn CallGate>,
    ) -> Self {
        let keys = providers
            .iter()
            .filter_map(|(name, p)| Some((name.clone(), secrets.get(&p.key)?)))
            .collect();
        ModelAccess {
            providers: providers.clone(),
            keys,
            metering: Metering {
                gate: Some(gate),
                usage: Default::default(),
            },
            gateway: None,
        }
    }

    /// Access for the grader plugins of one trial on a grade machine: every call goes to the
    /// machine's model gateway at `url` with the trial's `token`, naming the plugin that makes
    /// it, and the coordinator calls the provider, takes its slot and counts the call.
    pub fn through_gateway(url: &str, token: &Secret) -> Self {
        ModelAccess {
            gateway: Some((url.to_string(), token.clone())),
            ..ModelAccess::default()
        }
    }

    /// The gate every call goes through.
    pub fn gate(&self) -> &dyn CallGate {
        match &self.metering.gate {
            Some(gate) => gate.as_ref(),
            None => &Unlimited,
        }
    }

    /// Counts a call of `plugin` to `model` that used `usage`, with its cost when priced.
    pub fn count(&self, plugin: &str, model: &ModelRef, usage: &Usage) {
        let cost = http::cost(self.providers.get(&model.provider), &model.model, usage);
        let mut totals = self.metering.usage.lock().expect("usage lock");
        totals
            .entry(plugin.to_string())
            .or_default()
            .add(usage, cost);
    }

    /// The cost of a call to `model` that used `usage`, when its provider prices the model.
    pub fn cost(&self, model: &ModelRef, usage: &Usage) -> Option<f64> {
        http::cost(self.providers.get(&model.provider), &model.model, usage)
    }

    /// What `plugin` (its `name version`) used so far.
    pub fn usage(&self, plugin: &str) -> UsageTotals {
        let totals = self.metering.usage.lock().expect("usage lock");
        totals.get(plugin).copied().unwrap_or_default()
    }

    /// The provider to call for grader plugin `plugin`'s (its `name version`) call to `model`:
    /// the machine's gateway, naming the plugin, when this is access through one.
    pub fn provider_for_plugin(&self, model: &ModelRef, plugin: &str) -> Result<Provider> {
        match &self.gateway {
            Some((url, token)) => Ok(Provider::Http(http::Http::gateway_for_plugin(
                url, token, plugin,
            ))),
            None => self.provider(model),
        }
    }

    /// The provider to call for `model`.
    pub fn provider(&self, model: &ModelRef) -> Result<Provider> {
        Provider::new(
            model,
            None,
            self.providers.get(&model.provider),
            self.keys.get(&model.provider),
        )
    }
}

impl Provider {
    /// The provider for `model`: `mock` (with `script`, the `mock/script` model's turns), or
    /// the configured HTTP provider `config` with its `key` (absent until the worker has it).
    pub fn new(
        model: &ModelRef,
        script: Option<&[mock::ScriptedTurn]>,
        config: Option<&http::ProviderConfig>,
        key: Option<&Secret>,
    ) -> Result<Self> {
        match (model.provider.as_str(), config) {
            ("mock", _) => Ok(Provider::Mock(mock::Mock::new(&model.model, script)?)),
            (_, Some(config)) => Ok(Provider::Http(http::Http::new(config, key))),
            (other, None) => bail!(
                "model `{model}`: provider `{other}` is not configured; add `providers.{other}` \
                 (`format`: `anthropic` or `openai`, `baseUrl`, `key`: the secret holding its \
                 key) to the config, or use the built-in `mock` provider"
            ),
        }
    }

    /// Calls the model, holding a slot of its provider from `gate` for the call (retries
    /// included). The built-in `mock` reaches no provider and answers in-process, so it takes
    /// no slot (and costs no round-trip to the coordinator).
    pub async fn complete(
        &self,
        gate: &dyn CallGate,
        request: &ModelRequest<'_>,
    ) -> Result<Reply, ModelError> {
        match self {
            Provider::Mock(mock) => mock.complete(request),
            Provider::Http(http) => {
                let _slot = gate.acquire(&request.model.provider).await;
                http.complete(request).await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_references_name_a_provider_and_a_model() {
        let model = ModelRef::parse("mock/echo").unwrap();
        assert_eq!(
            (model.provider.as_str(), model.model.as_str()),
            ("mock", "echo")
        );
        for bad in ["echo", "/echo", "mock/", ""] {
            let err = ModelRef::parse(bad).unwrap_err().to_string();
            assert!(err.contains("provider/model"), "{err}");
        }
        let err = Provider::new(&ModelRef::parse("anthropic/x").unwrap(), None, None, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("add `providers.anthropic`"), "{err}");
    }
}
