//! Command-channel machines: a runner plugin describes how to reach a machine as three argv
//! templates (run a command with stdin and stdout attached, unpack a tar stream, write a tar
//! stream), and the host runs them, but only with programs the plugin declared and the operator
//! granted, with arguments matching the declared patterns. This is how `ssh` hosts and
//! Kubernetes pods become shard machines without the plugin ever touching a byte of the
//! protocol: the host owns the worker, its tokens, copy-back and every check on what comes back.
//!
//! Placeholders the host fills: `{workdir}` (the machine's work directory, a plain absolute
//! path), `{src}` and `{dest}` (paths relative to it) and `{command}` (a word of its own that
//! becomes the worker's argv, several words).

use super::archive;
use super::channel::{Channel, ChildProcess, KeptMachine, Process, Refused};
use crate::plugin::bindings::CommandChannel;
use crate::plugin::capabilities::Effective;
use crate::plugin::programs;
use anyhow::{bail, Context, Result};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Cap on a put (the bundle, or the placed worker) and on asking the machine for its mst.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(600);
/// Cap on reading one batch of files back.
const GET_TIMEOUT: Duration = Duration::from_secs(300);
/// Where the host places its worker on a machine without a matching mst.
const PLACED_WORKER: &str = ".mst/mst";

/// One template, checked: the program and the arguments as the plugin wrote them.
#[derive(Debug, Clone)]
struct Template {
    /// Which template (`exec`, `put`, `get`), for errors.
    role: &'static str,
    program: String,
    args: Vec<String>,
}

impl Template {
    /// Checks `argv` against the plugin's effective grants. Patterns apply to the template as
    /// written (placeholders included): what the host substitutes is its own or validated.
    fn new(role: &'static str, argv: &[String], grants: &Effective) -> Result<Self> {
        let Some((program, args)) = argv.split_first() else {
            bail!("its `{role}` template is empty");
        };
        if program.contains('{') {
            bail!("its `{role}` template's program {program:?} contains a placeholder");
        }
        grants
            .allows_exec(program, args)
            .map_err(|why| anyhow::anyhow!("its `{role}` template: {why}"))?;
        Ok(Template {
            role,
            program: program.clone(),
            args: args.to_vec(),
        })
    }

    /// The arguments with placeholders filled.
    fn expand(&self, workdir: &str, path: &str, command: &[String]) -> Vec<String> {
        let mut out = Vec::with_capacity(self.args.len() + command.len());
        for arg in &self.args {
            if arg == "{command}" {
                out.extend(command.iter().cloned());
            } else {
                out.push(
                    arg.replace("{workdir}", workdir)
                        .replace("{src}", path)
                        .replace("{dest}", path),
                );
            }
        }
        out
    }

    /// Runs to completion with `stdin`; fails unless it exits 0, quoting its stderr.
    fn run(&self, args: &[String], stdin: Vec<u8>, timeout: Duration) -> Result<Vec<u8>> {
        let output = programs::run(&self.program, args, stdin, timeout)
            .map_err(|e| anyhow::anyhow!("`{}` ({} template): {e}", self.program, self.role))?;
        if output.status != 0 {
            bail!(
                "`{}` ({} template) exited with {}: {}",
                self.program,
                self.role,
                output.status,
                tail(&output.stderr)
            );
        }
        Ok(output.stdout)
    }
}

/// The last line or so of a program's stderr, safe to print.
fn tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(stderr);
    let text = text.trim();
    let start = text.len().saturating_sub(400);
    let start = (start..=text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    crate::plugin::imports::sanitize(&text[start..], 400)
}

/// A plain absolute path: it lands inside shell command lines on the machine, so only
/// characters no shell treats specially are allowed.
fn check_workdir(workdir: &str) -> Result<()> {
    let plain = workdir.starts_with('/')
        && workdir.trim_end_matches('/').len() > 1
        && workdir.len() <= 200
        && workdir
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
        && !workdir.split('/').any(|part| part == "..");
    if !plain {
        bail!(
            "its work directory {workdir:?} is not a plain absolute path (letters, digits, \
             `/`, `.`, `_`, `-`; no `..`)"
        );
    }
    Ok(())
}

/// A machine reached through a runner plugin's command templates.
pub struct CommandMachine {
    exec: Template,
    put: Template,
    get: Template,
    workdir: String,
    /// How the worker is started on the machine: `mst` from its `PATH`, or the placed binary.
    worker: String,
    worker_placed: bool,
    started: Instant,
    /// Where the templates' programs run: private and empty, never mst's own directory.
    cwd: tempfile::TempDir,
}

impl CommandMachine {
    /// Checks the templates against the plugin's grants, then makes sure the machine can run
    /// the worker: its own `mst` if it is this version, else the static worker placed into the
    /// work directory (found like the Docker runner's, `worker` overriding).
    pub fn new(
        channel: &CommandChannel,
        grants: &Effective,
        worker: Option<&Path>,
        started: Instant,
    ) -> Result<Self> {
        let mut machine = Self::checked(channel, grants, started)?;
        if !machine.has_matching_mst() {
            let binary = super::worker_binary::find(worker)?;
            let bytes = std::fs::read(&binary)
                .with_context(|| format!("cannot read the worker {}", binary.display()))?;
            let tar = archive::tar_file(PLACED_WORKER, &bytes, 0o755)?;
            machine
                .put_tar(tar, PLACED_WORKER)
                .context("cannot place the worker on the machine")?;
            machine.worker = format!("{}/{PLACED_WORKER}", machine.workdir);
            machine.worker_placed = true;
        }
        Ok(machine)
    }

    /// The machine with its templates checked, before anything runs. `started` is when the
    /// runner began making it (before the plugin's `create-machine`), for `run.json`'s times.
    fn checked(channel: &CommandChannel, grants: &Effective, started: Instant) -> Result<Self> {
        check_workdir(&channel.workdir)?;
        Ok(CommandMachine {
            exec: Template::new("exec", &channel.exec, grants)?,
            put: Template::new("put", &channel.put, grants)?,
            get: Template::new("get", &channel.get, grants)?,
            workdir: channel.workdir.trim_end_matches('/').to_string(),
            worker: "mst".into(),
            worker_placed: false,
            started,
            cwd: programs::private_dir().map_err(anyhow::Error::msg)?,
        })
    }

    /// Whether `mst --version` on the machine names this version.
    fn has_matching_mst(&self) -> bool {
        let command = ["mst".to_string(), "--version".to_string()];
        let args = self.exec.expand(&self.workdir, "", &command);
        let expected = format!("mst {}", env!("CARGO_PKG_VERSION"));
        matches!(
            self.exec.run(&args, Vec::new(), CONTROL_TIMEOUT),
            Ok(out) if String::from_utf8_lossy(&out).trim() == expected
        )
    }

    /// Reads `files`, all below the top-level directory `src`, from one `get` stream.
    fn get_from(&self, src: &str, files: &[(String, PathBuf)], cap: u64) -> Vec<Result<()>> {
        let args = self.get.expand(&self.workdir, src, &[]);
        let spawned = ChildProcess::spawn(
            programs::command(&self.get.program, &args, self.cwd.path()),
            &format!("`{}` (get template)", self.get.program),
        );
        let process = match spawned {
            Ok(process) => process,
            Err(e) => {
                let why = format!("{e:#}");
                return files
                    .iter()
                    .map(|_| Err(anyhow::anyhow!("{why}")))
                    .collect();
            }
        };
        drop(process.stdin);
        let stderr = crate::process::CappedReader::spawn(process.stderr, 64 << 10);
        // A get that never ends is stopped: the watchdog kills the group, which ends the stream.
        let handle = std::sync::Arc::new(std::sync::Mutex::new(process.handle));
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let watchdog = {
            let handle = handle.clone();
            std::thread::spawn(move || {
                if done_rx.recv_timeout(GET_TIMEOUT).is_err() {
                    handle.lock().expect("get process").kill();
                }
            })
        };
        let limit = archive::batch_limit(files.len(), cap);
        let stream = std::io::Read::take(process.stdout, limit);
        let machine = self.describe();
        let mut results = archive::copy_wanted(stream, files, cap, &machine);
        let _ = done_tx.send(());
        let _ = watchdog.join();
        let mut handle = handle.lock().expect("get process");
        // The rest of the stream is not wanted: stop the program rather than drain it.
        handle.kill();
        let status = handle.wait();
        let stderr = stderr.finish();
        if results.iter().any(Result::is_err) && status.is_some_and(|s| s != 0) {
            let why = format!(
                "`{}` (get template) exited with {}: {}",
                self.get.program,
                status.unwrap_or(-1),
                tail(&stderr)
            );
            // A refusal stands: what arrived was the machine's doing, whatever the program says.
            let failed = |r: &&mut Result<()>| r.as_ref().is_err_and(|e| !Refused::is(e));
            for result in results.iter_mut().filter(failed) {
                *result = Err(anyhow::anyhow!("{why}"));
            }
        }
        results
    }

    fn put_tar(&self, tar: Vec<u8>, dest: &str) -> Result<()> {
        let args = self.put.expand(&self.workdir, dest, &[]);
        self.put.run(&args, tar, CONTROL_TIMEOUT).map(|_| ())
    }
}

impl Channel for CommandMachine {
    fn describe(&self) -> String {
        format!("{} {}", self.exec.program, self.workdir)
    }

    fn put(&mut self, src: &Path, dest: &str) -> Result<()> {
        if !crate::files::is_plain_relative(dest) {
            bail!("refusing machine path {dest:?}");
        }
        let tar = archive::tar_directory(src, dest)?;
        self.put_tar(tar, dest)
            .with_context(|| format!("cannot copy {} to the machine", src.display()))
    }

    fn exec(&mut self, argv: &[String]) -> Result<Process> {
        let command: Vec<String> = argv
            .iter()
            .enumerate()
            .map(|(i, a)| match (i, a.as_str()) {
                (0, "mst") => self.worker.clone(),
                _ => a.replace("{workdir}", &self.workdir),
            })
            .collect();
        let args = self.exec.expand(&self.workdir, "", &command);
        ChildProcess::spawn(
            programs::command(&self.exec.program, &args, self.cwd.path()),
            &format!("`{}` (exec template)", self.exec.program),
        )
    }

    fn get(&mut self, src: &str, dest: &Path, cap: u64) -> Result<()> {
        self.get_many(&[(src.to_string(), dest.to_path_buf())], cap)
            .pop()
            .expect("one result per file")
    }

    fn get_many(&mut self, files: &[(String, PathBuf)], cap: u64) -> Vec<Result<()>> {
        // One stream per top-level directory the files are in (a batch of traces is all in
        // `results/`, a trial's artefacts in `artifacts/`); only the wanted files are kept.
        let mut results: Vec<Option<Result<()>>> = files.iter().map(|_| None).collect();
        let mut groups: std::collections::BTreeMap<&str, Vec<usize>> = Default::default();
        for (index, (src, _)) in files.iter().enumerate() {
            let top = src.split('/').next().unwrap_or_default();
            groups.entry(top).or_default().push(index);
        }
        for (top, indexes) in groups {
            let group: Vec<(String, PathBuf)> = indexes.iter().map(|&i| files[i].clone()).collect();
            // The deepest directory they share: a trial's artefacts never stream the others'.
            let sources: Vec<&str> = group.iter().map(|(src, _)| src.as_str()).collect();
            let common = archive::common_dir(&sources);
            let fetched = if common.is_empty() {
                top
            } else {
                common.as_str()
            };
            let copied = if crate::files::is_plain_relative(fetched) {
                self.get_from(fetched, &group, cap)
            } else {
                group
                    .iter()
                    .map(|(src, _)| Err(anyhow::anyhow!("refusing machine path {src:?}")))
                    .collect()
            };
            for (index, result) in indexes.into_iter().zip(copied) {
                results[index] = Some(result);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every file is in a group"))
            .collect()
    }

    fn batch_copies(&self) -> bool {
        // Every copy starts a program (an ssh connection, a kubectl exec): batch them.
        true
    }

    fn dispose(&mut self, keep: bool) -> Result<Option<KeptMachine>> {
        // The plugin's dispose-machine releases the machine (and its work directory); the host
        // has nothing of its own there beyond what the plugin removes.
        Ok(keep.then(|| {
            // The exec template with an interactive shell for its command: how the worker
            // was reached, so how a person gets in too.
            let shell = ["sh".to_string(), "-i".to_string()];
            let words = self.exec.expand(&self.workdir, "", &shell);
            KeptMachine {
                at: format!("{} ({})", self.workdir, self.exec.program),
                enter: Some(crate::runner::shell_words(&self.exec.program, &words)),
            }
        }))
    }

    fn started_at(&self) -> Option<Instant> {
        Some(self.started)
    }

    fn provenance(&self) -> serde_json::Value {
        serde_json::json!({
            "channel": "command",
            "program": self.exec.program,
            "workdir": self.workdir,
            "workerPlaced": self.worker_placed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::capabilities::{Capability, Grants};

    fn sh_grants(patterns: &[&str]) -> Effective {
        let declared = [Capability::Exec {
            program: "sh".into(),
            args: patterns.iter().map(|s| s.to_string()).collect(),
        }];
        let grants = Grants {
            exec: ["sh".to_string()].into(),
            ..Grants::default()
        };
        Effective::intersect(&declared, &grants)
    }

    /// A command channel onto a local directory through `sh`: what the `ssh` plugin does
    /// minus the network.
    fn local_channel(workdir: &str) -> CommandChannel {
        let words = |w: &[&str]| w.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        CommandChannel {
            exec: words(&["sh", "-c", "cd {workdir} && exec \"$@\"", "sh", "{command}"]),
            put: words(&["sh", "-c", "mkdir -p {workdir} && tar -x -C {workdir}"]),
            get: words(&["sh", "-c", "tar -c -C {workdir} {src}"]),
            workdir: workdir.into(),
        }
    }

    #[test]
    fn templates_need_granted_programs_and_matching_arguments() {
        let channel = local_channel("/tmp/x");
        let err = CommandMachine::new(&channel, &Effective::none(), None, Instant::now())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("`exec` template") && err.contains("--allow-exec sh"),
            "{err}"
        );
        let narrow = sh_grants(&[
            "{argv}",
            "-c",
            "cd {workdir} && exec \"$@\"",
            "sh",
            "{command}",
        ]);
        let err = CommandMachine::new(&channel, &narrow, None, Instant::now())
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("`put` template") && err.contains("mkdir -p"),
            "{err}"
        );
    }

    #[test]
    fn work_directories_must_be_plain() {
        for bad in [
            "tmp/x",
            "/tmp/$(reboot)",
            "/tmp/a b",
            "/tmp/../etc",
            "",
            "/",
            "//",
        ] {
            assert!(check_workdir(bad).is_err(), "{bad:?}");
        }
        check_workdir("/tmp/mst-run_1.2-0").unwrap();
    }

    #[test]
    fn placeholders_fill_in_and_command_splices_words() {
        let template = Template {
            role: "exec",
            program: "ssh".into(),
            args: ["--", "h", "tar -C {workdir} -cf - {src}", "{command}"]
                .map(String::from)
                .to_vec(),
        };
        assert_eq!(
            template.expand("/w", "results", &["mst".into(), "worker".into()]),
            ["--", "h", "tar -C /w -cf - results", "mst", "worker"]
        );
    }

    #[test]
    fn put_exec_and_get_through_sh_with_hostile_files_refused() {
        let root = tempfile::tempdir().unwrap();
        let workdir = root.path().join("machine");
        let workdir = workdir.to_str().unwrap();
        let channel = local_channel(workdir);
        let mut machine =
            CommandMachine::checked(&channel, &sh_grants(&[]), Instant::now()).unwrap();

        let staging = tempfile::tempdir().unwrap();
        std::fs::write(staging.path().join("ok.json"), "{}").unwrap();
        std::fs::write(staging.path().join("big.json"), "x".repeat(1000)).unwrap();
        machine.put(staging.path(), "results").unwrap();
        std::os::unix::fs::symlink("/etc/hostname", format!("{workdir}/results/link.json"))
            .unwrap();

        let mut process = machine
            .exec(&["sh".into(), "-c".into(), "echo hi from $PWD".into()])
            .unwrap();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut process.stdout, &mut out).unwrap();
        assert_eq!(out.trim(), format!("hi from {workdir}"));

        let out = tempfile::tempdir().unwrap();
        let files: Vec<(String, PathBuf)> = ["ok.json", "big.json", "link.json", "gone.json"]
            .iter()
            .map(|f| (format!("results/{f}"), out.path().join(f)))
            .collect();
        let results = machine.get_many(&files, 100);
        assert!(results[0].is_ok(), "{:?}", results[0]);
        assert_eq!(std::fs::read(out.path().join("ok.json")).unwrap(), b"{}");
        let errors: Vec<String> = results[1..]
            .iter()
            .map(|r| format!("{:#}", r.as_ref().unwrap_err()))
            .collect();
        assert!(errors[0].contains("cap"), "{}", errors[0]);
        assert!(errors[1].contains("link"), "{}", errors[1]);
        assert!(errors[2].contains("no such file"), "{}", errors[2]);
        assert!(!out.path().join("link.json").exists());
    }
}
