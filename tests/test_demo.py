"""The embedded default, end to end: configs/tiny-local.yaml run by Slurm as shipped, and by the local
executor (make demo's) with rollouts ahead of training under kill -9, then evaluated, reported and viewed.

Inference (the CPU stand-in with the tiny model), the pool (bwrap sandboxes, the builtin agent, the
adapter) and the torch trainer, on the bundled tasks, for three rollouts.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from proc_table import orphans_named
from run_story import what_happened

from benchmarks.shared_fs_bench import place_demo
from hpc.runlayout import RunLayout
from hpc.sandbox.supervisor import FORK_SERVER_NAME, SUPERVISOR_NAME

pytest_plugins = ["tiny_assets"]  # the session fixture tiny_model

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.e2e, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed (make sysdeps)")]


@pytest.fixture
def demo_config(tiny_model, tmp_path) -> Path:
    return place_demo(tmp_path, tiny_model, link_model=True)


def check_run(run_dir: Path) -> None:
    run = RunLayout.open(run_dir)
    assert run.latest_checkpoint() == 3
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["rollout"] for m in lines] == [0, 1, 2]
    assert all(m["attempts"] == 8 and m["groups"] == 4 and m["metric_input_errors"] == 0 for m in lines)
    assert [m.get("weight_version") for m in lines] == [1, 2, None]     # published after rollouts 0 and 1
    assert final_state(run_dir) == "finished"


def final_state(run_dir: Path) -> str | None:
    from hpc.launch.state import final_state as state_of

    return state_of(RunLayout.open(run_dir)) if (run_dir / "run.yaml").exists() else None


@pytest.mark.slurm
@pytest.mark.timeout(900)
def test_demo_on_the_local_slurm_cluster_with_its_files_on_the_shared_filesystem(slurm_env, cluster_shared,
                                                                                 tiny_model):
    """The shipped config as an sbatch job, its config, model, prompt data, run directory and checkpoints
    on the cluster's shared filesystem: the trainer and inference on gpu1's client of the volume, the pool on
    cpu1's and cpu2's, this machine (the login node) on its own; then the report and the viewer's site."""
    demo_config = place_demo(cluster_shared, tiny_model)
    run_dir = cluster_shared / "runs/demo-slurm"
    r = subprocess.run([sys.executable, "-m", "agentrl.cli", "launch", str(demo_config), "--executor", "sbatch",
                        "--run-dir", str(run_dir)], capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=slurm_env)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 800
    while final_state(run_dir) is None and time.monotonic() < deadline:
        time.sleep(2)
    assert final_state(run_dir) == "finished", what_happened(run_dir)
    check_run(run_dir)
    status = subprocess.run([sys.executable, "-m", "agentrl.cli", "status", str(run_dir)], capture_output=True,
                            text=True, timeout=60, cwd=ROOT, env={**os.environ, **slurm_env})
    assert "finished" in status.stdout and "latest checkpoint: iter_3" in status.stdout
    assert "rollout 2: closed, 4 groups complete; attempts 8 committed" in status.stdout
    for cmd in (["report", str(run_dir)], ["view", str(run_dir), "--quiet"]):
        r = subprocess.run([sys.executable, "-m", "agentrl.cli", *cmd], capture_output=True, text=True, timeout=300,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    assert "iter_3" in (run_dir / "report.md").read_text()
    assert len(list((run_dir / "view").glob("rollout_*/*-*.html"))) == 24     # every attempt's page


@pytest.mark.timeout(900)
def test_the_demo_survives_kill_9_of_a_pool_worker_and_the_inference_server_then_evals_reports_and_views(
        demo_config, tmp_path):
    """`make demo` with the local executor, its rollouts ahead of training (max_staleness 1): kill -9 of the
    pool worker and the inference server lands while one rollout trains and the next runs; still every
    group is trained once, with its rollout, and no token past the bound. Then what make demo does next:
    every checkpoint scored, the report, the viewer's site. (The shipped config as it is, max_staleness 0,
    runs on Slurm below; the synchronous loop's restarts are the same code.)"""
    import signal

    import yaml

    from hpc.ledger import Ledger

    max_staleness = 1
    config = yaml.safe_load(demo_config.read_text())
    config["pool"]["lease_s"] = 10          # a killed worker's claims come free quickly
    config["train"]["max_staleness"] = max_staleness
    demo_config.write_text(yaml.safe_dump(config))
    mid = 1 + max_staleness                 # open once rollout 0 has trained
    run_dir = tmp_path / "runs/demo"
    t0 = time.monotonic()
    # others' may start or end meanwhile: what counts is a new one left without its owner
    before = orphans_named(SUPERVISOR_NAME) | orphans_named(FORK_SERVER_NAME)
    launch = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "launch", str(demo_config), "--executor", "local",
                               "--run-dir", str(run_dir)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:       # mid-run: rollout `mid` open, some of it committed
            ledger_dir = run_dir / "ledger"
            if (ledger_dir / "ledger.json").exists():
                ledger = Ledger(ledger_dir)
                if ledger.current_generation(mid) is not None and ledger.status(mid).committed >= 2:
                    break
            time.sleep(0.2)
        else:
            pytest.fail(f"rollout {mid} never got going")
        killed = {}
        for role in ("pool", "inference"):
            record = json.loads((run_dir / f"launch/tasks/{role}-0.json").read_text())
            os.kill(record["pid"], signal.SIGKILL)
            killed[role] = record["pid"]
        out, err = launch.communicate(timeout=900)
    finally:
        if launch.poll() is None:
            launch.kill()
    assert launch.returncode == 0, what_happened(run_dir, out, err)
    # Nothing of the killed worker's sandboxes is left: no supervisor, no fork server (its forwarders
    # were reparented to pid 1 and ran forever before the supervisors).
    deadline = time.monotonic() + 10
    def left() -> set[int]:     # the run's own, outliving the killed worker
        return (orphans_named(SUPERVISOR_NAME) | orphans_named(FORK_SERVER_NAME)) - before

    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left()
    check_run(run_dir)          # every rollout trained on all 8 attempts: no group lost
    for role, pid in killed.items():
        record = json.loads((run_dir / f"launch/tasks/{role}-0.json").read_text())
        assert record["restarts"] >= 1 and record["pid"] != pid, record
    ledger = Ledger(run_dir / "ledger")
    for r in range(3):
        commits = ledger.commits(r)
        assert len(commits) == 8            # one commit per (group, attempt): nothing trained twice
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert all(m["staleness/max"] <= max_staleness and m["staleness/masked_tokens"] == 0 for m in lines), lines
    for r in (0, 1):        # rollout r+1 was open (and worked on) before r closed
        nxt = ledger.spec(r + 1, ledger.current_generation(r + 1)).opened
        assert nxt < (run_dir / f"ledger/rollouts/{r}/g{ledger.current_generation(r)}/closed").stat().st_mtime
    check_demo_afterwards(run_dir)
    assert time.monotonic() - t0 < 600


def check_demo_afterwards(run_dir: Path) -> None:
    """What make demo does after the run: score every checkpoint, the report, then the viewer's site."""
    for cmd in (["eval", "--watch", str(run_dir), "--until-done"], ["report", str(run_dir)],
                ["view", str(run_dir), "--quiet"]):
        r = subprocess.run([sys.executable, "-m", "agentrl.cli", *cmd], capture_output=True, text=True, timeout=600,
                           cwd=ROOT)
        assert r.returncode == 0, r.stderr[-3000:]
    for n in (1, 2, 3):
        assert json.loads((run_dir / f"eval/iter_{n}/summary.json").read_text())["attempts"] == 16   # 8 tasks x 2
    report = (run_dir / "report.md").read_text()
    pngs = sorted(p.name for p in run_dir.glob("*.png"))
    assert "eval.png" in pngs and "reward.png" in pngs and all(f"({name})" in report for name in pngs)
    assert "iter_3" in report
    view = run_dir / "view"
    index = (view / "index.html").read_text()
    assert all(f'href="rollout_{r}/index.html"' in index for r in range(3))
    assert all(f'href="eval_{n}/index.html"' in index for n in (1, 2, 3))
    assert len(list(view.glob("rollout_*/*-*.html"))) == 24 and len(list(view.glob("eval_*/*-*.html"))) == 48
    assert len(list((run_dir / "trajectories").rglob("*.json"))) >= 24      # a trace per committed attempt
