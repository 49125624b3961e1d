"""The three-role plan through the sbatch and submitit executors, on the local Slurm cluster."""

import json
import os
import signal
import subprocess
import sys

import pytest
import yaml
from run_story import what_happened
from test_launch_local import (
    ROOT,
    probes,
    processes_mentioning,
    three_role_config,
    wait_until,
)

pytestmark = pytest.mark.slurm


def agentrl(env, *args):
    return subprocess.run([sys.executable, "-m", "agentrl.cli", *args], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)


def squeue_empty(env, job_ids: str) -> bool:
    out = subprocess.run(["squeue", "-h", "-j", job_ids], capture_output=True, text=True, env=env).stdout
    return not out.strip()


def wait_requeued_and_restarted(env, job: str) -> None:
    """Slurm holds a requeued job for the credential lifetime (AuthInfo cred_expire: 120 s by
    default, 10 s on the local cluster); starting it sooner fails with "Job credential revoked"."""
    def started_again() -> bool:
        info = subprocess.run(["scontrol", "show", "job", job], env=env, capture_output=True, text=True).stdout
        return "Restarts=1" in info and "JobState=RUNNING" in info
    wait_until(started_again, 120, f"job {job} to be requeued and start again")


def launch(env, tmp_path, executor, with_partitions=True):
    run = tmp_path / "run"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump(three_role_config(run, with_partitions)))
    r = agentrl(env, "launch", str(cfg), "--executor", executor)
    assert r.returncode == 0, r.stderr
    rec = json.loads((run / "launch" / "run.json").read_text())
    return run, rec["job_id"]


def check_placement(run):
    trainers = wait_until(lambda: len(probes(run, "trainer")) == 2 and probes(run, "trainer"), 120,
                        "trainer ranks")
    assert sorted(t["rank"] for t in trainers) == [0, 1]
    assert all(t["world_size"] == 2 and t["allreduce"] == 3.0 and t["node"] == "gpu1" for t in trainers)
    (inference,) = wait_until(lambda: probes(run, "inference"), 60, "inference")
    pool = wait_until(lambda: len(probes(run, "pool")) == 2 and probes(run, "pool"), 60, "pool")
    assert inference["node"] == "gpu1" and sorted(p["node"] for p in pool) == ["cpu1", "cpu2"]
    gpu_sets = [set(t["gpus"].split(",")) for t in trainers] + [set(inference["gpus"].split(","))]
    assert [len(s) for s in gpu_sets] == [1, 1, 2] and len(set.union(*gpu_sets)) == 4, gpu_sets
    assert all(p["gpus"] == "" and p["cpus"] == "2" for p in pool)
    assert all(t["cpus"] == "1" for t in trainers)
    return pool


@pytest.mark.parametrize("executor", ["sbatch", "submitit"])
def test_three_roles_run_restart_and_finish(slurm_env, tmp_path, executor):
    # sbatch discovers the partitions with sinfo; submitit is given them in the config.
    run, jobs = launch(slurm_env, tmp_path, executor, with_partitions=executor == "submitit")
    try:
        pool = check_placement(run)
        victim = next(p for p in pool if p["index"] == 1)
        os.kill(victim["pid"], signal.SIGKILL)
        wait_until(lambda: len(probes(run, "pool-1")) == 2, 60, "pool-1 restarted")
        (run / "probe" / "finish").write_text("")
        wait_until(lambda: squeue_empty(slurm_env, jobs), 90, "jobs to end")
        status = agentrl(slurm_env, "status", str(run)).stdout
        assert "run probe-run: finished" in status and "trainer exited with 0" in status, status
        pool1 = next(line for line in status.splitlines() if line.startswith("pool-1 "))
        assert pool1.split()[3] == "1", status  # one restart
        assert wait_until(lambda: not processes_mentioning(str(run)), 30, "no process left") is True
    finally:
        subprocess.run(["scancel", *jobs.split(",")], env=slurm_env)


def test_sbatch_trainer_failure_fails_the_run(slurm_env, tmp_path):
    run, jobs = launch(slurm_env, tmp_path, "sbatch")
    try:
        wait_until(lambda: len(probes(run, "trainer")) == 2, 120, "trainer ranks")
        (run / "probe" / "fail-1").write_text("")   # rank 0, stopped for it, must not hide it
        wait_until(lambda: squeue_empty(slurm_env, jobs), 90, "job to end")
        status = agentrl(slurm_env, "status", str(run)).stdout
        assert "run probe-run: failed" in status and "trainer exited with 3" in status, status
    finally:
        subprocess.run(["scancel", jobs], env=slurm_env)


def test_submitit_stop_cancels_and_leaves_no_process(slurm_env, tmp_path):
    run, jobs = launch(slurm_env, tmp_path, "submitit")
    try:
        wait_until(lambda: len(probes(run, "pool")) == 2 and len(probes(run, "trainer")) == 2, 120, "all roles")
        r = agentrl(slurm_env, "stop", str(run))
        assert r.returncode == 0 and "cancelled" in r.stdout, r.stderr
        wait_until(lambda: squeue_empty(slurm_env, jobs), 90, "jobs to end")
        assert wait_until(lambda: not processes_mentioning(str(run)), 30, "no process left") is True
    finally:
        subprocess.run(["scancel", *jobs.split(",")], env=slurm_env)


# What Slurm does before a time limit: SIGUSR2 to the batch shell (sbatch's --signal=B:USR2@120), or
# to every process of the job (submitit's --signal=USR2@90). Submitit's jobs come in plan order:
# the gpu partition's (trainer, inference) first.
@pytest.mark.slow
@pytest.mark.parametrize("executor, scancel_scope", [("sbatch", "--batch"), ("submitit", "--full")])
def test_requeue_signal_checkpoints_and_the_run_resumes(slurm_env, tmp_path, executor, scancel_scope):
    run, jobs = launch(slurm_env, tmp_path, executor)
    trainer_job = jobs.split(",")[0]
    try:
        first = wait_until(lambda: len(probes(run, "trainer")) == 2 and probes(run, "trainer"), 120, "trainer")
        assert not any(t["resumed"] for t in first)
        subprocess.run(["scancel", scancel_scope, "--signal=USR2", trainer_job], env=slurm_env, check=True)
        wait_until(lambda: len(list((run / "probe").glob("checkpoint-trainer-*"))) == 2, 60, "trainer checkpoints")
        wait_requeued_and_restarted(slurm_env, trainer_job)
        resumed = wait_until(lambda: all(t.get("resumed") for t in probes(run, "trainer"))
                           and probes(run, "trainer"), 120, "trainer resumed")
        assert sorted(t["rank"] for t in resumed) == [0, 1] and all(t["allreduce"] == 3.0 for t in resumed)
        others = [*(run / "probe").glob("checkpoint-pool-*"), *(run / "probe").glob("checkpoint-inference-*")]
        assert not others, "only fail-run roles act on SIGUSR2"
        (run / "probe" / "finish").write_text("")
        wait_until(lambda: squeue_empty(slurm_env, jobs), 90, "jobs to end")
        status = agentrl(slurm_env, "status", str(run)).stdout
        assert "run probe-run: finished" in status, status + what_happened(run)
    finally:
        subprocess.run(["scancel", *jobs.split(",")], env=slurm_env)
