//! Artefacts and failure diagnosis end to end on the real local runner (issue 17, section 1):
//! what a client writes into `$MST_ARTIFACTS` comes back under
//! `artifacts/<variant>/<case>/<trial>/`, a failed or timed-out trial gets the worker's
//! diagnosis there, links and hostile lists never bring anything else back, the caps hold,
//! secrets are redacted, the config switch turns it all off, and `keep=failed` says how to
//! get into the machine it kept. (The Docker runner's side is in docker.rs.)

use mst_tests::{read_json, s, stand_in_worker, Eval, Mst};
use serde_json::json;
use std::path::{Path, PathBuf};

/// The agent: writes a report and a log into its artefact directory, plants a link to a file
/// outside, then passes, fails (exit 3) or hangs past the deadline, by its input.
const AGENT: &str = r#"read input
echo "working on $input"
echo "report for $input" > "$MST_ARTIFACTS/report.txt"
mkdir -p "$MST_ARTIFACTS/logs" && echo "log of $input" > "$MST_ARTIFACTS/logs/app.log"
ln -s /etc/passwd "$MST_ARTIFACTS/passwd"
case "$input" in
  fail*) echo "about to fail" >&2; exit 3;;
  hang*) echo "hanging now" >&2; exec sleep 37;;
esac
echo "done"
"#;

fn three_case_eval(extra: serde_json::Value) -> Eval {
    let mut config = json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
        "clientOptions": {"command": ["sh", "-c", AGENT]},
        "judges": [{"assert": "exit-code", "value": 0}], "concurrency": 3, "timeout": 3});
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    Eval::new(
        config,
        &[
            json!({"id": "ok", "input": "pass-1"}),
            json!({"id": "bad", "input": "fail-1"}),
            json!({"id": "slow", "input": "hang-1"}),
        ],
    )
}

/// Every file below `dir`, as paths relative to it, sorted.
fn files_below(dir: &Path) -> Vec<String> {
    let mut files: Vec<String> = mst_tests::walk(dir)
        .into_iter()
        .filter(|p| p.is_file())
        .map(|p| p.strip_prefix(dir).unwrap().to_string_lossy().into_owned())
        .collect();
    files.sort();
    files
}

fn artifacts_of(eval: &Eval, trial: &str) -> PathBuf {
    eval.run_dir("e2e").join("artifacts").join(trial)
}

#[test]
fn what_a_trial_leaves_comes_back_and_a_failed_one_keeps_a_diagnosis() {
    let mst = Mst::new();
    let eval = three_case_eval(json!({}));
    let run = eval.run(&mst, &["--runner-option", "keep=failed"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);

    // A passing trial: what its client wrote, and nothing of the worker's; the planted link
    // was never followed.
    let ok = artifacts_of(&eval, "default/ok/0");
    assert_eq!(files_below(&ok), ["logs/app.log", "report.txt"]);
    assert_eq!(
        std::fs::read_to_string(ok.join("report.txt")).unwrap(),
        "report for pass-1\n"
    );

    // A failed one: its files and the diagnosis, whose tails are the end of its output.
    let bad = artifacts_of(&eval, "default/bad/0");
    assert_eq!(
        files_below(&bad),
        [
            "logs/app.log",
            "mst-diagnosis/processes.txt",
            "mst-diagnosis/stderr.txt",
            "mst-diagnosis/stdout.txt",
            "mst-diagnosis/system.json",
            "report.txt"
        ]
    );
    let diagnosis = bad.join("mst-diagnosis");
    assert_eq!(
        std::fs::read_to_string(diagnosis.join("stderr.txt")).unwrap(),
        "about to fail\n"
    );
    assert_eq!(
        std::fs::read_to_string(diagnosis.join("stdout.txt")).unwrap(),
        "working on fail-1\n"
    );
    let system = read_json(&diagnosis.join("system.json"));
    assert_eq!(
        system["failure"], "the client exited with code 3",
        "{system}"
    );
    for fact in [
        "memoryTotalBytes",
        "memoryAvailableBytes",
        "diskFreeBytes",
        "diskTotalBytes",
    ] {
        assert!(
            system["machine"][fact].as_u64().unwrap() > 0,
            "{fact}: {system}"
        );
    }
    assert_eq!(system["machine"]["load"].as_array().unwrap().len(), 3);

    // A timed-out one: the process list was taken before the deadline's kill, so the hung
    // program is in it.
    let slow = artifacts_of(&eval, "default/slow/0/mst-diagnosis");
    let processes = std::fs::read_to_string(slow.join("processes.txt")).unwrap();
    assert!(
        processes.lines().any(|l| l.ends_with("sleep 37")),
        "{processes}"
    );
    let system = read_json(&slow.join("system.json"));
    assert!(
        system["failure"]
            .as_str()
            .unwrap()
            .starts_with("timed out after"),
        "{system}"
    );
    assert_eq!(
        std::fs::read_to_string(slow.join("stderr.txt")).unwrap(),
        "hanging now\n"
    );

    // run.json counts them, keeps the machine (two trials failed on it) and says how to get
    // in; the end of the run prints the same.
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let machine = &record["machines"][0];
    assert_eq!(machine["failedTrials"], 2, "{machine}");
    assert_eq!(machine["artifacts"]["trials"], 3, "{machine}");
    assert_eq!(machine["artifacts"]["files"], 14, "{machine}");
    let enter = machine["kept"]["enter"].as_str().unwrap();
    let kept_dir = enter.strip_prefix("cd ").unwrap();
    assert!(Path::new(kept_dir).join("results").is_dir(), "{enter}");
    assert!(
        run.stdout.contains(&format!("get in: {enter}")),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("artifacts: 14 file(s) from 3 trial(s)"));
    std::fs::remove_dir_all(kept_dir).unwrap();
}

#[test]
fn artefacts_are_off_when_the_config_says_so_and_capped_when_on() {
    let mst = Mst::new();
    // Off: the agent gets no directory, and nothing comes back, failed trials included.
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "echo \"[${MST_ARTIFACTS-unset}]\"; exit 1"],
                                 "input": "none"},
               "artifacts": {"enabled": false},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let run = eval.run(&mst, &["-q", "--runner-option", "keep=failed"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(!eval.run_dir("e2e").join("artifacts").exists());
    let trace = mst_tests::read_trace(&eval.run_dir("e2e"), "default/c1/0");
    assert_eq!(trace["trace"]["finalText"], "[unset]", "{trace}");
    // Nor is anything left on the kept machine for it.
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let enter = record["machines"][0]["kept"]["enter"].as_str().unwrap();
    let kept_dir = PathBuf::from(enter.strip_prefix("cd ").unwrap());
    assert!(!kept_dir.join("artifacts").exists());
    std::fs::remove_dir_all(kept_dir).unwrap();

    // Capped: 1 MiB a trial. The diagnosis and the small file fit; the 2 MiB one does not.
    let agent = r#"echo small > "$MST_ARTIFACTS/small.txt"
head -c 2097152 /dev/zero > "$MST_ARTIFACTS/big.bin"
exit 1"#;
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "input": "none"},
               "artifacts": {"maxTrialMiB": 1},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let files = files_below(&artifacts_of(&eval, "default/c1/0"));
    assert!(files.contains(&"small.txt".to_string()), "{files:?}");
    assert!(
        files.contains(&"mst-diagnosis/system.json".to_string()),
        "{files:?}"
    );
    assert!(!files.iter().any(|f| f == "big.bin"), "{files:?}");
    // The worker says what it left out, in its log.
    let log = std::fs::read_to_string(eval.run_dir("e2e").join("shards/0.worker.log")).unwrap();
    assert!(
        log.contains("artefact left out: big.bin: past the trial's cap"),
        "{log}"
    );
}

#[test]
fn a_secret_the_agent_writes_into_an_artefact_comes_back_redacted() {
    const KEY: &str = "mst-canary-artefact-key-51c3";
    let mst = Mst::new();
    let agent = r#"echo "key=$AGENT_KEY" > "$MST_ARTIFACTS/leak.txt"
echo "stderr key=$AGENT_KEY" >&2
exit 2"#;
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "input": "none",
                                 "secretEnv": {"AGENT_KEY": "AGENT_API_KEY"}},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("AGENT_API_KEY={KEY}\n")).unwrap();
    let run = eval.run(&mst, &["-q", "--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = artifacts_of(&eval, "default/c1/0");
    assert_eq!(
        std::fs::read_to_string(dir.join("leak.txt")).unwrap(),
        "key=[redacted:AGENT_API_KEY]\n"
    );
    assert_eq!(
        std::fs::read_to_string(dir.join("mst-diagnosis/stderr.txt")).unwrap(),
        "stderr key=[redacted:AGENT_API_KEY]\n"
    );
    assert!(mst_tests::files_containing(&eval.results(), KEY).is_empty());
}

/// A stand-in worker that runs trial c1 of a one-case eval, writes `files` (shell commands,
/// run in the trial's artefact directory beside its results) and lists `listed` (JSON) in its
/// `trial` message.
fn listing_worker(eval: &Eval, files: &str, listed: &str) -> String {
    let trace = json!({"case": {"id": "c1", "input": "x"}, "variant": "default", "trial": 0,
                       "trace": {"finalText": "fine", "exitCode": 0}});
    let script = format!(
        r#"while [ $# -gt 0 ]; do [ "$1" = --results ] && r=$2; shift; done
a="$r/../artifacts/default/c1/0"; mkdir -p "$a"; cd "$a"
{files}
echo "$HELLO"
k='{{"variant":"default","case":"c1","trial":0}}'
echo '{{"type":"acquire","key":'"$k"',"servers":[]}}'
read granted
cat <<'LINE'
{{"type":"trial","key":{{"variant":"default","case":"c1","trial":0}},"status":"collected","path":"x","trace":{trace},"artifacts":{listed}}}
LINE
echo '{{"type":"done","counts":{{"collected":1,"infra":0,"skipped":0}},"cleanup":"ok"}}'
"#
    );
    stand_in_worker(eval.dir.path(), "lister.sh", &script)
}

fn one_case_eval(extra: serde_json::Value) -> Eval {
    let mut config = json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
        "clientOptions": {"command": ["cat"]},
        "judges": [{"assert": "contains", "value": "fine"}], "timeout": 30});
    for (key, value) in extra.as_object().unwrap() {
        config[key] = value.clone();
    }
    Eval::new(config, &[json!({"id": "c1", "input": "x"})])
}

#[test]
fn a_hostile_list_brings_back_only_plain_files_of_the_trials_own_directory() {
    let mst = Mst::new();
    let eval = one_case_eval(json!({}));
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "outside-canary-7f2e").unwrap();
    let planted = format!(
        "echo fine > ok.txt; ln -s {}/secret.txt link.txt; mkfifo pipe; mkdir d; ln -s {} d/up",
        s(outside.path()),
        s(outside.path())
    );
    let listed = json!([
        {"path": "ok.txt", "bytes": 5},
        {"path": "link.txt", "bytes": 19},
        {"path": "pipe", "bytes": 0},
        {"path": "d/up/secret.txt", "bytes": 19},
        {"path": "../../../../../../etc/passwd", "bytes": 100},
        {"path": "/etc/passwd", "bytes": 100},
        {"path": "ok.txt", "bytes": 5}
    ]);
    let worker = listing_worker(&eval, &planted, &listed.to_string());
    let run = eval.run(&mst, &["--runner-option", &worker]);
    // The trial's outcome stands: artefacts are evidence, not results.
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = artifacts_of(&eval, "default/c1/0");
    assert_eq!(files_below(&dir), ["ok.txt"]);
    assert!(mst_tests::files_containing(&eval.results(), "outside-canary-7f2e").is_empty());
    assert!(mst_tests::files_containing(&eval.results(), "root:x:0:0").is_empty());
    for said in [
        "link.txt: refused",
        "pipe: refused",
        "d/up/secret.txt: refused",
        "\"../../../../../../etc/passwd\" is not a plain relative path",
        "\"/etc/passwd\" is not a plain relative path",
        "ok.txt is listed twice",
    ] {
        assert!(run.stderr.contains(said), "{said}: {}", run.stderr);
    }
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    assert_eq!(
        record["machines"][0]["artifacts"],
        json!({"trials": 1, "files": 1, "bytes": 5, "skipped": 6})
    );
}

#[test]
fn a_worker_listing_artefacts_for_a_bundle_that_keeps_none_loses_its_shard() {
    let mst = Mst::new();
    let eval = one_case_eval(json!({"artifacts": {"enabled": false}}));
    let worker = listing_worker(
        &eval,
        "echo fine > ok.txt",
        r#"[{"path": "ok.txt", "bytes": 5}]"#,
    );
    let run = eval.run(&mst, &["--runner-option", &worker]);
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(
            "the worker listed artefacts for trial default/c1/0, but this bundle keeps none"
        ),
        "{}",
        run.stderr
    );
    assert!(!eval.run_dir("e2e").join("artifacts").exists());
}

#[test]
fn a_sandboxed_trial_writes_its_artefact_directory_and_nothing_else_of_the_machine() {
    // Each program of a sandboxed trial writes only the trial's own directories: its artefact
    // directory is one of them.
    let eval = three_case_eval(json!({}));
    let run = eval.run(&Mst::new(), &["--runner-option", "isolation=bwrap"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let ok = artifacts_of(&eval, "default/ok/0");
    assert_eq!(files_below(&ok), ["logs/app.log", "report.txt"]);
    let bad = artifacts_of(&eval, "default/bad/0");
    assert!(
        files_below(&bad).contains(&"mst-diagnosis/stderr.txt".to_string()),
        "{:?}",
        files_below(&bad)
    );
}
