//! `mst/runner/kubernetes`: one pod per shard, through the `kubectl` the operator grants. The
//! plugin applies a pod that only sleeps, waits for it to be ready, and returns a command
//! channel of `kubectl exec -i` templates; the host places its worker in the pod, talks the
//! shard protocol over the exec channel and moves files as tar streams (what `kubectl cp`
//! does underneath). Disposal deletes the pod.
//!
//! Options: `image` (required), `namespace` (default `default`), `context` (a kubeconfig
//! context), `cpu` (`500m`, `2`), `memory` (`512Mi`, `2Gi`), `nodeSelector`
//! (`key=value,key=value`), `readyTimeout` (seconds, default 120; a plugin call is also bounded
//! by the host's `--plugin-timeout`, so raise both), `workdir` (default `/tmp/mst`),
//! `maxSeconds` (the pod's `activeDeadlineSeconds`, default a day: a pod never disposed of
//! still ends).
//!
//! The pod gets no service-account token, no privilege escalation and no capabilities, and the
//! host refuses any manifest with a field this plugin does not write (an allow-list: no
//! environment, ports, service account or volume but `emptyDir`). The
//! cluster enforces the rest; run shards in a namespace with the `restricted` Pod
//! Security level to make that binding.

use mst_sdk::runner::{
    self, Capability, CommandChannel, ErrorCode, Machine, MachineSpec, PluginError, PluginInfo,
    Runner, RunnerInfo, Shard,
};
use serde::{Deserialize, Serialize};
use serde_json::json;

/// The `kubernetes` runner.
pub struct Kubernetes;

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    image: String,
    #[serde(default = "default_namespace")]
    namespace: String,
    context: Option<String>,
    cpu: Option<String>,
    memory: Option<String>,
    node_selector: Option<String>,
    #[serde(default = "default_ready_timeout")]
    ready_timeout: u32,
    #[serde(default = "default_workdir")]
    workdir: String,
    #[serde(default = "default_max_seconds")]
    max_seconds: u64,
}

fn default_namespace() -> String {
    "default".into()
}
fn default_ready_timeout() -> u32 {
    120
}
fn default_workdir() -> String {
    "/tmp/mst".into()
}
fn default_max_seconds() -> u64 {
    86_400
}

const SCHEMA: &str = r#"{
  "type": "object",
  "additionalProperties": false,
  "required": ["image"],
  "properties": {
    "image": {"type": "string", "minLength": 1},
    "namespace": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"},
    "context": {"type": "string", "pattern": "^[A-Za-z0-9._@:/-]+$"},
    "cpu": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?m?$"},
    "memory": {"type": "string", "pattern": "^[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?$"},
    "nodeSelector": {"type": "string"},
    "readyTimeout": {"type": "integer", "minimum": 1, "maximum": 3600},
    "workdir": {"type": "string", "pattern": "^/[A-Za-z0-9/._-]*$"},
    "maxSeconds": {"type": "integer", "minimum": 60}
  }
}"#;

/// The remote command lines of the put and get templates, declared word for word.
const PUT: &str = "mkdir -p {workdir} && tar -xf - -C {workdir}";
const GET: &str = "tar -cf - -C {workdir} {src}";

/// `kubectl`'s first words, as [`Pod::argv`] writes them: filled by the host with the
/// operator's options, so the plugin runs in no other namespace or cluster than theirs.
const KUBECTL_TARGET: &[&str] = &[
    "--namespace={option:namespace=default}",
    "[--context={option:context}]",
];

/// What follows them, one template each: apply the manifest (read from stdin, which the host
/// checks is a hardened pod before kubectl sees it), wait for the pod, the worker's command and
/// the put and get steps in it, delete it. No `*` on its own: a granted kubectl cannot be
/// turned to `config view`, `proxy` or `--kubeconfig=…`.
const KUBECTL_VERBS: &[&[&str]] = &[
    &["apply", "--filename=-"],
    &["wait", "--for=condition=Ready", "pod/mst-*", "--timeout=*"],
    &["exec", "-i", "mst-*", "--", "{command}"],
    &["exec", "-i", "mst-*", "--", "sh", "-c", PUT],
    &["exec", "-i", "mst-*", "--", "sh", "-c", GET],
    &[
        "delete",
        "pod",
        "mst-*",
        "--wait=false",
        "--ignore-not-found",
    ],
];

/// What the plugin declares: one `kubectl` template per verb.
fn declared() -> Vec<Capability> {
    KUBECTL_VERBS
        .iter()
        .map(|verb| runner::exec_template("kubectl", &[KUBECTL_TARGET, verb].concat()))
        .collect()
}

/// One pod and how to reach it; also the machine id `dispose-machine` gets back.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq)]
struct Pod {
    name: String,
    namespace: String,
    context: Option<String>,
}

impl Pod {
    /// `kubectl` with the namespace and context, then `rest`.
    fn argv(&self, rest: &[&str]) -> Vec<String> {
        let mut argv = vec![format!("--namespace={}", self.namespace)];
        if let Some(context) = &self.context {
            argv.push(format!("--context={context}"));
        }
        argv.extend(rest.iter().map(|w| w.to_string()));
        argv
    }

    /// The template for `rest`: `kubectl` first.
    fn template(&self, rest: &[&str]) -> Vec<String> {
        let mut argv = vec!["kubectl".to_string()];
        argv.extend(self.argv(rest));
        argv
    }

    fn kubectl(&self, rest: &[&str], stdin: &[u8], timeout_ms: u32) -> Result<(), PluginError> {
        let args = self.argv(rest);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = runner::exec("kubectl", &args, stdin, timeout_ms)?;
        if out.status != 0 {
            return Err(runner::error(
                ErrorCode::Unavailable,
                format!(
                    "kubectl {} exited with {}: {}",
                    rest.first().copied().unwrap_or_default(),
                    out.status,
                    String::from_utf8_lossy(&out.stderr).trim()
                ),
            ));
        }
        Ok(())
    }
}

fn invalid(message: impl Into<String>) -> PluginError {
    runner::error(ErrorCode::InvalidOptions, message)
}

fn parse(
    options: &str,
) -> Result<(Options, serde_json::Map<String, serde_json::Value>), PluginError> {
    let options: Options = runner::options(options)?;
    let mut selector = serde_json::Map::new();
    for pair in options.node_selector.iter().flat_map(|s| s.split(',')) {
        let Some((key, value)) = pair.split_once('=') else {
            return Err(invalid(format!(
                "`nodeSelector`: {pair:?} is not key=value"
            )));
        };
        selector.insert(key.trim().into(), value.trim().into());
    }
    Ok((options, selector))
}

/// A DNS-1123 label from the run id, the shard and `suffix`: lowercase letters, digits and
/// `-`, ≤ 63.
fn pod_name(shard: &Shard, suffix: &str) -> String {
    let run: String = shard
        .run_id
        .to_ascii_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let suffix = format!("-{}-{suffix}", shard.index);
    let room = 63 - "mst-".len() - suffix.len();
    let run = run.trim_matches('-');
    format!("mst-{}{suffix}", &run[..run.len().min(room)])
}

/// A label value: letters, digits, `-`, `_`, `.`, at most 63.
fn label_value(text: &str) -> String {
    text.chars()
        .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
        .take(63)
        .collect()
}

/// The pod: it sleeps until the host's worker is started in it over `kubectl exec`.
fn manifest(
    name: &str,
    shard: &Shard,
    options: &Options,
    selector: &serde_json::Map<String, serde_json::Value>,
) -> serde_json::Value {
    let mut limits = serde_json::Map::new();
    if let Some(cpu) = &options.cpu {
        limits.insert("cpu".into(), cpu.clone().into());
    }
    if let Some(memory) = &options.memory {
        limits.insert("memory".into(), memory.clone().into());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": options.namespace,
            "labels": {
                "app.kubernetes.io/managed-by": "mst",
                "mst.run": label_value(&shard.run_id),
                "mst.shard": shard.index.to_string(),
            }
        },
        "spec": {
            "restartPolicy": "Never",
            // A pod whose disposal never happens (the host killed, a plugin call cut off by
            // its time limit) still ends.
            "activeDeadlineSeconds": options.max_seconds,
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "nodeSelector": selector,
            "containers": [{
                "name": "worker",
                "image": options.image,
                "command": ["sleep", "2147483647"],
                "resources": {"limits": limits.clone(), "requests": limits},
                "securityContext": {
                    "allowPrivilegeEscalation": false,
                    "privileged": false,
                    "capabilities": {"drop": ["ALL"]}
                }
            }]
        }
    })
}

impl Runner for Kubernetes {
    fn info() -> PluginInfo {
        PluginInfo {
            name: "mst/runner/kubernetes".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "Shards in Kubernetes pods, through kubectl".into(),
            capabilities: declared(),
            options_schema: Some(SCHEMA.into()),
        }
    }

    fn runner_info() -> RunnerInfo {
        RunnerInfo { max_shards: None }
    }

    fn check_options(options: &str) -> Result<(), PluginError> {
        parse(options).map(|_| ())
    }

    fn create_machine(shard: Shard, options: &str) -> Result<Machine, PluginError> {
        let (options, selector) = parse(options)?;
        // A fresh name each time: a resumed shard never adopts (then deletes) a kept pod.
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default();
        let pod = Pod {
            name: pod_name(&shard, &format!("{:06x}", nanos & 0xff_ffff)),
            namespace: options.namespace.clone(),
            context: options.context.clone(),
        };
        let spec = manifest(&pod.name, &shard, &options, &selector);
        pod.kubectl(
            &["apply", "--filename=-"],
            spec.to_string().as_bytes(),
            60_000,
        )?;
        let timeout = format!("--timeout={}s", options.ready_timeout);
        let target = format!("pod/{}", pod.name);
        let waited = pod.kubectl(
            &["wait", "--for=condition=Ready", &target, &timeout],
            &[],
            (options.ready_timeout + 10) * 1000,
        );
        if let Err(e) = waited {
            let _ = Self::dispose_machine(&serde_json::to_string(&pod).expect("json"), false);
            return Err(e);
        }
        Ok(Machine {
            id: serde_json::to_string(&pod).expect("serializable"),
            description: format!("pod {}/{} (kubernetes)", pod.namespace, pod.name),
            spec: MachineSpec::Command(CommandChannel {
                exec: pod.template(&["exec", "-i", &pod.name, "--", "{command}"]),
                put: pod.template(&["exec", "-i", &pod.name, "--", "sh", "-c", PUT]),
                get: pod.template(&["exec", "-i", &pod.name, "--", "sh", "-c", GET]),
                workdir: options.workdir.trim_end_matches('/').to_string(),
            }),
        })
    }

    fn dispose_machine(id: &str, keep: bool) -> Result<(), PluginError> {
        let pod: Pod = serde_json::from_str(id)
            .map_err(|e| invalid(format!("not a machine of this plugin: {e}")))?;
        if keep {
            return Ok(());
        }
        pod.kubectl(
            &[
                "delete",
                "pod",
                &pod.name,
                "--wait=false",
                "--ignore-not-found",
            ],
            &[],
            60_000,
        )
    }
}

mst_sdk::export_runner!(Kubernetes);

#[cfg(test)]
mod tests {
    use super::*;

    fn shard(run_id: &str, index: u32) -> Shard {
        Shard {
            index,
            count: 4,
            run_id: run_id.into(),
        }
    }

    #[test]
    fn pod_names_are_dns_labels() {
        assert_eq!(
            pod_name(&shard("20261130T0750Z-ab12", 3), "0f0f0f"),
            "mst-20261130t0750z-ab12-3-0f0f0f"
        );
        let long = pod_name(&shard(&"X".repeat(100), 12), "0f0f0f");
        assert!(long.len() <= 63 && long.ends_with("-12-0f0f0f"), "{long}");
    }

    #[test]
    fn the_manifest_carries_limits_selector_and_no_token() {
        let (options, selector) =
            parse(r#"{"image":"acme/agents:7","memory":"512Mi","cpu":"500m","nodeSelector":"pool=evals"}"#).unwrap();
        let pod = manifest("mst-r-0", &shard("r", 0), &options, &selector);
        assert_eq!(pod["spec"]["automountServiceAccountToken"], false);
        assert_eq!(pod["spec"]["nodeSelector"]["pool"], "evals");
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["resources"]["limits"]["memory"], "512Mi");
        assert_eq!(
            container["securityContext"]["capabilities"]["drop"][0],
            "ALL"
        );
        assert!(parse(r#"{"image":"x","nodeSelector":"pool"}"#).is_err());
        assert!(parse(r#"{"image":"x","hostPath":"/"}"#).is_err());
    }

    #[test]
    fn every_command_is_a_declared_template_pinned_to_the_operators_cluster() {
        let given = [("namespace", "evals"), ("context", "lab")];
        let admitted =
            |argv: &[String]| runner::exec_admitted(&declared(), &given, "kubectl", argv);
        let pod = Pod {
            name: "mst-r-0-0f0f0f".into(),
            namespace: "evals".into(),
            context: Some("lab".into()),
        };
        for argv in [
            pod.argv(&["apply", "--filename=-"]),
            pod.argv(&[
                "wait",
                "--for=condition=Ready",
                "pod/mst-r-0-0f0f0f",
                "--timeout=120s",
            ]),
            pod.argv(&["exec", "-i", &pod.name, "--", "{command}"]),
            pod.argv(&["exec", "-i", &pod.name, "--", "sh", "-c", PUT]),
            pod.argv(&["exec", "-i", &pod.name, "--", "sh", "-c", GET]),
            pod.argv(&[
                "delete",
                "pod",
                &pod.name,
                "--wait=false",
                "--ignore-not-found",
            ]),
        ] {
            assert!(admitted(&argv), "{argv:?}");
        }
        // Another namespace or cluster, another verb, a verb's words swapped: refused.
        let elsewhere = Pod {
            namespace: "kube-system".into(),
            ..pod.clone()
        };
        assert!(!admitted(&elsewhere.argv(&["apply", "--filename=-"])));
        assert!(!admitted(&pod.argv(&["get", "secrets"])));
        assert!(!admitted(
            &pod.argv(&["exec", "-i", &pod.name, "--", "sh", "-c", "id"])
        ));
        assert!(!admitted(
            &pod.argv(&["delete", "pod", &pod.name, &pod.name])
        ));
    }
}
