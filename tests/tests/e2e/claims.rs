//! Behaviours the docs promise, each pinned by a test against real components and processes:
//! an installed runner plugin runs with `--runner NAME` alone; `mst plugin check --dry-run`
//! takes an installed name and one case of the user's own eval; a judge naming a plugin of the
//! wrong kind (or none) stops the run before any machine; a trace the coordinator refuses
//! counts as infra; `waitMs`/`createMs`/`readyMs` as `docs/results.md` defines them; a closed
//! stdout ends a command quietly; `mst runs list` spells phases one way.

use mst_tests::{command_eval, plugin, read_json, read_trace, s, stand_in_worker, Eval, Mst};
use serde_json::json;
use std::io::Read;
use std::process::Stdio;

const HOSTILE: &str = "mst/fixture/hostile-runner";

/// The hostile runner's options and grant for a working machine whose files go below `dir`.
fn shell_runner(dir: &std::path::Path) -> Vec<String> {
    let dir = format!("dir={}", s(&dir.join("machines")));
    [
        "--runner-option",
        "behaviour=shell",
        "--runner-option",
        &dir,
    ]
    .into_iter()
    .chain(["--allow-exec", "sh"])
    .map(String::from)
    .collect()
}

/// `mst` with the hostile runner fixture installed in its home.
fn with_installed_runner() -> Mst {
    let mst = Mst::new();
    let installed = mst.run(&[
        "plugin",
        "install",
        s(&mst_tests::fixture("hostile-runner.wasm")),
    ]);
    assert_eq!(installed.code, 0, "{}", installed.stderr);
    mst
}

#[test]
fn an_installed_runner_plugin_runs_with_runner_alone() {
    let mst = with_installed_runner();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 3, 30);
    let mut args = vec!["--runner".to_string(), HOSTILE.to_string()];
    args.extend(shell_runner(eval.dir.path()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = eval.run(&mst, &args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    assert_eq!(record["runner"], HOSTILE);
    assert_eq!(record["machines"][0]["ended"]["status"], "done");
    let plugin = &record["plugins"][0];
    assert_eq!(plugin["name"], HOSTILE, "{record}");
    assert_eq!(plugin["source"], "installed", "{plugin}");
    assert_eq!(plugin["granted"]["exec"][0]["program"], "sh", "{plugin}");
    // A name that is neither built in, loaded nor installed says what the runners are.
    let typo = eval.run(&mst, &["--runner", "dokcer"]);
    assert_eq!(typo.code, 2, "{}", typo.stderr);
    assert!(
        typo.stderr
            .contains("the built-in runners are `local`, `docker` and `sim`"),
        "{}",
        typo.stderr
    );
}

#[test]
fn a_dry_run_takes_an_installed_name_and_a_case_of_the_users_eval() {
    let mst = with_installed_runner();
    let cases = [
        json!({"id": "first", "input": "one", "expected": "one"}),
        json!({"id": "second", "input": "two", "expected": "no such answer"}),
    ];
    let config = json!({
        "name": "own",
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": ["sh", "-c", "read q; echo \"$q\""]},
        "judges": [{"assert": "contains", "value": "one"}],
        "variants": {"a": {}, "b": {}},
    });
    let eval = Eval::new(config, &cases);
    let dry_run = |case: &str| {
        let mut args: Vec<String> = ["plugin", "check", HOSTILE, "--dry-run", "--json"]
            .into_iter()
            .map(String::from)
            .collect();
        args.extend(["--config".into(), s(&eval.config()).into()]);
        args.extend(["--case".into(), case.into()]);
        args.extend(shell_runner(eval.dir.path()));
        mst.run(&args)
    };
    let passed = dry_run("first");
    assert_eq!(passed.code, 0, "{}\n{}", passed.stdout, passed.stderr);
    let trial = &passed.json()["dryRun"]["steps"][3];
    assert_eq!(trial["name"], "one trial");
    assert_eq!(trial["status"], "ok", "{trial}");
    let detail = trial["detail"].as_str().unwrap();
    assert!(
        detail.contains("case `first`") && detail.contains("passed its judges"),
        "{detail}"
    );
    // A case that fails its judges still proves the runner: collected is what counts.
    let failed = dry_run("second");
    assert_eq!(failed.code, 0, "{}\n{}", failed.stdout, failed.stderr);
    let detail = failed.json()["dryRun"]["steps"][3]["detail"].clone();
    assert!(
        detail.as_str().unwrap().contains("did not pass"),
        "{detail}"
    );
    // A case the eval does not hold makes no machine, and says so.
    let unknown = dry_run("nope");
    assert_eq!(unknown.code, 1, "{}\n{}", unknown.stdout, unknown.stderr);
    assert_eq!(unknown.json()["dryRun"]["steps"][1]["status"], "failed");
    assert!(
        !eval.results().exists(),
        "the dry run writes its results elsewhere"
    );
}

#[test]
fn a_dry_runs_case_that_needs_a_secret_takes_a_secrets_file() {
    let mst = with_installed_runner();
    let config = json!({
        "name": "own",
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": ["sh", "-c", "echo \"token of $((${#TOKEN})) chars\""],
                          "secretEnv": {"TOKEN": "DRY_SECRET"}},
        "judges": [{"assert": "contains", "value": "token of 12 chars"}],
    });
    let eval = Eval::new(config, &[json!({"id": "first", "input": "one"})]);
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "DRY_SECRET=dry-canary-1\n").unwrap();
    let dry_run = |extra: &[&str]| {
        let mut args: Vec<String> = ["plugin", "check", HOSTILE, "--dry-run", "--json"]
            .into_iter()
            .map(String::from)
            .collect();
        args.extend(["--config".into(), s(&eval.config()).into()]);
        args.extend(["--case".into(), "first".into()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        args.extend(shell_runner(eval.dir.path()));
        mst.run(&args)
    };
    let without = dry_run(&[]);
    assert_ne!(without.code, 0, "{}\n{}", without.stdout, without.stderr);
    assert!(
        format!("{}{}", without.stdout, without.stderr).contains("DRY_SECRET"),
        "{}\n{}",
        without.stdout,
        without.stderr
    );
    let with = dry_run(&["--secrets-file", s(&secrets)]);
    assert_eq!(with.code, 0, "{}\n{}", with.stdout, with.stderr);
    let trial = &with.json()["dryRun"]["steps"][3];
    assert_eq!(trial["status"], "ok", "{trial}");
    assert!(
        trial["detail"]
            .as_str()
            .unwrap()
            .contains("passed its judges"),
        "{trial}"
    );
    assert!(!with.stdout.contains("dry-canary-1") && !with.stderr.contains("dry-canary-1"));
}

#[test]
fn a_judge_naming_a_plugin_of_another_kind_stops_the_run_before_any_machine() {
    let mst = Mst::new();
    let mut config = json!({
        "name": "e2e",
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": ["sh", "-c", "touch ran; cat"]},
        "plugins": [s(&plugin("jsonl.wasm"))],
        "judges": [{"name": "answers", "plugin": "mst/dataset/jsonl"}],
    });
    let eval = Eval::new(config.clone(), &mst_tests::cases(2));
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("judges[0] (`answers`)")
            && run
                .stderr
                .contains("is a dataset plugin, not a grader plugin"),
        "{}",
        run.stderr
    );
    assert!(!eval.results().exists(), "no run was started");

    config["judges"] = json!([{"plugin": "acme/grader/missing"}]);
    let eval = Eval::new(config, &mst_tests::cases(2));
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("acme/grader/missing"), "{}", run.stderr);
    assert!(!eval.results().exists(), "no run was started");
}

#[test]
fn a_trace_the_coordinator_refuses_counts_as_infra_not_missing() {
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["cat"]}}),
        &[
            json!({"id": "c1", "input": "x"}),
            json!({"id": "c2", "input": "y"}),
        ],
    );
    // A worker that reports both trials collected, having written a trace that names another
    // case for c1 and a link to a host file for c2.
    let key = |case: &str| format!(r#"{{"variant":"default","case":"{case}","trial":0}}"#);
    let script = format!(
        r#"while [ $# -gt 0 ]; do [ "$1" = --results ] && r=$2; shift; done
mkdir -p "$r/default/c1" "$r/default/c2"
echo '{{"case":{{"id":"other","input":"x"}},"variant":"default","trial":0,"trace":{{}}}}' > "$r/default/c1/0.json"
ln -s /etc/passwd "$r/default/c2/0.json"
echo "$HELLO"
for k in '{k1}' '{k2}'; do
  echo '{{"type":"acquire","key":'"$k"',"servers":[]}}'
  read granted
  echo '{{"type":"trial","key":'"$k"',"status":"collected","path":"x"}}'
done
echo '{{"type":"done","counts":{{"collected":2,"infra":0,"skipped":0}},"cleanup":"ok"}}'
"#,
        k1 = key("c1"),
        k2 = key("c2"),
    );
    let worker_option = stand_in_worker(eval.dir.path(), "forger.sh", &script);
    let forged = eval.run(&mst, &["--json", "-q", "--runner-option", &worker_option]);
    assert_eq!(forged.code, 1, "{}\n{}", forged.stdout, forged.stderr);
    let summary = forged.json();
    assert_eq!(summary["collect"], "complete", "{summary}");
    assert_eq!(summary["variants"]["default"]["infra"], 2, "{summary}");
    assert!(
        summary["missing"].as_array().unwrap().is_empty(),
        "{summary}"
    );
    for (case, says) in [("c1", "the trace is for"), ("c2", "symbolic link")] {
        let trace = read_trace(&eval.run_dir("e2e"), &format!("default/{case}/0"));
        assert_eq!(trace["trace"]["status"], "infra", "{trace}");
        assert_eq!(trace["case"]["id"], case, "the coordinator's own record");
        let reason = trace["trace"]["events"][0]["text"].as_str().unwrap();
        assert!(
            reason.contains("its trace was refused") && reason.contains(says),
            "{reason}"
        );
    }
    assert!(mst_tests::files_containing(&eval.results(), "root:x:0:0").is_empty());
}

#[test]
fn machine_times_count_from_the_start_of_the_machine() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 2, 30);
    assert_eq!(eval.run(&mst, &["-q"]).code, 0);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machine = &record["machines"][0];
    let (wait, create, ready) = (
        machine["waitMs"].as_u64().expect("waitMs"),
        machine["createMs"].as_u64().expect("createMs"),
        machine["readyMs"].as_u64().expect("readyMs"),
    );
    // The local runner never waits for room; the worker is ready after its machine is made.
    assert!(wait < 1_000, "{machine}");
    assert!(ready >= create, "{machine}");
}

#[test]
fn a_closed_stdout_ends_a_command_quietly_and_phases_are_spelled_one_way() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 2, 30);
    for _ in 0..2 {
        assert_eq!(eval.run(&mst, &["-q"]).code, 0);
    }
    let list = mst.run(&["runs", "list", "--results-dir", s(&eval.results())]);
    assert_eq!(list.code, 0, "{}", list.stderr);
    assert!(
        list.stdout.contains("complete") && !list.stdout.contains("Complete"),
        "{}",
        list.stdout
    );
    // The reader goes away before mst writes a byte (`mst plugin check … | true`).
    let mut child = mst
        .command(&["plugin", "check", s(&plugin("contains.wasm")), "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(141), "{stderr}");
    assert!(stderr.is_empty(), "quietly: {stderr}");
}

#[test]
fn the_quickstart_trial_grades_as_its_readme_says() {
    let mst = Mst::new();
    let trial = mst_tests::root().join("examples/quickstart/trial.json");
    let contains = mst.run(&[
        "plugin",
        "grade",
        s(&plugin("contains.wasm")),
        "--trial",
        s(&trial),
    ]);
    assert_eq!(contains.code, 0, "{}\n{}", contains.stdout, contains.stderr);
    assert!(contains.stdout.starts_with("pass"), "{}", contains.stdout);
    let json_grader = mst.run(&[
        "plugin",
        "grade",
        s(&plugin("json.wasm")),
        "--trial",
        s(&trial),
        "--options",
        r#"{"path": "$.timezone", "equals": "Asia/Tokyo"}"#,
    ]);
    assert_eq!(
        json_grader.code, 0,
        "{}\n{}",
        json_grader.stdout, json_grader.stderr
    );
}

#[test]
fn tokens_over_the_line_cap_are_a_config_error_before_any_machine() {
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "mcp",
               "servers": {"api": {"url": "http://127.0.0.1:9/mcp", "token": "BIG"}}}),
        &[json!({"id": "c1", "input": {"tool": "echo", "arguments": {}}})],
    );
    let secrets = eval.dir.path().join("secrets.json");
    std::fs::write(&secrets, json!({"BIG": "x".repeat(70_000)}).to_string()).unwrap();
    std::fs::set_permissions(
        &secrets,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    let run = eval.run(&mst, &["-q", "--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("65536-byte cap"), "{}", run.stderr);
    assert!(!run.stderr.contains("xxxx"), "the value never shows");
    assert!(!eval.results().exists(), "no run was started");
}

#[test]
fn a_worker_asking_for_another_servers_token_loses_its_shard() {
    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 1, 30);
    let secrets = eval.dir.path().join("secrets.json");
    std::fs::write(&secrets, json!({"OTHER": "canary-4b1d"}).to_string()).unwrap();
    std::fs::set_permissions(
        &secrets,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )
    .unwrap();
    // The bundle names no server; the worker asks for one anyway.
    let script = r#"echo "$HELLO"
echo '{"type":"need-tokens","servers":["api"],"reason":"start"}'
read reply
echo "$reply" > "$0.reply"
sleep 5
"#;
    let worker_option = stand_in_worker(eval.dir.path(), "asker.sh", script);
    let args = [
        "-q",
        "--secrets-file",
        s(&secrets),
        "--runner-option",
        &worker_option,
    ];
    let run = eval.run(&mst, &args);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(reason.contains("token of server `api`"), "{reason}");
    assert!(mst_tests::files_containing(&eval.results(), "canary-4b1d").is_empty());
}
