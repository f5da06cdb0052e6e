//! Plugins through a real OCI registry (Debian's `docker-registry`): push, verified install,
//! digest pins in eval configs, a tampered blob, a missing tag, TLS off loopback, a login from
//! a secrets file or the Docker config that never lands in mst's files; and installed runner
//! plugins found by their plain name.

use mst_tests::registry::{self, Registry};
use mst_tests::{command_eval, plugin, s, walk, Eval, Mst, Run};
use serde_json::json;
use std::path::Path;

/// `mst ARGS` with a Docker config directory of the test's own (`docker`), so the machine's
/// `~/.docker/config.json` never takes part.
fn mst_with(mst: &Mst, docker: &Path, args: &[&str]) -> Run {
    mst.command(args)
        .env("DOCKER_CONFIG", docker)
        .output()
        .expect("run mst")
        .into()
}

/// Pushes the contains grader to `reference`; returns the push's JSON.
fn push(mst: &Mst, docker: &Path, reference: &str, extra: &[&str]) -> serde_json::Value {
    let contains = plugin("contains.wasm");
    let mut args = vec!["plugin", "push", s(&contains), reference, "--json"];
    args.extend_from_slice(extra);
    let pushed = mst_with(mst, docker, &args);
    assert_eq!(pushed.code, 0, "{}", pushed.stderr);
    pushed.json()
}

/// The contains grader pushed to `registry` as `mst/contains:0.1.0` by a fresh `mst` with an
/// empty Docker config: the mst, the config's directory, the reference and the push's JSON.
fn contains_pushed(registry: &Registry) -> (Mst, tempfile::TempDir, String, serde_json::Value) {
    let (mst, docker) = (Mst::new(), tempfile::tempdir().unwrap());
    let reference = registry.reference("mst/contains:0.1.0");
    let pushed = push(&mst, docker.path(), &reference, &[]);
    (mst, docker, reference, pushed)
}

/// An eval whose judge is the plugin config entry `entry` (which names `reference`).
fn pinned_eval(reference: &str, entry: serde_json::Value) -> Eval {
    let mut eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(eval.config()).unwrap()).unwrap();
    config["plugins"] = json!([entry]);
    config["judges"] = json!([{"plugin": reference}]);
    std::fs::write(eval.config(), config.to_string()).unwrap();
    eval = Eval { dir: eval.dir };
    eval
}

#[test]
fn push_install_pin_and_list_the_source() {
    if !registry::available() {
        return;
    }
    let registry = Registry::start();
    let (mst, docker, reference, pushed) = contains_pushed(&registry);
    let manifest_digest = pushed["manifestDigest"].as_str().unwrap().to_string();
    let sha256 = pushed["sha256"].as_str().unwrap().to_string();

    // Stored the way wasm components are shipped: wasm config, one `application/wasm` layer
    // that is the component itself.
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(registry.blob_file(&manifest_digest)).unwrap())
            .unwrap();
    assert_eq!(
        manifest["config"]["mediaType"],
        "application/vnd.wasm.config.v0+json"
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{manifest}");
    assert_eq!(layers[0]["mediaType"], "application/wasm");
    assert_eq!(layers[0]["digest"], format!("sha256:{sha256}"));
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.title"],
        "mst/grader/contains"
    );

    let installed = mst_with(
        &mst,
        docker.path(),
        &["plugin", "install", &reference, "--json"],
    );
    assert_eq!(installed.code, 0, "{}", installed.stderr);
    let installed = installed.json();
    assert_eq!(installed["digest"], sha256);
    assert_eq!(
        installed["source"],
        json!({"type": "oci", "reference": reference, "manifestDigest": manifest_digest,
               "sha256": sha256})
    );
    let list = mst.run(&["plugin", "list", "--json"]).json();
    assert_eq!(list[0]["source"]["manifestDigest"], manifest_digest);
    let table = mst.run(&["plugin", "list"]);
    assert!(
        table
            .stdout
            .contains(&format!("{reference} ({manifest_digest})")),
        "{}",
        table.stdout
    );

    // A config pinning the right digest runs with the plugin it names by reference.
    let good = pinned_eval(
        &reference,
        json!({"plugin": reference, "sha256": format!("sha256:{sha256}")}),
    );
    let run = good.run(&mst, &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);

    // Any other pin is refused before anything runs: no run directory is made.
    let other = "0".repeat(64);
    let bad = pinned_eval(&reference, json!({"plugin": reference, "sha256": other}));
    let refused = bad.run(&mst, &[]);
    assert_ne!(refused.code, 0);
    assert!(
        refused.stderr.contains(&format!("has sha256 {sha256}"))
            && refused.stderr.contains(&format!("pins sha256 {other}")),
        "{}",
        refused.stderr
    );
    assert!(!bad.results().exists(), "a run directory was made");

    // A pin that is not a digest is a config error naming the field.
    let typo = pinned_eval(&reference, json!({"plugin": reference, "sha256": "abc"}));
    let refused = typo.run(&mst, &[]);
    assert!(
        refused.stderr.contains("`plugins[0].sha256`"),
        "{}",
        refused.stderr
    );
    // A reference that was never installed says how to install it.
    let never = registry.reference("mst/other:1.0.0");
    let missing = pinned_eval(&never, json!({"plugin": never}));
    let refused = missing.run(&mst, &[]);
    assert!(
        refused
            .stderr
            .contains(&format!("run `mst plugin install {never}` first")),
        "{}",
        refused.stderr
    );
}

#[test]
fn a_tampered_blob_and_a_missing_tag_are_refused() {
    if !registry::available() {
        return;
    }
    let registry = Registry::start();
    let (mst, docker, reference, pushed) = contains_pushed(&registry);

    let missing = registry.reference("mst/contains:9.9.9");
    let run = mst_with(&mst, docker.path(), &["plugin", "install", &missing]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr.contains(&format!(
            "cannot fetch {missing}: no such tag or repository"
        )),
        "{}",
        run.stderr
    );

    // Change one byte of the component in the registry's own storage.
    let blob = registry.blob_file(&format!("sha256:{}", pushed["sha256"].as_str().unwrap()));
    let mut bytes = std::fs::read(&blob).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&blob, bytes).unwrap();
    let run = mst_with(&mst, docker.path(), &["plugin", "install", &reference]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr
            .contains("the component blob does not match the digest its manifest names"),
        "{}",
        run.stderr
    );
    let list = mst.run(&["plugin", "list", "--json"]).json();
    assert_eq!(list, json!([]), "nothing is installed");
}

#[test]
fn a_registry_off_loopback_is_only_spoken_to_over_tls() {
    if !registry::available() {
        return;
    }
    let Some(ip) = registry::outside_address() else {
        eprintln!("skipped: this machine has no address but loopback");
        return;
    };
    // A plain-HTTP registry on a real interface: mst must not fall back to plain HTTP.
    let registry = Registry::start_on(ip);
    let (mst, docker) = (Mst::new(), tempfile::tempdir().unwrap());
    let reference = registry.reference("mst/contains:0.1.0");
    let contains = plugin("contains.wasm");
    let pushed = mst_with(
        &mst,
        docker.path(),
        &["plugin", "push", s(&contains), &reference],
    );
    assert_ne!(pushed.code, 0, "{}", pushed.stdout);
    assert!(
        pushed
            .stderr
            .contains(&format!("https://{}/v2/", registry.addr)),
        "{}",
        pushed.stderr
    );
    assert!(
        !registry.storage().join("docker").exists(),
        "the plain-HTTP registry stored something"
    );
}

#[test]
fn a_login_from_a_secrets_file_or_the_docker_config_is_never_stored() {
    if !registry::available() {
        return;
    }
    const CANARY: &str = "canary-pw-7f3a9c";
    let registry = Registry::start_with_login("alice", CANARY);
    let (mst, docker) = (Mst::new(), tempfile::tempdir().unwrap());
    let reference = registry.reference("mst/contains:0.1.0");
    let contains = plugin("contains.wasm");

    // Without a login the registry says no, and mst says so.
    let denied = mst_with(
        &mst,
        docker.path(),
        &["plugin", "push", s(&contains), &reference],
    );
    assert_ne!(denied.code, 0);
    assert!(
        denied.stderr.contains(&format!(
            "cannot push to {reference}: the registry wants a login"
        )),
        "{}",
        denied.stderr
    );

    // The secrets file's login pushes.
    let secrets = docker.path().join("registry.env");
    std::fs::write(
        &secrets,
        format!("OCI_USERNAME=alice\nOCI_PASSWORD={CANARY}\n"),
    )
    .unwrap();
    let mut outputs = String::new();
    let pushed = push(
        &mst,
        docker.path(),
        &reference,
        &["--secrets-file", s(&secrets)],
    );
    outputs.push_str(&pushed.to_string());

    // Install with no login is refused; with the Docker config's `auths` it works.
    let denied = mst_with(&mst, docker.path(), &["plugin", "install", &reference]);
    assert_ne!(denied.code, 0, "{}", denied.stdout);
    outputs.push_str(&denied.stderr);
    let encoded = base64_encode(format!("alice:{CANARY}").as_bytes());
    std::fs::write(
        docker.path().join("config.json"),
        json!({"auths": {registry.addr.clone(): {"auth": encoded}}}).to_string(),
    )
    .unwrap();
    let installed = mst_with(&mst, docker.path(), &["plugin", "install", &reference]);
    assert_eq!(installed.code, 0, "{}", installed.stderr);
    outputs.push_str(&installed.stdout);
    outputs.push_str(&installed.stderr);

    // A run of the installed plugin, with mst logging at debug.
    let eval = pinned_eval(&reference, json!({"plugin": reference}));
    let run = mst
        .command(&eval.args(&[]))
        .env("DOCKER_CONFIG", docker.path())
        .env("MST_LOG", "debug")
        .output()
        .unwrap();
    let run: Run = run.into();
    assert_eq!(run.code, 0, "{}", run.stderr);
    outputs.push_str(&run.stdout);
    outputs.push_str(&run.stderr);

    assert!(!outputs.contains(CANARY), "the password was printed");
    for dir in [mst.home.path(), &eval.results()] {
        for file in walk(dir) {
            let bytes = std::fs::read(&file).unwrap();
            assert!(
                !String::from_utf8_lossy(&bytes).contains(CANARY),
                "the password is in {}",
                file.display()
            );
        }
    }
}

/// Standard base64, as Docker writes `auths.*.auth`.
fn base64_encode(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (*b as u32) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[test]
fn an_installed_runner_is_found_by_its_plain_name() {
    let mst = Mst::new();
    let hostile = mst_tests::fixture("hostile-runner.wasm");
    let installed = mst.run(&["plugin", "install", s(&hostile), "--json"]);
    assert_eq!(installed.code, 0, "{}", installed.stderr);
    // `plugin list` says which file it came from.
    let list = mst.run(&["plugin", "list", "--json"]).json();
    assert_eq!(
        list[0]["source"],
        json!({"type": "file", "path": s(&hostile)})
    );

    let eval = command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), 2, 30);
    let dir = format!("dir={}", s(&eval.dir.path().join("machines")));
    let run = eval.run(
        &mst,
        &[
            "--runner",
            "hostile-runner",
            "--runner-option",
            "behaviour=shell",
            "--runner-option",
            &dir,
            "--allow-exec",
            "sh",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let results = mst_tests::read_json(&eval.run_dir("e2e").join("run.json"));
    assert!(
        results.to_string().contains("mst/fixture/hostile-runner"),
        "{results}"
    );

    let unknown = eval.run(&mst, &["--runner", "nosuch"]);
    assert_ne!(unknown.code, 0);
    assert!(
        unknown.stderr.contains("unknown runner `nosuch`")
            && unknown
                .stderr
                .contains("the installed runners are mst/fixture/hostile-runner"),
        "{}",
        unknown.stderr
    );

    // A second installed runner with the same last part (its record copied under another
    // namespace) makes the plain name ambiguous; the full name still works.
    let plugins = mst.home.path().join("plugins");
    let copy = plugins.join("acme/fixture/hostile-runner/0.1.0");
    std::fs::create_dir_all(&copy).unwrap();
    let original = plugins.join("mst/fixture/hostile-runner/0.1.0");
    std::fs::copy(original.join("plugin.wasm"), copy.join("plugin.wasm")).unwrap();
    let mut record = mst_tests::read_json(&original.join("manifest.json"));
    record["name"] = json!("acme/fixture/hostile-runner");
    std::fs::write(copy.join("manifest.json"), record.to_string()).unwrap();
    let ambiguous = eval.run(&mst, &["--runner", "hostile-runner"]);
    assert_ne!(ambiguous.code, 0);
    assert!(
        ambiguous.stderr.contains(
            "runner `hostile-runner` is ambiguous: it could be acme/fixture/hostile-runner or \
             mst/fixture/hostile-runner"
        ),
        "{}",
        ambiguous.stderr
    );
}
