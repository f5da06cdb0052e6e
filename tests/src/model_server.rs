//! A model server on loopback for the `api` client's tests: no model provider is reachable
//! from the machines the tests run on, so this stands in for one. It speaks plain HTTP/1.1,
//! answers each request with the next scripted reply (a status, headers, a JSON body in
//! whichever wire format the test speaks) or with what a test's function makes of the request's
//! body, and records every request it got.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One scripted reply.
#[derive(Debug, Clone)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
}

impl Reply {
    /// A 200 with `body`.
    pub fn ok(body: serde_json::Value) -> Self {
        Reply {
            status: 200,
            headers: Vec::new(),
            body,
        }
    }

    /// A 200 in the `anthropic` wire format whose only content is `text`.
    pub fn anthropic_text(text: &str) -> Self {
        Reply::ok(
            serde_json::json!({"content": [{"type": "text", "text": text}],
                                     "usage": {"input_tokens": 80, "output_tokens": 20}}),
        )
    }

    /// An error `status`, with `headers`.
    pub fn status(status: u16, headers: &[(&str, &str)]) -> Self {
        Reply {
            status,
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: serde_json::json!({"error": {"message": "scripted"}}),
        }
    }
}

/// A request the server got.
#[derive(Debug, Clone)]
pub struct Request {
    pub path: String,
    /// Header names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: serde_json::Value,
    pub at: std::time::Instant,
}

impl Request {
    /// The value of header `name` (lower case), if sent.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// How a server picks its reply: from the request's number (0-based, in order of connection)
/// and its body.
type Respond = dyn Fn(usize, &serde_json::Value) -> Reply + Send + Sync;

/// A running server; its threads end with the test process.
pub struct ModelServer {
    /// The address it listens on (loopback unless started with [`ModelServer::start_on`]).
    pub ip: std::net::IpAddr,
    pub port: u16,
    requests: Arc<Mutex<Vec<Request>>>,
    in_flight: Arc<AtomicUsize>,
    most_in_flight: Arc<AtomicUsize>,
}

impl ModelServer {
    /// Starts a server answering with `script` in order; past its end, every request gets the
    /// last reply again.
    pub fn start(script: Vec<Reply>) -> Self {
        Self::start_slow(script, Duration::ZERO)
    }

    /// [`ModelServer::start`], each reply taking `delay`, requests served concurrently (so
    /// [`ModelServer::most_in_flight`] tells how many callers overlapped).
    pub fn start_slow(script: Vec<Reply>, delay: Duration) -> Self {
        Self::start_on([127, 0, 0, 1].into(), script, delay)
    }

    /// [`ModelServer::start_slow`] listening on `ip` (e.g. a Docker bridge's gateway, which
    /// containers on that bridge reach).
    pub fn start_on(ip: std::net::IpAddr, script: Vec<Reply>, delay: Duration) -> Self {
        Self::serve_with(
            ip,
            Arc::new(move |index, _| script[index.min(script.len() - 1)].clone()),
            delay,
        )
    }

    /// A server answering each request with `respond(body)`: for tests whose replies depend on
    /// what was asked (requests served concurrently arrive in no fixed order).
    pub fn start_with(
        respond: impl Fn(&serde_json::Value) -> Reply + Send + Sync + 'static,
    ) -> Self {
        Self::serve_with(
            [127, 0, 0, 1].into(),
            Arc::new(move |_, body| respond(body)),
            Duration::ZERO,
        )
    }

    fn serve_with(ip: std::net::IpAddr, respond: Arc<Respond>, delay: Duration) -> Self {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = ModelServer {
            ip,
            port,
            requests: Arc::new(Mutex::new(Vec::new())),
            in_flight: Arc::new(AtomicUsize::new(0)),
            most_in_flight: Arc::new(AtomicUsize::new(0)),
        };
        let (seen, in_flight, most) = (
            server.requests.clone(),
            server.in_flight.clone(),
            server.most_in_flight.clone(),
        );
        std::thread::spawn(move || {
            for (index, stream) in listener.incoming().enumerate() {
                let Ok(stream) = stream else { return };
                let (seen, in_flight, most) = (seen.clone(), in_flight.clone(), most.clone());
                let respond = respond.clone();
                std::thread::spawn(move || {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let request = serve(stream, |body| respond(index, body), delay, &in_flight);
                    if let Some(request) = request {
                        seen.lock().unwrap().push(request);
                    }
                });
            }
        });
        server
    }

    /// The most requests that were being answered at once.
    pub fn most_in_flight(&self) -> usize {
        self.most_in_flight.load(Ordering::SeqCst)
    }

    /// `http://IP:PORT`.
    pub fn url(&self) -> String {
        format!(
            "http://{}",
            std::net::SocketAddr::from((self.ip, self.port))
        )
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// Reads one request from `stream` and answers it with `respond(body)` after `delay` (one
/// request per connection). The request stops counting in `in_flight` just before its reply
/// goes out: a caller may start its next call as soon as it has read the reply, before this
/// thread runs again.
fn serve(
    stream: std::net::TcpStream,
    respond: impl FnOnce(&serde_json::Value) -> Reply,
    delay: Duration,
    in_flight: &AtomicUsize,
) -> Option<Request> {
    let request = read_request(&stream);
    let body = request
        .as_ref()
        .map(|r| serde_json::from_slice(&r.body).unwrap_or(serde_json::Value::Null));
    let reply = body.as_ref().map(respond);
    std::thread::sleep(delay);
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let (request, body, reply) = (request?, body?, reply?);
    let mut headers = vec![("Content-Type".to_string(), "application/json".to_string())];
    headers.extend(reply.headers.iter().cloned());
    write_response(
        stream,
        reply.status,
        &headers,
        reply.body.to_string().as_bytes(),
    );
    Some(Request {
        path: request.path,
        headers: request.headers,
        body,
        at: std::time::Instant::now(),
    })
}

/// One HTTP/1.1 request as a test server read it.
#[derive(Debug, Clone)]
pub struct RawRequest {
    pub method: String,
    pub path: String,
    /// Names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

/// Reads one request from `stream` (its `Content-Length` body included); `None` when the
/// client sent no complete request.
pub fn read_request(stream: &std::net::TcpStream) -> Option<RawRequest> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next()?.to_string(), parts.next()?.to_string());
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        reader.read_line(&mut line).ok()?;
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        let (name, value) = line.split_once(':')?;
        headers.push((name.trim().to_lowercase(), value.trim().to_string()));
    }
    let length: usize = headers
        .iter()
        .find(|(k, _)| k == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(RawRequest {
        method,
        path,
        headers,
        body,
    })
}

/// Writes a complete response (`Content-Length` framed, connection closed) to `stream`;
/// a client that went away is not an error.
pub fn write_response(
    mut stream: std::net::TcpStream,
    status: u16,
    headers: &[(String, String)],
    body: &[u8],
) {
    let mut head = format!(
        "HTTP/1.1 {status} Scripted\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    let _ = stream.write_all(head.as_bytes());
    let _ = stream.write_all(body);
}

/// The two answers a pairwise judge's request shows, first then second, as the
/// `mst/grader/pairwise-rubric` plugin lays out its prompt.
pub fn answers_shown(body: &serde_json::Value) -> (String, String) {
    let asked = body["messages"][0]["content"].as_str().unwrap_or_default();
    let (_, answers) = asked.split_once("The first answer:\n").unwrap_or_default();
    let (first, second) = answers
        .split_once("\n\nThe second answer:\n")
        .unwrap_or_default();
    (first.trim().to_string(), second.trim().to_string())
}

/// A pairwise judge (in the `anthropic` wire format) that prefers whichever answer contains
/// `better`, whatever its position, so its verdicts agree across orders.
pub fn judge_preferring(better: &'static str) -> impl Fn(&serde_json::Value) -> Reply {
    move |body| {
        let (first, _) = answers_shown(body);
        let winner = if first.contains(better) {
            "first"
        } else {
            "second"
        };
        Reply::anthropic_text(&format!(
            "{{\"winner\": \"{winner}\", \"confidence\": 0.9, \"reason\": \"it says {better}\"}}"
        ))
    }
}

/// Asserts that `server` saw `cases` pairwise requests in each order of the answers `x` and
/// `y` (as [`answers_shown`] reads them), and no other request.
pub fn assert_both_orders(server: &ModelServer, x: &str, y: &str, cases: usize) {
    let shown: Vec<(String, String)> = server
        .requests()
        .iter()
        .map(|r| answers_shown(&r.body))
        .collect();
    assert_eq!(shown.len(), 2 * cases, "{shown:?}");
    for order in [(x, y), (y, x)] {
        let seen = shown
            .iter()
            .filter(|(first, second)| (first.as_str(), second.as_str()) == order)
            .count();
        assert_eq!(
            seen, cases,
            "each case once in the order {order:?}: {shown:?}"
        );
    }
}
