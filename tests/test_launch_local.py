"""The local executor runs the three-role plan for real: placement, restarts, failure, stop."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from waiting import wait_until

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
PROBE = [sys.executable, str(ROOT / "tests/roles/probe.py")]

PARTITIONS = {"gpu": {"nodes": ["gpu1"], "cpus_per_node": 8, "mem_mb": 16000, "gpus_per_node": 4},
              "cpu": {"nodes": ["cpu1", "cpu2"], "cpus_per_node": 8, "mem_mb": 8000, "gpus_per_node": 0},
              "all": {"nodes": ["gpu1", "cpu1", "cpu2"], "cpus_per_node": 8, "mem_mb": 8000, "gpus_per_node": 0}}


def three_role_config(run_dir: Path, with_partitions: bool = True) -> dict:
    launch = {
        "name": "probe", "time_limit_min": 10,
        "roles": {
            "trainer": {"command": PROBE, "partition": "gpu", "tasks": 2, "gpus_per_task": 1,
                        "mem_per_task_mb": 300, "distributed": True, "restart": {"policy": "fail-run"}},
            "inference": {"command": PROBE, "partition": "gpu", "tasks": 1, "gpus_per_task": 2,
                          "mem_per_task_mb": 300, "restart": {"policy": "restart", "max_restarts": 2}},
            "pool": {"command": PROBE, "partition": "cpu", "tasks": 2, "nodes": 2, "cpus_per_task": 2,
                     "mem_per_task_mb": 300, "restart": {"policy": "restart", "max_restarts": 3,
                                                         "backoff_s": 0.5}},
        }}
    if with_partitions:
        launch["partitions"] = PARTITIONS
    return {"run_id": "probe-run", "run_dir": str(run_dir), "launch": launch}


def probes(run: Path, prefix: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "probe").glob(f"{prefix}*.json"))]


def agentrl(*args, **kw):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=60, **kw)


def processes_mentioning(text: str) -> list[str]:
    """Every process whose command line mentions `text` (the run directory): none may outlive a run."""
    out = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True, check=True).stdout
    return [line for line in out.splitlines() if text in line and "ps -eo" not in line]


def alive_pids(pids):
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            out.append(pid)
        except ProcessLookupError:
            pass
    return out


@pytest.fixture
def local_run(tmp_path):
    run = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(three_role_config(run)))
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", "local"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    yield run, proc
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def test_local_three_roles_placement_allreduce_restart_and_finish(local_run):
    run, proc = local_run
    trainers = wait_until(lambda: len(probes(run, "trainer")) == 2 and probes(run, "trainer"), 60, "trainer ranks")
    assert sorted(t["rank"] for t in trainers) == [0, 1]
    assert all(t["world_size"] == 2 and t["allreduce"] == 3.0 for t in trainers)
    inference = wait_until(lambda: probes(run, "inference"), 60, "inference")
    pool = wait_until(lambda: len(probes(run, "pool")) == 2 and probes(run, "pool"), 60, "pool")
    gpu_sets = [set(t["gpus"].split(",")) for t in trainers] + [set(inference[0]["gpus"].split(","))]
    assert [len(s) for s in gpu_sets] == [1, 1, 2]
    assert len(set.union(*gpu_sets)) == 4, f"GPU sets overlap: {gpu_sets}"
    assert all(p["gpus"] == "" for p in pool)

    # kill -9 one pool task: it comes back, counted as a restart.
    victim = next(p for p in pool if p["index"] == 0)
    os.kill(victim["pid"], signal.SIGKILL)
    wait_until(lambda: len(probes(run, "pool-0")) == 2, 60, "pool-0 restarted")
    status = agentrl("status", str(run))
    assert status.returncode == 0 and "running" in status.stdout
    assert any(line.split()[:4] == ["pool-0", "running", "yes", "1"] for line in status.stdout.splitlines()), \
        status.stdout

    # The trainer finishing ends the run and takes every role down.
    (run / "probe" / "finish").write_text("")
    assert proc.wait(timeout=60) == 0, proc.stdout.read()
    status = agentrl("status", str(run))
    assert "finished" in status.stdout
    pids = [p["pid"] for p in probes(run, "")]
    assert wait_until(lambda: not alive_pids(pids), 20, "no process left") is True


def test_local_trainer_failure_fails_the_run(local_run):
    run, proc = local_run
    wait_until(lambda: len(probes(run, "trainer")) == 2, 120, "trainer ranks")
    (run / "probe" / "fail-1").write_text("")   # rank 0, stopped for it, must not hide it
    assert proc.wait(timeout=120) == 3, proc.stdout.read()
    out = agentrl("status", str(run)).stdout
    assert "failed" in out and "trainer exited with 3" in out


def test_local_stop_leaves_no_process_behind(local_run):
    run, proc = local_run
    wait_until(lambda: len(probes(run, "pool")) == 2 and len(probes(run, "trainer")) == 2, 60, "all roles")
    r = agentrl("stop", str(run))
    assert r.returncode == 0 and "SIGTERM" in r.stdout
    assert proc.wait(timeout=60) == 143
    pids = [p["pid"] for p in probes(run, "")]
    assert wait_until(lambda: not alive_pids(pids), 20, "no process left") is True
    assert wait_until(lambda: not processes_mentioning(str(run)), 20, "no wrapper left") is True
    assert "stopped" in agentrl("status", str(run)).stdout


def test_a_role_that_hangs_is_killed_at_its_liveness_bound_and_restarted(tmp_path):
    """Issue 15, defect 9: a stopped (SIGSTOP) pool task is alive to the process table but beats no more."""
    run = tmp_path / "run"
    config = three_role_config(run)
    roles = config["launch"]["roles"]
    del roles["inference"]
    roles["trainer"]["tasks"] = 1
    roles["pool"].update(tasks=1, nodes=1, restart={"policy": "restart", "max_restarts": 2, "backoff_s": 0.5,
                                                    "liveness_s": 2})
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(config))
    launched = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "launch", str(cfg), "--executor", "local"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        first, = wait_until(lambda: probes(run, "pool-0"), 60, "pool-0")
        boot = time.monotonic() - launched      # a start, as slow as this machine is now
        time.sleep(3)                        # beating, it outlives its bound
        assert len(probes(run, "pool-0")) == 1
        os.kill(first["pid"], signal.SIGSTOP)
        t0 = time.monotonic()
        wait_until(lambda: len(probes(run, "pool-0")) == 2, 60, "the hung pool-0 restarted")
        # after liveness_s, the backoff and a start (not at some far timeout), however loaded the machine
        assert time.monotonic() - t0 < 2 + 0.5 + 2 * boot + 3
        assert not alive_pids([first["pid"]])
        log = (run / "logs/pool-0.log").read_text()
        assert "no heartbeat for" in log and "killed as hung" in log, log[-2000:]
        status = agentrl("status", str(run))
        assert any(line.split()[:4] == ["pool-0", "running", "yes", "1"] for line in status.stdout.splitlines()), \
            status.stdout
        (run / "probe" / "finish").write_text("")
        assert proc.wait(timeout=60) == 0, proc.stdout.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
