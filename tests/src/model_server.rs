//! A model server on loopback for the `api` client's tests: no model provider is reachable
//! from the machines the tests run on, so this stands in for one. It speaks plain HTTP/1.1,
//! answers each request with the next scripted reply (a status, headers, a JSON body in
//! whichever wire format the test speaks), and records every request it got.

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

/// A running server; its threads end with the test process.
pub struct ModelServer {
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
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = ModelServer {
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
                let reply = script[index.min(script.len() - 1)].clone();
                let (seen, in_flight, most) = (seen.clone(), in_flight.clone(), most.clone());
                std::thread::spawn(move || {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    let request = serve(stream, &reply, delay, &in_flight);
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

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Every request so far, in order.
    pub fn requests(&self) -> Vec<Request> {
        self.requests.lock().unwrap().clone()
    }
}

/// Reads one request from `stream` and answers it with `reply` after `delay` (one request per
/// connection). The request stops counting in `in_flight` just before its reply goes out: a
/// caller may start its next call as soon as it has read the reply, before this thread runs
/// again.
fn serve(
    stream: std::net::TcpStream,
    reply: &Reply,
    delay: Duration,
    in_flight: &AtomicUsize,
) -> Option<Request> {
    let request = read_request(&stream);
    std::thread::sleep(delay);
    in_flight.fetch_sub(1, Ordering::SeqCst);
    let (path, headers, body) = request?;
    let text = reply.body.to_string();
    let mut response = format!(
        "HTTP/1.1 {} Scripted\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        reply.status,
        text.len()
    );
    for (name, value) in &reply.headers {
        response.push_str(&format!("{name}: {value}\r\n"));
    }
    response.push_str("\r\n");
    response.push_str(&text);
    let mut stream = stream;
    let _ = stream.write_all(response.as_bytes());
    Some(Request {
        path,
        headers,
        body: serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        at: std::time::Instant::now(),
    })
}

/// The request line's path, the headers (names lower-cased) and the body of one request.
type RawRequest = (String, Vec<(String, String)>, Vec<u8>);

/// Reads one request from `stream`.
fn read_request(stream: &std::net::TcpStream) -> Option<RawRequest> {
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let path = line.split_whitespace().nth(1)?.to_string();
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
    Some((path, headers, body))
}
