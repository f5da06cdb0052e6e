//! Environment, secrets and output hygiene, end to end through the built `mst`: what the
//! programs mst starts inherit, what its provenance `git` call may run, and what reaches the
//! terminal and the run directory of the secrets it holds and of hostile text.

use mst_tests::{
    cases, files_containing, fixture, free_port, read_json, read_trace, s, Eval, Mst, Run,
};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Writes an executable script.
fn script(path: &Path, body: &str) -> PathBuf {
    std::fs::write(path, body).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path.to_path_buf()
}

/// Asserts that `needle` is nowhere in mst's output nor in any file below `dirs`.
fn nowhere(run: &Run, dirs: &[&Path], needle: &str) {
    assert!(
        !run.stdout.contains(needle) && !run.stderr.contains(needle),
        "{needle} reached mst's output:\n{}\n{}",
        run.stdout,
        run.stderr
    );
    for dir in dirs {
        assert_eq!(
            files_containing(dir, needle),
            Vec::<PathBuf>::new(),
            "{needle} reached a file"
        );
    }
}

fn git(dir: &Path, args: &[&str]) {
    let ok = std::process::Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com", "-C"])
        .arg(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(ok.status.success(), "git {args:?}: {ok:?}");
}

/// Eval `name`: one case, answered by `cat`, passing when it exits 0.
fn cat_eval(name: &str) -> Eval {
    Eval::new(
        json!({
            "name": name,
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {"command": ["cat"]},
            "judges": [{"assert": "exit-code", "value": 0}]
        }),
        &cases(1),
    )
}

#[test]
fn git_provenance_runs_nothing_the_config_repository_configures() {
    let eval = cat_eval("git");
    let dir = eval.dir.path();
    let markers = tempfile::tempdir().unwrap();
    let fsmonitor_marker = markers.path().join("fsmonitor-ran");
    let filter_marker = markers.path().join("filter-ran");
    let hook = script(
        &markers.path().join("fsmonitor.sh"),
        &format!("#!/bin/sh\ntouch {}\n", s(&fsmonitor_marker)),
    );
    std::fs::write(dir.join(".gitattributes"), "*.jsonl filter=evil\n").unwrap();
    std::fs::write(dir.join(".gitignore"), "results/\n").unwrap();
    git(dir, &["init", "-q", "."]);
    git(dir, &["add", "."]);
    git(dir, &["commit", "-q", "-m", "eval"]);
    let remote = "https://bot:origin-canary-31f0@git.example.com/acme/evals.git";
    git(dir, &["remote", "add", "origin", remote]);
    // The repository's own config: a monitor hook and a clean filter, each leaving a marker.
    git(dir, &["config", "core.fsmonitor", s(&hook)]);
    let clean = format!("sh -c 'touch {}; cat'", s(&filter_marker));
    git(dir, &["config", "filter.evil.clean", &clean]);
    // A newer mtime makes `git status` look at the file's contents, through the filter.
    std::thread::sleep(Duration::from_millis(1100));
    let cases_file = dir.join("cases.jsonl");
    std::fs::write(&cases_file, std::fs::read(&cases_file).unwrap()).unwrap();
    // What plain `git status` does with this repository (the vectors are live).
    let probe = std::process::Command::new("git")
        .args(["-C", s(dir), "status", "--porcelain"])
        .output()
        .unwrap();
    assert!(probe.status.success());
    assert!(
        fsmonitor_marker.exists() && filter_marker.exists(),
        "plain git runs both"
    );
    std::fs::remove_file(&fsmonitor_marker).unwrap();
    std::fs::remove_file(&filter_marker).unwrap();
    // That status refreshed the index: make the file's stat data stale again.
    std::thread::sleep(Duration::from_millis(1100));
    std::fs::write(&cases_file, std::fs::read(&cases_file).unwrap()).unwrap();

    let index = dir.join(".git/index");
    let index_before = std::fs::read(&index).unwrap();
    let run = eval.run(&Mst::new(), &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(!fsmonitor_marker.exists(), "mst ran the fsmonitor hook");
    assert!(!filter_marker.exists(), "mst ran the clean filter");
    assert_eq!(
        std::fs::read(&index).unwrap(),
        index_before,
        "mst wrote the repository's index"
    );
    let record = read_json(&eval.run_dir("git").join("run.json"));
    let head = std::process::Command::new("git")
        .args(["-C", s(dir), "rev-parse", "HEAD"])
        .output()
        .unwrap();
    assert_eq!(
        record["git"]["commit"],
        String::from_utf8_lossy(&head.stdout).trim(),
        "provenance is still recorded: {record}"
    );
    assert_eq!(
        record["git"]["origin"], "https://git.example.com/acme/evals.git",
        "the origin, without its credentials"
    );
    assert!(mst_tests::files_containing(&eval.results(), "origin-canary-31f0").is_empty());
}

/// A stdio MCP server (the real Python SDK) whose one tool reports its environment.
const ENV_SERVER: &str = r#"
import os
from mcp.server.mcpserver import MCPServer

server = MCPServer("env-reporter")

@server.tool()
def environment() -> str:
    return "\n".join(f"{k}={v}" for k, v in sorted(os.environ.items()))

server.run("stdio")
"#;

#[test]
fn the_local_worker_its_agent_and_its_stdio_servers_get_a_minimal_environment() {
    const CANARY: &str = "canary-aws-4be1c07d";
    let eval = Eval::new(
        json!({
            "name": "env",
            "datasets": ["cases.jsonl"],
            "servers": {"envsrv": {"command": "python3", "args": ["env_server.py"],
                                    "env": {"SERVER_CONFIGURED": "yes"}}},
            "client": "command",
            "clientOptions": {"command": ["env"], "input": "none", "env": {"AGENT_CONFIGURED": "yes"}},
            "variants": {
                "agent": {},
                "server": {"client": "mcp", "clientOptions": {}}
            },
            "judges": [{"assert": "not-contains", "value": CANARY}],
            "timeout": 30
        }),
        &[json!({"id": "env", "input": {"tool": "environment"}})],
    );
    let dir = eval.dir.path();
    // The server runs in the worker's directory: it is named by its absolute path.
    let server_script = dir.join("env_server.py");
    std::fs::write(&server_script, ENV_SERVER).unwrap();
    let mut config = read_json(&eval.config());
    config["servers"]["envsrv"]["args"] = json!([s(&server_script)]);
    std::fs::write(eval.config(), config.to_string()).unwrap();
    // The worker, wrapped to record the environment the local runner gives it (unsandboxed,
    // so that it can write it here).
    let worker_env = dir.join("worker.env");
    let wrapper = script(
        &dir.join("worker.sh"),
        &format!(
            "#!/bin/sh\nenv > {}\nexec {} \"$@\"\n",
            s(&worker_env),
            s(&mst_tests::mst_bin())
        ),
    );
    let mst = Mst::new();
    let config = eval.config();
    let results = eval.results();
    let run: Run = mst
        .command(&[
            "run",
            "--config",
            s(&config),
            "--results-dir",
            s(&results),
            "--runner-option",
            &format!("worker={}", s(&wrapper)),
            "--runner-option",
            "isolation=none",
        ])
        .env("AWS_SECRET_ACCESS_KEY", CANARY)
        // The one way to lend the agents more: name it.
        .env("MST_PASS_ENV", "LENT_TO_AGENTS")
        .env("LENT_TO_AGENTS", "lent")
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let run_dir = eval.run_dir("env");
    let agent = read_trace(&run_dir, "agent/env/0");
    let agent_env = agent["trace"]["finalText"].as_str().unwrap();
    assert!(
        agent_env.contains("AGENT_CONFIGURED=yes")
            && agent_env.contains("PATH=")
            && agent_env.contains("LENT_TO_AGENTS=lent"),
        "{agent_env}"
    );
    let server = read_trace(&run_dir, "server/env/0");
    let server_env = server["trace"]["finalText"].as_str().unwrap();
    assert!(
        server_env.contains("SERVER_CONFIGURED=yes") && server_env.contains("PATH="),
        "{server}"
    );
    let worker = std::fs::read_to_string(&worker_env).unwrap();
    assert!(worker.contains("PATH="), "{worker}");
    for (who, env) in [
        ("the worker", worker.as_str()),
        ("the agent", agent_env),
        ("the server", server_env),
    ] {
        assert!(
            !env.contains(CANARY),
            "{who} inherited mst's environment:\n{env}"
        );
    }
}

#[test]
fn a_granted_secret_a_plugin_puts_in_its_reason_and_log_is_redacted() {
    const CANARY: &str = "canary-granted-93a7e2";
    let grader = fixture("canary-grader.wasm");
    let eval = Eval::new(
        json!({
            "name": "granted",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {"command": ["cat"]},
            "plugins": [{"path": s(&grader), "allowSecret": ["MST_CANARY"]}],
            "judges": [{"plugin": "mst/fixture/canary-grader", "options": {"name": "MST_CANARY"}}]
        }),
        &cases(1),
    );
    let mst = Mst::new();
    let config = eval.config();
    let results = eval.results();
    let run: Run = mst
        .command(&["run", "--config", s(&config), "--results-dir", s(&results)])
        .env("MST_CANARY", CANARY)
        .output()
        .unwrap()
        .into();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("the secret is [redacted:MST_CANARY]"),
        "the plugin's log line, redacted: {}",
        run.stderr
    );
    let run_dir = eval.run_dir("granted");
    let scores = read_json(&run_dir.join("scores/mst%2Ffixture%2Fcanary-grader.json"));
    assert_eq!(
        scores[0]["reason"], "graded with secret [redacted:MST_CANARY]",
        "{scores}"
    );
    nowhere(&run, &[&results, mst.home.path()], CANARY);
}

/// A streamable HTTP MCP server (the real Python SDK) whose one tool echoes the
/// `Authorization` header it received.
const ECHO_SERVER: &str = r#"
import sys
from mcp.server.mcpserver import MCPServer, Context

server = MCPServer("token-echo")

@server.tool()
def whoami(ctx: Context) -> str:
    return "you sent " + str(ctx.headers.get("authorization"))

server.run("streamable-http", port=int(sys.argv[1]))
"#;

#[test]
fn an_mcp_server_echoing_its_bearer_token_is_redacted() {
    const CANARY: &str = "canary-bearer-5d09b4";
    let dir = tempfile::tempdir().unwrap();
    let server_script = dir.path().join("echo_server.py");
    std::fs::write(&server_script, ECHO_SERVER).unwrap();
    let port = free_port();
    let mut server = std::process::Command::new("python3")
        .arg(&server_script)
        .arg(port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    mst_tests::wait_for_port(port, "the echo server");
    let eval = Eval::new(
        json!({
            "name": "bearer",
            "datasets": ["cases.jsonl"],
            "servers": {"api": {"url": format!("http://127.0.0.1:{port}/mcp"), "token": "API_TOKEN"}},
            "client": "mcp",
            "judges": [{"assert": "contains", "value": "you sent Bearer"}],
            "timeout": 30
        }),
        &[json!({"id": "c", "input": {"tool": "whoami"}})],
    );
    let secrets = dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("API_TOKEN={CANARY}\n")).unwrap();
    let mst = Mst::new();
    // The server is on the host's loopback: the machine shares the host's network.
    let run = eval.run(
        &mst,
        &[
            "--secrets-file",
            s(&secrets),
            "--runner-option",
            "network=host",
        ],
    );
    let _ = server.kill();
    let _ = server.wait();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("bearer"), "default/c/0");
    assert_eq!(
        trace["trace"]["finalText"], "you sent Bearer [redacted:API_TOKEN]",
        "the server got the token and echoed it; the trace holds its name: {trace}"
    );
    nowhere(&run, &[&eval.results(), mst.home.path()], CANARY);
}

#[test]
fn a_case_id_holding_a_secret_is_refused_before_anything_runs() {
    // Redacted out of the worker's report of its trial, such a case would lose its whole
    // shard; and its id would be blotted out of every result file.
    const CANARY: &str = "canary-case-id-51c2e9";
    let eval = Eval::new(
        json!({
            "name": "ids",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {"command": ["cat"]},
            "judges": [{"assert": "exit-code", "value": 0}]
        }),
        &[
            json!({"id": "fine", "input": "a"}),
            json!({"id": format!("about-{CANARY}"), "input": "b"}),
        ],
    );
    let secrets = eval.dir.path().join("secrets.env");
    std::fs::write(&secrets, format!("CASE_KEY={CANARY}\n")).unwrap();
    let mst = Mst::new();
    let run = eval.run(&mst, &["--secrets-file", s(&secrets)]);
    assert_eq!(
        run.code, 2,
        "a config error: {}\n{}",
        run.stdout, run.stderr
    );
    assert!(
        run.stderr.contains("cases.jsonl:2")
            && run.stderr.contains("its id holds the value of a secret")
            && run.stderr.contains("[redacted:CASE_KEY]"),
        "the error says which case, where, and why, without the value: {}",
        run.stderr
    );
    assert!(
        !eval.results().join("ids").exists(),
        "nothing ran: no run directory"
    );
    nowhere(&run, &[&eval.results(), mst.home.path()], CANARY);
}

#[test]
fn an_agent_printing_its_environment_is_redacted() {
    const CANARY: &str = "canary-agent-key-7f30aa";
    let eval = command_eval_with_env(CANARY);
    let dir = eval.dir.path().to_path_buf();
    let secrets = dir.join("secrets.env");
    std::fs::write(&secrets, format!("AGENT_KEY={CANARY}\n")).unwrap();
    let mst = Mst::new();
    let run = eval.run(&mst, &["--secrets-file", s(&secrets)]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("agent"), "default/c1/0");
    let text = trace.to_string();
    assert!(
        trace["trace"]["finalText"]
            .as_str()
            .unwrap()
            .contains("AGENT_KEY=[redacted:AGENT_KEY]"),
        "{text}"
    );
    assert!(
        text.contains("stderr AGENT_KEY=[redacted:AGENT_KEY]"),
        "its stderr, a log event: {text}"
    );
    nowhere(&run, &[&eval.results(), mst.home.path()], CANARY);
}

/// An eval whose agent prints its environment to stdout and stderr; its config gives it
/// `AGENT_KEY=value` (as a user wiring an API key would).
fn command_eval_with_env(value: &str) -> Eval {
    Eval::new(
        json!({
            "name": "agent",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {
                "command": ["sh", "-c", "env; env | sed 's/^/stderr /' >&2"],
                "input": "none",
                "env": {"AGENT_KEY": value}
            },
            "judges": [{"assert": "exit-code", "value": 0}]
        }),
        &cases(1),
    )
}

#[test]
fn a_workers_fatal_message_and_log_are_terminal_safe_and_redacted() {
    const CANARY: &str = "canary-fatal-2c61f8";
    let eval = cat_eval("fatal");
    let dir = eval.dir.path();
    let secrets = dir.join("secrets.env");
    std::fs::write(&secrets, format!("WORKER_SEEN={CANARY}\n")).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    // A hostile worker: says hello, writes escape sequences and the secret to its stderr (the
    // worker log), and dies with a fatal message that clears the screen and names the secret.
    let worker = script(
        &dir.join("worker.sh"),
        &format!(
            r#"#!/bin/sh
printf 'log \033[2J\033]0;owned\007 {CANARY}\n' >&2
echo '{{"type":"hello","protocol":"mst.shard/v1","mst":"{version}","client":{{"name":"command","version":"{version}"}},"shard":0}}'
echo '{{"type":"fatal","message":"\u001b[2J\u000dgone {CANARY} \u202eevil"}}'
"#
        ),
    );
    let mst = Mst::new();
    let run = eval.run(
        &mst,
        &[
            "--secrets-file",
            s(&secrets),
            "--runner-option",
            &format!("worker={}", s(&worker)),
        ],
    );
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        !run.stderr.contains('\u{1b}') && !run.stderr.contains('\r'),
        "raw control characters reached the terminal: {:?}",
        run.stderr
    );
    assert!(
        run.stderr
            .contains("\\u001b[2J\\u000dgone [redacted:WORKER_SEEN] \\u202eevil"),
        "the fatal message, escaped and redacted: {}",
        run.stderr
    );
    let run_dir = eval.run_dir("fatal");
    let record = read_json(&run_dir.join("run.json"));
    let reason = record["machines"][0]["ended"]["reason"].as_str().unwrap();
    assert!(reason.contains("gone [redacted:WORKER_SEEN]"), "{reason}");
    let log = std::fs::read(run_dir.join("shards/0.worker.log")).unwrap();
    let log = String::from_utf8(log).unwrap();
    assert!(
        !log.contains('\u{1b}') && !log.contains('\u{7}'),
        "raw control characters in the worker log: {log:?}"
    );
    assert!(
        log.contains("log \\u001b[2J\\u001b]0;owned\\u0007 [redacted:WORKER_SEEN]"),
        "{log:?}"
    );
    nowhere(&run, &[&eval.results(), mst.home.path()], CANARY);
}

#[test]
fn on_the_ssh_runner_the_agent_gets_a_minimal_environment_whatever_the_login_holds() {
    use mst_tests::sshd::{self, Sshd};
    const CANARY: &str = "canary-login-env-61c2d9";
    if !sshd::available() {
        eprintln!("skipped: no OpenSSH server here");
        return;
    }
    let keys = sshd::keys();
    let mut host = Sshd::start(&keys, "env");
    // The remote login carries a credential in its environment (as a host's profile might).
    let config = keys.dir.path().join("sshd-env.conf");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(&format!("SetEnv AWS_SECRET_ACCESS_KEY={CANARY}\n"));
    std::fs::write(&config, text).unwrap();
    host.kill();
    host.restart();
    let ssh = |command: &str| {
        let out = std::process::Command::new("ssh")
            .args(["-i", s(&keys.identity()), "-o"])
            .arg(format!("UserKnownHostsFile={}", s(&keys.known_hosts())))
            .args(["-o", "BatchMode=yes", "-p", &host.port.to_string()])
            .arg(format!("{}@127.0.0.1", host.user))
            .arg(command)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        ssh("env").contains(CANARY),
        "the login's environment holds it"
    );

    let eval = Eval::new(
        json!({
            "name": "ssh-env",
            "datasets": ["cases.jsonl"],
            "client": "command",
            "clientOptions": {"command": ["env"], "input": "none"},
            "judges": [{"assert": "not-contains", "value": CANARY}],
            "timeout": 30
        }),
        &cases(1),
    );
    let plugin = mst_tests::plugin("ssh-runner.wasm");
    let run = eval.run(
        &Mst::new(),
        &[
            "--plugin",
            s(&plugin),
            "--runner",
            "mst/runner/ssh",
            "--runner-option",
            &format!("hosts={}", host.destination()),
            "--runner-option",
            &format!("identity={}", s(&keys.identity())),
            "--runner-option",
            &format!("knownHosts={}", s(&keys.known_hosts())),
            "--allow-exec",
            "ssh",
        ],
    );
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let trace = read_trace(&eval.run_dir("ssh-env"), "default/c1/0");
    let env = trace["trace"]["finalText"].as_str().unwrap();
    assert!(env.contains("PATH=") && !env.contains(CANARY), "{env}");
}
