import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "benchmarks.train_bench"]     # run from ROOT


def test_train_benchmark_shows_lpt_never_behind_merging_the_two_smallest():
    r = subprocess.run([*BENCH, "--parts", "a", "--steps", "10", "--attempts", "8", "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
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
    assert "trainer_throughput" not in figures and "weight_publishing" not in figures


def test_train_benchmark_prints_trainer_and_publish_figures_beside_their_baselines(tmp_path):
    r = subprocess.run([*BENCH, "--quick", "--dir", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    figures = json.loads(r.stdout.strip().splitlines()[-1])
    assert figures["schedule"]["results"]

    train = figures["trainer_throughput"]
    assert train["steps"] >= 1 and train["micro_batches"] >= train["steps"]
    assert 0 < train["tokens"] <= train["padded_tokens"]
    figure, baseline = train["figure"]["tokens_per_s"], train["baseline"]["tokens_per_s"]
    assert figure > 0 and baseline > 0
    assert train["ratio"] == pytest.approx(figure / baseline) and train["target"] == 0.9

    publish = figures["weight_publishing"]
    assert publish["weight_bytes"] > 0
    figure, baseline = publish["figure"], publish["baseline"]
    for side, parts in ((figure, ("export_s", "reload_s", "first_token_s")), (baseline, ("write_s", "fsync_s",
                                                                                           "read_s"))):
        assert side["mb_per_s"] > 0 and side["seconds"] > 0
        assert all(side[part] > 0 for part in parts)
    assert publish["ratio"] == pytest.approx(figure["mb_per_s"] / baseline["mb_per_s"]) and publish["target"] == 0.7

    for part in (train, publish):     # the printed verdict follows from the printed ratio
        verdict = "met" if part["ratio"] >= part["target"] else "missed"
        assert f"ratio {part['ratio']:.3f} (target >= {part['target']}: {verdict})" in r.stdout
    # what (c) exported and wrote is gone; the models it built stay for the next run
    assert not list(tmp_path.glob("publish-*")) and list(tmp_path.glob("qwen2-*/model.safetensors"))


@pytest.mark.parametrize(("args", "message"), [(["--parts", "a,d"], "unknown part 'd': the parts are a, b, c"),
                                               (["--steps", "0"], "at least 1"),
                                               (["--rounds", "0"], "at least 1")])
def test_train_benchmark_refuses_bad_arguments(args, message):
    r = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert r.returncode == 2 and message in r.stderr


def test_the_checkpoint_bench_bounds_the_bytes_against_a_full_checkpoint_per_rollout(tmp_path):
    p = subprocess.run([sys.executable, "-m", "benchmarks.checkpoint_bench", "--rollouts", "6", "--save-every", "3",
                        "--keep-last", "1", "--dir", str(tmp_path), "--json"],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr
    [out] = [json.loads(line) for line in p.stdout.splitlines()]     # one line, for jq
    # bounded: iter_6's full state and export (4 weights' worth); everything: 6 x 4
    assert 0.1 < out["ratio"] < 0.3 and out["figure_bytes"] > 0, out
