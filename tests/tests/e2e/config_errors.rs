//! Errors that teach: a config or dataset mistake stops `mst run` with exit 2 before any
//! machine starts (no results directory), and the message names the file, the line and what to
//! do. The MST-shaped fixtures follow mcp-server-tester's public config and dataset schemas.

use mst_tests::{s, Mst, Run};
use std::path::Path;

/// Writes `files` into a temporary directory and runs `mst run` on its `eval.json` with
/// `extra` arguments, results in `results/` there.
fn run_in(files: &[(&str, &str)], extra: &[&str]) -> (Run, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    for (name, text) in files {
        let path = dir.path().join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let results = dir.path().join("results");
    let config = dir.path().join("eval.json");
    let mut args = vec!["run", "--config", s(&config), "--results-dir", s(&results)];
    args.extend(extra);
    (Mst::new().run(&args), dir)
}

/// [`run_in`] with no arguments, asserting exit 2 and that no results directory was made, and returns the run with the
/// directory (for paths in messages).
fn refused(files: &[(&str, &str)]) -> (Run, tempfile::TempDir) {
    let (run, dir) = run_in(files, &[]);
    let results = dir.path().join("results");
    assert_eq!(
        run.code, 2,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert!(
        !results.exists(),
        "a refused run made {}: {}",
        results.display(),
        run.stderr
    );
    (run, dir)
}

/// An eval config of ours around `extra` top-level keys, reading `cases.jsonl`.
fn ours(extra: &str) -> String {
    format!(
        "{{\n  \"name\": \"t\",\n  \"datasets\": [\"cases.jsonl\"],\n  \"client\": \"command\",\n  \
         \"clientOptions\": {{\"command\": [\"true\"]}},\n{extra}\n}}\n"
    )
}

const ONE_CASE: &str = "{\"id\": \"a\", \"input\": \"hi\"}\n";

fn at(dir: &Path, file: &str) -> String {
    dir.canonicalize().unwrap().join(file).display().to_string()
}

#[test]
fn an_mst_config_is_refused_with_how_to_convert_it() {
    let mst_config = r#"{
  "$schema": "https://github.com/gleanwork/mcp-server-tester/schema/eval-config.schema.json",
  "name": "time-server",
  "datasets": ["data/time.json"],
  "servers": {
    "time": {"transport": "stdio", "command": "python3", "args": ["-m", "mcp_server_time"]}
  },
  "client": "mst",
  "variants": [{"name": "baseline"}],
  "timeout": 120000
}
"#;
    let (run, dir) = refused(&[("eval.json", mst_config)]);
    let config = dir.path().join("eval.json");
    assert!(
        run.stderr.contains(&format!(
            "{} is an MST (mcp-server-tester) eval config",
            config.display()
        )) && run.stderr.contains(&format!(
            "convert it with `mst import mst {}`",
            config.display()
        )),
        "{}",
        run.stderr
    );
    // Without `$schema`, MST's own shapes still give it away.
    let no_schema = mst_config
        .replacen("\"$schema\"", "\"description\"", 1)
        .replacen("\"variants\": [{\"name\": \"baseline\"}],", "", 1);
    let (run, _dir) = refused(&[("eval.json", &no_schema)]);
    assert!(
        run.stderr
            .contains("is an MST (mcp-server-tester) eval config")
            && run.stderr.contains("server `time` has MST's `transport`"),
        "{}",
        run.stderr
    );
}

#[test]
fn an_mst_dataset_is_refused_with_how_to_convert_it() {
    let mst_dataset = r#"{
  "$schema": "https://gleanwork.github.io/mcp-server-tester/schema/eval-dataset.schema.json",
  "name": "time",
  "cases": [
    {"id": "tokyo", "input": "What time is it in Tokyo?", "assertions": {"containsText": "Tokyo"}}
  ]
}
"#;
    let config = ours("  \"trials\": 1").replace("cases.jsonl", "time.json");
    let (run, dir) = refused(&[("eval.json", &config), ("time.json", mst_dataset)]);
    let file = at(dir.path(), "time.json");
    assert!(
        run.stderr
            .contains(&format!("{file} is an MST (mcp-server-tester) dataset"))
            && run
                .stderr
                .contains(&format!("convert it with `mst import mst {file}`")),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("case #1"), "{}", run.stderr);
}

#[test]
fn a_timeout_in_milliseconds_is_refused_with_the_seconds_meant() {
    let (run, _dir) = refused(&[
        ("eval.json", &ours("  \"timeout\": 120000")),
        ("cases.jsonl", ONE_CASE),
    ]);
    assert!(
        run.stderr
            .contains("`timeout` is 120000 seconds, more than a day")
            && run
                .stderr
                .contains("MST wrote milliseconds: did you mean 120?"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_mistyped_key_is_suggested_from_its_own_level_only() {
    // `mode` in a variant is `model`; the same `mode` in a judge is nothing a judge has.
    let variant = ours("  \"variants\": {\n    \"a\": {\"mode\": \"x\"}\n  }");
    let (run, dir) = refused(&[("eval.json", &variant), ("cases.jsonl", ONE_CASE)]);
    let config = dir.path().join("eval.json").display().to_string();
    assert!(
        run.stderr.contains(&format!("{config}:7:"))
            && run.stderr.contains("unknown field `mode`")
            && run.stderr.contains("(did you mean `model`?)"),
        "{}",
        run.stderr
    );
    let judge = ours("  \"judges\": [\n    {\"assert\": \"exit-code\", \"mode\": 0}\n  ]");
    let (run, _dir) = refused(&[("eval.json", &judge), ("cases.jsonl", ONE_CASE)]);
    assert!(
        run.stderr.contains("unknown field `mode`") && !run.stderr.contains("did you mean"),
        "{}",
        run.stderr
    );
    // `args` is a server entry's key, never the top level's.
    let (run, _dir) = refused(&[
        ("eval.json", &ours("  \"arms\": []")),
        ("cases.jsonl", ONE_CASE),
    ]);
    assert!(
        run.stderr.contains("unknown field `arms`") && !run.stderr.contains("did you mean"),
        "{}",
        run.stderr
    );
}

#[test]
fn every_dataset_format_names_the_file_and_line() {
    let bad = "{\"id\": \"b\",\n \"inptu\": 2}";
    for (dataset, file, text, line) in [
        (
            "cases.jsonl",
            "cases.jsonl",
            format!("{ONE_CASE}\n{}\n", bad.replace('\n', "")),
            3,
        ),
        (
            "cases.json",
            "cases.json",
            format!("[\n  {},\n  {bad}\n]\n", ONE_CASE.trim()),
            4,
        ),
        ("one.json", "one.json", format!("\n\n{bad}\n"), 4),
        ("dir", "dir/z.json", format!("[\n{bad}]"), 3),
    ] {
        let config = ours("  \"trials\": 1").replace("cases.jsonl", dataset);
        let mut files = vec![("eval.json", config.as_str()), (file, text.as_str())];
        if dataset == "dir" {
            files.push(("dir/a.json", ONE_CASE));
        }
        let (run, dir) = refused(&files);
        let place = format!("{}:{line}:", at(dir.path(), file));
        assert!(
            run.stderr.contains(&place)
                && run.stderr.contains("unknown field `inptu`")
                && run.stderr.contains("(did you mean `input`?)"),
            "{file}: wanted {place} in {}",
            run.stderr
        );
    }
}

#[test]
fn a_malformed_mcp_case_input_is_refused_before_any_machine_starts() {
    // The server would leave a marker if anything started it.
    let config = r#"{
  "name": "bad-input",
  "datasets": ["cases.json"],
  "servers": {"time": {"command": "sh", "args": ["-c", "touch started; sleep 5"]}},
  "client": "mcp",
  "variants": {"direct": {}}
}
"#;
    let cases = "[\n  {\"id\": \"good\", \"input\": {\"tool\": \"now\"}},\n  {\"id\": \"prose\", \"input\": \"what time is it?\"}\n]\n";
    let (run, dir) = refused(&[("eval.json", config), ("cases.json", cases)]);
    let place = format!("{}:3", at(dir.path(), "cases.json"));
    assert!(
        run.stderr.contains(&format!(
            "case `prose` ({place}): its input does not suit variant `direct`'s `mcp` client"
        )) && run
            .stderr
            .contains("the mcp client needs an input `{\"tool\""),
        "{}",
        run.stderr
    );
    assert!(!dir.path().join("started").exists());
    assert!(!std::env::current_dir().unwrap().join("started").exists());
}

#[test]
fn a_malformed_case_left_out_by_case_does_not_stop_the_run() {
    let config = r#"{
  "name": "filtered",
  "datasets": ["cases.json"],
  "servers": {"time": {"command": "python3", "args": ["-m", "mcp_server_time", "--local-timezone", "UTC"]}},
  "client": "mcp",
  "timeout": 30
}
"#;
    let cases = "[\n  {\"id\": \"good\", \"input\": {\"tool\": \"get_current_time\", \"arguments\": {\"timezone\": \"UTC\"}}},\n  {\"id\": \"prose\", \"input\": \"what time is it?\"}\n]\n";
    let files = [("eval.json", config), ("cases.json", cases)];
    let (run, _dir) = run_in(&files, &["--case", "good", "--json", "-q"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert_eq!(
        run.json()["cases"]["default"],
        serde_json::json!({"good": "passed"})
    );
    // Without the filter the same files are refused, naming the case.
    let (run, _dir) = run_in(&files, &[]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("case `prose`"), "{}", run.stderr);
}
