//! Grading on runners (issue 17, section 3): `mst grade RUN --runner …` runs a stored run's
//! judges in grade shards on machines, through the shard protocol, and the coordinator alone
//! decides each verdict from the scores that come back. Driven on the real local runner, with a
//! real grader plugin granted `exec`; a stand-in worker plays a machine that forges scores.
//! (Grading in Docker containers is in `docker.rs`.)

use mst_tests::{
    collected_exec_judged_eval, fixture, hello_cases, judge_program, read_json, stand_in_worker,
    Eval, Mst, TRACES_FILE,
};
use serde_json::{json, Value};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// `mst grade RUN ARGS` on `eval`'s results, with `path` first on the PATH (and shown to a
/// local machine's sandbox).
fn grade(mst: &Mst, eval: &Eval, run: &str, args: &[&str], path: &Path) -> mst_tests::Run {
    let results = eval.results();
    let mut command = mst.command(&["grade", run, "--results-dir", mst_tests::s(&results)]);
    command.args(args).current_dir(eval.dir.path());
    if args.windows(2).any(|pair| pair == ["--runner", "local"]) {
        command.args(["--runner-option", &format!("expose={}", path.display())]);
    }
    let old = std::env::var("PATH").unwrap_or_default();
    command.env("PATH", format!("{}:{old}", path.display()));
    command.output().expect("run mst").into()
}

/// The grades of a run directory by trial (`variant/case/trial`).
fn grades_of(dir: &Path) -> std::collections::BTreeMap<String, Value> {
    let grades = read_json(&dir.join("grades.json"));
    grades
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| {
            let key = &entry["key"];
            let name = format!(
                "{}/{}/{}",
                key["variant"].as_str().unwrap(),
                key["case"].as_str().unwrap(),
                key["trial"]
            );
            (name, entry["grade"].clone())
        })
        .collect()
}

#[test]
fn judges_run_in_the_grade_shards_worker_and_the_coordinator_decides_as_it_would_itself() {
    let mst = Mst::new();
    let (eval, run_dir, run) = collected_exec_judged_eval(&mst);
    let bin = judge_program(&eval.dir.path().join("bin"));

    // In the coordinator, then in a grade shard on the local runner.
    let here = grade(&mst, &eval, &run, &["--json"], &bin);
    assert_eq!(here.code, 1, "{}\n{}", here.stderr, here.stdout);
    let there = grade(&mst, &eval, &run, &["--json", "--runner", "local"], &bin);
    assert_eq!(there.code, 1, "{}\n{}", there.stderr, there.stdout);
    let (here, there) = (here.json(), there.json());
    for field in ["variants", "cases", "missing", "grade"] {
        assert_eq!(here[field], there[field], "{field}: {here}\n{there}");
    }
    assert_eq!(there["variants"]["default"]["passed"], 4, "{there}");
    assert_eq!(there["variants"]["default"]["failed"], 1, "{there}");

    let g1 = run_dir.with_file_name(format!("{run}.g1"));
    let g2 = run_dir.with_file_name(format!("{run}.g2"));
    // The judge's program ran under the grade shard's worker, not under `mst grade`.
    let (local, remote) = (grades_of(&g1), grades_of(&g2));
    let reason = |grades: &std::collections::BTreeMap<String, Value>, trial: &str| {
        grades[trial]["judges"][1]["reason"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(
        reason(&local, "default/c1/0").contains("mst grade"),
        "{local:?}"
    );
    let worker = reason(&remote, "default/c1/0");
    assert!(worker.contains(" collect --bundle "), "{worker}");
    assert_eq!(remote["default/c5/0"]["pass"], false, "{remote:?}");
    assert_eq!(
        remote["default/c5/0"]["judges"][0]["pass"], true,
        "the assertion passed"
    );

    // The record says where it was graded; the machines' answers are kept.
    let record = read_json(&g2.join("run.json"));
    assert_eq!(record["grading"]["runner"], "local", "{record}");
    assert_eq!(record["grading"]["machines"][0]["ended"]["status"], "done");
    assert_eq!(
        record["grading"]["machines"][0]["worker"]["client"]["name"],
        "grade"
    );
    let answers = std::fs::read_to_string(g2.join("grading").join(TRACES_FILE)).unwrap();
    assert_eq!(answers.lines().count(), 5, "{answers}");
    assert!(read_json(&g1.join("run.json")).get("grading").is_none());
}

#[test]
fn judges_that_need_a_secret_stay_on_the_coordinator() {
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["cat"]},
               "plugins": [{"path": "hostile.wasm", "allowSecret": ["MST_CANARY"]}],
               "judges": [{"plugin": "mst/fixture/hostile", "options": {"behaviour": "ok"}}],
               "timeout": 30}),
        &hello_cases()[..1],
    );
    std::fs::copy(
        fixture("hostile.wasm"),
        eval.dir.path().join("hostile.wasm"),
    )
    .unwrap();
    let mut collect = mst.command(&eval.args(&["--json", "-q"]));
    let collected: mst_tests::Run = collect.env("MST_CANARY", "c4n4ry").output().unwrap().into();
    assert_eq!(
        collected.code, 0,
        "{}\n{}",
        collected.stderr, collected.stdout
    );
    let run_dir = eval.run_dir("e2e");
    let run = run_dir.file_name().unwrap().to_str().unwrap();
    let mut command = mst.command(&["grade", run, "--runner", "local", "--results-dir"]);
    command.arg(eval.results()).current_dir(eval.dir.path());
    let refused: mst_tests::Run = command.env("MST_CANARY", "c4n4ry").output().unwrap().into();
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("judge `mst/fixture/hostile`")
            && refused.stderr.contains("secret `MST_CANARY`")
            && refused.stderr.contains("grade without --runner"),
        "{}",
        refused.stderr
    );
    assert!(!run_dir.with_file_name(format!("{run}.g1")).exists());
}

/// A stand-in grade worker answering each trial of c1..c5 as `answers` says (`None`: it
/// reports the trial as infra, with no answer) the first time it runs, and mst's own worker
/// every time after (so a `--resume` with the same runner options gets an honest machine).
fn forging_worker(eval: &Eval, answers: &[(&str, Option<Value>)]) -> String {
    let once = eval.dir.path().join("forged-once");
    let mut body = format!(
        "[ -e '{once}' ] && exec '{mst}' \"$@\"\ntouch '{once}'\necho \"$HELLO\"\n",
        once = once.display(),
        mst = mst_tests::mst_bin().display()
    );
    for (case, answer) in answers {
        let id: u32 = case[1..].parse().unwrap();
        let key = json!({"variant": "default", "case": case, "trial": 0});
        let input = format!("case-{id} says {}", if id == 5 { "bye" } else { "hello" });
        let line = match answer {
            Some(answer) => json!({"type": "trial", "key": key, "status": "collected", "path": "x",
                "trace": {"case": {"id": case, "input": input}, "variant": "default", "trial": 0,
                          "trace": {"status": "completed", "finalText": answer.to_string(),
                                    "exitCode": 0}}}),
            None => json!({"type": "trial", "key": key, "status": "infra", "path": "x",
                           "error": "the judges could not start"}),
        };
        body.push_str(&format!(
            "echo '{}'\nread granted\ncat <<'LINE'\n{line}\nLINE\n",
            json!({"type": "acquire", "key": key, "servers": []})
        ));
    }
    body.push_str("echo '{\"type\":\"done\",\"counts\":{\"collected\":4,\"infra\":1,\"skipped\":0},\"cleanup\":\"ok\"}'\n");
    stand_in_worker(eval.dir.path(), "forger.sh", &body)
}

/// A [`forging_worker`] whose plugin judge (the only judge that runs there) forges a score out
/// of range for c1, a judge the trial does not have on a machine for c2, the assertion's call
/// too (which the coordinator makes) for c3, a pass for c5 (whose honest judge fails it:
/// scores are its word), and reports c4 as infra.
fn worker_forging_every_kind_of_score(eval: &Eval) -> String {
    let score = |judge: &str, value: f64| json!({"judge": judge, "value": value, "reason": "r"});
    let scores = |scores: &[Value]| Some(json!({ "scores": scores }));
    forging_worker(
        eval,
        &[
            ("c1", scores(&[score("mst/fixture/exec-grader", 7.0)])),
            ("c2", scores(&[score("sounds-right", 1.0)])),
            (
                "c3",
                scores(&[
                    score("contains", 1.0),
                    score("mst/fixture/exec-grader", 1.0),
                ]),
            ),
            ("c5", scores(&[score("mst/fixture/exec-grader", 1.0)])),
            ("c4", None),
        ],
    )
}

/// The forged grading (`forged`, into `g1`): the forged trials get no verdict, each with an
/// error saying what was wrong, c4 is missing, and only the forged c5 passed.
fn assert_forged_scores_get_no_verdict(forged: &mst_tests::Run, g1: &Path) {
    let summary = forged.json();
    assert_eq!(
        summary["variants"]["default"]["notGraded"], 3,
        "{summary}\n{}",
        forged.stderr
    );
    assert_eq!(summary["variants"]["default"]["passed"], 1, "{summary}");
    assert_eq!(
        summary["missing"],
        json!([{"variant": "default", "case": "c4", "trial": 0}])
    );
    let grades = grades_of(g1);
    let error = |trial: &str| grades[trial]["error"].as_str().unwrap().to_string();
    assert!(
        error("default/c1/0").contains("score 7 is outside 0..1"),
        "{grades:?}"
    );
    assert!(
        error("default/c2/0").contains("\"sounds-right\""),
        "{grades:?}"
    );
    assert!(
        error("default/c3/0").contains("2 score(s) for the trial's 1 judge(s)"),
        "{grades:?}"
    );
    assert_eq!(grades["default/c1/0"]["judge"], "grade shard 0");
}

/// The resumed grading (`resumed`) of `run` (in `run_dir`) went on in `g1` on a second
/// machine, and graded the missing c4 there, honestly: nothing is missing now.
fn assert_resume_graded_what_was_left(
    resumed: &mst_tests::Run,
    run_dir: &Path,
    run: &str,
    g1: &Path,
) {
    let summary = resumed.json();
    assert!(
        summary["missing"].as_array().unwrap().is_empty(),
        "{summary}\n{}",
        resumed.stderr
    );
    assert_eq!(
        summary["variants"]["default"]["passed"], 2,
        "c4 and the forged c5: {summary}"
    );
    assert!(
        !run_dir.with_file_name(format!("{run}.g2")).exists(),
        "it went on in g1"
    );
    let record = read_json(&g1.join("run.json"));
    assert_eq!(
        record["grading"]["machines"].as_array().unwrap().len(),
        2,
        "{record}"
    );
    let c4 = &grades_of(g1)["default/c4/0"];
    assert!(
        c4["judges"][1]["reason"]
            .as_str()
            .unwrap()
            .contains(" collect --bundle "),
        "{c4}"
    );
}

#[test]
fn a_machine_that_forges_scores_gets_no_verdict_and_resume_grades_what_it_left() {
    // Unsandboxed: the stand-in notes in the eval's directory that it forged once.
    let mst = Mst::unsandboxed();
    let (eval, run_dir, run) = collected_exec_judged_eval(&mst);
    let bin = judge_program(&eval.dir.path().join("bin"));
    let worker = worker_forging_every_kind_of_score(&eval);
    let on_the_forger = ["--json", "--runner", "local", "--runner-option", &worker];
    let forged = grade(&mst, &eval, &run, &on_the_forger, &bin);
    let g1 = run_dir.with_file_name(format!("{run}.g1"));
    assert_forged_scores_get_no_verdict(&forged, &g1);

    // Another runner is refused; the same one grades only the missing trial.
    let resume = format!("{run}.g1");
    let changed = grade(
        &mst,
        &eval,
        &run,
        &["--runner", "docker", "--resume", &resume],
        &bin,
    );
    assert_eq!(changed.code, 2, "{}", changed.stderr);
    assert!(
        changed.stderr.contains("the runner changed"),
        "{}",
        changed.stderr
    );
    let resumed = grade(
        &mst,
        &eval,
        &run,
        &[&on_the_forger[..], &["--resume", &resume]].concat(),
        &bin,
    );
    assert_resume_graded_what_was_left(&resumed, &run_dir, &run, &g1);
}

#[test]
fn on_the_ssh_runner_the_judges_program_is_the_hosts_own() {
    if !mst_tests::sshd::available() {
        eprintln!("skipped: no OpenSSH server here");
        return;
    }
    let mst = Mst::new();
    let (eval, run_dir, run) = collected_exec_judged_eval(&mst);
    // The program is on the PATH of the host's sessions only (the test account must read it).
    let host_bin = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(0o755))
        .tempdir()
        .unwrap();
    judge_program(host_bin.path());
    let keys = mst_tests::sshd::keys();
    let path = format!("SetEnv PATH={}:/usr/bin:/bin\n", host_bin.path().display());
    let host = mst_tests::sshd::Sshd::start_with(&keys, "judge", &path);
    let plugin = mst_tests::plugin("ssh-runner.wasm");
    let mut args = vec!["--json".to_string()];
    args.extend(mst_tests::sshd::runner_args(&plugin, &keys, &[&host]));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let elsewhere = tempfile::tempdir().unwrap();
    let graded = grade(&mst, &eval, &run, &args, elsewhere.path());
    let summary = graded.json();
    assert_eq!(
        summary["variants"]["default"]["passed"], 4,
        "{summary}\n{}",
        graded.stderr
    );
    assert_eq!(summary["variants"]["default"]["failed"], 1, "{summary}");
    let g1 = run_dir.with_file_name(format!("{run}.g1"));
    let reason = grades_of(&g1)["default/c1/0"]["judges"][1]["reason"].to_string();
    assert!(reason.contains(" collect --bundle "), "{reason}");
    let record = read_json(&g1.join("run.json"));
    assert_eq!(record["grading"]["runner"], "mst/runner/ssh", "{record}");
}
