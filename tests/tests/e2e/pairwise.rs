//! Pairwise grading end to end: two `command` variants compared by the real
//! `mst/grader/pairwise-rubric` component, its model a scripted server on loopback that decides
//! from what each request shows. The Docker run is in `docker.rs`.

use mst_tests::model_server::{
    answers_shown, assert_both_orders, judge_preferring, ModelServer, Reply,
};
use mst_tests::{pairwise_eval, read_json, s, Mst};
use serde_json::{json, Value};

const ALPHA: &str = "alpha: Tokyo is UTC+9 (alphabetical order)";
const BETA: &str = "beta: Tokyo is UTC+8";
/// What the judge must see instead: the names blinded, a word that merely contains one kept.
const ALPHA_BLIND: &str = "[variant]: Tokyo is UTC+9 (alphabetical order)";
const BETA_BLIND: &str = "[variant]: Tokyo is UTC+8";

fn cases(ids: &[&str]) -> Vec<Value> {
    ids.iter()
        .map(|id| json!({"id": id, "input": format!("What is Tokyo's UTC offset? ({id})")}))
        .collect()
}

/// `mst <args> --secrets-file <secrets>`.
fn with_secrets(mst: &Mst, args: &[&str], secrets: &std::path::Path) -> mst_tests::Run {
    let mut args = args.to_vec();
    args.extend(["--secrets-file", s(secrets)]);
    mst.run(&args)
}

/// Asserts that the server saw each of `cases` judged in both orders, and nothing else.
fn both_orders_seen(server: &ModelServer, cases: usize) {
    assert_both_orders(server, ALPHA_BLIND, BETA_BLIND, cases);
}

#[test]
fn a_verdict_both_orders_agree_on_is_a_win_and_the_judge_never_sees_the_names() {
    let server = ModelServer::start_with(judge_preferring("UTC+9"));
    let (eval, secrets) = pairwise_eval(&server.url(), ALPHA, BETA, &cases(&["c1", "c2"]));
    let mst = Mst::new();
    let run = eval.run(&mst, &["-q", "--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    both_orders_seen(&server, 2);
    for request in server.requests() {
        let body = request.body.to_string();
        assert!(
            !body.contains("alpha:") && !body.contains("beta:"),
            "a variant name reached the judge: {body}"
        );
        assert!(body.contains("alphabetical"), "{body}");
    }
    let dir = eval.run_dir("paired");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(
        summary["pairs"],
        json!([{"name": "alpha-vs-beta", "a": "alpha", "b": "beta", "wins": 2, "ties": 0,
                "losses": 0, "notGraded": 0, "notCompared": 0}])
    );
    let pairs = read_json(&dir.join("pairwise.json"));
    let case = &pairs[0]["cases"][0];
    assert_eq!(case["outcome"], "a-wins", "{pairs}");
    assert_eq!(case["trial"], 0);
    assert_eq!(
        (&case["orders"][0]["first"], &case["orders"][0]["winner"]),
        (&json!("alpha"), &json!("first"))
    );
    assert_eq!(
        (&case["orders"][1]["first"], &case["orders"][1]["winner"]),
        (&json!("beta"), &json!("second"))
    );
    assert!(
        run.stdout.contains("PAIR") && run.stdout.contains("alpha-vs-beta"),
        "the table shows the pair: {}",
        run.stdout
    );

    // `mst grade` asks the judge again, both orders, into a regrade beside the run.
    let run_id = dir.file_name().unwrap().to_str().unwrap();
    let results = eval.results();
    let regrade = with_secrets(
        &mst,
        &["grade", run_id, "--results-dir", s(&results), "--json"],
        &secrets,
    );
    assert_eq!(regrade.code, 0, "{}\n{}", regrade.stdout, regrade.stderr);
    assert_eq!(server.requests().len(), 8, "four new calls");
    assert_eq!(regrade.json()["pairs"][0]["wins"], 2, "{}", regrade.stdout);
    let regraded = dir.with_file_name(format!("{run_id}.g1"));
    assert_eq!(
        read_json(&regraded.join("pairwise.json"))[0]["cases"][1]["outcome"],
        "a-wins"
    );
}

#[test]
fn a_baseline_is_recorded_marked_and_paired_with_the_other_variant() {
    let server = ModelServer::start_with(judge_preferring("UTC+9"));
    let (eval, secrets) = pairwise_eval(&server.url(), ALPHA, BETA, &cases(&["c1"]));
    // The pairwise entry names no variants: the baseline against each other one.
    let mut config = read_json(&eval.config());
    config["baseline"] = json!("beta");
    config["pairwise"][0]
        .as_object_mut()
        .unwrap()
        .remove("variants");
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let mst = Mst::new();
    let run = eval.run(&mst, &["--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    both_orders_seen(&server, 1);
    let dir = eval.run_dir("paired");
    assert_eq!(read_json(&dir.join("run.json"))["baseline"], "beta");
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["baseline"], "beta");
    assert_eq!(
        summary["pairs"],
        json!([{"name": "beta-vs-alpha", "a": "beta", "b": "alpha", "wins": 0, "ties": 0,
                "losses": 1, "notGraded": 0, "notCompared": 0}])
    );
    let marked: Vec<&str> = run
        .stdout
        .lines()
        .filter(|l| l.contains("(baseline)"))
        .collect();
    assert!(
        marked.len() == 1 && marked[0].starts_with("beta (baseline)"),
        "the table marks the baseline: {}",
        run.stdout
    );

    // A baseline that is not a variant stops the run before it starts.
    config["baseline"] = json!("gamma");
    std::fs::write(eval.config(), config.to_string()).unwrap();
    let bad = eval.run(&mst, &["--secrets-file", s(&secrets)]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains(
            "`baseline` names `gamma`, which is not a variant; the variants are alpha, beta"
        ),
        "{}",
        bad.stderr
    );
}

#[test]
fn orders_that_disagree_make_a_tie_with_both_reasons_and_a_broken_verdict_is_not_graded() {
    // Always prefers the answer shown first, saying which that was; on case `c2` it gives no
    // verdict when beta's answer comes first.
    let server = ModelServer::start_with(|body| {
        let (first, _) = answers_shown(body);
        let asked = body["messages"][0]["content"].as_str().unwrap_or_default();
        if asked.contains("(c2)") && first == BETA_BLIND {
            return Reply::anthropic_text("Both are fine, I suppose.");
        }
        Reply::anthropic_text(
            &json!({"winner": "first", "reason": format!("liked {first}")}).to_string(),
        )
    });
    let (eval, secrets) = pairwise_eval(&server.url(), ALPHA, BETA, &cases(&["c1", "c2"]));
    let run = eval.run(
        &Mst::new(),
        &["--json", "-q", "--secrets-file", s(&secrets)],
    );
    assert_eq!(
        run.code, 2,
        "a pair not graded: {}\n{}",
        run.stdout, run.stderr
    );
    both_orders_seen(&server, 2);
    let summary = run.json();
    assert_eq!(summary["grade"], "partial", "{summary}");
    assert_eq!(
        (
            summary["pairs"][0]["ties"].clone(),
            summary["pairs"][0]["notGraded"].clone()
        ),
        (json!(1), json!(1)),
        "{summary}"
    );
    let pairs = read_json(&eval.run_dir("paired").join("pairwise.json"));
    let [tie, broken] = [&pairs[0]["cases"][0], &pairs[0]["cases"][1]];
    assert_eq!(
        (&tie["case"], &tie["outcome"]),
        (&json!("c1"), &json!("tie"))
    );
    assert_eq!(
        tie["orders"][0]["reason"],
        format!("liked {ALPHA_BLIND}"),
        "{tie}"
    );
    assert_eq!(tie["orders"][1]["reason"], format!("liked {BETA_BLIND}"));
    assert_eq!(broken["outcome"], "not-graded", "{broken}");
    assert!(broken["orders"][0]["error"].is_null(), "{broken}");
    assert!(
        broken["orders"][1]["error"]
            .as_str()
            .unwrap()
            .contains("did not reply with"),
        "{broken}"
    );
}

#[test]
fn a_pairwise_judge_naming_a_wrong_variant_or_plugin_stops_the_run_before_it_starts() {
    let server = ModelServer::start(vec![Reply::status(500, &[])]);
    let (eval, secrets) = pairwise_eval(&server.url(), ALPHA, BETA, &cases(&["c1"]));
    let config = eval.config();
    let original = read_json(&config);
    let rubric = mst_tests::plugin("rubric.wasm");
    for (change, says) in [
        (
            json!({"variants": ["alpha", "gamma"]}),
            "pairwise[0].variants names `gamma`, which is not a variant; the variants are alpha, beta",
        ),
        (
            json!({"variants": ["beta", "beta"]}),
            "pairwise[0].variants names `beta` twice",
        ),
        (
            json!({"plugin": "mst/grader/rubric"}),
            "pairwise[0].plugin: plugin `mst/grader/rubric`",
        ),
        (
            json!({"plugin": "acme/grader/none"}),
            "pairwise[0].plugin names `acme/grader/none`",
        ),
    ] {
        let mut value = original.clone();
        for (key, field) in change.as_object().unwrap() {
            value["pairwise"][0][key] = field.clone();
        }
        value["plugins"]
            .as_array_mut()
            .unwrap()
            .push(json!(s(&rubric)));
        std::fs::write(&config, value.to_string()).unwrap();
        let run = eval.run(&Mst::new(), &["-q", "--secrets-file", s(&secrets)]);
        assert_eq!(run.code, 2, "{change}: {}\n{}", run.stdout, run.stderr);
        assert!(run.stderr.contains(says), "{change}: {}", run.stderr);
        assert!(!eval.results().exists(), "{change}: no run was started");
    }
    assert!(server.requests().is_empty(), "no judge was asked");
}

#[test]
fn a_case_without_a_usable_trial_of_both_variants_is_not_compared() {
    let server = ModelServer::start_with(judge_preferring("UTC+9"));
    let (eval, secrets) = pairwise_eval(&server.url(), ALPHA, BETA, &cases(&["c1"]));
    let config = eval.config();
    let mut value = read_json(&config);
    // Beta's agent cannot start: its trial is an infrastructure failure.
    value["variants"]["beta"]["clientOptions"]["command"] = json!(["/nonexistent/agent"]);
    std::fs::write(&config, value.to_string()).unwrap();
    let run = eval.run(
        &Mst::new(),
        &["--json", "-q", "--secrets-file", s(&secrets)],
    );
    let summary = run.json();
    assert_eq!(summary["cases"]["beta"]["c1"], "infra", "{summary}");
    assert_eq!(summary["pairs"][0]["notCompared"], 1, "{summary}");
    let pairs = read_json(&eval.run_dir("paired").join("pairwise.json"));
    let case = &pairs[0]["cases"][0];
    assert_eq!(case["outcome"], "not-compared", "{case}");
    assert!(
        case["reason"]
            .as_str()
            .unwrap()
            .contains("without an infrastructure failure"),
        "{case}"
    );
    assert!(server.requests().is_empty(), "nothing to judge");
}

/// `eval` judged by the hostile pairwise fixture in `mode` instead of the rubric plugin.
fn judged_by_hostile_fixture(eval: &mst_tests::Eval, mode: &str) {
    let config = eval.config();
    let mut value = read_json(&config);
    value["plugins"] = json!([s(&mst_tests::fixture("hostile-pairwise.wasm"))]);
    value["pairwise"][0]["plugin"] = json!("mst/fixture/hostile-pairwise");
    value["pairwise"][0]["options"] = json!({ "mode": mode });
    std::fs::write(&config, value.to_string()).unwrap();
}

#[test]
fn every_text_a_pairwise_grader_sees_is_blinded_and_what_it_returns_is_checked() {
    // Each agent names itself in its answer and on stderr (a `log` event); the case names both.
    let agent = |name: &str| {
        json!([
            "sh",
            "-c",
            format!("echo '{name} on stderr, {name}s' >&2; echo '{name} answers'")
        ])
    };
    let (eval, secrets) = pairwise_eval(
        "http://127.0.0.1:9",
        ALPHA,
        BETA,
        &[json!({"id": "c1", "input": "alpha or beta? alphabet"})],
    );
    judged_by_hostile_fixture(&eval, "tell");
    let config = eval.config();
    let mut value = read_json(&config);
    for name in ["alpha", "beta"] {
        value["variants"][name]["clientOptions"]["command"] = agent(name);
    }
    std::fs::write(&config, value.to_string()).unwrap();
    let run = eval.run(
        &Mst::new(),
        &["--json", "-q", "--secrets-file", s(&secrets)],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let pairs = read_json(&eval.run_dir("paired").join("pairwise.json"));
    let case = &pairs[0]["cases"][0];
    // The fixture always prefers the first: a position, not a variant, so a tie.
    assert_eq!(case["outcome"], "tie", "{case}");
    let seen = case["orders"][0]["reason"].as_str().unwrap();
    assert_eq!(
        seen,
        "\"[variant] or [variant]? alphabet\"\n[variant] answers\n[variant] on stderr, alphas\n\
         [variant] answers\n[variant] on stderr, betas",
        "{case}"
    );

    let first = eval.run_dir("paired");
    judged_by_hostile_fixture(&eval, "confidence");
    let run = eval.run(
        &Mst::new(),
        &["--json", "-q", "--secrets-file", s(&secrets)],
    );
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    let latest = std::fs::read_dir(eval.results().join("paired/runs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|dir| *dir != first)
        .unwrap();
    let pairs = read_json(&latest.join("pairwise.json"));
    let case = &pairs[0]["cases"][0];
    assert_eq!(case["outcome"], "not-graded", "{case}");
    assert!(
        case["orders"][0]["error"]
            .as_str()
            .unwrap()
            .contains("returned the confidence 7, outside 0..1"),
        "{case}"
    );
}
