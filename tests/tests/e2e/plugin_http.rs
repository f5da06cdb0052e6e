//! `http.send` end to end: the `http-grader` fixture component, run by the real `mst`, sends
//! the request its options describe to real HTTP servers on loopback in this process, and
//! reports what it got in its score's reason.

use mst_tests::model_server::{read_request, write_response};
use mst_tests::{fixture, read_json, s, Eval, Mst};
use serde_json::{json, Value};
use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A request a test server got.
#[derive(Debug, Clone)]
struct Seen {
    method: String,
    path: String,
    /// Names lower-cased.
    headers: Vec<(String, String)>,
    body: String,
}

impl Seen {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// What a test server does with a request.
enum Answer {
    /// A complete response: status, headers, body.
    Reply(u16, Vec<(&'static str, String)>, String),
    /// A 200 whose body never ends: written until the client stops reading.
    Endless,
    /// Nothing, for this long.
    Hang(Duration),
}

/// An HTTP/1.1 server on `ip` (any loopback address), one thread per connection.
struct Server {
    ip: &'static str,
    port: u16,
    seen: Arc<Mutex<Vec<Seen>>>,
    /// Bytes of an endless body written before the client stopped reading.
    endless_stopped_after: Arc<Mutex<Option<u64>>>,
}

/// Most an endless body writes before giving up on the client stopping.
const ENDLESS_LIMIT: u64 = 1 << 30;

impl Server {
    fn start(ip: &'static str, answer: impl Fn(&Seen) -> Answer + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind((ip, 0)).unwrap();
        let server = Server {
            ip,
            port: listener.local_addr().unwrap().port(),
            seen: Arc::default(),
            endless_stopped_after: Arc::default(),
        };
        let (seen, stopped) = (server.seen.clone(), server.endless_stopped_after.clone());
        let answer = Arc::new(answer);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                let (seen, stopped, answer) = (seen.clone(), stopped.clone(), answer.clone());
                std::thread::spawn(move || serve(stream, &seen, &stopped, answer.as_ref()));
            }
        });
        server
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}:{}{path}", self.ip, self.port)
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

fn serve(
    stream: TcpStream,
    seen: &Mutex<Vec<Seen>>,
    stopped: &Mutex<Option<u64>>,
    answer: &(dyn Fn(&Seen) -> Answer + Send + Sync),
) {
    let Some(raw) = read_request(&stream) else {
        return;
    };
    let request = Seen {
        method: raw.method,
        path: raw.path,
        headers: raw.headers,
        body: String::from_utf8_lossy(&raw.body).into_owned(),
    };
    seen.lock().unwrap().push(request.clone());
    match answer(&request) {
        Answer::Reply(status, headers, body) => {
            let headers: Vec<(String, String)> = headers
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect();
            write_response(stream, status, &headers, body.as_bytes());
        }
        Answer::Endless => {
            let mut stream = stream;
            let head = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes());
            let chunk = vec![b'x'; 64 << 10];
            let mut written = 0u64;
            while written < ENDLESS_LIMIT && stream.write_all(&chunk).is_ok() {
                written += chunk.len() as u64;
            }
            if written < ENDLESS_LIMIT {
                *stopped.lock().unwrap() = Some(written);
            }
        }
        Answer::Hang(time) => std::thread::sleep(time),
    }
}

/// Runs one trial graded by the `http-grader` fixture with `options`, the fixture granted
/// the hosts `allow`; returns the fixture's reason (parsed), how long the run took and what
/// the run said (its output and `grades.json`).
fn try_grade(options: Value, allow: &[&str], extra: &[&str]) -> (Option<Value>, Duration, String) {
    let grader = fixture("http-grader.wasm");
    let eval = Eval::new(
        json!({"name": "egress", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["echo", "hi"], "input": "none"},
               "plugins": [{"path": s(&grader), "allowHttp": allow}],
               "judges": [{"plugin": "mst/fixture/http-grader", "options": options}],
               "timeout": 60}),
        &[json!({"id": "one", "input": "x"})],
    );
    let started = Instant::now();
    let run = eval.run(&Mst::new(), &[&["--json", "-q"], extra].concat());
    let took = started.elapsed();
    let scores_file = eval
        .run_dir("egress")
        .join("scores/mst%2Ffixture%2Fhttp-grader.json");
    let reason = scores_file.exists().then(|| {
        let scores = read_json(&scores_file);
        let reason = scores[0]["reason"].as_str().unwrap_or_default().to_string();
        serde_json::from_str(&reason).unwrap_or_else(|_| json!({"raw": reason}))
    });
    let grades = eval.run_dir("egress").join("grades.json");
    let grades = std::fs::read_to_string(grades).unwrap_or_default();
    (
        reason,
        took,
        format!("{}\n{}\ngrades: {grades}", run.stdout, run.stderr),
    )
}

/// [`try_grade`] when the fixture must have scored: its reason and how long the run took.
fn grade(options: Value, allow: &[&str], extra: &[&str]) -> (Value, Duration) {
    let (reason, took, output) = try_grade(options, allow, extra);
    (reason.unwrap_or_else(|| panic!("no score: {output}")), took)
}

/// The message of the error the fixture got, asserting its code.
fn error_of(reason: &Value, code: &str) -> String {
    // The fixture writes the WIT error code as Rust's `Debug` spells it.
    assert_eq!(
        reason["error"]["code"],
        format!("ErrorCode::{code}"),
        "{reason}"
    );
    reason["error"]["message"].as_str().unwrap().to_string()
}

#[test]
fn a_granted_host_round_trips_status_headers_and_body() {
    let server = Server::start("127.0.0.1", |seen| {
        Answer::Reply(
            201,
            vec![("x-answer", "42".into())],
            format!(
                "{} {} {}",
                seen.method,
                seen.body,
                seen.header("x-question").unwrap_or("-")
            ),
        )
    });
    let (reason, _) = grade(
        json!({"method": "POST", "url": server.url("/echo?x=1"),
               "headers": [["X-Question", "why"]], "body": "hello"}),
        &["127.0.0.1"],
        &[],
    );
    assert_eq!(reason["status"], 201, "{reason}");
    assert_eq!(reason["body"], "POST hello why", "{reason}");
    let headers = reason["headers"].as_array().unwrap();
    assert!(headers.contains(&json!(["x-answer", "42"])), "{reason}");
    let seen = server.seen();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!(seen[0].path, "/echo?x=1");
}

#[test]
fn an_ungranted_host_is_denied_and_never_contacted() {
    let other = Server::start("127.0.0.2", |_| Answer::Reply(200, vec![], "no".into()));
    // The fixture declares 127.0.0.2; the operator grants only 127.0.0.1.
    let (reason, _) = grade(json!({"url": other.url("/")}), &["127.0.0.1"], &[]);
    let message = error_of(&reason, "Denied");
    assert!(message.contains("--allow-http 127.0.0.2"), "{message}");
    assert!(other.seen().is_empty());
}

#[test]
fn the_plugin_cannot_set_the_host_header() {
    let server = Server::start("127.0.0.1", |_| Answer::Reply(200, vec![], "ok".into()));
    let (reason, _) = grade(
        json!({"url": server.url("/"), "headers": [["Host", "127.0.0.2"]]}),
        &["127.0.0.1"],
        &[],
    );
    let message = error_of(&reason, "InvalidInput");
    assert!(
        message.contains("header `host` is set by the host"),
        "{message}"
    );
    assert!(server.seen().is_empty());
}

#[test]
fn a_redirect_to_another_host_is_returned_to_the_plugin_not_followed() {
    let other = Server::start("127.0.0.2", |_| Answer::Reply(200, vec![], "stolen".into()));
    let target = other.url("/collect");
    let server = Server::start("127.0.0.1", move |_| {
        Answer::Reply(302, vec![("location", target.clone())], String::new())
    });
    // Even with the other host granted too: a redirect never leaves the request's host.
    let (reason, _) = grade(
        json!({"url": server.url("/start"), "headers": [["Authorization", "Bearer t"]]}),
        &["127.0.0.1", "127.0.0.2"],
        &[],
    );
    assert_eq!(reason["status"], 302, "{reason}");
    let location = json!(["location", other.url("/collect")]);
    assert!(
        reason["headers"].as_array().unwrap().contains(&location),
        "{reason}"
    );
    assert!(other.seen().is_empty(), "{:?}", other.seen());
}

#[test]
fn a_redirect_on_the_same_host_is_followed() {
    let server = Server::start("127.0.0.1", |seen| match seen.path.as_str() {
        "/start" => Answer::Reply(307, vec![("location", "/final".into())], String::new()),
        _ => Answer::Reply(200, vec![], format!("arrived with {}", seen.body)),
    });
    let (reason, _) = grade(
        json!({"method": "PUT", "url": server.url("/start"), "body": "cargo"}),
        &["127.0.0.1"],
        &[],
    );
    assert_eq!(reason["status"], 200, "{reason}");
    assert_eq!(reason["body"], "arrived with cargo", "{reason}");
    let paths: Vec<String> = server.seen().into_iter().map(|s| s.path).collect();
    assert_eq!(paths, ["/start", "/final"]);
}

#[test]
fn an_endless_body_is_an_error_naming_the_cap_and_reading_stops_there() {
    let server = Server::start("127.0.0.1", |_| Answer::Endless);
    let (reason, _) = grade(json!({"url": server.url("/")}), &["127.0.0.1"], &[]);
    let message = error_of(&reason, "Unavailable");
    assert!(message.contains("16777216-byte cap"), "{message}");
    // The host dropped the connection near the cap rather than reading the gigabyte on offer.
    let deadline = Instant::now() + Duration::from_secs(10);
    let written = loop {
        if let Some(written) = *server.endless_stopped_after.lock().unwrap() {
            break written;
        }
        assert!(
            Instant::now() < deadline,
            "the server never saw the client stop"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("an endless body under a 16 MiB cap: the server wrote {written} bytes");
    assert!(written < 64 << 20, "{written} bytes were taken");
}

#[test]
fn loopback_is_reached_only_through_a_grant_naming_the_address() {
    let server = Server::start("127.0.0.1", |_| Answer::Reply(200, vec![], "here".into()));
    // `localhost` resolves to loopback, but the grant names a name, not the address.
    let by_name = format!("http://localhost:{}/", server.port);
    let (reason, _) = grade(json!({"url": by_name}), &["localhost"], &[]);
    let message = error_of(&reason, "Denied");
    assert!(
        message.contains("`localhost` refused: it resolves to")
            && message.contains("a loopback address"),
        "{message}"
    );
    assert!(message.contains("mst/fixture/http-grader"), "{message}");
    assert!(server.seen().is_empty());
    // The grant naming the address reaches it.
    let (reason, _) = grade(json!({"url": server.url("/")}), &["127.0.0.1"], &[]);
    assert_eq!(reason["body"], "here", "{reason}");
}

#[test]
fn a_request_lasts_no_longer_than_its_timeout_or_the_calls_time_limit() {
    let server = Server::start("127.0.0.1", |_| Answer::Hang(Duration::from_secs(60)));
    let (reason, took) = grade(
        json!({"url": server.url("/"), "timeoutMs": 500}),
        &["127.0.0.1"],
        &[],
    );
    let message = error_of(&reason, "Unavailable");
    assert!(message.contains("within 500 ms"), "{message}");
    eprintln!("a 60 s hang under a 500 ms request timeout: mst took {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    // No timeout of its own: the call's 2 s limit ends it, not the server's minute.
    let (reason, took, output) = try_grade(
        json!({"url": server.url("/"), "timeoutMs": 0}),
        &["127.0.0.1"],
        &["--plugin-timeout", "2"],
    );
    eprintln!("a 60 s hang under a 2 s call limit: mst took {took:?}");
    assert!(took < Duration::from_secs(20), "{took:?}");
    match reason {
        // The request gave up at the deadline and the fixture still got to answer.
        Some(reason) => assert!(
            error_of(&reason, "Unavailable").contains("no complete response within"),
            "{reason}"
        ),
        // The request gave up at the deadline and the call was stopped there.
        None => assert!(
            output.contains("was stopped after its time limit of 2.0s"),
            "{output}"
        ),
    }
}

#[test]
fn errors_name_the_url_without_its_query() {
    const KEY: &str = "query-canary-2e7c";
    // Nothing listens on the port: the connection is refused.
    let port = mst_tests::free_port();
    let url = format!("http://127.0.0.1:{port}/v1?key={KEY}");
    let (reason, _) = grade(json!({"url": url}), &["127.0.0.1"], &[]);
    let message = error_of(&reason, "Unavailable");
    assert!(
        message.contains(&format!("http://127.0.0.1:{port}/v1")),
        "{message}"
    );
    assert!(!message.contains(KEY), "{message}");
}
