//! The local runner's sandbox and limits (issue 44): by default (`isolation=bwrap`) the
//! worker and its agents run in a real bubblewrap sandbox (Debian's `bubblewrap`, installed by
//! `.ci/run`) that shows them none of the operator's files, lets them write only the machine's
//! directory, gives them a home of their own and no network but their loopback, where the
//! model gateway still serves; `memory=SIZE` holds them to it through a real control group.
//! Each test runs the same agent unsandboxed too (`isolation=none`), which shows what the
//! sandbox takes away; the two that hold the issue's bar run the other side on the default.

use mst_tests::model_server::{ModelServer, Reply};
use mst_tests::{read_trace, s, Eval, Mst};
use serde_json::json;
use std::io::{Read, Write};

/// Panics, saying what to install, unless bubblewrap is on the PATH.
fn require_bwrap() {
    mst_tests::require_program("bwrap", "apt-get install bubblewrap");
}

/// A loopback HTTP server answering every request with `ok`, as something on the host network
/// an agent should not reach.
fn host_service() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nok");
        }
    });
    port
}

/// The final answer of trial `key` in `eval`'s one run of `name`.
fn answer(eval: &Eval, name: &str, key: &str) -> String {
    let trace = read_trace(&eval.run_dir(name), key);
    trace["trace"]["finalText"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn a_sandboxed_agent_sees_no_operator_file_writes_only_its_machine_and_has_its_own_home() {
    require_bwrap();
    let port = host_service();
    let probe = |dir: &std::path::Path| {
        format!(
            r#"d={dir}
for f in "$d/cases.jsonl" "$d/secrets.env" /root/.bashrc; do
  if cat "$f" >/dev/null 2>&1; then echo "read $f"; fi
done
if echo pwned > "$d/pwned" 2>/dev/null; then echo "wrote the eval directory"; fi
for p in /proc/[0-9]*; do
  if tr '\0' ' ' < $p/cmdline 2>/dev/null | grep -q ' collec[t] '; then
    echo "saw the worker"
    if cat $p/environ >/dev/null 2>&1; then echo "read the worker's memory files"; fi
  fi
done
[ -z "$(ls -A "$HOME" 2>/dev/null)" ] && echo "home empty"
echo mine > "$HOME/mine" && echo "home $HOME"
if curl -s --max-time 3 http://127.0.0.1:{port}/ >/dev/null; then echo "reached the host"; fi
echo "processes $(ls /proc | grep -c '^[0-9]')"
"#,
            dir = s(dir)
        )
    };
    let mut runs = Vec::new();
    for isolation in ["none", "default"] {
        let eval = Eval::new(
            json!({}),
            &[json!({"id": "c1", "input": "x", "expected": "y"})],
        );
        let config = json!({"name": "iso", "datasets": ["cases.jsonl"], "client": "command",
            "clientOptions": {"command": ["sh", "-c", probe(eval.dir.path())], "input": "none"},
            "judges": [{"assert": "exit-code", "value": 0}], "timeout": 60});
        std::fs::write(eval.config(), config.to_string()).unwrap();
        std::fs::write(eval.dir.path().join("secrets.env"), "UNUSED=1\n").unwrap();
        let mut args = vec!["-q"];
        if isolation == "none" {
            args.extend(["--runner-option", "isolation=none"]);
        }
        let run = eval.run(&Mst::new(), &args);
        assert_eq!(run.code, 0, "{isolation}: {}\n{}", run.stdout, run.stderr);
        let said = answer(&eval, "iso", "default/c1/0");
        // The summary says when the agents ran unsandboxed.
        let told = run.stdout.contains("sandbox: none");
        assert_eq!(told, isolation == "none", "{isolation}: {}", run.stdout);
        runs.push((said, eval.dir.path().join("pwned").exists()));
    }
    let (open, wrote_open) = &runs[0];
    let (boxed, wrote_boxed) = &runs[1];
    // Unsandboxed, the agent is the operator: it reads the answers and writes anywhere.
    assert!(
        open.contains("cases.jsonl")
            && open.contains("reached the host")
            && open.contains("read the worker's")
            && *wrote_open,
        "{open}"
    );
    for not in ["read ", "wrote", "reached the host", "the worker"] {
        assert!(!boxed.contains(not), "sandboxed, it {not}: {boxed}");
    }
    assert!(!wrote_boxed, "{boxed}");
    assert!(boxed.contains("home empty"), "{boxed}");
    let home = boxed
        .lines()
        .find_map(|l| l.strip_prefix("home /").map(|p| format!("/{p}")))
        .unwrap_or_default();
    assert!(
        home.starts_with("/tmp/mst-home-"),
        "its home is the trial's own: {boxed}"
    );
    // It sees its own processes only: the sandbox's, the worker's and its own.
    let processes: u32 = boxed
        .lines()
        .find_map(|l| l.strip_prefix("processes "))
        .and_then(|n| n.parse().ok())
        .unwrap();
    assert!(processes < 10, "{boxed}");
}

#[test]
fn each_trial_runs_apart_from_the_bundle_the_worker_and_the_other_trials() {
    require_bwrap();
    // Two variants' trials run at once on one machine. The victim's agent holds a secret in
    // its environment and leaves it in its home and work directory; the attacker's, started
    // a moment later, searches every process's environment and every small file where a
    // machine keeps things, for that secret and for the case's expected answer (in the eval's
    // dataset, in a temporary directory here), and prints what it finds base64-encoded past
    // the redactor; and it looks for the worker's bundle (every case's input).
    let nonce = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let canary = format!("vict1m-c4n4ry-{nonce:x}");
    let expected = format!("3xp3ct3d-{nonce:x}");
    let search = r#"sleep 1
for f in /proc/[0-9]*/environ $(find /tmp /dev/shm /run "$HOME" -maxdepth 4 -type f -size -64k 2>/dev/null); do
  if grep -qaE 'vict1m-c4n4ry|3xp3ct3d' "$f" 2>/dev/null; then echo "found $f $(base64 -w0 < "$f")"; fi
done
echo "home $HOME"
echo "bundles $(ls -d /tmp/mst-local-*/bundle* 2>/dev/null | wc -l)"
echo searched"#;
    let victim =
        r#"echo "$API_KEY" > "$HOME/note"; echo "$API_KEY" > note; sleep 4; echo "home $HOME""#;
    let mut runs = Vec::new();
    for isolation in ["none", "default"] {
        let eval = Eval::new(
            json!({"name": "apart", "datasets": ["cases.jsonl"], "client": "command",
                   "concurrency": 2,
                   "variants": {
                       "victim": {"clientOptions": {"command": ["sh", "-c", victim], "input": "none",
                                                    "secretEnv": {"API_KEY": "VICTIM_SECRET"}}},
                       "attacker": {"clientOptions": {"command": ["sh", "-c", search], "input": "none"}}},
                   "judges": [{"assert": "exit-code", "value": 0}], "timeout": 60}),
            &[json!({"id": "c1", "input": "x", "expected": expected})],
        );
        let secrets = eval.dir.path().join("secrets.env");
        std::fs::write(&secrets, format!("VICTIM_SECRET={canary}\n")).unwrap();
        let mut args = vec!["-q", "--secrets-file", s(&secrets)];
        if isolation == "none" {
            args.extend(["--runner-option", "isolation=none"]);
        }
        let run = eval.run(&Mst::new(), &args);
        assert_eq!(run.code, 0, "{isolation}: {}\n{}", run.stdout, run.stderr);
        let found = answer(&eval, "apart", "attacker/c1/0");
        let victim_home = answer(&eval, "apart", "victim/c1/0");
        assert!(found.ends_with("searched"), "{isolation}: {found}");
        runs.push((found, victim_home));
    }
    // What the attacker found, decoded (by coreutils' `base64`).
    let decoded = |found: &str| -> String {
        let found = found.lines().filter_map(|l| l.strip_prefix("found "));
        let encoded: Vec<&str> = found
            .filter_map(|l| l.split_once(' ').map(|(_, b)| b))
            .collect();
        let script = format!(
            "for b in {}; do echo \"$b\" | base64 -d; done",
            encoded.join(" ")
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output();
        String::from_utf8_lossy(&out.unwrap().stdout).into_owned()
    };
    // The control: unsandboxed, the attacker reads the victim's secret and the answers.
    let (open, _) = &runs[0];
    assert!(!open.contains("bundles 0"), "{open}");
    let open = decoded(open);
    assert!(open.contains(&canary) && open.contains(&expected), "{open}");
    let (boxed, victim) = &runs[1];
    assert!(!boxed.contains("found "), "sandboxed, it found: {boxed}");
    assert!(boxed.contains("bundles 0"), "{boxed}");
    let home = |text: &str| {
        let line = text.lines().find_map(|l| l.strip_prefix("home "));
        line.unwrap_or_default().to_string()
    };
    assert!(home(boxed).starts_with("/tmp/mst-home-"), "{boxed}");
    assert_ne!(
        home(boxed),
        home(victim),
        "each trial has a home of its own"
    );
}

#[test]
fn with_no_network_a_sandboxed_agent_still_reaches_its_model_through_the_gateway() {
    require_bwrap();
    const KEY: &str = "mst-canary-sandbox-key-2b8e";
    let server = ModelServer::start_with(|_| Reply::anthropic_text("pong"));
    let agent = r#"curl -s --max-time 20 "$ANTHROPIC_BASE_URL/v1/messages" -H "x-api-key: $ANTHROPIC_API_KEY" \
  -H 'content-type: application/json' \
  -d '{"model": "any", "max_tokens": 50, "messages": [{"role": "user", "content": "ping"}]}'"#;
    let eval = Eval::new(
        json!({"name": "gw", "datasets": ["cases.jsonl"], "client": "command",
               "model": "acme/test-model",
               "providers": {"acme": {"format": "anthropic", "baseUrl": server.url(), "key": "MODEL_KEY"}},
               "clientOptions": {"command": ["sh", "-c", agent], "modelGateway": true, "input": "none"},
               "judges": [{"assert": "contains", "value": "pong"}], "timeout": 60}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("MODEL_KEY={KEY}\n")).unwrap();
    let run = eval.run(
        &Mst::new(),
        &[
            "-q",
            "--secrets-file",
            s(&secrets),
            "--runner-option",
            "isolation=bwrap",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(answer(&eval, "gw", "default/c1/0").contains("pong"));
    assert_eq!(server.requests().len(), 1, "the host called the provider");
    assert!(mst_tests::files_containing(&eval.results(), KEY).is_empty());
}

#[test]
fn a_machine_memory_limit_stops_an_allocation_past_it() {
    require_bwrap();
    // `dd` with a 1 GiB block allocates and fills a 1 GiB buffer.
    let dd = |limit: &[&str]| {
        let eval = Eval::new(
            json!({"name": "mem", "datasets": ["cases.jsonl"], "client": "command",
                   "clientOptions": {"command": ["dd", "if=/dev/zero", "of=/dev/null", "bs=1G", "count=1"],
                                     "input": "none"},
                   "judges": [{"assert": "exit-code", "value": 0}], "timeout": 60}),
            &[json!({"id": "c1", "input": "x"})],
        );
        let mut args = vec!["-q", "--runner-option", "isolation=bwrap"];
        for option in limit {
            args.extend(["--runner-option", option]);
        }
        let run = eval.run(&Mst::new(), &args);
        let trace = read_trace(&eval.run_dir("mem"), "default/c1/0");
        (run, trace)
    };
    let (free, trace) = dd(&[]);
    assert_eq!(
        free.code, 0,
        "without a limit it fits: {}\n{trace}",
        free.stderr
    );
    let (limited, trace) = dd(&["memory=256m"]);
    assert_eq!(limited.code, 1, "{}\n{}", limited.stdout, limited.stderr);
    assert_ne!(trace["trace"]["exitCode"], 0, "{trace}");
    // The machine's control group is gone with it.
    let left = std::fs::read_to_string("/proc/self/cgroup")
        .unwrap()
        .lines()
        .find_map(|l| l.split_once(":memory:").map(|(_, path)| path.to_string()))
        .map(|own| std::path::Path::new("/sys/fs/cgroup/memory").join(own.trim_start_matches('/')))
        .and_then(|dir| std::fs::read_dir(dir).ok())
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("mst-local-"));
    assert!(!left, "a control group was left behind");
}

#[test]
fn a_cpu_limit_sets_the_machines_quota_while_it_runs() {
    require_bwrap();
    // Where this host's `cpu` hierarchy puts mst's own group (cgroup v1 here).
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let Some(parent) = own
        .lines()
        .find_map(|l| l.split_once(":cpu:").map(|(_, path)| path.to_string()))
        .map(|own| std::path::Path::new("/sys/fs/cgroup/cpu").join(own.trim_start_matches('/')))
    else {
        eprintln!("skipped: no cgroup v1 cpu hierarchy here");
        return;
    };
    let eval = Eval::new(
        json!({"name": "cpu", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sleep", "4"], "input": "none"},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 60}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let options = [
        "-q",
        "--runner-option",
        "isolation=bwrap",
        "--runner-option",
        "cpus=0.5",
    ];
    let mut child = eval.spawn(&Mst::new(), &options);
    // The machine's group, once the worker has joined it: its quota is half the period.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let quota = loop {
        let groups = std::fs::read_dir(&parent).unwrap().flatten();
        let quota = groups
            .filter(|e| e.file_name().to_string_lossy().starts_with("mst-local-"))
            .filter(|e| {
                let procs = std::fs::read_to_string(e.path().join("cgroup.procs"));
                procs.is_ok_and(|p| !p.trim().is_empty())
            })
            .find_map(|e| std::fs::read_to_string(e.path().join("cpu.cfs_quota_us")).ok());
        if let Some(quota) = quota {
            break quota;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no machine group appeared"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    assert_eq!(quota.trim(), "50000");
    assert!(child.wait().unwrap().success());
}

#[test]
fn bad_isolation_options_are_refused_before_any_machine() {
    let eval = Eval::new(
        json!({"name": "bad", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["cat"]}}),
        &[json!({"id": "c1", "input": "x"})],
    );
    for (options, says) in [
        (&["isolation=docker"][..], "takes `bwrap`"),
        (&["isolation=none", "network=host"], "needs isolation=bwrap"),
        (&["network=bridge"], "`none`"),
        (&["network=allow:"], "names no host"),
        (&["network=allow:http://x"], "no host name"),
        (&["expose=relative"], "must be absolute"),
        (&["memory=lots"], "at least 16m"),
        (&["pids=3"], "at least 16"),
        (&["cpus=0"], "at least 0.01"),
        (&["isolation=none", "cpus=1"], "need isolation=bwrap"),
        (&["isolation=none", "memory=256m"], "need isolation=bwrap"),
    ] {
        let mut args = vec!["-q"];
        for option in options {
            args.extend(["--runner-option", option]);
        }
        let run = eval.run(&Mst::new(), &args);
        assert_eq!(run.code, 2, "{options:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{options:?}: {}", run.stderr);
    }
}

#[test]
fn runner_check_tries_a_sandboxed_local_machine() {
    require_bwrap();
    let mst = Mst::new();
    let run = mst.run(&[
        "runner",
        "check",
        "local",
        "--json",
        "--runner-option",
        "isolation=bwrap",
    ]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let steps = run.json()["steps"].clone();
    let failed: Vec<&serde_json::Value> = (steps.as_array().unwrap().iter())
        .filter(|s| s["status"] != "ok")
        .collect();
    assert!(
        failed.is_empty() && steps.as_array().unwrap().len() == 5,
        "{steps}"
    );
    let bad = mst.run(&["runner", "check", "local", "--runner-option", "pids=3"]);
    assert_eq!(bad.code, 1, "{}\n{}", bad.stdout, bad.stderr);
    assert!(bad.stdout.contains("at least 16"), "{}", bad.stdout);
}

#[test]
fn the_operators_runner_defaults_apply_to_each_run_and_the_command_line_wins() {
    require_bwrap();
    let mst = Mst::new();
    let defaults = mst.home.path().join("runners.json");
    std::fs::write(
        &defaults,
        r#"{"local": {"isolation": "none"}, "docker": {"shards": "9"}}"#,
    )
    .unwrap();
    let eval = Eval::new(
        json!({"name": "defaults", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["cat"]},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 30}),
        &[json!({"id": "c1", "input": "x"})],
    );
    // The operator's default, recorded as if typed; the docker entry is not the local's.
    let run = eval.run(&mst, &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(run.stdout.contains("sandbox: none"), "{}", run.stdout);
    let record = mst_tests::read_json(&eval.run_dir("defaults").join("run.json"));
    assert_eq!(
        record["runnerOptions"],
        json!({"isolation": "none"}),
        "{record}"
    );
    assert_eq!(record["shards"], 1, "{record}");
    // The command line's option wins over the file's.
    let results = eval.dir.path().join("boxed");
    let boxed = mst.run(&[
        "run",
        "--config",
        s(&eval.config()),
        "--results-dir",
        s(&results),
        "--runner-option",
        "isolation=bwrap",
    ]);
    assert_eq!(boxed.code, 0, "{}\n{}", boxed.stdout, boxed.stderr);
    assert!(!boxed.stdout.contains("sandbox: none"), "{}", boxed.stdout);
    // A file that is not runners' options stops the run, naming it and the shape it wants.
    std::fs::write(&defaults, r#"{"local": {"pids": 64}}"#).unwrap();
    let bad = eval.run(&mst, &[]);
    assert_eq!(bad.code, 2, "{}\n{}", bad.stdout, bad.stderr);
    assert!(
        bad.stderr.contains(s(&defaults)) && bad.stderr.contains("each value a string"),
        "{}",
        bad.stderr
    );
}

#[test]
fn with_egress_by_name_an_agent_reaches_the_named_hosts_only_and_each_request_is_traced() {
    require_bwrap();
    let port = host_service();
    // Through the trial's proxy (`--noproxy ''` overrides NO_PROXY, which keeps loopback
    // direct for the gateway): a named address by URL and by CONNECT, an unnamed name; then
    // the same address directly, past the proxy.
    let agent = format!(
        r#"code() {{ curl -s --max-time 5 -o /dev/null -w '%{{http_code}}' "$@"; }}
echo "named $(code --noproxy '' http://127.0.0.1:{port}/)"
echo "tunnel $(code --noproxy '' -p http://127.0.0.1:{port}/)"
echo "unnamed $(code --noproxy '' http://localhost:{port}/)"
echo "direct $(code --noproxy '*' http://127.0.0.1:{port}/)""#
    );
    let eval = Eval::new(
        json!({"name": "egress", "datasets": ["cases.jsonl"], "client": "command",
               "clientOptions": {"command": ["sh", "-c", agent], "input": "none"},
               "judges": [{"assert": "exit-code", "value": 0}], "timeout": 60}),
        &[json!({"id": "c1", "input": "x"})],
    );
    let run = eval.run(
        &Mst::new(),
        &["-q", "--runner-option", "network=allow:127.0.0.1"],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let said = answer(&eval, "egress", "default/c1/0");
    for line in ["named 200", "tunnel 200", "unnamed 403", "direct 000"] {
        assert!(said.lines().any(|l| l == line), "{line}: {said}");
    }
    let trace = read_trace(&eval.run_dir("egress"), "default/c1/0");
    let egress: Vec<(String, u64)> = (trace["trace"]["events"].as_array().unwrap().iter())
        .filter(|e| e["name"] == "egress")
        .map(|e| {
            let request = e["data"]["request"].as_str().unwrap();
            let first = request.split(' ').take(2).collect::<Vec<_>>().join(" ");
            (first, e["data"]["status"].as_u64().unwrap())
        })
        .collect();
    assert_eq!(
        egress,
        [
            (format!("GET http://127.0.0.1:{port}/"), 200),
            (format!("CONNECT 127.0.0.1:{port}"), 200),
            (format!("GET http://localhost:{port}/"), 403),
        ],
        "{trace}"
    );
}
