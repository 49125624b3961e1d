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


def test_one_set_from_two_projects_is_made_twice_the_same_and_reported_per_project(tmp_path):
    p = subprocess.run([sys.executable, "-m", "benchmarks.taskgen_bench", "--one-set", "--source",
                        str(ROOT / "tests/data/mutations/listkit"), "--source",
                        str(ROOT / "tests/data/mutations/cachetools-5.5.0.tar.gz"), "--n", "1", "--modes", "local:2",
                        "--work", str(tmp_path), "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["tasks"] == 2 and out["same_tasks_twice"] is True and len(out["wall_s"]) == 2
    assert [r["project"] for r in out["projects"]] == ["listkit", "cachetools-5.5.0"]
    tasks = sorted(t.name for t in (tmp_path / "set-1").iterdir() if t.name.startswith("mutations-"))
    assert tasks == ["mutations-train-s0-0000", "mutations-train-s0-0001"]      # one command, one set
    for row in out["projects"]:
        assert row["tasks"] == 1 and row["built"] >= row["kept"] >= 1
        assert row["kept_fraction"] == round(row["kept"] / row["built"], 3)
        assert row["built"] == row["kept"] + sum(row["refused"].values())
        assert row["layout"] == "tests"                  # where each project's tests are, from its task


def test_history_reports_its_candidates_the_kept_and_the_teacher_on_them_as_measured(tmp_path):
    from test_task_commits import history  # listkit's history: one fix, one feature, four no candidates

    repo, _ = history(tmp_path / "repo")
    p = subprocess.run([sys.executable, "-m", "benchmarks.taskgen_bench", "--history", str(repo), "--modes",
                        "local:2", "--work", str(tmp_path / "w"), "--json"], capture_output=True, text=True,
                       timeout=900, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert (r["commits"], r["candidates"], r["releases"]) == (6, 2, None)
    assert r["not_candidates"] == {"merge": 1, "root": 1, "no-test-change": 1, "no-code-change": 1}
    assert r["tried"] == r["train_candidates"] and r["tried"] == r["kept"] + sum(r["refused"].values())
    assert r["kept"] >= 1 and r["oracle_1_noop_0"] == r["kept"] == r["tasks"]
    assert r["tasks_per_h"] == pytest.approx(r["kept"] / r["wall_s"] * 3600, rel=0.05)    # wall_s is rounded
    t = r["teacher"]
    assert t["attempts"] == 2 * r["kept"] and t["pass_at_1"] == round(t["passed"] / t["attempts"], 3)
    # it passes exactly its right draws: a teacher whose patch plan broke would fail them
    assert t["right_passed"] == t["right_plans"] == t["passed"]
    assert t["mistakes_failed"] == t["attempts"] - t["right_plans"]
