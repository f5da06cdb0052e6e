//! `mst plugin check` on real components: the first-party plugins and the broken fixtures.

use mst_tests::{fixture, plugin, s, Mst};
use sha2::{Digest, Sha256};

#[test]
fn first_party_plugins_are_compatible_and_fully_described() {
    let mst = Mst::new();
    for (file, name, kind, world) in [
        ("contains.wasm", "mst/grader/contains", "grader", "grading"),
        ("regex.wasm", "mst/grader/regex", "grader", "grading"),
        ("json.wasm", "mst/grader/json", "grader", "grading"),
        ("jsonl.wasm", "mst/dataset/jsonl", "dataset", "datasets"),
    ] {
        let path = plugin(file);
        let run = mst.run(&["plugin", "check", s(&path), "--json"]);
        assert_eq!(run.code, 0, "{file}: {}{}", run.stdout, run.stderr);
        let report = run.json();
        assert_eq!(report["compatible"], true, "{file}");
        assert_eq!(report["kind"], kind, "{file}");
        assert_eq!(report["name"], name, "{file}");
        assert_eq!(report["version"], "0.1.0", "{file}");
        let digest = hex::encode(Sha256::digest(std::fs::read(&path).unwrap()));
        assert_eq!(report["digest"], digest, "{file}");
        let exports: Vec<&str> = report["exports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["name"].as_str().unwrap())
            .collect();
        assert!(
            exports.contains(&format!("mst:plugin/{world}@0.1.0").as_str()),
            "{file}: {exports:?}"
        );
        assert!(
            exports.contains(&"mst:plugin/plugin@0.1.0"),
            "{file}: {exports:?}"
        );
        let imports = report["imports"].as_array().unwrap();
        assert!(
            imports.iter().all(|i| i["version"].is_string()),
            "{file}: every import is versioned"
        );
        assert!(
            report["capabilities"].as_array().unwrap().is_empty(),
            "{file} asks for nothing"
        );
        assert!(
            report["options_schema"].is_object(),
            "{file} declares its options"
        );
        assert!(
            report["problems"].as_array().unwrap().is_empty(),
            "{file}: {}",
            report["problems"]
        );
        assert_eq!(report["host"]["mst_plugin"], "0.1.0");
    }
}

#[test]
fn a_file_that_is_not_wasm_is_unreadable() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notes.wasm");
    std::fs::write(&path, "these are notes, not a component").unwrap();
    let run = mst.run(&["plugin", "check", s(&path), "--json"]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    let report = run.json();
    assert_eq!(
        (report["readable"].as_bool(), report["compatible"].as_bool()),
        (Some(false), Some(false))
    );
    assert!(report["problems"][0]["message"]
        .as_str()
        .unwrap()
        .contains("not a WebAssembly file"));

    let missing = mst.run(&["plugin", "check", "/nonexistent/plugin.wasm"]);
    assert_eq!(missing.code, 2);
    assert!(
        missing.stderr.contains("/nonexistent/plugin.wasm"),
        "{}",
        missing.stderr
    );
}

#[test]
fn a_core_module_is_unreadable_with_advice() {
    let run = Mst::new().run(&["plugin", "check", s(&fixture("core-module.wasm"))]);
    assert_eq!(run.code, 2, "{}", run.stdout);
    assert!(
        run.stdout
            .contains("core WebAssembly module, not a component"),
        "{}",
        run.stdout
    );
    assert!(run.stdout.contains("wasm32-wasip2"), "{}", run.stdout);
}

#[test]
fn a_future_major_version_is_incompatible_and_says_which() {
    let run = Mst::new().run(&[
        "plugin",
        "check",
        s(&fixture("future-major.wasm")),
        "--json",
    ]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    let report = run.json();
    assert_eq!(report["compatible"], false);
    assert_eq!(report["readable"], true);
    assert_eq!(report["kind"], "grader", "the kind is still recognised");
    let messages: Vec<&str> = report["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert!(
        messages
            .iter()
            .any(|m| m.contains("mst:plugin/grading@2.0.0")
                && m.contains("0.1.x")
                && m.contains("upgrade mst")),
        "{messages:?}"
    );
}

#[test]
fn an_unknown_world_is_incompatible() {
    let run = Mst::new().run(&["plugin", "check", s(&fixture("unknown-world.wasm"))]);
    assert_eq!(run.code, 1, "{}", run.stdout);
    assert!(
        run.stdout.contains("exports none of the plugin worlds"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("acme:widgets/frob@1.0.0"),
        "{}",
        run.stdout
    );
}

#[test]
fn compiled_artifacts_are_cached_privately_and_survive_corruption() {
    let mst = Mst::new();
    let contains = plugin("contains.wasm");
    let first = mst.run(&["plugin", "check", s(&contains), "--json"]).json();
    assert_eq!(first["cache"], "miss");
    let second = mst.run(&["plugin", "check", s(&contains), "--json"]).json();
    assert_eq!(second["cache"], "hit");

    let cache = mst.home.path().join("cache");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&cache).unwrap().permissions().mode() & 0o777,
        0o700
    );
    let artifacts: Vec<_> = std::fs::read_dir(&cache)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert_eq!(artifacts.len(), 1, "{artifacts:?}");
    let name = artifacts[0]
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    assert!(
        name.starts_with(first["digest"].as_str().unwrap()) && name.ends_with(".cwasm"),
        "{name}"
    );
    assert_eq!(
        std::fs::metadata(&artifacts[0])
            .unwrap()
            .permissions()
            .mode()
            & 0o077,
        0,
        "owner-only artifact"
    );

    // A damaged artifact is discarded and recompiled, never run.
    std::fs::write(&artifacts[0], b"garbage").unwrap();
    let third = mst.run(&["plugin", "check", s(&contains), "--json"]);
    assert_eq!(third.code, 0, "{}", third.stderr);
    assert_eq!(third.json()["cache"], "miss");
}

#[test]
fn interpreters_and_stdin_inputs_are_warned_about_like_any_arguments() {
    let mst = Mst::new();
    let check = mst.run(&["plugin", "check", s(&fixture("hostile-runner.wasm"))]);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    // `sh` (an interpreter) warns as loudly as `ssh` with any arguments, however exact its
    // scripts.
    for says in [
        "declares `sh -c cd {workdir} && exec \"$@\" sh {command}`, and `sh` runs whatever \
         script or program it is given: granting `sh` admits any command",
        "declares `ssh` with any arguments: granting `ssh` admits any command",
    ] {
        assert!(check.stdout.contains(says), "{says}\n{}", check.stdout);
    }
    // kubectl reading a manifest from stdin is not: the host checks the manifest.
    let kubernetes = mst.run(&[
        "plugin",
        "check",
        s(&plugin("kubernetes-runner.wasm")),
        "--json",
    ]);
    assert_eq!(kubernetes.code, 0, "{}", kubernetes.stderr);
    assert_eq!(
        kubernetes.json()["problems"],
        serde_json::json!([]),
        "{}",
        kubernetes.stdout
    );
}

#[test]
fn an_info_export_sleeping_in_a_host_call_is_stopped_at_the_time_limit() {
    let started = std::time::Instant::now();
    let path = fixture("slow-info.wasm");
    let run = Mst::new().run(&["plugin", "check", s(&path), "--plugin-timeout", "3"]);
    let elapsed = started.elapsed();
    eprintln!("an info export sleeping 120 s under a 3 s limit: mst took {elapsed:?}");
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stdout.contains(&format!(
            "its `info` export failed: plugin {} was stopped after its time limit of 3.0s, \
             waiting in a host call",
            path.display()
        )),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(
        elapsed < std::time::Duration::from_secs(10),
        "took {elapsed:?}"
    );
}

/// The WIT semver policy's proof: a grader built against the frozen `wit/released/0.1.0`
/// (not the live WIT) still checks, loads and runs on this host, host import included.
#[test]
fn a_plugin_built_against_the_released_0_1_0_wit_loads_and_runs() {
    let mst = Mst::new();
    let path = fixture("released-0-1-0.wasm");
    let check = mst.run(&["plugin", "check", s(&path), "--json"]);
    assert_eq!(check.code, 0, "{}{}", check.stdout, check.stderr);
    let report = check.json();
    assert_eq!(report["compatible"], true);
    assert_eq!(report["name"], "mst/fixture/released-0-1-0");
    let imports: Vec<&str> = report["imports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert!(imports.contains(&"mst:plugin/log@0.1.0"), "{imports:?}");

    let graded = mst.run(&["plugin", "grade", s(&path), "--answer", "hello", "--json"]);
    assert_eq!(graded.code, 0, "{}{}", graded.stdout, graded.stderr);
    let score = graded.json();
    assert_eq!(score["value"], 1.0);
    assert_eq!(score["reason"], "mst:plugin@0.1.0 grader saw: hello");
    assert!(
        graded.stderr.contains("grading 5 bytes"),
        "its log import reached the host's log: {}",
        graded.stderr
    );
}

/// Sorted keys of a JSON object.
fn keys(value: &serde_json::Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort();
    keys
}

/// `--json` is a stable schema CI scripts parse: this pins its field set (docs/plugins.md,
/// "Checking"). A change here must be a deliberate schema change, documented there.
#[test]
fn check_json_is_the_pinned_v1_schema() {
    let mst = Mst::new();
    let run = mst.run(&["plugin", "check", s(&plugin("json.wasm")), "--json"]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    let report = run.json();
    assert_eq!(report["schema"], "mst.plugin-check/v1");
    assert_eq!(
        keys(&report),
        [
            "cache",
            "capabilities",
            "compatible",
            "description",
            "digest",
            "exports",
            "file",
            "host",
            "imports",
            "kind",
            "name",
            "options_schema",
            "problems",
            "readable",
            "schema",
            "size",
            "version",
        ]
    );
    assert_eq!(
        keys(&report["host"]),
        ["mst", "mst_plugin", "mst_plugin_ranges", "wasi"]
    );
    assert_eq!(
        report["host"]["mst_plugin_ranges"],
        serde_json::json!([">=0.1.0, <=0.1.0"])
    );
    assert_eq!(
        keys(&report["exports"][0]),
        ["interface", "name", "package", "version"]
    );

    // A failing report: the problems' fields, and the optional fields left out.
    let broken = mst.run(&[
        "plugin",
        "check",
        s(&fixture("future-major.wasm")),
        "--json",
    ]);
    assert_eq!(broken.code, 1, "{}", broken.stdout);
    let broken = broken.json();
    assert_eq!(broken["schema"], "mst.plugin-check/v1");
    assert_eq!(keys(&broken["problems"][0]), ["message", "severity"]);
    assert_eq!(broken["problems"][0]["severity"], "error");
    assert!(broken.get("cache").is_none() && broken.get("options_schema").is_none());

    // Every field is documented where CI authors read the schema.
    let docs = std::fs::read_to_string(mst_tests::root().join("docs/plugins.md")).unwrap();
    let start = docs
        .find("### The JSON report: `mst.plugin-check/v1`")
        .unwrap();
    let section = &docs[start..start + docs[start..].find("### In CI").unwrap()];
    for key in keys(&report).into_iter().chain(keys(&report["host"])) {
        assert!(
            section.contains(&format!("`{key}`")),
            "docs/plugins.md does not document `{key}`"
        );
    }
}

#[test]
fn host_version_checks_against_a_known_release_and_names_the_known_ones() {
    let mst = Mst::new();
    let released = fixture("released-0-1-0.wasm");
    let run = mst.run(&[
        "plugin",
        "check",
        s(&released),
        "--host-version",
        "0.1.0",
        "--json",
    ]);
    assert_eq!(run.code, 0, "{}{}", run.stdout, run.stderr);
    assert_eq!(run.json()["host"]["mst"], "0.1.0");

    let future = mst.run(&[
        "plugin",
        "check",
        s(&fixture("future-major.wasm")),
        "--host-version",
        "0.1.0",
    ]);
    assert_eq!(future.code, 1, "{}", future.stdout);
    assert!(
        future.stdout.contains("does not fit") && future.stdout.contains("0.1.x up to 0.1.0"),
        "{}",
        future.stdout
    );

    let unknown = mst.run(&["plugin", "check", s(&released), "--host-version", "9.9.9"]);
    assert_eq!(unknown.code, 2, "{}", unknown.stdout);
    assert!(
        unknown.stderr.contains("--host-version 9.9.9")
            && unknown.stderr.contains("knows the plugin ABI of mst 0.1.0"),
        "{}",
        unknown.stderr
    );
    assert!(
        unknown.stdout.is_empty(),
        "no report for an unknown release"
    );
}
