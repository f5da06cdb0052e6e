//! Plugins written in Python (componentize-py) and JavaScript (ComponentizeJS): the examples in
//! `examples/plugins/`, built by `cargo xtask plugins` with the real toolchains, checked and run
//! in a real `mst run`; and `mst plugin new --lang python|js` projects built with the same
//! toolchains (which `cargo xtask plugins` installs into `target/toolchains/`).

use mst_tests::{files_containing, plugin, read_json, read_trace, s, target_dir, Eval, Mst};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::process::Command;

/// An example component from `plugins/dist/examples/`.
fn example(file: &str) -> PathBuf {
    plugin(&format!("examples/{file}"))
}

/// A toolchain's directory of programs below `target/toolchains/`.
fn toolchain_bin(relative: &str) -> PathBuf {
    let dir = target_dir().join("toolchains").join(relative);
    assert!(
        dir.is_dir(),
        "{} is missing: run `cargo xtask plugins` (it installs the Python and JavaScript toolchains)",
        dir.display()
    );
    dir
}

/// HMAC-SHA256 of `message` under `key`, in hex (RFC 2104), as the Python grader signs.
fn hmac_sha256(key: &[u8], message: &[u8]) -> String {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let pad = |byte: u8| block.iter().map(|b| b ^ byte).collect::<Vec<u8>>();
    let inner = Sha256::new()
        .chain_update(pad(0x36))
        .chain_update(message)
        .finalize();
    hex::encode(
        Sha256::new()
            .chain_update(pad(0x5c))
            .chain_update(inner)
            .finalize(),
    )
}

#[test]
fn each_example_passes_plugin_check() {
    let mst = Mst::new();
    for (file, name, kind, capabilities) in [
        (
            "answer-py.wasm",
            "example/grader/answer-py",
            "grader",
            json!([{"type": "secret", "name": "EXAMPLE_SIGNING_KEY"}]),
        ),
        (
            "keywords-js.wasm",
            "example/grader/keywords-js",
            "grader",
            json!([{"type": "secret", "name": "EXAMPLE_KEYWORDS"}]),
        ),
        (
            "csv-py.wasm",
            "example/dataset/csv-py",
            "dataset",
            json!([]),
        ),
    ] {
        let run = mst.run(&["plugin", "check", s(&example(file)), "--json"]);
        assert_eq!(run.code, 0, "{file}: {}{}", run.stdout, run.stderr);
        let report = run.json();
        assert_eq!(report["compatible"], true, "{file}");
        assert_eq!(report["name"], name, "{file}");
        assert_eq!(report["kind"], kind, "{file}");
        assert_eq!(report["capabilities"], capabilities, "{file}");
        assert!(report["options_schema"].is_object(), "{file}");
        let errors: Vec<&Value> = report["problems"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["severity"] == "error")
            .collect();
        assert!(errors.is_empty(), "{file}: {errors:?}");
    }
}

const SIGNING_KEY: &str = "mst-canary-signing-3f9a1c";
const KEYWORDS: &str = "Tokyo, 09:00";

/// An eval whose cases come from a CSV file through the Python dataset resolver, answered by
/// `cat` (the answer is the input), and graded by the Python and the JavaScript graders.
fn foreign_eval(grant: bool) -> Eval {
    let granted = |name: &str| if grant { json!([name]) } else { json!([]) };
    let eval = Eval::new(
        json!({
            "name": "foreign",
            "datasets": [{"type": "example/dataset/csv-py", "path": "cases.csv"}],
            "client": "command",
            "clientOptions": {"command": ["cat"]},
            "plugins": [
                s(&example("csv-py.wasm")),
                {"path": s(&example("answer-py.wasm")), "allowSecret": granted("EXAMPLE_SIGNING_KEY")},
                {"path": s(&example("keywords-js.wasm")), "allowSecret": granted("EXAMPLE_KEYWORDS")},
            ],
            "judges": [
                {"plugin": "example/grader/answer-py"},
                {"plugin": "example/grader/keywords-js"},
            ],
            "concurrency": 2,
            "timeout": 60
        }),
        &[],
    );
    std::fs::write(
        eval.dir.path().join("cases.csv"),
        "id,input,expected,tags\n\
         tokyo,It is 09:00 in Tokyo now,09:00,time;easy\n\
         vague,It is morning somewhere,09:00,time\n\
         half,\"Tokyo, at some hour\",Tokyo,\n",
    )
    .unwrap();
    eval
}

/// `mst run` on `eval` with the examples' secrets in the environment.
fn run_with_secrets(mst: &Mst, eval: &Eval) -> mst_tests::Run {
    mst.command(&eval.args(&["-v"]))
        .env("EXAMPLE_SIGNING_KEY", SIGNING_KEY)
        .env("EXAMPLE_KEYWORDS", KEYWORDS)
        .output()
        .unwrap()
        .into()
}

/// Each trial's `(value, reason)` from one judge's scores file, by case id.
fn scores(run_dir: &Path, judge: &str) -> Vec<(String, f64, String)> {
    let file = run_dir
        .join("scores")
        .join(format!("{}.json", judge.replace('/', "%2F")));
    let mut scores: Vec<(String, f64, String)> = read_json(&file)
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["key"]["case"].as_str().unwrap().to_string(),
                s["value"].as_f64().unwrap(),
                s["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    scores.sort_by(|a, b| a.0.cmp(&b.0));
    scores
}

#[test]
fn python_and_js_graders_grade_cases_a_python_resolver_supplied() {
    let mst = Mst::new();
    let eval = foreign_eval(true);
    let run = run_with_secrets(&mst, &eval);
    // `vague` fails both judges and `half` the keyword one: exit 1 is "ran, some failed".
    assert_eq!(run.code, 1, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("foreign");

    // The resolver's cases, with their tags, are what ran.
    let cases: Vec<String> = read_json(&dir.join("run.json"))["trials"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["case"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(cases.len(), 3, "{cases:?}");
    let tokyo = read_trace(&dir, "default/tokyo/0");
    assert_eq!(tokyo["case"]["input"], "It is 09:00 in Tokyo now");
    assert_eq!(tokyo["case"]["tags"], json!(["time", "easy"]));

    // Python: contains the expected text, each verdict signed with the granted key.
    let python = scores(&dir, "example/grader/answer-py");
    let verdicts: Vec<(&str, f64)> = python.iter().map(|(c, v, _)| (c.as_str(), *v)).collect();
    assert_eq!(verdicts, [("half", 1.0), ("tokyo", 1.0), ("vague", 0.0)]);
    for (case, value, reason) in &python {
        let message = format!("{case}:default:0:{value:.1}");
        let signature = hmac_sha256(SIGNING_KEY.as_bytes(), message.as_bytes());
        assert!(
            reason.ends_with(&format!("; signature {signature}")),
            "{case}: {reason} is not signed with the granted key"
        );
    }

    // JavaScript: the share of the hidden keywords (the granted secret) in the answer.
    let js = scores(&dir, "example/grader/keywords-js");
    let verdicts: Vec<(&str, f64, &str)> = js
        .iter()
        .map(|(c, v, r)| (c.as_str(), *v, r.as_str()))
        .collect();
    assert_eq!(
        verdicts,
        [
            ("half", 0.5, "1 of 2 hidden keywords"),
            ("tokyo", 1.0, "2 of 2 hidden keywords"),
            ("vague", 0.0, "0 of 2 hidden keywords"),
        ]
    );
    let summary = read_json(&dir.join("summary.json"));
    assert!(summary.to_string().contains("\"passed\":1"), "{summary}");

    // Their `log` lines reach the host's log, tagged with the plugin.
    for (plugin, line) in [
        (
            "example/grader/answer-py 0.1.0",
            "case tokyo: 1.0 (the answer contains '09:00')",
        ),
        (
            "example/grader/keywords-js 0.1.0",
            "case half: 1 of 2 hidden keywords",
        ),
        ("example/dataset/csv-py 0.1.0", "read 3 cases"),
    ] {
        assert!(
            run.stderr
                .lines()
                .any(|l| l.contains(line) && l.contains(plugin)),
            "no `{line}` from {plugin} in:\n{}",
            run.stderr
        );
    }

    // The secrets reached the plugins and nothing else.
    for secret in [SIGNING_KEY, KEYWORDS] {
        assert!(!run.stdout.contains(secret) && !run.stderr.contains(secret));
        assert!(
            files_containing(&eval.results(), secret).is_empty(),
            "{secret}"
        );
        assert!(
            files_containing(mst.home.path(), secret).is_empty(),
            "{secret}"
        );
    }

    // Without the grants the graders cannot grade, and say which grant is missing; the second
    // run loads the compiled components from the cache the first one filled.
    let ungranted = foreign_eval(false);
    let run = run_with_secrets(&mst, &ungranted);
    assert_ne!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let grades = std::fs::read_to_string(ungranted.run_dir("foreign").join("grades.json")).unwrap();
    assert!(grades.contains("not-graded"), "{grades}");
    assert!(
        grades.contains("--allow-secret EXAMPLE_SIGNING_KEY"),
        "{grades}"
    );
    // A trial's first failing judge is the one recorded: try the JavaScript one alone.
    let denied = mst.run(&[
        "plugin",
        "grade",
        s(&example("keywords-js.wasm")),
        "--answer",
        "Tokyo",
    ]);
    assert_eq!(denied.code, 1, "{}{}", denied.stdout, denied.stderr);
    assert!(
        denied.stderr.contains("--allow-secret EXAMPLE_KEYWORDS"),
        "{}",
        denied.stderr
    );
}

/// `mst plugin new grader NAME --lang LANG`, built by `build` (run in the project with the
/// toolchain's programs first on `PATH`), then checked and tried on a right and a wrong answer.
fn new_project_builds_and_checks(lang: &str, bin: &Path, build: &[&str]) {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("exact");
    let run = mst.run(&[
        "plugin",
        "new",
        "grader",
        "exact",
        "--lang",
        lang,
        "--namespace",
        "acme",
        "--dir",
        s(&project),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(run.stdout.contains("exact.wasm"), "{}", run.stdout);

    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let built = Command::new(build[0])
        .args(&build[1..])
        .current_dir(&project)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{lang} build failed:\n{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    let component = project.join("exact.wasm");

    let check = mst.run(&["plugin", "check", s(&component), "--json"]);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    assert_eq!(check.json()["name"], "acme/grader/exact");
    assert_eq!(check.json()["kind"], "grader");

    for (answer, verdict) in [(" 42\n", "pass 1.000  exact match"), ("41", "fail 0.000")] {
        let graded = mst.run(&[
            "plugin",
            "grade",
            s(&component),
            "--answer",
            answer,
            "--expected",
            "\"42\"",
        ]);
        assert!(
            graded.stdout.starts_with(verdict),
            "{lang} on {answer:?}: {}{}",
            graded.stdout,
            graded.stderr
        );
    }
}

#[test]
fn a_new_python_project_builds_with_componentize_py_and_passes_check() {
    let bin = toolchain_bin("python/bin");
    new_project_builds_and_checks("python", &bin, &["sh", "build.sh"]);
}

#[test]
fn a_new_js_project_builds_with_componentize_js_and_passes_check() {
    let bin = toolchain_bin("node/node_modules/.bin");
    new_project_builds_and_checks("js", &bin, &["npm", "run", "build"]);
}
