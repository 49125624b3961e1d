"""tools/stress_tests.py: the runs beside busy processes, a failing run named and counted, the spinners gone."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.integration


def test_a_failing_run_is_named_and_fails_the_whole_and_the_busy_processes_go(tmp_path):
    (tmp_path / "test_timing.py").write_text("def test_quiet():\n    pass\n\n"
                                             "def test_loud():\n    assert False, 'too slow'\n")
    log = tmp_path / "runs.jsonl"
    p = subprocess.run([sys.executable, "tools/stress_tests.py", "--runs", "2", "--spinners", "1", "--workers", "1",
                        "--log", str(log), "--", str(tmp_path / "test_timing.py")],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 1, p.stdout + p.stderr
    runs = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["run"] for r in runs] == [1, 2]
    assert all(r["counts"] == {"failed": 1, "passed": 1} and len(r["spinners"]) == 1 for r in runs)
    assert all(len(r["failed"]) == 1 and r["failed"][0].endswith("test_timing.py::test_loud") for r in runs)
    assert "0 of 2 runs without a failure" in p.stdout
    assert "too slow" in (tmp_path / "runs.run2.part1.txt").read_text()     # the failure's own output kept
    for pid in runs[0]["spinners"]:           # no busy process outlives the tool
        status = Path(f"/proc/{pid}/status")
        assert not status.exists() or "State:\tZ" in status.read_text(), pid


def test_passing_runs_pass(tmp_path):
    (tmp_path / "test_ok.py").write_text("def test_ok():\n    pass\n")
    p = subprocess.run([sys.executable, "tools/stress_tests.py", "--runs", "1", "--spinners", "0", "--workers", "1",
                        "--", str(tmp_path / "test_ok.py")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0 and "run 1: " in p.stdout and "1 passed" in p.stdout and "1 of 1 runs" in p.stdout, \
        p.stdout + p.stderr
