//! The `docker` runner end to end against two real Docker engines (`cargo xtask test` starts
//! them and imports the busybox test image offline): shards over two hosts, a container that
//! vanishes mid-run then `--resume`, out of memory with `keep=failed`, orphan clean-up after a
//! SIGKILL, a hostile worker image, a hostile runner plugin reaching for a network engine,
//! what a trial inside a container can and cannot do, and an engine reached over ssh.

use mst_tests::model_server::{assert_both_orders, judge_preferring, ModelServer, Reply};
use mst_tests::serve::Serve;
use mst_tests::sshd;
use mst_tests::{
    assert_resumed, command_eval, only_run, read_json, read_trace, s, wait_for_run,
    wait_for_traces, walk, Eval, Mst, Run,
};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The two engines' endpoints, or `None` (test skipped) when none were given and not required.
fn engines() -> Option<(String, String)> {
    match (
        std::env::var("MST_TEST_DOCKER_A"),
        std::env::var("MST_TEST_DOCKER_B"),
    ) {
        (Ok(a), Ok(b)) => Some((a, b)),
        _ if std::env::var_os("MST_REQUIRE_DOCKER").is_some() => {
            panic!("MST_TEST_DOCKER_A and _B are unset: run `cargo xtask test`")
        }
        _ => {
            eprintln!("skipped: no Docker engines (run `cargo xtask test`)");
            None
        }
    }
}

/// `mst runner setup docker` on both engines, once per test binary.
fn engines_with_worker_image() -> Option<(String, String)> {
    let (a, b) = engines()?;
    static SETUP: OnceLock<()> = OnceLock::new();
    SETUP.get_or_init(|| {
        let base = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
        let run = Mst::new().run(&[
            "runner",
            "setup",
            "docker",
            "--runner-option",
            &format!("contexts={a},{b}"),
            "--runner-option",
            &format!("base={base}"),
        ]);
        assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
        assert_eq!(
            run.stdout.matches("built mst-worker:").count(),
            2,
            "{}",
            run.stdout
        );
    });
    Some((a, b))
}

fn docker(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(["--host", endpoint])
        .args(args)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .expect("docker CLI");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Names of the containers of `run_id` on `endpoint`, kept ones included.
fn containers_of(endpoint: &str, run_id: &str) -> Vec<String> {
    docker(
        endpoint,
        &[
            "ps",
            "-a",
            "--filter",
            &format!("label=mst.run={run_id}"),
            "--format",
            "{{.Names}}",
        ],
    )
    .lines()
    .map(String::from)
    .collect()
}

fn docker_run(eval: &Eval, mst: &Mst, options: &[String]) -> Run {
    docker_run_with(eval, mst, &[], options)
}

/// [`docker_run`] with `extra` arguments before the runner's.
fn docker_run_with(eval: &Eval, mst: &Mst, extra: &[&str], options: &[String]) -> Run {
    let mut args = extra.to_vec();
    args.extend(["--runner", "docker"]);
    for option in options {
        args.extend(["--runner-option", option.as_str()]);
    }
    eval.run(mst, &args)
}

/// `secrets` (`NAME=value` lines) written to a secrets file in `eval`'s directory, and the
/// arguments that run it quietly with JSON output.
fn with_secrets(eval: &Eval, secrets: &str) -> [String; 4] {
    let file = eval.dir.path().join("secrets.env");
    std::fs::write(&file, secrets).unwrap();
    ["--json", "-q", "--secrets-file", s(&file)].map(String::from)
}

/// The runner options of a kept container on engine `endpoint` from the worker image.
fn kept_on(endpoint: &str) -> Vec<String> {
    vec![
        format!("contexts={endpoint}"),
        format!("image=mst-worker:{}", env!("CARGO_PKG_VERSION")),
        "keep=always".into(),
    ]
}

fn run_id(eval: &Eval) -> String {
    let dir = eval.run_dir("e2e");
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

#[test]
fn runner_check_tries_the_docker_runner_one_machine_and_one_trial_at_a_time() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let context = format!("contexts={a}");
    let args = [
        "runner",
        "check",
        "docker",
        "--json",
        "--runner-option",
        &context,
    ];
    let run = mst.run(&args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let steps = run.json()["steps"].clone();
    let names: Vec<&str> = (steps.as_array().unwrap().iter())
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, mst_tests::DRY_RUN_STEPS, "{steps}");
    for step in steps.as_array().unwrap() {
        assert_eq!(step["status"], "ok", "{step}");
    }
    // A wrong option fails the first step, and nothing is made.
    let bad = mst.run(&[
        "runner",
        "check",
        "docker",
        "--runner-option",
        "network=sideways",
    ]);
    assert_eq!(bad.code, 1, "{}\n{}", bad.stdout, bad.stderr);
    assert!(
        bad.stdout.contains("options          FAILED"),
        "{}",
        bad.stdout
    );
}

#[test]
fn four_shards_over_two_hosts_collect_every_trial() {
    let Some((a, b)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 16, 30);
    let run = docker_run(
        &eval,
        &mst,
        &[
            format!("contexts={a},{b}"),
            "shards=4".into(),
            "memory=256m".into(),
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.stderr.matches("has ").count(),
        2,
        "one capacity line per host: {}",
        run.stderr
    );
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["collect"], "complete", "{summary}");
    assert_eq!(summary["variants"]["default"]["passed"], 16, "{summary}");
    let record = read_json(&dir.join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    assert!(machines.len() >= 3, "{machines:?}");
    let mut contexts: Vec<&str> = machines
        .iter()
        .map(|m| {
            assert_eq!(m["ended"]["status"], "done", "{m}");
            assert_eq!(m["worker"]["mst"], env!("CARGO_PKG_VERSION"));
            assert_eq!(
                m["placement"]["image"],
                format!("mst-worker:{}", env!("CARGO_PKG_VERSION"))
            );
            assert!(m["placement"]["imageId"]
                .as_str()
                .unwrap()
                .starts_with("sha256:"));
            m["placement"]["context"].as_str().unwrap()
        })
        .collect();
    contexts.sort();
    contexts.dedup();
    assert_eq!(contexts.len(), 2, "both hosts ran shards: {machines:?}");
    let id = run_id(&eval);
    assert!(containers_of(&a, &id).is_empty() && containers_of(&b, &id).is_empty());
}

/// Waits until `path` holds at least `n` trace files.
/// Starts `mst run` on `eval` with the docker runner and `options`, in the background; once its
/// container exists on `endpoint`, returns the process, the run directory and the run id.
fn start_run(
    mst: &Mst,
    eval: &Eval,
    endpoint: &str,
    options: &[String],
) -> (std::process::Child, PathBuf, String) {
    let config = eval.config();
    let results = eval.results();
    let mut args = vec![
        "run".to_string(),
        "--config".into(),
        s(&config).into(),
        "--results-dir".into(),
        s(&results).into(),
        "--runner".into(),
        "docker".into(),
    ];
    for option in options {
        args.extend(["--runner-option".to_string(), option.clone()]);
    }
    let child = mst.spawn(&args);
    let dir = wait_for_run(&results, "e2e");
    let id = dir.file_name().unwrap().to_str().unwrap().to_string();
    let started = Instant::now();
    while containers_of(endpoint, &id).is_empty() {
        assert!(started.elapsed() < Duration::from_secs(60), "no container");
        std::thread::sleep(Duration::from_millis(100));
    }
    (child, dir, id)
}

#[test]
fn a_container_that_vanishes_mid_run_leaves_missing_trials_that_resume_collects() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let eval = command_eval(
        json!(["sh", "-c", "read q; sleep 0.4; echo \"$q\""]),
        10,
        30,
    );
    let options = [format!("contexts={a}"), "memory=256m".into()];
    let (child, dir, id) = start_run(&mst, &eval, &a, &options);
    wait_for_traces(&dir, 2, Duration::from_secs(60));
    let names = containers_of(&a, &id);
    assert_eq!(names.len(), 1, "{names:?}");
    docker(&a, &["rm", "-f", "-v", &names[0]]);
    let first: Run = child.wait_with_output().unwrap().into();
    assert_eq!(
        first.code, 2,
        "a partial collection exits 2\n{}\n{}",
        first.stdout, first.stderr
    );
    let record = read_json(&dir.join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    // `docker rm -f` kills, then removes: the runner sees one or the other.
    assert!(
        reason.contains("vanished mid-run") || reason.contains("stopped (exit code 137)"),
        "{}",
        record["machines"]
    );
    let missing = read_json(&dir.join("summary.json"))["missing"]
        .as_array()
        .unwrap()
        .len();
    assert!((1..10).contains(&missing), "{missing}");

    let mut args = vec!["--resume", &id, "--runner", "docker"];
    for option in &options {
        args.extend(["--runner-option", option.as_str()]);
    }
    assert_resumed(&eval.run(&mst, &args), missing);
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["collect"], "complete");
    assert_eq!(summary["variants"]["default"]["passed"], 10);
}

#[test]
fn out_of_memory_is_an_infrastructure_failure_and_keep_failed_keeps_the_container() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    // The shell grows to hundreds of MiB holding the pipe's output; the limit is 48 MiB.
    let eval = command_eval(
        json!([
            "sh",
            "-c",
            "read q; x=$(head -c 400000000 /dev/zero | tr '\\0' a); echo done"
        ]),
        1,
        60,
    );
    let run = docker_run(
        &eval,
        &mst,
        &[
            format!("contexts={a}"),
            "memory=48m".into(),
            "keep=failed".into(),
        ],
    );
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let record = read_json(&dir.join("run.json"));
    let machine = &record["machines"][0];
    assert!(
        machine["ended"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("ran out of memory (limit 48 MiB)"),
        "{machine}"
    );
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["variants"]["default"]["infra"], 1, "{summary}");
    let kept = machine["kept"]["at"].as_str().unwrap();
    let names = containers_of(&a, &run_id(&eval));
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(
        names[0].ends_with("-kept") && kept.contains(&names[0]),
        "{names:?} {kept}"
    );
    docker(&a, &["rm", "-f", "-v", &names[0]]);
}

#[test]
fn a_containers_artefacts_come_back_and_its_kept_machine_says_how_to_get_in() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    // Case c1 passes, c2 fails; each leaves a report, c2 hangs a process in the background
    // that the diagnosis must show (it waits until that process is `sleep`: a forked shell
    // caught before its exec would be listed as `[sh]`).
    let agent = r#"read q
echo "report of $q" > "$MST_ARTIFACTS/report.txt"
case "$q" in *2) sleep 41 & until grep -qs sleep /proc/$!/comm; do :; done
  echo "failing on $q" >&2; exit 4;; esac
echo ok"#;
    let eval = command_eval(json!(["sh", "-c", agent]), 2, 30);
    let run = docker_run(
        &eval,
        &mst,
        &[format!("contexts={a}"), "keep=failed".into()],
    );
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let read = |path: &str| std::fs::read_to_string(dir.join("artifacts").join(path)).unwrap();
    assert_eq!(read("default/c1/0/report.txt"), "report of question 1\n");
    assert_eq!(read("default/c2/0/report.txt"), "report of question 2\n");
    assert!(!dir.join("artifacts/default/c1/0/mst-diagnosis").exists());
    assert_eq!(
        read("default/c2/0/mst-diagnosis/stderr.txt"),
        "failing on question 2\n"
    );
    let system: Value =
        serde_json::from_str(&read("default/c2/0/mst-diagnosis/system.json")).unwrap();
    assert_eq!(
        system["failure"], "the client exited with code 4",
        "{system}"
    );
    let processes = read("default/c2/0/mst-diagnosis/processes.txt");
    // The container's own processes: its worker, and what the agent left running.
    assert!(processes.contains("mst collect"), "{processes}");
    assert!(processes.contains("sleep 41"), "{processes}");

    // One trial failed: the container is kept, and the way in that mst printed works.
    let record = read_json(&dir.join("run.json"));
    let machine = &record["machines"][0];
    assert_eq!(machine["failedTrials"], 1, "{machine}");
    assert_eq!(machine["artifacts"]["trials"], 2, "{machine}");
    let enter = machine["kept"]["enter"].as_str().unwrap();
    assert!(
        run.stdout.contains(&format!("get in: {enter}")),
        "{}",
        run.stdout
    );
    let names = containers_of(&a, &run_id(&eval));
    assert_eq!(names.len(), 1, "{names:?}");
    assert_eq!(
        enter,
        format!("docker -H {a} exec -it {} sh", names[0]),
        "{enter}"
    );
    // The same command without a terminal (`-i` only), fed a line on stdin.
    let inside = Command::new("sh")
        .args(["-c", &enter.replace("exec -it", "exec -i")])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(b"ls /mst-work/artifacts/default/c2/0\n")?;
            child.wait_with_output()
        })
        .unwrap();
    let listed = String::from_utf8_lossy(&inside.stdout);
    assert!(
        listed.contains("report.txt") && listed.contains("mst-diagnosis"),
        "{listed}"
    );
    docker(&a, &["rm", "-f", "-v", &names[0]]);
}

#[test]
fn checks_run_inside_the_container_after_the_agent_and_grade_what_it_left() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    // A shell project (the offline test image has no Python): the agent writes its answer
    // into a file, right for c1 and wrong for c2; the check runs the project's test script
    // in the trial's directory inside the container, and says which machine it ran on.
    let agent = r#"read q
printf '#!/bin/sh\ngrep -qx 42 answer.txt\n' > test.sh
case "$q" in *1) echo 42 > answer.txt;; *) echo 41 > answer.txt;; esac"#;
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent]},
               "checks": [{"name": "answer", "run": ["sh", "-c", "cat /etc/hostname; sh test.sh"],
                           "timeout": 30}],
               "judges": [{"assert": "check-passed", "value": "answer"}], "timeout": 30}),
        &mst_tests::cases(2),
    );
    let run = docker_run(&eval, &mst, &[format!("contexts={a}")]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["variants"]["default"]["passed"], 1, "{summary}");
    assert_eq!(summary["variants"]["default"]["failed"], 1, "{summary}");
    let check = |trial: &str| {
        let trace = read_trace(&dir, trial);
        trace["trace"]["events"].as_array().unwrap().last().unwrap()["data"].clone()
    };
    let (right, wrong) = (check("default/c1/0"), check("default/c2/0"));
    assert_eq!(
        (right["passed"].clone(), wrong["exitCode"].clone()),
        (json!(true), json!(1))
    );
    // It ran in the container: the hostname it printed is the container's, not this host's.
    let printed = right["stdout"].as_str().unwrap().trim().to_string();
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(!printed.is_empty() && printed != host.trim(), "{printed}");
}

#[test]
fn a_workspace_and_hidden_check_files_reach_the_container_each_in_its_time() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    // The workspace holds a wrong answer; the hidden test wants 42. `search` looks through the
    // whole container for the hidden test's mark and the workspace's (patterns built at run
    // time and read from a file outside the search, so neither the bundle holding this script
    // nor a diagnosis listing its processes matches), then fixes the answer. One trial at a
    // time: trials sharing a container share its user, so a concurrent agent could read
    // another trial's work directory once its hidden files are laid (docs/config.md).
    let search = r#"m=HIDDEN; v=VISIBLE; m=${m}_MARK_7; v=${v}_MARK_7
dirs=$(ls / | grep -v -e '^proc$' -e '^sys$' -e '^dev$')
printf '%s\n' "$m" > /dev/shm/hidden; printf '%s\n' "$v" > /dev/shm/visible
for d in $dirs; do grep -rls -f /dev/shm/hidden "/$d"; done > /tmp/hidden
for d in $dirs; do grep -rls -f /dev/shm/visible "/$d"; done > /tmp/visible
echo 42 > answer.txt; echo "hidden: $(cat /tmp/hidden)visible: $(wc -l < /tmp/visible)""#;
    let agent = |script: &str| json!({"clientOptions": {"command": ["sh", "-c", script]}});
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"input": "none"},
               "variants": {"fix": agent("echo 42 > answer.txt; echo fixed"),
                            "nop": agent("echo did nothing"), "search": agent(search)},
               "workspace": "task",
               "checks": [{"name": "tests", "run": ["sh", "hidden_test.sh"], "files": "tests",
                           "timeout": 30}],
               "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 60,
               "concurrency": 1}),
        &[json!({"id": "c", "input": "x"})],
    );
    let root = eval.dir.path();
    std::fs::create_dir_all(root.join("task")).unwrap();
    std::fs::write(root.join("task/answer.txt"), "41\n# VISIBLE_MARK_7\n").unwrap();
    std::fs::create_dir_all(root.join("tests")).unwrap();
    std::fs::write(
        root.join("tests/hidden_test.sh"),
        "# HIDDEN_MARK_7\ngrep -qx 42 answer.txt\n",
    )
    .unwrap();
    let run = docker_run(&eval, &mst, &[format!("contexts={a}")]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    for (variant, passed) in [("fix", 1), ("search", 1), ("nop", 0)] {
        assert_eq!(
            summary["variants"][variant]["passed"], passed,
            "{variant}: {summary}"
        );
        assert_eq!(
            summary["variants"][variant]["infra"], 0,
            "{variant}: {summary}"
        );
    }
    let trace = read_trace(&dir, "search/c/0");
    let found = trace["trace"]["finalText"]
        .as_str()
        .unwrap()
        .trim()
        .to_string();
    // Nothing of the hidden test; the workspace, in its work directory and its bundle.
    let visible = found.strip_prefix("hidden: visible: ").expect(&found);
    assert!(visible.trim().parse::<u32>().unwrap() >= 1, "{found}");
    assert!(containers_of(&a, &run_id(&eval)).is_empty());
}

#[test]
fn cases_naming_their_own_image_run_in_shards_of_that_image_built_by_setup() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let base = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
    let task = tempfile::tempdir().unwrap();
    std::fs::write(
        task.path().join("Dockerfile"),
        format!("FROM {base}\nRUN echo from-the-task-image > /task-marker\n"),
    )
    .unwrap();
    let image = "mst-task/e2e-marker:1";
    let built = mst.run(&[
        "runner",
        "setup",
        "docker",
        "--build",
        s(task.path()),
        "--runner-option",
        &format!("image={image}"),
        "--runner-option",
        &format!("contexts={a}"),
    ]);
    assert_eq!(built.code, 0, "{}\n{}", built.stdout, built.stderr);
    assert!(
        built.stdout.contains(&format!("built {image} (sha256:")),
        "{}",
        built.stdout
    );

    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "cat /task-marker || echo no marker"],
                                 "input": "none"},
               "judges": [{"assert": "contains", "value": "from-the-task-image"}], "timeout": 60}),
        &[
            json!({"id": "own", "input": "x", "image": image}),
            json!({"id": "plain", "input": "x"}),
        ],
    );
    let run = docker_run(&eval, &mst, &[format!("contexts={a}")]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let summary = read_json(&dir.join("summary.json"));
    // The case with its image found the task's file; the other ran in the runner's image.
    assert_eq!(summary["cases"]["default"]["own"], "passed", "{summary}");
    assert_eq!(summary["cases"]["default"]["plain"], "failed", "{summary}");
    // One shard per image, each recording the image it ran (its worker said so).
    let record = read_json(&dir.join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    let digests: std::collections::BTreeSet<&str> = machines
        .iter()
        .map(|m| m["worker"]["image"].as_str().expect("an image digest"))
        .collect();
    assert_eq!((machines.len(), digests.len()), (2, 2), "{record}");
    assert!(
        digests.iter().all(|d| d.starts_with("sha256:")),
        "{digests:?}"
    );
    assert!(containers_of(&a, &run_id(&eval)).is_empty());

    // Another runner refuses it before anything starts.
    let local = eval.run(&mst, &["-q"]);
    assert_eq!(local.code, 2, "{}", local.stderr);
    assert!(
        local.stderr.contains("run on `--runner docker` only"),
        "{}",
        local.stderr
    );
}

/// A Harbor task `name` in `root`: its image has a `bash` (the test image's busybox has none)
/// and works in /app; the instruction asks for `hello` in /app/out.txt, the tests reward it,
/// and the solution writes `answer`.
fn harbor_task(root: &Path, name: &str, answer: &str) -> PathBuf {
    let base = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
    let dir = root.join(name);
    for sub in ["environment", "tests", "solution"] {
        std::fs::create_dir_all(dir.join(sub)).unwrap();
    }
    let write = |file: &str, text: String| std::fs::write(dir.join(file), text).unwrap();
    write(
        "task.toml",
        "version = \"1.0\"\n[metadata]\ndifficulty = \"easy\"\n[verifier]\ntimeout_sec = 30.0\n\
         [agent]\ntimeout_sec = 60.0\n[environment]\ncpus = 1\nmemory_mb = 512\n"
            .into(),
    );
    write("instruction.md", "Write hello to /app/out.txt.\n".into());
    write(
        "environment/Dockerfile",
        format!(
            "FROM {base}\nRUN printf '#!/bin/sh\\nexec sh \"$@\"\\n' > /bin/bash && chmod 755 /bin/bash \
             && mkdir -p /app\nWORKDIR /app\n"
        ),
    );
    write(
        "tests/test.sh",
        "#!/bin/bash\nif [ \"$(cat /app/out.txt 2>/dev/null)\" = hello ]; then\n  echo 1 > \
         /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
            .into(),
    );
    write(
        "solution/solve.sh",
        format!("#!/bin/bash\necho {answer} > out.txt\n"),
    );
    dir
}

#[test]
fn a_harbor_task_imported_runs_in_its_own_image_where_oracle_passes_and_nop_fails() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let tasks = tempfile::tempdir().unwrap();
    let good = harbor_task(tasks.path(), "say-hello", "hello");
    let broken = harbor_task(tasks.path(), "wrong-solution", "goodbye");
    let out = tempfile::tempdir().unwrap();
    let imported = mst.run(&["import", "harbor", s(tasks.path()), "--out", s(out.path())]);
    assert_eq!(imported.code, 0, "{}\n{}", imported.stdout, imported.stderr);
    assert!(
        imported.stdout.contains("mst runner setup docker --build"),
        "{}",
        imported.stdout
    );
    for (dir, image) in [
        (&good, "mst-harbor/say-hello:1"),
        (&broken, "mst-harbor/wrong-solution:1"),
    ] {
        let built = mst.run(&[
            "runner",
            "setup",
            "docker",
            "--build",
            s(&dir.join("environment")),
            "--runner-option",
            &format!("image={image}"),
            "--runner-option",
            &format!("contexts={a}"),
        ]);
        assert_eq!(built.code, 0, "{}\n{}", built.stdout, built.stderr);
    }
    let config = out.path().join("eval.json");
    let results = out.path().join("results");
    let run = mst.run(&[
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(&results),
        "--json",
        "-q",
        "--runner",
        "docker",
        "--runner-option",
        &format!("contexts={a}"),
        "--runner-option",
        "rootfs=writable",
    ]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    let cases = &summary["cases"];
    assert_eq!(cases["oracle"]["say-hello"], "passed", "{summary}");
    assert_eq!(cases["nop"]["say-hello"], "failed", "{summary}");
    assert_eq!(cases["nop"]["wrong-solution"], "failed", "{summary}");
    // The task whose oracle fails is broken, and the run says so.
    assert_eq!(
        summary["broken"],
        json!([{"case": "wrong-solution", "variant": "oracle", "expected": "pass"}]),
        "{summary}"
    );
    // Each trial on a container of its own, in its task's image, none left behind.
    let run_dir = only_run(&results, summary["eval"].as_str().unwrap());
    let record = read_json(&run_dir.join("run.json"));
    assert_eq!(record["machines"].as_array().unwrap().len(), 4, "{record}");
    let run_id = record["runId"].as_str().unwrap();
    assert!(containers_of(&a, run_id).is_empty());
}

#[test]
fn the_coding_task_example_passes_its_oracle_and_fails_nop_in_containers() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let contexts = format!("contexts={a}");
    let extra = ["--runner", "docker", "--runner-option", &contexts];
    super::workspaces::assert_coding_task_example(&Mst::new(), &extra);
}

#[test]
fn with_egress_by_name_a_container_reaches_the_named_hosts_only_through_the_coordinator() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    // A service on this host's loopback, which a container without a network can reach only
    // through the coordinator's egress proxy, over the shard protocol.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 1024];
            let _ = std::io::Read::read(&mut stream, &mut request);
            let _ = std::io::Write::write_all(
                &mut stream,
                b"HTTP/1.0 200 OK\r\ncontent-length: 15\r\n\r\nhello-from-host",
            );
        }
    });
    // The trial's proxy port is its HTTP_PROXY's; `nc` sends each request through it.
    let agent = format!(
        r#"p=${{HTTP_PROXY##*:}}; p=${{p%/}}
ask() {{ printf 'GET http://%s:{port}/ HTTP/1.0\r\n\r\n' "$1" | nc 127.0.0.1 "$p" | tr -d '\r'; }}
echo "named: $(ask 127.0.0.1 | tail -n 1)"
echo "unnamed: $(ask localhost | head -n 1)""#
    );
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "input": "none"},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 60}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let mst = Mst::new();
    let options = [
        format!("contexts={a}"),
        "network=allow:127.0.0.1".to_string(),
    ];
    let run = docker_run(&eval, &mst, &options);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    let said = trace["trace"]["finalText"].as_str().unwrap_or_default();
    assert!(said.contains("named: hello-from-host"), "{said}");
    assert!(said.contains("unnamed: HTTP/1.1 403 Forbidden"), "{said}");
    let egress: Vec<u64> = (trace["trace"]["events"].as_array().unwrap().iter())
        .filter(|e| e["name"] == "egress")
        .map(|e| e["data"]["status"].as_u64().unwrap())
        .collect();
    assert_eq!(egress, [200, 403], "{trace}");
    // The container itself has no network.
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    assert_eq!(
        record["runnerOptions"]["network"], "allow:127.0.0.1",
        "{record}"
    );
    assert!(containers_of(&a, &run_id(&eval)).is_empty());
}

#[test]
fn a_detached_runs_containers_are_stopped_by_runs_stop_and_a_killed_supervisors_removed_next_run() {
    let Some((_, b)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let detach = |eval: &Eval| -> (String, i32) {
        let detached = docker_run_with(
            eval,
            &mst,
            &["--detach", "--json"],
            &[format!("contexts={b}")],
        );
        assert_eq!(detached.code, 0, "{}\n{}", detached.stdout, detached.stderr);
        let said = detached.json();
        let id = said["runId"].as_str().unwrap().to_string();
        let started = Instant::now();
        while containers_of(&b, &id).is_empty() {
            assert!(started.elapsed() < Duration::from_secs(60), "no container");
            std::thread::sleep(Duration::from_millis(100));
        }
        (id, said["pid"].as_i64().unwrap() as i32)
    };
    let results = |eval: &Eval| eval.results().display().to_string();

    // Stopped: its shard is cancelled and its container removed, as Ctrl-C would.
    let stopped = command_eval(json!(["sh", "-c", "sleep 60"]), 1, 120);
    let (id, _) = detach(&stopped);
    let stop = mst.run(&["runs", "stop", &id, "--results-dir", &results(&stopped)]);
    assert_eq!(stop.code, 0, "{}\n{}", stop.stdout, stop.stderr);
    assert!(
        containers_of(&b, &id).is_empty(),
        "stopped: its container is gone"
    );

    // Killed outright: its container is an orphan, which the next run on the host removes.
    let killed = command_eval(json!(["sh", "-c", "sleep 60"]), 1, 120);
    let (id, pid) = detach(&killed);
    // SAFETY: SIGKILL to the supervisor this test started.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    // Listed as interrupted once the supervisor is gone (a zombie nobody reaps counts).
    let started = Instant::now();
    loop {
        let list = mst.run(&["runs", "list", "--json", "--results-dir", &results(&killed)]);
        if list.json()[0]["state"] == "interrupted" {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{}",
            list.stdout
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(containers_of(&b, &id).len(), 1, "the orphan is still there");
    let next = docker_run(
        &command_eval(json!(["cat"]), 1, 30),
        &mst,
        &[format!("contexts={b}")],
    );
    assert_eq!(next.code, 0, "{}\n{}", next.stdout, next.stderr);
    assert!(containers_of(&b, &id).is_empty(), "the orphan was removed");
}

#[test]
fn containers_of_a_killed_mst_are_removed_by_the_next_run() {
    let Some((_, b)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "sleep 60"]), 1, 120);
    let (mut child, _, id) = start_run(&mst, &eval, &b, &[format!("contexts={b}")]);
    child.kill().unwrap(); // SIGKILL: no clean-up runs
    child.wait().unwrap();
    assert_eq!(containers_of(&b, &id).len(), 1, "the orphan is still there");

    let other = command_eval(json!(["cat"]), 1, 30);
    let next = docker_run(&other, &mst, &[format!("contexts={b}")]);
    assert_eq!(next.code, 0, "{}\n{}", next.stdout, next.stderr);
    assert!(containers_of(&b, &id).is_empty(), "the orphan was removed");
}

#[test]
fn a_hostile_worker_image_cannot_plant_links_fifos_or_flood_the_host() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let version = env!("CARGO_PKG_VERSION");
    // A "worker" that speaks the protocol but plants a symlink and a FIFO where traces belong,
    // then writes a 1 GiB line.
    let key = |case: &str| format!(r#"{{"variant":"default","case":"{case}","trial":0}}"#);
    let script = format!(
        r#"#!/bin/sh
R=/mst-work/results
echo '{{"type":"hello","protocol":"mst.shard/v1","mst":"{version}","client":{{"name":"command","version":"{version}"}},"shard":0}}'
mkdir -p $R/default/c1 $R/default/c2
ln -s /etc/passwd $R/default/c1/0.json
mkfifo $R/default/c2/0.json
for c in c1 c2; do
  echo '{{"type":"acquire","key":'"$(test $c = c1 && echo '{k1}' || echo '{k2}')"'}}'
  read granted
  echo '{{"type":"trial","key":'"$(test $c = c1 && echo '{k1}' || echo '{k2}')"',"status":"collected","path":"default/'$c'/0.json"}}'
done
head -c 1073741824 /dev/zero | tr '\0' a
"#,
        k1 = key("c1"),
        k2 = key("c2")
    );
    let build = tempfile::tempdir().unwrap();
    std::fs::write(build.path().join("mst"), script).unwrap();
    let base = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
    std::fs::write(
        build.path().join("Dockerfile"),
        format!("FROM {base}\nCOPY mst /usr/local/bin/mst\nRUN [\"/bin/sh\", \"-c\", \"chmod 755 /usr/local/bin/mst\"]\nLABEL org.mst.version={version} org.mst.worker=/usr/local/bin/mst\n"),
    )
    .unwrap();
    docker(
        &a,
        &["build", "-q", "-t", "mst-test-hostile:1", s(build.path())],
    );

    let mst = Mst::new();
    let eval = command_eval(json!(["cat"]), 2, 30);
    let started = Instant::now();
    let run = docker_run(
        &eval,
        &mst,
        &[format!("contexts={a}"), "image=mst-test-hostile:1".into()],
    );
    // Both refused traces count as infrastructure failures (not missing): exit 1.
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        started.elapsed() < Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    assert!(
        run.stderr
            .contains("c1/0: its trace could not be copied back")
            && run.stderr.contains("is a link"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("is a FIFO"), "{}", run.stderr);
    let dir = eval.run_dir("e2e");
    let record = read_json(&dir.join("run.json"));
    assert!(
        record["machines"][0]["ended"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("a line longer than"),
        "{}",
        record["machines"]
    );
    for path in walk(&dir) {
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(
            meta.file_type().is_file(),
            "{} is not a regular file",
            path.display()
        );
        assert!(
            meta.len() < 64 << 20,
            "{} is {} bytes",
            path.display(),
            meta.len()
        );
    }
    assert!(mst_tests::files_containing(&dir, "root:x:0:0").is_empty());
    for case in ["c1", "c2"] {
        let trace = read_trace(&dir, &format!("default/{case}/0"));
        assert_eq!(trace["trace"]["status"], "infra", "{trace}");
        assert_eq!(trace["case"]["id"], case, "the coordinator's own record");
    }
    assert!(containers_of(&a, &run_id(&eval)).is_empty());
}

#[test]
fn an_image_without_mst_gets_this_msts_static_worker_placed_in_it() {
    let Some((_, b)) = engines_with_worker_image() else {
        return;
    };
    let base = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let run = docker_run(
        &eval,
        &mst,
        &[format!("contexts={b}"), format!("image={base}")],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let placement = &record["machines"][0]["placement"];
    assert_eq!(placement["image"], base.as_str(), "{placement}");
    assert_eq!(placement["workerPlaced"], true, "{placement}");
    let derived = docker(
        &b,
        &[
            "images",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "mst-derived",
        ],
    );
    assert!(
        derived.contains(&format!("mst-derived:{}-", env!("CARGO_PKG_VERSION"))),
        "{derived}"
    );
}

#[test]
fn sigterm_stops_the_shards_and_removes_the_containers() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let mst = Mst::new();
    // Three shards, one container at a time: two shards wait for a slot and must see the
    // signal too.
    let eval = command_eval(json!(["sh", "-c", "sleep 60"]), 6, 120);
    let options = [
        format!("contexts={a}"),
        "mode=exclusive".into(),
        "shards=3".into(),
    ];
    let (child, dir, id) = start_run(&mst, &eval, &a, &options);
    let signalled = Instant::now();
    // SAFETY: kill(2) on the child this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out: Run = child.wait_with_output().unwrap().into();
    assert_ne!(out.code, 0, "{}", out.stderr);
    assert!(
        signalled.elapsed() < Duration::from_secs(30),
        "stopped promptly"
    );
    assert!(containers_of(&a, &id).is_empty(), "{}", out.stderr);
    let record = read_json(&dir.join("run.json"));
    let ended: Vec<&Value> = record["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| &m["ended"]["status"])
        .collect();
    assert_eq!(ended, [&json!("cancelled"); 3], "{}", record["machines"]);
    let placed = record["machines"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| !m["placement"].is_null())
        .count();
    assert_eq!(
        placed, 1,
        "the waiting shards never got a container: {record}"
    );
}

/// `mst run` of a 4-case eval whose agent greets with `$MST_TEST_GREETING`, with the image
/// runner plugin on the worker image and one engine. The operator passes that one variable by
/// name (configuration, never a secret): set on mst's command, never on this process, which
/// other tests share.
struct ImageRunner {
    mst: Mst,
    eval: Eval,
    plugin: PathBuf,
    /// `image=…`, the worker image.
    image: String,
    /// `context=…`, the engine.
    context: String,
}

impl ImageRunner {
    fn on(engine: &str) -> ImageRunner {
        ImageRunner {
            mst: Mst::new(),
            eval: command_eval(
                json!(["sh", "-c", "read q; echo \"$q $MST_TEST_GREETING\""]),
                4,
                30,
            ),
            plugin: mst_tests::plugin("image-runner.wasm"),
            image: format!("image=mst-worker:{}", env!("CARGO_PKG_VERSION")),
            context: format!("context={engine}"),
        }
    }

    /// `mst run` with the plugin, its image and context, and `extra` options.
    fn run(&self, extra: &[&str]) -> Run {
        let mut args = vec![
            "--plugin",
            s(&self.plugin),
            "--runner",
            "mst/runner/image",
            "--allow-env",
            "MST_TEST_GREETING",
        ];
        for option in [self.image.as_str(), self.context.as_str()]
            .iter()
            .chain(extra)
        {
            args.extend(["--runner-option", option]);
        }
        self.mst
            .command(&self.eval.args(&args))
            .env("MST_TEST_GREETING", "hello from the host")
            .output()
            .unwrap()
            .into()
    }
}

/// The run record of an [`ImageRunner`] run names the plugin that placed its machine and the
/// variable it was granted: its name, never its value.
fn assert_record_names_the_plugin_and_the_variable_not_its_value(eval: &Eval) {
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machine = &record["machines"][0];
    assert_eq!(
        machine["placement"]["plugin"]["name"], "mst/runner/image",
        "{machine}"
    );
    let granted = &record["plugins"][0]["granted"];
    assert_eq!(
        granted["envNames"],
        json!(["MST_TEST_GREETING"]),
        "{granted}"
    );
    assert!(
        !record.to_string().contains("hello from the host"),
        "names are recorded, never values"
    );
}

/// What the host enforces on a container (`docker inspect`'s `HostConfig`) whatever the spec:
/// unprivileged, every capability dropped, the memory asked for (128 MB), no new privileges
/// and a seccomp profile.
fn assert_hardened(host: &Value) {
    assert_eq!(host["Privileged"], false);
    assert_eq!(host["CapDrop"], json!(["ALL"]));
    assert_eq!(host["Memory"], 128 << 20);
    let security = host["SecurityOpt"].to_string();
    assert!(security.contains("no-new-privileges"), "{security}");
    assert!(security.contains("seccomp"), "{security}");
}

/// Docker adds the image's own `ENV` (PATH, HOME) to a container of `image` on `endpoint`
/// (`inspected`); from mst, only what the spec asked for and the operator passed.
fn assert_env_is_only_what_the_operator_passed(endpoint: &str, image: &str, inspected: &Value) {
    let image_env = docker(
        endpoint,
        &[
            "image",
            "inspect",
            "--format",
            "{{json .Config.Env}}",
            image,
        ],
    );
    let image_env: Vec<String> = serde_json::from_str(&image_env).unwrap();
    let env: Vec<&str> = inspected["Config"]["Env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str())
        .filter(|v| !image_env.iter().any(|i| i == v))
        .collect();
    // Besides mst's own word to its worker, the image it runs (reported in `hello`).
    let (digest, env): (Vec<&str>, Vec<&str>) = env
        .into_iter()
        .partition(|v| v.starts_with("MST_IMAGE_DIGEST="));
    assert_eq!(digest.len(), 1, "{digest:?}");
    assert!(
        digest[0].starts_with("MST_IMAGE_DIGEST=sha256:"),
        "{digest:?}"
    );
    assert_eq!(
        env,
        [
            "MST_TEST_GREETING=hello from the host",
            "MST_PASS_ENV=MST_TEST_GREETING"
        ],
        "the worker passes on to the agent exactly what the operator passed"
    );
}

#[test]
fn an_image_runner_plugin_gets_containers_the_host_hardens() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let runner = ImageRunner::on(&a);
    let eval = &runner.eval;
    // keep=always, so the container can be inspected below; `env` asks for a variable the
    // operator passes.
    let run = runner.run(&["memoryMb=128", "keep=always", "env=MST_TEST_GREETING"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_record_names_the_plugin_and_the_variable_not_its_value(eval);
    let names = containers_of(&a, &run_id(eval));
    assert_eq!(names.len(), 1, "{names:?}");
    let inspect: Value = serde_json::from_str(&docker(&a, &["inspect", &names[0]])).unwrap();
    assert_hardened(&inspect[0]["HostConfig"]);
    let labels = &inspect[0]["Config"]["Labels"];
    assert_eq!(labels["org.example.team"], "evals", "the plugin's label");
    assert_env_is_only_what_the_operator_passed(&a, &runner.image[6..], &inspect[0]);
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    assert_eq!(
        trace["trace"]["finalText"], "question 1 hello from the host",
        "{trace}"
    );
    assert!(labels["mst.owner.pid"].is_string(), "mst's own labels");
    docker(&a, &["rm", "-f", "-v", &names[0]]);

    // The network the operator passes is the one a spec may ask for.
    let run = runner.run(&["network=bridge"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // What the plugin's schema or the host's hardening refuses stops the run before any container.
    for (option, says) in [
        ("privileged=true", "privileged"),
        ("network=host", "not allowed"),
        ("context=tcp://127.0.0.1:2375", "not a network"),
    ] {
        let refused = runner.run(&[option]);
        assert_ne!(refused.code, 0, "{option}");
        assert!(
            refused.stderr.contains(says),
            "{option}: {}",
            refused.stderr
        );
    }
}

/// A `kubectl` stand-in (tests/standins/kubectl.py) that maps a runner plugin's kubectl calls
/// onto the real engine behind it and logs each call, in a directory of its own.
struct Kubectl {
    bin: tempfile::TempDir,
}

impl Kubectl {
    fn onto(engine: &str) -> Kubectl {
        let bin = tempfile::tempdir().unwrap();
        let kubectl = Kubectl { bin };
        let config = kubectl.bin.path().join("kubectl.json");
        std::fs::write(
            &config,
            json!({"dockerHost": engine, "log": s(&kubectl.log())}).to_string(),
        )
        .unwrap();
        let standin = mst_tests::root().join("tests/standins/kubectl.py");
        let program = kubectl.bin.path().join("kubectl");
        std::fs::write(
            &program,
            format!(
                "#!/bin/sh\nexec python3 {} {} \"$@\"\n",
                s(&standin),
                s(&config)
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &program,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        kubectl
    }

    /// Where it logs each call, one JSON object a line.
    fn log(&self) -> PathBuf {
        self.bin.path().join("kubectl.log")
    }

    /// A PATH that finds the stand-in first.
    fn path(&self) -> String {
        format!(
            "{}:{}",
            s(self.bin.path()),
            std::env::var("PATH").unwrap_or_default()
        )
    }

    /// The calls it logged.
    fn calls(&self) -> Vec<Value> {
        std::fs::read_to_string(self.log())
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }
}

/// `mst run` of `eval` with the kubernetes runner plugin, granted `kubectl` (found on `path`),
/// its pods of `image` in namespace `evals` with limits and a node selector, in 2 shards.
fn kubernetes_run(mst: &Mst, eval: &Eval, image: &str, path: &str) -> Run {
    let plugin = mst_tests::plugin("kubernetes-runner.wasm");
    let image = format!("image={image}");
    let (config, results) = (eval.config(), eval.results());
    let mut args = vec![
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(&results),
        "--plugin",
        s(&plugin),
        "--runner",
        "mst/runner/kubernetes",
        "--allow-exec",
        "kubectl",
    ];
    for option in [
        image.as_str(),
        "namespace=evals",
        "memory=256Mi",
        "cpu=500m",
        "nodeSelector=pool=evals",
        "shards=2",
    ] {
        args.extend(["--runner-option", option]);
    }
    mst.command(&args)
        .env("PATH", path)
        .output()
        .unwrap()
        .into()
}

/// What the plugin asked kubectl for (`calls`): a pod per shard with the limits, the selector
/// and no service-account token; exec, then delete; all in namespace `evals`.
fn assert_pods_asked_for(calls: &[Value]) {
    let manifests: Vec<&Value> = calls
        .iter()
        .filter_map(|c| c["manifest"].as_object().map(|_| &c["manifest"]))
        .collect();
    assert_eq!(manifests.len(), 2, "{calls:?}");
    let pod = manifests[0];
    assert_eq!(pod["metadata"]["namespace"], "evals");
    assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
    assert_eq!(pod["spec"]["nodeSelector"]["pool"], "evals");
    assert_eq!(
        pod["spec"]["containers"][0]["resources"]["limits"]["memory"],
        "256Mi"
    );
    let verbs: Vec<String> = calls
        .iter()
        .map(|c| c["argv"][1].as_str().unwrap_or_default().to_string())
        .collect();
    for verb in ["apply", "wait", "exec", "delete"] {
        assert!(verbs.iter().any(|v| v == verb), "{verb}: {verbs:?}");
    }
    assert!(
        calls.iter().all(|c| c["argv"][0] == "--namespace=evals"),
        "{calls:?}"
    );
}

#[test]
fn a_kubernetes_runner_plugin_runs_pods_through_a_kubectl_stand_in() {
    // No control plane can run here: tests/standins/kubectl.py maps the plugin's kubectl calls
    // onto the real engine `a`; everything from the plugin to the worker is real.
    let Some((a, _)) = engines() else {
        return;
    };
    let image = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
    let kubectl = Kubectl::onto(&a);

    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 6, 30);
    let run = kubernetes_run(&mst, &eval, &image, &kubectl.path());
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    for machine in record["machines"].as_array().unwrap() {
        assert_eq!(machine["ended"]["status"], "done", "{machine}");
        assert_eq!(machine["placement"]["workerPlaced"], true, "{machine}");
        assert!(machine["machine"]
            .as_str()
            .unwrap()
            .contains("pod evals/mst-"));
    }
    assert_pods_asked_for(&kubectl.calls());
    let id = run_id(&eval);
    assert!(containers_of(&a, &id).is_empty(), "pods deleted");
}

const HOSTILE: &str = "mst/fixture/hostile-runner";

/// Runs `eval` with the hostile runner plugin (its container specs) and runner `options`, with
/// `env` set for mst.
fn hostile_container_run(mst: &Mst, eval: &Eval, options: &[&str], env: &[(&str, &str)]) -> Run {
    let plugin = mst_tests::fixture("hostile-runner.wasm");
    let dir = format!("dir={}", s(&eval.dir.path().join("machines")));
    let (config, results) = (eval.config(), eval.results());
    let mut args = vec![
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(&results),
        "--plugin",
        s(&plugin),
        "--runner",
        HOSTILE,
        "--runner-option",
        &dir,
    ];
    for option in options {
        args.extend(["--runner-option", option]);
    }
    let mut command = mst.command(&args);
    command.envs(env.iter().copied());
    command.output().unwrap().into()
}

/// [`hostile_container_run`] with a spec whose context is `context`.
fn hostile_endpoint_run(mst: &Mst, eval: &Eval, context: &str, env: &[(&str, &str)]) -> Run {
    let context = format!("context={context}");
    hostile_container_run(mst, eval, &["behaviour=endpoint", &context], env)
}

#[test]
fn a_runner_plugin_cannot_choose_a_containers_egress() {
    // Refused before any Docker engine is involved: no engines needed.
    let mst = Mst::new();
    let eval = command_eval(json!(["true"]), 1, 30);
    let refused = hostile_container_run(&mst, &eval, &["behaviour=egress"], &[]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("egress is yours to choose")
            && refused.stderr.contains("--runner-option network=bridge")
            && refused.stderr.contains(HOSTILE),
        "{}",
        refused.stderr
    );
}

#[test]
fn a_runner_plugin_never_reaches_a_network_docker_engine() {
    let Some((a, _)) = engines() else {
        return;
    };
    // The "attacker's engine": a listener that counts who connects.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let attacker = format!("tcp://127.0.0.1:{port}");
    // Docker contexts under a private DOCKER_CONFIG, made by the docker CLI itself: `evil`
    // points at the listener, `good` at engine A's socket.
    let config = tempfile::tempdir().unwrap();
    for (name, host) in [("evil", attacker.as_str()), ("good", a.as_str())] {
        let out = Command::new("docker")
            .args([
                "context",
                "create",
                name,
                "--docker",
                &format!("host={host}"),
            ])
            .env("DOCKER_CONFIG", config.path())
            .output()
            .expect("docker CLI");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let docker_config = ("DOCKER_CONFIG", s(config.path()));
    let mst = Mst::new();
    let smuggled = [
        // The comma form the old check let through: a local socket first, the attacker after.
        (format!("{a},{attacker}"), None),
        (format!("{a} {attacker}"), None),
        (format!("{a}\t{attacker}"), None),
        (attacker.clone(), None),
        (format!(" {attacker}"), None),
        (attacker.to_uppercase(), None),
        (format!("http://127.0.0.1:{port}"), None),
        (format!("HTTP://127.0.0.1:{port}"), None),
        (format!("ssh://127.0.0.1:{port}"), None),
        (format!("unix://{attacker}"), None),
        (format!("{a}?host={attacker}"), None),
        ("good,evil".to_string(), None),
        // A context name that resolves to the network, from the config or DOCKER_HOST.
        ("evil".to_string(), None),
        (
            "default".to_string(),
            Some(("DOCKER_HOST", attacker.as_str())),
        ),
    ];
    for (context, extra) in &smuggled {
        let eval = command_eval(json!(["true"]), 1, 30);
        let mut env = vec![docker_config];
        env.extend(extra.iter().copied());
        let refused = hostile_endpoint_run(&mst, &eval, context, &env);
        assert_eq!(refused.code, 2, "{context:?}: {}", refused.stderr);
        assert!(
            refused.stderr.contains("not a network address") && refused.stderr.contains(HOSTILE),
            "{context:?}: {}",
            refused.stderr
        );
    }
    assert!(
        matches!(listener.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "something connected to the attacker's engine"
    );
    // A context that resolves to a local socket is still the plugin's to name: it reaches
    // engine A (which then lacks the plugin's image).
    let eval = command_eval(json!(["true"]), 1, 30);
    let reached = hostile_endpoint_run(&mst, &eval, "good", &[docker_config]);
    assert!(
        reached
            .stderr
            .contains("image busybox is not on docker context"),
        "{}",
        reached.stderr
    );
}

/// Builds `mst-test-probe:1` on `endpoint`: `mst runner setup docker`'s image plus
/// tests/probes/confinement.rs, compiled static with rustc, as `/usr/local/bin/mst-probe`.
fn probe_image(endpoint: &str) -> &'static str {
    let build = tempfile::tempdir().unwrap();
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let out = Command::new(rustc)
        .args([
            "--edition",
            "2021",
            "--target",
            "x86_64-unknown-linux-musl",
            "-O",
            "-o",
        ])
        .arg(build.path().join("mst-probe"))
        .arg(mst_tests::root().join("tests/probes/confinement.rs"))
        .output()
        .expect("rustc");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let copy = "COPY mst-probe /usr/local/bin/mst-probe";
    worker_image_with(endpoint, build.path(), copy, "mst-test-probe:1")
}

/// Builds `tag` on `endpoint` from this mst's worker image and the Dockerfile line `copy`,
/// which copies a file of the `build` directory in.
fn worker_image_with(endpoint: &str, build: &Path, copy: &str, tag: &'static str) -> &'static str {
    // By id: the shared engines' tag may be rebuilt by another run meanwhile.
    let worker = format!("mst-worker:{}", env!("CARGO_PKG_VERSION"));
    let id = docker(
        endpoint,
        &["image", "inspect", "--format", "{{.Id}}", &worker],
    );
    std::fs::write(
        build.join("Dockerfile"),
        format!("FROM {}\n{copy}\n", id.trim()),
    )
    .unwrap();
    docker(endpoint, &["build", "-q", "-t", tag, s(build)]);
    tag
}

/// What a trial finds out about its container: whether it can write outside its work
/// directory and /tmp, its open-file limit, its network, how many processes it got to run
/// (trying 200), its user, and what the probe finds (vsock and Unix sockets, how many files it
/// holds open). Forks only before the process limit is reached.
const PROBE: &str = r#"read q
root=$( (echo x > /probe) 2>&1 && echo wrote-root)
scratch=$( (echo x > /tmp/p && echo x > p) 2>&1 && echo scratch-ok)
eth=$(grep -c eth0 /proc/net/dev)
uid=$(id -u)
probe=$(/usr/local/bin/mst-probe)
( i=0; while [ $i -lt 200 ]; do sleep 30 & i=$((i+1)); done ) 2>/dev/null
set -- /proc/[0-9]*
procs=$#
for d in /proc/[0-9]*; do read c < $d/comm 2>/dev/null; [ "$c" = sleep ] && kill ${d#/proc/}; done
echo "root=[$root] scratch=[$scratch] nofile=$(ulimit -n) eth0=$eth procs=$procs uid=$uid $probe""#;

/// The line [`PROBE`] printed in `eval`'s only trace.
fn probe_line(eval: &Eval) -> String {
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    trace["trace"]["finalText"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn containers_are_confined_by_default_and_only_the_operator_loosens_them() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let image = probe_image(&a);
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", PROBE]), 1, 60);
    let run = docker_run(
        &eval,
        &mst,
        &[
            format!("contexts={a}"),
            format!("image={image}"),
            "pids=128".into(),
            "nofile=256".into(),
            "keep=always".into(),
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("containers get no network"),
        "the plan says so: {}",
        run.stderr
    );
    let line = probe_line(&eval);
    // No writes outside the work directory and /tmp, which work.
    assert!(line.contains("Read-only file system"), "{line}");
    assert!(line.contains("scratch=[scratch-ok]"), "{line}");
    assert!(line.contains("nofile=256"), "{line}");
    assert!(line.contains("eth0=0"), "no network: {line}");
    let procs: usize = line
        .split("procs=")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        (20..128).contains(&procs),
        "the fork loop hit pids=128: {line}"
    );
    assert!(
        line.contains("uid=65532"),
        "setup's image is not root: {line}"
    );
    // EPERM from the profile, as Docker's own; other families still open.
    assert!(line.contains("vsock=errno1 unix=open"), "{line}");
    let files: usize = line
        .split("files=")
        .nth(1)
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    assert!(
        (200..256).contains(&files),
        "held open under nofile=256: {line}"
    );

    let names = containers_of(&a, &run_id(&eval));
    assert_eq!(names.len(), 1, "{names:?}");
    let inspect: Value = serde_json::from_str(&docker(&a, &["inspect", &names[0]])).unwrap();
    let host = &inspect[0]["HostConfig"];
    assert_eq!(host["ReadonlyRootfs"], true);
    assert_eq!(host["NetworkMode"], "none");
    assert_eq!(host["PidsLimit"], 128);
    assert_eq!(
        host["Ulimits"],
        json!([{"Name": "nofile", "Soft": 256, "Hard": 256}])
    );
    // The work directory and /tmp are anonymous volumes (removed with the container).
    let mut mounts: Vec<(&str, &str)> = inspect[0]["Mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["Type"].as_str().unwrap(),
                m["Destination"].as_str().unwrap(),
            )
        })
        .collect();
    mounts.sort();
    assert_eq!(mounts, [("volume", "/mst-work"), ("volume", "/tmp")]);
    docker(&a, &["rm", "-f", "-v", &names[0]]);

    // The operator, not a plugin, may give clients the network and a writable root.
    let eval = command_eval(json!(["sh", "-c", PROBE]), 1, 60);
    let run = docker_run(
        &eval,
        &mst,
        &[
            format!("contexts={a}"),
            format!("image={image}"),
            "network=bridge".into(),
            "rootfs=writable".into(),
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let line = probe_line(&eval);
    // (The test image's own /tmp is root's: the user may not write there, but nothing is
    // read-only.)
    assert!(!line.contains("Read-only file system"), "{line}");
    assert!(line.contains("eth0=1"), "{line}");
    assert!(line.contains("nofile=16384"), "the default limit: {line}");
}

#[test]
fn secret_env_reaches_the_agent_and_never_the_containers_environment() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    const KEY: &str = "mst-canary-agent-key-9d14";
    let mst = Mst::new();
    // The agent says how long its key is and how many variables carry it.
    let agent = r#"printf %s "$AGENT_KEY" | wc -c; env | grep -c AGENT_KEY"#;
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent],
                                 "secretEnv": {"AGENT_KEY": "AGENT_API_KEY"}},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &mst_tests::cases(1),
    );
    let args = with_secrets(&eval, &format!("AGENT_API_KEY={KEY}\n"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = docker_run_with(&eval, &mst, &args, &kept_on(&a));
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("e2e"), "default/c1/0");
    let answer: Vec<String> = trace["trace"]["finalText"]
        .as_str()
        .unwrap()
        .split_whitespace()
        .map(String::from)
        .collect();
    assert_eq!(answer, [KEY.len().to_string(), "1".into()], "{trace}");
    // Not in the container's configuration, nor in anything mst wrote or printed.
    let names = containers_of(&a, &run_id(&eval));
    assert_eq!(names.len(), 1, "{names:?}");
    let inspect = docker(&a, &["inspect", &names[0]]);
    assert!(!inspect.contains(KEY), "docker inspect shows the key");
    assert!(!inspect.contains("AGENT_KEY="), "nor the variable");
    docker(&a, &["rm", "-f", "-v", &names[0]]);
    assert!(mst_tests::files_containing(&eval.results(), KEY).is_empty());
    assert!(!run.stdout.contains(KEY) && !run.stderr.contains(KEY));
}

#[test]
fn codex_in_a_container_with_no_network_reaches_its_model_only_through_the_gateway() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    mst_tests::require_program("codex", "npm install -g @openai/codex");
    // An image of the test base with Codex's static program copied in from the host's npm
    // install, under a name of its own.
    let base = std::env::var("MST_TEST_IMAGE").unwrap_or_else(|_| "mst-test-busybox:1".into());
    let image = "mst-agent-clis-test:1";
    let mst = Mst::new();
    let setup = mst.run(&[
        "runner",
        "setup",
        "docker",
        "--runner-option",
        &format!("contexts={a}"),
        "--runner-option",
        &format!("base={base}"),
        "--runner-option",
        &format!("image={image}"),
        "--runner-option",
        "agentClis=codex",
    ]);
    assert_eq!(setup.code, 0, "{}\n{}", setup.stdout, setup.stderr);
    assert!(
        setup.stdout.contains(&format!("built {image}")),
        "{}",
        setup.stdout
    );
    assert!(setup.stdout.contains("with codex"), "{}", setup.stdout);

    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "codex",
               "model": "mock/script",
               "clientOptions": {"mockScript": [{"text": "It is morning in Tokyo."}]},
               "judges": [{"assert": "contains", "value": "Tokyo"}], "timeout": 90}),
        &[json!({"id": "tokyo", "input": "What time is it in Tokyo?"})],
    );
    // The default network, `none`: the container reaches nothing but its own loopback.
    let options = [
        format!("contexts={a}"),
        format!("image={image}"),
        "keep=always".to_string(),
    ];
    let run = docker_run_with(&eval, &mst, &["--json", "-q"], &options);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("e2e"), "default/tokyo/0");
    assert_eq!(
        trace["trace"]["finalText"], "It is morning in Tokyo.",
        "{trace}"
    );
    assert_eq!(trace["collectedBy"]["client"], "codex", "{trace}");
    assert_eq!(trace["collectedBy"]["clientVersion"], "0.169.0", "{trace}");
    let measured = trace["trace"]["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["name"] == "usage" && e["data"]["measuredBy"] == "gateway")
        .count();
    assert!(measured >= 1, "the host measured its calls: {trace}");
    let names = containers_of(&a, &run_id(&eval));
    assert_eq!(names.len(), 1, "{names:?}");
    let network = docker(
        &a,
        &[
            "inspect",
            "--format",
            "{{.HostConfig.NetworkMode}}",
            &names[0],
        ],
    );
    assert_eq!(network.trim(), "none", "the container had no network");
    docker(&a, &["rm", "-f", "-v", &names[0]]);
}

#[test]
fn an_api_agent_in_containers_with_no_network_reaches_its_model_and_never_its_key() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    const KEY: &str = "mst-canary-docker-model-key-71fe";
    // On the host's loopback, which no container can reach: the calls go through the model
    // gateway each worker serves inside its container, and the host makes them.
    let server = ModelServer::start(vec![Reply::ok(json!({
        "content": [{"type": "text", "text": "It is morning in Tokyo."}],
        "usage": {"input_tokens": 12, "output_tokens": 6}}))]);
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"],
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(),
                                      "key": "MODEL_KEY"}},
               "client": "api", "model": "acme/test-model",
               "judges": [{"assert": "contains", "value": "Tokyo"}], "timeout": 30}),
        &mst_tests::cases(4),
    );
    let args = with_secrets(&eval, &format!("MODEL_KEY={KEY}\n"));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut options = kept_on(&a);
    // The default network, `none`: no egress at all.
    options.push("shards=2".into());
    let run = docker_run_with(&eval, &mst, &args, &options);
    let logs = || {
        mst_tests::walk(&eval.results())
            .into_iter()
            .filter(|p| p.to_string_lossy().ends_with(".worker.log"))
            .map(|p| std::fs::read_to_string(p).unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(run.code, 0, "{}\n{}\n{}", run.stdout, run.stderr, logs());
    let requests = server.requests();
    assert_eq!(requests.len(), 4, "one model call per trial");
    assert!(requests
        .iter()
        .all(|r| r.header("x-api-key") == Some(KEY) && r.path == "/v1/messages"));
    let names = containers_of(&a, &run_id(&eval));
    assert_eq!(names.len(), 2, "{names:?}");
    for name in &names {
        let inspect = docker(&a, &["inspect", name]);
        assert!(
            !inspect.contains(KEY),
            "docker inspect of {name} shows the key"
        );
        docker(&a, &["rm", "-f", "-v", name]);
    }
    assert!(mst_tests::files_containing(&eval.results(), KEY).is_empty());
    assert!(!run.stdout.contains(KEY) && !run.stderr.contains(KEY));
}

#[test]
fn a_pairwise_run_across_two_variants_on_docker_is_judged_in_both_orders() {
    let Some((a, b)) = engines_with_worker_image() else {
        return;
    };
    let server = ModelServer::start_with(judge_preferring("UTC+9"));
    let (eval, secrets) = mst_tests::pairwise_eval(
        &server.url(),
        "alpha says UTC+9",
        "beta says UTC+8",
        &mst_tests::cases(3),
    );
    let mut args = vec!["--json", "-q", "--secrets-file", s(&secrets)];
    let options = [format!("contexts={a},{b}"), "shards=2".to_string()];
    args.extend(["--runner", "docker"]);
    for option in &options {
        args.extend(["--runner-option", option.as_str()]);
    }
    let run = eval.run(&Mst::new(), &args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("paired");
    for variant in ["alpha", "beta"] {
        let trace = read_trace(&dir, &format!("{variant}/c1/0"));
        assert!(
            trace["collectedBy"]["machine"]
                .as_str()
                .unwrap_or("")
                .starts_with("docker"),
            "collected in a container: {trace}"
        );
    }
    assert_both_orders(&server, "[variant] says UTC+9", "[variant] says UTC+8", 3);
    assert_eq!(
        run.json()["pairs"][0],
        json!({"name": "alpha-vs-beta", "a": "alpha", "b": "beta", "wins": 3, "ties": 0,
               "losses": 0, "notGraded": 0, "notCompared": 0}),
        "{}",
        run.stdout
    );
    let id = dir.file_name().unwrap().to_str().unwrap();
    assert!(containers_of(&a, id).is_empty() && containers_of(&b, id).is_empty());
}

#[test]
fn a_playground_session_keeps_one_container_for_its_tasks_and_removes_it_on_close() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let agent = r#"echo '{"type":"message","role":"assistant","text":"on '"$(hostname)"'"}'; cat"#;
    let eval = Eval::new(
        json!({"name": "play", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "events": true}, "timeout": 30}),
        &[json!({"id": "unused", "input": "x"})],
    );
    let mst = Mst::new();
    let context = format!("contexts={a}");
    let serve = Serve::start(
        &mst,
        &eval.config(),
        &eval.results(),
        &["--runner", "docker", "--runner-option", &context],
    );
    let session = serve.session("{}");
    assert_eq!(
        containers_of(&a, &session).len(),
        1,
        "one container, made at create"
    );
    let mut hosts = Vec::new();
    for input in ["one", "two"] {
        let (status, task) = serve.call(
            "POST",
            &format!("/api/v1/sessions/{session}/tasks"),
            Some(&json!({"input": input}).to_string()),
        );
        assert_eq!(status, 202, "{task}");
        let id = task["id"].as_str().unwrap().to_string();
        let (events, page) = serve.follow((&session, &id), 0, None, Duration::from_secs(60));
        assert_eq!(page["status"], "completed", "{page}");
        hosts.push(events[0]["text"].as_str().unwrap().to_string());
    }
    assert_eq!(
        hosts[0], hosts[1],
        "both tasks ran in the session's one container"
    );
    let (status, closed) = serve.call("DELETE", &format!("/api/v1/sessions/{session}"), None);
    assert_eq!(
        (status, closed["status"].as_str()),
        (200, Some("closed")),
        "{closed}"
    );
    assert!(
        containers_of(&a, &session).is_empty(),
        "the container was removed"
    );

    // A machine that cannot start a worker is a 502 naming the runner, and leaves nothing.
    let missing = Serve::start(
        &mst,
        &eval.config(),
        &eval.results(),
        &[
            "--runner",
            "docker",
            "--runner-option",
            &context,
            "--runner-option",
            "image=mst-no-such-image:0",
        ],
    );
    let (status, answer) = missing.call("POST", "/api/v1/sessions", Some("{}"));
    assert_eq!(status, 502, "{answer}");
    assert!(
        answer["error"]
            .as_str()
            .unwrap()
            .contains("runner `docker`"),
        "{answer}"
    );
    let (_, list) = missing.call("GET", "/api/v1/sessions", None);
    assert_eq!(list["sessions"], json!([]));
}

/// An sshd on loopback standing for a remote Docker host: its sessions' `docker` reaches
/// engine `engine` (`DOCKER_HOST`), as a remote host's would reach its own.
fn remote_docker_host(keys: &sshd::SshKeys, engine: &str) -> Option<sshd::Sshd> {
    sshd::available()
        .then(|| sshd::Sshd::start_with(keys, "docker", &format!("SetEnv DOCKER_HOST={engine}\n")))
}

/// The docker runner options for hosts `contexts` reached over ssh with `keys`' identity,
/// checking host keys against `known_hosts`: 2 shards, containers kept.
fn ssh_options(keys: &sshd::SshKeys, contexts: &str, known_hosts: &Path) -> Vec<String> {
    vec![
        format!("contexts={contexts}"),
        "shards=2".to_string(),
        format!("sshIdentity={}", s(&keys.identity())),
        format!("sshKnownHosts={}", s(known_hosts)),
        "keep=always".into(),
    ]
}

/// After a run over `endpoint` (an ssh:// host in front of engine `engine`): each shard ran in
/// a container of that engine, and no ssh connection (the master or any dial) outlived the
/// run. Removes the kept containers.
fn assert_shards_ran_behind_the_ssh_host(eval: &Eval, engine: &str, endpoint: &str) {
    let summary = read_json(&eval.run_dir("e2e").join("summary.json"));
    assert_eq!(summary["variants"]["default"]["passed"], 4, "{summary}");
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    for machine in record["machines"].as_array().unwrap() {
        assert!(
            machine["machine"].as_str().unwrap().contains(endpoint),
            "{machine}"
        );
    }
    let kept = containers_of(engine, &run_id(eval));
    assert_eq!(kept.len(), 2, "{kept:?}");
    let left = Command::new("pgrep")
        .args(["-af", "mst-docker-ssh-"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
    for name in kept {
        docker(engine, &["rm", "-f", "-v", &name]);
    }
}

/// A docker context named `remote` whose endpoint is the ssh:// host `endpoint`, made by the
/// docker CLI, runs a 2-case eval.
fn assert_a_docker_context_on_the_ssh_host_runs(mst: &Mst, keys: &sshd::SshKeys, endpoint: &str) {
    let config = tempfile::tempdir().unwrap();
    let made = Command::new("docker")
        .args([
            "context",
            "create",
            "remote",
            "--docker",
            &format!("host={endpoint}"),
        ])
        .env("DOCKER_CONFIG", config.path())
        .output()
        .unwrap();
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let by_name = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let mut args = vec!["--runner".to_string(), "docker".into()];
    for option in ssh_options(keys, "remote", &keys.known_hosts())
        .into_iter()
        .filter(|o| o != "keep=always")
    {
        args.extend(["--runner-option".to_string(), option]);
    }
    let named: Run = mst
        .command(&by_name.args(&args.iter().map(String::as_str).collect::<Vec<_>>()))
        .env("DOCKER_CONFIG", config.path())
        .output()
        .unwrap()
        .into();
    assert_eq!(named.code, 0, "{}\n{}", named.stdout, named.stderr);
}

/// Host keys are checked against the operator's known_hosts: a host it does not list, or
/// lists with another key, is refused in ssh's words before any container exists.
fn assert_unknown_and_changed_host_keys_refused(
    mst: &Mst,
    keys: &sshd::SshKeys,
    host: &sshd::Sshd,
    endpoint: &str,
) {
    let unknown = keys.dir.path().join("known_hosts.empty");
    std::fs::write(&unknown, "").unwrap();
    let other_key = keys.dir.path().join("other-host-key");
    let made = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f", s(&other_key)])
        .status()
        .unwrap();
    assert!(made.success());
    let public = std::fs::read_to_string(other_key.with_extension("pub")).unwrap();
    let mut fields = public.split_whitespace();
    let changed = keys.dir.path().join("known_hosts.changed");
    std::fs::write(
        &changed,
        format!(
            "[127.0.0.1]:{} {} {}\n",
            host.port,
            fields.next().unwrap(),
            fields.next().unwrap()
        ),
    )
    .unwrap();
    for known in [&unknown, &changed] {
        let refused_eval = command_eval(json!(["true"]), 1, 30);
        let refused = docker_run(&refused_eval, mst, &ssh_options(keys, endpoint, known));
        assert_eq!(refused.code, 2, "{}\n{}", refused.stdout, refused.stderr);
        assert!(
            refused.stderr.contains("Host key verification failed"),
            "{}",
            refused.stderr
        );
        assert!(refused.stderr.contains(endpoint), "{}", refused.stderr);
        assert!(!refused_eval.results().join("e2e/runs").exists());
    }
}

#[test]
fn a_docker_host_over_ssh_runs_the_shards_and_its_host_key_is_checked() {
    let Some((a, _)) = engines_with_worker_image() else {
        return;
    };
    let keys = sshd::keys();
    let Some(host) = remote_docker_host(&keys, &a) else {
        return;
    };
    let endpoint = format!("ssh://{}@127.0.0.1:{}", host.user, host.port);
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 4, 30);
    let run = docker_run(
        &eval,
        &mst,
        &ssh_options(&keys, &endpoint, &keys.known_hosts()),
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_shards_ran_behind_the_ssh_host(&eval, &a, &endpoint);
    assert_a_docker_context_on_the_ssh_host_runs(&mst, &keys, &endpoint);
    assert_unknown_and_changed_host_keys_refused(&mst, &keys, &host, &endpoint);

    // ssh options where no host is an ssh one are a mistake, said before anything runs.
    let misplaced = docker_run(
        &command_eval(json!(["true"]), 1, 30),
        &mst,
        &[
            format!("contexts={a}"),
            format!("sshKnownHosts={}", s(&keys.known_hosts())),
        ],
    );
    assert_eq!(misplaced.code, 2, "{}", misplaced.stderr);
    assert!(
        misplaced.stderr.contains("no context in this run is one"),
        "{}",
        misplaced.stderr
    );
}

/// An image from the worker image with the exec grader's `mst-fixture-judge` in it: a
/// program only the machine has.
fn judge_image(endpoint: &str) -> &'static str {
    let build = tempfile::tempdir().unwrap();
    mst_tests::judge_program(build.path());
    let copy = "COPY mst-fixture-judge /bin/mst-fixture-judge";
    worker_image_with(endpoint, build.path(), copy, "mst-test-judge:1")
}

#[test]
fn judges_that_need_a_program_only_the_image_has_grade_in_its_containers() {
    let Some((a, b)) = engines_with_worker_image() else {
        return;
    };
    let image = judge_image(&a);
    assert_eq!(judge_image(&b), image);
    let mst = Mst::new();
    let (eval, run_dir, run) = mst_tests::collected_exec_judged_eval(&mst);
    let results = eval.results();
    let grade = |extra: &[&str]| -> Run {
        let mut args = vec!["grade", &run, "--json", "--results-dir", s(&results)];
        args.extend(extra);
        let mut command = mst.command(&args);
        command
            .current_dir(eval.dir.path())
            .output()
            .unwrap()
            .into()
    };
    // Here the judge's program does not exist: the judge cannot score.
    let here = grade(&[]).json();
    assert_eq!(here["variants"]["default"]["notGraded"], 5, "{here}");
    let contexts = format!("contexts={a},{b}");
    let image_option = format!("image={image}");
    let there = grade(&[
        "--runner",
        "docker",
        "--runner-option",
        &contexts,
        "--runner-option",
        "shards=2",
        "--runner-option",
        &image_option,
        "--runner-option",
        "keep=always",
    ]);
    let summary = there.json();
    assert_eq!(
        summary["variants"]["default"]["passed"], 4,
        "{summary}\n{}",
        there.stderr
    );
    assert_eq!(summary["variants"]["default"]["failed"], 1, "{summary}");
    let g2 = run_dir.with_file_name(format!("{run}.g2"));
    let record = read_json(&g2.join("run.json"));
    let machines = record["grading"]["machines"].as_array().unwrap().clone();
    assert_eq!(machines.len(), 2, "{record}");
    assert!(machines
        .iter()
        .all(|m| m["machine"].as_str().unwrap().starts_with("docker")));
    // The program ran in a container (its hostname is not this host's), under the worker.
    let grades = read_json(&g2.join("grades.json")).to_string();
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    assert!(grades.contains(" collect --bundle "), "{grades}");
    assert!(
        !grades.contains(&format!("judged on {} by", host.trim())),
        "{grades}"
    );
    // The grade shards' containers are the regrade's (kept here to be seen, then removed).
    let id = format!("{run}.g2");
    let kept = [containers_of(&a, &id), containers_of(&b, &id)];
    assert_eq!(kept.iter().map(Vec::len).sum::<usize>(), 2, "{kept:?}");
    assert!(containers_of(&a, &run).is_empty() && containers_of(&b, &run).is_empty());
    for (endpoint, names) in [(&a, &kept[0]), (&b, &kept[1])] {
        for name in names {
            docker(endpoint, &["rm", "-f", name]);
        }
    }
}
