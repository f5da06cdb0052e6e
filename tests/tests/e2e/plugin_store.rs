//! Installing, listing, inspecting and removing plugins, and scaffolding a new one.

use mst_tests::{fixture, plugin, s, Mst};
use std::process::Command;

#[test]
fn install_list_info_remove() {
    let mst = Mst::new();
    let contains = plugin("contains.wasm");
    let installed = mst.run(&["plugin", "install", s(&contains), "--json"]);
    assert_eq!(installed.code, 0, "{}", installed.stderr);
    let installed = installed.json();
    assert_eq!(installed["name"], "mst/grader/contains");
    let stored = mst.home.path().join("plugins/mst/grader/contains/0.1.0");
    assert!(stored.join("plugin.wasm").is_file() && stored.join("manifest.json").is_file());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(stored.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["digest"], installed["digest"]);
    assert_eq!(
        manifest["check"]["compatible"], true,
        "the check result is stored"
    );

    // Installing the same build again is a no-op; jsonl makes the list longer.
    assert_eq!(mst.run(&["plugin", "install", s(&contains)]).code, 0);
    assert_eq!(
        mst.run(&["plugin", "install", s(&plugin("jsonl.wasm"))])
            .code,
        0
    );
    let list = mst.run(&["plugin", "list", "--json"]).json();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["mst/dataset/jsonl", "mst/grader/contains"]);
    for entry in list.as_array().unwrap() {
        for key in ["version", "kind", "digest", "capabilities"] {
            assert!(!entry[key].is_null(), "list entry lacks {key}: {entry}");
        }
    }
    let table = mst.run(&["plugin", "list"]);
    assert!(
        table.stdout.contains("mst/grader/contains") && table.stdout.contains("grader"),
        "{}",
        table.stdout
    );

    let info = mst
        .run(&["plugin", "info", "mst/grader/contains", "--json"])
        .json();
    assert_eq!(info["digest"], installed["digest"]);
    assert_eq!(info["check"]["kind"], "grader");
    let info_file = mst.run(&["plugin", "info", s(&contains), "--json"]).json();
    assert_eq!(info_file["digest"], installed["digest"]);

    // Installed plugins run by name.
    let graded = mst.run(&[
        "plugin",
        "grade",
        "mst/grader/contains@0.1.0",
        "--answer",
        "yes",
        "--options",
        r#"{"value":"yes"}"#,
    ]);
    assert_eq!(graded.code, 0, "{}", graded.stderr);

    let removed = mst.run(&["plugin", "remove", "mst/grader/contains"]);
    assert_eq!(removed.code, 0, "{}", removed.stderr);
    assert!(!stored.exists());
    let gone = mst.run(&["plugin", "info", "mst/grader/contains"]);
    assert_eq!(gone.code, 1);
    assert!(
        gone.stderr
            .contains("neither a file nor an installed plugin"),
        "{}",
        gone.stderr
    );
    let again = mst.run(&["plugin", "remove", "mst/grader/contains"]);
    assert!(
        again.code != 0 && again.stderr.contains("mst plugin list"),
        "{}",
        again.stderr
    );
}

#[test]
fn install_refuses_incompatible_components_and_keeps_nothing() {
    let mst = Mst::new();
    let run = mst.run(&["plugin", "install", s(&fixture("future-major.wasm"))]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("not installed") && run.stderr.contains("2.0.0"),
        "{}",
        run.stderr
    );
    let run = mst.run(&["plugin", "install", s(&fixture("core-module.wasm"))]);
    assert_eq!(run.code, 2);
    assert!(
        !mst.home.path().join("plugins").exists()
            || mst.run(&["plugin", "list", "--json"]).json() == serde_json::json!([])
    );
}

#[test]
fn a_tampered_install_is_refused() {
    let mst = Mst::new();
    assert_eq!(
        mst.run(&["plugin", "install", s(&plugin("contains.wasm"))])
            .code,
        0
    );
    let wasm = mst
        .home
        .path()
        .join("plugins/mst/grader/contains/0.1.0/plugin.wasm");
    // Swap in another valid component: same name on disk, different digest.
    std::fs::copy(plugin("regex.wasm"), &wasm).unwrap();
    let run = mst.run(&[
        "plugin",
        "grade",
        "mst/grader/contains",
        "--answer",
        "x",
        "--options",
        r#"{"value":"x"}"#,
    ]);
    assert_eq!(run.code, 1);
    assert!(
        run.stderr.contains("modified after install"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_different_build_with_the_same_version_needs_force() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    // A copy with an extra custom section: same plugin, different bytes and digest.
    let mut bytes = std::fs::read(plugin("contains.wasm")).unwrap();
    bytes.extend_from_slice(&[0, 7, 5, b'x', b'-', b'm', b's', b't', 0]);
    let rebuilt = dir.path().join("contains-rebuilt.wasm");
    std::fs::write(&rebuilt, &bytes).unwrap();
    assert_eq!(
        mst.run(&["plugin", "install", s(&plugin("contains.wasm"))])
            .code,
        0
    );
    let refused = mst.run(&["plugin", "install", s(&rebuilt)]);
    assert_eq!(refused.code, 1, "{}", refused.stderr);
    assert!(refused.stderr.contains("--force"), "{}", refused.stderr);
    let forced = mst.run(&["plugin", "install", s(&rebuilt), "--force", "--json"]);
    assert_eq!(forced.code, 0, "{}", forced.stderr);
    assert_ne!(forced.json()["digest"], serde_json::Value::Null);
}

#[test]
fn a_scaffolded_grader_builds_and_passes_check() {
    let mst = Mst::new();
    let dir = tempfile::tempdir().unwrap();
    let project = dir.path().join("exact-answer");
    let run = mst.run(&[
        "plugin",
        "new",
        "grader",
        "exact-answer",
        "--namespace",
        "acme",
        "--dir",
        s(&project),
    ]);
    assert_eq!(run.code, 0, "{}", run.stderr);

    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // A shared target directory keeps reruns fast; the project itself is new every time.
    let target = mst_tests::root().join("target/scaffold");
    let build = Command::new(&cargo)
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .args(["build", "--quiet", "--release", "--target", "wasm32-wasip2"])
        .output()
        .unwrap();
    assert!(
        build.status.success(),
        "{}",
        String::from_utf8_lossy(&build.stderr)
    );
    let wasm = target.join("wasm32-wasip2/release/exact_answer.wasm");

    let check = mst.run(&["plugin", "check", s(&wasm), "--json"]);
    assert_eq!(check.code, 0, "{}", check.stdout);
    let report = check.json();
    assert_eq!(report["name"], "acme/grader/exact-answer");
    assert_eq!(report["kind"], "grader");

    let pass = mst.run(&[
        "plugin",
        "grade",
        s(&wasm),
        "--answer",
        "42",
        "--expected",
        "\"42\"",
    ]);
    assert_eq!(pass.code, 0, "{}{}", pass.stdout, pass.stderr);
    let fail = mst.run(&[
        "plugin",
        "grade",
        s(&wasm),
        "--answer",
        "41",
        "--expected",
        "\"42\"",
    ]);
    assert_eq!(fail.code, 1, "{}", fail.stdout);

    // Its own unit tests pass natively too.
    let test = Command::new(&cargo)
        .current_dir(&project)
        .env("CARGO_TARGET_DIR", &target)
        .args(["test", "--quiet"])
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}",
        String::from_utf8_lossy(&test.stderr)
    );
}
