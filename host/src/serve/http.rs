//! The HTTP side of `mst serve` (axum): the API under `/api/v1/` (the playground's sessions, the
//! stored runs, live runs), JSON in and out, every error a JSON `{"error": …}` with the status
//! that fits; and the web UI at `/`, pages embedded in the binary that call that API. Bodies
//! are capped and strictly parsed (an unknown field is a 400 naming it); with an access token
//! every API request must carry it (the UI's pages hold no data and are served without it); no
//! CORS headers are sent, so browsers on other origins cannot call it.

use super::batch_runs::{BatchRuns, StartRun};
use super::{CreateSession, ExportCase, Playground, ServeError, SubmitTask};
use crate::results::ResultsRoot;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use serde::Serialize;
use std::sync::Arc;

/// The largest request body taken.
pub const MAX_BODY: usize = 256 * 1024;

/// What a server serves: the playground (absent under `mst run --serve`, which follows one run),
/// the live runs, and the stored runs.
pub struct Served {
    pub playground: Option<Arc<Playground>>,
    pub live: Arc<BatchRuns>,
    pub results: ResultsRoot,
}

/// What every handler shares.
struct Api {
    served: Served,
    /// Required as `Authorization: Bearer TOKEN` when set.
    token: Option<String>,
}

type Shared = State<Arc<Api>>;

impl Api {
    fn playground(&self) -> Result<Arc<Playground>, ServeError> {
        self.served.playground.clone().ok_or_else(|| {
            ServeError::not_found(
                "this server follows one run (`mst run --serve`) and has no playground; start                  `mst serve` for sessions",
            )
        })
    }
}

/// The routes of `served`; with `token`, every API request must carry it.
pub fn router(served: Served, token: Option<String>) -> Router {
    let api = Arc::new(Api { served, token });
    Router::new()
        .route("/", get(|| async { super::ui::page() }))
        .route("/ui/{asset}", get(super::ui::asset))
        .route("/api/v1/info", get(info))
        .route("/api/v1/sessions", post(create).get(list))
        .route("/api/v1/sessions/{id}", get(show).delete(close))
        .route("/api/v1/sessions/{id}/tasks", post(submit))
        .route("/api/v1/sessions/{id}/tasks/{task}/trace", get(trace))
        .route("/api/v1/sessions/{id}/tasks/{task}/abort", post(abort))
        .route("/api/v1/sessions/{id}/export", post(export))
        .route("/api/v1/runs", get(runs).post(start_run))
        .route("/api/v1/runs/{id}", get(run_view))
        .route("/api/v1/runs/{id}/live", get(live_run))
        .route("/api/v1/runs/{id}/trials/{index}", get(run_trial))
        .fallback(unknown_route)
        .layer(axum::middleware::from_fn_with_state(api.clone(), authorize))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(api)
}

/// A JSON response; the text passes through the secret redactor like everything mst prints.
fn json(status: StatusCode, value: &impl Serialize) -> Response {
    let body = super::redacted_json(value);
    (status, [(header::CONTENT_TYPE, "application/json")], body).into_response()
}

impl IntoResponse for ServeError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        json(status, &serde_json::json!({"error": self.message}))
    }
}

/// A new access token for a server that was given none: 32 random bytes, hex.
pub fn new_access_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the system's random source");
    hex::encode(bytes)
}

/// Checks the access token, in constant time.
async fn authorize(
    State(api): Shared,
    headers: HeaderMap,
    request: Request,
    next: Next,
) -> Response {
    if let Err(refused) = from_a_page_elsewhere(&headers, request.method(), api.token.is_some()) {
        return refused.into_response();
    }
    let page = !request.uri().path().starts_with("/api/");
    if let Some(token) = api.token.as_ref().filter(|_| !page) {
        let given = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        let same: bool = subtle::ConstantTimeEq::ct_eq(given.as_bytes(), token.as_bytes()).into();
        if !same {
            return ServeError {
                status: 401,
                message: "this mst serve needs its access token: send `Authorization: Bearer \
                          TOKEN` (the token in the URL it printed, or in its --token-file)"
                    .into(),
            }
            .into_response();
        }
    }
    next.run(request).await
}

/// Refuses what a web page on another site could make a browser send. A `POST` must say
/// `Content-Type: application/json`: a browser sends that cross-origin only after a preflight,
/// which fails here (no CORS headers), so a page cannot start sessions or tasks with a plain
/// form or `fetch`. Without a token (loopback), the `Host` must be a loopback name or address,
/// so a page whose domain re-resolves to 127.0.0.1 (DNS rebinding) is refused too.
fn from_a_page_elsewhere(
    headers: &HeaderMap,
    method: &axum::http::Method,
    has_token: bool,
) -> Result<(), ServeError> {
    if method == axum::http::Method::POST {
        let json = headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.split(';').next())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("application/json"));
        if !json {
            return Err(ServeError {
                status: 415,
                message: "send the body as JSON with `Content-Type: application/json`".into(),
            });
        }
    }
    if !has_token {
        let host = headers
            .get(header::HOST)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        let name = match host.strip_prefix('[') {
            Some(rest) => rest.split(']').next().unwrap_or(""),
            None => host.rsplit_once(':').map_or(host, |(name, _)| name),
        };
        let loopback = name.eq_ignore_ascii_case("localhost")
            || name
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback());
        if !loopback {
            return Err(ServeError {
                status: 403,
                message: format!(
                    "Host {host:?} is not a loopback name: without --token-file this mst serve \
                     answers only requests to localhost or a loopback address"
                ),
            });
        }
    }
    Ok(())
}

/// Parses a JSON body strictly; an empty body is `{}` for requests whose fields are optional.
fn body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    what: &str,
) -> Result<T, ServeError> {
    let bytes = body.map_err(|e| ServeError {
        status: e.status().as_u16(),
        message: match e.status() {
            StatusCode::PAYLOAD_TOO_LARGE => format!("the {what} body is over {MAX_BODY} bytes"),
            _ => format!("cannot read the {what} body: {e}"),
        },
    })?;
    let bytes: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}"
    } else {
        &bytes
    };
    serde_json::from_slice(bytes)
        .map_err(|e| ServeError::bad_request(format!("the {what} body is not valid: {e}")))
}

/// Runs blocking playground work (booting, closing) off the async workers.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, ServeError> + Send + 'static,
) -> Result<T, ServeError> {
    tokio::task::spawn_blocking(work).await.unwrap_or_else(|e| {
        Err(ServeError {
            status: 500,
            message: format!("the request failed: {e}"),
        })
    })
}

async fn create(
    State(api): Shared,
    request: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: CreateSession = body(request, "session")?;
    let playground = api.playground()?;
    let view = blocking(move || playground.create_session(request)).await?;
    Ok(json(StatusCode::CREATED, &view))
}

async fn list(State(api): Shared) -> Result<Response, ServeError> {
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({"sessions": api.playground()?.list()}),
    ))
}

async fn show(State(api): Shared, Path(id): Path<String>) -> Result<Response, ServeError> {
    Ok(json(StatusCode::OK, &api.playground()?.get(&id)?))
}

async fn close(State(api): Shared, Path(id): Path<String>) -> Result<Response, ServeError> {
    let playground = api.playground()?;
    let view = blocking(move || playground.close(&id)).await?;
    Ok(json(StatusCode::OK, &view))
}

async fn submit(
    State(api): Shared,
    Path(id): Path<String>,
    request: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: SubmitTask = body(request, "task")?;
    Ok(json(
        StatusCode::ACCEPTED,
        &api.playground()?.submit(&id, request)?,
    ))
}

async fn export(
    State(api): Shared,
    Path(id): Path<String>,
    request: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: ExportCase = body(request, "export")?;
    let playground = api.playground()?;
    let exported = blocking(move || playground.export(&id, request)).await?;
    Ok(json(StatusCode::CREATED, &exported))
}

async fn abort(
    State(api): Shared,
    Path((id, task)): Path<(String, String)>,
) -> Result<Response, ServeError> {
    Ok(json(
        StatusCode::ACCEPTED,
        &api.playground()?.abort(&id, &task)?,
    ))
}

async fn trace(
    State(api): Shared,
    Path((id, task)): Path<(String, String)>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Result<Response, ServeError> {
    let since = since_param(query.as_deref())?;
    let playground = api.playground()?;
    let page = playground.trace(&id, &task, since)?;
    let wants_stream = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"));
    if !wants_stream {
        return Ok(json(StatusCode::OK, &page));
    }
    // Server-sent events: a reconnecting client's `Last-Event-ID` wins over `since`.
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map(|seq| seq + 1);
    let since = resume.or(since).unwrap_or(0);
    Ok(event_stream(playground, id, task, since).into_response())
}

/// How often a server-sent event stream looks for new events.
const STREAM_POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// One server-sent event.
type SseEvent = Result<axum::response::sse::Event, std::convert::Infallible>;

/// The trace as server-sent events from `since`: one `event` per trace event (its `id` the
/// event's `seq`, its data the event's JSON), then one `done` with the settled status (or one
/// `error`).
fn event_stream(
    playground: Arc<Playground>,
    session: String,
    task: String,
    since: u64,
) -> axum::response::sse::Sse<impl futures_util::Stream<Item = SseEvent>> {
    use axum::response::sse::{Event, KeepAlive, Sse};
    let pages = futures_util::stream::unfold(Some(since), move |next| {
        let (playground, session, task) = (playground.clone(), session.clone(), task.clone());
        async move {
            let mut next = next?;
            loop {
                let page = match playground.trace(&session, &task, Some(next)) {
                    Ok(page) => page,
                    Err(e) => {
                        let error = serde_json::json!({"error": e.message}).to_string();
                        let event = Event::default()
                            .event("error")
                            .data(crate::secrets::clean_text(&error));
                        return Some((vec![event], None));
                    }
                };
                let mut events: Vec<Event> = page
                    .events
                    .iter()
                    .map(|e| {
                        let data = serde_json::to_string(e).unwrap_or_default();
                        Event::default()
                            .event("event")
                            .id(e.seq.to_string())
                            .data(crate::secrets::clean_text(&data))
                    })
                    .collect();
                next = page.next;
                if page.done {
                    let end = serde_json::json!({"status": page.status, "next": page.next});
                    events.push(Event::default().event("done").data(end.to_string()));
                    return Some((events, None));
                }
                if !events.is_empty() {
                    return Some((events, Some(next)));
                }
                tokio::time::sleep(STREAM_POLL).await;
            }
        }
    });
    let events = futures_util::StreamExt::flat_map(pages, |batch| {
        futures_util::stream::iter(batch.into_iter().map(Ok))
    });
    Sse::new(events).keep_alive(KeepAlive::default())
}

async fn unknown_route() -> ServeError {
    ServeError::not_found(
        "no such route: the API is /api/v1/sessions… and /api/v1/runs… (see docs/serve.md), the \
         web UI is at /",
    )
}

/// `GET /api/v1/info`: what this server serves, for the UI.
async fn info(State(api): Shared) -> Response {
    let playground = api.served.playground.as_ref().map(|p| p.info());
    json(
        StatusCode::OK,
        &serde_json::json!({
            "playground": playground,
            "canStartRuns": api.served.live.can_start(),
        }),
    )
}

/// `GET /api/v1/runs`: the stored runs and sessions (newest first), and the live runs.
async fn runs(State(api): Shared) -> Result<Response, ServeError> {
    let root = api.served.results.clone();
    let mut stored = blocking(move || Ok(root.list())).await?;
    // Each eval's pass rate over its runs, drawn here as SVG (oldest first).
    let trends: Vec<serde_json::Value> = crate::view::charts::trends(&stored)
        .into_iter()
        .map(|(eval, svg)| serde_json::json!({"eval": eval, "svg": svg}))
        .collect();
    stored.reverse();
    Ok(json(
        StatusCode::OK,
        &serde_json::json!({"runs": stored, "live": api.served.live.list(), "trends": trends}),
    ))
}

/// `POST /api/v1/runs`: starts a batch run of the served eval; 202 once it is prepared.
async fn start_run(
    State(api): Shared,
    request: Result<Bytes, BytesRejection>,
) -> Result<Response, ServeError> {
    let request: StartRun = body(request, "run")?;
    let live = api.served.live.clone();
    let state = blocking(move || live.start(request)).await?;
    Ok(json(StatusCode::ACCEPTED, &state))
}

/// `GET /api/v1/runs/{id}/live?since=N`: a live run's progress, its finished trials from `since`.
async fn live_run(
    State(api): Shared,
    Path(id): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ServeError> {
    let since = since_param(query.as_deref())?.unwrap_or(0);
    let run = api.served.live.get(&id).ok_or_else(|| {
        ServeError::not_found(format!(
            "run `{id}` is not live here: `GET /api/v1/runs/{id}` shows it once stored"
        ))
    })?;
    Ok(json(StatusCode::OK, &run.snapshot(since as usize)))
}

/// The stored run `id`, read whole for a view.
async fn loaded(api: &Api, id: String) -> Result<Arc<crate::view::LoadedRun>, ServeError> {
    let root = api.served.results.clone();
    blocking(move || {
        let dir = root
            .find(&id)
            .map_err(|e| ServeError::not_found(format!("{e:#}")))?;
        crate::view::LoadedRun::read(&dir)
            .map(Arc::new)
            .map_err(|e| ServeError::conflict(format!("{e:#}")))
    })
    .await
}

/// `GET /api/v1/runs/{id}`: the run as the report shows it (`mst.view/v1`).
async fn run_view(State(api): Shared, Path(id): Path<String>) -> Result<Response, ServeError> {
    let run = loaded(&api, id).await?;
    Ok(json(StatusCode::OK, &run.view()))
}

/// `GET /api/v1/runs/{id}/trials/{index}`: the trace of the run's `index`th planned trial (read
/// alone: opening one trial of a large run reads one file).
async fn run_trial(
    State(api): Shared,
    Path((id, index)): Path<(String, usize)>,
) -> Result<Response, ServeError> {
    let root = api.served.results.clone();
    let trace = blocking(move || {
        let dir = root
            .find(&id)
            .map_err(|e| ServeError::not_found(format!("{e:#}")))?;
        let record = dir
            .read_record()
            .map_err(|e| ServeError::conflict(format!("{e:#}")))?;
        record
            .trials
            .get(index)
            .and_then(|key| dir.traces_dir(&record.run_id).read_trace(&key))
            .ok_or_else(|| {
                ServeError::not_found(format!("run `{id}` has no trace for trial {index}"))
            })
    })
    .await?;
    Ok(json(StatusCode::OK, &trace))
}

/// The query's `since=N`, the only parameter a cursor-paged endpoint takes.
fn since_param(query: Option<&str>) -> Result<Option<u64>, ServeError> {
    let mut since = None;
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("since", value)) => {
                since = Some(value.parse::<u64>().map_err(|_| {
                    ServeError::bad_request(format!(
                        "`since` must be a number (0 or more), not {value:?}"
                    ))
                })?)
            }
            _ => {
                return Err(ServeError::bad_request(format!(
                    "unknown query parameter {pair:?}: this takes only `since=N`"
                )))
            }
        }
    }
    Ok(since)
}
