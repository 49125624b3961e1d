"""hpc.slurm, the one module that runs Slurm's client commands, against the local cluster's real slurmctld."""

import time

import pytest

from hpc import slurm
from hpc.launch.slurminfo import parse_sinfo

pytestmark = pytest.mark.slurm


def wait_until(check, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (got := check()):
            return got
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s")


def test_a_job_submitted_is_queued_its_steps_listed_and_cancelled(slurm_env, tmp_path):
    script = tmp_path / "job.sh"
    # The step says when its process runs: squeue lists a step while srun still launches it, and a signal
    # then is refused ("Invalid job id specified", seen once under CI's load).
    script.write_text("#!/bin/bash\nsrun --job-name=napper bash -c 'echo napping; exec sleep 300'\n")
    job = slurm.sbatch(script, "--partition=cpu", "--ntasks=1", "--mem=100", f"--output={tmp_path}/%j.out")
    assert job.isdigit()
    try:
        assert slurm.queued(job) == [job]
        steps = wait_until(lambda: [s for s in slurm.job_steps(job) if s[1] == "napper"], 60, "the step to run")
        assert steps == [(f"{job}.0", "napper")]
        wait_until(lambda: "napping" in (tmp_path / f"{job}.out").read_text(errors="replace")
                   if (tmp_path / f"{job}.out").exists() else False, 60, "the step's process to start")
        slurm.scancel([s for s, _ in steps], signal="TERM")          # the step alone is signalled
    finally:
        slurm.scancel([job])
    wait_until(lambda: not slurm.queued(job), 60, "the cancelled job to leave the queue")
    assert slurm.job_steps(job) == []


def test_refusals_carry_slurms_words_and_hints_answer_nothing(slurm_env, tmp_path, monkeypatch):
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\ntrue\n")
    with pytest.raises(slurm.SlurmError, match=r"sbatch refused .*job\.sh: .*[Pp]artition"):
        slurm.sbatch(script, "--partition=no-such-partition")
    with pytest.raises(slurm.SlurmError, match="scancel not-a-job failed: .*Invalid job id"):
        slurm.scancel(["not-a-job"])
    slurm.scancel(["not-a-job"], check=False)           # a best effort never raises
    assert slurm.queued("999999999") == []
    with pytest.raises(ValueError, match="cannot resolve Slurm node 'nowhere'"):
        slurm.node_address("nowhere")
    monkeypatch.setenv("PATH", str(tmp_path))           # no Slurm client on PATH
    with pytest.raises(slurm.SlurmUnavailable, match="sbatch is not installed"):
        slurm.sbatch(script)
    with pytest.raises(slurm.SlurmUnavailable, match="sinfo is not installed.*partitions:"):
        slurm.node_lines()
    assert slurm.queued("1") == [] and slurm.job_steps("1") == []


def test_the_clusters_nodes_and_their_addresses(slurm_env):
    parts = parse_sinfo(slurm.node_lines())
    assert {"gpu", "cpu"} <= set(parts) and sorted(parts["cpu"]["nodes"]) == ["cpu1", "cpu2"]
    assert slurm.node_address("cpu1") == "127.0.0.1"      # slurm.conf's NodeAddr: the names are not in DNS
