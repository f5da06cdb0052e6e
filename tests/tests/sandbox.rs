//! Hostile plugins: each attack is stopped, and the error says what happened and how to allow
//! it when that is legitimate.

use mst::plugin::{Grants, Limits, LoadedPlugin, PluginHost};
use mst_tests::{fixture, s, Mst};
use std::time::{Duration, Instant};

fn hostile(mst: &Mst, options: &str, extra: &[&str]) -> mst_tests::Run {
    let path = fixture("hostile.wasm");
    let mut args = vec![
        "plugin",
        "grade",
        s(&path),
        "--answer",
        "x",
        "--options",
        options,
    ];
    args.extend_from_slice(extra);
    mst.run(&args)
}

#[test]
fn an_endless_loop_is_stopped_at_the_time_cap() {
    let mst = Mst::new();
    let started = Instant::now();
    let run = hostile(&mst, r#"{"behaviour": "loop"}"#, &["--plugin-timeout", "1"]);
    let elapsed = started.elapsed();
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("plugin mst/fixture/hostile 0.1.0 was stopped after its time limit of 1.0s"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("--plugin-timeout"), "{}", run.stderr);
    // Generous: compile and process start-up are included; a hang would take forever.
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}");
}

#[test]
fn unbounded_allocation_is_stopped_at_the_memory_cap() {
    let run = hostile(
        &Mst::new(),
        r#"{"behaviour": "alloc"}"#,
        &["--plugin-memory", "32"],
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("ran out of memory: it may use 32 MiB"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("memory allocation of"),
        "the guest's own message is attached: {}",
        run.stderr
    );
}

#[test]
fn a_panic_message_reaches_the_error() {
    let run = hostile(
        &Mst::new(),
        r#"{"behaviour": "panic", "message": "grader exploded: case 7"}"#,
        &[],
    );
    assert_eq!(run.code, 1);
    assert!(
        run.stderr
            .contains("plugin mst/fixture/hostile 0.1.0 crashed"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("grader exploded: case 7"),
        "{}",
        run.stderr
    );
}

#[test]
fn host_files_are_unreadable_unless_granted() {
    let mst = Mst::new();
    // tempfile puts this under /tmp, which the fixture declares.
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("canary.txt");
    std::fs::write(&secret, "CANARY-7f3a9").unwrap();
    let options = serde_json::json!({"behaviour": "read-file", "path": secret}).to_string();

    let denied = hostile(&mst, &options, &[]);
    assert_eq!(denied.code, 1);
    assert!(!denied.stdout.contains("CANARY") && !denied.stderr.contains("CANARY"));
    assert!(
        denied.stderr.contains("could not read"),
        "{}",
        denied.stderr
    );

    // A grant outside what the plugin declared (/tmp) changes nothing.
    let elsewhere = tempfile::tempdir_in(mst_tests::root().join("target")).unwrap();
    let still_denied = hostile(&mst, &options, &["--allow-read", s(elsewhere.path())]);
    assert_eq!(still_denied.code, 1);
    assert!(!still_denied.stdout.contains("CANARY"));

    // Granting the directory works, which shows the denial above was the sandbox.
    let granted = hostile(&mst, &options, &["--allow-read", s(dir.path())]);
    assert_eq!(granted.code, 0, "{}", granted.stderr);
    assert!(
        granted.stdout.contains("CANARY-7f3a9"),
        "{}",
        granted.stdout
    );
}

#[test]
fn programs_run_only_when_declared_and_granted() {
    let mst = Mst::new();
    let echo = r#"{"behaviour": "exec", "program": "echo", "args": ["from-host"]}"#;
    let denied = hostile(&mst, echo, &[]);
    assert_eq!(denied.code, 1);
    assert!(
        denied
            .stderr
            .contains("plugin mst/fixture/hostile 0.1.0 failed (denied)"),
        "{}",
        denied.stderr
    );
    assert!(
        denied.stderr.contains("--allow-exec echo"),
        "{}",
        denied.stderr
    );

    // `sh` is granted by the operator, but the plugin never declared it.
    let sneaky = r#"{"behaviour": "exec", "program": "sh", "args": ["-c", "echo pwned"]}"#;
    let refused = hostile(
        &mst,
        sneaky,
        &["--allow-exec", "sh", "--allow-exec", "echo"],
    );
    assert_eq!(refused.code, 1);
    assert!(
        refused.stderr.contains("running `sh` is not allowed") && !refused.stdout.contains("pwned"),
        "{}",
        refused.stderr
    );

    let granted = hostile(&mst, echo, &["--allow-exec", "echo"]);
    assert_eq!(granted.code, 0, "{}", granted.stderr);
    assert!(
        granted.stdout.contains("ran: from-host"),
        "{}",
        granted.stdout
    );
}

#[test]
fn a_trapped_instance_is_never_reused() {
    let home = tempfile::tempdir().unwrap();
    let host = PluginHost::new(home.path().join("cache")).unwrap();
    let bytes = std::fs::read(fixture("hostile.wasm")).unwrap();
    let limits = Limits {
        memory_bytes: 32 << 20,
        call_timeout: Duration::from_secs(2),
    };
    let plugin =
        LoadedPlugin::load(&host, &bytes, "hostile.wasm", &Grants::default(), limits).unwrap();
    let trial = mst::eval::trial::TrialRecord::answered(
        mst::eval::trial::CaseRecord::new("c", serde_json::json!(null)),
        "x",
    )
    .to_wit();
    for attack in [
        r#"{"behaviour":"panic","message":"boom"}"#,
        r#"{"behaviour":"alloc"}"#,
        r#"{"behaviour":"loop"}"#,
    ] {
        assert!(plugin.grade(attack, &trial).is_err(), "{attack}");
        // The next call gets a fresh instance with fresh memory and a fresh deadline.
        let score = plugin
            .grade(r#"{"behaviour":"ok"}"#, &trial)
            .unwrap_or_else(|e| panic!("after {attack}: {e}"));
        assert_eq!(score.reason, "behaved");
    }
}

#[test]
fn a_granted_secret_reaches_the_plugin_and_nothing_else() {
    const CANARY: &str = "mst-canary-5b1e0c9d";
    let mst = Mst::new();
    let options = r#"{"behaviour": "secret", "name": "MST_CANARY"}"#;
    let path = fixture("hostile.wasm");
    let args = [
        "-vv",
        "plugin",
        "grade",
        s(&path),
        "--answer",
        "x",
        "--options",
        options,
        "--json",
    ];

    let denied = mst
        .command(&args)
        .env("MST_CANARY", CANARY)
        .output()
        .unwrap();
    let denied = mst_tests::Run::from(denied);
    assert_eq!(denied.code, 1);
    assert!(
        denied.stderr.contains("--allow-secret MST_CANARY"),
        "{}",
        denied.stderr
    );

    let mut granted_args = args.to_vec();
    granted_args.extend(["--allow-secret", "MST_CANARY"]);
    let granted = mst_tests::Run::from(
        mst.command(&granted_args)
            .env("MST_CANARY", CANARY)
            .output()
            .unwrap(),
    );
    assert_eq!(granted.code, 0, "{}", granted.stderr);
    assert!(
        granted
            .stdout
            .contains(&format!("secret has {} characters", CANARY.len())),
        "{}",
        granted.stdout
    );
    // The value travels only into the sandbox: not to stdout, the debug log, or any file mst wrote.
    assert!(!granted.stdout.contains(CANARY) && !granted.stderr.contains(CANARY));
    assert!(!denied.stdout.contains(CANARY) && !denied.stderr.contains(CANARY));
    assert!(mst_tests::files_containing(mst.home.path(), CANARY).is_empty());
}

#[test]
fn plugin_logs_are_tagged_sanitized_and_capped() {
    let options = r#"{"behaviour": "log", "count": 1500, "message": "line\u001b[2Jcleared"}"#;
    let run = hostile(&Mst::new(), options, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let lines: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("cleared"))
        .collect();
    assert_eq!(lines.len(), 1000, "capped at 1,000 lines a call");
    assert!(
        lines[0].contains("mst/fixture/hostile 0.1.0"),
        "tagged: {}",
        lines[0]
    );
    assert!(
        !run.stderr.contains('\u{1b}'),
        "escape sequences are neutralised"
    );
    assert!(run.stderr.contains("dropping the rest"), "{}", run.stderr);
}
