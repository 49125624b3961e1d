import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_train_benchmark_shows_lpt_never_behind_merging_the_two_smallest():
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/train_bench.py"), "--steps", "10", "--attempts", "8",
                        "--json"], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    rows = figures["schedule"]["results"]
    assert {(row["distribution"], row["dp_size"], row["max_tokens_per_gpu"]) for row in rows} == {
        (d, dp, cap) for d in ("swe", "swe+failed", "long") for dp in (2, 4, 8) for cap in (65_536, 131_072)}
    for row in rows:
        assert 1 <= row["lpt_mean"] <= row["lpt_worst"]
        assert 1 <= row["merge_two_smallest_mean"] <= row["merge_two_smallest_worst"]
        assert row["lpt_mean"] <= row["merge_two_smallest_mean"] + 1e-12
        assert row["lpt_worst"] <= row["merge_two_smallest_worst"] + 1e-12
        assert 0 <= row["merged_share"] <= 1
    # the comparison is not vacuous: long samples force merges, and there the naive merge loses
    assert any(row["lpt_worst"] < row["merge_two_smallest_worst"] for row in rows if row["merged_share"] > 0)
    assert "ratio: largest micro-batch" in r.stdout


@pytest.mark.parametrize(("args", "message"), [(["--parts", "a,b"], "unknown part 'b': only a"),
                                               (["--steps", "0"], "at least 1")])
def test_train_benchmark_refuses_bad_arguments(args, message):
    r = subprocess.run([sys.executable, str(ROOT / "benchmarks/train_bench.py"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and message in r.stderr
