//! The coordinator's side of the model gateway: the model calls agents make through the
//! gateway a worker serves on its machine (`shard/gateway.rs`). Each trial whose client calls
//! models that way gets a token of its own when it is granted, refused once the trial ended.
//! A call arrives in parts (`model-call`); once whole, the coordinator calls the variant's
//! model itself (the built-in `mock`, or a configured provider with the key only the host
//! holds, under `limits.providers`) on a thread of its own, and answers in parts
//! (`model-reply`). What each call used is measured here, not taken from the machine: when
//! the trial's trace is stored, its calls are appended to it as `usage` events (which the
//! summary, the cost and the playground's budgets count) with their model and latency.

use super::protocol::{ModelAnswer, ModelPart, ModelParts, MAX_MODEL_CALLS_IN_FLIGHT};
use crate::client::agent_cli::AGENT_USAGE;
use crate::eval::config::VariantSpec;
use crate::eval::trial::{EventKind, TraceEvent, TrialKey};
use crate::grade::remote::GradePlugin;
use crate::llm::mock::MockScript;
use crate::llm::wire::GatewayRequest;
use crate::llm::{CallGate, ModelAccess, ModelRef, Provider, Reply};
use crate::secrets::Secret;
use serde_json::json;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

/// A finished call, sent back to the session by the thread that made it.
pub struct Answered {
    pub key: TrialKey,
    pub call: u32,
    pub answer: ModelAnswer,
    /// The model called, as `provider/model`.
    pub model: String,
    pub latency_ms: u64,
    /// The call's cost, when its model has a price.
    pub cost_usd: Option<f64>,
    /// What the agent asked: its conversation's turns and the tools it offered.
    pub asked: Asked,
}

/// What an agent's model call asked, as its trace shows it: the number of turns, and the
/// names of the tools it offered (at most [`MAX_TOOL_NAMES`]).
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Asked {
    pub turns: usize,
    pub tools: Vec<String>,
    pub stream: bool,
}

/// The most tool names a call's event lists.
const MAX_TOOL_NAMES: usize = 64;

impl Asked {
    fn of(request: &GatewayRequest) -> Self {
        Asked {
            turns: request.turns.len(),
            tools: request
                .tools
                .iter()
                .take(MAX_TOOL_NAMES)
                .map(|t| crate::client::agent_cli::capped(&t.name, 256))
                .collect(),
            stream: request.stream,
        }
    }
}

/// What one call of a trial measured, kept until its trace is stored.
struct Measured {
    at_ms: u64,
    asked: Asked,
    model: String,
    latency_ms: u64,
    reply: Option<Reply>,
    cost_usd: Option<f64>,
    error: Option<String>,
}

/// A trial that may call models through the gateway: its token, and its calls so far.
struct GatewayTrial {
    token: Secret,
    granted: Instant,
    calls: Vec<Measured>,
}

/// The session's model calls: tokens of running trials, calls arriving and in flight, and
/// what ended trials' calls measured until their traces are stored.
pub struct ModelCalls {
    running: HashMap<TrialKey, GatewayTrial>,
    ended: std::cell::RefCell<HashMap<TrialKey, GatewayTrial>>,
    arriving: HashMap<(TrialKey, u32), ModelParts>,
    in_flight: usize,
}

impl Default for ModelCalls {
    fn default() -> Self {
        ModelCalls {
            running: HashMap::new(),
            ended: std::cell::RefCell::new(HashMap::new()),
            arriving: HashMap::new(),
            in_flight: 0,
        }
    }
}

/// What to do with a part that came.
pub enum OnPart {
    /// Nothing yet: more parts are due.
    Wait,
    /// Answer the call at once (a refusal).
    Answer(ModelAnswer),
    /// The whole request, checked: call the model.
    Call(Box<GatewayRequest>),
}

impl ModelCalls {
    /// A new token for `key`'s trial, which may call models from now until it is reported.
    pub fn mint(&mut self, key: &TrialKey) -> Secret {
        let mut bytes = [0u8; 24];
        getrandom::fill(&mut bytes).expect("the system's random source");
        let token = Secret::new(format!("mst-gw-{}", hex::encode(bytes)));
        crate::secrets::hold("gateway token", &token);
        self.running.insert(
            key.clone(),
            GatewayTrial {
                token: token.clone(),
                granted: Instant::now(),
                calls: Vec::new(),
            },
        );
        token
    }

    /// Takes one part of call `call` of `key`'s trial. `Err` is a protocol violation (a part
    /// out of order, a call too large): the shard is lost.
    pub fn on_part(
        &mut self,
        key: &TrialKey,
        call: u32,
        token: &Secret,
        part: ModelPart,
    ) -> Result<OnPart, String> {
        let Some(trial) = self.running.get(key) else {
            self.arriving.remove(&(key.clone(), call));
            return Ok(OnPart::Answer(ModelAnswer::refused(
                401,
                format!("trial {key} is not running: its gateway token is no longer valid"),
            )));
        };
        let same: bool = subtle::ConstantTimeEq::ct_eq(
            token.expose().as_bytes(),
            trial.token.expose().as_bytes(),
        )
        .into();
        if !same {
            return Ok(OnPart::Answer(ModelAnswer::refused(
                401,
                format!("the gateway token is not trial {key}'s"),
            )));
        }
        let id = (key.clone(), call);
        if !self.arriving.contains_key(&id) && self.in_flight >= MAX_MODEL_CALLS_IN_FLIGHT {
            return Ok(OnPart::Answer(ModelAnswer::refused(
                429,
                format!("more than {MAX_MODEL_CALLS_IN_FLIGHT} model calls at once"),
            )));
        }
        let parts = self.arriving.entry(id.clone()).or_default();
        let Some(json) = parts.add(part)? else {
            return Ok(OnPart::Wait);
        };
        self.arriving.remove(&id);
        match serde_json::from_str::<GatewayRequest>(&json) {
            Ok(request) => {
                self.in_flight += 1;
                Ok(OnPart::Call(Box::new(request)))
            }
            Err(e) => Err(format!("a model call that is not a request: {e}")),
        }
    }

    /// Records `answered` for its trial and returns its answer to send, or `None` when the
    /// trial ended meanwhile (its worker no longer waits).
    pub fn on_answered(&mut self, answered: Answered) -> Option<ModelAnswer> {
        self.in_flight = self.in_flight.saturating_sub(1);
        let trial = self.running.get_mut(&answered.key)?;
        trial.calls.push(Measured {
            at_ms: trial.granted.elapsed().as_millis() as u64,
            model: answered.model,
            asked: answered.asked,
            latency_ms: answered.latency_ms,
            reply: answered.answer.reply.clone(),
            cost_usd: answered.cost_usd,
            error: answered.answer.refused.as_ref().map(|r| r.message.clone()),
        });
        Some(answered.answer)
    }

    /// `key`'s trial was reported: its token is refused from now on, and its calls wait for
    /// its trace.
    pub fn end(&mut self, key: &TrialKey) {
        self.arriving.retain(|(k, _), _| k != key);
        if let Some(trial) = self.running.remove(key) {
            self.ended.borrow_mut().insert(key.clone(), trial);
        }
    }

    /// Appends what `key`'s calls measured to its trace `events`, numbered after them: one
    /// `usage` event per call that had a reply (its model, tokens, cost, latency, `measuredBy:
    /// gateway`) and a `model-error` event per call that failed. On a trial that had a gateway
    /// the host's measurement is its usage: a `usage` event the machine's trace holds is kept
    /// as the agent's report ([`AGENT_USAGE`]), which nothing counts.
    pub fn append_to(&self, key: &TrialKey, events: &mut Vec<TraceEvent>) {
        let Some(trial) = self.ended.borrow_mut().remove(key) else {
            return;
        };
        for event in events.iter_mut() {
            if let EventKind::Custom { name, .. } = &mut event.kind {
                if name == "usage" {
                    *name = AGENT_USAGE.into();
                }
            }
        }
        for call in trial.calls {
            let kind = match (&call.reply, &call.error) {
                (Some(reply), _) => EventKind::Custom {
                    name: "usage".into(),
                    data: json!({
                        "model": call.model,
                        "usage": reply.usage,
                        "costUsd": call.cost_usd,
                        "latencyMs": call.latency_ms,
                        "toolCalls": reply.calls.iter().map(|c| &c.name).collect::<Vec<_>>(),
                        "asked": call.asked,
                        "measuredBy": "gateway",
                    }),
                },
                (None, error) => EventKind::Custom {
                    name: "model-error".into(),
                    data: json!({
                        "model": call.model,
                        "error": error,
                        "asked": call.asked,
                        "latencyMs": call.latency_ms,
                        "measuredBy": "gateway",
                    }),
                },
            };
            events.push(TraceEvent {
                seq: events.len() as u64,
                at_ms: call.at_ms,
                kind,
            });
        }
    }
}

/// Who makes a call through a machine's gateway, which decides the model it gets.
pub enum Caller {
    /// A trial's agent: it gets its variant's model, whatever it asks for (the eval chooses
    /// the model).
    Agent(Box<VariantSpec>),
    /// A grade shard's judges, these grader plugins: a call gets the model it names, if the
    /// plugin it names is one of them and is granted the model's provider; the call counts to
    /// that plugin.
    Judges(Vec<GradePlugin>),
}

/// The model a call is to get, and the grader plugin it counts to (a judge's call).
struct Chosen {
    model: ModelRef,
    plugin: Option<String>,
}

impl Caller {
    /// The model `request` gets, or its refusal.
    fn choose(&self, request: &GatewayRequest) -> Result<Chosen, ModelAnswer> {
        let refused = |status: u16, message: String| ModelAnswer::refused(status, message);
        let name = self
            .named(request)
            .ok_or_else(|| refused(400, "the variant names no `model`".into()))?;
        let model = ModelRef::parse(name).map_err(|e| refused(400, format!("{e:#}")))?;
        let Caller::Judges(plugins) = self else {
            return Ok(Chosen {
                model,
                plugin: None,
            });
        };
        let plugin = request.plugin.as_deref().unwrap_or("(none)");
        let granted = plugins
            .iter()
            .find(|p| p.name_version == plugin)
            .is_some_and(|p| p.models.contains(&model.provider));
        if !granted {
            return Err(refused(
                403,
                format!(
                    "plugin `{plugin}` is not a judge of this grade shard granted model \
                     provider `{}`",
                    model.provider
                ),
            ));
        }
        Ok(Chosen {
            model,
            plugin: Some(plugin.to_string()),
        })
    }

    /// The model `request` is to get, as named: its variant's, or the one a judge names.
    fn named<'a>(&'a self, request: &'a GatewayRequest) -> Option<&'a str> {
        match self {
            Caller::Agent(spec) => spec.model.as_deref(),
            Caller::Judges(_) => Some(&request.model),
        }
    }

    /// The `mock/script` turns for `key`'s case, from an agent's variant.
    fn script(
        &self,
        key: &TrialKey,
    ) -> anyhow::Result<Option<Vec<crate::llm::mock::ScriptedTurn>>> {
        let Caller::Agent(spec) = self else {
            return Ok(None);
        };
        let script: Option<MockScript> = spec
            .client_options
            .as_ref()
            .and_then(|o| o.get("mockScript"))
            .map(|s| serde_json::from_value(s.clone()))
            .transpose()?;
        Ok(script.and_then(|s| s.for_case(&key.case).map(<[_]>::to_vec)))
    }
}

/// Everything a call's thread needs: who calls, how to reach models, and where to answer.
pub struct CallJob {
    pub key: TrialKey,
    pub call: u32,
    pub request: Box<GatewayRequest>,
    pub caller: Caller,
    pub access: Option<Arc<ModelAccess>>,
    /// Hears the answer (the session's input).
    pub answers: Box<dyn FnOnce(Answered) + Send>,
}

impl CallJob {
    /// Calls the model on a thread of its own and sends the [`Answered`] back.
    pub fn spawn(self) {
        std::thread::spawn(move || {
            let started = Instant::now();
            let (answer, model, cost_usd) = self.call();
            (self.answers)(Answered {
                key: self.key,
                call: self.call,
                answer,
                model,
                latency_ms: started.elapsed().as_millis() as u64,
                cost_usd,
                asked: Asked::of(&self.request),
            });
        });
    }

    /// The answer to the request from the model its caller gets ([`Caller::choose`]), that
    /// model's name, and the call's cost. A judge's call is counted to its plugin.
    fn call(&self) -> (ModelAnswer, String, Option<f64>) {
        let Chosen { model, plugin } = match self.caller.choose(&self.request) {
            Ok(chosen) => chosen,
            Err(refused) => {
                let name = self.caller.named(&self.request).unwrap_or_default();
                return (refused, name.to_string(), None);
            }
        };
        let name = model.to_string();
        let provider = match self.provider(&model) {
            Ok(provider) => provider,
            Err(e) => return (ModelAnswer::refused(502, format!("{e:#}")), name, None),
        };
        let runtime = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(runtime) => runtime,
            Err(e) => return (ModelAnswer::refused(500, e.to_string()), name, None),
        };
        let gate: &dyn CallGate = match &self.access {
            Some(access) => access.gate(),
            None => &crate::llm::Unlimited,
        };
        let request = self.request.as_request(&model);
        match runtime.block_on(provider.complete(gate, &request)) {
            Ok(reply) => {
                let access = self.access.as_ref();
                if let (Some(access), Some(plugin)) = (access, &plugin) {
                    access.count(plugin, &model, &reply.usage);
                }
                // Tool calls take the names the agent offered when the gateway renders them.
                let cost = access.and_then(|a| a.cost(&model, &reply.usage));
                let answer = ModelAnswer {
                    reply: Some(reply),
                    refused: None,
                };
                (answer, name, cost)
            }
            Err(e) => (ModelAnswer::refused(502, e.0), name, None),
        }
    }

    /// The provider of `model`: `mock` (with an agent's script for this case), or the
    /// configured provider with the key the host holds.
    fn provider(&self, model: &ModelRef) -> anyhow::Result<Provider> {
        if model.provider == "mock" {
            let turns = self.caller.script(&self.key)?;
            return Provider::new(model, turns.as_deref(), None, None);
        }
        match &self.access {
            Some(access) => access.provider(model),
            None => anyhow::bail!("this run has no model providers"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-turn request for `model`, made by grader plugin `plugin` when given.
    fn asking(model: &str, plugin: Option<&str>) -> GatewayRequest {
        GatewayRequest {
            model: model.into(),
            system: None,
            turns: vec![crate::llm::Turn::User("score this".into())],
            tools: Vec::new(),
            tool_choice: Default::default(),
            max_tokens: 16,
            temperature: None,
            stream: false,
            hints: Default::default(),
            plugin: plugin.map(str::to_string),
        }
    }

    fn event(seq: u64, name: &str, data: serde_json::Value) -> TraceEvent {
        TraceEvent {
            seq,
            at_ms: seq,
            kind: EventKind::Custom {
                name: name.into(),
                data,
            },
        }
    }

    #[test]
    fn a_judge_gets_the_model_it_names_only_as_a_plugin_granted_its_provider() {
        let judge = GradePlugin {
            name: "acme/judge".into(),
            references: vec!["acme/judge".into()],
            digest: "0".repeat(64),
            exec: Vec::new(),
            read_dirs: Vec::new(),
            http: Vec::new(),
            models: vec!["acme".into()],
            name_version: "acme/judge 1.0.0".into(),
        };
        let caller = Caller::Judges(vec![judge]);
        let chosen = caller
            .choose(&asking("acme/judge-1", Some("acme/judge 1.0.0")))
            .unwrap_or_else(|a| panic!("{:?}", a.refused));
        assert_eq!(chosen.model.to_string(), "acme/judge-1");
        assert_eq!(chosen.plugin.as_deref(), Some("acme/judge 1.0.0"));
        // What a machine may claim, refused: another provider, a plugin it does not carry,
        // none at all, a model that names no provider.
        for (model, plugin, status, says) in [
            (
                "other/m",
                Some("acme/judge 1.0.0"),
                403,
                "granted model provider `other`",
            ),
            (
                "acme/judge-1",
                Some("acme/judge 2.0.0"),
                403,
                "plugin `acme/judge 2.0.0`",
            ),
            ("acme/judge-1", None, 403, "plugin `(none)`"),
            ("judge-1", Some("acme/judge 1.0.0"), 400, "provider/model"),
        ] {
            let Err(answer) = caller.choose(&asking(model, plugin)) else {
                panic!("{model} for {plugin:?} was let through");
            };
            let refused = answer.refused.expect("a refusal");
            assert_eq!(refused.status, status, "{}", refused.message);
            assert!(refused.message.contains(says), "{}", refused.message);
        }
        // An agent gets its variant's model, whatever it names.
        let spec: VariantSpec =
            serde_json::from_value(json!({"client": "codex", "model": "acme/m"})).unwrap();
        let chosen = Caller::Agent(Box::new(spec))
            .choose(&asking("gpt-5", None))
            .unwrap_or_else(|a| panic!("{:?}", a.refused));
        assert_eq!(
            (chosen.model.to_string(), chosen.plugin),
            ("acme/m".into(), None)
        );
    }

    #[test]
    fn a_gateway_trials_usage_is_what_the_host_measured_not_what_its_trace_says() {
        let mut calls = ModelCalls::default();
        let key = TrialKey::new("v", "c", 0);
        let token = calls.mint(&key);
        let request = asking("any", None);
        let json = serde_json::to_string(&request).unwrap();
        for part in ModelPart::split(&json) {
            let _ = calls.on_part(&key, 0, &token, part).unwrap();
        }
        let reply = Reply {
            text: Some("hello".into()),
            calls: Vec::new(),
            usage: crate::llm::Usage {
                input_tokens: 7,
                output_tokens: 3,
            },
        };
        let answer = calls.on_answered(Answered {
            key: key.clone(),
            call: 0,
            answer: ModelAnswer {
                reply: Some(reply),
                refused: None,
            },
            model: "acme/m".into(),
            latency_ms: 5,
            cost_usd: None,
            asked: Asked::default(),
        });
        assert!(answer.is_some(), "the trial still runs");
        calls.end(&key);
        // The machine's trace claims a call of a million tokens.
        let forged = json!({"usage": {"inputTokens": 1_000_000, "outputTokens": 1}});
        let mut events = vec![event(0, "usage", forged)];
        calls.append_to(&key, &mut events);
        let counted: Vec<_> = events.iter().filter_map(|e| e.kind.usage()).collect();
        assert_eq!(counted.len(), 1, "{events:?}");
        assert_eq!(
            (counted[0].0.input_tokens, counted[0].0.output_tokens),
            (7, 3)
        );
        assert!(matches!(&events[0].kind, EventKind::Custom { name, .. } if name == AGENT_USAGE));
        assert_eq!(events[1].seq, 1, "numbered after the trace's own");

        // A trial without a gateway keeps its own usage: its client measured it (mock).
        let mut own = vec![event(
            0,
            "usage",
            json!({"usage": {"inputTokens": 2, "outputTokens": 1}}),
        )];
        calls.append_to(&TrialKey::new("v", "other", 0), &mut own);
        assert_eq!(own[0].kind.usage().map(|(u, _)| u.input_tokens), Some(2));
    }
}
