//! `mst runs diff` end to end: two real runs of one eval on the local runner, whose `command`
//! agent (a shell script) behaves by a file changed between the runs, compared by the binary.

use mst_tests::{s, Eval, Mst, Run};
use serde_json::{json, Value};
use std::path::Path;

/// The agent: its verdicts per case read from `mode` (`a` or `b`) beside it; `flaky` fails
/// trial 1 of 3 in mode b.
const AGENT: &str = r#"#!/bin/sh
mode=$(cat "$(dirname "$0")/mode")
case "$mode:$1:$2" in
  a:fixed:*|b:broke:*|*:still:*|b:flaky:1) exit 1 ;;
  *) exit 0 ;;
esac
"#;

fn write_script(path: &Path, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn case_lines(ids: &[&str]) -> String {
    let lines: Vec<String> = ids
        .iter()
        .map(|id| json!({"id": id, "input": id}).to_string())
        .collect();
    lines.join("\n")
}

/// Eval `name`: variant `default` runs the agent, variant `tool` runs `tool.sh` (exits 0;
/// deleting it makes its trials infra); 3 trials per case, passing on exit code 0.
fn eval(name: &str, ids: &[&str]) -> Eval {
    let eval = Eval::new(json!({}), &[]);
    let dir = eval.dir.path();
    write_script(&dir.join("agent.sh"), AGENT);
    write_script(&dir.join("tool.sh"), "#!/bin/sh\nexit 0\n");
    std::fs::write(dir.join("mode"), "a").unwrap();
    std::fs::write(dir.join("cases.jsonl"), case_lines(ids)).unwrap();
    let config = json!({
        "name": name,
        "datasets": ["cases.jsonl"],
        "client": "command",
        "clientOptions": {"command": [s(&dir.join("agent.sh")), "{case}", "{trial}"], "input": "none"},
        "variants": {
            "default": {},
            "tool": {"clientOptions": {"command": [s(&dir.join("tool.sh"))], "input": "none"}}
        },
        "judges": [{"assert": "exit-code", "value": 0}],
        "trials": 3,
        "concurrency": 4,
        "timeout": 20
    });
    std::fs::write(eval.config(), config.to_string()).unwrap();
    eval
}

/// Runs `eval` into `results` and returns the new run's id. The agent reads its `mode` in the
/// eval's directory, shown to its sandbox.
fn run(mst: &Mst, eval: &Eval, results: &Path, code: i32) -> String {
    let shown = format!("expose={}", s(eval.dir.path()));
    let done = mst.run(&[
        "run",
        "--config",
        s(&eval.config()),
        "--results-dir",
        s(results),
        "--json",
        "-q",
        "--runner-option",
        &shown,
    ]);
    assert_eq!(done.code, code, "{}\n{}", done.stdout, done.stderr);
    done.json()["runId"].as_str().unwrap().to_string()
}

fn diff(mst: &Mst, results: &Path, a: &str, b: &str, json: bool) -> Run {
    let mut args = vec!["runs", "diff", a, b, "--results-dir", s(results)];
    if json {
        args.push("--json");
    }
    mst.run(&args)
}

/// The terminal lines, whitespace runs made single spaces.
fn lines(text: &str) -> Vec<String> {
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect()
}

/// Runs `eval` (of [`eval`], cases fixed, broke, still, flaky, same and gone) into `results` in
/// mode a, then again in mode b with `tool.sh` deleted and case `gone` replaced by `new`: the
/// two runs' ids.
fn runs_before_and_after_every_kind_of_change(
    mst: &Mst,
    eval: &Eval,
    results: &Path,
) -> (String, String) {
    let a = run(mst, eval, results, 1);
    let dir = eval.dir.path();
    std::fs::write(dir.join("mode"), "b").unwrap();
    std::fs::remove_file(dir.join("tool.sh")).unwrap();
    std::fs::write(
        dir.join("cases.jsonl"),
        case_lines(&["fixed", "broke", "still", "flaky", "same", "new"]),
    )
    .unwrap();
    let b = run(mst, eval, results, 1);
    (a, b)
}

/// The cases of [`runs_before_and_after_every_kind_of_change`]'s diff, in `--json`'s order:
/// every kind of change under `default`; under `tool`, whose trials became infra, every case
/// that passed broke.
fn expected_case_changes() -> Value {
    let side = |outcome: &str, passed: u32, trials: u32| json!({"outcome": outcome, "passedTrials": passed, "trials": trials});
    let entry = |variant: &str, case: &str, change: &str, before: Value, after: Value| json!({"variant": variant, "case": case, "change": change, "before": before, "after": after});
    let (passed, failed) = (side("passed", 3, 3), side("failed", 0, 3));
    let infra = side("infra", 0, 3);
    json!([
        entry("default", "broke", "broke", passed.clone(), failed.clone()),
        entry("default", "fixed", "fixed", failed.clone(), passed.clone()),
        entry(
            "default",
            "flaky",
            "flaky",
            passed.clone(),
            side("passed", 2, 3)
        ),
        entry("default", "gone", "removed", passed.clone(), Value::Null),
        entry("default", "new", "added", Value::Null, passed.clone()),
        entry(
            "default",
            "same",
            "unchanged",
            passed.clone(),
            passed.clone()
        ),
        entry("default", "still", "still-failing", failed.clone(), failed),
        entry("tool", "broke", "broke", passed.clone(), infra.clone()),
        entry("tool", "fixed", "broke", passed.clone(), infra.clone()),
        entry("tool", "flaky", "broke", passed.clone(), infra.clone()),
        entry("tool", "gone", "removed", passed.clone(), Value::Null),
        entry("tool", "new", "added", Value::Null, infra.clone()),
        entry("tool", "same", "broke", passed.clone(), infra.clone()),
        entry("tool", "still", "broke", passed, infra),
    ])
}

/// `mst runs diff A B --json`: which runs and datasets it compared, each case's change, the
/// counts and each variant's pass rates.
fn assert_json_diff(compared: &Run, a: &str, b: &str) {
    assert_eq!(compared.code, 1, "a case broke: {}", compared.stderr);
    let json = compared.json();
    assert_eq!(json["eval"], "e2e");
    assert_eq!(json["before"]["runId"], a);
    assert_eq!(json["after"]["runId"], b);
    assert_eq!(json["before"]["datasetHash"].as_str().unwrap().len(), 64);
    assert_eq!(json["datasetsDiffer"], true);
    assert_eq!(json["cases"], expected_case_changes());
    assert_eq!(
        json["counts"],
        json!({"broke": 6, "fixed": 1, "flaky": 1, "still-failing": 1, "added": 2,
               "removed": 2, "unchanged": 1})
    );
    // default: 4 of 6 decided passed before (fixed and still failed), 4 of 6 after.
    let default = &json["variants"][0];
    assert_eq!(default["variant"], "default");
    assert_eq!(default["before"].as_f64().unwrap(), 4.0 / 6.0);
    assert_eq!(default["after"].as_f64().unwrap(), 4.0 / 6.0);
    assert_eq!(default["delta"].as_f64().unwrap(), 0.0);
    let paired = &default["comparison"];
    assert_eq!(
        (
            &paired["won"],
            &paired["lost"],
            &paired["cases"],
            &paired["significant"]
        ),
        (&json!(1), &json!(1), &json!(5), &json!(false)),
        "{default}"
    );
    // tool: every case passed, then none decided (infra is left out of the rate).
    assert_eq!(
        json["variants"][1],
        json!({"variant": "tool", "before": 1.0, "after": null, "delta": null})
    );
}

/// `mst runs diff A B` on the terminal: the rates, then each kind of change with its cases,
/// then the counts.
fn assert_text_diff(text: &Run, a: &str, b: &str) {
    assert_eq!(text.code, 1, "{}", text.stderr);
    let got = lines(&text.stdout);
    let expected_text = [
        format!("e2e: {a} -> {b}"),
        "the datasets differ: cases only in one run are listed as added or removed".into(),
        // Paired over the 5 cases both runs decided: one fixed, one broke (Newcombe's
        // interval of 2, 1, 1, 1, computed with statsmodels' Wilson intervals).
        "default: 66.7% -> 66.7% (+0.0 points); over 5 cases in both: +0.0 pp [-42.6, 42.6], \
         p = 1.000: within noise"
            .into(),
        "tool: 100.0% -> -".into(),
        "".into(),
        "broke (6):".into(),
        "default broke passed (3/3 passed) -> failed (0/3 passed)".into(),
        "tool broke passed (3/3 passed) -> infra (0/3 passed)".into(),
        "tool fixed passed (3/3 passed) -> infra (0/3 passed)".into(),
        "tool flaky passed (3/3 passed) -> infra (0/3 passed)".into(),
        "tool same passed (3/3 passed) -> infra (0/3 passed)".into(),
        "tool still passed (3/3 passed) -> infra (0/3 passed)".into(),
        "".into(),
        "fixed (1):".into(),
        "default fixed failed (0/3 passed) -> passed (3/3 passed)".into(),
        "".into(),
        "flaky (1):".into(),
        "default flaky passed (3/3 passed) -> passed (2/3 passed)".into(),
        "".into(),
        "still failing (1):".into(),
        "default still failed (0/3 passed) -> failed (0/3 passed)".into(),
        "".into(),
        "added (2):".into(),
        "default new - -> passed (3/3 passed)".into(),
        "tool new - -> infra (0/3 passed)".into(),
        "".into(),
        "removed (2):".into(),
        "default gone passed (3/3 passed) -> -".into(),
        "tool gone passed (3/3 passed) -> -".into(),
        "".into(),
        "6 broke, 1 fixed, 1 flaky, 1 still failing, 2 added, 2 removed, 1 unchanged passing"
            .into(),
    ];
    assert_eq!(got, expected_text, "{}", text.stdout);
}

#[test]
fn diff_tells_fixed_broke_flaky_still_failing_added_and_removed_apart() {
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let eval = eval("e2e", &["fixed", "broke", "still", "flaky", "same", "gone"]);
    let (a, b) = runs_before_and_after_every_kind_of_change(&mst, &eval, results.path());
    assert_json_diff(&diff(&mst, results.path(), &a, &b, true), &a, &b);
    assert_text_diff(&diff(&mst, results.path(), &a, &b, false), &a, &b);

    // A run compared with itself: nothing broke, exit 0, nothing listed.
    let same = diff(&mst, results.path(), &b, &b, false);
    assert_eq!(same.code, 0, "{}", same.stderr);
    assert!(
        same.stdout.ends_with(
            "0 broke, 0 fixed, 1 flaky, 8 still failing, 0 added, 0 removed, 3 unchanged passing\n"
        ),
        "{}",
        same.stdout
    );
    assert!(!same.stdout.contains("broke ("), "{}", same.stdout);
}

#[test]
fn diff_refuses_other_evals_runs_with_no_common_case_and_ungraded_runs() {
    let mst = Mst::new();
    let results = tempfile::tempdir().unwrap();
    let first = eval("e2e", &["x", "y"]);
    let a = run(&mst, &first, results.path(), 0);
    let other = eval("elsewhere", &["x", "y"]);
    let b = run(&mst, &other, results.path(), 0);

    let refused = diff(&mst, results.path(), &a, &b, false);
    assert_eq!(refused.code, 2, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains(&format!("run `{a}` is of eval `e2e`"))
            && refused
                .stderr
                .contains(&format!("run `{b}` of eval `elsewhere`")),
        "{}",
        refused.stderr
    );
    assert!(refused.stdout.is_empty(), "{}", refused.stdout);

    let disjoint = eval("e2e", &["p", "q"]);
    let c = run(&mst, &disjoint, results.path(), 0);
    let refused = diff(&mst, results.path(), &a, &c, true);
    assert_eq!(refused.code, 2, "{}", refused.stdout);
    assert!(
        refused.stderr.contains(&format!(
            "runs `{a}` and `{c}` of eval `e2e` have no case in common"
        )),
        "{}",
        refused.stderr
    );

    // A run whose summary is gone is refused with the command that grades it again.
    let c_dir = results.path().join("e2e").join("runs").join(&c);
    std::fs::remove_file(c_dir.join("summary.json")).unwrap();
    let refused = diff(&mst, results.path(), &a, &c, false);
    assert_eq!(refused.code, 2, "{}", refused.stdout);
    assert!(
        refused.stderr.contains(&format!(
            "run `{c}` has no readable summary; `mst grade {c}`"
        )),
        "{}",
        refused.stderr
    );
}
