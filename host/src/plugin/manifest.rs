//! Kubernetes manifests a plugin feeds to `kubectl` on stdin (`kubectl apply --filename=-`),
//! checked by the host before `kubectl` runs. Without this, granting `kubectl apply` from
//! stdin would grant everything the operator's cluster credentials allow: a privileged pod
//! with the node's file system mounted is one manifest away, and so is a pod that reads the
//! namespace's Secrets into its environment or runs as a powerful service account. The check
//! is an allow-list: one v1 Pod made only of the fields the kubernetes runner plugin writes
//! (and a few that only harden it further), `emptyDir` the only volume, no `env`, `envFrom`,
//! ports or service account, no privilege; any other field is refused by its path.

use serde_json::Value;

/// The `kubectl` verbs that may read a manifest from stdin.
const VERBS: &[&str] = &["apply", "create"];

/// Whether `args` make `kubectl` read a file from stdin (`-f -`, `--filename=-`, `-f=-`).
fn reads_stdin(args: &[String]) -> bool {
    args.iter().enumerate().any(|(i, a)| {
        a == "--filename=-"
            || a == "-f=-"
            || a == "-f-"
            || ((a == "-f" || a == "--filename") && args.get(i + 1).is_some_and(|n| n == "-"))
    })
}

/// Refuses a `kubectl` run that reads a manifest from stdin unless that manifest is one
/// hardened pod; anything else passes. The error says what was wrong and what is allowed.
pub fn check(program: &str, args: &[String], stdin: &[u8]) -> Result<(), String> {
    if !super::capabilities::is_kubectl(program) || !reads_stdin(args) {
        return Ok(());
    }
    let verb = args.iter().find(|a| !a.starts_with('-'));
    if !verb.is_some_and(|v| VERBS.contains(&v.as_str())) {
        return Err(format!(
            "kubectl may read a manifest from the plugin's stdin only to {} a pod, not with {:?}",
            VERBS.join(" or "),
            verb.map(String::as_str).unwrap_or("no verb")
        ));
    }
    let manifest: Value = serde_json::from_slice(stdin).map_err(|e| {
        format!("the manifest a plugin feeds kubectl must be one JSON object (a pod): {e}")
    })?;
    let problems = pod_problems(&manifest);
    if problems.is_empty() {
        return Ok(());
    }
    Err(format!(
        "the manifest it feeds kubectl is refused: {}. A plugin may create only a v1 Pod of \
         containers (name, image, command, args, workingDir, resources, securityContext, \
         volumeMounts) without privileges, with emptyDir volumes only and no environment, \
         ports or service account",
        problems.join("; ")
    ))
}

/// What makes `manifest` more than a hardened pod, one line each.
fn pod_problems(manifest: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    if manifest["kind"] != "Pod" || manifest["apiVersion"] != "v1" {
        problems.push(format!(
            "it is a {} of {}, not a v1 Pod",
            manifest["kind"], manifest["apiVersion"]
        ));
        return problems;
    }
    let mut at = Checker(&mut problems);
    at.only(manifest, "", &["apiVersion", "kind", "metadata", "spec"]);
    let metadata = &manifest["metadata"];
    at.only(metadata, "metadata", &["name", "namespace", "labels"]);
    at.strings(&metadata["labels"], "metadata.labels");
    let spec = &manifest["spec"];
    at.only(spec, "spec", &SPEC_FIELDS);
    if spec["automountServiceAccountToken"] != false {
        at.say("spec.automountServiceAccountToken is not false".into());
    }
    if !spec["restartPolicy"].is_null() && spec["restartPolicy"] != "Never" {
        at.say("spec.restartPolicy is not Never".into());
    }
    at.strings(&spec["nodeSelector"], "spec.nodeSelector");
    at.security(
        &spec["securityContext"],
        "spec.securityContext",
        &POD_SECURITY,
    );
    let mut volumes = Vec::new();
    for (index, volume) in at.list(&spec["volumes"], "spec.volumes").enumerate() {
        let here = format!("spec.volumes[{index}]");
        at.only(volume, &here, &["name", "emptyDir"]);
        if !volume["emptyDir"].is_object() {
            at.say(format!(
                "{here} is not an emptyDir, the only volume a pod may have"
            ));
        }
        at.only(
            &volume["emptyDir"],
            &format!("{here}.emptyDir"),
            &["medium", "sizeLimit"],
        );
        volumes.extend(volume["name"].as_str());
    }
    if spec["containers"].as_array().is_none_or(Vec::is_empty) {
        at.say("spec.containers lists no container".into());
    }
    for (index, container) in at.list(&spec["containers"], "spec.containers").enumerate() {
        let here = format!("spec.containers[{index}]");
        at.only(container, &here, &CONTAINER_FIELDS);
        let security = &container["securityContext"];
        at.security(
            security,
            &format!("{here}.securityContext"),
            &CONTAINER_SECURITY,
        );
        if security["allowPrivilegeEscalation"] != false {
            at.say(format!(
                "{here}.securityContext.allowPrivilegeEscalation is not false"
            ));
        }
        if security["privileged"] == true {
            at.say(format!("{here}.securityContext.privileged is true"));
        }
        let capabilities = &security["capabilities"];
        at.only(
            capabilities,
            &format!("{here}.securityContext.capabilities"),
            &["drop"],
        );
        let resources = &container["resources"];
        at.only(
            resources,
            &format!("{here}.resources"),
            &["limits", "requests"],
        );
        for (index, mount) in at
            .list(&container["volumeMounts"], &format!("{here}.volumeMounts"))
            .enumerate()
        {
            let there = format!("{here}.volumeMounts[{index}]");
            at.only(mount, &there, &["name", "mountPath", "readOnly"]);
            if !mount["name"]
                .as_str()
                .is_some_and(|name| volumes.contains(&name))
            {
                at.say(format!("{there} mounts no emptyDir volume of the pod"));
            }
        }
    }
    problems
}

/// The fields a pod's `spec` may have.
const SPEC_FIELDS: [&str; 8] = [
    "restartPolicy",
    "activeDeadlineSeconds",
    "automountServiceAccountToken",
    "enableServiceLinks",
    "nodeSelector",
    "securityContext",
    "volumes",
    "containers",
];

/// The fields a container may have: no `env`, `envFrom`, `ports` or probes.
const CONTAINER_FIELDS: [&str; 8] = [
    "name",
    "image",
    "command",
    "args",
    "workingDir",
    "resources",
    "securityContext",
    "volumeMounts",
];

/// What a pod's `securityContext` may say: who its processes run as, and the runtime's own
/// seccomp profile.
const POD_SECURITY: [&str; 5] = [
    "runAsNonRoot",
    "runAsUser",
    "runAsGroup",
    "fsGroup",
    "seccompProfile",
];

/// What a container's `securityContext` may say (`capabilities` may only drop).
const CONTAINER_SECURITY: [&str; 8] = [
    "allowPrivilegeEscalation",
    "privileged",
    "capabilities",
    "readOnlyRootFilesystem",
    "runAsNonRoot",
    "runAsUser",
    "runAsGroup",
    "seccompProfile",
];

/// Collects the problems of a manifest, each named by its path.
struct Checker<'a>(&'a mut Vec<String>);

impl Checker<'_> {
    fn say(&mut self, problem: String) {
        self.0.push(problem);
    }

    /// `value`, if present, is an object with no field but `allowed`.
    fn only(&mut self, value: &Value, at: &str, allowed: &[&str]) {
        let Some(object) = value.as_object() else {
            if !value.is_null() {
                self.say(format!("{} is not an object", display(at)));
            }
            return;
        };
        for key in object.keys().filter(|k| !allowed.contains(&k.as_str())) {
            let path = match at {
                "" => key.clone(),
                _ => format!("{at}.{key}"),
            };
            self.say(format!("{path} is not allowed"));
        }
    }

    /// `value`, if present, is an object of strings (labels, a node selector).
    fn strings(&mut self, value: &Value, at: &str) {
        let strings = value
            .as_object()
            .is_some_and(|object| object.values().all(Value::is_string));
        if !value.is_null() && !strings {
            self.say(format!("{at} is not an object of strings"));
        }
    }

    /// The items of `value`, if it is a list; a problem if present and not one.
    fn list<'v>(&mut self, value: &'v Value, at: &str) -> impl Iterator<Item = &'v Value> {
        if !value.is_null() && !value.is_array() {
            self.say(format!("{at} is not a list"));
        }
        value.as_array().into_iter().flatten()
    }

    /// A `securityContext` of `allowed` fields, whose seccomp profile, if any, is the
    /// runtime's default.
    fn security(&mut self, value: &Value, at: &str, allowed: &[&str]) {
        self.only(value, at, allowed);
        let profile = &value["seccompProfile"];
        if !profile.is_null() && *profile != serde_json::json!({"type": "RuntimeDefault"}) {
            self.say(format!(
                "{at}.seccompProfile is not {{\"type\": \"RuntimeDefault\"}}"
            ));
        }
    }
}

/// A path as an error names it (the manifest itself when empty).
fn display(at: &str) -> &str {
    match at {
        "" => "the manifest",
        _ => at,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hardened() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mst-x"},
            "spec": {
                "automountServiceAccountToken": false,
                "containers": [{
                    "name": "worker",
                    "image": "busybox",
                    "securityContext": {
                        "allowPrivilegeEscalation": false,
                        "privileged": false,
                        "capabilities": {"drop": ["ALL"]}
                    }
                }]
            }
        })
    }

    fn apply(manifest: &Value) -> Result<(), String> {
        let args = ["apply".to_string(), "--filename=-".to_string()];
        check("kubectl", &args, manifest.to_string().as_bytes())
    }

    #[test]
    fn a_hardened_pod_passes() {
        apply(&hardened()).unwrap();
        // With what the kubernetes plugin adds, and a scratch volume.
        let mut pod = hardened();
        pod["metadata"]["labels"] = json!({"app.kubernetes.io/managed-by": "mst"});
        pod["spec"]["restartPolicy"] = json!("Never");
        pod["spec"]["activeDeadlineSeconds"] = json!(3600);
        pod["spec"]["enableServiceLinks"] = json!(false);
        pod["spec"]["nodeSelector"] = json!({"pool": "eval"});
        pod["spec"]["volumes"] = json!([{"name": "work", "emptyDir": {"sizeLimit": "1Gi"}}]);
        let container = &mut pod["spec"]["containers"][0];
        container["command"] = json!(["sleep", "2147483647"]);
        container["resources"] = json!({"limits": {"cpu": "1"}, "requests": {"cpu": "1"}});
        container["volumeMounts"] = json!([{"name": "work", "mountPath": "/work"}]);
        apply(&pod).unwrap();
        // Other programs, and kubectl not reading stdin, are not this check's business.
        check("cat", &["--filename=-".into()], b"anything").unwrap();
        check("kubectl", &["get".into(), "pods".into()], b"").unwrap();
    }

    #[test]
    fn each_way_out_of_the_pod_is_refused() {
        let cases: Vec<(Change, &str)> = vec![
            (
                |m| m["spec"]["hostNetwork"] = json!(true),
                "spec.hostNetwork",
            ),
            (|m| m["spec"]["hostPID"] = json!(true), "spec.hostPID"),
            (
                |m| m["spec"]["automountServiceAccountToken"] = json!(true),
                "automountServiceAccountToken",
            ),
            (
                |m| m["spec"]["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]),
                "hostPath",
            ),
            (
                |m| {
                    m["spec"]["volumes"] = json!([{"name": "t", "projected": {"sources": [
                        {"serviceAccountToken": {"path": "token"}}]}}])
                },
                "spec.volumes[0].projected is not allowed",
            ),
            (
                |m| m["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true),
                "privileged is true",
            ),
            (
                |m| {
                    m["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
                        json!(["SYS_ADMIN"])
                },
                "capabilities.add",
            ),
            (
                |m| {
                    m["spec"]["initContainers"] =
                        json!([{"name": "i", "image": "busybox", "securityContext": {}}])
                },
                "spec.initContainers is not allowed",
            ),
            (|m| m["kind"] = json!("ClusterRoleBinding"), "not a v1 Pod"),
        ];
        refused(cases);
        let err = check(
            "kubectl",
            &["replace".into(), "-f".into(), "-".into()],
            b"{}",
        )
        .unwrap_err();
        assert!(err.contains("not with \"replace\""), "{err}");
        let err = check(
            "/usr/bin/kubectl",
            &["apply".into(), "-f".into(), "-".into()],
            b"a: b",
        )
        .unwrap_err();
        assert!(err.contains("one JSON object"), "{err}");
    }

    /// A change to a hardened pod, and what its refusal says.
    type Change = fn(&mut Value);

    /// Asserts that each change makes the hardened pod refused, saying so.
    fn refused(cases: Vec<(Change, &str)>) {
        for (change, says) in cases {
            let mut manifest = hardened();
            change(&mut manifest);
            let err = apply(&manifest).unwrap_err();
            assert!(err.contains(says), "{says}: {err}");
        }
    }

    #[test]
    fn every_field_the_plugin_does_not_write_is_refused() {
        let cases: Vec<(Change, &str)> = vec![
            // The fields a deny-list let through (security review M1).
            (
                |m| {
                    m["spec"]["containers"][0]["env"] = json!([{"name": "K", "valueFrom":
                        {"secretKeyRef": {"name": "db", "key": "password"}}}])
                },
                "spec.containers[0].env is not allowed",
            ),
            (
                |m| m["spec"]["containers"][0]["envFrom"] = json!([{"secretRef": {"name": "db"}}]),
                "spec.containers[0].envFrom is not allowed",
            ),
            (
                |m| {
                    m["spec"]["volumes"] =
                        json!([{"name": "data", "persistentVolumeClaim": {"claimName": "prod"}}])
                },
                "spec.volumes[0].persistentVolumeClaim is not allowed",
            ),
            (
                |m| {
                    m["spec"]["volumes"] =
                        json!([{"name": "n", "nfs": {"server": "x", "path": "/"}}])
                },
                "is not an emptyDir",
            ),
            (
                |m| m["spec"]["serviceAccountName"] = json!("cluster-admin-sa"),
                "spec.serviceAccountName is not allowed",
            ),
            (
                |m| {
                    m["spec"]["securityContext"] = json!({"seccompProfile": {"type": "Unconfined"}})
                },
                "spec.securityContext.seccompProfile",
            ),
            (
                |m| m["spec"]["containers"][0]["securityContext"]["procMount"] = json!("Unmasked"),
                "securityContext.procMount is not allowed",
            ),
            (
                |m| {
                    m["spec"]["containers"][0]["volumeMounts"] =
                        json!([{"name": "host", "mountPath": "/h"}])
                },
                "mounts no emptyDir volume",
            ),
            (
                |m| m["metadata"]["annotations"] = json!({"a": "b"}),
                "metadata.annotations is not allowed",
            ),
            (
                |m| m["spec"]["containers"] = json!([]),
                "lists no container",
            ),
        ];
        refused(cases);
    }
}
