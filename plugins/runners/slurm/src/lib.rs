//! `mst/runner/slurm`: one Slurm job per shard, through the `salloc`, `srun`, `squeue` and
//! `scancel` the operator grants. `create-machine` allocates a one-node job that runs nothing
//! (`salloc --no-shell`), waits for it to start (saying why it waits, in Slurm's words), and
//! returns a command channel whose templates are steps inside that allocation
//! (`srun --jobid=… --overlap`): the host places its worker in the job, talks the shard protocol
//! over the step's stdin and stdout, and moves the bundle and traces as tar streams through
//! steps too, so no filesystem shared with the nodes is assumed (with `sharedFilesystem`, they
//! are a local `tar` into the shared `workdir` instead). `dispose-machine` removes the work
//! directory and cancels the job; the directory of a job Slurm already ended has no step to be
//! removed in, and the error names it.
//!
//! Options (see [`SCHEMA`]): `partition`, `account`, `qos`, `constraint`, `time` (Slurm's
//! syntax), `cpus`, `memory` (Slurm's `--mem`), `gpus`, `workdir` (the directory on the node
//! under which each shard gets its own, default `/tmp`), `readyTimeout` (seconds a started job
//! has to become usable, default 120), `queueCountsAsReady` (also count the time a job waits in
//! the queue against `readyTimeout`; default false: a job waits as long as the plugin call may,
//! `--plugin-timeout`), `sharedFilesystem` (`workdir` is shared between this host and the
//! nodes: put and get run a local `tar`, which must be granted too).
//!
//! `check-options` asks Slurm whether it would accept the job (`srun --test-only`), so a
//! partition, account or QoS that does not exist is refused before any machine or trial.

use mst_sdk::runner::{
    self, Capability, CommandChannel, ErrorCode, Level, Machine, MachineSpec, PluginError,
    PluginInfo, Runner, Shard,
};
use serde::{Deserialize, Serialize};
use std::time::{Duration, Instant};

/// The `slurm` runner.
pub struct Slurm;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    partition: Option<String>,
    account: Option<String>,
    qos: Option<String>,
    constraint: Option<String>,
    time: Option<TimeLimit>,
    cpus: Option<u32>,
    memory: Option<String>,
    gpus: Option<u32>,
    #[serde(default = "default_workdir")]
    workdir: String,
    #[serde(default = "default_ready_timeout")]
    ready_timeout: u32,
    #[serde(default)]
    queue_counts_as_ready: bool,
    /// `workdir` is on a filesystem this host and the nodes share: the bundle and traces move
    /// with a local `tar`, not through a step of the job.
    #[serde(default)]
    shared_filesystem: bool,
}

/// A time limit: minutes (`time=30` arrives as a number), or Slurm's own syntax
/// (`1-00:00`, `2:30:00`).
#[derive(Deserialize)]
#[serde(untagged)]
enum TimeLimit {
    Minutes(u64),
    Text(String),
}

impl std::fmt::Display for TimeLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TimeLimit::Minutes(minutes) => write!(f, "{minutes}"),
            TimeLimit::Text(text) => f.write_str(text),
        }
    }
}

fn default_workdir() -> String {
    "/tmp".into()
}
fn default_ready_timeout() -> u32 {
    120
}

/// Names Slurm accepts for partitions, accounts and QoS; never starting with `-`.
const NAME: &str = "^[A-Za-z0-9_][A-Za-z0-9_.-]*$";

/// The options schema: every value ends up as one `--name=value` argument, so none may hold
/// whitespace or start an option of its own.
const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "partition": {"type": "string", "pattern": "NAME"},
    "account": {"type": "string", "pattern": "NAME"},
    "qos": {"type": "string", "pattern": "NAME"},
    "constraint": {"type": "string", "pattern": "^[A-Za-z0-9_][A-Za-z0-9_.&|,:*\\[\\]()!-]*$"},
    "time": {"type": ["string", "integer"], "minimum": 1, "pattern": "^[0-9]+(-[0-9]+)?(:[0-9]+){0,2}$"},
    "cpus": {"type": "integer", "minimum": 1, "maximum": 100000},
    "memory": {"type": "string", "pattern": "^[0-9]+[KMGT]?$"},
    "gpus": {"type": "integer", "minimum": 0, "maximum": 1024},
    "workdir": {"type": "string", "pattern": "^(/[A-Za-z0-9._-]+)+$"},
    "readyTimeout": {"type": "integer", "minimum": 1, "maximum": 86400},
    "queueCountsAsReady": {"type": "boolean"},
    "sharedFilesystem": {"type": "boolean"}
  }
}"#;

/// How long `salloc` may take to be granted before the plugin stops waiting on it and watches
/// the queue instead (the host kills it; the job stays queued under its unique name).
const SUBMIT_MS: u32 = 5_000;
/// How often a queued job is looked at.
const POLL: Duration = Duration::from_secs(1);
/// Cap on one `squeue`, `scancel` or `srun` the plugin runs itself.
const CALL_MS: u32 = 30_000;

/// The put and get steps, word for word: `srun` runs them without a shell, so none is declared
/// (a declared `sh` would let a step read any command from stdin), and `tar`'s archive is its
/// stdin or stdout by default, so no `-` is either (`plugin check` warns about a `-`: for most
/// programs it means commands from stdin).
const PUT: &[&str] = &["tar", "-x", "-C", "{workdir}"];
const GET: &[&str] = &["tar", "-c", "-C", "{workdir}", "{src}"];
/// What `squeue` prints per job: id, state, reason, nodes.
const FORMAT: &str = "--format=%i|%T|%r|%N";

/// The resources as [`resources`] writes them, in template words: one node, one task, then
/// each option the operator gave, in this order. Names and sizes are pinned to the operator's
/// options (the plugin bills no other account); numbers it writes itself.
const RESOURCES: &[&str] = &[
    "--nodes=1",
    "--ntasks=1",
    "[--partition={option:partition}]",
    "[--account={option:account}]",
    "[--qos={option:qos}]",
    "[--constraint={option:constraint}]",
    "[--time=*]",
    "[--cpus-per-task=*]",
    "[--mem={option:memory}]",
    "[--gpus=*]",
];

/// What every step in a job starts with ([`Job::step`]).
const STEP: &[&str] = &[
    "--jobid=*",
    "--overlap",
    "--nodes=1",
    "--ntasks=1",
    "--quiet",
];

/// A shard's directory under the operator's `workdir`, which `mkdir` makes and `rm` removes.
const SHARD_DIR: &str = "{option:workdir=/tmp}/mst-*";

/// What the plugin declares: one template for each way it runs each program.
fn declared() -> Vec<Capability> {
    fn step<'a>(rest: &[&'a str]) -> Vec<&'a str> {
        [STEP, rest].concat()
    }
    let templates: [(&str, Vec<&str>); 11] = [
        ("salloc", [&SALLOC[..], RESOURCES].concat()),
        (
            "srun",
            [&["--test-only", "--quiet"][..], RESOURCES, &["--", "true"]].concat(),
        ),
        ("srun", step(&["--", "mkdir", "-m0700", SHARD_DIR])),
        ("srun", step(&["--", "rm", "-rf", SHARD_DIR])),
        ("srun", step(&[&["--"][..], PUT].concat())),
        ("srun", step(&[&["--"][..], GET].concat())),
        ("srun", step(&["--chdir={workdir}", "--", "{command}"])),
        ("squeue", vec!["--noheader", "--name=mst-*", FORMAT]),
        ("scancel", vec!["--quiet", "*"]),
        // Used only with `sharedFilesystem`, and only then must it be granted.
        ("tar", PUT[1..].to_vec()),
        ("tar", GET[1..].to_vec()),
    ];
    templates
        .into_iter()
        .map(|(program, words)| runner::exec_template(program, &words))
        .collect()
}

/// `salloc`'s words before the resources: the allocation's shape, its name and comment (the
/// run id, so operators find it in `squeue`).
const SALLOC: [&str; 3] = ["--no-shell", "--job-name=mst-*", "--comment=mst.run=*"];

/// One job and its work directory; also the machine id `dispose-machine` gets back.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Job {
    id: String,
    name: String,
    dir: String,
}

impl Job {
    /// `srun` arguments for a step of this job, then `rest`.
    fn step(&self, rest: &[&str]) -> Vec<String> {
        let mut argv = vec![format!("--jobid={}", self.id)];
        argv.extend(STEP[1..].iter().map(|w| w.to_string()));
        argv.extend(rest.iter().map(|w| w.to_string()));
        argv
    }

    /// A command-channel template: `srun` first.
    fn template(&self, rest: &[&str]) -> Vec<String> {
        let mut argv = vec!["srun".to_string()];
        argv.extend(self.step(rest));
        argv
    }

    /// Runs `rest` as a step of the job.
    fn run(&self, rest: &[&str]) -> Result<(), PluginError> {
        run("srun", &self.step(rest)).map(|_| ())
    }

    fn cancel(&self) -> Result<(), PluginError> {
        run("scancel", &["--quiet".into(), self.id.clone()]).map(|_| ())
    }
}

/// `words` as an argv.
fn words(words: &[&str]) -> Vec<String> {
    words.iter().map(|w| w.to_string()).collect()
}

/// Runs a granted program; an error naming it and its stderr when it fails.
fn run(program: &str, args: &[String]) -> Result<String, PluginError> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = runner::exec(program, &args, &[], CALL_MS)?;
    if out.status != 0 {
        return Err(unavailable(format!(
            "{program} exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn invalid(message: impl Into<String>) -> PluginError {
    runner::error(ErrorCode::InvalidOptions, message)
}

fn unavailable(message: impl Into<String>) -> PluginError {
    runner::error(ErrorCode::Unavailable, message)
}

/// The job's resources as `salloc`/`srun` arguments: one node, one task, then the options.
fn resources(options: &Options) -> Vec<String> {
    let mut args = vec!["--nodes=1".to_string(), "--ntasks=1".into()];
    let mut add = |flag: &str, value: Option<String>| {
        if let Some(value) = value {
            args.push(format!("--{flag}={value}"));
        }
    };
    add("partition", options.partition.clone());
    add("account", options.account.clone());
    add("qos", options.qos.clone());
    add("constraint", options.constraint.clone());
    add("time", options.time.as_ref().map(TimeLimit::to_string));
    add("cpus-per-task", options.cpus.map(|c| c.to_string()));
    add("mem", options.memory.clone());
    add(
        "gpus",
        options.gpus.filter(|g| *g > 0).map(|g| g.to_string()),
    );
    args
}

/// Run ids go into job names and directory names: keep what is plainly safe.
fn plain(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .take(80)
        .collect()
}

/// One job as `squeue` shows it.
#[derive(Debug, PartialEq)]
struct Queued {
    id: String,
    state: String,
    reason: String,
    nodes: String,
}

/// The job `squeue --format=%i|%T|%r|%N` printed, if any.
fn parse_queue(text: &str) -> Option<Queued> {
    let line = text.lines().map(str::trim).find(|l| !l.is_empty())?;
    let mut fields = line.split('|');
    let id = fields.next()?.trim().to_string();
    if id.is_empty() || !id.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(Queued {
        id,
        state: fields.next()?.trim().to_string(),
        reason: fields.next().unwrap_or_default().trim().to_string(),
        nodes: fields.next().unwrap_or_default().trim().to_string(),
    })
}

/// The job named `name`, if Slurm still lists it.
fn lookup(name: &str) -> Result<Option<Queued>, PluginError> {
    let out = run(
        "squeue",
        &["--noheader".into(), format!("--name={name}"), FORMAT.into()],
    )?;
    Ok(parse_queue(&out))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

/// Waits for the job named `name` to run. `submitted` is what `salloc` left (when no job has
/// that name, its error is the one to report); `since` is when it was started, so the queue
/// time `salloc` itself waited counts too.
fn wait_running(
    name: &str,
    submitted: Result<(), PluginError>,
    since: Instant,
    options: &Options,
) -> Result<Queued, PluginError> {
    let mut last_reason = String::new();
    // When the job left the queue (configuring: nodes booting, prologs), if it has.
    let mut dequeued: Option<Instant> = None;
    let limit = Duration::from_secs(options.ready_timeout.into());
    loop {
        let Some(job) = lookup(name)? else {
            return Err(match submitted {
                Err(e) => runner::error(e.code, format!("Slurm refused the job: {}", e.message)),
                Ok(()) => unavailable(format!("job {name} left the queue before it started")),
            });
        };
        match job.state.as_str() {
            "RUNNING" => return Ok(job),
            "PENDING" | "REQUEUED" | "RESIZING" | "SUSPENDED" => {
                if job.reason != last_reason {
                    // Shown by default (warnings are): an operator sees why shards do not start.
                    runner::log(
                        Level::Warn,
                        &format!(
                            "job {} ({name}) is waiting in the queue: {}",
                            job.id, job.reason
                        ),
                    );
                    last_reason = job.reason.clone();
                }
            }
            "CONFIGURING" => {
                dequeued.get_or_insert_with(Instant::now);
            }
            state => {
                return Err(unavailable(format!(
                    "job {} ({name}) ended {state} ({}) before it started",
                    job.id, job.reason
                )))
            }
        }
        let counted = match (options.queue_counts_as_ready, dequeued) {
            (true, _) => since.elapsed(),
            (false, Some(at)) => at.elapsed(),
            (false, None) => Duration::ZERO,
        };
        if counted > limit {
            let job_ref = Job {
                id: job.id.clone(),
                name: name.into(),
                dir: String::new(),
            };
            let _ = job_ref.cancel();
            return Err(unavailable(format!(
                "job {} ({name}) was not running after readyTimeout ({} s): {} ({}); cancelled",
                job.id, options.ready_timeout, job.state, job.reason
            )));
        }
        std::thread::sleep(POLL);
    }
}

impl Runner for Slurm {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "mst/runner/slurm".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Shards in Slurm jobs: salloc, then srun steps inside the allocation"
                .into(),
            capabilities: declared(),
            options_schema: Some(SCHEMA.replace("NAME", NAME)),
        }
    }

    fn check_options(options: &str) -> Result<(), PluginError> {
        let options: Options = runner::options(options)?;
        // Slurm's own verdict on the resources, with no job made: a partition, account or QoS
        // that does not exist, or more CPUs than any node has, is refused here, named.
        let mut args = vec!["--test-only".to_string(), "--quiet".into()];
        args.extend(resources(&options));
        args.extend(["--".into(), "true".into()]);
        run("srun", &args)
            .map_err(|e| invalid(format!("Slurm would refuse the job: {}", e.message)))?;
        Ok(())
    }

    fn create_machine(shard: Shard, options: &str) -> Result<Machine, PluginError> {
        let options: Options = runner::options(options)?;
        let run_id = plain(&shard.run_id);
        // A fresh name each time: the plugin finds its job by name when salloc is still
        // waiting, and a resumed shard never adopts (then cancels) a kept job.
        let name = format!("mst-{run_id}-{}-{:06x}", shard.index, now_ms() & 0xff_ffff);
        let mut args = vec![
            "--no-shell".to_string(),
            format!("--job-name={name}"),
            format!("--comment=mst.run={run_id},mst.shard={}", shard.index),
        ];
        args.extend(resources(&options));
        // Granted quickly, salloc returns; still queued, it is stopped at SUBMIT_MS (killed:
        // the job stays queued) and the queue is watched instead, so the wait can be shown.
        let arg_refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let since = Instant::now();
        let submitted = match runner::exec("salloc", &arg_refs, &[], SUBMIT_MS) {
            Ok(out) if out.status == 0 => Ok(()),
            Ok(out) => Err(unavailable(format!(
                "salloc exited with {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ))),
            Err(e) => Err(e),
        };
        let queued = wait_running(&name, submitted, since, &options)?;
        let job = Job {
            dir: format!(
                "{}/mst-{run_id}-{}-{}",
                options.workdir.trim_end_matches('/'),
                shard.index,
                queued.id
            ),
            id: queued.id,
            name,
        };
        // A private directory nobody could have prepared: `mkdir` fails if it exists.
        if let Err(e) = job.run(&["--", "mkdir", "-m0700", &job.dir]) {
            let _ = job.cancel();
            return Err(e);
        }
        // On a shared filesystem the files are written and read where they are, by this host;
        // otherwise they travel through a step of the job.
        let (put, get, moved) = match options.shared_filesystem {
            true => (words(PUT), words(GET), "shared filesystem"),
            false => (
                job.template(&[&["--"], PUT].concat()),
                job.template(&[&["--"], GET].concat()),
                "files through srun",
            ),
        };
        Ok(Machine {
            id: serde_json::to_string(&job).expect("serializable"),
            description: format!(
                "job {} {} on {} (slurm, {moved})",
                job.id, job.name, queued.nodes
            ),
            spec: MachineSpec::Command(CommandChannel {
                exec: job.template(&["--chdir={workdir}", "--", "{command}"]),
                put,
                get,
                workdir: job.dir.clone(),
            }),
        })
    }

    fn dispose_machine(id: &str, keep: bool) -> Result<(), PluginError> {
        let job: Job = serde_json::from_str(id)
            .map_err(|e| invalid(format!("not a machine of this plugin: {e}")))?;
        if keep {
            return Ok(());
        }
        // The node's copy of the work directory goes first (no shared filesystem is assumed).
        // A job Slurm already ended (cancelled, timed out, its node lost) has no step to run
        // it in: the job is still cancelled, and the error says which directory stays where,
        // for the operator (run.json keeps it as the machine's `disposeError`).
        let removed = job.run(&["--", "rm", "-rf", &job.dir]);
        let cancelled = job.cancel();
        removed.map_err(|e| {
            unavailable(format!(
                "the work directory {} of job {} stays on its node: {}",
                job.dir, job.id, e.message
            ))
        })?;
        cancelled
    }
}

mst_sdk::export_runner!(Slurm);

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether the plugin's declarations of `program`, pinned to `options`, admit `argv`.
    fn admitted(options: &[(&str, &str)], program: &str, argv: &[String]) -> bool {
        runner::exec_admitted(&declared(), options, program, argv)
    }

    #[test]
    fn every_command_is_a_declared_template_and_no_other_is() {
        let given = [
            ("partition", "gpu"),
            ("account", "lab"),
            ("qos", "high"),
            ("constraint", "a100&ib"),
            ("time", "1-00:00"),
            ("cpus", "4"),
            ("memory", "16G"),
            ("gpus", "1"),
            ("workdir", "/scratch"),
        ];
        let options: Options = serde_json::from_str(
            r#"{"partition":"gpu","account":"lab","qos":"high","constraint":"a100&ib","time":"1-00:00","cpus":4,"memory":"16G","gpus":1,"workdir":"/scratch"}"#,
        )
        .unwrap();
        let resources = resources(&options);
        assert!(resources.contains(&"--gpus=1".to_string()), "{resources:?}");
        let mut salloc = words(&[
            "--no-shell",
            "--job-name=mst-r-0-abc",
            "--comment=mst.run=r,mst.shard=0",
        ]);
        salloc.extend(resources.iter().cloned());
        assert!(admitted(&given, "salloc", &salloc), "{salloc:?}");
        let mut test_only = words(&["--test-only", "--quiet"]);
        test_only.extend(resources.iter().cloned());
        test_only.extend(words(&["--", "true"]));
        assert!(admitted(&given, "srun", &test_only), "{test_only:?}");
        // Another account than the operator's is refused.
        let billed = salloc
            .iter()
            .map(|w| w.replace("--account=lab", "--account=other"))
            .collect::<Vec<_>>();
        assert!(!admitted(&given, "salloc", &billed));
        let job = Job {
            id: "42".into(),
            name: "mst-r-0-abc".into(),
            dir: "/scratch/mst-r-0-42".into(),
        };
        for template in [
            job.template(&["--chdir={workdir}", "--", "{command}"]),
            job.template(&[&["--"], PUT].concat()),
            job.template(&[&["--"], GET].concat()),
            job.template(&["--", "mkdir", "-m0700", &job.dir]),
            job.template(&["--", "rm", "-rf", &job.dir]),
        ] {
            assert_eq!(template[0], "srun");
            assert!(admitted(&given, "srun", &template[1..]), "{template:?}");
        }
        // The review's escapes (H2): a parent of the directory, a file read out, any directory
        // removed, a step's words mixed with another's.
        for escape in [
            &["--", "tar", "-x", "-C", "/scratch/mst-r-0-42/.."][..],
            &["--", "tar", "-c", "-C", "/", "etc/shadow"],
            &["--", "rm", "-rf", "/scratch/mst-r-0-42/../.."],
            &["--", "rm", "-rf", "/home/u/mst-x"],
            &["--", "rm", "-rf", "/scratch/mst-a", "/scratch/mst-b"],
            &["--", "mkdir", "-rf", "/scratch/mst-a"],
            &["--chdir=/", "--", "{command}"],
        ] {
            assert!(!admitted(&given, "srun", &job.step(escape)), "{escape:?}");
        }
        // With a shared filesystem, the local `tar` of the put and get steps, and no other.
        for template in [words(PUT), words(GET)] {
            assert_eq!(template[0], "tar");
            assert!(admitted(&given, "tar", &template[1..]), "{template:?}");
        }
        assert!(!admitted(&given, "tar", &words(&["-x", "-C", "/home/u"])));
        assert!(
            !admitted(&given, "tar", &words(&["-x"])),
            "a bare `tar -x` into mst's directory"
        );
        assert!(admitted(&given, "scancel", &words(&["--quiet", "42"])));
        let id = serde_json::to_string(&job).unwrap();
        assert_eq!(serde_json::from_str::<Job>(&id).unwrap(), job);
    }

    #[test]
    fn queue_lines_parse() {
        assert_eq!(
            parse_queue("  17|PENDING|Resources|\n"),
            Some(Queued {
                id: "17".into(),
                state: "PENDING".into(),
                reason: "Resources".into(),
                nodes: String::new(),
            })
        );
        assert_eq!(parse_queue("").map(|q| q.id), None);
        assert_eq!(parse_queue("squeue: error\n").map(|q| q.id), None);
        assert_eq!(
            parse_queue("9|RUNNING|None|node1").map(|q| q.nodes),
            Some("node1".into())
        );
    }

    #[test]
    fn options_are_strict() {
        assert!(runner_options(r#"{"partition":"debug","cpus":2}"#).is_ok());
        assert!(runner_options(r#"{"partitions":"debug"}"#).is_err());
        assert!(runner_options(r#"{"cpus":"two"}"#).is_err());
    }

    fn runner_options(text: &str) -> Result<Options, serde_json::Error> {
        serde_json::from_str(text)
    }
}
