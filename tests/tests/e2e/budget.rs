//! The playground's budgets, end to end on the real `mst serve`: a server budget sessions
//! reserve out of, a session's own budget, 402 before anything runs (a create before any
//! machine, a task before any worker), a failed create giving its reservation back, and a turn
//! past its time or token budget failing while its session goes on. The agent is a command client that
//! reports its model use as `usage` events, as an agent's trace does.

use mst_tests::serve::Serve;
use mst_tests::{Eval, Mst};
use serde_json::{json, Value};
use std::time::Duration;

/// An agent reporting 30 tokens in and 10 out per task, that sleeps 30 s on input `slow`, and
/// on input `greedy` says `thinking`, then reports 40 tokens more before it sleeps. (It speaks
/// before the report that passes the budget: the turn is stopped as that report is read, so
/// a line after it may or may not be read first.)
fn spending_eval() -> Eval {
    let agent = r#"input=$(cat); usage='{"type":"custom","name":"usage","data":{"usage":{"inputTokens":30,"outputTokens":10}}}'; echo "$usage"; if [ "$input" = greedy ]; then echo thinking; echo "$usage"; sleep 30; fi; if [ "$input" = slow ]; then sleep 30; fi; echo "$input""#;
    Eval::new(
        json!({"name": "play", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "events": true},
               "timeout": 2}),
        &[json!({"id": "unused", "input": "x"})],
    )
}

fn tasks(session: &str) -> String {
    format!("/api/v1/sessions/{session}/tasks")
}

/// Runs a task on `session` to its end; its last trace page.
fn run_task(serve: &Serve, session: &str, input: &str) -> Value {
    let (status, task) = serve.call(
        "POST",
        &tasks(session),
        Some(&json!({"input": input}).to_string()),
    );
    assert_eq!(status, 202, "{task}");
    let id = task["id"].as_str().unwrap().to_string();
    let (_, last) = serve.follow((session, &id), 0, None, Duration::from_secs(30));
    last
}

#[test]
fn sessions_reserve_out_of_the_server_budget_and_tasks_past_a_budget_get_402() {
    let eval = spending_eval();
    let serve = Serve::start(
        &Mst::new(),
        &eval.config(),
        &eval.results(),
        &["--budget-tokens", "100"],
    );
    let (status, a) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"budget": {"tokens": 80}}"#),
    );
    assert_eq!(status, 201, "{a}");
    assert_eq!(
        a["budget"],
        json!({"limit": {"tokens": 80}, "spent": {"tokens": 0, "costUsd": 0.0}})
    );
    let a = a["id"].as_str().unwrap().to_string();
    // More than the server has left: refused before any machine is made.
    let (status, refused) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"budget": {"tokens": 50}}"#),
    );
    assert_eq!(status, 402, "{refused}");
    assert!(
        refused["error"].as_str().unwrap().contains("80 of its 100"),
        "{refused}"
    );
    let (_, list) = serve.call("GET", "/api/v1/sessions", None);
    assert_eq!(list["sessions"].as_array().unwrap().len(), 1, "{list}");

    // Two tasks of 40 tokens spend the session's 80; the third is refused before it runs.
    for _ in 0..2 {
        assert_eq!(run_task(&serve, &a, "hello")["status"], "completed");
    }
    let (status, refused) = serve.call("POST", &tasks(&a), Some(r#"{"input": "more"}"#));
    assert_eq!(status, 402, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("has spent its budget (80 tokens"),
        "{refused}"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{a}"), None);
    assert_eq!(view["tasks"].as_array().unwrap().len(), 2, "nothing ran");
    assert_eq!(view["budget"]["spent"]["tokens"], 80);

    // Closing gives back nothing here (all 80 were spent): 20 are left for sessions.
    serve.call("DELETE", &format!("/api/v1/sessions/{a}"), None);
    let (status, _) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"budget": {"tokens": 21}}"#),
    );
    assert_eq!(status, 402);
    let (status, _) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"budget": {"tokens": 20}}"#),
    );
    assert_eq!(status, 201);
    // A session without a budget of its own shares what is left of the server's: nothing.
    let shared = serve.session("{}");
    let (status, refused) = serve.call("POST", &tasks(&shared), Some(r#"{"input": "hi"}"#));
    assert_eq!(status, 402, "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap()
            .contains("this server's budget (100 tokens) is spent or held"),
        "{refused}"
    );
    let (_, info) = serve.call("GET", "/api/v1/info", None);
    assert_eq!(
        info["playground"]["budget"],
        json!({"limit": {"tokens": 100}, "spent": {"tokens": 80, "costUsd": 0.0},
               "committed": {"tokens": 100, "costUsd": 0.0}})
    );
    // A bad budget is a 400 naming the field.
    let (status, bad) = serve.call(
        "POST",
        "/api/v1/sessions",
        Some(r#"{"budget": {"tokens": 1, "dollars": 2}}"#),
    );
    assert_eq!(status, 400, "{bad}");
    assert!(bad["error"].as_str().unwrap().contains("dollars"), "{bad}");
    serve.stop();
}

#[test]
fn a_create_that_fails_gives_its_reservation_back() {
    let eval = spending_eval();
    let serve = Serve::start(
        &Mst::new(),
        &eval.config(),
        &eval.results(),
        &[
            "--budget-tokens",
            "100",
            "--runner-option",
            "worker=/nonexistent/worker",
        ],
    );
    for _ in 0..3 {
        let (status, failed) = serve.call(
            "POST",
            "/api/v1/sessions",
            Some(r#"{"budget": {"tokens": 80}}"#),
        );
        assert_eq!(status, 502, "the machine fails, not the budget: {failed}");
    }
    let (_, info) = serve.call("GET", "/api/v1/info", None);
    assert_eq!(
        info["playground"]["budget"]["committed"]["tokens"], 0,
        "{info}"
    );
    serve.stop();
}

#[test]
fn a_turn_past_its_time_budget_fails_with_its_cause_and_the_session_goes_on() {
    let eval = spending_eval();
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let session = serve.session("{}");
    assert_eq!(run_task(&serve, &session, "hello")["status"], "completed");
    let slow = run_task(&serve, &session, "slow");
    assert_eq!(slow["status"], "timed-out", "{slow}");
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        view["tasks"][1]["reason"],
        "past its time budget: the eval's `timeout` of 2 s"
    );
    let third = run_task(&serve, &session, "again");
    assert_eq!(
        (&third["status"], &third["finalText"]),
        (&json!("completed"), &json!("again"))
    );
    serve.stop();
}

#[test]
fn a_turn_past_its_token_budget_is_stopped_as_it_runs_and_the_session_goes_on() {
    let eval = spending_eval();
    let serve = Serve::start(&Mst::new(), &eval.config(), &eval.results(), &[]);
    let (status, bad) = serve.call("POST", "/api/v1/sessions", Some(r#"{"turnTokens": 0}"#));
    assert_eq!(status, 400, "{bad}");
    assert!(
        bad["error"].as_str().unwrap().contains("`turnTokens`"),
        "{bad}"
    );
    let session = serve.session(r#"{"turnTokens": 50}"#);
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(view["turnTokens"], 50, "{view}");
    // 40 tokens: within the turn's 50.
    assert_eq!(run_task(&serve, &session, "hello")["status"], "completed");
    // 80 tokens, then 30 s of sleep: stopped as the second report arrives, well before the
    // eval's 2 s deadline would have ended it as timed-out; what it said before is kept.
    let greedy = run_task(&serve, &session, "greedy");
    assert_eq!(greedy["status"], "over-budget", "{greedy}");
    assert_eq!(
        greedy["finalText"], "thinking",
        "what it said is kept: {greedy}"
    );
    let (_, view) = serve.call("GET", &format!("/api/v1/sessions/{session}"), None);
    let reason = "past its token budget: its model calls used 80 tokens, over the 50 it may use";
    assert_eq!(view["tasks"][1]["reason"], reason, "{view}");
    let id = greedy["task"].as_str().unwrap();
    let (_, trace) = serve.call("GET", &format!("{}/{id}/trace", tasks(&session)), None);
    let last = trace["events"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["text"], format!("stopped: {reason}"), "{trace}");
    // The session goes on.
    let third = run_task(&serve, &session, "again");
    assert_eq!(
        (&third["status"], &third["finalText"]),
        (&json!("completed"), &json!("again"))
    );
    serve.stop();
}
