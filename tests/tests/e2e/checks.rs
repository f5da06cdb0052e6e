//! Checks inside the machine end to end on the real local runner (issue 17, section 2): a real
//! Python project whose unittest suite an agent keeps passing or breaks, checked after each
//! trial in the trial's own directory and graded by `check-passed`; a variant's checks in
//! place of the eval's and a case's in place of both; a check that cannot start is infra, one
//! past its timeout fails; and
//! mistakes in `checks` stop the run before anything starts. (Docker's side is in docker.rs.)

use mst_tests::{read_json, read_trace, s, Eval, Mst};
use serde_json::{json, Value};
use std::path::Path;

/// A small Python package with a unittest suite, in `dir/project`.
fn python_project(dir: &Path) -> String {
    let project = dir.join("project");
    std::fs::create_dir_all(&project).unwrap();
    std::fs::write(
        project.join("calc.py"),
        "def add(a, b):\n    return a + b\n\n\ndef mul(a, b):\n    return a * b\n",
    )
    .unwrap();
    std::fs::write(
        project.join("test_calc.py"),
        "import unittest\n\nfrom calc import add, mul\n\n\n\
         class CalcTest(unittest.TestCase):\n\
         \x20   def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\
         \x20   def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n\n\n\
         if __name__ == \"__main__\":\n    unittest.main()\n",
    )
    .unwrap();
    s(&project).to_string()
}

/// The agent: copies the project into its directory, then leaves it alone (`keep`), or breaks
/// `add` (`break`).
fn agent(project: &str) -> Value {
    let script = format!(
        r#"read task; cp -r {project}/. .
case "$task" in break*) sed -i 's/return a + b/return a - b/' calc.py;; esac
echo "did $task""#
    );
    json!(["sh", "-c", script])
}

/// The last event of trial `trial`'s trace in `run_dir`: its last check's, when it has checks.
fn last_event(run_dir: &Path, trial: &str) -> Value {
    let trace = read_trace(run_dir, trial);
    trace["trace"]["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone()
}

/// The check event `check` says the suite failed on `add`.
fn assert_add_failed(check: &Value) {
    let stderr = check["data"]["stderr"].as_str().unwrap();
    assert!(stderr.contains("test_add"), "{check}");
}

fn tests_check() -> Value {
    json!([{"name": "tests", "run": ["python3", "-m", "unittest", "-q"], "timeout": 60}])
}

#[test]
fn a_projects_tests_run_in_the_trials_directory_and_grade_it() {
    let dir = tempfile::tempdir().unwrap();
    let project = python_project(dir.path());
    // The agent copies the project from the test's directory, shown to its sandbox.
    let mst = Mst::exposing(&[dir.path()]);
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": agent(&project)},
               "checks": tests_check(),
               "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 60}),
        &[
            json!({"id": "kept", "input": "keep the tests green"}),
            json!({"id": "broken", "input": "break add"}),
        ],
    );
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    assert_eq!(summary["variants"]["default"]["passed"], 1, "{summary}");
    assert_eq!(summary["variants"]["default"]["failed"], 1, "{summary}");

    // The passing trial's trace: the client's answer, then the check's event.
    let run_dir = eval.run_dir("e2e");
    let check = last_event(&run_dir, "default/kept/0");
    assert_eq!(check["type"], "custom", "{check}");
    assert_eq!(check["name"], "check", "{check}");
    assert_eq!(check["data"]["check"], "tests");
    assert_eq!(check["data"]["passed"], true, "{check}");
    assert_eq!(check["data"]["exitCode"], 0);
    assert!(check["data"]["stderr"]
        .as_str()
        .unwrap()
        .contains("Ran 2 tests"));

    // The broken one: the suite failed on `add`, and the grade says so.
    let check = last_event(&run_dir, "default/broken/0");
    assert_eq!(check["data"]["exitCode"], 1, "{check}");
    assert_add_failed(&check);
    let grades = read_json(&run_dir.join("grades.json"));
    let reason = grades.to_string();
    assert!(
        reason.contains("expected: check `tests` passed; it exited with 1: FAILED (failures=1)"),
        "{reason}"
    );
    // A failed check is a failure on the machine: the trial keeps a diagnosis.
    let system = read_json(&run_dir.join("artifacts/default/broken/0/mst-diagnosis/system.json"));
    assert_eq!(system["failure"], "its checks failed: tests", "{system}");
    assert!(!run_dir.join("artifacts/default/kept/0").exists());
}

#[test]
fn a_variants_checks_replace_the_evals_and_a_check_that_cannot_start_is_infra() {
    let mst = Mst::new();
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "echo done > done.txt"], "input": "none"},
               "checks": [{"name": "made", "run": ["test", "-f", "done.txt"]}],
               "variants": {
                   "plain": {},
                   "slow": {"checks": [{"name": "made", "run": ["sleep", "30"], "timeout": 0.5}]},
                   "missing": {"checks": [{"name": "made", "run": ["/nonexistent/checker"]}]}
               },
               "judges": [{"assert": "check-passed", "value": "made"}], "timeout": 30}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let variants = &run.json()["variants"];
    assert_eq!(variants["plain"]["passed"], 1, "{variants}");
    // Past its timeout the check failed; the trial is graded, and failed.
    assert_eq!(variants["slow"]["failed"], 1, "{variants}");
    // A checker that is not there says nothing of the agent's work: infra.
    assert_eq!(variants["missing"]["infra"], 1, "{variants}");
    let run_dir = eval.run_dir("e2e");
    let check = last_event(&run_dir, "slow/c1/0");
    assert_eq!(
        (
            check["data"]["timedOut"].clone(),
            check["data"]["passed"].clone()
        ),
        (json!(true), json!(false))
    );
    let missing = read_trace(&run_dir, "missing/c1/0");
    assert_eq!(missing["trace"]["status"], "infra");
    let why = missing["trace"]["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()["text"]
        .clone();
    assert!(
        why.as_str()
            .unwrap()
            .starts_with("check `made` could not run: cannot start `/nonexistent/checker`"),
        "{why}"
    );
}

#[test]
fn a_cases_checks_replace_the_variants() {
    let mst = Mst::new();
    // The agent writes its input to a file; the eval checks that the file exists, and case
    // `exact` checks its content instead (and, through `check-passed`, only that check).
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "cat > said.txt"]},
               "checks": [{"name": "said", "run": ["test", "-s", "said.txt"]}],
               "judges": [{"assert": "check-passed", "value": "said"}], "timeout": 30}),
        &[
            json!({"id": "any", "input": "anything"}),
            json!({"id": "exact", "input": "hello",
                   "checks": [{"name": "said", "run": ["grep", "-qx", "goodbye", "said.txt"]}]}),
        ],
    );
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let run_dir = eval.run_dir("e2e");
    let last_check = |trial: &str| last_event(&run_dir, trial)["data"].clone();
    assert_eq!(last_check("default/any/0")["passed"], true);
    let exact = last_check("default/exact/0");
    assert_eq!(
        (exact["passed"].clone(), exact["exitCode"].clone()),
        (json!(false), json!(1))
    );
    // The trace's case is the coordinator's own, with its checks.
    let trace = read_trace(&run_dir, "default/exact/0");
    assert_eq!(trace["case"]["checks"][0]["run"][1], "-qx", "{trace}");
    // A case's malformed checks stop the run, naming the case and where it is.
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["true"]}}),
        &[json!({"id": "c1", "input": "x", "checks": [{"name": "t", "run": []}]})],
    );
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("case `c1` (") && run.stderr.contains("`checks[0].run` is empty"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_malformed_check_stops_the_run_before_anything_starts() {
    let mst = Mst::new();
    for (checks, said) in [
        (
            json!([{"name": "t", "run": []}]),
            "`checks[0].run` is empty",
        ),
        (
            json!([{"name": "t", "run": ["true"]}, {"name": "t", "run": ["false"]}]),
            "`checks[1].name`: another check of `checks` is called `t`",
        ),
        (
            json!([{"name": "a b", "run": ["true"]}]),
            "`checks[0].name` is \"a b\"",
        ),
        (
            json!([{"name": "t", "run": ["true"], "timeout": 120000}]),
            "more than a day",
        ),
        (
            json!([{"name": "t", "cmd": ["true"]}]),
            "unknown field `cmd`",
        ),
    ] {
        let eval = Eval::new(
            json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
                   "clientOptions": {"command": ["true"]}, "checks": checks}),
            &[json!({"id": "c1", "input": "x"})],
        );
        let run = eval.run(&mst, &["-q"]);
        assert_eq!(run.code, 2, "{said}: {}\n{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(said), "{said}: {}", run.stderr);
        assert!(
            !eval.results().exists(),
            "no run directory for a config error"
        );
    }
    // A variant's list is checked as its own.
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["true"]},
               "variants": {"v": {"checks": [{"name": "", "run": ["true"]}]}}}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 2);
    assert!(
        run.stderr.contains("`variants.v.checks[0].name` is \"\""),
        "{}",
        run.stderr
    );
}

#[test]
fn a_checks_reward_is_the_trials_score_and_the_threshold_decides() {
    // The agent plants a reward of 1 where the check's goes; each case's check then writes
    // its own (or none, or a bad one), sandboxed as the agent was.
    let check = r#"case "$(cat case)" in
  three) echo 0.75 > "$MST_CHECK_REWARD";;
  one) echo 0.25 > "$MST_CHECK_REWARD";;
  bad) echo lots > "$MST_CHECK_REWARD";;
esac"#;
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "cat > case; echo 1 > \"$HOME/.mst-check-reward\""]},
               "checks": [{"name": "tests", "run": ["sh", "-c", check]}],
               "judges": [{"assert": "check-score", "value": "tests"}],
               "passThreshold": 0.5, "timeout": 30}),
        &["three", "one", "bad", "none"].map(|id| json!({"id": id, "input": id})),
    );
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    // 0.75 passes; 0.25 and a bad reward fail; no reward and a passed check score 1.
    assert_eq!(summary["variants"]["default"]["passed"], 2, "{summary}");
    assert_eq!(summary["cases"]["default"]["three"], "passed", "{summary}");
    assert_eq!(summary["cases"]["default"]["none"], "passed", "{summary}");
    let grades = read_json(&eval.run_dir("e2e").join("grades.json")).to_string();
    for said in [
        "check `tests` left reward 0.75",
        "check `tests` left reward 0.25",
        "$MST_CHECK_REWARD holds \\\"lots\\\", not a number in [0, 1]",
        "check `tests` left no reward and passed",
    ] {
        assert!(grades.contains(said), "{said}: {grades}");
    }
}

#[test]
fn a_module_the_agent_plants_does_not_replace_the_checks_test_runner() {
    // The agent breaks `add` and plants a `unittest` package whose `python3 -m unittest`
    // exits 0: the check still runs the real one, which fails.
    let dir = tempfile::tempdir().unwrap();
    let project = python_project(dir.path());
    let script = format!(
        r#"cp -r {project}/. . && sed -i 's/return a + b/return a - b/' calc.py
mkdir unittest && echo 'raise SystemExit(0)' > unittest/__main__.py && touch unittest/__init__.py
echo planted"#
    );
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", script]},
               "checks": tests_check(),
               "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 60}),
        &[json!({"id": "shadow", "input": "x"})],
    );
    let run = eval.run(&Mst::exposing(&[dir.path()]), &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.json()["variants"]["default"]["failed"],
        1,
        "{}",
        run.stdout
    );
    let check = last_event(&eval.run_dir("e2e"), "default/shadow/0");
    assert_add_failed(&check);
}
