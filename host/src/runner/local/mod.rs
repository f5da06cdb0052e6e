//! The `local` runner: one shard, on this host, in a private work directory, with the worker
//! as a subprocess. It goes through the same channel and protocol code as remote runners, so a
//! local trace and a remote one cannot differ.
//!
//! Options: `isolation=bwrap`, the default, runs the machine, and each program of each trial,
//! in bubblewrap sandboxes ([`crate::sandbox`], with `expose=PATH,…` and `network=none|host`,
//! or `allow:HOST,…` through the machine's egress proxy, [`crate::egress`]); `isolation=none`
//! runs it as the operator, seeing what the operator sees; `memory=SIZE`, `pids=N` and
//! `cpus=N` limit it through a control group ([`cgroup`]);
//! `worker=PATH` runs another program as the worker (default: this mst), which tests use to
//! stand in workers that misbehave.

pub mod cgroup;

use super::channel::{Channel, ChildProcess, KeptMachine, Process, Refused};
use super::{MachineRequest, Runner};
use crate::sandbox::{Bwrap, Network};
use anyhow::{bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::process::Command;

/// The options the `local` runner takes (besides `shards` and `keep`, every runner's).
const OPTIONS: &str = "`isolation`, `network`, `expose`, `memory`, `pids`, `cpus` and `worker`";

/// The built-in local runner.
pub struct LocalRunner {
    worker: PathBuf,
    /// The sandbox each machine runs in, with `isolation=bwrap`.
    sandbox: Option<Sandbox>,
    limits: cgroup::Limits,
}

impl LocalRunner {
    /// Validates the runner's own options.
    pub fn new(options: &BTreeMap<String, String>) -> Result<Self> {
        let mut worker = std::env::current_exe().context("cannot find the running mst binary")?;
        let mut limits = cgroup::Limits::default();
        let option = |key: &str| options.get(key).map(String::as_str);
        for (key, value) in options {
            match key.as_str() {
                "worker" => worker = PathBuf::from(value),
                "memory" => {
                    let bytes = super::docker::options::parse_bytes(value)
                        .filter(|b| *b >= 16 << 20)
                        .with_context(|| {
                            format!(
                                "--runner-option memory={value}: a size of at least 16m, in \
                                 Docker's syntax (512m, 2g)"
                            )
                        })?;
                    limits.memory = Some(bytes);
                }
                "cpus" => {
                    let cpus = super::docker::options::parse_cpus(value).with_context(|| {
                        format!(
                            "--runner-option cpus={value}: a number of CPUs, at least 0.01 (1.5)"
                        )
                    })?;
                    limits.cpus = Some(cpus);
                }
                "pids" => {
                    let pids = value.parse().ok().filter(|n| *n >= 16).with_context(|| {
                        format!("--runner-option pids={value}: a whole number of at least 16")
                    })?;
                    limits.pids = Some(pids);
                }
                "isolation" | "network" | "expose" => {}
                other => bail!("--runner-option {other}: the `local` runner takes {OPTIONS}"),
            }
        }
        let isolation = option("isolation").unwrap_or("bwrap");
        if limits.any() && isolation != "bwrap" {
            bail!(
                "--runner-option memory/pids/cpus need isolation=bwrap: unsandboxed, an agent runs as \
                 the user that owns the machine's control group and could lift its limits"
            );
        }
        let sandbox = match isolation {
            "bwrap" => Some(Sandbox::new(option("network"), option("expose"))?),
            // `expose` shows what an unsandboxed agent sees anyway, so a default of the
            // operator's (runners.json) stays harmless; a `network` would promise what
            // nothing unsandboxed holds.
            "none" if option("network").is_some() => bail!(
                "--runner-option network needs isolation=bwrap (the local runner's sandbox): \
                 unsandboxed, an agent has the host's network"
            ),
            "none" => None,
            other => bail!(
                "--runner-option isolation={other}: the `local` runner takes `bwrap` (a \
                 bubblewrap sandbox) or `none`"
            ),
        };
        Ok(Self {
            worker,
            sandbox,
            limits,
        })
    }
}

impl Runner for LocalRunner {
    fn name(&self) -> &str {
        "local"
    }

    fn max_shards(&self) -> u32 {
        1
    }

    fn create_machine(&self, _request: &MachineRequest<'_>) -> Result<Box<dyn Channel>> {
        let mut builder = tempfile::Builder::new();
        builder.prefix("mst-local-");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(std::fs::Permissions::from_mode(0o700));
        }
        let dir = builder
            .tempdir()
            .context("cannot create the local machine's directory")?;
        if self.sandbox.is_some() {
            std::fs::create_dir(dir.path().join(crate::sandbox::HOME_DIR))
                .context("cannot create the local machine's home directory")?;
        }
        let cgroup = match self.limits.any() {
            true => {
                let name = dir.path().file_name().expect("a named directory");
                Some(cgroup::Cgroup::create(
                    &name.to_string_lossy(),
                    &self.limits,
                )?)
            }
            false => None,
        };
        let egress = match self.sandbox.as_ref().and_then(|s| s.allowed.clone()) {
            Some(allowed) => Some(
                crate::egress::EgressProxy::start(&dir.path().join(EGRESS_SOCKET), allowed)
                    .context("cannot start the local machine's egress proxy")?,
            ),
            None => None,
        };
        Ok(Box::new(LocalMachine {
            dir: Some(dir),
            worker: self.worker.clone(),
            sandbox: self.sandbox.clone(),
            cgroup,
            egress,
        }))
    }
}

/// The sandbox of a machine, and of each program of its trials.
#[derive(Debug, Clone)]
struct Sandbox {
    bwrap: Bwrap,
    network: Network,
    /// With `network=allow:…`: the hosts its egress proxy lets through.
    allowed: Option<crate::egress::Allowed>,
}

impl Sandbox {
    /// The sandbox the options ask for: `network` (`none` or `host`) and `expose` (absolute
    /// paths, comma-separated, each of which must exist). Refused, saying what to install,
    /// when bubblewrap is not on the PATH.
    fn new(network: Option<&str>, expose: Option<&str>) -> Result<Self> {
        let (network, allowed) = match network.unwrap_or("none") {
            "none" => (Network::None, None),
            "host" => (Network::Host, None),
            other if other.starts_with("allow:") => {
                let allowed = crate::egress::Allowed::parse(&other["allow:".len()..])
                    .map_err(|e| anyhow::anyhow!("--runner-option network={other}: {e}"))?;
                (Network::None, Some(allowed))
            }
            other => bail!(
                "--runner-option network={other}: the `local` runner's sandbox takes `none` (its \
                 own loopback only, the default), `allow:HOST,…` (only those hosts, through a \
                 proxy) or `host`"
            ),
        };
        let mut exposed = Vec::new();
        for path in expose.into_iter().flat_map(|e| e.split(',')) {
            let path = Path::new(path.trim());
            if !path.is_absolute() {
                bail!(
                    "--runner-option expose={}: each path must be absolute",
                    path.display()
                );
            }
            let path = path.canonicalize().with_context(|| {
                format!("--runner-option expose={}: no such path", path.display())
            })?;
            exposed.push(path);
        }
        Ok(Sandbox {
            bwrap: Bwrap::find(exposed)?,
            network,
            allowed,
        })
    }
}

/// A private directory standing in for a machine.
pub struct LocalMachine {
    dir: Option<tempfile::TempDir>,
    worker: PathBuf,
    sandbox: Option<Sandbox>,
    /// The control group its processes share, when it has limits.
    cgroup: Option<cgroup::Cgroup>,
    /// With `network=allow:…`, the proxy that is its one way out, on [`EGRESS_SOCKET`].
    egress: Option<crate::egress::EgressProxy>,
}

/// The egress proxy's socket in a machine's directory (which its sandbox shows at the same
/// path).
const EGRESS_SOCKET: &str = "egress.sock";

impl LocalMachine {
    fn root(&self) -> &Path {
        self.dir.as_ref().expect("not disposed").path()
    }

    /// `relative` inside the machine, refusing absolute paths, `..`, and symlinked ancestors.
    fn inside(&self, relative: &str) -> Result<PathBuf> {
        if !crate::files::is_plain_relative(relative) {
            bail!("refusing machine path {relative:?}: only plain relative paths are allowed");
        }
        let mut path = self.root().to_path_buf();
        for part in Path::new(relative).components() {
            if let Component::Normal(name) = part {
                path.push(name);
            }
            if path
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
            {
                bail!(
                    "refusing machine path {relative:?}: {} is a symbolic link",
                    path.display()
                );
            }
        }
        Ok(path)
    }

    /// The file `src` on the machine, as [`Channel::get`] would copy it.
    fn read(&self, src: &str, cap: u64) -> Result<Vec<u8>> {
        // A plain relative path refused by `inside` has a link in it: the machine's doing.
        let path = self
            .inside(src)
            .map_err(|e| match crate::files::is_plain_relative(src) {
                true => Refused(format!("{e:#}")).into(),
                false => e,
            })?;
        crate::files::read_regular(&path, cap, true).map_err(|e| {
            // There but not a regular file within the cap: the machine's doing.
            match std::fs::symlink_metadata(&path) {
                Ok(_) => Refused(format!("{e:#}")).into(),
                Err(_) => e,
            }
        })
    }
}

fn copy_dir(src: &Path, dest: &Path) -> Result<()> {
    std::fs::create_dir_all(dest)?;
    for entry in std::fs::read_dir(src)? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let target = dest.join(entry.file_name());
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

impl Drop for LocalMachine {
    /// A machine dropped without `dispose` (an error on the way) leaves no control group.
    fn drop(&mut self) {
        if let Some(mut cgroup) = self.cgroup.take() {
            cgroup.remove();
        }
    }
}

impl Channel for LocalMachine {
    fn describe(&self) -> String {
        format!("local ({})", self.root().display())
    }

    fn provenance(&self) -> serde_json::Value {
        serde_json::json!({"dir": self.root()})
    }

    fn put(&mut self, src: &Path, dest: &str) -> Result<()> {
        let target = self.inside(dest)?;
        copy_dir(src, &target)
            .with_context(|| format!("cannot copy {} to the machine", src.display()))
    }

    fn exec(&mut self, argv: &[String]) -> Result<Process> {
        let root = self.root().to_string_lossy().into_owned();
        let argv: Vec<String> = argv.iter().map(|a| a.replace("{workdir}", &root)).collect();
        let (program, args) = match argv.split_first() {
            Some((first, rest)) if first == "mst" => (self.worker.clone(), rest),
            Some((first, rest)) => (PathBuf::from(first), rest),
            None => bail!("nothing to run"),
        };
        let mut command = match &self.sandbox {
            Some(sandbox) => {
                let (bwrap, argv) =
                    sandbox
                        .bwrap
                        .machine(self.root(), sandbox.network, &program, args);
                let mut command = Command::new(bwrap);
                command.args(argv);
                command
            }
            None => {
                let mut command = Command::new(&program);
                command.args(args);
                command
            }
        };
        // The worker starts clients and servers; none of them gets mst's own environment.
        command
            .current_dir(self.root())
            .env_clear()
            .envs(crate::process::minimal_env())
            .envs(std::env::var_os("MST_LOG").map(|filter| ("MST_LOG", filter)));
        // The worker sandboxes each trial's programs in turn, inside the machine's sandbox.
        if let Some(sandbox) = &self.sandbox {
            let mut request = sandbox.bwrap.trial_request();
            request.egress = self
                .egress
                .as_ref()
                .map(|_| self.root().join(EGRESS_SOCKET));
            let request = serde_json::to_string(&request).expect("paths serialize");
            command.env(crate::sandbox::TRIAL_SANDBOX_ENV, request);
        }
        if let Some(cgroup) = &self.cgroup {
            let procs = cgroup.procs();
            // SAFETY: `join` makes only async-signal-safe calls, as a child before exec must.
            unsafe {
                std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
                    cgroup::join(&procs)
                });
            }
        }
        ChildProcess::spawn(command, &format!("the worker {}", program.display()))
    }

    fn get(&mut self, src: &str, dest: &Path, cap: u64) -> Result<()> {
        let bytes = self.read(src, cap)?;
        crate::files::write_atomic(dest, &bytes)
    }

    fn read_many(&mut self, files: &[(String, PathBuf)], cap: u64) -> Vec<Result<Vec<u8>>> {
        files.iter().map(|(src, _)| self.read(src, cap)).collect()
    }

    fn dispose(&mut self, keep: bool) -> Result<Option<KeptMachine>> {
        self.egress = None;
        if let Some(mut cgroup) = self.cgroup.take() {
            for left in cgroup.remove() {
                tracing::warn!(
                    "a process outlived the local machine: its control group {} stays",
                    left.display()
                );
            }
        }
        let dir = self.dir.take().expect("disposed once");
        if keep {
            let kept = dir.keep();
            return Ok(Some(KeptMachine {
                at: format!("{} (remove it with: rm -rf {0})", kept.display()),
                enter: Some(format!("cd {}", kept.display())),
            }));
        }
        dir.close()
            .context("cannot remove the local machine's directory")?;
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_options_are_checked() {
        let err = Sandbox::new(Some("bridge"), None).unwrap_err().to_string();
        assert!(
            err.contains("network=bridge") && err.contains("`host`"),
            "{err}"
        );
        let err = Sandbox::new(None, Some("relative/dir"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("must be absolute"), "{err}");
        let err = format!(
            "{:#}",
            Sandbox::new(None, Some("/no/such/dir")).unwrap_err()
        );
        assert!(err.contains("no such path"), "{err}");
    }

    #[test]
    fn get_refuses_hostile_paths_and_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let mut machine = LocalMachine {
            dir: Some(dir),
            worker: PathBuf::from("mst"),
            sandbox: None,
            cgroup: None,
            egress: None,
        };
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("x");
        assert!(machine.get("../etc/passwd", &dest, 100).is_err());
        assert!(machine.get("/etc/passwd", &dest, 100).is_err());

        let staging = tempfile::tempdir().unwrap();
        std::fs::write(staging.path().join("ok.json"), "{}").unwrap();
        std::fs::write(staging.path().join("big.json"), "x".repeat(1000)).unwrap();
        machine.put(staging.path(), "results").unwrap();
        machine.get("results/ok.json", &dest, 100).unwrap();
        assert_eq!(std::fs::read(&dest).unwrap(), b"{}");
        assert!(
            machine.get("results/big.json", &dest, 100).is_err(),
            "size cap"
        );

        std::os::unix::fs::symlink("/etc", root.join("results/etc")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("results/host.json")).unwrap();
        assert!(
            machine.get("results/etc/hostname", &dest, 1 << 20).is_err(),
            "symlinked directory"
        );
        assert!(
            machine.get("results/host.json", &dest, 1 << 20).is_err(),
            "symlinked file"
        );
        assert_eq!(
            std::fs::read(&dest).unwrap(),
            b"{}",
            "nothing was overwritten"
        );
        assert!(machine.dispose(false).unwrap().is_none());
        assert!(!root.exists());
    }
}
