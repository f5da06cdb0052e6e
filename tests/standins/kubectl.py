#!/usr/bin/env python3
"""A kubectl stand-in for mst's tests: no Kubernetes control plane can run on the test machine,
so the calls the `mst/runner/kubernetes` plugin makes are mapped onto a real Docker engine.
It is not a kubectl: it knows `apply --filename=-` (one Pod), `wait --for=condition=Ready`,
`exec -i` and `delete pod`, and refuses everything else.

Usage: kubectl.py CONFIG [kubectl arguments...], where CONFIG is a JSON file with
`dockerHost` (the engine's endpoint) and `log` (a file that gets one JSON line per call).
mst runs programs with only PATH and HOME in the environment, hence the file.
"""
import json
import os
import subprocess
import sys
import time


def quantity_to_docker_memory(text):
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g"), ("Ti", "t")):
        if text.endswith(suffix):
            return text[: -len(suffix)] + unit
    return text


def quantity_to_cpus(text):
    return str(int(text[:-1]) / 1000) if text.endswith("m") else text


def fail(message):
    sys.stderr.write(f"error: {message}\n")
    sys.exit(1)


def main():
    config = json.load(open(sys.argv[1]))
    host = config["dockerHost"]
    args = sys.argv[2:]
    manifest = None
    globals_, rest = {}, []
    for arg in args:
        if arg.startswith("--namespace=") or arg.startswith("--context="):
            key, value = arg[2:].split("=", 1)
            globals_[key] = value
        else:
            rest.append(arg)
    if rest[:2] == ["apply", "--filename=-"]:
        manifest = json.load(sys.stdin)
    with open(config["log"], "a") as log:
        log.write(json.dumps({"argv": args, "manifest": manifest}) + "\n")
    docker = ["docker", "--host", host]
    verb = rest[0] if rest else ""

    if verb == "apply" and manifest is not None:
        if manifest.get("kind") != "Pod":
            fail("the stand-in applies only Pods")
        name = manifest["metadata"]["name"]
        container = manifest["spec"]["containers"][0]
        limits = container.get("resources", {}).get("limits", {})
        run = docker + ["run", "-d", "--name", name, "--label", "mst.standin=kubectl",
                        "--label", "mst.run=" + manifest["metadata"]["labels"].get("mst.run", ""),
                        "--cap-drop", "ALL", "--security-opt", "no-new-privileges"]
        if "memory" in limits:
            run += ["--memory", quantity_to_docker_memory(limits["memory"])]
        if "cpu" in limits:
            run += ["--cpus", quantity_to_cpus(limits["cpu"])]
        run += [container["image"]] + container.get("command", [])
        done = subprocess.run(run, capture_output=True, text=True)
        if done.returncode != 0:
            fail(done.stderr.strip())
        print(f"pod/{name} created")
    elif verb == "wait":
        target = next(a for a in rest if a.startswith("pod/"))[4:]
        timeout = next((a for a in rest if a.startswith("--timeout=")), "--timeout=30s")
        deadline = time.time() + float(timeout.split("=", 1)[1].rstrip("s"))
        while time.time() < deadline:
            state = subprocess.run(docker + ["inspect", "-f", "{{.State.Running}}", target],
                                   capture_output=True, text=True)
            if state.stdout.strip() == "true":
                print(f"pod/{target} condition met")
                return
            time.sleep(0.1)
        fail(f"timed out waiting for the condition on pods/{target}")
    elif verb == "exec" and "--" in rest:
        split = rest.index("--")
        name = rest[split - 1]
        os.execvp("docker", docker + ["exec", "-i", name] + rest[split + 1:])
    elif rest[:2] == ["delete", "pod"]:
        done = subprocess.run(docker + ["rm", "-f", rest[2]], capture_output=True, text=True)
        if done.returncode != 0 and "--ignore-not-found" not in rest:
            fail(done.stderr.strip())
        print(f'pod "{rest[2]}" deleted')
    else:
        fail(f"the kubectl stand-in does not know {' '.join(args)!r}")


main()
