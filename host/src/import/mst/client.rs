//! The client of a config or variant: MST's clients → mst's `api` client, the model as
//! `PROVIDER/MODEL`, the client options, and the `providers` entries with their keys and
//! prices.

use super::format::shape;
use super::format::v2::{ClientFields, ClientOptions, Generation};
use super::Source;
use crate::import::Change;
use serde_json::{json, Map, Value};

/// The client, model and options a config (or variant) converts to.
#[derive(Clone, Default)]
pub(super) struct ClientChoice {
    pub client: Option<String>,
    /// `PROVIDER/MODEL`.
    pub model: Option<String>,
    pub provider: Option<String>,
    pub options: Map<String, Value>,
}

impl ClientChoice {
    /// Writes the choice into an eval or variant object.
    pub fn apply(&self, target: &mut Map<String, Value>) {
        if let Some(client) = &self.client {
            target.insert("client".into(), json!(client));
        }
        if let Some(model) = &self.model {
            target.insert("model".into(), json!(model));
        }
        if !self.options.is_empty() {
            target.insert("clientOptions".into(), Value::Object(self.options.clone()));
        }
    }
}

/// The client of a config (`top`: its top-level generation settings) or of a variant
/// (`None`): MST's `mst` client, and the agent clients mst does not have, become the `api`
/// client driving the same model. `prefix` is where the fields are (`variants[NAME].`).
pub(super) fn choose(
    src: &mut Source,
    prefix: &str,
    fields: &ClientFields,
    top: Option<&Generation>,
) -> ClientChoice {
    let mut choice = ClientChoice {
        client: client_of(src, prefix, fields.client.as_deref(), top.is_some()),
        ..ClientChoice::default()
    };
    let options: ClientOptions = fields
        .client_options
        .as_ref()
        .map(shape)
        .unwrap_or_default();
    // The field's own provider hides the options', even when it is not a string.
    let named = (fields.provider.as_ref())
        .or(options.provider.as_ref())
        .and_then(Value::as_str);
    let model = fields.model.as_deref();
    model_of(src, prefix, model, named, &mut choice);
    if model.is_none() && top.is_some() {
        src.report
            .todo("set `model` (PROVIDER/MODEL) in eval.json: the MST config names none");
    }
    options_of(src, prefix, &options, &mut choice);
    for (key, value) in top.map(Generation::given).unwrap_or_default() {
        generation(src, &format!("{prefix}{key}"), key, value, &mut choice);
    }
    choice
}

/// MST's `client` → `api`, reported; a config without one had MST's default, claude-code.
fn client_of(src: &mut Source, prefix: &str, client: Option<&str>, top: bool) -> Option<String> {
    let at = format!("{prefix}client");
    match client {
        Some("mst" | "vercel-sdk" | "anthropic-api") => src.note(&at, Change::Rewritten, "MST's own agent client → the `api` client"),
        Some(other) => src.note(&at, Change::Approximated, format!("mst has no `{other}` client: the `api` client drives the same model with mst's agent loop (to test `{other}` itself, run it as a `command` client)")),
        None if top => src.note(&at, Change::Approximated, "MST's default client, claude-code, → the `api` client driving the model"),
        None => {}
    }
    (client.is_some() || top).then(|| "api".to_string())
}

/// `model` → `PROVIDER/MODEL`, the provider named (`named`) or inferred from the model id.
fn model_of(
    src: &mut Source,
    prefix: &str,
    model: Option<&str>,
    named: Option<&str>,
    choice: &mut ClientChoice,
) {
    let Some(model) = model else {
        return;
    };
    let provider = match named {
        Some(named) => Some(provider_name(src, &format!("{prefix}provider"), named)),
        None => infer_provider(model).map(str::to_string),
    };
    let at = format!("{prefix}model");
    match provider {
        Some(provider) => {
            choice.model = Some(format!("{provider}/{model}"));
            src.note(
                &at,
                Change::Rewritten,
                format!("→ `{provider}/{model}` with a `providers.{provider}` entry"),
            );
            choice.provider = Some(provider);
        }
        None => {
            src.note(
                &at,
                Change::Dropped,
                format!("cannot tell the provider of model {model:?}"),
            );
            src.report.todo(format!(
                "set `{prefix}model` as PROVIDER/MODEL for {model:?}, with a `providers` entry"
            ));
        }
    }
}

/// `clientOptions` → the `api` client's, in the keys' alphabetical order, then the keys it
/// has no use for.
fn options_of(src: &mut Source, prefix: &str, options: &ClientOptions, choice: &mut ClientChoice) {
    let here = |key: &str| format!("{prefix}clientOptions.{key}");
    if let Some(var) = options.api_key_env_var.as_ref().and_then(Value::as_str) {
        if let Some(provider) = &choice.provider {
            src.key_vars.insert(provider.clone(), var.to_string());
            let text = format!("→ the provider's `key: \"env:{var}\"`");
            src.note(&here("apiKeyEnvVar"), Change::Rewritten, text);
        }
    }
    for (key, value) in [
        ("maxTokens", &options.max_tokens),
        ("maxToolCalls", &options.max_tool_calls),
    ] {
        if let Some(value) = value {
            generation(src, &here(key), key, value, choice);
        }
    }
    // `provider` names the model's provider (read with the model).
    if let Some(prompt) = &options.system_prompt {
        choice.options.insert("system".into(), prompt.clone());
        src.note(
            &here("systemPrompt"),
            Change::Rewritten,
            "→ `clientOptions.system`",
        );
    }
    if let Some(temperature) = &options.temperature {
        generation(
            src,
            &here("temperature"),
            "temperature",
            temperature,
            choice,
        );
    }
    if options.timeout.is_some() {
        let text = "the trial's `timeout` bounds the client";
        src.note(&here("timeout"), Change::Dropped, text);
    }
    for key in options.rest.keys() {
        let text = format!("the `api` client has no option `{key}`");
        src.note(&here(key), Change::Dropped, text);
    }
}

/// A generation setting (`temperature`, `maxTokens` or `maxToolCalls`) at `here` → the
/// `api` client's option.
fn generation(src: &mut Source, here: &str, key: &str, value: &Value, choice: &mut ClientChoice) {
    if key == "maxToolCalls" {
        let turns = value.as_u64().unwrap_or(5) + 1;
        choice.options.insert("maxTurns".into(), json!(turns));
        src.note(here, Change::Approximated, format!("→ `clientOptions.maxTurns: {turns}`: mst bounds model calls, not tool calls (grade the count with `tool-call-count`)"));
    } else {
        choice.options.insert(key.to_string(), value.clone());
        src.note(here, Change::Rewritten, format!("→ `clientOptions.{key}`"));
    }
}

/// MST's provider names → mst provider entry names.
pub(super) fn provider_name(src: &mut Source, at: &str, named: &str) -> String {
    match named {
        "anthropic" | "openai" | "google" => named.to_string(),
        "claude" => {
            src.note(at, Change::Rewritten, "`claude` → `anthropic`");
            "anthropic".into()
        }
        "vertex" | "vertex-anthropic" | "anthropic-agent-sdk" => {
            src.note(at, Change::Approximated, format!("`{named}` → the Anthropic API (`anthropic`); point its `baseUrl` at your gateway if you use one"));
            "anthropic".into()
        }
        other => {
            src.note(
                at,
                Change::Approximated,
                format!("unknown provider `{other}` → `anthropic`"),
            );
            "anthropic".into()
        }
    }
}

/// The provider MST would infer from a model id.
fn infer_provider(model: &str) -> Option<&'static str> {
    if model.starts_with("claude") {
        Some("anthropic")
    } else if ["gpt", "o1", "o3", "o4", "chatgpt"]
        .iter()
        .any(|p| model.starts_with(p))
    {
        Some("openai")
    } else if model.starts_with("gemini") {
        Some("google")
    } else {
        None
    }
}

/// `PROVIDER/MODEL` → `MODEL`.
pub(super) fn bare_model(model: &str) -> String {
    model.split_once('/').map_or(model, |(_, m)| m).to_string()
}

/// The `providers` entries for `providers` (sorted, each once): the format, address and
/// key variable of each, with its prices from MST's `pricing`; each key is a step to do.
pub(super) fn provider_entries(
    src: &mut Source,
    providers: &[String],
    pricing: Option<&Map<String, Value>>,
) -> Map<String, Value> {
    let mut entries = Map::new();
    for provider in providers {
        let var = src
            .key_vars
            .get(provider)
            .cloned()
            .unwrap_or_else(|| default_key_var(provider).to_string());
        let (format, base_url) = match provider.as_str() {
            "openai" => ("openai", "https://api.openai.com/v1"),
            "google" => (
                "openai",
                "https://generativelanguage.googleapis.com/v1beta/openai",
            ),
            _ => ("anthropic", "https://api.anthropic.com"),
        };
        let mut entry = json!({"format": format, "baseUrl": base_url, "key": format!("env:{var}")});
        if let Some(prices) = pricing.and_then(|pricing| prices_for(src, provider, pricing)) {
            entry["prices"] = prices;
        }
        entries.insert(provider.clone(), entry);
        src.report.todo(format!(
            "export {var} (the key of provider `{provider}`, read on the host only)"
        ));
    }
    entries
}

/// MST's `pricing` (USD per million tokens, by model) → a provider's `prices` for its models.
fn prices_for(src: &mut Source, provider: &str, pricing: &Map<String, Value>) -> Option<Value> {
    let mut prices = Map::new();
    for (model, price) in pricing {
        if infer_provider(model).unwrap_or("anthropic") != provider {
            continue;
        }
        let (Some(input), Some(output)) = (price.get("input"), price.get("output")) else {
            continue;
        };
        prices.insert(model.clone(), json!({"input": input, "output": output}));
        if price.get("cacheRead").is_some() || price.get("cacheWrite").is_some() {
            src.note(
                &format!("pricing.{model}"),
                Change::Approximated,
                "cache read and write prices dropped: mst prices input and output tokens",
            );
        } else {
            src.note(
                &format!("pricing.{model}"),
                Change::Rewritten,
                format!("→ `providers.{provider}.prices`"),
            );
        }
    }
    (!prices.is_empty()).then_some(Value::Object(prices))
}

/// The variable that holds `provider`'s key when MST names none.
fn default_key_var(provider: &str) -> &'static str {
    match provider {
        "openai" => "OPENAI_API_KEY",
        "google" => "GEMINI_API_KEY",
        _ => "ANTHROPIC_API_KEY",
    }
}
