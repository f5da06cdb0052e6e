//! `mst runs export RUN --format mst.run/v1` end to end: real runs by the real binary, exported,
//! and every file checked against JSON Schemas for MST's run/v1 records (written for these tests
//! from the schema documents MST publishes, in tests/fixtures/mst-run-v1) and against mst's own
//! summary.

use mst_tests::model_server::{judge_preferring, ModelServer};
use mst_tests::{cases, pairwise_eval, read_json, root, s, walk, Eval, Mst};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The validators for each record kind, from the schema files.
fn validators() -> BTreeMap<&'static str, jsonschema::Validator> {
    let dir = root().join("tests/fixtures/mst-run-v1");
    [
        "run",
        "trial",
        "score",
        "preference",
        "results",
        "summary",
        "latest",
    ]
    .into_iter()
    .map(|kind| {
        let schema = read_json(&dir.join(format!("{kind}.schema.json")));
        let validator = jsonschema::draft7::new(&schema)
            .unwrap_or_else(|e| panic!("{kind}.schema.json is not a schema: {e}"));
        (kind, validator)
    })
    .collect()
}

/// Which record a file of MST's layout must be, from its path alone (relative to `--out`).
fn kind_at(relative: &Path) -> &'static str {
    let parts: Vec<&str> = relative.iter().map(|p| p.to_str().unwrap()).collect();
    match parts.as_slice() {
        ["latest.json"] => "latest",
        ["runs", _, "run.json"] => "run",
        ["runs", _, "results.json"] => "results",
        ["runs", _, "summary.json"] => "summary",
        ["runs", _, "traces", _, _, _] => "trial",
        ["runs", _, "scores", _, _, _, _] => "score",
        ["runs", _, "scores", _, _, _] => "preference",
        _ => panic!("{} is not a file of MST's run layout", relative.display()),
    }
}

/// The errors of `value` against the schema for `kind` (empty when it validates).
fn errors(
    validators: &BTreeMap<&str, jsonschema::Validator>,
    kind: &str,
    value: &Value,
) -> Vec<String> {
    validators[kind]
        .iter_errors(value)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect()
}

/// Validates every file below `out` against the schema its path calls for; returns the records
/// by relative path.
fn validate_all(out: &Path) -> BTreeMap<PathBuf, Value> {
    let validators = validators();
    let mut records = BTreeMap::new();
    for file in walk(out) {
        let relative = file.strip_prefix(out).unwrap().to_path_buf();
        let value = read_json(&file);
        let kind = kind_at(&relative);
        let found = errors(&validators, kind, &value);
        assert!(
            found.is_empty(),
            "{} is no valid {kind} record: {found:?}\n{value:#}",
            relative.display()
        );
        records.insert(relative, value);
    }
    records
}

/// `mst runs export` of `run_id` into `out`, with `--json`.
fn export(mst: &Mst, results: &Path, run_id: &str, out: &Path) -> mst_tests::Run {
    mst.run(&[
        "runs",
        "export",
        run_id,
        "--format",
        "mst.run/v1",
        "--out",
        s(out),
        "--results-dir",
        s(results),
        "--json",
    ])
}

/// [`export`] of `run_id` into a new directory, which must succeed: the directory, the
/// exported run's base (`runs/<exported id>`) and every record written, each validated.
fn export_valid(
    mst: &Mst,
    results: &Path,
    run_id: &str,
) -> (tempfile::TempDir, PathBuf, BTreeMap<PathBuf, Value>) {
    let out = tempfile::tempdir().unwrap();
    let exported = export(mst, results, run_id, out.path());
    assert_eq!(exported.code, 0, "{}\n{}", exported.stdout, exported.stderr);
    let id = exported.json()["exportedRunId"]
        .as_str()
        .unwrap()
        .to_string();
    let records = validate_all(out.path());
    (out, PathBuf::from("runs").join(id), records)
}

/// An eval of two command variants, `steady` (the baseline) failing c2 and `shaky` failing
/// c2 and c3, three trials of three cases each.
fn failing_eval() -> Eval {
    let fails_on = |pattern: &str| {
        json!({"clientOptions": {"command": ["sh", "-c",
            format!("read q; case \"$q\" in {pattern}) echo no; exit 1;; esac; echo \"$q\"")]}})
    };
    Eval::new(
        json!({
            "name": "exported",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "variants": {"steady": fails_on("*2"), "shaky": fails_on("*2|*3")},
            "baseline": "steady",
            "judges": [{"assert": "exit-code", "value": 0}],
            "trials": 3,
            "concurrency": 4,
            "timeout": 20
        }),
        &cases(3),
    )
}

fn run_id_of(dir: &Path) -> String {
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

/// How many of `records` lie below `dir`.
fn count_under(records: &BTreeMap<PathBuf, Value>, dir: &Path) -> usize {
    records.keys().filter(|p| p.starts_with(dir)).count()
}

/// Exports `mst_id` into `out` (which must succeed, under an id of its own that it prints),
/// validates every file written and checks the printed file list is what is on disk: the
/// exported id and the records by relative path.
fn export_listing_what_it_wrote(
    mst: &Mst,
    results: &Path,
    mst_id: &str,
    out: &Path,
) -> (String, BTreeMap<PathBuf, Value>) {
    let exported = export(mst, results, mst_id, out);
    assert_eq!(exported.code, 0, "{}\n{}", exported.stdout, exported.stderr);
    let printed = exported.json();
    let id = printed["exportedRunId"].as_str().unwrap().to_string();
    assert_ne!(
        id, mst_id,
        "mst's ids have a 4-hex suffix; MST's pattern wants 6"
    );
    assert_eq!(printed["runId"], mst_id);

    // Every file validates (run.json and latest.json check the id against MST's pattern), and
    // the printed list is what is on disk.
    let records = validate_all(out);
    let mut listed: Vec<PathBuf> = printed["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| PathBuf::from(f.as_str().unwrap()))
        .collect();
    listed.sort();
    assert_eq!(listed, records.keys().cloned().collect::<Vec<_>>());
    (id, records)
}

/// [`failing_eval`]'s trials and scores, as exported under `base` for exported run `id`:
/// 2 variants × 3 cases × 3 trials, shaky's c3 failing.
fn assert_trials_and_scores(records: &BTreeMap<PathBuf, Value>, base: &Path, id: &str) {
    let trials = count_under(records, &base.join("traces"));
    assert_eq!(trials, 18);
    let scores = count_under(records, &base.join("scores"));
    assert_eq!(scores, 18, "one score per judge per trial");
    let failed_trace = &records[&base.join("traces/shaky/c3/2.json")];
    assert_eq!(failed_trace["trace"]["exitCode"], 1, "{failed_trace}");
    assert_eq!(failed_trace["infrastructureError"], false);
    assert_eq!(failed_trace["runId"], id);
    let score = &records[&base.join("scores/exit-code/shaky/c3/2.json")];
    assert_eq!(score["score"]["pass"], false, "{score}");
    assert_eq!(
        records[&base.join("scores/exit-code/shaky/c1/0.json")]["score"]["pass"],
        true
    );
}

/// The exported run.json of [`failing_eval`]'s run `mst_id`.
fn assert_run_record(run_record: &Value, mst_id: &str) {
    assert_eq!(run_record["mstRunId"], mst_id);
    assert_eq!(run_record["evalName"], "exported");
    assert_eq!(run_record["baseline"], "steady");
    assert_eq!(
        run_record["variants"][0]["name"], "steady",
        "the baseline first"
    );
    assert_eq!(run_record["variants"][0]["client"], "command");
    assert_eq!(run_record["datasets"][0]["caseCount"], 3);
    assert_eq!(run_record["environment"]["name"], "local");
    assert_eq!(
        run_record["phases"],
        json!({"collect": "complete", "grade": "complete"})
    );
}

/// Each exported case's outcome is the one in mst's `summary`, with its 3 trials.
fn assert_results_match_summary(results: &Value, summary: &Value) {
    let cases = results["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 6);
    for case in cases {
        let (variant, id) = (
            case["variant"].as_str().unwrap(),
            case["id"].as_str().unwrap(),
        );
        let outcome = &summary["cases"][variant][id];
        assert_eq!(case["outcome"], *outcome, "{case}");
        assert_eq!(case["pass"], *outcome == "passed", "{case}");
        assert_eq!(case["trialResults"].as_array().unwrap().len(), 3);
    }
}

/// The exported summary's counts are mst's `summary`'s and agree with the exported results:
/// 3 of 6 cases passed, shaky passing a third of its trials.
fn assert_exported_summary_matches(exported_summary: &Value, results: &Value, summary: &Value) {
    for variant in exported_summary["variants"].as_array().unwrap() {
        let name = variant["name"].as_str().unwrap();
        let mine = &summary["variants"][name];
        for field in [
            "passed",
            "failed",
            "incomplete",
            "notGraded",
            "infra",
            "passRate",
        ] {
            assert_eq!(variant[field], mine[field], "{name}.{field}");
        }
        let passing = results["cases"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["variant"] == name && c["pass"] == true)
            .count();
        assert_eq!(
            variant["passed"], passing,
            "{name}: summary and results agree"
        );
    }
    assert_eq!(
        (
            exported_summary["passed"].as_u64(),
            exported_summary["failed"].as_u64()
        ),
        (Some(3), Some(3))
    );
    assert_eq!(exported_summary["total"], 6);
    assert_eq!(
        exported_summary["variants"][1]["metrics"]["trial_pass_rate"],
        json!(1.0 / 3.0)
    );
}

/// A regrade (`RUN_ID.g1`, which holds no traces of its own) of [`failing_eval`]'s run
/// `mst_id` exports with the graded run's traces, its `.g1` kept in the id.
fn assert_regrade_exports_with_the_graded_runs_traces(mst: &Mst, results: &Path, mst_id: &str) {
    let regrade = mst.run(&["grade", mst_id, "--results-dir", s(results)]);
    assert_eq!(regrade.code, 1, "{}\n{}", regrade.stdout, regrade.stderr);
    let (_regraded_out, regraded_base, regraded_records) =
        export_valid(mst, results, &format!("{mst_id}.g1"));
    assert!(
        regraded_base.to_string_lossy().ends_with(".g1"),
        "{}",
        regraded_base.display()
    );
    assert_eq!(
        count_under(&regraded_records, &regraded_base.join("traces")),
        18
    );
}

/// The check can fail: a record without a required field, or with a run id outside MST's
/// pattern, is refused (the records of [`failing_eval`]'s run `mst_id`, exported under `base`).
fn assert_schemas_refuse_broken_records(
    records: &BTreeMap<PathBuf, Value>,
    base: &Path,
    mst_id: &str,
) {
    let validators = validators();
    let mut broken = records[&base.join("traces/shaky/c3/2.json")].clone();
    broken
        .as_object_mut()
        .unwrap()
        .remove("infrastructureError");
    assert!(
        !errors(&validators, "trial", &broken).is_empty(),
        "a trial without infrastructureError"
    );
    let mut broken = records[&base.join("run.json")].clone();
    broken["runId"] = json!(mst_id);
    assert!(
        !errors(&validators, "run", &broken).is_empty(),
        "mst's own id ({mst_id}) does not fit MST's pattern, which is why export derives one"
    );
    let mut broken = records[&base.join("scores/exit-code/shaky/c3/2.json")].clone();
    broken["score"] = json!({"value": 0.0});
    assert!(
        !errors(&validators, "score", &broken).is_empty(),
        "a score without pass"
    );
}

#[test]
fn an_exported_run_validates_against_mst_s_schemas_and_agrees_with_the_summary() {
    let mst = Mst::new();
    let eval = failing_eval();
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(
        run.code, 1,
        "some cases fail on purpose: {}\n{}",
        run.stdout, run.stderr
    );
    let dir = eval.run_dir("exported");
    let mst_id = run_id_of(&dir);
    let summary = read_json(&dir.join("summary.json"));

    let out = tempfile::tempdir().unwrap();
    let out = out.path().join("mst-eval");
    let (id, records) = export_listing_what_it_wrote(&mst, &eval.results(), &mst_id, &out);

    // The numbers agree with mst's summary.
    let base = PathBuf::from("runs").join(&id);
    assert_trials_and_scores(&records, &base, &id);
    assert_run_record(&records[&base.join("run.json")], &mst_id);
    let results = &records[&base.join("results.json")];
    assert_results_match_summary(results, &summary);
    assert_exported_summary_matches(&records[&base.join("summary.json")], results, &summary);
    let latest = &records[Path::new("latest.json")];
    assert_eq!(latest["path"], format!("runs/{id}"));

    // The same run exports to the same id every time.
    let again = tempfile::tempdir().unwrap();
    let second = export(&mst, &eval.results(), &mst_id, again.path());
    assert_eq!(second.json()["exportedRunId"], id.as_str());

    assert_regrade_exports_with_the_graded_runs_traces(&mst, &eval.results(), &mst_id);
    assert_schemas_refuse_broken_records(&records, &base, &mst_id);
}

#[test]
fn pairwise_verdicts_export_as_preferences_of_the_candidate_against_the_baseline() {
    let server = ModelServer::start_with(judge_preferring("UTC+9"));
    let case = |id: &str| json!({"id": id, "input": format!("What is Tokyo's UTC offset? ({id})")});
    let (eval, secrets) = pairwise_eval(
        &server.url(),
        "Tokyo is UTC+9",
        "Tokyo is UTC+8",
        &[case("p1"), case("p2")],
    );
    let mst = Mst::new();
    let run = eval.run(&mst, &["-q", "--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("paired");

    let (out, base, records) = export_valid(&mst, &eval.results(), &run_id_of(&dir));
    for case in ["p1", "p2"] {
        let preference = &records[&base.join(format!("scores/alpha-vs-beta/beta/{case}.json"))];
        assert_eq!(preference["kind"], "preference");
        assert_eq!(
            (&preference["variant"], &preference["baseline"]),
            (&json!("beta"), &json!("alpha"))
        );
        assert_eq!(preference["preference"]["winner"], "alpha", "{preference}");
        assert_eq!(preference["preference"]["outcome"], "a-wins");
    }
    let summary = &records[&base.join("summary.json")];
    let beta = summary["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "beta")
        .unwrap();
    assert_eq!(
        beta["pairwise"],
        json!([{"judge": "alpha-vs-beta", "baseline": "alpha", "wins": 0, "losses": 2, "ties": 0,
                "notGraded": 0, "notCompared": 0}]),
        "counted for the candidate"
    );
    assert!(
        mst_tests::files_containing(out.path(), "mst-canary-pairwise-key").is_empty(),
        "the judge's key reaches no exported file"
    );
}

#[test]
fn a_bad_format_a_non_empty_out_and_an_unknown_run_are_refused_and_write_nothing() {
    let mst = Mst::new();
    let eval = mst_tests::command_eval(json!(["cat"]), 1, 20);
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run_id = run_id_of(&eval.run_dir("e2e"));
    let results = eval.results();
    let scratch = tempfile::tempdir().unwrap();

    let out = scratch.path().join("fresh");
    let bad = mst.run(&[
        "runs",
        "export",
        &run_id,
        "--format",
        "mst.run/v2",
        "--out",
        s(&out),
        "--results-dir",
        s(&results),
    ]);
    assert_ne!(bad.code, 0);
    assert!(
        bad.stderr.contains("mst.run/v2") && bad.stderr.contains("mst.run/v1"),
        "names the bad format and the ones it takes: {}",
        bad.stderr
    );
    assert!(!out.exists(), "nothing written for a bad format");

    let taken = scratch.path().join("taken");
    std::fs::create_dir(&taken).unwrap();
    std::fs::write(taken.join("notes.txt"), "mine").unwrap();
    let full = export(&mst, &results, &run_id, &taken);
    assert_ne!(full.code, 0);
    assert!(
        full.stderr.contains(s(&taken))
            && full.stderr.contains("not empty")
            && full.stderr.contains("empty directory"),
        "names the directory and what to do: {}",
        full.stderr
    );
    assert_eq!(
        walk(&taken),
        vec![taken.join("notes.txt")],
        "nothing written beside the user's file"
    );

    let unknown = export(&mst, &results, "20261130T000000Z-dead", &out);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("20261130T000000Z-dead")
            && unknown.stderr.contains("mst runs list"),
        "names the run and where to look: {}",
        unknown.stderr
    );
    assert!(!out.exists(), "nothing written for an unknown run");
}

#[test]
fn an_infrastructure_failure_exports_as_one_with_its_reason_and_no_score() {
    let mst = Mst::new();
    let eval = mst_tests::command_eval(json!(["/nonexistent/agent"]), 1, 20);
    let run = eval.run(&mst, &["-q"]);
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let (_out, base, records) =
        export_valid(&mst, &eval.results(), &run_id_of(&eval.run_dir("e2e")));
    let trial = &records[&base.join("traces/default/c1/0.json")];
    assert_eq!(trial["infrastructureError"], true, "{trial}");
    assert!(
        trial["error"]
            .as_str()
            .unwrap()
            .contains("/nonexistent/agent"),
        "{trial}"
    );
    assert!(
        !records.keys().any(|p| p.starts_with(base.join("scores"))),
        "an infra trial has no score"
    );
    let case = &records[&base.join("results.json")]["cases"][0];
    assert_eq!(
        (&case["pass"], &case["outcome"]),
        (&json!(false), &json!("infra")),
        "{case}"
    );
    assert_eq!(case["infrastructureErrorCount"], 1);
    assert_eq!(
        records[&base.join("summary.json")]["variants"][0]["infra"],
        1
    );
}
