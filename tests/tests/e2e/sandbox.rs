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

/// Runs the hostile grader with a 3 s time limit and `extra`; how long the whole `mst` took.
fn hostile_in_3s(mst: &Mst, options: &str, extra: &[&str]) -> (mst_tests::Run, Duration) {
    let started = Instant::now();
    let mut args = vec!["--plugin-timeout", "3"];
    args.extend_from_slice(extra);
    let run = hostile(mst, options, &args);
    (run, started.elapsed())
}

#[test]
fn a_grader_sleeping_in_a_host_call_is_stopped_at_its_time_limit() {
    // Two minutes in one WASI sleep: epoch interruption never fires inside a host call.
    let (run, elapsed) = hostile_in_3s(&Mst::new(), r#"{"behaviour": "sleep", "count": 120}"#, &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "was stopped after its time limit of 3.0s, waiting in a host call (a sleep, a poll, \
             or a program it ran)"
        ),
        "{}",
        run.stderr
    );
    eprintln!("a 120 s sleep under a 3 s limit: mst took {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn a_grader_busy_polling_the_clock_is_stopped_at_its_time_limit() {
    let (run, elapsed) = hostile_in_3s(&Mst::new(), r#"{"behaviour": "poll", "count": 120}"#, &[]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("was stopped after its time limit of 3.0s, running its own code"),
        "{}",
        run.stderr
    );
    eprintln!("a 120 s busy poll under a 3 s limit: mst took {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
}

#[test]
fn a_grader_reading_stdin_gets_end_of_file_at_once() {
    use std::process::Stdio;
    let mst = Mst::new();
    let path = fixture("hostile.wasm");
    let started = Instant::now();
    // mst's own stdin stays open and silent: the plugin must not be able to wait on it.
    let mut child = mst
        .command(&[
            "plugin",
            "grade",
            s(&path),
            "--answer",
            "x",
            "--options",
            r#"{"behaviour": "stdin"}"#,
            "--plugin-timeout",
            "3",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdin = child.stdin.take();
    let out = child.wait_with_output().unwrap();
    drop(stdin);
    let run = mst_tests::Run::from(out);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("stdin gave 0 bytes"), "{}", run.stdout);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// Whether process `pid` is still running (a zombie waiting to be reaped is not), given a
/// moment to die.
fn alive(pid: i32) -> bool {
    let running = || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            !stat
                .rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    let until = Instant::now() + Duration::from_secs(2);
    while running() && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(50));
    }
    running()
}

#[test]
fn a_program_ignoring_signals_is_killed_with_its_group_at_the_call_limit() {
    let mst = Mst::new();
    let bin = tempfile::tempdir().unwrap();
    let pids = bin.path().join("pids");
    let script = bin.path().join("mst-fixture-stubborn");
    // Ignores every signal it can, starts a child in its group and one in a session of its own
    // that holds stdout open, and never ends on its own.
    std::fs::write(
        &script,
        "#!/bin/sh\ntrap '' TERM INT HUP QUIT\nsleep 120 &\necho $! >> \"$1\"\n\
         setsid sleep 120 &\necho $! >> \"$1\"\necho $$ >> \"$1\"\nwhile :; do sleep 1; done\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let options = serde_json::json!({
        "behaviour": "exec",
        "program": "mst-fixture-stubborn",
        "args": [pids],
        "timeout_ms": 200_000,
    })
    .to_string();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let started = Instant::now();
    let run = mst_tests::Run::from(
        mst.command(&[
            "plugin",
            "grade",
            s(&fixture("hostile.wasm")),
            "--answer",
            "x",
            "--options",
            &options,
            "--plugin-timeout",
            "3",
            "--allow-exec",
            "mst-fixture-stubborn",
        ])
        .env("PATH", path)
        .output()
        .unwrap(),
    );
    let elapsed = started.elapsed();
    let pids: Vec<i32> = std::fs::read_to_string(&pids)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let (in_group, escaped, leader) = (pids[0], pids[1], pids[2]);
    // The one that left the group is the test's to clean up; mst cannot know it.
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &escaped.to_string()])
        .status();
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(run.stderr.contains("time limit of 3.0s"), "{}", run.stderr);
    eprintln!("a program ignoring signals under a 3 s limit: mst took {elapsed:?}");
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert!(!alive(leader) && !alive(in_group), "the group was killed");
}

#[test]
fn what_a_grader_returns_is_capped() {
    let mst = Mst::new();
    let big = 10 << 20;
    let reason = hostile(
        &mst,
        &format!(r#"{{"behaviour": "big-reason", "count": {big}}}"#),
        &["--json"],
    );
    assert_eq!(reason.code, 0, "{}", reason.stderr);
    let kept = reason.json()["reason"].as_str().unwrap().to_string();
    assert!(kept.len() < 16 * 1024, "{} bytes kept", kept.len());
    assert!(
        kept.ends_with(&format!("… [cut by mst: {} more bytes]", big - 8192)),
        "{}",
        &kept[kept.len() - 80..]
    );

    let details = hostile(
        &mst,
        &format!(r#"{{"behaviour": "big-details", "count": {big}}}"#),
        &["--json"],
    );
    assert_eq!(details.code, 1);
    assert!(
        details
            .stderr
            .contains("failed (internal error): returned a score whose details have 10485762 bytes; the most is 65536"),
        "{}",
        &details.stderr[..details.stderr.len().min(500)]
    );

    let error = hostile(
        &mst,
        &format!(r#"{{"behaviour": "big-error", "count": {big}}}"#),
        &[],
    );
    assert_eq!(error.code, 1);
    assert!(
        error.stderr.len() < 16 * 1024,
        "{} bytes",
        error.stderr.len()
    );
    assert!(error.stderr.contains("[cut by mst:"), "{}", error.stderr);
}

#[test]
fn a_judge_sleeping_in_a_run_costs_its_time_limit_not_its_sleep() {
    let mst = Mst::new();
    let hostile = fixture("hostile.wasm");
    let eval = mst_tests::Eval::new(
        serde_json::json!({
            "name": "e2e",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {"command": ["cat"]},
            "judges": [{"plugin": s(&hostile), "options": {"behaviour": "sleep", "count": 120}}],
            "plugins": [s(&hostile)],
            "concurrency": 1,
            "timeout": 20
        }),
        &mst_tests::cases(1),
    );
    let started = Instant::now();
    let run = eval.run(&mst, &["--json", "-q", "--plugin-timeout", "3"]);
    let elapsed = started.elapsed();
    eprintln!("a run whose judge sleeps 120 s under a 3 s limit took {elapsed:?}");
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(run.json()["variants"]["default"]["notGraded"], 1);
    let grades = mst_tests::read_json(&eval.run_dir("e2e").join("grades.json"));
    assert!(
        grades[0]["grade"]["error"]
            .as_str()
            .unwrap()
            .contains("time limit of 3.0s, waiting in a host call"),
        "{grades}"
    );
    assert!(elapsed < Duration::from_secs(30), "took {elapsed:?}");
}

#[test]
fn a_broad_grant_to_a_judge_is_warned_about_before_the_run() {
    let mst = Mst::new();
    let hostile = fixture("hostile.wasm");
    // The config's plugin entry grants what the judge may run (`allowExec`).
    let run_granting = |programs: &[&str]| {
        let eval = mst_tests::Eval::new(
            serde_json::json!({
                "name": "e2e",
                "datasets": ["cases.jsonl"],
                "client": "command",
                "clientOptions": {"command": ["cat"]},
                "judges": [{"plugin": s(&hostile), "options": {"behaviour": "ok"}}],
                "plugins": [{"path": s(&hostile), "allowExec": programs}],
                "concurrency": 1,
                "timeout": 20
            }),
            &mst_tests::cases(1),
        );
        eval.run(&mst, &[])
    };
    let granted = run_granting(&["python3", "echo"]);
    assert_eq!(granted.code, 0, "{}", granted.stderr);
    assert!(
        granted.stderr.contains(
            "plugin mst/fixture/hostile: it declared `python3 -c *`, and `python3` runs \
             whatever script or program it is given, which you granted: that admits any command"
        ),
        "{}",
        granted.stderr
    );
    // `echo *` is narrow: no warning for it, nor for what is declared but not granted.
    let narrow = run_granting(&["echo"]);
    assert_eq!(narrow.code, 0, "{}", narrow.stderr);
    assert!(
        !narrow.stderr.contains("admits any command"),
        "{}",
        narrow.stderr
    );
}

#[test]
fn a_cache_others_can_write_is_refused() {
    use std::os::unix::fs::PermissionsExt;
    let mst = Mst::new();
    let check = || mst.run(&["plugin", "check", s(&fixture("hostile.wasm"))]);
    // The first load fills the cache, owner-only.
    assert_eq!(check().code, 0);
    let cache = mst.home.path().join("cache");
    let artifact = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .find(|e| e.path().extension().is_some_and(|x| x == "cwasm"))
        .expect("an artifact was cached")
        .path();

    std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o666)).unwrap();
    let refused = check();
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("refusing the compiled-plugin cache file")
            && refused.stderr.contains("writable by anyone (mode 666)"),
        "{}",
        refused.stderr
    );
    std::fs::set_permissions(&artifact, std::fs::Permissions::from_mode(0o600)).unwrap();

    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o770)).unwrap();
    let refused = check();
    assert_ne!(refused.code, 0, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("refusing the compiled-plugin cache directory")
            && refused.stderr.contains("writable by its group (mode 770)"),
        "{}",
        refused.stderr
    );
    std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(check().code, 0, "usable again once private");

    // SAFETY: geteuid(2) has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        // As root, the test can hand the artifact to another user (`nobody`).
        std::os::unix::fs::lchown(&artifact, Some(65534), None).unwrap();
        let refused = check();
        assert_ne!(refused.code, 0, "{}", refused.stdout);
        assert!(
            refused
                .stderr
                .contains("is owned by user id 65534, not by you (0)"),
            "{}",
            refused.stderr
        );
    }
}

#[test]
fn a_manifest_fed_to_kubectl_must_be_a_hardened_pod() {
    use std::os::unix::fs::PermissionsExt;
    let mst = Mst::new();
    // A kubectl stand-in (no cluster can run here): it records what it was fed.
    let bin = tempfile::tempdir().unwrap();
    let fed = bin.path().join("fed");
    let kubectl = bin.path().join("kubectl");
    std::fs::write(
        &kubectl,
        format!(
            "#!/bin/sh\ncat >> '{}'\necho pod/mst-x created\n",
            fed.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&kubectl, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let apply = |manifest: &serde_json::Value| {
        let options = serde_json::json!({"behaviour": "kubectl", "message": manifest.to_string()});
        mst_tests::Run::from(
            mst.command(&[
                "plugin",
                "grade",
                s(&fixture("hostile.wasm")),
                "--answer",
                "x",
                "--options",
                &options.to_string(),
                "--allow-exec",
                "kubectl",
            ])
            .env("PATH", &path)
            .output()
            .unwrap(),
        )
    };
    let privileged = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mst-x"},
        "spec": {
            "hostNetwork": true,
            "serviceAccountName": "cluster-admin-sa",
            "volumes": [{"name": "root", "hostPath": {"path": "/"}}],
            "containers": [{"name": "c", "image": "busybox",
                "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "db", "key": "pw"}}}],
                "securityContext": {"privileged": true}}]
        }
    });
    let refused = apply(&privileged);
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("failed (denied): the manifest it feeds kubectl is refused")
            && refused.stderr.contains("spec.hostNetwork is not allowed")
            && refused
                .stderr
                .contains("spec.serviceAccountName is not allowed")
            && refused
                .stderr
                .contains("spec.containers[0].env is not allowed")
            && refused
                .stderr
                .contains("spec.volumes[0].hostPath is not allowed")
            && refused
                .stderr
                .contains("spec.containers[0].securityContext.privileged is true"),
        "{}",
        refused.stderr
    );
    assert!(!fed.exists(), "kubectl never saw the manifest");

    let hardened = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mst-x"},
        "spec": {
            "automountServiceAccountToken": false,
            "containers": [{"name": "c", "image": "busybox",
                "securityContext": {"allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]}}}]
        }
    });
    let applied = apply(&hardened);
    assert_eq!(applied.code, 0, "{}", applied.stderr);
    assert!(
        applied.stdout.contains("kubectl: pod/mst-x created"),
        "{}",
        applied.stdout
    );
    assert!(std::fs::read_to_string(&fed).unwrap().contains("\"mst-x\""));
}
