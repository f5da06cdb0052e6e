//! The first-party graders and dataset resolver, run through the host.

use mst_tests::{plugin, s, Mst};

fn grade(mst: &Mst, file: &str, answer: &str, options: &str) -> mst_tests::Run {
    mst.run(&[
        "plugin",
        "grade",
        s(&plugin(file)),
        "--answer",
        answer,
        "--options",
        options,
        "--json",
    ])
}

#[test]
fn contains_grader() {
    let mst = Mst::new();
    let pass = grade(
        &mst,
        "contains.wasm",
        "Tokyo: 09:00",
        r#"{"values": ["tokyo", "09:00"], "caseSensitive": false}"#,
    );
    assert_eq!(pass.code, 0, "{}", pass.stderr);
    assert_eq!(pass.json()["pass"], true);
    let fail = grade(
        &mst,
        "contains.wasm",
        "Paris: 02:00",
        r#"{"values": ["Tokyo", "02:00"]}"#,
    );
    assert_eq!(fail.code, 1);
    let score = fail.json();
    assert_eq!(
        (score["pass"].as_bool(), score["value"].as_f64()),
        (Some(false), Some(0.5))
    );
    assert!(score["reason"]
        .as_str()
        .unwrap()
        .contains("missing \"Tokyo\""));
    let bad = grade(&mst, "contains.wasm", "x", r#"{"valeu": "x"}"#);
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr.contains("invalid options") && bad.stderr.contains("valeu"),
        "{}",
        bad.stderr
    );
}

#[test]
fn contains_grader_reads_the_expected_value_from_a_trial_file() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let trial = dir.path().join("trial.json");
    std::fs::write(
        &trial,
        r#"{"case": {"id": "tz-1", "input": {"tool": "get_current_time"}, "expected": "Asia/Tokyo"},
            "trace": {"finalText": "{\"timezone\": \"Asia/Tokyo\"}", "events": [
              {"seq": 0, "atMs": 3, "type": "tool-call", "id": "1", "tool": "get_current_time", "arguments": {"timezone": "Asia/Tokyo"}}
            ]}}"#,
    )
    .unwrap();
    let run = mst.run(&[
        "plugin",
        "grade",
        s(&plugin("contains.wasm")),
        "--trial",
        s(&trial),
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.json()["case"], "tz-1");
}

#[test]
fn regex_grader() {
    let mst = Mst::new();
    let run = grade(
        &mst,
        "regex.wasm",
        "It is 14:05 in Tokyo",
        r#"{"pattern": "\\b\\d{2}:\\d{2}\\b"}"#,
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.json()["reason"].as_str().unwrap().contains("14:05"));
    let bad = grade(&mst, "regex.wasm", "x", r#"{"pattern": "(["}"#);
    assert_eq!(bad.code, 1);
    assert!(
        bad.stderr.contains("`pattern` is not a valid regex"),
        "{}",
        bad.stderr
    );
}

#[test]
fn json_grader() {
    let mst = Mst::new();
    let answer = r#"{"timezone": "Asia/Tokyo", "is_dst": false}"#;
    let pass = grade(
        &mst,
        "json.wasm",
        answer,
        r#"{"path": "$.timezone", "equals": "Asia/Tokyo"}"#,
    );
    assert_eq!(pass.code, 0, "{}", pass.stderr);
    let schema = r#"{"schema": {"type": "object", "required": ["timezone", "datetime"]}}"#;
    let fail = grade(&mst, "json.wasm", answer, schema);
    assert_eq!(fail.code, 1);
    assert!(fail.json()["reason"].as_str().unwrap().contains("datetime"));
}

#[test]
fn jsonl_dataset_resolver() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cases.jsonl");
    std::fs::write(&file, "{\"id\":\"a\",\"input\":{\"q\":1},\"tags\":[\"smoke\"]}\n\n{\"id\":\"b\",\"input\":\"hi\",\"expected\":\"hello\"}\n").unwrap();
    let run = mst.run(&[
        "plugin",
        "resolve",
        s(&plugin("jsonl.wasm")),
        "--file",
        s(&file),
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let cases = run.json();
    assert_eq!(cases.as_array().unwrap().len(), 2);
    assert_eq!(cases[0]["input"]["q"], 1);
    assert_eq!(cases[1]["expected"], "hello");

    std::fs::write(
        &file,
        "{\"id\":\"a\",\"input\":1}\n{\"id\":\"a\",\"input\":2}\n",
    )
    .unwrap();
    let dup = mst.run(&[
        "plugin",
        "resolve",
        s(&plugin("jsonl.wasm")),
        "--file",
        s(&file),
    ]);
    assert_eq!(dup.code, 1);
    assert!(
        dup.stderr.contains("line 2") && dup.stderr.contains("appears twice"),
        "{}",
        dup.stderr
    );
}

#[test]
fn a_grader_cannot_resolve_datasets() {
    let run = Mst::new().run(&["plugin", "resolve", s(&plugin("contains.wasm"))]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("a grader plugin cannot resolve datasets"),
        "{}",
        run.stderr
    );
}

/// `mst plugin resolve` on the hostile dataset fixture with `options` and a time limit of
/// `limit` seconds.
fn hostile_resolve(mst: &Mst, options: &str, limit: &str) -> (mst_tests::Run, std::time::Duration) {
    let started = std::time::Instant::now();
    let run = mst.run(&[
        "plugin",
        "resolve",
        s(&mst_tests::fixture("hostile-dataset.wasm")),
        "--options",
        options,
        "--plugin-timeout",
        limit,
        "--json",
    ]);
    (run, started.elapsed())
}

#[test]
fn a_dataset_resolver_is_bounded_in_time_and_in_what_it_returns() {
    let mst = Mst::new();
    let (ok, _) = hostile_resolve(&mst, r#"{"behaviour": "ok"}"#, "3");
    assert_eq!(ok.code, 0, "{}", ok.stderr);
    assert_eq!(ok.json().as_array().unwrap().len(), 2);

    let (slept, elapsed) = hostile_resolve(&mst, r#"{"behaviour": "sleep", "count": 120}"#, "3");
    eprintln!("a resolve sleeping 120 s under a 3 s limit: mst took {elapsed:?}");
    assert_eq!(slept.code, 1);
    assert!(
        slept
            .stderr
            .contains("time limit of 3.0s, waiting in a host call"),
        "{}",
        slept.stderr
    );
    assert!(elapsed < std::time::Duration::from_secs(10), "{elapsed:?}");

    let (big, _) = hostile_resolve(&mst, r#"{"behaviour": "big-case", "count": 2000000}"#, "60");
    assert_eq!(big.code, 1);
    assert!(
        big.stderr
            .contains("case `big` has 2000005 bytes; the most one case may have is 1048576"),
        "{}",
        big.stderr
    );
    assert!(big.stdout.is_empty(), "nothing printed");

    // A million cases take a while to build and copy out on a busy machine: a longer limit.
    let (many, _) = hostile_resolve(&mst, r#"{"behaviour": "many", "count": 1000001}"#, "60");
    assert_eq!(many.code, 1);
    assert!(
        many.stderr
            .contains("returned 1000001 cases; the most one dataset may have is 1000000"),
        "{}",
        many.stderr
    );
}
