"""Time from submit to every role registered, per executor, beside a bare `sbatch --wait`.

Launches the three-role plan (trainer 2 ranks with 1 GPU each, inference 1 task
with 2 GPUs on gpu1; pool on cpu1 and cpu2) of trivial commands, through the
local, sbatch and submitit executors, and times submit -> all five tasks
registered in services/. The baseline is `sbatch --wait` of a trivial script on
the same cluster: what Slurm alone costs to schedule, start and finish a job.

    python -m benchmarks.launch_bench [--repeat 3] [--executors local,sbatch,submitit] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from hpc.registry import Registry

ROOT = Path(__file__).resolve().parents[1]

PARTITIONS = {"gpu": {"nodes": ["gpu1"], "cpus_per_node": 8, "mem_mb": 16000, "gpus_per_node": 4},
              "cpu": {"nodes": ["cpu1", "cpu2"], "cpus_per_node": 8, "mem_mb": 8000, "gpus_per_node": 0}}
TASKS = 5


def config(run: Path) -> dict:
    sleep = ["sleep", "600"]
    return {"run_dir": str(run), "launch": {"name": "bench", "time_limit_min": 10, "partitions": PARTITIONS, "roles": {
        "trainer": {"command": sleep, "partition": "gpu", "tasks": 2, "gpus_per_task": 1, "mem_per_task_mb": 200,
                    "restart": {"policy": "fail-run"}},
        "inference": {"command": sleep, "partition": "gpu", "gpus_per_task": 2, "mem_per_task_mb": 200,
                      "restart": {"policy": "restart"}},
        "pool": {"command": sleep, "partition": "cpu", "tasks": 2, "nodes": 2, "mem_per_task_mb": 200,
                 "restart": {"policy": "restart"}}}}}


def wait_until(pred, timeout: float) -> float:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if pred():
            return time.perf_counter()
        time.sleep(0.05)
    raise TimeoutError(f"not done in {timeout} s")


def time_executor(executor: str, base: Path) -> float:
    run = Path(tempfile.mkdtemp(prefix=f"{executor}-", dir=base)) / "run"
    cfg = run.parent / "run.yaml"
    cfg.write_text(yaml.safe_dump(config(run)))
    cmd = [sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", executor]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True, cwd=ROOT)
    try:
        t1 = wait_until(lambda: (run / "services").is_dir() and len(Registry(run / "services").services()) == TASKS,
                        180)
        return t1 - t0
    finally:
        if executor == "local":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.wait()
            subprocess.run([sys.executable, "-m", "agentrl.cli", "stop", str(run)], capture_output=True, cwd=ROOT)
        proc.wait(timeout=60)
        time.sleep(1)  # let Slurm release the nodes before the next round


def time_bare_sbatch(base: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["sbatch", "--wait", "-p", "cpu", "-N1", "--mem=100", f"--output={base}/bare-%j.out",
                    "--wrap", "true"], check=True, capture_output=True)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="rounds per executor (median reported)")
    ap.add_argument("--executors", default="local,sbatch,submitit")
    ap.add_argument("--json", action="store_true", help="end with one JSON object of the figures")
    args = ap.parse_args(argv)
    executors = args.executors.split(",")
    if bad := [e for e in executors if e not in ("local", "sbatch", "submitit")]:
        ap.error(f"unknown executor(s) {bad}: choose from local, sbatch, submitit")
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if "SLURM_CONF" not in os.environ and not Path("/etc/slurm/slurm.conf").exists():
        ap.error("no Slurm here: start the local cluster (agentrl cluster up) and eval \"$(agentrl cluster env)\"")

    with tempfile.TemporaryDirectory(prefix="launch-bench-") as tmp:
        base = Path(tmp)
        bare = statistics.median(time_bare_sbatch(base) for _ in range(args.repeat))
        rows = []
        print(f"{'executor':<10} {'submit -> all registered (s)':>29} {'bare sbatch --wait (s)':>23} {'ratio':>6}")
        for ex in executors:
            t = statistics.median(time_executor(ex, base) for _ in range(args.repeat))
            rows.append({"executor": ex, "all_registered_s": round(t, 2), "bare_sbatch_wait_s": round(bare, 2),
                         "ratio": round(t / bare, 2)})
            print(f"{ex:<10} {t:>29.2f} {bare:>23.2f} {t / bare:>6.2f}", flush=True)
    print(f"median of {args.repeat} rounds; {TASKS} tasks in 3 roles over gpu1, cpu1, cpu2")
    if args.json:
        print(json.dumps({"benchmark": "launch", "repeat": args.repeat, "results": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
