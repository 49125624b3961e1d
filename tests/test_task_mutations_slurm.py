"""`agentrl tasks generate mutations --slurm`: validation as job arrays on the local Slurm cluster.

The arrays' tasks run the same runs in the same sandboxes as the local path, so the tasks are the same
bytes whichever ran them; a re-run submits nothing; an array task that dies without an outcome is a
failure naming its output (agentrl/swe/mutate/slurm.py).
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.swe.mutate import runner, slurm
from agentrl.swe.mutate.build import RESOURCES
from hpc.sandbox.base import SandboxError

ROOT = Path(__file__).resolve().parents[1]
LISTKIT = ROOT / "tests/data/mutations/listkit"


def generate(*args, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "tasks", "generate", "mutations", *map(str, args)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT, env=env)


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and ".mutations" not in p.parts}


@pytest.mark.slurm
@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap (make sysdeps) and root for overlay mounts")
def test_validation_as_slurm_arrays_makes_the_same_tasks_as_the_local_path_and_resumes(tmp_path, slurm_env):
    args = ["--source", LISTKIT, "--n", "2", "--split", "train", "--seed", "1", "--test-timeout", "2"]
    local = generate(*args, "--out", tmp_path / "local")
    assert local.returncode == 0, local.stderr
    env = {**slurm_env, "AGENTRL_PYTHON": sys.executable}
    r = generate(*args, "--out", tmp_path / "slurm", "--slurm", "--parallelism", "3", env=env)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("validation runs as job") >= 2, r.stderr       # the clean tree's, then the candidates'
    assert "1 built, 0 cached, 0 failed, 0 remaining" in r.stderr, r.stderr
    assert re.search(r"listkit: built 6, kept \d+ \(2 wanted\)", r.stderr), r.stderr   # one array of 2 x --parallelism
    assert tree(tmp_path / "slurm") == tree(tmp_path / "local") != {}
    # Submitted again, nothing is left to validate
    again = generate(*args, "--out", tmp_path / "slurm", "--slurm", env=env)
    assert again.returncode == 0 and "validation runs as job" not in again.stderr, again.stderr


def test_an_array_task_that_ends_without_an_outcome_fails_the_batch_naming_its_output(tmp_path):
    spec = runner.suite_spec("p", 2.0, RESOURCES)
    todo = [runner.Job(tmp_path / "a.json", b""), runner.Job(tmp_path / "b.json", b"--- x\n")]
    with pytest.raises(SandboxError, match=r"2 of 2 validation runs in job 42 failed; the first, candidate a: the "
                                           r"task ended without an outcome .*see \S+/0\.out"):
        slurm.submit_batch(tmp_path, {"p/__init__.py": b""}, spec, todo, parallelism=2, timeout_s=2.0,
                           scratch=None, submit=lambda script: "42", alive=lambda job: False, poll_s=0)
    batch = next((tmp_path / "batches").iterdir())
    script = (batch / "job.sbatch").read_text()
    assert "#SBATCH --array=0,1%2" in script and "-m agentrl.swe.mutate.slurm" in script
    assert (batch / "1.diff").read_bytes() == b"--- x\n" and (batch / "repo/p/__init__.py").exists()


@pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                    reason="needs bubblewrap (make sysdeps) and root for overlay mounts")
def test_an_array_task_validates_in_the_image_of_the_sources_requirements_from_the_cache_it_is_given(tmp_path):
    """--with: jobs.json names the image and the cache, and the array task's sandbox looks there (an empty
    cache here, so the task fails naming both; tests/test_task_mutations_deps.py runs the image)."""
    image = "dockerfile:sha256:" + "0" * 64
    spec = runner.suite_spec("p", 2.0, RESOURCES, image)
    cache = tmp_path / "cache"
    with pytest.raises(SandboxError):     # submitted nowhere: the watch sees the job gone, without an outcome
        slurm.submit_batch(tmp_path, {"p/__init__.py": b""}, spec, [runner.Job(tmp_path / "a.json", b"")],
                           parallelism=1, timeout_s=2.0, scratch=None, image_cache=cache,
                           submit=lambda script: "7", alive=lambda job: False, poll_s=0)
    batch = next((tmp_path / "batches").iterdir())
    outcomes = tmp_path / "outcomes"
    assert slurm.run_task(batch, 0, outcomes) == 1
    said = next(outcomes.rglob("*.json")).read_text()
    assert image in said and str(cache) in said, said
