"""benchmarks/history_bench.py: what stripping the history adds to an attempt's boot, each mode's verdict the
one its printed figures give."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.swe.task import DEFAULT_HISTORY

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "benchmarks.history_bench"]
pytestmark = [pytest.mark.integration, pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                                          reason="needs bubblewrap (make sysdeps) and root")]


@pytest.mark.slow
def test_each_modes_verdict_is_the_one_its_figures_give(tmp_path):
    p = subprocess.run([*BENCH, "--quick", "--json", "--dir", str(tmp_path)], capture_output=True, text=True,
                       timeout=600, cwd=ROOT)
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["rounds"] == 2 and out["repository"]["commits_in_ancestry"] >= 100
    base = out["boot_keep_p50_s"]
    assert f"keep (baseline) {base:.2f} s" in p.stdout
    for mode, m in out["modes"].items():
        assert m["added_s"] == pytest.approx(m["boot_p50_s"] - base, abs=0.002)
        assert m["ratio"] == pytest.approx(m["added_s"] / base, abs=0.002)
        met = m["added_s"] < 2.0 and m["ratio"] < 0.2
        assert m["meets_goal"] is met, (mode, m)
        line = next(line for line in p.stdout.splitlines() if line.strip().startswith(mode))
        assert line.endswith("goal < 2 s and < 20%: " + ("met" if met else "NOT met")), line
    # the exit status is the default mode's verdict: a default that misses the goal fails the run
    assert p.returncode == (0 if out["modes"][DEFAULT_HISTORY]["meets_goal"] else 1), p.stderr


def test_bad_arguments_are_refused():
    p = subprocess.run([*BENCH, "--rounds", "0"], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and "--rounds and --commits must be at least 1" in p.stderr, p.stderr
