//! The model gateway a worker serves on its machine's loopback (inside the container on
//! Docker, so a machine with no network still reaches its models): the agents of the trials
//! whose client calls models through it (`claude-code`, `codex`, a `command` client with
//! `modelGateway`) send their model calls here, in the wire format they speak (the Anthropic
//! Messages API, the OpenAI Responses API or Chat Completions; `llm::wire`), with the token
//! the coordinator minted for their trial. The gateway turns each call into mst's one request
//! shape and sends it to the coordinator (`model-call` parts), which calls the variant's
//! model with the key only it holds; the answer (`model-reply` parts) goes back to the agent
//! in its own format, streamed as server-sent events when it asked for them.
//!
//! A token is valid while its trial runs: the worker admits it when the trial is granted and
//! dismisses it when the trial ends, and the coordinator checks it again. The agent never
//! sees a provider's key, and the model it gets is the variant's, whatever it asks for.

use super::protocol::{ModelAnswer, ModelPart, ModelParts, WorkerMessage, MAX_MODEL_CALL_BYTES};
use crate::client::GatewayAccess;
use crate::eval::trial::TrialKey;
use crate::llm::wire::{Rendered, Wire};
use crate::secrets::Secret;
use anyhow::{Context, Result};
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Router;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a call waits for the coordinator's answer: longer than any model takes, shorter
/// than forever (the trial's own deadline usually ends it first).
const ANSWER_WAIT: Duration = Duration::from_secs(15 * 60);

/// The longest plugin name a call's [`crate::llm::http::PLUGIN_HEADER`] is read to.
const MAX_PLUGIN_LABEL: usize = 256;

/// Sends a worker message on the protocol's stdout.
pub type Send = Arc<dyn Fn(&WorkerMessage) + std::marker::Send + Sync>;

/// A call waiting for its answer: the parts that came so far, and who waits.
struct Waiting {
    parts: ModelParts,
    answer: tokio::sync::oneshot::Sender<ModelAnswer>,
}

/// A running trial the gateway serves.
struct Admitted {
    key: TrialKey,
    /// The tokens its calls used so far (its agent's [`GatewayAccess::used`]).
    used: Arc<AtomicU64>,
    /// The most it may use; past it, its calls are refused.
    budget: Option<u64>,
}

/// What the server's handlers share with the worker.
struct Shared {
    /// The running trials, by their tokens.
    trials: Mutex<HashMap<String, Admitted>>,
    /// Calls waiting for their answers, by trial and call number.
    waiting: Mutex<HashMap<(TrialKey, u32), Waiting>>,
    next_call: AtomicU32,
    send: Send,
}

/// The gateway of one worker: an HTTP server on `127.0.0.1`, on a thread of its own.
pub struct Gateway {
    url: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Gateway {
    /// Starts the server on a free loopback port; `send` writes protocol messages.
    pub fn start(send: Send) -> Result<Gateway> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")
            .context("cannot listen on 127.0.0.1 for the model gateway")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let shared = Arc::new(Shared {
            trials: Mutex::new(HashMap::new()),
            waiting: Mutex::new(HashMap::new()),
            next_call: AtomicU32::new(0),
            send,
        });
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let router = Router::new()
            .fallback(serve_call)
            .layer(DefaultBodyLimit::max(MAX_MODEL_CALL_BYTES))
            .with_state(shared.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        std::thread::Builder::new()
            .name("mst-gateway".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    let _ = axum::serve(listener, router)
                        .with_graceful_shutdown(async {
                            let _ = stopped.await;
                        })
                        .await;
                });
            })?;
        Ok(Gateway {
            url,
            shared,
            stop: Some(stop),
        })
    }

    /// Lets `key`'s trial call models with `token` until its calls used `budget` tokens;
    /// what its agent is given.
    pub fn admit(&self, key: &TrialKey, token: Secret, budget: Option<u64>) -> GatewayAccess {
        let used = Arc::new(AtomicU64::new(0));
        let mut trials = self.shared.trials.lock().expect("gateway trials");
        let admitted = Admitted {
            key: key.clone(),
            used: used.clone(),
            budget,
        };
        trials.insert(token.expose().to_string(), admitted);
        GatewayAccess {
            url: self.url.clone(),
            token,
            used,
        }
    }

    /// `key`'s trial ended: its token is refused from now on, and its calls still waiting
    /// are dropped (their agents get an error, if they still listen).
    pub fn dismiss(&self, key: &TrialKey) {
        let mut trials = self.shared.trials.lock().expect("gateway trials");
        trials.retain(|_, admitted| admitted.key != *key);
        let mut waiting = self.shared.waiting.lock().expect("gateway waiting");
        waiting.retain(|(k, _), _| k != key);
    }

    /// A part of the answer to call `call` of `key`'s trial: the waiting call gets the
    /// answer once its last part came. `Err` is a broken answer (the coordinator's doing).
    pub fn on_reply(&self, key: TrialKey, call: u32, part: ModelPart) -> Result<(), String> {
        let mut waiting = self.shared.waiting.lock().expect("gateway waiting");
        let id = (key, call);
        let Some(entry) = waiting.get_mut(&id) else {
            return Ok(()); // its trial ended, or its agent went away
        };
        let Some(json) = entry.parts.add(part)? else {
            return Ok(());
        };
        let entry = waiting.remove(&id).expect("present");
        let answer: ModelAnswer = serde_json::from_str(&json)
            .map_err(|e| format!("a model answer that does not read: {e}"))?;
        // Counted before the agent has the answer, so its budget holds for its next step.
        if let Some(reply) = &answer.reply {
            let tokens = reply
                .usage
                .input_tokens
                .saturating_add(reply.usage.output_tokens);
            let trials = self.shared.trials.lock().expect("gateway trials");
            if let Some(admitted) = trials.values().find(|admitted| admitted.key == id.0) {
                admitted.used.fetch_add(tokens, Ordering::Relaxed);
            }
        }
        let _ = entry.answer.send(answer);
        Ok(())
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// The token an agent presented: `x-api-key` (Anthropic) or `Authorization: Bearer`
/// (OpenAI).
fn presented_token(headers: &HeaderMap) -> Option<String> {
    if let Some(key) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(key.trim().to_string());
    }
    let auth = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    auth.strip_prefix("Bearer ")
        .map(|token| token.trim().to_string())
}

/// Serves one call: the format from the path, the trial from the token, the request read,
/// sent to the coordinator in parts, and its answer rendered in the agent's format.
async fn serve_call(
    State(shared): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(wire) = Wire::for_path(uri.path()) else {
        return (StatusCode::NOT_FOUND, "not a model API this gateway serves").into_response();
    };
    let token = presented_token(&headers);
    let admitted = token.as_ref().and_then(|t| {
        let trials = shared.trials.lock().expect("gateway trials");
        let admitted = trials.get(t)?;
        let used = admitted.used.load(Ordering::Relaxed);
        Some((
            admitted.key.clone(),
            admitted.budget.filter(|b| used > *b).map(|b| (used, b)),
        ))
    });
    let (Some((key, past_budget)), Some(token)) = (admitted, token) else {
        let message =
            "a gateway token of a running trial is needed (x-api-key, or Authorization: Bearer)";
        return respond(wire.render_error(401, message), StatusCode::UNAUTHORIZED);
    };
    if let Some((used, budget)) = past_budget {
        let message = format!(
            "trial {key} is past its token budget: its model calls used {used} tokens, over \
             the {budget} it may use"
        );
        return respond(
            wire.render_error(429, &message),
            StatusCode::TOO_MANY_REQUESTS,
        );
    }
    let mut request = match wire.parse_request(&body) {
        Ok(request) => request,
        Err(e) => return respond(wire.render_error(400, &e.0), StatusCode::BAD_REQUEST),
    };
    // A grader plugin's call on a grade machine says whose it is; the coordinator checks it.
    request.plugin = headers
        .get(crate::llm::http::PLUGIN_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(|plugin| crate::client::agent_cli::capped(plugin, MAX_PLUGIN_LABEL));
    let answer = match ask(&shared, &key, Secret::new(token), &request).await {
        Ok(answer) => answer,
        Err(why) => {
            return respond(wire.render_error(502, &why), StatusCode::BAD_GATEWAY);
        }
    };
    match (answer.reply, answer.refused) {
        (Some(reply), _) => respond(wire.render(&reply, &request), StatusCode::OK),
        (None, Some(refused)) => {
            let status = StatusCode::from_u16(refused.status).unwrap_or(StatusCode::BAD_GATEWAY);
            respond(wire.render_error(refused.status, &refused.message), status)
        }
        (None, None) => respond(wire.render_error(502, "no answer"), StatusCode::BAD_GATEWAY),
    }
}

/// Sends `request` for `key`'s trial to the coordinator and waits for the answer.
async fn ask(
    shared: &Shared,
    key: &TrialKey,
    token: Secret,
    request: &crate::llm::wire::GatewayRequest,
) -> Result<ModelAnswer, String> {
    let json = serde_json::to_string(request).map_err(|e| e.to_string())?;
    let call = shared.next_call.fetch_add(1, Ordering::Relaxed);
    let (answer, answered) = tokio::sync::oneshot::channel();
    shared.waiting.lock().expect("gateway waiting").insert(
        (key.clone(), call),
        Waiting {
            parts: ModelParts::default(),
            answer,
        },
    );
    for part in ModelPart::split(&json) {
        (shared.send)(&WorkerMessage::ModelCall {
            key: key.clone(),
            call,
            token: token.clone(),
            part,
        });
    }
    match tokio::time::timeout(ANSWER_WAIT, answered).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(_)) => Err("the trial ended before its model call was answered".into()),
        Err(_) => {
            shared
                .waiting
                .lock()
                .expect("gateway waiting")
                .remove(&(key.clone(), call));
            Err(format!(
                "no answer from the coordinator in {}s",
                ANSWER_WAIT.as_secs()
            ))
        }
    }
}

/// `rendered` as an HTTP response with `status`.
fn respond(rendered: Rendered, status: StatusCode) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, rendered.content_type)],
        rendered.body,
    )
        .into_response()
}
