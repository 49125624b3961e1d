"""The sandbox benchmark runs end to end in --quick mode and reports consistent figures."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from ci import skip_or_fail

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BENCH = [sys.executable, "-m", "benchmarks.sandbox_bench"]     # run from ROOT


def _needs() -> str | None:
    if os.geteuid() != 0:
        return "the sandbox benchmark needs root (overlay mounts)"
    missing = [t for t in ("bwrap", "nsenter") if shutil.which(t) is None]
    if missing:
        return f"the sandbox benchmark needs {' and '.join(missing)} (make sysdeps)"
    return None


@pytest.fixture
def runnable():
    why = _needs()
    if why:
        skip_or_fail("the sandbox benchmark's test", why)


def _approx(x):
    return pytest.approx(x, rel=1e-3, abs=1e-4)


@pytest.mark.slow
def test_quick_run_reports_figures_beside_baselines(runnable, tmp_path):
    p = subprocess.run([*BENCH, "--quick", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.strip().splitlines()
    out = json.loads(lines[-1])
    assert out["benchmark"] == "sandbox" and out["quick"] is True and out["cpus"] >= 1
    assert out["image"]["bytes"] >= 20 * 2**20 and out["image"]["entries"] > 0
    assert "(a) start to first exec ready" in p.stdout and "(b) cycles/s" in p.stdout

    ready = out["ready"]
    assert ready["rounds"] == 3
    for side in ("figure", "baseline", "unhardened"):
        r = ready[side]
        assert 0 < r["p50_s"] <= r["p95_s"] and r["stop_p50_s"] > 0
    # what the hardening costs: ours beside the runtime without it
    assert ready["hardening_ratio_p50"] == _approx(ready["figure"]["p50_s"] / ready["unhardened"]["p50_s"])
    assert ready["ratio_p50"] == _approx(ready["figure"]["p50_s"] / ready["baseline"]["p50_s"])
    assert ready["ratio_p95"] == _approx(ready["figure"]["p95_s"] / ready["baseline"]["p95_s"])
    assert ready["target"] == {"p50_s": 0.3, "max_ratio_p50": 0.05}
    # the verdict follows from the figures, and the printed line says the same
    met = ready["figure"]["p50_s"] <= 0.3 and ready["ratio_p50"] <= 0.05
    assert ready["meets_target"] is met
    assert f"(ratio <= 0.05): {'met' if met else 'NOT met'}" in p.stdout + p.stderr

    rows = out["throughput"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    for row in rows:
        for side in ("figure", "baseline", "unhardened"):
            m = row[side]
            if m is None:                      # skipped for the budget: it must say so
                assert row["skipped"] and out["skipped"]
                continue
            assert m["cycles"] >= row["concurrency"] and m["wall_s"] > 0
            assert m["cycles_per_s"] == _approx(m["cycles"] / m["wall_s"])
        if row["figure"] and row["baseline"]:
            assert row["ratio"] == _approx(row["figure"]["cycles_per_s"] / row["baseline"]["cycles_per_s"])
        else:
            assert row["ratio"] is None
        if row["figure"] and row["unhardened"]:
            assert row["hardening_ratio"] == _approx(row["figure"]["cycles_per_s"] / row["unhardened"]["cycles_per_s"])
    # (c) density: the same sandboxes on a disk image and on tmpfs, in one run
    dense = out["density"]
    fig, base = dense["figure"], dense["baseline"]
    assert "(c) density" in p.stdout and dense["count"] == 2 and dense["write_mib"] == 64
    assert fig["ok"] == base["ok"] == 2 and fig["backing"] == ["disk"] and base["backing"] == ["tmpfs"]
    assert base["ram_after_mib"] - base["ram_before_mib"] >= 60      # tmpfs: what was written is RAM held...
    assert fig["ram_growth"] <= 1.1 and fig["disk_mib"] >= 60        # ...a disk image holds it on disk
    assert dense["ram_ratio"] == _approx(fig["ram_after_mib"] / base["ram_after_mib"]) and dense["meets_target"]
    assert fig["holds"] == min(fig["holds_by_ram"], fig["holds_by_disk"]) and base["holds"] == base["holds_by_ram"]
    # Nothing is left mounted or running.
    assert str(tmp_path) not in Path("/proc/mounts").read_text()
    assert not [d for d in tmp_path.iterdir() if d.name.startswith("run-")]


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "1,x"], "--concurrency must be positive integers"),
    (["--concurrency", "0"], "--concurrency must be positive integers"),
    (["--rounds", "0"], "--rounds must be at least 1"),
    (["--budget-s", "0"], "--budget-s must be positive"),
    (["--image-mb", "100"], "--image-mb must be at least 300"),
    (["--dir", "/nonexistent/sandbox-bench"], "is not a directory"),
    (["--density", "0"], "--density and --write-mib must be at least 1"),
])
def test_bad_arguments_are_refused(args, message):
    p = subprocess.run([*BENCH, *args], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert p.returncode == 2 and message in p.stderr, p.stderr


def test_the_image_bench_stores_a_shared_base_once_and_starts_sandboxes_on_the_stack(runnable, tmp_path):
    p = subprocess.run([sys.executable, "-m", "benchmarks.image_bench", "--images", "3", "--base-mib", "20",
                        "--rounds", "2", "--json", "--dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stdout + p.stderr
    [out] = [json.loads(line) for line in p.stdout.splitlines()]     # one line, for jq
    disk, start = out["storage"], out["start"]
    assert disk["unique_layers"] == 4                              # one base, three tops
    # three flattened copies of the base against one: well under half, and close to the layers' own bytes
    assert disk["ratio"] < 0.5 and disk["layers_over_unique"] < 1.1, disk
    assert disk["ratio"] == _approx(disk["figure_layers_bytes"] / disk["baseline_flattened_bytes"])
    assert start["figure_layers_p50_s"] > 0 and start["baseline_flattened_p50_s"] > 0
    assert start["ratio"] == _approx(start["figure_layers_p50_s"] / start["baseline_flattened_p50_s"])
    # each verdict is the one its figures give
    assert disk["meets_target"] is (disk["figure_layers_bytes"]
                                    <= disk["target_layers_over_unique"] * disk["unique_layer_bytes"])
    assert start["meets_target"] is (start["ratio"] <= start["target_ratio"])
