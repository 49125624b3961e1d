import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slurm
def test_launch_benchmark_prints_figures_beside_bare_sbatch(slurm_env):
    r = subprocess.run([sys.executable, "-m", "benchmarks.launch_bench", "--repeat", "1",
                        "--executors", "local,sbatch", "--json"], capture_output=True, text=True, timeout=600,
                       env=slurm_env, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert [row["executor"] for row in figures["results"]] == ["local", "sbatch"]
    for row in figures["results"]:
        assert row["all_registered_s"] > 0 and row["bare_sbatch_wait_s"] > 0
        assert row["ratio"] == pytest.approx(row["all_registered_s"] / row["bare_sbatch_wait_s"], abs=0.02)


def test_launch_benchmark_refuses_bad_arguments():
    r = subprocess.run([sys.executable, "-m", "benchmarks.launch_bench", "--executors", "ray"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "unknown executor" in r.stderr
