//! Workspaces end to end on the real local runner (issue 45, item 1): a task's files laid
//! fresh into every trial's work directory before its client starts (a directory, a
//! `.tar.gz`, a git commit), a case's own in place of the eval's, each recorded by digest in
//! `run.json` and the summary; and a hostile archive refused before any trial runs.
//! (Docker's side is in docker.rs.)

use mst_tests::{read_json, read_trace, s, Eval, Mst};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// A small repository with a bug in `add` and a test that finds it, in `dir`.
fn buggy_project(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("calc.py"), "def add(a, b):\n    return a - b\n").unwrap();
    std::fs::write(
        dir.join("test_calc.py"),
        "import unittest\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n\
         \x20   def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n",
    )
    .unwrap();
}

/// The agent: counts the trials that saw its work directory in `seen` (1 in a fresh one),
/// names what it found, and fixes the bug when asked.
fn agent() -> Value {
    let script = r#"read task; echo x >> seen; echo "seen $(wc -l < seen) files $(ls | tr '\n' ' ')"
case "$task" in fix*) sed -i 's/a - b/a + b/' calc.py;; esac"#;
    json!(["sh", "-c", script])
}

fn answer(run_dir: &Path, trial: &str) -> String {
    let trace = read_trace(run_dir, trial);
    trace["trace"]["finalText"]
        .as_str()
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn git(dir: &Path, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@t"])
        .args(args)
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "git {args:?}");
}

#[test]
fn a_workspace_is_laid_fresh_in_every_trial_and_recorded_by_digest() {
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": agent()},
               "workspace": "project", "trials": 2,
               "checks": [{"name": "tests", "run": ["python3", "-m", "unittest", "-q"]}],
               "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 60}),
        &[
            json!({"id": "fixed", "input": "fix add"}),
            json!({"id": "idle", "input": "do nothing"}),
            // Its own workspace, an archive beside the dataset: the bug and no test.
            json!({"id": "own", "input": "fix add", "workspace": "own.tar.gz",
                   "checks": [{"name": "tests", "run": ["grep", "-q", "a + b", "calc.py"]}]}),
        ],
    );
    let root = eval.dir.path();
    buggy_project(&root.join("project"));
    buggy_project(&root.join("own"));
    std::fs::remove_file(root.join("own/test_calc.py")).unwrap();
    let tar = Command::new("tar")
        .args(["-czf", "own.tar.gz", "-C", "own", "."])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(tar.success());
    let mst = Mst::new();
    let run = eval.run(&mst, &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    // `fixed` and `own` pass their two trials each, `idle` fails its two.
    assert_eq!(summary["variants"]["default"]["passed"], 2, "{summary}");
    assert_eq!(summary["variants"]["default"]["failed"], 1, "{summary}");

    let run_dir = eval.run_dir("e2e");
    for trial in ["default/fixed/0", "default/fixed/1", "default/idle/1"] {
        // Each trial found the workspace as packed, and nothing an earlier trial left.
        let found = answer(&run_dir, trial);
        assert_eq!(found, "seen 1 files calc.py seen test_calc.py", "{trial}");
    }
    assert_eq!(
        answer(&run_dir, "default/own/1"),
        "seen 1 files calc.py seen"
    );

    // Each workspace once, by digest, in run.json and the summary.
    let record = read_json(&run_dir.join("run.json"));
    let workspaces = record["workspaces"].as_array().unwrap();
    assert_eq!(workspaces.len(), 2, "{record}");
    let project = workspaces
        .iter()
        .find(|w| w["source"].as_str().unwrap().ends_with("project"))
        .unwrap();
    assert_eq!(project["files"], 2, "{project}");
    let digest = project["digest"].as_str().unwrap();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    assert_eq!(summary["workspaces"], record["workspaces"]);
    let shown = mst.run(&[
        "runs",
        "show",
        run_dir.file_name().unwrap().to_str().unwrap(),
        "--results-dir",
        s(&eval.results()),
    ]);
    assert!(
        shown.stdout.contains(&format!("workspace: {digest} from ")),
        "{}",
        shown.stdout
    );
}

#[test]
fn a_git_workspace_is_the_commit_named_and_run_json_pins_it() {
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "cat calc.py"], "input": "none"},
               "workspace": {"git": "repo", "rev": "v1"},
               "judges": [{"assert": "contains", "value": "a - b"}], "timeout": 60}),
        &[json!({"id": "c", "input": "x"})],
    );
    let repo = eval.dir.path().join("repo");
    buggy_project(&repo);
    git(&repo, &["init", "-q", "-b", "main"]);
    git(&repo, &["add", "."]);
    git(&repo, &["commit", "-q", "-m", "the bug"]);
    git(&repo, &["tag", "v1"]);
    // A later commit the workspace must not have.
    std::fs::write(repo.join("calc.py"), "def add(a, b):\n    return a + b\n").unwrap();
    git(&repo, &["commit", "-q", "-am", "the fix"]);
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let record = read_json(&eval.run_dir("e2e").join("run.json"));
    let commit = record["workspaces"][0]["commit"].as_str().unwrap();
    let tagged = Command::new("git")
        .args(["rev-parse", "v1^{commit}"])
        .current_dir(&repo)
        .output()
        .unwrap();
    assert_eq!(commit, String::from_utf8_lossy(&tagged.stdout).trim());
}

#[test]
fn a_hostile_workspace_archive_is_refused_before_any_trial_naming_the_case() {
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", "touch ran; echo ran"], "input": "none"},
               "judges": [{"assert": "contains", "value": "ran"}], "timeout": 60}),
        &[json!({"id": "evil", "input": "x", "workspace": "evil.tar"})],
    );
    let root = eval.dir.path();
    std::fs::create_dir_all(root.join("inside")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", root.join("inside/passwd")).unwrap();
    let tar = Command::new("tar")
        .args(["-cf", "evil.tar", "-C", "inside", "."])
        .current_dir(root)
        .status()
        .unwrap();
    assert!(tar.success());
    let run = eval.run(&Mst::new(), &["-q"]);
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stderr.contains("case `evil`"), "{}", run.stderr);
    assert!(
        run.stderr.contains("points to the absolute `/etc/passwd`"),
        "{}",
        run.stderr
    );
    // Refused before a run was made.
    assert!(!eval.results().exists() || mst_tests::walk(&eval.results()).is_empty());
}

/// The agents of the coding-task bar: each reads the task, and `search` looks everywhere it
/// can for the hidden tests' mark and the workspace's (its patterns are built at run time, so
/// the bundle holding this script does not match).
fn coding_agents() -> Value {
    let agent = |script: &str| json!({"clientOptions": {"command": ["sh", "-c", script]}});
    json!({
        "fix": agent("sed -i 's/a - b/a + b/' calc.py; echo fixed"),
        "nop": agent("echo did nothing"),
        "plant": agent("mkdir unittest; printf 'import sys\\nsys.exit(0)\\n' > unittest/__init__.py; \
                        cp unittest/__init__.py unittest/__main__.py; echo planted"),
        "wipe": agent("rm -rf ./* ./.[!.]*; echo wiped"),
        "search": agent("m=HIDDEN; v=VISIBLE; m=${m}_MARK_42; v=${v}_MARK_42; \
            found=$(grep -rlsE \"$m|$v\" / --exclude-dir=proc --exclude-dir=sys \
                    --exclude-dir=dev --exclude-dir=usr 2>/dev/null | tr '\\n' ' '); \
            sed -i 's/a - b/a + b/' calc.py; echo \"found: $found\""),
    })
}

#[test]
fn hidden_tests_come_after_the_agent_and_grade_fix_nop_plant_and_wipe_apart() {
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"input": "none"},
               "variants": coding_agents(),
               "workspace": "project",
               "checks": [{"name": "tests", "run": ["python3", "-m", "unittest", "-q"],
                           "files": "hidden"}],
               "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 120}),
        &[json!({"id": "add", "input": "fix add"})],
    );
    let root = eval.dir.path();
    buggy_project(&root.join("hidden"));
    std::fs::create_dir_all(root.join("project")).unwrap();
    let calc = std::fs::read_to_string(root.join("hidden/calc.py")).unwrap();
    std::fs::write(
        root.join("project/calc.py"),
        format!("# VISIBLE_MARK_42\n{calc}"),
    )
    .unwrap();
    std::fs::remove_file(root.join("hidden/calc.py")).unwrap();
    let test = root.join("hidden/test_calc.py");
    let text = std::fs::read_to_string(&test).unwrap();
    std::fs::write(&test, format!("# HIDDEN_MARK_42\n{text}")).unwrap();
    let run = eval.run(&Mst::new(), &["--json", "-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let variants = &run.json()["variants"];
    for (variant, passed) in [
        ("fix", 1),
        ("search", 1),
        ("nop", 0),
        ("plant", 0),
        ("wipe", 0),
    ] {
        let counts = &variants[variant];
        assert_eq!(counts["passed"], passed, "{variant}: {variants}");
        // Every trial graded: none of them infra.
        assert_eq!(counts["infra"], 0, "{variant}: {variants}");
    }
    let run_dir = eval.run_dir("e2e");
    // The search found the workspace's file in its work directory, and the hidden test
    // nowhere: not in its bundle, its machine or the host.
    let found = answer(&run_dir, "search/add/0");
    let paths: Vec<&str> = found
        .trim_start_matches("found:")
        .split_whitespace()
        .collect();
    assert!(
        paths.len() == 1 && paths[0].ends_with("/calc.py"),
        "{found}"
    );
    // The planted `unittest` did not stand in for the real one, which ran the hidden test.
    let trace = read_trace(&run_dir, "plant/add/0");
    let check = trace["trace"]["events"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert_eq!(check["data"]["exitCode"], 1, "{check}");
    assert!(
        check["data"]["stderr"]
            .as_str()
            .unwrap()
            .contains("test_add"),
        "{check}"
    );
}

/// `examples/coding-task` on `extra`'s runner: `oracle` passes, `nop` fails with the hidden
/// tests' reason, and no task is broken.
pub fn assert_coding_task_example(mst: &Mst, extra: &[&str]) {
    let config = mst_tests::root().join("examples/coding-task/eval.json");
    let results = tempfile::tempdir().unwrap();
    let mut args = vec![
        "run",
        "--config",
        s(&config),
        "--results-dir",
        s(results.path()),
    ];
    args.extend(["--json", "-q"]);
    args.extend(extra);
    let run = mst.run(&args);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let summary = run.json();
    assert_eq!(summary["cases"]["oracle"]["fix-add"], "passed", "{summary}");
    assert_eq!(summary["cases"]["nop"]["fix-add"], "failed", "{summary}");
    assert!(summary.get("broken").is_none(), "{summary}");
    let grades = read_json(&mst_tests::only_run(results.path(), "coding-task").join("grades.json"));
    assert!(
        grades.to_string().contains("FAILED (2 of 3 tests)"),
        "{grades}"
    );
}

#[test]
fn the_coding_task_example_passes_its_oracle_and_fails_nop_on_the_local_runner() {
    assert_coding_task_example(&Mst::new(), &[]);
}

#[test]
fn a_reference_variant_that_does_otherwise_marks_its_case_broken() {
    // The oracle "fixes" nothing: its tests fail it, so the task is listed as broken.
    let eval = Eval::new(
        json!({"name": "e2e", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"input": "none"},
               "variants": {"oracle": {"clientOptions": {"command": ["true"]}},
                            "nop": {"clientOptions": {"command": ["true"]}}},
               "references": {"oracle": "pass", "nop": "fail"},
               "checks": [{"name": "tests", "run": ["test", "-f", "fixed"]}],
               "judges": [{"assert": "check-passed", "value": "tests"}], "timeout": 30}),
        &[json!({"id": "task", "input": "x"})],
    );
    let run = eval.run(&Mst::new(), &["-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stdout
            .contains("broken tasks (1):\n  task: its `oracle` failed, and must pass"),
        "{}",
        run.stdout
    );
    // A reference that is no variant is refused before anything starts.
    let config = eval.config();
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"oracle\": \"pass\"", "\"gold\": \"pass\"");
    std::fs::write(&config, text).unwrap();
    let refused = eval.run(&Mst::new(), &["-q"]);
    assert_eq!(refused.code, 2, "{}", refused.stderr);
    // A machine per trial is the Docker runner's to give, bounded by its hosts' room.
    let text = std::fs::read_to_string(&config).unwrap();
    let fresh = text
        .replace("\"gold\": \"pass\"", "\"oracle\": \"pass\"")
        .replacen('{', "{\"freshMachine\": true, ", 1);
    std::fs::write(&config, fresh).unwrap();
    let local = eval.run(&Mst::new(), &["-q"]);
    assert_eq!(local.code, 2, "{}", local.stderr);
    assert!(
        local.stderr.contains("runs on `--runner docker` only"),
        "{}",
        local.stderr
    );
    assert!(
        refused
            .stderr
            .contains("`references` names `gold`, which is not a variant"),
        "{}",
        refused.stderr
    );
}
