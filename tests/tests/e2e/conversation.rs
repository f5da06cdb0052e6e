//! Conversations in the playground, end to end: the real `mst serve` on a loopback port,
//! called with the real `curl`, booting a local machine, and a scripted agent CLI that keeps
//! one thread file per session id and resumes with `--resume ID` (minting a new id on each
//! run, as `claude -p --resume` does). The resume token goes from the worker to the session's
//! memory and back to the next turn's worker over its stdin, and nowhere else. An `api`
//! conversation against the loopback model server: each turn's model sees the completed turns
//! before it (history kept in the session's memory, sent in the bundle), capped.

use mst_tests::serve::{agent_eval, mcp_call as tool, Serve};
use mst_tests::{s, Eval, Mst};
use rmcp::service::RunningService;
use rmcp::transport::TokioChildProcess;
use rmcp::{RoleClient, ServiceExt};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

/// The agent CLI: reads its input on stdin; with `--resume ID` continues thread `ID` (copied
/// to a new id), without it starts a new one; appends its input to the thread, prints a decoy
/// `session:` line then the real one (the last wins), then the thread so far as its answer.
/// Every id it mints goes to `$MINTED` (outside the results), its arguments to `$ARGV`; it
/// says on stderr how many threads its working directory holds; input `wait` holds the turn
/// until `$GATE` exists.
const AGENT: &str = r#"set -e
input=$(cat)
mint() { echo "canary-resume-$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')"; }
echo "$*" >> "$ARGV"
if [ "$input" = "wait" ]; then while [ ! -f "$GATE" ]; do sleep 0.05; done; fi
mkdir -p threads
decoy=$(mint); token=$(mint)
echo "$decoy" >> "$MINTED"; echo "$token" >> "$MINTED"
if [ "$1" = "--resume" ]; then
  [ -f "threads/$2" ] || { echo "no thread $2" >&2; exit 3; }
  cp "threads/$2" "threads/$token"
fi
printf '%s\n' "$input" >> "threads/$token"
echo "session: $decoy"
echo "session: $token"
cat "threads/$token"
echo "threads kept: $(ls threads | wc -l | tr -d ' ')" >&2
"#;

/// A test's agent and what it leaves outside the results: the ids it minted, its arguments.
struct Chat {
    eval: Eval,
    dir: tempfile::TempDir,
}

impl Chat {
    fn new() -> Chat {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("agent.sh");
        std::fs::write(&script, AGENT).unwrap();
        let env = json!({"MINTED": s(&dir.path().join("minted")), "ARGV": s(&dir.path().join("argv")),
                         "GATE": s(&dir.path().join("gate"))});
        let eval = Eval::new(
            json!({"name": "play", "datasets": ["cases.jsonl"], "client": "command",
                   "clientOptions": {"command": ["sh", s(&script)], "env": env,
                                     "resume": {"capture": "^session: (\\S+)$", "arg": ["--resume", "{token}"]}},
                   "variants": {"chat": {}, "plain": {"clientOptions": {"command": ["cat"]}}},
                   "baseline": "chat",
                   "judges": [{"assert": "contains", "value": "alpha"}],
                   "timeout": 60}),
            &[json!({"id": "unused", "input": "x"})],
        );
        Chat { eval, dir }
    }

    /// An mst whose local machines are unsandboxed: the agent writes `$MINTED` and `$ARGV`
    /// outside its trial, for the test to read.
    fn mst(&self) -> Mst {
        Mst::unsandboxed()
    }

    fn minted(&self) -> Vec<String> {
        lines(&self.dir.path().join("minted"))
    }

    fn argv(&self) -> Vec<String> {
        lines(&self.dir.path().join("argv"))
    }

    fn open_gate(&self) {
        std::fs::write(self.dir.path().join("gate"), "").unwrap();
    }
}

fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn tasks(session: &str) -> String {
    format!("/api/v1/sessions/{session}/tasks")
}

/// Every API answer of a test, as text, for the canary check.
#[derive(Default)]
struct Answers(std::cell::RefCell<Vec<String>>);

impl Answers {
    fn call(&self, serve: &Serve, method: &str, path: &str, body: Option<&str>) -> (u16, Value) {
        let (status, value) = serve.call(method, path, body);
        self.0.borrow_mut().push(value.to_string());
        (status, value)
    }

    /// Creates a conversation session: the status and the session's view.
    fn open_conversation(&self, serve: &Serve) -> (u16, Value) {
        self.call(
            serve,
            "POST",
            "/api/v1/sessions",
            Some(r#"{"conversation": true}"#),
        )
    }

    /// Submits `body` as a turn and follows it to its end: the turn's id and last page.
    fn turn(&self, serve: &Serve, session: &str, body: &str) -> (String, Value) {
        let (status, task) = self.call(serve, "POST", &tasks(session), Some(body));
        assert_eq!(status, 202, "{task}");
        let id = task["id"].as_str().unwrap().to_string();
        let (events, page) = serve.follow((session, &id), 0, None, Duration::from_secs(60));
        self.0.borrow_mut().push(Value::Array(events).to_string());
        self.0.borrow_mut().push(page.to_string());
        assert_eq!(page["status"], "completed", "{page}");
        (id, page)
    }
}

/// The thread the agent answered with: its answer without the `session:` lines.
fn thread(page: &Value) -> Vec<String> {
    page["finalText"]
        .as_str()
        .unwrap()
        .lines()
        .filter(|l| !l.starts_with("session: "))
        .map(str::to_string)
        .collect()
}

/// Every file under `dir`, recursively.
fn files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        match entry.file_type().unwrap().is_dir() {
            true => found.extend(files(&path)),
            false => found.push(path),
        }
    }
    found
}

/// Submits three turns to conversation `session`: each continues the thread, and resumed the
/// last id the turn before printed (not its decoy, not an older one); the ids stay out of the
/// answers.
fn assert_turns_resume_the_last_token(chat: &Chat, api: &Answers, serve: &Serve, session: &str) {
    let (first, page) = api.turn(serve, session, r#"{"input": "alpha"}"#);
    assert_eq!(first, "turn-1");
    assert_eq!(thread(&page), ["alpha"]);
    let answer = page["finalText"].as_str().unwrap();
    assert!(
        answer.starts_with("session: ") && !answer.contains("canary-resume-"),
        "the id lines stay in the answer, redacted: {answer}"
    );
    let (second, page) = api.turn(serve, session, r#"{"input": "bravo"}"#);
    assert_eq!(second, "turn-2");
    assert_eq!(thread(&page), ["alpha", "bravo"]);
    let (third, page) = api.turn(serve, session, r#"{"input": "charlie"}"#);
    assert_eq!(third, "turn-3");
    assert_eq!(thread(&page), ["alpha", "bravo", "charlie"], "{page}");
    let minted = chat.minted();
    assert_eq!(minted.len(), 6, "{minted:?}");
    assert_eq!(
        chat.argv(),
        [
            String::new(),
            format!("--resume {}", minted[1]),
            format!("--resume {}", minted[3])
        ]
    );
}

/// A fresh turn (the fourth) of `session` starts a new thread: the held token is dropped, the
/// work directory and its threads are kept; the fifth turn continues the new thread.
fn assert_fresh_starts_a_thread_in_the_same_workdir(
    chat: &Chat,
    api: &Answers,
    serve: &Serve,
    session: &str,
) {
    let (fresh, page) = api.turn(serve, session, r#"{"input": "delta", "fresh": true}"#);
    assert_eq!(fresh, "turn-4");
    assert_eq!(thread(&page), ["delta"], "{page}");
    assert_eq!(chat.argv()[3], "", "a fresh turn does not resume");
    let (_, trace) = api.call(
        serve,
        "GET",
        &format!("{}/{fresh}/trace", tasks(session)),
        None,
    );
    let logs: Vec<&str> = trace["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["text"].as_str())
        .collect();
    assert!(
        logs.contains(&"threads kept: 4"),
        "the threads of turns 1-3 are still in the work directory: {logs:?}"
    );
    let (_, page) = api.turn(serve, session, r#"{"input": "echo"}"#);
    assert_eq!(thread(&page), ["delta", "echo"]);
}

/// `session` lists its five turns, the fourth fresh, and closes.
fn assert_turns_listed_then_close(api: &Answers, serve: &Serve, session: &str) {
    let (_, view) = api.call(serve, "GET", &format!("/api/v1/sessions/{session}"), None);
    let turns: Vec<(&str, bool)> = view["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["id"].as_str().unwrap(), t["fresh"] == json!(true)))
        .collect();
    assert_eq!(
        turns,
        [
            ("turn-1", false),
            ("turn-2", false),
            ("turn-3", false),
            ("turn-4", true),
            ("turn-5", false)
        ]
    );
    let (_, closed) = api.call(
        serve,
        "DELETE",
        &format!("/api/v1/sessions/{session}"),
        None,
    );
    assert_eq!(closed["status"], "closed");
}

/// Turns are not cases: grading conversation `session` of `eval`, reading it as cases or
/// exporting it is refused.
fn assert_turns_are_not_cases(mst: &Mst, eval: &Eval, session: &str) {
    let results = eval.results();
    let graded = mst.run(&[
        "grade",
        session,
        "--config",
        s(&eval.config()),
        "--results-dir",
        s(&results),
    ]);
    assert_eq!(graded.code, 2, "{}\n{}", graded.stdout, graded.stderr);
    assert!(
        graded
            .stderr
            .contains("is a playground conversation session")
            && graded.stderr.contains("cannot be graded"),
        "{}",
        graded.stderr
    );
    let cases = mst.run(&["runs", "cases", session, "--results-dir", s(&results)]);
    assert_eq!(cases.code, 2, "{}", cases.stderr);
    assert!(
        cases.stderr.contains("cannot be read as cases"),
        "{}",
        cases.stderr
    );
    let out = tempfile::tempdir().unwrap();
    let exported = mst.run(&[
        "runs",
        "export",
        session,
        "--format",
        "mst.run/v1",
        "--out",
        s(&out.path().join("x")),
        "--results-dir",
        s(&results),
    ]);
    assert_ne!(exported.code, 0);
    assert!(
        exported.stderr.contains("cannot be exported as cases"),
        "{}",
        exported.stderr
    );
    assert_eq!(cases.stdout, "");
}

/// No resume token in `tokens` is in any of `files`.
fn assert_no_file_holds_a_token(files: &[PathBuf], tokens: &[String]) {
    for file in files {
        let bytes = std::fs::read(file).unwrap();
        let text = String::from_utf8_lossy(&bytes);
        for token in tokens {
            assert!(
                !text.contains(token.as_str()),
                "{} holds a resume token",
                file.display()
            );
        }
    }
}

/// The canary: each turn's trace is stored under `results`, and no token the agent minted ever
/// reached a file of the results, mst serve's `stderr` or an answer.
fn assert_no_token_leaked(chat: &Chat, results: &Path, stderr: &str, api: &Answers) {
    let minted = chat.minted();
    assert_eq!(minted.len(), 10);
    let stored = files(results);
    assert!(
        stored
            .iter()
            .filter(|f| f.ends_with(mst_tests::TRACES_FILE))
            .any(|log| mst_tests::find_trace(log.parent().unwrap(), "chat/turn-3/0").is_some()),
        "each turn's trace is stored: {stored:?}"
    );
    assert_no_file_holds_a_token(&stored, &minted);
    let answers = api.0.borrow();
    for token in &minted {
        assert!(!stderr.contains(token.as_str()), "stderr: {stderr}");
        for answer in answers.iter() {
            assert!(!answer.contains(token.as_str()), "an answer: {answer}");
        }
    }
}

#[test]
fn turns_continue_one_thread_by_its_last_token_and_fresh_starts_another_in_the_same_workdir() {
    let chat = Chat::new();
    let serve = Serve::start(&chat.mst(), &chat.eval.config(), &chat.eval.results(), &[]);
    let api = Answers::default();
    let (status, view) = api.open_conversation(&serve);
    assert_eq!(status, 201, "{view}");
    assert_eq!(
        (&view["conversation"], &view["sharedWorkdir"]),
        (&json!(true), &json!(true)),
        "a conversation always shares its work directory: {view}"
    );
    let session = view["id"].as_str().unwrap().to_string();

    assert_turns_resume_the_last_token(&chat, &api, &serve, &session);
    assert_fresh_starts_a_thread_in_the_same_workdir(&chat, &api, &serve, &session);
    assert_turns_listed_then_close(&api, &serve, &session);
    let stderr = serve.stop();

    assert_turns_are_not_cases(&chat.mst(), &chat.eval, &session);
    assert_no_token_leaked(&chat, &chat.eval.results(), &stderr, &api);
}

#[test]
fn a_second_turn_while_one_runs_is_refused_and_fresh_needs_a_conversation() {
    let chat = Chat::new();
    let serve = Serve::start(&chat.mst(), &chat.eval.config(), &chat.eval.results(), &[]);
    let session = serve.session(r#"{"conversation": true}"#);
    let (status, running) = serve.call("POST", &tasks(&session), Some(r#"{"input": "wait"}"#));
    assert_eq!(status, 202, "{running}");
    assert_eq!(running["id"], "turn-1");
    let (status, refused) = serve.call("POST", &tasks(&session), Some(r#"{"input": "next"}"#));
    assert_eq!(status, 409, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("turn-1"),
        "{refused}"
    );
    chat.open_gate();
    let (_, page) = serve.follow((&session, "turn-1"), 0, None, Duration::from_secs(60));
    assert_eq!(page["status"], "completed", "{page}");
    let (status, next) = serve.call("POST", &tasks(&session), Some(r#"{"input": "next"}"#));
    assert_eq!(
        (status, next["id"].as_str()),
        (202, Some("turn-2")),
        "{next}"
    );
    let (_, page) = serve.follow((&session, "turn-2"), 0, None, Duration::from_secs(60));
    assert_eq!(page["status"], "completed", "{page}");

    // `fresh` means nothing outside a conversation.
    let plain = serve.session("{}");
    let (status, refused) = serve.call(
        "POST",
        &tasks(&plain),
        Some(r#"{"input": "x", "fresh": true}"#),
    );
    assert_eq!(status, 400, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("is not one (create it with `\"conversation\": true`)"),
        "{refused}"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{plain}"), None);
    assert_eq!(view["tasks"], json!([]), "nothing ran");
}

#[test]
fn a_client_that_cannot_resume_is_refused_at_create_before_any_machine_is_made() {
    // `agent` is a command client without `resume`; `direct` is the `mcp` client.
    let eval = agent_eval("cat", json!({}));
    let tmp = tempfile::tempdir().unwrap();
    let serve = Serve::start_with_env(
        &Mst::new(),
        &eval.config(),
        &eval.results(),
        &[],
        &[("TMPDIR", tmp.path())],
    );
    let (status, refused) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"conversation": true}"#),
    );
    assert_eq!(status, 400, "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("variant `agent` cannot hold a conversation")
            && error.contains("`command` client has no `clientOptions.resume`"),
        "{error}"
    );
    let (status, refused) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"variant": "direct", "conversation": true}"#),
    );
    assert_eq!(status, 400, "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("variant `direct` cannot hold a conversation")
            && error.contains("its `mcp` client cannot continue a conversation ("),
        "{error}"
    );
    // No machine was made, nothing recorded.
    let made: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("mst-local-"))
        .collect();
    assert_eq!(made, Vec::<String>::new());
    assert!(!eval.results().join("play/sessions").exists());
    let (_, list) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(list["sessions"], json!([]));
    // The same server makes a machine for a session that is not a conversation.
    serve.session("{}");
    let made = std::fs::read_dir(tmp.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("mst-local-"))
        .count();
    assert_eq!(made, 1, "the local runner makes its machines in TMPDIR");
}

/// Submits a turn over MCP and reads its trace until it settles: its id and its thread.
async fn mcp_turn(
    client: &RunningService<RoleClient, ()>,
    session: &str,
    arguments: Value,
) -> (String, Vec<String>) {
    let mut arguments = arguments;
    arguments["session"] = json!(session);
    let (task, is_error) = tool(client, "submit_task", arguments).await;
    assert!(!is_error, "{task}");
    let id = task["id"].as_str().unwrap().to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (page, _) = tool(
            client,
            "read_task_trace",
            json!({"session": session, "task": id}),
        )
        .await;
        if page["done"] == json!(true) {
            assert_eq!(page["status"], "completed", "{page}");
            return (id, thread(&page));
        }
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_mcp_twins_take_conversation_and_fresh() {
    let chat = Chat::new();
    let mst = chat.mst();
    let (config, results) = (chat.eval.config(), chat.eval.results());
    let args = [
        "serve",
        "--mcp",
        "--config",
        s(&config),
        "--results-dir",
        s(&results),
    ];
    let command = tokio::process::Command::from(mst.command(&args));
    let (transport, _) = TokioChildProcess::builder(command)
        .stderr(Stdio::null())
        .spawn()
        .expect("start mst serve --mcp");
    let client = ().serve(transport).await.expect("mst serve --mcp initializes");

    let (refused, is_error) = tool(
        &client,
        "create_session",
        json!({"variant": "plain", "conversation": true}),
    )
    .await;
    assert!(is_error, "{refused}");
    assert_eq!(refused["status"], 400);
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("variant `plain` cannot hold a conversation"),
        "{refused}"
    );
    let (view, is_error) = tool(&client, "create_session", json!({"conversation": true})).await;
    assert!(!is_error, "{view}");
    assert_eq!(view["conversation"], true);
    let session = view["id"].as_str().unwrap().to_string();
    assert_eq!(
        mcp_turn(&client, &session, json!({"input": "alpha"})).await,
        ("turn-1".to_string(), vec!["alpha".to_string()])
    );
    let (_, thread) = mcp_turn(&client, &session, json!({"input": "bravo"})).await;
    assert_eq!(thread, ["alpha", "bravo"]);
    let (_, thread) = mcp_turn(&client, &session, json!({"input": "new", "fresh": true})).await;
    assert_eq!(thread, ["new"]);
    client.cancel().await.unwrap();
}

/// Longer than an `api` conversation's turn may take (its eval's `timeout`).
const SLOW: Duration = Duration::from_secs(12);

/// The made-up fact the model states on the first turn, and must recall only from history.
const CODE_WORD: &str = "PLUM-7";

/// The text of each message of an `anthropic`-format request, in order, as (role, text).
fn messages(body: &Value) -> Vec<(String, String)> {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = match &m["content"] {
                Value::String(text) => text.clone(),
                parts => parts
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|p| p["text"].as_str())
                    .collect(),
            };
            (m["role"].as_str().unwrap().to_string(), text)
        })
        .collect()
}

/// A scripted model: "remember" gets the code word, "fail" a 500, "slow" an answer after
/// [`SLOW`] (past the turn's deadline), "what was the code word?" whatever code word its
/// earlier messages hold (or "I don't know"), anything else "ok".
fn recalling_model() -> mst_tests::model_server::ModelServer {
    use mst_tests::model_server::{ModelServer, Reply};
    ModelServer::start_with(|body| {
        let mut said = messages(body);
        let (_, last) = said.pop().unwrap();
        if last.contains("fail") {
            return Reply::status(500, &[]);
        }
        if last.contains("slow") {
            std::thread::sleep(SLOW);
            return Reply::anthropic_text("Late: the code word is PLUM-9.");
        }
        if last.contains("what was the code word?") {
            let known = said
                .iter()
                .find_map(|(_, text)| text.find("PLUM-").map(|at| text[at..at + 6].to_string()));
            return Reply::anthropic_text(&match known {
                Some(word) => format!("You told me: the code word is {word}."),
                None => "I don't know.".into(),
            });
        }
        // A turn that never ends by itself: every call asks for a tool that does not exist
        // (an error result the model sees), 100 tokens a call.
        if said.iter().any(|(_, text)| text.contains("keep calling"))
            || last.contains("keep calling")
        {
            return Reply::ok(json!({"content": [{"type": "tool_use", "id": "call-1",
                                                 "name": "nowhere__tool", "input": {}}],
                                    "usage": {"input_tokens": 80, "output_tokens": 20}}));
        }
        if last.contains("remember") {
            return Reply::anthropic_text(&format!("Noted: the code word is {CODE_WORD}."));
        }
        Reply::anthropic_text("ok")
    })
}

/// `mst serve` on an `api` eval whose model is `server` (keyed from a secrets file).
fn api_chat(server: &mst_tests::model_server::ModelServer) -> (Eval, Serve) {
    let eval = Eval::new(
        json!({"name": "talk", "datasets": ["cases.jsonl"],
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(), "key": "MODEL_KEY"}},
               "client": "api", "model": "acme/test-model",
               "clientOptions": {"system": "You keep code words.", "maxTokens": 100},
               "judges": [{"assert": "contains", "value": "PLUM"}],
               "timeout": 8}),
        &[json!({"id": "unused", "input": "x"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "MODEL_KEY=mst-canary-key-conversation\n").unwrap();
    let serve = Serve::start(
        &Mst::new(),
        &eval.config(),
        &eval.results(),
        &["--secrets-file", s(&secrets)],
    );
    (eval, serve)
}

/// Submits `input` (fresh when asked) and follows the turn to its end: its last page.
fn api_turn(serve: &Serve, session: &str, input: &str, fresh: bool) -> Value {
    let body = json!({"input": input, "fresh": fresh}).to_string();
    let (status, task) = serve.call("POST", &tasks(session), Some(&body));
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap();
    serve
        .follow((session, id), 0, None, Duration::from_secs(60))
        .1
}

#[test]
fn an_api_conversation_sends_the_model_its_completed_turns_and_fresh_forgets_them() {
    let model = recalling_model();
    let (_eval, serve) = api_chat(&model);
    let session = serve.session(r#"{"conversation": true}"#);
    let user = |text: &str| ("user".to_string(), text.to_string());
    let assistant = |text: &str| ("assistant".to_string(), text.to_string());

    let page = api_turn(&serve, &session, "Please remember a code word.", false);
    assert_eq!(page["status"], "completed", "{page}");
    let reply = page["finalText"].as_str().unwrap().to_string();
    assert!(reply.contains(CODE_WORD), "{reply}");
    assert_eq!(
        messages(&model.requests()[0].body).len(),
        1,
        "a first turn has no history"
    );

    // A failed turn (the model answers 500, past its retries) and a timed-out one add
    // nothing to the thread.
    let page = api_turn(&serve, &session, "This one will fail.", false);
    assert_eq!(page["status"], "infra", "{page}");
    let page = api_turn(&serve, &session, "This one is too slow.", false);
    assert_eq!(page["status"], "timed-out", "{page}");

    let page = api_turn(&serve, &session, "Now, what was the code word?", false);
    assert_eq!(page["status"], "completed", "{page}");
    let answer = page["finalText"].as_str().unwrap();
    assert!(
        answer.contains(CODE_WORD),
        "turn 4 recalls turn 1: {answer}"
    );
    // The slow request is recorded only once answered: find turn 4's by what it asked.
    let asked = |question: &str| -> Vec<Value> {
        let requests = model.requests().into_iter();
        requests
            .map(|r| r.body)
            .filter(|body| {
                messages(body)
                    .last()
                    .is_some_and(|(_, text)| text == question)
            })
            .collect()
    };
    let requests = asked("Now, what was the code word?");
    assert_eq!(requests.len(), 1, "one model call for turn 4");
    assert_eq!(
        messages(&requests[0]),
        [
            user("Please remember a code word."),
            assistant(&reply),
            user("Now, what was the code word?")
        ],
        "turn 1's message and answer, in order, then turn 4's; not the failed or slow turn"
    );
    assert_eq!(requests[0]["system"], "You keep code words.");
    let (_, trace) = serve.call("GET", &format!("{}/turn-4/trace", tasks(&session)), None);
    let said: Vec<&Value> = trace["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "log")
        .map(|e| &e["text"])
        .collect();
    assert!(
        said.iter()
            .any(|t| t.as_str().unwrap().contains("its 1 earlier turn(s)")),
        "the trace says the turn continued one earlier turn: {trace}"
    );

    // A new thread: the same question finds nothing to recall.
    let page = api_turn(&serve, &session, "So, what was the code word?", true);
    assert_eq!(page["status"], "completed", "{page}");
    assert_eq!(page["finalText"], "I don't know.", "{page}");
    let last = asked("So, what was the code word?");
    assert_eq!(
        messages(&last[0]),
        [user("So, what was the code word?")],
        "a fresh turn sends no earlier turn"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(view["conversation"], true, "{view}");
    assert_eq!(view["tasks"][4]["fresh"], true, "{view}");
}

#[test]
fn an_api_turn_past_its_token_budget_makes_no_further_call_and_the_conversation_goes_on() {
    let model = recalling_model();
    let (_eval, serve) = api_chat(&model);
    let session = serve.session(r#"{"conversation": true, "turnTokens": 250}"#);
    let page = api_turn(&serve, &session, "Please remember a code word.", false);
    assert_eq!(page["status"], "completed", "{page}");

    // 100 tokens a call: the third call takes the turn past 250, and no fourth is made,
    // though `maxTurns` (10) would allow it.
    let before = model.requests().len();
    let page = api_turn(&serve, &session, "Now keep calling tools.", false);
    assert_eq!(page["status"], "over-budget", "{page}");
    assert_eq!(
        model.requests().len() - before,
        3,
        "three model calls, then stopped"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        view["tasks"][1]["reason"],
        "past its token budget: its model calls used 300 tokens, over the 250 it may use",
        "{view}"
    );

    // The next turn runs, and the stopped one is not part of the thread.
    let page = api_turn(&serve, &session, "Now, what was the code word?", false);
    assert_eq!(page["status"], "completed", "{page}");
    assert!(
        page["finalText"].as_str().unwrap().contains(CODE_WORD),
        "{page}"
    );
    let last = model.requests().pop().unwrap().body;
    let said: Vec<String> = messages(&last).into_iter().map(|(_, text)| text).collect();
    assert_eq!(
        said.len(),
        3,
        "turn 1 and its answer, then turn 3: {said:?}"
    );
    assert!(!said.iter().any(|t| t.contains("keep calling")), "{said:?}");
}

#[test]
fn an_api_turn_past_the_history_cap_is_refused_until_a_fresh_thread() {
    let model = recalling_model();
    let (_eval, serve) = api_chat(&model);
    let session = serve.session(r#"{"conversation": true}"#);
    // Three 200,000-byte messages pass the 512 KiB cap on the third turn.
    let long = |n: u32| format!("turn {n}: {}", "x".repeat(200_000));
    for n in 1..=2 {
        let page = api_turn(&serve, &session, &long(n), false);
        assert_eq!(page["status"], "completed", "{page}");
    }
    let body = json!({"input": long(3)}).to_string();
    let (status, refused) = serve.call("POST", &tasks(&session), Some(&body));
    assert_eq!(status, 413, "{refused}");
    let error = refused["error"].as_str().unwrap();
    assert!(
        error.contains("turn 3 of conversation")
            && error.contains("over the 524288 bytes")
            && error.contains("\"fresh\": true"),
        "{error}"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        (view["tasks"].as_array().unwrap().len(), &view["status"]),
        (2, &json!("ready")),
        "the refused turn was never started: {view}"
    );
    assert_eq!(model.requests().len(), 2);
    // A new thread carries no history: the same message is taken.
    let page = api_turn(&serve, &session, &long(3), true);
    assert_eq!(page["status"], "completed", "{page}");
    assert_eq!(messages(&model.requests()[2].body).len(), 1);
}

/// Exports conversation `session` (turns: zulu, then fresh alpha, bravo) to `kept.jsonl` as
/// case `kept-thread`: the thread of the last turn, since its `fresh` (alpha, bravo), with
/// where it came from. The dataset file.
fn assert_last_thread_exports_as_a_case(
    chat: &Chat,
    api: &Answers,
    serve: &Serve,
    session: &str,
) -> PathBuf {
    let (status, exported) = api.call(
        serve,
        "POST",
        &format!("/api/v1/sessions/{session}/export"),
        Some(r#"{"dataset": "kept.jsonl", "case": "kept-thread"}"#),
    );
    assert_eq!(status, 201, "{exported}");
    let dataset = chat.eval.dir.path().join("kept.jsonl");
    let stored: Vec<Value> = lines(&dataset)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0]["id"], "kept-thread");
    assert_eq!(stored[0]["input"], json!({"turns": ["alpha", "bravo"]}));
    assert_eq!(
        stored[0]["metadata"]["exportedFrom"],
        json!({"session": session, "tasks": ["turn-2", "turn-3"]})
    );
    dataset
}

/// Exporting `session` again under the same id, to a path for a name or from a task that is
/// not there is refused; turn 1 alone exports as its own thread, the second case of `dataset`.
fn assert_bad_exports_refused_and_turn_1_exports_alone(
    api: &Answers,
    serve: &Serve,
    session: &str,
    dataset: &Path,
) {
    let export = format!("/api/v1/sessions/{session}/export");
    let (status, _) = api.call(
        serve,
        "POST",
        &export,
        Some(r#"{"dataset": "kept.jsonl", "case": "kept-thread"}"#),
    );
    assert_eq!(status, 409);
    let (status, refused) = api.call(
        serve,
        "POST",
        &export,
        Some(r#"{"dataset": "../kept.jsonl"}"#),
    );
    assert_eq!(status, 400, "{refused}");
    let (status, _) = api.call(
        serve,
        "POST",
        &export,
        Some(r#"{"dataset": "kept.jsonl", "task": "turn-9"}"#),
    );
    assert_eq!(status, 404);
    let (status, _) = api.call(
        serve,
        "POST",
        &export,
        Some(r#"{"dataset": "kept.jsonl", "task": "turn-1"}"#),
    );
    assert_eq!(status, 201);
    assert_eq!(
        serde_json::from_str::<Value>(&lines(dataset)[1]).unwrap()["input"],
        json!({"turns": ["zulu"]})
    );
}

/// Runs `chat`'s eval on dataset `kept.jsonl`, variant `chat` and case `kept-thread` only, into
/// `replayed` beside the agent: the results directory and the trial's trace.
fn replay_kept_thread(chat: &Chat) -> (PathBuf, Value) {
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(chat.eval.config()).unwrap()).unwrap();
    config["datasets"] = json!(["kept.jsonl"]);
    let replay = chat.eval.dir.path().join("replay.json");
    std::fs::write(&replay, config.to_string()).unwrap();
    let results = chat.dir.path().join("replayed");
    let run = chat.mst().run(&[
        "run",
        "--config",
        s(&replay),
        "--variant",
        "chat",
        "--case",
        "kept-thread",
        "--results-dir",
        s(&results),
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = mst_tests::read_trace(
        &results
            .join("play/runs")
            .join(run.json()["runId"].as_str().unwrap()),
        "chat/kept-thread/0",
    );
    (results, trace)
}

#[test]
fn a_conversation_exported_as_a_case_replays_its_turns_in_a_batch_run() {
    let chat = Chat::new();
    let serve = Serve::start(&chat.mst(), &chat.eval.config(), &chat.eval.results(), &[]);
    let api = Answers::default();
    let (_, view) = api.open_conversation(&serve);
    let session = view["id"].as_str().unwrap().to_string();
    api.turn(&serve, &session, r#"{"input": "zulu"}"#);
    api.turn(&serve, &session, r#"{"input": "alpha", "fresh": true}"#);
    api.turn(&serve, &session, r#"{"input": "bravo"}"#);
    let dataset = assert_last_thread_exports_as_a_case(&chat, &api, &serve, &session);
    assert_bad_exports_refused_and_turn_1_exports_alone(&api, &serve, &session, &dataset);
    serve.stop();

    // The exported case in a batch run: one trial replays both turns, resuming the thread.
    let before = chat.minted().len();
    let (results, trace) = replay_kept_thread(&chat);
    assert_eq!(
        thread(&json!({"finalText": trace["trace"]["finalText"]})),
        ["alpha", "bravo"],
        "{trace}"
    );
    let logs: Vec<&str> = trace["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["text"].as_str())
        .filter(|t| t.starts_with("turn "))
        .collect();
    assert_eq!(logs, ["turn 1 of 2", "turn 2 of 2"]);
    // The second turn resumed the token the first printed last; no token reached a file.
    let minted = chat.minted();
    assert_eq!(minted.len(), before + 4);
    assert_eq!(
        chat.argv()[chat.argv().len() - 1],
        format!("--resume {}", minted[before + 1])
    );
    assert_no_file_holds_a_token(&files(&results), &minted);
}

#[test]
fn a_tasks_input_exports_as_a_case_and_only_a_completed_task_does() {
    let chat = Chat::new();
    let serve = Serve::start(&chat.mst(), &chat.eval.config(), &chat.eval.results(), &[]);
    let api = Answers::default();
    let session = serve.session(r#"{"variant": "plain"}"#);
    let export = format!("/api/v1/sessions/{session}/export");
    let (status, refused) = api.call(
        &serve,
        "POST",
        &export,
        Some(r#"{"dataset": "kept.jsonl"}"#),
    );
    assert_eq!(status, 409, "nothing completed yet: {refused}");
    let (task, _) = api.turn(&serve, &session, r#"{"input": {"question": "hello"}}"#);
    let (status, exported) = api.call(
        &serve,
        "POST",
        &export,
        Some(r#"{"dataset": "kept.jsonl"}"#),
    );
    assert_eq!(status, 201, "{exported}");
    let case = &exported["case"];
    assert_eq!(case["input"], json!({"question": "hello"}));
    assert_eq!(case["id"], format!("{}-{task}", &session[..8]));
    assert_eq!(
        serde_json::from_str::<Value>(&lines(&chat.eval.dir.path().join("kept.jsonl"))[0]).unwrap(),
        *case
    );
    // An id no dataset would take is refused, and the file keeps its one case.
    let (status, refused) = api.call(
        &serve,
        "POST",
        &export,
        Some(r#"{"dataset": "kept.jsonl", "case": " "}"#),
    );
    assert_eq!(status, 400, "{refused}");
    // Several exports at once (each under the file's lock) keep every case.
    let ids: Vec<String> = (0..4).map(|n| format!("kept-{n}")).collect();
    std::thread::scope(|scope| {
        for id in &ids {
            let (serve, export) = (&serve, &export);
            scope.spawn(move || {
                let body = format!(r#"{{"dataset": "kept.jsonl", "case": "{id}"}}"#);
                let (status, answer) = serve.call("POST", export, Some(&body));
                assert_eq!(status, 201, "{answer}");
            });
        }
    });
    let kept = lines(&chat.eval.dir.path().join("kept.jsonl"));
    assert_eq!(kept.len(), 1 + ids.len(), "{kept:?}");
    serve.stop();
}

#[test]
fn an_exported_api_conversation_replays_with_its_history_in_a_batch_run() {
    let model = recalling_model();
    let (eval, serve) = api_chat(&model);
    let session = serve.session(r#"{"conversation": true}"#);
    for question in [
        "Please remember a code word.",
        "Now, what was the code word?",
    ] {
        assert_eq!(
            api_turn(&serve, &session, question, false)["status"],
            "completed"
        );
    }
    let (status, exported) = serve.call(
        "POST",
        &format!("/api/v1/sessions/{session}/export"),
        Some(r#"{"dataset": "kept.jsonl", "case": "recall"}"#),
    );
    assert_eq!(status, 201, "{exported}");
    serve.stop();
    let asked_before = model.requests().len();

    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(eval.config()).unwrap()).unwrap();
    config["datasets"] = json!(["kept.jsonl"]);
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let secrets = eval.dir.path().join("secrets.env");
    let run = eval.run(&Mst::new(), &["--secrets-file", s(&secrets), "--json"]);
    // The judge wants PLUM: the replayed second turn recalls what the first was told.
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let requests: Vec<Value> = model.requests()[asked_before..]
        .iter()
        .map(|r| r.body.clone())
        .collect();
    assert_eq!(requests.len(), 2, "one model call per turn");
    let second: Vec<(String, String)> = messages(&requests[1]);
    assert_eq!(
        second.len(),
        3,
        "the first turn, its reply, the question: {second:?}"
    );
    assert_eq!(second[0].1, "Please remember a code word.");
    assert!(second[1].1.contains(CODE_WORD), "{second:?}");
    assert_eq!(second[2].1, "Now, what was the code word?");
}
