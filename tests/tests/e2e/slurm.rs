//! The `slurm` runner plugin on a real Slurm: each test starts a private single-node cluster
//! (`tests/src/slurm.rs`) and runs `mst` against it through the plugin, granted `salloc`,
//! `srun`, `squeue` and `scancel`, with `SLURM_CONF` naming the cluster's configuration.

use mst_tests::slurm::{self, Cluster};
use mst_tests::{
    assert_resumed, command_eval, read_json, s, trace_lines, wait_for_run, Eval, Mst, Run,
};
use serde_json::json;
use std::time::{Duration, Instant};

/// `--plugin … --runner mst/runner/slurm`, the grants, and `options` as runner options.
fn slurm_args(options: &[&str]) -> Vec<String> {
    let plugin = mst_tests::plugin("slurm-runner.wasm");
    let mut args: Vec<String> = ["--plugin", s(&plugin), "--runner", "mst/runner/slurm"]
        .map(String::from)
        .to_vec();
    for program in ["salloc", "srun", "squeue", "scancel"] {
        args.extend(["--allow-exec".to_string(), program.to_string()]);
    }
    for option in options {
        args.extend(["--runner-option".to_string(), option.to_string()]);
    }
    args
}

/// `mst ARGS` against `cluster`, to completion.
fn run_on(mst: &Mst, cluster: &Cluster, args: &[String]) -> Run {
    mst.command(args)
        .env("SLURM_CONF", cluster.conf())
        .output()
        .expect("run mst")
        .into()
}

/// `mst run` of `eval` against `cluster` with the plugin and `options`.
fn eval_on(mst: &Mst, cluster: &Cluster, eval: &Eval, options: &[&str], extra: &[&str]) -> Run {
    let mut args = eval.args(extra);
    args.extend(slurm_args(options));
    run_on(mst, cluster, &args)
}

fn run_id(dir: &std::path::Path) -> String {
    dir.file_name().unwrap().to_str().unwrap().to_string()
}

/// A 16-trial run in 2 shards (`time=10`) on `cluster`, started in the background (its output
/// piped) and under way: its first 2 traces are in. The process, the eval, its run directory
/// and its id.
fn two_shards_under_way(
    mst: &Mst,
    cluster: &Cluster,
) -> (std::process::Child, Eval, std::path::PathBuf, String) {
    let eval = command_eval(
        json!(["sh", "-c", "read q; sleep 0.5; echo \"$q\""]),
        16,
        30,
    );
    let mut args = eval.args(&[]);
    args.extend(slurm_args(&["shards=2", "time=10"]));
    let child = mst
        .command(&args)
        .env("SLURM_CONF", cluster.conf())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let dir = wait_for_run(&eval.results(), "e2e");
    let id = run_id(&dir);
    // Both shards' jobs run (each has collected a trace): a job cancelled now is a running
    // shard's, not one still waiting for its allocation on a busy cluster.
    wait_until(Duration::from_secs(60), "a trace from each shard", || {
        let shards: std::collections::BTreeSet<u64> = trace_lines(&dir)
            .iter()
            .filter_map(|t| t["collectedBy"]["shard"].as_u64())
            .collect();
        shards.len() == 2
    });
    (child, eval, dir, id)
}

/// An eval of `n` cases whose client echoes each case's input back (so every trial passes).
fn echo_eval(n: usize) -> Eval {
    command_eval(json!(["sh", "-c", "read q; echo \"$q\""]), n, 30)
}

/// Waits up to `limit` for `ready`, panicking with `what`.
fn wait_until(limit: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let started = Instant::now();
    while !ready() {
        assert!(started.elapsed() < limit, "{what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// After a 3-shard run of `eval` on `cluster`: 3 machines, each its own job, done; every job
/// named and commented with the run id, none left running nor any work directory left on the
/// node.
fn assert_each_shard_was_a_job_named_for_the_run(cluster: &Cluster, eval: &Eval) {
    let dir = eval.run_dir("e2e");
    let id = run_id(&dir);
    let record = read_json(&dir.join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 3, "{machines:?}");
    for machine in machines {
        assert_eq!(machine["ended"]["status"], "done", "{machine}");
        assert_eq!(machine["placement"]["plugin"]["name"], "mst/runner/slurm");
        assert_eq!(machine["placement"]["channel"], "command");
        let description = machine["machine"].as_str().unwrap();
        assert!(
            description.contains(&format!("mst-{id}-")) && description.contains(&cluster.node),
            "{description}"
        );
    }
    let jobs: Vec<String> = cluster
        .jobs()
        .into_iter()
        .filter(|j| j.contains(&id))
        .collect();
    assert_eq!(jobs.len(), 3, "{jobs:?}");
    for job in &jobs {
        assert!(
            job.contains(&format!("|mst-{id}-")) && job.contains(&format!("mst.run={id},")),
            "named and commented with the run id: {job}"
        );
    }
    assert!(cluster.live_jobs().is_empty(), "{:?}", cluster.live_jobs());
    mst_tests::assert_no_work_dirs_left(&id);
}

/// What the plugin declares: exactly Slurm's four commands (and `tar`, for a shared
/// filesystem), each as argv templates, none with an option wildcard or a shell; and what
/// `plugin check` warns about.
fn assert_it_declares_only_slurms_commands(mst: &Mst) {
    let check = mst.run(&[
        "plugin",
        "check",
        s(&mst_tests::plugin("slurm-runner.wasm")),
        "--json",
    ]);
    assert_eq!(check.code, 0, "{}\n{}", check.stdout, check.stderr);
    let report = check.json();
    let capabilities = report["capabilities"].as_array().unwrap();
    let programs: Vec<&str> = capabilities
        .iter()
        .map(|c| c["program"].as_str().unwrap())
        .collect();
    // One argv template per way it runs each: salloc, srun's check and five steps, ….
    let mut distinct = programs.clone();
    distinct.dedup();
    assert_eq!(distinct, ["salloc", "srun", "squeue", "scancel", "tar"]);
    assert_eq!(programs.len(), 11, "{programs:?}");
    for capability in capabilities {
        let args: Vec<&str> = capability["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(
            args.first() == Some(&"{argv}")
                && !args
                    .iter()
                    .any(|a| ["sh", "-*", "--*", "--export=*"].contains(a)),
            "{capability}"
        );
    }
    // Its warnings: `srun` and `scancel` may reach any job of the user's (the plugin learns its
    // jobs' ids at run time), and the local `tar` (with `sharedFilesystem`) reads an archive
    // from stdin.
    let problems: Vec<&str> = (report["problems"].as_array().unwrap().iter())
        .map(|p| p["message"].as_str().unwrap())
        .collect();
    assert_eq!(problems.len(), 3, "{report}");
    for says in [
        "declares `srun` with `--jobid=*`, which runs commands in any Slurm job of the operator's",
        "declares `scancel` with `*`, which cancels any Slurm job of the operator's user",
        "declares `tar -x -C {workdir}`, which reads its input from",
    ] {
        assert!(
            problems.iter().any(|p| p.starts_with(says)),
            "{says}: {report}"
        );
    }
}

/// `plugin check --dry-run` on `cluster`: one job, one trial, disposed of.
fn assert_the_dry_run_disposes_of_its_job(mst: &Mst, cluster: &Cluster) {
    let mut args: Vec<String> = ["plugin", "check", "--dry-run"].map(String::from).to_vec();
    args.insert(2, s(&mst_tests::plugin("slurm-runner.wasm")).to_string());
    args.extend(slurm_args(&["time=5"]).into_iter().skip(4));
    let dry = run_on(mst, cluster, &args);
    assert_eq!(dry.code, 0, "{}\n{}", dry.stdout, dry.stderr);
    for step in [
        "create machine   ok",
        "worker ready     ok",
        "one trial        ok",
        "dispose          ok",
    ] {
        assert!(dry.stdout.contains(step), "{step}: {}", dry.stdout);
    }
    assert!(
        dry.stdout.contains("(slurm, files through srun)"),
        "{}",
        dry.stdout
    );
    assert!(cluster.live_jobs().is_empty(), "{:?}", cluster.live_jobs());
}

#[test]
fn three_shards_on_slurm_with_a_dry_run_and_a_partition_that_does_not_exist() {
    if !slurm::available() {
        return;
    }
    let cluster = Cluster::start(2);
    let mst = Mst::new();

    // 3 shards, each its own job: every trial passes.
    // The node has 2 CPUs: the third job waits in the queue until one of the others ends, so
    // the plugin's time limit (which bounds the wait) must cover a slow, busy machine.
    let eval = echo_eval(9);
    let run = eval_on(
        &mst,
        &cluster,
        &eval,
        &["shards=3", "time=10"],
        &["--plugin-timeout", "120"],
    );
    assert_eq!(
        run.code,
        0,
        "{}\n{}\n{}",
        run.stdout,
        run.stderr,
        cluster.logs()
    );
    assert!(run.stdout.contains("100.0%"), "{}", run.stdout);
    assert_each_shard_was_a_job_named_for_the_run(&cluster, &eval);
    assert_it_declares_only_slurms_commands(&mst);
    assert_the_dry_run_disposes_of_its_job(&mst, &cluster);

    // A partition the cluster does not have: refused before any job or trial, in Slurm's
    // words, naming the option.
    let before = cluster.jobs().len();
    let eval = echo_eval(3);
    let run = eval_on(&mst, &cluster, &eval, &["shards=3", "partition=nope"], &[]);
    assert_ne!(run.code, 0, "{}", run.stderr);
    assert!(
        run.stderr
            .contains("--runner-option for `mst/runner/slurm`")
            && run.stderr.contains("invalid partition specified: nope"),
        "{}",
        run.stderr
    );
    assert!(!eval.results().exists(), "no run started");
    assert_eq!(cluster.jobs().len(), before, "no job submitted");
}

#[test]
fn a_job_cancelled_mid_run_leaves_its_trials_missing_and_resume_collects_them() {
    if !slurm::available() {
        return;
    }
    let cluster = Cluster::start(2);
    let mst = Mst::new();
    let (child, eval, dir, id) = two_shards_under_way(&mst, &cluster);
    // Someone else's `scancel` (as a time limit, a preemption or a node failure would).
    let victim = cluster
        .live_jobs()
        .into_iter()
        .find(|j| j.contains(&format!("|mst-{id}-1-")))
        .expect("shard 1's job");
    let job = victim.split('|').next().unwrap();
    assert!(cluster
        .command("scancel")
        .arg(job)
        .status()
        .unwrap()
        .success());
    let first: Run = child.wait_with_output().unwrap().into();
    assert_eq!(first.code, 2, "partial\n{}", first.stderr);
    let summary = read_json(&dir.join("summary.json"));
    let missing = summary["missing"].as_array().unwrap().len();
    assert!((1..16).contains(&missing), "{missing}: {summary}");
    let record = read_json(&dir.join("run.json"));
    let lost = mst_tests::lost_machines(&record);
    assert_eq!(lost.len(), 1, "{}", record["machines"]);
    assert!(
        lost[0]["machine"]
            .as_str()
            .unwrap()
            .contains(&format!("mst-{id}-1-")),
        "the lost machine is not the cancelled job's: {}",
        record["machines"]
    );
    // An ended job has no step to remove its work directory in: run.json names the one that
    // stays (on this machine, the cluster's only node), and the test removes it.
    let workdir = lost[0]["placement"]["workdir"].as_str().unwrap();
    let why = lost[0]["disposeError"].as_str().unwrap_or_default();
    assert!(
        why.contains(&format!("the work directory {workdir} of job {job} stays")),
        "{}",
        lost[0]
    );
    std::fs::remove_dir_all(workdir).unwrap();
    // Missing, never failed: no trial of the cancelled job counts against the agent.
    let counts = &summary["variants"]["default"];
    assert_eq!(
        (&counts["failed"], &counts["infra"]),
        (&json!(0), &json!(0)),
        "{summary}"
    );

    let resumed = eval_on(
        &mst,
        &cluster,
        &eval,
        &["shards=2", "time=10"],
        &["--resume", &id],
    );
    assert_resumed(&resumed, missing);
    assert!(cluster.live_jobs().is_empty(), "{:?}", cluster.live_jobs());
}

#[test]
fn a_queued_job_is_shown_waiting_and_counts_against_ready_only_when_asked() {
    if !slurm::available() {
        return;
    }
    let cluster = Cluster::start(1);
    let mst = Mst::new();
    // Someone else's job holds the node's only CPU.
    let blocker = cluster
        .command("salloc")
        .args(["--no-shell", "--job-name=blocker", "--time=10"])
        .output()
        .unwrap();
    assert!(blocker.status.success(), "{:?}", blocker);

    // Asked to: 3 s of queueing is the ready timeout; the job is cancelled, the trial missing.
    let eval = echo_eval(1);
    let run = eval_on(
        &mst,
        &cluster,
        &eval,
        &["queueCountsAsReady=true", "readyTimeout=3"],
        &["--plugin-timeout", "60"],
    );
    assert_eq!(run.code, 2, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("is waiting in the queue: Resources")
            && run
                .stderr
                .contains("was not running after readyTimeout (3 s)"),
        "{}",
        run.stderr
    );
    let summary = read_json(&eval.run_dir("e2e").join("summary.json"));
    assert_eq!(summary["missing"].as_array().unwrap().len(), 1, "{summary}");
    assert!(
        cluster.live_jobs().iter().all(|j| j.contains("|blocker|")),
        "{:?}",
        cluster.live_jobs()
    );

    // By default the queue does not count: the run waits, says why, and starts when the node
    // is free.
    let eval = echo_eval(1);
    // (8 s, not 3: the ready timeout also covers placing the 80 MB debug worker once the job
    // runs, which a busy machine can take seconds over.)
    let mut args = eval.args(&["--plugin-timeout", "60"]);
    args.extend(slurm_args(&["readyTimeout=8"]));
    let child = mst
        .command(&args)
        .env("SLURM_CONF", cluster.conf())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(30), "a queued mst job", || {
        cluster
            .live_jobs()
            .iter()
            .any(|j| j.contains("|mst-") && j.contains("|PENDING|Resources|"))
    });
    // Past the ready timeout while queued, then the node frees up.
    std::thread::sleep(Duration::from_secs(10));
    let status = cluster.command("scancel").arg("--name=blocker").status();
    assert!(status.unwrap().success());
    let run: Run = child.wait_with_output().unwrap().into();
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains("is waiting in the queue: Resources"),
        "{}",
        run.stderr
    );
}

#[test]
fn jobs_of_an_mst_that_died_are_cancelled_by_the_next_run() {
    if !slurm::available() {
        return;
    }
    let cluster = Cluster::start(2);
    let mst = Mst::new();
    let (mut child, eval, dir, id) = two_shards_under_way(&mst, &cluster);
    // The coordinator dies outright: nothing of it disposes of its jobs.
    child.kill().unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let ours = |cluster: &Cluster| -> Vec<String> {
        cluster
            .live_jobs()
            .into_iter()
            .filter(|j| j.contains(&format!("|mst-{id}-")))
            .collect()
    };
    assert_eq!(ours(&cluster).len(), 2, "{:?}", cluster.jobs());

    // The next run (here the resume of the same one) cancels them first, then finishes it.
    let resumed = eval_on(
        &mst,
        &cluster,
        &eval,
        &["shards=2", "time=10"],
        &["--resume", &id],
    );
    assert_eq!(resumed.code, 0, "{}\n{}", resumed.stdout, resumed.stderr);
    assert!(
        resumed
            .stderr
            .contains("released 2 of 2 machine(s) left by an mst that is gone"),
        "{}",
        resumed.stderr
    );
    assert!(ours(&cluster).is_empty(), "{:?}", cluster.jobs());
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["missing"], json!([]), "{summary}");
    // Nothing left to release: the dead mst's record went with its jobs.
    let again = eval_on(
        &mst,
        &cluster,
        &command_eval(json!(["true"]), 1, 30),
        &[],
        &[],
    );
    assert!(
        !again.stderr.contains("left by an mst that is gone"),
        "{}",
        again.stderr
    );
}

#[test]
fn on_a_shared_filesystem_the_files_move_with_a_local_tar_once_it_is_granted() {
    if !slurm::available() {
        return;
    }
    // One node, this host: its /tmp is as shared as a cluster's scratch filesystem.
    let cluster = Cluster::start(2);
    let mst = Mst::new();
    let eval = echo_eval(4);
    let options = ["shards=2", "time=10", "sharedFilesystem=true"];
    // Without `tar` granted, the bundle cannot be placed: the shards are lost, their trials
    // missing, and the message names the grant.
    let refused = eval_on(&mst, &cluster, &eval, &options, &[]);
    assert_eq!(refused.code, 2, "{}\n{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("--allow-exec tar"),
        "{}",
        refused.stderr
    );
    assert!(cluster.live_jobs().is_empty(), "{:?}", cluster.live_jobs());
    std::fs::remove_dir_all(eval.results()).unwrap();

    let run = eval_on(&mst, &cluster, &eval, &options, &["--allow-exec", "tar"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stdout, run.stderr);
    let dir = eval.run_dir("e2e");
    let record = read_json(&dir.join("run.json"));
    let machines = record["machines"].as_array().unwrap();
    assert_eq!(machines.len(), 2, "{machines:?}");
    for machine in machines {
        assert!(
            machine["machine"]
                .as_str()
                .unwrap()
                .contains("shared filesystem"),
            "{machine}"
        );
    }
    let summary = read_json(&dir.join("summary.json"));
    assert_eq!(summary["variants"]["default"]["passed"], 4, "{summary}");
    assert!(cluster.live_jobs().is_empty(), "{:?}", cluster.live_jobs());
}
