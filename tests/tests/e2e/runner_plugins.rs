//! Runner plugins with command channels, end to end: the `ssh` runner against real OpenSSH
//! servers on loopback (a host killed mid-run, then `--resume`), and a hostile runner plugin
//! that asks for programs it was not granted or never returns from `create-machine`.

use mst_tests::model_server::{ModelServer, Reply};
use mst_tests::sshd::{self, Sshd};
use mst_tests::{
    assert_resumed, command_eval, read_json, s, wait_for_run, wait_for_traces, Eval, Mst, Run,
};
use serde_json::json;
use std::time::Duration;

const HOSTILE: &str = "mst/fixture/hostile-runner";

/// Runs `eval` with the hostile runner plugin, `behaviour`, machines under `dir`, and `extra`.
fn hostile_run(mst: &Mst, eval: &Eval, behaviour: &str, extra: &[&str]) -> Run {
    let plugin = mst_tests::fixture("hostile-runner.wasm");
    let dir = eval.dir.path().join("machines");
    let behaviour = format!("behaviour={behaviour}");
    let dir = format!("dir={}", s(&dir));
    let mut args = vec![
        "--plugin",
        s(&plugin),
        "--runner",
        HOSTILE,
        "--runner-option",
        &behaviour,
        "--runner-option",
        &dir,
    ];
    args.extend_from_slice(extra);
    eval.run(mst, &args)
}

fn run_id(dir: &std::path::Path) -> String {
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

#[test]
fn command_channels_run_only_granted_programs_and_record_the_grants() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 6, 30);
    let run = hostile_run(
        &mst,
        &eval,
        "shell",
        &[
            "--runner-option",
            "shards=2",
            "--allow-exec",
            "sh",
            "--allow-exec",
            "ssh",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    // Before any machine: what it may run, and a warning for the declaration that lets it
    // pass any option.
    assert!(
        run.stderr
            .contains("it may run: sh -c cd {workdir} && exec \"$@\" sh {command}"),
        "{}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("warning: it declared `ssh` with any arguments"),
        "{}",
        run.stderr
    );
    // An interpreter admits any command whatever its patterns: exact scripts warn just as
    // loudly, for each of its three templates.
    let interpreter = "`sh` runs whatever script or program it is given, which you granted: \
                       that admits any command";
    assert_eq!(run.stderr.matches(interpreter).count(), 3, "{}", run.stderr);
    assert!(run.stderr.contains(interpreter), "{}", run.stderr);
    let check = mst.run(&[
        "plugin",
        "check",
        s(&mst_tests::fixture("hostile-runner.wasm")),
    ]);
    assert!(
        check.stdout.contains("declares `ssh` with any arguments"),
        "{}",
        check.stdout
    );
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 2, "{machines:?}");
    for machine in machines {
        assert_eq!(machine["ended"]["status"], "done", "{machine}");
        assert_eq!(machine["placement"]["channel"], "command", "{machine}");
        assert_eq!(machine["placement"]["plugin"]["name"], HOSTILE);
    }
    let plugin = &record["plugins"][0];
    assert_eq!(plugin["name"], HOSTILE, "{record}");
    assert_eq!(plugin["source"], "--plugin");
    assert_eq!(plugin["declared"][0]["program"], "sh", "{plugin}");
    assert_eq!(plugin["granted"]["exec"][0]["program"], "sh", "{plugin}");
    assert_eq!(
        plugin["granted"]["exec"][0]["args"],
        json!([
            "{argv}",
            "-c",
            "cd {workdir} && exec \"$@\"",
            "sh",
            "{command}"
        ])
    );
    assert_eq!(plugin["declared"].as_array().unwrap().len(), 4, "{plugin}");
    assert!(plugin["digest"].as_str().unwrap().len() == 64);

    // Not granted, not declared, or an argument outside the declared patterns: the machine is
    // refused before anything runs, naming the plugin, the template and the program.
    for (behaviour, grant, says) in [
        ("shell", None, "--allow-exec sh"),
        ("ungranted", Some("sh"), "running `bash` is not allowed"),
        (
            "option",
            Some("sh"),
            "argument 1 (\"-x\") is not what the template has",
        ),
    ] {
        let eval = command_eval(json!(["true"]), 2, 30);
        let mut extra = vec![];
        if let Some(program) = grant {
            extra.extend(["--allow-exec", program]);
        }
        let refused = hostile_run(&mst, &eval, behaviour, &extra);
        assert_eq!(refused.code, 2, "{behaviour}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(says)
                && refused.stderr.contains(HOSTILE)
                && refused.stderr.contains("`exec` template"),
            "{behaviour}: {}",
            refused.stderr
        );
        assert!(
            !eval.dir.path().join("machines").exists(),
            "{behaviour}: nothing ran"
        );
    }
}

#[test]
fn a_runner_plugin_takes_the_hosts_worker_option() {
    // `worker=PATH` is the host's option for every runner that places mst on a machine; a
    // plugin's schema never sees it (it refused it, though the error told users to pass it).
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let grants = ["--allow-exec", "sh", "--allow-exec", "ssh"];
    let not_mst = eval.dir.path().join("not-mst");
    std::fs::write(&not_mst, "#!/bin/sh\n").unwrap();
    let option = format!("worker={}", s(&not_mst));
    let mut args = vec!["--runner-option", option.as_str()];
    args.extend(grants);
    let run = hostile_run(&mst, &eval, "shell", &args);
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(&format!("--runner-option {option}"))
            && run.stderr.contains("not a 64-bit ELF"),
        "{}",
        run.stderr
    );
    // A static mst (the tests' build is static): taken, placed, and the run passes.
    let option = format!("worker={}", s(&mst_tests::mst_bin()));
    let mut args = vec!["--runner-option", option.as_str()];
    args.extend(grants);
    let run = hostile_run(&mst, &eval, "shell", &args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
}

#[test]
fn container_specs_cannot_reach_for_the_host() {
    let mst = Mst::new();
    for (behaviour, says) in [
        ("host-network", "network=host"),
        ("endpoint", "not a network address"),
        ("env", "--allow-env AWS_SECRET_ACCESS_KEY"),
    ] {
        let eval = command_eval(json!(["true"]), 1, 30);
        let refused = hostile_run(&mst, &eval, behaviour, &[]);
        assert_eq!(refused.code, 2, "{behaviour}: {}", refused.stderr);
        assert!(
            refused.stderr.contains(says) && refused.stderr.contains(HOSTILE),
            "{behaviour}: {}",
            refused.stderr
        );
    }
}

#[test]
fn a_create_machine_that_never_returns_fails_only_its_shard() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 9, 30);
    let run = hostile_run(
        &mst,
        &eval,
        "hang",
        &[
            "--runner-option",
            "shards=3",
            "--allow-exec",
            "sh",
            "--plugin-timeout",
            "2",
        ],
    );
    assert_eq!(run.code, 2, "partial\n{}", run.stderr);
    assert!(run.stderr.contains("time limit of 2.0s"), "{}", run.stderr);
    let dir = eval.run_dir("e2e");
    let record = read_json(&dir.join("run.json"));
    let ended: Vec<&str> = record["machines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["ended"]["status"].as_str().unwrap())
        .collect();
    assert_eq!(
        ended.iter().filter(|e| **e == "done").count(),
        2,
        "{ended:?}"
    );
    assert_eq!(
        ended.iter().filter(|e| **e == "lost").count(),
        1,
        "{ended:?}"
    );
    let missing = read_json(&dir.join("summary.json"))["missing"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(missing, 3, "shard 1's trials");

    let id = run_id(&dir);
    let resumed = hostile_run(
        &mst,
        &eval,
        "shell",
        &[
            "--resume",
            &id,
            "--runner-option",
            "shards=3",
            "--allow-exec",
            "sh",
        ],
    );
    assert_resumed(&resumed, 3);
}

/// The ssh plugin's plan says that the plugin, not the operator, picks the destination (its
/// `*` after `--`: the `hosts` option is a list, which no pattern can pin).
fn assert_the_plan_warns_of_any_destination(run: &mst_tests::Run) {
    assert!(
        run.stderr.contains(
            "warning: it declared `ssh` with `*`, which runs commands on any host the operator's \
             ssh keys"
        ),
        "{}",
        run.stderr
    );
}

#[test]
fn ssh_shards_over_two_hosts_survive_a_dead_host_with_resume() {
    if !sshd::available() {
        eprintln!("skipped: no OpenSSH server here");
        return;
    }
    let keys = sshd::keys();
    let (a, mut b) = (Sshd::start(&keys, "a"), Sshd::start(&keys, "b"));
    let plugin = mst_tests::plugin("ssh-runner.wasm");
    let mst = Mst::new();

    // 4 shards over 2 hosts: every trial collected, the worker placed on each host (its PATH
    // has no mst), the work directories removed afterwards.
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 12, 30);
    let mut args = sshd::runner_args(&plugin, &keys, &[&a, &b]);
    args.extend(["--runner-option".into(), "shards=4".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = eval.run(&mst, &args);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_the_plan_warns_of_any_destination(&run);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 4);
    let mut ports: Vec<String> = machines
        .iter()
        .map(|m| {
            assert_eq!(m["ended"]["status"], "done", "{m}");
            assert_eq!(m["placement"]["workerPlaced"], true, "{m}");
            assert_eq!(m["placement"]["plugin"]["name"], "mst/runner/ssh");
            m["machine"].as_str().unwrap().to_string()
        })
        .collect();
    ports.sort();
    ports.dedup();
    assert_eq!(ports.len(), 4, "four machines: {ports:?}");
    assert!(
        machines
            .iter()
            .filter(|m| m["machine"].as_str().unwrap().contains(&a.host()))
            .count()
            == 2,
        "two shards per host: {machines:?}"
    );
    let id = run_id(&eval.run_dir("e2e"));
    mst_tests::assert_no_work_dirs_left(&id);

    // The dry run of the same plugin and options: one machine, one trial, dispose.
    let mut args = vec![
        "plugin".to_string(),
        "check".into(),
        s(&plugin).into(),
        "--dry-run".into(),
    ];
    args.extend(sshd::runner_args(&plugin, &keys, &[&a]).into_iter().skip(4));
    let dry = mst.run(&args);
    assert_eq!(dry.code, 0, "{}\n{}", dry.stdout, dry.stderr);
    assert!(dry.stdout.contains("one trial        ok"), "{}", dry.stdout);

    // Host b dies mid-run: its shards are lost, their trials stay missing, and `--resume` on
    // host a alone collects them.
    let eval = command_eval(
        json!(["sh", "-c", "read q; sleep 0.5; echo \"$q\""]),
        16,
        30,
    );
    let mut args = sshd::runner_args(&plugin, &keys, &[&a, &b]);
    args.extend(["--runner-option".into(), "shards=2".into()]);
    let child = mst.spawn(
        &[
            "run",
            "--config",
            s(&eval.config()),
            "--results-dir",
            s(&eval.results()),
        ]
        .into_iter()
        .map(String::from)
        .chain(args)
        .collect::<Vec<_>>(),
    );
    let dir = wait_for_run(&eval.results(), "e2e");
    wait_for_traces(&dir, 2, Duration::from_secs(60));
    b.kill();
    let first: Run = child.wait_with_output().unwrap().into();
    assert_eq!(first.code, 2, "partial\n{}", first.stderr);
    let record = read_json(&dir.join("run.json"));
    let lost = mst_tests::lost_machines(&record);
    assert_eq!(lost.len(), 1, "{}", record["machines"]);
    assert!(lost[0]["machine"].as_str().unwrap().contains(&b.host()));
    // A host that is gone cannot remove the shard's work directory: run.json says which stays.
    let workdir = lost[0]["placement"]["workdir"].as_str().unwrap();
    let why = lost[0]["disposeError"].as_str().unwrap_or_default();
    assert!(why.contains("dispose-machine"), "{}", lost[0]);
    // "Host b" is this machine: remove what a real gone host would keep.
    std::fs::remove_dir_all(workdir).unwrap();
    let missing = read_json(&dir.join("summary.json"))["missing"]
        .as_array()
        .unwrap()
        .len();
    assert!((1..16).contains(&missing), "{missing}");

    let id = run_id(&dir);
    // The same two shards, now both on the host that is left.
    let mut args = sshd::runner_args(&plugin, &keys, &[&a]);
    args.extend(["--runner-option".into(), "shards=2".into()]);
    args.extend(["--resume".into(), id]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_resumed(&eval.run(&mst, &args), missing);
}

/// One OpenSSH server on loopback, its keys and the ssh runner plugin; `None`, the test
/// skipped, where no sshd can run.
fn one_ssh_host() -> Option<(sshd::SshKeys, Sshd, std::path::PathBuf)> {
    if !sshd::available() {
        eprintln!("skipped: no OpenSSH server here");
        return None;
    }
    let keys = sshd::keys();
    let host = Sshd::start(&keys, "a");
    Some((keys, host, mst_tests::plugin("ssh-runner.wasm")))
}

#[test]
fn on_an_ssh_host_each_trial_runs_sandboxed_unless_the_operator_says_none() {
    let Some((keys, host, plugin)) = one_ssh_host() else {
        return;
    };
    // The agent looks for the shard's bundle (every case's input) and results next
    // to its own directory, for the worker among its processes, and at its home.
    let probe = r#"echo "bundles $(ls -d /tmp/mst-*/bundle* 2>/dev/null | wc -l)"
for p in /proc/[0-9]*; do
  if tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q ' collec[t] '; then echo "saw the worker"; fi
done
echo "home $HOME $(ls -A "$HOME" | wc -l)""#;
    let mut said = Vec::new();
    for isolation in ["bwrap", "none"] {
        let eval = command_eval(json!(["sh", "-c", probe]), 1, 30);
        let mut args = sshd::runner_args(&plugin, &keys, &[&host]);
        args.extend(["--runner-option".into(), format!("isolation={isolation}")]);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let run = eval.run(&Mst::new(), &args);
        assert_eq!(run.code, 0, "{isolation}: {}\n{}", run.stdout, run.stderr);
        let trace = mst_tests::read_trace(&eval.run_dir("e2e"), "default/c1/0");
        said.push(trace["trace"]["finalText"].as_str().unwrap().to_string());
    }
    let (boxed, open) = (&said[0], &said[1]);
    // The control: unsandboxed, the agent finds the bundle and the worker.
    assert!(
        !open.contains("bundles 0") && open.contains("saw the worker"),
        "{open}"
    );
    assert!(boxed.contains("bundles 0"), "{boxed}");
    assert!(!boxed.contains("saw the worker"), "{boxed}");
    assert!(
        boxed.contains("home /tmp/mst-home-"),
        "a fresh home: {boxed}"
    );
    assert!(boxed.trim_end().ends_with(" 0"), "an empty one: {boxed}");
}

#[test]
fn artefacts_come_back_over_ssh_and_a_kept_host_says_how_to_get_in() {
    let Some((keys, host, plugin)) = one_ssh_host() else {
        return;
    };
    let mst = Mst::new();
    // c1 passes, c2 fails: both leave a file in a subdirectory whose name needs quoting.
    let agent = r#"read q
mkdir -p "$MST_ARTIFACTS/out dir" && echo "notes on $q" > "$MST_ARTIFACTS/out dir/notes.txt"
case "$q" in *2) echo "broken by $q" >&2; exit 5;; esac"#;
    let eval = command_eval(json!(["sh", "-c", agent]), 2, 30);
    let mut args = sshd::runner_args(&plugin, &keys, &[&host]);
    args.extend(["--runner-option".into(), "keep=failed".into()]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = eval.run(&mst, &args);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e").join("artifacts/default");
    let read = |path: &str| std::fs::read_to_string(dir.join(path)).unwrap();
    assert_eq!(read("c1/0/out dir/notes.txt"), "notes on question 1\n");
    assert_eq!(read("c2/0/out dir/notes.txt"), "notes on question 2\n");
    assert_eq!(
        read("c2/0/mst-diagnosis/stderr.txt"),
        "broken by question 2\n"
    );
    assert!(read("c2/0/mst-diagnosis/system.json").contains("exited with code 5"));

    // Kept (a trial failed on it): the printed way in is the exec template with a shell,
    // and it reaches the work directory on the host.
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machine = &record["machines"][0];
    assert_eq!(machine["failedTrials"], 1, "{machine}");
    let enter = machine["kept"]["enter"].as_str().unwrap();
    assert!(
        enter.starts_with("ssh ") && enter.contains(" exec ") && enter.ends_with(" sh -i"),
        "{enter}"
    );
    assert!(
        run.stdout.contains(&format!("get in: {enter}")),
        "{}",
        run.stdout
    );
    let inside = std::process::Command::new("sh")
        .args(["-c", enter])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write;
            let stdin = child.stdin.as_mut().unwrap();
            stdin.write_all(b"pwd; ls artifacts/default/c2/0\n")?;
            drop(child.stdin.take());
            child.wait_with_output()
        })
        .unwrap();
    let listed = String::from_utf8_lossy(&inside.stdout);
    let workdir = machine["placement"]["workdir"].as_str().unwrap();
    assert!(
        listed.contains(workdir) && listed.contains("mst-diagnosis") && listed.contains("out dir"),
        "{listed}"
    );
    // The kept work directory is the operator's to remove.
    assert!(std::path::Path::new(workdir).is_dir());
    std::fs::remove_dir_all(workdir).unwrap();
}

#[test]
fn plugin_check_dry_run_times_each_step_and_fails_on_any() {
    let mst = Mst::new();
    let plugin = mst_tests::fixture("hostile-runner.wasm");
    let dir = tempfile::tempdir().unwrap();
    let dir_option = format!("dir={}", s(dir.path()));
    let dry_run = |behaviour: &str| {
        let behaviour = format!("behaviour={behaviour}");
        mst.run(&[
            "plugin",
            "check",
            s(&plugin),
            "--dry-run",
            "--runner-option",
            &behaviour,
            "--runner-option",
            &dir_option,
            "--allow-exec",
            "sh",
            "--json",
        ])
    };
    let ok = dry_run("shell");
    assert_eq!(ok.code, 0, "{}\n{}", ok.stdout, ok.stderr);
    let steps = ok.json()["dryRun"]["steps"].clone();
    let names: Vec<&str> = steps
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            assert_eq!(s["status"], "ok", "{s}");
            assert!(s["ms"].is_u64(), "{s}");
            s["name"].as_str().unwrap()
        })
        .collect();
    assert_eq!(names, mst_tests::DRY_RUN_STEPS);

    let refused = dry_run("ungranted");
    assert_eq!(refused.code, 1, "{}", refused.stdout);
    let steps = refused.json()["dryRun"]["steps"].clone();
    assert_eq!(steps[1]["status"], "failed");
    assert!(
        steps[1]["detail"].as_str().unwrap().contains("`bash`"),
        "{steps}"
    );
    assert_eq!(steps[2]["status"], "skipped");

    let bad_option = mst.run(&[
        "plugin",
        "check",
        s(&plugin),
        "--dry-run",
        "--runner-option",
        "behaviour=shell",
    ]);
    assert_eq!(bad_option.code, 1, "{}", bad_option.stdout);
    assert!(
        bad_option.stdout.contains("options          FAILED") && bad_option.stdout.contains("dir"),
        "{}",
        bad_option.stdout
    );

    let grader = mst.run(&[
        "plugin",
        "check",
        s(&mst_tests::plugin("contains.wasm")),
        "--dry-run",
    ]);
    assert_eq!(grader.code, 2);
    assert!(
        grader.stderr.contains("runner plugins"),
        "{}",
        grader.stderr
    );
}

#[test]
fn a_create_machine_sleeping_in_a_host_call_fails_its_shard_at_the_time_limit() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 4, 30);
    let started = std::time::Instant::now();
    let run = hostile_run(
        &mst,
        &eval,
        "sleep",
        &[
            "--runner-option",
            "shards=2",
            "--allow-exec",
            "sh",
            "--plugin-timeout",
            "3",
        ],
    );
    let elapsed = started.elapsed();
    eprintln!("a run whose create-machine sleeps 120 s under a 3 s limit took {elapsed:?}");
    assert_eq!(run.code, 2, "partial\n{}", run.stderr);
    assert!(
        run.stderr
            .contains("time limit of 3.0s, waiting in a host call"),
        "{}",
        run.stderr
    );
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
}

#[test]
fn a_huge_machine_description_is_cut_before_it_reaches_the_run() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 1, 30);
    let run = hostile_run(&mst, &eval, "big-description", &["--allow-exec", "sh"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stderr.len() < 64 * 1024, "{} bytes", run.stderr.len());
    for file in mst_tests::walk(&eval.run_dir("e2e")) {
        let size = std::fs::metadata(&file).unwrap().len();
        assert!(size < 1 << 20, "{} has {size} bytes", file.display());
    }
    let record = std::fs::read_to_string(eval.run_dir("e2e").join("run.json")).unwrap();
    assert!(record.contains("[cut by mst: "), "{record}");
}

#[test]
fn a_dispose_error_of_escapes_and_forged_lines_reaches_the_terminal_and_run_json_defused() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let run = hostile_run(&mst, &eval, "dirty-dispose", &["--allow-exec", "sh"]);
    // The trials ran; only the machine's disposal failed, and the run says so.
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("cannot dispose of its machine")
            && run.stderr.contains("the work directory stays\\nshard 9"),
        "{}",
        run.stderr
    );
    for (name, text) in [("stdout", &run.stdout), ("stderr", &run.stderr)] {
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{name}: {text:?}"
        );
        assert!(
            !text.lines().any(|line| line.starts_with("shard 9")),
            "a forged line on {name}: {text}"
        );
    }
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    assert!(!machines.is_empty());
    for machine in machines {
        let why = machine["disposeError"].as_str().unwrap_or_default();
        assert!(why.contains("the work directory stays"), "{machine}");
        assert!(
            !why.contains(['\u{1b}', '\u{7}', '\n']),
            "run.json keeps the error defused: {why:?}"
        );
    }
}

#[test]
fn a_dispose_machine_sleeping_in_a_host_call_is_stopped_at_the_time_limit() {
    let mst = Mst::new();
    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let started = std::time::Instant::now();
    let run = hostile_run(
        &mst,
        &eval,
        "sleep-dispose",
        &["--allow-exec", "sh", "--plugin-timeout", "3"],
    );
    let elapsed = started.elapsed();
    eprintln!("a run whose dispose-machine sleeps 120 s under a 3 s limit took {elapsed:?}");
    assert!(
        run.stderr.contains("dispose-machine")
            && run
                .stderr
                .contains("time limit of 3.0s, waiting in a host call"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(elapsed < Duration::from_secs(60), "took {elapsed:?}");
}

#[test]
fn a_provider_limit_holds_across_shards_measured_at_the_model_server() {
    // Each model reply takes 300 ms; 12 trials over 4 shards of 4 trials at once could put 12
    // calls in flight, and the limit allows 2.
    let reply = json!({"content": [{"type": "text", "text": "ok"}],
                       "usage": {"input_tokens": 1, "output_tokens": 1}});
    let server = ModelServer::start_slow(vec![Reply::ok(reply)], Duration::from_millis(300));
    let cases: Vec<serde_json::Value> = (1..=12)
        .map(|i| json!({"id": format!("c{i}"), "input": "hi"}))
        .collect();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"],
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(),
                                      "key": "MODEL_KEY"}},
               "client": "api", "model": "acme/m",
               "judges": [{"assert": "contains", "value": "ok"}],
               "limits": {"providers": {"acme": 2}}, "concurrency": 4, "timeout": 30}),
        &cases,
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "MODEL_KEY=mst-canary-limit-key\n").unwrap();
    let run = hostile_run(
        &Mst::new(),
        &eval,
        "shell",
        &[
            "--runner-option",
            "shards=4",
            "--allow-exec",
            "sh",
            "--secrets-file",
            s(&secrets),
            "-q",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(server.requests().len(), 12);
    assert_eq!(
        server.most_in_flight(),
        2,
        "the limit held, and trials did run side by side"
    );
}

#[test]
fn provider_slots_are_taken_per_model_call_not_per_trial() {
    // Limit 1, two shards of one trial each. Every reply asks for the `nap` tool, which sleeps
    // 1.5 s, and each trial makes 3 model calls (maxTurns). With a slot per trial, the second
    // trial's first call could go out only after the first trial's last one; with a slot per
    // call it goes out while the first trial naps.
    let reply = json!({"content": [{"type": "tool_use", "id": "toolu_1", "name": "slow__nap", "input": {}}],
                       "stop_reason": "tool_use",
                       "usage": {"input_tokens": 3, "output_tokens": 2}});
    let server = ModelServer::start_slow(vec![Reply::ok(reply)], Duration::from_millis(200));
    let standin = mst_tests::root().join("tests/standins/slow_mcp.py");
    // By their ids' hashes, `one` runs on shard 1 and `two` on shard 0.
    let cases = [
        json!({"id": "one", "input": "case-one"}),
        json!({"id": "two", "input": "case-two"}),
    ];
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"],
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(),
                                      "key": "MODEL_KEY"}},
               "client": "api", "model": "acme/m",
               "clientOptions": {"maxTurns": 3},
               "servers": {"slow": {"command": "python3", "args": [s(&standin)]}},
               "limits": {"providers": {"acme": 1}}, "concurrency": 1, "timeout": 60}),
        &cases,
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, "MODEL_KEY=mst-canary-per-call-key\n").unwrap();
    let run = hostile_run(
        &Mst::new(),
        &eval,
        "shell",
        &[
            "--runner-option",
            "shards=2",
            "--allow-exec",
            "sh",
            "--secrets-file",
            s(&secrets),
            "-q",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let machines = read_json(&eval.run_dir("e2e").join("run.json"))["machines"].clone();
    assert_eq!(
        machines.as_array().unwrap().len(),
        2,
        "one trial per shard: {machines}"
    );
    let mut requests = server.requests();
    requests.sort_by_key(|r| r.at);
    let case_of = |r: &mst_tests::model_server::Request| {
        r.body["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let order: Vec<String> = requests.iter().map(case_of).collect();
    assert_eq!(order.len(), 6, "{order:?}");
    let first = order[0].clone();
    let last_of_first = order.iter().rposition(|c| *c == first).unwrap();
    let first_of_other = order.iter().position(|c| *c != first).unwrap();
    assert!(
        first_of_other < last_of_first,
        "the other trial's call went out while {first} was still running: {order:?}"
    );
    assert_eq!(server.most_in_flight(), 1, "the limit held: {order:?}");
}
