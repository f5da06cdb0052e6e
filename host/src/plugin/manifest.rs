//! Kubernetes manifests a plugin feeds to `kubectl` on stdin (`kubectl apply --filename=-`),
//! checked by the host before `kubectl` runs. Without this, granting `kubectl apply` from
//! stdin would grant everything the operator's cluster credentials allow: a privileged pod
//! with the node's file system mounted is one manifest away. With it, a plugin can create one
//! pod, and only a pod without privileges, host namespaces, host paths, added capabilities,
//! host ports or a service-account token (what the kubernetes runner plugin writes).

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
        "the manifest it feeds kubectl is refused: {}. A plugin may create only a pod without \
         privileges, host namespaces, hostPath volumes, added capabilities, host ports or a \
         service-account token",
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
    let spec = &manifest["spec"];
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        if spec[field] == true {
            problems.push(format!("spec.{field} is true"));
        }
    }
    if spec["automountServiceAccountToken"] != false {
        problems.push("spec.automountServiceAccountToken is not false".into());
    }
    for (index, volume) in spec["volumes"].as_array().into_iter().flatten().enumerate() {
        if !volume["hostPath"].is_null() {
            problems.push(format!("spec.volumes[{index}] is a hostPath"));
        }
        if !volume["secret"].is_null() {
            problems.push(format!("spec.volumes[{index}] mounts a secret"));
        }
        let sources = volume["projected"]["sources"].as_array();
        if sources
            .into_iter()
            .flatten()
            .any(|s| !s["serviceAccountToken"].is_null() || !s["secret"].is_null())
        {
            problems.push(format!(
                "spec.volumes[{index}] projects a service-account token or a secret"
            ));
        }
    }
    for list in ["containers", "initContainers", "ephemeralContainers"] {
        for (index, container) in spec[list].as_array().into_iter().flatten().enumerate() {
            let at = format!("spec.{list}[{index}]");
            let security = &container["securityContext"];
            if security["privileged"] == true {
                problems.push(format!("{at}.securityContext.privileged is true"));
            }
            if security["allowPrivilegeEscalation"] != false {
                problems.push(format!(
                    "{at}.securityContext.allowPrivilegeEscalation is not false"
                ));
            }
            if security["capabilities"]["add"]
                .as_array()
                .is_some_and(|added| !added.is_empty())
            {
                problems.push(format!(
                    "{at}.securityContext.capabilities.add is not empty"
                ));
            }
            let ports = container["ports"].as_array().into_iter().flatten();
            if ports.into_iter().any(|p| !p["hostPort"].is_null()) {
                problems.push(format!("{at} asks for a hostPort"));
            }
        }
    }
    problems
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
        // Other programs, and kubectl not reading stdin, are not this check's business.
        check("cat", &["--filename=-".into()], b"anything").unwrap();
        check("kubectl", &["get".into(), "pods".into()], b"").unwrap();
    }

    #[test]
    fn each_way_out_of_the_pod_is_refused() {
        type Change = fn(&mut Value);
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
                "service-account token",
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
                "initContainers[0].securityContext.allowPrivilegeEscalation",
            ),
            (|m| m["kind"] = json!("ClusterRoleBinding"), "not a v1 Pod"),
        ];
        for (change, says) in cases {
            let mut manifest = hardened();
            change(&mut manifest);
            let err = apply(&manifest).unwrap_err();
            assert!(err.contains(says), "{says}: {err}");
        }
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
}
