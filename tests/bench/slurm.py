#!/usr/bin/env python3
"""Time from `mst run` to the first collected trial on the slurm runner, with 1 and 4 shards,
against a bare `srun true` on the same cluster (docs/runners.md quotes the figures).

Needs a running cluster that $SLURM_CONF names (or the system's), `cargo build -p mst`,
`cargo xtask plugins`, and `cargo xtask worker` unless mst of this version is on the nodes'
PATH. Usage: python3 tests/bench/slurm.py [ROUNDS]
"""
import json, os, shutil, statistics, subprocess, sys, tempfile, time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MST = ROOT / "target/debug/mst"
PLUGIN = ROOT / "plugins/dist/slurm-runner.wasm"


def srun_true():
    started = time.monotonic()
    subprocess.run(["srun", "--quiet", "--time=1", "true"], check=True)
    return time.monotonic() - started


def first_trial(work, shards):
    """Seconds to the first `collected` progress line, and to the end of the run."""
    shutil.rmtree(work / "results", ignore_errors=True)
    args = [str(MST), "run", "--config", str(work / "eval.json"), "--results-dir",
            str(work / "results"), "--plugin", str(PLUGIN), "--runner", "mst/runner/slurm",
            "--runner-option", f"shards={shards}", "--runner-option", "time=10"]
    for program in ["salloc", "srun", "squeue", "scancel"]:
        args += ["--allow-exec", program]
    env = dict(os.environ, MST_HOME=str(work / "home"))
    started = time.monotonic()
    run = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True,
                           env=env, cwd=work)
    first = None
    for line in run.stderr:
        if "collected" in line and first is None:
            first = time.monotonic() - started
    run.wait()
    if run.returncode != 0:
        sys.exit(f"mst run exited with {run.returncode}")
    return first, time.monotonic() - started


def main():
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    work = Path(tempfile.mkdtemp(prefix="mst-bench-slurm-"))
    cases = [{"id": f"c{i}", "input": f"q{i}", "expected": f"q{i}"} for i in range(1, 9)]
    (work / "cases.jsonl").write_text("\n".join(json.dumps(c) for c in cases))
    (work / "eval.json").write_text(json.dumps({
        "name": "bench", "datasets": ["cases.jsonl"], "client": "command",
        "clientOptions": {"command": ["sh", "-c", "read q; echo \"$q\""]},
        "judges": [{"assert": "exit-code", "value": 0}], "concurrency": 2, "timeout": 30}))
    bare = [srun_true() for _ in range(rounds)]
    print("srun true: median %.3f s (%s)" % (statistics.median(bare),
                                             " ".join("%.3f" % t for t in bare)))
    for shards in (1, 4):
        times = [first_trial(work, shards) for _ in range(rounds)]
        print("mst, %d shard(s): first trial median %.3f s (%s); whole run median %.3f s" % (
            shards, statistics.median(t[0] for t in times),
            " ".join("%.3f" % t[0] for t in times), statistics.median(t[1] for t in times)))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
