"""The task-generation benchmark, tiny: listkit, one task, made with one sandbox and with two; both make
the same task, and the figures it prints are read from the runs (benchmarks/taskgen_bench.py)."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.integration,
              pytest.mark.skipif(shutil.which("bwrap") is None or os.geteuid() != 0,
                                 reason="the validation sandboxes need bubblewrap and root (make sysdeps)")]


def test_quick_run_reports_throughput_beside_one_sandbox_and_the_tasks_spread(tmp_path):
    p = subprocess.run([sys.executable, "-m", "benchmarks.taskgen_bench", "--source",
                        str(ROOT / "tests/data/mutations/listkit"), "--n", "1", "--modes", "local:1,local:2",
                        "--work", str(tmp_path), "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    one, two = out["rows"]
    assert (one["mode"], two["mode"], one["ratio"]) == ("local:1", "local:2", 1.0)
    assert two["ratio"] == pytest.approx(two["candidates_per_h"] / one["candidates_per_h"], abs=0.01)
    for row in (one, two):
        assert row["built"] >= row["kept"] >= 1 and row["wall_s"] > 0
        assert row["candidates_per_h"] == round(row["built"] / row["wall_s"] * 3600)
    assert one["tasks"] == 1 and one["same_tasks_in_every_mode"] is True
    assert one["fail_to_pass"]["min"] >= 1 and one["fix_lines"]["min"] >= 2     # a line out, a line in
    task = next(p for p in (tmp_path / "0-local1").iterdir() if p.name.startswith("mutations-"))
    expected = json.loads((task / "tests/expected.json").read_text())
    assert one["fail_to_pass"]["max"] == len(expected["FAIL_TO_PASS"])
