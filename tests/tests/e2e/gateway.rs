//! The model gateway: a `command` agent with `modelGateway` calls its model through the
//! machine's gateway, which the coordinator answers with the key only it holds; the key never
//! reaches the machine, each trial's token is refused after its trial and for another trial,
//! and what the calls used is measured by the host. A provider stand-in on loopback plays the
//! model (no provider is reachable from here).

use mst_tests::model_server::{ModelServer, Reply};
use mst_tests::{read_trace, s, Eval, Mst};
use serde_json::json;

/// The provider's key, as the secrets file holds it: it must reach the stand-in and nothing
/// on the machine.
const KEY: &str = "mst-canary-gateway-key-7d41";

/// An agent (a shell script with curl) that first tries the token the previous trial left in
/// `dir` (printing the status it got), leaves its own there, then asks its model through the
/// gateway and prints the answer and its environment.
fn agent(dir: &std::path::Path) -> String {
    format!(
        r#"set -u
d={dir}
call() {{ curl -s -o "$d/out" -w '%{{http_code}}' "$ANTHROPIC_BASE_URL/v1/messages" \
  -H "x-api-key: $1" -H 'content-type: application/json' \
  -d '{{"model": "any", "max_tokens": 50, "messages": [{{"role": "user", "content": "ping"}}]}}'; }}
if [ -f "$d/token" ]; then echo "earlier token: $(call "$(cat "$d/token")")"; fi
echo "$ANTHROPIC_API_KEY" > "$d/token"
echo "own token: $(call "$ANTHROPIC_API_KEY")"
cat "$d/out"; echo
env | sort
"#,
        dir = s(dir)
    )
}

/// A `command` eval on the gateway, its model `acme/test-model` at `server`, two cases run
/// one after the other. Its agent hands its token to the next trial through a file, so it
/// runs unsandboxed (`Mst::unsandboxed`): the gateway must refuse a token past its trial even
/// where trials can reach each other.
fn gateway_eval(server: &ModelServer) -> (Eval, std::path::PathBuf) {
    let scratch = tempfile::tempdir().unwrap().keep();
    let eval = Eval::new(
        json!({"name": "gateway", "datasets": ["cases.jsonl"], "client": "command",
               "model": "acme/test-model",
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(), "key": "MODEL_KEY",
                                      "prices": {"test-model": {"input": 3.0, "output": 15.0}}}},
               "clientOptions": {"command": ["sh", "-c", agent(&scratch)], "modelGateway": true},
               "judges": [{"assert": "contains", "value": "pong"}],
               "concurrency": 1, "timeout": 30}),
        &[
            json!({"id": "c1", "input": "one"}),
            json!({"id": "c2", "input": "two"}),
        ],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("MODEL_KEY={KEY}\n")).unwrap();
    (eval, secrets)
}

#[test]
fn a_command_agent_reaches_its_model_through_the_gateway_and_never_holds_the_key() {
    let server = ModelServer::start_with(|_| Reply::anthropic_text("pong"));
    let (eval, secrets) = gateway_eval(&server);
    let run = eval.run(
        &Mst::unsandboxed(),
        &["--json", "-q", "--secrets-file", s(&secrets)],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    // The provider got the real key, and the variant's model whatever the agent named.
    let requests = server.requests();
    assert_eq!(requests.len(), 2, "one call a trial reached the provider");
    for request in &requests {
        assert_eq!(request.header("x-api-key"), Some(KEY));
        assert_eq!(request.body["model"], "test-model");
    }
    let dir = eval.run_dir("gateway");
    let first = read_trace(&dir, "default/c1/0");
    let second = read_trace(&dir, "default/c2/0");
    let answer =
        |trace: &serde_json::Value| trace["trace"]["finalText"].as_str().unwrap().to_string();
    // Each trial's own token works; the first trial's is refused in the second.
    assert!(
        answer(&first).contains("own token: 200"),
        "{}",
        answer(&first)
    );
    assert!(
        answer(&second).contains("earlier token: 401"),
        "{}",
        answer(&second)
    );
    assert!(
        answer(&second).contains("own token: 200"),
        "{}",
        answer(&second)
    );
    // The agent's environment holds the gateway and a token, never the key.
    for trace in [&first, &second] {
        let text = answer(trace);
        assert!(
            text.contains("ANTHROPIC_BASE_URL=http://127.0.0.1:"),
            "{text}"
        );
        assert!(text.contains("MST_MODEL=acme/test-model"), "{text}");
        assert!(!text.contains(KEY), "{text}");
    }
    assert_host_measured_usage(&first);
    assert!(mst_tests::files_containing(&eval.results(), KEY).is_empty());
    assert!(!run.stdout.contains(KEY) && !run.stderr.contains(KEY));
    // The summary counts what the host measured: two calls of 80 and 20 tokens.
    let summary: serde_json::Value = run.json();
    let usage = &summary["usage"]["variants"]["default"];
    assert_eq!(usage["calls"], 2, "{summary}");
    assert_eq!(usage["inputTokens"], 160, "{summary}");
}

/// The trace holds the call as the host measured it at the gateway.
fn assert_host_measured_usage(trace: &serde_json::Value) {
    let events = trace["trace"]["events"].as_array().unwrap();
    let usage: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "custom" && e["name"] == "usage")
        .collect();
    assert_eq!(usage.len(), 1, "{trace}");
    let data = &usage[0]["data"];
    assert_eq!(data["measuredBy"], "gateway", "{data}");
    assert_eq!(data["model"], "acme/test-model", "{data}");
    assert_eq!(data["usage"]["inputTokens"], 80, "{data}");
    assert!(data["costUsd"].as_f64().unwrap() > 0.0, "{data}");
}

#[test]
fn a_gateway_call_without_a_token_or_to_another_api_is_refused() {
    let server = ModelServer::start_with(|_| Reply::anthropic_text("pong"));
    let script = r#"u="$ANTHROPIC_BASE_URL"
echo "no token: $(curl -s -o /dev/null -w '%{http_code}' "$u/v1/messages" -d '{}')"
echo "bad token: $(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: mst-gw-forged' "$u/v1/messages" -d '{}')"
echo "bad body: $(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $ANTHROPIC_API_KEY" "$u/v1/messages" -d 'not json')"
echo "elsewhere: $(curl -s -o /dev/null -w '%{http_code}' -H "x-api-key: $ANTHROPIC_API_KEY" "$u/v1/other" -d '{}')"
echo pong"#;
    let eval = Eval::new(
        json!({"name": "gateway", "datasets": ["cases.jsonl"], "client": "command",
               "model": "mock/echo",
               "clientOptions": {"command": ["sh", "-c", script], "modelGateway": true},
               "judges": [{"assert": "contains", "value": "pong"}], "timeout": 30}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("gateway"), "default/c1/0");
    let text = trace["trace"]["finalText"].as_str().unwrap();
    for expected in [
        "no token: 401",
        "bad token: 401",
        "bad body: 400",
        "elsewhere: 404",
    ] {
        assert!(text.contains(expected), "{expected}: {text}");
    }
    assert!(server.requests().is_empty());
}

#[test]
fn a_provider_redirect_is_never_followed_with_the_key() {
    let elsewhere = ModelServer::start_with(|_| Reply::anthropic_text("pong"));
    let location = format!("{}/v1/messages", elsewhere.url());
    let server = ModelServer::start(vec![Reply::status(307, &[("location", &location)])]);
    let (eval, secrets) = gateway_eval(&server);
    let run = eval.run(
        &Mst::unsandboxed(),
        &["--json", "-q", "--secrets-file", s(&secrets)],
    );
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        elsewhere.requests().is_empty(),
        "the key went where it was sent"
    );
    assert_eq!(
        server.requests().len(),
        2,
        "one call a trial, no retry of a 307"
    );
    let trace = read_trace(&eval.run_dir("gateway"), "default/c1/0");
    let text = trace["trace"]["finalText"].as_str().unwrap();
    assert!(
        text.contains("own token: 502") && text.contains("307"),
        "{text}"
    );
}
