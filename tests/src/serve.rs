//! A running `mst serve` on a loopback port, and calls to its API with the real `curl`.

use crate::{s, Eval, Mst};
use serde_json::Value;
use std::io::{BufRead, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The playground tests' eval `play`: its baseline variant `agent` runs `script` (sh) as a
/// command agent whose stdout lines that are JSON trace events become events, with
/// `secret_env` (variable → secret name); a second variant `direct` runs the `mcp` client on
/// the real `mcp-server-time`; one judge, `contains "hello"`.
pub fn agent_eval(script: &str, secret_env: Value) -> Eval {
    Eval::new(
        serde_json::json!({"name": "play", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", script], "events": true, "secretEnv": secret_env},
               "servers": {"time": {"command": "python3", "args": ["-m", "mcp_server_time"]}},
               "variants": {"agent": {"servers": []},
                            "direct": {"client": "mcp", "clientOptions": {}, "servers": ["time"]}},
               "judges": [{"assert": "contains", "value": "hello"}],
               "baseline": "agent", "timeout": 60}),
        &[serde_json::json!({"id": "unused", "input": "x"})],
    )
}

/// A shell line printing the JSON event `step N` for each N in `range`.
pub fn steps(range: std::ops::Range<u32>) -> String {
    format!(
        r#"for i in {}; do echo '{{"type":"message","role":"assistant","text":"step '$i'"}}'; sleep 0.02; done"#,
        range.map(|n| n.to_string()).collect::<Vec<_>>().join(" ")
    )
}

/// An agent script that prints the events `before`, waits until file `gate` exists, prints the
/// events `after`, then echoes its input: a task the test holds open as long as it likes.
pub fn gated_agent(
    gate: &Path,
    before: std::ops::Range<u32>,
    after: std::ops::Range<u32>,
) -> String {
    format!(
        "{}; while [ ! -f {gate} ]; do sleep 0.05; done; {}; cat",
        steps(before),
        steps(after),
        gate = s(gate)
    )
}

/// When [`Serve::follow`] may stop: a test of the events gathered so far.
pub type Reached = dyn Fn(&[Value]) -> bool;

/// `mst serve` started for a test; stopped (SIGTERM, then waited for) when dropped.
pub struct Serve {
    pub child: Child,
    /// Kept open: mst serve's stdout (a closed pipe would end it at its next line).
    _stdout: std::io::BufReader<std::process::ChildStdout>,
    /// Where its stderr goes (a pipe nobody reads could fill and stall it).
    stderr: tempfile::NamedTempFile,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// The access token it made and printed (none with `--token-file` or `--no-token`).
    pub token: Option<String>,
    /// Extra headers for every call (its access token).
    pub headers: Vec<String>,
}

impl Serve {
    /// Starts `mst serve --config CONFIG --listen 127.0.0.1:0 --results-dir RESULTS EXTRA…` and
    /// waits for the line that says where it listens.
    pub fn start(mst: &Mst, config: &Path, results: &Path, extra: &[&str]) -> Serve {
        Self::start_with_env(mst, config, results, extra, &[])
    }

    /// As [`Serve::start`], with `env` set for mst serve (e.g. its `TMPDIR`, where the local
    /// runner makes machines).
    pub fn start_with_env(
        mst: &Mst,
        config: &Path,
        results: &Path,
        extra: &[&str],
        env: &[(&str, &Path)],
    ) -> Serve {
        let mut args = vec!["serve", "--config", s(config), "--results-dir", s(results)];
        if !extra.contains(&"--listen") {
            args.extend(["--listen", "127.0.0.1:0"]);
        }
        args.extend(extra);
        let stderr = tempfile::NamedTempFile::new().expect("a temp file");
        let mut child = mst
            .command(&args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(stderr.reopen().expect("reopen the temp file"))
            .spawn()
            .expect("start mst serve");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .expect("read mst serve's first line");
        let Some(rest) = line.trim().strip_prefix("mst serve: listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "mst serve did not start: {line}\n{}",
                std::fs::read_to_string(stderr.path()).unwrap_or_default()
            );
        };
        let (url, token) = match rest.split_once("/#token=") {
            Some((url, token)) => (url, Some(token.to_string())),
            None => (rest, None),
        };
        let headers = (token.iter())
            .map(|token| format!("authorization: Bearer {token}"))
            .collect();
        Serve {
            child,
            _stdout: stdout,
            stderr,
            base: url.trim_end_matches('/').to_string(),
            token,
            headers,
        }
    }

    /// The web UI's page for `route` (`/runs`), handing it the token it printed.
    pub fn page(&self, route: &str) -> String {
        match &self.token {
            Some(token) => format!("{}/#{route}&token={token}", self.base),
            None => format!("{}/#{route}", self.base),
        }
    }

    /// `METHOD PATH` with `body` (JSON text), through `curl`: the status and the JSON answer.
    pub fn call(&self, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, text) = self.call_raw(method, path, body, &self.headers);
        let value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {text}"));
        (status, value)
    }

    /// As [`Serve::call`], with `headers` instead of the server's, and the answer as text.
    pub fn call_raw(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
        headers: &[String],
    ) -> (u16, String) {
        let mut command = Command::new("curl");
        command
            .args(["-sS", "-X", method, "-w", "\n%{http_code}"])
            .arg(format!("{}{path}", self.base));
        for header in headers {
            command.args(["-H", header]);
        }
        if body.is_some() {
            command.args([
                "-H",
                "content-type: application/json",
                "--data-binary",
                "@-",
            ]);
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("curl (installed by .ci/run)");
        let mut stdin = child.stdin.take().expect("piped stdin");
        if let Some(body) = body {
            stdin.write_all(body.as_bytes()).expect("write the body");
        }
        drop(stdin);
        let out = child.wait_with_output().expect("curl output");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (answer, status) = text.rsplit_once('\n').expect("curl's status line");
        (
            status.trim().parse().expect("an HTTP status"),
            answer.to_string(),
        )
    }

    /// Creates a session (`body` JSON); panics unless 201. Returns its id.
    pub fn session(&self, body: &str) -> String {
        let (status, view) = self.call("POST", "/api/v1/sessions", Some(body));
        assert_eq!(status, 201, "{view}");
        view["id"].as_str().expect("session id").to_string()
    }

    /// Polls task `task`'s trace with the cursor from `since` until `until` holds of the
    /// events gathered (or the task settles, when `until` is `None`), within `limit`. Returns
    /// every event gathered and the last page.
    pub fn follow(
        &self,
        (session, task): (&str, &str),
        since: u64,
        until: Option<&Reached>,
        limit: Duration,
    ) -> (Vec<Value>, Value) {
        let deadline = Instant::now() + limit;
        let mut events = Vec::new();
        let mut next = since;
        loop {
            let path = format!("/api/v1/sessions/{session}/tasks/{task}/trace?since={next}");
            let (status, page) = self.call("GET", &path, None);
            assert_eq!(status, 200, "{page}");
            events.extend(page["events"].as_array().expect("events").iter().cloned());
            next = page["next"].as_u64().expect("next");
            let done = page["done"].as_bool().expect("done");
            let reached = match until {
                Some(until) => until(&events),
                None => done,
            };
            if reached || done {
                return (events, page);
            }
            assert!(
                Instant::now() < deadline,
                "the task did not get there in {limit:?}: {page}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops the server as Ctrl-C would (SIGTERM) and waits for it; its stderr.
    pub fn stop(mut self) -> String {
        self.terminate()
    }

    fn terminate(&mut self) -> String {
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::fs::read_to_string(self.stderr.path()).unwrap_or_default()
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            self.terminate();
        }
    }
}

/// Calls MCP tool `tool` of `mst serve --mcp` with `arguments`: the result's JSON (its text)
/// and whether it is an error.
pub async fn mcp_call(
    client: &rmcp::service::RunningService<rmcp::RoleClient, ()>,
    tool: &str,
    arguments: Value,
) -> (Value, bool) {
    let Value::Object(arguments) = arguments else {
        panic!("arguments must be an object")
    };
    let result: rmcp::model::CallToolResult = client
        .call_tool(
            rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(arguments),
        )
        .await
        .unwrap_or_else(|e| panic!("{tool}: a protocol error instead of a tool result: {e}"));
    let text = result.content[0]
        .as_text()
        .expect("text content")
        .text
        .clone();
    let value: Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{tool}: {e}: {text}"));
    assert_eq!(
        result.structured_content.as_ref(),
        Some(&value),
        "{tool}: the structured content is the text's JSON"
    );
    (value, result.is_error.unwrap_or(false))
}
