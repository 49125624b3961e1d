import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]


def test_adapter_benchmark_prints_figures_beside_the_whole_chat_baseline(tmp_path):
    r = subprocess.run([sys.executable, "-m", "benchmarks.adapter_bench", "--quick", "--rounds", "5",
                        "--dir", str(tmp_path), "--json"], capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    results = json.loads(lines[-1])
    assert [row["figure"]["size"] for row in results["overhead"]] == [2000, 8000]
    for row in results["overhead"]:
        assert row["figure"]["history_tokens"] >= row["figure"]["size"]
        assert 0 < row["figure"]["p50_s"] and 0 < row["baseline"]["p50_s"]
    # the printed ratios are the figures' own: each size's figure / baseline, and the growth from the first
    # size to the last
    for row in results["overhead"]:
        ratio = row["figure"]["p50_s"] / row["baseline"]["p50_s"]
        assert f"{row['figure']['history_tokens']:>9} " in r.stdout and f" {ratio:>7.3f}\n" in r.stdout + "\n"
    first, last = (results["overhead"][i]["figure"] for i in (0, -1))
    assert results["growth"] == pytest.approx(last["p50_s"] / first["p50_s"])
    assert f": {results['growth']:.2f}x (target <= 1.3x)" in r.stdout
    tp = results["throughput"]
    assert tp["figure"]["turns_per_s"] > 0 and tp["baseline"]["turns_per_s"] > 0
    assert f"ratio {tp['figure']['turns_per_s'] / tp['baseline']['turns_per_s']:.2f}" in r.stdout


def test_adapter_benchmark_refuses_bad_arguments():
    r = subprocess.run([sys.executable, "-m", "benchmarks.adapter_bench", "--sessions", "0"],
                       capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and "at least 1" in r.stderr
