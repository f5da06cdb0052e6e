//! HTTP providers: the Anthropic Messages API (`anthropic`) and OpenAI Chat Completions
//! (`openai`, which also covers OpenAI-compatible servers: gateways, vLLM, Ollama), over
//! reqwest with rustls. A 429, a 5xx or a network error is retried with backoff, honouring
//! `Retry-After`; what still fails after the last retry is the caller's infrastructure failure.

use super::{ModelError, ModelRequest, Reply, ToolCall, ToolChoice, Turn, Usage};
use crate::secrets::Secret;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::Duration;

/// A provider's wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WireFormat {
    Anthropic,
    Openai,
}

/// A configured provider (`providers.NAME` in the eval config): its wire format, where it
/// is, and the name of the secret holding its key (the value travels as a token).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ProviderConfig {
    pub format: WireFormat,
    /// e.g. `https://api.anthropic.com` or `https://api.openai.com/v1`.
    pub base_url: String,
    /// The secret that holds the key: a name in `--secrets-file`, or `env:VAR` for the
    /// environment variable `VAR` of the mst process.
    pub key: String,
    /// Prices by model, for the cost each call records.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
    /// The default for `limits.providers.NAME`: most calls in flight at once, across shards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
}

impl ProviderConfig {
    /// Checks what serde cannot; errors name the field as `{place}{name}.field`.
    pub fn validate(&self, name: &str, place: &str) -> anyhow::Result<()> {
        if name == "mock" {
            anyhow::bail!("{place}mock: `mock` is the built-in provider and cannot be configured");
        }
        let url = self.base_url.as_str();
        if !(url.starts_with("https://") || url.starts_with("http://")) {
            anyhow::bail!("{place}{name}.baseUrl must be an http(s) URL, not {url:?}");
        }
        if let Some(var) = self.key.strip_prefix("env:") {
            let valid = var.chars().next().is_some_and(|c| !c.is_ascii_digit())
                && var.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
            if !valid {
                anyhow::bail!(
                    "{place}{name}.key is `env:{var}`, but {var:?} is not an environment \
                     variable name (letters, digits and `_`, not starting with a digit)"
                );
            }
        }
        if self.limit == Some(0) {
            anyhow::bail!("{place}{name}.limit must be at least 1 (leave it out for no limit)");
        }
        if let Some((model, _)) = self.prices.iter().find(|(_, p)| !p.is_valid()) {
            anyhow::bail!(
                "{place}{name}.prices.{model}: `input` and `output` must be dollars per million \
                 tokens, finite and not negative"
            );
        }
        Ok(())
    }
}

/// What a model costs, in US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Price {
    pub input: f64,
    pub output: f64,
}

/// The cost of a call to `model` of `provider` that used `usage`, when the provider has a
/// price for that model.
pub fn cost(provider: Option<&ProviderConfig>, model: &str, usage: &Usage) -> Option<f64> {
    Some(provider?.prices.get(model)?.cost(usage))
}

impl Price {
    /// The cost of `usage`, in US dollars.
    pub fn cost(&self, usage: &Usage) -> f64 {
        (usage.input_tokens as f64 * self.input + usage.output_tokens as f64 * self.output) / 1e6
    }

    /// Whether both prices are finite and not negative.
    pub fn is_valid(&self) -> bool {
        [self.input, self.output]
            .iter()
            .all(|p| p.is_finite() && *p >= 0.0)
    }
}

/// Retries after the first attempt.
const RETRIES: u32 = 3;
/// The first backoff; doubled each retry.
const BACKOFF: Duration = Duration::from_millis(500);
/// The longest `Retry-After` honoured.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// The largest reply body read.
const MAX_BODY: usize = 16 << 20;
/// The most of an error reply's body read (its message is cut shorter still).
const MAX_ERROR_BODY: usize = 64 << 10;

/// A provider reached over HTTP.
#[derive(Debug, Clone)]
pub struct Http {
    config: ProviderConfig,
    key: Option<Secret>,
    /// Retries after the first attempt.
    retries: u32,
    /// The client, or why none could be built.
    client: Result<reqwest::Client, String>,
    /// Set for a machine's model gateway: calls name their model in full (`provider/model`)
    /// and, when a grader plugin makes them, say which in [`PLUGIN_HEADER`].
    gateway: Option<GatewayCaller>,
}

/// Who calls a machine's model gateway through an [`Http`].
#[derive(Debug, Clone, Default)]
struct GatewayCaller {
    /// The grader plugin (`name version`) whose calls these are; `None` for an agent.
    plugin: Option<String>,
}

/// The header a grader plugin's calls through a machine's gateway name it in, so that the
/// coordinator counts them to it (and checks its grant).
pub const PLUGIN_HEADER: &str = "x-mst-plugin";

impl Http {
    /// The provider `config` with its key (`None`: the secrets file has none, said when it is
    /// called).
    pub fn new(config: &ProviderConfig, key: Option<&Secret>) -> Self {
        Http {
            config: config.clone(),
            key: key.cloned(),
            retries: RETRIES,
            // A provider's key goes in a header a redirect would carry elsewhere (reqwest keeps
            // `x-api-key` across hosts): a redirect is never followed, its 3xx is the answer.
            client: crate::net::client(|builder| {
                builder.redirect(reqwest::redirect::Policy::none())
            }),
            gateway: None,
        }
    }

    /// The machine's model gateway at `url` (its loopback), called in the Anthropic format
    /// with a trial's gateway `token`, as the `api` client calls it, naming the model in full
    /// (`provider/model`). It is never retried: the host retried the provider before it
    /// answered, and each retry here would be made again there.
    pub fn gateway(url: &str, token: &Secret) -> Self {
        Http {
            config: ProviderConfig {
                format: WireFormat::Anthropic,
                base_url: url.to_string(),
                key: "the trial's gateway token".into(),
                prices: BTreeMap::new(),
                limit: None,
            },
            key: Some(token.clone()),
            retries: 0,
            client: crate::net::client(|builder| {
                builder
                    .redirect(reqwest::redirect::Policy::none())
                    .no_proxy()
            }),
            gateway: Some(GatewayCaller::default()),
        }
    }

    /// The machine's gateway as [`Http::gateway`], for the calls of grader plugin `plugin`
    /// (`name version`), which it names in [`PLUGIN_HEADER`].
    pub fn gateway_for_plugin(url: &str, token: &Secret, plugin: &str) -> Self {
        Http {
            gateway: Some(GatewayCaller {
                plugin: Some(plugin.to_string()),
            }),
            ..Http::gateway(url, token)
        }
    }

    /// One model call, with retries.
    pub async fn complete(&self, request: &ModelRequest<'_>) -> Result<Reply, ModelError> {
        let key = self.key.as_ref().ok_or_else(|| {
            ModelError(format!(
                "no key: the secret `{}` is not set",
                self.config.key
            ))
        })?;
        let client = self.client.as_ref().map_err(|e| ModelError(e.clone()))?;
        let (url, mut body) = match self.config.format {
            WireFormat::Anthropic => (
                format!("{}/v1/messages", self.config.base_url.trim_end_matches('/')),
                anthropic_body(request),
            ),
            WireFormat::Openai => (
                format!(
                    "{}/chat/completions",
                    self.config.base_url.trim_end_matches('/')
                ),
                openai_body(request),
            ),
        };
        if self.gateway.is_some() {
            // The coordinator behind the gateway serves every provider.
            body["model"] = json!(request.model.to_string());
        }
        let mut attempt = 0;
        loop {
            let mut post = client.post(&url).json(&body);
            post = match self.config.format {
                WireFormat::Anthropic => post
                    .header("x-api-key", key.expose())
                    .header("anthropic-version", "2023-06-01"),
                WireFormat::Openai => post.bearer_auth(key.expose()),
            };
            if let Some(plugin) = self.gateway.as_ref().and_then(|c| c.plugin.as_ref()) {
                post = post.header(PLUGIN_HEADER, plugin);
            }
            let wait = match post.send().await {
                Ok(response) if response.status().is_success() => {
                    let bytes = crate::net::read_capped(response, MAX_BODY)
                        .await
                        .map_err(|e| ModelError(format!("reading the reply failed: {e}")))?;
                    let value: Value = serde_json::from_slice(&bytes)
                        .map_err(|e| ModelError(format!("the reply is not JSON: {e}")))?;
                    return match self.config.format {
                        WireFormat::Anthropic => parse_anthropic(&value),
                        WireFormat::Openai => parse_openai(&value),
                    };
                }
                Ok(response) => {
                    let status = response.status();
                    let retry_after = response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.trim().parse::<u64>().ok())
                        .map(Duration::from_secs);
                    // Only the start of an error body is shown: the rest is never read.
                    let body = crate::net::read_prefix(response, MAX_ERROR_BODY).await;
                    let text = error_text(&String::from_utf8_lossy(&body));
                    let retryable = status.as_u16() == 429 || status.is_server_error();
                    if !retryable || attempt == self.retries {
                        return Err(ModelError(match self.retries {
                            0 => format!("{url} answered {status}: {text}"),
                            _ => format!(
                                "{url} answered {status} after {} attempt(s): {text}",
                                attempt + 1
                            ),
                        }));
                    }
                    retry_after.unwrap_or(BACKOFF * 2u32.pow(attempt))
                }
                Err(e) => {
                    if attempt == self.retries {
                        return Err(ModelError(format!(
                            "{url} could not be reached after {} attempt(s): {e}",
                            attempt + 1
                        )));
                    }
                    BACKOFF * 2u32.pow(attempt)
                }
            };
            tokio::time::sleep(wait.min(MAX_RETRY_AFTER)).await;
            attempt += 1;
        }
    }
}

/// What an error answer says, for a message: the `error.message` both formats (and the
/// gateway) put in a JSON error body, or the start of the body as it is.
fn error_text(body: &str) -> String {
    let message = serde_json::from_str::<Value>(body)
        .ok()
        .and_then(|v| v["error"]["message"].as_str().map(str::to_string));
    message
        .unwrap_or_else(|| body.to_string())
        .chars()
        .take(300)
        .collect()
}

/// What both formats' request bodies share: the model, the token cap, the messages and the
/// temperature when one is set.
fn body_with(request: &ModelRequest<'_>, messages: Vec<Value>) -> Value {
    let mut body = json!({
        "model": request.model.model,
        "max_tokens": request.max_tokens,
        "messages": messages,
    });
    if let Some(temperature) = request.temperature {
        body["temperature"] = json!(temperature);
    }
    body
}

fn anthropic_body(request: &ModelRequest<'_>) -> Value {
    let messages: Vec<Value> = request
        .turns
        .iter()
        .map(|turn| match turn {
            Turn::User(text) => json!({"role": "user", "content": text}),
            Turn::Assistant { text, calls } => {
                let mut content: Vec<Value> = text
                    .iter()
                    .map(|t| json!({"type": "text", "text": t}))
                    .collect();
                content.extend(calls.iter().map(|c| {
                    json!({"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments})
                }));
                json!({"role": "assistant", "content": content})
            }
            Turn::ToolResults(outputs) => {
                let content: Vec<Value> = outputs
                    .iter()
                    .map(|o| {
                        json!({"type": "tool_result", "tool_use_id": o.id,
                               "content": o.output, "is_error": o.is_error})
                    })
                    .collect();
                json!({"role": "user", "content": content})
            }
        })
        .collect();
    let mut body = body_with(request, messages);
    if let Some(system) = request.system {
        body["system"] = json!(system);
    }
    if !request.tools.is_empty() && request.tool_choice != ToolChoice::None {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| json!({"name": t.name, "description": t.description, "input_schema": t.input_schema}))
            .collect();
        body["tool_choice"] = match request.tool_choice {
            ToolChoice::Required => json!({"type": "any"}),
            _ => json!({"type": "auto"}),
        };
    }
    body
}

fn parse_anthropic(value: &Value) -> Result<Reply, ModelError> {
    let content = value["content"]
        .as_array()
        .ok_or_else(|| ModelError("the reply has no `content` list".into()))?;
    let mut texts = Vec::new();
    let mut calls = Vec::new();
    for block in content {
        match block["type"].as_str() {
            Some("text") => texts.push(block["text"].as_str().unwrap_or_default().to_string()),
            Some("tool_use") => calls.push(ToolCall {
                id: string_field(block, "id")?,
                name: string_field(block, "name")?,
                arguments: block["input"].clone(),
            }),
            _ => {}
        }
    }
    Ok(Reply {
        text: (!texts.is_empty()).then(|| texts.join("")),
        calls,
        usage: Usage {
            input_tokens: value["usage"]["input_tokens"].as_u64().unwrap_or(0),
            output_tokens: value["usage"]["output_tokens"].as_u64().unwrap_or(0),
        },
    })
}

fn openai_body(request: &ModelRequest<'_>) -> Value {
    let mut messages: Vec<Value> = request
        .system
        .iter()
        .map(|s| json!({"role": "system", "content": s}))
        .collect();
    for turn in request.turns {
        match turn {
            Turn::User(text) => messages.push(json!({"role": "user", "content": text})),
            Turn::Assistant { text, calls } => {
                let mut message = json!({"role": "assistant", "content": text});
                if !calls.is_empty() {
                    message["tool_calls"] = calls
                        .iter()
                        .map(|c| {
                            json!({"id": c.id, "type": "function",
                                   "function": {"name": c.name, "arguments": c.arguments.to_string()}})
                        })
                        .collect();
                }
                messages.push(message);
            }
            Turn::ToolResults(outputs) => messages.extend(
                outputs
                    .iter()
                    .map(|o| json!({"role": "tool", "tool_call_id": o.id, "content": o.output})),
            ),
        }
    }
    let mut body = body_with(request, messages);
    if !request.tools.is_empty() && request.tool_choice != ToolChoice::None {
        body["tools"] = request
            .tools
            .iter()
            .map(|t| {
                json!({"type": "function", "function": {"name": t.name,
                       "description": t.description, "parameters": t.input_schema}})
            })
            .collect();
        body["tool_choice"] = json!(match request.tool_choice {
            ToolChoice::Required => "required",
            _ => "auto",
        });
    }
    body
}

fn parse_openai(value: &Value) -> Result<Reply, ModelError> {
    let message = &value["choices"][0]["message"];
    if !message.is_object() {
        return Err(ModelError("the reply has no `choices[0].message`".into()));
    }
    let calls = message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|call| {
            let arguments = call["function"]["arguments"].as_str().unwrap_or("{}");
            Ok(ToolCall {
                id: string_field(call, "id")?,
                name: string_field(&call["function"], "name")?,
                arguments: serde_json::from_str(arguments).map_err(|e| {
                    ModelError(format!("a tool call's `arguments` is not JSON: {e}"))
                })?,
            })
        })
        .collect::<Result<Vec<_>, ModelError>>()?;
    Ok(Reply {
        text: message["content"].as_str().map(str::to_string),
        calls,
        usage: Usage {
            input_tokens: value["usage"]["prompt_tokens"].as_u64().unwrap_or(0),
            output_tokens: value["usage"]["completion_tokens"].as_u64().unwrap_or(0),
        },
    })
}

fn string_field(value: &Value, field: &str) -> Result<String, ModelError> {
    value[field]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| ModelError(format!("a reply block lacks `{field}`")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_body_says_its_message_capped_whatever_it_holds() {
        let anthropic = r#"{"type":"error","error":{"type":"api_error","message":"overloaded"}}"#;
        assert_eq!(error_text(anthropic), "overloaded");
        // Not JSON, or JSON without a string message: the body as it is.
        assert_eq!(
            error_text("<html>bad gateway</html>"),
            "<html>bad gateway</html>"
        );
        let odd = r#"{"error":{"message":{"nested":true}}}"#;
        assert_eq!(error_text(odd), odd);
        // A hostile body cannot flood the trial's reason, by message or by body.
        let long = "x".repeat(10_000);
        let flood = serde_json::json!({"error": {"message": long}}).to_string();
        assert_eq!(error_text(&flood).chars().count(), 300);
        assert_eq!(error_text(&long).chars().count(), 300);
        assert_eq!(error_text(""), "");
    }
}
