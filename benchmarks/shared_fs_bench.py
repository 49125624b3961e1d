"""The demo's run with its files on the local cluster's shared filesystem, beside the same run on local disk.

configs/tiny-local.yaml as shipped (three rollouts of 8 attempts, the CPU stand-in, bwrap sandboxes, the
torch trainer), submitted with `agentrl launch --executor sbatch` to the local Slurm cluster, its config,
tiny model, prompt data, run directory and checkpoints placed:
    figure:   on the cluster's shared filesystem (`agentrl cluster up --shared`: a GlusterFS volume that
              each node mounts as a client of its own, this machine too)
    baseline: on local disk (--beside, default: a temp dir), which every node of the one-machine cluster
              sees as itself
    wall      = submit .. the run's final state (`finished`), the median of --rounds rounds; the two sides
                take turns, the shared filesystem first in odd rounds and second in even ones.
ratio = figure / baseline, below 1 is better. Target (issue 28): at most 1.3.

    python -m benchmarks.shared_fs_bench [--rounds 3] [--beside DIR] [--json]
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time

from agentrl.models.tiny import make_tiny_model
from agentrl.swe.harbor import BUNDLED_TASKS
from hpc.launch.state import final_state
from hpc.localcluster import cluster_dir, shared_path
from hpc.runlayout import RunLayout

ROOT = Path(__file__).resolve().parents[1]
TARGET_RATIO = 1.3
RUN_TIMEOUT_S = 900


def place_demo(where: Path, model: Path, *, link_model: bool = False) -> Path:
    """configs/tiny-local.yaml under `where`, with the model and prompt data where its relative paths look.
    The model is copied, so that the nodes read it through their own clients, or linked (`link_model`)."""
    (where / "configs").mkdir(parents=True)
    shutil.copy(ROOT / "configs/tiny-local.yaml", where / "configs/tiny-local.yaml")
    assets = where / ".cache/demo"
    assets.mkdir(parents=True)
    if link_model:
        (assets / "tiny-model").symlink_to(model)
    else:
        shutil.copytree(model, assets / "tiny-model")
    subprocess.run([sys.executable, "-m", "agentrl.cli", "convert", "harbor", str(BUNDLED_TASKS), "--out",
                    str(assets / "prompts.jsonl")], check=True, capture_output=True, cwd=ROOT)
    return where / "configs/tiny-local.yaml"


def launch_and_wait(config: Path, run_dir: Path, timeout_s: float = RUN_TIMEOUT_S) -> float:
    """Seconds from `agentrl launch --executor sbatch` to the run's final state; on any end but `finished`
    (or none in timeout_s) the run is stopped and this raises, pointing at its logs."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(config), "--executor", "sbatch",
                    "--run-dir", str(run_dir)], check=True, capture_output=True, timeout=120, cwd=ROOT)
    state = None
    while time.perf_counter() - t0 < timeout_s:
        if (run_dir / "run.yaml").exists() and (state := final_state(RunLayout.open(run_dir))):
            break
        time.sleep(0.5)
    wall = time.perf_counter() - t0
    if state != "finished":
        subprocess.run([sys.executable, "-m", "agentrl.cli", "stop", str(run_dir)], capture_output=True, cwd=ROOT)
        raise RuntimeError(f"the run in {run_dir} ended {state or f'not at all in {timeout_s:.0f} s'}: "
                           f"see its logs/ and agentrl status {run_dir}")
    return wall


def time_run(where: Path, model: Path) -> float:
    """Seconds from submit to the demo's run finished, everything under `where`; fails on any other end."""
    wall = launch_and_wait(place_demo(where, model), where / "runs/demo")
    time.sleep(1)   # let Slurm release the nodes before the next run
    return wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3, help="runs on each side (median reported)")
    ap.add_argument("--beside", default=None, help="local disk to run beside (default: a temp dir)")
    ap.add_argument("--json", action="store_true", help="end with one JSON object of the figures")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.beside and not Path(args.beside).is_dir():
        ap.error(f"--beside {args.beside} is not a directory")
    shared = shared_path()
    if shared is None or not os.path.ismount(shared):
        ap.error(f"the local Slurm cluster in {cluster_dir()} has no shared filesystem mounted: "
                 "run `agentrl cluster up --shared` (make cluster-up)")
    if "SLURM_CONF" not in os.environ:
        os.environ["SLURM_CONF"] = str(cluster_dir() / "etc/slurm.conf")

    walls: dict[str, list[float]] = {"shared": [], "local": []}
    with tempfile.TemporaryDirectory(prefix="shared-fs-bench-", dir=args.beside) as local_tmp, \
            tempfile.TemporaryDirectory(prefix="shared-fs-bench-", dir=shared) as shared_tmp:
        model = make_tiny_model(Path(local_tmp) / "tiny-model")
        sides = {"shared": Path(shared_tmp), "local": Path(local_tmp)}
        print(f"the demo through sbatch, on {shared} (each node its own GlusterFS client) and on {local_tmp}")
        for r in range(args.rounds):
            for side in ("shared", "local") if r % 2 == 0 else ("local", "shared"):
                walls[side].append(time_run(sides[side] / f"round-{r}", model))
                print(f"round {r + 1}: {side:<6} {walls[side][-1]:7.1f} s", flush=True)
    figure, baseline = statistics.median(walls["shared"]), statistics.median(walls["local"])
    print(f"{'':<8} {'shared fs (s)':>14} {'local disk (s)':>15} {'ratio':>6}")
    print(f"{'median':<8} {figure:>14.1f} {baseline:>15.1f} {figure / baseline:>6.2f}")
    print(f"target: <= {TARGET_RATIO} ({'met' if figure / baseline <= TARGET_RATIO else 'NOT met'}); "
          f"median of {args.rounds} rounds")
    if args.json:
        print(json.dumps({"benchmark": "shared_fs", "rounds": args.rounds, "walls_s": walls,
                          "shared_s": round(figure, 2), "local_s": round(baseline, 2),
                          "ratio": round(figure / baseline, 3)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
